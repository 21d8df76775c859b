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

/// Writes `c` as an ONNX tensor of element type `elemType` (FLOAT, DOUBLE,
/// FLOAT16 is refused; INT64, INT32, INT16, INT8, UINT8, BOOL). False for
/// other types.
bool toTensorProto(const ConstTensor &c, int32_t elemType,
                   onnx::TensorProto &out);

/// Static facts of a graph value that the graph folder needs.
struct KnownType {
  int32_t elemType = 0;
  std::optional<std::vector<int64_t>> dims; ///< set when fully static
};

/// One round of folding on the ONNX graph itself, before the importer
/// emits anything: every node whose inputs are constants (Constant nodes,
/// initializers for which `isWeight` is false) or, for Shape/Size, whose
/// input has a static shape, is replaced by a Constant node with the same
/// output names. ONNX shape inference can then see computed Reshape
/// targets, Slice bounds and Range limits as constants, which is what its
/// own data propagation misses in exporter graphs. `typeOf` gives the
/// inferred type of a value (nullopt when unknown). Returns the number of
/// nodes replaced; nodes that cannot be evaluated are left alone (the
/// importer reports them if they matter).
/// `dataOf`, when given, returns the tensor of an initializer the graph
/// does not hold (the importer keeps large ones aside; nullptr for others).
int64_t foldGraphConstants(
    onnx::GraphProto &graph,
    const std::function<bool(const std::string &)> &isWeight,
    const std::function<std::optional<KnownType>(const std::string &)> &typeOf,
    const std::function<const onnx::TensorProto *(const std::string &)>
        &dataOf = nullptr);

} // namespace pipec::import

#endif // PIPEC_LIB_IMPORT_CONSTFOLD_H
