//===- kernels_loss_test.cpp - SoftmaxCrossEntropyLoss kernels ------------===//
//
// Part of pipec. Checks pipec_k_sce_loss against hand-computed values and a
// double-precision port of the ONNX reference implementation (opset 13,
// onnx/backend/test/case/node/softmaxcrossentropy.py), and
// pipec_k_sce_loss_grad against central finite differences for every
// reduction, with and without class weights and ignore_index.
//
//===----------------------------------------------------------------------===//

#include "kernels_test_util.h"

#include <limits>

using namespace pipec_test;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
using Labels = std::vector<int64_t>;

/// ONNX's reference, in double: returns the loss (N*D values for
/// reduction none, else one) and fills logProb ([N, C, D]).
std::vector<double> referenceSce(const SceConfig &cfg, const Floats &scores,
                                 const Labels &labels, const float *weights,
                                 std::vector<double> &logProb) {
  int64_t n = cfg.n, c = cfg.c, d = cfg.d;
  logProb.assign(static_cast<size_t>(n * c * d), 0.0);
  std::vector<double> loss(static_cast<size_t>(n * d), 0.0),
      gatherWeight(static_cast<size_t>(n * d));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) {
      double mx = -1e300, sum = 0;
      for (int64_t k = 0; k < c; ++k)
        mx = std::max(mx, double(scores[size_t((i * c + k) * d + j)]));
      for (int64_t k = 0; k < c; ++k)
        sum += std::exp(scores[size_t((i * c + k) * d + j)] - mx);
      for (int64_t k = 0; k < c; ++k)
        logProb[size_t((i * c + k) * d + j)] =
            scores[size_t((i * c + k) * d + j)] - mx - std::log(sum);
      int64_t t = labels[size_t(i * d + j)];
      bool ignored = cfg.hasIgnore && t == cfg.ignoreIndex;
      double w = ignored ? 0.0 : (weights ? weights[t] : 1.0);
      gatherWeight[size_t(i * d + j)] = w;
      if (!ignored)
        loss[size_t(i * d + j)] = -w * logProb[size_t((i * c + t) * d + j)];
    }
  if (cfg.reduction == 0)
    return loss;
  double total = 0, wsum = 0;
  for (size_t i = 0; i < loss.size(); ++i) {
    total += loss[i];
    wsum += gatherWeight[i];
  }
  if (cfg.reduction == 1)
    total /= wsum;
  return {total};
}

/// Random labels in [0, C), with about a quarter set to the ignore index.
Labels randomLabels(std::mt19937 &rng, const SceConfig &cfg) {
  Labels labels(static_cast<size_t>(cfg.n * cfg.d));
  for (int64_t &t : labels) {
    t = randomInt(rng, 0, cfg.c - 1);
    if (cfg.hasIgnore && randomInt(rng, 0, 3) == 0)
      t = cfg.ignoreIndex;
  }
  if (cfg.hasIgnore) { // keep at least one target that counts
    labels[0] = cfg.ignoreIndex == 0 ? 1 : 0;
  }
  return labels;
}

std::string describe(const SceConfig &cfg, bool weighted) {
  return "N=" + std::to_string(cfg.n) + " C=" + std::to_string(cfg.c) +
         " D=" + std::to_string(cfg.d) +
         " reduction=" + std::to_string(cfg.reduction) +
         " weights=" + std::to_string(weighted) +
         " ignore=" + (cfg.hasIgnore ? std::to_string(cfg.ignoreIndex) : "-");
}

//===----------------------------------------------------------------------===//
// Forward
//===----------------------------------------------------------------------===//

