//===- Compile.cpp - pipec import / compile -------------------------------===//
//
// `pipec compile` = import (batch re-specialised to the microbatch size) +
// the training pipeline (costs, plan, split, autodiff, schedule) + per
// stage: initial weights (safetensors), lowering to the LLVM dialect, object
// emission and linking with libpipec_rt; then the manifest and plan.json.
//
//===----------------------------------------------------------------------===//
#include "Driver.h"

#include "passes/PassUtils.h"
#include "passes/Passes.h"
#include "pipec/Codegen.h"
#include "pipec/Import.h"
#include "pipec/Plan.h"
#include "pipec/Schedule.h"
#include "pipec/Sim.h"

#include "pipec/formats/Documents.h"
#include "pipec/formats/safetensors.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/BuiltinDialect.h"
#include "mlir/IR/DialectResourceBlobManager.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/xxhash.h"

#include <cctype>
#include <chrono>
#include <filesystem>

using namespace mlir;
using namespace pipec;
using namespace pipec::driver;

namespace {

/// Prints MLIR diagnostics as "pipec <cmd>: error: 'node': message".
class DiagnosticPrinter {
public:
  DiagnosticPrinter(MLIRContext &ctx, std::string command)
      : handler(&ctx, [command](Diagnostic &diag) {
          auto where = [](Location loc) {
            std::string name = locationName(loc);
            return name.empty() ? std::string() : "'" + name + "': ";
          };
          const char *sev = diag.getSeverity() == DiagnosticSeverity::Error
                                ? "error"
                            : diag.getSeverity() == DiagnosticSeverity::Warning
                                ? "warning"
                                : "note";
          llvm::errs() << "pipec " << command << ": " << sev << ": "
                       << where(diag.getLocation()) << diag.str() << "\n";
          for (Diagnostic &note : diag.getNotes())
            if (!llvm::StringRef(note.str()).starts_with("see current operation"))
              llvm::errs() << "  note: " << where(note.getLocation())
                         << note.str() << "\n";
          return success();
        }) {}

private:
  ScopedDiagnosticHandler handler;
};

void registerAll(DialectRegistry &registry) {
  registerImportDialects(registry);
  registry.insert<pipe::PipeDialect, arith::ArithDialect, scf::SCFDialect,
                  LLVM::LLVMDialect>();
  registerCodegenTranslations(registry);
}

std::string hex64(uint64_t v) {
  std::string s = llvm::utohexstr(v, /*LowerCase=*/true);
  return std::string(16 - s.size(), '0') + s;
}

std::string humanBytes(int64_t bytes) {
  char buf[32];
  if (bytes >= (1 << 20))
    snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  else if (bytes >= 1024)
    snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  else
    snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
  return buf;
}

/// Globals (weights) a stage's functions read or write, excluding gradient
/// accumulators.
std::vector<ml_program::GlobalOp> stageWeights(ModuleOp module, int64_t stage) {
  std::vector<ml_program::GlobalOp> result;
  std::set<std::string> seen;
  for (const char *kind : {"fwd", "bwd", "step"}) {
    auto fn = module.lookupSymbol<func::FuncOp>(stageFuncName(stage, kind));
    if (!fn)
      continue;
    fn.walk([&](ml_program::GlobalLoadOp load) {
      auto global = module.lookupSymbol<ml_program::GlobalOp>(load.getGlobal());
      if (!global || global->hasAttr(pipe::attrs::kGradOf) ||
          !seen.insert(global.getSymName().str()).second)
        return;
      result.push_back(global);
    });
  }
  return result;
}

/// Writes the initial values of `weights` as safetensors: F32, or F64 in
/// the float64 reference mode (--precision f64).
bool writeWeights(const std::vector<ml_program::GlobalOp> &weights,
                  const std::string &path, const std::string &buildId,
                  std::string &error) {
  std::vector<std::vector<char>> storage;
  std::vector<safetensors::TensorRef> tensors;
  storage.reserve(weights.size());
  for (ml_program::GlobalOp g : weights) {
    auto type = cast<RankedTensorType>(g.getType());
    const bool f64 = type.getElementType().isF64();
    const size_t elem = f64 ? sizeof(double) : sizeof(float);
    std::vector<char> data;
    Attribute value = g.getValue().value_or(Attribute());
    if (auto res = dyn_cast_or_null<DenseResourceElementsAttr>(value)) {
      AsmResourceBlob *blob = res.getRawHandle().getBlob();
      if (!blob) {
        error = "weight '" + g.getSymName().str() + "' has no data";
        return false;
      }
      ArrayRef<char> raw = blob->getData();
      data.assign(raw.begin(), raw.end());
    } else if (auto dense = dyn_cast_or_null<DenseElementsAttr>(value)) {
      auto append = [&data](auto v) {
        const char *p = reinterpret_cast<const char *>(&v);
        data.insert(data.end(), p, p + sizeof v);
      };
      if (f64)
        for (double d : dense.getValues<double>())
          append(d);
      else
        for (float f : dense.getValues<float>())
          append(f);
    } else {
      error = "weight '" + g.getSymName().str() + "' has no initial value";
      return false;
    }
    if (static_cast<int64_t>(data.size() / elem) != type.getNumElements()) {
      error = "weight '" + g.getSymName().str() + "' has " +
              std::to_string(data.size() / elem) + " values for " +
              std::to_string(type.getNumElements()) + " elements";
      return false;
    }
    storage.push_back(std::move(data));
    tensors.push_back({g.getSymName().str(), f64 ? "F64" : "F32",
                       std::vector<int64_t>(type.getShape().begin(),
                                            type.getShape().end()),
                       storage.back().data()});
  }
  return safetensors::writeFile(path, tensors,
                                {{"format", "pipec.weights/1"},
                                 {"build_id", buildId}},
                                error);
}

bool writeText(const std::string &path, const std::string &text,
               std::string &error) {
  std::string msg;
  auto out = openOutputFile(path, &msg);
  if (!out) {
    error = msg;
    return false;
  }
  out->os() << text;
  out->keep();
  return true;
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

} // namespace

namespace {

/// `pipec compile` as named phases over one Compilation: check, import,
/// plan, split and differentiate, schedule and verify, (split replicas),
/// lower, link, write outputs. Each phase is a member function with its
/// inputs in the Compilation and its outputs stored back there; each is
/// timed (`--timings`). A phase returns false after printing its error
/// (`status` says the exit code).
class Compilation {
public:
  explicit Compilation(const CompileOptions &o)
      : o(o), ctx(registryOf()), printer(ctx, cmd) {
    ctx.loadAllAvailableDialects();
  }
  ~Compilation() {
    // --schedule synth's temporary order, if a later phase failed.
    if (!synthPath.empty())
      llvm::sys::fs::remove(synthPath);
  }

  int run() {
    auto t0 = std::chrono::steady_clock::now();
    bool ok =
        timed("check", &Compilation::check) &&
        timed("import", &Compilation::import) &&
        timed("plan", &Compilation::plan) &&
        (!autoRecompute() ||
         timed("choose recomputation", &Compilation::chooseRecompute)) &&
        timed("split and differentiate", &Compilation::splitAndDifferentiate) &&
        (!o.synthesize ||
         timed("synthesise schedule", &Compilation::synthesize)) &&
        timed("schedule and verify", &Compilation::scheduleAndVerify) &&
        checkMemoryLimit() && checkTarget() &&
        (!split || timed("split replicas", &Compilation::sliceReplicas)) &&
        timed("write outputs", &Compilation::prepareOutputs) &&
        lowerAndLinkStages() &&
        timed("write outputs", &Compilation::writeManifest);
    if (o.timings)
      printTimings();
    if (!ok)
      return status;
    say("wrote " + o.outDir + "/manifest.json (build " + buildId + ") in " +
        std::to_string(since(t0)).substr(0, 4) + " s; run: pipec train " +
        o.outDir);
    return 0;
  }

private:
  const std::string cmd = "compile";
  const CompileOptions &o;
  MLIRContext ctx;
  DiagnosticPrinter printer;
  std::string error;
  int status = 1;
  /// Phase -> seconds, in first-run order.
  std::vector<std::pair<std::string, double>> timings;

