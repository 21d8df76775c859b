//===- pipec-conformance.cpp - ONNX operator test data runner -------------===//
//
//   pipec-conformance [--verbose] [--filter SUBSTRING] [--gradients]
//                     [--expect-supported N] [DIR...]
//
// For every test case folder (model.onnx + test_data_set_*/input_*.pb,
// output_*.pb) under the given folders (default: ONNX's node,
// pytorch-converted and pytorch-operator suites from libonnx-testdata):
// imports the model with the real importer, runs it with the runtime's CPU
// kernels (lib/Exec) and compares every output with ONNX's tolerance
// (|got - want| <= 1e-5 + 1e-3 |want|). A case the importer refuses is
// "unsupported" and listed with the reason; an imported case must pass.
// Prints `N passed, N failed` last; exits non-zero on any failure.
//
// --gradients also checks every supported case's backward: the VJPs of its
// ops in float64 mode against central finite differences on the case's
// first data set (GradientCheck.cpp); a wrong gradient fails the case.
// --expect-supported N fails the run unless exactly N cases are supported,
// so that an operator silently turning unsupported is noticed.
//
// Known defects of the test data itself are corrected, not skipped: where
// ONNX's generator computed the expected outputs with an attribute value it
// did not store in the node, the runner sets that value on the node (listed
// in kTestDataFixes, printed when used) so the case still checks the kernel.
//
//===----------------------------------------------------------------------===//
#include "GradientCheck.h"
#include "pipec/Exec.h"
#include "pipec/Import.h"

#include "mlir/IR/MLIRContext.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

namespace fs = std::filesystem;
using namespace pipec;

/// Attribute values ONNX's test generators used but did not write into the
/// model (the schema default then differs from the data).
struct TestDataFix {
  const char *testCase, *opType, *attribute;
  float value;
  const char *why;
};
static const TestDataFix kTestDataFixes[] = {
    {"test_adam_multiple", "Adam", "epsilon", 1e-2f,
     "onnx/backend/test/case/node/adam.py computes the outputs with "
     "epsilon=1e-2 but omits the attribute (schema default 1e-6)"},
};

/// Imports `dir`/model.onnx, applying any kTestDataFixes entry.
static mlir::OwningOpRef<mlir::ModuleOp>
importCase(mlir::MLIRContext &ctx, const fs::path &dir, std::string &error,
           std::vector<std::string> &applied) {
  std::string model = (dir / "model.onnx").string();
  for (const TestDataFix &fix : kTestDataFixes) {
    if (dir.filename() != fix.testCase)
      continue;
    onnx::ModelProto proto;
    std::ifstream in(model, std::ios::binary);
    if (!in || !proto.ParseFromIstream(&in))
      break;
    for (auto &node : *proto.mutable_graph()->mutable_node())
      if (node.op_type() == fix.opType) {
        auto *attr = node.add_attribute();
        attr->set_name(fix.attribute);
        attr->set_type(onnx::AttributeProto::FLOAT);
        attr->set_f(fix.value);
      }
    fs::path fixed = fs::temp_directory_path() /
                     (std::string("pipec-conformance-") + fix.testCase + ".onnx");
    std::ofstream out(fixed, std::ios::binary);
    proto.SerializeToOstream(&out);
    out.close();
    applied.push_back(std::string(fix.testCase) + ": " + fix.attribute + "=" +
                      std::to_string(fix.value) + " (" + fix.why + ")");
    auto module = importOnnxFile(ctx, fixed.string(), {}, error);
    fs::remove(fixed);
    return module;
  }
  return importOnnxFile(ctx, model, {}, error);
}

