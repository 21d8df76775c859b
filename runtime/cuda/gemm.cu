//===- gemm.cu - GEMM and batched matmul on cuBLAS ------------------------===//
//
// Part of pipec's CUDA runtime. CUDA twins of pipec_k_gemm and
// pipec_k_batch_matmul (see include/pipec_rt.h for the parameter layouts and
// cpu/gemm.cpp for the reference).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The tensors are row-major and cuBLAS is column-major. A row-major M x N
/// matrix is the column-major N x M matrix of its transpose, so
///   Y = op(A) op(B)   (row-major)
/// is computed as
///   Y^T = op(B)^T op(A)^T   (column-major: m' = N, n' = M, k' = K)
/// by passing B before A with the same transpose flags.
///
/// As on the CPU, Gemm's bias term is first materialised into Y (broadcast
/// through its strides and scaled by beta), then cuBLAS accumulates
/// alpha op(A) op(B) into it with beta = 1; beta == 0 (or no C) ignores C,
/// so a NaN in C does not leak. K == 0 or alpha == 0 leaves just the bias
/// (or zeros).
///
/// The batch dimensions of batch_matmul are canonicalised like the CPU
/// kernel's (unit dimensions dropped, dimensions contiguous for both
/// operands merged). The innermost remaining dimension is one
/// cublasSgemmStridedBatched call (a stride of 0 broadcasts that operand);
/// outer dimensions loop on the host. Those are left by irregular
/// broadcasts, and by operands read through a permutation (attention's
/// heads, nn-fold-transposes): in float32 such a product is instead one
/// call over dense copies of its uneven operands (gatheredProduct;
/// PIPEC_BATCH_GATHER=0 keeps the loop).
///
/// bfloat16 products (`--precision bf16`, Context::matmulBf16) round their
/// operands into the staging buffer and run on the tensor cores. cuBLAS's
/// fast tensor-core kernels load 16 bytes at a time, so they need every
/// dimension, leading dimension and batch stride a multiple of 8 bfloat16
/// values and the float32 result 16-byte aligned; otherwise it falls back
/// to kernels that load one or two values at a time. GPT-2's output layer
/// (50257 words) is such a product: 5.2 ms forward and 11.7 ms backward per
/// microbatch on an H200 (122 and 108 TFLOP/s), a third of the bf16 GEMM
/// time, against 380 TFLOP/s for the aligned MLP products. Such products
/// are staged padded: m, n and k rounded up to multiples of 8 with zeros
/// (exact zeros in every sum), the result computed into an aligned float32
/// buffer after the operands in the staging buffer (in parts of about
/// 256 MiB: whole columns, at least 8, or whole matrices, at least one)
/// and copied out, beta C added there, unless only k needed padding. Aligned
/// products keep the plain copy of their span. PIPEC_BF16_PAD=0 turns padding
/// off.
///
//===----------------------------------------------------------------------===//

#include "cuda_rt.h"
#include "pipec_rt.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

namespace pipec {
namespace cuda {
namespace {

/// Y[i, j] = beta * C[i * strideM + j * strideN] for an M x N Y. Each
/// element of an exactly aliased C == Y (strides N, 1) is read by the
/// thread that writes it. The index arithmetic is I: 32-bit when M x N
/// fits (a 64-bit division per element is emulated in tens of
/// instructions), offsets 64-bit.
template <typename I>
__global__ void broadcastBias(const float *c, float *y, I m, I n,
                              int64_t strideM, int64_t strideN, float beta) {
  const I total = m * n;
  for (I e = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); e < total;
       e += I(gridDim.x) * I(blockDim.x)) {
    const I i = e / n, j = e - i * n;
    y[e] = __fmul_rn(beta, c[int64_t(i) * strideM + int64_t(j) * strideN]);
  }
}

/// dst[i] = src[i] rounded to the nearest bfloat16 (ties to even), stored
/// as bfloat16 (T = __nv_bfloat16) or as its float32 value (T = float).
template <typename T>
__global__ void toBf16(const float *src, T *dst, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = static_cast<T>(__float2bfloat16_rn(src[i]));
}

/// Four bfloat16 values, stored together (8 bytes).
struct alignas(8) Bf16x4 {
  __nv_bfloat16 v[4];
};
__device__ __forceinline__ void store4(Bf16x4 *dst, float4 x) {
  Bf16x4 r;
  r.v[0] = __float2bfloat16_rn(x.x);
  r.v[1] = __float2bfloat16_rn(x.y);
  r.v[2] = __float2bfloat16_rn(x.z);
  r.v[3] = __float2bfloat16_rn(x.w);
  *dst = r;
}
__device__ __forceinline__ void store4(float4 *dst, float4 x) {
  *dst = make_float4(__bfloat162float(__float2bfloat16_rn(x.x)),
                     __bfloat162float(__float2bfloat16_rn(x.y)),
                     __bfloat162float(__float2bfloat16_rn(x.z)),
                     __bfloat162float(__float2bfloat16_rn(x.w)));
}

/// toBf16 four values at a time (16-byte loads): the same values. The
/// operands of a bf16 matmul are rounded on every call, and attention's
/// are large (GPT-2's 8 x 12 x 1024 x 1024 scores): one element per thread
/// ran at about 40% of an H200's memory bandwidth.
template <typename V>
__global__ void toBf16x4(const float4 *src, V *dst, int64_t n4) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += int64_t(gridDim.x) * blockDim.x)
    store4(dst + i, src[i]);
}

