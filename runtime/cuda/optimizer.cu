//===- optimizer.cu - SGD and ONNX Momentum, Adam, Adagrad ----------------===//
//
// Part of pipec's CUDA runtime. CUDA twins of pipec_k_sgd, pipec_k_momentum,
// pipec_k_adam and pipec_k_adagrad (see include/pipec_rt.h for the parameter
// layouts, cpu/elementwise.cpp and cpu/optimizer.cpp for the reference).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The update formulas of ai.onnx.preview.training (opset 1), computed in
/// float per element with the scalar coefficients as the CPU computes them
/// (Adam's bias-corrected rate in double, rounded to float). The learning
/// rate R (one float) and the update count T (one int64, the number of
/// updates already made) live in device memory (the arena, written by the
/// runtime on the stream), so every kernel reads them itself; nothing is
/// read back to the host.
///
/// Each element is read and written by one thread, the inputs before the
/// outputs, so every output may alias its input (Xnew == X, Vnew == V, ...).
/// Float products and sums use explicit round-to-nearest intrinsics so that
/// the compiler cannot contract them into FMAs (the CPU build has none), and
/// division and square root are the IEEE ones whatever the build flags.
///
//===----------------------------------------------------------------------===//

#include "cuda_rt.h"
#include "pipec_rt.h"

#include <cstdint>

namespace pipec {
namespace cuda {
namespace {

#define GRID_STRIDE(i, n)                                                      \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);    \
       i += int64_t(gridDim.x) * blockDim.x)

__device__ inline float add(float a, float b) { return __fadd_rn(a, b); }
__device__ inline float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ inline float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ inline float div(float a, float b) { return __fdiv_rn(a, b); }

/// Wout = W - lr * G.
__global__ void sgdKernel(const float *w, const float *g, const float *lrPtr,
                          float *wOut, int64_t n) {
  const float lr = *lrPtr;
  GRID_STRIDE(i, n) { wOut[i] = sub(w[i], mul(lr, g[i])); }
}

/// G' = norm X + G; V_new = alpha V + beta' G' (beta' = T > 0 ? beta : 1);
/// X_new = X - R (G' + alpha V_new) (Nesterov) or X - R V_new.
__global__ void momentumKernel(const float *rPtr, const int64_t *tPtr,
                               const float *x, const float *g, const float *v,
                               float *xNew, float *vNew, int64_t n,
                               bool nesterov, float alpha, float betaIn,
                               float norm) {
  const float r = *rPtr;
  const float beta = *tPtr > 0 ? betaIn : 1.0f;
  GRID_STRIDE(i, n) {
    const float xi = x[i];
    const float gReg = add(mul(norm, xi), g[i]);
    const float vi = add(mul(alpha, v[i]), mul(beta, gReg));
    const float step = nesterov ? add(gReg, mul(alpha, vi)) : vi;
    vNew[i] = vi;
    xNew[i] = sub(xi, mul(r, step));
  }
}

/// G' = norm X + G; V_new = alpha V + (1 - alpha) G';
/// H_new = beta H + (1 - beta) G'^2;
/// X_new = (1 - normPost) (X - R' V_new / (sqrt(H_new) + eps)) with
/// R' = T > 0 ? R sqrt(1 - beta^T) / (1 - alpha^T) : R (in double).
__global__ void adamKernel(const float *rPtr, const int64_t *tPtr,
                           const float *x, const float *g, const float *v,
                           const float *h, float *xNew, float *vNew,
                           float *hNew, int64_t n, double alphaD, double betaD,
                           float norm, float normPost, float eps) {
  const float r = *rPtr;
  const int64_t t = *tPtr;
  const float rAdj = t > 0 ? float(double(r) * sqrt(1 - pow(betaD, double(t))) /
                                   (1 - pow(alphaD, double(t))))
                           : r;
  const float a = float(alphaD), b = float(betaD);
  const float oneMinusA = sub(1.0f, a), oneMinusB = sub(1.0f, b);
  const float keep = sub(1.0f, normPost);
  GRID_STRIDE(i, n) {
    const float xi = x[i];
    const float gReg = add(mul(norm, xi), g[i]);
    const float vi = add(mul(a, v[i]), mul(oneMinusA, gReg));
    const float hi = add(mul(b, h[i]), mul(mul(oneMinusB, gReg), gReg));
    const float upd = sub(xi, div(mul(rAdj, vi), add(__fsqrt_rn(hi), eps)));
    vNew[i] = vi;
    hNew[i] = hi;
    xNew[i] = mul(keep, upd);
  }
}

/// G' = norm X + G; H_new = H + G'^2;
/// X_new = X - r G' / (sqrt(H_new) + eps), r = R / (1 + T decay).
__global__ void adagradKernel(const float *rPtr, const int64_t *tPtr,
                              const float *x, const float *g, const float *h,
                              float *xNew, float *hNew, int64_t n, float decay,
                              float eps, float norm) {
  const float rt = div(*rPtr, add(1.0f, mul(float(*tPtr), decay)));
  GRID_STRIDE(i, n) {
    const float xi = x[i];
    const float gReg = add(mul(norm, xi), g[i]);
    const float hi = add(h[i], mul(gReg, gReg));
    xNew[i] = sub(xi, div(mul(rt, gReg), add(__fsqrt_rn(hi), eps)));
    hNew[i] = hi;
  }
}

#undef GRID_STRIDE

} // namespace
} // namespace cuda
} // namespace pipec

