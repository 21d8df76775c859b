//===- kernel_context.cpp - The CPU kernels' context ----------------------===//
//
// Part of pipec's CPU kernels. See cpu/kernel_context.h.
//
//===----------------------------------------------------------------------===//
#include "cpu/kernel_context.h"

namespace pipec {
namespace cpu {

KernelContext &kernelContext(pipec_kctx *kc, const char *kernel) {
  return static_cast<KernelContext &>(
      rt::kernelContextOfKind(kc, pipec_kctx::Kind::Cpu, kernel));
}

} // namespace cpu
} // namespace pipec

extern "C" pipec_kctx *pipec_rt_cpu_kernel_context_new(const pipec_kctx *like) {
  auto *kc = new pipec::cpu::KernelContext();
  kc->matmulBf16 = like && like->matmulBf16;
  return kc;
}

extern "C" void pipec_rt_cpu_kernel_context_free(pipec_kctx *kc) { delete kc; }
