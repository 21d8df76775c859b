//===- Calibrate.h - Device models calibrated on measured profiles -*- C++
//-*-===//
//
// The analytic roofline (pipec/CostModel.h) takes a device's datasheet
// peak and bandwidth; real kernels reach a share of them that depends on
// the device, the library and the shapes. calibrateDevice() measures that
// share on a profile that `pipec profile` wrote on the device itself: each
// kernel's measured time against the work the cost model counts for it
// (fwd_flops, bwd_flops, bytes). Plain C++, no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_CALIBRATE_H
#define PIPEC_CALIBRATE_H

#include "pipec/CostModel.h"
#include "pipec/Profile.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace pipec {

/// One class of kernels: those the datasheet roofline calls compute-bound
/// (FLOPs / peak >= bytes / bandwidth), or memory-bound; or one op kind.
struct KernelClass {
  int kernels = 0;
  /// Summed over the class: the measured seconds less the per-kernel
  /// overhead, and the datasheet roofline's seconds without it.
  double measuredSeconds = 0, rooflineSeconds = 0;
  /// Each kernel's (roofline, measured) seconds, for an op kind's fit.
  std::vector<std::pair<double, double>> points;
};

struct Calibration {
  bool ok = false;
  std::string error;
  /// `base` with computeEfficiency and bandwidthEfficiency set from the
  /// profile (a class with no kernel keeps the base's efficiency), and an
  /// efficiency per op kind the profile has (kindEfficiency).
  DeviceModel model;
  KernelClass compute, memory;
  /// Per op kind: its kernels, measured and roofline seconds.
  std::map<std::string, KernelClass> kinds;
  /// Every kernel used (a forward or a backward of an op with counted
  /// work and a measured time): measured, and predicted by `base` and by
  /// `model`, in seconds.
  double measuredSeconds = 0, baseSeconds = 0, modelSeconds = 0;
};

/// Fits `base`'s efficiencies to `measured`. Each class: efficiency =
/// roofline seconds / (measured seconds - the base's overhead), summed
/// over its kernels, so the large kernels, which dominate a step, dominate
/// the fit and the class's predicted time adds up to its measured one.
/// Each op kind: measured = roofline / efficiency + overhead, a least-
/// squares line through its kernels when they span sizes (a factor 1.5 or
/// more in roofline time; through the origin with the kind's summed time
/// when the line would have a negative overhead), else the class rule;
/// either way the kind's predicted time adds up to its measured one (less
/// the overheads' clipping where a kernel is faster than the base's
/// overhead); valid from a quarter of its smallest kernel to four times
/// its largest (DeviceModel::KindFit::from, upTo). Op kinds differ far
/// more than the two classes (on this CPU a matmul runs at twice the `cpu`
/// row's peak, a batch norm at half its bandwidth), so kinds carry over to
/// other models where classes do not (bench/README.md, "Calibrated device
/// models"). Fails, saying
/// why, when no op has both counted work and a measured time (a profile
/// from before this field, or a hand-written one).
Calibration calibrateDevice(const Profile &measured, const DeviceModel &base);

/// The time `model` predicts for op `op`'s forward and backward (the
/// backward touches twice the forward's bytes, as --nn-annotate-costs
/// counts it).
double predictedForward(const DeviceModel &model, const ProfileOp &op);
double predictedBackward(const DeviceModel &model, const ProfileOp &op);

} // namespace pipec

#endif // PIPEC_CALIBRATE_H
