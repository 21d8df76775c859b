//===- checkpoint.cpp - Weights loading and checkpoints -------------------===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//

#include "core/checkpoint.h"

#include "core/error.h"
#include "pipec/formats/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace pipec {
namespace rt {
namespace {

std::string shapeString(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// `text` into `path`, atomically (temporary name, fsync, rename).
void writeTextAtomic(const std::string &path, const std::string &text) {
  std::string error;
  if (!safetensors::writeFileAtomic(
          path,
          [&](std::FILE *f, std::string &why) {
            if (std::fwrite(text.data(), 1, text.size(), f) == text.size())
              return true;
            why = "short write";
            return false;
          },
          error))
    throw RtError("checkpoint: " + error);
}

} // namespace

void storeWeight(const StageDesc &desc, const WeightSpec &w,
                 const std::string &dtype, const char *raw, char *arena) {
  const std::string want = desc.isF64() ? "F64" : "F32";
  if (dtype == want) {
    std::memcpy(arena + w.offset, raw, size_t(w.bytes));
    return;
  }
  // The other float type: float32 widens exactly into a float64 stage,
  // float64 rounds to nearest into a float32 one.
  const int64_t n = w.bytes / (desc.isF64() ? 8 : 4);
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == "F64") {
      double v;
      std::memcpy(&v, raw + 8 * i, 8);
      float f = float(v);
      std::memcpy(arena + w.offset + 4 * i, &f, 4);
    } else {
      float f;
      std::memcpy(&f, raw + 4 * i, 4);
      double v = f;
      std::memcpy(arena + w.offset + 8 * i, &v, 8);
    }
  }
}

std::string weightMismatch(const StageDesc &desc, const WeightSpec &w,
                           const std::string &dtype,
                           const std::vector<int64_t> &shape) {
  if ((dtype == "F32" || dtype == "F64") && shape == w.shape)
    return "";
  return "tensor '" + w.name + "' is " + dtype + " " + shapeString(shape) +
         " but the stage needs " + (desc.isF64() ? "F64 " : "F32 ") +
         shapeString(w.shape);
}

namespace {

/// Copies the stage's weights from `files` (each weight from the first
/// file that has it) into the arena, checking dtype (F32/F64, converted)
/// and shape; `where` names the files in errors. A weight no file has is
/// an error, or with `missing` added to it.
void loadWeightsFrom(const StageDesc &desc,
                     std::vector<safetensors::File> &files,
                     const std::string &where, char *arena,
                     std::vector<WeightSpec> *missing = nullptr) {
  std::string error;
  for (const WeightSpec &w : desc.weights) {
    const safetensors::TensorInfo *t = nullptr;
    size_t k = 0;
    for (; k < files.size() && !t; ++k)
      t = files[k].find(w.name);
    if (!t && missing) {
      missing->push_back(w);
      continue;
    }
    if (!t)
      throw RtError(where + " has no tensor '" + w.name + "'");
    safetensors::File &file = files[k - 1];
    std::string bad = weightMismatch(desc, w, t->dtype, t->shape);
    if (!bad.empty())
      throw RtError("weights file '" + file.path() + "': " + bad);
    std::vector<char> raw(size_t(t->bytes()));
    if (!file.read(*t, raw.data(), error))
      throw RtError(error);
    storeWeight(desc, w, t->dtype, raw.data(), arena);
  }
}

} // namespace

void loadWeights(const StageDesc &desc, const std::string &path, char *arena) {
  if (desc.weights.empty())
    return;
  if (path.empty())
    throw RtError("the manifest names no weights file for stage " +
                  std::to_string(desc.stage) + ", which has " +
                  std::to_string(desc.weights.size()) + " weights");
  std::vector<safetensors::File> files(1);
  std::string error;
  if (!files[0].open(path, error))
    throw RtError(error);
  loadWeightsFrom(desc, files, "weights file '" + path + "'", arena);
}

