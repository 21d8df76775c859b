//===- Registry.cpp - planner dispatch and the `auto` planner --------------===//
//
// `auto` runs every applicable planner, re-scores each plan with the one
// simulator and memory model (lib/Sim), and keeps the fastest plan that fits
// in device memory (DESIGN.md §4). The candidate table explains the choice.
//
//===----------------------------------------------------------------------===//
#include "PlannerUtil.h"
#include "pipec/Planners.h"
#include "pipec/Schedule.h"

#include <algorithm>
#include <set>
#include <cstdio>
#include <sstream>

using namespace pipec;

std::vector<std::string> pipec::plannerNames() {
  return {"auto",   "balanced",    "pipedream",  "dapple",
          "madpipe", "twobw", "interleaved", "exhaustive"};
}

namespace {

/// Balanced contiguous split over all devices, one stage per device (or
/// `chunks` per device for interleaved, two in a V for zb-v and dualpipev).
PlanResult balancedPlan(const Profile &profile, const Topology &topology,
                        const PlannerOptions &options) {
  const std::string schedule =
      options.schedule.empty() ? "1f1b-flush" : options.schedule;
  // Two chunks per device for the schedules that place stages in a V
  // (zb-v, dualpipev).
  const std::optional<ScheduleKind> kind = parseScheduleKind(schedule);
  const int chunks = kind && placementOf(*kind) == Placement::V ? 2
                     : schedule == "interleaved" && options.chunks > 1
                         ? options.chunks
                         : 1;
  int stages = options.stages;
  if (stages <= 0)
    stages =
        std::min<int>(topology.numDevices(), int(profile.ops.size()) / chunks);
  PlanResult result = planBalanced(profile, stages * chunks);
  if (!result.ok)
    return result;
  Plan &plan = result.plan;
  plan.schedule = schedule;
  plan.chunks = chunks;
  if (chunks > 1) {
    auto kind = parseScheduleKind(schedule);
    const Placement placement = kind ? placementOf(*kind) : Placement::Loop;
    for (int q = 0; q < stages * chunks; ++q)
      plan.stages[size_t(q)].devices = {
          int(positionOfStage(placement, stages, q))};
  }
  plan.microbatchSize =
      options.microbatchSize ? options.microbatchSize : profile.microbatch;
  // The caller's count, else the global batch in microbatches of the
  // profile's size, else 4 per stage.
  plan.microbatches =
      options.microbatches ? options.microbatches
      : options.globalBatch > 0
          ? int(std::max<int64_t>(options.globalBatch / plan.microbatchSize, 1))
          : std::max<int>(4 * stages, 1);
  return result;
}

/// An instance small enough for brute force (the test oracle).
bool smallInstance(const Profile &profile, const Topology &topology) {
  return profile.ops.size() <= 10 && topology.numDevices() <= 8;
}

/// Bytes for the table and the notes (GiB, MiB, KiB: small models' plans
/// differ by less than 0.01 GiB).
std::string gib(int64_t bytes) {
  return planner_util::formatBytes(double(bytes));
}

/// Peak memory of the busiest device (what `fitsMemory` checks: every
/// chunk or stage a device holds together), or of the largest stage when
/// the simulator reports no per-device figures.
int64_t peakStageMemory(const SimResult &sim) {
  int64_t peak = 0;
  for (const DeviceUsage &d : sim.devices)
    peak = std::max(peak, d.peakBytes);
  if (peak == 0)
    for (const StageMemory &m : sim.memory)
      peak = std::max(peak, m.total());
  return peak;
}

} // namespace

