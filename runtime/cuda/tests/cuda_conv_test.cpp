//===- cuda_conv_test.cpp - CUDA conv2d and its backward ------------------===//
//
// Part of pipec's GPU tests (ctest label `gpu`). Runs the CUDA twins of
// conv2d, conv2d_grad_input and conv2d_grad_weight against the CPU kernels
// on the same inputs (cuda_test_util.h): 1x1, 3x3 and non-square kernels,
// strides, symmetric and asymmetric padding (bottom / right implied by
// oH / oW, padding wider than the kernel), dilations, groups, depthwise
// convolutions with and without a channel multiplier, bias, one and several
// images, odd spatial sizes, several image chunks (the last of one image),
// images processed one at a time (pointwise ones without im2col), and the
// empty and malformed parameter blocks. The backward outputs start random,
// so their "overwritten" contract is checked too. Every case runs twice: on
// cuDNN where the process has it and cuDNN takes the shape (symmetric
// padding), and on im2col + cuBLAS.
//
//===----------------------------------------------------------------------===//

#include "cuda_test_util.h"
#include "cudnn_conv.h"

#include "pipec_rt.h"

#include <cstdint>
#include <cstdio>
#include <optional>
#include <vector>

using namespace pipec::cudatest;

namespace {

/// A convolution's parameters; the output size follows from the four pads.
struct Conv {
  int64_t n, c, h, w, m, kh, kw;
  int64_t sh = 1, sw = 1;
  int64_t pt = 0, pl = 0, pb = 0, pr = 0;
  int64_t dh = 1, dw = 1;
  int64_t groups = 1;
  bool bias = false;

  Conv(int64_t n, int64_t c, int64_t h, int64_t w, int64_t m, int64_t kh,
       int64_t kw)
      : n(n), c(c), h(h), w(w), m(m), kh(kh), kw(kw) {}
  Conv &stride(int64_t y, int64_t x) {
    sh = y, sw = x;
    return *this;
  }
  Conv &pad(int64_t top, int64_t left, int64_t bottom, int64_t right) {
    pt = top, pl = left, pb = bottom, pr = right;
    return *this;
  }
  Conv &pad(int64_t all) { return pad(all, all, all, all); }
  Conv &dilate(int64_t y, int64_t x) {
    dh = y, dw = x;
    return *this;
  }
  Conv &group(int64_t g) {
    groups = g;
    return *this;
  }
  Conv &withBias(bool b = true) {
    bias = b;
    return *this;
  }

