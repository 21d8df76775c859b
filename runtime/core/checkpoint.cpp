//===- checkpoint.cpp - Weights loading and checkpoints -------------------===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//

#include "core/checkpoint.h"

#include "core/error.h"
#include "core/safetensors.h"

#include <cstdio>
#include <filesystem>

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
    if (t->dtype != "F32" || t->shape != w.shape)
      throw RtError("weights file '" + path + "': tensor '" + w.name + "' is " +
                    t->dtype + " " + shapeString(t->shape) +
                    " but the stage needs F32 " + shapeString(w.shape));
    if (!file.read(*t, arena + w.offset, error))
      throw RtError(error);
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
    tensors.push_back({w.name, "F32", w.shape, arena + w.offset});
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

} // namespace rt
} // namespace pipec
