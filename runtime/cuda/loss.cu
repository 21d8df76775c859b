//===- loss.cu - SoftmaxCrossEntropyLoss and its gradient -----------------===//
//
// Part of pipec's CUDA runtime. CUDA twins of pipec_k_sce_loss and
// pipec_k_sce_loss_grad (see include/pipec_rt.h for the parameter layouts
// and cpu/loss.cpp for the reference and the ONNX opset 13 semantics).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Scores are [N, C, D]; each of the N * D positions (C classes, D apart)
/// is independent: one thread block per position for long rows (C >= 64)
/// that are contiguous (D == 1) or few, else one thread per position.
/// As on the CPU: max and x - max in float, expf, the sum of exponentials,
/// the log-sum-exp and the per-position losses in double; logProb =
/// float(x - lse); dScores = float(coef * (float exp(float(x - lse)) -
/// onehot)) with coef = g * w in double.
///
/// The reduced losses are deterministic: the per-position losses and
/// weights go (as doubles) to the scratch buffer and one block adds them
/// in a fixed order. The mean's denominator W of the backward is computed
/// the same way before the gradient kernel, which reads it from scratch.
/// Cases ONNX leaves undefined follow the CPU: mean with W == 0 gives a 0
/// loss and gradient; a label outside [0, C) that is not the ignore index
/// counts as ignored (never used as an index); an unknown reduction
/// poisons the output with NaN.
///
/// dScores may alias scores: a position's scores are read (the log-sum-exp,
/// after a block synchronisation) before any of them is overwritten, and
/// each element by the thread that writes it.
///
//===----------------------------------------------------------------------===//

#include "block_reduce.cuh"
#include "cuda_rt.h"
#include "pipec_rt.h"

#include <cmath>
#include <cstdint>
#include <limits>

namespace pipec {
namespace cuda {
namespace {

enum Reduction : int64_t { kNone = 0, kMean = 1, kSum = 2 };

/// See softmax.cu: positions of at least kLongRow classes take one block
/// each when contiguous (D == 1) or fewer than kFewRows.
constexpr int64_t kFewRows = 2048;
constexpr int64_t kLongRow = 64;
/// Threads of the single-block reductions.
constexpr int kReduceThreads = 512;

/// The decoded parameter block, passed by value to the kernels.
struct SceParams {
  int64_t n, c, d;
  int64_t reduction;
  const float *weights; ///< Null without class weights.
  bool hasIgnore;
  int64_t ignoreIndex;

  SceParams(const int64_t *ints, const void *weightsBuf)
      : n(ints[0]), c(ints[1]), d(ints[2]), reduction(ints[3]),
        weights(ints[4] != 0 ? static_cast<const float *>(weightsBuf)
                             : nullptr),
        hasIgnore(ints[5] != 0), ignoreIndex(ints[6]) {}

