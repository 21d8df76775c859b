//===- Sim.h - Discrete-event pipeline simulator ----------------*- C++ -*-===//
//
// Runs a plan with its schedule on the cost model (profile times, topology
// communication) and reports iteration time, throughput, bubble fraction,
// per-stage peak memory and, optionally, a Chrome-trace timeline. Every
// planner's candidate is re-scored here, so planners are compared on one
// yardstick (DESIGN.md §4). Plain C++, no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_SIM_H
#define PIPEC_SIM_H

#include "pipec/Plan.h"
#include "pipec/Profile.h"
#include "pipec/Topology.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pipec {

struct SimOptions {
  /// Recompute activations in the backward (stash only stage inputs).
  bool recompute = false;
  /// Optimizer state per parameter byte: 0 SGD, 1 momentum, 2 Adam.
  double optimizerStateFactor = 0;
  /// Produce `SimResult::traceJson`.
  bool trace = false;
  /// Steps simulated for continuous schedules (1f1b, 2bw); the steady state
  /// of the last one is reported.
  int steps = 3;
};

/// Peak memory of one stage replica, by kind (bytes).
struct StageMemory {
  int64_t weights = 0;     ///< parameters x live versions
  int64_t gradients = 0;   ///< gradient accumulators
  int64_t optimizer = 0;   ///< optimizer state
  int64_t activations = 0; ///< stashed activations at the peak in-flight count
  int64_t buffers = 0;     ///< communication buffers and workspace
  int weightVersions = 1;
  int64_t total() const {
    return weights + gradients + optimizer + activations + buffers;
  }
};

struct SimResult {
  bool ok = false;
  std::string error;
  double iterationSeconds = 0;  ///< one global batch (steady state)
  double samplesPerSecond = 0;
  double bubbleFraction = 0;    ///< idle / (devices x iteration time)
  std::vector<StageMemory> memory;  ///< per plan stage
  std::vector<int64_t> peakInflight; ///< per plan stage
  bool fitsMemory = true;       ///< every stage within the device memory
  std::string traceJson;        ///< Chrome trace events when requested
};

/// Simulates `plan` (its schedule, microbatches, chunks, replicas and
/// devices) on `profile` and `topology`. Errors (invalid plan, unknown
/// schedule, divisibility rules) come back in `error`.
SimResult simulatePlan(const Profile &profile, const Topology &topology,
                       const Plan &plan, const SimOptions &options = {});

} // namespace pipec

#endif // PIPEC_SIM_H
