//===- Sim.h - Discrete-event pipeline simulator ----------------*- C++ -*-===//
//
// Runs a plan with its schedule on the cost model (profile times, topology
// communication) and reports iteration time, throughput, bubble fraction,
// per-stage peak memory and, optionally, a Chrome-trace timeline. Every
// planner's candidate is re-scored here, so planners are compared on one
// yardstick (DESIGN.md §4). Plain C++, no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_SIM_H
#define PIPEC_SIM_H

#include "pipec/Plan.h"
#include "pipec/Profile.h"
#include "pipec/Schedule.h"
#include "pipec/Topology.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pipec {

struct SimOptions {
  /// Recompute activations in the backward (stash only stage inputs).
  bool recompute = false;
  /// Optimizer state per parameter byte: 0 SGD, 1 momentum, 2 Adam.
  double optimizerStateFactor = 0;
  /// Produce `SimResult::traceJson`.
  bool trace = false;
  /// Steps (global batches) simulated for continuous schedules (1f1b, 2bw),
  /// a minimum: the simulator runs at least enough steps to leave the
  /// pipeline fill behind and measures the steady state between the fill and
  /// the final drain.
  int steps = 3;
  /// 1f1b-flush warm-up depth K_i (dapple.md §3.3) and DAPPLE's D, the
  /// microbatches that fit in memory (0 = unbounded).
  WarmupPolicy warmupPolicy = WarmupPolicy::A;
  int64_t maxInflight = 0;
  /// zb-h1: the share of a stage's backward time that is the weight
  /// gradient (the W op); the input gradient B gets the rest. 0.5 matches a
  /// matmul, whose dX and dW cost one forward each.
  double weightGradFraction = 0.5;
  /// Optimizer step time per parameter byte of a stage (0 = free), added to
  /// the profile's measured opt_s. The optimizer runs on the rank's compute
  /// as pipec's runtime runs it: flush schedules once per step after the
  /// allreduce; 1f1b after every local backward, 2bw after a replica's last
  /// backward of each batch, each with the copy of the weights into a
  /// stashed version where one is kept (the profile's copy_bytes_per_s).
  double optimizerSecondsPerByte = 0;
  /// Replicated stages split every microbatch into r even slices, one per
  /// replica, with split/concat between stages of different replica counts
  /// (DAPPLE, dapple.md §4; uneven counts such as 15:1 or 11:5 allowed):
  /// a replica's times and activation bytes are 1/r of the stage's, and
  /// every replica runs the straight pipeline's program over all m
  /// microbatches. Default: PipeDream's 1F1B-RR, microbatch k whole on
  /// replica k mod r.
  bool splitReplicas = false;
  /// Devices that share processors (a topology level's `processors`) also
  /// share them with the messages between them: a message's copies are the
  /// processors' work (the staging copies and MPI's on CPUs; on a GPU that
  /// four processes time-slice, a copy waits for its context's turn), so
  /// it runs in the processor sharing for the link's time at full speed.
  /// False: it takes the link alone and overlaps every op.
  bool messagesShareProcessors = true;
  /// Lets several plan stages list the same device (a device holding
  /// several, typically non-adjacent, stages: MadPipe's special processor,
  /// madpipe.md §2.4) for plans of any planner. Plans of the madpipe planner
  /// (algorithm "madpipe" or "auto:madpipe") share devices by design and
  /// need no flag; see sharedDevicesAllowed(). Interleaved plans never do
  /// (their chunks share devices through plan.chunks instead).
  bool allowSharedDevices = false;
  /// Simulate one lane of a plan whose stages are replicated alike (every
  /// stage has the same replica count r, on devices of its own, and lane j
  /// = replica j of every stage crosses the same topology levels as lane
  /// 0; 1F1B-RR needs m a multiple of r): lane j then runs microbatches
  /// k = j mod r (a 1/r slice of every microbatch with split replicas)
  /// exactly as lane 0 does, so simulatePlan runs lane 0 alone, with the
  /// allreduces still over all r devices, and copies its per-device
  /// figures to the other lanes. Same results, 1/r of the work. Off only
  /// to check that claim (tests) or with `trace`, which shows every rank.
  bool collapseLanes = true;
};

