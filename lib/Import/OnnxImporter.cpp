//===- OnnxImporter.cpp - ONNX protobuf -> nn dialect ---------------------===//
//
// Pipeline of the importer:
//   1. parse the protobuf (a truncated or foreign file fails here);
//   2. upgrade opsets older than kMinOpset with ONNX's version converter;
//   3. refuse unsupported operators, listing each once with its nodes;
//   4. run ONNX's checker;
//   5. specialise input shapes (batch / --input-shape) and run ONNX shape
//      inference, so every value gets a static type;
//   6. emit nn ops in graph order (ONNX requires topological order), float
//      initializers as mutable ml_program globals with dense_resource data.
// Every failure is a message for the user; nothing here aborts.
//
//===----------------------------------------------------------------------===//
#include "pipec/Import.h"

#include "ConstFold.h"
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

/// Operators the importer converts (issue: the MLP slice). Others are
/// reported together with the nodes that use them.
const std::set<std::string> &supportedOps() {
  static std::set<std::string> ops = {
      "Gemm",      "MatMul",     "Add",       "Sub",        "Mul",
      "Div",       "Relu",       "Tanh",      "Sigmoid",    "Softmax",
      "LogSoftmax", "Flatten",   "Reshape",   "Transpose",  "Identity",
      "Constant",  "SoftmaxCrossEntropyLoss", "Conv",       "MaxPool",
      "AveragePool", "GlobalAveragePool", "BatchNormalization",
      "LayerNormalization", "Gather", "Concat", "Split", "Slice", "Squeeze",
      "Unsqueeze", "Expand", "Erf", "Sqrt", "Exp", "Log", "Neg", "Abs",
      "Reciprocal", "LeakyRelu", "Clip", "Pow", "Max", "Min", "ReduceMean",
      "HardSigmoid", "HardSwish", "Pad", "ConvTranspose", "Resize",
      "Upsample", "Sum", "Mean", "Elu", "Selu", "Celu", "Softplus",
      "Softsign", "ThresholdedRelu", "Sign", "Trilu", "Tile",
      "ReduceSum", "Dropout", "Cast"};
  // Shape computations are supported when they fold to constants.
  static const bool once = [] {
    for (const char *op : {"Shape", "Size", "Range", "ConstantOfShape",
                           "Equal", "Less", "Greater", "LessOrEqual",
                           "GreaterOrEqual", "Where", "Not", "And", "Or",
                           "Xor", "Floor", "Ceil"})
      ops.insert(op);
    return true;
  }();
  (void)once;
  return ops;
}

bool isDefaultDomain(const std::string &domain) {
  return domain.empty() || domain == "ai.onnx";
}

/// ONNX's training operators (optimizers).
constexpr const char *kTrainingDomain = "ai.onnx.preview.training";
bool isTrainingOp(const onnx::NodeProto &node) {
  return node.domain() == kTrainingDomain &&
         (node.op_type() == "Momentum" || node.op_type() == "Adam" ||
          node.op_type() == "Adagrad");
}

std::string nodeLabel(const onnx::NodeProto &node, int index) {
  if (!node.name().empty())
    return node.name();
  return node.op_type() + "_" + std::to_string(index);
}

std::string dimsString(const std::vector<int64_t> &dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    s += (i ? "x" : "") + (dims[i] < 0 ? std::string("?") : std::to_string(dims[i]));
  return s + "]";
}

/// Static type facts of an ONNX value.
struct ValueType {
  int32_t elemType = 0;
  std::vector<int64_t> dims; // -1 = unknown
  bool known = false;
  bool isStatic() const {
    if (!known)
      return false;
    for (int64_t d : dims)
      if (d < 0)
        return false;
    return true;
  }
};

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

class Importer {
public:
  Importer(MLIRContext &ctx, const std::string &path,
           const ImportOptions &options, std::string &error,
           const std::string *bytes = nullptr)
      : ctx(ctx), path(path), options(options), error(error), b(&ctx),
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
  /// baked into its shape constants.
  std::string batchHint() const;
  bool emit();
  bool emitNode(const onnx::NodeProto &node, int index);
  bool emitOptimizer(const onnx::NodeProto &node, int index,
                     ArrayRef<Type> resultTypes);

  Type elementType(int32_t onnxType);
  FailureOr<RankedTensorType> typeOf(const std::string &name,
                                     const std::string &where);
  Value operand(const onnx::NodeProto &node, int i, int index);
  bool constantInts(const std::string &name, std::vector<int64_t> &out);

