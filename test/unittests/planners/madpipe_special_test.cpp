//===- madpipe_special_test.cpp - MadPipe's special processor, simulated --===//
//
// papers/madpipe.md §2.4, §3.2, §4: the planner returns allocations whose
// special processor holds several non-contiguous stages (one device listed
// by several stages, Plan.h) when they are strictly better than the
// contiguous ones, the simulator runs them (no deadlock) and confirms their
// memory, and the DP's predicted period is compared with the simulated one.
//
//===----------------------------------------------------------------------===//

#include "pipec/Planners.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <set>

using namespace pipec;

namespace {

/// A chain with per-layer loads U = fwd + bwd (bwd = 2 fwd), in ms.
Profile loadChain(const std::vector<double> &loadsMs, int64_t paramBytes,
                  int64_t outBytes, int64_t savedBytes) {
  Profile p;
  p.microbatch = 1;
  for (size_t i = 0; i < loadsMs.size(); ++i) {
    ProfileOp op;
    op.name = "l" + std::to_string(i);
    op.op = "Gemm";
    op.fwdSeconds = loadsMs[i] * 1e-3 / 3;
    op.bwdSeconds = 2 * op.fwdSeconds;
    op.paramBytes = paramBytes;
    op.outBytes = outBytes;
    op.savedBytes = savedBytes;
    p.ops.push_back(op);
  }
  return p;
}

struct Outcome {
  Plan plan;
  SimResult sim;
  double predictedPeriod = 0, simulatedPeriod = 0;
};

/// Plans with madpipe, checks the plan has a special processor with
/// several stages and simulates it.
Outcome planSpecial(const Profile &profile, const Topology &topology,
                    const std::string &schedule = "") {
  Outcome out;
  PlannerOptions options;
  options.schedule = schedule;
  PlanResult r = planMadPipe(profile, topology, options);
  EXPECT_TRUE(r.ok) << r.error;
  if (!r.ok)
    return out;
  out.plan = r.plan;
  EXPECT_EQ(validatePlan(out.plan, static_cast<int>(profile.ops.size())), "");
  EXPECT_FALSE(devicesSharedByStages(out.plan).empty())
      << "expected a special processor";
  out.sim = simulatePlan(profile, topology, out.plan, options.sim);
  EXPECT_TRUE(out.sim.ok) << out.sim.error;
  const double m = out.plan.microbatches;
  out.predictedPeriod = out.plan.predicted.iterationSeconds / m;
  out.simulatedPeriod = out.sim.iterationSeconds / m;
  return out;
}

/// The best contiguous allocation, one stage per device and no replicas
/// (the min-max split of planBalanced), simulated with `schedule`.
double bestContiguousRate(const Profile &profile, const Topology &topology,
                          const std::string &schedule) {
  PlanResult r = planBalanced(profile, topology.numDevices());
  EXPECT_TRUE(r.ok) << r.error;
  if (!r.ok)
    return 0;
  r.plan.schedule = schedule;
  r.plan.microbatches = topology.numDevices();
  SimResult sim = simulatePlan(profile, topology, r.plan);
  EXPECT_TRUE(sim.ok) << sim.error;
  return sim.samplesPerSecond;
}

} // namespace

TEST(MadPipeSpecial, DigestExampleOnTwoDevices) {
  // madpipe.md §4: loads (2, 4, 2) on P = 2: layers 1 and 3 on the special
  // processor, layer 2 on the normal one, period 4 where the best
  // contiguous split needs 6. Memory is limited (1 MiB of weights per layer,
  // 64 MiB per device) so the simulator's memory check runs.
  Profile profile = loadChain({2, 4, 2}, 1 << 20, 1 << 10, 1 << 16);
  Topology topology = Topology::flat(2, 1e10, 1e-6, int64_t(64) << 20);
  Outcome out = planSpecial(profile, topology);
  ASSERT_EQ(out.plan.numStages(), 3);
  EXPECT_EQ(out.plan.stages[0].devices, out.plan.stages[2].devices);
  EXPECT_NE(out.plan.stages[0].devices, out.plan.stages[1].devices);
  ASSERT_TRUE(out.sim.ok);
  EXPECT_TRUE(out.sim.fitsMemory);
  for (const DeviceUsage &usage : out.sim.devices)
    EXPECT_LE(usage.peakBytes, topology.deviceMemoryBytes);
  // Predicted (the DP's load-balance period, communication included) and
  // simulated periods agree within the small transfer latencies.
  double ratio = out.simulatedPeriod / out.predictedPeriod;
  std::printf("[ madpipe special (2,4,2) ] predicted %.6f ms, simulated "
              "%.6f ms per microbatch, simulated/predicted = %.4f\n",
              out.predictedPeriod * 1e3, out.simulatedPeriod * 1e3, ratio);
  RecordProperty("simulated_over_predicted", std::to_string(ratio));
  EXPECT_NEAR(out.predictedPeriod, 4e-3, 1e-5);
  EXPECT_NEAR(ratio, 1, 0.02);
  // Strictly better than the best contiguous plan: period 4 against 6.
  double contiguous = bestContiguousRate(profile, topology, "1f1b");
  std::printf("[ madpipe special (2,4,2) ] %.1f samples/s, best contiguous "
              "%.1f\n",
              out.sim.samplesPerSecond, contiguous);
  EXPECT_GT(out.sim.samplesPerSecond, 1.4 * contiguous);
}

