//===- VerifySchedule.cpp - --pipe-verify-schedule, --pipe-plan-memory ----===//
//
// Checks done before anything runs (also by `pipec compile`):
//
// --pipe-verify-schedule: the pipe.pipeline verifier (matching sends and
//   receives per link, no deadlock, one forward and backward per owned
//   microbatch, weight versions: the one a forward used for its backward,
//   at most p - s for PipeDream, 2 for 2BW), then per rank the peak number
//   of stashed microbatches of the whole run against the program's slots
//   and the schedule's closed form (lib/Schedule closedFormInflight). One
//   remark per rank reports the figures.
//
// --pipe-plan-memory: lays out every rank's static arena exactly as
//   --pipe-lower-to-runtime will, records it on the program
//   (`pipe.arena_bytes`) and reports the regions per rank; the runtime
//   allocates that many bytes (rank summary: `arena_bytes`); and the bytes
//   of one stash slot (`pipe.slot_bytes`: what one more microbatch in
//   flight costs, which `--schedule synth` budgets with).
//
//===----------------------------------------------------------------------===//
#include "passes/PassUtils.h"
#include "passes/Passes.h"
#include "pipec/Schedule.h"

#include "mlir/IR/Verifier.h"

#include <map>

namespace pipec {
#define GEN_PASS_DEF_PIPEVERIFYSCHEDULEPASS
#define GEN_PASS_DEF_PIPEPLANMEMORYPASS
#include "passes/Passes.h.inc"
} // namespace pipec

using namespace mlir;
using namespace pipec;

namespace {

/// The module's pipeline, or an error (null) when it has none.
pipe::PipelineOp requirePipeline(ModuleOp module) {
  for (Operation &op : *module.getBody())
    if (auto p = dyn_cast<pipe::PipelineOp>(op))
      return p;
  module.emitError("no pipe.pipeline; run --pipe-build-schedule first");
  return {};
}

/// Device positions and replicas per position of a pipeline.
struct Shape {
  int64_t positions = 0;
  std::map<int64_t, int> replicas;
};

Shape shapeOf(pipe::PipelineOp pipeline) {
  Shape shape;
  for (Operation &op : pipeline.getBody().front())
    if (auto p = dyn_cast<pipe::ProgramOp>(op))
      ++shape.replicas[p.getStage()];
  shape.positions = int64_t(shape.replicas.size());
  return shape;
}

struct PipeVerifySchedulePass
    : public pipec::impl::PipeVerifySchedulePassBase<PipeVerifySchedulePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    pipe::PipelineOp pipeline = requirePipeline(module);
    if (!pipeline || failed(mlir::verify(pipeline)))
      return signalPassFailure();
    auto kind = parseScheduleKind(pipeline.getSchedule().str());
    if (!kind) {
      pipeline.emitError("unknown schedule '") << pipeline.getSchedule() << "'";
      return signalPassFailure();
    }
    const bool continuous = !isFlushSchedule(*kind);
    const int64_t m = pipeline.getMicrobatches();
    Shape shape = shapeOf(pipeline);
    const int64_t reach = pipe::windowReach(pipeline);
    std::vector<int> replicaCounts;
    for (auto &[position, r] : shape.replicas)
      replicaCounts.push_back(int(r));
    const std::vector<int64_t> depth = pipedreamDepths(replicaCounts);
    for (Operation &op : pipeline.getBody().front()) {
      auto program = dyn_cast<pipe::ProgramOp>(op);
      if (!program)
        continue;
      SmallVector<pipe::ExpandedEvent> events;
      if (failed(pipe::expandRun(program, m, reach, continuous, events)))
        return signalPassFailure();
      // The run as lib/Schedule ops (chunk: the stage among this rank's, by
      // its forward function), whose peakInflight is the number of stash
      // slots the rank needs.
      std::map<std::string, int> chunks;
      std::vector<SchedOp> ops;
      for (const pipe::ExpandedEvent &e : events) {
        StringRef func;
        PassKind passKind;
        if (e.kind == pipe::ExpandedEvent::Forward) {
          func = cast<pipe::ForwardOp>(e.op).getFunc();
          passKind = PassKind::Forward;
        } else if (e.kind == pipe::ExpandedEvent::Backward) {
          func = cast<pipe::BackwardOp>(e.op).getFunc();
          passKind = PassKind::Backward;
        } else if (e.kind == pipe::ExpandedEvent::BackwardWeight) {
          func = cast<pipe::BackwardWeightOp>(e.op).getFunc();
          passKind = PassKind::BackwardWeight;
        } else {
          continue;
        }
        int chunk = chunks.try_emplace(pipe::forwardFuncOf(func), chunks.size())
                        .first->second;
        ops.push_back({passKind, e.microbatch, chunk});
      }
      const int64_t peak = peakInflight(ops);
      // A rank whose backwards read nothing from the stash keeps one slot.
      bool stash = false;
      program.walk([&](pipe::BackwardOp b) {
        auto fn = module.lookupSymbol<func::FuncOp>(b.getFunc());
        auto q = fn ? fn->getAttrOfType<IntegerAttr>(pipe::attrs::kStage)
                    : IntegerAttr();
        // Without the stage functions' marks (hand-written IR): assume it.
        stash |= !q || stageReadsStash(module, q.getInt());
      });
      if (stash && peak > program.getSlots()) {
        program.emitError("stashes up to ")
            << peak << " microbatches but has " << program.getSlots()
            << " slots";
        return signalPassFailure();
      }
      // The closed form for the pipeline's shape, over the microbatches of
      // the simulated run (a continuous pipeline runs several batches back
      // to back); 1f1b-flush may use DAPPLE's warm-up policy A or B.
      ScheduleOptions options;
      options.chunks = std::max<int>(1, int(chunks.size()));
      // Split replicas run the unreplicated stage's program each.
      const bool split = pipeline.getSplitSamples().has_value();
      for (auto &[position, r] : shape.replicas)
        options.replicas.push_back(split ? 1 : r);
      const int64_t run =
          pipe::expandedMicrobatches(m, reach, continuous);
      auto closed = [&](WarmupPolicy policy) {
        options.warmup = policy;
        return closedFormInflight(*kind, int(shape.positions),
                                  int(program.getStage()), run, options,
                                  split ? 0 : int(program.getReplica()));
      };
      int64_t closedA = closed(WarmupPolicy::A);
      int64_t closedB = *kind == ScheduleKind::OneFOneBFlush
                            ? closed(WarmupPolicy::B)
                            : closedA;
      // A custom schedule's order comes from a file: no closed form.
      const bool custom = closedA < 0; // custom (a file's order), zb-v
      if (!custom && peak != closedA && peak != closedB) {
        program.emitError("peak stashed microbatches ")
            << peak << " differ from the closed form " << closedA
            << (closedB != closedA ? " (policy B: " + std::to_string(closedB) +
                                         ")"
                                   : std::string())
            << " of schedule '" << pipeline.getSchedule() << "'";
        return signalPassFailure();
      }
      if (report) {
        InFlightDiagnostic d = program.emitRemark();
        d << program.getRankName() << " (stage " << program.getStage();
        if (shape.replicas[program.getStage()] > 1)
          d << ", replica " << program.getReplica();
        d << "): peak stashed microbatches " << peak
          << (custom ? " (no closed form)" : " = closed form") << ", slots "
          << program.getSlots();
        if (!stash)
          d << " (its backward keeps nothing: one slot)";
        if (chunks.size() > 1)
          d << ", " << chunks.size() << " chunks";
        if (*kind == ScheduleKind::OneFOneB)
          d << ", weight versions <= "
            << (split ? shape.positions - program.getStage()
                      : depth[size_t(program.getStage())]);
        if (*kind == ScheduleKind::TwoBW)
          d << ", weight versions <= 2";
      }
    }
  }
};

