//===- resize.cu - Linear (bilinear) resize and its backward --------------===//
//
// Part of pipec's CUDA runtime. CUDA twins of pipec_k_resize_linear and
// pipec_k_resize_linear_grad (see include/pipec_rt.h for the parameter
// layouts and cpu/resize.cpp for the reference and the coordinate modes).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Each output row (column) o reads two input rows lo, hi with weights
/// float(1 - r), float(r): the taps, computed in double from the
/// coordinate transformation exactly as on the CPU, once per call into the
/// context's scratch buffer (one thread per output row and column).
///
///  - Forward: one thread per output element,
///    y = wlo_r (wlo_c a[lo_c] + whi_c a[hi_c]) + whi_r (...) in float.
///  - Backward, in gather form: one thread per dX element adds, for every
///    output (o, q) whose taps touch it, in the CPU's order (o, then q,
///    then the four terms (lo,lo), (lo,hi), (hi,lo), (hi,hi)), the terms
///    (w_r * w_c) * dY[o, q] that the CPU scatters onto it, including
///    zero-weight ones. The outputs touching input row i are those with
///    lo(o) <= i <= hi(o); lo and hi never decrease with o, so they form a
///    range, found by binary search over the taps (second small kernel).
///    The one exception, align_corners with an output length L = in * scale
///    below 1 and more than one output (inconsistent sizes, which exporters
///    do not produce), makes the coordinates decrease; that axis then scans
///    all outputs. No atomics: dX is overwritten deterministically and
///    agrees with the CPU to the bit.
///
/// Float products and sums use round-to-nearest intrinsics (no FMA
/// contraction). Malformed parameters poison the output with NaN.
///
//===----------------------------------------------------------------------===//

#include "cuda_rt.h"
#include "pipec_rt.h"
#include "strided.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace pipec {
namespace cuda {
namespace {

constexpr int kBlock = 256;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

/// One output row's (or column's) two source rows and their weights.
struct Tap {
  int64_t lo, hi;
  float wlo, whi;
};

/// Outputs [begin, end) whose taps may touch one input row (or column).
struct Range {
  int64_t begin, end;
};

struct ResizeShape {
  int64_t n, c, h, w, oh, ow, mode;
  double scaleH, scaleW;

