//===- main.cpp - pipec_rt_main: start-up and the training loop -----------===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// Start-up: stage description, flags, MPI, manifest checks, arena, weights,
/// feeds. Then, per step: the generated program, flush, the step loss (mean
/// of the microbatch losses) broadcast from the loss stage so that every
/// rank stops together on NaN/Inf, progress and metrics, checkpoints.
///
//===----------------------------------------------------------------------===//

#include "core/checkpoint.h"
#include "core/context.h"
#include "core/device.h"
#include "core/error.h"
#include "core/resume.h"
#include "core/status.h"
#include "core/watchdog.h"
#include "pipec/formats/safetensors.h"
#include "pipec_rt.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sched.h>
#include <set>
#include <sys/resource.h>
#include <thread>
#include <unistd.h>

using namespace pipec::rt;

namespace {

/// Where this stage writes its profile: a "{stage}" in the path becomes the
/// stage number (with "rJ" for replica J of a replicated stage); otherwise a
/// multi-stage build inserts ".stageK" (".stageKrJ") before the extension so
/// that ranks sharing one command line do not collide.
std::string profilePath(const std::string &path, const StageDesc &desc) {
  // Replicas of one stage write one file each: "2r1" for replica 1.
  std::string stage = std::to_string(desc.stage) +
                      (desc.replicas > 1 ? "r" + std::to_string(desc.replica)
                                         : std::string());
  size_t at = path.find("{stage}");
  if (at != std::string::npos)
    return path.substr(0, at) + stage + path.substr(at + 7);
  if (desc.numStages == 1 && desc.replicas == 1)
    return path;
  std::filesystem::path p(path);
  return (p.parent_path() /
          (p.stem().string() + ".stage" + stage + p.extension().string()))
      .string();
}

/// Where this rank writes its trace: "{rank}" becomes the rank number;
/// otherwise ".rankR" goes before the extension.
std::string rankPath(const std::string &path, int rank) {
  std::string r = std::to_string(rank);
  size_t at = path.find("{rank}");
  if (at != std::string::npos)
    return path.substr(0, at) + r + path.substr(at + 6);
  std::filesystem::path p(path);
  return (p.parent_path() /
          (p.stem().string() + ".rank" + r + p.extension().string()))
      .string();
}

void writeText(const std::string &path, const std::string &text) {
  std::error_code ec;
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty())
    std::filesystem::create_directories(parent, ec);
  std::string error;
  bool ok = pipec::safetensors::writeFileAtomic(
      path,
      [&](std::FILE *f, std::string &why) {
        if (std::fwrite(text.data(), 1, text.size(), f) == text.size())
          return true;
        why = std::strerror(errno);
        return false;
      },
      error);
  if (!ok)
    throw RtError(error);
}

/// Resuming at step `step`: drops the lines of later steps from the metrics
/// file (a run that went past its last checkpoint), atomically.
void keepMetricsUpTo(const std::string &path, int64_t step) {
  std::FILE *in = std::fopen(path.c_str(), "r");
  if (!in)
    return; // nothing to keep
  std::string kept, line;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), in)) {
    line += buf;
    if (line.empty() || line.back() != '\n')
      continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() <= step)
      kept += line;
    line.clear();
  }
  std::fclose(in);
  writeText(path, kept);
}

/// Builds the feeds from --inputs / --labels or the synthetic source.
void setUpFeeds(pipec_ctx &ctx) {
  const Options &o = ctx.options;
  if (!o.inputs.empty() && ctx.manifest.numInputs >= 0 &&
      int(o.inputs.size()) != ctx.manifest.numInputs)
    throw RtError("--inputs lists " + std::to_string(o.inputs.size()) +
                  " files but the model has " +
                  std::to_string(ctx.manifest.numInputs) +
                  " inputs (one .npy per input, in order)");
  for (const FeedSpec &spec : ctx.desc.feeds) {
    bool labels = spec.kind == FeedSpec::Kind::Labels;
    std::string file;
    if (labels) {
      file = o.labels;
    } else if (!o.inputs.empty()) {
      if (spec.index >= int64_t(o.inputs.size()))
        throw RtError("--inputs lists " + std::to_string(o.inputs.size()) +
                      " files but feed '" + spec.name + "' is model input " +
                      std::to_string(spec.index));
      file = o.inputs[size_t(spec.index)];
    }
    if (file.empty())
      ctx.feeds.emplace_back(spec, ctx.desc.globalBatch, o.seed);
    else
      ctx.feeds.push_back(Feed::fromNpy(spec, ctx.desc.globalBatch, file));
    ctx.feeds.back().setSlice(ctx.desc.microbatch, ctx.desc.sliceFirst);
  }
  // A device the host cannot read: microbatches filled ahead
  // (feed_prefetch.h); PIPEC_FEED_PREFETCH=0 fills each when asked.
  const bool prefetch =
      switchedOn("PIPEC_FEED_PREFETCH", true,
                 "fill the feeds' next microbatches ahead, the default",
                 "fill each when the program asks");
  if (!ctx.device->hostAccessible() && prefetch && !ctx.feeds.empty()) {
    ctx.feedPrefetch = std::make_unique<FeedPrefetcher>(*ctx.device, ctx.feeds,
                                                        ctx.desc.microbatches);
    ctx.feedPrefetch->setWaitHook([&ctx] { progressMessages(ctx); });
  }
}

/// Finds the rank of replica 0 of the single stage that computes the loss.
int findLossRank(const pipec_ctx &ctx) {
  bool first = ctx.desc.loss && ctx.desc.replica == 0;
  int64_t count = first ? 1 : 0, lossRank = first ? ctx.rank : -1;
  ctx.comm->allreduce(&count, 1, ReduceOp::Sum, "counting the loss stages");
  ctx.comm->allreduce(&lossRank, 1, ReduceOp::Max, "finding the loss stage");
  if (count != 1)
    throw RtError(std::to_string(count) +
                  " stages of this build compute the loss (\"loss\": true); "
                  "exactly one must");
  return int(lossRank);
}

