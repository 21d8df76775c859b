//===- kernels_bf16_test.cpp - The `_bf16` kernels on the CPU -------------===//
//
// Part of pipec. pipec_k_NAME_bf16 (include/pipec_rt.h, "Bfloat16
// storage") against pipec_k_NAME between pipec_k_cast's conversions, bit
// for bit, and the refusals of a malformed prefix.
//
//===----------------------------------------------------------------------===//

#include "kernels_test_util.h"

#include "core/error.h"

#include <cstring>
#include <string>

using namespace pipec_test;

namespace {

using Bits = std::vector<uint16_t>;

/// `x` through pipec_k_cast in `direction` (float32 <-> bfloat16 bits).
template <class To, class From>
std::vector<To> castAll(int64_t direction, const std::vector<From> &x) {
  std::vector<To> y(x.size());
  int64_t k[2] = {direction, int64_t(x.size())};
  void *bufs[2] = {const_cast<From *>(x.data()), y.data()};
  pipec_k_cast(kctx(), bufs, k, nullptr);
  return y;
}
Bits toBf16(const Floats &x) {
  return castAll<uint16_t>(PIPEC_CAST_F32_TO_BF16, x);
}
Floats widen(const Bits &b) {
  return castAll<float>(PIPEC_CAST_BF16_TO_F32, b);
}

} // namespace

TEST(KernelBf16Storage, EveryVariantIsRegistered) {
  int listed = 0;
#define PIPEC_KERNEL(sym)
#define PIPEC_KERNEL_BF16(sym)                                                 \
  ++listed;                                                                    \
  EXPECT_EQ(pipec_rt_find_kernel(#sym "_bf16"), &sym##_bf16) << #sym;
#include "pipec_kernels.def"
  EXPECT_GE(listed, 9);
}

// A bias added in place to a bf16 activation (A bf16, B f32, Y = A) and a
// bf16 partial added to a float32 sum (A f32, B bf16, Y f32): the float32
// kernel between casts, bit for bit.
TEST(KernelBf16Storage, BinaryIsTheFloatKernelBetweenCasts) {
  std::mt19937 rng(1);
  const int64_t rows = 5, cols = 12, n = rows * cols;
  Bits a = toBf16(randomFloats(rng, n, -3.f, 3.f));
  Floats bias = randomFloats(rng, cols, -1.f, 1.f);
  // Reference: widen, add, round.
  Floats aw = widen(a), yw(static_cast<size_t>(n));
  std::vector<int64_t> ints = {PIPEC_BIN_ADD, 2, rows, cols, cols, 1, 0, 1};
  void *ref[3] = {aw.data(), bias.data(), yw.data()};
  pipec_k_binary(kctx(), ref, ints.data(), nullptr);
  const Bits want = toBf16(yw);
  std::vector<int64_t> pre = {3, n, 0, -n};
  pre.insert(pre.end(), ints.begin(), ints.end());
  void *bufs[3] = {a.data(), bias.data(), a.data()};
  pipec_k_binary_bf16(kctx(), bufs, pre.data(), nullptr);
  EXPECT_EQ(a, want);

  Floats sum = randomFloats(rng, n, -1.f, 1.f), got(static_cast<size_t>(n));
  Bits part = toBf16(randomFloats(rng, n, -1.f, 1.f));
  Floats partW = widen(part), ref2(static_cast<size_t>(n));
  std::vector<int64_t> same = {PIPEC_BIN_ADD, 1, n, 1, 1};
  void *r2[3] = {sum.data(), partW.data(), ref2.data()};
  pipec_k_binary(kctx(), r2, same.data(), nullptr);
  std::vector<int64_t> pre2 = {3, 0, n, 0};
  pre2.insert(pre2.end(), same.begin(), same.end());
  void *b2[3] = {sum.data(), part.data(), got.data()};
  pipec_k_binary_bf16(kctx(), b2, pre2.data(), nullptr);
  EXPECT_EQ(std::memcmp(got.data(), ref2.data(), got.size() * 4), 0);
}

// Layer norm reads a bf16 X, writes a bf16 Y and float32 statistics.
TEST(KernelBf16Storage, LayerNormIsTheFloatKernelBetweenCasts) {
  std::mt19937 rng(5);
  const int64_t outer = 6, inner = 40, n = outer * inner;
  Bits x = toBf16(randomFloats(rng, n, -2.f, 2.f));
  Floats scale = randomFloats(rng, inner, 0.5f, 1.5f),
         bias = randomFloats(rng, inner, -0.5f, 0.5f);
  Floats xw = widen(x), yw(static_cast<size_t>(n)), mean(static_cast<size_t>(outer)),
         inv(static_cast<size_t>(outer));
  int64_t ints[2] = {outer, inner};
  double eps[1] = {1e-5};
  void *ref[6] = {xw.data(),   scale.data(), bias.data(),
                  yw.data(),   mean.data(),  inv.data()};
  pipec_k_layernorm(kctx(), ref, ints, eps);
  Bits y(static_cast<size_t>(n));
  Floats mean2(static_cast<size_t>(outer)), inv2(static_cast<size_t>(outer));
  int64_t pre[9] = {6, n, 0, 0, -n, 0, 0, outer, inner};
  void *bufs[6] = {x.data(), scale.data(), bias.data(),
                   y.data(), mean2.data(), inv2.data()};
  pipec_k_layernorm_bf16(kctx(), bufs, pre, eps);
  EXPECT_EQ(y, toBf16(yw));
  EXPECT_EQ(std::memcmp(mean.data(), mean2.data(), mean.size() * 4), 0);
  EXPECT_EQ(std::memcmp(inv.data(), inv2.data(), inv.size() * 4), 0);
}

TEST(KernelBf16Storage, MalformedPrefixIsRefused) {
  Bits a(4), y(4);
  Floats b(4);
  void *bufs[3] = {a.data(), b.data(), y.data()};
  auto refusal = [&](std::vector<int64_t> prefix) {
    std::vector<int64_t> ints = prefix;
    for (int64_t v : {int64_t(PIPEC_BIN_ADD), int64_t(1), int64_t(4),
                      int64_t(1), int64_t(1)})
      ints.push_back(v);
    try {
      pipec_k_binary_bf16(kctx(), bufs, ints.data(), nullptr);
    } catch (const pipec::rt::RtError &e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(refusal({0}).find("counts 0 buffers"), std::string::npos);
  EXPECT_NE(refusal({17}).find("counts 17 buffers"), std::string::npos);
  EXPECT_NE(refusal({3, 0, 0, 0}).find("no buffer is bfloat16"),
            std::string::npos);
  bufs[2] = nullptr;
  EXPECT_NE(refusal({3, 4, 0, -4}).find("bfloat16 buffer 2 is null"),
            std::string::npos);
}
