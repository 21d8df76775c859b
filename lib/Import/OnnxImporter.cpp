//===- OnnxImporter.cpp - ONNX protobuf -> nn dialect ---------------------===//
//
// Pipeline of the importer:
//   1. parse the protobuf (a truncated or foreign file fails here);
//   2. upgrade opsets older than kMinOpset with ONNX's version converter;
//   3. refuse unsupported operators (absent from the registry), listing each
//      once with its nodes;
//   4. run ONNX's checker;
//   5. specialise input shapes (batch / --input-shape) and run ONNX shape
//      inference, so every value gets a static type;
//   6. emit nn ops in graph order (ONNX requires topological order), each
//      node by the conversion its op registered (Convert.h, ops/<Family>.cpp),
//      float initializers as mutable ml_program globals with dense_resource
//      data.
// This file is the driver; it converts no op itself.
// Every failure is a message for the user; nothing here aborts.
//
//===----------------------------------------------------------------------===//
#include "pipec/Import.h"

#include "ConstFold.h"
#include "Convert.h"
#include "dialects/nn/NNDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MLProgram/IR/MLProgram.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/DenseSet.h"

#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>
#include <onnx/version_converter/convert.h>

#include <cfloat>
#include <functional>
#include <chrono>
#include <csignal>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

using namespace mlir;
using namespace pipec;
using import::dimsString;
using import::findAttr;
using import::isDefaultDomain;
using import::nodeLabel;
using import::ValueType;

