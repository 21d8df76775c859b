//===- plan_test.cpp - balanced planner, plan validation, plan.json -------===//
//
// The balanced planner against a brute-force enumeration of all contiguous
// partitions; validatePlan against each kind of violation; cutBytes with
// skip connections; plan.json round trips and rejections.
//
//===----------------------------------------------------------------------===//

#include "pipec/Plan.h"
#include "pipec/Planners.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

using namespace pipec;

namespace {

//===----------------------------------------------------------------------===//
// Oracle: brute force over all contiguous partitions.
//===----------------------------------------------------------------------===//

/// Bytes crossing the cut after layer `cut`, every live tensor once. Written
/// independently of the library: a direct scan of all (producer, consumer)
/// edges.
int64_t oracleCutBytes(const Profile &profile, int cut) {
  int n = static_cast<int>(profile.ops.size());
  int64_t bytes = 0;
  for (int t = 0; t <= cut; ++t) {
    bool live = false;
    for (int j = cut + 1; j < n && !live; ++j) {
      std::vector<int> producers = profile.ops[j].inputs;
      if (producers.empty())
        producers = {j - 1};
      live =
          std::find(producers.begin(), producers.end(), t) != producers.end();
    }
    if (live)
      bytes += profile.ops[t].outBytes;
  }
  return bytes;
}

struct Objective {
  double maxStage = 0;
  int64_t bytes = 0;
};

/// Every way to pick numStages-1 cut positions from L-1, and the optimum of
/// (max stage time, then total cut bytes among the partitions achieving the
/// minimal max within a relative `tolerance`).
Objective bruteForce(const Profile &profile, int numStages, double tolerance) {
  int n = static_cast<int>(profile.ops.size());
  std::vector<double> cost(n);
  double total = 0;
  for (int l = 0; l < n; ++l)
    total += cost[l] = profile.ops[l].fwdSeconds + profile.ops[l].bwdSeconds;
  if (total == 0)
    std::fill(cost.begin(), cost.end(), 1.0); // balance op counts
  std::vector<int64_t> cutCost(n);
  for (int c = 0; c + 1 < n; ++c)
    cutCost[c] = oracleCutBytes(profile, c);

  struct Candidate {
    double maxStage;
    int64_t bytes;
  };
  std::vector<Candidate> all;
  // Bitmask over the n-1 cut positions.
  for (uint32_t mask = 0; mask < (1u << (n - 1)); ++mask) {
    if (__builtin_popcount(mask) != numStages - 1)
      continue;
    double stage = 0, worst = 0;
    int64_t bytes = 0;
    for (int l = 0; l < n; ++l) {
      stage += cost[l];
      if (l + 1 == n || (mask >> l & 1)) {
        worst = std::max(worst, stage);
        stage = 0;
        if (l + 1 < n)
          bytes += cutCost[l];
      }
    }
    all.push_back({worst, bytes});
  }
  Objective best;
  best.maxStage = std::numeric_limits<double>::infinity();
  for (const Candidate &c : all)
    best.maxStage = std::min(best.maxStage, c.maxStage);
  best.bytes = std::numeric_limits<int64_t>::max();
  for (const Candidate &c : all)
    if (c.maxStage <= best.maxStage * (1 + tolerance))
      best.bytes = std::min(best.bytes, c.bytes);
  return best;
}

/// A random DAG profile in topological order: chains, skip connections and
/// multi-input ops. `integral` costs make exact ties frequent.
Profile randomProfile(std::mt19937 &rng, int numOps, bool integral,
                      bool allZero) {
  Profile profile;
  std::uniform_int_distribution<int> smallInt(0, 4);
  std::uniform_real_distribution<double> real(0.0, 1.0);
  std::uniform_int_distribution<int64_t> bytes(0, 100);
  for (int i = 0; i < numOps; ++i) {
    ProfileOp op;
    op.name = "op" + std::to_string(i);
    if (!allZero) {
      op.fwdSeconds = integral ? smallInt(rng) : real(rng);
      op.bwdSeconds = integral ? smallInt(rng) : real(rng);
    }
    op.outBytes = bytes(rng);
    if (i > 0 && rng() % 2) {
      int fanIn = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < fanIn; ++k) {
        int producer = static_cast<int>(rng() % i);
        if (std::find(op.inputs.begin(), op.inputs.end(), producer) ==
            op.inputs.end())
          op.inputs.push_back(producer);
      }
    }
    profile.ops.push_back(op);
  }
  return profile;
}

