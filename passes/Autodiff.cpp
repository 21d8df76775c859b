//===- Autodiff.cpp - --nn-autodiff ---------------------------------------===//
//
// Reverse-mode differentiation of every stage forward function:
//
//   @sK_fwd(args) -> (results..., saved...)      forward, plus the values the
//                                                backward needs (stashed per
//                                                microbatch by the schedule)
//   @sK_bwd(saved / seeds) -> (grads of boundary args)
//                                                weight gradients accumulate
//                                                into `<weight>.grad` globals
//   @sK_step(%lr[, %t]) : W <- opt(W, G, state); G <- 0
//                                                the optimizer update (SGD, or
//                                                ONNX Momentum/Adam/Adagrad
//                                                with T = updates so far)
//
// Boundary conventions (attributes, see dialects/pipe/PipeDialect.h):
//   bwd args:   pipe.fwd_arg = i      forward argument i of the same microbatch
//               pipe.fwd_result = j   forward result j (a saved value, or an
//                                     output the backward reads: it is
//                                     stashed once, as the output)
//               pipe.loss_seed        dL/dloss of the microbatch (1/m)
//               pipe.grad_from = [k, a]  gradient of this stage's output that
//                                        stage k consumed as its argument a
//   bwd results: pipe.grad_of_arg = i gradient of forward argument i
// The last stage gets the loss: softmax cross-entropy of model output 0
// against an int64 labels feed (`pipe.feed = -1`), or the model's own loss.
//
//===----------------------------------------------------------------------===//
#include "passes/KernelCalls.h"
#include "passes/PassUtils.h"
#include "passes/Passes.h"

#include "mlir/Dialect/MLProgram/IR/MLProgram.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/MapVector.h"

namespace pipec {
#define GEN_PASS_DEF_NNAUTODIFFPASS
#include "passes/Passes.h.inc"
} // namespace pipec

using namespace mlir;
using namespace pipec;

namespace {

/// The optimizer of the step functions (ONNX training-operator semantics).
struct OptimizerConfig {
  std::string name = "sgd"; // sgd, momentum, nesterov, adam, adagrad
  double momentum = 0.9, beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
  double weightDecay = 0;
  /// State tensors per weight (V for momentum, V and H for Adam, H for
  /// Adagrad; SGD with weight decay runs as momentum 0 with one).
  int states() const {
    if (name == "adam")
      return 2;
    if (name == "sgd")
      return weightDecay != 0 ? 1 : 0;
    return 1;
  }
};

/// Builds the backward function of one stage.
class StageDifferentiator {
public:
  StageDifferentiator(ModuleOp module, func::FuncOp fwd,
                      ArrayRef<func::FuncOp> allFwd, int64_t stage,
                      const OptimizerConfig &opt, ArrayRef<bool> needsGrad)
      : module(module), fwd(fwd), allFwd(allFwd), stage(stage), opt(opt),
        needsGrad(needsGrad), b(module.getContext()) {}

  LogicalResult run();

private:
  Value mapForward(Value v);
  void addGrad(Value v, Value g);
  ml_program::GlobalOp gradGlobal(ml_program::GlobalOp weight);
  ml_program::GlobalOp zeroGlobal(ml_program::GlobalOp weight,
                                  StringRef suffix, StringRef attr);
  void emitUpdate(OpBuilder &sb, ml_program::GlobalOp weight, Location loc,
                  Value lr, Value count);
  // The phases of run(), in order.
  void seedGradients(func::ReturnOp ret);
  LogicalResult sweep(Block &body);
  void accumulateWeightGradients();
  SmallVector<Value> boundaryGradients(Block &body,
                                       SmallVector<DictionaryAttr> &attrs);
  void pruneStash();
  void appendSavedToForward(func::ReturnOp ret);
  void emitStep();

  ModuleOp module;
  func::FuncOp fwd;
  ArrayRef<func::FuncOp> allFwd;
  int64_t stage;
  const OptimizerConfig &opt;
  /// Per stage: it or a stage before it trains a weight, so gradients
  /// flowing back into it are used (else none are computed or sent).
  ArrayRef<bool> needsGrad;
  OpBuilder b;
  func::FuncOp bwd;
  Block *entry = nullptr;
  SmallVector<DictionaryAttr> argAttrs;
  llvm::DenseMap<Value, Value> fwdToBwd;
  llvm::DenseMap<Value, Value> grads;
  SmallVector<Value> saved; // forward values appended to @sK_fwd's results
  llvm::MapVector<StringRef, Value> weightGrads;
  llvm::DenseMap<StringRef, ml_program::GlobalOp> weightGlobals;
};

} // namespace

