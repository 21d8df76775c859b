//===- Interleaved.cpp - Megatron's interleaved (p x v) planner -----------===//
//
// The interleaved 1F1B planner of PTD-P (papers/thesis.md §4): each of the p
// pipeline devices holds v chunks; virtual stage q = c·p + r (chunk c on
// device r) is the q-th contiguous run of layers, so activations flow r ->
// r+1 within a chunk and wrap from device p-1 to device 0 at the next chunk
// (§4.2). Layer counts per chunk may be uneven: the p·v runs are a min-max
// balanced split by cost. Rules: m % p == 0 (lib/Schedule's rule, asked
// through checkScheduleShape) and v <= L/p (p·v virtual stages need at least
// that many layers).
//
// The planner's own model (the simulator re-scores every plan):
// - per microbatch, device r spends T_r = Σ_c (t_f + t_b)(c·p+r) plus 2 p2p
//   transfers (activation and gradient) of every chunk boundary it sends;
// - one iteration takes (m + (p-1)/v)·max_r T_r (§4.1) plus the gradient
//   all-reduce of each device's parameters among its d replicas;
// - memory of device r: (2 + optimizer factor)·weights (one version and a
//   gradient) + the peak of Σ_c in-flight(c)·activations(c) over Megatron's
//   op order (§4.2) + 2·(input + output) buffers per chunk.
// The microbatch size is the requested one (times and activations scale
// linearly from the profile's, as for twobw), d replicas of the pipeline
// sit side by side (device r·d + j). Plan::microbatches and
// PlannerOptions::microbatches count all microbatches of an iteration over
// the d pipelines (the simulator's convention), so m = microbatches / d per
// pipeline and the rule reads microbatches % (p·d) == 0.
//
//===----------------------------------------------------------------------===//

#include "pipec/Planners.h"

#include "PlannerUtil.h"
#include "pipec/Schedule.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

