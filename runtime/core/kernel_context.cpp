//===- kernel_context.cpp - Checked access to a kernel context ------------===//
//
// Part of pipec's runtime core. See core/kernel_context.h.
//
//===----------------------------------------------------------------------===//
#include "core/kernel_context.h"

#include "core/error.h"

#include <string>

pipec_kctx &pipec::rt::kernelContextOfKind(pipec_kctx *kc,
                                           pipec_kctx::Kind want,
                                           const char *kernel) {
  if (!kc)
    throw RtError(std::string(kernel) + ": no kernel context");
  if (kc->kind != want)
    throw RtError(std::string(kernel) +
                  ": called with the kernel context of another device (a " +
                  (want == pipec_kctx::Kind::Cpu ? "CPU kernel needs a CPU"
                                                 : "CUDA kernel needs a CUDA") +
                  " context)");
  return *kc;
}
