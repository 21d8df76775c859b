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

/// Stage of a layer op; -1 for ops that are cloned where used.
int64_t stageOf(Operation *op) {
  auto attr = op->getAttrOfType<IntegerAttr>(pipe::attrs::kStage);
  return attr ? attr.getInt() : -1;
}

/// Every layer on a stage of the plan, ops other than layers only of
/// nothing (constants, weight loads; they are copied where used) or stores,
/// stages in data-flow order, and stores of values layers compute.
LogicalResult checkPlacement(Block &body, int64_t numStages) {
  for (Operation &op : body.without_terminator()) {
    if (isLayer(&op) && (stageOf(&op) < 0 || stageOf(&op) >= numStages))
      return op.emitError("layer has no valid pipe.stage (plan has ")
             << numStages << " stages)";
    if (!isLayer(&op) && !isa<ml_program::GlobalStoreOp>(op) &&
        op.getNumOperands() > 0)
      return op.emitError("'")
             << op.getName()
             << "' is not an nn layer but reads values; the stages take nn "
                "ops, constants and weight loads";
  }
  for (Operation &op : body.without_terminator())
    for (Value v : op.getOperands())
      if (Operation *def = v.getDefiningOp())
        if (isLayer(def) && isLayer(&op) && stageOf(def) > stageOf(&op))
          return op.emitError("uses a value of a later stage (")
                 << stageOf(def) << " > " << stageOf(&op)
                 << "): stages must follow the data flow";
  for (Operation &op : body.without_terminator())
    if (auto store = dyn_cast<ml_program::GlobalStoreOp>(op)) {
      Operation *def = store.getValue().getDefiningOp();
      if (!def || !isLayer(def))
        return store.emitError("stores a value no layer computes");
    }
  return success();
}

/// Tied weights: a mutable parameter read by several stages. Each gets a
/// copy, and --pipe-build-schedule sums the copies' gradients before the
/// update; the module's pipe.tied lists them.
void recordTiedWeights(ModuleOp module, Block &body) {
  std::map<std::string, std::set<int64_t>> tied;
  for (Operation &op : body.without_terminator()) {
    auto load = dyn_cast<ml_program::GlobalLoadOp>(op);
    if (!load)
      continue;
    std::set<int64_t> users;
    for (Operation *user : load->getUsers())
      if (!isa<func::ReturnOp>(user))
        users.insert(stageOf(user));
    if (users.size() < 2 || users.count(-1))
      continue;
    auto global = module.lookupSymbol<ml_program::GlobalOp>(load.getGlobal());
    if (global && global.getIsMutable())
      tied[load.getGlobal().getLeafReference().str()].insert(users.begin(),
                                                             users.end());
  }
  if (tied.empty())
    return;
  Builder b(module.getContext());
  SmallVector<NamedAttribute> entries;
  for (auto &[name, stages] : tied)
    entries.push_back(
        b.getNamedAttr(name, b.getDenseI64ArrayAttr(SmallVector<int64_t>(
                                 stages.begin(), stages.end()))));
  module->setAttr(pipe::attrs::kTied, b.getDictionaryAttr(entries));
}

/// The model output index of each returned value; every output a distinct
/// value that a layer computes.
FailureOr<llvm::DenseMap<Value, int64_t>> outputIndices(func::FuncOp fn,
                                                        func::ReturnOp ret) {
  llvm::DenseMap<Value, int64_t> outputIndex;
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    if (!v.getDefiningOp() || !isLayer(v.getDefiningOp()))
      return fn.emitError("model output ")
             << i << " is not computed by a layer (an input or a constant)";
    if (auto [it, fresh] = outputIndex.try_emplace(v, i); !fresh)
      return fn.emitError("model output ")
             << i << " is the value of model output " << it->second
             << "; give each output its own value (an Identity)";
  }
  return outputIndex;
}

/// The values each stage must return: consumed by a later stage, or model
/// outputs.
SmallVector<llvm::SetVector<Value>>
stageResultsOf(Block &body, const llvm::DenseMap<Value, int64_t> &outputIndex,
               int64_t numStages) {
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
  return stageResults;
}