Value StageDifferentiator::mapForward(Value v) {
  if (Value m = fwdToBwd.lookup(v))
    return m;
  auto newArg = [&](StringRef name, int64_t index) {
    Value arg = entry->addArgument(v.getType(), v.getLoc());
    argAttrs.push_back(
        b.getDictionaryAttr({b.getNamedAttr(name, b.getI64IntegerAttr(index))}));
    return arg;
  };
  Value mapped;
  if (auto arg = dyn_cast<BlockArgument>(v)) {
    mapped = newArg(pipe::attrs::kFwdArg, arg.getArgNumber());
  } else if (isa<ml_program::GlobalLoadOp, nn::ConstantOp>(v.getDefiningOp())) {
    // Weights and constants are re-read, not stashed.
    mapped = b.clone(*v.getDefiningOp())->getResult(0);
  } else {
    // A value the forward already returns (a stage output, sent on) is in
    // the stash slot as that result: stashing it again would hold it twice.
    auto ret = cast<func::ReturnOp>(fwd.getBody().front().getTerminator());
    for (auto [k, out] : llvm::enumerate(ret.getOperands()))
      if (out == v) {
        mapped = newArg(pipe::attrs::kFwdResult, int64_t(k));
        break;
      }
    if (!mapped) {
      int64_t numResults = fwd.getFunctionType().getNumResults();
      mapped = newArg(pipe::attrs::kFwdResult, numResults + saved.size());
      saved.push_back(v);
    }
  }
  fwdToBwd[v] = mapped;
  return mapped;
}

void StageDifferentiator::addGrad(Value v, Value g) {
  Value &slot = grads[v];
  slot = slot ? nn::AddOp::create(b, g.getLoc(), g.getType(), slot, g) : g;
}

/// A mutable zero-initialised global `<weight><suffix>` tagged with `attr`
/// = @weight (gradient accumulators, optimizer state).
ml_program::GlobalOp
StageDifferentiator::zeroGlobal(ml_program::GlobalOp weight, StringRef suffix,
                                StringRef attr) {
  std::string name = (weight.getSymName() + suffix).str();
  if (auto g = module.lookupSymbol<ml_program::GlobalOp>(name))
    return g;
  OpBuilder gb(weight);
  gb.setInsertionPointAfter(weight);
  auto type = cast<RankedTensorType>(weight.getType());
  auto zeros = DenseElementsAttr::get(type, gb.getF32FloatAttr(0.0f));
  auto g = ml_program::GlobalOp::create(gb, weight.getLoc(), name, type,
                                        /*is_mutable=*/true, zeros,
                                        gb.getStringAttr("private"));
  g->setAttr(attr, FlatSymbolRefAttr::get(weight.getSymNameAttr()));
  return g;
}

ml_program::GlobalOp
StageDifferentiator::gradGlobal(ml_program::GlobalOp weight) {
  return zeroGlobal(weight, ".grad", pipe::attrs::kGradOf);
}

/// W <- optimizer(W, G, state...); G <- 0, its ops at `loc`.
void StageDifferentiator::emitUpdate(OpBuilder &sb, ml_program::GlobalOp weight,
                                     Location loc, Value lr, Value count) {
  auto type = weight.getType();
  auto ref = [](ml_program::GlobalOp g) {
    return FlatSymbolRefAttr::get(g.getSymNameAttr());
  };
  auto load = [&](ml_program::GlobalOp g) -> Value {
    return ml_program::GlobalLoadOp::create(sb, loc, type, ref(g));
  };
  auto store = [&](ml_program::GlobalOp g, Value v) {
    ml_program::GlobalStoreOp::create(sb, loc, ref(g), v);
  };
  auto f32 = [&](double v) { return sb.getF32FloatAttr(static_cast<float>(v)); };
  auto gradG = gradGlobal(weight);
  Value w = load(weight), g = load(gradG);
  if (opt.states() == 0) {
    store(weight, nn::SgdUpdateOp::create(sb, loc, type, w, g, lr));
  } else if (opt.name == "adam") {
    auto vG = zeroGlobal(weight, ".adam_v", "pipe.state_of");
    auto hG = zeroGlobal(weight, ".adam_h", "pipe.state_of");
    auto adam = nn::AdamOp::create(sb, loc, type, type, type, lr, count, w, g,
                                   load(vG), load(hG), f32(opt.beta1),
                                   f32(opt.beta2), f32(opt.weightDecay),
                                   f32(0.0), f32(opt.epsilon));
    store(weight, adam.getXNew());
    store(vG, adam.getVNew());
    store(hG, adam.getHNew());
  } else if (opt.name == "adagrad") {
    auto hG = zeroGlobal(weight, ".adagrad_h", "pipe.state_of");
    auto ada = nn::AdagradOp::create(sb, loc, type, type, lr, count, w, g,
                                     load(hG), f32(0.0), f32(opt.epsilon),
                                     f32(opt.weightDecay));
    store(weight, ada.getXNew());
    store(hG, ada.getHNew());
  } else {
    // momentum / nesterov, and SGD with weight decay (momentum 0).
    auto vG = zeroGlobal(weight, ".momentum", "pipe.state_of");
    bool plain = opt.name == "sgd";
    auto mom = nn::MomentumOp::create(
        sb, loc, type, type, lr, count, w, g, load(vG),
        f32(plain ? 0.0 : opt.momentum), f32(1.0),
        sb.getStringAttr(opt.name == "nesterov" ? "nesterov" : "standard"),
        f32(opt.weightDecay));
    store(weight, mom.getXNew());
    store(vG, mom.getVNew());
  }
  store(gradG, nn::FillOp::create(sb, loc, type, sb.getF64FloatAttr(0.0)));
}

