//===- MadPipe.cpp - The madpipe planner ----------------------------------===//
//
// MadPipe (papers/madpipe.md): the memory-aware dynamic programme MadPipe-DP
// over "P-1 normal processors with one stage each + one special processor
// with any number of stages", whose activation memory follows the 1F1B*
// groups through the ⊕ operator and a discretised state (t_P, m_P, V); the
// binary search on the target period T̂ (Algorithm 1); and, in place of the
// paper's ILP phase, a memory check of the final plan by the simulator.
//
// The special processor is one device listed by each of its stages
// (Plan.h). The simulator runs such a plan (Sim.h: the device serialises
// its stages' ops, oldest microbatch first, backward before forward, and
// sums their memory), which stands in for the ILP's schedule and checks the
// special processor's true activation count, which phase 1 under-estimates
// (g - 1 per stage, madpipe.md §2.4). The planner returns the best plan
// without a shared device (the contiguous variant as the fallback) unless
// the simulator accepts one with a special processor holding several stages
// and finds it strictly faster.
//
// Conventions (madpipe.md §7): layers are the chain's items 1..L; the cut
// after layer k costs C(k) = 2·a_k/β for k = 1..L-1 and C(0) = C(L) = 0;
// V' = (V ⊕ U(k,l)) ⊕ C(k-1); ceilings carry a 1e-9 tolerance; g >= 1.
//
//===----------------------------------------------------------------------===//

#include "pipec/Planners.h"

#include "PlannerUtil.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