/// Peak memory of one stage replica, by kind (bytes).
struct StageMemory {
  int64_t weights = 0;     ///< parameters x live versions
  int64_t gradients = 0;   ///< gradient accumulators
  int64_t optimizer = 0;   ///< optimizer state
  int64_t activations = 0; ///< stashed activations at the peak in-flight count
  int64_t buffers = 0;     ///< communication buffers and workspace
  /// With an "arena" profile (Profile::memoryModel): the lowering's io
  /// region (gradients of the stage's inputs and outputs) and scratch (the
  /// largest working set of one op, and recomputed values); 0 otherwise.
  int64_t io = 0, scratch = 0;
  /// True when the figures follow the lowering's arena (an "arena" profile):
  /// arena() is then what the stage allocates.
  bool arenaModel = false;
  int weightVersions = 1;
  int64_t total() const {
    return weights + gradients + optimizer + activations + buffers + io +
           scratch;
  }
  /// What the compiler's static arena of the stage holds (one copy of the
  /// weights: older versions and message buffers live outside it).
  int64_t arena() const {
    return weights / std::max(weightVersions, 1) + gradients + optimizer +
           activations + io + scratch;
  }
};

/// What one device does in the simulated iteration.
struct DeviceUsage {
  int device = 0;
  /// Peak memory of everything on the device (every chunk of an interleaved
  /// pipeline, every stage of a shared device): weights x versions,
  /// gradients and optimizer state summed over them, the peak over time of
  /// their stashed activations (in the order the device ran them) and of
  /// their communication buffers. SimResult::fitsMemory checks this total.
  int64_t peakBytes = 0;
  double busySeconds = 0; ///< compute (F, B, W) per iteration
};

struct SimResult {
  bool ok = false;
  std::string error;
  /// One global batch: for flush schedules the makespan of one step
  /// including the gradient allreduce and the optimizer; for 1f1b and 2bw
  /// the steady-state time per `microbatches` microbatches.
  double iterationSeconds = 0;
  /// Global batch / iterationSeconds, with global batch = plan.microbatches
  /// x plan.microbatchSize: `microbatches` counts every microbatch of an
  /// iteration, whichever replica runs it (1F1B-RR).
  double samplesPerSecond = 0;
  /// Bubble time over ideal time, t_pb / t_id of thesis.md §4.1: idle
  /// device time / busy compute time, with idle = devices x iteration time -
  /// busy. Equals (p-1)/m for gpipe and 1f1b-flush and (p-1)/(v m) for
  /// interleaved on uniform stages without communication; can exceed 1 when
  /// m < p.
  double bubbleFraction = 0;
  /// Idle share of the device time: idle / (devices x iteration time),
  /// = (p-1)/(m+p-1) for gpipe on uniform stages; always in [0, 1).
  double idleFraction = 0;
  /// Per plan stage (its largest replica); a shared device's total is in
  /// `devices`, not here.
  std::vector<StageMemory> memory;
  std::vector<int64_t> peakInflight; ///< per plan stage, max over replicas
  std::vector<DeviceUsage> devices;  ///< per device the plan uses, by id
  bool fitsMemory = true;       ///< every device within the device memory
  std::string traceJson;        ///< Chrome trace events when requested
};

/// Simulates `plan` (its schedule, microbatches, chunks, replicas and
/// devices) on `profile` and `topology`. Errors (invalid plan, unknown
/// schedule, divisibility rules, a deadlock) come back in `error`.
///
/// Model (lib/Sim/Simulator.cpp has the details):
///  - a stage's forward time is the sum of its ops' fwd_s, its backward the
///    sum of bwd_s (plus one more forward with `recompute`), both scaled by
///    plan.microbatchSize / profile.microbatch;
///  - each tensor crossing a stage boundary is sent by its producing stage to
///    every consuming stage (skip connections included) with
///    topology.p2pSeconds, the gradient back the same way; one FIFO link
///    per directed device pair, overlapping compute;
///  - a device runs its rank program (lib/Schedule) in order, each op as
///    soon as its inputs have arrived and the device is free;
///  - a stage with r replicas runs microbatch k on replica k mod r
///    (1F1B-RR), or a 1/r slice of every microbatch on every replica with
///    `splitReplicas` (DAPPLE); replicas allreduce their gradients
///    (topology.allreduceSeconds) once per step for flush schedules, per
///    batch for 2bw and per backward round for 1f1b;
///  - interleaved: plan.stages are the p*v virtual stages in order and
///    plan.chunks = v; virtual stage c*p + r runs on stage r's devices;
///  - shared devices (a MadPipe special processor: stages whose `devices`
///    lists share a device, see Plan.h): every stage keeps its own rank
///    program, generated for the chain of all plan.stages, and the device
///    runs one op at a time: whenever it is free it starts, among its
///    stages' next ops that can start, the one of the oldest microbatch,
///    backward before forward at equal microbatch, then the earlier stage
///    (replica) - a deterministic greedy list schedule that never idles
///    while an op is ready, so it adds no deadlock (programs that cannot
///    finish are still reported). Its memory (DeviceUsage::peakBytes) sums
///    the stages' weights x versions, gradients and optimizer state and
///    adds the peak over time of all their stashed activations and buffers.
///    For 1f1b and 2bw the steady state is measured over at least 16 steps
///    and 64 microbatches and is never below the busiest device's work per
///    iteration (the greedy order's backlog fluctuates from step to step).
///    Allreduce lanes stay per stage: replicated stages sharing devices may
///    overlap their collectives.
/// A plan stage without devices gets the lowest unused device ids.
SimResult simulatePlan(const Profile &profile, const Topology &topology,
                       const Plan &plan, const SimOptions &options = {});

