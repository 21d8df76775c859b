//===- TwoBW.cpp - The PipeDream-2BW planner ------------------------------===//
//
// The planner of PipeDream-2BW (papers/thesis.md §3.5, Algorithm 1): d
// parallel pipelines of depth p (equi-replicated stages), a per-GPU
// microbatch size b and a recompute flag r, costed with the closed-form
// throughput model of §3.5 and the memory model of §3.4; the loop bound
// "p = 1 to N/w" is read as N/d (the thesis's misprint).
//
// Conventions:
// - The profile was measured at b0 = profile.microbatch; at microbatch b,
//   times and activation sizes scale linearly by b/b0 (scaleProfile), the
//   parameters do not.
// - A pipeline's stages are a min-max balanced contiguous split of the
//   layers (the thesis's B/p equal transformer blocks, generalised).
// - Stage i's d replicas sit on devices i·d .. i·d+d-1 (replicas of a stage
//   and their all-reduce on one server, §3.3); pipeline j is devices
//   {i·d + j}.
// - m = p·g microbatches per pipeline and batch (g >= 1, so m >= p); the
//   global batch b·d·m never exceeds the requested one. Plan::microbatches
//   and PlannerOptions::microbatches count all d·m microbatches of an
//   iteration (the simulator's convention).
// - c_extra is measured: recomputation adds one forward, so c_extra·T^comp =
//   T^comp + T^fwd (4/3 when t_b = 2 t_f).
// - MEMORY is the §3.4 formula per stage (largest stage) plus the two
//   terms the formula leaves out and the simulator counts: one gradient
//   accumulator |W|/p and the optimizer state (SimOptions::
//   optimizerStateFactor · |W|/p).
//
//===----------------------------------------------------------------------===//

#include "pipec/Planners.h"

#include "PlannerUtil.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

