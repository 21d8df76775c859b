//===- bf16_storage.cpp - The `_bf16` kernels on CUDA ---------------------===//
//
// Part of pipec's CUDA runtime. Entry points pipec_cuda_k_NAME_bf16
// (include/pipec_rt.h, "Bfloat16 storage"; cuda_kernels.def).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The elementwise kernels (binary, unary, unary_grad) read and write
/// bfloat16 themselves (elementwise.cu): one pass over memory, at two
/// bytes an element where the storage is bfloat16. Every other call, and
/// the elementwise ones outside what those cover, runs the float32 twin on
/// float32 copies in the context's `bf16Wide` buffer: each bfloat16 input
/// widened into its copy, each bfloat16 output rounded from its copy (the
/// casts' kernels, gemm.cu). That computes what the twin between casts
/// does, without the casts' tensors in the arena. The CPU kernels
/// (cpu/bf16_storage.cpp) are the reference of both paths.
///
//===----------------------------------------------------------------------===//

#include "core/bf16_storage.h"
#include "cuda_rt.h"

namespace pipec {
namespace cuda {
namespace {

using NativeFn = bool (*)(Context &, void *const *, const rt::Bf16Buffers &,
                          const double *);

/// The float32 twin `twin` on float32 copies of the bfloat16 buffers.
void onWideCopies(Context &ctx, pipec_kernel_fn twin, pipec_kctx *kc,
                  void *const *bufs, const rt::Bf16Buffers &st,
                  const double *reals, const char *name) {
  constexpr size_t kAlign = 256;
  size_t offsets[rt::Bf16Buffers::kMaxBuffers] = {};
  size_t total = 0;
  for (int i = 0; i < st.count; ++i)
    if (st.sizes[i] != 0) {
      offsets[i] = total;
      total += (size_t(st.elements(i)) * sizeof(float) + kAlign - 1) /
               kAlign * kAlign;
    }
  char *wide = static_cast<char *>(bf16Wide(ctx, total));
  void *ptrs[rt::Bf16Buffers::kMaxBuffers];
  for (int i = 0; i < st.count; ++i) {
    ptrs[i] = st.sizes[i] == 0 ? bufs[i] : wide + offsets[i];
    if (st.isInput(i))
      fromBf16Storage(ctx, bufs[i], static_cast<float *>(ptrs[i]),
                      st.elements(i), name);
  }
  twin(kc, ptrs, st.rest, reals);
  for (int i = 0; i < st.count; ++i)
    if (st.isOutput(i))
      toBf16Storage(ctx, static_cast<const float *>(ptrs[i]), bufs[i],
                    st.elements(i), name);
  ++ctx.bf16Widened;
}

void run(pipec_kernel_fn twin, NativeFn native, pipec_kctx *kc,
         void *const *bufs, const int64_t *ints, const double *reals,
         const char *name) {
  Context &ctx = context(kc, name);
  rt::Bf16Buffers st(bufs, ints, name);
  if (native && native(ctx, bufs, st, reals))
    return;
  onWideCopies(ctx, twin, kc, bufs, st, reals, name);
}

} // namespace
} // namespace cuda
} // namespace pipec

#define PIPEC_CUDA_BF16(name, native)                                          \
  extern "C" void pipec_cuda_k_##name##_bf16(pipec_kctx *kc,                   \
                                             void *const *bufs,                \
                                             const int64_t *ints,              \
                                             const double *reals) {            \
    pipec::cuda::run(&pipec_cuda_k_##name, native, kc, bufs, ints, reals,      \
                     "pipec_cuda_k_" #name "_bf16");                           \
  }
PIPEC_CUDA_BF16(binary, &pipec::cuda::binaryBf16)
PIPEC_CUDA_BF16(unary, &pipec::cuda::unaryBf16)
PIPEC_CUDA_BF16(unary_grad, &pipec::cuda::unaryGradBf16)
PIPEC_CUDA_BF16(softmax, nullptr)
PIPEC_CUDA_BF16(softmax_grad, nullptr)
PIPEC_CUDA_BF16(batchnorm_train, nullptr)
PIPEC_CUDA_BF16(batchnorm_grad, nullptr)
PIPEC_CUDA_BF16(layernorm, nullptr)
PIPEC_CUDA_BF16(layernorm_grad, nullptr)
