//===- Bounds.cpp - what no simulation of a plan can beat -----------------===//
//
// Part of pipec's simulator library: flushIterationLowerBound and
// iterationLowerBound (see include/pipec/Sim.h), with the stage times the
// simulator uses
// (Simulator.cpp, buildStages).
//
//===----------------------------------------------------------------------===//

#include "pipec/Sim.h"

#include <algorithm>
#include <map>

namespace pipec {

namespace {

/// The busiest device's compute per iteration: over one step (flush), or
/// per m microbatches of the steady state (continuous, where a round-robin
/// replica runs m / r of them on average).
double busiestDeviceCompute(const Profile &profile, const Plan &plan,
                            const SimOptions &options, bool steadyState) {
  auto kind = parseScheduleKind(plan.schedule);
  if (!kind || isFlushSchedule(*kind) == steadyState ||
      profile.microbatch < 1 || plan.microbatches < 1 ||
      !validatePlan(plan, int(profile.ops.size())).empty())
    return 0;
  const double sigma = double(plan.microbatchSize) / profile.microbatch;
  const int64_t m = plan.microbatches;
  std::map<int, double> deviceWork;
  for (const StagePlan &stage : plan.stages) {
    if (stage.devices.empty() || stage.replicas < 1)
      return 0;
    double fwd = 0, bwd = 0, optimizer = 0;
    int64_t params = 0;
    for (int l = stage.firstLayer; l <= stage.lastLayer; ++l) {
      fwd += profile.ops[size_t(l)].fwdSeconds;
      bwd += profile.ops[size_t(l)].bwdSeconds;
      optimizer += profile.ops[size_t(l)].optSeconds;
      params += profile.ops[size_t(l)].paramBytes;
    }
    optimizer += options.optimizerSecondsPerByte * double(params);
    const bool recompute = options.recompute || stage.recompute == "full";
    const double perMicrobatch =
        sigma * fwd + sigma * bwd + (recompute ? sigma * fwd : 0);
    const int r = stage.replicas;
    // The updates of the continuous schedules run on compute (1f1b after
    // every local backward of a replica, 2bw once per batch and replica);
    // the copies into stashed versions are left out (a bound). The flush
    // schedules' optimizer follows the iteration's last backward, outside
    // this sum.
    double perStep = 0;
    if (*kind == ScheduleKind::OneFOneB)
      perStep = optimizer * double(m) / (options.splitReplicas ? 1 : r);
    else if (*kind == ScheduleKind::TwoBW)
      perStep = optimizer;
    for (size_t j = 0; j < stage.devices.size(); ++j) {
      // Round robin: replica j runs microbatches j, j + r, ...
      const double share =
          options.splitReplicas || steadyState
              ? double(m) * perMicrobatch / r
              : double((m - int64_t(j) + r - 1) / r) * perMicrobatch;
      deviceWork[stage.devices[j]] += std::max(share, 0.0) + perStep;
    }
  }
  double busiest = 0;
  for (const auto &[device, work] : deviceWork)
    busiest = std::max(busiest, work);
  return busiest;
}

} // namespace

double flushIterationLowerBound(const Profile &profile, const Plan &plan,
                                const SimOptions &options) {
  // The simulator adds the same terms in another order: leave room for
  // rounding so that the bound never exceeds what it reports.
  return busiestDeviceCompute(profile, plan, options, false) * (1 - 1e-9);
}

double iterationLowerBound(const Profile &profile, const Plan &plan,
                           const SimOptions &options) {
  auto kind = parseScheduleKind(plan.schedule);
  if (!kind)
    return 0;
  if (isFlushSchedule(*kind))
    return flushIterationLowerBound(profile, plan, options);
  // The steady state is measured over a finite window of steps: leave a
  // margin (0.1%) for work a window boundary splits unevenly.
  return busiestDeviceCompute(profile, plan, options, true) * (1 - 1e-3);
}

} // namespace pipec
