//===- Train.cpp - pipec train / pipec-run --------------------------------===//
//
// `pipec train OUT/` launches the stage executables as one MPMD job:
//   mpirun --oversubscribe --bind-to none -np 1 OUT/stage0 ARGS : -np 1 ...
// on this machine, or with --hostfile/--hosts one rank per slot of the
// hosts (`-np 1 --host H:SLOTS OUT/stageK ARGS`, Launch.h), or through srun
// with a --multi-prog file (--launcher srun). `--dry-run` prints that line;
// running it by hand is equivalent.
// Plain C++ and POSIX: pipec-run links this file without LLVM or MLIR
// (`pipec profile`, which compiles, is in Profile.cpp).
//
//===----------------------------------------------------------------------===//
#include "Driver.h"
#include "Launch.h"
#include "SysUtil.h"
#include "pipec/formats/Documents.h"
#include "pipec/formats/npy.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <thread>
#include <unistd.h>

using namespace pipec::driver;

std::string pipec::driver::findLauncher(const std::string &requested,
                                        std::string &error) {
  std::string path = sys::findProgram(requested);
  if (path.empty())
    error = "cannot find '" + requested + "' (" +
            (requested.find("srun") != std::string::npos
                 ? "srun comes with SLURM (slurm-client)"
                 : "install openmpi-bin, or pass --mpirun PATH") +
            ")";
  return path;
}

