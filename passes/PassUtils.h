//===- PassUtils.h - helpers shared by pipec passes -------------*- C++ -*-===//
#ifndef PIPEC_PASSES_PASSUTILS_H
#define PIPEC_PASSES_PASSUTILS_H

#include "dialects/nn/NNDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "pipec/Arena.h"

#include <string>

namespace pipec {

/// The ONNX node name recorded in an op's location, or "" if none.
std::string locationName(mlir::Location loc);

/// Name of a layer for profiles and diagnostics: its ONNX node name, else
/// "<op>_<index>".
std::string layerName(mlir::Operation *op, int index);

/// layerName of each of `ops` (a function's layers in program order), made
/// unique: an ONNX node that became several ops (a decomposed activation, a
/// loss and its label reshape) names its first op and "<name>#2", "#3", ...
/// the others. Profiles key ops by these names.
llvm::SmallVector<std::string> uniqueLayerNames(llvm::ArrayRef<mlir::Operation *> ops);

/// A "layer" of the planner: an nn op that does work (not a constant, not
/// a storage cast).
bool isLayer(mlir::Operation *op);

/// An nn.cast to or from bf16: the rounding and widening of
/// `--activations bf16` (storeActivationsInBf16). Not a layer: its kernel
/// is charged to the layer whose location it carries (the op whose result
/// it rounds, or the op it widens an operand for).
bool isStorageCast(mlir::Operation *op);

/// The model function of an imported module (`@main`), or null with an
/// error emitted: none, a declaration, or more than one block.
mlir::func::FuncOp getModelFunc(mlir::ModuleOp module);

/// Fails, with an error on the first, where a stage function is only a
/// declaration (hand-written IR; the passes write bodies).
mlir::LogicalResult requireBodies(llvm::ArrayRef<mlir::func::FuncOp> funcs);

/// Stage functions `@sK_<kind>` of the module indexed by stage, or an empty
/// vector if there are none.
llvm::SmallVector<mlir::func::FuncOp> getStageFuncs(mlir::ModuleOp module,
                                                    llvm::StringRef kind);

/// Whether the backward of `stage` (@sK_bwd, and @sK_bwdw with zero
/// bubble) reads anything kept in the microbatch's stash slot: stashed
/// forward arguments or results, or values carried to the weight half. A
/// stage that reads none (no trained weight in or before it, so no
/// gradient flows there) needs a single slot whatever the schedule.
bool stageReadsStash(mlir::ModuleOp module, int64_t stage);

/// Name of stage function `kind` ("fwd", "bwd", "step") of `stage`.
std::string stageFuncName(int64_t stage, llvm::StringRef kind);

/// Number of classes of a labels feed argument: the class dimension of the
/// loss that consumes it (through reshapes); 0 if none.
int64_t labelClasses(mlir::Value labels);

/// The double a float32 literal of the model stands for, used by the
/// float64 reference mode: the simplest number that rounds to it. That is
/// the shortest decimal when it has at most 6 significant digits (what an
/// exporter wrote: momentum 0.9, epsilon 1e-5, ELU's 0.7); else a fraction
/// p/q with q <= 64 and |p| <= 1024 if one rounds to it (HardSigmoid's
/// 1/6, a value computed in double before the export stored it as float);
/// the exact constant for float32 roundings of SELU's alpha and gamma
/// (ONNX's defaults), sqrt(2/pi) (tanh GELU), sqrt(2), 1/sqrt(2), pi, e
/// and ln 2; otherwise the shortest decimal.
double literalValue(float f);

} // namespace pipec

namespace pipec {
// ArenaPlan: the static arena of one rank as --pipe-lower-to-runtime lays
// it out (include/pipec/Arena.h).
/// Splits @sK_bwd into its input-gradient half (@sK_bwd, returning the
/// values the other half needs, marked pipe.carry) and its weight-gradient
/// half (@sK_bwdw) for the zero-bubble schedules.
mlir::LogicalResult splitBackward(mlir::ModuleOp module, int64_t stage);

/// `--precision bf16 --activations bf16`: every float tensor a forward or
/// backward stage function produces is stored in bfloat16 (an nn.cast after
/// its op, and one back to f32 before each reader), except weights,
/// constants, scalars, statistics and the weight gradients' sums; the
/// functions' boundaries and the pipeline's messages follow their values
/// (StoreActivationsBf16.cpp). With `kernelsStore`, the ops whose kernels
/// have bf16 variants read and write bf16 themselves, without the casts;
/// else every op is between casts (the reference form, the same numbers).
mlir::LogicalResult storeActivationsInBf16(mlir::ModuleOp module,
                                           bool kernelsStore);

/// Plans the arena of the rank running (stage, replica) of the module's
/// pipe.pipeline, on a copy of the module.
mlir::FailureOr<ArenaPlan> planStageArena(mlir::ModuleOp module, int64_t stage,
                                          int64_t replica);

/// Fails, with one error naming the kernels and ops, when `target` ("cpu",
/// "cuda") cannot run some kernel call of the rank at device position
/// `stage` (on a copy of the module).
mlir::LogicalResult checkStageTarget(mlir::ModuleOp module, int64_t stage,
                                     const std::string &target);
} // namespace pipec

#endif // PIPEC_PASSES_PASSUTILS_H
