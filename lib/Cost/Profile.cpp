//===- Profile.cpp - profile.json reader and writer -----------------------===//
//
// Reads and writes `pipec.profile/1` (DESIGN.md §7): a list of ops in
// topological order with forward/backward seconds and byte counts. Every
// rejection names the op it is about, so a user can fix a hand-written
// profile without guessing.
//
//===----------------------------------------------------------------------===//

#include "pipec/Profile.h"

#include "pipec/detail/JsonDocument.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <unordered_map>

using nlohmann::json;
using nlohmann::ordered_json;

namespace pipec {

namespace {

constexpr const char *kProfileFormat = "pipec.profile/1";

/// Describes op `index` for diagnostics: `op 3 ('conv1')`.
std::string describeOp(size_t index, const std::string &name) {
  std::string text = "op " + std::to_string(index);
  if (!name.empty())
    text += " ('" + name + "')";
  return text;
}

/// Reads a non-negative finite number, or sets `error`.
std::optional<double> readSeconds(const json &obj, const char *key,
                                  const std::string &what, std::string &error) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null())
    return 0.0;
  if (!it->is_number()) {
    error = what + ": '" + key + "' must be a number";
    return std::nullopt;
  }
  double value = it->get<double>();
  if (!std::isfinite(value) || value < 0) {
    error = what + ": '" + key + "' must be a non-negative number (got " +
            it->dump() + ")";
    return std::nullopt;
  }
  return value;
}

/// Reads a non-negative integral count; accepts integral floating values such
/// as `1e9`, which paper-scale profiles tend to contain.
std::optional<int64_t> readCount(const json &obj, const char *key,
                                 const std::string &what, std::string &error) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null())
    return int64_t(0);
  if (it->is_number_unsigned()) {
    uint64_t value = it->get<uint64_t>();
    if (value > uint64_t(std::numeric_limits<int64_t>::max())) {
      error = what + ": '" + key + "' is too large";
      return std::nullopt;
    }
    return int64_t(value);
  }
  if (it->is_number_integer()) {
    int64_t value = it->get<int64_t>();
    if (value < 0) {
      error = what + ": '" + key + "' must be non-negative (got " +
              std::to_string(value) + ")";
      return std::nullopt;
    }
    return value;
  }
  if (it->is_number_float()) {
    double value = it->get<double>();
    if (!std::isfinite(value) || value < 0 || value != std::floor(value) ||
        value >= 9.2e18) {
      error = what + ": '" + key +
              "' must be a non-negative whole number of bytes (got " +
              it->dump() + ")";
      return std::nullopt;
    }
    return int64_t(value);
  }
  error = what + ": '" + key + "' must be a number";
  return std::nullopt;
}

ProfileResult fail(std::string message) {
  ProfileResult result;
  result.ok = false;
  result.error = "profile: " + std::move(message);
  return result;
}

