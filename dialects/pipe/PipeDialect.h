//===- PipeDialect.h - the pipe dialect -------------------------*- C++ -*-===//
//
// Public header of the pipe dialect: plan attribute, pipeline/program ops,
// communication and stage-run ops.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_DIALECTS_PIPE_PIPEDIALECT_H
#define PIPEC_DIALECTS_PIPE_PIPEDIALECT_H

#include "dialects/nn/NNDialect.h" // FieldParser<double>
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialects/pipe/PipeDialect.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/pipe/PipeAttrs.h.inc"

#define GET_OP_CLASSES
#include "dialects/pipe/PipeOps.h.inc"

#include <string>

namespace pipec::pipe {

/// Attribute names used on stage functions and their arguments/results.
namespace attrs {
inline constexpr llvm::StringLiteral kStage = "pipe.stage";
inline constexpr llvm::StringLiteral kPlan = "pipe.plan";
inline constexpr llvm::StringLiteral kFeed = "pipe.feed";
inline constexpr llvm::StringLiteral kLoss = "pipe.loss";
inline constexpr llvm::StringLiteral kLossSeed = "pipe.loss_seed";
/// On the module: how many layers (ops) autodiff appended to the last stage
/// for the loss (a plan's last stage covers them, as profiles count them;
/// later passes may fold ops away, so they are not counted again).
inline constexpr llvm::StringLiteral kLossLayers = "pipe.loss_layers";
inline constexpr llvm::StringLiteral kFwdArg = "pipe.fwd_arg";
inline constexpr llvm::StringLiteral kFwdResult = "pipe.fwd_result";
inline constexpr llvm::StringLiteral kGradOf = "pipe.grad_of";
inline constexpr llvm::StringLiteral kGradGlobal = "pipe.grad_global";
inline constexpr llvm::StringLiteral kChannel = "pipe.channel";
inline constexpr llvm::StringLiteral kPeers = "pipe.peers";
inline constexpr llvm::StringLiteral kBoundary = "pipe.boundary";
/// Zero-bubble split: result k of sK_bwd carried to argument k of sK_bwdw.
inline constexpr llvm::StringLiteral kCarry = "pipe.carry";
inline constexpr llvm::StringLiteral kCarried = "pipe.carried";
/// On the module: weight name -> the stages that read it, for parameters
/// shared by several stages (tied weights; --pipe-split-stages).
inline constexpr llvm::StringLiteral kTied = "pipe.tied";
} // namespace attrs

/// Expands the programs of a pipeline into per-rank communication events
/// (loops unrolled, microbatch indices evaluated). Emits an error on `op`
/// and fails when an index cannot be evaluated statically.
struct ExpandedEvent {
  enum Kind { Send, Recv, Forward, Backward, BackwardWeight, Step, AllReduce } kind;
  int64_t stage = 0;   ///< peer stage for Send/Recv
  int64_t channel = 0;
  int64_t microbatch = 0;
  mlir::Operation *op = nullptr;
  /// False for a pipe.step without `after` (a synchronous schedule's update).
  bool hasMicrobatch = true;
};
mlir::LogicalResult
expandProgram(ProgramOp program,
              llvm::SmallVectorImpl<ExpandedEvent> &events);

/// How many microbatches before its first a continuous window (1f1b, 2bw)
/// reaches back: the largest -k over the microbatch operands of all
/// programs (p - 1 for a straight pipeline, (K_0 - 1) r_0 or more with
/// replicas). The runtime drains ceil(reach / m) windows after the last
/// step.
int64_t windowReach(PipelineOp pipeline);

/// The events of `program` over a whole run with global microbatch indices:
/// the program once for a synchronous schedule; for a continuous one
/// (1f1b, 2bw) ceil(reach / m) + 3 steps and the draining windows, with ops
/// outside the run dropped. `m` microbatches per step, `reach` as
/// windowReach gives it.
mlir::LogicalResult expandRun(ProgramOp program, int64_t m, int64_t reach,
                              bool continuous,
                              llvm::SmallVectorImpl<ExpandedEvent> &events);
/// Microbatches of the run expandRun simulates.
int64_t expandedMicrobatches(int64_t m, int64_t reach, bool continuous);

/// Split replicas (pipe.pipeline split_samples b): the samples
/// [first, first + size) of a microbatch of `b` that replica `j` of `r`
/// runs, first = floor(j*b/r). The runtime computes the same slices.
inline std::pair<int64_t, int64_t> replicaSlice(int64_t b, int64_t r,
                                                int64_t j) {
  int64_t first = j * b / r;
  return {first, (j + 1) * b / r - first};
}

/// The forward function a backward (half) belongs to, by the naming of
/// --nn-autodiff and --pipe-build-schedule: sK_bwd and sK_bwdw belong to
/// sK_fwd. Other names map to themselves.
inline std::string forwardFuncOf(llvm::StringRef func) {
  for (llvm::StringRef suffix : {"_bwdw", "_bwd"})
    if (func.ends_with(suffix))
      return (func.drop_back(suffix.size()) + "_fwd").str();
  return func.str();
}

} // namespace pipec::pipe

#endif // PIPEC_DIALECTS_PIPE_PIPEDIALECT_H
