//===- unary.cpp - Elementwise unary kernels and their backward -----------===//
//
// Part of pipec. CPU kernels behind pipec_k_unary and pipec_k_unary_grad (see
// include/pipec_rt.h for the parameter layouts).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// One plain loop per opcode so that each vectorises on its own. The
/// transcendental functions that dominate transformer activations are
/// branch-free rational / polynomial approximations accurate to a few ulp
/// (libm's scalar calls keep a loop from vectorising): tanh (TANH,
/// GELU_TANH), erf (ERF, GELU: 4.2e-7 absolute) and exp in the ERF / GELU
/// backward (8e-8 relative). EXP, SIGMOID and LOG keep libm.
///
/// Both kernels are templates over the element type (float, or double for
/// the `_f64` twins, see cpu/real.h). The double instantiations compute in
/// double throughout and use the exact std::tanh / std::erf / std::exp
/// instead of the approximations above.
///
/// Parameters (reals = [alpha, beta]):
///  - SCALE uses alpha; LEAKY_RELU uses alpha as the negative slope;
///    POW_SCALAR computes X^alpha; CLIP clamps to [alpha, beta].
///  - reals == NULL reads as alpha = beta = 0, except that SCALE keeps its
///    historical default alpha = 1 and CLIP defaults to (-inf, +inf). A NaN
///    CLIP bound is treated as absent (ONNX's optional min / max inputs), so
///    the compiler may pass NaN for a missing bound.
///
/// Conventions at the points where a derivative does not exist (all chosen
/// so that a kernel never produces NaN from a finite dY at those points):
///  - RELU, LEAKY_RELU: x == 0 takes the left branch (0, resp. alpha), as
///    the existing RELU did.
///  - ABS: sign(0) = 0.
///  - CLIP: the gradient passes only strictly inside, min < x < max; at a
///    bound it is 0 (a valid subgradient; consistent with RELU at 0, and
///    with min == max giving a zero gradient for a constant output). NaN x
///    gives 0.
///  - POW_SCALAR: alpha == 0 gives dX = 0 everywhere (also at x == 0, where
///    alpha * x^(alpha-1) would be 0 * inf).
///  - LOG, SQRT, RECIPROCAL follow IEEE arithmetic (inf / NaN at 0 or for
///    negative x), like the forward.
///
/// Following the header, the backward reads the forward output Y for TANH,
/// SIGMOID, EXP, SQRT and RECIPROCAL (their derivatives are cheapest from
/// Y) and the forward input X for every other opcode.
///
/// Unknown opcodes poison the output with NaN (cpu/strided.h explains why).
///
//===----------------------------------------------------------------------===//

#include "cpu/fastmath.h"
#include "pipec_rt.h"

#include "cpu/real.h"
#include "cpu/strided.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

using namespace pipec::rt;
using pipec::cpu::blend;
using pipec::cpu::clampBlend;
using pipec::cpu::kernelExp;

