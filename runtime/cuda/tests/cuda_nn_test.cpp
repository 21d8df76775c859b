//===- cuda_nn_test.cpp - CUDA GEMM, softmax, norm, loss, optimizers ------===//
//
// Part of pipec's GPU tests (ctest label `gpu`). Runs the CUDA twins of
// gemm, batch_matmul, softmax(_grad), layernorm(_grad), sce_loss(_grad),
// sgd, momentum, adam and adagrad against the CPU kernels on the same
// inputs (cuda_test_util.h): every transpose and bias-broadcast form of
// Gemm, broadcast and multi-dimensional batches, both launch shapes of the
// row-wise kernels (one block per row, one thread per row), in-place
// outputs, and the optimizers at several update counts T.
//
//===----------------------------------------------------------------------===//

#include "cuda_rt.h"
#include "cuda_test_util.h"

#include "pipec_rt.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

using namespace pipec::cudatest;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

//===----------------------------------------------------------------------===//
// Gemm
//===----------------------------------------------------------------------===//

/// How Gemm's C is given.
enum class Bias { None, Full, Row, Column, Scalar, Transposed };

/// Gemm of random A, B (and C) against the CPU; `cFill` (if not 0) is the
/// value of every C element instead of random ones.
void gemmCase(int64_t m, int64_t n, int64_t k, bool ta, bool tb, Bias bias,
              double alpha, double beta, double rtol = 1e-5, double atol = 1e-6,
              float cFill = 0, unsigned seed = 1) {
  SCOPED_TRACE(::testing::Message()
               << "gemm M=" << m << " N=" << n << " K=" << k << " tA=" << ta
               << " tB=" << tb << " bias=" << int(bias) << " alpha=" << alpha
               << " beta=" << beta);
  int64_t cCount = 0, sm = 0, sn = 0;
  switch (bias) {
  case Bias::None:
    break;
  case Bias::Full:
    cCount = m * n, sm = n, sn = 1;
    break;
  case Bias::Row: // C is [N], broadcast over the rows
    cCount = n, sm = 0, sn = 1;
    break;
  case Bias::Column: // C is [M, 1]
    cCount = m, sm = 1, sn = 0;
    break;
  case Bias::Scalar:
    cCount = 1, sm = 0, sn = 0;
    break;
  case Bias::Transposed: // C read through strides (1, M)
    cCount = m * n, sm = 1, sn = m;
    break;
  }
  std::vector<float> c = randf(size_t(cCount), -1, 1, seed + 2);
  if (cFill != 0)
    c.assign(c.size(), cFill);
  expectSameAsCpu("gemm",
                  {in(randf(size_t(m * k), -1, 1, seed)),
                   in(randf(size_t(k * n), -1, 1, seed + 1)),
                   bias == Bias::None ? null() : in(c), out(size_t(m * n))},
                  {m, n, k, ta, tb, bias != Bias::None, sm, sn}, {alpha, beta},
                  rtol, atol);
}

