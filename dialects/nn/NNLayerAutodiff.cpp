//===- NNLayerAutodiff.cpp - VJPs of the CNN/transformer ops --------------===//
//
// Vector-Jacobian products of the ops in NNLayerOps.td (and of
// sum_to_shape), emitted as nn ops; see NNAutodiff.cpp for the conventions.
//
//===----------------------------------------------------------------------===//
#include "dialects/nn/NNDialect.h"

#include "mlir/Dialect/MLProgram/IR/MLProgram.h"
#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace pipec::nn;

namespace {

RankedTensorType rt(Value v) { return cast<RankedTensorType>(v.getType()); }

/// Sums a full-shape gradient onto `like` (adjoint of broadcasting).
Value sumTo(OpBuilder &b, Location loc, Value grad, Type like) {
  if (grad.getType() == like)
    return grad;
  return SumToShapeOp::create(b, loc, like, grad, b.getF64FloatAttr(1.0));
}

Value unaryGrad(OpBuilder &b, Location loc, Value forward, Value dy,
                StringRef kind, double alpha = 0, double beta = 0) {
  return UnaryGradOp::create(b, loc, dy.getType(), forward, dy,
                             b.getStringAttr(kind), b.getF64FloatAttr(alpha),
                             b.getF64FloatAttr(beta));
}

/// Per-channel vector [C] summed from a gradient [N, C, ...].
Value channelSum(OpBuilder &b, Location loc, Value full, int64_t c) {
  int64_t rank = rt(full).getRank();
  SmallVector<int64_t> shape(rank - 1, 1);
  shape[0] = c;
  auto elem = rt(full).getElementType();
  Value s = SumToShapeOp::create(b, loc, RankedTensorType::get(shape, elem),
                                 full, b.getF64FloatAttr(1.0));
  return ReshapeOp::create(b, loc, RankedTensorType::get({c}, elem), s);
}

/// A vector [C] reshaped to [C, 1, ...] to broadcast against [N, C, ...].
Value channelBroadcastable(OpBuilder &b, Location loc, Value v, int64_t rank) {
  int64_t c = rt(v).getDimSize(0);
  SmallVector<int64_t> shape(rank - 1, 1);
  shape[0] = c;
  return ReshapeOp::create(b, loc,
                           RankedTensorType::get(shape, rt(v).getElementType()),
                           v);
}

} // namespace

#define PIPEC_UNARY_VJP(OP, KIND, USE_OUTPUT)                                  \
  LogicalResult OP::buildVJP(OpBuilder &b, ArrayRef<Value> g,                  \
                             function_ref<Value(Value)> fwd,                    \
                             SmallVectorImpl<Value> &out) {                     \
    out.push_back(unaryGrad(b, getLoc(),                                        \
                            fwd(USE_OUTPUT ? getOutput() : getInput()), g[0],  \
                            KIND));                                             \
    return success();                                                           \
  }
PIPEC_UNARY_VJP(ErfOp, "erf", false)
PIPEC_UNARY_VJP(SqrtOp, "sqrt", true)
PIPEC_UNARY_VJP(ExpOp, "exp", true)
PIPEC_UNARY_VJP(LogOp, "log", false)
PIPEC_UNARY_VJP(AbsOp, "abs", false)
PIPEC_UNARY_VJP(ReciprocalOp, "reciprocal", true)
PIPEC_UNARY_VJP(GeluOp, "gelu", false)
#undef PIPEC_UNARY_VJP

LogicalResult NegOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                              function_ref<Value(Value)>,
                              SmallVectorImpl<Value> &out) {
  out.push_back(
      ScaleOp::create(b, getLoc(), g[0].getType(), g[0], b.getF64FloatAttr(-1)));
  return success();
}

LogicalResult LeakyReluOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                    function_ref<Value(Value)> fwd,
                                    SmallVectorImpl<Value> &out) {
  out.push_back(unaryGrad(b, getLoc(), fwd(getInput()), g[0], "leaky_relu",
                          getAlpha().convertToDouble()));
  return success();
}

LogicalResult ClipOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                               function_ref<Value(Value)> fwd,
                               SmallVectorImpl<Value> &out) {
  out.push_back(unaryGrad(b, getLoc(), fwd(getInput()), g[0], "clip",
                          getMin().convertToDouble(),
                          getMax().convertToDouble()));
  return success();
}

