//===- kernels_norm_test.cpp - Batch / layer normalization ----------------===//
//
// Part of pipec. Checks the batch-norm (training and inference) and
// layer-norm kernels against the direct formulas in double, including the
// running-statistics update of ONNX opset 15, and their backward kernels
// against central finite differences of the forward.
//
//===----------------------------------------------------------------------===//

#include "kernels_nn_test_util.h"

#include <limits>

using namespace pipec_test;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

/// Mean and biased variance of channel c of X [N, C, S], in double.
void channelStats(const Floats &x, int64_t n, int64_t c, int64_t s, int64_t ch,
                  double &mean, double &var) {
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < s; ++j)
      sum += x[size_t((i * c + ch) * s + j)];
  mean = sum / double(n * s);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < s; ++j) {
      double d = x[size_t((i * c + ch) * s + j)] - mean;
      sq += d * d;
    }
  var = sq / double(n * s);
}

//===----------------------------------------------------------------------===//
// BatchNormalization
//===----------------------------------------------------------------------===//

TEST(KernelBatchNorm, TrainingModeMatchesFormulas) {
  std::mt19937 rng(501);
  for (int trial = 0; trial < 40; ++trial) {
    int64_t n = randomInt(rng, 1, 4), c = randomInt(rng, 1, 5),
            s = randomInt(rng, 1, 30);
    double eps = trial % 2 ? 1e-5 : 1e-2, momentum = trial % 3 ? 0.9 : 0.3;
    SCOPED_TRACE(::testing::Message()
                 << "N=" << n << " C=" << c << " S=" << s << " eps=" << eps);
    Floats x = randomFloats(rng, n * c * s, -2, 3);
    Floats scale = randomFloats(rng, c), bias = randomFloats(rng, c);
    Floats rm = randomFloats(rng, c), rv = randomFloats(rng, c, 0.5f, 2);
    BatchNormOut out =
        batchnormTrain(x, scale, bias, rm, rv, n, c, s, eps, momentum);
    for (int64_t ch = 0; ch < c; ++ch) {
      double mean, var;
      channelStats(x, n, c, s, ch, mean, var);
      double invStd = 1 / std::sqrt(var + eps);
      EXPECT_NEAR(out.savedMean[size_t(ch)], mean, 1e-6);
      EXPECT_NEAR(out.savedInvStd[size_t(ch)], invStd, 1e-5 * invStd);
      EXPECT_NEAR(out.runMean[size_t(ch)],
                  momentum * rm[size_t(ch)] + (1 - momentum) * mean, 1e-6);
      EXPECT_NEAR(out.runVar[size_t(ch)],
                  momentum * rv[size_t(ch)] + (1 - momentum) * var, 1e-6);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < s; ++j) {
          size_t k = size_t((i * c + ch) * s + j);
          double ref =
              scale[size_t(ch)] * (x[k] - mean) * invStd + bias[size_t(ch)];
          EXPECT_NEAR(out.y[k], ref, 2e-5 * (1 + std::fabs(ref)));
        }
    }
  }
}

