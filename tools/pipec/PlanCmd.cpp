//===- PlanCmd.cpp - pipec plan / simulate --------------------------------===//
//
//   pipec plan --profile P.json --topology T.json [--algorithm auto]
//              [--schedule S] [--microbatches m] [--global-batch B] -o plan.json
//   pipec simulate plan.json --profile P.json --topology T.json [--trace t.json]
//
// Planning works on a profile alone (no ONNX file), so paper-scale models
// (examples/profiles) can be planned for paper-scale clusters
// (examples/topologies).
//
//===----------------------------------------------------------------------===//
#include "Driver.h"
#include "SysUtil.h"

#include "pipec/Calibrate.h"
#include "pipec/Export.h"
#include "pipec/Planners.h"
#include "pipec/Schedule.h"
#include "pipec/Sim.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <cstdio>

using namespace pipec;
using namespace pipec::driver;

namespace {

using sys::readFile;
using sys::writeFile;

/// Loads and checks the profile and topology named by the options.
bool loadInputs(const Args &a, const std::string &cmd, Profile &profile,
                Topology &topology) {
  std::string text, error;
  if (a.get("--profile").empty()) {
    fail(cmd, "--profile PROFILE.json is required");
    return false;
  }
  if (a.get("--topology").empty()) {
    fail(cmd, "--topology TOPOLOGY.json is required (see examples/topologies)");
    return false;
  }
  if (!readFile(a.get("--profile"), text, error)) {
    fail(cmd, error);
    return false;
  }
  ProfileResult p = profileFromJson(text);
  if (!p.ok) {
    fail(cmd, "'" + a.get("--profile") + "': " + p.error);
    return false;
  }
  double total = 0;
  for (const ProfileOp &op : p.profile.ops)
    total += op.fwdSeconds + op.bwdSeconds;
  if (p.profile.ops.empty() || total <= 0) {
    fail(cmd, "'" + a.get("--profile") +
                  "' has no compute time (every op costs 0 s): nothing to plan");
    return false;
  }
  if (!readFile(a.get("--topology"), text, error)) {
    fail(cmd, error);
    return false;
  }
  TopologyResult t = topologyFromJson(text);
  if (!t.ok) {
    fail(cmd, "'" + a.get("--topology") + "': " + t.error);
    return false;
  }
  profile = std::move(p.profile);
  topology = std::move(t.topology);
  return true;
}

bool simOptions(const Args &a, const std::string &cmd, SimOptions &sim) {
  std::string opt = a.get("--optimizer");
  if (opt == "sgd")
    sim.optimizerStateFactor = 0;
  else if (opt == "momentum")
    sim.optimizerStateFactor = 1;
  else if (opt == "adam")
    sim.optimizerStateFactor = 2;
  else {
    fail(cmd, "unknown --optimizer '" + opt + "' (sgd, momentum, adam)");
    return false;
  }
  sim.recompute = a.has("--recompute");
  return true;
}

void printSim(const SimResult &sim) {
  char line[256];
  std::snprintf(line, sizeof line,
                "iteration %.6f s  %.1f samples/s  bubble %.1f%%\n",
                sim.iterationSeconds, sim.samplesPerSecond,
                sim.bubbleFraction * 100);
  llvm::outs() << line;
  for (size_t s = 0; s < sim.memory.size(); ++s) {
    const StageMemory &m = sim.memory[s];
    const bool arena = m.arenaModel; // an "arena" profile
    std::snprintf(line, sizeof line,
                  "  stage %zu: %.3f GiB (weights %.3f x%d, grads %.3f, "
                  "optimizer %.3f, activations %.3f, buffers %.3f",
                  s, m.total() / 1073741824.0, m.weights / 1073741824.0,
                  m.weightVersions, m.gradients / 1073741824.0,
                  m.optimizer / 1073741824.0, m.activations / 1073741824.0,
                  m.buffers / 1073741824.0);
    std::string text = line;
    if (arena) {
      std::snprintf(line, sizeof line, ", io %.3f, scratch %.3f",
                    m.io / 1073741824.0, m.scratch / 1073741824.0);
      text += line;
    }
    std::snprintf(line, sizeof line, "), in-flight %lld",
                  static_cast<long long>(
                      s < sim.peakInflight.size() ? sim.peakInflight[s] : 0));
    text += line;
    if (arena) {
      // What the compiler's static arena will take.
      std::snprintf(line, sizeof line,
                    ", arena %lld bytes (stash %lld, io %lld, scratch %lld)",
                    static_cast<long long>(m.arena()),
                    static_cast<long long>(m.activations),
                    static_cast<long long>(m.io),
                    static_cast<long long>(m.scratch));
      text += line;
    }
    llvm::outs() << text << "\n";
  }
  if (!sim.fitsMemory)
    llvm::outs() << "  does NOT fit in device memory\n";
}

/// A file next to the plan: PLAN.json -> PLAN<suffix>.
std::string besidePlan(std::string planPath, const char *suffix) {
  if (llvm::StringRef(planPath).ends_with(".json"))
    planPath.resize(planPath.size() - 5);
  return planPath + suffix;
}

/// --schedule synth: the synthesiser's order for `plan` (a straight
/// pipeline) within `memoryLimit` bytes per device. The simulator's memory
/// model of the plan under 1f1b-flush gives each stage's fixed bytes
/// (weights, gradients, optimizer state, buffers) and its stash per
/// microbatch; the limit becomes a cap on each stage's microbatches in
/// flight. Prints the orders compared; the plan becomes "custom" and
/// `csv` its order.
int synthesizePlan(const Profile &profile, const Topology &topology,
                   const PlannerOptions &options, int64_t memoryLimit,
                   Plan &plan, std::string &csv) {
  SimResult sim = simulatePlan(profile, topology, plan, options.sim);
  if (!sim.ok)
    return fail("plan", "the plan does not simulate: " + sim.error);
  std::vector<int64_t> caps;
  for (int s = 0; s < plan.numStages(); ++s) {
    const StageMemory &mem = sim.memory[size_t(s)];
    const int64_t inflight = std::max<int64_t>(sim.peakInflight[size_t(s)], 1);
    const int64_t perMicrobatch = mem.activations / inflight;
    const int64_t fixed = mem.total() - mem.activations;
    int64_t cap = plan.microbatches;
    if (memoryLimit > 0 && perMicrobatch > 0)
      cap = std::min<int64_t>(cap, (memoryLimit - fixed) / perMicrobatch);
    if (cap < 1)
      return fail("plan", "stage " + std::to_string(s) + " needs " +
                              std::to_string(fixed + perMicrobatch) +
                              " bytes with one microbatch in flight, over "
                              "the memory limit of " +
                              std::to_string(memoryLimit));
    caps.push_back(cap);
  }
  SynthResult synth =
      synthesizeSchedule(profile, topology, plan, caps, options.sim);
  if (!synth.ok)
    return fail("plan", "--schedule synth: " + synth.error);
  char line[256];
  llvm::outs() << "synthesised orders (in-flight caps";
  for (int64_t c : caps)
    llvm::outs() << " " << c;
  llvm::outs() << "):\n";
  for (const SynthCandidate &c : synth.candidates) {
    std::snprintf(line, sizeof line, "  %-28s %s\n", c.name.c_str(),
                  c.feasible
                      ? (std::to_string(c.iterationSeconds * 1e3) + " ms" +
                         (c.name == synth.best.name ? "  <- chosen" : ""))
                            .c_str()
                      : c.note.c_str());
    llvm::outs() << line;
  }
  std::string error;
  csv = scheduleToCsv(synth.best.schedule, error);
  if (csv.empty())
    return fail("plan", "--schedule synth: " + error);
  plan.schedule = "custom";
  plan.predicted.iterationSeconds = synth.best.iterationSeconds;
  plan.predicted.samplesPerSecond = synth.best.iterationSeconds > 0
                                        ? double(plan.microbatches) *
                                              double(plan.microbatchSize) /
                                              synth.best.iterationSeconds
                                        : 0;
  return 0;
}

/// --export megatron|torch: the plan for another runtime, next to the plan
/// unless --export-file says where.
int exportPlan(const Args &a, const Profile &profile, const Plan &plan) {
  const std::string to = a.get("--export");
  ExportResult result = to == "megatron" ? exportMegatronLayout(profile, plan)
                                         : exportTorchSchedule(plan);
  if (!result.ok)
    return fail("plan", "--export " + to + ": " + result.error +
                            " (the plan itself was written)");
  std::string path = a.get("--export-file");
  if (path.empty())
    path = besidePlan(a.get("-o"),
                      to == "megatron" ? ".megatron.txt" : ".torch.csv");
  std::string error;
  if (!writeFile(path, result.text, error))
    return fail("plan", error);
  for (const std::string &note : result.notes)
    llvm::outs() << "note: " << note << "\n";
  if (to == "megatron")
    llvm::outs() << result.text;
  llvm::outs() << "pipec plan: "
               << (to == "megatron" ? "Megatron-Core layout"
                                    : "torch.distributed.pipelining schedule")
               << " -> " << path << "\n";
  return 0;
}

} // namespace