  // check
  int64_t batch = 0, microbatch = 0;
  bool split = false;
  // import ... schedule and verify
  OwningOpRef<ModuleOp> module;
  TrainingPipelineOptions tpo;
  // split replicas: samples -> the model compiled at that slice size
  std::map<int64_t, OwningOpRef<ModuleOp>> sliceModules;
  // write outputs
  std::string buildId, modelHash;
  Plan planOut;
  /// manifest.json, filled by the phases and written last.
  formats::Manifest manifest;
  int nextRank = 0;

  static DialectRegistry registryOf() {
    DialectRegistry registry;
    registerAll(registry);
    return registry;
  }
  void say(const std::string &line) const {
    if (!o.quiet)
      llvm::outs() << "pipec compile: " << line << "\n";
  }
  bool failWith(const std::string &message) {
    status = fail(cmd, message);
    return false;
  }
  bool timed(const std::string &phase, bool (Compilation::*fn)()) {
    auto start = std::chrono::steady_clock::now();
    bool ok = (this->*fn)();
    addTime(phase, since(start));
    return ok;
  }
  void addTime(const std::string &phase, double seconds) {
    for (auto &[name, s] : timings)
      if (name == phase) {
        s += seconds;
        return;
      }
    timings.push_back({phase, seconds});
  }
  void printTimings() const {
    double total = 0;
    for (const auto &[name, s] : timings)
      total += s;
    llvm::outs() << "pipec compile: timings (s):";
    for (const auto &[name, s] : timings)
      llvm::outs() << llvm::formatv(" {0} {1:f3},", name, s);
    llvm::outs() << llvm::formatv(" total {0:f3}\n", total);
  }
  /// Runs passes built by `build` over `m`; false after the diagnostics.
  bool runPasses(ModuleOp m,
                 void (*build)(OpPassManager &, const TrainingPipelineOptions &)) {
    PassManager pm(&ctx);
    build(pm, tpo);
    return succeeded(pm.run(m));
  }

