//===- PipeDream.cpp - Hierarchical DP with stage replication, NOAM -------===//
//
// The PipeDream partitioner (pipedream.md §2.3, thesis.md §2.1), with the
// recurrences rebuilt from the prose:
//
//   T^k(i→j, m) = (1/m) · max( A^{k-1}(i→j, m_{k-1}), Sync_k(Σ_{l=i..j}|w_l|,
//   m) ) A^k(i→j, m) = min( T^k(i→j, m),                                 (Case
//   1)
//                      min_{i<=s<j} min_{1<=m'<m}
//                        max( A^k(i→s, m-m'), C_k(s), T^k(s+1→j, m') ) )
//   A^0(i→j)    = Σ_{l=i..j} T_l ;  A^k(i→j, 1) = A^{k-1}(i→j, m_{k-1})
//
// Level k here is topology level k (0 = innermost, e.g. the GPUs of a
// server), the paper's level k+1; a "worker" at level k is a component of
// level k-1 (a device for k = 0). C_k(s) = 2·(latency_k + a_s / B_k) is the
// activation and its gradient over the cut after layer s, a_s the bytes live
// across that cut (every tensor once, as cutBytes with no plan). Sync_k is
// the ring allreduce by default, or the printed 2(m-1)Σ|w|/B_k
// (PipeDreamSync). Times and activations are scaled to the microbatch size.
//
// Two ways to solve it:
//  * the recurrence itself (ReferenceDP), O(Σ_k N³ m_k²) as in the paper,
//    used when every device must be used (A is not monotone in m);
//  * when devices may stay idle (the default), bisection on the bottleneck
//    θ with a feasibility test: "can layers q.. be covered far enough with
//    at most w workers of level k, every T and C <= θ?" is a reach
//    computation over w (O(m_k²) extensions), and an extension of level k
//    asks level k-1 the same question at threshold r·θ, so one probe costs
//    O(Π_k m_k² · log N) with prefix sums and binary searches. The feasible
//    ends form a prefix (shrinking a stage never makes it slower), which is
//    what makes "furthest reach" exact.
//
// Memory: PipeDream's DP has no memory term; the official code bounds each
// stage by its in-flight count. Here a leaf stage with R replicas must hold
// weights × v + gradients + optimizer state + v × stashed activations with
// v = ⌈D/R⌉ (D devices in the topology): an upper bound on the 1F1B
// in-flight count ⌈devices from the stage on / R⌉ that keeps the DP exact.
//
//===----------------------------------------------------------------------===//

#include "PlannerUtil.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

using namespace pipec;
using namespace pipec::planner_util;

namespace {

//===----------------------------------------------------------------------===//
// The model
//===----------------------------------------------------------------------===//

struct PipeDreamModel {
  LayerTable layers;
  TopologyInfo topo;
  PipeDreamSync sync = PipeDreamSync::Ring;
  /// Device memory in bytes; 0 = unlimited.
  double memoryCap = 0;
  /// Bytes per parameter byte besides the weight versions: the gradient and
  /// the optimizer state.
  double weightFactor = 1;

  int numLayers() const { return layers.numLayers; }

  /// Sync_k(W, m): weight synchronisation of a stage holding W parameter
  /// bytes replicated over m components of level k-1.
  double syncSeconds(int k, double weights, int m) const {
    if (m < 2 || weights <= 0)
      return 0;
    if (sync == PipeDreamSync::Paper)
      return 2.0 * (m - 1) * weights / topo.bandwidth[k]; // 2(m-1)Σ|w|/B_k
    return topo.allreduce(weights, m, k); // 2(m-1)/m Σ|w|/B_k + 2(m-1)λ_k
  }

  /// T^k(first→last, m) = (1/m) max(A^{k-1}(first→last), Sync_k).
  double stageSeconds(int k, double inner, int first, int last, int m) const {
    return std::max(inner, syncSeconds(k, layers.weights(first, last), m)) / m;
  }

  /// C_k(s) = 2 (latency_k + a_s / B_k): activations forward, gradients back.
  double cutSeconds(int k, int s) const {
    return 2.0 * topo.p2p(layers.cut[s], k);
  }

  /// v = ⌈D / R⌉, the in-flight bound of a stage with R replicas.
  int inflightBound(int replicas) const {
    return (topo.numDevices + replicas - 1) / replicas;
  }

