//===- checkpoint.cpp - Weights loading and checkpoints -------------------===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//

#include "core/checkpoint.h"

#include "core/error.h"
#include "pipec/formats/safetensors.h"

#include <cstdio>
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

} // namespace

void loadWeights(const StageDesc &desc, const std::string &path, char *arena) {
  if (desc.weights.empty())
    return;
  if (path.empty())
    throw RtError("the manifest names no weights file for stage " +
                  std::to_string(desc.stage) + ", which has " +
                  std::to_string(desc.weights.size()) + " weights");
  safetensors::File file;
  std::string error;
  if (!file.open(path, error))
    throw RtError(error);
  for (const WeightSpec &w : desc.weights) {
    const safetensors::TensorInfo *t = file.find(w.name);
    if (!t)
      throw RtError("weights file '" + path + "' has no tensor '" + w.name +
                    "'");
    const std::string want = desc.isF64() ? "F64" : "F32";
    if ((t->dtype != "F32" && t->dtype != "F64") || t->shape != w.shape)
      throw RtError("weights file '" + path + "': tensor '" + w.name + "' is " +
                    t->dtype + " " + shapeString(t->shape) +
                    " but the stage needs " + want + " " +
                    shapeString(w.shape));
    if (t->dtype == want) {
      if (!file.read(*t, arena + w.offset, error))
        throw RtError(error);
      continue;
    }
    // The other float type: float32 widens exactly into a float64 stage,
    // float64 rounds to nearest into a float32 one.
    std::vector<char> raw(size_t(t->end - t->begin));
    if (!file.read(*t, raw.data(), error))
      throw RtError(error);
    const size_t n = raw.size() / (t->dtype == "F64" ? 8 : 4);
    for (size_t i = 0; i < n; ++i) {
      if (t->dtype == "F64") {
        double v;
        std::memcpy(&v, raw.data() + 8 * i, 8);
        float f = float(v);
        std::memcpy(arena + w.offset + 4 * i, &f, 4);
      } else {
        float f;
        std::memcpy(&f, raw.data() + 4 * i, 4);
        double v = f;
        std::memcpy(arena + w.offset + 8 * i, &v, 8);
      }
    }
  }
}

std::string checkpointFolderName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%06lld",
                static_cast<long long>(step));
  return name;
}

std::string writeStageCheckpoint(const std::string &dir, int64_t step,
                                 const StageDesc &desc, const char *arena) {
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
  if (!safetensors::writeFile(path, tensors, meta, error))
    throw RtError("checkpoint: " + error);
  return folder.string();
}

void writeLatest(const std::string &dir, int64_t step) {
  std::string text = checkpointFolderName(step) + "\n";
  std::string path = (std::filesystem::path(dir) / "latest").string();
  std::string error;
  bool ok = safetensors::writeFileAtomic(
      path,
      [&](std::FILE *f, std::string &why) {
        if (std::fwrite(text.data(), 1, text.size(), f) == text.size())
          return true;
        why = "short write";
        return false;
      },
      error);
  if (!ok)
    throw RtError("checkpoint: " + error);
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
