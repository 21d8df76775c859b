//===- processor_sharing_test.cpp - devices sharing processors ------------===//
//
// A topology level with `processors` fewer than its devices (stage
// processes on a host with fewer cores, ranks sharing one GPU): the ops
// that run at a time share the processors, each at min(1, processors /
// running) of its speed. On one processor a pipeline whose network is free
// is always running something, so a step takes exactly the sum of every
// op's time; two ops running together each take twice as long; a plan
// whose device runs several stages (MadPipe) cannot also share processors.
//
//===----------------------------------------------------------------------===//

#include "pipec/Plan.h"
#include "pipec/Sim.h"
#include "sim_test_util.h"

#include <gtest/gtest.h>
#include <map>
#include <nlohmann/json.hpp>

using namespace pipec;

namespace {

/// `layers` layers with forward and backward 1 s each.
Profile unitProfile(int layers) {
  return simtest::uniformProfile(layers, 1, 1);
}

Plan straightPlan(int stages, const std::string &schedule, int microbatches) {
  Plan plan;
  plan.algorithm = "balanced";
  plan.schedule = schedule;
  plan.microbatches = microbatches;
  for (int s = 0; s < stages; ++s) {
    StagePlan stage;
    stage.firstLayer = stage.lastLayer = s;
    stage.devices = {s};
    plan.stages.push_back(stage);
  }
  return plan;
}

/// `devices` devices on one host with `processors` processors (0: one
/// each), messages free.
Topology host(int devices, int processors) {
  Topology topology = Topology::flat(devices, 1e15, 0);
  topology.levels[0].processors = processors;
  return topology;
}

} // namespace

TEST(SimProcessorSharing, OneProcessorRunsTheWholeWork) {
  // A device each: (m + p - 1)(f + b) = 10 s, zb-h1's split backward fills
  // a bubble of 1 s; one processor: 2 stages x 4 microbatches x 2 s = 16 s.
  for (auto [schedule, alone] : {std::pair<const char *, double>{"gpipe", 10},
                                 {"1f1b-flush", 10},
                                 {"zb-h1", 9}}) {
    SCOPED_TRACE(schedule);
    Plan plan = straightPlan(2, schedule, 4);
    SimResult own = simulatePlan(unitProfile(2), host(2, 0), plan);
    SimResult shared = simulatePlan(unitProfile(2), host(2, 1), plan);
    ASSERT_TRUE(own.ok) << own.error;
    ASSERT_TRUE(shared.ok) << shared.error;
    EXPECT_NEAR(own.iterationSeconds, alone, 1e-9);
    EXPECT_NEAR(shared.iterationSeconds, 16.0, 1e-9);
    // The one processor is never idle: no bubble (the time to fill is the
    // processors', not the devices': it was 100% when counted per device).
    EXPECT_NEAR(shared.bubbleFraction, 0.0, 1e-9);
    EXPECT_NEAR(own.bubbleFraction, (2 * alone - 16) / 16, 1e-9);
  }
}

TEST(SimProcessorSharing, TwoProcessorsForFourStages) {
  Plan plan = straightPlan(4, "1f1b-flush", 8);
  SimResult own = simulatePlan(unitProfile(4), host(4, 0), plan);
  SimResult two = simulatePlan(unitProfile(4), host(4, 2), plan);
  SimResult four = simulatePlan(unitProfile(4), host(4, 4), plan);
  ASSERT_TRUE(own.ok && two.ok && four.ok);
  EXPECT_NEAR(four.iterationSeconds, own.iterationSeconds, 1e-9);
  // No faster than the work over two processors (64 s / 2), and slower
  // than a device each (22 s).
  EXPECT_GE(two.iterationSeconds, 32.0 - 1e-9);
  EXPECT_GT(two.iterationSeconds, own.iterationSeconds + 1);
  EXPECT_LE(two.iterationSeconds, 64.0);
}

TEST(SimProcessorSharing, OpsRunningTogetherStretch) {
  // gpipe, 2 stages, 2 microbatches, one processor: F0 of microbatch 1 and
  // F1 of microbatch 0 both run from t = 1, at half speed, to t = 3.
  Plan plan = straightPlan(2, "gpipe", 2);
  SimOptions options;
  options.trace = true;
  SimResult result = simulatePlan(unitProfile(2), host(2, 1), plan, options);
  ASSERT_TRUE(result.ok) << result.error;
  nlohmann::json events = nlohmann::json::parse(result.traceJson);
  int stretched = 0;
  for (const auto &event : events) {
    if (event.value("ph", "") != "X" || event.value("tid", -1) != 0)
      continue;
    const std::string name = event.value("name", "");
    double start = event["ts"].get<double>() / 1e6;
    double length = event["dur"].get<double>() / 1e6;
    if ((name == "F1" && event.value("pid", -1) == 0) ||
        (name == "F0" && event.value("pid", -1) == 1)) {
      EXPECT_NEAR(start, 1.0, 1e-6) << name;
      EXPECT_NEAR(length, 2.0, 1e-6) << name;
      ++stretched;
    }
  }
  EXPECT_EQ(stretched, 2);
}