  /// Weights × v versions + gradient + optimizer state + v × activations.
  double stageMemory(int first, int last, int inflight) const {
    return layers.weights(first, last) * (inflight + weightFactor) +
           inflight * layers.stash(first, last);
  }

  bool fits(int first, int last, int replicas) const {
    return memoryCap <= 0 ||
           stageMemory(first, last, inflightBound(replicas)) <= memoryCap;
  }
};

PipeDreamModel makeModel(const Profile &profile, const Topology &topology,
                         int64_t microbatchSize, const SimOptions &sim,
                         PipeDreamSync sync) {
  PipeDreamModel model;
  model.layers = buildLayerTable(profile, static_cast<double>(microbatchSize) /
                                              profile.microbatch);
  model.topo = topologyInfo(topology);
  model.sync = sync;
  model.memoryCap = static_cast<double>(topology.deviceMemoryBytes);
  model.weightFactor = 1 + std::max(0.0, sim.optimizerStateFactor);
  return model;
}

//===----------------------------------------------------------------------===//
// Hierarchical plans
//===----------------------------------------------------------------------===//

/// A stage of a level-k pipeline: layers first..last replicated over
/// `replicas` components of level k-1, each running `inner` (a level-(k-1)
/// pipeline over the same layers; empty at level 0).
struct TreeStage {
  int first = 0;
  int last = 0;
  int replicas = 1;
  std::vector<TreeStage> inner;
};
using Pipeline = std::vector<TreeStage>;

bool sameShape(const Pipeline &a, const Pipeline &b) {
  if (a.size() != b.size())
    return false;
  for (size_t t = 0; t < a.size(); ++t)
    if (a[t].first != b[t].first || a[t].last != b[t].last ||
        a[t].replicas != b[t].replicas || !sameShape(a[t].inner, b[t].inner))
      return false;
  return true;
}

/// The model's value of a level-k pipeline whose leaf stages have
/// `outerReplicas` times their own replication (for the memory rule).
double evaluate(const PipeDreamModel &model, const Pipeline &pipeline, int k,
                int outerReplicas) {
  double value = 0;
  for (size_t t = 0; t < pipeline.size(); ++t) {
    const TreeStage &stage = pipeline[t];
    int replicas = outerReplicas * stage.replicas;
    double inner;
    if (k == 0) {
      if (!model.fits(stage.first, stage.last, replicas))
        return kInf;
      inner = model.layers.time(stage.first, stage.last); // A^0 = Σ T_l
    } else {
      inner = evaluate(model, stage.inner, k - 1, replicas);
    }
    value = std::max(value, model.stageSeconds(k, inner, stage.first,
                                               stage.last, stage.replicas));
    if (t + 1 < pipeline.size())
      value = std::max(value, model.cutSeconds(k, stage.last));
  }
  return value;
}

/// Flat stages of a level-k pipeline run by the level-k components whose
/// first devices are `bases`.
void flatten(const TopologyInfo &topo, const Pipeline &pipeline, int k,
             const std::vector<int> &bases, std::vector<StagePlan> &out) {
  int below = topo.devicesBelow(k);
  int next = 0;
  for (const TreeStage &stage : pipeline) {
    std::vector<int> subBases;
    for (int base : bases)
      for (int c = 0; c < stage.replicas; ++c)
        subBases.push_back(base + (next + c) * below);
    next += stage.replicas;
    if (k == 0) {
      StagePlan flat;
      flat.firstLayer = stage.first;
      flat.lastLayer = stage.last;
      flat.devices = subBases;
      std::sort(flat.devices.begin(), flat.devices.end());
      flat.replicas = static_cast<int>(flat.devices.size());
      out.push_back(std::move(flat));
    } else {
      flatten(topo, stage.inner, k - 1, subBases, out);
    }
  }
}

/// Rebuilds the level-k pipeline of flat stages [begin, end) whose devices
/// all lie in the level-k component starting at device `base`.
bool unflatten(const TopologyInfo &topo, const std::vector<StagePlan> &stages,
               int begin, int end, int k, int base, Pipeline &out,
               std::string &error) {
  int below = topo.devicesBelow(k);
  auto subOf = [&](int device) { return (device - base) / below; };
  std::set<int> taken;
  int t = begin;
  while (t < end) {
    std::set<int> subs;
    for (int device : stages[t].devices)
      subs.insert(subOf(device));
    int groupEnd = t + 1;
    while (groupEnd < end) {
      std::set<int> next;
      for (int device : stages[groupEnd].devices)
        next.insert(subOf(device));
      if (next != subs)
        break;
      ++groupEnd;
    }
    for (int sub : subs)
      if (!taken.insert(sub).second) {
        error = "stages share a level-" + std::to_string(k - 1) +
                " component with an earlier stage that is not their "
                "neighbour (not a hierarchical plan)";
        return false;
      }
    TreeStage stage;
    stage.first = stages[t].firstLayer;
    stage.last = stages[groupEnd - 1].lastLayer;
    stage.replicas = static_cast<int>(subs.size());
    if (k == 0) {
      if (groupEnd - t > 1) {
        error = "stages " + std::to_string(t) + " and " +
                std::to_string(t + 1) + " run on the same devices";
        return false;
      }
    } else {
      bool firstSub = true;
      for (int sub : subs) {
        int subBase = base + sub * below;
        std::vector<StagePlan> local;
        for (int u = t; u < groupEnd; ++u) {
          StagePlan part = stages[u];
          part.devices.clear();
          for (int device : stages[u].devices)
            if (subOf(device) == sub)
              part.devices.push_back(device);
          part.replicas = static_cast<int>(part.devices.size());
          if (part.devices.empty()) {
            error = "stage " + std::to_string(u) +
                    " is missing from a "
                    "replica of its level-" +
                    std::to_string(k) + " stage (not a hierarchical plan)";
            return false;
          }
          local.push_back(std::move(part));
        }
        Pipeline inner;
        if (!unflatten(topo, local, 0, static_cast<int>(local.size()), k - 1,
                       subBase, inner, error))
          return false;
        if (firstSub) {
          stage.inner = std::move(inner);
          firstSub = false;
        } else if (!sameShape(inner, stage.inner)) {
          error = "the replicas of a level-" + std::to_string(k) +
                  " stage run different sub-pipelines (not a hierarchical "
                  "plan: PipeDream replicates whole components)";
          return false;
        }
      }
    }
    out.push_back(std::move(stage));
    t = groupEnd;
  }
  return true;
}

//===----------------------------------------------------------------------===//
// Threshold search (devices may stay idle)
//===----------------------------------------------------------------------===//

class ThresholdSearch {
public:
  explicit ThresholdSearch(const PipeDreamModel &model)
      : model(model), n(model.numLayers()), cutMin(model.layers.cut) {}