TEST(MadPipeSpecial, HeavyMiddleOnThreeDevices) {
  // Loads (1, 4, 4, 1) on P = 3: the light ends share the special processor
  // (load 2), the heavy layers get a normal one each: period 4; contiguous
  // needs 5 ({1, 4}, {4}, {1}). Both 1f1b and 2bw.
  Profile profile = loadChain({1, 4, 4, 1}, 1 << 20, 1 << 10, 1 << 16);
  Topology topology = Topology::flat(3, 1e10, 1e-6, int64_t(64) << 20);
  for (const char *schedule : {"1f1b", "2bw"}) {
    SCOPED_TRACE(schedule);
    Outcome out = planSpecial(profile, topology, schedule);
    ASSERT_TRUE(out.sim.ok);
    EXPECT_TRUE(out.sim.fitsMemory);
    ASSERT_EQ(out.plan.numStages(), 4);
    EXPECT_EQ(out.plan.stages[0].devices, out.plan.stages[3].devices);
    EXPECT_EQ(out.plan.schedule, schedule);
    double ratio = out.simulatedPeriod / out.predictedPeriod;
    std::printf("[ madpipe special (1,4,4,1) %s ] predicted %.6f ms, "
                "simulated %.6f ms per microbatch, simulated/predicted = "
                "%.4f\n",
                schedule, out.predictedPeriod * 1e3, out.simulatedPeriod * 1e3,
                ratio);
    EXPECT_NEAR(ratio, 1, 0.02);
    double contiguous = bestContiguousRate(profile, topology, schedule);
    EXPECT_GT(out.sim.samplesPerSecond, 1.2 * contiguous);
  }
}

TEST(MadPipeSpecial, TightMemoryFallsBackToContiguous) {
  // (2, 4, 2) with heavy activations a per layer and a limit of about 3a:
  // the special processor stashes three microbatches of layer 1 and one of
  // layer 3 (4a in the simulator; the DP charges it g - 1 = 2 only, §2.4),
  // so the simulator refuses it and madpipe keeps one stage per device
  // ({0}, {1, 2}: 2a each), which fits.
  const int64_t a = int64_t(16) << 20;
  Profile profile = loadChain({2, 4, 2}, 1 << 10, 1 << 10, a);
  Topology topology = Topology::flat(2, 1e10, 1e-6, 3 * a + (1 << 20));
  PlanResult r = planMadPipe(profile, topology, {});
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(devicesSharedByStages(r.plan).empty());
  SimResult sim = simulatePlan(profile, topology, r.plan, {});
  ASSERT_TRUE(sim.ok) << sim.error;
  EXPECT_TRUE(sim.fitsMemory);
  // The special-processor plan itself does not fit.
  Plan special = r.plan;
  special.stages.clear();
  for (int layer = 0; layer < 3; ++layer) {
    StagePlan stage;
    stage.firstLayer = stage.lastLayer = layer;
    stage.devices = {layer == 1 ? 0 : 1};
    special.stages.push_back(stage);
  }
  special.predicted.stageMemoryBytes.clear();
  special.microbatches = 3;
  SimResult refused = simulatePlan(profile, topology, special, {});
  ASSERT_TRUE(refused.ok) << refused.error;
  EXPECT_FALSE(refused.fitsMemory);
  // With room for 4a (plus weights and buffers) the special processor is
  // back.
  topology.deviceMemoryBytes = 4 * a + (2 << 20);
  r = planMadPipe(profile, topology, {});
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(devicesSharedByStages(r.plan), (std::vector<int>{1}));
  sim = simulatePlan(profile, topology, r.plan, {});
  ASSERT_TRUE(sim.ok) << sim.error;
  EXPECT_TRUE(sim.fitsMemory);
}

TEST(MadPipeSpecial, UnlimitedMemoryAndAutoAcceptIt) {
  // Without a memory limit the special processor is simulated for deadlock
  // only; `auto` scores the madpipe plan with the same simulator.
  Profile profile = loadChain({2, 4, 2}, 1 << 20, 1 << 10, 1 << 16);
  Topology topology = Topology::flat(2, 1e10, 1e-6);
  PlanResult r = planMadPipe(profile, topology, {});
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(devicesSharedByStages(r.plan), (std::vector<int>{1}));
  AutoPlanResult best = planAuto(profile, topology, {});
  ASSERT_TRUE(best.ok) << best.error;
  bool scored = false;
  for (const PlanCandidate &c : best.candidates)
    if (c.plan.algorithm == "madpipe") {
      scored = true;
      EXPECT_TRUE(c.feasible) << c.note;
      EXPECT_TRUE(c.sim.ok) << c.sim.error;
    }
  EXPECT_TRUE(scored);
  // The plan round-trips through plan.json with its shared device.
  PlanResult parsed = planFromJson(planToJson(r.plan));
  ASSERT_TRUE(parsed.ok) << parsed.error;
  EXPECT_EQ(devicesSharedByStages(parsed.plan), (std::vector<int>{1}));
  SimResult again = simulatePlan(profile, topology, parsed.plan, {});
  EXPECT_TRUE(again.ok) << again.error;
}