/// The case's model with every integer graph input, and every input used
/// only as a shape argument (a Resize's scales, say), bound to data set
/// `set`'s value (as an initializer): pipec compiles static shapes, so a
/// Reshape target, Pad widths or Slice bounds that a test feeds as an input
/// are constants of the program, one program per data set. Returns the
/// model's bytes and, in `bound`, which inputs (by position among the
/// graph inputs) were bound; empty when the case has no integer input.
static std::string bindIntegerInputs(const fs::path &dir, const fs::path &set,
                                     std::vector<bool> &bound) {
  onnx::ModelProto proto;
  std::ifstream in(dir / "model.onnx", std::ios::binary);
  if (!in || !proto.ParseFromIstream(&in))
    return "";
  auto *graph = proto.mutable_graph();
  std::set<std::string> inits;
  for (const auto &t : graph->initializer())
    inits.insert(t.name());
  std::vector<fs::path> files;
  for (const auto &e : fs::directory_iterator(set)) {
    std::string name = e.path().filename().string();
    if (name.rfind("input_", 0) == 0)
      files.push_back(e.path());
  }
  std::sort(files.begin(), files.end(), [](const fs::path &a, const fs::path &b) {
    return std::atoi(a.filename().c_str() + 6) < std::atoi(b.filename().c_str() + 6);
  });
  // Operand positions that pipec needs as compile-time constants (shapes,
  // bounds, scales): an input used only there is bound whatever its type.
  static const std::map<std::string, std::set<int>> kShapeArgs = {
      {"Reshape", {1}}, {"Expand", {1}}, {"Pad", {1, 2}},
      {"Slice", {1, 2, 3, 4}}, {"Resize", {1, 2, 3}}, {"Upsample", {1}},
      {"Tile", {1}}, {"Squeeze", {1}}, {"Unsqueeze", {1}}, {"Split", {1}},
      {"ReduceSum", {1}}, {"ReduceMean", {1}}, {"Clip", {1, 2}},
      {"ConstantOfShape", {0}}, {"Range", {0, 1, 2}}, {"Trilu", {1}}};
  std::map<std::string, bool> onlyShapeArgs;
  for (const auto &node : graph->node())
    for (int i = 0; i < node.input_size(); ++i) {
      auto it = kShapeArgs.find(node.op_type());
      bool shapeArg = it != kShapeArgs.end() && it->second.count(i);
      auto [pos, first] = onlyShapeArgs.try_emplace(node.input(i), shapeArg);
      if (!first)
        pos->second = pos->second && shapeArg;
    }
  bound.clear();
  bool any = false;
  size_t k = 0;
  google::protobuf::RepeatedPtrField<onnx::ValueInfoProto> kept;
  for (const auto &input : graph->input()) {
    if (inits.count(input.name())) {
      *kept.Add() = input;
      continue;
    }
    int32_t type = input.type().tensor_type().elem_type();
    bool integer = type == onnx::TensorProto::INT64 || type == onnx::TensorProto::INT32;
    auto use = onlyShapeArgs.find(input.name());
    bool shapeArg = use != onlyShapeArgs.end() && use->second;
    bound.push_back(false);
    if ((integer || shapeArg) && k < files.size()) {
      onnx::TensorProto t;
      std::ifstream tin(files[k], std::ios::binary);
      if (tin && t.ParseFromIstream(&tin)) {
        t.set_name(input.name());
        *graph->add_initializer() = std::move(t);
        bound.back() = any = true;
        ++k;
        continue;
      }
    }
    *kept.Add() = input;
    ++k;
  }
  if (!any)
    return "";
  graph->mutable_input()->Swap(&kept);
  return proto.SerializeAsString();
}

static bool readTensor(const fs::path &path, HostTensor &out, std::string &error) {
  std::ifstream in(path, std::ios::binary);
  onnx::TensorProto t;
  if (!in || !t.ParseFromIstream(&in)) {
    error = "cannot parse " + path.string();
    return false;
  }
  out.shape.assign(t.dims().begin(), t.dims().end());
  int64_t n = out.numel();
  switch (t.data_type()) {
  case onnx::TensorProto::FLOAT: {
    out.isFloat = true;
    std::vector<float> v;
    if (t.has_raw_data()) {
      v.resize(t.raw_data().size() / 4);
      std::memcpy(v.data(), t.raw_data().data(), v.size() * 4);
    } else {
      v.assign(t.float_data().begin(), t.float_data().end());
    }
    if ((int64_t)v.size() != n)
      break;
    out.bytes.resize(n * 4);
    std::memcpy(out.bytes.data(), v.data(), n * 4);
    return true;
  }
  case onnx::TensorProto::INT64:
  case onnx::TensorProto::INT32: {
    out.isFloat = false;
    std::vector<int64_t> v;
    bool is64 = t.data_type() == onnx::TensorProto::INT64;
    if (t.has_raw_data()) {
      size_t w = is64 ? 8 : 4;
      v.resize(t.raw_data().size() / w);
      for (size_t i = 0; i < v.size(); ++i) {
        if (is64) {
          std::memcpy(&v[i], t.raw_data().data() + 8 * i, 8);
        } else {
          int32_t x;
          std::memcpy(&x, t.raw_data().data() + 4 * i, 4);
          v[i] = x;
        }
      }
    } else if (is64) {
      v.assign(t.int64_data().begin(), t.int64_data().end());
    } else {
      v.assign(t.int32_data().begin(), t.int32_data().end());
    }
    if ((int64_t)v.size() != n)
      break;
    out.bytes.resize(n * 8);
    std::memcpy(out.bytes.data(), v.data(), n * 8);
    return true;
  }
  case onnx::TensorProto::BOOL: {
    // Booleans are int64 0/1 in pipec. Raw data holds one byte each;
    // otherwise int32_data does.
    out.isFloat = false;
    std::vector<int64_t> v;
    if (t.has_raw_data())
      for (char c : t.raw_data())
        v.push_back(c != 0 ? 1 : 0);
    else
      for (int32_t x : t.int32_data())
        v.push_back(x != 0 ? 1 : 0);
    if ((int64_t)v.size() != n)
      break;
    out.bytes.resize(n * 8);
    std::memcpy(out.bytes.data(), v.data(), n * 8);
    return true;
  }
  default:
    error = path.string() + ": element type " + std::to_string(t.data_type()) +
            " is not supported";
    return false;
  }
  error = path.string() + ": element count does not match the shape";
  return false;
}