  bool check();
  bool import();
  OwningOpRef<ModuleOp> importAt(int64_t samples);
  void noteImport();
  bool plan() { return runPasses(*module, buildPlanningPipeline); }
  bool splitAndDifferentiate() {
    return runPasses(*module, buildDifferentiationPipeline);
  }
  bool scheduleAndVerify() {
    return runPasses(*module, buildSchedulingPipeline);
  }
  bool autoRecompute() const {
    return o.recompute.size() == 1 && o.recompute[0] == "auto";
  }
  bool chooseRecompute();
  bool checkMemoryLimit();
  bool checkTarget();
  bool synthesize();
  /// --schedule synth: the chosen order (compute-only CSV) and the
  /// temporary file the schedule pass reads it from.
  std::string synthCsv, synthPath;
  bool sliceReplicas();
  bool checkSampleMajor(ModuleOp sliced, int64_t n);
  int64_t sliceOf(int s, int j) const {
    int r = o.replicas.empty() ? 1 : o.replicas[size_t(s)];
    return split ? pipe::replicaSlice(microbatch, r, j).second : microbatch;
  }
  bool prepareOutputs();
  std::string buildKey(llvm::StringRef modelBytes) const;
  void fillPlan();
  bool lowerAndLinkStages();
  bool lowerAndLinkStage(int s);
  bool writeManifest();
};

bool Compilation::check() {
  if (o.stages < 1)
    return failWith("--stages must be >= 1");
  int64_t fileBatch = onnxFileBatch(o.model, error);
  if (fileBatch < 0)
    return failWith(error);
  batch = o.batch ? o.batch : fileBatch;
  if (batch <= 0)
    return failWith("'" + o.model +
                    "' has a dynamic batch dimension; give the global batch "
                    "with --batch N");
  if (o.microbatches >= 1 && batch % o.microbatches)
    return failWith("the global batch " + std::to_string(batch) +
                    " is not divisible into " + std::to_string(o.microbatches) +
                    " microbatches; change --batch or --microbatches");
  split = o.replicaMode == "split" &&
          llvm::any_of(o.replicas, [](int r) { return r > 1; });
  // The schedule and replica rules (lib/Schedule/Rules.cpp), before any
  // work; the schedule pass checks them again with the tied weights.
  auto kind = parseScheduleKind(o.schedule);
  if (!kind)
    return failWith("unknown --schedule '" + o.schedule + "'");
  PipelineRequest request;
  request.kind = *kind;
  request.stages = int64_t(o.stages) * o.chunks;
  request.chunks = o.chunks;
  request.microbatches = o.microbatches;
  request.replicas = o.replicas;
  request.warmup = o.warmup == "B" ? WarmupPolicy::B : WarmupPolicy::A;
  if (split && o.microbatches >= 1)
    request.splitSamples = batch / o.microbatches;
  // Each broken rule named with the option to change.
  std::string why;
  for (const RuleViolation &v : checkPipelineRules(request)) {
    std::string option;
    if (v.rule == "chunks" || v.rule == "chunks-divide")
      option = "--chunks " + std::to_string(o.chunks);
    else if (v.rule == "warmup")
      option = "--warmup " + o.warmup;
    else if (v.rule == "microbatches" || v.rule == "interleaved" ||
             v.rule == "2bw-depth")
      option = "--microbatches " + std::to_string(o.microbatches);
    else if (!o.replicas.empty())
      option = "--replicas " +
               llvm::join(llvm::map_range(o.replicas,
                                          [](int r) { return std::to_string(r); }),
                          ",");
    why += (why.empty() ? "" : "\n") + (option.empty() ? "" : option + ": ") +
           v.message;
  }
  if (!why.empty())
    return failWith(why);
  microbatch = batch / o.microbatches;

  tpo.profile = o.profile;
  tpo.device = o.device;
  // The planner splits the model into stages x chunks pipeline stages; the
  // interleaved schedule puts stage c*p + r on device r.
  tpo.stages = o.stages * o.chunks;
  tpo.chunks = o.chunks;
  tpo.loss = o.loss;
  tpo.schedule = o.schedule;
  tpo.scheduleCsv = o.scheduleCsv;
  tpo.recompute = o.recompute;
  tpo.microbatches = o.microbatches;
  tpo.optimizer = o.optimizer;
  tpo.momentum = o.momentum;
  tpo.beta1 = o.beta1;
  tpo.beta2 = o.beta2;
  tpo.epsilon = o.epsilon;
  tpo.weightDecay = o.weightDecay;
  tpo.replicas = o.replicas;
  tpo.warmup = o.warmup;
  tpo.cuts = o.cuts;
  tpo.precision = o.precision;
  tpo.activations = o.activations;
  if (split)
    tpo.splitSamples = int(microbatch);
  return true;
}

/// The model imported with `samples` as its batch dimension.
OwningOpRef<ModuleOp> Compilation::importAt(int64_t samples) {
  ImportOptions importOptions;
  importOptions.batch = samples;
  importOptions.inputShapes = o.inputShapes;
  importOptions.frozen = o.frozen;
  importOptions.untieWeights = o.untieWeights;
  importOptions.fuse = !o.noFuse;
  for (auto &[name, shape] : importOptions.inputShapes)
    if (!shape.empty())
      shape[0] = samples;
  return importOnnxFile(ctx, o.model, importOptions, error);
}

bool Compilation::import() {
  module = importAt(microbatch);
  if (!module)
    return failWith(error);
  noteImport();
  return true;
}

/// What the import says about the model: its size, and the initializers
/// that are buffers or shared (tied).
void Compilation::noteImport() {
  int64_t layers = 0, params = 0;
  module->walk([&](Operation *op) {
    if (isLayer(op))
      ++layers;
    if (auto g = dyn_cast<ml_program::GlobalOp>(op))
      params += cast<RankedTensorType>(g.getType()).getNumElements();
  });
  // The layers are numbered from 0 (--cuts numbers them so); the loss the
  // compiler adds comes after them, in the last stage (the stage lines
  // count its layers too).
  std::string numbering =
      " (0-" + std::to_string(std::max<int64_t>(layers - 1, 0)) +
      (o.loss == "model" ? ")" : "; the loss follows, in the last stage)");
  say("imported " + o.model + ": " + std::to_string(layers) + " layers" +
      numbering + ", " + std::to_string(params) + " parameters; global batch " +
      std::to_string(batch) + " = " + std::to_string(o.microbatches) +
      " microbatches of " + std::to_string(microbatch));
  if (o.precision == "f64")
    say("precision f64: every kernel, buffer, message and checkpoint in "
        "double");
  else if (o.precision == "bf16")
    say(std::string("precision bf16: matrix products on bfloat16 operands, "
                    "float32 sums") +
        (o.activations == "bf16"
             ? "; activations, messages and stash stored in bfloat16"
         : o.activations == "bf16-casts"
             ? "; activations, messages and stash stored in bfloat16, "
               "every op between casts"
             : "; every tensor float32"));
  if (auto names = (*module)->getAttrOfType<ArrayAttr>("pipec.gradient_free")) {
    std::string list;
    for (auto [i, n] : llvm::enumerate(names.getAsValueRange<StringAttr>()))
      if (i < 6)
        list += (i ? ", " : "") + n.str();
    if (names.size() > 6)
      list += ", ...";
    say("note: " + std::to_string(names.size()) +
        " float initializer(s) get no gradient and are constants (buffers): " +
        list);
  }
  // A parameter read by several nodes trains as one (tied weights). Say so:
  // an exporter may have merged equal initializers of distinct layers.
  std::vector<std::pair<std::string, size_t>> shared;
  module->walk([&](ml_program::GlobalLoadOp load) {
    llvm::SmallPtrSet<Operation *, 4> users(load->user_begin(),
                                            load->user_end());
    if (users.size() > 1)
      shared.push_back(
          {load.getGlobal().getLeafReference().str(), users.size()});
  });
  if (shared.empty())
    return;
  std::string list;
  for (size_t i = 0; i < shared.size() && i < 4; ++i)
    list += (i ? ", " : "") + shared[i].first + " (" +
            std::to_string(shared[i].second) + " nodes)";
  if (shared.size() > 4)
    list += ", ... (" + std::to_string(shared.size()) + " in all)";
  say("note: " + std::to_string(shared.size()) +
      " weight(s) are read by several nodes and train as one parameter "
      "each (tied; stages holding copies sum their gradients): " + list +
      "; if the exporter merged equal initializers (torch.onnx.export in "
      "eval mode does), compile with --untie-weights");
}

/// Split replicas (DAPPLE): replica j of a stage with r replicas runs
/// samples [j*b/r, (j+1)*b/r) of every microbatch, so its program is the
/// stage compiled for that many samples: the model imported again at each
/// slice size, cut where the full microbatch's plan cut it.
bool Compilation::sliceReplicas() {
  auto planned = (*module)->getAttrOfType<pipe::PlanAttr>(pipe::attrs::kPlan);
  TrainingPipelineOptions sliceOptions = tpo;
  sliceOptions.cuts.clear();
  for (int64_t l : planned.getLast().asArrayRef())
    sliceOptions.cuts.push_back(int(l));
  for (int s = 0; s < o.stages; ++s)
    for (int j = 0; j < o.replicas[size_t(s)]; ++j) {
      int64_t n = sliceOf(s, j);
      if (n == microbatch || sliceModules.count(n))
        continue;
      auto sliced = importAt(n);
      if (!sliced)
        return failWith(error);
      PassManager slicePm(&ctx);
      buildTrainingPipeline(slicePm, sliceOptions);
      if (failed(slicePm.run(*sliced)) || !checkSampleMajor(*sliced, n))
        return false;
      say("split replicas: stage programs for slices of " + std::to_string(n) +
          " of the " + std::to_string(microbatch) + " samples");
      sliceModules.emplace(n, std::move(sliced));
    }
  return true;
}

/// Every tensor between stages must be sample-major: its rows are the
/// samples' (so a slice of samples is a slice of rows).
bool Compilation::checkSampleMajor(ModuleOp sliced, int64_t n) {
  for (int q = 0; q < o.stages * o.chunks; ++q) {
    auto full = module->lookupSymbol<func::FuncOp>(stageFuncName(q, "fwd"));
    auto part = sliced.lookupSymbol<func::FuncOp>(stageFuncName(q, "fwd"));
    if (!full || !part || full.getNumArguments() != part.getNumArguments())
      return failWith("stage " + std::to_string(q) +
                      " differs between the model at " +
                      std::to_string(microbatch) + " and at " +
                      std::to_string(n) + " samples");
    for (unsigned i = 0; i < full.getNumArguments(); ++i) {
      auto a = cast<RankedTensorType>(full.getArgumentTypes()[i]);
      auto b = cast<RankedTensorType>(part.getArgumentTypes()[i]);
      bool sampleMajor =
          a.getRank() == b.getRank() && a.getRank() > 0 &&
          a.getShape().drop_front() == b.getShape().drop_front() &&
          a.getDimSize(0) * n == b.getDimSize(0) * microbatch;
      if (sampleMajor)
        continue;
      std::string shapes;
      llvm::raw_string_ostream os(shapes);
      os << a << " at " << microbatch << " samples, " << b << " at " << n;
      return failWith("--replica-mode split needs every tensor entering a "
                      "stage to have the samples as its leading dimension; "
                      "argument " + std::to_string(i) + " of stage " +
                      std::to_string(q) + " is " + shapes +
                      " (use --replica-mode rr)");
    }
  }
  return true;
}

/// Build id: the model's bytes and everything that shapes the programs.
std::string Compilation::buildKey(llvm::StringRef modelBytes) const {
  std::string key = modelBytes.str();
  key += "|" + std::to_string(o.stages) + "|" + std::to_string(o.microbatches) +
         "|" + std::to_string(batch) + "|" + o.schedule + "|" + o.loss + "|" +
         o.profile + "|" + o.device + "|" + o.optimizer + "|" +
         std::to_string(o.momentum) + "|" + std::to_string(o.beta1) + "|" +
         std::to_string(o.beta2) + "|" + std::to_string(o.epsilon) + "|" +
         std::to_string(o.weightDecay);
  for (int r : o.replicas)
    key += "|r" + std::to_string(r);
  key += "|" + o.replicaMode;
  key += "|w" + o.warmup + "|v" + std::to_string(o.chunks);
  for (const std::string &f : o.frozen)
    key += "|f" + f;
  for (int l : o.cuts)
    key += "|c" + std::to_string(l);
  key += "|p" + o.precision;
  if (o.activations != "f32")
    key += "|a" + o.activations;
  if (o.untieWeights)
    key += "|u";
  if (o.noFuse)
    key += "|n";
  if (o.target != "cpu")
    key += "|t" + o.target;
  // Recomputation (as chosen, per stage) and a custom order change the
  // programs and the arena too.
  for (const std::string &mode : tpo.recompute)
    key += "|m" + mode;
  if (!synthCsv.empty())
    key += "|s" + synthCsv;
  else if (!tpo.scheduleCsv.empty())
    if (auto csv = llvm::MemoryBuffer::getFile(tpo.scheduleCsv))
      key += "|s" + (*csv)->getBuffer().str();
  return key;
}

/// The output folder, the build id, pipeline.mlir (--emit-mlir) and
/// plan.json.
bool Compilation::prepareOutputs() {
  std::error_code ec = llvm::sys::fs::create_directories(o.outDir + "/weights");
  if (!ec)
    ec = llvm::sys::fs::create_directories(o.outDir + "/obj");
  if (ec)
    return failWith("cannot create '" + o.outDir + "': " + ec.message());
  auto bytes = llvm::MemoryBuffer::getFile(o.model);
  if (!bytes)
    return failWith("cannot read '" + o.model + "'");
  buildId = hex64(llvm::xxh3_64bits(llvm::StringRef(buildKey((*bytes)->getBuffer()))));
  modelHash = hex64(llvm::xxh3_64bits((*bytes)->getBuffer()));
  if (!synthCsv.empty()) {
    // The synthesised order, reusable with --schedule-csv and readable by
    // pipec simulate --schedule-csv.
    if (!writeText(o.outDir + "/schedule.csv", synthCsv, error))
      return failWith(error);
    llvm::sys::fs::remove(synthPath);
  } else if (!o.scheduleCsv.empty()) {
    // The order a --schedule-csv build runs, kept beside its plan.json, so
    // that `pipec simulate OUT/plan.json --schedule-csv OUT/schedule.csv`
    // works without the original file.
    auto csv = llvm::MemoryBuffer::getFile(o.scheduleCsv);
    if (!csv)
      return failWith("cannot read '" + o.scheduleCsv + "'");
    if (!writeText(o.outDir + "/schedule.csv", (*csv)->getBuffer().str(),
                   error))
      return failWith(error);
  }
  if (o.emitMlir) {
    std::string text;
    llvm::raw_string_ostream os(text);
    module->print(os, OpPrintingFlags().elideLargeResourceString(64));
    if (!writeText(o.outDir + "/pipeline.mlir", text, error))
      return failWith(error);
  }
  fillPlan();
  if (!writeText(o.outDir + "/plan.json", planToJson(planOut) + "\n", error))
    return failWith(error);
  return true;
}

/// plan.json from the module's plan: stages, replicas, devices.
/// Where the module's pipeline places its stages (after scheduling).
static Placement placementOfModule(ModuleOp m) {
  Placement placement = Placement::Loop;
  m.walk([&](pipe::PipelineOp pipeline) {
    if (auto name = pipeline.getPlacement())
      placement = parsePlacement(name->str()).value_or(Placement::Loop);
  });
  return placement;
}

/// The arena of every device position (the largest of its ranks), from
/// the programs' pipe.arena_bytes (--pipe-plan-memory).
static std::map<int64_t, int64_t> positionArenas(ModuleOp m) {
  std::map<int64_t, int64_t> arenas;
  m.walk([&](pipe::ProgramOp program) {
    if (auto bytes = program->getAttrOfType<IntegerAttr>("pipe.arena_bytes")) {
      int64_t &a = arenas[program.getStage()];
      a = std::max(a, bytes.getInt());
    }
  });
  return arenas;
}

/// --recompute auto: the planned module is differentiated and scheduled
/// once per mode (none, selective, full), and every device position takes
/// the first mode whose arena fits --memory-limit (a position's arena
/// depends on its own stages' modes only). Nothing fits: the error says what
/// full recomputation would need.
bool Compilation::chooseRecompute() {
  const char *const modes[] = {"none", "selective", "full"};
  std::map<std::string, std::map<int64_t, int64_t>> arenas;
  const std::vector<std::string> asked = tpo.recompute;
  Placement placement = Placement::Loop;
  for (const char *mode : modes) {
    OwningOpRef<ModuleOp> trial = module->clone();
    tpo.recompute = {mode};
    bool ok = runPasses(*trial, buildDifferentiationPipeline) &&
              runPasses(*trial, buildSchedulingPipeline);
    tpo.recompute = asked;
    if (!ok)
      return false;
    arenas[mode] = positionArenas(*trial);
    placement = placementOfModule(*trial);
  }
  std::vector<std::string> chosen(size_t(o.stages));
  for (int64_t r = 0; r < o.stages; ++r) {
    std::string line = "recompute auto: stage " + std::to_string(r) + ":";
    for (const char *mode : modes) {
      int64_t bytes = arenas[mode][r];
      line += std::string(mode == modes[0] ? " " : ", ") + mode + " " +
              humanBytes(bytes);
      if (chosen[size_t(r)].empty() && bytes <= o.memoryLimit)
        chosen[size_t(r)] = mode;
    }
    // --schedule synth: these arenas hold zb-h1's microbatches in flight;
    // the synthesiser caps them to fit the limit, so the least memory
    // (full) goes on to it, and it refuses, with the bytes, if no cap fits.
    if (chosen[size_t(r)].empty() && o.synthesize) {
      chosen[size_t(r)] = "full";
      line += " (zb-h1's in-flight count; the synthesiser caps it)";
    }
    if (chosen[size_t(r)].empty())
      return failWith(
          "stage " + std::to_string(r) + " needs " +
          humanBytes(arenas["full"][r]) + " (" +
          std::to_string(arenas["full"][r]) +
          " bytes) even with full recomputation, over --memory-limit " +
          humanBytes(o.memoryLimit) +
          "; use more stages, more microbatches (smaller ones) or a larger "
          "limit");
    say(line + " -> " + chosen[size_t(r)] + " (limit " +
        humanBytes(o.memoryLimit) + ")");
  }
  // Pipeline stage q runs on device position q mod p (or in a V).
  tpo.recompute.clear();
  for (int64_t q = 0; q < int64_t(o.stages) * o.chunks; ++q)
    tpo.recompute.push_back(
        chosen[size_t(positionOfStage(placement, o.stages, q))]);
  return true;
}

/// Every rank's arena within --memory-limit, else one error naming the
/// stage, its bytes and what would help.
bool Compilation::checkMemoryLimit() {
  if (o.memoryLimit <= 0)
    return true;
  for (auto [position, bytes] : positionArenas(*module))
    if (bytes > o.memoryLimit)
      return failWith(
          "stage " + std::to_string(position) + " needs " + humanBytes(bytes) +
          " (" + std::to_string(bytes) +
          " bytes of arena: weights, gradients, optimizer state, stash "
          "slots, io and scratch), over --memory-limit " +
          humanBytes(o.memoryLimit) +
          (autoRecompute() ? std::string() : "; try --recompute full or auto") +
          ", more stages or more microbatches (smaller ones)");
  return true;
}

/// --target cuda: every kernel the stages call has a CUDA twin, checked
/// before anything is written (the error names the kernels and their ops).
bool Compilation::checkTarget() {
  if (o.target == "cpu")
    return true;
  for (int s = 0; s < o.stages; ++s)
    if (failed(checkStageTarget(*module, s, o.target)))
      return false; // the diagnostic said why
  return true;
}

/// --schedule synth: the synthesiser's order (lib/Sim/Synth.cpp) for this
/// model's stage times (the ops' nn.cost) and --memory-limit. The limit
/// becomes a cap on each stage's microbatches in flight: a trial zb-h1
/// schedule (the same split stage functions and slot layout) gives each
/// position's fixed bytes and the bytes of one stash slot. The chosen order
/// runs as a custom schedule and is kept in OUT/schedule.csv.
bool Compilation::synthesize() {
  const int p = o.stages;
  const int64_t m = o.microbatches;
  std::vector<int64_t> caps(size_t(p), m);
  if (o.memoryLimit > 0) {
    OwningOpRef<ModuleOp> trial = module->clone();
    if (!runPasses(*trial, buildSchedulingPipeline))
      return false;
    std::map<int64_t, std::pair<int64_t, int64_t>> perPosition; // fixed, slot
    trial->walk([&](pipe::ProgramOp program) {
      auto arena = program->getAttrOfType<IntegerAttr>("pipe.arena_bytes");
      auto slot = program->getAttrOfType<IntegerAttr>("pipe.slot_bytes");
      if (arena && slot)
        perPosition[program.getStage()] = {
            arena.getInt() - program.getSlots() * slot.getInt(), slot.getInt()};
    });
    for (int s = 0; s < p; ++s) {
      auto [fixed, slot] = perPosition[s];
      int64_t room = o.memoryLimit - fixed;
      caps[size_t(s)] = slot > 0 ? std::min(m, room / slot) : m;
      if (room <= 0 || caps[size_t(s)] < 1)
        return failWith("stage " + std::to_string(s) + " needs " +
                        humanBytes(fixed + slot) + " (" +
                        std::to_string(fixed + slot) +
                        " bytes) with one microbatch in flight, over "
                        "--memory-limit " +
                        humanBytes(o.memoryLimit) +
                        "; use more stages, more microbatches (smaller "
                        "ones), --recompute or a larger limit");
    }
  }
  // Stage times from the ops' costs: one profile op per stage.
  Profile profile;
  profile.microbatch = microbatch;
  Plan plan;
  plan.schedule = "custom";
  plan.microbatches = int(m);
  plan.microbatchSize = microbatch;
  for (int s = 0; s < p; ++s) {
    ProfileOp op;
    op.name = "stage" + std::to_string(s);
    if (auto fwd = module->lookupSymbol<func::FuncOp>(stageFuncName(s, "fwd")))
      fwd.walk([&](Operation *inner) {
        if (auto cost = inner->getAttrOfType<nn::CostAttr>("nn.cost")) {
          op.fwdSeconds += cost.getFwd().convertToDouble();
          op.bwdSeconds += cost.getBwd().convertToDouble();
        }
      });
    profile.ops.push_back(op);
    plan.stages.push_back({s, s, 1, {s}});
  }
  // Messages between CPU processes on one host: no link model here.
  Topology topology = Topology::flat(p, 1e15, 0);
  SynthResult synth = synthesizeSchedule(profile, topology, plan, caps);
  if (!synth.ok)
    return failWith("--schedule synth: " + synth.error);
  std::string compared;
  for (const SynthCandidate &c : synth.candidates)
    if (c.name == synth.best.name || c.name == "1f1b-flush" ||
        c.name == "zb-h1" || c.name == "zb-h2" || c.name == "gpipe")
      compared +=
          (compared.empty() ? "" : ", ") + c.name + " " +
          (c.feasible
               ? llvm::formatv("{0:f2} ms", c.iterationSeconds * 1e3).str()
               : c.note);
  std::string caps_;
  for (int64_t c : caps)
    caps_ += (caps_.empty() ? "" : ",") + std::to_string(c);
  say("schedule synth: " + std::to_string(synth.candidates.size()) +
      " orders compared within in-flight caps " + caps_ + "; chose " +
      synth.best.name + " (predicted; " + compared + ")");
  synthCsv = scheduleToCsv(synth.best.schedule, error);
  if (synthCsv.empty())
    return failWith("--schedule synth: " + error);
  // The schedule pass reads the order from a file.
  llvm::SmallString<128> path;
  int fd = -1;
  if (llvm::sys::fs::createTemporaryFile("pipec-synth", "csv", fd, path))
    return failWith("cannot write a temporary schedule file");
  {
    llvm::raw_fd_ostream out(fd, /*shouldClose=*/true);
    out << synthCsv;
  }
  synthPath = path.str().str();
  tpo.schedule = "custom";
  tpo.scheduleCsv = synthPath;
  return true;
}

void Compilation::fillPlan() {
  auto planAttr = (*module)->getAttrOfType<pipe::PlanAttr>(pipe::attrs::kPlan);
  planOut.algorithm = planAttr.getAlgorithm().str();
  planOut.schedule = tpo.schedule;
  planOut.microbatches = o.microbatches;
  planOut.microbatchSize = microbatch;
  planOut.chunks = o.chunks;
  planOut.splitReplicas = split;
  // Device position r holds the replicas of stage r (and of the chunks
  // c*p + r of an interleaved plan) on consecutive devices.
  std::vector<std::vector<int>> positionDevices(size_t(o.stages));
  int device = 0;
  for (int r = 0; r < o.stages; ++r)
    for (int j = 0; j < planAttr.getReplicas()[r]; ++j)
      positionDevices[size_t(r)].push_back(device++);
  for (int64_t s = 0; s < static_cast<int64_t>(planAttr.getFirst().size()); ++s) {
    const std::vector<int> &devices = positionDevices[size_t(
        positionOfStage(placementOfModule(*module), o.stages, s))];
    planOut.stages.push_back({static_cast<int>(planAttr.getFirst()[s]),
                              static_cast<int>(planAttr.getLast()[s]),
                              static_cast<int>(devices.size()), devices});
  }
  // The loss that autodiff appended is a layer of the last stage too (as in
  // the profiles `pipec profile` measures), so the plan covers it. (Counted
  // by autodiff: the ops now in the stages are fewer where
  // nn-fold-transposes read a transpose's input in place.)
  if (auto appended =
          (*module)->getAttrOfType<IntegerAttr>(pipe::attrs::kLossLayers);
      appended && !planOut.stages.empty())
    planOut.stages.back().lastLayer += static_cast<int>(appended.getInt());
  // Recomputation per stage, as the recompute pass recorded it.
  for (size_t s = 0; s < planOut.stages.size(); ++s)
    if (auto fwd = module->lookupSymbol<func::FuncOp>(stageFuncName(s, "fwd")))
      if (auto mode = fwd->getAttrOfType<StringAttr>("pipe.recompute"))
        planOut.stages[s].recompute = mode.getValue().str();
}

bool Compilation::lowerAndLinkStages() {
  for (int s = 0; s < o.stages; ++s)
    if (!lowerAndLinkStage(s))
      return false;
  return true;
}

/// Device position s: its weights file, one executable per replica (each
/// runs its own microbatches), and its manifest entry.
bool Compilation::lowerAndLinkStage(int s) {
  auto stageStart = std::chrono::steady_clock::now();
  auto phaseStart = stageStart;
  std::string weightsRel = "weights/stage" + std::to_string(s) + ".safetensors";
  // Device position s holds stage s, or the chunks c*p + s (a V: s and
  // 2p-1-s).
  const Placement placement = placementOfModule(*module);
  std::vector<ml_program::GlobalOp> weights;
  for (int c = 0; c < o.chunks; ++c)
    for (auto g :
         stageWeights(*module, stageOfChunk(placement, o.stages, s, c)))
      weights.push_back(g);
  int64_t weightBytes = 0;
  for (auto g : weights)
    weightBytes += nn::tensorBytes(g.getType());
  if (!writeWeights(weights, o.outDir + "/" + weightsRel, buildId, error))
    return failWith(error);
  addTime("write outputs", since(phaseStart));

  int replicas = planOut.stages[s].replicas;
  formats::ManifestStage entry;
  entry.stage = s;
  entry.weights = weightsRel;
  int64_t arena = 0;
  for (int j = 0; j < replicas; ++j) {
    phaseStart = std::chrono::steady_clock::now();
    int64_t samples = sliceOf(s, j);
    OwningOpRef<ModuleOp> stageModule =
        samples == microbatch ? module->clone() : sliceModules.at(samples)->clone();
    PassManager lower(&ctx);
    buildStageLoweringPipeline(lower, s, buildId, j, o.target);
    if (failed(lower.run(*stageModule)))
      return false; // the diagnostics said why
    if (auto a = (*stageModule)->getAttrOfType<IntegerAttr>("pipec.arena_bytes"))
      arena = std::max(arena, a.getInt());
    std::string name = "stage" + std::to_string(s) +
                       (replicas > 1 ? "r" + std::to_string(j) : "");
    std::string obj = o.outDir + "/obj/" + name + ".o";
    std::string exe = o.outDir + "/" + name;
    bool emitted = emitObjectFile(*stageModule, obj, error);
    addTime("lower", since(phaseStart));
    if (!emitted)
      return failWith(error);
    phaseStart = std::chrono::steady_clock::now();
    bool linked = linkExecutable({obj}, exe, error, o.target);
    addTime("link", since(phaseStart));
    if (!linked)
      return failWith(error);
    if (j == 0)
      entry.binary = name;
    if (replicas > 1)
      entry.binaries.push_back(name);
    entry.ranks.push_back(nextRank++);
  }
  std::string layers;
  for (int c = 0; c < o.chunks; ++c) {
    const auto &st =
        planOut.stages[size_t(stageOfChunk(placement, o.stages, s, c))];
    layers += (c ? ", " : "") + std::to_string(st.firstLayer) + "-" +
              std::to_string(st.lastLayer);
  }
  say("stage " + std::to_string(s) + ": layers " + layers + ", " +
      std::to_string(weights.size()) + " weights (" + humanBytes(weightBytes) +
      "), arena " + humanBytes(arena) +
      (replicas > 1 ? ", " + std::to_string(replicas) +
                          (split ? " replicas splitting each microbatch"
                                 : " replicas")
                    : "") +
      " -> " + o.outDir + "/stage" + std::to_string(s) +
      (replicas > 1 ? "r*" : "") + " (" +
      std::to_string(since(stageStart)).substr(0, 4) + " s)");
  entry.arenaBytes = arena;
  manifest.stages.push_back(std::move(entry));
  return true;
}

/// pipec's own names for a stage's files: stageN, stageNrM (an executable),
/// obj/ + one of those + .o, weights/stageN.safetensors.
bool isStageFileName(const std::string &rel) {
  auto digits = [](const std::string &t, size_t &i) {
    size_t from = i;
    while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i])))
      ++i;
    return i > from;
  };
  std::string t = rel;
  bool object = false;
  if (t.rfind("weights/", 0) == 0) {
    t = t.substr(8);
    size_t i = 5;
    return t.rfind("stage", 0) == 0 && digits(t, i) &&
           t.substr(i) == ".safetensors";
  }
  if (t.rfind("obj/", 0) == 0) {
    t = t.substr(4);
    object = true;
  }
  size_t i = 5;
  if (t.rfind("stage", 0) != 0 || !digits(t, i))
    return false;
  if (i < t.size() && t[i] == 'r' && !digits(t, ++i))
    return false;
  return t.substr(i) == (object ? ".o" : "");
}