/// Op `i` of a profile's "ops" (names already checked unique and indexed
/// in `indexOfName`); nullopt with `error` set when a field is invalid.
std::optional<ProfileOp>
readOp(const json &entry, size_t i,
       const std::unordered_map<std::string, int> &indexOfName,
       std::string &error) {
  const size_t numOps = indexOfName.size();
  auto failOp = [&](std::string message) {
    error = std::move(message);
    return std::nullopt;
  };
  ProfileOp op;
  op.name = entry["name"].get<std::string>();
  std::string what = describeOp(i, op.name);
  if (auto kind = entry.find("op"); kind != entry.end()) {
    if (!kind->is_string())
      return failOp(what + ": 'op' must be a string");
    op.op = kind->get<std::string>();
  }
  for (auto [key, field] : {std::make_pair("fwd_s", &op.fwdSeconds),
                            std::make_pair("bwd_s", &op.bwdSeconds),
                            std::make_pair("opt_s", &op.optSeconds),
                            std::make_pair("fwd_flops", &op.fwdFlops),
                            std::make_pair("bwd_flops", &op.bwdFlops),
                            std::make_pair("bytes", &op.touchedBytes)}) {
    std::optional<double> seconds = readSeconds(entry, key, what, error);
    if (!seconds)
      return std::nullopt;
    *field = *seconds;
  }
  for (auto [key, field] :
       {std::make_pair("out_bytes", &op.outBytes),
        std::make_pair("param_bytes", &op.paramBytes),
        std::make_pair("saved_bytes", &op.savedBytes),
        std::make_pair("fwd_scratch_bytes", &op.fwdScratchBytes),
        std::make_pair("bwd_scratch_bytes", &op.bwdScratchBytes),
        std::make_pair("carried_bytes", &op.carriedBytes),
        std::make_pair("bwd_scratch_recomputed_bytes",
                       &op.bwdRecomputedScratchBytes)}) {
    std::optional<int64_t> bytes = readCount(entry, key, what, error);
    if (!bytes)
      return std::nullopt;
    *field = *bytes;
  }
  if (auto reads = entry.find("saved_reads");
      reads != entry.end() && !reads->is_null()) {
    const int64_t numOps = static_cast<int64_t>(indexOfName.size());
    const std::string shape =
        ": 'saved_reads' must list [op offset, bytes] pairs of integers, "
        "the offset to an op of the profile and the bytes non-negative";
    if (!reads->is_array())
      return failOp(what + shape);
    for (const json &read : *reads) {
      if (!read.is_array() || read.size() != 2 ||
          !read[0].is_number_integer() || !read[1].is_number_integer())
        return failOp(what + shape);
      const int64_t offset = read[0].get<int64_t>(),
                    bytes = read[1].get<int64_t>();
      const int64_t reader = static_cast<int64_t>(i) + offset;
      if (bytes < 0 || reader < 0 || reader >= numOps)
        return failOp(what + shape + " (got " + read.dump() + ")");
      op.savedReads.push_back({static_cast<int>(offset), bytes});
    }
  }

  auto inputs = entry.find("inputs");
  if (inputs == entry.end() || inputs->is_null())
    return op;
  if (!inputs->is_array())
    return failOp(what + ": 'inputs' must be a list of op names or indices");
  for (const json &input : *inputs) {
    int producer = -1;
    if (input.is_string()) {
      auto found = indexOfName.find(input.get<std::string>());
      if (found == indexOfName.end())
        return failOp(what + ": input " + input.dump() +
                      " is not the name of an op");
      producer = found->second;
    } else if (input.is_number_integer()) {
      int64_t index = input.get<int64_t>();
      if (index < 0 || index >= static_cast<int64_t>(numOps))
        return failOp(what + ": input index " + std::to_string(index) +
                      " is out of range (" + std::to_string(numOps) + " ops)");
      producer = static_cast<int>(index);
    } else {
      return failOp(what + ": input " + input.dump() +
                    " must be an op name or index");
    }
    if (producer >= static_cast<int>(i))
      return failOp(what + ": input " + input.dump() +
                    " is not an earlier op (ops must be in topological "
                    "order)");
    op.inputs.push_back(producer);
  }
  return op;
}

} // namespace

std::vector<int> Profile::producersOf(int i) const {
  if (i < 0 || i >= static_cast<int>(ops.size()))
    return {};
  const ProfileOp &op = ops[i];
  if (op.inputs.empty()) {
    if (i > 0)
      return {i - 1};
    return {};
  }
  return op.inputs;
}

