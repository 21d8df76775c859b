//===- Convert.h - ONNX node conversions, registered by op family -*- C++ -*-===//
//
// The importer's seam between its driver (OnnxImporter.cpp: load, libonnx
// in a child process, checker, version conversion, shape inference,
// folding, the node loop) and the conversions of ONNX nodes to nn ops,
// which live in ops/<Family>.cpp.
//
// Each family file has one `register<Family>Ops(OpRegistry &)` that adds an
// OpSpec per operator: its domain, the first opset version whose form the
// conversion handles (as torch-mlir's onOp: for a model of opset v the
// entry with the largest since <= v is used), what element types its
// operands may have, and the conversion function. Registering is what
// makes an operator supported: the driver's "unsupported operators" check,
// `pipec-translate --list-ops`, the README's operator list and the
// conformance report all read this registry.
//
// A conversion receives a NodeContext: the node, its location and static
// result types, the builder, and the importer services (operands,
// constants after folding, the random state); it emits nn ops and records
// the node's outputs, or fails with a message for the user.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_LIB_IMPORT_CONVERT_H
#define PIPEC_LIB_IMPORT_CONVERT_H

#include "ConstFold.h"
#include "pipec/Import.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"

#include <onnx/onnx_pb.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace pipec::import {

/// ONNX's training operators' domain (Momentum, Adam, Adagrad).
constexpr const char *kTrainingDomain = "ai.onnx.preview.training";

bool isDefaultDomain(const std::string &domain);
std::string nodeLabel(const onnx::NodeProto &node, int index);
std::string dimsString(const std::vector<int64_t> &dims);

// Attribute readers (the default when the attribute is absent).
const onnx::AttributeProto *findAttr(const onnx::NodeProto &node,
                                     const std::string &name);
int64_t attrInt(const onnx::NodeProto &n, const std::string &name,
                int64_t dflt);
float attrFloat(const onnx::NodeProto &n, const std::string &name, float dflt);
std::vector<int64_t> attrInts(const onnx::NodeProto &n, const std::string &name,
                              std::vector<int64_t> dflt = {});
std::string attrString(const onnx::NodeProto &n, const std::string &name,
                       const std::string &dflt);

/// Static type facts of an ONNX value (from shape inference).
struct ValueType {
  int32_t elemType = 0;
  std::vector<int64_t> dims; // -1 = unknown
  bool known = false;
  bool isStatic() const;
};

/// What the importer offers conversions (implemented by the driver).
class ImportServices {
public:
  virtual ~ImportServices() = default;
  /// The MLIR value of input `i` of `node` (null after reporting an error;
  /// null without an error for an absent optional input).
  virtual mlir::Value operand(const onnx::NodeProto &node, int i,
                              int index) = 0;
  /// The value of `name` when it is known at import time (a constant, a
  /// folded shape computation or a frozen initializer).
  virtual std::optional<ConstTensor> constOf(const std::string &name) = 0;
  virtual bool constantInts(const std::string &name,
                            std::vector<int64_t> &out) = 0;
  /// A float initializer that is trained (never folded into a constant).
  virtual bool isWeightName(const std::string &name) const = 0;
  virtual const ValueType *typeOfName(const std::string &name) const = 0;
  /// The per-microbatch random state argument of @main (created by the
  /// first caller); null after reporting an error.
  virtual mlir::Value randomState(const std::string &where) = 0;
  /// Records a Constant node (materialised on first use).
  virtual void defineConstant(const std::string &name,
                              const onnx::TensorProto &value) = 0;
  /// The hint appended to shape errors when the batch was re-specialised.
  virtual std::string batchHint() const = 0;
  virtual const ImportOptions &options() const = 0;
};

/// One node being converted. Family files derive a struct from it whose
/// member functions are the conversions, so their bodies read `b`, `loc`,
/// `in(i)`, `rt0`, `fail(...)` directly.
class NodeContext {
public:
  NodeContext(ImportServices &services, mlir::OpBuilder &b,
              std::map<std::string, mlir::Value> &values, std::string &error,
              const onnx::NodeProto &node, int index,
              llvm::ArrayRef<mlir::Type> resultTypes);

  ImportServices &services;
  mlir::OpBuilder &b;
  std::map<std::string, mlir::Value> &values;
  std::string &error;
  const onnx::NodeProto &node;
  const int index;
  const std::string &op;
  /// "node 'label' (Op)", the start of every message about this node.
  const std::string where;
  mlir::Location loc;
  llvm::SmallVector<mlir::Type> resultTypes;
  /// The static type of output 0 (null when it has none).
  mlir::Type rt0;

