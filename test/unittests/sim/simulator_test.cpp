//===- simulator_test.cpp - discrete-event simulator tests ----------------===//
//
// simulatePlan against closed forms: makespan (m+p-1)(t_f+t_b) and bubble
// (p-1)/m for GPipe / 1F1B-flush, (m+(p-1)/v)(t_f+t_b) and (p-1)/(v m) for
// interleaved on uniform stages without communication (thesis.md §4.1, §7
// invariant 9), zero bubble for continuous 1F1B / 2BW, ZB-H1's
// (p-1)(T_F+T_B-T_W); communication (p2p, skip connections, allreduce of
// replicated stages), memory (weight versions p-s for PipeDream, 2 for 2BW,
// stashed activations at the closed-form in-flight count, recompute), the
// Chrome trace, deadlock reports and bad input.
//
//===----------------------------------------------------------------------===//

#include "pipec/Plan.h"
#include "pipec/Sim.h"
#include "sim_test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

using namespace pipec;
using pipec::simtest::uniformProfile;

namespace {

/// One layer per stage, one device per stage (device = stage index), or
/// `replicas` per stage on consecutive devices.
Plan straightPlan(int stages, const std::string &schedule, int microbatches,
                  std::vector<int> replicas = {}) {
  Plan plan;
  plan.algorithm = "test";
  plan.schedule = schedule;
  plan.microbatches = microbatches;
  int device = 0;
  for (int s = 0; s < stages; ++s) {
    StagePlan stage;
    stage.firstLayer = stage.lastLayer = s;
    stage.replicas = replicas.empty() ? 1 : replicas[s];
    for (int j = 0; j < stage.replicas; ++j)
      stage.devices.push_back(device++);
    plan.stages.push_back(stage);
  }
  return plan;
}

/// Two stages, one device each: layers 0..cut and cut + 1..last.
Plan twoStagePlan(const std::string &schedule, int microbatches, int cut,
                  int last) {
  Plan plan = straightPlan(2, schedule, microbatches);
  plan.stages[0].lastLayer = cut;
  plan.stages[1].firstLayer = cut + 1;
  plan.stages[1].lastLayer = last;
  return plan;
}

/// p*v virtual stages of one layer each; virtual stage c*p + r on device r.
Plan interleavedPlan(int p, int v, int microbatches) {
  Plan plan = straightPlan(p * v, "interleaved", microbatches);
  plan.chunks = v;
  for (int q = 0; q < p * v; ++q)
    plan.stages[q].devices = {q % p};
  return plan;
}

/// 2p one-layer stages on p devices in a V (device r holds stages r and
/// 2p-1-r), for zb-v and dualpipev.
Plan vPlan(int p, const std::string &schedule, int microbatches) {
  Plan plan = straightPlan(2 * p, schedule, microbatches);
  plan.chunks = 2;
  for (int q = 0; q < 2 * p; ++q)
    plan.stages[q].devices = {int(positionOfStage(Placement::V, p, q))};
  return plan;
}

Topology freeNetwork(int devices = 64) {
  return Topology::flat(devices, 1e12, 0);
}

SimResult simulate(const Profile &profile, const Plan &plan,
                   const Topology &topology = freeNetwork(),
                   SimOptions options = {}) {
  SimResult result = simulatePlan(profile, topology, plan, options);
  EXPECT_TRUE(result.ok) << result.error;
  return result;
}

/// An arena-model profile (memory_model "arena") of a chain of ops of
/// these kinds, outputs of 64 bytes.
Profile arenaChain(const std::vector<std::string> &kinds) {
  Profile profile = uniformProfile(int(kinds.size()), 1, 2, /*outBytes=*/64);
  profile.memoryModel = "arena";
  for (size_t l = 0; l < kinds.size(); ++l)
    profile.ops[l].op = kinds[l];
  return profile;
}

} // namespace

//===----------------------------------------------------------------------===//
// Closed forms on uniform stages, zero communication
//===----------------------------------------------------------------------===//

TEST(SimUniform, ThesisWorkedExample) {
  // p = 4, m = 8, t_f = 1, t_b = 2: makespan 33 = (8 + 3) * 3, bubble 3/8
  // (thesis.md §5.2).
  for (const char *schedule : {"gpipe", "1f1b-flush"}) {
    SimResult result =
        simulate(uniformProfile(4, 1, 2), straightPlan(4, schedule, 8));
    EXPECT_DOUBLE_EQ(result.iterationSeconds, 33) << schedule;
    EXPECT_DOUBLE_EQ(result.bubbleFraction, 3.0 / 8) << schedule;
    EXPECT_DOUBLE_EQ(result.idleFraction, 9.0 / 33) << schedule;
    EXPECT_DOUBLE_EQ(result.samplesPerSecond, 8.0 / 33) << schedule;
  }
}

TEST(SimUniform, GPipeAndFlushBubbleIsPMinusOneOverM) {
  const std::pair<double, double> times[] = {{1, 1}, {1, 2}, {2, 3}, {1, 3}};
  for (const char *schedule : {"gpipe", "1f1b-flush"})
    for (int p = 1; p <= 6; ++p)
      for (int m : {1, 2, 3, 4, 7, 8, 12})
        for (auto [tf, tb] : times) {
          SCOPED_TRACE(std::string(schedule) + " p=" + std::to_string(p) +
                       " m=" + std::to_string(m) + " tf=" + std::to_string(tf) +
                       " tb=" + std::to_string(tb));
          SimResult result =
              simulate(uniformProfile(p, tf, tb), straightPlan(p, schedule, m));
          EXPECT_DOUBLE_EQ(result.iterationSeconds, (m + p - 1) * (tf + tb));
          EXPECT_NEAR(result.bubbleFraction, double(p - 1) / m, 1e-12);
          for (int s = 0; s < p; ++s)
            EXPECT_EQ(
                result.peakInflight[s],
                closedFormInflight(*parseScheduleKind(schedule), p, s, m));
        }
}

TEST(SimUniform, InterleavedBubbleIsPMinusOneOverVM) {
  // (p, v, m) of thesis.md §4.1 [S]; chunk ops take t_f/v and t_b/v.
  const int shapes[][3] = {{4, 2, 8},  {4, 2, 4}, {4, 3, 8}, {8, 2, 16},
                           {4, 4, 16}, {2, 2, 4}, {4, 2, 12}};
  const std::pair<double, double> chunkTimes[] = {{0.5, 1}, {1, 1}, {1, 3}};
  for (const auto &shape : shapes)
    for (auto [a, b] : chunkTimes) {
      const int p = shape[0], v = shape[1], m = shape[2];
      SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) +
                   " m=" + std::to_string(m) + " a=" + std::to_string(a));
      SimResult result =
          simulate(uniformProfile(p * v, a, b), interleavedPlan(p, v, m));
      // (m + (p-1)/v)(t_f + t_b) with t_f = v a, t_b = v b.
      EXPECT_NEAR(result.iterationSeconds, (m * v + p - 1) * (a + b), 1e-9);
      EXPECT_NEAR(result.bubbleFraction, double(p - 1) / (v * m), 1e-12);
    }
  // The thesis' example: 28.5 = (8 + 3/2) * 3, bubble 3/16.
  SimResult example =
      simulate(uniformProfile(8, 0.5, 1), interleavedPlan(4, 2, 8));
  EXPECT_DOUBLE_EQ(example.iterationSeconds, 28.5);
  EXPECT_DOUBLE_EQ(example.bubbleFraction, 3.0 / 16);
}

