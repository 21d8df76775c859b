//===- elementwise.cpp - Elementwise kernels ------------------------------===//
//
// Part of pipec. CPU kernels behind pipec_k_binary, pipec_k_unary,
// pipec_k_unary_grad, pipec_k_copy, pipec_k_fill and pipec_k_sgd (see
// include/pipec_rt.h for the parameter layouts).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The binary kernel canonicalises its broadcast (strides) into the shortest
/// loop nest (cpu/strided.h) and then runs one of a few specialised innermost
/// loops: both operands contiguous, one operand repeated (scalar / row
/// broadcast), or the general strided loop. The operator is a template
/// functor, so every innermost loop is a plain, vectorisable loop.
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
// Binary
//===----------------------------------------------------------------------===//

namespace {

struct AddOp {
  static float apply(float a, float b) { return a + b; }
};
struct SubOp {
  static float apply(float a, float b) { return a - b; }
};
struct MulOp {
  static float apply(float a, float b) { return a * b; }
};
struct DivOp {
  static float apply(float a, float b) { return a / b; }
};

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

} // namespace

extern "C" void pipec_k_binary(void *const *bufs, const int64_t *ints,
                               const double *reals) {
  const float *a = static_cast<const float *>(bufs[0]);
  const float *b = static_cast<const float *>(bufs[1]);
  float *y = static_cast<float *>(bufs[2]);
  int64_t opcode = ints[0];
  int64_t rank = ints[1];
  const int64_t *dims = ints + 2;
  const int64_t *aStrides = ints + 2 + rank;
  const int64_t *bStrides = ints + 2 + 2 * rank;

  // Y is contiguous; it is the third operand of the loop nest. Strides are
  // computed in chunks so that any rank works without heap allocation.
  int64_t yStrides[kMaxDims];
  StridedNest<3> nest;
  NestKind kind;
  int64_t numel = 1;
  for (int64_t i = 0; i < rank; ++i)
    numel *= dims[i] > 0 ? dims[i] : 0;
  if (rank <= kMaxDims) {
    contiguousStrides(rank, dims, yStrides);
    const int64_t *const strides[3] = {aStrides, bStrides, yStrides};
    kind = canonicalize(rank, dims, strides, nest);
  } else {
    kind = NestKind::TooDeep; // Not representable without allocation.
  }
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
  default:
    poison(y, numel);
    break;
  }
}

//===----------------------------------------------------------------------===//
// Unary and its backward
//===----------------------------------------------------------------------===//

namespace {

/// tanh for float as the odd rational function p(x) / q(x) of degrees 13
/// and 6 on [-7.905, 7.905] (clamped outside, where tanh rounds to +-1), the
/// approximation Eigen uses for its vectorised tanh. Measured against double
/// tanh on a dense grid over [-12, 12]: max relative error 4e-7 (a few ulp).
/// Unlike libm's tanhf it has no branches, so the loop vectorises (3-4x
/// faster). Tiny |x| returns x; NaN propagates.
inline float rationalTanh(float x) {
  const float clamp = 7.90531110763549805f;
  float xc = std::min(std::max(x, -clamp), clamp);
  float x2 = xc * xc;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  p = p * xc;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  return std::fabs(x) < 0.0004f ? x : p / q;
}

} // namespace

extern "C" void pipec_k_unary(void *const *bufs, const int64_t *ints,
                              const double *reals) {
  const float *x = static_cast<const float *>(bufs[0]);
  float *y = static_cast<float *>(bufs[1]);
  int64_t opcode = ints[0], n = ints[1];
  if (n <= 0)
    return;
  switch (opcode) {
  case PIPEC_UN_COPY:
    if (x != y)
      std::memmove(y, x, sizeof(float) * size_t(n));
    break;
  case PIPEC_UN_RELU:
    // std::max(x, 0) keeps a NaN input NaN (unlike x > 0 ? x : 0).
    for (int64_t i = 0; i < n; ++i)
      y[i] = std::max(x[i], 0.0f);
    break;
  case PIPEC_UN_TANH:
    for (int64_t i = 0; i < n; ++i)
      y[i] = rationalTanh(x[i]);
    break;
  case PIPEC_UN_SIGMOID:
    // exp(-x) overflows to +inf for very negative x, giving exactly 0.
    for (int64_t i = 0; i < n; ++i)
      y[i] = 1.0f / (1.0f + std::exp(-x[i]));
    break;
  case PIPEC_UN_NEG:
    for (int64_t i = 0; i < n; ++i)
      y[i] = -x[i];
    break;
  case PIPEC_UN_SCALE: {
    const float alpha = reals ? float(reals[0]) : 1.0f;
    for (int64_t i = 0; i < n; ++i)
      y[i] = alpha * x[i];
    break;
  }
  case PIPEC_UN_EXP:
    for (int64_t i = 0; i < n; ++i)
      y[i] = std::exp(x[i]);
    break;
  default:
    poison(y, n);
    break;
  }
}

/// Besides the RELU / TANH / SIGMOID opcodes of the ABI, the backward of the
/// remaining unary ops is accepted too (an extension, with T as for TANH:
/// the forward output): COPY (dX = dY), NEG (dX = -dY), SCALE (dX = alpha *
/// dY, alpha from reals[0]) and EXP (dX = dY * Y).
extern "C" void pipec_k_unary_grad(void *const *bufs, const int64_t *ints,
                                   const double *reals) {
  const float *t = static_cast<const float *>(bufs[0]);
  const float *dy = static_cast<const float *>(bufs[1]);
  float *dx = static_cast<float *>(bufs[2]);
  int64_t opcode = ints[0], n = ints[1];
  if (n <= 0)
    return;
  switch (opcode) {
  case PIPEC_UN_RELU: // T = X.
    for (int64_t i = 0; i < n; ++i)
      dx[i] = t[i] > 0.0f ? dy[i] : 0.0f;
    break;
  case PIPEC_UN_TANH: // T = Y; tanh' = 1 - Y^2.
    for (int64_t i = 0; i < n; ++i)
      dx[i] = dy[i] * (1.0f - t[i] * t[i]);
    break;
  case PIPEC_UN_SIGMOID: // T = Y; sigmoid' = Y (1 - Y).
    for (int64_t i = 0; i < n; ++i)
      dx[i] = dy[i] * (t[i] * (1.0f - t[i]));
    break;
  case PIPEC_UN_COPY:
    if (dx != dy)
      std::memmove(dx, dy, sizeof(float) * size_t(n));
    break;
  case PIPEC_UN_NEG:
    for (int64_t i = 0; i < n; ++i)
      dx[i] = -dy[i];
    break;
  case PIPEC_UN_SCALE: {
    const float alpha = reals ? float(reals[0]) : 1.0f;
    for (int64_t i = 0; i < n; ++i)
      dx[i] = alpha * dy[i];
    break;
  }
  case PIPEC_UN_EXP: // T = Y; exp' = Y.
    for (int64_t i = 0; i < n; ++i)
      dx[i] = dy[i] * t[i];
    break;
  default:
    poison(dx, n);
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
