//===- Dapple.cpp - Latency model, pivot stage, placement, search --------===//
//
// The DAPPLE planner (dapple.md §2-4):
//  * a plan of S compute stages is a pipeline of 2S-1 stages, the links
//    between compute stages being communication stages (§2.2);
//  * its latency is Eq. (1)/(2), L = T_w + T_s + T_e around the pivot Q of
//    Eq. (3), with the `s = Q` correction of dapple.md §2.3;
//  * a replicated stage splits every microbatch into near-even slices, the
//    largest of ⌈b/r⌉ samples setting its pace (uneven replication such as
//    15:1 or 11:5 needs no divisibility), and synchronises its gradients
//    once per iteration by a ring allreduce (AR, in T_e);
//  * devices are taken stage by stage with Fresh First, Append First or
//    Scatter First (§2.5);
//  * K_i warm-up depths by policy A or B (§3.3) size the memory.
//
// The search is the paper's memoised search (Eq. (4)/(5)): a state (j, m)
// holds the best prefix of stages over layers [0, j) on m devices, judged
// by the latency of the complete plan whose last stage takes layers
// [j, N) on every remaining device; splitting that last stage (every cut,
// device count and policy) gives the next states. L does not decompose, so
// keeping one prefix per state is a heuristic, as in the paper. Pure data
// parallelism (j = 0, which Eq. (4) leaves out) and every two-stage plan
// P:Q with every device count (including leaving devices idle when allowed)
// are enumerated outright, so the result is optimal among plans of at most
// two compute stages (Table V's shapes), and the straight pipeline is
// seeded too (invariant 8). Large instances run the same search on a grid
// of cut positions and device counts. Finally the best plan of every depth
// is refined one move at a time at full resolution (a cut, devices between
// neighbours or the idle pool by powers of two, a stage's policy).
//
// Conventions: times scale linearly with samples (profile microbatch ->
// slice); a_s counts every tensor live across the cut once; F = B for a
// communication stage; AR and p2p are Topology.h's closed forms on the
// slowest level spanned (effective link). The Plan has no field for K_i:
// it sizes the predicted memory only.
//
//===----------------------------------------------------------------------===//

#include "PlannerUtil.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <memory>
#include <set>

using namespace pipec;
using namespace pipec::planner_util;

//===----------------------------------------------------------------------===//
// Eq. (1)-(3), K_i, placement policies
//===----------------------------------------------------------------------===//

int pipec::dapplePivot(const std::vector<double> &forward,
                       const std::vector<double> &backward, int microbatches) {
  int stages = static_cast<int>(forward.size());
  if (stages == 0)
    return 0;
  double steadyFactor = std::max(0, microbatches - 1);
  int pivot = stages - 1;
  // Σ_{s<a<Q} (F_a + B_a), the stages strictly between s and the pivot.
  double between = 0;
  for (int s = stages - 2; s >= 0; --s) {
    if (s + 1 < pivot)
      between += forward[s + 1] + backward[s + 1];
    // T_st^s > T_st^Q + Σ_{s'=s+1}^{Q-1} (F_s' + B_s'), T_st^j = (M-1)(F_j+B_j)
    double candidate = steadyFactor * (forward[s] + backward[s]);
    double current = steadyFactor * (forward[pivot] + backward[pivot]);
    if (candidate > current + between) {
      pivot = s;
      between = 0;
    }
  }
  return pivot;
}

DappleLatency pipec::dappleLatency(const std::vector<double> &forward,
                                   const std::vector<double> &backward,
                                   const std::vector<double> &allreduce,
                                   int microbatches, bool fixPivotTerm) {
  DappleLatency result;
  int stages = static_cast<int>(forward.size());
  if (stages == 0)
    return result;
  int q = dapplePivot(forward, backward, microbatches);
  result.pivot = q;
  // T_w = Σ_{s=0}^{Q} F_s
  for (int s = 0; s <= q; ++s)
    result.warmup += forward[s];
  // T_s = (M-1)(F_Q + B_Q)
  result.steady = std::max(0, microbatches - 1) * (forward[q] + backward[q]);
  // T_e = max_s AR_s + { Σ_{a=s}^{Q} B_a      s <= Q (fixed; printed: s < Q)
  //                    { -Σ_{a=Q}^{s} B_a     s > Q  (printed: s >= Q)
  double ending = -kInf;
  double below = 0; // Σ_{a=s}^{Q} B_a for s = Q, Q-1, ...
  for (int s = q; s >= 0; --s) {
    below += backward[s];
    double term = allreduce[s] + below;
    if (s == q && !fixPivotTerm)
      term = allreduce[s] - backward[s];
    ending = std::max(ending, term);
  }
  double above = backward[q]; // Σ_{a=Q}^{s} B_a for s = Q+1, ...
  for (int s = q + 1; s < stages; ++s) {
    above += backward[s];
    ending = std::max(ending, allreduce[s] - above);
  }
  result.ending = ending;
  result.latency = result.warmup + result.steady + result.ending;
  return result;
}

