//===- CommPrograms.cpp - Send/receive programs of a generated schedule ---===//
//
// Derives the message-level rank programs of a ScheduleResult for
// checkCommunication (thesis.md §7 invariant 10): a chain of p*v virtual
// stages, virtual stage q = c*p + r on device position r (or in a V:
// stageOfChunk), microbatch k on replica k mod r_s of every stage
// (1F1B-RR).
//
//===----------------------------------------------------------------------===//

#include "pipec/Schedule.h"

namespace pipec {

std::vector<std::vector<CommEvent>> scheduleCommPrograms(
    const ScheduleResult &schedule,
    const std::function<std::string(size_t rank, int op)> &where) {
  if (!schedule.ok ||
      int(schedule.replicas.size()) < schedule.stages) // nothing to read
    return {};
  std::vector<std::vector<CommEvent>> programs(schedule.ranks.size());
  const int p = schedule.stages;
  const int numVirtual = p * schedule.chunks;
  std::vector<int> firstRank(p, 0);
  for (int s = 1; s < p; ++s)
    firstRank[s] = firstRank[s - 1] + schedule.replicas[s - 1];
  // Rank of virtual stage q for microbatch k.
  auto peerOf = [&](int q, int64_t k) {
    int stage = int(positionOfStage(schedule.placement, p, q));
    return firstRank[stage] + static_cast<int>(k % schedule.replicas[stage]);
  };
  for (size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    const RankSchedule &program = schedule.ranks[rank];
    std::vector<CommEvent> &events = programs[rank];
    int opIndex = 0;
    for (const SchedOp &op : program.schedule.flatten()) {
      std::string at = where
                           ? where(rank, opIndex)
                           : "stage " + std::to_string(program.stage) +
                                 " replica " + std::to_string(program.replica) +
                                 " op " + std::to_string(opIndex);
      ++opIndex;
      const int q =
          int(stageOfChunk(schedule.placement, p, program.stage, op.chunk));
      const int64_t k = op.microbatch;
      // A message between two chunks of the same rank is a local hand-off.
      auto add = [&](CommEvent::Kind kind, int peerStage, int64_t channel,
                     const char *type) {
        int peer = peerOf(peerStage, k);
        if (peer != static_cast<int>(rank))
          events.push_back({kind, peer, channel, k, type, at});
      };
      switch (op.kind) {
      case PassKind::Forward:
        if (q > 0)
          add(CommEvent::Recv, q - 1, 2 * int64_t(q - 1), "activation");
        if (q + 1 < numVirtual)
          add(CommEvent::Send, q + 1, 2 * int64_t(q), "activation");
        break;
      case PassKind::Backward:
        if (q + 1 < numVirtual)
          add(CommEvent::Recv, q + 1, 2 * int64_t(q) + 1, "gradient");
        if (q > 0)
          add(CommEvent::Send, q - 1, 2 * int64_t(q - 1) + 1, "gradient");
        break;
      case PassKind::BackwardWeight:
        break;
      }
    }
  }
  return programs;
}

} // namespace pipec
