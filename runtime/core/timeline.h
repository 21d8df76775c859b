//===- timeline.h - Chrome-trace timeline of a real run ---------*- C++ -*-===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Records when this rank ran each forward, backward and update, how long
/// it waited in receives, sends and all-reduces, and writes them as Chrome
/// trace events (`ph: "X"`, microseconds since a start time that all ranks
/// take right after a barrier), one process per rank. `pipec train
/// --trace` merges the ranks' files into one trace that Perfetto or
/// chrome://tracing opens next to the simulator's (`pipec simulate
/// --trace`). When tracing is off every hook returns after one branch.
///
/// On a device with a queue clock (device.h; CUDA events) the compute spans
/// (forward, backward, update) are marks in the device's queue, so they show
/// when the device ran that work, and nothing waits for it while the step
/// runs; resolve() gives them their times once per step. Communication
/// spans are the host's time in the transfer (with host-staged messages,
/// that includes waiting for the device to finish the bytes it sends).
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_TIMELINE_H
#define PIPEC_RUNTIME_CORE_TIMELINE_H

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace pipec {
namespace rt {

class Timeline {
public:
  /// What a span is (the ABI values of pipec_rt_span_begin's `kind`).
  enum Kind { Forward = 0, Backward = 1, Update = 2, Recv = 3, Send = 4,
              AllReduce = 5, Flush = 6, NumKinds };

  void enable(int rank, int stage, int replica);
  bool enabled() const { return on; }
  /// Sets time zero (call on every rank right after a barrier).
  void start();
  /// Opens / closes a span of `kind` for global microbatch `mb` (-1: none)
  /// in training step `step`. Spans of one kind do not nest.
  /// `mark` >= 0: a device queue mark (QueueClock::mark) instead of now;
  /// such a span gets its times from resolve().
  void begin(int kind, int64_t mb, int64_t step, int64_t mark = -1);
  void end(int kind, int64_t mark = -1);
  /// Gives the marked spans since the last call their times (every mark's
  /// steady-clock seconds, QueueClock::collect).
  void resolve(const std::vector<double> &markSeconds);
  /// Seconds spent in spans of `kind` so far.
  double seconds(int kind) const { return total[size_t(kind)]; }
  /// The Chrome trace events of this rank (a JSON array).
  std::string toJson() const;

private:
  using Clock = std::chrono::steady_clock;
  struct Event {
    int kind;
    int64_t mb, step;
    double t0, t1; // seconds since start
    int64_t mark0 = -1, mark1 = -1; // queue marks still to resolve
  };
  bool on = false;
  int rank = 0, stage = 0, replica = 0;
  Clock::time_point zero;
  double open[NumKinds] = {};
  int64_t openMark[NumKinds] = {};
  size_t unresolved = 0; // events[unresolved..] may wait for marks
  int64_t openMb[NumKinds] = {}, openStep[NumKinds] = {};
  double total[NumKinds] = {};
  std::vector<Event> events;
};

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_TIMELINE_H