TEST(KernelSceLoss, HandComputedValues) {
  // Uniform scores: every target costs log C, whatever the weights.
  SceConfig cfg{3, 4, 1, 0};
  Floats scores(12, 0.0f);
  Labels labels = {0, 1, 3};
  Floats loss(3, kNaN);
  sceLoss(cfg, scores.data(), labels.data(), nullptr, loss.data(), nullptr);
  for (float l : loss)
    EXPECT_NEAR(l, std::log(4.0), 1e-6);
  cfg.reduction = 2;
  sceLoss(cfg, scores.data(), labels.data(), nullptr, loss.data(), nullptr);
  EXPECT_NEAR(loss[0], 3 * std::log(4.0), 1e-6);

  // Weighted mean: scores [[1,2,3],[0,0,0]], labels [2,0], w = [.5, 1, 2].
  SceConfig wcfg{2, 3, 1, 1};
  Floats s2 = {1, 2, 3, 0, 0, 0}, w = {0.5f, 1.0f, 2.0f}, lp(6, kNaN);
  Labels l2 = {2, 0};
  double l0 = std::log(1 + std::exp(-1.0) + std::exp(-2.0)); // -log p(2)
  double l1 = std::log(3.0);
  sceLoss(wcfg, s2.data(), l2.data(), w.data(), loss.data(), lp.data());
  EXPECT_NEAR(loss[0], (2 * l0 + 0.5 * l1) / 2.5, 1e-6);
  EXPECT_NEAR(lp[2], -l0, 1e-6);
  EXPECT_NEAR(lp[3], -l1, 1e-6);

  // Same with the second target ignored: only the first one counts.
  wcfg.hasIgnore = true;
  wcfg.ignoreIndex = 0;
  sceLoss(wcfg, s2.data(), l2.data(), w.data(), loss.data(), nullptr);
  EXPECT_NEAR(loss[0], l0, 1e-6);
  sceLoss(wcfg, s2.data(), l2.data(), nullptr, loss.data(), nullptr);
  EXPECT_NEAR(loss[0], l0, 1e-6);
}

TEST(KernelSceLoss, MatchesOnnxReference) {
  std::mt19937 rng(31);
  int trial = 0;
  for (int64_t reduction : {0, 1, 2})
    for (bool weighted : {false, true})
      for (int ignore : {0, 1, 2}) // none, -100, an in-range class (1)
        for (int64_t d : {1, 4}) {
          SceConfig cfg{randomInt(rng, 1, 5), randomInt(rng, 2, 6), d,
                        reduction};
          cfg.hasIgnore = ignore != 0;
          cfg.ignoreIndex = ignore == 2 ? 1 : -100;
          SCOPED_TRACE(describe(cfg, weighted) + " trial " +
                       std::to_string(trial++));
          Floats scores = randomFloats(rng, cfg.n * cfg.c * d, -3, 3);
          for (float &s : scores)
            s += 200; // needs the max subtracted
          // A far outlier class: float exp overflows unless the true
          // per-position maximum is subtracted.
          scores[size_t(randomInt(rng, 0, int64_t(scores.size()) - 1))] += 120;
          Labels labels = randomLabels(rng, cfg);
          Floats w = randomFloats(rng, cfg.c, 0.2f, 2.0f);
          const float *wp = weighted ? w.data() : nullptr;
          std::vector<double> refLogProb;
          std::vector<double> ref =
              referenceSce(cfg, scores, labels, wp, refLogProb);
          Floats loss(ref.size(), kNaN), logProb(refLogProb.size(), kNaN);
          sceLoss(cfg, scores.data(), labels.data(), wp, loss.data(),
                  logProb.data());
          for (size_t i = 0; i < ref.size(); ++i)
            ASSERT_NEAR(loss[i], ref[i], 1e-5 * (1 + std::fabs(ref[i])))
                << "loss " << i;
          for (size_t i = 0; i < refLogProb.size(); ++i)
            ASSERT_NEAR(logProb[i], refLogProb[i], 1e-5) << "logProb " << i;
          // Without the optional output the loss is the same.
          Floats loss2(ref.size(), kNaN);
          sceLoss(cfg, scores.data(), labels.data(), wp, loss2.data(), nullptr);
          EXPECT_EQ(loss, loss2);
        }
}

TEST(KernelSceLoss, MeanOverNoTargetIsZero) {
  // Every target ignored, or every weight zero: 0, not 0/0, and a zero grad.
  SceConfig cfg{2, 3, 2, 1, true, 2};
  Floats scores = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  Labels labels = {2, 2, 2, 2};
  Floats zeroW = {0, 0, 0};
  Floats loss = {kNaN}, dLoss = {1.0f}, dScores(12, kNaN);
  for (const float *w : {static_cast<const float *>(nullptr),
                         static_cast<const float *>(zeroW.data())}) {
    sceLoss(cfg, scores.data(), labels.data(), w, loss.data(), nullptr);
    EXPECT_EQ(loss[0], 0.0f);
    sceLossGrad(cfg, scores.data(), labels.data(), w, dLoss.data(),
                dScores.data());
    for (float g : dScores)
      EXPECT_EQ(g, 0.0f);
  }
  Labels counted = {0, 1, 0, 1}; // all weights zero, nothing ignored
  sceLoss(cfg, scores.data(), counted.data(), zeroW.data(), loss.data(),
          nullptr);
  EXPECT_EQ(loss[0], 0.0f);
  // Empty batch.
  SceConfig empty{0, 3, 1, 1};
  loss[0] = kNaN;
  sceLoss(empty, nullptr, nullptr, nullptr, loss.data(), nullptr);
  EXPECT_EQ(loss[0], 0.0f);
}

