//===- pipedream_test.cpp - PipeDream's hierarchical DP against brute force
//===//
//
// The planner's bottleneck A^L equals the exhaustive oracle's under the
// same model (scorePipeDream) on hundreds of seeded random instances, with
// and without idle devices, both sync models and memory limits; the fast
// threshold search equals the printed recurrence on larger instances; the
// worked examples of pipedream.md (Figure 8's "2-1", the DP limits, NOAM).
//
//===----------------------------------------------------------------------===//

#include "PlannerTestUtil.h"

#include <chrono>

using namespace pipec;
using namespace pipec::testutil;

namespace {

double pipeDreamValue(const Profile &profile, const Topology &topology,
                      const Plan &plan, PipeDreamSync sync) {
  PipeDreamOptions options;
  options.sync = sync;
  PipeDreamScore score = scorePipeDream(profile, topology, plan, {}, options);
  EXPECT_TRUE(score.ok) << score.error;
  return score.bottleneckSeconds;
}

ExhaustiveResult pipeDreamOracle(const Profile &profile,
                                 const Topology &topology,
                                 const PlannerOptions &options,
                                 PipeDreamSync sync) {
  ExhaustiveOptions eo;
  eo.objective = ExhaustiveObjective::PipeDream;
  eo.placements = ExhaustivePlacements::All;
  eo.pipedream.sync = sync;
  return searchExhaustive(profile, topology, options, eo);
}

/// Planner vs oracle on `count` random instances.
void compareWithOracle(unsigned seed, int count, bool allowFewer,
                       PipeDreamSync sync, bool withMemory) {
  std::mt19937 rng(seed);
  int infeasible = 0;
  for (int trial = 0; trial < count; ++trial) {
    Instance inst = randomInstance(rng, 5, 6, withMemory);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": " + inst.describe());
    PlannerOptions options;
    options.allowFewerDevices = allowFewer;
    PipeDreamOptions pd;
    pd.sync = sync;
    PlanResult planned =
        planPipeDream(inst.profile, inst.topology, options, pd);
    ExhaustiveResult oracle =
        pipeDreamOracle(inst.profile, inst.topology, options, sync);
    if (!oracle.ok) {
      // Only memory can make every plan infeasible.
      ASSERT_NE(oracle.error.find("memory"), std::string::npos) << oracle.error;
      ASSERT_FALSE(planned.ok);
      EXPECT_NE(planned.error.find("needs"), std::string::npos)
          << planned.error;
      ++infeasible;
      continue;
    }
    ASSERT_TRUE(planned.ok) << planned.error;
    expectValidPlan(planned.plan, inst.profile, inst.topology);
    double value =
        pipeDreamValue(inst.profile, inst.topology, planned.plan, sync);
    EXPECT_TRUE(nearlyEqual(value, oracle.objective, 1e-8))
        << "planner " << value << " (" << replicaString(planned.plan)
        << ") vs exhaustive " << oracle.objective << " ("
        << replicaString(oracle.plan) << ")";
    // The prediction is the model's: samples/s = microbatch / A^L.
    EXPECT_TRUE(nearlyEqual(planned.plan.predicted.samplesPerSecond,
                            planned.plan.microbatchSize / value, 1e-9));
    int used = 0;
    for (const StagePlan &stage : planned.plan.stages)
      used += stage.replicas;
    if (!allowFewer) {
      EXPECT_EQ(used, inst.topology.numDevices());
    }
    EXPECT_EQ(planned.plan.microbatches,
              pipeDreamNoam(used, planned.plan.stages.front().replicas));
    EXPECT_EQ(planned.plan.schedule, "1f1b");
  }
  if (withMemory) {
    EXPECT_LT(infeasible, count / 2);
  }
}

} // namespace

//===----------------------------------------------------------------------===//
// Against the oracle
//===----------------------------------------------------------------------===//

TEST(PipeDreamOracle, RandomInstancesIdleDevicesAllowed) {
  compareWithOracle(1, 250, /*allowFewer=*/true, PipeDreamSync::Ring, false);
}

