//===- select.cpp - Comparison, selection and cast kernels ----------------===//
//
// Part of pipec. CPU kernels behind pipec_k_compare, pipec_k_where and
// pipec_k_cast (see include/pipec_rt.h for the parameter layouts).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Booleans are int64 0/1 everywhere in pipec (the importer converts ONNX
/// bool tensors at the edges), so a mask computed at run time (Equal of the
/// token ids with the padding id, say) flows through the same buffers as
/// labels and indices. The kernels walk the broadcast loop nest of
/// cpu/strided.h. A malformed nest (more dimensions than addressable)
/// poisons a float output with NaN and writes INT64_MIN into an integer
/// one, which the runtime's checks then report.
///
/// Each kernel is a template over the float element type T: float for
/// `pipec_k_X`, double for `pipec_k_X_f64` (compare/where then read float
/// operands as double, int64 operands are unchanged; cast converts between
/// int64 and double, with the range checks done against double).
///
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"

#include "cpu/real.h"
#include "cpu/strided.h"

#include <cmath>
#include <cstdint>
#include <limits>

using namespace pipec::rt;

namespace {

constexpr int64_t kBadInt = std::numeric_limits<int64_t>::min();

template <typename T> bool compare(int64_t predicate, T a, T b) {
  switch (predicate) {
  case PIPEC_CMP_EQ:
    return a == b;
  case PIPEC_CMP_NE:
    return a != b;
  case PIPEC_CMP_LT:
    return a < b;
  case PIPEC_CMP_GT:
    return a > b;
  case PIPEC_CMP_LE:
    return a <= b;
  default:
    return a >= b;
  }
}

/// Y's element count and its loop nest over `NumOps` operands whose strides
/// follow `dims` in `ints` (Y, contiguous, is the last operand).
template <int NumOps>
NestKind nestOf(int64_t rank, const int64_t *dims, const int64_t *strides,
                StridedNest<NumOps> &nest, int64_t &numel) {
  numel = 1;
  for (int64_t i = 0; i < rank; ++i)
    numel *= dims[i] > 0 ? dims[i] : 0;
  if (rank > kMaxDims)
    return NestKind::TooDeep;
  int64_t yStrides[kMaxDims];
  contiguousStrides(rank, dims, yStrides);
  const int64_t *all[NumOps];
  for (int op = 0; op + 1 < NumOps; ++op)
    all[op] = strides + op * rank;
  all[NumOps - 1] = yStrides;
  return canonicalize(rank, dims, all, nest);
}

template <typename T>
void compareAll(const StridedNest<3> &nest, int64_t predicate, const T *a,
                const T *b, int64_t *y) {
  forEachRow(nest, [&](const int64_t *off, int64_t n, const int64_t *inner) {
    const T *pa = a + off[0];
    const T *pb = b + off[1];
    int64_t *py = y + off[2];
    for (int64_t i = 0; i < n; ++i)
      py[i] = compare(predicate, pa[i * inner[0]], pb[i * inner[1]]) ? 1 : 0;
  });
}

template <typename T>
void selectAll(const StridedNest<4> &nest, const int64_t *c, const T *x,
               const T *yIn, T *out) {
  forEachRow(nest, [&](const int64_t *off, int64_t n, const int64_t *inner) {
    const int64_t *pc = c + off[0];
    const T *px = x + off[1];
    const T *py = yIn + off[2];
    T *po = out + off[3];
    for (int64_t i = 0; i < n; ++i)
      po[i] = pc[i * inner[0]] != 0 ? px[i * inner[1]] : py[i * inner[2]];
  });
}

template <class T>
void compareKernel(void *const *bufs, const int64_t *ints, const double *) {
  const int64_t predicate = ints[0], rank = ints[1];
  int64_t *y = static_cast<int64_t *>(bufs[2]);
  StridedNest<3> nest;
  int64_t numel = 0;
  NestKind kind = nestOf(rank, ints + 2, ints + 2 + rank, nest, numel);
  if (kind == NestKind::Empty)
    return;
  if (kind == NestKind::TooDeep || predicate < PIPEC_CMP_EQ ||
      predicate > PIPEC_CMP_GE) {
    for (int64_t i = 0; i < numel; ++i)
      y[i] = kBadInt;
    return;
  }
  const bool isInt = ints[2 + 3 * rank] != 0;
  if (isInt)
    compareAll(nest, predicate, static_cast<const int64_t *>(bufs[0]),
               static_cast<const int64_t *>(bufs[1]), y);
  else
    compareAll(nest, predicate, static_cast<const T *>(bufs[0]),
               static_cast<const T *>(bufs[1]), y);
}

template <class T>
void whereKernel(void *const *bufs, const int64_t *ints, const double *) {
  const bool isInt = ints[0] != 0;
  const int64_t rank = ints[1];
  StridedNest<4> nest;
  int64_t numel = 0;
  NestKind kind = nestOf(rank, ints + 2, ints + 2 + rank, nest, numel);
  if (kind == NestKind::Empty)
    return;
  const int64_t *c = static_cast<const int64_t *>(bufs[0]);
  if (isInt) {
    int64_t *out = static_cast<int64_t *>(bufs[3]);
    if (kind == NestKind::TooDeep) {
      for (int64_t i = 0; i < numel; ++i)
        out[i] = kBadInt;
      return;
    }
    selectAll(nest, c, static_cast<const int64_t *>(bufs[1]),
              static_cast<const int64_t *>(bufs[2]), out);
    return;
  }
  T *out = static_cast<T *>(bufs[3]);
  if (kind == NestKind::TooDeep) {
    poison(out, numel);
    return;
  }
  selectAll(nest, c, static_cast<const T *>(bufs[1]),
            static_cast<const T *>(bufs[2]), out);
}

template <class T>
void castKernel(void *const *bufs, const int64_t *ints, const double *) {
  const int64_t direction = ints[0], n = ints[1];
  // bfloat16 storage (--activations bf16): float32 builds only, so T is
  // float (the float64 twin rounds through float first).
  if (direction == PIPEC_CAST_F32_TO_BF16) {
    const T *x = static_cast<const T *>(bufs[0]);
    uint16_t *y = static_cast<uint16_t *>(bufs[1]);
    for (int64_t i = 0; i < n; ++i)
      y[i] = pipec::cpu::bf16Bits(float(x[i]));
    return;
  }
  if (direction == PIPEC_CAST_BF16_TO_F32) {
    const uint16_t *x = static_cast<const uint16_t *>(bufs[0]);
    T *y = static_cast<T *>(bufs[1]);
    for (int64_t i = 0; i < n; ++i)
      y[i] = T(pipec::cpu::fromBf16Bits(x[i]));
    return;
  }
  if (direction == PIPEC_CAST_I64_TO_F32) {
    const int64_t *x = static_cast<const int64_t *>(bufs[0]);
    T *y = static_cast<T *>(bufs[1]);
    for (int64_t i = 0; i < n; ++i)
      y[i] = static_cast<T>(x[i]);
    return;
  }
  const T *x = static_cast<const T *>(bufs[0]);
  int64_t *y = static_cast<int64_t *>(bufs[1]);
  // 2^63 is exactly representable in T; anything at or beyond it (or NaN)
  // does not fit.
  const T limit = T(9223372036854775808.0);
  for (int64_t i = 0; i < n; ++i) {
    T v = x[i];
    bool fits = direction == PIPEC_CAST_F32_TO_I64 && v >= -limit && v < limit;
    y[i] = fits ? static_cast<int64_t>(std::trunc(v)) : kBadInt;
  }
}

} // namespace

PIPEC_CPU_KERNEL(pipec_k_compare, compareKernel)
PIPEC_CPU_KERNEL(pipec_k_where, whereKernel)
PIPEC_CPU_KERNEL(pipec_k_cast, castKernel)
