//===- Topology.h - Cluster topology and communication costs ----*- C++ -*-===//
//
// A hierarchical cluster (`pipec.topology/1`, DESIGN.md §7): levels
// innermost first, each `count` components of the level below, linked with
// `bandwidth` (bytes/s) and `latency` (s). Devices are numbered so that
// devices 0..levels[0].count-1 share the innermost level, and so on.
// Communication costs (issue: planners and cost models):
//   point-to-point:  latency + bytes / bandwidth of the slowest level spanned
//   ring allreduce:  2(n-1)/n * bytes / bandwidth of the slowest level
//                    spanned (+ 2(n-1) latencies)
// Plain C++, no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_TOPOLOGY_H
#define PIPEC_TOPOLOGY_H

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pipec {

struct TopologyLevel {
  std::string name;
  int count = 1;
  double bandwidth = 0; ///< bytes per second
  double latency = 0;   ///< seconds
  /// Processors shared by the devices of one component of this level (0:
  /// every device is a processor of its own). Stage processes on a host
  /// with fewer cores than processes, or several ranks on one GPU: the
  /// simulator then shares the processors among the ops running at a time
  /// (each at min(1, processors / running) of its speed).
  int processors = 0;
};

struct Topology {
  /// Memory of one device in bytes (0 = unlimited).
  int64_t deviceMemoryBytes = 0;
  std::vector<TopologyLevel> levels;

  /// Product of the level counts.
  int numDevices() const;
  /// Index of the innermost level that contains both devices; -1 if a == b.
  int levelBetween(int a, int b) const;
  /// Innermost level containing every device of the set; -1 for one device.
  int levelSpanning(const std::vector<int> &devices) const;
  /// latency + bytes / bandwidth over the slowest level spanned; 0 if a == b.
  /// Depends on the devices through levelBetween(a, b) only.
  double p2pSeconds(int64_t bytes, int a, int b) const;
  /// p2pSeconds of two devices whose levelBetween is `level`.
  double p2pSecondsAtLevel(int64_t bytes, int level) const;
  /// Ring allreduce of `bytes` among `devices`; 0 for fewer than two.
  /// Depends on the devices through their number of distinct devices and
  /// levelSpanning only (planners cache lines by level on that ground).
  double allreduceSeconds(int64_t bytes, const std::vector<int> &devices) const;
  /// A one-level topology of `n` devices (tests, defaults).
  static Topology flat(int n, double bandwidth, double latency,
                       int64_t memoryBytes = 0);

  /// Index of `device` inside its level-`level` component:
  /// (device / prod(counts below level)) % count_level.
  int indexAtLevel(int device, int level) const;
  /// Devices in one component of level `level` (prod of counts 0..level);
  /// 1 for level -1.
  int devicesPerComponent(int level) const;
  /// The link a message crossing level `level` sees: the lowest bandwidth
  /// and the highest latency of levels 0..level (equal to level `level`
  /// itself when bandwidth falls outwards, as in every real cluster).
  TopologyLevel effectiveLink(int level) const;
  /// The devices sharing processors with `device` (the component of the
  /// innermost level whose `processors` are fewer than its devices): its
  /// id in [0, numDevices) and the number of processors, or {-1, 0} for a
  /// device of its own.
  std::pair<int, int> processorGroup(int device) const;
};

/// Why `topology` is unusable (no levels, a non-positive count or
/// bandwidth, a negative latency or memory, too many devices), naming the
/// level; empty when it is fine. topologyFromJson applies the same checks.
std::string topologyError(const Topology &topology);

struct TopologyResult {
  bool ok = false;
  Topology topology;
  std::string error;
};

/// Parses `pipec.topology/1`; rejects zero/negative counts, bandwidths and
/// negative latencies or memory with a message naming the level.
TopologyResult topologyFromJson(const std::string &text);
std::string topologyToJson(const Topology &topology);

} // namespace pipec

#endif // PIPEC_TOPOLOGY_H
