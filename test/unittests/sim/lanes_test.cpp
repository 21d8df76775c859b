//===- lanes_test.cpp - one lane stands for a plan replicated alike -------===//
//
// SimOptions::collapseLanes: a plan whose stages all have r replicas, laid
// out so that lane j crosses the topology as lane 0 does, is simulated as
// lane 0 alone. Every figure simulatePlan reports (iteration, throughput,
// bubble, idle, memory per stage, in-flight counts, every device's peak and
// busy time, fitsMemory) must equal the full simulation's, for every
// schedule, round-robin and split replicas, interleaved chunks, recompute,
// optimizer state and time, on a two-level topology with real latencies.
//
//===----------------------------------------------------------------------===//

#include "pipec/Plan.h"
#include "pipec/Sim.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

using namespace pipec;

namespace {

/// A chain of `layers` layers with jittered times and sizes.
Profile jitteredProfile(int layers, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> jitter(0.7, 1.3);
  Profile profile;
  profile.microbatch = 2;
  for (int i = 0; i < layers; ++i) {
    ProfileOp op;
    op.name = "layer" + std::to_string(i);
    op.op = "Gemm";
    op.fwdSeconds = 1e-3 * jitter(rng);
    op.bwdSeconds = 2e-3 * jitter(rng);
    op.outBytes = int64_t(3e6 * jitter(rng));
    op.paramBytes = int64_t(5e7 * jitter(rng));
    op.savedBytes = int64_t(1e7 * jitter(rng));
    profile.ops.push_back(op);
  }
  return profile;
}

/// 8 nodes of 4 devices: NVLink-class inside a node, a network between.
Topology twoLevels() {
  Topology topology;
  topology.deviceMemoryBytes = 2LL << 30;
  topology.levels = {{"node", 4, 1e11, 5e-6}, {"cluster", 8, 1e10, 2e-5}};
  return topology;
}

/// p device positions (x v chunks), layers split evenly, r replicas of
/// position g on devices g*r .. g*r + r - 1 (lanes alike on twoLevels()
/// for r = 2 and 4).
Plan replicatedPlan(int layers, int p, int v, int r,
                    const std::string &schedule, int m) {
  Plan plan;
  plan.algorithm = "test";
  plan.schedule = schedule;
  plan.microbatches = m;
  plan.microbatchSize = 2;
  plan.chunks = v;
  const int stages = p * v;
  for (int q = 0; q < stages; ++q) {
    StagePlan stage;
    stage.firstLayer = q * layers / stages;
    stage.lastLayer = (q + 1) * layers / stages - 1;
    stage.replicas = r;
    const int g = v > 1 ? q % p : q;
    for (int j = 0; j < r; ++j)
      stage.devices.push_back(g * r + j);
    plan.stages.push_back(stage);
  }
  return plan;
}

void expectSame(const SimResult &lane, const SimResult &full) {
  ASSERT_EQ(lane.ok, full.ok) << lane.error << " | " << full.error;
  if (!full.ok) {
    EXPECT_EQ(lane.error, full.error);
    return;
  }
  EXPECT_DOUBLE_EQ(lane.iterationSeconds, full.iterationSeconds);
  EXPECT_DOUBLE_EQ(lane.samplesPerSecond, full.samplesPerSecond);
  EXPECT_NEAR(lane.bubbleFraction, full.bubbleFraction,
              1e-12 * (1 + full.bubbleFraction));
  EXPECT_NEAR(lane.idleFraction, full.idleFraction, 1e-12);
  EXPECT_EQ(lane.fitsMemory, full.fitsMemory);
  EXPECT_EQ(lane.peakInflight, full.peakInflight);
  ASSERT_EQ(lane.memory.size(), full.memory.size());
  for (size_t q = 0; q < full.memory.size(); ++q) {
    SCOPED_TRACE("stage " + std::to_string(q));
    EXPECT_EQ(lane.memory[q].weights, full.memory[q].weights);
    EXPECT_EQ(lane.memory[q].gradients, full.memory[q].gradients);
    EXPECT_EQ(lane.memory[q].optimizer, full.memory[q].optimizer);
    EXPECT_EQ(lane.memory[q].activations, full.memory[q].activations);
    EXPECT_EQ(lane.memory[q].buffers, full.memory[q].buffers);
    EXPECT_EQ(lane.memory[q].weightVersions, full.memory[q].weightVersions);
  }
  ASSERT_EQ(lane.devices.size(), full.devices.size());
  for (size_t d = 0; d < full.devices.size(); ++d) {
    SCOPED_TRACE("device " + std::to_string(full.devices[d].device));
    EXPECT_EQ(lane.devices[d].device, full.devices[d].device);
    EXPECT_EQ(lane.devices[d].peakBytes, full.devices[d].peakBytes);
    EXPECT_NEAR(lane.devices[d].busySeconds, full.devices[d].busySeconds,
                1e-12 * (1 + full.devices[d].busySeconds));
  }
}

/// Compares both ways of simulating `plan`; returns whether it simulated.
bool compare(const Profile &profile, const Plan &plan, SimOptions options) {
  options.collapseLanes = false;
  SimResult full = simulatePlan(profile, twoLevels(), plan, options);
  options.collapseLanes = true;
  SimResult lane = simulatePlan(profile, twoLevels(), plan, options);
  expectSame(lane, full);
  return full.ok;
}

} // namespace