  /// Whether target `t` contributes (not ignored, and a valid class).
  __host__ __device__ bool counts(int64_t t) const {
    if (hasIgnore && t == ignoreIndex)
      return false;
    return t >= 0 && t < c;
  }
  /// Weight of a contributing target.
  __device__ double weight(int64_t t) const {
    return weights ? double(weights[t]) : 1.0;
  }
  __host__ __device__ int64_t positions() const { return n * d; }
  bool blockPerPosition() const {
    return c >= kLongRow && (d == 1 || positions() < kFewRows);
  }
  /// First score of position `pos` (= i * D + j).
  __device__ int64_t base(int64_t pos) const {
    const int64_t i = pos / d;
    return i * c * d + (pos - i * d);
  }
};

__global__ void fillKernel(float *y, int64_t n, float value) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x)
    y[e] = value;
}

/// log-sum-exp of the C scores x[k * D] by one thread.
__device__ double lseThread(const float *x, int64_t c, int64_t d) {
  float mx = x[0];
  for (int64_t k = 1; k < c; ++k)
    mx = fmaxf(mx, x[k * d]);
  double sum = 0;
  for (int64_t k = 0; k < c; ++k)
    sum += double(expf(__fsub_rn(x[k * d], mx)));
  return double(mx) + log(sum);
}

/// log-sum-exp of the C scores x[k * D] by the whole block.
__device__ double lseBlock(const float *x, int64_t c, int64_t d, float *redF,
                           double *redD) {
  float mx = -INFINITY;
  for (int64_t k = threadIdx.x; k < c; k += blockDim.x)
    mx = fmaxf(mx, x[k * d]);
  mx = blockReduce(mx, MaxOp(), -INFINITY, redF);
  double sum = 0;
  for (int64_t k = threadIdx.x; k < c; k += blockDim.x)
    sum += double(expf(__fsub_rn(x[k * d], mx)));
  sum = blockReduce(sum, SumOp(), 0.0, redD);
  return double(mx) + log(sum);
}

/// log-sum-exp of the C contiguous scores x[k] by the whole block in one
/// pass over memory (rows of a language model's vocabulary do not stay in
/// cache between two passes): each thread keeps its running maximum m and
/// sum s = sum of exp(x - m) in double, rescaled when m grows; the block
/// then takes the maximum M of the threads' maxima and adds
/// s * exp(m - M). Equal to the two-pass lseBlock up to float rounding of
/// the individual exponentials. A row with a NaN gives NaN, as there.
__device__ double lseBlockOnePass(const float *x, int64_t c, float *redF,
                                  double *redD) {
  float m = -INFINITY;
  double s = 0;
  auto take = [&](float v) {
    if (v > m) {
      s *= exp(double(m) - double(v)); // 0 * exp(-inf) = 0 for the first
      m = v;
    }
    // exp(-inf - m) is 0 for a finite m; with m still -inf only a NaN
    // contributes (-inf - -inf would make a spurious NaN).
    if (m > -INFINITY || v != v)
      s += double(expf(__fsub_rn(v, m)));
  };
  const int64_t step = blockDim.x;
  int64_t k = threadIdx.x;
  // Four loads in flight per thread before their use.
  for (; k + 3 * step < c; k += 4 * step) {
    const float v0 = x[k], v1 = x[k + step], v2 = x[k + 2 * step],
                v3 = x[k + 3 * step];
    take(v0);
    take(v1);
    take(v2);
    take(v3);
  }
  for (; k < c; k += step)
    take(x[k]);
  const float mx = blockReduce(m, MaxOp(), -INFINITY, redF);
  // A thread that saw only -inf (or nothing) adds nothing but its NaN.
  double part = 0;
  if (m > -INFINITY || s != s)
    part = s * exp(double(m) - double(mx));
  const double sum = blockReduce(part, SumOp(), 0.0, redD);
  // A row of -inf only: NaN, as the two-pass form gives (x - max is NaN).
  if (!(mx > -INFINITY))
    return double(NAN);
  return double(mx) + log(sum);
}

/// The block's log-sum-exp of position `pos`'s scores: one pass when they
/// are contiguous.
__device__ double lseOfPosition(const float *x, int64_t c, int64_t d,
                                float *redF, double *redD) {
  return d == 1 ? lseBlockOnePass(x, c, redF, redD)
                : lseBlock(x, c, d, redF, redD);
}

/// The loss of one position from its log-sum-exp; *w gets its weight in
/// the mean's denominator (0 when it does not count).
__device__ double positionLoss(const SceParams &p, const float *x, int64_t t,
                               double lse, double *w) {
  if (!p.counts(t)) {
    *w = 0;
    return 0;
  }
  *w = p.weight(t);
  return -*w * (double(x[t * p.d]) - lse);
}

/// Stores a position's loss: loss[pos] for reduction none, else the loss
/// and weight partials.
__device__ void storeLoss(const SceParams &p, int64_t pos, double l, double w,
                          float *loss, double *lossPart, double *weightPart) {
  if (p.reduction == kNone) {
    loss[pos] = float(l);
  } else {
    lossPart[pos] = l;
    weightPart[pos] = w;
  }
}

__global__ void sceLossBlock(const float *scores, const int64_t *labels,
                             SceParams p, float *loss, float *logProb,
                             double *lossPart, double *weightPart) {
  __shared__ float redF[32];
  __shared__ double redD[32];
  const int64_t positions = p.positions();
  for (int64_t pos = blockIdx.x; pos < positions; pos += gridDim.x) {
    const int64_t base = p.base(pos);
    const float *x = scores + base;
    const double lse = lseOfPosition(x, p.c, p.d, redF, redD);
    if (threadIdx.x == 0) {
      double w;
      const double l = positionLoss(p, x, labels[pos], lse, &w);
      storeLoss(p, pos, l, w, loss, lossPart, weightPart);
    }
    if (logProb) {
      // After the loss read x[t]: ordered for an aliased logProb too.
      __syncthreads();
      for (int64_t k = threadIdx.x; k < p.c; k += blockDim.x)
        logProb[base + k * p.d] = float(double(x[k * p.d]) - lse);
    }
  }
}

__global__ void sceLossThread(const float *scores, const int64_t *labels,
                              SceParams p, float *loss, float *logProb,
                              double *lossPart, double *weightPart) {
  const int64_t positions = p.positions();
  for (int64_t pos = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
       pos < positions; pos += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = p.base(pos);
    const float *x = scores + base;
    const double lse = lseThread(x, p.c, p.d);
    double w;
    const double l = positionLoss(p, x, labels[pos], lse, &w);
    storeLoss(p, pos, l, w, loss, lossPart, weightPart);
    if (logProb)
      for (int64_t k = 0; k < p.c; ++k)
        logProb[base + k * p.d] = float(double(x[k * p.d]) - lse);
  }
}

/// One block: loss[0] = sum of the loss partials, divided by the sum of the
/// weight partials for the mean (0 when that is 0).
__global__ void sceLossReduce(const double *lossPart, const double *weightPart,
                              int64_t positions, bool mean, float *loss) {
  __shared__ double red[32];
  double total = 0, weight = 0;
  for (int64_t e = threadIdx.x; e < positions; e += blockDim.x) {
    total += lossPart[e];
    weight += weightPart[e];
  }
  total = blockReduce(total, SumOp(), 0.0, red);
  weight = blockReduce(weight, SumOp(), 0.0, red);
  if (threadIdx.x == 0) {
    if (mean)
      total = weight != 0 ? total / weight : 0.0;
    loss[0] = float(total);
  }
}

/// One block: *out = W, the sum of the weights of the counted targets.
__global__ void sceTotalWeight(const int64_t *labels, SceParams p,
                               double *out) {
  __shared__ double red[32];
  const int64_t positions = p.positions();
  double acc = 0;
  for (int64_t e = threadIdx.x; e < positions; e += blockDim.x) {
    const int64_t t = labels[e];
    if (p.counts(t))
      acc += p.weight(t);
  }
  acc = blockReduce(acc, SumOp(), 0.0, red);
  if (threadIdx.x == 0)
    *out = acc;
}

/// g of a position: dLoss[pos] (none), dLoss[0] (sum), dLoss[0] / W (mean).
__device__ double seedOf(const SceParams &p, const float *dLoss, int64_t pos,
                         const double *totalWeight) {
  if (p.reduction == kNone)
    return double(dLoss[pos]);
  if (p.reduction == kSum)
    return double(dLoss[0]);
  const double w = *totalWeight;
  return w != 0 ? double(dLoss[0]) / w : 0.0;
}

/// dScores of class k from coef = g * w and the log-sum-exp.
__device__ inline float gradElem(float x, double lse, double coef, int64_t k,
                                 int64_t t) {
  const double prob = double(expf(float(double(x) - lse)));
  return float(coef * (prob - (k == t ? 1.0 : 0.0)));
}

__global__ void sceLossGradBlock(const float *scores, const int64_t *labels,
                                 const float *dLoss, const double *totalWeight,
                                 SceParams p, float *dScores) {
  __shared__ float redF[32];
  __shared__ double redD[32];
  const int64_t positions = p.positions();
  for (int64_t pos = blockIdx.x; pos < positions; pos += gridDim.x) {
    const int64_t base = p.base(pos);
    const float *x = scores + base;
    float *dx = dScores + base;
    const int64_t t = labels[pos];
    if (!p.counts(t)) {
      for (int64_t k = threadIdx.x; k < p.c; k += blockDim.x)
        dx[k * p.d] = 0.0f;
      continue;
    }
    const double coef = seedOf(p, dLoss, pos, totalWeight) * p.weight(t);
    const double lse = lseOfPosition(x, p.c, p.d, redF, redD);
    for (int64_t k = threadIdx.x; k < p.c; k += blockDim.x)
      dx[k * p.d] = gradElem(x[k * p.d], lse, coef, k, t);
  }
}

__global__ void sceLossGradThread(const float *scores, const int64_t *labels,
                                  const float *dLoss, const double *totalWeight,
                                  SceParams p, float *dScores) {
  const int64_t positions = p.positions();
  for (int64_t pos = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
       pos < positions; pos += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = p.base(pos);
    const float *x = scores + base;
    float *dx = dScores + base;
    const int64_t t = labels[pos];
    if (!p.counts(t)) {
      for (int64_t k = 0; k < p.c; ++k)
        dx[k * p.d] = 0.0f;
      continue;
    }
    const double coef = seedOf(p, dLoss, pos, totalWeight) * p.weight(t);
    const double lse = lseThread(x, p.c, p.d);
    for (int64_t k = 0; k < p.c; ++k)
      dx[k * p.d] = gradElem(x[k * p.d], lse, coef, k, t);
  }
}

void fill(float *y, int64_t n, float value, cudaStream_t stream,
          const char *kName) {
  if (n <= 0)
    return;
  fillKernel<<<gridFor(n), 256, 0, stream>>>(y, n, value);
  checkLaunch(kName);
}

} // namespace
} // namespace cuda
} // namespace pipec

