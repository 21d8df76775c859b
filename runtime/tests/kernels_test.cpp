//===- kernels_test.cpp - Forward CPU kernels against references ----------===//
//
// Part of pipec. Checks every forward kernel of runtime/cpu against a naive
// double-precision reference written here, on seeded random shapes.
//
//===----------------------------------------------------------------------===//

#include "kernels_test_util.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

using namespace pipec_test;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

//===----------------------------------------------------------------------===//
// Gemm
//===----------------------------------------------------------------------===//

/// The shapes a Gemm bias C can have, as broadcast strides over [M, N].
enum class BiasKind { None, Scalar, One, Row, Column, Full, FullInPlace };

struct GemmCase {
  int64_t m, n, k;
  bool transA, transB;
  BiasKind bias;
  double alpha, beta;
};

void checkGemm(std::mt19937 &rng, const GemmCase &g) {
  SCOPED_TRACE(::testing::Message()
               << "M=" << g.m << " N=" << g.n << " K=" << g.k << " tA="
               << g.transA << " tB=" << g.transB << " bias=" << int(g.bias)
               << " alpha=" << g.alpha << " beta=" << g.beta);
  Floats a = randomFloats(rng, g.m * g.k), b = randomFloats(rng, g.k * g.n);
  int64_t cSize = 0, sM = 0, sN = 0;
  switch (g.bias) {
  case BiasKind::None:
    break;
  case BiasKind::Scalar: // rank-0 C
  case BiasKind::One:    // C of shape [1] (or [1, 1])
    cSize = 1;
    break;
  case BiasKind::Row: // [N]
    cSize = g.n, sN = 1;
    break;
  case BiasKind::Column: // [M, 1]
    cSize = g.m, sM = 1;
    break;
  case BiasKind::Full:
  case BiasKind::FullInPlace: // [M, N]
    cSize = g.m * g.n, sM = g.n, sN = 1;
    break;
  }
  Floats c = randomFloats(rng, cSize);
  Floats y(static_cast<size_t>(g.m * g.n), kNaN); // Must be overwritten.
  bool hasC = g.bias != BiasKind::None;
  const float *cPtr = hasC ? c.data() : nullptr;
  if (g.bias == BiasKind::FullInPlace) {
    y = c;
    cPtr = y.data();
  }
  gemm(a.data(), b.data(), cPtr, y.data(), g.m, g.n, g.k, g.transA, g.transB,
       hasC, sM, sN, g.alpha, g.beta);

  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      double acc = 0, mag = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        double av = g.transA ? a[p * g.m + i] : a[i * g.k + p];
        double bv = g.transB ? b[j * g.k + p] : b[p * g.n + j];
        acc += av * bv;
        mag += std::fabs(av * bv);
      }
      double ref = g.alpha * acc, refMag = std::fabs(g.alpha) * mag;
      if (hasC) {
        double cv = c[i * sM + j * sN];
        ref += g.beta * cv;
        refMag += std::fabs(g.beta * cv);
      }
      ASSERT_NEAR(y[i * g.n + j], ref, 1e-5 + 1e-5 * refMag)
          << "at (" << i << ", " << j << ")";
    }
  }
}

TEST(KernelGemm, MatchesReferenceOnRandomShapes) {
  std::mt19937 rng(1);
  const BiasKind biases[] = {
      BiasKind::None,   BiasKind::Scalar, BiasKind::One,        BiasKind::Row,
      BiasKind::Column, BiasKind::Full,   BiasKind::FullInPlace};
  for (int trial = 0; trial < 120; ++trial) {
    GemmCase g;
    bool large = trial % 10 == 0;
    g.m = randomInt(rng, 1, large ? 130 : 9);
    g.n = randomInt(rng, 1, large ? 130 : 9);
    g.k = randomInt(rng, 1, large ? 300 : 9);
    g.transA = trial & 1;
    g.transB = (trial >> 1) & 1;
    g.bias = biases[trial % 7];
    g.alpha = trial % 3 == 0 ? 1.0 : double(randomFloats(rng, 1, -2, 2)[0]);
    g.beta = trial % 4 == 0 ? 1.0 : double(randomFloats(rng, 1, -2, 2)[0]);
    checkGemm(rng, g);
  }
}