TEST(SimUniform, ContinuousSchedulesHaveNoBubble) {
  // PipeDream 1F1B and 2BW: idle fraction 0 in steady state (Table 7.1);
  // one iteration of m microbatches takes m (t_f + t_b).
  for (const char *schedule : {"1f1b", "2bw"})
    for (int p : {1, 2, 4, 5})
      for (int m : {1, 4, 8}) {
        if (std::string(schedule) == "2bw" && m < p - 1)
          continue;
        SCOPED_TRACE(std::string(schedule) + " p=" + std::to_string(p) +
                     " m=" + std::to_string(m));
        SimResult result =
            simulate(uniformProfile(p, 1, 2), straightPlan(p, schedule, m));
        EXPECT_NEAR(result.iterationSeconds, m * 3.0, 1e-9);
        EXPECT_NEAR(result.bubbleFraction, 0, 1e-9);
        for (int s = 0; s < p; ++s)
          EXPECT_EQ(result.peakInflight[s], p - s);
      }
}

TEST(SimUniform, ZeroBubbleH1AndH2) {
  // T_F = T_B = T_W = 1 (backward 2, half of it the weight gradient): the
  // bubble shrinks from (p-1)(T_F+T_B+T_W) to (p-1)(T_F+T_B-T_W) (Qi et al.,
  // ZB-H1), i.e. the makespan is 3m + (p-1). zb-h2 also ends at 3m + (p-1);
  // no stage waits once it has started, and it holds min(2p - 1, m)
  // microbatches on every stage. With a shorter W (alpha = 0.25: B = 1.5,
  // W = 0.5) it beats zb-h1, which waits for the last backwards with fewer
  // W ops to fill in.
  for (int p = 1; p <= 6; ++p)
    for (int m : {p, p + 1, 2 * p, 3 * p + 2}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      SimResult result =
          simulate(uniformProfile(p, 1, 2), straightPlan(p, "zb-h1", m));
      EXPECT_DOUBLE_EQ(result.iterationSeconds, 3.0 * m + (p - 1));
      SimResult flush =
          simulate(uniformProfile(p, 1, 2), straightPlan(p, "1f1b-flush", m));
      EXPECT_DOUBLE_EQ(flush.iterationSeconds, 3.0 * (m + p - 1));
      for (int s = 0; s < p; ++s)
        EXPECT_EQ(result.peakInflight[s], std::min(p, m));
      SimResult h2 =
          simulate(uniformProfile(p, 1, 2), straightPlan(p, "zb-h2", m));
      EXPECT_DOUBLE_EQ(h2.iterationSeconds, 3.0 * m + (p - 1));
      for (int s = 0; s < p; ++s)
        EXPECT_EQ(h2.peakInflight[s], std::min(2 * p - 1, m));
      SimOptions shortW;
      shortW.weightGradFraction = 0.25;
      SimResult h2w =
          simulate(uniformProfile(p, 1, 2), straightPlan(p, "zb-h2", m),
                   freeNetwork(), shortW);
      SimResult h1w =
          simulate(uniformProfile(p, 1, 2), straightPlan(p, "zb-h1", m),
                   freeNetwork(), shortW);
      EXPECT_LE(h2w.iterationSeconds, h1w.iterationSeconds + 1e-9);
      if (p > 1 && m > p) {
        EXPECT_LT(h2w.iterationSeconds, h1w.iterationSeconds);
      }
    }
}

TEST(SimUniform, ZeroBubbleV) {
  // 2p one-layer stages in a V (device r holds stages r and 2p-1-r), each
  // chunk T_F = T_B = T_W = 1 (backward 2, half of it W): a device works
  // 6m, and the V halves ZB-H1's bubble to (p-1) T: makespan 6m + p - 1
  // once m >= 2p - 1 (ZB-V needs that many to fill the V). It beats zb-h1
  // and interleaved on the same devices and layers (its in-flight peak is
  // checked in schedule_test).
  for (int p = 1; p <= 6; ++p)
    for (int m : {2 * p - 1, 2 * p, 3 * p + 2}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      SimResult v = simulate(uniformProfile(2 * p, 1, 2), vPlan(p, "zb-v", m));
      EXPECT_DOUBLE_EQ(v.iterationSeconds, 6.0 * m + (p - 1));
      SimResult h1 =
          simulate(uniformProfile(p, 2, 4), straightPlan(p, "zb-h1", m));
      SimResult il = simulate(uniformProfile(2 * p, 1, 2),
                              interleavedPlan(p, 2, m % p == 0 ? m : m * p));
      if (p > 1) {
        EXPECT_LT(v.iterationSeconds, h1.iterationSeconds);
        if (m % p == 0) {
          EXPECT_LT(v.iterationSeconds, il.iterationSeconds);
        }
      }
    }
}

TEST(SimUniform, DualPipeV) {
  // The same V as zb-v (2p one-layer stages, T_F = T_B = T_W = 1 per
  // chunk) in DualPipeV's order: 6m + p - 1, zb-v's makespan, for one more
  // chunk-microbatch in flight (2p + 1, checked in schedule_test). Its pairs
  // of a forward and a backward of the two chunks run one after the other
  // here (no overlap of their communication and compute, DualPipe's gain).
  for (int p = 1; p <= 6; ++p)
    for (int m : {2 * p, 2 * p + 1, 3 * p + 2}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      SimResult d =
          simulate(uniformProfile(2 * p, 1, 2), vPlan(p, "dualpipev", m));
      EXPECT_DOUBLE_EQ(d.iterationSeconds, 6.0 * m + (p - 1));
      SimResult v = simulate(uniformProfile(2 * p, 1, 2), vPlan(p, "zb-v", m));
      EXPECT_DOUBLE_EQ(d.iterationSeconds, v.iterationSeconds);
    }
}

//===----------------------------------------------------------------------===//
// Cost model: scaling, recompute, communication
//===----------------------------------------------------------------------===//

TEST(SimCost, MicrobatchScalingAndRecompute) {
  Profile profile = uniformProfile(2, 1, 2);
  Plan plan = straightPlan(2, "gpipe", 3);
  EXPECT_DOUBLE_EQ(simulate(profile, plan).iterationSeconds, 4 * 3.0);
  plan.microbatchSize = 2; // twice the profiled microbatch: twice the time
  SimResult doubled = simulate(profile, plan);
  EXPECT_DOUBLE_EQ(doubled.iterationSeconds, 4 * 6.0);
  EXPECT_DOUBLE_EQ(doubled.samplesPerSecond, 6.0 / 24);
  // Recompute: the backward runs one more forward, (1 + 2 + 1) / 3 = 4/3.
  plan.microbatchSize = 1;
  SimOptions options;
  options.recompute = true;
  EXPECT_DOUBLE_EQ(
      simulate(profile, plan, freeNetwork(), options).iterationSeconds,
      4 * 4.0);
}

