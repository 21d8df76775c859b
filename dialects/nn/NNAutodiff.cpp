//===- NNAutodiff.cpp - DifferentiableOpInterface implementations ---------===//
//
// The vector-Jacobian product of every differentiable nn op, emitted as nn
// ops. `fwd(v)` makes a forward value available in the backward function
// (saved across the pipeline stash or rematerialised); gradients of
// broadcast operands are summed back onto the operand's shape.
//
//===----------------------------------------------------------------------===//
#include "dialects/nn/NNDialect.h"

#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace pipec::nn;

/// Sums `grad` onto the type of `like` (adjoint of numpy broadcasting),
/// times `scale`.
static Value sumTo(OpBuilder &b, Location loc, Value grad, Type like,
                   double scale = 1.0) {
  if (grad.getType() == like && scale == 1.0)
    return grad;
  if (grad.getType() == like)
    return ScaleOp::create(b, loc, like, grad, b.getF64FloatAttr(scale));
  return SumToShapeOp::create(b, loc, like, grad, b.getF64FloatAttr(scale));
}

static Value gemm(OpBuilder &b, Location loc, Type type, Value x, Value y,
                  bool transX, bool transY, float alpha) {
  return GemmOp::create(b, loc, type, x, y, Value(), b.getF32FloatAttr(alpha),
                        b.getF32FloatAttr(0.0f), b.getBoolAttr(transX),
                        b.getBoolAttr(transY));
}

//===----------------------------------------------------------------------===//
// Products
//===----------------------------------------------------------------------===//

LogicalResult GemmOp::buildVJP(OpBuilder &b, ArrayRef<Value> resultGrads,
                               function_ref<Value(Value)> fwd,
                               SmallVectorImpl<Value> &operandGrads) {
  Value dy = resultGrads[0];
  Location loc = getLoc();
  float alpha = getAlpha().convertToFloat();
  bool ta = getTransA(), tb = getTransB();
  Value a = fwd(getA()), bb = fwd(getB());
  // Y = alpha op(A) op(B) + beta C.
  Value da = ta ? gemm(b, loc, getA().getType(), bb, dy, tb, true, alpha)
                : gemm(b, loc, getA().getType(), dy, bb, false, !tb, alpha);
  Value db = tb ? gemm(b, loc, getB().getType(), dy, a, true, ta, alpha)
                : gemm(b, loc, getB().getType(), a, dy, !ta, false, alpha);
  operandGrads.push_back(da);
  operandGrads.push_back(db);
  if (getC())
    operandGrads.push_back(
        sumTo(b, loc, dy, getC().getType(), getBeta().convertToDouble()));
  return success();
}

/// `v` transposed by `perm` (result dimension i is v's dimension perm[i]).
static Value transposeBy(OpBuilder &b, Location loc, Value v,
                         ArrayRef<int64_t> perm) {
  auto t = cast<RankedTensorType>(v.getType());
  SmallVector<int64_t> shape;
  for (int64_t p : perm)
    shape.push_back(t.getDimSize(p));
  return TransposeOp::create(
      b, loc, RankedTensorType::get(shape, t.getElementType()), v,
      b.getDenseI64ArrayAttr(perm));
}

/// The permutation that undoes `perm`.
static SmallVector<int64_t> inversePerm(ArrayRef<int64_t> perm) {
  SmallVector<int64_t> inverse(perm.size());
  for (auto [i, p] : llvm::enumerate(perm))
    inverse[p] = int64_t(i);
  return inverse;
}

/// Transpose of the last two dimensions.
static Value transposeLast2(OpBuilder &b, Location loc, Value v) {
  const int64_t rank = cast<RankedTensorType>(v.getType()).getRank();
  SmallVector<int64_t> perm;
  for (int64_t i = 0; i < rank; ++i)
    perm.push_back(i);
  std::swap(perm[rank - 1], perm[rank - 2]);
  return transposeBy(b, loc, v, perm);
}

