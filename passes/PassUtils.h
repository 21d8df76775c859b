//===- PassUtils.h - helpers shared by pipec passes -------------*- C++ -*-===//
#ifndef PIPEC_PASSES_PASSUTILS_H
#define PIPEC_PASSES_PASSUTILS_H

#include "dialects/nn/NNDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

#include <string>

namespace pipec {

/// The ONNX node name recorded in an op's location, or "" if none.
std::string locationName(mlir::Location loc);

/// Name of a layer for profiles and diagnostics: its ONNX node name, else
/// "<op>_<index>".
std::string layerName(mlir::Operation *op, int index);

/// A "layer" of the planner: an nn op that does work (not a constant).
bool isLayer(mlir::Operation *op);

/// The model function of an imported module (`@main`), or null with an
/// error emitted on the module.
mlir::func::FuncOp getModelFunc(mlir::ModuleOp module);

/// Stage functions `@sK_<kind>` of the module indexed by stage, or an empty
/// vector if there are none.
llvm::SmallVector<mlir::func::FuncOp> getStageFuncs(mlir::ModuleOp module,
                                                    llvm::StringRef kind);

/// Name of stage function `kind` ("fwd", "bwd", "step") of `stage`.
std::string stageFuncName(int64_t stage, llvm::StringRef kind);

/// Number of classes of a labels feed argument: the class dimension of the
/// loss that consumes it (through reshapes); 0 if none.
int64_t labelClasses(mlir::Value labels);

} // namespace pipec

#endif // PIPEC_PASSES_PASSUTILS_H
