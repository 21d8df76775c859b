//===- movement.cpp - Broadcast, strided copy and gather ------------------===//
//
// Part of pipec. CPU kernels behind pipec_k_broadcast, pipec_k_strided_copy,
// pipec_k_gather and pipec_k_gather_grad (see include/pipec_rt.h for the
// parameter layouts).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Pure data movement. Broadcast and strided copy canonicalise their loop
/// nest (cpu/strided.h) and copy row by row, with memcpy / fill fast paths
/// for contiguous and repeated rows. Negative strides are fine: merging two
/// dimensions only needs stride(outer) == stride(inner) * extent(inner),
/// which holds for reversed views too.
///
/// Gather treats an index i in [-axisDim, 0) as i + axisDim; any other
/// out-of-range index gives zeros in the forward and is skipped by the
/// backward (the kernels cannot report errors across the C ABI, and must
/// not read or write out of bounds).
///
/// Aliasing: broadcast and strided copy need src and dst not to overlap
/// (except an exact in-place copy, which is a no-op for plain copies);
/// gather_grad's dData must not alias dY.
///
/// Every kernel is a template over the element type (float, or double for
/// the `_f64` twins, see cpu/real.h); indices stay int64.
///
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"

#include "cpu/real.h"
#include "cpu/strided.h"

#include <algorithm>
#include <cstring>

using namespace pipec::rt;