namespace pipec {

namespace {

constexpr double kTol = 1e-9;
const double kInf = std::numeric_limits<double>::infinity();

/// ⌈x/T̂⌉ with a tolerance, so that exact multiples of T̂ do not flip to the
/// next group through rounding (madpipe.md §7.10). A non-positive T̂ (an
/// all-zero chain) puts everything in group 1.
double groupOf(double x, double period) {
  if (x <= 0)
    return 0;
  if (period <= 0)
    return 1;
  return std::ceil(x / period - kTol);
}

} // namespace

//===----------------------------------------------------------------------===//
// 1F1B* (madpipe.md §2.1, §3.1)
//===----------------------------------------------------------------------===//

std::vector<int> oneFOneBStarGroups(const std::vector<double> &loads,
                                    double period) {
  const int n = static_cast<int>(loads.size());
  std::vector<int> groups(n, 1);
  int group = 1;
  double sum = 0;
  bool empty = true;
  for (int i = n - 1; i >= 0; --i) {
    // Σ_{s∈g} U(s) <= T, else the item opens group g+1.
    if (!empty && sum + loads[i] > period * (1 + kTol)) {
      ++group;
      sum = 0;
    }
    sum += loads[i];
    empty = false;
    groups[i] = group;
  }
  return groups;
}

std::vector<OneFOneBStarItem>
oneFOneBStarPattern(const std::vector<double> &forward,
                    const std::vector<double> &backward, double period) {
  const int n = static_cast<int>(forward.size());
  if (n == 0 || static_cast<int>(backward.size()) != n || period <= 0)
    return {};
  std::vector<double> loads(n);
  for (int i = 0; i < n; ++i) {
    loads[i] = forward[i] + backward[i];
    if (loads[i] > period * (1 + kTol))
      return {}; // precondition: every U(s) <= T
  }
  std::vector<int> groups = oneFOneBStarGroups(loads, period);
  // Unwrapped start times: every forward runs right after the previous one
  // (within a group and from one group to the next, same shift); a group's
  // backwards follow its last forward in reverse order.
  std::vector<double> fStart(n), bStart(n);
  for (int i = 0; i < n; ++i)
    fStart[i] = i == 0 ? 0 : fStart[i - 1] + forward[i - 1];
  for (int j = n - 1; j >= 0;) {
    int first = j;
    while (first > 0 && groups[first - 1] == groups[j])
      --first;
    bStart[j] = fStart[j] + forward[j];
    for (int i = j - 1; i >= first; --i)
      bStart[i] = bStart[i + 1] + backward[i + 1];
    j = first - 1;
  }
  // In unwrapped period k, F_i runs batch k (shift 0) and B_i runs batch
  // k - (g_i - 1); wrapping τ into [0, T) adds ⌊τ/T⌋ to the shift.
  std::vector<OneFOneBStarItem> items(n);
  auto wrap = [&](double tau, double &start, int &shift) {
    double periods = std::floor(tau / period + kTol);
    start = std::max(0.0, tau - periods * period);
    shift += static_cast<int>(periods);
  };
  for (int i = 0; i < n; ++i) {
    OneFOneBStarItem &item = items[i];
    item.group = groups[i];
    item.forwardShift = 0;
    item.backwardShift = groups[i] - 1;
    wrap(fStart[i], item.forwardStart, item.forwardShift);
    wrap(bStart[i], item.backwardStart, item.backwardShift);
  }
  return items;
}

double madPipeOplus(double x, double y, double period) {
  // x ⊕ y = x + y if ⌈x/T̂⌉ = ⌈(x+y)/T̂⌉, else T̂·⌈x/T̂⌉ + y.
  double gx = groupOf(x, period);
  if (gx == groupOf(x + y, period))
    return x + y;
  return period * gx + y;
}

//===----------------------------------------------------------------------===//
// The chain and the memory model (madpipe.md §1, §2.3)
//===----------------------------------------------------------------------===//

double madPipeStageMemory(const MadPipeChain &chain, int first, int last,
                          int activations) {
  const int n = chain.size();
  double weights = 0, stored = 0;
  for (int i = first; i <= last; ++i) {
    weights += chain.weights[i];
    stored += chain.stored[i];
  }
  double input = first > 0 ? chain.cut[first - 1] : 0; // a_{k-1}
  double output = last < n - 1 ? chain.cut[last] : 0;  // a_l
  double g = std::max(activations, 0);
  // Σ 3W_i + g·Σ a_{i-1} (recompute: g·a_{k-1} + Σ a_{i-1}) + 2(a_{k-1}+a_l)
  double stash = chain.recompute ? g * input + stored : g * stored;
  return chain.weightFactor * weights + stash + 2 * (input + output);
}

MadPipeChain madPipeChain(const Profile &profile, const Topology &topology,
                          int processors, const SimOptions &sim, int maxItems) {
  const int numLayers = static_cast<int>(profile.ops.size());
  MadPipeChain chain;
  chain.processors = std::max(processors, 1);
  chain.weightFactor = 3 + sim.optimizerStateFactor;
  chain.recompute = sim.recompute;
  chain.memory = static_cast<double>(topology.deviceMemoryBytes);
  if (numLayers == 0)
    return chain;
  std::vector<int> starts;
  if (maxItems > 0 && numLayers > maxItems) {
    std::vector<double> loads(numLayers);
    for (int l = 0; l < numLayers; ++l)
      loads[l] = profile.ops[l].fwdSeconds + profile.ops[l].bwdSeconds;
    starts = planner_util::splitChainMinMax(loads, maxItems);
  } else {
    starts.resize(numLayers);
    std::iota(starts.begin(), starts.end(), 0);
  }
  std::vector<int64_t> cuts = cutBytesPerCut(profile);
  const int items = static_cast<int>(starts.size());
  for (int i = 0; i < items; ++i) {
    int first = starts[i];
    int last = i + 1 < items ? starts[i + 1] - 1 : numLayers - 1;
    double fwd = 0, bwd = 0, weights = 0, stored = 0;
    for (int l = first; l <= last; ++l) {
      fwd += profile.ops[l].fwdSeconds;
      bwd += profile.ops[l].bwdSeconds;
      weights += static_cast<double>(profile.ops[l].paramBytes);
      stored += static_cast<double>(profile.ops[l].savedBytes);
    }
    int64_t cut = i + 1 < items ? cuts[last] : 0;
    chain.forward.push_back(fwd);
    chain.backward.push_back(bwd);
    chain.weights.push_back(weights);
    chain.stored.push_back(stored);
    chain.cut.push_back(static_cast<double>(cut));
    // C(l) = 2·a_l/β: the activation forward and its gradient backward over
    // the slowest link among the processors' devices.
    double link = chain.processors > 1
                      ? topology.p2pSeconds(cut, 0, chain.processors - 1)
                      : 0.0;
    chain.comm.push_back(cut > 0 ? 2 * link : 0.0);
    chain.lastLayer.push_back(last);
  }
  return chain;
}

//===----------------------------------------------------------------------===//
// MadPipe-DP (madpipe.md §3.2)
//===----------------------------------------------------------------------===//

namespace {

/// One grid of the discretised state: `points` values on [0, hi], values
/// rounded up (index ⌈x/step⌉), the top point exactly hi.
struct Grid {
  int points = 1;
  double hi = 0;
  double step = 0;

