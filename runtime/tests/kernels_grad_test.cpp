//===- kernels_grad_test.cpp - Backward kernels and adjoint identities ----===//
//
// Part of pipec. Checks every backward kernel against central finite
// differences of its forward kernel, and the adjoint identities the
// compiler's autodiff relies on (reduce_sum is the adjoint of broadcasting;
// GEMM / batched matmul with transposes give dA and dB; transpose by the
// inverse permutation is the adjoint of transpose).
//
//===----------------------------------------------------------------------===//

#include "kernels_test_util.h"

#include <algorithm>
#include <numeric>

using namespace pipec_test;

namespace {

/// L = sum(r * y) in double.
double project(const Floats &r, const Floats &y) { return dot(r, y); }

//===----------------------------------------------------------------------===//
// Unary backward
//===----------------------------------------------------------------------===//

TEST(KernelUnaryGrad, MatchesFiniteDifferences) {
  std::mt19937 rng(21);
  const int64_t ops[] = {PIPEC_UN_RELU, PIPEC_UN_TANH, PIPEC_UN_SIGMOID,
                         PIPEC_UN_COPY, PIPEC_UN_NEG,  PIPEC_UN_SCALE,
                         PIPEC_UN_EXP};
  const double alpha = 1.75;
  for (int64_t op : ops) {
    for (bool inPlace : {false, true}) {
      const int64_t n = 64;
      Floats x = randomFloats(rng, n, -2.5f, 2.5f);
      // ReLU is not differentiable at 0: keep the points away from it.
      for (float &v : x)
        if (std::fabs(v) < 0.05f)
          v = v < 0 ? -0.3f : 0.3f;
      Floats r = randomFloats(rng, n);
      Floats y(static_cast<size_t>(n));
      unary(op, x.data(), y.data(), n, alpha);
      // T is the forward input for RELU and the forward output otherwise.
      const Floats &t = op == PIPEC_UN_RELU ? x : y;
      Floats dx(static_cast<size_t>(n));
      Floats dy = r;
      float *out = inPlace ? dy.data() : dx.data(); // dX may alias dY
      unaryGrad(op, t.data(), dy.data(), out, n, alpha);
      Floats grad(out, out + n);
      auto loss = [&](const Floats &xs) {
        Floats ys(xs.size());
        unary(op, xs.data(), ys.data(), n, alpha);
        return project(r, ys);
      };
      expectGradMatchesFiniteDifferences(x, grad, loss, 1e-2, 2e-3, 2e-3,
                                         "unary op " + std::to_string(op));
    }
  }
}

TEST(KernelUnaryGrad, ReluGradIsZeroOnNonPositiveInputs) {
  Floats x = {-1, 0, 2}, dy = {5, 6, 7}, dx(3);
  unaryGrad(PIPEC_UN_RELU, x.data(), dy.data(), dx.data(), 3);
  EXPECT_EQ(dx, (Floats{0, 0, 7}));
}

//===----------------------------------------------------------------------===//
// Softmax backward
//===----------------------------------------------------------------------===//

TEST(KernelSoftmaxGrad, MatchesFiniteDifferences) {
  std::mt19937 rng(22);
  struct Shape {
    int64_t outer, dim, inner;
  } shapes[] = {{3, 5, 1}, {2, 4, 3}, {1, 7, 1}, {2, 1, 4}, {1, 3, 260}};
  for (const Shape &s : shapes) {
    for (bool isLog : {false, true}) {
      for (bool inPlace : {false, true}) {
        int64_t n = s.outer * s.dim * s.inner;
        Floats x = randomFloats(rng, n, -2, 2);
        Floats r = randomFloats(rng, n);
        Floats y(static_cast<size_t>(n));
        softmax(x.data(), y.data(), s.outer, s.dim, s.inner, isLog);
        Floats dy = r, dx(static_cast<size_t>(n));
        float *out = inPlace ? dy.data() : dx.data();
        softmaxGrad(y.data(), dy.data(), out, s.outer, s.dim, s.inner, isLog);
        Floats grad(out, out + n);
        auto loss = [&](const Floats &xs) {
          Floats ys(xs.size());
          softmax(xs.data(), ys.data(), s.outer, s.dim, s.inner, isLog);
          return project(r, ys);
        };
        std::string what = "softmax [" + std::to_string(s.outer) + "," +
                           std::to_string(s.dim) + "," +
                           std::to_string(s.inner) +
                           "] log=" + std::to_string(isLog);
        if (s.dim == 1) {
          // (Log-)softmax over one element is constant: a zero gradient.
          for (float g : grad)
            EXPECT_EQ(g, 0.0f) << what;
          continue;
        }
        expectGradMatchesFiniteDifferences(x, grad, loss, 1e-2, 2e-3, 2e-3,
                                           what);
      }
    }
  }
}

//===----------------------------------------------------------------------===//
// Broadcasting and its adjoint
//===----------------------------------------------------------------------===//

TEST(KernelAdjoint, ReduceSumIsAdjointOfBroadcast) {
  // <reduce_sum(dY), x> == <dY, broadcast(x)>, broadcast(x) = x + 0.
  std::mt19937 rng(23);
  for (int trial = 0; trial < 200; ++trial) {
    int64_t rank = randomInt(rng, 0, 6);
    Dims out;
    for (int64_t i = 0; i < rank; ++i)
      out.push_back(randomInt(rng, 1, 5));
    Dims xShape = randomBroadcastShape(rng, out);
    Dims xStrides = broadcastStrides(xShape, out);
    SCOPED_TRACE(::testing::Message() << "out=" << dimsToString(out)
                                      << " x=" << dimsToString(xShape));
    Floats x = randomFloats(rng, numel(xShape));
    Floats zero = {0.0f};
    Floats bx(static_cast<size_t>(numel(out)));
    binary(PIPEC_BIN_ADD, x.data(), zero.data(), bx.data(), out, xStrides,
           Dims(out.size(), 0));
    Floats dy = randomFloats(rng, numel(out));
    Floats rdy(x.size());
    reduceSum(dy.data(), rdy.data(), out, xStrides, 1.0);
    double lhs = dot(rdy, x), rhs = dot(dy, bx);
    double mag = 0;
    for (size_t i = 0; i < dy.size(); ++i)
      mag += std::fabs(double(dy[i]) * bx[i]);
    EXPECT_NEAR(lhs, rhs, 1e-6 * (1 + mag));
  }
}

TEST(KernelAdjoint, BroadcastMulBackwardMatchesFiniteDifferences) {
  // Y = A * B with both operands broadcast; the compiler's backward is
  // dA = reduce_sum(dY * B) onto A's shape (and symmetrically for B).
  std::mt19937 rng(24);
  double largest = 0;
  for (int trial = 0; trial < 30; ++trial) {
    int64_t rank = randomInt(rng, 1, 4);
    Dims out;
    for (int64_t i = 0; i < rank; ++i)
      out.push_back(randomInt(rng, 2, 4));
    Dims aShape = randomBroadcastShape(rng, out);
    Dims bShape = randomBroadcastShape(rng, out);
    Dims as = broadcastStrides(aShape, out), bs = broadcastStrides(bShape, out);
    Dims ys = rowMajorStrides(out);
    Floats a = randomFloats(rng, numel(aShape)),
           b = randomFloats(rng, numel(bShape));
    Floats r = randomFloats(rng, numel(out));
    Floats t(r.size()), da(a.size()), db(b.size());
    binary(PIPEC_BIN_MUL, r.data(), b.data(), t.data(), out, ys, bs);
    reduceSum(t.data(), da.data(), out, as, 1.0);
    binary(PIPEC_BIN_MUL, r.data(), a.data(), t.data(), out, ys, as);
    reduceSum(t.data(), db.data(), out, bs, 1.0);
    auto lossA = [&](const Floats &av) {
      Floats y(r.size());
      binary(PIPEC_BIN_MUL, av.data(), b.data(), y.data(), out, as, bs);
      return project(r, y);
    };
    auto lossB = [&](const Floats &bv) {
      Floats y(r.size());
      binary(PIPEC_BIN_MUL, a.data(), bv.data(), y.data(), out, as, bs);
      return project(r, y);
    };
    std::string what = "out=" + dimsToString(out) +
                       " a=" + dimsToString(aShape) +
                       " b=" + dimsToString(bShape);
    // Tiny random cases can have a legitimately tiny gradient; the check
    // that the test is not vacuous is over all trials (below).
    largest = std::max(
        largest, expectGradMatchesFiniteDifferences(a, da, lossA, 0.25, 1e-4,
                                                    1e-4, "dA " + what, 0.0));
    largest = std::max(
        largest, expectGradMatchesFiniteDifferences(b, db, lossB, 0.25, 1e-4,
                                                    1e-4, "dB " + what, 0.0));
  }
  EXPECT_GT(largest, 0.1);
}

TEST(KernelAdjoint, TransposeByInversePermutation) {
  std::mt19937 rng(25);
  for (int trial = 0; trial < 100; ++trial) {
    int64_t rank = randomInt(rng, 1, 5);
    Dims xDims, perm(static_cast<size_t>(rank)), inv(static_cast<size_t>(rank)),
        yDims(static_cast<size_t>(rank));
    for (int64_t i = 0; i < rank; ++i)
      xDims.push_back(randomInt(rng, 1, 6));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < rank; ++i) {
      inv[size_t(perm[size_t(i)])] = i;
      yDims[size_t(i)] = xDims[size_t(perm[size_t(i)])];
    }
    Floats x = randomFloats(rng, numel(xDims)),
           y = randomFloats(rng, numel(xDims));
    Floats tx(x.size()), ty(y.size());
    transpose(x.data(), tx.data(), xDims, perm);
    transpose(y.data(), ty.data(), yDims, inv);
    EXPECT_NEAR(dot(tx, y), dot(x, ty), 1e-9 * (1 + double(x.size())));
    // And the inverse permutation undoes the permutation exactly.
    Floats back(x.size());
    transpose(tx.data(), back.data(), yDims, inv);
    EXPECT_EQ(back, x);
  }
}