  ResizeShape(const int64_t *ints, const double *reals)
      : n(ints[0]), c(ints[1]), h(ints[2]), w(ints[3]), oh(ints[4]),
        ow(ints[5]), mode(ints[6]), scaleH(reals[0]), scaleW(reals[1]) {}
  bool valid() const {
    return n >= 0 && c >= 0 && h > 0 && w > 0 && oh >= 0 && ow >= 0 &&
           mode >= PIPEC_RESIZE_HALF_PIXEL && mode <= PIPEC_RESIZE_ASYMMETRIC &&
           scaleH > 0 && scaleW > 0 && std::isfinite(scaleH) &&
           std::isfinite(scaleW);
  }
  int64_t planes() const { return n * c; }
};

/// Whether the taps of an axis are monotone in o (see the file comment).
bool monotoneAxis(int64_t in, int64_t out, double scale, int64_t mode) {
  const double outLength = double(in) * scale;
  return !(mode == PIPEC_RESIZE_ALIGN_CORNERS && out > 1 && outLength != 1.0 &&
           outLength - 1.0 < 0.0);
}

/// cpu/resize.cpp's tap of output o.
__device__ Tap tapOf(int64_t o, int64_t in, double scale, int64_t mode) {
  // Rounded before `outLength - 1.0`: a fused multiply-add would not be.
  const double outLength = __dmul_rn(double(in), scale);
  double x;
  switch (mode) {
  case PIPEC_RESIZE_HALF_PIXEL:
    x = __dsub_rn(__ddiv_rn(double(o) + 0.5, scale), 0.5);
    break;
  case PIPEC_RESIZE_PYTORCH_HALF_PIXEL:
    x = outLength != 1.0 ? __dsub_rn(__ddiv_rn(double(o) + 0.5, scale), 0.5)
                         : 0.0;
    break;
  case PIPEC_RESIZE_ALIGN_CORNERS:
    x = outLength != 1.0 ? __ddiv_rn(__dmul_rn(double(o), double(in - 1)),
                                     __dsub_rn(outLength, 1.0))
                         : 0.0;
    break;
  default: // PIPEC_RESIZE_ASYMMETRIC
    x = __ddiv_rn(double(o), scale);
    break;
  }
  const double f = floor(x);
  const double r = __dsub_rn(x, f);
  int64_t lo = int64_t(f), hi = lo + 1;
  lo = lo < 0 ? 0 : (lo > in - 1 ? in - 1 : lo);
  hi = hi < 0 ? 0 : (hi > in - 1 ? in - 1 : hi);
  Tap t;
  t.lo = lo;
  t.hi = hi;
  t.wlo = float(__dsub_rn(1.0, r));
  t.whi = float(r);
  return t;
}

/// Row taps [0, oh) then column taps [oh, oh + ow).
__global__ void resizeTaps(Tap *taps, int64_t h, int64_t w, int64_t oh,
                           int64_t ow, double scaleH, double scaleW,
                           int64_t mode) {
  for (int64_t t = gridStart(); t < oh + ow; t += gridStep())
    taps[t] =
        t < oh ? tapOf(t, h, scaleH, mode) : tapOf(t - oh, w, scaleW, mode);
}

/// First o in [0, out) with pred(taps[o]) true, for a predicate that is
/// false then true along o.
template <class Pred>
__device__ int64_t firstTrue(const Tap *taps, int64_t out, Pred pred) {
  int64_t lo = 0, hi = out;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (pred(taps[mid]))
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

/// Per input row i (then column): the outputs o with lo(o) <= i <= hi(o),
/// or all outputs on a non-monotone axis.
__global__ void resizeRanges(const Tap *taps, Range *ranges, int64_t h,
                             int64_t w, int64_t oh, int64_t ow, bool monotoneH,
                             bool monotoneW) {
  for (int64_t t = gridStart(); t < h + w; t += gridStep()) {
    const bool isRow = t < h;
    const int64_t i = isRow ? t : t - h;
    const int64_t out = isRow ? oh : ow;
    const Tap *axis = isRow ? taps : taps + oh;
    Range r;
    if (isRow ? monotoneH : monotoneW) {
      r.begin = firstTrue(axis, out, [i](const Tap &p) { return p.hi >= i; });
      r.end = firstTrue(axis, out, [i](const Tap &p) { return p.lo > i; });
    } else {
      r.begin = 0;
      r.end = out;
    }
    ranges[t] = r;
  }
}

template <typename I>
__global__ void
resizeForward(const float *__restrict__ x, float *__restrict__ y,
              const Tap *__restrict__ taps, int64_t h, int64_t w, int64_t oh,
              int64_t ow, int64_t total) {
  for (int64_t e = gridStart(); e < total; e += gridStep()) {
    const I ie = I(e), iw = I(ow), ih = I(oh);
    const I rest = ie / iw;
    const int64_t q = int64_t(ie - rest * iw);
    const I plane = rest / ih;
    const int64_t o = int64_t(rest - plane * ih);
    const Tap r = taps[o], c = taps[oh + q];
    const float *xp = x + int64_t(plane) * h * w;
    const float *a = xp + r.lo * w, *b = xp + r.hi * w;
    const float top =
        __fadd_rn(__fmul_rn(c.wlo, a[c.lo]), __fmul_rn(c.whi, a[c.hi]));
    const float bottom =
        __fadd_rn(__fmul_rn(c.wlo, b[c.lo]), __fmul_rn(c.whi, b[c.hi]));
    y[e] = __fadd_rn(__fmul_rn(r.wlo, top), __fmul_rn(r.whi, bottom));
  }
}

template <typename I>
__global__ void
resizeBackward(const float *__restrict__ dy, float *__restrict__ dx,
               const Tap *__restrict__ taps, const Range *__restrict__ ranges,
               int64_t h, int64_t w, int64_t oh, int64_t ow, int64_t total) {
  for (int64_t e = gridStart(); e < total; e += gridStep()) {
    const I ie = I(e), iw = I(w), ih = I(h);
    const I rest = ie / iw;
    const int64_t xx = int64_t(ie - rest * iw);
    const I plane = rest / ih;
    const int64_t yy = int64_t(rest - plane * ih);
    const Range rr = ranges[yy], cr = ranges[h + xx];
    const float *g = dy + int64_t(plane) * oh * ow;
    float acc = 0.0f;
    for (int64_t o = rr.begin; o < rr.end; ++o) {
      const Tap r = taps[o];
      const bool rLo = r.lo == yy, rHi = r.hi == yy;
      if (!rLo && !rHi)
        continue;
      for (int64_t q = cr.begin; q < cr.end; ++q) {
        const Tap c = taps[oh + q];
        const bool cLo = c.lo == xx, cHi = c.hi == xx;
        if (!cLo && !cHi)
          continue;
        const float v = g[o * ow + q];
        if (rLo && cLo)
          acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(r.wlo, c.wlo), v));
        if (rLo && cHi)
          acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(r.wlo, c.whi), v));
        if (rHi && cLo)
          acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(r.whi, c.wlo), v));
        if (rHi && cHi)
          acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(r.whi, c.whi), v));
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

