//===- profiler.h - Per-op wall-time profiler -------------------*- C++ -*-===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Accumulates the wall time of every (op, phase) between
/// pipec_rt_op_begin/end and writes it as `pipec.profile/1`
/// (DESIGN.md §7): fwd_s / bwd_s are mean seconds per microbatch of phase 0
/// / 1 over the counted steps, opt_s is the mean seconds per step of phase 2.
/// When profiling is off the hooks return after one branch.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_PROFILER_H
#define PIPEC_RUNTIME_CORE_PROFILER_H

#include "core/stage.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace pipec {
namespace rt {

class Profiler {
public:
  static constexpr int kPhases = 3;

  /// Enables profiling of `numOps` ops.
  void enable(size_t numOps);
  bool enabled() const { return on; }

  /// Whether the current step's times are accumulated (false in warm-up).
  void setCounting(bool counting) { this->counting = counting; }
  /// Records that one more step was counted.
  void stepCounted() { ++countedSteps; }
  int64_t stepsCounted() const { return countedSteps; }

  /// Marks the start / end of op `op` in `phase`. Throws RtError on an op or
  /// phase out of range, or an end without a begin.
  void begin(int64_t op, int64_t phase);
  void end(int64_t op, int64_t phase);

  /// Accumulated seconds and calls of (op, phase).
  double seconds(size_t op, int phase) const;
  int64_t calls(size_t op, int phase) const;

  /// The `pipec.profile/1` document for this stage.
  /// `device` names where the times were measured ("cpu", or
  /// "cuda:0 (NVIDIA H100 80GB HBM3)").
  std::string toJson(const StageDesc &desc, const std::string &device) const;

private:
  using Clock = std::chrono::steady_clock;
  struct Slot {
    Clock::time_point start;
    bool open = false;
    double total = 0;
    int64_t calls = 0;
  };
  Slot &slot(int64_t op, int64_t phase);

  bool on = false;
  bool counting = true;
  int64_t countedSteps = 0;
  std::vector<Slot> slots;
};

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_PROFILER_H
