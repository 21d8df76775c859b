//===- calibrate_test.cpp - Device models fitted to measured profiles -----===//
//
// calibrateDevice (pipec/Calibrate.h) on profiles whose kernels run at a
// known share of a model's peak and bandwidth, the pipec.device/1 round
// trip, and the profile's work fields.
//
//===----------------------------------------------------------------------===//

#include "pipec/Calibrate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

using namespace pipec;

namespace {

/// A device with round numbers: 1 TFLOP/s, 100 GB/s, 1 us per kernel.
DeviceModel roundDevice() {
  DeviceModel d;
  d.name = "round";
  d.peakFlops = 1e12;
  d.bandwidth = 1e11;
  d.opOverhead = 1e-6;
  return d;
}

/// One op whose forward and backward ran at `computeShare` of the peak
/// (compute-bound: 1e9 FLOPs over 1e6 bytes) or at `memoryShare` of the
/// bandwidth (memory-bound: 1e6 FLOPs over 1e8 bytes).
ProfileOp op(bool computeBound, double computeShare, double memoryShare) {
  const DeviceModel d = roundDevice();
  ProfileOp o;
  o.op = computeBound ? "matmul" : "add";
  o.fwdFlops = computeBound ? 1e9 : 1e6;
  o.bwdFlops = 2 * o.fwdFlops;
  o.touchedBytes = computeBound ? 1e6 : 1e8;
  auto time = [&](double flops, double bytes) {
    return computeBound ? flops / (d.peakFlops * computeShare) + d.opOverhead
                        : bytes / (d.bandwidth * memoryShare) + d.opOverhead;
  };
  o.fwdSeconds = time(o.fwdFlops, o.touchedBytes);
  o.bwdSeconds = time(o.bwdFlops, 2 * o.touchedBytes);
  return o;
}

TEST(Calibrate, RecoversTheSharesOfPeakAndBandwidth) {
  Profile p;
  for (int i = 0; i < 3; ++i)
    p.ops.push_back(op(true, 0.6, 0.8));
  p.ops.push_back(op(false, 0.6, 0.8));
  p.ops.push_back(ProfileOp()); // no counted work: ignored
  p.ops.back().fwdSeconds = 1;
  Calibration c = calibrateDevice(p, roundDevice());
  ASSERT_TRUE(c.ok) << c.error;
  EXPECT_EQ(c.compute.kernels, 6);
  EXPECT_EQ(c.memory.kernels, 2);
  EXPECT_NEAR(c.model.computeEfficiency, 0.6, 1e-9);
  EXPECT_NEAR(c.model.bandwidthEfficiency, 0.8, 1e-9);
  // Per kind: a line through the kernels (forward and backward differ
  // in size by 2x), here the exact share and overhead.
  ASSERT_EQ(c.model.kinds.size(), 2u);
  EXPECT_NEAR(c.model.kinds.at("matmul").efficiency, 0.6, 1e-9);
  EXPECT_NEAR(c.model.kinds.at("matmul").overhead, 1e-6, 1e-12);
  EXPECT_NEAR(c.model.kinds.at("add").efficiency, 0.8, 1e-9);
  // The calibrated model predicts every kernel; the datasheet is faster.
  EXPECT_NEAR(c.modelSeconds, c.measuredSeconds, 1e-9 * c.measuredSeconds);
  EXPECT_LT(c.baseSeconds, 0.7 * c.measuredSeconds);
  for (const ProfileOp &o : p.ops)
    if (o.fwdFlops > 0) {
      EXPECT_NEAR(predictedForward(c.model, o), o.fwdSeconds, 1e-12);
      EXPECT_NEAR(predictedBackward(c.model, o), o.bwdSeconds, 1e-12);
    }
}

TEST(Calibrate, KindsOverrideTheClasses) {
  // Two compute-bound kinds at different shares: the class averages them
  // (by time), each kind keeps its own.
  Profile p;
  p.ops.push_back(op(true, 0.5, 1.0));
  p.ops.push_back(op(true, 1.0, 1.0));
  p.ops[1].op = "conv";
  Calibration c = calibrateDevice(p, roundDevice());
  ASSERT_TRUE(c.ok) << c.error;
  EXPECT_NEAR(c.model.kinds.at("matmul").efficiency, 0.5, 1e-9);
  EXPECT_NEAR(c.model.kinds.at("conv").efficiency, 1.0, 1e-9);
  EXPECT_NEAR(c.model.computeEfficiency, 2.0 / 3.0, 1e-9);
  EXPECT_NEAR(predictedForward(c.model, p.ops[1]), p.ops[1].fwdSeconds, 1e-12);
  // An unknown kind falls back to the class: 1e9 FLOPs at 2/3 of 1e12;
  // gemm runs the same kernels as matmul, and shares its fit.
  EXPECT_NEAR(c.model.seconds(1e9, 0, "softmax"), 1.5e-3 + 1e-6, 1e-12);
  EXPECT_NEAR(c.model.seconds(1e9, 0, "gemm"), 2e-3 + 1e-6, 1e-12);
  std::string error;
  std::optional<DeviceModel> back =
      deviceModelFromJson(deviceModelToJson(c.model), error);
  ASSERT_TRUE(back) << error;
  EXPECT_EQ(back->kinds, c.model.kinds);
  // Beyond four times its largest kernel a kind uses the class: a matmul
  // of 1e11 FLOPs (50x the fitted ones) at 2/3 of the peak.
  EXPECT_EQ(c.model.kinds.at("matmul").upTo, 4 * 2e-3);
  EXPECT_EQ(c.model.kinds.at("matmul").from, 1e-3 / 4);
  // Below a quarter of its smallest kernel, too: 1e7 FLOPs (10 us at the
  // peak) at the class's 2/3 plus the base's 1 us.
  EXPECT_NEAR(c.model.seconds(1e7, 0, "matmul"), 1.5e-5 + 1e-6, 1e-12);
  EXPECT_NEAR(c.model.seconds(1e11, 0, "matmul"), 0.15 + 1e-6, 1e-9);
  EXPECT_NEAR(c.model.seconds(1e9, 0, "matmul"), 2e-3 + 1e-6, 1e-12);
}

TEST(Calibrate, AKindSpanningExactlyOneAndAHalfGetsItsLine) {
  // An element-wise kind whose backward moves 3 tensors where its forward
  // moves 2 (softmax, GeLU, dropout in gpt3_layer_kernels.py's profile):
  // their rooflines differ by exactly 1.5x, the least span a line is fitted
  // over. Whether 1.5 x the smaller one rounds above the larger must not
  // decide it: every size gets the line (share and overhead recovered).
  const DeviceModel d = roundDevice();
  int lines = 0, sizes = 0;
  for (double n = 1234567; n < 5e8; n *= 1.37) {
    Profile p;
    for (double bytes : {2 * n, 3 * n}) {
      ProfileOp o;
      o.op = "softmax";
      o.fwdFlops = bytes / 100;
      o.touchedBytes = bytes;
      o.fwdSeconds = bytes / (d.bandwidth * 0.7) + 3e-6;
      p.ops.push_back(o);
    }
    Calibration c = calibrateDevice(p, d);
    ASSERT_TRUE(c.ok) << c.error;
    ++sizes;
    const DeviceModel::KindFit &fit = c.model.kinds.at("softmax");
    if (std::abs(fit.overhead - 3e-6) < 1e-12 &&
        std::abs(fit.efficiency - 0.7) < 1e-9)
      ++lines;
  }
  EXPECT_EQ(lines, sizes);
}

TEST(Calibrate, AClassWithoutKernelsKeepsItsEfficiency) {
  Profile p;
  p.ops.push_back(op(true, 2.0, 1.0)); // faster than a conservative peak
  DeviceModel base = roundDevice();
  base.bandwidthEfficiency = 0.5;
  Calibration c = calibrateDevice(p, base);
  ASSERT_TRUE(c.ok) << c.error;
  EXPECT_NEAR(c.model.computeEfficiency, 2.0, 1e-9);
  EXPECT_EQ(c.model.bandwidthEfficiency, 0.5);
  EXPECT_EQ(c.memory.kernels, 0);
}

TEST(Calibrate, AProfileWithoutWorkIsRefused) {
  Profile p;
  p.ops.resize(2);
  p.ops[0].fwdSeconds = p.ops[1].bwdSeconds = 1e-3;
  Calibration c = calibrateDevice(p, roundDevice());
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("profile the model again"), std::string::npos)
      << c.error;
  DeviceModel none;
  none.name = "none";
  EXPECT_FALSE(calibrateDevice(p, none).ok);
}