extern "C" void pipec_cuda_k_resize_linear(pipec_kctx *kc, void *const *bufs,
                                           const int64_t *ints,
                                           const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_resize_linear");
  const char *kernel = "pipec_cuda_k_resize_linear";
  const float *x = static_cast<const float *>(bufs[0]);
  float *y = static_cast<float *>(bufs[1]);
  const ResizeShape s(ints, reals);
  if (!s.valid()) {
    launchFill(ctx, y, std::max<int64_t>(s.n * s.c * s.oh * s.ow, 0), kNaN,
               kernel);
    return;
  }
  const int64_t total = s.planes() * s.oh * s.ow;
  if (total <= 0)
    return;
  cudaStream_t st = ctx.stream;
  Tap *taps =
      static_cast<Tap *>(scratch(ctx, size_t(s.oh + s.ow) * sizeof(Tap)));
  resizeTaps<<<gridFor(s.oh + s.ow, kBlock), kBlock, 0, st>>>(
      taps, s.h, s.w, s.oh, s.ow, s.scaleH, s.scaleW, s.mode);
  checkLaunch(kernel);
  if (fits32(total))
    resizeForward<uint32_t><<<gridFor(total, kBlock), kBlock, 0, st>>>(
        x, y, taps, s.h, s.w, s.oh, s.ow, total);
  else
    resizeForward<uint64_t><<<gridFor(total, kBlock), kBlock, 0, st>>>(
        x, y, taps, s.h, s.w, s.oh, s.ow, total);
  checkLaunch(kernel);
}

extern "C" void pipec_cuda_k_resize_linear_grad(pipec_kctx *kc,
                                                void *const *bufs,
                                                const int64_t *ints,
                                                const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_resize_linear_grad");
  const char *kernel = "pipec_cuda_k_resize_linear_grad";
  const float *dy = static_cast<const float *>(bufs[0]);
  float *dx = static_cast<float *>(bufs[1]);
  const ResizeShape s(ints, reals);
  if (!s.valid()) {
    launchFill(ctx, dx, std::max<int64_t>(s.n * s.c * s.h * s.w, 0), kNaN,
               kernel);
    return;
  }
  const int64_t total = s.planes() * s.h * s.w;
  if (total <= 0)
    return;
  cudaStream_t st = ctx.stream;
  const size_t tapBytes = aligned(size_t(s.oh + s.ow) * sizeof(Tap));
  char *base = static_cast<char *>(
      scratch(ctx, tapBytes + size_t(s.h + s.w) * sizeof(Range)));
  Tap *taps = reinterpret_cast<Tap *>(base);
  Range *ranges = reinterpret_cast<Range *>(base + tapBytes);
  if (s.oh + s.ow > 0) {
    resizeTaps<<<gridFor(s.oh + s.ow, kBlock), kBlock, 0, st>>>(
        taps, s.h, s.w, s.oh, s.ow, s.scaleH, s.scaleW, s.mode);
    checkLaunch(kernel);
  }
  resizeRanges<<<gridFor(s.h + s.w, kBlock), kBlock, 0, st>>>(
      taps, ranges, s.h, s.w, s.oh, s.ow,
      monotoneAxis(s.h, s.oh, s.scaleH, s.mode),
      monotoneAxis(s.w, s.ow, s.scaleW, s.mode));
  checkLaunch(kernel);
  if (fits32(total))
    resizeBackward<uint32_t><<<gridFor(total, kBlock), kBlock, 0, st>>>(
        dy, dx, taps, ranges, s.h, s.w, s.oh, s.ow, total);
  else
    resizeBackward<uint64_t><<<gridFor(total, kBlock), kBlock, 0, st>>>(
        dy, dx, taps, ranges, s.h, s.w, s.oh, s.ow, total);
  checkLaunch(kernel);
}
