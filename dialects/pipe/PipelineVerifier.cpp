//===- PipelineVerifier.cpp - cross-program checks of pipe.pipeline -------===//
//
// Expands every rank program (scf.for loops unrolled, microbatch indices
// evaluated) and hands the communication events to the schedule library's
// symbolic executor (lib/Schedule): every send must have exactly one
// matching receive of the same type, each directed link must send in the
// order its receiver receives, and the programs must not deadlock. Also
// checks that every microbatch index is in range and that each stage runs
// one forward and one backward per microbatch.
//
//===----------------------------------------------------------------------===//
#include "dialects/pipe/PipeDialect.h"
#include "pipec/Schedule.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <map>
#include <set>
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace pipec::pipe;

namespace {
/// Evaluates the index arithmetic of a program body.
class ProgramExpander {
public:
  explicit ProgramExpander(SmallVectorImpl<ExpandedEvent> &events)
      : events(events) {}

  LogicalResult run(Block &block) {
    for (Operation &op : block)
      if (failed(visit(&op)))
        return failure();
    return success();
  }

private:
  FailureOr<int64_t> value(Operation *user, Value v) {
    auto it = env.find(v);
    if (it == env.end())
      return user->emitOpError("microbatch index is not a static function of "
                               "loop counters and constants");
    return it->second;
  }

  LogicalResult visit(Operation *op) {
    if (auto c = dyn_cast<arith::ConstantIndexOp>(op)) {
      env[c.getResult()] = c.value();
      return success();
    }
    if (isa<arith::AddIOp, arith::SubIOp, arith::MulIOp, arith::RemUIOp>(op)) {
      auto l = value(op, op->getOperand(0)), r = value(op, op->getOperand(1));
      if (failed(l) || failed(r))
        return failure();
      int64_t v = isa<arith::AddIOp>(op)   ? *l + *r
                  : isa<arith::SubIOp>(op) ? *l - *r
                  : isa<arith::MulIOp>(op) ? *l * *r
                                           : (*r ? *l % *r : 0);
      env[op->getResult(0)] = v;
      return success();
    }
    if (auto loop = dyn_cast<scf::ForOp>(op)) {
      auto lb = value(op, loop.getLowerBound());
      auto ub = value(op, loop.getUpperBound());
      auto st = value(op, loop.getStep());
      if (failed(lb) || failed(ub) || failed(st))
        return failure();
      if (*st <= 0)
        return op->emitOpError("loop step must be positive");
      for (int64_t i = *lb; i < *ub; i += *st) {
        env[loop.getInductionVar()] = i;
        for (Operation &inner : loop.getBody()->without_terminator())
          if (failed(visit(&inner)))
            return failure();
      }
      return success();
    }
    auto add = [&](ExpandedEvent::Kind kind, Value mb, int64_t stage,
                   int64_t channel) -> LogicalResult {
      FailureOr<int64_t> m = mb ? value(op, mb) : FailureOr<int64_t>(0);
      if (failed(m))
        return failure();
      events.push_back({kind, stage, channel, *m, op, bool(mb)});
      return success();
    };
    if (auto s = dyn_cast<SendOp>(op))
      return add(ExpandedEvent::Send, s.getMicrobatch(), s.getPeer(),
                 s.getChannel());
    if (auto r = dyn_cast<RecvOp>(op))
      return add(ExpandedEvent::Recv, r.getMicrobatch(), r.getPeer(),
                 r.getChannel());
    if (auto f = dyn_cast<ForwardOp>(op))
      return add(ExpandedEvent::Forward, f.getMicrobatch(), 0, 0);
    if (auto b = dyn_cast<BackwardOp>(op))
      return add(ExpandedEvent::Backward, b.getMicrobatch(), 0, 0);
    if (auto w = dyn_cast<BackwardWeightOp>(op))
      return add(ExpandedEvent::BackwardWeight, w.getMicrobatch(), 0, 0);
    if (auto step = dyn_cast<StepOp>(op))
      return add(ExpandedEvent::Step, step.getMicrobatch(), 0, 0);
    if (isa<FlushOp, TieReduceOp>(op))
      return success();
    if (auto reduce = dyn_cast<AllReduceOp>(op))
      return add(ExpandedEvent::AllReduce, reduce.getMicrobatch(), 0, 0);
    return op->emitOpError("is not allowed in a pipe.program");
  }

  SmallVectorImpl<ExpandedEvent> &events;
  llvm::DenseMap<Value, int64_t> env;
};
} // namespace

