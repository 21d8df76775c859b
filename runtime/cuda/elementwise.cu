//===- elementwise.cu - Elementwise kernels, comparison, cast, fill -------===//
//
// Part of pipec's CUDA runtime. CUDA twins of pipec_k_binary,
// pipec_k_binary_grad, pipec_k_compare, pipec_k_where, pipec_k_cast,
// pipec_k_unary, pipec_k_unary_grad, pipec_k_copy and pipec_k_fill (see
// include/pipec_rt.h for the parameter layouts and cpu/elementwise.cpp,
// cpu/unary.cpp and cpu/select.cpp for the references).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// One thread per output element in a grid-stride loop. Broadcasting
/// operands are read through the canonical strided nest of strided.cuh;
/// outputs are contiguous, and each thread reads all of its element's
/// inputs before writing it, so an output may alias an input exactly as the
/// CPU kernels allow.
///
/// The results follow the CPU kernels operation by operation:
///  - The CPU kernels are built for plain x86-64 (no FMA), so every a * b + c
///    there rounds twice. nvcc would fuse such pairs; the formulas here use
///    __fmul_rn / __fadd_rn / __fsub_rn, which are never fused, and the
///    operations happen in the CPU's order. Division and square root are
///    the IEEE-rounded __fdiv_rn / __fsqrt_rn.
///  - tanh, erf (TANH, ERF, GELU, GELU_TANH) and the exp of the ERF / GELU
///    backward are the CPU's float approximations (cpu/unary.cpp,
///    cpu/fastmath.h), evaluated with the same operations, so they agree
///    bit for bit; EXP, SIGMOID, LOG and POW use CUDA's expf / logf / powf
///    (within 2-4 ulp of libm). Never build this file with --use_fast_math.
///  - min / max / clamp keep the CPU's comparison forms (std::max(x, 0) is
///    x < 0 ? 0 : x), so NaN and signed zeros come out the same.
///  - Unknown opcodes poison the output with NaN (compare: INT64_MIN), as on
///    the CPU. A rank above 8 is an error (the CPU poisons instead).
///
//===----------------------------------------------------------------------===//

#include "core/bf16_storage.h"
#include "cuda_rt.h"
#include "pipec_rt.h"
#include "strided.cuh"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <utility>