/// Compares with ONNX's backend tolerance; empty string when equal.
static std::string compare(const HostTensor &got, const HostTensor &want) {
  if (got.shape != want.shape)
    return "shape differs";
  if (got.isFloat != want.isFloat)
    return "element type differs";
  int64_t n = want.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (got.isFloat) {
      float a, b;
      std::memcpy(&a, got.bytes.data() + 4 * i, 4);
      std::memcpy(&b, want.bytes.data() + 4 * i, 4);
      if ((std::isnan(a) && std::isnan(b)) || (std::isinf(b) && a == b))
        continue; // NaN for NaN, the same infinity
      if (!(std::fabs(a - b) <= 1e-5 + 1e-3 * std::fabs(b)))
        return "element " + std::to_string(i) + ": got " + std::to_string(a) +
               ", want " + std::to_string(b);
    } else if (std::memcmp(got.bytes.data() + 8 * i, want.bytes.data() + 8 * i,
                           8)) {
      return "element " + std::to_string(i) + " differs";
    }
  }
  return "";
}

/// Sorted input_*.pb / output_*.pb of a data set folder.
static std::vector<fs::path> numbered(const fs::path &dir, const std::string &prefix) {
  std::vector<std::pair<int, fs::path>> files;
  for (const auto &e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && name.size() > 3 &&
        name.substr(name.size() - 3) == ".pb")
      files.push_back({std::atoi(name.c_str() + prefix.size()), e.path()});
  }
  std::sort(files.begin(), files.end());
  std::vector<fs::path> out;
  for (auto &f : files)
    out.push_back(f.second);
  return out;
}

/// What the run counts over all cases.
struct Totals {
  int passed = 0, failed = 0, boundCases = 0;
  int gradPassed = 0, gradFailed = 0;
  std::map<std::string, int> gradSkipped; // reason -> count
  double gradWorst = 0;
  std::vector<std::string> fixesApplied;
  std::map<std::string, std::vector<std::string>> unsupported; // reason -> cases
  /// Registered operator -> supported cases using it that passed.
  std::map<std::string, int> casesPerOp;
};

/// The operator types of a case's model (domain-qualified outside the
/// default domain, as the registry lists them).
static std::set<std::string> caseOps(const fs::path &dir) {
  std::set<std::string> ops;
  std::ifstream in(dir / "model.onnx", std::ios::binary);
  onnx::ModelProto m;
  if (!in || !m.ParseFromIstream(&in))
    return ops;
  for (const auto &n : m.graph().node())
    ops.insert(n.domain().empty() || n.domain() == "ai.onnx"
                   ? n.op_type()
                   : n.domain() + ":" + n.op_type());
  return ops;
}

/// One line per op family: the registered operators, how many have a
/// passing case in the data, and those that have none.
static void reportRegistryCoverage(const Totals &t) {
  std::map<std::string, std::vector<std::string>> byFamily, uncovered;
  for (const SupportedOperator &op : supportedOperators()) {
    std::string name = op.domain.empty() ? op.op : op.domain + ":" + op.op;
    byFamily[op.family].push_back(name);
    if (!t.casesPerOp.count(name))
      uncovered[op.family].push_back(name);
  }
  std::cout << "registered operators with a passing case (by family):\n";
  for (auto &[family, ops] : byFamily) {
    auto &none = uncovered[family];
    std::cout << "  " << family << ": " << ops.size() - none.size() << " of "
              << ops.size();
    for (size_t i = 0; i < none.size(); ++i)
      std::cout << (i ? ", " : "; none: ") << none[i];
    std::cout << "\n";
  }
}

