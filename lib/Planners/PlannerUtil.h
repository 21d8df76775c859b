//===- PlannerUtil.h - Shared pieces of pipedream, dapple, exhaustive -*- C++
//-*-===//
//
// Internal to lib/Planners, the one helper library of every planner:
// per-layer cost tables with prefix sums, the linear-time cut table,
// topology helpers with the closed forms of Topology.h (so the hot loops of
// the planners need no device lists), a sparse table for "last cut cheaper
// than x", the linear microbatch scaling of a profile, an exact min-max
// split of a cost chain, affine transfer costs, input checks and
// formatting.
// Not a public header: the planners' contracts are in pipec/Planners.h.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_LIB_PLANNERS_PLANNERUTIL_H
#define PIPEC_LIB_PLANNERS_PLANNERUTIL_H

#include "pipec/Planners.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace pipec {
namespace planner_util {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// Per-layer costs of a profile at the plan's microbatch size, as prefix
/// sums so that any contiguous range costs O(1). Times and activation bytes
/// scale linearly with the samples of a microbatch (`scale` = microbatch /
/// profile microbatch); parameter bytes do not.
struct LayerTable {
  int numLayers = 0;
  double scale = 1;
  /// Prefix sums, size numLayers + 1: fwd[l] = sum of fwd_s of layers < l.
  std::vector<double> fwd, bwd, params, saved;
  /// Prefix sums of fwd + bwd (for searches; time() is the reference).
  std::vector<double> total;
  /// cut[s] = a_s: bytes live across the cut after layer s, every tensor
  /// once (cutBytes(profile, s, nullptr) x scale); cut[numLayers - 1] = 0.
  std::vector<double> cut;

  /// T_l summed over layers first..last (inclusive): forward + backward.
  double time(int first, int last) const {
    return (fwd[last + 1] - fwd[first]) + (bwd[last + 1] - bwd[first]);
  }
  double forward(int first, int last) const {
    return fwd[last + 1] - fwd[first];
  }
  double backward(int first, int last) const {
    return bwd[last + 1] - bwd[first];
  }
  /// sum |w_l| over first..last.
  double weights(int first, int last) const {
    return params[last + 1] - params[first];
  }
  /// Activation bytes stashed for one microbatch over first..last.
  double stash(int first, int last) const {
    return saved[last + 1] - saved[first];
  }
  /// Bytes entering a stage that starts at `first` (0 for the first stage).
  double input(int first) const { return first > 0 ? cut[first - 1] : 0; }
};

LayerTable buildLayerTable(const Profile &profile, double scale);

/// "" or what is wrong with the profile's costs (negative or non-finite
/// times, negative sizes, inputs that are not earlier ops) or the topology
/// (Topology.h's topologyError), for a user.
std::string checkInputs(const Profile &profile, const Topology &topology);

/// The microbatch size a planner uses: options.microbatchSize, else
/// globalBatch / microbatches when both are given, else the profile's.
/// Sets `error` when the three given numbers disagree.
int64_t resolveMicrobatchSize(const Profile &profile,
                              const PlannerOptions &options,
                              std::string &error);

/// A topology with per-level link parameters precomputed (effective link:
/// the slowest of the levels spanned, as Topology::effectiveLink).
struct TopologyInfo {
  int numLevels = 0;
  int numDevices = 0;
  /// Components of level k-1 in one component of level k (m_k).
  std::vector<int> count;
  /// Devices in one component of level k: prod of count[0..k].
  std::vector<int> devicesPer;
  /// Effective bandwidth (bytes/s) and latency (s) of a message crossing
  /// level k.
  std::vector<double> bandwidth, latency;
  int64_t memoryBytes = 0;

  /// Devices of one level-(k-1) component (1 for k = 0).
  int devicesBelow(int k) const { return k > 0 ? devicesPer[k - 1] : 1; }
  /// Innermost level containing devices a and b; -1 if a == b.
  int levelBetween(int a, int b) const;
  /// Innermost level spanned by `devices`; -1 for fewer than two.
  int levelSpanning(const std::vector<int> &devices) const;
  /// latency_k + bytes / B_k over level `level` (0 for level < 0 or no
  /// bytes), as Topology::p2pSeconds.
  double p2p(double bytes, int level) const;
  /// Ring allreduce of `bytes` among n devices spanning `level`:
  /// 2(n-1)/n * bytes / B + 2(n-1) * latency, as Topology::allreduceSeconds.
  double allreduce(double bytes, int n, int level) const;
};

TopologyInfo topologyInfo(const Topology &topology);

/// Range-minimum table over a vector of doubles (sparse table), for "the
/// last index p in [lo, hi] with v[p] <= x" in O(log n).
class RangeMin {
public:
  RangeMin() = default;
  explicit RangeMin(const std::vector<double> &values);
  /// Largest p in [lo, hi] with values[p] <= x, or lo - 1 if none.
  int lastAtMost(int lo, int hi, double x) const;

private:
  std::vector<std::vector<double>> table;
};

/// Largest j in [lo, hi] for which `ok(j)` holds, assuming ok is true on a
/// prefix of [lo, hi]; lo - 1 when ok(lo) is false.
template <typename Pred> int lastTrue(int lo, int hi, Pred ok) {
  int good = lo - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    if (ok(mid)) {
      good = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return good;
}

/// "12.50 GiB".
std::string formatBytes(double bytes);
/// "1.234 ms" style seconds.
std::string formatSeconds(double seconds);

PlanResult planError(std::string message);

/// Stage ranges as "[0-3]x2 [4-9]x1".
std::string describeStages(const Plan &plan);

// For the madpipe, twobw and interleaved planners.

/// The profile at microbatch size `b`: the profile was measured at
/// b0 = profile.microbatch, and times (fwd_s, bwd_s) and activation sizes
/// (out_bytes, saved_bytes) scale linearly with b / b0; parameter sizes do
/// not change. Returns the profile unchanged when b == b0.
Profile scaleProfile(const Profile &profile, int64_t microbatchSize);

/// Exact min-max contiguous split of `costs` into `parts` non-empty parts:
/// the largest part sum is minimal (bisection on the bound with a greedy
/// check, then greedy packing; parts that come out short are filled by
/// splitting the costliest multi-item part). When every cost is 0, each item
/// counts 1. Returns the first index of each part (size `parts`).
/// Preconditions: 1 <= parts <= costs.size(), costs non-negative.
std::vector<int> splitChainMinMax(const std::vector<double> &costs, int parts);

/// An affine transfer cost: latency + perByte·bytes, 0 for no bytes.
/// Topology's p2p and ring all-reduce costs have this form (Topology.h).
struct Line {
  double latency = 0;
  double perByte = 0;
  double at(double bytes) const {
    return bytes > 0 ? latency + perByte * bytes : 0;
  }
};

/// The line through `seconds(1)` and `seconds(1e9)`.
template <typename F> Line lineOf(F seconds) {
  const double big = 1e9;
  double one = seconds(int64_t(1));
  double many = seconds(static_cast<int64_t>(big));
  Line line;
  line.perByte = std::max(0.0, (many - one) / (big - 1));
  line.latency = std::max(0.0, one - line.perByte);
  return line;
}

/// The user's microbatch size, or the profile's.
int64_t chosenMicrobatchSize(const Profile &profile, int64_t requested);

} // namespace planner_util
} // namespace pipec

#endif // PIPEC_LIB_PLANNERS_PLANNERUTIL_H