namespace pipec {

double twoBWStageMemory(double weights, double activations, double inputs,
                        int depth, bool recompute) {
  // No recompute: 2|W|/p + p·|A_total(b)|/p + p·|A_input(b)|
  // Recompute:    2|W|/p +   |A_total(b)|/p + p·|A_input(b)|
  double versions = recompute ? 1.0 : depth;
  return 2 * weights + versions * activations + depth * inputs;
}

double gpipeStageMemory(double weights, double activations, double inputs,
                        int microbatches) {
  // |W|/p + |A_total(b)|/p + m·|A_input(b)|
  return weights + activations + microbatches * inputs;
}

namespace {

/// A stage of a depth-p split at the profile's microbatch b0.
struct StageCost {
  int first = 0;
  double compute = 0;     ///< T_i^comp(b0) = Σ fwd + bwd
  double forward = 0;     ///< Σ fwd (the recomputation)
  double weights = 0;     ///< |W|/p of this stage
  double activations = 0; ///< |A_total(b0)|/p: Σ saved bytes
  double input = 0;       ///< |A_input(b0)|: bytes live across the cut before
  double output = 0;      ///< bytes live across the cut after
};

std::vector<StageCost> splitStages(const Profile &profile,
                                   const std::vector<int64_t> &cuts,
                                   int depth) {
  const int numLayers = static_cast<int>(profile.ops.size());
  std::vector<double> loads(numLayers);
  for (int l = 0; l < numLayers; ++l)
    loads[l] = profile.ops[l].fwdSeconds + profile.ops[l].bwdSeconds;
  std::vector<int> starts = planner_util::splitChainMinMax(loads, depth);
  std::vector<StageCost> stages(depth);
  for (int i = 0; i < depth; ++i) {
    StageCost &s = stages[i];
    s.first = starts[i];
    int last = i + 1 < depth ? starts[i + 1] - 1 : numLayers - 1;
    for (int l = s.first; l <= last; ++l) {
      const ProfileOp &op = profile.ops[l];
      s.compute += op.fwdSeconds + op.bwdSeconds;
      s.forward += op.fwdSeconds;
      s.weights += static_cast<double>(op.paramBytes);
      s.activations += static_cast<double>(op.savedBytes);
    }
    s.input = s.first > 0 ? static_cast<double>(cuts[s.first - 1]) : 0;
    s.output = i + 1 < depth ? static_cast<double>(cuts[last]) : 0;
  }
  return stages;
}

/// The slowest p2p link from stage i to stage i+1 across the d pipelines
/// (devices i·d + j -> (i+1)·d + j), checking one pair per distinct level.
planner_util::Line boundaryLink(const Topology &topology, int width, int stage) {
  planner_util::Line worst;
  std::set<int> levels;
  for (int j = 0; j < width; ++j) {
    int a = stage * width + j, b = (stage + 1) * width + j;
    if (!levels.insert(topology.levelBetween(a, b)).second)
      continue;
    planner_util::Line line = planner_util::lineOf(
        [&](int64_t bytes) { return topology.p2pSeconds(bytes, a, b); });
    worst.latency = std::max(worst.latency, line.latency);
    worst.perByte = std::max(worst.perByte, line.perByte);
  }
  return worst;
}

/// Why searchTwoBW cannot search (the profile, an empty topology, negative
/// or impossible options); empty when it can.
std::string twoBWRequestError(const Profile &profile, const Topology &topology,
                              const PlannerOptions &options) {
  if (std::string bad = profilePlanningError(profile); !bad.empty())
    return "twobw: " + bad;
  const int numDevices = topology.numDevices();
  const int numLayers = static_cast<int>(profile.ops.size());
  if (numDevices < 1)
    return "twobw: the topology has no devices";
  if (options.stages < 0 || options.microbatches < 0 ||
      options.globalBatch < 0 || options.microbatchSize < 0)
    return "twobw: stages, microbatches, global batch and microbatch "
           "size must not be negative";
  if (options.stages > numLayers)
    return "twobw: cannot split " + std::to_string(numLayers) +
           " layers into " + std::to_string(options.stages) + " stages";
  if (options.stages > numDevices)
    return "twobw: " + std::to_string(options.stages) +
           " stages need more than the topology's " +
           std::to_string(numDevices) + " devices";
  return "";
}

/// The microbatch sizes b to try, largest first.
std::vector<int64_t> microbatchSizes(const PlannerOptions &options,
                                     int64_t b0) {
  const int64_t batch = options.globalBatch; // B, the maximum safe batch
  // Microbatch sizes b: the requested one, else powers of two up to B (or
  // up to the profiled b0 without a batch bound) and b0; largest first, so
  // that ties go to the larger b (the thesis's "largest b that fits").
  std::vector<int64_t> sizes;
  if (options.microbatchSize > 0) {
    sizes.push_back(options.microbatchSize);
  } else {
    int64_t maxSize = batch > 0 ? batch : b0;
    std::set<int64_t> set = {std::min(b0, maxSize)};
    for (int64_t b = 1; b <= maxSize; b *= 2)
      set.insert(b);
    sizes.assign(set.rbegin(), set.rend());
  }
  return sizes;
}

/// Per stage i of d parallel pipelines: the link to stage i+1 and the ring
/// all-reduce among its d replicas.
struct WidthLines {
  std::vector<planner_util::Line> links, rings;
};

/// The lines of stages 0..maxDepth-1 for width d.
WidthLines widthLines(const Topology &topology, int d, int maxDepth) {
  // Stage i's links to stage i+1 and the gradient all-reduce T_i^comm
  // among its d replicas (devices i·d .. i·d+d-1) depend on d and i only.
  WidthLines lines;
  lines.links.resize(std::max(maxDepth - 1, 0));
  lines.rings.resize(maxDepth);
  for (int i = 0; i < maxDepth; ++i) {
    if (i + 1 < maxDepth)
      lines.links[i] = boundaryLink(topology, d, i);
    if (d > 1) {
      std::vector<int> replicas(d);
      for (int j = 0; j < d; ++j)
        replicas[j] = i * d + j;
      lines.rings[i] = planner_util::lineOf([&](int64_t bytes) {
        return topology.allreduceSeconds(bytes, replicas);
      });
    }
  }
  return lines;
}

/// t, the seconds per microbatch, and MEMORY(d, p, b, r), the largest
/// stage, of configuration c (its depth, microbatches and recompute flag)
/// at scale f = b/b0; with `fill`, also c's per-stage vectors.
void stageCosts(TwoBWConfig &c, const std::vector<StageCost> &stages,
                const std::vector<planner_util::Line> &links,
                const std::vector<double> &allreduce, double f,
                double optimizer, bool fill, double &t, double &memory) {
  const int p = c.depth, m = c.microbatches;
  const bool r = c.recompute;
  t = 0;
  memory = 0;
  for (int i = 0; i < p; ++i) {
    const StageCost &s = stages[i];
    // c_extra·T_i^comp(b)
    double compute = f * (s.compute + (r ? s.forward : 0));
    // Σ_j T_{j→i}^comm = 2|A(b)|·I(p>1)/bwdth for both neighbours
    double comm = 0;
    if (i > 0)
      comm += 2 * links[i - 1].at(f * s.input);
    if (i + 1 < p)
      comm += 2 * links[i].at(f * s.output);
    // max(c_extra·T^comp + Σ T^comm_{j→i}, T_i^comm / m(b,d))
    t = std::max(t, std::max(compute + comm, allreduce[i] / m));
    // MEMORY(d, p, b, r): the §3.4 formula plus what it leaves
    // out, the gradient accumulator and the optimizer state.
    double mem =
        twoBWStageMemory(s.weights, f * s.activations, f * s.input, p, r) +
        (1 + optimizer) * s.weights;
    memory = std::max(memory, mem);
    if (fill) {
      c.stageFirst.push_back(s.first);
      c.stageMemoryBytes.push_back(mem);
      c.stageComputeSeconds.push_back(compute);
    }
  }
}

/// Algorithm 1 over (d, p): SEARCH(d, p, B) for each, the best that fits
/// overall, and the configuration needing the least memory.
class TwoBWSearch {
public:
  TwoBWSearch(const Profile &profile, const Topology &topology,
              const PlannerOptions &options, const std::vector<bool> &recompute)
      : profile(profile), topology(topology), options(options),
        b0(std::max<int64_t>(profile.microbatch, 1)),
        batch(options.globalBatch), sizes(microbatchSizes(options, b0)),
        flags(recompute.empty() ? std::vector<bool>{false} : recompute),
        memoryLimit(static_cast<double>(topology.deviceMemoryBytes)),
        optimizer(options.sim.optimizerStateFactor),
        cuts(cutBytesPerCut(profile)) {}

