//===- checkpoint.h - Weights loading and checkpoints -----------*- C++ -*-===//
//
// Part of pipec's runtime core.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// Moves a stage's weights between safetensors files and the arena:
/// loading the initial weights named by the manifest, and writing
/// checkpoints `DIR/step-NNNNNN/stageK.safetensors` plus `DIR/latest` (a
/// text file holding the newest step folder's name). Every file is written
/// atomically (temporary name, fsync, rename). Failures throw RtError.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_RUNTIME_CORE_CHECKPOINT_H
#define PIPEC_RUNTIME_CORE_CHECKPOINT_H

#include "core/stage.h"
#include "pipec/formats/safetensors.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pipec {
namespace rt {

/// Copies every weight of `desc` from the safetensors file `path` into the
/// arena at its offset, checking presence, dtype (F32) and shape. Tensors
/// of the file that the stage does not use are ignored.
void loadWeights(const StageDesc &desc, const std::string &path, char *arena);

/// The stage files of a checkpoint written by another build of the same
/// model (other stage count, schedule, replicas or hosts) that this host
/// holds: `--resume-from` loads each weight (and optimizer state) by name,
/// from these files or, through the communicator, from another host's
/// (core/resume.cpp).
struct HeldCheckpoint {
  /// The step folder as found on this host.
  std::string folder;
  /// The files' step; -1 when this host holds none of them.
  int64_t step = -1;
  /// The stage files here, sorted, and opened.
  std::vector<std::string> paths;
  std::vector<safetensors::File> files;

  /// The first file's entry named `name` (its index in `file`), or null.
  const safetensors::TensorInfo *find(const std::string &name,
                                      size_t *file = nullptr) const;
  /// The bytes of the tensor named `name` (which `find` finds).
  std::vector<char> read(const std::string &name) const;
};

/// Opens the stage files of `from` (a step folder, or a checkpoints folder
/// whose `latest` names one) that this host holds, each checked against
/// the folder's checkpoint.json (size and checksum, when listed). A host
/// with none gives step -1. Throws RtError naming a corrupt file, one that
/// is not a pipec checkpoint, or files of different steps.
HeldCheckpoint openHeldCheckpoint(const std::string &from);

/// Copies the weights of `desc` that `held` has into the arena (checking
/// dtype and shape); returns those it lacks.
std::vector<WeightSpec> loadHeldWeights(HeldCheckpoint &held,
                                        const StageDesc &desc, char *arena);

/// "" when a tensor of `dtype` and `shape` can fill `w` (F32 or F64 of its
/// shape), else why not.
std::string weightMismatch(const StageDesc &desc, const WeightSpec &w,
                           const std::string &dtype,
                           const std::vector<int64_t> &shape);

/// Writes a tensor of `dtype` (F32 or F64, `w`'s shape) at `w`'s place in
/// the arena, converted to the stage's precision (F32 widens exactly, F64
/// rounds to nearest).
void storeWeight(const StageDesc &desc, const WeightSpec &w,
                 const std::string &dtype, const char *raw, char *arena);

/// "step-000042" for step 42 (the number of completed steps).
std::string checkpointFolderName(int64_t step);

/// Writes `<dir>/step-NNNNNN/stage<K>.safetensors` from the arena (creating
/// the folders) and returns the step folder's path. The file's
/// __metadata__ records format "pipec.checkpoint/1", build_id, stage, step.
std::string writeStageCheckpoint(const std::string &dir, int64_t step,
                                 const StageDesc &desc, const char *arena,
                                 safetensors::FileDigest *digest = nullptr);

/// A digest's checksum as checkpoint.json writes it (16 hex digits).
std::string checksumText(const safetensors::FileDigest &digest);

/// FNV-1a (64 bit) of a file's bytes as 16 hex digits, and its size;
/// throws RtError when it cannot be read.
std::string fileChecksum(const std::string &path, int64_t &bytes);

/// One stage file of a checkpoint as `checkpoint.json` lists it.
struct CheckpointEntry {
  int64_t stage = 0;
  std::string file, checksum;
  std::vector<std::string> hosts; ///< every host holding a copy
  int64_t bytes = 0;
};

/// `<dir>/step-NNNNNN/checkpoint.json` (format pipec.checkpoint-manifest/1:
/// step, build_id, and per stage its file, the hosts that hold it, its
/// size and checksum), written atomically.
void writeCheckpointManifest(const std::string &dir, int64_t step,
                             const std::string &buildId,
                             const std::vector<CheckpointEntry> &stages);

/// Checks this stage's file of checkpoint `step` against the folder's
/// checkpoint.json when there is one (a checkpoint written before it has
/// none): present, of the listed size and checksum. Throws RtError naming
/// the file and the host that wrote it.
void verifyStageCheckpoint(const std::string &dir, int64_t step,
                           const StageDesc &desc);

/// Atomically points `<dir>/latest` at the step folder of `step`.
void writeLatest(const std::string &dir, int64_t step);

/// The step that `<dir>/latest` names; throws RtError (naming the file) when
/// it is missing or malformed.
int64_t readLatest(const std::string &dir);

/// Loads this stage's file of checkpoint `step` in `dir` into the arena,
/// after checking its metadata: format, the build id (a checkpoint of
/// another build is refused), stage and step.
void loadStageCheckpoint(const std::string &dir, int64_t step,
                         const StageDesc &desc, char *arena);

} // namespace rt
} // namespace pipec

#endif // PIPEC_RUNTIME_CORE_CHECKPOINT_H