double maxStageSeconds(const Profile &profile, const Plan &plan) {
  double total = 0;
  for (const ProfileOp &op : profile.ops)
    total += op.fwdSeconds + op.bwdSeconds;
  double worst = 0;
  for (const StagePlan &stage : plan.stages) {
    double seconds = 0;
    for (int l = stage.firstLayer; l <= stage.lastLayer; ++l)
      seconds += total == 0
                     ? 1.0
                     : profile.ops[l].fwdSeconds + profile.ops[l].bwdSeconds;
    worst = std::max(worst, seconds);
  }
  return worst;
}

/// Runs the planner and checks it against the brute force on one instance.
void checkAgainstBruteForce(const Profile &profile, int numStages,
                            bool integral) {
  int n = static_cast<int>(profile.ops.size());
  PlanResult result = planBalanced(profile, numStages);
  ASSERT_TRUE(result.ok) << result.error;
  const Plan &plan = result.plan;
  ASSERT_EQ(validatePlan(plan, n), "");
  ASSERT_EQ(plan.numStages(), numStages);

  double tolerance = integral ? 0.0 : 1e-9;
  Objective best = bruteForce(profile, numStages, tolerance);
  double got = maxStageSeconds(profile, plan);
  if (integral)
    EXPECT_EQ(got, best.maxStage);
  else
    EXPECT_NEAR(got, best.maxStage, 1e-9 * std::max(1.0, best.maxStage));

  int64_t bytes = 0;
  for (int s = 0; s + 1 < numStages; ++s)
    bytes += oracleCutBytes(profile, plan.stages[s].lastLayer);
  EXPECT_EQ(bytes, best.bytes) << "tie-break on cut bytes is not optimal";
  EXPECT_EQ(planCutBytes(profile, plan), bytes);
}

} // namespace

//===----------------------------------------------------------------------===//
// planBalanced
//===----------------------------------------------------------------------===//

TEST(PlanBalancedTest, MatchesBruteForceWithTies) {
  // Integral costs in 0..4: many partitions share the optimal max, so the
  // cut-bytes tie-break decides; every tenth instance has no costs at all.
  std::mt19937 rng(20240601);
  for (int instance = 0; instance < 600; ++instance) {
    int n = 1 + static_cast<int>(rng() % 10);
    int p = 1 + static_cast<int>(rng() % n);
    bool allZero = instance % 10 == 0;
    Profile profile = randomProfile(rng, n, /*integral=*/true, allZero);
    SCOPED_TRACE("instance " + std::to_string(instance) +
                 " n=" + std::to_string(n) + " p=" + std::to_string(p));
    checkAgainstBruteForce(profile, p, /*integral=*/true);
    if (HasFatalFailure())
      return;
  }
}

TEST(PlanBalancedTest, MatchesBruteForceRealCosts) {
  std::mt19937 rng(7);
  for (int instance = 0; instance < 300; ++instance) {
    int n = 1 + static_cast<int>(rng() % 11);
    int p = 1 + static_cast<int>(rng() % n);
    Profile profile = randomProfile(rng, n, /*integral=*/false, false);
    SCOPED_TRACE("instance " + std::to_string(instance));
    checkAgainstBruteForce(profile, p, /*integral=*/false);
    if (HasFatalFailure())
      return;
  }
}

TEST(PlanBalancedTest, TieBreakIsNotLexicographicOnPrefixes) {
  // Times 4,1,1,5 into 3 stages: max 5 is reached by [4|1 1|5] and
  // [4 1|1|5]. A DP keeping only the lexicographically best prefix would
  // pick the first (prefix max 4 < 5) and pay the 100 bytes of op 0.
  Profile profile;
  double times[] = {4, 1, 1, 5};
  int64_t out[] = {100, 1, 10, 0};
  for (int i = 0; i < 4; ++i)
    profile.ops.push_back(
        {"l" + std::to_string(i), "Layer", times[i], 0, out[i], 0, 0, {}});
  PlanResult result = planBalanced(profile, 3);
  ASSERT_TRUE(result.ok) << result.error;
  ASSERT_EQ(result.plan.numStages(), 3);
  EXPECT_EQ(result.plan.stages[0].lastLayer, 1);
  EXPECT_EQ(result.plan.stages[1].lastLayer, 2);
  EXPECT_EQ(planCutBytes(profile, result.plan), 11);
}

