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
#include "passes/KernelCalls.h"
#include "passes/PassUtils.h"
#include "passes/Passes.h"
#include "pipec/Schedule.h"
#include "pipec/formats/Documents.h"
#include "pipec_rt.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MLProgram/IR/MLProgram.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/JSON.h"

#include <map>
#include <optional>

namespace pipec {
#define GEN_PASS_DEF_PIPELOWERTORUNTIMEPASS
#include "passes/Passes.h.inc"
} // namespace pipec

using namespace mlir;
using namespace pipec;

namespace {

constexpr int64_t kAlign = 64;

int64_t alignUp(int64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

/// Where a tensor lives.
struct Buffer {
  enum Region { None, Weights, Slots, IO, Scratch, Const, Null } region = None;
  int64_t offset = 0;   ///< within the region (slots: within one slot)
  std::string symbol;   ///< Const: the llvm global holding the data
  int64_t bytes = 0;    ///< Const: its size
  bool operator==(const Buffer &o) const {
    return region == o.region && offset == o.offset && symbol == o.symbol;
  }
};

/// Arena regions and their sizes.
struct Regions {
  int64_t weights = 0, slot = 0, io = 0, scratch = 0;
  int64_t slots = 1;
  int64_t slotBase() const { return alignUp(weights); }
  int64_t ioBase() const { return slotBase() + slots * alignUp(slot); }
  int64_t scratchBase() const { return ioBase() + alignUp(io); }
  int64_t total() const { return scratchBase() + alignUp(scratch); }
};

/// One op to emit: a kernel call with resolved buffers, or a copy.
struct Step {
  KernelCall call;
  SmallVector<Buffer> buffers;
  int64_t opId = -1;
  Location loc;
};

/// Buffers and kernel steps of one stage function.
struct FunctionPlan {
  func::FuncOp fn;
  int64_t phase = 0;
  llvm::DenseMap<Value, Buffer> buffers;
  std::vector<Step> steps;
  SmallVector<Buffer> args, results;
};

/// One pipeline stage of the rank being lowered: a rank runs one stage, or
/// v of them (chunks c*p + r of the interleaved schedule). Each chunk has
/// its own arena regions at `base`.
struct Chunk {
  int64_t stage = 0;  ///< the (virtual) pipeline stage
  int64_t base = 0;   ///< arena offset of this chunk's regions
  int64_t opBase = 0; ///< profiler id of the chunk's first layer
  FunctionPlan fwd, bwd, step;
  /// Zero bubble: the weight-gradient half of the backward (fn null
  /// otherwise).
  FunctionPlan bwdw;
  Regions regions;
  std::map<std::string, std::pair<int64_t, Type>> weights; // name -> offset
  SmallVector<std::string> weightOrder;
  llvm::StringMap<int64_t> opIds;
  SmallVector<Operation *> layerOps;
  int64_t versionedBytes = 0; ///< weights region prefix read through wbase
  int64_t lossResult = -1;
  int64_t lossSeedArg = -1;
  SmallVector<std::pair<int64_t, int64_t>> feedArgs; // (fwd arg, feed index)
  SmallVector<int64_t> rngArgs; // fwd args holding the dropout random state
  func::FuncOp lowered[4];
  /// The functions to lower (bwdw only when the backward is split).
  SmallVector<FunctionPlan *> plans() {
    SmallVector<FunctionPlan *> all = {&fwd, &bwd, &step};
    if (bwdw.fn)
      all.push_back(&bwdw);
    return all;
  }
};

class StageLowering {
public:
  StageLowering(ModuleOp module, int64_t stage, int64_t replica,
                std::string buildId, std::string target = "cpu")
      : module(module), stage(stage), replica(replica),
        buildId(std::move(buildId)), target(std::move(target)),
        b(module.getContext()) {}

  LogicalResult run();
  /// Only checks that `target` has a kernel for every call of the stage.
  LogicalResult checkTargetOnly() {
    return failure(failed(collect()) || failed(checkTarget()));
  }
  /// Plans the arena only (constants become globals of the module: run it
  /// on a copy).
  FailureOr<ArenaPlan> planArena();

private:
  LogicalResult collect();
  LogicalResult collectChunk(Chunk &c);
  LogicalResult planFunction(Chunk &c, FunctionPlan &fp);
  int64_t assignScratch(FunctionPlan &fp, ArrayRef<int64_t> bytes);
  Buffer weightBuffer(Chunk &c, StringRef global, Type type);
  Buffer constBuffer(nn::ConstantOp op);
  Buffer allocate(int64_t &regionSize, Buffer::Region region, Type type);

  void emitDeclarations();
  func::FuncOp emitStageFunction(Chunk &c, FunctionPlan &fp);
  Value pointer(OpBuilder &ob, Location loc, const Chunk &c, const Buffer &buf,
                Value arena, Value slot, Value wbase = Value());
  Value i64(OpBuilder &ob, Location loc, int64_t v);
  Value constArray(OpBuilder &ob, Location loc, ArrayRef<int64_t> ints);
  Value constArray(OpBuilder &ob, Location loc, ArrayRef<double> reals);
  LogicalResult emitProgram();
  void postReceives(OpBuilder &ob, Block *entry, Value ctxArg);
  struct Site;
  LogicalResult prepareSite(Operation *op, Site &s);
  LogicalResult lowerPipeOp(Operation *op, Site &s);
  void emitRun(Site &s, int64_t phase, func::FuncOp fn, Value weights);
  void emitGradientReduce(pipe::AllReduceOp reduce, Site &s);
  LogicalResult emitTieReduce(pipe::TieReduceOp tie, Site &s);
  void emitStep(Site &s);
  void emitMain();
  formats::StagePolicy policy();
  void describeFeeds(formats::StageDesc &d, int64_t &microbatch);
  void describeOps(formats::StageDesc &d);
  std::string stageMeta();
  int64_t arenaBytes() const;

  ModuleOp module;
  int64_t stage; ///< the rank's device position (= its stage unless chunked)
  int64_t replica;
  int64_t replicas = 1; ///< programs (replicas) of this stage
  int64_t devices = 1;  ///< stage positions of the pipeline (p)
  std::string buildId;
  /// "cpu", or "cuda": kernels are the CUDA twins (pipec_cuda_k_*),
  /// constants reach them through pipec_rt_constant, main is
  /// pipec_rt_cuda_main.
  std::string target;
  bool cuda() const { return target == "cuda"; }
  LogicalResult checkTarget();
  OpBuilder b;

  pipe::PipelineOp pipeline;
  pipe::ProgramOp program;
  /// Groups of device positions sharing tied weights, in the order every
  /// rank numbers their communicators, and the tied weights (collect()).
  std::vector<std::vector<int64_t>> tieGroups;
  std::set<std::string> tiedWeights;
  int64_t slots = 1;
  bool continuous = false; ///< 1f1b / 2bw: windows of a running pipeline
  std::vector<std::unique_ptr<Chunk>> chunks;
  int constCounter = 0;
  std::map<std::vector<int64_t>, std::string> intArrays;
  std::map<std::vector<double>, std::string> realArrays;
  SmallVector<LLVM::GlobalOp> newGlobals;
};

} // namespace

//===----------------------------------------------------------------------===//
// Buffer planning
//===----------------------------------------------------------------------===//

Buffer StageLowering::allocate(int64_t &regionSize, Buffer::Region region,
                               Type type) {
  Buffer buf{region, regionSize, ""};
  regionSize += alignUp(std::max<int64_t>(nn::tensorBytes(type), 4));
  return buf;
}

Buffer StageLowering::weightBuffer(Chunk &c, StringRef global, Type type) {
  auto it = c.weights.find(global.str());
  if (it == c.weights.end()) {
    it = c.weights
             .emplace(global.str(), std::make_pair(c.regions.weights, type))
             .first;
    c.weightOrder.push_back(global.str());
    c.regions.weights += alignUp(nn::tensorBytes(type));
  }
  return Buffer{Buffer::Weights, it->second.first, ""};
}

Buffer StageLowering::constBuffer(nn::ConstantOp op) {
  auto type = cast<RankedTensorType>(op.getType());
  std::string name = "__pipec_const_" + std::to_string(constCounter++);
  auto flat = RankedTensorType::get({type.getNumElements()},
                                    type.getElementType());
  Attribute value = op.getValue();
  if (auto dense = dyn_cast<DenseElementsAttr>(value))
    value = dense.reshape(flat);
  OpBuilder gb = OpBuilder::atBlockBegin(module.getBody());
  auto arrayType =
      LLVM::LLVMArrayType::get(type.getElementType(), type.getNumElements());
  newGlobals.push_back(LLVM::GlobalOp::create(
      gb, op.getLoc(), arrayType, /*isConstant=*/true, LLVM::Linkage::Internal,
      name, value, /*alignment=*/kAlign));
  return Buffer{Buffer::Const, 0, name, nn::tensorBytes(type)};
}

LogicalResult StageLowering::planFunction(Chunk &c, FunctionPlan &fp) {
  func::FuncOp fn = fp.fn;
  Block &body = fn.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());