LogicalResult
pipec::pipe::expandProgram(ProgramOp program,
                           SmallVectorImpl<ExpandedEvent> &events) {
  ProgramExpander expander(events);
  return expander.run(program.getBody().front());
}

int64_t pipec::pipe::windowReach(PipelineOp pipeline) {
  int64_t reach = 0;
  for (Operation &op : pipeline.getBody().front()) {
    auto program = dyn_cast<ProgramOp>(op);
    SmallVector<ExpandedEvent> events;
    if (!program || failed(expandProgram(program, events)))
      continue;
    for (const ExpandedEvent &e : events)
      if (e.hasMicrobatch)
        reach = std::max(reach, -e.microbatch);
  }
  return reach;
}

/// Windows a continuous run is checked over: enough for the warm-up (the
/// reach), a steady state and the cool-down.
static int64_t expandedWindows(int64_t m, int64_t reach) {
  return (reach + m - 1) / m + 3;
}

int64_t pipec::pipe::expandedMicrobatches(int64_t m, int64_t reach,
                                          bool continuous) {
  return continuous ? expandedWindows(m, reach) * m : m;
}

LogicalResult pipec::pipe::expandRun(ProgramOp program, int64_t m,
                                     int64_t reach, bool continuous,
                                     SmallVectorImpl<ExpandedEvent> &events) {
  const int64_t windows = continuous ? expandedWindows(m, reach) : 1;
  const int64_t total = expandedMicrobatches(m, reach, continuous);
  SmallVector<ExpandedEvent> window;
  if (failed(expandProgram(program, window)))
    return failure();
  for (const ExpandedEvent &e : window) {
    if (!e.hasMicrobatch)
      continue;
    // A continuous window reaches back at most `reach` microbatches (the
    // deepest warm-up; the runtime's pipec_rt_global_mb and its draining
    // windows use the same, from the stage description).
    int64_t low = continuous ? -reach : 0;
    if (e.microbatch < low || e.microbatch >= m)
      return e.op->emitOpError("microbatch ")
             << e.microbatch << " is out of range [" << low << ", " << m
             << ")";
  }
  // Windows after the last step drain the pipeline (at most `reach`
  // microbatches in flight, m per window).
  const int64_t drain =
      continuous ? std::max<int64_t>((reach + m - 1) / m, 1) : 0;
  for (int64_t n = 0; n < windows + drain; ++n)
    for (ExpandedEvent e : window) {
      if (!continuous) {
        events.push_back(e);
        continue;
      }
      if (!e.hasMicrobatch)
        return e.op->emitOpError("in a continuous schedule every op needs a "
                                 "microbatch (pipe.step ... after %mb)");
      e.microbatch += n * m;
      if (e.microbatch < 0 || e.microbatch >= total)
        continue; // outside the run: skipped
      events.push_back(e);
    }
  return success();
}

static std::string typeString(Type t) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << t;
  return s;
}

/// Checks the weight versions a continuous program's forwards and backwards
/// read (DESIGN.md §5): PipeDream stashes the version a forward used for
/// its backward, so a stage replica holds at most K_s versions (p - s
/// without replicas); 2BW reads version max(floor(k/m) - 1, 0) for
/// microbatch k and keeps the live version and one shadow copy, so that
/// version must be one of the two when it is read.
static LogicalResult checkVersions(ProgramOp program,
                                   ArrayRef<ExpandedEvent> events,
                                   bool twoBW, int64_t m, int64_t bound) {
  int64_t live = 0, shadow = -1;
  llvm::DenseMap<int64_t, int64_t> versionOf; // in-flight microbatch -> version
  for (const ExpandedEvent &e : events) {
    if (e.kind == ExpandedEvent::Step) {
      shadow = live;
      ++live;
      continue;
    }
    if (e.kind != ExpandedEvent::Forward && e.kind != ExpandedEvent::Backward)
      continue;
    if (twoBW) {
      int64_t want = std::max<int64_t>(e.microbatch / m - 1, 0);
      if (want != live && want != shadow)
        return e.op->emitOpError("2BW: microbatch ")
               << e.microbatch << " needs weight version " << want
               << " but stage " << program.getStage() << " holds only "
               << live << (shadow >= 0 ? " and " + std::to_string(shadow) : "")
               << " (at most two versions; the batch needs m >= p - 1)";
      continue;
    }
    if (e.kind == ExpandedEvent::Forward) {
      versionOf[e.microbatch] = live;
      llvm::SmallDenseSet<int64_t> alive;
      alive.insert(live);
      for (auto &kv : versionOf)
        alive.insert(kv.second);
      if (int64_t(alive.size()) > bound)
        return e.op->emitOpError("weight stashing: stage ")
               << program.getStage() << " would hold " << alive.size()
               << " weight versions, more than K_s = " << bound
               << " (p - s without replicas)";
    } else {
      versionOf.erase(e.microbatch);
    }
  }
  return success();
}

