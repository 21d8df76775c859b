//===- ConstFold.h - fold exporter shape subgraphs at import ----*- C++ -*-===//
//
// Exporters emit shape computations (Shape -> Gather -> Unsqueeze -> Concat
// -> Reshape, ConstantOfShape, Range, masks from Equal/Where, ...). Once the
// importer has specialised every shape they are constants: this evaluator
// computes them on the host so no op is emitted. Internal to lib/Import.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_LIB_IMPORT_CONSTFOLD_H
#define PIPEC_LIB_IMPORT_CONSTFOLD_H

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace pipec::import {

/// A host tensor of int64 (also bool) or float values.
struct ConstTensor {
  std::vector<int64_t> dims;
  bool isFloat = false;
  std::vector<int64_t> ints;
  std::vector<double> reals;

  int64_t numel() const;
  double real(int64_t i) const { return isFloat ? reals[i] : double(ints[i]); }
  int64_t integer(int64_t i) const {
    return isFloat ? static_cast<int64_t>(reals[i]) : ints[i];
  }
};

/// Reads an initializer or Constant value; nullopt (and `why`) when its
/// type is neither float nor an integer type.
std::optional<ConstTensor> fromTensorProto(const onnx::TensorProto &t,
                                           std::string &why);

/// True for ops this evaluator can compute.
bool isFoldable(const std::string &opType);

/// Evaluates `node`. `input(i)` returns input i as a constant or nullopt;
/// `staticShape(name)` the static shape of any value (for Shape/Size).
/// Returns the outputs, or nullopt with `why` (the inputs are not all
/// constant, or an attribute/type is not supported).
std::optional<std::vector<ConstTensor>>
foldNode(const onnx::NodeProto &node,
         const std::function<std::optional<ConstTensor>(int)> &input,
         const std::function<std::optional<std::vector<int64_t>>(
             const std::string &)> &staticShape,
         std::string &why);

} // namespace pipec::import

#endif // PIPEC_LIB_IMPORT_CONSTFOLD_H
