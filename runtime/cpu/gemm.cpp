//===- gemm.cpp - GEMM and batched matmul kernels -------------------------===//
//
// Part of pipec. CPU kernels behind pipec_k_gemm and pipec_k_batch_matmul
// (see include/pipec_rt.h for the parameter layouts).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Both kernels hand the matrix products to OpenBLAS (`cblas_sgemm`, or
/// `cblas_dgemm` for the float64 twins). The bias
/// term of Gemm is materialised into Y first (broadcast through its strides
/// and scaled by beta), then the GEMM accumulates alpha * op(A) * op(B) into it
/// with beta = 1. Degenerate sizes are handled before calling BLAS: an empty
/// Y is a no-op and K == 0 leaves just the bias (or zeros).
///
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"

#include "cpu/real.h"
#include "cpu/strided.h"

#include <climits>
#include <cstring>

using namespace pipec::rt;
using pipec::cpu::blasGemm;

namespace {

/// Whether every BLAS dimension and leading dimension fits a `blasint`.
bool fitsBlas(int64_t m, int64_t n, int64_t k) {
  const int64_t limit = INT_MAX;
  return m <= limit && n <= limit && k <= limit;
}

/// Y[MxN] (+)= alpha * op(A) * op(B) for one matrix; `accumulate` selects
/// beta = 1 (Y already holds the bias) or beta = 0. `lda` / `ldb`: the
/// stride between the rows of A's and B's stored (row-major) matrices, 0
/// when they are dense. Requires M, N, K > 0.
template <class T>
void gemm(pipec::cpu::KernelContext &kc, const T *a, const T *b, T *y,
          int64_t m, int64_t n, int64_t k, bool transA, bool transB, T alpha,
          bool accumulate, int64_t lda = 0, int64_t ldb = 0) {
  if (lda == 0)
    lda = transA ? m : k;
  if (ldb == 0)
    ldb = transB ? k : n;
  if (fitsBlas(m, n, k) && lda <= INT_MAX && ldb <= INT_MAX) {
    blasGemm(kc, transA ? CblasTrans : CblasNoTrans,
             transB ? CblasTrans : CblasNoTrans, blasint(m), blasint(n),
             blasint(k), alpha, a, blasint(lda), b, blasint(ldb),
             T(accumulate ? 1 : 0), y, blasint(n));
    return;
  }
  // Beyond a 32-bit BLAS interface: a plain (slow but correct) loop nest.
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p)
        acc += double(transA ? a[p * lda + i] : a[i * lda + p]) *
               double(transB ? b[j * ldb + p] : b[p * ldb + j]);
      T v = T(alpha * acc);
      y[i * n + j] = accumulate ? y[i * n + j] + v : v;
    }
  }
}

template <class T>
void gemmKernel(pipec::cpu::KernelContext &kc, void *const *bufs,
                const int64_t *ints, const double *reals) {
  const T *a = static_cast<const T *>(bufs[0]);
  const T *b = static_cast<const T *>(bufs[1]);
  const T *c = static_cast<const T *>(bufs[2]);
  T *y = static_cast<T *>(bufs[3]);
  int64_t m = ints[0], n = ints[1], k = ints[2];
  bool transA = ints[3] != 0, transB = ints[4] != 0;
  bool hasC = ints[5] != 0 && c != nullptr;
  int64_t cStrideM = ints[6], cStrideN = ints[7];
  T alpha = reals ? T(reals[0]) : T(1);
  T beta = reals ? T(reals[1]) : T(1);
  if (m <= 0 || n <= 0)
    return;

  // Following BLAS, beta == 0 means "ignore C" (so a NaN in C does not leak).
  bool useC = hasC && beta != T(0);
  if (useC) {
    // Y = beta * C, C broadcast through its strides. Reading C[i, j] before
    // writing Y[i, j] keeps an exact in-place C == Y (strides N, 1) valid.
    for (int64_t i = 0; i < m; ++i) {
      const T *cRow = c + i * cStrideM;
      T *yRow = y + i * n;
      if (cStrideN == 1) {
        for (int64_t j = 0; j < n; ++j)
          yRow[j] = beta * cRow[j];
      } else if (cStrideN == 0) {
        T v = beta * cRow[0];
        for (int64_t j = 0; j < n; ++j)
          yRow[j] = v;
      } else {
        for (int64_t j = 0; j < n; ++j)
          yRow[j] = beta * cRow[j * cStrideN];
      }
    }
  }
  if (k <= 0 || alpha == T(0)) {
    // op(A) * op(B) is the zero matrix.
    if (!useC)
      std::memset(y, 0, sizeof(T) * size_t(m * n));
    return;
  }
  gemm(kc, a, b, y, m, n, k, transA, transB, alpha, /*accumulate=*/useC);
}

template <class T>
void batchMatmulKernel(pipec::cpu::KernelContext &kc, void *const *bufs,
                       const int64_t *ints, const double *reals) {
  const T *a = static_cast<const T *>(bufs[0]);
  const T *b = static_cast<const T *>(bufs[1]);
  T *y = static_cast<T *>(bufs[2]);
  int64_t nb = ints[0];
  const int64_t *batchDims = ints + 1;
  const int64_t *aStrides = ints + 1 + nb;
  const int64_t *bStrides = ints + 1 + 2 * nb;
  const int64_t *tail = ints + 1 + 3 * nb;
  int64_t m = tail[0], n = tail[1], k = tail[2];
  bool transA = tail[3] != 0, transB = tail[4] != 0;
  // The rows' strides of the stored matrices (0: dense).
  const int64_t lda = tail[5] != 0 ? tail[5] : (transA ? m : k);
  const int64_t ldb = tail[6] != 0 ? tail[6] : (transB ? k : n);
  T alpha = reals ? T(reals[0]) : T(1);
  if (m <= 0 || n <= 0)
    return;

  StridedNest<2> nest;
  const int64_t *const strides[2] = {aStrides, bStrides};
  NestKind kind = canonicalize(nb, batchDims, strides, nest);
  if (kind == NestKind::Empty)
    return;
  int64_t batches = 1;
  for (int d = 0; d < nest.rank; ++d)
    batches *= nest.dims[d];
  int64_t yMatrix = m * n;
  if (kind == NestKind::TooDeep) {
    poison(y, batches * yMatrix);
    return;
  }
  if (k <= 0 || alpha == T(0)) {
    std::memset(y, 0, sizeof(T) * size_t(batches * yMatrix));
    return;
  }

  // A stack of row-major A matrices against one shared B is a single GEMM
  // with batches * M rows (the common [batch, seq, K] x [K, N] MatMul).
  // (Its rows are then evenly spaced: m rows `lda` apart per matrix, the
  // matrices m * lda apart.)
  if (nest.rank == 1 && nest.strides[1][0] == 0 && !transA &&
      nest.strides[0][0] == m * lda) {
    gemm(kc, a, b, y, batches * m, n, k, transA, transB, alpha, false, lda,
         ldb);
    return;
  }
  int64_t batch = 0;
  forEachIndex(nest, nest.rank, [&](const int64_t *offsets) {
    gemm(kc, a + offsets[0], b + offsets[1], y + batch * yMatrix, m, n, k,
         transA, transB, alpha, false, lda, ldb);
    ++batch;
  });
}

} // namespace

PIPEC_CPU_KERNEL_CTX(pipec_k_gemm, gemmKernel)
PIPEC_CPU_KERNEL_CTX(pipec_k_batch_matmul, batchMatmulKernel)
