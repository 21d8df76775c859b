//===- fastmath.h - Branch-free float helpers that vectorise ----*- C++ -*-===//
//
// Part of pipec's CPU kernels (unary ops, softmax).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The float helpers are branch-free (and partly approximate) so that the
/// float32 kernels' loops vectorise. The double overloads serve the float64
/// twins (cpu/real.h): they are exact (a bit blend, std::exp), never an
/// approximation.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CPU_FASTMATH_H
#define PIPEC_RUNTIME_CPU_FASTMATH_H

#include <cmath>
#include <cstdint>
#include <cstring>

namespace pipec {
namespace cpu {

/// c ? a : b as a bitwise blend. GCC (with the default -ftrapping-math)
/// sinks arithmetic that only one arm of a ?: uses into a branch and then
/// refuses to if-convert it, which keeps the whole loop scalar; a blend of
/// both values has no branch, so such loops vectorise.
inline float blend(bool c, float a, float b) {
  uint32_t ua, ub;
  std::memcpy(&ua, &a, sizeof ua);
  std::memcpy(&ub, &b, sizeof ub);
  const uint32_t mask = 0u - uint32_t(c);
  const uint32_t r = (ua & mask) | (ub & ~mask);
  float f;
  std::memcpy(&f, &r, sizeof f);
  return f;
}

/// c ? a : b for double, as a bitwise blend like the float one.
inline double blend(bool c, double a, double b) {
  uint64_t ua, ub;
  std::memcpy(&ua, &a, sizeof ua);
  std::memcpy(&ub, &b, sizeof ub);
  const uint64_t mask = uint64_t(0) - uint64_t(c);
  const uint64_t r = (ua & mask) | (ub & ~mask);
  double f;
  std::memcpy(&f, &r, sizeof f);
  return f;
}

/// min(max(x, lo), hi) with NaN propagating, as blends (see blend: a
/// std::min / std::max clamp followed by arithmetic is turned into branches).
inline float clampBlend(float x, float lo, float hi) {
  x = blend(x < lo, lo, x);
  return blend(x > hi, hi, x);
}
inline double clampBlend(double x, double lo, double hi) {
  x = blend(x < lo, lo, x);
  return blend(x > hi, hi, x);
}

/// exp for float, Cephes' expf: n = round(x / ln 2), r = x - n ln 2 in
/// two steps (Cody-Waite), e^r by a degree-7 polynomial, times 2^n built
/// from the exponent bits. Measured against double exp over [-87, 88.3]:
/// max relative error 8.3e-8 (libm's expf: 0.5 ulp). x < -87.33 gives 0,
/// x > 88.37 saturates at 2.4e38 (callers only need x <= 0), NaN
/// propagates. Unlike libm's expf it vectorises; used by the backward of
/// ERF / GELU and by softmax, where exp is the bulk of the work.
inline float polyExp(float a) {
  const float lo = -87.3365478515625f, hi = 88.3762626647949f;
  const float x = clampBlend(a, lo, hi);
  // n = floor(x log2(e) + 1/2) without a libm call.
  const float fx = x * 1.44269504088896341f + 0.5f;
  int32_t n = int32_t(fx);
  n -= int32_t(float(n) > fx);
  const float fn = float(n);
  const float r = (x - fn * 0.693359375f) - fn * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  // 2^n from the exponent bits: n + 127 is in [1, 254] after the clamp.
  const uint32_t bits = uint32_t(n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return blend(a < lo, 0.0f, er * scale);
}

/// The exp of the kernels that use polyExp for float: polyExp for float,
/// the exact std::exp for double (the float64 twins).
inline float kernelExp(float x) { return polyExp(x); }
inline double kernelExp(double x) { return std::exp(x); }

} // namespace cpu
} // namespace pipec

#endif // PIPEC_RUNTIME_CPU_FASTMATH_H
