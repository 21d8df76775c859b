//===- norm.cpp - Batch and layer normalization and their backward --------===//
//
// Part of pipec. CPU kernels behind pipec_k_batchnorm_train,
// pipec_k_batchnorm_infer, pipec_k_batchnorm_grad, pipec_k_layernorm and
// pipec_k_layernorm_grad (see include/pipec_rt.h for the parameter layouts).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Both normalisations standardise a set of values with its mean mu and
/// biased variance var (divided by the count, not count - 1), epsilon
/// inside the square root:
///
///   xhat = (x - mu) * invStd,  invStd = 1 / sqrt(var + epsilon)
///   y    = scale * xhat + bias
///
/// BatchNormalization (ONNX opset 15, training mode) takes the set per
/// channel c over N and the spatial positions S; LayerNormalization takes
/// each of the `outer` rows of `inner` elements. The running statistics of
/// training-mode batch norm follow ONNX exactly, with the biased batch
/// variance (PyTorch uses the unbiased one there; ONNX's reference and
/// onnxruntime do not):
///
///   runMeanOut = momentum * runMean + (1 - momentum) * mu
///   runVarOut  = momentum * runVar  + (1 - momentum) * var
///
/// The backward, for a set of count R, with g = dY * scale:
///
///   dBias  = sum dY,   dScale = sum dY * xhat
///   dX     = invStd * (g - mean(g) - xhat * mean(g * xhat))
///
/// (for batch norm scale is per set, so mean(g) = scale * dBias / R and
/// mean(g * xhat) = scale * dScale / R).
///
/// Statistics are accumulated in double with two passes (mean, then the
/// centred sum of squares), so large means do not cancel. The batch-norm
/// backward recomputes the channel mean in double rather than reading the
/// saved one rounded to float (a rounded mean shifts every xhat, which
/// matters with few values per channel) and works per element in double. Y may alias X and
/// dX may alias dY (each element is read before it is written).
/// Optional outputs: savedMean / savedInvStd / runMeanOut / runVarOut (batch
/// norm) and mean / invStd (layer norm) may be NULL; dX, dScale and dBias of
/// either backward may each be NULL. A NULL `reals` means ONNX's defaults:
/// epsilon 1e-5, momentum 0.9.
///
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"

#include "cpu/real.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr double kDefaultEpsilon = 1e-5;
constexpr double kDefaultMomentum = 0.9;

/// Independent double accumulators: without -ffast-math a single running
/// sum is a serial dependency chain that does not vectorise.
constexpr int kLanes = 8;

/// sum_j x[j] in double.
template <class T> double sumRow(const T *x, int64_t n) {
  double lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l)
      lanes[l] += x[j + l];
  double acc = 0;
  for (; j < n; ++j)
    acc += x[j];
  for (int l = 0; l < kLanes; ++l)
    acc += lanes[l];
  return acc;
}

/// sum_j (x[j] - mean)^2 in double.
template <class T> double sumSqDevRow(const T *x, int64_t n, double mean) {
  double lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const double d = double(x[j + l]) - mean;
      lanes[l] += d * d;
    }
  double acc = 0;
  for (; j < n; ++j) {
    const double d = double(x[j]) - mean;
    acc += d * d;
  }
  for (int l = 0; l < kLanes; ++l)
    acc += lanes[l];
  return acc;
}

/// sum_j dy[j] and sum_j dy[j] * g[j] * (x[j] - mean) * invStd in double,
/// added to sumDy / sumDyXhat (g == NULL: 1).
template <class T>
void gradSumsRow(const T *x, const T *dy, const T *g, int64_t n, T mean,
                 T invStd, double &sumDy, double &sumDyXhat) {
  double a[kLanes] = {}, b[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const T d = g ? dy[j + l] * g[j + l] : dy[j + l];
      a[l] += d;
      b[l] += double(d) * double((x[j + l] - mean) * invStd);
    }
  for (; j < n; ++j) {
    const T d = g ? dy[j] * g[j] : dy[j];
    sumDy += d;
    sumDyXhat += double(d) * double((x[j] - mean) * invStd);
  }
  for (int l = 0; l < kLanes; ++l) {
    sumDy += a[l];
    sumDyXhat += b[l];
  }
}