namespace {

using sys::absolute;

/// --inputs and --labels: no empty file name (the stage executable would
/// refuse it with its own usage); together, both or neither where the build's
/// loss reads labels, and (for the files this machine holds) as many rows in
/// each, since every file is read in order and cycled on its own: files of
/// different lengths pair inputs with other samples' labels from the first
/// wrap on. The stage executables check each file's dtype and shape.
bool checkDataFiles(const Args &a, const pipec::formats::Manifest &manifest,
                    std::string &error) {
  for (const char *flag : {"--inputs", "--labels"})
    if (a.has(flag))
      for (const std::string &file : sys::split(a.get(flag), ','))
        if (file.empty()) {
          error = std::string(flag) + " has an empty file name: '" +
                  a.get(flag) + "'";
          return false;
        }
  const bool inputs = a.has("--inputs"), labels = a.has("--labels");
  if (labels && !inputs) {
    error = "--labels without --inputs: the labels would be paired with "
            "synthetic inputs; give both (or neither, to train on "
            "synthetic data)";
    return false;
  }
  if (inputs && !labels && manifest.hasLabels) {
    error = "--inputs without --labels: this build's loss reads labels, "
            "which would be synthetic; give both (or neither)";
    return false;
  }
  // (file, the manifest tensor it feeds); samples are counted by elements,
  // as labels may come flat (one row per token).
  std::vector<std::pair<std::string, const pipec::formats::ManifestTensor *>>
      files;
  if (inputs) {
    std::vector<std::string> names = sys::split(a.get("--inputs"), ',');
    for (size_t i = 0; i < names.size(); ++i)
      files.emplace_back(
          names[i], i < manifest.inputs.size() ? &manifest.inputs[i] : nullptr);
  }
  if (labels)
    files.emplace_back(a.get("--labels"),
                       manifest.hasLabels ? &manifest.labels : nullptr);
  std::string first;
  int64_t firstSamples = -1;
  for (const auto &[file, tensor] : files) {
    if (!tensor || !sys::exists(file) || manifest.globalBatch <= 0)
      continue; // the stages check the count and each file where it is read
    int64_t perSample = 1;
    for (int64_t d : tensor->shape)
      perSample *= d;
    if (perSample % manifest.globalBatch != 0)
      continue; // no batch dimension to count samples by
    perSample /= manifest.globalBatch;
    pipec::npy::Array header;
    if (!pipec::npy::readHeader(file, header, error))
      return false;
    int64_t elements = 1;
    for (int64_t d : header.shape)
      elements *= d;
    if (perSample <= 0 || header.shape.empty() || elements % perSample != 0)
      continue; // a shape the stage executable refuses, naming it
    const int64_t samples = elements / perSample;
    if (firstSamples < 0) {
      first = file;
      firstSamples = samples;
    } else if (samples != firstSamples) {
      error = "'" + first + "' holds " + std::to_string(firstSamples) +
              " samples but '" + file + "' " + std::to_string(samples) +
              ": inputs and labels must hold as many samples (each file is "
              "read in order and cycled on its own)";
      return false;
    }
  }
  return true;
}

/// Why `path` is neither a complete ELF file nor a script ("" when it is
/// one): the magic, and the section header table inside the file (what a
/// truncated copy loses first: it lies at the end).
std::string elfProblem(const std::string &path) {
  std::FILE *f = std::fopen(path.c_str(), "rb");
  if (!f)
    return std::string("cannot open it: ") + std::strerror(errno);
  unsigned char header[64] = {};
  size_t got = std::fread(header, 1, sizeof header, f);
  std::fseek(f, 0, SEEK_END);
  long size = std::ftell(f);
  std::fclose(f);
  if (got >= 2 && header[0] == '#' && header[1] == '!')
    return ""; // a script (a wrapper around a stage executable)
  static const unsigned char kElfMagic[4] = {0x7f, 'E', 'L', 'F'};
  if (got < 4 || std::memcmp(header, kElfMagic, 4) != 0)
    return "neither an ELF executable nor a script";
  // The section headers' end, for 64-bit little-endian files (the targets
  // pipec builds for); other classes and byte orders pass unchecked.
  if (got < 64 || header[4] != 2 /* ELFCLASS64 */ ||
      header[5] != 1 /* ELFDATA2LSB */)
    return "";
  uint64_t shoff = 0;
  for (int i = 7; i >= 0; --i)
    shoff = (shoff << 8) | header[0x28 + i];
  uint16_t shentsize = uint16_t(header[0x3a] | header[0x3b] << 8);
  uint16_t shnum = uint16_t(header[0x3c] | header[0x3d] << 8);
  if (size < 0 || shoff + uint64_t(shentsize) * shnum > uint64_t(size))
    return "truncated (" + std::to_string(size) + " bytes)";
  return "";
}

/// Stage binaries of a build folder, from its manifest (read into
/// `manifest`), and whether some stage has several replicas.
bool readStages(const std::string &manifestPath,
                pipec::formats::Manifest &manifest,
                std::vector<std::string> &bins, std::vector<int> &stageOfRank,
                std::string &error, bool &replicated) {
  replicated = false;
  if (!sys::exists(manifestPath)) {
    error = "cannot read '" + manifestPath + "' (is this a `pipec compile` "
            "output folder?)";
    return false;
  }
  // The manifest through the formats library, as the stage binaries read it.
  if (!pipec::formats::readManifest(manifestPath, manifest, error))
    return false;
  if (manifest.stages.empty()) {
    error = "'" + manifestPath + "' lists no stages";
    return false;
  }
  std::string dir = sys::parentPath(manifestPath);
  // Binaries in MPI rank order: each stage lists its replicas' ranks and,
  // when it has several, one binary per replica ("binaries").
  std::map<int64_t, std::string> byRank;
  std::map<int64_t, int> stageOfByRank;
  for (const pipec::formats::ManifestStage &s : manifest.stages) {
    if ((s.binary.empty() && s.binaries.empty()) || s.ranks.empty() ||
        (!s.binaries.empty() && s.binaries.size() != s.ranks.size())) {
      error = "'" + manifestPath + "': every stage needs a binary (or one "
              "per replica) and its ranks";
      return false;
    }
    replicated |= s.ranks.size() > 1;
    for (size_t i = 0; i < s.ranks.size(); ++i) {
      int64_t rank = s.ranks[i];
      const std::string &name = s.binaries.empty() ? s.binary : s.binaries[i];
      if (byRank.count(rank)) {
        error = "'" + manifestPath + "': a stage's ranks must be distinct "
                "non-negative integers with a binary each";
        return false;
      }
      std::string path = dir + "/" + name;
      if (!sys::exists(path)) {
        error = "stage executable '" + path + "' is missing";
        return false;
      }
      if (!sys::canExecute(path)) {
        error = "stage executable '" + path +
                "' is not executable (its "
                "permissions; compile again or chmod +x)";
        return false;
      }
      // An ELF executable, whole (or a script): a damaged copy would start (or
      // fail to start) as a crash of the launcher, once per try.
      if (std::string why = elfProblem(path); !why.empty()) {
        error = "stage executable '" + path + "' is damaged: " + why +
                " (compile again, or copy the run folder again)";
        return false;
      }
      byRank[rank] = path;
      stageOfByRank[rank] = int(s.stage);
    }
  }
  int64_t expect = 0;
  for (auto &[rank, path] : byRank) {
    if (rank != expect++) {
      error = "'" + manifestPath + "': ranks must be 0.." +
              std::to_string(byRank.size() - 1);
      return false;
    }
    bins.push_back(path);
    stageOfRank.push_back(stageOfByRank[rank]);
  }
  return true;
}

/// True when some rank created its status record (it got past MPI_Init).
bool anyRankStarted(const std::string &statusDir, size_t ranks) {
  for (size_t r = 0; r < ranks; ++r)
    if (sys::exists(rankStatusPath(statusDir, r)))
      return true;
  return false;
}

/// After a failed job: reads the ranks' status records (runtime
/// core/status.h) and names every rank that ended without a report (killed
/// or crashed), with its stage and the step it was in. The ranks that failed
/// cleanly already printed their own error line; when one did, the ranks
/// that have no complete record were stopped by the abort while starting
/// (a record is created, then filled) and are not blamed.
void reportSilentRanks(const std::string &statusDir,
                       const std::vector<std::string> &hostOfRank,
                       const std::vector<int> &stageOfRank, size_t ranks,
                       const LauncherReport &report) {
  const std::vector<RankDeath> &deaths = report.deaths;
  struct Record {
    bool complete = false;
    int32_t stage = 0, state = 0;
    int64_t step = 0;
    std::string path;
  };
  std::vector<Record> records(ranks);
  // A rank that printed its own error line explains the failure (its
  // record may be on another host, or overwritten when the launcher ended
  // the ranks that were still finishing).
  bool someoneReported = report.rankReported;
  for (size_t r = 0; r < ranks; ++r) {
    Record &rec = records[r];
    rec.path = rankStatusPath(statusDir, r);
    std::string data, unreadable;
    if (!sys::readFile(rec.path, data, unreadable))
      continue;
    if (data.size() < 32 || data.compare(0, 8, "pipecst1") != 0)
      continue;
    rec.complete = true;
    std::memcpy(&rec.stage, data.data() + 12, 4);
    std::memcpy(&rec.step, data.data() + 16, 8);
    std::memcpy(&rec.state, data.data() + 24, 4);
    someoneReported |= rec.state == 2; // RankState::Error
  }
  // Ranks on other hosts keep their records there (no shared filesystem):
  // a death the launcher saw is named from its report, the others are
  // listed with their host, not blamed.
  // The step the job was in, as this host's ranks recorded it: a rank that
  // died on another host left its own record there.
  int64_t localStep = 0;
  for (const Record &rec : records)
    if (rec.complete)
      localStep = std::max(localStep, rec.step);
  std::set<size_t> seenDead, stoppedByLauncher;
  for (const RankDeath &d : deaths)
    if (d.consequence && d.rank >= 0)
      stoppedByLauncher.insert(size_t(d.rank));
  for (const RankDeath &d : deaths) {
    if (d.consequence)
      continue;
    // A rank whose record is here is reported from its record below.
    if (d.rank < 0 || size_t(d.rank) >= ranks ||
        records[size_t(d.rank)].complete ||
        !seenDead.insert(size_t(d.rank)).second)
      continue;
    std::cerr << "pipec: error: " << rankName(d.rank, stageOfRank) << " on "
              << d.host << " died without a report (" << d.how << ")"
              << (localStep > 0 ? " during step " + std::to_string(localStep)
                                : std::string())
              << "; the job was stopped\n";
    someoneReported = true;
  }
  std::vector<std::string> elsewhere;
  for (size_t r = 0; r < ranks; ++r)
    if (r < hostOfRank.size() && !isLocalHost(hostOfRank[r]) &&
        !records[r].complete && !seenDead.count(r))
      elsewhere.push_back("rank " + std::to_string(r) + " on " +
                          hostOfRank[r]);
  if (!elsewhere.empty() && !someoneReported && seenDead.empty())
    std::cerr << "pipec: note: no status record here of "
              << sys::join(elsewhere, ", ")
              << " (each host keeps its ranks' records in " << statusDir
              << ")\n";
  bool noneStarted = true;
  for (const Record &rec : records)
    noneStarted &= !rec.complete;
  if (noneStarted && elsewhere.size() < ranks && !someoneReported) {
    std::cerr << "pipec: error: the job ended before any rank on this "
                 "host started training (see the launcher's message "
                 "above)\n";
    return;
  }
  for (size_t r = 0; r < ranks; ++r) {
    const Record &rec = records[r];
    if (r < hostOfRank.size() && !isLocalHost(hostOfRank[r]) &&
        !rec.complete)
      continue;
    if (!rec.complete) {
      if (!someoneReported)
        std::cerr << "pipec: error: rank " << r
                  << " ended before it started training (no complete "
                     "status record "
                  << rec.path << ")\n";
      continue;
    }
    if (rec.state != 0) // finished, reported its error, or stopped by mpirun
      continue;
    if (stoppedByLauncher.count(r) && !deaths.empty() &&
        !(deaths.front().rank >= 0 && size_t(deaths.front().rank) == r))
      continue; // srun killed it while cancelling the step

    if (someoneReported && rec.step == 0)
      continue; // still starting when the reported failure ended the job
    std::cerr << "pipec: error: rank " << r << " (stage " << rec.stage
              << ") died without a report "
              << (rec.step == 0 ? std::string("during start-up")
                                : "during step " + std::to_string(rec.step))
              << " (killed or crashed); the job was stopped\n";
  }
}

/// "dir/trace.json" -> "dir/trace.rank{rank}.json" (the runtime's pattern).
std::string rankTracePattern(const std::string &path) {
  // The extension of the file name (not of a folder): ".json".
  const size_t slash = path.rfind('/');
  size_t dot = path.rfind('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) ||
      dot == (slash == std::string::npos ? 0 : slash + 1))
    dot = path.size();
  return path.substr(0, dot) + ".rank{rank}" + path.substr(dot);
}

/// Concatenates the ranks' trace arrays into `path` and removes them.
bool mergeTraces(const std::string &path, size_t ranks, std::string &error) {
  nlohmann::json all = nlohmann::json::array();
  std::string pattern = rankTracePattern(path);
  std::vector<std::string> parts;
  for (size_t r = 0; r < ranks; ++r) {
    std::string part = pattern;
    part.replace(part.find("{rank}"), 6, std::to_string(r));
    std::string text, unreadable;
    if (!sys::readFile(part, text, unreadable)) {
      error = "rank " + std::to_string(r) + " wrote no trace '" + part + "'";
      return false;
    }
    nlohmann::json events =
        nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!events.is_array()) {
      error = "trace '" + part + "' is not a JSON array";
      return false;
    }
    for (nlohmann::json &event : events)
      all.push_back(std::move(event));
    parts.push_back(part);
  }
  nlohmann::json merged = {{"traceEvents", std::move(all)},
                           {"displayTimeUnit", "ms"}};
  if (!sys::writeFile(path, merged.dump() + "\n", error))
    return false;
  for (const std::string &part : parts)
    sys::removeAll(part);
  return true;
}

