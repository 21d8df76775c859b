//===- norm.cu - Layer normalization and its backward ---------------------===//
//
// Part of pipec's CUDA runtime. CUDA twins of pipec_k_layernorm and
// pipec_k_layernorm_grad (see include/pipec_rt.h for the parameter layouts
// and cpu/norm.cpp for the reference and the formulas).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Forward: one warp per row of at most kWarpRow elements (the row held in
/// registers, reduced by shuffles), else one thread block per row. The mean and
/// the biased variance are accumulated in double with two passes (mean, then
/// the centred sum of squares), as on the CPU; the mean is split into hi + lo
/// floats and y = (((x - hi) - lo) * invStd) * scale (+ bias) in float with
/// invStd = float(1 / sqrt(var + eps)). The outputs mean (hi) and invStd
/// may be NULL.
///
/// Backward: dScale and dBias are column sums over the rows, overwritten
/// (not accumulated), in double. They are computed deterministically in two
/// launches: per chunk of rows one thread per column folds its rows in
/// order into a double partial sum (in the scratch buffer), then one warp
/// per column adds the chunks' partials (lane l the chunks l, l + 32, ...
/// in order, then a fixed shuffle tree). dX is one warp or block per row,
/// with the row sums of g = dY * scale and g * xhat in double:
///   dX = invStd * ((g - float(mean g)) - xhat * float(mean g xhat)),
///   xhat = (x - mean) * invStd in float, from the saved mean and invStd.
/// The column sums run first: dX may alias dY. dX, dScale and dBias may
/// each be NULL.
///
/// Float products and sums use explicit round-to-nearest intrinsics so that
/// the compiler cannot contract them into FMAs (the CPU build has none).
///
//===----------------------------------------------------------------------===//

#include "block_reduce.cuh"
#include "cuda_rt.h"
#include "pipec_rt.h"

#include <algorithm>
#include <cstdint>