/// Mean and biased variance of the values x[i * stride + j], i < rows,
/// j < len (the rows of one batch-norm channel, or one layer-norm row).
template <class T>
void meanVar(const T *x, int64_t rows, int64_t stride, int64_t len,
             double &mean, double &var) {
  const double count = double(rows) * double(len);
  double sum = 0;
  for (int64_t i = 0; i < rows; ++i)
    sum += sumRow(x + i * stride, len);
  mean = sum / count;
  double sq = 0;
  for (int64_t i = 0; i < rows; ++i)
    sq += sumSqDevRow(x + i * stride, len, mean);
  var = sq / count;
}

/// A double mean as an unevaluated sum hi + lo of two T. (x - hi) - lo keeps
/// x - mean accurate when |mean| >> std: x - hi is exact for x near hi. For
/// T = double, hi is the mean itself and lo is 0.
template <class T> struct SplitMean {
  T hi, lo;
  explicit SplitMean(double mean)
      : hi(T(mean)), lo(T(mean - double(T(mean)))) {}
};

/// y = (x - mean) * a + b over the same index set as meanVar.
template <class T>
void normalizeRows(const T *x, T *y, int64_t rows, int64_t stride, int64_t len,
                   SplitMean<T> mean, T a, T b) {
  for (int64_t i = 0; i < rows; ++i) {
    const T *xr = x + i * stride;
    T *yr = y + i * stride;
    for (int64_t j = 0; j < len; ++j)
      yr[j] = ((xr[j] - mean.hi) - mean.lo) * a + b;
  }
}

//===----------------------------------------------------------------------===//
// BatchNormalization
//===----------------------------------------------------------------------===//

template <class T>
void batchNormTrainKernel(void *const *bufs, const int64_t *ints,
                          const double *reals) {
  const T *x = static_cast<const T *>(bufs[0]);
  const T *scale = static_cast<const T *>(bufs[1]);
  const T *bias = static_cast<const T *>(bufs[2]);
  const T *runMean = static_cast<const T *>(bufs[3]);
  const T *runVar = static_cast<const T *>(bufs[4]);
  T *y = static_cast<T *>(bufs[5]);
  T *savedMean = static_cast<T *>(bufs[6]);
  T *savedInvStd = static_cast<T *>(bufs[7]);
  T *runMeanOut = static_cast<T *>(bufs[8]);
  T *runVarOut = static_cast<T *>(bufs[9]);
  int64_t n = ints[0], c = ints[1], s = ints[2];
  const double eps = reals ? reals[0] : kDefaultEpsilon;
  const double momentum = reals ? reals[1] : kDefaultMomentum;
  if (n <= 0 || c <= 0 || s <= 0)
    return;
  for (int64_t ch = 0; ch < c; ++ch) {
    const T *xc = x + ch * s;
    double mean, var;
    meanVar(xc, n, c * s, s, mean, var);
    const double invStd = 1.0 / std::sqrt(var + eps);
    normalizeRows(xc, y + ch * s, n, c * s, s, SplitMean<T>(mean),
                  T(double(scale[ch]) * invStd), bias[ch]);
    if (savedMean)
      savedMean[ch] = T(mean);
    if (savedInvStd)
      savedInvStd[ch] = T(invStd);
    // Read runMean / runVar before writing: the outputs may alias them.
    if (runMeanOut)
      runMeanOut[ch] =
          T(momentum * double(runMean[ch]) + (1.0 - momentum) * mean);
    if (runVarOut)
      runVarOut[ch] = T(momentum * double(runVar[ch]) + (1.0 - momentum) * var);
  }
}