TEST(Calibrate, DeviceModelJsonRoundTripsAndIsChecked) {
  DeviceModel d = roundDevice();
  d.memoryBytes = int64_t(1) << 34;
  d.computeEfficiency = 0.7;
  d.bandwidthEfficiency = 1.25;
  std::string error;
  std::optional<DeviceModel> back =
      deviceModelFromJson(deviceModelToJson(d), error);
  ASSERT_TRUE(back) << error;
  EXPECT_EQ(back->name, "round");
  EXPECT_EQ(back->peakFlops, d.peakFlops);
  EXPECT_EQ(back->bandwidth, d.bandwidth);
  EXPECT_EQ(back->memoryBytes, d.memoryBytes);
  EXPECT_EQ(back->opOverhead, d.opOverhead);
  EXPECT_EQ(back->computeEfficiency, 0.7);
  EXPECT_EQ(back->bandwidthEfficiency, 1.25);
  EXPECT_NEAR(back->seconds(1e9, 0), 1e9 / (1e12 * 0.7) + 1e-6, 1e-15);

  EXPECT_FALSE(deviceModelFromJson("[]", error));
  EXPECT_FALSE(deviceModelFromJson(R"({"format": "pipec.device/2"})", error));
  EXPECT_NE(error.find("pipec.device/1"), std::string::npos) << error;
  std::string bad = deviceModelToJson(d);
  bad.replace(bad.find("0.7"), 3, "-0.7");
  EXPECT_FALSE(deviceModelFromJson(bad, error));
  EXPECT_NE(error.find("compute_efficiency"), std::string::npos) << error;
  // A memory size past int64_t (found by scripts/fuzz.sh formats).
  std::string huge = deviceModelToJson(d);
  const std::string memoryKey = "\"memory_bytes\": ";
  const size_t at = huge.find(memoryKey) + memoryKey.size();
  huge.replace(at, huge.find(',', at) - at, "1.5e42");
  EXPECT_FALSE(deviceModelFromJson(huge, error)) << huge;
  EXPECT_NE(error.find("memory_bytes"), std::string::npos) << error;
  // A kind's line valid from a time past its end.
  DeviceModel inverted = d;
  DeviceModel::KindFit fit;
  fit.efficiency = 0.5;
  fit.from = 1;
  fit.upTo = 0.5;
  inverted.kinds["matmul"] = fit;
  EXPECT_FALSE(deviceModelFromJson(deviceModelToJson(inverted), error));
  EXPECT_NE(error.find("\"from\" must not exceed"), std::string::npos) << error;

  // By name or from a file.
  EXPECT_TRUE(deviceModelByNameOrFile("h100", error));
  EXPECT_FALSE(deviceModelByNameOrFile("tpu", error));
  EXPECT_NE(error.find("known: cpu"), std::string::npos) << error;
  const std::string path = ::testing::TempDir() + "calibrated-round.json";
  {
    std::ofstream out(path);
    out << deviceModelToJson(d);
  }
  std::optional<DeviceModel> file = deviceModelByNameOrFile(path, error);
  ASSERT_TRUE(file) << error;
  EXPECT_EQ(file->computeEfficiency, 0.7);
  std::remove(path.c_str());
  EXPECT_FALSE(deviceModelByNameOrFile(path, error));
  EXPECT_NE(error.find("cannot read"), std::string::npos) << error;
}

TEST(Calibrate, ProfileCarriesTheWork) {
  Profile p;
  p.ops.push_back(op(true, 0.5, 0.5));
  p.ops[0].name = "mm";
  ProfileResult back = profileFromJson(profileToJson(p));
  ASSERT_TRUE(back.ok) << back.error;
  EXPECT_EQ(back.profile.ops[0].fwdFlops, 1e9);
  EXPECT_EQ(back.profile.ops[0].bwdFlops, 2e9);
  EXPECT_EQ(back.profile.ops[0].touchedBytes, 1e6);
  EXPECT_FALSE(profileFromJson(R"({"format": "pipec.profile/1", "ops": [
      {"name": "a", "fwd_s": 1, "bwd_s": 1, "fwd_flops": -3}]})")
                   .ok);
}

} // namespace