/// --gradients on one case that passed its outputs: false (with `why`)
/// when a VJP disagrees with finite differences.
static bool checkCaseGradients(mlir::ModuleOp module,
                               const std::vector<HostTensor> &inputs,
                               const std::string &name, bool verbose,
                               Totals &t, std::string &why) {
  GradientCheck g = checkGradients(module, inputs);
  if (!g.error.empty()) {
    why = "gradient: " + g.error;
    ++t.gradFailed;
    return false;
  }
  if (!g.skipped.empty()) {
    ++t.gradSkipped[g.skipped.substr(0, g.skipped.find(" ("))];
    if (verbose)
      std::cout << "GRADIENT SKIPPED " << name << ": " << g.skipped << "\n";
    return true;
  }
  ++t.gradPassed;
  t.gradWorst = std::max(t.gradWorst, g.error64);
  return true;
}

/// Imports and runs one case folder (and with `gradients` checks its
/// backward), counting the outcome in `t`.
static void runCase(const fs::path &dir, bool verbose, bool gradients,
                    Totals &t) {
  int &passed = t.passed, &failed = t.failed, &boundCases = t.boundCases;
  auto &fixesApplied = t.fixesApplied;
  auto &unsupported = t.unsupported;
  std::string name = dir.parent_path().filename().string() + "/" +
                     dir.filename().string();
  mlir::DialectRegistry registry;
  registerImportDialects(registry);
  mlir::MLIRContext ctx(registry);
  ctx.disableMultithreading();
  std::string error;
  auto module = importCase(ctx, dir, error, fixesApplied);
  std::vector<fs::path> sets;
  for (const auto &e : fs::directory_iterator(dir))
    if (e.is_directory() &&
        e.path().filename().string().rfind("test_data_set_", 0) == 0)
      sets.push_back(e.path());
  std::sort(sets.begin(), sets.end());
  // A case whose shapes depend on integer inputs (a Reshape target, Pad
  // widths, Slice bounds fed as inputs) runs with those inputs bound per
  // data set (bindIntegerInputs).
  bool bindInputs = false;
  if (!module && !sets.empty() &&
      (error.find("not constant") != std::string::npos ||
       error.find("must be a constant") != std::string::npos ||
       error.find("dynamic shape") != std::string::npos ||
       error.find("cannot be folded") != std::string::npos)) {
    std::vector<bool> bound;
    std::string bytes = bindIntegerInputs(dir, sets.front(), bound);
    std::string boundError;
    if (!bytes.empty() && importOnnxBytes(ctx, bytes, name, {}, boundError))
      bindInputs = true;
    else if (!bytes.empty())
      error = boundError; // why the case with static shapes is refused
  }
  if (!module && !bindInputs) {
    std::string reason = error.substr(0, error.find('\n'));
    // Group by the unsupported operator names, not the paths.
    size_t colon = error.find(":\n");
    if (colon != std::string::npos) {
      reason.clear();
      std::string rest = error.substr(colon + 2);
      size_t pos = 0;
      while (pos < rest.size()) {
        size_t end = rest.find('\n', pos);
        std::string line = rest.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
        line = line.substr(line.find_first_not_of(' '));
        reason += (reason.empty() ? "unsupported: " : ", ") + line.substr(0, line.find(':'));
        if (end == std::string::npos)
          break;
        pos = end + 1;
      }
    } else if (size_t q = reason.find("' "); q != std::string::npos &&
               reason.rfind("'", 0) == 0) {
      reason = reason.substr(q + 2);
    }
    unsupported[reason].push_back(name);
    return;
  }
  if (bindInputs)
    ++boundCases;
  bool ok = true;
  std::string why;
  // The first data set's module and inputs, for --gradients.
  mlir::OwningOpRef<mlir::ModuleOp> gradModule;
  std::vector<HostTensor> gradInputs;
  for (const fs::path &set : sets) {
    // The module of this data set: the case's, or one with its integer
    // inputs bound.
    mlir::OwningOpRef<mlir::ModuleOp> boundModule;
    std::vector<bool> bound;
    if (bindInputs) {
      std::string bytes = bindIntegerInputs(dir, set, bound);
      boundModule = importOnnxBytes(ctx, bytes, name, {}, why);
      if (!boundModule) {
        ok = false;
        why = set.filename().string() + ": " + why;
        break;
      }
    }
    auto fn = (bindInputs ? *boundModule : *module)
                  .lookupSymbol<mlir::func::FuncOp>("main");
    std::vector<HostTensor> inputs, want, got;
    size_t k = 0;
    for (const fs::path &p : numbered(set, "input_")) {
      bool skip = bindInputs && k < bound.size() && bound[k];
      ++k;
      if (skip)
        continue;
      HostTensor t;
      if (!readTensor(p, t, why)) { ok = false; break; }
      inputs.push_back(std::move(t));
    }
    for (const fs::path &p : numbered(set, "output_")) {
      HostTensor t;
      if (!readTensor(p, t, why)) { ok = false; break; }
      want.push_back(std::move(t));
    }
    if (!ok)
      break;
    if (!executeFunction(fn, inputs, got, why)) {
      ok = false;
      break;
    }
    if (gradients && !gradModule) {
      gradModule = (bindInputs ? *boundModule : *module).clone();
      gradInputs = inputs;
    }
    if (got.size() != want.size()) {
      why = "got " + std::to_string(got.size()) + " outputs, want " +
            std::to_string(want.size());
      ok = false;
      break;
    }
    for (size_t i = 0; i < want.size() && ok; ++i) {
      std::string diff = compare(got[i], want[i]);
      if (!diff.empty()) {
        why = "output " + std::to_string(i) + " " + diff;
        ok = false;
      }
    }
  }
  const size_t numSets = sets.size();
  if (ok && numSets == 0) {
    ok = false;
    why = "no test_data_set_* folder";
  }
  if (ok && gradModule)
    ok = checkCaseGradients(*gradModule, gradInputs, name, verbose, t, why);
  if (ok) {
    ++passed;
    for (const std::string &op : caseOps(dir))
      ++t.casesPerOp[op];
    if (verbose)
      std::cout << "PASS " << name << "\n";
  } else {
    ++failed;
    std::cout << "FAIL " << name << ": " << why << "\n";
  }
}