namespace {

/// Runs `work` on `model` in a forked child process and returns the
/// transformed model. libonnx's checker, version converter and shape
/// inference crash on some malformed models (found by fuzzing); isolated,
/// such a crash becomes an error message instead of killing pipec. An
/// exception thrown by `work` comes back as `error`.
bool runIsolated(onnx::ModelProto &model,
                 const std::function<void(onnx::ModelProto &)> &work,
                 std::string &error, bool &crashed) {
  crashed = false;
  int fds[2];
  if (pipe(fds) != 0) {
    error = std::string("pipe: ") + std::strerror(errno);
    return false;
  }
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    error = std::string("fork: ") + std::strerror(errno);
    return false;
  }
  if (pid == 0) {
    close(fds[0]);
    // A crash in libonnx ends this child quietly: the parent reports it.
    // (Inherited handlers would print the tool's crash report, or make a
    // fuzzer record the contained crash as its own.)
    for (int sig : {SIGSEGV, SIGFPE, SIGBUS, SIGILL, SIGABRT, SIGTRAP})
      std::signal(sig, SIG_DFL);
    std::string out;
    try {
      work(model);
      out = "O" + model.SerializeAsString();
    } catch (const std::exception &e) {
      out = std::string("E") + e.what();
    }
    const char *p = out.data();
    size_t left = out.size();
    while (left > 0) {
      ssize_t n = write(fds[1], p, left);
      if (n <= 0)
        _exit(3);
      p += n;
      left -= size_t(n);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string in;
  char buf[1 << 16];
  // libonnx may also loop forever on hostile input: give it a deadline.
  const int kTimeoutMs = 300 * 1000;
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(kTimeoutMs);
  bool timedOut = false;
  for (;;) {
    int left = int(std::chrono::duration_cast<std::chrono::milliseconds>(
                       deadline - std::chrono::steady_clock::now())
                       .count());
    struct pollfd pfd = {fds[0], POLLIN, 0};
    int ready = left > 0 ? poll(&pfd, 1, left) : 0;
    if (ready < 0 && errno == EINTR)
      continue;
    if (ready == 0) {
      timedOut = true;
      kill(pid, SIGKILL);
      break;
    }
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    in.append(buf, size_t(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timedOut) {
    crashed = true;
    error = "the ONNX library did not finish within " +
            std::to_string(kTimeoutMs / 1000) + " s on this model";
    return false;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || in.empty()) {
    crashed = true;
    error = WIFSIGNALED(status)
                ? "the ONNX library crashed (signal " +
                      std::to_string(WTERMSIG(status)) + ") on this model"
                : "the ONNX library failed on this model";
    return false;
  }
  if (in[0] == 'E') {
    error = in.substr(1);
    return false;
  }
  onnx::ModelProto result;
  if (!result.ParseFromString(in.substr(1))) {
    error = "internal error: cannot read back the processed model";
    return false;
  }
  model = std::move(result);
  return true;
}

/// ONNX's training operators (optimizers).
bool isTrainingOp(const onnx::NodeProto &node) {
  return node.domain() == import::kTrainingDomain &&
         (node.op_type() == "Momentum" || node.op_type() == "Adam" ||
          node.op_type() == "Adagrad");
}

ValueType fromTypeProto(const onnx::TypeProto &type) {
  ValueType vt;
  if (!type.has_tensor_type())
    return vt;
  const auto &tt = type.tensor_type();
  vt.elemType = tt.elem_type();
  if (!tt.has_shape())
    return vt;
  vt.known = true;
  for (const auto &d : tt.shape().dim())
    vt.dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
  return vt;
}

class Importer : public import::ImportServices {
public:
  Importer(MLIRContext &ctx, const std::string &path,
           const ImportOptions &options, std::string &error,
           const std::string *bytes = nullptr)
      : ctx(ctx), path(path), opts(options), error(error), b(&ctx),
        givenBytes(bytes) {}

  OwningOpRef<ModuleOp> run();

private:
  bool fail(const std::string &message) {
    if (error.empty())
      error = message;
    return false;
  }
  bool load();
  bool readExternal(onnx::TensorProto &t);
  bool separateInitializers();
  bool check();
  bool checkStructure();
  bool upgradeOpset();
  bool checkSupported();
  bool specialiseAndInfer();
  /// Optional outputs (index >= 1) that no node or graph output reads are
  /// removed: a training-mode export's Dropout masks and batch-norm
  /// statistics, whose shapes ONNX may not infer.
  void dropUnusedOutputs();
  /// Float initializers that cannot get a gradient (no float path from
  /// them to a graph output, e.g. an attention mask buffer compared with
  /// Equal) join `frozen`: exporters write buffers and parameters alike.
  void freezeGradientFree();
  /// For errors after the batch was changed: the file's fixed batch may be
  /// baked into its shape constants (batchHint, below).
  bool emit();
  bool emitNode(const onnx::NodeProto &node, int index);
  /// The opset of `domain` the nodes are read at (after the upgrade).
  int64_t opsetOf(const std::string &domain) const;
  /// The node's element types against its OpSpec's operand rule.
  bool checkOperandTypes(const onnx::NodeProto &node, const std::string &where,
                         import::Operands rule);

  // ImportServices, for the conversions under ops/.
  Value operand(const onnx::NodeProto &node, int i, int index) override;
  std::optional<import::ConstTensor> constOf(const std::string &name) override;
  bool constantInts(const std::string &name,
                    std::vector<int64_t> &out) override;
  bool isWeightName(const std::string &name) const override {
    auto it = initializers.find(name);
    return it != initializers.end() &&
           it->second->data_type() == onnx::TensorProto::FLOAT &&
           !frozen.count(name);
  }
  const import::ValueType *typeOfName(const std::string &name) const override {
    auto it = types.find(name);
    return it == types.end() ? nullptr : &it->second;
  }
  Value randomState(const std::string &where) override;
  void defineConstant(const std::string &name,
                      const onnx::TensorProto &value) override;
  std::string batchHint() const override;
  const ImportOptions &options() const override { return opts; }

  Type elementType(int32_t onnxType);
  FailureOr<RankedTensorType> typeOf(const std::string &name,
                                     const std::string &where);

  MLIRContext &ctx;
  std::string path;
  const ImportOptions &opts;
  std::string &error;
  OpBuilder b;
  /// The model's bytes when importing from memory (no folder: external
  /// data is refused).
  const std::string *givenBytes = nullptr;
  onnx::ModelProto model;
  int64_t opset = 0;
  ModuleOp module;
  func::FuncOp mainFn;
  /// The batch the file fixes (first input, leading dimension) when
  /// specialisation changed it; 0 otherwise.
  int64_t fileBatch = 0;
  std::string fileBatchInput;
  /// The random state argument of @main, created by the first dropout.
  Value rngArg;

  std::map<std::string, const onnx::TensorProto *> initializers;
  /// Large initializers with their data, kept out of the model that
  /// libonnx processes (separateInitializers).
  std::map<std::string, onnx::TensorProto> heavy;
  /// Float initializers imported as constants: --freeze and the
  /// gradient-free ones (autoFrozen, reported on the module).
  std::set<std::string> frozen;
  std::vector<std::string> autoFrozen;
  /// --untie-weights: the first node that read each weight.
  std::map<std::string, int> weightOwner;
  std::map<std::string, const onnx::TensorProto *> constantNodes;
  /// Values computed at import time (folded shape subgraphs).
  std::map<std::string, import::ConstTensor> consts;
  bool tryFold(const onnx::NodeProto &node, int index, bool &folded);
  std::map<std::string, ValueType> types;
  std::map<std::string, Value> values;
  std::map<std::string, ml_program::GlobalOp> globals;
  Location loc = UnknownLoc::get(&ctx);
};

} // namespace

//===----------------------------------------------------------------------===//
// Reading and validating
//===----------------------------------------------------------------------===//

bool Importer::load() {
  std::string bytes;
  if (givenBytes) {
    bytes = *givenBytes;
  } else {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
      return fail("'" + path + "' is a folder, not an ONNX model");
    std::ifstream in(path, std::ios::binary);
    if (!in)
      return fail("cannot open '" + path + "': " + std::strerror(errno));
    std::stringstream buffer;
    buffer << in.rdbuf();
    bytes = buffer.str();
  }
  if (bytes.empty())
    return fail("'" + path + "' is empty, not an ONNX model");
  if (!model.ParseFromString(bytes))
    return fail("'" + path +
                "' is not a valid ONNX model (protobuf parse failed: "
                "truncated or not an ONNX file)");
  if (model.ir_version() <= 0 || !model.has_graph() ||
      model.graph().node_size() == 0)
    return fail("'" + path + "' is not an ONNX model (no IR version or empty "
                "graph)");
  if (model.graph().output_size() == 0)
    return fail("'" + path +
                "' has no graph outputs: nothing to train (the "
                "first output is the model's prediction, or its loss with "
                "--loss model)");
  for (const auto &op : model.opset_import())
    if (isDefaultDomain(op.domain()))
      opset = op.version();
  if (opset == 0) {
    // Models of training operators alone (ONNX's optimizer tests) import
    // only ai.onnx.preview.training.
    for (const auto &node : model.graph().node())
      if (!isTrainingOp(node))
        return fail("'" + path + "' imports no version of the default ONNX "
                    "operator set");
    opset = kMinOpset;
  }
  // Newer than the ONNX library this build links: its checker, converter
  // and shape inference do not know the operators' new versions.
  const int64_t newestOpset = onnx::OpSchemaRegistry::DomainToVersionRange::
                                  Instance()
                                      .Map()
                                      .at(onnx::ONNX_DOMAIN)
                                      .second;
  const int64_t newestIr = onnx::Version::IR_VERSION;
  if (opset > newestOpset || model.ir_version() > newestIr)
    return fail("'" + path + "' uses ONNX opset " + std::to_string(opset) +
                " (IR version " + std::to_string(model.ir_version()) +
                "); the ONNX library of this build knows opsets up to " +
                std::to_string(newestOpset) + " (IR version " +
                std::to_string(newestIr) + "): export with opset_version=" +
                std::to_string(newestOpset) +
                " or lower (torch.onnx.export(..., opset_version=" +
                std::to_string(newestOpset) + "))");
  return true;
}

/// Reads the external data of `t` (models over 2 GiB keep their weights in
/// files beside the model) into its raw data. Locations must be relative
/// paths inside the model's folder (no absolute paths, no '..', no
/// symbolic links leading out).
bool Importer::readExternal(onnx::TensorProto &t) {
  namespace fs = std::filesystem;
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto &kv : t.external_data()) {
    if (kv.key() == "location")
      location = kv.value();
    else if (kv.key() == "offset")
      offset = std::atoll(kv.value().c_str());
    else if (kv.key() == "length")
      length = std::atoll(kv.value().c_str());
  }
  std::string what = "initializer '" + t.name() + "'";
  if (givenBytes)
    return fail(what + " uses external data, which needs the model's file");
  if (location.empty())
    return fail(what + " has external data without a location");
  fs::path rel(location);
  bool escapes = rel.is_absolute();
  for (const auto &part : rel)
    escapes |= part == "..";
  fs::path dir = fs::path(path).parent_path();
  std::error_code ec;
  fs::path file = fs::weakly_canonical(dir / rel, ec);
  fs::path root = fs::weakly_canonical(dir.empty() ? fs::path(".") : dir, ec);
  std::string f = file.string(), r = root.string();
  if (escapes || ec || f.compare(0, r.size(), r) != 0 ||
      (f.size() > r.size() && f[r.size()] != '/'))
    return fail(what + ": refused external data file '" + location +
                "': it lies outside the model's folder");
  std::ifstream in(file, std::ios::binary);
  if (!in)
    return fail(what + ": cannot open external data file '" + location +
                "': " + std::strerror(errno));
  in.seekg(0, std::ios::end);
  int64_t size = in.tellg();
  if (length < 0)
    length = size - offset;
  if (offset < 0 || length < 0 || offset + length > size)
    return fail(what + ": external data range [" + std::to_string(offset) +
                ", " + std::to_string(offset + length) + ") exceeds '" +
                location + "' (" + std::to_string(size) + " bytes)");
  std::string data(static_cast<size_t>(length), '\0');
  in.seekg(offset);
  in.read(data.data(), length);
  if (!in)
    return fail(what + ": cannot read external data file '" + location + "'");
  t.set_raw_data(std::move(data));
  t.clear_external_data();
  t.set_data_location(onnx::TensorProto::DEFAULT);
  return true;
}

/// Large initializers leave the model before libonnx sees it: the checker,
/// version converter and shape inference run in a child process that gets
/// the model through protobuf serialisation, which stops at 2 GiB, and
/// none of them needs weight values. Each one is kept whole in `heavy`
/// (its external data read in) and stands in the model as a graph input of
/// the same name, type and shape. Small ones (shape constants, masks) stay,
/// with their external data read in.
bool Importer::separateInitializers() {
  constexpr int64_t kHeavyBytes = int64_t(1) << 20;
  auto *graph = model.mutable_graph();
  std::set<std::string> inputs;
  for (const auto &v : graph->input())
    inputs.insert(v.name());
  google::protobuf::RepeatedPtrField<onnx::TensorProto> kept;
  for (auto &t : *graph->mutable_initializer()) {
    int64_t elements = 1;
    for (int64_t d : t.dims())
      elements = d > 0 && elements <= (int64_t(1) << 40) / d ? elements * d
                                                             : int64_t(1) << 40;
    const bool external = t.data_location() == onnx::TensorProto::EXTERNAL;
    if (elements * 4 < kHeavyBytes || heavy.count(t.name())) {
      if (external && !readExternal(t))
        return false;
      *kept.Add() = std::move(t);
      continue;
    }
    onnx::TensorProto &whole = heavy[t.name()];
    whole = std::move(t);
    if (external && !readExternal(whole))
      return false;
    if (inputs.insert(whole.name()).second) {
      auto *in = graph->add_input();
      in->set_name(whole.name());
      auto *tt = in->mutable_type()->mutable_tensor_type();
      tt->set_elem_type(whole.data_type());
      auto *shape = tt->mutable_shape();
      for (int64_t d : whole.dims())
        shape->add_dim()->set_dim_value(d);
    }
  }
  graph->mutable_initializer()->Swap(&kept);
  return true;
}

bool Importer::upgradeOpset() {
  if (opset >= kMinOpset)
    return true;
  std::string why;
  bool crashed;
  if (!runIsolated(
          model,
          [](onnx::ModelProto &m) {
            // Some adapters (Softmax 12->13) need the shapes of their inputs.
            onnx::shape_inference::InferShapes(m);
            m = onnx::version_conversion::ConvertVersion(m, kMinOpset);
          },
          why, crashed))
    return fail("'" + path + "' uses opset " + std::to_string(opset) +
                ", older than the " + std::to_string(kMinOpset) +
                " pipec imports, and ONNX's version converter could not "
                "upgrade it: " + why);
  opset = kMinOpset;
  return true;
}

bool Importer::checkSupported() {
  // op label -> node labels, in first-seen order.
  std::vector<std::pair<std::string, std::vector<std::string>>> bad;
  const auto &graph = model.graph();
  for (int i = 0; i < graph.node_size(); ++i) {
    const auto &node = graph.node(i);
    if (import::OpRegistry::get().find(node.domain(), node.op_type(),
                                       opsetOf(node.domain())))
      continue;
    std::string label = node.op_type();
    if (!isDefaultDomain(node.domain()))
      label += " (custom domain '" + node.domain() + "')";
    auto it = std::find_if(bad.begin(), bad.end(),
                           [&](auto &p) { return p.first == label; });
    if (it == bad.end()) {
      bad.push_back({label, {}});
      it = std::prev(bad.end());
    }
    it->second.push_back(nodeLabel(node, i));
  }
  if (bad.empty())
    return true;
  std::string msg = "'" + path + "' uses " + std::to_string(bad.size()) +
                    " unsupported operator" + (bad.size() > 1 ? "s" : "") +
                    ":";
  for (auto &[op, nodes] : bad) {
    msg += "\n  " + op + ": node" + (nodes.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < nodes.size() && i < 8; ++i)
      msg += (i ? ", " : "") + nodes[i];
    if (nodes.size() > 8)
      msg += ", ... (" + std::to_string(nodes.size()) + " in all)";
  }
  return fail(msg);
}

/// Every value a node or the graph output reads is defined before it.
bool Importer::checkStructure() {
  const auto &graph = model.graph();
  std::set<std::string> defined;
  for (const auto &v : graph.input())
    defined.insert(v.name());
  for (const auto &t : graph.initializer())
    defined.insert(t.name());
  for (int i = 0; i < graph.node_size(); ++i) {
    const auto &node = graph.node(i);
    for (const auto &in : node.input())
      if (!in.empty() && !defined.count(in))
        return fail("'" + path + "': node '" + nodeLabel(node, i) + "' (" +
                    node.op_type() + ") reads '" + in +
                    "', which no earlier node, input or initializer defines");
    for (const auto &out : node.output())
      defined.insert(out);
  }
  for (const auto &out : graph.output())
    if (!defined.count(out.name()))
      return fail("'" + path + "': graph output '" + out.name() +
                  "' is not produced by any node");
  return true;
}

bool Importer::check() {
  std::string why;
  bool crashed;
  if (!runIsolated(
          model, [](onnx::ModelProto &m) { onnx::checker::check_model(m); },
          why, crashed))
    return fail("'" + path + "' fails the ONNX checker: " +
                why.substr(0, why.find('\n')));
  return true;
}


std::string Importer::batchHint() const {
  if (fileBatch == 0)
    return "";
  return " (the file fixes the batch at " + std::to_string(fileBatch) +
         ", e.g. in its Reshape targets, and pipec re-specialises it to " +
         std::to_string(opts.batch) +
         " samples per microbatch: export with a dynamic batch axis, "
         "torch.onnx.export(..., dynamic_axes={'" + fileBatchInput +
         "': {0: 'batch'}}), or export at the microbatch size and give the "
         "global batch with --batch)";
}

bool Importer::specialiseAndInfer() {
  auto *graph = model.mutable_graph();
  std::set<std::string> initNames;
  for (const auto &init : graph->initializer())
    initNames.insert(init.name());
  // Every --input-shape names a model input, with its number of dimensions
  // (a misspelt name was ignored, and a wrong rank surfaced as an internal
  // error of some later op).
  std::string inputList;
  for (const auto &input : graph->input())
    if (!initNames.count(input.name()) && !heavy.count(input.name()))
      inputList += (inputList.empty() ? "'" : ", '") + input.name() + "'";
  for (const auto &[name, dims] : opts.inputShapes) {
    const onnx::ValueInfoProto *found = nullptr;
    for (const auto &input : graph->input())
      if (input.name() == name && !initNames.count(name) && !heavy.count(name))
        found = &input;
    if (!found)
      return fail("--input-shape names '" + name +
                  "', which is not an input of the model (its inputs: " +
                  inputList + ")");
    const auto &given = found->type().tensor_type();
    if (given.has_shape() && given.shape().dim_size() > 0 &&
        given.shape().dim_size() != static_cast<int>(dims.size()))
      return fail("--input-shape gives '" + name + "' " +
                  std::to_string(dims.size()) +
                  " dimensions, but the model's "
                  "input has " +
                  std::to_string(given.shape().dim_size()));
  }
  for (auto &input : *graph->mutable_input()) {
    if (initNames.count(input.name()) || heavy.count(input.name()))
      continue;
    auto *tt = input.mutable_type()->mutable_tensor_type();
    auto *shape = tt->mutable_shape();
    auto it = opts.inputShapes.find(input.name());
    if (it != opts.inputShapes.end()) {
      shape->clear_dim();
      for (int64_t d : it->second)
        shape->add_dim()->set_dim_value(d);
    } else if (opts.batch > 0 && shape->dim_size() >= 1) {
      if (shape->dim(0).has_dim_value() && fileBatch == 0 &&
          shape->dim(0).dim_value() != opts.batch) {
        fileBatch = shape->dim(0).dim_value();
        fileBatchInput = input.name();
      }
      shape->mutable_dim(0)->set_dim_value(opts.batch);
    }
  }
  // Forget every recorded intermediate/output shape: they may carry the
  // file's batch size, which inference recomputes for the new one.
  for (auto &output : *graph->mutable_output())
    output.mutable_type()->mutable_tensor_type()->clear_shape();
  // Shape inference, then fold what became constant (shape subgraphs:
  // Shape -> Gather -> Concat -> Reshape, Range limits, Slice bounds) into
  // Constant nodes, and infer again, until nothing more folds: libonnx's
  // own data propagation stops at many of the nodes exporters write.
  frozen = opts.frozen;
  std::set<std::string> weightNames;
  constexpr int kMaxFoldRounds = 64;
  for (int round = 0;; ++round) {
    model.mutable_graph()->clear_value_info();
    std::string why;
    bool crashed;
    if (!runIsolated(
            model,
            [](onnx::ModelProto &m) {
              onnx::ShapeInferenceOptions opts(/*check_type=*/true,
                                               /*strict=*/1,
                                               /*data_prop=*/true);
              onnx::shape_inference::InferShapes(
                  m, onnx::OpSchemaRegistry::Instance(), opts);
            },
            why, crashed))
      return fail("ONNX shape inference failed on '" + path +
                  "': " + why.substr(0, why.find('\n')) +
                  batchHint());
    graph = model.mutable_graph(); // the model was replaced
    types.clear();
    for (const auto &v : graph->input())
      types[v.name()] = fromTypeProto(v.type());
    for (const auto &v : graph->value_info())
      types[v.name()] = fromTypeProto(v.type());
    for (const auto &v : graph->output())
      types[v.name()] = fromTypeProto(v.type());
    for (const auto &init : graph->initializer()) {
      ValueType vt;
      vt.known = true;
      vt.elemType = init.data_type();
      vt.dims.assign(init.dims().begin(), init.dims().end());
      types[init.name()] = vt;
    }
    if (round == kMaxFoldRounds)
      break;
    if (round == 0) {
      freezeGradientFree();
      for (const auto &init : graph->initializer())
        if (init.data_type() == onnx::TensorProto::FLOAT &&
            !frozen.count(init.name()))
          weightNames.insert(init.name());
      for (const auto &[name, init] : heavy)
        if (init.data_type() == onnx::TensorProto::FLOAT && !frozen.count(name))
          weightNames.insert(name);
    }
    int64_t folded = import::foldGraphConstants(
        *graph,
        [&](const std::string &name) { return weightNames.count(name) > 0; },
        [&](const std::string &name) -> std::optional<import::KnownType> {
          auto it = types.find(name);
          if (it == types.end() || it->second.elemType == 0)
            return std::nullopt;
          import::KnownType t;
          t.elemType = it->second.elemType;
          if (it->second.isStatic())
            t.dims = it->second.dims;
          return t;
        },
        [&](const std::string &name) -> const onnx::TensorProto * {
          auto it = heavy.find(name);
          return it != heavy.end() ? &it->second : nullptr;
        });
    if (folded == 0)
      break;
  }
  for (const auto &init : graph->initializer())
    initializers[init.name()] = &init;
  for (const auto &[name, init] : heavy)
    initializers[name] = &init;
  for (const std::string &name : opts.frozen) {
    auto it = initializers.find(name);
    if (it == initializers.end() ||
        it->second->data_type() != onnx::TensorProto::FLOAT)
      return fail("--freeze " + name + ": '" + path +
                  "' has no float initializer of that name");
  }
  return true;
}

//===----------------------------------------------------------------------===//
// Emission helpers
//===----------------------------------------------------------------------===//

Type Importer::elementType(int32_t onnxType) {
  switch (onnxType) {
  case onnx::TensorProto::FLOAT:
    return b.getF32Type();
  case onnx::TensorProto::INT64:
  case onnx::TensorProto::BOOL: // booleans are int64 0/1 in pipec
    return b.getI64Type();
  default:
    return Type();
  }
}

FailureOr<RankedTensorType> Importer::typeOf(const std::string &name,
                                             const std::string &where) {
  auto it = types.find(name);
  if (it == types.end() || !it->second.known) {
    fail(where + ": the shape of '" + name +
         "' is unknown after ONNX shape inference");
    return failure();
  }
  const ValueType &vt = it->second;
  if (!vt.isStatic()) {
    fail(where + ": '" + name + "' has the dynamic shape " +
         dimsString(vt.dims) +
         "; give static sizes with --batch or --input-shape NAME=D0xD1...");
    return failure();
  }
  Type elem = elementType(vt.elemType);
  if (!elem) {
    const std::string typeName =
        onnx::TensorProto_DataType_IsValid(vt.elemType)
            ? onnx::TensorProto_DataType_Name(
                  static_cast<onnx::TensorProto_DataType>(vt.elemType))
            : std::to_string(vt.elemType);
    const bool isFloat = vt.elemType == onnx::TensorProto_DataType_FLOAT16 ||
                         vt.elemType == onnx::TensorProto_DataType_BFLOAT16 ||
                         vt.elemType == onnx::TensorProto_DataType_DOUBLE;
    fail(where + ": '" + name + "' has ONNX element type " + typeName + " (" +
         std::to_string(vt.elemType) +
         "); pipec supports float32, int64 and bool tensors" +
         (isFloat ? " (export the model in float32; `--precision f64` or "
                    "`bf16` chooses the arithmetic)"
                  : " (export integer tensors such as token ids as int64)"));
    return failure();
  }
  // Element counts beyond 2^40 (and products that would overflow) are
  // refused before any size computation can wrap around.
  int64_t elements = 1;
  for (int64_t d : vt.dims) {
    if (d > (int64_t(1) << 40) ||
        (d > 0 && elements > (int64_t(1) << 40) / d)) {
      fail(where + ": '" + name + "' has " +
           (d > (int64_t(1) << 40) ? "an implausible dimension " +
                                         std::to_string(d)
                                   : std::string("more than 2^40 elements")) +
           " " + dimsString(vt.dims));
      return failure();
    }
    elements *= d;
  }
  return RankedTensorType::get(vt.dims, elem);
}

/// Reads the elements of an ONNX tensor as T (raw_data or typed fields).
template <typename T>
static bool tensorData(const onnx::TensorProto &t, std::vector<T> &out,
                       std::string &why) {
  int64_t n = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || (d > 0 && n > (int64_t(1) << 40) / d)) {
      why = "has an invalid or too large shape";
      return false;
    }
    n *= d;
  }
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    why = "uses external data that was not loaded";
    return false;
  }
  out.clear();
  if constexpr (std::is_same_v<T, int64_t>) {
    // Booleans (int64 0/1 in pipec): one byte each in raw data, else in
    // int32_data.
    if (t.data_type() == onnx::TensorProto::BOOL) {
      if (t.has_raw_data())
        for (char c : t.raw_data())
          out.push_back(c != 0 ? 1 : 0);
      else
        for (int32_t x : t.int32_data())
          out.push_back(x != 0 ? 1 : 0);
      if (static_cast<int64_t>(out.size()) != n) {
        why = "holds " + std::to_string(out.size()) + " booleans, " +
              std::to_string(n) + " expected";
        return false;
      }
      return true;
    }
  }
  if (t.has_raw_data()) {
    const std::string &raw = t.raw_data();
    if (static_cast<int64_t>(raw.size()) != n * int64_t(sizeof(T))) {
      why = "raw data holds " + std::to_string(raw.size()) + " bytes, " +
            std::to_string(n * sizeof(T)) + " expected";
      return false;
    }
    out.resize(n);
    std::memcpy(out.data(), raw.data(), raw.size());
    return true;
  }
  if constexpr (std::is_same_v<T, float>)
    out.assign(t.float_data().begin(), t.float_data().end());
  else
    out.assign(t.int64_data().begin(), t.int64_data().end());
  if (static_cast<int64_t>(out.size()) != n) {
    why = "holds " + std::to_string(out.size()) + " values, " +
          std::to_string(n) + " expected";
    return false;
  }
  return true;
}