ProfileResult profileFromJson(const std::string &text) {
  json doc;
  if (std::string why = detail::openJsonDocument(text, kProfileFormat, doc);
      !why.empty())
    return fail(why);

  Profile profile;
  std::string error;
  if (auto device = doc.find("device"); device != doc.end()) {
    if (!device->is_string())
      return fail("'device' must be a string");
    profile.device = device->get<std::string>();
  }
  if (doc.contains("microbatch")) {
    std::optional<int64_t> microbatch =
        readCount(doc, "microbatch", "top level", error);
    if (!microbatch)
      return fail(error);
    if (*microbatch < 1)
      return fail("'microbatch' must be at least 1");
    profile.microbatch = *microbatch;
  }

  if (auto model = doc.find("memory_model"); model != doc.end()) {
    if (!model->is_string() || (model->get<std::string>() != "arena" &&
                                !model->get<std::string>().empty()))
      return fail("'memory_model' must be \"arena\" (or absent), got " +
                  model->dump());
    profile.memoryModel = model->get<std::string>();
  }

  for (auto [key, field] :
       {std::make_pair("input_bytes", &profile.inputBytes),
        std::make_pair("label_bytes", &profile.labelBytes)}) {
    std::optional<int64_t> bytes = readCount(doc, key, "top level", error);
    if (!bytes)
      return fail(error);
    *field = *bytes;
  }
  std::optional<double> copyRate =
      readSeconds(doc, "copy_bytes_per_s", "top level", error);
  if (!copyRate)
    return fail(error);
  profile.copyBytesPerSecond = *copyRate;
  std::optional<double> overhead =
      readSeconds(doc, "op_overhead_s", "top level", error);
  if (!overhead)
    return fail(error);
  profile.opOverheadSeconds = *overhead;

  auto ops = doc.find("ops");
  if (ops == doc.end() || !ops->is_array())
    return fail("'ops' must be a list of ops");

  // All names first, so that a forward reference can be told apart from a
  // name that does not exist at all.
  std::unordered_map<std::string, int> indexOfName;
  for (size_t i = 0; i < ops->size(); ++i) {
    const json &entry = (*ops)[i];
    if (!entry.is_object())
      return fail(describeOp(i, "") + " must be a JSON object");
    auto name = entry.find("name");
    if (name == entry.end() || !name->is_string() ||
        name->get<std::string>().empty())
      return fail(describeOp(i, "") + ": 'name' must be a non-empty string");
    std::string nameText = name->get<std::string>();
    auto [it, inserted] = indexOfName.emplace(nameText, static_cast<int>(i));
    if (!inserted)
      return fail(describeOp(i, nameText) + ": duplicate name (also op " +
                  std::to_string(it->second) + ")");
  }

  profile.ops.reserve(ops->size());
  for (size_t i = 0; i < ops->size(); ++i) {
    std::optional<ProfileOp> op = readOp((*ops)[i], i, indexOfName, error);
    if (!op)
      return fail(error);
    profile.ops.push_back(std::move(*op));
  }

  ProfileResult result;
  result.ok = true;
  result.profile = std::move(profile);
  return result;
}

std::string profileToJson(const Profile &profile) {
  ordered_json ops = ordered_json::array();
  for (const ProfileOp &op : profile.ops) {
    ordered_json entry = {{"name", op.name},
                          {"op", op.op},
                          {"fwd_s", op.fwdSeconds},
                          {"bwd_s", op.bwdSeconds},
                          {"out_bytes", op.outBytes},
                          {"param_bytes", op.paramBytes},
                          {"saved_bytes", op.savedBytes}};
    if (op.fwdScratchBytes > 0 || op.bwdScratchBytes > 0 ||
        op.bwdRecomputedScratchBytes > 0) {
      entry["fwd_scratch_bytes"] = op.fwdScratchBytes;
      entry["bwd_scratch_bytes"] = op.bwdScratchBytes;
      entry["bwd_scratch_recomputed_bytes"] = op.bwdRecomputedScratchBytes;
    }
    if (op.carriedBytes > 0)
      entry["carried_bytes"] = op.carriedBytes;
    if (!op.savedReads.empty())
      entry["saved_reads"] = op.savedReads;
    if (op.optSeconds > 0)
      entry["opt_s"] = op.optSeconds;
    if (op.fwdFlops > 0 || op.bwdFlops > 0 || op.touchedBytes > 0) {
      entry["fwd_flops"] = op.fwdFlops;
      entry["bwd_flops"] = op.bwdFlops;
      entry["bytes"] = op.touchedBytes;
    }
    // An empty list means "the previous op"; keep it implicit.
    if (!op.inputs.empty()) {
      ordered_json inputs = ordered_json::array();
      for (int producer : op.inputs) {
        if (producer >= 0 && producer < static_cast<int>(profile.ops.size()))
          inputs.push_back(profile.ops[producer].name);
        else
          inputs.push_back(producer);
      }
      entry["inputs"] = std::move(inputs);
    }
    ops.push_back(std::move(entry));
  }
  ordered_json doc = {{"format", kProfileFormat},
                      {"device", profile.device},
                      {"microbatch", profile.microbatch}};
  if (!profile.memoryModel.empty())
    doc["memory_model"] = profile.memoryModel;
  if (profile.inputBytes > 0 || profile.labelBytes > 0) {
    doc["input_bytes"] = profile.inputBytes;
    doc["label_bytes"] = profile.labelBytes;
  }
  if (profile.copyBytesPerSecond > 0)
    doc["copy_bytes_per_s"] = profile.copyBytesPerSecond;
  if (profile.opOverheadSeconds > 0)
    doc["op_overhead_s"] = profile.opOverheadSeconds;
  doc["ops"] = std::move(ops);
  return doc.dump(2) + "\n";
}

} // namespace pipec