namespace pipec {
namespace cuda {
namespace {

constexpr double kDefaultEpsilon = 1e-5;

/// Rows per chunk of the column sums, and the most partial values (chunks *
/// inner) kept per sum in the scratch buffer.
constexpr int64_t kRowsPerChunk = 32;
constexpr int64_t kMaxPartials = int64_t(1) << 22;

__global__ void layerNormRows(const float *x, const float *scale,
                              const float *bias, float *y, float *meanOut,
                              float *invStdOut, int64_t outer, int64_t inner,
                              double eps) {
  __shared__ double red[32];
  const double count = double(inner);
  for (int64_t r = blockIdx.x; r < outer; r += gridDim.x) {
    const float *xr = x + r * inner;
    float *yr = y + r * inner;
    double acc = 0;
    for (int64_t j = threadIdx.x; j < inner; j += blockDim.x)
      acc += double(xr[j]);
    const double mean = blockReduce(acc, SumOp(), 0.0, red) / count;
    acc = 0;
    for (int64_t j = threadIdx.x; j < inner; j += blockDim.x) {
      const double d = double(xr[j]) - mean;
      acc += d * d;
    }
    const double var = blockReduce(acc, SumOp(), 0.0, red) / count;
    const float invStd = float(1.0 / sqrt(var + eps));
    const float hi = float(mean);
    const float lo = float(mean - double(hi));
    for (int64_t j = threadIdx.x; j < inner; j += blockDim.x) {
      const float v = __fmul_rn(
          __fmul_rn(__fsub_rn(__fsub_rn(xr[j], hi), lo), invStd), scale[j]);
      yr[j] = bias ? __fadd_rn(v, bias[j]) : v;
    }
    if (threadIdx.x == 0) {
      if (meanOut)
        meanOut[r] = hi;
      if (invStdOut)
        invStdOut[r] = invStd;
    }
  }
}

/// layerNormRows with one warp per row of inner <= 32 * N elements.
template <int N>
__global__ void layerNormRowsWarp(const float *x, const float *scale,
                                  const float *bias, float *y, float *meanOut,
                                  float *invStdOut, int64_t outer, int inner,
                                  double eps) {
  const int lane = threadIdx.x & 31;
  const double count = double(inner);
  for (int64_t r = firstWarpRow(); r < outer; r += warpRowStride()) {
    const float *xr = x + r * inner;
    float *yr = y + r * inner;
    float v[N];
    double acc = 0;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int j = lane + 32 * i;
      v[i] = j < inner ? xr[j] : 0.0f;
      acc += double(v[i]);
    }
    const double mean = warpSum(acc) / count;
    acc = 0;
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (lane + 32 * i < inner) {
        const double d = double(v[i]) - mean;
        acc += d * d;
      }
    const double var = warpSum(acc) / count;
    const float invStd = float(1.0 / sqrt(var + eps));
    const float hi = float(mean);
    const float lo = float(mean - double(hi));
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int j = lane + 32 * i;
      if (j < inner) {
        const float o = __fmul_rn(
            __fmul_rn(__fsub_rn(__fsub_rn(v[i], hi), lo), invStd), scale[j]);
        yr[j] = bias ? __fadd_rn(o, bias[j]) : o;
      }
    }
    if (lane == 0) {
      if (meanOut)
        meanOut[r] = hi;
      if (invStdOut)
        invStdOut[r] = invStd;
    }
  }
}

template <int N> struct LayerNormWarp {
  static void run(cudaStream_t stream, const float *x, const float *scale,
                  const float *bias, float *y, float *meanOut, float *invStdOut,
                  int64_t outer, int inner, double eps) {
    layerNormRowsWarp<N>
        <<<warpRowGrid(outer), 32 * kWarpsPerBlock, 0, stream>>>(
            x, scale, bias, y, meanOut, invStdOut, outer, inner, eps);
  }
};

/// xhat = (x - mean) * invStd in float, as the CPU backward computes it.
__device__ inline float xhatOf(float x, float mean, float invStd) {
  return __fmul_rn(__fsub_rn(x, mean), invStd);
}

/// Partial column sums: for chunk c and column j, the double sums over rows
/// [c * rowsPerChunk, (c + 1) * rowsPerChunk) of dY * xhat (into partScale)
/// and of dY (into partBias); either output may be NULL.
__global__ void layerNormColumnPartials(const float *x, const float *meanIn,
                                        const float *invStdIn, const float *dy,
                                        double *partScale, double *partBias,
                                        int64_t outer, int64_t inner,
                                        int64_t chunks, int64_t rowsPerChunk) {
  const int64_t total = chunks * inner;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = e / inner, j = e - c * inner;
    const int64_t r0 = c * rowsPerChunk;
    const int64_t r1 = r0 + rowsPerChunk < outer ? r0 + rowsPerChunk : outer;
    double accScale = 0, accBias = 0;
#pragma unroll 8
    for (int64_t r = r0; r < r1; ++r) {
      const float g = dy[r * inner + j];
      if (partScale)
        accScale += double(g) *
                    double(xhatOf(x[r * inner + j], meanIn[r], invStdIn[r]));
      accBias += double(g);
    }
    if (partScale)
      partScale[e] = accScale;
    if (partBias)
      partBias[e] = accBias;
  }
}

/// dScale[j] / dBias[j] = the chunks' partial sums of column j: one warp
/// per column, lane l adding chunks l, l + 32, ... in order, then a fixed
/// shuffle tree (the chunks' partials are many: a thread per column adding
/// them one after the other waited on each load in turn).
__global__ void layerNormColumnFinish(const double *partScale,
                                      const double *partBias, float *dScale,
                                      float *dBias, int64_t inner,
                                      int64_t chunks) {
  const int lane = threadIdx.x & 31;
  for (int64_t j = firstWarpRow(); j < inner; j += warpRowStride()) {
    double accScale = 0, accBias = 0;
    for (int64_t c = lane; c < chunks; c += 32) {
      if (dScale)
        accScale += partScale[c * inner + j];
      if (dBias)
        accBias += partBias[c * inner + j];
    }
    accScale = warpSum(accScale);
    accBias = warpSum(accBias);
    if (lane == 0) {
      if (dScale)
        dScale[j] = float(accScale);
      if (dBias)
        dBias[j] = float(accBias);
    }
  }
}

