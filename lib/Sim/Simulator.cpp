//===- Simulator.cpp - Discrete-event pipeline simulator ------------------===//
//
// Runs a plan's rank programs (lib/Schedule) on the cost model: profile times
// per stage, topology communication, and reports iteration time,
// throughput, bubble, memory per stage and a Chrome trace (DESIGN.md §4:
// every planner's candidate is re-scored here).
//
// Model
//  - Virtual stage q (a plan stage; for interleaved plans the p*v virtual
//    stages in order, q = c*p + r on device position r) takes
//      t_F(q) = sigma * sum fwd_s,   t_B(q) = sigma * sum bwd_s (+ t_F(q)
//      with recompute: one more forward, c_extra = 4/3 when t_B = 2 t_F,
//      thesis.md §3.5),
//    sigma = plan.microbatchSize / profile.microbatch (times and activation
//    bytes scale linearly with the microbatch). zb-h1 splits t_B into
//    B = (1 - alpha) t_B and W = alpha t_B, alpha = weightGradFraction (the
//    recompute forward stays in B).
//  - Edges: every tensor produced in stage a and consumed in stage b > a is
//    sent a -> b (skip connections included, once per consuming stage,
//    DESIGN.md §4); its gradient goes back b -> a with the same size. The
//    bytes of the edges crossing a boundary sum to cutBytes(profile, cut,
//    &plan). A transfer costs topology.p2pSeconds(bytes, src, dst) on a FIFO
//    link per directed device pair and overlaps compute; between two
//    devices that share processors it is their processors' work instead and
//    runs in the processor sharing (SimOptions::messagesShareProcessors).
//  - Each rank (one replica of one stage, or of one device position of an
//    interleaved pipeline) runs its program in order; an op starts when the
//    device is free and its inputs have arrived: F(q, k) needs the
//    activations of F(a, k) for every edge a -> q; B(q, k) needs the
//    gradients of B(b, k) for every edge q -> b and its own F(q, k); W(q, k)
//    its own B(q, k). Microbatch k of a stage with r replicas runs on
//    replica k mod r (1F1B-RR). With SimOptions::splitReplicas (DAPPLE,
//    dapple.md §4) every replica runs a 1/r slice of every microbatch
//    (times and activation bytes / r) and each overlapping pair of slices
//    of neighbouring stages is one message (split/concat, uneven counts
//    allowed); an op waits for all the slices it overlaps.
//  - Weight updates. Flush schedules: once all replicas of q finished their
//    last backward, they allreduce (topology.allreduceSeconds of q's
//    parameter bytes over q's devices) on the device's collective lane, then
//    each device runs the optimizer; the iteration ends when the last device
//    has. 2bw: after the last backward of batch j on stage q (all
//    replicas), allreduce + optimizer make W^(j+1), which the first forward
//    of batch j+2 waits for (thesis.md §3.1). 1f1b: replicas allreduce per
//    backward round (the l-th local backward of every replica); with weight
//    stashing a forward uses the newest version, and the forward of local
//    microbatch l follows the backward of l - K in program order (K the
//    replica's in-flight depth), so it waits for update round l - K.
//    The optimizer (the profile's opt_s of the stage's ops, plus
//    SimOptions::optimizerSecondsPerByte x parameter bytes) runs on the
//    rank's compute, as pipec's runtime runs it: flush schedules once per
//    step after the allreduce; 1f1b and 2bw as part of the backward op that
//    ends an update round (every local backward, or the rank's last
//    backward of a batch), together with the copy of the live weights into
//    a stashed version when the rank keeps more than one (1f1b with depth
//    K > 1; 2bw's shadow copy), at the profile's copy_bytes_per_s.
//  - Iteration time: flush schedules, the makespan of one step; 1f1b and
//    2bw, the steady-state time per m microbatches: the completion times of
//    steps (the end of the step's last backward op anywhere) differenced
//    over a window of whole round-robin periods between the fill and the
//    drain (see chooseSteps()).
//  - Memory of one stage replica: weights x versions (1, p - s for 1f1b
//    stage s, 2 for 2bw; counted on the rank program), gradients (one
//    accumulator), optimizer state (factor x parameters), activations
//    (saved_bytes x peak in-flight, or stage input x peak in-flight + one
//    microbatch's saved bytes with recompute) and buffers (the peak of the
//    boundary tensors the replica holds in flight: sent but not yet
//    delivered, or delivered but not yet consumed).
//  - Shared devices (MadPipe's special processor, madpipe.md §2.4): when
//    several plan stages list the same device (allowed by
//    sharedDevicesAllowed()), each stage keeps its own rank program (the
//    schedule of the N-stage chain) and the device runs one op at a time.
//    Whenever the shared device is free, it starts, among the ranks whose
//    next op can start now, the op of the oldest microbatch, a backward (B
//    or W) before a forward at equal microbatch, then the lower rank: a
//    deterministic, work-conserving list schedule, decided at the earliest
//    time an op can start, after every completion at that time (decision
//    events sort after completions). Because the device never withholds a
//    ready op, sharing adds no deadlock: programs that run on separate
//    devices run when they share one, and programs that cannot finish are
//    still reported. Transfers between two stages of one device are free.
//    The device's memory sums its stages' weights x versions, gradients and
//    optimizer state, plus the peak over time of the activations stashed by
//    all its stages in the order the device ran them (between the two
//    orders of madpipe.md §2.4), plus the peak of all its buffers.
//
//===----------------------------------------------------------------------===//

#include "pipec/Arena.h"
#include "pipec/Sim.h"

#include "Trace.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <set>
#include <tuple>
#include <unordered_map>

namespace pipec {

namespace {

constexpr double kUnknown = -1.0; ///< a time not known yet (times are >= 0)

/// The ops whose results selective recomputation keeps
/// (passes/Recompute.cpp), by the profile's op name (the nn dialect's, or
/// ONNX's: Gemm, MatMul, Conv).
bool isExpensiveOp(std::string op) {
  for (char &ch : op)
    ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return op == "gemm" || op == "matmul" || op == "conv";
}

/// Ops the lowering runs as views of their operand (passes/KernelCalls.cpp,
/// isViewOp): no kernel, no bytes of their own.
bool isViewKind(const std::string &op) {
  return op == "reshape" || op == "flatten" || op == "identity";
}

/// One virtual stage (a plan stage).
struct VStage {
  int group = 0; ///< device position: the rank programs' stage index
  int chunk = 0;
  double fwd = 0, bwd = 0, bwdWeight = 0; ///< op durations per microbatch
  /// One optimizer update of the stage's parameters, and one copy of them
  /// into a stashed weight version.
  double optimizer = 0, versionCopy = 0;
  /// Continuous schedules: the compute an update round adds to the backward
  /// op that ends it (optimizer, and the version copy where one is kept).
  double update = 0;
  int64_t paramBytes = 0, savedBytes = 0, inputBytes = 0;
  /// Full recomputation (SimOptions::recompute, or the plan stage's
  /// "recompute": "full"): stash the inputs, re-run the forward in B.
  bool recompute = false;
  /// Arena model (the profile's memory_model "arena"): one stash slot per
  /// microbatch in flight, and the io and scratch regions, as the lowering
  /// lays them out.
  bool arena = false, oneSlot = false;
  int64_t slotBytes = 0, ioBytes = 0, scratchBytes = 0;
  /// Bytes stashed per microbatch in flight.
  int64_t stashBytes() const {
    return arena ? slotBytes : recompute ? inputBytes : savedBytes;
  }
  std::vector<int> inEdges, outEdges;
};

/// Tensors from virtual stage `from` to `to`, per microbatch.
struct Edge {
  int from = 0, to = 0;
  int64_t bytes = 0;
};

struct Rank {
  int group = 0, replica = 0, device = 0;
  std::vector<SchedOp> ops;
  size_t pc = 0;
  bool busy = false;
  double freeAt = 0;
  double busySeconds = 0;
  int64_t depth = 1; ///< forwards before the first backward (K)
  /// Per op of `ops`: 1 where that op ends one of the rank's update rounds
  /// (continuous schedules; see updateRounds()).
  std::vector<char> updatesAfter;
  /// Last-backward ops still to run, per chunk (flush bookkeeping).
  std::vector<int64_t> remaining;
};

/// An interval during which `bytes` sit in a communication buffer.
struct BufferInterval {
  double from, to;
  int64_t bytes;
};

/// The communication buffers of one rank and chunk: what it sent (from the
/// end of the sending op to the delivery) and what it received (from the
/// delivery to the start of the op that consumes it). Kept apart because
/// each list is appended in the rank's program order, so its start times
/// (sent) or end times (held) come sorted, and peakOf() need not sort them.
struct Buffers {
  std::vector<BufferInterval> sent, held;
};

/// Peak of the summed bytes of every interval of `lists`: a sweep over the
/// (time, +bytes) starts and (time, -bytes) ends in (time, delta) order,
/// releases before acquisitions at equal times. Each list's starts and its
/// ends are one run, sorted only when they are not already; the runs are
/// then merged.
int64_t peakOf(const std::vector<const std::vector<BufferInterval> *> &lists) {
  using Point = std::pair<double, int64_t>;
  std::vector<Point> points;
  std::vector<size_t> runEnds;
  for (const std::vector<BufferInterval> *intervals : lists)
    for (int side = 0; side < 2; ++side) {
      const size_t begin = points.size();
      for (const BufferInterval &i : *intervals)
        if (i.to > i.from && i.bytes != 0)
          points.push_back(side == 0 ? Point{i.from, i.bytes}
                                     : Point{i.to, -i.bytes});
      if (!std::is_sorted(points.begin() + begin, points.end()))
        std::sort(points.begin() + begin, points.end());
      if (points.size() > begin)
        runEnds.push_back(points.size());
    }
  // Merge neighbouring runs until one is left.
  while (runEnds.size() > 1) {
    std::vector<size_t> merged;
    size_t begin = 0;
    for (size_t i = 0; i < runEnds.size(); i += 2) {
      const size_t end = runEnds[std::min(i + 1, runEnds.size() - 1)];
      if (i + 1 < runEnds.size())
        std::inplace_merge(points.begin() + begin, points.begin() + runEnds[i],
                           points.begin() + end);
      merged.push_back(end);
      begin = end;
    }
    runEnds = std::move(merged);
  }
  int64_t live = 0, peak = 0;
  for (const Point &point : points) {
    live += point.second;
    peak = std::max(peak, live);
  }
  return peak;
}

std::string str(int64_t v) { return std::to_string(v); }

/// Calls fn(j, fraction) for every replica j of a stage with `to` replicas
/// whose slice of a microbatch overlaps the slice of replica i of a stage
/// with `from` replicas (split replicas, dapple.md §4: replica i of r holds
/// [i/r, (i+1)/r)); `fraction` is the overlap as a share of the microbatch.
/// In units of 1/(from*to) the slices are [i*to, (i+1)*to) and
/// [j*from, (j+1)*from), so the arithmetic is exact.
template <typename Fn> void forEachOverlap(int i, int from, int to, Fn fn) {
  const int64_t lo = int64_t(i) * to, hi = int64_t(i + 1) * to;
  for (int64_t j = lo / from; j < to && j * from < hi; ++j) {
    int64_t a = std::max(lo, j * from), b = std::min(hi, (j + 1) * from);
    if (b > a)
      fn(static_cast<int>(j),
         static_cast<double>(b - a) / (static_cast<double>(from) * to));
  }
}

/// Deliveries to the receiving slots of one kind of message, microbatch-
/// major (the ops of one microbatch on neighbouring stages touch
/// neighbouring entries): per microbatch k, row (an edge or a virtual
/// stage) and slot (the receiving replica with split replicas, else 0), the
/// latest delivery so far and how many are still missing.
struct Mailbox {
  std::vector<size_t> offset; ///< per row
  std::vector<int> expected;  ///< per row x slot: deliveries needed
  size_t stride = 0;
  std::vector<double> latest;
  std::vector<int> missing;