// ABI 3: a CUDA kernel works in the CUDA context it is given and refuses
// anything else before touching the GPU (so this runs without one).
TEST(CudaKernelContext, RefusesContextsThatAreNotLiveCudaOnes) {
  float a = 1, b = 2, y = 0;
  void *bufs[4] = {&a, &b, nullptr, &y};
  const int64_t ints[8] = {1, 1, 1, 0, 0, 0, 0, 0};
  const double reals[2] = {1, 0};
  pipec::cuda::Context unopened;
  const std::pair<pipec_kctx *, const char *> cases[] = {
      {nullptr, "pipec_cuda_k_gemm: no kernel context"},
      {cpuContext(), "a CUDA kernel needs a CUDA context"},
      {&unopened, "called before its CUDA context was initialised"}};
  for (const auto &[kc, want] : cases) {
    try {
      pipec_cuda_k_gemm(kc, bufs, ints, reals);
      ADD_FAILURE() << "accepted: " << want;
    } catch (const std::exception &e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(y, 0.0f);
}

TEST(CudaGemm, AllTransposeCombinations) {
  PIPEC_REQUIRE_GPU();
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      gemmCase(37, 53, 29, ta, tb, Bias::None, 1, 0);
      gemmCase(37, 53, 29, ta, tb, Bias::Full, 1, 1);
      gemmCase(5, 3, 70, ta, tb, Bias::Row, 0.5, 2);
      gemmCase(1, 1, 1, ta, tb, Bias::None, 1, 0);
    }
}

TEST(CudaGemm, BiasBroadcastForms) {
  PIPEC_REQUIRE_GPU();
  for (Bias bias :
       {Bias::Full, Bias::Row, Bias::Column, Bias::Scalar, Bias::Transposed}) {
    gemmCase(37, 53, 29, false, false, bias, 1, 1);
    gemmCase(37, 53, 29, true, false, bias, -0.75, 0.5);
    gemmCase(19, 8, 31, false, true, bias, 2, -3);
  }
}

TEST(CudaGemm, BetaZeroIgnoresC) {
  PIPEC_REQUIRE_GPU();
  // beta == 0 must not read C: a NaN there must not reach Y.
  gemmCase(37, 53, 29, false, false, Bias::Full, 1, 0, 1e-5, 1e-6, kNaN);
  gemmCase(16, 9, 4, true, true, Bias::Row, 0.5, 0, 1e-5, 1e-6, kNaN);
  // hasC with random C and beta 0: Y is overwritten with alpha A B.
  gemmCase(16, 9, 4, false, false, Bias::Scalar, 1.5, 0);
}

TEST(CudaGemm, DegenerateSizes) {
  PIPEC_REQUIRE_GPU();
  // K == 0: Y = beta C, or zeros without C.
  expectSameAsCpu("gemm", {in({}), in({}), in(randf(12)), out(12)},
                  {3, 4, 0, 0, 0, 1, 4, 1}, {1.0, 2.5});
  expectSameAsCpu("gemm", {in({}), in({}), null(), out(12)},
                  {3, 4, 0, 0, 0, 0, 0, 0}, {1.0, 0.0});
  // alpha == 0: op(A) op(B) is zero.
  gemmCase(7, 5, 3, false, false, Bias::Column, 0, 1);
  gemmCase(7, 5, 3, false, false, Bias::None, 0, 1);
  // Empty Y: nothing written (the output keeps its content on both sides).
  expectSameAsCpu("gemm", {in(randf(6)), in({}), null(), out(1)},
                  {3, 0, 2, 0, 0, 0, 0, 0}, {1.0, 0.0});
}

TEST(CudaGemm, InPlaceBias) {
  PIPEC_REQUIRE_GPU();
  // Y is C itself (strides N, 1): Y = alpha A B + beta Y.
  for (int ta = 0; ta < 2; ++ta)
    expectSameAsCpu("gemm",
                    {in(randf(37 * 29, -1, 1, 5)), in(randf(29 * 53, -1, 1, 6)),
                     in(randf(37 * 53, -1, 1, 7)), alias(2)},
                    {37, 53, 29, ta, 0, 1, 53, 1}, {0.5, 1.5});
}

TEST(CudaGemm, Large) {
  PIPEC_REQUIRE_GPU();
  // K = 384: cuBLAS and OpenBLAS add the 384 products in different orders
  // (blocking, split-K), so float results differ by a few ulp of the
  // partial sums (|partial| up to ~10 here), which for outputs near zero
  // exceeds 1e-5 relative + 1e-6 absolute; 1e-4 bounds it with margin.
  gemmCase(256, 512, 384, false, false, Bias::Row, 1, 1, 1e-4, 1e-4);
  gemmCase(256, 512, 384, true, true, Bias::Full, 0.5, 2, 1e-4, 1e-4);
  gemmCase(256, 512, 384, false, true, Bias::None, 1, 0, 1e-4, 1e-4);
}

//===----------------------------------------------------------------------===//
// Batched matmul
//===----------------------------------------------------------------------===//

/// batch_matmul with batch dims `dims` and batch strides `as` / `bs` (0 for
/// a broadcast dimension). `aCount` / `bCount` are the operands' sizes.
void bmmCase(std::vector<int64_t> dims, std::vector<int64_t> as,
             std::vector<int64_t> bs, int64_t aCount, int64_t bCount, int64_t m,
             int64_t n, int64_t k, bool ta, bool tb, double alpha = 1,
             double rtol = 1e-5, double atol = 1e-6) {
  SCOPED_TRACE(::testing::Message()
               << "batch_matmul nb=" << dims.size() << " M=" << m << " N=" << n
               << " K=" << k << " tA=" << ta << " tB=" << tb);
  int64_t batches = 1;
  for (int64_t d : dims)
    batches *= d;
  std::vector<int64_t> ints = {int64_t(dims.size())};
  ints.insert(ints.end(), dims.begin(), dims.end());
  ints.insert(ints.end(), as.begin(), as.end());
  ints.insert(ints.end(), bs.begin(), bs.end());
  ints.insert(ints.end(), {m, n, k, ta, tb, 0, 0});
  expectSameAsCpu("batch_matmul",
                  {in(randf(size_t(aCount), -1, 1, 11)),
                   in(randf(size_t(bCount), -1, 1, 12)),
                   out(size_t(batches * m * n))},
                  ints, {alpha}, rtol, atol);
}

TEST(CudaBatchMatmul, OneBatchDim) {
  PIPEC_REQUIRE_GPU();
  const int64_t m = 13, n = 21, k = 17, b = 5;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      bmmCase({b}, {m * k}, {k * n}, b * m * k, b * k * n, m, n, k, ta, tb);
      // B broadcast (stride 0): one GEMM of b*M rows when A is not
      // transposed, a strided-batched call with stride 0 otherwise.
      bmmCase({b}, {m * k}, {0}, b * m * k, k * n, m, n, k, ta, tb, 0.5);
      // A broadcast.
      bmmCase({b}, {0}, {k * n}, m * k, b * k * n, m, n, k, ta, tb, -2);
    }
  // No batch dimension at all, and unit batch dims only.
  bmmCase({}, {}, {}, m * k, k * n, m, n, k, false, false);
  bmmCase({1, 1}, {0, 0}, {0, 0}, m * k, k * n, m, n, k, true, false);
}

// Operands read in place through a permutation (nn.matmul's perm_a /
// perm_b): attention's [B, S, H, D] heads as [B, H, S, D] matrices, rows
// H * D apart (lda, ldb), in float32 and bf16 (D = 4: the padded path; D =
// 8, H = 2: rows 16 apart, the plain one).
TEST(CudaBatchMatmul, RowsThroughLeadingDimensions) {
  PIPEC_REQUIRE_GPU();
  pipec::cuda::Context &ctx = pipec::cuda::context(gpuContext(), "test");
  const bool gatherWas = ctx.batchGather;
  ctx.batchGather = true; // (whatever PIPEC_BATCH_GATHER says)
  for (bool bf16 : {false, true})
    for (const auto &[H, D] : {std::pair<int64_t, int64_t>{3, 4}, {2, 8}})
      for (const int64_t B : {2, 4}) {
        SCOPED_TRACE(::testing::Message()
                     << (bf16 ? "bf16" : "float32") << " B " << B << " H " << H
                     << " D " << D);
        std::optional<Bf16Matmuls> rounding;
        if (bf16)
          rounding.emplace();
        const int64_t S = 5, n = B * S * H * D;
        // The heads' batch dimensions do not merge: in float32 a loop of
        // at least 4 calls becomes one call over dense copies (gemm.cu,
        // gatheredProduct); bf16, and 2 calls, keep the loop.
        const int64_t gathers = !bf16 && B >= 4 ? 1 : 0;
        for (bool transB : {true, false}) {
          const bool transA = !transB;
          const int64_t m = transA ? D : S, nn = transA ? D : S,
                        k = transA ? S : D;
          const int64_t gathered0 = ctx.batchGathered;
          expectSameAsCpu("batch_matmul",
                          {in(randf(size_t(n), -1, 1, 91)),
                           in(randf(size_t(n), -1, 1, 92)),
                           out(size_t(B * H * m * nn))},
                          {2, B, H, S * H * D, D, S * H * D, D, m, nn, k,
                           transA, transB, H * D, H * D},
                          {0.5}, 1e-5, 1e-5);
          EXPECT_EQ(ctx.batchGathered - gathered0, gathers);
        }
        // Only B read through the heads' permutation, A dense.
        const int64_t gathered0 = ctx.batchGathered;
        expectSameAsCpu(
            "batch_matmul",
            {in(randf(size_t(B * H * S * S), -1, 1, 95)),
             in(randf(size_t(n), -1, 1, 96)), out(size_t(B * H * S * D))},
            {2, B, H, H * S * S, S * S, S * H * D, D, S, D, S, 0, 0, 0, H * D},
            {1.0}, 1e-5, 1e-5);
        EXPECT_EQ(ctx.batchGathered - gathered0, gathers);
        // A's rows strided against a shared B: one GEMM of the stacked
        // rows.
        expectSameAsCpu(
            "batch_matmul",
            {in(randf(size_t(n), -1, 1, 93)),
             in(randf(size_t(D * 3), -1, 1, 94)), out(size_t(B * S * 3))},
            {1, B, S * H * D, 0, S, 3, D, 0, 0, H * D, 0}, {1.0}, 1e-5, 1e-5);
      }
  ctx.batchGather = gatherWas;
}