/// The options of `pipec train` (and pipec-run).
void declareTrainOptions(Args &a) {
  a.positional("OUT", "a folder written by `pipec compile`")
      .opt("--steps", "training steps (with --resume: the step to reach)", "10")
      .opt("--lr", "SGD learning rate", "0.01")
      .opt("--inputs", ".npy file(s) of model inputs, comma-separated, one "
                       "per input (default: synthetic)")
      .opt("--labels", ".npy file of int labels (default: synthetic)")
      .opt("--seed", "seed of the synthetic data", "0")
      .opt("--checkpoint-every", "also checkpoint every N steps", "0")
      .opt("--checkpoint-dir", "checkpoint folder (default OUT/checkpoints)")
      .opt("--metrics", "metrics file (default OUT/metrics.jsonl)")
      .opt("--profile-out", "write per-op times (pipec.profile/1)")
      .opt("--trace", "write a Chrome trace of the run (every rank's "
                      "forwards, backwards, updates and waits; open in "
                      "Perfetto)")
      .opt("--summary-out", "write each rank's memory and weight-version "
                            "summary (JSON; {stage} is replaced)")
      .opt("--mpirun", "MPI launcher", "mpirun")
      .opt("--hostfile", "hosts to run on, one per line: `host [slots=N]` "
                         "(a host without slots= runs one rank); ranks fill "
                         "the hosts in order, one per slot")
      .opt("--hosts", "hosts to run on: host[:slots],... (as --hostfile)")
      .opt("--launcher",
           "mpirun, or srun (SLURM: a --multi-prog file in "
           "OUT)",
           "mpirun")
      .opt("--launcher-args", "more arguments for the launcher, as one "
                              "shell-quoted string (e.g. \"--mca btl "
                              "tcp,self\")")
      .opt("--watchdog-s",
           "a rank that makes no progress for this many "
           "seconds (or 4x its longest step) stops the job "
           "naming what it waits for; 0: off (default 20: the job ends "
           "within about 30 s)")
      .opt("--watchdog-first-step-s", "the first step, not yet timed, may "
                                      "make no progress this long (default "
                                      "300: a long first operation is not a "
                                      "hang)")
      .opt("--resume-from", "continue from a checkpoint of another build "
                            "of the same model (other stages, schedule, "
                            "replicas): a step folder, or a checkpoints "
                            "folder with `latest`")
      .flag("--resume", "continue from the latest checkpoint up to step "
                        "--steps (synchronous schedules: bit-identical to an "
                        "uninterrupted run)")
      .flag("--no-weight-stashing", "1f1b only: backwards read the live "
                                    "weights (PipeDream's ablation)")
      .flag("--vertical-sync", "1f1b only: every stage uses the input "
                               "stage's weight version for a minibatch")
      .flag("--bind-cores",
            "pin each rank to its block of its host's CPUs, in rank order "
            "(several ranks to a CPU when they outnumber them): steadier "
            "steps, and the sharing `pipec topology --measure --bind-cores` "
            "describes to the simulator")
      .flag("--prefetch", "post the step's receives at its start (staging "
                          "buffers; synchronous schedules) instead of "
                          "receiving each message where it is used")
      .flag("--allow-tf32", "CUDA stages: TF32 tensor-core math in float32 "
                            "GEMMs (off: float32 results match the CPU "
                            "kernels to rounding)")
      .flag("--cuda-graphs",
            "CUDA stages: capture each forward, backward and update once as "
            "a CUDA graph and replay it (fewer kernel launches; off while "
            "--profile-out or --check-kernels)")
      .flag("--check-kernels",
            "CUDA stages: run every kernel call on the CPU kernel too and "
            "report where the GPU parts from it (slow; for debugging)")
      .flag("--dry-run", "print the launcher's command instead of running it")
      .flag("--quiet", "no per-step lines");
}

