//===- options.cpp - Command line of a stage executable -------------------===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//

#include "core/options.h"

#include "core/error.h"

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <unistd.h>

namespace pipec {
namespace rt {
namespace {

int64_t parseInt(const std::string &flag, const std::string &text,
                 int64_t min) {
  errno = 0;
  char *end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || v < min)
    throw UsageError("invalid value '" + text + "' for " + flag +
                     " (expected an integer >= " + std::to_string(min) + ")");
  return v;
}

uint64_t parseUnsigned(const std::string &flag, const std::string &text) {
  errno = 0;
  char *end = nullptr;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || text[0] == '-' || *end != '\0' || errno == ERANGE)
    throw UsageError("invalid value '" + text + "' for " + flag +
                     " (expected an integer in [0, 2^64))");
  return v;
}

double parseReal(const std::string &flag, const std::string &text) {
  errno = 0;
  char *end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    throw UsageError("invalid value '" + text + "' for " + flag +
                     " (expected a finite number)");
  return v;
}

std::vector<std::string> splitList(const std::string &flag,
                                   const std::string &text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma - start);
    if (item.empty())
      throw UsageError("invalid value '" + text + "' for " + flag +
                       " (expected A.npy[,B.npy…] without empty entries)");
    items.push_back(item);
    if (comma == std::string::npos)
      return items;
    start = comma + 1;
  }
}

std::string executableDir(const char *argv0) {
  std::error_code ec;
  std::filesystem::path self =
      std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec)
    self = std::filesystem::absolute(argv0 ? argv0 : ".", ec);
  return self.parent_path().string();
}

} // namespace

std::string usageText(const char *argv0) {
  std::string name =
      argv0 ? std::filesystem::path(argv0).filename().string() : "stage";
  return "usage: " + name +
         " [--manifest PATH] [--steps N] [--lr F] [--inputs A.npy[,B.npy...]]\n"
         "       [--labels Y.npy] [--seed S] [--metrics PATH] "
         "[--checkpoint-dir DIR]\n"
         "       [--checkpoint-every N] [--profile-out PATH] "
         "[--profile-warmup N] [--status-dir DIR]\n"
         "       [--trace PATH] [--summary-out PATH] [--resume] "
         "[--resume-from DIR]\n"
         "       [--no-weight-stashing] [--vertical-sync] [--prefetch] "
         "[--quiet] [--watchdog-s S] [--watchdog-first-step-s S]\n"
         "       [--allow-tf32] [--check-kernels] [--cuda-graphs] "
         "[--bind-cores]\n"
         "  --manifest PATH        the build's manifest (default: "
         "manifest.json "
         "beside the executable)\n"
         "  --steps N              training steps (default 10); with --resume, "
         "the "
         "step to reach\n"
         "  --lr F                 SGD learning rate (default 0.01)\n"
         "  --inputs A.npy,...     one .npy per model input (default: "
         "synthetic data)\n"
         "  --labels Y.npy         labels .npy (default: synthetic labels)\n"
         "  --seed S               seed of the synthetic data (default 0)\n"
         "  --metrics PATH         per-step metrics (default: metrics.jsonl "
         "beside the manifest)\n"
         "  --checkpoint-dir DIR   checkpoints (default: checkpoints/ beside "
         "the manifest)\n"
         "  --checkpoint-every N   also checkpoint every N steps (default 0: "
         "only at the end)\n"
         "  --profile-out PATH     write per-op times as pipec.profile/1 JSON\n"
         "  --profile-warmup N     steps the profiler skips (default 1)\n"
         "  --status-dir DIR       keep rank-R.status progress records there "
         "(for pipec train's report when a rank dies)\n"
         "  --trace PATH           write this rank's timeline as a Chrome "
         "trace "
         "({rank} is\n"
         "                         replaced; default: .rankR before the "
         "extension)\n"
         "  --summary-out PATH     write this rank's memory and weight-version "
         "summary (JSON)\n"
         "  --resume               continue from the checkpoint named by "
         "<checkpoint-dir>/latest\n"
         "  --resume-from DIR      continue from a checkpoint of another "
         "build of the model (a step\n"
         "                         folder, or a checkpoints folder with "
         "latest)\n"
         "  --no-weight-stashing   1f1b only: backwards read the live weights "
         "(the ablation\n"
         "                         PipeDream compares against; not a valid "
         "gradient)\n"
         "  --prefetch             synchronous schedules: post the step's "
         "receives at its start\n"
         "                         (staging buffers) instead of receiving "
         "at the point of use\n"
         "  --bind-cores           pin this rank to its block of the host's "
         "CPUs (the ranks of a\n"
         "                         host in rank order; several to a CPU when "
         "they outnumber them)\n"
         "  --allow-tf32           CUDA stages: TF32 tensor-core math in "
         "float32 GEMMs\n"
         "  --check-kernels        CUDA stages: run every kernel call on the "
         "CPU too and report\n"
         "                         where the GPU parts from it (slow; "
         "debugging)\n"
         "  --cuda-graphs          CUDA stages: capture each stage function "
         "once as a CUDA\n"
         "                         graph and replay it (fewer launches)\n"
         "  --vertical-sync        1f1b only: every stage uses the input "
         "stage's "
         "weight version\n"
         "                         for a minibatch (PipeDream's vertical "
         "sync)\n"
         "  --quiet                no per-step progress lines\n"
         "  --watchdog-s S         stop the job when this rank makes no "
         "progress for S seconds\n"
         "                         (or 4x its longest step), naming what it "
         "waits for (default 20;\n"
         "                         0: off)\n"
         "  --watchdog-first-step-s S  the first step (not yet timed) may "
         "take this long\n"
         "                         without progress (default 300)\n";
}

