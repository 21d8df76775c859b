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
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"

#include "cpu/strided.h"

#include <algorithm>
#include <cmath>
#include <cstring>

using namespace pipec::rt;

//===----------------------------------------------------------------------===//
// Operators
//===----------------------------------------------------------------------===//

namespace {

struct AddOp {
  static float apply(float a, float b) { return a + b; }
  static float gradA(float, float, float dy) { return dy; }
  static float gradB(float, float, float dy) { return dy; }
};
struct SubOp {
  static float apply(float a, float b) { return a - b; }
  static float gradA(float, float, float dy) { return dy; }
  static float gradB(float, float, float dy) { return -dy; }
};
struct MulOp {
  static float apply(float a, float b) { return a * b; }
  static float gradA(float, float b, float dy) { return dy * b; }
  static float gradB(float a, float, float dy) { return dy * a; }
};
struct DivOp {
  static float apply(float a, float b) { return a / b; }
  static float gradA(float, float b, float dy) { return dy / b; }
  static float gradB(float a, float b, float dy) { return -dy * (a / b) / b; }
};
struct PowOp {
  static float apply(float a, float b) { return std::pow(a, b); }
  static float gradA(float a, float b, float dy) {
    return b == 0.0f ? 0.0f : dy * (b * std::pow(a, b - 1.0f));
  }
  static float gradB(float a, float b, float dy) {
    if (a == 0.0f && b >= 0.0f)
      return 0.0f;
    return dy * (std::pow(a, b) * std::log(a));
  }
};
/// POW with the broadcast scalar exponent 2.
struct SquareOp {
  static float apply(float a, float) { return a * a; }
};
struct MaxOp {
  // a != a: a NaN A wins; a NaN B fails a >= b and wins too.
  static float apply(float a, float b) { return (a >= b || a != a) ? a : b; }
  static float gradA(float a, float b, float dy) { return a >= b ? dy : 0.0f; }
  static float gradB(float a, float b, float dy) { return a >= b ? 0.0f : dy; }
};
struct MinOp {
  static float apply(float a, float b) { return (a <= b || a != a) ? a : b; }
  static float gradA(float a, float b, float dy) { return a <= b ? dy : 0.0f; }
  static float gradB(float a, float b, float dy) { return a <= b ? 0.0f : dy; }
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
template <typename Op>
void binaryRow(const float *a, int64_t sa, const float *b, int64_t sb, float *y,
               int64_t n) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i)
      y[i] = Op::apply(a[i], b[i]);
  } else if (sa == 1 && sb == 0) {
    const float bv = b[0];
    for (int64_t i = 0; i < n; ++i)
      y[i] = Op::apply(a[i], bv);
  } else if (sa == 0 && sb == 1) {
    const float av = a[0];
    for (int64_t i = 0; i < n; ++i)
      y[i] = Op::apply(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i)
      y[i] = Op::apply(a[i * sa], b[i * sb]);
  }
}

template <typename Op>
void binaryNest(const StridedNest<3> &nest, const float *a, const float *b,
                float *y) {
  forEachRow(nest, [&](const int64_t *off, int64_t n, const int64_t *inner) {
    binaryRow<Op>(a + off[0], inner[0], b + off[1], inner[1], y + off[2], n);
  });
}

//===----------------------------------------------------------------------===//
// Backward
//===----------------------------------------------------------------------===//

/// dA / dB of one row; dY, dA and dB advance by sy (they share Y's layout).
template <typename Op, bool WantA, bool WantB>
void binaryGradRow(const float *a, int64_t sa, const float *b, int64_t sb,
                   const float *dy, float *da, float *db, int64_t sy,
                   int64_t n) {
  if (sa == 1 && sb == 1 && sy == 1) { // unit strides: a vectorisable loop
    for (int64_t i = 0; i < n; ++i) {
      const float av = a[i], bv = b[i], g = dy[i];
      if (WantA)
        da[i] = Op::gradA(av, bv, g);
      if (WantB)
        db[i] = Op::gradB(av, bv, g);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float av = a[i * sa], bv = b[i * sb], g = dy[i * sy];
    if (WantA)
      da[i * sy] = Op::gradA(av, bv, g);
    if (WantB)
      db[i * sy] = Op::gradB(av, bv, g);
  }
}

template <typename Op, bool WantA, bool WantB>
void binaryGradNest(const StridedNest<3> &nest, const float *a, const float *b,
                    const float *dy, float *da, float *db) {
  forEachRow(nest, [&](const int64_t *off, int64_t n, const int64_t *inner) {
    binaryGradRow<Op, WantA, WantB>(a + off[0], inner[0], b + off[1], inner[1],
                                    dy + off[2], WantA ? da + off[2] : nullptr,
                                    WantB ? db + off[2] : nullptr, inner[2], n);
  });
}

template <typename Op>
void binaryGradDispatch(const StridedNest<3> &nest, const float *a,
                        const float *b, const float *dy, float *da, float *db) {
  if (da && db)
    binaryGradNest<Op, true, true>(nest, a, b, dy, da, db);
  else if (da)
    binaryGradNest<Op, true, false>(nest, a, b, dy, da, db);
  else if (db)
    binaryGradNest<Op, false, true>(nest, a, b, dy, da, db);
}

} // namespace

