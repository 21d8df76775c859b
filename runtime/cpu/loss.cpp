//===- loss.cpp - SoftmaxCrossEntropyLoss and its gradient ----------------===//
//
// Part of pipec. CPU kernels behind pipec_k_sce_loss and
// pipec_k_sce_loss_grad (see include/pipec_rt.h for the parameter layouts).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// ONNX SoftmaxCrossEntropyLoss, opset 13. With scores viewed as [N, C, D]
/// and labels as [N, D], for every position (n, d) with target t = label:
///
///   logp[n, c, d] = scores[n, c, d] - logsumexp_c(scores[n, :, d])
///   w(n, d)       = weights[t] (1 without weights), 0 if t is ignored
///   l(n, d)       = -w(n, d) * logp[n, t, d]       (0 if t is ignored)
///
/// and the loss is l (reduction none), sum(l) (sum), or sum(l) / W (mean)
/// where W = sum of w(n, d) (= the number of non-ignored targets without
/// weights). The gradient with respect to the scores is
///
///   dScores[n, c, d] = g(n, d) * w(n, d) * (softmax[n, c, d] - [c == t])
///
/// with g(n, d) = dLoss[n, d] (none), dLoss (sum) or dLoss / W (mean).
///
/// Two cases that ONNX leaves undefined are given a value here:
///  - mean with W == 0 (every target ignored, or all weights zero) yields a
///    loss of 0 and a zero gradient instead of 0 / 0 = NaN;
///  - a label outside [0, C) that is not the ignore index is a user error
///    that the kernels cannot report across the C ABI. Such a target is
///    skipped exactly like an ignored one (no loss, no weight in W, zero
///    gradient) and neither `weights` nor `scores` is read at that label, so
///    there is no out-of-bounds access. The log-probabilities are still
///    produced for that position.
///
/// Per-position log-sum-exp and all sums are accumulated in double.
///
/// Both kernels are templates over the element type of scores, weights,
/// loss and their gradients (float, or double for the `_f64` twins, see
/// cpu/real.h); labels stay int64.
///
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"

#include "cpu/real.h"
#include "cpu/strided.h"

#include <algorithm>
#include <cmath>

using namespace pipec::rt;