//===----------------------------------------------------------------------===//
// GEMM backward
//===----------------------------------------------------------------------===//

/// Stored shapes: A is [M, K] (or [K, M] with transA), B is [K, N] (or
/// [N, K] with transB). Returns dA and dB of L = sum(r * Y) computed by
/// pipec_k_gemm with the transposes the compiler emits.
void gemmBackward(const Floats &a, const Floats &b, const Floats &dy, int64_t m,
                  int64_t n, int64_t k, bool tA, bool tB, double alpha,
                  Floats &da, Floats &db) {
  da.assign(static_cast<size_t>(m * k), 0);
  db.assign(static_cast<size_t>(k * n), 0);
  if (!tA) // dA[M,K] = dY[M,N] . op(B)^T
    gemm(dy.data(), b.data(), nullptr, da.data(), m, k, n, false, !tB, false, 0,
         0, alpha, 0);
  else // dA[K,M] = op(B)[K,N] . dY^T
    gemm(b.data(), dy.data(), nullptr, da.data(), k, m, n, tB, true, false, 0,
         0, alpha, 0);
  if (!tB) // dB[K,N] = op(A)^T . dY
    gemm(a.data(), dy.data(), nullptr, db.data(), k, n, m, !tA, false, false, 0,
         0, alpha, 0);
  else // dB[N,K] = dY^T . op(A)
    gemm(dy.data(), a.data(), nullptr, db.data(), n, k, m, true, tA, false, 0,
         0, alpha, 0);
}

