//===- StoreActivationsBf16.cpp - activations stored in bfloat16 ----------===//
//
// Part of pipec. `--nn-convert-precision=precision=bf16 activations=bf16`
// (pipec compile --precision bf16 --activations bf16).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// The numerics of bf16 storage, written into the IR so that every target
/// runs them and the CPU target defines them:
///
///   - every float tensor an op of a forward or backward stage function
///     produces is stored in bfloat16: the op computes in float32 (on
///     operands widened from bfloat16, exactly) and its result is rounded
///     once, to nearest even, by an `nn.cast` to bf16 right after it;
///   - except what stays float32: weights and what is computed from them
///     alone (global loads, their views and transposes), constants, the
///     loss and other scalars, normalisation statistics and dropout masks
///     (isUndifferentiatedResult, DropoutOp's mask), and the weight
///     gradients' partial sums (feedingGlobals: values read only by sums
///     and moves that end in a global, the `.grad` accumulation or the
///     running statistics, also across a zero-bubble split);
///   - feeds (the model's inputs and labels) stay as the runtime writes
///     them;
///   - the stage functions' boundaries follow their values: a message, a
///     stashed activation or a value carried to the weight half is bf16
///     when its value is, and the gradient of a value has the value's
///     type, so that messages, stash slots and the arena plan size them at
///     2 bytes with no special case.
///
/// A view (reshape, flatten, identity) of a bf16 value is a bf16 value (it
/// moves bytes).
/// Each other op that reads a bf16 value gets an `nn.cast` to f32 in front
/// of it: the reference form (activations=bf16-casts), float32 kernels
/// between casts.
/// With activations=bf16, the ops whose kernels have bf16 variants
/// (NN_Bf16Storage ops whose every kernel is PIPEC_KERNEL_BF16) then read
/// and write bf16 themselves: their casts are folded into them
/// (storeInKernels), which computes the same numbers without the casts'
/// passes over memory and float32 tensors (runtime/README.md, "bf16
/// storage").
///
/// Runs after the schedule is built, forward functions in stage order (a
/// stage's messages come from earlier stages), then backward functions,
/// then the weight halves of zero-bubble backwards; the pipeline's
/// pipe.send / pipe.recv types then follow the functions' signatures.
///
//===----------------------------------------------------------------------===//
#include "passes/KernelCalls.h"
#include "passes/PassUtils.h"
#include "passes/Passes.h"

#include "dialects/pipe/PipeDialect.h"
#include "mlir/Dialect/MLProgram/IR/MLProgram.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallPtrSet.h"

using namespace mlir;
using namespace pipec;

namespace {

/// A float32 tensor of rank 1 or more: what may be stored in bfloat16.
bool isActivationType(Type t) {
  auto r = dyn_cast<RankedTensorType>(t);
  return r && r.getRank() > 0 && r.getElementType().isF32();
}

RankedTensorType withElement(Type t, Type element) {
  return cast<RankedTensorType>(t).clone(element);
}

bool isGlobalStore(Operation *op) { return isa<ml_program::GlobalStoreOp>(op); }

class Bf16Storage {
public:
  Bf16Storage(ModuleOp module, bool kernelsStore)
      : module(module), kernelsStore(kernelsStore), b(module.getContext()),
        bf16(BFloat16Type::get(module.getContext())),
        f32(Float32Type::get(module.getContext())) {}

  LogicalResult run() {
    for (StringRef kind : {"fwd", "bwd", "bwdw"})
      for (func::FuncOp fn : getStageFuncs(module, kind))
        if (failed(convert(fn)))
          return failure();
    retypeMessages();
    return success();
  }

private:
  ModuleOp module;
  /// Ops whose kernels have bf16 variants read and write bf16 themselves
  /// (storeInKernels); else every op is between casts.
  bool kernelsStore;
  OpBuilder b;
  Type bf16, f32;
  /// The casts this pass inserted (they are not rewritten again).
  llvm::SmallPtrSet<Operation *, 16> inserted;