  Grid() = default;
  Grid(int n, double top) : points(std::max(n, 1)), hi(top) {
    if (points < 2 || hi <= 0) {
      points = 1;
      hi = std::max(top, 0.0);
      step = 0;
    } else {
      step = hi / (points - 1);
    }
  }
  int index(double x) const {
    if (step <= 0 || x <= 0)
      return 0;
    double i = std::ceil(x / step - kTol);
    return static_cast<int>(std::min<double>(i, points - 1));
  }
  double value(int i) const {
    if (points == 1)
      return 0;
    return i == points - 1 ? hi : i * step;
  }
};

/// T(l, p, t_P, m_P, V), memoised top-down over the reachable states.
class MadPipeSolver {
public:
  /// `cutoff`: an upper bound on the optimum (or +inf). States whose value
  /// must exceed it are not explored; the result is exact whenever the
  /// optimum is <= cutoff.
  MadPipeSolver(const MadPipeChain &chain, double target,
                const MadPipeGrid &grid, double cutoff = kInf)
      : chain(chain), target(target), cutoff(cutoff), numLayers(chain.size()),
        numNormal(std::max(chain.processors, 1) - (chain.contiguous ? 0 : 1)),
        limited(chain.memory > 0), memoryLimit(chain.memory) {
    prefixU.assign(numLayers + 1, 0);
    prefixW.assign(numLayers + 1, 0);
    prefixA.assign(numLayers + 1, 0);
    for (int l = 1; l <= numLayers; ++l) {
      prefixU[l] =
          prefixU[l - 1] + chain.forward[l - 1] + chain.backward[l - 1];
      prefixW[l] = prefixW[l - 1] + chain.weights[l - 1];
      prefixA[l] = prefixA[l - 1] + chain.stored[l - 1];
    }
    double sumC = 0;
    for (int l = 1; l < numLayers; ++l)
      sumC += C(l);
    int periodPoints = std::max(grid.period, 2);
    int memoryPoints = limited ? std::max(grid.memory, 2) : 1;
    int delayPoints = limited ? std::max(grid.delay, 2) : 1;
    // Keep the dense memo table within 2^26 entries (counted for P + 1
    // processor states, so that both variants get the same grids).
    const double maxEntries = 67108864.0;
    while ((numLayers + 1.0) * (std::max(chain.processors, 1) + 1) *
               periodPoints * memoryPoints * delayPoints >
           maxEntries) {
      periodPoints = std::max(2, periodPoints * 3 / 4);
      memoryPoints = limited ? std::max(2, memoryPoints * 3 / 4) : 1;
      delayPoints = limited ? std::max(2, delayPoints * 3 / 4) : 1;
      if (periodPoints == 2 && memoryPoints <= 2 && delayPoints <= 2)
        break;
    }
    tGrid = Grid(periodPoints, prefixU[numLayers]);
    mGrid = limited ? Grid(memoryPoints, memoryLimit) : Grid();
    // V_max = 2·(U(1,L) + Σ C(l)) + T̂ bounds V whenever every stage fits in
    // T̂; larger V are capped.
    vGrid = limited
                ? Grid(delayPoints, 2 * (prefixU[numLayers] + sumC) + target)
                : Grid();
    memo.assign(static_cast<size_t>(numLayers + 1) * (numNormal + 1) *
                    tGrid.points * mGrid.points * vGrid.points,
                std::numeric_limits<double>::quiet_NaN());
  }

  MadPipeAllocation run() {
    MadPipeAllocation result;
    result.target = target;
    if (numLayers == 0)
      return result;
    double value = solve(numLayers, numNormal, 0, 0, 0);
    if (!(value < kInf))
      return result;
    result.feasible = true;
    result.value = value;
    backtrack(result);
    recomputeExact(result);
    return result;
  }

private:
  /// A transition: the last stage is layers k..l, normal or special.
  struct Move {
    bool feasible = false;
    double value = kInf;
    int p = 0, ti = 0, mi = 0, vi = 0; ///< the child state at l = k-1
  };

  /// U(k, l), 1-based inclusive.
  double U(int k, int l) const { return prefixU[l] - prefixU[k - 1]; }
  /// C(k): the cut after layer k; C(0) = C(L) = 0.
  double C(int k) const {
    return k >= 1 && k < numLayers ? chain.comm[k - 1] : 0.0;
  }
  /// 𝓜(k, l, g) = Σ_{i=k}^{l} (3W_i + g·a_{i-1}) + 2·(a_{k-1} + a_l), 1-based,
  /// with prefix sums (same model as madPipeStageMemory).
  double M(int k, int l, int g) const {
    double input = k > 1 ? chain.cut[k - 2] : 0;          // a_{k-1}
    double output = l < numLayers ? chain.cut[l - 1] : 0; // a_l
    double stored = prefixA[l] - prefixA[k - 1];
    double groups = std::max(g, 0);
    double stash = chain.recompute ? groups * input + stored : groups * stored;
    return chain.weightFactor * (prefixW[l] - prefixW[k - 1]) + stash +
           2 * (input + output);
  }
  /// g(k, l, V) = ⌈(V + U(k,l))/T̂⌉, at least 1.
  int g(int k, int l, double V) const {
    return std::max(1, static_cast<int>(groupOf(V + U(k, l), target)));
  }
  bool fits(double bytes) const { return !limited || bytes <= memoryLimit; }

  size_t key(int l, int p, int ti, int mi, int vi) const {
    return (((static_cast<size_t>(l) * (numNormal + 1) + p) * tGrid.points +
             ti) *
                mGrid.points +
            mi) *
               vGrid.points +
           vi;
  }

  /// Evaluates one transition from state (l, p, ti, mi, vi).
  Move move(int l, int p, int ti, int mi, int vi, int k, bool special) {
    Move mv;
    double u = U(k, l);
    double ck = C(k - 1);
    double V = vGrid.value(vi);
    int groups = g(k, l, V);
    // V' = (V ⊕ U(k,l)) ⊕ C(k-1)
    double nextV = madPipeOplus(madPipeOplus(V, u, target), ck, target);
    mv.vi = limited ? vGrid.index(nextV) : 0;
    if (!special) {
      // T_N(k) = max(U(k,l), C(k-1), T(k-1, p-1, t_P, m_P, V')),
      // feasible iff 𝓜(k, l, g) <= M.
      if (p < 1 || !fits(M(k, l, groups)))
        return mv;
      mv.p = p - 1;
      mv.ti = ti;
      mv.mi = mi;
      double child = solve(k - 1, mv.p, mv.ti, mv.mi, mv.vi);
      mv.value = std::max({u, ck, child});
    } else {
      // t'_P = t_P + U(k,l); m'_P = m_P + 𝓜(k, l, g-1) <= M;
      // T_S(k) = max(t'_P, C(k-1), T(k-1, p, t'_P, m'_P, V')).
      double nextM = mGrid.value(mi) + M(k, l, groups - 1);
      if (!fits(nextM))
        return mv;
      double nextT = tGrid.value(ti) + u;
      mv.p = p;
      mv.ti = tGrid.index(nextT);
      mv.mi = limited ? mGrid.index(nextM) : 0;
      double child = solve(k - 1, mv.p, mv.ti, mv.mi, mv.vi);
      mv.value = std::max({tGrid.value(mv.ti), ck, child});
    }
    mv.feasible = mv.value < kInf;
    return mv;
  }

