//===- Export.h - Plans written for other runtimes ---------------*- C++
//-*-===//
//
// `pipec plan --export megatron|torch`: a plan's stage split as Megatron-
// Core's --pipeline-model-parallel-layout (with the flags that go with it),
// and its schedule as a torch.distributed.pipelining compute-only CSV.
// Plain C++ (lib/Plan/Export.cpp).
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_EXPORT_H
#define PIPEC_EXPORT_H

#include "pipec/Plan.h"
#include "pipec/Profile.h"

#include <string>
#include <vector>

namespace pipec {

struct ExportResult {
  bool ok = false;
  std::string error;
  /// The file's contents.
  std::string text;
  /// What the user should know about the translation (one line each), e.g.
  /// a stage boundary inside a transformer layer moved to the layer's edge.
  std::vector<std::string> notes;
};

/// The transformer layer of every profile op: -1 for ops before the first
/// layer (embedding), -2 for ops after the last (final norm, head, loss),
/// else the layer's index (0-based). Layers are recognised by op kind
/// "transformer" (layer-level profiles such as examples/profiles/gpt3*.json:
/// one op per layer) or by a layer index in the op's name as exporters
/// write them (`/h.3/attn/MatMul`, `layers.3`, `layer.3`, `blocks.3`,
/// `block_3`); an op between two layers without an index belongs to the
/// layer before it. Empty when the profile has no transformer layer.
std::vector<int> transformerLayerOfOps(const Profile &profile);

/// Megatron-Core's --pipeline-model-parallel-layout for `plan`: one stage per
/// plan stage in pipec's virtual-stage order (stage c*p + r, which is
/// Megatron's order: every pipeline rank's first chunk, then every rank's
/// second), `E` on the stage holding the embedding ops, `t` per transformer
/// layer, `L` on the stage holding the ops after the last layer; runs of
/// equal stages written as `(tt|)*N`. A layer cut by a stage boundary goes
/// whole to the stage with most of its forward time (a note says so).
/// `text` is a shell fragment with the layout and the matching flags
/// (--pipeline-model-parallel-size, --num-layers, --micro-batch-size,
/// --global-batch-size). Refused: a profile without transformer layers, or
/// stages with different replica counts (Megatron's data parallelism
/// replicates the whole pipeline).
ExportResult exportMegatronLayout(const Profile &profile, const Plan &plan);

/// torch.distributed.pipelining's compute-only CSV of the plan's schedule
/// (one row per pipeline rank, actions such as 0F0, 1B0, 0I1, 0W1), which
/// `pipec compile --schedule-csv` reads back. Refused: the continuous
/// schedules (1f1b, 2bw) and replicated stages (scheduleToCsv).
ExportResult exportTorchSchedule(const Plan &plan);

} // namespace pipec

#endif // PIPEC_EXPORT_H
