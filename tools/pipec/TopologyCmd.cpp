//===- TopologyCmd.cpp - pipec topology --measure -------------------------===//
//
// Part of the pipec driver.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `pipec topology --measure [--target cpu|cuda] [--processes N] -o T.json`
/// writes the topology of N stage processes on this machine with a link
/// measured rather than assumed: pipec-linkprobe (or pipec-linkprobe-cuda,
/// beside pipec) runs as two MPI ranks through the same launcher as `pipec
/// train` and times messages of 8 bytes to 64 MiB through the runtime's own
/// communicator and device, so a message costs what a stage's does (on the
/// CPU a staging copy, then MPI; on a GPU also the copies to and from the
/// host, or the CUDA IPC path between ranks sharing a GPU, the default;
/// PIPEC_CUDA_IPC=0, which the launcher passes on, measures host-staged).
/// `--fit PROBE.json` fits a file the probe wrote elsewhere (a GPU node needs
/// no compiler: `mpirun -n 2 pipec-linkprobe-cuda --out F`). The link is
/// latency + bytes / bandwidth fitted to the times of the messages of
/// --fit-from .. --fit-to bytes (64 KiB .. 64 MiB by default; fitLink below).
/// Smaller messages go by another protocol (OpenMPI's eager one, below 4 KiB
/// here), and on one host the copies of messages that fit the caches run about
/// twice as fast as the larger ones: fit the range the model's messages fall
/// in. The host level says how many `processors` the processes share
/// (--processors; for CPU stages the cores when they outnumber them), which the
/// simulator's processor sharing uses. The device memory is the probed
/// device's.
///
//===----------------------------------------------------------------------===//

#include "Driver.h"
#include "Launch.h"
#include "SysUtil.h"

#include "pipec/Topology.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>
#include <sched.h>
#include <unistd.h>

using namespace pipec;
using namespace pipec::driver;

namespace {

/// latency + bytes / bandwidth fitted to the messages of `from` to `to`
/// bytes (what the stages send: activations and their gradients), by
/// least squares
/// on the relative error (weights 1 / t^2, so that 64 KiB counts as much
/// as 64 MiB); the latency is at least the fastest message's time (not
/// always the 8-byte one: between two ranks sharing an H200, messages up to
/// 16 KiB took 152 us and 32 KiB ones 28 us). `worst`:
/// the largest relative error over those messages. False with `error`
/// when the times cannot be such a line.
bool fitLink(const std::vector<double> &sizes,
             const std::vector<double> &seconds, double from, double to,
             double &latency, double &bandwidth, double &worst,
             std::string &error) {
  if (sizes.size() != seconds.size() || sizes.size() < 3) {
    error = "the probe wrote too few times";
    return false;
  }
  // Minimise sum w (L + c s - t)^2: the normal equations of (L, c).
  double sw = 0, sws = 0, swss = 0, swt = 0, swst = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] < from || sizes[k] > to || !(seconds[k] > 0))
      continue;
    const double w = 1 / (seconds[k] * seconds[k]);
    sw += w;
    sws += w * sizes[k];
    swss += w * sizes[k] * sizes[k];
    swt += w * seconds[k];
    swst += w * sizes[k] * seconds[k];
  }
  const double det = sw * swss - sws * sws;
  const double slope = det > 0 ? (sw * swst - sws * swt) / det : 0;
  latency = det > 0 ? (swt - slope * sws) / sw : 0;
  if (!(slope > 0)) {
    error = "message times do not grow with the size";
    return false;
  }
  latency =
      std::max(latency, *std::min_element(seconds.begin(), seconds.end()));
  bandwidth = 1 / slope;
  worst = 0;
  for (size_t k = 0; k < sizes.size(); ++k)
    if (sizes[k] >= from && sizes[k] <= to)
      worst = std::max(worst,
                       std::fabs(latency + sizes[k] / bandwidth - seconds[k]) /
                           seconds[k]);
  return true;
}

} // namespace

