//===- conv.cu - 2-D convolution and its backward on cuBLAS ---------------===//
//
// Part of pipec's CUDA runtime. CUDA twins of pipec_k_conv2d,
// pipec_k_conv2d_grad_input and pipec_k_conv2d_grad_weight (see
// include/pipec_rt.h for the parameter layouts and cpu/conv.cpp for the
// reference).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// 1x1 convolutions (one group, unpadded, any stride: ResNet's bottleneck
/// and projection convolutions) are matrix products first
/// (pointwiseProduct; PIPEC_POINTWISE_GEMM=0 sends them on as below): Y[n]
/// = W X[n] and dX[n] = W^T dY[n] as strided-batched products over the
/// images, dW = sum over n of dY[n] X[n]^T either per image into partial
/// products summed in image order or as one product over gathered [M,
/// N*P] and [C, N*P] operands, whichever needs less scratch; with a stride
/// the pixels read are gathered first (and dX scattered back, zeros
/// between). All deterministic. Why: cuDNN's deterministic algorithms ran
/// the backward of ResNet-50's 1x1 convolutions at 4-12 TFLOP/s on an H200
/// (43.5 of the 91 ms float32 step, 2026-11-27; the 3x3 ones ran at about
/// 37), where a float32 GEMM of these shapes runs at several times that.
/// Written after that run: not yet run on a GPU.
///
/// ONNX Conv in NCHW on cuDNN when the process has it (cudnn_conv.h: each
/// pass asks cudnnConvolution first; the bias is added after cuDNN's
/// forward), else, and for what cuDNN cannot express, as im2col + cuBLAS
/// SGEMM, described here. With Cg = C /
/// groups, Mg = M / groups, a patch of K = Cg * kH * kW inputs and P = oH *
/// oW output pixels, images are processed in chunks of nb images (bounded by
/// kScratchBudget bytes of workspace and kMaxColumns GEMM columns). For a
/// chunk, the patch matrix col has C * kH * kW rows (channel, ki, kj) and
/// nb * P columns (image, pixel):
///
///   col[(c, ki, kj), (b, oh, ow)] =
///       X[n0 + b, c, oh*sH - padTop + ki*dH, ow*sW - padLeft + kj*dW]
///
/// or 0 where that falls outside the image (the CPU's zero padding; bottom /
/// right padding is whatever oH / oW imply). Group g's rows are the K rows
/// starting at g * K, so every product below is one strided-batched GEMM
/// over the groups per chunk, on row-major operands:
///
///   forward:      Yt[g] (Mg x nbP) = W[g] (Mg x K) * col[g] (K x nbP)
///   grad_input:   colGrad[g] (K x nbP) = W[g]^T (K x Mg) * dYt[g] (Mg x nbP)
///                 dX = col2im(colGrad)
///   grad_weight:  dW[g] (Mg x K) (+)= dYt[g] (Mg x nbP) * col[g]^T (nbP x K)
///
/// where Yt / dYt is Y / dY of the chunk in [M, nb, P] order (a copy kernel
/// converts from / to NCHW's [nb, M, P]; with nb == 1 the two orders are the
/// same and Y / dY are used in place). grad_weight's first chunk writes dW
/// with beta = 0 and later chunks add with beta = 1, in image order, so dW
/// is overwritten and the result is deterministic. The forward bias is added
/// after the GEMM (y = acc + b, one rounding, as OpenBLAS adds its product
/// to the bias preloaded in Y). Pointwise convolutions (1x1, stride 1, no
/// padding, oH = H, oW = W) on single-image chunks use X / dX as col /
/// colGrad directly.
///
/// col2im is a gather: one thread per dX element adds, in (ki, kj) order,
/// the colGrad entries of the kernel positions that read it (the CPU's
/// order for one group), and overwrites dX; no atomics. Every kernel is
/// deterministic. The GEMMs sum in cuBLAS's order, not OpenBLAS's, so the
/// results agree with the CPU to rounding (not to the bit).
///
/// Malformed parameters (C or M not divisible by groups, non-positive
/// kernel, stride or dilation, GEMM dimensions beyond 32 bits) poison the
/// output with NaN, as on the CPU; the early returns for empty shapes are
/// the CPU's too. Index arithmetic is 32-bit when every index of a launch
/// fits comfortably, 64-bit otherwise.
///
//===----------------------------------------------------------------------===//

