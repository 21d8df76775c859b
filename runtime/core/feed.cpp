//===- feed.cpp - Training data: synthetic or .npy ------------------------===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//

#include "core/feed.h"

#include "core/error.h"
#include "pipec/formats/npy.h"

#include <cstring>

namespace pipec {
namespace rt {
namespace {

std::string shapeString(const std::vector<int64_t> &shape, size_t from = 0) {
  std::string s = "[";
  for (size_t i = from; i < shape.size(); ++i)
    s += (i > from ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

} // namespace

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t syntheticBits(uint64_t seed, uint64_t stream, uint64_t sample,
                       uint64_t element) {
  uint64_t h = splitmix64(splitmix64(seed) ^ stream);
  h = splitmix64(h ^ sample);
  return splitmix64(h ^ element);
}

float syntheticInput(uint64_t seed, int64_t input, uint64_t sample,
                     uint64_t element) {
  uint64_t h = syntheticBits(seed, uint64_t(input) + 1, sample, element);
  return float(double(h >> 40) * (1.0 / 8388608.0) - 1.0);
}

int64_t syntheticLabel(uint64_t seed, uint64_t sample, uint64_t element,
                       int64_t classes) {
  return int64_t(syntheticBits(seed, 0, sample, element) % uint64_t(classes));
}

Feed::Feed(FeedSpec spec, int64_t globalBatch)
    : feedSpec(std::move(spec)), globalBatch(globalBatch) {}

Feed::Feed(FeedSpec spec, int64_t globalBatch, uint64_t seed)
    : Feed(std::move(spec), globalBatch) {
  this->seed = seed;
}

Feed Feed::fromNpy(FeedSpec spec, int64_t globalBatch,
                   const std::string &path) {
  Feed feed(std::move(spec), globalBatch);
  feed.synthetic = false;
  const FeedSpec &s = feed.feedSpec;
  bool labels = s.kind == FeedSpec::Kind::Labels;
  std::string what = std::string(labels ? "labels" : "input") + " file '" +
                     path + "' (feed '" + s.name + "')";
  npy::Array array;
  std::string error;
  if (!npy::readFile(path, array, error))
    throw RtError(error);
  const bool isInt = s.isInt || labels;
  bool converted = isInt               ? npy::toInt64(array, feed.ints, error)
                   : s.realBytes == 8 ? npy::toFloat64(array, feed.doubles, error)
                                      : npy::toFloat32(array, feed.floats, error);
  if (!converted)
    throw RtError(what + ": " + error);
  // Labels of a model whose output flattens samples and positions ([B*T,
  // V] logits of a language model, [B*H*W, C] of a segmentation model)
  // may come in any per-sample shape with the same number of labels
  // ([B, H, W] for [B, H*W]), or flat, [rows*T], as the output itself:
  // each sample's labels are contiguous, so they are read as [rows, ...].
  if (labels && s.shape.size() > 1 && s.sampleElems > 0 &&
      !array.shape.empty()) {
    int64_t perSample = 1;
    for (size_t i = 1; i < array.shape.size(); ++i)
      perSample *= array.shape[i];
    int64_t rows = array.shape.size() == 1
                       ? (array.shape[0] % s.sampleElems == 0
                              ? array.shape[0] / s.sampleElems
                              : -1)
                       : (perSample == s.sampleElems ? array.shape[0] : -1);
    if (rows >= 0) {
      array.shape = {rows};
      array.shape.insert(array.shape.end(), s.shape.begin() + 1, s.shape.end());
    }
  }
  bool shapeOk = array.shape.size() == s.shape.size() && !array.shape.empty() &&
                 array.shape[0] > 0;
  for (size_t i = 1; shapeOk && i < s.shape.size(); ++i)
    shapeOk = array.shape[i] == s.shape[i];
  if (!shapeOk)
    throw RtError(what + " has shape " + shapeString(array.shape) +
                  " but the model needs [N" + (s.shape.size() > 1 ? ", " : "") +
                  shapeString(s.shape, 1).substr(1) + " with N >= 1");
  feed.numRows = array.shape[0];
  if (isInt) {
    for (size_t i = 0; i < feed.ints.size(); ++i) {
      int64_t v = feed.ints[i];
      if (v < 0 || v >= s.classes)
        throw RtError(what + ": row " +
                      std::to_string(int64_t(i) / s.sampleElems) + " has " +
                      (labels ? "label " : "value ") + std::to_string(v) +
                      " outside [0, " + std::to_string(s.classes) + ")");
    }
  }
  return feed;
}

void Feed::fill(int64_t step, int64_t mb, void *dst) const {
  const int64_t b = feedSpec.shape[0], n = feedSpec.sampleElems;
  const int64_t full = fullMicrobatch > 0 ? fullMicrobatch : b;
  const bool labels = feedSpec.kind == FeedSpec::Kind::Labels;
  const bool isInt = feedSpec.isInt || labels;
  for (int64_t i = 0; i < b; ++i) {
    // Global sample index: t * B + mb * b + (slice first) + i.
    uint64_t sample = uint64_t(step) * uint64_t(globalBatch) +
                      uint64_t(mb) * uint64_t(full) + uint64_t(sliceFirst) +
                      uint64_t(i);
    if (synthetic) {
      // syntheticBits with the per-sample prefix hoisted out of the loop.
      uint64_t stream = labels ? 0 : uint64_t(feedSpec.index) + 1;
      uint64_t prefix =
          splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ sample);
      if (isInt) {
        int64_t *out = static_cast<int64_t *>(dst) + i * n;
        for (int64_t e = 0; e < n; ++e)
          out[e] = int64_t(splitmix64(prefix ^ uint64_t(e)) %
                           uint64_t(feedSpec.classes));
      } else if (feedSpec.realBytes == 8) {
        // The same values as the float32 feed (exactly representable).
        double *out = static_cast<double *>(dst) + i * n;
        for (int64_t e = 0; e < n; ++e)
          out[e] = double(float(double(splitmix64(prefix ^ uint64_t(e)) >> 40) *
                                    (1.0 / 8388608.0) -
                                1.0));
      } else {
        float *out = static_cast<float *>(dst) + i * n;
        for (int64_t e = 0; e < n; ++e)
          out[e] = float(double(splitmix64(prefix ^ uint64_t(e)) >> 40) *
                             (1.0 / 8388608.0) -
                         1.0);
      }
      continue;
    }
    int64_t row = int64_t(sample % uint64_t(numRows));
    if (isInt)
      std::memcpy(static_cast<int64_t *>(dst) + i * n, ints.data() + row * n,
                  size_t(n) * sizeof(int64_t));
    else if (feedSpec.realBytes == 8)
      std::memcpy(static_cast<double *>(dst) + i * n, doubles.data() + row * n,
                  size_t(n) * sizeof(double));
    else
      std::memcpy(static_cast<float *>(dst) + i * n, floats.data() + row * n,
                  size_t(n) * sizeof(float));
  }
}

} // namespace rt
} // namespace pipec