  /// Is there a plan of all layers with every T^k and C_k <= theta?
  bool feasible(double theta) {
    int top = model.topo.numLevels - 1;
    return reachEnd(top, 0, theta, 1, nullptr, n - 1) >= n - 1;
  }

  /// A plan of all layers with every term <= theta (theta feasible).
  Pipeline reconstruct(double theta) {
    int top = model.topo.numLevels - 1;
    return build(top, 0, n - 1, theta, 1);
  }

private:
  struct Choice {
    int replicas = 0; ///< r of the last stage
    int previous = 0; ///< workers of the prefix before it
    int cut = -1;     ///< the stage starts after layer `cut`
  };

  /// Largest p in [lo, hi] (hi <= n-2) with C_k(p) <= theta, or lo - 1.
  int lastGoodCut(int k, int lo, int hi, double theta) const {
    hi = std::min(hi, n - 2);
    if (lo > hi)
      return lo - 1;
    // C_k(p) <= θ ⇔ a_p = 0 or a_p <= (θ/2 - latency_k)·B_k.
    double limit =
        (theta / 2 - model.topo.latency[k]) * model.topo.bandwidth[k];
    if (!(limit > 0))
      limit = 0;
    int p = cutMin.lastAtMost(lo, hi, limit);
    // The closed form can differ from the model by an ulp; the model rules.
    while (p >= lo && model.cutSeconds(k, p) > theta)
      p = cutMin.lastAtMost(lo, p - 1, limit);
    return p;
  }