int pipec::driver::runPlan(const std::vector<std::string> &argv) {
  Args a("plan", argv);
  a.opt("--profile", "pipec.profile/1 (measured or from examples/profiles)")
      .opt("--topology", "pipec.topology/1 (examples/topologies)")
      .opt("--algorithm",
           "auto, balanced, pipedream, dapple, madpipe, twobw, "
           "interleaved, exhaustive",
           "auto")
      .opt("--schedule", "gpipe, 1f1b-flush, 1f1b, 2bw, interleaved, zb-h1, "
                         "zb-h2, zb-v, dualpipev, synth (default: the "
                         "planner's)")
      .opt("--microbatches", "microbatches per iteration (default: the "
                             "planner's choice)")
      .opt("--global-batch", "samples per iteration")
      .opt("--microbatch", "samples per microbatch (default: the profile's)")
      .opt("--stages",
           "pipeline depth (default: the planner's choice; for madpipe the "
           "devices used, which may hold more than one stage each)")
      .opt("--chunks", "virtual chunks per device (interleaved)")
      .opt("--optimizer",
           "sgd, momentum or adam (optimizer state in the "
           "memory model)",
           "sgd")
      .flag("--recompute", "recompute activations in the backward")
      .opt("--memory-limit", "synth: bytes per device the schedule must fit "
                             "(default: the topology's device memory)")
      .opt("--export", "also write the plan for another runtime: megatron "
                       "(Megatron-Core's --pipeline-model-parallel-layout "
                       "and flags, transformer profiles) or torch "
                       "(torch.distributed.pipelining compute-only schedule "
                       "CSV, which pipec compile --schedule-csv reads)")
      .opt("--export-file", "where --export writes (default: next to -o, "
                            "PLAN.megatron.txt or PLAN.torch.csv)")
      .opt("-o", "output plan", "plan.json");
  if (!a.parse())
    return a.helpShown ? 0 : 2;
  Profile profile;
  Topology topology;
  if (!loadInputs(a, "plan", profile, topology))
    return 1;
  PlannerOptions options;
  options.schedule = a.get("--schedule");
  const bool synth = options.schedule == "synth";
  if (synth)
    options.schedule = "1f1b-flush"; // the straight plan the order is for
  if (!options.schedule.empty() && !parseScheduleKind(options.schedule))
    return fail("plan",
                "unknown --schedule '" + options.schedule +
                    "' (gpipe, 1f1b-flush, 1f1b, 2bw, interleaved, "
                    "zb-h1, zb-h2, zb-v, dualpipev, synth)",
                2);
  int64_t v = 0;
  if ((a.has("--microbatches") && !a.getInt("--microbatches", v, 1)))
    return 2;
  options.microbatches = v;
  v = 0;
  if (a.has("--global-batch") &&
      !a.getInt("--global-batch", v, 1, std::numeric_limits<int64_t>::max()))
    return 2;
  options.globalBatch = v;
  v = 0;
  if (a.has("--microbatch") &&
      !a.getInt("--microbatch", v, 1, std::numeric_limits<int64_t>::max()))
    return 2;
  options.microbatchSize = v;
  v = 0;
  if (a.has("--stages") && !a.getInt("--stages", v, 1))
    return 2;
  options.stages = v;
  v = 0;
  if (a.has("--chunks") && !a.getInt("--chunks", v, 1))
    return 2;
  options.chunks = v;
  if (!simOptions(a, "plan", options.sim))
    return 2;

  const std::string exportTo = a.get("--export");
  if (a.has("--export") && exportTo != "megatron" && exportTo != "torch")
    return fail("plan", "unknown --export '" + exportTo + "' (megatron, torch)",
                2);
  std::string algorithm = a.get("--algorithm");
  if (synth && algorithm == "auto")
    algorithm = "balanced"; // a straight pipeline, one device per stage
  int64_t memoryLimit = topology.deviceMemoryBytes;
  if (a.has("--memory-limit") && !a.getBytes("--memory-limit", memoryLimit))
    return 2;
  Plan plan;
  if (algorithm == "auto") {
    AutoPlanResult result = planAuto(profile, topology, options);
    llvm::outs() << candidateTable(result.candidates);
    if (!result.ok)
      return fail("plan", result.error);
    plan = result.best;
  } else {
    PlanResult result = runPlanner(algorithm, profile, topology, options);
    if (!result.ok)
      return fail("plan", result.error);
    plan = result.plan;
    SimResult sim = simulatePlan(profile, topology, plan, options.sim);
    if (!sim.ok)
      return fail("plan", "the " + algorithm + " plan does not simulate: " +
                              sim.error);
    plan.predicted.iterationSeconds = sim.iterationSeconds;
    plan.predicted.samplesPerSecond = sim.samplesPerSecond;
    plan.predicted.bubbleFraction = sim.bubbleFraction;
    plan.predicted.stageMemoryBytes.clear();
    for (const StageMemory &m : sim.memory)
      plan.predicted.stageMemoryBytes.push_back(m.total());
    printSim(sim);
  }
  std::string error;
  std::string synthCsv;
  if (synth) {
    int status =
        synthesizePlan(profile, topology, options, memoryLimit, plan, synthCsv);
    if (status != 0)
      return status;
  }
  if (!writeFile(a.get("-o"), planToJson(plan) + "\n", error))
    return fail("plan", error);
  if (synth) {
    std::string path = besidePlan(a.get("-o"), ".schedule.csv");
    if (!writeFile(path, synthCsv, error))
      return fail("plan", error);
    llvm::outs() << "pipec plan: synthesised schedule -> " << path
                 << " (pipec simulate " << a.get("-o") << " --schedule-csv "
                 << path << "; pipec compile --schedule-csv " << path << ")\n";
  }
  llvm::outs() << "pipec plan: " << plan.algorithm << ": "
               << plan.numStages() << " stages, " << plan.microbatches
               << " microbatches of " << plan.microbatchSize << ", "
               << plan.schedule << " -> " << a.get("-o") << "\n";
  if (a.has("--export"))
    return exportPlan(a, profile, plan);
  return 0;
}