std::vector<int>
pipec::dappleWarmupDepths(int stages, int microbatches, DappleWarmup policy,
                          const std::vector<int> &maxInflight) {
  std::vector<int> depths(std::max(stages, 0));
  for (int i = 0; i < stages; ++i) {
    // P_A: K_i = min(S - i, D); P_B: K_i = min(2(S - i) - 1, D).
    int k = policy == DappleWarmup::B ? 2 * (stages - i) - 1 : stages - i;
    if (i < static_cast<int>(maxInflight.size()))
      k = std::min(k, maxInflight[i]);
    k = std::min(k, microbatches);
    depths[i] = std::max(k, 1);
  }
  return depths;
}

namespace {

/// Devices taken from each machine, in the order taken.
using Takes = std::vector<std::pair<int, int>>;

/// DAPPLE's policies on per-machine free counts (every machine has
/// `perMachine` devices). Takes up to `count` devices, updates `freeCount`
/// and returns what it took from which machine.
Takes allocateCounts(std::vector<int> &freeCount, int perMachine, int count,
                     DapplePolicy policy) {
  int machines = static_cast<int>(freeCount.size());
  Takes takes;
  int need = count;
  auto take = [&](int k, int howMany) {
    if (howMany <= 0)
      return;
    freeCount[k] -= howMany;
    need -= howMany;
    if (!takes.empty() && takes.back().first == k)
      takes.back().second += howMany;
    else
      takes.push_back({k, howMany});
  };
  auto isFresh = [&](int k) { return freeCount[k] == perMachine; };
  auto isPartial = [&](int k) {
    return freeCount[k] > 0 && freeCount[k] < perMachine;
  };
  auto fill = [&](bool wantFresh) {
    for (int k = 0; k < machines && need > 0; ++k)
      if (wantFresh ? isFresh(k) : isPartial(k))
        take(k, std::min(need, freeCount[k]));
  };
  // One device per machine per round, in machine order.
  auto roundRobin = [&](std::vector<int> candidates) {
    std::vector<int> got(machines, 0);
    while (need > 0 && !candidates.empty()) {
      std::vector<int> still;
      for (int k : candidates) {
        if (need == 0)
          break;
        if (freeCount[k] - got[k] > 0) {
          ++got[k];
          --need;
        }
        if (freeCount[k] - got[k] > 0)
          still.push_back(k);
      }
      candidates = std::move(still);
    }
    for (int k = 0; k < machines; ++k)
      if (got[k]) {
        need += got[k];
        take(k, got[k]);
      }
  };
  switch (policy) {
  case DapplePolicy::FreshFirst:
    fill(/*wantFresh=*/true);
    fill(/*wantFresh=*/false);
    break;
  case DapplePolicy::AppendFirst:
    fill(/*wantFresh=*/false);
    fill(/*wantFresh=*/true);
    break;
  case DapplePolicy::ScatterFirst: {
    // Equally from the used machines, or from all machines if all fresh.
    std::vector<int> partial, fresh;
    for (int k = 0; k < machines; ++k) {
      if (isPartial(k))
        partial.push_back(k);
      else if (isFresh(k))
        fresh.push_back(k);
    }
    if (!partial.empty())
      roundRobin(partial);
    roundRobin(fresh);
    break;
  }
  }
  return takes;
}

int devicesPerMachine(const Topology &topology, int devices) {
  if (topology.levels.empty())
    return std::max(devices, 1);
  return std::max(1, std::min(topology.levels[0].count, std::max(devices, 1)));
}

} // namespace

std::vector<int> pipec::dappleAllocate(const Topology &topology,
                                       std::vector<bool> &used, int count,
                                       DapplePolicy policy) {
  int devices = static_cast<int>(used.size());
  int perMachine = devicesPerMachine(topology, devices);
  int machines = (devices + perMachine - 1) / perMachine;
  std::vector<int> freeCount(machines, 0);
  for (int d = 0; d < devices; ++d)
    if (!used[d])
      ++freeCount[d / perMachine];
  Takes takes = allocateCounts(freeCount, perMachine, count, policy);
  std::vector<int> taken;
  for (auto [machine, howMany] : takes)
    for (int d = machine * perMachine;
         d < std::min(devices, (machine + 1) * perMachine) && howMany > 0; ++d)
      if (!used[d]) {
        used[d] = true;
        taken.push_back(d);
        --howMany;
      }
  std::sort(taken.begin(), taken.end());
  return taken;
}

namespace {

//===----------------------------------------------------------------------===//
// The model
//===----------------------------------------------------------------------===//

constexpr int kDefaultMicrobatches = 16;

struct DappleModel {
  LayerTable layers; ///< profile units (scale 1)
  TopologyInfo topo;
  const Topology *topology = nullptr;
  const Profile *profile = nullptr;
  int perMachine = 1;
  int machines = 1;
  int64_t microbatchSize = 1; ///< b
  int64_t profileMicrobatch = 1;
  int microbatches = 1;    ///< M
  double weightFactor = 2; ///< weights + gradients + optimizer state
  bool recompute = false;
  double memoryCap = 0;
  DappleOptions options;

