//===- Passes.h - pipec passes ----------------------------------*- C++ -*-===//
#ifndef PIPEC_PASSES_PASSES_H
#define PIPEC_PASSES_PASSES_H

#include "dialects/nn/NNDialect.h"
#include "dialects/pipe/PipeDialect.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MLProgram/IR/MLProgram.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace pipec {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

/// Options of the whole training pipeline (import is separate).
struct TrainingPipelineOptions {
  std::string profile;
  std::string device = "cpu";
  int stages = 1;
  std::string loss = "cross-entropy";
  std::string schedule = "1f1b-flush";
  int microbatches = 1;
  std::string optimizer = "sgd";
  double momentum = 0.9, beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
  double weightDecay = 0;
  /// Replicas per stage (empty: one each).
  std::vector<int> replicas;
  /// Interleaved: chunks per device (stages counts all p*v stages).
  int chunks = 1;
  /// 1f1b-flush warm-up policy "A" or "B" (DAPPLE).
  std::string warmup = "A";
  /// Split replicas (DAPPLE): samples per microbatch; 0 = 1F1B-RR.
  int splitSamples = 0;
  /// A fixed cut (last layer per stage) instead of the balanced planner.
  std::vector<int> cuts;
  /// "f32", or "f64": every float tensor becomes f64 once the schedule is
  /// built (--nn-convert-precision), the exact reference mode.
  std::string precision = "f32";
};

/// Adds annotate-costs, plan, split-stages, autodiff, build-schedule,
/// convert-precision (f64 only), verify-schedule and plan-memory.
void buildTrainingPipeline(mlir::OpPassManager &pm,
                           const TrainingPipelineOptions &options);

/// Adds lower-to-runtime for `stage` and the upstream conversions to the
/// LLVM dialect.
void buildStageLoweringPipeline(mlir::OpPassManager &pm, int stage,
                                const std::string &buildId, int replica = 0);

/// Registers the pass pipelines (`--pipec-train-pipeline`).
void registerPipecPipelines();

} // namespace pipec

#endif // PIPEC_PASSES_PASSES_H
