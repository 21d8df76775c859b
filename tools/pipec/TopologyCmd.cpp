//===- TopologyCmd.cpp - pipec topology --measure -------------------------===//
//
// Part of the pipec driver.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// `pipec topology --measure [--processes N] -o T.json` writes the
/// topology of N stage processes on this machine with a link measured
/// rather than assumed: pipec-linkprobe (beside pipec) runs as two MPI
/// ranks through the same launcher as `pipec train` and times messages of
/// 8 bytes to 64 MiB the way a CPU stage sends them (a staging copy, then
/// MPI); the link is latency + bytes / bandwidth fitted to the times of
/// the messages of --fit-from .. --fit-to bytes (64 KiB .. 64 MiB by
/// default; fitLink below). Smaller messages go by another protocol
/// (OpenMPI's eager one, below 4 KiB here), and on one host the copies of
/// messages that fit the caches run about twice as fast as the larger
/// ones: fit the range the model's messages fall in. With more processes than
/// cores the host level says how many `processors` they share, which the
/// simulator's processor sharing uses. The device memory is the machine's.
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
#include <unistd.h>

using namespace pipec;
using namespace pipec::driver;

namespace {

/// latency + bytes / bandwidth fitted to the messages of `from` to `to`
/// bytes (what the stages send: activations and their gradients), by
/// least squares
/// on the relative error (weights 1 / t^2, so that 64 KiB counts as much
/// as 64 MiB); the latency is at least the 8-byte message's time. `worst`:
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
  latency = std::max(latency, seconds.front());
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

int pipec::driver::runTopology(const std::vector<std::string> &argv,
                               const char *argv0) {
  Args a("topology", argv);
  a.flag("--measure", "time messages between two processes on this machine "
                      "and fit the link (latency + bytes / bandwidth)")
      .opt("-o", "output topology (pipec.topology/1)", "topology.json")
      .opt("--processes", "stage processes the topology has on this machine",
           "2")
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
  if (!a.has("--measure"))
    return fail("topology", "nothing to do: --measure writes a measured "
                            "topology (hand-written ones: "
                            "examples/topologies)");
  int64_t processes = 2, from = 0, to = 0;
  if (!a.getInt("--processes", processes, 1) ||
      !a.getBytes("--fit-from", from) || !a.getBytes("--fit-to", to))
    return 2;
  if (from < 8 || to > (int64_t(64) << 20) || from * 2 > to)
    return fail("topology", "--fit-from and --fit-to must span at least a "
                            "factor of 2 within 8 B .. 64 MiB");
  std::string error;
  std::string mpirun = findLauncher(a.get("--mpirun"), error);
  if (mpirun.empty())
    return fail("topology", error);
  std::string self = llvm::sys::fs::getMainExecutable(
      argv0, reinterpret_cast<void *>(&pipec::driver::runTopology));
  std::string probe =
      (llvm::sys::path::parent_path(self) + "/pipec-linkprobe").str();
  if (!sys::canExecute(probe))
    probe = sys::findProgram("pipec-linkprobe");
  if (probe.empty())
    return fail("topology", "pipec-linkprobe is neither beside pipec nor "
                            "on PATH (it is built with pipec)");
  std::string tmp = sys::makeTempDir("pipec-topology", error);
  if (tmp.empty())
    return fail("topology", error);
  LaunchPlan plan;
  plan.bins = {probe, probe};
  plan.stageArgs = {"--out", tmp + "/probe.json"};
  plan.exportEnv = exportedEnv();
  llvm::outs() << "pipec topology: timing messages of 8 B to 64 MiB between "
                  "two processes\n";
  llvm::outs().flush();
  int rc = runLauncher(mpirunCommand(mpirun, plan, geteuid() == 0));
  std::string text;
  bool read = rc == 0 && sys::readFile(tmp + "/probe.json", text, error);
  sys::removeAll(tmp);
  if (!read)
    return fail("topology", rc != 0 ? "the probe failed (exit status " +
                                          std::to_string(rc) + ")"
                                    : error);
  std::vector<double> sizes, seconds;
  llvm::Expected<llvm::json::Value> doc = llvm::json::parse(text);
  if (!doc)
    return fail("topology",
                "the probe's output: " + llvm::toString(doc.takeError()));
  const llvm::json::Object *object = doc->getAsObject();
  for (auto [key, into] : {std::pair{"sizes", &sizes}, {"seconds", &seconds}}) {
    const llvm::json::Array *list = object ? object->getArray(key) : nullptr;
    for (size_t k = 0; list && k < list->size(); ++k)
      if (std::optional<double> v = (*list)[k].getAsNumber())
        into->push_back(*v);
  }
  double latency = 0, bandwidth = 0, worst = 0;
  if (!fitLink(sizes, seconds, double(from), double(to), latency, bandwidth,
               worst, error))
    return fail("topology", error);

  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  Topology topology;
  topology.deviceMemoryBytes =
      int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGESIZE));
  TopologyLevel host;
  char name[256] = "this machine";
  gethostname(name, sizeof(name) - 1);
  host.name = std::string("host ") + name;
  host.count = int(processes);
  host.bandwidth = bandwidth;
  host.latency = latency;
  if (cores > 0 && processes > cores)
    host.processors = int(cores);
  topology.levels.push_back(host);
  std::string out = sys::absolute(a.get("-o"));
  if (!sys::writeFile(out, topologyToJson(topology) + "\n", error))
    return fail("topology", error);
  char line[512];
  std::snprintf(line, sizeof line,
                "pipec topology: latency %.2f us, bandwidth %.2f GB/s "
                "(worst fit error %.0f%% over %s .. %s); %lld processes "
                "on %s, %ld cores%s\n",
                latency * 1e6, bandwidth / 1e9, worst * 100,
                a.get("--fit-from").c_str(), a.get("--fit-to").c_str(),
                static_cast<long long>(processes), name, cores,
                host.processors ? " shared" : "");
  llvm::outs() << line << "pipec topology: wrote " << out << "\n";
  return 0;
}
