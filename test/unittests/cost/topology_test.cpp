//===- topology_test.cpp - Device numbering and communication costs -------===//
//
// The oracle is arithmetic done by hand: device d's index at level k is
// (d / prod(counts below k)) % count_k; p2p = latency + bytes / B;
// ring allreduce = 2(n-1)/n * bytes / B + 2(n-1) * latency, with B and the
// latency of the slowest level spanned.
//
//===----------------------------------------------------------------------===//

#include "pipec/Topology.h"

#include <gtest/gtest.h>
#include <random>

using namespace pipec;

namespace {

TopologyLevel level(const char *name, int count, double bandwidth,
                    double latency) {
  TopologyLevel l;
  l.name = name;
  l.count = count;
  l.bandwidth = bandwidth;
  l.latency = latency;
  return l;
}

/// PipeDream's Figure 7: two servers of four GPUs (m_1 = 4, m_2 = 2).
Topology twoLevel() {
  Topology t;
  t.deviceMemoryBytes = int64_t(16) << 30;
  t.levels = {level("server", 4, 1e10, 1e-5),
              level("cluster", 2, 1.25e9, 5e-5)};
  return t;
}

/// NVLink pairs, two pairs per node, three nodes: 12 devices.
Topology threeLevel() {
  Topology t;
  t.levels = {level("pair", 2, 5e10, 2e-6), level("node", 2, 1.6e10, 5e-6),
              level("cluster", 3, 1.25e10, 1e-5)};
  return t;
}

TEST(CostTopology, TwoLevelNumbering) {
  Topology t = twoLevel();
  EXPECT_EQ(t.numDevices(), 8);
  EXPECT_EQ(t.devicesPerComponent(-1), 1);
  EXPECT_EQ(t.devicesPerComponent(0), 4);
  EXPECT_EQ(t.devicesPerComponent(1), 8);
  // Device 5 is GPU 1 of server 1.
  EXPECT_EQ(t.indexAtLevel(5, 0), 1);
  EXPECT_EQ(t.indexAtLevel(5, 1), 1);
  EXPECT_EQ(t.indexAtLevel(3, 0), 3);
  EXPECT_EQ(t.indexAtLevel(3, 1), 0);
}

TEST(CostTopology, TwoLevelLevels) {
  Topology t = twoLevel();
  EXPECT_EQ(t.levelBetween(2, 2), -1);
  EXPECT_EQ(t.levelBetween(0, 3), 0);
  EXPECT_EQ(t.levelBetween(3, 4), 1);
  EXPECT_EQ(t.levelBetween(4, 7), 0);
  EXPECT_EQ(t.levelBetween(7, 0), 1);
  EXPECT_EQ(t.levelSpanning({}), -1);
  EXPECT_EQ(t.levelSpanning({6}), -1);
  EXPECT_EQ(t.levelSpanning({6, 6}), -1);
  EXPECT_EQ(t.levelSpanning({0, 1, 2, 3}), 0);
  EXPECT_EQ(t.levelSpanning({4, 5}), 0);
  EXPECT_EQ(t.levelSpanning({1, 2, 5}), 1);
  EXPECT_EQ(t.levelSpanning({0, 1, 2, 3, 4, 5, 6, 7}), 1);
}

TEST(CostTopology, ThreeLevelNumberingAndLevels) {
  Topology t = threeLevel();
  EXPECT_EQ(t.numDevices(), 12);
  EXPECT_EQ(t.devicesPerComponent(0), 2);
  EXPECT_EQ(t.devicesPerComponent(1), 4);
  EXPECT_EQ(t.devicesPerComponent(2), 12);
  // 7 = pair-GPU 1, pair 1, node 1; 11 = pair-GPU 1, pair 1, node 2.
  EXPECT_EQ(t.indexAtLevel(7, 0), 1);
  EXPECT_EQ(t.indexAtLevel(7, 1), 1);
  EXPECT_EQ(t.indexAtLevel(7, 2), 1);
  EXPECT_EQ(t.indexAtLevel(11, 0), 1);
  EXPECT_EQ(t.indexAtLevel(11, 1), 1);
  EXPECT_EQ(t.indexAtLevel(11, 2), 2);
  EXPECT_EQ(t.indexAtLevel(8, 1), 0);
  EXPECT_EQ(t.levelBetween(4, 5), 0);
  EXPECT_EQ(t.levelBetween(4, 6), 1);
  EXPECT_EQ(t.levelBetween(5, 7), 1);
  EXPECT_EQ(t.levelBetween(4, 8), 2);
  EXPECT_EQ(t.levelBetween(7, 11), 2); // same position, different node
  EXPECT_EQ(t.levelBetween(1, 3), 1);
  EXPECT_EQ(t.levelSpanning({8, 9}), 0);
  EXPECT_EQ(t.levelSpanning({8, 9, 10, 11}), 1);
  EXPECT_EQ(t.levelSpanning({0, 4, 8}), 2);
  EXPECT_EQ(t.levelSpanning({3, 2}), 0);
}

TEST(CostTopology, OutOfRangeDevicesCountAsTheOutermostLevel) {
  Topology t = threeLevel();
  EXPECT_EQ(t.levelBetween(0, 12), 2);
  EXPECT_EQ(t.levelBetween(-1, 0), 2);
  EXPECT_EQ(t.levelBetween(12, 12), -1);
}

TEST(CostTopology, PointToPointHandComputed) {
  Topology t = twoLevel();
  EXPECT_DOUBLE_EQ(t.p2pSeconds(1000000, 1, 1), 0.0);
  // Inside a server: 10 us + 1 MB / 10 GB/s = 110 us.
  EXPECT_NEAR(t.p2pSeconds(1000000, 0, 3), 1.1e-4, 1e-15);
  // Across servers: 50 us + 1 MB / 1.25 GB/s = 850 us.
  EXPECT_NEAR(t.p2pSeconds(1000000, 3, 4), 8.5e-4, 1e-15);
  EXPECT_DOUBLE_EQ(t.p2pSeconds(1000000, 3, 4), t.p2pSeconds(1000000, 4, 3));
  // No bytes, no message.
  EXPECT_DOUBLE_EQ(t.p2pSeconds(0, 3, 4), 0.0);

  Topology t3 = threeLevel();
  // Across the pairs of one node: 5 us + 2 MB / 16 GB/s = 130 us.
  EXPECT_NEAR(t3.p2pSeconds(2000000, 4, 6), 1.3e-4, 1e-15);
  // Inside a pair: 2 us + 2 MB / 50 GB/s = 42 us.
  EXPECT_NEAR(t3.p2pSeconds(2000000, 4, 5), 4.2e-5, 1e-15);
}

TEST(CostTopology, RingAllreduceHandComputed) {
  Topology t = twoLevel();
  const int64_t bytes = 100000000; // 100 MB of gradients
  EXPECT_DOUBLE_EQ(t.allreduceSeconds(bytes, {}), 0.0);
  EXPECT_DOUBLE_EQ(t.allreduceSeconds(bytes, {5}), 0.0);
  EXPECT_DOUBLE_EQ(t.allreduceSeconds(bytes, {5, 5}), 0.0);
  EXPECT_DOUBLE_EQ(t.allreduceSeconds(0, {0, 1}), 0.0);
  // One server, n = 4: 2*3/4 * 100 MB / 10 GB/s + 6 * 10 us.
  EXPECT_NEAR(t.allreduceSeconds(bytes, {0, 1, 2, 3}), 0.015 + 6e-5, 1e-12);
  // Two servers, n = 2: 2*1/2 * 100 MB / 1.25 GB/s + 2 * 50 us.
  EXPECT_NEAR(t.allreduceSeconds(bytes, {0, 4}), 0.08 + 1e-4, 1e-12);
  // All eight: 2*7/8 * 100 MB / 1.25 GB/s + 14 * 50 us.
  EXPECT_NEAR(t.allreduceSeconds(bytes, {0, 1, 2, 3, 4, 5, 6, 7}), 0.14 + 7e-4,
              1e-12);
  // A device listed twice is one participant.
  EXPECT_DOUBLE_EQ(t.allreduceSeconds(bytes, {0, 4, 4}),
                   t.allreduceSeconds(bytes, {0, 4}));

  Topology t3 = threeLevel();
  // One node (two pairs), n = 4: 2*3/4 * 64 MB / 16 GB/s + 6 * 5 us.
  EXPECT_NEAR(t3.allreduceSeconds(64000000, {4, 5, 6, 7}), 0.006 + 3e-5, 1e-12);
  // One GPU per node, n = 3: 2*2/3 * 64 MB / 12.5 GB/s + 4 * 10 us.
  EXPECT_NEAR(t3.allreduceSeconds(64000000, {0, 4, 8}),
              2.0 * 2.0 / 3.0 * 64e6 / 1.25e10 + 4e-5, 1e-12);
}

TEST(CostTopology, AllreduceMatchesPipeDreamSyncTerm) {
  // pipedream.md §7 item 20: 2(m-1)/m * sum|w| / B_k without latency.
  Topology t = Topology::flat(16, 3.125e9, 0.0);
  std::vector<int> all;
  for (int d = 0; d < 16; ++d)
    all.push_back(d);
  EXPECT_NEAR(t.allreduceSeconds(548000000, all),
              2.0 * 15.0 / 16.0 * 548e6 / 3.125e9, 1e-12);
}

TEST(CostTopology, SlowestLevelSpannedWhenBandwidthRisesOutwards) {
  // A PCIe-bound server with a faster NIC: traffic between servers still
  // crosses PCIe, so the slower inner bandwidth and the larger latency
  // bound it.
  Topology t;
  t.levels = {level("server", 4, 1e10, 2e-5),
              level("cluster", 2, 2.5e10, 1e-5)};
  TopologyLevel link = t.effectiveLink(1);
  EXPECT_DOUBLE_EQ(link.bandwidth, 1e10);
  EXPECT_DOUBLE_EQ(link.latency, 2e-5);
  EXPECT_EQ(link.count, 2);
  EXPECT_NEAR(t.p2pSeconds(1000000, 0, 4), 2e-5 + 1e-4, 1e-15);
  EXPECT_NEAR(t.allreduceSeconds(1000000, {0, 4}), 1e-4 + 2 * 2e-5, 1e-15);
  // In the usual direction the effective link is the level itself.
  Topology normal = twoLevel();
  EXPECT_DOUBLE_EQ(normal.effectiveLink(1).bandwidth, 1.25e9);
  EXPECT_DOUBLE_EQ(normal.effectiveLink(0).bandwidth, 1e10);
}

TEST(CostTopology, Flat) {
  Topology t = Topology::flat(4, 1e9, 1e-6, 123);
  ASSERT_EQ(t.levels.size(), 1u);
  EXPECT_EQ(t.numDevices(), 4);
  EXPECT_EQ(t.deviceMemoryBytes, 123);
  EXPECT_EQ(t.levels[0].count, 4);
  EXPECT_EQ(t.levelBetween(0, 3), 0);
  EXPECT_NEAR(t.p2pSeconds(1000000000, 0, 3), 1.0 + 1e-6, 1e-12);
  EXPECT_NEAR(t.allreduceSeconds(1000000000, {0, 1, 2, 3}), 1.5 + 6e-6, 1e-12);
  EXPECT_EQ(topologyError(t), "");
  EXPECT_EQ(Topology::flat(1, 1e9, 0).numDevices(), 1);
}

TEST(CostTopology, ErrorsOfHandBuiltTopologies) {
  EXPECT_EQ(topologyError(twoLevel()), "");
  EXPECT_EQ(topologyError(threeLevel()), "");
  Topology empty;
  EXPECT_NE(topologyError(empty).find("at least one level"), std::string::npos);
  Topology zero = twoLevel();
  zero.levels[1].count = 0;
  EXPECT_NE(topologyError(zero).find("level 1 ('cluster')"), std::string::npos);
  EXPECT_EQ(zero.numDevices(), 0);
  Topology slow = threeLevel();
  slow.levels[2].bandwidth = 0;
  EXPECT_NE(topologyError(slow).find("level 2 ('cluster'): 'bandwidth'"),
            std::string::npos);
  Topology late = threeLevel();
  late.levels[0].latency = -1;
  EXPECT_NE(topologyError(late).find("level 0 ('pair'): 'latency'"),
            std::string::npos);
  Topology memory = twoLevel();
  memory.deviceMemoryBytes = -5;
  EXPECT_NE(topologyError(memory).find("device_memory_bytes"),
            std::string::npos);
  Topology huge;
  huge.levels = {level("a", 1 << 16, 1, 0), level("b", 1 << 16, 1, 0)};
  EXPECT_NE(topologyError(huge).find("too many devices"), std::string::npos);
}

} // namespace

// levelSpanning takes the lowest and highest device only (the numbering is
// digit by digit): equal to the largest levelBetween over every pair, on
// random three-level topologies and random sets (devices outside the
// topology included); and p2pSeconds depends on the pair through its level
// only (what planners and the simulator cache lines by).
TEST(CostTopology, SpanningAndCostsDependOnLevelsOnly) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    Topology t;
    t.levels = {{"a", int(1 + rng() % 4), 3e11, 1e-6},
                {"b", int(1 + rng() % 5), 1e11, 2e-6},
                {"c", int(1 + rng() % 3), 2e10, 5e-6}};
    const int n = t.numDevices();
    std::vector<int> set(1 + rng() % 6);
    for (int &d : set)
      d = int(rng() % (n + 2)) - 1; // -1 .. n: one outside at each end
    int brute = -1;
    for (int a : set)
      for (int b : set)
        brute = std::max(brute, t.levelBetween(a, b));
    EXPECT_EQ(t.levelSpanning(set), brute) << "trial " << trial;
    int a = int(rng() % n), b = int(rng() % n);
    EXPECT_EQ(t.p2pSeconds(12345, a, b),
              t.p2pSecondsAtLevel(12345, t.levelBetween(a, b)));
  }
}
