//===- shared_device_test.cpp - several stages on one device --------------===//
//
// MadPipe's special processor (papers/madpipe.md §2.4, §4): plans whose
// stages list a common device. The digest's (2, 4, 2) example on two
// devices (layers 1 and 3 on the special processor, layer 2 on the normal
// one) reaches period 4 where the best contiguous split needs 6; the
// device's memory sums its stages' weights and follows the activations its
// stages stash over time; the device runs one op at a time in the
// documented greedy order; deadlocks are still reported; other planners'
// overlaps are still refused.
//
//===----------------------------------------------------------------------===//

#include "pipec/Plan.h"
#include "pipec/Sim.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>

using namespace pipec;

namespace {

/// Layers with fwd = bwd = load / 2 and per-layer sizes.
Profile loadProfile(const std::vector<double> &loads,
                    const std::vector<int64_t> &params = {},
                    const std::vector<int64_t> &saved = {},
                    int64_t outBytes = 0) {
  Profile profile;
  profile.microbatch = 1;
  for (size_t i = 0; i < loads.size(); ++i) {
    ProfileOp op;
    op.name = "layer" + std::to_string(i);
    op.op = "Gemm";
    op.fwdSeconds = loads[i] / 2;
    op.bwdSeconds = loads[i] / 2;
    op.paramBytes = params.empty() ? 0 : params[i];
    op.savedBytes = saved.empty() ? 0 : saved[i];
    op.outBytes = outBytes;
    profile.ops.push_back(op);
  }
  return profile;
}

/// One layer per stage on the given devices.
Plan layerPlan(const std::vector<int> &devices, const std::string &schedule,
               int microbatches, const std::string &algorithm = "madpipe") {
  Plan plan;
  plan.algorithm = algorithm;
  plan.schedule = schedule;
  plan.microbatches = microbatches;
  for (size_t s = 0; s < devices.size(); ++s) {
    StagePlan stage;
    stage.firstLayer = stage.lastLayer = static_cast<int>(s);
    stage.devices = {devices[s]};
    plan.stages.push_back(stage);
  }
  return plan;
}

Topology freeNetwork(int devices = 8) {
  return Topology::flat(devices, 1e12, 0);
}

const DeviceUsage *usageOf(const SimResult &result, int device) {
  for (const DeviceUsage &usage : result.devices)
    if (usage.device == device)
      return &usage;
  return nullptr;
}

} // namespace

TEST(SimSharedDevice, PlanConventionIsValid) {
  Plan plan = layerPlan({1, 0, 1}, "1f1b", 4);
  EXPECT_EQ(validatePlan(plan, 3), "");
  EXPECT_EQ(devicesSharedByStages(plan), (std::vector<int>{1}));
  EXPECT_TRUE(sharedDevicesAllowed(plan));
  plan.algorithm = "auto:madpipe";
  EXPECT_TRUE(sharedDevicesAllowed(plan));
  plan.algorithm = "pipedream";
  EXPECT_FALSE(sharedDevicesAllowed(plan));
  SimOptions options;
  options.allowSharedDevices = true;
  EXPECT_TRUE(sharedDevicesAllowed(plan, options));
  // A stage still may not list one device twice.
  plan.stages[0].replicas = 2;
  plan.stages[0].devices = {1, 1};
  EXPECT_NE(validatePlan(plan, 3).find("twice"), std::string::npos);
  // Interleaved chunks are not shared devices.
  Plan interleaved = layerPlan({0, 1, 0, 1}, "interleaved", 2);
  interleaved.chunks = 2;
  EXPECT_TRUE(devicesSharedByStages(interleaved).empty());
  EXPECT_TRUE(devicesSharedByStages(layerPlan({0, 1, 2}, "1f1b", 3)).empty());
}

