//===- CostModel.cpp - Roofline models of named devices -------------------===//
//
// The device table behind --nn-annotate-costs and the paper-scale profiles
// (examples/profiles/make_profiles.py keeps a copy of these numbers and
// writes them into every profile's "device_model" field; a unit test checks
// that the two agree).
//
// Roofline: t = max(FLOPs / peak, bytes / bandwidth) + per-kernel overhead.
//
// Which numbers and why:
//  * Peaks are the vendors' dense datasheet figures (no 2:4 sparsity), in
//    the precision the name says. The plain names (v100, a100, h100) are
//    fp32 training, the configuration of PipeDream and DAPPLE (fp32
//    throughout, pipedream.md §6.2): FP32 on V100, TF32 on A100/H100
//    (PyTorch's and TensorFlow's default for fp32 matmuls on Ampere and
//    later). The -fp16 / -bf16 names are mixed-precision training on the
//    tensor cores, which is what PipeDream-2BW and Megatron (PTD-P) used:
//    the GPT-3 fidelity anchor of issue 3 is Selene's A100 80 GB at 312
//    TFLOP/s fp16 (thesis.md §6.3), i.e. `a100-80gb-fp16`.
//      V100 SXM2: 15.7 TFLOP/s FP32, 125 TFLOP/s fp16 tensor core,
//                 900 GB/s HBM2, 16 or 32 GiB.
//      A100 SXM4: 156 TFLOP/s TF32, 312 TFLOP/s fp16/bf16,
//                 1,555 GB/s (40 GB) or 2,039 GB/s (80 GB).
//      H100 SXM5: 494 TFLOP/s TF32, 989 TFLOP/s bf16/fp16 (dense; the
//                 datasheet's 494.7 / 989.4 rounded down), 3,350 GB/s
//                 HBM3, 80 GiB.
//      H200 SXM:  the H100's compute, 4,800 GB/s HBM3e, 141 GiB (the
//                 measuring GPU of bench/data's runs; a calibration on an
//                 H200 takes its shares of these numbers).
//  * Memory sizes are the marketed "GB", which for HBM are GiB (2^30).
//    Usable memory is a little less; topologies carry their own
//    device_memory_bytes, which is what planners check.
//  * Peaks are not derated: the model is an upper bound on speed, and the
//    same for every planner, which is what a yardstick needs. Measured
//    large-GEMM efficiency is typically 70-90% of these peaks.
//  * Kernel launch overheads of 4-5 us are typical CUDA launch plus
//    framework dispatch costs; they matter only for small layers.
//  * `cpu` is a conservative two-core AVX2 figure for the build machines of
//    this project (50 GFLOP/s, 20 GB/s); memory 0 means "not modelled".
// The cpu/v100/a100/h100 rows equal the private table that
// passes/AnnotateCosts.cpp still keeps, so switching that pass to this API
// changes no cost.
//
//===----------------------------------------------------------------------===//

#include "pipec/CostModel.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

