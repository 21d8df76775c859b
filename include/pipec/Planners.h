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

#include <string>
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

} // namespace pipec

#endif // PIPEC_PLANNERS_H
