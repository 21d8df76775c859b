//===- kernels_conv_test.cpp - 2-D convolution forward and backward -------===//
//
// Part of pipec. Checks pipec_k_conv2d and its two backward kernels against
// naive double-precision loops written here, on seeded random shapes with
// groups, strides, asymmetric pads and dilations, including depthwise
// (with and without a channel multiplier) and 1x1 convolutions, and the
// backward kernels against central finite differences of the forward.
//
//===----------------------------------------------------------------------===//

#include "kernels_nn_test_util.h"

#include <limits>

using namespace pipec_test;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

//===----------------------------------------------------------------------===//
// References
//===----------------------------------------------------------------------===//

/// Calls fn(n, m, oh, ow, xIndex, wIndex) for every multiply-add of the
/// convolution (padding taps skipped).
template <typename Fn> void forEachTap(const ConvParams &p, Fn &&fn) {
  const int64_t cg = p.c / p.groups, mg = p.m / p.groups;
  const int64_t oh = p.oh(), ow = p.ow();
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t m = 0; m < p.m; ++m) {
      const int64_t g = m / mg;
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t x = 0; x < ow; ++x)
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t ki = 0; ki < p.kh; ++ki)
              for (int64_t kj = 0; kj < p.kw; ++kj) {
                int64_t ih = y * p.sh - p.pt + ki * p.dh;
                int64_t iw = x * p.sw - p.pl + kj * p.dw;
                if (ih < 0 || ih >= p.h || iw < 0 || iw >= p.w)
                  continue;
                int64_t xi = ((n * p.c + g * cg + c) * p.h + ih) * p.w + iw;
                int64_t wi = ((m * cg + c) * p.kh + ki) * p.kw + kj;
                int64_t yi = ((n * p.m + m) * oh + y) * ow + x;
                fn(yi, xi, wi);
              }
    }
}

/// Double-precision Y and, per element, the sum of |terms| (for the
/// tolerance).
void refConv(const ConvParams &p, const Floats &x, const Floats &w,
             const Floats &b, std::vector<double> &y,
             std::vector<double> &mag) {
  y.assign(size_t(p.yCount()), 0);
  mag.assign(size_t(p.yCount()), 0);
  const int64_t plane = p.oh() * p.ow();
  if (p.hasBias)
    for (int64_t i = 0; i < p.yCount(); ++i) {
      y[size_t(i)] = b[size_t((i / plane) % p.m)];
      mag[size_t(i)] = std::fabs(y[size_t(i)]);
    }
  forEachTap(p, [&](int64_t yi, int64_t xi, int64_t wi) {
    double t = double(x[size_t(xi)]) * double(w[size_t(wi)]);
    y[size_t(yi)] += t;
    mag[size_t(yi)] += std::fabs(t);
  });
}

/// A random valid configuration (oH, oW >= 1). `kind` forces a family:
/// 0 any, 1 depthwise (groups == C == M), 2 depthwise with multiplier 2,
/// 3 pointwise 1x1, 4 1x1 with stride 2 and a pad.
ConvParams randomConv(std::mt19937 &rng, int kind) {
  while (true) {
    ConvParams p;
    p.n = randomInt(rng, 1, 3);
    p.groups = randomInt(rng, 1, 3);
    int64_t cg = randomInt(rng, 1, 4), mg = randomInt(rng, 1, 4);
    if (kind == 1 || kind == 2) {
      p.groups = randomInt(rng, 1, 5);
      cg = 1;
      mg = kind == 1 ? 1 : 2;
    }
    p.c = cg * p.groups;
    p.m = mg * p.groups;
    p.h = randomInt(rng, 1, 10);
    p.w = randomInt(rng, 1, 10);
    p.kh = randomInt(rng, 1, 4);
    p.kw = randomInt(rng, 1, 4);
    p.sh = randomInt(rng, 1, 3);
    p.sw = randomInt(rng, 1, 3);
    p.dh = randomInt(rng, 1, 2);
    p.dw = randomInt(rng, 1, 2);
    p.pt = randomInt(rng, 0, 2);
    p.pl = randomInt(rng, 0, 2);
    p.pb = randomInt(rng, 0, 2);
    p.pr = randomInt(rng, 0, 2);
    if (kind == 3 || kind == 4) {
      p.kh = p.kw = 1;
      p.dh = p.dw = 1;
      p.sh = p.sw = kind == 3 ? 1 : 2;
      p.pt = p.pl = p.pb = p.pr = kind == 3 ? 0 : 1;
    }
    p.hasBias = randomInt(rng, 0, 1) == 1;
    if (p.oh() >= 1 && p.ow() >= 1)
      return p;
  }
}

