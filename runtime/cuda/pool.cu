//===- pool.cu - 2-D max / average pooling and their backward -------------===//
//
// Part of pipec's CUDA runtime. CUDA twins of pipec_k_maxpool2d,
// pipec_k_maxpool2d_grad, pipec_k_avgpool2d and pipec_k_avgpool2d_grad (see
// include/pipec_rt.h for the parameter layouts and cpu/pool.cpp for the
// reference and the conventions).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The window of output (oh, ow) starts at input row oh * sH - padTop and
/// column ow * sW - padLeft; positions in the padding are skipped. Results
/// agree with the CPU kernels to the bit:
///
///  - maxpool2d: one thread per output element scans its window in
///    row-major order; a larger value or a NaN takes over (ties keep the
///    earlier element, the last NaN wins). Indices (optional) are flat
///    indices into X; a window with no element in the image gives the
///    lowest finite float and index -1.
///  - maxpool2d_grad only knows nX and nY, not the pooling shape, so the
///    gather runs over the saved indices: dX is zeroed, the (index, output)
///    pairs are sorted stably by index (CUB radix sort in the context's
///    scratch), and one thread per run of equal indices adds its dY values
///    in output order, the CPU's order of `dX[idx] += dY[i]`. Indices
///    outside [0, nX) are skipped. dX must not alias dY.
///  - avgpool2d: one thread per output element; the float sum runs in
///    row-major window order, then is multiplied by 1 / (kH kW)
///    (countIncludePad) or 1 / count of in-image elements (0 when none).
///  - avgpool2d_grad: one thread per input element adds, in the CPU's
///    output order (rows, then columns), dY * inv of every output whose
///    window covers it. No atomics, so dX is overwritten deterministically.
///
/// Float products and sums use round-to-nearest intrinsics, so nvcc cannot
/// fuse them into FMAs (the CPU build has none). Malformed parameters
/// (non-positive kernel, stride or dilation) poison the output with NaN
/// (max indices: -1), as on the CPU.
///
//===----------------------------------------------------------------------===//

#include "cuda_rt.h"
#include "pipec_rt.h"
#include "strided.cuh"

#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cstdint>
#include <limits>
#include <string>

namespace pipec {
namespace cuda {
namespace {

constexpr int kBlock = 256;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kLowest = std::numeric_limits<float>::lowest();

/// The parameter block of both pooling kernels (avgpool has no dilations:
/// its 13th int is countIncludePad).
struct PoolShape {
  int64_t n, c, h, w, kh, kw, oh, ow, sh, sw, pt, pl, dh, dw;
  bool countIncludePad;
  /// 1 / (kH kW) as the CPU rounds it (float division).
  float fullInv;

