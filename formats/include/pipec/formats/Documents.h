//===- Documents.h - the stage description and the manifest ----*- C++ -*-===//
//
// Part of pipec's formats library: the one schema of what the compiler
// tells the runtime, written by the compiler (passes/LowerToRuntime.cpp,
// tools/pipec/Compile.cpp) and read by the runtime (runtime/core) through
// these functions only.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The two JSON documents a stage executable starts from: its own stage
/// description (`pipec.stage/2`, compiled into the binary) and the build's
/// manifest (`pipec.manifest/1`, a file). See runtime/README.md for both.
/// Parsing validates everything the runtime later relies on, so the rest of
/// the runtime can index without checks; failures throw FormatError (the
/// runtime's RtError). Writing never throws.
///
//===----------------------------------------------------------------------===//

#ifndef PIPEC_FORMATS_DOCUMENTS_H
#define PIPEC_FORMATS_DOCUMENTS_H

#include "pipec/formats/StagePolicy.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace pipec {
namespace formats {

/// A document that cannot be read: what() is one line naming the document
/// and the field.
class FormatError : public std::runtime_error {
public:
  explicit FormatError(const std::string &message)
      : std::runtime_error(message) {}
};

/// The formats this library writes and reads.
constexpr const char *kStageFormat = "pipec.stage/2";
constexpr const char *kManifestFormat = "pipec.manifest/1";

/// A weight of this stage: F32 (F64 in the float64 reference mode), placed
/// in the arena at `offset`.
struct WeightSpec {
  std::string name;
  int64_t offset = 0;
  std::vector<int64_t> shape;
  int64_t bytes = 0;
};

/// One entry of the stage description's "feeds".
struct FeedSpec {
  enum class Kind { Input, Labels };
  Kind kind = Kind::Input;
  std::string name;
  /// Model input number (inputs only).
  int64_t index = 0;
  /// Microbatch shape; shape[0] is the microbatch size.
  std::vector<int64_t> shape;
  /// Integer (int64) elements: labels, and integer model inputs such as
  /// token ids.
  bool isInt = false;
  /// Bound of integer feeds (classes, vocabulary): values lie in
  /// [0, classes) for synthetic data and are checked in files.
  int64_t classes = 0;
  /// Elements of one sample (product of shape[1:]).
  int64_t sampleElems = 1;
  /// Bytes of one microbatch (float or i64 elements).
  int64_t bytes = 0;
  /// Bytes of a float element (4, or 8 in a float64 stage).
  int realBytes = 4;
};

/// One entry of the stage description's "ops" (profiler metadata).
struct OpSpec {
  std::string name;
  std::string op;
  int64_t outBytes = 0, paramBytes = 0, savedBytes = 0;
  /// The most scratch bytes live while one of the op's kernels runs, in the
  /// forward and in the backward.
  int64_t fwdScratchBytes = 0, bwdScratchBytes = 0;
  /// What a split backward (zero bubble) carries for the op.
  int64_t carriedBytes = 0;
  std::vector<std::string> inputs;
  /// The op's stashed values by the op whose backward reads them last:
  /// (that op's index minus this op's, bytes). With recomputation a value
  /// lives in scratch until then.
  std::vector<std::pair<int64_t, int64_t>> savedReads = {};
  /// The op's backward working set with the stashed values it reads last
  /// in scratch until their last read (as recomputation has them).
  int64_t bwdRecomputedScratchBytes = 0;
  /// The cost model's count of one microbatch's work (nn::CostOpInterface):
  /// forward and backward FLOPs and the bytes the forward touches, written
  /// into the profile beside the measured times (pipec/Calibrate.h).
  double fwdFlops = 0, bwdFlops = 0, touchedBytes = 0;
};

/// One multi-tensor call of a step function (the optimizer updates of
/// several ops in one kernel call): the ops ("ops" indices) whose updates
/// it runs and each one's elements. The profiler times the call as one
/// span and shares it among the ops by elements.
struct FusedUpdate {
  std::vector<int64_t> ops;
  std::vector<int64_t> elements;
};

/// A parsed `pipec.stage/2` document.
struct StageDesc {
  std::string buildId;
  int stage = 0;
  int numStages = 0;
  int64_t microbatches = 0, microbatch = 0, globalBatch = 0;
  /// The schedule's name, for messages only: behaviour follows `policy`.
  std::string schedule;
  /// Update rule, flush or continuous, weight versions kept
  /// (pipec/formats/StagePolicy.h).
  formats::StagePolicy policy;
  /// Continuous schedules: how many microbatches before its first a
  /// window reaches back (p - 1 straight; more with replicas), the same on
  /// every rank; the run ends with ceil(windowReach / m) draining windows.
  int64_t windowReach = 0;
  /// Groups of stages that share tied weights, in the order every rank
  /// creates their communicators (pipec_rt_allreduce_group's `group`).
  std::vector<std::vector<int64_t>> tieGroups;
  int64_t arenaBytes = 0;
  /// Bytes at the arena's start holding the parameters the forward reads:
  /// what a weight version (stash, 2BW shadow) copies.
  int64_t versionedBytes = 0;
  /// Activation stash slots (microbatch k uses slot (k / replicas) mod
  /// slots).
  int64_t slots = 1;
  /// This binary runs replica `replica` of `replicas` of its stage
  /// (1F1B-RR: microbatches replica, replica + replicas, ...).
  int64_t replica = 0, replicas = 1;
  /// Split replicas (DAPPLE, "replica_split"): every replica runs every
  /// microbatch on its slice of the samples, [sliceFirst, sliceFirst +
  /// sliceSize) with sliceFirst = floor(replica * microbatch / replicas);
  /// messages go to the replicas of the peer stage whose slices overlap.
  /// Otherwise the slice is the whole microbatch.
  bool replicaSplit = false;
  int64_t sliceFirst = 0, sliceSize = 0;
  /// Pipeline stages this rank runs (interleaved: v chunks, stage c*p + r
  /// on device position r); messages name stages, which live on position
  /// stage mod num_stages, or with `vPlacement` (zb-v, "placement": "v") in
  /// a V: stage q < p on position q, stage q >= p on 2p-1-q.
  int64_t chunks = 1;
  bool vPlacement = false;
  /// The device position of pipeline stage q.
  int64_t positionOf(int64_t q) const {
    if (vPlacement && q >= numStages)
      return 2 * int64_t(numStages) - 1 - q;
    return q % numStages;
  }
  std::vector<WeightSpec> weights;
  std::vector<FeedSpec> feeds;
  bool loss = false;
  std::vector<OpSpec> ops;
  /// "fused_updates": the step function's multi-tensor calls.
  std::vector<FusedUpdate> fusedUpdates;
  /// Bytes of a float element: 4 (float32), or 8 in the float64 reference
  /// mode ("precision": "f64"), where every float tensor of the stage,
  /// message, loss and checkpoint is a double.
  int realBytes = 4;
  bool isF64() const { return realBytes == 8; }
  /// "arena" when the op table's memory figures describe the whole model
  /// without recomputation (one stage, backward not split): a profile
  /// written from it says so (Profile::memoryModel).
  std::string memoryModel;
  /// "cpu" or "cuda": the runtime the stage was compiled for (`pipec
  /// compile --target`); a runtime of another target refuses it.
  std::string target = "cpu";
  /// "bf16" (`pipec compile --precision bf16`): the matrix products
  /// (GEMMs, batched MatMuls, convolutions' GEMMs) multiply operands
  /// rounded to bfloat16 and accumulate in float32 (tensor cores on CUDA,
  /// emulated exactly on the CPU); every tensor, message and checkpoint
  /// stays float32. "f32" otherwise.
  std::string matmulPrecision = "f32";
};

/// Split replicas: the first sample and the sample count of replica `j` of
/// `r` in a microbatch of `b` samples (first = floor(j*b/r)).
inline std::pair<int64_t, int64_t> replicaSlice(int64_t b, int64_t r,
                                                int64_t j) {
  int64_t first = j * b / r;
  return {first, (j + 1) * b / r - first};
}

/// Parses and validates a stage description: format tag, ABI version,
/// batch arithmetic (microbatches * microbatch == global_batch), weights
/// inside the arena, feed shapes and dtypes.
StageDesc parseStageDesc(const std::string &json);

/// Writes `d` as a pipec.stage/2 document with this build's ABI version:
/// what parseStageDesc reads (the fields it derives, such as byte sizes
/// and the replica's slice, are not written). Compact JSON, keys sorted.
std::string writeStageDesc(const StageDesc &d);

/// One stage of the manifest.
struct ManifestStage {
  int stage = 0;
  std::string binary;
  /// One binary per replica, parallel to `ranks` (absent: `binary` for all).
  std::vector<std::string> binaries;
  /// Weights file, resolved against the manifest's folder ("" if none).
  std::string weights;
  std::vector<int> ranks;
  /// The static arena one rank of this stage allocates (the largest of its
  /// replicas; 0 when not recorded).
  int64_t arenaBytes = 0;
};

/// A model input or the labels, at the global batch.
struct ManifestTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype; ///< "f32", "f64" or "i64"
  /// Labels: the number of classes.
  int64_t classes = 0;
};

