//===- core_versions_test.cpp - Weight versions against the formulas ------===//
//
// Part of pipec's runtime tests. Drives runtime/core/versions.h through the
// order in which a continuous schedule runs a stage (the program is one
// window of pairs {F(j), B(j - w)}, w = p - s - 1 on stage s of p, or
// K - 1 for a replica of a 1F1B-RR stage that keeps K in flight) with an
// update where the schedule updates. The "weights" are one int64 holding
// the number of updates applied, so the pointer a forward or backward gets
// tells which version it reads; that is checked against the closed forms
// of the papers (papers/pipedream.md, papers/thesis.md):
//
//   1f1b, stashing:   F(k) and B(k) read max(k - w, 0)
//   1f1b, no stash:   F(k) reads max(k - w, 0), B(k) reads k (live)
//   vertical sync:    F(k) and B(k) read max(k - p + 1, 0) on every stage
//   2bw:              F(k) and B(k) read max(floor(k / m) - 1, 0)
//
// along with the version bounds (p - s versions for stashing, 2 for 2BW)
// and when copies are taken (only when an in-flight microbatch still needs
// the version an update overwrites).
//
//===----------------------------------------------------------------------===//

#include "core/versions.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

using pipec::rt::WeightVersions;
using Policy = WeightVersions::Policy;

namespace {

struct Read {
  int64_t forward = -1, backward = -1;
};

struct Trace {
  std::vector<Read> reads;
  int64_t peak = 0, copyBytes = 0, updates = 0;
};

int64_t versionAt(const char *p) {
  int64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

/// Runs `n` microbatches through one window order with warm-up `w`; updates
/// after every backward, or (2BW) after the last backward of each batch of
/// `m`.
Trace drive(Policy policy, int64_t w, int64_t n, int64_t m, int64_t p) {
  WeightVersions versions;
  versions.init(policy, sizeof(int64_t), m, p);
  int64_t live = 0;
  char *livePtr = reinterpret_cast<char *>(&live);
  Trace t;
  t.reads.resize(size_t(n));
  for (int64_t j = 0; j < n + w; ++j) {
    if (j < n)
      t.reads[size_t(j)].forward = versionAt(versions.acquire(j, 0, livePtr));
    const int64_t k = j - w;
    if (k < 0 || k >= n)
      continue;
    t.reads[size_t(k)].backward = versionAt(versions.acquire(k, 1, livePtr));
    versions.release(k);
    const bool update = policy == Policy::TwoBW ? k % m == m - 1 : true;
    if (update) {
      versions.beforeUpdate(livePtr);
      ++live;
    }
  }
  t.peak = versions.peakVersions();
  t.copyBytes = versions.copyBytes();
  t.updates = versions.updates();
  return t;
}

} // namespace

TEST(CoreVersions, StashingReadsTheForwardsVersionInTheBackward) {
  for (int64_t p : {1, 2, 4, 6})
    for (int64_t s = 0; s < p; ++s) {
      const int64_t w = p - s - 1, n = 24;
      Trace t = drive(Policy::Stash, w, n, 1, p);
      for (int64_t k = 0; k < n; ++k) {
        EXPECT_EQ(t.reads[size_t(k)].forward, std::max<int64_t>(k - w, 0))
            << "p=" << p << " s=" << s << " k=" << k;
        EXPECT_EQ(t.reads[size_t(k)].backward, t.reads[size_t(k)].forward)
            << "p=" << p << " s=" << s << " k=" << k;
      }
      // At most p - s versions (the w + 1 in flight), and a copy only on
      // stages where something is in flight across an update.
      EXPECT_LE(t.peak, p - s);
      EXPECT_EQ(t.peak, w + 1) << "p=" << p << " s=" << s;
      EXPECT_EQ(t.copyBytes, w * int64_t(sizeof(int64_t)));
      EXPECT_EQ(t.updates, n);
    }
}

TEST(CoreVersions, ReplicasOfARoundRobinStageKeepTheirOwnWindow) {
  // 1F1B-RR: replica j of r runs microbatches j, j + r, ... and keeps
  // K = ceil(W / r) of them in flight, W the workers from its stage on
  // (lib/Schedule pipedreamDepths); per replica that is a window of warm-up
  // K - 1 over its own microbatches, with an update per round.
  for (int64_t workers : {2, 3, 5})
    for (int64_t r : {1, 2, 4}) {
      const int64_t k = (workers + r - 1) / r, n = 12;
      Trace t = drive(Policy::Stash, k - 1, n, 1, workers);
      for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(t.reads[size_t(i)].backward, std::max<int64_t>(i - (k - 1), 0));
      EXPECT_EQ(t.peak, k);
    }
}

TEST(CoreVersions, WithoutStashingTheBackwardReadsTheLiveWeights) {
  const int64_t p = 4, s = 0, w = p - s - 1, n = 16;
  Trace t = drive(Policy::NoStash, w, n, 1, p);
  for (int64_t k = 0; k < n; ++k) {
    EXPECT_EQ(t.reads[size_t(k)].forward, std::max<int64_t>(k - w, 0));
    EXPECT_EQ(t.reads[size_t(k)].backward, k); // B(0..k-1) updated before
  }
  EXPECT_EQ(t.peak, 1);
  EXPECT_EQ(t.copyBytes, 0);
}

TEST(CoreVersions, VerticalSyncReadsTheInputStagesVersionEverywhere) {
  for (int64_t p : {2, 3, 4})
    for (int64_t s = 0; s < p; ++s) {
      const int64_t w = p - s - 1, n = 20;
      Trace t = drive(Policy::VerticalSync, w, n, 1, p);
      for (int64_t k = 0; k < n; ++k) {
        EXPECT_EQ(t.reads[size_t(k)].forward, std::max<int64_t>(k - p + 1, 0))
            << "p=" << p << " s=" << s << " k=" << k;
        EXPECT_EQ(t.reads[size_t(k)].backward, t.reads[size_t(k)].forward);
      }
      EXPECT_LE(t.peak, p) << "p=" << p << " s=" << s;
    }
}

TEST(CoreVersions, TwoBWReadsTheVersionBeforeTheLastAndKeepsTwo) {
  for (int64_t p : {2, 3, 4})
    for (int64_t m : {p - 1, p, 2 * p})
      for (int64_t s = 0; s < p; ++s) {
        if (m < 1)
          continue;
        const int64_t w = p - s - 1, n = 6 * m;
        Trace t = drive(Policy::TwoBW, w, n, m, p);
        for (int64_t k = 0; k < n; ++k) {
          const int64_t want = std::max<int64_t>(k / m - 1, 0);
          EXPECT_EQ(t.reads[size_t(k)].forward, want)
              << "p=" << p << " m=" << m << " s=" << s << " k=" << k;
          EXPECT_EQ(t.reads[size_t(k)].backward, want);
        }
        EXPECT_LE(t.peak, 2);
        EXPECT_EQ(t.updates, n / m);
      }
}

TEST(CoreVersions, TwoBWRefusesABatchShorterThanThePipeline) {
  // m < p - 1 on stage 0: a forward would need a version 2BW no longer
  // keeps; the store says so instead of handing out wrong weights.
  EXPECT_THROW(drive(Policy::TwoBW, /*w=*/3, /*n=*/12, /*m=*/1, /*p=*/4),
               std::exception);
}
