//===- auto_search_test.cpp - `auto` searches schedule x recompute x m ----===//
//
// planAuto scores, beside every planner's plan, its variants: zero bubble
// on a straight synchronous plan, twice / half the microbatches, full
// recomputation on the stages over the memory limit (and with an arena
// profile the least recomputation that fits), and the balanced split
// into 2p stages in a V (zb-v).
//
//===----------------------------------------------------------------------===//

#include "PlannerTestUtil.h"

#include "pipec/Sim.h"

using namespace pipec;
using namespace pipec::testutil;

namespace {

const PlanCandidate *find(const AutoPlanResult &r, const std::string &name) {
  for (const PlanCandidate &c : r.candidates)
    if (c.plan.algorithm == name)
      return &c;
  return nullptr;
}

} // namespace

TEST(AutoSearch, RecomputationMakesAPlanFit) {
  const int layers = 8;
  Profile profile = chain(std::vector<double>(layers, 1e-3),
                          std::vector<double>(layers, 2e-3),
                          std::vector<int64_t>(layers, 1 << 20),
                          std::vector<int64_t>(layers, 8 << 20));
  Topology topo = topology({level(4, 1e10, 1e-6)});
  PlannerOptions options;
  options.microbatches = 8;
  // The balanced plan's peak with and without recomputation.
  PlanResult balanced = runPlanner("balanced", profile, topo, options);
  ASSERT_TRUE(balanced.ok) << balanced.error;
  SimResult plain = simulatePlan(profile, topo, balanced.plan, {});
  SimOptions rc;
  rc.recompute = true;
  SimResult recomputed = simulatePlan(profile, topo, balanced.plan, rc);
  ASSERT_TRUE(plain.ok && recomputed.ok);
  int64_t peakPlain = 0, peakRc = 0;
  for (const DeviceUsage &d : plain.devices)
    peakPlain = std::max(peakPlain, d.peakBytes);
  for (const DeviceUsage &d : recomputed.devices)
    peakRc = std::max(peakRc, d.peakBytes);
  ASSERT_LT(peakRc, peakPlain);
  topo.deviceMemoryBytes = (peakRc + peakPlain) / 2;

  AutoPlanResult result = planAuto(profile, topo, options);
  ASSERT_TRUE(result.ok) << result.error;
  const PlanCandidate *base = find(result, "balanced");
  const PlanCandidate *withRc = find(result, "balanced+rc");
  ASSERT_TRUE(base && withRc);
  EXPECT_FALSE(base->feasible);
  EXPECT_TRUE(withRc->feasible) << withRc->note;
  // Only the stages over the limit recompute (the first ones, which stash
  // the most microbatches).
  EXPECT_EQ(withRc->plan.stages.front().recompute, "full");
  EXPECT_EQ(withRc->plan.stages.back().recompute, "");
  // The other axes were scored too.
  EXPECT_TRUE(find(result, "balanced/zb-h1"));
  EXPECT_TRUE(find(result, "balanced/zb-v"));
  // With the microbatch count fixed by the caller, no /m variants.
  for (const PlanCandidate &c : result.candidates)
    EXPECT_EQ(c.plan.algorithm.find("/m"), std::string::npos)
        << c.plan.algorithm;
  // The chosen plan fits, and plan.json keeps each stage's mode.
  EXPECT_TRUE(result.best.algorithm.rfind("auto:", 0) == 0);
  PlanResult back = planFromJson(planToJson(withRc->plan));
  ASSERT_TRUE(back.ok) << back.error;
  EXPECT_EQ(back.plan.stages.front().recompute, "full");
}