namespace {

/// What a probe file (pipec-linkprobe's output) holds.
struct ProbeTimes {
  std::vector<double> sizes, seconds;
  std::string device, transport;
  int64_t deviceMemoryBytes = 0;
};

bool readProbe(const std::string &path, ProbeTimes &probe, std::string &error) {
  std::string text;
  if (!sys::readFile(path, text, error))
    return false;
  llvm::Expected<llvm::json::Value> doc = llvm::json::parse(text);
  if (!doc) {
    error = path + ": " + llvm::toString(doc.takeError());
    return false;
  }
  const llvm::json::Object *object = doc->getAsObject();
  if (!object || object->getString("format") != "pipec.linkprobe/1") {
    error = path + ": not a pipec.linkprobe/1 file (pipec-linkprobe's "
                   "output)";
    return false;
  }
  for (auto [key, into] :
       {std::pair{"sizes", &probe.sizes}, {"seconds", &probe.seconds}}) {
    const llvm::json::Array *list = object->getArray(key);
    for (size_t k = 0; list && k < list->size(); ++k)
      if (std::optional<double> v = (*list)[k].getAsNumber())
        into->push_back(*v);
  }
  probe.device = object->getString("device").value_or("").str();
  probe.transport = object->getString("transport").value_or("").str();
  probe.deviceMemoryBytes =
      object->getInteger("device_memory_bytes").value_or(0);
  return true;
}

/// Runs `probeName` (beside pipec, else on PATH) as two MPI ranks and
/// reads what it wrote.
bool runProbe(const std::string &probeName, const std::string &mpirunOpt,
              const char *argv0, ProbeTimes &probe, std::string &error) {
  std::string mpirun = findLauncher(mpirunOpt, error);
  if (mpirun.empty())
    return false;
  std::string self = llvm::sys::fs::getMainExecutable(
      argv0, reinterpret_cast<void *>(&pipec::driver::runTopology));
  std::string path =
      (llvm::sys::path::parent_path(self) + "/" + probeName).str();
  if (!sys::canExecute(path))
    path = sys::findProgram(probeName);
  if (path.empty()) {
    error = probeName +
            " is neither beside pipec nor on PATH (it is built "
            "with pipec" +
            (probeName == "pipec-linkprobe"
                 ? std::string(")")
                 : std::string(" when the CUDA toolkit is found)"));
    return false;
  }
  std::string tmp = sys::makeTempDir("pipec-topology", error);
  if (tmp.empty())
    return false;
  LaunchPlan plan;
  plan.bins = {path, path};
  plan.stageArgs = {"--out", tmp + "/probe.json"};
  plan.exportEnv = exportedEnv();
  llvm::outs() << "pipec topology: timing messages of 8 B to 64 MiB between "
                  "two processes ("
               << probeName << ")\n";
  llvm::outs().flush();
  int rc = runLauncher(mpirunCommand(mpirun, plan, geteuid() == 0));
  bool read = rc == 0 && readProbe(tmp + "/probe.json", probe, error);
  sys::removeAll(tmp);
  if (rc != 0)
    error = "the probe failed (exit status " + std::to_string(rc) + ")";
  return read;
}

} // namespace

