//===- Exhaustive.cpp - Brute force over partitions x replication x placement
//===//
//
// The test oracle: every contiguous partition of the layers into S stages,
// every way of giving the stages devices, each plan scored by the model the
// planner under test claims optimality for (scorePipeDream, scoreDapple, or
// any function). Placements, per ExhaustivePlacements:
//  * All: every assignment of devices to stages (or to nothing, when
//    devices may stay idle) up to the topology's symmetry. Permuting the
//    sub-components of any component leaves every cost of Topology.h
//    unchanged, so one canonical assignment per orbit suffices: the one in
//    which the sub-components of every component appear in non-increasing
//    lexicographic order of their labels.
//  * DapplePolicies: per replication vector, stage by stage with one of
//    DAPPLE's policies each (3^S placements).
//  * InOrder: per replication vector, stage s takes the next r_s devices.
// Instances beyond ExhaustiveOptions' limits are refused with a message.
//
//===----------------------------------------------------------------------===//

#include "PlannerUtil.h"

#include <algorithm>
#include <cmath>

using namespace pipec;
using namespace pipec::planner_util;

namespace {

/// Canonical assignments of the topology's devices to `stages` stages
/// (label -1: idle), every stage with at least one device. Returns false
/// when more than `limit` were found.
class CanonicalAssignments {
public:
  CanonicalAssignments(const TopologyInfo &topo, int stages, bool allowIdle,
                       int64_t limit)
      : topo(topo), stages(stages), allowIdle(allowIdle), limit(limit),
        labels(topo.numDevices, -1) {}

  bool enumerate() {
    recurse(0);
    return !overflow;
  }
  const std::vector<std::vector<int>> &result() const { return found; }

private:
  /// Is the block of `size` devices ending at device `last` (its parent has
  /// `parent` devices) no larger than its left sibling?
  bool ordered(int last, int size, int parent) const {
    int start = last + 1 - size;
    if (start % parent == 0)
      return true; // first child
    for (int i = 0; i < size; ++i) {
      int previous = labels[start - size + i], current = labels[start + i];
      if (previous != current)
        return previous > current;
    }
    return true;
  }

  bool canonicalSoFar(int device) const {
    // Blocks of size 1 (devices) inside machines, machines inside the next
    // level, and so on.
    for (int k = -1; k + 1 < topo.numLevels; ++k) {
      int size = k < 0 ? 1 : topo.devicesPer[k];
      if ((device + 1) % size != 0)
        break;
      if (!ordered(device, size, topo.devicesPer[k + 1]))
        return false;
    }
    return true;
  }

  void recurse(int device) {
    if (overflow)
      return;
    if (device == topo.numDevices) {
      std::vector<int> count(stages, 0);
      for (int label : labels)
        if (label >= 0)
          ++count[label];
      for (int c : count)
        if (c == 0)
          return;
      found.push_back(labels);
      if (static_cast<int64_t>(found.size()) > limit)
        overflow = true;
      return;
    }
    for (int label = stages - 1; label >= (allowIdle ? -1 : 0); --label) {
      labels[device] = label;
      if (canonicalSoFar(device))
        recurse(device + 1);
    }
    labels[device] = -1;
  }