namespace {

/// tanh for float as the odd rational function p(x) / q(x) of degrees 13
/// and 6 on [-7.905, 7.905] (clamped outside, where tanh rounds to +-1), the
/// approximation Eigen uses for its vectorised tanh. Measured against double
/// tanh on a dense grid over [-12, 12]: max relative error 4e-7 (a few ulp).
/// Unlike libm's tanhf it has no branches, so the loop vectorises (3-4x
/// faster). Tiny |x| returns x; NaN propagates.
inline float rationalTanh(float x) {
  const float clamp = 7.90531110763549805f;
  float xc = clampBlend(x, -clamp, clamp);
  float x2 = xc * xc;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  p = p * xc;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  return blend(std::fabs(x) < 0.0004f, x, p / q);
}

/// erf for float as the odd rational function p(x) / q(x) of degrees 13
/// and 8 on [-4, 4] (clamped outside, where erf rounds to +-1), the
/// approximation Eigen uses for its vectorised erf. Measured against double
/// erf on a grid of step 1e-5 over [-10, 10]: max absolute error 4.2e-7
/// (libm's erff: 5e-8), exact 0 at 0, NaN propagates. Branch-free, so the
/// loops vectorise; libm's erff is a scalar call (about 5x slower here).
inline float rationalErf(float a) {
  const float x = clampBlend(a, -4.0f, 4.0f);
  const float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  p = p * x;
  float q = -1.45660718464996e-05f;
  q = q * x2 + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  return p / q;
}

/// tanh and erf of the kernels: the rational approximations above for
/// float, the exact libm functions for double.
inline float kernelTanh(float x) { return rationalTanh(x); }
inline double kernelTanh(double x) { return std::tanh(x); }
inline float kernelErf(float x) { return rationalErf(x); }
inline double kernelErf(double x) { return std::erf(x); }

template <class T> constexpr T kSqrtHalf = T(0.70710678118654752); // 1/sqrt 2
template <class T>
constexpr T kTwoOverSqrtPi = T(1.1283791670955126); // 2 / sqrt(pi)
template <class T>
constexpr T kInvSqrt2Pi = T(0.3989422804014327); // 1 / sqrt(2 pi)
template <class T>
constexpr T kSqrt2OverPi = T(0.7978845608028654); // sqrt(2 / pi)
template <class T> constexpr T kGeluCubic = T(0.044715);
// The float constants are exactly the float literals they always were.
static_assert(kSqrtHalf<float> == 0.70710678118654752f, "");
static_assert(kTwoOverSqrtPi<float> == 1.1283791670955126f, "");
static_assert(kInvSqrt2Pi<float> == 0.3989422804014327f, "");
static_assert(kSqrt2OverPi<float> == 0.7978845608028654f, "");
static_assert(kGeluCubic<float> == 0.044715f, "");

/// The parameters of one call, with the defaults documented above.
template <class T> struct UnaryParams {
  T alpha, beta;
  UnaryParams(int64_t opcode, const double *reals) {
    if (opcode == PIPEC_UN_CLIP) {
      const T inf = std::numeric_limits<T>::infinity();
      alpha = -inf;
      beta = inf;
      if (reals && !std::isnan(reals[0]))
        alpha = T(reals[0]);
      if (reals && !std::isnan(reals[1]))
        beta = T(reals[1]);
      return;
    }
    alpha = reals ? T(reals[0]) : (opcode == PIPEC_UN_SCALE ? T(1) : T(0));
    // Only CLIP reads beta: callers of the other opcodes may pass a
    // one-element block (as ABI users did before beta existed).
    beta = T(0);
  }
};

/// y = x^alpha with exact shortcuts for the common integer exponents.
template <class T> void powScalar(const T *x, T *y, int64_t n, T alpha) {
  if (alpha == T(1)) {
    if (x != y)
      std::memmove(y, x, sizeof(T) * size_t(n));
  } else if (alpha == T(2)) {
    for (int64_t i = 0; i < n; ++i)
      y[i] = x[i] * x[i];
  } else if (alpha == T(3)) {
    for (int64_t i = 0; i < n; ++i)
      y[i] = x[i] * x[i] * x[i];
  } else {
    for (int64_t i = 0; i < n; ++i)
      y[i] = std::pow(x[i], alpha);
  }
}

template <class T>
void unaryKernel(void *const *bufs, const int64_t *ints, const double *reals) {
  const T *x = static_cast<const T *>(bufs[0]);
  T *y = static_cast<T *>(bufs[1]);
  int64_t opcode = ints[0], n = ints[1];
  if (n <= 0)
    return;
  const UnaryParams<T> p(opcode, reals);
  switch (opcode) {
  case PIPEC_UN_COPY:
    if (x != y)
      std::memmove(y, x, sizeof(T) * size_t(n));
    break;
  case PIPEC_UN_RELU:
    // std::max(x, 0) keeps a NaN input NaN (unlike x > 0 ? x : 0).
    for (int64_t i = 0; i < n; ++i)
      y[i] = std::max(x[i], T(0));
    break;
  case PIPEC_UN_TANH:
    for (int64_t i = 0; i < n; ++i)
      y[i] = kernelTanh(x[i]);
    break;
  case PIPEC_UN_SIGMOID:
    // exp(-x) overflows to +inf for very negative x, giving exactly 0.
    for (int64_t i = 0; i < n; ++i)
      y[i] = T(1) / (T(1) + std::exp(-x[i]));
    break;
  case PIPEC_UN_NEG:
    for (int64_t i = 0; i < n; ++i)
      y[i] = -x[i];
    break;
  case PIPEC_UN_SCALE:
    for (int64_t i = 0; i < n; ++i)
      y[i] = p.alpha * x[i];
    break;
  case PIPEC_UN_EXP:
    for (int64_t i = 0; i < n; ++i)
      y[i] = std::exp(x[i]);
    break;
  case PIPEC_UN_ERF:
    for (int64_t i = 0; i < n; ++i)
      y[i] = kernelErf(x[i]);
    break;
  case PIPEC_UN_GELU: // x/2 (1 + erf(x / sqrt 2))
    for (int64_t i = 0; i < n; ++i)
      y[i] = T(0.5) * x[i] * (T(1) + kernelErf(x[i] * kSqrtHalf<T>));
    break;
  case PIPEC_UN_GELU_TANH: // x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    for (int64_t i = 0; i < n; ++i) {
      T v = x[i];
      T u = kSqrt2OverPi<T> * (v + kGeluCubic<T> * v * v * v);
      y[i] = T(0.5) * v * (T(1) + kernelTanh(u));
    }
    break;
  case PIPEC_UN_SQRT:
    for (int64_t i = 0; i < n; ++i)
      y[i] = std::sqrt(x[i]);
    break;
  case PIPEC_UN_LOG:
    for (int64_t i = 0; i < n; ++i)
      y[i] = std::log(x[i]);
    break;
  case PIPEC_UN_LEAKY_RELU:
    for (int64_t i = 0; i < n; ++i)
      y[i] = std::max(x[i], T(0)) + p.alpha * std::min(x[i], T(0)); // NaN: NaN
    break;
  case PIPEC_UN_CLIP:
    // max-then-min (numpy.clip): NaN stays NaN; min > max gives max.
    for (int64_t i = 0; i < n; ++i)
      y[i] = std::min(std::max(x[i], p.alpha), p.beta);
    break;
  case PIPEC_UN_POW_SCALAR:
    powScalar(x, y, n, p.alpha);
    break;
  case PIPEC_UN_ABS:
    for (int64_t i = 0; i < n; ++i)
      y[i] = std::fabs(x[i]);
    break;
  case PIPEC_UN_RECIPROCAL:
    for (int64_t i = 0; i < n; ++i)
      y[i] = T(1) / x[i];
    break;
  default:
    poison(y, n);
    break;
  }
}

