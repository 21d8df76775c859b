//===- core_feed_test.cpp - Synthetic data
//---------------------------------===//
//
// Part of pipec's runtime tests. The synthetic data must be a function of
// (seed, global sample, element) only, so that runs with any stage and
// microbatch split see the same samples.
//
//===----------------------------------------------------------------------===//

#include "core/device.h"
#include "core/error.h"
#include "core/feed.h"
#include "core/feed_prefetch.h"
#include "core_test_util.h"
#include "pipec/formats/npy.h"

#include <gtest/gtest.h>

#include <set>

using namespace pipec;
using namespace pipec::rt;

namespace {

FeedSpec inputSpec(int64_t b, std::vector<int64_t> sampleDims, int64_t index) {
  FeedSpec s;
  s.kind = FeedSpec::Kind::Input;
  s.name = "x";
  s.index = index;
  s.shape = {b};
  s.shape.insert(s.shape.end(), sampleDims.begin(), sampleDims.end());
  for (int64_t d : sampleDims)
    s.sampleElems *= d;
  s.bytes = b * s.sampleElems * 4;
  return s;
}

FeedSpec labelSpec(int64_t b, int64_t classes) {
  FeedSpec s;
  s.kind = FeedSpec::Kind::Labels;
  s.name = "y";
  s.shape = {b};
  s.classes = classes;
  s.bytes = b * 8;
  return s;
}

/// The whole global batch of step `step`, assembled from microbatches of
/// size b.
template <typename T>
std::vector<T> globalBatch(const Feed &feed, int64_t step, int64_t B) {
  int64_t b = feed.spec().shape[0], n = feed.spec().sampleElems;
  std::vector<T> out(size_t(B * n));
  for (int64_t mb = 0; mb < B / b; ++mb)
    feed.fill(step, mb, out.data() + mb * b * n);
  return out;
}

} // namespace

