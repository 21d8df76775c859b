//===- block_reduce.cuh - Deterministic block reductions -------*- CUDA -*-===//
//
// Part of pipec's CUDA runtime (runtime/cuda). Shared by the row-wise kernels
// (softmax.cu, norm.cu, loss.cu); not part of the C ABI.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A row of a softmax, a layer norm or a loss is reduced by one thread block:
/// every thread folds a strided subset of the row in a fixed order, then the
/// block combines the partial values by a fixed tree (warp shuffles, then
/// one warp over the per-warp results). No atomics, so the result depends
/// only on the block size, never on scheduling: the kernels are
/// deterministic run to run.
///
/// Block sizes must be multiples of 32 (rowBlock returns one).
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CUDA_BLOCK_REDUCE_CUH
#define PIPEC_RUNTIME_CUDA_BLOCK_REDUCE_CUH

#include <cstdint>

namespace pipec {
namespace cuda {

struct SumOp {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};

/// max that ignores a NaN operand (the callers' results are NaN anyway when
/// a NaN is present: its exponential enters the sum).
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/// Combines `v` over the whole block with `op` (identity `identity`) and
/// returns the result in every thread. `shared` holds at least 32 values.
/// Every thread of the block must call it (it synchronises).
template <class T, class Op>
__device__ T blockReduce(T v, Op op, T identity, T *shared) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1)
    v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  __syncthreads(); // `shared` may still be read from a previous call
  if (lane == 0)
    shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const unsigned warps = (blockDim.x + 31u) >> 5;
    v = lane < warps ? shared[lane] : identity;
    for (int o = 16; o > 0; o >>= 1)
      v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    if (lane == 0)
      shared[0] = v;
  }
  __syncthreads();
  return shared[0];
}

/// Threads per block for a row of `n` elements: a power of two from 32 to
/// `maxThreads`, no larger than the row needs.
inline int rowBlock(int64_t n, int maxThreads = 512) {
  int threads = 32;
  while (threads < maxThreads && threads < n)
    threads *= 2;
  return threads;
}

/// Blocks for `rows` rows processed one row per block with a grid-stride
/// loop (capped like gridFor).
inline unsigned rowGrid(int64_t rows) {
  const int64_t cap = 65535LL * 8;
  return unsigned(rows < 1 ? 1 : rows > cap ? cap : rows);
}

/// Rows of at most kWarpRow contiguous elements may take one warp each
/// (softmax.cu, norm.cu): lane l holds elements l, l + 32, ... in
/// registers, and the row is reduced by warp shuffles in a fixed tree.
constexpr int64_t kWarpRow = 1024;
constexpr int kWarpsPerBlock = 4;

template <class T> __device__ inline T warpSum(T v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline float warpMax(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// One warp per row, grid-stride: this warp's first row, and the distance
/// to its next one.
__device__ inline int64_t firstWarpRow() {
  return int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
}
__device__ inline int64_t warpRowStride() {
  return int64_t(gridDim.x) * (blockDim.x >> 5);
}

/// Launches Launch<N>::run(args...) for the smallest N (a power of two)
/// with 32 N >= dim (dim <= kWarpRow).
template <template <int> class Launch, class... Args>
void launchWarpRows(int64_t dim, Args... args) {
  if (dim <= 32)
    Launch<1>::run(args...);
  else if (dim <= 64)
    Launch<2>::run(args...);
  else if (dim <= 128)
    Launch<4>::run(args...);
  else if (dim <= 256)
    Launch<8>::run(args...);
  else if (dim <= 512)
    Launch<16>::run(args...);
  else
    Launch<32>::run(args...);
}

/// Blocks of kWarpsPerBlock warps for `rows` rows at one warp per row
/// (grid-stride beyond the cap).
inline unsigned warpRowGrid(int64_t rows) {
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int64_t cap = 65535LL * 8;
  return unsigned(blocks < 1 ? 1 : blocks > cap ? cap : blocks);
}

} // namespace cuda
} // namespace pipec

#endif // PIPEC_RUNTIME_CUDA_BLOCK_REDUCE_CUH
