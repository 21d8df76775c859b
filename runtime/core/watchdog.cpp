//===- watchdog.cpp - Stops a job that stopped making progress ------------===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//

#include "core/watchdog.h"

#include "core/communicator.h"
#include "core/error.h"
#include "core/status.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>

namespace pipec {
namespace rt {
namespace {

using Clock = std::chrono::steady_clock;

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             Clock::now().time_since_epoch())
      .count();
}

/// The state the checking thread reads; written by the rank's thread.
struct State {
  std::atomic<int64_t> lastProgressNs{0};
  std::atomic<int> kind{0}, peer{-1};
  std::atomic<int64_t> channel{-1}, microbatch{-1}, step{0};
  std::atomic<double> longestStep{0};
  std::atomic<int> paused{0};
  std::mutex textMutex; ///< guards lastCheckpoint
  std::string lastCheckpoint = "none";
  double seconds = 0, firstStepSeconds = 0;
  int rank = 0;
  WatchdogPeers peers;
  std::thread thread;
  std::mutex stopMutex;
  std::condition_variable stopCv;
  bool stop = false;
};

/// Never destroyed: a rank may end (std::exit) with the thread running.
State &state() {
  static State *s = new State;
  return *s;
}

std::string describeRank(const State &s, int r) {
  std::string text = "rank " + std::to_string(r);
  if (r >= 0 && size_t(r) < s.peers.stageOfRank.size())
    text += " (stage " + std::to_string(s.peers.stageOfRank[size_t(r)]);
  if (r >= 0 && size_t(r) < s.peers.hostOfRank.size())
    text += ", host " + s.peers.hostOfRank[size_t(r)];
  if (r >= 0 && size_t(r) < s.peers.stageOfRank.size())
    text += ")";
  return text;
}

[[noreturn]] void fire(State &s, double idle) {
  std::string what;
  switch (WaitKind(s.kind.load())) {
  case WaitKind::Receive:
    what = "waiting for " + describeRank(s, s.peer.load()) +
           " to send microbatch " + std::to_string(s.microbatch.load()) +
           " on channel " + std::to_string(s.channel.load()) +
           ": that rank, its host or the link to it is lost or stopped";
    break;
  case WaitKind::Sends:
    what = "waiting for its messages of step " +
           std::to_string(s.step.load()) +
           " to be received: a peer, its host or a link is lost or stopped";
    break;
  case WaitKind::Collective:
    what = "waiting in a collective (gradient all-reduce or barrier): a "
           "rank of the group, its host or a link is lost or stopped";
    break;
  case WaitKind::None:
    what = "not waiting for a message: an operation ran this long or the "
           "rank is stuck (raise --watchdog-s for slow steps)";
    break;
  }
  std::string checkpoint;
  {
    std::lock_guard<std::mutex> lock(s.textMutex);
    checkpoint = s.lastCheckpoint;
  }
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.0f", idle);
  std::string message = "watchdog: " + describeRank(s, s.rank) +
                        " made no progress for " + seconds + " s in step " +
                        std::to_string(s.step.load()) + ", " + what +
                        "; the last complete checkpoint is " + checkpoint +
                        "; stopping the job (--watchdog-s)";
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", formatError(message).c_str());
  std::fflush(stderr);
  setStatusState(RankState::Error);
  // Linger so that the other stalled ranks say what they wait for too (the
  // launcher finds the rank everybody waits for and nobody hears from, and
  // stops the job 5 s after the first line; a rank that exited at once
  // would make mpirun end the others before they report, as seen under
  // load). Then end without MPI, which may be what is blocked: the exit is
  // what ends a job started without pipec train, or a rank cut off from it.
  double linger = std::max(2.0, s.seconds) +
                  std::min(s.longestStep.load(), s.seconds);
  std::this_thread::sleep_for(std::chrono::duration<double>(linger));
  ::_exit(kWatchdogExit);
}

void check(State &s) {
  std::unique_lock<std::mutex> lock(s.stopMutex);
  while (!s.stop) {
    s.stopCv.wait_for(lock, std::chrono::seconds(1));
    if (s.stop)
      return;
    if (s.paused.load() > 0)
      continue;
    double idle = double(nowNs() - s.lastProgressNs.load()) * 1e-9;
    const double longest = s.longestStep.load();
    double deadline = longest > 0 ? std::max(s.seconds, 4 * longest)
                                  : std::max(s.seconds, s.firstStepSeconds);
    if (idle > deadline)
      fire(s, idle);
  }
}

} // namespace

