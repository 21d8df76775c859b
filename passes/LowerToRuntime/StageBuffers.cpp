//===- StageBuffers.cpp - What a stage holds, and where -------------------===//
//
// Part of --pipe-lower-to-runtime (LowerToRuntime/StageLowering.h).
//
//===----------------------------------------------------------------------===//

#include "passes/LowerToRuntime/StageLowering.h"
#include "pipec/Schedule.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallPtrSet.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;
using namespace pipec;
using namespace pipec::lowering;

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
    it =
        c.weights.emplace(global.str(), std::make_pair(c.regions.weights, type))
            .first;
    c.weightOrder.push_back(global.str());
    c.regions.weights += alignUp(nn::tensorBytes(type));
  }
  return Buffer{Buffer::Weights, it->second.first, ""};
}

Buffer StageLowering::constBuffer(nn::ConstantOp op) {
  auto type = cast<RankedTensorType>(op.getType());
  std::string name = "__pipec_const_" + std::to_string(constCounter++);
  auto flat =
      RankedTensorType::get({type.getNumElements()}, type.getElementType());
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
    // A returned view (a reshape of a result): the value it views is
    // computed into the result instead, unless that value is returned
    // itself (else it would sit in scratch until the return copied it).
    Value root = v;
    while (root.getDefiningOp() && isViewOp(root.getDefiningOp()) &&
           returnUses[v] == 1)
      root = root.getDefiningOp()->getOperand(0);
    Operation *def = root.getDefiningOp();
    if (!def || isViewOp(def) ||
        isa<ml_program::GlobalLoadOp, nn::ConstantOp>(def) ||
        returnUses[v] != 1 || (root != v && returnUses.count(root)) ||
        fp.buffers.count(root))
      continue;
    fp.buffers[root] = fp.results[r];
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
           {fp.buffers[from], to},
           -1,
           loc};
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
      Buffer target =
          weightBuffer(c, store.getGlobal().getLeafReference().getValue(),
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
    if (op.getDialect() !=
        module.getContext()->getLoadedDialect<nn::NNDialect>())
      return op.emitError("cannot lower '")
             << op.getName() << "' inside a stage function";
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
      std::max(c.regions.scratch, assignScratch(c, fp, scratchBytes));
  return success();
}

/// The layer whose kernels compute `v` (through views), or -1. A view of
/// a function argument (a flatten of the data feed, of a received input)
/// is copied into its stash slot by the view's own layer: charged to it.
static int64_t layerOf(const Chunk &c, Value v) {
  auto idOf = [&](Operation *op) -> int64_t {
    auto it = c.opIds.find(locationName(op->getLoc()));
    return it == c.opIds.end() ? -1 : it->second;
  };
  Operation *def = v.getDefiningOp();
  int64_t outerView = -1;
  while (def && isViewOp(def) && def->getNumOperands() > 0) {
    if (outerView < 0)
      outerView = idOf(def);
    def = def->getOperand(0).getDefiningOp();
  }
  if (!def)
    return outerView;
  return idOf(def);
}

/// Charges every stashed forward result (pipe.saved) to the layer that
/// computes it, with the bytes it takes in a stash slot.
void StageLowering::attributeStash(Chunk &c) {
  c.layerSaved.assign(c.layerOps.size(), 0);
  auto ret = cast<func::ReturnOp>(c.fwd.fn.getBody().front().getTerminator());
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    if (!c.fwd.fn.getResultAttr(unsigned(i), "pipe.saved"))
      continue;
    int64_t layer = layerOf(c, v);
    if (layer >= 0)
      c.layerSaved[size_t(layer)] +=
          alignUp(std::max<int64_t>(nn::tensorBytes(v.getType()), 4));
  }
}

