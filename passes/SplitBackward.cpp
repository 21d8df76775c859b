//===- SplitBackward.cpp - input/weight halves of a stage backward --------===//
//
// For zero-bubble schedules (zb-h1, Qi et al. 2023): splits @sK_bwd into
//
//   @sK_bwd  (same arguments) -> (input gradients..., carried...)
//            everything the input gradients need; results marked
//            pipe.carry = k are values the weight half still needs
//   @sK_bwdw (forward stash arguments..., carried...) -> ()
//            the remaining ops: weight gradients and their accumulation
//            into the `.grad` globals; arguments keep pipe.fwd_arg /
//            pipe.fwd_result, or pipe.carried = k
//
// Carried values live in the microbatch's stash slot between the two
// (the lowering allocates them there), so the schedule may run other
// microbatches' backwards in between. Constants and global loads the
// weight half uses are cloned into it rather than carried.
//
//===----------------------------------------------------------------------===//
#include "passes/PassUtils.h"
#include "passes/Passes.h"

#include "mlir/Dialect/MLProgram/IR/MLProgram.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"

using namespace mlir;
using namespace pipec;

LogicalResult pipec::splitBackward(ModuleOp module, int64_t stage) {
  auto bwd = module.lookupSymbol<func::FuncOp>(stageFuncName(stage, "bwd"));
  if (!bwd)
    return module.emitError("stage ") << stage << " has no backward function";
  if (module.lookupSymbol(stageFuncName(stage, "bwdw")))
    return bwd.emitError("the backward of stage ")
           << stage << " is already split";
  Block &body = bwd.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());

  // The input-gradient half: everything the returned values depend on.
  llvm::SetVector<Operation *> needed;
  SmallVector<Value> work(ret.getOperands().begin(), ret.getOperands().end());
  while (!work.empty()) {
    Value v = work.pop_back_val();
    Operation *def = v.getDefiningOp();
    if (!def || def->getBlock() != &body || !needed.insert(def))
      continue;
    work.append(def->getOperands().begin(), def->getOperands().end());
  }
  SmallVector<Operation *> weightOps;
  for (Operation &op : body.without_terminator())
    if (!needed.contains(&op))
      weightOps.push_back(&op);

  // What the weight half reads from outside itself.
  auto isStashArg = [&](BlockArgument a) {
    return bwd.getArgAttr(a.getArgNumber(), pipe::attrs::kFwdArg) ||
           bwd.getArgAttr(a.getArgNumber(), pipe::attrs::kFwdResult);
  };
  auto cloneable = [](Operation *def) {
    return def && isa<nn::ConstantOp, ml_program::GlobalLoadOp>(def);
  };
  llvm::SetVector<Operation *> weightSet(weightOps.begin(), weightOps.end());
  llvm::SetVector<BlockArgument> stashArgs;
  llvm::SetVector<Value> carried;
  llvm::SetVector<Operation *> clones;
  for (Operation *op : weightOps)
    for (Value v : op->getOperands()) {
      if (auto a = dyn_cast<BlockArgument>(v)) {
        if (isStashArg(a))
          stashArgs.insert(a);
        else
          carried.insert(v); // an incoming gradient or the loss seed
        continue;
      }
      Operation *def = v.getDefiningOp();
      if (weightSet.contains(def))
        continue;
      if (cloneable(def))
        clones.insert(def);
      else
        carried.insert(v);
    }

  // @sK_bwdw.
  OpBuilder b(module.getContext());
  b.setInsertionPointAfter(bwd);
  SmallVector<Type> argTypes;
  SmallVector<DictionaryAttr> argAttrs;
  for (BlockArgument a : stashArgs) {
    argTypes.push_back(a.getType());
    argAttrs.push_back(bwd.getArgAttrDict(a.getArgNumber()));
  }
  for (auto [k, v] : llvm::enumerate(carried)) {
    argTypes.push_back(v.getType());
    argAttrs.push_back(b.getDictionaryAttr(
        {b.getNamedAttr(pipe::attrs::kCarried, b.getI64IntegerAttr(k))}));
  }
  auto bwdw = func::FuncOp::create(b, bwd.getLoc(), stageFuncName(stage, "bwdw"),
                                   b.getFunctionType(argTypes, {}));
  bwdw->setAttr(pipe::attrs::kStage, bwd->getAttr(pipe::attrs::kStage));
  for (auto [i, attrs] : llvm::enumerate(argAttrs))
    if (attrs)
      bwdw.setArgAttrs(i, attrs);
  Block *entry = bwdw.addEntryBlock();
  OpBuilder wb = OpBuilder::atBlockEnd(entry);
  IRMapping map;
  for (auto [i, a] : llvm::enumerate(stashArgs))
    map.map(Value(a), entry->getArgument(i));
  for (auto [k, v] : llvm::enumerate(carried))
    map.map(v, entry->getArgument(stashArgs.size() + k));
  for (Operation *op : clones)
    wb.clone(*op, map);
  for (Operation *op : weightOps)
    wb.clone(*op, map);
  func::ReturnOp::create(wb, bwd.getLoc());

  // @sK_bwd keeps the input-gradient half and returns the carried values.
  SmallVector<Value> results(ret.getOperands().begin(), ret.getOperands().end());
  unsigned firstCarried = results.size();
  results.append(carried.begin(), carried.end());
  SmallVector<DictionaryAttr> resultAttrs;
  for (unsigned i = 0; i < firstCarried; ++i)
    resultAttrs.push_back(bwd.getResultAttrDict(i) ? bwd.getResultAttrDict(i)
                                                   : b.getDictionaryAttr({}));
  for (size_t k = 0; k < carried.size(); ++k)
    resultAttrs.push_back(b.getDictionaryAttr(
        {b.getNamedAttr(pipe::attrs::kCarry, b.getI64IntegerAttr(k))}));
  ret->setOperands(results);
  for (Operation *op : llvm::reverse(weightOps))
    op->erase();
  bwd.setFunctionType(b.getFunctionType(bwd.getArgumentTypes(),
                                        ValueRange(results).getTypes()));
  bwd.setAllResultAttrs(resultAttrs);
  return success();
}