int main(int argc, char **argv) {
  bool verbose = false, gradients = false;
  long expectSupported = -1;
  std::string filter;
  std::vector<fs::path> roots;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--verbose")
      verbose = true;
    else if (a == "--filter" && i + 1 < argc)
      filter = argv[++i];
    else if (a == "--gradients")
      gradients = true;
    else if (a == "--expect-supported" && i + 1 < argc)
      expectSupported = std::stol(argv[++i]);
    else if (a == "-h" || a == "--help") {
      std::cout << "usage: pipec-conformance [--verbose] [--filter SUBSTRING] "
                   "[--gradients] [--expect-supported N] [DIR...]\n";
      return 0;
    } else
      roots.push_back(a);
  }
  if (roots.empty())
    for (const char *d : {"node", "pytorch-converted", "pytorch-operator"})
      roots.push_back(fs::path("/usr/share/libonnx-testdata/data") / d);

  std::vector<fs::path> cases;
  for (const fs::path &root : roots) {
    if (!fs::is_directory(root)) {
      std::cerr << "pipec-conformance: error: no test folder " << root << "\n";
      return 2;
    }
    for (const auto &e : fs::directory_iterator(root))
      if (fs::exists(e.path() / "model.onnx") &&
          e.path().filename().string().find(filter) != std::string::npos)
        cases.push_back(e.path());
  }
  std::sort(cases.begin(), cases.end());

  Totals t;
  for (const fs::path &dir : cases)
    runCase(dir, verbose, gradients, t);
  int &passed = t.passed, &failed = t.failed;
  size_t nUnsupported = 0;
  for (auto &[reason, names] : t.unsupported)
    nUnsupported += names.size();
  std::cout << "unsupported (" << nUnsupported << " cases, by reason):\n";
  for (auto &[reason, names] : t.unsupported) {
    std::cout << "  " << names.size() << "  " << reason;
    if (verbose) {
      std::cout << ":";
      for (auto &n : names)
        std::cout << " " << n;
    }
    std::cout << "\n";
  }
  for (const std::string &fix : t.fixesApplied)
    std::cout << "test-data fix applied: " << fix << "\n";
  reportRegistryCoverage(t);
  std::cout << "supported cases: " << passed + failed << " of " << cases.size()
            << " (" << t.boundCases
            << " with shape inputs bound per data set: shapes are static)\n";
  if (gradients) {
    std::cout << "gradients (float64 VJPs vs central differences): "
              << t.gradPassed << " checked (worst " << t.gradWorst << "), "
              << t.gradFailed << " wrong";
    for (auto &[reason, n] : t.gradSkipped)
      std::cout << ", " << n << " " << reason;
    std::cout << "\n";
  }
  if (expectSupported >= 0 && passed + failed != expectSupported) {
    std::cout << "FAIL: " << passed + failed << " supported cases, expected "
              << expectSupported
              << " (an operator turned unsupported, or more are supported: "
                 "update the count in test/CMakeLists.txt)\n";
    ++failed;
  }
  std::cout << passed << " passed, " << failed << " failed\n";
  return failed ? 1 : 0;
}