namespace pipec {

namespace {
/// Megatron's microbatch rule as lib/Schedule states it (checkScheduleShape):
/// `microbatches` over d side-by-side pipelines of depth p, which the schedule
/// sees as round-robin replicas d on every device.
bool megatronRuleHolds(int microbatches, int p, int d) {
  PipelineRequest request;
  request.kind = ScheduleKind::Interleaved;
  request.stages = p;
  request.microbatches = microbatches;
  request.replicas.assign(size_t(p), d);
  return checkScheduleShape(request).empty();
}
} // namespace

std::vector<std::pair<int, int>> megatronChunkLayers(int layers, int depth,
                                                     int chunks) {
  std::vector<std::pair<int, int>> ranges;
  if (layers < 1 || depth < 1 || chunks < 1 || layers % (depth * chunks))
    return ranges;
  // Virtual stage q holds layers q·L/(p·v) .. (q+1)·L/(p·v) - 1.
  int per = layers / (depth * chunks);
  for (int q = 0; q < depth * chunks; ++q)
    ranges.push_back({q * per, (q + 1) * per - 1});
  return ranges;
}

double transformerParameters(const TransformerShape &s) {
  // P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h))   (eq. 4.3)
  double l = s.layers, h = s.hidden;
  return 12 * l * h * h *
         (1 + 13 / (12 * h) + (s.vocabulary + s.sequence) / (12 * l * h));
}

double transformerIterationFlops(const TransformerShape &s, double batch,
                                 bool recompute) {
  double l = s.layers, h = s.hidden, seq = s.sequence, V = s.vocabulary;
  if (recompute) // F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))   (eq. 4.2)
    return 96 * batch * seq * l * h * h *
           (1 + seq / (6 * h) + V / (16 * l * h));
  // Forward + backward only: 3 × (24Bsh² + 4Bs²h) per layer + 6BshV.
  return 72 * batch * seq * l * h * h * (1 + seq / (6 * h)) +
         6 * batch * seq * h * V;
}

double transformerTrainingSeconds(double tokens, double parameters, double gpus,
                                  double flopsPerGpu) {
  // ≈ 8·T·P/(n·X)   (eq. 4.4)
  return 8 * tokens * parameters / (gpus * flopsPerGpu);
}

namespace {

/// A virtual stage (chunk) at the planned microbatch size.
struct Chunk {
  int first = 0, last = 0;
  double compute = 0;           ///< t_f + t_b (+ t_f when recomputing)
  double weights = 0;           ///< parameter bytes
  double activations = 0;       ///< stash per in-flight microbatch
  double workspace = 0;         ///< recompute: one microbatch of saved bytes
  double input = 0, output = 0; ///< bytes across the cuts before / after
};

/// Peak activation bytes of device r over Megatron's interleaved op order
/// (thesis.md §4.2), and the peak in-flight count of each of its chunks.
/// `act[c]` is the stash of chunk c per microbatch. The warm-up formula
/// holds for v = 1 too (2(p-r-1) forwards, as the schedule generator runs
/// it), which keeps more in flight than 1F1B-flush's p-r-1.
double peakActivations(int p, int v, int m, int r,
                       const std::vector<double> &act,
                       std::vector<int> &chunkPeak) {
  chunkPeak.assign(v, 0);
  const long total = static_cast<long>(m) * v; // N_v
  // W_r = min(2·(p-r-1) + (v-1)·p, N_v); all forwards first when m == p.
  long warmup =
      m == p ? total : std::min<long>(2L * (p - r - 1) + (v - 1L) * p, total);
  if (static_cast<long>(p) * v > 64) {
    // Large pipelines: the closed-form in-flight count, W_r + 1 chunk-
    // microbatches (§5.4), times the largest chunk stash (an upper bound).
    long inflight = std::min(total, warmup + 1);
    for (int c = 0; c < v; ++c)
      chunkPeak[c] = static_cast<int>(std::min<long>(inflight, m));
    return inflight * *std::max_element(act.begin(), act.end());
  }
  // The steady state repeats every p·v pairs: past warm-up + 2·p·v ops the
  // peak cannot grow any more.
  long limit = std::min<long>(total, warmup + 2L * p * v + 1);
  auto forwardChunk = [&](long k) { return (k % (p * v)) / p; }; // c_F(k)
  auto backwardChunk = [&](long k) {
    return v - 1 - static_cast<int>(forwardChunk(k)); // c_B(k)
  };
  std::vector<int> count(v, 0);
  double bytes = 0, peak = 0;
  auto forward = [&](long k) {
    int c = static_cast<int>(forwardChunk(k));
    ++count[c];
    chunkPeak[c] = std::max(chunkPeak[c], count[c]);
    bytes += act[c];
    peak = std::max(peak, bytes);
  };
  auto backward = [&](long k) {
    int c = backwardChunk(k);
    --count[c];
    bytes -= act[c];
  };
  long f = 0, b = 0;
  for (; f < std::min(warmup, limit); ++f)
    forward(f);
  for (; f < limit; ++f, ++b) {
    forward(f);
    backward(b);
  }
  return peak;
}

/// The p·v chunk boundaries: the min-max split by cost (`starts`, from
/// splitChainMinMax(costs, p·v)), then boundaries moved one layer at a time
/// while that lowers the largest device load Σ_c cost(c·p + r), then the sum of
/// squared device loads (the throughput model charges the slowest device).
/// Returns each chunk's first layer.
std::vector<int> balanceChunks(const std::vector<double> &costs, int p, int v,
                               std::vector<int> starts) {
  const int n = static_cast<int>(costs.size());
  const int count = p * v;
  if (p == 1 || count == n ||
      static_cast<double>(count) * p * n > 5e7) // keep the search cheap
    return starts;
  std::vector<double> chunk(count, 0), device(p, 0);
  for (int q = 0; q < count; ++q) {
    int end = q + 1 < count ? starts[q + 1] : n;
    for (int l = starts[q]; l < end; ++l)
      chunk[q] += costs[l];
    device[q % p] += chunk[q];
  }
  // The objective (largest device load, then the sum of squares) of the
  // current loads, with the three most loaded devices: a move changes two
  // devices, so a candidate's largest load is the larger of theirs and the
  // largest of the others, and its sum of squares changes by two terms
  // (recomputed exactly in device order once a move is taken).
  double worst = 0, squares = 0;
  int top[3] = {-1, -1, -1};
  auto measure = [&] {
    worst = squares = 0;
    top[0] = top[1] = top[2] = -1;
    for (int r = 0; r < p; ++r) {
      const double x = device[r];
      worst = std::max(worst, x);
      squares += x * x;
      int at = 3;
      while (at > 0 && (top[at - 1] < 0 || device[top[at - 1]] < x))
        --at;
      if (at < 3) {
        for (int k = 2; k > at; --k)
          top[k] = top[k - 1];
        top[at] = r;
      }
    }
  };
  measure();
  for (int pass = 0; pass < 4 * n; ++pass) {
    bool improved = false;
    for (int q = 1; q < count; ++q) {
      for (int delta : {-1, 1}) {
        int next = starts[q] + delta;
        int end = q + 1 < count ? starts[q + 1] : n;
        if (next <= starts[q - 1] || next >= end)
          continue;
        // delta = -1 moves layer next into chunk q, +1 moves starts[q] to q-1.
        int layer = delta < 0 ? next : starts[q];
        double moved = delta < 0 ? costs[layer] : -costs[layer];
        const int a = q % p, bDev = (q - 1) % p;
        const double oldA = device[a], oldB = device[bDev];
        const double newA = oldA + moved, newB = oldB - moved;
        double candidateWorst = std::max({0.0, newA, newB});
        for (int k : top)
          if (k >= 0 && k != a && k != bDev) {
            candidateWorst = std::max(candidateWorst, device[k]);
            break; // the first other in load order is the largest
          }
        const double candidateSquares =
            squares - oldA * oldA - oldB * oldB + newA * newA + newB * newB;
        const double eps = 1e-12 * (worst + 1e-300);
        if (candidateWorst < worst - eps ||
            (candidateWorst <= worst + eps &&
             candidateSquares < squares * (1 - 1e-12))) {
          starts[q] = next;
          device[a] = newA;
          device[bDev] = newB;
          measure();
          improved = true;
        }
      }
    }
    if (!improved)
      break;
  }
  return starts;
}

/// One evaluated configuration.
struct Config {
  int p = 0, v = 0, d = 0, m = 0;
  double iteration = 0, throughput = 0, bubble = 0, memory = 0;
  bool fits = false;
  /// Per virtual stage; shared by every d of one (p, v, m) class.
  const std::vector<double> *stageMemory = nullptr;
};

/// Memory of one (p, v, m) class, in bytes.
struct MemoryModel {
  std::vector<double> device; ///< per device r
  std::vector<double> stage;  ///< per virtual stage q
};

/// Per device r of a (p, d) pipeline: the p2p line to device r+1 and the
/// ring all-reduce line among its d replicas.
struct DeviceLines {
  std::vector<planner_util::Line> link, ring;
};

/// Why the request cannot be planned (the profile, the schedule, negative
/// or contradictory stages, chunks and microbatches); empty when it can.
std::string interleavedRequestError(const Profile &original,
                                    const Topology &topology,
                                    const PlannerOptions &options) {
  if (std::string bad = profilePlanningError(original); !bad.empty())
    return "interleaved: " + bad;
  if (!options.schedule.empty() && options.schedule != "interleaved")
    return "interleaved plans the interleaved schedule, not '" +
           options.schedule + "'";
  const int numDevices = topology.numDevices();
  const int numLayers = static_cast<int>(original.ops.size());
  if (numDevices < 1)
    return "interleaved: the topology has no devices";
  if (options.stages < 0 || options.chunks < 0 || options.microbatches < 0 ||
      options.globalBatch < 0 || options.microbatchSize < 0)
    return "interleaved: stages, chunks, microbatches, global "
           "batch and microbatch size must not be negative";
  const int fixedP = options.stages, fixedV = options.chunks;
  const int fixedM = options.microbatches;
  if (fixedP > numDevices)
    return "interleaved: a pipeline of " + std::to_string(fixedP) +
           " devices needs more than the topology's " +
           std::to_string(numDevices);
  if (fixedP > numLayers)
    return "interleaved: more stages (" + std::to_string(fixedP) +
           ") than layers (" + std::to_string(numLayers) + ")";
  if (fixedV > 0 && fixedV > numLayers)
    return "interleaved: more chunks (" + std::to_string(fixedV) +
           " per device) than layers (" + std::to_string(numLayers) + ")";
  if (fixedP > 0 && fixedV > 0 && fixedP * fixedV > numLayers)
    return "interleaved: more chunks than layers: p·v = " +
           std::to_string(fixedP) + "·" + std::to_string(fixedV) + " = " +
           std::to_string(fixedP * fixedV) + " virtual stages for " +
           std::to_string(numLayers) + " layers (v must be at most L/p = " +
           std::to_string(numLayers / fixedP) + ")";
  if (fixedP > 0 && fixedM > 0 && fixedM % fixedP != 0)
    return "interleaved: the number of microbatches (m = " +
           std::to_string(fixedM) +
           ") must be a multiple of the pipeline depth (p = " +
           std::to_string(fixedP) + ")";
  return "";
}

/// The p·v chunks of the profile's layers (balanceChunks from the min-max
/// split `minMax` of the loads into p·v parts) with their costs.
std::vector<Chunk> chunkCosts(const Profile &profile,
                              const std::vector<double> &loads,
                              const std::vector<int64_t> &cuts, int p, int v,
                              bool recompute, const std::vector<int> &minMax) {
  const int numLayers = static_cast<int>(profile.ops.size());
  const int count = p * v;
  std::vector<int> starts = balanceChunks(loads, p, v, minMax);
  std::vector<Chunk> chunks(count);
  for (int q = 0; q < count; ++q) {
    Chunk &c = chunks[q];
    c.first = starts[q];
    c.last = q + 1 < count ? starts[q + 1] - 1 : numLayers - 1;
    double saved = 0;
    for (int l = c.first; l <= c.last; ++l) {
      const ProfileOp &op = profile.ops[l];
      c.compute +=
          op.fwdSeconds + op.bwdSeconds + (recompute ? op.fwdSeconds : 0);
      c.weights += static_cast<double>(op.paramBytes);
      saved += static_cast<double>(op.savedBytes);
    }
    c.input = c.first > 0 ? static_cast<double>(cuts[c.first - 1]) : 0;
    c.output = q + 1 < count ? static_cast<double>(cuts[c.last]) : 0;
    c.activations = recompute ? c.input : saved;
    c.workspace = recompute ? saved : 0;
  }
  return chunks;
}

/// The p2p and all-reduce lines of every device position of d side-by-side
/// pipelines of depth p.
DeviceLines deviceLines(const Topology &topology, int p, int d) {
  using planner_util::Line;
  using planner_util::lineOf;
  // Per device r: the p2p line to device r+1 (latency + bytes/β, the
  // slower of the first and last pipeline) and the ring all-reduce line
  // among its d replicas; both are affine in the bytes (Topology.h) and
  // depend on the devices only through the level they cross (and the ring
  // through d), so each level's line is computed once.
  DeviceLines lines;
  std::vector<Line> &link = lines.link, &ring = lines.ring;
  link.resize(p);
  ring.resize(p);
  std::map<int, Line> linkAt, ringAt; // by level
  for (int r = 0; r < p; ++r) {
    int next = (r + 1) % p;
    for (int j : {0, d - 1}) {
      const int a = r * d + j, b = next * d + j;
      const int level = topology.levelBetween(a, b);
      auto cached = linkAt.find(level);
      if (cached == linkAt.end())
        cached = linkAt
                     .emplace(level, lineOf([&](int64_t bytes) {
                                return topology.p2pSeconds(bytes, a, b);
                              }))
                     .first;
      link[r].latency = std::max(link[r].latency, cached->second.latency);
      link[r].perByte = std::max(link[r].perByte, cached->second.perByte);
    }
    if (d > 1) {
      // The replicas r·d .. r·d + d - 1 span the level between the ends.
      const int level = topology.levelBetween(r * d, r * d + d - 1);
      auto cached = ringAt.find(level);
      if (cached == ringAt.end()) {
        std::vector<int> replicas(d);
        for (int j = 0; j < d; ++j)
          replicas[j] = r * d + j;
        cached =
            ringAt
                .emplace(level, lineOf([&](int64_t bytes) {
                           return topology.allreduceSeconds(bytes, replicas);
                         }))
                .first;
      }
      ring[r] = cached->second;
    }
  }
  return lines;
}

/// The planner's memory model of one (p, v) split with m microbatches per
/// pipeline: per device and per virtual stage (independent of d).
MemoryModel memoryModel(const std::vector<Chunk> &chunks, int p, int v, int m,
                        double optimizer) {
  MemoryModel model;
  model.stage.assign(p * v, 0);
  model.device.assign(p, 0);
  std::vector<int> chunkPeaks;
  for (int r = 0; r < p; ++r) {
    std::vector<double> act(v);
    double fixed = 0, workspace = 0;
    for (int ch = 0; ch < v; ++ch) {
      const Chunk &k = chunks[ch * p + r];
      act[ch] = k.activations;
      fixed += (2 + optimizer) * k.weights + 2 * (k.input + k.output);
      workspace = std::max(workspace, k.workspace);
    }
    double peak = peakActivations(p, v, m, r, act, chunkPeaks);
    model.device[r] = fixed + peak + workspace;
    for (int ch = 0; ch < v; ++ch) {
      const Chunk &k = chunks[ch * p + r];
      model.stage[ch * p + r] = (2 + optimizer) * k.weights +
                                2 * (k.input + k.output) +
                                chunkPeaks[ch] * k.activations + k.workspace;
    }
  }
  return model;
}

/// The search over (p, d, m, v): every configuration scored by the
/// planner's model, the fastest one that fits kept, and the one needing the
/// least memory for the error message.
class InterleavedSearch {
public:
  InterleavedSearch(const Profile &original, const Topology &topology,
                    const PlannerOptions &options, int64_t b)
      : topology(topology), options(options), b(b),
        profile(planner_util::scaleProfile(original, b)),
        numDevices(topology.numDevices()),
        numLayers(static_cast<int>(original.ops.size())),
        recompute(options.sim.recompute),
        optimizer(options.sim.optimizerStateFactor),
        memoryLimit(static_cast<double>(topology.deviceMemoryBytes)),
        cuts(cutBytesPerCut(profile)), loads(numLayers) {
    for (int l = 0; l < numLayers; ++l)
      loads[l] = profile.ops[l].fwdSeconds + profile.ops[l].bwdSeconds;
  }

