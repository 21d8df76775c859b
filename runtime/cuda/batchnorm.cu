//===- batchnorm.cu - Batch normalization and its backward ----------------===//
//
// Part of pipec's CUDA runtime. CUDA twins of pipec_k_batchnorm_train,
// pipec_k_batchnorm_infer and pipec_k_batchnorm_grad (see
// include/pipec_rt.h for the parameter layouts and cpu/norm.cpp for the
// reference and the formulas).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Training forward and backward: one thread block per channel, reducing
/// the channel's N * S values (rows of S at stride C * S; each thread walks
/// its values with channel_walk.h, no division per value) with the
/// deterministic block reduction of block_reduce.cuh, in double as on the
/// CPU:
///
///  - train: mean, then the centred sum of squares (biased variance, /
///    count); invStd = 1 / sqrt(var + eps) in double; the mean is split into
///    hi + lo floats and y = ((x - hi) - lo) * float(scale * invStd) + bias
///    in float. savedMean = float(mean), savedInvStd = float(invStd); the
///    running statistics follow ONNX with the biased batch variance:
///    runOut = momentum * run + (1 - momentum) * stat, in double. Each is
///    read before it is written, by the same thread, so runMeanOut /
///    runVarOut may alias runMean / runVar. The four statistics outputs may
///    each be NULL.
///  - grad: the mean is recomputed in double (savedMean is not read), with
///    invStd = double(savedInvStd); sums of dY and dY * xhat in double;
///    dX = float(scale invStd (dY - sumDy / R - xhat sumDyXhat / R)) in
///    double per element; dScale = float(sumDyXhat), dBias = float(sumDy).
///    dX, dScale and dBias may each be NULL.
///
/// With few channels and many values each (ResNet-50's first stages: 64 to
/// 256 channels of 200 704 values at batch 64, fewer blocks than an H200's
/// 132 SMs hold), each channel is split into `parts` contiguous ranges of
/// its values, each a block's (splitParts): one kernel sums each range in
/// double, the next (every block re-adding its channel's partial sums in
/// part order: the same mean in every block) the centred squares (train) or
/// dY and dY * xhat (grad) of each range, the last writes each range's
/// outputs from the totals (block 0 of a channel the per-channel ones).
/// The same formulas; the sums' order is fixed by the split, so the kernels
/// stay deterministic, and differ from the one-block kernels' only in the
/// order of double additions.
///
/// Inference: one thread per channel computes float(scale / sqrt(var +
/// eps)) in double into the scratch buffer, then one thread per element
/// applies ((x - mean) - lo) * a + bias in float (lo = 0 for a float mean).
///
/// Y may alias X and dX may alias dY: the reductions finish (the block
/// synchronises; with split channels, the earlier kernels end) before any
/// element is written, and each element is read and written by one
/// thread. Sums run in a different order than the CPU's
/// eight-lane ones, so double results may differ in their last bits, which
/// changes a float result only on a rounding tie. Float products and sums
/// use round-to-nearest intrinsics (no FMA contraction); so do the double
/// formulas that the CPU evaluates per element.
///
//===----------------------------------------------------------------------===//

