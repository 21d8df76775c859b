//===- interleaved_test.cpp - Megatron's interleaved planner, §4 formulas -===//
//
// The chunk-to-layer map of papers/thesis.md §4.2 (L = 16, p = 4, v = 2),
// uneven layer counts balanced by cost, the divisibility rules, the
// FLOP/parameter formulas of §4.6 (GPT-3 175B: 174.6 B parameters), the
// planner's model against the simulator on uniform stages, and validity of
// every plan.
//
//===----------------------------------------------------------------------===//

#include "pipec/Planners.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

using namespace pipec;

namespace {

Profile uniformProfile(int layers, double fwd = 1e-3) {
  Profile p;
  p.microbatch = 1;
  for (int i = 0; i < layers; ++i) {
    ProfileOp op;
    op.name = "l" + std::to_string(i);
    op.op = "Gemm";
    op.fwdSeconds = fwd;
    op.bwdSeconds = 2 * fwd;
    op.paramBytes = 1000;
    op.savedBytes = 1000;
    p.ops.push_back(op);
  }
  return p;
}

/// Layers (1-based, as in the thesis) held by `device` of `plan`.
std::set<int> layersOnDevice(const Plan &plan, int device) {
  std::set<int> layers;
  for (const StagePlan &s : plan.stages)
    if (std::find(s.devices.begin(), s.devices.end(), device) !=
        s.devices.end())
      for (int l = s.firstLayer; l <= s.lastLayer; ++l)
        layers.insert(l + 1);
  return layers;
}

//===----------------------------------------------------------------------===//
// Chunk map (§4.2)
//===----------------------------------------------------------------------===//

TEST(InterleavedChunks, MegatronMap) {
  // Virtual stage c·p + r holds layers (c·p+r)·L/(p·v) + 1 ..
  // (c·p+r+1)·L/(p·v).
  auto ranges = megatronChunkLayers(16, 4, 2);
  ASSERT_EQ(ranges.size(), 8u);
  auto device = [&](int r) {
    std::set<int> layers;
    for (int c = 0; c < 2; ++c)
      for (int l = ranges[c * 4 + r].first; l <= ranges[c * 4 + r].second; ++l)
        layers.insert(l + 1);
    return layers;
  };
  EXPECT_EQ(device(0), (std::set<int>{1, 2, 9, 10}));
  EXPECT_EQ(device(1), (std::set<int>{3, 4, 11, 12}));
  EXPECT_EQ(device(3), (std::set<int>{7, 8, 15, 16}));
  EXPECT_TRUE(megatronChunkLayers(15, 4, 2).empty()); // L % (p·v) != 0
}

TEST(InterleavedPlanner, MegatronExample) {
  Profile profile = uniformProfile(16);
  Topology topology = Topology::flat(4, 1e10, 1e-6);
  PlannerOptions options;
  options.stages = 4;
  options.chunks = 2;
  options.microbatches = 8;
  PlanResult r = planInterleaved(profile, topology, options);
  ASSERT_TRUE(r.ok) << r.error;
  const Plan &plan = r.plan;
  EXPECT_EQ(validatePlan(plan, 16), "");
  EXPECT_EQ(plan.schedule, "interleaved");
  EXPECT_EQ(plan.algorithm, "interleaved");
  EXPECT_EQ(plan.chunks, 2);
  EXPECT_EQ(plan.microbatches, 8);
  ASSERT_EQ(plan.numStages(), 8); // the p·v virtual stages in order
  auto ranges = megatronChunkLayers(16, 4, 2);
  for (int q = 0; q < 8; ++q) {
    EXPECT_EQ(plan.stages[q].firstLayer, ranges[q].first);
    EXPECT_EQ(plan.stages[q].lastLayer, ranges[q].second);
    EXPECT_EQ(plan.stages[q].devices, std::vector<int>{q % 4});
  }
  EXPECT_EQ(layersOnDevice(plan, 0), (std::set<int>{1, 2, 9, 10}));
  EXPECT_EQ(layersOnDevice(plan, 1), (std::set<int>{3, 4, 11, 12}));
  // Bubble (1/v)·(p-1)/m as a share of the iteration: 3/16 of ideal.
  EXPECT_NEAR(plan.predicted.bubbleFraction, 1.5 / (8 + 1.5), 1e-12);
}

TEST(InterleavedPlanner, UnevenLayersBalancedByCost) {
  // 10 layers on p = 2, v = 2: 4 chunks of uneven length; each device gets
  // 5 layers' worth of work.
  Profile profile = uniformProfile(10);
  PlannerOptions options;
  options.stages = 2;
  options.chunks = 2;
  options.microbatches = 4;
  PlanResult r = planInterleaved(profile, Topology::flat(2, 1e10, 0), options);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(validatePlan(r.plan, 10), "");
  ASSERT_EQ(r.plan.numStages(), 4);
  EXPECT_EQ(layersOnDevice(r.plan, 0).size(), 5u);
  EXPECT_EQ(layersOnDevice(r.plan, 1).size(), 5u);
  // A heavy layer: chunks follow the cost, not the count.
  Profile skewed = uniformProfile(8);
  skewed.ops[0].fwdSeconds = 4e-3;
  skewed.ops[0].bwdSeconds = 8e-3;
  PlanResult s = planInterleaved(skewed, Topology::flat(2, 1e10, 0), options);
  ASSERT_TRUE(s.ok) << s.error;
  EXPECT_EQ(s.plan.stages[0].firstLayer, 0);
  EXPECT_EQ(s.plan.stages[0].lastLayer, 0); // the heavy layer alone
  EXPECT_EQ(validatePlan(s.plan, 8), "");
}

TEST(InterleavedPlanner, PredictionMatchesSimulatorOnUniformStages) {
  // No communication, equal chunks: (m + (p-1)/v)·(t_f + t_b) (§4.1).
  for (auto [p, v, m] : {std::tuple{4, 2, 8}, std::tuple{4, 2, 4},
                         std::tuple{2, 3, 6}, std::tuple{4, 4, 16}}) {
    Profile profile = uniformProfile(p * v * 2);
    for (ProfileOp &op : profile.ops)
      op.outBytes = 0;
    Topology topology = Topology::flat(p, 1e10, 0);
    PlannerOptions options;
    options.stages = p;
    options.chunks = v;
    options.microbatches = m;
    PlanResult r = planInterleaved(profile, topology, options);
    ASSERT_TRUE(r.ok) << r.error;
    double perDevice = 2 * v * 3e-3; // t_f + t_b of one device's layers
    EXPECT_NEAR(r.plan.predicted.iterationSeconds,
                (m + (p - 1.0) / v) * perDevice, 1e-12);
    SimResult sim = simulatePlan(profile, topology, r.plan);
    ASSERT_TRUE(sim.ok) << sim.error;
    EXPECT_NEAR(sim.iterationSeconds, r.plan.predicted.iterationSeconds, 1e-9);
  }
}

TEST(InterleavedPlanner, RandomPlansAreValid) {
  std::mt19937 rng(31);
  std::uniform_real_distribution<double> time(1e-4, 3e-3);
  int planned = 0;
  for (int it = 0; it < 60; ++it) {
    int layers = 1 + static_cast<int>(rng() % 16);
    Profile profile;
    for (int l = 0; l < layers; ++l) {
      ProfileOp op;
      op.name = "l" + std::to_string(l);
      op.fwdSeconds = time(rng);
      op.bwdSeconds = 2 * op.fwdSeconds;
      op.paramBytes = static_cast<int64_t>(rng() % 1000000);
      op.outBytes = static_cast<int64_t>(rng() % 100000);
      op.savedBytes = static_cast<int64_t>(rng() % 300000);
      profile.ops.push_back(op);
    }
    int devices = 1 + static_cast<int>(rng() % 8);
    int64_t memory = rng() % 3 ? int64_t(1000000) * (1 + rng() % 10) : 0;
    Topology topology = Topology::flat(devices, 1e10, 1e-6, memory);
    PlannerOptions options;
    if (rng() % 2)
      options.globalBatch = 4 * (1 + rng() % 16);
    PlanResult r = planInterleaved(profile, topology, options);
    if (!r.ok) {
      EXPECT_NE(r.error.find("interleaved"), std::string::npos);
      continue;
    }
    ++planned;
    const Plan &plan = r.plan;
    EXPECT_EQ(validatePlan(plan, layers), "");
    int v = plan.chunks, q = plan.numStages();
    ASSERT_EQ(q % v, 0);
    int p = q / v;
    int d = plan.stages[0].replicas;
    EXPECT_EQ(plan.microbatches % (p * d), 0); // m % p == 0 per pipeline
    EXPECT_LE(p * v, layers);                  // v <= L/p
    std::set<int> used;
    for (int s = 0; s < q; ++s) {
      EXPECT_EQ(plan.stages[s].devices, plan.stages[s % p].devices);
      used.insert(plan.stages[s].devices.begin(), plan.stages[s].devices.end());
    }
    EXPECT_LE(static_cast<int>(used.size()), devices);
    if (options.globalBatch > 0) {
      EXPECT_LE(plan.microbatches * plan.microbatchSize, options.globalBatch);
    }
    SimResult sim = simulatePlan(profile, topology, plan);
    EXPECT_TRUE(sim.ok) << sim.error;
  }
  EXPECT_GT(planned, 30);
}

//===----------------------------------------------------------------------===//
// Divisibility rules and other errors
//===----------------------------------------------------------------------===//

TEST(InterleavedPlanner, DivisibilityErrors) {
  Profile profile = uniformProfile(16);
  Topology topology = Topology::flat(4, 1e10, 1e-6);
  PlannerOptions options;
  options.stages = 4;
  options.chunks = 2;
  options.microbatches = 6; // 6 % 4 != 0
  PlanResult r = planInterleaved(profile, topology, options);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.error.find("multiple of the pipeline depth"), std::string::npos)
      << r.error;
  options.microbatches = 8;
  options.chunks = 5; // p·v = 20 > 16 layers
  r = planInterleaved(profile, topology, options);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.error.find("more chunks than layers"), std::string::npos)
      << r.error;
  EXPECT_NE(r.error.find("L/p = 4"), std::string::npos) << r.error;
  // Chunks alone: 20 chunks per device can never fit 16 layers.
  PlannerOptions chunksOnly;
  chunksOnly.chunks = 20;
  r = planInterleaved(profile, topology, chunksOnly);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.error.find("more chunks"), std::string::npos) << r.error;
  // More stages than layers.
  PlannerOptions deep;
  deep.stages = 4;
  r = planInterleaved(uniformProfile(3), topology, deep);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.error.find("layers"), std::string::npos) << r.error;
  // Searching p with a fixed m only considers depths that divide it.
  PlannerOptions m6;
  m6.microbatches = 6;
  m6.allowFewerDevices = true;
  PlanResult ok = planInterleaved(profile, topology, m6);
  ASSERT_TRUE(ok.ok) << ok.error;
  int p = ok.plan.numStages() / ok.plan.chunks;
  EXPECT_EQ(6 % p, 0);
  // Memory too small: say what the best needs.
  Topology tiny = Topology::flat(4, 1e10, 1e-6, 100);
  r = planInterleaved(profile, tiny, {});
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.error.find("needs"), std::string::npos) << r.error;
  // Wrong schedule.
  PlannerOptions flush;
  flush.schedule = "1f1b-flush";
  EXPECT_FALSE(planInterleaved(profile, topology, flush).ok);
}