  /// `expected[row]` lists, per slot, the deliveries each slot waits for.
  void init(const std::vector<std::vector<int>> &perRow, int64_t microbatches) {
    offset.clear();
    expected.clear();
    for (const std::vector<int> &slots : perRow) {
      offset.push_back(expected.size());
      expected.insert(expected.end(), slots.begin(), slots.end());
    }
    stride = expected.size();
    latest.assign(stride * microbatches, 0);
    missing.resize(stride * microbatches);
    for (int64_t k = 0; k < microbatches; ++k)
      std::copy(expected.begin(), expected.end(),
                missing.begin() + static_cast<size_t>(k) * stride);
  }
  size_t index(int row, int64_t k, int slot) const {
    return static_cast<size_t>(k) * stride + offset[row] + slot;
  }
  void deliver(int row, int64_t k, int slot, double time) {
    size_t i = index(row, k, slot);
    latest[i] = std::max(latest[i], time);
    --missing[i];
  }
  bool known(int row, int64_t k, int slot) const {
    return missing[index(row, k, slot)] <= 0;
  }
  double time(int row, int64_t k, int slot) const {
    return latest[index(row, k, slot)];
  }
};

/// Lane 0 of a plan replicated alike (SimOptions::collapseLanes): the
/// simulator runs the one-replica plan of lane 0's devices and this says
/// what it stands for.
struct Lanes {
  int count = 1;      ///< r, the replicas of every stage (1: no collapse)
  bool split = false; ///< split replicas: lane j runs a 1/r slice of all
  /// Per device position, the devices of all r replicas (the allreduce's).
  std::vector<std::vector<int>> devices;

  bool roundRobin() const { return count > 1 && !split; }
};

class Simulator {
public:
  Simulator(const Profile &profile, const Topology &topology, const Plan &plan,
            const SimOptions &options, const ScheduleResult *given,
            const Lanes &lanes = Lanes())
      : profile(profile), topology(topology), plan(plan), options(options),
        given(given), lanes(lanes) {}

  SimResult run();

private:
  std::string setup();
  /// Why the plan, profile, options or topology cannot be simulated; sets
  /// `kind`.
  std::string checkInputs();
  /// The pipeline's shape: chunks, device positions, microbatches, the
  /// microbatch scale and the replicas of every device position.
  std::string setShape();
  std::string buildStages();
  void arenaOfStage(int q, const std::vector<bool> &sentOn);
  /// True when no stage before `end` trains a weight: no gradient flows
  /// back into stage `end` (its inputs get none), and a stage q with
  /// untrainedBefore(q + 1) has no backward at all.
  bool untrainedBefore(int end) const {
    return std::all_of(stages.begin(), stages.begin() + end,
                       [](const VStage &s) { return s.paramBytes == 0; });
  }
  std::vector<int64_t> gradientsHeldInIo(int q,
                                         const std::vector<bool> &sentOn) const;
  /// Per op first + i of stage q: the recomputed bytes live through its
  /// whole backward, and its backward working set with the recomputed
  /// values it reads last (arenaOfStage).
  struct RecomputedLifetimes {
    std::vector<int64_t> liveBefore, working;
  };
  RecomputedLifetimes
  recomputedLifetimes(int q, const std::vector<int64_t> &heldOf) const;
  /// The saved values of op k that the backward of a stage ending at op
  /// `last` reads, as (reader - k, bytes): the profile's saved_reads up to
  /// `last` (a value only a later stage reads is that stage's input), or
  /// without them all of saved_bytes, read by the op after k (at most
  /// `last`).
  std::vector<std::pair<int, int64_t>> savedReadsUpTo(int k, int last) const;
  std::string assignDevices();
  /// Steps to simulate and the steady-state window (continuous schedules);
  /// notes whether a device is shared. Returns the number of ranks.
  int chooseSteps();
  /// Takes the caller's rank programs after checking they fit the plan.
  std::string useGivenPrograms(int totalRanks);
  /// Generates the schedule's rank programs (one copy per replica with
  /// split replicas).
  std::string generatePrograms();
  /// One Rank per rank program, and the devices in order of first use.
  void buildRanks();
  std::string simulate();
  void account(SimResult &result);

  // Results (account() in pieces).
  /// Per rank and op: 1 when the op is the last backward op (B, or W after
  /// it) of its (microbatch, chunk), where its stashed activations leave.
  using LastBackward = std::vector<std::vector<char>>;
  /// Iteration time: for flush schedules the makespan of the step with the
  /// optimizer (traced), else the steady state measured between the fill
  /// and the drain.
  double iterationTime();
  /// Iteration time, throughput, bubble and idle fractions of `result`.
  void accountTime(SimResult &result, double iteration) const;
  /// The LastBackward of every rank's program.
  LastBackward lastBackwardOps() const;
  /// Peak of the stashed activation bytes over a sequence of (rank, op
  /// index) in execution order: a rank's program, or the ops a shared
  /// device ran.
  int64_t activationPeak(const std::vector<std::pair<int, size_t>> &run,
                         LastBackward &lastBackward) const;
  /// Memory per plan stage (its largest replica) and peak in-flight counts;
  /// per rank its static bytes (weights x versions, gradients, optimizer
  /// state) and largest saved bytes.
  /// (rankBuffers: the buffers' peak per rank when v = 1.)
  void accountStageMemory(SimResult &result, LastBackward &lastBackward,
                          std::vector<int64_t> &rankStatic,
                          std::vector<int64_t> &rankMaxSaved,
                          std::vector<int64_t> &rankBuffers) const;
  /// Peak memory and busy time per device, and whether every device fits.
  void accountDevices(SimResult &result, LastBackward &lastBackward,
                      const std::vector<int64_t> &rankStatic,
                      const std::vector<int64_t> &rankMaxSaved,
                      const std::vector<int64_t> &rankBuffers) const;
  /// F + B + W of virtual stage q per microbatch.
  double work(int q) const {
    return stages[q].fwd + stages[q].bwd + stages[q].bwdWeight;
  }
  /// The update compute of one rank of stage q per step of m microbatches
  /// (continuous schedules): 1f1b updates after each of its local
  /// backwards, 2bw once per batch.
  double updateWorkPerStep(int q) const {
    const double rounds =
        kind == ScheduleKind::OneFOneB
            ? static_cast<double>(m) / (split ? 1 : replicas[stages[q].group])
            : 1.0;
    return rounds * stages[q].update;
  }
  /// One rank of stage q's compute per step of m microbatches (continuous
  /// schedules): its share of the microbatches (each of them as a 1/r slice
  /// with split replicas) and its updates.
  double rankWorkPerStep(int q) const {
    return static_cast<double>(m) * work(q) /
               (split ? 1 : replicas[stages[q].group]) +
           updateWorkPerStep(q);
  }
  /// Marks the ops of rank r that end an update round (Rank::updatesAfter)
  /// and sets the update compute of its stages.
  void updateRounds(Rank &rank);

  // Event handling.
  void tryStart(int rank);
  /// Whether rank r's next op can start: false when an input, its own
  /// forward or a weight version is not known yet; else the earliest start
  /// (`ready`, at least the rank's and its device's free time) and the
  /// op's duration.
  bool startable(int r, double &ready, double &duration) const;
  /// Starts rank r's next op at `ready` for `duration`.
  void start(int r, double ready, double duration);
  /// Shared devices: asks device d to choose its next op at `time`.
  void requestDecision(int d, double time);
  /// Shared devices: runs the list schedule of device d at `now`.
  void decide(int d);
  bool sharedRank(int r) const { return deviceRanks[rankDevice[r]].size() > 1; }
  void complete(int rank, double time);
  void lastBackwardDone(int q, int rank, int64_t k, double time);
  /// A new weight version of group g's stage: its forwards may start.
  void wakeReplicas(int g) {
    for (int j = 0; j < replicas[g]; ++j)
      woken.push_back(firstRank[g] + j);
  }
  /// Schedules an allreduce + optimizer on group g's collective lane after
  /// `ready`; returns its end.
  double update(int q, double ready, int64_t round);
  /// Sends `bytes` of microbatch k from rank `sender` (running virtual
  /// stage q) to rank `receiver` once `ready`; returns the arrival time.
  double transfer(int64_t bytes, int sender, int receiver, double ready, int q,
                  int64_t k, bool gradient);
  std::string describeWait(int rank) const;

  int groupOf(int q) const {
    return interleaved ? int(positionOfStage(placement, p, q)) : q;
  }
  /// The virtual stage of chunk c on device position g.
  int stageOf(int c, int g) const {
    return int(stageOfChunk(placement, p, g, c));
  }
  /// 1F1B-RR: the rank of virtual stage q that runs microbatch k.
  int rankFor(int q, int64_t k) const {
    int g = groupOf(q);
    return firstRank[g] + static_cast<int>(k % replicas[g]);
  }
  int virtualStage(int rank, const SchedOp &op) const {
    return stageOf(op.chunk, ranks[rank].group);
  }
  /// Mailbox slot of a rank: its replica with split replicas, else 0.
  int slotOf(int rank) const { return split ? ranks[rank].replica : 0; }
  /// Position of microbatch k among the microbatches its replica runs.
  int64_t localIndex(int g, int64_t k) const {
    return split ? k : k / replicas[g];
  }
  /// Sends the boundary tensors of op (q, k) that just ended on `rank` at
  /// `time` along `edgeList` (activations or gradients).
  void send(int rank, int q, int64_t k, double time, bool gradient);
  bool needsUpdateGate() const {
    return kind == ScheduleKind::OneFOneB || kind == ScheduleKind::TwoBW;
  }
  /// zb-h1, or a custom schedule with W ops: B is the input gradient and W
  /// the weight gradient (set once the programs are known).
  bool splitBackward() const { return weightOps; }

  const Profile &profile;
  const Topology &topology;
  const Plan &plan;
  const SimOptions &options;
  const ScheduleResult *given; ///< caller's programs, or null
  const Lanes lanes;           ///< what lane 0 stands for (count 1: itself)

  ScheduleKind kind = ScheduleKind::GPipe;
  bool interleaved = false;
  bool weightOps = false;
  /// Where chunks run (V for zb-v and V-shaped custom schedules).
  Placement placement = Placement::Loop;
  int p = 1;     ///< device positions
  int v = 1;     ///< chunks
  int numQ = 0;  ///< virtual stages p*v
  int64_t m = 1; ///< microbatches per step
  int64_t steps = 1;
  int64_t measureFrom = 0, measureLast = 0; ///< steady-state window
  int64_t numMicrobatches = 0;              ///< m * steps
  double sigma = 1;                         ///< microbatch scale
  std::vector<int> replicas;                ///< per group
  std::vector<int> firstRank; ///< per group: rank of its replica 0
  std::vector<std::vector<int>> groupDevices;
  bool split = false; ///< DAPPLE split replicas instead of 1F1B-RR
  std::vector<VStage> stages;
  std::vector<Edge> edges;
  ScheduleResult schedule;
  std::vector<Rank> ranks;

  // Forwards done per (virtual stage, slot), activations per (edge,
  // consuming slot), gradients per (edge, producing slot).
  Mailbox forwards, activations, gradients;
  // Update rounds (1f1b: local backward round; 2bw: batch) per stage: when
  // the new version is ready, how many backwards it still waits for, and
  // the latest of those that ended.
  std::vector<std::vector<double>> updateReady, updateLatest;
  std::vector<std::vector<int>> updateCount;
  std::vector<double> laneFree;     ///< collective lane per group
  std::vector<double> stageReduced; ///< flush: allreduce end per stage
  std::vector<int> replicasDone;    ///< flush: replicas finished per stage
  std::vector<double> stageLastBackward;
  std::vector<double> stepEnd;
  /// The directed links out of each device (by device id; a device sends
  /// to few others): where to, the topology level crossed, free time.
  struct Link {
    int dst, level;
    double free;
  };
  std::vector<std::vector<Link>> links;
  Link &linkOf(int src, int dst) {
    if (static_cast<size_t>(src) >= links.size())
      links.resize(static_cast<size_t>(src) + 1);
    for (Link &l : links[static_cast<size_t>(src)])
      if (l.dst == dst)
        return l;
    links[static_cast<size_t>(src)].push_back(
        {dst, topology.levelBetween(src, dst), 0.0});
    return links[static_cast<size_t>(src)].back();
  }
  std::vector<int> woken; ///< ranks to retry after an event
  /// Buffer intervals per rank x chunk.
  std::vector<Buffers> buffers;

  /// Devices the ranks run on, in order of first use: deviceRanks[d] lists
  /// the ranks of device d (several for a shared device), rankDevice[r] is
  /// the index d of rank r's device.
  std::vector<std::vector<int>> deviceRanks;
  std::vector<int> rankDevice;
  bool sharedPlan = false; ///< some device runs several stages
  /// Shared devices: busy flag, free time, the pending decision (+inf when
  /// none) and the ops run, in order, as (rank, op index).
  std::vector<char> deviceBusy;
  std::vector<double> deviceFree, decisionAt;
  std::vector<std::vector<std::pair<int, size_t>>> deviceLog;