/// toBf16 of n elements on `stream`, four at a time where both pointers
/// allow it.
template <typename T>
void launchToBf16(const float *src, T *dst, int64_t n, cudaStream_t stream) {
  using V = std::conditional_t<std::is_same_v<T, float>, float4, Bf16x4>;
  const int64_t n4 = n / 4;
  if (n4 > 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(dst) % alignof(V) == 0) {
    toBf16x4<<<gridFor(n4), 256, 0, stream>>>(
        reinterpret_cast<const float4 *>(src), reinterpret_cast<V *>(dst), n4);
    if (n > 4 * n4)
      toBf16<<<1, 32, 0, stream>>>(src + 4 * n4, dst + 4 * n4, n - 4 * n4);
    return;
  }
  toBf16<<<gridFor(n), 256, 0, stream>>>(src, dst, n);
}

/// dst[i] = the float32 value of the bfloat16 src[i], four at a time
/// where both pointers allow (8-byte loads, 16-byte stores).
__global__ void fromBf16(const __nv_bfloat16 *src, float *dst, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __bfloat162float(src[i]);
}
__global__ void fromBf16x4(const Bf16x4 *src, float4 *dst, int64_t n4) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += int64_t(gridDim.x) * blockDim.x) {
    const Bf16x4 x = src[i];
    dst[i] = make_float4(__bfloat162float(x.v[0]), __bfloat162float(x.v[1]),
                         __bfloat162float(x.v[2]), __bfloat162float(x.v[3]));
  }
}

/// Elements from the first to the last one that `batch` stored
/// column-major matrices of `rows` x `cols` (leading dimension ld, matrix g
/// at g * stride) reach.
int64_t operandSpan(int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                    int64_t batch) {
  if (rows <= 0 || cols <= 0 || batch <= 0)
    return 0;
  return (cols - 1) * ld + rows + (batch - 1) * stride;
}

/// The bfloat16 copies of two operands spanning `spanA` and `spanB`
/// elements, in the context's staging buffer.
struct Bf16Operands {
  const __nv_bfloat16 *a, *b;
};

Bf16Operands stageBf16(Context &ctx, const float *a, int64_t spanA,
                       const float *b, int64_t spanB, const char *what) {
  const size_t bytesA = (size_t(spanA) * 2 + 255) / 256 * 256;
  char *staging =
      static_cast<char *>(bf16Staging(ctx, bytesA + size_t(spanB) * 2));
  auto *da = reinterpret_cast<__nv_bfloat16 *>(staging);
  auto *db = reinterpret_cast<__nv_bfloat16 *>(staging + bytesA);
  cudaStream_t stream = ctx.stream;
  launchToBf16(a, da, spanA, stream);
  launchToBf16(b, db, spanB, stream);
  checkLaunch(what);
  return {da, db};
}

/// `n` rounded up to a multiple of 8 (16 bytes of bfloat16).
int64_t roundUp8(int64_t n) { return (n + 7) / 8 * 8; }

