//===- registry.cpp - CUDA kernel lookup by name --------------------------===//
//
// Part of pipec's CUDA runtime. The table comes from cuda_kernels.def.
//
//===----------------------------------------------------------------------===//
#include "cuda_rt.h"
#include "pipec_rt.h"

#include <cstring>

namespace {
struct Entry {
  const char *name;
  pipec_kernel_fn fn;
};
constexpr Entry kCudaKernels[] = {
#define PIPEC_CUDA_KERNEL(sym, nbufs) {#sym, &pipec_cuda_k_##sym},
#include "cuda_kernels.def"
#define PIPEC_MULTI_TENSOR(name, bufs, ints, firstOutput, shared)              \
  {#name "_multi", &pipec_cuda_k_##name##_multi},
#include "pipec_multi_tensor.def"
};
} // namespace

/// The CUDA twin of a kernel: `name` is "gemm", "pipec_k_gemm" or
/// "pipec_cuda_k_gemm"; NULL when it has none.
extern "C" pipec_kernel_fn pipec_cuda_find_kernel(const char *name) {
  if (!name)
    return nullptr;
  for (const char *prefix : {"pipec_cuda_k_", "pipec_k_"})
    if (std::strncmp(name, prefix, std::strlen(prefix)) == 0) {
      name += std::strlen(prefix);
      break;
    }
  for (const Entry &e : kCudaKernels)
    if (std::strcmp(e.name, name) == 0)
      return e.fn;
  return nullptr;
}
