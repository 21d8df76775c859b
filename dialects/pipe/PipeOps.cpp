//===- PipeOps.cpp - pipe op definitions and local verifiers --------------===//
//
// Per-op checks: referenced stage functions exist and the communicated
// types equal the referenced argument/result types. Cross-program checks
// are in PipelineVerifier.cpp.
//
//===----------------------------------------------------------------------===//
#include "dialects/pipe/PipeDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace pipec::pipe;

#define GET_OP_CLASSES
#include "dialects/pipe/PipeOps.cpp.inc"

static FailureOr<func::FuncOp> lookupFunc(Operation *op,
                                          SymbolTableCollection &tables,
                                          FlatSymbolRefAttr name) {
  auto fn = tables.lookupNearestSymbolFrom<func::FuncOp>(op, name);
  if (!fn)
    return op->emitOpError("references unknown stage function ") << name;
  return fn;
}

template <typename OpT>
static LogicalResult verifyComm(OpT op, SymbolTableCollection &tables,
                                bool isResult) {
  auto fn = lookupFunc(op, tables, op.getFuncAttr());
  if (failed(fn))
    return failure();
  auto types = isResult ? fn->getFunctionType().getResults()
                        : fn->getFunctionType().getInputs();
  int64_t index = op.getIndex();
  if (index < 0 || index >= static_cast<int64_t>(types.size()))
    return op.emitOpError("index ")
           << index << " is out of range: " << op.getFunc() << " has "
           << types.size() << (isResult ? " results" : " arguments");
  if (types[index] != op.getType())
    return op.emitOpError("type ")
           << op.getType() << " differs from " << op.getFunc()
           << (isResult ? " result " : " argument ") << index << " of type "
           << types[index];
  return success();
}

LogicalResult SendOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifyComm(*this, tables, /*isResult=*/true);
}
LogicalResult RecvOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifyComm(*this, tables, /*isResult=*/false);
}
LogicalResult ForwardOp::verifySymbolUses(SymbolTableCollection &tables) {
  return lookupFunc(*this, tables, getFuncAttr());
}
LogicalResult BackwardOp::verifySymbolUses(SymbolTableCollection &tables) {
  return lookupFunc(*this, tables, getFuncAttr());
}
LogicalResult BackwardWeightOp::verifySymbolUses(SymbolTableCollection &tables) {
  return lookupFunc(*this, tables, getFuncAttr());
}
LogicalResult StepOp::verifySymbolUses(SymbolTableCollection &tables) {
  return lookupFunc(*this, tables, getFuncAttr());
}

LogicalResult TieReduceOp::verify() {
  ArrayRef<int64_t> stages = getStages();
  if (stages.size() < 2)
    return emitOpError("needs at least two stages sharing the weights");
  for (size_t i = 1; i < stages.size(); ++i)
    if (stages[i] <= stages[i - 1] || stages[i - 1] < 0)
      return emitOpError("stages must be distinct, non-negative and ascending");
  if (getWeights().empty())
    return emitOpError("names no weight");
  if (auto program = (*this)->getParentOfType<ProgramOp>())
    if (!llvm::is_contained(stages, program.getStage()))
      return emitOpError("in a program of stage ")
             << program.getStage() << ", which is not among its stages";
  return success();
}

LogicalResult ProgramOp::verify() {
  if (getStage() < 0)
    return emitOpError("stage must be non-negative");
  if (getSlots() < 1)
    return emitOpError("needs at least one stash slot");
  return success();
}
