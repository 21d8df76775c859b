//===- resize.cpp - Linear (bilinear) resize and its backward -------------===//
//
// Part of pipec. CPU kernels behind pipec_k_resize_linear and
// pipec_k_resize_linear_grad (see include/pipec_rt.h for the parameter
// layouts).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// ONNX Resize in linear mode over the last two dimensions of NCHW (bilinear
/// upsampling and downsampling, F.interpolate(mode="bilinear")). Output row
/// o reads input position x = f(o) by the coordinate transformation:
///
///   half_pixel          x = (o + 0.5) / scale - 0.5
///   pytorch_half_pixel  the same, or 0 when the output has one row
///   align_corners       x = o (in - 1) / (L - 1), or 0 when L == 1
///
/// where L = in * scale, the output length before ONNX floors it (out
/// itself when the model gives sizes)
///   asymmetric          x = o / scale
///
/// and interpolates between rows floor(x) and floor(x) + 1 with weights
/// 1 - r and r (r = x - floor(x)); a row outside [0, in) is the edge row
/// (ONNX's reference pads with edge values; PyTorch clamps: the same).
/// Columns likewise; the two are separable, so each output pixel is a
/// weighted sum of four input pixels. The backward scatters dY with the
/// same four weights.
///
/// Malformed parameters poison the output with NaN (cpu/strided.h).
///
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"

#include "cpu/real.h"
#include "cpu/strided.h"

#include <cmath>
#include <cstring>
#include <vector>

using namespace pipec::rt;

namespace {

/// One output row's (or column's) two source rows and their weights.
template <class T> struct Tap {
  int64_t lo, hi;
  T wlo, whi;
};

template <class T>
std::vector<Tap<T>> taps(int64_t in, int64_t out, double scale, int64_t mode) {
  std::vector<Tap<T>> t(static_cast<size_t>(out));
  // ONNX measures the output as in * scale before flooring it (the same
  // as `out` when the model gives sizes).
  const double outLength = double(in) * scale;
  for (int64_t o = 0; o < out; ++o) {
    double x;
    switch (mode) {
    case PIPEC_RESIZE_HALF_PIXEL:
      x = (double(o) + 0.5) / scale - 0.5;
      break;
    case PIPEC_RESIZE_PYTORCH_HALF_PIXEL:
      x = outLength != 1.0 ? (double(o) + 0.5) / scale - 0.5 : 0.0;
      break;
    case PIPEC_RESIZE_ALIGN_CORNERS:
      x = outLength != 1.0 ? double(o) * double(in - 1) / (outLength - 1.0)
                           : 0.0;
      break;
    default: // PIPEC_RESIZE_ASYMMETRIC
      x = double(o) / scale;
      break;
    }
    double f = std::floor(x);
    double r = x - f;
    int64_t lo = int64_t(f), hi = lo + 1;
    lo = std::min(std::max<int64_t>(lo, 0), in - 1);
    hi = std::min(std::max<int64_t>(hi, 0), in - 1);
    t[size_t(o)] = {lo, hi, T(1.0 - r), T(r)};
  }
  return t;
}

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

template <class T>
void resizeLinearKernel(void *const *bufs, const int64_t *ints,
                        const double *reals) {
  const T *x = static_cast<const T *>(bufs[0]);
  T *y = static_cast<T *>(bufs[1]);
  const ResizeShape s(ints, reals);
  if (!s.valid()) {
    poison(y, std::max<int64_t>(s.n * s.c * s.oh * s.ow, 0));
    return;
  }
  const std::vector<Tap<T>> rows = taps<T>(s.h, s.oh, s.scaleH, s.mode);
  const std::vector<Tap<T>> cols = taps<T>(s.w, s.ow, s.scaleW, s.mode);
  for (int64_t plane = 0; plane < s.planes(); ++plane) {
    const T *xp = x + plane * s.h * s.w;
    T *yp = y + plane * s.oh * s.ow;
    for (int64_t o = 0; o < s.oh; ++o) {
      const Tap<T> &r = rows[size_t(o)];
      const T *a = xp + r.lo * s.w, *b = xp + r.hi * s.w;
      for (int64_t q = 0; q < s.ow; ++q) {
        const Tap<T> &c = cols[size_t(q)];
        T top = c.wlo * a[c.lo] + c.whi * a[c.hi];
        T bottom = c.wlo * b[c.lo] + c.whi * b[c.hi];
        yp[o * s.ow + q] = r.wlo * top + r.whi * bottom;
      }
    }
  }
}

template <class T>
void resizeLinearGradKernel(void *const *bufs, const int64_t *ints,
                            const double *reals) {
  const T *dy = static_cast<const T *>(bufs[0]);
  T *dx = static_cast<T *>(bufs[1]);
  const ResizeShape s(ints, reals);
  if (!s.valid()) {
    poison(dx, std::max<int64_t>(s.n * s.c * s.h * s.w, 0));
    return;
  }
  const std::vector<Tap<T>> rows = taps<T>(s.h, s.oh, s.scaleH, s.mode);
  const std::vector<Tap<T>> cols = taps<T>(s.w, s.ow, s.scaleW, s.mode);
  std::memset(dx, 0, size_t(s.planes() * s.h * s.w) * sizeof(T));
  for (int64_t plane = 0; plane < s.planes(); ++plane) {
    const T *g = dy + plane * s.oh * s.ow;
    T *dp = dx + plane * s.h * s.w;
    for (int64_t o = 0; o < s.oh; ++o) {
      const Tap<T> &r = rows[size_t(o)];
      T *a = dp + r.lo * s.w, *b = dp + r.hi * s.w;
      for (int64_t q = 0; q < s.ow; ++q) {
        const Tap<T> &c = cols[size_t(q)];
        const T v = g[o * s.ow + q];
        a[c.lo] += r.wlo * c.wlo * v;
        a[c.hi] += r.wlo * c.whi * v;
        b[c.lo] += r.whi * c.wlo * v;
        b[c.hi] += r.whi * c.whi * v;
      }
    }
  }
}

} // namespace

PIPEC_CPU_KERNEL(pipec_k_resize_linear, resizeLinearKernel)
PIPEC_CPU_KERNEL(pipec_k_resize_linear_grad, resizeLinearGradKernel)