/// A folder compiled before with more stages or replicas kept their
/// executables, objects and weights beside the new build's: removes the
/// files of pipec's stage names that `manifest` does not list; returns how
/// many.
int removeStaleStageFiles(const std::string &outDir,
                          const formats::Manifest &manifest) {
  namespace fs = std::filesystem;
  std::set<std::string> keep;
  for (const formats::ManifestStage &st : manifest.stages) {
    std::vector<std::string> binaries = st.binaries;
    binaries.push_back(st.binary);
    for (const std::string &b : binaries) {
      keep.insert(b);
      keep.insert("obj/" + b + ".o");
    }
    keep.insert(st.weights);
  }
  int removed = 0;
  for (const char *sub : {"", "obj", "weights"}) {
    std::error_code ec;
    fs::directory_iterator it(fs::path(outDir) / sub, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      std::string rel = (fs::path(sub) / it->path().filename()).string();
      std::error_code fileEc;
      if (!it->is_regular_file(fileEc) || keep.count(rel) ||
          !isStageFileName(rel))
        continue;
      if (fs::remove(it->path(), fileEc))
        ++removed;
    }
  }
  return removed;
}

/// manifest.json (pipec/formats/Documents.h): the stages, model inputs and
/// labels at the global batch.
bool Compilation::writeManifest() {
  auto names = (*module)->getAttrOfType<ArrayAttr>("pipec.inputs");
  for (int s = 0; s < o.stages * o.chunks; ++s) {
    auto fwd = module->lookupSymbol<func::FuncOp>(stageFuncName(s, "fwd"));
    for (unsigned i = 0; i < fwd.getNumArguments(); ++i) {
      auto feed = fwd.getArgAttrOfType<IntegerAttr>(i, pipe::attrs::kFeed);
      if (!feed || feed.getInt() == -2)
        continue; // -2: the dropout random state comes from the runtime
      auto t = cast<RankedTensorType>(fwd.getArgumentTypes()[i]);
      std::vector<int64_t> shape(t.getShape().begin(), t.getShape().end());
      if (!shape.empty())
        shape[0] = batch;
      if (feed.getInt() < 0) {
        manifest.hasLabels = true;
        manifest.labels = {"labels", shape, "i64",
                           labelClasses(fwd.getArgument(i))};
        continue;
      }
      if (static_cast<int64_t>(manifest.inputs.size()) > feed.getInt())
        continue;
      manifest.inputs.push_back(
          {names ? cast<StringAttr>(names[feed.getInt()]).str() : "", shape,
           t.getElementType().isF32()   ? "f32"
           : t.getElementType().isF64() ? "f64"
                                        : "i64",
           0});
    }
  }
  manifest.buildId = buildId;
  manifest.model = llvm::sys::path::filename(o.model).str();
  manifest.modelHash = modelHash;
  manifest.schedule = tpo.schedule;
  manifest.precision = o.precision;
  manifest.target = o.target;
  manifest.microbatches = o.microbatches;
  manifest.microbatch = microbatch;
  manifest.globalBatch = batch;
  manifest.numRanks = nextRank;
  if (!writeText(o.outDir + "/manifest.json", formats::writeManifest(manifest),
                 error))
    return failWith(error);
  if (int removed = removeStaleStageFiles(o.outDir, manifest))
    say("removed " + std::to_string(removed) +
        " stage file(s) of an earlier build in " + o.outDir);
  return true;
}

} // namespace