#include "block_reduce.cuh"
#include "channel_walk.h"
#include "cuda_rt.h"
#include "pipec_rt.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace pipec {
namespace cuda {
namespace {

constexpr double kDefaultEpsilon = 1e-5;
constexpr double kDefaultMomentum = 0.9;
constexpr int kBlock = 256;

/// The training forward's y = ((x - hi) - lo) * a + b in float, with the
/// double mean split into hi + lo floats and a = float(scale * invStd).
struct TrainAffine {
  float hi, lo, a, b;
  __device__ TrainAffine(double mean, double invStd, float scale, float bias)
      : hi(float(mean)), lo(float(mean - double(hi))),
        a(float(double(scale) * invStd)), b(bias) {}
  __device__ float operator()(float x) const {
    return __fadd_rn(__fmul_rn(__fsub_rn(__fsub_rn(x, hi), lo), a), b);
  }
};

/// The per-channel outputs of the training forward (each may be NULL). In
/// the CPU's order: runMean is read before runMeanOut is written, runVar
/// before runVarOut (they may alias).
__device__ void writeTrainStatistics(int64_t ch, double mean, double var,
                                     double invStd, const float *runMean,
                                     const float *runVar, float *savedMean,
                                     float *savedInvStd, float *runMeanOut,
                                     float *runVarOut, double momentum) {
  if (savedMean)
    savedMean[ch] = float(mean);
  if (savedInvStd)
    savedInvStd[ch] = float(invStd);
  if (runMeanOut)
    runMeanOut[ch] = float(__dadd_rn(__dmul_rn(momentum, double(runMean[ch])),
                                     __dmul_rn(1.0 - momentum, mean)));
  if (runVarOut)
    runVarOut[ch] = float(__dadd_rn(__dmul_rn(momentum, double(runVar[ch])),
                                    __dmul_rn(1.0 - momentum, var)));
}

/// One value's share of the backward's sums: dY and dY * xhat.
__device__ __forceinline__ void addGradTerms(float xv, float gv, double meanD,
                                             double invStd, double &sumDy,
                                             double &sumDyXhat) {
  const double g = double(gv);
  const double xhat = __dmul_rn(double(xv) - meanD, invStd);
  sumDy += g;
  sumDyXhat = __dadd_rn(sumDyXhat, __dmul_rn(g, xhat));
}

/// One value's dX: k (dY - mean dY - xhat mean(dY xhat)), in double.
__device__ __forceinline__ float gradDx(float xv, float gv, double meanD,
                                        double invStd, double k, double meanDy,
                                        double meanDyXhat) {
  const double xhat = __dmul_rn(double(xv) - meanD, invStd);
  const double inner =
      __dsub_rn(double(gv) - meanDy, __dmul_rn(xhat, meanDyXhat));
  return float(__dmul_rn(k, inner));
}

__global__ void __launch_bounds__(1024)
    batchNormTrainChannels(const float *x, const float *scale,
                           const float *bias, const float *runMean,
                           const float *runVar, float *y, float *savedMean,
                           float *savedInvStd, float *runMeanOut,
                           float *runVarOut, int64_t n, int64_t c, int64_t s,
                           double eps, double momentum) {
  __shared__ double red[32];
  const int64_t count = n * s;
  const double countD = double(n) * double(s);
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    double acc = 0;
    for (ChannelWalk w(threadIdx.x, blockDim.x, ch, c, s); w.e < count;
         w.next())
      acc += double(x[w.at]);
    const double mean = blockReduce(acc, SumOp(), 0.0, red) / countD;
    acc = 0;
    for (ChannelWalk w(threadIdx.x, blockDim.x, ch, c, s); w.e < count;
         w.next()) {
      const double d = double(x[w.at]) - mean;
      acc = __dadd_rn(acc, __dmul_rn(d, d));
    }
    const double var = blockReduce(acc, SumOp(), 0.0, red) / countD;
    const double invStd = 1.0 / sqrt(var + eps);
    const TrainAffine f(mean, invStd, scale[ch], bias[ch]);
    for (ChannelWalk w(threadIdx.x, blockDim.x, ch, c, s); w.e < count;
         w.next())
      y[w.at] = f(x[w.at]);
    if (threadIdx.x == 0)
      writeTrainStatistics(ch, mean, var, invStd, runMean, runVar, savedMean,
                           savedInvStd, runMeanOut, runVarOut, momentum);
  }
}

/// coef[ch] = float(scale / sqrt(var + eps)), in double as on the CPU.
__global__ void batchNormInferCoef(const float *scale, const float *var,
                                   float *coef, int64_t c, double eps) {
  for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < c;
       ch += int64_t(gridDim.x) * blockDim.x)
    coef[ch] = float(double(scale[ch]) / sqrt(double(var[ch]) + eps));
}

__global__ void batchNormInferApply(const float *x, const float *coef,
                                    const float *bias, const float *mean,
                                    float *y, int64_t total, int64_t c,
                                    int64_t s) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ch = (e / s) % c;
    // cpu/norm.cpp's SplitMean of a float mean: hi = mean, lo = 0.
    const float hi = mean[ch];
    const float lo = float(double(mean[ch]) - double(hi));
    y[e] = __fadd_rn(__fmul_rn(__fsub_rn(__fsub_rn(x[e], hi), lo), coef[ch]),
                     bias[ch]);
  }
}