  /// Largest j >= start with prefix[j+1] - prefix[start] <= budget (prefix
  /// nondecreasing), start - 1 when none. A fast bound: the callers check
  /// the model's own expression at the answer.
  int lastWithin(const std::vector<double> &prefix, int start,
                 double budget) const {
    if (!(budget >= 0))
      return start - 1;
    double limit = prefix[start] + budget;
    auto first = prefix.begin() + start + 1, last = prefix.begin() + n + 1;
    return static_cast<int>(std::upper_bound(first, last, limit) -
                            prefix.begin()) -
           2;
  }

  /// The largest Σ|w| whose Sync_k over r replicas is <= r·theta.
  double syncWeightLimit(int k, int r, double theta) const {
    if (r < 2)
      return kInf;
    double budget = r * theta, bandwidth = model.topo.bandwidth[k];
    double limit;
    if (model.sync == PipeDreamSync::Paper)
      limit = budget * bandwidth / (2.0 * (r - 1)); // 2(r-1)W/B <= rθ
    else // 2(r-1)/r W/B + 2(r-1)λ <= rθ
      limit = (budget - 2.0 * (r - 1) * model.topo.latency[k]) * r * bandwidth /
              (2.0 * (r - 1));
    return std::max(limit, 0.0);
  }

  /// Largest j with T^k(start→j, r) <= theta (every leaf within memory),
  /// start - 1 when none.
  int extend(int k, int start, int r, double theta, int outerReplicas) {
    int end = lastWithin(model.layers.params, start,
                         syncWeightLimit(k, r, theta) * (1 + 1e-12));
    if (end < start)
      return start - 1;
    if (k == 0) {
      int replicas = outerReplicas * r;
      end = std::min(
          end, lastWithin(model.layers.total, start, r * theta * (1 + 1e-12)));
      if (model.memoryCap > 0 && end >= start) {
        int inflight = model.inflightBound(replicas);
        end = lastTrue(start, end, [&](int j) {
          return model.stageMemory(start, j, inflight) <= model.memoryCap;
        });
      }
      // The model's expression rules (the bounds above may be an ulp off).
      while (end >= start &&
             !(model.stageSeconds(0, model.layers.time(start, end), start, end,
                                  r) <= theta &&
               model.fits(start, end, replicas)))
        --end;
      return end;
    }
    int innerEnd =
        reachEnd(k - 1, start, r * theta, outerReplicas * r, nullptr, end);
    end = std::min(end, innerEnd);
    while (end >= start &&
           !(model.syncSeconds(k, model.layers.weights(start, end), r) / r <=
             theta))
      --end;
    return end;
  }

  /// Furthest j such that layers q..j fit in a level-k pipeline of at most
  /// m_k workers with every term <= theta; q - 1 when none. Without
  /// `choices`, stops as soon as `stopAt` is reached. With `choices`,
  /// records reach[w] and how it was reached.
  int reachEnd(int k, int q, double theta, int outerReplicas,
               std::vector<std::pair<int, Choice>> *choices, int stopAt) {
    int m = model.topo.count[k];
    std::vector<int> reach(m + 1, q - 1);
    std::vector<Choice> how(m + 1);
    // Lower bound on any level-(k-1) bottleneck of layers s..j:
    // Σ T_l / (devices of a level-(k-1) component).
    double perComponent = model.topo.devicesBelow(k);
    for (int w = 1; w <= m; ++w) {
      int best = reach[w - 1];
      Choice bestHow = how[w - 1];
      if (best >= stopAt && !choices)
        return best;
      if (best >= n - 1) {
        reach[w] = best;
        how[w] = bestHow;
        continue;
      }
      for (int r = w; r >= 1; --r) {
        int previous = w - r;
        int cut;
        if (previous == 0) {
          cut = q - 1;
        } else {
          if (reach[previous] < q)
            continue;
          cut = lastGoodCut(k, q, reach[previous], theta);
          if (cut < q)
            continue;
        }
        int start = cut + 1;
        if (start > n - 1)
          continue;
        if (k > 0) {
          // Upper bounds: all devices busy, and the weight sync.
          int bound = lastWithin(model.layers.total, start,
                                 r * theta * perComponent * (1 + 1e-9));
          if (bound <= best)
            continue;
          bound = std::min(
              bound, lastWithin(model.layers.params, start,
                                syncWeightLimit(k, r, theta) * (1 + 1e-9)));
          if (bound <= best)
            continue;
        }
        int end = extend(k, start, r, theta, outerReplicas);
        if (end > best) {
          best = end;
          bestHow = {r, previous, cut};
        }
      }
      reach[w] = best;
      how[w] = bestHow;
    }
    if (choices) {
      choices->clear();
      for (int w = 0; w <= m; ++w)
        choices->push_back({reach[w], how[w]});
    }
    return reach[m];
  }