/// A tensor of floats (f32, or f64 in the float64 mode): what carries a
/// gradient.
static bool isFloatTensor(Type t) {
  auto tensor = dyn_cast<RankedTensorType>(t);
  return tensor && isa<FloatType>(tensor.getElementType());
}

LogicalResult pipec::reverseSweep(
    ArrayRef<Operation *> ops, OpBuilder &b,
    const llvm::DenseMap<Value, Value> &grads,
    function_ref<Value(Value)> mapForward,
    function_ref<void(Value, Value)> take) {
  const OpBuilder::InsertPoint where = b.saveInsertionPoint();
  for (Operation *op : llvm::reverse(ops)) {
    b.restoreInsertionPoint(where);
    SmallVector<Value> resultGrads;
    bool any = false;
    for (Value r : op->getResults()) {
      resultGrads.push_back(grads.lookup(r));
      any |= static_cast<bool>(resultGrads.back());
    }
    if (!any)
      continue;
    auto diff = dyn_cast<nn::DifferentiableOpInterface>(op);
    if (!diff)
      return op->emitError("'") << op->getName()
                                << "' has no gradient (DifferentiableOpInterface)";
    SmallVector<Value> operandGrads;
    // Backward ops keep the forward op's location: the profiler charges
    // their time to it.
    if (failed(diff.buildVJP(b, resultGrads, mapForward, operandGrads)))
      return failure();
    for (auto [i, v] : llvm::enumerate(op->getOperands()))
      if (i < operandGrads.size() && operandGrads[i])
        take(v, operandGrads[i]);
  }
  return success();
}

bool pipec::isUndifferentiatedResult(Value v) {
  while (v.getDefiningOp() && isViewOp(v.getDefiningOp()))
    v = v.getDefiningOp()->getOperand(0);
  auto r = dyn_cast<OpResult>(v);
  return r && r.getResultNumber() > 0 &&
         isa<nn::BatchNormOp, nn::LayerNormOp, nn::SoftmaxCrossEntropyLossOp>(
             r.getOwner());
}

FailureOr<func::FuncOp> pipec::buildGradientFunction(func::FuncOp fn,
                                                     StringRef name) {
  Block &body = fn.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  SmallVector<Type> inputs(fn.getArgumentTypes()), outputs;
  for (Value r : ret.getOperands())
    if (isFloatTensor(r.getType()))
      inputs.push_back(r.getType());
  for (Type t : fn.getArgumentTypes())
    if (isFloatTensor(t))
      outputs.push_back(t);
  OpBuilder b(fn);
  b.setInsertionPointAfter(fn);
  auto grad = func::FuncOp::create(b, fn.getLoc(), name,
                                   b.getFunctionType(inputs, outputs));
  Block *entry = grad.addEntryBlock();
  b.setInsertionPointToEnd(entry);
  // The forward, then the sweep over its copy.
  IRMapping map;
  for (auto [from, to] : llvm::zip(body.getArguments(), entry->getArguments()))
    map.map(from, to);
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator())
    ops.push_back(b.clone(op, map));
  llvm::DenseMap<Value, Value> grads;
  auto addGrad = [&](Value v, Value g) {
    if (v.getDefiningOp<nn::ConstantOp>() ||
        v.getDefiningOp<ml_program::GlobalLoadOp>())
      return; // literals and the case's initializers: not checked
    Value &slot = grads[v];
    slot = slot ? nn::AddOp::create(b, g.getLoc(), g.getType(), slot, g) : g;
  };
  unsigned seed = fn.getNumArguments();
  for (Value r : ret.getOperands())
    if (isFloatTensor(r.getType())) {
      Value dy = entry->getArgument(seed++);
      if (!isUndifferentiatedResult(r))
        addGrad(map.lookup(r), dy);
    }
  if (failed(reverseSweep(ops, b, grads, [](Value v) { return v; }, addGrad)))
    return failure();
  SmallVector<Value> results;
  for (BlockArgument arg : entry->getArguments().take_front(fn.getNumArguments())) {
    if (!isFloatTensor(arg.getType()))
      continue;
    Value g = grads.lookup(arg);
    results.push_back(g ? g
                        : nn::FillOp::create(b, arg.getLoc(), arg.getType(),
                                             b.getF64FloatAttr(0.0)));
  }
  func::ReturnOp::create(b, fn.getLoc(), results);
  return grad;
}