__global__ void layerNormGradRows(const float *x, const float *scale,
                                  const float *meanIn, const float *invStdIn,
                                  const float *dy, float *dx, int64_t outer,
                                  int64_t inner) {
  __shared__ double red[32];
  const double count = double(inner);
  for (int64_t r = blockIdx.x; r < outer; r += gridDim.x) {
    const float *xr = x + r * inner;
    const float *dyr = dy + r * inner;
    float *dxr = dx + r * inner;
    const float mean = meanIn[r], invStd = invStdIn[r];
    double sumG = 0, sumGXhat = 0;
    for (int64_t j = threadIdx.x; j < inner; j += blockDim.x) {
      const float g = __fmul_rn(dyr[j], scale[j]);
      sumG += double(g);
      sumGXhat += double(g) * double(xhatOf(xr[j], mean, invStd));
    }
    sumG = blockReduce(sumG, SumOp(), 0.0, red);
    sumGXhat = blockReduce(sumGXhat, SumOp(), 0.0, red);
    const float meanG = float(sumG / count);
    const float meanGXhat = float(sumGXhat / count);
    for (int64_t j = threadIdx.x; j < inner; j += blockDim.x) {
      const float xhat = xhatOf(xr[j], mean, invStd);
      const float g = __fmul_rn(dyr[j], scale[j]);
      dxr[j] = __fmul_rn(
          invStd, __fsub_rn(__fsub_rn(g, meanG), __fmul_rn(xhat, meanGXhat)));
    }
  }
}

/// layerNormGradRows with one warp per row of inner <= 32 * N elements; the
/// row is read into registers before dX is written (dX may alias dY).
template <int N>
__global__ void layerNormGradRowsWarp(const float *x, const float *scale,
                                      const float *meanIn,
                                      const float *invStdIn, const float *dy,
                                      float *dx, int64_t outer, int inner) {
  const int lane = threadIdx.x & 31;
  const double count = double(inner);
  for (int64_t r = firstWarpRow(); r < outer; r += warpRowStride()) {
    const float *xr = x + r * inner;
    const float *dyr = dy + r * inner;
    float *dxr = dx + r * inner;
    const float mean = meanIn[r], invStd = invStdIn[r];
    float g[N], xhat[N];
    double sumG = 0, sumGXhat = 0;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int j = lane + 32 * i;
      g[i] = 0.0f;
      xhat[i] = 0.0f;
      if (j < inner) {
        g[i] = __fmul_rn(dyr[j], scale[j]);
        xhat[i] = xhatOf(xr[j], mean, invStd);
        sumG += double(g[i]);
        sumGXhat += double(g[i]) * double(xhat[i]);
      }
    }
    const float meanG = float(warpSum(sumG) / count);
    const float meanGXhat = float(warpSum(sumGXhat) / count);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int j = lane + 32 * i;
      if (j < inner)
        dxr[j] = __fmul_rn(invStd, __fsub_rn(__fsub_rn(g[i], meanG),
                                             __fmul_rn(xhat[i], meanGXhat)));
    }
  }
}

template <int N> struct LayerNormGradWarp {
  static void run(cudaStream_t stream, const float *x, const float *scale,
                  const float *meanIn, const float *invStdIn, const float *dy,
                  float *dx, int64_t outer, int inner) {
    layerNormGradRowsWarp<N>
        <<<warpRowGrid(outer), 32 * kWarpsPerBlock, 0, stream>>>(
            x, scale, meanIn, invStdIn, dy, dx, outer, inner);
  }
};

} // namespace
} // namespace cuda
} // namespace pipec