TEST(PipeDreamOracle, RandomInstancesEveryDeviceUsed) {
  compareWithOracle(2, 250, /*allowFewer=*/false, PipeDreamSync::Ring, false);
}

TEST(PipeDreamOracle, RandomInstancesPaperSync) {
  compareWithOracle(3, 150, true, PipeDreamSync::Paper, false);
  compareWithOracle(4, 150, false, PipeDreamSync::Paper, false);
}

TEST(PipeDreamOracle, RandomInstancesWithMemoryLimits) {
  compareWithOracle(5, 200, true, PipeDreamSync::Ring, true);
  compareWithOracle(6, 150, false, PipeDreamSync::Ring, true);
}

/// The threshold search (idle devices allowed) equals the printed
/// recurrence evaluated directly, on instances too big for brute force.
TEST(PipeDreamOracle, ThresholdSearchEqualsRecurrence) {
  std::mt19937 rng(7);
  int compared = 0;
  for (int trial = 0; trial < 40; ++trial) {
    Instance inst = randomInstance(rng, 40, 1, trial % 3 == 0);
    // Larger hierarchical topologies than randomInstance draws.
    std::uniform_int_distribution<int> pick(1, 5);
    inst.topology.levels = {level(pick(rng), 2000), level(pick(rng), 300, 0.01),
                            level(pick(rng), 100, 0.05)};
    if (inst.topology.deviceMemoryBytes)
      inst.topology.deviceMemoryBytes *= 4;
    SCOPED_TRACE("trial " + std::to_string(trial) + ": " + inst.describe());
    PlannerOptions options;
    PipeDreamOptions fast, reference;
    reference.referenceDP = true;
    PlanResult a = planPipeDream(inst.profile, inst.topology, options, fast);
    PlanResult b =
        planPipeDream(inst.profile, inst.topology, options, reference);
    ASSERT_EQ(a.ok, b.ok) << a.error << " / " << b.error;
    if (!a.ok)
      continue;
    expectValidPlan(a.plan, inst.profile, inst.topology);
    expectValidPlan(b.plan, inst.profile, inst.topology);
    double va = pipeDreamValue(inst.profile, inst.topology, a.plan,
                               PipeDreamSync::Ring);
    double vb = pipeDreamValue(inst.profile, inst.topology, b.plan,
                               PipeDreamSync::Ring);
    EXPECT_TRUE(nearlyEqual(va, vb, 1e-8)) << va << " vs " << vb;
    ++compared;
  }
  EXPECT_GE(compared, 30);
}

//===----------------------------------------------------------------------===//
// Worked examples (pipedream.md §2.4, §7)
//===----------------------------------------------------------------------===//

/// Figure 8: stage 1 (F = B = 2) replicated twice, stage 2 (F = B = 1) once:
/// "2-1" with bottleneck 2. As a test vector: T = [4, 2], w = [0, 100],
/// a = [1, 0], B = 1, 3 workers.
TEST(PipeDreamExamples, Figure8TwoOne) {
  Profile profile = chain({2, 1}, {2, 1}, {0, 100}, {1, 0});
  Topology cluster = topology({level(3, 1.0)});
  for (bool allowFewer : {false, true}) {
    PlannerOptions options;
    options.allowFewerDevices = allowFewer;
    PipeDreamOptions pd;
    pd.sync = PipeDreamSync::Paper;
    PlanResult result = planPipeDream(profile, cluster, options, pd);
    ASSERT_TRUE(result.ok) << result.error;
    ASSERT_EQ(replicaString(result.plan), "2-1");
    EXPECT_EQ(result.plan.stages[0].lastLayer, 0);
    EXPECT_DOUBLE_EQ(
        pipeDreamValue(profile, cluster, result.plan, PipeDreamSync::Paper),
        2.0);
    EXPECT_EQ(result.plan.microbatches, 2); // NOAM = ⌈3/2⌉
    EXPECT_DOUBLE_EQ(result.plan.predicted.samplesPerSecond, 0.5);
  }
  // The alternatives: DP = (1/3) max(6, 2·2·100/1); "1-1" = 4; "1-2" =
  // max(4, 2, (1/2) max(2, 200)) = 100.
  Plan dp;
  dp.stages = {{0, 1, 3, {0, 1, 2}}};
  EXPECT_DOUBLE_EQ(pipeDreamValue(profile, cluster, dp, PipeDreamSync::Paper),
                   400.0 / 3);
  Plan straight;
  straight.stages = {{0, 0, 1, {0}}, {1, 1, 1, {1}}};
  EXPECT_DOUBLE_EQ(
      pipeDreamValue(profile, cluster, straight, PipeDreamSync::Paper), 4.0);
  Plan oneTwo;
  oneTwo.stages = {{0, 0, 1, {0}}, {1, 1, 2, {1, 2}}};
  EXPECT_DOUBLE_EQ(
      pipeDreamValue(profile, cluster, oneTwo, PipeDreamSync::Paper), 100.0);
  // The ring allreduce halves that sync term: 2·(1/2)·100 / 2 = 50.
  EXPECT_DOUBLE_EQ(
      pipeDreamValue(profile, cluster, oneTwo, PipeDreamSync::Ring), 50.0);
}

