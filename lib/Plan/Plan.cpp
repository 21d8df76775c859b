//===- Plan.cpp - Plan type, balanced planner, cut bytes, validation ------===//
//
// The common `Plan` helpers (DESIGN.md §4) and the `balanced` planner: an
// exact dynamic programme over contiguous partitions of the linearised layer
// chain.
//
//===----------------------------------------------------------------------===//

#include "pipec/Plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

namespace pipec {

//===----------------------------------------------------------------------===//
// Plan helpers
//===----------------------------------------------------------------------===//

int Plan::stageOfLayer(int layer) const {
  // Stages are sorted and contiguous in a valid plan, but this must also
  // answer sensibly for a plan under validation: scan.
  for (int s = 0, e = numStages(); s < e; ++s)
    if (stages[s].firstLayer <= layer && layer <= stages[s].lastLayer)
      return s;
  return -1;
}

double stageSeconds(const Profile &profile, const StagePlan &stage) {
  double seconds = 0;
  int last =
      std::min(stage.lastLayer, static_cast<int>(profile.ops.size()) - 1);
  for (int l = std::max(stage.firstLayer, 0); l <= last; ++l)
    seconds += profile.ops[l].fwdSeconds + profile.ops[l].bwdSeconds;
  return seconds;
}

namespace {

PlanResult planError(std::string message) {
  PlanResult result;
  result.ok = false;
  result.error = std::move(message);
  return result;
}

/// Checks that costs are usable by a planner; returns "" or a message.
std::string checkProfileCosts(const Profile &profile) {
  int numOps = static_cast<int>(profile.ops.size());
  for (int i = 0; i < numOps; ++i) {
    const ProfileOp &op = profile.ops[i];
    std::string what = "op " + std::to_string(i) + " ('" + op.name + "')";
    if (!std::isfinite(op.fwdSeconds) || op.fwdSeconds < 0)
      return what + " has a negative or non-finite forward time";
    if (!std::isfinite(op.bwdSeconds) || op.bwdSeconds < 0)
      return what + " has a negative or non-finite backward time";
    if (op.outBytes < 0)
      return what + " has negative out_bytes";
    if (op.paramBytes < 0 || op.savedBytes < 0)
      return what + " has negative param_bytes or saved_bytes";
    for (int producer : op.inputs)
      if (producer < 0 || producer >= i)
        return what + " has input " + std::to_string(producer) +
               ", which is not an earlier op";
  }
  return "";
}

} // namespace

int64_t cutBytes(const Profile &profile, int cutAfter, const Plan *plan) {
  int numOps = static_cast<int>(profile.ops.size());
  if (cutAfter < 0 || cutAfter >= numOps - 1)
    return 0;
  // For every producer at or before the cut: the distinct consuming stages
  // after the cut (or just "some consumer" without a plan).
  std::vector<std::set<int>> consumerStages(cutAfter + 1);
  for (int j = cutAfter + 1; j < numOps; ++j) {
    int stage = plan ? plan->stageOfLayer(j) : 0;
    for (int producer : profile.producersOf(j))
      if (producer >= 0 && producer <= cutAfter)
        consumerStages[producer].insert(stage);
  }
  int64_t bytes = 0;
  for (int t = 0; t <= cutAfter; ++t)
    bytes += profile.ops[t].outBytes *
             static_cast<int64_t>(consumerStages[t].size());
  return bytes;
}

int64_t planCutBytes(const Profile &profile, const Plan &plan) {
  std::vector<int64_t> cuts = cutBytesPerCut(profile);
  int64_t total = 0;
  for (int s = 0; s + 1 < plan.numStages(); ++s) {
    int cut = plan.stages[s].lastLayer;
    if (cut >= 0 && cut < static_cast<int>(cuts.size()))
      total += cuts[cut];
  }
  return total;
}

//===----------------------------------------------------------------------===//
// Balanced planner
//===----------------------------------------------------------------------===//

PlanResult planBalanced(const Profile &profile, int numStages) {
  const int numLayers = static_cast<int>(profile.ops.size());
  if (numLayers == 0)
    return planError("cannot plan an empty profile (no ops)");
  if (numStages < 1)
    return planError("the number of stages must be at least 1 (got " +
                     std::to_string(numStages) + ")");
  if (numStages > numLayers)
    return planError("cannot split " + std::to_string(numLayers) +
                     " layers into " + std::to_string(numStages) + " stages");
  if (std::string bad = checkProfileCosts(profile); !bad.empty())
    return planError(bad);

  // Layer costs t_l = fwd + bwd; with no timing information at all, balance
  // the op count instead.
  std::vector<double> prefix(numLayers + 1, 0.0);
  for (int l = 0; l < numLayers; ++l)
    prefix[l + 1] =
        prefix[l] + profile.ops[l].fwdSeconds + profile.ops[l].bwdSeconds;
  if (prefix[numLayers] == 0)
    for (int l = 0; l < numLayers; ++l)
      prefix[l + 1] = l + 1;
  auto stageTime = [&](int first, int end) {
    return prefix[end] - prefix[first];
  };

  // Phase 1: M* = min over partitions of the largest stage time.
  //   best[k][j] = min_{i} max(best[k-1][i], T(i..j-1)), k stages over the
  //   first j layers, every stage non-empty.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> prev(numLayers + 1, inf), cur(numLayers + 1, inf);
  prev[0] = 0;
  for (int k = 1; k <= numStages; ++k) {
    std::fill(cur.begin(), cur.end(), inf);
    for (int j = k; j <= numLayers - (numStages - k); ++j)
      for (int i = k - 1; i < j; ++i) {
        if (prev[i] == inf)
          continue;
        cur[j] = std::min(cur[j], std::max(prev[i], stageTime(i, j)));
      }
    std::swap(prev, cur);
  }
  const double bestMax = prev[numLayers];
  const double limit = bestMax + 1e-9 * bestMax;

  // Phase 2: among partitions whose stages all fit in M*, the one with the
  // fewest bytes over its cuts. Done as a second pass because a
  // lexicographic (max, bytes) DP is not optimal: a prefix with a larger
  // max but fewer bytes can win once the last stage dominates the max.
  const std::vector<int64_t> cuts = cutBytesPerCut(profile);
  const int64_t noWay = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> bytes(
      numStages + 1, std::vector<int64_t>(numLayers + 1, noWay));
  std::vector<std::vector<int>> choice(numStages + 1,
                                       std::vector<int>(numLayers + 1, -1));
  bytes[0][0] = 0;
  for (int k = 1; k <= numStages; ++k)
    for (int j = k; j <= numLayers - (numStages - k); ++j)
      for (int i = k - 1; i < j; ++i) {
        if (bytes[k - 1][i] == noWay || stageTime(i, j) > limit)
          continue;
        int64_t total = bytes[k - 1][i] + (i > 0 ? cuts[i - 1] : 0);
        if (total < bytes[k][j]) {
          bytes[k][j] = total;
          choice[k][j] = i;
        }
      }
  if (bytes[numStages][numLayers] == noWay)
    return planError("internal error: balanced planner found no partition");

  Plan plan;
  plan.algorithm = "balanced";
  plan.microbatchSize = profile.microbatch;
  plan.stages.resize(numStages);
  for (int k = numStages, end = numLayers; k >= 1; --k) {
    int first = choice[k][end];
    StagePlan &stage = plan.stages[k - 1];
    stage.firstLayer = first;
    stage.lastLayer = end - 1;
    stage.replicas = 1;
    stage.devices = {k - 1};
    end = first;
  }
  PlanResult result;
  result.ok = true;
  result.plan = std::move(plan);
  return result;
}

//===----------------------------------------------------------------------===//
// Validation
//===----------------------------------------------------------------------===//

std::string validatePlan(const Plan &plan, int numLayers) {
  if (numLayers < 1)
    return "the profile has no layers";
  if (plan.stages.empty())
    return "the plan has no stages";
  if (plan.microbatches < 1)
    return "microbatches must be at least 1 (got " +
           std::to_string(plan.microbatches) + ")";
  if (plan.microbatchSize < 1)
    return "the microbatch size must be at least 1 (got " +
           std::to_string(plan.microbatchSize) + ")";
  if (plan.chunks < 1)
    return "chunks must be at least 1 (got " + std::to_string(plan.chunks) +
           ")";
  int expectedFirst = 0;
  for (int s = 0; s < plan.numStages(); ++s) {
    const StagePlan &stage = plan.stages[s];
    std::string what = "stage " + std::to_string(s);
    if (stage.firstLayer != expectedFirst) {
      if (s == 0)
        return what + " starts at layer " + std::to_string(stage.firstLayer) +
               " but must start at layer 0";
      return what + " starts at layer " + std::to_string(stage.firstLayer) +
             " but stage " + std::to_string(s - 1) + " ends at layer " +
             std::to_string(expectedFirst - 1) + " (stages must be contiguous)";
    }
    if (stage.lastLayer < stage.firstLayer)
      return what + " is empty (layers " + std::to_string(stage.firstLayer) +
             ".." + std::to_string(stage.lastLayer) + ")";
    if (stage.lastLayer >= numLayers)
      return what + " ends at layer " + std::to_string(stage.lastLayer) +
             " but the profile has only " + std::to_string(numLayers) +
             " layers";
    if (stage.replicas < 1)
      return what + " has " + std::to_string(stage.replicas) +
             " replicas (must be at least 1)";
    if (!stage.devices.empty()) {
      if (static_cast<int>(stage.devices.size()) != stage.replicas)
        return what + " lists " + std::to_string(stage.devices.size()) +
               " devices for " + std::to_string(stage.replicas) + " replicas";
      std::set<int> seen;
      for (int device : stage.devices) {
        if (device < 0)
          return what + " has a negative device " + std::to_string(device);
        if (!seen.insert(device).second)
          return what + " lists device " + std::to_string(device) + " twice";
      }
    }
    expectedFirst = stage.lastLayer + 1;
  }
  if (expectedFirst != numLayers)
    return "the stages cover layers 0.." + std::to_string(expectedFirst - 1) +
           " but the profile has " + std::to_string(numLayers) +
           " layers (layers " + std::to_string(expectedFirst) + ".." +
           std::to_string(numLayers - 1) + " belong to no stage)";
  if (!plan.predicted.stageMemoryBytes.empty() &&
      static_cast<int>(plan.predicted.stageMemoryBytes.size()) !=
          plan.numStages())
    return "predicted.stage_memory_bytes has " +
           std::to_string(plan.predicted.stageMemoryBytes.size()) +
           " entries for " + std::to_string(plan.numStages()) + " stages";
  return "";
}

} // namespace pipec

