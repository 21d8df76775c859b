//===- NNVerifiers.cpp - nn op verifiers ----------------------------------===//
//
// Every constraint ONNX states on shapes and attributes of the supported
// ops, checked on static types. Each message names the broken constraint.
//
//===----------------------------------------------------------------------===//
#include "dialects/nn/NNDialect.h"

#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace pipec::nn;

static RankedTensorType rt(Value v) {
  return cast<RankedTensorType>(v.getType());
}

static std::string shapeStr(ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (auto [i, d] : llvm::enumerate(shape))
    s += (i ? "x" : "") + std::to_string(d);
  return s + "]";
}

LogicalResult pipec::nn::verifyBf16Storage(Operation *op) {
  bool bf16 = false, f64 = false;
  for (Type t :
       llvm::concat<const Type>(op->getOperandTypes(), op->getResultTypes()))
    if (auto r = dyn_cast<RankedTensorType>(t)) {
      bf16 |= r.getElementType().isBF16();
      f64 |= r.getElementType().isF64();
    }
  if (bf16 && f64)
    return op->emitOpError("mixes bf16 and f64 tensors (bf16 storage, "
                           "--activations bf16, goes with f32 only)");
  return success();
}

/// Shared check of the elementwise binary ops.
static LogicalResult verifyBroadcastBinary(Operation *op) {
  auto lhs = rt(op->getOperand(0)), rhs = rt(op->getOperand(1));
  auto out = rt(op->getResult(0));
  auto shape = broadcastShapes(lhs.getShape(), rhs.getShape());
  if (failed(shape))
    return op->emitOpError("operand shapes ")
           << shapeStr(lhs.getShape()) << " and " << shapeStr(rhs.getShape())
           << " are not broadcast-compatible";
  if (ArrayRef<int64_t>(*shape) != out.getShape())
    return op->emitOpError("result shape ")
           << shapeStr(out.getShape()) << " must be the broadcast shape "
           << shapeStr(*shape);
  return success();
}

LogicalResult AddOp::verify() { return verifyBroadcastBinary(*this); }
LogicalResult SubOp::verify() { return verifyBroadcastBinary(*this); }
LogicalResult MulOp::verify() { return verifyBroadcastBinary(*this); }
LogicalResult DivOp::verify() { return verifyBroadcastBinary(*this); }
LogicalResult PowOp::verify() { return verifyBroadcastBinary(*this); }
LogicalResult MaxOp::verify() { return verifyBroadcastBinary(*this); }
LogicalResult MinOp::verify() { return verifyBroadcastBinary(*this); }

LogicalResult GemmOp::verify() {
  auto a = rt(getA()), b = rt(getB());
  if (a.getRank() != 2 || b.getRank() != 2)
    return emitOpError("A and B must be 2-D, got ranks ")
           << a.getRank() << " and " << b.getRank();
  int64_t m = getTransA() ? a.getDimSize(1) : a.getDimSize(0);
  int64_t ka = getTransA() ? a.getDimSize(0) : a.getDimSize(1);
  int64_t kb = getTransB() ? b.getDimSize(1) : b.getDimSize(0);
  int64_t n = getTransB() ? b.getDimSize(0) : b.getDimSize(1);
  if (ka != kb)
    return emitOpError("inner dimensions of op(A) and op(B) differ: ")
           << ka << " vs " << kb;
  auto out = rt(getOutput());
  if (out.getShape() != ArrayRef<int64_t>{m, n})
    return emitOpError("result must be ")
           << shapeStr({m, n}) << ", got " << shapeStr(out.getShape());
  if (getC()) {
    auto c = rt(getC());
    if (c.getRank() > 2)
      return emitOpError("C must have rank <= 2");
    auto shape = broadcastShapes(c.getShape(), {m, n});
    if (failed(shape) || ArrayRef<int64_t>(*shape) != ArrayRef<int64_t>{m, n})
      return emitOpError("C of shape ")
             << shapeStr(c.getShape()) << " does not broadcast to "
             << shapeStr({m, n});
  }
  return success();
}

/// (rows, columns) of the matrices of `t`, swapped when `trans`.
static std::pair<int64_t, int64_t> matrixDims(RankedTensorType t, bool trans) {
  int64_t r = t.getDimSize(t.getRank() - 2), c = t.getDimSize(t.getRank() - 1);
  return trans ? std::make_pair(c, r) : std::make_pair(r, c);
}

SmallVector<int64_t> MatMulOp::operandShape(int which) {
  auto t = rt(which == 0 ? getA() : getB());
  std::optional<ArrayRef<int64_t>> perm = which == 0 ? getPermA() : getPermB();
  if (!perm)
    return SmallVector<int64_t>(t.getShape());
  SmallVector<int64_t> shape;
  for (int64_t p : *perm)
    shape.push_back(p >= 0 && p < t.getRank() ? t.getDimSize(p) : 0);
  return shape;
}

