//===- device_model_test.cpp - Roofline device models ---------------------===//
//
// deviceModel / deviceModelNames against the datasheet numbers chosen in
// lib/Cost/CostModel.cpp, and the roofline t = max(F/peak, B/bw) + overhead.
//
//===----------------------------------------------------------------------===//

#include "pipec/CostModel.h"

#include <gtest/gtest.h>

#include <set>

using namespace pipec;

namespace {

constexpr int64_t kGiB = int64_t(1) << 30;

TEST(CostDeviceModel, NamedDevicesHaveTheirDatasheetNumbers) {
  struct Expected {
    const char *name;
    double peak;
    double bandwidth;
    int64_t memory;
  } expected[] = {
      {"v100", 15.7e12, 0.9e12, 16 * kGiB},
      {"v100-32gb", 15.7e12, 0.9e12, 32 * kGiB},
      {"v100-fp16", 125e12, 0.9e12, 16 * kGiB},
      {"a100", 156e12, 1.555e12, 40 * kGiB},
      {"a100-80gb", 156e12, 2.039e12, 80 * kGiB},
      {"a100-fp16", 312e12, 1.555e12, 40 * kGiB},
      {"a100-80gb-fp16", 312e12, 2.039e12, 80 * kGiB},
      {"h100", 494e12, 3.35e12, 80 * kGiB},
      {"h100-bf16", 989e12, 3.35e12, 80 * kGiB},
      {"h200", 494e12, 4.8e12, 141 * kGiB},
      {"h200-bf16", 989e12, 4.8e12, 141 * kGiB},
  };
  for (const Expected &e : expected) {
    SCOPED_TRACE(e.name);
    std::optional<DeviceModel> model = deviceModel(e.name);
    ASSERT_TRUE(model.has_value());
    EXPECT_EQ(model->name, e.name);
    EXPECT_DOUBLE_EQ(model->peakFlops, e.peak);
    EXPECT_DOUBLE_EQ(model->bandwidth, e.bandwidth);
    EXPECT_EQ(model->memoryBytes, e.memory);
    EXPECT_GT(model->opOverhead, 0);
    EXPECT_LT(model->opOverhead, 1e-4);
  }
}

TEST(CostDeviceModel, CpuIsKnownAndSlowerThanEveryGpu) {
  std::optional<DeviceModel> cpu = deviceModel("cpu");
  ASSERT_TRUE(cpu.has_value());
  for (const std::string &name : deviceModelNames()) {
    if (name == "cpu")
      continue;
    std::optional<DeviceModel> gpu = deviceModel(name);
    ASSERT_TRUE(gpu.has_value()) << name;
    EXPECT_GT(gpu->peakFlops, cpu->peakFlops) << name;
    EXPECT_GT(gpu->bandwidth, cpu->bandwidth) << name;
  }
}

TEST(CostDeviceModel, UnknownNamesAreRefused) {
  EXPECT_FALSE(deviceModel("").has_value());
  EXPECT_FALSE(deviceModel("tpu").has_value());
  EXPECT_FALSE(deviceModel("V100").has_value()); // names are lowercase
  EXPECT_FALSE(deviceModel("a100-fp8").has_value());
}

TEST(CostDeviceModel, NamesListIsCompleteAndResolvable) {
  std::vector<std::string> names = deviceModelNames();
  std::set<std::string> unique(names.begin(), names.end());
  EXPECT_EQ(unique.size(), names.size());
  for (const char *required :
       {"cpu", "v100", "a100", "h100", "v100-fp16", "a100-fp16", "h100-bf16"})
    EXPECT_TRUE(unique.count(required)) << required;
  for (const std::string &name : names) {
    std::optional<DeviceModel> model = deviceModel(name);
    ASSERT_TRUE(model.has_value()) << name;
    EXPECT_EQ(model->name, name);
  }
}

TEST(CostDeviceModel, MixedPrecisionDoublesOrBetterThePeakNotTheBandwidth) {
  for (auto [fp32, half] :
       {std::pair{"v100", "v100-fp16"}, std::pair{"a100", "a100-fp16"},
        std::pair{"a100-80gb", "a100-80gb-fp16"},
        std::pair{"h100", "h100-bf16"}, std::pair{"h200", "h200-bf16"}}) {
    SCOPED_TRACE(half);
    DeviceModel a = *deviceModel(fp32), b = *deviceModel(half);
    EXPECT_GE(b.peakFlops, 2 * a.peakFlops - 1e9);
    EXPECT_DOUBLE_EQ(a.bandwidth, b.bandwidth);
    EXPECT_EQ(a.memoryBytes, b.memoryBytes);
  }
}

TEST(CostDeviceModel, RooflineComputeBound) {
  DeviceModel v100 = *deviceModel("v100");
  // 15.7 GFLOP on 1 MB: 1 ms of compute, ~1.1 us of memory.
  EXPECT_NEAR(v100.seconds(15.7e9, 1e6), 1e-3 + 5e-6, 1e-12);
}

TEST(CostDeviceModel, RooflineMemoryBound) {
  DeviceModel a100 = *deviceModel("a100");
  // 1.555 GB at 1.555 TB/s: 1 ms; 1 GFLOP would take 6.4 us.
  EXPECT_NEAR(a100.seconds(1e9, 1.555e9), 1e-3 + 5e-6, 1e-12);
}

TEST(CostDeviceModel, RooflineRidgePointAndOverhead) {
  DeviceModel h100 = *deviceModel("h100");
  double ridge = h100.peakFlops / h100.bandwidth; // FLOP per byte
  double bytes = 1e9;
  double atRidge = h100.seconds(ridge * bytes, bytes);
  EXPECT_NEAR(atRidge, bytes / h100.bandwidth + h100.opOverhead, 1e-12);
  // No work still costs one launch.
  EXPECT_DOUBLE_EQ(h100.seconds(0, 0), h100.opOverhead);
  // Negative inputs are treated as no work.
  EXPECT_DOUBLE_EQ(h100.seconds(-1, -1), h100.opOverhead);
}

TEST(CostDeviceModel, HandBuiltModelWithoutPeaksCostsOnlyOverhead) {
  DeviceModel model;
  model.opOverhead = 2e-6;
  EXPECT_DOUBLE_EQ(model.seconds(1e12, 1e12), 2e-6);
}

} // namespace