int pipec::driver::compileModel(const CompileOptions &o) {
  return Compilation(o).run();
}

/// --schedule-csv FILE: read and check the file now (one clear error before
/// any work) and take the stages, chunks and microbatches from it; an
/// explicit option that disagrees is refused naming both.
static bool applyScheduleCsv(const Args &a, CompileOptions &o) {
  const std::string path = a.get("--schedule-csv");
  auto buffer = llvm::MemoryBuffer::getFile(path);
  if (!buffer) {
    fail("compile", "cannot read --schedule-csv '" + path +
                        "': " + buffer.getError().message());
    return false;
  }
  CsvSchedule csv = parseScheduleCsv((*buffer)->getBuffer().str());
  if (!csv.ok) {
    fail("compile", "--schedule-csv '" + path + "' cannot run: " + csv.error);
    return false;
  }
  if (a.has("--schedule") && a.get("--schedule") != "custom") {
    fail("compile", "--schedule-csv runs the file's order; drop --schedule " +
                        a.get("--schedule"));
    return false;
  }
  const ScheduleResult &s = csv.schedule;
  const std::pair<const char *, std::pair<int64_t, int64_t>> given[] = {
      {"--stages", {o.stages, s.stages}},
      {"--chunks", {o.chunks, s.chunks}},
      {"--microbatches", {o.microbatches, s.microbatches}}};
  for (const auto &[option, values] : given)
    if (a.has(option) && values.first != values.second) {
      fail("compile", std::string(option) + " " + std::to_string(values.first) +
                          " disagrees with '" + path + "', which has " +
                          std::to_string(values.second) +
                          " (ranks, stages per rank and microbatches come "
                          "from the file; drop the option)");
      return false;
    }
  o.schedule = "custom";
  o.stages = s.stages;
  o.chunks = s.chunks;
  o.microbatches = int(s.microbatches);
  llvm::SmallString<256> absolute(path);
  llvm::sys::fs::make_absolute(absolute);
  o.scheduleCsv = absolute.str().str();
  return true;
}

