//===- StageDescription.cpp - The stage description and main --------------===//
//
// Part of --pipe-lower-to-runtime (LowerToRuntime/StageLowering.h).
//
//===----------------------------------------------------------------------===//

#include "passes/LowerToRuntime/StageLowering.h"
#include "pipec/Schedule.h"

#include "llvm/Support/JSON.h"

using namespace mlir;
using namespace pipec;
using namespace pipec::lowering;

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
          fwd.fn.getArgAttrOfType<IntegerAttr>(arg, pipe::attrs::kFeed)
              .getInt();
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
  SmallVector<int64_t> saved, fwdScratch, bwdScratch, carried, bwdRecomputed;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> savedReads;
  for (auto &c : chunks) {
    layerOps.append(c->layerOps.begin(), c->layerOps.end());
    auto add = [&](SmallVector<int64_t> &all, const SmallVector<int64_t> &v) {
      all.append(v.begin(), v.end());
      all.resize(layerOps.size(), 0);
    };
    add(saved, c->layerSaved);
    add(fwdScratch, c->layerScratchFwd);
    add(bwdScratch, c->layerScratchBwd);
    add(carried, c->layerCarried);
    add(bwdRecomputed, c->layerScratchBwdRecomputed);
    savedReads.insert(savedReads.end(), c->layerSavedReads.begin(),
                      c->layerSavedReads.end());
    savedReads.resize(layerOps.size());
  }
  for (auto [op, name] : llvm::zip(layerOps, uniqueLayerNames(layerOps)))
    names[op] = name;
  for (auto [i, op] : llvm::enumerate(layerOps)) {
    formats::OpSpec spec;
    spec.name = names[op];
    spec.op = op->getName().stripDialect().str();
    for (Value v : op->getOperands()) {
      Operation *def = v.getDefiningOp();
      while (def && isStorageCast(def)) // --activations bf16
        def = def->getOperand(0).getDefiningOp();
      if (def && names.count(def))
        spec.inputs.push_back(names[def]);
    }
    if (auto cost = op->getAttrOfType<nn::CostAttr>("nn.cost")) {
      spec.outBytes = cost.getOutBytes();
      spec.paramBytes = cost.getParamBytes();
    } else {
      for (Value r : op->getResults())
        spec.outBytes += nn::tensorBytes(r.getType());
    }
    // --activations bf16: a result stored in bfloat16 (a view of a bf16
    // value, or rounded by the cast after the op) takes 2 bytes an
    // element; the cost annotation counted it in float32, before the
    // conversion (the sum of the types above counts a bf16 view right).
    const bool costed = op->hasAttr("nn.cost");
    for (Value r : op->getResults()) {
      auto type = cast<RankedTensorType>(r.getType());
      bool stored =
          (costed && type.getElementType().isBF16()) ||
          llvm::any_of(r.getUsers(), [](Operation *user) {
            return isStorageCast(user) &&
                   cast<RankedTensorType>(user->getResult(0).getType())
                       .getElementType()
                       .isBF16();
          });
      if (stored)
        spec.outBytes -= 2 * type.getNumElements();
    }
    // What this stage really stashes and works in (the cost annotation's
    // saved bytes are an estimate made before differentiation).
    spec.savedBytes = saved[i];
    spec.fwdScratchBytes = fwdScratch[i];
    spec.bwdScratchBytes = bwdScratch[i];
    spec.carriedBytes = carried[i];
    spec.savedReads = savedReads[i];
    spec.bwdRecomputedScratchBytes = bwdRecomputed[i];
    // The cost model's work of one microbatch (the stage's tensors are a
    // microbatch's), recorded so a profile can calibrate a device model.
    if (auto cost = dyn_cast<nn::CostOpInterface>(op)) {
      spec.fwdFlops = cost.getForwardFlops();
      spec.bwdFlops = cost.getBackwardFlops();
      double touched = 0;
      for (Value r : op->getResults())
        touched += double(nn::tensorBytes(r.getType()));
      for (Value v : op->getOperands())
        touched += double(nn::tensorBytes(v.getType()));
      spec.touchedBytes = touched;
    }
    d.ops.push_back(std::move(spec));
  }
  d.fusedUpdates = fusedUpdates;
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
  if (precision && precision.getValue() == "bf16")
    d.matmulPrecision = "bf16";
  // The op table's stash and scratch figures are the whole model's, as a
  // profile needs them, only on one stage without recomputation or a split
  // backward (else they describe this stage's cut and mode).
  d.memoryModel = devices == 1 && chunks.size() == 1 &&
                          !chunks.front()->fwd.fn->hasAttr("pipe.recompute") &&
                          !chunks.front()->bwdw.fn
                      ? "arena"
                      : "";
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
                           std::vector<int64_t>(shape.begin(), shape.end()),
                           0});
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
  LLVM::GlobalOp::create(gb, module.getLoc(),
                         LLVM::LLVMArrayType::get(gb.getI8Type(), meta.size()),
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
