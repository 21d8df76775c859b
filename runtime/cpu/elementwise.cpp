//===- elementwise.cpp - Binary elementwise kernels, copy, fill, SGD ------===//
//
// Part of pipec. CPU kernels behind pipec_k_binary, pipec_k_binary_grad,
// pipec_k_copy, pipec_k_fill and pipec_k_sgd (see include/pipec_rt.h for the
// parameter layouts). The unary kernels live in unary.cpp.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The binary kernels canonicalise their broadcast (strides) into the
/// shortest loop nest (cpu/strided.h) and then run one of a few specialised
/// innermost loops: both operands contiguous, one operand repeated (scalar /
/// row broadcast), or the general strided loop. The operator is a template
/// functor, so every innermost loop is a plain, vectorisable loop.
///
/// Semantics of the operators beyond + - * /:
///  - POW is std::pow (ONNX Pow, float base and exponent). An exponent that
///    is one broadcast scalar equal to 2 (LayerNorm decompositions) is
///    computed as a * a, which is exact.
///  - MAX / MIN propagate NaN from either side (numpy maximum / minimum,
///    ONNX Max / Min); on ties they return A.
///
/// pipec_k_binary_grad gives full-shape (Y-shaped) gradients; the compiler
/// sums them onto the operands' shapes with pipec_k_reduce_sum. Besides the
/// POW / MAX / MIN the header requires it accepts ADD, SUB, MUL and DIV too.
/// Conventions where a derivative does not exist (mirroring PyTorch):
///  - POW: dA = dY * B * A^(B-1), taken as 0 where B == 0; dB = dY * A^B *
///    log(A), taken as 0 where A == 0 and B >= 0 (a negative base gives NaN,
///    as log does).
///  - MAX / MIN: the whole gradient goes to A on ties (A >= B for MAX,
///    A <= B for MIN), to B otherwise.
/// dA / dB may alias dY (each element is read before either is written).
///
/// Unknown opcodes poison the output with NaN (cpu/strided.h explains why).
///
/// Every kernel except pipec_k_copy (which moves bytes) is a template over
/// the element type (float, or double for the `_f64` twins, see
/// cpu/real.h); the double instantiations compute in double throughout.
///
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"

#include "cpu/real.h"
#include "cpu/strided.h"

#include <algorithm>
#include <cmath>
#include <cstring>

using namespace pipec::rt;

//===----------------------------------------------------------------------===//
// Operators
//===----------------------------------------------------------------------===//

namespace {

template <class T> struct AddOp {
  static T apply(T a, T b) { return a + b; }
  static T gradA(T, T, T dy) { return dy; }
  static T gradB(T, T, T dy) { return dy; }
};
template <class T> struct SubOp {
  static T apply(T a, T b) { return a - b; }
  static T gradA(T, T, T dy) { return dy; }
  static T gradB(T, T, T dy) { return -dy; }
};
template <class T> struct MulOp {
  static T apply(T a, T b) { return a * b; }
  static T gradA(T, T b, T dy) { return dy * b; }
  static T gradB(T a, T, T dy) { return dy * a; }
};
template <class T> struct DivOp {
  static T apply(T a, T b) { return a / b; }
  static T gradA(T, T b, T dy) { return dy / b; }
  static T gradB(T a, T b, T dy) { return -dy * (a / b) / b; }
};
template <class T> struct PowOp {
  static T apply(T a, T b) { return std::pow(a, b); }
  static T gradA(T a, T b, T dy) {
    return b == T(0) ? T(0) : dy * (b * std::pow(a, b - T(1)));
  }
  static T gradB(T a, T b, T dy) {
    if (a == T(0) && b >= T(0))
      return T(0);
    return dy * (std::pow(a, b) * std::log(a));
  }
};
/// POW with the broadcast scalar exponent 2.
template <class T> struct SquareOp {
  static T apply(T a, T) { return a * a; }
};
template <class T> struct MaxOp {
  // a != a: a NaN A wins; a NaN B fails a >= b and wins too.
  static T apply(T a, T b) { return (a >= b || a != a) ? a : b; }
  static T gradA(T a, T b, T dy) { return a >= b ? dy : T(0); }
  static T gradB(T a, T b, T dy) { return a >= b ? T(0) : dy; }
};
template <class T> struct MinOp {
  static T apply(T a, T b) { return (a <= b || a != a) ? a : b; }
  static T gradA(T a, T b, T dy) { return a <= b ? dy : T(0); }
  static T gradB(T a, T b, T dy) { return a <= b ? T(0) : dy; }
};

/// Builds the loop nest over Y's dims with operands A, B (through their
/// strides) and Y (contiguous), from the common ints layout
/// [opcode, rank, dims, aStrides, bStrides]. Returns the nest kind and
/// writes Y's element count.
NestKind binaryNestOf(const int64_t *ints, StridedNest<3> &nest,
                      int64_t &numel) {
  int64_t rank = ints[1];
  const int64_t *dims = ints + 2;
  const int64_t *aStrides = ints + 2 + rank;
  const int64_t *bStrides = ints + 2 + 2 * rank;
  numel = 1;
  for (int64_t i = 0; i < rank; ++i)
    numel *= dims[i] > 0 ? dims[i] : 0;
  if (rank > kMaxDims)
    return NestKind::TooDeep; // Not representable without allocation.
  // Y is contiguous; it is the third operand of the loop nest.
  int64_t yStrides[kMaxDims];
  contiguousStrides(rank, dims, yStrides);
  const int64_t *const strides[3] = {aStrides, bStrides, yStrides};
  return canonicalize(rank, dims, strides, nest);
}

/// Whether operand B is one scalar broadcast to every element.
bool bIsScalar(const int64_t *ints) {
  int64_t rank = ints[1];
  const int64_t *dims = ints + 2;
  const int64_t *bStrides = ints + 2 + 2 * rank;
  for (int64_t i = 0; i < rank; ++i)
    if (bStrides[i] != 0 && dims[i] != 1)
      return false;
  return true;
}

//===----------------------------------------------------------------------===//
// Forward
//===----------------------------------------------------------------------===//

/// Y[0, n) = Op(A, B) where A and B advance by sa and sb. Y is contiguous.
/// Elements are processed in increasing order and each Y[i] is written after
/// reading its own inputs, so Y may alias a non-broadcast operand.
template <typename Op, class T>
void binaryRow(const T *a, int64_t sa, const T *b, int64_t sb, T *y,
               int64_t n) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i)
      y[i] = Op::apply(a[i], b[i]);
  } else if (sa == 1 && sb == 0) {
    const T bv = b[0];
    for (int64_t i = 0; i < n; ++i)
      y[i] = Op::apply(a[i], bv);
  } else if (sa == 0 && sb == 1) {
    const T av = a[0];
    for (int64_t i = 0; i < n; ++i)
      y[i] = Op::apply(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i)
      y[i] = Op::apply(a[i * sa], b[i * sb]);
  }
}

