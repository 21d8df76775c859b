//===- Planners.h - The planners of the seed papers -------------*- C++ -*-===//
//
// Every planner returns the same `Plan` (Plan.h) and is re-scored by the
// simulator (Sim.h). Formulas, misprints and worked examples are in
// ../shared/papers (pipedream.md §2, dapple.md §2, madpipe.md §2-3,
// thesis.md §3.5 and §4). Plain C++, no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_PLANNERS_H
#define PIPEC_PLANNERS_H

#include "pipec/Plan.h"
#include "pipec/Profile.h"
#include "pipec/Sim.h"
#include "pipec/Topology.h"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace pipec {

struct PlannerOptions {
  /// Schedule the plan is for (gpipe, 1f1b-flush, 1f1b, 2bw, interleaved);
  /// empty: the planner's own (pipedream: 1f1b, dapple: 1f1b-flush,
  /// madpipe: 1f1b, twobw: 2bw, interleaved: interleaved).
  std::string schedule;
  /// Microbatches per iteration; 0: the planner chooses.
  int microbatches = 0;
  /// Samples per iteration (global batch); 0: microbatches x microbatch.
  int64_t globalBatch = 0;
  /// Samples per microbatch; 0: the profile's microbatch.
  int64_t microbatchSize = 0;
  /// Virtual chunks per device (interleaved); 0: the planner chooses.
  int chunks = 0;
  /// Pipeline depth; 0: the planner chooses.
  int stages = 0;
  /// May a plan use fewer devices than the topology has?
  bool allowFewerDevices = true;
  SimOptions sim;
};

PlanResult planPipeDream(const Profile &, const Topology &, const PlannerOptions &);
PlanResult planDapple(const Profile &, const Topology &, const PlannerOptions &);
PlanResult planMadPipe(const Profile &, const Topology &, const PlannerOptions &);
PlanResult planTwoBW(const Profile &, const Topology &, const PlannerOptions &);
PlanResult planInterleaved(const Profile &, const Topology &, const PlannerOptions &);
/// Brute force over contiguous partitions x replication vectors; refuses
/// instances too large to enumerate (the test oracle).
PlanResult planExhaustive(const Profile &, const Topology &, const PlannerOptions &);

/// One scored candidate of `auto`.
struct PlanCandidate {
  Plan plan;
  SimResult sim;
  bool feasible = false;
  std::string note; ///< why infeasible, or which planner failed and why
  /// Not simulated: its throughput bound (flushIterationLowerBound) is
  /// below a feasible candidate's simulated throughput, so it cannot win.
  bool skipped = false;
};

struct AutoPlanResult {
  bool ok = false;
  Plan best;
  std::vector<PlanCandidate> candidates;
  std::string error; ///< e.g. memory too small: says what the best plan needs
};

/// Runs every applicable planner, re-scores each plan with the simulator
/// and one memory model, and returns the fastest feasible plan.
AutoPlanResult planAuto(const Profile &, const Topology &, const PlannerOptions &);

/// The explanation table of `auto` (planner, stages, replicas, devices,
/// microbatches, schedule, predicted time per iteration, bubble %, peak
/// memory per stage, feasible?).
std::string candidateTable(const std::vector<PlanCandidate> &candidates);

/// Runs the planner called `name` (pipedream, dapple, madpipe, twobw,
/// interleaved, exhaustive, balanced, auto).
PlanResult runPlanner(const std::string &name, const Profile &,
                      const Topology &, const PlannerOptions &);
std::vector<std::string> plannerNames();

//===----------------------------------------------------------------------===//
// The models behind pipedream, dapple and exhaustive (papers/pipedream.md §2,
// papers/dapple.md §2), exposed so that tests and benchmarks compare every
// planner with the brute-force oracle under the planner's own model.
//===----------------------------------------------------------------------===//