  for (BlockArgument arg : body.getArguments())
    fp.buffers[arg] = fp.args[arg.getArgNumber()];

  // Results computed directly into their destination.
  llvm::DenseMap<Value, int> returnUses;
  for (Value v : ret.getOperands())
    ++returnUses[v];
  for (auto [r, v] : llvm::enumerate(ret.getOperands())) {
    Operation *def = v.getDefiningOp();
    if (!def || isViewOp(def) || isa<ml_program::GlobalLoadOp, nn::ConstantOp>(def) ||
        returnUses[v] != 1 || fp.buffers.count(v))
      continue;
    fp.buffers[v] = fp.results[r];
  }
  // Values stored into a global by an elementwise op: compute in place,
  // provided no load of that global is read after the op.
  for (Operation &op : body) {
    auto store = dyn_cast<ml_program::GlobalStoreOp>(op);
    if (!store)
      continue;
    Value v = store.getValue();
    Operation *def = v.getDefiningOp();
    if (!def || !v.hasOneUse() || fp.buffers.count(v) ||
        !isa<nn::AddOp, nn::SgdUpdateOp, nn::FillOp, nn::ScaleOp,
             nn::MomentumOp, nn::AdamOp, nn::AdagradOp>(def))
      continue;
    bool safe = true;
    fn.walk([&](ml_program::GlobalLoadOp load) {
      if (load.getGlobal() != store.getGlobal())
        return;
      for (Operation *user : load->getUsers())
        if (user != def && def->isBeforeInBlock(user))
          safe = false;
    });
    if (safe)
      fp.buffers[v] = weightBuffer(
          c, store.getGlobal().getLeafReference().getValue(), v.getType());
  }