struct PipePlanMemoryPass
    : public pipec::impl::PipePlanMemoryPassBase<PipePlanMemoryPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    pipe::PipelineOp pipeline = requirePipeline(module);
    if (!pipeline)
      return signalPassFailure();
    SmallVector<pipe::ProgramOp> programs;
    for (Operation &op : pipeline.getBody().front())
      if (auto p = dyn_cast<pipe::ProgramOp>(op))
        programs.push_back(p);
    // Stash bytes per microbatch that recomputation removed, per device
    // position (an interleaved rank runs stages c*p + r).
    const int64_t positions = shapeOf(pipeline).positions;
    std::map<int64_t, int64_t> removed;
    std::map<int64_t, std::string> modes;
    for (auto [q, fwd] : llvm::enumerate(getStageFuncs(module, "fwd"))) {
      auto before = fwd ? fwd->getAttrOfType<ArrayAttr>("pipe.recompute_saved")
                        : ArrayAttr();
      auto mode =
          fwd ? fwd->getAttrOfType<StringAttr>("pipe.recompute") : StringAttr();
      if (!before || !mode)
        continue;
      int64_t after = 0;
      for (unsigned i = 0; i < fwd.getNumResults(); ++i)
        if (fwd.getResultAttr(i, "pipe.saved"))
          after += nn::tensorBytes(fwd.getResultTypes()[i]);
      const int64_t position = positions > 0 ? int64_t(q) % positions : 0;
      int64_t beforeBytes = 0;
      for (auto t : before.getAsRange<TypeAttr>())
        beforeBytes += nn::tensorBytes(t.getValue());
      removed[position] += beforeBytes - after;
      std::string &m = modes[position];
      if (m.find(mode.getValue().str()) == std::string::npos)
        m += (m.empty() ? "" : "/") + mode.getValue().str();
    }
    for (pipe::ProgramOp program : programs) {
      FailureOr<ArenaPlan> plan =
          planStageArena(module, program.getStage(), program.getReplica());
      if (failed(plan))
        return signalPassFailure();
      Builder b(module.getContext());
      program->setAttr("pipe.arena_bytes", b.getI64IntegerAttr(plan->total));
      program->setAttr(
          "pipe.slot_bytes",
          b.getI64IntegerAttr(plan->slots > 0 ? plan->slotBytes : 0));
      if (!report)
        continue;
      InFlightDiagnostic d = program.emitRemark();
      d << program.getRankName() << " (stage " << program.getStage()
        << "): arena " << plan->total << " bytes = weights " << plan->weights
        << " + " << plan->slots << " slots x " << plan->slotBytes << " + io "
        << plan->io << " + scratch " << plan->scratch;
      auto it = removed.find(program.getStage());
      if (it != removed.end())
        d << "; recompute " << modes[program.getStage()] << ": without it "
          << plan->slots << " slots x " << plan->slotBytes + it->second << " ("
          << plan->slots * it->second
          << " bytes more, before the backward's larger scratch)";
    }
  }
};

} // namespace
