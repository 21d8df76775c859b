//===- NNLayerVerifiers.cpp - verifiers of the CNN/transformer ops --------===//
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

/// Output extent of a sliding window (floor mode).
static int64_t windowOut(int64_t in, int64_t k, int64_t stride, int64_t padA,
                         int64_t padB, int64_t dilation) {
  int64_t eff = (k - 1) * dilation + 1;
  return (in + padA + padB - eff) / stride + 1;
}

/// Checks 2-D window attributes and returns failure with a message.
static LogicalResult verifyWindow(Operation *op, ArrayRef<int64_t> kernel,
                                  ArrayRef<int64_t> strides,
                                  ArrayRef<int64_t> pads,
                                  ArrayRef<int64_t> dilations) {
  if (kernel.size() != 2 || strides.size() != 2 || pads.size() != 4 ||
      dilations.size() != 2)
    return op->emitOpError("expects 2 kernel sizes, 2 strides, 4 pads "
                           "[top, left, bottom, right] and 2 dilations");
  for (int64_t v : llvm::concat<const int64_t>(kernel, strides, dilations))
    if (v < 1)
      return op->emitOpError("kernel sizes, strides and dilations must be "
                             "positive");
  for (int64_t p : pads)
    if (p < 0)
      return op->emitOpError("pads must be non-negative");
  return success();
}

/// Output H, W of a window op must be floor or ceil of the formula (ONNX
/// ceil_mode is resolved into the output shape by the importer).
static LogicalResult verifyWindowOutput(Operation *op, ArrayRef<int64_t> in,
                                        ArrayRef<int64_t> out,
                                        ArrayRef<int64_t> kernel,
                                        ArrayRef<int64_t> strides,
                                        ArrayRef<int64_t> pads,
                                        ArrayRef<int64_t> dilations) {
  for (int d = 0; d < 2; ++d) {
    int64_t lo = windowOut(in[2 + d], kernel[d], strides[d], pads[d],
                           pads[d + 2], dilations[d]);
    if (out[2 + d] != lo && out[2 + d] != lo + 1)
      return op->emitOpError("output spatial size ")
             << out[2 + d] << " does not match the window arithmetic ("
             << lo << ")";
  }
  return success();
}

LogicalResult ConvOp::verify() {
  auto x = rt(getInput()), w = rt(getWeight()), y = rt(getOutput());
  if (x.getRank() != 4 || w.getRank() != 4 || y.getRank() != 4)
    return emitOpError("expects 4-D input, weight and result (NCHW)");
  if (failed(verifyWindow(*this, w.getShape().drop_front(2), getStrides(),
                          getPads(), getDilations())))
    return failure();
  int64_t g = getGroup();
  if (g < 1 || x.getDimSize(1) % g || w.getDimSize(0) % g)
    return emitOpError("group ") << g << " must divide the input channels "
                                 << x.getDimSize(1) << " and the filters "
                                 << w.getDimSize(0);
  if (w.getDimSize(1) * g != x.getDimSize(1))
    return emitOpError("weight has ")
           << w.getDimSize(1) << " input channels per group, expected "
           << x.getDimSize(1) / g;
  if (y.getDimSize(0) != x.getDimSize(0) || y.getDimSize(1) != w.getDimSize(0))
    return emitOpError("result must be [N, M, oH, oW] = [")
           << x.getDimSize(0) << ", " << w.getDimSize(0) << ", ...]";
  if (getBias() && rt(getBias()).getShape() != ArrayRef<int64_t>{w.getDimSize(0)})
    return emitOpError("bias must be [M]");
  return verifyWindowOutput(*this, x.getShape(), y.getShape(),
                            w.getShape().drop_front(2), getStrides(), getPads(),
                            getDilations());
}

LogicalResult ResizeLinearOp::verify() {
  auto x = rt(getInput()), y = rt(getOutput());
  if (x.getRank() != 4 || y.getRank() != 4)
    return emitOpError("expects 4-D input and result (NCHW)");
  if (x.getDimSize(0) != y.getDimSize(0) || x.getDimSize(1) != y.getDimSize(1))
    return emitOpError("resizes H and W only; N and C must be kept");
  if (getScales().size() != 2 || getScales()[0] <= 0 || getScales()[1] <= 0)
    return emitOpError("expects 2 positive scales [scaleH, scaleW]");
  StringRef mode = getCoordinateMode();
  if (mode != "half_pixel" && mode != "pytorch_half_pixel" &&
      mode != "align_corners" && mode != "asymmetric")
    return emitOpError("unknown coordinate_mode '") << mode << "'";
  return success();
}