  /// ⌈b/r⌉ / profile microbatch: the largest slice, in profile units.
  double slice(int replicas) const {
    int64_t samples = (microbatchSize + replicas - 1) / replicas;
    return static_cast<double>(samples) / profileMicrobatch;
  }
};

/// A compute stage with its placement and its terms.
struct PlacedStage {
  int first = 0;
  int last = 0;
  int replicas = 1;
  DapplePolicy policy = DapplePolicy::FreshFirst;
  Takes takes;         ///< devices per machine (search) ...
  int level = -1;      ///< innermost level its devices span
  int anchor = 0;      ///< one of its devices (a machine's first in the search)
  double forward = 0;  ///< F_s
  double backward = 0; ///< B_s
  double allreduce = 0;     ///< AR(P_s, g_s)
  double fixedBytes = 0;    ///< parameters, gradients, optimizer (+ recompute)
  double perMicrobatch = 0; ///< stashed bytes per microbatch in flight
  /// Bytes needed with one microbatch in flight.
  double need() const { return fixedBytes + perMicrobatch; }
};

/// Level spanned by a placement given per machine.
int levelOfTakes(const DappleModel &model, const Takes &takes, int replicas) {
  if (replicas < 2)
    return -1;
  int level = 0;
  int anchor = takes.front().first * model.perMachine;
  for (auto [machine, howMany] : takes)
    if (machine != takes.front().first)
      level = std::max(
          level, model.topo.levelBetween(anchor, machine * model.perMachine));
  return level;
}

/// F_s, B_s, AR_s and memory of a stage whose level and anchor are set.
void computeTerms(const DappleModel &model, PlacedStage &stage) {
  double slice = model.slice(stage.replicas);
  stage.forward = slice * model.layers.forward(stage.first, stage.last);
  stage.backward = slice * model.layers.backward(stage.first, stage.last);
  double weights = model.layers.weights(stage.first, stage.last);
  stage.allreduce = model.topo.allreduce(weights, stage.replicas, stage.level);
  stage.fixedBytes = weights * model.weightFactor;
  double stash = slice * model.layers.stash(stage.first, stage.last);
  if (model.recompute) {
    stage.perMicrobatch = slice * model.layers.input(stage.first);
    stage.fixedBytes += stash;
  } else {
    stage.perMicrobatch = stash;
  }
}

/// Places a stage on per-machine free counts; false when too few are free.
bool placeStage(const DappleModel &model, std::vector<int> &freeCount,
                PlacedStage &stage) {
  stage.takes =
      allocateCounts(freeCount, model.perMachine, stage.replicas, stage.policy);
  int taken = 0;
  for (auto [machine, howMany] : stage.takes)
    taken += howMany;
  if (taken != stage.replicas)
    return false;
  stage.level = levelOfTakes(model, stage.takes, stage.replicas);
  stage.anchor = stage.takes.front().first * model.perMachine;
  computeTerms(model, stage);
  return true;
}

/// The communication stage between compute stages a and b (F = B): the
/// largest slice's activations over the slowest level the two span.
double commSeconds(const DappleModel &model, const PlacedStage &a,
                   const PlacedStage &b) {
  double bytes = model.layers.cut[a.last] *
                 std::max(model.slice(a.replicas), model.slice(b.replicas));
  int between =
      a.anchor == b.anchor ? 0 : model.topo.levelBetween(a.anchor, b.anchor);
  int level = std::max({a.level, b.level, between});
  return model.topo.p2p(bytes, level);
}

/// D_i: microbatches the stage can hold (INT_MAX when unlimited).
int maxInflight(const DappleModel &model, const PlacedStage &stage) {
  if (model.memoryCap <= 0)
    return INT_MAX;
  double room = model.memoryCap - stage.fixedBytes;
  if (room < 0)
    return 0;
  if (stage.perMicrobatch <= 0)
    return INT_MAX;
  return static_cast<int>(
      std::min(1e9, std::floor(room / stage.perMicrobatch)));
}

/// Appends the pipeline stages of `stage` (a communication stage first when
/// it follows `previous`) to F, B, AR.
void appendStage(const DappleModel &model, const PlacedStage *previous,
                 const PlacedStage &stage, std::vector<double> &forward,
                 std::vector<double> &backward,
                 std::vector<double> &allreduce) {
  if (previous) {
    double comm = commSeconds(model, *previous, stage);
    forward.push_back(comm);
    backward.push_back(comm);
    allreduce.push_back(0);
  }
  forward.push_back(stage.forward);
  backward.push_back(stage.backward);
  allreduce.push_back(stage.allreduce);
}

double latencyOf(const DappleModel &model, const std::vector<double> &forward,
                 const std::vector<double> &backward,
                 const std::vector<double> &allreduce) {
  return dappleLatency(forward, backward, allreduce, model.microbatches,
                       model.options.fixPivotTerm)
      .latency;
}

/// Places `stages` (first, last, replicas, policy set) in order on an empty
/// cluster; false when devices run out.
bool placeAll(const DappleModel &model, std::vector<PlacedStage> &stages) {
  std::vector<int> freeCount(model.machines, model.perMachine);
  for (PlacedStage &stage : stages)
    if (!placeStage(model, freeCount, stage))
      return false;
  return true;
}

struct Evaluation {
  double latency = kInf; ///< +inf when a stage does not fit
  double need = 0;       ///< the largest stage's bytes at one microbatch
};

Evaluation evaluate(const DappleModel &model,
                    const std::vector<PlacedStage> &stages,
                    std::vector<double> &forward, std::vector<double> &backward,
                    std::vector<double> &allreduce) {
  forward.clear();
  backward.clear();
  allreduce.clear();
  Evaluation result;
  bool fits = true;
  for (size_t s = 0; s < stages.size(); ++s) {
    appendStage(model, s ? &stages[s - 1] : nullptr, stages[s], forward,
                backward, allreduce);
    result.need = std::max(result.need, stages[s].need());
    if (maxInflight(model, stages[s]) < 1)
      fits = false;
  }
  if (fits)
    result.latency = latencyOf(model, forward, backward, allreduce);
  return result;
}

//===----------------------------------------------------------------------===//
// The search
//===----------------------------------------------------------------------===//

class DappleSearch {
public:
  DappleSearch(const DappleModel &model, bool allowFewerDevices, int stages)
      : model(model), n(model.layers.numLayers), g(model.topo.numDevices),
        fewer(allowFewerDevices), wanted(stages) {
    const DappleOptions &options = model.options;
    bool fullCuts = n - 1 <= options.maxFullCuts;
    bool fullSizes = g <= options.maxFullDevices;
    if (fullCuts) {
      for (int j = 1; j < n; ++j)
        cuts.push_back(j);
    } else {
      cuts = gridCuts();
    }
    int unit = fullSizes ? 1
                         : (g + options.gridDevices - 1) /
                               std::max(1, options.gridDevices);
    for (int r = unit; r <= g; r += unit)
      sizes.push_back(r);
    if (sizes.empty() || sizes.back() != g)
      sizes.push_back(g);
    policies = options.policies;
    if (policies.empty())
      policies = {DapplePolicy::FreshFirst};
  }

