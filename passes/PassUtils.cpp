//===- PassUtils.cpp - helpers shared by pipec passes ---------------------===//
#include "passes/PassUtils.h"
#include "dialects/pipe/PipeDialect.h"

using namespace mlir;

std::string pipec::locationName(Location loc) {
  if (auto name = dyn_cast<NameLoc>(loc))
    return name.getName().str();
  if (auto fused = dyn_cast<FusedLoc>(loc))
    for (Location inner : fused.getLocations())
      if (std::string n = locationName(inner); !n.empty())
        return n;
  return "";
}

std::string pipec::layerName(Operation *op, int index) {
  std::string name = locationName(op->getLoc());
  if (!name.empty())
    return name;
  return op->getName().stripDialect().str() + "_" + std::to_string(index);
}

SmallVector<std::string> pipec::uniqueLayerNames(ArrayRef<Operation *> ops) {
  SmallVector<std::string> names;
  llvm::StringMap<int> seen;
  for (auto [i, op] : llvm::enumerate(ops)) {
    std::string name = layerName(op, int(i));
    int n = ++seen[name];
    names.push_back(n == 1 ? name : name + "#" + std::to_string(n));
  }
  return names;
}

bool pipec::isLayer(Operation *op) {
  return isa<nn::CostOpInterface>(op) && !isa<nn::ConstantOp>(op);
}

func::FuncOp pipec::getModelFunc(ModuleOp module) {
  auto fn = module.lookupSymbol<func::FuncOp>("main");
  if (!fn)
    module.emitError("no model function @main: import an ONNX model first "
                     "(pipec-translate --import-onnx)");
  return fn;
}

std::string pipec::stageFuncName(int64_t stage, StringRef kind) {
  return "s" + std::to_string(stage) + "_" + kind.str();
}

SmallVector<func::FuncOp> pipec::getStageFuncs(ModuleOp module,
                                               StringRef kind) {
  SmallVector<func::FuncOp> funcs;
  for (int64_t s = 0;; ++s) {
    auto fn = module.lookupSymbol<func::FuncOp>(stageFuncName(s, kind));
    if (!fn)
      break;
    funcs.push_back(fn);
  }
  return funcs;
}

int64_t pipec::labelClasses(Value labels) {
  for (Operation *user : labels.getUsers()) {
    if (auto loss = dyn_cast<nn::SoftmaxCrossEntropyLossOp>(user))
      return cast<RankedTensorType>(loss.getScores().getType()).getDimSize(1);
    if (auto reshape = dyn_cast<nn::ReshapeOp>(user))
      if (int64_t c = labelClasses(reshape.getResult()))
        return c;
  }
  return 0;
}