TEST(KernelGemm, ZeroSizes) {
  std::mt19937 rng(2);
  // M == 0 or N == 0: nothing to write, nothing read.
  gemm(nullptr, nullptr, nullptr, nullptr, 0, 5, 3, false, false, false, 0, 0,
       1, 1);
  gemm(nullptr, nullptr, nullptr, nullptr, 4, 0, 3, true, true, false, 0, 0, 1,
       1);
  // K == 0: Y = beta * C, or zeros without C.
  Floats c = randomFloats(rng, 3);
  Floats y(6, kNaN);
  gemm(nullptr, nullptr, c.data(), y.data(), 2, 3, 0, false, false, true, 0, 1,
       2.0, 0.5);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      EXPECT_FLOAT_EQ(y[i * 3 + j], 0.5f * c[j]);
  std::fill(y.begin(), y.end(), kNaN);
  gemm(nullptr, nullptr, nullptr, y.data(), 2, 3, 0, false, false, false, 0, 0,
       1, 1);
  for (float v : y)
    EXPECT_EQ(v, 0.0f);
}

TEST(KernelGemm, GeneralCStrides) {
  // C stored [N, M] and read transposed: C[i * 1 + j * M].
  std::mt19937 rng(14);
  int64_t m = 3, n = 4, k = 2;
  Floats a = randomFloats(rng, m * k), b = randomFloats(rng, k * n),
         c = randomFloats(rng, n * m), y(size_t(m * n), kNaN);
  gemm(a.data(), b.data(), c.data(), y.data(), m, n, k, false, false, true, 1,
       m, 1.0, 0.5);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0.5 * c[size_t(j * m + i)];
      for (int64_t p = 0; p < k; ++p)
        ref += double(a[size_t(i * k + p)]) * b[size_t(p * n + j)];
      EXPECT_NEAR(y[size_t(i * n + j)], ref, 1e-5);
    }
}

TEST(KernelGemm, BetaZeroIgnoresC) {
  // Like BLAS: beta == 0 means C is not read into the result.
  Floats a = {1, 2}, b = {3, 4}, c = {kNaN};
  Floats y(1, kNaN);
  gemm(a.data(), b.data(), c.data(), y.data(), 1, 1, 2, false, false, true, 0,
       0, 1.0, 0.0);
  EXPECT_FLOAT_EQ(y[0], 11.0f);
}

//===----------------------------------------------------------------------===//
// Batched matmul
//===----------------------------------------------------------------------===//

struct BmmCase {
  Dims batch, aBatch, bBatch; // aBatch / bBatch broadcast to batch
  int64_t m, n, k;
  bool transA, transB;
  double alpha;
};

void checkBatchMatmul(std::mt19937 &rng, const BmmCase &t) {
  SCOPED_TRACE(::testing::Message()
               << "batch=" << dimsToString(t.batch) << " a="
               << dimsToString(t.aBatch) << " b=" << dimsToString(t.bBatch)
               << " M=" << t.m << " N=" << t.n << " K=" << t.k
               << " tA=" << t.transA << " tB=" << t.transB);
  int64_t aMat = t.m * t.k, bMat = t.k * t.n, yMat = t.m * t.n;
  Floats a = randomFloats(rng, numel(t.aBatch) * aMat);
  Floats b = randomFloats(rng, numel(t.bBatch) * bMat);
  Floats y(static_cast<size_t>(numel(t.batch) * yMat), kNaN);
  Dims aStrides = broadcastStrides(t.aBatch, t.batch);
  Dims bStrides = broadcastStrides(t.bBatch, t.batch);
  for (int64_t &s : aStrides)
    s *= aMat;
  for (int64_t &s : bStrides)
    s *= bMat;
  batchMatmul(a.data(), b.data(), y.data(), t.batch, aStrides, bStrides, t.m,
              t.n, t.k, t.transA, t.transB, t.alpha);

  int64_t batchIndex = 0;
  forEachMultiIndex(t.batch, [&](const Dims &idx) {
    const float *ab = a.data() + dotIndex(idx, aStrides);
    const float *bb = b.data() + dotIndex(idx, bStrides);
    const float *yb = y.data() + batchIndex * yMat;
    for (int64_t i = 0; i < t.m; ++i)
      for (int64_t j = 0; j < t.n; ++j) {
        double acc = 0, mag = 0;
        for (int64_t p = 0; p < t.k; ++p) {
          double av = t.transA ? ab[p * t.m + i] : ab[i * t.k + p];
          double bv = t.transB ? bb[j * t.k + p] : bb[p * t.n + j];
          acc += av * bv;
          mag += std::fabs(av * bv);
        }
        ASSERT_NEAR(yb[i * t.n + j], t.alpha * acc,
                    1e-5 + 1e-5 * std::fabs(t.alpha) * mag)
            << "batch " << batchIndex << " at (" << i << ", " << j << ")";
      }
    ++batchIndex;
  });
}

