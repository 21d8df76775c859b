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
  /// Roofline time of work with `flops` operations touching `bytes`.
  double seconds(double flops, double bytes) const;
};

/// cpu, v100, a100, h100; nullopt for anything else.
std::optional<DeviceModel> deviceModel(const std::string &name);
/// Names accepted by deviceModel, for messages.
std::vector<std::string> deviceModelNames();

} // namespace pipec

#endif // PIPEC_COSTMODEL_H