TEST(KernelSceLoss, OutOfRangeLabelsAreSkippedLikeIgnored) {
  // Labels outside [0, C) that are not the ignore index must not be read
  // through; they behave exactly like ignored targets.
  std::mt19937 rng(32);
  SceConfig cfg{3, 5, 2, 0, true, -100};
  Floats scores = randomFloats(rng, 30, -2, 2);
  Floats w = randomFloats(rng, 5, 0.5f, 1.5f);
  Labels bad = {1, 7, -3, 4, 1000000000, 0};
  Labels ignored = {1, -100, -100, 4, -100, 0};
  for (int64_t reduction : {0, 1, 2}) {
    cfg.reduction = reduction;
    for (const float *wp : {static_cast<const float *>(nullptr),
                            static_cast<const float *>(w.data())}) {
      SCOPED_TRACE(describe(cfg, wp != nullptr));
      Floats lossBad(6, kNaN), lossIgn(6, kNaN), lpBad(30, kNaN),
          lpIgn(30, kNaN);
      sceLoss(cfg, scores.data(), bad.data(), wp, lossBad.data(), lpBad.data());
      sceLoss(cfg, scores.data(), ignored.data(), wp, lossIgn.data(),
              lpIgn.data());
      size_t outputs = reduction == 0 ? 6 : 1;
      for (size_t i = 0; i < outputs; ++i)
        EXPECT_EQ(lossBad[i], lossIgn[i]) << i;
      EXPECT_EQ(lpBad, lpIgn);
      Floats dLoss = randomFloats(rng, 6), gBad(30, kNaN), gIgn(30, kNaN);
      sceLossGrad(cfg, scores.data(), bad.data(), wp, dLoss.data(),
                  gBad.data());
      sceLossGrad(cfg, scores.data(), ignored.data(), wp, dLoss.data(),
                  gIgn.data());
      EXPECT_EQ(gBad, gIgn);
    }
  }
}

//===----------------------------------------------------------------------===//
// Backward
//===----------------------------------------------------------------------===//

TEST(KernelSceLossGrad, MatchesFiniteDifferences) {
  std::mt19937 rng(33);
  for (int64_t reduction : {0, 1, 2})
    for (bool weighted : {false, true})
      for (int ignore : {0, 1, 2}) // none, -100, an in-range class (2)
        for (int64_t d : {1, 3}) {
          SceConfig cfg{randomInt(rng, 2, 4), randomInt(rng, 2, 5), d,
                        reduction};
          cfg.hasIgnore = ignore != 0;
          cfg.ignoreIndex = ignore == 2 ? 2 : -100;
          std::string what = describe(cfg, weighted);
          Floats scores = randomFloats(rng, cfg.n * cfg.c * d, -2, 2);
          Labels labels = randomLabels(rng, cfg);
          if (ignore == 1)
            labels.back() = cfg.c + 3; // an out-of-range label, skipped
          Floats w = randomFloats(rng, cfg.c, 0.2f, 2.0f);
          const float *wp = weighted ? w.data() : nullptr;
          int64_t outputs = reduction == 0 ? cfg.n * d : 1;
          Floats r = randomFloats(rng, outputs, 0.5f, 1.5f);
          Floats grad(scores.size(), kNaN);
          sceLossGrad(cfg, scores.data(), labels.data(), wp, r.data(),
                      grad.data());
          auto loss = [&](const Floats &s) {
            Floats l(static_cast<size_t>(outputs));
            sceLoss(cfg, s.data(), labels.data(), wp, l.data(), nullptr);
            return dot(r, l);
          };
          expectGradMatchesFiniteDifferences(scores, grad, loss, 1e-2, 2e-3,
                                             2e-3, what);
          // dScores may alias scores.
          Floats inPlace = scores;
          sceLossGrad(cfg, inPlace.data(), labels.data(), wp, r.data(),
                      inPlace.data());
          EXPECT_EQ(inPlace, grad) << what;
        }
}

} // namespace