/// How PipeDream's T^k charges the weight synchronisation of a stage
/// replicated m ways over level k. The printed model is internally
/// inconsistent (pipedream.md §8.2); both readings are offered.
enum class PipeDreamSync {
  /// Ring allreduce over level k, the collective of the simulator and the
  /// runtime: 2(m-1)/m · Σ|w_l| / B_k + 2(m-1) · latency_k.
  Ring,
  /// As printed in [P] §3.1: 2(m-1) · Σ|w_l| / B_k.
  Paper,
};

struct PipeDreamOptions {
  PipeDreamSync sync = PipeDreamSync::Ring;
  /// Evaluate the printed recurrence directly (O(Σ_k N³ m_k²), the paper's
  /// algorithm) even when devices may be left idle. The default search
  /// answers the same question by bisection on the bottleneck with a
  /// feasibility test of O(Π_k m_k² log N) per probe; the recurrence is
  /// always used when every device must be used (allowFewerDevices false),
  /// since A is not monotone in m (pipedream.md §8.3).
  bool referenceDP = false;
};

/// PipeDream's model of a plan (pipedream.md §2.3): the plan must be a
/// hierarchical plan, i.e. every stage of level k is replicated over whole
/// components of level k-1 that all run the same sub-pipeline.
struct PipeDreamScore {
  bool ok = false;
  std::string error; ///< why the plan is not a PipeDream plan
  /// A^L: the slowest stage or cut, seconds per minibatch in steady state;
  /// +inf when a stage does not fit in device memory.
  double bottleneckSeconds = 0;
  bool fitsMemory = true;
  /// ⌈devices used / devices of the input stage⌉.
  int noam = 1;
  /// Per stage replica, with the 1F1B in-flight count ⌈devices from this
  /// stage to the last / replicas of this stage⌉.
  std::vector<int64_t> stageMemoryBytes;
};

/// Scores `plan` (its stages, replicas and devices; microbatch size from
/// plan.microbatchSize) under PipeDream's model. The memory rule is the one
/// the planner enforces: weights × v + gradients + optimizer state + v ×
/// stashed activations ≤ device memory with v = ⌈D / R⌉, D the topology's
/// devices and R the stage's replicas (an upper bound on the in-flight
/// count that does not depend on the stage's position). Cuts cost
/// C_k(s) = 2 (latency_k + a_s / B_k), a_s the bytes live across the cut
/// (each tensor once). Recomputation is not modelled (PipeDream stashes).
PipeDreamScore scorePipeDream(const Profile &, const Topology &, const Plan &,
                              const SimOptions & = {},
                              const PipeDreamOptions & = {});
/// The PipeDream partitioner: the plan minimising A^L (exact under the
/// model, idle devices allowed or not), flattened to one plan stage per
/// leaf stage with the devices of all its replicas; microbatches = NOAM
/// (unless options.microbatches), schedule "1f1b", microbatch size from the
/// options or the profile (the global batch is not used: PipeDream trains
/// with minibatch = microbatch). options.stages is refused (PipeDream picks
/// the depth). predicted: iteration = microbatches × A^L, samples/s = b /
/// A^L, bubble = 1 - Σ T_l / (devices × A^L).
PlanResult planPipeDream(const Profile &, const Topology &,
                         const PlannerOptions &, const PipeDreamOptions &);
/// NOAM = ⌈workers / replicas of the input stage⌉ ([P] §3.2).
int pipeDreamNoam(int workers, int inputStageReplicas);

/// DAPPLE's device-allocation policies (dapple.md §2.5); a "machine" is a
/// component of the innermost topology level.
enum class DapplePolicy {
  FreshFirst,   ///< unused machines first, each filled before the next
  AppendFirst,  ///< partly used machines first, then unused ones
  ScatterFirst, ///< round robin over the used machines (all if none used)
};
/// Warm-up depth K_i (dapple.md §3.3) with S compute stages and D_i the
/// microbatches stage i can hold: A: min(S - i, D_i); B: min(2(S - i) - 1,
/// D_i); Auto: B when the communication-to-computation ratio (mean
/// communication stage time over mean (F + B) / 2 of the compute stages)
/// exceeds 0.5, else A.
enum class DappleWarmup { A, B, Auto };

