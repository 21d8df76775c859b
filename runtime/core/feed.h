//===- feed.h - Training data: synthetic or .npy ----------------*- C++ -*-===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A `Feed` produces the microbatches of one entry of the stage
/// description's "feeds" (a model input or the labels). Sample `i` of
/// microbatch `mb` of step `t` (0-based) is global sample
///   s = t * B + mb * b + i          (B global batch, b microbatch),
/// (plus the slice's first sample with split replicas),
/// so the data does not depend on how a batch is split into microbatches or
/// on the number of stages. Sources:
///
///  - synthetic: element `e` (row-major index inside the sample) of sample
///    `s` is a function of (seed, stream, s, e) only; see syntheticBits;
///  - a `.npy` file of N rows: sample `s` is row `s mod N`.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_FEED_H
#define PIPEC_RUNTIME_CORE_FEED_H

#include "core/stage.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pipec {
namespace rt {

/// splitmix64's output function applied to x + 0x9E3779B97F4A7C15.
uint64_t splitmix64(uint64_t x);

/// The 64 random bits behind element `element` of global sample `sample` of
/// stream `stream` (0 = labels, 1 + k = model input k):
///   h = splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ stream)
///                             ^ sample) ^ element)
uint64_t syntheticBits(uint64_t seed, uint64_t stream, uint64_t sample,
                       uint64_t element);

/// Synthetic input value: (h >> 40) * 2^-23 - 1, uniform in [-1, 1) on a
/// grid of 2^-23 (exact in float).
float syntheticInput(uint64_t seed, int64_t input, uint64_t sample,
                     uint64_t element);

/// Synthetic label: h mod classes, with stream 0.
int64_t syntheticLabel(uint64_t seed, uint64_t sample, uint64_t element,
                       int64_t classes);

/// The data source of one feed.
class Feed {
public:
  /// A synthetic feed.
  Feed(FeedSpec spec, int64_t globalBatch, uint64_t seed);

  /// A feed from a .npy file; validates dtype, shape and (for labels) the
  /// class range of every value. Throws RtError naming the file.
  static Feed fromNpy(FeedSpec spec, int64_t globalBatch,
                      const std::string &path);

  const FeedSpec &spec() const { return feedSpec; }
  /// Rows in the file (0 for a synthetic feed).
  int64_t rows() const { return numRows; }

  /// Split replicas: this feed holds samples [first, first + shape[0]) of
  /// every microbatch of `microbatch` samples (default: the whole one).
  void setSlice(int64_t microbatch, int64_t first) {
    fullMicrobatch = microbatch;
    sliceFirst = first;
  }

  /// Writes microbatch `mb` of step `step` (both 0-based): spec().bytes
  /// bytes: float32 (float64 in a float64 stage) for float inputs, int64
  /// for integer inputs and labels.
  void fill(int64_t step, int64_t mb, void *dst) const;

private:
  Feed(FeedSpec spec, int64_t globalBatch);

  FeedSpec feedSpec;
  int64_t globalBatch;
  int64_t fullMicrobatch = 0, sliceFirst = 0;
  uint64_t seed = 0;
  bool synthetic = true;
  int64_t numRows = 0;
  std::vector<float> floats;
  std::vector<double> doubles; ///< float inputs of a float64 stage
  std::vector<int64_t> ints;
};

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_FEED_H
