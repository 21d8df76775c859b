//===- conv.cpp - 2-D convolution and its backward ------------------------===//
//
// Part of pipec. CPU kernels behind pipec_k_conv2d,
// pipec_k_conv2d_grad_input and pipec_k_conv2d_grad_weight (see
// include/pipec_rt.h for the parameter layouts).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// ONNX Conv in NCHW with groups, strides, pads and dilations. With
/// Cg = C / groups input and Mg = M / groups output channels per group, a
/// patch of K = Cg * kH * kW inputs and P = oH * oW output pixels:
///
///   Y[n, g]  = W[g] (Mg x K)  *  col(X[n, g]) (K x P)        (+ bias)
///   dX[n, g] = col2im( W[g]^T (K x Mg) * dY[n, g] (Mg x P) )
///   dW[g]    = sum_n dY[n, g] (Mg x P) * col(X[n, g])^T (P x K)
///
/// where col() is im2col: row (c, ki, kj) of col holds, for every output
/// pixel (oh, ow), X[c, oh*sH - padTop + ki*dH, ow*sW - padLeft + kj*dW],
/// or 0 where that falls in the padding. The products are OpenBLAS GEMM
/// calls (sgemm, or dgemm for the float64 twins; BLAS uses its own threads).
/// When an image has few output pixels (P <= 512), the GEMMs of several images
/// are fused into one over their concatenated patch matrices (imageBlock),
/// since skinny per-image GEMMs run well below BLAS peak. Two shapes avoid
/// im2col:
///  - pointwise convolutions (1x1, stride 1, no padding, oH = H, oW = W)
///    on images processed one at a time: col(X) is X itself, so X / dX are
///    used directly as GEMM operands;
///  - Cg == 1 (depthwise, with any channel multiplier Mg): each output
///    channel reads a single input channel, so the GEMM would be a 1 x K by
///    K x P vector product; direct loops are faster and need no buffer.
///
/// Every loop over output pixels is clipped in advance to the range whose
/// input position lies inside the image (validRange), so the inner loops
/// have no bounds checks and vectorise for unit strides. Bottom / right
/// padding never needs to be known: it is whatever oH / oW imply.
///
/// im2col uses the kernel context's scratch, which grows to the largest
/// patch matrix seen (at most K x max(P, 1024) plus an Mg x 1024 block) and is
/// kept for the next call (no allocation in steady state).
///
/// Malformed parameters (C or M not divisible by groups, non-positive
/// kernel, stride or dilation, or GEMM dimensions beyond BLAS's 32-bit
/// ints) poison the output with NaN (cpu/strided.h explains why).
///
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"

#include "core/conv_shape.h"
#include "cpu/real.h"
#include "cpu/strided.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

using namespace pipec::rt;
using pipec::cpu::blasGemm;
using pipec::cpu::KernelContext;
using pipec::rt::ConvShape;

