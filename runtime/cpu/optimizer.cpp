//===- optimizer.cpp - ONNX training operators Momentum, Adam, Adagrad ----===//
//
// The update formulas of ai.onnx.preview.training (opset 1), one tensor at
// a time, computed in the element type with the scalar coefficients in
// double as ONNX's reference implementation does: in float for pipec_k_X,
// and in double throughout for the pipec_k_X_f64 twins (R, X, G and the
// states are double there, the update count stays int64). The update count
// (ONNX's input T, `t` below; not the template's element type T) is the
// number of updates already made (0 on the first). Outputs may alias their
// inputs (elementwise).
//
//===----------------------------------------------------------------------===//
#include "pipec_rt.h"

#include "cpu/real.h"

#include <cmath>

namespace {
template <class T> T scalarR(const void *p) {
  return *static_cast<const T *>(p);
}
int64_t scalarI(const void *p) { return *static_cast<const int64_t *>(p); }

template <class T>
void momentumKernel(void *const *bufs, const int64_t *ints,
                    const double *reals) {
  const T r = scalarR<T>(bufs[0]);
  const int64_t t = scalarI(bufs[1]);
  const T *x = static_cast<const T *>(bufs[2]);
  const T *g = static_cast<const T *>(bufs[3]);
  const T *v = static_cast<const T *>(bufs[4]);
  T *xNew = static_cast<T *>(bufs[5]);
  T *vNew = static_cast<T *>(bufs[6]);
  const int64_t n = ints[0];
  const bool nesterov = ints[1] != 0;
  const T alpha = T(reals[0]);
  // beta' = T > 0 ? beta : 1 (the first update takes the whole gradient).
  const T beta = t > 0 ? T(reals[1]) : T(1);
  const T norm = T(reals[2]);
  for (int64_t i = 0; i < n; ++i) {
    T gReg = norm * x[i] + g[i];       // G' = norm_coefficient X + G
    T vi = alpha * v[i] + beta * gReg; // V_new = alpha V + beta' G'
    T xi = nesterov ? x[i] - r * (gReg + alpha * vi) : x[i] - r * vi;
    vNew[i] = vi;
    xNew[i] = xi;
  }
}

template <class T>
void adamKernel(void *const *bufs, const int64_t *ints, const double *reals) {
  const T r = scalarR<T>(bufs[0]);
  const int64_t t = scalarI(bufs[1]);
  const T *x = static_cast<const T *>(bufs[2]);
  const T *g = static_cast<const T *>(bufs[3]);
  const T *v = static_cast<const T *>(bufs[4]);
  const T *h = static_cast<const T *>(bufs[5]);
  T *xNew = static_cast<T *>(bufs[6]);
  T *vNew = static_cast<T *>(bufs[7]);
  T *hNew = static_cast<T *>(bufs[8]);
  const int64_t n = ints[0];
  const double alpha = reals[0], beta = reals[1];
  const T norm = T(reals[2]), normPost = T(reals[3]);
  const T eps = T(reals[4]);
  // R' = T > 0 ? R sqrt(1 - beta^T) / (1 - alpha^T) : R.
  const T rAdj = t > 0 ? T(r * std::sqrt(1 - std::pow(beta, double(t))) /
                           (1 - std::pow(alpha, double(t))))
                       : r;
  const T a = T(alpha), b = T(beta);
  for (int64_t i = 0; i < n; ++i) {
    T gReg = norm * x[i] + g[i];
    T vi = a * v[i] + (1 - a) * gReg;
    T hi = b * h[i] + (1 - b) * gReg * gReg;
    T xi = x[i] - rAdj * vi / (std::sqrt(hi) + eps);
    vNew[i] = vi;
    hNew[i] = hi;
    xNew[i] = (1 - normPost) * xi;
  }
}

template <class T>
void adagradKernel(void *const *bufs, const int64_t *ints,
                   const double *reals) {
  const T r = scalarR<T>(bufs[0]);
  const int64_t t = scalarI(bufs[1]);
  const T *x = static_cast<const T *>(bufs[2]);
  const T *g = static_cast<const T *>(bufs[3]);
  const T *h = static_cast<const T *>(bufs[4]);
  T *xNew = static_cast<T *>(bufs[5]);
  T *hNew = static_cast<T *>(bufs[6]);
  const int64_t n = ints[0];
  const T decay = T(reals[0]), eps = T(reals[1]);
  const T norm = T(reals[2]);
  const T rt = r / (1 + T(t) * decay); // r = R / (1 + T decay_factor)
  for (int64_t i = 0; i < n; ++i) {
    T gReg = norm * x[i] + g[i];
    T hi = h[i] + gReg * gReg;
    xNew[i] = x[i] - rt * gReg / (std::sqrt(hi) + eps);
    hNew[i] = hi;
  }
}

} // namespace

PIPEC_CPU_KERNEL(pipec_k_momentum, momentumKernel)
PIPEC_CPU_KERNEL(pipec_k_adam, adamKernel)
PIPEC_CPU_KERNEL(pipec_k_adagrad, adagradKernel)