/// A matmul operand permutation: a permutation of the operand's `rank`
/// dimensions that keeps the innermost one innermost (its rows are read
/// in place, through strides).
static LogicalResult verifyOperandPerm(MatMulOp op,
                                       std::optional<ArrayRef<int64_t>> perm,
                                       int64_t rank, const char *name) {
  if (!perm)
    return success();
  if (int64_t(perm->size()) != rank)
    return op.emitOpError(name) << " has " << perm->size()
                                << " entries for an operand of rank " << rank;
  SmallVector<bool> seen(rank, false);
  for (int64_t p : *perm) {
    if (p < 0 || p >= rank || seen[p])
      return op.emitOpError(name) << " is not a permutation";
    seen[p] = true;
  }
  if (rank > 0 && perm->back() != rank - 1)
    return op.emitOpError(name)
           << " must keep the innermost dimension innermost";
  return success();
}

LogicalResult MatMulOp::verify() {
  auto a = rt(getA()), b = rt(getB()), out = rt(getOutput());
  if (a.getRank() < 2 || b.getRank() < 2)
    return emitOpError("operands must have rank >= 2");
  if (failed(verifyOperandPerm(*this, getPermA(), a.getRank(), "perm_a")) ||
      failed(verifyOperandPerm(*this, getPermB(), b.getRank(), "perm_b")))
    return failure();
  // The operands as read (through perm_a / perm_b).
  a = RankedTensorType::get(operandShape(0), a.getElementType());
  b = RankedTensorType::get(operandShape(1), b.getElementType());
  auto [aRows, aCols] = matrixDims(a, getTransA());
  auto [bRows, bCols] = matrixDims(b, getTransB());
  if (aCols != bRows)
    return emitOpError("inner dimensions differ: ") << aCols << " vs " << bRows;
  auto batch = broadcastShapes(a.getShape().drop_back(2),
                               b.getShape().drop_back(2));
  if (failed(batch))
    return emitOpError("batch dimensions are not broadcast-compatible");
  SmallVector<int64_t> expect(*batch);
  expect.push_back(aRows);
  expect.push_back(bCols);
  if (out.getShape() != ArrayRef<int64_t>(expect))
    return emitOpError("result must be ")
           << shapeStr(expect) << ", got " << shapeStr(out.getShape());
  return success();
}

template <typename OpT>
static LogicalResult verifySoftmaxAxis(OpT op) {
  int64_t rank = rt(op.getInput()).getRank();
  if (normalizeAxis(op.getAxis(), rank) < 0)
    return op.emitOpError("axis ")
           << int64_t(op.getAxis()) << " is out of range for rank " << rank;
  return success();
}
LogicalResult SoftmaxOp::verify() { return verifySoftmaxAxis(*this); }
LogicalResult LogSoftmaxOp::verify() { return verifySoftmaxAxis(*this); }

LogicalResult FlattenOp::verify() {
  auto in = rt(getInput());
  int64_t rank = in.getRank(), axis = getAxis();
  if (axis < 0)
    axis += rank;
  if (axis < 0 || axis > rank)
    return emitOpError("axis ") << int64_t(getAxis()) << " is out of range for rank "
                                << rank;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < rank; ++i)
    (i < axis ? outer : inner) *= in.getDimSize(i);
  if (rt(getOutput()).getShape() != ArrayRef<int64_t>{outer, inner})
    return emitOpError("result must be ")
           << shapeStr({outer, inner}) << ", got "
           << shapeStr(rt(getOutput()).getShape());
  if (in.getElementType() != rt(getOutput()).getElementType())
    return emitOpError("element type changes from ")
           << in.getElementType() << " to " << rt(getOutput()).getElementType();
  return success();
}

LogicalResult ReshapeOp::verify() {
  if (rt(getInput()).getNumElements() != rt(getOutput()).getNumElements())
    return emitOpError("element count changes from ")
           << rt(getInput()).getNumElements() << " to "
           << rt(getOutput()).getNumElements();
  if (rt(getInput()).getElementType() != rt(getOutput()).getElementType())
    return emitOpError("element type changes from ")
           << rt(getInput()).getElementType() << " to "
           << rt(getOutput()).getElementType();
  return success();
}

LogicalResult TransposeOp::verify() {
  auto in = rt(getInput());
  ArrayRef<int64_t> perm = getPerm();
  if (static_cast<int64_t>(perm.size()) != in.getRank())
    return emitOpError("perm has ")
           << perm.size() << " entries for rank " << in.getRank();
  SmallVector<bool> seen(perm.size(), false);
  SmallVector<int64_t> expect;
  for (int64_t p : perm) {
    if (p < 0 || p >= in.getRank() || seen[p])
      return emitOpError("perm is not a permutation of 0..")
             << in.getRank() - 1;
    seen[p] = true;
    expect.push_back(in.getDimSize(p));
  }
  if (rt(getOutput()).getShape() != ArrayRef<int64_t>(expect))
    return emitOpError("result must be ") << shapeStr(expect);
  return success();
}

