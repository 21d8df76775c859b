//===- watchdog.h - Stops a job that stopped making progress ----*- C++ -*-===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// A lost rank, a lost host or a cut link leaves its peers blocked in MPI
/// until the transport gives up (OpenMPI over TCP: minutes). Each rank keeps
/// a note of what it is blocked on (a receive from a peer, the sends of a
/// step, a collective) and of its last progress; a thread checks once a
/// second, and after `seconds` (or 4x the longest step so far, if longer;
/// during the first, untimed step the first-step allowance)
/// without progress prints one error line naming what the rank waits for
/// (peer rank, its stage and host, the step) and ends the process with
/// status 4 after about `seconds` more (so that the other stalled ranks
/// report too), without MPI (which may itself be blocked). The launcher
/// (pipec train) reads those lines, names the rank that everybody waits
/// for and nobody hears from, and stops the job 5 s after the first one.
/// Checkpoints are written whole or not at all, so the last complete one stays
/// intact.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_WATCHDOG_H
#define PIPEC_RUNTIME_CORE_WATCHDOG_H

#include <cstdint>
#include <string>
#include <vector>

namespace pipec {
namespace rt {

class Communicator;

/// The exit status of a rank the watchdog stopped.
constexpr int kWatchdogExit = 4;

/// What a rank can be blocked on.
enum class WaitKind : int {
  None = 0,
  Receive,   ///< a message from `peer`
  Sends,     ///< its sends completing (a peer not receiving)
  Collective ///< an all-reduce or barrier
};

/// Who is who, for the message: every rank's stage and host.
struct WatchdogPeers {
  std::vector<int> stageOfRank;
  std::vector<std::string> hostOfRank;
};

/// Starts the checking thread (no-op for seconds <= 0). Until a step has
/// been timed the deadline is max(seconds, firstStepSeconds).
void startWatchdog(double seconds, int rank, WatchdogPeers peers,
                   double firstStepSeconds = 0);
/// Stops it (the run ended normally or reported its own error).
void stopWatchdog();

/// Once every rank has ended its part in the job, what is left is quick:
/// the closes of its groups and transport (NCCL's and CUDA IPC's touch the
/// GPU), the device's teardown (a GPU's memory, streams, library handles,
/// the feed prefetcher's thread) and the process's exit. Nothing watches it
/// any more, so a GPU that stopped answering would hang the rank there for
/// good. This starts a detached thread that, after
/// `seconds` (<= 0: never), prints one error line saying so (the run's
/// results were written before) and ends the process with status 4
/// (kWatchdogExit), without unwinding anything. The line is formatted now,
/// while the runtime's state is whole.
void armTeardownDeadline(double seconds);

/// Progress: an op ran, a message arrived, a step ended.
void watchdogProgress();
/// A step took `seconds` (the deadline is at least 4x the longest).
void watchdogStepTime(double seconds);
/// The step being run and the newest complete checkpoint, for the message.
void watchdogStep(int64_t step, const std::string &lastCheckpoint);

/// Marks this rank blocked while it lives (progress when it ends).
class BlockedOn {
public:
  BlockedOn(WaitKind kind, int peer = -1, int64_t channel = -1,
            int64_t microbatch = -1);
  ~BlockedOn();
  BlockedOn(const BlockedOn &) = delete;
  BlockedOn &operator=(const BlockedOn &) = delete;
};

/// Suspends the watchdog while it lives: local work of unbounded length
/// that is not waiting for a peer (writing a checkpoint).
class WatchdogPause {
public:
  WatchdogPause();
  ~WatchdogPause();
  WatchdogPause(const WatchdogPause &) = delete;
  WatchdogPause &operator=(const WatchdogPause &) = delete;
};

/// The host name of every rank (collective over every rank of `comm`).
std::vector<std::string> gatherHostNames(Communicator &comm);

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_WATCHDOG_H
