//===- registry.cpp - Kernel lookup by symbol name ------------------------===//
//
// Part of pipec. Implements pipec_rt_find_kernel (see include/pipec_rt.h).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// In-process executors (the profiler, conformance tests) call kernels by the
/// symbol name that generated code links against. The table below lists
/// every `pipec_k_*` entry point of the ABI; keep it in sync with the header.
///
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"

#include <cstring>

namespace {

struct KernelEntry {
  const char *name;
  pipec_kernel_fn fn;
};

#define PIPEC_KERNEL_ENTRY(sym)                                                \
  { #sym, &sym }
constexpr KernelEntry kKernels[] = {
    PIPEC_KERNEL_ENTRY(pipec_k_gemm),
    PIPEC_KERNEL_ENTRY(pipec_k_batch_matmul),
    PIPEC_KERNEL_ENTRY(pipec_k_binary),
    PIPEC_KERNEL_ENTRY(pipec_k_unary),
    PIPEC_KERNEL_ENTRY(pipec_k_unary_grad),
    PIPEC_KERNEL_ENTRY(pipec_k_softmax),
    PIPEC_KERNEL_ENTRY(pipec_k_softmax_grad),
    PIPEC_KERNEL_ENTRY(pipec_k_binary_grad),
    PIPEC_KERNEL_ENTRY(pipec_k_broadcast),
    PIPEC_KERNEL_ENTRY(pipec_k_strided_copy),
    PIPEC_KERNEL_ENTRY(pipec_k_conv2d),
    PIPEC_KERNEL_ENTRY(pipec_k_conv2d_grad_input),
    PIPEC_KERNEL_ENTRY(pipec_k_conv2d_grad_weight),
    PIPEC_KERNEL_ENTRY(pipec_k_maxpool2d),
    PIPEC_KERNEL_ENTRY(pipec_k_maxpool2d_grad),
    PIPEC_KERNEL_ENTRY(pipec_k_avgpool2d),
    PIPEC_KERNEL_ENTRY(pipec_k_avgpool2d_grad),
    PIPEC_KERNEL_ENTRY(pipec_k_resize_linear),
    PIPEC_KERNEL_ENTRY(pipec_k_resize_linear_grad),
    PIPEC_KERNEL_ENTRY(pipec_k_batchnorm_train),
    PIPEC_KERNEL_ENTRY(pipec_k_batchnorm_infer),
    PIPEC_KERNEL_ENTRY(pipec_k_batchnorm_grad),
    PIPEC_KERNEL_ENTRY(pipec_k_layernorm),
    PIPEC_KERNEL_ENTRY(pipec_k_layernorm_grad),
    PIPEC_KERNEL_ENTRY(pipec_k_gather),
    PIPEC_KERNEL_ENTRY(pipec_k_gather_grad),
    PIPEC_KERNEL_ENTRY(pipec_k_reduce_sum),
    PIPEC_KERNEL_ENTRY(pipec_k_transpose),
    PIPEC_KERNEL_ENTRY(pipec_k_copy),
    PIPEC_KERNEL_ENTRY(pipec_k_fill),
    PIPEC_KERNEL_ENTRY(pipec_k_sce_loss),
    PIPEC_KERNEL_ENTRY(pipec_k_sce_loss_grad),
    PIPEC_KERNEL_ENTRY(pipec_k_sgd),
    PIPEC_KERNEL_ENTRY(pipec_k_momentum),
    PIPEC_KERNEL_ENTRY(pipec_k_adam),
    PIPEC_KERNEL_ENTRY(pipec_k_adagrad),
    PIPEC_KERNEL_ENTRY(pipec_k_dropout),
    PIPEC_KERNEL_ENTRY(pipec_k_compare),
    PIPEC_KERNEL_ENTRY(pipec_k_where),
    PIPEC_KERNEL_ENTRY(pipec_k_cast),
};
#undef PIPEC_KERNEL_ENTRY

} // namespace

extern "C" pipec_kernel_fn pipec_rt_find_kernel(const char *name) {
  if (!name)
    return nullptr;
  for (const KernelEntry &entry : kKernels)
    if (std::strcmp(entry.name, name) == 0)
      return entry.fn;
  return nullptr;
}