/// The operands of the tree of single-use nn.add ops rooted at `root` (of
/// one type) that are not such adds themselves.
static void addTreeLeaves(nn::AddOp root, SmallVectorImpl<Value> &leaves,
                          SmallVectorImpl<Operation *> &adds) {
  adds.push_back(root);
  for (Value operand : root->getOperands()) {
    auto inner = operand.getDefiningOp<nn::AddOp>();
    if (inner && inner->hasOneUse() && inner.getType() == root.getType())
      addTreeLeaves(inner, leaves, adds);
    else
      leaves.push_back(operand);
  }
}

/// The gradient of a tensor that is read through slices covering it along
/// one axis (ONNX Split: attention's q, k and v) is the sum of their
/// slice_grads, each a zero tensor of the full shape with one part filled:
/// the reverse sweep emits add(add(slice_grad, slice_grad), slice_grad).
/// Rewritten to one nn.concat of the parts, which writes the gradient once
/// instead of zero-filling it per part and adding the parts up. The same
/// values (a part's -0.0 stays -0.0 where the sum gave +0.0).
static void concatSliceGradSums(func::FuncOp fn) {
  SmallVector<nn::AddOp> roots;
  fn.walk([&](nn::AddOp add) {
    // A root: not itself an operand of a larger tree.
    if (add->hasOneUse())
      if (auto user = dyn_cast<nn::AddOp>(*add->getUsers().begin()))
        if (user.getType() == add.getType())
          return;
    roots.push_back(add);
  });
  for (nn::AddOp root : roots) {
    SmallVector<Value> leaves;
    SmallVector<Operation *> adds;
    addTreeLeaves(root, leaves, adds);
    auto type = dyn_cast<RankedTensorType>(root.getType());
    if (!type || !type.hasStaticShape())
      continue;
    // Every leaf a unit-step slice_grad of this type, used only here,
    // full along every axis but one, the same one for all.
    struct Part {
      int64_t start, size;
      Value grad;
    };
    SmallVector<Part> parts;
    int64_t axis = -1;
    bool ok = true;
    for (Value leaf : leaves) {
      auto sg = leaf.getDefiningOp<nn::SliceGradOp>();
      auto gradType =
          sg ? dyn_cast<RankedTensorType>(sg.getGrad().getType()) : nullptr;
      if (!sg || !sg->hasOneUse() || sg.getType() != type || !gradType ||
          !gradType.hasStaticShape()) {
        ok = false;
        break;
      }
      ArrayRef<int64_t> starts = sg.getStarts(), steps = sg.getSteps();
      for (int64_t d = 0; ok && d < type.getRank(); ++d) {
        if (steps[d] != 1) {
          ok = false;
        } else if (starts[d] != 0 ||
                   gradType.getDimSize(d) != type.getDimSize(d)) {
          if (axis >= 0 && axis != d)
            ok = false;
          axis = d;
        }
      }
      if (!ok)
        break;
      parts.push_back({axis >= 0 ? starts[axis] : 0,
                       axis >= 0 ? gradType.getDimSize(axis) : 0,
                       sg.getGrad()});
    }
    if (!ok || axis < 0 || parts.size() < 2)
      continue;
    // The parts must tile the axis exactly.
    llvm::sort(parts,
               [](const Part &a, const Part &b) { return a.start < b.start; });
    int64_t at = 0;
    for (const Part &part : parts) {
      ok &= part.start == at;
      at += part.size;
    }
    if (!ok || at != type.getDimSize(axis))
      continue;
    OpBuilder b(root);
    SmallVector<Value> inputs;
    for (const Part &part : parts)
      inputs.push_back(part.grad);
    Value concat = nn::ConcatOp::create(b, root.getLoc(), type, inputs,
                                        b.getI64IntegerAttr(axis));
    root.getResult().replaceAllUsesWith(concat);
    for (Operation *add : adds) // root first, then inward: users first
      add->erase();
    for (Value leaf : leaves)
      leaf.getDefiningOp()->erase();
  }
}