TEST(KernelBatchNorm, RunningStatsInPlaceAndLargeMean) {
  // runMeanOut / runVarOut alias runMean / runVar (the documented in-place
  // update) and Y aliases X; the batch mean is large against the spread, so
  // a one-pass E[x^2] - E[x]^2 variance would cancel.
  const int64_t n = 3, c = 2, s = 50;
  std::mt19937 rng(502);
  Floats x = randomFloats(rng, n * c * s, -0.05f, 0.05f);
  for (float &v : x)
    v += 1000.0f;
  Floats scale = {1.5f, -0.5f}, bias = {0.25f, 2.0f};
  Floats rm = {3.0f, -1.0f}, rv = {2.0f, 0.5f};
  Floats xCopy = x, mean(2), invStd(2);
  void *bufs[] = {x.data(), scale.data(), bias.data(),   rm.data(), rv.data(),
                  x.data(), mean.data(),  invStd.data(), rm.data(), rv.data()};
  int64_t ints[] = {n, c, s};
  double reals[] = {1e-5, 0.9};
  pipec_k_batchnorm_train(kctx(), bufs, ints, reals);
  for (int64_t ch = 0; ch < c; ++ch) {
    double m, v;
    channelStats(xCopy, n, c, s, ch, m, v);
    EXPECT_NEAR(mean[size_t(ch)], m, 1e-4);
    EXPECT_NEAR(1.0 / (double(invStd[size_t(ch)]) * invStd[size_t(ch)]) - 1e-5,
                v, 1e-3 * v);
    double r0 = ch == 0 ? 3.0 : -1.0, v0 = ch == 0 ? 2.0 : 0.5;
    EXPECT_NEAR(rm[size_t(ch)], 0.9 * r0 + 0.1 * m, 1e-3);
    EXPECT_NEAR(rv[size_t(ch)], 0.9 * v0 + 0.1 * v, 1e-6);
    // Y = scale * xhat + bias: the normalised values have the right spread.
    double ySum = 0, ySq = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < s; ++j) {
        double yv = x[size_t((i * c + ch) * s + j)];
        ySum += yv, ySq += yv * yv;
      }
    double cnt = double(n * s), yMean = ySum / cnt;
    EXPECT_NEAR(yMean, bias[size_t(ch)], 1e-4);
    // (The spread is |scale| sqrt(var / (var + eps)), not quite |scale|.)
    EXPECT_NEAR(std::sqrt(ySq / cnt - yMean * yMean),
                std::fabs(scale[size_t(ch)]) * std::sqrt(v / (v + 1e-5)), 1e-4);
  }
}

TEST(KernelBatchNorm, InferenceModeMatchesFormula) {
  std::mt19937 rng(503);
  const int64_t n = 3, c = 4, s = 7;
  Floats x = randomFloats(rng, n * c * s), scale = randomFloats(rng, c),
         bias = randomFloats(rng, c), mean = randomFloats(rng, c),
         var = randomFloats(rng, c, 0.1f, 2), y(x.size(), kNaN);
  void *bufs[] = {x.data(),    scale.data(), bias.data(),
                  mean.data(), var.data(),   y.data()};
  int64_t ints[] = {n, c, s};
  double reals[] = {1e-3};
  pipec_k_batchnorm_infer(kctx(), bufs, ints, reals);
  for (int64_t i = 0; i < n * c * s; ++i) {
    size_t ch = size_t((i / s) % c);
    double ref = scale[ch] * (x[size_t(i)] - mean[ch]) /
                     std::sqrt(double(var[ch]) + 1e-3) +
                 bias[ch];
    EXPECT_NEAR(y[size_t(i)], ref, 1e-5 * (1 + std::fabs(ref)));
  }
}

TEST(KernelBatchNormGrad, MatchesFiniteDifferences) {
  std::mt19937 rng(504);
  for (int trial = 0; trial < 12; ++trial) {
    int64_t n = randomInt(rng, 1, 3), c = randomInt(rng, 1, 3),
            s = randomInt(rng, 2, 7);
    // With only 2 elements per channel Y is nearly +-scale and its
    // curvature is large where they are close: a moderate epsilon and a
    // small step keep the central difference accurate.
    const double eps = 1e-2, momentum = 0.9;
    std::string what = "N=" + std::to_string(n) + " C=" + std::to_string(c) +
                       " S=" + std::to_string(s);
    Floats x = randomFloats(rng, n * c * s, -2, 2);
    Floats scale = randomFloats(rng, c, 0.5f, 1.5f),
           bias = randomFloats(rng, c), rm(size_t(c), 0), rv(size_t(c), 1);
    Floats r = randomFloats(rng, n * c * s);
    BatchNormOut fwd =
        batchnormTrain(x, scale, bias, rm, rv, n, c, s, eps, momentum);
    Floats dx(x.size(), kNaN), dScale(size_t(c), kNaN), dBias(size_t(c), kNaN);
    // dX aliasing dY on odd trials.
    Floats dy = r;
    float *dxPtr = trial % 2 ? dy.data() : dx.data();
    batchnormGrad(x, scale, fwd.savedMean, fwd.savedInvStd, dy, dxPtr,
                  dScale.data(), dBias.data(), n, c, s);
    Floats gradX(dxPtr, dxPtr + x.size());
    auto lossOf = [&](const Floats &xs, const Floats &sc, const Floats &bi) {
      return dot(r,
                 batchnormTrain(xs, sc, bi, rm, rv, n, c, s, eps, momentum).y);
    };
    expectGradMatchesFiniteDifferences(
        x, gradX, [&](const Floats &v) { return lossOf(v, scale, bias); }, 2e-3,
        3e-3, 3e-3, "dX " + what, 0.0);
    expectGradMatchesFiniteDifferences(
        scale, dScale, [&](const Floats &v) { return lossOf(x, v, bias); },
        1e-2, 2e-3, 2e-3, "dScale " + what, 0.0);
    expectGradMatchesFiniteDifferences(
        bias, dBias, [&](const Floats &v) { return lossOf(x, scale, v); }, 1e-2,
        2e-3, 2e-3, "dBias " + what);
    // The optional outputs: NULL dScale / dBias leave dX unchanged.
    Floats dx2(x.size());
    batchnormGrad(x, scale, fwd.savedMean, fwd.savedInvStd, r, dx2.data(),
                  nullptr, nullptr, n, c, s);
    for (size_t i = 0; i < dx2.size(); ++i)
      EXPECT_FLOAT_EQ(dx2[i], gradX[i]);
  }
}