const char *nonFiniteName(double v) {
  return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
}

/// OpenBLAS threads of this process: the host's cores shared among the
/// ranks on this host (MPI's shared-memory split tells them, whatever
/// launched the job), unless OPENBLAS_NUM_THREADS says otherwise. Each host
/// decides for itself; a launcher cannot know another machine's cores.
/// The CPUs this process may use (a cpuset or taskset limits them), in
/// order, as --bind-cores and `pipec topology` count them; empty when the
/// kernel does not say.
std::vector<int> allowedCpus() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed))
        cpus.push_back(c);
  return cpus;
}

void setBlasThreadsPerHost(int local) {
  if (std::getenv("OPENBLAS_NUM_THREADS"))
    return;
  const size_t allowed = allowedCpus().size();
  long cores = allowed ? long(allowed) : sysconf(_SC_NPROCESSORS_ONLN);
  int threads = int(std::max<long>(1, cores / std::max(local, 1)));
  // Through the symbol, so that a BLAS other than OpenBLAS links too.
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(
          dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    set(threads);
}

/// --bind-cores: this process (every thread: OpenBLAS's pool exists
/// already) pinned to the block of the CPUs it may use that falls to the
/// `local`-th of `size` ranks on this host: CPUs [i C / L, (i + 1) C / L)
/// when the ranks are no more than the CPUs, else CPU floor(i C / L), so
/// ranks 2j and 2j + 1 share CPU j for 2C ranks (the grouping `pipec
/// topology --measure --bind-cores` describes). Returns the CPUs, e.g.
/// "0" or "2-3"; throws RtError when the kernel refuses.
std::string bindToCoreBlock(int local, int size) {
  const std::vector<int> cpus = allowedCpus();
  if (cpus.empty())
    throw RtError(std::string("--bind-cores: cannot read this process's "
                              "CPUs: ") +
                  std::strerror(errno));
  const int64_t n = int64_t(cpus.size()), l = std::max(size, 1);
  int64_t first = int64_t(local) * n / l, last = first;
  if (l <= n)
    last = (int64_t(local) + 1) * n / l - 1;
  cpu_set_t mine;
  CPU_ZERO(&mine);
  for (int64_t k = first; k <= last; ++k)
    CPU_SET(cpus[size_t(k)], &mine);
  std::error_code ec;
  for (const auto &task :
       std::filesystem::directory_iterator("/proc/self/task", ec)) {
    pid_t tid = pid_t(std::atoi(task.path().filename().c_str()));
    // (A thread that ended since the listing: ESRCH, nothing to pin.)
    if (tid > 0 && sched_setaffinity(tid, sizeof mine, &mine) != 0 &&
        errno != ESRCH)
      throw RtError(std::string("--bind-cores: cannot pin thread ") +
                    std::to_string(tid) + ": " + std::strerror(errno));
  }
  if (ec || sched_setaffinity(0, sizeof mine, &mine) != 0)
    throw RtError(std::string("--bind-cores: cannot pin this process: ") +
                  std::strerror(errno));
  return first == last ? std::to_string(cpus[size_t(first)])
                       : std::to_string(cpus[size_t(first)]) + "-" +
                             std::to_string(cpus[size_t(last)]);
}

/// The watchdog (core/watchdog.h) with every rank's stage and host for its
/// message; collective (the host names are gathered).
void startRankWatchdog(const pipec_ctx &ctx) {
  WatchdogPeers peers;
  peers.hostOfRank = gatherHostNames(*ctx.comm);
  peers.stageOfRank.assign(size_t(ctx.worldSize), -1);
  for (size_t s = 0; s < ctx.stageRanks.size(); ++s)
    for (int r : ctx.stageRanks[s])
      if (r >= 0 && r < ctx.worldSize)
        peers.stageOfRank[size_t(r)] = int(s);
  startWatchdog(ctx.options.watchdogSeconds, ctx.rank, std::move(peers),
                ctx.options.watchdogFirstStepSeconds);
}

/// The transport up (MPI_Init), this rank's place in the job, its status
/// record.
void startCommunicator(pipec_ctx &ctx, int &argc, char **&argv,
                       CommunicatorFactory factory) {
  ErrorLocation &loc = errorLocation();
  // A write to a socket or pipe whose other end is gone (a peer rank that
  // was killed, a closed stdout) returns EPIPE instead of killing this rank
  // with SIGPIPE: the launcher then names the rank that died first, not its
  // neighbour that wrote to it (OpenMPI's TCP transport writes with writev,
  // which raises SIGPIPE).
  std::signal(SIGPIPE, SIG_IGN);
  if (!ctx.options.statusDir.empty())
    markRankStarted(ctx.options.statusDir);
  ctx.comm = factory(argc, argv);
  loc.comm = ctx.comm.get();
  ctx.rank = ctx.comm->rank();
  ctx.worldSize = ctx.comm->size();
  loc.rank = ctx.rank;
  loc.worldSize = ctx.worldSize;
  if (!ctx.options.statusDir.empty())
    openRankStatus(ctx.options.statusDir, ctx.rank, ctx.desc.stage);
  setBlasThreadsPerHost(ctx.comm->localSize());
  if (ctx.options.bindCores)
    ctx.boundCpus =
        bindToCoreBlock(ctx.comm->localRank(), ctx.comm->localSize());
}

/// This rank's part in the job ended (after a clean end or an agreed
/// refusal): the watchdog stopped, the groups freed, the transport closed.
void leaveJob(pipec_ctx &ctx, RankState state) {
  stopWatchdog();
  // --check-kernels: the checker's summary while the job's output is still
  // forwarded (it is in a preloaded library, found by name).
  using Report = void (*)();
  if (auto report = reinterpret_cast<Report>(
          dlsym(RTLD_DEFAULT, "pipec_rt_check_report")))
    report();
  // Every rank is here (a peer may still have been writing its last
  // checkpoint: no limit on this wait). What follows is quick unless a GPU
  // stopped answering: the groups' and the transport's closes (NCCL's and
  // CUDA IPC's touch the GPU), then the local teardown; it gets a deadline.
  ctx.comm->barrier("leaving the job");
  armTeardownDeadline(ctx.options.teardownSeconds);
  ctx.stageGroup.reset();
  ctx.tieGroups.clear();
  setStatusState(state);
  errorLocation().comm = nullptr;
  ctx.comm->finalize();
  // The deadline's test (test/e2e/bad_input.py): a teardown that never
  // ends, as with a GPU that stopped answering.
  if (const char *hang = std::getenv("PIPEC_TEARDOWN_TEST_HANG");
      hang && std::string(hang) == "1")
    while (true)
      std::this_thread::sleep_for(std::chrono::seconds(1));
}

/// Start-up refusals are agreed on before anyone stops: every rank runs
/// `phase` (local work, or collectives that every rank reaches before it
/// can fail), keeping its error; then the
/// lowest rank that failed prints its one line and every rank ends with
/// status 1 after leaving the job. No abort: the job says one line, not
/// one per rank and the launcher's abort banner.
void agreeOnStartup(pipec_ctx &ctx, const std::function<void()> &phase) {
  std::string error;
  try {
    phase();
  } catch (const std::exception &e) {
    error = e.what();
    if (error.empty())
      error = "start-up failed";
  }
  int64_t first = error.empty() ? ctx.worldSize : ctx.rank;
  ctx.comm->allreduce(&first, 1, ReduceOp::Min,
                      "agreeing on the start-up checks");
  if (first == ctx.worldSize)
    return;
  std::fflush(stdout);
  if (first == ctx.rank)
    std::fprintf(stderr, "%s\n", formatError(error).c_str());
  std::fflush(stderr);
  leaveJob(ctx, RankState::Error);
  // As fatal(): a thread that does not stop (the feed prefetcher in a
  // device wait) must not run on while std::exit destroys what it uses.
  const ErrorLocation &loc = errorLocation();
  if (loc.stopThreads && !loc.stopThreads())
    std::_Exit(1);
  std::exit(1);
}

/// The manifest checked against this binary and job, the ranks of every
/// stage, the communicators of replicated stages and tied weights, and the
/// loss rank.
void joinPipeline(pipec_ctx &ctx) {
  const StageDesc &desc = ctx.desc;
  agreeOnStartup(ctx, [&] {
    ctx.manifest = readManifest(ctx.options.manifest);
    checkManifest(desc, ctx.manifest, ctx.rank, ctx.worldSize);
  });
  ctx.stageRanks.assign(size_t(desc.numStages), {});
  for (const ManifestStage &s : ctx.manifest.stages)
    ctx.stageRanks[size_t(s.stage)] = s.ranks;
  // Every rank takes part in the split (collective); ranks of one stage
  // share a group for the gradient all-reduce.
  std::unique_ptr<CommGroup> replicas = ctx.comm->split(
      int(desc.stage), int(desc.replica), "grouping each stage's replicas");
  if (desc.replicas > 1)
    ctx.stageGroup = std::move(replicas);
  // One group per set of stages sharing tied weights; every rank takes part
  // in each split, in the description's order.
  for (const std::vector<int64_t> &group : desc.tieGroups) {
    bool member = std::find(group.begin(), group.end(), int64_t(desc.stage)) !=
                  group.end();
    ctx.tieGroups.push_back(ctx.comm->split(
        member ? 1 : -1, ctx.rank, "grouping the stages of tied weights"));
  }
  ctx.lossRank = findLossRank(ctx);
}

/// The weight-version store for the description's policy (never the
/// schedule's name) and the 1f1b-only flags.
void setUpWeightVersions(pipec_ctx &ctx) {
  const StageDesc &desc = ctx.desc;
  const Options &o = ctx.options;
  using pipec::formats::UpdateRule;
  ctx.continuous = !desc.policy.flush;
  if ((o.noWeightStashing || o.verticalSync) &&
      desc.policy.update != UpdateRule::PerMicrobatch)
    throw RtError(std::string(o.verticalSync ? "--vertical-sync"
                                             : "--no-weight-stashing") +
                  " applies to the 1f1b schedule only (per-microbatch "
                  "updates); this build's schedule is " + desc.schedule);
  if (o.verticalSync && desc.replicas > 1)
    throw RtError("--vertical-sync is not defined for replicated stages: "
                  "a replicated stage updates once per round of its replicas' "
                  "minibatches, so version numbers differ between stages");
  if (o.noWeightStashing && o.verticalSync)
    throw RtError("--vertical-sync needs weight stashing; drop "
                  "--no-weight-stashing");
  ctx.versions.init(desc.policy.update == UpdateRule::TwoBW
                        ? WeightVersions::Policy::TwoBW
                    : desc.policy.update == UpdateRule::Flush
                        ? WeightVersions::Policy::Live
                    : o.noWeightStashing ? WeightVersions::Policy::NoStash
                    : o.verticalSync     ? WeightVersions::Policy::VerticalSync
                                         : WeightVersions::Policy::Stash,
                    desc.versionedBytes, desc.microbatches, desc.numStages);
}

/// The step a resume starts from checked against --steps, the weight
/// versions told, the "resuming from" line printed.
void acceptResumeStep(pipec_ctx &ctx, int64_t first, bool reports) {
  const Options &o = ctx.options;
  const bool otherPlan = !o.resumeFrom.empty();
  if (first >= o.steps)
    throw RtError("cannot resume: the checkpoint in '" +
                  (otherPlan ? o.resumeFrom : o.checkpointDir) +
                  "' is at step " + std::to_string(first) + " and --steps " +
                  std::to_string(o.steps) +
                  " asks for no more (--steps is the step to reach)");
  ctx.versions.resumeAt(first);
  if (reports && !o.quiet) {
    std::printf(
        "resuming from %s (step %lld of %lld)\n",
        otherPlan
            ? o.resumeFrom.c_str()
            : (std::filesystem::path(o.checkpointDir) /
               checkpointFolderName(first))
                  .string()
                  .c_str(),
        static_cast<long long>(first), static_cast<long long>(o.steps));
    std::fflush(stdout);
  }
}

/// --resume: the step the latest checkpoint reached, its weights loaded
/// into `arena`; 0 without --resume. --resume-from: the weights this
/// host's files of the other plan's checkpoint hold, loaded, and `pending`
/// set to finish the resume with the other ranks (resume.h); returns 0.
int64_t resumeStep(pipec_ctx &ctx, char *arena, bool reports,
                   std::unique_ptr<OtherPlanResume> &pending) {
  const Options &o = ctx.options;
  if (!o.resume && o.resumeFrom.empty())
    return 0;
  if (ctx.continuous)
    throw RtError("--resume is supported for the synchronous schedules "
                  "(gpipe, 1f1b-flush, interleaved, zb-h1); a " +
                  ctx.desc.schedule +
                  " checkpoint holds the live weights while microbatches "
                  "are in flight, so a resumed run would not equal an "
                  "uninterrupted one");
  if (!o.resumeFrom.empty()) {
    pending = startResumeFromAnotherPlan(o.resumeFrom, ctx.desc, arena);
    return 0;
  }
  int64_t first = readLatest(o.checkpointDir);
  if (first < o.steps) {
    verifyStageCheckpoint(o.checkpointDir, first, ctx.desc);
    loadStageCheckpoint(o.checkpointDir, first, ctx.desc, arena);
  }
  acceptResumeStep(ctx, first, reports);
  return first;
}

/// Every rank resumes from the same step (each machine has its own
/// `latest`); throws on every rank otherwise. Collective.
void checkSameResumeStep(const pipec_ctx &ctx, int64_t first) {
  int64_t lowest = first, highest = first;
  ctx.comm->allreduce(&lowest, 1, ReduceOp::Min, "agreeing on the resume step");
  ctx.comm->allreduce(&highest, 1, ReduceOp::Max,
                      "agreeing on the resume step");
  if (lowest != highest)
    throw RtError("cannot resume: the machines' latest checkpoints differ "
                  "(steps " + std::to_string(lowest) + " to " +
                  std::to_string(highest) + " in " +
                  ctx.options.checkpointDir +
                  "); point every machine's latest at one step");
}

using MetricsFile = std::unique_ptr<std::FILE, int (*)(std::FILE *)>;

/// metrics.jsonl on the reporting rank (kept up to `first` on --resume).
MetricsFile openMetrics(const Options &o, bool reports, int64_t first) {
  std::FILE *metrics = nullptr;
  if (reports) {
    std::error_code ec;
    std::filesystem::path parent =
        std::filesystem::path(o.metrics).parent_path();
    if (!parent.empty())
      std::filesystem::create_directories(parent, ec);
    if (o.resume)
      keepMetricsUpTo(o.metrics, first);
    metrics = std::fopen(o.metrics.c_str(), o.resume ? "a" : "w");
    if (!metrics)
      throw RtError("cannot open metrics file '" + o.metrics +
                    "': " + std::strerror(errno));
  }
  return MetricsFile(metrics,
                     [](std::FILE *f) { return f ? std::fclose(f) : 0; });
}

/// The step loss: the mean over all microbatches; each replica of the loss
/// stage holds those it ran (mb mod replicas == replica), or with split
/// replicas the mean over its slice of every microbatch, weighted by the
/// slice's share of the samples.
double stepLoss(pipec_ctx &ctx) {
  const StageDesc &desc = ctx.desc;
  double partial = 0;
  if (desc.loss && ctx.lossBuffer.get()) {
    // A device stage kept its microbatch losses on the device: one copy.
    HostView losses(*ctx.device, ctx.lossBuffer.get(),
                    desc.microbatches * desc.realBytes);
    const char *bytes = losses.pull();
    for (int64_t mb = 0; mb < desc.microbatches; ++mb) {
      if (!ctx.lossRecorded[size_t(mb)])
        continue;
      if (desc.isF64()) {
        double v;
        std::memcpy(&v, bytes + 8 * mb, 8);
        ctx.losses[size_t(mb)] = v;
      } else {
        float v;
        std::memcpy(&v, bytes + 4 * mb, 4);
        ctx.losses[size_t(mb)] = double(v);
      }
    }
  }
  if (desc.loss) {
    const double share =
        double(desc.sliceSize) / double(std::max<int64_t>(desc.microbatch, 1));
    for (int64_t mb = 0; mb < desc.microbatches; ++mb) {
      bool mine = desc.replicaSplit || mb % desc.replicas == desc.replica;
      if (mine && !ctx.lossRecorded[size_t(mb)])
        throw RtError("the program recorded no loss for microbatch " +
                      std::to_string(mb) +
                      " (pipec_rt_loss must be called once per microbatch)");
      if (mine)
        partial += share * double(ctx.losses[size_t(mb)]);
    }
  }
  BlockedOn wait(WaitKind::Collective);
  ctx.comm->allreduce(&partial, 1, ReduceOp::Sum, "summing the step loss");
  return partial / double(desc.microbatches);
}

/// The progress line and the metrics.jsonl record of step t (loss rank).
void reportStep(const Options &o, std::FILE *metrics, int64_t t, double loss,
                double samplesPerS, double wall) {
  if (!o.quiet) {
    std::printf("step %lld/%lld  loss %.6f  %.1f samples/s  (%.3f s)\n",
                static_cast<long long>(t + 1), static_cast<long long>(o.steps),
                loss, samplesPerS, wall);
    std::fflush(stdout);
  }
  nlohmann::ordered_json line;
  line["step"] = t + 1;
  line["loss"] = loss;
  line["samples_per_s"] = samplesPerS;
  line["wall_s"] = wall;
  std::string text = line.dump() + "\n";
  if (std::fputs(text.c_str(), metrics) < 0 || std::fflush(metrics) != 0)
    throw RtError("cannot write metrics file '" + o.metrics +
                  "': " + std::strerror(errno));
}

/// The checkpoint of step t. Every rank writes its stage's file where it
/// runs (the replicas of a stage hold the same weights; on a shared
/// filesystem they write the same bytes), so that each machine keeps what
/// it needs to resume; then every rank learns every file's host, size and
/// checksum and writes the step's checkpoint.json, and, once all are in
/// place, `latest`. Returns the step folder.
std::string checkpointStep(pipec_ctx &ctx, char *arena, int64_t t) {
  const Options &o = ctx.options;
  struct Record {
    int64_t stage, bytes;
    char checksum[24];
    char host[64];
  } mine = {};
  std::string folder;
  {
    WatchdogPause writing; // a large file may take long; no peer involved
    pipec::safetensors::FileDigest digest; // of the bytes as written
    HostView host(*ctx.device, arena, ctx.desc.arenaBytes);
    folder = writeStageCheckpoint(o.checkpointDir, t + 1, ctx.desc, host.pull(),
                                  &digest);
    mine.bytes = int64_t(digest.bytes);
    std::snprintf(mine.checksum, sizeof(mine.checksum), "%s",
                  checksumText(digest).c_str());
  }
  mine.stage = ctx.desc.stage;
  if (::gethostname(mine.host, sizeof(mine.host) - 1) != 0)
    std::snprintf(mine.host, sizeof(mine.host), "?");
  std::vector<Record> all(size_t(ctx.worldSize));
  {
    BlockedOn wait(WaitKind::Collective);
    ctx.comm->allgather(&mine, int(sizeof(Record)), all.data(),
                        "gathering the checkpoint's files");
  }
  std::map<int64_t, CheckpointEntry> byStage;
  for (const Record &r : all) {
    CheckpointEntry &e = byStage[r.stage];
    e.stage = r.stage;
    e.file = "stage" + std::to_string(r.stage) + ".safetensors";
    e.bytes = r.bytes;
    e.checksum = r.checksum;
    if (std::find(e.hosts.begin(), e.hosts.end(), r.host) == e.hosts.end())
      e.hosts.push_back(r.host);
  }
  std::vector<CheckpointEntry> entries;
  for (auto &[stage, e] : byStage)
    entries.push_back(e);
  writeCheckpointManifest(o.checkpointDir, t + 1, ctx.desc.buildId, entries);
  BlockedOn wait(WaitKind::Collective);
  ctx.comm->barrier("waiting for every stage's checkpoint");
  writeLatest(o.checkpointDir, t + 1);
  return folder;
}

void writeOnRankZero(pipec_ctx &ctx,
                     const std::vector<std::pair<std::string, std::string>>
                         &files);
std::string rankSummary(pipec_ctx &ctx);

/// The device's copy speed within its memory, for the profile: the best
/// of a few copies of the stage's weights (what 1f1b's weight stashing and
/// 2bw's shadow copy move per update), at least 1 MiB.
double measureCopyRate(pipec_ctx &ctx) {
  const int64_t bytes =
      std::max<int64_t>(ctx.desc.versionedBytes, int64_t(1) << 20);
  char *from = ctx.device->allocate(bytes, "the profile's copy probe");
  char *to = ctx.device->allocate(bytes, "the profile's copy probe");
  double best = std::numeric_limits<double>::infinity();
  ctx.device->copy(to, from, bytes); // first touch
  ctx.device->synchronize();
  for (int i = 0; i < 5; ++i) {
    auto start = std::chrono::steady_clock::now();
    ctx.device->copy(to, from, bytes);
    ctx.device->synchronize();
    best = std::min(best, std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - start)
                              .count());
  }
  ctx.device->release(to);
  ctx.device->release(from);
  return best > 0 ? double(bytes) / best : 0;
}