TEST(CudaBatchMatmul, TwoBatchDims) {
  PIPEC_REQUIRE_GPU();
  const int64_t m = 9, n = 14, k = 11, b0 = 3, b1 = 4, ma = m * k, mb = k * n;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      // Contiguous: merges into one batch dimension.
      bmmCase({b0, b1}, {b1 * ma, ma}, {b1 * mb, mb}, b0 * b1 * ma,
              b0 * b1 * mb, m, n, k, ta, tb);
      // A [b0, 1] broadcast over the inner batch dim, B full: outer loop.
      bmmCase({b0, b1}, {ma, 0}, {b1 * mb, mb}, b0 * ma, b0 * b1 * mb, m, n, k,
              ta, tb);
      // A [1, b1], B [b0, 1]: both broadcast, along different dims.
      bmmCase({b0, b1}, {0, ma}, {mb, 0}, b1 * ma, b0 * mb, m, n, k, ta, tb,
              1.5);
    }
  // Three batch dims with a unit one in the middle, B shared.
  bmmCase({2, 1, 3}, {3 * ma, 0, ma}, {0, 0, 0}, 6 * ma, mb, m, n, k, false,
          false);
  // Permuted (non-contiguous) batch strides: A's batch dims swapped.
  bmmCase({b0, b1}, {ma, b0 * ma}, {b1 * mb, mb}, b0 * b1 * ma, b0 * b1 * mb, m,
          n, k, false, true);
}

TEST(CudaBatchMatmul, LargerAndDegenerate) {
  PIPEC_REQUIRE_GPU();
  // [8, 64, 96] x [96, 128] (the MatMul of a linear layer on a sequence).
  // K = 96: as in CudaGemm.Large, summation order differs from OpenBLAS.
  bmmCase({8}, {64 * 96}, {0}, 8 * 64 * 96, 96 * 128, 64, 128, 96, false, false,
          1, 1e-4, 1e-5);
  // K == 0 and alpha == 0 give zeros.
  bmmCase({3}, {0}, {0}, 0, 0, 4, 5, 0, false, false);
  bmmCase({3}, {6}, {6}, 18, 18, 2, 3, 3, false, false, 0);
}

//===----------------------------------------------------------------------===//
// Softmax
//===----------------------------------------------------------------------===//

void softmaxCase(int64_t outer, int64_t dim, int64_t inner, bool isLog,
                 bool inPlace, float range = 8) {
  SCOPED_TRACE(::testing::Message()
               << "softmax [" << outer << ", " << dim << ", " << inner
               << "] log=" << isLog << " inPlace=" << inPlace);
  const size_t total = size_t(outer * dim * inner);
  std::vector<float> x = randf(total, -range, range, 21);
  expectSameAsCpu("softmax", {in(x), inPlace ? alias(0) : out(total)},
                  {outer, dim, inner, isLog});
}

TEST(CudaSoftmax, LastAxis) {
  PIPEC_REQUIRE_GPU();
  for (int isLog = 0; isLog < 2; ++isLog) {
    softmaxCase(16, 1000, 1, isLog, false);   // one warp per row (32 / lane)
    softmaxCase(300, 10, 1, isLog, false);    // one warp per row (1 / lane)
    softmaxCase(3, 5000, 1, isLog, true, 40); // block per row, in place
    softmaxCase(7, 1, 1, isLog, false);       // a single class
    // Every register count of the warp shape, partly filled and full, in
    // place; 1025 is the first block-per-row length.
    for (int64_t dim : {33, 64, 100, 256, 300, 512, 1024, 1025})
      softmaxCase(37, dim, 1, isLog, dim % 2 == 0, 20);
  }
}

TEST(CudaSoftmax, MiddleAxis) {
  PIPEC_REQUIRE_GPU();
  for (int isLog = 0; isLog < 2; ++isLog) {
    softmaxCase(3, 17, 50, isLog, false);  // short rows: thread per row
    softmaxCase(2, 300, 5, isLog, false);  // few long rows: block per row
    softmaxCase(4, 100, 600, isLog, true); // many long rows: thread per row
  }
}

void softmaxGradCase(int64_t outer, int64_t dim, int64_t inner, bool isLog,
                     bool inPlace) {
  SCOPED_TRACE(::testing::Message()
               << "softmax_grad [" << outer << ", " << dim << ", " << inner
               << "] log=" << isLog << " inPlace=" << inPlace);
  const size_t total = size_t(outer * dim * inner);
  // Y from the forward kernel, so that it is a (log-)probability.
  std::vector<float> x = randf(total, -4, 4, 31), y(total);
  void *fwd[] = {x.data(), y.data()};
  const int64_t fwdInts[] = {outer, dim, inner, isLog};
  pipec_k_softmax(cpuContext(), fwd, fwdInts, nullptr);
  expectSameAsCpu(
      "softmax_grad",
      {in(y), in(randf(total, -1, 1, 32)), inPlace ? alias(1) : out(total)},
      {outer, dim, inner, isLog});
}

TEST(CudaSoftmaxGrad, AllShapes) {
  PIPEC_REQUIRE_GPU();
  for (int isLog = 0; isLog < 2; ++isLog) {
    softmaxGradCase(16, 1000, 1, isLog, false);
    softmaxGradCase(300, 10, 1, isLog, true);
    softmaxGradCase(3, 17, 50, isLog, false);
    softmaxGradCase(2, 300, 5, isLog, true);
    softmaxGradCase(4, 100, 600, isLog, false);
    for (int64_t dim : {33, 128, 500, 1024, 1025})
      softmaxGradCase(37, dim, 1, isLog, dim % 2 == 1);
  }
}

