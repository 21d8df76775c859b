//===- core_profiler_test.cpp - Per-op profiler ---------------------------===//
//
// Part of pipec's runtime tests. Checks bookkeeping (what is counted and how
// it is averaged), not speed.
//
//===----------------------------------------------------------------------===//

#include "core/error.h"
#include "core/profiler.h"
#include "core/timeline.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <thread>

using namespace pipec::rt;

namespace {

StageDesc twoOpStage() {
  StageDesc d;
  d.stage = 0;
  d.microbatches = 2;
  d.microbatch = 4;
  d.ops = {{"/fc/Gemm", "Gemm", 64, 80, 32, 96, 128, 48, {}},
           {"/relu", "Relu", 64, 0, 64, 0, 0, 0, {"/fc/Gemm"}}};
  d.ops[0].savedReads = {{1, 32}};
  d.ops[1].bwdRecomputedScratchBytes = 32;
  return d;
}

void sleepOp(Profiler &p, int64_t op, int64_t phase, int ms) {
  p.begin(op, phase);
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  p.end(op, phase);
}

} // namespace

TEST(CoreProfiler, AveragesPerMicrobatchAndSkipsWarmup) {
  StageDesc d = twoOpStage();
  Profiler p;
  p.enable(d.ops.size());
  // Warm-up step: long times that must not be counted.
  p.setCounting(false);
  sleepOp(p, 0, 0, 50);
  // Two counted steps of two microbatches each.
  p.setCounting(true);
  for (int step = 0; step < 2; ++step) {
    for (int mb = 0; mb < 2; ++mb) {
      sleepOp(p, 0, 0, 2);
      sleepOp(p, 1, 1, 1);
    }
    sleepOp(p, 0, 2, 1);
    p.stepCounted();
  }
  EXPECT_EQ(p.calls(0, 0), 4); // the warm-up call is not counted
  EXPECT_EQ(p.calls(1, 1), 2 * 2);
  EXPECT_EQ(p.calls(0, 2), 2);

  nlohmann::json j = nlohmann::json::parse(p.toJson(d, "cpu"));
  EXPECT_EQ(j["format"], "pipec.profile/1");
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["microbatch"], 4);
  ASSERT_EQ(j["ops"].size(), 2u);
  const auto &gemm = j["ops"][0];
  EXPECT_EQ(gemm["name"], "/fc/Gemm");
  EXPECT_EQ(gemm["op"], "Gemm");
  EXPECT_EQ(gemm["param_bytes"], 80);
  EXPECT_EQ(gemm["saved_bytes"], 32);
  EXPECT_EQ(gemm["fwd_scratch_bytes"], 96);
  EXPECT_EQ(gemm["bwd_scratch_bytes"], 128);
  EXPECT_EQ(gemm["carried_bytes"], 48);
  EXPECT_EQ(gemm["saved_reads"], nlohmann::json::parse("[[1, 32]]"));
  EXPECT_EQ(j["ops"][1]["bwd_scratch_recomputed_bytes"], 32);
  EXPECT_FALSE(j["ops"][1].contains("saved_reads"));
  EXPECT_EQ(gemm["out_bytes"], 64);
  // Mean per microbatch = total / (steps * microbatches); per step for opt.
  EXPECT_DOUBLE_EQ(gemm["fwd_s"].get<double>(), p.seconds(0, 0) / 4);
  EXPECT_DOUBLE_EQ(gemm["opt_s"].get<double>(), p.seconds(0, 2) / 2);
  EXPECT_GE(gemm["fwd_s"].get<double>(), 0.002);
  EXPECT_EQ(gemm["bwd_s"].get<double>(), 0.0);
  EXPECT_EQ(j["ops"][1]["inputs"][0], "/fc/Gemm");
  EXPECT_DOUBLE_EQ(j["ops"][1]["bwd_s"].get<double>(), p.seconds(1, 1) / 4);
}

TEST(CoreProfiler, RejectsOutOfRangeHooks) {
  Profiler p;
  p.enable(2);
  EXPECT_THROW(p.begin(2, 0), RtError);
  EXPECT_THROW(p.begin(0, 3), RtError);
  EXPECT_THROW(p.begin(-1, 0), RtError);
  EXPECT_THROW(p.end(1, 1), RtError); // end without begin
}