TEST(SimCost, OptimizerAndVersionCopiesRunOnCompute) {
  // Each layer: forward 1, backward 2, an optimizer update of 0.5 (opt_s)
  // and a weight copy of 0.25 (1000 parameter bytes at 4000 bytes/s).
  auto profile = [](int layers) {
    Profile p = uniformProfile(layers, 1, 2, 0, 1000);
    for (ProfileOp &op : p.ops)
      op.optSeconds = 0.5;
    p.copyBytesPerSecond = 4000;
    return p;
  };
  // Flush: one update after the step. 1f1b on one stage: one update per
  // microbatch and no stashed version (depth 1). 2bw: one update and one
  // shadow copy per batch.
  EXPECT_NEAR(
      simulate(profile(1), straightPlan(1, "gpipe", 4)).iterationSeconds,
      4 * 3 + 0.5, 1e-9);
  EXPECT_NEAR(simulate(profile(1), straightPlan(1, "1f1b", 4)).iterationSeconds,
              4 * 3.5, 1e-6);
  EXPECT_NEAR(simulate(profile(1), straightPlan(1, "2bw", 4)).iterationSeconds,
              4 * 3 + 0.75, 1e-6);
  // Two stages of 1f1b: stage 0 keeps two versions (depth 2) and copies the
  // live weights at every update, so it bounds the steady state at
  // 3 + 0.5 + 0.25 per microbatch; stage 1 (depth 1) needs 3.5.
  SimResult two = simulate(profile(2), straightPlan(2, "1f1b", 8));
  EXPECT_NEAR(two.iterationSeconds, 8 * 3.75, 1e-6);
  // The optimizer costs per-byte too (SimOptions), on top of opt_s.
  SimOptions options;
  options.optimizerSecondsPerByte = 1e-4; // 0.1 per update
  EXPECT_NEAR(
      simulate(profile(1), straightPlan(1, "1f1b", 4), freeNetwork(), options)
          .iterationSeconds,
      4 * 3.6, 1e-6);
  // The busiest device's compute includes its updates.
  EXPECT_NEAR(two.devices[0].busySeconds, 8 * 3.75, 1e-6);
}

TEST(SimCost, OpOverheadPerCall) {
  // Three layers of forward 1 and backward 2, the last without a backward:
  // the profile's op_overhead_s (0.1) is added to three forwards and two
  // backwards per microbatch, unscaled by the microbatch.
  Profile profile = uniformProfile(3, 1, 2);
  profile.ops[2].bwdSeconds = 0;
  profile.opOverheadSeconds = 0.1;
  Plan plan = straightPlan(1, "gpipe", 4);
  plan.stages[0].lastLayer = 2;
  EXPECT_NEAR(simulate(profile, plan).iterationSeconds, 4 * (3 + 4 + 5 * 0.1),
              1e-9);
}

TEST(SimCost, PointToPointTransfers) {
  // Two stages, one microbatch: F0, send, F1, B1, send, B0.
  Profile profile = uniformProfile(2, 1, 2, /*outBytes=*/1000);
  Topology topology = Topology::flat(2, /*bandwidth=*/100, /*latency=*/0.5);
  const double c = topology.p2pSeconds(1000, 0, 1);
  EXPECT_DOUBLE_EQ(c, 10.5);
  SimResult result =
      simulate(profile, straightPlan(2, "gpipe", 1), topology, {});
  EXPECT_DOUBLE_EQ(result.iterationSeconds, 2 * 3.0 + 2 * c);
  // 1F1B-flush, m = 4, c = 1 ms: by hand, stage 0 waits for each
  // gradient of the first two and last two microbatches a round trip 2c,
  // and the middle one's F then B hop 2c more: (m + p - 1)(t_f + t_b) + 4c.
  Topology fast = Topology::flat(2, 1e6, 0);
  const double c1 = fast.p2pSeconds(1000, 0, 1);
  SimResult overlapped =
      simulate(profile, straightPlan(2, "1f1b-flush", 4), fast, {});
  EXPECT_NEAR(overlapped.iterationSeconds, 5 * 3.0 + 4 * c1, 1e-9);
  // GPipe overlaps all but one round trip: F's stream, B's stream.
  SimResult gpipe = simulate(profile, straightPlan(2, "gpipe", 4), fast, {});
  EXPECT_NEAR(gpipe.iterationSeconds, 5 * 3.0 + 2 * c1, 1e-9);
}

TEST(SimCost, SkipConnectionsAreSentToTheirConsumer) {
  // op0 -> op1 -> op2 -> op3, and op3 also reads op0 (a skip over stage 1).
  // Stages {0,1}, {2}, {3}: the cut after layer 1 carries op1 and op0, the
  // cut after layer 2 op2 and op0.
  Profile profile = uniformProfile(4, 1, 1);
  profile.ops[0].outBytes = 100;
  profile.ops[1].outBytes = 1;
  profile.ops[2].outBytes = 1;
  profile.ops[3].inputs = {2, 0};
  Plan plan = straightPlan(3, "gpipe", 1);
  plan.stages[0].lastLayer = 1;
  plan.stages[1].firstLayer = plan.stages[1].lastLayer = 2;
  plan.stages[2].firstLayer = plan.stages[2].lastLayer = 3;
  ASSERT_EQ(validatePlan(plan, 4), "");
  EXPECT_EQ(cutBytes(profile, 1, &plan), 101);
  EXPECT_EQ(cutBytes(profile, 2, &plan), 101);
  Topology topology = Topology::flat(3, /*bandwidth=*/1, /*latency=*/0);
  // F0 [0,2]; op1 -> stage 1 arrives 3, op0 -> stage 2 arrives 102;
  // F1 [3,4]; op2 arrives 5; F2 [102,103]; B2 [103,104]; gradient of op2
  // arrives 105, of op0 at 204; B1 [105,106]; B0 [204,206].
  SimResult result = simulate(profile, plan, topology);
  EXPECT_DOUBLE_EQ(result.iterationSeconds, 206);
}

TEST(SimCost, ReplicatedStagesAllreduce) {
  // One stage on two replicas: microbatch k on replica k mod 2, then the
  // gradient allreduce of its parameters (topology.allreduceSeconds).
  Profile profile = uniformProfile(1, 1, 2, 0, /*paramBytes=*/4000);
  Topology topology = Topology::flat(2, 1000, 0.01);
  const double allreduce = topology.allreduceSeconds(4000, {0, 1});
  EXPECT_GT(allreduce, 0);
  Plan plan = straightPlan(1, "1f1b-flush", 4, {2});
  SimOptions options;
  options.trace = true;
  SimResult result = simulate(profile, plan, topology, options);
  EXPECT_DOUBLE_EQ(result.iterationSeconds, 2 * 3.0 + allreduce);
  EXPECT_EQ(result.peakInflight[0], 1);
  auto trace = nlohmann::json::parse(result.traceJson);
  int allreduces = 0;
  for (const auto &event : trace)
    if (event["ph"] == "X" && event["tid"] == 3) {
      EXPECT_EQ(event["name"], "allreduce");
      EXPECT_NEAR(event["dur"].get<double>(), allreduce * 1e6, 1e-3);
      ++allreduces;
    }
  EXPECT_EQ(allreduces, 2); // one per replica device
  // An unreplicated plan does not allreduce.
  SimResult single =
      simulate(profile, straightPlan(1, "1f1b-flush", 4), topology, options);
  EXPECT_DOUBLE_EQ(single.iterationSeconds, 4 * 3.0);
  EXPECT_EQ(single.traceJson.find("allreduce\",\"ph\":\"X\""),
            std::string::npos);
}