LogicalResult PowScalarOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                    function_ref<Value(Value)> fwd,
                                    SmallVectorImpl<Value> &out) {
  out.push_back(unaryGrad(b, getLoc(), fwd(getInput()), g[0], "pow_scalar",
                          getExponent().convertToDouble()));
  return success();
}

template <typename OpT>
static void binaryVJP(OpT op, StringRef kind, OpBuilder &b, Value dy,
                      function_ref<Value(Value)> fwd,
                      SmallVectorImpl<Value> &out) {
  auto grads = BinaryGradOp::create(b, op.getLoc(), dy.getType(), dy.getType(),
                                    fwd(op.getLhs()), fwd(op.getRhs()), dy,
                                    b.getStringAttr(kind));
  out.push_back(sumTo(b, op.getLoc(), grads.getLhsGrad(), op.getLhs().getType()));
  out.push_back(sumTo(b, op.getLoc(), grads.getRhsGrad(), op.getRhs().getType()));
}

LogicalResult PowOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                              function_ref<Value(Value)> fwd,
                              SmallVectorImpl<Value> &out) {
  binaryVJP(*this, "pow", b, g[0], fwd, out);
  return success();
}
LogicalResult MaxOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                              function_ref<Value(Value)> fwd,
                              SmallVectorImpl<Value> &out) {
  binaryVJP(*this, "max", b, g[0], fwd, out);
  return success();
}
LogicalResult MinOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                              function_ref<Value(Value)> fwd,
                              SmallVectorImpl<Value> &out) {
  binaryVJP(*this, "min", b, g[0], fwd, out);
  return success();
}

LogicalResult ConvOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                               function_ref<Value(Value)> fwd,
                               SmallVectorImpl<Value> &out) {
  Location loc = getLoc();
  Value dy = g[0];
  out.push_back(ConvGradInputOp::create(
      b, loc, getInput().getType(), dy, fwd(getWeight()), getStridesAttr(),
      getPadsAttr(), getDilationsAttr(), getGroupAttr()));
  out.push_back(ConvGradWeightOp::create(
      b, loc, getWeight().getType(), dy, fwd(getInput()), getStridesAttr(),
      getPadsAttr(), getDilationsAttr(), getGroupAttr()));
  if (getBias())
    out.push_back(channelSum(b, loc, dy, rt(getBias()).getDimSize(0)));
  return success();
}

LogicalResult ConvGradInputOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                        function_ref<Value(Value)> fwd,
                                        SmallVectorImpl<Value> &out) {
  // y = conv_grad_input(x, W): y is the input gradient of a convolution
  // y-shaped -> x-shaped, so dx = conv(dy, W) and dW = the weight gradient
  // of that convolution at input dy and output gradient x.
  Location loc = getLoc();
  Value dy = g[0];
  out.push_back(ConvOp::create(b, loc, getGrad().getType(), dy,
                               fwd(getOther()), Value(), getStridesAttr(),
                               getPadsAttr(), getDilationsAttr(),
                               getGroupAttr()));
  out.push_back(ConvGradWeightOp::create(
      b, loc, getOther().getType(), fwd(getGrad()), dy, getStridesAttr(),
      getPadsAttr(), getDilationsAttr(), getGroupAttr()));
  return success();
}

LogicalResult ResizeLinearOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                       function_ref<Value(Value)>,
                                       SmallVectorImpl<Value> &out) {
  out.push_back(ResizeLinearGradOp::create(b, getLoc(), getInput().getType(),
                                           g[0], getCoordinateModeAttr(),
                                           getScalesAttr()));
  return success();
}

LogicalResult MaxPoolOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                  function_ref<Value(Value)> fwd,
                                  SmallVectorImpl<Value> &out) {
  if (!g[0]) {
    out.push_back(Value());
    return success();
  }
  out.push_back(MaxPoolGradOp::create(b, getLoc(), getInput().getType(), g[0],
                                      fwd(getIndices())));
  return success();
}

LogicalResult AveragePoolOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                      function_ref<Value(Value)>,
                                      SmallVectorImpl<Value> &out) {
  out.push_back(AveragePoolGradOp::create(
      b, getLoc(), getInput().getType(), g[0], getKernelAttr(),
      getStridesAttr(), getPadsAttr(), getCountIncludePadAttr()));
  return success();
}