namespace {

enum Reduction : int64_t { kNone = 0, kMean = 1, kSum = 2 };

/// The decoded parameter block shared by the forward and backward kernels.
template <class T> struct SceParams {
  int64_t n, c, d;
  int64_t reduction;
  const T *weights; ///< Null without class weights.
  bool hasIgnore;
  int64_t ignoreIndex;

  SceParams(const int64_t *ints, const void *weightsBuf)
      : n(ints[0]), c(ints[1]), d(ints[2]), reduction(ints[3]),
        weights(ints[4] != 0 ? static_cast<const T *>(weightsBuf) : nullptr),
        hasIgnore(ints[5] != 0), ignoreIndex(ints[6]) {}

  /// Whether target `t` contributes (not ignored, and a valid class).
  bool counts(int64_t t) const {
    if (hasIgnore && t == ignoreIndex)
      return false;
    return t >= 0 && t < c;
  }
  /// Weight of a contributing target.
  double weight(int64_t t) const { return weights ? double(weights[t]) : 1.0; }
  int64_t positions() const { return n * d; }

  /// W, the mean's denominator.
  double totalWeight(const int64_t *labels) const {
    double total = 0;
    for (int64_t i = 0; i < positions(); ++i)
      if (counts(labels[i]))
        total += weight(labels[i]);
    return total;
  }
};

/// log-sum-exp over the C classes of one position; `x` is scores[n, 0, d]
/// and consecutive classes are `stride` (= D) elements apart.
template <class T> double logSumExp(const T *x, int64_t c, int64_t stride) {
  T mx = x[0];
  for (int64_t k = 1; k < c; ++k)
    mx = std::max(mx, x[k * stride]);
  double sum = 0;
  for (int64_t k = 0; k < c; ++k)
    sum += std::exp(x[k * stride] - mx);
  return double(mx) + std::log(sum);
}

template <class T>
void sceLossKernel(void *const *bufs, const int64_t *ints, const double *) {
  const T *scores = static_cast<const T *>(bufs[0]);
  const int64_t *labels = static_cast<const int64_t *>(bufs[1]);
  T *loss = static_cast<T *>(bufs[3]);
  T *logProb = static_cast<T *>(bufs[4]);
  SceParams<T> p(ints, bufs[2]);
  bool perPosition = p.reduction == kNone;
  if (p.reduction != kNone && p.reduction != kMean && p.reduction != kSum) {
    poison(loss, 1);
    return;
  }
  if (p.n < 0 || p.d < 0 || p.c <= 0) {
    // No classes: every target is out of range. An empty reduced loss is 0.
    if (perPosition)
      std::fill(loss, loss + std::max<int64_t>(p.positions(), 0), T(0));
    else
      loss[0] = T(0);
    return;
  }

  double total = 0;
  for (int64_t i = 0; i < p.n; ++i) {
    for (int64_t j = 0; j < p.d; ++j) {
      const T *x = scores + i * p.c * p.d + j;
      double lse = logSumExp(x, p.c, p.d);
      if (logProb) {
        T *lp = logProb + i * p.c * p.d + j;
        for (int64_t k = 0; k < p.c; ++k)
          lp[k * p.d] = T(double(x[k * p.d]) - lse);
      }
      int64_t t = labels[i * p.d + j];
      double l = 0;
      if (p.counts(t))
        l = -p.weight(t) * (double(x[t * p.d]) - lse);
      if (perPosition)
        loss[i * p.d + j] = T(l);
      else
        total += l;
    }
  }
  if (perPosition)
    return;
  if (p.reduction == kMean) {
    double w = p.totalWeight(labels);
    total = w != 0 ? total / w : 0.0;
  }
  loss[0] = T(total);
}

template <class T>
void sceLossGradKernel(void *const *bufs, const int64_t *ints, const double *) {
  const T *scores = static_cast<const T *>(bufs[0]);
  const int64_t *labels = static_cast<const int64_t *>(bufs[1]);
  const T *dLoss = static_cast<const T *>(bufs[3]);
  T *dScores = static_cast<T *>(bufs[4]);
  SceParams<T> p(ints, bufs[2]);
  if (p.n <= 0 || p.d <= 0 || p.c <= 0)
    return;
  int64_t total = p.n * p.c * p.d;
  if (p.reduction != kNone && p.reduction != kMean && p.reduction != kSum) {
    poison(dScores, total);
    return;
  }

  // g for the reduced losses (a scalar dLoss).
  double scalarSeed = 0;
  if (p.reduction == kSum) {
    scalarSeed = dLoss[0];
  } else if (p.reduction == kMean) {
    double w = p.totalWeight(labels);
    scalarSeed = w != 0 ? double(dLoss[0]) / w : 0.0;
  }

  for (int64_t i = 0; i < p.n; ++i) {
    for (int64_t j = 0; j < p.d; ++j) {
      const T *x = scores + i * p.c * p.d + j;
      T *dx = dScores + i * p.c * p.d + j;
      int64_t t = labels[i * p.d + j];
      if (!p.counts(t)) {
        for (int64_t k = 0; k < p.c; ++k)
          dx[k * p.d] = T(0);
        continue;
      }
      double seed =
          p.reduction == kNone ? double(dLoss[i * p.d + j]) : scalarSeed;
      double coef = seed * p.weight(t);
      double lse = logSumExp(x, p.c, p.d);
      // Reads x[k] before writing dx[k]: dScores may alias scores.
      for (int64_t k = 0; k < p.c; ++k) {
        double prob = std::exp(T(double(x[k * p.d]) - lse));
        double onehot = k == t ? 1.0 : 0.0;
        dx[k * p.d] = T(coef * (prob - onehot));
      }
    }
  }
}

} // namespace

PIPEC_CPU_KERNEL(pipec_k_sce_loss, sceLossKernel)
PIPEC_CPU_KERNEL(pipec_k_sce_loss_grad, sceLossGradKernel)
