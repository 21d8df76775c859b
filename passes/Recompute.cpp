//===- Recompute.cpp - --pipe-recompute -----------------------------------===//
//
// Activation recomputation per stage (Chen et al. 2016's checkpointing at
// stage granularity, as GPipe and PipeDream-2BW's planner assume it; Megatron's
// "selective" variant keeps the GEMM outputs). After --nn-autodiff a stage's
// forward returns the values its backward needs (`pipe.saved` results, one
// stash slot per in-flight microbatch); this pass moves their computation
// into the backward:
//
//   full       @sK_bwd begins with a copy of @sK_fwd's body on the stashed
//              forward arguments (pipe.fwd_arg), and every saved value is
//              taken from that copy; @sK_fwd keeps only its outputs.
//   selective  the same copy, but gemm / matmul / conv results are not
//              recomputed: each one the backward still needs stays a saved
//              result, so only the cheap, memory-heavy ops (elementwise,
//              softmax, normalisation, dropout, reshapes) run again.
//
// What the copy leaves out: writes to globals (batch-norm running
// statistics are updated once, by the forward). Dropout masks are drawn
// again from the stashed random state (pipe.feed = -2 argument), so they
// are the same. Weights are read in the backward's phase, which under
// weight stashing and in every synchronous schedule is the forward's
// version: recomputation changes no number.
//
//===----------------------------------------------------------------------===//
#include "passes/PassUtils.h"
#include "passes/Passes.h"

#include "dialects/pipe/PipeDialect.h"
#include "mlir/Dialect/MLProgram/IR/MLProgram.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Transforms/RegionUtils.h"

namespace pipec {
#define GEN_PASS_DEF_PIPERECOMPUTEPASS
#include "passes/Passes.h.inc"
} // namespace pipec

using namespace mlir;
using namespace pipec;

namespace {

/// The ops whose outputs selective recomputation keeps.
bool isExpensive(Operation *op) {
  return isa<nn::GemmOp, nn::MatMulOp, nn::ConvOp>(op);
}

/// Erases the ops of `block` nobody reads (side-effect free), until none.
void eraseDeadOps(Block &block) {
  bool changed = true;
  while (changed) {
    changed = false;
    for (Operation &op : llvm::make_early_inc_range(llvm::reverse(block)))
      if (isOpTriviallyDead(&op)) {
        op.erase();
        changed = true;
      }
  }
}

class StageRecompute {
public:
  StageRecompute(func::FuncOp fwd, func::FuncOp bwd, bool selective)
      : fwd(fwd), bwd(bwd), selective(selective), b(fwd.getContext()) {}

  LogicalResult run() {
    auto ret = cast<func::ReturnOp>(fwd.getBody().front().getTerminator());
    numOut = 0;
    SmallVector<Attribute> savedTypes;
    for (unsigned i = 0; i < ret.getNumOperands(); ++i) {
      bool saved = fwd.getResultAttr(i, "pipe.saved") != nullptr;
      if (!saved && i != numOut)
        return fwd.emitError("result ")
               << i << " of " << fwd.getSymName()
               << " is an output after a saved result; expected the saved "
                  "results last (as --nn-autodiff writes them)";
      if (!saved)
        ++numOut;
      else
        savedTypes.push_back(TypeAttr::get(ret.getOperand(i).getType()));
    }
    // The types, not their bytes: nn-convert-precision converts them with
    // the stash (f64, bf16 activations), so --report's remark compares
    // like with like.
    Builder attrs(fwd.getContext());
    fwd->setAttr("pipe.recompute_saved", attrs.getArrayAttr(savedTypes));
    if (numOut == ret.getNumOperands())
      return success(); // nothing stashed beyond the inputs
    copyForwardIntoBackward(ret);
    takeSavedFromCopy(ret);
    eraseDeadOps(bwd.getBody().front());
    pruneUnusedArguments();
    rebuildSavedResults(ret);
    eraseDeadOps(fwd.getBody().front());
    fwd->setAttr("pipe.recompute",
                 attrs.getStringAttr(selective ? "selective" : "full"));
    return success();
  }

private:
  func::FuncOp fwd, bwd;
  bool selective;
  OpBuilder b;
  unsigned numOut = 0;
  IRMapping map;
  /// Backward arguments this pass added, and for stashed kept values the
  /// forward value each stands for.
  llvm::DenseMap<Value, Value> keptValueOf;
  llvm::SmallPtrSet<Value, 8> addedArgs;