template <class T>
void batchNormInferKernel(void *const *bufs, const int64_t *ints,
                          const double *reals) {
  const T *x = static_cast<const T *>(bufs[0]);
  const T *scale = static_cast<const T *>(bufs[1]);
  const T *bias = static_cast<const T *>(bufs[2]);
  const T *mean = static_cast<const T *>(bufs[3]);
  const T *var = static_cast<const T *>(bufs[4]);
  T *y = static_cast<T *>(bufs[5]);
  int64_t n = ints[0], c = ints[1], s = ints[2];
  const double eps = reals ? reals[0] : kDefaultEpsilon;
  if (n <= 0 || c <= 0 || s <= 0)
    return;
  for (int64_t ch = 0; ch < c; ++ch) {
    const double a = double(scale[ch]) / std::sqrt(double(var[ch]) + eps);
    normalizeRows(x + ch * s, y + ch * s, n, c * s, s, SplitMean<T>(mean[ch]),
                  T(a), bias[ch]);
  }
}

template <class T>
void batchNormGradKernel(void *const *bufs, const int64_t *ints,
                         const double *reals) {
  const T *x = static_cast<const T *>(bufs[0]);
  const T *scale = static_cast<const T *>(bufs[1]);
  // bufs[2], savedMean, is not read: the mean is recomputed in double.
  const T *savedInvStd = static_cast<const T *>(bufs[3]);
  const T *dy = static_cast<const T *>(bufs[4]);
  T *dx = static_cast<T *>(bufs[5]);
  T *dScale = static_cast<T *>(bufs[6]);
  T *dBias = static_cast<T *>(bufs[7]);
  int64_t n = ints[0], c = ints[1], s = ints[2];
  if (c <= 0)
    return;
  if (n <= 0 || s <= 0) {
    // No elements: zero parameter gradients (dX is empty).
    for (int64_t ch = 0; ch < c; ++ch) {
      if (dScale)
        dScale[ch] = T(0);
      if (dBias)
        dBias[ch] = T(0);
    }
    return;
  }
  const double count = double(n) * double(s);
  for (int64_t ch = 0; ch < c; ++ch) {
    // xhat exactly as the forward normalised: the mean again in double
    // (savedMean holds it rounded to T, and with few values per channel a
    // rounded mean shifts every xhat enough to dominate dX), then
    // everything per element in double.
    double sumX = 0;
    for (int64_t i = 0; i < n; ++i)
      sumX += sumRow(x + (i * c + ch) * s, s);
    const double meanD = sumX / count;
    const double invStd = double(savedInvStd[ch]);
    double sumDy = 0, sumDyXhat = 0;
    for (int64_t i = 0; i < n; ++i) {
      const T *xr = x + (i * c + ch) * s;
      const T *dyr = dy + (i * c + ch) * s;
      sumDy += sumRow(dyr, s);
      double acc = 0;
      for (int64_t j = 0; j < s; ++j)
        acc += double(dyr[j]) * ((double(xr[j]) - meanD) * invStd);
      sumDyXhat += acc;
    }
    if (dx) {
      // dX = scale * invStd * (dY - sumDy / R - xhat * sumDyXhat / R).
      const double k = double(scale[ch]) * invStd;
      const double meanDy = sumDy / count;
      const double meanDyXhat = sumDyXhat / count;
      for (int64_t i = 0; i < n; ++i) {
        const T *xr = x + (i * c + ch) * s;
        const T *dyr = dy + (i * c + ch) * s;
        T *dxr = dx + (i * c + ch) * s;
        for (int64_t j = 0; j < s; ++j) {
          const double xhat = (double(xr[j]) - meanD) * invStd;
          dxr[j] = T(k * (double(dyr[j]) - meanDy - xhat * meanDyXhat));
        }
      }
    }
    if (dScale)
      dScale[ch] = T(sumDyXhat);
    if (dBias)
      dBias[ch] = T(sumDy);
  }
}

//===----------------------------------------------------------------------===//
// LayerNormalization
//===----------------------------------------------------------------------===//