bool Importer::constantInts(const std::string &name,
                            std::vector<int64_t> &out) {
  auto c = constOf(name);
  if (!c)
    return false;
  out.clear();
  for (int64_t i = 0; i < c->numel(); ++i)
    out.push_back(c->integer(i));
  return true;
}

std::optional<import::ConstTensor> Importer::constOf(const std::string &name) {
  if (auto it = consts.find(name); it != consts.end())
    return it->second;
  const onnx::TensorProto *t = nullptr;
  if (auto it = initializers.find(name); it != initializers.end())
    t = it->second;
  else if (auto it = constantNodes.find(name); it != constantNodes.end())
    t = it->second;
  if (!t)
    return std::nullopt;
  std::string why;
  return import::fromTensorProto(*t, why);
}

/// Folds `node` when every input is a constant that is not a trainable
/// weight (or, for Shape/Size, when the input's shape is static).
bool Importer::tryFold(const onnx::NodeProto &node, int index, bool &folded) {
  folded = false;
  if (!import::isFoldable(node.op_type()) || !isDefaultDomain(node.domain()))
    return true;
  for (const auto &in : node.input())
    if (!in.empty() && isWeightName(in))
      return true;
  std::string why;
  auto outs = import::foldNode(
      node,
      [&](int i) -> std::optional<import::ConstTensor> {
        return constOf(node.input(i));
      },
      [&](const std::string &name) -> std::optional<std::vector<int64_t>> {
        auto it = types.find(name);
        if (it == types.end() || !it->second.isStatic())
          return std::nullopt;
        return it->second.dims;
      },
      why);
  if (!outs) {
    // Where with a constant condition and run-time branches becomes mask
    // arithmetic (emitNode).
    if (node.op_type() == "Where" && node.input_size() == 3 &&
        constOf(node.input(0)) && !isWeightName(node.input(0)))
      return true;
    // Ops with a run-time kernel are converted normally; pure shape ops
    // must fold.
    const import::OpSpec *spec = import::OpRegistry::get().find(
        node.domain(), node.op_type(), opsetOf(node.domain()));
    if (spec && !spec->convert)
      return fail("node '" + nodeLabel(node, index) + "' (" +
                  node.op_type() + ") cannot be folded to a constant: " + why +
                  " (pipec evaluates shape computations at import)");
    return true;
  }
  for (size_t k = 0; k < outs->size() && k < size_t(node.output_size()); ++k) {
    const import::ConstTensor &c = (*outs)[k];
    ValueType vt;
    vt.known = true;
    vt.elemType = c.isFloat ? onnx::TensorProto::FLOAT : onnx::TensorProto::INT64;
    vt.dims = c.dims;
    types[node.output(k)] = vt;
    consts[node.output(k)] = c;
  }
  folded = true;
  return true;
}