TEST(KernelBatchMatmul, MatchesReferenceWithBatchBroadcasting) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 80; ++trial) {
    BmmCase t;
    int64_t nb = randomInt(rng, 0, 3);
    for (int64_t i = 0; i < nb; ++i)
      t.batch.push_back(randomInt(rng, 1, 3));
    t.aBatch = randomBroadcastShape(rng, t.batch);
    t.bBatch = randomBroadcastShape(rng, t.batch);
    t.m = randomInt(rng, 1, 7);
    t.n = randomInt(rng, 1, 7);
    t.k = randomInt(rng, 1, 7);
    t.transA = trial & 1;
    t.transB = (trial >> 1) & 1;
    t.alpha = trial % 3 ? 1.0 : -0.75;
    checkBatchMatmul(rng, t);
  }
}

TEST(KernelBatchMatmul, SharedRightOperand) {
  // [2, 3, M, K] x [K, N]: the single-GEMM fast path, and its neighbours
  // that must not take it (transposed A, broadcast A).
  std::mt19937 rng(4);
  for (bool transA : {false, true})
    for (bool transB : {false, true}) {
      checkBatchMatmul(rng, {{2, 3}, {2, 3}, {}, 5, 4, 6, transA, transB, 1.5});
      checkBatchMatmul(rng, {{2, 3}, {1, 3}, {}, 5, 4, 6, transA, transB, 1});
      checkBatchMatmul(rng, {{2, 3}, {}, {2, 3}, 5, 4, 6, transA, transB, 1});
    }
}

TEST(KernelBatchMatmul, RowsThroughLeadingDimensions) {
  // Operands read in place through a permutation (nn.matmul's perm_a /
  // perm_b): attention's [B, S, H, D] heads as [B, H, S, D] matrices, rows
  // H * D apart. The same product, bit for bit, as on dense copies; the
  // single-GEMM stack of A's rows too (B shared, A's rows evenly spaced).
  std::mt19937 rng(5);
  const int64_t B = 2, S = 5, H = 3, D = 4;
  Floats q = randomFloats(rng, B * S * H * D),
         k = randomFloats(rng, B * S * H * D);
  // Dense [B, H, S, D] copies.
  Floats qd(q.size()), kd(k.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const size_t from = size_t(((b * S + s) * H + h) * D + d);
          const size_t to = size_t(((b * H + h) * S + s) * D + d);
          qd[to] = q[from];
          kd[to] = k[from];
        }
  for (bool transB : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "transB " << transB);
    // Q K^T ([S, D] x [D, S]), or Q^T K ([D, S] x [S, D]) with transA.
    const bool transA = !transB;
    const int64_t m = transA ? D : S, n = transA ? D : S, kk = transA ? S : D;
    Floats want(size_t(B * H * m * n)), got(want.size(), kNaN);
    batchMatmul(qd.data(), kd.data(), want.data(), {B, H}, {H * S * D, S * D},
                {H * S * D, S * D}, m, n, kk, transA, transB, 0.5);
    batchMatmul(q.data(), k.data(), got.data(), {B, H}, {S * H * D, D},
                {S * H * D, D}, m, n, kk, transA, transB, 0.5, H * D, H * D);
    EXPECT_EQ(got, want);
  }
  // Rows of A strided, B shared: [B * S] rows of one head against [D, 3].
  Floats w = randomFloats(rng, D * 3);
  Floats want(size_t(B * S * 3)), got(want.size(), kNaN);
  Floats q0(size_t(B * S * D));
  for (int64_t r = 0; r < B * S; ++r)
    for (int64_t d = 0; d < D; ++d)
      q0[size_t(r * D + d)] = q[size_t(r * H * D + d)];
  batchMatmul(q0.data(), w.data(), want.data(), {B}, {S * D}, {0}, S, 3, D,
              false, false, 1);
  batchMatmul(q.data(), w.data(), got.data(), {B}, {S * H * D}, {0}, S, 3, D,
              false, false, 1, H * D, 0);
  EXPECT_EQ(got, want);
}