PlanResult pipec::runPlanner(const std::string &name, const Profile &profile,
                             const Topology &topology,
                             const PlannerOptions &options) {
  if (name == "balanced")
    return balancedPlan(profile, topology, options);
  if (name == "pipedream")
    return planPipeDream(profile, topology, options);
  if (name == "dapple")
    return planDapple(profile, topology, options);
  if (name == "madpipe")
    return planMadPipe(profile, topology, options);
  if (name == "twobw")
    return planTwoBW(profile, topology, options);
  if (name == "interleaved")
    return planInterleaved(profile, topology, options);
  if (name == "exhaustive")
    return planExhaustive(profile, topology, options);
  if (name == "auto") {
    AutoPlanResult best = planAuto(profile, topology, options);
    PlanResult result;
    result.ok = best.ok;
    result.error = best.error;
    result.plan = best.best;
    return result;
  }
  std::string known;
  for (const std::string &n : plannerNames())
    known += (known.empty() ? "" : ", ") + n;
  PlanResult result;
  result.error = "unknown planner '" + name + "' (known: " + known + ")";
  return result;
}

namespace {

/// Simulates `plan` (named `name` in the table) and fills its prediction.
PlanCandidate scoreCandidate(const Profile &profile, const Topology &topology,
                             const PlannerOptions &options, Plan plan,
                             const std::string &name, bool splitReplicas) {
  PlanCandidate candidate;
  candidate.plan = std::move(plan);
  candidate.plan.algorithm = name;
  SimOptions sim = options.sim;
  sim.splitReplicas = splitReplicas;
  candidate.sim = simulatePlan(profile, topology, candidate.plan, sim);
  if (!candidate.sim.ok) {
    candidate.note = "simulation failed: " + candidate.sim.error;
  } else if (!candidate.sim.fitsMemory) {
    candidate.note = "needs " + gib(peakStageMemory(candidate.sim)) +
                     " on its busiest device";
  } else {
    candidate.feasible = true;
    candidate.plan.predicted.iterationSeconds = candidate.sim.iterationSeconds;
    candidate.plan.predicted.samplesPerSecond = candidate.sim.samplesPerSecond;
    candidate.plan.predicted.bubbleFraction = candidate.sim.bubbleFraction;
    candidate.plan.predicted.stageMemoryBytes.clear();
    for (const StageMemory &m : candidate.sim.memory)
      candidate.plan.predicted.stageMemoryBytes.push_back(m.total());
  }
  return candidate;
}

/// Simulated ops of a plan's programs, roughly: stages x microbatches x 3
/// (x steps for the continuous schedules). Variants are scored only below
/// kVariantOps, so that the search stays cheap on paper-scale instances.
constexpr int64_t kVariantOps = 4000000;
/// `auto` skips a plan that cannot win (see planAuto) only above
/// kSkipOps, about 50 ms of simulation: smaller ones are all simulated so
/// that the table compares them.
constexpr int64_t kSkipOps = 200000;
int64_t simulatedOps(const Plan &plan, bool splitReplicas = false) {
  int64_t ops = 0;
  if (!splitReplicas)
    ops = int64_t(plan.numStages()) * plan.microbatches * 3;
  else // every replica runs every microbatch
    for (const StagePlan &stage : plan.stages)
      ops += int64_t(stage.replicas) * plan.microbatches * 3;
  // A continuous schedule is simulated over several steps: a fill and a
  // drain of ceil(2 x ranks / m) + 1 steps each and a window of at least 8
  // (the simulator's chooseSteps, whose period rounding only adds).
  auto kind = parseScheduleKind(plan.schedule);
  if (kind && !isFlushSchedule(*kind) && plan.microbatches > 0) {
    int64_t ranks = 0;
    for (const StagePlan &stage : plan.stages)
      ranks += splitReplicas ? 1 : stage.replicas;
    const int64_t fill =
        (2 * ranks + plan.microbatches - 1) / plan.microbatches + 1;
    ops *= 2 * fill + 9;
  }
  return ops;
}

/// The schedule rules (lib/Schedule/Rules.cpp) broken by `plan`, as text
/// ("" when it can run): a changed microbatch count must still suit the
/// schedule (interleaved: m a multiple of p; replicas <= m).
std::string checkPlanSchedule(const Plan &plan) {
  auto kind = parseScheduleKind(plan.schedule);
  if (!kind)
    return "unknown schedule '" + plan.schedule + "'";
  PipelineRequest request;
  request.kind = *kind;
  request.stages = plan.numStages();
  request.chunks = std::max(plan.chunks, 1);
  request.microbatches = plan.microbatches;
  request.placement = placementOf(*kind);
  const int p = plan.numStages() / request.chunks;
  for (int g = 0; g < p; ++g)
    request.replicas.push_back(plan.stages[size_t(g)].replicas);
  if (plan.splitReplicas)
    request.splitSamples = plan.microbatchSize;
  return describeViolations(checkPipelineRules(request));
}

bool straightFlush(const Plan &plan) {
  auto kind = parseScheduleKind(plan.schedule);
  if (!kind || !isFlushSchedule(*kind) || plan.chunks != 1 ||
      plan.splitReplicas)
    return false;
  for (const StagePlan &s : plan.stages)
    if (s.replicas != 1)
      return false;
  return true;
}

/// The variants of one planner's plan that `auto` scores beside it
/// (partition x schedule x recomputation x microbatch count):
///   NAME+rc      full recomputation on the stages over the memory limit
///                (when the plan does not fit)
///   NAME+rc-sel  with an arena profile: the least recomputation that
///                fits on each of those stages (selective, else full)
///   NAME/zb-h1   a straight synchronous plan with zero bubble's B/W split
///   NAME/m2M     twice the microbatches of half the size (and /mM/2 half
///                as many of twice the size), synchronous plans
/// and, once per search, balanced/zb-v: the balanced split into 2p stages
/// in a V on the balanced plan's p devices.
void addVariants(const Profile &profile, const Topology &topology,
                 const PlannerOptions &options, PlanCandidate base,
                 bool splitReplicas, std::vector<PlanCandidate> &out) {
  // (A copy: `out` grows while the variants are added.)
  const Plan &plan = base.plan;
  const std::string name = plan.algorithm;
  if (!base.sim.ok || simulatedOps(plan) > kVariantOps)
    return;
  auto add = [&](Plan variant, const std::string &suffix) {
    variant.candidates.clear();
    out.push_back(scoreCandidate(profile, topology, options, std::move(variant),
                                 name + suffix, splitReplicas));
  };
  if (!base.sim.fitsMemory && topology.deviceMemoryBytes > 0) {
    auto over = [&](const SimResult &sim, size_t q) {
      return q < sim.memory.size() &&
             sim.memory[q].total() > topology.deviceMemoryBytes;
    };
    Plan rc = plan;
    bool any = false;
    for (size_t q = 0; q < rc.stages.size(); ++q)
      if (over(base.sim, q)) {
        rc.stages[q].recompute = "full";
        any = true;
      }
    if (!any) // over the limit only on a shared device: recompute all
      for (StagePlan &s : rc.stages)
        s.recompute = "full";
    add(rc, "+rc");
    // An arena profile models selective recomputation too: each stage over
    // the limit takes the least that fits (selective, else full), as
    // `pipec compile --recompute auto` does.
    if (any && profile.memoryModel == "arena") {
      Plan least = plan;
      for (size_t q = 0; q < least.stages.size(); ++q)
        if (over(base.sim, q))
          least.stages[q].recompute = "selective";
      least.candidates.clear();
      PlanCandidate selective = scoreCandidate(
          profile, topology, options, least, name + "+rc-sel", splitReplicas);
      bool mixed = false, kept = false;
      for (size_t q = 0; q < least.stages.size() && selective.sim.ok; ++q)
        if (least.stages[q].recompute == "selective") {
          if (over(selective.sim, q)) {
            least.stages[q].recompute = "full";
            mixed = true;
          } else {
            kept = true;
          }
        }
      // (Every such stage needing full recomputation: that is NAME+rc.)
      if (kept && mixed)
        add(least, "+rc-sel");
      else if (kept)
        out.push_back(std::move(selective));
    }
  }
  if (straightFlush(plan) && plan.numStages() > 1 && options.schedule.empty())
    for (const char *zbName : {"zb-h1", "zb-h2"})
      if (plan.schedule != zbName) {
        Plan zb = plan;
        zb.schedule = zbName;
        add(zb, std::string("/") + zbName);
      }
  auto kind = parseScheduleKind(plan.schedule);
  if (kind && isFlushSchedule(*kind) && options.microbatches == 0) {
    if (plan.microbatchSize % 2 == 0) {
      Plan more = plan;
      more.microbatches *= 2;
      more.microbatchSize /= 2;
      if (checkPlanSchedule(more).empty())
        add(more, "/m" + std::to_string(more.microbatches));
    }
    if (plan.microbatches % 2 == 0 && plan.microbatches / 2 >= 1) {
      Plan fewer = plan;
      fewer.microbatches /= 2;
      fewer.microbatchSize *= 2;
      if (checkPlanSchedule(fewer).empty())
        add(fewer, "/m" + std::to_string(fewer.microbatches));
    }
  }
}

} // namespace