  /// Base case T(l, 0, t_P, m_P, V) = U(1,l) + t_P, feasible iff
  /// m_P + 𝓜(1, l, g(1,l,V) - 1) <= M.
  double base(int l, int ti, int mi, int vi) const {
    int groups = g(1, l, vGrid.value(vi));
    if (!fits(mGrid.value(mi) + M(1, l, groups - 1)))
      return kInf;
    return tGrid.value(ti) + U(1, l);
  }

  double solve(int l, int p, int ti, int mi, int vi) {
    if (l == 0)
      return tGrid.value(ti); // T(0, p, t_P, m_P, V) = t_P
    if (tGrid.value(ti) > cutoff)
      return tGrid.value(ti); // T >= t_P > cutoff: a lower bound suffices
    if (p == 0)
      return chain.contiguous ? kInf : base(l, ti, mi, vi);
    double &slot = memo[key(l, p, ti, mi, vi)];
    if (!std::isnan(slot))
      return slot;
    double best = kInf;
    for (int k = l; k >= 1; --k) {
      // Both transitions cost at least U(k,l), which grows as k falls.
      if (U(k, l) >= best || U(k, l) > cutoff)
        break;
      for (bool special : {false, true}) {
        if (special && chain.contiguous)
          continue;
        Move mv = move(l, p, ti, mi, vi, k, special);
        if (mv.feasible && mv.value < best)
          best = mv.value;
      }
    }
    slot = best; // the memo is never resized, so `slot` is still valid
    return best;
  }

  void backtrack(MadPipeAllocation &result) {
    int l = numLayers, p = numNormal, ti = 0, mi = 0, vi = 0;
    std::vector<MadPipeStage> reversed;
    while (l > 0) {
      if (p == 0 && !chain.contiguous) {
        MadPipeStage stage;
        stage.first = 0;
        stage.last = l - 1;
        stage.special = true;
        reversed.push_back(stage);
        break;
      }
      double want = solve(l, p, ti, mi, vi);
      bool found = false;
      for (int k = l; k >= 1 && !found; --k)
        for (bool special : {false, true}) {
          if (special && chain.contiguous)
            continue;
          Move mv = move(l, p, ti, mi, vi, k, special);
          if (!mv.feasible || mv.value != want)
            continue;
          MadPipeStage stage;
          stage.first = k - 1;
          stage.last = l - 1;
          stage.special = special;
          reversed.push_back(stage);
          l = k - 1;
          p = mv.p;
          ti = mv.ti;
          mi = mv.mi;
          vi = mv.vi;
          found = true;
          break;
        }
      if (!found) { // cannot happen: the optimum is one of the moves
        result.feasible = false;
        return;
      }
    }
    result.stages.assign(reversed.rbegin(), reversed.rend());
  }

  /// g, 𝓜 and the period of the allocation with exact (unrounded) values.
  void recomputeExact(MadPipeAllocation &result) const {
    double V = 0, special = 0, period = 0;
    for (int s = static_cast<int>(result.stages.size()) - 1; s >= 0; --s) {
      MadPipeStage &stage = result.stages[s];
      int k = stage.first + 1, l = stage.last + 1;
      stage.activations = g(k, l, V);
      if (stage.special) {
        stage.memoryBytes = M(k, l, stage.activations - 1);
        special += U(k, l);
      } else {
        stage.memoryBytes = M(k, l, stage.activations);
        period = std::max(period, U(k, l));
      }
      period = std::max(period, C(k - 1));
      V = madPipeOplus(madPipeOplus(V, U(k, l), target), C(k - 1), target);
    }
    result.period = std::max(period, special);
  }

