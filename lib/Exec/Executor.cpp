//===- Executor.cpp - in-process executor of nn functions -----------------===//
#include "pipec/Exec.h"

#include "dialects/nn/NNDialect.h"
#include "passes/KernelCalls.h"
#include "pipec_rt.h"

#include "mlir/Dialect/MLProgram/IR/MLProgram.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinDialect.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "llvm/ADT/DenseMap.h"

#include <cstring>

using namespace mlir;

int64_t pipec::HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

namespace {

/// Bytes of a value's tensor type.
size_t byteSize(Type t) { return static_cast<size_t>(pipec::nn::tensorBytes(t)); }

bool attrBytes(Attribute value, Type type, std::vector<char> &out) {
  size_t bytes = byteSize(type);
  out.assign(bytes, 0);
  if (auto res = dyn_cast<DenseResourceElementsAttr>(value)) {
    AsmResourceBlob *blob = res.getRawHandle().getBlob();
    if (!blob || blob->getData().size() != bytes)
      return false;
    std::memcpy(out.data(), blob->getData().data(), bytes);
    return true;
  }
  auto dense = dyn_cast<DenseElementsAttr>(value);
  if (!dense)
    return false;
  auto elem = cast<ShapedType>(type).getElementType();
  size_t i = 0;
  if (elem.isF32()) {
    for (float f : dense.getValues<float>())
      std::memcpy(out.data() + 4 * i++, &f, 4);
  } else if (elem.isF64()) {
    for (double d : dense.getValues<double>())
      std::memcpy(out.data() + 8 * i++, &d, 8);
  } else {
    for (int64_t v : dense.getValues<int64_t>())
      std::memcpy(out.data() + 8 * i++, &v, 8);
  }
  return true;
}

} // namespace

bool pipec::executeFunction(func::FuncOp fn,
                            const std::vector<HostTensor> &inputs,
                            std::vector<HostTensor> &outputs,
                            std::string &error) {
  // 64-byte aligned storage per SSA value.
  std::vector<std::unique_ptr<char[], void (*)(void *)>> storage;
  llvm::DenseMap<Value, char *> buffers;
  auto allocate = [&](Value v) {
    size_t bytes = std::max<size_t>(byteSize(v.getType()), 64);
    char *p = static_cast<char *>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    std::memset(p, 0, bytes);
    storage.emplace_back(p, std::free);
    buffers[v] = p;
    return p;
  };
  Block &body = fn.getBody().front();
  if (inputs.size() != body.getNumArguments()) {
    error = "expected " + std::to_string(body.getNumArguments()) +
            " inputs, got " + std::to_string(inputs.size());
    return false;
  }
  for (auto [i, arg] : llvm::enumerate(body.getArguments())) {
    if (inputs[i].bytes.size() != byteSize(arg.getType())) {
      error = "input " + std::to_string(i) + " has " +
              std::to_string(inputs[i].bytes.size()) + " bytes, " +
              std::to_string(byteSize(arg.getType())) + " expected";
      return false;
    }
    std::memcpy(allocate(arg), inputs[i].bytes.data(), inputs[i].bytes.size());
  }
  // The kernels' context: float32 arithmetic on the CPU.
  std::unique_ptr<pipec_kctx, void (*)(pipec_kctx *)> kernelContext(
      pipec_rt_cpu_kernel_context_new(nullptr),
      pipec_rt_cpu_kernel_context_free);
  auto module = fn->getParentOfType<ModuleOp>();
  for (Operation &op : body) {
    if (auto load = dyn_cast<ml_program::GlobalLoadOp>(op)) {
      auto global = module.lookupSymbol<ml_program::GlobalOp>(load.getGlobal());
      std::vector<char> data;
      if (!global || !global.getValue() ||
          !attrBytes(*global.getValue(), load.getType(), data)) {
        error = "cannot read the data of a global";
        return false;
      }
      std::memcpy(allocate(load.getResult()), data.data(), data.size());
      continue;
    }
    if (auto c = dyn_cast<nn::ConstantOp>(op)) {
      std::vector<char> data;
      if (!attrBytes(c.getValue(), c.getType(), data)) {
        error = "cannot read the data of a constant";
        return false;
      }
      std::memcpy(allocate(c.getResult()), data.data(), data.size());
      continue;
    }
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      outputs.clear();
      for (Value v : ret.getOperands()) {
        auto t = cast<RankedTensorType>(v.getType());
        HostTensor out;
        out.shape.assign(t.getShape().begin(), t.getShape().end());
        out.isFloat = isa<FloatType>(t.getElementType());
        out.bytes.assign(buffers[v], buffers[v] + byteSize(t));
        outputs.push_back(std::move(out));
      }
      return true;
    }
    auto calls = getKernelCalls(&op);
    if (failed(calls)) {
      error = "no kernel for " + op.getName().getStringRef().str();
      return false;
    }
    for (Value r : op.getResults())
      allocate(r);
    for (const KernelCall &call : *calls) {
      std::vector<void *> ptrs;
      for (Value v : call.buffers)
        ptrs.push_back(v ? buffers.lookup(v) : nullptr);
      pipec_kernel_fn kernel = pipec_rt_find_kernel(call.kernel.c_str());
      if (!kernel) {
        error = "the runtime has no kernel " + call.kernel;
        return false;
      }
      kernel(kernelContext.get(), ptrs.data(), call.ints.data(),
             call.reals.data());
    }
  }
  error = "function has no return";
  return false;
}