/// Writes @sK_fwd of stage `s` before the model function.
struct StageWriter {
  func::FuncOp fn;
  const llvm::DenseMap<Value, int64_t> &outputIndex;
  const SmallVector<llvm::SetVector<Value>> &stageResults;

  /// The argument of a value stage `s` reads from outside: a model input
  /// (by index; the dropout random state is -2) or an earlier stage's result.
  NamedAttribute boundaryOf(OpBuilder &b, Value v) {
    if (auto arg = dyn_cast<BlockArgument>(v)) {
      bool rng = fn.getArgAttr(arg.getArgNumber(), "pipec.rng") != nullptr;
      return b.getNamedAttr(
          pipe::attrs::kFeed,
          b.getI64IntegerAttr(rng ? int64_t(-2) : int64_t(arg.getArgNumber())));
    }
    int64_t from = stageOf(v.getDefiningOp());
    int64_t result = stageResults[from].getArrayRef().size();
    for (auto [i, r] : llvm::enumerate(stageResults[from]))
      if (r == v)
        result = i;
    return b.getNamedAttr("pipe.from", b.getDenseI64ArrayAttr({from, result}));
  }

  LogicalResult write(int64_t s) {
    Block &body = fn.getBody().front();
    OpBuilder b(fn);
    auto stageFn = func::FuncOp::create(b, fn.getLoc(), stageFuncName(s, "fwd"),
                                        b.getFunctionType({}, {}));
    stageFn->setAttr(pipe::attrs::kStage, b.getI64IntegerAttr(s));
    Block *entry = stageFn.addEntryBlock();
    OpBuilder sb = OpBuilder::atBlockEnd(entry);
    IRMapping map;
    SmallVector<DictionaryAttr> argAttrs;
    for (Operation &op : body.without_terminator()) {
      if (!isLayer(&op) || stageOf(&op) != s)
        continue;
      for (Value v : op.getOperands()) {
        if (map.contains(v))
          continue;
        if (Operation *def = v.getDefiningOp(); def && !isLayer(def)) {
          sb.clone(*def, map); // a constant or weight load, copied
          continue;
        }
        map.map(v, entry->addArgument(v.getType(), v.getLoc()));
        argAttrs.push_back(b.getDictionaryAttr({boundaryOf(b, v)}));
      }
      Operation *clone = sb.clone(op, map);
      clone->removeAttr(pipe::attrs::kStage);
    }
    // State updates computed by this stage (BatchNorm running statistics)
    // are stored by it.
    for (Operation &op : body.without_terminator())
      if (auto store = dyn_cast<ml_program::GlobalStoreOp>(op))
        if (stageOf(store.getValue().getDefiningOp()) == s)
          sb.clone(op, map);
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
    if (entry->getNumArguments() == 0 && s > 0)
      return stageFn.emitError("stage ") << s << " receives nothing";
    return success();
  }
};

struct PipeSplitStagesPass
    : public pipec::impl::PipeSplitStagesPassBase<PipeSplitStagesPass> {
  using Base::Base;

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
    if (failed(checkPlacement(body, numStages)))
      return signalPassFailure();
    recordTiedWeights(module, body);
    FailureOr<llvm::DenseMap<Value, int64_t>> outputIndex =
        outputIndices(fn, ret);
    if (failed(outputIndex))
      return signalPassFailure();
    SmallVector<llvm::SetVector<Value>> stageResults =
        stageResultsOf(body, *outputIndex, numStages);
    StageWriter writer{fn, *outputIndex, stageResults};
    for (int64_t s = 0; s < numStages; ++s)
      if (failed(writer.write(s)))
        return signalPassFailure();
    // Keep the model's input names for the data feed.
    Builder b(module.getContext());
    SmallVector<Attribute> names;
    for (unsigned i = 0; i < fn.getNumArguments(); ++i) {
      auto name = fn.getArgAttrOfType<StringAttr>(i, "pipec.name");
      names.push_back(name ? name
                           : b.getStringAttr("input" + std::to_string(i)));
    }
    module->setAttr("pipec.inputs", b.getArrayAttr(names));
    fn.erase();
  }
};

} // namespace