TEST(KernelAdjoint, GemmBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(26);
  double largest = 0;
  for (int trial = 0; trial < 24; ++trial) {
    int64_t m = randomInt(rng, 1, 5), n = randomInt(rng, 1, 5),
            k = randomInt(rng, 1, 5);
    bool tA = trial & 1, tB = (trial >> 1) & 1;
    double alpha = trial % 3 == 0 ? 1.0 : 0.6;
    double beta = trial % 2 == 0 ? 1.0 : -1.3;
    // C patterns: scalar, [N], [M, 1], [M, N].
    int pattern = (trial >> 2) % 4;
    int64_t cSize = 1, sM = 0, sN = 0;
    if (pattern == 1)
      cSize = n, sN = 1;
    else if (pattern == 2)
      cSize = m, sM = 1;
    else if (pattern == 3)
      cSize = m * n, sM = n, sN = 1;
    std::string what = "M=" + std::to_string(m) + " N=" + std::to_string(n) +
                       " K=" + std::to_string(k) + " tA=" + std::to_string(tA) +
                       " tB=" + std::to_string(tB) +
                       " C=" + std::to_string(pattern);
    Floats a = randomFloats(rng, m * k), b = randomFloats(rng, k * n),
           c = randomFloats(rng, cSize), r = randomFloats(rng, m * n);
    auto forward = [&](const Floats &av, const Floats &bv, const Floats &cv) {
      Floats y(static_cast<size_t>(m * n));
      gemm(av.data(), bv.data(), cv.data(), y.data(), m, n, k, tA, tB, true, sM,
           sN, alpha, beta);
      return project(r, y);
    };
    Floats da, db;
    gemmBackward(a, b, r, m, n, k, tA, tB, alpha, da, db);
    // dC = beta * reduce_sum(dY) onto C's broadcast pattern.
    Floats dc(c.size());
    reduceSum(r.data(), dc.data(), {m, n}, {sM, sN}, beta);

    // Y is linear in each operand: a large step is exact up to rounding.
    largest = std::max(
        largest, expectGradMatchesFiniteDifferences(
                     a, da, [&](const Floats &v) { return forward(v, b, c); },
                     0.25, 1e-4, 1e-4, "dA " + what, 0.0));
    largest = std::max(
        largest, expectGradMatchesFiniteDifferences(
                     b, db, [&](const Floats &v) { return forward(a, v, c); },
                     0.25, 1e-4, 1e-4, "dB " + what, 0.0));
    largest = std::max(
        largest, expectGradMatchesFiniteDifferences(
                     c, dc, [&](const Floats &v) { return forward(a, b, v); },
                     0.25, 1e-4, 1e-4, "dC " + what, 0.0));
  }
  EXPECT_GT(largest, 0.1);
}

