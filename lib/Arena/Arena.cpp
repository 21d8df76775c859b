//===- Arena.cpp - A stage's static arena, planned ------------------------===//
//
// Part of pipec (include/pipec/Arena.h).
//
//===----------------------------------------------------------------------===//

#include "pipec/Arena.h"

#include <algorithm>
#include <numeric>
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

std::vector<int64_t> packByLifetime(const std::vector<ScratchBuffer> &buffers,
                                    int64_t &total) {
  const size_t n = buffers.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return buffers[a].bytes != buffers[b].bytes
               ? buffers[a].bytes > buffers[b].bytes
               : buffers[a].first < buffers[b].first;
  });
  std::vector<int64_t> offset(n, 0);
  std::vector<size_t> placed;
  std::vector<std::pair<int64_t, int64_t>> busy; // [begin, end) in bytes
  total = 0;
  for (size_t id : order) {
    const ScratchBuffer &me = buffers[id];
    if (me.first < 0)
      continue; // never touched by a step (e.g. a dead result): no bytes
    busy.clear();
    for (size_t other : placed)
      if (buffers[other].first <= me.last && me.first <= buffers[other].last)
        busy.push_back({offset[other], offset[other] + buffers[other].bytes});
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (auto [begin, end] : busy) {
      if (at + me.bytes <= begin)
        break;
      at = std::max(at, end);
    }
    offset[id] = at;
    placed.push_back(id);
    total = std::max(total, at + me.bytes);
  }
  return offset;
}

} // namespace pipec