namespace {

//===----------------------------------------------------------------------===//
// Broadcast
//===----------------------------------------------------------------------===//

template <class T>
void broadcastKernel(void *const *bufs, const int64_t *ints, const double *) {
  const T *x = static_cast<const T *>(bufs[0]);
  T *y = static_cast<T *>(bufs[1]);
  int64_t rank = ints[0];
  const int64_t *yDims = ints + 1;
  const int64_t *xStrides = ints + 1 + rank;
  int64_t numel = 1;
  for (int64_t i = 0; i < rank; ++i)
    numel *= std::max<int64_t>(yDims[i], 0);
  if (numel == 0)
    return;
  if (rank > kMaxDims) {
    poison(y, numel);
    return;
  }
  int64_t yStrides[kMaxDims];
  contiguousStrides(rank, yDims, yStrides);
  StridedNest<2> nest;
  const int64_t *const strides[2] = {xStrides, yStrides};
  NestKind kind = canonicalize(rank, yDims, strides, nest);
  if (kind == NestKind::TooDeep) {
    poison(y, numel);
    return;
  }
  // Y's innermost stride is 1 after canonicalisation.
  forEachRow(nest, [&](const int64_t *off, int64_t n, const int64_t *inner) {
    const T *xRow = x + off[0];
    T *yRow = y + off[1];
    int64_t xs = inner[0];
    if (xs == 1)
      std::memcpy(yRow, xRow, sizeof(T) * size_t(n));
    else if (xs == 0)
      std::fill(yRow, yRow + n, xRow[0]);
    else
      for (int64_t i = 0; i < n; ++i)
        yRow[i] = xRow[i * xs];
  });
}

//===----------------------------------------------------------------------===//
// Strided copy
//===----------------------------------------------------------------------===//

template <class T>
void stridedCopyKernel(void *const *bufs, const int64_t *ints, const double *) {
  const T *src = static_cast<const T *>(bufs[0]);
  T *dst = static_cast<T *>(bufs[1]);
  int64_t rank = ints[0];
  const int64_t *dims = ints + 1;
  const int64_t *srcStrides = ints + 1 + rank;
  int64_t srcOffset = ints[1 + 2 * rank];
  const int64_t *dstStrides = ints + 2 + 2 * rank;
  int64_t dstOffset = ints[2 + 3 * rank];
  bool accumulate = ints[3 + 3 * rank] != 0;
  // More than kMaxDims non-unit dimensions cannot address real memory, and
  // there is no well-defined "output" to poison: nothing is written.
  if (rank > kMaxDims)
    return;
  StridedNest<2> nest;
  const int64_t *const strides[2] = {srcStrides, dstStrides};
  if (canonicalize(rank, dims, strides, nest) != NestKind::Ok)
    return;
  src += srcOffset;
  dst += dstOffset;
  forEachRow(nest, [&](const int64_t *off, int64_t n, const int64_t *inner) {
    const T *s = src + off[0];
    T *d = dst + off[1];
    int64_t ss = inner[0], ds = inner[1];
    if (accumulate) {
      if (ss == 1 && ds == 1)
        for (int64_t i = 0; i < n; ++i)
          d[i] += s[i];
      else
        for (int64_t i = 0; i < n; ++i)
          d[i * ds] += s[i * ss];
      return;
    }
    if (ss == 1 && ds == 1) {
      if (s != d)
        std::memmove(d, s, sizeof(T) * size_t(n));
    } else if (ss == 0) {
      const T v = s[0];
      for (int64_t i = 0; i < n; ++i)
        d[i * ds] = v;
    } else {
      for (int64_t i = 0; i < n; ++i)
        d[i * ds] = s[i * ss];
    }
  });
}

//===----------------------------------------------------------------------===//
// Gather
//===----------------------------------------------------------------------===//

/// The row of the axis selected by `index`, or -1 when out of range.
inline int64_t wrapIndex(int64_t index, int64_t axisDim) {
  if (index < 0)
    index += axisDim;
  return (index >= 0 && index < axisDim) ? index : -1;
}

template <class T>
void gatherKernel(void *const *bufs, const int64_t *ints, const double *) {
  const T *data = static_cast<const T *>(bufs[0]);
  const int64_t *indices = static_cast<const int64_t *>(bufs[1]);
  T *y = static_cast<T *>(bufs[2]);
  int64_t outer = ints[0], axisDim = ints[1], inner = ints[2],
          nIndices = ints[3];
  if (outer <= 0 || inner <= 0 || nIndices <= 0)
    return;
  const size_t rowBytes = sizeof(T) * size_t(inner);
  for (int64_t o = 0; o < outer; ++o) {
    const T *slab = data + o * axisDim * inner;
    T *yRow = y + o * nIndices * inner;
    for (int64_t i = 0; i < nIndices; ++i, yRow += inner) {
      int64_t row = wrapIndex(indices[i], axisDim);
      if (row < 0)
        std::fill(yRow, yRow + inner, T(0));
      else
        std::memcpy(yRow, slab + row * inner, rowBytes);
    }
  }
}

template <class T>
void gatherGradKernel(void *const *bufs, const int64_t *ints, const double *) {
  const T *dy = static_cast<const T *>(bufs[0]);
  const int64_t *indices = static_cast<const int64_t *>(bufs[1]);
  T *dData = static_cast<T *>(bufs[2]);
  int64_t outer = ints[0], axisDim = ints[1], inner = ints[2],
          nIndices = ints[3];
  if (outer <= 0 || axisDim <= 0 || inner <= 0)
    return;
  std::fill(dData, dData + outer * axisDim * inner, T(0));
  if (nIndices <= 0)
    return;
  for (int64_t o = 0; o < outer; ++o) {
    T *slab = dData + o * axisDim * inner;
    const T *dyRow = dy + o * nIndices * inner;
    for (int64_t i = 0; i < nIndices; ++i, dyRow += inner) {
      int64_t row = wrapIndex(indices[i], axisDim);
      if (row < 0)
        continue;
      T *d = slab + row * inner;
      for (int64_t j = 0; j < inner; ++j)
        d[j] += dyRow[j];
    }
  }
}

} // namespace

PIPEC_CPU_KERNEL(pipec_k_broadcast, broadcastKernel)
PIPEC_CPU_KERNEL(pipec_k_strided_copy, stridedCopyKernel)
PIPEC_CPU_KERNEL(pipec_k_gather, gatherKernel)
PIPEC_CPU_KERNEL(pipec_k_gather_grad, gatherGradKernel)
