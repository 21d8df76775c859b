//===- kernels_dropout_test.cpp - training-mode dropout -------------------===//
#include "kernels_test_util.h"

#include <gtest/gtest.h>

#include <vector>

namespace {
void dropout(const std::vector<float> &x, int64_t seed, int64_t first,
             int64_t sampleElems, int64_t salt, double ratio,
             std::vector<float> &y, std::vector<float> &mask) {
  int64_t rng[2] = {seed, first};
  y.assign(x.size(), 0);
  mask.assign(x.size(), 0);
  void *bufs[] = {const_cast<float *>(x.data()), rng, y.data(), mask.data()};
  int64_t ints[] = {int64_t(x.size()), sampleElems, salt};
  double reals[] = {ratio};
  pipec_k_dropout(pipec_test::kctx(), bufs, ints, reals);
}
} // namespace

TEST(KernelDropout, KeepsTheRightFractionAndScales) {
  std::vector<float> x(100000, 2.0f), y, mask;
  dropout(x, 7, 0, 100, 3, 0.3, y, mask);
  int64_t kept = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(mask[i] == 0.0f || std::abs(mask[i] - 1.0f / 0.7f) < 1e-6);
    ASSERT_FLOAT_EQ(y[i], x[i] * mask[i]);
    kept += mask[i] != 0;
  }
  EXPECT_NEAR(double(kept) / x.size(), 0.7, 0.01);
}

TEST(KernelDropout, MaskDependsOnGlobalSampleNotOnTheSplit) {
  // One microbatch of 8 samples vs two of 4 (first sample index 0 and 4).
  std::vector<float> x(8 * 10, 1.0f), y, whole, a, b;
  dropout(x, 11, 0, 10, 5, 0.5, y, whole);
  std::vector<float> half(4 * 10, 1.0f);
  dropout(half, 11, 0, 10, 5, 0.5, y, a);
  dropout(half, 11, 4, 10, 5, 0.5, y, b);
  a.insert(a.end(), b.begin(), b.end());
  EXPECT_EQ(a, whole);
  // Another salt (another dropout layer) or seed draws another mask.
  std::vector<float> other;
  dropout(x, 11, 0, 10, 6, 0.5, y, other);
  EXPECT_NE(other, whole);
  dropout(x, 12, 0, 10, 5, 0.5, y, other);
  EXPECT_NE(other, whole);
}

TEST(KernelDropout, RatioZeroKeepsEverything) {
  std::vector<float> x(64, 3.0f), y, mask;
  dropout(x, 1, 0, 8, 0, 0.0, y, mask);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(y[i], 3.0f);
}
