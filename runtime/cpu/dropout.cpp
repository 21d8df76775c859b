//===- dropout.cpp - training-mode dropout --------------------------------===//
//
// The keep decision of element e of global sample g is a hash of (seed,
// salt, g, e): every stage and microbatch split of a run draws the same
// mask, and the backward reuses the stored mask (dX = dY * Mask).
//
//===----------------------------------------------------------------------===//
#include "pipec_rt.h"

#include <cstdint>

namespace {
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
} // namespace

extern "C" void pipec_k_dropout(void *const *bufs, const int64_t *ints,
                                const double *reals) {
  const float *x = static_cast<const float *>(bufs[0]);
  const int64_t *rng = static_cast<const int64_t *>(bufs[1]);
  float *y = static_cast<float *>(bufs[2]);
  float *mask = static_cast<float *>(bufs[3]);
  const int64_t n = ints[0], sampleElems = ints[1] > 0 ? ints[1] : 1;
  const uint64_t salt = uint64_t(ints[2]);
  const double ratio = reals ? reals[0] : 0.5;
  const float keepScale = ratio < 1 ? float(1.0 / (1.0 - ratio)) : 0.0f;
  const uint64_t base = mix(mix(uint64_t(rng[0])) ^ salt);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t sample = uint64_t(rng[1] + i / sampleElems);
    uint64_t h = mix(mix(base ^ sample) ^ uint64_t(i % sampleElems));
    double u = double(h >> 11) * (1.0 / 9007199254740992.0); // [0, 1)
    float m = u >= ratio ? keepScale : 0.0f;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}
