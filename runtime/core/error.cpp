//===- error.cpp - Runtime errors and the fatal-error path ----------------===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//

#include "core/error.h"

#include "core/communicator.h"
#include "core/status.h"

#include <cstdio>
#include <cstdlib>

namespace pipec {
namespace rt {

ErrorLocation &errorLocation() {
  static ErrorLocation location;
  return location;
}

std::string formatError(const std::string &message) {
  const ErrorLocation &loc = errorLocation();
  std::string where;
  auto add = [&](const std::string &part) {
    where += where.empty() ? " (" : ", ";
    where += part;
  };
  if (loc.rank >= 0)
    add("rank " + std::to_string(loc.rank));
  if (loc.stage >= 0)
    add("stage " + std::to_string(loc.stage));
  add("step " + std::to_string(loc.step));
  return "pipec-rt: error: " + message + where + ")";
}

void fatal(const std::string &message) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", formatError(message).c_str());
  std::fflush(stderr);
  setStatusState(RankState::Error);
  const ErrorLocation &loc = errorLocation();
  const bool threadsIdle = !loc.stopThreads || loc.stopThreads();
  if (loc.comm && loc.worldSize == 1)
    loc.comm->finalize(); // no peer to end; avoids mpirun's abort banner
  else if (loc.comm)
    loc.comm->abort(1);
  if (!threadsIdle)
    std::_Exit(1);
  std::exit(1);
}

} // namespace rt
} // namespace pipec