  func::FuncOp stageFunc(int64_t stage, StringRef kind) {
    return module.lookupSymbol<func::FuncOp>(stageFuncName(stage, kind));
  }

  /// The values of `fn` that feed only globals: written to a global, or
  /// read only by sums and moves (add, scale, sum_to_shape, transpose,
  /// views) whose results all feed only globals, or carried to the weight
  /// half of a zero-bubble backward where they do. These are a weight
  /// gradient's partial sums however they are summed and moved before the
  /// accumulation (and running statistics): they stay float32. The walk
  /// stops at every other op: the activation gradient a weight gradient's
  /// product reads is an activation (were it followed through, a first
  /// stage's whole backward, which returns no input gradient, would stay
  /// float32 and the pipeline would part from one stage).
  llvm::DenseSet<Value> feedingGlobals(func::FuncOp fn) {
    llvm::DenseSet<Value> set;
    auto feeds = [&](Value v) {
      return !v.use_empty() && llvm::all_of(v.getUses(), [&](OpOperand &use) {
        Operation *user = use.getOwner();
        if (isGlobalStore(user))
          return true;
        if (isa<func::ReturnOp>(user))
          return carriedToGlobals(fn, use.getOperandNumber());
        return isa<nn::AddOp, nn::ScaleOp, nn::SumToShapeOp, nn::TransposeOp,
                   nn::ReshapeOp, nn::FlattenOp, nn::IdentityOp>(user) &&
               llvm::all_of(user->getResults(),
                            [&](Value r) { return set.contains(r); });
      });
    };
    // Users come after their operands: one walk from the end.
    Block &body = fn.getBody().front();
    for (Operation &op : llvm::reverse(body))
      for (Value r : op.getResults())
        if (feeds(r))
          set.insert(r);
    for (BlockArgument a : body.getArguments())
      if (feeds(a))
        set.insert(a);
    return set;
  }

  /// Whether result `index` of `fn` is carried (pipe.carry = k) to a
  /// weight-half argument that feeds only globals.
  bool carriedToGlobals(func::FuncOp fn, unsigned index) {
    auto carry = fn.getResultAttrOfType<IntegerAttr>(index, "pipe.carry");
    auto stage = fn->getAttrOfType<IntegerAttr>("pipe.stage");
    if (!carry || !stage)
      return false;
    func::FuncOp bwdw = stageFunc(stage.getInt(), "bwdw");
    if (!bwdw || bwdw == fn || bwdw.isExternal())
      return false;
    for (unsigned i = 0; i < bwdw.getNumArguments(); ++i)
      if (auto c = bwdw.getArgAttrOfType<IntegerAttr>(i, "pipe.carried"))
        if (c.getInt() == carry.getInt())
          return feedingGlobals(bwdw).contains(bwdw.getArgument(i));
    return false;
  }

  /// The results of `fn` computed from weights and constants alone (global
  /// loads, their views and transposes): weights, which stay float32.
  static llvm::DenseSet<Value> weightDerived(func::FuncOp fn) {
    llvm::DenseSet<Value> set;
    fn.walk([&](Operation *op) {
      bool derived =
          isa<ml_program::GlobalLoadOp, nn::ConstantOp, nn::FillOp>(op) ||
          (op->getNumOperands() > 0 &&
           llvm::all_of(op->getOperands(),
                        [&](Value v) { return set.contains(v); }));
      if (derived)
        set.insert(op->result_begin(), op->result_end());
    });
    return set;
  }

  /// The op results of `fn` stored in bfloat16: float tensors that are not
  /// weights, statistics, dropout masks or values feeding only globals.
  llvm::DenseSet<Value> storedInBf16(func::FuncOp fn) {
    llvm::DenseSet<Value> globals = feedingGlobals(fn),
                          weights = weightDerived(fn), stored;
    fn.walk([&](Operation *op) {
      for (OpResult r : op->getResults()) {
        if (!isActivationType(r.getType()) || globals.contains(r) ||
            weights.contains(r) || isUndifferentiatedResult(r) ||
            (isa<nn::DropoutOp>(op) && r.getResultNumber() == 1))
          continue;
        stored.insert(r);
      }
    });
    return stored;
  }

