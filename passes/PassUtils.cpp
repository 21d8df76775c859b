//===- PassUtils.cpp - helpers shared by pipec passes ---------------------===//
#include "passes/PassUtils.h"
#include "dialects/pipe/PipeDialect.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

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
  return isa<nn::CostOpInterface>(op) && !isa<nn::ConstantOp>(op) &&
         !isStorageCast(op);
}

bool pipec::isStorageCast(Operation *op) {
  auto castOp = dyn_cast<nn::CastOp>(op);
  if (!castOp)
    return false;
  auto bf16 = [](Value v) {
    return cast<RankedTensorType>(v.getType()).getElementType().isBF16();
  };
  return bf16(castOp.getInput()) || bf16(castOp.getOutput());
}

func::FuncOp pipec::getModelFunc(ModuleOp module) {
  auto fn = module.lookupSymbol<func::FuncOp>("main");
  if (!fn) {
    module.emitError("no model function @main: import an ONNX model first "
                     "(pipec-translate --import-onnx)");
    return {};
  }
  if (fn.isExternal()) {
    fn.emitError("the model function @main has no body");
    return {};
  }
  if (!llvm::hasSingleElement(fn.getBody())) {
    fn.emitError("the model function @main has ")
        << fn.getBody().getBlocks().size()
        << " blocks; pipec takes one block of nn ops (as the importer writes)";
    return {};
  }
  return fn;
}

LogicalResult pipec::requireBodies(ArrayRef<func::FuncOp> funcs) {
  for (func::FuncOp fn : funcs)
    if (fn.isExternal())
      return fn.emitError("stage function @")
             << fn.getSymName() << " has no body";
  return success();
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

double pipec::literalValue(float f) {
  // Constants that exporters and ONNX defaults store rounded to float32:
  // SELU's alpha and gamma (Klambauer et al. 2017), sqrt(2/pi) of the tanh
  // form of GELU, sqrt(2), 1/sqrt(2), pi, e, ln 2.
  static const double kKnown[] = {
      1.6732632423543772848170429916717, 1.0507009873554804934193349852946,
      0.79788456080286535587989211986876, 1.4142135623730950488016887242097,
      0.70710678118654752440084436210485, 3.1415926535897932384626433832795,
      2.7182818284590452353602874713527, 0.69314718055994530941723212145818};
  for (double k : kKnown)
    if (float(k) == f)
      return k;
  char text[64];
  auto end = std::to_chars(text, text + sizeof text - 1, f);
  if (end.ec != std::errc() || !std::isfinite(f))
    return double(f);
  *end.ptr = 0;
  const double decimal = std::strtod(text, nullptr);
  // A short decimal (0.9, 1e-5, 0.044715) is what was written; a long one
  // may be a fraction computed in double before the export stored it as a
  // float (HardSigmoid's alpha 1/6 is 0.16666667).
  std::string mantissa;
  for (const char *c = text; *c && *c != 'e'; ++c)
    if (*c >= '0' && *c <= '9')
      mantissa += *c;
  size_t first = mantissa.find_first_not_of('0');
  size_t last = mantissa.find_last_not_of('0');
  size_t digits = first == std::string::npos ? 0 : last - first + 1;
  if (digits <= 6)
    return decimal;
  for (int q = 2; q <= 64; ++q) {
    const double p = std::nearbyint(double(f) * q);
    if (std::fabs(p) <= 1024 && float(p / q) == f)
      return p / q;
  }
  return decimal;
}

bool pipec::stageReadsStash(ModuleOp module, int64_t stage) {
  for (const char *kind : {"bwd", "bwdw"}) {
    auto fn = module.lookupSymbol<func::FuncOp>(stageFuncName(stage, kind));
    if (!fn)
      continue;
    for (unsigned i = 0; i < fn.getNumArguments(); ++i)
      if (fn.getArgAttr(i, pipe::attrs::kFwdArg) ||
          fn.getArgAttr(i, pipe::attrs::kFwdResult) ||
          fn.getArgAttr(i, pipe::attrs::kCarried))
        return true;
    for (unsigned i = 0; i < fn.getNumResults(); ++i)
      if (fn.getResultAttr(i, pipe::attrs::kCarry))
        return true;
  }
  return false;
}