struct DappleOptions {
  DappleWarmup warmup = DappleWarmup::Auto;
  /// Policies the search may use (default: all three).
  std::vector<DapplePolicy> policies = {DapplePolicy::FreshFirst,
                                        DapplePolicy::AppendFirst,
                                        DapplePolicy::ScatterFirst};
  /// Eq. (2) with the `s = Q` correction (dapple.md §2.3); false: as
  /// printed.
  bool fixPivotTerm = true;
  /// The search tries every cut while there are at most `maxFullCuts`
  /// (layers - 1), and every device count while there are at most
  /// `maxFullDevices` devices; beyond, `gridCuts` cuts at equal compute
  /// quantiles and device counts in multiples of ⌈devices / gridDevices⌉,
  /// and the best plan of every depth is then refined one move at a time
  /// (cuts, devices, policies) at full resolution.
  int maxFullCuts = 24;
  int maxFullDevices = 32;
  int gridCuts = 16;
  int gridDevices = 16;
};

/// Eq. (1)/(2) over S pipeline stages, communication stages included.
struct DappleLatency {
  double latency = 0; ///< L = T_w + T_s + T_e
  double warmup = 0;  ///< T_w = Σ_{s<=Q} F_s
  double steady = 0;  ///< T_s = (M-1)(F_Q + B_Q)
  double ending = 0;  ///< T_e
  int pivot = 0;      ///< Q
};

/// The pivot Q by the prose rule of Eq. (3): Q = S-1, then for s = S-2..0,
/// Q := s when (M-1)(F_s+B_s) > (M-1)(F_Q+B_Q) + Σ_{s<a<Q}(F_a+B_a).
int dapplePivot(const std::vector<double> &forward,
                const std::vector<double> &backward, int microbatches);
/// L of Eq. (1)/(2) for per-stage F_s, B_s and AR_s and M microbatches.
/// With `fixPivotTerm` the s = Q term of T_e is AR_Q + B_Q (the s < Q sum
/// applied to s <= Q); without, AR_Q - B_Q as printed.
DappleLatency dappleLatency(const std::vector<double> &forward,
                            const std::vector<double> &backward,
                            const std::vector<double> &allreduce,
                            int microbatches, bool fixPivotTerm = true);
/// K_i for `stages` compute stages (policy A or B; Auto counts as A),
/// clamped to [1, M] and to maxInflight[i] when given (D_i).
std::vector<int> dappleWarmupDepths(int stages, int microbatches,
                                    DappleWarmup policy,
                                    const std::vector<int> &maxInflight = {});
/// Takes `count` free devices by `policy`, marks them used and returns them
/// sorted; fewer when fewer are free.
std::vector<int> dappleAllocate(const Topology &, std::vector<bool> &used,
                                int count, DapplePolicy policy);

/// DAPPLE's model of a plan (dapple.md §2.2-2.3, §4). Compute stage s with
/// r replicas works on slices of ⌈b/r⌉ of the b samples of a microbatch:
///   F_s, B_s = Σ fwd_s, Σ bwd_s of its layers × ⌈b/r⌉ / profile microbatch
///   AR_s     = ring allreduce of its parameter bytes over its devices
/// and between stages s and s+1 a communication stage with
///   F = B = latency + a · max(⌈b/r_s⌉, ⌈b/r_{s+1}⌉) / (profile microbatch
///           · bandwidth), AR = 0,
/// a the bytes live across the cut and the link the slowest level spanned
/// by both stages' devices. Memory per replica: parameters × (2 +
/// optimizer factor) + K_s × stashed activations of a slice (with
/// recompute: K_s × the slice's stage input + one slice of stashed
/// activations).
struct DappleScore {
  bool ok = false;
  std::string error;
  DappleLatency latency;
  /// Per pipeline stage, compute and communication stages alternating
  /// (2S - 1 entries for S compute stages).
  std::vector<double> forward, backward, allreduce;
  DappleWarmup warmupPolicy = DappleWarmup::A; ///< A or B, as applied
  std::vector<int> warmup;                     ///< K_i per compute stage
  std::vector<int64_t> stageMemoryBytes;       ///< per compute stage
  bool fitsMemory = true; ///< every stage holds at least one microbatch
};