using namespace pipec::cuda;

extern "C" void pipec_cuda_k_layernorm(pipec_kctx *kc, void *const *bufs,
                                       const int64_t *ints,
                                       const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_layernorm");
  const float *x = static_cast<const float *>(bufs[0]);
  const float *scale = static_cast<const float *>(bufs[1]);
  const float *bias = static_cast<const float *>(bufs[2]);
  float *y = static_cast<float *>(bufs[3]);
  float *meanOut = static_cast<float *>(bufs[4]);
  float *invStdOut = static_cast<float *>(bufs[5]);
  const int64_t outer = ints[0], inner = ints[1];
  const double eps = reals ? reals[0] : kDefaultEpsilon;
  if (outer <= 0 || inner <= 0)
    return;
  if (inner <= kWarpRow)
    launchWarpRows<LayerNormWarp>(inner, ctx.stream, x, scale, bias, y, meanOut,
                                  invStdOut, outer, int(inner), eps);
  else
    layerNormRows<<<rowGrid(outer), rowBlock(inner), 0, ctx.stream>>>(
        x, scale, bias, y, meanOut, invStdOut, outer, inner, eps);
  checkLaunch("pipec_cuda_k_layernorm");
}

extern "C" void pipec_cuda_k_layernorm_grad(pipec_kctx *kc, void *const *bufs,
                                            const int64_t *ints,
                                            const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_layernorm_grad");
  const char *kName = "pipec_cuda_k_layernorm_grad";
  const float *x = static_cast<const float *>(bufs[0]);
  const float *scale = static_cast<const float *>(bufs[1]);
  const float *meanIn = static_cast<const float *>(bufs[2]);
  const float *invStdIn = static_cast<const float *>(bufs[3]);
  const float *dy = static_cast<const float *>(bufs[4]);
  float *dx = static_cast<float *>(bufs[5]);
  float *dScale = static_cast<float *>(bufs[6]);
  float *dBias = static_cast<float *>(bufs[7]);
  const int64_t inner = ints[1];
  const int64_t outer = std::max<int64_t>(ints[0], 0);
  if (inner <= 0)
    return;
  cudaStream_t stream = ctx.stream;

  // Column sums first: dX may alias dY.
  if (dScale || dBias) {
    int64_t rowsPerChunk = kRowsPerChunk;
    int64_t chunks = (outer + rowsPerChunk - 1) / rowsPerChunk;
    const int64_t maxChunks = std::max<int64_t>(1, kMaxPartials / inner);
    if (chunks > maxChunks) {
      chunks = maxChunks;
      rowsPerChunk = (outer + chunks - 1) / chunks;
    }
    chunks = std::max<int64_t>(chunks, 1);
    const int64_t partials = chunks * inner;
    double *part = static_cast<double *>(
        scratch(ctx, sizeof(double) * size_t(partials) * 2));
    double *partScale = dScale ? part : nullptr;
    double *partBias = dBias ? part + partials : nullptr;
    layerNormColumnPartials<<<gridFor(partials), 256, 0, stream>>>(
        x, meanIn, invStdIn, dy, partScale, partBias, outer, inner, chunks,
        rowsPerChunk);
    checkLaunch(kName);
    layerNormColumnFinish<<<warpRowGrid(inner), 32 * kWarpsPerBlock, 0,
                            stream>>>(partScale, partBias, dScale, dBias, inner,
                                      chunks);
    checkLaunch(kName);
  }
  if (dx && outer > 0) {
    if (inner <= kWarpRow)
      launchWarpRows<LayerNormGradWarp>(inner, stream, x, scale, meanIn,
                                        invStdIn, dy, dx, outer, int(inner));
    else
      layerNormGradRows<<<rowGrid(outer), rowBlock(inner), 0, stream>>>(
          x, scale, meanIn, invStdIn, dy, dx, outer, inner);
    checkLaunch(kName);
  }
}
