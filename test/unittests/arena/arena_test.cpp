//===- arena_test.cpp - The arena arithmetic (include/pipec/Arena.h) ------===//

#include "pipec/Arena.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

using namespace pipec;

TEST(ArenaRegions, BasesAreAlignedAndInOrder) {
  ArenaRegions r;
  r.weights = 100;
  r.slot = 10;
  r.slots = 3;
  r.io = 1;
  r.scratch = 65;
  EXPECT_EQ(r.slotBase(), 128);
  EXPECT_EQ(r.ioBase(), 128 + 3 * 64);
  EXPECT_EQ(r.scratchBase(), 128 + 3 * 64 + 64);
  EXPECT_EQ(r.total(), 128 + 3 * 64 + 64 + 128);
  ArenaRegions empty;
  EXPECT_EQ(empty.total(), 0);
}

TEST(ArenaPlan, SumsTheChunks) {
  ArenaRegions a, b;
  a.weights = 64;
  a.slot = 100;
  a.slots = b.slots = 2;
  a.io = 8;
  a.scratch = 640;
  b.weights = 1;
  b.slot = 1;
  b.scratch = 0;
  ArenaPlan p = arenaPlanOf({a, b});
  EXPECT_EQ(p.chunks, 2);
  EXPECT_EQ(p.slots, 2);
  EXPECT_EQ(p.weights, 65);
  EXPECT_EQ(p.slotBytes, 128 + 64);
  EXPECT_EQ(p.io, 8);
  EXPECT_EQ(p.scratch, 640);
  EXPECT_EQ(p.total, a.total() + b.total());
}

namespace {

/// The bytes largest-first, lowest-free-offset packing takes (the packer's
/// first order), written out plainly.
int64_t largestFirst(const std::vector<ScratchBuffer> &bufs) {
  std::vector<size_t> order(bufs.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return bufs[a].bytes != bufs[b].bytes ? bufs[a].bytes > bufs[b].bytes
                                          : bufs[a].first < bufs[b].first;
  });
  std::vector<std::pair<int64_t, int64_t>> placed(bufs.size(), {-1, 0});
  int64_t total = 0;
  for (size_t i : order) {
    if (bufs[i].first < 0)
      continue;
    int64_t at = 0;
    for (bool moved = true; moved;) {
      moved = false;
      for (size_t j = 0; j < bufs.size(); ++j)
        if (placed[j].first >= 0 && bufs[j].first <= bufs[i].last &&
            bufs[i].first <= bufs[j].last && at < placed[j].second &&
            placed[j].first < at + bufs[i].bytes) {
          at = placed[j].second;
          moved = true;
        }
    }
    placed[i] = {at, at + bufs[i].bytes};
    total = std::max(total, at + bufs[i].bytes);
  }
  return total;
}

} // namespace

TEST(PackByLifetime, DisjointLifetimesShareBytes) {
  int64_t total = 0;
  // 0: steps 0-1, 1: steps 2-3 (disjoint: share), 2: steps 1-2 (overlaps
  // both), 3: never used.
  std::vector<int64_t> at = packByLifetime(
      {{128, 0, 1}, {128, 2, 3}, {64, 1, 2}, {1024, -1, -1}}, total);
  EXPECT_EQ(at[0], at[1]);
  EXPECT_EQ(at[2], 128);
  EXPECT_EQ(total, 192);
}

TEST(PackByLifetime, InclusiveBoundsNeverOverlapInputAndOutput) {
  int64_t total = 0;
  // A kernel at step 1 reads buffer 0 (last use) and writes buffer 1
  // (first use): they must not share bytes.
  std::vector<int64_t> at = packByLifetime({{64, 0, 1}, {64, 1, 2}}, total);
  EXPECT_NE(at[0], at[1]);
  EXPECT_EQ(total, 128);
}

TEST(PackByLifetime, ReachesTheLivePeakWhereLargestFirstDoesNot) {
  // Largest first puts buffer 3 at 0 (free of 0 and 1), and 2, which
  // meets 1 and 3, must then go above both: 20480 bytes. Placing by first
  // use stacks 3 over 2 instead; no step has more than 16384 live.
  int64_t total = 0;
  const std::vector<ScratchBuffer> bufs = {
      {8192, 0, 1}, {8192, 1, 2}, {4096, 2, 3}, {8192, 3, 4}, {8192, 4, 5}};
  std::vector<int64_t> at = packByLifetime(bufs, total);
  EXPECT_EQ(total, 16384);
  const std::vector<int64_t> live = liveScratchBytes(bufs);
  EXPECT_EQ(live,
            (std::vector<int64_t>{8192, 16384, 12288, 12288, 16384, 8192}));
  // The same plan every time.
  int64_t again = 0;
  EXPECT_EQ(packByLifetime(bufs, again), at);
}

TEST(PackByLifetime, RandomBuffersNeverCollide) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<ScratchBuffer> bufs(size_t(1 + rng() % 40));
    int64_t steps = 1 + rng() % 30;
    for (ScratchBuffer &b : bufs) {
      b.bytes = arenaAlign(int64_t(1 + rng() % 5000));
      b.first = int64_t(rng() % steps);
      b.last = b.first + int64_t(rng() % (steps - b.first));
    }
    int64_t total = 0;
    std::vector<int64_t> at = packByLifetime(bufs, total);
    int64_t end = 0, livePeak = 0;
    for (size_t i = 0; i < bufs.size(); ++i) {
      end = std::max(end, at[i] + bufs[i].bytes);
      EXPECT_EQ(at[i] % kArenaAlign, 0);
      for (size_t j = i + 1; j < bufs.size(); ++j) {
        bool together =
            bufs[i].first <= bufs[j].last && bufs[j].first <= bufs[i].last;
        bool sharing =
            at[i] < at[j] + bufs[j].bytes && at[j] < at[i] + bufs[i].bytes;
        EXPECT_FALSE(together && sharing)
            << "trial " << trial << ": buffers " << i << " and " << j;
      }
    }
    for (int64_t s = 0; s < steps; ++s) {
      int64_t live = 0;
      for (const ScratchBuffer &b : bufs)
        if (b.first <= s && s <= b.last)
          live += b.bytes;
      livePeak = std::max(livePeak, live);
    }
    EXPECT_EQ(total, end);
    // Never less than the bytes live at once, never more than largest
    // first alone (the first order tried) would take.
    EXPECT_GE(total, livePeak);
    EXPECT_LE(total, largestFirst(bufs));
  }
}