  /// Processor sharing (topology levels with `processors`): the ranks of a
  /// group run their ops at once, each at min(1, processors / running) of
  /// its speed. Per group the running ops with the work they have left
  /// (seconds at full speed) as of `last`; per rank its op's work, start
  /// and the completion time last scheduled (an older completion event is
  /// stale).
  struct PsGroup {
    int processors = 1;
    double rate = 1, last = 0;
    std::vector<std::pair<int, double>> running;
  };
  std::vector<PsGroup> psGroups;
  std::vector<int> psGroupOfRank; ///< -1: a processor of its own
  /// Per running id (ranks, then messages) its work, start and scheduled
  /// completion.
  std::vector<double> psWork, psBegin, psFinish;
  bool psRank(int r) const {
    return !psGroups.empty() && psGroupOfRank[r] >= 0;
  }
  /// A message between two devices of one processor-sharing group: its
  /// copies (staging, MPI's copies, a GPU's copies to and from the host)
  /// are work of the processors the group shares, so it runs in the
  /// group's sharing, `work` = the link's time at full speed, and arrives
  /// when it ends (running id ranks.size() + its index).
  struct PsMessage {
    int group = -1, sender = 0, receiver = 0, q = 0, row = 0, slot = 0;
    int64_t k = 0, bytes = 0;
    bool gradient = false;
    double ready = 0;
  };
  std::vector<PsMessage> psMessages;
  int psGroupOf(int id) const {
    return id < static_cast<int>(ranks.size())
               ? psGroupOfRank[id]
               : psMessages[id - ranks.size()].group;
  }
  /// Starts a message in its group's sharing (psMessages), unless the two
  /// ranks do not share processors: false then.
  bool psSend(int64_t bytes, int sender, int receiver, int q, int64_t k,
              bool gradient, int row, int slot);
  void psMessageArrived(PsMessage message, double time);
  std::string setUpProcessorSharing();
  /// Brings group g's running ops to `now`, then gives every one its new
  /// completion time at the group's new rate.
  void psReschedule(int g);
  void psAdvance(int g);
  void psBeginOp(int r);
  void psEndOp(int r, double time);
  /// The trace event of rank r's current op, run from `start` for
  /// `length` seconds.
  void traceCompute(int r, double start, double length);