void startWatchdog(double seconds, int rank, WatchdogPeers peers,
                   double firstStepSeconds) {
  State &s = state();
  if (seconds <= 0 || s.thread.joinable())
    return;
  s.seconds = seconds;
  s.firstStepSeconds = firstStepSeconds;
  s.rank = rank;
  s.peers = std::move(peers);
  s.lastProgressNs = nowNs();
  s.stop = false;
  s.thread = std::thread([&s] { check(s); });
}

void stopWatchdog() {
  State &s = state();
  if (!s.thread.joinable())
    return;
  {
    std::lock_guard<std::mutex> lock(s.stopMutex);
    s.stop = true;
  }
  s.stopCv.notify_all();
  s.thread.join();
}

void armTeardownDeadline(double seconds) {
  if (!(seconds > 0))
    return;
  char shown[32];
  std::snprintf(shown, sizeof shown, "%g", seconds);
  const std::string line = formatError(
      std::string("this rank's teardown (closing its transport, device "
                  "memory, streams, threads) did not finish ") +
      shown +
      " s after every rank ended its part in the job (a GPU that stopped "
      "answering?); "
      "ending the process (PIPEC_TEARDOWN_TIMEOUT_S); the run's results "
      "were written before");
  std::thread([seconds, line] {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    std::fflush(stdout);
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
    ::_exit(kWatchdogExit);
  }).detach();
}

void watchdogProgress() { state().lastProgressNs = nowNs(); }

void watchdogStepTime(double seconds) {
  State &s = state();
  if (seconds > s.longestStep.load())
    s.longestStep = seconds;
  s.lastProgressNs = nowNs();
}

void watchdogStep(int64_t step, const std::string &lastCheckpoint) {
  State &s = state();
  s.step = step;
  std::lock_guard<std::mutex> lock(s.textMutex);
  s.lastCheckpoint = lastCheckpoint;
}

BlockedOn::BlockedOn(WaitKind kind, int peer, int64_t channel,
                     int64_t microbatch) {
  State &s = state();
  s.peer = peer;
  s.channel = channel;
  s.microbatch = microbatch;
  s.kind = int(kind);
}

BlockedOn::~BlockedOn() {
  State &s = state();
  s.kind = int(WaitKind::None);
  s.lastProgressNs = nowNs();
}

WatchdogPause::WatchdogPause() { ++state().paused; }

WatchdogPause::~WatchdogPause() {
  State &s = state();
  s.lastProgressNs = nowNs();
  --s.paused;
}

std::vector<std::string> gatherHostNames(Communicator &comm) {
  constexpr int kLen = 64;
  char mine[kLen] = {};
  if (::gethostname(mine, kLen - 1) != 0)
    std::snprintf(mine, kLen, "?");
  const int size = comm.size();
  std::vector<char> all(size_t(size) * kLen, 0);
  std::vector<std::string> names(static_cast<size_t>(size));
  try {
    comm.allgather(mine, kLen, all.data(), "gathering the host names");
  } catch (const std::exception &) {
    return names; // the watchdog's messages then name no hosts
  }
  for (int r = 0; r < size; ++r)
    names[size_t(r)] = std::string(all.data() + size_t(r) * kLen);
  return names;
}

} // namespace rt
} // namespace pipec