LogicalResult MatMulOp::buildVJP(OpBuilder &b, ArrayRef<Value> resultGrads,
                                 function_ref<Value(Value)> fwd,
                                 SmallVectorImpl<Value> &operandGrads) {
  Value dy = resultGrads[0];
  Location loc = getLoc();
  if (getPermA() || getPermB()) {
    // Operands read through permutations (nn-fold-transposes, after
    // differentiation; for completeness): the product of the permuted
    // operands, differentiated, its gradients permuted back.
    auto permuted = [&](Value v, std::optional<ArrayRef<int64_t>> perm) {
      return perm ? transposeBy(b, loc, v, *perm) : v;
    };
    auto back = [&](Value g, std::optional<ArrayRef<int64_t>> perm) {
      return perm ? transposeBy(b, loc, g, inversePerm(*perm)) : g;
    };
    Value a = permuted(fwd(getA()), getPermA());
    Value bb = permuted(fwd(getB()), getPermB());
    auto plain =
        MatMulOp::create(b, loc, getOutput().getType(), a, bb, getAlphaAttr(),
                         getTransAAttr(), getTransBAttr(), nullptr, nullptr);
    SmallVector<Value> grads;
    if (failed(plain.buildVJP(
            b, resultGrads, [](Value v) { return v; }, grads)))
      return failure();
    operandGrads.push_back(back(grads[0], getPermA()));
    operandGrads.push_back(back(grads[1], getPermB()));
    plain.erase();
    return success();
  }
  if (getTransA() || getTransB()) {
    // Y = alpha op(A) op(B) (set by nn-fold-transposes, which runs after
    // differentiation; handled for completeness): differentiate the plain
    // product of the transposed operands, then transpose their gradients
    // back.
    Value a = fwd(getA()), bb = fwd(getB());
    Value opA = getTransA() ? transposeLast2(b, loc, a) : a;
    Value opB = getTransB() ? transposeLast2(b, loc, bb) : bb;
    auto plain = MatMulOp::create(b, loc, getOutput().getType(), opA, opB,
                                  getAlphaAttr(), b.getBoolAttr(false),
                                  b.getBoolAttr(false), nullptr, nullptr);
    SmallVector<Value> grads;
    if (failed(plain.buildVJP(
            b, resultGrads, [](Value v) { return v; }, grads)))
      return failure();
    operandGrads.push_back(getTransA() ? transposeLast2(b, loc, grads[0])
                                       : grads[0]);
    operandGrads.push_back(getTransB() ? transposeLast2(b, loc, grads[1])
                                       : grads[1]);
    plain.erase();
    return success();
  }
  auto at = cast<RankedTensorType>(getA().getType());
  auto bt = cast<RankedTensorType>(getB().getType());
  Value a = fwd(getA()), bb = fwd(getB());
  // Y = alpha A B: both gradients carry alpha.
  const float alpha = getAlpha().convertToFloat();
  if (at.getRank() == 2 && bt.getRank() == 2) {
    operandGrads.push_back(gemm(b, loc, at, dy, bb, false, true, alpha));
    operandGrads.push_back(gemm(b, loc, bt, a, dy, true, false, alpha));
    return success();
  }
  // [..., M, K] x [K, N] (a linear layer over a batch of sequences): fold
  // the leading dims into M and use two plain GEMMs.
  if (bt.getRank() == 2) {
    int64_t rows = at.getNumElements() / at.getShape().back();
    auto elem = at.getElementType();
    auto a2 = RankedTensorType::get({rows, at.getShape().back()}, elem);
    auto y2 = RankedTensorType::get({rows, bt.getDimSize(1)}, elem);
    Value dy2 = ReshapeOp::create(b, loc, y2, dy);
    Value aFlat = ReshapeOp::create(b, loc, a2, a);
    Value da2 = gemm(b, loc, a2, dy2, bb, false, true, alpha);
    operandGrads.push_back(ReshapeOp::create(b, loc, at, da2));
    operandGrads.push_back(gemm(b, loc, bt, aFlat, dy2, true, false, alpha));
    return success();
  }
  // dA = sum(dY . B^T), dB = sum(A^T . dY) over broadcast batch dims.
  auto yt = cast<RankedTensorType>(dy.getType());
  auto full = [&](RankedTensorType like) {
    SmallVector<int64_t> shape(yt.getShape().drop_back(2));
    shape.push_back(like.getDimSize(like.getRank() - 2));
    shape.push_back(like.getDimSize(like.getRank() - 1));
    return RankedTensorType::get(shape, like.getElementType());
  };
  auto noTrans = b.getBoolAttr(false);
  Value daFull =
      MatMulOp::create(b, loc, full(at), dy, transposeLast2(b, loc, bb),
                       getAlphaAttr(), noTrans, noTrans, nullptr, nullptr);
  Value dbFull =
      MatMulOp::create(b, loc, full(bt), transposeLast2(b, loc, a), dy,
                       getAlphaAttr(), noTrans, noTrans, nullptr, nullptr);
  operandGrads.push_back(sumTo(b, loc, daFull, at));
  operandGrads.push_back(sumTo(b, loc, dbFull, bt));
  return success();
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

LogicalResult AddOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                              function_ref<Value(Value)>,
                              SmallVectorImpl<Value> &out) {
  out.push_back(sumTo(b, getLoc(), g[0], getLhs().getType()));
  out.push_back(sumTo(b, getLoc(), g[0], getRhs().getType()));
  return success();
}

LogicalResult SubOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                              function_ref<Value(Value)>,
                              SmallVectorImpl<Value> &out) {
  out.push_back(sumTo(b, getLoc(), g[0], getLhs().getType()));
  out.push_back(sumTo(b, getLoc(), g[0], getRhs().getType(), -1.0));
  return success();
}