TEST(KernelBatchMatmul, ZeroSizes) {
  Floats y(12, kNaN);
  // Empty batch: nothing written.
  batchMatmul(nullptr, nullptr, y.data(), {2, 0}, {0, 0}, {0, 0}, 2, 3, 4,
              false, false, 1);
  EXPECT_TRUE(std::isnan(y[0]));
  // K == 0: zeros.
  batchMatmul(nullptr, nullptr, y.data(), {2}, {0}, {0}, 2, 3, 0, false, false,
              1);
  for (float v : y)
    EXPECT_EQ(v, 0.0f);
  // M == 0.
  batchMatmul(nullptr, nullptr, nullptr, {2}, {0}, {0}, 0, 3, 4, false, false,
              1);
}

//===----------------------------------------------------------------------===//
// Binary
//===----------------------------------------------------------------------===//

float applyBinary(int64_t op, float a, float b) {
  switch (op) {
  case PIPEC_BIN_ADD:
    return a + b;
  case PIPEC_BIN_SUB:
    return a - b;
  case PIPEC_BIN_MUL:
    return a * b;
  default:
    return a / b;
  }
}

/// Runs pipec_k_binary on operands of shapes aShape / bShape broadcast to
/// out and compares with an elementwise reference.
void checkBinary(std::mt19937 &rng, int64_t op, const Dims &out,
                 const Dims &aShape, const Dims &bShape) {
  SCOPED_TRACE(::testing::Message()
               << "op=" << op << " out=" << dimsToString(out) << " a="
               << dimsToString(aShape) << " b=" << dimsToString(bShape));
  Floats a = randomFloats(rng, numel(aShape));
  Floats b = randomFloats(rng, numel(bShape), 0.5f, 2.0f); // safe divisor
  Floats y(static_cast<size_t>(numel(out)), kNaN);
  Dims as = broadcastStrides(aShape, out), bs = broadcastStrides(bShape, out);
  binary(op, a.data(), b.data(), y.data(), out, as, bs);
  int64_t flat = 0;
  forEachMultiIndex(out, [&](const Dims &idx) {
    float ref = applyBinary(op, a[dotIndex(idx, as)], b[dotIndex(idx, bs)]);
    ASSERT_FLOAT_EQ(y[flat], ref) << "at flat index " << flat;
    ++flat;
  });
}

TEST(KernelBinary, BroadcastingMatchesReference) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 400; ++trial) {
    int64_t rank = randomInt(rng, 0, 8);
    Dims out;
    for (int64_t i = 0; i < rank; ++i)
      out.push_back(randomInt(rng, 1, rank > 5 ? 3 : 5));
    checkBinary(rng, trial % 4, out, randomBroadcastShape(rng, out),
                randomBroadcastShape(rng, out));
  }
}

TEST(KernelBinary, CommonPatterns) {
  std::mt19937 rng(6);
  for (int64_t op = 0; op < 4; ++op) {
    checkBinary(rng, op, {10007}, {10007}, {10007});   // same shape
    checkBinary(rng, op, {33, 65}, {33, 65}, {});      // tensor op scalar
    checkBinary(rng, op, {33, 65}, {}, {33, 65});      // scalar op tensor
    checkBinary(rng, op, {33, 65}, {33, 65}, {65});    // row (bias) broadcast
    checkBinary(rng, op, {33, 65}, {33, 1}, {33, 65}); // column broadcast
    checkBinary(rng, op, {4, 6, 5, 7}, {4, 6, 5, 7}, {1, 6, 1, 1}); // NCHW
    checkBinary(rng, op, {5, 1, 7}, {5, 1, 1}, {1, 1, 7});          // outer
    checkBinary(rng, op, {}, {}, {});                               // rank 0
    checkBinary(rng, op, {3, 0, 2}, {3, 0, 2}, {2});                // empty
  }
}

