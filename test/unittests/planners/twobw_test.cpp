//===- twobw_test.cpp - PipeDream-2BW: memory model and planner -----------===//
//
// The memory formulas of papers/thesis.md §3.4, the throughput model of
// §3.5 recomputed by hand for small configurations, Algorithm 1's search
// space (d·p <= N: the "N/w" misprint read as N/d), the batch rules
// (m = p·g, b·d·m <= B), the linear microbatch scaling, recompute, and
// errors.
//
//===----------------------------------------------------------------------===//

#include "pipec/Planners.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

using namespace pipec;

namespace {

//===----------------------------------------------------------------------===//
// §3.4 memory formulas
//===----------------------------------------------------------------------===//

TEST(TwoBWMemory, Formulas) {
  // |W| = 8 GB, |A_total(b)| = 4 GB, |A_input(b)| = 0.1 GB, p = 4, m = 16.
  const double W = 8e9, A = 4e9, Ain = 1e8;
  const int p = 4, m = 16;
  // 2BW: 2|W|/p + p·|A_total(b)|/p + p·|A_input(b)|
  EXPECT_DOUBLE_EQ(twoBWStageMemory(W / p, A / p, Ain, p, false),
                   2 * W / p + p * A / p + p * Ain);
  EXPECT_DOUBLE_EQ(twoBWStageMemory(W / p, A / p, Ain, p, false), 8.4e9);
  // 2BW + recompute: 2|W|/p + |A_total(b)|/p + p·|A_input(b)|
  EXPECT_DOUBLE_EQ(twoBWStageMemory(W / p, A / p, Ain, p, true),
                   2 * W / p + A / p + p * Ain);
  EXPECT_DOUBLE_EQ(twoBWStageMemory(W / p, A / p, Ain, p, true), 5.4e9);
  // GPipe (recompute): |W|/p + |A_total(b)|/p + m·|A_input(b)|
  EXPECT_DOUBLE_EQ(gpipeStageMemory(W / p, A / p, Ain, m),
                   W / p + A / p + m * Ain);
  EXPECT_DOUBLE_EQ(gpipeStageMemory(W / p, A / p, Ain, m), 4.6e9);
}

TEST(TwoBWMemory, Relations) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> size(0, 1e9);
  for (int i = 0; i < 500; ++i) {
    double w = size(rng), a = size(rng), in = size(rng);
    int p = 1 + static_cast<int>(rng() % 16);
    int m = p * (1 + static_cast<int>(rng() % 8));
    // Recompute never needs more.
    EXPECT_LE(twoBWStageMemory(w, a, in, p, true),
              twoBWStageMemory(w, a, in, p, false));
    // 2BW keeps one more weight version than a flushing schedule with the
    // same in-flight inputs: the difference is |W|/p.
    EXPECT_NEAR(twoBWStageMemory(w, a, in, p, true) -
                    gpipeStageMemory(w, a, in, p),
                w, 1e-6 * w + 1e-3);
    // GPipe's input term grows with m, 2BW's with p.
    EXPECT_NEAR(gpipeStageMemory(w, a, in, m + 1) -
                    gpipeStageMemory(w, a, in, m),
                in, 1e-6 * in + 1e-3);
    EXPECT_NEAR(twoBWStageMemory(w, a, in, p + 1, true) -
                    twoBWStageMemory(w, a, in, p, true),
                in, 1e-6 * in + 1e-3);
  }
}

//===----------------------------------------------------------------------===//
// Search and throughput model (§3.5)
//===----------------------------------------------------------------------===//

/// L uniform layers: fwd 1 ms, bwd 2 ms, 1 MB weights, 1 MB out, 2 MB saved
/// at microbatch b0.
Profile uniformProfile(int layers, int64_t b0 = 1) {
  Profile p;
  p.microbatch = b0;
  for (int i = 0; i < layers; ++i) {
    ProfileOp op;
    op.name = "l" + std::to_string(i);
    op.op = "Gemm";
    op.fwdSeconds = 1e-3;
    op.bwdSeconds = 2e-3;
    op.paramBytes = 1000000;
    op.outBytes = 1000000;
    op.savedBytes = 2000000;
    p.ops.push_back(op);
  }
  return p;
}