TEST(PlanBalancedTest, FillsPlanFields) {
  Profile profile;
  profile.microbatch = 16;
  for (int i = 0; i < 6; ++i)
    profile.ops.push_back(
        {"l" + std::to_string(i), "Layer", 1, 2, 8, 0, 0, {}});
  PlanResult result = planBalanced(profile, 3);
  ASSERT_TRUE(result.ok) << result.error;
  const Plan &plan = result.plan;
  EXPECT_EQ(plan.algorithm, "balanced");
  EXPECT_EQ(plan.microbatchSize, 16);
  ASSERT_EQ(plan.numStages(), 3);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(plan.stages[s].firstLayer, 2 * s);
    EXPECT_EQ(plan.stages[s].lastLayer, 2 * s + 1);
    EXPECT_EQ(plan.stages[s].replicas, 1);
    EXPECT_EQ(plan.stages[s].devices, std::vector<int>{s});
  }
  EXPECT_EQ(stageSeconds(profile, plan.stages[0]), 6.0);
  EXPECT_EQ(plan.stageOfLayer(3), 1);
  EXPECT_EQ(plan.stageOfLayer(6), -1);
}

TEST(PlanBalancedTest, AllZeroCostsBalanceOpCount) {
  Profile profile;
  for (int i = 0; i < 7; ++i)
    profile.ops.push_back(
        {"l" + std::to_string(i), "Layer", 0, 0, 0, 0, 0, {}});
  PlanResult result = planBalanced(profile, 3);
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_EQ(validatePlan(result.plan, 7), "");
  // The largest stage has ceil(7 / 3) = 3 ops.
  int largest = 0;
  for (const StagePlan &stage : result.plan.stages)
    largest = std::max(largest, stage.lastLayer - stage.firstLayer + 1);
  EXPECT_EQ(largest, 3);
}

TEST(PlanBalancedTest, Errors) {
  Profile three;
  for (int i = 0; i < 3; ++i)
    three.ops.push_back({"l" + std::to_string(i), "Layer", 1, 1, 0, 0, 0, {}});

  PlanResult tooMany = planBalanced(three, 4);
  EXPECT_FALSE(tooMany.ok);
  EXPECT_EQ(tooMany.error, "cannot split 3 layers into 4 stages");

  PlanResult zero = planBalanced(three, 0);
  EXPECT_FALSE(zero.ok);
  EXPECT_NE(zero.error.find("at least 1"), std::string::npos) << zero.error;

  PlanResult empty = planBalanced(Profile(), 1);
  EXPECT_FALSE(empty.ok);
  EXPECT_NE(empty.error.find("empty profile"), std::string::npos)
      << empty.error;

  Profile negative = three;
  negative.ops[1].bwdSeconds = -1;
  PlanResult neg = planBalanced(negative, 2);
  EXPECT_FALSE(neg.ok);
  EXPECT_NE(neg.error.find("op 1 ('l1')"), std::string::npos) << neg.error;
  EXPECT_NE(neg.error.find("backward"), std::string::npos) << neg.error;

  Profile negativeFwd = three;
  negativeFwd.ops[2].fwdSeconds = -0.5;
  EXPECT_FALSE(planBalanced(negativeFwd, 2).ok);

  Profile negativeBytes = three;
  negativeBytes.ops[0].outBytes = -8;
  PlanResult nb = planBalanced(negativeBytes, 2);
  EXPECT_FALSE(nb.ok);
  EXPECT_NE(nb.error.find("negative size (out"), std::string::npos) << nb.error;

  PlanResult one = planBalanced(three, 1);
  ASSERT_TRUE(one.ok) << one.error;
  EXPECT_EQ(one.plan.stages[0].lastLayer, 2);
}

//===----------------------------------------------------------------------===//
// cutBytes
//===----------------------------------------------------------------------===//

namespace {

/// x -> f1 -> f2 -> add(f2, x) -> g(add); h(add, x). `x` skips over three
/// cuts to `add` and over five to `h`.
Profile residualProfile() {
  Profile p;
  p.ops.push_back({"x", "Input", 1, 1, 10, 0, 0, {}});
  p.ops.push_back({"f1", "Gemm", 1, 1, 20, 0, 0, {0}});
  p.ops.push_back({"f2", "Gemm", 1, 1, 30, 0, 0, {}});
  p.ops.push_back({"add", "Add", 1, 1, 40, 0, 0, {2, 0}});
  p.ops.push_back({"g", "Relu", 1, 1, 50, 0, 0, {3}});
  p.ops.push_back({"h", "Add", 1, 1, 60, 0, 0, {3, 0}});
  return p;
}

} // namespace

