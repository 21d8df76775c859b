//===- CostModel.h - Analytic device models ---------------------*- C++ -*-===//
//
// Roofline models of named devices for --nn-annotate-costs and the
// paper-scale profiles: t = max(FLOPs / peak, bytes / bandwidth) + overhead.
// Plain C++, no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_COSTMODEL_H
#define PIPEC_COSTMODEL_H

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace pipec {

struct DeviceModel {
  std::string name;
  double peakFlops = 0;   ///< FLOP/s (fp32 training: FP32/TF32 dense peak)
  double bandwidth = 0;   ///< device memory bytes/s
  int64_t memoryBytes = 0;
  double opOverhead = 0;  ///< seconds per kernel launch
  /// The share of the peak and of the bandwidth that kernels reach, 1 for
  /// the datasheet rows; a calibrated model (pipec/Calibrate.h) takes them
  /// from a measured profile.
  double computeEfficiency = 1, bandwidthEfficiency = 1;
  /// Per op kind (the nn dialect's op name: "matmul", "conv", "softmax"):
  /// t = roofline / efficiency + overhead with the kind's own efficiency
  /// and per-kernel overhead, replacing the class efficiencies and
  /// opOverhead for it (a calibration fits the kinds its profile has; the
  /// rest fall back to the two classes).
  /// A kind's fit holds for kernels whose roofline time lies in [from,
  /// upTo] seconds (upTo 0: any): a quarter of the smallest to four times
  /// the largest it was fitted on, so a line taken on one range of sizes
  /// is not stretched to another (an intercept fitted on large GEMMs is
  /// no small GEMM's launch cost); other kernels use the classes.
  struct KindFit {
    double efficiency = 1, overhead = 0, from = 0, upTo = 0;
    bool operator==(const KindFit &o) const {
      return efficiency == o.efficiency && overhead == o.overhead &&
             from == o.from && upTo == o.upTo;
    }
  };
  std::map<std::string, KindFit> kinds;
  /// Roofline time of work with `flops` operations touching `bytes`, for
  /// a kernel of op kind `kind` ("" or unknown: the class efficiencies).
  double seconds(double flops, double bytes,
                 const std::string &kind = "") const;
};

/// The kind a calibration fits for op kind `op`: ops that run the same
/// kernels share one (gemm and matmul are both BLAS/cuBLAS GEMMs).
std::string costKind(const std::string &op);

/// cpu, v100, a100, h100; nullopt for anything else.
std::optional<DeviceModel> deviceModel(const std::string &name);

/// A device model as JSON (`pipec.device/1`: name, peak_flops, bandwidth,
/// memory_bytes, op_overhead, compute_efficiency, bandwidth_efficiency),
/// and back; the reader fails with a message on a wrong format tag or a
/// missing, negative or non-finite number; efficiencies must be positive,
/// and may exceed 1 where the row is conservative: the `cpu` row's 50
/// GFLOP/s is below what OpenBLAS reaches on two cores).
std::string deviceModelToJson(const DeviceModel &model);
std::optional<DeviceModel> deviceModelFromJson(const std::string &text,
                                               std::string &error);
/// A device model by name or, for a name ending in ".json", from that file
/// (pipec calibrate writes them); the error says why not.
std::optional<DeviceModel> deviceModelByNameOrFile(const std::string &name,
                                                   std::string &error);
/// Names accepted by deviceModel, for messages.
std::vector<std::string> deviceModelNames();

} // namespace pipec

#endif // PIPEC_COSTMODEL_H