/// Fixed configurations that matter for real networks.
std::vector<ConvParams> namedConvs() {
  std::vector<ConvParams> v;
  ConvParams p;
  // ResNet 3x3 block (small): same padding.
  p.n = 2, p.c = 16, p.h = 11, p.w = 9, p.m = 24, p.kh = p.kw = 3;
  p.pt = p.pl = p.pb = p.pr = 1, p.hasBias = true;
  v.push_back(p);
  // ResNet stem style: 7x7 stride 2 pad 3, 3 input channels.
  p = ConvParams();
  p.n = 1, p.c = 3, p.h = 15, p.w = 14, p.m = 8, p.kh = p.kw = 7;
  p.sh = p.sw = 2, p.pt = p.pl = p.pb = p.pr = 3;
  v.push_back(p);
  // 1x1 projection with stride 2 (downsample shortcut).
  p = ConvParams();
  p.n = 2, p.c = 12, p.h = 8, p.w = 7, p.m = 20, p.sh = p.sw = 2;
  v.push_back(p);
  // Pointwise 1x1 with groups (ShuffleNet style).
  p = ConvParams();
  p.n = 2, p.c = 12, p.h = 5, p.w = 6, p.m = 8, p.groups = 4, p.hasBias = true;
  v.push_back(p);
  // MobileNet depthwise 3x3 stride 2.
  p = ConvParams();
  p.n = 2, p.c = p.m = p.groups = 10, p.h = 9, p.w = 12, p.kh = p.kw = 3;
  p.sh = p.sw = 2, p.pt = p.pl = p.pb = p.pr = 1, p.hasBias = true;
  v.push_back(p);
  // Dilated 3x3 (DeepLab style), asymmetric pads.
  p = ConvParams();
  p.n = 1, p.c = 6, p.h = 12, p.w = 10, p.m = 5, p.kh = p.kw = 3;
  p.dh = 2, p.dw = 3, p.pt = 2, p.pl = 3, p.pb = 1, p.pr = 0;
  v.push_back(p);
  // Image blocking (cpu/conv.cpp batches images into one GEMM when P is
  // small): P = 420 gives blocks of 2 images, so N = 3 ends with a partial
  // block; P > 1024 gives one image per GEMM, pointwise and with im2col.
  p = ConvParams();
  p.n = 3, p.c = 4, p.h = 20, p.w = 21, p.m = 5, p.kh = p.kw = 3;
  p.pt = p.pl = p.pb = p.pr = 1, p.hasBias = true;
  v.push_back(p);
  p = ConvParams();
  p.n = 2, p.c = 8, p.h = 33, p.w = 33, p.m = 6;
  v.push_back(p);
  p = ConvParams();
  p.n = 2, p.c = 3, p.h = 34, p.w = 32, p.m = 4, p.kh = p.kw = 3;
  p.pt = p.pl = p.pb = p.pr = 1, p.groups = 1;
  v.push_back(p);
  // Kernel larger than the image with pads; a 1-pixel output.
  p = ConvParams();
  p.n = 1, p.c = 2, p.h = 2, p.w = 3, p.m = 3, p.kh = 4, p.kw = 5;
  p.pt = 1, p.pl = 1, p.pb = 1, p.pr = 1;
  v.push_back(p);
  return v;
}

std::vector<ConvParams> allConvCases(std::mt19937 &rng, int randomPerKind) {
  std::vector<ConvParams> cases = namedConvs();
  for (int kind = 0; kind <= 4; ++kind)
    for (int i = 0; i < (kind == 0 ? 4 : 1) * randomPerKind; ++i)
      cases.push_back(randomConv(rng, kind));
  return cases;
}

