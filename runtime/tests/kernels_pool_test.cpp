//===- kernels_pool_test.cpp - Max / average pooling forward and backward -===//
//
// Part of pipec. Checks pipec_k_maxpool2d (values and indices) and
// pipec_k_avgpool2d (both count_include_pad modes) against naive references
// on seeded random shapes with pads, strides and dilations, and their
// backward kernels against central finite differences.
//
//===----------------------------------------------------------------------===//

#include "kernels_nn_test_util.h"

#include <algorithm>
#include <limits>
#include <numeric>

using namespace pipec_test;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

/// Calls fn(yIndex, xIndex) for every window element inside the image, in
/// row-major window order; also fn(yIndex, -1) once per output first, so
/// that empty windows are visible.
template <typename Fn> void forEachWindow(const PoolParams &p, Fn &&fn) {
  const int64_t oh = p.oh(), ow = p.ow();
  for (int64_t plane = 0; plane < p.n * p.c; ++plane)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t x = 0; x < ow; ++x) {
        int64_t yi = (plane * oh + y) * ow + x;
        fn(yi, int64_t(-1));
        for (int64_t ki = 0; ki < p.kh; ++ki)
          for (int64_t kj = 0; kj < p.kw; ++kj) {
            int64_t ih = y * p.sh - p.pt + ki * p.dh;
            int64_t iw = x * p.sw - p.pl + kj * p.dw;
            if (ih >= 0 && ih < p.h && iw >= 0 && iw < p.w)
              fn(yi, (plane * p.h + ih) * p.w + iw);
          }
      }
}

/// A random configuration with every pad smaller than the kernel, as ONNX
/// exporters produce, oH, oW >= 1, and no window entirely in the padding
/// (possible with dilations; its max would be the lowest float).
PoolParams randomPool(std::mt19937 &rng, bool dilate, bool countIncludePad) {
  while (true) {
    PoolParams p;
    p.n = randomInt(rng, 1, 2);
    p.c = randomInt(rng, 1, 3);
    p.h = randomInt(rng, 1, 9);
    p.w = randomInt(rng, 1, 9);
    p.kh = randomInt(rng, 1, 4);
    p.kw = randomInt(rng, 1, 4);
    p.sh = randomInt(rng, 1, 3);
    p.sw = randomInt(rng, 1, 3);
    if (dilate) {
      p.dh = randomInt(rng, 1, 2);
      p.dw = randomInt(rng, 1, 2);
    }
    p.pt = randomInt(rng, 0, p.kh - 1);
    p.pb = randomInt(rng, 0, p.kh - 1);
    p.pl = randomInt(rng, 0, p.kw - 1);
    p.pr = randomInt(rng, 0, p.kw - 1);
    p.countIncludePad = countIncludePad;
    if (p.oh() < 1 || p.ow() < 1)
      continue;
    std::vector<int> hits(size_t(p.yCount()), 0);
    forEachWindow(p,
                  [&](int64_t yi, int64_t xi) { hits[size_t(yi)] += xi >= 0; });
    if (std::count(hits.begin(), hits.end(), 0) == 0)
      return p;
  }
}

//===----------------------------------------------------------------------===//
// MaxPool
//===----------------------------------------------------------------------===//

TEST(KernelMaxPool, MatchesReferenceValuesAndIndices) {
  std::mt19937 rng(401);
  for (int trial = 0; trial < 120; ++trial) {
    PoolParams p = randomPool(rng, trial % 2 == 1, false);
    SCOPED_TRACE(p.str());
    Floats x = randomFloats(rng, p.xCount());
    // Some exact ties: the first in window order must win.
    for (size_t i = 1; i < x.size(); i += 3)
      x[i] = x[i - 1];
    Floats y(size_t(p.yCount()), kNaN);
    std::vector<int64_t> idx(size_t(p.yCount()), -7);
    maxpool2d(p, x.data(), y.data(), idx.data());
    Floats ref(y.size(), std::numeric_limits<float>::lowest());
    std::vector<int64_t> refIdx(y.size(), -1);
    forEachWindow(p, [&](int64_t yi, int64_t xi) {
      if (xi < 0)
        return;
      if (refIdx[size_t(yi)] < 0 || x[size_t(xi)] > ref[size_t(yi)]) {
        ref[size_t(yi)] = x[size_t(xi)];
        refIdx[size_t(yi)] = xi;
      }
    });
    EXPECT_EQ(y, ref);
    EXPECT_EQ(idx, refIdx);
    // Indices are optional.
    Floats y2(y.size(), kNaN);
    maxpool2d(p, x.data(), y2.data(), nullptr);
    EXPECT_EQ(y2, y);
  }
}