/// Zero-bubble schedules split a stage's backward (passes/SplitBackward.cpp)
/// into the input half and the weight half, which reads, besides the stash,
/// values the input half computed: they are carried in the stash slot. For
/// the profile's memory model this estimates them on the unsplit backward,
/// as if the stage's inputs needed gradients (every stage's but the first
/// do): the input half is every op that reads a weight (an input gradient
/// such as dY.W^T) or feeds one that does; the other ops form the weight
/// half, and every input-half value they read is carried, charged to the
/// layer of the op that reads it. A layer with weights that reads a float
/// activation but computes no gradient of it (its input needs none here:
/// the MLP's first GEMM on the model input) would, with input gradients,
/// read the weight and what its backward reads (dY.W^T): what feeds its
/// backward belongs to the input half too.
void StageLowering::attributeCarried(Chunk &c) {
  c.layerCarried.assign(c.layerOps.size(), 0);
  if (c.bwdw.fn)
    return; // already split: its carried values are in the slot
  Block &body = c.bwd.fn.getBody().front();
  auto isWeight = [&](Value v) {
    auto load = v.getDefiningOp<ml_program::GlobalLoadOp>();
    auto global =
        load ? module.lookupSymbol<ml_program::GlobalOp>(load.getGlobal())
             : ml_program::GlobalOp();
    return global && !global->hasAttr(pipe::attrs::kGradOf);
  };
  auto readsWeight = [&](Operation &op) {
    return llvm::any_of(op.getOperands(), isWeight);
  };
  auto cloneable = [](Operation &op) {
    return isa<ml_program::GlobalLoadOp, ml_program::GlobalStoreOp,
               nn::ConstantOp>(op);
  };
  auto layerOf = [&](Operation &op) -> int64_t {
    auto layer = c.opIds.find(locationName(op.getLoc()));
    return layer == c.opIds.end() ? -1 : layer->second;
  };
  // The layers whose backward leaves out an input gradient that reads a
  // weight (no op of theirs in the backward reads one).
  llvm::DenseSet<int64_t> withoutInputGradient, readingWeights;
  for (Operation &op : body.without_terminator())
    if (readsWeight(op))
      readingWeights.insert(layerOf(op));
  for (auto [layer, op] : llvm::enumerate(c.layerOps)) {
    bool floatActivation = llvm::any_of(op->getOperands(), [&](Value v) {
      auto type = dyn_cast<RankedTensorType>(v.getType());
      return type && isa<FloatType>(type.getElementType()) && !isWeight(v) &&
             !v.getDefiningOp<nn::ConstantOp>();
    });
    if (readsWeight(*op) && floatActivation &&
        !readingWeights.count(int64_t(layer)))
      withoutInputGradient.insert(int64_t(layer));
  }
  llvm::SmallPtrSet<Operation *, 32> inputHalf;
  for (Operation &op : llvm::reverse(body.without_terminator())) {
    if (cloneable(op))
      continue;
    const int64_t layer = layerOf(op);
    if (readsWeight(op) || llvm::any_of(op.getUsers(), [&](Operation *user) {
          if (inputHalf.count(user))
            return true;
          const int64_t reader = layerOf(*user);
          return !cloneable(*user) && reader != layer &&
                 withoutInputGradient.count(reader);
        }))
      inputHalf.insert(&op);
  }
  llvm::DenseSet<Value> counted;
  for (Operation &op : body.without_terminator()) {
    if (inputHalf.count(&op) || cloneable(op))
      continue;
    auto layer = c.opIds.find(locationName(op.getLoc()));
    for (Value v : op.getOperands()) {
      Operation *def = v.getDefiningOp();
      if (!def || !inputHalf.count(def) || layer == c.opIds.end() ||
          !counted.insert(v).second)
        continue;
      c.layerCarried[size_t(layer->second)] +=
          alignUp(std::max<int64_t>(nn::tensorBytes(v.getType()), 4));
    }
  }
}

/// For the profile's memory model of recomputation, which stashes less and
/// recomputes the rest at the start of the backward, in scratch: the layer
/// whose backward reads each stashed forward result last (a recomputed
/// value lives until that read: it is the one layer whose working set it
/// joins for part of its steps), and each layer's backward working set
/// with the stashed values it reads last in scratch until their last read.
/// A backward step of no layer (a transpose the autodiff added) belongs to
/// the layer of the step before it.
void StageLowering::attributeSavedReads(Chunk &c) {
  const size_t layers = c.layerOps.size();
  c.layerSavedReads.assign(layers, {});
  c.layerScratchBwdRecomputed.assign(c.layerScratchBwd.begin(),
                                     c.layerScratchBwd.end());
  c.layerScratchBwdRecomputed.resize(layers, 0);
  const std::vector<Step> &steps = c.bwd.steps;
  std::vector<int64_t> layerAt(steps.size(), -1);
  int64_t current = -1;
  auto ownLayer = [&](const Step &step) -> int64_t {
    const int64_t layer = step.opId - c.opBase;
    return step.opId >= 0 && layer < int64_t(layers) ? layer : -1;
  };
  for (auto [i, step] : llvm::enumerate(steps)) {
    if (ownLayer(step) >= 0)
      current = ownLayer(step);
    layerAt[i] = current;
  }
  // (last step reading it, bytes) of the values each layer reads last.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> released(layers);
  auto ret = cast<func::ReturnOp>(c.fwd.fn.getBody().front().getTerminator());
  for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
    const int64_t owner = layerOf(c, v);
    if (!c.fwd.fn.getResultAttr(unsigned(i), "pipe.saved") || owner < 0 ||
        i >= c.fwd.results.size())
      continue;
    const Buffer &slot = c.fwd.results[i];
    int64_t last = -1;
    for (auto [j, step] : llvm::enumerate(steps))
      if (llvm::is_contained(step.buffers, slot))
        last = int64_t(j);
    const int64_t reader =
        last >= 0 && layerAt[size_t(last)] >= 0 ? layerAt[size_t(last)] : owner;
    const int64_t bytes =
        alignUp(std::max<int64_t>(nn::tensorBytes(v.getType()), 4));
    c.layerSavedReads[size_t(owner)].push_back({reader - owner, bytes});
    if (last >= 0)
      released[size_t(reader)].push_back({last, bytes});
  }
  for (auto [i, step] : llvm::enumerate(steps)) {
    const int64_t layer = ownLayer(step);
    if (layer < 0 || i >= c.bwd.scratchLive.size())
      continue;
    int64_t live = c.bwd.scratchLive[i];
    for (auto [last, bytes] : released[size_t(layer)])
      if (last >= int64_t(i))
        live += bytes;
    int64_t &peak = c.layerScratchBwdRecomputed[size_t(layer)];
    peak = std::max(peak, live);
  }
}