using namespace pipec::cuda;

extern "C" void pipec_cuda_k_sgd(pipec_kctx *kc, void *const *bufs,
                                 const int64_t *ints, const double *) {
  Context &ctx = context(kc, "pipec_cuda_k_sgd");
  const int64_t n = ints[0];
  if (n <= 0)
    return;
  sgdKernel<<<gridFor(n), 256, 0, ctx.stream>>>(
      static_cast<const float *>(bufs[0]), static_cast<const float *>(bufs[1]),
      static_cast<const float *>(bufs[2]), static_cast<float *>(bufs[3]), n);
  checkLaunch("pipec_cuda_k_sgd");
}

extern "C" void pipec_cuda_k_momentum(pipec_kctx *kc, void *const *bufs,
                                      const int64_t *ints,
                                      const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_momentum");
  const int64_t n = ints[0];
  if (n <= 0)
    return;
  momentumKernel<<<gridFor(n), 256, 0, ctx.stream>>>(
      static_cast<const float *>(bufs[0]),
      static_cast<const int64_t *>(bufs[1]),
      static_cast<const float *>(bufs[2]), static_cast<const float *>(bufs[3]),
      static_cast<const float *>(bufs[4]), static_cast<float *>(bufs[5]),
      static_cast<float *>(bufs[6]), n, ints[1] != 0, float(reals[0]),
      float(reals[1]), float(reals[2]));
  checkLaunch("pipec_cuda_k_momentum");
}

extern "C" void pipec_cuda_k_adam(pipec_kctx *kc, void *const *bufs,
                                  const int64_t *ints, const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_adam");
  const int64_t n = ints[0];
  if (n <= 0)
    return;
  adamKernel<<<gridFor(n), 256, 0, ctx.stream>>>(
      static_cast<const float *>(bufs[0]),
      static_cast<const int64_t *>(bufs[1]),
      static_cast<const float *>(bufs[2]), static_cast<const float *>(bufs[3]),
      static_cast<const float *>(bufs[4]), static_cast<const float *>(bufs[5]),
      static_cast<float *>(bufs[6]), static_cast<float *>(bufs[7]),
      static_cast<float *>(bufs[8]), n, reals[0], reals[1], float(reals[2]),
      float(reals[3]), float(reals[4]));
  checkLaunch("pipec_cuda_k_adam");
}

extern "C" void pipec_cuda_k_adagrad(pipec_kctx *kc, void *const *bufs,
                                     const int64_t *ints, const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_adagrad");
  const int64_t n = ints[0];
  if (n <= 0)
    return;
  adagradKernel<<<gridFor(n), 256, 0, ctx.stream>>>(
      static_cast<const float *>(bufs[0]),
      static_cast<const int64_t *>(bufs[1]),
      static_cast<const float *>(bufs[2]), static_cast<const float *>(bufs[3]),
      static_cast<const float *>(bufs[4]), static_cast<float *>(bufs[5]),
      static_cast<float *>(bufs[6]), n, float(reals[0]), float(reals[1]),
      float(reals[2]));
  checkLaunch("pipec_cuda_k_adagrad");
}