__global__ void __launch_bounds__(1024)
    batchNormGradChannels(const float *x, const float *scale,
                          const float *savedInvStd, const float *dy, float *dx,
                          float *dScale, float *dBias, int64_t n, int64_t c,
                          int64_t s) {
  __shared__ double red[32];
  const int64_t count = n * s;
  const double countD = double(n) * double(s);
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    double acc = 0;
    for (ChannelWalk w(threadIdx.x, blockDim.x, ch, c, s); w.e < count;
         w.next())
      acc += double(x[w.at]);
    const double meanD = blockReduce(acc, SumOp(), 0.0, red) / countD;
    const double invStd = double(savedInvStd[ch]);
    double sumDy = 0, sumDyXhat = 0;
    for (ChannelWalk w(threadIdx.x, blockDim.x, ch, c, s); w.e < count;
         w.next()) {
      addGradTerms(x[w.at], dy[w.at], meanD, invStd, sumDy, sumDyXhat);
    }
    sumDy = blockReduce(sumDy, SumOp(), 0.0, red);
    sumDyXhat = blockReduce(sumDyXhat, SumOp(), 0.0, red);
    if (dx) {
      const double k = double(scale[ch]) * invStd;
      const double meanDy = sumDy / countD;
      const double meanDyXhat = sumDyXhat / countD;
      for (ChannelWalk w(threadIdx.x, blockDim.x, ch, c, s); w.e < count;
           w.next()) {
        const int64_t at = w.at;
        dx[at] = gradDx(x[at], dy[at], meanD, invStd, k, meanDy, meanDyXhat);
      }
    }
    if (threadIdx.x == 0) {
      if (dScale)
        dScale[ch] = float(sumDyXhat);
      if (dBias)
        dBias[ch] = float(sumDy);
    }
  }
}

//===----------------------------------------------------------------------===//
// Channels split across blocks
//===----------------------------------------------------------------------===//

constexpr int kPartBlock = 256;
/// Values per part at least (fewer: the one-block kernels).
constexpr int64_t kMinPartValues = 8192;

/// Part p = blockIdx.x of channel ch = blockIdx.y: values [first, end).
struct Part {
  int64_t ch, p, first, end;
  __device__ Part(int64_t count, int64_t chunk)
      : ch(blockIdx.y), p(blockIdx.x), first(int64_t(blockIdx.x) * chunk),
        end(first + chunk < count ? first + chunk : count) {}
};

/// Sum of `partial[ch * parts + 0 .. parts)`, in part order.
__device__ double addParts(const double *partial, int64_t ch, int parts) {
  double t = 0;
  for (int q = 0; q < parts; ++q)
    t += partial[ch * parts + q];
  return t;
}

/// sums[ch * parts + p]: the sum of part p of channel ch.
__global__ void __launch_bounds__(kPartBlock)
    batchNormPartSums(const float *x, double *sums, int64_t c, int64_t s,
                      int64_t count, int64_t chunk, int parts) {
  __shared__ double red[32];
  const Part part(count, chunk);
  double acc = 0;
  for (ChannelWalk w(part.first + threadIdx.x, blockDim.x, part.ch, c, s);
       w.e < part.end; w.next())
    acc += double(x[w.at]);
  acc = blockReduce(acc, SumOp(), 0.0, red);
  if (threadIdx.x == 0)
    sums[part.ch * parts + part.p] = acc;
}

/// squares[ch * parts + p]: the centred sum of squares of part p.
__global__ void __launch_bounds__(kPartBlock)
    batchNormPartSquares(const float *x, const double *sums, double *squares,
                         int64_t c, int64_t s, int64_t count, int64_t chunk,
                         int parts) {
  __shared__ double red[32];
  const Part part(count, chunk);
  const double mean =
      addParts(sums, part.ch, parts) / (double(count) /* n * s */);
  double acc = 0;
  for (ChannelWalk w(part.first + threadIdx.x, blockDim.x, part.ch, c, s);
       w.e < part.end; w.next()) {
    const double d = double(x[w.at]) - mean;
    acc = __dadd_rn(acc, __dmul_rn(d, d));
  }
  acc = blockReduce(acc, SumOp(), 0.0, red);
  if (threadIdx.x == 0)
    squares[part.ch * parts + part.p] = acc;
}