  bool valid() const {
    return kh > 0 && kw > 0 && sh > 0 && sw > 0 && dh > 0 && dw > 0;
  }
  int64_t planes() const { return n * c; }
};

PoolShape readShape(const int64_t *ints, bool isMax) {
  PoolShape s;
  s.n = ints[0];
  s.c = ints[1];
  s.h = ints[2];
  s.w = ints[3];
  s.kh = ints[4];
  s.kw = ints[5];
  s.oh = ints[6];
  s.ow = ints[7];
  s.sh = ints[8];
  s.sw = ints[9];
  s.pt = ints[10];
  s.pl = ints[11];
  s.dh = isMax ? ints[12] : 1;
  s.dw = isMax ? ints[13] : 1;
  s.countIncludePad = !isMax && ints[12] != 0;
  s.fullInv = s.kh > 0 && s.kw > 0 ? 1.0f / float(s.kh * s.kw) : 0.0f;
  return s;
}

/// The part of one window along one axis inside the image: kernel offsets
/// [kLo, kHi) at input positions start + k * dil (cpu/pool.cpp's
/// windowSpans, for one output position).
struct Span {
  int64_t start, kLo, kHi;
};

__device__ __forceinline__ Span spanOf(int64_t o, int64_t stride, int64_t pad,
                                       int64_t dil, int64_t kernel,
                                       int64_t inLen) {
  Span sp;
  sp.start = o * stride - pad;
  sp.kLo = sp.start >= 0 ? 0 : (-sp.start + dil - 1) / dil;
  sp.kHi = inLen - sp.start <= 0 ? 0 : (inLen - sp.start + dil - 1) / dil;
  sp.kHi = sp.kHi < kernel ? sp.kHi : kernel;
  sp.kLo = sp.kLo < sp.kHi ? sp.kLo : sp.kHi;
  return sp;
}

/// floor(a / b) for b > 0.
__device__ __forceinline__ int64_t floorDiv(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/// Splits the linear index e of a [planes, rows, cols] space.
template <typename I>
__device__ __forceinline__ void split3(int64_t e, int64_t rows, int64_t cols,
                                       int64_t &plane, int64_t &row,
                                       int64_t &col) {
  const I ie = I(e), ic = I(cols), ir = I(rows);
  const I rest = ie / ic;
  col = int64_t(ie - rest * ic);
  const I p = rest / ir;
  row = int64_t(rest - p * ir);
  plane = int64_t(p);
}

//===----------------------------------------------------------------------===//
// MaxPool
//===----------------------------------------------------------------------===//

template <typename I>
__global__ void
maxPoolKernel(const float *__restrict__ x, float *__restrict__ y,
              int64_t *__restrict__ indices, PoolShape s, int64_t total) {
  const int64_t xPlane = s.h * s.w;
  for (int64_t e = gridStart(); e < total; e += gridStep()) {
    int64_t plane, o, q;
    split3<I>(e, s.oh, s.ow, plane, o, q);
    const Span r = spanOf(o, s.sh, s.pt, s.dh, s.kh, s.h);
    const Span c = spanOf(q, s.sw, s.pl, s.dw, s.kw, s.w);
    float best = kLowest;
    int64_t at = -1;
    if (r.kLo < r.kHi && c.kLo < c.kHi) {
      const float *xp = x + plane * xPlane;
      at = (r.start + r.kLo * s.dh) * s.w + c.start + c.kLo * s.dw;
      best = xp[at];
      for (int64_t ki = r.kLo; ki < r.kHi; ++ki) {
        const int64_t rowAt = (r.start + ki * s.dh) * s.w + c.start;
        for (int64_t kj = c.kLo; kj < c.kHi; ++kj) {
          const int64_t a = rowAt + kj * s.dw;
          const float v = xp[a];
          if (v > best || v != v) {
            best = v;
            at = a;
          }
        }
      }
    }
    y[e] = best;
    if (indices)
      indices[e] = at < 0 ? -1 : plane * xPlane + at;
  }
}

/// Sort keys of the backward: the index, or nX for one outside [0, nX).
__global__ void maxGradKeys(const int64_t *__restrict__ indices,
                            uint64_t *__restrict__ keys,
                            int32_t *__restrict__ positions, int64_t nX,
                            int64_t nY) {
  for (int64_t i = gridStart(); i < nY; i += gridStep()) {
    const int64_t at = indices[i];
    keys[i] = uint64_t(at >= 0 && at < nX ? at : nX);
    positions[i] = int32_t(i);
  }
}

/// One thread per sorted position; the first of each run of equal keys
/// writes dX[key] = the run's dY values added in position order.
__global__ void maxGradSums(const float *__restrict__ dy,
                            const uint64_t *__restrict__ keys,
                            const int32_t *__restrict__ positions,
                            float *__restrict__ dx, int64_t nX, int64_t nY) {
  for (int64_t p = gridStart(); p < nY; p += gridStep()) {
    const uint64_t key = keys[p];
    if (key >= uint64_t(nX) || (p > 0 && keys[p - 1] == key))
      continue;
    float acc = 0.0f;
    for (int64_t u = p; u < nY && keys[u] == key; ++u)
      acc = __fadd_rn(acc, dy[positions[u]]);
    dx[key] = acc;
  }
}

//===----------------------------------------------------------------------===//
// AveragePool
//===----------------------------------------------------------------------===//

template <typename I>
__global__ void avgPoolKernel(const float *__restrict__ x,
                              float *__restrict__ y, PoolShape s,
                              int64_t total) {
  const int64_t xPlane = s.h * s.w;
  for (int64_t e = gridStart(); e < total; e += gridStep()) {
    int64_t plane, o, q;
    split3<I>(e, s.oh, s.ow, plane, o, q);
    const Span r = spanOf(o, s.sh, s.pt, 1, s.kh, s.h);
    const Span c = spanOf(q, s.sw, s.pl, 1, s.kw, s.w);
    const float *xp = x + plane * xPlane;
    float sum = 0.0f;
    for (int64_t ki = r.kLo; ki < r.kHi; ++ki) {
      const float *xr = xp + (r.start + ki) * s.w + c.start;
      for (int64_t kj = c.kLo; kj < c.kHi; ++kj)
        sum = __fadd_rn(sum, xr[kj]);
    }
    const int64_t count = (r.kHi - r.kLo) * (c.kHi - c.kLo);
    const float inv = s.countIncludePad
                          ? s.fullInv
                          : (count > 0 ? __fdiv_rn(1.0f, float(count)) : 0.0f);
    y[e] = __fmul_rn(sum, inv);
  }
}

/// One thread per dX element: the outputs whose window covers input (hh,
/// ww) are rows o with o sH - padTop <= hh < o sH - padTop + kH (columns
/// likewise); their dY * inv are added in the CPU's (o, q) order.
template <typename I>
__global__ void avgPoolGradKernel(const float *__restrict__ dy,
                                  float *__restrict__ dx, PoolShape s,
                                  int64_t total) {
  for (int64_t e = gridStart(); e < total; e += gridStep()) {
    int64_t plane, hh, ww;
    split3<I>(e, s.h, s.w, plane, hh, ww);
    int64_t oLo = floorDiv(hh + s.pt - s.kh, s.sh) + 1;
    int64_t oHi = floorDiv(hh + s.pt, s.sh);
    int64_t qLo = floorDiv(ww + s.pl - s.kw, s.sw) + 1;
    int64_t qHi = floorDiv(ww + s.pl, s.sw);
    oLo = oLo > 0 ? oLo : 0;
    qLo = qLo > 0 ? qLo : 0;
    oHi = oHi < s.oh - 1 ? oHi : s.oh - 1;
    qHi = qHi < s.ow - 1 ? qHi : s.ow - 1;
    const float *dyp = dy + plane * s.oh * s.ow;
    float acc = 0.0f;
    for (int64_t o = oLo; o <= oHi; ++o) {
      const Span r = spanOf(o, s.sh, s.pt, 1, s.kh, s.h);
      for (int64_t q = qLo; q <= qHi; ++q) {
        float inv = s.fullInv;
        if (!s.countIncludePad) {
          const Span c = spanOf(q, s.sw, s.pl, 1, s.kw, s.w);
          // At least (hh, ww) is inside the image: count >= 1.
          const int64_t count = (r.kHi - r.kLo) * (c.kHi - c.kLo);
          inv = __fdiv_rn(1.0f, float(count));
        }
        acc = __fadd_rn(acc, __fmul_rn(dyp[o * s.ow + q], inv));
      }
    }
    dx[e] = acc;
  }
}

size_t aligned(size_t bytes) { return (bytes + 255) & ~size_t(255); }

} // namespace
} // namespace cuda
} // namespace pipec

using namespace pipec::cuda;

extern "C" void pipec_cuda_k_maxpool2d(pipec_kctx *kc, void *const *bufs,
                                       const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_maxpool2d");
  const char *kernel = "pipec_cuda_k_maxpool2d";
  const float *x = static_cast<const float *>(bufs[0]);
  float *y = static_cast<float *>(bufs[1]);
  int64_t *indices = static_cast<int64_t *>(bufs[2]);
  const PoolShape s = readShape(ints, true);
  if (s.n <= 0 || s.c <= 0 || s.oh <= 0 || s.ow <= 0 || s.h < 0 || s.w < 0)
    return;
  const int64_t total = s.planes() * s.oh * s.ow;
  if (!s.valid()) {
    launchFill(ctx, y, total, kNaN, kernel);
    if (indices)
      launchFill(ctx, indices, total, int64_t(-1), kernel);
    return;
  }
  cudaStream_t st = ctx.stream;
  if (fits32(total))
    maxPoolKernel<uint32_t>
        <<<gridFor(total, kBlock), kBlock, 0, st>>>(x, y, indices, s, total);
  else
    maxPoolKernel<uint64_t>
        <<<gridFor(total, kBlock), kBlock, 0, st>>>(x, y, indices, s, total);
  checkLaunch(kernel);
}

extern "C" void pipec_cuda_k_maxpool2d_grad(pipec_kctx *kc, void *const *bufs,
                                            const int64_t *ints,
                                            const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_maxpool2d_grad");
  const char *kernel = "pipec_cuda_k_maxpool2d_grad";
  const float *dy = static_cast<const float *>(bufs[0]);
  const int64_t *indices = static_cast<const int64_t *>(bufs[1]);
  float *dx = static_cast<float *>(bufs[2]);
  const int64_t nX = ints[0], nY = ints[1];
  if (nX <= 0)
    return;
  cudaStream_t st = ctx.stream;
  check(cudaMemsetAsync(dx, 0, size_t(nX) * sizeof(float), st), kernel);
  if (nY <= 0)
    return;
  if (!indices)
    fail("pipec_cuda_k_maxpool2d_grad: Indices is NULL");
  if (nY > INT_MAX)
    fail((std::string(kernel) + ": " + std::to_string(nY) +
          " outputs exceed the sort's 32-bit count")
             .c_str());
  const int count = int(nY);

  // Keys need the bits of nX (the out-of-range key) and no more.
  int endBit = 1;
  while (endBit < 64 && (uint64_t(nX) >> endBit) != 0)
    ++endBit;
  size_t sortBytes = 0;
  check(cub::DeviceRadixSort::SortPairs(
            nullptr, sortBytes, static_cast<const uint64_t *>(nullptr),
            static_cast<uint64_t *>(nullptr),
            static_cast<const int32_t *>(nullptr),
            static_cast<int32_t *>(nullptr), count, 0, endBit, st),
        kernel);
  const size_t keyBytes = aligned(size_t(count) * sizeof(uint64_t));
  const size_t posBytes = aligned(size_t(count) * sizeof(int32_t));
  char *base = static_cast<char *>(
      scratch(ctx, 2 * keyBytes + 2 * posBytes + aligned(sortBytes)));
  uint64_t *keysIn = reinterpret_cast<uint64_t *>(base);
  uint64_t *keysOut = reinterpret_cast<uint64_t *>(base + keyBytes);
  int32_t *posIn = reinterpret_cast<int32_t *>(base + 2 * keyBytes);
  int32_t *posOut = reinterpret_cast<int32_t *>(base + 2 * keyBytes + posBytes);
  void *sortTemp = base + 2 * keyBytes + 2 * posBytes;

  maxGradKeys<<<gridFor(nY, kBlock), kBlock, 0, st>>>(indices, keysIn, posIn,
                                                      nX, nY);
  checkLaunch(kernel);
  check(cub::DeviceRadixSort::SortPairs(sortTemp, sortBytes, keysIn, keysOut,
                                        posIn, posOut, count, 0, endBit, st),
        kernel);
  maxGradSums<<<gridFor(nY, kBlock), kBlock, 0, st>>>(dy, keysOut, posOut, dx,
                                                      nX, nY);
  checkLaunch(kernel);
}

extern "C" void pipec_cuda_k_avgpool2d(pipec_kctx *kc, void *const *bufs,
                                       const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_avgpool2d");
  const char *kernel = "pipec_cuda_k_avgpool2d";
  const float *x = static_cast<const float *>(bufs[0]);
  float *y = static_cast<float *>(bufs[1]);
  const PoolShape s = readShape(ints, false);
  if (s.n <= 0 || s.c <= 0 || s.oh <= 0 || s.ow <= 0 || s.h < 0 || s.w < 0)
    return;
  const int64_t total = s.planes() * s.oh * s.ow;
  if (!s.valid()) {
    launchFill(ctx, y, total, kNaN, kernel);
    return;
  }
  cudaStream_t st = ctx.stream;
  if (fits32(total))
    avgPoolKernel<uint32_t>
        <<<gridFor(total, kBlock), kBlock, 0, st>>>(x, y, s, total);
  else
    avgPoolKernel<uint64_t>
        <<<gridFor(total, kBlock), kBlock, 0, st>>>(x, y, s, total);
  checkLaunch(kernel);
}

extern "C" void pipec_cuda_k_avgpool2d_grad(pipec_kctx *kc, void *const *bufs,
                                            const int64_t *ints,
                                            const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_avgpool2d_grad");
  const char *kernel = "pipec_cuda_k_avgpool2d_grad";
  const float *dy = static_cast<const float *>(bufs[0]);
  float *dx = static_cast<float *>(bufs[1]);
  const PoolShape s = readShape(ints, false);
  if (s.n <= 0 || s.c <= 0 || s.h <= 0 || s.w <= 0)
    return;
  const int64_t total = s.planes() * s.h * s.w;
  if (!s.valid()) {
    launchFill(ctx, dx, total, kNaN, kernel);
    return;
  }
  // oH or oW <= 0: no output, every thread writes 0 (empty ranges).
  cudaStream_t st = ctx.stream;
  if (fits32(total))
    avgPoolGradKernel<uint32_t>
        <<<gridFor(total, kBlock), kBlock, 0, st>>>(dy, dx, s, total);
  else
    avgPoolGradKernel<uint64_t>
        <<<gridFor(total, kBlock), kBlock, 0, st>>>(dy, dx, s, total);
  checkLaunch(kernel);
}