/// dst: `count` column-major matrices of rowsP x colsP (leading dimension
/// rowsP, matrix g at g * rowsP * colsP) holding the rows x cols matrices
/// of src (leading dimension ld, matrix g at g * stride) rounded to the
/// nearest bfloat16, zeros in the padding. One block per column (column
/// `col` is column col - g * colsP of matrix g = col / colsP), its threads
/// along the contiguous rows.
__global__ void packBf16(const float *src, int64_t ld, int64_t stride,
                         int64_t rows, int64_t cols, __nv_bfloat16 *dst,
                         int64_t rowsP, int64_t colsP, int64_t count) {
  const int64_t columns = colsP * count;
  const int64_t step = blockDim.x;
  for (int64_t col = blockIdx.x; col < columns; col += gridDim.x) {
    const int64_t g = col / colsP, j = col - g * colsP;
    __nv_bfloat16 *out = dst + col * rowsP;
    // A padding column holds zeros only.
    const int64_t have = j < cols ? rows : 0;
    const float *in = src + g * stride + (j < cols ? j * ld : 0);
    // Four loads in flight per thread before the stores: one at a time
    // left a column kernel at about 40% of the memory's bandwidth.
    for (int64_t base = threadIdx.x; base < rowsP; base += 4 * step) {
      float v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t i = base + u * step;
        v[u] = i < have ? in[i] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t i = base + u * step;
        if (i < rowsP)
          out[i] = __float2bfloat16_rn(v[u]);
      }
    }
  }
}

/// The m x n corner of each of `count` padded float32 results (mP x nP,
/// leading dimension mP, result g at g * mP * nP) into C (leading dimension
/// ldc, result g at g * strideC): C = R, or R + beta C when beta != 0
/// (cuBLAS's epilogue with alpha already applied; beta == 0 never reads C).
__global__ void unpadResult(const float *r, int64_t mP, int64_t nP, int64_t m,
                            int64_t n, float *c, int64_t ldc, int64_t strideC,
                            int64_t count, float beta) {
  const int64_t columns = n * count;
  const int64_t step = blockDim.x;
  for (int64_t col = blockIdx.x; col < columns; col += gridDim.x) {
    const int64_t g = col / n, j = col - g * n;
    const float *in = r + (g * nP + j) * mP;
    float *out = c + g * strideC + j * ldc;
    // Four elements in flight per thread, as packBf16.
    for (int64_t base = threadIdx.x; base < m; base += 4 * step) {
      float v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t i = base + u * step;
        if (i < m)
          v[u] =
              beta == 0.0f ? in[i] : __fadd_rn(in[i], __fmul_rn(beta, out[i]));
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t i = base + u * step;
        if (i < m)
          out[i] = v[u];
      }
    }
  }
}

/// Threads per block of the column kernels above: the column's length
/// rounded up to a warp, at most 256.
unsigned columnBlock(int64_t rows) {
  const int64_t warps = (rows + 31) / 32;
  return unsigned(warps >= 8 ? 256 : 32 * (warps < 1 ? 1 : warps));
}

/// Blocks of the column kernels: one per column, capped (their loops
/// stride over the rest).
unsigned columnGrid(int64_t columns) {
  return unsigned(columns < 1             ? 1
                  : columns > 65535LL * 8 ? 65535LL * 8
                                          : columns);
}

/// Whether a float32 result (leading dimension ldc, matrix g at g * strideC)
/// starts every column 16 bytes aligned.
bool alignedResult(const float *c, int64_t ldc, int64_t strideC, int batch) {
  return ldc % 4 == 0 && (batch == 1 || strideC % 4 == 0) &&
         reinterpret_cast<uintptr_t>(c) % 16 == 0;
}

/// Whether a bfloat16 product (column-major, as cuBLAS sees it) must take
/// the padded path: some dimension, leading dimension or batch stride is
/// not a multiple of 8, or the float32 result is not 16-byte aligned
/// (leading dimension, stride or pointer); and every padded dimension
/// still fits cuBLAS's int.
bool needsPadding(int m, int n, int k, int lda, int64_t strideA, int ldb,
                  int64_t strideB, const float *c, int ldc, int64_t strideC,
                  int batch) {
  auto off8 = [](int64_t v) { return v % 8 != 0; };
  // (A dimension within 7 of cuBLAS's 32-bit limit stays unpadded.)
  if (!fitsInt(roundUp8(m)) || !fitsInt(roundUp8(n)) || !fitsInt(roundUp8(k)))
    return false;
  if (off8(m) || off8(n) || off8(k) || off8(lda) || off8(ldb))
    return true;
  if (batch > 1 && (off8(strideA) || off8(strideB)))
    return true;
  return !alignedResult(c, ldc, strideC, batch);
}