TEST(KernelBinary, OutputMayAliasNonBroadcastOperand) {
  std::mt19937 rng(7);
  Dims out = {17, 13};
  Floats a = randomFloats(rng, 17 * 13), b = randomFloats(rng, 13, 1, 2);
  Floats expected(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    expected[i] = a[i] / b[i % 13];
  binary(PIPEC_BIN_DIV, a.data(), b.data(), a.data(), out, {13, 1}, {0, 1});
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_FLOAT_EQ(a[i], expected[i]);

  Floats c = randomFloats(rng, 17), d = randomFloats(rng, 17 * 13);
  for (size_t i = 0; i < d.size(); ++i)
    expected[i] = c[i / 13] - d[i];
  binary(PIPEC_BIN_SUB, c.data(), d.data(), d.data(), out, {1, 0}, {13, 1});
  for (size_t i = 0; i < d.size(); ++i)
    ASSERT_FLOAT_EQ(d[i], expected[i]);
}

TEST(KernelBinary, GeneralStrides) {
  // A read through a transposed view: A is stored [5, 4], Y is [4, 5].
  std::mt19937 rng(8);
  Floats a = randomFloats(rng, 20), b = randomFloats(rng, 20);
  Floats y(20, kNaN);
  binary(PIPEC_BIN_MUL, a.data(), b.data(), y.data(), {4, 5}, {1, 4}, {5, 1});
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 5; ++j)
      ASSERT_FLOAT_EQ(y[i * 5 + j], a[j * 4 + i] * b[i * 5 + j]);
}

TEST(KernelBinary, UnknownOpcodePoisonsOutput) {
  Floats a = {1, 2}, b = {3, 4}, y = {0, 0};
  binary(99, a.data(), b.data(), y.data(), {2}, {1}, {1});
  EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[1]));
}

//===----------------------------------------------------------------------===//
// Unary
//===----------------------------------------------------------------------===//

double referenceUnary(int64_t op, double x, double alpha) {
  switch (op) {
  case PIPEC_UN_COPY:
    return x;
  case PIPEC_UN_RELU:
    return x > 0 ? x : 0;
  case PIPEC_UN_TANH:
    return std::tanh(x);
  case PIPEC_UN_SIGMOID:
    return 1 / (1 + std::exp(-x));
  case PIPEC_UN_NEG:
    return -x;
  case PIPEC_UN_SCALE:
    return alpha * x;
  default:
    return std::exp(x);
  }
}

TEST(KernelUnary, MatchesReference) {
  std::mt19937 rng(9);
  for (int64_t op = PIPEC_UN_COPY; op <= PIPEC_UN_EXP; ++op) {
    for (bool inPlace : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "op=" << op << " inPlace=" << inPlace);
      int64_t n = 1031;
      Floats x = randomFloats(rng, n, -6, 6);
      x[0] = 0;
      x[1] = -90; // sigmoid/exp underflow
      x[2] = 80;  // exp overflow to inf is fine; sigmoid must be 1
      Floats orig = x;
      Floats y(static_cast<size_t>(n), kNaN);
      float *out = inPlace ? x.data() : y.data();
      unary(op, x.data(), out, n, -1.5);
      for (int64_t i = 0; i < n; ++i) {
        double ref = referenceUnary(op, orig[i], -1.5);
        if (std::isinf(ref)) {
          EXPECT_EQ(out[i], float(ref));
          continue;
        }
        ASSERT_NEAR(out[i], ref, 1e-6 * std::max(1.0, std::fabs(ref)))
            << "x=" << orig[i];
      }
    }
  }
}