  /// Scores every configuration the options allow.
  void run() {
    const int fixedP = options.stages, fixedV = options.chunks;
    const int fixedM = options.microbatches;
    maxP = std::min(numDevices, numLayers);
    for (int p = 1; p <= maxP; ++p) {
      if (fixedP > 0 && p != fixedP)
        continue;
      if (fixedM > 0 && !megatronRuleHolds(fixedM, p, 1))
        continue; // with d = 1 the weakest form of the rule
      int maxV = fixedV > 0 ? fixedV : std::min(8, numLayers / p);
      for (int d = numDevices / p; d >= 1; --d) {
        if (!options.allowFewerDevices && d * p != numDevices)
          break;
        const DeviceLines lines = deviceLines(topology, p, d);
        int m; // per pipeline; options.microbatches counts all d pipelines
        if (!pipelineMicrobatches(p, d, m))
          continue;
        for (int v = fixedV > 0 ? fixedV : 1; v <= maxV; ++v) {
          if (p * v > numLayers)
            break; // v <= L/p
          consider(evaluate(p, v, d, m, lines));
        }
      }
    }
  }

  /// The p·v chunks of (p, v), split once.
  const std::vector<Chunk> &chunksOf(int p, int v) {
    auto it = splits.find({p, v});
    if (it != splits.end())
      return it->second;
    // The min-max split depends on p·v only: shared by (2, 4), (4, 2), ...
    auto split = minMaxSplits.find(p * v);
    if (split == minMaxSplits.end())
      split = minMaxSplits
                  .emplace(p * v, planner_util::splitChainMinMax(loads, p * v))
                  .first;
    return splits
        .emplace(std::make_pair(p, v), chunkCosts(profile, loads, cuts, p, v,
                                                  recompute, split->second))
        .first->second;
  }