//===----------------------------------------------------------------------===//
// Layer normalization
//===----------------------------------------------------------------------===//

void layerNormCase(int64_t outer, int64_t inner, bool withBias, bool inPlace,
                   float offset, double eps = 1e-5) {
  SCOPED_TRACE(::testing::Message()
               << "layernorm [" << outer << ", " << inner << "] bias="
               << withBias << " inPlace=" << inPlace << " offset=" << offset);
  const size_t total = size_t(outer * inner);
  std::vector<float> x = randf(total, offset - 1, offset + 1, 41);
  expectSameAsCpu("layernorm",
                  {in(x), in(randf(size_t(inner), 0.5f, 1.5f, 42)),
                   withBias ? in(randf(size_t(inner), -1, 1, 43)) : null(),
                   inPlace ? alias(0) : out(total), out(size_t(outer)),
                   out(size_t(outer))},
                  {outer, inner}, {eps});
}

TEST(CudaLayerNorm, Forward) {
  PIPEC_REQUIRE_GPU();
  for (int withBias = 0; withBias < 2; ++withBias) {
    layerNormCase(7, 10, withBias, false, 0);
    layerNormCase(300, 768, withBias, false, 0);
    layerNormCase(5, 3000, withBias, true, 0);     // rows longer than a block
    layerNormCase(33, 64, withBias, false, 100);   // |mean| >> std
    layerNormCase(4, 1, withBias, false, 0, 1e-2); // one element per row
    // The longest rows of one warp each, and the shortest of a block.
    layerNormCase(3, 1024, withBias, true, 0);
    layerNormCase(3, 1025, withBias, false, 0);
  }
}

TEST(CudaLayerNorm, NullStatistics) {
  PIPEC_REQUIRE_GPU();
  // mean and invStd outputs are optional.
  expectSameAsCpu("layernorm",
                  {in(randf(6 * 40, -1, 1, 44)), in(randf(40, 0.5f, 1.5f, 45)),
                   in(randf(40)), out(6 * 40), null(), null()},
                  {6, 40}, {1e-5});
}

/// layernorm_grad with the mean and invStd of the CPU forward.
void layerNormGradCase(int64_t outer, int64_t inner, bool withDx,
                       bool withScale, bool withBias, bool inPlace,
                       float offset = 0) {
  SCOPED_TRACE(::testing::Message()
               << "layernorm_grad [" << outer << ", " << inner
               << "] dX=" << withDx << " dScale=" << withScale
               << " dBias=" << withBias << " inPlace=" << inPlace);
  const size_t total = size_t(outer * inner);
  std::vector<float> x = randf(total, offset - 1, offset + 1, 51);
  std::vector<float> scale = randf(size_t(inner), 0.5f, 1.5f, 52);
  std::vector<float> y(total), mean(static_cast<size_t>(outer)),
      invStd(static_cast<size_t>(outer));
  void *fwd[] = {x.data(), scale.data(), nullptr,
                 y.data(), mean.data(),  invStd.data()};
  const int64_t fwdInts[] = {outer, inner};
  const double eps[] = {1e-5};
  pipec_k_layernorm(cpuContext(), fwd, fwdInts, eps);
  expectSameAsCpu("layernorm_grad",
                  {in(x), in(scale), in(mean), in(invStd),
                   in(randf(total, -1, 1, 53)),
                   !withDx   ? null()
                   : inPlace ? alias(4)
                             : out(total),
                   withScale ? out(size_t(inner)) : null(),
                   withBias ? out(size_t(inner)) : null()},
                  {outer, inner});
}

TEST(CudaLayerNormGrad, AllOutputs) {
  PIPEC_REQUIRE_GPU();
  for (int withBias = 0; withBias < 2; ++withBias) {
    layerNormGradCase(7, 10, true, true, withBias, false);
    layerNormGradCase(300, 768, true, true, withBias, false);
    layerNormGradCase(5, 3000, true, true, withBias, true);
    layerNormGradCase(1000, 33, true, true, withBias, true); // many chunks
    layerNormGradCase(33, 64, true, true, withBias, false, 100);
    // More chunks than lanes in the column sums; warp and block rows.
    layerNormGradCase(4100, 96, true, true, withBias, true);
    layerNormGradCase(3, 1024, true, true, withBias, false);
    layerNormGradCase(3, 1025, true, true, withBias, true);
  }
}

TEST(CudaLayerNormGrad, OptionalOutputs) {
  PIPEC_REQUIRE_GPU();
  layerNormGradCase(50, 40, false, true, true, false);
  layerNormGradCase(50, 40, true, false, false, false);
  layerNormGradCase(50, 40, false, false, true, false);
  layerNormGradCase(50, 40, true, false, true, true);
}

//===----------------------------------------------------------------------===//
// SoftmaxCrossEntropyLoss
//===----------------------------------------------------------------------===//

struct SceCase {
  int64_t n, c, d;
  int64_t reduction; ///< 0 none, 1 mean, 2 sum
  bool weights = false;
  bool ignore = false;
  int64_t ignoreIndex = -100;
};

/// Labels in [0, C), every fifth one the ignore index when `ignore`, and
/// one out-of-range label (skipped like an ignored one) when `outOfRange`.
std::vector<int64_t> sceLabels(const SceCase &s, bool outOfRange = false) {
  std::vector<float> r = randf(size_t(s.n * s.d), 0, float(s.c), 61);
  std::vector<int64_t> labels(r.size());
  for (size_t i = 0; i < r.size(); ++i) {
    labels[i] = std::min<int64_t>(int64_t(r[i]), s.c - 1);
    if (s.ignore && i % 5 == 2)
      labels[i] = s.ignoreIndex;
  }
  if (outOfRange && labels.size() > 3)
    labels[3] = s.c + 3;
  return labels;
}

std::vector<int64_t> sceInts(const SceCase &s) {
  return {s.n, s.c, s.d, s.reduction, s.weights, s.ignore, s.ignoreIndex};
}

void sceLossCase(const SceCase &s, bool withLogProb, bool outOfRange = false) {
  SCOPED_TRACE(::testing::Message()
               << "sce_loss N=" << s.n << " C=" << s.c << " D=" << s.d
               << " reduction=" << s.reduction << " weights=" << s.weights
               << " ignore=" << s.ignore << " logProb=" << withLogProb);
  const size_t total = size_t(s.n * s.c * s.d);
  expectSameAsCpu("sce_loss",
                  {in(randf(total, -5, 5, 62)), inI64(sceLabels(s, outOfRange)),
                   s.weights ? in(randf(size_t(s.c), 0.1f, 2, 63)) : null(),
                   out(s.reduction == 0 ? size_t(s.n * s.d) : 1),
                   withLogProb ? out(total) : null()},
                  sceInts(s));
}