const TwoBWConfig *findConfig(const TwoBWSearchResult &r, int d, int p) {
  for (const TwoBWConfig &c : r.configs)
    if (c.width == d && c.depth == p)
      return &c;
  return nullptr;
}

TEST(TwoBWSearch, ThroughputModelByHand) {
  Profile profile = uniformProfile(4);
  Topology topology = Topology::flat(4, 1e9, 0);
  PlannerOptions options;
  options.globalBatch = 16;
  options.microbatchSize = 1;
  TwoBWSearchResult r = searchTwoBW(profile, topology, options, {false});
  ASSERT_TRUE(r.ok) << r.error;
  // (d, p) = (1, 4): g = B/(b·d·p) = 4, m = 16; an inner stage computes
  // 3 ms and sends/receives 1 MB both ways on both sides: 4 × 1 ms.
  const TwoBWConfig *c14 = findConfig(r, 1, 4);
  ASSERT_NE(c14, nullptr);
  EXPECT_EQ(c14->microbatches, 16);
  EXPECT_EQ(c14->globalBatch, 16);
  EXPECT_NEAR(c14->seconds, 3e-3 + 4e-3, 1e-12);
  EXPECT_NEAR(c14->samplesPerSecond, 1 / 7e-3, 1e-6);
  // (4, 1): no pipeline transfers (I(p > 1) = 0); the 4 MB all-reduce among
  // 4 replicas is amortised over m = 4 microbatches.
  const TwoBWConfig *c41 = findConfig(r, 4, 1);
  ASSERT_NE(c41, nullptr);
  EXPECT_EQ(c41->microbatches, 4);
  double allreduce = topology.allreduceSeconds(4000000, {0, 1, 2, 3});
  EXPECT_NEAR(c41->seconds, std::max(12e-3, allreduce / 4), 1e-12);
  EXPECT_NEAR(c41->samplesPerSecond, 4 / c41->seconds, 1e-6);
  // (2, 2): stage i has 2 replicas on devices 2i, 2i+1; m = p·g = 2·4.
  const TwoBWConfig *c22 = findConfig(r, 2, 2);
  ASSERT_NE(c22, nullptr);
  EXPECT_EQ(c22->microbatches, 8);
  double ar2 = topology.allreduceSeconds(2000000, {0, 1});
  EXPECT_NEAR(c22->seconds, std::max(6e-3 + 2e-3, ar2 / 8), 1e-12);
  // With d = 1 there is no all-reduce term: (1, 1) is the whole model.
  const TwoBWConfig *c11 = findConfig(r, 1, 1);
  ASSERT_NE(c11, nullptr);
  EXPECT_NEAR(c11->seconds, 12e-3, 1e-12);
  // The best is pure data parallelism here.
  EXPECT_EQ(r.best.width, 4);
  EXPECT_EQ(r.best.depth, 1);
}

TEST(TwoBWSearch, SearchSpaceIsDTimesPAtMostN) {
  // Algorithm 1 loops p = 1 .. N/d (the printed N/w is a misprint).
  Profile profile = uniformProfile(8);
  Topology topology = Topology::flat(6, 1e10, 1e-6);
  TwoBWSearchResult r = searchTwoBW(profile, topology, {}, {false});
  ASSERT_TRUE(r.ok);
  std::set<std::pair<int, int>> seen;
  for (const TwoBWConfig &c : r.configs) {
    EXPECT_LE(c.width * c.depth, 6);
    seen.insert({c.width, c.depth});
  }
  std::set<std::pair<int, int>> expected;
  for (int d = 1; d <= 6; ++d)
    for (int p = 1; p <= 6 / d; ++p)
      expected.insert({d, p});
  EXPECT_EQ(seen, expected);
  // Without fewer devices, only d·p = N.
  PlannerOptions all;
  all.allowFewerDevices = false;
  TwoBWSearchResult exact = searchTwoBW(profile, topology, all, {false});
  ASSERT_TRUE(exact.ok);
  for (const TwoBWConfig &c : exact.configs)
    EXPECT_EQ(c.width * c.depth, 6);
  EXPECT_EQ(exact.configs.size(), 4u); // (1,6) (2,3) (3,2) (6,1)
}

