//===- Plan.h - Pipeline plans and planners ---------------------*- C++ -*-===//
//
// The `Plan` type every planner returns (DESIGN.md §4) and the planners
// themselves. Plain C++: no MLIR, so `pipec plan` works on a profile alone.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_PLAN_H
#define PIPEC_PLAN_H

#include "pipec/Profile.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pipec {

/// One pipeline stage: a contiguous, inclusive range of layers (indices into
/// the profile's op list), replicated `replicas` times on `devices`.
///
/// Shared devices. Normally every device runs one stage (or, in an
/// interleaved plan, the chunks c*p + r of one device position r). A device
/// that holds several stages - MadPipe's special processor (madpipe.md §2.4,
/// §3.2), typically non-adjacent stages such as layers 1 and 3 of the
/// (2, 4, 2) example on one GPU and layer 2 on another - is expressed by
/// listing that device in the `devices` of each of its stages; the stages
/// themselves stay contiguous and in chain order. validatePlan accepts this
/// (it checks layers, replicas and that a stage does not list one device
/// twice, never overlaps between stages), so plan.json needs no new field.
/// The simulator runs such a plan only when the overlap is intended (a
/// madpipe plan, or SimOptions::allowSharedDevices; see
/// sharedDevicesAllowed() in Sim.h) and refuses other planners' overlaps as
/// mistakes.
struct StagePlan {
  int firstLayer = 0;
  int lastLayer = 0;
  int replicas = 1;
  std::vector<int> devices;
  /// Activation recomputation of the stage (plan.json "recompute"): "" or
  /// "none", "full", "selective". The simulator models "full" (inputs
  /// stashed, the forward run again in the backward).
  std::string recompute;
};

/// What the simulator / cost model predicts for a plan.
struct PlanPrediction {
  double iterationSeconds = 0;
  double samplesPerSecond = 0;
  double bubbleFraction = 0;
  std::vector<int64_t> stageMemoryBytes;
};

/// A complete pipeline plan (`pipec.plan/1`, DESIGN.md §7).
struct Plan {
  std::string algorithm;
  std::string schedule = "1f1b-flush";
  int microbatches = 1;
  int64_t microbatchSize = 1;
  int chunks = 1;
  /// How replicated stages share a batch: false = 1F1B-RR (whole
  /// microbatches round robin), true = DAPPLE (every replica runs a slice of
  /// every microbatch; plan.json "replica_mode": "split").
  bool splitReplicas = false;
  std::vector<StagePlan> stages;
  PlanPrediction predicted;
  /// Every plan that was scored to pick this one (plan.json `candidates`);
  /// candidates carry no candidates of their own.
  std::vector<Plan> candidates;

  int numStages() const { return static_cast<int>(stages.size()); }
  /// Stage owning `layer`, or -1.
  int stageOfLayer(int layer) const;
};

/// Result of a planner: a plan or an error message for the user.
struct PlanResult {
  bool ok = false;
  Plan plan;
  std::string error;
};

/// Seconds of one stage: fwd_s + bwd_s summed over its layers.
double stageSeconds(const Profile &profile, const StagePlan &stage);

/// The tie-break objective of planBalanced: the sum, over the plan's stage
/// boundaries, of cutBytes(profile, boundary, nullptr), i.e. every tensor
/// counted once per boundary it crosses (a skip connection over two
/// boundaries counts twice). Unlike the per-consuming-stage count this sum
/// decomposes over cuts, which keeps the dynamic programme exact.
int64_t planCutBytes(const Profile &profile, const Plan &plan);

/// Checks the structural invariants of a plan against a profile with
/// `numLayers` layers: contiguous, non-empty, covering, replicas >= 1, one
/// device per replica, no device twice within a stage. Several stages may
/// list the same device (a shared device, see StagePlan). Returns an empty
/// string when valid, else the first violation.
std::string validatePlan(const Plan &plan, int numLayers);

/// Bytes of every tensor live across the cut after layer `cutAfter`
/// (produced at or before it, consumed after it), each counted once per
/// consuming stage of `plan` (DESIGN.md §4). With an empty plan each tensor
/// counts once.
int64_t cutBytes(const Profile &profile, int cutAfter, const Plan *plan);

/// Bytes live across every cut when each tensor counts once per cut it
/// crosses: result[c] = cutBytes(profile, c, nullptr) for c in [0, L).
/// Linear time.
std::vector<int64_t> cutBytesPerCut(const Profile &profile);

/// Why a profile cannot be planned (no ops, microbatch < 1, negative or
/// non-finite times, negative sizes, inputs that are not earlier ops),
/// naming the op; empty when it is fine.
std::string profilePlanningError(const Profile &profile);

/// plan.json (`pipec.plan/1`) writer and reader.
std::string planToJson(const Plan &plan);
PlanResult planFromJson(const std::string &text);

} // namespace pipec

#endif // PIPEC_PLAN_H