  /// A level-k pipeline over exactly q..j with every term <= theta.
  Pipeline build(int k, int q, int j, double theta, int outerReplicas) {
    std::vector<std::pair<int, Choice>> choices;
    reachEnd(k, q, theta, outerReplicas, &choices, n - 1);
    Pipeline stages;
    int end = j;
    int limit = static_cast<int>(choices.size()) - 1;
    while (true) {
      int w = 1;
      while (w <= limit && choices[w].first < end)
        ++w;
      if (w > limit)
        break; // cannot happen when j <= reach
      const Choice &how = choices[w].second;
      TreeStage stage;
      stage.first = how.cut + 1;
      stage.last = end;
      stage.replicas = how.replicas;
      if (k > 0)
        stage.inner = build(k - 1, stage.first, end, how.replicas * theta,
                            outerReplicas * how.replicas);
      stages.push_back(std::move(stage));
      if (how.previous == 0)
        break;
      end = how.cut;
      limit = how.previous;
    }
    std::reverse(stages.begin(), stages.end());
    return stages;
  }

  const PipeDreamModel &model;
  int n;
  RangeMin cutMin;
};

//===----------------------------------------------------------------------===//
// The printed recurrence (reference; every device used or not)
//===----------------------------------------------------------------------===//

class ReferenceDP {
public:
  ReferenceDP(const PipeDreamModel &model, bool exact)
      : model(model), n(model.numLayers()), exact(exact) {}

  /// Estimated inner-loop steps, for refusing hopeless sizes.
  double cost() const {
    double steps = 0, variants = 1;
    int top = model.topo.numLevels - 1;
    for (int k = top; k >= 0; --k) {
      double m = model.topo.count[k];
      double layers = n;
      double perLevel = k == top ? layers * layers / 2 * m * m / 2
                                 : layers * layers * layers / 6 * m * m / 2;
      steps += perLevel * variants;
      if (model.memoryCap > 0)
        variants *= m;
    }
    // Choices are packed in 32 bits: s < 2^15.
    if (n >= (1 << 15))
      steps = kInf;
    return steps;
  }

  /// A^L(0→N-1): with every device used (exact) or the best over at most
  /// m_L top-level workers.
  double solve(Pipeline &plan) {
    int top = model.topo.numLevels - 1;
    const Level &level = table(top, 1);
    double best = kInf;
    int bestM = 0;
    int m = model.topo.count[top];
    for (int w = exact ? m : 1; w <= m; ++w) {
      double value = level.top[(n - 1) * (m + 1) + w];
      if (value < best) {
        best = value;
        bestM = w;
      }
    }
    if (bestM > 0)
      plan = build(top, 1, 0, n - 1, bestM);
    return best;
  }

private:
  /// One level for one outer replication: the argmin of every A^k(i→j, m)
  /// (all i at inner levels, i = 0 at the top), the inner value
  /// Inner_k(i, j) the level above uses, and at the top A^k(0→j, m).
  struct Level {
    int width = 1;             ///< m_k + 1
    std::vector<int> choice;   ///< (i, j, m): s << 16 | m', or -1 (Case 1)
    std::vector<double> inner; ///< (i, j): exact A(i→j, m_k), or min_m
    std::vector<int> innerM;   ///< (i, j): the m achieving `inner`
    std::vector<double> top;   ///< (j, m) for i = 0, at the top level
  };

  /// Inner_{k}(i, j) for leaf replication `replicas`: Σ T_l at level -1.
  double innerValue(int k, int replicas, int i, int j) {
    if (k < 0)
      return model.fits(i, j, replicas) ? model.layers.time(i, j) : kInf;
    return table(k, replicas).inner[static_cast<size_t>(i) * n + j];
  }