LogicalResult BatchNormOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                    function_ref<Value(Value)> fwd,
                                    SmallVectorImpl<Value> &out) {
  if (!g[0])
    return success(); // only the running statistics are used
  if (llvm::any_of(g.drop_front(), [](Value v) { return bool(v); }))
    return emitOpError("a gradient flows into the statistics outputs of a "
                       "training-mode BatchNormalization (its saved or "
                       "running mean/variance), which pipec does not "
                       "differentiate");
  auto grads = BatchNormGradOp::create(
      b, getLoc(), getInput().getType(), getScale().getType(),
      getScale().getType(), fwd(getInput()), fwd(getScale()),
      fwd(getSavedMean()), fwd(getSavedInvStd()), g[0]);
  out.append({grads.getInputGrad(), grads.getScaleGrad(), grads.getBiasGrad(),
              Value(), Value()});
  return success();
}

LogicalResult BatchNormInferenceOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                             function_ref<Value(Value)> fwd,
                                             SmallVectorImpl<Value> &out) {
  // Y = scale (X - mean) k + bias, k = 1 / sqrt(var + epsilon):
  // dX = dY scale k, dScale = sum dY (X - mean) k, dBias = sum dY, and,
  // where mean and var are computed values rather than the running
  // statistics (state: weights or constants, which get no gradient, as
  // PyTorch's buffers do), dMean = -scale k dBias and
  // dVar = -1/2 scale k^2 dScale (dk/dvar = -k^3 / 2).
  Location loc = getLoc();
  Value dy = g[0];
  int64_t rank = rt(getInput()).getRank();
  auto vec = getScale().getType();
  int64_t c = rt(getScale()).getDimSize(0);
  Type elem = rt(getScale()).getElementType();
  Value eps = ConstantOp::create(
      b, loc,
      DenseElementsAttr::get(cast<ShapedType>(vec),
                             b.getFloatAttr(elem, getEpsilon().convertToDouble())));
  Value k = ReciprocalOp::create(
      b, loc, SqrtOp::create(b, loc, AddOp::create(b, loc, vec, fwd(getVar()), eps)));
  Value sk = MulOp::create(b, loc, vec, fwd(getScale()), k);
  Value dx = MulOp::create(b, loc, dy.getType(), dy,
                           channelBroadcastable(b, loc, sk, rank));
  Value centered = SubOp::create(b, loc, dy.getType(), fwd(getInput()),
                                 channelBroadcastable(b, loc, fwd(getMean()), rank));
  Value xhat = MulOp::create(b, loc, dy.getType(), centered,
                             channelBroadcastable(b, loc, k, rank));
  Value dscale =
      channelSum(b, loc, MulOp::create(b, loc, dy.getType(), dy, xhat), c);
  Value dbias = channelSum(b, loc, dy, c);
  auto isState = [](Value v) {
    return v.getDefiningOp<ConstantOp>() ||
           v.getDefiningOp<ml_program::GlobalLoadOp>();
  };
  Value dmean, dvar;
  if (!isState(getMean()))
    dmean = NegOp::create(b, loc, MulOp::create(b, loc, vec, sk, dbias));
  if (!isState(getVar())) {
    Value half = ConstantOp::create(
        b, loc,
        DenseElementsAttr::get(RankedTensorType::get({}, elem),
                               b.getFloatAttr(elem, -0.5)));
    Value skk = MulOp::create(b, loc, vec, sk, k);
    dvar = MulOp::create(b, loc, vec, MulOp::create(b, loc, vec, skk, dscale),
                         half);
  }
  out.append({dx, dscale, dbias, dmean, dvar});
  return success();
}

LogicalResult LayerNormOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                    function_ref<Value(Value)> fwd,
                                    SmallVectorImpl<Value> &out) {
  if (!g[0])
    return success();
  if (llvm::any_of(g.drop_front(), [](Value v) { return bool(v); }))
    return emitOpError("a gradient flows into the Mean or InvStdDev output "
                       "of a LayerNormalization, which pipec does not "
                       "differentiate");
  auto grads = LayerNormGradOp::create(
      b, getLoc(), getInput().getType(), getScale().getType(),
      getScale().getType(), fwd(getInput()), fwd(getScale()), fwd(getMean()),
      fwd(getInvStd()), g[0], getAxisAttr());
  out.push_back(grads.getInputGrad());
  out.push_back(grads.getScaleGrad());
  if (getBias())
    out.push_back(grads.getBiasGrad());
  return success();
}

