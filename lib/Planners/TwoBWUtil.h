//===- TwoBWUtil.h - Helpers of the madpipe/twobw/interleaved planners -*- C++
//-*-===//
//
// Small pieces shared by MadPipe.cpp, TwoBW.cpp and Interleaved.cpp: profile
// checks, the linear microbatch scaling of a profile, an exact min-max
// contiguous split of a cost chain, and message formatting. Internal to
// lib/Planners (namespace pipec::plannerb).
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_LIB_PLANNERS_TWOBWUTIL_H
#define PIPEC_LIB_PLANNERS_TWOBWUTIL_H

#include "pipec/Plan.h"
#include "pipec/Profile.h"
#include "pipec/Topology.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace pipec {
namespace plannerb {

/// A failed PlanResult carrying `message` for the user.
PlanResult planFailure(std::string message);

/// "" when every op has finite, non-negative costs and sizes and only
/// backward-pointing inputs; otherwise a message naming the first bad op.
std::string checkPlannerProfile(const Profile &profile);

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

/// Per-layer cut bytes: cuts[l] = bytes of every tensor live across the cut
/// after layer l, each counted once (cuts[L-1] = 0).
std::vector<int64_t> chainCutBytes(const Profile &profile);

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

/// "12.50 GiB" / "3.0 MiB" / "512 B".
std::string formatBytes(double bytes);

/// The user's microbatch size, or the profile's.
int64_t chosenMicrobatchSize(const Profile &profile, int64_t requested);

} // namespace plannerb
} // namespace pipec

#endif // PIPEC_LIB_PLANNERS_TWOBWUTIL_H