/// Returns the Value of input `i` of `node`, creating weight globals and
/// constants on first use; null (and `error` set) on failure.
Value Importer::operand(const onnx::NodeProto &node, int i, int index) {
  if (i >= node.input_size() || node.input(i).empty())
    return Value();
  std::string name = node.input(i);
  const std::string source = name; // the initializer or value read
  // --untie-weights: a float initializer read by a second node becomes a
  // parameter of its own for that node, named after the Identity output it
  // feeds (an exporter's copy of a deduplicated parameter) or
  // "<initializer>@<node>".
  if (opts.untieWeights && isWeightName(name)) {
    auto [it, first] = weightOwner.try_emplace(name, index);
    if (!first && it->second != index) {
      bool identity = node.op_type() == "Identity" && node.output_size() == 1 &&
                      !initializers.count(node.output(0));
      name = identity ? node.output(0) : name + "@" + nodeLabel(node, index);
    }
  }
  if (auto it = values.find(name); it != values.end())
    return it->second;
  std::string where = "node '" + nodeLabel(node, index) + "' (" +
                      node.op_type() + ")";
  if (auto it = consts.find(name); it != consts.end()) {
    const import::ConstTensor &c = it->second;
    auto type = typeOf(name, where);
    if (failed(type))
      return Value();
    Attribute data;
    if (c.isFloat) {
      std::vector<float> v(c.reals.begin(), c.reals.end());
      data = DenseElementsAttr::get(*type, ArrayRef<float>(v));
    } else {
      data = DenseElementsAttr::get(*type, ArrayRef<int64_t>(c.ints));
    }
    Value result = nn::ConstantOp::create(
        b, NameLoc::get(b.getStringAttr(name)), cast<ElementsAttr>(data));
    values[name] = result;
    return result;
  }
  const onnx::TensorProto *t = nullptr;
  bool isWeight = false;
  if (auto it = initializers.find(source); it != initializers.end()) {
    t = it->second;
    isWeight = !frozen.count(source); // a frozen one is a constant
  } else if (auto it = constantNodes.find(name); it != constantNodes.end()) {
    t = it->second;
  }
  if (!t) {
    fail(where + ": input '" + name + "' is not produced by any node");
    return Value();
  }
  auto type = typeOf(source, where);
  if (failed(type))
    return Value();
  std::string why;
  Attribute data;
  if (type->getElementType().isF32()) {
    std::vector<float> v;
    if (!tensorData(*t, v, why)) {
      fail(where + ": tensor '" + name + "' " + why);
      return Value();
    }
    if (isWeight)
      data = DenseResourceElementsAttr::get(
          *type, name,
          HeapAsmResourceBlob::allocateAndCopyInferAlign<float>(v));
    else
      data = DenseElementsAttr::get(*type, ArrayRef<float>(v));
  } else {
    std::vector<int64_t> v;
    if (!tensorData(*t, v, why)) {
      fail(where + ": tensor '" + name + "' " + why);
      return Value();
    }
    isWeight = false; // integer tensors are never trained
    data = DenseElementsAttr::get(*type, ArrayRef<int64_t>(v));
  }
  Value result;
  if (isWeight) {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToEnd(module.getBody());
    auto global = ml_program::GlobalOp::create(
        b, NameLoc::get(b.getStringAttr(name)), name, *type,
        /*is_mutable=*/true, data, b.getStringAttr("private"));
    globals[name] = global;
  }
  if (isWeight)
    result = ml_program::GlobalLoadOp::create(
        b, NameLoc::get(b.getStringAttr(name)), *type,
        FlatSymbolRefAttr::get(&ctx, name));
  else
    result = nn::ConstantOp::create(b, NameLoc::get(b.getStringAttr(name)),
                                    cast<ElementsAttr>(data));
  values[name] = result;
  return result;
}