/// Like simulatePlan, but runs the given rank programs (e.g. edited or
/// produced elsewhere) instead of generating them. `schedule` must match the
/// plan: kind, stages p, chunks, replicas and microbatches; for 1f1b and 2bw
/// its `steps` are simulated and the iteration time is the time between the
/// ends of the first and the last step over steps - 1 (the makespan for one
/// step). Programs that cannot finish are reported as a deadlock naming the
/// devices that wait and what for.
SimResult simulateSchedule(const Profile &profile, const Topology &topology,
                           const Plan &plan, const ScheduleResult &schedule,
                           const SimOptions &options = {});

/// A lower bound on the iteration time simulatePlan reports for a plan
/// with a flush schedule (gpipe, 1f1b-flush, zb-h1, zb-v, interleaved): the
/// compute of its busiest device over one step, which runs its ops one at
/// a time (every stage and chunk on it; with round robin the replica that
/// gets ceil(m / r) microbatches, with split replicas a 1/r slice of all
/// m), with the simulator's stage times (sigma x the profile's sums, plus a
/// forward with recomputation). Communication, the bubble and the optimizer
/// only add to it. 0 when there is none to give: a continuous schedule
/// (1f1b, 2bw), whose steady state is measured over a window that need not
/// hold a whole step of every device's work, or a stage without devices.
/// `pipec plan --algorithm auto` skips simulating a candidate whose
/// throughput at this bound cannot beat a plan it already has.
double flushIterationLowerBound(const Profile &profile, const Plan &plan,
                                const SimOptions &options = {});

/// flushIterationLowerBound for a flush schedule; for a continuous one
/// (1f1b, 2bw), the busiest device's compute per m microbatches of the
/// steady state (a round-robin replica of r runs m / r of them per
/// iteration on average, a split one a 1/r slice of each), less 0.1% for
/// the finite window the simulator measures it over. 0 for an unknown
/// schedule or a stage without devices. What `pipec plan --algorithm auto`
/// prunes with.
double iterationLowerBound(const Profile &profile, const Plan &plan,
                           const SimOptions &options = {});

/// One schedule the synthesiser compared.
struct SynthCandidate {
  std::string name; ///< "list(K=p-s+1)", "zb-h1", ...
  ScheduleResult schedule;
  std::vector<int64_t> peakInflight; ///< per stage
  bool feasible = false;
  double iterationSeconds = 0;
  std::string note; ///< why not feasible
};

struct SynthResult {
  bool ok = false;
  std::string error;
  SynthCandidate best; ///< its schedule: kind Custom, backwards split
  std::vector<SynthCandidate> candidates;
};

/// `--schedule synth` (lib/Sim/Synth.cpp): an order of F, B and W per stage
/// of a straight synchronous pipeline (`plan`: one chunk, no replicas) for
/// its stages' times and a memory limit given as `caps`, the microbatches
/// each stage may hold in flight (forward run, W not yet). Greedy list
/// scheduling (B before F before W, W filling the gaps, F capped) over a
/// range of warm-up caps, plus the fixed schedules (gpipe, 1f1b-flush A/B,
/// zb-h1) that fit; each candidate is checked for deadlock freedom and
/// scored with simulateSchedule, and the fastest wins, so it never loses to
/// a fixed schedule within the same limit.
SynthResult synthesizeSchedule(const Profile &profile, const Topology &topology,
                               const Plan &plan,
                               const std::vector<int64_t> &caps,
                               const SimOptions &options = {});

/// Whether the simulator lets several stages of `plan` share a device: with
/// options.allowSharedDevices, or for a plan of the madpipe planner
/// (algorithm "madpipe" or "auto:madpipe"), whose special processor holds
/// several stages by design (madpipe.md §3.2). Any other overlap is taken
/// for a mistake and refused ("device d is assigned to stage a and stage
/// b"), as before shared devices existed; interleaved plans are refused
/// too.
bool sharedDevicesAllowed(const Plan &plan, const SimOptions &options = {});

/// The devices listed by more than one stage of `plan` (for an interleaved
/// plan, by more than one of its first numStages/chunks stages, since its
/// chunks share devices by design), ascending. Empty when every device
/// runs one stage.
std::vector<int> devicesSharedByStages(const Plan &plan);

} // namespace pipec

#endif // PIPEC_SIM_H