bool switchedOn(const char *name, bool byDefault, const char *on,
                const char *off) {
  const char *value = std::getenv(name);
  const std::string v = value && *value ? value : byDefault ? "1" : "0";
  if (v != "0" && v != "1")
    throw RtError(std::string(name) + "=" + v + ": expected 1 (" + on +
                  ") or 0 (" + off + ")");
  return v == "1";
}

Options parseOptions(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string flag = arg, value;
    bool hasInline = false;
    size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      hasInline = true;
    }
    auto needValue = [&]() -> std::string {
      if (hasInline)
        return value;
      if (i + 1 >= argc)
        throw UsageError("missing value for " + flag);
      return argv[++i];
    };
    auto needPath = [&]() -> std::string {
      std::string path = needValue();
      if (path.empty())
        throw UsageError("empty path for " + flag);
      return path;
    };
    auto noValue = [&]() {
      if (hasInline)
        throw UsageError(flag + " takes no value");
    };
    if (flag == "--manifest")
      o.manifest = needPath();
    else if (flag == "--steps")
      o.steps = parseInt(flag, needValue(), 1);
    else if (flag == "--lr")
      o.lr = parseReal(flag, needValue());
    else if (flag == "--inputs")
      o.inputs = splitList(flag, needValue());
    else if (flag == "--labels")
      o.labels = needPath();
    else if (flag == "--seed")
      o.seed = parseUnsigned(flag, needValue());
    else if (flag == "--metrics")
      o.metrics = needPath();
    else if (flag == "--checkpoint-dir")
      o.checkpointDir = needPath();
    else if (flag == "--checkpoint-every")
      o.checkpointEvery = parseInt(flag, needValue(), 0);
    else if (flag == "--profile-out")
      o.profileOut = needPath();
    else if (flag == "--profile-warmup")
      o.profileWarmup = parseInt(flag, needValue(), 0);
    else if (flag == "--status-dir")
      o.statusDir = needPath();
    else if (flag == "--trace")
      o.trace = needPath();
    else if (flag == "--summary-out")
      o.summaryOut = needPath();
    else if (flag == "--resume")
      noValue(), o.resume = true;
    else if (flag == "--resume-from")
      o.resumeFrom = needPath();
    else if (flag == "--no-weight-stashing")
      noValue(), o.noWeightStashing = true;
    else if (flag == "--prefetch")
      noValue(), o.prefetch = true;
    else if (flag == "--bind-cores")
      noValue(), o.bindCores = true;
    else if (flag == "--allow-tf32")
      noValue(), o.allowTf32 = true;
    else if (flag == "--check-kernels")
      noValue(), o.checkKernels = true;
    else if (flag == "--cuda-graphs")
      noValue(), o.cudaGraphs = true;
    else if (flag == "--vertical-sync")
      noValue(), o.verticalSync = true;
    else if (flag == "--quiet")
      noValue(), o.quiet = true;
    else if (flag == "--watchdog-first-step-s") {
      o.watchdogFirstStepSeconds = parseReal(flag, needValue());
      if (!(o.watchdogFirstStepSeconds >= 0))
        throw UsageError("--watchdog-first-step-s must be >= 0");
    } else if (flag == "--watchdog-s") {
      o.watchdogSeconds = parseReal(flag, needValue());
      if (!(o.watchdogSeconds >= 0))
        throw UsageError("--watchdog-s must be >= 0 (0: off)");
    } else if (flag == "--help" || flag == "-h")
      noValue(), o.help = true;
    else
      throw UsageError("unknown flag '" + arg + "'");
  }
  if (o.resume && !o.resumeFrom.empty())
    throw UsageError("give --resume or --resume-from, not both");
  // (An environment variable: pipec train passes every PIPEC_ one to every
  // rank.)
  if (const char *v = std::getenv("PIPEC_TEARDOWN_TIMEOUT_S"); v && *v) {
    char *end = nullptr;
    o.teardownSeconds = std::strtod(v, &end);
    if (*end != '\0' || !(o.teardownSeconds >= 0) ||
        !std::isfinite(o.teardownSeconds))
      throw RtError(std::string("PIPEC_TEARDOWN_TIMEOUT_S=") + v +
                    ": expected seconds (a number >= 0; 0: no deadline)");
  }
  return o;
}

void resolveDefaultPaths(Options &o, const char *argv0) {
  namespace fs = std::filesystem;
  if (o.manifest.empty())
    o.manifest = (fs::path(executableDir(argv0)) / "manifest.json").string();
  fs::path dir = fs::path(o.manifest).parent_path();
  if (dir.empty())
    dir = ".";
  if (o.metrics.empty())
    o.metrics = (dir / "metrics.jsonl").string();
  if (o.checkpointDir.empty())
    o.checkpointDir = (dir / "checkpoints").string();
}

} // namespace rt
} // namespace pipec