template <class T>
void unaryGradKernel(void *const *bufs, const int64_t *ints,
                     const double *reals) {
  const T *t = static_cast<const T *>(bufs[0]);
  const T *dy = static_cast<const T *>(bufs[1]);
  T *dx = static_cast<T *>(bufs[2]);
  int64_t opcode = ints[0], n = ints[1];
  if (n <= 0)
    return;
  const UnaryParams<T> p(opcode, reals);
  // Every loop reads t[i] and dy[i] before writing dx[i], so dX may alias dY.
  switch (opcode) {
  case PIPEC_UN_RELU: // T = X.
    for (int64_t i = 0; i < n; ++i) {
      const T v = t[i], g = dy[i]; // unconditional loads vectorise
      dx[i] = v > T(0) ? g : T(0);
    }
    break;
  case PIPEC_UN_TANH: // T = Y; tanh' = 1 - Y^2.
    for (int64_t i = 0; i < n; ++i)
      dx[i] = dy[i] * (T(1) - t[i] * t[i]);
    break;
  case PIPEC_UN_SIGMOID: // T = Y; sigmoid' = Y (1 - Y).
    for (int64_t i = 0; i < n; ++i)
      dx[i] = dy[i] * (t[i] * (T(1) - t[i]));
    break;
  case PIPEC_UN_COPY:
    if (dx != dy)
      std::memmove(dx, dy, sizeof(T) * size_t(n));
    break;
  case PIPEC_UN_NEG:
    for (int64_t i = 0; i < n; ++i)
      dx[i] = -dy[i];
    break;
  case PIPEC_UN_SCALE:
    for (int64_t i = 0; i < n; ++i)
      dx[i] = p.alpha * dy[i];
    break;
  case PIPEC_UN_EXP: // T = Y; exp' = Y.
    for (int64_t i = 0; i < n; ++i)
      dx[i] = dy[i] * t[i];
    break;
  case PIPEC_UN_ERF: // T = X; erf' = 2/sqrt(pi) exp(-x^2).
    for (int64_t i = 0; i < n; ++i)
      dx[i] = dy[i] * (kTwoOverSqrtPi<T> * kernelExp(-t[i] * t[i]));
    break;
  case PIPEC_UN_GELU: // T = X; gelu' = Phi(x) + x phi(x).
    for (int64_t i = 0; i < n; ++i) {
      T v = t[i];
      T cdf = T(0.5) * (T(1) + kernelErf(v * kSqrtHalf<T>));
      T pdf = kInvSqrt2Pi<T> * kernelExp(-T(0.5) * v * v);
      dx[i] = dy[i] * (cdf + v * pdf);
    }
    break;
  case PIPEC_UN_GELU_TANH: // T = X.
    // y = x/2 (1 + th), th = tanh(u), u = sqrt(2/pi) (x + c x^3):
    // y' = (1 + th)/2 + x/2 (1 - th^2) sqrt(2/pi) (1 + 3 c x^2).
    for (int64_t i = 0; i < n; ++i) {
      T v = t[i];
      T v2 = v * v;
      T th = kernelTanh(kSqrt2OverPi<T> * (v + kGeluCubic<T> * v2 * v));
      T du = kSqrt2OverPi<T> * (T(1) + T(3) * kGeluCubic<T> * v2);
      dx[i] =
          dy[i] * (T(0.5) * (T(1) + th) + T(0.5) * v * (T(1) - th * th) * du);
    }
    break;
  case PIPEC_UN_SQRT: // T = Y; sqrt' = 1 / (2 Y).
    for (int64_t i = 0; i < n; ++i)
      dx[i] = dy[i] * T(0.5) / t[i];
    break;
  case PIPEC_UN_LOG: // T = X; log' = 1 / x.
    for (int64_t i = 0; i < n; ++i)
      dx[i] = dy[i] / t[i];
    break;
  case PIPEC_UN_LEAKY_RELU: // T = X.
    for (int64_t i = 0; i < n; ++i) {
      const T g = dy[i];
      dx[i] = blend(t[i] > T(0), g, p.alpha * g);
    }
    break;
  case PIPEC_UN_CLIP: // T = X; passes strictly inside (min, max).
    for (int64_t i = 0; i < n; ++i) {
      const T v = t[i], g = dy[i];
      dx[i] = blend((v > p.alpha) & (v < p.beta), g, T(0));
    }
    break;
  case PIPEC_UN_POW_SCALAR: { // T = X; (x^a)' = a x^(a-1).
    const T a = p.alpha;
    if (a == T(0)) {
      std::fill(dx, dx + n, T(0));
    } else if (a == T(1)) {
      if (dx != dy)
        std::memmove(dx, dy, sizeof(T) * size_t(n));
    } else if (a == T(2)) {
      for (int64_t i = 0; i < n; ++i)
        dx[i] = dy[i] * (T(2) * t[i]);
    } else if (a == T(3)) {
      for (int64_t i = 0; i < n; ++i)
        dx[i] = dy[i] * (T(3) * t[i] * t[i]);
    } else {
      for (int64_t i = 0; i < n; ++i)
        dx[i] = dy[i] * (a * std::pow(t[i], a - T(1)));
    }
    break;
  }
  case PIPEC_UN_ABS: // T = X; sign(x), sign(0) = 0.
    for (int64_t i = 0; i < n; ++i) {
      const T v = t[i], g = dy[i];
      dx[i] = blend(v > T(0), g, blend(v < T(0), -g, T(0)));
    }
    break;
  case PIPEC_UN_RECIPROCAL: // T = Y; (1/x)' = -1/x^2 = -Y^2.
    for (int64_t i = 0; i < n; ++i)
      dx[i] = -dy[i] * (t[i] * t[i]);
    break;
  default:
    poison(dx, n);
    break;
  }
}

} // namespace

PIPEC_CPU_KERNEL(pipec_k_unary, unaryKernel)
PIPEC_CPU_KERNEL(pipec_k_unary_grad, unaryGradKernel)