TEST(SimProcessorSharing, NotWithDevicesRunningSeveralStages) {
  Plan plan = straightPlan(2, "1f1b", 4);
  plan.algorithm = "madpipe";
  plan.stages[1].devices = {0};
  plan.stages.push_back(plan.stages[0]);
  plan.stages[2].firstLayer = plan.stages[2].lastLayer = 2;
  plan.stages[2].devices = {1};
  SimResult result = simulatePlan(unitProfile(3), host(2, 1), plan);
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.error.find("shares its processors"), std::string::npos)
      << result.error;
}

TEST(SimProcessorSharing, ReplicasSharingProcessorsAreNotCollapsedToALane) {
  // Two replicas of each of 2 stages on 4 devices sharing 2 processors:
  // simulated whole (the lanes slow each other), so collapseLanes on or
  // off gives the same step, slower than on 4 processors.
  Plan plan = straightPlan(2, "1f1b-flush", 4);
  plan.stages[0].replicas = plan.stages[1].replicas = 2;
  plan.stages[0].devices = {0, 1};
  plan.stages[1].devices = {2, 3};
  SimOptions lanes, whole;
  whole.collapseLanes = false;
  SimResult a = simulatePlan(unitProfile(2), host(4, 2), plan, lanes);
  SimResult b = simulatePlan(unitProfile(2), host(4, 2), plan, whole);
  SimResult own = simulatePlan(unitProfile(2), host(4, 0), plan, lanes);
  ASSERT_TRUE(a.ok && b.ok && own.ok) << a.error << b.error << own.error;
  EXPECT_DOUBLE_EQ(a.iterationSeconds, b.iterationSeconds);
  EXPECT_GT(a.iterationSeconds, own.iterationSeconds + 1e-9);
}

TEST(SimProcessorSharing, MessagesShareTheProcessors) {
  // gpipe, 2 stages, 4 microbatches, f = b = 1 s, every message 0.5 s.
  // On one processor the messages' copies are its work too: 16 s of ops
  // and 8 messages x 0.5 s, and the processor is never idle: 20 s. Taking
  // the link alone the messages overlap the ops (at most 20 s, at least
  // the 16 s of ops). With a processor each nothing is shared: the option
  // changes nothing.
  Plan plan = straightPlan(2, "gpipe", 4);
  const Profile withBytes = simtest::uniformProfile(2, 1, 1, /*outBytes=*/8);
  auto hostWithLink = [](int processors) {
    Topology topology = Topology::flat(2, 1e15, 0.5);
    topology.levels[0].processors = processors;
    return topology;
  };
  SimOptions shared, onLink;
  onLink.messagesShareProcessors = false;
  SimResult a = simulatePlan(withBytes, hostWithLink(1), plan, shared);
  SimResult b = simulatePlan(withBytes, hostWithLink(1), plan, onLink);
  SimResult c = simulatePlan(withBytes, hostWithLink(0), plan, shared);
  SimResult d = simulatePlan(withBytes, hostWithLink(0), plan, onLink);
  ASSERT_TRUE(a.ok && b.ok && c.ok && d.ok)
      << a.error << b.error << c.error << d.error;
  EXPECT_NEAR(a.iterationSeconds, 20.0, 1e-9);
  EXPECT_GE(b.iterationSeconds, 16.0 - 1e-9);
  EXPECT_LT(b.iterationSeconds, 20.0 - 1e-3);
  EXPECT_NEAR(c.iterationSeconds, d.iterationSeconds, 1e-12);
  // A message still arrives whole before its receiver starts: traced sends
  // end before the receiving forward begins.
  SimOptions traced;
  traced.trace = true;
  SimResult t = simulatePlan(withBytes, hostWithLink(1), plan, traced);
  ASSERT_TRUE(t.ok) << t.error;
  nlohmann::json events = nlohmann::json::parse(t.traceJson);
  std::map<std::string, double> sendEnd, forwardStart;
  for (const auto &event : events) {
    if (event.value("ph", "") != "X")
      continue;
    const std::string name = event.value("name", "");
    const double start = event["ts"].get<double>() / 1e6;
    const double length = event["dur"].get<double>() / 1e6;
    const auto args = event.value("args", nlohmann::json::object());
    const std::string mb = std::to_string(args.value("microbatch", -1));
    if (name == "send activation")
      sendEnd[mb] = start + length;
    if (event.value("pid", -1) == 1 && event.value("tid", -1) == 0 &&
        name.rfind("F", 0) == 0)
      forwardStart[name.substr(1)] = start;
  }
  ASSERT_EQ(sendEnd.size(), 4u);
  for (auto [mb, end] : sendEnd) {
    ASSERT_TRUE(forwardStart.count(mb)) << mb;
    EXPECT_LE(end, forwardStart[mb] + 1e-9) << "microbatch " << mb;
  }
}