/// C = alpha op(A) op(B) + beta C by cublasGemmEx (batch 1) or
/// cublasGemmStridedBatchedEx: operands of `type` (float32, or bfloat16
/// staged), a float32 result, arithmetic `compute`.
void blasProduct(Context &ctx, cublasOperation_t ta, cublasOperation_t tb,
                 int64_t m, int64_t n, int64_t k, float alpha, const void *a,
                 int64_t lda, int64_t strideA, const void *b, int64_t ldb,
                 int64_t strideB, cudaDataType_t type,
                 cublasComputeType_t compute, float beta, float *c, int64_t ldc,
                 int64_t strideC, int64_t batch, const char *what) {
  if (batch == 1)
    checkBlas(cublasGemmEx(ctx.blas, ta, tb, int(m), int(n), int(k), &alpha, a,
                           type, int(lda), b, type, int(ldb), &beta, c,
                           CUDA_R_32F, int(ldc), compute, CUBLAS_GEMM_DEFAULT),
              what);
  else
    checkBlas(cublasGemmStridedBatchedEx(
                  ctx.blas, ta, tb, int(m), int(n), int(k), &alpha, a, type,
                  int(lda), strideA, b, type, int(ldb), strideB, &beta, c,
                  CUDA_R_32F, int(ldc), strideC, int(batch), compute,
                  CUBLAS_GEMM_DEFAULT),
              what);
}

/// The padded bfloat16 product: both operands packed with m, n and k
/// rounded up to multiples of 8 (zeros, which add exact zeros to every
/// sum), multiplied into C directly when m and n need no padding and C is
/// aligned; else into a float32 result of mP x nP per matrix in the
/// staging buffer, then copied out, in parts of at most
/// Context::bf16PadPartBytes (whole columns of one matrix, or whole
/// matrices of a batch). The products are those of the rounded operands, as on
/// the unpadded path; only cuBLAS's choice of kernel (the order of the float32
/// sums) differs.
void paddedBf16Gemm(Context &ctx, cublasOperation_t ta, cublasOperation_t tb,
                    int m, int n, int k, float alpha, const float *a, int lda,
                    int64_t strideA, const float *b, int ldb, int64_t strideB,
                    float beta, float *c, int ldc, int64_t strideC, int batch,
                    const char *what) {
  const int64_t mP = roundUp8(m), nP = roundUp8(n), kP = roundUp8(k);
  const bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N;
  // A is stored aRows x aCols (op(A) = m x k), B bRows x bCols.
  const int64_t aRows = na ? m : k, aCols = na ? k : m;
  const int64_t aRowsP = na ? mP : kP, aColsP = na ? kP : mP;
  const int64_t bRows = nb ? k : n, bCols = nb ? n : k;
  const int64_t bRowsP = nb ? kP : nP, bColsP = nb ? nP : kP;
  // A batch stride of 0 broadcasts one matrix: it is packed once.
  const int64_t aCount = batch > 1 && strideA != 0 ? batch : 1;
  const int64_t bCount = batch > 1 && strideB != 0 ? batch : 1;
  const int64_t aStrideP = aCount > 1 ? aRowsP * aColsP : 0;
  const int64_t bStrideP = bCount > 1 ? bRowsP * bColsP : 0;
  const bool direct =
      mP == m && nP == n && alignedResult(c, ldc, strideC, batch);
  // The result's part: `partCols` columns of the one matrix, or
  // `partBatch` whole matrices (at least 8 columns or one matrix).
  const int64_t columnBytes = mP * 4;
  const int64_t partCols =
      batch > 1 ? nP
                : std::min(nP, std::max<int64_t>(8, ctx.bf16PadPartBytes /
                                                        columnBytes / 8 * 8));
  const int64_t partBatch =
      batch > 1
          ? std::max<int64_t>(1, ctx.bf16PadPartBytes / (columnBytes * nP))
          : 1;
  auto rounded256 = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  const size_t bytesA = rounded256(size_t(aRowsP * aColsP * aCount) * 2);
  const size_t bytesB = rounded256(size_t(bRowsP * bColsP * bCount) * 2);
  const size_t bytesR = direct
                            ? 0
                            : size_t(columnBytes * partCols) *
                                  size_t(std::min<int64_t>(partBatch, batch));
  char *staging =
      static_cast<char *>(bf16Staging(ctx, bytesA + bytesB + bytesR));
  auto *da = reinterpret_cast<__nv_bfloat16 *>(staging);
  auto *db = reinterpret_cast<__nv_bfloat16 *>(staging + bytesA);
  cudaStream_t stream = ctx.stream;
  packBf16<<<columnGrid(aColsP * aCount), columnBlock(aRowsP), 0, stream>>>(
      a, lda, strideA, aRows, aCols, da, aRowsP, aColsP, aCount);
  packBf16<<<columnGrid(bColsP * bCount), columnBlock(bRowsP), 0, stream>>>(
      b, ldb, strideB, bRows, bCols, db, bRowsP, bColsP, bCount);
  checkLaunch(what);
  if (direct) {
    blasProduct(ctx, ta, tb, mP, nP, kP, alpha, da, aRowsP, aStrideP, db,
                bRowsP, bStrideP, CUDA_R_16BF, CUBLAS_COMPUTE_32F, beta, c, ldc,
                strideC, batch, what);
    ++ctx.bf16PaddedDirect;
    return;
  }
  float *r = reinterpret_cast<float *>(staging + bytesA + bytesB);
  for (int64_t g0 = 0; g0 < batch; g0 += partBatch) {
    const int64_t gs = std::min<int64_t>(partBatch, batch - g0);
    for (int64_t j0 = 0; j0 < n; j0 += partCols) {
      // Columns j0 .. j0 + cols of op(B) and of the result: B's columns
      // (stored k x n) or rows (stored n x k, an offset of j0 values,
      // 16-byte aligned as j0 is a multiple of 8).
      const int64_t cols = std::min<int64_t>(partCols, n - j0);
      const __nv_bfloat16 *bPart = db + g0 * bStrideP + (nb ? j0 * bRowsP : j0);
      blasProduct(ctx, ta, tb, mP, roundUp8(cols), kP, alpha,
                  da + g0 * aStrideP, aRowsP, aStrideP, bPart, bRowsP, bStrideP,
                  CUDA_R_16BF, CUBLAS_COMPUTE_32F, 0.0f, r, mP,
                  mP * roundUp8(cols), gs, what);
      unpadResult<<<columnGrid(cols * gs), columnBlock(m), 0, stream>>>(
          r, mP, roundUp8(cols), m, cols, c + g0 * strideC + j0 * ldc, ldc,
          strideC, gs, beta);
      checkLaunch(what);
      ++ctx.bf16PaddedParts;
    }
  }
}