//===----------------------------------------------------------------------===//
// Node conversion: the registry's conversion for the node's op (ops/*.cpp)
//===----------------------------------------------------------------------===//

int64_t Importer::opsetOf(const std::string &domain) const {
  if (import::isDefaultDomain(domain))
    return std::max<int64_t>(opset, kMinOpset); // older ones are upgraded
  for (const auto &id : model.opset_import())
    if (id.domain() == domain)
      return id.version();
  return 1;
}

bool Importer::checkOperandTypes(const onnx::NodeProto &node,
                                 const std::string &where,
                                 import::Operands rule) {
  using import::Operands;
  if (rule == Operands::Any)
    return true;
  for (int i = 0; i < node.input_size(); ++i) {
    auto it = types.find(node.input(i));
    if (node.input(i).empty() || it == types.end())
      continue;
    // Constant shapes, axes and bounds; labels and iteration counts.
    if ((i >= 1 && (rule == Operands::FirstFloat || rule == Operands::View)) ||
        (i == 1 && rule == Operands::Labeled))
      continue;
    // Views (nn.reshape, no kernel) move int64 and boolean tensors too, so
    // a run-time mask can be reshaped to broadcast against the scores.
    if (rule == Operands::View && elementType(it->second.elemType))
      continue;
    if (it->second.elemType != onnx::TensorProto::FLOAT)
      return fail(where + ": input '" + node.input(i) + "' has ONNX element "
                  "type " + std::to_string(it->second.elemType) + "; " +
                  node.op_type() + " is supported on float32 tensors only");
  }
  return true;
}

