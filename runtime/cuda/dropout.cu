//===- dropout.cu - Training-mode dropout ---------------------------------===//
//
// Part of pipec's CUDA runtime. CUDA twin of pipec_k_dropout (see
// include/pipec_rt.h for the parameter layout and cpu/dropout.cpp for the
// reference).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// One thread per element draws the CPU's keep decision: the same 64-bit
/// hash of (seed, salt, global sample rng[1] + i / sampleElems, element
/// i % sampleElems), the same 53-bit uniform in [0, 1) compared in double
/// with the ratio, so Mask (0 or float(1 / (1 - ratio))) agrees with the CPU
/// bit for bit, and Y = X * Mask is one float product. rng is a device
/// buffer of two int64 (seed, index of the microbatch's first sample), read
/// inside the kernel. Y may alias X.
///
//===----------------------------------------------------------------------===//

#include "cuda_rt.h"
#include "pipec_rt.h"
#include "strided.cuh"

#include <cstdint>

namespace pipec {
namespace cuda {
namespace {

constexpr int kBlock = 256;

/// The CPU's 64-bit finaliser (SplitMix64), operation for operation.
__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void dropoutKernel(const float *x, const int64_t *rng, float *y,
                              float *mask, int64_t n, int64_t sampleElems,
                              uint64_t salt, double ratio, float keepScale) {
  const uint64_t base = mix(mix(uint64_t(rng[0])) ^ salt);
  const int64_t firstSample = rng[1];
  for (int64_t i = gridStart(); i < n; i += gridStep()) {
    const int64_t inSample = i / sampleElems;
    const uint64_t sample = uint64_t(firstSample + inSample);
    const uint64_t h =
        mix(mix(base ^ sample) ^ uint64_t(i - inSample * sampleElems));
    const double u = double(h >> 11) * (1.0 / 9007199254740992.0); // [0, 1)
    const float m = u >= ratio ? keepScale : 0.0f;
    mask[i] = m;
    y[i] = __fmul_rn(x[i], m);
  }
}

} // namespace
} // namespace cuda
} // namespace pipec

using namespace pipec::cuda;

extern "C" void pipec_cuda_k_dropout(pipec_kctx *kc, void *const *bufs,
                                     const int64_t *ints, const double *reals) {
  Context &ctx = context(kc, "pipec_cuda_k_dropout");
  const float *x = static_cast<const float *>(bufs[0]);
  const int64_t *rng = static_cast<const int64_t *>(bufs[1]);
  float *y = static_cast<float *>(bufs[2]);
  float *mask = static_cast<float *>(bufs[3]);
  const int64_t n = ints[0], sampleElems = ints[1] > 0 ? ints[1] : 1;
  const uint64_t salt = uint64_t(ints[2]);
  const double ratio = reals ? reals[0] : 0.5;
  const float keepScale = ratio < 1 ? float(1.0 / (1.0 - ratio)) : 0.0f;
  if (n <= 0)
    return;
  dropoutKernel<<<gridFor(n, kBlock), kBlock, 0, ctx.stream>>>(
      x, rng, y, mask, n, sampleElems, salt, ratio, keepScale);
  checkLaunch("pipec_cuda_k_dropout");
}