/// @sK_bwd from @sK_fwd: the seeds, the reverse sweep, the weight gradients
/// accumulated, the boundary gradients returned, the stash pruned to what
/// the backward reads (and appended to the forward's results), then @sK_step.
LogicalResult StageDifferentiator::run() {
  b.setInsertionPointAfter(fwd);
  bwd = func::FuncOp::create(b, fwd.getLoc(), stageFuncName(stage, "bwd"),
                             b.getFunctionType({}, {}));
  bwd->setAttr(pipe::attrs::kStage, b.getI64IntegerAttr(stage));
  entry = bwd.addEntryBlock();
  b.setInsertionPointToEnd(entry);

  Block &body = fwd.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  seedGradients(ret);
  if (failed(sweep(body)))
    return failure();
  accumulateWeightGradients();
  SmallVector<DictionaryAttr> resultAttrs;
  SmallVector<Value> results = boundaryGradients(body, resultAttrs);
  func::ReturnOp::create(b, fwd.getLoc(), results);
  pruneStash();
  bwd.setFunctionType(b.getFunctionType(entry->getArgumentTypes(),
                                        ValueRange(results).getTypes()));
  for (auto [i, attrs] : llvm::enumerate(argAttrs))
    bwd.setArgAttrs(i, attrs);
  for (auto [i, attrs] : llvm::enumerate(resultAttrs))
    bwd.setResultAttrs(i, attrs);
  // After `results` has served for the signature: a result may be a sum
  // this replaces.
  concatSliceGradSums(bwd);
  appendSavedToForward(ret);
  emitStep();
  return success();
}

/// Seeds: the loss, and the gradients later stages send back. Integer
/// values (ids, masks) carry no gradient across a cut.
void StageDifferentiator::seedGradients(func::ReturnOp ret) {
  MLIRContext *ctx = module.getContext();
  for (auto [r, v] : llvm::enumerate(ret.getOperands())) {
    if (!isFloatTensor(v.getType()))
      continue;
    if (fwd.getResultAttr(r, pipe::attrs::kLoss)) {
      Value seed = entry->addArgument(v.getType(), v.getLoc());
      argAttrs.push_back(b.getDictionaryAttr(
          {b.getNamedAttr(pipe::attrs::kLossSeed, UnitAttr::get(ctx))}));
      addGrad(v, seed);
      continue;
    }
    if (!needsGrad[size_t(stage)])
      continue; // nothing here or upstream trains: no gradient comes back
    for (auto [k, consumerConst] : llvm::enumerate(allFwd)) {
      func::FuncOp consumer = consumerConst;
      if (static_cast<int64_t>(k) <= stage)
        continue;
      for (unsigned a = 0; a < consumer.getNumArguments(); ++a) {
        auto from = consumer.getArgAttrOfType<DenseI64ArrayAttr>(a, "pipe.from");
        if (!from || from[0] != stage || from[1] != static_cast<int64_t>(r))
          continue;
        Value g = entry->addArgument(v.getType(), v.getLoc());
        argAttrs.push_back(b.getDictionaryAttr({b.getNamedAttr(
            "pipe.grad_from",
            b.getDenseI64ArrayAttr({static_cast<int64_t>(k), a}))}));
        addGrad(v, g);
      }
    }
  }
}

/// The reverse sweep over the forward's ops; gradients of weight loads are
/// summed per weight (a weight read twice gets one sum), constants get none.
LogicalResult StageDifferentiator::sweep(Block &body) {
  SmallVector<Operation *> ops;
  for (Operation &op : body.without_terminator())
    ops.push_back(&op);
  b.setInsertionPointToEnd(entry);
  auto mapper = [&](Value v) { return mapForward(v); };
  auto take = [&](Value v, Value g) {
    if (auto load = v.getDefiningOp<ml_program::GlobalLoadOp>()) {
      StringRef name = load.getGlobal().getLeafReference().getValue();
      weightGlobals[name] =
          module.lookupSymbol<ml_program::GlobalOp>(load.getGlobal());
      Value &acc = weightGrads[name];
      acc = acc ? nn::AddOp::create(b, g.getLoc(), g.getType(), acc, g) : g;
      return;
    }
    if (v.getDefiningOp<nn::ConstantOp>())
      return;
    addGrad(v, g);
  };
  return reverseSweep(ops, b, grads, mapper, take);
}

