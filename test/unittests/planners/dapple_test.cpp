//===- dapple_test.cpp - DAPPLE's latency model, placement and search -----===//
//
// Eq. (1)/(2) against the digest's latency table (dapple.md §6.2(d), with
// and without the `s = Q` correction) and against the simulator; the pivot
// rule; K_i; the placement policies on the 6-device example; uneven
// replication (15:1, 11:5); the search against the brute-force oracle under
// the same model: optimal among plans of at most two stages, never better
// than the oracle, never worse than data parallelism or the straight
// pipeline.
//
//===----------------------------------------------------------------------===//

#include "PlannerTestUtil.h"

#include <chrono>
#include <iostream>

using namespace pipec;
using namespace pipec::testutil;

namespace {

double dappleValue(const Profile &profile, const Topology &topology,
                   const Plan &plan) {
  DappleScore score = scoreDapple(profile, topology, plan);
  EXPECT_TRUE(score.ok) << score.error;
  return score.fitsMemory ? score.latency.latency
                          : std::numeric_limits<double>::infinity();
}

ExhaustiveResult dappleOracle(const Profile &profile, const Topology &topology,
                              const PlannerOptions &options,
                              ExhaustivePlacements placements, int maxStages) {
  ExhaustiveOptions eo;
  eo.objective = ExhaustiveObjective::Dapple;
  eo.placements = placements;
  eo.maxStages = maxStages;
  return searchExhaustive(profile, topology, options, eo);
}

} // namespace

//===----------------------------------------------------------------------===//
// Eq. (1)-(3)
//===----------------------------------------------------------------------===//

/// dapple.md §6.2(d): F, B, AR per stage (communication stages included),
/// M = 4; L as printed and with the s = Q correction.
TEST(DappleLatency, DigestTable) {
  struct Row {
    std::vector<double> f, b, ar;
    int pivot;
    double printed, fixed;
  };
  std::vector<Row> rows = {
      {{1, 0, 1}, {2, 0, 2}, {1, 0, 1}, 2, 16, 16},
      {{1, 0, 1}, {2, 0, 2}, {0, 0, 10}, 2, 19, 23},
      {{2, .5, 1}, {4, .5, 2}, {3, 0, 1}, 0, 19, 27},
      {{1}, {2}, {5}, 0, 13, 17},
      {{3, .5, 1}, {6, .5, 2}, {0, 0, 20}, 0, 41.5, 41.5},
      {{3, .5, 1, .5, 1}, {6, .5, 2, .5, 2}, {0, 0, 1, 0, 20}, 0, 39, 39},
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row &row = rows[i];
    SCOPED_TRACE("row " + std::to_string(i));
    EXPECT_EQ(dapplePivot(row.f, row.b, 4), row.pivot);
    DappleLatency fixed = dappleLatency(row.f, row.b, row.ar, 4, true);
    DappleLatency printed = dappleLatency(row.f, row.b, row.ar, 4, false);
    EXPECT_DOUBLE_EQ(fixed.latency, row.fixed);
    EXPECT_DOUBLE_EQ(printed.latency, row.printed);
    EXPECT_EQ(fixed.pivot, row.pivot);
    EXPECT_DOUBLE_EQ(fixed.latency, fixed.warmup + fixed.steady + fixed.ending);
  }
  // Single stage: exactly M(F + B) + AR with the correction; 2B short
  // without it.
  for (int m : {1, 2, 7}) {
    EXPECT_DOUBLE_EQ(dappleLatency({1.5}, {2.5}, {3}, m).latency, m * 4.0 + 3);
    EXPECT_DOUBLE_EQ(dappleLatency({1.5}, {2.5}, {3}, m, false).latency,
                     m * 4.0 + 3 - 5);
  }
  // T_s = 0 for M = 1.
  EXPECT_DOUBLE_EQ(dappleLatency({1, 0, 1}, {2, 0, 2}, {0, 0, 0}, 1).steady, 0);
}