void sceGradCase(const SceCase &s, bool inPlace, bool outOfRange = false) {
  SCOPED_TRACE(::testing::Message()
               << "sce_loss_grad N=" << s.n << " C=" << s.c << " D=" << s.d
               << " reduction=" << s.reduction << " weights=" << s.weights
               << " ignore=" << s.ignore << " inPlace=" << inPlace);
  const size_t total = size_t(s.n * s.c * s.d);
  expectSameAsCpu("sce_loss_grad",
                  {in(randf(total, -5, 5, 64)), inI64(sceLabels(s, outOfRange)),
                   s.weights ? in(randf(size_t(s.c), 0.1f, 2, 65)) : null(),
                   in(s.reduction == 0 ? randf(size_t(s.n * s.d), -1, 1, 66)
                                       : std::vector<float>{0.37f}),
                   inPlace ? alias(0) : out(total)},
                  sceInts(s));
}

/// Shapes covering both launch shapes: thread per position (C < 64, or
/// many strided positions) and block per position (long rows).
const SceCase kSceShapes[] = {{8, 10, 1, 0},
                              {4, 5, 7, 0},
                              {16, 1000, 1, 0},
                              {3, 100, 6, 0},
                              {40, 70, 60, 0}};

TEST(CudaSceLoss, AllReductionsAndOptions) {
  PIPEC_REQUIRE_GPU();
  for (SceCase s : kSceShapes)
    for (int64_t reduction = 0; reduction < 3; ++reduction)
      for (int opts = 0; opts < 4; ++opts) {
        s.reduction = reduction;
        s.weights = opts & 1;
        s.ignore = opts & 2;
        s.ignoreIndex = opts == 2 ? 1 : -100; // a real class, or -100
        sceLossCase(s, opts % 2 == 0);
        sceLossCase(s, opts % 2 == 1, /*outOfRange=*/opts == 3);
      }
}

TEST(CudaSceLoss, EveryTargetIgnored) {
  PIPEC_REQUIRE_GPU();
  // mean with W == 0 gives 0 (not NaN).
  for (int64_t reduction = 0; reduction < 3; ++reduction) {
    SceCase s{4, 6, 2, reduction, true, true, 3};
    std::vector<int64_t> labels(8, 3);
    expectSameAsCpu("sce_loss",
                    {in(randf(48)), inI64(labels), in(randf(6, 0.1f, 2)),
                     out(reduction == 0 ? 8 : 1), out(48)},
                    sceInts(s));
    expectSameAsCpu("sce_loss_grad",
                    {in(randf(48)), inI64(labels), in(randf(6, 0.1f, 2)),
                     in(reduction == 0 ? randf(8) : std::vector<float>{1}),
                     out(48)},
                    sceInts(s));
  }
}

TEST(CudaSceLossGrad, AllReductionsAndOptions) {
  PIPEC_REQUIRE_GPU();
  for (SceCase s : kSceShapes)
    for (int64_t reduction = 0; reduction < 3; ++reduction)
      for (int opts = 0; opts < 4; ++opts) {
        s.reduction = reduction;
        s.weights = opts & 1;
        s.ignore = opts & 2;
        s.ignoreIndex = opts == 2 ? 1 : -100;
        sceGradCase(s, opts % 2 == 0, /*outOfRange=*/opts == 1);
      }
}

/// Rows of a language model's vocabulary (contiguous, one pass per row on
/// the GPU): long rows, rows that rise so the running maximum keeps moving,
/// -inf scores (masked classes), and a row of -inf only (NaN, as on the
/// CPU).
TEST(CudaSceLoss, LongRowsRisingAndInfinite) {
  PIPEC_REQUIRE_GPU();
  const int64_t n = 6, c = 5003;
  std::vector<float> x = randf(size_t(n * c), -5, 5, 67);
  for (int64_t k = 0; k < c; ++k) {
    x[size_t(1 * c + k)] = 0.01f * float(k);     // rising
    x[size_t(2 * c + k)] = 0.01f * float(c - k); // falling
    if (k % 7 == 3)
      x[size_t(3 * c + k)] = -INFINITY; // masked classes
    x[size_t(5 * c + k)] = -INFINITY;   // nothing but -inf
  }
  for (int64_t reduction = 0; reduction < 3; ++reduction) {
    SCOPED_TRACE(::testing::Message() << "reduction=" << reduction);
    SceCase s{n, c, 1, reduction};
    std::vector<int64_t> labels = {5, c - 1, 0, 4, 1234, 17};
    std::vector<float> rows(x.begin(), x.begin() + 5 * c); // no -inf row
    SceCase finite{5, c, 1, reduction};
    expectSameAsCpu("sce_loss",
                    {in(rows), inI64({5, c - 1, 0, 4, 1234}), null(),
                     out(reduction == 0 ? 5 : 1), out(rows.size())},
                    sceInts(finite));
    expectSameAsCpu(
        "sce_loss_grad",
        {in(rows), inI64({5, c - 1, 0, 4, 1234}), null(),
         in(reduction == 0 ? randf(5, -1, 1, 68) : std::vector<float>{0.5f}),
         out(rows.size())},
        sceInts(finite));
    // With the -inf row: its loss (and a reduced loss) is NaN on both.
    expectSameAsCpu("sce_loss",
                    {in(x), inI64(labels), null(),
                     out(reduction == 0 ? size_t(n) : 1), null()},
                    sceInts(s));
  }
}

//===----------------------------------------------------------------------===//
// Optimizers
//===----------------------------------------------------------------------===//

constexpr size_t kSmall = 1000, kLarge = 300007;

TEST(CudaOptimizer, Sgd) {
  PIPEC_REQUIRE_GPU();
  for (size_t n : {kSmall, kLarge}) {
    expectSameAsCpu("sgd",
                    {in(randf(n, -1, 1, 71)), in(randf(n, -1, 1, 72)),
                     in({0.05f}), alias(0)},
                    {int64_t(n)});
    expectSameAsCpu(
        "sgd",
        {in(randf(n, -1, 1, 73)), in(randf(n, -1, 1, 74)), in({0.3f}), out(n)},
        {int64_t(n)});
  }
}