TEST(KernelAdjoint, BatchMatmulBackwardMatchesFiniteDifferences) {
  // dA = reduce_sum over A's broadcast batch dims of the per-batch
  // products, computed with pipec_k_batch_matmul then pipec_k_reduce_sum.
  std::mt19937 rng(27);
  double largest = 0;
  for (int trial = 0; trial < 16; ++trial) {
    Dims batch = {randomInt(rng, 1, 3), randomInt(rng, 2, 3)};
    Dims aBatch = randomBroadcastShape(rng, batch);
    Dims bBatch = randomBroadcastShape(rng, batch);
    int64_t m = randomInt(rng, 1, 4), n = randomInt(rng, 1, 4),
            k = randomInt(rng, 1, 4);
    bool tA = trial & 1, tB = (trial >> 1) & 1;
    double alpha = trial % 3 == 0 ? 1.0 : 0.8;
    int64_t aMat = m * k, bMat = k * n, yMat = m * n;
    Dims aS = broadcastStrides(aBatch, batch),
         bS = broadcastStrides(bBatch, batch);
    for (int64_t &s : aS)
      s *= aMat;
    for (int64_t &s : bS)
      s *= bMat;
    Dims yS = rowMajorStrides(batch);
    for (int64_t &s : yS)
      s *= yMat;
    int64_t nBatch = numel(batch);
    Floats a = randomFloats(rng, numel(aBatch) * aMat),
           b = randomFloats(rng, numel(bBatch) * bMat),
           r = randomFloats(rng, nBatch * yMat);
    std::string what =
        "batch=" + dimsToString(batch) + " a=" + dimsToString(aBatch) +
        " b=" + dimsToString(bBatch) + " tA=" + std::to_string(tA) +
        " tB=" + std::to_string(tB);

    // Per-batch adjoints as full [batch..., rows, cols] tensors.
    Floats daFull(static_cast<size_t>(nBatch * aMat)),
        dbFull(static_cast<size_t>(nBatch * bMat));
    if (!tA) // dA = dY . op(B)^T : [M,K]
      batchMatmul(r.data(), b.data(), daFull.data(), batch, yS, bS, m, k, n,
                  false, !tB, alpha);
    else // dA = op(B) . dY^T : [K,M]
      batchMatmul(b.data(), r.data(), daFull.data(), batch, bS, yS, k, m, n, tB,
                  true, alpha);
    if (!tB) // dB = op(A)^T . dY : [K,N]
      batchMatmul(a.data(), r.data(), dbFull.data(), batch, aS, yS, k, n, m,
                  !tA, false, alpha);
    else // dB = dY^T . op(A) : [N,K]
      batchMatmul(r.data(), a.data(), dbFull.data(), batch, yS, aS, n, k, m,
                  true, tA, alpha);
    // Sum over broadcast batch dims: X = [batch..., rows, cols], Y strides
    // are the operand's own (0 along broadcast batch dims).
    auto reduceOnto = [&](const Floats &full, const Dims &opStrides,
                          int64_t rows, int64_t cols, int64_t size) {
      Dims xDims = batch, yStrides = opStrides;
      xDims.insert(xDims.end(), {rows, cols});
      yStrides.insert(yStrides.end(), {cols, 1});
      Floats out(static_cast<size_t>(size));
      reduceSum(full.data(), out.data(), xDims, yStrides, 1.0);
      return out;
    };
    Floats da =
        reduceOnto(daFull, aS, tA ? k : m, tA ? m : k, int64_t(a.size()));
    Floats db =
        reduceOnto(dbFull, bS, tB ? n : k, tB ? k : n, int64_t(b.size()));

    auto forward = [&](const Floats &av, const Floats &bv) {
      Floats y(static_cast<size_t>(nBatch * yMat));
      batchMatmul(av.data(), bv.data(), y.data(), batch, aS, bS, m, n, k, tA,
                  tB, alpha);
      return project(r, y);
    };
    largest = std::max(
        largest, expectGradMatchesFiniteDifferences(
                     a, da, [&](const Floats &v) { return forward(v, b); },
                     0.25, 1e-4, 1e-4, "dA " + what, 0.0));
    largest = std::max(
        largest, expectGradMatchesFiniteDifferences(
                     b, db, [&](const Floats &v) { return forward(a, v); },
                     0.25, 1e-4, 1e-4, "dB " + what, 0.0));
  }
  EXPECT_GT(largest, 0.1);
}

} // namespace