LogicalResult MaxPoolOp::verify() {
  auto x = rt(getInput()), y = rt(getOutput());
  if (x.getRank() != 4 || y.getRank() != 4)
    return emitOpError("expects 4-D input and result (NCHW)");
  if (rt(getIndices()).getShape() != y.getShape())
    return emitOpError("indices must have the result's shape");
  if (failed(verifyWindow(*this, getKernel(), getStrides(), getPads(),
                          getDilations())))
    return failure();
  return verifyWindowOutput(*this, x.getShape(), y.getShape(), getKernel(),
                            getStrides(), getPads(), getDilations());
}

LogicalResult AveragePoolOp::verify() {
  auto x = rt(getInput()), y = rt(getOutput());
  if (x.getRank() != 4 || y.getRank() != 4)
    return emitOpError("expects 4-D input and result (NCHW)");
  SmallVector<int64_t> one{1, 1};
  if (failed(verifyWindow(*this, getKernel(), getStrides(), getPads(), one)))
    return failure();
  return verifyWindowOutput(*this, x.getShape(), y.getShape(), getKernel(),
                            getStrides(), getPads(), one);
}

LogicalResult BatchNormOp::verify() {
  auto x = rt(getInput());
  if (x.getRank() < 2)
    return emitOpError("input must be [N, C, ...]");
  int64_t c = x.getDimSize(1);
  for (Value v : {getScale(), getBias(), getRunningMean(), getRunningVar(),
                  getSavedMean(), getSavedInvStd(), getNewRunningMean(),
                  getNewRunningVar()})
    if (rt(v).getShape() != ArrayRef<int64_t>{c})
      return emitOpError("per-channel operands and results must be [C] = [")
             << c << "]";
  if (getOutput().getType() != getInput().getType())
    return emitOpError("result must have the input's type");
  return success();
}

LogicalResult LayerNormOp::verify() {
  auto x = rt(getInput());
  int64_t axis = int64_t(getAxis()) < 0 ? int64_t(getAxis()) + x.getRank() : int64_t(getAxis());
  if (axis < 0 || axis >= x.getRank())
    return emitOpError("axis ") << int64_t(getAxis()) << " is out of range";
  ArrayRef<int64_t> norm = x.getShape().drop_front(axis);
  int64_t outer = 1;
  for (int64_t d : x.getShape().take_front(axis))
    outer *= d;
  if (rt(getScale()).getShape() != norm ||
      (getBias() && rt(getBias()).getShape() != norm))
    return emitOpError("scale and bias must have the normalized shape ")
           << shapeStr(norm);
  if (rt(getMean()).getShape() != ArrayRef<int64_t>{outer} ||
      rt(getInvStd()).getShape() != ArrayRef<int64_t>{outer})
    return emitOpError("mean and inv_std must be [") << outer << "]";
  return success();
}

LogicalResult GatherOp::verify() {
  auto d = rt(getData()), i = rt(getIndices()), y = rt(getOutput());
  int64_t axis = int64_t(getAxis()) < 0 ? int64_t(getAxis()) + d.getRank() : int64_t(getAxis());
  if (axis < 0 || axis >= d.getRank())
    return emitOpError("axis ") << int64_t(getAxis()) << " is out of range";
  SmallVector<int64_t> expect(d.getShape().take_front(axis));
  llvm::append_range(expect, i.getShape());
  llvm::append_range(expect, d.getShape().drop_front(axis + 1));
  if (y.getShape() != ArrayRef<int64_t>(expect))
    return emitOpError("result must be ") << shapeStr(expect);
  return success();
}

LogicalResult ExpandOp::verify() {
  auto shape = broadcastShapes(rt(getInput()).getShape(),
                               rt(getOutput()).getShape());
  if (failed(shape) || ArrayRef<int64_t>(*shape) != rt(getOutput()).getShape())
    return emitOpError("input ")
           << shapeStr(rt(getInput()).getShape()) << " does not broadcast to "
           << shapeStr(rt(getOutput()).getShape());
  return success();
}

LogicalResult ConcatOp::verify() {
  if (getInputs().empty())
    return emitOpError("needs at least one input");
  auto y = rt(getOutput());
  int64_t axis = int64_t(getAxis()) < 0 ? int64_t(getAxis()) + y.getRank() : int64_t(getAxis());
  if (axis < 0 || axis >= y.getRank())
    return emitOpError("axis ") << int64_t(getAxis()) << " is out of range";
  int64_t total = 0;
  for (Value v : getInputs()) {
    auto t = rt(v);
    if (t.getRank() != y.getRank())
      return emitOpError("inputs must have the result's rank");
    for (int64_t d = 0; d < y.getRank(); ++d)
      if (d != axis && t.getDimSize(d) != y.getDimSize(d))
        return emitOpError("inputs differ from the result outside the axis");
    total += t.getDimSize(axis);
  }
  if (total != y.getDimSize(axis))
    return emitOpError("input extents along the axis sum to ")
           << total << ", result has " << y.getDimSize(axis);
  return success();
}