// A device with a queue clock (CUDA events): begin/end take marks, and the
// spans get their times only from resolve(), once per step.
TEST(CoreProfiler, QueueMarksAreResolvedPerStep) {
  StageDesc d = twoOpStage();
  Profiler p;
  p.enable(d.ops.size());
  p.setCounting(false); // warm-up: marked, but not counted
  p.begin(0, 0, 0);
  p.end(0, 0, 1);
  p.resolve({10.0, 20.0});
  EXPECT_EQ(p.seconds(0, 0), 0.0);
  p.setCounting(true);
  for (int step = 0; step < 2; ++step) {
    // Marks 0..5 of the step: op 0 fwd [0,1] and [2,3], op 1 bwd [4,5].
    p.begin(0, 0, 0);
    p.end(0, 0, 1);
    p.begin(0, 0, 2);
    p.end(0, 0, 3);
    p.begin(1, 1, 4);
    p.end(1, 1, 5);
    EXPECT_EQ(p.seconds(0, 0), step * 0.5); // nothing before resolve()
    p.resolve({1.0, 1.25, 1.5, 1.75, 2.0, 2.5});
    p.stepCounted();
  }
  EXPECT_DOUBLE_EQ(p.seconds(0, 0), 1.0);
  EXPECT_DOUBLE_EQ(p.seconds(1, 1), 1.0);
  EXPECT_EQ(p.calls(0, 0), 4);
  nlohmann::json j = nlohmann::json::parse(p.toJson(d, "cuda:0 (test)"));
  EXPECT_EQ(j["timing"], "device-queue");
  EXPECT_DOUBLE_EQ(j["ops"][0]["fwd_s"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(j["ops"][1]["bwd_s"].get<double>(), 0.25);
  // A mark without a time (two steps' marks mixed) is an error, not a guess.
  p.begin(0, 0, 0);
  p.end(0, 0, 7);
  EXPECT_THROW(p.resolve({1.0}), RtError);
}

TEST(CoreProfiler, HostTimingIsNamed) {
  StageDesc d = twoOpStage();
  Profiler p;
  p.enable(d.ops.size());
  sleepOp(p, 0, 0, 1);
  nlohmann::json j = nlohmann::json::parse(p.toJson(d, "cpu"));
  EXPECT_EQ(j["timing"], "host");
}

TEST(CoreTimeline, QueueMarkedSpansTakeTheirMarksTimes) {
  Timeline t;
  t.enable(0, 0, 0);
  const double zero = std::chrono::duration<double>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  t.start();
  t.begin(Timeline::Forward, 3, 0, 0);
  t.end(Timeline::Forward, 1);
  t.begin(Timeline::Recv, 4, 0); // host-timed, between the marks
  t.end(Timeline::Recv);
  EXPECT_EQ(t.seconds(Timeline::Forward), 0.0);
  t.resolve({zero + 0.5, zero + 0.75});
  EXPECT_NEAR(t.seconds(Timeline::Forward), 0.25, 1e-9);
  nlohmann::json j = nlohmann::json::parse(t.toJson());
  // Two metadata events, then the spans in the order they ended.
  ASSERT_EQ(j.size(), 4u);
  EXPECT_EQ(j[2]["name"], "F3");
  EXPECT_NEAR(j[2]["ts"].get<double>(), 0.5e6, 2e3); // zero read 2 ms apart
  EXPECT_NEAR(j[2]["dur"].get<double>(), 0.25e6, 1e-3);
  EXPECT_EQ(j[3]["name"], "recv");
}

TEST(CoreProfiler, MultiTensorUpdatesAreSharedByElements) {
  // One multi-tensor call (profiler op 2, after the two layer ops) updates
  // op 0's 30 elements and op 1's 10: its time splits 3:1, on top of what
  // op 0 measured alone.
  StageDesc d = twoOpStage();
  d.fusedUpdates = {{{0, 1}, {30, 10}}};
  Profiler p;
  p.enable(d.ops.size() + d.fusedUpdates.size());
  p.setCounting(true);
  sleepOp(p, 2, 2, 8);
  sleepOp(p, 0, 2, 2);
  p.stepCounted();
  const double call = p.seconds(2, 2), alone = p.seconds(0, 2);
  nlohmann::json j = nlohmann::json::parse(p.toJson(d, "cpu"));
  const double op0 = j["ops"][0]["opt_s"], op1 = j["ops"][1]["opt_s"];
  EXPECT_NEAR(op1, call / 4, 1e-12);
  EXPECT_NEAR(op0, alone + 3 * call / 4, 1e-12);
  EXPECT_EQ(j["ops"].size(), 2u); // the call is not an op of the profile
}

TEST(CoreProfiler, StepTimeBeyondTheOpsIsOverheadPerOpCall) {
  // One stage that is the whole model: each counted step takes `wall`, its
  // ops (two forwards and a backward per microbatch, two microbatches) take
  // what they measured; the rest, per forward or backward call, is the
  // profile's op_overhead_s. A stage of several writes neither (its wall
  // time holds its waits for messages).
  StageDesc d = twoOpStage();
  d.numStages = 1;
  Profiler p;
  p.enable(d.ops.size());
  p.setCounting(true);
  for (int step = 0; step < 2; ++step) {
    for (int mb = 0; mb < 2; ++mb) {
      sleepOp(p, 0, 0, 1);
      sleepOp(p, 1, 0, 1);
      sleepOp(p, 0, 1, 1);
    }
    sleepOp(p, 0, 2, 1); // the update is an op's time, not overhead
    p.stepCounted(0.050);
  }
  double ops = 0;
  for (size_t op = 0; op < 2; ++op)
    for (int phase = 0; phase < Profiler::kPhases; ++phase)
      ops += p.seconds(op, phase);
  nlohmann::json j = nlohmann::json::parse(p.toJson(d, "cpu"));
  EXPECT_NEAR(j["step_s"].get<double>(), 0.050, 1e-12);
  // 6 forward and backward calls per step.
  EXPECT_NEAR(j["op_overhead_s"].get<double>(), (0.050 - ops / 2) / 6, 1e-12);
  EXPECT_GT(j["op_overhead_s"].get<double>(), 0);

  d.numStages = 2;
  nlohmann::json two = nlohmann::json::parse(p.toJson(d, "cpu"));
  EXPECT_FALSE(two.contains("op_overhead_s"));
  EXPECT_FALSE(two.contains("step_s"));
}
