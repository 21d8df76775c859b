//===- bf16_storage.h - The `_bf16` kernels' buffer prefix ------*- C++ -*-===//
//
// Part of pipec's runtime. Included by the CPU and CUDA kernels.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A `pipec_k_NAME_bf16` call (include/pipec_rt.h, "Bfloat16 storage")
/// starts its ints with a description of its buffers: [nbufs, s[nbufs]],
/// s[i] = 0 for a buffer as pipec_k_NAME has it, n > 0 for an input of n
/// bfloat16 values, -n for an output of n. `Bf16Buffers` reads and checks
/// it; both backends' `_bf16` kernels start there.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_BF16_STORAGE_H
#define PIPEC_RUNTIME_CORE_BF16_STORAGE_H

#include "core/error.h"

#include <cstdint>
#include <string>

namespace pipec {
namespace rt {

struct Bf16Buffers {
  /// The most buffers a `_bf16` kernel has (batch norm's 10).
  static constexpr int kMaxBuffers = 16;
  int count = 0;
  /// s[i] of the prefix.
  const int64_t *sizes = nullptr;
  /// The float32 kernel's own ints, after the prefix.
  const int64_t *rest = nullptr;

  /// Reads the prefix of `ints`; throws RtError naming `kernel` when the
  /// count is out of range, when a bf16 buffer is null, or when no buffer
  /// is bf16 (the compiler calls the float32 kernel then).
  Bf16Buffers(void *const *bufs, const int64_t *ints, const char *kernel) {
    if (!ints || ints[0] < 1 || ints[0] > kMaxBuffers)
      throw RtError(std::string(kernel) + ": the bfloat16 prefix counts " +
                    (ints ? std::to_string(ints[0]) : std::string("no")) +
                    " buffers (1 to 16)");
    count = int(ints[0]);
    sizes = ints + 1;
    rest = ints + 1 + count;
    bool any = false;
    for (int i = 0; i < count; ++i)
      if (sizes[i] != 0) {
        any = true;
        if (!bufs[i])
          throw RtError(std::string(kernel) + ": bfloat16 buffer " +
                        std::to_string(i) + " is null");
      }
    if (!any)
      throw RtError(std::string(kernel) + ": no buffer is bfloat16");
  }
  bool isInput(int i) const { return sizes[i] > 0; }
  bool isOutput(int i) const { return sizes[i] < 0; }
  int64_t elements(int i) const { return sizes[i] < 0 ? -sizes[i] : sizes[i]; }
};

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_BF16_STORAGE_H