  /// Runs the search; false when no plan fits in memory.
  /// Runs the search (only the one- and two-stage seeds when `quick`);
  /// false when no plan fits in memory.
  bool run(bool quick = false) {
    seedShallowPlans();
    if (!quick && (wanted == 0 || wanted > 2))
      memoisedSearch();
    if (!quick)
      refineAll();
    return std::isfinite(bestLatency);
  }

  const std::vector<PlacedStage> &best() const { return bestPlan; }
  double bestValue() const { return bestLatency; }
  double leastNeed() const { return minNeed; }

private:
  /// Layer positions where a stage may start, at equal compute quantiles.
  std::vector<int> gridCuts() const {
    std::set<int> chosen;
    int points = std::max(2, model.options.gridCuts);
    double total = model.layers.time(0, n - 1);
    for (int k = 1; k <= points; ++k) {
      double target = total * k / (points + 1);
      int j = lastTrue(1, n - 1, [&](int j) {
        return model.layers.time(0, j - 1) <= target;
      });
      chosen.insert(std::clamp(j, 1, n - 1));
    }
    return {chosen.begin(), chosen.end()};
  }

  /// Would a plan of `depth` stages with this latency be kept?
  bool wouldKeep(int depth, double latency) const {
    if (!std::isfinite(latency))
      return false;
    if (latency < bestLatency)
      return true;
    auto found = bestByDepth.find(depth);
    return found == bestByDepth.end() || latency < found->second.first;
  }

  /// Keeps a complete plan when it is the best so far (overall or of its
  /// depth).
  void consider(const std::vector<PlacedStage> &plan, double latency,
                double need) {
    minNeed = std::min(minNeed, need);
    if (!wouldKeep(static_cast<int>(plan.size()), latency))
      return;
    if (latency < bestLatency) {
      bestLatency = latency;
      bestPlan = plan;
    }
    auto depth = static_cast<int>(plan.size());
    auto found = bestByDepth.find(depth);
    if (found == bestByDepth.end() || latency < found->second.first)
      bestByDepth[depth] = {latency, plan};
  }

  static PlacedStage makeStage(int first, int last, int replicas,
                               DapplePolicy policy) {
    PlacedStage stage;
    stage.first = first;
    stage.last = last;
    stage.replicas = replicas;
    stage.policy = policy;
    return stage;
  }

  /// Device counts the last stage may take from `free` devices.
  std::vector<int> lastStageSizes(int free) const {
    std::vector<int> options;
    if (free < 1)
      return options;
    if (fewer)
      for (int r : sizes)
        if (r < free)
          options.push_back(r);
    options.push_back(free);
    return options;
  }

  /// Data parallelism and every two-stage plan P:Q (on the grid when the
  /// instance is large).
  void seedShallowPlans() {
    std::vector<PlacedStage> plan;
    if (wanted == 0 || wanted == 1)
      for (int r : lastStageSizes(g))
        for (DapplePolicy policy : policies) {
          plan = {makeStage(0, n - 1, r, policy)};
          if (placeAll(model, plan)) {
            Evaluation e = evaluate(model, plan, scratchF, scratchB, scratchAR);
            consider(plan, e.latency, e.need);
          }
          if (r == g)
            break; // every policy takes every device
        }
    seedStraightPipeline();
    if (!(wanted == 0 || wanted == 2) || n < 2 || g < 2)
      return;
    std::vector<int> empty(model.machines, model.perMachine);
    for (int firstSize : sizes) {
      if (firstSize >= g)
        break;
      for (DapplePolicy p1 : policies) {
        std::vector<int> afterFirst = empty;
        PlacedStage head = makeStage(0, 0, firstSize, p1);
        if (!placeStage(model, afterFirst, head))
          continue;
        for (int second : lastStageSizes(g - firstSize))
          for (DapplePolicy p2 : policies) {
            std::vector<int> freeCount = afterFirst;
            PlacedStage tail = makeStage(1, n - 1, second, p2);
            if (!placeStage(model, freeCount, tail))
              continue;
            for (int j : cuts) {
              plan = {head, tail};
              plan[0].last = j - 1;
              plan[1].first = j;
              computeTerms(model, plan[0]);
              computeTerms(model, plan[1]);
              Evaluation e =
                  evaluate(model, plan, scratchF, scratchB, scratchAR);
              consider(plan, e.latency, e.need);
            }
            if (second == g - firstSize)
              break;
          }
      }
    }
  }

