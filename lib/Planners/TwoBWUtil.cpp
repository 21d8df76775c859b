//===- TwoBWUtil.cpp - Helpers of the madpipe/twobw/interleaved planners --===//
//
// See TwoBWUtil.h.
//
//===----------------------------------------------------------------------===//

#include "TwoBWUtil.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace pipec {
namespace plannerb {

PlanResult planFailure(std::string message) {
  PlanResult result;
  result.ok = false;
  result.error = std::move(message);
  return result;
}

std::string checkPlannerProfile(const Profile &profile) {
  return profilePlanningError(profile);
}

Profile scaleProfile(const Profile &profile, int64_t microbatchSize) {
  int64_t b0 = std::max<int64_t>(profile.microbatch, 1);
  if (microbatchSize == b0)
    return profile;
  double f = static_cast<double>(microbatchSize) / static_cast<double>(b0);
  Profile scaled = profile;
  scaled.microbatch = microbatchSize;
  for (ProfileOp &op : scaled.ops) {
    op.fwdSeconds *= f;
    op.bwdSeconds *= f;
    op.outBytes = static_cast<int64_t>(std::llround(op.outBytes * f));
    op.savedBytes = static_cast<int64_t>(std::llround(op.savedBytes * f));
  }
  return scaled;
}

std::vector<int> splitChainMinMax(const std::vector<double> &costs, int parts) {
  const int n = static_cast<int>(costs.size());
  std::vector<double> c = costs;
  double total = std::accumulate(c.begin(), c.end(), 0.0);
  if (total <= 0) {
    std::fill(c.begin(), c.end(), 1.0);
    total = n;
  }
  double maxItem = *std::max_element(c.begin(), c.end());
  const double slack = 1e-12;
  auto partsNeeded = [&](double bound) {
    int count = 1;
    double sum = 0;
    for (double x : c) {
      if (sum + x > bound * (1 + slack) && sum > 0) {
        ++count;
        sum = 0;
      }
      sum += x;
    }
    return count;
  };
  double lo = maxItem, hi = total;
  if (partsNeeded(lo) > parts) {
    for (int it = 0; it < 200 && hi - lo > 1e-13 * hi; ++it) {
      double mid = 0.5 * (lo + hi);
      if (partsNeeded(mid) <= parts)
        hi = mid;
      else
        lo = mid;
    }
  } else {
    hi = lo;
  }
  // Greedy packing under the bound `hi`.
  std::vector<int> starts = {0};
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    if (sum + c[i] > hi * (1 + slack) && sum > 0) {
      starts.push_back(i);
      sum = 0;
    }
    sum += c[i];
  }
  // Fill up to `parts` by splitting the costliest part with >= 2 items;
  // splitting never raises the largest part.
  while (static_cast<int>(starts.size()) < parts) {
    int bestPart = -1;
    double bestCost = -1;
    for (int p = 0, e = static_cast<int>(starts.size()); p < e; ++p) {
      int first = starts[p];
      int end = p + 1 < e ? starts[p + 1] : n;
      if (end - first < 2)
        continue;
      double cost = std::accumulate(c.begin() + first, c.begin() + end, 0.0);
      if (cost > bestCost) {
        bestCost = cost;
        bestPart = p;
      }
    }
    int end = bestPart + 1 < static_cast<int>(starts.size())
                  ? starts[bestPart + 1]
                  : n;
    starts.insert(starts.begin() + bestPart + 1, end - 1);
  }
  return starts;
}

std::vector<int64_t> chainCutBytes(const Profile &profile) {
  const int n = static_cast<int>(profile.ops.size());
  std::vector<int> lastUse(n, -1);
  for (int j = 0; j < n; ++j)
    for (int producer : profile.producersOf(j))
      if (producer >= 0 && producer < j)
        lastUse[producer] = std::max(lastUse[producer], j);
  // The tensor of op t crosses the cuts t .. lastUse(t) - 1.
  std::vector<int64_t> delta(n + 1, 0), cuts(n, 0);
  for (int t = 0; t < n; ++t)
    if (lastUse[t] > t) {
      delta[t] += profile.ops[t].outBytes;
      delta[lastUse[t]] -= profile.ops[t].outBytes;
    }
  int64_t running = 0;
  for (int l = 0; l < n; ++l)
    cuts[l] = running += delta[l];
  if (n > 0)
    cuts[n - 1] = 0;
  return cuts;
}

std::string formatBytes(double bytes) {
  char buf[48];
  if (bytes >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  else if (bytes >= 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1024.0 * 1024));
  else if (bytes >= 1024.0)
    std::snprintf(buf, sizeof buf, "%.2f KiB", bytes / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  return buf;
}

int64_t chosenMicrobatchSize(const Profile &profile, int64_t requested) {
  if (requested > 0)
    return requested;
  return std::max<int64_t>(profile.microbatch, 1);
}

} // namespace plannerb
} // namespace pipec
