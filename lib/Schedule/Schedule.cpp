//===- Schedule.cpp - GPipe and 1F1B-flush schedule generators ------------===//
//
// Per-stage programs of one training step (one flush) as counted loops, so
// that generated code does not grow with the microbatch count
// (papers/thesis.md §5.1, §5.2).
//
//===----------------------------------------------------------------------===//

#include "pipec/Schedule.h"

#include <algorithm>
#include <unordered_set>

namespace pipec {

std::optional<ScheduleKind> parseScheduleKind(const std::string &name) {
  if (name == "gpipe")
    return ScheduleKind::GPipe;
  if (name == "1f1b-flush")
    return ScheduleKind::OneFOneBFlush;
  return std::nullopt;
}

const char *scheduleKindName(ScheduleKind kind) {
  switch (kind) {
  case ScheduleKind::GPipe:
    return "gpipe";
  case ScheduleKind::OneFOneBFlush:
    return "1f1b-flush";
  }
  return "unknown";
}

std::vector<SchedOp> StageSchedule::flatten() const {
  std::vector<SchedOp> ops;
  for (const Segment &segment : segments)
    for (int64_t trip = 0; trip < segment.trips; ++trip)
      for (const SchedOp &op : segment.body)
        ops.push_back({op.kind, op.microbatch + trip});
  return ops;
}

namespace {

/// Appends `trips` repetitions of `body` unless the loop would never run.
void addSegment(StageSchedule &schedule, std::vector<SchedOp> body,
                int64_t trips) {
  if (trips > 0)
    schedule.segments.push_back({std::move(body), trips});
}

} // namespace

std::vector<StageSchedule> generateSchedule(ScheduleKind kind, int stages,
                                            int64_t microbatches) {
  if (stages < 1 || microbatches < 1)
    return {};
  const int64_t m = microbatches;
  std::vector<StageSchedule> schedules(stages);
  for (int s = 0; s < stages; ++s) {
    StageSchedule &schedule = schedules[s];
    switch (kind) {
    case ScheduleKind::GPipe:
      // F1..Fm then B1..Bm, thesis.md §5.1.
      addSegment(schedule, {{PassKind::Forward, 0}}, m);
      addSegment(schedule, {{PassKind::Backward, 0}}, m);
      break;
    case ScheduleKind::OneFOneBFlush: {
      // w_r = min(p - r - 1, m) warm-up forwards, m - w_r {F, B} pairs,
      // w_r cool-down backwards, thesis.md §5.2.
      const int64_t w = std::min<int64_t>(stages - s - 1, m);
      addSegment(schedule, {{PassKind::Forward, 0}}, w);
      addSegment(schedule, {{PassKind::Forward, w}, {PassKind::Backward, 0}},
                 m - w);
      addSegment(schedule, {{PassKind::Backward, m - w}}, w);
      break;
    }
    }
  }
  return schedules;
}

int64_t peakInflight(const std::vector<SchedOp> &ops) {
  std::unordered_set<int64_t> inflight;
  int64_t peak = 0;
  for (const SchedOp &op : ops) {
    if (op.kind == PassKind::Forward) {
      inflight.insert(op.microbatch);
      peak = std::max<int64_t>(peak, inflight.size());
    } else {
      inflight.erase(op.microbatch);
    }
  }
  return peak;
}

int64_t closedFormInflight(ScheduleKind kind, int stages, int stage,
                           int64_t microbatches) {
  switch (kind) {
  case ScheduleKind::GPipe:
    // GPipe stashes every microbatch, thesis.md §5.1.
    return microbatches;
  case ScheduleKind::OneFOneBFlush:
    // min(p - r, m), thesis.md §5.2.
    return std::min<int64_t>(stages - stage, microbatches);
  }
  return 0;
}

} // namespace pipec
