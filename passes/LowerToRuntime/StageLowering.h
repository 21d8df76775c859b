//===- StageLowering.h - --pipe-lower-to-runtime state ----------*- C++ -*-===//
//
// Part of pipec's passes: the class that lowers one rank's stage(s) to code
// calling the runtime C ABI, shared by the files of passes/LowerToRuntime/:
//
//   StageBuffers.cpp      what the stage holds and where (buffers, arena
//                         regions, scratch packed by lifetime)
//   KernelLowering.cpp    stage functions as kernel calls, per target (cpu:
//                         pipec_k_*, cuda: pipec_cuda_k_*), declarations
//   ProgramLowering.cpp   the pipe.program as pipec_rt_* service calls
//   StageDescription.cpp  the stage description (JSON) and main
//
// and LowerToRuntime.cpp (the pass, --pipe-plan-memory's entry point). The
// arena arithmetic is plain C++ (include/pipec/Arena.h).
//
//===----------------------------------------------------------------------===//

#ifndef PIPEC_PASSES_LOWERTORUNTIME_STAGELOWERING_H
#define PIPEC_PASSES_LOWERTORUNTIME_STAGELOWERING_H

#include "dialects/pipe/PipeDialect.h"
#include "passes/KernelCalls.h"
#include "passes/PassUtils.h"
#include "pipec/Arena.h"
#include "pipec/formats/Documents.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MLProgram/IR/MLProgram.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace pipec {
namespace lowering {

using namespace mlir;

constexpr int64_t kAlign = kArenaAlign;

inline int64_t alignUp(int64_t v) { return arenaAlign(v); }

/// Where a tensor lives.
struct Buffer {
  enum Region { None, Weights, Slots, IO, Scratch, Const, Null } region = None;
  int64_t offset = 0; ///< within the region (slots: within one slot)
  std::string symbol; ///< Const: the llvm global holding the data
  int64_t bytes = 0;  ///< Const: its size
  bool operator==(const Buffer &o) const {
    return region == o.region && offset == o.offset && symbol == o.symbol;
  }
};

/// Arena regions and their sizes (include/pipec/Arena.h).
using Regions = ArenaRegions;

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
  /// Scratch bytes live at each step (assignScratch).
  std::vector<int64_t> scratchLive;
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
  /// Per layer (index in layerOps), for the profile's memory model: the
  /// stash-slot bytes of the forward results (pipe.saved) this layer
  /// computes, and the most scratch bytes live while one of its kernels
  /// runs in the forward, and in the backward (or the optimizer step).
  SmallVector<int64_t> layerSaved, layerScratchFwd, layerScratchBwd;
  /// Per layer: what a split backward (zero bubble) would carry from its
  /// input half to the weight half for it (attributeCarried).
  SmallVector<int64_t> layerCarried;
  /// Per layer, for recomputation's lifetimes (attributeSavedReads): its
  /// stashed results by the layer whose backward reads them last (offset
  /// to that layer, bytes), and its backward working set with the stashed
  /// values it reads last in scratch until their last read.
  SmallVector<std::vector<std::pair<int64_t, int64_t>>> layerSavedReads;
  SmallVector<int64_t> layerScratchBwdRecomputed;
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
  int64_t assignScratch(Chunk &c, FunctionPlan &fp, ArrayRef<int64_t> bytes);
  void attributeStash(Chunk &c);
  void attributeCarried(Chunk &c);
  void attributeSavedReads(Chunk &c);
  void fuseUpdates(FunctionPlan &fp);
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
  void callStage(Site &s, func::FuncOp fn, Value slot, Value weights);
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
  /// The step functions' multi-tensor calls (fuseUpdates): the ops whose
  /// updates each one runs, and their elements. A fused step's opId is
  /// -2 - its index here; it is timed as profiler op (number of layer
  /// ops + index) and its time shared by elements among its ops.
  std::vector<formats::FusedUpdate> fusedUpdates;
  int64_t layerOpCount() const {
    int64_t n = 0;
    for (const auto &c : chunks)
      n += int64_t(c->layerOps.size());
    return n;
  }
  std::map<std::vector<int64_t>, std::string> intArrays;
  std::map<std::vector<double>, std::string> realArrays;
  SmallVector<LLVM::GlobalOp> newGlobals;
};

inline mlir::Type ptrType(mlir::MLIRContext *ctx) {
  return mlir::LLVM::LLVMPointerType::get(ctx);
}

} // namespace lowering
} // namespace pipec

#endif // PIPEC_PASSES_LOWERTORUNTIME_STAGELOWERING_H
