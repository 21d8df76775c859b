//===- pool.cpp - 2-D max / average pooling and their backward ------------===//
//
// Part of pipec. CPU kernels behind pipec_k_maxpool2d,
// pipec_k_maxpool2d_grad, pipec_k_avgpool2d and pipec_k_avgpool2d_grad (see
// include/pipec_rt.h for the parameter layouts).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// ONNX MaxPool / AveragePool over NCHW planes. Output (oh, ow) pools the
/// window of input rows oh*sH - padTop + ki*dH (ki < kH) and columns
/// likewise; window positions in the padding are skipped. Bottom / right
/// padding is whatever oH / oW imply.
///
/// MaxPool:
///  - the first maximum in row-major window order wins (ties keep the
///    earlier element); a NaN in the window makes the output NaN (as in
///    PyTorch and numpy.max), with the index of the last NaN;
///  - Indices are flat indices into the whole X tensor,
///    ((n * C + c) * H + h) * W + w (ONNX's Indices with storage_order 0);
///  - a window with no element inside the image (only possible with pads
///    as large as the kernel, or dilation gaps straddling a tiny image;
///    exporters do not produce these) gives the lowest finite value, as
///    onnxruntime does, and index -1; the backward skips indices outside
///    [0, nX);
///  - the windows of a row of outputs that lie fully inside the image in
///    the horizontal direction are swept tap by tap across the row, with
///    branch-free compare-and-select, which vectorises (random data makes
///    a per-tap branch mispredict half the time: 5x slower).
///
/// AveragePool (no dilations in the ABI): with countIncludePad the divisor
/// is always kH * kW, i.e. every window is taken to lie inside the padded
/// input (true for ONNX's floor-mode output sizes, where the implied bottom
/// / right pads cover the last window); without it, the divisor is the
/// number of window elements inside the image, and a window that has none
/// gives 0.
///
/// Y and dX are overwritten. Malformed parameters (non-positive kernel,
/// stride or dilation) poison the output with NaN.
///
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"

#include "cpu/real.h"
#include "cpu/strided.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

using namespace pipec::rt;

namespace {

/// The parameter block of both pooling kernels (avgpool has no dilations:
/// its 13th int is countIncludePad).
struct PoolShape {
  int64_t n, c, h, w, kh, kw, oh, ow, sh, sw, pt, pl, dh = 1, dw = 1;
  bool countIncludePad = false;

  static PoolShape max(const int64_t *ints) {
    PoolShape s(ints);
    s.dh = ints[12];
    s.dw = ints[13];
    return s;
  }
  static PoolShape avg(const int64_t *ints) {
    PoolShape s(ints);
    s.countIncludePad = ints[12] != 0;
    return s;
  }