namespace {

/// The checks of one pipe.pipeline, in the order verifyRegions runs them.
struct PipelineChecker {
  PipelineOp pipeline;
  int64_t m = 0;
  std::optional<pipec::ScheduleKind> kind;
  bool continuous = false;
  int64_t split = 0; ///< split replicas: the samples of a microbatch
  SmallVector<ProgramOp> programs;
  /// (stage, replica) -> index into programs; replicas per stage.
  std::map<std::pair<int64_t, int64_t>, int> rankOf;
  std::map<int64_t, int64_t> replicasOf;
  std::vector<int> replicaCounts;
  int64_t numStages = 0; ///< device positions
  pipec::Placement placement = pipec::Placement::Loop;

  /// Programs only, one per (stage, replica), replicas numbered 0..r-1.
  LogicalResult collectPrograms() {
    for (Operation &op : pipeline.getBody().front()) {
      auto program = dyn_cast<ProgramOp>(op);
      if (!program)
        return op.emitOpError("only pipe.program ops may appear in a pipeline");
      if (program.getReplica() < 0)
        return program.emitOpError("replica must be non-negative");
      if (!rankOf
               .try_emplace({program.getStage(), program.getReplica()},
                            programs.size())
               .second)
        return program.emitOpError("stage ")
               << program.getStage() << " replica " << program.getReplica()
               << " has more than one program";
      ++replicasOf[program.getStage()];
      programs.push_back(program);
    }
    for (ProgramOp program : programs)
      if (program.getReplica() >= replicasOf[program.getStage()])
        return program.emitOpError("replica ")
               << program.getReplica() << " of stage " << program.getStage()
               << " but the stage has " << replicasOf[program.getStage()]
               << " programs (replicas are numbered 0..r-1)";
    numStages = int64_t(replicasOf.size());
    for (auto [stage, r] : replicasOf)
      replicaCounts.push_back(int(r));
    return success();
  }

  /// The schedule and replica rules (lib/Schedule/Rules.cpp) over what the
  /// programs say: device positions, their replicas, the tied groups.
  LogicalResult checkRules() {
    if (!kind)
      return success();
    pipec::PipelineRequest request;
    request.kind = *kind;
    request.stages = numStages;
    request.placement = placement;
    if (*kind == pipec::ScheduleKind::ZeroBubbleV ||
        *kind == pipec::ScheduleKind::DualPipeV) {
      request.stages = 2 * numStages;
      request.chunks = 2;
    }
    request.microbatches = m;
    request.replicas = replicaCounts;
    request.splitSamples = split;
    pipeline.getBody().walk([&](TieReduceOp tie) {
      std::string names;
      for (Attribute w : tie.getWeights())
        names += (names.empty() ? "" : ", ") +
                 cast<FlatSymbolRefAttr>(w).getValue().str();
      request.tied.push_back(
          {names, std::vector<int64_t>(tie.getStages().begin(),
                                       tie.getStages().end())});
    });
    std::vector<pipec::RuleViolation> violations =
        pipec::checkPipelineRules(request);
    if (!violations.empty())
      return pipeline.emitOpError(pipec::describeViolations(violations));
    return success();
  }

  /// Tied weights: every rank of every stage of a pipe.tie_reduce's group
  /// runs the same one (a collective over those ranks), once.
  LogicalResult checkTieReduces() {
    std::map<std::pair<std::vector<int64_t>, std::string>, std::set<int64_t>>
        seen; // (stages, weights) -> ranks that run it
    std::map<int64_t, std::vector<int64_t>> ranksOfStage;
    for (auto [rank, program] : llvm::enumerate(programs))
      ranksOfStage[program.getStage()].push_back(int64_t(rank));
    for (auto [rank, program] : llvm::enumerate(programs)) {
      WalkResult r = program.walk([&](TieReduceOp tie) {
        std::string key;
        llvm::raw_string_ostream os(key);
        os << tie.getWeights();
        std::vector<int64_t> st(tie.getStages().begin(), tie.getStages().end());
        if (!seen[{st, key}].insert(int64_t(rank)).second) {
          tie.emitOpError("runs twice in one program");
          return WalkResult::interrupt();
        }
        return WalkResult::advance();
      });
      if (r.wasInterrupted())
        return failure();
    }
    for (auto &[group, ranks] : seen)
      for (int64_t stage : group.first)
        for (int64_t rank : ranksOfStage[stage])
          if (!ranks.count(rank))
            return programs[size_t(rank)].emitOpError("stage ")
                   << stage << " reads the tied weights " << group.second
                   << " but does not take part in their pipe.tie_reduce";
    return success();
  }

