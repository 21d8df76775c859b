//===- topology_json_test.cpp - pipec.topology/1 reader and writer --------===//
//
// Round trip, the DESIGN.md §7 example, and every rejection with a message
// that names the offending level.
//
//===----------------------------------------------------------------------===//

#include "pipec/Topology.h"

#include <gtest/gtest.h>

using namespace pipec;

namespace {

/// Parses `text` and expects a failure whose message contains `needle`.
void expectRejected(const std::string &text, const std::string &needle) {
  TopologyResult result = topologyFromJson(text);
  EXPECT_FALSE(result.ok) << text;
  EXPECT_NE(result.error.find(needle), std::string::npos)
      << "message: " << result.error << "\nexpected to contain: " << needle;
  EXPECT_EQ(result.error.rfind("topology: ", 0), 0u) << result.error;
}

/// A two-level document whose second level has `field` set to `value`.
std::string withClusterField(const std::string &field,
                             const std::string &value) {
  std::string level = R"({"name": "cluster", "count": 16, "bandwidth": 2.5e10,
                          "latency": 1e-5})";
  std::string key = "\"" + field + "\": ";
  size_t at = level.find(key);
  if (at == std::string::npos) {
    level.insert(level.size() - 1, ", " + key + value);
  } else {
    size_t end = level.find_first_of(",}", at);
    level.replace(at, end - at, key + value);
  }
  return R"({"format": "pipec.topology/1", "device_memory_bytes": 1000,
             "levels": [{"name": "node", "count": 8, "bandwidth": 3e11,
                         "latency": 5e-6}, )" +
         level + "]}";
}

TEST(CostTopologyJson, ReadsTheDesignExample) {
  TopologyResult result = topologyFromJson(R"({
    "format": "pipec.topology/1",
    "device_memory_bytes": 85899345920,
    "note": "extra fields are ignored",
    "levels": [{"name":"node","count":8,"bandwidth":3e11,"latency":5e-6},
               {"name":"cluster","count":16,"bandwidth":2.5e10,"latency":1e-5,
                "note": "also here"}]})");
  ASSERT_TRUE(result.ok) << result.error;
  const Topology &t = result.topology;
  EXPECT_EQ(t.deviceMemoryBytes, 85899345920);
  ASSERT_EQ(t.levels.size(), 2u);
  EXPECT_EQ(t.levels[0].name, "node");
  EXPECT_EQ(t.levels[0].count, 8);
  EXPECT_DOUBLE_EQ(t.levels[0].bandwidth, 3e11);
  EXPECT_DOUBLE_EQ(t.levels[0].latency, 5e-6);
  EXPECT_EQ(t.levels[1].name, "cluster");
  EXPECT_EQ(t.levels[1].count, 16);
  EXPECT_EQ(t.numDevices(), 128);
}

TEST(CostTopologyJson, DefaultsAndLenientNumbers) {
  // Memory and latency may be omitted (unlimited, 0 s); names too; whole
  // numbers may be written as floating point.
  TopologyResult result = topologyFromJson(
      R"({"format": "pipec.topology/1",
          "levels": [{"count": 4.0, "bandwidth": 1e9}]})");
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_EQ(result.topology.deviceMemoryBytes, 0);
  EXPECT_EQ(result.topology.levels[0].count, 4);
  EXPECT_DOUBLE_EQ(result.topology.levels[0].latency, 0.0);
  EXPECT_EQ(result.topology.levels[0].name, "");

  result = topologyFromJson(R"({"format": "pipec.topology/1",
      "device_memory_bytes": 1.6e10,
      "levels": [{"name": "x", "count": 2, "bandwidth": 1, "latency": 0}]})");
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_EQ(result.topology.deviceMemoryBytes, 16000000000);
}

TEST(CostTopologyJson, RoundTrip) {
  Topology t;
  t.deviceMemoryBytes = int64_t(80) << 30;
  TopologyLevel pair{"pair", 2, 5.0e10, 2.0e-6};
  TopologyLevel node{"node", 4, 1.2345678901234e10, 3.3e-6};
  TopologyLevel cluster{"cluster", 192, 2.5e10, 1e-5};
  t.levels = {pair, node, cluster};
  std::string text = topologyToJson(t);
  EXPECT_NE(text.find("\"format\": \"pipec.topology/1\""), std::string::npos);
  TopologyResult back = topologyFromJson(text);
  ASSERT_TRUE(back.ok) << back.error;
  EXPECT_EQ(back.topology.deviceMemoryBytes, t.deviceMemoryBytes);
  ASSERT_EQ(back.topology.levels.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(back.topology.levels[k].name, t.levels[k].name);
    EXPECT_EQ(back.topology.levels[k].count, t.levels[k].count);
    EXPECT_EQ(back.topology.levels[k].bandwidth, t.levels[k].bandwidth);
    EXPECT_EQ(back.topology.levels[k].latency, t.levels[k].latency);
  }
  // Writing again gives the same text.
  EXPECT_EQ(topologyToJson(back.topology), text);
}