  /// T^k(i→j, m) with outer replication `outer`.
  double stageValue(int k, int outer, int i, int j, int m) {
    int key = model.memoryCap > 0 ? outer * m : 1;
    return model.stageSeconds(k, innerValue(k - 1, key, i, j), i, j, m);
  }

  const Level &table(int k, int outer) {
    auto key = std::make_pair(k, outer);
    auto found = tables.find(key);
    if (found != tables.end())
      return found->second;
    int top = model.topo.numLevels - 1;
    int m = model.topo.count[k];
    int rows = k == top ? 1 : n;
    Level level;
    level.width = m + 1;
    level.choice.assign(static_cast<size_t>(rows) * n * level.width, -1);
    if (k != top) {
      level.inner.assign(static_cast<size_t>(n) * n, kInf);
      level.innerM.assign(static_cast<size_t>(n) * n, 0);
    }
    // A^k(i→j, w) for the current i, indexed (j, w).
    std::vector<double> value(static_cast<size_t>(n) * level.width, kInf);
    for (int i = 0; i < rows; ++i) {
      std::fill(value.begin(), value.end(), kInf);
      for (int j = i; j < n; ++j) {
        for (int w = 1; w <= m; ++w) {
          // Case 1: one stage replicated w times (A^k(i→j,1) = A^{k-1}).
          double best = stageValue(k, outer, i, j, w);
          int choice = -1;
          for (int s = i; s < j; ++s) {
            double cut = model.cutSeconds(k, s); // 2 a_s / B_k
            if (cut >= best)
              continue;
            for (int mp = 1; mp < w; ++mp) {
              double left =
                  value[static_cast<size_t>(s) * level.width + w - mp];
              if (left >= best)
                continue;
              double right = stageValue(k, outer, s + 1, j, mp);
              double candidate = std::max(std::max(left, cut), right);
              if (candidate < best) {
                best = candidate;
                choice = (s << 16) | mp;
              }
            }
          }
          value[static_cast<size_t>(j) * level.width + w] = best;
          level.choice[(static_cast<size_t>(i) * n + j) * level.width + w] =
              choice;
        }
        if (k == top)
          continue;
        size_t ij = static_cast<size_t>(i) * n + j;
        for (int w = exact ? m : 1; w <= m; ++w) {
          double candidate = value[static_cast<size_t>(j) * level.width + w];
          if (candidate < level.inner[ij] || level.innerM[ij] == 0) {
            level.inner[ij] = candidate;
            level.innerM[ij] = w;
          }
        }
      }
      if (k == top)
        level.top = value;
    }
    return tables.emplace(key, std::move(level)).first->second;
  }

  Pipeline build(int k, int outer, int i, int j, int m) {
    int top = model.topo.numLevels - 1;
    const Level &level = table(k, outer);
    int row = k == top ? 0 : i;
    int choice =
        level.choice[(static_cast<size_t>(row) * n + j) * level.width + m];
    Pipeline stages;
    int stageFirst = i, stageReplicas = m;
    if (choice >= 0) {
      int s = choice >> 16, mp = choice & 0xffff;
      stages = build(k, outer, i, s, m - mp);
      stageFirst = s + 1;
      stageReplicas = mp;
    }
    TreeStage stage;
    stage.first = stageFirst;
    stage.last = j;
    stage.replicas = stageReplicas;
    if (k > 0) {
      int key = model.memoryCap > 0 ? outer * stageReplicas : 1;
      const Level &inner = table(k - 1, key);
      int innerM = inner.innerM[static_cast<size_t>(stageFirst) * n + j];
      stage.inner = build(k - 1, key, stageFirst, j, innerM);
    }
    stages.push_back(std::move(stage));
    return stages;
  }