//===----------------------------------------------------------------------===//
// FLOP and parameter formulas (§4.6)
//===----------------------------------------------------------------------===//

TEST(InterleavedFormulas, Gpt3Parameters) {
  // l = 96, h = 12288, s = 2048, V = 51200: 174.6 B parameters (Table 4.2).
  TransformerShape gpt3{96, 12288, 2048, 51200};
  double params = transformerParameters(gpt3);
  EXPECT_NEAR(params / 1e9, 174.6, 0.05);
  // The 530 B model of Table 4.2: l = 105, h = 20480.
  TransformerShape mt530{105, 20480, 2048, 51200};
  EXPECT_NEAR(transformerParameters(mt530) / 1e9, 529.6, 0.1);
}

TEST(InterleavedFormulas, IterationFlops) {
  TransformerShape gpt3{96, 12288, 2048, 51200};
  double B = 1536, s = 2048, h = 12288, l = 96, V = 51200;
  // Eq. 4.2 = per layer 96·B·s·h²·(1 + s/(6h)), times l, plus 6·B·s·h·V.
  double perLayer = 96 * B * s * h * h * (1 + s / (6 * h));
  EXPECT_NEAR(transformerIterationFlops(gpt3, B) /
                  (l * perLayer + 6 * B * s * h * V),
              1, 1e-12);
  // Without recomputation 3 forward passes' worth instead of 4 in the layers.
  double noRecompute = transformerIterationFlops(gpt3, B, false);
  EXPECT_NEAR(noRecompute / (0.75 * l * perLayer + 6 * B * s * h * V), 1,
              1e-12);
  EXPECT_LT(noRecompute, transformerIterationFlops(gpt3, B));
}

TEST(InterleavedFormulas, TrainingTime) {
  // Eq. 4.4: GPT-3 on 1024 GPUs at 140 TFLOP/s for 300 B tokens ≈ 34 days;
  // 1 T parameters on 3072 GPUs at 163 TFLOP/s for 450 B tokens ≈ 84 days.
  double day = 86400;
  EXPECT_NEAR(transformerTrainingSeconds(300e9, 175e9, 1024, 140e12) / day, 34,
              0.5);
  EXPECT_NEAR(transformerTrainingSeconds(450e9, 1e12, 3072, 163e12) / day, 84,
              1.0);
}

} // namespace