TEST(CudaOptimizer, Momentum) {
  PIPEC_REQUIRE_GPU();
  for (size_t n : {kSmall, kLarge})
    for (int64_t t : {0, 1, 7})
      for (int nesterov = 0; nesterov < 2; ++nesterov)
        for (double norm : {0.0, 0.01}) {
          SCOPED_TRACE(::testing::Message()
                       << "momentum T=" << t << " nesterov=" << nesterov
                       << " norm=" << norm);
          // In place: Xnew aliases X, Vnew aliases V.
          expectSameAsCpu("momentum",
                          {in({0.1f}), inI64({t}), in(randf(n, -1, 1, 81)),
                           in(randf(n, -1, 1, 82)), in(randf(n, -1, 1, 83)),
                           alias(2), alias(4)},
                          {int64_t(n), nesterov}, {0.9, 0.8, norm});
          expectSameAsCpu("momentum",
                          {in({0.02f}), inI64({t}), in(randf(n, -1, 1, 84)),
                           in(randf(n, -1, 1, 85)), in(randf(n, -1, 1, 86)),
                           out(n), out(n)},
                          {int64_t(n), nesterov}, {0.5, 0.25, norm});
        }
}

TEST(CudaOptimizer, Adam) {
  PIPEC_REQUIRE_GPU();
  for (size_t n : {kSmall, kLarge})
    for (int64_t t : {0, 1, 10, 1000})
      for (double norm : {0.0, 0.01}) {
        SCOPED_TRACE(::testing::Message()
                     << "adam T=" << t << " norm=" << norm);
        // H is a second moment: non-negative.
        expectSameAsCpu("adam",
                        {in({0.001f}), inI64({t}), in(randf(n, -1, 1, 91)),
                         in(randf(n, -1, 1, 92)), in(randf(n, -1, 1, 93)),
                         in(randf(n, 0, 1, 94)), alias(2), alias(4), alias(5)},
                        {int64_t(n)}, {0.9, 0.999, norm, 0.0, 1e-8});
        expectSameAsCpu("adam",
                        {in({0.01f}), inI64({t}), in(randf(n, -1, 1, 95)),
                         in(randf(n, -1, 1, 96)), in(randf(n, -1, 1, 97)),
                         in(randf(n, 0, 0.01f, 98)), out(n), out(n), out(n)},
                        {int64_t(n)}, {0.8, 0.95, norm, 0.01, 1e-6});
      }
}

TEST(CudaOptimizer, Adagrad) {
  PIPEC_REQUIRE_GPU();
  for (size_t n : {kSmall, kLarge})
    for (int64_t t : {0, 1, 10, 12345})
      for (double norm : {0.0, 0.01}) {
        SCOPED_TRACE(::testing::Message()
                     << "adagrad T=" << t << " norm=" << norm);
        expectSameAsCpu("adagrad",
                        {in({0.1f}), inI64({t}), in(randf(n, -1, 1, 101)),
                         in(randf(n, -1, 1, 102)), in(randf(n, 0, 1, 103)),
                         alias(2), alias(4)},
                        {int64_t(n)}, {0.01, 1e-6, norm});
        expectSameAsCpu("adagrad",
                        {in({0.5f}), inI64({t}), in(randf(n, -1, 1, 104)),
                         in(randf(n, -1, 1, 105)), in(randf(n, 0, 1, 106)),
                         out(n), out(n)},
                        {int64_t(n)}, {0.0, 1e-10, norm});
      }
}

} // namespace

//===----------------------------------------------------------------------===//
// bfloat16 matrix products (--precision bf16)
//===----------------------------------------------------------------------===//