/// After the last step: the weight-version bound, the profile, the trace
/// and the rank summary.
void writeRunOutputs(pipec_ctx &ctx) {
  const StageDesc &desc = ctx.desc;
  const Options &o = ctx.options;
  // The compiler's bound on weight versions (the description's policy)
  // holds for the default policies; --vertical-sync keeps more on purpose.
  if (!o.verticalSync && ctx.versions.peakVersions() > desc.policy.versionsKept)
    throw RtError("stage " + std::to_string(desc.stage) + " held " +
                  std::to_string(ctx.versions.peakVersions()) +
                  " weight versions; the compiler planned at most " +
                  std::to_string(desc.policy.versionsKept) +
                  " (policy.versions_kept): a schedule and runtime mismatch");
  collectQueueMarks(ctx);
  std::vector<std::pair<std::string, std::string>> files;
  if (ctx.profiler.enabled()) {
    ctx.profiler.setCopyRate(measureCopyRate(ctx));
    files.push_back({profilePath(o.profileOut, desc),
                     ctx.profiler.toJson(desc, ctx.device->name())});
  }
  if (ctx.timeline.enabled())
    files.push_back({rankPath(o.trace, ctx.rank), ctx.timeline.toJson() + "\n"});
  if (!o.summaryOut.empty())
    files.push_back({profilePath(o.summaryOut, desc), rankSummary(ctx)});
  writeOnRankZero(ctx, files);
}