#include "core/conv_shape.h"
#include "cuda_rt.h"
#include "cudnn_conv.h"
#include "pipec_rt.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

namespace pipec {
namespace cuda {
namespace {

constexpr int kBlock = 256;
/// Workspace bound per call (the chunk size adapts; a single image that
/// needs more still runs, alone).
constexpr double kScratchBudget = 256.0 * 1024 * 1024;
/// Most GEMM columns (nb * P) per chunk: wide enough to fill the GPU.
constexpr int64_t kMaxColumns = int64_t(1) << 16;
/// Bound below which an index space uses 32-bit arithmetic (leaves room for
/// the grid stride without overflow).
constexpr int64_t kSmallLimit = int64_t(1) << 30;

//===----------------------------------------------------------------------===//
// Shape
//===----------------------------------------------------------------------===//

/// The geometry the im2col / col2im kernels need (passed by value).
struct Geom {
  int64_t c, h, w, kh, kw, oh, ow, sh, sw, pt, pl, dh, dw;
};

Geom geomOf(const ConvShape &s) {
  return {s.c,  s.h,  s.w,  s.kh, s.kw, s.oh, s.ow,
          s.sh, s.sw, s.pt, s.pl, s.dh, s.dw};
}

/// True when every spatial coordinate im2col / col2im form (oh * sH, the
/// padding and kernel offsets, input positions) stays far inside int32.
bool smallCoordinates(const Geom &g) {
  const double boundH = double(g.oh + 1) * double(g.sh) +
                        std::fabs(double(g.pt)) + double(g.kh) * double(g.dh) +
                        double(g.h);
  const double boundW = double(g.ow + 1) * double(g.sw) +
                        std::fabs(double(g.pl)) + double(g.kw) * double(g.dw) +
                        double(g.w);
  return boundH < double(kSmallLimit) && boundW < double(kSmallLimit);
}

bool small(int64_t count) { return count >= 0 && count < kSmallLimit; }

//===----------------------------------------------------------------------===//
// Device kernels
//===----------------------------------------------------------------------===//

/// col[(ch, ki, kj), (b, oy, ox)] for the cnt images at x (row length
/// cnt * P); zero where the input position is padding.
template <class I>
__global__ void im2colKernel(const float *__restrict__ x,
                             float *__restrict__ col, Geom g, int64_t cnt64) {
  const I c = I(g.c), h = I(g.h), w = I(g.w), kh = I(g.kh), kw = I(g.kw);
  const I oh = I(g.oh), ow = I(g.ow), sh = I(g.sh), sw = I(g.sw);
  const I pt = I(g.pt), pl = I(g.pl), dh = I(g.dh), dw = I(g.dw);
  const I cnt = I(cnt64);
  const I p = oh * ow;
  const I total = c * kh * kw * cnt * p;
  for (I e = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); e < total;
       e += I(gridDim.x) * I(blockDim.x)) {
    const I pix = e % p;
    I t = e / p;
    const I b = t % cnt;
    t /= cnt;
    const I kj = t % kw;
    t /= kw;
    const I ki = t % kh;
    const I ch = t / kh;
    const I oy = pix / ow;
    const I ox = pix - oy * ow;
    const I iy = oy * sh - pt + ki * dh;
    const I ix = ox * sw - pl + kj * dw;
    float v = 0.0f;
    if (iy >= 0 && iy < h && ix >= 0 && ix < w)
      v = x[((b * c + ch) * h + iy) * w + ix];
    col[e] = v;
  }
}

/// dx (cnt images, overwritten) = col2im(col): each element sums, in
/// (ki, kj) order, the col entries of the kernel positions reading it.
template <class I>
__global__ void col2imKernel(const float *__restrict__ col,
                             float *__restrict__ dx, Geom g, int64_t cnt64) {
  const I c = I(g.c), h = I(g.h), w = I(g.w), kh = I(g.kh), kw = I(g.kw);
  const I oh = I(g.oh), ow = I(g.ow), sh = I(g.sh), sw = I(g.sw);
  const I pt = I(g.pt), pl = I(g.pl), dh = I(g.dh), dw = I(g.dw);
  const I cnt = I(cnt64);
  const I p = oh * ow;
  const I ld = cnt * p; // Row length of col.
  const I total = cnt * c * h * w;
  for (I e = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); e < total;
       e += I(gridDim.x) * I(blockDim.x)) {
    const I ix = e % w;
    I t = e / w;
    const I iy = t % h;
    t /= h;
    const I ch = t % c;
    const I b = t / c;
    // Row (ch, 0, 0), column (b, 0, 0).
    const float *base = col + ch * kh * kw * ld + b * p;
    float acc = 0.0f;
    for (I ki = 0; ki < kh; ++ki) {
      const I ty = iy + pt - ki * dh; // oy * sH when ki reads row iy.
      if (ty < 0)
        break; // Decreases with ki.
      if (ty % sh != 0)
        continue;
      const I oy = ty / sh;
      if (oy >= oh)
        continue;
      for (I kj = 0; kj < kw; ++kj) {
        const I tx = ix + pl - kj * dw;
        if (tx < 0)
          break;
        if (tx % sw != 0)
          continue;
        const I ox = tx / sw;
        if (ox >= ow)
          continue;
        acc = __fadd_rn(acc, base[(ki * kw + kj) * ld + oy * ow + ox]);
      }
    }
    dx[e] = acc;
  }
}

/// dst [M, cnt, P] = src [cnt, M, P] (NCHW chunk to GEMM order).
template <class I>
__global__ void packKernel(const float *__restrict__ src,
                           float *__restrict__ dst, int64_t m64, int64_t cnt64,
                           int64_t p64) {
  const I m = I(m64), cnt = I(cnt64), p = I(p64);
  const I total = m * cnt * p;
  for (I e = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); e < total;
       e += I(gridDim.x) * I(blockDim.x)) {
    const I pix = e % p;
    const I t = e / p;
    const I b = t % cnt;
    const I ch = t / cnt;
    dst[e] = src[(b * m + ch) * p + pix];
  }
}

