//===- NNOps.cpp - nn op definitions and folders --------------------------===//
//
// ODS-generated op definitions and folders. Verifiers live in
// NNVerifiers.cpp, VJPs in NNAutodiff.cpp, costs in NNCost.cpp.
//
//===----------------------------------------------------------------------===//
#include "dialects/nn/NNDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"

using namespace mlir;
using namespace pipec::nn;

#define GET_OP_CLASSES
#include "dialects/nn/NNOps.cpp.inc"

OpFoldResult ConstantOp::fold(FoldAdaptor) { return getValue(); }

//===----------------------------------------------------------------------===//
// Folders of the ops that can disappear. pipec's own pipeline does not run
// the canonicalizer (the importer folds ONNX constants itself), so these
// serve --canonicalize in pipec-opt and passes that fold as they build; each
// keeps the value bit for bit (views, a factor of 1, a same-type cast).
//===----------------------------------------------------------------------===//

namespace {
/// The input, where the op leaves it as it is (same type).
OpFoldResult sameTypeInput(Value input, Value output) {
  return input.getType() == output.getType() ? OpFoldResult(input)
                                             : OpFoldResult();
}
} // namespace

OpFoldResult IdentityOp::fold(FoldAdaptor) { return getInput(); }

OpFoldResult FlattenOp::fold(FoldAdaptor) {
  return sameTypeInput(getInput(), getOutput());
}

OpFoldResult ExpandOp::fold(FoldAdaptor) {
  return sameTypeInput(getInput(), getOutput());
}

OpFoldResult CastOp::fold(FoldAdaptor) {
  return sameTypeInput(getInput(), getOutput());
}

/// reshape(x) -> x at the same type; reshape(reshape(x)) -> reshape(x); the
/// reshape of a dense constant is that constant in the new shape.
OpFoldResult ReshapeOp::fold(FoldAdaptor adaptor) {
  if (OpFoldResult same = sameTypeInput(getInput(), getOutput()))
    return same;
  auto type = cast<ShapedType>(getOutput().getType());
  if (auto dense = dyn_cast_or_null<DenseElementsAttr>(adaptor.getInput()))
    return dense.reshape(type);
  if (auto inner = getInput().getDefiningOp<ReshapeOp>()) {
    getInputMutable().assign(inner.getInput());
    return getOutput();
  }
  return {};
}

/// An identity permutation is its input; transpose(transpose(x), q) is one
/// transpose of x by p[q[i]].
OpFoldResult TransposeOp::fold(FoldAdaptor) {
  ArrayRef<int64_t> perm = getPerm();
  auto isIdentity = [](ArrayRef<int64_t> p) {
    for (size_t i = 0; i < p.size(); ++i)
      if (p[i] != int64_t(i))
        return false;
    return true;
  };
  if (isIdentity(perm))
    return getInput();
  auto inner = getInput().getDefiningOp<TransposeOp>();
  if (!inner)
    return {};
  ArrayRef<int64_t> innerPerm = inner.getPerm();
  SmallVector<int64_t> composed;
  for (int64_t p : perm)
    composed.push_back(innerPerm[p]);
  if (isIdentity(composed) && inner.getInput().getType() == getType())
    return inner.getInput();
  setPerm(composed);
  getInputMutable().assign(inner.getInput());
  return getOutput();
}

OpFoldResult SumToShapeOp::fold(FoldAdaptor) {
  if (getScale().convertToDouble() != 1.0)
    return {};
  return sameTypeInput(getInput(), getOutput());
}

/// scale by 1 is its input. scale(scale(x, a), b) is left alone: x * (a*b)
/// rounds differently from (x * a) * b.
OpFoldResult ScaleOp::fold(FoldAdaptor) {
  if (getFactor().convertToDouble() == 1.0)
    return getInput();
  return {};
}