DappleScore scoreDapple(const Profile &, const Topology &, const Plan &,
                        const SimOptions & = {}, const DappleOptions & = {});
/// The DAPPLE planner: minimises L over partitions, replication and policy
/// placements (optimal among plans of at most two compute stages, the
/// paper's memoised search beyond). M and b: as given; with only a global
/// batch B, b is chosen among B / 2^k. Schedule "1f1b-flush"; predicted:
/// iteration = L, samples/s = M·b / L, per-stage memory with K_i.
PlanResult planDapple(const Profile &, const Topology &, const PlannerOptions &,
                      const DappleOptions &);

/// What searchExhaustive minimises.
enum class ExhaustiveObjective {
  /// A^L of scorePipeDream (non-hierarchical plans are skipped).
  PipeDream,
  /// L of scoreDapple at the options' microbatches and microbatch size.
  Dapple,
  /// ExhaustiveOptions::score.
  Custom,
};

/// Which device sets the oracle tries for each replication vector.
enum class ExhaustivePlacements {
  /// Every assignment of devices to stages up to the topology's symmetry
  /// (permuting the components inside any component).
  All,
  /// Stage by stage in pipeline order, each by one of DAPPLE's policies.
  DapplePolicies,
  /// Stage s takes the next r_s devices in device order.
  InOrder,
};

struct ExhaustiveOptions {
  ExhaustiveObjective objective = ExhaustiveObjective::Custom;
  ExhaustivePlacements placements = ExhaustivePlacements::All;
  /// Lower is better; +inf marks an infeasible plan. The plan carries its
  /// stages, replicas, devices, schedule, microbatches and microbatch size.
  std::function<double(const Plan &)> score;
  PipeDreamOptions pipedream;
  DappleOptions dapple;
  /// At most this many stages (0: as many as layers and devices allow).
  int maxStages = 0;
  /// Refuse larger instances.
  int maxLayers = 12;
  int maxDevices = 16;
  int64_t maxCandidates = 20000000;
};

struct ExhaustiveResult {
  bool ok = false;
  Plan plan;
  std::string error;
  double objective = 0;   ///< the best score
  int64_t candidates = 0; ///< plans scored
};

/// Brute force over contiguous partitions x replication vectors x
/// placements (the test oracle). Uses all devices unless
/// options.allowFewerDevices.
ExhaustiveResult searchExhaustive(const Profile &, const Topology &,
                                  const PlannerOptions &,
                                  const ExhaustiveOptions &);

//===----------------------------------------------------------------------===//
// The models behind madpipe, twobw and interleaved (papers/madpipe.md,
// papers/thesis.md §3-4), exposed for tests and benchmarks.
//
// planMadPipe's plans may put several stages on one device, the special
// processor of MadPipe-DP: each of its stages lists that device (Plan.h).
// Such a plan is returned only when the simulator runs it (no deadlock),
// finds every device within memory and simulates it strictly faster than
// the best plan with one stage per device, which is returned otherwise.
//===----------------------------------------------------------------------===//

/// 1F1B* groups (madpipe.md §2.1) of a chain of items (stages, or stages and
/// links) with loads U(s) = U_F(s) + U_B(s) and period T: walking back from
/// the last item, an item joins the current group while the group's load
/// stays <= T (relative tolerance 1e-9), else it opens the next group.
/// Returns each item's group index g (the last item is in group 1): the
/// number of activations the item stores.
std::vector<int> oneFOneBStarGroups(const std::vector<double> &loads,
                                    double period);