  int64_t oh() const { return (h + pt + pb - dh * (kh - 1) - 1) / sh + 1; }
  int64_t ow() const { return (w + pl + pr - dw * (kw - 1) - 1) / sw + 1; }
  std::vector<int64_t> ints() const {
    return {n,  c,  h,  w,  m,  kh, kw,     oh(),        ow(),
            sh, sw, pt, pl, dh, dw, groups, bias ? 1 : 0};
  }
};

// The GPU sums in cuBLAS's order and the CPU in OpenBLAS's (or in its direct
// depthwise loops), so results agree to rounding only: a relative 1e-4, plus
// an absolute term that grows with the length of the sums (the rounding
// error of a float sum of `len` products of values in [-1, 1] grows about
// linearly with len, and results near 0 by cancellation keep it).
constexpr double kRtol = 1e-4;
double atolFor(int64_t len) { return 1e-5 + 1e-7 * double(len); }

/// cuDNN on or off for one scope.
struct CudnnSetting {
  explicit CudnnSetting(bool on) : was(pipec::cuda::setCudnnEnabled(on)) {}
  ~CudnnSetting() { pipec::cuda::setCudnnEnabled(was); }
  bool was;
};

/// 1x1 convolutions as matrix products (PIPEC_POINTWISE_GEMM) on or off for
/// one scope.
struct PointwiseSetting {
  explicit PointwiseSetting(bool on)
      : ctx(pipec::cuda::context(gpuContext(), "test")),
        was(ctx.pointwiseGemm) {
    ctx.pointwiseGemm = on;
  }
  ~PointwiseSetting() { ctx.pointwiseGemm = was; }
  pipec::cuda::Context &ctx;
  bool was;
};

/// The three kernels on random X, W, B, dY against the CPU.
void checkConv(const Conv &cv, unsigned seed = 1) {
  SCOPED_TRACE(::testing::Message()
               << "conv N=" << cv.n << " C=" << cv.c << " H=" << cv.h
               << " W=" << cv.w << " M=" << cv.m << " k=" << cv.kh << "x"
               << cv.kw << " stride=" << cv.sh << "," << cv.sw
               << " pads(t,l,b,r)=" << cv.pt << "," << cv.pl << "," << cv.pb
               << "," << cv.pr << " dil=" << cv.dh << "," << cv.dw
               << " groups=" << cv.groups << " bias=" << cv.bias
               << " oH=" << cv.oh() << " oW=" << cv.ow());
  ASSERT_GT(cv.oh(), 0);
  ASSERT_GT(cv.ow(), 0);
  const int64_t cg = cv.c / cv.groups, mg = cv.m / cv.groups;
  const size_t xCount = size_t(cv.n * cv.c * cv.h * cv.w);
  const size_t wCount = size_t(cv.m * cg * cv.kh * cv.kw);
  const size_t yCount = size_t(cv.n * cv.m * cv.oh() * cv.ow());
  const std::vector<float> x = randf(xCount, -1, 1, seed);
  const std::vector<float> w = randf(wCount, -1, 1, seed + 1);
  const std::vector<float> b = randf(size_t(cv.m), -1, 1, seed + 2);
  const std::vector<float> dy = randf(yCount, -1, 1, seed + 3);
  const std::vector<int64_t> ints = cv.ints();

  // A 1x1 convolution as matrix products, if it is one; on cuDNN (where
  // the process has it and it takes the shape); on im2col + cuBLAS.
  for (int path : {0, 1, 2}) {
    const bool dnn = path < 2;
    SCOPED_TRACE(path == 0   ? "1x1 products if taken, else cuDNN"
                 : path == 1 ? "cuDNN if taken"
                             : "im2col + cuBLAS");
    CudnnSetting setting(dnn);
    PointwiseSetting products(path == 0);
    expectSameAsCpu("conv2d",
                    {in(x), in(w), cv.bias ? in(b) : null(), out(yCount)}, ints,
                    {}, kRtol, atolFor(cg * cv.kh * cv.kw));
    expectSameAsCpu("conv2d_grad_input", {in(dy), in(w), out(xCount)}, ints, {},
                    kRtol, atolFor(mg * cv.kh * cv.kw));
    expectSameAsCpu("conv2d_grad_weight", {in(dy), in(x), out(wCount)}, ints,
                    {}, kRtol, atolFor(cv.n * cv.oh() * cv.ow()));
  }
}

/// checkConv with N = 1 and N = 3, each without and with bias.
void checkConvVariants(Conv cv, unsigned seed = 1) {
  for (int64_t n : {1, 3})
    for (bool bias : {false, true}) {
      cv.n = n;
      cv.withBias(bias);
      checkConv(cv, seed);
    }
}

TEST(CudaConv, CudnnIsLoaded) {
  PIPEC_REQUIRE_GPU();
  // The first convolution opens cuDNN (libcudnn.so.9 on the library path).
  const int64_t before = pipec::cuda::cudnnCallsRun();
  checkConv(Conv(2, 3, 8, 8, 4, 3, 3).pad(1).withBias());
  const int version = pipec::cuda::cudnnVersionLoaded();
  if (version == 0)
    GTEST_SKIP() << "cuDNN not found: every convolution ran on im2col";
  const int64_t ran = pipec::cuda::cudnnCallsRun() - before;
  std::printf("cuDNN %d ran %lld convolution passes\n", version,
              static_cast<long long>(ran));
  EXPECT_EQ(version / 10000, 9);
  // Symmetric padding: cuDNN takes all three passes.
  EXPECT_EQ(ran, 3);
}

/// Sets the context's PIPEC_CUDNN_BF16 switch for a test's duration.
struct Bf16Tensors {
  explicit Bf16Tensors(bool on)
      : ctx(pipec::cuda::context(gpuContext(), "test")), was(ctx.cudnnBf16) {
    ctx.cudnnBf16 = on;
  }
  ~Bf16Tensors() { ctx.cudnnBf16 = was; }
  pipec::cuda::Context &ctx;
  bool was;
};

/// The three passes of `cv` on operands that are bfloat16 values already
/// (drawn from `seed`), against the CPU's within `rtol`.
void checkBf16Passes(const Conv &cv, unsigned seed, double rtol) {
  SCOPED_TRACE(::testing::Message() << "C " << cv.c << " M " << cv.m);
  const std::vector<int64_t> ints = cv.ints();
  const int64_t patch = cv.c * cv.kh * cv.kw, pixels = cv.oh() * cv.ow();
  const size_t xCount = size_t(cv.n * cv.c * cv.h * cv.w),
               wCount = size_t(cv.m * patch),
               yCount = size_t(cv.n * cv.m * pixels);
  const std::vector<float> x = roundedToBf16(randf(xCount, -1, 1, seed));
  const std::vector<float> w = roundedToBf16(randf(wCount, -1, 1, seed + 1));
  const std::vector<float> dy = roundedToBf16(randf(yCount, -1, 1, seed + 2));
  expectSameAsCpu("conv2d", {in(x), in(w), null(), out(yCount)}, ints, {}, rtol,
                  atolFor(patch));
  expectSameAsCpu("conv2d_grad_input", {in(dy), in(w), out(xCount)}, ints, {},
                  rtol, atolFor(cv.m * cv.kh * cv.kw));
  expectSameAsCpu("conv2d_grad_weight", {in(dy), in(x), out(wCount)}, ints, {},
                  rtol, atolFor(cv.n * pixels));
}

// --precision bf16 on operands that are bfloat16 values already: the
// products are exact, so cuDNN (TF32 math on the rounded operands) and
// im2col (bfloat16 GEMMs) both equal the CPU's float32 convolution to the
// order of the sums. The second shape's channels (3 in, 5 out) and patch
// length (27) make im2col's GEMMs take gemm.cu's padded path.
TEST(CudaConv, Bf16OnBf16Operands) {
  PIPEC_REQUIRE_GPU();
  Bf16Matmuls bf16;
  Bf16Tensors tensors(false); // (whatever PIPEC_CUDNN_BF16 says)
  for (bool dnn : {true, false}) {
    SCOPED_TRACE(dnn ? "cuDNN if taken" : "im2col + cuBLAS");
    CudnnSetting setting(dnn);
    for (const Conv &cv : {Conv(3, 8, 12, 12, 16, 3, 3).pad(1),
                           Conv(2, 3, 7, 7, 5, 3, 3).pad(1)})
      checkBf16Passes(cv, 41, kRtol);
  }
}

// PIPEC_CUDNN_BF16=1: cuDNN on bfloat16 tensors. On bfloat16 operands the
// float32 sums are the CPU's up to their order, and then rounded once to
// bfloat16: within 2^-8 of the CPU's float32 result (plus the sums'
// rounding near cancellations). The counter says the bf16 path ran.
TEST(CudaConv, Bf16Tensors) {
  PIPEC_REQUIRE_GPU();
  Bf16Matmuls bf16;
  Bf16Tensors tensors(true);
  PointwiseSetting cudnnOnly(false); // (the 1x1 shape on cuDNN too)
  int major = 0;
  (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  for (const Conv &cv :
       {Conv(3, 8, 12, 12, 16, 3, 3).pad(1), Conv(2, 16, 9, 9, 32, 1, 1),
        Conv(2, 3, 7, 7, 5, 3, 3).pad(1)}) {
    const int64_t calls0 = pipec::cuda::cudnnBf16CallsRun();
    // (2^-7: one rounding is within 2^-8; room for an algorithm that
    // rounds a partial sum too.)
    checkBf16Passes(cv, 44, 1.0 / 128);
    // (A shape cuDNN refuses in bfloat16, and any before sm_80, runs on
    // im2col + cuBLAS.)
    if (pipec::cuda::cudnnVersionLoaded() != 0 && major >= 8) {
      EXPECT_GT(pipec::cuda::cudnnBf16CallsRun(), calls0)
          << "no pass ran on bfloat16 tensors";
    }
  }
}

TEST(CudaConv, Pointwise) {
  PIPEC_REQUIRE_GPU();
  checkConvVariants(Conv(1, 4, 5, 7, 6, 1, 1));
  // (Not with C / groups == 1 on one image: the CPU kernel's grad_input
  // then adds to dX instead of overwriting it.)
  checkConvVariants(Conv(1, 2, 3, 3, 1, 1, 1), 5);
}

// 1x1 convolutions as cuBLAS products (conv.cu, pointwiseProduct): stride
// 1 (X is the operand), strides 2 and 3 on odd sizes (the pixels read are
// gathered, dX scattered back with zeros between), with and without bias;
// the weight gradient through per-image partial sums (few channels, many
// pixels) and through gathered [M, N*P] x [C, N*P] operands (the other
// way round). In float32, and in bf16 (bfloat16 products, float32 sums,
// as the CPU emulates) on bfloat16 operands. Every pass takes the path.
TEST(CudaConv, PointwiseAsProducts) {
  PIPEC_REQUIRE_GPU();
  PointwiseSetting products(true);
  pipec::cuda::Context &ctx = products.ctx;
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "float32");
    std::optional<Bf16Matmuls> rounding;
    if (bf16)
      rounding.emplace();
    for (Conv cv :
         {Conv(3, 5, 7, 6, 4, 1, 1), Conv(2, 4, 9, 7, 6, 1, 1).stride(2, 2),
          Conv(2, 3, 8, 11, 5, 1, 1).stride(3, 2),
          // Many channels, few pixels: the gathered product.
          Conv(4, 40, 2, 2, 48, 1, 1),
          Conv(4, 40, 3, 3, 48, 1, 1).stride(2, 2)})
      for (bool bias : {false, true}) {
        cv.withBias(bias);
        SCOPED_TRACE(::testing::Message()
                     << "N " << cv.n << " C " << cv.c << " M " << cv.m
                     << " stride " << cv.sh << "," << cv.sw << " bias "
                     << bias);
        const std::vector<int64_t> ints = cv.ints();
        const size_t xCount = size_t(cv.n * cv.c * cv.h * cv.w),
                     wCount = size_t(cv.m * cv.c),
                     yCount = size_t(cv.n * cv.m * cv.oh() * cv.ow());
        auto draw = [&](size_t n, unsigned seed) {
          std::vector<float> v = randf(n, -1, 1, seed);
          return bf16 ? roundedToBf16(v) : v;
        };
        const std::vector<float> x = draw(xCount, 61), w = draw(wCount, 62),
                                 b = draw(size_t(cv.m), 63),
                                 dy = draw(yCount, 64);
        const int64_t before = ctx.pointwiseProducts;
        expectSameAsCpu("conv2d",
                        {in(x), in(w), bias ? in(b) : null(), out(yCount)},
                        ints, {}, kRtol, atolFor(cv.c));
        expectSameAsCpu("conv2d_grad_input", {in(dy), in(w), out(xCount)}, ints,
                        {}, kRtol, atolFor(cv.m));
        expectSameAsCpu("conv2d_grad_weight", {in(dy), in(x), out(wCount)},
                        ints, {}, kRtol, atolFor(cv.n * cv.oh() * cv.ow()));
        EXPECT_EQ(ctx.pointwiseProducts - before, 3);
      }
  }
}

