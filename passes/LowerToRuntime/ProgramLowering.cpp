//===- ProgramLowering.cpp - The program as service calls -----------------===//
//
// Part of --pipe-lower-to-runtime (LowerToRuntime/StageLowering.h).
//
//===----------------------------------------------------------------------===//

#include "passes/LowerToRuntime/StageLowering.h"
#include "pipec/Schedule.h"

#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace pipec;
using namespace pipec::lowering;

static std::pair<Value, StringRef> microbatchAndCallee(Operation *op) {
  return llvm::TypeSwitch<Operation *, std::pair<Value, StringRef>>(op)
      .Case<pipe::SendOp, pipe::RecvOp, pipe::ForwardOp, pipe::BackwardOp,
            pipe::BackwardWeightOp, pipe::StepOp>([](auto o) {
        return std::make_pair(Value(o.getMicrobatch()), o.getFunc());
      })
      .Case<pipe::AllReduceOp>([](pipe::AllReduceOp o) {
        return std::make_pair(Value(o.getMicrobatch()), StringRef());
      })
      .Default(
          [](Operation *) { return std::make_pair(Value(), StringRef()); });
}

/// Where one pipe op of the program is lowered: a builder before it, the
/// rank's context and arena, the op's microbatch (`rel` as the program
/// states it, `mb` the index of stash slots, tags and weight versions,
/// `slot` its stash slot) and the chunk and function it names.
struct StageLowering::Site {
  OpBuilder pb;
  Location loc;
  Value ctx, arena;
  Value rel, mb, slot;
  Chunk *chunk = nullptr;
  FunctionPlan *plan = nullptr;

  void call(StringRef callee, ValueRange args) {
    func::CallOp::create(pb, loc, callee, TypeRange{}, args);
  }
};

/// The rank's program as pipec_program(ctx, arena): synchronous schedules
/// post every receive of the step first, then every pipe op of the
/// program becomes runtime calls.
LogicalResult StageLowering::emitProgram() {
  MLIRContext *ctx = module.getContext();
  Type ptr = ptrType(ctx);
  OpBuilder fb = OpBuilder::atBlockEnd(module.getBody());
  auto fn = func::FuncOp::create(fb, program.getLoc(), "pipec_program",
                                 fb.getFunctionType({ptr, ptr}, {}));
  Block *entry = fn.addEntryBlock();
  Value ctxArg = entry->getArgument(0), arena = entry->getArgument(1);
  OpBuilder ob = OpBuilder::atBlockEnd(entry);
  if (!continuous)
    postReceives(ob, entry, ctxArg);
  IRMapping map;
  for (Operation &op : program.getBody().front())
    ob.clone(op, map);
  func::ReturnOp::create(ob, program.getLoc());

  SmallVector<Operation *> pipeOps;
  fn.walk([&](Operation *op) {
    if (isa<pipe::PipeDialect>(op->getDialect()))
      pipeOps.push_back(op);
  });
  for (Operation *op : pipeOps) {
    Site s{OpBuilder(op), op->getLoc(), ctxArg, arena};
    if (failed(prepareSite(op, s)) || failed(lowerPipeOp(op, s)))
      return failure();
    op->erase();
  }
  return success();
}

/// Synchronous schedules: first post every receive of the step
/// (pipec_rt_recv_post: MPI_Irecv into a staging buffer), so that messages
/// arrive while this rank computes; the program's receives then wait for
/// them and copy them into place. The posting pass is the program with
/// everything but its receives removed (loops and index arithmetic stay).
void StageLowering::postReceives(OpBuilder &ob, Block *entry, Value ctxArg) {
  IRMapping postMap;
  for (Operation &op : program.getBody().front())
    ob.clone(op, postMap);
  SmallVector<Operation *> postOps;
  for (Operation &op : *entry)
    op.walk([&](Operation *inner) {
      if (isa<pipe::PipeDialect>(inner->getDialect()))
        postOps.push_back(inner);
    });
  for (Operation *op : postOps) {
    if (auto recv = dyn_cast<pipe::RecvOp>(op)) {
      OpBuilder pb(op);
      Location loc = op->getLoc();
      Value mb = arith::IndexCastOp::create(pb, loc, pb.getI64Type(),
                                            recv.getMicrobatch());
      func::CallOp::create(
          pb, loc, "pipec_rt_recv_post", TypeRange{},
          ValueRange{ctxArg, i64(pb, loc, recv.getPeer()),
                     i64(pb, loc, recv.getChannel()), mb,
                     i64(pb, loc, nn::tensorBytes(recv.getType()))});
    }
    op->erase();
  }
}

