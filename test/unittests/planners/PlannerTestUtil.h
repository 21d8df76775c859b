//===- PlannerTestUtil.h - Instances for the pipedream/dapple tests -*- C++
//-*-===//
//
// Hand-made and seeded random instances (profiles and topologies) shared by
// the PipeDream*, Dapple* and Exhaustive* suites.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_TEST_PLANNERS_A_PLANNERTESTUTIL_H
#define PIPEC_TEST_PLANNERS_A_PLANNERTESTUTIL_H

#include "pipec/Planners.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace pipec {
namespace testutil {

/// A chain of layers with forward/backward seconds, parameter bytes and
/// output bytes (saved bytes = output bytes).
inline Profile chain(const std::vector<double> &fwd,
                     const std::vector<double> &bwd,
                     const std::vector<int64_t> &params,
                     const std::vector<int64_t> &out) {
  Profile profile;
  profile.microbatch = 1;
  for (size_t l = 0; l < fwd.size(); ++l) {
    ProfileOp op;
    op.name = "layer" + std::to_string(l);
    op.op = "Layer";
    op.fwdSeconds = fwd[l];
    op.bwdSeconds = bwd[l];
    op.paramBytes = params[l];
    op.outBytes = out[l];
    op.savedBytes = out[l];
    profile.ops.push_back(op);
  }
  return profile;
}

/// Levels innermost first: {count, bandwidth, latency}.
inline Topology topology(const std::vector<TopologyLevel> &levels,
                         int64_t memory = 0) {
  Topology t;
  t.levels = levels;
  t.deviceMemoryBytes = memory;
  return t;
}

inline TopologyLevel level(int count, double bandwidth, double latency = 0) {
  TopologyLevel l;
  l.name = "level";
  l.count = count;
  l.bandwidth = bandwidth;
  l.latency = latency;
  return l;
}

/// A random small instance: 1..maxLayers layers (some skip connections,
/// some weightless layers), 1-3 topology levels with at most maxDevices
/// devices, bandwidth falling outwards.
struct Instance {
  Profile profile;
  Topology topology;
  std::string describe() const {
    std::string text = std::to_string(profile.ops.size()) + " layers, levels";
    for (const TopologyLevel &l : topology.levels)
      text += " " + std::to_string(l.count) + "@" + std::to_string(l.bandwidth);
    if (topology.deviceMemoryBytes)
      text += ", memory " + std::to_string(topology.deviceMemoryBytes);
    return text;
  }
};

inline Instance randomInstance(std::mt19937 &rng, int maxLayers, int maxDevices,
                               bool withMemory = false) {
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  auto integer = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  Instance inst;
  int n = integer(1, maxLayers);
  inst.profile.microbatch = integer(1, 4);
  for (int l = 0; l < n; ++l) {
    ProfileOp op;
    op.name = "l" + std::to_string(l);
    op.op = "Layer";
    op.fwdSeconds = uniform(0.1, 2.0);
    op.bwdSeconds = op.fwdSeconds * uniform(1.0, 3.0);
    op.paramBytes = integer(0, 3) == 0 ? 0 : integer(1, 400);
    op.outBytes = integer(1, 200);
    op.savedBytes = integer(1, 100);
    if (l >= 2 && integer(0, 3) == 0)
      op.inputs = {l - 1, integer(0, l - 2)}; // a skip connection
    inst.profile.ops.push_back(op);
  }
  std::vector<TopologyLevel> levels;
  int shape = integer(0, 2);
  double bandwidth = uniform(50, 400);
  double latency = integer(0, 1) ? 0 : uniform(0, 0.2);
  if (shape == 0) {
    levels.push_back(level(integer(1, maxDevices), bandwidth, latency));
  } else if (shape == 1) {
    int inner = integer(1, 3);
    int outer = integer(1, std::max(1, maxDevices / inner));
    levels.push_back(level(inner, bandwidth * uniform(2, 10), latency / 2));
    levels.push_back(level(outer, bandwidth, latency));
  } else {
    levels.push_back(level(integer(1, 2), bandwidth * 10, latency / 4));
    levels.push_back(level(integer(1, 2), bandwidth * 3, latency / 2));
    levels.push_back(level(integer(1, 2), bandwidth, latency));
  }
  inst.topology = topology(levels);
  if (withMemory && integer(0, 1))
    inst.topology.deviceMemoryBytes = integer(200, 6000);
  return inst;
}

/// Checks the invariants every plan must satisfy: validatePlan, device
/// lists of the right size, distinct devices inside the topology.
inline void expectValidPlan(const Plan &plan, const Profile &profile,
                            const Topology &topology) {
  int n = static_cast<int>(profile.ops.size());
  EXPECT_EQ(validatePlan(plan, n), "");
  std::set<int> seen;
  int devices = 0;
  for (const StagePlan &stage : plan.stages) {
    EXPECT_EQ(static_cast<int>(stage.devices.size()), stage.replicas);
    devices += stage.replicas;
    for (int d : stage.devices) {
      EXPECT_GE(d, 0);
      EXPECT_LT(d, topology.numDevices());
      EXPECT_TRUE(seen.insert(d).second) << "device " << d << " used twice";
    }
  }
  EXPECT_LE(devices, topology.numDevices());
  EXPECT_GE(plan.microbatches, 1);
  EXPECT_GE(plan.microbatchSize, 1);
  EXPECT_FALSE(plan.schedule.empty());
  EXPECT_FALSE(plan.algorithm.empty());
}

inline std::string replicaString(const Plan &plan) {
  std::string text;
  for (const StagePlan &stage : plan.stages)
    text += (text.empty() ? "" : "-") + std::to_string(stage.replicas);
  return text;
}

inline bool nearlyEqual(double a, double b, double relative = 1e-9) {
  if (std::isinf(a) || std::isinf(b))
    return a == b;
  return std::fabs(a - b) <=
         relative * std::max({1.0, std::fabs(a), std::fabs(b)});
}

} // namespace testutil
} // namespace pipec

#endif // PIPEC_TEST_PLANNERS_A_PLANNERTESTUTIL_H