  MLIRContext &ctx;
  std::string path;
  const ImportOptions &options;
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
  /// Float initializers: trainable, so never folded into constants.
  bool isWeightName(const std::string &name) const {
    auto it = initializers.find(name);
    return it != initializers.end() &&
           it->second->data_type() == onnx::TensorProto::FLOAT &&
           !frozen.count(name);
  }
  std::optional<import::ConstTensor> constOf(const std::string &name);
  bool tryFold(const onnx::NodeProto &node, int index, bool &folded);
  bool emitLayerNode(const onnx::NodeProto &node, int index,
                     ArrayRef<Type> resultTypes, bool &handled);
  bool emitMaskNode(const onnx::NodeProto &node, int index, Type resultType,
                    bool &handled);
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
    bool ok = (isDefaultDomain(node.domain()) &&
               supportedOps().count(node.op_type())) ||
              isTrainingOp(node);
    if (ok)
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

static const onnx::AttributeProto *findAttr(const onnx::NodeProto &node,
                                            const std::string &name);

std::string Importer::batchHint() const {
  if (fileBatch == 0)
    return "";
  return " (the file fixes the batch at " + std::to_string(fileBatch) +
         ", e.g. in its Reshape targets, and pipec re-specialises it to " +
         std::to_string(options.batch) +
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
  for (auto &input : *graph->mutable_input()) {
    if (initNames.count(input.name()) || heavy.count(input.name()))
      continue;
    auto *tt = input.mutable_type()->mutable_tensor_type();
    auto *shape = tt->mutable_shape();
    auto it = options.inputShapes.find(input.name());
    if (it != options.inputShapes.end()) {
      shape->clear_dim();
      for (int64_t d : it->second)
        shape->add_dim()->set_dim_value(d);
    } else if (options.batch > 0 && shape->dim_size() >= 1) {
      if (shape->dim(0).has_dim_value() && fileBatch == 0 &&
          shape->dim(0).dim_value() != options.batch) {
        fileBatch = shape->dim(0).dim_value();
        fileBatchInput = input.name();
      }
      shape->mutable_dim(0)->set_dim_value(options.batch);
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
  frozen = options.frozen;
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
  for (const std::string &name : options.frozen) {
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
    fail(where + ": '" + name + "' has ONNX element type " +
         std::to_string(vt.elemType) +
         "; pipec supports float32, int64 and bool tensors");
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
    if (supportedOps().count(node.op_type()) &&
        std::set<std::string>{"Shape", "Size", "Range", "ConstantOfShape",
                              "Floor", "Ceil"}
            .count(node.op_type()))
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
  if (options.untieWeights && isWeightName(name)) {
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
// Node conversion
//===----------------------------------------------------------------------===//

static const onnx::AttributeProto *findAttr(const onnx::NodeProto &node,
                                            const std::string &name) {
  for (const auto &a : node.attribute())
    if (a.name() == name)
      return &a;
  return nullptr;
}
static int64_t attrInt(const onnx::NodeProto &n, const std::string &name,
                       int64_t dflt) {
  const auto *a = findAttr(n, name);
  return a ? a->i() : dflt;
}
static float attrFloat(const onnx::NodeProto &n, const std::string &name,
                       float dflt) {
  const auto *a = findAttr(n, name);
  return a ? a->f() : dflt;
}

bool Importer::emitNode(const onnx::NodeProto &node, int index) {
  const std::string &op = node.op_type();
  std::string label = nodeLabel(node, index);
  std::string where = "node '" + label + "' (" + op + ")";
  loc = NameLoc::get(b.getStringAttr(label));

  if (op == "Constant") {
    const auto *value = findAttr(node, "value");
    if (!value || !value->has_t())
      return fail(where + ": only the 'value' attribute form of Constant is "
                          "supported");
    constantNodes[node.output(0)] = &value->t();
    ValueType vt;
    vt.known = true;
    vt.elemType = value->t().data_type();
    vt.dims.assign(value->t().dims().begin(), value->t().dims().end());
    types[node.output(0)] = vt;
    return true; // materialised on first use
  }

  bool folded = false;
  if (!tryFold(node, index, folded))
    return false;
  if (folded)
    return true;

  if (op == "Reshape" || op == "Expand") {
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
  // Activations are float32; only the labels of the loss, gather indices
  // and constant shape/axes/bounds inputs are integers.
  static const std::set<std::string> firstInputOnly = {
      "Reshape", "Expand", "Squeeze", "Unsqueeze", "Split", "Slice", "Clip",
      "ReduceSum", "ReduceMean", "Dropout", "Gather", "Pad", "Resize",
      "Upsample", "Trilu", "Tile"};
  // Comparisons, logic, Where and Cast take integer (and boolean) tensors
  // too; they check their own operand types.
  static const std::set<std::string> anyElementType = {
      "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
      "Not",   "And",  "Or",      "Xor",         "Where",
      "Cast",  "Trilu"};
  // Views (nn.reshape, no kernel) move int64 and boolean tensors too, so a
  // run-time mask can be reshaped to broadcast against the scores.
  static const std::set<std::string> views = {"Reshape", "Squeeze",
                                              "Unsqueeze"};
  for (int i = 0; i < node.input_size() && !anyElementType.count(op); ++i) {
    bool labels = (op == "SoftmaxCrossEntropyLoss" || isTrainingOp(node)) &&
                  i == 1;
    bool shape = (firstInputOnly.count(op) && i >= 1) ||
                 (op == "Where" && i == 0); // a constant mask

    auto it = types.find(node.input(i));
    if (node.input(i).empty() || labels || shape || it == types.end())
      continue;
    if (views.count(op) && elementType(it->second.elemType))
      continue;
    if (it->second.elemType != onnx::TensorProto::FLOAT)
      return fail(where + ": input '" + node.input(i) + "' has ONNX element "
                  "type " + std::to_string(it->second.elemType) + "; " + op +
                  " is supported on float32 tensors only");
  }
  auto in = [&](int i) { return operand(node, i, index); };
  auto need = [&](int count) -> bool {
    for (int i = 0; i < count; ++i)
      if (!in(i))
        return error.empty() ? fail(where + ": missing input " +
                                    std::to_string(i))
                             : false;
    return true;
  };
  Type rt0 = resultTypes.empty() ? Type() : resultTypes[0];
  Value result;

  bool handled = false;
  if (!emitLayerNode(node, index, resultTypes, handled))
    return false;
  if (handled)
    return true;

  if (!emitMaskNode(node, index, rt0, handled))
    return false;
  if (handled)
    return true;

  if (op == "Where") {
    // Where(c, X, Y) with a constant condition c and run-time X or Y:
    //   X * c + Y * (1 - c), where a constant branch enters as the constant
    //   where(c, X, 0) / where(c, 0, Y) (so that a mask value such as -inf
    //   is never multiplied by 0). Exact for finite run-time values.
    auto cond = constOf(node.input(0));
    Value x = in(1), y = in(2);
    if (!cond || !x || !y)
      return error.empty() ? fail(where + ": missing input") : false;
    Type f32 = b.getF32Type();
    auto condType = RankedTensorType::get(cond->dims, f32);
    std::vector<float> keep(size_t(cond->numel())), drop(keep.size());
    for (size_t i = 0; i < keep.size(); ++i) {
      keep[i] = cond->real(int64_t(i)) != 0 ? 1.0f : 0.0f;
      drop[i] = 1.0f - keep[i];
    }
    auto constant = [&](RankedTensorType t, ArrayRef<float> v) -> Value {
      return nn::ConstantOp::create(b, loc,
                                    cast<ElementsAttr>(DenseElementsAttr::get(t, v)));
    };
    auto broadcast = [&](Type a, Type c) {
      auto at = cast<RankedTensorType>(a), ct = cast<RankedTensorType>(c);
      int64_t rank = std::max(at.getRank(), ct.getRank());
      SmallVector<int64_t> dims(rank, 1);
      for (int64_t k = 0; k < rank; ++k) {
        int64_t da = k < rank - at.getRank() ? 1 : at.getDimSize(k - (rank - at.getRank()));
        int64_t dc = k < rank - ct.getRank() ? 1 : ct.getDimSize(k - (rank - ct.getRank()));
        dims[k] = da == 1 ? dc : da;
      }
      return RankedTensorType::get(dims, f32);
    };
    // A branch that is a constant (not a trained weight), selected by the
    // condition, as one constant.
    auto selectedConstant = [&](int branch) -> Value {
      const std::string &name = node.input(branch);
      auto c = isWeightName(name) ? std::nullopt : constOf(name);
      if (!c)
        return Value();
      onnx::NodeProto w;
      w.set_op_type("Where");
      for (const char *n : {"c", "x", "y"})
        w.add_input(n);
      w.add_output("o");
      import::ConstTensor zero;
      zero.isFloat = true;
      zero.reals = {0.0};
      std::string why;
      auto out = import::foldNode(
          w,
          [&](int i) -> std::optional<import::ConstTensor> {
            if (i == 0)
              return cond;
            return i == branch ? c : std::optional<import::ConstTensor>(zero);
          },
          [](const std::string &) -> std::optional<std::vector<int64_t>> {
            return std::nullopt;
          },
          why);
      if (!out || out->empty())
        return Value();
      const import::ConstTensor &r = out->front();
      std::vector<float> v(r.reals.begin(), r.reals.end());
      if (!r.isFloat)
        for (int64_t i = 0; i < r.numel(); ++i)
          v.push_back(float(r.ints[size_t(i)]));
      return constant(RankedTensorType::get(r.dims, f32), v);
    };
    Value xs = selectedConstant(1), ys = selectedConstant(2);
    if (!xs)
      xs = nn::MulOp::create(b, loc, broadcast(x.getType(), condType), x,
                             constant(condType, keep));
    if (!ys)
      ys = nn::MulOp::create(b, loc, broadcast(y.getType(), condType), y,
                             constant(condType, drop));
    result = nn::AddOp::create(b, loc, rt0, xs, ys);
  } else if (op == "Gemm") {
    if (!need(2))
      return false;
    Value c = in(2);
    if (!error.empty())
      return false;
    result = nn::GemmOp::create(
        b, loc, rt0, in(0), in(1), c,
        b.getF32FloatAttr(attrFloat(node, "alpha", 1.0f)),
        b.getF32FloatAttr(attrFloat(node, "beta", 1.0f)),
        b.getBoolAttr(attrInt(node, "transA", 0) != 0),
        b.getBoolAttr(attrInt(node, "transB", 0) != 0));
  } else if (op == "MatMul") {
    if (!need(2))
      return false;
    auto at = cast<RankedTensorType>(in(0).getType());
    auto bt = cast<RankedTensorType>(in(1).getType());
    if (at.getRank() < 2 || bt.getRank() < 2)
      return fail(where + ": 1-D MatMul operands are not supported yet");
    result = nn::MatMulOp::create(b, loc, rt0, in(0), in(1));
  } else if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") {
    if (!need(2))
      return false;
    if (op == "Add")
      result = nn::AddOp::create(b, loc, rt0, in(0), in(1));
    else if (op == "Sub")
      result = nn::SubOp::create(b, loc, rt0, in(0), in(1));
    else if (op == "Mul")
      result = nn::MulOp::create(b, loc, rt0, in(0), in(1));
    else
      result = nn::DivOp::create(b, loc, rt0, in(0), in(1));
  } else if (op == "Relu" || op == "Tanh" || op == "Sigmoid" ||
             op == "Identity") {
    if (!need(1))
      return false;
    if (op == "Relu")
      result = nn::ReluOp::create(b, loc, in(0));
    else if (op == "Tanh")
      result = nn::TanhOp::create(b, loc, in(0));
    else if (op == "Sigmoid")
      result = nn::SigmoidOp::create(b, loc, in(0));
    else if (options.untieWeights && isWeightName(node.input(0)) &&
             in(0).getDefiningOp<ml_program::GlobalLoadOp>())
      result = in(0); // the untied copy is the parameter itself
    else
      result = nn::IdentityOp::create(b, loc, in(0));
  } else if (op == "Softmax" || op == "LogSoftmax") {
    if (!need(1))
      return false;
    auto axis = b.getI64IntegerAttr(attrInt(node, "axis", -1));
    if (op == "Softmax")
      result = nn::SoftmaxOp::create(b, loc, rt0, in(0), axis, UnitAttr());
    else
      result = nn::LogSoftmaxOp::create(b, loc, rt0, in(0), axis, UnitAttr());
  } else if (op == "Flatten") {
    if (!need(1))
      return false;
    result = nn::FlattenOp::create(b, loc, rt0, in(0),
                                   b.getI64IntegerAttr(attrInt(node, "axis", 1)));
  } else if (op == "Reshape") {
    if (!need(1))
      return false;
    std::vector<int64_t> shape;
    if (node.input_size() < 2 || !constantInts(node.input(1), shape))
      return fail(where + ": the shape input '" +
                  (node.input_size() > 1 ? node.input(1) : "") +
                  "' is not a constant int64 tensor (computed shapes are not "
                  "supported yet)");
    auto inType = cast<RankedTensorType>(in(0).getType());
    auto outType = cast<RankedTensorType>(rt0);
    if (inType.getNumElements() != outType.getNumElements())
      return fail(where + ": reshapes " + std::to_string(inType.getNumElements()) +
                  " elements to the shape " +
                  dimsString(std::vector<int64_t>(outType.getShape().begin(),
                                                  outType.getShape().end())) +
                  " of " + std::to_string(outType.getNumElements()) +
                  batchHint());
    result = nn::ReshapeOp::create(b, loc, rt0, in(0));
  } else if (op == "Transpose") {
    if (!need(1))
      return false;
    int64_t rank = cast<RankedTensorType>(in(0).getType()).getRank();
    SmallVector<int64_t> perm;
    if (const auto *p = findAttr(node, "perm"))
      perm.assign(p->ints().begin(), p->ints().end());
    else
      for (int64_t i = rank - 1; i >= 0; --i)
        perm.push_back(i);
    result = nn::TransposeOp::create(b, loc, rt0, in(0),
                                     b.getDenseI64ArrayAttr(perm));
  } else if (op == "SoftmaxCrossEntropyLoss") {
    if (!need(2))
      return false;
    Value weights = in(2);
    if (!error.empty())
      return false;
    std::string reduction = "mean";
    if (const auto *r = findAttr(node, "reduction"))
      reduction = r->s();
    IntegerAttr ignore;
    if (const auto *ii = findAttr(node, "ignore_index"))
      ignore = b.getI64IntegerAttr(ii->i());
    Type logProbType = resultTypes.size() > 1 ? resultTypes[1] : Type();
    auto sce = nn::SoftmaxCrossEntropyLossOp::create(
        b, loc, rt0, logProbType, in(0), in(1), weights,
        b.getStringAttr(reduction), ignore);
    values[node.output(0)] = sce.getLoss();
    if (logProbType)
      values[node.output(1)] = sce.getLogProb();
    return true;
  } else if (isTrainingOp(node)) {
    return emitOptimizer(node, index, resultTypes);
  } else {
    return fail(where + ": unsupported operator");
  }
  if (!result)
    return false;
  if (result.getType() != rt0)
    return fail(where + ": inferred result type disagrees with ONNX shape "
                        "inference");
  values[node.output(0)] = result;
  return true;
}

/// Momentum / Adam / Adagrad update several tensors at once: inputs R, T,
/// then k groups (X..., G..., state...), outputs (X_new..., state_new...).
/// One nn op per tensor.
bool Importer::emitOptimizer(const onnx::NodeProto &node, int index,
                             ArrayRef<Type> resultTypes) {
  const std::string &op = node.op_type();
  std::string where = "node '" + nodeLabel(node, index) + "' (" + op + ")";
  int states = op == "Adam" ? 2 : 1;
  int groups = (node.input_size() - 2) / (2 + states);
  if (groups < 1 || node.input_size() != 2 + groups * (2 + states) ||
      node.output_size() != groups * (1 + states))
    return fail(where + ": unexpected number of inputs or outputs");
  Value r = operand(node, 0, index), t = operand(node, 1, index);
  if (!r || !t)
    return false;
  auto f = [&](const char *name, float dflt) {
    return b.getF32FloatAttr(attrFloat(node, name, dflt));
  };
  for (int k = 0; k < groups; ++k) {
    Value x = operand(node, 2 + k, index);
    Value g = operand(node, 2 + groups + k, index);
    Value s1 = operand(node, 2 + 2 * groups + k, index);
    Value s2 = states == 2 ? operand(node, 2 + 3 * groups + k, index) : Value();
    if (!x || !g || !s1 || (states == 2 && !s2))
      return false;
    Type type = x.getType();
    SmallVector<Value> outs;
    if (op == "Momentum") {
      std::string mode = "standard";
      if (const auto *m = findAttr(node, "mode"))
        mode = m->s();
      auto mo = nn::MomentumOp::create(
          b, loc, type, type, r, t, x, g, s1, f("alpha", 0), f("beta", 0),
          b.getStringAttr(mode), f("norm_coefficient", 0));
      outs = {mo.getXNew(), mo.getVNew()};
    } else if (op == "Adam") {
      auto ad = nn::AdamOp::create(
          b, loc, type, type, type, r, t, x, g, s1, s2, f("alpha", 0.9f),
          f("beta", 0.999f), f("norm_coefficient", 0),
          f("norm_coefficient_post", 0), f("epsilon", 1e-6f));
      outs = {ad.getXNew(), ad.getVNew(), ad.getHNew()};
    } else {
      auto ag = nn::AdagradOp::create(b, loc, type, type, r, t, x, g, s1,
                                      f("decay_factor", 0), f("epsilon", 1e-6f),
                                      f("norm_coefficient", 0));
      outs = {ag.getXNew(), ag.getHNew()};
    }
    for (int j = 0; j < 1 + states; ++j) {
      int out = j * groups + k;
      if (resultTypes[out] && resultTypes[out] != outs[j].getType())
        return fail(where + ": output type disagrees with shape inference");
      values[node.output(out)] = outs[j];
    }
  }
  return true;
}

//===----------------------------------------------------------------------===//
// CNN and transformer operators
//===----------------------------------------------------------------------===//

static std::vector<int64_t> attrInts(const onnx::NodeProto &n,
                                     const std::string &name,
                                     std::vector<int64_t> dflt = {}) {
  const auto *a = findAttr(n, name);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : dflt;
}

static std::string attrString(const onnx::NodeProto &n, const std::string &name,
                              const std::string &dflt) {
  const auto *a = findAttr(n, name);
  return a ? a->s() : dflt;
}

/// Explicit [top, left, bottom, right] pads of a 2-D window from ONNX's
/// auto_pad/pads; empty with `why` set for unsupported settings.
static std::vector<int64_t> windowPads(const onnx::NodeProto &node,
                                       ArrayRef<int64_t> in,
                                       ArrayRef<int64_t> kernel,
                                       ArrayRef<int64_t> strides,
                                       ArrayRef<int64_t> dilations,
                                       std::string &why) {
  std::string autoPad = attrString(node, "auto_pad", "NOTSET");
  if (autoPad == "NOTSET") {
    std::vector<int64_t> pads = attrInts(node, "pads", {0, 0, 0, 0});
    if (pads.size() != 4) {
      why = "pads must have 4 entries for a 2-D window";
      return {};
    }
    return pads;
  }
  if (autoPad == "VALID")
    return {0, 0, 0, 0};
  if (autoPad != "SAME_UPPER" && autoPad != "SAME_LOWER") {
    why = "auto_pad '" + autoPad + "' is not supported";
    return {};
  }
  std::vector<int64_t> pads(4);
  for (int d = 0; d < 2; ++d) {
    int64_t out = (in[d] + strides[d] - 1) / strides[d];
    int64_t total = std::max<int64_t>(
        0, (out - 1) * strides[d] + (kernel[d] - 1) * dilations[d] + 1 - in[d]);
    int64_t small = total / 2, big = total - small;
    pads[d] = autoPad == "SAME_UPPER" ? small : big;
    pads[d + 2] = autoPad == "SAME_UPPER" ? big : small;
  }
  return pads;
}

/// Comparisons, logic, Cast and Where with a run-time condition: the ops of
/// masks computed from the data (padding masks from token ids, say).
/// Booleans are int64 0/1: And(a, b) = Where(a, b, a), Or(a, b) =
/// Where(a, a, b), Xor = (a != b), Not(a) = (a == 0), Cast to bool = (x != 0).
bool Importer::emitMaskNode(const onnx::NodeProto &node, int index,
                            Type resultType, bool &handled) {
  const std::string &op = node.op_type();
  static const std::map<std::string, const char *> predicates = {
      {"Equal", "eq"}, {"Less", "lt"}, {"Greater", "gt"},
      {"LessOrEqual", "le"}, {"GreaterOrEqual", "ge"}, {"Xor", "ne"}};
  const bool isWhere = op == "Where";
  handled = predicates.count(op) || op == "Not" || op == "And" || op == "Or" ||
            op == "Cast" || isWhere;
  if (!handled)
    return true;
  std::string where = "node '" + nodeLabel(node, index) + "' (" + op + ")";
  auto in = [&](int i) { return operand(node, i, index); };
  auto elem = [](Value v) {
    return cast<RankedTensorType>(v.getType()).getElementType();
  };
  auto out0 = [&](Value v) -> bool {
    if (!v)
      return false;
    if (v.getType() != resultType)
      return fail(where + ": result type disagrees with ONNX shape inference");
    values[node.output(0)] = v;
    return true;
  };
  auto zeroLike = [&](Value v) -> Value {
    auto t = RankedTensorType::get({}, elem(v));
    Attribute z = elem(v).isF32()
                      ? Attribute(DenseElementsAttr::get(t, 0.0f))
                      : Attribute(DenseElementsAttr::get(t, int64_t(0)));
    return nn::ConstantOp::create(b, loc, cast<ElementsAttr>(z));
  };
  auto compare = [&](StringRef pred, Value l, Value r) -> Value {
    if (elem(l) != elem(r)) {
      fail(where + ": operands of different element types (float32 and "
                   "int64/bool) are not supported");
      return Value();
    }
    return nn::CompareOp::create(b, loc, resultType, b.getStringAttr(pred), l,
                                 r);
  };
  if (isWhere) {
    // A constant float condition keeps the mask arithmetic of emitNode (no
    // run-time select); everything else selects at run time.
    auto cond = constOf(node.input(0));
    if (cond && !isWeightName(node.input(0))) {
      auto it = types.find(node.input(1));
      if (it != types.end() && it->second.elemType == onnx::TensorProto::FLOAT) {
        handled = false;
        return true;
      }
    }
    Value c = in(0), x = in(1), y = in(2);
    if (!c || !x || !y)
      return error.empty() ? fail(where + ": missing input") : false;
    if (!elem(c).isInteger(64))
      return fail(where + ": the condition must be a bool tensor");
    if (elem(x) != elem(y))
      return fail(where + ": X and Y have different element types");
    return out0(nn::WhereOp::create(b, loc, resultType, c, x, y));
  }
  Value x = in(0);
  if (!x)
    return error.empty() ? fail(where + ": missing input") : false;
  if (op == "Cast") {
    int64_t to = attrInt(node, "to", 0);
    if (to == onnx::TensorProto::BOOL)
      return out0(compare("ne", x, zeroLike(x)));
    if (to != onnx::TensorProto::FLOAT && to != onnx::TensorProto::INT64)
      return fail(where + ": casting run-time tensors to ONNX type " +
                  std::to_string(to) +
                  " is not supported (float32, int64 and bool are)");
    if (elem(x) == cast<RankedTensorType>(resultType).getElementType())
      return out0(nn::IdentityOp::create(b, loc, x));
    return out0(nn::CastOp::create(b, loc, resultType, x));
  }
  if (op == "Not")
    return out0(compare("eq", x, zeroLike(x)));
  Value y = in(1);
  if (!y)
    return error.empty() ? fail(where + ": missing input") : false;
  if (op == "And" || op == "Or") {
    if (!elem(x).isInteger(64) || !elem(y).isInteger(64))
      return fail(where + ": operands must be bool tensors");
    return out0(op == "And"
                    ? nn::WhereOp::create(b, loc, resultType, x, y, x)
                    : nn::WhereOp::create(b, loc, resultType, x, x, y));
  }
  return out0(compare(predicates.at(op), x, y));
}

bool Importer::emitLayerNode(const onnx::NodeProto &node, int index,
                             ArrayRef<Type> resultTypes, bool &handled) {
  const std::string &op = node.op_type();
  std::string where = "node '" + nodeLabel(node, index) + "' (" + op + ")";
  handled = true;
  auto in = [&](int i) { return operand(node, i, index); };
  Type rt0 = resultTypes.empty() ? Type() : resultTypes[0];
  auto rtype = [](Value v) { return cast<RankedTensorType>(v.getType()); };
  auto out0 = [&](Value v) -> bool {
    if (!v)
      return false;
    if (v.getType() != rt0)
      return fail(where + ": result type disagrees with ONNX shape inference");
    values[node.output(0)] = v;
    return true;
  };
  auto f32 = [&](float v) { return b.getF32FloatAttr(v); };
  auto i64s = [&](ArrayRef<int64_t> v) { return b.getDenseI64ArrayAttr(v); };
  // A float32 scalar constant (broadcasts against any tensor).
  auto scalarF32 = [&](float v) -> Value {
    auto t = RankedTensorType::get({}, b.getF32Type());
    return nn::ConstantOp::create(
        b, loc, cast<ElementsAttr>(DenseElementsAttr::get(t, v)));
  };
  auto inputConstFloat = [&](int i, float dflt) -> std::optional<float> {
    if (i >= node.input_size() || node.input(i).empty())
      return dflt;
    auto c = constOf(node.input(i));
    if (!c || c->numel() != 1)
      return std::nullopt;
    return float(c->real(0));
  };

  // Elementwise functions.
  if (op == "Erf" || op == "Sqrt" || op == "Exp" || op == "Log" || op == "Neg" ||
      op == "Abs" || op == "Reciprocal") {
    Value x = in(0);
    if (!x)
      return false;
    Value y = op == "Erf"   ? nn::ErfOp::create(b, loc, x).getResult()
              : op == "Sqrt" ? nn::SqrtOp::create(b, loc, x).getResult()
              : op == "Exp"  ? nn::ExpOp::create(b, loc, x).getResult()
              : op == "Log"  ? nn::LogOp::create(b, loc, x).getResult()
              : op == "Neg"  ? nn::NegOp::create(b, loc, x).getResult()
              : op == "Abs"  ? nn::AbsOp::create(b, loc, x).getResult()
                             : nn::ReciprocalOp::create(b, loc, x).getResult();
    return out0(y);
  }
  if (op == "LeakyRelu") {
    Value x = in(0);
    return x && out0(nn::LeakyReluOp::create(b, loc, rt0, x,
                                             f32(attrFloat(node, "alpha", 0.01f))));
  }
  if (op == "Clip") {
    Value x = in(0);
    if (!x)
      return false;
    auto lo = inputConstFloat(1, attrFloat(node, "min", -FLT_MAX));
    auto hi = inputConstFloat(2, attrFloat(node, "max", FLT_MAX));
    if (!lo || !hi)
      return fail(where + ": min and max must be constant scalars");
    return out0(nn::ClipOp::create(b, loc, rt0, x, f32(*lo), f32(*hi)));
  }
  // HardSigmoid(x) = clip(alpha x + beta, 0, 1); HardSwish(x) =
  // x HardSigmoid(x) with alpha 1/6, beta 1/2 (MobileNetV3).
  if (op == "HardSigmoid" || op == "HardSwish") {
    Value x = in(0);
    if (!x)
      return false;
    bool swish = op == "HardSwish";
    float alpha = swish ? 1.0f / 6.0f : attrFloat(node, "alpha", 0.2f);
    float beta = swish ? 0.5f : attrFloat(node, "beta", 0.5f);
    Value t = nn::MulOp::create(b, loc, rt0, x, scalarF32(alpha));
    t = nn::AddOp::create(b, loc, rt0, t, scalarF32(beta));
    t = nn::ClipOp::create(b, loc, rt0, t, f32(0.0f), f32(1.0f));
    if (swish)
      t = nn::MulOp::create(b, loc, rt0, x, t);
    return out0(t);
  }
  // Pad (constant mode): negative pads crop (nn.slice), positive ones
  // place the tensor into a filled one (nn.slice_grad of x - value, plus
  // value).
  if (op == "Pad") {
    Value x = in(0);
    if (!x)
      return false;
    std::string mode = attrString(node, "mode", "constant");
    if (mode != "constant")
      return fail(where + ": mode '" + mode + "' is not supported (constant "
                  "padding only)");
    std::vector<int64_t> pads;
    if (node.input_size() < 2 || !constantInts(node.input(1), pads))
      return fail(where + ": pads must be a constant int64 tensor");
    auto xt = rtype(x);
    const int64_t rank = xt.getRank();
    if (int64_t(pads.size()) != 2 * rank)
      return fail(where + ": pads has " + std::to_string(pads.size()) +
                  " values for a rank-" + std::to_string(rank) +
                  " input (needs " + std::to_string(2 * rank) + ")");
    auto value = inputConstFloat(2, 0.0f);
    if (!value)
      return fail(where + ": constant_value must be a constant scalar");
    SmallVector<int64_t> cropStart(rank, 0), kept(rank), place(rank, 0),
        ones(rank, 1);
    bool crop = false, pad = false;
    for (int64_t k = 0; k < rank; ++k) {
      int64_t lo = pads[k], hi = pads[k + rank];
      cropStart[k] = std::max<int64_t>(-lo, 0);
      kept[k] = xt.getDimSize(k) - std::max<int64_t>(-lo, 0) -
                std::max<int64_t>(-hi, 0);
      if (kept[k] <= 0)
        return fail(where + ": pads crop dimension " + std::to_string(k) +
                    " to nothing");
      place[k] = std::max<int64_t>(lo, 0);
      crop |= lo < 0 || hi < 0;
      pad |= lo > 0 || hi > 0;
    }
    if (crop)
      x = nn::SliceOp::create(b, loc,
                              RankedTensorType::get(kept, b.getF32Type()), x,
                              i64s(cropStart), i64s(ones));
    if (!pad)
      return out0(crop ? x : nn::IdentityOp::create(b, loc, x).getResult());
    Value v;
    if (*value != 0.0f) {
      v = scalarF32(*value);
      x = nn::SubOp::create(b, loc, x.getType(), x, v);
    }
    Value y = nn::SliceGradOp::create(b, loc, rt0, x, i64s(place), i64s(ones));
    if (v)
      y = nn::AddOp::create(b, loc, rt0, y, v);
    return out0(y);
  }
  if (op == "Pow") {
    Value x = in(0);
    if (!x)
      return false;
    auto e = constOf(node.input(1));
    if (e && e->numel() == 1)
      return out0(nn::PowScalarOp::create(b, loc, rt0, x, f32(float(e->real(0)))));
    Value y = in(1);
    return y && out0(nn::PowOp::create(b, loc, rt0, x, y));
  }
  if (op == "Max" || op == "Min" || op == "Sum" || op == "Mean") {
    Value acc = in(0);
    if (!acc)
      return false;
    for (int i = 1; i < node.input_size(); ++i) {
      Value v = in(i);
      if (!v)
        return false;
      auto shape = nn::broadcastShapes(rtype(acc).getShape(), rtype(v).getShape());
      if (failed(shape))
        return fail(where + ": operand shapes do not broadcast");
      auto type = RankedTensorType::get(*shape, b.getF32Type());
      acc = op == "Max"   ? nn::MaxOp::create(b, loc, type, acc, v).getResult()
            : op == "Min" ? nn::MinOp::create(b, loc, type, acc, v).getResult()
                          : nn::AddOp::create(b, loc, type, acc, v).getResult();
    }
    if (op == "Mean" && node.input_size() > 1)
      acc = nn::MulOp::create(b, loc, rt0, acc,
                              scalarF32(1.0f / float(node.input_size())));
    else if (node.input_size() == 1)
      acc = nn::IdentityOp::create(b, loc, acc);
    return out0(acc);
  }
  // Activations written with ops that have kernels. The branch a Where
  // drops is kept finite (exp of min(x, 0)), so its zero gradient stays 0.
  if (op == "Elu" || op == "Selu" || op == "Celu" || op == "Softplus" ||
      op == "Softsign" || op == "ThresholdedRelu" || op == "Sign") {
    Value x = in(0);
    if (!x)
      return false;
    auto xt = rtype(x);
    auto maskType = RankedTensorType::get(xt.getShape(), b.getI64Type());
    auto cmp = [&](const char *pred, float v) -> Value {
      return nn::CompareOp::create(b, loc, maskType, b.getStringAttr(pred), x,
                                   scalarF32(v));
    };
    auto mul = [&](Value a, Value c) -> Value {
      return nn::MulOp::create(b, loc, xt, a, c);
    };
    auto add = [&](Value a, Value c) -> Value {
      return nn::AddOp::create(b, loc, xt, a, c);
    };
    // alpha (exp(min(x, 0) / scale) - 1), the negative branch of ELU/CELU.
    auto negBranch = [&](float alpha, float scale) -> Value {
      Value m = nn::MinOp::create(b, loc, xt, x, scalarF32(0.0f));
      if (scale != 1.0f)
        m = nn::DivOp::create(b, loc, xt, m, scalarF32(scale));
      Value e = add(nn::ExpOp::create(b, loc, m), scalarF32(-1.0f));
      return mul(e, scalarF32(alpha));
    };
    Value y;
    if (op == "Elu" || op == "Selu") {
      float alpha = attrFloat(node, "alpha", op == "Elu" ? 1.0f : 1.67326319217681884765625f);
      y = nn::WhereOp::create(b, loc, xt, cmp("gt", 0.0f), x, negBranch(alpha, 1.0f));
      if (op == "Selu")
        y = mul(y, scalarF32(attrFloat(node, "gamma", 1.05070102214813232421875f)));
    } else if (op == "Celu") {
      float alpha = attrFloat(node, "alpha", 1.0f);
      if (alpha == 0.0f)
        return fail(where + ": alpha must not be 0");
      y = add(nn::ReluOp::create(b, loc, x), negBranch(alpha, alpha));
    } else if (op == "Softplus") {
      // log(1 + exp(x)), never overflowing: x + log(1 + exp(-x)) for x > 0,
      // log(1 + exp(x)) otherwise, each branch fed only the values it is
      // taken for (max / min with 0), so the dropped one stays finite. Its
      // derivative at 0 is the else branch's, sigmoid(0) = 1/2 (Min sends a
      // tie to X); relu(x) + log(1 + exp(-|x|)) gave 0 there.
      Value pos = nn::MaxOp::create(b, loc, xt, x, scalarF32(0.0f));
      Value neg = nn::MinOp::create(b, loc, xt, x, scalarF32(0.0f));
      auto log1pExp = [&](Value t) -> Value {
        return nn::LogOp::create(b, loc, add(nn::ExpOp::create(b, loc, t), scalarF32(1.0f)));
      };
      y = nn::WhereOp::create(b, loc, xt, cmp("gt", 0.0f),
                              add(pos, log1pExp(nn::NegOp::create(b, loc, pos))),
                              log1pExp(neg));
    } else if (op == "Softsign") {
      Value d = add(nn::AbsOp::create(b, loc, x), scalarF32(1.0f));
      y = nn::DivOp::create(b, loc, xt, x, d);
    } else if (op == "ThresholdedRelu") {
      Value keep = nn::CastOp::create(b, loc, RankedTensorType::get(xt.getShape(), b.getF32Type()),
                                      cmp("gt", attrFloat(node, "alpha", 1.0f)));
      y = mul(x, keep);
    } else { // Sign: 1, 0, -1 (no gradient, as its derivative is 0)
      auto f32t = RankedTensorType::get(xt.getShape(), b.getF32Type());
      y = nn::SubOp::create(b, loc, xt, nn::CastOp::create(b, loc, f32t, cmp("gt", 0.0f)),
                            nn::CastOp::create(b, loc, f32t, cmp("lt", 0.0f)));
    }
    return out0(y);
  }
  // Trilu: a constant lower or upper triangle mask over the last two
  // dimensions (static shapes).
  if (op == "Trilu") {
    Value x = in(0);
    if (!x)
      return false;
    auto xt = rtype(x);
    if (xt.getRank() < 2)
      return fail(where + ": the input needs at least 2 dimensions");
    int64_t k = 0;
    if (node.input_size() > 1 && !node.input(1).empty()) {
      std::vector<int64_t> kv;
      if (!constantInts(node.input(1), kv) || kv.size() != 1)
        return fail(where + ": k must be a constant scalar");
      k = kv[0];
    }
    bool upper = attrInt(node, "upper", 1) != 0;
    int64_t rows = xt.getDimSize(xt.getRank() - 2), cols = xt.getDimSize(xt.getRank() - 1);
    std::vector<float> mask(size_t(rows * cols));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        mask[size_t(i * cols + j)] = (upper ? j - i >= k : j - i <= k) ? 1.0f : 0.0f;
    if (xt.getElementType().isInteger(64)) {
      // Integer masks (run-time ids, booleans): select against 0.
      std::vector<int64_t> keep(mask.begin(), mask.end());
      auto mt = RankedTensorType::get({rows, cols}, b.getI64Type());
      Value m = nn::ConstantOp::create(
          b, loc, cast<ElementsAttr>(DenseElementsAttr::get(mt, ArrayRef<int64_t>(keep))));
      auto zt = RankedTensorType::get({}, b.getI64Type());
      Value zero = nn::ConstantOp::create(
          b, loc, cast<ElementsAttr>(DenseElementsAttr::get(zt, int64_t(0))));
      return out0(nn::WhereOp::create(b, loc, rt0, m, x, zero));
    }
    auto mt = RankedTensorType::get({rows, cols}, b.getF32Type());
    Value m = nn::ConstantOp::create(
        b, loc, cast<ElementsAttr>(DenseElementsAttr::get(mt, ArrayRef<float>(mask))));
    return out0(nn::MulOp::create(b, loc, rt0, x, m));
  }
  // Tile: a view with a unit dimension before each, an Expand to the
  // repeat counts there, and a view back.
  if (op == "Tile") {
    Value x = in(0);
    if (!x)
      return false;
    std::vector<int64_t> repeats;
    if (node.input_size() < 2 || !constantInts(node.input(1), repeats))
      return fail(where + ": repeats must be a constant int64 tensor");
    auto xt = rtype(x);
    if (int64_t(repeats.size()) != xt.getRank())
      return fail(where + ": repeats needs one entry per dimension");
    SmallVector<int64_t> split, tiled;
    for (int64_t d = 0; d < xt.getRank(); ++d) {
      if (repeats[d] < 1)
        return fail(where + ": repeats must be positive");
      split.append({1, xt.getDimSize(d)});
      tiled.append({repeats[d], xt.getDimSize(d)});
    }
    Value y = nn::ReshapeOp::create(b, loc, RankedTensorType::get(split, b.getF32Type()), x);
    y = nn::ExpandOp::create(b, loc, RankedTensorType::get(tiled, b.getF32Type()), y);
    return out0(nn::ReshapeOp::create(b, loc, rt0, y));
  }
  if (op == "Dropout") {
    Value x = in(0);
    if (!x)
      return false;
    bool training = false;
    if (node.input_size() > 2 && !node.input(2).empty()) {
      auto mode = constOf(node.input(2));
      if (!mode || mode->numel() != 1)
        return fail(where + ": training_mode must be a constant");
      training = mode->integer(0) != 0;
    }
    if (!training) {
      if (node.output_size() > 1 && !node.output(1).empty())
        return fail(where + ": the mask output of an inference-mode Dropout "
                            "is not supported");
      return out0(nn::IdentityOp::create(b, loc, x));
    }
    auto ratio = inputConstFloat(1, 0.5f);
    if (!ratio || *ratio < 0 || *ratio >= 1)
      return fail(where + ": ratio must be a constant in [0, 1)");
    if (node.output_size() > 1 && !node.output(1).empty())
      return fail(where + ": the Dropout mask output is not supported");
    // The runtime's per-microbatch random state, one model argument shared
    // by every dropout layer (salted by the node index).
    if (!rngArg) {
      unsigned idx = mainFn.getNumArguments();
      auto rngType = RankedTensorType::get({2}, b.getI64Type());
      if (failed(mainFn.insertArgument(
              idx, rngType,
              b.getDictionaryAttr({b.getNamedAttr("pipec.rng", b.getUnitAttr())}),
              mainFn.getLoc())))
        return fail(where + ": internal error adding the random state");
      rngArg = mainFn.getArgument(idx);
    }
    auto drop = nn::DropoutOp::create(b, loc, rt0, rt0, x, rngArg, f32(*ratio),
                                      b.getI64IntegerAttr(index));
    return out0(drop.getOutput());
  }

  // Data movement.
  if (op == "Squeeze" || op == "Unsqueeze") {
    Value x = in(0);
    return x && out0(nn::ReshapeOp::create(b, loc, rt0, x));
  }
  if (op == "Expand") {
    Value x = in(0);
    return x && out0(nn::ExpandOp::create(b, loc, rt0, x));
  }
  if (op == "Gather") {
    Value data = in(0), idx = in(1);
    if (!data || !idx)
      return false;
    if (!rtype(idx).getElementType().isInteger(64))
      return fail(where + ": indices must be int64");
    return out0(nn::GatherOp::create(b, loc, rt0, data, idx,
                                     b.getI64IntegerAttr(attrInt(node, "axis", 0))));
  }
  if (op == "Concat") {
    SmallVector<Value> inputs;
    for (int i = 0; i < node.input_size(); ++i) {
      Value v = in(i);
      if (!v)
        return false;
      inputs.push_back(v);
    }
    return out0(nn::ConcatOp::create(b, loc, rt0, inputs,
                                     b.getI64IntegerAttr(attrInt(node, "axis", 0))));
  }
  if (op == "Split" || op == "Slice") {
    Value x = in(0);
    if (!x)
      return false;
    auto xt = rtype(x);
    int64_t rank = xt.getRank();
    if (op == "Split") {
      int64_t axis = attrInt(node, "axis", 0);
      if (axis < 0)
        axis += rank;
      if (axis < 0 || axis >= rank)
        return fail(where + ": axis is out of range for rank " +
                    std::to_string(rank));
      int64_t offset = 0;
      for (int k = 0; k < node.output_size(); ++k) {
        if (!resultTypes[k])
          return fail(where + ": every output of Split must be named");
        auto t = cast<RankedTensorType>(resultTypes[k]);
        if (t.getRank() != rank || offset + t.getDimSize(axis) > xt.getDimSize(axis))
          return fail(where + ": output shapes do not partition the input");
        SmallVector<int64_t> starts(rank, 0), steps(rank, 1);
        starts[axis] = offset;
        values[node.output(k)] =
            nn::SliceOp::create(b, loc, t, x, i64s(starts), i64s(steps));
        offset += t.getDimSize(axis);
      }
      return true;
    }
    std::vector<int64_t> starts, ends, axes, steps;
    if (!constantInts(node.input(1), starts) || !constantInts(node.input(2), ends))
      return fail(where + ": starts and ends must be constant");
    if (node.input_size() > 3 && !node.input(3).empty()) {
      if (!constantInts(node.input(3), axes))
        return fail(where + ": axes must be constant");
    } else {
      for (size_t i = 0; i < starts.size(); ++i)
        axes.push_back(i);
    }
    if (node.input_size() > 4 && !node.input(4).empty()) {
      if (!constantInts(node.input(4), steps))
        return fail(where + ": steps must be constant");
    } else {
      steps.assign(starts.size(), 1);
    }
    SmallVector<int64_t> st(rank, 0), sp(rank, 1);
    if (starts.size() != ends.size() || axes.size() != starts.size() ||
        steps.size() != starts.size())
      return fail(where + ": starts, ends, axes and steps must have one entry "
                          "per sliced axis");
    for (size_t k = 0; k < axes.size(); ++k) {
      int64_t a = axes[k] < 0 ? axes[k] + rank : axes[k];
      if (a < 0 || a >= rank || steps[k] == 0)
        return fail(where + ": axis " + std::to_string(axes[k]) +
                    " is out of range or a step is 0");
      int64_t n = xt.getDimSize(a), s0 = starts[k];
      if (s0 < 0)
        s0 += n;
      s0 = steps[k] > 0 ? std::clamp<int64_t>(s0, 0, n)
                        : std::clamp<int64_t>(s0, 0, n - 1);
      st[a] = s0;
      sp[a] = steps[k];
    }
    return out0(nn::SliceOp::create(b, loc, rt0, x, i64s(st), i64s(sp)));
  }

  // Convolution and pooling.
  if (op == "Conv" || op == "MaxPool" || op == "AveragePool") {
    Value x = in(0);
    if (!x)
      return false;
    auto xt = rtype(x);
    bool oneD = xt.getRank() == 3;
    if (xt.getRank() != 4 && !oneD)
      return fail(where + ": only 1-D and 2-D " + op + " are supported (input "
                          "rank " + std::to_string(xt.getRank()) + ")");
    auto as2d = [&](std::vector<int64_t> v, int64_t fill) {
      if (oneD)
        v.insert(v.begin(), fill);
      return v;
    };
    SmallVector<int64_t> x4(xt.getShape());
    if (oneD)
      x4.insert(x4.begin() + 2, 1);
    Value w;
    std::vector<int64_t> kernel;
    if (op == "Conv") {
      w = in(1);
      if (!w)
        return false;
      auto wt = rtype(w);
      if (wt.getRank() != xt.getRank())
        return fail(where + ": the weight must have the input's rank " +
                    std::to_string(xt.getRank()));
      kernel.assign(wt.getShape().begin() + 2, wt.getShape().end());
    } else {
      kernel = attrInts(node, "kernel_shape");
    }
    kernel = as2d(kernel, 1);
    std::vector<int64_t> strides = as2d(attrInts(node, "strides", oneD ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 1}), 1);
    std::vector<int64_t> dilations = as2d(attrInts(node, "dilations", oneD ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 1}), 1);
    if (oneD) {
      std::vector<int64_t> p = attrInts(node, "pads", {0, 0});
      if (attrString(node, "auto_pad", "NOTSET") == "NOTSET" && p.size() != 2)
        return fail(where + ": pads must have 2 entries");
    }
    if (kernel.size() != 2 || strides.size() != 2 || dilations.size() != 2)
      return fail(where + ": kernel_shape, strides and dilations must have " +
                  (oneD ? "1 entry" : "2 entries") + " each");
    for (int64_t v : {kernel[0], kernel[1], strides[0], strides[1],
                      dilations[0], dilations[1]})
      if (v < 1)
        return fail(where + ": kernel sizes, strides and dilations must be "
                            "positive");
    std::string why;
    std::vector<int64_t> pads;
    if (oneD && attrString(node, "auto_pad", "NOTSET") == "NOTSET") {
      std::vector<int64_t> p = attrInts(node, "pads", {0, 0});
      pads = {0, p[0], 0, p[1]};
    } else {
      pads = windowPads(node, ArrayRef<int64_t>(x4).drop_front(2), kernel,
                        strides, dilations, why);
    }
    if (pads.empty())
      return fail(where + ": " + why);
    // Work in 2-D; 1-D inputs get a unit height.
    auto f32t = b.getF32Type();
    Value x2 = oneD ? nn::ReshapeOp::create(b, loc, RankedTensorType::get(x4, f32t), x).getResult() : x;
    auto rt = cast<RankedTensorType>(rt0);
    SmallVector<int64_t> y4(rt.getShape());
    if (oneD)
      y4.insert(y4.begin() + 2, 1);
    auto y4t = RankedTensorType::get(y4, f32t);
    Value y;
    if (op == "Conv") {
      Value w2 = w;
      if (oneD) {
        SmallVector<int64_t> ws(rtype(w).getShape());
        ws.insert(ws.begin() + 2, 1);
        w2 = nn::ReshapeOp::create(b, loc, RankedTensorType::get(ws, f32t), w);
      }
      Value bias = in(2);
      if (!error.empty())
        return false;
      y = nn::ConvOp::create(b, loc, y4t, x2, w2, bias, i64s(strides), i64s(pads),
                             i64s(dilations),
                             b.getI64IntegerAttr(attrInt(node, "group", 1)));
    } else if (op == "MaxPool") {
      if (attrInt(node, "storage_order", 0) != 0)
        return fail(where + ": storage_order 1 is not supported");
      if (node.output_size() > 1 && !node.output(1).empty())
        return fail(where + ": the Indices output of MaxPool is not supported");
      auto idxT = RankedTensorType::get(y4, b.getI64Type());
      y = nn::MaxPoolOp::create(b, loc, y4t, idxT, x2, i64s(kernel), i64s(strides),
                                i64s(pads), i64s(dilations))
              .getOutput();
    } else {
      y = nn::AveragePoolOp::create(
          b, loc, y4t, x2, i64s(kernel), i64s(strides), i64s(pads),
          attrInt(node, "count_include_pad", 0) ? b.getUnitAttr() : UnitAttr());
    }
    if (oneD)
      y = nn::ReshapeOp::create(b, loc, rt0, y);
    return out0(y);
  }
  // ConvTranspose is the input gradient of the convolution it transposes:
  // a Conv from an input of the result's shape to one of x's, with the
  // same weight [C_in, C_out/group, kH, kW], strides, dilations and
  // leading pads (output_padding and the trailing pads are whatever the
  // result shape ONNX inferred implies).
  if (op == "ConvTranspose") {
    Value x = in(0), w = in(1);
    if (!x || !w)
      return false;
    auto xt = rtype(x), wt = rtype(w);
    const bool oneD = xt.getRank() == 3;
    if ((xt.getRank() != 4 && !oneD) || wt.getRank() != xt.getRank())
      return fail(where + ": only 1-D and 2-D ConvTranspose are supported "
                          "(input rank " + std::to_string(xt.getRank()) + ")");
    const int64_t spatial = oneD ? 1 : 2;
    auto ints = [&](const char *name, int64_t dflt) {
      std::vector<int64_t> v = attrInts(node, name, {});
      if (v.empty())
        v.assign(size_t(spatial), dflt);
      if (oneD && v.size() == 1)
        v.insert(v.begin(), dflt);
      return v;
    };
    std::vector<int64_t> strides = ints("strides", 1),
                         dilations = ints("dilations", 1),
                         outPad = ints("output_padding", 0);
    std::vector<int64_t> kernel(wt.getShape().begin() + 2, wt.getShape().end());
    if (oneD)
      kernel.insert(kernel.begin(), 1);
    if (strides.size() != 2 || dilations.size() != 2 || outPad.size() != 2)
      return fail(where + ": strides, dilations and output_padding need one "
                          "entry per spatial dimension");
    for (int d = 0; d < 2; ++d)
      if (strides[d] < 1 || dilations[d] < 1 || outPad[d] < 0 ||
          outPad[d] >= std::max(strides[d], dilations[d]))
        return fail(where + ": strides and dilations must be positive and "
                            "output_padding below the stride or dilation");
    const int64_t group = attrInt(node, "group", 1);
    auto f32t = b.getF32Type();
    SmallVector<int64_t> x4(xt.getShape()), y4(cast<RankedTensorType>(rt0).getShape());
    if (oneD) {
      x4.insert(x4.begin() + 2, 1);
      y4.insert(y4.begin() + 2, 1);
    }
    // Leading pads: explicit, or from the total padding the output shape
    // implies (auto_pad SAME_*, output_shape).
    std::string autoPad = attrString(node, "auto_pad", "NOTSET");
    std::vector<int64_t> pads(4, 0);
    bool fromShape = findAttr(node, "output_shape") != nullptr ||
                     autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER";
    if (fromShape) {
      for (int d = 0; d < 2; ++d) {
        int64_t total = strides[d] * (x4[d + 2] - 1) + outPad[d] +
                        (kernel[d] - 1) * dilations[d] + 1 - y4[d + 2];
        if (total < 0)
          return fail(where + ": output_shape is larger than the kernel, "
                              "strides and output_padding can produce");
        pads[d] = autoPad == "SAME_UPPER" ? total / 2 : total - total / 2;
      }
    } else if (autoPad == "NOTSET") {
      std::vector<int64_t> p = attrInts(node, "pads", {});
      if (p.empty())
        p.assign(size_t(2 * spatial), 0);
      if (p.size() != size_t(2 * spatial))
        return fail(where + ": pads must have " + std::to_string(2 * spatial) +
                    " entries");
      pads = oneD ? std::vector<int64_t>{0, p[0], 0, p[1]} : p;
    } else if (autoPad != "VALID") {
      return fail(where + ": auto_pad '" + autoPad + "' is not supported");
    }
    if (x4[1] != wt.getDimSize(0) || group < 1 || x4[1] % group != 0 ||
        y4[1] != wt.getDimSize(1) * group)
      return fail(where + ": the weight's shape does not match the channels "
                          "and group");
    // Trailing pads: the rest of the total padding the shapes imply
    // (output_padding included), so that the transposed convolution's
    // window arithmetic maps the result's size back to x's.
    for (int d = 0; d < 2; ++d) {
      int64_t total = strides[d] * (x4[d + 2] - 1) + outPad[d] +
                      (kernel[d] - 1) * dilations[d] + 1 - y4[d + 2];
      pads[d + 2] = total - pads[d];
      if (pads[d] < 0 || pads[d + 2] < 0)
        return fail(where + ": pads and output shape do not fit the kernel, "
                            "strides and output_padding");
    }
    Value x2 = oneD ? nn::ReshapeOp::create(b, loc, RankedTensorType::get(x4, f32t), x).getResult() : x;
    Value w2 = w;
    if (oneD) {
      SmallVector<int64_t> ws(wt.getShape());
      ws.insert(ws.begin() + 2, 1);
      w2 = nn::ReshapeOp::create(b, loc, RankedTensorType::get(ws, f32t), w);
    }
    Value y = nn::ConvGradInputOp::create(
        b, loc, RankedTensorType::get(y4, f32t), x2, w2, i64s(strides),
        i64s(pads), i64s(dilations), b.getI64IntegerAttr(group));
    if (Value bias = in(2)) {
      auto bt = RankedTensorType::get({y4[1], 1, 1}, f32t);
      y = nn::AddOp::create(b, loc, y.getType(), y,
                            nn::ReshapeOp::create(b, loc, bt, bias));
    } else if (!error.empty()) {
      return false;
    }
    if (oneD)
      y = nn::ReshapeOp::create(b, loc, rt0, y);
    return out0(y);
  }
  // Resize / Upsample in nearest mode by whole factors: every element
  // repeated s_d times along dimension d, i.e. a view with a unit
  // dimension after each, an Expand to s_d there, and a view back.
  if (op == "Resize" || op == "Upsample") {
    Value x = in(0);
    if (!x)
      return false;
    auto xt = rtype(x);
    auto yt = cast<RankedTensorType>(rt0);
    std::string mode = attrString(node, "mode", "nearest");
    std::string coord = attrString(node, "coordinate_transformation_mode",
                                   op == "Upsample" ? "asymmetric" : "half_pixel");
    std::string nearest = attrString(node, "nearest_mode",
                                     op == "Upsample" ? "floor"
                                                      : "round_prefer_floor");
    if (mode == "linear") {
      // Bilinear over H and W of NCHW (F.interpolate(mode="bilinear")).
      if (xt.getRank() != 4 || yt.getDimSize(0) != xt.getDimSize(0) ||
          yt.getDimSize(1) != xt.getDimSize(1))
        return fail(where + ": linear mode resizes H and W of a 4-D NCHW "
                            "tensor only");
      if (coord != "half_pixel" && coord != "pytorch_half_pixel" &&
          coord != "align_corners" && coord != "asymmetric")
        return fail(where + ": coordinate_transformation_mode '" + coord +
                    "' is not supported in linear mode");
      // ONNX's scales when given (they may differ from out/in after the
      // floor), else out/in.
      SmallVector<double> scales = {
          double(yt.getDimSize(2)) / double(xt.getDimSize(2)),
          double(yt.getDimSize(3)) / double(xt.getDimSize(3))};
      int scalesInput = op == "Upsample" ? 1 : 2;
      if (node.input_size() > scalesInput && !node.input(scalesInput).empty()) {
        auto c = constOf(node.input(scalesInput));
        if (c && c->numel() == 4) {
          scales = {c->real(2), c->real(3)};
        } else if (!c || c->numel() != 0) {
          return fail(where + ": scales must be a constant of 4 values");
        }
      }
      return out0(nn::ResizeLinearOp::create(
          b, loc, rt0, x, b.getStringAttr(coord),
          b.getDenseF64ArrayAttr(scales)));
    }
    if (mode != "nearest")
      return fail(where + ": mode '" + mode + "' is not supported (nearest "
                          "by whole factors, or linear)");
    bool exact = (coord == "asymmetric" && nearest == "floor") ||
                 ((coord == "half_pixel" || coord == "pytorch_half_pixel") &&
                  (nearest == "round_prefer_floor" ||
                   nearest == "round_prefer_ceil"));
    SmallVector<int64_t> split, repeated;
    bool whole = yt.getRank() == xt.getRank(), identity = whole;
    for (int64_t d = 0; whole && d < xt.getRank(); ++d) {
      int64_t in = xt.getDimSize(d), out = yt.getDimSize(d);
      whole = in > 0 && out % in == 0;
      identity &= out == in;
      split.append({in, 1});
      repeated.append({in, whole ? out / in : 1});
    }
    // Factors of 1 map every index to itself under any mode.
    exact |= identity;
    if (!whole)
      return fail(where + ": only whole upsampling factors are supported "
                          "(output " + dimsString(std::vector<int64_t>(yt.getShape().begin(), yt.getShape().end())) +
                  " from " + dimsString(std::vector<int64_t>(xt.getShape().begin(), xt.getShape().end())) + ")");
    if (!exact)
      return fail(where + ": coordinate_transformation_mode '" + coord +
                  "' with nearest_mode '" + nearest + "' is not supported "
                  "(asymmetric + floor, or half_pixel/pytorch_half_pixel + "
                  "round_prefer_floor/ceil, which repeat each element)");
    Value y = nn::ReshapeOp::create(b, loc, RankedTensorType::get(split, b.getF32Type()), x);
    y = nn::ExpandOp::create(b, loc, RankedTensorType::get(repeated, b.getF32Type()), y);
    return out0(nn::ReshapeOp::create(b, loc, rt0, y));
  }
  if (op == "GlobalAveragePool") {
    Value x = in(0);
    if (!x)
      return false;
    if (rtype(x).getRank() < 3)
      return fail(where + ": the input must be [N, C, spatial...]");
    int64_t spatial = 1;
    for (int64_t d : rtype(x).getShape().drop_front(2))
      spatial *= d;
    if (spatial == 0)
      return fail(where + ": empty spatial dimensions");
    return out0(nn::SumToShapeOp::create(b, loc, rt0, x,
                                         b.getF64FloatAttr(1.0 / spatial)));
  }

  // Normalization.
  if (op == "BatchNormalization") {
    Value x = in(0), scale = in(1), bias = in(2), mean = in(3), var = in(4);
    if (!x || !scale || !bias || !mean || !var)
      return false;
    float eps = attrFloat(node, "epsilon", 1e-5f);
    bool training = attrInt(node, "training_mode", 0) != 0 ||
                    (node.output_size() > 1 && !node.output(1).empty());
    if (!training)
      return out0(nn::BatchNormInferenceOp::create(b, loc, rt0, x, scale, bias,
                                                   mean, var, f32(eps)));
    auto vec = scale.getType();
    auto bn = nn::BatchNormOp::create(b, loc, rt0, vec, vec, vec, vec, x, scale,
                                      bias, mean, var, f32(eps),
                                      f32(attrFloat(node, "momentum", 0.9f)));
    // The running statistics live in their globals: store the update.
    for (auto [stat, v] : {std::pair<Value, Value>{mean, bn.getNewRunningMean()},
                           std::pair<Value, Value>{var, bn.getNewRunningVar()}})
      if (auto load = stat.getDefiningOp<ml_program::GlobalLoadOp>())
        ml_program::GlobalStoreOp::create(b, loc, load.getGlobalAttr(), v);
    if (node.output_size() > 1 && !node.output(1).empty())
      values[node.output(1)] = bn.getNewRunningMean();
    if (node.output_size() > 2 && !node.output(2).empty())
      values[node.output(2)] = bn.getNewRunningVar();
    return out0(bn.getOutput());
  }
  if (op == "LayerNormalization") {
    Value x = in(0), scale = in(1);
    if (!x || !scale)
      return false;
    Value bias = in(2);
    if (!error.empty())
      return false;
    auto xt = rtype(x);
    int64_t axis = attrInt(node, "axis", -1);
    if (axis < 0)
      axis += xt.getRank();
    if (axis < 0 || axis >= xt.getRank())
      return fail(where + ": axis " + std::to_string(attrInt(node, "axis", -1)) +
                  " is out of range for rank " + std::to_string(xt.getRank()));
    int64_t outer = 1;
    for (int64_t i = 0; i < axis; ++i)
      outer *= xt.getDimSize(i);
    auto stat = RankedTensorType::get({outer}, b.getF32Type());
    auto ln = nn::LayerNormOp::create(b, loc, rt0, stat, stat, x, scale, bias,
                                      b.getI64IntegerAttr(axis),
                                      f32(attrFloat(node, "epsilon", 1e-5f)));
    for (int k = 1; k < 3 && k < node.output_size(); ++k)
      if (!node.output(k).empty())
        values[node.output(k)] = nn::ReshapeOp::create(
            b, loc, resultTypes[k], k == 1 ? ln.getMean() : ln.getInvStd());
    return out0(ln.getOutput());
  }

  // Reductions: a sum onto the kept-dims shape, then a reshape.
  if (op == "ReduceMean" || op == "ReduceSum") {
    Value x = in(0);
    if (!x)
      return false;
    auto xt = rtype(x);
    std::vector<int64_t> axes;
    if (node.input_size() > 1 && !node.input(1).empty()) {
      if (!constantInts(node.input(1), axes))
        return fail(where + ": axes must be constant");
    } else {
      axes = attrInts(node, "axes");
    }
    if (axes.empty() && attrInt(node, "noop_with_empty_axes", 0))
      return out0(nn::IdentityOp::create(b, loc, x));
    SmallVector<int64_t> kept(xt.getShape());
    int64_t count = 1;
    for (int64_t d = 0; d < xt.getRank(); ++d) {
      bool reduced = axes.empty();
      for (int64_t a : axes)
        reduced |= (a < 0 ? a + xt.getRank() : a) == d;
      if (reduced) {
        count *= kept[d];
        kept[d] = 1;
      }
    }
    double scale = op == "ReduceMean" ? 1.0 / count : 1.0;
    auto keptT = RankedTensorType::get(kept, b.getF32Type());
    Value sum = nn::SumToShapeOp::create(b, loc, keptT, x, b.getF64FloatAttr(scale));
    if (keptT != rt0)
      sum = nn::ReshapeOp::create(b, loc, rt0, sum);
    return out0(sum);
  }
  handled = false;
  return true;
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
    return fail("internal error: the imported module does not verify");
  return true;
}

static void fuseErfGelu(ModuleOp module);

OwningOpRef<ModuleOp> Importer::run() {
  ctx.loadDialect<nn::NNDialect, func::FuncDialect,
                  ml_program::MLProgramDialect>();
  // Structure, operators and the checker come before the version
  // converter: libonnx's converter crashes on malformed graphs (found by
  // scripts/fuzz-importer.sh).
  if (!load() || !separateInitializers() || !checkStructure() ||
      !checkSupported() || !check() || !upgradeOpset() || !check() ||
      !specialiseAndInfer() || !emit()) {
    if (module)
      module->erase();
    return nullptr;
  }
  fuseErfGelu(module);
  return OwningOpRef<ModuleOp>(module);
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
  // Constants left without users.
  SmallVector<Operation *> unused;
  module.walk([&](nn::ConstantOp c) {
    if (c->use_empty())
      unused.push_back(c);
  });
  for (Operation *op : unused)
    op->erase();
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