  /// SEARCH(d, p, B) for d = 1..N, p = 1..N/d; appends the best (b, r) of
  /// every (d, p) to `configs` without its per-stage vectors.
  void run(std::vector<TwoBWConfig> &configs) {
    const int numDevices = topology.numDevices();
    const int numLayers = static_cast<int>(profile.ops.size());
    for (int d = 1; d <= numDevices; ++d) {
      const int maxDepth = numDevices / d;
      const WidthLines lines = widthLines(topology, d, maxDepth);
      for (int p = 1; p <= maxDepth; ++p) { // N/d, not the printed N/w
        if (p > numLayers)
          break;
        if (options.stages > 0 && p != options.stages)
          continue;
        if (!options.allowFewerDevices && d * p != numDevices)
          continue;
        TwoBWConfig config; // SEARCH(d, p, B): the best (b, r)
        if (!searchPipeline(d, p, lines, config))
          continue;
        if (config.fits &&
            (!haveBest ||
             config.samplesPerSecond > best.samplesPerSecond * (1 + 1e-9))) {
          best = config;
          haveBest = true;
        }
        TwoBWConfig summary = config;
        summary.stageFirst.clear();
        summary.stageMemoryBytes.clear();
        summary.stageComputeSeconds.clear();
        configs.push_back(std::move(summary));
      }
    }
  }