//===----------------------------------------------------------------------===//
// Forward
//===----------------------------------------------------------------------===//

TEST(KernelConv2d, MatchesDoubleReference) {
  std::mt19937 rng(301);
  for (const ConvParams &p : allConvCases(rng, 12)) {
    SCOPED_TRACE(p.str());
    Floats x = randomFloats(rng, p.xCount()), w = randomFloats(rng, p.wCount()),
           b = randomFloats(rng, p.m);
    Floats y(size_t(p.yCount()), kNaN); // must be overwritten
    conv2d(p, x.data(), w.data(), p.hasBias ? b.data() : nullptr, y.data());
    std::vector<double> ref, mag;
    refConv(p, x, w, b, ref, mag);
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(y[i], ref[i], 1e-6 + 4e-6 * mag[i]) << "element " << i;
  }
}

TEST(KernelConv2d, HasBiasFlagWithNullBiasAndRepeatedCalls) {
  // hasBias = 0 must not read B; consecutive calls of different sizes share
  // the im2col scratch buffer.
  std::mt19937 rng(302);
  for (int i = 0; i < 6; ++i) {
    ConvParams p = randomConv(rng, 0);
    p.hasBias = false;
    Floats x = randomFloats(rng, p.xCount()), w = randomFloats(rng, p.wCount());
    Floats y1(size_t(p.yCount())), y2(size_t(p.yCount()));
    conv2d(p, x.data(), w.data(), nullptr, y1.data());
    ConvParams big = namedConvs()[0];
    Floats bx(size_t(big.xCount()), 1.0f), bw(size_t(big.wCount()), 1.0f),
        by(size_t(big.yCount()));
    conv2d(big, bx.data(), bw.data(), nullptr, by.data());
    conv2d(p, x.data(), w.data(), nullptr, y2.data());
    EXPECT_EQ(y1, y2) << p.str();
  }
}

TEST(KernelConv2d, InvalidGroupsPoison) {
  ConvParams p;
  p.c = 3, p.m = 4, p.groups = 2, p.h = p.w = 3;
  Floats x(size_t(p.n * p.c * p.h * p.w), 1.0f), w(8, 1.0f),
      y(size_t(p.yCount()), 0.0f);
  conv2d(p, x.data(), w.data(), nullptr, y.data());
  for (float v : y)
    EXPECT_TRUE(std::isnan(v));
}

//===----------------------------------------------------------------------===//
// Backward
//===----------------------------------------------------------------------===//

TEST(KernelConv2dGrad, MatchesDoubleAdjoint) {
  // dX = sum over taps dY * W, dW = sum over taps dY * X, in double.
  std::mt19937 rng(303);
  for (const ConvParams &p : allConvCases(rng, 8)) {
    SCOPED_TRACE(p.str());
    Floats x = randomFloats(rng, p.xCount()), w = randomFloats(rng, p.wCount()),
           dy = randomFloats(rng, p.yCount());
    Floats dx(size_t(p.xCount()), kNaN), dw(size_t(p.wCount()), kNaN);
    conv2dGradInput(p, dy.data(), w.data(), dx.data());
    conv2dGradWeight(p, dy.data(), x.data(), dw.data());
    std::vector<double> rdx(dx.size(), 0), rdw(dw.size(), 0), mdx(dx.size(), 0),
        mdw(dw.size(), 0);
    forEachTap(p, [&](int64_t yi, int64_t xi, int64_t wi) {
      double tx = double(dy[size_t(yi)]) * w[size_t(wi)];
      double tw = double(dy[size_t(yi)]) * x[size_t(xi)];
      rdx[size_t(xi)] += tx, mdx[size_t(xi)] += std::fabs(tx);
      rdw[size_t(wi)] += tw, mdw[size_t(wi)] += std::fabs(tw);
    });
    for (size_t i = 0; i < dx.size(); ++i)
      ASSERT_NEAR(dx[i], rdx[i], 1e-6 + 4e-6 * mdx[i]) << "dX element " << i;
    for (size_t i = 0; i < dw.size(); ++i)
      ASSERT_NEAR(dw[i], rdw[i], 1e-6 + 4e-6 * mdw[i]) << "dW element " << i;
  }
}

