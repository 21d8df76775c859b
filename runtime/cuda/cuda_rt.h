//===- cuda_rt.h - Shared state of the CUDA kernels -------------*- C++ -*-===//
//
// Part of pipec's CUDA runtime (runtime/cuda). Included by the .cu kernel
// files and the CUDA device; never by generated code.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Every CUDA kernel runs in the kernel context it is called with (ABI 3,
/// include/pipec_rt.h): `Context` below, the CUDA derivation of
/// pipec_kctx. It holds the stream every kernel is launched on (in program
/// order, so launches need no synchronisation among themselves), the
/// cuBLAS handle bound to that stream, the arithmetic (TF32, bfloat16
/// operands) and a growable scratch buffer for kernels that need
/// workspace. The CUDA device (device.cpp) owns the context of a stage
/// executable; a test makes its own with `initContext`. Nothing here is
/// process-wide except cuDNN's library handle and chosen algorithms
/// (cudnn_conv.cpp).
///
/// Kernels keep the C ABI of include/pipec_rt.h (`kc`, `bufs`, `ints`,
/// `reals`); every buffer pointer is a device pointer. The symbol of the
/// CUDA twin of `pipec_k_NAME` is `pipec_cuda_k_NAME`; cuda_kernels.def
/// lists the ones that exist. float32 only: `pipec compile --target cuda`
/// refuses f64.
///
/// Failures (a CUDA or cuBLAS error, an unsupported parameter, a kernel
/// context that is not a CUDA one) throw pipec::rt::RtError with one line
/// naming the kernel, so the runtime reports them like every other error.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CUDA_CUDA_RT_H
#define PIPEC_RUNTIME_CUDA_CUDA_RT_H

