//===- Balanced.cpp - the balanced planner --------------------------------===//
//
// The `balanced` planner (the compiler's default): an exact dynamic
// programme over contiguous partitions of the linearised layer chain, one
// stage per device. See planBalanced in pipec/Planners.h.
//
//===----------------------------------------------------------------------===//
#include "PlannerUtil.h"

#include <algorithm>
#include <limits>

namespace pipec {

using planner_util::planError;

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
  if (std::string bad = profilePlanningError(profile); !bad.empty())
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

} // namespace pipec
