//===- matmul_bf16.cpp - Float32 GEMM, optionally on bfloat16 operands ----===//
//
// Part of pipec's CPU runtime. See blasGemm in cpu/real.h.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `--precision bf16` on the CPU target emulates the CUDA target's matrix
/// products: each operand is rounded to bfloat16 (round to nearest, ties to
/// even, NaN kept) into a copy kept in the
/// kernel context, then OpenBLAS multiplies the
/// copies in float32. The product of two bfloat16 values has at most 16
/// significant bits, so every product is exact in float32 and only the
/// order of the float32 sums differs from the GPU's. Every matrix product
/// of the kernels (gemm, batch_matmul, the convolutions' im2col GEMMs) goes
/// through here; a GEMM too large for a 32-bit BLAS interface uses
/// gemm.cpp's loop nest, which does not round (no model here has one).
///
//===----------------------------------------------------------------------===//

#include "cpu/real.h"

#include <cstdint>
#include <cstring>
#include <vector>

namespace pipec {
namespace cpu {

namespace {

/// x rounded to the nearest bfloat16 (ties to even), as a float; a NaN
/// stays a (quiet) NaN.
float roundToBf16(float x) { return fromBf16Bits(bf16Bits(x)); }

/// The rows x cols matrix at `x` (leading dimension ld) rounded into
/// `out` (leading dimension cols).
void roundMatrix(const float *x, blasint rows, blasint cols, blasint ld,
                 std::vector<float> &out) {
  out.resize(size_t(rows) * size_t(cols));
  for (blasint r = 0; r < rows; ++r)
    for (blasint c = 0; c < cols; ++c)
      out[size_t(r) * size_t(cols) + size_t(c)] =
          roundToBf16(x[size_t(r) * size_t(ld) + size_t(c)]);
}

} // namespace

void blasGemm(KernelContext &kc, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb,
              blasint m, blasint n, blasint k, float alpha, const float *a,
              blasint lda, const float *b, blasint ldb, float beta, float *c,
              blasint ldc) {
  if (!kc.matmulBf16 || m <= 0 || n <= 0 || k <= 0) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c,
                ldc);
    return;
  }
  // Row-major storage: A is m x k (k x m transposed), B k x n (n x k).
  const bool tA = ta != CblasNoTrans, tB = tb != CblasNoTrans;
  roundMatrix(a, tA ? k : m, tA ? m : k, lda, kc.bf16A);
  roundMatrix(b, tB ? n : k, tB ? k : n, ldb, kc.bf16B);
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, kc.bf16A.data(),
              tA ? m : k, kc.bf16B.data(), tB ? k : n, beta, c, ldc);
}

} // namespace cpu
} // namespace pipec
