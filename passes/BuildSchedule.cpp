//===- BuildSchedule.cpp - --pipe-build-schedule --------------------------===//
//
// Materialises a schedule as one pipe.program per rank:
//   F(mb): recv boundary args -> pipe.forward -> send boundary results
//   B(mb): recv output grads  -> pipe.backward -> send arg grads
// Synchronous schedules (lib/Schedule's gpipe / 1f1b-flush orders) end with
// pipe.flush and pipe.step; loops of the generator become scf.for. The
// continuous schedules (1f1b = PipeDream with weight stashing, 2bw) are one
// window of a pipeline that never flushes, with pipe.step after the
// backwards that end a minibatch (see ProgramOp's description).
// Every boundary edge (producer stage j, result r) -> (consumer k, arg a)
// gets channel 2e for its activation and 2e+1 for its gradient.
//
//===----------------------------------------------------------------------===//
#include "passes/PassUtils.h"
#include "passes/Passes.h"
#include "pipec/Schedule.h"
#include "llvm/ADT/StringExtras.h"

#include "llvm/Support/MemoryBuffer.h"

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

/// The rank programs: (stage, replica, schedule), stage-major.
struct RankProgram {
  int64_t stage, replica;
  StageSchedule schedule;
};

/// Emits the ops of one rank's pipe.program (device position `s`).
class ProgramEmitter {
public:
  ProgramEmitter(ModuleOp module, ScheduleKind kind,
                 ArrayRef<func::FuncOp> fwds, ArrayRef<func::FuncOp> bwds,
                 ArrayRef<Edge> edges, int64_t devices, Placement placement,
                 int64_t s, int64_t replicas, func::FuncOp step, OpBuilder pb)
      : module(module), kind(kind), fwds(fwds), bwds(bwds), edges(edges),
        devices(devices), placement(placement), s(s), r(replicas), step(step),
        pb(pb), loc(module.getLoc()) {}

  /// Segments of a synchronous schedule, then the flush, the all-reduce of
  /// a replicated stage, the tied weights' reductions and the updates of
  /// every chunk.
  void flushSchedule(const StageSchedule &schedule,
                     const std::map<std::vector<int64_t>,
                                    SmallVector<Attribute>> &tieGroups,
                     ArrayRef<func::FuncOp> steps, int64_t chunks) {
    for (const Segment &seg : schedule.segments)
      segment(seg, false);
    pipe::FlushOp::create(pb, loc);
    if (r > 1)
      pipe::AllReduceOp::create(pb, loc, Value(), UnitAttr());
    for (auto &[stages, weights] : tieGroups)
      if (llvm::is_contained(stages, s))
        pipe::TieReduceOp::create(pb, loc, pb.getArrayAttr(weights),
                                  pb.getDenseI64ArrayAttr(stages));
    for (int64_t c = 0; c < chunks; ++c)
      pipe::StepOp::create(
          pb, loc,
          FlatSymbolRefAttr::get(
              func::FuncOp(steps[stageOfChunk(placement, devices, s, c)])
                  .getSymNameAttr()),
          Value());
  }

  /// One window of continuous 1F1B: pair i = {F(i), B(i - w)}, so the
  /// backward of microbatch k follows the forward of k + w (thesis.md
  /// §5.3). Replica j of r (1F1B-RR) runs microbatches j, j + r, ...:
  /// pair i = {F(j + i r), B(j + (i - w) r)}, m / r pairs per window.
  /// PipeDream updates after every backward (every replica together, one
  /// round of r minibatches); 2BW after the backward of the replica's last
  /// microbatch of a batch (m - r + j), which is pair (w + m/r - 1) mod
  /// (m/r): of this window's batch when w = 0, else of the previous one.
  void continuousWindow(int64_t replica, int64_t warmup, int64_t microbatches) {
    const int64_t perReplica = microbatches / r;
    auto pairs = [&](int64_t first, int64_t trips) {
      int64_t mb = replica + first * r;
      return Segment{{{PassKind::Forward, mb},
                      {PassKind::Backward, mb - warmup * r}},
                     trips,
                     r};
    };
    if (kind == ScheduleKind::OneFOneB) {
      segment(pairs(0, perReplica), true);
      return;
    }
    int64_t last = (warmup + perReplica - 1) % perReplica;
    segment(pairs(0, last), false);
    segment(pairs(last, 1), true);
    segment(pairs(last + 1, perReplica - last - 1), false);
  }

private:
  ModuleOp module;
  ScheduleKind kind;
  ArrayRef<func::FuncOp> fwds, bwds;
  ArrayRef<Edge> edges;
  int64_t devices;
  Placement placement;
  int64_t s, r;
  func::FuncOp step;
  OpBuilder pb;
  Location loc;

