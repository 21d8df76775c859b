//===- status.h - Per-rank progress record for post-mortems -----*- C++ -*-===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// With `--status-dir DIR` (passed by `pipec train`), every rank maps a small
/// file DIR/rank-R.status into memory and stores its stage, its current step
/// and its state there. The stores are plain memory writes (no system call
/// per step) and the page outlives the process, so when a rank is killed or
/// crashes, the launcher can still read which rank ended without a report and
/// in which step. The layout is fixed (little-endian, 32 bytes):
///
///   char    magic[8]  "pipecst1"
///   int32   rank, stage
///   int64   step      1-based step being executed; 0 during start-up
///   int32   state     RankState
///   int32   reserved
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_STATUS_H
#define PIPEC_RUNTIME_CORE_STATUS_H

#include <cstdint>
#include <string>

namespace pipec {
namespace rt {

enum class RankState : int32_t {
  Running = 0,    ///< started; no end recorded (killed or crashed if final)
  Finished = 1,   ///< returned normally
  Error = 2,      ///< printed its own error line and ended the job
  Terminated = 3, ///< stopped by SIGTERM/SIGINT (the launcher ending the job)
};

struct RankStatusRecord {
  char magic[8];
  int32_t rank;
  int32_t stage;
  int64_t step;
  int32_t state;
  int32_t reserved;
};
static_assert(sizeof(RankStatusRecord) == 32, "fixed layout");

/// Creates and maps DIR/rank-R.status and installs SIGTERM/SIGINT handlers
/// that record `Terminated` before the default action. Throws RtError.
void openRankStatus(const std::string &dir, int rank, int stage);

/// Before MPI starts: an empty DIR/rank-R.started, R the launcher's rank
/// (OMPI_COMM_WORLD_RANK, PMIX_RANK or SLURM_PROCID; nothing when none is
/// set), so that a launcher whose job never got through MPI_Init can tell
/// the ranks that are waiting there (a marker) from the one that never
/// started (none). Best effort: never throws.
void markRankStarted(const std::string &dir);

/// Records the step being executed (no-op without a status file).
void setStatusStep(int64_t step);

/// Records the final state (no-op without a status file).
void setStatusState(RankState state);

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_STATUS_H