  /// The communication events of one send or receive of `program`: one per
  /// peer replica (the owner of the microbatch, or with split replicas
  /// every replica whose slice overlaps this one's).
  LogicalResult addComm(ProgramOp program, const ExpandedEvent &e,
                        std::vector<pipec::CommEvent> &out) {
    // The peer is a pipeline stage; with chunks, stage q runs on device
    // position q mod p.
    int64_t device = pipec::positionOfStage(placement, numStages, e.stage);
    auto peerReplicas = replicasOf.find(device);
    if (e.stage < 0 || peerReplicas == replicasOf.end())
      return e.op->emitOpError("peer stage ")
             << e.stage << " has no program in this pipeline";
    const int64_t r = replicasOf[program.getStage()];
    SmallVector<int64_t> peerReplicaIds;
    if (split) {
      auto [first, size] = replicaSlice(split, r, program.getReplica());
      for (int64_t j = 0; j < peerReplicas->second; ++j) {
        auto [pFirst, pSize] = replicaSlice(split, peerReplicas->second, j);
        if (std::max(first, pFirst) < std::min(first + size, pFirst + pSize))
          peerReplicaIds.push_back(j);
      }
    } else {
      peerReplicaIds.push_back(e.microbatch % peerReplicas->second);
    }
    Type type = isa<SendOp>(e.op) ? cast<SendOp>(e.op).getType()
                                  : cast<RecvOp>(e.op).getType();
    std::string where;
    llvm::raw_string_ostream os(where);
    os << program.getRankName() << " (" << e.op->getLoc() << ")";
    for (int64_t j : peerReplicaIds)
      out.push_back({e.kind == ExpandedEvent::Send ? pipec::CommEvent::Send
                                                   : pipec::CommEvent::Recv,
                     rankOf.find({device, j})->second, e.channel, e.microbatch,
                     typeString(type), where});
    return success();
  }

  /// One program's run: updates after an all-reduce when replicated, each
  /// backward after its forward and each weight half after its input half,
  /// and exactly one of each per microbatch it owns (per chunk); its
  /// sends and receives go to `comm`.
  LogicalResult checkProgram(ProgramOp program, int64_t reach, int64_t total,
                             const std::vector<int64_t> &depth,
                             std::vector<pipec::CommEvent> &comm) {
    SmallVector<ExpandedEvent> events;
    if (failed(expandRun(program, m, reach, continuous, events)))
      return failure();
    const int64_t r = replicasOf[program.getStage()];
    bool reduced = false;
    // Runs per (stage, microbatch) of each kind, keyed by the stage's
    // forward function: a rank runs one stage, or the v chunks of an
    // interleaved pipeline, each once per microbatch it owns. A program
    // with one forward function may name its backward freely.
    enum { F, B, W };
    std::map<std::pair<std::string, int64_t>, int> runs[3];
    std::set<std::string> stages[3];
    auto keyOf = [&](StringRef func) {
      std::string key = forwardFuncOf(func);
      if (!stages[F].count(key) && stages[F].size() == 1)
        key = *stages[F].begin();
      return key;
    };
    for (const ExpandedEvent &e : events) {
      // Gradients accumulated since the last pipe.allreduce must be
      // reduced before an update; one allreduce covers every chunk of the
      // rank (interleaved: the steps of all chunks follow it).
      if (e.kind == ExpandedEvent::AllReduce)
        reduced = true;
      if (e.kind == ExpandedEvent::Backward ||
          e.kind == ExpandedEvent::BackwardWeight)
        reduced = false;
      if (e.kind == ExpandedEvent::Step && r > 1 && !reduced)
        return e.op->emitOpError("stage ")
               << program.getStage() << " has " << r
               << " replicas but updates without a pipe.allreduce of its "
                  "gradients first";
      if (e.kind == ExpandedEvent::Forward) {
        std::string key = cast<ForwardOp>(e.op).getFunc().str();
        stages[F].insert(key);
        ++runs[F][{key, e.microbatch}];
      }
      if (e.kind == ExpandedEvent::Backward) {
        std::string key = keyOf(cast<BackwardOp>(e.op).getFunc());
        if (!runs[F].count({key, e.microbatch}))
          return e.op->emitOpError("backward of microbatch ")
                 << e.microbatch << " runs before its forward";
        stages[B].insert(key);
        ++runs[B][{key, e.microbatch}];
      }
      if (e.kind == ExpandedEvent::BackwardWeight) {
        // The weight half runs after the input half of the same microbatch.
        std::string key = keyOf(cast<BackwardWeightOp>(e.op).getFunc());
        if (!runs[B].count({key, e.microbatch}))
          return e.op->emitOpError("weight-gradient half of microbatch ")
                 << e.microbatch << " runs before its input-gradient half";
        stages[W].insert(key);
        ++runs[W][{key, e.microbatch}];
      }
      if ((e.kind == ExpandedEvent::Send || e.kind == ExpandedEvent::Recv) &&
          failed(addComm(program, e, comm)))
        return failure();
    }
    if (stages[B] != stages[F] || (!stages[W].empty() && stages[W] != stages[F]))
      return program.emitOpError("runs the forwards of ")
             << stages[F].size() << " stages but the backwards of "
             << stages[B].size()
             << (stages[W].empty() ? std::string()
                                   : " and the weight halves of " +
                                         std::to_string(stages[W].size()));
    for (int64_t k = 0; k < total; ++k) {
      int want = split || k % r == program.getReplica() ? 1 : 0;
      // The first stage whose count of `kind` differs (else `want`); a
      // program without forwards runs nothing.
      auto found = [&](int kind) {
        if (stages[F].empty())
          return 0;
        for (const std::string &key : stages[F]) {
          auto it = runs[kind].find({key, k});
          int n = it == runs[kind].end() ? 0 : it->second;
          if (n != want)
            return n;
        }
        return want;
      };
      if (!stages[W].empty() && found(W) != want)
        return program.emitOpError("must run the weight-gradient half of "
                                   "microbatch ")
               << k << " " << want << " time(s)";
      int fwdRuns = found(F), bwdRuns = found(B);
      if (fwdRuns != want || bwdRuns != want)
        return program.emitOpError("must run ")
               << (want ? "exactly one forward and one backward"
                        : "no forward "
                          "or backward (another replica owns it)")
               << " of microbatch " << k
               << (stages[F].size() > 1 ? " per chunk" : "") << " (found "
               << fwdRuns << " and " << bwdRuns << ")";
    }
    if (continuous && failed(checkVersions(
                          program, events, *kind == pipec::ScheduleKind::TwoBW,
                          m, depth[size_t(program.getStage())])))
      return failure();
    return success();
  }

