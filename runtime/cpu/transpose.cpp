//===- transpose.cpp - General transpose kernel ---------------------------===//
//
// Part of pipec. CPU kernel behind pipec_k_transpose (see
// include/pipec_rt.h for the parameter layout).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Y.dims[i] = X.dims[perm[i]] (ONNX semantics). Y is written in memory
/// order while X is read through permuted strides. After canonicalisation,
/// a permutation that keeps X's innermost dimension innermost copies whole
/// rows; otherwise the two dimensions that are innermost in X and in Y form
/// a 2-D transpose done in cache-sized tiles. The kernel is a template over
/// the element type (float, or double for pipec_k_transpose_f64).
///
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"

#include "cpu/real.h"
#include "cpu/strided.h"

#include <algorithm>
#include <cstring>

using namespace pipec::rt;

namespace {

/// Tile edge of the blocked 2-D transpose. Small tiles are robust against
/// the cache-set conflicts of power-of-two row strides (measured: 8 beats 32
/// by 2-5x on 512x1024 and 64x4096, and matches it elsewhere).
constexpr int64_t kTile = 8;

/// Y[i * ysI + j] = X[i + j * xsJ] for i < ni, j < nj, tile by tile.
template <class T>
void transpose2d(const T *x, T *y, int64_t ni, int64_t ysI, int64_t nj,
                 int64_t xsJ) {
  for (int64_t i0 = 0; i0 < ni; i0 += kTile) {
    int64_t i1 = std::min(ni, i0 + kTile);
    for (int64_t j0 = 0; j0 < nj; j0 += kTile) {
      int64_t j1 = std::min(nj, j0 + kTile);
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = j0; j < j1; ++j)
          y[i * ysI + j] = x[i + j * xsJ];
    }
  }
}

template <class T>
void transposeKernel(void *const *bufs, const int64_t *ints, const double *) {
  const T *x = static_cast<const T *>(bufs[0]);
  T *y = static_cast<T *>(bufs[1]);
  int64_t rank = ints[0];
  const int64_t *xDims = ints + 1;
  const int64_t *perm = ints + 1 + rank;

  int64_t numel = 1;
  for (int64_t i = 0; i < rank; ++i)
    numel *= std::max<int64_t>(xDims[i], 0);
  if (numel == 0)
    return;
  if (rank > kMaxDims) {
    poison(y, numel);
    return;
  }
  int64_t xStrides[kMaxDims] = {}, yDims[kMaxDims] = {},
          xStridesInY[kMaxDims] = {}, yStrides[kMaxDims] = {};
  bool seen[kMaxDims] = {};
  contiguousStrides(rank, xDims, xStrides);
  for (int64_t i = 0; i < rank; ++i) {
    int64_t p = perm[i];
    if (p < 0 || p >= rank || seen[p]) { // Not a permutation: refuse it.
      poison(y, numel);
      return;
    }
    seen[p] = true;
    yDims[i] = xDims[p];
    xStridesInY[i] = xStrides[p];
  }
  contiguousStrides(rank, yDims, yStrides);

  StridedNest<2> nest; // Operand 0: Y, operand 1: X.
  const int64_t *const strides[2] = {yStrides, xStridesInY};
  NestKind kind = canonicalize(rank, yDims, strides, nest);
  if (kind != NestKind::Ok) {
    poison(y, numel);
    return;
  }
  int r = nest.rank;
  if (r == 0 || nest.strides[1][r - 1] == 1) {
    // Row copies (identity permutation after canonicalisation included).
    forEachRow(nest, [&](const int64_t *off, int64_t n, const int64_t *) {
      std::memcpy(y + off[0], x + off[1], sizeof(T) * size_t(n));
    });
    return;
  }

  // Dimension p has X stride 1 (X's innermost non-unit dimension survives
  // canonicalisation with stride 1). Tile the (p, r-1) plane and loop over
  // the remaining dimensions, in order, outside it.
  int p = 0;
  while (p < r && nest.strides[1][p] != 1)
    ++p;
  if (p >= r - 1) { // Cannot happen for a valid permutation.
    poison(y, numel);
    return;
  }
  StridedNest<2> outer;
  outer.rank = 0;
  for (int d = 0; d < r - 1; ++d) {
    if (d == p)
      continue;
    outer.dims[outer.rank] = nest.dims[d];
    outer.strides[0][outer.rank] = nest.strides[0][d];
    outer.strides[1][outer.rank] = nest.strides[1][d];
    ++outer.rank;
  }
  int64_t ni = nest.dims[p], ysI = nest.strides[0][p];
  int64_t nj = nest.dims[r - 1], xsJ = nest.strides[1][r - 1];
  forEachIndex(outer, outer.rank, [&](const int64_t *off) {
    transpose2d(x + off[1], y + off[0], ni, ysI, nj, xsJ);
  });
}

} // namespace

PIPEC_CPU_KERNEL(pipec_k_transpose, transposeKernel)