/// The arguments every stage executable gets (paths made absolute).
std::vector<std::string> stageArguments(const Args &a,
                                        const std::string &manifest,
                                        int64_t steps, int64_t every,
                                        int64_t seed) {
  std::vector<std::string> stageArgs = {
      "--manifest", manifest, "--steps", std::to_string(steps), "--lr",
      a.get("--lr"), "--seed", std::to_string(seed), "--checkpoint-every",
      std::to_string(every)};
  auto pass = [&](const char *flag, bool isPath) {
    if (a.has(flag)) {
      stageArgs.push_back(flag);
      std::string v = a.get(flag);
      if (isPath) {
        std::string joined;
        for (const std::string &p : sys::split(v, ','))
          joined += (joined.empty() ? "" : ",") + absolute(p);
        v = joined;
      }
      stageArgs.push_back(v);
    }
  };
  pass("--inputs", true);
  pass("--labels", true);
  pass("--checkpoint-dir", true);
  pass("--metrics", true);
  pass("--profile-out", true);
  pass("--summary-out", true);
  pass("--resume-from", true);
  if (a.has("--trace")) {
    // Each rank writes OUT.rank{R}.json; merged into OUT after the run.
    stageArgs.push_back("--trace");
    stageArgs.push_back(rankTracePattern(absolute(a.get("--trace"))));
  }
  if (a.has("--no-weight-stashing"))
    stageArgs.push_back("--no-weight-stashing");
  if (a.has("--resume"))
    stageArgs.push_back("--resume");
  if (a.has("--vertical-sync"))
    stageArgs.push_back("--vertical-sync");
  if (a.has("--prefetch"))
    stageArgs.push_back("--prefetch");
  if (a.has("--bind-cores"))
    stageArgs.push_back("--bind-cores");
  for (const char *flag : {"--allow-tf32", "--check-kernels", "--cuda-graphs"})
    if (a.has(flag))
      stageArgs.push_back(flag);
  if (a.has("--quiet"))
    stageArgs.push_back("--quiet");
  pass("--watchdog-s", false);
  pass("--watchdog-first-step-s", false);
  return stageArgs;
}

