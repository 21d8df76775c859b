//===- Plan.cpp - Plan type, cut bytes, validation -----------------------===//
//
// The common `Plan` helpers (DESIGN.md §4). The planners, the `balanced`
// one included, are in lib/Planners.
//
//===----------------------------------------------------------------------===//

#include "pipec/Plan.h"
#include "pipec/Schedule.h"

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
// Validation
//===----------------------------------------------------------------------===//

std::string validatePlan(const Plan &plan, int numLayers) {
  if (numLayers < 1)
    return "the profile has no layers";
  if (plan.stages.empty())
    return "the plan has no stages";
  // The counts' rules are lib/Schedule's (microbatches, chunks); the
  // schedule itself is not the plan's to say, so the interleaved one stands
  // for any plan with chunks and the rules about schedules are left out.
  {
    PipelineRequest request;
    request.kind =
        plan.chunks > 1 ? ScheduleKind::Interleaved : ScheduleKind::GPipe;
    request.stages = plan.numStages();
    request.chunks = plan.chunks;
    request.microbatches = plan.microbatches;
    for (const RuleViolation &v : checkScheduleShape(request))
      if (v.rule == "microbatches" || v.rule == "chunks")
        return v.message;
  }
  if (plan.microbatchSize < 1)
    return "the microbatch size must be at least 1 (got " +
           std::to_string(plan.microbatchSize) + ")";
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
             " but there are only " + std::to_string(numLayers) +
             " layers (0.." + std::to_string(numLayers - 1) + ")";
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
