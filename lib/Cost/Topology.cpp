//===- Topology.cpp - Hierarchical cluster model and topology.json --------===//
//
// The cluster model of PipeDream §3.1 (pipedream.md §2.2): level k is
// `count_k` components of level k-1, linked at bandwidth B_k; levels are
// listed innermost first. Devices are numbered so that device d's index at
// level k is (d / prod_{j<k} count_j) % count_k: devices 0..count_0-1 share
// the innermost component, and so on outwards.
//
// Communication costs (issue 3, "Costs"):
//   point-to-point   t = latency + bytes / B
//   ring allreduce   t = 2(n-1)/n * bytes / B + 2(n-1) * latency
// where B and the latency are those of the slowest level spanned. A message
// between two devices whose innermost common component is level k crosses
// the links of level k and, on its way in and out, those of the levels
// below; the slowest of them bounds it. With bandwidth falling outwards
// (every cluster of the papers) that is simply level k.
//
// The reader rejects, with a message naming the level, what would make
// these formulas meaningless: zero or negative counts and bandwidths,
// negative latencies or memory.
//
//===----------------------------------------------------------------------===//

#include "pipec/Topology.h"

#include "pipec/detail/JsonDocument.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

using nlohmann::json;
using nlohmann::ordered_json;

namespace pipec {

namespace {

constexpr const char *kTopologyFormat = "pipec.topology/1";

/// `level 1 ('cluster')`, for diagnostics.
std::string describeLevel(size_t index, const std::string &name) {
  std::string text = "level " + std::to_string(index);
  if (!name.empty())
    text += " ('" + name + "')";
  return text;
}

TopologyResult fail(std::string message) {
  TopologyResult result;
  result.ok = false;
  result.error = "topology: " + std::move(message);
  return result;
}

/// Reads a whole number (integral floating values such as 1.6e10 are
/// accepted); sets `error` for anything else or a value outside
/// [minimum, maximum].
std::optional<int64_t> readWhole(const json &value, const std::string &what,
                                 int64_t minimum, int64_t maximum,
                                 std::string &error) {
  std::optional<int64_t> result;
  if (value.is_number_unsigned()) {
    uint64_t v = value.get<uint64_t>();
    if (v <= uint64_t(std::numeric_limits<int64_t>::max()))
      result = int64_t(v);
  } else if (value.is_number_integer()) {
    result = value.get<int64_t>();
  } else if (value.is_number_float()) {
    double v = value.get<double>();
    if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.2e18)
      result = int64_t(v);
  } else {
    error = what + " must be a number (got " + value.dump() + ")";
    return std::nullopt;
  }
  if (!result || *result < minimum || *result > maximum) {
    error = what + " must be a whole number";
    if (minimum == 0)
      error += " >= 0";
    else if (minimum == 1)
      error += " >= 1";
    error += " (got " + value.dump() + ")";
    return std::nullopt;
  }
  return result;
}

/// Reads a finite number > 0 (`positive`) or >= 0; sets `error` otherwise.
std::optional<double> readReal(const json &value, const std::string &what,
                               bool positive, std::string &error) {
  if (!value.is_number()) {
    error = what + " must be a number (got " + value.dump() + ")";
    return std::nullopt;
  }
  double v = value.get<double>();
  if (!std::isfinite(v) || v < 0 || (positive && v == 0)) {
    error = what + " must be a " +
            std::string(positive ? "positive" : "non-negative") +
            " finite number (got " + value.dump() + ")";
    return std::nullopt;
  }
  return v;
}

} // namespace

//===----------------------------------------------------------------------===//
// Topology
//===----------------------------------------------------------------------===//

int Topology::numDevices() const {
  int64_t product = 1;
  for (const TopologyLevel &level : levels) {
    product *= level.count;
    if (product > std::numeric_limits<int>::max() || product <= 0)
      return product <= 0 ? 0 : std::numeric_limits<int>::max();
  }
  return static_cast<int>(product);
}

int Topology::devicesPerComponent(int level) const {
  int64_t product = 1;
  int last = std::min<int>(level, static_cast<int>(levels.size()) - 1);
  for (int k = 0; k <= last; ++k)
    product = std::min<int64_t>(product * std::max(levels[k].count, 1),
                                std::numeric_limits<int>::max());
  return static_cast<int>(product);
}

int Topology::indexAtLevel(int device, int level) const {
  if (level < 0 || level >= static_cast<int>(levels.size()) || device < 0)
    return 0;
  int below = devicesPerComponent(level - 1);
  return (device / below) % std::max(levels[level].count, 1);
}