TEST(CudaConv, Kernel3x3) {
  PIPEC_REQUIRE_GPU();
  checkConvVariants(Conv(1, 3, 9, 11, 5, 3, 3));          // No padding.
  checkConvVariants(Conv(1, 3, 9, 11, 5, 3, 3).pad(1));   // "Same".
  checkConvVariants(Conv(1, 2, 1, 1, 4, 3, 3).pad(1), 7); // 1x1 image.
}

TEST(CudaConv, NonSquareKernel) {
  PIPEC_REQUIRE_GPU();
  checkConvVariants(Conv(1, 3, 7, 10, 4, 5, 3).pad(2, 1, 2, 1));
  checkConvVariants(Conv(1, 2, 6, 9, 3, 1, 7).pad(0, 3, 0, 3), 3);
}

TEST(CudaConv, Stride2) {
  PIPEC_REQUIRE_GPU();
  checkConvVariants(Conv(1, 4, 13, 9, 6, 3, 3).stride(2, 2).pad(1));
  // ResNet's projection shortcut: 1x1, stride 2 (not pointwise).
  checkConvVariants(Conv(1, 4, 13, 9, 6, 1, 1).stride(2, 2), 3);
  // Leftover rows / columns that no window reaches.
  checkConvVariants(Conv(1, 3, 8, 11, 5, 3, 3).stride(2, 2), 5);
  // Different strides per axis; a stride larger than the kernel.
  checkConvVariants(Conv(1, 3, 12, 11, 4, 2, 3).stride(3, 1).pad(1), 7);
  checkConvVariants(Conv(1, 2, 11, 13, 3, 2, 2).stride(4, 3), 9);
}