  IntegerAttr i64(int64_t v) { return pb.getI64IntegerAttr(v); }

  /// The forward of (virtual) stage q with its boundary messages.
  void forward(Value mb, int64_t q) {
    auto fwdRef = FlatSymbolRefAttr::get(func::FuncOp(fwds[q]).getSymNameAttr());
    for (auto [e, edge] : llvm::enumerate(edges))
      if (edge.toStage == q)
        pipe::RecvOp::create(pb, loc, mb, i64(edge.fromStage), i64(2 * e),
                             fwdRef, i64(edge.toArg), TypeAttr::get(edge.type));
    pipe::ForwardOp::create(pb, loc, fwdRef, mb);
    for (auto [e, edge] : llvm::enumerate(edges))
      if (edge.fromStage == q)
        pipe::SendOp::create(pb, loc, mb, i64(edge.toStage), i64(2 * e),
                             fwdRef, i64(edge.fromResult),
                             TypeAttr::get(edge.type));
  }

  /// Gradients travel back on the activations' edges, in edge order on
  /// both sides, so every link's send order equals its receive order.
  void backward(Value mb, int64_t q) {
    func::FuncOp bwd = bwds[q];
    auto bwdRef = FlatSymbolRefAttr::get(bwd.getSymNameAttr());
    for (auto [e, edge] : llvm::enumerate(edges)) {
      if (edge.fromStage != q)
        continue;
      for (unsigned i = 0; i < bwd.getNumArguments(); ++i) {
        auto from = bwd.getArgAttrOfType<DenseI64ArrayAttr>(i, "pipe.grad_from");
        if (from && from[0] == edge.toStage && from[1] == edge.toArg)
          pipe::RecvOp::create(pb, loc, mb, i64(edge.toStage), i64(2 * e + 1),
                               bwdRef, i64(i), TypeAttr::get(edge.type));
      }
    }
    pipe::BackwardOp::create(pb, loc, bwdRef, mb);
    for (auto [e, edge] : llvm::enumerate(edges)) {
      if (edge.toStage != q)
        continue;
      for (unsigned i = 0; i < bwd.getNumResults(); ++i) {
        auto arg = bwd.getResultAttrOfType<IntegerAttr>(i, "pipe.grad_of_arg");
        if (arg && arg.getInt() == edge.toArg)
          pipe::SendOp::create(pb, loc, mb, i64(edge.fromStage), i64(2 * e + 1),
                               bwdRef, i64(i), TypeAttr::get(edge.type));
      }
    }
  }

  /// `update`: a pipe.step follows every backward of the body (after an
  /// all-reduce of the gradients on a replicated stage: PipeDream's 1F1B-RR
  /// averages its replicas' minibatch gradients, 2BW sums the batch's).
  void ops(ArrayRef<SchedOp> body, Value iv, bool update) {
    auto stepRef = FlatSymbolRefAttr::get(step.getSymNameAttr());
    for (const SchedOp &op : body) {
      Value mb = iv;
      if (!iv || op.microbatch != 0) {
        Value base = arith::ConstantIndexOp::create(pb, loc, op.microbatch);
        mb = iv ? arith::AddIOp::create(pb, loc, iv, base).getResult() : base;
      }
      const int64_t q = stageOfChunk(placement, devices, s, op.chunk);
      if (op.kind == PassKind::Forward) {
        forward(mb, q);
      } else if (op.kind == PassKind::BackwardWeight) {
        auto bwdw = module.lookupSymbol<func::FuncOp>(stageFuncName(q, "bwdw"));
        pipe::BackwardWeightOp::create(
            pb, loc, FlatSymbolRefAttr::get(bwdw.getSymNameAttr()), mb);
      } else {
        backward(mb, q);
        if (update && r > 1)
          pipe::AllReduceOp::create(
              pb, loc, mb,
              kind == ScheduleKind::OneFOneB ? pb.getUnitAttr() : UnitAttr());
        if (update)
          pipe::StepOp::create(pb, loc, stepRef, mb);
      }
    }
  }