/// The train kernel's outputs from the partial sums (formulas above).
__global__ void __launch_bounds__(kPartBlock) batchNormPartTrainApply(
    const float *x, const float *scale, const float *bias, const float *runMean,
    const float *runVar, float *y, float *savedMean, float *savedInvStd,
    float *runMeanOut, float *runVarOut, const double *sums,
    const double *squares, int64_t c, int64_t s, int64_t count, int64_t chunk,
    int parts, double eps, double momentum) {
  const Part part(count, chunk);
  const int64_t ch = part.ch;
  const double countD = double(count);
  const double mean = addParts(sums, ch, parts) / countD;
  const double var = addParts(squares, ch, parts) / countD;
  const double invStd = 1.0 / sqrt(var + eps);
  const TrainAffine f(mean, invStd, scale[ch], bias[ch]);
  for (ChannelWalk w(part.first + threadIdx.x, blockDim.x, ch, c, s);
       w.e < part.end; w.next())
    y[w.at] = f(x[w.at]);
  if (part.p == 0 && threadIdx.x == 0)
    writeTrainStatistics(ch, mean, var, invStd, runMean, runVar, savedMean,
                         savedInvStd, runMeanOut, runVarOut, momentum);
}

/// dys / dyXhats[ch * parts + p]: part p's sums of dY and dY * xhat.
__global__ void __launch_bounds__(kPartBlock)
    batchNormPartGradSums(const float *x, const float *savedInvStd,
                          const float *dy, const double *sums, double *dys,
                          double *dyXhats, int64_t c, int64_t s, int64_t count,
                          int64_t chunk, int parts) {
  __shared__ double red[32];
  const Part part(count, chunk);
  const int64_t ch = part.ch;
  const double meanD = addParts(sums, ch, parts) / double(count);
  const double invStd = double(savedInvStd[ch]);
  double sumDy = 0, sumDyXhat = 0;
  for (ChannelWalk w(part.first + threadIdx.x, blockDim.x, ch, c, s);
       w.e < part.end; w.next()) {
    addGradTerms(x[w.at], dy[w.at], meanD, invStd, sumDy, sumDyXhat);
  }
  sumDy = blockReduce(sumDy, SumOp(), 0.0, red);
  sumDyXhat = blockReduce(sumDyXhat, SumOp(), 0.0, red);
  if (threadIdx.x == 0) {
    dys[ch * parts + part.p] = sumDy;
    dyXhats[ch * parts + part.p] = sumDyXhat;
  }
}

/// The grad kernel's outputs from the partial sums.
__global__ void __launch_bounds__(kPartBlock)
    batchNormPartGradApply(const float *x, const float *scale,
                           const float *savedInvStd, const float *dy, float *dx,
                           float *dScale, float *dBias, const double *sums,
                           const double *dys, const double *dyXhats, int64_t c,
                           int64_t s, int64_t count, int64_t chunk, int parts) {
  const Part part(count, chunk);
  const int64_t ch = part.ch;
  const double countD = double(count);
  const double meanD = addParts(sums, ch, parts) / countD;
  const double invStd = double(savedInvStd[ch]);
  const double sumDy = addParts(dys, ch, parts);
  const double sumDyXhat = addParts(dyXhats, ch, parts);
  if (dx) {
    const double k = double(scale[ch]) * invStd;
    const double meanDy = sumDy / countD;
    const double meanDyXhat = sumDyXhat / countD;
    for (ChannelWalk w(part.first + threadIdx.x, blockDim.x, ch, c, s);
         w.e < part.end; w.next()) {
      const int64_t at = w.at;
      dx[at] = gradDx(x[at], dy[at], meanD, invStd, k, meanDy, meanDyXhat);
    }
  }
  if (part.p == 0 && threadIdx.x == 0) {
    if (dScale)
      dScale[ch] = float(sumDyXhat);
    if (dBias)
      dBias[ch] = float(sumDy);
  }
}