template <class T>
void layerNormKernel(void *const *bufs, const int64_t *ints,
                     const double *reals) {
  const T *x = static_cast<const T *>(bufs[0]);
  const T *scale = static_cast<const T *>(bufs[1]);
  const T *bias = static_cast<const T *>(bufs[2]);
  T *y = static_cast<T *>(bufs[3]);
  T *meanOut = static_cast<T *>(bufs[4]);
  T *invStdOut = static_cast<T *>(bufs[5]);
  int64_t outer = ints[0], inner = ints[1];
  const double eps = reals ? reals[0] : kDefaultEpsilon;
  if (outer <= 0 || inner <= 0)
    return;
  for (int64_t r = 0; r < outer; ++r) {
    const T *xr = x + r * inner;
    T *yr = y + r * inner;
    double mean, var;
    meanVar(xr, 1, inner, inner, mean, var);
    const double invStdD = 1.0 / std::sqrt(var + eps);
    const SplitMean<T> mu(mean);
    const T invStd = T(invStdD);
    if (bias) {
      for (int64_t j = 0; j < inner; ++j)
        yr[j] = ((xr[j] - mu.hi) - mu.lo) * invStd * scale[j] + bias[j];
    } else {
      for (int64_t j = 0; j < inner; ++j)
        yr[j] = ((xr[j] - mu.hi) - mu.lo) * invStd * scale[j];
    }
    if (meanOut)
      meanOut[r] = mu.hi;
    if (invStdOut)
      invStdOut[r] = invStd;
  }
}

template <class T>
void layerNormGradKernel(void *const *bufs, const int64_t *ints,
                         const double *reals) {
  const T *x = static_cast<const T *>(bufs[0]);
  const T *scale = static_cast<const T *>(bufs[1]);
  const T *meanIn = static_cast<const T *>(bufs[2]);
  const T *invStdIn = static_cast<const T *>(bufs[3]);
  const T *dy = static_cast<const T *>(bufs[4]);
  T *dx = static_cast<T *>(bufs[5]);
  T *dScale = static_cast<T *>(bufs[6]);
  T *dBias = static_cast<T *>(bufs[7]);
  int64_t outer = ints[0], inner = ints[1];
  if (inner <= 0)
    return;
  // Column sums over the rows, in double.
  std::vector<double> accScale(dScale ? size_t(inner) : 0, 0.0);
  std::vector<double> accBias(dBias ? size_t(inner) : 0, 0.0);
  for (int64_t r = 0; r < std::max<int64_t>(outer, 0); ++r) {
    const T *xr = x + r * inner;
    const T *dyr = dy + r * inner;
    const T mean = meanIn[r], invStd = invStdIn[r];
    if (dScale)
      for (int64_t j = 0; j < inner; ++j)
        accScale[size_t(j)] += double(dyr[j]) * double((xr[j] - mean) * invStd);
    if (dBias)
      for (int64_t j = 0; j < inner; ++j)
        accBias[size_t(j)] += dyr[j];
    if (!dx)
      continue;
    double sumG = 0, sumGXhat = 0;
    gradSumsRow(xr, dyr, scale, inner, mean, invStd, sumG, sumGXhat);
    const T meanG = T(sumG / double(inner));
    const T meanGXhat = T(sumGXhat / double(inner));
    T *dxr = dx + r * inner;
    for (int64_t j = 0; j < inner; ++j) {
      const T xhat = (xr[j] - mean) * invStd;
      dxr[j] = invStd * (dyr[j] * scale[j] - meanG - xhat * meanGXhat);
    }
  }
  for (int64_t j = 0; j < inner; ++j) {
    if (dScale)
      dScale[j] = T(accScale[size_t(j)]);
    if (dBias)
      dBias[j] = T(accBias[size_t(j)]);
  }
}

} // namespace

PIPEC_CPU_KERNEL(pipec_k_batchnorm_train, batchNormTrainKernel)
PIPEC_CPU_KERNEL(pipec_k_batchnorm_infer, batchNormInferKernel)
PIPEC_CPU_KERNEL(pipec_k_batchnorm_grad, batchNormGradKernel)
PIPEC_CPU_KERNEL(pipec_k_layernorm, layerNormKernel)
PIPEC_CPU_KERNEL(pipec_k_layernorm_grad, layerNormGradKernel)