  BlockArgument addArgument(Type type, StringRef attr, int64_t index,
                            Location loc) {
    unsigned at = bwd.getNumArguments();
    DictionaryAttr dict =
        b.getDictionaryAttr({b.getNamedAttr(attr, b.getI64IntegerAttr(index))});
    if (failed(bwd.insertArgument(at, type, dict, loc)))
      llvm_unreachable("appending a function argument cannot fail");
    BlockArgument arg = bwd.getArgument(at);
    addedArgs.insert(arg);
    return arg;
  }

  /// The forward's body at the start of the backward, on the stashed
  /// forward arguments; expensive ops' results (selective) as new stashed
  /// values instead.
  void copyForwardIntoBackward(func::ReturnOp ret) {
    Block &entry = bwd.getBody().front();
    for (BlockArgument arg : fwd.getArguments()) {
      Value stashed;
      for (unsigned i = 0; i < bwd.getNumArguments() && !stashed; ++i)
        if (auto a = bwd.getArgAttrOfType<IntegerAttr>(i, pipe::attrs::kFwdArg);
            a && a.getInt() == int64_t(arg.getArgNumber()))
          stashed = bwd.getArgument(i);
      if (!stashed)
        stashed = addArgument(arg.getType(), pipe::attrs::kFwdArg,
                              arg.getArgNumber(), arg.getLoc());
      map.map(arg, stashed);
    }
    // The forward's outputs are in the stash slot already (sent on): the
    // copy reads them from there rather than computing them again (and
    // what only they need).
    llvm::DenseMap<Value, BlockArgument> outputArg;
    for (unsigned i = 0; i < numOut; ++i) {
      Value out = ret.getOperand(i);
      if (!out.getDefiningOp() || outputArg.count(out))
        continue;
      BlockArgument slot = BlockArgument();
      for (unsigned a = 0; a < bwd.getNumArguments() && !slot; ++a)
        if (auto r =
                bwd.getArgAttrOfType<IntegerAttr>(a, pipe::attrs::kFwdResult);
            r && r.getInt() == int64_t(i))
          slot = bwd.getArgument(a);
      outputArg[out] = slot
                           ? slot
                           : addArgument(out.getType(), pipe::attrs::kFwdResult,
                                         i, out.getLoc());
    }
    b.setInsertionPointToStart(&entry);
    for (Operation &op : fwd.getBody().front()) {
      if (&op == ret.getOperation() || isa<ml_program::GlobalStoreOp>(op))
        continue;
      if (selective && isExpensive(&op)) {
        for (Value r : op.getResults()) {
          if (auto slot = outputArg.find(r); slot != outputArg.end()) {
            map.map(r, slot->second); // an output: in the slot already
            continue;
          }
          // The index is set when the saved results are rebuilt.
          BlockArgument kept =
              addArgument(r.getType(), pipe::attrs::kFwdResult, -1, r.getLoc());
          keptValueOf[kept] = r;
          map.map(r, kept);
        }
        continue;
      }
      Operation *copy = b.clone(op, map);
      copy->removeAttr("nn.cost"); // the forward's cost, counted there
      for (Value r : op.getResults())
        if (auto slot = outputArg.find(r); slot != outputArg.end())
          map.map(r, slot->second);
    }
  }

  /// Every stashed saved value read from the copy instead.
  void takeSavedFromCopy(func::ReturnOp ret) {
    for (unsigned i = 0; i < bwd.getNumArguments(); ++i) {
      BlockArgument arg = bwd.getArgument(i);
      if (keptValueOf.count(arg))
        continue;
      auto r = bwd.getArgAttrOfType<IntegerAttr>(i, pipe::attrs::kFwdResult);
      if (!r || r.getInt() < int64_t(numOut))
        continue;
      arg.replaceAllUsesWith(map.lookup(ret.getOperand(r.getInt())));
    }
  }