/// Every rank's output files written by rank 0, which gathers them: the
/// launching machine gets them all even when the machines share no files
/// (several replicas of a stage name one profile path: the first wins).
void writeOnRankZero(pipec_ctx &ctx,
                     const std::vector<std::pair<std::string, std::string>>
                         &files) {
  std::string mine;
  for (const auto &[path, text] : files) {
    uint64_t sizes[2] = {path.size(), text.size()};
    mine.append(reinterpret_cast<const char *>(sizes), sizeof(sizes));
    mine += path;
    mine += text;
  }
  std::vector<std::string> all;
  {
    BlockedOn wait(WaitKind::Collective);
    all = ctx.comm->gather(mine, 0, "gathering the output files on rank 0");
  }
  if (ctx.rank != 0)
    return;
  std::set<std::string> written;
  for (const std::string &files : all)
    for (size_t at = 0; at + 16 <= files.size();) {
      uint64_t sizes[2];
      std::memcpy(sizes, files.data() + at, sizeof(sizes));
      at += sizeof(sizes);
      std::string path = files.substr(at, sizes[0]);
      at += sizes[0];
      if (written.insert(path).second)
        writeText(path, files.substr(at, sizes[1]));
      at += sizes[1];
    }
}

/// This rank's JSON summary (--summary-out).
std::string rankSummary(pipec_ctx &ctx) {
  const StageDesc &desc = ctx.desc;
  const Options &o = ctx.options;
  nlohmann::ordered_json summary;
  summary["format"] = "pipec.rank-summary/1";
  summary["rank"] = ctx.rank;
  summary["stage"] = desc.stage;
  summary["schedule"] = desc.schedule;
  summary["steps"] = o.steps;
  summary["updates"] = ctx.versions.updates();
  summary["arena_bytes"] = desc.arenaBytes;
  summary["versioned_bytes"] = desc.versionedBytes;
  summary["weight_versions_peak"] = ctx.versions.peakVersions();
  summary["weight_versions_kept"] = desc.policy.versionsKept;
  summary["weight_copy_bytes"] = ctx.versions.copyBytes();
  summary["posted_recv_bytes_peak"] = ctx.postedBytesPeak;
  // Stage-function calls replayed as CUDA graphs (--cuda-graphs).
  summary["replayed_stage_calls"] = ctx.device->replayedCalls();
  // Feed requests served from microbatches filled ahead, and filled when
  // asked (feed_prefetch.h; both 0 where the feeds write the arena).
  summary["feeds_prefetched"] =
      ctx.feedPrefetch ? ctx.feedPrefetch->prefetched() : 0;
  summary["feeds_filled_on_request"] =
      ctx.feedPrefetch ? ctx.feedPrefetch->filledOnTheSpot() : 0;
  // How this rank's tensors travel ("MPI (host-staged) + CUDA IPC ...").
  summary["transport"] = ctx.comm->name();
  // --bind-cores: the CPUs this rank was pinned to ("" unbound).
  summary["cpus"] = ctx.boundCpus;
  struct rusage usage;
  if (getrusage(RUSAGE_SELF, &usage) == 0)
    summary["max_rss_bytes"] = int64_t(usage.ru_maxrss) * 1024;
  return summary.dump(2) + "\n";
}

