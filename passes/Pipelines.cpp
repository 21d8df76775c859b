//===- Pipelines.cpp - registered pass pipelines --------------------------===//
//
//   --pipec-train-pipeline="stages=4 microbatches=8 schedule=1f1b-flush"
//       annotate-costs, plan, split-stages, autodiff, [recompute,]
//       fold-transposes, build-schedule,
//       [convert-precision,] verify-schedule, plan-memory
//   --pipec-lower-stage="stage=K"
//       lower-to-runtime for one stage, then the upstream conversions to
//       the LLVM dialect
//
//===----------------------------------------------------------------------===//
#include "passes/Passes.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"
#include "mlir/Pass/PassRegistry.h"

using namespace mlir;

void pipec::buildPlanningPipeline(OpPassManager &pm,
                                  const TrainingPipelineOptions &o) {
  pm.addPass(createNNAnnotateCostsPass({o.profile, o.device}));
  PipePlanPassOptions plan;
  plan.stages = o.stages;
  plan.algorithm = "balanced";
  plan.last.assign(o.cuts.begin(), o.cuts.end());
  pm.addPass(createPipePlanPass(plan));
}

void pipec::buildDifferentiationPipeline(OpPassManager &pm,
                                         const TrainingPipelineOptions &o) {
  pm.addPass(createPipeSplitStagesPass());
  pm.addPass(createNNAutodiffPass({o.loss, o.optimizer, o.momentum, o.beta1,
                                   o.beta2, o.epsilon, o.weightDecay}));
  if (llvm::any_of(o.recompute,
                   [](const std::string &m) { return m != "none"; })) {
    PipeRecomputePassOptions recompute;
    recompute.mode.assign(o.recompute.begin(), o.recompute.end());
    pm.addPass(createPipeRecomputePass(recompute));
  }
  pm.addPass(createNNFoldTransposesPass());
}

void pipec::buildSchedulingPipeline(OpPassManager &pm,
                                    const TrainingPipelineOptions &o) {
  PipeBuildSchedulePassOptions schedule;
  schedule.schedule = o.schedule;
  schedule.scheduleCsv = o.scheduleCsv;
  schedule.microbatches = o.microbatches;
  schedule.warmup = o.warmup;
  schedule.chunks = o.chunks;
  schedule.replicas.assign(o.replicas.begin(), o.replicas.end());
  schedule.splitSamples = o.splitSamples;
  pm.addPass(createPipeBuildSchedulePass(schedule));
  if (o.precision != "f32")
    pm.addPass(createNNConvertPrecisionPass({o.precision, o.activations}));
  pm.addPass(createPipeVerifySchedulePass());
  pm.addPass(createPipePlanMemoryPass());
}

void pipec::buildTrainingPipeline(OpPassManager &pm,
                                  const TrainingPipelineOptions &o) {
  buildPlanningPipeline(pm, o);
  buildDifferentiationPipeline(pm, o);
  buildSchedulingPipeline(pm, o);
}

void pipec::buildStageLoweringPipeline(OpPassManager &pm, int stage,
                                       const std::string &buildId, int replica,
                                       const std::string &target) {
  PipeLowerToRuntimePassOptions options;
  options.stage = stage;
  options.replica = replica;
  options.buildId = buildId;
  options.target = target;
  pm.addPass(createPipeLowerToRuntimePass(options));
  pm.addPass(createSCFToControlFlowPass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  pm.addPass(createConvertFuncToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
}

namespace {
struct TrainPipelineCLOptions
    : public PassPipelineOptions<TrainPipelineCLOptions> {
  Option<std::string> profile{
      *this, "profile",
      llvm::cl::desc("pipec.profile/1 file of measured op times"),
      llvm::cl::init("")};
  Option<std::string> device{
      *this, "device",
      llvm::cl::desc("analytic device model when no profile is given: cpu, "
                     "v100, a100, h100, ..."),
      llvm::cl::init("cpu")};
  Option<int> stages{*this, "stages", llvm::cl::desc("pipeline stages"),
                     llvm::cl::init(1)};
  Option<std::string> loss{
      *this, "loss",
      llvm::cl::desc("cross-entropy or model (the model computes its loss)"),
      llvm::cl::init("cross-entropy")};
  Option<std::string> schedule{
      *this, "schedule",
      llvm::cl::desc(
          "as --pipe-build-schedule's schedule= (gpipe, 1f1b-flush, ...)"),
      llvm::cl::init("1f1b-flush")};
  Option<int> microbatches{*this, "microbatches",
                           llvm::cl::desc("microbatches per step"),
                           llvm::cl::init(1)};
  Option<std::string> optimizer{
      *this, "optimizer",
      llvm::cl::desc("sgd, momentum, nesterov, adam or adagrad"),
      llvm::cl::init("sgd")};
  Option<std::string> precision{*this, "precision",
                                llvm::cl::desc("f32, f64 or bf16"),
                                llvm::cl::init("f32")};
};
struct LowerStageCLOptions : public PassPipelineOptions<LowerStageCLOptions> {
  Option<int> stage{*this, "stage",
                    llvm::cl::desc("the pipeline stage to lower"),
                    llvm::cl::init(0)};
  Option<int> replica{
      *this, "replica",
      llvm::cl::desc("the replica of the stage (replicated stages)"),
      llvm::cl::init(0)};
  Option<std::string> buildId{
      *this, "build-id",
      llvm::cl::desc("the build id the stage checks against the manifest's"),
      llvm::cl::init("dev")};
  Option<std::string> target{*this, "target", llvm::cl::desc("cpu or cuda"),
                             llvm::cl::init("cpu")};
};
} // namespace

void pipec::registerPipecPipelines() {
  PassPipelineRegistration<TrainPipelineCLOptions>(
      "pipec-train-pipeline",
      "Costs, plan, stage split, autodiff and schedule of an imported model",
      [](OpPassManager &pm, const TrainPipelineCLOptions &o) {
        TrainingPipelineOptions options;
        options.profile = o.profile;
        options.device = o.device;
        options.stages = o.stages;
        options.loss = o.loss;
        options.schedule = o.schedule;
        options.microbatches = o.microbatches;
        options.optimizer = o.optimizer;
        options.precision = o.precision;
        buildTrainingPipeline(pm, options);
      });
  PassPipelineRegistration<LowerStageCLOptions>(
      "pipec-lower-stage", "Lower one stage to the LLVM dialect",
      [](OpPassManager &pm, const LowerStageCLOptions &o) {
        buildStageLoweringPipeline(pm, o.stage, o.buildId, o.replica, o.target);
      });
}
