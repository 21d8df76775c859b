//===- Schedule.h - Pipeline schedule generators and checks -----*- C++ -*-===//
//
// Static pipeline schedules (DESIGN.md §5, papers/thesis.md §5) as per-stage
// programs of forward/backward ops, plus a message-level simulator that
// checks a set of rank programs for matching sends/receives and deadlock.
// Plain C++, no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_SCHEDULE_H
#define PIPEC_SCHEDULE_H

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pipec {

enum class ScheduleKind { GPipe, OneFOneBFlush };

/// Parses "gpipe" / "1f1b-flush"; nullopt for anything else.
std::optional<ScheduleKind> parseScheduleKind(const std::string &name);
const char *scheduleKindName(ScheduleKind kind);

enum class PassKind { Forward, Backward };

/// One forward or backward of a microbatch. In a Segment, `microbatch` is
/// the value at trip 0 and grows by one every trip.
struct SchedOp {
  PassKind kind;
  int64_t microbatch;
  bool operator==(const SchedOp &o) const {
    return kind == o.kind && microbatch == o.microbatch;
  }
};

/// `trips` repetitions of `body` (a counted loop in the generated program).
struct Segment {
  std::vector<SchedOp> body;
  int64_t trips = 0;
};

/// The schedule of one stage for one training step (one flush).
struct StageSchedule {
  std::vector<Segment> segments;
  /// Loops expanded into the flat op order.
  std::vector<SchedOp> flatten() const;
};

/// Generates the per-stage programs of `kind` for `stages` stages and
/// `microbatches` microbatches:
///   gpipe:      F0..F(m-1), B0..B(m-1)
///   1f1b-flush: w = min(p-s-1, m) warm-up forwards, m-w {F, B} pairs,
///               w cool-down backwards (thesis.md §5.2)
/// Preconditions: stages >= 1, microbatches >= 1.
std::vector<StageSchedule> generateSchedule(ScheduleKind kind, int stages,
                                            int64_t microbatches);

/// Peak number of microbatches whose forward ran and backward has not, on
/// one stage of a flat program. Used to size activation stashes.
int64_t peakInflight(const std::vector<SchedOp> &ops);

/// Closed form of the peak in-flight count: m for gpipe, min(p-s, m) for
/// 1f1b-flush.
int64_t closedFormInflight(ScheduleKind kind, int stages, int stage,
                           int64_t microbatches);

//===----------------------------------------------------------------------===//
// Message-level check of rank programs.
//===----------------------------------------------------------------------===//

/// A communication event of one rank program, in program order. Sends do
/// not block; a receive blocks until the matching send was issued.
struct CommEvent {
  enum Kind { Send, Recv } kind;
  int peer;          ///< the other rank
  int64_t channel;   ///< logical tensor channel
  int64_t microbatch;
  std::string type;  ///< printed tensor type; must agree between the two
  std::string where; ///< for diagnostics, e.g. "stage1 op 7"
};

struct CommCheckResult {
  bool ok = true;
  /// One message per problem: unmatched sends/receives, type mismatches,
  /// per-link order mismatches, or the deadlock cycle
  /// ("rank 0 waits for rank 1 (channel 3, mb 2) ...").
  std::vector<std::string> errors;
};

/// Symbolically executes the rank programs: checks that every send has
/// exactly one matching receive (same peer pair, channel, microbatch and
/// type), that each directed link's send order equals its receive order,
/// and that execution terminates.
CommCheckResult checkCommunication(
    const std::vector<std::vector<CommEvent>> &programs);

} // namespace pipec

#endif // PIPEC_SCHEDULE_H