namespace {

/// A step folder's checkpoint.json (pipec.checkpoint-manifest/1) at
/// `listPath`; false when there is none (a checkpoint written before the
/// manifests existed). Throws RtError when it is not valid JSON.
bool readCheckpointList(const std::string &listPath, nlohmann::json &doc) {
  std::ifstream in(listPath);
  if (!in)
    return false;
  try {
    in >> doc;
  } catch (const std::exception &e) {
    throw RtError("cannot resume: '" + listPath + "' is not valid JSON (" +
                  e.what() + ")");
  }
  // The fields this file's readers take, with their types (a wrong type
  // would otherwise surface as a bare JSON exception naming no file).
  auto bad = [&](const std::string &what) {
    throw RtError("cannot resume: '" + listPath + "' is not a valid " +
                  "pipec.checkpoint-manifest/1: " + what);
  };
  if (!doc.is_object())
    bad("the top level is not a JSON object");
  if (doc.value("format", nlohmann::json()) != "pipec.checkpoint-manifest/1")
    bad("\"format\" is not \"pipec.checkpoint-manifest/1\"");
  if (!doc.contains("stages") || !doc["stages"].is_array())
    bad("\"stages\" is not a list");
  for (const nlohmann::json &e : doc["stages"]) {
    if (!e.is_object())
      bad("an entry of \"stages\" is not an object");
    auto has = [&](const char *key, bool ok) {
      if (!e.contains(key) || !ok)
        bad(std::string("an entry of \"stages\" has no ") + key +
            " of the right type");
    };
    has("stage", e.contains("stage") && e["stage"].is_number_integer());
    has("file", e.contains("file") && e["file"].is_string());
    has("bytes", e.contains("bytes") && e["bytes"].is_number_integer());
    has("fnv1a64", e.contains("fnv1a64") && e["fnv1a64"].is_string());
    if (e.contains("hosts")) {
      if (!e["hosts"].is_array())
        bad("an entry's \"hosts\" is not a list");
      for (const nlohmann::json &h : e["hosts"])
        if (!h.is_string())
          bad("an entry's \"hosts\" holds a non-string");
    }
  }
  return true;
}

/// "a, b": the hosts an entry of checkpoint.json lists for its file.
std::string listedHosts(const nlohmann::json &entry) {
  std::string hosts;
  for (const nlohmann::json &h : entry.value("hosts", nlohmann::json::array()))
    hosts += (hosts.empty() ? "" : ", ") + h.get<std::string>();
  return hosts;
}

/// Throws RtError naming `path` when its size or checksum differs from its
/// entry of checkpoint.json (at `listPath`).
void checkListedFile(const std::string &path, const nlohmann::json &entry,
                     const std::string &listPath) {
  int64_t bytes = 0;
  std::string sum = fileChecksum(path, bytes);
  if (bytes != entry.value("bytes", int64_t(-1)) ||
      sum != entry.value("fnv1a64", std::string()))
    throw RtError(
        "cannot resume: " + path + " is corrupt (" + std::to_string(bytes) +
        " bytes, checksum " + sum + "; " + listPath + " says " +
        std::to_string(entry.value("bytes", int64_t(-1))) +
        " bytes, checksum " + entry.value("fnv1a64", std::string("?")) +
        ", written on " + listedHosts(entry) + ")");
}

} // namespace

HeldCheckpoint openHeldCheckpoint(const std::string &from) {
  namespace fs = std::filesystem;
  HeldCheckpoint held;
  fs::path folder = from;
  // A checkpoints folder: the step its `latest` names (on this host).
  if (fs::exists(folder / "latest"))
    folder /= checkpointFolderName(readLatest(folder.string()));
  held.folder = folder.string();
  std::error_code ec;
  for (const fs::directory_entry &e : fs::directory_iterator(folder, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind("stage", 0) == 0 && e.path().extension() == ".safetensors")
      held.paths.push_back(e.path().string());
  }
  if (held.paths.empty())
    return held; // another host may hold them
  std::sort(held.paths.begin(), held.paths.end());
  // checkpoint.json (when the folder has one) lists each file's size and
  // checksum: a file that differs is refused by name.
  nlohmann::json list;
  const std::string listPath = (folder / "checkpoint.json").string();
  readCheckpointList(listPath, list);
  held.files.resize(held.paths.size());
  std::string error;
  for (size_t i = 0; i < held.paths.size(); ++i) {
    const std::string &path = held.paths[i];
    const std::string file = fs::path(path).filename().string();
    for (const nlohmann::json &e :
         list.value("stages", nlohmann::json::array())) {
      if (e.value("file", std::string()) == file)
        checkListedFile(path, e, listPath);
    }
    if (!held.files[i].open(path, error))
      throw RtError("cannot resume: " + error);
    std::string format, stepText;
    for (const auto &[k, v] : held.files[i].metadata()) {
      if (k == "format")
        format = v;
      if (k == "step")
        stepText = v;
    }
    if (format != "pipec.checkpoint/1")
      throw RtError("cannot resume: '" + path +
                    "' is not a pipec checkpoint (format '" + format + "')");
    int64_t step = std::atoll(stepText.c_str());
    if (held.step >= 0 && step != held.step)
      throw RtError("cannot resume: the stage files in '" + held.folder +
                    "' are of different steps (" + std::to_string(held.step) +
                    " and " + std::to_string(step) + ")");
    held.step = step;
  }
  return held;
}

