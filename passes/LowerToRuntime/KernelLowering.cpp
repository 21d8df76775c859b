//===- KernelLowering.cpp - Stage functions as kernel calls ---------------===//
//
// Part of --pipe-lower-to-runtime (LowerToRuntime/StageLowering.h).
//
//===----------------------------------------------------------------------===//

#include "passes/LowerToRuntime/StageLowering.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
using namespace pipec;
using namespace pipec::lowering;

//===----------------------------------------------------------------------===//
// Emission
//===----------------------------------------------------------------------===//

/// The number of buffers of `kernel`'s CUDA twin (runtime/cuda/
/// cuda_kernels.def, the list the CUDA runtime's registry is made from);
/// -1 when it has none.
static int cudaKernelBuffers(StringRef kernel) {
  static const struct {
    const char *name;
    int buffers;
  } kCuda[] = {
#define PIPEC_CUDA_KERNEL(sym, nbufs) {"pipec_k_" #sym, nbufs},
#include "../runtime/cuda/cuda_kernels.def"
  };
  for (const auto &k : kCuda)
    if (kernel == k.name)
      return k.buffers;
  return -1;
}

/// A kernel that also runs on many tensors in one call
/// (runtime/include/pipec_multi_tensor.def).
struct MultiKernel {
  const char *name; ///< the one-tensor kernel
  int buffers, ints, firstOutput;
  unsigned shared;
};
static const MultiKernel kMultiKernels[] = {
#define PIPEC_MULTI_TENSOR(name, bufs, ints, firstOutput, shared)              \
  {"pipec_k_" #name, bufs, ints, firstOutput, shared},
#include "../runtime/include/pipec_multi_tensor.def"
};

/// The multi-tensor entry of `kernel` ("pipec_k_sgd" or its float64 twin
/// "pipec_k_sgd_f64"), or null; `f64` says which.
static const MultiKernel *multiKernelOf(StringRef kernel, bool &f64) {
  f64 = kernel.consume_back("_f64");
  for (const MultiKernel &m : kMultiKernels)
    if (kernel == m.name)
      return &m;
  return nullptr;
}

/// Groups the updates of a step function (the optimizer's, and the fills
/// that zero the gradients) into multi-tensor calls, one per kind and
/// shared arguments: on a GPU one launch instead of one per weight. A call
/// joins the group of its kind placed earliest only when no step between
/// that group and it touches what it reads or writes (any other kernel
/// counts as reading and writing all its buffers) and it touches no buffer
/// of the group's own calls, so every buffer sees its reads and writes in
/// the original order. A group of one stays the plain call.
void StageLowering::fuseUpdates(FunctionPlan &fp) {
  struct Entry {
    std::vector<size_t> members; // indices into fp.steps
    const MultiKernel *multi = nullptr;
    bool f64 = false;
  };
  std::vector<Entry> entries;
  std::map<std::string, size_t> open; // key -> entry
  auto access = [&](const Step &s, bool writes) {
    bool f64 = false;
    const MultiKernel *m = multiKernelOf(s.call.kernel, f64);
    SmallVector<Buffer> out;
    for (auto [i, buf] : llvm::enumerate(s.buffers))
      if (buf.region != Buffer::Null && buf.region != Buffer::None &&
          (!m || (writes ? int(i) >= m->firstOutput : int(i) < m->firstOutput)))
        out.push_back(buf);
    return out;
  };
  auto conflict = [&](const Step &s, const Entry &e) {
    SmallVector<Buffer> reads = access(s, false), writes = access(s, true);
    for (size_t k : e.members) {
      SmallVector<Buffer> r = access(fp.steps[k], false),
                          w = access(fp.steps[k], true);
      for (const Buffer &b : writes)
        if (llvm::is_contained(r, b) || llvm::is_contained(w, b))
          return true;
      for (const Buffer &b : reads)
        if (llvm::is_contained(w, b))
          return true;
    }
    return false;
  };
  for (size_t i = 0; i < fp.steps.size(); ++i) {
    const Step &s = fp.steps[i];
    bool f64 = false;
    const MultiKernel *m = multiKernelOf(s.call.kernel, f64);
    if (!m || int(s.buffers.size()) != m->buffers ||
        int(s.call.ints.size()) != m->ints) {
      entries.push_back({{i}, nullptr, false});
      continue;
    }
    // Calls of one group share the kernel, its non-length ints, its reals
    // and the buffers every tensor shares.
    std::string key = s.call.kernel;
    for (size_t k = 1; k < s.call.ints.size(); ++k)
      key += " i" + std::to_string(s.call.ints[k]);
    for (double r : s.call.reals)
      key += " r" + llvm::formatv("{0:e17}", r).str();
    for (int b = 0; b < m->buffers; ++b)
      if ((m->shared >> b) & 1u)
        key += " b" + std::to_string(int(s.buffers[size_t(b)].region)) + ":" +
               std::to_string(s.buffers[size_t(b)].offset) + ":" +
               s.buffers[size_t(b)].symbol;
    auto it = open.find(key);
    bool joins = it != open.end();
    // (The group's own calls count too: its tensors must not overlap.)
    for (size_t e = joins ? it->second : 0; joins && e < entries.size(); ++e)
      joins = !conflict(s, entries[e]);
    if (joins) {
      entries[it->second].members.push_back(i);
      continue;
    }
    open[key] = entries.size();
    entries.push_back({{i}, m, f64});
  }
  std::vector<Step> steps;
  for (const Entry &e : entries) {
    if (e.members.size() == 1) {
      steps.push_back(fp.steps[e.members.front()]);
      continue;
    }
    const Step &first = fp.steps[e.members.front()];
    Step fused{{std::string(e.multi->name) + "_multi" + (e.f64 ? "_f64" : ""),
                {},
                {int64_t(e.members.size())},
                first.call.reals},
               {},
               -2 - int64_t(fusedUpdates.size()),
               first.loc};
    formats::FusedUpdate timing;
    for (size_t k : e.members) {
      const Step &s = fp.steps[k];
      fused.buffers.append(s.buffers.begin(), s.buffers.end());
      fused.call.ints.append(s.call.ints.begin(), s.call.ints.end());
      if (s.opId < 0)
        continue;
      // (A weight and its bias: one op, their elements summed.)
      auto at = llvm::find(timing.ops, s.opId);
      if (at == timing.ops.end()) {
        timing.ops.push_back(s.opId);
        timing.elements.push_back(s.call.ints.front());
      } else {
        timing.elements[size_t(at - timing.ops.begin())] += s.call.ints.front();
      }
    }
    fusedUpdates.push_back(std::move(timing));
    steps.push_back(std::move(fused));
  }
  fp.steps = std::move(steps);
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
  // A call whose buffer count differs from the twin's is a compiler bug
  // (the lowering and the runtime disagree on the ABI): refused, not run.
  std::map<std::string, std::vector<std::string>> missing;
  for (auto &c : chunks)
    for (FunctionPlan *fp : c->plans())
      for (Step &st : fp->steps) {
        StringRef kernel = st.call.kernel;
        int buffers = cudaKernelBuffers(kernel);
        if (kernel.consume_back("_multi")) {
          // K tensors of the one-tensor kernel's buffers.
          bool f64 = false;
          const MultiKernel *m = multiKernelOf(kernel, f64);
          buffers = m && cudaKernelBuffers(kernel) == m->buffers
                        ? int(st.call.ints.front()) * m->buffers
                        : -1;
        }
        if (buffers < 0) {
          auto &ops = missing[st.call.kernel];
          std::string op = locationName(st.loc);
          if (ops.size() < 3 && llvm::find(ops, op) == ops.end())
            ops.push_back(op);
        } else if (size_t(buffers) != st.buffers.size()) {
          return module.emitError("internal error: ")
                 << st.call.kernel << " called with " << st.buffers.size()
                 << " buffers for " << locationName(st.loc)
                 << "; its CUDA twin takes " << buffers
                 << " (runtime/cuda/cuda_kernels.def)";
        }
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
    declare(kernelSymbol(k, target), {ptr, ptr, ptr, ptr}, {});
  declare("pipec_rt_kernel_context", {ptr}, {ptr});
  if (cuda()) {
    declare("pipec_rt_constant", {ptr, ptr, i64t}, {ptr});
    auto stageFn = db.getFunctionType({ptr, ptr, i64t, ptr}, {});
    declare("pipec_rt_run", {ptr, stageFn, ptr, i64t, ptr}, {});
  }
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
    auto tensor =
        RankedTensorType::get({(int64_t)ints.size()}, gb.getI64Type());
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
    auto tensor =
        RankedTensorType::get({(int64_t)reals.size()}, gb.getF64Type());
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
  // ABI 3: every kernel gets the stage's kernel context, asked for once
  // per call of the stage function.
  Value kernelCtx =
      fp.steps.empty()
          ? Value()
          : func::CallOp::create(ob, fp.fn.getLoc(), "pipec_rt_kernel_context",
                                 TypeRange{ptr}, ValueRange{ctxArg})
                .getResult(0);
  // A multi-tensor call is timed as profiler op (layer ops + its index).
  const int64_t fusedBase = layerOpCount();
  for (Step &s : fp.steps) {
    Location loc = s.loc;
    const int64_t timedAs = s.opId <= -2 ? fusedBase - 2 - s.opId : s.opId;
    if (timedAs >= 0)
      func::CallOp::create(
          ob, loc, "pipec_rt_op_begin", TypeRange{},
          ValueRange{ctxArg, i64(ob, loc, timedAs), i64(ob, loc, fp.phase)});
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
                         TypeRange{}, ValueRange{kernelCtx, bufs, ints, reals});
    if (timedAs >= 0)
      func::CallOp::create(
          ob, loc, "pipec_rt_op_end", TypeRange{},
          ValueRange{ctxArg, i64(ob, loc, timedAs), i64(ob, loc, fp.phase)});
  }
  func::ReturnOp::create(ob, fp.fn.getLoc());
  return fn;
}

/// The microbatch operand (null if none) and the stage function a pipe op
/// names (empty if none).