  /// The straight pipeline (dapple.md §6.1 invariant 8): min(N, G) stages
  /// of one device each in device order (Append First), balanced by
  /// planBalanced, when that partition is cheap to compute.
  void seedStraightPipeline() {
    int depth = wanted > 0 ? wanted : std::min(n, g);
    if (!fewer && depth != g)
      return; // every device must be used
    if (depth < 2 || depth > g || static_cast<double>(n) * n * depth > 2e7)
      return;
    PlanResult balanced = planBalanced(*model.profile, depth);
    if (!balanced.ok)
      return;
    std::vector<PlacedStage> plan;
    for (const StagePlan &stage : balanced.plan.stages)
      plan.push_back(makeStage(stage.firstLayer, stage.lastLayer, 1,
                               DapplePolicy::AppendFirst));
    if (!placeAll(model, plan))
      return;
    Evaluation e = evaluate(model, plan, scratchF, scratchB, scratchAR);
    consider(plan, e.latency, e.need);
  }

  /// A state of Eq. (5): the kept prefix over [0, j) on m devices.
  struct Prefix {
    std::vector<PlacedStage> stages;
    std::vector<double> forward, backward, allreduce;
    std::vector<int> freeCount;
    int devices = 0;
    double need = 0;
    double value = kInf; ///< L of the prefix completed by [j, N) on the rest
  };

  /// L and memory need of `prefix` (whose last stage is `previous`)
  /// completed by [j, N) on `replicas` devices taken by `policy`; false
  /// when too few devices are free.
  bool complete(const Prefix &prefix, const PlacedStage *previous, int j,
                int replicas, DapplePolicy policy, PlacedStage &last,
                double &latency, double &need) {
    std::vector<int> freeCount = prefix.freeCount;
    last = makeStage(j, n - 1, replicas, policy);
    if (!placeStage(model, freeCount, last))
      return false;
    scratchF = prefix.forward;
    scratchB = prefix.backward;
    scratchAR = prefix.allreduce;
    appendStage(model, previous, last, scratchF, scratchB, scratchAR);
    need = std::max(prefix.need, last.need());
    latency = maxInflight(model, last) < 1
                  ? kInf
                  : latencyOf(model, scratchF, scratchB, scratchAR);
    minNeed = std::min(minNeed, need);
    return true;
  }

  void memoisedSearch() {
    // States keyed by (m, stages so far when a depth is wanted), one map per
    // start j.
    std::vector<std::map<std::pair<int, int>, Prefix>> byStart(n);
    Prefix empty;
    empty.freeCount.assign(model.machines, model.perMachine);
    byStart[0][{0, 0}] = std::move(empty);
    int maxDepth = wanted > 0 ? wanted : std::min(n, g);
    for (int j = 0; j < n; ++j) {
      for (auto &entry : byStart[j]) {
        Prefix &prefix = entry.second;
        int depth = static_cast<int>(prefix.stages.size());
        int free = g - prefix.devices;
        // Complete with fewer devices than all remaining (the all-remaining
        // completion was scored when the state was made).
        if (j > 0 && fewer && (wanted == 0 || depth + 1 == wanted))
          for (int r : lastStageSizes(free)) {
            if (r == free)
              break;
            for (DapplePolicy policy : policies) {
              PlacedStage last;
              double latency, need;
              if (!complete(prefix,
                            prefix.stages.empty() ? nullptr
                                                  : &prefix.stages.back(),
                            j, r, policy, last, latency, need))
                continue;
              if (wouldKeep(depth + 1, latency)) {
                std::vector<PlacedStage> plan = prefix.stages;
                plan.push_back(last);
                consider(plan, latency, need);
              }
            }
          }
        if (depth + 2 > maxDepth)
          continue;
        // Split the last stage: [j, j') on m' devices, [j', N) on the rest.
        for (int m : sizes) {
          if (m >= free)
            break;
          for (DapplePolicy policy : policies) {
            std::vector<int> freeCount = prefix.freeCount;
            PlacedStage stage = makeStage(j, j, m, policy);
            if (!placeStage(model, freeCount, stage))
              continue;
            for (int jNext : cuts) {
              if (jNext <= j)
                continue;
              stage.last = jNext - 1;
              computeTerms(model, stage);
              if (maxInflight(model, stage) < 1) {
                minNeed =
                    std::min(minNeed, std::max(prefix.need, stage.need()));
                continue;
              }
              Prefix next;
              next.freeCount = freeCount;
              next.forward = prefix.forward;
              next.backward = prefix.backward;
              next.allreduce = prefix.allreduce;
              appendStage(model,
                          prefix.stages.empty() ? nullptr
                                                : &prefix.stages.back(),
                          stage, next.forward, next.backward, next.allreduce);
              next.devices = prefix.devices + m;
              next.need = std::max(prefix.need, stage.need());
              // Score with the last stage on every remaining device.
              PlacedStage last;
              double latency, need;
              if (!complete(next, &stage, jNext, g - next.devices,
                            DapplePolicy::FreshFirst, last, latency, need))
                continue;
              int key = wanted > 0 ? depth + 1 : 0;
              auto &slot = byStart[jNext][{next.devices, key}];
              bool keepState = slot.stages.empty() || latency < slot.value;
              bool keepPlan = (wanted == 0 || depth + 2 == wanted) &&
                              wouldKeep(depth + 2, latency);
              if (!keepState && !keepPlan)
                continue;
              next.stages = prefix.stages;
              next.stages.push_back(stage);
              if (keepPlan) {
                std::vector<PlacedStage> plan = next.stages;
                plan.push_back(last);
                consider(plan, latency, need);
              }
              if (keepState) {
                next.value = latency;
                slot = std::move(next);
              }
            }
          }
        }
      }
      byStart[j].clear();
    }
  }