//===----------------------------------------------------------------------===//
// Entry points
//===----------------------------------------------------------------------===//

extern "C" void pipec_k_binary(void *const *bufs, const int64_t *ints,
                               const double *reals) {
  const float *a = static_cast<const float *>(bufs[0]);
  const float *b = static_cast<const float *>(bufs[1]);
  float *y = static_cast<float *>(bufs[2]);
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
    binaryNest<AddOp>(nest, a, b, y);
    break;
  case PIPEC_BIN_SUB:
    binaryNest<SubOp>(nest, a, b, y);
    break;
  case PIPEC_BIN_MUL:
    binaryNest<MulOp>(nest, a, b, y);
    break;
  case PIPEC_BIN_DIV:
    binaryNest<DivOp>(nest, a, b, y);
    break;
  case PIPEC_BIN_POW:
    if (bIsScalar(ints) && b[0] == 2.0f)
      binaryNest<SquareOp>(nest, a, b, y);
    else
      binaryNest<PowOp>(nest, a, b, y);
    break;
  case PIPEC_BIN_MAX:
    binaryNest<MaxOp>(nest, a, b, y);
    break;
  case PIPEC_BIN_MIN:
    binaryNest<MinOp>(nest, a, b, y);
    break;
  default:
    poison(y, numel);
    break;
  }
}

extern "C" void pipec_k_binary_grad(void *const *bufs, const int64_t *ints,
                                    const double *reals) {
  const float *a = static_cast<const float *>(bufs[0]);
  const float *b = static_cast<const float *>(bufs[1]);
  const float *dy = static_cast<const float *>(bufs[2]);
  float *da = static_cast<float *>(bufs[3]);
  float *db = static_cast<float *>(bufs[4]);
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
    binaryGradDispatch<AddOp>(nest, a, b, dy, da, db);
    break;
  case PIPEC_BIN_SUB:
    binaryGradDispatch<SubOp>(nest, a, b, dy, da, db);
    break;
  case PIPEC_BIN_MUL:
    binaryGradDispatch<MulOp>(nest, a, b, dy, da, db);
    break;
  case PIPEC_BIN_DIV:
    binaryGradDispatch<DivOp>(nest, a, b, dy, da, db);
    break;
  case PIPEC_BIN_POW:
    binaryGradDispatch<PowOp>(nest, a, b, dy, da, db);
    break;
  case PIPEC_BIN_MAX:
    binaryGradDispatch<MaxOp>(nest, a, b, dy, da, db);
    break;
  case PIPEC_BIN_MIN:
    binaryGradDispatch<MinOp>(nest, a, b, dy, da, db);
    break;
  default:
    poisonAll();
    break;
  }
}

//===----------------------------------------------------------------------===//
// Copy, fill, SGD
//===----------------------------------------------------------------------===//

extern "C" void pipec_k_copy(void *const *bufs, const int64_t *ints,
                             const double *reals) {
  int64_t nbytes = ints[0];
  if (nbytes > 0 && bufs[0] != bufs[1])
    std::memmove(bufs[1], bufs[0], size_t(nbytes));
}

extern "C" void pipec_k_fill(void *const *bufs, const int64_t *ints,
                             const double *reals) {
  float *y = static_cast<float *>(bufs[0]);
  int64_t n = ints[0];
  const float value = reals ? float(reals[0]) : 0.0f;
  if (n > 0)
    std::fill(y, y + n, value);
}

extern "C" void pipec_k_sgd(void *const *bufs, const int64_t *ints,
                            const double *reals) {
  const float *w = static_cast<const float *>(bufs[0]);
  const float *g = static_cast<const float *>(bufs[1]);
  const float lr = *static_cast<const float *>(bufs[2]);
  float *wOut = static_cast<float *>(bufs[3]);
  int64_t n = ints[0];
  for (int64_t i = 0; i < n; ++i)
    wOut[i] = w[i] - lr * g[i];
}