  /// (time, kind, id), min-heap: kind 0 completes rank id's op, kind 1 is a
  /// decision of shared device id, after every completion at that time;
  /// with processor sharing kind 2 may complete rank id's op (if `time` is
  /// still its completion time) and kind 3 starts it.
  using Event = std::tuple<double, int, int>;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  /// Without shared devices (and without a trace) nothing depends on the
  /// order in which completions are handled: each rank runs one op at a
  /// time in program order, a link carries one rank's sends in its program
  /// order, an update lane serves one stage's rounds in order, and every
  /// other record is keyed by stage and microbatch. Completions then go on
  /// this stack instead of the time-ordered heap (same results, less work).
  bool anyOrder = false;
  std::vector<std::pair<double, int>> completions;
  double now = 0; ///< time of the event being handled
  std::vector<sim::TraceEvent> trace;
  double computeSeconds = 0;
  std::string failure; ///< a non-finite time found while simulating
};

//===----------------------------------------------------------------------===//
// Setup
//===----------------------------------------------------------------------===//

std::string Simulator::setup() {
  std::string error = checkInputs();
  if (!error.empty())
    return error;
  error = setShape();
  if (!error.empty())
    return error;
  error = assignDevices();
  if (!error.empty())
    return error;

  // With split replicas every replica runs every microbatch: the programs
  // are those of a straight pipeline.
  split = options.splitReplicas;
  if (split && given)
    return "simulateSchedule takes round-robin replicas (1F1B-RR) only";
  const int totalRanks = chooseSteps();
  error = given ? useGivenPrograms(totalRanks) : generatePrograms();
  if (!error.empty())
    return error;
  weightOps =
      kind == ScheduleKind::ZeroBubbleH1 || kind == ScheduleKind::ZeroBubbleH2;
  // (The loop bodies say it: no need to expand them.)
  for (const RankSchedule &program : schedule.ranks)
    for (const Segment &segment : program.schedule.segments)
      for (const SchedOp &op : segment.body)
        weightOps |= op.kind == PassKind::BackwardWeight;
  numMicrobatches = m * steps;

  error = buildStages();
  if (!error.empty())
    return error;
  firstRank.assign(p, 0);
  for (int g = 1; g < p; ++g)
    firstRank[g] = firstRank[g - 1] + replicas[g - 1];
  buildRanks();
  return "";
}

std::string Simulator::checkInputs() {
  const int numLayers = static_cast<int>(profile.ops.size());
  std::string error = validatePlan(plan, numLayers);
  if (!error.empty())
    return "invalid plan: " + error;
  auto parsed = parseScheduleKind(plan.schedule);
  if (!parsed) {
    std::string names;
    for (const std::string &name : scheduleKindNames())
      names += (names.empty() ? "" : ", ") + name;
    return "unknown schedule '" + plan.schedule + "' (available: " + names +
           ")";
  }
  kind = *parsed;
  if (profile.microbatch < 1)
    return "the profile's microbatch size must be at least 1 (got " +
           str(profile.microbatch) + ")";
  for (int i = 0; i < numLayers; ++i) {
    const ProfileOp &op = profile.ops[i];
    if (!std::isfinite(op.fwdSeconds) || op.fwdSeconds < 0 ||
        !std::isfinite(op.bwdSeconds) || op.bwdSeconds < 0)
      return "op " + str(i) + " ('" + op.name +
             "') has a negative or non-finite time";
    if (op.outBytes < 0 || op.paramBytes < 0 || op.savedBytes < 0)
      return "op " + str(i) + " ('" + op.name + "') has negative sizes";
  }
  if (!(options.weightGradFraction >= 0 && options.weightGradFraction <= 1))
    return "weightGradFraction must be in [0, 1]";
  if (!(options.optimizerSecondsPerByte >= 0))
    return "optimizerSecondsPerByte must be >= 0";
  if (topology.numDevices() < 1)
    return "the topology has no devices";
  return "";
}

std::string Simulator::setShape() {
  // Several chunks per device: interleaved, zb-v, or a custom schedule
  // (from a CSV) in a loop or a V.
  interleaved = kind == ScheduleKind::Interleaved ||
                kind == ScheduleKind::ZeroBubbleV ||
                kind == ScheduleKind::DualPipeV ||
                (kind == ScheduleKind::Custom && plan.chunks > 1);
  placement = given ? given->placement : placementOf(kind);
  v = plan.chunks;
  numQ = plan.numStages();
  if (v > 1 && !interleaved)
    return "chunks = " + str(v) + " needs the interleaved schedule (got '" +
           plan.schedule + "')";
  if (interleaved && numQ % v != 0)
    return "an interleaved plan lists its p*v virtual stages: " + str(numQ) +
           " stages is not a multiple of chunks v = " + str(v);
  p = numQ / v;
  m = plan.microbatches;
  sigma = static_cast<double>(plan.microbatchSize) / profile.microbatch;

  replicas.assign(p, 1);
  for (int g = 0; g < p; ++g)
    replicas[g] = plan.stages[g].replicas;
  for (int q = p; q < numQ; ++q)
    if (plan.stages[q].replicas != replicas[groupOf(q)])
      return "virtual stage " + str(q) + " has " +
             str(plan.stages[q].replicas) + " replicas but runs on the " +
             "devices of stage " + str(groupOf(q)) + ", which has " +
             str(replicas[groupOf(q)]);
  return "";
}

int Simulator::chooseSteps() {
  // Continuous schedules: enough steps to measure between the fill and the
  // drain, over a window of whole round-robin periods. The fill admits at
  // most sum r_s microbatches (p with split replicas) before the first
  // backward returns, and the drain runs as many backwards without
  // forwards; rank programs repeat every lcm(r_s) microbatches, i.e. every
  // lcm / gcd(lcm, m) steps; the window spans at least 8 steps and 32
  // microbatches so that the cyclic steady state of the max-plus system
  // averages out. A shared device's greedy order need not settle into a
  // short cycle (its backlog at step ends fluctuates by about one op), so
  // plans with one get a window of at least 16 steps and 64 microbatches
  // (and iterationTime() bounds their period by the busiest device's work).
  std::set<int> used;
  for (const std::vector<int> &devices : groupDevices)
    for (int device : devices)
      sharedPlan |= !used.insert(device).second;
  int totalRanks = 0;
  int64_t period = 1;
  for (int r : replicas) {
    totalRanks += r;
    if (period <= 4096 && !split)
      period = period / std::gcd<int64_t>(period, r) * r;
  }
  // A collapsed plan takes the steps of the plan it stands for: m and the
  // ranks of all lanes (its period, r, divides m).
  const int64_t mAll = lanes.roundRobin() ? m * lanes.count : m;
  const int64_t depth =
      split ? p : totalRanks * (lanes.roundRobin() ? lanes.count : 1);
  if (isFlushSchedule(kind)) {
    steps = 1;
  } else {
    const int64_t periodSteps = period / std::gcd<int64_t>(period, mAll);
    const int64_t fill = (2 * depth + mAll - 1) / mAll + 1;
    const int64_t drain = fill;
    const int64_t minWindow =
        sharedPlan ? std::max<int64_t>(16, (64 + mAll - 1) / mAll)
                   : std::max<int64_t>(8, (32 + mAll - 1) / mAll);
    int64_t window =
        ((minWindow + periodSteps - 1) / periodSteps) * periodSteps;
    steps = std::max<int64_t>(options.steps, fill + window + drain + 1);
    // Widen the window to whole periods within the steps asked for.
    window = ((steps - 1 - drain - fill) / periodSteps) * periodSteps;
    measureLast = steps - 1 - drain;
    measureFrom = measureLast - window;
  }
  return totalRanks;
}

std::string Simulator::useGivenPrograms(int totalRanks) {
  if (!given->ok)
    return "the schedule is not valid: " + given->error;
  if (given->kind != kind || given->stages != p || given->chunks != v ||
      given->replicas != replicas || given->microbatches != m ||
      given->ranks.size() != static_cast<size_t>(totalRanks))
    return "the schedule does not match the plan (kind, stages, chunks, "
           "replicas, microbatches or rank count differ)";
  if (isFlushSchedule(kind) && given->steps != 1)
    return "a flush schedule runs one step (got steps = " + str(given->steps) +
           ")";
  schedule = *given;
  if (!isFlushSchedule(kind)) {
    // The caller's steps: from the end of the first to the end of the
    // last (fill and drain included).
    steps = std::max<int64_t>(given->steps, 1);
    measureFrom = steps >= 2 ? 0 : -1;
    measureLast = steps - 1;
  }
  for (size_t i = 0; i < schedule.ranks.size(); ++i) {
    const RankSchedule &program = schedule.ranks[i];
    if (schedule.rankOf(program.stage, program.replica) != static_cast<int>(i))
      return "rank program " + str(i) + " names stage " + str(program.stage) +
             " replica " + str(program.replica) +
             "; programs must be listed stage-major, replica-minor";
  }
  return "";
}

std::string Simulator::generatePrograms() {
  ScheduleOptions scheduleOptions;
  scheduleOptions.chunks = v;
  scheduleOptions.warmup = options.warmupPolicy;
  scheduleOptions.maxInflight = options.maxInflight;
  scheduleOptions.steps = steps;
  scheduleOptions.replicas = replicas;
  if (split) {
    // The straight pipeline's programs, but the divisibility rules of
    // interleaving apply to m itself (every replica runs all of it).
    scheduleOptions.replicas.assign(p, 1);
  }
  schedule = generateSchedule(kind, p, m, scheduleOptions);
  if (!schedule.ok)
    return schedule.error;
  if (split) {
    // One copy of stage g's program per replica.
    std::vector<RankSchedule> copies;
    for (const RankSchedule &program : schedule.ranks)
      for (int j = 0; j < replicas[program.stage]; ++j)
        copies.push_back({program.stage, j, program.schedule});
    schedule.ranks = std::move(copies);
    schedule.replicas = replicas;
  }
  return "";
}

void Simulator::buildRanks() {
  for (const RankSchedule &program : schedule.ranks) {
    Rank rank;
    rank.group = program.stage;
    rank.replica = program.replica;
    rank.device = groupDevices[rank.group][rank.replica];
    rank.ops = program.schedule.flatten();
    rank.depth = 0;
    while (rank.depth < static_cast<int64_t>(rank.ops.size()) &&
           rank.ops[rank.depth].kind == PassKind::Forward)
      ++rank.depth;
    rank.remaining.assign(v, 0);
    for (const SchedOp &op : rank.ops)
      if (op.kind == PassKind::Forward)
        ++rank.remaining[op.chunk];
    updateRounds(rank);
    ranks.push_back(std::move(rank));
  }
  // Devices in order of first use; a device listed by several stages runs
  // all their ranks.
  std::map<int, int> deviceIndex;
  rankDevice.assign(ranks.size(), 0);
  for (size_t r = 0; r < ranks.size(); ++r) {
    auto [it, inserted] = deviceIndex.emplace(
        ranks[r].device, static_cast<int>(deviceRanks.size()));
    if (inserted)
      deviceRanks.emplace_back();
    deviceRanks[it->second].push_back(static_cast<int>(r));
    rankDevice[r] = it->second;
  }
}

std::string Simulator::assignDevices() {
  const int numDevices = topology.numDevices();
  // Several stages on one device: a MadPipe special processor when the plan
  // asks for it, otherwise an accidental overlap.
  const bool mayShare = !interleaved && sharedDevicesAllowed(plan, options);
  groupDevices.assign(p, {});
  std::map<int, int> owner; // device -> group
  for (int g = 0; g < p; ++g)
    for (int device : plan.stages[g].devices) {
      if (device < 0 || device >= numDevices)
        return "stage " + str(g) + " uses device " + str(device) +
               " but the topology has " + str(numDevices) + " devices";
      auto [it, inserted] = owner.emplace(device, g);
      if (!inserted && !mayShare)
        return "device " + str(device) + " is assigned to stage " +
               str(it->second) + " and stage " + str(g) +
               "; a device runs one stage (several chunks per device need "
               "the interleaved schedule; several stages per device, "
               "MadPipe's special processor, need a madpipe plan or "
               "SimOptions::allowSharedDevices)";
      groupDevices[g].push_back(device);
    }
  for (int q = p; q < numQ; ++q)
    if (!plan.stages[q].devices.empty() &&
        plan.stages[q].devices != plan.stages[groupOf(q)].devices)
      return "virtual stage " + str(q) + " (chunk " +
             str(chunkOfStage(placement, p, q)) +
             ") must run on the devices of stage " + str(groupOf(q));
  // Stages without devices get the lowest unused ids.
  int next = 0;
  for (int g = 0; g < p; ++g) {
    if (!groupDevices[g].empty())
      continue;
    for (int j = 0; j < replicas[g]; ++j) {
      while (owner.count(next))
        ++next;
      if (next >= numDevices)
        return "the plan needs more devices than the topology's " +
               str(numDevices);
      owner[next] = g;
      groupDevices[g].push_back(next);
    }
  }
  return "";
}

std::string Simulator::buildStages() {
  const int numLayers = static_cast<int>(profile.ops.size());
  const double alpha = options.weightGradFraction;
  std::vector<int> stageOfLayer(numLayers, 0);
  stages.assign(numQ, {});
  for (int q = 0; q < numQ; ++q) {
    const StagePlan &plan_ = plan.stages[q];
    VStage &stage = stages[q];
    stage.group = groupOf(q);
    stage.chunk = int(chunkOfStage(placement, p, q));
    double fwd = 0, bwd = 0, cheapFwd = 0, overheadFwd = 0, overheadBwd = 0;
    int64_t saved = 0;
    for (int l = plan_.firstLayer; l <= plan_.lastLayer; ++l) {
      stageOfLayer[l] = q;
      fwd += profile.ops[l].fwdSeconds;
      bwd += profile.ops[l].bwdSeconds;
      // The runtime's time per op call (not scaled with the microbatch).
      overheadFwd += profile.opOverheadSeconds;
      if (profile.ops[l].bwdSeconds > 0)
        overheadBwd += profile.opOverheadSeconds;
      stage.optimizer += profile.ops[l].optSeconds;
      stage.paramBytes += profile.ops[l].paramBytes;
      saved += profile.ops[l].savedBytes;
      if (!isExpensiveOp(profile.ops[l].op))
        cheapFwd += profile.ops[l].fwdSeconds;
    }
    stage.fwd = sigma * fwd + overheadFwd;
    double backward = sigma * bwd + overheadBwd;
    stage.recompute = options.recompute || plan_.recompute == "full";
    // Full recomputation runs the stage's forward again in its backward;
    // selective all but the GEMMs, matmuls and convolutions.
    double recomputeForward = stage.recompute ? stage.fwd
                              : plan_.recompute == "selective"
                                  ? sigma * cheapFwd
                                  : 0;
    if (splitBackward()) {
      stage.bwd = (1 - alpha) * backward + recomputeForward;
      stage.bwdWeight = alpha * backward;
    } else {
      stage.bwd = backward + recomputeForward;
    }
    stage.savedBytes = std::llround(sigma * static_cast<double>(saved));
    stage.optimizer +=
        options.optimizerSecondsPerByte * static_cast<double>(stage.paramBytes);
    if (profile.copyBytesPerSecond > 0)
      stage.versionCopy =
          static_cast<double>(stage.paramBytes) / profile.copyBytesPerSecond;
  }
  std::vector<bool> sentOn(size_t(numLayers), false);
  // One edge per (producing stage, consuming stage); a tensor counts once
  // per consuming stage.
  std::map<std::pair<int, int>, int64_t> edgeBytes;
  std::set<std::pair<int, int>> counted; // (tensor, consuming stage)
  for (int j = 0; j < numLayers; ++j)
    for (int t : profile.producersOf(j)) {
      if (t < 0 || t >= j)
        continue;
      int a = stageOfLayer[t], b = stageOfLayer[j];
      if (a >= b)
        continue;
      sentOn[size_t(t)] = true;
      int64_t &bytes = edgeBytes[{a, b}];
      if (counted.insert({t, b}).second)
        bytes +=
            std::llround(sigma * static_cast<double>(profile.ops[t].outBytes));
    }
  for (const auto &[link, bytes] : edgeBytes) {
    int e = static_cast<int>(edges.size());
    edges.push_back({link.first, link.second, bytes});
    stages[link.first].outEdges.push_back(e);
    stages[link.second].inEdges.push_back(e);
    stages[link.second].inputBytes += bytes;
  }
  if (profile.memoryModel == "arena")
    for (int q = 0; q < numQ; ++q)
      arenaOfStage(q, sentOn);
  if (split || lanes.split) {
    // Replica j of r runs a 1/r slice of every microbatch: time and
    // activation bytes scale with the slice (dapple.md §4, pitfall 5).
    for (VStage &stage : stages) {
      const double r = split ? replicas[stage.group] : lanes.count;
      stage.fwd /= r;
      stage.bwd /= r;
      stage.bwdWeight /= r;
      stage.savedBytes = std::llround(stage.savedBytes / r);
      stage.inputBytes = std::llround(stage.inputBytes / r);
      stage.slotBytes = std::llround(stage.slotBytes / r);
      stage.ioBytes = std::llround(stage.ioBytes / r);
      stage.scratchBytes = std::llround(stage.scratchBytes / r);
    }
  }
  return "";
}

/// What op first + i of stage q finds live in io during its backward, of
/// the gradients the one-stage profile's working sets (bwd_scratch_bytes)
/// counted in scratch (arenaOfStage subtracts it from them).
std::vector<int64_t>
Simulator::gradientsHeldInIo(int q, const std::vector<bool> &sentOn) const {
  const int first = plan.stages[q].firstLayer, last = plan.stages[q].lastLayer;
  const size_t n = size_t(last - first + 1);
  // The gradient of an output t arrives in io. The one-stage profile's
  // backward had it in scratch from its later consumer's backward on:
  // through every op from t's last consumer in this stage on (t itself
  // and every op after it when none); that consumer adds its part to the
  // io buffer into a sum in scratch, which both count, but here the io
  // part is not in scratch. When no op of the stage reads t, the
  // io buffer is t's gradient itself, and an addition t passes it on to its
  // operands unchanged (same shape: no copy, the lowering aliases it): an
  // operand p's gradient is then the io buffer too, from t's backward down
  // to p's other last reader below t (the one that starts p's sum in
  // scratch), or down to p itself when t is its only reader, and on through
  // p when p is an addition as well (a residual stream's gradient crossing
  // several blocks). ioHeld[i]: the bytes of such io buffers that op
  // first + i's backward finds live, each buffer counted once.
  std::vector<int> lastUser(n, -1);
  std::vector<std::vector<int>> users(n);
  for (int l = first; l <= last; ++l)
    for (int t : profile.producersOf(l))
      if (t >= first && t < l) {
        lastUser[size_t(t - first)] = std::max(lastUser[size_t(t - first)], l);
        users[size_t(t - first)].push_back(l);
      }
  std::vector<int64_t> ioHeld(n, 0);
  for (int t = first; t <= last; ++t) {
    if (!sentOn[size_t(t)])
      continue;
    std::vector<bool> covered(n, false);
    auto cover = [&](int lo, int hi) {
      for (int l = lo; l <= hi; ++l)
        covered[size_t(l - first)] = true;
    };
    const int user = lastUser[size_t(t - first)];
    cover(user < 0 ? t : user, last);
    // The additions the io buffer passes through, and their operands.
    std::vector<int> through;
    if (user < 0)
      through.push_back(t);
    while (!through.empty()) {
      const int a = through.back();
      through.pop_back();
      const ProfileOp &add = profile.ops[size_t(a)];
      const std::vector<int> operands = profile.producersOf(a);
      if (add.op != "add" || operands.size() != 2 || operands[0] == operands[1])
        continue;
      for (int p : operands) {
        // (A smaller operand was broadcast: its gradient is a sum. A
        // larger one is an op with more outputs, batch_norm's statistics.)
        if (p < first || p >= a ||
            profile.ops[size_t(p)].outBytes < add.outBytes)
          continue;
        int below = -1;
        bool readAbove = false;
        for (int u : users[size_t(p - first)])
          if (u > a)
            readAbove = true; // p's sum started before a: in scratch
          else if (u < a)
            below = std::max(below, u);
        if (readAbove)
          continue;
        cover(below < 0 ? p : below, a);
        if (below < 0)
          through.push_back(p);
      }
    }
    const int64_t bytes = arenaAlign(profile.ops[size_t(t)].outBytes);
    for (size_t i = 0; i < covered.size(); ++i)
      if (covered[i])
        ioHeld[i] += bytes;
  }
  // The gradient of an input p (computed by an earlier stage) ends in io
  // too: once this stage's part of it is complete, at the backward of p's
  // first reader here, it sits in io while the ops before that reader run
  // their backwards; the one-stage profile still had it in scratch there
  // (p's earlier readers and p itself are in earlier stages). A sole
  // reader writes its part straight into io, so its own backward has it
  // there too.
  std::map<int, std::pair<int, int>> inputUser; // p -> first reader, count
  for (int l = last; l >= first; --l)
    for (int t : profile.producersOf(l))
      if (t >= 0 && t < first) {
        auto &[user, count] = inputUser[t];
        user = l;
        ++count;
      }
  if (!untrainedBefore(q))
    for (const auto &[t, reader] : inputUser)
      for (int l = first; l < reader.first + (reader.second == 1); ++l)
        ioHeld[size_t(l - first)] +=
            arenaAlign(profile.ops[size_t(t)].outBytes);
  return ioHeld;
}

/// Recomputation puts the saved values the slot does not hold (heldOf: the
/// bytes op first + i keeps there) in scratch at the start of the
/// backward; each lives until the backward of the op that reads it last
/// (the profile's saved_reads; without them, the op after the one that
/// computes it, which reads it as an input). Op l's backward therefore
/// finds the values whose last reader comes after it in the backward's
/// order (an earlier op) for its whole run, and those it reads last for
/// part of it: the profile's bwd_scratch_recomputed_bytes is that working
/// set, measured, when every value l reads last is recomputed; otherwise
/// they are added to bwd_scratch_bytes whole. Held bytes are taken off an
/// op's largest saved values first (an output sent on is its largest).
/// Values of earlier stages are held (the stage's inputs); values only a
/// later stage reads are its inputs, not this stage's.
std::vector<std::pair<int, int64_t>> Simulator::savedReadsUpTo(int k,
                                                               int last) const {
  const ProfileOp &op = profile.ops[size_t(k)];
  std::vector<std::pair<int, int64_t>> reads;
  for (auto [offset, bytes] : op.savedReads)
    if (k + offset <= last)
      reads.push_back({offset, bytes});
  if (op.savedReads.empty() && op.savedBytes > 0)
    reads.push_back({std::min(k + 1, last) - k, op.savedBytes});
  return reads;
}

Simulator::RecomputedLifetimes
Simulator::recomputedLifetimes(int q,
                               const std::vector<int64_t> &heldOf) const {
  const int first = plan.stages[q].firstLayer, last = plan.stages[q].lastLayer;
  const size_t n = size_t(last - first + 1);
  std::vector<int64_t> freed(n, 0);       // recomputed bytes op i reads last
  std::vector<bool> partlyHeld(n, false); // it reads last a held value too
  for (int k = 0; k <= last; ++k) {
    std::vector<std::pair<int, int64_t>> reads = savedReadsUpTo(k, last);
    std::stable_sort(
        reads.begin(), reads.end(),
        [](const auto &a, const auto &b) { return a.second > b.second; });
    int64_t heldLeft = k < first ? 0 : heldOf[size_t(k - first)];
    for (auto [offset, bytes] : reads) {
      const int reader = k + offset;
      if (k < first) {
        if (reader >= first)
          partlyHeld[size_t(reader - first)] = true;
        continue;
      }
      const size_t at = size_t(std::max(reader, first) - first);
      const int64_t held = std::min(bytes, heldLeft);
      heldLeft -= held;
      if (held > 0)
        partlyHeld[at] = true;
      freed[at] += bytes - held;
    }
  }
  RecomputedLifetimes lifetimes{std::vector<int64_t>(n, 0),
                                std::vector<int64_t>(n, 0)};
  int64_t live = 0;
  for (size_t i = 0; i < n; ++i) {
    const ProfileOp &op = profile.ops[size_t(first) + i];
    lifetimes.liveBefore[i] = live;
    live += freed[i];
    lifetimes.working[i] = freed[i] == 0 ? op.bwdScratchBytes
                           : !partlyHeld[i] && op.bwdRecomputedScratchBytes > 0
                               ? op.bwdRecomputedScratchBytes
                               : op.bwdScratchBytes + freed[i];
  }
  return lifetimes;
}

/// The arena model of stage q (memory_model "arena", the layout of
/// passes/LowerToRuntime): a stash slot holds the stage's inputs, its
/// outputs (sent on) and what its backward keeps (saved_bytes, charged to
/// the op that computes the value; an output the backward reads is held
/// once); io holds the gradients of the inputs and of the outputs; scratch
/// is the largest working set of one op (fwd/bwd_scratch_bytes). With
/// recomputation (passes/Recompute.cpp) `full` keeps nothing but inputs and
/// outputs and `selective` also the results of GEMMs, matmuls and
/// convolutions (the recomputed ops start from them); the backward first
/// recomputes the rest in scratch, op by op (each op's forward working set
/// on top of what was recomputed before it), then frees it as its sweep
/// passes (each recomputed value once the op that reads it last has read
/// it: recomputedLifetimes).
/// Zero-bubble schedules also carry values from the backward's input half
/// to its weight half in the slot (carried_bytes). Gradients the stage
/// holds in io (its outputs', passed on through additions, and its
/// inputs') come off the one-stage working sets, which had them in
/// scratch (ioHeld below).
void Simulator::arenaOfStage(int q, const std::vector<bool> &sentOn) {
  const StagePlan &plan_ = plan.stages[q];
  VStage &stage = stages[q];
  const std::string mode =
      options.recompute ? "full"
                        : (plan_.recompute.empty() ? "none" : plan_.recompute);
  auto expensive = [&](int l) {
    return isExpensiveOp(profile.ops[size_t(l)].op);
  };
  const int first = plan_.firstLayer, last = plan_.lastLayer;
  // Selective: the expensive ops whose results the recomputed ops start
  // from (found backwards from every cheap op whose value the backward
  // needs and the slot does not hold anyway).
  std::vector<bool> needed(size_t(last - first + 1), false),
      startsFrom(needed.size(), false);
  if (mode == "selective")
    for (int l = last; l >= first; --l) {
      // (A value sent on is read from the slot, not recomputed.)
      const ProfileOp &op = profile.ops[size_t(l)];
      if (expensive(l) || sentOn[size_t(l)] ||
          !(needed[size_t(l - first)] || op.savedBytes > 0))
        continue;
      for (int t : profile.producersOf(l))
        if (t >= first && t < l)
          (expensive(t) ? startsFrom : needed)[size_t(t - first)] = true;
    }
  const std::vector<int64_t> ioHeld = gradientsHeldInIo(q, sentOn);
  // What the stage's backward reads of each op's saved values.
  std::vector<int64_t> savedHere(needed.size(), 0);
  for (int l = first; l <= last; ++l)
    for (auto [offset, bytes] : savedReadsUpTo(l, last))
      savedHere[size_t(l - first)] += bytes;
  // What each op stashes in the slot (selective: the expensive ops'
  // results the recomputed ops start from; outputs sent on).
  std::vector<int64_t> heldOf(needed.size(), 0);
  for (int l = first; l <= last; ++l) {
    const ProfileOp &op = profile.ops[size_t(l)];
    const int64_t saved = savedHere[size_t(l - first)];
    int64_t &held = heldOf[size_t(l - first)];
    held = mode == "none" ? saved
           : mode == "selective" && expensive(l)
               ? std::max(saved, startsFrom[size_t(l - first)]
                                     ? arenaAlign(op.outBytes)
                                     : 0)
               : 0;
    if (sentOn[size_t(l)])
      held = std::max(held, arenaAlign(op.outBytes));
  }
  const RecomputedLifetimes lifetimes = recomputedLifetimes(q, heldOf);
  // The ops the recomputation runs: those whose values the stage's
  // backward reads and the slot does not hold, and the ops feeding them;
  // an op whose result is in the slot (an output sent on, a selective
  // start) is read from there.
  // (Consumers come first: an op that runs marks what it reads.)
  std::vector<bool> runs(needed.size(), false), fed(needed.size(), false);
  for (int l = last; l >= first && mode != "none"; --l) {
    const size_t i = size_t(l - first);
    const ProfileOp &op = profile.ops[size_t(l)];
    if (sentOn[size_t(l)] ||
        (heldOf[i] > 0 && heldOf[i] >= arenaAlign(op.outBytes)))
      continue;
    runs[i] = fed[i] || savedHere[i] > heldOf[i];
    if (runs[i])
      for (int t : profile.producersOf(l))
        if (t >= first && t < l)
          fed[size_t(t - first)] = true;
  }
  int64_t slot = 0, outputs = 0, plain = 0;
  int64_t recomputed = 0, forwardPeak = 0, backwardPeak = 0;
  // A split backward (zero bubble) carries the weight half's inputs in the
  // slot: what the input half computes for it (carried_bytes) in a stage
  // whose inputs get gradients; in a stage whose inputs get none (the
  // first, or one after stages without weights), whose input half computes
  // nothing, the gradients of its outputs (they arrive in io).
  const bool inputGradients = !untrainedBefore(q);
  const bool carries = splitBackward() && inputGradients;
  for (int l = first; l <= last; ++l) {
    const ProfileOp &op = profile.ops[size_t(l)];
    if (carries)
      slot += op.carriedBytes;
    const size_t i = size_t(l - first);
    const int64_t held = heldOf[i];
    if (sentOn[size_t(l)])
      outputs += arenaAlign(op.outBytes);
    const int64_t backward =
        std::max<int64_t>(0, op.bwdScratchBytes - ioHeld[i]);
    slot += held;
    plain = std::max({plain, op.fwdScratchBytes, backward});
    if (runs[i])
      forwardPeak = std::max(forwardPeak, recomputed + op.fwdScratchBytes);
    // Op l's backward finds every recomputed value some op at or before it
    // still reads: in full those whose last reader is before it, and its
    // own working set with those it reads last.
    backwardPeak =
        std::max(backwardPeak,
                 lifetimes.liveBefore[i] +
                     std::max<int64_t>(0, lifetimes.working[i] - ioHeld[i]));
    // (A view of a stage input, stashed as a copy without recomputation,
    // is recomputed as a view again: no bytes.)
    if (!isViewKind(op.op))
      recomputed += std::max<int64_t>(0, savedHere[i] - held);
  }
  // A stage with no trained weight in or before it gets no gradient: it
  // has no backward, receives no gradient of its outputs, and its
  // microbatches share one slot. Its inputs get no gradient either when no
  // stage before it trains a weight.
  stage.oneSlot = untrainedBefore(q + 1);
  if (stage.oneSlot)
    outputs = 0;
  if (splitBackward() && !carries)
    slot += outputs;
  // The data feeds' tensors: the model inputs in the first stage, the
  // labels in the last (the loss).
  if (q == 0)
    slot += arenaAlign(profile.inputBytes);
  if (q == numQ - 1)
    slot += arenaAlign(profile.labelBytes);
  const int64_t scratch =
      mode == "none" ? plain
                     : std::max({plain, forwardPeak, recomputed, backwardPeak});
  auto scaled = [&](int64_t bytes) {
    return std::llround(sigma * static_cast<double>(bytes));
  };
  stage.arena = true;
  stage.slotBytes = stage.inputBytes + scaled(slot);
  stage.ioBytes = (inputGradients ? stage.inputBytes : 0) + scaled(outputs);
  stage.scratchBytes = scaled(scratch);
}

//===----------------------------------------------------------------------===//
// Event simulation
//===----------------------------------------------------------------------===//

double Simulator::transfer(int64_t bytes, int sender, int receiver,
                           double ready, int q, int64_t k, bool gradient) {
  const int src = ranks[sender].device, dst = ranks[receiver].device;
  if (src == dst)
    return ready;
  Link &link = linkOf(src, dst);
  double seconds = topology.p2pSecondsAtLevel(bytes, link.level);
  if (!std::isfinite(seconds) || seconds < 0) {
    failure = "the transfer of " + str(bytes) + " bytes from device " +
              str(src) + " to device " + str(dst) +
              " takes no finite time (check the topology's bandwidth)";
    seconds = 0;
  }
  double &free = link.free;
  double start = std::max(ready, free);
  double end = start + seconds;
  free = end;
  if (options.trace && seconds > 0) {
    std::string name = gradient ? "gradient" : "activation";
    trace.push_back({"send " + name, src, sim::Send, start, seconds, k,
                     stages[q].chunk, q});
    trace.push_back({"recv " + name, dst, sim::Recv, start, seconds, k,
                     stages[q].chunk, q});
  }
  // The sender holds the tensor until it is delivered.
  buffers[static_cast<size_t>(sender) * v + stages[q].chunk].sent.push_back(
      {ready, end, bytes});
  return end;
}

bool Simulator::psSend(int64_t bytes, int sender, int receiver, int q,
                       int64_t k, bool gradient, int row, int slot) {
  if (!options.messagesShareProcessors || psGroups.empty())
    return false;
  const int g = psGroupOfRank[sender];
  if (g < 0 || psGroupOfRank[receiver] != g ||
      ranks[sender].device == ranks[receiver].device)
    return false;
  const Link &link = linkOf(ranks[sender].device, ranks[receiver].device);
  const double seconds = topology.p2pSecondsAtLevel(bytes, link.level);
  if (!std::isfinite(seconds) || !(seconds > 0))
    return false; // transfer() reports it, or it costs nothing
  const int id = static_cast<int>(ranks.size() + psMessages.size());
  psMessages.push_back(
      {g, sender, receiver, q, row, slot, k, bytes, gradient, now});
  psWork.push_back(seconds);
  psBegin.push_back(now);
  psFinish.push_back(kUnknown);
  psBeginOp(id);
  return true;
}

void Simulator::psMessageArrived(PsMessage message, double time) {
  // (A copy: what it wakes may send, and psMessages grow.)
  const int src = ranks[message.sender].device,
            dst = ranks[message.receiver].device;
  const int chunk = stages[message.q].chunk;
  if (options.trace) {
    std::string name = message.gradient ? "gradient" : "activation";
    trace.push_back({"send " + name, src, sim::Send, message.ready,
                     time - message.ready, message.k, chunk, message.q});
    trace.push_back({"recv " + name, dst, sim::Recv, message.ready,
                     time - message.ready, message.k, chunk, message.q});
  }
  buffers[static_cast<size_t>(message.sender) * v + chunk].sent.push_back(
      {message.ready, time, message.bytes});
  (message.gradient ? gradients : activations)
      .deliver(message.row, message.k, message.slot, time);
  woken.clear();
  woken.push_back(message.receiver);
  tryStart(message.receiver);
}

void Simulator::updateRounds(Rank &rank) {
  rank.updatesAfter.assign(rank.ops.size(), 0);
  if (kind != ScheduleKind::OneFOneB && kind != ScheduleKind::TwoBW)
    return;
  const PassKind last =
      splitBackward() ? PassKind::BackwardWeight : PassKind::Backward;
  // Walk back: the first last-backward of a batch seen from the end is the
  // rank's last of that batch.
  int64_t laterBatch = -1;
  for (size_t i = rank.ops.size(); i-- > 0;) {
    const SchedOp &op = rank.ops[i];
    if (op.kind != last)
      continue;
    const int64_t batch = op.microbatch / m;
    if (kind == ScheduleKind::OneFOneB || batch != laterBatch)
      rank.updatesAfter[i] = 1;
    laterBatch = batch;
  }
  // The version copy: 2bw refreshes its shadow before every update; 1f1b
  // stashes the live weights while a forward in flight still reads them.
  const bool copies = kind == ScheduleKind::TwoBW || rank.depth > 1;
  for (int c = 0; c < v; ++c) {
    VStage &stage = stages[stageOf(c, rank.group)];
    stage.update = stage.optimizer + (copies ? stage.versionCopy : 0);
  }
}

double Simulator::update(int q, double ready, int64_t round) {
  const int g = groupOf(q);
  const std::vector<int> &reducing =
      lanes.count > 1 ? lanes.devices[g] : groupDevices[g];
  double allreduce =
      reducing.size() > 1
          ? topology.allreduceSeconds(stages[q].paramBytes, reducing)
          : 0;
  if (!std::isfinite(allreduce) || allreduce < 0) {
    failure = "the allreduce of stage " + str(q) +
              " takes no finite time (check the topology's bandwidth)";
    allreduce = 0;
  }
  // The optimizer runs on the ranks' compute (the flush schedules' after
  // the iteration's allreduces, the others' in the backward op that ends
  // the round).
  double start = std::max(ready, laneFree[g]);
  double end = start + allreduce;
  laneFree[g] = end;
  if (options.trace && allreduce > 0)
    for (int device : groupDevices[g])
      trace.push_back({"allreduce", device, sim::Collective, start, allreduce,
                       round, stages[q].chunk, q});
  return end;
}

bool Simulator::startable(int r, double &ready, double &duration) const {
  const Rank &rank = ranks[r];
  if (rank.busy || rank.pc >= rank.ops.size())
    return false;
  const SchedOp &op = rank.ops[rank.pc];
  const int q = virtualStage(r, op);
  const int64_t k = op.microbatch;
  const VStage &stage = stages[q];
  const int slot = slotOf(r);
  ready = rank.freeAt;
  if (sharedRank(r))
    ready = std::max(ready, deviceFree[rankDevice[r]]);
  duration = 0;
  switch (op.kind) {
  case PassKind::Forward:
    for (int e : stage.inEdges) {
      if (!activations.known(e, k, slot))
        return false;
      ready = std::max(ready, activations.time(e, k, slot));
    }
    if (kind == ScheduleKind::OneFOneB) {
      // Weight stashing: F(l) follows B(l - K) and uses its update.
      int64_t local = localIndex(rank.group, k);
      if (local >= rank.depth) {
        double available = updateReady[q][local - rank.depth];
        if (available == kUnknown)
          return false;
        ready = std::max(ready, available);
      }
    } else if (kind == ScheduleKind::TwoBW) {
      // Batch j + 2 runs on W^(j+1), made after batch j (thesis.md §3.1).
      int64_t batch = k / m;
      if (batch >= 2) {
        double available = updateReady[q][batch - 2];
        if (available == kUnknown)
          return false;
        ready = std::max(ready, available);
      }
    }
    duration = stage.fwd;
    break;
  case PassKind::Backward:
    if (!forwards.known(q, k, slot))
      return false;
    for (int e : stage.outEdges) {
      if (!gradients.known(e, k, slot))
        return false;
      ready = std::max(ready, gradients.time(e, k, slot));
    }
    duration = stage.bwd;
    break;
  case PassKind::BackwardWeight:
    duration = stage.bwdWeight;
    break;
  }
  if (rank.updatesAfter[rank.pc])
    duration += stage.update;
  return true;
}

void Simulator::tryStart(int r) {
  if (sharedRank(r)) {
    // The device chooses among its ranks once every completion at this
    // time is known.
    requestDecision(rankDevice[r], now);
    return;
  }
  double ready = 0, duration = 0;
  if (startable(r, ready, duration))
    start(r, ready, duration);
}

void Simulator::requestDecision(int d, double time) {
  // A pending decision at or before `time` re-examines the device anyway.
  if (decisionAt[d] <= time)
    return;
  decisionAt[d] = time;
  events.push({time, 1, d});
}

void Simulator::decide(int d) {
  if (deviceBusy[d])
    return; // the running op's completion asks again
  // Candidates: every rank of the device whose next op can start; the
  // earliest of them fixes the decision time.
  int best = -1;
  double bestReady = 0, bestDuration = 0;
  double earliest = std::numeric_limits<double>::infinity();
  std::tuple<int64_t, int, int> bestKey;
  std::vector<std::tuple<int, double, double>> candidates;
  for (int r : deviceRanks[d]) {
    double ready = 0, duration = 0;
    if (!startable(r, ready, duration))
      continue;
    candidates.emplace_back(r, ready, duration);
    earliest = std::min(earliest, ready);
  }
  if (candidates.empty())
    return; // a delivery or completion will ask again
  if (earliest > now) {
    // Nothing can start before `earliest`; an op that becomes known in the
    // meantime may still start earlier, so decide then.
    requestDecision(d, earliest);
    return;
  }
  // Priority among the ops that can start now: oldest microbatch, backward
  // (B, W) before forward, lower rank.
  for (const auto &[r, ready, duration] : candidates) {
    if (ready > now)
      continue;
    const SchedOp &op = ranks[r].ops[ranks[r].pc];
    std::tuple<int64_t, int, int> key{op.microbatch,
                                      op.kind == PassKind::Forward ? 1 : 0, r};
    if (best < 0 || key < bestKey) {
      best = r;
      bestKey = key;
      bestReady = ready;
      bestDuration = duration;
    }
  }
  start(best, std::max(bestReady, now), bestDuration);
}

void Simulator::start(int r, double ready, double duration) {
  Rank &rank = ranks[r];
  const SchedOp &op = rank.ops[rank.pc];
  const int q = virtualStage(r, op);
  const int64_t k = op.microbatch;
  const VStage &stage = stages[q];
  const int slot = slotOf(r);
  // Delivered inputs (this replica's slice) wait in a receive buffer until
  // this op starts.
  auto &held = buffers[static_cast<size_t>(r) * v + stage.chunk].held;
  const int64_t share = split         ? replicas[rank.group]
                        : lanes.split ? lanes.count
                                      : 1;
  if (op.kind == PassKind::Forward)
    for (int e : stage.inEdges)
      held.push_back(
          {activations.time(e, k, slot), ready, edges[e].bytes / share});
  else if (op.kind == PassKind::Backward)
    for (int e : stage.outEdges)
      held.push_back(
          {gradients.time(e, k, slot), ready, edges[e].bytes / share});

  rank.busy = true;
  computeSeconds += duration;
  if (psRank(r)) {
    // Its speed depends on what else runs: it joins its group at `ready`,
    // and its busy time and trace span are known when it ends.
    psWork[r] = duration;
    events.push({ready, 3, r});
    return;
  }
  rank.busySeconds += duration;
  if (sharedRank(r)) {
    const int d = rankDevice[r];
    deviceBusy[d] = 1;
    deviceFree[d] = ready + duration;
    deviceLog[d].push_back({r, rank.pc});
  }
  if (options.trace)
    traceCompute(r, ready, duration);
  if (anyOrder)
    completions.push_back({ready + duration, r});
  else
    events.push({ready + duration, 0, r});
}

void Simulator::traceCompute(int r, double start, double length) {
  const Rank &rank = ranks[r];
  const SchedOp &op = rank.ops[rank.pc];
  const char *prefix = op.kind == PassKind::Forward    ? "F"
                       : op.kind == PassKind::Backward ? "B"
                                                       : "W";
  std::string name = prefix + str(op.microbatch);
  if (v > 1)
    name += "c" + str(op.chunk);
  trace.push_back({name, rank.device, sim::Compute, start, length,
                   op.microbatch, op.chunk, virtualStage(r, op)});
}

void Simulator::complete(int r, double time) {
  Rank &rank = ranks[r];
  const SchedOp op = rank.ops[rank.pc];
  rank.busy = false;
  rank.freeAt = time;
  if (sharedRank(r))
    deviceBusy[rankDevice[r]] = 0;
  ++rank.pc;
  const int q = virtualStage(r, op);
  const int64_t k = op.microbatch;
  woken.clear();
  woken.push_back(r);
  switch (op.kind) {
  case PassKind::Forward:
    forwards.deliver(q, k, slotOf(r), time);
    send(r, q, k, time, /*gradient=*/false);
    break;
  case PassKind::Backward:
    send(r, q, k, time, /*gradient=*/true);
    if (!splitBackward())
      lastBackwardDone(q, r, k, time);
    break;
  case PassKind::BackwardWeight:
    lastBackwardDone(q, r, k, time);
    break;
  }
  // tryStart never re-enters complete(), so `woken` stays intact.
  for (int w : woken)
    tryStart(w);
}

void Simulator::send(int r, int q, int64_t k, double time, bool gradient) {
  const VStage &stage = stages[q];
  const int replica = ranks[r].replica;
  for (int e : gradient ? stage.inEdges : stage.outEdges) {
    const Edge &edge = edges[e];
    const int peer = gradient ? edge.from : edge.to;
    Mailbox &mailbox = gradient ? gradients : activations;
    if (!split) {
      int receiver = rankFor(peer, k);
      // A collapsed split plan's lane sends the slice that overlaps its own
      // (as forEachOverlap measures it for r:r).
      const int64_t bytes = lanes.split
                                ? std::llround(static_cast<double>(edge.bytes) *
                                               (1.0 / lanes.count))
                                : edge.bytes;
      if (!psSend(bytes, r, receiver, q, k, gradient, e, 0))
        mailbox.deliver(e, k, 0,
                        transfer(bytes, r, receiver, time, q, k, gradient));
      woken.push_back(receiver);
      continue;
    }
    // Split/concat: each overlapping pair of slices is one message.
    const int g = groupOf(peer);
    forEachOverlap(
        replica, replicas[ranks[r].group], replicas[g],
        [&](int j, double fraction) {
          int receiver = firstRank[g] + j;
          int64_t bytes =
              std::llround(static_cast<double>(edge.bytes) * fraction);
          if (!psSend(bytes, r, receiver, q, k, gradient, e, j))
            mailbox.deliver(e, k, j,
                            transfer(bytes, r, receiver, time, q, k, gradient));
          woken.push_back(receiver);
        });
  }
}

void Simulator::lastBackwardDone(int q, int r, int64_t k, double time) {
  Rank &rank = ranks[r];
  const int g = rank.group;
  int64_t step = k / m;
  stepEnd[step] = std::max(stepEnd[step], time);
  switch (kind) {
  case ScheduleKind::OneFOneB: {
    // Round l: the l-th local backward of every replica that has one.
    int64_t round = localIndex(g, k);
    int participants = 0;
    for (int j = 0; j < replicas[g]; ++j)
      if (split || j + round * replicas[g] < numMicrobatches)
        ++participants;
    double &latest = updateLatest[q][round];
    latest = std::max(latest, time);
    if (++updateCount[q][round] == participants) {
      updateReady[q][round] = update(q, latest, round);
      wakeReplicas(g);
    }
    break;
  }
  case ScheduleKind::TwoBW: {
    // Batch j: all m microbatches pass every stage once (every replica,
    // with split replicas).
    double &latest = updateLatest[q][step];
    latest = std::max(latest, time);
    if (++updateCount[q][step] == (split ? m * replicas[g] : m)) {
      updateReady[q][step] = update(q, latest, step);
      wakeReplicas(g);
    }
    break;
  }
  default: {
    stageLastBackward[q] = std::max(stageLastBackward[q], time);
    if (--rank.remaining[stages[q].chunk] == 0 &&
        ++replicasDone[q] == replicas[g])
      stageReduced[q] = update(q, stageLastBackward[q], -1);
    break;
  }
  }
}

std::string Simulator::describeWait(int r) const {
  const Rank &rank = ranks[r];
  const SchedOp &op = rank.ops[rank.pc];
  const int q = virtualStage(r, op);
  const int64_t k = op.microbatch;
  std::string what = "device " + str(rank.device) + " (stage " +
                     str(rank.group) + " replica " + str(rank.replica) +
                     ") waits to run " +
                     (op.kind == PassKind::Forward    ? "F"
                      : op.kind == PassKind::Backward ? "B"
                                                      : "W") +
                     " of microbatch " + str(k);
  if (v > 1)
    what += " chunk " + str(op.chunk);
  const int slot = slotOf(r);
  if (op.kind == PassKind::Forward) {
    for (int e : stages[q].inEdges)
      if (!activations.known(e, k, slot))
        return what + " for the activation from stage " + str(edges[e].from);
    return what + " for a weight version";
  }
  for (int e : stages[q].outEdges)
    if (!gradients.known(e, k, slot))
      return what + " for the gradient from stage " + str(edges[e].to);
  return what + " for its own forward";
}

std::string Simulator::setUpProcessorSharing() {
  psGroups.clear();
  psGroupOfRank.assign(ranks.size(), -1);
  std::map<int, int> index; // topology group -> psGroups index
  for (size_t r = 0; r < ranks.size(); ++r) {
    auto [group, processors] = topology.processorGroup(ranks[r].device);
    if (group < 0)
      continue;
    auto [it, inserted] =
        index.emplace(group, static_cast<int>(psGroups.size()));
    if (inserted) {
      psGroups.emplace_back();
      psGroups.back().processors = processors;
    }
    psGroupOfRank[r] = it->second;
    if (sharedRank(static_cast<int>(r)))
      return "device " + str(ranks[r].device) +
             " runs several stages and shares its processors with other "
             "devices: the simulator models one or the other";
  }
  psWork.assign(ranks.size(), 0);
  psBegin.assign(ranks.size(), 0);
  psFinish.assign(ranks.size(), kUnknown);
  psMessages.clear();
  return "";
}

void Simulator::psAdvance(int g) {
  PsGroup &group = psGroups[g];
  for (auto &[r, left] : group.running)
    left -= (now - group.last) * group.rate;
  group.last = now;
}

void Simulator::psReschedule(int g) {
  psAdvance(g);
  PsGroup &group = psGroups[g];
  const double running = static_cast<double>(group.running.size());
  group.rate = running > group.processors ? group.processors / running : 1.0;
  for (auto &[r, left] : group.running) {
    psFinish[r] = now + std::max(left, 0.0) / group.rate;
    events.push({psFinish[r], 2, r});
  }
}

void Simulator::psBeginOp(int r) {
  const int g = psGroupOf(r);
  psAdvance(g); // the others' progress up to now, at the old rate
  psGroups[g].running.emplace_back(r, psWork[r]);
  psBegin[r] = now;
  psReschedule(g);
}

void Simulator::psEndOp(int r, double time) {
  const int g = psGroupOf(r);
  auto &running = psGroups[g].running;
  psAdvance(g);
  running.erase(
      std::find_if(running.begin(), running.end(),
                   [&](const auto &entry) { return entry.first == r; }));
  psFinish[r] = kUnknown;
  psReschedule(g);
  if (r >= static_cast<int>(ranks.size())) {
    psMessageArrived(psMessages[r - ranks.size()], time);
    return;
  }
  // Busy for as long as it ran, slowed or not (as a real trace shows it).
  ranks[r].busySeconds += time - psBegin[r];
  if (options.trace)
    traceCompute(r, psBegin[r], time - psBegin[r]);
  complete(r, time);
}

std::string Simulator::simulate() {
  // Slots: the receiving replicas with split replicas (each waiting for the
  // slices that overlap its own), else one slot and one delivery.
  auto senders = [&](int receiver, int receiving, int sending) {
    int count = 0;
    forEachOverlap(receiver, receiving, sending, [&](int, double) { ++count; });
    return count;
  };
  std::vector<std::vector<int>> forwardSlots, activationSlots, gradientSlots;
  for (int q = 0; q < numQ; ++q)
    forwardSlots.push_back(
        std::vector<int>(split ? replicas[groupOf(q)] : 1, 1));
  for (const Edge &edge : edges) {
    const int rFrom = replicas[groupOf(edge.from)],
              rTo = replicas[groupOf(edge.to)];
    std::vector<int> toSlots(1, 1), fromSlots(1, 1);
    if (split) {
      toSlots.resize(rTo);
      for (int j = 0; j < rTo; ++j)
        toSlots[j] = senders(j, rTo, rFrom);
      fromSlots.resize(rFrom);
      for (int i = 0; i < rFrom; ++i)
        fromSlots[i] = senders(i, rFrom, rTo);
    }
    activationSlots.push_back(toSlots);
    gradientSlots.push_back(fromSlots);
  }
  forwards.init(forwardSlots, numMicrobatches);
  activations.init(activationSlots, numMicrobatches);
  gradients.init(gradientSlots, numMicrobatches);
  const size_t rounds = needsUpdateGate() ? numMicrobatches : 0;
  updateReady.assign(numQ, std::vector<double>(rounds, kUnknown));
  updateLatest.assign(numQ, std::vector<double>(rounds, 0));
  updateCount.assign(numQ, std::vector<int>(rounds, 0));
  laneFree.assign(p, 0);
  stageReduced.assign(numQ, 0);
  replicasDone.assign(numQ, 0);
  stageLastBackward.assign(numQ, 0);
  stepEnd.assign(steps, 0);
  buffers.assign(ranks.size() * v, {});
  // About one interval per op and direction (one edge in, one out).
  for (size_t r = 0; r < ranks.size(); ++r)
    for (int c = 0; c < v; ++c) {
      buffers[r * v + c].held.reserve(ranks[r].ops.size() / v + 1);
      buffers[r * v + c].sent.reserve(ranks[r].ops.size() / v + 1);
    }
  // A stage replica without microbatches is done from the start.
  for (size_t r = 0; r < ranks.size(); ++r)
    for (int c = 0; c < v; ++c)
      if (ranks[r].remaining[c] == 0 && isFlushSchedule(kind))
        ++replicasDone[stageOf(c, ranks[r].group)];

  const size_t numDevices = deviceRanks.size();
  deviceBusy.assign(numDevices, 0);
  deviceFree.assign(numDevices, 0);
  decisionAt.assign(numDevices, std::numeric_limits<double>::infinity());
  deviceLog.assign(numDevices, {});

  now = 0;
  if (std::string error = setUpProcessorSharing(); !error.empty())
    return error;
  anyOrder = !options.trace && psGroups.empty();
  for (const std::vector<int> &onDevice : deviceRanks)
    anyOrder &= onDevice.size() == 1;
  for (size_t r = 0; r < ranks.size(); ++r)
    tryStart(static_cast<int>(r));
  while (!completions.empty()) {
    auto [time, id] = completions.back();
    completions.pop_back();
    now = time;
    complete(id, time);
    if (!failure.empty())
      return failure;
  }
  while (!events.empty()) {
    auto [time, type, id] = events.top();
    events.pop();
    now = time;
    if (type == 0) {
      complete(id, time);
    } else if (type == 2) {
      if (psFinish[id] == time)
        psEndOp(id, time);
    } else if (type == 3) {
      psBeginOp(id);
    } else if (decisionAt[id] == time) {
      // The device's pending decision (stale ones were superseded by an
      // earlier one, which re-examined the device).
      decisionAt[id] = std::numeric_limits<double>::infinity();
      decide(id);
    }
    if (!failure.empty())
      return failure;
  }
  std::string stuck;
  int count = 0;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r].pc < ranks[r].ops.size()) {
      if (count++ < 3)
        stuck +=
            (stuck.empty() ? "" : "; ") + describeWait(static_cast<int>(r));
    }
  if (count > 0)
    return "deadlock: the schedule makes no progress: " + stuck +
           (count > 3 ? " (and " + str(count - 3) + " more devices)" : "");
  return "";
}