  /// The type argument `i` of `fn` takes: that of the value it stands for
  /// (a converted function's result or argument), or its own.
  FailureOr<Type> argType(func::FuncOp fn, unsigned i) {
    Type own = fn.getArgument(i).getType();
    if (!isActivationType(own) || fn.getArgAttr(i, "pipe.feed"))
      return own;
    auto stageAttr = fn->getAttrOfType<IntegerAttr>("pipe.stage");
    auto from = fn.getArgAttrOfType<DenseI64ArrayAttr>(i, "pipe.from");
    auto gradFrom = fn.getArgAttrOfType<DenseI64ArrayAttr>(i, "pipe.grad_from");
    auto fwdArg = fn.getArgAttrOfType<IntegerAttr>(i, "pipe.fwd_arg");
    auto fwdResult = fn.getArgAttrOfType<IntegerAttr>(i, "pipe.fwd_result");
    auto carried = fn.getArgAttrOfType<IntegerAttr>(i, "pipe.carried");
    auto fail = [&](const Twine &what) -> FailureOr<Type> {
      return fn.emitError("bf16 activations: argument ")
             << i << " of @" << fn.getSymName() << ": " << what;
    };
    if (from && from.size() == 2) {
      func::FuncOp src = stageFunc(from[0], "fwd");
      if (!src || from[1] >= src.getNumResults())
        return fail("no forward result it comes from");
      return src.getResultTypes()[from[1]];
    }
    if (gradFrom && gradFrom.size() == 2) {
      func::FuncOp consumer = stageFunc(gradFrom[0], "fwd");
      if (!consumer || gradFrom[1] >= consumer.getNumArguments())
        return fail("no forward argument it is the gradient of");
      return consumer.getArgumentTypes()[gradFrom[1]];
    }
    if (!stageAttr)
      return own;
    func::FuncOp fwd = stageFunc(stageAttr.getInt(), "fwd");
    if (fwdArg || fwdResult) {
      int64_t k = fwdArg ? fwdArg.getInt() : fwdResult.getInt();
      unsigned n = !fwd     ? 0
                   : fwdArg ? fwd.getNumArguments()
                            : fwd.getNumResults();
      if (k < 0 || k >= n)
        return fail("no forward value it stashes");
      return fwdArg ? fwd.getArgumentTypes()[k] : fwd.getResultTypes()[k];
    }
    if (carried) {
      func::FuncOp bwd = stageFunc(stageAttr.getInt(), "bwd");
      for (unsigned r = 0; bwd && r < bwd.getNumResults(); ++r)
        if (auto c = bwd.getResultAttrOfType<IntegerAttr>(r, "pipe.carry"))
          if (c.getInt() == carried.getInt())
            return bwd.getResultTypes()[r];
      return fail("no input-gradient half's result carries it");
    }
    return own;
  }

  /// `v` cast to `element` right before `before`, at its location (the
  /// profile charges the cast to the reader's layer).
  Value castTo(Value v, Type element, Operation *before) {
    b.setInsertionPoint(before);
    auto c = nn::CastOp::create(b, before->getLoc(),
                                withElement(v.getType(), element), v);
    inserted.insert(c);
    return c.getResult();
  }

  /// Rounds `r` to bf16 by a cast right after its op; every reader then
  /// reads the cast.
  void roundAfter(Value r) {
    b.setInsertionPointAfter(r.getDefiningOp());
    auto c =
        nn::CastOp::create(b, r.getLoc(), withElement(r.getType(), bf16), r);
    inserted.insert(c);
    r.replaceAllUsesExcept(c.getResult(), c);
  }