  /// Stashed values no one reads any more (the old saved results, added
  /// arguments the copy did not need).
  void pruneUnusedArguments() {
    llvm::BitVector erase(bwd.getNumArguments());
    for (unsigned i = 0; i < bwd.getNumArguments(); ++i) {
      BlockArgument arg = bwd.getArgument(i);
      bool stash =
          bwd.getArgAttr(i, pipe::attrs::kFwdResult) || addedArgs.contains(arg);
      if (stash && arg.use_empty())
        erase.set(i);
    }
    for (unsigned i = 0; i < bwd.getNumArguments(); ++i)
      if (erase.test(i))
        keptValueOf.erase(bwd.getArgument(i));
    (void)bwd.eraseArguments(erase);
  }

  /// The forward returns its outputs and the kept values, numbered as the
  /// backward's arguments now say.
  void rebuildSavedResults(func::ReturnOp ret) {
    SmallVector<Value> results(ret.getOperands().take_front(numOut));
    SmallVector<DictionaryAttr> resultAttrs;
    for (unsigned i = 0; i < numOut; ++i)
      resultAttrs.push_back(fwd.getResultAttrDict(i) ? fwd.getResultAttrDict(i)
                                                     : b.getDictionaryAttr({}));
    llvm::DenseMap<Value, int64_t> indexOf;
    for (unsigned i = 0; i < bwd.getNumArguments(); ++i) {
      auto it = keptValueOf.find(bwd.getArgument(i));
      if (it == keptValueOf.end())
        continue;
      auto [slot, fresh] = indexOf.try_emplace(it->second, results.size());
      if (fresh) {
        results.push_back(it->second);
        resultAttrs.push_back(b.getDictionaryAttr(
            {b.getNamedAttr("pipe.saved", b.getUnitAttr())}));
      }
      bwd.setArgAttr(i, pipe::attrs::kFwdResult,
                     b.getI64IntegerAttr(slot->second));
    }
    ret->setOperands(results);
    fwd.setFunctionType(b.getFunctionType(fwd.getArgumentTypes(),
                                          ValueRange(results).getTypes()));
    fwd.setAllResultAttrs(resultAttrs);
  }
};

struct PipeRecomputePass
    : public pipec::impl::PipeRecomputePassBase<PipeRecomputePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto fwds = getStageFuncs(module, "fwd");
    auto bwds = getStageFuncs(module, "bwd");
    if (fwds.empty() || bwds.size() != fwds.size()) {
      module.emitError("expected @sK_fwd and @sK_bwd for every stage; run "
                       "--pipe-split-stages and --nn-autodiff first");
      return signalPassFailure();
    }
    if (failed(requireBodies(fwds)) || failed(requireBodies(bwds)))
      return signalPassFailure();
    for (func::FuncOp f : getStageFuncs(module, "bwdw"))
      if (f) {
        f.emitError("recomputation runs before the backward is split (zb-h1 "
                    "splits it in --pipe-build-schedule)");
        return signalPassFailure();
      }
    std::vector<std::string> modes(mode.begin(), mode.end());
    if (modes.empty())
      modes.push_back("none");
    if (modes.size() == 1)
      modes.assign(fwds.size(), modes.front());
    if (modes.size() != fwds.size()) {
      module.emitError("mode lists ")
          << modes.size() << " modes for " << fwds.size()
          << " stages (give one for every stage, or one per stage)";
      return signalPassFailure();
    }
    for (size_t q = 0; q < fwds.size(); ++q) {
      const std::string &m = modes[q];
      if (m != "none" && m != "full" && m != "selective") {
        module.emitError("unknown recomputation mode '")
            << m << "' for stage " << q << " (none, full, selective)";
        return signalPassFailure();
      }
      if (m == "none")
        continue;
      if (failed(StageRecompute(fwds[q], bwds[q], m == "selective").run()))
        return signalPassFailure();
    }
  }
};

} // namespace