/// The compiled-in stage description and the command line; a value when
/// the process ends here (usage error 2, --help 0).
std::optional<int> readDescriptionAndOptions(pipec_ctx &ctx, int argc,
                                             char **argv, const char *meta) {
  try {
    ctx.desc = parseStageDesc(meta);
  } catch (const RtError &e) {
    throw RtError(std::string("invalid stage description compiled into this "
                              "binary: ") +
                  e.what());
  }
  errorLocation().stage = ctx.desc.stage;
  const char *argv0 = argc > 0 ? argv[0] : nullptr;
  try {
    ctx.options = parseOptions(argc, argv);
  } catch (const UsageError &e) {
    std::fprintf(stderr, "%s\n%s", formatError(e.what()).c_str(),
                 usageText(argv0).c_str());
    return 2;
  }
  if (ctx.options.help) {
    std::printf("%s", usageText(argv0).c_str());
    return 0;
  }
  resolveDefaultPaths(ctx.options, argv0);
  return std::nullopt;
}

/// Refuses, before the first step, an output `path` (a folder if `folder`)
/// that could not be written: the nearest existing ancestor of the place
/// must be a folder this process may write in. (A file written at the end
/// of a long run, into a path that was never possible, lost the run.)
void checkWritablePlace(const std::string &flag, const std::string &path,
                        bool folder) {
  namespace fs = std::filesystem;
  if (path.empty())
    return;
  std::error_code ec;
  fs::path place = fs::absolute(fs::path(path), ec);
  if (ec)
    place = fs::path(path);
  if (!folder)
    place = place.parent_path();
  if (place.empty())
    place = ".";
  while (!fs::exists(place, ec) && place.has_parent_path() &&
         place.parent_path() != place)
    place = place.parent_path();
  if (!fs::is_directory(place, ec))
    throw RtError(flag + " '" + path + "': '" + place.string() +
                  "' is not a folder");
  if (access(place.c_str(), W_OK | X_OK) != 0)
    throw RtError(flag + " '" + path + "': cannot write in '" + place.string() +
                  "': " + std::strerror(errno));
}