namespace {

/// Runs pipec_cuda_k_gemm (Y = A B, no C) on the GPU and returns Y; Y
/// holds NaN before the call with `nanY`, else zeros.
std::vector<float> gpuGemm(const std::vector<float> &a,
                           const std::vector<float> &b, int64_t m, int64_t n,
                           int64_t k, bool nanY = false) {
  float *d[3] = {};
  const size_t sizes[3] = {a.size(), b.size(), size_t(m * n)};
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(cudaMalloc(&d[i], sizes[i] * 4), cudaSuccess);
  // Y before the call: NaN (all bits set) or zeros.
  EXPECT_EQ(cudaMemset(d[2], nanY ? 0xFF : 0, sizes[2] * 4), cudaSuccess);
  cudaMemcpy(d[0], a.data(), a.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d[1], b.data(), b.size() * 4, cudaMemcpyHostToDevice);
  void *bufs[4] = {d[0], d[1], nullptr, d[2]};
  const int64_t ints[8] = {m, n, k, 0, 0, 0, 0, 0};
  const double reals[2] = {1, 0};
  pipec_cuda_k_gemm(gpuContext(), bufs, ints, reals);
  std::vector<float> y(size_t(m * n));
  EXPECT_EQ(cudaMemcpy(y.data(), d[2], y.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (float *p : d)
    cudaFree(p);
  return y;
}

} // namespace

// Operands that are bfloat16 values already: the products are exact in
// float32, so a bf16 GEMM equals the CPU's float32 GEMM to accumulation
// order (1e-5), the same contract as float32.
TEST(CudaGemmBf16, ExactOnBf16Operands) {
  PIPEC_REQUIRE_GPU();
  Bf16Matmuls bf16;
  const int64_t m = 96, n = 160, k = 128;
  expectSameAsCpu("gemm",
                  {in(roundedToBf16(randf(size_t(m * k), -1, 1, 31))),
                   in(roundedToBf16(randf(size_t(k * n), -1, 1, 32))), null(),
                   out(size_t(m * n))},
                  {m, n, k, 0, 0, 0, 0, 0}, {1, 0}, 1e-5, 1e-5);
  // The strided-batched path (attention's score and value products), B
  // transposed.
  const int64_t batches = 4;
  expectSameAsCpu("batch_matmul",
                  {in(roundedToBf16(randf(size_t(batches * m * k), -1, 1, 33))),
                   in(roundedToBf16(randf(size_t(batches * k * n), -1, 1, 34))),
                   out(size_t(batches * m * n))},
                  {1, batches, m * k, k * n, m, n, k, 0, 1, 0, 0}, {0.5}, 1e-5,
                  1e-5);
}

// Float32 operands: cuBLAS rounds each to the nearest bfloat16 (ties to
// even) before multiplying, so the result is the product of the rounded
// operands, not of the float32 ones (which differ by up to ~2^-8
// relative).
TEST(CudaGemmBf16, RoundsOperandsToNearestBf16) {
  PIPEC_REQUIRE_GPU();
  Bf16Matmuls bf16;
  const int64_t m = 64, n = 96, k = 256;
  std::vector<float> a = randf(size_t(m * k), -1, 1, 41);
  std::vector<float> b = randf(size_t(k * n), -1, 1, 42);
  std::vector<float> fromF32 = gpuGemm(a, b, m, n, k);
  std::vector<float> fromBf16 =
      gpuGemm(roundedToBf16(a), roundedToBf16(b), m, n, k);
  double worstRounded = 0, worstF32 = 0;
  // The float32 product, for scale: bf16 must differ from it visibly.
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double exact = 0;
      for (int64_t p = 0; p < k; ++p)
        exact += double(a[size_t(i * k + p)]) * double(b[size_t(p * n + j)]);
      const size_t e = size_t(i * n + j);
      worstRounded =
          std::max(worstRounded, double(std::abs(fromF32[e] - fromBf16[e])));
      worstF32 = std::max(worstF32, std::abs(double(fromF32[e]) - exact));
    }
  EXPECT_LE(worstRounded, 1e-5) << "bf16 GEMM of float32 operands is not the "
                                   "GEMM of their nearest bfloat16 values";
  EXPECT_GE(worstF32, 1e-3) << "no bfloat16 rounding visible";
  EXPECT_LE(worstF32, 0.25) << "bfloat16 error larger than rounding explains";
}

// Operands whose element counts are not multiples of four: the rounding
// runs four at a time, then the rest one at a time (gemm.cu, launchToBf16);
// every element must be rounded all the same.
TEST(CudaGemmBf16, OddSizesRoundEveryElement) {
  PIPEC_REQUIRE_GPU();
  Bf16Matmuls bf16;
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape &s :
       {Shape{5, 7, 3}, Shape{1, 1, 1}, Shape{3, 5, 9}, Shape{2, 3, 4}}) {
    SCOPED_TRACE(::testing::Message()
                 << "m " << s.m << " n " << s.n << " k " << s.k);
    std::vector<float> a = randf(size_t(s.m * s.k), -1, 1, 51);
    std::vector<float> b = randf(size_t(s.k * s.n), -1, 1, 52);
    std::vector<float> fromF32 = gpuGemm(a, b, s.m, s.n, s.k);
    std::vector<float> fromBf16 =
        gpuGemm(roundedToBf16(a), roundedToBf16(b), s.m, s.n, s.k);
    for (size_t e = 0; e < fromF32.size(); ++e)
      EXPECT_LE(std::abs(fromF32[e] - fromBf16[e]), 1e-6) << "element " << e;
  }
}

/// Restores the context's padding settings (PIPEC_BF16_PAD, the part
/// size) when a test that changes them ends, however it ends.
struct PadSettings {
  pipec::cuda::Context &ctx = pipec::cuda::context(gpuContext(), "test");
  const bool pad = ctx.bf16Pad;
  const int64_t partBytes = ctx.bf16PadPartBytes;
  ~PadSettings() {
    ctx.bf16Pad = pad;
    ctx.bf16PadPartBytes = partBytes;
  }
};

/// The bf16 path a product takes (gemm.cu): the tensors' own shapes,
/// padded straight into the result, or padded through the staged result
/// copied out in parts.
enum class Bf16Path { Plain, Direct, CopyOut };

/// Runs `product` (one kernel call) and checks the path it took through the
/// context's counters: `parts` copied-out parts (-1: at least one).
void expectBf16Path(Bf16Path want, int64_t parts,
                    const std::function<void()> &product) {
  pipec::cuda::Context &ctx = pipec::cuda::context(gpuContext(), "test");
  const int64_t direct0 = ctx.bf16PaddedDirect, parts0 = ctx.bf16PaddedParts;
  product();
  const int64_t direct = ctx.bf16PaddedDirect - direct0,
                copied = ctx.bf16PaddedParts - parts0;
  if (!ctx.bf16Pad)
    want = Bf16Path::Plain;
  EXPECT_EQ(direct, want == Bf16Path::Direct ? 1 : 0) << "straight into Y";
  if (want != Bf16Path::CopyOut)
    EXPECT_EQ(copied, 0) << "parts copied out";
  else if (parts < 0)
    EXPECT_GE(copied, 1) << "parts copied out";
  else
    EXPECT_EQ(copied, parts) << "parts copied out";
}

