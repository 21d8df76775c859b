//===- softmax.cu - Softmax / log-softmax and their backward --------------===//
//
// Part of pipec's CUDA runtime. CUDA twins of pipec_k_softmax and
// pipec_k_softmax_grad (see include/pipec_rt.h for the parameter layouts and
// cpu/softmax.cpp for the reference).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The tensor is viewed as [outer, dim, inner] and normalised along `dim`;
/// each of the outer * inner "rows" (dim elements, `inner` apart) is
/// independent. Three launch shapes compute the same arithmetic:
///
///  - one warp per contiguous row (inner == 1) of up to 1024 elements (an
///    attention score row): the row is read once into registers (lane l
///    holds elements l, l + 32, ...), reduced by warp shuffles and written
///    once, so the kernel moves each byte once (the block shape below reads
///    the row three times);
///  - one thread block per row (deterministic block reductions) for longer
///    contiguous rows, and long rows (dim >= 64) too few to fill the GPU
///    one per thread;
///  - otherwise one thread per row, looping over dim: with inner > 1
///    adjacent threads read adjacent inner positions (coalesced).
///
/// The arithmetic follows the CPU kernel: the maximum and x - max in float,
/// exponentials in float, their sum in double; softmax multiplies each
/// exponential by float(1 / sum), log-softmax writes float(x - lse) with
/// lse = max + log(sum) in double. The CPU's polyExp is within 8.3e-8
/// relative of exp, so the device uses expf (no fast-math intrinsics).
/// Float products and sums are written with explicit round-to-nearest
/// intrinsics where the compiler could otherwise contract them into an
/// FMA (the CPU build has no FMA contraction).
///
/// Every output element is written by the thread that last reads the input
/// element at that index, after the row's reductions: Y may alias X and dX
/// may alias dY.
///
//===----------------------------------------------------------------------===//

#include "block_reduce.cuh"
#include "cuda_rt.h"
#include "pipec_rt.h"

#include <cstdint>

namespace pipec {
namespace cuda {
namespace {

/// Rows of at least kLongRow elements take one block each when contiguous
/// or fewer than kFewRows.
constexpr int64_t kFewRows = 2048;
constexpr int64_t kLongRow = 64;

/// First element of row r (o = r / inner, j = r % inner) of an
/// [outer, dim, inner] tensor.
__device__ inline int64_t rowBase(int64_t r, int64_t dim, int64_t inner) {
  const int64_t o = r / inner;
  return o * dim * inner + (r - o * inner);
}

/// One warp per contiguous row of dim <= 32 * N elements.
template <int N>
__global__ void softmaxRowsWarp(const float *x, float *y, int64_t rows, int dim,
                                bool isLog) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = firstWarpRow(); r < rows; r += warpRowStride()) {
    const float *xr = x + r * dim;
    float *yr = y + r * dim;
    float v[N];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int d = lane + 32 * i;
      v[i] = d < dim ? xr[d] : -INFINITY;
      mx = fmaxf(mx, v[i]);
    }
    mx = warpMax(mx);
    double sum = 0;
    float e[N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      e[i] = expf(__fsub_rn(v[i], mx));
      if (lane + 32 * i < dim)
        sum += double(e[i]);
    }
    sum = warpSum(sum);
    if (isLog) {
      const double lse = double(mx) + log(sum);
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (lane + 32 * i < dim)
          yr[lane + 32 * i] = float(double(v[i]) - lse);
    } else {
      const float inv = float(1.0 / sum);
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (lane + 32 * i < dim)
          yr[lane + 32 * i] = __fmul_rn(e[i], inv);
    }
  }
}