std::vector<int64_t> pipec::cutBytesPerCut(const Profile &profile) {
  // The tensor of op t crosses the cuts t .. lastUse(t) - 1.
  int numOps = static_cast<int>(profile.ops.size());
  std::vector<int> lastUse(numOps, -1);
  for (int j = 0; j < numOps; ++j)
    for (int producer : profile.producersOf(j))
      if (producer >= 0 && producer < j)
        lastUse[producer] = std::max(lastUse[producer], j);
  std::vector<int64_t> delta(numOps + 1, 0);
  for (int t = 0; t < numOps; ++t) {
    if (lastUse[t] <= t)
      continue;
    delta[t] += profile.ops[t].outBytes;
    delta[lastUse[t]] -= profile.ops[t].outBytes;
  }
  std::vector<int64_t> cuts(numOps, 0);
  int64_t running = 0;
  for (int c = 0; c < numOps; ++c) {
    running += delta[c];
    cuts[c] = running;
  }
  return cuts;
}

std::string pipec::profilePlanningError(const Profile &profile) {
  int numOps = static_cast<int>(profile.ops.size());
  if (numOps == 0)
    return "cannot plan an empty profile (no ops)";
  if (profile.microbatch < 1)
    return "the profile's microbatch must be at least 1 (got " +
           std::to_string(profile.microbatch) + ")";
  for (int i = 0; i < numOps; ++i) {
    const ProfileOp &op = profile.ops[i];
    std::string what = "op " + std::to_string(i) + " ('" + op.name + "')";
    if (!std::isfinite(op.fwdSeconds) || op.fwdSeconds < 0)
      return what + " has a negative or non-finite forward time";
    if (!std::isfinite(op.bwdSeconds) || op.bwdSeconds < 0)
      return what + " has a negative or non-finite backward time";
    if (op.outBytes < 0 || op.paramBytes < 0 || op.savedBytes < 0)
      return what + " has a negative size (out, param or saved bytes)";
    for (int producer : op.inputs)
      if (producer < 0 || producer >= i)
        return what + " has input " + std::to_string(producer) +
               ", which is not an earlier op";
  }
  return "";
}