/// B → ∞: the optimum is ΣT_l / m by one stage replicated m times
/// (T = [3, 1, 2, 5], m = 4 → 2.75, config "4").
TEST(PipeDreamExamples, InfiniteBandwidthGivesDataParallelism) {
  Profile profile =
      chain({1, 0.5, 1, 2}, {2, 0.5, 1, 3}, {10, 10, 10, 10}, {5, 5, 5, 5});
  Topology cluster = topology({level(4, 1e30)});
  for (bool allowFewer : {false, true}) {
    PlannerOptions options;
    options.allowFewerDevices = allowFewer;
    PlanResult result = planPipeDream(profile, cluster, options, {});
    ASSERT_TRUE(result.ok) << result.error;
    EXPECT_EQ(replicaString(result.plan), "4");
    EXPECT_DOUBLE_EQ(
        pipeDreamValue(profile, cluster, result.plan, PipeDreamSync::Ring),
        2.75);
    EXPECT_EQ(result.plan.microbatches, 1); // NOAM of DP
  }
}

/// Large weights, negligible activations: replication is avoided, a
/// straight pipeline of balanced stages wins.
TEST(PipeDreamExamples, WeightSyncDominatesGivesStraightPipeline) {
  Profile profile =
      chain({1, 1, 1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1, 1, 1},
            std::vector<int64_t>(8, 1000000000), std::vector<int64_t>(8, 1));
  Topology cluster = topology({level(4, 1e6)});
  PlanResult result = planPipeDream(profile, cluster, {}, {});
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_EQ(replicaString(result.plan), "1-1-1-1");
  EXPECT_EQ(result.plan.microbatches, 4); // NOAM of a straight pipeline
  for (const StagePlan &stage : result.plan.stages)
    EXPECT_EQ(stage.lastLayer - stage.firstLayer, 1);
}

/// Large activations everywhere, small weights: no cut is worth it, the
/// plan is data parallel (the ResNet-50 case).
TEST(PipeDreamExamples, ActivationsDominateGivesDataParallelism) {
  Profile profile = chain({1, 1, 1, 1}, {2, 2, 2, 2}, {10, 10, 10, 10},
                          {1000000000, 1000000000, 1000000000, 1});
  Topology cluster = topology({level(4, 1e6)});
  PlanResult result = planPipeDream(profile, cluster, {}, {});
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_EQ(replicaString(result.plan), "4");
}