TEST(CutBytesTest, SkipConnectionCountsOncePerCut) {
  Profile p = residualProfile();
  EXPECT_EQ(cutBytes(p, 0, nullptr), 10);      // x
  EXPECT_EQ(cutBytes(p, 1, nullptr), 20 + 10); // f1, x
  EXPECT_EQ(cutBytes(p, 2, nullptr), 30 + 10); // f2, x
  EXPECT_EQ(cutBytes(p, 3, nullptr), 40 + 10); // add, x
  EXPECT_EQ(cutBytes(p, 4, nullptr), 40 + 10); // add, x (g is dead)
  EXPECT_EQ(cutBytes(p, 5, nullptr), 0);       // nothing after the end
  EXPECT_EQ(cutBytes(p, -1, nullptr), 0);
}

TEST(CutBytesTest, CountsOncePerConsumingStage) {
  Profile p = residualProfile();
  Plan plan;
  plan.stages = {{0, 1, 1, {0}, ""}, {2, 3, 1, {1}, ""}, {4, 5, 1, {2}, ""}};
  ASSERT_EQ(validatePlan(plan, 6), "");
  // Cut after 1: f1 to stage 1; x to stage 1 (add) and stage 2 (h).
  EXPECT_EQ(cutBytes(p, 1, &plan), 20 + 2 * 10);
  // Cut after 3: add to stage 2 (g and h: one stage); x to stage 2.
  EXPECT_EQ(cutBytes(p, 3, &plan), 40 + 10);
  // The tie-break objective counts each tensor once per boundary crossed.
  EXPECT_EQ(planCutBytes(p, plan), 30 + 50);

  Plan split = plan;
  split.stages = {{0, 3, 1, {0}, ""}, {4, 4, 1, {1}, ""}, {5, 5, 1, {2}, ""}};
  // add goes to g (stage 1) and h (stage 2); x to h.
  EXPECT_EQ(cutBytes(p, 3, &split), 2 * 40 + 10);
}

//===----------------------------------------------------------------------===//
// validatePlan
//===----------------------------------------------------------------------===//

namespace {

Plan goodPlan() {
  Plan plan;
  plan.algorithm = "test";
  plan.microbatches = 4;
  plan.stages = {{0, 2, 1, {0}, ""}, {3, 5, 2, {1, 2}, ""}, {6, 9, 1, {}, ""}};
  return plan;
}

void expectViolation(const Plan &plan, int numLayers,
                     const std::string &needle) {
  std::string error = validatePlan(plan, numLayers);
  EXPECT_NE(error, "") << "plan accepted, expected '" << needle << "'";
  EXPECT_NE(error.find(needle), std::string::npos)
      << "error '" << error << "' does not mention '" << needle << "'";
}

} // namespace

TEST(ValidatePlanTest, AcceptsGoodPlan) {
  EXPECT_EQ(validatePlan(goodPlan(), 10), "");
}

TEST(ValidatePlanTest, CatchesEachViolation) {
  Plan plan = goodPlan();
  expectViolation(plan, 0, "no layers");

  plan = goodPlan();
  plan.stages.clear();
  expectViolation(plan, 10, "no stages");

  plan = goodPlan();
  plan.stages[0].firstLayer = 1;
  expectViolation(plan, 10,
                  "stage 0 starts at layer 1 but must start at "
                  "layer 0");

  plan = goodPlan(); // gap: layer 3 in no stage
  plan.stages[1].firstLayer = 4;
  expectViolation(plan, 10,
                  "stage 1 starts at layer 4 but stage 0 ends at "
                  "layer 2");

  plan = goodPlan(); // overlap
  plan.stages[1].firstLayer = 2;
  expectViolation(plan, 10, "contiguous");

  plan = goodPlan(); // empty stage
  plan.stages[1].lastLayer = 2;
  expectViolation(plan, 10, "stage 1 is empty");

  plan = goodPlan(); // past the end
  plan.stages[2].lastLayer = 10;
  expectViolation(plan, 10,
                  "stage 2 ends at layer 10 but there are only 10 "
                  "layers (0..9)");

  plan = goodPlan(); // not covering
  plan.stages[2].lastLayer = 8;
  expectViolation(plan, 10, "layers 9..9 belong to no stage");

  plan = goodPlan();
  plan.stages[0].replicas = 0;
  plan.stages[0].devices.clear();
  expectViolation(plan, 10, "stage 0 has 0 replicas");

  plan = goodPlan();
  plan.stages[1].devices = {1};
  expectViolation(plan, 10, "stage 1 lists 1 devices for 2 replicas");

  plan = goodPlan();
  plan.stages[1].devices = {3, 3};
  expectViolation(plan, 10, "device 3 twice");

  plan = goodPlan();
  plan.stages[0].devices = {-1};
  expectViolation(plan, 10, "negative device");

  plan = goodPlan();
  plan.microbatches = 0;
  expectViolation(plan, 10, "microbatches must be at least 1");

  plan = goodPlan();
  plan.microbatchSize = 0;
  expectViolation(plan, 10, "microbatch size must be at least 1");

  plan = goodPlan();
  plan.chunks = 0;
  expectViolation(plan, 10, "chunks per device must be at least 1");

  plan = goodPlan();
  plan.predicted.stageMemoryBytes = {1, 2};
  expectViolation(plan, 10, "stage_memory_bytes has 2 entries for 3 stages");
}