int Topology::levelBetween(int a, int b) const {
  if (a == b)
    return -1;
  int top = static_cast<int>(levels.size()) - 1;
  // Devices outside the topology: assume the worst (the outermost level).
  int n = numDevices();
  if (a < 0 || b < 0 || a >= n || b >= n)
    return top;
  for (int k = top; k >= 0; --k)
    if (indexAtLevel(a, k) != indexAtLevel(b, k))
      return k;
  return -1;
}

int Topology::levelSpanning(const std::vector<int> &devices) const {
  // Devices are numbered digit by digit (one digit per level, the outermost
  // first), so every device between two others shares their common leading
  // digits: the set spans the level between its lowest and highest device.
  if (devices.empty())
    return -1;
  auto [lo, hi] = std::minmax_element(devices.begin(), devices.end());
  return levelBetween(*lo, *hi);
}

TopologyLevel Topology::effectiveLink(int level) const {
  TopologyLevel link;
  if (levels.empty() || level < 0)
    return link;
  int last = std::min<int>(level, static_cast<int>(levels.size()) - 1);
  link = levels[last];
  for (int k = 0; k < last; ++k) {
    link.bandwidth = std::min(link.bandwidth, levels[k].bandwidth);
    link.latency = std::max(link.latency, levels[k].latency);
  }
  return link;
}

double Topology::p2pSeconds(int64_t bytes, int a, int b) const {
  return p2pSecondsAtLevel(bytes, levelBetween(a, b));
}

double Topology::p2pSecondsAtLevel(int64_t bytes, int level) const {
  if (level < 0 || bytes <= 0)
    return 0;
  TopologyLevel link = effectiveLink(level);
  if (link.bandwidth <= 0)
    return std::numeric_limits<double>::infinity();
  // latency + bytes / B_k (PipeDream §3.1 counts 2 a_s / B_k for the
  // activation and its gradient: two such messages).
  return link.latency + static_cast<double>(bytes) / link.bandwidth;
}

double Topology::allreduceSeconds(int64_t bytes,
                                  const std::vector<int> &devices) const {
  if (devices.size() < 2 || bytes <= 0)
    return 0;
  std::vector<int> distinct = devices;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  double n = static_cast<double>(distinct.size());
  if (distinct.size() < 2)
    return 0;
  int level = levelSpanning(devices);
  TopologyLevel link = effectiveLink(level);
  if (link.bandwidth <= 0)
    return std::numeric_limits<double>::infinity();
  // Ring allreduce: a reduce-scatter and an all-gather, each n-1 steps of
  // bytes/n: 2(n-1)/n * |w| / B + 2(n-1) * latency (pipedream.md §1: each
  // worker sends and receives (m-1)/m |w| per phase).
  return 2.0 * (n - 1) / n * static_cast<double>(bytes) / link.bandwidth +
         2.0 * (n - 1) * link.latency;
}

std::pair<int, int> Topology::processorGroup(int device) const {
  for (size_t k = 0; k < levels.size(); ++k) {
    const int processors = levels[k].processors;
    if (processors <= 0)
      continue;
    const int perComponent = devicesPerComponent(static_cast<int>(k));
    if (processors >= perComponent)
      continue; // enough here; an outer level may still be short
    return {device / perComponent, processors};
  }
  return {-1, 0};
}

Topology Topology::flat(int n, double bandwidth, double latency,
                        int64_t memoryBytes) {
  Topology topology;
  topology.deviceMemoryBytes = memoryBytes;
  TopologyLevel level;
  level.name = "cluster";
  level.count = n;
  level.bandwidth = bandwidth;
  level.latency = latency;
  topology.levels.push_back(level);
  return topology;
}

std::string topologyError(const Topology &topology) {
  if (topology.levels.empty())
    return "'levels' must list at least one level";
  if (topology.deviceMemoryBytes < 0)
    return "'device_memory_bytes' must be >= 0 (got " +
           std::to_string(topology.deviceMemoryBytes) + ")";
  int64_t devices = 1;
  for (size_t k = 0; k < topology.levels.size(); ++k) {
    const TopologyLevel &level = topology.levels[k];
    std::string what = describeLevel(k, level.name);
    if (level.count < 1)
      return what + ": 'count' must be >= 1 (got " +
             std::to_string(level.count) + ")";
    if (!std::isfinite(level.bandwidth) || level.bandwidth <= 0)
      return what + ": 'bandwidth' must be a positive finite number of "
                    "bytes per second";
    if (!std::isfinite(level.latency) || level.latency < 0)
      return what + ": 'latency' must be a non-negative finite number of "
                    "seconds";
    if (level.processors < 0)
      return what + ": 'processors' must be >= 0 (got " +
             std::to_string(level.processors) + ")";
    devices *= level.count;
    if (devices > std::numeric_limits<int>::max())
      return what + ": too many devices (the product of the counts exceeds " +
             std::to_string(std::numeric_limits<int>::max()) + ")";
  }
  return "";
}