/// The op's microbatch values and the chunk and function it names.
/// Synchronous schedules: `rel` and `mb` are both the index in [0, m).
/// Continuous schedules: `mb` is the global index from pipec_rt_global_mb,
/// and the op runs only when it is >= 0 (inside the run).
LogicalResult StageLowering::prepareSite(Operation *op, Site &s) {
  OpBuilder &pb = s.pb;
  Location loc = s.loc;
  auto [microbatch, callee] = microbatchAndCallee(op);
  if (microbatch) {
    s.rel = arith::IndexCastOp::create(pb, loc, pb.getI64Type(), microbatch);
    s.mb = s.rel;
    if (continuous) {
      s.mb = func::CallOp::create(pb, loc, "pipec_rt_global_mb",
                                  TypeRange{pb.getI64Type()},
                                  ValueRange{s.ctx, s.rel})
                 .getResult(0);
      Value inside = arith::CmpIOp::create(pb, loc, arith::CmpIPredicate::sge,
                                           s.mb, i64(pb, loc, 0));
      auto guard = scf::IfOp::create(pb, loc, inside, /*withElse=*/false);
      pb.setInsertionPoint(guard.thenBlock()->getTerminator());
    }
    // Replica j of r owns microbatches j, j + r, ...: its local index
    // mb / r picks the slot.
    // (Split replicas run every microbatch: slot mb mod slots.)
    Value local =
        replicas > 1 && !pipeline.getSplitSamples()
            ? arith::DivUIOp::create(pb, loc, s.mb, i64(pb, loc, replicas))
                  .getResult()
            : s.mb;
    s.slot = arith::RemUIOp::create(pb, loc, local, i64(pb, loc, slots));
  } else if (continuous && !isa<pipe::FlushOp>(op)) {
    return op->emitError("a continuous schedule's ops need a microbatch");
  }
  // The chunk whose stage function `callee` is, and its plan.
  for (auto &c : chunks)
    for (FunctionPlan *fp : c->plans())
      if (!s.chunk && fp->fn.getSymName() == callee) {
        s.chunk = c.get();
        s.plan = fp;
      }
  if (!callee.empty() && !s.chunk)
    return op->emitError("references a function of no stage of this rank");
  // Each compute op runs its own half of the stage (the op kind decides
  // what is emitted; the named function must agree).
  auto [own, ownKind] =
      isa<pipe::ForwardOp>(op)    ? std::pair{&s.chunk->fwd, "fwd"}
      : isa<pipe::BackwardOp>(op) ? std::pair{&s.chunk->bwd, "bwd"}
      : isa<pipe::BackwardWeightOp>(op)
          ? std::pair{&s.chunk->bwdw, "bwdw"}
          : std::pair{(FunctionPlan *)nullptr, ""};
  if (own && own != s.plan)
    return op->emitError("names @")
           << callee << ", but this op runs the stage's @"
           << stageFuncName(s.chunk->stage, ownKind);
  return success();
}

/// One call of the stage function `fn`: on CUDA through the runtime, which
/// may replay it as a CUDA graph (pipec_rt_run, --cuda-graphs).
void StageLowering::callStage(Site &s, func::FuncOp fn, Value slot,
                              Value weights) {
  if (!cuda())
    return s.call(fn.getSymName(), {s.ctx, s.arena, slot, weights});
  Value f = func::ConstantOp::create(s.pb, s.loc, fn.getFunctionType(),
                                     fn.getSymName());
  s.call("pipec_rt_run", {s.ctx, f, s.arena, slot, weights});
}