  /// Local search from the best plan of every depth.
  void refineAll() {
    std::vector<std::vector<PlacedStage>> starts;
    for (auto &entry : bestByDepth)
      starts.push_back(entry.second.second);
    for (std::vector<PlacedStage> &plan : starts)
      refine(plan);
  }

  /// Steepest-step descent: moves a cut, devices between neighbours (or to
  /// and from the idle pool) by the largest power of two that helps, or a
  /// stage's policy; stops when no move helps.
  void refine(std::vector<PlacedStage> plan) {
    Evaluation current = evaluate(model, plan, scratchF, scratchB, scratchAR);
    if (!std::isfinite(current.latency))
      return;
    int stages = static_cast<int>(plan.size());
    auto tryPlan = [&](std::vector<PlacedStage> &candidate) {
      if (!placeAll(model, candidate))
        return false;
      Evaluation e = evaluate(model, candidate, scratchF, scratchB, scratchAR);
      minNeed = std::min(minNeed, e.need);
      if (e.latency < current.latency * (1 - 1e-12)) {
        current = e;
        plan = candidate;
        consider(plan, e.latency, e.need);
        return true;
      }
      return false;
    };
    int topStep = 1;
    while (topStep * 2 < std::max(n, g))
      topStep *= 2;
    for (int round = 0; round < 400; ++round) {
      bool improved = false;
      for (int step = topStep; step >= 1 && !improved; step /= 2) {
        // Move a cut.
        for (int t = 0; t + 1 < stages && !improved; ++t)
          for (int sign : {-1, 1}) {
            int last = plan[t].last + sign * step;
            if (last < plan[t].first || last >= plan[t + 1].last)
              continue;
            std::vector<PlacedStage> candidate = plan;
            candidate[t].last = last;
            candidate[t + 1].first = last + 1;
            if (tryPlan(candidate)) {
              improved = true;
              break;
            }
          }
        // Move devices between neighbours, or to and from the idle pool.
        int used = 0;
        for (const PlacedStage &stage : plan)
          used += stage.replicas;
        for (int t = 0; t < stages && !improved; ++t) {
          std::vector<std::pair<int, int>> moves; // (to, from), -1 = idle
          if (t + 1 < stages) {
            moves.push_back({t, t + 1});
            moves.push_back({t + 1, t});
          }
          if (fewer) {
            moves.push_back({t, -1});
            moves.push_back({-1, t});
          }
          for (auto [to, from] : moves) {
            if (from >= 0 && plan[from].replicas <= step)
              continue;
            if (from < 0 && used + step > g)
              continue;
            std::vector<PlacedStage> candidate = plan;
            if (to >= 0)
              candidate[to].replicas += step;
            if (from >= 0)
              candidate[from].replicas -= step;
            if (tryPlan(candidate)) {
              improved = true;
              break;
            }
          }
        }
      }
      // Another policy for one stage.
      for (int t = 0; t < stages && !improved; ++t)
        for (DapplePolicy policy : policies) {
          if (policy == plan[t].policy)
            continue;
          std::vector<PlacedStage> candidate = plan;
          candidate[t].policy = policy;
          if (tryPlan(candidate)) {
            improved = true;
            break;
          }
        }
      if (!improved)
        break;
    }
  }