  LogicalResult convert(func::FuncOp fn) {
    if (fn.isExternal())
      return success();
    Block &body = fn.getBody().front();
    // Arguments first (their sources are converted already).
    for (unsigned i = 0; i < fn.getNumArguments(); ++i) {
      FailureOr<Type> t = argType(fn, i);
      if (failed(t))
        return failure();
      body.getArgument(i).setType(*t);
    }
    // Results stored in bfloat16 (decided on the function as it is): a
    // cast right after the op; views below.
    llvm::DenseSet<Value> toStore = storedInBf16(fn);
    SmallVector<OpResult> stored;
    fn.walk([&](Operation *op) {
      for (OpResult r : op->getResults())
        if (!isViewOp(op) && toStore.contains(r))
          stored.push_back(r);
    });
    for (OpResult r : stored)
      roundAfter(r);
    // Every other reader of a bf16 value reads it widened.
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    SmallVector<Operation *> readers;
    fn.walk([&](Operation *op) {
      if (op != ret && !inserted.contains(op))
        readers.push_back(op);
    });
    for (Operation *op : readers) {
      // A view (reshape, flatten, identity) moves bytes: of a bf16 value,
      // it is one (no casts); of a float32 one, it is stored like any op's
      // result.
      if (isViewOp(op)) {
        Value in = op->getOperand(0), out = op->getResult(0);
        auto t = cast<RankedTensorType>(in.getType());
        if (t.getElementType().isBF16()) {
          out.setType(withElement(out.getType(), bf16));
          continue;
        }
        if (toStore.contains(out)) {
          roundAfter(out);
          continue;
        }
      }
      for (OpOperand &use : op->getOpOperands()) {
        auto t = dyn_cast<RankedTensorType>(use.get().getType());
        if (t && t.getElementType().isBF16())
          use.set(castTo(use.get(), f32, op));
      }
    }
    // Results: their values' types, but a gradient has the type of the
    // value it is the gradient of.
    func::FuncOp fwd;
    if (auto s = fn->getAttrOfType<IntegerAttr>("pipe.stage"))
      fwd = stageFunc(s.getInt(), "fwd");
    for (unsigned r = 0; r < ret.getNumOperands(); ++r) {
      Value v = ret.getOperand(r);
      auto of = fn.getResultAttrOfType<IntegerAttr>(r, "pipe.grad_of_arg");
      if (!of || !fwd || of.getInt() < 0 ||
          of.getInt() >= fwd.getNumArguments())
        continue;
      auto want = cast<RankedTensorType>(fwd.getArgumentTypes()[of.getInt()]);
      auto have = dyn_cast<RankedTensorType>(v.getType());
      if (have && have.getElementType() != want.getElementType())
        ret.setOperand(r, castTo(v, want.getElementType(), ret));
    }
    if (kernelsStore)
      storeInKernels(fn);
    fn.setType(FunctionType::get(fn.getContext(), body.getArgumentTypes(),
                                 ret.getOperandTypes()));
    // What recomputation took out of the stash would have been stored in
    // bf16 too (statistics, a few vectors, counted so as well): --report
    // compares it with the stash as it is.
    if (auto saved = fn->getAttrOfType<ArrayAttr>("pipe.recompute_saved")) {
      SmallVector<Attribute> types;
      for (auto t : saved.getAsRange<TypeAttr>())
        types.push_back(TypeAttr::get(isActivationType(t.getValue())
                                          ? withElement(t.getValue(), bf16)
                                          : t.getValue()));
      fn->setAttr("pipe.recompute_saved",
                  ArrayAttr::get(fn.getContext(), types));
    }
    return success();
  }

