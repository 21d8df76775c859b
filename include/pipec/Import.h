//===- Import.h - ONNX -> nn importer ---------------------------*- C++ -*-===//
//
// Reads an ONNX model with libonnx (checker, version converter, shape
// inference) and builds an nn-dialect module: one `func.func @main` over
// static tensor types, weights as mutable `ml_program` globals holding
// `dense_resource` blobs, ONNX node names as locations.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_IMPORT_H
#define PIPEC_IMPORT_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace pipec {

struct ImportOptions {
  /// Leading (batch) dimension given to every model input; 0 keeps the
  /// file's value (which must then be static).
  int64_t batch = 0;
  /// Full static shapes for named inputs (override `batch` for them).
  std::map<std::string, std::vector<int64_t>> inputShapes;
  /// Float initializers imported as constants instead of trained
  /// parameters (buffers such as masks or position tables); each must name
  /// a float initializer of the model.
  std::set<std::string> frozen;
  /// Gives every node that reads a float initializer its own copy of it
  /// (the first reader keeps the name; an Identity's copy takes the
  /// Identity's output name, others "<name>@<node>"). For exports that
  /// merged equal initializers (torch.onnx.export in eval mode), not for
  /// genuinely tied weights.
  bool untieWeights = false;
  /// Fuse what the importer recognises: the erf GELU chain into nn.gelu, a
  /// power-of-two scale into the MatMul before it (numerically neutral;
  /// false imports every node as its own op).
  bool fuse = true;
};

/// Oldest default-domain opset imported as is; older models are upgraded
/// with ONNX's version converter first.
constexpr int kMinOpset = 13;

/// Imports `path`. On failure returns null and sets `error` to a message
/// for the user (possibly several lines, e.g. every unsupported op).
mlir::OwningOpRef<mlir::ModuleOp> importOnnxFile(mlir::MLIRContext &context,
                                                 const std::string &path,
                                                 const ImportOptions &options,
                                                 std::string &error);

/// Imports a model held in memory (`name` labels messages; external data
/// is refused since there is no folder).
mlir::OwningOpRef<mlir::ModuleOp> importOnnxBytes(mlir::MLIRContext &context,
                                                  const std::string &bytes,
                                                  const std::string &name,
                                                  const ImportOptions &options,
                                                  std::string &error);

/// Batch size (leading dimension of input 0) written in the file, 0 when
/// it is symbolic; -1 and `error` set when the file cannot be read.
int64_t onnxFileBatch(const std::string &path, std::string &error);

/// An operator the importer converts (its registry, lib/Import/Convert.h).
struct SupportedOperator {
  std::string domain; // "" for the default ONNX domain
  std::string op;
  /// The first opset version of `domain` whose form is handled.
  int since = 0;
  /// The op family: the file lib/Import/ops/<family>.cpp registers it.
  std::string family;
  /// Supported only where it folds to a constant at import.
  bool foldOnly = false;
  std::string note;
};

/// Every registered operator, by domain and name.
std::vector<SupportedOperator> supportedOperators();

/// Registers the dialects the importer produces.
void registerImportDialects(mlir::DialectRegistry &registry);

} // namespace pipec

#endif // PIPEC_IMPORT_H