/// A is not monotone in m (pipedream.md §8.3): one layer, T = 1, w = 10,
/// B = 1 gives A = 1, 10, 13.3, 15 for m = 1..4 with the printed sync.
TEST(PipeDreamExamples, FewerDevicesOption) {
  Profile profile = chain({0.5}, {0.5}, {10}, {1});
  Topology cluster = topology({level(4, 1.0)});
  PipeDreamOptions pd;
  pd.sync = PipeDreamSync::Paper;
  PlannerOptions every;
  every.allowFewerDevices = false;
  PlanResult all = planPipeDream(profile, cluster, every, pd);
  ASSERT_TRUE(all.ok) << all.error;
  EXPECT_EQ(replicaString(all.plan), "4");
  EXPECT_DOUBLE_EQ(
      pipeDreamValue(profile, cluster, all.plan, PipeDreamSync::Paper), 15.0);
  PlannerOptions fewer;
  fewer.allowFewerDevices = true;
  PlanResult some = planPipeDream(profile, cluster, fewer, pd);
  ASSERT_TRUE(some.ok) << some.error;
  EXPECT_EQ(replicaString(some.plan), "1");
  EXPECT_DOUBLE_EQ(
      pipeDreamValue(profile, cluster, some.plan, PipeDreamSync::Paper), 1.0);
  Topology three = topology({level(3, 1.0)});
  PlanResult m3 = planPipeDream(profile, three, every, pd);
  ASSERT_TRUE(m3.ok);
  EXPECT_NEAR(pipeDreamValue(profile, three, m3.plan, PipeDreamSync::Paper),
              40.0 / 3, 1e-12);
}

/// Level-k replication counts whole level-(k-1) components, and the level-1
/// result of a server is the compute term at level 2 (pipedream.md §7.10).
TEST(PipeDreamExamples, HierarchyReplicatesWholeServers) {
  // Two servers of two devices; fast inside, slow between. Four equal
  // layers with weights: inside a server the pair pipelines or replicates;
  // across servers only activations are cheap enough.
  Profile profile =
      chain({1, 1, 1, 1}, {1, 1, 1, 1}, {100, 100, 100, 100}, {1, 1, 1, 1});
  Topology cluster = topology({level(2, 1e6), level(2, 10)});
  PlanResult result = planPipeDream(profile, cluster, {}, {});
  ASSERT_TRUE(result.ok) << result.error;
  expectValidPlan(result.plan, profile, cluster);
  // Two top-level stages, one per server, each split or replicated inside.
  std::set<int> serverOfStage0, serverOfLast;
  for (int d : result.plan.stages.front().devices)
    serverOfStage0.insert(d / 2);
  for (int d : result.plan.stages.back().devices)
    serverOfLast.insert(d / 2);
  EXPECT_EQ(serverOfStage0.size(), 1u);
  EXPECT_EQ(serverOfLast.size(), 1u);
  EXPECT_NE(*serverOfStage0.begin(), *serverOfLast.begin());
  // A plan that replicates a stage across part of a server is rejected by
  // the model: replicas must be whole components.
  Plan ragged;
  ragged.stages = {{0, 1, 3, {0, 1, 2}}, {2, 3, 1, {3}}};
  PipeDreamScore score = scorePipeDream(profile, cluster, ragged);
  EXPECT_FALSE(score.ok);
  EXPECT_NE(score.error.find("hierarchical"), std::string::npos) << score.error;
}

/// A cut carries every tensor live across it (skip connections included),
/// C = 2 (latency + a_s / B).
TEST(PipeDreamExamples, CutCostCountsSkipConnections) {
  Profile profile = chain({1, 1, 1}, {0, 0, 0}, {0, 0, 0}, {100, 10, 1});
  profile.ops[2].inputs = {0, 1}; // layer 0's output skips to layer 2
  Topology cluster = topology({level(2, 1.0, 0.5)});
  Plan plan;
  plan.stages = {{0, 1, 1, {0}}, {2, 2, 1, {1}}};
  // Across the cut after layer 1: 100 + 10 bytes. 2 (0.5 + 110 / 1) = 221.
  EXPECT_DOUBLE_EQ(pipeDreamValue(profile, cluster, plan, PipeDreamSync::Ring),
                   221.0);
}

TEST(PipeDreamExamples, Noam) {
  EXPECT_EQ(pipeDreamNoam(4, 1), 4);   // straight on 4 (Figure 4)
  EXPECT_EQ(pipeDreamNoam(16, 15), 2); // 15-1 on 16
  EXPECT_EQ(pipeDreamNoam(16, 16), 1); // DP
  EXPECT_EQ(pipeDreamNoam(4, 2), 2);   // 2-1-1
  EXPECT_EQ(pipeDreamNoam(3, 2), 2);   // Figure 8's 2-1
  EXPECT_EQ(pipeDreamNoam(16, 1), 16);
}