using namespace pipec::cuda;

extern "C" void pipec_cuda_k_sce_loss(pipec_kctx *kc, void *const *bufs,
                                      const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_sce_loss");
  const char *kName = "pipec_cuda_k_sce_loss";
  const float *scores = static_cast<const float *>(bufs[0]);
  const int64_t *labels = static_cast<const int64_t *>(bufs[1]);
  float *loss = static_cast<float *>(bufs[3]);
  float *logProb = static_cast<float *>(bufs[4]);
  const SceParams p(ints, bufs[2]);
  const bool perPosition = p.reduction == kNone;
  cudaStream_t stream = ctx.stream;
  if (p.reduction != kNone && p.reduction != kMean && p.reduction != kSum) {
    fill(loss, 1, std::numeric_limits<float>::quiet_NaN(), stream, kName);
    return;
  }
  if (p.n < 0 || p.d < 0 || p.c <= 0) {
    // No classes: every target is out of range. An empty reduced loss is 0.
    fill(loss, perPosition ? p.positions() : 1, 0.0f, stream, kName);
    return;
  }
  const int64_t positions = p.positions();
  double *lossPart = nullptr, *weightPart = nullptr;
  if (!perPosition && positions > 0) {
    lossPart = static_cast<double *>(
        scratch(ctx, sizeof(double) * size_t(positions) * 2));
    weightPart = lossPart + positions;
  }
  if (positions > 0) {
    if (p.blockPerPosition())
      sceLossBlock<<<rowGrid(positions), rowBlock(p.c), 0, stream>>>(
          scores, labels, p, loss, logProb, lossPart, weightPart);
    else
      sceLossThread<<<gridFor(positions), 256, 0, stream>>>(
          scores, labels, p, loss, logProb, lossPart, weightPart);
    checkLaunch(kName);
  }
  if (!perPosition) {
    sceLossReduce<<<1, kReduceThreads, 0, stream>>>(
        lossPart, weightPart, positions, p.reduction == kMean, loss);
    checkLaunch(kName);
  }
}

