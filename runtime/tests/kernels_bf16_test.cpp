//===- kernels_bf16_test.cpp - bfloat16 matrix products on the CPU --------===//
//
// Part of pipec's runtime tests. `--precision bf16` on the CPU target: every
// matrix product (gemm, batch_matmul, the convolutions' GEMMs) rounds its
// operands to the nearest bfloat16 first (cpu/matmul_bf16.cpp). A kernel in
// that mode must equal, bit for bit, the float32 kernel on operands rounded
// beforehand (the products are exact in float32 either way), and must
// differ from the float32 kernel on the original operands.
//
//===----------------------------------------------------------------------===//

#include "cpu/real.h"
#include "kernels_nn_test_util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>

using namespace pipec_test;

namespace {

/// The tests' kernel context's matrix products in bfloat16 while in scope.
struct Bf16Matmuls {
  Bf16Matmuls() { kctx()->matmulBf16 = true; }
  ~Bf16Matmuls() { kctx()->matmulBf16 = false; }
};

/// `x` rounded to the nearest bfloat16, ties to even (an independent
/// formulation of the rule: the nearer of the two bfloat16 neighbours).
float nearestBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  uint32_t down = bits & 0xFFFF0000u, up = down + 0x10000u;
  float lo, hi;
  std::memcpy(&lo, &down, 4);
  std::memcpy(&hi, &up, 4);
  const double dl = std::fabs(double(x) - lo), dh = std::fabs(double(hi) - x);
  if (dl < dh)
    return lo;
  if (dh < dl)
    return hi;
  return (down >> 16) % 2 == 0 ? lo : hi;
}

Floats rounded(Floats v) {
  for (float &x : v)
    x = nearestBf16(x);
  return v;
}

} // namespace

TEST(KernelBf16, GemmEqualsFloat32GemmOfRoundedOperands) {
  std::mt19937 rng(5);
  const int64_t m = 19, n = 23, k = 37;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Floats a = randomFloats(rng, m * k), b = randomFloats(rng, k * n);
      Floats c = randomFloats(rng, n);
      Floats want(m * n), got(m * n), plain(m * n);
      gemm(rounded(a).data(), rounded(b).data(), c.data(), want.data(), m, n, k,
           ta, tb, true, 0, 1, 0.5, 1.0);
      gemm(a.data(), b.data(), c.data(), plain.data(), m, n, k, ta, tb, true, 0,
           1, 0.5, 1.0);
      {
        Bf16Matmuls bf16;
        gemm(a.data(), b.data(), c.data(), got.data(), m, n, k, ta, tb, true, 0,
             1, 0.5, 1.0);
      }
      EXPECT_EQ(got, want) << "tA " << ta << " tB " << tb;
      EXPECT_NE(got, plain) << "no bfloat16 rounding visible";
    }
}

TEST(KernelBf16, BatchMatmulAndConvolutionToo) {
  std::mt19937 rng(6);
  // [3, 8, 12] x [3, 12, 5]
  Floats a = randomFloats(rng, 3 * 8 * 12), b = randomFloats(rng, 3 * 12 * 5);
  Floats want(3 * 8 * 5), got(3 * 8 * 5);
  batchMatmul(rounded(a).data(), rounded(b).data(), want.data(), {3}, {8 * 12},
              {12 * 5}, 8, 5, 12, false, false, 1.0);
  {
    Bf16Matmuls bf16;
    batchMatmul(a.data(), b.data(), got.data(), {3}, {8 * 12}, {12 * 5}, 8, 5,
                12, false, false, 1.0);
  }
  EXPECT_EQ(got, want);

  ConvParams p;
  p.n = 2, p.c = 3, p.h = 9, p.w = 7, p.m = 4, p.kh = 3, p.kw = 3;
  p.pt = p.pl = p.pb = p.pr = 1;
  p.hasBias = true;
  Floats x = randomFloats(rng, p.xCount()), w = randomFloats(rng, p.wCount());
  Floats bias = randomFloats(rng, p.m);
  Floats y0(p.yCount()), y1(p.yCount());
  conv2d(p, rounded(x).data(), rounded(w).data(), bias.data(), y0.data());
  {
    Bf16Matmuls bf16;
    conv2d(p, x.data(), w.data(), bias.data(), y1.data());
  }
  EXPECT_EQ(y1, y0);
}

TEST(KernelBf16, RoundingTiesInfinityAndNaN) {
  Bf16Matmuls bf16;
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even (1). 1 + 3 * 2^-8
  // is a tie between 1 + 2^-7 and 1 + 2^-6: to even (1 + 2^-6). The
  // largest float rounds to infinity; a NaN stays a NaN.
  const float inf = std::numeric_limits<float>::infinity();
  Floats a = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 3.4028235e38f,
              std::numeric_limits<float>::quiet_NaN()};
  Floats one = {1.0f};
  Floats y(4);
  // [4, 1] x [1, 1]: y = a * 1.
  gemm(a.data(), one.data(), nullptr, y.data(), 4, 1, 1, false, false, false, 0,
       0, 1.0, 0.0);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 1.0f + 0x1p-6f);
  EXPECT_EQ(y[2], inf);
  EXPECT_TRUE(std::isnan(y[3]));
}

// ABI 3: the arithmetic travels in the kernel context, not in the process.
// Two contexts side by side keep their own, a context made "like" another
// copies it, and a kernel that needs its context refuses a missing one.
TEST(KernelContext, ArithmeticIsPerContext) {
  std::mt19937 rng(7);
  const int64_t m = 9, n = 11, k = 13;
  Floats a = randomFloats(rng, m * k), b = randomFloats(rng, k * n);
  pipec_kctx *f32 = pipec_rt_cpu_kernel_context_new(nullptr);
  pipec::cpu::KernelContext bf16Ctx;
  bf16Ctx.matmulBf16 = true;
  pipec_kctx *like = pipec_rt_cpu_kernel_context_new(&bf16Ctx);
  EXPECT_TRUE(like->matmulBf16);
  EXPECT_FALSE(f32->matmulBf16);
  auto run = [&](pipec_kctx *kc) {
    Floats y(size_t(m * n));
    void *bufs[] = {a.data(), b.data(), nullptr, y.data()};
    const int64_t ints[] = {m, n, k, 0, 0, 0, 0, 0};
    const double reals[] = {1.0, 0.0};
    pipec_k_gemm(kc, bufs, ints, reals);
    return y;
  };
  Floats plain = run(f32), viaLike = run(like), viaBf16 = run(&bf16Ctx);
  EXPECT_EQ(viaLike, viaBf16);
  EXPECT_NE(plain, viaBf16) << "no bfloat16 rounding visible";
  Floats want(size_t(m * n));
  gemm(rounded(a).data(), rounded(b).data(), nullptr, want.data(), m, n, k, 0,
       0, false, 0, 0, 1.0, 0.0);
  EXPECT_EQ(viaBf16, want);
  // The process-wide test context was not touched.
  EXPECT_EQ(run(kctx()), plain);
  pipec_rt_cpu_kernel_context_free(like);
  pipec_rt_cpu_kernel_context_free(f32);

  Floats y(size_t(m * n));
  void *bufs[] = {a.data(), b.data(), nullptr, y.data()};
  const int64_t ints[] = {m, n, k, 0, 0, 0, 0, 0};
  const double reals[] = {1.0, 0.0};
  try {
    pipec_k_gemm(nullptr, bufs, ints, reals);
    ADD_FAILURE() << "a missing kernel context was accepted";
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find("pipec_k_gemm: no kernel context"),
              std::string::npos)
        << e.what();
  }
}
