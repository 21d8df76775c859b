//===- BuildSchedule.cpp - --pipe-build-schedule --------------------------===//
//
// Materialises a schedule from lib/Schedule as one pipe.program per rank:
//   F(mb): recv boundary args -> pipe.forward -> send boundary results
//   B(mb): recv output grads  -> pipe.backward -> send arg grads
// then pipe.flush and pipe.step. Loops of the generator become scf.for.
// Every boundary edge (producer stage j, result r) -> (consumer k, arg a)
// gets channel 2e for its activation and 2e+1 for its gradient.
//
//===----------------------------------------------------------------------===//
#include "passes/PassUtils.h"
#include "passes/Passes.h"
#include "pipec/Schedule.h"

namespace pipec {
#define GEN_PASS_DEF_PIPEBUILDSCHEDULEPASS
#include "passes/Passes.h.inc"
} // namespace pipec

using namespace mlir;
using namespace pipec;

namespace {

/// One boundary tensor from a producer result to a consumer argument.
struct Edge {
  int64_t fromStage, fromResult, toStage, toArg;
  Type type;
};

struct PipeBuildSchedulePass
    : public pipec::impl::PipeBuildSchedulePassBase<PipeBuildSchedulePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto kind = parseScheduleKind(schedule);
    if (!kind) {
      module.emitError("unknown schedule '")
          << schedule << "' (available: gpipe, 1f1b-flush)";
      return signalPassFailure();
    }
    if (*kind != ScheduleKind::GPipe && *kind != ScheduleKind::OneFOneBFlush) {
      module.emitError("schedule '")
          << schedule
          << "' can be planned and simulated (pipec plan/simulate) but not "
             "yet compiled; compiled schedules: gpipe, 1f1b-flush";
      return signalPassFailure();
    }
    if (microbatches < 1) {
      module.emitError("microbatches must be >= 1, got ") << microbatches;
      return signalPassFailure();
    }
    auto fwds = getStageFuncs(module, "fwd");
    auto bwds = getStageFuncs(module, "bwd");
    auto steps = getStageFuncs(module, "step");
    if (fwds.empty() || bwds.size() != fwds.size() ||
        steps.size() != fwds.size()) {
      module.emitError("expected @sK_fwd, @sK_bwd and @sK_step for every "
                       "stage; run --pipe-split-stages and --nn-autodiff first");
      return signalPassFailure();
    }
    for (Operation &op : *module.getBody())
      if (isa<pipe::PipelineOp>(op)) {
        op.emitError("the module already has a pipeline schedule");
        return signalPassFailure();
      }
    int64_t numStages = fwds.size();

    SmallVector<Edge> edges;
    for (auto [k, fn] : llvm::enumerate(fwds))
      for (unsigned a = 0; a < fn.getNumArguments(); ++a)
        if (auto from = fn.getArgAttrOfType<DenseI64ArrayAttr>(a, "pipe.from"))
          edges.push_back({from[0], from[1], static_cast<int64_t>(k), a,
                           fn.getArgumentTypes()[a]});

    std::vector<StageSchedule> sched =
        generateSchedule(*kind, numStages, microbatches);

    OpBuilder b(module.getContext());
    b.setInsertionPointToEnd(module.getBody());
    Location loc = module.getLoc();
    auto pipeline = pipe::PipelineOp::create(
        b, loc, b.getI64IntegerAttr(microbatches),
        b.getStringAttr(scheduleKindName(*kind)));
    pipeline.getBody().emplaceBlock();
    b.setInsertionPointToEnd(&pipeline.getBody().front());

