//===- PlannerUtil.cpp - Shared pieces of pipedream, dapple, exhaustive ---===//
//
// See PlannerUtil.h.
//
//===----------------------------------------------------------------------===//

#include "PlannerUtil.h"

#include <numeric>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace pipec {
namespace planner_util {

LayerTable buildLayerTable(const Profile &profile, double scale) {
  LayerTable table;
  int n = static_cast<int>(profile.ops.size());
  table.numLayers = n;
  table.scale = scale;
  table.fwd.assign(n + 1, 0);
  table.bwd.assign(n + 1, 0);
  table.params.assign(n + 1, 0);
  table.saved.assign(n + 1, 0);
  table.total.assign(n + 1, 0);
  for (int l = 0; l < n; ++l) {
    const ProfileOp &op = profile.ops[l];
    table.fwd[l + 1] = table.fwd[l] + op.fwdSeconds * scale;
    table.bwd[l + 1] = table.bwd[l] + op.bwdSeconds * scale;
    table.params[l + 1] = table.params[l] + static_cast<double>(op.paramBytes);
    table.saved[l + 1] =
        table.saved[l] + static_cast<double>(op.savedBytes) * scale;
    table.total[l + 1] =
        table.total[l] + (op.fwdSeconds + op.bwdSeconds) * scale;
  }
  std::vector<int64_t> cuts = cutBytesPerCut(profile);
  table.cut.resize(n);
  for (int s = 0; s < n; ++s)
    table.cut[s] = static_cast<double>(cuts[s]) * scale;
  return table;
}

std::string checkInputs(const Profile &profile, const Topology &topology) {
  if (std::string bad = profilePlanningError(profile); !bad.empty())
    return bad;
  if (std::string bad = topologyError(topology); !bad.empty())
    return "topology: " + bad;
  return "";
}

int64_t resolveMicrobatchSize(const Profile &profile,
                              const PlannerOptions &options,
                              std::string &error) {
  if (options.microbatchSize < 0 || options.microbatches < 0 ||
      options.globalBatch < 0) {
    error = "the microbatch size, microbatch count and global batch must "
            "not be negative";
    return 0;
  }
  int64_t size = options.microbatchSize;
  if (size == 0 && options.globalBatch > 0 && options.microbatches > 0) {
    if (options.globalBatch % options.microbatches != 0) {
      error = "the global batch " + std::to_string(options.globalBatch) +
              " is not a multiple of the " +
              std::to_string(options.microbatches) + " microbatches";
      return 0;
    }
    size = options.globalBatch / options.microbatches;
  }
  if (size == 0)
    size = profile.microbatch;
  if (options.globalBatch > 0 && options.microbatches > 0 &&
      options.globalBatch != size * options.microbatches) {
    error = "inconsistent batch: " + std::to_string(options.microbatches) +
            " microbatches of " + std::to_string(size) + " samples are " +
            std::to_string(size * options.microbatches) +
            " samples, not the global batch of " +
            std::to_string(options.globalBatch);
    return 0;
  }
  if (options.globalBatch > 0 && options.globalBatch % size != 0) {
    error = "the global batch " + std::to_string(options.globalBatch) +
            " is not a multiple of the microbatch size " + std::to_string(size);
    return 0;
  }
  return size;
}

//===----------------------------------------------------------------------===//
// Topology closed forms
//===----------------------------------------------------------------------===//

TopologyInfo topologyInfo(const Topology &topology) {
  TopologyInfo info;
  info.numLevels = static_cast<int>(topology.levels.size());
  info.numDevices = topology.numDevices();
  info.memoryBytes = topology.deviceMemoryBytes;
  int64_t product = 1;
  for (int k = 0; k < info.numLevels; ++k) {
    info.count.push_back(topology.levels[k].count);
    product *= topology.levels[k].count;
    info.devicesPer.push_back(static_cast<int>(product));
    TopologyLevel link = topology.effectiveLink(k);
    info.bandwidth.push_back(link.bandwidth);
    info.latency.push_back(link.latency);
  }
  return info;
}

int TopologyInfo::levelBetween(int a, int b) const {
  if (a == b)
    return -1;
  for (int k = numLevels - 1; k > 0; --k)
    if (a / devicesPer[k - 1] != b / devicesPer[k - 1])
      return k;
  return 0;
}

int TopologyInfo::levelSpanning(const std::vector<int> &devices) const {
  int spanned = -1;
  for (size_t i = 1; i < devices.size(); ++i)
    spanned = std::max(spanned, levelBetween(devices[0], devices[i]));
  return spanned;
}

double TopologyInfo::p2p(double bytes, int level) const {
  if (level < 0 || bytes <= 0)
    return 0;
  return latency[level] + bytes / bandwidth[level];
}

double TopologyInfo::allreduce(double bytes, int n, int level) const {
  if (n < 2 || level < 0 || bytes <= 0)
    return 0;
  double devices = n;
  return 2.0 * (devices - 1) / devices * bytes / bandwidth[level] +
         2.0 * (devices - 1) * latency[level];
}

//===----------------------------------------------------------------------===//
// RangeMin
//===----------------------------------------------------------------------===//

RangeMin::RangeMin(const std::vector<double> &values) {
  int n = static_cast<int>(values.size());
  table.push_back(values);
  for (int width = 2; width <= n; width *= 2) {
    const std::vector<double> &below = table.back();
    std::vector<double> level(n - width + 1);
    for (int i = 0; i + width <= n; ++i)
      level[i] = std::min(below[i], below[i + width / 2]);
    table.push_back(std::move(level));
  }
}

int RangeMin::lastAtMost(int lo, int hi, double x) const {
  if (table.empty() || lo > hi)
    return lo - 1;
  // Walk left from hi, skipping power-of-two blocks whose minimum is > x.
  int end = hi; // candidates are lo..end
  for (int k = static_cast<int>(table.size()) - 1; k >= 0 && end >= lo; --k) {
    int width = 1 << k;
    if (end - width + 1 < lo)
      continue;
    if (table[k][end - width + 1] > x)
      end -= width;
  }
  if (end >= lo && table[0][end] <= x)
    return end;
  return lo - 1;
}

//===----------------------------------------------------------------------===//
// Formatting
//===----------------------------------------------------------------------===//

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

std::string formatSeconds(double seconds) {
  char buf[48];
  if (seconds >= 1)
    std::snprintf(buf, sizeof buf, "%.4g s", seconds);
  else if (seconds >= 1e-3)
    std::snprintf(buf, sizeof buf, "%.4g ms", seconds * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.4g us", seconds * 1e6);
  return buf;
}

PlanResult planError(std::string message) {
  PlanResult result;
  result.ok = false;
  result.error = std::move(message);
  return result;
}

std::string describeStages(const Plan &plan) {
  std::string text;
  for (const StagePlan &stage : plan.stages) {
    if (!text.empty())
      text += ' ';
    text += "[" + std::to_string(stage.firstLayer) + "-" +
            std::to_string(stage.lastLayer) + "]x" +
            std::to_string(stage.replicas);
  }
  return text;
}

Profile scaleProfile(const Profile &profile, int64_t microbatchSize) {
  int64_t b0 = std::max<int64_t>(profile.microbatch, 1);
  if (microbatchSize == b0)
    return profile;
  double f = static_cast<double>(microbatchSize) / static_cast<double>(b0);
  Profile scaled = profile;
  scaled.microbatch = microbatchSize;
  auto scale = [f](int64_t &bytes) {
    bytes = static_cast<int64_t>(std::llround(bytes * f));
  };
  scale(scaled.inputBytes);
  scale(scaled.labelBytes);
  for (ProfileOp &op : scaled.ops) {
    op.fwdSeconds *= f;
    op.bwdSeconds *= f;
    for (int64_t *bytes :
         {&op.outBytes, &op.savedBytes, &op.fwdScratchBytes,
          &op.bwdScratchBytes, &op.carriedBytes, &op.bwdRecomputedScratchBytes})
      scale(*bytes);
    for (auto &read : op.savedReads)
      scale(read.second);
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
  // Parts the greedy packing needs under `bound`, counted up to parts + 1
  // (the search only asks whether it is at most `parts`).
  auto partsNeeded = [&](double bound) {
    int count = 1;
    double sum = 0;
    for (double x : c) {
      if (sum + x > bound * (1 + slack) && sum > 0) {
        if (++count > parts)
          return count;
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

int64_t chosenMicrobatchSize(const Profile &profile, int64_t requested) {
  if (requested > 0)
    return requested;
  return std::max<int64_t>(profile.microbatch, 1);
}

} // namespace planner_util
} // namespace pipec