template <typename Op, class T>
void binaryNest(const StridedNest<3> &nest, const T *a, const T *b, T *y) {
  forEachRow(nest, [&](const int64_t *off, int64_t n, const int64_t *inner) {
    binaryRow<Op>(a + off[0], inner[0], b + off[1], inner[1], y + off[2], n);
  });
}

//===----------------------------------------------------------------------===//
// Backward
//===----------------------------------------------------------------------===//

/// dA / dB of one row; dY, dA and dB advance by sy (they share Y's layout).
template <typename Op, bool WantA, bool WantB, class T>
void binaryGradRow(const T *a, int64_t sa, const T *b, int64_t sb, const T *dy,
                   T *da, T *db, int64_t sy, int64_t n) {
  if (sa == 1 && sb == 1 && sy == 1) { // unit strides: a vectorisable loop
    for (int64_t i = 0; i < n; ++i) {
      const T av = a[i], bv = b[i], g = dy[i];
      if (WantA)
        da[i] = Op::gradA(av, bv, g);
      if (WantB)
        db[i] = Op::gradB(av, bv, g);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const T av = a[i * sa], bv = b[i * sb], g = dy[i * sy];
    if (WantA)
      da[i * sy] = Op::gradA(av, bv, g);
    if (WantB)
      db[i * sy] = Op::gradB(av, bv, g);
  }
}

template <typename Op, bool WantA, bool WantB, class T>
void binaryGradNest(const StridedNest<3> &nest, const T *a, const T *b,
                    const T *dy, T *da, T *db) {
  forEachRow(nest, [&](const int64_t *off, int64_t n, const int64_t *inner) {
    binaryGradRow<Op, WantA, WantB>(a + off[0], inner[0], b + off[1], inner[1],
                                    dy + off[2], WantA ? da + off[2] : nullptr,
                                    WantB ? db + off[2] : nullptr, inner[2], n);
  });
}

template <typename Op, class T>
void binaryGradDispatch(const StridedNest<3> &nest, const T *a, const T *b,
                        const T *dy, T *da, T *db) {
  if (da && db)
    binaryGradNest<Op, true, true>(nest, a, b, dy, da, db);
  else if (da)
    binaryGradNest<Op, true, false>(nest, a, b, dy, da, db);
  else if (db)
    binaryGradNest<Op, false, true>(nest, a, b, dy, da, db);
}

//===----------------------------------------------------------------------===//
// Entry points
//===----------------------------------------------------------------------===//

template <class T>
void binaryKernel(void *const *bufs, const int64_t *ints, const double *) {
  const T *a = static_cast<const T *>(bufs[0]);
  const T *b = static_cast<const T *>(bufs[1]);
  T *y = static_cast<T *>(bufs[2]);
  int64_t opcode = ints[0];
  StridedNest<3> nest;
  int64_t numel;
  NestKind kind = binaryNestOf(ints, nest, numel);
  if (kind == NestKind::Empty)
    return;
  if (kind == NestKind::TooDeep) {
    poison(y, numel);
    return;
  }
  switch (opcode) {
  case PIPEC_BIN_ADD:
    binaryNest<AddOp<T>>(nest, a, b, y);
    break;
  case PIPEC_BIN_SUB:
    binaryNest<SubOp<T>>(nest, a, b, y);
    break;
  case PIPEC_BIN_MUL:
    binaryNest<MulOp<T>>(nest, a, b, y);
    break;
  case PIPEC_BIN_DIV:
    binaryNest<DivOp<T>>(nest, a, b, y);
    break;
  case PIPEC_BIN_POW:
    if (bIsScalar(ints) && b[0] == T(2))
      binaryNest<SquareOp<T>>(nest, a, b, y);
    else
      binaryNest<PowOp<T>>(nest, a, b, y);
    break;
  case PIPEC_BIN_MAX:
    binaryNest<MaxOp<T>>(nest, a, b, y);
    break;
  case PIPEC_BIN_MIN:
    binaryNest<MinOp<T>>(nest, a, b, y);
    break;
  default:
    poison(y, numel);
    break;
  }
}

template <class T>
void binaryGradKernel(void *const *bufs, const int64_t *ints, const double *) {
  const T *a = static_cast<const T *>(bufs[0]);
  const T *b = static_cast<const T *>(bufs[1]);
  const T *dy = static_cast<const T *>(bufs[2]);
  T *da = static_cast<T *>(bufs[3]);
  T *db = static_cast<T *>(bufs[4]);
  int64_t opcode = ints[0];
  StridedNest<3> nest;
  int64_t numel;
  NestKind kind = binaryNestOf(ints, nest, numel);
  if (kind == NestKind::Empty || (!da && !db))
    return;
  auto poisonAll = [&] {
    if (da)
      poison(da, numel);
    if (db)
      poison(db, numel);
  };
  if (kind == NestKind::TooDeep) {
    poisonAll();
    return;
  }
  switch (opcode) {
  case PIPEC_BIN_ADD:
    binaryGradDispatch<AddOp<T>>(nest, a, b, dy, da, db);
    break;
  case PIPEC_BIN_SUB:
    binaryGradDispatch<SubOp<T>>(nest, a, b, dy, da, db);
    break;
  case PIPEC_BIN_MUL:
    binaryGradDispatch<MulOp<T>>(nest, a, b, dy, da, db);
    break;
  case PIPEC_BIN_DIV:
    binaryGradDispatch<DivOp<T>>(nest, a, b, dy, da, db);
    break;
  case PIPEC_BIN_POW:
    binaryGradDispatch<PowOp<T>>(nest, a, b, dy, da, db);
    break;
  case PIPEC_BIN_MAX:
    binaryGradDispatch<MaxOp<T>>(nest, a, b, dy, da, db);
    break;
  case PIPEC_BIN_MIN:
    binaryGradDispatch<MinOp<T>>(nest, a, b, dy, da, db);
    break;
  default:
    poisonAll();
    break;
  }
}

//===----------------------------------------------------------------------===//
// Fill, SGD
//===----------------------------------------------------------------------===//

template <class T>
void fillKernel(void *const *bufs, const int64_t *ints, const double *reals) {
  T *y = static_cast<T *>(bufs[0]);
  int64_t n = ints[0];
  const T value = reals ? T(reals[0]) : T(0);
  if (n > 0)
    std::fill(y, y + n, value);
}

template <class T>
void sgdKernel(void *const *bufs, const int64_t *ints, const double *) {
  const T *w = static_cast<const T *>(bufs[0]);
  const T *g = static_cast<const T *>(bufs[1]);
  const T lr = *static_cast<const T *>(bufs[2]);
  T *wOut = static_cast<T *>(bufs[3]);
  int64_t n = ints[0];
  for (int64_t i = 0; i < n; ++i)
    wOut[i] = w[i] - lr * g[i];
}

} // namespace

PIPEC_CPU_KERNEL(pipec_k_binary, binaryKernel)
PIPEC_CPU_KERNEL(pipec_k_binary_grad, binaryGradKernel)
PIPEC_CPU_KERNEL(pipec_k_fill, fillKernel)
PIPEC_CPU_KERNEL(pipec_k_sgd, sgdKernel)

//===----------------------------------------------------------------------===//
// Copy
//===----------------------------------------------------------------------===//

/// Moves bytes: one entry point for every element type (no `_f64` twin).
extern "C" void pipec_k_copy(pipec_kctx *, void *const *bufs,
                             const int64_t *ints, const double *) {
  int64_t nbytes = ints[0];
  if (nbytes > 0 && bufs[0] != bufs[1])
    std::memmove(bufs[1], bufs[0], size_t(nbytes));
}