  /// Why no configuration was scored (the search found none).
  std::string noConfigurationError() const {
    const int fixedV = options.chunks, fixedM = options.microbatches;
    if (fixedM > 0)
      return "interleaved: the number of microbatches (m = " +
             std::to_string(fixedM) +
             ") must be a multiple of the pipeline depth p, and no usable p "
             "<= " +
             std::to_string(maxP) + " divides it (with v <= L/p)";
    if (fixedV > 0)
      return "interleaved: more chunks than layers: " + std::to_string(fixedV) +
             " chunks per device leave no pipeline depth p with "
             "p·v <= " +
             std::to_string(numLayers) + " layers";
    return "interleaved: no (p, v, d, m) configuration satisfies "
           "the batch constraints (global batch " +
           std::to_string(options.globalBatch) + ")";
  }

  /// Why no configuration fits (some were scored, none within memory).
  std::string noFitError() const {
    using planner_util::formatBytes;
    return "interleaved: no configuration fits in " + formatBytes(memoryLimit) +
           " per device; the best needs " + formatBytes(smallest.memory) +
           " (p=" + std::to_string(smallest.p) +
           ", v=" + std::to_string(smallest.v) +
           ", d=" + std::to_string(smallest.d) + ")";
  }

  bool haveBest = false, haveAny = false;
  Config best, smallest;

private:
  /// m per pipeline for (p, d), from the microbatches, the global batch or
  /// the default 4p; false when (p, d) admits none.
  bool pipelineMicrobatches(int p, int d, int &m) const {
    const int fixedM = options.microbatches;
    if (fixedM > 0) {
      if (!megatronRuleHolds(fixedM, p, d))
        return false; // m % p == 0 for each of the d pipelines
      m = fixedM / d;
      if (options.globalBatch > 0 && b * d * m > options.globalBatch)
        return false;
    } else if (options.globalBatch > 0) {
      // The largest m that fits the batch and keeps the rule, m % p == 0.
      m = static_cast<int>(options.globalBatch / (b * d) / p * p);
      if (m < 1)
        return false;
    } else {
      m = 4 * p;
    }
    return true;
  }