LogicalResult ConstantOp::verify() {
  if (getValue().getType() != getOutput().getType())
    return emitOpError("value type ")
           << getValue().getType() << " differs from result type "
           << getOutput().getType();
  return success();
}

/// Checks scores/labels/weights shapes shared by the loss and its gradient.
static LogicalResult verifyLossOperands(Operation *op, Value scores,
                                        Value labels, Value weights,
                                        StringRef reduction) {
  auto s = rt(scores), l = rt(labels);
  if (s.getRank() < 2)
    return op->emitOpError("scores must be [N, C, ...], got rank ")
           << s.getRank();
  SmallVector<int64_t> expect{s.getDimSize(0)};
  llvm::append_range(expect, s.getShape().drop_front(2));
  if (l.getShape() != ArrayRef<int64_t>(expect))
    return op->emitOpError("labels must be ")
           << shapeStr(expect) << " for scores " << shapeStr(s.getShape())
           << ", got " << shapeStr(l.getShape());
  if (weights && rt(weights).getShape() != ArrayRef<int64_t>{s.getDimSize(1)})
    return op->emitOpError("weights must be [C] = [")
           << s.getDimSize(1) << "]";
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    return op->emitOpError("reduction must be none, mean or sum, got '")
           << reduction << "'";
  return success();
}

/// Shape of the loss for a reduction.
static SmallVector<int64_t> lossShape(Value labels, StringRef reduction) {
  if (reduction == "none")
    return SmallVector<int64_t>(rt(labels).getShape());
  return {};
}

LogicalResult SoftmaxCrossEntropyLossOp::verify() {
  if (failed(verifyLossOperands(*this, getScores(), getLabels(), getWeights(),
                                getReduction())))
    return failure();
  if (rt(getLoss()).getShape() !=
      ArrayRef<int64_t>(lossShape(getLabels(), getReduction())))
    return emitOpError("loss must have shape ")
           << shapeStr(lossShape(getLabels(), getReduction()))
           << " for reduction '" << getReduction() << "'";
  if (getLogProb() && getLogProb().getType() != getScores().getType())
    return emitOpError("log_prob must have the type of scores");
  return success();
}

LogicalResult SoftmaxCrossEntropyLossGradOp::verify() {
  if (failed(verifyLossOperands(*this, getScores(), getLabels(), getWeights(),
                                getReduction())))
    return failure();
  if (rt(getLossGrad()).getShape() !=
      ArrayRef<int64_t>(lossShape(getLabels(), getReduction())))
    return emitOpError("loss_grad must have the loss shape ")
           << shapeStr(lossShape(getLabels(), getReduction()));
  if (getOutput().getType() != getScores().getType())
    return emitOpError("result must have the type of scores");
  return success();
}

LogicalResult SumToShapeOp::verify() {
  auto in = rt(getInput()), out = rt(getOutput());
  auto shape = broadcastShapes(out.getShape(), in.getShape());
  if (out.getRank() > in.getRank() || failed(shape) ||
      ArrayRef<int64_t>(*shape) != in.getShape())
    return emitOpError("result shape ")
           << shapeStr(out.getShape()) << " does not broadcast to the input "
           << shapeStr(in.getShape());
  return success();
}

LogicalResult SgdUpdateOp::verify() {
  if (getWeight().getType() != getGrad().getType() ||
      getWeight().getType() != getOutput().getType())
    return emitOpError("weight, gradient and result must have one type");
  if (rt(getLr()).getRank() != 0)
    return emitOpError("lr must be a rank-0 tensor");
  return success();
}

/// R and T of the ONNX training operators are scalars.
static LogicalResult verifyOptimizerScalars(Operation *op, Value r, Value t) {
  if (rt(r).getRank() != 0 || rt(t).getRank() != 0)
    return op->emitOpError("R (learning rate) and T (update count) must be "
                           "rank-0 tensors");
  return success();
}

LogicalResult MomentumOp::verify() {
  if (getMode() != "standard" && getMode() != "nesterov")
    return emitOpError("mode must be standard or nesterov, got '")
           << getMode() << "'";
  return verifyOptimizerScalars(*this, getR(), getT());
}
LogicalResult AdamOp::verify() {
  return verifyOptimizerScalars(*this, getR(), getT());
}
LogicalResult AdagradOp::verify() {
  return verifyOptimizerScalars(*this, getR(), getT());
}
