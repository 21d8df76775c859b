//===- Arena.cpp - A stage's static arena, planned ------------------------===//
//
// Part of pipec (include/pipec/Arena.h).
//
//===----------------------------------------------------------------------===//

#include "pipec/Arena.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <tuple>
#include <utility>

namespace pipec {

ArenaPlan arenaPlanOf(const std::vector<ArenaRegions> &chunks) {
  ArenaPlan plan;
  plan.chunks = int64_t(chunks.size());
  for (const ArenaRegions &c : chunks) {
    plan.slots = c.slots;
    plan.weights += c.weights;
    plan.slotBytes += arenaAlign(c.slot);
    plan.io += c.io;
    plan.scratch += c.scratch;
    plan.total += c.total();
  }
  return plan;
}

std::vector<int64_t>
liveScratchBytes(const std::vector<ScratchBuffer> &buffers) {
  int64_t steps = 0;
  for (const ScratchBuffer &b : buffers)
    steps = std::max(steps, b.last + 1);
  std::vector<int64_t> live(size_t(steps) + 1, 0);
  for (const ScratchBuffer &b : buffers)
    if (b.first >= 0) {
      live[size_t(b.first)] += b.bytes;
      live[size_t(b.last) + 1] -= b.bytes;
    }
  for (size_t s = 1; s < live.size(); ++s)
    live[s] += live[s - 1];
  live.pop_back(); // (0: the step after the last)
  return live;
}

namespace {

/// One packing: the buffers placed in `order`, each at the lowest free
/// offset for its whole lifetime (first fit) or in the smallest gap that
/// holds it (best fit; above everything when none does). `overlapping[i]`:
/// the buffers whose lifetimes meet buffer i's.
int64_t packInOrder(const std::vector<ScratchBuffer> &buffers,
                    const std::vector<std::vector<size_t>> &overlapping,
                    const std::vector<size_t> &order, bool bestFit,
                    std::vector<int64_t> &offset) {
  offset.assign(buffers.size(), -1);
  std::vector<std::pair<int64_t, int64_t>> busy; // [begin, end) in bytes
  int64_t total = 0;
  for (size_t id : order) {
    const ScratchBuffer &me = buffers[id];
    if (me.first < 0)
      continue; // never touched by a step (e.g. a dead result): no bytes
    busy.clear();
    for (size_t other : overlapping[id])
      if (offset[other] >= 0)
        busy.push_back({offset[other], offset[other] + buffers[other].bytes});
    std::sort(busy.begin(), busy.end());
    int64_t at = 0, best = -1, bestGap = 0;
    for (auto [begin, end] : busy) {
      if (at + me.bytes <= begin) {
        if (!bestFit) {
          best = at;
          break;
        }
        if (best < 0 || begin - at < bestGap) {
          best = at;
          bestGap = begin - at;
        }
      }
      at = std::max(at, end);
    }
    offset[id] = best >= 0 ? best : at;
    total = std::max(total, offset[id] + me.bytes);
  }
  for (int64_t &o : offset)
    o = std::max<int64_t>(o, 0);
  return total;
}

} // namespace

std::vector<int64_t> packByLifetime(const std::vector<ScratchBuffer> &buffers,
                                    int64_t &total) {
  const size_t n = buffers.size();
  // For each buffer the most bytes live at a step of its lifetime (its
  // breadth: the buffers through the busiest steps are the ones a packing
  // must stack without gaps).
  const std::vector<int64_t> live = liveScratchBytes(buffers);
  const int64_t bound =
      live.empty() ? 0 : *std::max_element(live.begin(), live.end());
  // Which lifetimes meet (a sweep in order of first use).
  std::vector<std::vector<size_t>> overlapping(n);
  {
    std::vector<size_t> byFirst;
    for (size_t i = 0; i < n; ++i)
      if (buffers[i].first >= 0)
        byFirst.push_back(i);
    std::sort(byFirst.begin(), byFirst.end(), [&](size_t x, size_t y) {
      return std::make_pair(buffers[x].first, x) <
             std::make_pair(buffers[y].first, y);
    });
    for (size_t a = 0; a < byFirst.size(); ++a)
      for (size_t b = a + 1; b < byFirst.size() && buffers[byFirst[b]].first <=
                                                       buffers[byFirst[a]].last;
           ++b) {
        overlapping[byFirst[a]].push_back(byFirst[b]);
        overlapping[byFirst[b]].push_back(byFirst[a]);
      }
  }
  std::vector<int64_t> breadth(n, 0), lifetime(n, 0);
  for (size_t i = 0; i < n; ++i)
    if (buffers[i].first >= 0) {
      lifetime[i] = buffers[i].last - buffers[i].first + 1;
      breadth[i] = *std::max_element(live.begin() + buffers[i].first,
                                     live.begin() + buffers[i].last + 1);
    }
  // The orders tried, each a strict total order (the result is the same on
  // every platform): largest first (ties: earlier first use); busiest
  // lifetime first, then larger; by first use, larger first; longest lived
  // first, then larger; busiest first, then by first use, by lifetime, or
  // by last use, latest first.
  using Key = std::tuple<int64_t, int64_t, int64_t, size_t>;
  const std::function<Key(size_t)> keys[] = {
      [&](size_t i) {
        return Key{-buffers[i].bytes, buffers[i].first, 0, i};
      },
      [&](size_t i) {
        return Key{-breadth[i], -buffers[i].bytes, buffers[i].first, i};
      },
      [&](size_t i) {
        return Key{buffers[i].first, -buffers[i].bytes, 0, i};
      },
      [&](size_t i) {
        return Key{-lifetime[i], -buffers[i].bytes, buffers[i].first, i};
      },
      [&](size_t i) {
        return Key{-breadth[i], buffers[i].first, -buffers[i].bytes, i};
      },
      [&](size_t i) {
        return Key{-breadth[i], -lifetime[i], -buffers[i].bytes, i};
      },
      [&](size_t i) {
        return Key{-breadth[i], -buffers[i].last, -buffers[i].bytes, i};
      },
  };
  std::vector<int64_t> best, offset;
  std::vector<size_t> order(n), bestOrder;
  total = -1;
  // Packs `candidate` with both fits; keeps a packing smaller than the
  // best so far (or as small, when `ties`).
  auto tryOrder = [&](const std::vector<size_t> &candidate, bool ties) {
    for (bool bestFit : {false, true}) {
      const int64_t bytes =
          packInOrder(buffers, overlapping, candidate, bestFit, offset);
      if (total < 0 || bytes < total || (ties && bytes == total)) {
        total = bytes;
        best.swap(offset);
        bestOrder = candidate;
      }
    }
  };
  for (const auto &key : keys) {
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(),
              [&](size_t x, size_t y) { return key(x) < key(y); });
    tryOrder(order, false);
    if (total == bound)
      return best; // nothing packs tighter than the bytes live at once
  }
  // Then a local search from the best order: swap two buffers, keep the
  // order when it packs no worse (walking across equal packings), until
  // the bound or a budget of work (a packing costs about the buffers plus
  // the pairs whose lifetimes meet). On the 339 distinct functions of the
  // e2e models (GPT, ResNet, MLP; float32 and bf16; every recomputation
  // mode) the orders alone reach the bound in 290, the search in 39 more,
  // in 0.43 s for all of them (0.07 s for the largest, 487 buffers); a
  // budget ten times larger finds no more. The generator is seeded and
  // taken modulo n (std::mt19937's sequence is fixed by the standard): the
  // same plan on every platform.
  constexpr int64_t kSearchWork = 3'000'000;
  std::mt19937 rng(20261127u);
  int64_t work = int64_t(n) + 1; // of one packing: n + overlapping pairs
  for (const std::vector<size_t> &o : overlapping)
    work += int64_t(o.size());
  const int64_t rounds = std::min<int64_t>(3000, kSearchWork / work);
  for (int64_t round = 0; round < rounds && total > bound && n > 1; ++round) {
    order = bestOrder;
    std::swap(order[rng() % n], order[rng() % n]);
    tryOrder(order, true);
  }
  return best;
}

} // namespace pipec