  /// Iteration time, throughput, bubble and memory of (p, v, d, m).
  Config evaluate(int p, int v, int d, int m, const DeviceLines &lines) {
    const std::vector<Chunk> &chunks = chunksOf(p, v);
    Config c;
    c.p = p;
    c.v = v;
    c.d = d;
    c.m = m;
    // Per microbatch and device: compute + sends of its chunk outputs.
    double slowest = 0, allreduce = 0;
    for (int r = 0; r < p; ++r) {
      double busy = 0, weights = 0;
      for (int ch = 0; ch < v; ++ch) {
        const Chunk &k = chunks[ch * p + r];
        busy += k.compute;
        weights += k.weights;
        if (ch * p + r + 1 < p * v)
          busy += 2 * lines.link[r].at(k.output); // activation + gradient
      }
      slowest = std::max(slowest, busy);
      if (d > 1)
        allreduce = std::max(allreduce, lines.ring[r].at(weights));
    }
    // (m + (p-1)/v)·(t_f + t_b) per iteration (§4.1), + the all-reduce.
    double bubbleTerm = (p - 1.0) / v;
    c.iteration = (m + bubbleTerm) * slowest + allreduce;
    c.throughput =
        c.iteration > 0 ? static_cast<double>(m) * b * d / c.iteration : 0;
    c.bubble = bubbleTerm / (m + bubbleTerm);
    // Memory per device and per virtual stage (independent of d).
    const MemoryModel &model = memoryOf(p, v, m, chunks);
    c.stageMemory = &model.stage;
    c.memory = *std::max_element(model.device.begin(), model.device.end());
    c.fits = memoryLimit <= 0 || c.memory <= memoryLimit;
    return c;
  }