__global__ void softmaxRowsBlock(const float *x, float *y, int64_t rows,
                                 int64_t dim, int64_t inner, bool isLog) {
  __shared__ float redF[32];
  __shared__ double redD[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = rowBase(r, dim, inner);
    const float *xr = x + base;
    float *yr = y + base;
    float mx = -INFINITY;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x)
      mx = fmaxf(mx, xr[d * inner]);
    mx = blockReduce(mx, MaxOp(), -INFINITY, redF);
    double sum = 0;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x)
      sum += double(expf(__fsub_rn(xr[d * inner], mx)));
    sum = blockReduce(sum, SumOp(), 0.0, redD);
    if (isLog) {
      const double lse = double(mx) + log(sum);
      for (int64_t d = threadIdx.x; d < dim; d += blockDim.x)
        yr[d * inner] = float(double(xr[d * inner]) - lse);
    } else {
      const float inv = float(1.0 / sum);
      for (int64_t d = threadIdx.x; d < dim; d += blockDim.x)
        yr[d * inner] = __fmul_rn(expf(__fsub_rn(xr[d * inner], mx)), inv);
    }
  }
}

__global__ void softmaxRowsThread(const float *x, float *y, int64_t rows,
                                  int64_t dim, int64_t inner, bool isLog) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = rowBase(r, dim, inner);
    const float *xr = x + base;
    float *yr = y + base;
    float mx = xr[0];
    for (int64_t d = 1; d < dim; ++d)
      mx = fmaxf(mx, xr[d * inner]);
    double sum = 0;
    for (int64_t d = 0; d < dim; ++d)
      sum += double(expf(__fsub_rn(xr[d * inner], mx)));
    if (isLog) {
      const double lse = double(mx) + log(sum);
      for (int64_t d = 0; d < dim; ++d)
        yr[d * inner] = float(double(xr[d * inner]) - lse);
    } else {
      const float inv = float(1.0 / sum);
      for (int64_t d = 0; d < dim; ++d)
        yr[d * inner] = __fmul_rn(expf(__fsub_rn(xr[d * inner], mx)), inv);
    }
  }
}

/// dX of one row from s = float(sum): log-softmax dY - exp(Y) s, softmax
/// Y (dY - s).
__device__ inline float gradElem(float y, float dy, float s, bool isLog) {
  return isLog ? __fsub_rn(dy, __fmul_rn(expf(y), s))
               : __fmul_rn(y, __fsub_rn(dy, s));
}

/// One warp per contiguous row of dim <= 32 * N elements.
template <int N>
__global__ void softmaxGradRowsWarp(const float *y, const float *dy, float *dx,
                                    int64_t rows, int dim, bool isLog) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = firstWarpRow(); r < rows; r += warpRowStride()) {
    const int64_t base = r * dim;
    float yv[N], gv[N];
    double acc = 0;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int d = lane + 32 * i;
      yv[i] = d < dim ? y[base + d] : 0.0f;
      gv[i] = d < dim ? dy[base + d] : 0.0f;
      acc += isLog ? double(gv[i]) : double(gv[i]) * double(yv[i]);
    }
    const float s = float(warpSum(acc));
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (lane + 32 * i < dim)
        dx[base + lane + 32 * i] = gradElem(yv[i], gv[i], s, isLog);
  }
}

template <int N> struct SoftmaxWarp {
  static void run(cudaStream_t stream, const float *x, float *y, int64_t rows,
                  int dim, bool isLog) {
    softmaxRowsWarp<N><<<warpRowGrid(rows), 32 * kWarpsPerBlock, 0, stream>>>(
        x, y, rows, dim, isLog);
  }
};

template <int N> struct SoftmaxGradWarp {
  static void run(cudaStream_t stream, const float *y, const float *dy,
                  float *dx, int64_t rows, int dim, bool isLog) {
    softmaxGradRowsWarp<N>
        <<<warpRowGrid(rows), 32 * kWarpsPerBlock, 0, stream>>>(y, dy, dx, rows,
                                                                dim, isLog);
  }
};