TEST(SimLanes, RoundRobinEverySchedule) {
  const Profile profile = jitteredProfile(12, 5);
  int simulated = 0;
  for (const char *schedule : {"gpipe", "1f1b-flush", "zb-h1", "1f1b", "2bw"})
    for (int p : {1, 2, 3, 4})
      for (int r : {2, 4})
        for (int mPerLane : {1, 2, 3, 8}) {
          const int m = mPerLane * r;
          if (p * r > 32)
            continue;
          SCOPED_TRACE(std::string(schedule) + " p=" + std::to_string(p) +
                       " r=" + std::to_string(r) + " m=" + std::to_string(m));
          simulated +=
              compare(profile, replicatedPlan(12, p, 1, r, schedule, m), {});
        }
  EXPECT_GE(simulated, 140); // of 160: 2bw refuses a few small m
}

TEST(SimLanes, SplitReplicasAndInterleavedChunks) {
  const Profile profile = jitteredProfile(16, 7);
  SimOptions split;
  split.splitReplicas = true;
  int simulated = 0;
  for (const char *schedule : {"gpipe", "1f1b-flush", "zb-h1"})
    for (int p : {1, 2, 4})
      for (int m : {1, 3, 5, 8}) {
        SCOPED_TRACE(std::string(schedule) + " p=" + std::to_string(p) +
                     " m=" + std::to_string(m));
        simulated +=
            compare(profile, replicatedPlan(16, p, 1, 4, schedule, m), split);
      }
  for (int p : {2, 4})
    for (int v : {2, 4})
      for (int m : {p, 2 * p, 4 * p}) {
        SCOPED_TRACE("interleaved p=" + std::to_string(p) +
                     " v=" + std::to_string(v) + " m=" + std::to_string(m));
        simulated += compare(
            profile, replicatedPlan(16, p, v, 2, "interleaved", m), split);
      }
  EXPECT_EQ(simulated, 36 + 12);
}

TEST(SimLanes, RecomputeOptimizerAndMemoryLimit) {
  const Profile profile = jitteredProfile(12, 9);
  SimOptions options;
  options.recompute = true;
  options.optimizerStateFactor = 2;
  options.optimizerSecondsPerByte = 1e-11;
  options.maxInflight = 2;
  for (const char *schedule : {"1f1b-flush", "1f1b", "2bw"})
    for (int p : {2, 4}) {
      SCOPED_TRACE(std::string(schedule) + " p=" + std::to_string(p));
      // 2 GiB per device: some of these do not fit (fitsMemory false).
      compare(profile, replicatedPlan(12, p, 1, 2, schedule, 8), options);
    }
}

TEST(SimLanes, PlansNotAlikeAndRefusedPlansAgree) {
  const Profile profile = jitteredProfile(12, 3);
  // Lane 1 of stage 1 sits on another node than lane 0's: not alike.
  Plan skewed = replicatedPlan(12, 2, 1, 2, "1f1b-flush", 8);
  skewed.stages[1].devices = {2, 4};
  compare(profile, skewed, {});
  // Uneven replica counts, and m not a multiple of r for 1F1B-RR.
  Plan uneven = replicatedPlan(12, 2, 1, 2, "1f1b", 8);
  uneven.stages[1].replicas = 1;
  uneven.stages[1].devices = {2};
  compare(profile, uneven, {});
  compare(profile, replicatedPlan(12, 2, 1, 2, "1f1b", 7), {});
  compare(profile, replicatedPlan(12, 2, 1, 4, "gpipe", 6), {});
}