TEST(SimSharedDevice, DigestExamplePeriodFour) {
  // madpipe.md §4: loads (2, 4, 2) on P = 2. Contiguous: period 6. Layers 1
  // and 3 on device 1 (the special processor), layer 2 on device 0: both
  // devices carry 4 per microbatch, and the greedy order reaches it.
  Profile profile = loadProfile({2, 4, 2});
  for (const char *schedule : {"1f1b", "2bw"}) {
    SCOPED_TRACE(schedule);
    Plan plan = layerPlan({1, 0, 1}, schedule, 4);
    SimResult result = simulatePlan(profile, freeNetwork(), plan);
    ASSERT_TRUE(result.ok) << result.error;
    EXPECT_NEAR(result.iterationSeconds, 4 * 4.0, 1e-9); // m x period 4
    EXPECT_NEAR(result.samplesPerSecond, 1 / 4.0, 1e-12);
    EXPECT_NEAR(result.bubbleFraction, 0, 1e-9);
    ASSERT_EQ(result.devices.size(), 2u);
    EXPECT_DOUBLE_EQ(usageOf(result, 0)->busySeconds, 4 * 4.0);
    EXPECT_DOUBLE_EQ(usageOf(result, 1)->busySeconds, 4 * 4.0);
    // The best contiguous split on two devices: period 6.
    Plan contiguous = layerPlan({0, 1, 1}, schedule, 4, "test");
    contiguous.stages = {contiguous.stages[0], contiguous.stages[1]};
    contiguous.stages[1].lastLayer = 2;
    SimResult best = simulatePlan(profile, freeNetwork(), contiguous);
    ASSERT_TRUE(best.ok) << best.error;
    EXPECT_NEAR(best.iterationSeconds, 4 * 6.0, 1e-9);
  }
}

TEST(SimSharedDevice, DeviceRunsOneOpAtATimeInGreedyOrder) {
  // The trace of the (2, 4, 2) plan: ops of one device never overlap, and
  // the special device follows the order derived by hand from the rule
  // (oldest microbatch first, backward before forward) for 1f1b programs
  // with warm-ups 3, 2, 1.
  Profile profile = loadProfile({2, 4, 2});
  Plan plan = layerPlan({1, 0, 1}, "1f1b", 4);
  SimOptions options;
  options.trace = true;
  SimResult result = simulatePlan(profile, freeNetwork(), plan, options);
  ASSERT_TRUE(result.ok) << result.error;
  nlohmann::json events = nlohmann::json::parse(result.traceJson);
  std::map<int, std::vector<std::pair<double, double>>> busy;
  std::vector<std::pair<double, std::string>> special;
  for (const auto &event : events) {
    if (event.value("ph", "") != "X" || event.value("tid", -1) != 0)
      continue; // compute lane only
    int device = event.value("pid", -1);
    double start = event["ts"].get<double>(), length = event["dur"];
    busy[device].push_back({start, start + length});
    if (device == 1 && special.size() < 12)
      special.push_back(
          {start, event.value("name", "") + "/s" +
                      std::to_string(event["args"].value("stage", -1))});
  }
  ASSERT_EQ(busy.size(), 2u);
  for (auto &[device, intervals] : busy) {
    std::sort(intervals.begin(), intervals.end());
    for (size_t i = 1; i < intervals.size(); ++i)
      EXPECT_LE(intervals[i - 1].second, intervals[i].first + 1e-6)
          << "device " << device << " runs two ops at once";
  }
  std::sort(special.begin(), special.end());
  std::vector<std::string> order;
  for (const auto &entry : special)
    order.push_back(entry.second);
  // Times (x1e6 in the trace): F0/s0 0, F1/s0 1, F2/s0 2, F0/s2 3, B0/s2 4,
  // F1/s2 5, B1/s2 6, B0/s0 7, F3/s0 8, F2/s2 9, B2/s2 10, B1/s0 11.
  EXPECT_EQ(order, (std::vector<std::string>{
                       "F0/s0", "F1/s0", "F2/s0", "F0/s2", "B0/s2", "F1/s2",
                       "B1/s2", "B0/s0", "F3/s0", "F2/s2", "B2/s2", "B1/s0"}));
}