/// dst [cnt, M, P] = src [M, cnt, P] (+ bias[channel]). With cnt == 1, src
/// may be dst (each element is read and written by the same thread).
template <class I>
__global__ void unpackKernel(const float *src, float *dst, const float *bias,
                             int64_t m64, int64_t cnt64, int64_t p64) {
  const I m = I(m64), cnt = I(cnt64), p = I(p64);
  const I total = m * cnt * p;
  for (I e = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); e < total;
       e += I(gridDim.x) * I(blockDim.x)) {
    const I pix = e % p;
    const I t = e / p;
    const I ch = t % m;
    const I b = t / m;
    float v = src[(ch * cnt + b) * p + pix];
    if (bias)
      v = __fadd_rn(v, bias[ch]);
    dst[e] = v;
  }
}

/// y[e] = bias[(e / p) % m] if bias, else value (zeros, NaN poison).
__global__ void fillKernel(float *y, int64_t total, float value,
                           const float *bias, int64_t m, int64_t p) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x)
    y[e] = bias ? bias[(e / p) % m] : value;
}

//===----------------------------------------------------------------------===//
// Launch helpers
//===----------------------------------------------------------------------===//

void fill(Context &ctx, float *y, int64_t total, float value, const float *bias,
          int64_t m, int64_t p, const char *kName) {
  if (total <= 0)
    return;
  fillKernel<<<gridFor(total, kBlock), kBlock, 0, ctx.stream>>>(y, total, value,
                                                                bias, m, p);
  checkLaunch(kName);
}

