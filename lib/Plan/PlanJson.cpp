//===- PlanJson.cpp - plan.json (pipec.plan/1) reader and writer ----------===//
//
// `pipec.plan/1` (DESIGN.md §7): algorithm, schedule, microbatches,
// microbatch, chunks, replica_mode ("split" or absent), stages [{first_op,
// last_op, replicas, devices, recompute ("full"/"selective", absent = none)}],
// predicted {iteration_s, samples_per_s, bubble_fraction,
// stage_memory_bytes} and candidates (the same summary per scored plan).
//
//===----------------------------------------------------------------------===//

#include "pipec/Plan.h"

#include "pipec/detail/JsonDocument.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <optional>

using nlohmann::json;
using nlohmann::ordered_json;

namespace pipec {

namespace {

constexpr const char *kPlanFormat = "pipec.plan/1";

//===----------------------------------------------------------------------===//
// Writer
//===----------------------------------------------------------------------===//

/// The summary of one plan, shared by the top level and each candidate.
ordered_json planBody(const Plan &plan) {
  ordered_json body;
  body["algorithm"] = plan.algorithm;
  body["schedule"] = plan.schedule;
  body["microbatches"] = plan.microbatches;
  body["microbatch"] = plan.microbatchSize;
  body["chunks"] = plan.chunks;
  if (plan.splitReplicas)
    body["replica_mode"] = "split";
  ordered_json stages = ordered_json::array();
  for (const StagePlan &stage : plan.stages) {
    ordered_json entry;
    entry["first_op"] = stage.firstLayer;
    entry["last_op"] = stage.lastLayer;
    entry["replicas"] = stage.replicas;
    entry["devices"] = stage.devices;
    if (!stage.recompute.empty() && stage.recompute != "none")
      entry["recompute"] = stage.recompute;
    stages.push_back(std::move(entry));
  }
  body["stages"] = std::move(stages);
  ordered_json predicted;
  predicted["iteration_s"] = plan.predicted.iterationSeconds;
  predicted["samples_per_s"] = plan.predicted.samplesPerSecond;
  predicted["bubble_fraction"] = plan.predicted.bubbleFraction;
  predicted["stage_memory_bytes"] = plan.predicted.stageMemoryBytes;
  body["predicted"] = std::move(predicted);
  return body;
}

//===----------------------------------------------------------------------===//
// Reader
//===----------------------------------------------------------------------===//

/// Field readers: each returns nullopt and sets `error` (naming the JSON
/// path) on a missing or ill-typed value.
class Reader {
public:
  std::string error;

  std::optional<std::string> string(const json &obj, const std::string &path,
                                    const char *key) {
    auto it = obj.find(key);
    if (it == obj.end())
      return missing(path, key);
    if (!it->is_string())
      return bad(path, key, "must be a string");
    return it->get<std::string>();
  }

  /// An integer; integral floating values (`4.0`, `1e9`) are accepted.
  std::optional<int64_t> integer(const json &value, const std::string &path,
                                 const char *key) {
    if (value.is_number_integer())
      return value.get<int64_t>();
    if (value.is_number_unsigned()) {
      uint64_t v = value.get<uint64_t>();
      if (v <= uint64_t(std::numeric_limits<int64_t>::max()))
        return int64_t(v);
    }
    if (value.is_number_float()) {
      double v = value.get<double>();
      if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.2e18)
        return int64_t(v);
    }
    return bad(path, key, "must be an integer (got " + value.dump() + ")");
  }

  std::optional<int64_t> integerField(const json &obj, const std::string &path,
                                      const char *key) {
    auto it = obj.find(key);
    if (it == obj.end())
      return missing(path, key);
    return integer(*it, path, key);
  }

  /// An `int` field with a lower bound; `fallback` when absent (if given).
  std::optional<int> boundedInt(const json &obj, const std::string &path,
                                const char *key, int64_t atLeast,
                                std::optional<int> fallback = std::nullopt) {
    if (fallback && !obj.contains(key))
      return fallback;
    auto value = integerField(obj, path, key);
    if (!value)
      return std::nullopt;
    if (*value < atLeast || *value > std::numeric_limits<int>::max())
      return bad(path, key,
                 "must be at least " + std::to_string(atLeast) + " (got " +
                     std::to_string(*value) + ")");
    return static_cast<int>(*value);
  }

  std::optional<double> number(const json &obj, const std::string &path,
                               const char *key) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null())
      return 0.0;
    if (!it->is_number())
      return bad(path, key, "must be a number");
    double value = it->get<double>();
    if (!std::isfinite(value) || value < 0)
      return bad(path, key, "must be a non-negative number");
    return value;
  }

private:
  std::nullopt_t missing(const std::string &path, const char *key) {
    error = path + ": missing '" + key + "'";
    return std::nullopt;
  }
  std::nullopt_t bad(const std::string &path, const char *key,
                     const std::string &why) {
    error = path + ": '" + key + "' " + why;
    return std::nullopt;
  }
};