/// Offsets for the scratch buffers of one function: buffer i lives from
/// the first to the last step that names it, and two buffers share bytes
/// only when their lifetimes are disjoint (packByLifetime,
/// include/pipec/Arena.h). Returns the bytes needed.
int64_t StageLowering::assignScratch(Chunk &c, FunctionPlan &fp,
                                     ArrayRef<int64_t> bytes) {
  std::vector<ScratchBuffer> scratch(bytes.size());
  for (auto [i, b] : llvm::enumerate(bytes))
    scratch[i].bytes = b;
  for (auto [i, step] : llvm::enumerate(fp.steps))
    for (const Buffer &b : step.buffers)
      if (b.region == Buffer::Scratch) {
        ScratchBuffer &sb = scratch[size_t(b.offset)];
        if (sb.first < 0)
          sb.first = int64_t(i);
        sb.last = int64_t(i);
      }
  // Scratch bytes live at each step (for the profile's memory model).
  fp.scratchLive = liveScratchBytes(scratch);
  fp.scratchLive.resize(fp.steps.size(), 0);
  SmallVector<int64_t> &perLayer =
      fp.phase == 0 ? c.layerScratchFwd : c.layerScratchBwd;
  perLayer.resize(c.layerOps.size(), 0);
  for (auto [i, step] : llvm::enumerate(fp.steps)) {
    int64_t layer = step.opId - c.opBase;
    // The optimizer's steps (phase 2) are charged time, not a layer's
    // working set.
    if (fp.phase <= 1 && step.opId >= 0 && layer < int64_t(perLayer.size()))
      perLayer[size_t(layer)] =
          std::max(perLayer[size_t(layer)], fp.scratchLive[i]);
  }
  int64_t total = 0;
  std::vector<int64_t> offset = packByLifetime(scratch, total);
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
    groups.insert(
        std::vector<int64_t>(tie.getStages().begin(), tie.getStages().end()));
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
    return module.emitError(
        "no pipe.pipeline; run --pipe-build-schedule first");
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
    return module.emitError("stage ")
           << stage << " lacks its fwd/bwd/step functions";
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
      c.opIds.try_emplace(layerName(&op, c.layerOps.size()), c.layerOps.size());
      c.layerOps.push_back(&op);
    }

  // Stash slot layout: forward arguments, then forward results.
  auto fwdType = fwd.fn.getFunctionType();
  for (auto [i, t] : llvm::enumerate(fwdType.getInputs())) {
    fwd.args.push_back(allocate(regions.slot, Buffer::Slots, t));
    if (auto feed =
            fwd.fn.getArgAttrOfType<IntegerAttr>(i, pipe::attrs::kFeed)) {
      if (feed.getInt() == -2)
        c.rngArgs.push_back(i); // filled by pipec_rt_rng, not a data feed
      else
        c.feedArgs.push_back(
            {static_cast<int64_t>(i), static_cast<int64_t>(c.feedArgs.size())});
    }
  }
  for (auto [i, t] : llvm::enumerate(fwdType.getResults())) {
    fwd.results.push_back(allocate(regions.slot, Buffer::Slots, t));
    if (fwd.fn.getResultAttr(i, pipe::attrs::kLoss))
      c.lossResult = i;
  }
  attributeStash(c);
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
    if (auto k =
            bwd.fn.getResultAttrOfType<IntegerAttr>(i, pipe::attrs::kCarry)) {
      bwd.results.push_back(allocate(regions.slot, Buffer::Slots, t));
      carried[k.getInt()] = bwd.results.back();
    } else {
      bwd.results.push_back(allocate(regions.io, Buffer::IO, t));
    }
  }
  if (c.bwdw.fn)
    for (auto [i, t] :
         llvm::enumerate(c.bwdw.fn.getFunctionType().getInputs())) {
      func::FuncOp w = c.bwdw.fn;
      std::optional<Buffer> kept;
      if (failed(stashed(w, i, kept)))
        return failure();
      if (kept)
        c.bwdw.args.push_back(*kept);
      else if (auto k =
                   w.getArgAttrOfType<IntegerAttr>(i, pipe::attrs::kCarried);
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
  fuseUpdates(c.step);
  attributeCarried(c);
  attributeSavedReads(c);
  return success();
}