TEST(CudaConv, AsymmetricPadding) {
  PIPEC_REQUIRE_GPU();
  checkConvVariants(Conv(1, 3, 9, 8, 4, 3, 3).pad(1, 0, 2, 1));
  // SAME_UPPER / SAME_LOWER for an even input and stride 2.
  checkConvVariants(Conv(1, 3, 10, 10, 4, 3, 3).stride(2, 2).pad(0, 0, 1, 1),
                    3);
  checkConvVariants(Conv(1, 3, 10, 10, 4, 3, 3).stride(2, 2).pad(1, 1, 0, 0),
                    5);
  // Padding wider than the kernel: whole output rows / columns see only
  // padding (just the bias).
  checkConvVariants(Conv(1, 2, 4, 5, 3, 3, 3).pad(3, 4, 3, 2), 7);
}

TEST(CudaConv, Dilation) {
  PIPEC_REQUIRE_GPU();
  checkConvVariants(Conv(1, 3, 11, 9, 4, 3, 3).dilate(2, 2).pad(2));
  checkConvVariants(
      Conv(1, 3, 11, 12, 4, 3, 3).dilate(2, 1).stride(1, 2).pad(2, 1, 2, 1), 3);
  checkConvVariants(Conv(1, 2, 13, 13, 3, 3, 3).dilate(2, 2).stride(2, 2), 5);
}

