//===- Arena.h - A stage's static arena, planned ----------------*- C++ -*-===//
//
// Part of pipec (plain C++: the lowering, --pipe-plan-memory and unit tests
// share it).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Every rank allocates one static, zero-initialised arena, laid out per
/// pipeline stage it runs (chunk) as
///
///   [ weights | slots x stash slot | io | scratch ]
///
/// with every region aligned to kAlign bytes (see passes/LowerToRuntime.cpp
/// for what each region holds). The lowering decides the sizes from the
/// stage's IR; this file is the arithmetic: region bases, the rank's
/// totals (ArenaPlan, what --pipe-plan-memory reports), and the packing of
/// a function's intermediates into scratch by lifetime.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_ARENA_H
#define PIPEC_ARENA_H

#include <cstdint>
#include <vector>

namespace pipec {

/// Alignment of every region and buffer.
constexpr int64_t kArenaAlign = 64;

inline int64_t arenaAlign(int64_t v) {
  return (v + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
}

/// The regions of one chunk (one pipeline stage of the rank), in bytes:
/// their sizes as the lowering accumulates them, and where each starts
/// relative to the chunk's base.
struct ArenaRegions {
  int64_t weights = 0, slot = 0, io = 0, scratch = 0;
  int64_t slots = 1;
  int64_t slotBase() const { return arenaAlign(weights); }
  int64_t ioBase() const { return slotBase() + slots * arenaAlign(slot); }
  int64_t scratchBase() const { return ioBase() + arenaAlign(io); }
  int64_t total() const { return scratchBase() + arenaAlign(scratch); }
};

/// The static arena of one rank (bytes; regions aligned to 64): weights
/// (with gradient accumulators and optimizer state), `slots` activation
/// stash slots of `slotBytes` each, io (boundary gradients, loss seed,
/// hyper-parameters) and scratch; summed over the rank's chunks.
struct ArenaPlan {
  int64_t total = 0, weights = 0, slotBytes = 0, slots = 1, io = 0, scratch = 0,
          chunks = 1;
};

/// The plan of a rank whose chunks (laid out one after the other) have
/// `chunks` regions; every chunk has the same slot count.
ArenaPlan arenaPlanOf(const std::vector<ArenaRegions> &chunks);

/// A buffer to place in scratch: its size (aligned) and the first and last
/// step (inclusive) that use it; first < 0 for a buffer no step uses.
struct ScratchBuffer {
  int64_t bytes = 0, first = -1, last = -1;
};

/// Offsets for `buffers` such that two buffers share bytes only when their
/// lifetimes are disjoint (inclusive bounds: a kernel's output never
/// overlaps its inputs). Finding the tightest packing is NP-hard (dynamic
/// storage allocation), so greedy packings are tried: the buffers in one
/// of seven orders (by size, by the bytes live through their lifetime, by
/// first use, by lifetime), each placed at the lowest offset free for its
/// whole lifetime or in the smallest gap that holds it; then, short of the
/// most bytes live at one step (no packing needs less), a bounded local
/// search from the best order (swap two buffers, keep the order when it
/// packs no worse; seeded: the same plan everywhere). The tightest found
/// is taken. `total` gets the bytes needed; an unused buffer gets offset 0
/// and no bytes.
std::vector<int64_t> packByLifetime(const std::vector<ScratchBuffer> &buffers,
                                    int64_t &total);

/// The bytes of `buffers` live at each step, 0 to the last step any uses.
std::vector<int64_t>
liveScratchBytes(const std::vector<ScratchBuffer> &buffers);

} // namespace pipec

#endif // PIPEC_ARENA_H
