//===- PlanStages.cpp - --pipe-plan ---------------------------------------===//
//
// Linearises the model function (layer ops in program order, which is a
// topological order), turns the #nn.cost attributes into a Profile, asks
// lib/Plan for a plan and records it: `pipe.stage` on every layer op and
// `pipe.plan` on the module.
//
//===----------------------------------------------------------------------===//
#include "passes/PassUtils.h"
#include "passes/Passes.h"
#include "pipec/Plan.h"
#include "pipec/Planners.h"

#include "llvm/Support/MemoryBuffer.h"

#include "llvm/ADT/DenseMap.h"

namespace pipec {
#define GEN_PASS_DEF_PIPEPLANPASS
#include "passes/Passes.h.inc"
} // namespace pipec

using namespace mlir;
using namespace pipec;

namespace {

struct PipePlanPass : public pipec::impl::PipePlanPassBase<PipePlanPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    func::FuncOp fn = getModelFunc(module);
    if (!fn)
      return signalPassFailure();

    Profile profile;
    SmallVector<Operation *> layers;
    llvm::DenseMap<Operation *, int> layerIndex;
    for (Operation &op : fn.getBody().front()) {
      if (!isLayer(&op))
        continue;
      auto cost = op.getAttrOfType<nn::CostAttr>("nn.cost");
      if (!cost) {
        op.emitError("has no #nn.cost; run --nn-annotate-costs before "
                     "--pipe-plan");
        return signalPassFailure();
      }
      ProfileOp p;
      p.name = layerName(&op, layers.size()); // made unique below
      p.op = op.getName().stripDialect().str();
      p.fwdSeconds = cost.getFwd().convertToDouble();
      p.bwdSeconds = cost.getBwd().convertToDouble();
      p.outBytes = cost.getOutBytes();
      p.paramBytes = cost.getParamBytes();
      p.savedBytes = cost.getSavedBytes();
      for (Value v : op.getOperands())
        if (Operation *def = v.getDefiningOp())
          if (auto it = layerIndex.find(def); it != layerIndex.end())
            if (!llvm::is_contained(p.inputs, it->second))
              p.inputs.push_back(it->second);
      layerIndex[&op] = layers.size();
      layers.push_back(&op);
      profile.ops.push_back(std::move(p));
    }
    if (layers.empty()) {
      fn.emitError("the model has no layers to place on stages");
      return signalPassFailure();
    }
    for (auto [p, name] : llvm::zip(profile.ops, uniqueLayerNames(layers)))
      p.name = name;

    PlanResult result;
    if (!last.empty()) {
      // A given cut (e.g. the one planned for the full microbatch, reused
      // for the slices of split replicas, or `pipec compile --cuts`). The
      // last stage's last layer may be left out.
      result.ok = true;
      result.plan.algorithm = "fixed";
      SmallVector<int> lastLayers(last.begin(), last.end());
      if (int(lastLayers.size()) == stages - 1)
        lastLayers.push_back(int(layers.size()) - 1);
      int first = 0;
      for (int l : lastLayers) {
        result.plan.stages.push_back({first, l, 1, {}});
        first = l + 1;
      }
      std::string bad = validatePlan(result.plan, int(layers.size()));
      if (!bad.empty() || first != int(layers.size()) ||
          int(lastLayers.size()) != stages) {
        module.emitError("the fixed cut (last layers ")
            << llvm::join(llvm::map_range(last, [](int l) {
                            return std::to_string(l);
                          }),
                          ",")
            << ") does not split the " << layers.size() << " layers into "
            << stages.getValue() << " stages" << (bad.empty() ? "" : ": ")
            << bad;
        return signalPassFailure();
      }
    } else if (algorithm == "balanced") {
      result = planBalanced(profile, stages);
    } else {
      // The papers' planners choose stages (and replicas) for a topology:
      // a file, or `stages` devices on one level.
      Topology topology = Topology::flat(stages, 1e10, 1e-5);
      if (!topologyFile.empty()) {
        auto buffer = llvm::MemoryBuffer::getFile(topologyFile);
        if (!buffer) {
          module.emitError("cannot read topology '") << topologyFile << "'";
          return signalPassFailure();
        }
        TopologyResult t = topologyFromJson((*buffer)->getBuffer().str());
        if (!t.ok) {
          module.emitError("topology '") << topologyFile << "': " << t.error;
          return signalPassFailure();
        }
        topology = t.topology;
      }
      PlannerOptions options;
      options.schedule = "1f1b-flush";
      options.stages = 0; // the planner chooses the depth for the devices
      result = runPlanner(algorithm, profile, topology, options);
      if (result.ok) {
        for (const StagePlan &st : result.plan.stages)
          if (st.replicas != 1 || result.plan.chunks > 1) {
            module.emitError("the ")
                << algorithm << " plan replicates stages or interleaves "
                << "chunks, which the compiler cannot lower yet; plan it with "
                   "`pipec plan` or use --pipe-plan=algorithm=balanced";
            return signalPassFailure();
          }
      }
    }
    if (!result.ok) {
      module.emitError("cannot plan ") << stages.getValue() << " stages: " << result.error;
      return signalPassFailure();
    }
    const Plan &plan = result.plan;
    OpBuilder b(module.getContext());
    SmallVector<int64_t> first, last, replicas;
    for (const StagePlan &s : plan.stages) {
      first.push_back(s.firstLayer);
      last.push_back(s.lastLayer);
      replicas.push_back(s.replicas);
    }
    for (auto [i, op] : llvm::enumerate(layers))
      op->setAttr(pipe::attrs::kStage,
                  b.getI64IntegerAttr(plan.stageOfLayer(i)));
    module->setAttr(pipe::attrs::kPlan,
                    pipe::PlanAttr::get(
                        module.getContext(), b.getStringAttr(plan.algorithm),
                        b.getDenseI64ArrayAttr(first),
                        b.getDenseI64ArrayAttr(last),
                        b.getDenseI64ArrayAttr(replicas),
                        llvm::APFloat(plan.predicted.iterationSeconds)));
  }
};

} // namespace