TEST(KernelConv2dGrad, MatchesFiniteDifferences) {
  std::mt19937 rng(304);
  std::vector<ConvParams> cases;
  for (int kind = 0; kind <= 4; ++kind)
    for (int i = 0; i < (kind == 0 ? 6 : 2); ++i)
      cases.push_back(randomConv(rng, kind));
  // The dilated, asymmetric-padding and depthwise stride-2 named cases.
  cases.push_back(namedConvs()[4]);
  cases.push_back(namedConvs()[5]);
  double largest = 0;
  for (const ConvParams &p : cases) {
    Floats x = randomFloats(rng, p.xCount()), w = randomFloats(rng, p.wCount()),
           b = randomFloats(rng, p.m), r = randomFloats(rng, p.yCount());
    const float *bias = p.hasBias ? b.data() : nullptr;
    Floats dx(size_t(p.xCount())), dw(size_t(p.wCount()));
    conv2dGradInput(p, r.data(), w.data(), dx.data());
    conv2dGradWeight(p, r.data(), x.data(), dw.data());
    auto lossX = [&](const Floats &xs) {
      Floats y(r.size());
      conv2d(p, xs.data(), w.data(), bias, y.data());
      return dot(r, y);
    };
    auto lossW = [&](const Floats &ws) {
      Floats y(r.size());
      conv2d(p, x.data(), ws.data(), bias, y.data());
      return dot(r, y);
    };
    // Y is linear in X and in W: a large step is exact up to rounding.
    // Random cases can legitimately have zero gradients (pixels no window
    // reads, taps that only ever see padding); non-triviality is checked
    // over all cases.
    largest = std::max(
        largest, expectGradMatchesFiniteDifferences(
                     x, dx, lossX, 0.25, 1e-4, 1e-4, "dX " + p.str(), 0.0));
    largest = std::max(
        largest, expectGradMatchesFiniteDifferences(
                     w, dw, lossW, 0.25, 1e-4, 1e-4, "dW " + p.str(), 0.0));
  }
  EXPECT_GT(largest, 0.5);
}

} // namespace

// A depthwise 1x1 convolution (one input channel per group) of one image:
// dX is overwritten, not added to what the buffer held (the depthwise path
// accumulates, so it must start from zero even when the pointwise GEMM path
// would not need it). Found by the CUDA conv tests' emulation.
TEST(KernelConv2dGrad, DepthwisePointwiseOverwritesDx) {
  const int64_t n = 1, c = 3, h = 2, w = 2;
  // ints: N C H W M kH kW oH oW strideH strideW padTop padLeft dilH dilW
  //       groups hasBias
  const int64_t ints[] = {n, c, h, w, c, 1, 1, h, w, 1, 1, 0, 0, 1, 1, c, 0};
  std::vector<float> dy(size_t(n * c * h * w)), wt = {2.f, -1.f, 0.5f};
  for (size_t i = 0; i < dy.size(); ++i)
    dy[i] = float(i) - 5.f;
  std::vector<float> dx(dy.size(), 7.f); // stale contents
  void *bufs[] = {dy.data(), wt.data(), dx.data()};
  pipec_k_conv2d_grad_input(kctx(), bufs, ints, nullptr);
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t i = 0; i < h * w; ++i)
      EXPECT_FLOAT_EQ(dx[size_t(ch * h * w + i)],
                      wt[size_t(ch)] * dy[size_t(ch * h * w + i)])
          << "channel " << ch << " pixel " << i;
}

// An empty output (oH = 0) leaves nothing to do and must not divide by the
// output's pixel count.
TEST(KernelConv2dGrad, EmptyOutputZeroesDx) {
  const int64_t ints[] = {1, 2, 3, 3, 2, 3, 3, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0};
  std::vector<float> dy(1), wt(2 * 2 * 9, 1.f), dx(18, 7.f);
  void *bufs[] = {dy.data(), wt.data(), dx.data()};
  pipec_k_conv2d_grad_input(kctx(), bufs, ints, nullptr);
  for (float v : dx)
    EXPECT_EQ(v, 0.f);
}