TEST(TwoBWSearch, RecomputeMultipliesComputeByCExtra) {
  // c_extra = (2 t_f + t_b)/(t_f + t_b) = 4/3 when t_b = 2 t_f.
  Profile profile = uniformProfile(4);
  Topology topology = Topology::flat(1, 1e9, 0);
  PlannerOptions options;
  options.microbatchSize = 1;
  TwoBWSearchResult plain = searchTwoBW(profile, topology, options, {false});
  TwoBWSearchResult recompute = searchTwoBW(profile, topology, options, {true});
  ASSERT_TRUE(plain.ok && recompute.ok);
  EXPECT_NEAR(recompute.best.seconds / plain.best.seconds, 4.0 / 3, 1e-12);
  EXPECT_TRUE(recompute.best.recompute);
}

TEST(TwoBWSearch, MicrobatchScalesTimesAndActivationsLinearly) {
  // Profile measured at b0 = 2; at b = 4 times and activations double,
  // weights do not.
  Profile profile = uniformProfile(2, 2);
  Topology topology = Topology::flat(2, 1e9, 0);
  PlannerOptions options;
  options.stages = 2;
  options.allowFewerDevices = false;
  options.microbatchSize = 2;
  TwoBWSearchResult at2 = searchTwoBW(profile, topology, options, {false});
  options.microbatchSize = 4;
  TwoBWSearchResult at4 = searchTwoBW(profile, topology, options, {false});
  ASSERT_TRUE(at2.ok && at4.ok);
  // Stage 0: 2|W|/p + p·A + p·A_in with A = 2 MB·b/b0, no input, plus the
  // gradient accumulator |W|/p.
  EXPECT_DOUBLE_EQ(at2.best.stageMemoryBytes[0], 3 * 1e6 + 2 * 2e6);
  EXPECT_DOUBLE_EQ(at4.best.stageMemoryBytes[0], 3 * 1e6 + 2 * 4e6);
  // Stage 1 also stashes p inputs of 1 MB·b/b0.
  EXPECT_DOUBLE_EQ(at4.best.stageMemoryBytes[1], 3 * 1e6 + 2 * 4e6 + 2 * 2e6);
  // The optimizer state adds factor·|W|/p.
  options.sim.optimizerStateFactor = 2;
  TwoBWSearchResult adam = searchTwoBW(profile, topology, options, {false});
  ASSERT_TRUE(adam.ok);
  EXPECT_DOUBLE_EQ(adam.best.stageMemoryBytes[0], 5 * 1e6 + 2 * 4e6);
  EXPECT_NEAR(at4.best.seconds, 2 * at2.best.seconds, 1e-12);
  EXPECT_NEAR(at4.best.samplesPerSecond, at2.best.samplesPerSecond, 1e-6);
}

//===----------------------------------------------------------------------===//
// The planner
//===----------------------------------------------------------------------===//

TEST(TwoBWPlanner, PlansObeyTheRules) {
  std::mt19937 rng(23);
  std::uniform_real_distribution<double> time(1e-4, 3e-3);
  int planned = 0;
  for (int it = 0; it < 60; ++it) {
    Profile profile;
    profile.microbatch = 1 + static_cast<int64_t>(rng() % 4);
    int layers = 1 + static_cast<int>(rng() % 10);
    for (int l = 0; l < layers; ++l) {
      ProfileOp op;
      op.name = "l" + std::to_string(l);
      op.fwdSeconds = time(rng);
      op.bwdSeconds = 2 * op.fwdSeconds;
      op.paramBytes = static_cast<int64_t>(rng() % 4000000);
      op.outBytes = static_cast<int64_t>(rng() % 400000);
      op.savedBytes = static_cast<int64_t>(rng() % 800000);
      profile.ops.push_back(op);
    }
    int devices = 1 + static_cast<int>(rng() % 8);
    int64_t memory = rng() % 3 ? int64_t(4000000) * (1 + rng() % 8) : 0;
    Topology topology = Topology::flat(devices, 1e10, 1e-6, memory);
    PlannerOptions options;
    int64_t batch = rng() % 2 ? 8 * (1 + rng() % 16) : 0;
    options.globalBatch = batch;
    PlanResult r = planTwoBW(profile, topology, options);
    if (!r.ok) {
      EXPECT_NE(r.error.find("twobw"), std::string::npos);
      continue;
    }
    ++planned;
    const Plan &plan = r.plan;
    EXPECT_EQ(validatePlan(plan, layers), "");
    EXPECT_EQ(plan.schedule, "2bw");
    EXPECT_EQ(plan.algorithm, "twobw");
    int p = plan.numStages(), d = plan.stages[0].replicas;
    EXPECT_LE(p * d, devices);
    std::set<int> used;
    for (const StagePlan &s : plan.stages) {
      EXPECT_EQ(s.replicas, d); // equi-replicated parallel pipelines
      used.insert(s.devices.begin(), s.devices.end());
    }
    EXPECT_EQ(static_cast<int>(used.size()), p * d);
    // plan.microbatches counts the d pipelines' m = p·g each.
    EXPECT_EQ(plan.microbatches % (p * d), 0);
    EXPECT_GE(plan.microbatches, p * d);
    if (batch > 0) {
      EXPECT_LE(plan.microbatchSize * plan.microbatches, batch);
    }
    for (int64_t bytes : plan.predicted.stageMemoryBytes) {
      if (memory > 0) {
        EXPECT_LE(bytes, memory);
      }
    }
    EXPECT_GT(plan.predicted.samplesPerSecond, 0);
    SimResult sim = simulatePlan(profile, topology, plan);
    EXPECT_TRUE(sim.ok) << sim.error;
  }
  EXPECT_GT(planned, 30);
}