  const MadPipeChain &chain;
  double target;
  double cutoff;
  int numLayers;
  int numNormal;
  bool limited;
  double memoryLimit;
  std::vector<double> prefixU, prefixW, prefixA;
  Grid tGrid, mGrid, vGrid;
  std::vector<double> memo;
};

} // namespace

MadPipeAllocation madPipeDP(const MadPipeChain &chain, double targetPeriod,
                            const MadPipeGrid &grid) {
  // The contiguous variant's optimum bounds the full DP's from above (its
  // allocations are the full DP's with a one-stage special processor, whose
  // g - 1 charge is below g; same grids): a cheap cutoff.
  double cutoff = kInf;
  if (!chain.contiguous && chain.processors >= 2) {
    MadPipeChain contiguous = chain;
    contiguous.contiguous = true;
    MadPipeAllocation bound =
        MadPipeSolver(contiguous, targetPeriod, grid).run();
    if (bound.feasible)
      cutoff = bound.value;
  }
  MadPipeSolver solver(chain, targetPeriod, grid, cutoff);
  return solver.run();
}

//===----------------------------------------------------------------------===//
// Algorithm 1: binary search on T̂ (madpipe.md §3.3)
//===----------------------------------------------------------------------===//

MadPipeSearch madPipeSearch(const MadPipeChain &chain, const MadPipeGrid &grid,
                            int iterations) {
  MadPipeSearch search;
  const int n = chain.size();
  if (n == 0)
    return search;
  double total = 0, sumC = 0;
  for (int l = 0; l < n; ++l)
    total += chain.forward[l] + chain.backward[l];
  for (int l = 0; l + 1 < n; ++l)
    sumC += chain.comm[l];
  double lb = total / std::max(chain.processors, 1); // U(1,L)/P
  double ub = total + sumC;                          // U(1,L) + Σ C(l)
  double target = lb;                                // T̂_1
  for (int i = 0; i < std::max(iterations, 1); ++i) {
    MadPipeAllocation allocation = madPipeDP(chain, target, grid);
    MadPipeStep step;
    step.target = target;
    step.value = allocation.feasible ? allocation.value : kInf; // T_i
    step.tilde = std::max(step.value, target);                  // T̃_i
    lb = std::max(lb, std::min(step.value, target));
    ub = std::min(ub, step.tilde);
    step.lowerBound = lb;
    step.upperBound = ub;
    if (allocation.feasible &&
        (search.best < 0 || step.tilde < search.steps[search.best].tilde))
      search.best = i;
    search.steps.push_back(step);
    search.allocations.push_back(std::move(allocation));
    target = 0.5 * (lb + ub); // T̂_{i+1}
  }
  // The search never evaluates T̂ = ub itself; when memory is so tight that
  // only the loosest target works, take one more step there.
  if (search.best < 0 && ub > 0) {
    MadPipeAllocation allocation = madPipeDP(chain, ub, grid);
    MadPipeStep step;
    step.target = ub;
    step.value = allocation.feasible ? allocation.value : kInf;
    step.tilde = std::max(step.value, ub);
    step.lowerBound = lb;
    step.upperBound = ub;
    if (allocation.feasible)
      search.best = static_cast<int>(search.steps.size());
    search.steps.push_back(step);
    search.allocations.push_back(std::move(allocation));
  }
  return search;
}

//===----------------------------------------------------------------------===//
// The planner
//===----------------------------------------------------------------------===//

namespace {

/// The plan of an allocation: normal stages on devices 0, 1, ... in chain
/// order, the special processor's stages on the next device.
Plan allocationPlan(const MadPipeChain &chain, const MadPipeAllocation &alloc,
                    const std::string &schedule, int64_t microbatchSize,
                    int microbatchesOption, int64_t globalBatch) {
  Plan plan;
  plan.algorithm = "madpipe";
  plan.schedule = schedule;
  plan.microbatchSize = microbatchSize;
  plan.chunks = 1;
  int normal = 0;
  bool hasSpecial = false;
  for (const MadPipeStage &stage : alloc.stages) {
    if (stage.special)
      hasSpecial = true;
    else
      ++normal;
  }
  int devices = normal + (hasSpecial ? 1 : 0);
  int nextNormal = 0;
  auto lastLayer = [&](int item) {
    return chain.lastLayer.empty() ? item : chain.lastLayer[item];
  };
  for (const MadPipeStage &stage : alloc.stages) {
    StagePlan sp;
    sp.firstLayer = stage.first == 0 ? 0 : lastLayer(stage.first - 1) + 1;
    sp.lastLayer = lastLayer(stage.last);
    sp.replicas = 1;
    sp.devices = {stage.special ? normal : nextNormal++};
    plan.stages.push_back(sp);
    plan.predicted.stageMemoryBytes.push_back(
        static_cast<int64_t>(std::llround(stage.memoryBytes)));
  }
  if (microbatchesOption > 0)
    plan.microbatches = microbatchesOption;
  else if (globalBatch > 0)
    plan.microbatches =
        static_cast<int>(std::max<int64_t>(1, globalBatch / microbatchSize));
  else // one per stage (the devices, unless a special processor holds more)
    plan.microbatches = std::max(plan.numStages(), 1);
  // The pattern runs one microbatch per period T̃ = max(T, T̂).
  double total = 0;
  for (int l = 0; l < chain.size(); ++l)
    total += chain.forward[l] + chain.backward[l];
  double period = std::max(alloc.period, alloc.target);
  plan.predicted.iterationSeconds = plan.microbatches * period;
  plan.predicted.samplesPerSecond =
      period > 0 ? static_cast<double>(microbatchSize) / period : 0;
  plan.predicted.bubbleFraction =
      period > 0 ? std::max(0.0, 1 - total / (devices * period)) : 0;
  return plan;
}

/// The smallest memory per processor at which MadPipe-DP finds an
/// allocation at T̂ = ub (every g minimal), by bisection.
double memoryNeeded(MadPipeChain chain, const MadPipeGrid &grid) {
  double total = 0, sumC = 0;
  for (int l = 0; l < chain.size(); ++l)
    total += chain.forward[l] + chain.backward[l];
  for (int l = 0; l + 1 < chain.size(); ++l)
    sumC += chain.comm[l];
  double target = std::max(total + sumC, 1e-30);
  double lo = chain.memory;
  double hi = madPipeStageMemory(chain, 0, chain.size() - 1, 1) + 1;
  chain.memory = hi;
  if (!madPipeDP(chain, target, grid).feasible)
    return hi;
  for (int it = 0; it < 14 && hi - lo > 1e-3 * hi; ++it) {
    chain.memory = 0.5 * (lo + hi);
    if (madPipeDP(chain, target, grid).feasible)
      hi = chain.memory;
    else
      lo = chain.memory;
  }
  return hi;
}

/// Simulates `plan` and checks every device's peak memory, the special
/// processor's included (the simulator sums the stages of a shared device
/// and runs them in its greedy order, Sim.h). "" when the simulator runs the
/// plan (no deadlock) and it fits; `worst` is the largest device peak.
/// Without a memory limit, a plan whose devices run one stage each is
/// accepted unsimulated; one with a special processor is simulated for
/// deadlock.
std::string simulatorMemoryCheck(const Profile &profile,
                                 const Topology &topology, const Plan &plan,
                                 const SimOptions &options, double &worst) {
  worst = 0;
  const bool limited = topology.deviceMemoryBytes > 0;
  if (!limited && devicesSharedByStages(plan).empty())
    return "";
  // The memory of a continuous schedule (1f1b, 2bw) does not grow with m
  // past the fill (p - s in flight, at most two versions for 2bw with
  // m >= p - 1), so a short run suffices.
  Plan shortRun = plan;
  shortRun.microbatches = std::min(plan.microbatches, plan.numStages() + 1);
  SimResult sim = simulatePlan(profile, topology, shortRun, options);
  if (!sim.ok)
    return "the simulator rejects the plan: " + sim.error;
  if (!limited)
    return "";
  int worstDevice = -1;
  for (const DeviceUsage &usage : sim.devices)
    if (static_cast<double>(usage.peakBytes) > worst) {
      worst = static_cast<double>(usage.peakBytes);
      worstDevice = usage.device;
    }
  double limit = static_cast<double>(topology.deviceMemoryBytes);
  if (!sim.fitsMemory || worst > limit)
    return "the simulator finds " + planner_util::formatBytes(worst) +
           " on device " + std::to_string(worstDevice) + " (limit " +
           planner_util::formatBytes(limit) + ")";
  return "";
}

/// The schedule and the processor count a request asks for, or why it
/// cannot be planned.
struct MadPipeRequest {
  std::string schedule;
  int processors = 0;
  std::string error; ///< empty when the request can be planned
};

MadPipeRequest madPipeRequest(const Profile &original, const Topology &topology,
                              const PlannerOptions &options) {
  MadPipeRequest request;
  if (std::string bad = profilePlanningError(original); !bad.empty()) {
    request.error = "madpipe: " + bad;
    return request;
  }
  request.schedule = options.schedule.empty() ? "1f1b" : options.schedule;
  const std::string &schedule = request.schedule;
  if (schedule != "1f1b" && schedule != "2bw") {
    request.error = "madpipe plans periodic 1F1B* schedules: schedule "
                    "must be 1f1b or 2bw, not '" +
                    schedule + "'";
    return request;
  }
  const int numDevices = topology.numDevices();
  const int numLayers = static_cast<int>(original.ops.size());
  if (numDevices < 1) {
    request.error = "madpipe: the topology has no devices";
    return request;
  }
  if (options.stages < 0 || options.stages > numDevices) {
    request.error = "madpipe: " + std::to_string(options.stages) +
                    " processors requested but the topology has " +
                    std::to_string(numDevices) + " devices";
    return request;
  }
  if (options.stages > numLayers) {
    request.error = "madpipe: cannot place " + std::to_string(options.stages) +
                    " processors on " + std::to_string(numLayers) + " layers";
    return request;
  }
  int processors = options.stages > 0 ? options.stages : numDevices;
  if (processors > numLayers) {
    if (!options.allowFewerDevices) {
      request.error =
          "madpipe does not replicate stages: " + std::to_string(numDevices) +
          " devices need at least " + std::to_string(numDevices) +
          " layers (the profile has " + std::to_string(numLayers) + ")";
      return request;
    }
    processors = numLayers;
  }
  if (options.microbatchSize < 0) {
    request.error = "madpipe: the microbatch size must not be negative (0 "
                    "takes the profile's)";
    return request;
  }
  request.processors = processors;
  return request;
}

/// The grid, chain items and processors that fit MadPipe-DP's state space.
struct StateBudget {
  MadPipeGrid grid;
  int items = 0;
  int processors = 0;
};

/// Fits the discretised state space into a budget: first coarser grids,
/// then blocks of layers (fewer processors if needed), then the coarsest
/// grids.
StateBudget fitStateBudget(int numLayers, int processors, bool limited) {
  StateBudget budget;
  MadPipeGrid &grid = budget.grid;
  int items = numLayers;
  const double maxEntries = 4e6;
  auto entries = [&] {
    return (items + 1.0) * processors * grid.period *
           (limited ? 1.0 * grid.memory * grid.delay : 1.0);
  };
  auto shrinkGrid = [&](int minT, int minM, int minV) {
    bool changed = false;
    auto shrink = [&](int &v, int lo) {
      int next = std::max(lo, v * 4 / 5);
      changed |= next < v;
      v = std::min(v, next);
    };
    shrink(grid.period, minT);
    if (limited) {
      shrink(grid.memory, minM);
      shrink(grid.delay, minV);
    }
    return changed;
  };
  while (entries() > maxEntries && shrinkGrid(26, 6, 11))
    ;
  while (entries() > maxEntries && items > 16) {
    items = items * 4 / 5;
    processors = std::min(processors, items);
  }
  while (entries() > maxEntries && shrinkGrid(11, 3, 6))
    ;
  budget.items = items;
  budget.processors = processors;
  return budget;
}

/// Does an allocation put several stages on the special processor?
bool sharesDevice(const MadPipeAllocation &alloc) {
  int special = 0;
  for (const MadPipeStage &s : alloc.stages)
    special += s.special ? 1 : 0;
  return special > 1;
}

/// The largest modelled memory of one device of `plan`, the stages of the
/// special processor summed.
double modelledDeviceMemory(const Plan &plan, const MadPipeAllocation &alloc) {
  std::map<int, double> model;
  for (size_t s = 0; s < plan.stages.size(); ++s)
    model[plan.stages[s].devices[0]] += alloc.stages[s].memoryBytes;
  double modelled = 0;
  for (const auto &entry : model)
    modelled = std::max(modelled, entry.second);
  return modelled;
}

/// Algorithm 1 and the simulator's check for one chain: the allocations the
/// DP finds, turned into plans and accepted or refused by the simulator.
class CheckedSearch {
public:
  CheckedSearch(const Profile &original, const Topology &topology,
                const PlannerOptions &options, const std::string &schedule,
                int64_t b, const MadPipeChain &chain, const MadPipeGrid &grid)
      : original(original), topology(topology), options(options),
        schedule(schedule), b(b), chain(chain), grid(grid),
        limit(chain.memory) {}