//===----------------------------------------------------------------------===//
// plan.json
//===----------------------------------------------------------------------===//

namespace {

Plan richPlan() {
  Plan plan = goodPlan();
  plan.algorithm = "auto";
  plan.schedule = "gpipe";
  plan.microbatches = 8;
  plan.microbatchSize = 32;
  plan.chunks = 1;
  plan.predicted.iterationSeconds = 0.1;
  plan.predicted.samplesPerSecond = 2560.5;
  plan.predicted.bubbleFraction = 3.0 / 8.0;
  plan.predicted.stageMemoryBytes = {1000, 2000, 3000000000LL};
  Plan candidate = goodPlan();
  candidate.algorithm = "pipedream";
  candidate.predicted.iterationSeconds = 0.2;
  plan.candidates.push_back(candidate);
  return plan;
}

void expectSamePlan(const Plan &a, const Plan &b) {
  EXPECT_EQ(a.algorithm, b.algorithm);
  EXPECT_EQ(a.schedule, b.schedule);
  EXPECT_EQ(a.microbatches, b.microbatches);
  EXPECT_EQ(a.microbatchSize, b.microbatchSize);
  EXPECT_EQ(a.chunks, b.chunks);
  ASSERT_EQ(a.numStages(), b.numStages());
  for (int s = 0; s < a.numStages(); ++s) {
    EXPECT_EQ(a.stages[s].firstLayer, b.stages[s].firstLayer);
    EXPECT_EQ(a.stages[s].lastLayer, b.stages[s].lastLayer);
    EXPECT_EQ(a.stages[s].replicas, b.stages[s].replicas);
    EXPECT_EQ(a.stages[s].devices, b.stages[s].devices);
  }
  EXPECT_EQ(a.predicted.iterationSeconds, b.predicted.iterationSeconds);
  EXPECT_EQ(a.predicted.samplesPerSecond, b.predicted.samplesPerSecond);
  EXPECT_EQ(a.predicted.bubbleFraction, b.predicted.bubbleFraction);
  EXPECT_EQ(a.predicted.stageMemoryBytes, b.predicted.stageMemoryBytes);
  ASSERT_EQ(a.candidates.size(), b.candidates.size());
  for (size_t i = 0; i < a.candidates.size(); ++i)
    expectSamePlan(a.candidates[i], b.candidates[i]);
}

void expectPlanRejected(const std::string &text, const std::string &needle) {
  PlanResult result = planFromJson(text);
  EXPECT_FALSE(result.ok) << "accepted: " << text;
  EXPECT_NE(result.error.find(needle), std::string::npos)
      << "error '" << result.error << "' does not mention '" << needle << "'";
}

} // namespace

TEST(PlanJsonTest, RoundTrip) {
  Plan plan = richPlan();
  std::string text = planToJson(plan);
  for (const char *key :
       {"\"format\": \"pipec.plan/1\"", "\"algorithm\"", "\"schedule\"",
        "\"microbatches\"", "\"microbatch\"", "\"chunks\"", "\"stages\"",
        "\"first_op\"", "\"last_op\"", "\"replicas\"", "\"devices\"",
        "\"predicted\"", "\"iteration_s\"", "\"samples_per_s\"",
        "\"bubble_fraction\"", "\"stage_memory_bytes\"", "\"candidates\""})
    EXPECT_NE(text.find(key), std::string::npos) << key << "\n" << text;
  PlanResult back = planFromJson(text);
  ASSERT_TRUE(back.ok) << back.error << "\n" << text;
  expectSamePlan(plan, back.plan);
  EXPECT_EQ(planToJson(back.plan), text);
}