std::vector<WeightSpec> loadHeldWeights(HeldCheckpoint &held,
                                        const StageDesc &desc, char *arena) {
  std::vector<WeightSpec> missing;
  loadWeightsFrom(desc, held.files, "checkpoint '" + held.folder + "'", arena,
                  &missing);
  return missing;
}

const safetensors::TensorInfo *HeldCheckpoint::find(const std::string &name,
                                                    size_t *file) const {
  for (size_t k = 0; k < files.size(); ++k)
    if (const safetensors::TensorInfo *t = files[k].find(name)) {
      if (file)
        *file = k;
      return t;
    }
  return nullptr;
}

std::vector<char> HeldCheckpoint::read(const std::string &name) const {
  size_t k = 0;
  const safetensors::TensorInfo *t = find(name, &k);
  if (!t)
    throw RtError("internal error: checkpoint '" + folder +
                  "' on this host has no tensor '" + name + "'");
  std::vector<char> raw(size_t(std::max<uint64_t>(t->bytes(), 1)));
  std::string error;
  if (!files[k].read(*t, raw.data(), error))
    throw RtError("cannot resume: " + error);
  return raw;
}

std::string checkpointFolderName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%06lld",
                static_cast<long long>(step));
  return name;
}

std::string writeStageCheckpoint(const std::string &dir, int64_t step,
                                 const StageDesc &desc, const char *arena,
                                 safetensors::FileDigest *digest) {
  namespace fs = std::filesystem;
  fs::path folder = fs::path(dir) / checkpointFolderName(step);
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec)
    throw RtError("cannot create checkpoint folder '" + folder.string() +
                  "': " + ec.message());
  std::vector<safetensors::TensorRef> tensors;
  for (const WeightSpec &w : desc.weights)
    tensors.push_back(
        {w.name, desc.isF64() ? "F64" : "F32", w.shape, arena + w.offset});
  safetensors::Metadata meta = {{"format", "pipec.checkpoint/1"},
                                {"build_id", desc.buildId},
                                {"stage", std::to_string(desc.stage)},
                                {"step", std::to_string(step)}};
  std::string path =
      (folder / ("stage" + std::to_string(desc.stage) + ".safetensors"))
          .string();
  std::string error;
  if (!safetensors::writeFile(path, tensors, meta, error, digest))
    throw RtError("checkpoint: " + error);
  return folder.string();
}

std::string checksumText(const safetensors::FileDigest &digest) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(digest.fnv1a));
  return hex;
}

std::string fileChecksum(const std::string &path, int64_t &bytes) {
  std::FILE *f = std::fopen(path.c_str(), "rb");
  if (!f)
    throw RtError("cannot read '" + path + "': " + std::strerror(errno));
  safetensors::FileDigest digest;
  std::vector<unsigned char> buffer(size_t(1) << 20);
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), f)) > 0) {
    digest.fnv1a = safetensors::fnv1a64(digest.fnv1a, buffer.data(), n);
    digest.bytes += n;
  }
  bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed)
    throw RtError("cannot read '" + path + "'");
  bytes = int64_t(digest.bytes);
  return checksumText(digest);
}

