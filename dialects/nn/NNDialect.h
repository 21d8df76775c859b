//===- NNDialect.h - the nn dialect -----------------------------*- C++ -*-===//
//
// Public header of the nn dialect: dialect, attributes, interfaces, ops.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_DIALECTS_NN_NNDIALECT_H
#define PIPEC_DIALECTS_NN_NNDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir {
/// Parser of APFloat (f64) parameters of attributes (e.g. #nn.cost).
template <>
struct FieldParser<llvm::APFloat> {
  static FailureOr<llvm::APFloat> parse(AsmParser &parser) {
    llvm::APFloat value(0.0);
    if (parser.parseFloat(llvm::APFloat::IEEEdouble(), value))
      return failure();
    return value;
  }
};
} // namespace mlir

namespace pipec::nn {
/// NN_Bf16Storage: an op whose tensors are bf16 beside f32 ones only (bf16
/// storage of --activations bf16 never meets the f64 reference mode).
mlir::LogicalResult verifyBf16Storage(mlir::Operation *op);
namespace OpTrait {
template <typename ConcreteType>
class Bf16Storage
    : public mlir::OpTrait::TraitBase<ConcreteType, Bf16Storage> {
public:
  static mlir::LogicalResult verifyTrait(mlir::Operation *op) {
    return verifyBf16Storage(op);
  }
};
} // namespace OpTrait
} // namespace pipec::nn

#include "dialects/nn/NNDialect.h.inc"
#include "dialects/nn/NNInterfaces.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/nn/NNAttrs.h.inc"

#define GET_OP_CLASSES
#include "dialects/nn/NNOps.h.inc"

namespace pipec::nn {

/// Numpy broadcast of two static shapes; failure if incompatible.
mlir::FailureOr<llvm::SmallVector<int64_t>>
broadcastShapes(llvm::ArrayRef<int64_t> a, llvm::ArrayRef<int64_t> b);

/// Bytes of a ranked tensor type (0 for anything else).
int64_t tensorBytes(mlir::Type type);

/// Normalises a possibly negative axis for a given rank; -1 if out of range.
int64_t normalizeAxis(int64_t axis, int64_t rank);

} // namespace pipec::nn

#endif // PIPEC_DIALECTS_NN_NNDIALECT_H
