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
/// A stage that is the whole model also gets step_s, the mean wall time of
/// its counted steps, and op_overhead_s: what that time holds beyond its
/// ops' times (the runtime between ops, the feeds, the loss, the device
/// waiting for the host), per forward and backward op call.
/// When profiling is off the hooks return after one branch.
///
/// On a device with a queue clock (device.h; CUDA events) an op's begin and
/// end are marks in the device's queue instead: nothing waits for the
/// device while the step runs, and resolve() adds the spans once the
/// step's marks have times. An op's time is then the device's time between
/// the end of the work queued before the op and the end of the op's own
/// work (a kernel that waited for the host's launch counts that wait).
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
  /// Records that one more step was counted, and its wall time (the
  /// program, the device's queue and the step's sends; 0: not measured).
  void stepCounted(double wallSeconds = 0) {
    ++countedSteps;
    countedWall += wallSeconds;
  }
  int64_t stepsCounted() const { return countedSteps; }

  /// Marks the start / end of op `op` in `phase`. Throws RtError on an op or
  /// phase out of range, or an end without a begin.
  /// `mark` >= 0 is the device queue's mark (QueueClock::mark) for the
  /// moment; the span is then added by resolve().
  void begin(int64_t op, int64_t phase, int64_t mark = -1);
  void end(int64_t op, int64_t phase, int64_t mark = -1);
  /// Adds the spans marked since the last call, given every mark's time
  /// (QueueClock::collect).
  void resolve(const std::vector<double> &markSeconds);

  /// Accumulated seconds and calls of (op, phase).
  double seconds(size_t op, int phase) const;
  int64_t calls(size_t op, int phase) const;

  /// The `pipec.profile/1` document for this stage.
  /// `device` names where the times were measured ("cpu", or
  /// "cuda:0 (NVIDIA H100 80GB HBM3)").
  std::string toJson(const StageDesc &desc, const std::string &device) const;

  /// The device's copy speed within its memory (bytes per second), written
  /// as the profile's copy_bytes_per_s (0: not measured).
  void setCopyRate(double bytesPerSecond) { copyRate = bytesPerSecond; }

private:
  using Clock = std::chrono::steady_clock;
  struct Slot {
    Clock::time_point start;
    int64_t startMark = -1;
    bool open = false;
    double total = 0;
    int64_t calls = 0;
  };
  Slot &slot(int64_t op, int64_t phase);

  bool on = false;
  double copyRate = 0;
  bool counting = true;
  int64_t countedSteps = 0;
  double countedWall = 0;
  std::vector<Slot> slots;
  /// Spans of counted steps waiting for their marks' times: slot index,
  /// begin mark, end mark.
  struct Pending {
    size_t slot;
    int64_t begin, end;
  };
  std::vector<Pending> pending;
  bool marked = false; // some span was timed by queue marks
};

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_PROFILER_H