  /// Why no configuration fits (or none was possible).
  std::string error() const {
    if (!haveSmallest) {
      std::string why =
          batch > 0 ? "the global batch " + std::to_string(batch) +
                          " is smaller than b·d·p for every configuration "
                          "(2BW needs m >= p microbatches per pipeline)"
          : options.microbatches > 0
              ? std::to_string(options.microbatches) +
                    " microbatches are fewer than the depth p of every "
                    "configuration (2BW needs m >= p)"
              : "no (d, p) configuration is possible";
      return "twobw: " + why;
    }
    return "twobw: no (d, p, b) configuration fits in " +
           planner_util::formatBytes(memoryLimit) +
           " per device; the best needs " +
           planner_util::formatBytes(smallest.memoryBytes) +
           " (d=" + std::to_string(smallest.width) +
           ", p=" + std::to_string(smallest.depth) +
           ", b=" + std::to_string(smallest.microbatchSize) +
           (smallest.recompute ? ", recompute" : "") + ")";
  }

  bool haveBest = false;
  TwoBWConfig best;

private:
  /// The stages of a depth-p split, computed once per p.
  const std::vector<StageCost> &stagesOf(int p) {
    auto it = splits.find(p);
    if (it == splits.end())
      it = splits.emplace(p, splitStages(profile, cuts, p)).first;
    return it->second;
  }

  /// m per pipeline for (b, d, p), from the microbatches, the global batch
  /// or m = p; false when (b, d, p) admits none.
  bool pipelineMicrobatches(int64_t b, int d, int p, int &m) const {
    if (options.microbatches > 0) {
      if (options.microbatches % d != 0)
        return false;
      m = options.microbatches / d;
      if (m < p || (batch > 0 && b * d * m > batch))
        return false;
    } else if (batch > 0) {
      int64_t g = batch / (b * d * p); // g = B/(N·b), rounded down
      if (g < 1)
        return false;
      m = static_cast<int>(p * g);
    } else {
      m = p;
    }
    return true;
  }

  /// SEARCH(d, p, B): the best (b, r) of (d, p) into `config`, with its
  /// per-stage vectors; false when no microbatch size admits one.
  bool searchPipeline(int d, int p, const WidthLines &lines,
                      TwoBWConfig &config) {
    const std::vector<StageCost> &stages = stagesOf(p);
    std::vector<double> allreduce(p, 0);
    for (int i = 0; i < p; ++i)
      allreduce[i] = lines.rings[i].at(stages[i].weights);
    bool haveConfig = false;
    for (int64_t b : sizes) {
      int m; // per pipeline; options.microbatches counts all d pipelines
      if (!pipelineMicrobatches(b, d, p, m))
        continue;
      const double f = static_cast<double>(b) / static_cast<double>(b0);
      for (bool r : flags) {
        TwoBWConfig c;
        c.width = d;
        c.depth = p;
        c.microbatchSize = b;
        c.recompute = r;
        c.microbatches = m;
        c.globalBatch = b * d * m;
        double t = 0, memory = 0;
        stageCosts(c, stages, lines.links, allreduce, f, optimizer, false, t,
                   memory);
        c.seconds = t;
        c.samplesPerSecond = t > 0 ? d * static_cast<double>(b) / t : 0;
        c.memoryBytes = memory;
        c.fits = memoryLimit <= 0 || memory <= memoryLimit;
        if (!haveSmallest || memory < smallest.memoryBytes) {
          smallest = c;
          haveSmallest = true;
        }
        if (!haveConfig || better(c, config)) {
          stageCosts(c, stages, lines.links, allreduce, f, optimizer, true, t,
                     memory);
          config = std::move(c);
          haveConfig = true;
        }
      }
    }
    return haveConfig;
  }

  /// Fitting first, then strictly higher throughput.
  static bool better(const TwoBWConfig &a, const TwoBWConfig &o) {
    if (a.fits != o.fits)
      return a.fits;
    return a.samplesPerSecond > o.samplesPerSecond * (1 + 1e-9);
  }

