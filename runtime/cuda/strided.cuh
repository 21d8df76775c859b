//===- strided.cuh - Strided index spaces of CUDA kernels -----*- CUDA -*-===//
//
// Part of pipec's CUDA runtime (runtime/cuda). Shared by elementwise.cu and
// movement.cu; not part of the C ABI.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The broadcasting and data-movement kernels walk a dense row-major index
/// space whose operands are addressed through arbitrary element strides.
/// The host canonicalises that space the way the CPU kernels do
/// (cpu/strided.h): unit dimensions are dropped and a dimension is merged
/// into its outer neighbour when every operand allows it, so most calls end
/// up with one or two dimensions. The nest travels to the kernel by value;
/// a thread turns its linear index into operand offsets with one division
/// per dimension but the outermost.
///
/// Index arithmetic is 32-bit when the index space has fewer than 2^31
/// elements (the usual case: 64-bit division is several times slower), and
/// 64-bit otherwise. Offsets are always 64-bit (strides may be negative).
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CUDA_STRIDED_CUH
#define PIPEC_RUNTIME_CUDA_STRIDED_CUH

#include "cuda_rt.h"

#include <cstdint>
#include <initializer_list>
#include <string>

namespace pipec {
namespace cuda {

/// A canonical loop nest of at most kMaxRank dimensions over `N` strided
/// operands. Every dimension has extent >= 2; rank 0 is one element.
template <int N> struct Nest {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[N][kMaxRank] = {};
};

/// Fails with "<kernel>: rank N above 8" unless 0 <= rank <= kMaxRank.
inline void checkRank(int64_t rank, const char *kernel) {
  if (rank > kMaxRank)
    fail((std::string(kernel) + ": rank " + std::to_string(rank) + " above " +
          std::to_string(kMaxRank))
             .c_str());
  if (rank < 0)
    fail((std::string(kernel) + ": negative rank " + std::to_string(rank))
             .c_str());
}

/// Canonical form of the row-major index space `dims[rank]` (rank <=
/// kMaxRank) whose operand `op` is addressed with `strides[op][rank]`.
/// An implicit contiguous output (always mergeable) may be left out.
/// Returns false when some extent is <= 0 (nothing to iterate).
template <int N>
bool buildNest(int64_t rank, const int64_t *dims,
               const int64_t *const (&strides)[N], Nest<N> &nest) {
  nest = Nest<N>();
  for (int64_t i = 0; i < rank; ++i)
    if (dims[i] <= 0)
      return false;
  for (int64_t i = 0; i < rank; ++i) {
    const int64_t extent = dims[i];
    if (extent == 1)
      continue;
    if (nest.rank > 0) {
      const int last = nest.rank - 1;
      bool mergeable = true;
      for (int op = 0; op < N; ++op)
        mergeable &= nest.strides[op][last] == strides[op][i] * extent;
      if (mergeable) {
        nest.dims[last] *= extent;
        for (int op = 0; op < N; ++op)
          nest.strides[op][last] = strides[op][i];
        continue;
      }
    }
    nest.dims[nest.rank] = extent;
    for (int op = 0; op < N; ++op)
      nest.strides[op][nest.rank] = strides[op][i];
    ++nest.rank;
  }
  return true;
}

/// Number of indices of a nest.
template <int N> int64_t numelOf(const Nest<N> &nest) {
  int64_t n = 1;
  for (int d = 0; d < nest.rank; ++d)
    n *= nest.dims[d];
  return n;
}

/// Whether 32-bit index arithmetic covers `n` indices (and the grid-stride
/// step past the last one).
inline bool fits32(int64_t n) { return n <= (int64_t(1) << 31); }

/// Offsets of operand 0..N-1 for the row-major linear index `i` of `nest`.
/// I is the index type (uint32_t or uint64_t).
template <typename I, int N>
__device__ __forceinline__ void nestOffsets(const Nest<N> &nest, I i,
                                            int64_t (&off)[N]) {
#pragma unroll
  for (int op = 0; op < N; ++op)
    off[op] = 0;
#pragma unroll
  for (int d = kMaxRank - 1; d >= 1; --d) {
    if (d < nest.rank) {
      const I extent = I(nest.dims[d]);
      const I q = i / extent;
      const int64_t idx = int64_t(i - q * extent);
      i = q;
#pragma unroll
      for (int op = 0; op < N; ++op)
        off[op] += idx * nest.strides[op][d];
    }
  }
  if (nest.rank > 0) {
#pragma unroll
    for (int op = 0; op < N; ++op)
      off[op] += int64_t(i) * nest.strides[op][0];
  }
}

/// Steps the multi-index `idx` of `nest` to the next index in row-major
/// order, keeping the operand offsets `off` in step (an odometer: no
/// division). After the last index it wraps around to all zeros.
template <int N>
__device__ __forceinline__ void
nestAdvance(const Nest<N> &nest, int64_t (&idx)[kMaxRank], int64_t (&off)[N]) {
  bool carry = true;
#pragma unroll
  for (int d = kMaxRank - 1; d >= 0; --d) {
    if (carry && d < nest.rank) {
#pragma unroll
      for (int op = 0; op < N; ++op)
        off[op] += nest.strides[op][d];
      if (++idx[d] < nest.dims[d]) {
        carry = false;
      } else {
        idx[d] = 0;
#pragma unroll
        for (int op = 0; op < N; ++op)
          off[op] -= nest.strides[op][d] * nest.dims[d];
      }
    }
  }
}

/// Whether `nest` can be walked four floats at a time (float4): its
/// innermost dimension has unit stride for every operand and an extent
/// that is a multiple of 4, every other stride is a multiple of 4, and
/// every pointer in `ptrs` is 16-byte aligned. Each index then covers four
/// consecutive floats: the same values with a quarter of the index
/// arithmetic and 16-byte accesses (the copies of attention's heads and of
/// its q/k/v split ran at about a quarter of an H200's memory bandwidth
/// one float at a time).
template <int N>
bool inFours(const Nest<N> &nest, std::initializer_list<const void *> ptrs) {
  if (nest.rank == 0 || nest.dims[nest.rank - 1] % 4 != 0)
    return false;
  const int last = nest.rank - 1;
  for (int op = 0; op < N; ++op) {
    if (nest.strides[op][last] != 1)
      return false;
    for (int d = 0; d < last; ++d)
      if (nest.strides[op][d] % 4 != 0)
        return false;
  }
  for (const void *p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      return false;
  return true;
}

/// `nest` in units of four floats (inFours holds): the innermost extent and
/// every other stride divided by 4.
template <int N> Nest<N> inUnitsOfFour(Nest<N> nest) {
  const int last = nest.rank - 1;
  nest.dims[last] /= 4;
  for (int op = 0; op < N; ++op)
    for (int d = 0; d < last; ++d)
      nest.strides[op][d] /= 4;
  return nest;
}

/// First index and step of a grid-stride loop.
__device__ __forceinline__ int64_t gridStart() {
  return int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t gridStep() {
  return int64_t(gridDim.x) * blockDim.x;
}

/// Y[i] = v for i < n (a poisoned or constant output).
template <class T>
__global__ void fillValue(T *__restrict__ y, int64_t n, T v) {
  for (int64_t i = gridStart(); i < n; i += gridStep())
    y[i] = v;
}

/// Launches fillValue on the context's stream.
template <class T>
void launchFill(Context &ctx, T *y, int64_t n, T v, const char *kernel) {
  if (n <= 0)
    return;
  fillValue<T><<<gridFor(n), 256, 0, ctx.stream>>>(y, n, v);
  checkLaunch(kernel);
}

} // namespace cuda
} // namespace pipec

#endif // PIPEC_RUNTIME_CUDA_STRIDED_CUH
