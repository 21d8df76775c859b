//===- ExhaustiveSim.cpp - The `exhaustive` planner on the simulator
//-------===//
//
// `pipec plan --algorithm exhaustive` and `auto`'s oracle: brute force
// (searchExhaustive) scored by the simulator, the yardstick every planner is
// re-scored with. Objective: simulated seconds per sample, plans that do not
// fit in device memory excluded. Placement: in device order (stage s takes
// the next r_s devices), the canonical placement, which keeps an 8-device,
// 10-layer instance at about 20,000 simulations. Kept apart from
// Exhaustive.cpp so that the model-based oracle needs no simulator.
//
//===----------------------------------------------------------------------===//

#include "PlannerUtil.h"

#include <cmath>

using namespace pipec;
using namespace pipec::planner_util;

PlanResult pipec::planExhaustive(const Profile &profile,
                                 const Topology &topology,
                                 const PlannerOptions &options) {
  ExhaustiveOptions eo;
  eo.objective = ExhaustiveObjective::Custom;
  eo.placements = ExhaustivePlacements::InOrder;
  eo.maxCandidates = 200000;
  eo.score = [&](const Plan &plan) {
    SimResult sim = simulatePlan(profile, topology, plan, options.sim);
    if (!sim.ok || !sim.fitsMemory || !(sim.iterationSeconds > 0))
      return kInf;
    return sim.iterationSeconds /
           (static_cast<double>(plan.microbatches) * plan.microbatchSize);
  };
  ExhaustiveResult found = searchExhaustive(profile, topology, options, eo);
  if (!found.ok)
    return planError(found.error);
  Plan plan = std::move(found.plan);
  SimResult sim = simulatePlan(profile, topology, plan, options.sim);
  if (sim.ok) {
    plan.predicted.iterationSeconds = sim.iterationSeconds;
    plan.predicted.samplesPerSecond = sim.samplesPerSecond;
    plan.predicted.bubbleFraction = sim.bubbleFraction;
    plan.predicted.stageMemoryBytes.clear();
    for (const StageMemory &memory : sim.memory)
      plan.predicted.stageMemoryBytes.push_back(memory.total());
  }
  PlanResult result;
  result.ok = true;
  result.plan = std::move(plan);
  return result;
}