//===----------------------------------------------------------------------===//
// Results
//===----------------------------------------------------------------------===//

void Simulator::account(SimResult &result) {
  accountTime(result, iterationTime());
  // Memory, per rank and chunk, then per plan stage (largest replica) and
  // per device.
  LastBackward lastBackward = lastBackwardOps();
  std::vector<int64_t> rankStatic, rankMaxSaved, rankBuffers;
  accountStageMemory(result, lastBackward, rankStatic, rankMaxSaved,
                     rankBuffers);
  accountDevices(result, lastBackward, rankStatic, rankMaxSaved, rankBuffers);
  if (options.trace) {
    std::stable_sort(trace.begin(), trace.end(),
                     [](const sim::TraceEvent &a, const sim::TraceEvent &b) {
                       return a.startSeconds < b.startSeconds;
                     });
    result.traceJson = sim::traceToJson(trace);
  }
}

double Simulator::iterationTime() {
  double iteration = 0;
  if (isFlushSchedule(kind)) {
    // Each device runs the optimizer of all its stages (every chunk, every
    // stage of a shared device) once they are reduced.
    for (const std::vector<int> &onDevice : deviceRanks) {
      const Rank &first = ranks[onDevice.front()];
      double finish = 0;
      double optimizer = 0;
      for (int r : onDevice) {
        finish = std::max(finish, ranks[r].freeAt);
        for (int c = 0; c < v; ++c) {
          int q = stageOf(c, ranks[r].group);
          finish = std::max(finish, stageReduced[q]);
          optimizer += stages[q].optimizer;
        }
      }
      if (options.trace && optimizer > 0)
        trace.push_back({"optimizer", first.device, sim::Compute, finish,
                         optimizer, -1, 0, first.group});
      iteration = std::max(iteration, finish + optimizer);
    }
  } else if (measureFrom >= 0 && measureLast > measureFrom) {
    iteration = (stepEnd[measureLast] - stepEnd[measureFrom]) /
                static_cast<double>(measureLast - measureFrom);
    if (sharedPlan && !given) {
      // In the long run no device runs faster than its work: every device
      // computes m microbatches of each of its stages per iteration (a 1/r
      // share with round-robin replicas). The window's estimate can dip
      // below that by the fluctuation of a shared device's backlog.
      for (const std::vector<int> &onDevice : deviceRanks) {
        double deviceWork = 0;
        for (int r : onDevice)
          for (int c = 0; c < v; ++c)
            deviceWork += rankWorkPerStep(stageOf(c, ranks[r].group));
        iteration = std::max(iteration, deviceWork);
      }
    }
  } else {
    // Too few steps for a steady state: the makespan per step.
    iteration = stepEnd[steps - 1] / static_cast<double>(steps);
  }
  return iteration;
}

