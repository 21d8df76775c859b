//===- kernel_context.h - The C ABI's pipec_kctx, defined -------*- C++ -*-===//
//
// Part of pipec's runtime. Included by the kernels and the devices; never
// by generated code, which sees pipec_kctx as an opaque pointer.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Every kernel gets the stage's kernel context as its first argument
/// (include/pipec_rt.h, ABI 3). Each device kind derives its own context
/// from this base: cpu::KernelContext (cpu/kernel_context.h) and
/// cuda::Context (cuda/cuda_rt.h). A kernel converts the pointer it gets
/// with its backend's checked accessor, which refuses a null context or
/// one of another kind with an RtError naming the kernel.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_KERNEL_CONTEXT_H
#define PIPEC_RUNTIME_CORE_KERNEL_CONTEXT_H

#include "pipec_rt.h"

struct pipec_kctx {
  enum class Kind { Cpu, Cuda };
  explicit pipec_kctx(Kind k) : kind(k) {}
  pipec_kctx(const pipec_kctx &) = delete;
  pipec_kctx &operator=(const pipec_kctx &) = delete;
  virtual ~pipec_kctx() = default;
  const Kind kind;
  /// A `--precision bf16` stage: every float32 matrix product (GEMM,
  /// batched MatMul, convolution) first rounds its operands to the nearest
  /// bfloat16 (ties to even) and multiplies those exactly with float32
  /// accumulation. Both backends honour it, so the CPU kernels are the
  /// reference of the CUDA ones in bf16 too.
  bool matmulBf16 = false;
};

namespace pipec {
namespace rt {

/// `kc` when it is a context of kind `want`; throws RtError naming
/// `kernel` when it is null or of another kind (the backends' checked
/// accessors build on it).
pipec_kctx &kernelContextOfKind(pipec_kctx *kc, pipec_kctx::Kind want,
                                const char *kernel);

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_KERNEL_CONTEXT_H
