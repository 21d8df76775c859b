//===- exhaustive_test.cpp - The brute-force oracle itself ----------------===//
//
// The oracle's enumeration (canonical placements up to the topology's
// symmetry, compositions, policy placements), its agreement with
// planBalanced (an independent exact planner) under a custom objective, its
// refusals, and the simulator-scored `exhaustive` planner.
//
//===----------------------------------------------------------------------===//

#include "PlannerTestUtil.h"

#include <algorithm>
#include <map>

using namespace pipec;
using namespace pipec::testutil;

namespace {

/// Counts the candidates the oracle scores, by stage count.
std::map<int, int> countCandidates(const Profile &profile,
                                   const Topology &topology, bool allowFewer,
                                   ExhaustivePlacements placements) {
  std::map<int, int> counts;
  PlannerOptions options;
  options.allowFewerDevices = allowFewer;
  ExhaustiveOptions eo;
  eo.placements = placements;
  eo.score = [&](const Plan &plan) {
    ++counts[plan.numStages()];
    return 1.0;
  };
  ExhaustiveResult result = searchExhaustive(profile, topology, options, eo);
  EXPECT_TRUE(result.ok) << result.error;
  return counts;
}

int64_t binomial(int n, int k) {
  int64_t value = 1;
  for (int i = 1; i <= k; ++i)
    value = value * (n - k + i) / i;
  return value;
}

} // namespace

/// On one level every device is alike: one placement per replication
/// vector, C(G-1, S-1) of them (C(G, S) when devices may stay idle), times
/// C(N-1, S-1) partitions.
TEST(ExhaustiveEnumeration, FlatTopologyCountsCompositions) {
  Profile profile =
      chain({1, 1, 1, 1}, {1, 1, 1, 1}, {0, 0, 0, 0}, {1, 1, 1, 1});
  Topology cluster = topology({level(5, 1)});
  for (bool idle : {false, true}) {
    std::map<int, int> counts =
        countCandidates(profile, cluster, idle, ExhaustivePlacements::All);
    for (int s = 1; s <= 4; ++s)
      EXPECT_EQ(counts[s], binomial(3, s - 1) *
                               (idle ? binomial(5, s) : binomial(4, s - 1)))
          << s << " stages";
    std::map<int, int> inOrder =
        countCandidates(profile, cluster, idle, ExhaustivePlacements::InOrder);
    EXPECT_EQ(inOrder, counts);
  }
}

/// Two machines of two devices, two stages, every device used: up to
/// swapping machines and devices inside a machine there are 4 placements:
/// {stage 1 on a whole machine, stage 0 on the other}, {3 + 1}, {1 + 3},
/// {one of each stage per machine}.
TEST(ExhaustiveEnumeration, HierarchicalSymmetry) {
  Profile profile = chain({1, 1}, {1, 1}, {0, 0}, {1, 1});
  Topology cluster = topology({level(2, 10), level(2, 1)});
  std::map<int, int> counts =
      countCandidates(profile, cluster, false, ExhaustivePlacements::All);
  EXPECT_EQ(counts[1], 1);
  EXPECT_EQ(counts[2], 4);
  // Three policy-made placements per stage, deduplicated.
  std::map<int, int> policies = countCandidates(
      profile, cluster, false, ExhaustivePlacements::DapplePolicies);
  EXPECT_GE(policies[2], 3);
  EXPECT_LE(policies[2], 9);
}

/// Under "largest stage time, one device per stage", the oracle agrees with
/// planBalanced, an independent exact DP.
TEST(ExhaustiveOracle, AgreesWithBalancedPlanner) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 100; ++trial) {
    Instance inst = randomInstance(rng, 8, 1);
    int n = static_cast<int>(inst.profile.ops.size());
    int stages = std::uniform_int_distribution<int>(1, n)(rng);
    Topology cluster = topology({level(stages, 1)});
    PlannerOptions options;
    options.allowFewerDevices = false;
    options.stages = stages;
    ExhaustiveOptions eo;
    eo.placements = ExhaustivePlacements::InOrder;
    eo.score = [&](const Plan &plan) {
      double worst = 0;
      for (const StagePlan &stage : plan.stages)
        worst = std::max(worst, stageSeconds(inst.profile, stage));
      return worst;
    };
    ExhaustiveResult oracle =
        searchExhaustive(inst.profile, cluster, options, eo);
    ASSERT_TRUE(oracle.ok) << oracle.error;
    PlanResult balanced = planBalanced(inst.profile, stages);
    ASSERT_TRUE(balanced.ok);
    double best = 0;
    for (const StagePlan &stage : balanced.plan.stages)
      best = std::max(best, stageSeconds(inst.profile, stage));
    EXPECT_TRUE(nearlyEqual(oracle.objective, best, 1e-12));
    EXPECT_EQ(oracle.plan.numStages(), stages);
  }
}

TEST(ExhaustiveErrors, RefusesLargeInstances) {
  Profile big = chain(std::vector<double>(40, 1), std::vector<double>(40, 1),
                      std::vector<int64_t>(40, 0), std::vector<int64_t>(40, 1));
  Topology cluster = topology({level(4, 1)});
  ExhaustiveOptions eo;
  eo.objective = ExhaustiveObjective::PipeDream;
  ExhaustiveResult result = searchExhaustive(big, cluster, {}, eo);
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.error.find("refusing 40 layers"), std::string::npos)
      << result.error;

  Profile small =
      chain(std::vector<double>(10, 1), std::vector<double>(10, 1),
            std::vector<int64_t>(10, 0), std::vector<int64_t>(10, 1));
  Topology wide = topology({level(2, 10), level(8, 1)});
  eo.maxCandidates = 1000;
  result = searchExhaustive(small, wide, {}, eo);
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.error.find("more than 1000 candidate plans"),
            std::string::npos)
      << result.error;

  ExhaustiveOptions custom; // Custom objective without a function
  result = searchExhaustive(small, cluster, {}, custom);
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.error.find("no objective"), std::string::npos);
}

/// The `exhaustive` planner scores with the simulator (in-order placement).
TEST(ExhaustivePlanner, SimulatorScored) {
  Profile profile = chain({1, 2, 1}, {2, 4, 2}, {100, 100, 100}, {10, 10, 10});
  Topology cluster = topology({level(3, 1e6)});
  PlannerOptions options;
  options.microbatches = 6;
  PlanResult result = planExhaustive(profile, cluster, options);
  ASSERT_TRUE(result.ok) << result.error;
  expectValidPlan(result.plan, profile, cluster);
  EXPECT_EQ(result.plan.algorithm, "exhaustive");
  EXPECT_GT(result.plan.predicted.samplesPerSecond, 0);
  // No candidate simulates faster.
  ExhaustiveOptions eo;
  eo.placements = ExhaustivePlacements::InOrder;
  double best = std::numeric_limits<double>::infinity();
  eo.score = [&](const Plan &plan) {
    SimResult sim = simulatePlan(profile, cluster, plan, options.sim);
    double perSample = sim.ok ? sim.iterationSeconds /
                                    (plan.microbatches * plan.microbatchSize)
                              : std::numeric_limits<double>::infinity();
    best = std::min(best, perSample);
    return perSample;
  };
  ExhaustiveResult all = searchExhaustive(profile, cluster, options, eo);
  ASSERT_TRUE(all.ok);
  EXPECT_TRUE(
      nearlyEqual(1.0 / result.plan.predicted.samplesPerSecond, best, 1e-9));
}