/// One item of a 1F1B* periodic pattern (madpipe.md §3.1): in period k the
/// forward starts at k·T + forwardStart on batch k - forwardShift and the
/// backward at k·T + backwardStart on batch k - backwardShift.
struct OneFOneBStarItem {
  int group = 1;
  double forwardStart = 0;
  int forwardShift = 0;
  double backwardStart = 0;
  int backwardShift = 0;
};

/// The 1F1B* pattern of period T for items with forward times `forward` and
/// backward times `backward` (each item on its own resource). Empty when an
/// item's load exceeds T (the construction's precondition).
std::vector<OneFOneBStarItem>
oneFOneBStarPattern(const std::vector<double> &forward,
                    const std::vector<double> &backward, double period);

/// x ⊕ y for the target period T̂ (madpipe.md §3.2): x + y when both lie in
/// the same group (⌈x/T̂⌉ = ⌈(x+y)/T̂⌉), else T̂·⌈x/T̂⌉ + y.
double madPipeOplus(double x, double y, double period);

/// The chain MadPipe plans, in the paper's symbols. Item i (0-based) is the
/// paper's layer i+1, or a block of consecutive profile layers.
struct MadPipeChain {
  std::vector<double> forward;  ///< u_{F_l}, seconds
  std::vector<double> backward; ///< u_{B_l}, seconds
  std::vector<double> weights;  ///< W_l, bytes
  /// Bytes item l keeps for its backward: the paper's a_{l-1} (the
  /// profile's saved_bytes).
  std::vector<double> stored;
  /// a_l: bytes crossing the cut after item l (the last entry is 0).
  std::vector<double> cut;
  /// C(l) = 2·a_l/β: link time of the cut after item l (the last entry 0).
  std::vector<double> comm;
  /// Bytes held per parameter byte: 3 (two weight versions and a gradient,
  /// madpipe.md §1) plus the optimizer state factor.
  double weightFactor = 3;
  /// Recompute: stash the stage input g times plus one microbatch of the
  /// stage's own activations instead of g copies of every layer's input.
  bool recompute = false;
  /// M, bytes per processor; 0 = unlimited.
  double memory = 0;
  /// P.
  int processors = 1;
  /// The contiguous variant (madpipe.md §6.3, 17): P normal processors and
  /// no special one, so every processor holds at most one stage.
  bool contiguous = false;
  /// Last profile layer of each item; empty: item i is profile layer i.
  std::vector<int> lastLayer;

  int size() const { return static_cast<int>(forward.size()); }
};

/// 𝓜(k, l, g) of madpipe.md §2.3 for items first..last (0-based, inclusive)
/// storing g activations:
///   Σ_{i=k}^{l} (3W_i + g·a_{i-1}) + 2·(a_{k-1} + a_l)
/// without the a_{k-1} buffer when k is the first item and without the a_l
/// buffer when l is the last. With recompute the activation term is
/// g·a_{k-1} + Σ_{i=k}^{l} a_{i-1}.
double madPipeStageMemory(const MadPipeChain &chain, int first, int last,
                          int activations);

/// The chain of a profile: per item the summed times, weights and saved
/// bytes; a_l = bytes live across the cut (each tensor once); C(l) =
/// 2·p2p(a_l) over the slowest level spanned by devices 0..processors-1.
/// With maxItems > 0 and more layers than that, consecutive layers are
/// grouped greedily into at most maxItems blocks of balanced load
/// (madpipe.md §1: "greedily grouping layers as necessary").
MadPipeChain madPipeChain(const Profile &profile, const Topology &topology,
                          int processors, const SimOptions &sim,
                          int maxItems = 0);

