//===- registry.cpp - Kernel lookup by symbol name ------------------------===//
//
// Part of pipec. Implements pipec_rt_find_kernel (see include/pipec_rt.h).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// In-process executors (the profiler, conformance tests) call kernels by the
/// symbol name that generated code links against. The table is made from
/// include/pipec_kernels.def, the list the header's declarations come from.
///
//===----------------------------------------------------------------------===//

#include "pipec_rt.h"

#include <cstring>

namespace {

struct KernelEntry {
  const char *name;
  pipec_kernel_fn fn;
};

constexpr KernelEntry kKernels[] = {
#define PIPEC_KERNEL(sym) {#sym, &sym}, {#sym "_f64", &sym##_f64},
#define PIPEC_KERNEL_BYTES(sym) {#sym, &sym},
#include "pipec_kernels.def"
#define PIPEC_KERNEL(sym)
#define PIPEC_KERNEL_BF16(sym) {#sym "_bf16", &sym##_bf16},
#include "pipec_kernels.def"
};

} // namespace

extern "C" pipec_kernel_fn pipec_rt_find_kernel(const char *name) {
  if (!name)
    return nullptr;
  for (const KernelEntry &entry : kKernels)
    if (std::strcmp(entry.name, name) == 0)
      return entry.fn;
  return nullptr;
}