  /// Whether `op` may read and write bf16 itself: the dialect accepts bf16
  /// tensors on it (NN_Bf16Storage) and each of its kernels has a `_bf16`
  /// variant.
  static bool storesInKernels(Operation *op) {
    if (!op->hasTrait<nn::OpTrait::Bf16Storage>())
      return false;
    ScopedDiagnosticHandler quiet(op->getContext(),
                                  [](Diagnostic &) { return success(); });
    auto calls = getKernelCalls(op);
    return succeeded(calls) &&
           llvm::all_of(*calls, [](const KernelCall &call) {
             return hasBf16Variant(call.kernel);
           });
  }

  /// The casts around the ops that read and write bf16 themselves
  /// (storesInKernels) are folded into them: such an op reads a bf16
  /// operand instead of its widening cast, and its result is bf16 instead
  /// of being rounded by a cast, where the op's types then verify (a
  /// unary op's operand and result share one type, say). The numbers do not
  /// change (the kernel rounds as the cast did), only the casts' passes and
  /// their float32 tensors go.
  void storeInKernels(func::FuncOp fn) {
    SmallVector<Operation *> ops;
    fn.walk([&](Operation *op) {
      if (!inserted.contains(op) && storesInKernels(op))
        ops.push_back(op);
    });
    auto insertedCast = [&](Operation *op, bool toBf16) -> nn::CastOp {
      auto c = dyn_cast_or_null<nn::CastOp>(op);
      if (!c || !inserted.contains(c))
        return nullptr;
      bool narrows = cast<RankedTensorType>(c.getOutput().getType())
                         .getElementType()
                         .isBF16();
      return narrows == toBf16 ? c : nullptr;
    };
    for (Operation *op : ops) {
      SmallVector<std::pair<OpOperand *, Value>> widened;
      for (OpOperand &use : op->getOpOperands())
        if (nn::CastOp c = insertedCast(use.get().getDefiningOp(), false)) {
          widened.push_back({&use, use.get()});
          use.set(c.getInput());
        }
      SmallVector<std::pair<OpResult, nn::CastOp>> rounded;
      for (OpResult r : op->getResults())
        if (r.hasOneUse())
          if (nn::CastOp c = insertedCast(*r.getUsers().begin(), true)) {
            rounded.push_back({r, c});
            r.setType(c.getOutput().getType());
          }
      if (widened.empty() && rounded.empty())
        continue;
      ScopedDiagnosticHandler quiet(op->getContext(),
                                    [](Diagnostic &) { return success(); });
      if (failed(mlir::verify(op, /*verifyRecursively=*/false))) {
        for (auto [use, was] : widened)
          use->set(was);
        for (auto [r, c] : rounded)
          r.setType(c.getInput().getType());
        continue;
      }
      for (auto [r, c] : rounded) {
        c.getOutput().replaceAllUsesWith(r);
        inserted.erase(c);
        c->erase();
      }
    }
    // The widening casts no op reads any more.
    SmallVector<Operation *> dead;
    fn.walk([&](nn::CastOp c) {
      if (inserted.contains(c) && c->use_empty())
        dead.push_back(c);
    });
    for (Operation *c : dead) {
      inserted.erase(c);
      c->erase();
    }
  }

  /// pipe.send / pipe.recv carry the type of the result / argument they
  /// move.
  void retypeMessages() {
    module.walk([&](Operation *op) {
      if (auto send = dyn_cast<pipe::SendOp>(op)) {
        if (auto fn = module.lookupSymbol<func::FuncOp>(send.getFunc()))
          if (send.getIndex() < fn.getNumResults())
            send.setType(fn.getResultTypes()[send.getIndex()]);
      } else if (auto recv = dyn_cast<pipe::RecvOp>(op)) {
        if (auto fn = module.lookupSymbol<func::FuncOp>(recv.getFunc()))
          if (recv.getIndex() < fn.getNumArguments())
            recv.setType(fn.getArgumentTypes()[recv.getIndex()]);
      }
    });
  }
};

} // namespace

LogicalResult pipec::storeActivationsInBf16(ModuleOp module,
                                            bool kernelsStore) {
  return Bf16Storage(module, kernelsStore).run();
}