TEST(KernelBatchNormGrad, LargeMeanFewValuesMatchesDoubleFormula) {
  // A channel whose mean is 1e4 times its spread, over 4 values (one
  // sample, 2x2: the last blocks of a CNN at one sample per microbatch).
  // The saved mean rounded to float shifts every xhat by up to 1e-3 / std;
  // the backward recomputes the mean in double, so dX follows the formula
  // dX = scale invStd (dY - mean(dY) - xhat mean(dY xhat)) in double.
  const int64_t n = 1, c = 1, s = 4;
  Floats x = {1000.001f, 1000.004f, 999.998f, 1000.0025f};
  Floats scale = {1.5f}, bias = {0.f}, rm = {0.f}, rv = {1.f};
  Floats dy = {0.3f, -1.2f, 0.7f, 0.25f};
  const double eps = 1e-5;
  BatchNormOut fwd = batchnormTrain(x, scale, bias, rm, rv, n, c, s, eps, 0.9);
  Floats dx(4), dScale(1), dBias(1);
  batchnormGrad(x, scale, fwd.savedMean, fwd.savedInvStd, dy, dx.data(),
                dScale.data(), dBias.data(), n, c, s);
  double mean, var;
  channelStats(x, n, c, s, 0, mean, var);
  const double invStd = double(fwd.savedInvStd[0]);
  double meanDy = 0, meanDyXhat = 0;
  for (int j = 0; j < 4; ++j) {
    meanDy += dy[size_t(j)] / 4.0;
    meanDyXhat += dy[size_t(j)] * (x[size_t(j)] - mean) * invStd / 4.0;
  }
  for (int j = 0; j < 4; ++j) {
    const double xhat = (x[size_t(j)] - mean) * invStd;
    const double want =
        1.5 * invStd * (dy[size_t(j)] - meanDy - xhat * meanDyXhat);
    EXPECT_NEAR(dx[size_t(j)], want, 1e-5 * std::fabs(want) + 1e-3)
        << "element " << j;
  }
  EXPECT_NEAR(dScale[0], 4 * meanDyXhat, 1e-5);
}

//===----------------------------------------------------------------------===//
// LayerNormalization
//===----------------------------------------------------------------------===//