  bool empty() const {
    return n <= 0 || c <= 0 || oh <= 0 || ow <= 0 || h < 0 || w < 0;
  }
  bool valid() const {
    return kh > 0 && kw > 0 && sh > 0 && sw > 0 && dh > 0 && dw > 0;
  }
  int64_t planes() const { return n * c; }

private:
  explicit PoolShape(const int64_t *ints)
      : n(ints[0]), c(ints[1]), h(ints[2]), w(ints[3]), kh(ints[4]),
        kw(ints[5]), oh(ints[6]), ow(ints[7]), sh(ints[8]), sw(ints[9]),
        pt(ints[10]), pl(ints[11]) {}
};

/// The part of one window, along one axis, that lies inside the image:
/// kernel offsets [kLo, kHi) at input positions start + k * dilation.
struct WindowSpan {
  int64_t start, kLo, kHi;
};

/// The spans of the windows of all `outLen` output positions along one
/// axis, computed once per call (the divisions are not per element).
std::vector<WindowSpan> windowSpans(int64_t outLen, int64_t stride, int64_t pad,
                                    int64_t dil, int64_t kernel,
                                    int64_t inLen) {
  std::vector<WindowSpan> spans(size_t(std::max<int64_t>(outLen, 0)));
  for (int64_t o = 0; o < outLen; ++o) {
    WindowSpan &w = spans[size_t(o)];
    w.start = o * stride - pad;
    // First k with start + k*dil >= 0, first k with start + k*dil >= inLen.
    w.kLo = w.start >= 0 ? 0 : (-w.start + dil - 1) / dil;
    w.kHi = inLen - w.start <= 0 ? 0 : (inLen - w.start + dil - 1) / dil;
    w.kHi = std::min(w.kHi, kernel);
    w.kLo = std::min(w.kLo, w.kHi);
  }
  return spans;
}

//===----------------------------------------------------------------------===//
// MaxPool helpers
//===----------------------------------------------------------------------===//

/// Max of one window and its offset in the plane (-1, lowest() if empty).
/// The comparisons are written without branches: on random data a branch
/// per tap mispredicts half the time. A larger value or a NaN takes over; a
/// NaN then stays (v > NaN is false) unless a later NaN replaces it.
template <class T>
inline void maxWindow(const PoolShape &s, const T *xp, const WindowSpan &r,
                      const WindowSpan &c, T &best, int64_t &bestAt) {
  best = std::numeric_limits<T>::lowest();
  bestAt = -1;
  if (r.kLo >= r.kHi || c.kLo >= c.kHi)
    return;
  bestAt = (r.start + r.kLo * s.dh) * s.w + c.start + c.kLo * s.dw;
  best = xp[bestAt];
  for (int64_t ki = r.kLo; ki < r.kHi; ++ki) {
    const int64_t rowAt = (r.start + ki * s.dh) * s.w + c.start;
    for (int64_t kj = c.kLo; kj < c.kHi; ++kj) {
      const int64_t at = rowAt + kj * s.dw;
      const T v = xp[at];
      const bool take = (v > best) | (v != v);
      best = take ? v : best;
      bestAt = take ? at : bestAt;
    }
  }
}

/// Outputs [qa, qb) of one output row whose column windows are complete:
/// swept tap by tap (in the same row-major window order as maxWindow, so
/// the same element wins) over chunks of outputs, which vectorises.
/// Offsets fit int32 (the caller checks the plane size).
template <class T>
void maxRowInterior(const PoolShape &s, const T *xp, const WindowSpan &r,
                    int64_t qa, int64_t qb, T *yRow, int64_t *iRow,
                    int64_t planeOffset) {
  constexpr int64_t kChunk = 256;
  T best[kChunk];
  int32_t at[kChunk];
  for (int64_t q0 = qa; q0 < qb; q0 += kChunk) {
    const int64_t nq = std::min(kChunk, qb - q0);
    if (r.kLo >= r.kHi) { // the whole row of windows is in the padding
      std::fill(yRow + q0, yRow + q0 + nq, std::numeric_limits<T>::lowest());
      if (iRow)
        std::fill(iRow + q0, iRow + q0 + nq, int64_t(-1));
      continue;
    }
    const int64_t first = (r.start + r.kLo * s.dh) * s.w - s.pl + q0 * s.sw;
    for (int64_t j = 0; j < nq; ++j) {
      at[j] = int32_t(first + j * s.sw);
      best[j] = xp[at[j]];
    }
    for (int64_t ki = r.kLo; ki < r.kHi; ++ki) {
      for (int64_t kj = 0; kj < s.kw; ++kj) {
        const int64_t base =
            (r.start + ki * s.dh) * s.w - s.pl + kj * s.dw + q0 * s.sw;
        const T *xs = xp + base;
        if (s.sw == 1) {
          for (int64_t j = 0; j < nq; ++j) {
            const T v = xs[j];
            const bool take = (v > best[j]) | (v != v);
            best[j] = take ? v : best[j];
            at[j] = take ? int32_t(base + j) : at[j];
          }
        } else {
          for (int64_t j = 0; j < nq; ++j) {
            const T v = xs[j * s.sw];
            const bool take = (v > best[j]) | (v != v);
            best[j] = take ? v : best[j];
            at[j] = take ? int32_t(base + j * s.sw) : at[j];
          }
        }
      }
    }
    std::copy(best, best + nq, yRow + q0);
    if (iRow)
      for (int64_t j = 0; j < nq; ++j)
        iRow[q0 + j] = planeOffset + at[j];
  }
}

//===----------------------------------------------------------------------===//
// MaxPool
//===----------------------------------------------------------------------===//

template <class T>
void maxPool2dKernel(void *const *bufs, const int64_t *ints,
                     const double *reals) {
  const T *x = static_cast<const T *>(bufs[0]);
  T *y = static_cast<T *>(bufs[1]);
  int64_t *indices = static_cast<int64_t *>(bufs[2]);
  const PoolShape s = PoolShape::max(ints);
  if (s.empty())
    return;
  const int64_t yPlane = s.oh * s.ow, xPlane = s.h * s.w;
  if (!s.valid()) {
    poison(y, s.planes() * yPlane);
    if (indices)
      std::fill(indices, indices + s.planes() * yPlane, int64_t(-1));
    return;
  }
  const std::vector<WindowSpan> rows =
      windowSpans(s.oh, s.sh, s.pt, s.dh, s.kh, s.h);
  const std::vector<WindowSpan> cols =
      windowSpans(s.ow, s.sw, s.pl, s.dw, s.kw, s.w);
  // Outputs [qa, qb) of a row have complete column windows (kLo == 0,
  // kHi == kW); they take the swept, vectorised path.
  int64_t qa = s.ow, qb = s.ow;
  for (int64_t q = 0; q < s.ow; ++q)
    if (cols[size_t(q)].kLo == 0 && cols[size_t(q)].kHi == s.kw) {
      qa = std::min(qa, q);
      qb = q + 1;
    }
  if (qa >= qb || xPlane > INT32_MAX)
    qa = qb = 0; // no interior (or offsets beyond int32): all scalar
  for (int64_t plane = 0; plane < s.planes(); ++plane) {
    const T *xp = x + plane * xPlane;
    T *yp = y + plane * yPlane;
    int64_t *ip = indices ? indices + plane * yPlane : nullptr;
    for (int64_t o = 0; o < s.oh; ++o) {
      const WindowSpan &r = rows[size_t(o)];
      T *yRow = yp + o * s.ow;
      int64_t *iRow = ip ? ip + o * s.ow : nullptr;
      auto border = [&](int64_t q) {
        T best;
        int64_t at;
        maxWindow(s, xp, r, cols[size_t(q)], best, at);
        yRow[q] = best;
        if (iRow)
          iRow[q] = at < 0 ? -1 : plane * xPlane + at;
      };
      for (int64_t q = 0; q < qa; ++q)
        border(q);
      maxRowInterior(s, xp, r, qa, qb, yRow, iRow, plane * xPlane);
      for (int64_t q = qb; q < s.ow; ++q)
        border(q);
    }
  }
}

template <class T>
void maxPool2dGradKernel(void *const *bufs, const int64_t *ints,
                         const double *reals) {
  const T *dy = static_cast<const T *>(bufs[0]);
  const int64_t *indices = static_cast<const int64_t *>(bufs[1]);
  T *dx = static_cast<T *>(bufs[2]);
  int64_t nX = ints[0], nY = ints[1];
  if (nX <= 0)
    return;
  std::fill(dx, dx + nX, T(0));
  for (int64_t i = 0; i < nY; ++i) {
    int64_t at = indices[i];
    if (at >= 0 && at < nX)
      dx[at] += dy[i];
  }
}

//===----------------------------------------------------------------------===//
// AveragePool
//===----------------------------------------------------------------------===//

template <class T>
void avgPool2dKernel(void *const *bufs, const int64_t *ints,
                     const double *reals) {
  const T *x = static_cast<const T *>(bufs[0]);
  T *y = static_cast<T *>(bufs[1]);
  const PoolShape s = PoolShape::avg(ints);
  if (s.empty())
    return;
  const int64_t yPlane = s.oh * s.ow, xPlane = s.h * s.w;
  if (!s.valid()) {
    poison(y, s.planes() * yPlane);
    return;
  }
  const T fullInv = T(1) / T(s.kh * s.kw);
  const std::vector<WindowSpan> rows =
      windowSpans(s.oh, s.sh, s.pt, 1, s.kh, s.h);
  const std::vector<WindowSpan> cols =
      windowSpans(s.ow, s.sw, s.pl, 1, s.kw, s.w);
  for (int64_t plane = 0; plane < s.planes(); ++plane) {
    const T *xp = x + plane * xPlane;
    T *yp = y + plane * yPlane;
    for (int64_t o = 0; o < s.oh; ++o) {
      const WindowSpan &r = rows[size_t(o)];
      for (int64_t q = 0; q < s.ow; ++q) {
        const WindowSpan &c = cols[size_t(q)];
        T sum = T(0);
        for (int64_t ki = r.kLo; ki < r.kHi; ++ki) {
          const T *xr = xp + (r.start + ki) * s.w + c.start;
          for (int64_t kj = c.kLo; kj < c.kHi; ++kj)
            sum += xr[kj];
        }
        int64_t count = (r.kHi - r.kLo) * (c.kHi - c.kLo);
        T inv =
            s.countIncludePad ? fullInv : (count > 0 ? T(1) / T(count) : T(0));
        yp[o * s.ow + q] = sum * inv;
      }
    }
  }
}

template <class T>
void avgPool2dGradKernel(void *const *bufs, const int64_t *ints,
                         const double *reals) {
  const T *dy = static_cast<const T *>(bufs[0]);
  T *dx = static_cast<T *>(bufs[1]);
  const PoolShape s = PoolShape::avg(ints);
  if (s.n <= 0 || s.c <= 0 || s.h <= 0 || s.w <= 0)
    return;
  const int64_t yPlane = s.oh * s.ow, xPlane = s.h * s.w;
  if (!s.valid()) {
    poison(dx, s.planes() * xPlane);
    return;
  }
  std::fill(dx, dx + s.planes() * xPlane, T(0));
  if (s.oh <= 0 || s.ow <= 0)
    return;
  const T fullInv = T(1) / T(s.kh * s.kw);
  const std::vector<WindowSpan> rows =
      windowSpans(s.oh, s.sh, s.pt, 1, s.kh, s.h);
  const std::vector<WindowSpan> cols =
      windowSpans(s.ow, s.sw, s.pl, 1, s.kw, s.w);
  for (int64_t plane = 0; plane < s.planes(); ++plane) {
    const T *dyp = dy + plane * yPlane;
    T *dxp = dx + plane * xPlane;
    for (int64_t o = 0; o < s.oh; ++o) {
      const WindowSpan &r = rows[size_t(o)];
      for (int64_t q = 0; q < s.ow; ++q) {
        const WindowSpan &c = cols[size_t(q)];
        int64_t count = (r.kHi - r.kLo) * (c.kHi - c.kLo);
        if (count == 0)
          continue;
        T inv = s.countIncludePad ? fullInv : T(1) / T(count);
        const T g = dyp[o * s.ow + q] * inv;
        for (int64_t ki = r.kLo; ki < r.kHi; ++ki) {
          T *dxr = dxp + (r.start + ki) * s.w + c.start;
          for (int64_t kj = c.kLo; kj < c.kHi; ++kj)
            dxr[kj] += g;
        }
      }
    }
  }
}

} // namespace

PIPEC_CPU_KERNEL(pipec_k_maxpool2d, maxPool2dKernel)
PIPEC_CPU_KERNEL(pipec_k_maxpool2d_grad, maxPool2dGradKernel)
PIPEC_CPU_KERNEL(pipec_k_avgpool2d, avgPool2dKernel)
PIPEC_CPU_KERNEL(pipec_k_avgpool2d_grad, avgPool2dGradKernel)