LogicalResult SliceOp::verify() {
  auto x = rt(getInput()), y = rt(getOutput());
  if (x.getRank() != y.getRank() ||
      static_cast<int64_t>(getStarts().size()) != x.getRank() ||
      static_cast<int64_t>(getSteps().size()) != x.getRank())
    return emitOpError("starts and steps need one entry per dimension");
  for (int64_t d = 0; d < x.getRank(); ++d) {
    int64_t start = getStarts()[d], step = getSteps()[d], n = y.getDimSize(d);
    if (step == 0)
      return emitOpError("steps must be non-zero");
    if (n == 0)
      continue;
    int64_t last = start + (n - 1) * step;
    if (start < 0 || start >= x.getDimSize(d) || last < 0 ||
        last >= x.getDimSize(d))
      return emitOpError("dimension ") << d << " reads outside the input";
  }
  return success();
}

LogicalResult UnaryGradOp::verify() {
  static const char *kinds[] = {"erf",  "gelu",       "sqrt",       "exp",
                                "log",  "neg",        "abs",        "reciprocal",
                                "leaky_relu", "clip", "pow_scalar"};
  if (!llvm::is_contained(kinds, getKind()))
    return emitOpError("unknown kind '") << getKind() << "'";
  return success();
}

LogicalResult BinaryGradOp::verify() {
  if (getKind() != "pow" && getKind() != "max" && getKind() != "min")
    return emitOpError("kind must be pow, max or min");
  if (getLhsGrad().getType() != getGrad().getType() ||
      getRhsGrad().getType() != getGrad().getType())
    return emitOpError("gradients must have the shape of dY");
  return success();
}

//===----------------------------------------------------------------------===//
// Comparisons, selection, casts
//===----------------------------------------------------------------------===//

/// The broadcast shape of `shapes` (numpy rules), or failure.
static FailureOr<SmallVector<int64_t>>
broadcastAll(ArrayRef<ArrayRef<int64_t>> shapes) {
  SmallVector<int64_t> acc;
  for (ArrayRef<int64_t> s : shapes) {
    auto next = broadcastShapes(acc, s);
    if (failed(next))
      return failure();
    acc.assign(next->begin(), next->end());
  }
  return acc;
}

LogicalResult CompareOp::verify() {
  static const char *const kPredicates[] = {"eq", "ne", "lt", "gt", "le", "ge"};
  if (!llvm::is_contained(kPredicates, getPredicate()))
    return emitOpError("predicate must be one of eq, ne, lt, gt, le, ge; got '")
           << getPredicate() << "'";
  auto lhs = rt(getLhs()), rhs = rt(getRhs());
  if (lhs.getElementType() != rhs.getElementType())
    return emitOpError("operands must have one element type, got ")
           << lhs.getElementType() << " and " << rhs.getElementType();
  auto shape = broadcastAll({lhs.getShape(), rhs.getShape()});
  if (failed(shape))
    return emitOpError("operand shapes ")
           << shapeStr(lhs.getShape()) << " and " << shapeStr(rhs.getShape())
           << " are not broadcast-compatible";
  if (ArrayRef<int64_t>(*shape) != rt(getOutput()).getShape())
    return emitOpError("result shape ")
           << shapeStr(rt(getOutput()).getShape())
           << " must be the broadcast shape " << shapeStr(*shape);
  return success();
}

LogicalResult WhereOp::verify() {
  auto c = rt(getCondition()), x = rt(getX()), y = rt(getY());
  auto out = rt(getOutput());
  if (x.getElementType() != y.getElementType() ||
      x.getElementType() != out.getElementType())
    return emitOpError("x, y and the result must have one element type, got ")
           << x.getElementType() << ", " << y.getElementType() << " and "
           << out.getElementType();
  auto shape = broadcastAll({c.getShape(), x.getShape(), y.getShape()});
  if (failed(shape))
    return emitOpError("shapes ")
           << shapeStr(c.getShape()) << ", " << shapeStr(x.getShape())
           << " and " << shapeStr(y.getShape())
           << " are not broadcast-compatible";
  if (ArrayRef<int64_t>(*shape) != out.getShape())
    return emitOpError("result shape ")
           << shapeStr(out.getShape()) << " must be the broadcast shape "
           << shapeStr(*shape);
  return success();
}

LogicalResult CastOp::verify() {
  if (rt(getInput()).getShape() != rt(getOutput()).getShape())
    return emitOpError("result shape ")
           << shapeStr(rt(getOutput()).getShape())
           << " must equal the input shape "
           << shapeStr(rt(getInput()).getShape());
  Type from = rt(getInput()).getElementType(),
       to = rt(getOutput()).getElementType();
  if ((from.isBF16() || to.isBF16()) && !(from.isF32() || to.isF32()))
    return emitOpError("converts bf16 only to or from f32, not ")
           << from << " to " << to;
  return success();
}
