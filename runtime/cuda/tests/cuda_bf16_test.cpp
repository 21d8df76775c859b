//===- cuda_bf16_test.cpp - The `_bf16` kernels against the CPU's ---------===//
//
// Part of pipec's GPU tests (ctest label `gpu`).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// pipec_cuda_k_NAME_bf16 against pipec_k_NAME_bf16 (the CPU's float32
/// kernel between casts) on the same bfloat16 inputs. Where both float32
/// kernels round exactly (add, sub, mul, div, max, relu) the bfloat16
/// results are the same bits; elsewhere the float32 kernels differ by
/// their rounding (1e-5), which moves a bfloat16 result by at most one
/// unit in its last place (2^-8 relative): the tolerance is 1e-2.
///
//===----------------------------------------------------------------------===//
#include "cuda_rt.h"
#include "cuda_test_util.h"

using namespace pipec::cudatest;

namespace {

constexpr double kBf16Rtol = 1e-2, kBf16Atol = 1e-5;

int64_t widenedCalls() {
  return static_cast<pipec::cuda::Context *>(gpuContext())->bf16Widened;
}

/// A binary op over [rows, cols] with B of [cols] (bias) or [rows, cols],
/// in the storage `a`, `b`, `y` say (true: bfloat16).
void binaryCase(int64_t opcode, bool a16, bool b16, bool y16, bool bias,
                double rtol) {
  SCOPED_TRACE(::testing::Message() << "opcode " << opcode << " a16 " << a16
                                    << " b16 " << b16 << " y16 " << y16
                                    << " bias " << bias);
  const int64_t rows = 37, cols = 64, n = rows * cols;
  std::vector<float> av = randf(size_t(n), -2.f, 2.f, 3),
                     bv = randf(size_t(bias ? cols : n), 0.5f, 2.f, 4);
  std::vector<Arg> args = {a16 ? inBf16(av) : in(roundedToBf16(av)),
                           b16 ? inBf16(bv) : in(bv),
                           y16 ? outBf16(size_t(n)) : out(size_t(n))};
  std::vector<int64_t> ints = {opcode, 2, rows, cols, cols, 1,
                               bias ? 0 : cols, 1};
  const int64_t before = widenedCalls();
  expectSameAsCpu("binary_bf16", args, bf16Ints(args, ints), {}, rtol,
                  rtol == 0 ? 0 : kBf16Atol);
  EXPECT_EQ(widenedCalls(), before) << "the native kernel ran";
}

} // namespace

TEST(CudaBf16, BinaryEveryStorage) {
  PIPEC_REQUIRE_GPU();
  for (int mask = 1; mask < 8; ++mask)
    for (int64_t op : {PIPEC_BIN_ADD, PIPEC_BIN_MUL, PIPEC_BIN_DIV})
      binaryCase(op, mask & 1, mask & 2, mask & 4, false, 0);
  binaryCase(PIPEC_BIN_ADD, true, false, true, true, 0); // bias
  binaryCase(PIPEC_BIN_SUB, true, true, true, false, 0);
  binaryCase(PIPEC_BIN_MAX, true, true, true, true, 0);
  binaryCase(PIPEC_BIN_POW, true, false, true, false, kBf16Rtol);
}

TEST(CudaBf16, UnaryAndGrad) {
  PIPEC_REQUIRE_GPU();
  const size_t n = 4099;
  std::vector<float> x = randf(n, -3.f, 3.f, 5), g = randf(n, -1.f, 1.f, 6);
  for (int64_t op : {PIPEC_UN_RELU, PIPEC_UN_GELU, PIPEC_UN_TANH,
                     PIPEC_UN_SIGMOID, PIPEC_UN_SCALE, PIPEC_UN_COPY}) {
    SCOPED_TRACE(::testing::Message() << "opcode " << op);
    const double rtol = op == PIPEC_UN_RELU || op == PIPEC_UN_COPY ||
                                op == PIPEC_UN_SCALE
                            ? 0
                            : kBf16Rtol;
    const std::vector<double> reals = {op == PIPEC_UN_SCALE ? 0.5 : 0.0, 0.0};
    std::vector<Arg> fwd = {inBf16(x), outBf16(n)};
    expectSameAsCpu("unary_bf16", fwd, bf16Ints(fwd, {op, int64_t(n)}), reals,
                    rtol, rtol == 0 ? 0 : kBf16Atol);
    std::vector<Arg> bwd = {inBf16(x), inBf16(g), outBf16(n)};
    expectSameAsCpu("unary_grad_bf16", bwd, bf16Ints(bwd, {op, int64_t(n)}),
                    reals, rtol, rtol == 0 ? 0 : kBf16Atol);
  }
}