/// How many parts each of `c` channels of `count` values is split into: 1
/// (the one-block kernels) where the channels alone make kSplitBlocks / 2
/// blocks, else enough for about kSplitBlocks blocks, each with
/// kMinPartValues values at least. kSplitBlocks is what an H100's or
/// H200's 132 SMs hold at once (eight blocks of 256 threads each, 1056),
/// and a constant rather than the GPU's SM count so
/// that the split, and with it the order of the sums, depends on the shapes
/// alone: GPUs with other SM counts give the same bits.
/// PIPEC_BN_SPLIT=0 (Context::bnSplit) keeps the one-block kernels.
int splitParts(const Context &ctx, int64_t c, int64_t count) {
  constexpr int64_t kSplitBlocks = 1024;
  if (!ctx.bnSplit || c >= kSplitBlocks / 2)
    return 1;
  const int64_t parts =
      std::min<int64_t>((kSplitBlocks + c - 1) / c, count / kMinPartValues);
  return int(std::max<int64_t>(1, std::min<int64_t>(parts, 1024)));
}

} // namespace
} // namespace cuda
} // namespace pipec

using namespace pipec::cuda;

extern "C" void pipec_cuda_k_batchnorm_train(pipec_kctx *kc, void *const *bufs,
                                             const int64_t *ints,
                                             const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_batchnorm_train");
  const float *x = static_cast<const float *>(bufs[0]);
  const float *scale = static_cast<const float *>(bufs[1]);
  const float *bias = static_cast<const float *>(bufs[2]);
  const float *runMean = static_cast<const float *>(bufs[3]);
  const float *runVar = static_cast<const float *>(bufs[4]);
  float *y = static_cast<float *>(bufs[5]);
  float *savedMean = static_cast<float *>(bufs[6]);
  float *savedInvStd = static_cast<float *>(bufs[7]);
  float *runMeanOut = static_cast<float *>(bufs[8]);
  float *runVarOut = static_cast<float *>(bufs[9]);
  const int64_t n = ints[0], c = ints[1], s = ints[2];
  const double eps = reals ? reals[0] : kDefaultEpsilon;
  const double momentum = reals ? reals[1] : kDefaultMomentum;
  if (n <= 0 || c <= 0 || s <= 0)
    return;
  const int64_t count = n * s;
  const int parts = splitParts(ctx, c, count);
  if (parts == 1) {
    batchNormTrainChannels<<<rowGrid(c), rowBlock(count, 1024), 0,
                             ctx.stream>>>(x, scale, bias, runMean, runVar, y,
                                           savedMean, savedInvStd, runMeanOut,
                                           runVarOut, n, c, s, eps, momentum);
    checkLaunch("pipec_cuda_k_batchnorm_train");
    return;
  }
  const char *kernel = "pipec_cuda_k_batchnorm_train";
  const int64_t chunk = (count + parts - 1) / parts;
  double *sums = static_cast<double *>(
      scratch(ctx, size_t(2 * c * parts) * sizeof(double)));
  double *squares = sums + c * parts;
  const dim3 grid(static_cast<unsigned>(parts), static_cast<unsigned>(c));
  batchNormPartSums<<<grid, kPartBlock, 0, ctx.stream>>>(x, sums, c, s, count,
                                                         chunk, parts);
  checkLaunch(kernel);
  batchNormPartSquares<<<grid, kPartBlock, 0, ctx.stream>>>(
      x, sums, squares, c, s, count, chunk, parts);
  checkLaunch(kernel);
  batchNormPartTrainApply<<<grid, kPartBlock, 0, ctx.stream>>>(
      x, scale, bias, runMean, runVar, y, savedMean, savedInvStd, runMeanOut,
      runVarOut, sums, squares, c, s, count, chunk, parts, eps, momentum);
  checkLaunch(kernel);
}