TEST(SimCost, RoundRobinReplicasBalanceAHeavyStage) {
  // PipeDream's 2-1: stage 0 takes twice as long as stage 1 and runs on two
  // replicas; in steady state one microbatch leaves per unit of time.
  Profile profile = uniformProfile(2, 1, 1);
  profile.ops[1].fwdSeconds = profile.ops[1].bwdSeconds = 0.5;
  for (int m : {2, 4, 8}) {
    SimResult result =
        simulate(profile, straightPlan(2, "1f1b", m, {2, 1}), freeNetwork());
    EXPECT_NEAR(result.iterationSeconds, m * 1.0, 1e-9) << m;
    EXPECT_NEAR(result.bubbleFraction, 0, 1e-9);
    // NOAM = ceil(3 / 2) = 2 in flight per input-stage replica.
    EXPECT_EQ(result.peakInflight[0], 2);
    EXPECT_EQ(result.devices.size(), 3u);
  }
}

TEST(SimCost, DappleSplitReplicas) {
  // dapple.md §6.2 (d), "Single stage (DP)": F = 1, B = 2 per microbatch
  // slice, AR = 5, M = 4: 4 (F + B) + AR = 17.
  SimOptions split;
  split.splitReplicas = true;
  {
    Profile profile = uniformProfile(1, 2, 4, 0, /*paramBytes=*/5);
    Topology topology = Topology::flat(2, /*bandwidth=*/1, /*latency=*/0);
    ASSERT_DOUBLE_EQ(topology.allreduceSeconds(5, {0, 1}), 5);
    SimResult result = simulate(profile, straightPlan(1, "1f1b-flush", 4, {2}),
                                topology, split);
    EXPECT_DOUBLE_EQ(result.iterationSeconds, 17);
    EXPECT_EQ(result.peakInflight[0], 1);
  }
  // Fig. 8(a): stage 0 twice as slow as stage 1 and replicated twice, so
  // each slice takes as long as stage 1: a uniform 2-stage pipeline,
  // (m + p - 1)(t_f + t_b) = 5 * 3.
  Profile profile = uniformProfile(2, 2, 4, 0, 0, /*savedBytes=*/100);
  profile.ops[1].fwdSeconds = 1;
  profile.ops[1].bwdSeconds = 2;
  for (const char *schedule : {"gpipe", "1f1b-flush", "zb-h1"}) {
    SimResult result = simulate(profile, straightPlan(2, schedule, 4, {2, 1}),
                                freeNetwork(), split);
    // ZB-H1: 3m + (p - 1)(T_F + T_B - T_W) with T_F = T_B = T_W = 1.
    const bool zb = std::string(schedule) == "zb-h1";
    EXPECT_DOUBLE_EQ(result.iterationSeconds, zb ? 13 : 15) << schedule;
    // A replica stashes its half of each microbatch.
    if (std::string(schedule) == "gpipe") {
      EXPECT_EQ(result.memory[0].activations, 4 * 50);
    }
  }
  // Round robin instead: whole microbatches alternate between replicas.
  SimResult rr = simulate(profile, straightPlan(2, "gpipe", 4, {2, 1}));
  EXPECT_GT(rr.iterationSeconds, 15);
  EXPECT_EQ(rr.memory[0].activations, 2 * 100);
}

TEST(SimCost, UnevenSplitConcatConservesBytes) {
  // 11:5 and 15:1 (dapple.md §4): every slice overlap is one message and
  // the slices of a microbatch add up to the whole boundary tensor, in both
  // directions.
  const std::vector<std::vector<int>> shapes = {{11, 5}, {15, 1}, {3, 2, 4}};
  for (const std::vector<int> &replicas : shapes) {
    const int p = static_cast<int>(replicas.size());
    int devices = 0;
    for (int r : replicas)
      devices += r;
    Profile profile = uniformProfile(p, 1, 2, /*outBytes=*/3300);
    SimOptions options;
    options.splitReplicas = true;
    options.trace = true;
    const int m = 6;
    SimResult result =
        simulate(profile, straightPlan(p, "1f1b-flush", m, replicas),
                 Topology::flat(devices, /*bandwidth=*/1e6, 0), options);
    nlohmann::json trace = nlohmann::json::parse(result.traceJson);
    double activationBytes = 0, gradientBytes = 0;
    int computeOps = 0;
    for (const auto &event : trace) {
      if (event["ph"] != "X")
        continue;
      if (event["tid"] == 0)
        ++computeOps;
      if (event["name"] == "send activation")
        activationBytes += event["dur"].get<double>(); // us = bytes
      if (event["name"] == "send gradient")
        gradientBytes += event["dur"].get<double>();
    }
    EXPECT_NEAR(activationBytes, (p - 1) * m * 3300.0, 1e-3 * p * m);
    EXPECT_NEAR(gradientBytes, (p - 1) * m * 3300.0, 1e-3 * p * m);
    // Every replica runs F and B of every microbatch.
    EXPECT_EQ(computeOps, 2 * m * devices);
  }
}

//===----------------------------------------------------------------------===//
// Memory
//===----------------------------------------------------------------------===//

TEST(SimMemory, WeightVersionsPerSchedule) {
  const int p = 4;
  const int64_t params = 1000, saved = 10;
  Profile profile = uniformProfile(p, 1, 2, 0, params, saved);
  SimOptions options;
  options.optimizerStateFactor = 2; // Adam
  for (const char *schedule : {"1f1b", "2bw", "1f1b-flush", "gpipe"}) {
    SCOPED_TRACE(schedule);
    SimResult result =
        simulate(profile, straightPlan(p, schedule, 8), freeNetwork(), options);
    ASSERT_EQ(result.memory.size(), size_t(p));
    for (int s = 0; s < p; ++s) {
      const StageMemory &memory = result.memory[s];
      // PipeDream: p - s versions (0-based s); 2BW: 2; flush: 1.
      int versions = std::string(schedule) == "1f1b"  ? p - s
                     : std::string(schedule) == "2bw" ? 2
                                                      : 1;
      EXPECT_EQ(memory.weightVersions, versions) << "stage " << s;
      EXPECT_EQ(memory.weights, params * versions);
      EXPECT_EQ(memory.gradients, params);
      EXPECT_EQ(memory.optimizer, 2 * params);
      int64_t inflight = std::string(schedule) == "gpipe" ? 8 : p - s;
      EXPECT_EQ(result.peakInflight[s], inflight);
      EXPECT_EQ(memory.activations, saved * inflight);
      EXPECT_EQ(memory.buffers, 0); // no boundary bytes in this profile
    }
  }
}

TEST(SimMemory, RecomputeStashesStageInputs) {
  // Stage inputs of 50 bytes, 10 saved bytes per layer, 2 layers per stage.
  Profile profile = uniformProfile(4, 1, 2, /*outBytes=*/50, 0, 10);
  Plan plan = twoStagePlan("gpipe", 6, 1, 3);
  SimResult plain = simulate(profile, plan);
  EXPECT_EQ(plain.memory[1].activations, 6 * 20);
  SimOptions options;
  options.recompute = true;
  SimResult recompute = simulate(profile, plan, freeNetwork(), options);
  // m stage inputs + one microbatch's activations (thesis.md §3.4).
  EXPECT_EQ(recompute.memory[1].activations, 6 * 50 + 20);
  EXPECT_EQ(recompute.memory[0].activations, 20); // the data input is free
}

