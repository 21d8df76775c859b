//===- LowerToRuntime.cpp - --pipe-lower-to-runtime -----------------------===//
//
// Lowers one pipeline stage to code that calls the runtime C ABI.
//
// Arena layout (one static, zero-initialised allocation per stage process):
//
//   [ weights and gradient accumulators | stash slots | io | scratch ]
//
//   - weights: every ml_program global the stage touches; the parameters
//     the forward reads (and does not write) come first, [0, versioned):
//     stage functions address them through a separate base pointer so
//     that a backward can read a stashed weight version (PipeDream, 2BW)
//     while the optimizer updates the live copy in the arena;
//   - stash slots: `slots` copies of the forward arguments and results
//     (boundary inputs, model inputs, saved activations) - microbatch k
//     uses slot k mod slots, so a 1F1B stage holds only its in-flight
//     microbatches;
//   - io: backward inputs that arrive from the next stage or the loss seed,
//     backward results sent to the previous stage, the learning rate;
//   - scratch: intermediates of whichever stage function runs (functions
//     never overlap, so they share it); within a function two
//     intermediates share bytes when their lifetimes (first to last kernel
//     step naming them) are disjoint.
//
// Every nn op becomes a call `pipec_k_*(bufs, ints, reals)` (KernelCalls.h)
// bracketed by profiler hooks; view ops (reshape/flatten/identity) alias
// their operand; a value stored into a global by an elementwise op is
// computed in place. The pipe.program becomes `pipec_program(ctx, arena)`
// calling pipec_rt_{feed,recv,send,loss,loss_seed,lr,flush} and the stage
// functions; `main` hands it with the stage description (JSON) to
// pipec_rt_main.
//
//===----------------------------------------------------------------------===//
#include "passes/LowerToRuntime/StageLowering.h"
#include "passes/Passes.h"

namespace pipec {
#define GEN_PASS_DEF_PIPELOWERTORUNTIMEPASS
#include "passes/Passes.h.inc"
} // namespace pipec

using namespace mlir;
using namespace pipec;
using namespace pipec::lowering;

FailureOr<ArenaPlan> StageLowering::planArena() {
  if (failed(collect()))
    return failure();
  std::vector<ArenaRegions> regions;
  for (const auto &c : chunks)
    regions.push_back(c->regions);
  return arenaPlanOf(regions);
}

FailureOr<ArenaPlan> pipec::planStageArena(ModuleOp module, int64_t stage,
                                           int64_t replica) {
  OwningOpRef<ModuleOp> copy = module.clone();
  StageLowering lowering(*copy, stage, replica, "plan");
  return lowering.planArena();
}

LogicalResult pipec::checkStageTarget(ModuleOp module, int64_t stage,
                                      const std::string &target) {
  OwningOpRef<ModuleOp> copy = module.clone();
  StageLowering lowering(*copy, stage, 0, "check", target);
  return lowering.checkTargetOnly();
}

int64_t StageLowering::arenaBytes() const {
  int64_t total = 0;
  for (const auto &c : chunks)
    total += c->regions.total();
  return total;
}

LogicalResult StageLowering::run() {
  if (failed(collect()) || failed(checkTarget()))
    return failure();
  emitDeclarations();
  for (auto &c : chunks) {
    c->lowered[0] = emitStageFunction(*c, c->fwd);
    c->lowered[1] = emitStageFunction(*c, c->bwd);
    c->lowered[2] = emitStageFunction(*c, c->step);
    if (c->bwdw.fn)
      c->lowered[3] = emitStageFunction(*c, c->bwdw);
  }
  if (failed(emitProgram()))
    return failure();
  emitMain();
  // Drop everything that is not the lowered stage.
  SmallVector<Operation *> dead;
  for (Operation &op : *module.getBody()) {
    if (isa<pipe::PipelineOp, ml_program::GlobalOp>(op))
      dead.push_back(&op);
    else if (auto fn = dyn_cast<func::FuncOp>(op); fn && fn->hasAttr(pipe::attrs::kStage))
      dead.push_back(&op);
  }
  for (Operation *op : dead)
    op->erase();
  for (StringRef attr : {"pipe.plan", "pipec.inputs", "pipec.opset"})
    module->removeAttr(attr);
  module->setAttr("pipec.stage", b.getI64IntegerAttr(stage));
  module->setAttr("pipec.arena_bytes", b.getI64IntegerAttr(arenaBytes()));
  return success();
}

namespace {
struct PipeLowerToRuntimePass
    : public pipec::impl::PipeLowerToRuntimePassBase<PipeLowerToRuntimePass> {
  using Base::Base;
  void runOnOperation() override {
    if (target != "cpu" && target != "cuda") {
      getOperation().emitError("unknown target '")
          << target << "' (expected cpu or cuda)";
      return signalPassFailure();
    }
    StageLowering lowering(getOperation(), stage, replica, buildId, target);
    if (failed(lowering.run()))
      signalPassFailure();
  }
};
} // namespace