/// The device, the arena with the weights (and a resumed checkpoint) in it,
/// weight versions and feeds; returns the step to start from.
int64_t setUpStage(pipec_ctx &ctx, DeviceBuffer &arena, DeviceFactory factory,
                   const char *target, bool reports,
                   std::unique_ptr<OtherPlanResume> &otherPlan) {
  const StageDesc &desc = ctx.desc;
  const Options &o = ctx.options;
  if (desc.target != target)
    throw RtError("this stage was compiled for --target " + desc.target +
                  " but linked with the " + target + " runtime");
  // Every rank writes its checkpoint files; rank 0 the gathered reports.
  checkWritablePlace("--checkpoint-dir", o.checkpointDir, true);
  if (reports) {
    checkWritablePlace("--summary-out", o.summaryOut, false);
    checkWritablePlace("--trace", o.trace, false);
    checkWritablePlace("--profile-out", o.profileOut, false);
  }
  if (o.checkKernels && desc.target != "cuda")
    throw RtError("--check-kernels checks CUDA kernels against the CPU "
                  "kernels; this stage runs the CPU kernels already");
  if (o.checkKernels && desc.matmulPrecision == "bf16")
    throw RtError("--check-kernels compares with the float32 CPU kernels, "
                  "but this stage's matrix products round to bfloat16 "
                  "(--precision bf16); check the float32 build of the model");
  DeviceRequest request;
  request.localRank = ctx.comm->localRank();
  request.allowTf32 = o.allowTf32;
  // A capture records the kernels' launches, not the profiler's host-side
  // timing around each op, nor the checker's copies around each kernel.
  request.cudaGraphs = o.cudaGraphs && o.profileOut.empty() && !o.checkKernels;
  request.matmulBf16 = desc.matmulPrecision == "bf16";
  ctx.device = factory(request);
  ctx.comm->useDevice(*ctx.device);
  // While this rank waits for its device, its messages in flight move (a
  // sender that only waited would hold a large message back until its
  // next MPI call).
  const char *progress = std::getenv("PIPEC_MESSAGE_PROGRESS");
  ctx.messageProgress = !progress || std::string(progress) != "0";
  if (ctx.messageProgress)
    ctx.device->setWaitHook([&ctx] { progressMessages(ctx); });
  arena.allocate(*ctx.device, desc.arenaBytes, "the arena");
  if (desc.loss && !ctx.device->hostAccessible())
    ctx.lossBuffer.allocate(*ctx.device, desc.microbatches * desc.realBytes,
                            "the microbatch losses");
  ctx.arena = arena.get();
  ctx.versions.setDevice(ctx.device.get());
  HostView host(*ctx.device, arena.get(), desc.arenaBytes);
  loadWeights(desc, manifestStage(ctx.manifest, desc.stage).weights,
              host.get());
  ctx.steps = o.steps;
  setUpWeightVersions(ctx);
  int64_t first = resumeStep(ctx, host.get(), reports, otherPlan);
  host.push();
  setUpFeeds(ctx);
  return first;
}