TEST(SimMemory, ArenaModelMatchesTheLoweringsLayout) {
  // memory_model "arena": a chain gemm(0) -> relu(1) | gemm(2) -> relu(3),
  // outputs of 64 bytes (64-aligned), stage 0 = ops 0-1, stage 1 = 2-3.
  Profile profile = uniformProfile(4, 1, 2, /*outBytes=*/64);
  profile.memoryModel = "arena";
  const int64_t saved[] = {64, 64, 64, 0}, fwd[] = {128, 0, 128, 0},
                bwd[] = {256, 192, 256, 224};
  for (int l = 0; l < 4; ++l) {
    profile.ops[l].op = l % 2 ? "relu" : "gemm";
    profile.ops[l].savedBytes = saved[l];
    profile.ops[l].fwdScratchBytes = fwd[l];
    profile.ops[l].bwdScratchBytes = bwd[l];
  }
  profile.ops[0].paramBytes = 64; // gradients flow back to stage 0
  Plan plan = twoStagePlan("1f1b-flush", 4, 1, 3);
  SimResult none = simulate(profile, plan);
  ASSERT_TRUE(none.ok) << none.error;
  // Stage 0 stashes 64 + 64 (relu's output is also sent: held once) in
  // each of 2 slots; io is the output's gradient; scratch the largest
  // working set, less the output gradient, which arrives in io (192 - 64).
  EXPECT_EQ(none.memory[0].activations, 2 * 128);
  EXPECT_EQ(none.memory[0].io, 64);
  EXPECT_EQ(none.memory[0].scratch, 256);
  // Stage 1: its input (64) + 64 saved, one slot; io: the input gradient,
  // which gemm(2), the input's sole reader, writes there itself: its
  // working set less those 64 bytes (256 - 64) is below relu(3)'s 224.
  EXPECT_EQ(none.memory[1].activations, 128);
  EXPECT_EQ(none.memory[1].io, 64);
  EXPECT_EQ(none.memory[1].scratch, 224);
  EXPECT_EQ(none.memory[1].arena(), 128 + 64 + 224);
  // Full recomputation: stage 0 keeps only the output it sends (64 per
  // slot); gemm's 64 bytes are recomputed into scratch, where relu's
  // backward working set (192 - 64) sits on top of them.
  plan.stages[0].recompute = plan.stages[1].recompute = "full";
  SimResult full = simulate(profile, plan);
  ASSERT_TRUE(full.ok) << full.error;
  EXPECT_EQ(full.memory[0].activations, 2 * 64);
  EXPECT_EQ(full.memory[0].scratch, 256); // max(256, 64 + 128, 64)
  EXPECT_EQ(full.memory[1].activations, 64);
  EXPECT_EQ(full.memory[1].scratch, 64 + 224); // gemm(2) recomputed + relu
  // Selective keeps gemm(2)'s result (the recomputed relu starts from it).
  plan.stages[1].recompute = "selective";
  profile.ops[3].savedBytes = 64;
  SimResult selective = simulate(profile, plan);
  ASSERT_TRUE(selective.ok) << selective.error;
  EXPECT_EQ(selective.memory[1].activations, 64 + 64);
  // The data: model inputs in the first stage's slots, labels in the
  // last's (64-aligned).
  profile.inputBytes = 100;
  profile.labelBytes = 8;
  plan.stages[0].recompute = plan.stages[1].recompute = "";
  SimResult fed = simulate(profile, plan);
  ASSERT_TRUE(fed.ok) << fed.error;
  EXPECT_EQ(fed.memory[0].activations, 2 * (128 + 128));
  EXPECT_EQ(fed.memory[1].activations, 3 * 64 + 64); // input, 2 saved, labels
  // No trained weight in or before stage 0: no gradient comes back, and
  // its in-flight microbatches share one slot.
  profile.ops[0].paramBytes = 0;
  SimResult frozen = simulate(profile, plan);
  ASSERT_TRUE(frozen.ok) << frozen.error;
  EXPECT_EQ(frozen.peakInflight[0], 2);
  EXPECT_EQ(frozen.memory[0].activations, 128 + 128);
  EXPECT_EQ(frozen.memory[1].activations, 3 * 64 + 64);
}

TEST(SimMemory, RecomputedValuesLiveUntilTheirLastReader) {
  // Stage 1 = gemm(1) -> gelu(2) -> gemm(3) -> softmax(4), fully
  // recomputed. gemm(1)'s result is read last by gelu(2)'s backward,
  // gelu(2)'s by gemm(3)'s (its weight gradient: it widens the value
  // before its peak, so the value is gone by then), softmax(4)'s by its
  // own. Backward order 4, 3, 2, 1: at 3, only gemm(1)'s 64 bytes are
  // live in full (gelu's 128 are inside 3's measured working set, 300);
  // at 4, gemm(1)'s and gelu's 192 with softmax's own set with its output
  // (114). Peak 64 + 300.
  Profile profile = arenaChain({"gemm", "gemm", "gelu", "gemm", "softmax"});
  const int64_t saved[] = {0, 64, 128, 0, 64}, bwd[] = {0, 100, 80, 300, 50},
                recomputedBwd[] = {0, 100, 144, 300, 114};
  for (int l = 0; l < 5; ++l) {
    profile.ops[l].savedBytes = saved[l];
    profile.ops[l].bwdScratchBytes = bwd[l];
  }
  profile.ops[0].paramBytes = profile.ops[1].paramBytes = 64;
  Plan plan = twoStagePlan("1f1b-flush", 4, 0, 4);
  plan.stages[1].recompute = "full";
  // Without the lifetimes, each value lives until the backward of the op
  // after its own: at 3, gemm(1)'s and gelu's (192) under 3's 300.
  SimResult before = simulate(profile, plan);
  ASSERT_TRUE(before.ok) << before.error;
  EXPECT_EQ(before.memory[1].scratch, 192 + 300);
  profile.ops[1].savedReads = {{1, 64}};
  profile.ops[2].savedReads = {{1, 128}};
  profile.ops[4].savedReads = {{0, 64}};
  // The readers without their measured working sets: each value it reads
  // last counts in full on top (64 + 300 + 128 at gemm(3)).
  SimResult readers = simulate(profile, plan);
  ASSERT_TRUE(readers.ok) << readers.error;
  EXPECT_EQ(readers.memory[1].scratch, 64 + 300 + 128);
  for (int l = 0; l < 5; ++l)
    profile.ops[l].bwdRecomputedScratchBytes = recomputedBwd[l];
  SimResult measured = simulate(profile, plan);
  ASSERT_TRUE(measured.ok) << measured.error;
  EXPECT_EQ(measured.memory[1].scratch, 64 + 300);
  // Without recomputation the values are in the slot: the working sets
  // alone (300).
  plan.stages[1].recompute = "";
  SimResult none = simulate(profile, plan);
  ASSERT_TRUE(none.ok) << none.error;
  EXPECT_EQ(none.memory[1].scratch, 300);
}