TEST(DappleLatency, PivotRule) {
  // Uniform stages: Q stays at S - 1 (strict >).
  EXPECT_EQ(dapplePivot({1, 1, 1, 1}, {2, 2, 2, 2}, 8), 3);
  // A heavy stage beats the current pivot plus the stages between.
  EXPECT_EQ(dapplePivot({1, 1, 3, 1}, {2, 2, 6, 2}, 8), 2);
  // (M-1)·P_0 = 7·4 = 28 vs (M-1)·P_3 + Σ_{1,2} = 21 + 6 = 27: switch.
  EXPECT_EQ(dapplePivot({2, 1, 2, 1}, {2, 2, 1, 2}, 8), 0);
  // ... but not when the stages between make up the difference: with
  // M = 4, 3·4 = 12 vs 3·3 + 6 = 15.
  EXPECT_EQ(dapplePivot({2, 1, 2, 1}, {2, 2, 1, 2}, 4), 3);
  // M = 1: no steady phase, the pivot is the last stage.
  EXPECT_EQ(dapplePivot({9, 1}, {9, 1}, 1), 1);
}

/// The corrected model against the simulator (1F1B-flush with split
/// replicas) on the digest's rows that a two-stage plan realises: AR from
/// parameter bytes (2(r-1)/r·W/B over r = 2 replicas is W/B), F and B per
/// one-sample slice, no activations crossing the cut.
TEST(DappleLatency, MatchesSimulatorOnDigestRows) {
  struct Case {
    std::vector<double> f, b;
    std::vector<int64_t> params; // bytes; B = 1000 bytes/s
    std::vector<int> replicas;
    double latency;
  };
  std::vector<Case> cases = {
      {{1, 1}, {2, 2}, {1000, 1000}, {2, 2}, 16},
      {{1, 1}, {2, 2}, {0, 10000}, {2, 2}, 23},
      {{1}, {2}, {5000}, {2}, 17},
      {{1, 1, 1}, {2, 2, 2}, {0, 0, 0}, {1, 1, 1}, 3 * 4 + 6},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case &c = cases[i];
    SCOPED_TRACE("case " + std::to_string(i));
    int stages = static_cast<int>(c.f.size());
    Profile profile =
        chain(c.f, c.b, c.params, std::vector<int64_t>(stages, 0));
    Plan plan;
    plan.algorithm = "test";
    plan.schedule = "1f1b-flush";
    plan.microbatches = 4;
    plan.microbatchSize = c.replicas[0]; // one sample per replica
    int device = 0, devices = 0;
    for (int r : c.replicas)
      devices += r;
    for (int s = 0; s < stages; ++s) {
      StagePlan stage{s, s, c.replicas[s], {}};
      for (int r = 0; r < c.replicas[s]; ++r)
        stage.devices.push_back(device++);
      plan.stages.push_back(stage);
    }
    Topology cluster = topology({level(devices, 1000)});
    EXPECT_DOUBLE_EQ(dappleValue(profile, cluster, plan), c.latency);
    SimOptions sim;
    sim.splitReplicas = true;
    SimResult result = simulatePlan(profile, cluster, plan, sim);
    ASSERT_TRUE(result.ok) << result.error;
    EXPECT_NEAR(result.iterationSeconds, c.latency, 1e-9);
  }
}

TEST(DappleWarmup, Depths) {
  // dapple.md §6.2(b): four compute stages, D large.
  EXPECT_EQ(dappleWarmupDepths(4, 100, DappleWarmup::A),
            (std::vector<int>{4, 3, 2, 1}));
  EXPECT_EQ(dappleWarmupDepths(4, 100, DappleWarmup::B),
            (std::vector<int>{7, 5, 3, 1}));
  // Clamped to M and to D_i, never below 1.
  EXPECT_EQ(dappleWarmupDepths(4, 3, DappleWarmup::B),
            (std::vector<int>{3, 3, 3, 1}));
  EXPECT_EQ(dappleWarmupDepths(4, 100, DappleWarmup::B, {2, 0, 9, 9}),
            (std::vector<int>{2, 1, 3, 1}));
}

