//===- Calibrate.cpp - Device models calibrated on measured profiles ------===//
//
// See pipec/Calibrate.h.
//
//===----------------------------------------------------------------------===//
#include "pipec/Calibrate.h"

#include <algorithm>
#include <cmath>

namespace pipec {

double predictedForward(const DeviceModel &model, const ProfileOp &op) {
  return model.seconds(op.fwdFlops, op.touchedBytes, op.op);
}

double predictedBackward(const DeviceModel &model, const ProfileOp &op) {
  return model.seconds(op.bwdFlops, 2.0 * op.touchedBytes, op.op);
}

Calibration calibrateDevice(const Profile &measured, const DeviceModel &base) {
  Calibration c;
  c.model = base;
  if (base.peakFlops <= 0 || base.bandwidth <= 0) {
    c.error = "device model '" + base.name + "' has no peak or bandwidth";
    return c;
  }
  // Datasheet roofline parts of one kernel, without overhead.
  auto classify = [&](double flops, double bytes, double seconds,
                      const std::string &kind) {
    const double compute = flops / base.peakFlops,
                 memory = bytes / base.bandwidth;
    for (KernelClass *k : {compute >= memory ? &c.compute : &c.memory,
                           &c.kinds[costKind(kind)]}) {
      ++k->kernels;
      k->rooflineSeconds += std::max(compute, memory);
      k->measuredSeconds += std::max(seconds - base.opOverhead, 0.0);
    }
    c.kinds[costKind(kind)].points.push_back(
        {std::max(compute, memory), seconds});
  };
  struct Kernel {
    double flops, bytes, seconds;
    std::string kind;
  };
  std::vector<Kernel> kernels;
  for (const ProfileOp &op : measured.ops) {
    if (op.fwdFlops <= 0 && op.bwdFlops <= 0 && op.touchedBytes <= 0)
      continue;
    if (op.fwdSeconds > 0)
      kernels.push_back({op.fwdFlops, op.touchedBytes, op.fwdSeconds, op.op});
    if (op.bwdSeconds > 0)
      kernels.push_back(
          {op.bwdFlops, 2.0 * op.touchedBytes, op.bwdSeconds, op.op});
  }
  if (kernels.empty()) {
    c.error = "no op of the profile has both counted work (fwd_flops, "
              "bwd_flops, bytes) and a measured time; profile the model "
              "again with this pipec (`pipec profile` records the work)";
    return c;
  }
  for (const Kernel &k : kernels)
    classify(k.flops, k.bytes, k.seconds, k.kind);
  auto efficiency = [](const KernelClass &k, double fallback) {
    return k.kernels > 0 && k.measuredSeconds > 0 && k.rooflineSeconds > 0
               ? k.rooflineSeconds / k.measuredSeconds
               : fallback;
  };
  c.model.computeEfficiency = efficiency(c.compute, base.computeEfficiency);
  c.model.bandwidthEfficiency = efficiency(c.memory, base.bandwidthEfficiency);
  for (const auto &[kind, k] : c.kinds) {
    if (kind.empty())
      continue;
    DeviceModel::KindFit fit;
    double rMin = 0, rMax = 0;
    for (const auto &[r, t] : k.points) {
      rMin = rMin == 0 ? r : std::min(rMin, r);
      rMax = std::max(rMax, r);
    }
    fit.from = rMin / 4;
    fit.upTo = 4 * rMax;
    // Least squares t = a r + b over the kind's kernels.
    bool fitted = false;
    // (A span of exactly 1.5, an element-wise kernel's backward of three
    // tensors against its forward of two, counts: the slack keeps the
    // rounding of the two rooflines from deciding.)
    if (k.points.size() >= 2 && rMin > 0 && rMax >= 1.5 * rMin * (1 - 1e-9)) {
      double n = 0, sr = 0, st = 0, srr = 0, srt = 0;
      for (const auto &[r, t] : k.points) {
        n += 1;
        sr += r;
        st += t;
        srr += r * r;
        srt += r * t;
      }
      double a = (n * srt - sr * st) / (n * srr - sr * sr);
      double b = (st - a * sr) / n;
      if (b < 0) { // through the origin, keeping the kind's summed time
        b = 0;
        a = st / sr;
      }
      if (a > 0 && std::isfinite(a)) {
        fit.efficiency = 1 / a;
        fit.overhead = b;
        fitted = true;
      }
    }
    if (!fitted) {
      fit.efficiency = efficiency(k, 0);
      fit.overhead = base.opOverhead;
    }
    if (fit.efficiency > 0)
      c.model.kinds[kind] = fit;
  }
  for (const Kernel &k : kernels) {
    c.measuredSeconds += k.seconds;
    c.baseSeconds += base.seconds(k.flops, k.bytes, k.kind);
    c.modelSeconds += c.model.seconds(k.flops, k.bytes, k.kind);
  }
  c.ok = true;
  return c;
}

} // namespace pipec
