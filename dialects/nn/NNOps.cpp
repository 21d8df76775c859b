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