/// K_i sizes the memory of a plan: parameters × (2 + optimizer factor) +
/// K_i × stashed activations of a slice.
TEST(DappleWarmup, MemoryOfAPlan) {
  Profile profile = chain({1, 1, 1}, {2, 2, 2}, {100, 100, 100}, {10, 10, 10});
  Topology cluster = topology({level(3, 1e9)}, 1000);
  Plan plan;
  plan.microbatches = 8;
  plan.microbatchSize = 1;
  plan.stages = {{0, 0, 1, {0}}, {1, 1, 1, {1}}, {2, 2, 1, {2}}};
  DappleOptions options;
  options.warmup = DappleWarmup::B;
  DappleScore score = scoreDapple(profile, cluster, plan, {}, options);
  ASSERT_TRUE(score.ok) << score.error;
  EXPECT_EQ(score.warmup, (std::vector<int>{5, 3, 1}));
  EXPECT_EQ(score.stageMemoryBytes,
            (std::vector<int64_t>{200 + 50, 200 + 30, 200 + 10}));
  // 1000 bytes hold (1000 - 200) / 10 = 80 microbatches: no clamping.
  Topology tight = topology({level(3, 1e9)}, 230);
  score = scoreDapple(profile, tight, plan, {}, options);
  EXPECT_EQ(score.warmup, (std::vector<int>{3, 3, 1}));
  EXPECT_TRUE(score.fitsMemory);
  Topology tiny = topology({level(3, 1e9)}, 205);
  score = scoreDapple(profile, tiny, plan, {}, options);
  EXPECT_FALSE(score.fitsMemory);
}

//===----------------------------------------------------------------------===//
// Placement (dapple.md §2.5, "applying for 6 devices")
//===----------------------------------------------------------------------===//