  /// One variant (contiguous or not), one kind of allocation: the budget M
  /// first; when the simulator finds more memory than the model (e.g. 1f1b
  /// keeps p - s weight versions where MadPipe counts 2, or the special
  /// processor's g - 1 under-estimate of madpipe.md §2.4), the model's
  /// budget M' < M is bisected for the largest one whose plan the simulator
  /// accepts.
  bool solve(bool contiguous, bool shared, Plan &out) {
    MadPipeChain variant = chain;
    variant.contiguous = contiguous;
    double overshoot = 0;
    if (attempt(variant, shared, overshoot, out))
      return true;
    if (limit <= 0 || overshoot <= 1)
      return false;
    double lo = 0, hi = limit;
    bool found = false;
    Plan accepted;
    for (int it = 0; it < 7 && hi - lo > 0.01 * limit; ++it) {
      double budget = it == 0 ? limit / overshoot : 0.5 * (lo + hi);
      variant.memory = budget;
      double ignored = 0;
      if (attempt(variant, shared, ignored, accepted)) {
        found = true;
        out = std::move(accepted);
        lo = budget;
      } else {
        hi = budget;
      }
    }
    return found;
  }

  /// Why no plan came out of solve() on `processors` processors.
  std::string failure(int processors) const {
    using planner_util::formatBytes;
    if (!anyAllocation)
      return "madpipe: no allocation on " + std::to_string(processors) +
             " processors fits in " + formatBytes(limit) +
             " per device; the best needs " +
             formatBytes(memoryNeeded(chain, grid)) +
             " per device (madpipe.md §2.3 memory model)";
    std::string last = lastRejection;
    if (schedule == "1f1b" && last.find("finds") != std::string::npos)
      last += "; the simulator's 1f1b keeps p - s weight versions "
              "per stage, MadPipe's model two (schedule 2bw)";
    return "madpipe: no allocation passes the simulator's check" +
           (limit > 0 ? " in " + formatBytes(limit) + " per device"
                      : std::string()) +
           " (last: " + last + ")";
  }

private:
  /// Algorithm 1 per (variant, memory budget), computed once.
  const MadPipeSearch &searchFor(const MadPipeChain &variant) {
    auto key = std::make_pair(variant.contiguous, variant.memory);
    auto it = searches.find(key);
    if (it == searches.end())
      it = searches.emplace(key, madPipeSearch(variant, grid, 10)).first;
    return it->second;
  }