/// Row-major Y[MxN] = alpha op(A) op(B) + beta Y for one matrix; beta is 0
/// or 1. `lda` / `ldb`: the strides between the rows of A's and B's stored
/// matrices (0: dense). Requires M, N, K > 0.
void gemmOne(Context &ctx, const float *a, const float *b, float *y, int64_t m,
             int64_t n, int64_t k, bool transA, bool transB, float alpha,
             float beta, const char *kernel, int64_t lda = 0, int64_t ldb = 0) {
  if (lda == 0)
    lda = transA ? m : k;
  if (ldb == 0)
    ldb = transB ? k : n;
  if (!fitsInt(m) || !fitsInt(n) || !fitsInt(k) || !fitsInt(lda) ||
      !fitsInt(ldb))
    fail((std::string(kernel) +
          ": a matrix dimension exceeds cuBLAS's 32-bit limit")
             .c_str());
  gemm(ctx, blasOp(transB), blasOp(transA), int(n), int(m), int(k), alpha, b,
       int(ldb), a, int(lda), beta, y, int(n), kernel);
}

/// Canonical batch loop nest of batch_matmul: extents >= 2, strides in
/// elements for A and B (Y is contiguous in this order).
struct BatchNest {
  int rank = 0;
  int64_t dims[64];
  int64_t a[64];
  int64_t b[64];
};

/// Returns false when some batch extent is <= 0 (nothing to compute). Fails
/// on more than 64 surviving dimensions (more than 2^64 batches).
bool canonicalize(int64_t nb, const int64_t *dims, const int64_t *as,
                  const int64_t *bs, BatchNest &nest) {
  nest.rank = 0;
  for (int64_t i = 0; i < nb; ++i)
    if (dims[i] <= 0)
      return false;
  for (int64_t i = 0; i < nb; ++i) {
    const int64_t extent = dims[i];
    if (extent == 1)
      continue;
    if (nest.rank > 0) {
      const int last = nest.rank - 1;
      if (nest.a[last] == as[i] * extent && nest.b[last] == bs[i] * extent) {
        nest.dims[last] *= extent;
        nest.a[last] = as[i];
        nest.b[last] = bs[i];
        continue;
      }
    }
    if (nest.rank == 64)
      fail("pipec_cuda_k_batch_matmul: too many batch dimensions");
    nest.dims[nest.rank] = extent;
    nest.a[nest.rank] = as[i];
    nest.b[nest.rank] = bs[i];
    ++nest.rank;
  }
  return true;
}

/// Whether the batches of an operand stored rows x ld per matrix follow
/// one another evenly, `rows * ld` apart (then any run of its batch
/// dimensions merges into one stride).
bool evenlySpaced(const BatchNest &nest, const int64_t *strides, int64_t rows,
                  int64_t ld) {
  int64_t want = rows * ld;
  for (int d = nest.rank - 1; d >= 0; --d) {
    if (strides[d] != want)
      return false;
    want *= nest.dims[d];
  }
  return true;
}