/// Discretisation of MadPipe-DP's continuous state (madpipe.md §3.2). Every
/// value is rounded up to the next grid point (conservative):
///   t_P: `period` points on [0, U(1,L)]
///   m_P: `memory` points on [0, M]   (collapsed to {0} when M is unlimited)
///   V:   `delay` points on [0, V_max], V_max = 2·(U(1,L) + Σ_l C(l)) + T̂,
///        larger V capped at V_max    (collapsed to {0} when M is unlimited)
struct MadPipeGrid {
  int period = 101;
  int memory = 11;
  int delay = 51;
};

/// One stage of a MadPipe allocation.
struct MadPipeStage {
  int first = 0; ///< first item, 0-based
  int last = 0;  ///< last item, inclusive
  bool special = false;
  /// g(k, l, V) = ⌈(V + U(k,l))/T̂⌉ along the allocation (exact V).
  int activations = 1;
  /// 𝓜(k, l, g) on a normal processor, 𝓜(k, l, g-1) on the special one.
  double memoryBytes = 0;
};

struct MadPipeAllocation {
  bool feasible = false;
  double target = 0; ///< T̂
  double value = 0;  ///< T(L, P-1, 0, 0, 0), on the grid
  /// Load-balance period recomputed without rounding: the largest of the
  /// normal stages' U, the special processor's total U and the cuts' C.
  double period = 0;
  std::vector<MadPipeStage> stages; ///< in chain order
};

/// MadPipe-DP (madpipe.md §3.2) for the target period T̂: P-1 normal
/// processors with one stage each, one special processor with any number,
/// normal memory 𝓜(k,l,g) <= M, special Σ 𝓜(k,l,g-1) <= M, minimising the
/// period; the allocation is backtracked. Infeasible: feasible = false.
MadPipeAllocation madPipeDP(const MadPipeChain &chain, double targetPeriod,
                            const MadPipeGrid &grid = {});

/// One iteration of Algorithm 1 (madpipe.md §3.3).
struct MadPipeStep {
  double target = 0;     ///< T̂_i
  double value = 0;      ///< T_i = MadPipe-DP(T̂_i), +inf when infeasible
  double tilde = 0;      ///< T̃_i = max(T_i, T̂_i)
  double lowerBound = 0; ///< lb after the step
  double upperBound = 0; ///< ub after the step
};

struct MadPipeSearch {
  std::vector<MadPipeStep> steps;
  std::vector<MadPipeAllocation> allocations; ///< one per step
  int best = -1; ///< step with the smallest T̃; -1 when none is feasible
};

/// Algorithm 1: binary search on T̂ from lb = U(1,L)/P, ub = U(1,L) +
/// Σ_{l=1}^{L-1} C(l), with line 7 read as lb ← max(lb, min(T_i, T̂_i))
/// (madpipe.md §7.2). The search never evaluates ub itself: when none of
/// the K steps finds an allocation, one more step runs at T̂ = ub.
MadPipeSearch madPipeSearch(const MadPipeChain &chain,
                            const MadPipeGrid &grid = {}, int iterations = 10);

/// Per-stage memory of thesis.md §3.4 in the formula's terms, for a stage
/// holding `weights` = |W|/p, `activations` = |A_total(b)|/p and stage
/// inputs `inputs` = |A_input(b)|:
///   2BW:             2|W|/p + p·|A_total(b)|/p + p·|A_input(b)|
///   2BW, recompute:  2|W|/p +   |A_total(b)|/p + p·|A_input(b)|
double twoBWStageMemory(double weights, double activations, double inputs,
                        int depth, bool recompute);
///   GPipe (always recomputes): |W|/p + |A_total(b)|/p + m·|A_input(b)|
double gpipeStageMemory(double weights, double activations, double inputs,
                        int microbatches);