/// One lowered stage function inside a profiler span of `phase` (0
/// forward, 1 backward, 2 update).
void StageLowering::emitRun(Site &s, int64_t phase, func::FuncOp fn,
                            Value weights) {
  s.call("pipec_rt_span_begin", {s.ctx, i64(s.pb, s.loc, phase), s.mb});
  callStage(s, fn, s.slot, weights);
  s.call("pipec_rt_span_end", {s.ctx, i64(s.pb, s.loc, phase)});
}

LogicalResult StageLowering::lowerPipeOp(Operation *op, Site &s) {
  OpBuilder &pb = s.pb;
  Location loc = s.loc;
  Value ctxArg = s.ctx, arena = s.arena, slot = s.slot, mb = s.mb;
  // The weights a phase reads: the live arena, or (continuous schedules)
  // the version the runtime's store gives this microbatch.
  auto weightsFor = [&](int64_t phase) -> Value {
    if (!continuous)
      return arena;
    return func::CallOp::create(
               pb, loc, "pipec_rt_weights",
               TypeRange{ptrType(module.getContext())},
               ValueRange{ctxArg, mb, i64(pb, loc, phase), arena})
        .getResult(0);
  };
  if (auto send = dyn_cast<pipe::SendOp>(op)) {
    Value p = pointer(pb, loc, *s.chunk, s.plan->results[send.getIndex()],
                      arena, slot);
    s.call("pipec_rt_send", {ctxArg, i64(pb, loc, send.getPeer()),
                             i64(pb, loc, send.getChannel()), mb, p,
                             i64(pb, loc, nn::tensorBytes(send.getType()))});
  } else if (auto recv = dyn_cast<pipe::RecvOp>(op)) {
    Value p =
        pointer(pb, loc, *s.chunk, s.plan->args[recv.getIndex()], arena, slot);
    s.call("pipec_rt_recv", {ctxArg, i64(pb, loc, recv.getPeer()),
                             i64(pb, loc, recv.getChannel()), mb, p,
                             i64(pb, loc, nn::tensorBytes(recv.getType()))});
  } else if (isa<pipe::ForwardOp>(op)) {
    Chunk &c = *s.chunk;
    for (auto [arg, feed] : c.feedArgs)
      s.call("pipec_rt_feed",
             {ctxArg, i64(pb, loc, feed), s.rel,
              pointer(pb, loc, c, c.fwd.args[arg], arena, slot)});
    for (int64_t arg : c.rngArgs)
      s.call(
          "pipec_rt_rng",
          {ctxArg, s.rel, pointer(pb, loc, c, c.fwd.args[arg], arena, slot)});
    emitRun(s, 0, c.lowered[0], weightsFor(0));
    if (c.lossResult >= 0)
      s.call("pipec_rt_loss",
             {ctxArg, s.rel,
              pointer(pb, loc, c, c.fwd.results[c.lossResult], arena, slot)});
  } else if (isa<pipe::BackwardOp>(op)) {
    Chunk &c = *s.chunk;
    if (c.lossSeedArg >= 0)
      s.call("pipec_rt_loss_seed",
             {ctxArg,
              pointer(pb, loc, c, c.bwd.args[c.lossSeedArg], arena, slot)});
    emitRun(s, 1, c.lowered[1], weightsFor(1));
    if (continuous)
      s.call("pipec_rt_release", {ctxArg, mb});
  } else if (isa<pipe::BackwardWeightOp>(op)) {
    emitRun(s, 1, s.chunk->lowered[3], arena);
  } else if (isa<pipe::FlushOp>(op)) {
    s.call("pipec_rt_flush", {ctxArg});
  } else if (auto reduce = dyn_cast<pipe::AllReduceOp>(op)) {
    emitGradientReduce(reduce, s);
  } else if (auto tie = dyn_cast<pipe::TieReduceOp>(op)) {
    return emitTieReduce(tie, s);
  } else if (isa<pipe::StepOp>(op)) {
    emitStep(s);
  } else {
    return op->emitError("cannot lower this op");
  }
  return success();
}