TEST(CostTopologyJson, RejectsDocumentProblems) {
  expectRejected("{", "not valid JSON");
  expectRejected("[1, 2]", "top level must be a JSON object");
  expectRejected(R"({"levels": []})", "missing \"format\"");
  expectRejected(R"({"format": "pipec.topology/2", "levels": []})",
                 "unsupported format \"pipec.topology/2\"");
  expectRejected(R"({"format": "pipec.profile/1", "levels": []})",
                 "unsupported format");
  expectRejected(R"({"format": 1})", "unsupported format 1");
  expectRejected(R"({"format": "pipec.topology/1"})",
                 "'levels' must be a list");
  expectRejected(R"({"format": "pipec.topology/1", "levels": {}})",
                 "'levels' must be a list");
  expectRejected(R"({"format": "pipec.topology/1", "levels": []})",
                 "at least one level");
  expectRejected(R"({"format": "pipec.topology/1", "levels": [7]})",
                 "level 0 must be a JSON object");
  expectRejected(
      R"({"format": "pipec.topology/1",
          "levels": [{"name": 3, "count": 1, "bandwidth": 1}]})",
      "level 0: 'name' must be a string");
}

TEST(CostTopologyJson, RejectsBadMemory) {
  const char *prefix =
      R"({"format": "pipec.topology/1", "device_memory_bytes": )";
  const char *suffix =
      R"(, "levels": [{"name": "n", "count": 1, "bandwidth": 1}]})";
  for (const char *bad : {"-1", "1.5", "\"16GB\"", "-1e9"})
    expectRejected(std::string(prefix) + bad + suffix, "'device_memory_bytes'");
}

TEST(CostTopologyJson, RejectsBadCountsNamingTheLevel) {
  expectRejected(withClusterField("count", "0"),
                 "level 1 ('cluster'): 'count' must be a whole number >= 1");
  expectRejected(withClusterField("count", "-2"),
                 "level 1 ('cluster'): 'count'");
  expectRejected(withClusterField("count", "2.5"),
                 "level 1 ('cluster'): 'count'");
  expectRejected(withClusterField("count", "\"16\""),
                 "level 1 ('cluster'): 'count' must be a number");
  expectRejected(withClusterField("count", "1e12"),
                 "level 1 ('cluster'): 'count'");
  expectRejected(
      R"({"format": "pipec.topology/1",
          "levels": [{"name": "node", "bandwidth": 1}]})",
      "level 0 ('node'): missing 'count'");
}

TEST(CostTopologyJson, RejectsBadBandwidthsNamingTheLevel) {
  expectRejected(withClusterField("bandwidth", "0"),
                 "level 1 ('cluster'): 'bandwidth' must be a positive");
  expectRejected(withClusterField("bandwidth", "-2.5e10"),
                 "level 1 ('cluster'): 'bandwidth' must be a positive");
  expectRejected(withClusterField("bandwidth", "\"25 Gbps\""),
                 "level 1 ('cluster'): 'bandwidth' must be a number");
  expectRejected(withClusterField("bandwidth", "null"),
                 "level 1 ('cluster'): 'bandwidth' must be a number");
  expectRejected(
      R"({"format": "pipec.topology/1",
          "levels": [{"name": "node", "count": 8}]})",
      "level 0 ('node'): missing 'bandwidth'");
}

TEST(CostTopologyJson, RejectsBadLatenciesNamingTheLevel) {
  expectRejected(withClusterField("latency", "-1e-6"),
                 "level 1 ('cluster'): 'latency' must be a non-negative");
  expectRejected(withClusterField("latency", "\"5us\""),
                 "level 1 ('cluster'): 'latency' must be a number");
  // Zero is the bandwidth-only model of the papers.
  EXPECT_TRUE(topologyFromJson(withClusterField("latency", "0")).ok);
}

TEST(CostTopologyJson, RejectsTooManyDevices) {
  expectRejected(
      R"({"format": "pipec.topology/1", "levels": [
          {"name": "node", "count": 65536, "bandwidth": 1},
          {"name": "cluster", "count": 65536, "bandwidth": 1}]})",
      "level 1 ('cluster'): too many devices");
}

} // namespace

TEST(CostTopologyJson, ProcessorsSharedByALevel) {
  // 4 stage processes on a 2-core host: "processors" on the host level.
  TopologyResult r = topologyFromJson(
      R"({"format": "pipec.topology/1",
          "levels": [{"name": "host", "count": 4, "bandwidth": 1e9,
                      "processors": 2},
                     {"name": "cluster", "count": 2, "bandwidth": 1e8}]})");
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.topology.levels[0].processors, 2);
  EXPECT_EQ(r.topology.levels[1].processors, 0);
  // Devices 0-3 share host 0's 2 processors, 4-7 host 1's.
  EXPECT_EQ(r.topology.processorGroup(3), std::make_pair(0, 2));
  EXPECT_EQ(r.topology.processorGroup(4), std::make_pair(1, 2));
  TopologyResult back = topologyFromJson(topologyToJson(r.topology));
  ASSERT_TRUE(back.ok) << back.error;
  EXPECT_EQ(back.topology.levels[0].processors, 2);
  // As many processors as devices (or none given): a processor each.
  r.topology.levels[0].processors = 4;
  EXPECT_EQ(r.topology.processorGroup(3), std::make_pair(-1, 0));
  // Enough on the inner level, short on the outer: the outer one counts.
  r.topology.levels[1].processors = 6;
  EXPECT_EQ(r.topology.processorGroup(5), std::make_pair(0, 6));
  EXPECT_EQ(topologyToJson(Topology::flat(2, 1e9, 0)).find("processors"),
            std::string::npos);
  expectRejected(
      R"({"format": "pipec.topology/1",
          "levels": [{"count": 2, "bandwidth": 1, "processors": -1}]})",
      "'processors'");
}