  LogicalResult run() {
    m = pipeline.getMicrobatches();
    kind = pipec::parseScheduleKind(pipeline.getSchedule().str());
    if (auto name = pipeline.getPlacement()) {
      auto parsed = pipec::parsePlacement(name->str());
      if (!parsed)
        return pipeline.emitOpError("unknown placement '")
               << *name << "' (loop, v)";
      placement = *parsed;
    }
    continuous = kind && !pipec::isFlushSchedule(*kind);
    if (failed(collectPrograms()))
      return failure();
    // Split replicas: every replica runs a slice of every microbatch.
    split = pipeline.getSplitSamples().value_or(0);
    if (pipeline.getSplitSamples() && split < 1)
      return pipeline.emitOpError("split_samples needs at least one sample");
    if (failed(checkRules()) || failed(checkTieReduces()))
      return failure();
    // In-flight depth K_s per stage replica (1F1B-RR), and how far back a
    // continuous window reaches.
    const std::vector<int64_t> depth = pipec::pipedreamDepths(replicaCounts);
    const int64_t reach = windowReach(pipeline);
    const int64_t total = expandedMicrobatches(m, reach, continuous);
    // Local checks first (referenced functions, indices, types), so that a
    // broken op is reported as such rather than as a communication error.
    SymbolTableCollection tables;
    WalkResult local = pipeline.getBody().walk([&](SymbolUserOpInterface user) {
      return failed(user.verifySymbolUses(tables)) ? WalkResult::interrupt()
                                                   : WalkResult::advance();
    });
    if (local.wasInterrupted())
      return failure();
    std::vector<std::vector<pipec::CommEvent>> comm(programs.size());
    for (auto [rank, program] : llvm::enumerate(programs))
      if (failed(checkProgram(program, reach, total, depth, comm[rank])))
        return failure();
    pipec::CommCheckResult check = pipec::checkCommunication(comm);
    if (!check.ok) {
      InFlightDiagnostic diag =
          pipeline.emitOpError("invalid pipeline communication");
      for (const std::string &error : check.errors)
        diag.attachNote() << error;
      return diag;
    }
    return success();
  }
};

} // namespace

LogicalResult PipelineOp::verifyRegions() {
  return PipelineChecker{*this}.run();
}