  const TopologyInfo &topo;
  int stages;
  bool allowIdle;
  int64_t limit;
  std::vector<int> labels;
  std::vector<std::vector<int>> found;
  bool overflow = false;
};

/// Every composition of `total` (or of at most `total` when `atMost`) into
/// `parts` positive parts.
void compositions(int total, int parts, bool atMost,
                  std::vector<std::vector<int>> &out) {
  std::vector<int> current;
  auto recurse = [&](auto &self, int left, int remainingParts) -> void {
    if (remainingParts == 0) {
      if (left == 0 || atMost)
        out.push_back(current);
      return;
    }
    for (int part = 1; part <= left - (remainingParts - 1); ++part) {
      current.push_back(part);
      self(self, left - part, remainingParts - 1);
      current.pop_back();
    }
  };
  recurse(recurse, total, parts);
}

int64_t binomial(int n, int k) {
  if (k < 0 || k > n)
    return 0;
  double value = 1;
  for (int i = 1; i <= k; ++i)
    value = value * (n - k + i) / i;
  return static_cast<int64_t>(std::llround(std::min(value, 9e18)));
}

/// Device sets per stage of one placement.
using DeviceSets = std::vector<std::vector<int>>;

/// The canonical assignments of the topology's devices to `stages` stages
/// (ExhaustivePlacements::All) as placements; false when there are more
/// than `limit`.
bool canonicalPlacements(const TopologyInfo &topo, int stages, bool idle,
                         int64_t limit, std::vector<DeviceSets> &placements) {
  CanonicalAssignments assignments(topo, stages, idle, limit);
  if (!assignments.enumerate())
    return false;
  for (const std::vector<int> &labels : assignments.result()) {
    DeviceSets sets(stages);
    for (int d = 0; d < topo.numDevices; ++d)
      if (labels[d] >= 0)
        sets[labels[d]].push_back(d);
    placements.push_back(std::move(sets));
  }
  return true;
}

/// Every distinct stage-by-stage placement of the replication vector
/// `replicas` by one of `policies` per stage (DapplePolicies).
void policyPlacements(const Topology &topology, int g,
                      const std::vector<int> &replicas,
                      const std::vector<DapplePolicy> &policies,
                      std::vector<DeviceSets> &placements) {
  const int stages = static_cast<int>(replicas.size());
  int choices = static_cast<int>(policies.size());
  int64_t combos = 1;
  for (int s = 0; s < stages; ++s)
    combos *= choices;
  for (int64_t code = 0; code < combos; ++code) {
    std::vector<bool> used(g, false);
    DeviceSets sets(stages);
    int64_t rest = code;
    for (int s = 0; s < stages; ++s) {
      sets[s] =
          dappleAllocate(topology, used, replicas[s], policies[rest % choices]);
      rest /= choices;
    }
    if (std::find(placements.begin(), placements.end(), sets) ==
        placements.end())
      placements.push_back(std::move(sets));
  }
}

/// The placements of `stages` stages that eo.placements tries; false when
/// the canonical assignments overflow their share of eo.maxCandidates over
/// `partitions` layer partitions.
bool enumeratePlacements(const Topology &topology, const TopologyInfo &topo,
                         int stages, bool idle, int64_t partitions,
                         const ExhaustiveOptions &eo,
                         std::vector<DeviceSets> &placements) {
  if (eo.placements == ExhaustivePlacements::All)
    return canonicalPlacements(topo, stages, idle,
                               eo.maxCandidates / partitions + 1, placements);
  const int g = topo.numDevices;
  std::vector<std::vector<int>> vectors;
  compositions(g, stages, idle, vectors);
  for (const std::vector<int> &replicas : vectors) {
    if (eo.placements == ExhaustivePlacements::InOrder) {
      DeviceSets sets(stages);
      int next = 0;
      for (int s = 0; s < stages; ++s)
        for (int r = 0; r < replicas[s]; ++r)
          sets[s].push_back(next++);
      placements.push_back(std::move(sets));
      continue;
    }
    policyPlacements(topology, g, replicas, eo.dapple.policies, placements);
  }
  return true;
}

/// Microbatches of a plan of `stages` stages: as given, else the global
/// batch's, else the planner's default (DAPPLE: 16, otherwise 4 per stage;
/// PipeDream: NOAM, set when scoring).
int candidateMicrobatches(const PlannerOptions &options,
                          const ExhaustiveOptions &eo, int64_t microbatchSize,
                          int stages) {
  int microbatches = options.microbatches;
  if (microbatches == 0 && options.globalBatch > 0)
    microbatches = static_cast<int>(options.globalBatch / microbatchSize);
  if (microbatches == 0)
    microbatches =
        eo.objective == ExhaustiveObjective::Dapple ? 16 : 4 * stages;
  return microbatches;
}

/// The candidate plan of one layer partition (stage sizes) and placement.
Plan candidatePlan(const std::vector<int> &sizes, const DeviceSets &sets,
                   int64_t microbatchSize, int microbatches,
                   const std::string &schedule) {
  Plan plan;
  plan.algorithm = "exhaustive";
  plan.microbatchSize = microbatchSize;
  plan.microbatches = microbatches;
  plan.schedule = schedule;
  int first = 0;
  for (size_t s = 0; s < sizes.size(); ++s) {
    StagePlan stage;
    stage.firstLayer = first;
    stage.lastLayer = first + sizes[s] - 1;
    stage.devices = sets[s];
    stage.replicas = static_cast<int>(sets[s].size());
    first += sizes[s];
    plan.stages.push_back(std::move(stage));
  }
  return plan;
}

/// Scores candidate plans by the objective and keeps the best (the first
/// of equal scores).
struct Scorer {
  Scorer(const Profile &profile, const Topology &topology,
         const PlannerOptions &options, const ExhaustiveOptions &eo)
      : profile(profile), topology(topology), options(options), eo(eo) {}

  const Profile &profile;
  const Topology &topology;
  const PlannerOptions &options;
  const ExhaustiveOptions &eo;
  double bestScore = kInf;
  Plan bestPlan;
  bool anyPlan = false;
  int64_t scored = 0;