/// The memory rule: a stage of R replicas holds v = ⌈D/R⌉ weight versions
/// and activation stashes, plus a gradient (and optimizer state).
TEST(PipeDreamExamples, MemoryRuleAndError) {
  Profile profile = chain({1, 1}, {1, 1}, {100, 100}, {10, 10});
  // D = 2: one stage on one device holds 2 x (200 + 20) + 200 = 640; two
  // stages hold 2 x 110 + 100 = 320 and 110 + 100 (but the bound says 2
  // versions for both: 320).
  Topology roomy = topology({level(2, 1e9)}, 640);
  PlanResult ok = planPipeDream(profile, roomy, {}, {});
  ASSERT_TRUE(ok.ok) << ok.error;
  Topology tight = topology({level(2, 1e9)}, 330);
  PlanResult split = planPipeDream(profile, tight, {}, {});
  ASSERT_TRUE(split.ok) << split.error;
  EXPECT_EQ(replicaString(split.plan), "1-1");
  Topology tiny = topology({level(2, 1e9)}, 100);
  PlanResult none = planPipeDream(profile, tiny, {}, {});
  ASSERT_FALSE(none.ok);
  EXPECT_NE(none.error.find("needs"), std::string::npos) << none.error;
  // The least any plan needs is 2 x 110 + 100 = 320 bytes (or 1 x 220 +
  // 200 = 420 for DP over both devices with v = 1): 320 B.
  EXPECT_NE(none.error.find("320 B"), std::string::npos) << none.error;
}

TEST(PipeDreamErrors, BadInput) {
  Profile empty;
  Topology cluster = topology({level(2, 1)});
  PlanResult r1 = planPipeDream(empty, cluster, {}, {});
  EXPECT_FALSE(r1.ok);
  EXPECT_NE(r1.error.find("empty"), std::string::npos) << r1.error;

  Profile negative = chain({1, -1}, {1, 1}, {0, 0}, {1, 1});
  PlanResult r2 = planPipeDream(negative, cluster, {}, {});
  EXPECT_FALSE(r2.ok);
  EXPECT_NE(r2.error.find("negative"), std::string::npos) << r2.error;

  Profile ok = chain({1, 1}, {1, 1}, {0, 0}, {1, 1});
  Topology broken = topology({level(0, 1)});
  PlanResult r3 = planPipeDream(ok, broken, {}, {});
  EXPECT_FALSE(r3.ok);
  EXPECT_NE(r3.error.find("count"), std::string::npos) << r3.error;

  PlannerOptions deep;
  deep.stages = 3;
  PlanResult r4 = planPipeDream(ok, cluster, deep, {});
  EXPECT_FALSE(r4.ok);
  EXPECT_NE(r4.error.find("cannot split 2 layers into 3 stages"),
            std::string::npos)
      << r4.error;

  PlannerOptions inconsistent;
  inconsistent.microbatches = 4;
  inconsistent.microbatchSize = 8;
  inconsistent.globalBatch = 30;
  PlanResult r5 = planPipeDream(ok, cluster, inconsistent, {});
  EXPECT_FALSE(r5.ok);
  EXPECT_NE(r5.error.find("global batch"), std::string::npos) << r5.error;
}

/// Issue 3's benchmark shape: a 1,000-layer chain on 128 nodes x 8. A loose
/// sanity bound only; bench/planners_bench.cpp measures.
TEST(PipeDreamScale, ThousandLayersOnThousandDevices) {
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
  auto start = std::chrono::steady_clock::now();
  PlanResult result = planPipeDream(profile, cluster, {}, {});
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  ASSERT_TRUE(result.ok) << result.error;
  expectValidPlan(result.plan, profile, cluster);
  EXPECT_LT(seconds, 5.0);
  EXPECT_TRUE(nearlyEqual(
      pipeDreamValue(profile, cluster, result.plan, PipeDreamSync::Ring),
      result.plan.microbatchSize / result.plan.predicted.samplesPerSecond,
      1e-9));
}