__global__ void softmaxGradRowsBlock(const float *y, const float *dy, float *dx,
                                     int64_t rows, int64_t dim, int64_t inner,
                                     bool isLog) {
  __shared__ double redD[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = rowBase(r, dim, inner);
    double acc = 0;
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      const int64_t k = base + d * inner;
      acc += isLog ? double(dy[k]) : double(dy[k]) * double(y[k]);
    }
    const float s = float(blockReduce(acc, SumOp(), 0.0, redD));
    for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
      const int64_t k = base + d * inner;
      dx[k] = gradElem(y[k], dy[k], s, isLog);
    }
  }
}

__global__ void softmaxGradRowsThread(const float *y, const float *dy,
                                      float *dx, int64_t rows, int64_t dim,
                                      int64_t inner, bool isLog) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = rowBase(r, dim, inner);
    double acc = 0;
    for (int64_t d = 0; d < dim; ++d) {
      const int64_t k = base + d * inner;
      acc += isLog ? double(dy[k]) : double(dy[k]) * double(y[k]);
    }
    const float s = float(acc);
    for (int64_t d = 0; d < dim; ++d) {
      const int64_t k = base + d * inner;
      dx[k] = gradElem(y[k], dy[k], s, isLog);
    }
  }
}

/// Decoded [outer, dim, inner, isLog].
struct Shape {
  int64_t outer, dim, inner;
  bool isLog;
  explicit Shape(const int64_t *ints)
      : outer(ints[0]), dim(ints[1]), inner(ints[2]), isLog(ints[3] != 0) {}
  bool empty() const { return outer <= 0 || dim <= 0 || inner <= 0; }
  int64_t rows() const { return outer * inner; }
  /// Whether one warp per row is the better launch shape.
  bool warpPerRow() const { return inner == 1 && dim <= kWarpRow; }
  /// Whether one block per row is the better launch shape.
  bool blockPerRow() const {
    return dim >= kLongRow && (inner == 1 || rows() < kFewRows);
  }
};

} // namespace
} // namespace cuda
} // namespace pipec

using namespace pipec::cuda;

extern "C" void pipec_cuda_k_softmax(pipec_kctx *kc, void *const *bufs,
                                     const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_softmax");
  const float *x = static_cast<const float *>(bufs[0]);
  float *y = static_cast<float *>(bufs[1]);
  const Shape s(ints);
  if (s.empty())
    return;
  cudaStream_t stream = ctx.stream;
  if (s.warpPerRow())
    launchWarpRows<SoftmaxWarp>(s.dim, stream, x, y, s.rows(), int(s.dim),
                                s.isLog);
  else if (s.blockPerRow())
    softmaxRowsBlock<<<rowGrid(s.rows()), rowBlock(s.dim), 0, stream>>>(
        x, y, s.rows(), s.dim, s.inner, s.isLog);
  else
    softmaxRowsThread<<<gridFor(s.rows()), 256, 0, stream>>>(
        x, y, s.rows(), s.dim, s.inner, s.isLog);
  checkLaunch("pipec_cuda_k_softmax");
}

extern "C" void pipec_cuda_k_softmax_grad(pipec_kctx *kc, void *const *bufs,
                                          const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_softmax_grad");
  const float *y = static_cast<const float *>(bufs[0]);
  const float *dy = static_cast<const float *>(bufs[1]);
  float *dx = static_cast<float *>(bufs[2]);
  const Shape s(ints);
  if (s.empty())
    return;
  cudaStream_t stream = ctx.stream;
  if (s.warpPerRow())
    launchWarpRows<SoftmaxGradWarp>(s.dim, stream, y, dy, dx, s.rows(),
                                    int(s.dim), s.isLog);
  else if (s.blockPerRow())
    softmaxGradRowsBlock<<<rowGrid(s.rows()), rowBlock(s.dim), 0, stream>>>(
        y, dy, dx, s.rows(), s.dim, s.inner, s.isLog);
  else
    softmaxGradRowsThread<<<gridFor(s.rows()), 256, 0, stream>>>(
        y, dy, dx, s.rows(), s.dim, s.inner, s.isLog);
  checkLaunch("pipec_cuda_k_softmax_grad");
}