extern "C" void pipec_cuda_k_sce_loss_grad(pipec_kctx *kc, void *const *bufs,
                                           const int64_t *ints,
                                           const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_sce_loss_grad");
  const char *kName = "pipec_cuda_k_sce_loss_grad";
  const float *scores = static_cast<const float *>(bufs[0]);
  const int64_t *labels = static_cast<const int64_t *>(bufs[1]);
  const float *dLoss = static_cast<const float *>(bufs[3]);
  float *dScores = static_cast<float *>(bufs[4]);
  const SceParams p(ints, bufs[2]);
  if (p.n <= 0 || p.d <= 0 || p.c <= 0)
    return;
  cudaStream_t stream = ctx.stream;
  if (p.reduction != kNone && p.reduction != kMean && p.reduction != kSum) {
    fill(dScores, p.n * p.c * p.d, std::numeric_limits<float>::quiet_NaN(),
         stream, kName);
    return;
  }
  const int64_t positions = p.positions();
  double *totalWeight = nullptr;
  if (p.reduction == kMean) {
    totalWeight = static_cast<double *>(scratch(ctx, sizeof(double)));
    sceTotalWeight<<<1, kReduceThreads, 0, stream>>>(labels, p, totalWeight);
    checkLaunch(kName);
  }
  if (p.blockPerPosition())
    sceLossGradBlock<<<rowGrid(positions), rowBlock(p.c), 0, stream>>>(
        scores, labels, dLoss, totalWeight, p, dScores);
  else
    sceLossGradThread<<<gridFor(positions), 256, 0, stream>>>(
        scores, labels, dLoss, totalWeight, p, dScores);
  checkLaunch(kName);
}