/// A non-finite step loss: every rank knows it (the loss is all-reduced)
/// and leaves the job; rank 0 says so once, naming the step and the last
/// good checkpoint. The caller returns 3.
void stopOnNonFiniteLoss(pipec_ctx &ctx, double loss, int64_t t,
                         const std::string &lastCheckpoint) {
  std::fflush(stdout);
  if (ctx.rank == 0)
    std::fprintf(stderr, "%s\n",
                 formatError(std::string("loss is ") + nonFiniteName(loss) +
                             " at step " + std::to_string(t + 1) +
                             " (last good checkpoint: " + lastCheckpoint + ")")
                     .c_str());
  std::fflush(stderr);
  leaveJob(ctx, RankState::Error);
}

/// After the last step `t` of a continuous pipeline, the draining windows:
/// the backwards (and updates) of the microbatches still in flight, at most
/// window_reach of them, m per window; every forward there lies outside
/// the run.
void drainContinuousPipeline(pipec_ctx &ctx, pipec_program_fn program,
                             char *arena, int64_t t) {
  const StageDesc &desc = ctx.desc;
  int64_t drain =
      (desc.windowReach + desc.microbatches - 1) / desc.microbatches;
  for (int64_t d = 0; d < std::max<int64_t>(drain, 1); ++d) {
    ctx.step = ctx.options.steps + d;
    program(&ctx, arena);
  }
  ctx.device->synchronize();
  pipec_rt_flush(&ctx);
  collectQueueMarks(ctx);
  ctx.step = t;
}

/// Rank 0's summary line: the final loss and the mean rate over the steps
/// after the first one run (`laterWall` their summed time).
void printDoneLine(const pipec_ctx &ctx, int64_t first, double lastLoss,
                   double laterWall, const std::string &lastCheckpoint) {
  const Options &o = ctx.options;
  int64_t ran = o.steps - first;
  int64_t timed = ran > 1 ? ran - 1 : 1;
  double meanRate =
      double(timed * ctx.desc.globalBatch) / std::max(laterWall, 1e-12);
  std::printf("done: %lld steps  final loss %.6f  %.1f samples/s (%s)  "
              "checkpoint %s\n",
              static_cast<long long>(o.steps), lastLoss, meanRate,
              ran > 1 ? "mean excluding the first step run" : "one step",
              lastCheckpoint.c_str());
  std::fflush(stdout);
}