int pipec::driver::runSimulate(const std::vector<std::string> &argv) {
  Args a("simulate", argv);
  a.positional("PLAN.json", "a plan written by `pipec plan` or `pipec compile`")
      .opt("--profile", "pipec.profile/1 the plan was made for")
      .opt("--topology", "pipec.topology/1")
      .opt("--trace", "write a Chrome trace (open in Perfetto)")
      .opt("--optimizer", "sgd, momentum or adam", "sgd")
      .opt("--schedule-csv", "simulate the order of a compute-only schedule "
                             "CSV (torch.distributed.pipelining's format, as "
                             "pipec compile --schedule-csv reads it) on the "
                             "plan's stages instead of the plan's schedule")
      .flag("--recompute", "recompute activations in the backward")
      .flag("--messages-on-link",
            "messages between devices sharing processors take their link "
            "only (by default their copies share the processors too)");
  if (!a.parse())
    return a.helpShown ? 0 : 2;
  if (a.positionals().size() != 1)
    return fail("simulate", "expected one PLAN.json", 2);
  Profile profile;
  Topology topology;
  if (!loadInputs(a, "simulate", profile, topology))
    return 1;
  std::string text, error;
  if (!readFile(a.positionals()[0], text, error))
    return fail("simulate", error);
  PlanResult plan = planFromJson(text);
  if (!plan.ok)
    return fail("simulate", "'" + a.positionals()[0] + "': " + plan.error);
  std::string invalid = validatePlan(plan.plan, profile.ops.size());
  if (!invalid.empty())
    return fail("simulate", "the plan does not fit the profile: " + invalid);
  if (plan.plan.microbatchSize != profile.microbatch && profile.microbatch > 0)
    llvm::outs() << "pipec simulate: note: the profile was measured at "
                    "microbatch "
                 << profile.microbatch << " and the plan runs "
                 << plan.plan.microbatchSize
                 << ": op times and activations scaled linearly by "
                 << llvm::format("%.3g", double(plan.plan.microbatchSize) /
                                             double(profile.microbatch))
                 << " (profile at the plan's microbatch for measured "
                    "times)\n";
  SimOptions options;
  if (!simOptions(a, "simulate", options))
    return 2;
  options.trace = a.has("--trace");
  options.messagesShareProcessors = !a.has("--messages-on-link");
  options.splitReplicas = options.splitReplicas || plan.plan.splitReplicas;
  SimResult sim;
  if (a.has("--schedule-csv")) {
    if (!readFile(a.get("--schedule-csv"), text, error))
      return fail("simulate", error);
    CsvSchedule csv = parseScheduleCsv(text);
    if (!csv.ok)
      return fail("simulate", "--schedule-csv '" + a.get("--schedule-csv") +
                                  "' cannot run: " + csv.error);
    const ScheduleResult &s = csv.schedule;
    if (int64_t(s.stages) * s.chunks != plan.plan.numStages())
      return fail("simulate", "--schedule-csv runs " +
                                  std::to_string(s.stages * s.chunks) +
                                  " stages; the plan has " +
                                  std::to_string(plan.plan.numStages()));
    plan.plan.schedule = "custom";
    plan.plan.chunks = s.chunks;
    plan.plan.microbatches = int(s.microbatches);
    sim = simulateSchedule(profile, topology, plan.plan, s, options);
  } else {
    sim = simulatePlan(profile, topology, plan.plan, options);
  }
  if (!sim.ok)
    return fail("simulate", sim.error);
  printSim(sim);
  if (options.trace) {
    if (!writeFile(a.get("--trace"), sim.traceJson, error))
      return fail("simulate", error);
    llvm::outs() << "pipec simulate: trace -> " << a.get("--trace") << "\n";
  }
  return 0;
}