/// Y[b, c, :] += bias[c] for Y of [n, m, p] (after cuDNN's forward).
template <typename I>
__global__ void addBiasKernel(float *y, const float *bias, I m, I p, I total) {
  for (I e = I(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += I(gridDim.x) * blockDim.x)
    y[e] += bias[(e / p) % m];
}

void addBias(Context &ctx, float *y, const float *bias, int64_t n, int64_t m,
             int64_t p, const char *kName) {
  const int64_t total = n * m * p;
  if (total <= 0)
    return;
  cudaStream_t stream = ctx.stream;
  if (small(total))
    addBiasKernel<int32_t><<<gridFor(total, kBlock), kBlock, 0, stream>>>(
        y, bias, int32_t(m), int32_t(p), int32_t(total));
  else
    addBiasKernel<int64_t>
        <<<gridFor(total, kBlock), kBlock, 0, stream>>>(y, bias, m, p, total);
  checkLaunch(kName);
}

void poison(Context &ctx, float *y, int64_t total, const char *kName) {
  fill(ctx, y, total, std::numeric_limits<float>::quiet_NaN(), nullptr, 1, 1,
       kName);
}

void im2col(Context &ctx, const float *x, float *col, const ConvShape &s,
            int64_t cnt, const char *kName) {
  const Geom g = geomOf(s);
  const int64_t total = s.colRows() * cnt * s.p;
  if (total <= 0)
    return;
  cudaStream_t stream = ctx.stream;
  if (small(total) && small(cnt * s.c * s.h * s.w) && smallCoordinates(g))
    im2colKernel<int32_t>
        <<<gridFor(total, kBlock), kBlock, 0, stream>>>(x, col, g, cnt);
  else
    im2colKernel<int64_t>
        <<<gridFor(total, kBlock), kBlock, 0, stream>>>(x, col, g, cnt);
  checkLaunch(kName);
}

void col2im(Context &ctx, const float *col, float *dx, const ConvShape &s,
            int64_t cnt, const char *kName) {
  const Geom g = geomOf(s);
  const int64_t total = cnt * s.c * s.h * s.w;
  if (total <= 0)
    return;
  cudaStream_t stream = ctx.stream;
  if (small(total) && small(s.colRows() * cnt * s.p) && smallCoordinates(g))
    col2imKernel<int32_t>
        <<<gridFor(total, kBlock), kBlock, 0, stream>>>(col, dx, g, cnt);
  else
    col2imKernel<int64_t>
        <<<gridFor(total, kBlock), kBlock, 0, stream>>>(col, dx, g, cnt);
  checkLaunch(kName);
}

void pack(Context &ctx, const float *src, float *dst, int64_t m, int64_t cnt,
          int64_t p, const char *kName) {
  const int64_t total = m * cnt * p;
  if (total <= 0)
    return;
  cudaStream_t stream = ctx.stream;
  if (small(total))
    packKernel<int32_t>
        <<<gridFor(total, kBlock), kBlock, 0, stream>>>(src, dst, m, cnt, p);
  else
    packKernel<int64_t>
        <<<gridFor(total, kBlock), kBlock, 0, stream>>>(src, dst, m, cnt, p);
  checkLaunch(kName);
}

void unpack(Context &ctx, const float *src, float *dst, const float *bias,
            int64_t m, int64_t cnt, int64_t p, const char *kName) {
  const int64_t total = m * cnt * p;
  if (total <= 0)
    return;
  cudaStream_t stream = ctx.stream;
  if (small(total))
    unpackKernel<int32_t><<<gridFor(total, kBlock), kBlock, 0, stream>>>(
        src, dst, bias, m, cnt, p);
  else
    unpackKernel<int64_t><<<gridFor(total, kBlock), kBlock, 0, stream>>>(
        src, dst, bias, m, cnt, p);
  checkLaunch(kName);
}

/// For g in [0, batch): row-major C_g [m x n] = op(A_g) op(B_g) + beta C_g,
/// with X_g = X + g * strideX and lda / ldb / ldc the row lengths of the
/// stored matrices. Row-major C is column-major C^T = op(B)^T op(A)^T, so B
/// goes first with the same transpose flags (see gemm.cu).
void gemmGroups(Context &ctx, bool transA, bool transB, int64_t m, int64_t n,
                int64_t k, const float *a, int64_t lda, int64_t strideA,
                const float *b, int64_t ldb, int64_t strideB, float *c,
                int64_t ldc, int64_t strideC, int64_t batch, float beta,
                const char *kName) {
  if (!fitsInt(m) || !fitsInt(n) || !fitsInt(k) || !fitsInt(lda) ||
      !fitsInt(ldb) || !fitsInt(ldc) || !fitsInt(batch))
    fail((std::string(kName) +
          ": a matrix dimension exceeds cuBLAS's 32-bit limit")
             .c_str());
  gemmStridedBatched(ctx, blasOp(transB), blasOp(transA), int(n), int(m),
                     int(k), 1.0f, b, int(ldb), strideB, a, int(lda), strideA,
                     beta, c, int(ldc), strideC, int(batch), kName);
}

//===----------------------------------------------------------------------===//
// Chunking
//===----------------------------------------------------------------------===//

/// Images per chunk and the workspace layout: col (colFloats, rounded up to
/// 256 bytes) followed by the [M, nb, P] buffer (packFloats).
struct Plan {
  int64_t nb = 1;
  int64_t colFloats = 0;
  int64_t packFloats = 0;
  float *col = nullptr;
  float *packed = nullptr;
};

Plan makePlan(Context &ctx, const ConvShape &s) {
  Plan plan;
  const double perImage =
      (double(s.colRows()) + double(s.m)) * double(s.p) * sizeof(float);
  int64_t nb = perImage > 0 ? int64_t(kScratchBudget / perImage) : s.n;
  nb = std::min(nb, s.p > 0 ? kMaxColumns / s.p : s.n);
  nb = std::max<int64_t>(1, std::min(nb, s.n));
  plan.nb = nb;
  // A single-image pointwise chunk reads X / writes dX as col directly.
  if (!(s.pointwise() && nb == 1))
    plan.colFloats = (s.colRows() * nb * s.p + 63) / 64 * 64;
  if (nb > 1)
    plan.packFloats = s.m * nb * s.p;
  const int64_t floats = plan.colFloats + plan.packFloats;
  if (floats > 0) {
    float *base =
        static_cast<float *>(scratch(ctx, sizeof(float) * size_t(floats)));
    plan.col = base;
    plan.packed = base + plan.colFloats;
  }
  return plan;
}

//===----------------------------------------------------------------------===//
// 1x1 convolutions as matrix products
//===----------------------------------------------------------------------===//

/// Whether a 1x1 convolution reads every input pixel (stride 1): then X is
/// its own [N, C, P] operand.
bool everyPixel(const ConvShape &s) { return s.sh == 1 && s.sw == 1; }

/// The weight gradient's two ways, in floats of scratch (see
/// pointwiseGradWeight).
double partialFloats(const ConvShape &s) {
  return double(s.n) * double(s.m) * double(s.c);
}
double gatheredFloats(const ConvShape &s) {
  return double(s.m + s.c) * double(s.n) * double(s.p);
}

/// Whether `s` is a 1x1 convolution the products below compute (one group,
/// no padding, the output the strided input's size) and the context takes
/// them (PIPEC_POINTWISE_GEMM), within kPointwiseScratch of scratch for
/// `pass` (else the convolution goes on to cuDNN or im2col as before;
/// ResNet-50 at batch 64 needs at most about 85 MB).
constexpr double kPointwiseScratch = 2 * kScratchBudget;
bool pointwiseProduct(const Context &ctx, const ConvShape &s, ConvPass pass) {
  if (!ctx.pointwiseGemm || s.kh != 1 || s.kw != 1 || s.groups != 1 ||
      s.pt != 0 || s.pl != 0 || s.h <= 0 || s.w <= 0 ||
      s.oh != (s.h - 1) / s.sh + 1 || s.ow != (s.w - 1) / s.sw + 1)
    return false;
  const double dense = everyPixel(s) ? 0.0 : double(s.n * s.c * s.p);
  const double floats =
      pass == ConvPass::GradWeight
          ? std::min(partialFloats(s) + dense, gatheredFloats(s))
          : dense;
  return floats * sizeof(float) <= kPointwiseScratch;
}

/// The pixels a strided 1x1 convolution reads, [N, C, oH, oW] of X:
/// gathered densely ([N, C, P]) before the products, and dX's scattered
/// back from dense after them.
struct PixelsRead {
  int64_t dims[4], strides[4];
  explicit PixelsRead(const ConvShape &s)
      : dims{s.n, s.c, s.oh, s.ow}, strides{s.c * s.h * s.w, s.h * s.w,
                                            s.sh * s.w, s.sw} {}
};

/// dW[e] = sum over n of part[n][e] in image order (deterministic).
template <typename I>
__global__ void sumImages(const float *__restrict__ part,
                          float *__restrict__ dw, I images, I count) {
  for (I e = I(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += I(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (I n = 0; n < images; ++n)
      sum += part[n * count + e];
    dw[e] = sum;
  }
}

/// The forward: Y[n] (M x P) = W (M x C) X[n] (C x P), one strided-batched
/// product over the images (W shared), then the bias.
void pointwiseForward(Context &ctx, const ConvShape &s, const float *x,
                      const float *w, const float *bias, float *y,
                      const char *kName) {
  const float *xs = x;
  if (!everyPixel(s)) {
    float *dense = static_cast<float *>(
        scratch(ctx, sizeof(float) * size_t(s.n * s.c * s.p)));
    const PixelsRead read(s);
    gatherDense(ctx, x, dense, 4, read.dims, read.strides, kName);
    xs = dense;
  }
  gemmGroups(ctx, false, false, s.m, s.p, s.c, w, s.c, 0, xs, s.p, s.c * s.p, y,
             s.p, s.m * s.p, s.n, 0.0f, kName);
  if (bias)
    addBias(ctx, y, bias, s.n, s.m, s.p, kName);
}

/// The input gradient: dX[n] (C x P) = W^T (C x M) dY[n] (M x P); with a
/// stride, into dense [N, C, P] first, then to the pixels read (zeros
/// elsewhere).
void pointwiseGradInput(Context &ctx, const ConvShape &s, const float *dy,
                        const float *w, float *dx, const char *kName) {
  float *dxs = dx;
  if (!everyPixel(s))
    dxs = static_cast<float *>(
        scratch(ctx, sizeof(float) * size_t(s.n * s.c * s.p)));
  gemmGroups(ctx, true, false, s.c, s.p, s.m, w, s.c, 0, dy, s.p, s.m * s.p,
             dxs, s.p, s.c * s.p, s.n, 0.0f, kName);
  if (dxs == dx)
    return;
  check(cudaMemsetAsync(dx, 0, sizeof(float) * size_t(s.xCount()), ctx.stream),
        kName);
  const PixelsRead read(s);
  scatterDense(ctx, dxs, dx, 4, read.dims, read.strides, kName);
}

/// The weight gradient: dW (M x C) = sum over n of dY[n] (M x P) X[n]^T
/// (P x C), deterministically, by whichever needs less scratch (about the
/// bytes it moves):
///  - per image into [N, M, C] partial products, then summed in image
///    order (few channels, many pixels: ResNet's first stages);
///  - dY and X gathered to [M, N*P] and [C, N*P], then one product over
///    all pixels (many channels, few pixels).
void pointwiseGradWeight(Context &ctx, const ConvShape &s, const float *dy,
                         const float *x, float *dw, const char *kName) {
  const int64_t pixels = s.n * s.p;
  const double dense = everyPixel(s) ? 0.0 : double(s.n * s.c * s.p);
  if (partialFloats(s) + dense <= gatheredFloats(s)) {
    const int64_t denseX = everyPixel(s) ? 0 : (s.n * s.c * s.p + 63) / 64 * 64;
    float *base = static_cast<float *>(
        scratch(ctx, sizeof(float) * size_t(denseX + s.n * s.m * s.c)));
    const float *xs = x;
    if (denseX > 0) {
      const PixelsRead read(s);
      gatherDense(ctx, x, base, 4, read.dims, read.strides, kName);
      xs = base;
    }
    float *part = base + denseX;
    gemmGroups(ctx, false, true, s.m, s.c, s.p, dy, s.p, s.m * s.p, xs, s.p,
               s.c * s.p, part, s.c, s.m * s.c, s.n, 0.0f, kName);
    const int64_t count = s.m * s.c;
    if (small(s.n * count))
      sumImages<int32_t><<<gridFor(count, kBlock), kBlock, 0, ctx.stream>>>(
          part, dw, int32_t(s.n), int32_t(count));
    else
      sumImages<int64_t><<<gridFor(count, kBlock), kBlock, 0, ctx.stream>>>(
          part, dw, s.n, count);
    checkLaunch(kName);
    return;
  }
  const int64_t dyFloats = (s.m * pixels + 63) / 64 * 64;
  float *dyt = static_cast<float *>(
      scratch(ctx, sizeof(float) * size_t(dyFloats + s.c * pixels)));
  float *xt = dyt + dyFloats;
  const int64_t dyDims[3] = {s.m, s.n, s.p};
  const int64_t dyStrides[3] = {s.p, s.m * s.p, 1};
  gatherDense(ctx, dy, dyt, 3, dyDims, dyStrides, kName);
  const int64_t xDims[4] = {s.c, s.n, s.oh, s.ow};
  const int64_t xStrides[4] = {s.h * s.w, s.c * s.h * s.w, s.sh * s.w, s.sw};
  gatherDense(ctx, x, xt, 4, xDims, xStrides, kName);
  gemmGroups(ctx, false, true, s.m, s.c, pixels, dyt, pixels, 0, xt, pixels, 0,
             dw, s.c, 0, 1, 0.0f, kName);
}

} // namespace
} // namespace cuda
} // namespace pipec

