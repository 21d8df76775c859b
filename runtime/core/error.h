//===- error.h - Runtime errors and the fatal-error path --------*- C++ -*-===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Inside the runtime, failures are `RtError` exceptions carrying one line of
/// text. They never cross the C ABI: every entry point catches them and
/// calls `fatal`, which prints
///   pipec-rt: error: <message> (rank R, stage S, step T)
/// and ends the job (MPI_Abort once MPI is up, so blocked peers end too).
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_ERROR_H
#define PIPEC_RUNTIME_CORE_ERROR_H

#include "pipec/formats/Documents.h"

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace pipec {
namespace rt {

class Communicator;

/// A runtime failure; what() is the one-line message (without prefix and
/// location, which `fatal` adds). The formats library's error, so that a
/// document that cannot be read is reported like every runtime failure.
using RtError = formats::FormatError;

/// Where the process is, for error messages. Fields are -1 while unknown.
struct ErrorLocation {
  int rank = -1;
  int stage = -1;
  /// 1-based step being executed; 0 before the first step (start-up).
  int64_t step = 0;
  /// The job's communicator while this rank is part of the job (between
  /// its start and finalize).
  Communicator *comm = nullptr;
  /// The job's number of ranks once known.
  int worldSize = 0;
  /// Stops this rank's background threads (the feed prefetcher's) before
  /// the process ends: true once they are idle. When they do not stop in
  /// time, `fatal` ends the process without exit's clean-up, which could
  /// free memory a thread still writes.
  std::function<bool()> stopThreads;
};

/// The process-wide location, updated by pipec_rt_main.
ErrorLocation &errorLocation();

/// Formats `pipec-rt: error: <message> (rank R, stage S, step T)`; parts
/// that are still unknown (rank before MPI starts) are left out.
std::string formatError(const std::string &message);

/// Prints the error line on stderr and ends the job with exit code 1:
/// the communicator's abort when other ranks may be waiting, a plain
/// finalize and exit for a one-rank job, exit before the job starts.
[[noreturn]] void fatal(const std::string &message);

/// Runs `fn`, turning any exception into `fatal`. Used at every C ABI entry
/// point so that no exception crosses into generated code.
template <typename Fn> void guarded(Fn &&fn) {
  try {
    fn();
  } catch (const std::exception &e) {
    fatal(e.what());
  } catch (...) {
    fatal("unknown internal error");
  }
}

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_ERROR_H