/// Accumulate weight gradients into their .grad globals, each right where
/// its gradient is complete: the gradient's buffer is free again at once
/// (accumulating at the end of the backward kept every weight gradient of
/// the stage alive in scratch through the whole sweep).
void StageDifferentiator::accumulateWeightGradients() {
  OpBuilder::InsertionGuard guard(b);
  for (auto &[name, g] : weightGrads) {
    auto weight = weightGlobals.lookup(name);
    if (!weight || !weight.getIsMutable())
      continue;
    auto gradG = gradGlobal(weight);
    auto ref = FlatSymbolRefAttr::get(gradG.getSymNameAttr());
    if (Operation *def = g.getDefiningOp(); def && def->getBlock() == entry)
      b.setInsertionPointAfter(def);
    else
      b.setInsertionPointToEnd(entry);
    Value old = ml_program::GlobalLoadOp::create(b, g.getLoc(), g.getType(), ref);
    Value sum = nn::AddOp::create(b, g.getLoc(), g.getType(), old, g);
    ml_program::GlobalStoreOp::create(b, g.getLoc(), ref, sum);
  }
}

/// The backward's results: gradients of the boundary arguments (zero where
/// nothing flows back), each with the argument it belongs to.
SmallVector<Value>
StageDifferentiator::boundaryGradients(Block &body,
                                       SmallVector<DictionaryAttr> &attrs) {
  SmallVector<Value> results;
  for (BlockArgument arg : body.getArguments()) {
    auto from = fwd.getArgAttrOfType<DenseI64ArrayAttr>(arg.getArgNumber(),
                                                         "pipe.from");
    if (!from || !isFloatTensor(arg.getType()) ||
        !needsGrad[size_t(from[0])])
      continue;
    Value g = grads.lookup(arg);
    if (!g)
      g = nn::FillOp::create(b, arg.getLoc(), arg.getType(),
                             b.getF64FloatAttr(0.0));
    results.push_back(g);
    attrs.push_back(b.getDictionaryAttr({b.getNamedAttr(
        "pipe.grad_of_arg", b.getI64IntegerAttr(arg.getArgNumber()))}));
  }
  return results;
}

/// Drop dead backward ops (e.g. the input gradient of the first stage),
/// then the stashed values nobody reads any more, renumbering the rest.
void StageDifferentiator::pruneStash() {
  for (Operation &op : llvm::make_early_inc_range(llvm::reverse(*entry)))
    if (isOpTriviallyDead(&op))
      op.erase();
  SmallVector<Value> keptSaved;
  llvm::DenseMap<int64_t, int64_t> savedIndex;
  int64_t firstSavedIndex = fwd.getFunctionType().getNumResults();
  for (int64_t i = int64_t(entry->getNumArguments()) - 1; i >= 0; --i) {
    auto attrs = argAttrs[i];
    bool data = attrs.get(pipe::attrs::kFwdArg) || attrs.get(pipe::attrs::kFwdResult);
    if (data && entry->getArgument(i).use_empty()) {
      entry->eraseArgument(i);
      argAttrs.erase(argAttrs.begin() + i);
    }
  }
  for (auto &attrs : argAttrs) {
    auto r = attrs.getAs<IntegerAttr>(pipe::attrs::kFwdResult);
    if (!r || r.getInt() < firstSavedIndex)
      continue; // an output of the forward, not a saved value
    Value v = saved[r.getInt() - firstSavedIndex];
    savedIndex[r.getInt()] = firstSavedIndex + keptSaved.size();
    keptSaved.push_back(v);
    attrs = b.getDictionaryAttr({b.getNamedAttr(
        pipe::attrs::kFwdResult, b.getI64IntegerAttr(savedIndex[r.getInt()]))});
  }
  saved = keptSaved;
}

/// Forward: append the saved values to the results (pipe.saved).
void StageDifferentiator::appendSavedToForward(func::ReturnOp ret) {
  unsigned firstSaved = ret.getNumOperands();
  SmallVector<Value> newResults(ret.getOperands());
  newResults.append(saved.begin(), saved.end());
  ret->setOperands(newResults);
  SmallVector<DictionaryAttr> fwdResultAttrs;
  for (unsigned i = 0; i < firstSaved; ++i)
    fwdResultAttrs.push_back(fwd.getResultAttrDict(i)
                                 ? fwd.getResultAttrDict(i)
                                 : b.getDictionaryAttr({}));
  for (size_t i = 0; i < saved.size(); ++i)
    fwdResultAttrs.push_back(b.getDictionaryAttr(
        {b.getNamedAttr("pipe.saved", UnitAttr::get(module.getContext()))}));
  fwd.setFunctionType(b.getFunctionType(fwd.getArgumentTypes(),
                                        ValueRange(newResults).getTypes()));
  fwd.setAllResultAttrs(fwdResultAttrs);
}

