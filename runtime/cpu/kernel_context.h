//===- kernel_context.h - The CPU kernels' context --------------*- C++ -*-===//
//
// Part of pipec's CPU kernels (not part of the C ABI).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// What a CPU kernel gets through its `pipec_kctx *` (ABI 3): the stage's
/// matrix-product arithmetic and the working memory kernels reuse from
/// call to call (im2col patches, bfloat16-rounded operands), so steady
/// state allocates nothing and two contexts (two stages in one process, a
/// test beside a profiler) never share buffers. The CPU device owns the
/// context of a stage executable; pipec_rt_cpu_kernel_context_new makes one
/// for other callers. A context is used by one thread at a time.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CPU_KERNEL_CONTEXT_H
#define PIPEC_RUNTIME_CPU_KERNEL_CONTEXT_H

#include "core/kernel_context.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pipec {
namespace cpu {

struct KernelContext : pipec_kctx {
  KernelContext() : pipec_kctx(Kind::Cpu) {}
  /// The bfloat16-rounded copies of a product's two operands.
  std::vector<float> bf16A, bf16B;
  /// The float32 copies of a `_bf16` kernel's bfloat16 buffers, one per
  /// buffer index (cpu/bf16_storage.cpp).
  std::vector<std::vector<float>> bf16Wide;

  /// At least `n` elements of T of kernel working memory (contents
  /// undefined; valid until the next call on this context).
  template <class T> T *scratch(int64_t n) {
    size_t words = (size_t(n > 0 ? n : 1) * sizeof(T) + sizeof(double) - 1) /
                   sizeof(double);
    if (scratch_.size() < words)
      scratch_.resize(words);
    return reinterpret_cast<T *>(scratch_.data());
  }

private:
  std::vector<double> scratch_;
};

/// `kc` as a CPU context; throws RtError naming `kernel` when it is null or
/// belongs to another device.
KernelContext &kernelContext(pipec_kctx *kc, const char *kernel);

} // namespace cpu
} // namespace pipec

#endif // PIPEC_RUNTIME_CPU_KERNEL_CONTEXT_H