TEST(KernelUnary, ReluPropagatesNaNAndZeroSizeIsNoop) {
  Floats x = {kNaN, -1, 2}, y(3, 0);
  unary(PIPEC_UN_RELU, x.data(), y.data(), 3);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], 2.0f);
  unary(PIPEC_UN_TANH, nullptr, nullptr, 0);
  Floats z = {1};
  unary(42, x.data(), z.data(), 1);
  EXPECT_TRUE(std::isnan(z[0]));
}

//===----------------------------------------------------------------------===//
// Softmax
//===----------------------------------------------------------------------===//

TEST(KernelSoftmax, MatchesReferenceOnEveryAxis) {
  std::mt19937 rng(10);
  for (int trial = 0; trial < 60; ++trial) {
    int64_t rank = randomInt(rng, 1, 4);
    Dims dims;
    for (int64_t i = 0; i < rank; ++i)
      dims.push_back(randomInt(rng, 1, 6));
    if (trial % 10 == 0)
      dims.back() = 300; // inner spans more than one block
    int64_t axis = randomInt(rng, 0, rank - 1);
    int64_t outer = 1, dim = dims[axis], inner = 1;
    for (int64_t i = 0; i < axis; ++i)
      outer *= dims[i];
    for (int64_t i = axis + 1; i < rank; ++i)
      inner *= dims[i];
    bool isLog = trial & 1;
    bool inPlace = (trial >> 1) & 1;
    SCOPED_TRACE(::testing::Message()
                 << "dims=" << dimsToString(dims) << " axis=" << axis
                 << " log=" << isLog << " inPlace=" << inPlace);
    // Large offsets: a kernel that does not subtract the max overflows.
    Floats x = randomFloats(rng, numel(dims), -5, 5);
    for (float &v : x)
      v += 500;
    // A far outlier: exp overflows unless the true maximum is subtracted.
    if (trial % 3 == 0)
      x[size_t(randomInt(rng, 0, int64_t(x.size()) - 1))] += 120;
    Floats orig = x, y(x.size(), kNaN);
    float *out = inPlace ? x.data() : y.data();
    softmax(x.data(), out, outer, dim, inner, isLog);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < inner; ++j) {
        auto at = [&](int64_t d) { return (o * dim + d) * inner + j; };
        double mx = -1e300, sum = 0;
        for (int64_t d = 0; d < dim; ++d)
          mx = std::max(mx, double(orig[at(d)]));
        for (int64_t d = 0; d < dim; ++d)
          sum += std::exp(orig[at(d)] - mx);
        for (int64_t d = 0; d < dim; ++d) {
          double logp = orig[at(d)] - mx - std::log(sum);
          double ref = isLog ? logp : std::exp(logp);
          ASSERT_NEAR(out[at(d)], ref, isLog ? 2e-5 : 1e-6)
              << "at o=" << o << " d=" << d << " j=" << j;
        }
      }
  }
}

//===----------------------------------------------------------------------===//
// Reduce sum
//===----------------------------------------------------------------------===//

TEST(KernelReduceSum, MatchesReference) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    int64_t rank = randomInt(rng, 0, 6);
    Dims xDims;
    for (int64_t i = 0; i < rank; ++i)
      xDims.push_back(randomInt(rng, 1, rank > 4 ? 4 : 7));
    if (trial % 25 == 0 && rank > 0)
      xDims[size_t(randomInt(rng, 0, rank - 1))] = 1000;
    // Y is the broadcast-compatible shape: randomly keep each dim or reduce
    // it to 1, possibly dropping leading dims (they get stride 0 too).
    Dims yShape = randomBroadcastShape(rng, xDims);
    Dims yStrides = broadcastStrides(yShape, xDims);
    double scale = trial % 2 ? 1.0 : 0.25;
    SCOPED_TRACE(::testing::Message()
                 << "x=" << dimsToString(xDims) << " y=" << dimsToString(yShape)
                 << " scale=" << scale);
    Floats x = randomFloats(rng, numel(xDims));
    Floats y(static_cast<size_t>(numel(yShape)), kNaN); // must be overwritten
    reduceSum(x.data(), y.data(), xDims, yStrides, scale);
    std::vector<double> ref(y.size(), 0.0), mag(y.size(), 0.0);
    int64_t flat = 0;
    forEachMultiIndex(xDims, [&](const Dims &idx) {
      int64_t o = dotIndex(idx, yStrides);
      ref[size_t(o)] += x[size_t(flat)];
      mag[size_t(o)] += std::fabs(x[size_t(flat)]);
      ++flat;
    });
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(y[i], scale * ref[i], 1e-6 + 1e-6 * mag[i]) << "at " << i;
  }
}