/// A float32 product whose batch dimensions do not merge into one stride,
/// because an operand is read through a permutation (attention's heads,
/// [B,S,H,D] read as [B,H,S,D]: heads D apart, sequences S*H*D apart;
/// nn-fold-transposes), as one strided-batched call over dense copies of
/// the operands that are not evenly spaced. The loop over the outer batch
/// dimension instead issues B calls of H small products: on an H200
/// (2026-11-27, third run) GPT-2's float32 attention products took
/// 1.14-1.81x their time over dense operands that way. The copies are
/// float4 gathers into scratch (about 12 us for 25 MB there). Returns
/// false, computing nothing, for a batch that broadcasts an operand (a
/// stride of 0: copying it would multiply its bytes), for bf16 (the staging
/// copies the operands anyway), where the loop would make fewer than 4
/// calls, and where the view exceeds the gather's rank.
bool gatheredProduct(Context &ctx, const BatchNest &nest, int64_t batches,
                     const float *a, const float *b, float *y, int64_t m,
                     int64_t n, int64_t k, bool transA, bool transB,
                     int64_t lda, int64_t ldb, float alpha, const char *what) {
  if (!ctx.batchGather || ctx.matmulBf16 || nest.rank < 2 ||
      nest.rank + 2 > 8 || !fitsInt(batches))
    return false;
  // (A loop of a few calls, each of many products, fills the GPU anyway:
  // GPT-2's slow case looped 8 times. Copying would only cost memory.)
  if (batches / nest.dims[nest.rank - 1] < 4)
    return false;
  for (int d = 0; d < nest.rank; ++d)
    if (nest.a[d] == 0 || nest.b[d] == 0)
      return false;
  const int64_t aRows = transA ? k : m, aCols = transA ? m : k;
  const int64_t bRows = transB ? n : k, bCols = transB ? k : n;
  const bool gatherA = !evenlySpaced(nest, nest.a, aRows, lda);
  const bool gatherB = !evenlySpaced(nest, nest.b, bRows, ldb);
  // (At least one is uneven, or canonicalize would have merged the nest.)
  const int64_t aFloats =
      gatherA ? (batches * aRows * aCols + 63) / 64 * 64 : 0;
  const int64_t bFloats = gatherB ? batches * bRows * bCols : 0;
  float *space = static_cast<float *>(
      scratch(ctx, sizeof(float) * size_t(aFloats + bFloats)));
  // The view of one operand: the batch dimensions, then its rows and
  // columns.
  auto gather = [&](const float *x, const int64_t *strides, int64_t rows,
                    int64_t cols, int64_t ld, float *dense) {
    int64_t dims[8], steps[8];
    for (int d = 0; d < nest.rank; ++d) {
      dims[d] = nest.dims[d];
      steps[d] = strides[d];
    }
    dims[nest.rank] = rows;
    steps[nest.rank] = ld;
    dims[nest.rank + 1] = cols;
    steps[nest.rank + 1] = 1;
    gatherDense(ctx, x, dense, nest.rank + 2, dims, steps, what);
  };
  if (gatherA)
    gather(a, nest.a, aRows, aCols, lda, space);
  if (gatherB)
    gather(b, nest.b, bRows, bCols, ldb, space + aFloats);
  const float *pa = gatherA ? space : a, *pb = gatherB ? space + aFloats : b;
  const int64_t ldA = gatherA ? aCols : lda, ldB = gatherB ? bCols : ldb;
  // Row-major Y = A B is column-major Y^T = B^T A^T.
  gemmStridedBatched(ctx, blasOp(transB), blasOp(transA), int(n), int(m),
                     int(k), alpha, pb, int(ldB), bRows * ldB, pa, int(ldA),
                     aRows * ldA, 0.0f, y, int(n), m * n, int(batches), what);
  ++ctx.batchGathered;
  return true;
}

} // namespace

void toBf16Storage(Context &ctx, const float *src, void *dst, int64_t n,
                   const char *what) {
  if (n <= 0)
    return;
  launchToBf16(src, static_cast<__nv_bfloat16 *>(dst), n, ctx.stream);
  checkLaunch(what);
}