using namespace pipec::cuda;

//===----------------------------------------------------------------------===//
// Kernels
//===----------------------------------------------------------------------===//

extern "C" void pipec_cuda_k_conv2d(pipec_kctx *kc, void *const *bufs,
                                    const int64_t *ints, const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_conv2d");
  const char *kName = "pipec_cuda_k_conv2d";
  const float *x = static_cast<const float *>(bufs[0]);
  const float *w = static_cast<const float *>(bufs[1]);
  const float *bias = static_cast<const float *>(bufs[2]);
  float *y = static_cast<float *>(bufs[3]);
  const ConvShape s(ints);
  if (s.n <= 0 || s.m <= 0 || s.oh <= 0 || s.ow <= 0)
    return;
  if (!s.valid()) {
    poison(ctx, y, s.yCount(), kName);
    return;
  }
  const float *b = s.hasBias ? bias : nullptr;
  if (s.k == 0) {
    // No input channels: Y is the bias (or zeros).
    fill(ctx, y, s.yCount(), 0.0f, b, s.m, s.p, kName);
    return;
  }
  if (pointwiseProduct(ctx, s, ConvPass::Forward)) {
    ++ctx.pointwiseProducts;
    pointwiseForward(ctx, s, x, w, b, y, kName);
    return;
  }
  if (cudnnConvolution(ctx, ConvPass::Forward, s, x, w, y)) {
    if (b)
      addBias(ctx, y, b, s.n, s.m, s.p, kName);
    return;
  }
  Plan plan = makePlan(ctx, s);
  const bool pointwise = s.pointwise();
  for (int64_t n0 = 0; n0 < s.n; n0 += plan.nb) {
    const int64_t cnt = std::min(plan.nb, s.n - n0);
    const int64_t cols = cnt * s.p;
    const float *xc = x + n0 * s.c * s.h * s.w;
    float *yc = y + n0 * s.m * s.p;
    const float *col = xc;
    if (!(pointwise && cnt == 1)) {
      im2col(ctx, xc, plan.col, s, cnt, kName);
      col = plan.col;
    }
    // One image: [M, 1, P] is Y's own layout.
    float *yt = cnt == 1 ? yc : plan.packed;
    gemmGroups(ctx, false, false, s.mg, cols, s.k, w, s.k, s.mg * s.k, col,
               cols, s.k * cols, yt, cols, s.mg * cols, s.groups, 0.0f, kName);
    if (cnt > 1 || b)
      unpack(ctx, yt, yc, b, s.m, cnt, s.p, kName);
  }
}

