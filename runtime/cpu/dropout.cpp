//===- dropout.cpp - training-mode dropout --------------------------------===//
//
// The keep decision of element e of global sample g is a hash of (seed,
// salt, g, e): every stage and microbatch split of a run draws the same
// mask, and the backward reuses the stored mask (dX = dY * Mask).
// pipec_k_dropout_f64 draws exactly the same mask (the draw and its
// comparison with the ratio do not depend on the element type); only X, Y,
// Mask and the scale 1/(1-ratio) are double there.
//
//===----------------------------------------------------------------------===//
#include "pipec_rt.h"

#include "cpu/real.h"

#include <cstdint>

namespace {
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <class T>
void dropoutKernel(void *const *bufs, const int64_t *ints,
                   const double *reals) {
  const T *x = static_cast<const T *>(bufs[0]);
  const int64_t *rng = static_cast<const int64_t *>(bufs[1]);
  T *y = static_cast<T *>(bufs[2]);
  T *mask = static_cast<T *>(bufs[3]);
  const int64_t n = ints[0], sampleElems = ints[1] > 0 ? ints[1] : 1;
  const uint64_t salt = uint64_t(ints[2]);
  const double ratio = reals ? reals[0] : 0.5;
  const T keepScale = ratio < 1 ? T(1.0 / (1.0 - ratio)) : T(0);
  const uint64_t base = mix(mix(uint64_t(rng[0])) ^ salt);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t sample = uint64_t(rng[1] + i / sampleElems);
    uint64_t h = mix(mix(base ^ sample) ^ uint64_t(i % sampleElems));
    double u = double(h >> 11) * (1.0 / 9007199254740992.0); // [0, 1)
    T m = u >= ratio ? keepScale : T(0);
    mask[i] = m;
    y[i] = x[i] * m;
  }
}
} // namespace

PIPEC_CPU_KERNEL(pipec_k_dropout, dropoutKernel)
