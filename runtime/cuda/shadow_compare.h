//===- shadow_compare.h - How --check-kernels compares a word -*- C++ -*-===//
//
// Part of pipec's CUDA runtime tools (shadow_check.cpp); no CUDA in it, so
// the CPU unit tests check the rule (runtime/tests/shadow_compare_test.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CUDA_SHADOW_COMPARE_H
#define PIPEC_RUNTIME_CUDA_SHADOW_COMPARE_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace pipec {
namespace cuda {

/// A NaN that float arithmetic or a poisoned output makes (quiet, no
/// payload: x86's 0xffc00000, CUDA's 0x7fffffff, 0x7fc00000), as opposed to
/// a word of an int64 that merely has a NaN's bits (every negative int64's
/// high word does).
inline bool arithmeticNaN(uint32_t w) {
  return w == 0x7fc00000u || w == 0xffc00000u || w == 0x7fffffffu;
}

/// Words below this magnitude (2^-119, 1.5e-36) are compared exactly: the
/// low words of int64 values below 2^26 read as floats below it (exponent
/// field at most 7), and float data so small (exp(-82) and less) hardly
/// occurs. Larger indices (tensors over 67M elements) fall under the float
/// tolerance.
constexpr double kTiniestData = 0x1p-119;

/// Whether the CPU's word `a` and the GPU's word `b` agree (the file
/// comment of shadow_check.cpp gives the rule).
inline bool wordsMatch(uint32_t a, uint32_t b, double rtol, double atol) {
  if (a == b)
    return true;
  if (arithmeticNaN(a) && arithmeticNaN(b))
    return true;
  float fa, fb;
  std::memcpy(&fa, &a, 4);
  std::memcpy(&fb, &b, 4);
  auto data = [](float v) {
    return v == 0.0f ||
           (std::isfinite(v) && std::fabs(double(v)) >= kTiniestData);
  };
  if (!data(fa) || !data(fb))
    return false;
  double d = std::fabs(double(fa) - double(fb));
  return d <= atol ||
         d <= rtol * std::max(std::fabs(double(fa)), std::fabs(double(fb)));
}

} // namespace cuda
} // namespace pipec

#endif // PIPEC_RUNTIME_CUDA_SHADOW_COMPARE_H
