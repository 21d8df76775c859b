//===- strided.h - Strided loop nests for the CPU kernels -------*- C++ -*-===//
//
// Part of pipec. Shared by the CPU kernels only (not part of the C ABI).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Several kernels (binary broadcasting, reduce_sum, transpose) walk a dense
/// row-major index space while reading or writing a few operands through
/// arbitrary element strides. This header canonicalises such a loop nest
/// (dropping unit dimensions and merging dimensions that are contiguous for
/// every operand) and iterates it row by row, so that the kernels only write
/// a tight innermost loop. Nothing here allocates: loop nests live on the
/// stack with a fixed dimension capacity.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CPU_STRIDED_H
#define PIPEC_RUNTIME_CPU_STRIDED_H

#include <cstdint>
#include <limits>

namespace pipec {
namespace rt {

/// Capacity of a canonical loop nest. Every kept dimension has extent >= 2,
/// so a nest that needs more than this would address more than 2^64
/// elements; the limit is unreachable for real tensors.
constexpr int kMaxDims = 64;

/// A canonical loop nest over `NumOps` strided operands.
template <int NumOps> struct StridedNest {
  int rank = 0;
  int64_t dims[kMaxDims];
  int64_t strides[NumOps][kMaxDims];
};

/// Outcome of canonicalising a loop nest.
enum class NestKind {
  Empty,   ///< Some extent is <= 0: there is nothing to iterate.
  Ok,      ///< `nest` holds the canonical nest (rank 0 means one element).
  TooDeep, ///< More than kMaxDims dimensions survived (cannot happen for
           ///< addressable tensors); callers treat it as an error.
};

/// Builds the canonical form of the loop nest `dims[rank]` where operand `op`
/// is addressed with `strides[op][rank]`. Unit dimensions are dropped and a
/// dimension is merged into its outer neighbour when, for every operand,
/// stride(outer) == stride(inner) * extent(inner); the iteration order (row
/// major over `dims`) is preserved.
template <int NumOps>
NestKind canonicalize(int64_t rank, const int64_t *dims,
                      const int64_t *const (&strides)[NumOps],
                      StridedNest<NumOps> &nest) {
  nest.rank = 0;
  for (int64_t i = 0; i < rank; ++i)
    if (dims[i] <= 0)
      return NestKind::Empty;
  for (int64_t i = 0; i < rank; ++i) {
    int64_t extent = dims[i];
    if (extent == 1)
      continue;
    if (nest.rank > 0) {
      int last = nest.rank - 1;
      bool mergeable = true;
      for (int op = 0; op < NumOps; ++op)
        mergeable &= nest.strides[op][last] == strides[op][i] * extent;
      if (mergeable) {
        nest.dims[last] *= extent;
        for (int op = 0; op < NumOps; ++op)
          nest.strides[op][last] = strides[op][i];
        continue;
      }
    }
    if (nest.rank == kMaxDims)
      return NestKind::TooDeep;
    nest.dims[nest.rank] = extent;
    for (int op = 0; op < NumOps; ++op)
      nest.strides[op][nest.rank] = strides[op][i];
    ++nest.rank;
  }
  return NestKind::Ok;
}

/// Calls `fn(offsets)` for every index of the nest made of the first `rank`
/// dimensions of `nest`, in row-major order; `offsets[op]` is the element
/// offset of operand `op`. A rank of 0 calls `fn` once with zero offsets.
template <int NumOps, typename Fn>
void forEachIndex(const StridedNest<NumOps> &nest, int rank, Fn &&fn) {
  int64_t offsets[NumOps] = {};
  int64_t index[kMaxDims] = {};
  while (true) {
    fn(static_cast<const int64_t *>(offsets));
    int d = rank - 1;
    for (; d >= 0; --d) {
      ++index[d];
      for (int op = 0; op < NumOps; ++op)
        offsets[op] += nest.strides[op][d];
      if (index[d] < nest.dims[d])
        break;
      for (int op = 0; op < NumOps; ++op)
        offsets[op] -= nest.strides[op][d] * nest.dims[d];
      index[d] = 0;
    }
    if (d < 0)
      return;
  }
}

/// Calls `fn(offsets, n, innerStrides)` once per row of the innermost
/// dimension of `nest` (n elements, operand `op` advancing by
/// innerStrides[op]). A rank-0 nest is one row of one element.
template <int NumOps, typename Fn>
void forEachRow(const StridedNest<NumOps> &nest, Fn &&fn) {
  if (nest.rank == 0) {
    const int64_t zeros[NumOps] = {};
    fn(zeros, int64_t(1), zeros);
    return;
  }
  int inner = nest.rank - 1;
  int64_t innerStrides[NumOps];
  for (int op = 0; op < NumOps; ++op)
    innerStrides[op] = nest.strides[op][inner];
  int64_t n = nest.dims[inner];
  forEachIndex(nest, inner, [&](const int64_t *offsets) {
    fn(offsets, n, static_cast<const int64_t *>(innerStrides));
  });
}

/// Writes the row-major (contiguous) strides of `dims[rank]` into `strides`.
inline void contiguousStrides(int64_t rank, const int64_t *dims,
                              int64_t *strides) {
  int64_t s = 1;
  for (int64_t i = rank - 1; i >= 0; --i) {
    strides[i] = s;
    s *= dims[i];
  }
}

/// Fills `n` elements with a quiet NaN. Kernels cannot report errors across the
/// C ABI; on a malformed parameter block (unknown opcode, impossible shape)
/// they poison their output instead, so that the runtime's per-step
/// finite-loss check stops the run instead of training on garbage.
template <class T> void poison(T *y, int64_t n) {
  const T nan = std::numeric_limits<T>::quiet_NaN();
  for (int64_t i = 0; i < n; ++i)
    y[i] = nan;
}

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CPU_STRIDED_H