void fromBf16Storage(Context &ctx, const void *src, float *dst, int64_t n,
                     const char *what) {
  if (n <= 0)
    return;
  const auto *s16 = static_cast<const __nv_bfloat16 *>(src);
  const int64_t n4 = n / 4;
  if (n4 > 0 && reinterpret_cast<uintptr_t>(src) % alignof(Bf16x4) == 0 &&
      reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    fromBf16x4<<<gridFor(n4), 256, 0, ctx.stream>>>(
        reinterpret_cast<const Bf16x4 *>(src), reinterpret_cast<float4 *>(dst),
        n4);
    if (n > 4 * n4)
      fromBf16<<<1, 32, 0, ctx.stream>>>(s16 + 4 * n4, dst + 4 * n4,
                                         n - 4 * n4);
  } else {
    fromBf16<<<gridFor(n), 256, 0, ctx.stream>>>(s16, dst, n);
  }
  checkLaunch(what);
}

void roundToBf16Values(Context &ctx, const float *src, float *dst, int64_t n,
                       const char *what) {
  if (n <= 0)
    return;
  launchToBf16(src, dst, n, ctx.stream);
  checkLaunch(what);
}

void gemm(Context &ctx, cublasOperation_t ta, cublasOperation_t tb, int m,
          int n, int k, float alpha, const float *a, int lda, const float *b,
          int ldb, float beta, float *c, int ldc, const char *what) {
  gemmStridedBatched(ctx, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c,
                     ldc, 0, 1, what);
}

void gemmStridedBatched(Context &ctx, cublasOperation_t ta,
                        cublasOperation_t tb, int m, int n, int k, float alpha,
                        const float *a, int lda, int64_t strideA,
                        const float *b, int ldb, int64_t strideB, float beta,
                        float *c, int ldc, int64_t strideC, int batch,
                        const char *what) {
  const void *pa = a, *pb = b;
  cudaDataType_t type = CUDA_R_32F;
  cublasComputeType_t compute = ctx.compute;
  if (ctx.matmulBf16 && ctx.bf16Pad &&
      needsPadding(m, n, k, lda, strideA, ldb, strideB, c, ldc, strideC,
                   batch)) {
    paddedBf16Gemm(ctx, ta, tb, m, n, k, alpha, a, lda, strideA, b, ldb,
                   strideB, beta, c, ldc, strideC, batch, what);
    return;
  }
  if (ctx.matmulBf16) {
    // op(A) is m x k and op(B) k x n (column-major, as cuBLAS sees them).
    const bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N;
    Bf16Operands staged = stageBf16(
        ctx, a, operandSpan(na ? m : k, na ? k : m, lda, strideA, batch), b,
        operandSpan(nb ? k : n, nb ? n : k, ldb, strideB, batch), what);
    pa = staged.a;
    pb = staged.b;
    type = CUDA_R_16BF;
    compute = CUBLAS_COMPUTE_32F;
  }
  blasProduct(ctx, ta, tb, m, n, k, alpha, pa, lda, strideA, pb, ldb, strideB,
              type, compute, beta, c, ldc, strideC, batch, what);
}

} // namespace cuda
} // namespace pipec

using namespace pipec::cuda;

extern "C" void pipec_cuda_k_gemm(pipec_kctx *kc, void *const *bufs,
                                  const int64_t *ints, const double *reals) {
  const char *kName = "pipec_cuda_k_gemm";
  Context &ctx = context(kc, kName);
  const float *a = static_cast<const float *>(bufs[0]);
  const float *b = static_cast<const float *>(bufs[1]);
  const float *c = static_cast<const float *>(bufs[2]);
  float *y = static_cast<float *>(bufs[3]);
  const int64_t m = ints[0], n = ints[1], k = ints[2];
  const bool transA = ints[3] != 0, transB = ints[4] != 0;
  const bool hasC = ints[5] != 0 && c != nullptr;
  const int64_t cStrideM = ints[6], cStrideN = ints[7];
  const float alpha = reals ? float(reals[0]) : 1.0f;
  const float beta = reals ? float(reals[1]) : 1.0f;
  if (m <= 0 || n <= 0)
    return;

  // Following BLAS, beta == 0 means "ignore C".
  const bool useC = hasC && beta != 0.0f;
  if (useC) {
    // (A grid-stride index stays below total + grid * 256 < 2^31 with
    // total < 2^30.)
    if (m * n < (int64_t(1) << 30))
      broadcastBias<int32_t><<<gridFor(m * n), 256, 0, ctx.stream>>>(
          c, y, int32_t(m), int32_t(n), cStrideM, cStrideN, beta);
    else
      broadcastBias<int64_t><<<gridFor(m * n), 256, 0, ctx.stream>>>(
          c, y, m, n, cStrideM, cStrideN, beta);
    checkLaunch(kName);
  }
  if (k <= 0 || alpha == 0.0f) {
    // op(A) op(B) is the zero matrix.
    if (!useC)
      check(cudaMemsetAsync(y, 0, sizeof(float) * size_t(m * n), ctx.stream),
            kName);
    return;
  }
  gemmOne(ctx, a, b, y, m, n, k, transA, transB, alpha, useC ? 1.0f : 0.0f,
          kName);
}