TEST(KernelLayerNorm, MatchesFormula) {
  std::mt19937 rng(505);
  for (int trial = 0; trial < 40; ++trial) {
    int64_t outer = randomInt(rng, 1, 6), inner = randomInt(rng, 1, 70);
    bool hasBias = trial % 2 == 0;
    double eps = trial % 3 ? 1e-5 : 1e-2;
    Floats x = randomFloats(rng, outer * inner, -3, 2);
    Floats scale = randomFloats(rng, inner), bias = randomFloats(rng, inner);
    Floats y(x.size(), kNaN), mean(size_t(outer), kNaN),
        invStd(size_t(outer), kNaN);
    layernorm(x.data(), scale.data(), hasBias ? bias.data() : nullptr, y.data(),
              mean.data(), invStd.data(), outer, inner, eps);
    for (int64_t o = 0; o < outer; ++o) {
      double sum = 0, sq = 0;
      for (int64_t j = 0; j < inner; ++j)
        sum += x[size_t(o * inner + j)];
      double mu = sum / double(inner);
      for (int64_t j = 0; j < inner; ++j) {
        double d = x[size_t(o * inner + j)] - mu;
        sq += d * d;
      }
      double is = 1 / std::sqrt(sq / double(inner) + eps);
      EXPECT_NEAR(mean[size_t(o)], mu, 1e-6);
      EXPECT_NEAR(invStd[size_t(o)], is, 1e-5 * is);
      for (int64_t j = 0; j < inner; ++j) {
        size_t k = size_t(o * inner + j);
        double ref = (x[k] - mu) * is * scale[size_t(j)] +
                     (hasBias ? bias[size_t(j)] : 0.0);
        EXPECT_NEAR(y[k], ref, 2e-5 * (1 + std::fabs(ref)))
            << "outer=" << outer << " inner=" << inner;
      }
    }
  }
  // mean / invStd outputs are optional; Y may alias X.
  Floats x = {1, 2, 3, 4}, scale = {1, 1, 1, 1};
  layernorm(x.data(), scale.data(), nullptr, x.data(), nullptr, nullptr, 1, 4,
            0.0);
  const double is = 1 / std::sqrt(1.25);
  EXPECT_NEAR(x[0], -1.5 * is, 1e-6);
  EXPECT_NEAR(x[3], 1.5 * is, 1e-6);
}

TEST(KernelLayerNormGrad, MatchesFiniteDifferences) {
  std::mt19937 rng(506);
  for (int trial = 0; trial < 16; ++trial) {
    int64_t outer = randomInt(rng, 1, 4), inner = randomInt(rng, 2, 12);
    bool hasBias = trial % 2 == 0;
    const double eps = 1e-3;
    std::string what = "outer=" + std::to_string(outer) +
                       " inner=" + std::to_string(inner) +
                       " bias=" + std::to_string(hasBias);
    Floats x = randomFloats(rng, outer * inner, -2, 2);
    Floats scale = randomFloats(rng, inner, 0.5f, 1.5f),
           bias = randomFloats(rng, inner),
           r = randomFloats(rng, outer * inner);
    Floats y(x.size()), mean(static_cast<size_t>(outer)),
        invStd(static_cast<size_t>(outer));
    layernorm(x.data(), scale.data(), hasBias ? bias.data() : nullptr, y.data(),
              mean.data(), invStd.data(), outer, inner, eps);
    Floats dx(x.size(), kNaN), dScale(size_t(inner), kNaN),
        dBias(size_t(inner), kNaN);
    Floats dy = r;
    float *dxPtr = trial % 3 == 1 ? dy.data() : dx.data(); // dX may alias dY
    layernormGrad(x.data(), scale.data(), mean.data(), invStd.data(), dy.data(),
                  dxPtr, dScale.data(), hasBias ? dBias.data() : nullptr, outer,
                  inner);
    Floats gradX(dxPtr, dxPtr + x.size());
    auto lossOf = [&](const Floats &xs, const Floats &sc, const Floats &bi) {
      Floats ys(xs.size());
      layernorm(xs.data(), sc.data(), hasBias ? bi.data() : nullptr, ys.data(),
                nullptr, nullptr, outer, inner, eps);
      return dot(r, ys);
    };
    expectGradMatchesFiniteDifferences(
        x, gradX, [&](const Floats &v) { return lossOf(v, scale, bias); }, 1e-2,
        3e-3, 3e-3, "dX " + what);
    expectGradMatchesFiniteDifferences(
        scale, dScale, [&](const Floats &v) { return lossOf(x, v, bias); },
        1e-2, 2e-3, 2e-3, "dScale " + what);
    if (hasBias)
      expectGradMatchesFiniteDifferences(
          bias, dBias, [&](const Floats &v) { return lossOf(x, scale, v); },
          1e-2, 2e-3, 2e-3, "dBias " + what);
    else
      for (float v : dBias)
        EXPECT_TRUE(std::isnan(v)); // NULL dBias: untouched
  }
}

} // namespace