/// @sK_step: the optimizer update of every trained weight of this stage.
void StageDifferentiator::emitStep() {
  MLIRContext *ctx = module.getContext();
  b.setInsertionPointAfter(bwd);
  auto lrType = RankedTensorType::get({}, b.getF32Type());
  auto countType = RankedTensorType::get({}, b.getI64Type());
  bool needsCount = opt.states() > 0;
  SmallVector<Type> stepArgs{lrType};
  if (needsCount)
    stepArgs.push_back(countType);
  auto step = func::FuncOp::create(b, fwd.getLoc(), stageFuncName(stage, "step"),
                                   b.getFunctionType(stepArgs, {}));
  step->setAttr(pipe::attrs::kStage, b.getI64IntegerAttr(stage));
  step.setArgAttr(0, "pipe.lr", UnitAttr::get(ctx));
  if (needsCount)
    step.setArgAttr(1, "pipe.step_count", UnitAttr::get(ctx));
  Block *stepEntry = step.addEntryBlock();
  OpBuilder sb = OpBuilder::atBlockEnd(stepEntry);
  // A weight's update carries the location of the first forward op that
  // reads it, so that the profiler charges the update to that layer (its
  // `opt_s`).
  llvm::DenseMap<StringRef, Location> firstReader;
  fwd.walk([&](ml_program::GlobalLoadOp load) {
    if (!load->use_empty())
      firstReader.try_emplace(load.getGlobal().getLeafReference().getValue(),
                              (*load->getUsers().begin())->getLoc());
  });
  for (auto &[name, g] : weightGrads) {
    auto weight = weightGlobals.lookup(name);
    if (!weight || !weight.getIsMutable())
      continue;
    auto reader = firstReader.find(weight.getSymName());
    emitUpdate(sb, weight,
               reader != firstReader.end() ? reader->second : weight.getLoc(),
               stepEntry->getArgument(0),
               needsCount ? stepEntry->getArgument(1) : Value());
  }
  func::ReturnOp::create(sb, fwd.getLoc());
}