/// Parses the summary fields of one plan (top level or a candidate).
bool parsePlanBody(const json &obj, const std::string &path, Plan &plan,
                   Reader &reader) {
  if (!obj.is_object()) {
    reader.error = path + ": must be a JSON object";
    return false;
  }
  auto algorithm = reader.string(obj, path, "algorithm");
  if (!algorithm)
    return false;
  auto schedule = reader.string(obj, path, "schedule");
  if (!schedule)
    return false;
  auto microbatches = reader.boundedInt(obj, path, "microbatches", 1);
  if (!microbatches)
    return false;
  auto microbatch = reader.integerField(obj, path, "microbatch");
  if (!microbatch)
    return false;
  if (*microbatch < 1) {
    reader.error = path + ": 'microbatch' must be at least 1 (got " +
                   std::to_string(*microbatch) + ")";
    return false;
  }
  auto chunks = reader.boundedInt(obj, path, "chunks", 1, /*fallback=*/1);
  if (!chunks)
    return false;
  plan.algorithm = *algorithm;
  plan.schedule = *schedule;
  plan.microbatches = *microbatches;
  plan.microbatchSize = *microbatch;
  plan.chunks = *chunks;
  if (auto mode = obj.find("replica_mode"); mode != obj.end()) {
    if (!mode->is_string() || (*mode != "rr" && *mode != "split")) {
      reader.error = path + ": 'replica_mode' must be \"rr\" or \"split\"";
      return false;
    }
    plan.splitReplicas = *mode == "split";
  }

  auto stages = obj.find("stages");
  if (stages == obj.end() || !stages->is_array() || stages->empty()) {
    reader.error = path + ": 'stages' must be a non-empty list";
    return false;
  }
  for (size_t s = 0; s < stages->size(); ++s) {
    const json &entry = (*stages)[s];
    std::string where = path + ".stages[" + std::to_string(s) + "]";
    if (!entry.is_object()) {
      reader.error = where + ": must be a JSON object";
      return false;
    }
    StagePlan stage;
    auto first = reader.boundedInt(entry, where, "first_op", 0);
    if (!first)
      return false;
    auto last = reader.boundedInt(entry, where, "last_op", 0);
    if (!last)
      return false;
    auto replicas = reader.boundedInt(entry, where, "replicas", 1, 1);
    if (!replicas)
      return false;
    stage.firstLayer = *first;
    stage.lastLayer = *last;
    stage.replicas = *replicas;
    if (auto devices = entry.find("devices"); devices != entry.end()) {
      if (!devices->is_array()) {
        reader.error = where + ": 'devices' must be a list of integers";
        return false;
      }
      for (const json &device : *devices) {
        auto id = reader.integer(device, where, "devices");
        if (!id)
          return false;
        if (*id < 0 || *id > std::numeric_limits<int>::max()) {
          reader.error = where + ": 'devices' holds an invalid device " +
                         std::to_string(*id);
          return false;
        }
        stage.devices.push_back(static_cast<int>(*id));
      }
    }
    if (auto r = entry.find("recompute"); r != entry.end()) {
      if (!r->is_string() ||
          (*r != "none" && *r != "full" && *r != "selective")) {
        reader.error = where + ": 'recompute' must be \"none\", \"full\" "
                               "or \"selective\"";
        return false;
      }
      stage.recompute = r->get<std::string>();
    }
    plan.stages.push_back(std::move(stage));
  }

  if (auto predicted = obj.find("predicted"); predicted != obj.end()) {
    std::string where = path + ".predicted";
    if (!predicted->is_object()) {
      reader.error = where + ": must be a JSON object";
      return false;
    }
    auto iteration = reader.number(*predicted, where, "iteration_s");
    auto samples = iteration ? reader.number(*predicted, where, "samples_per_s")
                             : std::nullopt;
    auto bubble = samples ? reader.number(*predicted, where, "bubble_fraction")
                          : std::nullopt;
    if (!bubble)
      return false;
    plan.predicted.iterationSeconds = *iteration;
    plan.predicted.samplesPerSecond = *samples;
    plan.predicted.bubbleFraction = *bubble;
    if (auto memory = predicted->find("stage_memory_bytes");
        memory != predicted->end()) {
      if (!memory->is_array()) {
        reader.error = where + ": 'stage_memory_bytes' must be a list";
        return false;
      }
      for (const json &bytes : *memory) {
        auto value = reader.integer(bytes, where, "stage_memory_bytes");
        if (!value)
          return false;
        if (*value < 0) {
          reader.error = where + ": 'stage_memory_bytes' must be non-negative";
          return false;
        }
        plan.predicted.stageMemoryBytes.push_back(*value);
      }
    }
  }

  // Structural invariants, against the layer count the plan itself implies.
  if (std::string bad = validatePlan(plan, plan.stages.back().lastLayer + 1);
      !bad.empty()) {
    reader.error = path + ": " + bad;
    return false;
  }
  return true;
}

} // namespace

std::string planToJson(const Plan &plan) {
  ordered_json doc;
  doc["format"] = kPlanFormat;
  ordered_json body = planBody(plan);
  for (auto &item : body.items())
    doc[item.key()] = item.value();
  ordered_json candidates = ordered_json::array();
  for (const Plan &candidate : plan.candidates)
    candidates.push_back(planBody(candidate));
  doc["candidates"] = std::move(candidates);
  return doc.dump(2) + "\n";
}

PlanResult planFromJson(const std::string &text) {
  PlanResult result;
  json doc;
  if (std::string why = detail::openJsonDocument(text, kPlanFormat, doc);
      !why.empty()) {
    result.error = "plan: " + why;
    return result;
  }

  Reader reader;
  Plan plan;
  if (!parsePlanBody(doc, "plan", plan, reader)) {
    result.error = reader.error;
    return result;
  }
  if (auto candidates = doc.find("candidates"); candidates != doc.end()) {
    if (!candidates->is_array()) {
      result.error = "plan: 'candidates' must be a list";
      return result;
    }
    for (size_t i = 0; i < candidates->size(); ++i) {
      Plan candidate;
      if (!parsePlanBody((*candidates)[i],
                         "plan.candidates[" + std::to_string(i) + "]",
                         candidate, reader)) {
        result.error = reader.error;
        return result;
      }
      plan.candidates.push_back(std::move(candidate));
    }
  }
  result.ok = true;
  result.plan = std::move(plan);
  return result;
}

} // namespace pipec