bool Importer::emitNode(const onnx::NodeProto &node, int index) {
  const std::string &op = node.op_type();
  std::string where = "node '" + nodeLabel(node, index) + "' (" + op + ")";
  loc = NameLoc::get(b.getStringAttr(nodeLabel(node, index)));
  const import::OpSpec *spec = import::OpRegistry::get().find(
      node.domain(), op, opsetOf(node.domain()));
  if (!spec)
    return fail(where + ": unsupported operator");
  if (spec->beforeFolding) {
    import::NodeContext c(*this, b, values, error, node, index, {});
    return spec->convert(c);
  }
  bool folded = false;
  if (!tryFold(node, index, folded))
    return false;
  if (folded)
    return true;
  if (!spec->convert)
    return fail(where + ": computed at run time, but pipec supports " + op +
                " only where it folds to a constant at import (shape "
                "computations)");
  if (spec->constantShapeInput) {
    std::vector<int64_t> shape;
    if (node.input_size() < 2 || !constantInts(node.input(1), shape))
      return fail(where + ": the shape input '" +
                  (node.input_size() > 1 ? node.input(1) : "") +
                  "' is not constant after folding the shape computations");
  }
  // Result types (static) of every non-empty output.
  SmallVector<Type> resultTypes;
  for (const auto &out : node.output()) {
    if (out.empty()) {
      resultTypes.push_back(Type());
      continue;
    }
    auto t = typeOf(out, where);
    if (failed(t))
      return false;
    resultTypes.push_back(*t);
  }
  if (!checkOperandTypes(node, where, spec->operands))
    return false;
  import::NodeContext c(*this, b, values, error, node, index, resultTypes);
  return spec->convert(c);
}

void Importer::defineConstant(const std::string &name,
                              const onnx::TensorProto &value) {
  constantNodes[name] = &value;
  import::ValueType vt;
  vt.known = true;
  vt.elemType = value.data_type();
  vt.dims.assign(value.dims().begin(), value.dims().end());
  types[name] = vt;
}

Value Importer::randomState(const std::string &where) {
  if (rngArg)
    return rngArg;
  unsigned idx = mainFn.getNumArguments();
  auto rngType = RankedTensorType::get({2}, b.getI64Type());
  if (failed(mainFn.insertArgument(
          idx, rngType,
          b.getDictionaryAttr({b.getNamedAttr("pipec.rng", b.getUnitAttr())}),
          mainFn.getLoc()))) {
    fail(where + ": internal error adding the random state");
    return Value();
  }
  rngArg = mainFn.getArgument(idx);
  return rngArg;
}