namespace {

/// Per stage: whether it, or a stage it receives from (transitively),
/// reads a trainable weight (a mutable global). Only such stages receive
/// gradients: a first stage that only flattens its input gets none.
SmallVector<bool> stagesNeedingGradients(ModuleOp module,
                                         ArrayRef<func::FuncOp> stages) {
  SmallVector<bool> needs(stages.size(), false);
  for (auto [s, constFn] : llvm::enumerate(stages)) {
    func::FuncOp fn = constFn;
    // Trained weights: mutable float globals the forward reads and never
    // writes (BatchNorm's running statistics are written, not trained).
    llvm::DenseSet<StringRef> stored;
    fn.walk([&](ml_program::GlobalStoreOp store) {
      stored.insert(store.getGlobal().getLeafReference().getValue());
    });
    fn.walk([&](ml_program::GlobalLoadOp load) {
      auto global = module.lookupSymbol<ml_program::GlobalOp>(load.getGlobal());
      if (global && global.getIsMutable() && isFloatTensor(load.getType()) &&
          !stored.contains(load.getGlobal().getLeafReference().getValue()))
        needs[s] = true;
    });
    for (unsigned a = 0; a < fn.getNumArguments(); ++a)
      if (auto from = fn.getArgAttrOfType<DenseI64ArrayAttr>(a, "pipe.from"))
        if (from[0] >= 0 && size_t(from[0]) < s && needs[size_t(from[0])])
          needs[s] = true;
  }
  return needs;
}

struct NNAutodiffPass
    : public pipec::impl::NNAutodiffPassBase<NNAutodiffPass> {
  using Base::Base;

  /// Appends the loss to the last stage.
  LogicalResult addLoss(func::FuncOp last) {
    OpBuilder b(last.getContext());
    auto ret = cast<func::ReturnOp>(last.getBody().front().getTerminator());
    int outputPos = -1;
    for (unsigned r = 0; r < ret.getNumOperands(); ++r)
      if (auto idx = last.getResultAttrOfType<IntegerAttr>(r, "pipe.output"))
        if (idx.getInt() == 0)
          outputPos = r;
    if (outputPos < 0)
      return last.emitError("the last stage does not compute model output 0");
    Value out = ret.getOperand(outputPos);
    auto outType = dyn_cast<RankedTensorType>(out.getType());
    if (!outType || !outType.hasStaticShape() ||
        !isa<FloatType>(outType.getElementType()))
      return last.emitError("model output 0 must be a float tensor of static "
                            "shape to take a loss, got ")
             << out.getType();
    Value lossValue;
    int64_t lossLayers = 0; // the layers (ops) appended here
    b.setInsertionPoint(ret);
    Location loc = NameLoc::get(b.getStringAttr("loss"), out.getLoc());
    if (loss == "cross-entropy") {
      RankedTensorType scores = outType;
      if (scores.getRank() < 2)
        return last.emitError("cross-entropy needs scores [N, C, ...]; model "
                              "output 0 is ")
               << scores;
      SmallVector<int64_t> labelShape{scores.getDimSize(0)};
      llvm::append_range(labelShape, scores.getShape().drop_front(2));
      auto labelType = RankedTensorType::get(labelShape, b.getI64Type());
      // Outputs that flatten batch and sequence ([B*T, V]) take labels per
      // sample ([B, T]): the feed stays batch-major and is reshaped here.
      auto feedType = labelType;
      auto micro = getOperation()->getAttrOfType<IntegerAttr>("pipec.microbatch");
      int64_t b0 = micro ? micro.getInt() : scores.getDimSize(0);
      if (scores.getDimSize(0) != b0) {
        if (b0 <= 0 || scores.getDimSize(0) % b0)
          return last.emitError("model output 0 has leading dimension ")
                 << scores.getDimSize(0)
                 << ", not a multiple of the batch " << b0
                 << ": labels cannot be split into microbatches";
        SmallVector<int64_t> perSample{b0, scores.getDimSize(0) / b0};
        llvm::append_range(perSample, scores.getShape().drop_front(2));
        feedType = RankedTensorType::get(perSample, b.getI64Type());
      }
      unsigned idx = last.getNumArguments();
      if (failed(last.insertArgument(idx, feedType,
                                     b.getDictionaryAttr({b.getNamedAttr(
                                         pipe::attrs::kFeed,
                                         b.getI64IntegerAttr(-1))}),
                                     loc)))
        return failure();
      Value labels = last.getArgument(idx);
      if (feedType != labelType)
        labels = nn::ReshapeOp::create(b, loc, labelType, labels);
      lossValue = nn::SoftmaxCrossEntropyLossOp::create(
                      b, loc, RankedTensorType::get({}, b.getF32Type()), Type(),
                      out, labels, Value(), b.getStringAttr("mean"),
                      IntegerAttr())
                      .getLoss();
      lossLayers = feedType != labelType ? 2 : 1;
    } else if (loss == "model") {
      if (outType.getRank() != 0)
        return last.emitError("loss=model needs a scalar model output 0, got ")
               << outType;
      lossValue = out;
    } else {
      return last.emitError("unknown loss '")
             << loss << "' (cross-entropy or model)";
    }
    // The loss replaces the model outputs of the last stage.
    ret->setOperands(lossValue);
    last.setFunctionType(
        b.getFunctionType(last.getArgumentTypes(), {lossValue.getType()}));
    SmallVector<DictionaryAttr> lossAttrs{b.getDictionaryAttr(
        {b.getNamedAttr(pipe::attrs::kLoss, UnitAttr::get(&getContext()))})};
    last.setAllResultAttrs(lossAttrs);
    getOperation()->setAttr(pipe::attrs::kLossLayers,
                            b.getI64IntegerAttr(lossLayers));
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    OptimizerConfig opt;
    opt.name = optimizer;
    opt.momentum = momentum;
    opt.beta1 = beta1;
    opt.beta2 = beta2;
    opt.epsilon = epsilon;
    opt.weightDecay = weightDecay;
    if (!llvm::is_contained(
            ArrayRef<StringRef>{"sgd", "momentum", "nesterov", "adam", "adagrad"},
            StringRef(opt.name))) {
      module.emitError("unknown optimizer '")
          << optimizer << "' (sgd, momentum, nesterov, adam, adagrad)";
      return signalPassFailure();
    }
    SmallVector<func::FuncOp> stages = getStageFuncs(module, "fwd");
    if (stages.empty()) {
      module.emitError("no stage functions @s0_fwd...; run "
                       "--pipe-split-stages first");
      return signalPassFailure();
    }
    if (failed(requireBodies(stages)))
      return signalPassFailure();
    for (func::FuncOp fn : module.getOps<func::FuncOp>()) {
      StringRef name = fn.getSymName();
      int64_t k = 0;
      if (name.consume_front("s") && name.consume_back("_fwd") &&
          !name.getAsInteger(10, k) && k >= int64_t(stages.size())) {
        fn.emitError("stage functions are numbered with a gap: @")
            << stageFuncName(int64_t(stages.size()), "fwd") << " is missing";
        return signalPassFailure();
      }
    }
    if (!getStageFuncs(module, "bwd").empty()) {
      module.emitError("the module is already differentiated");
      return signalPassFailure();
    }
    if (failed(addLoss(stages.back())))
      return signalPassFailure();
    SmallVector<bool> needsGrad = stagesNeedingGradients(module, stages);
    for (auto [s, fwd] : llvm::enumerate(stages)) {
      StageDifferentiator diff(module, fwd, stages, s, opt, needsGrad);
      if (failed(diff.run()))
        return signalPassFailure();
    }
  }
};

} // namespace