  /// The simulator is the final judge (the paper's ILP phase is replaced by
  /// it): it must run the plan (no deadlock) and find every device, the
  /// special processor included, within memory. `attempt` runs Algorithm 1
  /// for one chain and returns the first allocation, in order of
  /// T̃ = max(T, T̂), that the simulator accepts, among those with a special
  /// processor holding several stages (`shared`) or those without;
  /// `overshoot` is the largest simulated/modelled device memory ratio of
  /// the ones it refused for memory.
  bool attempt(const MadPipeChain &variant, bool shared, double &overshoot,
               Plan &accepted) {
    overshoot = 0;
    const MadPipeSearch &search = searchFor(variant);
    if (search.best < 0)
      return false;
    anyAllocation = true;
    std::vector<int> order;
    for (int i = 0; i < static_cast<int>(search.steps.size()); ++i)
      if (search.allocations[i].feasible &&
          sharesDevice(search.allocations[i]) == shared)
        order.push_back(i);
    auto tilde = [&](int i) {
      return std::max(search.allocations[i].period,
                      search.allocations[i].target);
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](int x, int y) { return tilde(x) < tilde(y); });
    std::vector<std::vector<int>> tried;
    for (int i : order) {
      const MadPipeAllocation &alloc = search.allocations[i];
      std::vector<int> shape;
      for (const MadPipeStage &s : alloc.stages)
        shape.insert(shape.end(), {s.first, s.last, s.special ? 1 : 0});
      if (std::find(tried.begin(), tried.end(), shape) != tried.end())
        continue;
      tried.push_back(shape);
      Plan plan = allocationPlan(chain, alloc, schedule, b,
                                 options.microbatches, options.globalBatch);
      double worst = 0;
      std::string rejection =
          simulatorMemoryCheck(original, topology, plan, options.sim, worst);
      if (rejection.empty()) {
        accepted = std::move(plan);
        return true;
      }
      lastRejection = rejection;
      if (limit > 0 && worst > limit) {
        double modelled = modelledDeviceMemory(plan, alloc);
        if (modelled > 0)
          overshoot = std::max(overshoot, worst / modelled);
      }
    }
    return false;
  }

