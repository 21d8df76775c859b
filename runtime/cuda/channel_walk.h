//===- channel_walk.h - One channel's values, without a division each -----===//
//
// Part of pipec's CUDA runtime (batchnorm.cu). Plain C++ as well, so that
// the CPU tests check it against the division it replaces.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A channel ch of an [N, C, S] tensor holds N rows of S values at a stride
/// of C * S: its e-th value (row-major over [N, S]) is at (e / S * C + ch) *
/// S + e % S. A thread visiting e = first, first + step, ... used to compute
/// that with a 64-bit division and remainder per value, emulated in tens of
/// instructions on a GPU: enough to hold a memory-bound kernel at a third of
/// the memory's speed. The walk divides once, then advances the row and
/// column by step / S and step % S with one carry: the same values in the
/// same order, so every sum is the one the division gave, bit for bit.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CUDA_CHANNEL_WALK_H
#define PIPEC_RUNTIME_CUDA_CHANNEL_WALK_H

#include <cstdint>

#ifdef __CUDACC__
#define PIPEC_WALK_FN __host__ __device__ __forceinline__
#else
#define PIPEC_WALK_FN inline
#endif

namespace pipec {
namespace cuda {

/// Offset of the e-th value (row-major over [N, S]) of channel ch (the
/// reference the walk replaces).
PIPEC_WALK_FN int64_t channelOffset(int64_t e, int64_t ch, int64_t c,
                                    int64_t s) {
  const int64_t i = e / s;
  return (i * c + ch) * s + (e - i * s);
}

struct ChannelWalk {
  int64_t e = 0;   ///< the value's index over [N, S]
  int64_t col = 0; ///< e % s
  int64_t at = 0;  ///< the offset of value e
  int64_t step = 1, dCol = 0, dAt = 0, s = 1, wrap = 0;

  /// Value `first` of channel ch, advancing by `step` values.
  PIPEC_WALK_FN ChannelWalk(int64_t first, int64_t step_, int64_t ch, int64_t c,
                            int64_t s_)
      : e(first), step(step_), s(s_) {
    const int64_t row = first / s;
    col = first - row * s;
    at = (row * c + ch) * s + col;
    const int64_t rows = step / s;
    dCol = step - rows * s;
    dAt = rows * c * s + dCol;
    wrap = c * s - s; // a carry into the next row skips the other channels
  }
  PIPEC_WALK_FN void next() {
    e += step;
    col += dCol;
    at += dAt;
    if (col >= s) {
      col -= s;
      at += wrap;
    }
  }
};

} // namespace cuda
} // namespace pipec

#undef PIPEC_WALK_FN

#endif // PIPEC_RUNTIME_CUDA_CHANNEL_WALK_H