void Simulator::accountTime(SimResult &result, double iteration) const {
  // Compute per iteration. Flush: what the step ran. Continuous: the steady
  // state, where each of the m microbatches of an iteration passes every
  // virtual stage once and a stage replica runs 1/r of them (with split
  // replicas, a 1/r slice of each).
  double busy = computeSeconds;
  if (!isFlushSchedule(kind)) {
    busy = 0;
    for (int q = 0; q < numQ; ++q)
      busy += replicas[groupOf(q)] * rankWorkPerStep(q);
  }
  // Every lane of a collapsed plan is busy as lane 0 is, and runs its share
  // of the microbatches.
  busy *= lanes.count;
  const int64_t mAll = lanes.roundRobin() ? m * lanes.count : m;
  // Devices that share processors (a topology level's `processors`) can be
  // busy together only as far as their processors go: a group of them
  // counts min(devices, processors) towards the time there was to fill.
  double capacity = 0;
  std::map<int, int> sharing; // processor-sharing group -> its devices
  for (const std::vector<int> &onDevice : deviceRanks) {
    const int g = onDevice.empty() || psGroupOfRank.empty()
                      ? -1
                      : psGroupOfRank[size_t(onDevice.front())];
    if (g < 0)
      capacity += 1;
    else
      ++sharing[g];
  }
  for (auto [g, devices] : sharing)
    capacity += std::min(devices, psGroups[g].processors);
  const double deviceTime =
      capacity * static_cast<double>(lanes.count) * iteration;
  const double idle = std::max(0.0, deviceTime - busy);
  result.iterationSeconds = iteration;
  result.samplesPerSecond =
      iteration > 0
          ? static_cast<double>(mAll * plan.microbatchSize) / iteration
          : 0;
  result.bubbleFraction = busy > 0 ? idle / busy : 0;
  result.idleFraction = deviceTime > 0 ? idle / deviceTime : 0;
}