/// The gradient accumulators, summed (or averaged: 1F1B-RR) over the
/// stage's replicas; tied weights are summed by pipe.tie_reduce over every
/// rank of their stages instead.
void StageLowering::emitGradientReduce(pipe::AllReduceOp reduce, Site &s) {
  StringRef fn =
      reduce.getMean() ? "pipec_rt_allreduce_mean" : "pipec_rt_allreduce";
  Value zero = i64(s.pb, s.loc, 0);
  for (auto &c : chunks)
    for (const std::string &name : c->weightOrder) {
      auto global = module.lookupSymbol<ml_program::GlobalOp>(name);
      if (!global || !global->hasAttr(pipe::attrs::kGradOf))
        continue;
      auto of = global->getAttrOfType<FlatSymbolRefAttr>(pipe::attrs::kGradOf);
      if (of && tiedWeights.count(of.getValue().str()))
        continue;
      auto &[offset, type] = c->weights[name];
      Buffer buf{Buffer::Weights, offset, ""};
      s.call(fn,
             {s.ctx, pointer(s.pb, s.loc, *c, buf, s.arena, zero),
              i64(s.pb, s.loc, cast<RankedTensorType>(type).getNumElements())});
    }
}

/// The tied weights' gradient accumulators, summed over every rank of the
/// group's stages (communicator `group`, in the canonical order).
LogicalResult StageLowering::emitTieReduce(pipe::TieReduceOp tie, Site &s) {
  std::vector<int64_t> stages(tie.getStages().begin(), tie.getStages().end());
  auto it = std::find(tieGroups.begin(), tieGroups.end(), stages);
  if (it == tieGroups.end())
    return tie.emitError("internal error: a pipe.tie_reduce group the "
                         "pipeline does not list");
  Value group = i64(s.pb, s.loc, int64_t(it - tieGroups.begin()));
  Value zero = i64(s.pb, s.loc, 0);
  std::set<std::string> names;
  for (Attribute w : tie.getWeights())
    names.insert(cast<FlatSymbolRefAttr>(w).getValue().str());
  for (auto &c : chunks)
    for (const std::string &name : c->weightOrder) {
      auto global = module.lookupSymbol<ml_program::GlobalOp>(name);
      auto of =
          global
              ? global->getAttrOfType<FlatSymbolRefAttr>(pipe::attrs::kGradOf)
              : FlatSymbolRefAttr();
      if (!of || !names.count(of.getValue().str()))
        continue;
      auto &[offset, type] = c->weights[name];
      Buffer buf{Buffer::Weights, offset, ""};
      s.call("pipec_rt_allreduce_group",
             {s.ctx, group, pointer(s.pb, s.loc, *c, buf, s.arena, zero),
              i64(s.pb, s.loc, cast<RankedTensorType>(type).getNumElements())});
    }
  return success();
}

/// The update of one chunk: learning rate and step count, then @sK_step.
void StageLowering::emitStep(Site &s) {
  Chunk &c = *s.chunk;
  OpBuilder &pb = s.pb;
  Value zero = i64(pb, s.loc, 0);
  s.call("pipec_rt_span_begin",
         {s.ctx, i64(pb, s.loc, 2), s.mb ? s.mb : i64(pb, s.loc, -1)});
  // One update of the rank (its first chunk's step counts it; the
  // other chunks' steps read the same update number).
  if (&c == chunks.front().get())
    s.call("pipec_rt_update", {s.ctx});
  for (auto [i, buf] : llvm::enumerate(c.step.args))
    s.call(c.step.fn.getArgAttr(i, "pipe.step_count") ? "pipec_rt_step"
                                                      : "pipec_rt_lr",
           {s.ctx, pointer(pb, s.loc, c, buf, s.arena, zero)});
  callStage(s, c.lowered[2], zero, s.arena);
  s.call("pipec_rt_span_end", {s.ctx, i64(pb, s.loc, 2)});
}

/// The stage description's policy (pipec/formats/StagePolicy.h): what the
/// runtime does, stated explicitly instead of derived from the schedule's
/// name.