TEST(SimSharedDevice, MemorySumsTheStagesOfTheDevice) {
  // (2, 4, 2) with parameters (10, 20, 30) MB-ish and stashed activations
  // (1, 2, 4) per microbatch. 1f1b on the 3-stage chain: weight versions
  // and in-flight depth 3, 2, 1 (p - s). Device 1 holds stages 0 and 2:
  //   weights 3·10 + 1·30, gradients 10 + 30, and the stashed activations
  //   at their peak over time: three microbatches of stage 0 and one of
  //   stage 2 (3·1 + 1·4 = 7).
  // Device 0: 2·20 + 20 + 2·2.
  const int64_t unit = 1000;
  Profile profile = loadProfile({2, 4, 2}, {10 * unit, 20 * unit, 30 * unit},
                                {1 * unit, 2 * unit, 4 * unit});
  Plan plan = layerPlan({1, 0, 1}, "1f1b", 4);
  Topology topology = freeNetwork();
  topology.deviceMemoryBytes = 107 * unit;
  SimResult result = simulatePlan(profile, topology, plan);
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_EQ(result.peakInflight, (std::vector<int64_t>{3, 2, 1}));
  EXPECT_EQ(result.memory[0].weightVersions, 3);
  EXPECT_EQ(result.memory[2].weightVersions, 1);
  EXPECT_EQ(usageOf(result, 1)->peakBytes,
            (3 * 10 + 10 + 1 * 30 + 30 + 3 * 1 + 1 * 4) * unit);
  EXPECT_EQ(usageOf(result, 0)->peakBytes, (2 * 20 + 20 + 2 * 2) * unit);
  // The per-stage view: the device total is the sum of its stages here.
  EXPECT_EQ(usageOf(result, 1)->peakBytes,
            result.memory[0].total() + result.memory[2].total());
  // The limit is checked on the device total: 107 fits, 106 does not,
  // although each stage alone is far below it.
  EXPECT_TRUE(result.fitsMemory);
  topology.deviceMemoryBytes = 106 * unit;
  result = simulatePlan(profile, topology, plan);
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_FALSE(result.fitsMemory);
  EXPECT_LT(result.memory[0].total(), 106 * unit);
  EXPECT_LT(result.memory[2].total(), 106 * unit);
  // 2bw: two versions of every stage (thesis.md §3.1): 2·10 + 10 + 2·30 +
  // 30 + 7.
  plan.schedule = "2bw";
  topology.deviceMemoryBytes = 0;
  result = simulatePlan(profile, topology, plan);
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_EQ(usageOf(result, 1)->peakBytes,
            (2 * 10 + 10 + 2 * 30 + 30 + 3 * 1 + 1 * 4) * unit);
}

TEST(SimSharedDevice, ActivationPeakFollowsTheDeviceOrder) {
  // GPipe runs every forward before any backward: device 1 holds all m
  // microbatches of both stages at once (madpipe.md §2.4, "all forwards,
  // then all backwards": Σ g_i a_i).
  const int64_t unit = 1000;
  Profile profile = loadProfile({2, 4, 2}, {}, {1 * unit, 2 * unit, 4 * unit});
  Plan plan = layerPlan({1, 0, 1}, "gpipe", 4);
  SimResult result = simulatePlan(profile, freeNetwork(), plan);
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_EQ(usageOf(result, 1)->peakBytes, (4 * 1 + 4 * 4) * unit);
  // Bubble and idle use the two devices, not the three stages.
  const double busy = 4 * 8.0;
  EXPECT_NEAR(result.idleFraction, 1 - busy / (2 * result.iterationSeconds),
              1e-12);
  EXPECT_NEAR(result.bubbleFraction,
              (2 * result.iterationSeconds - busy) / busy, 1e-12);
  // Flush schedules: the makespan is at least each device's work.
  EXPECT_GE(result.iterationSeconds, busy / 2);
}

TEST(SimSharedDevice, AdjacentStagesOnOneDeviceSendNothing) {
  // Stages 0 and 1 on device 0, stage 2 on device 1: nothing crosses the
  // cut between stages 0 and 1; stage 1 sends its activations and stage 2
  // its gradients, one per microbatch.
  Profile profile = loadProfile({1, 1, 2}, {}, {}, int64_t(1) << 20);
  Topology slow = Topology::flat(2, 1e6, 1e-3);
  Plan plan = layerPlan({0, 0, 1}, "1f1b-flush", 4);
  SimOptions options;
  options.trace = true;
  SimResult result = simulatePlan(profile, slow, plan, options);
  ASSERT_TRUE(result.ok) << result.error;
  EXPECT_EQ(result.devices.size(), 2u);
  std::map<int, int> sends; // by sending stage
  for (const auto &event : nlohmann::json::parse(result.traceJson))
    if (event.value("ph", "") == "X" && event.value("tid", -1) == 1)
      ++sends[event["args"].value("stage", -1)];
  EXPECT_EQ(sends[0], 0);
  EXPECT_EQ(sends[1], 4);
  EXPECT_EQ(sends[2], 4);
  // The device's busy time is both stages' work.
  EXPECT_DOUBLE_EQ(usageOf(result, 0)->busySeconds, 4 * 2.0);
}