  /// A segment: its body once, or an scf.for of `trips` trips.
  void segment(const Segment &seg, bool update) {
    if (seg.trips <= 0)
      return;
    if (seg.trips == 1) {
      ops(seg.body, Value(), update);
      return;
    }
    Value lb = arith::ConstantIndexOp::create(pb, loc, 0);
    Value ub = arith::ConstantIndexOp::create(pb, loc, seg.trips);
    Value one = arith::ConstantIndexOp::create(pb, loc, 1);
    auto loop = scf::ForOp::create(pb, loc, lb, ub, one);
    OpBuilder::InsertionGuard guard(pb);
    pb.setInsertionPoint(loop.getBody()->getTerminator());
    // Trip t runs microbatch index + t * stride (stride r on a replica).
    Value iv = loop.getInductionVar();
    if (seg.stride != 1)
      iv = arith::MulIOp::create(
          pb, loc, iv, arith::ConstantIndexOp::create(pb, loc, seg.stride));
    ops(seg.body, iv, update);
  }
};

struct PipeBuildSchedulePass
    : public pipec::impl::PipeBuildSchedulePassBase<PipeBuildSchedulePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto kind = parseScheduleKind(schedule);
    if (!kind) {
      module.emitError("unknown schedule '")
          << schedule
          << "' (available: " << llvm::join(scheduleKindNames(), ", ") << ")";
      return signalPassFailure();
    }
    const bool continuous = !isFlushSchedule(*kind);
    if (warmup != "A" && warmup != "B") {
      module.emitError("unknown warm-up policy '")
          << warmup << "' (A: p-s-1 warm-up forwards, B: 2(p-s-1); DAPPLE)";
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
    if (failed(requireBodies(fwds)) || failed(requireBodies(bwds)) ||
        failed(requireBodies(steps)))
      return signalPassFailure();
    for (Operation &op : *module.getBody())
      if (isa<pipe::PipelineOp>(op)) {
        op.emitError("the module already has a pipeline schedule");
        return signalPassFailure();
      }
    int64_t numStages = fwds.size();
    // Tied weights (read by several stages): each such stage holds a copy,
    // and the copies' gradients are summed before the synchronous update.
    PipelineRequest request;
    request.kind = *kind;
    request.stages = numStages;
    request.chunks = chunks;
    request.microbatches = microbatches;
    request.replicas.assign(replicas.begin(), replicas.end());
    request.splitSamples = splitSamples;
    request.warmup = warmup == "B" ? WarmupPolicy::B : WarmupPolicy::A;
    auto tied = module->getAttrOfType<DictionaryAttr>(pipe::attrs::kTied);
    if (tied)
      for (NamedAttribute entry : tied) {
        auto stages = dyn_cast<DenseI64ArrayAttr>(entry.getValue());
        request.tied.push_back(
            {entry.getName().str(),
             stages ? std::vector<int64_t>(stages.asArrayRef().begin(),
                                           stages.asArrayRef().end())
                    : std::vector<int64_t>{}});
      }
    // A custom schedule's file says where its stages run.
    CsvSchedule csv;
    if (*kind == ScheduleKind::Custom && failed(readCsv(numStages, csv)))
      return signalPassFailure();
    const Placement placement = *kind == ScheduleKind::Custom
                                    ? csv.schedule.placement
                                    : placementOf(*kind);
    request.placement = placement;
    // Every schedule and replica rule (lib/Schedule/Rules.cpp).
    std::vector<RuleViolation> violations = checkPipelineRules(request);
    for (const RuleViolation &v : violations)
      module.emitError(v.message);
    if (!violations.empty())
      return signalPassFailure();
    // Device positions p; with chunks, stage c*p + r runs on device r (a V:
    // stages r and 2p-1-r).
    const int64_t devices = numStages / chunks;
    // Zero bubble: every backward in an input half and a weight half.
    if (*kind == ScheduleKind::ZeroBubbleH1 ||
        *kind == ScheduleKind::ZeroBubbleH2 ||
        *kind == ScheduleKind::ZeroBubbleV ||
        *kind == ScheduleKind::DualPipeV || csv.splitBackward)
      for (int64_t q = 0; q < numStages; ++q)
        if (failed(splitBackward(module, q)))
          return signalPassFailure();
    SmallVector<Edge> edges = boundaryEdges(fwds);
    // Groups of tied stages (device positions) in a canonical order, each
    // with its weights.
    std::map<std::vector<int64_t>, SmallVector<Attribute>> tieGroups;
    if (tied)
      for (NamedAttribute entry : tied) {
        std::set<int64_t> positions;
        for (int64_t q : cast<DenseI64ArrayAttr>(entry.getValue()).asArrayRef())
          positions.insert(positionOfStage(placement, devices, q));
        tieGroups[std::vector<int64_t>(positions.begin(), positions.end())]
            .push_back(FlatSymbolRefAttr::get(entry.getName()));
      }
    // Replicas per stage (1F1B-RR): empty = one each. Split replicas
    // (DAPPLE): each replica runs the unreplicated stage's program on its
    // slice of every microbatch.
    std::vector<int> replicaCounts = request.replicas;
    std::vector<RankProgram> rankPrograms;
    if (*kind == ScheduleKind::Custom) {
      replicaCounts.assign(size_t(devices), 1);
      for (const RankSchedule &r : csv.schedule.ranks)
        rankPrograms.push_back({r.stage, 0, r.schedule});
    } else if (failed(buildRankPrograms(*kind, numStages, devices,
                                        replicaCounts, rankPrograms))) {
      return signalPassFailure();
    }
    recordPlanReplicas(numStages, devices, placement, replicaCounts);

    // The continuous schedules' in-flight depth per stage replica
    // (1F1B-RR): K_s = ceil(W_s / r_s), p - s without replicas.
    const std::vector<int64_t> depth = pipedreamDepths(replicaCounts);
    const bool split = splitSamples > 0;
    OpBuilder b(module.getContext());
    b.setInsertionPointToEnd(module.getBody());
    Location loc = module.getLoc();
    auto pipeline = pipe::PipelineOp::create(
        b, loc, b.getI64IntegerAttr(microbatches),
        b.getStringAttr(scheduleKindName(*kind)),
        split ? b.getI64IntegerAttr(splitSamples) : IntegerAttr(),
        placement == Placement::V ? b.getStringAttr(placementName(placement))
                                  : StringAttr());
    pipeline.getBody().emplaceBlock();
    b.setInsertionPointToEnd(&pipeline.getBody().front());
    for (auto [rankIndex, rp] : llvm::enumerate(rankPrograms)) {
      // Device position s runs stage s, or the chunks c*p + s (interleaved).
      const int64_t s = rp.stage;
      // A continuous stage replica runs K_s - 1 forwards ahead of its
      // backwards and holds the microbatches of its last K_s pairs.
      const int64_t warmupForwards = depth[size_t(s)] - 1;
      int64_t slots = continuous ? warmupForwards + 1
                                 : peakInflight(rp.schedule.flatten());
      // Nothing kept for the backward (no gradient flows into these
      // stages): one slot, reused by every microbatch.
      bool stash = false;
      for (int64_t c = 0; c < chunks; ++c)
        stash |=
            stageReadsStash(module, stageOfChunk(placement, devices, s, c));
      if (!stash)
        slots = 1;
      auto program = pipe::ProgramOp::create(
          b, loc, b.getStringAttr("rank" + std::to_string(rankIndex)),
          b.getI64IntegerAttr(s), b.getI64IntegerAttr(rp.replica),
          b.getI64IntegerAttr(std::max<int64_t>(slots, 1)));
      program.getBody().emplaceBlock();
      ProgramEmitter emit(module, *kind, fwds, bwds, edges, devices, placement,
                          s, replicaCounts[size_t(s)], steps[s],
                          OpBuilder::atBlockEnd(&program.getBody().front()));
      if (continuous)
        emit.continuousWindow(rp.replica, warmupForwards, microbatches);
      else
        emit.flushSchedule(rp.schedule, tieGroups, steps, chunks);
    }
  }

  /// The custom schedule's file, read and checked (lib/Schedule's
  /// parseScheduleCsv), and its shape against the module's and the pass's.
  LogicalResult readCsv(int64_t numStages, CsvSchedule &csv) {
    ModuleOp module = getOperation();
    if (scheduleCsv.empty())
      return module.emitError("the custom schedule runs the order of a file: "
                              "give schedule-csv=FILE (a compute-only CSV, "
                              "one row of actions such as 0F0,0B0 per rank)");
    auto buffer = llvm::MemoryBuffer::getFile(scheduleCsv);
    if (!buffer)
      return module.emitError("cannot read the schedule '")
             << scheduleCsv << "': " << buffer.getError().message();
    csv = parseScheduleCsv((*buffer)->getBuffer().str());
    if (!csv.ok)
      return module.emitError("the schedule '")
             << scheduleCsv << "' cannot run: " << csv.error;
    const ScheduleResult &s = csv.schedule;
    const int64_t fileStages = int64_t(s.stages) * s.chunks;
    const int64_t v = chunks, m = microbatches;
    if (fileStages != numStages || s.chunks != v || s.microbatches != m)
      return module.emitError("the schedule '")
             << scheduleCsv << "' runs " << fileStages << " stages ("
             << s.stages << " ranks x " << s.chunks << " chunks) and "
             << s.microbatches << " microbatches, but the pipeline has "
             << numStages << " stages (" << numStages / v << " x " << v
             << " chunks) and " << m << " microbatches";
    return success();
  }

  /// Every boundary tensor, from the forwards' pipe.from argument marks.
  static SmallVector<Edge> boundaryEdges(ArrayRef<func::FuncOp> fwds) {
    SmallVector<Edge> edges;
    for (auto [k, constFn] : llvm::enumerate(fwds)) {
      func::FuncOp fn = constFn;
      for (unsigned a = 0; a < fn.getNumArguments(); ++a)
        if (auto from = fn.getArgAttrOfType<DenseI64ArrayAttr>(a, "pipe.from"))
          edges.push_back({from[0], from[1], static_cast<int64_t>(k), a,
                           fn.getArgumentTypes()[a]});
    }
    return edges;
  }

  /// The programs of every rank: lib/Schedule's generator for the
  /// synchronous schedules (its replica counts filled in), one empty
  /// window per stage replica for the continuous ones.
  LogicalResult buildRankPrograms(ScheduleKind kind, int64_t numStages,
                                  int64_t devices,
                                  std::vector<int> &replicaCounts,
                                  std::vector<RankProgram> &rankPrograms) {
    const bool split = splitSamples > 0;
    if (!isFlushSchedule(kind)) {
      if (replicaCounts.empty())
        replicaCounts.assign(numStages, 1);
      for (int64_t s = 0; s < numStages; ++s)
        for (int j = 0; j < replicaCounts[s]; ++j)
          rankPrograms.push_back({s, j, {}});
      return success();
    }
    ScheduleOptions options;
    if (!split)
      options.replicas = replicaCounts;
    options.chunks = int(chunks);
    options.warmup = warmup == "B" ? WarmupPolicy::B : WarmupPolicy::A;
    ScheduleResult result =
        generateSchedule(kind, int(devices), microbatches, options);
    if (!result.ok)
      return getOperation().emitError("cannot build the schedule: ")
             << result.error;
    if (!split)
      replicaCounts = result.replicas;
    else if (replicaCounts.empty())
      replicaCounts.assign(size_t(devices), 1);
    for (const RankSchedule &r : result.ranks)
      for (int j = 0; j < (split ? replicaCounts[r.stage] : 1); ++j)
        rankPrograms.push_back({r.stage, split ? j : r.replica, r.schedule});
    return success();
  }

  /// The plan records the replica counts it is built with (stage c*p + s of
  /// an interleaved plan has the replicas of device position s).
  void recordPlanReplicas(int64_t numStages, int64_t devices,
                          Placement placement,
                          const std::vector<int> &replicaCounts) {
    ModuleOp module = getOperation();
    auto plan = module->getAttrOfType<pipe::PlanAttr>(pipe::attrs::kPlan);
    if (!plan)
      return;
    SmallVector<int64_t> perStage;
    for (int64_t q = 0; q < numStages; ++q)
      perStage.push_back(
          replicaCounts[size_t(positionOfStage(placement, devices, q))]);
    module->setAttr(pipe::attrs::kPlan,
                    pipe::PlanAttr::get(
                        module.getContext(), plan.getAlgorithm(),
                        plan.getFirst(), plan.getLast(),
                        DenseI64ArrayAttr::get(module.getContext(), perStage),
                        plan.getPredictedIterationS()));
  }
};

} // namespace