Simulator::LastBackward Simulator::lastBackwardOps() const {
  LastBackward lastBackward(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::vector<SchedOp> &ops = ranks[r].ops;
    lastBackward[r].assign(ops.size(), 0);
    // The rank's microbatches, densely: its local index (k / r_g with
    // round robin) times the chunks.
    std::vector<char> seen;
    for (size_t i = ops.size(); i-- > 0;) {
      if (ops[i].kind == PassKind::Forward)
        continue;
      const size_t key =
          size_t(localIndex(ranks[r].group, ops[i].microbatch)) * v +
          size_t(ops[i].chunk);
      if (key >= seen.size())
        seen.resize(std::max(key + 1, 2 * seen.size()), 0);
      if (!seen[key]) {
        seen[key] = 1;
        lastBackward[r][i] = 1;
      }
    }
  }
  return lastBackward;
}

int64_t
Simulator::activationPeak(const std::vector<std::pair<int, size_t>> &run,
                          LastBackward &lastBackward) const {
  int64_t liveBytes = 0, peakBytes = 0;
  for (const auto &[r, i] : run) {
    const SchedOp &op = ranks[r].ops[i];
    const VStage &stage = stages[stageOf(op.chunk, ranks[r].group)];
    int64_t perMicrobatch = stage.stashBytes();
    if (op.kind == PassKind::Forward) {
      liveBytes += perMicrobatch;
      peakBytes = std::max(peakBytes, liveBytes);
    } else if (lastBackward[r][i]) {
      liveBytes -= perMicrobatch;
    }
  }
  return peakBytes;
}

