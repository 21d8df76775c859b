//===- softmax.cpp - Softmax / log-softmax and their backward -------------===//
//
// Part of pipec. CPU kernels behind pipec_k_softmax and pipec_k_softmax_grad
// (see include/pipec_rt.h for the parameter layouts).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The tensor is viewed as [outer, dim, inner] and normalised along `dim`.
/// With inner == 1 every row is contiguous. Otherwise the kernels sweep
/// whole [dim, inner-block] panels, keeping one running maximum and sum per
/// inner position in a small stack buffer, so all memory accesses stay
/// contiguous. Sums are accumulated in double; exponentials are in the
/// element type.
///
/// Both kernels are templates over the element type (float, or double for
/// the `_f64` twins, see cpu/real.h). The float kernels use polyExp; the
/// double ones compute in double throughout with the exact std::exp.
///
/// Every output element is written after the last read of the input
/// element at the same index, so Y may alias X (and dX may alias dY).
///
//===----------------------------------------------------------------------===//

#include "cpu/fastmath.h"
#include "pipec_rt.h"

#include "cpu/real.h"

#include <algorithm>
#include <cmath>

using pipec::cpu::kernelExp;

namespace {

/// Inner positions processed together when inner > 1.
constexpr int64_t kBlock = 256;

/// Parameters shared by the forward and backward kernels.
struct SoftmaxShape {
  int64_t outer, dim, inner;
  bool isLog;
  explicit SoftmaxShape(const int64_t *ints)
      : outer(ints[0]), dim(ints[1]), inner(ints[2]), isLog(ints[3] != 0) {}
  bool empty() const { return outer <= 0 || dim <= 0 || inner <= 0; }
};

/// Softmax of one contiguous row of n > 0 elements.
template <class T> void softmaxRow(const T *x, T *y, int64_t n, bool isLog) {
  T mx = x[0];
  for (int64_t d = 1; d < n; ++d)
    mx = std::max(mx, x[d]);
  // The exponentials in a loop that vectorises, then their sum in double.
  // Log-softmax keeps them in a block buffer (y may alias x, which it
  // still reads); softmax stores them in y and normalises in place.
  double sum = 0;
  if (isLog) {
    T e[kBlock];
    for (int64_t d0 = 0; d0 < n; d0 += kBlock) {
      const int64_t nb = std::min(kBlock, n - d0);
      for (int64_t k = 0; k < nb; ++k)
        e[k] = kernelExp(x[d0 + k] - mx);
      for (int64_t k = 0; k < nb; ++k)
        sum += e[k];
    }
    double lse = double(mx) + std::log(sum);
    for (int64_t d = 0; d < n; ++d)
      y[d] = T(double(x[d]) - lse);
    return;
  }
  for (int64_t d = 0; d < n; ++d)
    y[d] = kernelExp(x[d] - mx);
  for (int64_t d = 0; d < n; ++d)
    sum += y[d];
  T inv = T(1.0 / sum);
  for (int64_t d = 0; d < n; ++d)
    y[d] *= inv;
}

/// Softmax along the middle axis of one [dim, inner] panel, for the inner
/// positions [0, nb) of the block starting at x / y (row stride `inner`).
template <class T>
void softmaxPanel(const T *x, T *y, int64_t dim, int64_t inner, int64_t nb,
                  bool isLog) {
  T mx[kBlock];
  double sum[kBlock];
  for (int64_t j = 0; j < nb; ++j) {
    mx[j] = x[j];
    sum[j] = 0;
  }
  for (int64_t d = 1; d < dim; ++d)
    for (int64_t j = 0; j < nb; ++j)
      mx[j] = std::max(mx[j], x[d * inner + j]);
  // As in softmaxRow: log-softmax must not overwrite x (y may alias it)
  // before the last pass.
  T e[kBlock];
  for (int64_t d = 0; d < dim; ++d) {
    T *out = isLog ? e : y + d * inner;
    for (int64_t j = 0; j < nb; ++j)
      out[j] = kernelExp(x[d * inner + j] - mx[j]);
    for (int64_t j = 0; j < nb; ++j)
      sum[j] += out[j];
  }
  if (isLog) {
    for (int64_t j = 0; j < nb; ++j)
      sum[j] = double(mx[j]) + std::log(sum[j]); // log-sum-exp
    for (int64_t d = 0; d < dim; ++d)
      for (int64_t j = 0; j < nb; ++j)
        y[d * inner + j] = T(double(x[d * inner + j]) - sum[j]);
    return;
  }
  T inv[kBlock];
  for (int64_t j = 0; j < nb; ++j)
    inv[j] = T(1.0 / sum[j]);
  for (int64_t d = 0; d < dim; ++d)
    for (int64_t j = 0; j < nb; ++j)
      y[d * inner + j] *= inv[j];
}

/// Backward of one [dim, inner] panel restricted to inner positions [0, nb).
/// inner == 1 (a contiguous row) is the special case nb == inner == 1.
template <class T>
void softmaxGradPanel(const T *y, const T *dy, T *dx, int64_t dim,
                      int64_t inner, int64_t nb, bool isLog) {
  double acc[kBlock];
  T s[kBlock];
  for (int64_t j = 0; j < nb; ++j)
    acc[j] = 0;
  if (isLog) {
    // dX = dY - exp(Y) * sum(dY)
    for (int64_t d = 0; d < dim; ++d)
      for (int64_t j = 0; j < nb; ++j)
        acc[j] += dy[d * inner + j];
    for (int64_t j = 0; j < nb; ++j)
      s[j] = T(acc[j]);
    for (int64_t d = 0; d < dim; ++d)
      for (int64_t j = 0; j < nb; ++j) {
        int64_t k = d * inner + j;
        dx[k] = dy[k] - kernelExp(y[k]) * s[j];
      }
    return;
  }
  // dX = Y * (dY - sum(dY * Y))
  for (int64_t d = 0; d < dim; ++d)
    for (int64_t j = 0; j < nb; ++j)
      acc[j] += double(dy[d * inner + j]) * double(y[d * inner + j]);
  for (int64_t j = 0; j < nb; ++j)
    s[j] = T(acc[j]);
  for (int64_t d = 0; d < dim; ++d)
    for (int64_t j = 0; j < nb; ++j) {
      int64_t k = d * inner + j;
      dx[k] = y[k] * (dy[k] - s[j]);
    }
}

template <class T>
void softmaxKernel(void *const *bufs, const int64_t *ints, const double *) {
  const T *x = static_cast<const T *>(bufs[0]);
  T *y = static_cast<T *>(bufs[1]);
  SoftmaxShape s(ints);
  if (s.empty())
    return;
  int64_t panel = s.dim * s.inner;
  for (int64_t o = 0; o < s.outer; ++o) {
    const T *xo = x + o * panel;
    T *yo = y + o * panel;
    if (s.inner == 1) {
      softmaxRow(xo, yo, s.dim, s.isLog);
      continue;
    }
    for (int64_t j0 = 0; j0 < s.inner; j0 += kBlock)
      softmaxPanel(xo + j0, yo + j0, s.dim, s.inner,
                   std::min(kBlock, s.inner - j0), s.isLog);
  }
}

template <class T>
void softmaxGradKernel(void *const *bufs, const int64_t *ints, const double *) {
  const T *y = static_cast<const T *>(bufs[0]);
  const T *dy = static_cast<const T *>(bufs[1]);
  T *dx = static_cast<T *>(bufs[2]);
  SoftmaxShape s(ints);
  if (s.empty())
    return;
  int64_t panel = s.dim * s.inner;
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t j0 = 0; j0 < s.inner; j0 += kBlock)
      softmaxGradPanel(y + o * panel + j0, dy + o * panel + j0,
                       dx + o * panel + j0, s.dim, s.inner,
                       std::min(kBlock, s.inner - j0), s.isLog);
}

} // namespace

PIPEC_CPU_KERNEL(pipec_k_softmax, softmaxKernel)
PIPEC_CPU_KERNEL(pipec_k_softmax_grad, softmaxGradKernel)
