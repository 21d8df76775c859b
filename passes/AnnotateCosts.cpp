//===- AnnotateCosts.cpp - --nn-annotate-costs ----------------------------===//
//
// Attaches #nn.cost to every layer op, from a measured profile
// (pipec.profile/1, ops matched by ONNX node name) or from the analytic
// roofline model of a named device: t = max(FLOPs / peak, bytes / bandwidth)
// + per-op overhead.
//
//===----------------------------------------------------------------------===//
#include "passes/PassUtils.h"
#include "passes/Passes.h"
#include "pipec/CostModel.h"
#include "pipec/Profile.h"

#include "mlir/Dialect/MLProgram/IR/MLProgram.h"
#include "llvm/Support/MemoryBuffer.h"

#include <map>

namespace pipec {
#define GEN_PASS_DEF_NNANNOTATECOSTSPASS
#include "passes/Passes.h.inc"
} // namespace pipec

using namespace mlir;
using namespace pipec;

namespace {

bool isParam(Value v) {
  return v.getDefiningOp<ml_program::GlobalLoadOp>() != nullptr;
}

struct Bytes {
  int64_t out = 0, param = 0, saved = 0, touched = 0;
};

Bytes bytesOf(Operation *op) {
  Bytes b;
  for (Value r : op->getResults())
    b.out += nn::tensorBytes(r.getType());
  for (Value v : op->getOperands()) {
    int64_t n = nn::tensorBytes(v.getType());
    (isParam(v) ? b.param : b.saved) += n;
  }
  b.touched = b.out + b.param + b.saved;
  return b;
}

struct NNAnnotateCostsPass
    : public pipec::impl::NNAnnotateCostsPassBase<NNAnnotateCostsPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    std::map<std::string, const ProfileOp *> byName;
    ProfileResult loaded;
    std::optional<DeviceModel> dev;
    if (!profile.empty()) {
      auto buffer = llvm::MemoryBuffer::getFile(profile);
      if (!buffer) {
        module.emitError("cannot read profile '")
            << profile << "': " << buffer.getError().message();
        return signalPassFailure();
      }
      loaded = profileFromJson((*buffer)->getBuffer().str());
      if (!loaded.ok) {
        module.emitError("profile '") << profile << "': " << loaded.error;
        return signalPassFailure();
      }
      for (const ProfileOp &op : loaded.profile.ops)
        byName[op.name] = &op;
    } else {
      std::string error;
      dev = deviceModelByNameOrFile(device, error);
      if (!dev) {
        module.emitError(error);
        return signalPassFailure();
      }
    }

    SmallVector<Operation *> layers;
    module.walk([&](Operation *op) {
      if (isLayer(op))
        layers.push_back(op);
    });
    SmallVector<std::string> names = uniqueLayerNames(layers);
    int index = 0;
    bool failedAny = false;
    for (Operation *op : layers) {
      Bytes bytes = bytesOf(op);
      double fwd, bwd;
      if (dev) {
        auto cost = cast<nn::CostOpInterface>(op);
        double f = cost.getForwardFlops(), bf = cost.getBackwardFlops();
        // (A calibrated model may know this op kind's efficiency.)
        std::string kind = op->getName().stripDialect().str();
        fwd = dev->seconds(f, bytes.touched, kind);
        bwd = dev->seconds(bf, 2.0 * bytes.touched, kind);
      } else {
        const std::string &name = names[size_t(index)];
        auto it = byName.find(name);
        if (it == byName.end()) {
          op->emitError("op '") << name << "' is not in profile '" << profile
                                << "' (was it measured on another model?)";
          failedAny = true;
          ++index;
          continue;
        }
        fwd = it->second->fwdSeconds;
        bwd = it->second->bwdSeconds;
      }
      ++index;
      op->setAttr("nn.cost",
                  nn::CostAttr::get(op->getContext(), llvm::APFloat(fwd),
                                    llvm::APFloat(bwd), bytes.out, bytes.param,
                                    bytes.saved));
    }
    if (failedAny)
      signalPassFailure();
  }
};

} // namespace