TEST(SimSharedDevice, OverlapsOfOtherPlannersAreRefused) {
  Profile profile = loadProfile({2, 4, 2});
  Plan plan = layerPlan({1, 0, 1}, "1f1b", 4, "pipedream");
  SimResult result = simulatePlan(profile, freeNetwork(), plan);
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.error.find("device 1 is assigned to stage 0 and stage 2"),
            std::string::npos)
      << result.error;
  SimOptions options;
  options.allowSharedDevices = true;
  EXPECT_TRUE(simulatePlan(profile, freeNetwork(), plan, options).ok);
  // Interleaved plans never share devices across positions.
  Plan interleaved = layerPlan({0, 0, 0, 1}, "interleaved", 2);
  interleaved.chunks = 2;
  result = simulatePlan(loadProfile({1, 1, 1, 1}), freeNetwork(), interleaved,
                        options);
  EXPECT_FALSE(result.ok);
}

TEST(SimSharedDevice, DeadlockIsStillReported) {
  // Stage 1 (device 0) runs F1 before F0 while stage 0 (device 1, shared
  // with stage 2) runs F0 B0 F1 B1: stage 0 waits for B0's gradient, which
  // needs F0 on stage 1, which comes after F1.
  Profile profile = loadProfile({2, 4, 2});
  Plan plan = layerPlan({1, 0, 1}, "1f1b-flush", 2);
  ScheduleResult schedule =
      generateSchedule(ScheduleKind::OneFOneBFlush, 3, 2, ScheduleOptions());
  ASSERT_TRUE(schedule.ok);
  using K = PassKind;
  schedule.ranks[0].schedule.segments = {
      {{{K::Forward, 0}, {K::Backward, 0}, {K::Forward, 1}, {K::Backward, 1}},
       1}};
  schedule.ranks[1].schedule.segments = {
      {{{K::Forward, 1}, {K::Forward, 0}, {K::Backward, 0}, {K::Backward, 1}},
       1}};
  SimResult result = simulateSchedule(profile, freeNetwork(), plan, schedule);
  EXPECT_FALSE(result.ok);
  EXPECT_NE(result.error.find("deadlock"), std::string::npos) << result.error;
  EXPECT_NE(result.error.find("device 0 (stage 1 replica 0) waits to run F "
                              "of microbatch 1 for the activation from "
                              "stage 0"),
            std::string::npos)
      << result.error;
  // The generated programs run on the shared device.
  schedule =
      generateSchedule(ScheduleKind::OneFOneBFlush, 3, 2, ScheduleOptions());
  SimResult ok = simulateSchedule(profile, freeNetwork(), plan, schedule);
  EXPECT_TRUE(ok.ok) << ok.error;
}

TEST(SimSharedDevice, EverySchedulesRunsAndIsDeterministic) {
  // Random special processors: nothing deadlocks, any two runs agree,
  // every device's busy time is its stages' work, and the iteration is at
  // least the busiest device's work.
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  for (int it = 0; it < 300; ++it) {
    const int stages = 2 + static_cast<int>(next() % 5);
    const int devices = 1 + static_cast<int>(next() % stages);
    std::vector<double> loads;
    std::vector<int64_t> saved;
    std::vector<int> placement;
    for (int s = 0; s < stages; ++s) {
      loads.push_back(1 + static_cast<double>(next() % 4));
      saved.push_back(1 + static_cast<int64_t>(next() % 5));
      placement.push_back(s < devices ? s : static_cast<int>(next() % devices));
    }
    Profile profile = loadProfile(loads, {}, saved, 1 << 10);
    const char *schedules[] = {"gpipe", "1f1b-flush", "1f1b", "2bw", "zb-h1"};
    const char *schedule = schedules[next() % 5];
    const int m = stages + static_cast<int>(next() % 4);
    Plan plan = layerPlan(placement, schedule, m);
    Topology topology = Topology::flat(8, 1e9, 1e-6);
    SCOPED_TRACE(std::string(schedule) + " it=" + std::to_string(it));
    SimResult a = simulatePlan(profile, topology, plan);
    ASSERT_TRUE(a.ok) << a.error;
    SimResult b = simulatePlan(profile, topology, plan);
    EXPECT_EQ(a.iterationSeconds, b.iterationSeconds);
    std::map<int, double> work;
    for (int s = 0; s < stages; ++s)
      work[placement[s]] += loads[s] * m;
    ASSERT_EQ(a.devices.size(), work.size());
    double busiest = 0;
    for (const DeviceUsage &usage : a.devices) {
      EXPECT_NEAR(usage.busySeconds, work[usage.device], 1e-9);
      busiest = std::max(busiest, work[usage.device]);
      EXPECT_EQ(usage.peakBytes, b.devices[&usage - &a.devices[0]].peakBytes);
    }
    EXPECT_GE(a.iterationSeconds, busiest - 1e-9);
  }
}