void Importer::freezeGradientFree() {
  const auto &graph = model.graph();
  auto isFloat = [&](const std::string &name) {
    auto it = types.find(name);
    return it != types.end() && it->second.elemType == onnx::TensorProto::FLOAT;
  };
  // Float values from which a float path leads to a graph output: walking
  // back from the outputs, a node whose float output is live makes its
  // float inputs live. A boolean or integer value (Equal, Shape, Cast to
  // int64) ends a path.
  std::set<std::string> live;
  for (const auto &out : graph.output())
    live.insert(out.name());
  std::set<std::string> state; // batch-norm running statistics, optimizer state
  for (int i = graph.node_size() - 1; i >= 0; --i) {
    const auto &node = graph.node(i);
    if (node.op_type() == "BatchNormalization")
      for (int k = 3; k < 5 && k < node.input_size(); ++k)
        state.insert(node.input(k));
    if (isTrainingOp(node))
      state.insert(node.input().begin(), node.input().end());
    bool any = false;
    for (const auto &out : node.output())
      any |= !out.empty() && live.count(out) && isFloat(out);
    if (!any)
      continue;
    for (const auto &in : node.input())
      if (!in.empty() && isFloat(in))
        live.insert(in);
  }
  auto consider = [&](const onnx::TensorProto &init) {
    if (init.data_type() == onnx::TensorProto::FLOAT &&
        !frozen.count(init.name()) && !live.count(init.name()) &&
        !state.count(init.name())) {
      frozen.insert(init.name());
      autoFrozen.push_back(init.name());
    }
  };
  for (const auto &init : graph.initializer())
    consider(init);
  for (const auto &[name, init] : heavy)
    consider(init);
}

void Importer::dropUnusedOutputs() {
  auto *graph = model.mutable_graph();
  std::set<std::string> used;
  for (const auto &node : graph->node())
    for (const auto &in : node.input())
      used.insert(in);
  for (const auto &out : graph->output())
    used.insert(out.name());
  for (auto &node : *graph->mutable_node()) {
    // BatchNormalization before opset 14 is in training mode when it has
    // the statistics outputs; keep that fact as the attribute of version 14.
    if (node.op_type() == "BatchNormalization" && node.output_size() > 1 &&
        !findAttr(node, "training_mode")) {
      auto *a = node.add_attribute();
      a->set_name("training_mode");
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(1);
    }
    for (int k = node.output_size() - 1; k >= 1; --k) {
      if (used.count(node.output(k)))
        continue;
      if (k == node.output_size() - 1)
        node.mutable_output()->RemoveLast();
      else
        node.set_output(k, "");
    }
  }
}

bool Importer::emit() {
  dropUnusedOutputs();
  const auto &graph = model.graph();
  module = ModuleOp::create(UnknownLoc::get(&ctx));
  module->setAttr("pipec.source", b.getStringAttr(path));
  module->setAttr("pipec.opset", b.getI64IntegerAttr(opset));
  if (!autoFrozen.empty()) {
    SmallVector<Attribute> names;
    for (const std::string &n : autoFrozen)
      names.push_back(b.getStringAttr(n));
    module->setAttr("pipec.gradient_free", b.getArrayAttr(names));
  }

  // Signature: graph inputs that are not initializers.
  SmallVector<Type> argTypes;
  SmallVector<std::string> argNames;
  for (const auto &input : graph.input()) {
    if (initializers.count(input.name()))
      continue;
    auto t = typeOf(input.name(), "model input");
    if (failed(t))
      return false;
    argTypes.push_back(*t);
    argNames.push_back(input.name());
  }
  // Result types are those of the values the nodes compute (set below), so
  // a node that cannot be imported is reported before any output.
  b.setInsertionPointToEnd(module.getBody());
  auto fn = mainFn = func::FuncOp::create(b, FileLineColLoc::get(&ctx, path, 0, 0),
                                 "main", b.getFunctionType(argTypes, {}));
  Block *entry = fn.addEntryBlock();
  if (!argTypes.empty() && cast<RankedTensorType>(argTypes[0]).getRank() > 0)
    module->setAttr("pipec.microbatch",
                    b.getI64IntegerAttr(
                        cast<RankedTensorType>(argTypes[0]).getDimSize(0)));
  for (auto [i, name] : llvm::enumerate(argNames)) {
    fn.setArgAttr(i, "pipec.name", b.getStringAttr(name));
    values[name] = entry->getArgument(i);
  }
  b.setInsertionPointToEnd(entry);

  for (int i = 0; i < graph.node_size(); ++i)
    if (!emitNode(graph.node(i), i))
      return false;
  SmallVector<Value> results;
  for (const auto &output : graph.output()) {
    auto it = values.find(output.name());
    if (it == values.end())
      return fail("model output '" + output.name() +
                  "' is a constant or an initializer; nothing to train");
    results.push_back(it->second);
  }
  func::ReturnOp::create(b, fn.getLoc(), results);
  fn.setFunctionType(b.getFunctionType(fn.getArgumentTypes(),
                                       ValueRange(results).getTypes()));
  for (auto [i, output] : llvm::enumerate(graph.output()))
    fn.setResultAttr(i, "pipec.name", b.getStringAttr(output.name()));
  // Globals go before the function (they were inserted at the end).
  for (auto &[name, global] : globals)
    global->moveBefore(fn);
  if (failed(verify(module)))
    return fail("the imported model does not verify (the diagnostic above "
                "names the ONNX node): shapes or types that disagree, in the "
                "file or after --batch/--input-shape");
  return true;
}

static void fuseErfGelu(ModuleOp module);
static void foldMatMulScale(ModuleOp module);

OwningOpRef<ModuleOp> Importer::run() {
  ctx.loadDialect<nn::NNDialect, func::FuncDialect,
                  ml_program::MLProgramDialect>();
  // Structure, operators and the checker come before the version
  // converter: libonnx's converter crashes on malformed graphs (found by
  // scripts/fuzz.sh importer).
  if (!load() || !separateInitializers() || !checkStructure() ||
      !checkSupported() || !check() || !upgradeOpset() || !check() ||
      !specialiseAndInfer() || !emit()) {
    if (module)
      module->erase();
    return nullptr;
  }
  if (opts.fuse) {
    fuseErfGelu(module);
    foldMatMulScale(module);
  }
  return OwningOpRef<ModuleOp>(module);
}

/// Erases the constants a fusion left without users.
static void eraseUnusedConstants(ModuleOp module) {
  SmallVector<Operation *> unused;
  module.walk([&](nn::ConstantOp c) {
    if (c->use_empty())
      unused.push_back(c);
  });
  for (Operation *op : unused)
    op->erase();
}

/// The value of a splat float constant, or nullopt.
static std::optional<float> splatValue(Value v) {
  auto c = v.getDefiningOp<nn::ConstantOp>();
  if (!c)
    return std::nullopt;
  auto dense = dyn_cast<DenseElementsAttr>(c.getValue());
  if (!dense || !dense.isSplat() || !dense.getElementType().isF32())
    return std::nullopt;
  return dense.getSplatValue<float>();
}