#include "core/kernel_context.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace pipec {
namespace cuda {

struct Context : pipec_kctx {
  Context() : pipec_kctx(Kind::Cuda) {}
  int device = -1;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  /// Workspace of kernels that need one (grows, never shrinks; stream
  /// ordered, so one kernel's workspace is free again for the next launch).
  void *scratch = nullptr;
  size_t scratchBytes = 0;
  /// TF32 tensor-core math in cuBLAS (pipec train --allow-tf32); off by
  /// default: float32 results then match the CPU kernels to rounding.
  bool allowTf32 = false;
  /// The arithmetic of the float32 matrix products (gemm,
  /// gemmStridedBatched below): CUBLAS_COMPUTE_32F, _FAST_TF32
  /// (--allow-tf32) or _PEDANTIC (PIPEC_CUBLAS_MATH=pedantic).
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  /// With matmulBf16 (pipec_kctx, a `--precision bf16` stage) every matrix
  /// product first rounds its operands to the nearest bfloat16 (ties to
  /// even, as a cast does) into `bf16Staging`, then multiplies them on the
  /// tensor cores with float32 accumulation and a float32 result. Rounding
  /// ourselves keeps the arithmetic the same whatever kernel cuBLAS picks
  /// (its CUBLAS_COMPUTE_32F_FAST_16BF may leave small products in float32
  /// and does not round to nearest).
  void *bf16Staging = nullptr;
  size_t bf16StagingBytes = 0;
  /// The float32 copies of a `_bf16` kernel's bfloat16 buffers where no
  /// kernel reads and writes them itself (bf16_storage.cpp).
  void *bf16Wide = nullptr;
  size_t bf16WideBytes = 0;
  /// `_bf16` calls that ran their float32 twin on such copies (for the
  /// tests: which path ran).
  int64_t bf16Widened = 0;
  /// With matmulBf16: a product whose dimensions, leading dimensions or
  /// batch strides are not multiples of 8 elements (16 bytes of bfloat16),
  /// or whose float32 result is not 16-byte aligned (GPT-2's 50257-word
  /// vocabulary), is staged with every dimension padded to a multiple of 8
  /// (zeros); it is multiplied straight into its result when only K was
  /// padded and the result is aligned, else into an aligned float32 buffer
  /// in the staging, then copied out. cuBLAS's tensor-core kernels need
  /// that alignment for their fast variants (gemm.cu). PIPEC_BF16_PAD=0
  /// turns it off.
  bool bf16Pad = true;
  /// The padded float32 result is staged in parts of at most this many
  /// bytes (whole columns, or whole matrices of a batch; GPT-2's logits
  /// are 1.6 GB at microbatch 8). Tests make it small to run the parts.
  int64_t bf16PadPartBytes = int64_t(256) << 20;
  /// Padded products multiplied straight into their result, and parts of
  /// padded results copied out (for the tests: which path ran).
  int64_t bf16PaddedDirect = 0, bf16PaddedParts = 0;
  /// Float32 batched products whose batches no single strided-batched
  /// call covers (a permuted operand) that were made one call over
  /// operands gathered densely (gemm.cu, pipec_cuda_k_batch_matmul; for the
  /// tests: which path ran).
  int64_t batchGathered = 0;
  /// 1x1 convolutions (one group, unpadded, any stride) as cuBLAS matrix
  /// products instead of cuDNN (conv.cu; PIPEC_POINTWISE_GEMM=0 turns it
  /// off), and how many passes ran so (for the tests).
  bool pointwiseGemm = true;
  int64_t pointwiseProducts = 0;
  /// `--precision bf16` convolutions on cuDNN with bfloat16 operands and
  /// results (PIPEC_CUDNN_BF16=1; cudnn_conv.cpp) instead of TF32
  /// arithmetic on float32 tensors holding bfloat16 values. Off by default.
  bool cudnnBf16 = false;
  /// PIPEC_BATCH_GATHER=0 turns that off (the loop over the outer batch
  /// dimension instead).
  bool batchGather = true;
  /// The device tables of the multi-tensor kernels' calls (optimizer.cu):
  /// uploaded on a call site's first call, kept while its buffers are the
  /// same (the arena's are, step after step).
  void *multiTensorTables = nullptr;
  /// Counts the times a buffer above (scratch, staging, a multi-tensor
  /// table) was freed or moved: a CUDA graph captured before holds the old
  /// addresses and must be captured again (device.cpp, --cuda-graphs).
  uint64_t buffersMoved = 0;
  /// Batch norm of few channels with many values split across blocks
  /// (batchnorm.cu, splitParts); PIPEC_BN_SPLIT=0 turns it off.
  bool bnSplit = true;
  /// cuBLAS's workspace (set once by initContext).
  void *blasWorkspace = nullptr;
  static constexpr size_t kBlasWorkspaceBytes = size_t(32) << 20;
};

/// `kc` as a live CUDA context; throws RtError naming `kernel` when it is
/// null, belongs to another device or was never initialised.
Context &context(pipec_kctx *kc, const char *kernel);
/// Selects `device`, creates the stream and the cuBLAS handle of `c`.
/// Idempotent for the same device. `matmulBf16`: the stage's matrix
/// products round their operands to bfloat16 (`--precision bf16`).
void initContext(Context &c, int device, bool allowTf32,
                 bool matmulBf16 = false);
/// Releases the handles and buffers of `c` (its owner calls it while the
/// CUDA runtime is still up: not a destructor, which could run at exit).
void destroyContext(Context &c);

/// Frees the multi-tensor tables of `c` (after a synchronisation).
void releaseMultiTensorTables(Context &c);

/// Throws RtError "<what>: <CUDA error string>" unless `e` is cudaSuccess.
void check(cudaError_t e, const char *what);
inline void check(cudaError_t e, const std::string &what) {
  check(e, what.c_str());
}
/// Throws RtError "<what>: cuBLAS status N" unless `s` is success.
void checkBlas(cublasStatus_t s, const char *what);
/// Device memory for a message slot of the communicators (CUDA IPC, NCCL
/// messages) that holds `bytes`: at least 64 KiB, so that small messages
/// share slots; `capacity` gets its size. Throws RtError "<what> of N
/// bytes: <CUDA error>" when it cannot be had.
char *allocateSlot(int64_t bytes, int64_t &capacity, const std::string &what);
/// Throws RtError with `what` (an unsupported parameter, say).
[[noreturn]] void fail(const char *what);

/// Scratch of at least `bytes` bytes on the context's stream.
void *scratch(Context &c, size_t bytes);
/// The bfloat16 operand staging of at least `bytes` bytes (matmulBf16).
void *bf16Staging(Context &c, size_t bytes);
/// The `_bf16` kernels' float32 copies, at least `bytes` bytes.
void *bf16Wide(Context &c, size_t bytes);

/// dst (n bfloat16 values) = src rounded to the nearest bfloat16 (ties to
/// even); and back, each bfloat16 widened to its float32 value. On the
/// context's stream; defined in gemm.cu.
void toBf16Storage(Context &c, const float *src, void *dst, int64_t n,
                   const char *what);
void fromBf16Storage(Context &c, const void *src, float *dst, int64_t n,
                     const char *what);

/// y = the view of x with extents dims[rank] and element strides
/// strides[rank] (rank <= 8), written densely in row-major order (float4
/// at a time where the view allows); on the context's stream. Defined in
/// movement.cu.
void gatherDense(Context &ctx, const float *x, float *y, int rank,
                 const int64_t *dims, const int64_t *strides,
                 const char *kernel);
/// Its mirror: the view of y (dims, strides; no two of its elements the
/// same) = the dense x, row-major; the rest of y is left as it is.
void scatterDense(Context &ctx, const float *x, float *y, int rank,
                  const int64_t *dims, const int64_t *strides,
                  const char *kernel);

/// dst[i] = src[i] rounded to the nearest bfloat16 value (ties to even),
/// kept as float32 (n elements, on the context's stream). Defined in
/// gemm.cu.
void roundToBf16Values(Context &c, const float *src, float *dst, int64_t n,
                       const char *what);

/// Whether `v` fits cuBLAS's 32-bit int parameters.
inline bool fitsInt(int64_t v) { return v >= 0 && v <= INT32_MAX; }
/// cuBLAS's transpose flag.
inline cublasOperation_t blasOp(bool trans) {
  return trans ? CUBLAS_OP_T : CUBLAS_OP_N;
}

/// Column-major C = alpha op(A) op(B) + beta C on float32 storage with the
/// context's arithmetic (float32, or bfloat16 operands: matmulBf16);
/// throws naming `what`. Defined in gemm.cu.
void gemm(Context &ctx, cublasOperation_t ta, cublasOperation_t tb, int m,
          int n, int k, float alpha, const float *a, int lda, const float *b,
          int ldb, float beta, float *c, int ldc, const char *what);
/// `batch` such products, operand g at X + g * strideX.
void gemmStridedBatched(Context &ctx, cublasOperation_t ta,
                        cublasOperation_t tb, int m, int n, int k, float alpha,
                        const float *a, int lda, int64_t strideA,
                        const float *b, int ldb, int64_t strideB, float beta,
                        float *c, int ldc, int64_t strideC, int batch,
                        const char *what);

/// Grid size for `n` elements with `block` threads per block, capped so a
/// grid-stride loop covers the rest.
inline unsigned gridFor(int64_t n, int block = 256) {
  int64_t blocks = (n + block - 1) / block;
  if (blocks < 1)
    blocks = 1;
  if (blocks > 65535LL * 8)
    blocks = 65535LL * 8;
  return unsigned(blocks);
}

/// Launch check after a kernel launch (launch errors only; execution errors
/// surface at the next synchronisation).
void checkLaunch(const char *kernel);

/// Most dimensions the strided kernels take (ONNX tensors here are smaller).
constexpr int kMaxRank = 8;

/// Dims and strides passed by value to a kernel (no device allocation).
struct Strides {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t a[kMaxRank] = {};
  int64_t b[kMaxRank] = {};
  int64_t c[kMaxRank] = {};
};

} // namespace cuda
namespace rt {
struct Bf16Buffers;
}
namespace cuda {

/// The `_bf16` kernels that read and write bfloat16 themselves
/// (elementwise.cu): each launches and returns true for the calls it
/// covers (its storage combinations, 32-bit element counts, known
/// opcodes), else returns false and the caller runs the float32 twin on
/// float32 copies (bf16_storage.cpp). Same parameters as the entry points,
/// the prefix read into `st`.
bool binaryBf16(Context &ctx, void *const *bufs, const rt::Bf16Buffers &st,
                const double *reals);
bool unaryBf16(Context &ctx, void *const *bufs, const rt::Bf16Buffers &st,
               const double *reals);
bool unaryGradBf16(Context &ctx, void *const *bufs, const rt::Bf16Buffers &st,
                   const double *reals);

} // namespace cuda
} // namespace pipec

#define PIPEC_CUDA_KERNEL(sym, nbufs)                                          \
  extern "C" void pipec_cuda_k_##sym(pipec_kctx *kc, void *const *bufs,        \
                                     const int64_t *ints,                      \
                                     const double *reals);
#include "cuda_kernels.def"
/// pipec_cuda_k_NAME_multi (include/pipec_multi_tensor.def): one launch
/// for K tensors.
#define PIPEC_MULTI_TENSOR(name, bufs, ints, firstOutput, shared)              \
  extern "C" void pipec_cuda_k_##name##_multi(                                 \
      pipec_kctx *kc, void *const *b, const int64_t *i, const double *r);
#include "pipec_multi_tensor.def"

#endif // PIPEC_RUNTIME_CUDA_CUDA_RT_H