/// Where the ranks go and what the launcher gets besides (hosts, slots,
/// --launcher-args). False with `error` (a usage error).
bool planLaunch(const Args &a, LaunchPlan &plan, std::string &error) {
  if (a.has("--hostfile") && a.has("--hosts")) {
    error = "give --hostfile or --hosts, not both";
    return false;
  }
  if ((a.has("--hostfile") &&
       !readHostfile(absolute(a.get("--hostfile")), plan.hosts, error)) ||
      (a.has("--hosts") && !parseHostList(a.get("--hosts"), plan.hosts, error)))
    return false;
  if (!plan.hosts.empty() &&
      !placeRanks(plan.hosts, plan.bins.size(), plan.hostOfRank, error))
    return false;
  if (!splitWords(a.get("--launcher-args"), plan.launcherArgs, error)) {
    error = "--launcher-args: " + error;
    return false;
  }
  return true;
}

/// The launcher program and its files: mpirun's MPMD line, or srun with
/// the tasks' programs in a --multi-prog file and (when placed) their hosts
/// in SLURM_HOSTFILE, one line per task; both kept in OUT.
struct Launcher {
  bool srun = false;
  std::string path, out, srunConfig, srunHostfile;

  std::vector<std::string> command(const LaunchPlan &p) {
    if (!srun)
      return mpirunCommand(path, p, geteuid() == 0);
    srunHostfile = p.hostOfRank.empty() ? "" : out + "/srun.hosts";
    return srunCommand(path, p, out + "/srun.multi-prog", srunConfig);
  }