/// The options of `pipec compile`.
static void declareCompileOptions(Args &a) {
  a.positional("MODEL.onnx", "the model to compile")
      .opt("-o", "output folder", "out")
      .opt("--stages", "pipeline stages (one process each)", "1")
      .opt("--microbatches",
           "microbatches per step (the global batch is "
           "split into them)",
           "1")
      .opt("--batch", "global batch (default: the model's batch dimension)")
      .opt("--schedule",
           "gpipe, 1f1b-flush (synchronous), 1f1b (PipeDream, "
           "weight stashing), 2bw (PipeDream-2BW), interleaved "
           "(Megatron, with --chunks), zb-h1 (zero bubble), zb-h2 (zero "
           "bubble with 2p-1 microbatches in flight), dualpipev "
           "(DeepSeek's DualPipeV, two chunks in a V), zb-v (zero "
           "bubble, two chunks per device in a V) or synth (an order "
           "synthesised for this model's stage times within "
           "--memory-limit)",
           "1f1b-flush")
      .opt("--schedule-csv", "run the order of a torch.distributed.pipelining "
                             "compute-only CSV (one row of actions such as "
                             "0F0,1B3,0I1,0W1 per rank; stage q on rank q mod "
                             "p); the file gives the stages, chunks and "
                             "microbatches, and is refused naming the rank "
                             "and step if it cannot run")
      .opt("--recompute",
           "activation recomputation: none, full (stash each "
           "stage's inputs only, re-run its forward at the "
           "start of its backward) or selective (stash the "
           "gemm/matmul/conv outputs, recompute the rest), or "
           "auto (with --memory-limit: per stage the least "
           "recomputation that fits); one mode, or one per "
           "pipeline stage, comma-separated",
           "none")
      .opt("--memory-limit", "bytes one rank's arena may take (K, M, G "
                             "suffixes: KiB, MiB, GiB); a plan over it is "
                             "refused with what it needs, and --recompute "
                             "auto picks per stage the least recomputation "
                             "that fits")
      .opt("--profile", "pipec.profile/1 with measured op times for planning")
      .opt("--cuts", "a fixed cut instead of the planner's: the last layer of "
                     "every stage but the last, comma-separated layer "
                     "indices (as the progress lines and plan.json number "
                     "them), stages x chunks - 1 of them")
      .opt("--device",
           "analytic cost model when no profile: cpu, v100, a100, "
           "h100 (and their -fp16/-bf16 rows), or a device model that "
           "`pipec calibrate` fitted to a measured profile (FILE.json)",
           "cpu")
      .opt("--replicas", "replicas per stage, comma-separated (with a "
                         "gradient all-reduce; every schedule: interleaved "
                         "with --replica-mode split, 1f1b/2bw round robin), "
                         "e.g. 2,1; one number applies to every stage")
      .opt("--replica-mode",
           "rr: replica j of r runs microbatches j, j+r, "
           "... (PipeDream 1F1B-RR); split: every replica "
           "runs its slice of the samples of every "
           "microbatch (DAPPLE; uneven counts such as 3,1)",
           "rr")
      .opt("--chunks",
           "interleaved: model chunks per device (v); the model "
           "is split into stages x chunks pipeline stages",
           "1")
      .opt("--warmup",
           "1f1b-flush warm-up policy (DAPPLE): A = p-s-1 "
           "forwards, B = 2(p-s-1), which hides communication "
           "comparable to compute",
           "A")
      .opt("--loss",
           "cross-entropy (against integer labels) or model (output "
           "0 is the loss)",
           "cross-entropy")
      .opt("--optimizer",
           "sgd, momentum, nesterov, adam, adagrad (ONNX "
           "training-operator semantics)",
           "sgd")
      .opt("--momentum", "momentum coefficient", "0.9")
      .opt("--beta1", "Adam beta1", "0.9")
      .opt("--beta2", "Adam beta2", "0.999")
      .opt("--epsilon", "Adam/Adagrad epsilon", "1e-8")
      .opt("--weight-decay", "L2 weight decay", "0")
      .opt("--input-shape", "static shapes NAME=D0xD1..., comma-separated")
      .opt("--precision",
           "f32; f64: the exact reference mode (every "
           "kernel, buffer, message and checkpoint in double, "
           "the float32 weights widened exactly), to compare "
           "with a float64 framework or finite differences; bf16: "
           "matrix products multiply operands rounded to bfloat16 and "
           "accumulate in float32, everything else float32 (tensor cores "
           "on --target cuda; emulated exactly on the CPU)",
           "f32")
      .opt("--activations",
           "f32, or bf16 (with --precision bf16): every activation, "
           "activation gradient, message and stash slot is stored in "
           "bfloat16 (each op computes in float32 and rounds its result "
           "once); weights, weight-gradient sums, optimizer state, "
           "normalisation statistics and the loss stay float32; "
           "bf16-casts: the same numbers with every op between casts and "
           "float32 kernels (the reference the bf16 kernels are checked "
           "against)",
           "f32")
      .opt("--target",
           "cpu, or cuda: stage executables that train on NVIDIA GPUs (rank "
           "r on GPU local_rank mod visible GPUs; needs a compiler built "
           "with the CUDA toolkit)",
           "cpu")
      .opt("--freeze", "float initializers to keep constant instead of "
                       "training them (buffers such as masks), "
                       "comma-separated")
      .flag("--untie-weights", "give every node that reads a shared float "
                               "initializer its own copy (for exports that "
                               "merged equal initializers: "
                               "torch.onnx.export in eval mode)")
      .flag("--no-fuse", "import every ONNX node as its own op (no GELU "
                         "fusion, no power-of-two scale folded into a "
                         "MatMul; the fused build computes the same bits)")
      .flag("--emit-mlir", "also write OUT/pipeline.mlir")
      .flag("--quiet", "no progress lines")
      .flag("--timings", "print the seconds of every compile phase");
}

