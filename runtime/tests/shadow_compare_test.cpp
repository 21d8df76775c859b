//===- shadow_compare_test.cpp - --check-kernels' word comparison ---------===//
//
// Part of pipec's runtime tests. The rule by which libpipec_rt_cuda_check.so
// (runtime/cuda/shadow_check.cpp) decides that a word of the GPU's result
// agrees with the CPU's: float data within the tolerance, int64 words (an
// index, a label, -1) only when equal, NaNs of arithmetic whatever their
// payload. Checked here because the library itself needs a GPU.
//
//===----------------------------------------------------------------------===//

#include "cuda/shadow_compare.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>

using pipec::cuda::wordsMatch;

namespace {

uint32_t bits(float v) {
  uint32_t w;
  std::memcpy(&w, &v, 4);
  return w;
}

/// The low and high words of an int64 as the checker sees them.
uint32_t low(int64_t v) { return uint32_t(uint64_t(v) & 0xffffffffu); }
uint32_t high(int64_t v) { return uint32_t(uint64_t(v) >> 32); }

constexpr double kRtol = 1e-4, kAtol = 1e-5;

bool same(uint32_t a, uint32_t b) { return wordsMatch(a, b, kRtol, kAtol); }

} // namespace

TEST(ShadowCompare, FloatsWithinTheTolerance) {
  EXPECT_TRUE(same(bits(1.0f), bits(1.00005f)));
  EXPECT_FALSE(same(bits(1.0f), bits(1.001f)));
  EXPECT_TRUE(same(bits(3e-6f), bits(-4e-6f))); // both under atol
  EXPECT_TRUE(same(bits(0.0f), bits(-0.0f)));
  EXPECT_TRUE(same(bits(2e-30f), bits(2.0001e-30f))); // tiny data, rtol
  EXPECT_FALSE(same(bits(1.0f), bits(std::numeric_limits<float>::infinity())));
}

TEST(ShadowCompare, Int64WordsOnlyWhenEqual) {
  // Indices into tensors of up to 2^26 elements: both words exact.
  for (int64_t a : {int64_t(7), int64_t(8388607), int64_t(8388608),
                    int64_t(25165823), int64_t(67108862)}) {
    SCOPED_TRACE(a);
    EXPECT_TRUE(same(low(a), low(a)));
    EXPECT_FALSE(same(low(a), low(a + 1)));
    EXPECT_FALSE(same(low(a), low(a - 1)));
  }
  // -1 (an index outside the image) against another negative value: the
  // words are NaN bit patterns, not arithmetic NaNs.
  EXPECT_TRUE(same(high(-1), high(-5)));
  EXPECT_FALSE(same(low(-1), low(-5)));
  EXPECT_FALSE(same(low(-1), low(0)));
}

TEST(ShadowCompare, ArithmeticNaNsMatchWhateverTheirPayload) {
  EXPECT_TRUE(same(0x7fc00000u, 0xffc00000u)); // CPU poison, x86 0/0
  EXPECT_TRUE(same(0xffc00000u, 0x7fffffffu)); // x86 0/0, CUDA's NaN
  EXPECT_FALSE(same(0x7fc00000u, bits(1.0f)));
  EXPECT_FALSE(same(0xfffffffeu, 0xfffffffdu)); // int64 words
}