LogicalResult MulOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                              function_ref<Value(Value)> fwd,
                              SmallVectorImpl<Value> &out) {
  Location loc = getLoc();
  Type yt = g[0].getType();
  Value da = MulOp::create(b, loc, yt, g[0], fwd(getRhs()));
  Value db = MulOp::create(b, loc, yt, g[0], fwd(getLhs()));
  out.push_back(sumTo(b, loc, da, getLhs().getType()));
  out.push_back(sumTo(b, loc, db, getRhs().getType()));
  return success();
}

LogicalResult DivOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                              function_ref<Value(Value)> fwd,
                              SmallVectorImpl<Value> &out) {
  // Y = A / B: dA = dY / B, dB = -dY * Y / B.
  Location loc = getLoc();
  Type yt = g[0].getType();
  Value rhs = fwd(getRhs());
  Value da = DivOp::create(b, loc, yt, g[0], rhs);
  Value dyy = MulOp::create(b, loc, yt, g[0], fwd(getOutput()));
  Value db = DivOp::create(b, loc, yt, dyy, rhs);
  out.push_back(sumTo(b, loc, da, getLhs().getType()));
  out.push_back(sumTo(b, loc, db, getRhs().getType(), -1.0));
  return success();
}

LogicalResult ReluOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                               function_ref<Value(Value)> fwd,
                               SmallVectorImpl<Value> &out) {
  out.push_back(ReluGradOp::create(b, getLoc(), fwd(getInput()), g[0]));
  return success();
}

LogicalResult TanhOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                               function_ref<Value(Value)> fwd,
                               SmallVectorImpl<Value> &out) {
  out.push_back(TanhGradOp::create(b, getLoc(), fwd(getOutput()), g[0]));
  return success();
}

LogicalResult SigmoidOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                  function_ref<Value(Value)> fwd,
                                  SmallVectorImpl<Value> &out) {
  out.push_back(SigmoidGradOp::create(b, getLoc(), fwd(getOutput()), g[0]));
  return success();
}

LogicalResult IdentityOp::buildVJP(OpBuilder &, ArrayRef<Value> g,
                                   function_ref<Value(Value)>,
                                   SmallVectorImpl<Value> &out) {
  out.push_back(g[0]);
  return success();
}

template <typename OpT>
static void softmaxVJP(OpT op, OpBuilder &b, Value dy,
                       function_ref<Value(Value)> fwd,
                       SmallVectorImpl<Value> &out, bool isLog) {
  out.push_back(SoftmaxGradOp::create(
      b, op.getLoc(), op.getOutput().getType(), fwd(op.getOutput()), dy,
      op.getAxisAttr(), op.getCoerce_2dAttr(),
      isLog ? b.getUnitAttr() : UnitAttr()));
}

LogicalResult SoftmaxOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                  function_ref<Value(Value)> fwd,
                                  SmallVectorImpl<Value> &out) {
  softmaxVJP(*this, b, g[0], fwd, out, /*isLog=*/false);
  return success();
}

LogicalResult LogSoftmaxOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                     function_ref<Value(Value)> fwd,
                                     SmallVectorImpl<Value> &out) {
  softmaxVJP(*this, b, g[0], fwd, out, /*isLog=*/true);
  return success();
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

LogicalResult FlattenOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                  function_ref<Value(Value)>,
                                  SmallVectorImpl<Value> &out) {
  out.push_back(ReshapeOp::create(b, getLoc(), getInput().getType(), g[0]));
  return success();
}

LogicalResult ReshapeOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                  function_ref<Value(Value)>,
                                  SmallVectorImpl<Value> &out) {
  out.push_back(ReshapeOp::create(b, getLoc(), getInput().getType(), g[0]));
  return success();
}

LogicalResult TransposeOp::buildVJP(OpBuilder &b, ArrayRef<Value> g,
                                    function_ref<Value(Value)>,
                                    SmallVectorImpl<Value> &out) {
  out.push_back(
      TransposeOp::create(b, getLoc(), getInput().getType(), g[0],
                          b.getDenseI64ArrayAttr(inversePerm(getPerm()))));
  return success();
}

//===----------------------------------------------------------------------===//
// Loss
//===----------------------------------------------------------------------===//

LogicalResult SoftmaxCrossEntropyLossOp::buildVJP(
    OpBuilder &b, ArrayRef<Value> g, function_ref<Value(Value)> fwd,
    SmallVectorImpl<Value> &out) {
  if (g.size() > 1 && g[1])
    return emitOpError("gradient through the log_prob result is not "
                       "supported; use the loss output");
  Value weights = getWeights() ? fwd(getWeights()) : Value();
  out.push_back(SoftmaxCrossEntropyLossGradOp::create(
      b, getLoc(), getScores().getType(), fwd(getScores()), fwd(getLabels()),
      g[0], weights, getReductionAttr(), getIgnoreIndexAttr()));
  out.push_back(Value()); // labels
  if (getWeights())
    out.push_back(Value());
  return success();
}