/// --schedule, --replicas, --replica-mode, --warmup, --chunks,
/// --schedule-csv, --recompute and --memory-limit into `o`; false after
/// printing the usage error.
static bool parseScheduleOptions(const Args &a, CompileOptions &o) {
  o.schedule = a.get("--schedule");
  if (o.schedule == "synth") {
    // Checked and budgeted as zb-h1 (split backwards, synchronous), run as
    // the synthesiser's custom order.
    o.synthesize = true;
    o.schedule = "zb-h1";
    if (a.has("--replicas") || a.has("--chunks"))
      return !fail("compile",
                   "--schedule synth plans a straight pipeline: "
                   "one rank per stage, one chunk (drop --replicas "
                   "and --chunks)",
                   2);
  }
  auto kind = parseScheduleKind(o.schedule);
  if (!kind)
    return !fail("compile",
                 "unknown --schedule '" + o.schedule +
                     "' (available: gpipe, 1f1b-flush, 1f1b, 2bw, "
                     "interleaved, zb-h1, zb-h2, zb-v, dualpipev, synth, or "
                     "--schedule-csv "
                     "FILE)",
                 2);
  if (a.has("--replicas")) {
    std::string list = a.get("--replicas");
    for (llvm::StringRef part : llvm::split(list, ',')) {
      int r = 0;
      if (part.trim().getAsInteger(10, r) || r < 1)
        return !fail("compile",
                     "--replicas takes positive integers separated "
                     "by commas, got '" +
                         a.get("--replicas") + "'",
                     2);
      o.replicas.push_back(r);
    }
    // (Before the file sets the stage count a single number would expand to.)
    if (a.has("--schedule-csv") &&
        std::any_of(o.replicas.begin(), o.replicas.end(),
                    [](int r) { return r != 1; }))
      return !fail("compile",
                   "--replicas " + list +
                       ": a schedule read from a file (--schedule-csv) runs "
                       "one rank per stage; its order names no replicas",
                   2);
    if (o.replicas.size() == 1)
      o.replicas.assign(o.stages, o.replicas[0]);
  }
  o.replicaMode = a.get("--replica-mode");
  if (o.replicaMode != "rr" && o.replicaMode != "split")
    return !fail("compile",
                 "--replica-mode is rr or split, got '" + o.replicaMode + "'",
                 2);
  o.warmup = a.get("--warmup");
  int64_t chunks = 1;
  if (!a.getInt("--chunks", chunks, 1))
    return false;
  o.chunks = int(chunks);
  // zb-v: two chunks per device in a V, unless --chunks says otherwise
  // (which the schedule rules then refuse).
  if ((*kind == ScheduleKind::ZeroBubbleV ||
       *kind == ScheduleKind::DualPipeV) &&
      !a.has("--chunks"))
    o.chunks = 2;
  if (a.has("--schedule-csv") && !applyScheduleCsv(a, o))
    return false;
  const std::string recompute = a.get("--recompute");
  for (llvm::StringRef m : llvm::split(recompute, ',')) {
    m = m.trim();
    if (m != "none" && m != "full" && m != "selective" && m != "auto")
      return !fail("compile",
                   "--recompute takes none, full, selective (one "
                   "for every stage, or one per stage) or auto, "
                   "got '" +
                       a.get("--recompute") + "'",
                   2);
    o.recompute.push_back(m.str());
  }
  if (a.has("--memory-limit") && !a.getBytes("--memory-limit", o.memoryLimit))
    return false;
  if (llvm::is_contained(o.recompute, "auto") &&
      (o.recompute.size() != 1 || o.memoryLimit <= 0))
    return !fail("compile",
                 "--recompute auto chooses every stage's mode from "
                 "the memory budget: give it alone, with "
                 "--memory-limit BYTES",
                 2);
  if (o.recompute.size() != 1 &&
      int64_t(o.recompute.size()) != int64_t(o.stages) * o.chunks)
    return !fail("compile",
                 "--recompute lists " + std::to_string(o.recompute.size()) +
                     " modes for " + std::to_string(o.stages * o.chunks) +
                     " pipeline stages (give one, or one per stage)",
                 2);
  if (*kind == ScheduleKind::Custom && o.scheduleCsv.empty())
    return !fail("compile",
                 "the custom schedule runs the order of a file: "
                 "give --schedule-csv FILE",
                 2);
  return true;
}