extern "C" void pipec_cuda_k_conv2d_grad_input(pipec_kctx *kc,
                                               void *const *bufs,
                                               const int64_t *ints,
                                               const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_conv2d_grad_input");
  const char *kName = "pipec_cuda_k_conv2d_grad_input";
  const float *dy = static_cast<const float *>(bufs[0]);
  const float *w = static_cast<const float *>(bufs[1]);
  float *dx = static_cast<float *>(bufs[2]);
  const ConvShape s(ints);
  if (s.n <= 0 || s.c <= 0 || s.h <= 0 || s.w <= 0)
    return;
  if (!s.valid()) {
    poison(ctx, dx, s.xCount(), kName);
    return;
  }
  if (s.m == 0 || s.p == 0) {
    check(
        cudaMemsetAsync(dx, 0, sizeof(float) * size_t(s.xCount()), ctx.stream),
        kName);
    return;
  }
  if (pointwiseProduct(ctx, s, ConvPass::GradInput)) {
    ++ctx.pointwiseProducts;
    pointwiseGradInput(ctx, s, dy, w, dx, kName);
    return;
  }
  if (cudnnConvolution(ctx, ConvPass::GradInput, s, dy, w, dx))
    return;
  Plan plan = makePlan(ctx, s);
  const bool pointwise = s.pointwise();
  for (int64_t n0 = 0; n0 < s.n; n0 += plan.nb) {
    const int64_t cnt = std::min(plan.nb, s.n - n0);
    const int64_t cols = cnt * s.p;
    const float *dyc = dy + n0 * s.m * s.p;
    float *dxc = dx + n0 * s.c * s.h * s.w;
    const float *dyt = dyc;
    if (cnt > 1) {
      pack(ctx, dyc, plan.packed, s.m, cnt, s.p, kName);
      dyt = plan.packed;
    }
    // A single-image pointwise chunk: colGrad [Cg, P] per group is dX.
    const bool direct = pointwise && cnt == 1;
    float *colGrad = direct ? dxc : plan.col;
    gemmGroups(ctx, true, false, s.k, cols, s.mg, w, s.k, s.mg * s.k, dyt, cols,
               s.mg * cols, colGrad, cols, s.k * cols, s.groups, 0.0f, kName);
    if (!direct)
      col2im(ctx, colGrad, dxc, s, cnt, kName);
  }
}