/// The erf form of GELU that exporters write for nn.GELU (PyTorch with
/// approximate='none', opsets before Gelu existed):
///   Mul(Mul(X, Add(Erf(Div(X, sqrt 2)), 1)), 0.5)
/// (either operand order of each Mul / Add) becomes one nn.gelu: one
/// kernel forward and backward instead of five (issue 4's performance
/// note). Intermediate values used elsewhere keep the graph as it is.
static void fuseErfGelu(ModuleOp module) {
  auto near = [](std::optional<float> v, float want) {
    return v && std::fabs(*v - want) <= 1e-5f * std::fabs(want);
  };
  // Returns the operand of a commutative binary op that is not `other`.
  auto split = [](Operation *op, auto &&isFirst) -> std::pair<Value, Value> {
    Value a = op->getOperand(0), b = op->getOperand(1);
    if (isFirst(a))
      return {a, b};
    if (isFirst(b))
      return {b, a};
    return {Value(), Value()};
  };
  SmallVector<nn::MulOp> outers;
  module.walk([&](nn::MulOp op) { outers.push_back(op); });
  llvm::DenseSet<Operation *> erased;
  for (nn::MulOp outer : outers) {
    if (erased.contains(outer))
      continue;
    auto [half, inner] = split(outer, [&](Value v) {
      return near(splatValue(v), 0.5f);
    });
    auto innerMul = inner ? inner.getDefiningOp<nn::MulOp>() : nn::MulOp();
    if (!innerMul || !inner.hasOneUse())
      continue;
    for (int side = 0; side < 2; ++side) {
      Value x = innerMul->getOperand(side), sum = innerMul->getOperand(1 - side);
      auto add = sum.getDefiningOp<nn::AddOp>();
      if (!add || !sum.hasOneUse())
        continue;
      auto [one, erfOut] = split(add, [&](Value v) {
        return near(splatValue(v), 1.0f);
      });
      auto erf = erfOut ? erfOut.getDefiningOp<nn::ErfOp>() : nn::ErfOp();
      if (!erf || !erfOut.hasOneUse())
        continue;
      auto div = erf.getInput().getDefiningOp<nn::DivOp>();
      if (!div || !erf.getInput().hasOneUse() || div.getLhs() != x ||
          !near(splatValue(div.getRhs()), 1.41421356f) ||
          x.getType() != outer.getType())
        continue;
      OpBuilder b(outer);
      auto gelu = nn::GeluOp::create(b, outer.getLoc(), x.getType(), x);
      outer.getResult().replaceAllUsesWith(gelu.getResult());
      for (Operation *dead : {outer.getOperation(), innerMul.getOperation(),
                              add.getOperation(), erf.getOperation(),
                              div.getOperation()}) {
        erased.insert(dead);
        dead->erase();
      }
      break;
    }
  }
  eraseUnusedConstants(module);
}

/// Attention's scores divided by sqrt(d) (or multiplied by 1/sqrt(d)): when
/// the factor is a power of two (d = 4^k, as in GPT-2's 64-wide heads) the
/// MatMul takes it as its alpha, which changes no bit (scaling by a power
/// of two is exact, in the product's accumulation as after it, short of
/// subnormal or overflowing values) and saves
/// a pass over the [batch, heads, T, T] scores forward and backward. Only
/// for a MatMul whose one user is that Div or Mul, with a splat float32
/// constant that does not change the product's shape.
static void foldMatMulScale(ModuleOp module) {
  auto powerOfTwo = [](float v) {
    int exponent = 0;
    return std::isfinite(v) && v != 0.0f &&
           std::fabs(std::frexp(v, &exponent)) == 0.5f;
  };
  SmallVector<Operation *> candidates;
  module.walk([&](Operation *op) {
    if (isa<nn::DivOp, nn::MulOp>(op))
      candidates.push_back(op);
  });
  for (Operation *op : candidates) {
    const bool divide = isa<nn::DivOp>(op);
    for (int side = 0; side < (divide ? 1 : 2); ++side) {
      Value product = op->getOperand(side), factor = op->getOperand(1 - side);
      auto mm = product.getDefiningOp<nn::MatMulOp>();
      std::optional<float> value = splatValue(factor);
      if (!mm || !product.hasOneUse() || !value || !powerOfTwo(*value) ||
          op->getResult(0).getType() != product.getType())
        continue;
      const float scale = divide ? 1.0f / *value : *value;
      const float alpha = mm.getAlpha().convertToFloat() * scale;
      if (!powerOfTwo(scale) || !std::isnormal(alpha))
        continue;
      mm.setAlphaAttr(Builder(op->getContext()).getF32FloatAttr(alpha));
      op->getResult(0).replaceAllUsesWith(product);
      op->erase();
      break;
    }
  }
  eraseUnusedConstants(module);
}

OwningOpRef<ModuleOp> pipec::importOnnxFile(MLIRContext &context,
                                            const std::string &path,
                                            const ImportOptions &options,
                                            std::string &error) {
  error.clear();
  try {
    Importer importer(context, path, options, error);
    return importer.run();
  } catch (const std::exception &e) {
    error = "failed to import '" + path + "': " + e.what();
  }
  return nullptr;
}

OwningOpRef<ModuleOp> pipec::importOnnxBytes(MLIRContext &context,
                                             const std::string &bytes,
                                             const std::string &name,
                                             const ImportOptions &options,
                                             std::string &error) {
  error.clear();
  try {
    Importer importer(context, name, options, error, &bytes);
    return importer.run();
  } catch (const std::exception &e) {
    error = "failed to import '" + name + "': " + e.what();
  }
  return nullptr;
}

int64_t pipec::onnxFileBatch(const std::string &path, std::string &error) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    error = "'" + path + "' is a folder, not an ONNX model";
    return -1;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = "cannot open '" + path + "': " + std::strerror(errno);
    return -1;
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string bytes = buffer.str();
  onnx::ModelProto model;
  if (bytes.empty()) {
    error = "'" + path + "' is empty, not an ONNX model";
    return -1;
  }
  if (!model.ParseFromString(bytes) || model.ir_version() <= 0 ||
      !model.has_graph()) {
    error = "'" + path + "' is not a valid ONNX model (protobuf parse failed: "
            "truncated or not an ONNX file)";
    return -1;
  }
  std::set<std::string> initNames;
  for (const auto &init : model.graph().initializer())
    initNames.insert(init.name());
  for (const auto &input : model.graph().input()) {
    if (initNames.count(input.name()))
      continue;
    const auto &shape = input.type().tensor_type().shape();
    if (shape.dim_size() == 0)
      return 0;
    return shape.dim(0).has_dim_value() ? shape.dim(0).dim_value() : 0;
  }
  return 0;
}

void pipec::registerImportDialects(DialectRegistry &registry) {
  registry.insert<nn::NNDialect, func::FuncDialect,
                  ml_program::MLProgramDialect>();
}