TEST(CoreSyntheticData, Splitmix64MatchesTheReferenceSequence) {
  // splitmix64 with state 0: the first two outputs of Vigna's reference
  // generator (state += 0x9E3779B97F4A7C15 before each output).
  EXPECT_EQ(splitmix64(0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(splitmix64(0x9E3779B97F4A7C15ull), 0x6E789E6AA1B965F4ull);
}

TEST(CoreSyntheticData, FollowsTheDocumentedFormula) {
  // README: h = mix(mix(mix(mix(seed) ^ stream) ^ sample) ^ element),
  // input = (h >> 40) * 2^-23 - 1 with stream 1 + k; label = h mod C, stream 0.
  uint64_t seed = 42, sample = 1234, element = 5;
  uint64_t h = splitmix64(
      splitmix64(splitmix64(splitmix64(seed) ^ 2) ^ sample) ^ element);
  EXPECT_EQ(syntheticInput(seed, 1, sample, element),
            float(double(h >> 40) / 8388608.0 - 1.0));
  uint64_t hl = splitmix64(
      splitmix64(splitmix64(splitmix64(seed) ^ 0) ^ sample) ^ element);
  EXPECT_EQ(syntheticLabel(seed, sample, element, 10), int64_t(hl % 10));

  // A feed's microbatches use exactly these functions: labels of [b, 3]
  // (element = index inside the sample) and inputs of model input 1.
  FeedSpec labels = labelSpec(2, 10);
  labels.shape = {2, 3};
  labels.sampleElems = 3;
  labels.bytes = 48;
  int64_t y[6];
  Feed(labels, 4, seed).fill(5, 1, y); // samples 22, 23
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(y[i], syntheticLabel(seed, 22 + i / 3, i % 3, 10));
  float x[2 * 5];
  Feed(inputSpec(2, {5}, 1), 4, seed).fill(5, 1, x);
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(x[i], syntheticInput(seed, 1, 22 + i / 5, i % 5));
}

TEST(CoreSyntheticData, IsDeterministicAndSeedDependent) {
  Feed a(inputSpec(4, {3, 2}, 0), 8, 7), b(inputSpec(4, {3, 2}, 0), 8, 7),
      c(inputSpec(4, {3, 2}, 0), 8, 8), d(inputSpec(4, {3, 2}, 1), 8, 7);
  auto va = globalBatch<float>(a, 3, 8), vb = globalBatch<float>(b, 3, 8),
       vc = globalBatch<float>(c, 3, 8), vd = globalBatch<float>(d, 3, 8);
  EXPECT_EQ(va, vb);
  EXPECT_NE(va, vc);
  EXPECT_NE(va, vd); // model inputs are independent streams
  EXPECT_NE(va, globalBatch<float>(a, 4, 8)); // steps differ
  for (float v : va) {
    EXPECT_GE(v, -1.0f);
    EXPECT_LT(v, 1.0f);
  }
  // Sample i of step t is global sample t * B + i, element e at i * n + e.
  EXPECT_EQ(va[2 * 6 + 5], syntheticInput(7, 0, 3 * 8 + 2, 5));
}

TEST(CoreSyntheticData, IsIndependentOfTheMicrobatchSplit) {
  const int64_t B = 12;
  for (int64_t step : {0, 1, 5}) {
    auto whole = globalBatch<float>(Feed(inputSpec(12, {5}, 0), B, 3), step, B);
    for (int64_t b : {1, 2, 3, 4, 6})
      EXPECT_EQ(globalBatch<float>(Feed(inputSpec(b, {5}, 0), B, 3), step, B),
                whole)
          << "microbatch " << b << " step " << step;
    auto labels = globalBatch<int64_t>(Feed(labelSpec(12, 10), B, 3), step, B);
    for (int64_t b : {1, 4, 6})
      EXPECT_EQ(globalBatch<int64_t>(Feed(labelSpec(b, 10), B, 3), step, B),
                labels);
  }
  // Steps of a smaller global batch walk the same sample sequence: samples
  // 12..15 are step 3 of B = 4 and step 1, microbatch 1 of B = 8, b = 4.
  std::vector<float> x(20), y(20);
  Feed(inputSpec(4, {5}, 0), 4, 3).fill(3, 0, x.data());
  Feed(inputSpec(4, {5}, 0), 8, 3).fill(1, 1, y.data());
  EXPECT_EQ(x, y);
}

TEST(CoreSyntheticData, SplitReplicaSlicesTileTheMicrobatch) {
  // A microbatch of 7 samples over 3 replicas (2, 2, 3 samples): the slices
  // side by side are the unsplit microbatch, inputs and labels.
  const int64_t B = 14, b = 7;
  for (int64_t mb : {0, 1}) {
    std::vector<float> whole(size_t(b * 5)), tiled(size_t(b * 5));
    std::vector<int64_t> wholeY(static_cast<size_t>(b)),
        tiledY(static_cast<size_t>(b));
    Feed(inputSpec(b, {5}, 0), B, 3).fill(2, mb, whole.data());
    Feed(labelSpec(b, 10), B, 3).fill(2, mb, wholeY.data());
    for (int64_t j = 0; j < 3; ++j) {
      int64_t first = j * b / 3, size = (j + 1) * b / 3 - first;
      Feed x(inputSpec(size, {5}, 0), B, 3), y(labelSpec(size, 10), B, 3);
      x.setSlice(b, first);
      y.setSlice(b, first);
      x.fill(2, mb, tiled.data() + first * 5);
      y.fill(2, mb, tiledY.data() + first);
    }
    EXPECT_EQ(tiled, whole) << "microbatch " << mb;
    EXPECT_EQ(tiledY, wholeY) << "microbatch " << mb;
  }
}

TEST(CoreSyntheticData, LabelsCoverTheClasses) {
  Feed f(labelSpec(50, 7), 50, 0);
  std::set<int64_t> seen;
  for (int64_t step = 0; step < 4; ++step)
    for (int64_t v : globalBatch<int64_t>(f, step, 50)) {
      EXPECT_GE(v, 0);
      EXPECT_LT(v, 7);
      seen.insert(v);
    }
  EXPECT_EQ(seen.size(), 7u);
}

TEST(CoreSyntheticData, FileFeedsAreIndependentOfTheMicrobatchSplitToo) {
  coretest::TempDir tmp;
  std::vector<float> rows(7 * 3);
  for (size_t i = 0; i < rows.size(); ++i)
    rows[i] = float(i);
  std::string error;
  ASSERT_TRUE(npy::writeFile(tmp / "x.npy", "<f4", {7, 3}, rows.data(),
                             rows.size() * 4, error));
  const int64_t B = 4;
  auto whole = globalBatch<float>(
      Feed::fromNpy(inputSpec(4, {3}, 0), B, tmp / "x.npy"), 2, B);
  for (int64_t b : {1, 2})
    EXPECT_EQ(globalBatch<float>(
                  Feed::fromNpy(inputSpec(b, {3}, 0), B, tmp / "x.npy"), 2, B),
              whole);
  // Step 2 holds samples 8..11 = rows 1..4 of the 7-row file.
  EXPECT_EQ(whole[0], 3.0f);
  EXPECT_EQ(whole.back(), 14.0f);
}

TEST(CoreFileFeed, LabelsOfFlattenedOutputsAreReadPerSample) {
  // A model with [B*T, V] logits takes labels [B, T]; a flat [rows*T] file
  // holds the same labels sample after sample.
  coretest::TempDir tmp;
  const int64_t T = 4, rows = 6;
  std::vector<int64_t> labels(size_t(rows * T));
  for (size_t i = 0; i < labels.size(); ++i)
    labels[i] = int64_t(i % 5);
  std::string error;
  ASSERT_TRUE(npy::writeFile(tmp / "y2d.npy", "<i8", {rows, T}, labels.data(),
                             labels.size() * 8, error));
  ASSERT_TRUE(npy::writeFile(tmp / "yflat.npy", "<i8", {rows * T},
                             labels.data(), labels.size() * 8, error));
  FeedSpec spec = labelSpec(2, 5);
  spec.shape = {2, T};
  spec.sampleElems = T;
  spec.bytes = 2 * T * 8;
  const int64_t B = 4;
  auto flat = globalBatch<int64_t>(Feed::fromNpy(spec, B, tmp / "yflat.npy"), 1, B);
  EXPECT_EQ(flat, globalBatch<int64_t>(Feed::fromNpy(spec, B, tmp / "y2d.npy"), 1, B));
  // Step 1 holds samples 4..7 = rows 4, 5, 0, 1 of the 6-row file.
  EXPECT_EQ(flat[0], int64_t((4 * T) % 5));
  // So does a [rows, 2, 2] file (a segmentation model's [B, H, W] labels
  // for its [B*H*W, C] output).
  ASSERT_TRUE(npy::writeFile(tmp / "y3d.npy", "<i8", {rows, 2, 2},
                             labels.data(), labels.size() * 8, error));
  EXPECT_EQ(globalBatch<int64_t>(Feed::fromNpy(spec, B, tmp / "y3d.npy"), 1, B),
            flat);
  // A flat file whose length is not a multiple of T is refused.
  ASSERT_TRUE(npy::writeFile(tmp / "yodd.npy", "<i8", {rows * T - 1},
                             labels.data(), (labels.size() - 1) * 8, error));
  EXPECT_THROW(Feed::fromNpy(spec, B, tmp / "yodd.npy"), RtError);
}

// The feed prefetcher (feed_prefetch.h) on the CPU device: its buffers are
// plain memory and its copies and fences run at once, so each request's
// bytes must be Feed::fill's, whichever way they were filled, and the
// requests of a repeating order must come from microbatches filled ahead.
namespace {

struct PrefetchRun {
  std::unique_ptr<Device> device = makeCpuDevice(DeviceRequest());
  std::vector<Feed> feeds;
  PrefetchRun() {
    feeds.emplace_back(inputSpec(3, {5, 7}, 0), 12, 42);
    feeds.emplace_back(labelSpec(3, 10), 12, 42);
  }
  /// Asks for (step, mb) of both feeds; checks the bytes.
  void request(FeedPrefetcher &p, int64_t step, int64_t mb) {
    for (size_t i = 0; i < feeds.size(); ++i) {
      const int64_t bytes = feeds[i].spec().bytes;
      std::vector<char> got(size_t(bytes), 0x55);
      std::vector<char> want(size_t(bytes), 0);
      p.feed(i, step, mb, got.data());
      feeds[i].fill(step, mb, want.data());
      ASSERT_EQ(got, want) << "feed " << i << " step " << step << " mb " << mb;
    }
    p.settle();
  }
};

} // namespace

TEST(CoreFeedPrefetch, InOrderMicrobatchesComeFilledAhead) {
  PrefetchRun run;
  FeedPrefetcher p(*run.device, run.feeds, 4);
  for (int64_t step = 0; step < 3; ++step)
    for (int64_t mb = 0; mb < 4; ++mb)
      run.request(p, step, mb);
  // Only the very first request of each feed was not foreseen.
  EXPECT_EQ(p.filledOnTheSpot(), 2);
  EXPECT_EQ(p.prefetched(), 2 * 12 - 2);
}

TEST(CoreFeedPrefetch, AReplicasOrderIsLearnedInItsFirstStep) {
  // Round-robin replica 1 of 2 takes microbatches 1 and 3 of 4.
  PrefetchRun run;
  FeedPrefetcher p(*run.device, run.feeds, 4);
  for (int64_t step = 5; step < 9; ++step)
    for (int64_t mb : {1, 3})
      run.request(p, step, mb);
  // Step 5: 1 (not foreseen), 3 (2 was guessed); step 6's 1 (4 guessed);
  // from then on every request was foreseen.
  EXPECT_EQ(p.filledOnTheSpot(), 2 * 3);
  EXPECT_EQ(p.prefetched(), 2 * (8 - 3));
}

TEST(CoreFeedPrefetch, UnforeseenRequestsStillGetTheirBytes) {
  PrefetchRun run;
  FeedPrefetcher p(*run.device, run.feeds, 4);
  for (int64_t step = 0; step < 2; ++step)
    for (int64_t mb = 0; mb < 4; ++mb)
      run.request(p, step, mb);
  // Out of the learned order: repeats, jumps back, another step.
  for (auto [step, mb] : std::vector<std::pair<int64_t, int64_t>>{
           {2, 2}, {2, 2}, {2, 0}, {7, 3}, {3, 1}, {3, 2}, {3, 3}, {4, 0}})
    run.request(p, step, mb);
  EXPECT_GT(p.filledOnTheSpot(), 2);
  EXPECT_GT(p.prefetched(), 0);
}

TEST(CoreFeedPrefetch, StopsForTheFatalPath) {
  // fatal() asks the prefetcher (through ErrorLocation::stopThreads) to be
  // idle before the process ends; the hook lives as long as it does.
  PrefetchRun run;
  {
    FeedPrefetcher p(*run.device, run.feeds, 4);
    run.request(p, 0, 0);
    ASSERT_TRUE(bool(errorLocation().stopThreads));
    EXPECT_TRUE(errorLocation().stopThreads());
  }
  EXPECT_FALSE(bool(errorLocation().stopThreads));
}