  /// Scores `plan` (the PipeDream objective sets its microbatches to NOAM
  /// unless given); plans the objective cannot score are skipped.
  void score(Plan &plan) {
    ++scored;
    double value = kInf;
    switch (eo.objective) {
    case ExhaustiveObjective::PipeDream: {
      PipeDreamScore score =
          scorePipeDream(profile, topology, plan, options.sim, eo.pipedream);
      if (!score.ok)
        return; // not a hierarchical plan
      if (options.microbatches == 0)
        plan.microbatches = score.noam;
      value = score.bottleneckSeconds;
      break;
    }
    case ExhaustiveObjective::Dapple: {
      DappleScore score =
          scoreDapple(profile, topology, plan, options.sim, eo.dapple);
      if (!score.ok)
        return;
      value = score.fitsMemory ? score.latency.latency : kInf;
      break;
    }
    case ExhaustiveObjective::Custom:
      value = eo.score(plan);
      break;
    }
    anyPlan = true;
    if (value < bestScore) {
      bestScore = value;
      bestPlan = plan;
    }
  }
};

} // namespace

ExhaustiveResult pipec::searchExhaustive(const Profile &profile,
                                         const Topology &topology,
                                         const PlannerOptions &options,
                                         const ExhaustiveOptions &eo) {
  ExhaustiveResult result;
  auto fail = [&](std::string message) {
    result.ok = false;
    result.error = "exhaustive: " + std::move(message);
    return result;
  };
  if (std::string bad = checkInputs(profile, topology); !bad.empty())
    return fail(bad);
  int n = static_cast<int>(profile.ops.size());
  TopologyInfo topo = topologyInfo(topology);
  int g = topo.numDevices;
  if (n > eo.maxLayers || g > eo.maxDevices)
    return fail("refusing " + std::to_string(n) + " layers on " +
                std::to_string(g) + " devices: brute force is limited to " +
                std::to_string(eo.maxLayers) + " layers and " +
                std::to_string(eo.maxDevices) +
                " devices (the number of plans grows exponentially)");
  if (options.stages > n)
    return fail("cannot split " + std::to_string(n) + " layers into " +
                std::to_string(options.stages) + " stages");
  if (eo.objective == ExhaustiveObjective::Custom && !eo.score)
    return fail("no objective: ExhaustiveOptions::score is empty");
  std::string error;
  int64_t microbatchSize = resolveMicrobatchSize(profile, options, error);
  if (!error.empty())
    return fail(error);

  bool idle = options.allowFewerDevices;
  int maxStages = std::min(n, g);
  if (eo.maxStages > 0)
    maxStages = std::min(maxStages, eo.maxStages);
  int minStages = 1;
  if (options.stages > 0) {
    if (options.stages > maxStages)
      return fail(std::to_string(options.stages) + " stages: at most " +
                  std::to_string(maxStages) + " (" + std::to_string(g) +
                  " devices, " + std::to_string(n) + " layers" +
                  (eo.maxStages > 0
                       ? ", the search's limit " + std::to_string(eo.maxStages)
                       : std::string()) +
                  ")");
    minStages = maxStages = options.stages;
  }
  const std::string schedule = !options.schedule.empty() ? options.schedule
                               : eo.objective == ExhaustiveObjective::PipeDream
                                   ? "1f1b"
                                   : "1f1b-flush";

  Scorer scorer(profile, topology, options, eo);
  bool overflow = false;
  for (int stages = minStages; stages <= maxStages && !overflow; ++stages) {
    int microbatches =
        candidateMicrobatches(options, eo, microbatchSize, stages);
    std::vector<DeviceSets> placements;
    int64_t partitions = binomial(n - 1, stages - 1);
    if (!enumeratePlacements(topology, topo, stages, idle, partitions, eo,
                             placements) ||
        partitions * static_cast<int64_t>(placements.size()) + scorer.scored >
            eo.maxCandidates) {
      overflow = true;
      break;
    }
    // Every composition of the layers into `stages` parts.
    std::vector<std::vector<int>> splits;
    compositions(n, stages, /*atMost=*/false, splits);
    for (const std::vector<int> &sizes : splits)
      for (const DeviceSets &sets : placements) {
        Plan plan =
            candidatePlan(sizes, sets, microbatchSize, microbatches, schedule);
        scorer.score(plan);
      }
  }
  if (overflow)
    return fail("more than " + std::to_string(eo.maxCandidates) +
                " candidate plans for " + std::to_string(n) + " layers on " +
                std::to_string(g) +
                " devices; refusing (use a smaller instance, fewer stages "
                "or a coarser placement mode)");
  result.candidates = scorer.scored;
  if (!scorer.anyPlan)
    return fail("no candidate plan could be scored");
  if (!std::isfinite(scorer.bestScore))
    return fail("no candidate plan fits in device memory (" +
                formatBytes(static_cast<double>(topology.deviceMemoryBytes)) +
                ")");
  result.ok = true;
  result.objective = scorer.bestScore;
  result.plan = std::move(scorer.bestPlan);
  return result;
}