  // Scratch buffers get a placeholder offset (their index in
  // `scratchBytes`) until every step is known; assignScratch then packs
  // them by lifetime.
  SmallVector<int64_t> scratchBytes;
  auto addCopy = [&](Value from, Buffer to, Location loc) {
    Step s{{"pipec_k_copy", {}, {nn::tensorBytes(from.getType())}, {}},
           {fp.buffers[from], to}, -1, loc};
    fp.steps.push_back(s);
  };
  for (Operation &op : body) {
    Location loc = op.getLoc();
    if (auto load = dyn_cast<ml_program::GlobalLoadOp>(op)) {
      fp.buffers[load.getResult()] = weightBuffer(
          c, load.getGlobal().getLeafReference().getValue(), load.getType());
      continue;
    }
    if (auto c = dyn_cast<nn::ConstantOp>(op)) {
      fp.buffers[c.getResult()] = constBuffer(c);
      continue;
    }
    if (auto store = dyn_cast<ml_program::GlobalStoreOp>(op)) {
      Buffer target = weightBuffer(
          c, store.getGlobal().getLeafReference().getValue(),
          store.getValue().getType());
      if (!(fp.buffers[store.getValue()] == target))
        addCopy(store.getValue(), target, loc);
      continue;
    }
    if (isa<func::ReturnOp>(op)) {
      for (auto [r, v] : llvm::enumerate(op.getOperands()))
        if (!(fp.buffers[v] == fp.results[r]))
          addCopy(v, fp.results[r], loc);
      continue;
    }
    if (isViewOp(&op) && !fp.buffers.count(op.getResult(0))) {
      // (Copied out first: inserting the result may grow the DenseMap and
      // invalidate a reference to the operand's entry.)
      Buffer operand = fp.buffers.lookup(op.getOperand(0));
      fp.buffers[op.getResult(0)] = operand;
      continue;
    }
    if (op.getDialect() != module.getContext()->getLoadedDialect<nn::NNDialect>())
      return op.emitError("cannot lower '") << op.getName()
                                            << "' inside a stage function";
    for (Value r : op.getResults())
      if (!fp.buffers.count(r)) {
        fp.buffers[r] =
            Buffer{Buffer::Scratch, int64_t(scratchBytes.size()), ""};
        scratchBytes.push_back(
            alignUp(std::max<int64_t>(nn::tensorBytes(r.getType()), 4)));
      }
    auto calls = getKernelCalls(&op);
    if (failed(calls))
      return failure();
    std::string name = locationName(loc);
    auto id = c.opIds.find(name);
    for (KernelCall &call : *calls) {
      Step s{call, {}, id != c.opIds.end() ? c.opBase + id->second : -1, loc};
      for (Value v : call.buffers)
        s.buffers.push_back(v ? fp.buffers.lookup(v)
                              : Buffer{Buffer::Null, 0, ""});
      fp.steps.push_back(std::move(s));
    }
  }
  c.regions.scratch =
      std::max(c.regions.scratch, assignScratch(fp, scratchBytes));
  return success();
}

/// Offsets for the scratch buffers of one function: buffer i lives from
/// the first to the last step that names it (inclusive, so a kernel's
/// output never shares memory with its inputs), and two buffers share
/// bytes only when their lifetimes are disjoint. Largest first, each at the
/// lowest offset free for its whole lifetime. Returns the bytes needed.
int64_t StageLowering::assignScratch(FunctionPlan &fp,
                                     ArrayRef<int64_t> bytes) {
  const size_t n = bytes.size();
  std::vector<int64_t> first(n, -1), last(n, -1);
  for (auto [i, step] : llvm::enumerate(fp.steps))
    for (const Buffer &b : step.buffers)
      if (b.region == Buffer::Scratch) {
        size_t id = size_t(b.offset);
        if (first[id] < 0)
          first[id] = int64_t(i);
        last[id] = int64_t(i);
      }
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i)
    order[i] = i;
  llvm::stable_sort(order, [&](size_t a, size_t b) {
    return bytes[a] != bytes[b] ? bytes[a] > bytes[b] : first[a] < first[b];
  });
  std::vector<int64_t> offset(n, 0);
  std::vector<size_t> placed;
  int64_t total = 0;
  for (size_t id : order) {
    if (first[id] < 0)
      continue; // never touched by a step (e.g. a dead result): no bytes
    std::vector<std::pair<int64_t, int64_t>> busy; // [begin, end) in bytes
    for (size_t other : placed)
      if (first[other] <= last[id] && first[id] <= last[other])
        busy.push_back({offset[other], offset[other] + bytes[other]});
    llvm::sort(busy);
    int64_t at = 0;
    for (auto [begin, end] : busy) {
      if (at + bytes[id] <= begin)
        break;
      at = std::max(at, end);
    }
    offset[id] = at;
    placed.push_back(id);
    total = std::max(total, at + bytes[id]);
  }
  auto fix = [&](Buffer &b) {
    if (b.region == Buffer::Scratch)
      b.offset = offset[size_t(b.offset)];
  };
  for (Step &step : fp.steps)
    for (Buffer &b : step.buffers)
      fix(b);
  for (auto &entry : fp.buffers)
    fix(entry.second);
  return total;
}

/// The groups of device positions that share tied weights (the stages
/// attribute of the pipeline's pipe.tie_reduce ops), in the canonical order
/// every rank numbers them by, and the tied weights (module attribute
/// pipe.tied).
static std::vector<std::vector<int64_t>>
tieGroupsOf(ModuleOp module, pipe::PipelineOp pipeline,
            std::set<std::string> *tiedWeights = nullptr) {
  std::set<std::vector<int64_t>> groups;
  pipeline.walk([&](pipe::TieReduceOp tie) {
    groups.insert(std::vector<int64_t>(tie.getStages().begin(),
                                       tie.getStages().end()));
  });
  if (auto tied = module->getAttrOfType<DictionaryAttr>(pipe::attrs::kTied))
    for (NamedAttribute entry : tied)
      if (tiedWeights)
        tiedWeights->insert(entry.getName().str());
  return {groups.begin(), groups.end()};
}