int pipec::driver::runTopology(const std::vector<std::string> &argv,
                               const char *argv0) {
  Args a("topology", argv);
  a.flag("--measure", "time messages between two processes on this machine "
                      "and fit the link (latency + bytes / bandwidth)")
      .opt("--fit",
           "fit the link to a probe file instead of measuring (mpirun -n 2 "
           "pipec-linkprobe[-cuda] --out FILE on the machine that trains)",
           "")
      .opt("--target",
           "whose messages to time: cpu (host memory) or cuda (GPU memory)",
           "cpu")
      .opt("-o", "output topology (pipec.topology/1)", "topology.json")
      .opt("--processes", "stage processes the topology has on this machine",
           "2")
      .opt("--processors",
           "devices those processes share (0: for cpu with --measure, this "
           "machine's cores when the processes outnumber them; with --fit, "
           "whose probe ran elsewhere, and for cuda: one each)",
           "0")
      .flag("--bind-cores",
            "the processes will run with `pipec train --bind-cores` (each "
            "pinned to its block of this machine's cores, in rank order): "
            "when they outnumber the cores, the topology says which share "
            "one (a level of processes per core, one processor each)")
      .opt("--fit-from",
           "smallest message the link is fitted to (bytes, "
           "or with K/M/G)",
           "64K")
      .opt("--fit-to", "largest message the link is fitted to", "64M")
      .opt("--mpirun", "MPI launcher", "mpirun");
  if (!a.parse())
    return 2;
  if (a.helpShown)
    return 0;
  const std::string fitFile = a.get("--fit");
  if (!a.has("--measure") && fitFile.empty())
    return fail("topology", "nothing to do: --measure writes a measured "
                            "topology, --fit FILE one fitted to a probe "
                            "file (hand-written ones: examples/topologies)");
  if (a.has("--measure") && !fitFile.empty())
    return fail("topology", "--measure and --fit exclude each other");
  const std::string target = a.get("--target");
  if (target != "cpu" && target != "cuda")
    return fail("topology",
                "--target must be cpu or cuda, not '" + target + "'");
  int64_t processes = 2, processors = 0, from = 0, to = 0;
  if (!a.getInt("--processes", processes, 1) ||
      !a.getInt("--processors", processors, 0) ||
      !a.getBytes("--fit-from", from) || !a.getBytes("--fit-to", to))
    return 2;
  if (from < 8 || to > (int64_t(64) << 20) || from * 2 > to)
    return fail("topology", "--fit-from and --fit-to must span at least a "
                            "factor of 2 within 8 B .. 64 MiB");
  // The CPUs this process may use (a cpuset or taskset limits them): what
  // the runtime's --bind-cores and OpenBLAS threads count too.
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
      cores = CPU_COUNT(&allowed);
  }
  if (fitFile.empty()) {
    // Refused before the probe's minute: groups must be equal.
    const long c = processors > 0 ? processors : cores;
    if (a.has("--bind-cores") && target == "cpu" && c > 0 && processes > c &&
        processes % c != 0)
      return fail("topology",
                  "--bind-cores: " + std::to_string(processes) +
                      " processes do not fall evenly on " + std::to_string(c) +
                      " cores (a topology level needs equal groups); use a "
                      "multiple of the cores");
  }
  std::string error;
  ProbeTimes probe;
  if (!fitFile.empty() ? !readProbe(fitFile, probe, error)
                       : !runProbe(target == "cuda" ? "pipec-linkprobe-cuda"
                                                    : "pipec-linkprobe",
                                   a.get("--mpirun"), argv0, probe, error))
    return fail("topology", error);
  const bool cuda = probe.device.rfind("cuda", 0) == 0;
  double latency = 0, bandwidth = 0, worst = 0;
  if (!fitLink(probe.sizes, probe.seconds, double(from), double(to), latency,
               bandwidth, worst, error))
    return fail("topology", error);

  Topology topology;
  topology.deviceMemoryBytes =
      probe.deviceMemoryBytes > 0
          ? probe.deviceMemoryBytes
          : int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
  TopologyLevel host;
  char name[256] = "this machine";
  gethostname(name, sizeof(name) - 1);
  host.name = fitFile.empty()
                  ? std::string("host ") + name
                  : "host of " + llvm::sys::path::filename(fitFile).str();
  host.count = int(processes);
  host.bandwidth = bandwidth;
  host.latency = latency;
  if (processors > 0)
    host.processors = int(processors);
  else if (!cuda && fitFile.empty() && cores > 0 && processes > cores)
    host.processors = int(cores);
  if (a.has("--bind-cores") && !cuda && host.processors > 0 &&
      processes > host.processors) {
    // Bound in rank order, processes/cores to a core: ranks [k P/C,
    // (k+1) P/C) share core k (the runtime's --bind-cores).
    const int64_t cpus = host.processors;
    if (processes % cpus != 0)
      return fail("topology",
                  "--bind-cores: " + std::to_string(processes) +
                      " processes do not fall evenly on " +
                      std::to_string(cpus) +
                      " cores (a topology level needs equal groups); use a "
                      "multiple of the cores");
    TopologyLevel core = host;
    core.name = "core of " + host.name;
    core.count = int(processes / cpus);
    core.processors = 1;
    host.count = int(cpus);
    host.processors = 0;
    topology.levels.push_back(core);
  } else if (a.has("--bind-cores") && !cuda) {
    host.processors = 0; // a core (or more) of its own each
  }
  topology.levels.push_back(host);
  std::string out = sys::absolute(a.get("-o"));
  if (!sys::writeFile(out, topologyToJson(topology) + "\n", error))
    return fail("topology", error);
  char line[512];
  std::snprintf(line, sizeof line,
                "pipec topology: latency %.2f us, bandwidth %.2f GB/s "
                "(worst fit error %.0f%% over %s .. %s) on %s, %s; %lld "
                "processes",
                latency * 1e6, bandwidth / 1e9, worst * 100,
                a.get("--fit-from").c_str(), a.get("--fit-to").c_str(),
                probe.device.empty() ? "cpu" : probe.device.c_str(),
                probe.transport.empty() ? "MPI" : probe.transport.c_str(),
                static_cast<long long>(processes));
  llvm::outs() << line;
  if (topology.levels.size() > 1)
    llvm::outs() << ", bound " << topology.levels[0].count << " to a core";
  else if (host.processors)
    llvm::outs() << " sharing " << host.processors
                 << (cuda ? " GPU(s)" : " cores");
  llvm::outs() << "\npipec topology: wrote " << out << "\n";
  return 0;
}
