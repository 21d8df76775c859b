//===- core_profiler_test.cpp - Per-op profiler ---------------------------===//
//
// Part of pipec's runtime tests. Checks bookkeeping (what is counted and how
// it is averaged), not speed.
//
//===----------------------------------------------------------------------===//

#include "core/error.h"
#include "core/profiler.h"

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