AutoPlanResult pipec::planAuto(const Profile &profile, const Topology &topology,
                               const PlannerOptions &options) {
  AutoPlanResult result;
  std::vector<std::string> names = {"balanced", "pipedream", "dapple",
                                    "madpipe",  "twobw",     "interleaved"};
  if (smallInstance(profile, topology))
    names.push_back("exhaustive");
  // Every planner's plan (cheap), then the simulations (not always), by
  // falling throughput bound: a plan whose bound (the busiest device's
  // compute per iteration, iterationLowerBound: per step for a flush
  // schedule, per m microbatches of the steady state for a continuous one)
  // is below the best feasible throughput found so far is skipped with its
  // variants
  // (which have no higher bound: same work per sample, or more with
  // recomputation), so the choice is the one a full search makes. Only
  // large simulations are skipped (kSkipOps).
  struct Base {
    std::string name;
    PlanResult planned;
    bool split = false;
    double bound = 0; ///< samples/s no simulation can beat (0: none known)
    std::vector<PlanCandidate> scored;
  };
  std::vector<Base> bases;
  for (const std::string &name : names) {
    Base base;
    base.name = name;
    base.planned = runPlanner(name, profile, topology, options);
    // DAPPLE splits each microbatch across a stage's replicas (dapple.md §4)
    // rather than sending whole microbatches round-robin.
    base.split = name == "dapple";
    bases.push_back(std::move(base));
  }
  // Zero bubble in a V on the balanced plan's devices.
  if (options.schedule.empty() || options.schedule == "zb-v") {
    PlannerOptions v = options;
    v.schedule = "zb-v";
    Base base;
    base.name = "balanced/zb-v";
    base.planned = runPlanner("balanced", profile, topology, v);
    if (base.planned.ok && simulatedOps(base.planned.plan) <= kVariantOps)
      bases.push_back(std::move(base));
  }
  std::vector<size_t> order;
  for (size_t i = 0; i < bases.size(); ++i) {
    Base &base = bases[i];
    order.push_back(i);
    if (!base.planned.ok)
      continue;
    SimOptions sim = options.sim;
    sim.splitReplicas = base.split;
    const Plan &plan = base.planned.plan;
    const double lower = iterationLowerBound(profile, plan, sim);
    if (lower > 0)
      base.bound =
          double(plan.microbatches) * double(plan.microbatchSize) / lower;
  }
  auto unbounded = [&](size_t i) { return bases[i].bound <= 0; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (unbounded(a) != unbounded(b))
      return unbounded(a);
    return bases[a].bound > bases[b].bound;
  });
  double bestRate = 0;
  for (size_t i : order) {
    Base &base = bases[i];
    if (!base.planned.ok) {
      PlanCandidate candidate;
      candidate.plan = base.planned.plan;
      candidate.plan.algorithm = base.name;
      candidate.note = base.planned.error;
      base.scored.push_back(std::move(candidate));
      continue;
    }
    if (!unbounded(i) && base.bound < bestRate &&
        simulatedOps(base.planned.plan, base.split) > kSkipOps) {
      PlanCandidate candidate;
      candidate.plan = base.planned.plan;
      candidate.plan.algorithm = base.name;
      candidate.skipped = true;
      char note[160];
      std::snprintf(note, sizeof note,
                    "at most %.1f samples/s (its busiest device's "
                    "compute) < %.1f simulated",
                    base.bound, bestRate);
      candidate.note = note;
      base.scored.push_back(std::move(candidate));
      continue;
    }
    base.scored.push_back(scoreCandidate(
        profile, topology, options, base.planned.plan, base.name, base.split));
    if (base.name != "balanced/zb-v")
      addVariants(profile, topology, options, base.scored.back(), base.split,
                  base.scored);
    for (const PlanCandidate &c : base.scored)
      if (c.feasible)
        bestRate = std::max(bestRate, c.sim.samplesPerSecond);
  }
  for (Base &base : bases)
    for (PlanCandidate &c : base.scored)
      result.candidates.push_back(std::move(c));
  const PlanCandidate *best = nullptr;
  for (const PlanCandidate &c : result.candidates)
    if (c.feasible &&
        (!best || c.sim.samplesPerSecond > best->sim.samplesPerSecond))
      best = &c;
  if (best) {
    result.ok = true;
    result.best = best->plan;
    result.best.algorithm = "auto:" + best->plan.algorithm;
    // plan.json keeps the candidates that are plans; a planner that made
    // none (refused, or not applicable) is only in the printed table.
    for (const PlanCandidate &c : result.candidates)
      if (!c.plan.stages.empty())
        result.best.candidates.push_back(c.plan);
    return result;
  }
  // Nothing fits: say what the smallest plan would need.
  const PlanCandidate *smallest = nullptr;
  for (const PlanCandidate &c : result.candidates)
    if (c.sim.ok && (!smallest || peakStageMemory(c.sim) <
                                      peakStageMemory(smallest->sim)))
      smallest = &c;
  if (smallest)
    result.error = "no plan fits in " + gib(topology.deviceMemoryBytes) +
                   " per device: the smallest plan (" +
                   smallest->plan.algorithm + ") needs " +
                   gib(peakStageMemory(smallest->sim)) +
                   " on its busiest device";
  else
    result.error = "no planner produced a plan:" +
                   [&] {
                     std::string all;
                     for (const PlanCandidate &c : result.candidates)
                       all += "\n  " + c.plan.algorithm + ": " + c.note;
                     return all;
                   }();
  return result;
}

