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
  /// The custom schedule's compute-only CSV (schedule "custom").
  std::string scheduleCsv;
  /// Activation recomputation per stage (none, full, selective): one mode
  /// for every stage, or one per stage; empty = none.
  std::vector<std::string> recompute;
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
  /// With precision "bf16": "f32", or "bf16" to store activations, their
  /// gradients, messages and stash in bfloat16 (storeActivationsInBf16),
  /// or "bf16-casts", the same with every op between casts.
  std::string activations = "f32";
};

/// Reverse sweep of reverse-mode differentiation: for each op of `ops`, last
/// to first, whose results have a gradient in `grads`, emits its
/// vector-Jacobian product (DifferentiableOpInterface) at `b`'s insertion
/// point, reading forward values through `mapForward`, and hands every
/// operand gradient to `take(operand, gradient)` (which accumulates it into
/// `grads` or elsewhere). Fails, with an error on the op, for an op without
/// a gradient.
mlir::LogicalResult
reverseSweep(llvm::ArrayRef<mlir::Operation *> ops, mlir::OpBuilder &b,
             const llvm::DenseMap<mlir::Value, mlir::Value> &grads,
             llvm::function_ref<mlir::Value(mlir::Value)> mapForward,
             llvm::function_ref<void(mlir::Value, mlir::Value)> take);

/// True for the results that pipec does not differentiate through (their
/// ops' VJPs refuse a gradient for them): the statistics outputs of
/// BatchNormalization and LayerNormalization and the log_prob output of
/// SoftmaxCrossEntropyLoss.
bool isUndifferentiatedResult(mlir::Value v);

/// Builds, after `fn`, the function `@name(args..., dY...) -> (dX...)`:
/// `fn`'s forward followed by its reverse sweep, where dY are cotangents of
/// `fn`'s float results (ignored for isUndifferentiatedResult ones) and dX
/// the gradients of its float arguments (zero where none flows). Used to check every op's VJP against finite
/// differences (pipec-conformance --gradients).
mlir::FailureOr<mlir::func::FuncOp> buildGradientFunction(mlir::func::FuncOp fn,
                                                          llvm::StringRef name);

/// Adds annotate-costs, plan, split-stages, autodiff, build-schedule,
/// convert-precision (f64 only), verify-schedule and plan-memory: the three
/// phases below, in order (pipec compile runs and times them one by one).
void buildTrainingPipeline(mlir::OpPassManager &pm,
                           const TrainingPipelineOptions &options);
/// Phase "plan": annotate-costs and plan.
void buildPlanningPipeline(mlir::OpPassManager &pm,
                           const TrainingPipelineOptions &options);
/// Phase "split and differentiate": split-stages and autodiff.
void buildDifferentiationPipeline(mlir::OpPassManager &pm,
                                  const TrainingPipelineOptions &options);
/// Phase "schedule and verify": build-schedule, convert-precision (f64
/// only), verify-schedule and plan-memory.
void buildSchedulingPipeline(mlir::OpPassManager &pm,
                             const TrainingPipelineOptions &options);

/// Adds lower-to-runtime for `stage` and the upstream conversions to the
/// LLVM dialect.
void buildStageLoweringPipeline(mlir::OpPassManager &pm, int stage,
                                const std::string &buildId, int replica = 0,
                                const std::string &target = "cpu");

/// Registers the pass pipelines (`--pipec-train-pipeline`).
void registerPipecPipelines();

} // namespace pipec

#endif // PIPEC_PASSES_PASSES_H