  const DappleModel &model;
  int n, g;
  bool fewer;
  int wanted;
  std::vector<int> cuts, sizes;
  std::vector<DapplePolicy> policies;
  double bestLatency = kInf;
  std::vector<PlacedStage> bestPlan;
  std::map<int, std::pair<double, std::vector<PlacedStage>>> bestByDepth;
  double minNeed = kInf;
  std::vector<double> scratchF, scratchB, scratchAR;
};

/// Resolves b and M: M = options.microbatches, else global batch / b, else
/// 16.
bool resolveBatch(const Profile &profile, const PlannerOptions &options,
                  int64_t &microbatchSize, int &microbatches,
                  std::string &error) {
  microbatchSize = resolveMicrobatchSize(profile, options, error);
  if (!error.empty())
    return false;
  microbatches = options.microbatches;
  if (microbatches == 0 && options.globalBatch > 0)
    microbatches = static_cast<int>(options.globalBatch / microbatchSize);
  if (microbatches == 0)
    microbatches = kDefaultMicrobatches;
  return true;
}

DappleModel makeModel(const Profile &profile, const Topology &topology,
                      int64_t microbatchSize, int microbatches,
                      const SimOptions &sim, const DappleOptions &options) {
  DappleModel model;
  model.layers = buildLayerTable(profile, 1.0);
  model.topo = topologyInfo(topology);
  model.topology = &topology;
  model.profile = &profile;
  model.perMachine = devicesPerMachine(topology, model.topo.numDevices);
  model.machines =
      (model.topo.numDevices + model.perMachine - 1) / model.perMachine;
  model.microbatchSize = microbatchSize;
  model.profileMicrobatch = profile.microbatch;
  model.microbatches = microbatches;
  model.weightFactor = 2 + std::max(0.0, sim.optimizerStateFactor);
  model.recompute = sim.recompute;
  model.memoryCap = static_cast<double>(topology.deviceMemoryBytes);
  model.options = options;
  return model;
}

/// The score of placed stages: terms, latency, K_i and memory.
DappleScore scoreStages(const DappleModel &model,
                        const std::vector<PlacedStage> &stages) {
  DappleScore score;
  score.ok = true;
  for (size_t s = 0; s < stages.size(); ++s)
    appendStage(model, s ? &stages[s - 1] : nullptr, stages[s], score.forward,
                score.backward, score.allreduce);
  score.latency = dappleLatency(score.forward, score.backward, score.allreduce,
                                model.microbatches, model.options.fixPivotTerm);
  int count = static_cast<int>(stages.size());
  DappleWarmup policy = model.options.warmup;
  if (policy == DappleWarmup::Auto) {
    // ACR: mean communication stage time over mean (F + B)/2 of the
    // compute stages.
    double comm = 0, compute = 0;
    for (int s = 0; s < static_cast<int>(score.forward.size()); ++s) {
      if (s % 2)
        comm += score.forward[s];
      else
        compute += (score.forward[s] + score.backward[s]) / 2;
    }
    double ratio =
        count > 1 && compute > 0 ? (comm / (count - 1)) / (compute / count) : 0;
    policy = ratio > 0.5 ? DappleWarmup::B : DappleWarmup::A;
  }
  score.warmupPolicy = policy;
  std::vector<int> capacity;
  for (const PlacedStage &stage : stages)
    capacity.push_back(maxInflight(model, stage));
  score.warmup =
      dappleWarmupDepths(count, model.microbatches, policy, capacity);
  for (int s = 0; s < count; ++s) {
    if (capacity[s] < 1)
      score.fitsMemory = false;
    score.stageMemoryBytes.push_back(static_cast<int64_t>(std::llround(
        stages[s].fixedBytes + score.warmup[s] * stages[s].perMicrobatch)));
  }
  return score;
}

} // namespace

//===----------------------------------------------------------------------===//
// Public entry points
//===----------------------------------------------------------------------===//

DappleScore pipec::scoreDapple(const Profile &profile, const Topology &topology,
                               const Plan &plan, const SimOptions &sim,
                               const DappleOptions &options) {
  DappleScore score;
  if (std::string bad = checkInputs(profile, topology); !bad.empty()) {
    score.error = bad;
    return score;
  }
  int n = static_cast<int>(profile.ops.size());
  if (std::string bad = validatePlan(plan, n); !bad.empty()) {
    score.error = bad;
    return score;
  }
  DappleModel model = makeModel(profile, topology, plan.microbatchSize,
                                plan.microbatches, sim, options);
  std::vector<PlacedStage> stages;
  std::set<int> seen;
  for (int s = 0; s < plan.numStages(); ++s) {
    const StagePlan &stage = plan.stages[s];
    if (static_cast<int>(stage.devices.size()) != stage.replicas) {
      score.error = "stage " + std::to_string(s) +
                    " has no device list (DAPPLE's model needs devices)";
      return score;
    }
    for (int device : stage.devices)
      if (device < 0 || device >= model.topo.numDevices ||
          !seen.insert(device).second) {
        score.error = "stage " + std::to_string(s) + " uses device " +
                      std::to_string(device) +
                      ", which is outside the topology or taken";
        return score;
      }
    PlacedStage placed;
    placed.first = stage.firstLayer;
    placed.last = stage.lastLayer;
    placed.replicas = stage.replicas;
    std::vector<int> devices = stage.devices;
    std::sort(devices.begin(), devices.end());
    placed.level = model.topo.levelSpanning(devices);
    placed.anchor = devices.front();
    computeTerms(model, placed);
    stages.push_back(std::move(placed));
  }
  return scoreStages(model, stages);
}

