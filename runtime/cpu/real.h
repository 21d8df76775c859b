//===- real.h - Element-type helpers of the CPU kernels ---------*- C++ -*-===//
//
// Part of pipec. Shared by the CPU kernels only (not part of the C ABI).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Every float kernel is a template over its element type `T` (float or
/// double) and is exported twice through PIPEC_CPU_KERNEL: `pipec_k_X` on
/// float32 tensors and `pipec_k_X_f64` on float64 tensors with the same
/// parameter layout (include/pipec_kernels.def lists them). The float64
/// twins are what `pipec compile --precision f64` links against: an exact
/// reference mode in which pipec can be compared with a float64 framework
/// to 1e-9 and with finite differences.
///
/// Rules for the float64 twins: everything is computed in double (no float
/// intermediate, no float-only approximation such as polyExp), BLAS calls
/// go to the d-prefixed routines, and accumulations that the float kernels
/// already carry in double stay in double.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CPU_REAL_H
#define PIPEC_RUNTIME_CPU_REAL_H

#include "cpu/kernel_context.h"

#include <cblas.h>

#include <cstdint>
#include <cstring>

/// Defines the two C entry points `sym` (float) and `sym##_f64` (double) of
/// the kernel template `impl<T>(bufs, ints, reals)`, which needs nothing
/// from the kernel context.
#define PIPEC_CPU_KERNEL(sym, impl)                                            \
  extern "C" void sym(pipec_kctx *, void *const *bufs, const int64_t *ints,    \
                      const double *reals) {                                   \
    impl<float>(bufs, ints, reals);                                            \
  }                                                                            \
  extern "C" void sym##_f64(pipec_kctx *, void *const *bufs,                   \
                            const int64_t *ints, const double *reals) {        \
    impl<double>(bufs, ints, reals);                                           \
  }

/// The same for a kernel template that works in the stage's CPU kernel
/// context: `impl<T>(cpu::KernelContext &, bufs, ints, reals)`.
#define PIPEC_CPU_KERNEL_CTX(sym, impl)                                        \
  extern "C" void sym(pipec_kctx *kc, void *const *bufs, const int64_t *ints,  \
                      const double *reals) {                                   \
    impl<float>(pipec::cpu::kernelContext(kc, #sym), bufs, ints, reals);       \
  }                                                                            \
  extern "C" void sym##_f64(pipec_kctx *kc, void *const *bufs,                 \
                            const int64_t *ints, const double *reals) {        \
    impl<double>(pipec::cpu::kernelContext(kc, #sym "_f64"), bufs, ints,       \
                 reals);                                                       \
  }

namespace pipec {
namespace cpu {

/// Row-major BLAS GEMM, C = alpha op(A) op(B) + beta C, for either type.
/// With kc.matmulBf16, the float32 one first rounds every element of A and
/// B to the nearest bfloat16 (ties to even) in a copy: a product of two
/// such values is exact in float32, so the result is the CUDA target's
/// bf16 arithmetic (bfloat16 operands, float32 accumulation) up to the
/// order of the sums (cpu/matmul_bf16.cpp).
void blasGemm(KernelContext &kc, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb,
              blasint m, blasint n, blasint k, float alpha, const float *a,
              blasint lda, const float *b, blasint ldb, float beta, float *c,
              blasint ldc);
inline void blasGemm(KernelContext &, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb,
                     blasint m, blasint n, blasint k, double alpha,
                     const double *a, blasint lda, const double *b, blasint ldb,
                     double beta, double *c, blasint ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c,
              ldc);
}

/// The bits of the bfloat16 nearest to x (ties to even); a NaN stays a
/// quiet NaN with its sign and the top of its payload.
inline uint16_t bf16Bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) != 0)
    bits |= 0x00400000u; // NaN: quiet, payload kept
  else
    bits += 0x7FFFu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

/// The float32 value of bfloat16 bits (exact).
inline float fromBf16Bits(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float y;
  std::memcpy(&y, &bits, sizeof y);
  return y;
}

} // namespace cpu
} // namespace pipec

#endif // PIPEC_RUNTIME_CPU_REAL_H