void Simulator::accountStageMemory(SimResult &result,
                                   LastBackward &lastBackward,
                                   std::vector<int64_t> &rankStatic,
                                   std::vector<int64_t> &rankMaxSaved,
                                   std::vector<int64_t> &rankBuffers) const {
  result.memory.assign(numQ, {});
  result.peakInflight.assign(numQ, 0);
  // Per rank: weights x versions, gradients and optimizer state of its
  // chunks, and the largest saved bytes (one microbatch with recompute).
  rankStatic.assign(ranks.size(), 0);
  rankMaxSaved.assign(ranks.size(), 0);
  rankBuffers.assign(ranks.size(), 0);
  for (size_t r = 0; r < ranks.size(); ++r) {
    const Rank &rank = ranks[r];
    std::vector<int64_t> inflight(v, 0), peak(v, 0);
    int64_t inflightAll = 0, peakAll = 0;
    for (size_t i = 0; i < rank.ops.size(); ++i) {
      const SchedOp &op = rank.ops[i];
      if (op.kind == PassKind::Forward) {
        peak[op.chunk] = std::max(peak[op.chunk], ++inflight[op.chunk]);
        peakAll = std::max(peakAll, ++inflightAll);
      } else if (lastBackward[r][i]) {
        --inflight[op.chunk];
        --inflightAll;
      }
    }
    int64_t versions = peakWeightVersions(kind, rank.ops, m);
    // A rank's chunks share its slots: one slot only when none of them
    // has a backward.
    bool oneSlot = true;
    for (int c = 0; c < v; ++c)
      oneSlot = oneSlot && stages[stageOf(c, rank.group)].oneSlot;
    for (int c = 0; c < v; ++c) {
      const int q = stageOf(c, rank.group);
      const VStage &stage = stages[q];
      if (stage.recompute && !stage.arena)
        rankMaxSaved[r] = std::max(rankMaxSaved[r], stage.savedBytes);
      StageMemory memory;
      memory.weightVersions = static_cast<int>(std::max<int64_t>(versions, 1));
      memory.weights = stage.paramBytes * memory.weightVersions;
      memory.gradients = stage.paramBytes;
      memory.optimizer = std::llround(options.optimizerStateFactor *
                                      static_cast<double>(stage.paramBytes));
      // The lowering gives every chunk of a rank as many stash slots as the
      // rank has microbatches in flight over all its chunks.
      memory.activations =
          stage.arena       ? (oneSlot ? 1 : peakAll) * stage.stashBytes()
          : stage.recompute ? peak[c] * stage.inputBytes + stage.savedBytes
                            : peak[c] * stage.stashBytes();
      memory.io = stage.ioBytes;
      memory.scratch = stage.scratchBytes;
      memory.arenaModel = stage.arena;
      const Buffers &b = buffers[r * v + c];
      memory.buffers = peakOf({&b.sent, &b.held});
      if (v == 1)
        rankBuffers[r] = memory.buffers;
      rankStatic[r] += memory.weights + memory.gradients + memory.optimizer +
                       memory.io + memory.scratch;
      if (memory.total() > result.memory[q].total() ||
          result.memory[q].total() == 0)
        result.memory[q] = memory;
      result.peakInflight[q] = std::max(result.peakInflight[q], peak[c]);
    }
  }
}

void Simulator::accountDevices(SimResult &result, LastBackward &lastBackward,
                               const std::vector<int64_t> &rankStatic,
                               const std::vector<int64_t> &rankMaxSaved,
                               const std::vector<int64_t> &rankBuffers) const {
  const bool flush = isFlushSchedule(kind);
  // Per device: the sum over its ranks (one, or several on a shared
  // device) of the static bytes, plus the peak over time of the stashed
  // activations and of the buffers of all of them.
  for (size_t d = 0; d < deviceRanks.size(); ++d) {
    const std::vector<int> &onDevice = deviceRanks[d];
    std::vector<std::pair<int, size_t>> run;
    if (onDevice.size() == 1) {
      for (size_t i = 0; i < ranks[onDevice[0]].ops.size(); ++i)
        run.push_back({onDevice[0], i});
    } else {
      run = deviceLog[d];
    }
    std::vector<const std::vector<BufferInterval> *> held;
    int64_t deviceBytes = 0, maxSaved = 0;
    if (onDevice.size() == 1 && stages.front().arena) {
      // The lowering reserves its stash slots for the whole run.
      for (int c = 0; c < v; ++c)
        deviceBytes +=
            result.memory[stageOf(c, ranks[onDevice[0]].group)].activations;
    } else {
      deviceBytes = activationPeak(run, lastBackward);
    }
    DeviceUsage usage;
    usage.device = ranks[onDevice.front()].device;
    for (int r : onDevice) {
      deviceBytes += rankStatic[r];
      maxSaved = std::max(maxSaved, rankMaxSaved[r]);
      for (int c = 0; c < v; ++c) {
        held.push_back(&buffers[r * v + c].sent);
        held.push_back(&buffers[r * v + c].held);
      }
      const Rank &rank = ranks[r];
      if (flush) {
        usage.busySeconds += rank.busySeconds;
        continue;
      }
      for (int c = 0; c < v; ++c)
        usage.busySeconds += rankWorkPerStep(stageOf(c, rank.group));
    }
    // One rank of one chunk: its stage's figure.
    usage.peakBytes = deviceBytes + maxSaved +
                      (onDevice.size() == 1 && v == 1 ? rankBuffers[onDevice[0]]
                                                      : peakOf(held));
    result.devices.push_back(usage);
    // The same figures on the devices of the other lanes.
    const int g = ranks[onDevice.front()].group;
    for (int j = 1; j < lanes.count; ++j) {
      usage.device = lanes.devices[g][j];
      result.devices.push_back(usage);
    }
  }
  std::sort(result.devices.begin(), result.devices.end(),
            [](const DeviceUsage &a, const DeviceUsage &b) {
              return a.device < b.device;
            });
  result.fitsMemory = true;
  if (topology.deviceMemoryBytes > 0)
    for (const DeviceUsage &usage : result.devices)
      if (usage.peakBytes > topology.deviceMemoryBytes)
        result.fitsMemory = false;
}

SimResult Simulator::run() {
  SimResult result;
  result.error = setup();
  if (result.error.empty())
    result.error = simulate();
  if (!result.error.empty())
    return result;
  account(result);
  result.ok = true;
  return result;
}

} // namespace

bool sharedDevicesAllowed(const Plan &plan, const SimOptions &options) {
  return options.allowSharedDevices || plan.algorithm == "madpipe" ||
         plan.algorithm == "auto:madpipe";
}

std::vector<int> devicesSharedByStages(const Plan &plan) {
  const int groups = plan.chunks > 1 && plan.numStages() % plan.chunks == 0
                         ? plan.numStages() / plan.chunks
                         : plan.numStages();
  std::map<int, int> stagesOn;
  for (int s = 0; s < groups; ++s)
    for (int device : std::set<int>(plan.stages[s].devices.begin(),
                                    plan.stages[s].devices.end()))
      ++stagesOn[device];
  std::vector<int> shared;
  for (const auto &[device, count] : stagesOn)
    if (count > 1)
      shared.push_back(device);
  return shared;
}

namespace {

/// Whether `plan` is replicated alike (SimOptions::collapseLanes): every
/// stage has r >= 2 replicas on devices of its own, virtual stages (chunks)
/// run on their position's devices, 1F1B-RR has m a multiple of r, and lane
/// j's devices of any two positions are as far apart (topology level) as
/// lane 0's, so every lane sees lane 0's message times, and no devices
/// share processors (lanes would slow each other). Then `lane` is lane 0's
/// one-replica plan and `lanes` what it stands for.
bool alikeLanes(const Topology &topology, const Plan &plan,
                const SimOptions &options, Plan &lane, Lanes &lanes) {
  auto kind = parseScheduleKind(plan.schedule);
  if (!options.collapseLanes || options.trace || !kind || plan.stages.empty() ||
      plan.chunks < 1 || plan.numStages() % plan.chunks != 0 ||
      (kind == ScheduleKind::Custom && plan.chunks > 1))
    return false;
  // Devices sharing processors: another lane's ops slow this one's
  // (whether devices share depends on the levels alone, not on which).
  if (topology.processorGroup(0).first >= 0)
    return false;
  const int r = plan.stages[0].replicas;
  const int p = plan.numStages() / plan.chunks;
  if (r < 2 || (!options.splitReplicas && plan.microbatches % r != 0))
    return false;
  const int numDevices = topology.numDevices();
  std::set<int> used;
  for (int q = 0; q < plan.numStages(); ++q) {
    const StagePlan &stage = plan.stages[size_t(q)];
    if (stage.replicas != r || int(stage.devices.size()) != r)
      return false;
    if (q >= p)
      continue; // chunks: the simulator checks they reuse their position's
    for (int device : stage.devices)
      if (device < 0 || device >= numDevices || !used.insert(device).second)
        return false;
  }
  // Interleaved and V placements put chunk c of position g on stage q's
  // devices for some q < p; the simulator refuses any other list.
  std::set<std::vector<int>> positions;
  for (int g = 0; g < p; ++g)
    positions.insert(plan.stages[size_t(g)].devices);
  for (int q = p; q < plan.numStages(); ++q)
    if (!positions.count(plan.stages[size_t(q)].devices))
      return false;
  for (int a = 0; a < p; ++a)
    for (int b = a + 1; b < p; ++b) {
      const std::vector<int> &da = plan.stages[size_t(a)].devices,
                             &db = plan.stages[size_t(b)].devices;
      const int level = topology.levelBetween(da[0], db[0]);
      for (int j = 1; j < r; ++j)
        if (topology.levelBetween(da[size_t(j)], db[size_t(j)]) != level)
          return false;
    }
  // A plan the generator refuses keeps its own error (the full simulation
  // reports it).
  PipelineRequest request;
  request.kind = *kind;
  request.stages = plan.numStages();
  request.chunks = plan.chunks;
  request.microbatches = plan.microbatches;
  request.replicas.assign(size_t(p), r);
  request.placement = placementOf(*kind);
  if (!checkScheduleShape(request).empty())
    return false;
  lanes.count = r;
  lanes.split = options.splitReplicas;
  lanes.devices.clear();
  lane = plan;
  for (size_t q = 0; q < lane.stages.size(); ++q) {
    StagePlan &stage = lane.stages[q];
    if (int(q) < p)
      lanes.devices.push_back(stage.devices);
    stage.replicas = 1;
    stage.devices = {stage.devices[0]};
  }
  if (!lanes.split)
    lane.microbatches = plan.microbatches / r;
  return true;
}

} // namespace

SimResult simulatePlan(const Profile &profile, const Topology &topology,
                       const Plan &plan, const SimOptions &options) {
  Plan lane;
  Lanes lanes;
  if (alikeLanes(topology, plan, options, lane, lanes)) {
    SimOptions laneOptions = options;
    laneOptions.splitReplicas = false;
    Simulator simulator(profile, topology, lane, laneOptions, nullptr, lanes);
    SimResult result = simulator.run();
    // An error is reported for the plan as given (its microbatch count and
    // replicas), by the full simulation.
    if (result.ok)
      return result;
  }
  Simulator simulator(profile, topology, plan, options, nullptr);
  return simulator.run();
}

SimResult simulateSchedule(const Profile &profile, const Topology &topology,
                           const Plan &plan, const ScheduleResult &schedule,
                           const SimOptions &options) {
  Simulator simulator(profile, topology, plan, options, &schedule);
  return simulator.run();
}

} // namespace pipec