TEST(SimMemory, ValuesOnlyALaterStageReadsAreItsInputs) {
  // Stage 0 = gemm(0) -> transpose(1) -> gemm(2), stage 1 = gemm(3), which
  // reads gemm(2)'s output; transpose(1)'s value is saved for gemm(3)'s
  // backward (the value stage 1 receives, under another op's name: a
  // folded transpose). Stage 0's backward never reads it: no stash there,
  // and full recomputation does not run transpose(1), whose forward
  // working set (100) would sit on gemm(0)'s recomputed 200 bytes.
  Profile profile = arenaChain({"gemm", "transpose", "gemm", "gemm"});
  const int64_t saved[] = {200, 64, 64, 0}, fwd[] = {0, 100, 0, 0};
  for (int l = 0; l < 4; ++l) {
    profile.ops[l].savedBytes = saved[l];
    profile.ops[l].fwdScratchBytes = fwd[l];
    profile.ops[l].paramBytes = 64;
  }
  Plan plan = twoStagePlan("1f1b-flush", 4, 2, 3);
  // Without saved_reads: transpose(1)'s 64 bytes stashed in each of 2
  // slots (gemm(2)'s are its output, sent on).
  SimResult before = simulate(profile, plan);
  EXPECT_EQ(before.memory[0].activations, 2 * (200 + 64 + 64));
  profile.ops[0].savedReads = {{1, 200}};
  profile.ops[1].savedReads = {{2, 64}};
  profile.ops[2].savedReads = {{1, 64}};
  SimResult none = simulate(profile, plan);
  EXPECT_EQ(none.memory[0].activations, 2 * (200 + 64));
  plan.stages[0].recompute = "full";
  SimResult full = simulate(profile, plan);
  EXPECT_EQ(full.memory[0].scratch, 200); // gemm(0)'s value
  profile.ops[1].savedReads.clear();
  SimResult runsIt = simulate(profile, plan);
  EXPECT_EQ(runsIt.memory[0].scratch, 200 + 100);
}

TEST(SimMemory, GradientsHeldInIoLeaveScratch) {
  // A residual block: gemm(0) -> relu(1) -> gemm(2), add(3) = gemm(2) +
  // relu(1), sent to stage 1 (gemm(4) -> relu(5)). The one-stage profile's
  // backward working sets hold every live gradient; in the stage, the
  // add's output gradient arrives in io, and the add hands that buffer on
  // to both operands: it stands for relu(1)'s partial gradient through
  // gemm(2)'s backward (which counted it: 256 = dY + dX + dW + partial).
  // Stage 1's input gradient is gemm(4)'s dX, written into io itself.
  Profile profile = arenaChain({"gemm", "relu", "gemm", "add", "gemm", "relu"});
  const int64_t bwd[] = {128, 192, 256, 0, 200, 128};
  for (int l = 0; l < 6; ++l) {
    profile.ops[l].savedBytes = 64;
    profile.ops[l].bwdScratchBytes = bwd[l];
    profile.ops[l].inputs =
        l == 0 ? std::vector<int>{} : std::vector<int>{l - 1};
  }
  profile.ops[3].inputs = {2, 1};
  profile.ops[0].paramBytes = 64;
  Plan plan = twoStagePlan("1f1b-flush", 4, 3, 5);
  SimResult none = simulate(profile, plan);
  ASSERT_TRUE(none.ok) << none.error;
  EXPECT_EQ(none.memory[0].io, 64);
  EXPECT_EQ(none.memory[0].scratch, 192); // max(128, 192, 256 - 64, 0)
  EXPECT_EQ(none.memory[1].scratch, 136); // max(200 - 64, 128)
  // Without the add's pass-through (a multiplication copies dY into new
  // gradients), gemm(2)'s working set is all scratch.
  profile.ops[3].op = "mul";
  SimResult copied = simulate(profile, plan);
  ASSERT_TRUE(copied.ok) << copied.error;
  EXPECT_EQ(copied.memory[0].scratch, 256);
}

TEST(SimMemory, StagesAfterUntrainedOnesGetNoInputGradient) {
  // The MLP's cut: a flatten without weights alone in stage 0, then
  // gemm(1) in stage 1, relu(2) and gemm(3) in stage 2; outputs of 64
  // bytes. Stage 0 has no backward (no gradient of its output comes back,
  // one slot), and stage 1's input gets no gradient (io: its output's
  // gradient only).
  Profile profile = arenaChain({"flatten", "gemm", "relu", "gemm"});
  for (int l = 0; l < 4; ++l) {
    profile.ops[l].savedBytes = 64;
    profile.ops[l].paramBytes = l % 2 ? 64 : 0;
    profile.ops[l].carriedBytes = l == 3 ? 64 : 0; // gemm(3)'s dY
  }
  Plan plan = straightPlan(3, "1f1b-flush", 4);
  plan.stages[1].firstLayer = plan.stages[1].lastLayer = 1;
  plan.stages[2].firstLayer = 2;
  plan.stages[2].lastLayer = 3;
  SimResult flush = simulate(profile, plan);
  ASSERT_TRUE(flush.ok) << flush.error;
  EXPECT_EQ(flush.memory[0].activations, 64); // one slot
  EXPECT_EQ(flush.memory[0].io, 0);
  EXPECT_EQ(flush.memory[1].io, 64); // its output's gradient
  EXPECT_EQ(flush.memory[2].io, 64); // its input's gradient
  EXPECT_EQ(flush.memory[1].activations, 2 * (64 + 64)); // input, gemm
  // Zero bubble: stage 1's input half computes nothing, so its weight
  // half reads its output's gradient, carried from io in the slot; stage
  // 2 carries what its input half computes for the weight half.
  plan.schedule = "zb-h1";
  SimResult zb = simulate(profile, plan);
  ASSERT_TRUE(zb.ok) << zb.error;
  EXPECT_EQ(zb.memory[1].activations, zb.peakInflight[1] * (64 + 64 + 64));
  EXPECT_EQ(zb.memory[2].activations, zb.peakInflight[2] * (3 * 64 + 64));
  // Interleaved, 2 devices x 2 chunks of one op each: device 0 holds the
  // flatten (chunk 0) and relu(2) (chunk 1). Its chunks share its slots,
  // so the flatten's stash takes every slot the device has.
  Plan interleaved = interleavedPlan(2, 2, 4);
  SimResult chunks = simulate(profile, interleaved);
  ASSERT_TRUE(chunks.ok) << chunks.error;
  EXPECT_GT(chunks.peakInflight[2], 1);
  EXPECT_EQ(chunks.memory[0].activations,
            chunks.memory[2].activations / (2 * 64) * 64);
}

TEST(SimMemory, BuffersAndDeviceFit) {
  Profile profile = uniformProfile(2, 1, 2, /*outBytes=*/1000, 100, 10);
  Topology slow = Topology::flat(2, 100, 0, /*memory=*/1 << 20);
  SimResult result = simulate(profile, straightPlan(2, "gpipe", 4), slow);
  // Stage 0 holds activations it sent until delivery; stage 1 the gradients.
  EXPECT_GE(result.memory[0].buffers, 1000);
  EXPECT_GE(result.memory[1].buffers, 1000);
  ASSERT_EQ(result.devices.size(), 2u);
  for (int s = 0; s < 2; ++s)
    EXPECT_EQ(result.devices[s].peakBytes, result.memory[s].total());
  EXPECT_TRUE(result.fitsMemory);
  Topology tiny = Topology::flat(2, 100, 0, /*memory=*/500);
  EXPECT_FALSE(simulate(profile, straightPlan(2, "gpipe", 4), tiny).fitsMemory);
}

TEST(SimMemory, InterleavedDeviceHoldsEveryChunk) {
  Profile profile = uniformProfile(8, 0.5, 1, 0, /*params=*/100, /*saved=*/1);
  SimResult result = simulate(profile, interleavedPlan(4, 2, 8));
  ASSERT_EQ(result.devices.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    // Two chunks of parameters, gradients; 2(p-r-1)+(v-1)p+1 activations.
    int64_t inflight = 2 * (4 - r - 1) + 4 + 1;
    EXPECT_EQ(result.devices[r].peakBytes, 2 * (100 + 100) + inflight)
        << "device " << r;
  }
}