  bool writeFiles(const LaunchPlan &plan, std::string &error) {
    if (!srun)
      return true;
    std::string hosts;
    for (const std::string &h : plan.hostOfRank)
      hosts += h + "\n";
    for (auto [file, text] : {std::pair{out + "/srun.multi-prog", srunConfig},
                              std::pair{srunHostfile, hosts}}) {
      if (file.empty())
        continue;
      if (!sys::writeFile(file, text, error))
        return false;
    }
    if (!srunHostfile.empty())
      setenv("SLURM_HOSTFILE", srunHostfile.c_str(), 1);
    return true;
  }

  /// The command as a shell line (--dry-run).
  std::string line(const std::vector<std::string> &cmd) const {
    std::string text;
    if (const char *threads = std::getenv("OPENBLAS_NUM_THREADS"))
      text += std::string("OPENBLAS_NUM_THREADS=") + threads + " ";
    if (!srunHostfile.empty())
      text += "SLURM_HOSTFILE=" + shellQuote(srunHostfile) + " ";
    for (size_t i = 0; i < cmd.size(); ++i)
      text += (i ? " " : "") + shellQuote(cmd[i]);
    return text;
  }
};

/// After the job: one line for what ended it (a watchdog, a lost host, a
/// rank that died), and the exit status pipec train returns.
int reportOutcome(int rc, const LauncherReport &report, const LaunchPlan &plan,
                  const std::string &statusDir) {
  if (report.interrupted) {
    std::cerr << "pipec: stopped by signal " << report.interrupted
              << ": the job was ended; the last complete checkpoint "
                 "(if any) is kept\n";
    return rc;
  }
  if (!report.notStarted.empty() || !report.waitingInInit.empty()) {
    auto names = [&](const std::vector<int> &ranks) {
      std::vector<std::string> out;
      for (int r : ranks)
        out.push_back(rankName(r, plan.stageOfRank));
      return sys::join(out, ", ");
    };
    std::cerr << "pipec: error: the job had not started by the start-up "
                 "deadline (PIPEC_START_TIMEOUT_S, default 60 s): ";
    if (!report.notStarted.empty())
      std::cerr << names(report.notStarted)
                << " never started the runtime (its executable exited or "
                   "hangs before it)"
                << (report.waitingInInit.empty()
                        ? ""
                        : "; " + names(report.waitingInInit) +
                              " waited for it in MPI_Init");
    else
      std::cerr << names(report.waitingInInit)
                << " waited in MPI_Init (MPI could not bring the job up)";
    std::cerr << "; the job was stopped\n";
    return 1;
  }
  if (report.daemonsFailed) {
    std::cerr << "pipec: error: the launcher could not start its daemon on "
                 "every host (the line above names the host: unreachable, "
                 "unknown, or without MPI); no rank started and nothing "
                 "was written\n";
    return rc == 0 ? 1 : rc;
  }
  // A watchdog stopped the job: one line for all the ranks that reported.
  if (!report.watchdog.empty()) {
    std::cerr << summarizeWatchdog(report.watchdog, plan.stageOfRank) << "\n";
    if (report.stopped)
      std::cerr << "pipec: note: pipec stopped the launcher 5 s after "
                   "the first watchdog line; ranks it cannot reach end by "
                   "their own watchdog.\n";
    rc = kWatchdogStatus;
  } else if (!report.lostHosts.empty()) {
    // A host's daemon is gone: the host died or its link did.
    for (const std::string &host : report.lostHosts) {
      std::vector<std::string> there;
      for (size_t r = 0; r < plan.hostOfRank.size(); ++r)
        if (plan.hostOfRank[r] == host)
          there.push_back(std::to_string(r));
      std::string ranks = there.empty()
                              ? ""
                              : (there.size() == 1 ? " (rank " : " (ranks ") +
                                    sys::join(there, ", ") + ")";
      std::cerr << "pipec: error: host " << host << " was lost" << ranks
                << ": the launcher lost its MPI daemon (the machine or "
                   "its link went down); the job was stopped\n";
    }
    rc = kWatchdogStatus;
  } else if (!statusDir.empty() && rc != 0) {
    reportSilentRanks(statusDir, plan.hostOfRank, plan.stageOfRank,
                      plan.bins.size(),
                      report);
    // A rank killed by a signal: 128 + the signal, whatever the launcher
    // made of it (OpenMPI returns the signal number, or 205, on other hosts).
    for (const RankDeath &d : report.deaths)
      if (d.signal > 0 && !d.consequence) {
        rc = 128 + d.signal;
        break;
      }
  }
  return rc;
}

} // namespace