TEST(CudaConv, Groups) {
  PIPEC_REQUIRE_GPU();
  checkConvVariants(Conv(1, 4, 9, 7, 6, 3, 3).pad(1).group(2));
  checkConvVariants(Conv(1, 6, 7, 7, 9, 1, 1).group(3), 3);
  checkConvVariants(Conv(1, 4, 11, 9, 4, 3, 3).stride(2, 2).pad(1).group(2), 5);
  checkConvVariants(Conv(1, 4, 9, 9, 2, 3, 3).dilate(2, 2).pad(2).group(2), 7);
}

TEST(CudaConv, Depthwise) {
  PIPEC_REQUIRE_GPU();
  checkConvVariants(Conv(1, 5, 9, 7, 5, 3, 3).pad(1).group(5));
  checkConvVariants(Conv(1, 5, 11, 9, 5, 3, 3).stride(2, 2).pad(1).group(5), 3);
  // Channel multiplier 2.
  checkConvVariants(Conv(1, 3, 9, 8, 6, 3, 3).pad(1).group(3), 5);
  checkConvVariants(
      Conv(1, 4, 13, 11, 4, 5, 5).dilate(2, 2).pad(4, 4, 3, 2).group(4), 7);
}

TEST(CudaConv, SeveralImageChunks) {
  PIPEC_REQUIRE_GPU();
  // 64 x 64 outputs: 16 images per chunk, so 17 images make a chunk of 16
  // and one of a single image (grad_weight adds the second into the first).
  checkConv(Conv(17, 3, 64, 64, 4, 3, 3).pad(1).withBias());
  checkConv(Conv(17, 4, 64, 64, 4, 3, 3).pad(1).group(2), 3);
  checkConv(Conv(17, 4, 64, 64, 6, 1, 1).group(2).withBias(), 5);
  // Chunks of 16 and 4; of 16 and 2 at stride 2 (64 x 64 outputs again).
  checkConv(Conv(20, 3, 64, 64, 4, 3, 3).pad(1), 7);
  checkConv(Conv(18, 3, 128, 128, 4, 3, 3).stride(2, 2).pad(1).withBias(), 9);
  // Small outputs (7 x 7): all images in one chunk.
  checkConv(Conv(40, 8, 7, 7, 8, 3, 3).pad(1).withBias(), 11);
}