  /// Sets `error` (unless already set) and returns false.
  bool fail(const std::string &message) const;
  mlir::Value in(int i) const { return services.operand(node, i, index); }
  /// Inputs 0..count-1 are present (a message names the first that is not).
  bool need(int count) const;
  /// Records output 0 after checking its type against ONNX's inference.
  bool out0(mlir::Value v) const;
  /// Records output k (no check).
  void setOutput(int k, mlir::Value v) const { values[node.output(k)] = v; }

  static mlir::RankedTensorType rtype(mlir::Value v) {
    return llvm::cast<mlir::RankedTensorType>(v.getType());
  }
  mlir::FloatAttr f32(float v) const { return b.getF32FloatAttr(v); }
  mlir::DenseI64ArrayAttr i64s(llvm::ArrayRef<int64_t> v) const {
    return b.getDenseI64ArrayAttr(v);
  }
  /// A float32 scalar constant (broadcasts against any tensor).
  mlir::Value scalarF32(float v) const;
  /// Input i as a constant scalar; `dflt` when absent, nullopt when it is
  /// not a constant scalar.
  std::optional<float> inputConstFloat(int i, float dflt) const;
  std::optional<ConstTensor> constOf(const std::string &name) const {
    return services.constOf(name);
  }
  bool constantInts(const std::string &name, std::vector<int64_t> &out) const {
    return services.constantInts(name, out);
  }
  bool isWeightName(const std::string &name) const {
    return services.isWeightName(name);
  }
};

/// Which element types a node's inputs may have (checked before the
/// conversion runs; integers elsewhere are refused with the input named).
enum class Operands {
  /// Every input is float32.
  Float,
  /// Input 0 is float32; the others are constant shapes, axes or bounds.
  FirstFloat,
  /// Input 0 is float32, int64 or bool (a view); the others are constants.
  View,
  /// Every input is float32 but input 1: a loss's labels, an optimizer's
  /// iteration count.
  Labeled,
  /// Any element type: the conversion checks its own (masks, Cast, Where).
  Any,
};

using ConvertFn = bool (*)(const NodeContext &);

struct OpSpec {
  std::string domain; // "" for the default domain
  std::string op;
  /// The first opset version of `domain` whose form this entry handles.
  int since = 1;
  /// The op family (the file under ops/ that registers it).
  std::string family;
  Operands operands = Operands::Float;
  /// Null: the node is supported only when it folds to a constant at
  /// import time (shape computations).
  ConvertFn convert = nullptr;
  /// The shape input (input 1) must be a constant after folding; checked
  /// before the result types are read, so the message names the input.
  bool constantShapeInput = false;
  /// Converted before folding is tried (Constant).
  bool beforeFolding = false;
  /// A short note for --list-ops (what is and is not supported).
  std::string note;
};

class OpRegistry {
public:
  /// The registry of every family, built on first use.
  static const OpRegistry &get();

  void add(OpSpec spec);
  /// The entry for `op` of `domain` at opset `version`: the one with the
  /// largest `since` not above it; null when none.
  const OpSpec *find(const std::string &domain, const std::string &op,
                     int64_t version) const;
  /// Every entry, by domain, op and since.
  const std::vector<OpSpec> &all() const { return specs; }

private:
  std::vector<OpSpec> specs;
};

/// Runs member function M of a family's NodeContext subclass F.
template <class F, bool (F::*M)()>
bool convertWith(const NodeContext &c) {
  F f(c);
  return (f.*M)();
}

/// The OpSpec of an op whose conversion is member function M of family
/// struct F.
template <class F, bool (F::*M)()>
OpSpec conversion(const char *family, const char *op, int since = 13,
                  Operands operands = Operands::Float, const char *note = "") {
  OpSpec s;
  s.op = op;
  s.since = since;
  s.family = family;
  s.operands = operands;
  s.convert = &convertWith<F, M>;
  s.note = note;
  return s;
}

// One per file under ops/.
void registerElementwiseOps(OpRegistry &r);
void registerMatMulOps(OpRegistry &r);
void registerConvPoolOps(OpRegistry &r);
void registerNormalizationOps(OpRegistry &r);
void registerShapeOps(OpRegistry &r);
void registerMaskOps(OpRegistry &r);
void registerLossOps(OpRegistry &r);
void registerTrainingOps(OpRegistry &r);

} // namespace pipec::import

#endif // PIPEC_LIB_IMPORT_CONVERT_H