//===----------------------------------------------------------------------===//
// Trace
//===----------------------------------------------------------------------===//

TEST(SimTrace, ValidJsonWithOneComputeEventPerOp) {
  for (const char *schedule :
       {"gpipe", "1f1b-flush", "interleaved", "zb-h1", "1f1b"}) {
    SCOPED_TRACE(schedule);
    const bool interleaved = std::string(schedule) == "interleaved";
    const int p = 3, v = interleaved ? 2 : 1, m = 6;
    Profile profile = uniformProfile(p * v, 1, 2, 64, 10, 1);
    Plan plan =
        interleaved ? interleavedPlan(p, v, m) : straightPlan(p, schedule, m);
    SimOptions options;
    options.trace = true;
    SimResult result =
        simulate(profile, plan, Topology::flat(8, 1e3, 1e-3), options);
    nlohmann::json trace = nlohmann::json::parse(result.traceJson);
    ASSERT_TRUE(trace.is_array());
    std::map<std::string, int> computeOps;
    int sends = 0, recvs = 0;
    for (const auto &event : trace) {
      ASSERT_TRUE(event.contains("ph"));
      if (event["ph"] != "X")
        continue;
      for (const char *field : {"name", "ts", "dur", "pid", "tid", "args"})
        ASSERT_TRUE(event.contains(field)) << field;
      EXPECT_GE(event["dur"].get<double>(), 0);
      int tid = event["tid"];
      if (tid == 0) {
        std::string name = event["name"];
        const auto &args = event["args"];
        EXPECT_EQ(name.substr(1, name.find('c') == std::string::npos
                                     ? std::string::npos
                                     : name.find('c') - 1),
                  std::to_string(args["microbatch"].get<int>()));
        ++computeOps[name.substr(0, 1)];
        EXPECT_EQ(event["pid"].get<int>(), args["stage"].get<int>() % p);
      }
      sends += tid == 1;
      recvs += tid == 2;
    }
    const int steps =
        std::string(schedule) == "1f1b" ? computeOps["F"] / (p * m) : 1;
    EXPECT_EQ(computeOps["F"], steps * p * v * m);
    EXPECT_EQ(computeOps["B"], steps * p * v * m);
    EXPECT_EQ(computeOps["W"],
              std::string(schedule) == "zb-h1" ? p * v * m : 0);
    // A send and a receive per boundary per microbatch, both directions.
    EXPECT_EQ(sends, steps * 2 * (p * v - 1) * m);
    EXPECT_EQ(recvs, sends);
  }
  // No trace unless asked for.
  EXPECT_TRUE(simulate(uniformProfile(2, 1, 1), straightPlan(2, "gpipe", 2))
                  .traceJson.empty());
}

//===----------------------------------------------------------------------===//
// Deadlock and bad input
//===----------------------------------------------------------------------===//

TEST(SimErrors, DeadlockIsReported) {
  // Stage 0 runs F1 B1 F2 B2 but stage 1 wants F1 F2 before B1: stage 0
  // waits for B1's gradient, stage 1 for F2's activation.
  Profile profile = uniformProfile(2, 1, 2);
  Plan plan = straightPlan(2, "1f1b-flush", 2);
  ScheduleResult schedule =
      generateSchedule(ScheduleKind::OneFOneBFlush, 2, 2, ScheduleOptions());
  ASSERT_TRUE(schedule.ok);
  using K = PassKind;
  schedule.ranks[0].schedule.segments = {
      {{{K::Forward, 0}, {K::Backward, 0}, {K::Forward, 1}, {K::Backward, 1}},
       1}};
  schedule.ranks[1].schedule.segments = {
      {{{K::Forward, 0}, {K::Forward, 1}, {K::Backward, 0}, {K::Backward, 1}},
       1}};
  SimResult result = simulateSchedule(profile, freeNetwork(), plan, schedule);
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.error.find("deadlock"), std::string::npos) << result.error;
  EXPECT_NE(result.error.find("waits to run B of microbatch 0 for the "
                              "gradient from stage 1"),
            std::string::npos)
      << result.error;
  EXPECT_NE(result.error.find("waits to run F of microbatch 1 for the "
                              "activation from stage 0"),
            std::string::npos)
      << result.error;
  // The generated programs run.
  schedule = generateSchedule(ScheduleKind::OneFOneBFlush, 2, 2, {});
  EXPECT_TRUE(simulateSchedule(profile, freeNetwork(), plan, schedule).ok);
}

TEST(SimErrors, BadInput) {
  Profile profile = uniformProfile(4, 1, 2);
  auto error = [&](const Plan &plan, const Topology &topology = freeNetwork()) {
    SimResult result = simulatePlan(profile, topology, plan);
    EXPECT_FALSE(result.ok);
    return result.error;
  };
  Plan plan = straightPlan(4, "pipedream-2", 4);
  EXPECT_NE(error(plan).find("unknown schedule 'pipedream-2' (available: "
                             "gpipe, 1f1b-flush, 1f1b, 2bw, interleaved, "
                             "zb-h1, custom, zb-v, zb-h2, dualpipev)"),
            std::string::npos);
  plan = interleavedPlan(2, 2, 3);
  EXPECT_NE(error(plan).find("multiple of the pipeline depth"),
            std::string::npos);
  plan = straightPlan(4, "1f1b-flush", 4);
  plan.chunks = 2;
  EXPECT_NE(error(plan).find("needs the interleaved schedule"),
            std::string::npos);
  plan = straightPlan(4, "gpipe", 4);
  plan.stages[3].devices = {9};
  EXPECT_NE(error(plan, Topology::flat(4, 1, 0)).find("topology has 4"),
            std::string::npos);
  plan.stages[3].devices = {1};
  EXPECT_NE(error(plan).find("device 1 is assigned to stage 1 and stage 3"),
            std::string::npos);
  plan = straightPlan(3, "gpipe", 4); // covers 3 of the 4 layers
  EXPECT_NE(error(plan).find("invalid plan"), std::string::npos);
  plan = straightPlan(4, "2bw", 2); // m < p - 1
  EXPECT_NE(error(plan).find("m >= p - 1"), std::string::npos);
  Profile negative = uniformProfile(4, 1, 2);
  negative.ops[2].bwdSeconds = -1;
  SimResult result =
      simulatePlan(negative, freeNetwork(), straightPlan(4, "gpipe", 4));
  EXPECT_NE(result.error.find("op 2"), std::string::npos);
  // Devices are filled in when a plan lists none.
  plan = straightPlan(4, "gpipe", 4);
  for (StagePlan &stage : plan.stages)
    stage.devices.clear();
  plan.stages[1].replicas = 2;
  SimResult filled = simulatePlan(profile, freeNetwork(), plan);
  ASSERT_TRUE(filled.ok) << filled.error;
  ASSERT_EQ(filled.devices.size(), 5u);
  EXPECT_EQ(filled.devices[4].device, 4);
}

//===----------------------------------------------------------------------===//
// Random plans
//===----------------------------------------------------------------------===//

