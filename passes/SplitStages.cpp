//===- SplitStages.cpp - --pipe-split-stages ------------------------------===//
//
// Turns the model function, whose layer ops carry `pipe.stage`, into one
// forward function per stage with explicit boundaries:
//   - arguments: model inputs (`pipe.feed = <input index>`) or tensors
//     produced by an earlier stage (`pipe.from = array<i64: stage, result>`);
//     a tensor skipping stages is received directly from its producer;
//   - results: tensors some later stage consumes, and model outputs
//     (`pipe.output = <output index>`).
// Weight loads and constants are cloned into every stage that uses them; a
// weight several stages read (tied weights) is listed in the module's
// pipe.tied attribute, and every such stage keeps a copy of it.
//
//===----------------------------------------------------------------------===//
#include "passes/PassUtils.h"
#include "passes/Passes.h"

#include "mlir/Dialect/MLProgram/IR/MLProgram.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"

#include <set>

namespace pipec {
#define GEN_PASS_DEF_PIPESPLITSTAGESPASS
#include "passes/Passes.h.inc"
} // namespace pipec

using namespace mlir;
using namespace pipec;

namespace {

struct PipeSplitStagesPass
    : public pipec::impl::PipeSplitStagesPassBase<PipeSplitStagesPass> {
  using Base::Base;

  /// Stage of a layer op; -1 for ops that are cloned where used.
  static int64_t stageOf(Operation *op) {
    auto attr = op->getAttrOfType<IntegerAttr>(pipe::attrs::kStage);
    return attr ? attr.getInt() : -1;
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto plan = module->getAttrOfType<pipe::PlanAttr>(pipe::attrs::kPlan);
    if (!plan) {
      module.emitError("no pipe.plan on the module; run --pipe-plan first");
      return signalPassFailure();
    }
    func::FuncOp fn = getModelFunc(module);
    if (!fn)
      return signalPassFailure();
    int64_t numStages = plan.getFirst().size();
    Block &body = fn.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    OpBuilder b(module.getContext());

    // Check stages; note tied weights (a parameter read by several
    // stages: each gets a copy, and --pipe-build-schedule sums the copies'
    // gradients before the update).
    std::map<std::string, std::set<int64_t>> tied;
    for (Operation &op : body.without_terminator()) {
      if (isLayer(&op) && (stageOf(&op) < 0 || stageOf(&op) >= numStages)) {
        op.emitError("layer has no valid pipe.stage (plan has ")
            << numStages << " stages)";
        return signalPassFailure();
      }
      if (!isLayer(&op) && !isa<ml_program::GlobalStoreOp>(op) &&
          op.getNumOperands() > 0) {
        // Copied into every stage that reads it, which only works for ops
        // of nothing (constants, weight loads).
        op.emitError("'") << op.getName()
                          << "' is not an nn layer but reads values; the "
                             "stages take nn ops, constants and weight loads";
        return signalPassFailure();
      }
      if (isLayer(&op) || !op.getNumResults())
        continue;
      std::set<int64_t> users;
      for (Operation *user : op.getUsers())
        if (!isa<func::ReturnOp>(user))
          users.insert(stageOf(user));
      if (auto load = dyn_cast<ml_program::GlobalLoadOp>(op);
          load && users.size() > 1) {
        auto global = module.lookupSymbol<ml_program::GlobalOp>(load.getGlobal());
        if (global && global.getIsMutable() && !users.count(-1))
          tied[load.getGlobal().getLeafReference().str()].insert(users.begin(),
                                                                 users.end());
      }
    }
    if (!tied.empty()) {
      SmallVector<NamedAttribute> entries;
      for (auto &[name, stages] : tied)
        entries.push_back(b.getNamedAttr(
            name, b.getDenseI64ArrayAttr(SmallVector<int64_t>(stages.begin(),
                                                              stages.end()))));
      module->setAttr(pipe::attrs::kTied, b.getDictionaryAttr(entries));
    }
    for (Operation &op : body.without_terminator())
      for (Value v : op.getOperands())
        if (Operation *def = v.getDefiningOp())
          if (isLayer(def) && isLayer(&op) && stageOf(def) > stageOf(&op)) {
            op.emitError("uses a value of a later stage (")
                << stageOf(def) << " > " << stageOf(&op)
                << "): stages must follow the data flow";
            return signalPassFailure();
          }

    for (Operation &op : body.without_terminator())
      if (auto store = dyn_cast<ml_program::GlobalStoreOp>(op)) {
        Operation *def = store.getValue().getDefiningOp();
        if (!def || !isLayer(def)) {
          store.emitError("stores a value no layer computes");
          return signalPassFailure();
        }
      }

    // Values each stage must return: consumed by a later stage or returned.
    llvm::DenseMap<Value, int64_t> outputIndex;
    for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
      if (!v.getDefiningOp() || !isLayer(v.getDefiningOp())) {
        fn.emitError("model output ")
            << i << " is not computed by a layer (an input or a constant)";
        return signalPassFailure();
      }
      if (auto [it, fresh] = outputIndex.try_emplace(v, i); !fresh) {
        fn.emitError("model output ")
            << i << " is the value of model output " << it->second
            << "; give each output its own value (an Identity)";
        return signalPassFailure();
      }
    }
    SmallVector<llvm::SetVector<Value>> stageResults(numStages);
    for (Operation &op : body.without_terminator()) {
      if (!isLayer(&op))
        continue;
      for (Value r : op.getResults()) {
        bool crosses = outputIndex.count(r);
        for (Operation *user : r.getUsers())
          if (isLayer(user) && stageOf(user) > stageOf(&op))
            crosses = true;
        if (crosses)
          stageResults[stageOf(&op)].insert(r);
      }
    }

    b.setInsertionPoint(fn);
    for (int64_t s = 0; s < numStages; ++s) {
      auto stageFn = func::FuncOp::create(b, fn.getLoc(), stageFuncName(s, "fwd"),
                                          b.getFunctionType({}, {}));
      stageFn->setAttr(pipe::attrs::kStage, b.getI64IntegerAttr(s));
      Block *entry = stageFn.addEntryBlock();
      OpBuilder sb = OpBuilder::atBlockEnd(entry);
      IRMapping map;
      SmallVector<DictionaryAttr> argAttrs;
      auto addArg = [&](Value v, NamedAttribute attr) {
        map.map(v, entry->addArgument(v.getType(), v.getLoc()));
        argAttrs.push_back(b.getDictionaryAttr({attr}));
      };
      for (Operation &op : body.without_terminator()) {
        if (!isLayer(&op) || stageOf(&op) != s)
          continue;
        for (Value v : op.getOperands()) {
          if (map.contains(v))
            continue;
          if (auto arg = dyn_cast<BlockArgument>(v)) {
            // Model inputs feed by index; the dropout random state is -2.
            bool rng = fn.getArgAttr(arg.getArgNumber(), "pipec.rng") != nullptr;
            addArg(v, b.getNamedAttr(pipe::attrs::kFeed,
                                     b.getI64IntegerAttr(
                                         rng ? int64_t(-2)
                                             : int64_t(arg.getArgNumber()))));
            continue;
          }
          Operation *def = v.getDefiningOp();
          if (!isLayer(def)) {
            sb.clone(*def, map);
            continue;
          }
          int64_t from = stageOf(def);
          int64_t result = stageResults[from].getArrayRef().size();
          for (auto [i, r] : llvm::enumerate(stageResults[from]))
            if (r == v)
              result = i;
          addArg(v, b.getNamedAttr("pipe.from",
                                   b.getDenseI64ArrayAttr({from, result})));
        }
        Operation *clone = sb.clone(op, map);
        clone->removeAttr(pipe::attrs::kStage);
      }
      // State updates computed by this stage (BatchNorm running statistics)
      // are stored by it.
      for (Operation &op : body.without_terminator()) {
        auto store = dyn_cast<ml_program::GlobalStoreOp>(op);
        if (!store)
          continue;
        Operation *def = store.getValue().getDefiningOp();
        if (!def || !isLayer(def) || stageOf(def) != s)
          continue;
        sb.clone(op, map);
      }
      SmallVector<Value> results;
      SmallVector<Type> resultTypes;
      for (Value r : stageResults[s]) {
        results.push_back(map.lookup(r));
        resultTypes.push_back(r.getType());
      }
      func::ReturnOp::create(sb, fn.getLoc(), results);
      stageFn.setFunctionType(
          b.getFunctionType(entry->getArgumentTypes(), resultTypes));
      for (auto [i, attrs] : llvm::enumerate(argAttrs))
        stageFn.setArgAttrs(i, attrs);
      for (auto [i, r] : llvm::enumerate(stageResults[s]))
        if (auto it = outputIndex.find(r); it != outputIndex.end())
          stageFn.setResultAttr(i, "pipe.output",
                                b.getI64IntegerAttr(it->second));
      if (entry->getNumArguments() == 0 && s > 0) {
        stageFn.emitError("stage ") << s << " receives nothing";
        return signalPassFailure();
      }
    }
    // Keep the model's input names for the data feed.
    SmallVector<Attribute> names;
    for (unsigned i = 0; i < fn.getNumArguments(); ++i) {
      auto name = fn.getArgAttrOfType<StringAttr>(i, "pipec.name");
      names.push_back(name ? name : b.getStringAttr("input" + std::to_string(i)));
    }
    module->setAttr("pipec.inputs", b.getArrayAttr(names));
    fn.erase();
  }
};

} // namespace
