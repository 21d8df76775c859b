//===- status.cpp - Per-rank progress record for post-mortems -------------===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//

#include "core/status.h"

#include "core/error.h"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace pipec {
namespace rt {
namespace {

/// The mapped record; volatile so every store reaches the shared page.
volatile RankStatusRecord *gStatus = nullptr;

extern "C" void onTerminate(int sig) {
  if (gStatus)
    gStatus->state = int32_t(RankState::Terminated);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

} // namespace

void markRankStarted(const std::string &dir) {
  const char *rank = nullptr;
  for (const char *var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"})
    if ((rank = std::getenv(var)))
      break;
  if (!rank || dir.empty())
    return;
  ::mkdir(dir.c_str(), 0700);
  std::string path = dir + "/rank-" + std::string(rank) + ".started";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0)
    ::close(fd);
}

void openRankStatus(const std::string &dir, int rank, int stage) {
  // The launcher made the folder on its own host; on another host (no
  // shared filesystem) the rank makes it, and the record stays there.
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw RtError("cannot create status folder '" + dir +
                  "': " + std::strerror(errno));
  std::string path = dir + "/rank-" + std::to_string(rank) + ".status";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw RtError("cannot create status file '" + path +
                  "': " + std::strerror(errno));
  if (::ftruncate(fd, sizeof(RankStatusRecord)) != 0) {
    int err = errno;
    ::close(fd);
    throw RtError("cannot size status file '" + path +
                  "': " + std::strerror(err));
  }
  void *p = ::mmap(nullptr, sizeof(RankStatusRecord), PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED)
    throw RtError("cannot map status file '" + path +
                  "': " + std::strerror(errno));
  auto *rec = static_cast<RankStatusRecord *>(p);
  std::memcpy(rec->magic, "pipecst1", 8);
  rec->rank = rank;
  rec->stage = stage;
  rec->step = 0;
  rec->state = int32_t(RankState::Running);
  rec->reserved = 0;
  gStatus = rec;
  std::signal(SIGTERM, onTerminate);
  std::signal(SIGINT, onTerminate);
}

void setStatusStep(int64_t step) {
  if (gStatus)
    gStatus->step = step;
}

void setStatusState(RankState state) {
  if (gStatus)
    gStatus->state = int32_t(state);
}

} // namespace rt
} // namespace pipec