TEST(DapplePlacement, SixDevicesOnTwoMachinesOfEight) {
  Topology cluster = topology({level(8, 1.3e11), level(2, 3.1e9)});
  auto on = [&](std::vector<int> busy, DapplePolicy policy) {
    std::vector<bool> used(16, false);
    for (int d : busy)
      used[d] = true;
    return dappleAllocate(cluster, used, 6, policy);
  };
  using V = std::vector<int>;
  // An empty cluster.
  EXPECT_EQ(on({}, DapplePolicy::FreshFirst), (V{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(on({}, DapplePolicy::AppendFirst), (V{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(on({}, DapplePolicy::ScatterFirst), (V{0, 1, 2, 8, 9, 10}));
  // Six devices of machine 0 already taken.
  V six = {0, 1, 2, 3, 4, 5};
  EXPECT_EQ(on(six, DapplePolicy::FreshFirst), (V{8, 9, 10, 11, 12, 13}));
  EXPECT_EQ(on(six, DapplePolicy::AppendFirst), (V{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(on(six, DapplePolicy::ScatterFirst), (V{6, 7, 8, 9, 10, 11}));
  // Both machines partly used: Scatter takes equally from both.
  V both = {0, 1, 2, 3, 8, 9, 10, 11};
  EXPECT_EQ(on(both, DapplePolicy::ScatterFirst), (V{4, 5, 6, 12, 13, 14}));
  EXPECT_EQ(on(both, DapplePolicy::AppendFirst), (V{4, 5, 6, 7, 12, 13}));
  // Not enough free devices: as many as there are.
  std::vector<bool> used(16, true);
  used[3] = false;
  EXPECT_EQ(dappleAllocate(cluster, used, 6, DapplePolicy::FreshFirst), (V{3}));
}

//===----------------------------------------------------------------------===//
// The search against the oracle
//===----------------------------------------------------------------------===//

namespace {

void compareWithOracle(unsigned seed, int count, bool allowFewer,
                       bool withMemory) {
  std::mt19937 rng(seed);
  int exact = 0, compared = 0;
  for (int trial = 0; trial < count; ++trial) {
    Instance inst = randomInstance(rng, 5, 6, withMemory);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": " + inst.describe());
    PlannerOptions options;
    options.allowFewerDevices = allowFewer;
    options.microbatches = std::uniform_int_distribution<int>(1, 8)(rng);
    options.microbatchSize = std::uniform_int_distribution<int>(1, 6)(rng);
    PlanResult planned = planDapple(inst.profile, inst.topology, options, {});
    ExhaustiveResult shallow =
        dappleOracle(inst.profile, inst.topology, options,
                     ExhaustivePlacements::DapplePolicies, 2);
    ExhaustiveResult deep =
        dappleOracle(inst.profile, inst.topology, options,
                     ExhaustivePlacements::DapplePolicies, 0);
    ExhaustiveResult any = dappleOracle(inst.profile, inst.topology, options,
                                        ExhaustivePlacements::All, 0);
    if (!any.ok) {
      ASSERT_NE(any.error.find("memory"), std::string::npos) << any.error;
      ASSERT_FALSE(planned.ok);
      EXPECT_NE(planned.error.find("needs"), std::string::npos)
          << planned.error;
      continue;
    }
    ASSERT_TRUE(planned.ok) << planned.error;
    expectValidPlan(planned.plan, inst.profile, inst.topology);
    EXPECT_EQ(planned.plan.schedule, "1f1b-flush");
    EXPECT_EQ(planned.plan.microbatches, options.microbatches);
    int used = 0;
    for (const StagePlan &stage : planned.plan.stages)
      used += stage.replicas;
    if (!allowFewer) {
      EXPECT_EQ(used, inst.topology.numDevices());
    }
    double value = dappleValue(inst.profile, inst.topology, planned.plan);
    EXPECT_TRUE(nearlyEqual(value, planned.plan.predicted.iterationSeconds));
    // Never better than brute force over every placement.
    EXPECT_GE(value, any.objective * (1 - 1e-9));
    // Optimal among plans of at most two stages (policy placements).
    if (shallow.ok) {
      EXPECT_LE(value, shallow.objective * (1 + 1e-9))
          << replicaString(planned.plan) << " vs "
          << replicaString(shallow.plan);
    }
    ++compared;
    if (deep.ok && nearlyEqual(value, deep.objective, 1e-9))
      ++exact;
  }
  std::cout << "[ dapple ] equal to the oracle (policy placements, any "
               "depth) on "
            << exact << " of " << compared << " instances\n";
  EXPECT_GE(exact, compared * 8 / 10);
}

} // namespace

TEST(DappleOracle, RandomInstancesIdleDevicesAllowed) {
  compareWithOracle(21, 150, true, false);
}

TEST(DappleOracle, RandomInstancesEveryDeviceUsed) {
  compareWithOracle(22, 150, false, false);
}

TEST(DappleOracle, RandomInstancesWithMemoryLimits) {
  compareWithOracle(23, 150, true, true);
}

/// dapple.md invariant 8: never worse than data parallelism on every device
/// or the straight pipeline, whenever those fit.
TEST(DappleOracle, NeverWorseThanDataParallelOrStraight) {
  std::mt19937 rng(24);
  for (int trial = 0; trial < 150; ++trial) {
    Instance inst = randomInstance(rng, 12, 12);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": " + inst.describe());
    PlannerOptions options;
    options.microbatches = 8;
    options.microbatchSize = 4;
    PlanResult planned = planDapple(inst.profile, inst.topology, options, {});
    ASSERT_TRUE(planned.ok) << planned.error;
    double value = dappleValue(inst.profile, inst.topology, planned.plan);
    int n = static_cast<int>(inst.profile.ops.size());
    int g = inst.topology.numDevices();
    Plan dp;
    dp.microbatches = 8;
    dp.microbatchSize = 4;
    dp.stages = {{0, n - 1, g, {}}};
    for (int d = 0; d < g; ++d)
      dp.stages[0].devices.push_back(d);
    EXPECT_LE(value, dappleValue(inst.profile, inst.topology, dp) * (1 + 1e-9));
    int depth = std::min(n, g);
    if (depth < 2)
      continue;
    PlanResult balanced = planBalanced(inst.profile, depth);
    ASSERT_TRUE(balanced.ok);
    Plan straight = balanced.plan;
    straight.microbatches = 8;
    straight.microbatchSize = 4;
    EXPECT_LE(value,
              dappleValue(inst.profile, inst.topology, straight) * (1 + 1e-9));
  }
}

//===----------------------------------------------------------------------===//
// Uneven replication (dapple.md §4, Table V)
//===----------------------------------------------------------------------===//

/// VGG-19-like on 16 single-GPU machines at 10 Gbps: convolutions (heavy
/// compute, small weights, large activations) and a final fully connected
/// layer holding most weights. Replicating the FC layer costs an allreduce
/// of its weights over slow links: 15:1. (The model hides the allreduce of
/// a stage after the pivot behind the backward passes, AR_s - Σ_{a=Q}^{s}
/// B_a, so the FC weights must outweigh those backward passes: 4 GB here;
/// with 400 MB the model prefers 6:10, replicating the FC layer.)
TEST(DappleExamples, FifteenToOne) {
  std::vector<double> fwd(6, 0.04), bwd(6, 0.08);
  std::vector<int64_t> params(6, 2000000), out(6, 20000000);
  fwd[5] = 0.0005;
  bwd[5] = 0.001;
  params[5] = 4000000000;
  out[4] = 200000;
  Profile profile = chain(fwd, bwd, params, out);
  Topology cluster = topology({level(1, 1e11), level(16, 1.25e9, 1e-5)});
  PlannerOptions options;
  options.microbatchSize = 30; // 2 samples on each of 15 replicas
  options.microbatches = 16;
  PlanResult result = planDapple(profile, cluster, options, {});
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_EQ(replicaString(result.plan), "15-1");
  EXPECT_EQ(result.plan.stages.back().firstLayer, 5);
  // Uneven slices: 30 samples over 15 replicas are 2 each, over 16 they
  // would be ⌈30/16⌉ = 2 as well, so DP gains no compute but pays the FC
  // allreduce.
  ExhaustiveOptions eo;
  eo.objective = ExhaustiveObjective::Dapple;
  eo.placements = ExhaustivePlacements::InOrder;
  eo.maxStages = 2;
  ExhaustiveResult oracle = searchExhaustive(profile, cluster, options, eo);
  ASSERT_TRUE(oracle.ok) << oracle.error;
  EXPECT_EQ(replicaString(oracle.plan), "15-1");
  EXPECT_TRUE(nearlyEqual(dappleValue(profile, cluster, result.plan),
                          oracle.objective));
}

/// AmoebaNet-like: the first three cells do 11/5 of the last three's
/// compute, only the cut between them is cheap, and 55-sample microbatches
/// split evenly 11 and 5 ways: 11:5 (5 and 11 samples per replica, equal
/// stage times).
TEST(DappleExamples, ElevenToFive) {
  std::vector<double> fwd = {0.11, 0.11, 0.11, 0.05, 0.05, 0.05};
  std::vector<double> bwd = {0.22, 0.22, 0.22, 0.10, 0.10, 0.10};
  std::vector<int64_t> params(6, 30000000), out(6, 10000000);
  out[2] = 100000;
  Profile profile = chain(fwd, bwd, params, out);
  Topology cluster = topology({level(1, 1e11), level(16, 3.1e9, 1e-5)});
  PlannerOptions options;
  options.microbatchSize = 55;
  options.microbatches = 32;
  PlanResult result = planDapple(profile, cluster, options, {});
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_EQ(replicaString(result.plan), "11-5");
  EXPECT_EQ(result.plan.stages[0].lastLayer, 2);
  ExhaustiveOptions eo;
  eo.objective = ExhaustiveObjective::Dapple;
  eo.placements = ExhaustivePlacements::InOrder;
  eo.maxStages = 2;
  ExhaustiveResult oracle = searchExhaustive(profile, cluster, options, eo);
  ASSERT_TRUE(oracle.ok) << oracle.error;
  EXPECT_TRUE(nearlyEqual(dappleValue(profile, cluster, result.plan),
                          oracle.objective));
}

/// Replication splits microbatches into ⌈b/r⌉-sample slices: 11:5 of a
/// 16-sample microbatch runs slices of 2 and 4 samples.
TEST(DappleExamples, UnevenSlices) {
  Profile profile = chain({1, 1}, {2, 2}, {0, 0}, {0, 0});
  Topology cluster = topology({level(16, 1e9)});
  Plan plan;
  plan.microbatches = 1;
  plan.microbatchSize = 16;
  plan.stages = {{0, 0, 11, {}}, {1, 1, 5, {}}};
  for (int d = 0; d < 16; ++d)
    plan.stages[d < 11 ? 0 : 1].devices.push_back(d);
  DappleScore score = scoreDapple(profile, cluster, plan);
  ASSERT_TRUE(score.ok) << score.error;
  EXPECT_DOUBLE_EQ(score.forward[0], 2);  // ⌈16/11⌉ samples x 1 s
  EXPECT_DOUBLE_EQ(score.backward[2], 8); // ⌈16/5⌉ samples x 2 s
}

TEST(DappleExamples, FixedDepthAndBatchChoice) {
  Profile profile = chain({1, 1, 1, 1, 1, 1}, {2, 2, 2, 2, 2, 2},
                          {10, 10, 10, 10, 10, 10}, {5, 5, 5, 5, 5, 5});
  Topology cluster = topology({level(4, 1e3), level(2, 1e2)});
  PlannerOptions three;
  three.stages = 3;
  three.microbatches = 8;
  PlanResult result = planDapple(profile, cluster, three, {});
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_EQ(result.plan.numStages(), 3);
  expectValidPlan(result.plan, profile, cluster);
  // Only a global batch: DAPPLE picks b and M = B / b.
  PlannerOptions batch;
  batch.globalBatch = 64;
  result = planDapple(profile, cluster, batch, {});
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_EQ(result.plan.microbatches * result.plan.microbatchSize, 64);
}

TEST(DappleErrors, BadInput) {
  Profile profile = chain({1, 1}, {1, 1}, {100, 100}, {10, 10});
  Topology cluster = topology({level(2, 1e9)});
  PlannerOptions deep;
  deep.stages = 3;
  PlanResult r1 = planDapple(profile, cluster, deep, {});
  EXPECT_FALSE(r1.ok);
  EXPECT_NE(r1.error.find("cannot split 2 layers into 3 stages"),
            std::string::npos)
      << r1.error;
  // Each layer needs 2 x 100 bytes + 10 per microbatch: 210 bytes at
  // best, on two stages.
  Topology tiny = topology({level(2, 1e9)}, 150);
  PlanResult r2 = planDapple(profile, tiny, {}, {});
  EXPECT_FALSE(r2.ok);
  EXPECT_NE(r2.error.find("needs 210 B"), std::string::npos) << r2.error;
  PlannerOptions inconsistent;
  inconsistent.globalBatch = 10;
  inconsistent.microbatches = 3;
  PlanResult r3 = planDapple(profile, cluster, inconsistent, {});
  EXPECT_FALSE(r3.ok);
  EXPECT_NE(r3.error.find("global batch"), std::string::npos) << r3.error;
}

/// Issue 3's benchmark shape; a loose sanity bound only
/// (bench/planners_bench.cpp measures).
TEST(DappleScale, ThousandLayersOnThousandDevices) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  Profile profile;
  profile.microbatch = 1;
  for (int l = 0; l < 1000; ++l) {
    ProfileOp op;
    op.name = "l" + std::to_string(l);
    op.fwdSeconds = 1e-3 * jitter(rng);
    op.bwdSeconds = 2e-3 * jitter(rng);
    op.paramBytes = static_cast<int64_t>(2e7 * jitter(rng));
    op.outBytes = static_cast<int64_t>(4e6 * jitter(rng));
    op.savedBytes = op.outBytes * 4;
    profile.ops.push_back(op);
  }
  Topology cluster =
      topology({level(8, 3e11, 5e-6), level(128, 2.5e10, 1e-5)}, 80LL << 30);
  PlannerOptions options;
  options.globalBatch = 2048;
  auto start = std::chrono::steady_clock::now();
  PlanResult result = planDapple(profile, cluster, options, {});
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_TRUE(result.ok) << result.error;
  expectValidPlan(result.plan, profile, cluster);
  EXPECT_LT(seconds, 5.0);
  EXPECT_TRUE(nearlyEqual(dappleValue(profile, cluster, result.plan),
                          result.plan.predicted.iterationSeconds));
}