//===----------------------------------------------------------------------===//
// pipec calibrate
//===----------------------------------------------------------------------===//

namespace {

/// Reads a measured profile for `pipec calibrate`.
bool loadMeasured(const std::string &path, Profile &out) {
  std::string text, error;
  if (!readFile(path, text, error)) {
    fail("calibrate", error);
    return false;
  }
  ProfileResult p = profileFromJson(text);
  if (!p.ok) {
    fail("calibrate", "'" + path + "': " + p.error);
    return false;
  }
  out = std::move(p.profile);
  return true;
}

/// How well `model` predicts the kernels of `measured`: summed seconds and
/// the geometric mean of max(predicted / measured, measured / predicted)
/// over the kernels, each kernel weighted by its measured time (so the
/// large kernels that make a step count most).
struct Fit {
  int kernels = 0;
  double measured = 0, predicted = 0, weightedLogError = 0;
  double factor() const {
    return measured > 0 ? std::exp(weightedLogError / measured) : 0;
  }
};

Fit fitOf(const DeviceModel &model, const Profile &measured) {
  Fit f;
  auto add = [&](double seconds, double predicted) {
    if (seconds <= 0 || predicted <= 0)
      return;
    ++f.kernels;
    f.measured += seconds;
    f.predicted += predicted;
    f.weightedLogError += seconds * std::fabs(std::log(predicted / seconds));
  };
  for (const ProfileOp &op : measured.ops) {
    if (op.fwdFlops <= 0 && op.bwdFlops <= 0 && op.touchedBytes <= 0)
      continue;
    add(op.fwdSeconds, predictedForward(model, op));
    add(op.bwdSeconds, predictedBackward(model, op));
  }
  return f;
}

void printFit(const char *label, const Fit &f) {
  std::printf("  %-24s %9.3f ms  ratio %5.2f  per kernel x%.2f\n", label,
              f.predicted * 1e3, f.measured > 0 ? f.predicted / f.measured : 0,
              f.factor());
}

} // namespace