LogicalResult StageLowering::collect() {
  for (Operation &op : *module.getBody())
    if (auto p = dyn_cast<pipe::PipelineOp>(op))
      pipeline = p;
  if (!pipeline)
    return module.emitError("no pipe.pipeline; run --pipe-build-schedule first");
  tieGroups = tieGroupsOf(module, pipeline, &tiedWeights);
  replicas = 0;
  std::set<int64_t> positions;
  for (Operation &op : pipeline.getBody().front())
    if (auto p = dyn_cast<pipe::ProgramOp>(op)) {
      positions.insert(p.getStage());
      if (p.getStage() != stage)
        continue;
      ++replicas;
      if (p.getReplica() == replica)
        program = p;
    }
  devices = int64_t(positions.size());
  if (!program)
    return module.emitError("the pipeline has no program for stage ")
           << stage << " replica " << replica;
  slots = program.getSlots();
  auto kind = parseScheduleKind(pipeline.getSchedule().str());
  continuous = kind && !isFlushSchedule(*kind);

  // The stages this rank runs: those whose forward its program calls (one,
  // or the v chunks of an interleaved pipeline), in stage order.
  std::set<int64_t> stagesRun;
  WalkResult walk = program.walk([&](pipe::ForwardOp f) {
    auto fn = module.lookupSymbol<func::FuncOp>(f.getFunc());
    auto attr = fn ? fn->getAttrOfType<IntegerAttr>(pipe::attrs::kStage)
                   : IntegerAttr();
    if (!attr) {
      f.emitOpError("calls a function that is not a stage function");
      return WalkResult::interrupt();
    }
    stagesRun.insert(attr.getInt());
    return WalkResult::advance();
  });
  if (walk.wasInterrupted())
    return failure();
  if (stagesRun.empty())
    stagesRun.insert(stage);
  int64_t base = 0, opBase = 0;
  for (int64_t q : stagesRun) {
    auto c = std::make_unique<Chunk>();
    c->stage = q;
    c->opBase = opBase;
    c->regions.slots = slots;
    if (failed(collectChunk(*c)))
      return failure();
    c->base = base;
    base += c->regions.total();
    opBase += int64_t(c->layerOps.size());
    chunks.push_back(std::move(c));
  }
  // Feed numbers index the rank's "feeds" list, across its chunks.
  int64_t feedNumber = 0;
  for (auto &c : chunks)
    for (auto &entry : c->feedArgs)
      entry.second = feedNumber++;
  if (continuous && chunks.size() != 1)
    return program.emitOpError("a continuous schedule runs one stage per rank");
  return success();
}