namespace pipec {

namespace {

constexpr int64_t kGiB = int64_t(1) << 30;
constexpr const char *kDeviceFormat = "pipec.device/1";

/// One row of the device table.
struct DeviceRow {
  const char *name;
  double peakFlops;
  double bandwidth;
  int64_t memoryBytes;
  double opOverhead;
};

// clang-format off
constexpr DeviceRow kDevices[] = {
    // name              peak FLOP/s  bytes/s     memory     overhead
    {"cpu",              5.0e10,      2.0e10,     0,         1.0e-6},
    {"v100",             15.7e12,     9.0e11,     16 * kGiB, 5.0e-6},
    {"v100-32gb",        15.7e12,     9.0e11,     32 * kGiB, 5.0e-6},
    {"v100-fp16",        125.0e12,    9.0e11,     16 * kGiB, 5.0e-6},
    {"v100-32gb-fp16",   125.0e12,    9.0e11,     32 * kGiB, 5.0e-6},
    {"a100",             156.0e12,    1.555e12,   40 * kGiB, 5.0e-6},
    {"a100-80gb",        156.0e12,    2.039e12,   80 * kGiB, 5.0e-6},
    {"a100-fp16",        312.0e12,    1.555e12,   40 * kGiB, 5.0e-6},
    {"a100-80gb-fp16",   312.0e12,    2.039e12,   80 * kGiB, 5.0e-6},
    {"h100",             494.0e12,    3.35e12,    80 * kGiB, 4.0e-6},
    {"h100-bf16",        989.0e12,    3.35e12,    80 * kGiB, 4.0e-6},
    {"h200",             494.0e12,    4.8e12,     141 * kGiB, 4.0e-6},
    {"h200-bf16",        989.0e12,    4.8e12,     141 * kGiB, 4.0e-6},
};
// clang-format on

} // namespace

std::string costKind(const std::string &op) {
  return op == "gemm" ? "matmul" : op;
}

double DeviceModel::seconds(double flops, double bytes,
                            const std::string &kind) const {
  if (auto it = kinds.find(costKind(kind));
      it != kinds.end() && it->second.efficiency > 0) {
    double compute = peakFlops > 0 ? std::max(flops, 0.0) / peakFlops : 0.0;
    double memory = bandwidth > 0 ? std::max(bytes, 0.0) / bandwidth : 0.0;
    const double roofline = std::max(compute, memory);
    if (roofline >= it->second.from &&
        (it->second.upTo <= 0 || roofline <= it->second.upTo))
      return roofline / it->second.efficiency + it->second.overhead;
  }
  const double peak = peakFlops * computeEfficiency,
               bw = bandwidth * bandwidthEfficiency;
  double compute = peak > 0 ? std::max(flops, 0.0) / peak : 0.0;
  double memory = bw > 0 ? std::max(bytes, 0.0) / bw : 0.0;
  return std::max(compute, memory) + opOverhead;
}

std::optional<DeviceModel> deviceModel(const std::string &name) {
  for (const DeviceRow &row : kDevices) {
    if (name != row.name)
      continue;
    DeviceModel model;
    model.name = row.name;
    model.peakFlops = row.peakFlops;
    model.bandwidth = row.bandwidth;
    model.memoryBytes = row.memoryBytes;
    model.opOverhead = row.opOverhead;
    return model;
  }
  return std::nullopt;
}

std::string deviceModelToJson(const DeviceModel &model) {
  nlohmann::ordered_json j = {
      {"format", kDeviceFormat},
      {"name", model.name},
      {"peak_flops", model.peakFlops},
      {"bandwidth", model.bandwidth},
      {"memory_bytes", model.memoryBytes},
      {"op_overhead", model.opOverhead},
      {"compute_efficiency", model.computeEfficiency},
      {"bandwidth_efficiency", model.bandwidthEfficiency}};
  if (!model.kinds.empty()) {
    nlohmann::ordered_json kinds = nlohmann::ordered_json::object();
    for (const auto &[kind, fit] : model.kinds)
      kinds[kind] = {{"efficiency", fit.efficiency},
                     {"overhead", fit.overhead},
                     {"from", fit.from},
                     {"up_to", fit.upTo}};
    j["kinds"] = kinds;
  }
  return j.dump(2) + "\n";
}

std::optional<DeviceModel> deviceModelFromJson(const std::string &text,
                                               std::string &error) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    error = "not a JSON object";
    return std::nullopt;
  }
  auto format = j.find("format");
  if (format == j.end() || !format->is_string() ||
      format->get<std::string>() != kDeviceFormat) {
    error = std::string("\"format\" must be \"") + kDeviceFormat + "\"";
    return std::nullopt;
  }
  DeviceModel m;
  if (auto name = j.find("name"); name != j.end() && name->is_string())
    m.name = name->get<std::string>();
  auto number = [&](const char *key, double &out, bool positive) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number() ||
        !std::isfinite(it->get<double>()) || it->get<double>() < 0 ||
        (positive && it->get<double>() <= 0)) {
      error = std::string("\"") + key + "\" must be a " +
              (positive ? "positive" : "non-negative") + " number";
      return false;
    }
    out = it->get<double>();
    return true;
  };
  double memory = 0;
  if (!number("peak_flops", m.peakFlops, true) ||
      !number("bandwidth", m.bandwidth, true) ||
      !number("memory_bytes", memory, false) ||
      !number("op_overhead", m.opOverhead, false) ||
      !number("compute_efficiency", m.computeEfficiency, true) ||
      !number("bandwidth_efficiency", m.bandwidthEfficiency, true))
    return std::nullopt;
  if (memory >= 9.2e18) { // beyond int64_t
    error = "\"memory_bytes\" is too large (at most 9.2e18 bytes)";
    return std::nullopt;
  }
  m.memoryBytes = static_cast<int64_t>(memory);
  if (auto kinds = j.find("kinds"); kinds != j.end()) {
    if (!kinds->is_object()) {
      error = "\"kinds\" must map op kinds to {efficiency, overhead}";
      return std::nullopt;
    }
    for (auto it = kinds->begin(); it != kinds->end(); ++it) {
      auto field = [&](const char *key, double &out, bool positive) {
        if (!it->is_object())
          return false;
        auto f = it->find(key);
        if (f == it->end() || !f->is_number() ||
            !std::isfinite(f->get<double>()) || f->get<double>() < 0 ||
            (positive && f->get<double>() <= 0))
          return false;
        out = f->get<double>();
        return true;
      };
      DeviceModel::KindFit fit;
      if (!field("efficiency", fit.efficiency, true) ||
          !field("overhead", fit.overhead, false) ||
          !field("up_to", fit.upTo, false) ||
          (it->contains("from") && !field("from", fit.from, false))) {
        error = "\"kinds\": \"" + it.key() +
                "\" needs a positive \"efficiency\" and non-negative "
                "\"overhead\" and \"up_to\"";
        return std::nullopt;
      }
      if (fit.upTo > 0 && fit.from > fit.upTo) {
        error = "\"kinds\": \"" + it.key() + "\" is valid from " +
                std::to_string(fit.from) + " s up to " +
                std::to_string(fit.upTo) +
                " s: \"from\" must not exceed \"up_to\" (0: no limit)";
        return std::nullopt;
      }
      m.kinds[it.key()] = fit;
    }
  }
  return m;
}

std::optional<DeviceModel> deviceModelByNameOrFile(const std::string &name,
                                                   std::string &error) {
  const std::string suffix = ".json";
  if (name.size() > suffix.size() &&
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
    std::ifstream in(name);
    if (!in) {
      error = "cannot read device model '" + name + "'";
      return std::nullopt;
    }
    std::stringstream text;
    text << in.rdbuf();
    std::optional<DeviceModel> m = deviceModelFromJson(text.str(), error);
    if (!m)
      error = "device model '" + name + "': " + error;
    return m;
  }
  if (std::optional<DeviceModel> m = deviceModel(name))
    return m;
  std::string known;
  for (const std::string &n : deviceModelNames())
    known += (known.empty() ? "" : ", ") + n;
  error = "unknown device model '" + name + "' (known: " + known +
          ", or a pipec.device/1 file NAME.json)";
  return std::nullopt;
}

std::vector<std::string> deviceModelNames() {
  std::vector<std::string> names;
  for (const DeviceRow &row : kDevices)
    names.push_back(row.name);
  return names;
}

} // namespace pipec