/// One configuration of the PipeDream-2BW planner (thesis.md §3.5).
struct TwoBWConfig {
  int width = 1;              ///< d, parallel pipelines
  int depth = 1;              ///< p, stages per pipeline
  int64_t microbatchSize = 1; ///< b
  bool recompute = false;     ///< r
  /// m = p·g microbatches per pipeline and batch (the plan's
  /// `microbatches` counts all d pipelines: d·m).
  int microbatches = 1;
  int64_t globalBatch = 1;     ///< b·d·m
  double seconds = 0;          ///< t, seconds per microbatch (steady state)
  double samplesPerSecond = 0; ///< d·b/t
  double memoryBytes = 0;      ///< MEMORY(d, p, b, r): the largest stage
  bool fits = false;           ///< memoryBytes <= M
  std::vector<int> stageFirst; ///< first layer of each stage
  std::vector<double> stageMemoryBytes;    ///< per stage
  std::vector<double> stageComputeSeconds; ///< c_extra·T_i^comp(b)
};

struct TwoBWSearchResult {
  bool ok = false;
  std::string error;
  TwoBWConfig best;
  /// The best (b, r) of every (d, p) that was costed (Algorithm 1's
  /// SEARCH), fitting or not; without the per-stage vectors.
  std::vector<TwoBWConfig> configs;
};

/// Algorithm 1 of thesis.md §3.5 over d = 1..N, p = 1..N/d (the printed
/// "N/w" is a misprint), the microbatch sizes allowed by `options` and the
/// recompute flags in `recompute`. MEMORY is twoBWStageMemory plus one
/// gradient accumulator and the optimizer state per stage; times and
/// activations scale linearly from the profile's microbatch.
TwoBWSearchResult searchTwoBW(const Profile &profile, const Topology &topology,
                              const PlannerOptions &options,
                              const std::vector<bool> &recompute);

/// Megatron's even chunk map (thesis.md §4.2): virtual stage q = c·p + r
/// (chunk c on device r) holds layers q·L/(p·v) .. (q+1)·L/(p·v) - 1
/// (0-based). Empty unless L % (p·v) == 0.
std::vector<std::pair<int, int>> megatronChunkLayers(int layers, int depth,
                                                     int chunks);

/// Shape of a GPT-style transformer (thesis.md §4.6).
struct TransformerShape {
  double layers = 0;     ///< l
  double hidden = 0;     ///< h
  double sequence = 0;   ///< s
  double vocabulary = 0; ///< V
};

/// P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h))   (thesis.md eq. 4.3).
double transformerParameters(const TransformerShape &shape);
/// FLOPs of one iteration of batch B. With recompute (eq. 4.2):
///   F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h));
/// without, the layers run 3 forwards' worth instead of 4:
///   F = 72·B·s·l·h²·(1 + s/(6h)) + 6·B·s·h·V.
double transformerIterationFlops(const TransformerShape &shape, double batch,
                                 bool recompute = true);
/// End-to-end training time ≈ 8·T·P/(n·X) seconds for T tokens, P
/// parameters, n GPUs at X FLOP/s each (eq. 4.4).
double transformerTrainingSeconds(double tokens, double parameters, double gpus,
                                  double flopsPerGpu);

/// The balanced planner (lib/Planners/Balanced.cpp): the compiler's
/// default.
///
/// Balanced contiguous split of a layer chain into `numStages` stages: the
/// partition minimising the largest stage time (fwd + bwd), ties broken by
/// the smaller total number of bytes crossing the cuts. Exact (dynamic
/// programming, O(L^2 p)). Errors: numStages < 1, more stages than layers,
/// negative costs.
///
/// Details: the tie-break objective is planCutBytes(); stage times within a
/// relative 1e-9 of the optimum count as ties (floating-point sums). When
/// every layer costs 0 s, each layer counts as 1 so the split balances the
/// op count. The plan has algorithm "balanced", one replica per stage on
/// device = stage index, and the profile's microbatch size.
PlanResult planBalanced(const Profile &profile, int numStages);

} // namespace pipec

#endif // PIPEC_PLANNERS_H
