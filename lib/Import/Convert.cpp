//===- Convert.cpp - the conversion registry and NodeContext -------------===//
#include "Convert.h"

#include "dialects/nn/NNDialect.h"

#include "mlir/IR/BuiltinAttributes.h"

#include <algorithm>
#include <tuple>

using namespace mlir;

namespace pipec::import {

bool isDefaultDomain(const std::string &domain) {
  return domain.empty() || domain == "ai.onnx";
}

std::string nodeLabel(const onnx::NodeProto &node, int index) {
  if (!node.name().empty())
    return node.name();
  return node.op_type() + "_" + std::to_string(index);
}

std::string dimsString(const std::vector<int64_t> &dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    s += (i ? "x" : "") +
         (dims[i] < 0 ? std::string("?") : std::to_string(dims[i]));
  return s + "]";
}

const onnx::AttributeProto *findAttr(const onnx::NodeProto &node,
                                     const std::string &name) {
  for (const auto &a : node.attribute())
    if (a.name() == name)
      return &a;
  return nullptr;
}

int64_t attrInt(const onnx::NodeProto &n, const std::string &name,
                int64_t dflt) {
  const auto *a = findAttr(n, name);
  return a ? a->i() : dflt;
}

float attrFloat(const onnx::NodeProto &n, const std::string &name,
                float dflt) {
  const auto *a = findAttr(n, name);
  return a ? a->f() : dflt;
}

std::vector<int64_t> attrInts(const onnx::NodeProto &n, const std::string &name,
                              std::vector<int64_t> dflt) {
  const auto *a = findAttr(n, name);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : dflt;
}

std::string attrString(const onnx::NodeProto &n, const std::string &name,
                       const std::string &dflt) {
  const auto *a = findAttr(n, name);
  return a ? a->s() : dflt;
}

bool ValueType::isStatic() const {
  return known && std::all_of(dims.begin(), dims.end(),
                              [](int64_t d) { return d >= 0; });
}

//===----------------------------------------------------------------------===//
// NodeContext
//===----------------------------------------------------------------------===//

NodeContext::NodeContext(ImportServices &services, OpBuilder &b,
                         std::map<std::string, Value> &values,
                         std::string &error, const onnx::NodeProto &node,
                         int index, ArrayRef<Type> resultTypes)
    : services(services), b(b), values(values), error(error), node(node),
      index(index), op(node.op_type()),
      where("node '" + nodeLabel(node, index) + "' (" + node.op_type() + ")"),
      loc(NameLoc::get(b.getStringAttr(nodeLabel(node, index)))),
      resultTypes(resultTypes.begin(), resultTypes.end()),
      rt0(resultTypes.empty() ? Type() : resultTypes[0]) {}

bool NodeContext::fail(const std::string &message) const {
  if (error.empty())
    error = message;
  return false;
}

bool NodeContext::need(int count) const {
  for (int i = 0; i < count; ++i)
    if (!in(i))
      return error.empty() ? fail(where + ": missing input " + std::to_string(i))
                           : false;
  return true;
}

bool NodeContext::out0(Value v) const {
  if (!v)
    return false;
  if (v.getType() != rt0)
    return fail(where + ": result type disagrees with ONNX shape inference");
  values[node.output(0)] = v;
  return true;
}

Value NodeContext::scalarF32(float v) const {
  auto t = RankedTensorType::get({}, b.getF32Type());
  return nn::ConstantOp::create(
      b, loc, cast<ElementsAttr>(DenseElementsAttr::get(t, v)));
}

std::optional<float> NodeContext::inputConstFloat(int i, float dflt) const {
  if (i >= node.input_size() || node.input(i).empty())
    return dflt;
  auto c = constOf(node.input(i));
  if (!c || c->numel() != 1)
    return std::nullopt;
  return float(c->real(0));
}

//===----------------------------------------------------------------------===//
// OpRegistry
//===----------------------------------------------------------------------===//

void OpRegistry::add(OpSpec spec) {
  auto key = [](const OpSpec &s) { return std::tie(s.domain, s.op, s.since); };
  auto at = std::lower_bound(
      specs.begin(), specs.end(), spec,
      [&](const OpSpec &a, const OpSpec &b) { return key(a) < key(b); });
  if (at != specs.end() && key(*at) == key(spec))
    llvm::report_fatal_error(("op " + spec.op + " registered twice").c_str());
  specs.insert(at, std::move(spec));
}

const OpSpec *OpRegistry::find(const std::string &domain, const std::string &op,
                               int64_t version) const {
  std::string d = isDefaultDomain(domain) ? "" : domain;
  const OpSpec *best = nullptr;
  for (const OpSpec &s : specs)
    if (s.domain == d && s.op == op && s.since <= version)
      best = &s; // sorted by since: the last one that fits
  return best;
}

const OpRegistry &OpRegistry::get() {
  static const OpRegistry registry = [] {
    OpRegistry r;
    registerElementwiseOps(r);
    registerMatMulOps(r);
    registerConvPoolOps(r);
    registerNormalizationOps(r);
    registerShapeOps(r);
    registerMaskOps(r);
    registerLossOps(r);
    registerTrainingOps(r);
    return r;
  }();
  return registry;
}

} // namespace pipec::import

std::vector<pipec::SupportedOperator> pipec::supportedOperators() {
  std::vector<SupportedOperator> out;
  for (const import::OpSpec &s : import::OpRegistry::get().all())
    out.push_back({s.domain, s.op, s.since, s.family, s.convert == nullptr,
                   s.note});
  return out;
}
