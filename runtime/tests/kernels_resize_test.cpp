//===- kernels_resize_test.cpp - Bilinear resize forward and backward -----===//
//
// Part of pipec. Checks pipec_k_resize_linear against a double-precision
// reference written from ONNX's Resize definition (every coordinate mode,
// upsampling and downsampling, fractional scales), and
// pipec_k_resize_linear_grad as its exact adjoint: <resize(x), g> equals
// <x, resize_grad(g)> for random x and g, which holds only if the backward
// scatters with the forward's weights.
//
//===----------------------------------------------------------------------===//

#include "kernels_test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace {

/// ONNX Resize, linear, one axis: the source position of output o and the
/// edge-clamped neighbours with their weights.
void reference1d(int64_t in, int64_t out, double scale, int mode, int64_t o,
                 int64_t &lo, int64_t &hi, double &wlo, double &whi) {
  const double length = double(in) * scale;
  double x;
  if (mode == PIPEC_RESIZE_HALF_PIXEL)
    x = (o + 0.5) / scale - 0.5;
  else if (mode == PIPEC_RESIZE_PYTORCH_HALF_PIXEL)
    x = length == 1.0 ? -0.5 : (o + 0.5) / scale - 0.5;
  else if (mode == PIPEC_RESIZE_ALIGN_CORNERS)
    x = length == 1.0 ? 0.0 : o * double(in - 1) / (length - 1.0);
  else
    x = o / scale;
  double f = std::floor(x);
  lo = std::clamp<int64_t>(int64_t(f), 0, in - 1);
  hi = std::clamp<int64_t>(int64_t(f) + 1, 0, in - 1);
  whi = x - f;
  wlo = 1.0 - whi;
}

struct Case {
  int64_t n, c, h, w, oh, ow;
  double sh, sw;
};

std::vector<Case> cases() {
  return {{2, 3, 4, 5, 8, 10, 2.0, 2.0},   // upsample x2
          {1, 2, 6, 6, 3, 4, 0.5, 0.7},    // downsample, fractional
          {1, 1, 3, 4, 7, 9, 2.5, 2.25},   // fractional upsample
          {2, 1, 5, 3, 5, 3, 1.0, 1.0},    // identity size
          {1, 2, 1, 4, 3, 1, 3.0, 0.25}};  // a single row / column
}

TEST(KernelResizeLinear, MatchesTheOnnxDefinitionInEveryMode) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  for (int mode : {PIPEC_RESIZE_HALF_PIXEL, PIPEC_RESIZE_PYTORCH_HALF_PIXEL,
                   PIPEC_RESIZE_ALIGN_CORNERS, PIPEC_RESIZE_ASYMMETRIC})
    for (const Case &k : cases()) {
      std::vector<float> x(size_t(k.n * k.c * k.h * k.w)), y(size_t(k.n * k.c * k.oh * k.ow));
      for (float &v : x)
        v = dist(rng);
      int64_t ints[] = {k.n, k.c, k.h, k.w, k.oh, k.ow, mode};
      double reals[] = {k.sh, k.sw};
      void *bufs[] = {x.data(), y.data()};
      pipec_k_resize_linear(pipec_test::kctx(), bufs, ints, reals);
      for (int64_t p = 0; p < k.n * k.c; ++p)
        for (int64_t o = 0; o < k.oh; ++o)
          for (int64_t q = 0; q < k.ow; ++q) {
            int64_t r0, r1, c0, c1;
            double wr0, wr1, wc0, wc1;
            reference1d(k.h, k.oh, k.sh, mode, o, r0, r1, wr0, wr1);
            reference1d(k.w, k.ow, k.sw, mode, q, c0, c1, wc0, wc1);
            auto at = [&](int64_t r, int64_t c) {
              return double(x[size_t((p * k.h + r) * k.w + c)]);
            };
            double want = wr0 * (wc0 * at(r0, c0) + wc1 * at(r0, c1)) +
                          wr1 * (wc0 * at(r1, c0) + wc1 * at(r1, c1));
            EXPECT_NEAR(y[size_t((p * k.oh + o) * k.ow + q)], want, 1e-5)
                << "mode " << mode << " case " << k.h << "x" << k.w << " -> "
                << k.oh << "x" << k.ow << " at (" << o << ", " << q << ")";
          }
    }
}

TEST(KernelResizeLinear, BackwardIsTheAdjointOfTheForward) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist;
  for (int mode : {PIPEC_RESIZE_HALF_PIXEL, PIPEC_RESIZE_PYTORCH_HALF_PIXEL,
                   PIPEC_RESIZE_ALIGN_CORNERS, PIPEC_RESIZE_ASYMMETRIC})
    for (const Case &k : cases()) {
      std::vector<float> x(size_t(k.n * k.c * k.h * k.w)), y(size_t(k.n * k.c * k.oh * k.ow));
      std::vector<float> g(y.size()), dx(x.size(), 123.0f); // overwritten
      for (float &v : x)
        v = dist(rng);
      for (float &v : g)
        v = dist(rng);
      int64_t ints[] = {k.n, k.c, k.h, k.w, k.oh, k.ow, mode};
      double reals[] = {k.sh, k.sw};
      void *fwd[] = {x.data(), y.data()};
      void *bwd[] = {g.data(), dx.data()};
      pipec_k_resize_linear(pipec_test::kctx(), fwd, ints, reals);
      pipec_k_resize_linear_grad(pipec_test::kctx(), bwd, ints, reals);
      double lhs = 0, rhs = 0, scale = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        lhs += double(y[i]) * g[i];
        scale += std::fabs(double(y[i]) * g[i]);
      }
      for (size_t i = 0; i < x.size(); ++i)
        rhs += double(x[i]) * dx[i];
      EXPECT_NEAR(lhs, rhs, 1e-5 * (1.0 + scale)) << "mode " << mode;
    }
}

TEST(KernelResizeLinear, BadParametersPoisonTheOutput) {
  std::vector<float> x(4, 1.0f), y(4, 0.0f);
  int64_t ints[] = {1, 1, 2, 2, 2, 2, 9}; // unknown mode
  double reals[] = {1.0, 1.0};
  void *bufs[] = {x.data(), y.data()};
  pipec_k_resize_linear(pipec_test::kctx(), bufs, ints, reals);
  for (float v : y)
    EXPECT_TRUE(std::isnan(v));
}

} // namespace