/// --profile, --cuts, the optimizer, precision and the remaining flags
/// into `o`; false after printing the usage error.
static bool parseModelOptions(const Args &a, CompileOptions &o) {
  o.profile = a.get("--profile");
  if (a.has("--cuts")) {
    std::string list = a.get("--cuts");
    for (llvm::StringRef part : llvm::split(list, ',')) {
      int l = 0;
      if (part.trim().getAsInteger(10, l) || l < 0 ||
          (!o.cuts.empty() && l <= o.cuts.back()))
        return !fail("compile",
                     "--cuts takes increasing layer indices "
                     "separated by commas, got '" +
                         list + "'",
                     2);
      o.cuts.push_back(l);
    }
    if (int(o.cuts.size()) != o.stages * o.chunks - 1)
      return !fail("compile",
                   "--cuts lists " + std::to_string(o.cuts.size()) +
                       " cut(s) for " + std::to_string(o.stages * o.chunks) +
                       " pipeline stages (needs " +
                       std::to_string(o.stages * o.chunks - 1) + ")",
                   2);
    if (!o.profile.empty())
      return !fail("compile",
                   "--cuts and --profile both choose the cut; give "
                   "one",
                   2);
  }
  o.device = a.get("--device");
  o.loss = a.get("--loss");
  o.optimizer = a.get("--optimizer");
  if (!a.getDouble("--momentum", o.momentum) || !a.getDouble("--beta1", o.beta1) ||
      !a.getDouble("--beta2", o.beta2) || !a.getDouble("--epsilon", o.epsilon) ||
      !a.getDouble("--weight-decay", o.weightDecay))
    return false;
  // The ranges in which the update rules mean what they say (ONNX's
  // Momentum, Adam and Adagrad): a decay factor in [0, 1), a non-negative
  // epsilon and weight decay.
  for (auto [flag, value] :
       {std::pair<const char *, double>{"--momentum", o.momentum},
        {"--beta1", o.beta1},
        {"--beta2", o.beta2}})
    if (!(value >= 0 && value < 1))
      return !fail("compile",
                   std::string(flag) + " must be in [0, 1), got " + a.get(flag),
                   2);
  if (!(o.epsilon >= 0) || !(o.weightDecay >= 0))
    return !fail("compile",
                 std::string(o.epsilon >= 0 ? "--weight-decay" : "--epsilon") +
                     " must be >= 0, got " +
                     a.get(o.epsilon >= 0 ? "--weight-decay" : "--epsilon"),
                 2);
  o.precision = a.get("--precision");
  if (o.precision != "f32" && o.precision != "f64" && o.precision != "bf16")
    return !fail("compile",
                 "--precision is f32, f64 or bf16, got '" + o.precision + "'",
                 2);
  o.activations = a.get("--activations");
  if (!checkActivations(o, "compile"))
    return false;
  o.target = a.get("--target");
  if (o.target != "cpu" && o.target != "cuda")
    return !fail("compile", "--target is cpu or cuda, got '" + o.target + "'",
                 2);
  if (o.target == "cuda" && !haveCudaRuntime())
    return !fail("compile",
                 "--target cuda: this pipec was built without the CUDA "
                 "toolkit (no nvcc found at build time); rebuild on a machine "
                 "with /usr/local/cuda, or compile with --target cpu",
                 2);
  if (o.target == "cuda" && o.precision == "f64")
    return !fail("compile",
                 "--target cuda trains in float32; --precision f64 (the "
                 "exact reference mode) runs on --target cpu",
                 2);
  o.emitMlir = a.has("--emit-mlir");
  o.untieWeights = a.has("--untie-weights");
  o.noFuse = a.has("--no-fuse");
  o.quiet = a.has("--quiet");
  o.timings = a.has("--timings");
  if (a.has("--freeze")) {
    std::string list = a.get("--freeze");
    for (llvm::StringRef name : llvm::split(list, ','))
      if (!name.trim().empty())
        o.frozen.insert(name.trim().str());
  }
  if (!parseInputShapes(a, o.inputShapes, "compile"))
    return false;
  return true;
}

bool pipec::driver::checkActivations(const CompileOptions &o,
                                     const std::string &command) {
  if (o.activations != "f32" && o.activations != "bf16" &&
      o.activations != "bf16-casts")
    return !fail(command,
                 "--activations is f32, bf16 or bf16-casts, got '" +
                     o.activations + "'",
                 2);
  if (o.activations != "f32" && o.precision != "bf16")
    return !fail(command,
                 "--activations " + o.activations +
                     " needs --precision bf16 (bfloat16 storage with float32 "
                     "or float64 arithmetic is not a mode pipec has)",
                 2);
  return true;
}

int pipec::driver::runCompile(const std::vector<std::string> &argv) {
  Args a("compile", argv);
  declareCompileOptions(a);
  if (!a.parse())
    return a.helpShown ? 0 : 2;
  if (a.positionals().size() != 1)
    return fail("compile", "expected one MODEL.onnx", 2);
  CompileOptions o;
  o.model = a.positionals()[0];
  o.outDir = a.get("-o");
  int64_t stages, micro, batch = 0;
  if (!a.getInt("--stages", stages, 1) ||
      !a.getInt("--microbatches", micro, 1) ||
      (a.has("--batch") &&
       !a.getInt("--batch", batch, 1, std::numeric_limits<int64_t>::max())))
    return 2;
  o.stages = stages;
  o.microbatches = micro;
  o.batch = batch;
  if (!parseScheduleOptions(a, o) || !parseModelOptions(a, o))
    return 2;
  return compileModel(o);
}

int pipec::driver::runImport(const std::vector<std::string> &argv) {
  Args a("import", argv);
  a.positional("MODEL.onnx", "the model to import")
      .opt("-o", "output file", "-")
      .opt("--batch", "leading dimension of every input (default: the file's)")
      .opt("--input-shape", "static shapes NAME=D0xD1..., comma-separated");
  if (!a.parse())
    return a.helpShown ? 0 : 2;
  if (a.positionals().size() != 1)
    return fail("import", "expected one MODEL.onnx", 2);
  ImportOptions options;
  if (a.has("--batch") && !a.getInt("--batch", options.batch, 1,
                                    std::numeric_limits<int64_t>::max()))
    return 2;
  if (!parseInputShapes(a, options.inputShapes, "import"))
    return 2;
  DialectRegistry registry;
  registerAll(registry);
  MLIRContext ctx(registry);
  std::string error;
  auto module = importOnnxFile(ctx, a.positionals()[0], options, error);
  if (!module)
    return fail("import", error);
  std::string msg;
  auto out = openOutputFile(a.get("-o"), &msg);
  if (!out)
    return fail("import", msg);
  module->print(out->os(), OpPrintingFlags().enableDebugInfo(true, /*prettyForm=*/false));
  out->os() << "\n";
  out->keep();
  return 0;
}