LogicalResult GatherOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                 function_ref<Value(Value)> fwd,
                                 SmallVectorImpl<Value> &out) {
  out.push_back(GatherGradOp::create(b, getLoc(), getData().getType(), g[0],
                                     fwd(getIndices()), getAxisAttr()));
  out.push_back(Value());
  return success();
}

LogicalResult ExpandOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                 function_ref<Value(Value)>,
                                 SmallVectorImpl<Value> &out) {
  out.push_back(sumTo(b, getLoc(), g[0], getInput().getType()));
  return success();
}

LogicalResult SumToShapeOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                     function_ref<Value(Value)>,
                                     SmallVectorImpl<Value> &out) {
  Value full = ExpandOp::create(b, getLoc(), getInput().getType(), g[0]);
  double scale = getScale().convertToDouble();
  if (scale != 1.0)
    full = ScaleOp::create(b, getLoc(), full.getType(), full,
                           b.getF64FloatAttr(scale));
  out.push_back(full);
  return success();
}

LogicalResult ConcatOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                 function_ref<Value(Value)>,
                                 SmallVectorImpl<Value> &out) {
  auto y = rt(getOutput());
  int64_t axis = int64_t(getAxis()) < 0 ? int64_t(getAxis()) + y.getRank() : int64_t(getAxis());
  int64_t offset = 0;
  for (Value v : getInputs()) {
    SmallVector<int64_t> starts(y.getRank(), 0), steps(y.getRank(), 1);
    starts[axis] = offset;
    out.push_back(SliceOp::create(b, getLoc(), v.getType(), g[0],
                                  b.getDenseI64ArrayAttr(starts),
                                  b.getDenseI64ArrayAttr(steps)));
    offset += rt(v).getDimSize(axis);
  }
  return success();
}

LogicalResult SliceOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                function_ref<Value(Value)>,
                                SmallVectorImpl<Value> &out) {
  out.push_back(SliceGradOp::create(b, getLoc(), getInput().getType(), g[0],
                                    getStartsAttr(), getStepsAttr()));
  return success();
}

LogicalResult SliceGradOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                    function_ref<Value(Value)>,
                                    SmallVectorImpl<Value> &out) {
  out.push_back(SliceOp::create(b, getLoc(), getGrad().getType(), g[0],
                                getStartsAttr(), getStepsAttr()));
  return success();
}

LogicalResult DropoutOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                  function_ref<Value(Value)> fwd,
                                  SmallVectorImpl<Value> &out) {
  if (!g[0])
    return success();
  out.push_back(
      MulOp::create(b, getLoc(), g[0].getType(), g[0], fwd(getMask())));
  out.push_back(Value()); // rng
  return success();
}

LogicalResult CompareOp::buildVJP(OpBuilder &, ArrayRef<Value>,
                                  function_ref<Value(Value)>,
                                  SmallVectorImpl<Value> &out) {
  // Piecewise constant: no gradient to either operand.
  out.push_back(Value());
  out.push_back(Value());
  return success();
}

LogicalResult WhereOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                function_ref<Value(Value)> fwd,
                                SmallVectorImpl<Value> &out) {
  out.push_back(Value()); // the condition
  Value dy = g[0];
  Type elem = rt(getOutput()).getElementType();
  if (!dy || !isa<FloatType>(elem)) {
    out.push_back(Value());
    out.push_back(Value());
    return success();
  }
  // dX = where(c, dY, 0), dY' = where(c, 0, dY), each summed onto its shape.
  Location loc = getLoc();
  Value zero = ConstantOp::create(
      b, loc,
      DenseElementsAttr::get(RankedTensorType::get({}, elem),
                             b.getFloatAttr(elem, 0.0)));
  Value c = fwd(getCondition());
  Value dx = WhereOp::create(b, loc, dy.getType(), c, dy, zero);
  Value dyOther = WhereOp::create(b, loc, dy.getType(), c, zero, dy);
  out.push_back(sumTo(b, loc, dx, getX().getType()));
  out.push_back(sumTo(b, loc, dyOther, getY().getType()));
  return success();
}

LogicalResult CastOp::buildVJP(OpBuilder &, ArrayRef<Value> g,
                               function_ref<Value(Value)>,
                               SmallVectorImpl<Value> &out) {
  // float -> float is an identity; through an integer there is no gradient.
  bool floats = isa<FloatType>(rt(getInput()).getElementType()) &&
                isa<FloatType>(rt(getOutput()).getElementType());
  out.push_back(floats ? g[0] : Value());
  return success();
}