namespace {

/// The output positions o in [0, outLen) whose input position
/// o * stride + off lies in [0, inLen), as [lo, hi) (empty: lo == hi).
inline void validRange(int64_t off, int64_t stride, int64_t inLen,
                       int64_t outLen, int64_t &lo, int64_t &hi) {
  lo = off >= 0 ? 0 : (-off + stride - 1) / stride;
  hi = inLen - off <= 0 ? 0 : (inLen - off + stride - 1) / stride;
  hi = std::min(hi, outLen);
  lo = std::min(lo, hi);
}

/// Row-major C[MxN] = op(A) * op(B) (+ C when accumulate), via OpenBLAS.
/// Requires every dimension to fit a blasint (ConvShape::valid).
template <class T>
void gemm(KernelContext &kc, bool transA, bool transB, int64_t m, int64_t n,
          int64_t k, const T *a, int64_t lda, const T *b, int64_t ldb, T *c,
          int64_t ldc, bool accumulate) {
  blasGemm(kc, transA ? CblasTrans : CblasNoTrans,
           transB ? CblasTrans : CblasNoTrans, blasint(m), blasint(n),
           blasint(k), T(1), a, blasint(lda), b, blasint(ldb),
           T(accumulate ? 1 : 0), c, blasint(ldc));
}

//===----------------------------------------------------------------------===//
// im2col / col2im
//===----------------------------------------------------------------------===//

/// col[K, P] = col(xg) for the Cg channels of one group of one image; row
/// k of col starts at col + k * ld (ld >= P).
template <class T>
void im2col(const ConvShape &s, const T *xg, T *col, int64_t ld) {
  for (int64_t c = 0; c < s.cg; ++c) {
    const T *xc = xg + c * s.h * s.w;
    for (int64_t ki = 0; ki < s.kh; ++ki) {
      int64_t offH = ki * s.dh - s.pt, hLo, hHi;
      validRange(offH, s.sh, s.h, s.oh, hLo, hHi);
      for (int64_t kj = 0; kj < s.kw; ++kj) {
        int64_t offW = kj * s.dw - s.pl, wLo, wHi;
        validRange(offW, s.sw, s.w, s.ow, wLo, wHi);
        T *row = col + ((c * s.kh + ki) * s.kw + kj) * ld;
        std::fill(row, row + hLo * s.ow, T(0));
        std::fill(row + hHi * s.ow, row + s.p, T(0));
        for (int64_t o = hLo; o < hHi; ++o) {
          T *r = row + o * s.ow;
          const T *xr = xc + (o * s.sh + offH) * s.w + offW;
          std::fill(r, r + wLo, T(0));
          if (s.sw == 1) {
            std::memcpy(r + wLo, xr + wLo, sizeof(T) * size_t(wHi - wLo));
          } else {
            for (int64_t q = wLo; q < wHi; ++q)
              r[q] = xr[q * s.sw];
          }
          std::fill(r + wHi, r + s.ow, T(0));
        }
      }
    }
  }
}

/// dxg += col2im(col): the adjoint of im2col (padding entries are
/// dropped); row k of col starts at col + k * ld.
template <class T>
void col2imAdd(const ConvShape &s, const T *col, int64_t ld, T *dxg) {
  for (int64_t c = 0; c < s.cg; ++c) {
    T *dxc = dxg + c * s.h * s.w;
    for (int64_t ki = 0; ki < s.kh; ++ki) {
      int64_t offH = ki * s.dh - s.pt, hLo, hHi;
      validRange(offH, s.sh, s.h, s.oh, hLo, hHi);
      for (int64_t kj = 0; kj < s.kw; ++kj) {
        int64_t offW = kj * s.dw - s.pl, wLo, wHi;
        validRange(offW, s.sw, s.w, s.ow, wLo, wHi);
        const T *row = col + ((c * s.kh + ki) * s.kw + kj) * ld;
        for (int64_t o = hLo; o < hHi; ++o) {
          const T *r = row + o * s.ow;
          T *dxr = dxc + (o * s.sh + offH) * s.w + offW;
          if (s.sw == 1) {
            for (int64_t q = wLo; q < wHi; ++q)
              dxr[q] += r[q];
          } else {
            for (int64_t q = wLo; q < wHi; ++q)
              dxr[q * s.sw] += r[q];
          }
        }
      }
    }
  }
}

//===----------------------------------------------------------------------===//
// Direct loops for Cg == 1 (depthwise)
//===----------------------------------------------------------------------===//

/// yp[oH, oW] += conv of one input plane xc with one kH x kW filter wm.
template <class T>
void depthwisePlane(const ConvShape &s, const T *xc, const T *wm, T *yp) {
  for (int64_t ki = 0; ki < s.kh; ++ki) {
    int64_t offH = ki * s.dh - s.pt, hLo, hHi;
    validRange(offH, s.sh, s.h, s.oh, hLo, hHi);
    for (int64_t kj = 0; kj < s.kw; ++kj) {
      int64_t offW = kj * s.dw - s.pl, wLo, wHi;
      validRange(offW, s.sw, s.w, s.ow, wLo, wHi);
      const T wv = wm[ki * s.kw + kj];
      for (int64_t o = hLo; o < hHi; ++o) {
        const T *xr = xc + (o * s.sh + offH) * s.w + offW;
        T *yr = yp + o * s.ow;
        if (s.sw == 1) {
          for (int64_t q = wLo; q < wHi; ++q)
            yr[q] += wv * xr[q];
        } else {
          for (int64_t q = wLo; q < wHi; ++q)
            yr[q] += wv * xr[q * s.sw];
        }
      }
    }
  }
}

/// dxc += the adjoint of depthwisePlane with respect to the input plane.
template <class T>
void depthwisePlaneGradInput(const ConvShape &s, const T *dyp, const T *wm,
                             T *dxc) {
  for (int64_t ki = 0; ki < s.kh; ++ki) {
    int64_t offH = ki * s.dh - s.pt, hLo, hHi;
    validRange(offH, s.sh, s.h, s.oh, hLo, hHi);
    for (int64_t kj = 0; kj < s.kw; ++kj) {
      int64_t offW = kj * s.dw - s.pl, wLo, wHi;
      validRange(offW, s.sw, s.w, s.ow, wLo, wHi);
      const T wv = wm[ki * s.kw + kj];
      for (int64_t o = hLo; o < hHi; ++o) {
        T *dxr = dxc + (o * s.sh + offH) * s.w + offW;
        const T *dyr = dyp + o * s.ow;
        if (s.sw == 1) {
          for (int64_t q = wLo; q < wHi; ++q)
            dxr[q] += wv * dyr[q];
        } else {
          for (int64_t q = wLo; q < wHi; ++q)
            dxr[q * s.sw] += wv * dyr[q];
        }
      }
    }
  }
}

/// sum_i a[i] * b[i * sb], with independent lanes so that it vectorises.
template <class T> T dotStrided(const T *a, const T *b, int64_t sb, int64_t n) {
  constexpr int kLanes = 8;
  T lanes[kLanes] = {};
  int64_t i = 0;
  if (sb == 1) {
    for (; i + kLanes <= n; i += kLanes)
      for (int l = 0; l < kLanes; ++l)
        lanes[l] += a[i + l] * b[i + l];
  }
  T acc = 0;
  for (; i < n; ++i)
    acc += a[i] * b[i * sb];
  for (int l = 0; l < kLanes; ++l)
    acc += lanes[l];
  return acc;
}

/// dwm[kH, kW] += the adjoint of depthwisePlane with respect to the filter.
template <class T>
void depthwisePlaneGradWeight(const ConvShape &s, const T *dyp, const T *xc,
                              T *dwm) {
  for (int64_t ki = 0; ki < s.kh; ++ki) {
    int64_t offH = ki * s.dh - s.pt, hLo, hHi;
    validRange(offH, s.sh, s.h, s.oh, hLo, hHi);
    for (int64_t kj = 0; kj < s.kw; ++kj) {
      int64_t offW = kj * s.dw - s.pl, wLo, wHi;
      validRange(offW, s.sw, s.w, s.ow, wLo, wHi);
      T acc = 0;
      for (int64_t o = hLo; o < hHi; ++o) {
        const T *xr = xc + (o * s.sh + offH) * s.w + offW;
        acc +=
            dotStrided(dyp + o * s.ow + wLo, xr + wLo * s.sw, s.sw, wHi - wLo);
      }
      dwm[ki * s.kw + kj] += acc;
    }
  }
}

/// Images per GEMM. With few output pixels per image (late ResNet stages:
/// 7x7 = 49) a per-image GEMM is too skinny for BLAS to reach its peak, so
/// the GEMMs of `block` images are done as one, on [K, block * P] patch
/// matrices (about kTargetColumns columns), at the cost of copying Y / dY
/// between the [image][channel][pixel] and [channel][image, pixel] layouts.
/// Large images (block == 1) use X, Y, dY and dX in place.
constexpr int64_t kTargetColumns = 1024;

int64_t imageBlock(const ConvShape &s) {
  return std::max<int64_t>(1, std::min(s.n, kTargetColumns / s.p));
}

//===----------------------------------------------------------------------===//
// Kernels
//===----------------------------------------------------------------------===//

template <class T>
void conv2dKernel(KernelContext &kc, void *const *bufs, const int64_t *ints,
                  const double *reals) {
  const T *x = static_cast<const T *>(bufs[0]);
  const T *w = static_cast<const T *>(bufs[1]);
  const T *bias = static_cast<const T *>(bufs[2]);
  T *y = static_cast<T *>(bufs[3]);
  const ConvShape s(ints);
  if (s.n <= 0 || s.m <= 0 || s.oh <= 0 || s.ow <= 0)
    return;
  if (!s.valid()) {
    poison(y, s.yCount());
    return;
  }
  const bool useBias = s.hasBias && bias != nullptr;
  // Y starts as the bias (or zeros); every path then accumulates into it.
  for (int64_t in = 0; in < s.n; ++in)
    for (int64_t om = 0; om < s.m; ++om) {
      T *yp = y + (in * s.m + om) * s.p;
      std::fill(yp, yp + s.p, useBias ? bias[om] : T(0));
    }
  if (s.k == 0)
    return; // No input channels: Y is the bias.

  if (s.cg == 1) {
    for (int64_t in = 0; in < s.n; ++in)
      for (int64_t om = 0; om < s.m; ++om)
        depthwisePlane(s, x + (in * s.c + om / s.mg) * s.h * s.w, w + om * s.k,
                       y + (in * s.m + om) * s.p);
    return;
  }
  const int64_t block = imageBlock(s);
  if (block == 1) {
    const bool pointwise = s.pointwise();
    T *col = pointwise ? nullptr : kc.scratch<T>(s.k * s.p);
    for (int64_t in = 0; in < s.n; ++in) {
      for (int64_t g = 0; g < s.groups; ++g) {
        const T *xg = x + (in * s.c + g * s.cg) * s.h * s.w;
        const T *patches = xg;
        if (!pointwise) {
          im2col(s, xg, col, s.p);
          patches = col;
        }
        gemm(kc, false, false, s.mg, s.p, s.k, w + g * s.mg * s.k, s.k, patches,
             s.p, y + (in * s.m + g * s.mg) * s.p, s.p, /*accumulate=*/true);
      }
    }
    return;
  }
  // Blocks of images: col [K, nb * P], product [Mg, nb * P].
  const int64_t cols = block * s.p;
  T *col = kc.scratch<T>(s.k * cols + s.mg * cols);
  T *prod = col + s.k * cols;
  for (int64_t in0 = 0; in0 < s.n; in0 += block) {
    const int64_t nb = std::min(block, s.n - in0);
    for (int64_t g = 0; g < s.groups; ++g) {
      for (int64_t b = 0; b < nb; ++b)
        im2col(s, x + ((in0 + b) * s.c + g * s.cg) * s.h * s.w, col + b * s.p,
               cols);
      gemm(kc, false, false, s.mg, nb * s.p, s.k, w + g * s.mg * s.k, s.k, col,
           cols, prod, cols, /*accumulate=*/false);
      for (int64_t om = 0; om < s.mg; ++om)
        for (int64_t b = 0; b < nb; ++b) {
          T *yp = y + ((in0 + b) * s.m + g * s.mg + om) * s.p;
          const T *pp = prod + om * cols + b * s.p;
          for (int64_t i = 0; i < s.p; ++i)
            yp[i] += pp[i];
        }
    }
  }
}

template <class T>
void conv2dGradInputKernel(KernelContext &kc, void *const *bufs,
                           const int64_t *ints, const double *reals) {
  const T *dy = static_cast<const T *>(bufs[0]);
  const T *w = static_cast<const T *>(bufs[1]);
  T *dx = static_cast<T *>(bufs[2]);
  const ConvShape s(ints);
  if (s.n <= 0 || s.c <= 0 || s.h <= 0 || s.w <= 0)
    return;
  if (!s.valid()) {
    poison(dx, s.xCount());
    return;
  }
  const bool pointwise = s.pointwise();
  const bool empty = s.m == 0 || s.p == 0;
  // dX is overwritten: zeroed first wherever the path below accumulates
  // (the depthwise planes always do; a pointwise GEMM of one image at a
  // time writes it whole).
  if (empty || !pointwise || s.cg == 1 || imageBlock(s) > 1)
    std::fill(dx, dx + s.xCount(), T(0));
  if (empty)
    return;
  const int64_t block = imageBlock(s);

  if (s.cg == 1) {
    for (int64_t in = 0; in < s.n; ++in)
      for (int64_t om = 0; om < s.m; ++om)
        depthwisePlaneGradInput(s, dy + (in * s.m + om) * s.p, w + om * s.k,
                                dx + (in * s.c + om / s.mg) * s.h * s.w);
    return;
  }
  if (block == 1) {
    T *col = pointwise ? nullptr : kc.scratch<T>(s.k * s.p);
    for (int64_t in = 0; in < s.n; ++in) {
      for (int64_t g = 0; g < s.groups; ++g) {
        const T *dyg = dy + (in * s.m + g * s.mg) * s.p;
        const T *wg = w + g * s.mg * s.k;
        T *dxg = dx + (in * s.c + g * s.cg) * s.h * s.w;
        // [K, P] = W[g]^T (K x Mg) * dY[n, g] (Mg x P); with a pointwise
        // convolution K = Cg and P = H * W, so that is dX[n, g] itself.
        if (pointwise) {
          gemm(kc, true, false, s.k, s.p, s.mg, wg, s.k, dyg, s.p, dxg, s.p,
               /*accumulate=*/false);
          continue;
        }
        gemm(kc, true, false, s.k, s.p, s.mg, wg, s.k, dyg, s.p, col, s.p,
             /*accumulate=*/false);
        col2imAdd(s, col, s.p, dxg);
      }
    }
    return;
  }
  // Blocks of images: dY gathered into [Mg, nb * P], col [K, nb * P].
  const int64_t cols = block * s.p;
  T *col = kc.scratch<T>(s.k * cols + s.mg * cols);
  T *dyBlock = col + s.k * cols;
  for (int64_t in0 = 0; in0 < s.n; in0 += block) {
    const int64_t nb = std::min(block, s.n - in0);
    for (int64_t g = 0; g < s.groups; ++g) {
      for (int64_t om = 0; om < s.mg; ++om)
        for (int64_t b = 0; b < nb; ++b)
          std::memcpy(dyBlock + om * cols + b * s.p,
                      dy + ((in0 + b) * s.m + g * s.mg + om) * s.p,
                      sizeof(T) * size_t(s.p));
      gemm(kc, true, false, s.k, nb * s.p, s.mg, w + g * s.mg * s.k, s.k,
           dyBlock, cols, col, cols, /*accumulate=*/false);
      for (int64_t b = 0; b < nb; ++b)
        col2imAdd(s, col + b * s.p, cols,
                  dx + ((in0 + b) * s.c + g * s.cg) * s.h * s.w);
    }
  }
}

template <class T>
void conv2dGradWeightKernel(KernelContext &kc, void *const *bufs,
                            const int64_t *ints, const double *reals) {
  const T *dy = static_cast<const T *>(bufs[0]);
  const T *x = static_cast<const T *>(bufs[1]);
  T *dw = static_cast<T *>(bufs[2]);
  const ConvShape s(ints);
  if (s.m <= 0 || s.cg <= 0 || s.kh <= 0 || s.kw <= 0)
    return; // dW is empty (or its shape is unknowable: nothing to poison).
  if (!s.valid()) {
    poison(dw, s.wCount());
    return;
  }
  if (s.n <= 0 || s.p <= 0) {
    std::fill(dw, dw + s.wCount(), T(0));
    return;
  }
  if (s.cg == 1) {
    std::fill(dw, dw + s.wCount(), T(0));
    for (int64_t in = 0; in < s.n; ++in)
      for (int64_t om = 0; om < s.m; ++om)
        depthwisePlaneGradWeight(s, dy + (in * s.m + om) * s.p,
                                 x + (in * s.c + om / s.mg) * s.h * s.w,
                                 dw + om * s.k);
    return;
  }
  const int64_t block = imageBlock(s);
  if (block == 1) {
    const bool pointwise = s.pointwise();
    T *col = pointwise ? nullptr : kc.scratch<T>(s.k * s.p);
    for (int64_t in = 0; in < s.n; ++in) {
      for (int64_t g = 0; g < s.groups; ++g) {
        const T *xg = x + (in * s.c + g * s.cg) * s.h * s.w;
        const T *patches = xg;
        if (!pointwise) {
          im2col(s, xg, col, s.p);
          patches = col;
        }
        // dW[g] (Mg x K) (+)= dY[n, g] (Mg x P) * col^T (P x K); the first
        // image overwrites, so dW needs no zeroing.
        gemm(kc, false, true, s.mg, s.k, s.p, dy + (in * s.m + g * s.mg) * s.p,
             s.p, patches, s.p, dw + g * s.mg * s.k, s.k,
             /*accumulate=*/in > 0);
      }
    }
    return;
  }
  // Blocks of images: dW[g] (+)= dY [Mg, nb * P] * col [K, nb * P]^T.
  const int64_t cols = block * s.p;
  T *col = kc.scratch<T>(s.k * cols + s.mg * cols);
  T *dyBlock = col + s.k * cols;
  for (int64_t in0 = 0; in0 < s.n; in0 += block) {
    const int64_t nb = std::min(block, s.n - in0);
    for (int64_t g = 0; g < s.groups; ++g) {
      for (int64_t b = 0; b < nb; ++b) {
        im2col(s, x + ((in0 + b) * s.c + g * s.cg) * s.h * s.w, col + b * s.p,
               cols);
        for (int64_t om = 0; om < s.mg; ++om)
          std::memcpy(dyBlock + om * cols + b * s.p,
                      dy + ((in0 + b) * s.m + g * s.mg + om) * s.p,
                      sizeof(T) * size_t(s.p));
      }
      gemm(kc, false, true, s.mg, s.k, nb * s.p, dyBlock, cols, col, cols,
           dw + g * s.mg * s.k, s.k, /*accumulate=*/in0 > 0);
    }
  }
}

} // namespace

PIPEC_CPU_KERNEL_CTX(pipec_k_conv2d, conv2dKernel)
PIPEC_CPU_KERNEL_CTX(pipec_k_conv2d_grad_input, conv2dGradInputKernel)
PIPEC_CPU_KERNEL_CTX(pipec_k_conv2d_grad_weight, conv2dGradWeightKernel)