  const PipeDreamModel &model;
  int n;
  bool exact;
  std::map<std::pair<int, int>, Level> tables;
};

//===----------------------------------------------------------------------===//
// Memory: the least device memory any plan needs
//===----------------------------------------------------------------------===//

/// Smallest device memory for which some plan (devices may stay idle)
/// satisfies the memory rule; bisection over bytes at θ = ∞.
double minimumMemory(PipeDreamModel model) {
  double hi =
      model.stageMemory(0, model.numLayers() - 1, model.inflightBound(1));
  double lo = 0;
  model.memoryCap = hi;
  {
    ThresholdSearch search(model);
    if (!search.feasible(kInf))
      return hi;
  }
  for (int iteration = 0; iteration < 64 && hi - lo > std::max(1.0, hi * 1e-6);
       ++iteration) {
    double mid = (lo + hi) / 2;
    model.memoryCap = mid;
    ThresholdSearch search(model);
    if (search.feasible(kInf))
      hi = mid;
    else
      lo = mid;
  }
  // The exact need of the plan found at the bound.
  model.memoryCap = hi;
  ThresholdSearch search(model);
  std::vector<StagePlan> stages;
  flatten(model.topo, search.reconstruct(kInf), model.topo.numLevels - 1, {0},
          stages);
  double need = 0;
  for (const StagePlan &stage : stages)
    need =
        std::max(need, model.stageMemory(stage.firstLayer, stage.lastLayer,
                                         model.inflightBound(stage.replicas)));
  return need;
}

/// Per stage replica memory with the 1F1B in-flight count of a flat plan.
std::vector<int64_t> stageMemories(const PipeDreamModel &model,
                                   const std::vector<StagePlan> &stages) {
  std::vector<int64_t> memory;
  int devicesAfter = 0;
  for (const StagePlan &stage : stages)
    devicesAfter += stage.replicas;
  for (const StagePlan &stage : stages) {
    int inflight = (devicesAfter + stage.replicas - 1) / stage.replicas;
    memory.push_back(static_cast<int64_t>(std::llround(
        model.stageMemory(stage.firstLayer, stage.lastLayer, inflight))));
    devicesAfter -= stage.replicas;
  }
  return memory;
}

int devicesUsed(const std::vector<StagePlan> &stages) {
  int used = 0;
  for (const StagePlan &stage : stages)
    used += stage.replicas;
  return used;
}

} // namespace

//===----------------------------------------------------------------------===//
// Public entry points
//===----------------------------------------------------------------------===//

int pipec::pipeDreamNoam(int workers, int inputStageReplicas) {
  if (inputStageReplicas < 1)
    return 1;
  return std::max(1, (workers + inputStageReplicas - 1) / inputStageReplicas);
}

PipeDreamScore pipec::scorePipeDream(const Profile &profile,
                                     const Topology &topology, const Plan &plan,
                                     const SimOptions &sim,
                                     const PipeDreamOptions &options) {
  PipeDreamScore score;
  if (std::string bad = checkInputs(profile, topology); !bad.empty()) {
    score.error = bad;
    return score;
  }
  int n = static_cast<int>(profile.ops.size());
  if (std::string bad = validatePlan(plan, n); !bad.empty()) {
    score.error = bad;
    return score;
  }
  PipeDreamModel model =
      makeModel(profile, topology, plan.microbatchSize, sim, options.sync);
  std::set<int> seen;
  for (int s = 0; s < plan.numStages(); ++s) {
    const StagePlan &stage = plan.stages[s];
    if (static_cast<int>(stage.devices.size()) != stage.replicas) {
      score.error = "stage " + std::to_string(s) +
                    " has no device list (PipeDream's model needs devices)";
      return score;
    }
    for (int device : stage.devices) {
      if (device < 0 || device >= model.topo.numDevices) {
        score.error = "stage " + std::to_string(s) + " uses device " +
                      std::to_string(device) + ", outside the topology's " +
                      std::to_string(model.topo.numDevices) + " devices";
        return score;
      }
      if (!seen.insert(device).second) {
        score.error =
            "device " + std::to_string(device) + " runs more than one stage";
        return score;
      }
    }
  }
  Pipeline tree;
  int top = model.topo.numLevels - 1;
  if (!unflatten(model.topo, plan.stages, 0, plan.numStages(), top, 0, tree,
                 score.error))
    return score;
  score.ok = true;
  score.bottleneckSeconds = evaluate(model, tree, top, 1);
  score.fitsMemory = std::isfinite(score.bottleneckSeconds);
  score.noam =
      pipeDreamNoam(devicesUsed(plan.stages), plan.stages.front().replicas);
  score.stageMemoryBytes = stageMemories(model, plan.stages);
  return score;
}