  /// The memory model of (p, v, m), computed once per class: m-independent
  /// once m >= 3p (the steady state repeats every p·v pairs, see
  /// peakActivations).
  const MemoryModel &memoryOf(int p, int v, int m,
                              const std::vector<Chunk> &chunks) {
    int mKey = m >= 3 * p ? -1 : m;
    auto key = std::make_tuple(p, v, mKey);
    auto pit = peaks.find(key);
    if (pit == peaks.end())
      pit = peaks
                .emplace(key, memoryModel(chunks, p, v, mKey < 0 ? 3 * p : m,
                                          optimizer))
                .first;
    return pit->second;
  }

  /// Keeps c as the best (fastest that fits) and the smallest (least
  /// memory) configuration so far.
  void consider(const Config &c) {
    if (!haveAny || c.memory < smallest.memory)
      smallest = c;
    haveAny = true;
    if (c.fits && (!haveBest || c.throughput > best.throughput * (1 + 1e-9))) {
      best = c;
      haveBest = true;
    }
  }

  const Topology &topology;
  const PlannerOptions &options;
  const int64_t b;
  const Profile profile; ///< at the planned microbatch size
  const int numDevices, numLayers;
  const bool recompute;
  const double optimizer;
  const double memoryLimit;
  const std::vector<int64_t> cuts;
  std::vector<double> loads; ///< t_f + t_b per layer
  int maxP = 0;
  std::map<std::pair<int, int>, std::vector<Chunk>> splits; // by (p, v)
  std::map<int, std::vector<int>> minMaxSplits;             // by p·v
  std::map<std::tuple<int, int, int>, MemoryModel> peaks;   // by (p, v, m)
};

/// The plan of configuration `best`: virtual stage c·p + r on the d
/// replicas of device position r.
Plan interleavedPlan(const Config &best, const std::vector<Chunk> &chunks,
                     int64_t b) {
  Plan plan;
  plan.algorithm = "interleaved";
  plan.schedule = "interleaved";
  // All microbatches of the iteration over the d pipelines (the
  // simulator's convention); m = best.m per pipeline.
  plan.microbatches = best.m * best.d;
  plan.microbatchSize = b;
  plan.chunks = best.v;
  for (int q = 0; q < best.p * best.v; ++q) {
    StagePlan stage;
    stage.firstLayer = chunks[q].first;
    stage.lastLayer = chunks[q].last;
    stage.replicas = best.d;
    int r = q % best.p; // virtual stage c·p + r lives on device r
    for (int j = 0; j < best.d; ++j)
      stage.devices.push_back(r * best.d + j);
    plan.stages.push_back(stage);
    plan.predicted.stageMemoryBytes.push_back(
        static_cast<int64_t>(std::llround((*best.stageMemory)[q])));
  }
  plan.predicted.iterationSeconds = best.iteration;
  plan.predicted.samplesPerSecond = best.throughput;
  plan.predicted.bubbleFraction = best.bubble;
  return plan;
}

} // namespace

PlanResult planInterleaved(const Profile &original, const Topology &topology,
                           const PlannerOptions &options) {
  using namespace planner_util;
  if (std::string bad = interleavedRequestError(original, topology, options);
      !bad.empty())
    return planError(bad);
  const int64_t b = chosenMicrobatchSize(original, options.microbatchSize);
  InterleavedSearch search(original, topology, options, b);
  search.run();
  if (!search.haveAny)
    return planError(search.noConfigurationError());
  if (!search.haveBest)
    return planError(search.noFitError());
  const Config &best = search.best;
  Plan plan = interleavedPlan(best, search.chunksOf(best.p, best.v), b);
  const int numLayers = static_cast<int>(original.ops.size());
  if (std::string bad = validatePlan(plan, numLayers); !bad.empty())
    return planError("interleaved: internal error: " + bad);
  PlanResult result;
  result.ok = true;
  result.plan = std::move(plan);
  return result;
}

} // namespace pipec