  const Profile &profile;
  const Topology &topology;
  const PlannerOptions &options;
  const int64_t b0;
  const int64_t batch; ///< B, the maximum safe batch
  const std::vector<int64_t> sizes;
  const std::vector<bool> flags;
  const double memoryLimit;
  const double optimizer;
  const std::vector<int64_t> cuts;
  std::map<int, std::vector<StageCost>> splits; ///< by depth p
  TwoBWConfig smallest; ///< the configuration needing the least memory
  bool haveSmallest = false;
};

} // namespace

TwoBWSearchResult searchTwoBW(const Profile &profile, const Topology &topology,
                              const PlannerOptions &options,
                              const std::vector<bool> &recompute) {
  TwoBWSearchResult result;
  if (std::string bad = twoBWRequestError(profile, topology, options);
      !bad.empty()) {
    result.error = bad;
    return result;
  }
  TwoBWSearch search(profile, topology, options, recompute);
  search.run(result.configs);
  if (search.haveBest) {
    result.ok = true;
    result.best = std::move(search.best);
    return result;
  }
  result.error = search.error();
  return result;
}

PlanResult planTwoBW(const Profile &original, const Topology &topology,
                     const PlannerOptions &options) {
  using namespace planner_util;
  if (!options.schedule.empty() && options.schedule != "2bw")
    return planError("twobw plans the 2bw schedule, not '" +
                       options.schedule + "'");
  // The plan cannot carry a recompute flag: the simulator (and the run)
  // recompute iff SimOptions::recompute, so r is fixed to it here;
  // searchTwoBW() searches both.
  TwoBWSearchResult search =
      searchTwoBW(original, topology, options, {options.sim.recompute});
  if (!search.ok) {
    if (!options.sim.recompute &&
        search.error.find("fits in") != std::string::npos) {
      TwoBWSearchResult withRecompute =
          searchTwoBW(original, topology, options, {true});
      if (withRecompute.ok)
        search.error += "; with activation recomputation d=" +
                        std::to_string(withRecompute.best.width) +
                        ", p=" + std::to_string(withRecompute.best.depth) +
                        " fits";
    }
    return planError(search.error);
  }
  const TwoBWConfig &c = search.best;
  Plan plan;
  plan.algorithm = "twobw";
  plan.schedule = "2bw";
  // plan.microbatches counts every microbatch of the iteration, over all
  // d pipelines (the simulator's convention): the global batch is
  // microbatches × microbatch size.
  plan.microbatches = c.microbatches * c.width;
  plan.microbatchSize = c.microbatchSize;
  plan.chunks = 1;
  const int numLayers = static_cast<int>(original.ops.size());
  double compute = 0;
  for (int i = 0; i < c.depth; ++i) {
    StagePlan stage;
    stage.firstLayer = c.stageFirst[i];
    stage.lastLayer = i + 1 < c.depth ? c.stageFirst[i + 1] - 1 : numLayers - 1;
    stage.replicas = c.width;
    for (int j = 0; j < c.width; ++j)
      stage.devices.push_back(i * c.width + j);
    plan.stages.push_back(stage);
    plan.predicted.stageMemoryBytes.push_back(
        static_cast<int64_t>(std::llround(c.stageMemoryBytes[i])));
    compute += c.stageComputeSeconds[i];
  }
  // A batch is m microbatches per pipeline at one per t in steady state.
  plan.predicted.iterationSeconds = c.microbatches * c.seconds;
  plan.predicted.samplesPerSecond = c.samplesPerSecond;
  plan.predicted.bubbleFraction =
      c.seconds > 0 ? std::max(0.0, 1 - compute / (c.depth * c.seconds)) : 0;
  if (std::string bad = validatePlan(plan, numLayers); !bad.empty())
    return planError("twobw: internal error: " + bad);
  PlanResult result;
  result.ok = true;
  result.plan = std::move(plan);
  return result;
}

} // namespace pipec