PlanResult pipec::planPipeDream(const Profile &profile,
                                const Topology &topology,
                                const PlannerOptions &options,
                                const PipeDreamOptions &pdOptions) {
  if (std::string bad = checkInputs(profile, topology); !bad.empty())
    return planError("pipedream: " + bad);
  int n = static_cast<int>(profile.ops.size());
  if (options.stages > n)
    return planError("pipedream: cannot split " + std::to_string(n) +
                     " layers into " + std::to_string(options.stages) +
                     " stages");
  if (options.stages > 0)
    return planError("pipedream chooses the pipeline depth itself; a fixed "
                     "number of stages is not supported (use dapple or "
                     "balanced)");
  std::string error;
  int64_t microbatchSize = resolveMicrobatchSize(profile, options, error);
  if (!error.empty())
    return planError("pipedream: " + error);

  PipeDreamModel model =
      makeModel(profile, topology, microbatchSize, options.sim, pdOptions.sync);
  int top = model.topo.numLevels - 1;
  Pipeline best;
  double bestValue = kInf;

  if (!options.allowFewerDevices || pdOptions.referenceDP) {
    ReferenceDP dp(model, !options.allowFewerDevices);
    if (dp.cost() > 4e9)
      return planError(
          "pipedream: the recurrence with every device in use costs about " +
          std::to_string(static_cast<long long>(dp.cost())) + " steps for " +
          std::to_string(n) +
          " layers on this topology (the "
          "limit is 4e9); allow fewer devices, which uses the fast search");
    bestValue = dp.solve(best);
  } else {
    ThresholdSearch search(model);
    if (search.feasible(kInf)) {
      // θ = ∞ admits any plan within memory: start from it and bisect.
      best = search.reconstruct(kInf);
      bestValue = evaluate(model, best, top, 1);
      // Any plan's bottleneck is at least Σ T_l / D (mediant inequality).
      double lo = model.layers.time(0, n - 1) / model.topo.numDevices;
      lo *= 1 - 1e-12;
      double hi = bestValue;
      for (int probe = 0; probe < 200 && hi - lo > 1e-10 * hi; ++probe) {
        double mid =
            (lo > 0 && hi > 4 * lo) ? std::sqrt(lo * hi) : lo + (hi - lo) / 2;
        if (search.feasible(mid)) {
          Pipeline plan = search.reconstruct(mid);
          double value = evaluate(model, plan, top, 1);
          if (value < bestValue) {
            bestValue = value;
            best = std::move(plan);
          }
          hi = std::min(mid, value);
        } else {
          lo = mid;
        }
      }
    }
  }

  if (!std::isfinite(bestValue)) {
    if (model.memoryCap > 0) {
      double need = minimumMemory(model);
      return planError(
          "pipedream: no plan fits in " + formatBytes(model.memoryCap) +
          " of device memory: the best plan needs " + formatBytes(need) +
          " per device (weights x in-flight versions, gradients, optimizer "
          "state and stashed activations of its largest stage)" +
          (options.allowFewerDevices ? ""
                                     : " when some devices may stay idle"));
    }
    return planError("pipedream: found no plan");
  }

  Plan plan;
  plan.algorithm = "pipedream";
  plan.schedule = options.schedule.empty() ? "1f1b" : options.schedule;
  plan.microbatchSize = microbatchSize;
  flatten(model.topo, best, top, {0}, plan.stages);
  int used = devicesUsed(plan.stages);
  int noam = pipeDreamNoam(used, plan.stages.front().replicas);
  plan.microbatches = options.microbatches > 0 ? options.microbatches : noam;
  plan.predicted.iterationSeconds = plan.microbatches * bestValue;
  plan.predicted.samplesPerSecond =
      bestValue > 0 ? static_cast<double>(microbatchSize) / bestValue : 0;
  double busy = model.layers.time(0, n - 1);
  plan.predicted.bubbleFraction =
      bestValue > 0 ? std::max(0.0, 1 - busy / (used * bestValue)) : 0;
  plan.predicted.stageMemoryBytes = stageMemories(model, plan.stages);
  if (std::string bad = validatePlan(plan, n); !bad.empty())
    return planError("pipedream: internal error: " + bad);
  PlanResult result;
  result.ok = true;
  result.plan = std::move(plan);
  return result;
}

PlanResult pipec::planPipeDream(const Profile &profile,
                                const Topology &topology,
                                const PlannerOptions &options) {
  return planPipeDream(profile, topology, options, PipeDreamOptions());
}