int pipec::driver::runCalibrate(const std::vector<std::string> &argv) {
  Args a("calibrate", argv);
  a.positional("PROFILE.json",
               "a profile `pipec profile` measured on the device (it records "
               "each op's FLOPs and bytes beside its times)")
      .opt("--device",
           "the datasheet model to calibrate: cpu, v100, a100, h100, their "
           "-fp16/-bf16 rows, or a pipec.device/1 file",
           "cpu")
      .opt("-o", "write the calibrated model here (pipec.device/1 JSON; use "
                 "it as `pipec compile --device FILE.json`)")
      .opt("--name", "the calibrated model's name (default: DEVICE-calibrated)")
      .opt("--memory",
           "the device's memory in bytes (or with K/M/G; default: the "
           "datasheet model's), for a device the datasheet rows lack "
           "(an H200 calibrated on the h100 row)")
      .opt("--check",
           "other measured profiles (comma-separated) to predict with the "
           "datasheet and the calibrated model, to see how the calibration "
           "carries over to other shapes");
  if (!a.parse())
    return a.helpShown ? 0 : 2;
  if (a.positionals().size() != 1)
    return fail("calibrate", "expected one measured PROFILE.json");
  std::string error;
  std::optional<DeviceModel> base =
      deviceModelByNameOrFile(a.get("--device"), error);
  if (!base)
    return fail("calibrate", error);
  Profile measured;
  if (!loadMeasured(a.positionals()[0], measured))
    return 1;
  Calibration c = calibrateDevice(measured, *base);
  if (!c.ok)
    return fail("calibrate", "'" + a.positionals()[0] + "': " + c.error);
  c.model.name = a.has("--name") && !a.get("--name").empty()
                     ? a.get("--name")
                     : base->name + "-calibrated";
  if (a.has("--memory")) {
    int64_t memory = 0;
    if (!a.getBytes("--memory", memory))
      return 2;
    if (memory <= 0)
      return fail("calibrate", "--memory must be a positive size");
    c.model.memoryBytes = memory;
  }
  std::printf("pipec calibrate: %s on %s (%s)\n", base->name.c_str(),
              a.positionals()[0].c_str(), measured.device.c_str());
  std::printf("  compute-bound kernels %4d: %9.3f ms measured, %9.3f ms at "
              "the peak: efficiency %.3f\n",
              c.compute.kernels, c.compute.measuredSeconds * 1e3,
              c.compute.rooflineSeconds * 1e3, c.model.computeEfficiency);
  std::printf("  memory-bound kernels  %4d: %9.3f ms measured, %9.3f ms at "
              "the bandwidth: efficiency %.3f\n",
              c.memory.kernels, c.memory.measuredSeconds * 1e3,
              c.memory.rooflineSeconds * 1e3, c.model.bandwidthEfficiency);
  std::printf("  per op kind (t = roofline / efficiency + overhead):\n");
  for (const auto &[kind, k] : c.kinds)
    if (auto fit = c.model.kinds.find(kind); fit != c.model.kinds.end())
      std::printf("    %-28s %4d kernels %9.3f ms: efficiency %7.3f, "
                  "overhead %7.2f us\n",
                  kind.c_str(), k.kernels,
                  (k.measuredSeconds + k.kernels * base->opOverhead) * 1e3,
                  fit->second.efficiency, fit->second.overhead * 1e6);
  // Returns false (saying nothing) for a profile with no kernel to fit.
  auto report = [&](const std::string &path, const Profile &p) {
    const Fit datasheet = fitOf(*base, p);
    if (datasheet.kernels == 0)
      return false;
    std::printf("%s: %.3f ms measured over %d kernels\n", path.c_str(),
                datasheet.measured * 1e3, datasheet.kernels);
    printFit(("datasheet " + base->name).c_str(), datasheet);
    printFit(c.model.name.c_str(), fitOf(c.model, p));
    return true;
  };
  report(a.positionals()[0], measured);
  if (a.has("--check"))
    for (const std::string &path : sys::split(a.get("--check"), ',')) {
      if (path.empty())
        continue;
      Profile other;
      if (!loadMeasured(path, other))
        return 1;
      if (!report(path, other))
        return fail("calibrate", "'" + path +
                                     "' has no op with counted work and a "
                                     "measured time");
    }
  if (a.has("-o") && !a.get("-o").empty()) {
    if (!writeFile(a.get("-o"), deviceModelToJson(c.model), error))
      return fail("calibrate", error);
    std::printf("pipec calibrate: device model -> %s\n", a.get("-o").c_str());
  }
  return 0;
}