extern "C" void pipec_cuda_k_batchnorm_infer(pipec_kctx *kc, void *const *bufs,
                                             const int64_t *ints,
                                             const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_batchnorm_infer");
  const char *kernel = "pipec_cuda_k_batchnorm_infer";
  const float *x = static_cast<const float *>(bufs[0]);
  const float *scale = static_cast<const float *>(bufs[1]);
  const float *bias = static_cast<const float *>(bufs[2]);
  const float *mean = static_cast<const float *>(bufs[3]);
  const float *var = static_cast<const float *>(bufs[4]);
  float *y = static_cast<float *>(bufs[5]);
  const int64_t n = ints[0], c = ints[1], s = ints[2];
  const double eps = reals ? reals[0] : kDefaultEpsilon;
  if (n <= 0 || c <= 0 || s <= 0)
    return;
  cudaStream_t st = ctx.stream;
  float *coef = static_cast<float *>(scratch(ctx, size_t(c) * sizeof(float)));
  batchNormInferCoef<<<gridFor(c, kBlock), kBlock, 0, st>>>(scale, var, coef, c,
                                                            eps);
  checkLaunch(kernel);
  const int64_t total = n * c * s;
  batchNormInferApply<<<gridFor(total, kBlock), kBlock, 0, st>>>(
      x, coef, bias, mean, y, total, c, s);
  checkLaunch(kernel);
}

extern "C" void pipec_cuda_k_batchnorm_grad(pipec_kctx *kc, void *const *bufs,
                                            const int64_t *ints,
                                            const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_batchnorm_grad");
  const char *kernel = "pipec_cuda_k_batchnorm_grad";
  const float *x = static_cast<const float *>(bufs[0]);
  const float *scale = static_cast<const float *>(bufs[1]);
  // bufs[2], savedMean, is not read: the mean is recomputed in double.
  const float *savedInvStd = static_cast<const float *>(bufs[3]);
  const float *dy = static_cast<const float *>(bufs[4]);
  float *dx = static_cast<float *>(bufs[5]);
  float *dScale = static_cast<float *>(bufs[6]);
  float *dBias = static_cast<float *>(bufs[7]);
  const int64_t n = ints[0], c = ints[1], s = ints[2];
  if (c <= 0)
    return;
  cudaStream_t st = ctx.stream;
  if (n <= 0 || s <= 0) {
    // No elements: zero parameter gradients (dX is empty).
    if (dScale)
      check(cudaMemsetAsync(dScale, 0, size_t(c) * sizeof(float), st), kernel);
    if (dBias)
      check(cudaMemsetAsync(dBias, 0, size_t(c) * sizeof(float), st), kernel);
    return;
  }
  const int64_t count = n * s;
  const int parts = splitParts(ctx, c, count);
  if (parts == 1) {
    batchNormGradChannels<<<rowGrid(c), rowBlock(count, 1024), 0, st>>>(
        x, scale, savedInvStd, dy, dx, dScale, dBias, n, c, s);
    checkLaunch(kernel);
    return;
  }
  const int64_t chunk = (count + parts - 1) / parts;
  double *sums = static_cast<double *>(
      scratch(ctx, size_t(3 * c * parts) * sizeof(double)));
  double *dys = sums + c * parts, *dyXhats = dys + c * parts;
  const dim3 grid(static_cast<unsigned>(parts), static_cast<unsigned>(c));
  batchNormPartSums<<<grid, kPartBlock, 0, st>>>(x, sums, c, s, count, chunk,
                                                 parts);
  checkLaunch(kernel);
  batchNormPartGradSums<<<grid, kPartBlock, 0, st>>>(
      x, savedInvStd, dy, sums, dys, dyXhats, c, s, count, chunk, parts);
  checkLaunch(kernel);
  // (Without dX only block 0 of each channel has work: the totals.)
  batchNormPartGradApply<<<dx ? grid : dim3(1u, static_cast<unsigned>(c)),
                           kPartBlock, 0, st>>>(
      x, scale, savedInvStd, dy, dx, dScale, dBias, sums, dys, dyXhats, c, s,
      count, chunk, parts);
  checkLaunch(kernel);
}