TEST(TwoBWPlanner, TightMemoryForcesADeeperPipeline) {
  // 8 layers of 1 MB weights: one device would need 3 × 8 MB (two versions
  // and a gradient).
  Profile profile = uniformProfile(8);
  for (ProfileOp &op : profile.ops)
    op.savedBytes = op.outBytes = 1000;
  Topology roomy = Topology::flat(4, 1e10, 1e-6, 100000000);
  Topology tight = Topology::flat(4, 1e10, 1e-6, 7000000);
  PlanResult a = planTwoBW(profile, roomy, {});
  PlanResult b = planTwoBW(profile, tight, {});
  ASSERT_TRUE(a.ok && b.ok) << a.error << b.error;
  EXPECT_EQ(a.plan.numStages(), 1); // data parallel wins without a limit
  EXPECT_GE(b.plan.numStages(), 4); // 3 × 8 MB / p <= 7 MB
}

TEST(TwoBWPlanner, Errors) {
  Profile profile = uniformProfile(4);
  // Memory too small for any configuration: say what the best needs.
  Topology tiny = Topology::flat(2, 1e10, 1e-6, 1000);
  PlanResult r = planTwoBW(profile, tiny, {});
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.error.find("needs"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("MiB"), std::string::npos) << r.error;
  // Recompute would fit: the message says so.
  Profile heavy = uniformProfile(2);
  for (ProfileOp &op : heavy.ops) {
    op.paramBytes = 1000;
    op.savedBytes = 10000000;
    op.outBytes = 1000;
  }
  Topology two = Topology::flat(2, 1e10, 1e-6, 12000000);
  PlannerOptions stages2;
  stages2.stages = 2;
  stages2.microbatchSize = 1;
  PlanResult noRecompute = planTwoBW(heavy, two, stages2);
  ASSERT_FALSE(noRecompute.ok);
  EXPECT_NE(noRecompute.error.find("recomputation"), std::string::npos)
      << noRecompute.error;
  stages2.sim.recompute = true;
  EXPECT_TRUE(planTwoBW(heavy, two, stages2).ok);
  // Batch too small for m >= p.
  PlannerOptions small;
  small.globalBatch = 1;
  small.stages = 2;
  PlanResult b = planTwoBW(profile, Topology::flat(2, 1e10, 1e-6), small);
  ASSERT_FALSE(b.ok);
  EXPECT_NE(b.error.find("m >= p"), std::string::npos) << b.error;
  // Wrong schedule, too many stages.
  PlannerOptions gpipe;
  gpipe.schedule = "gpipe";
  EXPECT_FALSE(planTwoBW(profile, tiny, gpipe).ok);
  PlannerOptions deep;
  deep.stages = 5;
  PlanResult d = planTwoBW(profile, Topology::flat(8, 1e10, 1e-6), deep);
  ASSERT_FALSE(d.ok);
  EXPECT_NE(d.error.find("layers"), std::string::npos) << d.error;
}

} // namespace