TEST(AutoSearch, ArenaProfileTakesTheLeastRecomputationThatFits) {
  // An arena profile (as pipec profile writes): per stage a GEMM, a cheap
  // op stashing 3 MB, and a GEMM whose output the next stage reads.
  // Selective recomputation keeps the first GEMM's output (1 MB) and
  // recomputes the 3 MB; full keeps only inputs and outputs.
  const int layers = 12;
  const int64_t mb = 1 << 20;
  Profile profile = chain(
      std::vector<double>(layers, 1e-3), std::vector<double>(layers, 2e-3),
      std::vector<int64_t>(layers, 1024), std::vector<int64_t>(layers, mb));
  profile.memoryModel = "arena";
  for (int l = 0; l < layers; ++l) {
    ProfileOp &op = profile.ops[l];
    op.op = l % 3 == 1 ? "softmax" : "gemm";
    op.savedBytes = l % 3 == 1 ? 3 * mb : 0;
    op.fwdScratchBytes = op.bwdScratchBytes = mb;
  }
  Topology topo = topology({level(4, 1e10, 1e-6)});
  PlannerOptions options;
  options.microbatches = 8;
  PlanResult balanced = runPlanner("balanced", profile, topo, options);
  ASSERT_TRUE(balanced.ok) << balanced.error;
  // Every stage's memory in each mode.
  auto memory = [&](const char *mode) {
    Plan plan = balanced.plan;
    for (StagePlan &s : plan.stages)
      s.recompute = mode;
    SimResult sim = simulatePlan(profile, topo, plan, {});
    EXPECT_TRUE(sim.ok) << sim.error;
    std::vector<int64_t> bytes;
    for (const StageMemory &m : sim.memory)
      bytes.push_back(m.total());
    return bytes;
  };
  std::vector<int64_t> none = memory(""), sel = memory("selective"),
                       full = memory("full");
  ASSERT_EQ(none.size(), 4u);
  // Stage 0 (4 microbatches in flight) fits only with recomputation;
  // selective is enough.
  ASSERT_LT(full[0], sel[0]);
  ASSERT_LT(sel[0], none[0]);
  topo.deviceMemoryBytes = (sel[0] + none[0]) / 2;
  ASSERT_GT(none[0], topo.deviceMemoryBytes);

  AutoPlanResult result = planAuto(profile, topo, options);
  ASSERT_TRUE(result.ok) << result.error;
  const PlanCandidate *rc = find(result, "balanced+rc");
  const PlanCandidate *least = find(result, "balanced+rc-sel");
  ASSERT_TRUE(rc && least);
  EXPECT_TRUE(rc->feasible) << rc->note;
  EXPECT_TRUE(least->feasible) << least->note;
  EXPECT_EQ(rc->plan.stages[0].recompute, "full");
  EXPECT_EQ(least->plan.stages[0].recompute, "selective");
  for (size_t q = 0; q < 4; ++q)
    if (none[q] <= topo.deviceMemoryBytes)
      EXPECT_EQ(least->plan.stages[q].recompute, "") << "stage " << q;
  // Selective recomputes only the cheap ops: a shorter iteration.
  EXPECT_LT(least->sim.iterationSeconds, rc->sim.iterationSeconds);
}

TEST(AutoSearch, MicrobatchCountVariants) {
  Profile profile =
      chain(std::vector<double>(6, 1e-3), std::vector<double>(6, 2e-3),
            std::vector<int64_t>(6, 1 << 10), std::vector<int64_t>(6, 1 << 10));
  profile.microbatch = 4;
  Topology topo = topology({level(3, 1e10, 1e-6)});
  PlannerOptions options;
  options.globalBatch = 64;
  AutoPlanResult result = planAuto(profile, topo, options);
  ASSERT_TRUE(result.ok) << result.error;
  const PlanCandidate *dapple = find(result, "dapple");
  ASSERT_TRUE(dapple && dapple->sim.ok);
  const int m = dapple->plan.microbatches;
  const int64_t b = dapple->plan.microbatchSize;
  // Half as many microbatches of twice the size keeps the global batch.
  if (m % 2 == 0) {
    const PlanCandidate *fewer =
        find(result, "dapple/m" + std::to_string(m / 2));
    ASSERT_TRUE(fewer);
    EXPECT_EQ(fewer->plan.microbatchSize, 2 * b);
  }
  if (b % 2 == 0)
    EXPECT_TRUE(find(result, "dapple/m" + std::to_string(2 * m)));
}