TEST(KernelReduceSum, GeneralOutputStrides) {
  // Y need not be laid out in X's order: X [3, 4, 5] summed over dim 0 into
  // Y stored as [5, 4] (yStrides {0, 1, 4}).
  std::mt19937 rng(13);
  Floats x = randomFloats(rng, 60);
  Floats y(20, kNaN);
  reduceSum(x.data(), y.data(), {3, 4, 5}, {0, 1, 4}, 2.0);
  for (int64_t j = 0; j < 4; ++j)
    for (int64_t k = 0; k < 5; ++k) {
      double ref = 0;
      for (int64_t i = 0; i < 3; ++i)
        ref += x[size_t(i * 20 + j * 5 + k)];
      EXPECT_NEAR(y[size_t(k * 4 + j)], 2 * ref, 1e-5);
    }
}

TEST(KernelReduceSum, EmptyInputGivesZeros) {
  // X [0, 4] reduced over dim 0 onto Y [4]: zeros.
  Floats y(4, kNaN);
  reduceSum(nullptr, y.data(), {0, 4}, {0, 1}, 1.0);
  for (float v : y)
    EXPECT_EQ(v, 0.0f);
}

//===----------------------------------------------------------------------===//
// Transpose
//===----------------------------------------------------------------------===//

void checkTranspose(std::mt19937 &rng, const Dims &xDims, const Dims &perm) {
  SCOPED_TRACE(::testing::Message() << "x=" << dimsToString(xDims)
                                    << " perm=" << dimsToString(perm));
  Floats x = randomFloats(rng, numel(xDims));
  Floats y(x.size(), kNaN);
  transpose(x.data(), y.data(), xDims, perm);
  Dims yDims(perm.size());
  for (size_t i = 0; i < perm.size(); ++i)
    yDims[i] = xDims[size_t(perm[i])];
  Dims xStrides = rowMajorStrides(xDims);
  int64_t flat = 0;
  forEachMultiIndex(yDims, [&](const Dims &yIdx) {
    int64_t xOff = 0;
    for (size_t i = 0; i < perm.size(); ++i)
      xOff += yIdx[i] * xStrides[size_t(perm[i])];
    ASSERT_EQ(y[size_t(flat)], x[size_t(xOff)]) << "at flat " << flat;
    ++flat;
  });
}

TEST(KernelTranspose, MatchesReferenceOnRandomPermutations) {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 300; ++trial) {
    int64_t rank = randomInt(rng, 0, 6);
    Dims xDims, perm(static_cast<size_t>(rank));
    for (int64_t i = 0; i < rank; ++i)
      xDims.push_back(randomInt(rng, 1, rank > 4 ? 4 : 6));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    checkTranspose(rng, xDims, perm);
  }
  checkTranspose(rng, {300, 257}, {1, 0});           // tiled 2-D
  checkTranspose(rng, {3, 70, 45}, {0, 2, 1});       // batched 2-D
  checkTranspose(rng, {2, 40, 3, 50}, {3, 1, 0, 2}); // mixed
  checkTranspose(rng, {8, 16, 4}, {1, 0, 2});        // rows stay contiguous
  checkTranspose(rng, {0, 3}, {1, 0});               // empty
}

TEST(KernelTranspose, RejectsNonPermutation) {
  // A malformed perm poisons the output instead of reading out of bounds.
  Floats x = {1, 2, 3, 4, 5, 6}, y(6, 0.0f);
  transpose(x.data(), y.data(), {2, 3}, {1, 1});
  for (float v : y)
    EXPECT_TRUE(std::isnan(v));
  std::fill(y.begin(), y.end(), 0.0f);
  transpose(x.data(), y.data(), {2, 3}, {0, 2});
  for (float v : y)
    EXPECT_TRUE(std::isnan(v));
}