TEST(PlanJsonTest, BalancedPlanRoundTripsWithEmptyCandidates) {
  Profile profile;
  for (int i = 0; i < 5; ++i)
    profile.ops.push_back(
        {"l" + std::to_string(i), "Layer", 1.0 + i, 0.5, 4, 0, 0, {}});
  PlanResult planned = planBalanced(profile, 2);
  ASSERT_TRUE(planned.ok) << planned.error;
  std::string text = planToJson(planned.plan);
  EXPECT_NE(text.find("\"candidates\": []"), std::string::npos) << text;
  PlanResult back = planFromJson(text);
  ASSERT_TRUE(back.ok) << back.error;
  expectSamePlan(planned.plan, back.plan);
}

TEST(PlanJsonTest, AcceptsMinimalDocument) {
  PlanResult result = planFromJson(R"({
    "format": "pipec.plan/1", "algorithm": "hand", "schedule": "1f1b-flush",
    "microbatches": 4, "microbatch": 2,
    "stages": [{"first_op": 0, "last_op": 3}, {"first_op": 4, "last_op": 4}]
  })");
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_EQ(result.plan.chunks, 1);
  EXPECT_EQ(result.plan.stages[1].replicas, 1);
  EXPECT_TRUE(result.plan.stages[1].devices.empty());
  EXPECT_TRUE(result.plan.candidates.empty());
}

TEST(PlanJsonTest, Rejections) {
  const std::string head =
      R"("algorithm": "x", "schedule": "gpipe", "microbatches": 2, "microbatch": 1)";
  auto doc = [&](const std::string &rest) {
    return R"({"format": "pipec.plan/1", )" + head + rest + "}";
  };
  const std::string stages =
      R"(, "stages": [{"first_op": 0, "last_op": 1, "replicas": 1, "devices": [0]}])";

  ASSERT_TRUE(planFromJson(doc(stages)).ok) << planFromJson(doc(stages)).error;
  expectPlanRejected("nope", "not valid JSON");
  expectPlanRejected(R"({"algorithm": "x"})", "missing \"format\"");
  expectPlanRejected(R"({"format": "pipec.plan/2"})",
                     "unsupported format \"pipec.plan/2\"");
  expectPlanRejected(R"({"format": "pipec.plan/1", "schedule": "gpipe"})",
                     "plan: missing 'algorithm'");
  expectPlanRejected(doc(""), "'stages' must be a non-empty list");
  expectPlanRejected(doc(R"(, "stages": [])"), "non-empty list");
  expectPlanRejected(
      doc(R"(, "stages": [{"first_op": 0, "last_op": 1}, {"first_op": 3, "last_op": 4}])"),
      "stage 1 starts at layer 3 but stage 0 ends at layer 1");
  expectPlanRejected(
      doc(R"(, "stages": [{"first_op": 0, "last_op": 1, "replicas": 0}])"),
      "plan.stages[0]: 'replicas' must be at least 1");
  expectPlanRejected(doc(R"(, "stages": [{"first_op": -1, "last_op": 1}])"),
                     "'first_op' must be at least 0");
  expectPlanRejected(doc(R"(, "stages": [{"last_op": 1}])"),
                     "plan.stages[0]: missing 'first_op'");
  expectPlanRejected(doc(R"(, "stages": [{"first_op": 0, "last_op": "1"}])"),
                     "'last_op' must be an integer");
  expectPlanRejected(
      doc(R"(, "stages": [{"first_op": 0, "last_op": 1, "devices": 3}])"),
      "'devices' must be a list");
  expectPlanRejected(
      doc(R"(, "stages": [{"first_op": 0, "last_op": 1, "replicas": 2, "devices": [0]}])"),
      "lists 1 devices for 2 replicas");
  expectPlanRejected(doc(stages + R"(, "predicted": {"iteration_s": -1})"),
                     "'iteration_s' must be a non-negative number");
  expectPlanRejected(
      doc(stages + R"(, "predicted": {"stage_memory_bytes": [1, 2]})"),
      "stage_memory_bytes has 2 entries for 1 stages");
  expectPlanRejected(doc(stages + R"(, "candidates": 3)"),
                     "'candidates' must be a list");
  expectPlanRejected(doc(stages + R"(, "candidates": [{"algorithm": "y"}])"),
                     "plan.candidates[0]: missing 'schedule'");
  expectPlanRejected(R"({"format": "pipec.plan/1", "algorithm": "x",
      "schedule": "gpipe", "microbatches": 0, "microbatch": 1})",
                     "'microbatches' must be at least 1");
}