std::string pipec::candidateTable(const std::vector<PlanCandidate> &candidates) {
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line,
                "%-16s %6s %-16s %7s %4s %-12s %12s %12s %8s %12s  %s\n",
                "planner", "stages", "replicas", "devices", "m", "schedule",
                "iter (ms)", "samples/s", "bubble", "peak mem", "feasible");
  os << line;
  for (const PlanCandidate &c : candidates) {
    std::string replicas;
    std::set<int> deviceSet;
    int replicaCount = 0;
    for (const StagePlan &s : c.plan.stages) {
      replicas += (replicas.empty() ? "" : "-") + std::to_string(s.replicas);
      deviceSet.insert(s.devices.begin(), s.devices.end());
      replicaCount += s.replicas;
    }
    // Interleaved chunks share devices: count distinct ones when known.
    int devices = deviceSet.empty() ? replicaCount : int(deviceSet.size());
    if (replicas.size() > 16)
      replicas = replicas.substr(0, 13) + "...";
    bool simulated = c.sim.ok;
    char iter[32] = "-", rate[32] = "-";
    if (simulated) {
      std::snprintf(iter, sizeof iter, "%.3f", c.sim.iterationSeconds * 1e3);
      std::snprintf(rate, sizeof rate, "%.1f", c.sim.samplesPerSecond);
    }
    std::snprintf(
        line, sizeof line,
        "%-16s %6d %-16s %7d %4d %-12s %12s %12s %8s %12s  %s\n",
        c.plan.algorithm.c_str(), c.plan.numStages(), replicas.c_str(), devices,
        c.plan.microbatches, c.plan.schedule.c_str(), iter, rate,
        simulated
            ? (std::to_string(c.sim.bubbleFraction * 100).substr(0, 5) + "%")
                  .c_str()
            : "-",
        simulated ? gib(peakStageMemory(c.sim)).c_str() : "-",
        c.feasible
            ? "yes"
            : ((c.skipped ? "not simulated: " : "no: ") + c.note).c_str());
    os << line;
  }
  return os.str();
}