LogicalResult StageLowering::collectChunk(Chunk &c) {
  int64_t stage = c.stage;
  FunctionPlan &fwd = c.fwd, &bwd = c.bwd, &step = c.step;
  Regions &regions = c.regions;
  fwd.fn = module.lookupSymbol<func::FuncOp>(stageFuncName(stage, "fwd"));
  bwd.fn = module.lookupSymbol<func::FuncOp>(stageFuncName(stage, "bwd"));
  step.fn = module.lookupSymbol<func::FuncOp>(stageFuncName(stage, "step"));
  c.bwdw.fn = module.lookupSymbol<func::FuncOp>(stageFuncName(stage, "bwdw"));
  c.bwdw.phase = 1;
  if (!fwd.fn || !bwd.fn || !step.fn)
    return module.emitError("stage ") << stage
                                      << " lacks its fwd/bwd/step functions";
  if (failed(requireBodies({fwd.fn, bwd.fn, step.fn})) ||
      (c.bwdw.fn && failed(requireBodies({c.bwdw.fn}))))
    return failure();
  fwd.phase = 0;
  bwd.phase = 1;
  step.phase = 2;

  // The versioned prefix of the weights region: globals the forward reads
  // and never writes (its parameters; not e.g. batch-norm running stats).
  {
    llvm::StringSet<> stored;
    fwd.fn.walk([&](ml_program::GlobalStoreOp st) {
      stored.insert(st.getGlobal().getLeafReference().getValue());
    });
    fwd.fn.walk([&](ml_program::GlobalLoadOp load) {
      StringRef name = load.getGlobal().getLeafReference().getValue();
      auto global = module.lookupSymbol<ml_program::GlobalOp>(name);
      if (!stored.contains(name) &&
          !(global && global->hasAttr(pipe::attrs::kGradOf)))
        weightBuffer(c, name, load.getType());
    });
    c.versionedBytes = regions.weights;
  }

  // Op table of the profiler: the stage's layers. Kernels are charged to
  // the first layer of their ONNX node (by location name), whose other
  // layers (a decomposed activation) show zero time.
  for (Operation &op : fwd.fn.getBody().front())
    if (isLayer(&op)) {
      c.opIds.try_emplace(layerName(&op, c.layerOps.size()),
                          c.layerOps.size());
      c.layerOps.push_back(&op);
    }

  // Stash slot layout: forward arguments, then forward results.
  auto fwdType = fwd.fn.getFunctionType();
  for (auto [i, t] : llvm::enumerate(fwdType.getInputs())) {
    fwd.args.push_back(allocate(regions.slot, Buffer::Slots, t));
    if (auto feed = fwd.fn.getArgAttrOfType<IntegerAttr>(i, pipe::attrs::kFeed)) {
      if (feed.getInt() == -2)
        c.rngArgs.push_back(i); // filled by pipec_rt_rng, not a data feed
      else
        c.feedArgs.push_back({static_cast<int64_t>(i),
                              static_cast<int64_t>(c.feedArgs.size())});
    }
  }
  for (auto [i, t] : llvm::enumerate(fwdType.getResults())) {
    fwd.results.push_back(allocate(regions.slot, Buffer::Slots, t));
    if (fwd.fn.getResultAttr(i, pipe::attrs::kLoss))
      c.lossResult = i;
  }
  // A backward argument that is a stashed forward argument or result
  // (pipe.fwd_arg / pipe.fwd_result = index): its buffer, or an error.
  auto stashed = [&](func::FuncOp f, unsigned i,
                     std::optional<Buffer> &out) -> LogicalResult {
    const std::pair<StringRef, SmallVector<Buffer> *> sources[] = {
        {pipe::attrs::kFwdArg, &fwd.args},
        {pipe::attrs::kFwdResult, &fwd.results}};
    for (auto [attr, list] : sources) {
      auto a = f.getArgAttrOfType<IntegerAttr>(i, attr);
      if (!a)
        continue;
      if (a.getInt() < 0 || a.getInt() >= int64_t(list->size()))
        return f.emitError("argument ")
               << i << " of " << f.getSymName() << " names " << attr << " "
               << a.getInt() << ", but " << fwd.fn.getSymName() << " has "
               << list->size();
      out = (*list)[a.getInt()];
    }
    return success();
  };
  auto bwdType = bwd.fn.getFunctionType();
  for (auto [i, t] : llvm::enumerate(bwdType.getInputs())) {
    std::optional<Buffer> kept;
    if (failed(stashed(bwd.fn, i, kept)))
      return failure();
    if (kept)
      bwd.args.push_back(*kept);
    else
      bwd.args.push_back(allocate(regions.io, Buffer::IO, t));
    if (bwd.fn.getArgAttr(i, pipe::attrs::kLossSeed))
      c.lossSeedArg = i;
  }
  // Values carried to the weight half (zero bubble) stay with the
  // microbatch: they live in its stash slot.
  std::map<int64_t, Buffer> carried;
  for (auto [i, t] : llvm::enumerate(bwdType.getResults())) {
    if (auto k = bwd.fn.getResultAttrOfType<IntegerAttr>(i, pipe::attrs::kCarry)) {
      bwd.results.push_back(allocate(regions.slot, Buffer::Slots, t));
      carried[k.getInt()] = bwd.results.back();
    } else {
      bwd.results.push_back(allocate(regions.io, Buffer::IO, t));
    }
  }
  if (c.bwdw.fn)
    for (auto [i, t] : llvm::enumerate(c.bwdw.fn.getFunctionType().getInputs())) {
      func::FuncOp w = c.bwdw.fn;
      std::optional<Buffer> kept;
      if (failed(stashed(w, i, kept)))
        return failure();
      if (kept)
        c.bwdw.args.push_back(*kept);
      else if (auto k = w.getArgAttrOfType<IntegerAttr>(i, pipe::attrs::kCarried);
               k && carried.count(k.getInt()))
        c.bwdw.args.push_back(carried[k.getInt()]);
      else
        return w.emitError("argument ") << i << " of " << w.getSymName()
                                        << " is neither stashed nor carried";
    }
  for (Type t : step.fn.getFunctionType().getInputs())
    step.args.push_back(allocate(regions.io, Buffer::IO, t));

  for (FunctionPlan *fp : c.plans())
    if (failed(planFunction(c, *fp)))
      return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// Emission
//===----------------------------------------------------------------------===//

static Type ptrType(MLIRContext *ctx) { return LLVM::LLVMPointerType::get(ctx); }

/// The kernels with a CUDA twin (runtime/cuda/cuda_kernels.def, the list the
/// CUDA runtime's registry is made from).
static bool hasCudaKernel(StringRef kernel) {
  static const char *const kCuda[] = {
#define PIPEC_CUDA_KERNEL(sym) "pipec_k_" #sym,
#include "../runtime/cuda/cuda_kernels.def"
  };
  for (const char *k : kCuda)
    if (kernel == k)
      return true;
  return false;
}

/// The symbol generated code calls for `kernel` on `target`.
static std::string kernelSymbol(StringRef kernel, StringRef target) {
  if (target == "cuda" && kernel.starts_with("pipec_k_"))
    return ("pipec_cuda_k_" + kernel.drop_front(8)).str();
  return kernel.str();
}

LogicalResult StageLowering::checkTarget() {
  if (!cuda())
    return success();
  if (module->getAttrOfType<StringAttr>("pipec.precision") &&
      module->getAttrOfType<StringAttr>("pipec.precision").getValue() == "f64")
    return module.emitError(
        "--target cuda trains in float32 (--precision f64, the exact "
        "reference mode, runs on the CPU target only)");
  // Every kernel the stage calls must have a CUDA twin; name the ops that
  // call one that has none.
  std::map<std::string, std::vector<std::string>> missing;
  for (auto &c : chunks)
    for (FunctionPlan *fp : c->plans())
      for (Step &st : fp->steps)
        if (!hasCudaKernel(st.call.kernel)) {
          auto &ops = missing[st.call.kernel];
          std::string op = locationName(st.loc);
          if (ops.size() < 3 && llvm::find(ops, op) == ops.end())
            ops.push_back(op);
        }
  if (missing.empty())
    return success();
  std::string text;
  for (auto &[kernel, ops] : missing) {
    text += (text.empty() ? "" : "; ") + kernel + " (" + llvm::join(ops, ", ") +
            ")";
  }
  return module.emitError("--target cuda: no CUDA kernel yet for ")
         << text
         << "; compile with --target cpu, or see runtime/README.md "
            "(\"CUDA\") for the kernels that exist";
}

void StageLowering::emitDeclarations() {
  MLIRContext *ctx = module.getContext();
  Type ptr = ptrType(ctx), i64t = b.getI64Type(), i32t = b.getI32Type();
  OpBuilder db = OpBuilder::atBlockEnd(module.getBody());
  auto declare = [&](StringRef name, ArrayRef<Type> ins, ArrayRef<Type> outs) {
    if (module.lookupSymbol(name))
      return;
    auto fn = func::FuncOp::create(db, module.getLoc(), name,
                                   db.getFunctionType(ins, outs));
    fn.setPrivate();
  };
  std::set<std::string> kernels;
  for (auto &c : chunks)
    for (FunctionPlan *fp : c->plans())
      for (Step &s : fp->steps)
        kernels.insert(s.call.kernel);
  for (const std::string &k : kernels)
    declare(kernelSymbol(k, target), {ptr, ptr, ptr}, {});
  if (cuda())
    declare("pipec_rt_constant", {ptr, ptr, i64t}, {ptr});
  declare("pipec_rt_feed", {ptr, i64t, i64t, ptr}, {});
  declare("pipec_rt_send", {ptr, i64t, i64t, i64t, ptr, i64t}, {});
  declare("pipec_rt_recv", {ptr, i64t, i64t, i64t, ptr, i64t}, {});
  declare("pipec_rt_recv_post", {ptr, i64t, i64t, i64t, i64t}, {});
  declare("pipec_rt_flush", {ptr}, {});
  declare("pipec_rt_loss", {ptr, i64t, ptr}, {});
  declare("pipec_rt_loss_seed", {ptr, ptr}, {});
  declare("pipec_rt_lr", {ptr, ptr}, {});
  declare("pipec_rt_step", {ptr, ptr}, {});
  declare("pipec_rt_rng", {ptr, i64t, ptr}, {});
  declare("pipec_rt_global_mb", {ptr, i64t}, {i64t});
  declare("pipec_rt_weights", {ptr, i64t, i64t, ptr}, {ptr});
  declare("pipec_rt_release", {ptr, i64t}, {});
  declare("pipec_rt_update", {ptr}, {});
  declare("pipec_rt_allreduce", {ptr, ptr, i64t}, {});
  declare("pipec_rt_allreduce_mean", {ptr, ptr, i64t}, {});
  declare("pipec_rt_allreduce_group", {ptr, i64t, ptr, i64t}, {});
  declare("pipec_rt_op_begin", {ptr, i64t, i64t}, {});
  declare("pipec_rt_span_begin", {ptr, i64t, i64t}, {});
  declare("pipec_rt_span_end", {ptr, i64t}, {});
  declare("pipec_rt_op_end", {ptr, i64t, i64t}, {});
  auto programType = db.getFunctionType({ptr, ptr}, {});
  declare(cuda() ? "pipec_rt_cuda_main" : "pipec_rt_main",
          {i32t, ptr, ptr, programType}, {i32t});
}

Value StageLowering::i64(OpBuilder &ob, Location loc, int64_t v) {
  return LLVM::ConstantOp::create(ob, loc, ob.getI64Type(),
                                  ob.getI64IntegerAttr(v));
}

Value StageLowering::pointer(OpBuilder &ob, Location loc, const Chunk &c,
                             const Buffer &buf, Value arena, Value slot,
                             Value wbase) {
  const Regions &regions = c.regions;
  MLIRContext *ctx = module.getContext();
  Type ptr = ptrType(ctx);
  switch (buf.region) {
  case Buffer::Null:
  case Buffer::None:
    return LLVM::ZeroOp::create(ob, loc, ptr);
  case Buffer::Const:
    return LLVM::AddressOfOp::create(ob, loc, ptr, buf.symbol);
  default:
    break;
  }
  int64_t base = c.base + buf.offset;
  Value offset;
  if (buf.region == Buffer::Weights)
    base += 0;
  else if (buf.region == Buffer::Slots)
    base += regions.slotBase();
  else if (buf.region == Buffer::IO)
    base += regions.ioBase();
  else
    base += regions.scratchBase();
  offset = i64(ob, loc, base);
  if (buf.region == Buffer::Weights && wbase && buf.offset < c.versionedBytes)
    return LLVM::GEPOp::create(ob, loc, ptr, ob.getI8Type(), wbase,
                               ValueRange{offset});
  if (buf.region == Buffer::Slots) {
    Value stride = i64(ob, loc, alignUp(regions.slot));
    Value slotOff = LLVM::MulOp::create(ob, loc, slot, stride);
    offset = LLVM::AddOp::create(ob, loc, offset, slotOff);
  }
  return LLVM::GEPOp::create(ob, loc, ptr, ob.getI8Type(), arena,
                             ValueRange{offset});
}

Value StageLowering::constArray(OpBuilder &ob, Location loc,
                                ArrayRef<int64_t> ints) {
  Type ptr = ptrType(module.getContext());
  if (ints.empty())
    return LLVM::ZeroOp::create(ob, loc, ptr);
  std::vector<int64_t> key(ints.begin(), ints.end());
  auto it = intArrays.find(key);
  if (it == intArrays.end()) {
    std::string name = "__pipec_ints_" + std::to_string(intArrays.size());
    OpBuilder gb = OpBuilder::atBlockBegin(module.getBody());
    auto tensor = RankedTensorType::get({(int64_t)ints.size()}, gb.getI64Type());
    LLVM::GlobalOp::create(
        gb, loc, LLVM::LLVMArrayType::get(gb.getI64Type(), ints.size()), true,
        LLVM::Linkage::Internal, name, DenseElementsAttr::get(tensor, ints));
    it = intArrays.emplace(key, name).first;
  }
  return LLVM::AddressOfOp::create(ob, loc, ptr, it->second);
}

Value StageLowering::constArray(OpBuilder &ob, Location loc,
                                ArrayRef<double> reals) {
  Type ptr = ptrType(module.getContext());
  if (reals.empty())
    return LLVM::ZeroOp::create(ob, loc, ptr);
  std::vector<double> key(reals.begin(), reals.end());
  auto it = realArrays.find(key);
  if (it == realArrays.end()) {
    std::string name = "__pipec_reals_" + std::to_string(realArrays.size());
    OpBuilder gb = OpBuilder::atBlockBegin(module.getBody());
    auto tensor = RankedTensorType::get({(int64_t)reals.size()}, gb.getF64Type());
    LLVM::GlobalOp::create(
        gb, loc, LLVM::LLVMArrayType::get(gb.getF64Type(), reals.size()), true,
        LLVM::Linkage::Internal, name, DenseElementsAttr::get(tensor, reals));
    it = realArrays.emplace(key, name).first;
  }
  return LLVM::AddressOfOp::create(ob, loc, ptr, it->second);
}

func::FuncOp StageLowering::emitStageFunction(Chunk &c, FunctionPlan &fp) {
  MLIRContext *ctx = module.getContext();
  Type ptr = ptrType(ctx);
  OpBuilder fb = OpBuilder::atBlockEnd(module.getBody());
  std::string name = "pipec_" + fp.fn.getSymName().str();
  auto fn = func::FuncOp::create(
      fb, fp.fn.getLoc(), name,
      fb.getFunctionType({ptr, ptr, fb.getI64Type(), ptr}, {}));
  fn.setPrivate();
  Block *entry = fn.addEntryBlock();
  OpBuilder ob = OpBuilder::atBlockEnd(entry);
  Value ctxArg = entry->getArgument(0), arena = entry->getArgument(1),
        slot = entry->getArgument(2), wbase = entry->getArgument(3);
  Value one = i64(ob, fp.fn.getLoc(), 1);
  for (Step &s : fp.steps) {
    Location loc = s.loc;
    if (s.opId >= 0)
      func::CallOp::create(ob, loc, "pipec_rt_op_begin", TypeRange{},
                           ValueRange{ctxArg, i64(ob, loc, s.opId),
                                      i64(ob, loc, fp.phase)});
    auto arrayType = LLVM::LLVMArrayType::get(ptr, s.buffers.size());
    Value bufs = LLVM::AllocaOp::create(ob, loc, ptr, arrayType, one);
    for (auto [i, buf] : llvm::enumerate(s.buffers)) {
      Value p = pointer(ob, loc, c, buf, arena, slot, wbase);
      if (buf.region == Buffer::Const && cuda())
        p = func::CallOp::create(ob, loc, "pipec_rt_constant", TypeRange{ptr},
                                 ValueRange{ctxArg, p, i64(ob, loc, buf.bytes)})
                .getResult(0);
      Value elem = LLVM::GEPOp::create(
          ob, loc, ptr, arrayType, bufs,
          ArrayRef<LLVM::GEPArg>{0, static_cast<int32_t>(i)});
      LLVM::StoreOp::create(ob, loc, p, elem);
    }
    Value ints = constArray(ob, loc, ArrayRef<int64_t>(s.call.ints));
    Value reals = constArray(ob, loc, ArrayRef<double>(s.call.reals));
    func::CallOp::create(ob, loc, kernelSymbol(s.call.kernel, target),
                         TypeRange{}, ValueRange{bufs, ints, reals});
    if (s.opId >= 0)
      func::CallOp::create(ob, loc, "pipec_rt_op_end", TypeRange{},
                           ValueRange{ctxArg, i64(ob, loc, s.opId),
                                      i64(ob, loc, fp.phase)});
  }
  func::ReturnOp::create(ob, fp.fn.getLoc());
  return fn;
}

/// The microbatch operand (null if none) and the stage function a pipe op
/// names (empty if none).
static std::pair<Value, StringRef> microbatchAndCallee(Operation *op) {
  return llvm::TypeSwitch<Operation *, std::pair<Value, StringRef>>(op)
      .Case<pipe::SendOp, pipe::RecvOp, pipe::ForwardOp, pipe::BackwardOp,
            pipe::BackwardWeightOp, pipe::StepOp>([](auto o) {
        return std::make_pair(Value(o.getMicrobatch()), o.getFunc());
      })
      .Case<pipe::AllReduceOp>([](pipe::AllReduceOp o) {
        return std::make_pair(Value(o.getMicrobatch()), StringRef());
      })
      .Default([](Operation *) { return std::make_pair(Value(), StringRef()); });
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

/// One lowered stage function inside a profiler span of `phase` (0
/// forward, 1 backward, 2 update).
void StageLowering::emitRun(Site &s, int64_t phase, func::FuncOp fn,
                            Value weights) {
  s.call("pipec_rt_span_begin", {s.ctx, i64(s.pb, s.loc, phase), s.mb});
  s.call(fn.getSymName(), {s.ctx, s.arena, s.slot, weights});
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
  s.call(c.lowered[2].getSymName(), {s.ctx, s.arena, zero, s.arena});
  s.call("pipec_rt_span_end", {s.ctx, i64(pb, s.loc, 2)});
}

/// The stage description's policy (pipec/formats/StagePolicy.h): what the
/// runtime does, stated explicitly instead of derived from the schedule's
/// name.
formats::StagePolicy StageLowering::policy() {
  using formats::UpdateRule;
  auto kind = parseScheduleKind(pipeline.getSchedule().str());
  formats::StagePolicy policy;
  policy.flush = !kind || isFlushSchedule(*kind);
  policy.update = policy.flush                   ? UpdateRule::Flush
                  : *kind == ScheduleKind::TwoBW ? UpdateRule::TwoBW
                                                 : UpdateRule::PerMicrobatch;
  if (!kind)
    return policy;
  // Steady state over many batches (the run's --steps is not known here).
  ScheduleOptions options;
  options.steps = int64_t(1) << 20;
  if (!policy.flush) {
    std::map<int64_t, int> perStage;
    for (Operation &op : pipeline.getBody().front())
      if (auto p = dyn_cast<pipe::ProgramOp>(op))
        ++perStage[p.getStage()];
    for (auto [s, r] : perStage)
      options.replicas.push_back(r);
  }
  policy.versionsKept = closedFormWeightVersions(
      *kind, int(devices), int(stage), pipeline.getMicrobatches(), options);
  return policy;
}

/// The feeds of this rank's chunks, in chunk order (as collect() numbered
/// them).
void StageLowering::describeFeeds(formats::StageDesc &d, int64_t &microbatch) {
  auto inputNames = module->getAttrOfType<ArrayAttr>("pipec.inputs");
  for (auto &c : chunks)
    for (auto [arg, feedIndex] : c->feedArgs) {
      FunctionPlan &fwd = c->fwd;
      auto tt = cast<RankedTensorType>(fwd.fn.getArgumentTypes()[arg]);
      if (tt.getRank() > 0)
        microbatch = tt.getDimSize(0);
      int64_t which =
          fwd.fn.getArgAttrOfType<IntegerAttr>(arg, pipe::attrs::kFeed).getInt();
      formats::FeedSpec f;
      f.shape.assign(tt.getShape().begin(), tt.getShape().end());
      f.isInt = tt.getElementType().isInteger(64);
      if (which < 0) {
        f.kind = formats::FeedSpec::Kind::Labels;
        f.name = "labels";
        f.classes = labelClasses(fwd.fn.getArgument(arg));
        d.feeds.push_back(std::move(f));
        continue;
      }
      f.kind = formats::FeedSpec::Kind::Input;
      f.index = which;
      // Integer inputs (token ids) are bounded by the table they index;
      // others (ids compared with a padding id, bool masks) draw synthetic
      // values from {0, 1}.
      f.classes = 2;
      for (Operation *user : fwd.fn.getArgument(arg).getUsers())
        if (auto gather = dyn_cast<nn::GatherOp>(user))
          if (gather.getIndices() == fwd.fn.getArgument(arg)) {
            auto data = cast<RankedTensorType>(gather.getData().getType());
            int64_t axis = int64_t(gather.getAxis());
            f.classes =
                data.getDimSize(axis < 0 ? axis + data.getRank() : axis);
          }
      f.name = inputNames && which < (int64_t)inputNames.size()
                   ? cast<StringAttr>(inputNames[which]).str()
                   : "input" + std::to_string(which);
      d.feeds.push_back(std::move(f));
    }
}

/// The ops of this rank's chunks (profiler metadata).
void StageLowering::describeOps(formats::StageDesc &d) {
  llvm::DenseMap<Operation *, std::string> names;
  SmallVector<Operation *> layerOps;
  for (auto &c : chunks)
    layerOps.append(c->layerOps.begin(), c->layerOps.end());
  for (auto [op, name] : llvm::zip(layerOps, uniqueLayerNames(layerOps)))
    names[op] = name;
  for (Operation *op : layerOps) {
    formats::OpSpec spec;
    spec.name = names[op];
    spec.op = op->getName().stripDialect().str();
    for (Value v : op->getOperands())
      if (Operation *def = v.getDefiningOp(); def && names.count(def))
        spec.inputs.push_back(names[def]);
    if (auto cost = op->getAttrOfType<nn::CostAttr>("nn.cost")) {
      spec.outBytes = cost.getOutBytes();
      spec.paramBytes = cost.getParamBytes();
      spec.savedBytes = cost.getSavedBytes();
    } else {
      for (Value r : op->getResults())
        spec.outBytes += nn::tensorBytes(r.getType());
    }
    d.ops.push_back(std::move(spec));
  }
}

/// The stage description (pipec.stage/2, pipec/formats/Documents.h) that
/// travels inside the executable.
std::string StageLowering::stageMeta() {
  formats::StageDesc d;
  d.buildId = buildId;
  d.stage = int(stage);
  d.replica = replica;
  d.replicas = replicas;
  d.numStages = int(devices);
  d.chunks = int64_t(chunks.size());
  d.vPlacement = pipeline.getPlacement() && *pipeline.getPlacement() == "v";
  d.microbatches = pipeline.getMicrobatches();
  d.windowReach = pipe::windowReach(pipeline);
  // Every rank creates one communicator per group, in this order.
  d.tieGroups = tieGroups;
  d.schedule = pipeline.getSchedule().str();
  d.policy = policy();
  d.replicaSplit = pipeline.getSplitSamples().has_value();
  d.slots = slots;
  d.versionedBytes = chunks.front()->versionedBytes;
  d.arenaBytes = arenaBytes();
  // The float type of every float tensor (--nn-convert-precision).
  auto precision = module->getAttrOfType<StringAttr>("pipec.precision");
  d.realBytes = precision && precision.getValue() == "f64" ? 8 : 4;
  d.target = target;
  int64_t microbatch = 0;
  describeFeeds(d, microbatch);
  // The importer records the samples per microbatch; a stage's own
  // tensors may not start with it (a [B*T, d] boundary of a transformer).
  if (auto samples = module->getAttrOfType<IntegerAttr>("pipec.microbatch"))
    microbatch = samples.getInt();
  // Split replicas: this binary's tensors hold its slice; the microbatch
  // is the pipeline's.
  if (auto split = pipeline.getSplitSamples())
    microbatch = *split;
  if (microbatch == 0)
    for (Type t : chunks.front()->fwd.fn.getArgumentTypes())
      if (auto tt = cast<RankedTensorType>(t); tt.getRank() > 0) {
        microbatch = tt.getDimSize(0);
        break;
      }
  d.microbatch = microbatch;
  d.globalBatch = microbatch * d.microbatches;
  for (auto &c : chunks)
    for (const std::string &name : c->weightOrder) {
      auto &[offset, type] = c->weights[name];
      auto global = module.lookupSymbol<ml_program::GlobalOp>(name);
      if (global && global->hasAttr(pipe::attrs::kGradOf))
        continue; // gradient accumulators start at zero; not checkpointed
      auto shape = cast<RankedTensorType>(type).getShape();
      d.weights.push_back({name, c->base + offset,
                           std::vector<int64_t>(shape.begin(), shape.end()), 0});
    }
  for (auto &c : chunks)
    d.loss |= c->lossResult >= 0;
  describeOps(d);
  return formats::writeStageDesc(d);
}

void StageLowering::emitMain() {
  MLIRContext *ctx = module.getContext();
  Type ptr = ptrType(ctx);
  std::string meta = stageMeta();
  meta.push_back('\0');
  OpBuilder gb = OpBuilder::atBlockBegin(module.getBody());
  LLVM::GlobalOp::create(
      gb, module.getLoc(), LLVM::LLVMArrayType::get(gb.getI8Type(), meta.size()),
      true, LLVM::Linkage::Internal, "pipec_stage_meta",
      gb.getStringAttr(meta));
  OpBuilder fb = OpBuilder::atBlockEnd(module.getBody());
  auto mainFn = func::FuncOp::create(
      fb, module.getLoc(), "main",
      fb.getFunctionType({fb.getI32Type(), ptr}, {fb.getI32Type()}));
  Block *entry = mainFn.addEntryBlock();
  OpBuilder ob = OpBuilder::atBlockEnd(entry);
  Location loc = module.getLoc();
  Value metaPtr = LLVM::AddressOfOp::create(ob, loc, ptr, "pipec_stage_meta");
  auto programType = ob.getFunctionType({ptr, ptr}, {});
  Value programFn =
      func::ConstantOp::create(ob, loc, programType, "pipec_program");
  auto rc = func::CallOp::create(
      ob, loc, cuda() ? "pipec_rt_cuda_main" : "pipec_rt_main",
      TypeRange{ob.getI32Type()},
      ValueRange{entry->getArgument(0), entry->getArgument(1), metaPtr,
                 programFn});
  func::ReturnOp::create(ob, loc, rc.getResult(0));
}

FailureOr<ArenaPlan> StageLowering::planArena() {
  if (failed(collect()))
    return failure();
  ArenaPlan plan;
  plan.slots = slots;
  for (const auto &c : chunks) {
    plan.weights += c->regions.weights;
    plan.slotBytes += alignUp(c->regions.slot);
    plan.io += c->regions.io;
    plan.scratch += c->regions.scratch;
  }
  plan.total = arenaBytes();
  plan.chunks = int64_t(chunks.size());
  return plan;
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