namespace pipec {
namespace cuda {
namespace {

constexpr int kBlock = 256;
constexpr int64_t kBadInt = std::numeric_limits<int64_t>::min();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

//===----------------------------------------------------------------------===//
// Float arithmetic as the CPU kernels round it
//===----------------------------------------------------------------------===//

__device__ __forceinline__ float mulRn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ float addRn(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ float subRn(float a, float b) {
  return __fsub_rn(a, b);
}
__device__ __forceinline__ float divRn(float a, float b) {
  return __fdiv_rn(a, b);
}

/// min(max(x, lo), hi) with NaN propagating (cpu::clampBlend).
__device__ __forceinline__ float clampNaN(float x, float lo, float hi) {
  x = x < lo ? lo : x;
  return x > hi ? hi : x;
}

/// cpu/unary.cpp's rationalTanh, operation for operation.
__device__ float rationalTanh(float x) {
  const float clamp = 7.90531110763549805f;
  const float xc = clampNaN(x, -clamp, clamp);
  const float x2 = mulRn(xc, xc);
  float p = -2.76076847742355e-16f;
  p = addRn(mulRn(p, x2), 2.00018790482477e-13f);
  p = addRn(mulRn(p, x2), -8.60467152213735e-11f);
  p = addRn(mulRn(p, x2), 5.12229709037114e-08f);
  p = addRn(mulRn(p, x2), 1.48572235717979e-05f);
  p = addRn(mulRn(p, x2), 6.37261928875436e-04f);
  p = addRn(mulRn(p, x2), 4.89352455891786e-03f);
  p = mulRn(p, xc);
  float q = 1.19825839466702e-06f;
  q = addRn(mulRn(q, x2), 1.18534705686654e-04f);
  q = addRn(mulRn(q, x2), 2.26843463243900e-03f);
  q = addRn(mulRn(q, x2), 4.89352518554385e-03f);
  return fabsf(x) < 0.0004f ? x : divRn(p, q);
}

/// cpu/unary.cpp's rationalErf, operation for operation.
__device__ float rationalErf(float a) {
  const float x = clampNaN(a, -4.0f, 4.0f);
  const float x2 = mulRn(x, x);
  float p = -2.72614225801306e-10f;
  p = addRn(mulRn(p, x2), 2.77068142495902e-08f);
  p = addRn(mulRn(p, x2), -2.10102402082508e-06f);
  p = addRn(mulRn(p, x2), -5.69250639462346e-05f);
  p = addRn(mulRn(p, x2), -7.34990630326855e-04f);
  p = addRn(mulRn(p, x2), -2.95459980854025e-03f);
  p = addRn(mulRn(p, x2), -1.60960333262415e-02f);
  p = mulRn(p, x);
  float q = -1.45660718464996e-05f;
  q = addRn(mulRn(q, x2), -2.13374055278905e-04f);
  q = addRn(mulRn(q, x2), -1.68282697438203e-03f);
  q = addRn(mulRn(q, x2), -7.37332916720468e-03f);
  q = addRn(mulRn(q, x2), -1.42647390514189e-02f);
  return divRn(p, q);
}

/// cpu/fastmath.h's polyExp, operation for operation.
__device__ float polyExp(float a) {
  const float lo = -87.3365478515625f, hi = 88.3762626647949f;
  const float x = clampNaN(a, lo, hi);
  const float fx = addRn(mulRn(x, 1.44269504088896341f), 0.5f);
  int32_t n = int32_t(fx);
  n -= int32_t(float(n) > fx);
  const float fn = float(n);
  const float r =
      subRn(subRn(x, mulRn(fn, 0.693359375f)), mulRn(fn, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = addRn(mulRn(p, r), 1.3981999507e-3f);
  p = addRn(mulRn(p, r), 8.3334519073e-3f);
  p = addRn(mulRn(p, r), 4.1665795894e-2f);
  p = addRn(mulRn(p, r), 1.6666665459e-1f);
  p = addRn(mulRn(p, r), 5.0000001201e-1f);
  const float er = addRn(addRn(mulRn(mulRn(p, r), r), r), 1.0f);
  const float scale = __uint_as_float(uint32_t(n + 127) << 23);
  return a < lo ? 0.0f : mulRn(er, scale);
}

constexpr float kSqrtHalf = 0.70710678118654752f;     // 1 / sqrt 2
constexpr float kTwoOverSqrtPi = 1.1283791670955126f; // 2 / sqrt(pi)
constexpr float kInvSqrt2Pi = 0.3989422804014327f;    // 1 / sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.7978845608028654f;   // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

//===----------------------------------------------------------------------===//
// Binary operators (cpu/elementwise.cpp)
//===----------------------------------------------------------------------===//

struct AddOp {
  __device__ float operator()(float a, float b) const { return addRn(a, b); }
  __device__ float gradA(float, float, float g) const { return g; }
  __device__ float gradB(float, float, float g) const { return g; }
};
struct SubOp {
  __device__ float operator()(float a, float b) const { return subRn(a, b); }
  __device__ float gradA(float, float, float g) const { return g; }
  __device__ float gradB(float, float, float g) const { return -g; }
};
struct MulOp {
  __device__ float operator()(float a, float b) const { return mulRn(a, b); }
  __device__ float gradA(float, float b, float g) const { return mulRn(g, b); }
  __device__ float gradB(float a, float, float g) const { return mulRn(g, a); }
};
struct DivOp {
  __device__ float operator()(float a, float b) const { return divRn(a, b); }
  __device__ float gradA(float, float b, float g) const { return divRn(g, b); }
  __device__ float gradB(float a, float b, float g) const {
    return divRn(mulRn(-g, divRn(a, b)), b);
  }
};
/// POW; `square`: B is one broadcast scalar, and B == 2 then gives A * A
/// exactly (the CPU's SquareOp).
struct PowOp {
  bool square = false;
  __device__ float operator()(float a, float b) const {
    return square && b == 2.0f ? mulRn(a, a) : powf(a, b);
  }
  __device__ float gradA(float a, float b, float g) const {
    return b == 0.0f ? 0.0f : mulRn(g, mulRn(b, powf(a, subRn(b, 1.0f))));
  }
  __device__ float gradB(float a, float b, float g) const {
    if (a == 0.0f && b >= 0.0f)
      return 0.0f;
    return mulRn(g, mulRn(powf(a, b), logf(a)));
  }
};
/// NaN from either side wins; ties give A.
struct MaxOp {
  __device__ float operator()(float a, float b) const {
    return (a >= b || a != a) ? a : b;
  }
  __device__ float gradA(float a, float b, float g) const {
    return a >= b ? g : 0.0f;
  }
  __device__ float gradB(float a, float b, float g) const {
    return a >= b ? 0.0f : g;
  }
};
struct MinOp {
  __device__ float operator()(float a, float b) const {
    return (a <= b || a != a) ? a : b;
  }
  __device__ float gradA(float a, float b, float g) const {
    return a <= b ? g : 0.0f;
  }
  __device__ float gradB(float a, float b, float g) const {
    return a <= b ? 0.0f : g;
  }
};

/// Y[i] = op(A, B) over the nest (operand 0: A, 1: B); Y contiguous.
template <class Op, typename I>
__global__ void binaryKernel(const float *a, const float *b, float *y,
                             Nest<2> nest, int64_t n, Op op) {
  for (int64_t i = gridStart(); i < n; i += gridStep()) {
    int64_t off[2];
    nestOffsets(nest, I(i), off);
    const float av = a[off[0]], bv = b[off[1]];
    y[i] = op(av, bv);
  }
}

/// dA[i], dB[i] (either may be null) from A, B through the nest and the
/// contiguous dY. Everything is read before anything is written (dA or dB
/// may alias dY).
template <class Op, typename I>
__global__ void binaryGradKernel(const float *a, const float *b,
                                 const float *dy, float *da, float *db,
                                 Nest<2> nest, int64_t n, Op op) {
  for (int64_t i = gridStart(); i < n; i += gridStep()) {
    int64_t off[2];
    nestOffsets(nest, I(i), off);
    const float av = a[off[0]], bv = b[off[1]], g = dy[i];
    const float ga = da ? op.gradA(av, bv, g) : 0.0f;
    const float gb = db ? op.gradB(av, bv, g) : 0.0f;
    if (da)
      da[i] = ga;
    if (db)
      db[i] = gb;
  }
}

/// The nest of the [opcode, rank, dims, aStrides, bStrides] layout shared by
/// binary, binary_grad and compare. Returns false when Y is empty.
bool binaryNest(const int64_t *ints, Nest<2> &nest, const char *kernel) {
  const int64_t rank = ints[1];
  checkRank(rank, kernel);
  const int64_t *dims = ints + 2;
  const int64_t *const strides[2] = {dims + rank, dims + 2 * rank};
  return buildNest(rank, dims, strides, nest);
}

/// Whether B is one scalar broadcast to every element (the CPU's bIsScalar).
bool bIsScalar(const int64_t *ints) {
  const int64_t rank = ints[1];
  const int64_t *dims = ints + 2;
  const int64_t *bStrides = ints + 2 + 2 * rank;
  for (int64_t i = 0; i < rank; ++i)
    if (bStrides[i] != 0 && dims[i] != 1)
      return false;
  return true;
}

/// n / 4 when every pointer is 16-byte aligned (the vector loop's
/// length), else 0.
int64_t vectorCount(int64_t n, std::initializer_list<const void *> ptrs) {
  for (const void *p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      return 0;
  return n / 4;
}

/// Y[r, j] = op(A[r * inner + j], B[r * bOuter + j * bInner]) for the
/// [rows, inner] nests of a same-shape operation (bOuter = inner, bInner =
/// 1), a bias broadcast over rows (bOuter = 0, bInner = 1), a column
/// (bInner = 0) or a scalar: four elements per thread through 16-byte
/// loads (inner % 4 == 0, every row 16-byte aligned).
template <class Op, typename I>
__global__ void binaryRows4(const float *a, const float *b, float *y,
                            int64_t rows, int64_t inner, int64_t bOuter,
                            int64_t bInner, Op op) {
  const I quads = I(inner / 4);
  const int64_t n4 = rows * int64_t(quads);
  for (int64_t t = gridStart(); t < n4; t += gridStep()) {
    const I r = I(t) / quads;
    const int64_t j = int64_t(I(t) - r * quads) * 4;
    const float4 av = reinterpret_cast<const float4 *>(a)[t];
    const float *br = b + int64_t(r) * bOuter;
    float4 bv;
    if (bInner)
      bv = *reinterpret_cast<const float4 *>(br + j);
    else
      bv = make_float4(br[0], br[0], br[0], br[0]);
    reinterpret_cast<float4 *>(y)[t] = make_float4(
        op(av.x, bv.x), op(av.y, bv.y), op(av.z, bv.z), op(av.w, bv.w));
  }
}

/// Launches binaryRows4 when the nest has that form; false otherwise.
template <class Op>
bool launchBinaryRows(Context &ctx, const float *a, const float *b, float *y,
                      const Nest<2> &nest, int64_t n, Op op) {
  if (nest.rank < 1 || nest.rank > 2)
    return false;
  const int last = nest.rank - 1;
  const int64_t inner = nest.dims[last];
  const int64_t rows = nest.rank == 2 ? nest.dims[0] : 1;
  const int64_t aInner = nest.strides[0][last], bInner = nest.strides[1][last];
  const int64_t aOuter = nest.rank == 2 ? nest.strides[0][0] : inner;
  const int64_t bOuter = nest.rank == 2 ? nest.strides[1][0] : 0;
  if (aInner != 1 || aOuter != inner || (bInner != 0 && bInner != 1) ||
      inner % 4 != 0 || (bInner == 1 && bOuter % 4 != 0) ||
      vectorCount(4, {a, b, y}) == 0)
    return false;
  cudaStream_t s = ctx.stream;
  const int64_t n4 = n / 4;
  if (fits32(n4))
    binaryRows4<Op, uint32_t><<<gridFor(n4, kBlock), kBlock, 0, s>>>(
        a, b, y, rows, inner, bOuter, bInner, op);
  else
    binaryRows4<Op, uint64_t><<<gridFor(n4, kBlock), kBlock, 0, s>>>(
        a, b, y, rows, inner, bOuter, bInner, op);
  checkLaunch("pipec_cuda_k_binary");
  return true;
}

template <class Op>
void launchBinary(Context &ctx, const float *a, const float *b, float *y,
                  const Nest<2> &nest, int64_t n, Op op) {
  if (launchBinaryRows(ctx, a, b, y, nest, n, op))
    return;
  cudaStream_t s = ctx.stream;
  if (fits32(n))
    binaryKernel<Op, uint32_t>
        <<<gridFor(n, kBlock), kBlock, 0, s>>>(a, b, y, nest, n, op);
  else
    binaryKernel<Op, uint64_t>
        <<<gridFor(n, kBlock), kBlock, 0, s>>>(a, b, y, nest, n, op);
  checkLaunch("pipec_cuda_k_binary");
}

template <class Op>
void launchBinaryGrad(Context &ctx, const float *a, const float *b,
                      const float *dy, float *da, float *db,
                      const Nest<2> &nest, int64_t n, Op op) {
  cudaStream_t s = ctx.stream;
  if (fits32(n))
    binaryGradKernel<Op, uint32_t>
        <<<gridFor(n, kBlock), kBlock, 0, s>>>(a, b, dy, da, db, nest, n, op);
  else
    binaryGradKernel<Op, uint64_t>
        <<<gridFor(n, kBlock), kBlock, 0, s>>>(a, b, dy, da, db, nest, n, op);
  checkLaunch("pipec_cuda_k_binary_grad");
}

//===----------------------------------------------------------------------===//
// Compare, where
//===----------------------------------------------------------------------===//

template <class T>
__device__ __forceinline__ bool comparePred(int predicate, T a, T b) {
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

template <class T, typename I>
__global__ void compareKernel(const T *a, const T *b, int64_t *y, Nest<2> nest,
                              int64_t n, int predicate) {
  for (int64_t i = gridStart(); i < n; i += gridStep()) {
    int64_t off[2];
    nestOffsets(nest, I(i), off);
    y[i] = comparePred(predicate, a[off[0]], b[off[1]]) ? 1 : 0;
  }
}

template <class T>
void launchCompare(Context &ctx, const void *a, const void *b, int64_t *y,
                   const Nest<2> &nest, int64_t n, int predicate) {
  cudaStream_t s = ctx.stream;
  const T *ta = static_cast<const T *>(a), *tb = static_cast<const T *>(b);
  if (fits32(n))
    compareKernel<T, uint32_t>
        <<<gridFor(n, kBlock), kBlock, 0, s>>>(ta, tb, y, nest, n, predicate);
  else
    compareKernel<T, uint64_t>
        <<<gridFor(n, kBlock), kBlock, 0, s>>>(ta, tb, y, nest, n, predicate);
  checkLaunch("pipec_cuda_k_compare");
}

/// out[i] = C != 0 ? X : Y' (operands 0: C, 1: X, 2: Y').
template <class T, typename I>
__global__ void whereKernel(const int64_t *c, const T *x, const T *yIn, T *out,
                            Nest<3> nest, int64_t n) {
  for (int64_t i = gridStart(); i < n; i += gridStep()) {
    int64_t off[3];
    nestOffsets(nest, I(i), off);
    const T xv = x[off[1]], yv = yIn[off[2]];
    out[i] = c[off[0]] != 0 ? xv : yv;
  }
}

template <class T>
void launchWhere(Context &ctx, const int64_t *c, const void *x, const void *yIn,
                 void *out, const Nest<3> &nest, int64_t n) {
  cudaStream_t s = ctx.stream;
  const T *tx = static_cast<const T *>(x), *ty = static_cast<const T *>(yIn);
  T *to = static_cast<T *>(out);
  if (fits32(n))
    whereKernel<T, uint32_t>
        <<<gridFor(n, kBlock), kBlock, 0, s>>>(c, tx, ty, to, nest, n);
  else
    whereKernel<T, uint64_t>
        <<<gridFor(n, kBlock), kBlock, 0, s>>>(c, tx, ty, to, nest, n);
  checkLaunch("pipec_cuda_k_where");
}

//===----------------------------------------------------------------------===//
// Cast
//===----------------------------------------------------------------------===//

__global__ void castI64ToF32(const int64_t *x, float *y, int64_t n) {
  for (int64_t i = gridStart(); i < n; i += gridStep())
    y[i] = __ll2float_rn(x[i]);
}

/// Truncation toward zero; NaN and values outside int64 give INT64_MIN, and
/// so does every element when `valid` is false (an unknown direction).
__global__ void castF32ToI64(const float *x, int64_t *y, int64_t n,
                             bool valid) {
  const float limit = 9223372036854775808.0f; // 2^63
  for (int64_t i = gridStart(); i < n; i += gridStep()) {
    const float v = x[i];
    const bool fits = valid && v >= -limit && v < limit;
    y[i] = fits ? int64_t(truncf(v)) : kBadInt;
  }
}

//===----------------------------------------------------------------------===//
// Unary operators (cpu/unary.cpp)
//===----------------------------------------------------------------------===//

/// Forward of opcode Op. POW_SCALAR's exponent 1 is a copy on the host side.
template <int Op>
__device__ __forceinline__ float unaryFwd(float x, float alpha, float beta) {
  if constexpr (Op == PIPEC_UN_RELU) {
    return x < 0.0f ? 0.0f : x;
  } else if constexpr (Op == PIPEC_UN_TANH) {
    return rationalTanh(x);
  } else if constexpr (Op == PIPEC_UN_SIGMOID) {
    return divRn(1.0f, addRn(1.0f, expf(-x)));
  } else if constexpr (Op == PIPEC_UN_NEG) {
    return -x;
  } else if constexpr (Op == PIPEC_UN_SCALE) {
    return mulRn(alpha, x);
  } else if constexpr (Op == PIPEC_UN_EXP) {
    return expf(x);
  } else if constexpr (Op == PIPEC_UN_ERF) {
    return rationalErf(x);
  } else if constexpr (Op == PIPEC_UN_GELU) {
    return mulRn(mulRn(0.5f, x), addRn(1.0f, rationalErf(mulRn(x, kSqrtHalf))));
  } else if constexpr (Op == PIPEC_UN_GELU_TANH) {
    const float cube = mulRn(mulRn(mulRn(kGeluCubic, x), x), x);
    const float u = mulRn(kSqrt2OverPi, addRn(x, cube));
    return mulRn(mulRn(0.5f, x), addRn(1.0f, rationalTanh(u)));
  } else if constexpr (Op == PIPEC_UN_SQRT) {
    return __fsqrt_rn(x);
  } else if constexpr (Op == PIPEC_UN_LOG) {
    return logf(x);
  } else if constexpr (Op == PIPEC_UN_LEAKY_RELU) {
    const float hi = x < 0.0f ? 0.0f : x; // std::max(x, 0)
    const float lo = 0.0f < x ? 0.0f : x; // std::min(x, 0)
    return addRn(hi, mulRn(alpha, lo));
  } else if constexpr (Op == PIPEC_UN_CLIP) {
    const float m = x < alpha ? alpha : x; // std::max(x, alpha)
    return beta < m ? beta : m;            // std::min(m, beta)
  } else if constexpr (Op == PIPEC_UN_POW_SCALAR) {
    if (alpha == 2.0f)
      return mulRn(x, x);
    if (alpha == 3.0f)
      return mulRn(mulRn(x, x), x);
    return powf(x, alpha);
  } else if constexpr (Op == PIPEC_UN_ABS) {
    return fabsf(x);
  } else {
    static_assert(Op == PIPEC_UN_RECIPROCAL, "unhandled unary opcode");
    return divRn(1.0f, x);
  }
}

/// dX from T (forward output for TANH, SIGMOID, EXP, SQRT, RECIPROCAL, the
/// forward input otherwise) and dY. POW_SCALAR's exponents 0 and 1 are a
/// fill and a copy on the host side.
template <int Op>
__device__ __forceinline__ float unaryBwd(float t, float g, float alpha,
                                          float beta) {
  if constexpr (Op == PIPEC_UN_RELU) {
    return t > 0.0f ? g : 0.0f;
  } else if constexpr (Op == PIPEC_UN_TANH) {
    return mulRn(g, subRn(1.0f, mulRn(t, t)));
  } else if constexpr (Op == PIPEC_UN_SIGMOID) {
    return mulRn(g, mulRn(t, subRn(1.0f, t)));
  } else if constexpr (Op == PIPEC_UN_NEG) {
    return -g;
  } else if constexpr (Op == PIPEC_UN_SCALE) {
    return mulRn(alpha, g);
  } else if constexpr (Op == PIPEC_UN_EXP) {
    return mulRn(g, t);
  } else if constexpr (Op == PIPEC_UN_ERF) {
    return mulRn(g, mulRn(kTwoOverSqrtPi, polyExp(mulRn(-t, t))));
  } else if constexpr (Op == PIPEC_UN_GELU) {
    const float cdf =
        mulRn(0.5f, addRn(1.0f, rationalErf(mulRn(t, kSqrtHalf))));
    const float pdf = mulRn(kInvSqrt2Pi, polyExp(mulRn(mulRn(-0.5f, t), t)));
    return mulRn(g, addRn(cdf, mulRn(t, pdf)));
  } else if constexpr (Op == PIPEC_UN_GELU_TANH) {
    const float v2 = mulRn(t, t);
    const float th = rationalTanh(
        mulRn(kSqrt2OverPi, addRn(t, mulRn(mulRn(kGeluCubic, v2), t))));
    const float du =
        mulRn(kSqrt2OverPi, addRn(1.0f, mulRn(mulRn(3.0f, kGeluCubic), v2)));
    const float left = mulRn(0.5f, addRn(1.0f, th));
    const float right =
        mulRn(mulRn(mulRn(0.5f, t), subRn(1.0f, mulRn(th, th))), du);
    return mulRn(g, addRn(left, right));
  } else if constexpr (Op == PIPEC_UN_SQRT) {
    return divRn(mulRn(g, 0.5f), t);
  } else if constexpr (Op == PIPEC_UN_LOG) {
    return divRn(g, t);
  } else if constexpr (Op == PIPEC_UN_LEAKY_RELU) {
    return t > 0.0f ? g : mulRn(alpha, g);
  } else if constexpr (Op == PIPEC_UN_CLIP) {
    return (t > alpha && t < beta) ? g : 0.0f;
  } else if constexpr (Op == PIPEC_UN_POW_SCALAR) {
    if (alpha == 2.0f)
      return mulRn(g, mulRn(2.0f, t));
    if (alpha == 3.0f)
      return mulRn(g, mulRn(mulRn(3.0f, t), t));
    return mulRn(g, mulRn(alpha, powf(t, subRn(alpha, 1.0f))));
  } else if constexpr (Op == PIPEC_UN_ABS) {
    return t > 0.0f ? g : (t < 0.0f ? -g : 0.0f);
  } else {
    static_assert(Op == PIPEC_UN_RECIPROCAL, "unhandled unary opcode");
    return mulRn(-g, mulRn(t, t));
  }
}

/// Elements i < n4 * 4 go four at a time through 16-byte loads and stores
/// (the caller checks the pointers' alignment; n4 = 0 otherwise), the rest
/// one at a time. The arithmetic is per element either way.
template <int Op>
__global__ void unaryKernel(const float *x, float *y, int64_t n, int64_t n4,
                            float alpha, float beta) {
  for (int64_t i = gridStart(); i < n4; i += gridStep()) {
    const float4 v = reinterpret_cast<const float4 *>(x)[i];
    reinterpret_cast<float4 *>(y)[i] = make_float4(
        unaryFwd<Op>(v.x, alpha, beta), unaryFwd<Op>(v.y, alpha, beta),
        unaryFwd<Op>(v.z, alpha, beta), unaryFwd<Op>(v.w, alpha, beta));
  }
  for (int64_t i = n4 * 4 + gridStart(); i < n; i += gridStep())
    y[i] = unaryFwd<Op>(x[i], alpha, beta);
}

template <int Op>
__global__ void unaryGradKernel(const float *t, const float *dy, float *dx,
                                int64_t n, int64_t n4, float alpha,
                                float beta) {
  for (int64_t i = gridStart(); i < n4; i += gridStep()) {
    const float4 tv = reinterpret_cast<const float4 *>(t)[i];
    const float4 g = reinterpret_cast<const float4 *>(dy)[i];
    reinterpret_cast<float4 *>(dx)[i] =
        make_float4(unaryBwd<Op>(tv.x, g.x, alpha, beta),
                    unaryBwd<Op>(tv.y, g.y, alpha, beta),
                    unaryBwd<Op>(tv.z, g.z, alpha, beta),
                    unaryBwd<Op>(tv.w, g.w, alpha, beta));
  }
  for (int64_t i = n4 * 4 + gridStart(); i < n; i += gridStep()) {
    const float tv = t[i], g = dy[i];
    dx[i] = unaryBwd<Op>(tv, g, alpha, beta);
  }
}

/// alpha and beta of one call (cpu/unary.cpp's UnaryParams): reals == NULL
/// reads as 0, except SCALE (alpha 1) and CLIP ((-inf, +inf)); a NaN CLIP
/// bound is absent.
struct UnaryParams {
  float alpha = 0, beta = 0;
  UnaryParams(int64_t opcode, const double *reals) {
    if (opcode == PIPEC_UN_CLIP) {
      const float inf = std::numeric_limits<float>::infinity();
      alpha = -inf;
      beta = inf;
      if (reals && !std::isnan(reals[0]))
        alpha = float(reals[0]);
      if (reals && !std::isnan(reals[1]))
        beta = float(reals[1]);
      return;
    }
    alpha = reals ? float(reals[0]) : (opcode == PIPEC_UN_SCALE ? 1.0f : 0.0f);
  }
};

template <int Op>
void launchUnary(Context &ctx, const float *x, float *y, int64_t n,
                 const UnaryParams &p) {
  const int64_t n4 = vectorCount(n, {x, y});
  unaryKernel<Op><<<gridFor(n4 > 0 ? n4 : n, kBlock), kBlock, 0, ctx.stream>>>(
      x, y, n, n4, p.alpha, p.beta);
  checkLaunch("pipec_cuda_k_unary");
}

template <int Op>
void launchUnaryGrad(Context &ctx, const float *t, const float *dy, float *dx,
                     int64_t n, const UnaryParams &p) {
  const int64_t n4 = vectorCount(n, {t, dy, dx});
  unaryGradKernel<Op>
      <<<gridFor(n4 > 0 ? n4 : n, kBlock), kBlock, 0, ctx.stream>>>(
          t, dy, dx, n, n4, p.alpha, p.beta);
  checkLaunch("pipec_cuda_k_unary_grad");
}

/// dst = src (n floats) on the stream unless they are the same buffer.
void copyFloats(Context &ctx, const float *src, float *dst, int64_t n,
                const char *kernel) {
  if (src == dst || n <= 0)
    return;
  check(cudaMemcpyAsync(dst, src, size_t(n) * sizeof(float),
                        cudaMemcpyDeviceToDevice, ctx.stream),
        kernel);
}

} // namespace
} // namespace cuda
} // namespace pipec

using namespace pipec::cuda;

//===----------------------------------------------------------------------===//
// Entry points
//===----------------------------------------------------------------------===//

/// Calls `fn` with the functor of binary opcode `opcode` (POW squares when
/// `powSquare`: a broadcast exponent of 2, as the CPU kernel does); false
/// for an unknown opcode.
template <class Fn>
static bool withBinaryOp(int64_t opcode, bool powSquare, Fn &&fn) {
  switch (opcode) {
  case PIPEC_BIN_ADD:
    fn(AddOp());
    return true;
  case PIPEC_BIN_SUB:
    fn(SubOp());
    return true;
  case PIPEC_BIN_MUL:
    fn(MulOp());
    return true;
  case PIPEC_BIN_DIV:
    fn(DivOp());
    return true;
  case PIPEC_BIN_POW: {
    PowOp op;
    op.square = powSquare;
    fn(op);
    return true;
  }
  case PIPEC_BIN_MAX:
    fn(MaxOp());
    return true;
  case PIPEC_BIN_MIN:
    fn(MinOp());
    return true;
  default:
    return false;
  }
}

extern "C" void pipec_cuda_k_binary(pipec_kctx *kc, void *const *bufs,
                                    const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_binary");
  const float *a = static_cast<const float *>(bufs[0]);
  const float *b = static_cast<const float *>(bufs[1]);
  float *y = static_cast<float *>(bufs[2]);
  Nest<2> nest;
  if (!binaryNest(ints, nest, "pipec_cuda_k_binary"))
    return;
  const int64_t n = numelOf(nest);
  if (!withBinaryOp(ints[0], bIsScalar(ints),
                    [&](auto op) { launchBinary(ctx, a, b, y, nest, n, op); }))
    launchFill(ctx, y, n, kNaN, "pipec_cuda_k_binary");
}

extern "C" void pipec_cuda_k_binary_grad(pipec_kctx *kc, void *const *bufs,
                                         const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_binary_grad");
  const float *a = static_cast<const float *>(bufs[0]);
  const float *b = static_cast<const float *>(bufs[1]);
  const float *dy = static_cast<const float *>(bufs[2]);
  float *da = static_cast<float *>(bufs[3]);
  float *db = static_cast<float *>(bufs[4]);
  Nest<2> nest;
  if (!binaryNest(ints, nest, "pipec_cuda_k_binary_grad") || (!da && !db))
    return;
  const int64_t n = numelOf(nest);
  if (!withBinaryOp(ints[0], false, [&](auto op) {
        launchBinaryGrad(ctx, a, b, dy, da, db, nest, n, op);
      })) {
    if (da)
      launchFill(ctx, da, n, kNaN, "pipec_cuda_k_binary_grad");
    if (db)
      launchFill(ctx, db, n, kNaN, "pipec_cuda_k_binary_grad");
  }
}

extern "C" void pipec_cuda_k_compare(pipec_kctx *kc, void *const *bufs,
                                     const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_compare");
  int64_t *y = static_cast<int64_t *>(bufs[2]);
  Nest<2> nest;
  if (!binaryNest(ints, nest, "pipec_cuda_k_compare"))
    return;
  const int64_t n = numelOf(nest);
  const int64_t predicate = ints[0], rank = ints[1];
  if (predicate < PIPEC_CMP_EQ || predicate > PIPEC_CMP_GE) {
    launchFill(ctx, y, n, kBadInt, "pipec_cuda_k_compare");
    return;
  }
  if (ints[2 + 3 * rank] != 0)
    launchCompare<int64_t>(ctx, bufs[0], bufs[1], y, nest, n, int(predicate));
  else
    launchCompare<float>(ctx, bufs[0], bufs[1], y, nest, n, int(predicate));
}

extern "C" void pipec_cuda_k_where(pipec_kctx *kc, void *const *bufs,
                                   const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_where");
  const bool isInt = ints[0] != 0;
  const int64_t rank = ints[1];
  checkRank(rank, "pipec_cuda_k_where");
  const int64_t *dims = ints + 2;
  const int64_t *const strides[3] = {dims + rank, dims + 2 * rank,
                                     dims + 3 * rank};
  Nest<3> nest;
  if (!buildNest(rank, dims, strides, nest))
    return;
  const int64_t n = numelOf(nest);
  const int64_t *c = static_cast<const int64_t *>(bufs[0]);
  if (isInt)
    launchWhere<int64_t>(ctx, c, bufs[1], bufs[2], bufs[3], nest, n);
  else
    launchWhere<float>(ctx, c, bufs[1], bufs[2], bufs[3], nest, n);
}

extern "C" void pipec_cuda_k_cast(pipec_kctx *kc, void *const *bufs,
                                  const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_cast");
  const int64_t direction = ints[0], n = ints[1];
  if (n <= 0)
    return;
  cudaStream_t s = ctx.stream;
  // bfloat16 storage (--activations bf16), on gemm.cu's staging copies.
  if (direction == PIPEC_CAST_F32_TO_BF16) {
    toBf16Storage(ctx, static_cast<const float *>(bufs[0]), bufs[1], n,
                  "pipec_cuda_k_cast");
    return;
  }
  if (direction == PIPEC_CAST_BF16_TO_F32) {
    fromBf16Storage(ctx, bufs[0], static_cast<float *>(bufs[1]), n,
                    "pipec_cuda_k_cast");
    return;
  }
  if (direction == PIPEC_CAST_I64_TO_F32)
    castI64ToF32<<<gridFor(n, kBlock), kBlock, 0, s>>>(
        static_cast<const int64_t *>(bufs[0]), static_cast<float *>(bufs[1]),
        n);
  else
    castF32ToI64<<<gridFor(n, kBlock), kBlock, 0, s>>>(
        static_cast<const float *>(bufs[0]), static_cast<int64_t *>(bufs[1]), n,
        direction == PIPEC_CAST_F32_TO_I64);
  checkLaunch("pipec_cuda_k_cast");
}

extern "C" void pipec_cuda_k_unary(pipec_kctx *kc, void *const *bufs,
                                   const int64_t *ints, const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_unary");
  const float *x = static_cast<const float *>(bufs[0]);
  float *y = static_cast<float *>(bufs[1]);
  const int64_t opcode = ints[0], n = ints[1];
  if (n <= 0)
    return;
  const UnaryParams p(opcode, reals);
  switch (opcode) {
  case PIPEC_UN_COPY:
    copyFloats(ctx, x, y, n, "pipec_cuda_k_unary");
    break;
  case PIPEC_UN_RELU:
    launchUnary<PIPEC_UN_RELU>(ctx, x, y, n, p);
    break;
  case PIPEC_UN_TANH:
    launchUnary<PIPEC_UN_TANH>(ctx, x, y, n, p);
    break;
  case PIPEC_UN_SIGMOID:
    launchUnary<PIPEC_UN_SIGMOID>(ctx, x, y, n, p);
    break;
  case PIPEC_UN_NEG:
    launchUnary<PIPEC_UN_NEG>(ctx, x, y, n, p);
    break;
  case PIPEC_UN_SCALE:
    launchUnary<PIPEC_UN_SCALE>(ctx, x, y, n, p);
    break;
  case PIPEC_UN_EXP:
    launchUnary<PIPEC_UN_EXP>(ctx, x, y, n, p);
    break;
  case PIPEC_UN_ERF:
    launchUnary<PIPEC_UN_ERF>(ctx, x, y, n, p);
    break;
  case PIPEC_UN_GELU:
    launchUnary<PIPEC_UN_GELU>(ctx, x, y, n, p);
    break;
  case PIPEC_UN_GELU_TANH:
    launchUnary<PIPEC_UN_GELU_TANH>(ctx, x, y, n, p);
    break;
  case PIPEC_UN_SQRT:
    launchUnary<PIPEC_UN_SQRT>(ctx, x, y, n, p);
    break;
  case PIPEC_UN_LOG:
    launchUnary<PIPEC_UN_LOG>(ctx, x, y, n, p);
    break;
  case PIPEC_UN_LEAKY_RELU:
    launchUnary<PIPEC_UN_LEAKY_RELU>(ctx, x, y, n, p);
    break;
  case PIPEC_UN_CLIP:
    launchUnary<PIPEC_UN_CLIP>(ctx, x, y, n, p);
    break;
  case PIPEC_UN_POW_SCALAR:
    if (p.alpha == 1.0f)
      copyFloats(ctx, x, y, n, "pipec_cuda_k_unary");
    else
      launchUnary<PIPEC_UN_POW_SCALAR>(ctx, x, y, n, p);
    break;
  case PIPEC_UN_ABS:
    launchUnary<PIPEC_UN_ABS>(ctx, x, y, n, p);
    break;
  case PIPEC_UN_RECIPROCAL:
    launchUnary<PIPEC_UN_RECIPROCAL>(ctx, x, y, n, p);
    break;
  default:
    launchFill(ctx, y, n, kNaN, "pipec_cuda_k_unary");
    break;
  }
}

extern "C" void pipec_cuda_k_unary_grad(pipec_kctx *kc, void *const *bufs,
                                        const int64_t *ints,
                                        const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_unary_grad");
  const float *t = static_cast<const float *>(bufs[0]);
  const float *dy = static_cast<const float *>(bufs[1]);
  float *dx = static_cast<float *>(bufs[2]);
  const int64_t opcode = ints[0], n = ints[1];
  if (n <= 0)
    return;
  const UnaryParams p(opcode, reals);
  switch (opcode) {
  case PIPEC_UN_COPY:
    copyFloats(ctx, dy, dx, n, "pipec_cuda_k_unary_grad");
    break;
  case PIPEC_UN_RELU:
    launchUnaryGrad<PIPEC_UN_RELU>(ctx, t, dy, dx, n, p);
    break;
  case PIPEC_UN_TANH:
    launchUnaryGrad<PIPEC_UN_TANH>(ctx, t, dy, dx, n, p);
    break;
  case PIPEC_UN_SIGMOID:
    launchUnaryGrad<PIPEC_UN_SIGMOID>(ctx, t, dy, dx, n, p);
    break;
  case PIPEC_UN_NEG:
    launchUnaryGrad<PIPEC_UN_NEG>(ctx, t, dy, dx, n, p);
    break;
  case PIPEC_UN_SCALE:
    launchUnaryGrad<PIPEC_UN_SCALE>(ctx, t, dy, dx, n, p);
    break;
  case PIPEC_UN_EXP:
    launchUnaryGrad<PIPEC_UN_EXP>(ctx, t, dy, dx, n, p);
    break;
  case PIPEC_UN_ERF:
    launchUnaryGrad<PIPEC_UN_ERF>(ctx, t, dy, dx, n, p);
    break;
  case PIPEC_UN_GELU:
    launchUnaryGrad<PIPEC_UN_GELU>(ctx, t, dy, dx, n, p);
    break;
  case PIPEC_UN_GELU_TANH:
    launchUnaryGrad<PIPEC_UN_GELU_TANH>(ctx, t, dy, dx, n, p);
    break;
  case PIPEC_UN_SQRT:
    launchUnaryGrad<PIPEC_UN_SQRT>(ctx, t, dy, dx, n, p);
    break;
  case PIPEC_UN_LOG:
    launchUnaryGrad<PIPEC_UN_LOG>(ctx, t, dy, dx, n, p);
    break;
  case PIPEC_UN_LEAKY_RELU:
    launchUnaryGrad<PIPEC_UN_LEAKY_RELU>(ctx, t, dy, dx, n, p);
    break;
  case PIPEC_UN_CLIP:
    launchUnaryGrad<PIPEC_UN_CLIP>(ctx, t, dy, dx, n, p);
    break;
  case PIPEC_UN_POW_SCALAR:
    if (p.alpha == 0.0f)
      check(cudaMemsetAsync(dx, 0, size_t(n) * sizeof(float), ctx.stream),
            "pipec_cuda_k_unary_grad");
    else if (p.alpha == 1.0f)
      copyFloats(ctx, dy, dx, n, "pipec_cuda_k_unary_grad");
    else
      launchUnaryGrad<PIPEC_UN_POW_SCALAR>(ctx, t, dy, dx, n, p);
    break;
  case PIPEC_UN_ABS:
    launchUnaryGrad<PIPEC_UN_ABS>(ctx, t, dy, dx, n, p);
    break;
  case PIPEC_UN_RECIPROCAL:
    launchUnaryGrad<PIPEC_UN_RECIPROCAL>(ctx, t, dy, dx, n, p);
    break;
  default:
    launchFill(ctx, dx, n, kNaN, "pipec_cuda_k_unary_grad");
    break;
  }
}

extern "C" void pipec_cuda_k_copy(pipec_kctx *kc, void *const *bufs,
                                  const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_copy");
  const int64_t nbytes = ints[0];
  if (nbytes <= 0 || bufs[0] == bufs[1])
    return;
  check(cudaMemcpyAsync(bufs[1], bufs[0], size_t(nbytes),
                        cudaMemcpyDeviceToDevice, ctx.stream),
        "pipec_cuda_k_copy");
}

extern "C" void pipec_cuda_k_fill(pipec_kctx *kc, void *const *bufs,
                                  const int64_t *ints, const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_fill");
  const int64_t n = ints[0];
  const float value = reals ? float(reals[0]) : 0.0f;
  launchFill(ctx, static_cast<float *>(bufs[0]), n, value, "pipec_cuda_k_fill");
}

//===----------------------------------------------------------------------===//
// bfloat16 storage (pipec_cuda_k_*_bf16, bf16_storage.cpp)
//===----------------------------------------------------------------------===//

namespace pipec {
namespace cuda {
namespace {

/// An element as float32: bfloat16 widens exactly.
__device__ __forceinline__ float loadAs(const float *p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float loadAs(const __nv_bfloat16 *p, int64_t i) {
  return __bfloat162float(p[i]);
}
/// A result stored: bfloat16 rounds to nearest, ties to even (as the
/// casts do, gemm.cu's toBf16).
__device__ __forceinline__ void storeAs(float *p, int64_t i, float v) {
  p[i] = v;
}
__device__ __forceinline__ void storeAs(__nv_bfloat16 *p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

/// binaryKernel with each of A, B, Y float32 or bfloat16.
template <class Op, class A, class B, class Y>
__global__ void binaryStorageKernel(const A *a, const B *b, Y *y, Nest<2> nest,
                                    int64_t n, Op op) {
  for (int64_t i = gridStart(); i < n; i += gridStep()) {
    int64_t off[2];
    nestOffsets(nest, uint32_t(i), off);
    const float av = loadAs(a, off[0]), bv = loadAs(b, off[1]);
    storeAs(y, i, op(av, bv));
  }
}

template <int Op>
__global__ void unaryBf16Kernel(const __nv_bfloat16 *x, __nv_bfloat16 *y,
                                int64_t n, float alpha, float beta) {
  for (int64_t i = gridStart(); i < n; i += gridStep())
    storeAs(y, i, unaryFwd<Op>(loadAs(x, i), alpha, beta));
}

template <int Op>
__global__ void unaryGradBf16Kernel(const __nv_bfloat16 *t,
                                    const __nv_bfloat16 *dy, __nv_bfloat16 *dx,
                                    int64_t n, float alpha, float beta) {
  for (int64_t i = gridStart(); i < n; i += gridStep()) {
    const float tv = loadAs(t, i), g = loadAs(dy, i);
    storeAs(dx, i, unaryBwd<Op>(tv, g, alpha, beta));
  }
}

/// Calls `fn` with `p` as a float32 or a bfloat16 pointer.
template <class Fn> void asStorage(bool bf16, void *p, Fn &&fn) {
  if (bf16)
    fn(static_cast<__nv_bfloat16 *>(p));
  else
    fn(static_cast<float *>(p));
}

/// The opcodes whose unary kernels are their formula alone (COPY and
/// POW_SCALAR's special exponents go through the float32 twin).
using FormulaOps =
    std::integer_sequence<int, PIPEC_UN_RELU, PIPEC_UN_TANH, PIPEC_UN_SIGMOID,
                          PIPEC_UN_NEG, PIPEC_UN_SCALE, PIPEC_UN_EXP,
                          PIPEC_UN_ERF, PIPEC_UN_GELU, PIPEC_UN_GELU_TANH,
                          PIPEC_UN_SQRT, PIPEC_UN_LOG, PIPEC_UN_LEAKY_RELU,
                          PIPEC_UN_CLIP, PIPEC_UN_ABS, PIPEC_UN_RECIPROCAL>;

/// Calls `fn` with std::integral_constant<int, opcode> when `opcode` is one
/// of `Ops`; false otherwise.
template <int... Ops, class Fn>
bool withFormulaOp(int64_t opcode, std::integer_sequence<int, Ops...>,
                   Fn &&fn) {
  bool found = false;
  ((opcode == Ops && !found ? (fn(std::integral_constant<int, Ops>()),
                               found = true)
                            : false),
   ...);
  return found;
}

/// Whether every buffer of the call is bfloat16 (the only combination of
/// the unary kernels' ops, whose operands and result share one type).
bool allBf16(const rt::Bf16Buffers &st) {
  for (int i = 0; i < st.count; ++i)
    if (st.sizes[i] == 0)
      return false;
  return true;
}

} // namespace

bool binaryBf16(Context &ctx, void *const *bufs, const rt::Bf16Buffers &st,
                const double *) {
  const char *name = "pipec_cuda_k_binary_bf16";
  if (st.count != 3 || st.isOutput(0) || st.isOutput(1) || st.isInput(2))
    return false;
  Nest<2> nest;
  if (!binaryNest(st.rest, nest, name))
    return true;
  const int64_t n = numelOf(nest);
  if (!fits32(n))
    return false;
  cudaStream_t s = ctx.stream;
  return withBinaryOp(st.rest[0], bIsScalar(st.rest), [&](auto op) {
    asStorage(st.sizes[0] != 0, bufs[0], [&](auto *a) {
      asStorage(st.sizes[1] != 0, bufs[1], [&](auto *b) {
        asStorage(st.sizes[2] != 0, bufs[2], [&](auto *y) {
          binaryStorageKernel<<<gridFor(n, kBlock), kBlock, 0, s>>>(
              a, b, y, nest, n, op);
        });
      });
    });
    checkLaunch(name);
  });
}

bool unaryBf16(Context &ctx, void *const *bufs, const rt::Bf16Buffers &st,
               const double *reals) {
  const int64_t opcode = st.rest[0], n = st.rest[1];
  if (st.count != 2 || !allBf16(st) || !st.isInput(0) || !st.isOutput(1))
    return false;
  if (n <= 0)
    return true;
  const UnaryParams p(opcode, reals);
  const auto *x = static_cast<const __nv_bfloat16 *>(bufs[0]);
  auto *y = static_cast<__nv_bfloat16 *>(bufs[1]);
  return withFormulaOp(opcode, FormulaOps(), [&](auto op) {
    unaryBf16Kernel<decltype(op)::value>
        <<<gridFor(n, kBlock), kBlock, 0, ctx.stream>>>(x, y, n, p.alpha,
                                                         p.beta);
    checkLaunch("pipec_cuda_k_unary_bf16");
  });
}

bool unaryGradBf16(Context &ctx, void *const *bufs, const rt::Bf16Buffers &st,
                   const double *reals) {
  const int64_t opcode = st.rest[0], n = st.rest[1];
  if (st.count != 3 || !allBf16(st) || !st.isInput(0) || !st.isInput(1) ||
      !st.isOutput(2))
    return false;
  if (n <= 0)
    return true;
  const UnaryParams p(opcode, reals);
  const auto *t = static_cast<const __nv_bfloat16 *>(bufs[0]);
  const auto *dy = static_cast<const __nv_bfloat16 *>(bufs[1]);
  auto *dx = static_cast<__nv_bfloat16 *>(bufs[2]);
  return withFormulaOp(opcode, FormulaOps(), [&](auto op) {
    unaryGradBf16Kernel<decltype(op)::value>
        <<<gridFor(n, kBlock), kBlock, 0, ctx.stream>>>(t, dy, dx, n, p.alpha,
                                                         p.beta);
    checkLaunch("pipec_cuda_k_unary_grad_bf16");
  });
}

} // namespace cuda
} // namespace pipec