void writeCheckpointManifest(const std::string &dir, int64_t step,
                             const std::string &buildId,
                             const std::vector<CheckpointEntry> &stages) {
  nlohmann::ordered_json doc;
  doc["format"] = "pipec.checkpoint-manifest/1";
  doc["step"] = step;
  doc["build_id"] = buildId;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const CheckpointEntry &e : stages)
    list.push_back({{"stage", e.stage},
                    {"file", e.file},
                    {"hosts", e.hosts},
                    {"bytes", e.bytes},
                    {"fnv1a64", e.checksum}});
  doc["stages"] = list;
  std::string text = doc.dump(2) + "\n";
  std::string path = (std::filesystem::path(dir) /
                      checkpointFolderName(step) / "checkpoint.json")
                         .string();
  writeTextAtomic(path, text);
}

void verifyStageCheckpoint(const std::string &dir, int64_t step,
                           const StageDesc &desc) {
  std::filesystem::path folder =
      std::filesystem::path(dir) / checkpointFolderName(step);
  const std::string listPath = (folder / "checkpoint.json").string();
  nlohmann::json doc;
  if (!readCheckpointList(listPath, doc)) {
    // Written before checkpoint manifests existed, or the file was lost:
    // the stage files load unchecked, and the user is told (once, by the
    // first stage's first replica).
    if (desc.stage == 0 && desc.replica == 0)
      std::fprintf(stderr,
                   "pipec-rt: warning: '%s' is missing: the stage files of "
                   "this checkpoint load without their size and checksum "
                   "check\n",
                   listPath.c_str());
    return;
  }
  const std::string file = "stage" + std::to_string(desc.stage) +
                           ".safetensors";
  for (const nlohmann::json &e : doc.value("stages", nlohmann::json::array())) {
    if (e.value("stage", int64_t(-1)) != desc.stage)
      continue;
    std::string path = (folder / file).string();
    if (!std::filesystem::exists(path))
      throw RtError("cannot resume: " + path + " is missing on this host (" +
                    listPath + " lists it as written on " + listedHosts(e) +
                    ")");
    checkListedFile(path, e, listPath);
    return;
  }
  throw RtError("cannot resume: " + listPath + " does not list stage " +
                std::to_string(desc.stage));
}

void writeLatest(const std::string &dir, int64_t step) {
  writeTextAtomic((std::filesystem::path(dir) / "latest").string(),
                  checkpointFolderName(step) + "\n");
}

int64_t readLatest(const std::string &dir) {
  std::string path = (std::filesystem::path(dir) / "latest").string();
  std::ifstream in(path);
  if (!in)
    throw RtError("cannot resume: '" + path +
                  "' does not exist (no checkpoint was written there)");
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r'))
    s.pop_back();
  const std::string prefix = "step-";
  if (s.rfind(prefix, 0) != 0 || s.size() == prefix.size() ||
      s.find_first_not_of("0123456789", prefix.size()) != std::string::npos ||
      s.size() > prefix.size() + 12)
    throw RtError("cannot resume: '" + path + "' holds '" + s.substr(0, 40) +
                  "', not a checkpoint folder name like step-000042");
  return std::stoll(s.substr(prefix.size()));
}

void loadStageCheckpoint(const std::string &dir, int64_t step,
                         const StageDesc &desc, char *arena) {
  std::string path = (std::filesystem::path(dir) / checkpointFolderName(step) /
                      ("stage" + std::to_string(desc.stage) + ".safetensors"))
                         .string();
  safetensors::File file;
  std::string error;
  if (!file.open(path, error))
    throw RtError("cannot resume: " + error);
  auto get = [&](const char *key) -> std::string {
    for (const auto &[k, v] : file.metadata())
      if (k == key)
        return v;
    return "";
  };
  if (get("format") != "pipec.checkpoint/1")
    throw RtError("cannot resume: '" + path +
                  "' is not a pipec checkpoint (format '" + get("format") +
                  "')");
  if (get("build_id") != desc.buildId)
    throw RtError("cannot resume: checkpoint '" +
                  (std::filesystem::path(dir) / checkpointFolderName(step))
                      .string() +
                  "' was written by build " +
                  get("build_id") + " but this is build " + desc.buildId +
                  " (recompiled with other options?)");
  if (get("stage") != std::to_string(desc.stage) ||
      get("step") != std::to_string(step))
    throw RtError("cannot resume: '" + path + "' says stage " + get("stage") +
                  ", step " + get("step") + "; expected stage " +
                  std::to_string(desc.stage) + ", step " +
                  std::to_string(step));
  loadWeights(desc, path, arena);
}

} // namespace rt
} // namespace pipec
