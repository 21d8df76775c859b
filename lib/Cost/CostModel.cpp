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

#include <algorithm>
#include <cmath>

namespace pipec {

namespace {

constexpr int64_t kGiB = int64_t(1) << 30;

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
};
// clang-format on

} // namespace

double DeviceModel::seconds(double flops, double bytes) const {
  double compute = peakFlops > 0 ? std::max(flops, 0.0) / peakFlops : 0.0;
  double memory = bandwidth > 0 ? std::max(bytes, 0.0) / bandwidth : 0.0;
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

std::vector<std::string> deviceModelNames() {
  std::vector<std::string> names;
  for (const DeviceRow &row : kDevices)
    names.push_back(row.name);
  return names;
}

} // namespace pipec