TEST(CudaBf16, SoftmaxOnWideCopies) {
  PIPEC_REQUIRE_GPU();
  const int64_t outer = 24, dim = 129;
  const size_t n = size_t(outer * dim);
  std::vector<float> x = randf(n, -4.f, 4.f, 7), g = randf(n, -1.f, 1.f, 8);
  const int64_t before = widenedCalls();
  for (int64_t isLog : {0, 1}) {
    std::vector<Arg> fwd = {inBf16(x), outBf16(n)};
    expectSameAsCpu("softmax_bf16", fwd, bf16Ints(fwd, {outer, dim, 1, isLog}),
                    {}, kBf16Rtol, kBf16Atol);
    std::vector<Arg> bwd = {inBf16(roundedToBf16(x)), inBf16(g), outBf16(n)};
    expectSameAsCpu("softmax_grad_bf16", bwd,
                    bf16Ints(bwd, {outer, dim, 1, isLog}), {}, kBf16Rtol,
                    kBf16Atol);
  }
  EXPECT_EQ(widenedCalls(), before + 4);
}

TEST(CudaBf16, LayerNormOnWideCopies) {
  PIPEC_REQUIRE_GPU();
  const int64_t outer = 48, inner = 96;
  const size_t n = size_t(outer * inner);
  std::vector<float> x = randf(n, -2.f, 2.f, 9), g = randf(n, -1.f, 1.f, 10);
  std::vector<float> scale = randf(size_t(inner), 0.5f, 1.5f, 11),
                     bias = randf(size_t(inner), -0.5f, 0.5f, 12);
  std::vector<Arg> fwd = {inBf16(x),     in(scale),
                          in(bias),      outBf16(n),
                          out(size_t(outer)), out(size_t(outer))};
  expectSameAsCpu("layernorm_bf16", fwd, bf16Ints(fwd, {outer, inner}),
                  {1e-5}, kBf16Rtol, kBf16Atol);
  std::vector<Arg> bwd = {inBf16(x),
                          in(scale),
                          in(randf(size_t(outer), -0.1f, 0.1f, 13)),
                          in(randf(size_t(outer), 0.5f, 2.f, 14)),
                          inBf16(g),
                          outBf16(n),
                          out(size_t(inner)),
                          out(size_t(inner))};
  expectSameAsCpu("layernorm_grad_bf16", bwd, bf16Ints(bwd, {outer, inner}),
                  {}, kBf16Rtol, 1e-4);
}

TEST(CudaBf16, BatchNormOnWideCopies) {
  PIPEC_REQUIRE_GPU();
  const int64_t nb = 4, c = 6, s = 49;
  const size_t n = size_t(nb * c * s), cs = size_t(c);
  std::vector<float> x = randf(n, -2.f, 2.f, 15), g = randf(n, -1.f, 1.f, 16);
  std::vector<Arg> fwd = {inBf16(x),
                          in(randf(cs, 0.5f, 1.5f, 17)),
                          in(randf(cs, -0.5f, 0.5f, 18)),
                          in(randf(cs, -0.1f, 0.1f, 19)),
                          in(randf(cs, 0.5f, 1.5f, 20)),
                          outBf16(n),
                          out(cs),
                          out(cs),
                          out(cs),
                          out(cs)};
  expectSameAsCpu("batchnorm_train_bf16", fwd, bf16Ints(fwd, {nb, c, s}),
                  {1e-5, 0.9}, kBf16Rtol, kBf16Atol);
  std::vector<Arg> bwd = {inBf16(x),
                          in(randf(cs, 0.5f, 1.5f, 21)),
                          in(randf(cs, -0.1f, 0.1f, 22)),
                          in(randf(cs, 0.5f, 2.f, 23)),
                          inBf16(g),
                          outBf16(n),
                          out(cs),
                          out(cs)};
  expectSameAsCpu("batchnorm_grad_bf16", bwd, bf16Ints(bwd, {nb, c, s}), {},
                  kBf16Rtol, 1e-4);
}