int pipec::driver::runTrain(const std::vector<std::string> &argv,
                            const char *argv0) {
  // pipec-run is this command without the compiler: it names itself.
  const bool standalone =
      argv0 && std::filesystem::path(argv0).filename() == "pipec-run";
  const std::string me = standalone ? "pipec-run" : "train";
  Args a("train", argv);
  if (standalone)
    a.callAs("pipec-run");
  declareTrainOptions(a);
  if (!a.parse())
    return a.helpShown ? 0 : 2;
  if (a.positionals().size() != 1)
    return fail(me, "expected the OUT folder of `pipec compile`", 2);
  std::string out = absolute(a.positionals()[0]);
  std::string manifest = out + "/manifest.json";
  std::vector<std::string> bins;
  std::vector<int> stageOfRank;
  std::string error;
  bool replicated = false;
  pipec::formats::Manifest build;
  if (!readStages(manifest, build, bins, stageOfRank, error, replicated))
    return fail(me, error);
  if (a.has("--vertical-sync") && replicated)
    return fail(me,
                "--vertical-sync is not defined for replicated "
                "stages: a replicated stage updates once per round "
                "of its replicas' minibatches, so the version "
                "numbers of its stages differ",
                2);
  if (a.has("--resume") && a.has("--resume-from"))
    return fail(me, "give --resume or --resume-from, not both", 2);
  // The values the stage executables would refuse, refused here with this
  // command's usage (not the stage's).
  for (const char *flag : {"--watchdog-s", "--watchdog-first-step-s"}) {
    double seconds = 0;
    if (a.has(flag) && !a.getDouble(flag, seconds))
      return 2;
    if (seconds < 0)
      return fail(me, std::string(flag) + " must be >= 0 (0: off)", 2);
  }
  if (!checkDataFiles(a, build, error))
    return fail(me, error, 2);
  int64_t steps, every, seed;
  double lr;
  if (!a.getInt("--steps", steps, 1, std::numeric_limits<int64_t>::max()) ||
      !a.getDouble("--lr", lr) ||
      !a.getInt("--checkpoint-every", every, 0,
                std::numeric_limits<int64_t>::max()) ||
      !a.getInt("--seed", seed, 0, std::numeric_limits<int64_t>::max()))
    return 2;
  LaunchPlan plan;
  plan.bins = bins;
  plan.stageOfRank = stageOfRank;
  plan.stageArgs = stageArguments(a, manifest, steps, every, seed);
  plan.exportEnv = exportedEnv();
  if (!planLaunch(a, plan, error))
    return fail(me, error, 2);
  Launcher launcher;
  launcher.out = out;
  const std::string launcherKind = a.get("--launcher");
  if (launcherKind != "mpirun" && launcherKind != "srun")
    return fail(
        me, "--launcher must be mpirun or srun, not '" + launcherKind + "'", 2);
  launcher.srun = launcherKind == "srun";
  const std::string wanted = launcher.srun ? "srun" : a.get("--mpirun");
  launcher.path = findLauncher(wanted, error);
  if (launcher.path.empty() && !a.has("--dry-run"))
    return fail(me, error);
  if (launcher.path.empty())
    launcher.path = wanted;
  std::vector<std::string> cmd = launcher.command(plan);
  if (a.has("--dry-run")) {
    if (!launcher.writeFiles(plan, error))
      return fail(me, error);
    std::cout << launcher.line(cmd) << "\n";
    return 0;
  }
  (void)argv0;
  // Each rank keeps a status record there (ranks on other hosts make the
  // same folder on their own host), so that a rank that is killed or
  // crashes can still be named with its stage and step afterwards.
  std::string statusError;
  const std::string statusDir = sys::makeTempDir("pipec-status", statusError);
  if (!statusDir.empty()) {
    LaunchPlan withStatus = plan;
    withStatus.stageArgs.push_back("--status-dir");
    withStatus.stageArgs.push_back(statusDir);
    cmd = launcher.command(withStatus);
  }
  if (!launcher.writeFiles(plan, error))
    return fail(me, error);
  // The ranks print their own error line; pass their exit status through
  // (1 error, 2 usage, 3 non-finite loss, 4 a watchdog stopped the job; the
  // launcher's code for a killed rank).
  // A signal from here on stops the job and still cleans up (the status
  // folder), also between the two launches below and during the clean-up.
  InterruptsNoted interrupts;
  LauncherReport report;
  // Where every rank runs here, a rank that has not joined MPI 60 s after
  // the launch (PIPEC_START_TIMEOUT_S; 0: no deadline) stops the job.
  StartWatch startWatch;
  startWatch.statusDir = statusDir;
  startWatch.ranks = bins.size();
  if (const char *t = std::getenv("PIPEC_START_TIMEOUT_S"))
    startWatch.seconds = std::atof(t);
  const bool watchStart = !statusDir.empty() && plan.hostOfRank.empty() &&
                          !launcher.srun && startWatch.seconds > 0;
  const StartWatch *start = watchStart ? &startWatch : nullptr;
  int rc = runLauncher(cmd, &report, 5, start);
  // On this machine only: a launch that failed before any rank started
  // (OpenMPI's launcher can fail to start its daemons on a loaded machine:
  // "Returned value Error (-1) instead of ORTE_SUCCESS") ran nothing:
  // launch once more. Usage errors (2) are not retried, nor a launch onto
  // other hosts (an unreachable host is reported, not retried).
  const bool started =
      statusDir.empty() || anyRankStarted(statusDir, bins.size());
  if (rc != 0 && rc != 2 && !started && plan.hostOfRank.empty() &&
      !launcher.srun && !InterruptsNoted::signal() &&
      report.notStarted.empty() && report.waitingInInit.empty()) {
    std::cerr << "pipec: note: mpirun failed before any rank started (exit "
              << rc << "); launching once more\n";
    report = LauncherReport();
    rc = runLauncher(cmd, &report, 5, start);
  }
  if (const int sig = InterruptsNoted::signal(); sig && !report.interrupted) {
    report.interrupted = sig; // noted after the launcher ended
    rc = 128 + sig;
  }
  rc = reportOutcome(rc, report, plan, statusDir);
  if (!statusDir.empty())
    sys::removeAll(statusDir);
  if (rc == 0 && a.has("--trace")) {
    std::string error;
    if (!mergeTraces(absolute(a.get("--trace")), bins.size(), error))
      return fail(me, error);
    if (!a.has("--quiet"))
      std::cout << (standalone ? "pipec-run" : "pipec train")
                << ": wrote the trace of " << bins.size() << " ranks to "
                << a.get("--trace") << "\n";
  }
  return rc < 0 ? 1 : rc;
}