extern "C" void pipec_cuda_k_batch_matmul(pipec_kctx *kc, void *const *bufs,
                                          const int64_t *ints,
                                          const double *reals) {
  const char *kName = "pipec_cuda_k_batch_matmul";
  Context &ctx = context(kc, kName);
  const float *a = static_cast<const float *>(bufs[0]);
  const float *b = static_cast<const float *>(bufs[1]);
  float *y = static_cast<float *>(bufs[2]);
  const int64_t nb = ints[0];
  const int64_t *batchDims = ints + 1;
  const int64_t *aStrides = ints + 1 + nb;
  const int64_t *bStrides = ints + 1 + 2 * nb;
  const int64_t *tail = ints + 1 + 3 * nb;
  const int64_t m = tail[0], n = tail[1], k = tail[2];
  const bool transA = tail[3] != 0, transB = tail[4] != 0;
  // The rows' strides of the stored matrices (0: dense).
  const int64_t lda = tail[5] != 0 ? tail[5] : (transA ? m : k);
  const int64_t ldb = tail[6] != 0 ? tail[6] : (transB ? k : n);
  const float alpha = reals ? float(reals[0]) : 1.0f;
  if (m <= 0 || n <= 0)
    return;

  BatchNest nest;
  if (!canonicalize(nb, batchDims, aStrides, bStrides, nest))
    return;
  int64_t batches = 1;
  for (int d = 0; d < nest.rank; ++d)
    batches *= nest.dims[d];
  const int64_t yMatrix = m * n;
  if (k <= 0 || alpha == 0.0f) {
    check(cudaMemsetAsync(y, 0, sizeof(float) * size_t(batches * yMatrix),
                          ctx.stream),
          kName);
    return;
  }
  if (nest.rank == 0) {
    gemmOne(ctx, a, b, y, m, n, k, transA, transB, alpha, 0.0f, kName, lda,
            ldb);
    return;
  }
  // A stack of row-major A matrices against one shared B is one GEMM with
  // batches * M rows (the common [batch, seq, K] x [K, N] MatMul), as on
  // the CPU (the rows evenly spaced: matrices m * lda apart).
  if (nest.rank == 1 && nest.b[0] == 0 && !transA && nest.a[0] == m * lda &&
      fitsInt(batches * m)) {
    gemmOne(ctx, a, b, y, batches * m, n, k, transA, transB, alpha, 0.0f, kName,
            lda, ldb);
    return;
  }
  if (!fitsInt(m) || !fitsInt(n) || !fitsInt(k) || !fitsInt(lda) ||
      !fitsInt(ldb))
    fail("pipec_cuda_k_batch_matmul: a matrix dimension exceeds cuBLAS's "
         "32-bit limit");

  if (gatheredProduct(ctx, nest, batches, a, b, y, m, n, k, transA, transB, lda,
                      ldb, alpha, kName))
    return;

  // The innermost batch dimension is one strided-batched call; the outer
  // ones (broadcasts, and permuted operands in bf16 or over fewer than 4
  // outer batches) loop here.
  const int inner = nest.rank - 1;
  const int64_t innerCount = nest.dims[inner];
  if (!fitsInt(innerCount))
    fail("pipec_cuda_k_batch_matmul: too many batches for one cuBLAS call");
  int64_t index[64] = {};
  int64_t aOff = 0, bOff = 0, yOff = 0;
  while (true) {
    gemmStridedBatched(ctx, blasOp(transB), blasOp(transA), int(n), int(m),
                       int(k), alpha, b + bOff, int(ldb), nest.b[inner],
                       a + aOff, int(lda), nest.a[inner], 0.0f, y + yOff,
                       int(n), yMatrix, int(innerCount), kName);
    yOff += innerCount * yMatrix;
    int d = inner - 1;
    for (; d >= 0; --d) {
      ++index[d];
      aOff += nest.a[d];
      bOff += nest.b[d];
      if (index[d] < nest.dims[d])
        break;
      aOff -= nest.a[d] * nest.dims[d];
      bOff -= nest.b[d] * nest.dims[d];
      index[d] = 0;
    }
    if (d < 0)
      return;
  }
}