extern "C" void pipec_cuda_k_conv2d_grad_weight(pipec_kctx *kc,
                                                void *const *bufs,
                                                const int64_t *ints,
                                                const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_conv2d_grad_weight");
  const char *kName = "pipec_cuda_k_conv2d_grad_weight";
  const float *dy = static_cast<const float *>(bufs[0]);
  const float *x = static_cast<const float *>(bufs[1]);
  float *dw = static_cast<float *>(bufs[2]);
  const ConvShape s(ints);
  if (s.m <= 0 || s.cg <= 0 || s.kh <= 0 || s.kw <= 0)
    return; // dW is empty (or its shape is unknowable).
  if (!s.valid()) {
    poison(ctx, dw, s.wCount(), kName);
    return;
  }
  if (s.n <= 0 || s.p <= 0) {
    check(
        cudaMemsetAsync(dw, 0, sizeof(float) * size_t(s.wCount()), ctx.stream),
        kName);
    return;
  }
  if (pointwiseProduct(ctx, s, ConvPass::GradWeight)) {
    ++ctx.pointwiseProducts;
    pointwiseGradWeight(ctx, s, dy, x, dw, kName);
    return;
  }
  if (cudnnConvolution(ctx, ConvPass::GradWeight, s, dy, x, dw))
    return;
  Plan plan = makePlan(ctx, s);
  const bool pointwise = s.pointwise();
  for (int64_t n0 = 0; n0 < s.n; n0 += plan.nb) {
    const int64_t cnt = std::min(plan.nb, s.n - n0);
    const int64_t cols = cnt * s.p;
    const float *xc = x + n0 * s.c * s.h * s.w;
    const float *dyc = dy + n0 * s.m * s.p;
    const float *col = xc;
    if (!(pointwise && cnt == 1)) {
      im2col(ctx, xc, plan.col, s, cnt, kName);
      col = plan.col;
    }
    const float *dyt = dyc;
    if (cnt > 1) {
      pack(ctx, dyc, plan.packed, s.m, cnt, s.p, kName);
      dyt = plan.packed;
    }
    // The first chunk overwrites dW, later ones add to it in image order.
    gemmGroups(ctx, false, true, s.mg, s.k, cols, dyt, cols, s.mg * cols, col,
               cols, s.k * cols, dw, s.k, s.mg * s.k, s.groups,
               n0 == 0 ? 0.0f : 1.0f, kName);
  }
}