// Shapes whose dimensions, leading dimensions, batch strides or result are
// not multiples of 8 take the padded path (gemm.cu, paddedBf16Gemm): the
// operands packed with zeros, the result written directly when only K is
// padded, else staged and copied out, whole or in parts. Against the CPU's
// emulation (the same rounding, exact products) with the sums' tolerance
// of ExactOnBf16Operands: transposes, bias forms, alpha and beta; each
// case checks which path it took. Then the same shapes on the unpadded
// path (PIPEC_BF16_PAD=0).
TEST(CudaGemmBf16, PaddedShapesMatchCpu) {
  PIPEC_REQUIRE_GPU();
  Bf16Matmuls bf16;
  PadSettings saved;
  pipec::cuda::Context &ctx = saved.ctx;
  const int64_t partBytes = saved.partBytes;
  // Padded with the result staged whole; in parts of 8 columns or one
  // matrix (1 KiB); in parts of 8 columns or two matrices (3 KiB); not
  // padded. `whole`, `small`, `medium`: parts expected in the three
  // padded modes.
  struct Mode {
    bool pad;
    int64_t partBytes;
    int index;
  };
  const Mode modes[] = {
      {true, partBytes, 0}, {true, 1024, 1}, {true, 3072, 2}, {false, 0, 0}};
  for (const Mode &mode : modes) {
    SCOPED_TRACE(::testing::Message()
                 << "PIPEC_BF16_PAD=" << mode.pad << ", parts of "
                 << mode.partBytes << " bytes");
    ctx.bf16Pad = mode.pad;
    ctx.bf16PadPartBytes = mode.partBytes;
    auto parts = [&](int64_t whole, int64_t small, int64_t medium) {
      const int64_t byMode[] = {whole, small, medium};
      return byMode[mode.index];
    };
    const double tol = 1e-5;
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        // cuBLAS sees m = 53 (odd), n = 37: copied out, 8 columns a part
        // in the small modes.
        expectBf16Path(Bf16Path::CopyOut, parts(1, 5, 5), [&] {
          gemmCase(37, 53, 29, ta, tb, Bias::None, 1, 0, tol, tol);
        });
        expectBf16Path(Bf16Path::CopyOut, parts(1, 5, 5), [&] {
          gemmCase(37, 53, 29, ta, tb, Bias::Full, 0.5, 1, tol, tol);
        });
        // Only K (29) padded: straight into Y, beta Y added by cuBLAS.
        expectBf16Path(Bf16Path::Direct, 0, [&] {
          gemmCase(16, 24, 29, ta, tb, Bias::Row, 1, 1, tol, tol);
        });
        expectBf16Path(Bf16Path::CopyOut, 1, [&] {
          gemmCase(5, 3, 70, ta, tb, Bias::Transposed, -2, 0.5, tol, tol);
        });
        expectBf16Path(Bf16Path::CopyOut, 1, [&] {
          gemmCase(1, 1, 1, ta, tb, Bias::Scalar, 1, 1, tol, tol);
        });
      }
    // An odd vocabulary (GPT-2's lm_head is 50257 wide): the forward, the
    // input's gradient (K odd: straight into Y) and the weight's (N odd).
    expectBf16Path(Bf16Path::CopyOut, parts(1, 8, 8), [&] {
      gemmCase(64, 1003, 48, false, false, Bias::None, 1, 0, 1e-4, 1e-4);
    });
    expectBf16Path(Bf16Path::Direct, 0, [&] {
      gemmCase(64, 48, 1003, false, true, Bias::None, 1, 0, 1e-4, 1e-4);
    });
    expectBf16Path(Bf16Path::CopyOut, parts(1, 6, 6), [&] {
      gemmCase(48, 1003, 64, true, false, Bias::None, 1, 0, 1e-4, 1e-4);
    });
    const int64_t m = 13, n = 21, k = 17, b = 5;
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        // Five 21 x 13 results (24 x 16 padded, 1536 bytes): one part
        // whole, one matrix a part, two matrices a part.
        expectBf16Path(Bf16Path::CopyOut, parts(1, 5, 3), [&] {
          bmmCase({b}, {m * k}, {k * n}, b * m * k, b * k * n, m, n, k, ta, tb,
                  1, tol, tol);
        });
        // Broadcasts: packed once (one GEMM of b * M rows where A is not
        // transposed and B is shared).
        expectBf16Path(Bf16Path::CopyOut, -1, [&] {
          bmmCase({b}, {m * k}, {0}, b * m * k, k * n, m, n, k, ta, tb, 0.5,
                  tol, tol);
        });
        expectBf16Path(Bf16Path::CopyOut, -1, [&] {
          bmmCase({b}, {0}, {k * n}, m * k, b * k * n, m, n, k, ta, tb, -2, tol,
                  tol);
        });
      }
    // Aligned matrices 132 elements apart (a batch stride off by 4):
    // packed, then straight into Y.
    expectBf16Path(Bf16Path::Direct, 0, [&] {
      bmmCase({3}, {132}, {64}, 3 * 132, 3 * 64, 16, 8, 8, false, false, 1, tol,
              tol);
    });
  }
}

// beta == 0 never reads Y on the padded paths: a Y of NaN before the call
// gives the same result as a Y of zeros (copied out, whole and in parts;
// straight into Y).
TEST(CudaGemmBf16, PaddedNeverReadsYWithoutBeta) {
  PIPEC_REQUIRE_GPU();
  Bf16Matmuls bf16;
  PadSettings saved;
  struct Shape {
    int64_t m, n, k;
  };
  for (int64_t part : {saved.partBytes, int64_t(1024)}) {
    saved.ctx.bf16PadPartBytes = part;
    for (const Shape &s : {Shape{37, 53, 29}, Shape{16, 24, 29}}) {
      SCOPED_TRACE(::testing::Message() << "m " << s.m << " n " << s.n << " k "
                                        << s.k << ", parts of " << part);
      const std::vector<float> a = randf(size_t(s.m * s.k), -1, 1, 71);
      const std::vector<float> b = randf(size_t(s.k * s.n), -1, 1, 72);
      const std::vector<float> clean = gpuGemm(a, b, s.m, s.n, s.k, false);
      const std::vector<float> fromNaN = gpuGemm(a, b, s.m, s.n, s.k, true);
      for (size_t e = 0; e < clean.size(); ++e) {
        ASSERT_FALSE(std::isnan(fromNaN[e])) << "element " << e;
        ASSERT_EQ(fromNaN[e], clean[e]) << "element " << e;
      }
    }
  }
}

// The rounding from pointers that are not 16-byte aligned (a tensor view
// at an odd offset): the one-at-a-time kernel, the same values.
TEST(CudaGemmBf16, RoundingFromUnalignedPointers) {
  PIPEC_REQUIRE_GPU();
  pipec::cuda::Context &ctx = pipec::cuda::context(gpuContext(), "test");
  const int64_t n = 1001;
  std::vector<float> host = randf(size_t(n + 1), -3, 3, 61);
  float *src = nullptr, *dst = nullptr;
  ASSERT_EQ(cudaMalloc(&src, size_t(n + 1) * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, size_t(n + 1) * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(src, host.data(), size_t(n + 1) * sizeof(float),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  for (int offset = 0; offset < 2; ++offset) {
    SCOPED_TRACE(::testing::Message() << "offset " << offset);
    pipec::cuda::roundToBf16Values(ctx, src + offset, dst + offset, n - offset,
                                   "test");
    ASSERT_EQ(cudaStreamSynchronize(ctx.stream), cudaSuccess);
    std::vector<float> got(static_cast<size_t>(n));
    ASSERT_EQ(cudaMemcpy(got.data(), dst + offset,
                         size_t(n - offset) * sizeof(float),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    const std::vector<float> want = roundedToBf16(
        std::vector<float>(host.begin() + offset, host.begin() + n));
    for (int64_t i = 0; i < n - offset; ++i)
      ASSERT_EQ(got[size_t(i)], want[size_t(i)]) << "element " << i;
  }
  cudaFree(src);
  cudaFree(dst);
}