  const Profile &original;
  const Topology &topology;
  const PlannerOptions &options;
  const std::string &schedule;
  const int64_t b;
  const MadPipeChain &chain;
  const MadPipeGrid &grid;
  const double limit; ///< the chain's memory budget M
  std::map<std::pair<bool, double>, MadPipeSearch> searches;
  std::string lastRejection;
  bool anyAllocation = false;
};

/// Whether the simulator runs `special` within memory and strictly faster
/// than `plain`.
bool fasterWithSpecial(const Profile &original, const Topology &topology,
                       const Plan &special, const Plan &plain,
                       const SimOptions &options) {
  SimResult withSpecial = simulatePlan(original, topology, special, options);
  SimResult withoutSpecial = simulatePlan(original, topology, plain, options);
  return withSpecial.ok && withSpecial.fitsMemory && withoutSpecial.ok &&
         withSpecial.samplesPerSecond >
             withoutSpecial.samplesPerSecond * (1 + 1e-9);
}

/// The planner's result for an accepted plan (validated).
PlanResult madPipeResult(Plan plan, int numLayers) {
  PlanResult result;
  result.ok = true;
  result.plan = std::move(plan);
  if (std::string bad = validatePlan(result.plan, numLayers); !bad.empty())
    return planner_util::planError("madpipe: internal error: " + bad);
  return result;
}

} // namespace

PlanResult planMadPipe(const Profile &original, const Topology &topology,
                       const PlannerOptions &options) {
  using namespace planner_util;
  MadPipeRequest request = madPipeRequest(original, topology, options);
  if (!request.error.empty())
    return planError(request.error);
  const int numDevices = topology.numDevices();
  const int numLayers = static_cast<int>(original.ops.size());
  const int64_t b = chosenMicrobatchSize(original, options.microbatchSize);
  Profile profile = scaleProfile(original, b);

  const StateBudget budget = fitStateBudget(numLayers, request.processors,
                                            topology.deviceMemoryBytes > 0);
  const int processors = budget.processors;
  if (processors < numDevices && !options.allowFewerDevices &&
      options.stages == 0)
    return planError("madpipe cannot use all " + std::to_string(numDevices) +
                     " devices within its state budget; allow fewer "
                     "devices or use pipedream/dapple");

  MadPipeChain chain =
      madPipeChain(profile, topology, processors, options.sim,
                   budget.items < numLayers ? budget.items : 0);
  CheckedSearch search(original, topology, options, request.schedule, b, chain,
                       budget.grid);
  // Plans whose devices run one stage each: the full DP's allocations
  // whose special processor holds at most one stage, else the contiguous
  // variant (P normal processors).
  Plan plain;
  bool havePlain =
      search.solve(false, false, plain) || search.solve(true, false, plain);
  // Plans with a special processor holding several stages (one device
  // listed by several stages, Plan.h), simulated like any other. Kept only
  // when the simulator finds them strictly faster than the plain plan: the
  // DP's load-balance period ignores the order in which the special
  // processor interleaves its stages.
  Plan special;
  if (search.solve(false, true, special)) {
    if (!havePlain ||
        fasterWithSpecial(original, topology, special, plain, options.sim))
      return madPipeResult(std::move(special), numLayers);
  }
  if (havePlain)
    return madPipeResult(std::move(plain), numLayers);
  return planError(search.failure(processors));
}

} // namespace pipec