    for (int64_t s = 0; s < numStages; ++s) {
      func::FuncOp fwd = fwds[s], bwd = bwds[s];
      auto fwdRef = FlatSymbolRefAttr::get(fwd.getSymNameAttr());
      auto bwdRef = FlatSymbolRefAttr::get(bwd.getSymNameAttr());
      int64_t slots = peakInflight(sched[s].flatten());
      auto program = pipe::ProgramOp::create(
          b, loc, b.getStringAttr("rank" + std::to_string(s)),
          b.getI64IntegerAttr(s), b.getI64IntegerAttr(std::max<int64_t>(slots, 1)));
      program.getBody().emplaceBlock();
      OpBuilder pb = OpBuilder::atBlockEnd(&program.getBody().front());

      auto i64 = [&](int64_t v) { return pb.getI64IntegerAttr(v); };
      auto emitForward = [&](Value mb) {
        for (auto [e, edge] : llvm::enumerate(edges))
          if (edge.toStage == s)
            pipe::RecvOp::create(pb, loc, mb, i64(edge.fromStage), i64(2 * e),
                                 fwdRef, i64(edge.toArg), TypeAttr::get(edge.type));
        pipe::ForwardOp::create(pb, loc, fwdRef, mb);
        for (auto [e, edge] : llvm::enumerate(edges))
          if (edge.fromStage == s)
            pipe::SendOp::create(pb, loc, mb, i64(edge.toStage), i64(2 * e),
                                 fwdRef, i64(edge.fromResult),
                                 TypeAttr::get(edge.type));
      };
      // Gradients travel back on the activations' edges, in edge order on
      // both sides, so every link's send order equals its receive order.
      auto emitBackward = [&](Value mb) {
        for (auto [e, edge] : llvm::enumerate(edges)) {
          if (edge.fromStage != s)
            continue;
          for (unsigned i = 0; i < bwd.getNumArguments(); ++i) {
            auto from =
                bwd.getArgAttrOfType<DenseI64ArrayAttr>(i, "pipe.grad_from");
            if (from && from[0] == edge.toStage && from[1] == edge.toArg)
              pipe::RecvOp::create(pb, loc, mb, i64(edge.toStage),
                                   i64(2 * e + 1), bwdRef, i64(i),
                                   TypeAttr::get(edge.type));
          }
        }
        pipe::BackwardOp::create(pb, loc, bwdRef, mb);
        for (auto [e, edge] : llvm::enumerate(edges)) {
          if (edge.toStage != s)
            continue;
          for (unsigned i = 0; i < bwd.getNumResults(); ++i) {
            auto arg =
                bwd.getResultAttrOfType<IntegerAttr>(i, "pipe.grad_of_arg");
            if (arg && arg.getInt() == edge.toArg)
              pipe::SendOp::create(pb, loc, mb, i64(edge.fromStage),
                                   i64(2 * e + 1), bwdRef, i64(i),
                                   TypeAttr::get(edge.type));
          }
        }
      };
      auto emitOps = [&](ArrayRef<SchedOp> body, Value iv) {
        for (const SchedOp &op : body) {
          Value mb = iv;
          if (!iv || op.microbatch != 0) {
            Value base = arith::ConstantIndexOp::create(pb, loc, op.microbatch);
            mb = iv ? arith::AddIOp::create(pb, loc, iv, base).getResult()
                    : base;
          }
          if (op.kind == PassKind::Forward)
            emitForward(mb);
          else
            emitBackward(mb);
        }
      };
      for (const Segment &seg : sched[s].segments) {
        if (seg.trips == 1) {
          emitOps(seg.body, Value());
          continue;
        }
        Value lb = arith::ConstantIndexOp::create(pb, loc, 0);
        Value ub = arith::ConstantIndexOp::create(pb, loc, seg.trips);
        Value one = arith::ConstantIndexOp::create(pb, loc, 1);
        auto loop = scf::ForOp::create(pb, loc, lb, ub, one);
        OpBuilder::InsertionGuard guard(pb);
        pb.setInsertionPoint(loop.getBody()->getTerminator());
        emitOps(seg.body, loop.getInductionVar());
      }
      pipe::FlushOp::create(pb, loc);
      pipe::StepOp::create(pb, loc,
                           FlatSymbolRefAttr::get(steps[s].getSymNameAttr()));
    }
  }
};

} // namespace
