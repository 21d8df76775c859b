//===- bf16_storage.cpp - The `_bf16` kernels on the CPU ------------------===//
//
// Part of pipec. CPU kernels behind pipec_k_NAME_bf16 (include/pipec_rt.h,
// "Bfloat16 storage"), one for each PIPEC_KERNEL_BF16 line of
// include/pipec_kernels.def.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The CPU defines the numbers of bfloat16 storage, so its `_bf16` kernels
/// are the float32 kernels between casts, literally: each bfloat16 input is
/// widened into a float32 copy, the float32 kernel runs on the copies, and
/// each bfloat16 output is rounded from its float32 copy with the casts'
/// rounding (cpu/real.h, bf16Bits). The copies live in the kernel context
/// and are reused call after call; they are not part of the stage's arena,
/// which holds the bfloat16 tensors only. (The CUDA kernels read and write
/// bfloat16 themselves where that saves passes over memory; they are
/// checked against these.)
///
//===----------------------------------------------------------------------===//

#include "core/bf16_storage.h"
#include "cpu/kernel_context.h"
#include "cpu/real.h"

#include "pipec_rt.h"

namespace {

using pipec::cpu::KernelContext;

void withBf16Storage(pipec_kernel_fn kernel, pipec_kctx *kc, void *const *bufs,
                     const int64_t *ints, const double *reals,
                     const char *name) {
  KernelContext &ctx = pipec::cpu::kernelContext(kc, name);
  pipec::rt::Bf16Buffers b(bufs, ints, name);
  if (ctx.bf16Wide.size() < size_t(b.count))
    ctx.bf16Wide.resize(size_t(b.count));
  void *wide[pipec::rt::Bf16Buffers::kMaxBuffers];
  for (int i = 0; i < b.count; ++i) {
    wide[i] = bufs[i];
    if (b.sizes[i] == 0)
      continue;
    const int64_t n = b.elements(i);
    std::vector<float> &w = ctx.bf16Wide[size_t(i)];
    if (w.size() < size_t(n))
      w.resize(size_t(n));
    if (b.isInput(i)) {
      const uint16_t *x = static_cast<const uint16_t *>(bufs[i]);
      for (int64_t k = 0; k < n; ++k)
        w[size_t(k)] = pipec::cpu::fromBf16Bits(x[k]);
    }
    wide[i] = w.data();
  }
  kernel(kc, wide, b.rest, reals);
  for (int i = 0; i < b.count; ++i) {
    if (!b.isOutput(i))
      continue;
    const std::vector<float> &w = ctx.bf16Wide[size_t(i)];
    uint16_t *y = static_cast<uint16_t *>(bufs[i]);
    for (int64_t k = 0, n = b.elements(i); k < n; ++k)
      y[k] = pipec::cpu::bf16Bits(w[size_t(k)]);
  }
}

} // namespace

#define PIPEC_KERNEL(sym)
#define PIPEC_KERNEL_BF16(sym)                                                 \
  extern "C" void sym##_bf16(pipec_kctx *kc, void *const *bufs,                \
                             const int64_t *ints, const double *reals) {       \
    withBf16Storage(&sym, kc, bufs, ints, reals, #sym "_bf16");                \
  }
#include "pipec_kernels.def"