//===----------------------------------------------------------------------===//
// Copy, fill, SGD
//===----------------------------------------------------------------------===//

TEST(KernelCopyFillSgd, Semantics) {
  // Overlapping copy behaves like memmove.
  Floats v = {0, 1, 2, 3, 4, 5, 6, 7};
  {
    void *bufs[] = {v.data(), v.data() + 2};
    int64_t ints[] = {int64_t(5 * sizeof(float))};
    pipec_k_copy(kctx(), bufs, ints, nullptr);
  }
  EXPECT_EQ(v, (Floats{0, 1, 0, 1, 2, 3, 4, 7}));
  {
    void *bufs[] = {v.data() + 3, v.data()};
    int64_t ints[] = {int64_t(4 * sizeof(float))};
    pipec_k_copy(kctx(), bufs, ints, nullptr);
  }
  EXPECT_EQ(v, (Floats{1, 2, 3, 4, 2, 3, 4, 7}));
  {
    void *bufs[] = {nullptr, nullptr};
    int64_t ints[] = {0};
    pipec_k_copy(kctx(), bufs, ints, nullptr);
  }
  {
    void *bufs[] = {v.data() + 1};
    int64_t ints[] = {6};
    double reals[] = {-2.5};
    pipec_k_fill(kctx(), bufs, ints, reals);
  }
  EXPECT_EQ(v, (Floats{1, -2.5, -2.5, -2.5, -2.5, -2.5, -2.5, 7}));

  Floats w = {1, 2, 3}, g = {0.5f, -1, 2}, out(3);
  float lr = 0.1f;
  {
    void *bufs[] = {w.data(), g.data(), &lr, out.data()};
    int64_t ints[] = {3};
    pipec_k_sgd(kctx(), bufs, ints, nullptr);
  }
  for (int i = 0; i < 3; ++i)
    EXPECT_FLOAT_EQ(out[size_t(i)], w[size_t(i)] - 0.1f * g[size_t(i)]);
  {
    void *bufs[] = {w.data(), g.data(), &lr, w.data()}; // in place
    int64_t ints[] = {3};
    pipec_k_sgd(kctx(), bufs, ints, nullptr);
  }
  EXPECT_EQ(w, out);
}

//===----------------------------------------------------------------------===//
// Registry
//===----------------------------------------------------------------------===//

TEST(KernelRegistry, FindsEveryKernelByName) {
  struct {
    const char *name;
    pipec_kernel_fn fn;
  } expected[] = {
      {"pipec_k_gemm", &pipec_k_gemm},
      {"pipec_k_batch_matmul", &pipec_k_batch_matmul},
      {"pipec_k_binary", &pipec_k_binary},
      {"pipec_k_unary", &pipec_k_unary},
      {"pipec_k_unary_grad", &pipec_k_unary_grad},
      {"pipec_k_softmax", &pipec_k_softmax},
      {"pipec_k_softmax_grad", &pipec_k_softmax_grad},
      {"pipec_k_reduce_sum", &pipec_k_reduce_sum},
      {"pipec_k_transpose", &pipec_k_transpose},
      {"pipec_k_copy", &pipec_k_copy},
      {"pipec_k_fill", &pipec_k_fill},
      {"pipec_k_sce_loss", &pipec_k_sce_loss},
      {"pipec_k_sce_loss_grad", &pipec_k_sce_loss_grad},
      {"pipec_k_sgd", &pipec_k_sgd},
  };
  for (const auto &e : expected)
    EXPECT_EQ(pipec_rt_find_kernel(e.name), e.fn) << e.name;
  EXPECT_EQ(pipec_rt_find_kernel("pipec_k_nope"), nullptr);
  EXPECT_EQ(pipec_rt_find_kernel("pipec_k_gem"), nullptr);
  EXPECT_EQ(pipec_rt_find_kernel(""), nullptr);
  EXPECT_EQ(pipec_rt_find_kernel(nullptr), nullptr);
}

} // namespace