TEST(CudaConv, LargeImagesOneAtATime) {
  PIPEC_REQUIRE_GPU();
  // 260 x 260 outputs exceed one chunk's columns: images go one by one and
  // Y / dY are used in place.
  checkConv(Conv(2, 2, 260, 260, 3, 3, 3).pad(1).withBias());
  // Pointwise, one image at a time: X and dX are the GEMM operands.
  checkConv(Conv(2, 4, 260, 260, 4, 1, 1).group(2).withBias(), 3);
  checkConv(Conv(1, 3, 260, 260, 2, 1, 1), 5);
}

TEST(CudaConv, EmptyShapes) {
  PIPEC_REQUIRE_GPU();
  // No input channels: Y is the bias.
  expectSameAsCpu(
      "conv2d",
      {in({}), in({}), in(randf(3, -1, 1, 2)), out(size_t(2 * 3 * 4 * 5))},
      {2, 0, 4, 5, 3, 3, 3, 4, 5, 1, 1, 1, 1, 1, 1, 1, 1});
  // hasBias set without a bias buffer: no bias.
  expectSameAsCpu("conv2d",
                  {in(randf(2 * 3 * 5 * 5, -1, 1, 3)),
                   in(randf(4 * 3 * 3 * 3, -1, 1, 4)), null(),
                   out(size_t(2 * 4 * 3 * 3))},
                  {2, 3, 5, 5, 4, 3, 3, 3, 3, 1, 1, 0, 0, 1, 1, 1, 1}, {},
                  kRtol, atolFor(27));
  // No output channels: dX is zeroed.
  expectSameAsCpu("conv2d_grad_input",
                  {in({}), in({}), out(size_t(2 * 3 * 25))},
                  {2, 3, 5, 5, 0, 3, 3, 3, 3, 1, 1, 0, 0, 1, 1, 1, 0});
  // No output pixels: dW is zeroed. (Not grad_input: the CPU kernel
  // divides by P = 0 there.)
  expectSameAsCpu("conv2d_grad_weight",
                  {in({}), in(randf(2 * 3 * 25)), out(size_t(4 * 27))},
                  {2, 3, 5, 5, 4, 3, 3, 0, 3, 1, 1, 0, 0, 1, 1, 1, 0});
  // No images: dW is zeroed.
  expectSameAsCpu("conv2d_grad_weight", {in({}), in({}), out(size_t(4 * 27))},
                  {0, 3, 5, 5, 4, 3, 3, 3, 3, 1, 1, 0, 0, 1, 1, 1, 0});
}

TEST(CudaConv, MalformedPoisons) {
  PIPEC_REQUIRE_GPU();
  // C = 3 not divisible by 2 groups: every output is NaN (cg = 1 for the
  // weight count, as the CPU sizes dW).
  const std::vector<int64_t> badGroups = {1, 3, 5, 5, 4, 3, 3, 3, 3,
                                          1, 1, 0, 0, 1, 1, 2, 0};
  expectSameAsCpu("conv2d",
                  {in(randf(75)), in(randf(4 * 9)), null(), out(size_t(36))},
                  badGroups);
  expectSameAsCpu("conv2d_grad_input",
                  {in(randf(36)), in(randf(4 * 9)), out(size_t(75))},
                  badGroups);
  expectSameAsCpu("conv2d_grad_weight",
                  {in(randf(36)), in(randf(75)), out(size_t(4 * 9))},
                  badGroups);
  // Zero stride.
  const std::vector<int64_t> badStride = {1, 2, 5, 5, 2, 3, 3, 3, 3,
                                          0, 1, 0, 0, 1, 1, 1, 0};
  expectSameAsCpu("conv2d",
                  {in(randf(50)), in(randf(36)), null(), out(size_t(18))},
                  badStride);
  expectSameAsCpu("conv2d_grad_input",
                  {in(randf(18)), in(randf(36)), out(size_t(50))}, badStride);
  expectSameAsCpu("conv2d_grad_weight",
                  {in(randf(18)), in(randf(50)), out(size_t(36))}, badStride);
}

} // namespace
