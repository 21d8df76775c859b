//===- reduce.cpp - Sum reduction (adjoint of broadcasting) ---------------===//
//
// Part of pipec. CPU kernel behind pipec_k_reduce_sum (see
// include/pipec_rt.h for the parameter layout).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Y = scale * sum over the reduced dimensions of X, where yStrides[i] gives
/// Y's element stride for X dimension i (0 along reduced dimensions). X is
/// walked once in memory order; each contiguous row either adds into a Y row
/// (the dimension is kept) or collapses into one Y element (it is reduced).
/// Y is zeroed first, so it is overwritten, never accumulated into.
///
/// The kernel is a template over the element type T (float, or double for
/// pipec_k_reduce_sum_f64). A reduced innermost row is summed in double;
/// rows added into a kept Y row accumulate in T.
///
/// [R, C] onto [C] (a bias gradient: every row of a contiguous X into one
/// Y row) adds the rows in chunks of kChunkRows: each chunk's rows into a
/// zeroed temporary row in order, then the chunk rows into Y in order. The
/// CUDA kernel adds in exactly this order with one thread per (chunk,
/// column), so both agree to the bit while the GPU's longest serial chain
/// is kChunkRows + R / kChunkRows additions instead of R.
///
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"

#include "cpu/real.h"
#include "cpu/strided.h"

#include <algorithm>
#include <vector>

using namespace pipec::rt;

namespace {

constexpr int64_t kChunkRows = 64;

/// Number of elements of Y implied by X's dims and Y's strides: one more
/// than the largest Y offset (Y is dense, so this is the product of its
/// dims; it is 0 when a kept dimension is empty).
int64_t impliedYCount(int64_t rank, const int64_t *xDims,
                      const int64_t *yStrides) {
  int64_t last = 0;
  for (int64_t i = 0; i < rank; ++i)
    if (yStrides[i] != 0)
      last += (xDims[i] - 1) * yStrides[i];
  return std::max<int64_t>(last + 1, 0);
}

/// Sum of a contiguous row, in double with independent lanes so that the
/// loop vectorises without reassociation flags.
template <class T> double sumRow(const T *x, int64_t n) {
  constexpr int kLanes = 8;
  double lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l)
      lanes[l] += x[i + l];
  double acc = 0;
  for (; i < n; ++i)
    acc += x[i];
  for (int l = 0; l < kLanes; ++l)
    acc += lanes[l];
  return acc;
}

template <class T>
void reduceSumKernel(void *const *bufs, const int64_t *ints,
                     const double *reals) {
  const T *x = static_cast<const T *>(bufs[0]);
  T *y = static_cast<T *>(bufs[1]);
  int64_t rank = ints[0];
  const int64_t *xDims = ints + 1;
  const int64_t *yStrides = ints + 1 + rank;
  const T scale = reals ? T(reals[0]) : T(1);

  int64_t yCount = impliedYCount(rank, xDims, yStrides);
  std::fill(y, y + yCount, T(0));

  int64_t xStrides[kMaxDims];
  if (rank > kMaxDims) {
    poison(y, yCount);
    return;
  }
  contiguousStrides(rank, xDims, xStrides);
  StridedNest<2> nest;
  const int64_t *const strides[2] = {xStrides, yStrides};
  NestKind kind = canonicalize(rank, xDims, strides, nest);
  if (kind == NestKind::Empty)
    return; // Empty X: Y stays all zeros.
  if (kind == NestKind::TooDeep) {
    poison(y, yCount);
    return;
  }

  if (nest.rank == 2 && nest.strides[0][0] == nest.dims[1] &&
      nest.strides[1][0] == 0 && nest.strides[1][1] == 1) {
    const int64_t rows = nest.dims[0], cols = nest.dims[1];
    std::vector<T> chunk(static_cast<size_t>(cols));
    for (int64_t r0 = 0; r0 < rows; r0 += kChunkRows) {
      std::fill(chunk.begin(), chunk.end(), T(0));
      for (int64_t r = r0; r < std::min(rows, r0 + kChunkRows); ++r) {
        const T *xRow = x + r * cols;
        for (int64_t i = 0; i < cols; ++i)
          chunk[size_t(i)] += xRow[i];
      }
      for (int64_t i = 0; i < cols; ++i)
        y[i] += chunk[size_t(i)];
    }
  } else {
    // The innermost X stride is 1 after canonicalisation.
    forEachRow(nest, [&](const int64_t *off, int64_t n, const int64_t *inner) {
      const T *xRow = x + off[0];
      T *yRow = y + off[1];
      int64_t ys = inner[1];
      if (ys == 1) {
        for (int64_t i = 0; i < n; ++i)
          yRow[i] += xRow[i];
      } else if (ys == 0) {
        yRow[0] += T(sumRow(xRow, n));
      } else {
        for (int64_t i = 0; i < n; ++i)
          yRow[i * ys] += xRow[i];
      }
    });
  }

  if (scale != T(1))
    for (int64_t i = 0; i < yCount; ++i)
      y[i] *= scale;
}

} // namespace

PIPEC_CPU_KERNEL(pipec_k_reduce_sum, reduceSumKernel)