int run(int argc, char **argv, const char *meta, pipec_program_fn program,
        DeviceFactory factory, CommunicatorFactory commFactory,
        const char *target) {
  ErrorLocation &loc = errorLocation();
  if (!meta || !program)
    throw RtError("pipec_rt_main called without a stage description or "
                  "program");
  auto ctxOwner = std::make_unique<pipec_ctx>();
  pipec_ctx &ctx = *ctxOwner;
  // An error that leaves this function ends the job in fatal(), through
  // the communicator (errorLocation().comm): the context that owns it must
  // outlive the unwinding, so it is let go, never destroyed, then (the
  // process exits in fatal()).
  struct KeepContextOnError {
    std::unique_ptr<pipec_ctx> &owner;
    ~KeepContextOnError() {
      if (std::uncaught_exceptions() > 0)
        (void)owner.release();
    }
  } keepContext{ctxOwner};
  if (std::optional<int> early = readDescriptionAndOptions(ctx, argc, argv,
                                                           meta))
    return *early;
  const StageDesc &desc = ctx.desc;
  Options &o = ctx.options;

  startCommunicator(ctx, argc, argv, commFactory);
  joinPipeline(ctx);
  // Rank 0 reports: progress lines, metrics.jsonl and the summary line
  // (every rank knows the step's loss; the launching machine runs rank 0,
  // so it gets the metrics even when the machines share no files).
  const bool reports = ctx.rank == 0;

  // Arena, weights, data: every rank's refusal is agreed on first.
  DeviceBuffer arena;
  int64_t first = 0;
  MetricsFile metrics(nullptr, std::fclose);
  std::unique_ptr<OtherPlanResume> otherPlan;
  agreeOnStartup(ctx, [&] {
    first = setUpStage(ctx, arena, factory, target, reports, otherPlan);
  });
  // --resume-from: the weights this host's files lack, from the hosts that
  // hold them (collective; every rank reaches it).
  if (!o.resumeFrom.empty())
    agreeOnStartup(ctx, [&] {
      first = finishResumeFromAnotherPlan(ctx, *otherPlan);
      acceptResumeStep(ctx, first, reports);
      otherPlan.reset();
    });
  // Every machine resumes from the same step, and only then is anything
  // written (metrics kept up to that step).
  agreeOnStartup(ctx, [&] {
    checkSameResumeStep(ctx, first);
    metrics = openMetrics(o, reports, first);
  });
  if (!o.profileOut.empty())
    ctx.profiler.enable(desc.ops.size() + desc.fusedUpdates.size());
  if (!o.trace.empty())
    ctx.timeline.enable(ctx.rank, desc.stage, int(desc.replica));
  ctx.losses.assign(size_t(desc.microbatches), 0.0);
  ctx.lossRecorded.assign(size_t(desc.microbatches), false);
  startRankWatchdog(ctx);

  std::string lastCheckpoint =
      !o.resumeFrom.empty()
          ? o.resumeFrom
          : o.resume ? (std::filesystem::path(o.checkpointDir) /
                        checkpointFolderName(first))
                           .string()
                     : "none";
  double lastLoss = 0, laterWall = 0;
  using Clock = std::chrono::steady_clock;
  if (ctx.timeline.enabled()) {
    // A common time zero for every rank's timeline.
    ctx.comm->barrier("starting the timeline");
    ctx.timeline.start();
  }
  for (int64_t t = first; t < o.steps; ++t) {
    loc.step = t + 1;
    setStatusStep(t + 1);
    watchdogStep(t + 1, lastCheckpoint);
    ctx.step = t;
    std::fill(ctx.lossRecorded.begin(), ctx.lossRecorded.end(), false);
    bool counted = o.steps <= o.profileWarmup || t >= o.profileWarmup;
    ctx.profiler.setCounting(counted);

    Clock::time_point start = Clock::now();
    program(&ctx, arena.get());
    ctx.device->synchronize();
    // A continuous pipeline does not wait for its sends at a step boundary:
    // the receiver may take one in its next step.
    if (ctx.continuous)
      reapSends(ctx);
    else
      pipec_rt_flush(&ctx);
    collectQueueMarks(ctx);
    double wall = std::chrono::duration<double>(Clock::now() - start).count();
    if (counted)
      ctx.profiler.stepCounted(wall);
    watchdogStepTime(wall);
    double loss = stepLoss(ctx);
    if (!std::isfinite(loss)) {
      stopOnNonFiniteLoss(ctx, loss, t, lastCheckpoint);
      return 3;
    }
    if (reports) {
      reportStep(o, metrics.get(), t, loss,
                 double(desc.globalBatch) / std::max(wall, 1e-12), wall);
      lastLoss = loss;
      if (t > first || o.steps == first + 1)
        laterWall += wall;
    }

    bool last = t + 1 == o.steps;
    if (last && ctx.continuous)
      drainContinuousPipeline(ctx, program, arena.get(), t);
    if (last || (o.checkpointEvery > 0 && (t + 1) % o.checkpointEvery == 0))
      lastCheckpoint = checkpointStep(ctx, arena.get(), t);
  }

  writeRunOutputs(ctx);
  if (reports)
    printDoneLine(ctx, first, lastLoss, laterWall, lastCheckpoint);
  loc.step = o.steps;
  leaveJob(ctx, RankState::Finished);
  return 0;
}

} // namespace

int pipec::rt::runStage(int argc, char **argv, const char *meta,
                        pipec_program_fn program, DeviceFactory factory,
                        CommunicatorFactory commFactory, const char *target) {
  try {
    return run(argc, argv, meta, program, factory, commFactory, target);
  } catch (const std::exception &e) {
    fatal(e.what());
  } catch (...) {
    fatal("unknown internal error");
  }
}

extern "C" int pipec_rt_main(int argc, char **argv, const char *stage_meta_json,
                             pipec_program_fn program) {
  try {
    return run(argc, argv, stage_meta_json, program, makeCpuDevice,
               makeMpiCommunicator, "cpu");
  } catch (const std::exception &e) {
    fatal(e.what());
  } catch (...) {
    fatal("unknown internal error");
  }
}
