//===- context.cpp - The CUDA kernels' process context --------------------===//
//
// Part of pipec's CUDA runtime. See cuda_rt.h.
//
//===----------------------------------------------------------------------===//
#include "cuda_rt.h"
#include "cudnn_conv.h"

#include "core/error.h"
#include "core/options.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace pipec {
namespace cuda {

Context &context(pipec_kctx *kc, const char *kernel) {
  auto &c = static_cast<Context &>(
      rt::kernelContextOfKind(kc, pipec_kctx::Kind::Cuda, kernel));
  if (!c.stream)
    throw rt::RtError(std::string(kernel) +
                      ": called before its CUDA context was initialised");
  return c;
}

void check(cudaError_t e, const char *what) {
  if (e != cudaSuccess)
    throw rt::RtError(std::string(what) + ": " + cudaGetErrorString(e));
}

void checkBlas(cublasStatus_t s, const char *what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw rt::RtError(std::string(what) + ": cuBLAS " + cublasGetStatusName(s) +
                      " (" + cublasGetStatusString(s) + ")");
}

void fail(const char *what) { throw rt::RtError(what); }

char *allocateSlot(int64_t bytes, int64_t &capacity, const std::string &what) {
  capacity = std::max<int64_t>(bytes, int64_t(1) << 16);
  void *p = nullptr;
  check(cudaMalloc(&p, size_t(capacity)),
        what + " of " + std::to_string(capacity) + " bytes");
  return static_cast<char *>(p);
}

void checkLaunch(const char *kernel) { check(cudaGetLastError(), kernel); }

void initContext(Context &c, int device, bool allowTf32, bool matmulBf16) {
  if (c.stream) {
    if (c.device != device)
      throw rt::RtError("CUDA context already bound to device " +
                        std::to_string(c.device));
    return;
  }
  // Read first: a refused value leaves nothing half made.
  c.bnSplit = rt::switchedOn("PIPEC_BN_SPLIT", true,
                             "batch norm of few channels split across blocks",
                             "one block per channel");
  c.bf16Pad = rt::switchedOn(
      "PIPEC_BF16_PAD", true,
      "bfloat16 products of unaligned shapes padded to multiples of 8",
      "bfloat16 products on the tensors' own shapes");
  c.batchGather = rt::switchedOn(
      "PIPEC_BATCH_GATHER", true,
      "float32 batched products over permuted operands as one call over "
      "dense copies",
      "one call per outer batch index");
  c.pointwiseGemm =
      rt::switchedOn("PIPEC_POINTWISE_GEMM", true,
                     "1x1 convolutions as cuBLAS matrix products",
                     "1x1 convolutions on cuDNN (or im2col + cuBLAS)");
  c.cudnnBf16 = rt::switchedOn(
      "PIPEC_CUDNN_BF16", false,
      "bf16 convolutions on cuDNN with bfloat16 operands and results",
      "bf16 convolutions in TF32 on float32 tensors holding bfloat16 values");
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
        "cudaStreamCreate");
  cublasHandle_t blas = nullptr;
  checkBlas(cublasCreate(&blas), "cublasCreate");
  checkBlas(cublasSetStream(blas, stream), "cublasSetStream");
  // A workspace of its own (after cublasSetStream, which resets it): cuBLAS
  // then never allocates one inside a CUDA graph capture (--cuda-graphs),
  // and runs with and without graphs pick their GEMM algorithms alike.
  check(cudaMalloc(&c.blasWorkspace, Context::kBlasWorkspaceBytes),
        "the cuBLAS workspace");
  checkBlas(
      cublasSetWorkspace(blas, c.blasWorkspace, Context::kBlasWorkspaceBytes),
      "cublasSetWorkspace");
  // Pointer mode host: alpha/beta come from the kernels' `reals`.
  checkBlas(cublasSetPointerMode(blas, CUBLAS_POINTER_MODE_HOST),
            "cublasSetPointerMode");
  // Float32 GEMMs: CUBLAS_DEFAULT_MATH keeps float32 inputs and float32
  // accumulation (never TF32 without --allow-tf32) and lets cuBLAS pick
  // its fastest such kernels, as PyTorch does with TF32 off;
  // PIPEC_CUBLAS_MATH=pedantic asks for CUBLAS_PEDANTIC_MATH (the reference
  // arithmetic cuBLAS documents for testing, which may be slower).
  const char *mode = std::getenv("PIPEC_CUBLAS_MATH");
  const bool pedantic = mode && std::string(mode) == "pedantic";
  checkBlas(cublasSetMathMode(blas, allowTf32  ? CUBLAS_TF32_TENSOR_OP_MATH
                                    : pedantic ? CUBLAS_PEDANTIC_MATH
                                               : CUBLAS_DEFAULT_MATH),
            "cublasSetMathMode");
  c.device = device;
  c.stream = stream;
  c.blas = blas;
  c.allowTf32 = allowTf32;
  c.matmulBf16 = matmulBf16;
  c.compute = allowTf32  ? CUBLAS_COMPUTE_32F_FAST_TF32
              : pedantic ? CUBLAS_COMPUTE_32F_PEDANTIC
                         : CUBLAS_COMPUTE_32F;
}

void destroyContext(Context &c) {
  if (!c.stream)
    return;
  cudaStreamSynchronize(c.stream);
  releaseMultiTensorTables(c);
  releaseCudnn();
  if (c.scratch)
    cudaFree(c.scratch);
  if (c.bf16Staging)
    cudaFree(c.bf16Staging);
  if (c.bf16Wide)
    cudaFree(c.bf16Wide);
  c.bf16Wide = nullptr;
  c.bf16WideBytes = 0;
  cublasDestroy(c.blas);
  if (c.blasWorkspace)
    cudaFree(c.blasWorkspace);
  c.blasWorkspace = nullptr;
  cudaStreamDestroy(c.stream);
  c.device = -1;
  c.stream = nullptr;
  c.blas = nullptr;
  c.scratch = c.bf16Staging = nullptr;
  c.scratchBytes = c.bf16StagingBytes = 0;
}

/// `buffer` (of `size` bytes) grown to at least `bytes`; the old one may
/// still be read by queued kernels, so it is freed after a synchronisation.
static void *grow(Context &c, void *&buffer, size_t &size, size_t bytes,
                  const char *what) {
  if (bytes <= size)
    return buffer;
  if (buffer) {
    check(cudaStreamSynchronize(c.stream), what);
    check(cudaFree(buffer), what);
    buffer = nullptr;
    size = 0;
  }
  size_t want = bytes < (1u << 20) ? (1u << 20) : bytes;
  check(cudaMalloc(&buffer, want), what);
  size = want;
  ++c.buffersMoved;
  return buffer;
}

void *scratch(Context &c, size_t bytes) {
  return grow(c, c.scratch, c.scratchBytes, bytes, "scratch");
}

void *bf16Wide(Context &c, size_t bytes) {
  return grow(c, c.bf16Wide, c.bf16WideBytes, bytes,
              "float32 copies of bfloat16 buffers");
}

void *bf16Staging(Context &c, size_t bytes) {
  return grow(c, c.bf16Staging, c.bf16StagingBytes, bytes,
              "bfloat16 operand staging");
}

} // namespace cuda
} // namespace pipec