PlanResult pipec::planDapple(const Profile &profile, const Topology &topology,
                             const PlannerOptions &options,
                             const DappleOptions &dappleOptions) {
  if (std::string bad = checkInputs(profile, topology); !bad.empty())
    return planError("dapple: " + bad);
  int n = static_cast<int>(profile.ops.size());
  int devices = topology.numDevices();
  if (options.stages < 0)
    return planError("dapple: the number of stages must not be negative");
  if (options.stages > n)
    return planError("dapple: cannot split " + std::to_string(n) +
                     " layers into " + std::to_string(options.stages) +
                     " stages");
  if (options.stages > devices)
    return planError("dapple: " + std::to_string(options.stages) +
                     " stages need at least as many devices, the topology "
                     "has " +
                     std::to_string(devices));
  int64_t microbatchSize = 0;
  int microbatches = 0;
  std::string error;
  if (!resolveBatch(profile, options, microbatchSize, microbatches, error))
    return planError("dapple: " + error);

  // With only a global batch, DAPPLE also picks the microbatch size b
  // (M = B / b): replicas split a microbatch, so b must be large enough for
  // them, while a larger M shrinks the bubbles. Every b = B / 2^k is scored
  // by its one- and two-stage plans; the two best get the full search.
  std::vector<std::pair<int64_t, int>> batches = {
      {microbatchSize, microbatches}};
  if (options.globalBatch > 0 && options.microbatchSize == 0 &&
      options.microbatches == 0) {
    std::vector<std::pair<double, std::pair<int64_t, int>>> scored;
    for (int64_t m = 1; m <= options.globalBatch; m *= 2) {
      if (options.globalBatch % m != 0)
        break;
      int64_t b = options.globalBatch / m;
      DappleModel quick = makeModel(profile, topology, b, static_cast<int>(m),
                                    options.sim, dappleOptions);
      DappleSearch search(quick, options.allowFewerDevices, options.stages);
      search.run(/*quick=*/true);
      scored.push_back({search.bestValue(), {b, static_cast<int>(m)}});
    }
    std::stable_sort(
        scored.begin(), scored.end(),
        [](const auto &a, const auto &b) { return a.first < b.first; });
    batches.clear();
    for (size_t i = 0; i < scored.size() && i < 2; ++i)
      batches.push_back(scored[i].second);
  }
  std::unique_ptr<DappleModel> bestModel;
  std::unique_ptr<DappleSearch> bestSearch;
  double leastNeed = kInf;
  for (auto [b, m] : batches) {
    auto model = std::make_unique<DappleModel>(
        makeModel(profile, topology, b, m, options.sim, dappleOptions));
    auto search = std::make_unique<DappleSearch>(
        *model, options.allowFewerDevices, options.stages);
    search->run();
    leastNeed = std::min(leastNeed, search->leastNeed());
    if (!bestSearch || search->bestValue() < bestSearch->bestValue()) {
      bestModel = std::move(model);
      bestSearch = std::move(search);
    }
  }
  const DappleModel &model = *bestModel;
  DappleSearch &search = *bestSearch;
  microbatchSize = model.microbatchSize;
  microbatches = model.microbatches;
  if (!std::isfinite(search.bestValue())) {
    if (model.memoryCap > 0 && std::isfinite(leastNeed))
      return planError(
          "dapple: no plan fits in " + formatBytes(model.memoryCap) +
          " of device memory: the best plan needs " + formatBytes(leastNeed) +
          " per device (parameters, gradients, optimizer state and one "
          "microbatch of stashed activations on its largest stage)");
    return planError("dapple: found no plan");
  }

  const std::vector<PlacedStage> &stages = search.best();
  DappleScore score = scoreStages(model, stages);
  Plan plan;
  plan.algorithm = "dapple";
  plan.schedule = options.schedule.empty() ? "1f1b-flush" : options.schedule;
  plan.microbatches = microbatches;
  plan.microbatchSize = microbatchSize;
  int used = 0;
  double busy = 0;
  std::vector<bool> taken(model.topo.numDevices, false);
  for (const PlacedStage &stage : stages) {
    StagePlan out;
    out.firstLayer = stage.first;
    out.lastLayer = stage.last;
    out.replicas = stage.replicas;
    // The policies replayed on devices take the same machines as the search.
    out.devices = dappleAllocate(topology, taken, stage.replicas, stage.policy);
    plan.stages.push_back(std::move(out));
    used += stage.replicas;
    busy += stage.replicas * microbatches * (stage.forward + stage.backward);
  }
  double latency = score.latency.latency;
  plan.predicted.iterationSeconds = latency;
  plan.predicted.samplesPerSecond =
      latency > 0 ? static_cast<double>(microbatches) * microbatchSize / latency
                  : 0;
  plan.predicted.bubbleFraction =
      latency > 0 ? std::max(0.0, 1 - busy / (used * latency)) : 0;
  plan.predicted.stageMemoryBytes = score.stageMemoryBytes;
  if (std::string bad = validatePlan(plan, n); !bad.empty())
    return planError("dapple: internal error: " + bad);
  PlanResult result;
  result.ok = true;
  result.plan = std::move(plan);
  return result;
}

PlanResult pipec::planDapple(const Profile &profile, const Topology &topology,
                             const PlannerOptions &options) {
  return planDapple(profile, topology, options, DappleOptions());
}