namespace {

/// A small deterministic generator (the same sequence on every platform).
struct Lcg {
  uint64_t state;
  uint64_t next() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  }
  int uniform(int lo, int hi) {
    return lo + static_cast<int>(next() % (hi - lo + 1));
  }
  double real(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(next() % 1000001) / 1e6;
  }
};

} // namespace

TEST(SimRandom, EverySchedulesRunsWithinItsBounds) {
  // Non-uniform stages, skip connections, replicas, a two-level topology:
  // every schedule must finish (no deadlock), spend at least its busiest
  // device's compute per iteration, and account consistently.
  Lcg rng{12345};
  const char *kinds[] = {"gpipe", "1f1b-flush",  "1f1b",
                         "2bw",   "interleaved", "zb-h1"};
  int simulated = 0, bounded = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const std::string schedule = kinds[trial % 6];
    const bool interleaved = schedule == "interleaved";
    const int p = rng.uniform(1, 5);
    const int v = interleaved ? rng.uniform(1, 3) : 1;
    const int d = rng.uniform(1, 2); // equal replicas for interleaved
    std::vector<int> replicas(p);
    for (int &r : replicas)
      r = interleaved ? d : rng.uniform(1, 3);
    int m = rng.uniform(1, 12);
    if (interleaved)
      m = p * d * rng.uniform(1, 3);
    const int layersPerStage = rng.uniform(1, 3);
    const int layers = p * v * layersPerStage;
    Profile profile;
    profile.microbatch = 1;
    for (int l = 0; l < layers; ++l) {
      ProfileOp op;
      op.name = "op" + std::to_string(l);
      op.fwdSeconds = rng.real(0.1, 2);
      op.bwdSeconds = rng.real(0.1, 4);
      op.outBytes = rng.uniform(0, 4) * 1000;
      op.paramBytes = rng.uniform(0, 4) * 10000;
      op.savedBytes = rng.uniform(0, 4) * 100;
      if (l >= 2 && rng.uniform(0, 3) == 0)
        op.inputs = {l - 1, rng.uniform(0, l - 2)}; // a skip connection
      profile.ops.push_back(op);
    }
    Plan plan;
    plan.schedule = schedule;
    plan.microbatches = m;
    plan.chunks = v;
    int device = 0;
    for (int q = 0; q < p * v; ++q) {
      StagePlan stage;
      stage.firstLayer = q * layersPerStage;
      stage.lastLayer = stage.firstLayer + layersPerStage - 1;
      stage.replicas = replicas[q % p];
      if (q < p)
        for (int j = 0; j < stage.replicas; ++j)
          stage.devices.push_back(device++);
      else
        stage.devices = plan.stages[q % p].devices;
      plan.stages.push_back(stage);
    }
    Topology topology;
    topology.levels = {{"node", 4, rng.real(1e4, 1e6), rng.real(0, 1e-2)},
                       {"cluster", 8, rng.real(1e3, 1e5), rng.real(0, 1e-1)}};
    SimOptions options;
    options.recompute = rng.uniform(0, 1) == 1;
    options.warmupPolicy =
        rng.uniform(0, 1) ? WarmupPolicy::A : WarmupPolicy::B;
    options.optimizerSecondsPerByte = rng.uniform(0, 1) * 1e-6;
    options.trace = trial % 10 == 0;
    options.splitReplicas = !interleaved && rng.uniform(0, 2) == 0;
    SCOPED_TRACE("trial " + std::to_string(trial) + " " + schedule +
                 " p=" + std::to_string(p) + " v=" + std::to_string(v) +
                 " m=" + std::to_string(m));
    SimResult result = simulatePlan(profile, topology, plan, options);
    if (schedule == "2bw" && !result.ok &&
        result.error.find("2bw needs") != std::string::npos)
      continue; // too few microbatches per batch for this depth
    ASSERT_TRUE(result.ok) << result.error;
    ++simulated;
    ASSERT_EQ(static_cast<int>(result.memory.size()), p * v);
    double busiest = 0, busy = 0;
    for (const DeviceUsage &usage : result.devices) {
      busiest = std::max(busiest, usage.busySeconds);
      busy += usage.busySeconds;
    }
    EXPECT_GE(result.iterationSeconds, busiest * (1 - 1e-6));
    // The bound `auto` prunes with never exceeds the simulated iteration
    // (flush schedules), and is the busiest device's compute.
    const double bound = flushIterationLowerBound(profile, plan, options);
    if (isFlushSchedule(*parseScheduleKind(schedule))) {
      EXPECT_GT(bound, 0);
      EXPECT_LE(bound, result.iterationSeconds);
      EXPECT_NEAR(bound, busiest, 1e-6 * busiest);
      ++bounded;
    } else {
      EXPECT_EQ(bound, 0);
      // Continuous: the steady state's busiest device compute per m
      // microbatches, less its 0.1% margin.
      const double steady = iterationLowerBound(profile, plan, options);
      EXPECT_GT(steady, 0);
      EXPECT_LE(steady, result.iterationSeconds);
      EXPECT_NEAR(steady, busiest * (1 - 1e-3), 1e-6 * busiest);
      ++bounded;
    }
    EXPECT_GE(result.bubbleFraction, 0);
    EXPECT_GE(result.idleFraction, 0);
    EXPECT_LT(result.idleFraction, 1);
    EXPECT_NEAR(result.idleFraction,
                1 - busy / (result.devices.size() * result.iterationSeconds),
                1e-9);
    EXPECT_NEAR(result.samplesPerSecond * result.iterationSeconds, m, 1e-9);
    for (int q = 0; q < p * v; ++q)
      EXPECT_GE(result.peakInflight[q], 1);
    if (options.trace) {
      EXPECT_NO_THROW(nlohmann::json::parse(result.traceJson));
    }
  }
  EXPECT_GT(simulated, 250);
  EXPECT_GT(bounded, 150);
}

TEST(SimRandom, ContinuousSteadyStateDoesNotDependOnSteps) {
  // The measured steady state of 1f1b / 2bw is the same over more steps.
  Lcg rng{777};
  for (int trial = 0; trial < 40; ++trial) {
    const char *schedule = trial % 2 ? "2bw" : "1f1b";
    const int p = rng.uniform(1, 4);
    const int m = rng.uniform(std::max(1, p - 1), 8);
    Profile profile;
    profile.microbatch = 1;
    for (int l = 0; l < p; ++l) {
      ProfileOp op;
      op.fwdSeconds = rng.real(0.5, 2);
      op.bwdSeconds = rng.real(0.5, 4);
      op.outBytes = 1000;
      profile.ops.push_back(op);
    }
    Plan plan = straightPlan(p, schedule, m);
    Topology topology = Topology::flat(p, rng.real(1e3, 1e5), 1e-3);
    SimOptions few, many;
    many.steps = 40;
    SimResult a = simulatePlan(profile, topology, plan, few);
    SimResult b = simulatePlan(profile, topology, plan, many);
    ASSERT_TRUE(a.ok && b.ok) << a.error << b.error;
    EXPECT_NEAR(a.iterationSeconds, b.iterationSeconds,
                2e-3 * b.iterationSeconds)
        << schedule << " p=" << p << " m=" << m;
    // A pipeline runs no faster than its slowest stage.
    double slowest = 0;
    for (const ProfileOp &op : profile.ops)
      slowest = std::max(slowest, op.fwdSeconds + op.bwdSeconds);
    EXPECT_GE(a.iterationSeconds, m * slowest * (1 - 1e-9));
  }
}
