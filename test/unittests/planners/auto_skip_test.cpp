//===- auto_skip_test.cpp - `auto` skips plans that cannot win ------------===//
//
// planAuto does not simulate a large flush plan whose throughput bound (the
// busiest device's compute, flushIterationLowerBound) is below a feasible
// candidate's simulated throughput. Checked here at a size where that
// happens: every skipped plan, simulated anyway, is slower than its bound
// says and than the chosen plan, so the choice is the full search's.
//
//===----------------------------------------------------------------------===//

#include "PlannerTestUtil.h"

#include "pipec/Sim.h"

#include <random>

using namespace pipec;
using namespace pipec::testutil;

TEST(AutoSkip, SkippedPlansCannotBeatTheChoice) {
  // 300 jittered layers on 32 nodes x 8: the balanced plan is 256 stages x
  // 1024 microbatches (about 800k simulated ops).
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  const int layers = 300;
  std::vector<double> fwd, bwd;
  std::vector<int64_t> out, params;
  for (int l = 0; l < layers; ++l) {
    fwd.push_back(1e-3 * jitter(rng));
    bwd.push_back(2e-3 * jitter(rng));
    out.push_back(int64_t(4e6 * jitter(rng)));
    params.push_back(int64_t(2e7 * jitter(rng)));
  }
  Profile profile = chain(fwd, bwd, out, params);
  Topology topo = topology({level(8, 3e11, 5e-6), level(32, 2.5e10, 1e-5)});
  topo.deviceMemoryBytes = 80LL << 30;
  AutoPlanResult result = planAuto(profile, topo, PlannerOptions());
  ASSERT_TRUE(result.ok) << result.error;
  double chosen = 0;
  for (const PlanCandidate &c : result.candidates)
    if (c.feasible)
      chosen = std::max(chosen, c.sim.samplesPerSecond);
  EXPECT_NEAR(result.best.predicted.samplesPerSecond, chosen, 1e-9 * chosen);
  int skipped = 0;
  for (const PlanCandidate &c : result.candidates) {
    if (!c.skipped)
      continue;
    ++skipped;
    SCOPED_TRACE(c.plan.algorithm + ": " + c.note);
    EXPECT_FALSE(c.feasible);
    EXPECT_FALSE(c.sim.ok);
    SimOptions options;
    options.splitReplicas = c.plan.algorithm == "dapple";
    SimResult full = simulatePlan(profile, topo, c.plan, options);
    ASSERT_TRUE(full.ok) << full.error;
    EXPECT_LT(full.samplesPerSecond, chosen);
    const double bound = flushIterationLowerBound(profile, c.plan, options);
    ASSERT_GT(bound, 0);
    EXPECT_LE(bound, full.iterationSeconds);
  }
  EXPECT_GE(skipped, 1);
}