TEST(KernelMaxPool, PaddingNeverWinsAndNaNPropagates) {
  // All-negative input with padding: a zero pad must never be the max.
  PoolParams p;
  p.h = p.w = 2, p.kh = p.kw = 3, p.pt = p.pl = p.pb = p.pr = 1;
  Floats x = {-4, -3, -2, -1}, y(size_t(p.yCount()));
  std::vector<int64_t> idx(y.size());
  maxpool2d(p, x.data(), y.data(), idx.data());
  EXPECT_EQ(y, (Floats{-1, -1, -1, -1}));
  EXPECT_EQ(idx, (std::vector<int64_t>{3, 3, 3, 3}));
  x[1] = kNaN;
  maxpool2d(p, x.data(), y.data(), idx.data());
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_TRUE(std::isnan(y[i]));
    EXPECT_EQ(idx[i], 1);
  }
  // NaN in the interior of a larger image (the swept path): every window
  // that holds it is NaN with its index, the others are finite.
  PoolParams big;
  big.h = 6, big.w = 9, big.kh = 2, big.kw = 3, big.sw = 2;
  Floats xs(size_t(big.xCount()));
  for (size_t i = 0; i < xs.size(); ++i)
    xs[i] = float(i % 7);
  xs[2 * 9 + 4] = kNaN; // row 2, column 4
  Floats ys(size_t(big.yCount()));
  std::vector<int64_t> is(ys.size());
  maxpool2d(big, xs.data(), ys.data(), is.data());
  for (int64_t o = 0; o < big.oh(); ++o)
    for (int64_t q = 0; q < big.ow(); ++q) {
      bool holds = (o == 1 || o == 2) && (q == 1 || q == 2);
      size_t k = size_t(o * big.ow() + q);
      EXPECT_EQ(std::isnan(ys[k]), holds) << o << "," << q;
      if (holds) {
        EXPECT_EQ(is[k], 2 * 9 + 4);
      }
    }
  // A dilated window entirely in the padding: the lowest float, index -1.
  PoolParams q;
  q.kh = 2, q.dh = 2, q.pt = 1, q.pb = 1;
  ASSERT_EQ(q.yCount(), 1);
  Floats one = {5}, out = {0};
  std::vector<int64_t> at = {0};
  maxpool2d(q, one.data(), out.data(), at.data());
  EXPECT_EQ(out[0], std::numeric_limits<float>::lowest());
  EXPECT_EQ(at[0], -1);
}

TEST(KernelMaxPoolGrad, MatchesFiniteDifferences) {
  std::mt19937 rng(402);
  for (int trial = 0; trial < 30; ++trial) {
    PoolParams p = randomPool(rng, trial % 2 == 1, false);
    // Distinct values 0.1 apart: a step of 0.01 never changes an argmax.
    Floats x(size_t(p.xCount()));
    std::iota(x.begin(), x.end(), 0.0f);
    std::shuffle(x.begin(), x.end(), rng);
    for (float &v : x)
      v = v * 0.1f - 1.0f;
    Floats y(size_t(p.yCount()));
    std::vector<int64_t> idx(y.size());
    maxpool2d(p, x.data(), y.data(), idx.data());
    Floats r = randomFloats(rng, p.yCount());
    Floats dx(x.size(), kNaN);
    maxpool2dGrad(r.data(), idx.data(), dx.data(), p.xCount(), p.yCount());
    auto loss = [&](const Floats &xs) {
      Floats ys(r.size());
      maxpool2d(p, xs.data(), ys.data(), nullptr);
      return dot(r, ys);
    };
    expectGradMatchesFiniteDifferences(x, dx, loss, 1e-2, 1e-4, 1e-4,
                                       "maxpool " + p.str());
  }
}

TEST(KernelMaxPoolGrad, SkipsInvalidIndices) {
  Floats dy = {1, 2, 3}, dx(4, kNaN);
  std::vector<int64_t> idx = {-1, 2, 9};
  maxpool2dGrad(dy.data(), idx.data(), dx.data(), 4, 3);
  EXPECT_EQ(dx, (Floats{0, 0, 2, 0}));
}

//===----------------------------------------------------------------------===//
// AveragePool
//===----------------------------------------------------------------------===//

TEST(KernelAvgPool, MatchesReferenceBothPadModes) {
  std::mt19937 rng(403);
  for (int trial = 0; trial < 160; ++trial) {
    PoolParams p = randomPool(rng, false, trial % 2 == 1);
    SCOPED_TRACE(p.str());
    Floats x = randomFloats(rng, p.xCount());
    Floats y(size_t(p.yCount()), kNaN);
    avgpool2d(p, x.data(), y.data());
    std::vector<double> sum(y.size(), 0), count(y.size(), 0);
    forEachWindow(p, [&](int64_t yi, int64_t xi) {
      if (xi < 0)
        return;
      sum[size_t(yi)] += x[size_t(xi)];
      count[size_t(yi)] += 1;
    });
    for (size_t i = 0; i < y.size(); ++i) {
      double div = p.countIncludePad ? double(p.kh * p.kw) : count[i];
      EXPECT_NEAR(y[i], sum[i] / div, 1e-6) << "element " << i;
    }
  }
}

TEST(KernelAvgPool, CountIncludePadDivisor) {
  // 2x2 ones, 3x3 window, pads 1: the corner window holds 4 ones.
  PoolParams p;
  p.h = p.w = 2, p.kh = p.kw = 3, p.pt = p.pl = p.pb = p.pr = 1;
  Floats x = {1, 1, 1, 1}, y(size_t(p.yCount()));
  avgpool2d(p, x.data(), y.data());
  EXPECT_EQ(y, (Floats{1, 1, 1, 1}));
  p.countIncludePad = true;
  avgpool2d(p, x.data(), y.data());
  for (float v : y)
    EXPECT_FLOAT_EQ(v, 4.0f / 9.0f);
}

TEST(KernelAvgPoolGrad, MatchesFiniteDifferences) {
  std::mt19937 rng(404);
  for (int trial = 0; trial < 40; ++trial) {
    PoolParams p = randomPool(rng, false, trial % 2 == 1);
    Floats x = randomFloats(rng, p.xCount());
    Floats r = randomFloats(rng, p.yCount());
    Floats dx(x.size(), kNaN);
    avgpool2dGrad(p, r.data(), dx.data());
    auto loss = [&](const Floats &xs) {
      Floats ys(r.size());
      avgpool2d(p, xs.data(), ys.data());
      return dot(r, ys);
    };
    // Linear; pixels no window covers (strides > kernel) have 0 gradient.
    expectGradMatchesFiniteDifferences(x, dx, loss, 0.25, 1e-5, 1e-5,
                                       "avgpool " + p.str(), 0.0);
  }
}

} // namespace