//===----------------------------------------------------------------------===//
// topology.json
//===----------------------------------------------------------------------===//

TopologyResult topologyFromJson(const std::string &text) {
  json doc;
  if (std::string why = detail::openJsonDocument(text, kTopologyFormat, doc);
      !why.empty())
    return fail(why);

  Topology topology;
  std::string error;
  if (auto memory = doc.find("device_memory_bytes");
      memory != doc.end() && !memory->is_null()) {
    std::optional<int64_t> bytes =
        readWhole(*memory, "'device_memory_bytes'", 0,
                  std::numeric_limits<int64_t>::max(), error);
    if (!bytes)
      return fail(error);
    topology.deviceMemoryBytes = *bytes;
  }

  auto levels = doc.find("levels");
  if (levels == doc.end() || !levels->is_array())
    return fail("'levels' must be a list of {name, count, bandwidth, "
                "latency}, innermost first");
  if (levels->empty())
    return fail("'levels' must list at least one level");

  for (size_t k = 0; k < levels->size(); ++k) {
    const json &entry = (*levels)[k];
    if (!entry.is_object())
      return fail(describeLevel(k, "") + " must be a JSON object");
    TopologyLevel level;
    if (auto name = entry.find("name"); name != entry.end()) {
      if (!name->is_string())
        return fail(describeLevel(k, "") + ": 'name' must be a string");
      level.name = name->get<std::string>();
    }
    std::string what = describeLevel(k, level.name);

    auto count = entry.find("count");
    if (count == entry.end())
      return fail(what + ": missing 'count'");
    std::optional<int64_t> countValue = readWhole(
        *count, what + ": 'count'", 1, std::numeric_limits<int>::max(), error);
    if (!countValue)
      return fail(error);
    level.count = static_cast<int>(*countValue);

    auto bandwidth = entry.find("bandwidth");
    if (bandwidth == entry.end())
      return fail(what + ": missing 'bandwidth' (bytes per second)");
    std::optional<double> bandwidthValue =
        readReal(*bandwidth, what + ": 'bandwidth'", /*positive=*/true, error);
    if (!bandwidthValue)
      return fail(error);
    level.bandwidth = *bandwidthValue;

    // A missing latency is 0 s: the bandwidth-only model of the papers.
    if (auto latency = entry.find("latency");
        latency != entry.end() && !latency->is_null()) {
      std::optional<double> latencyValue =
          readReal(*latency, what + ": 'latency'", /*positive=*/false, error);
      if (!latencyValue)
        return fail(error);
      level.latency = *latencyValue;
    }
    // Processors shared by a component's devices (absent or 0: one each).
    if (auto processors = entry.find("processors");
        processors != entry.end() && !processors->is_null()) {
      std::optional<int64_t> value =
          readWhole(*processors, what + ": 'processors'", 0,
                    std::numeric_limits<int>::max(), error);
      if (!value)
        return fail(error);
      level.processors = static_cast<int>(*value);
    }
    topology.levels.push_back(std::move(level));
  }

  if (std::string problem = topologyError(topology); !problem.empty())
    return fail(problem);

  TopologyResult result;
  result.ok = true;
  result.topology = std::move(topology);
  return result;
}

std::string topologyToJson(const Topology &topology) {
  ordered_json levels = ordered_json::array();
  for (const TopologyLevel &level : topology.levels) {
    ordered_json entry = {{"name", level.name},
                          {"count", level.count},
                          {"bandwidth", level.bandwidth},
                          {"latency", level.latency}};
    if (level.processors > 0)
      entry["processors"] = level.processors;
    levels.push_back(std::move(entry));
  }
  ordered_json doc = {{"format", kTopologyFormat},
                      {"device_memory_bytes", topology.deviceMemoryBytes},
                      {"levels", std::move(levels)}};
  return doc.dump(2) + "\n";
}

} // namespace pipec