/// A `pipec.manifest/1` document.
struct Manifest {
  /// Where it was read from ("" when written).
  std::string path;
  std::string buildId;
  /// The model file's name and content hash, the schedule's name and the
  /// float precision (for users and tools; the runtime checks the build id).
  std::string model, modelHash, schedule, precision = "f32";
  /// The target the stages were compiled for ("cpu", "cuda").
  std::string target = "cpu";
  int numRanks = 0;
  int64_t microbatches = 0, microbatch = 0, globalBatch = 0;
  std::vector<ManifestStage> stages;
  /// Number of model inputs listed under "inputs" (-1 when absent).
  int numInputs = -1;
  std::vector<ManifestTensor> inputs;
  bool hasLabels = false;
  ManifestTensor labels;
};

/// Reads and parses the manifest at `path` (weights paths resolved against
/// its folder).
Manifest readManifest(const std::string &path);

/// readManifest without exceptions (for code built without them): false and
/// `error` set when the manifest cannot be read.
bool readManifest(const std::string &path, Manifest &out, std::string &error);

/// Writes `m` as a pipec.manifest/1 document (indented JSON; weights paths
/// as given, relative to the manifest's folder).
std::string writeManifest(const Manifest &m);

/// Checks that this binary, this job and the manifest belong together:
/// build ids, world size, stage count, batch sizes, and that `rank` is
/// listed for the description's stage. Each mismatch throws one line
/// naming both values.
void checkManifest(const StageDesc &desc, const Manifest &manifest, int rank,
                   int worldSize);

/// The manifest entry of stage `stage` (validated to exist).
const ManifestStage &manifestStage(const Manifest &manifest, int stage);

} // namespace formats
} // namespace pipec

#endif // PIPEC_FORMATS_DOCUMENTS_H
