//===- KernelCalls.cpp - nn op -> runtime kernel call ---------------------===//
//
// Parameter layouts follow runtime/include/pipec_rt.h exactly; broadcasting
// is made explicit here as element strides (0 along broadcast dimensions).
//
//===----------------------------------------------------------------------===//
#include "passes/KernelCalls.h"

#include "dialects/nn/NNDialect.h"
#include "pipec_rt.h"

#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace pipec;

namespace {

ArrayRef<int64_t> shapeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getShape();
}
int64_t numel(Value v) {
  return cast<RankedTensorType>(v.getType()).getNumElements();
}

/// Element strides of `shape` viewed as right-aligned inside `rank` dims,
/// 0 along dimensions of size 1 (broadcast) or missing.
SmallVector<int64_t> broadcastStrides(ArrayRef<int64_t> shape, int64_t rank,
                                      ArrayRef<int64_t> outShape) {
  SmallVector<int64_t> strides(rank, 0);
  int64_t stride = 1;
  int64_t offset = rank - static_cast<int64_t>(shape.size());
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    bool broadcast = shape[i] == 1 && outShape[offset + i] != 1;
    strides[offset + i] = broadcast ? 0 : stride;
    stride *= shape[i];
  }
  return strides;
}

/// [outer, dim, inner, isLog] of a softmax-like op.
SmallVector<int64_t> softmaxView(ArrayRef<int64_t> shape, int64_t axis,
                                 bool coerce2d, bool isLog) {
  int64_t rank = shape.size();
  axis = nn::normalizeAxis(axis, rank);
  int64_t outer = 1, dim = 1, inner = 1;
  for (int64_t i = 0; i < rank; ++i) {
    if (i < axis)
      outer *= shape[i];
    else if (i == axis || coerce2d)
      dim *= shape[i];
    else
      inner *= shape[i];
  }
  return {outer, dim, inner, isLog ? 1 : 0};
}

KernelCall binary(Operation *op, int64_t opcode) {
  Value a = op->getOperand(0), b = op->getOperand(1), y = op->getResult(0);
  ArrayRef<int64_t> out = shapeOf(y);
  int64_t rank = out.size();
  KernelCall call{"pipec_k_binary", {a, b, y}, {opcode, rank}, {}};
  llvm::append_range(call.ints, out);
  llvm::append_range(call.ints, broadcastStrides(shapeOf(a), rank, out));
  llvm::append_range(call.ints, broadcastStrides(shapeOf(b), rank, out));
  return call;
}

KernelCall unary(Value x, Value y, int64_t opcode, double alpha = 0) {
  return {"pipec_k_unary", {x, y}, {opcode, numel(y)}, {alpha}};
}

KernelCall unaryGrad(Value t, Value dy, Value dx, int64_t opcode) {
  return {"pipec_k_unary_grad", {t, dy, dx}, {opcode, numel(dx)}, {}};
}

KernelCall copy(Value x, Value y) {
  return {"pipec_k_copy", {x, y}, {nn::tensorBytes(y.getType())}, {}};
}

SmallVector<int64_t> lossInts(Value scores, StringRef reduction, Value weights,
                              std::optional<int64_t> ignore) {
  ArrayRef<int64_t> s = shapeOf(scores);
  int64_t d = 1;
  for (int64_t x : s.drop_front(2))
    d *= x;
  int64_t red = reduction == "none" ? 0 : reduction == "mean" ? 1 : 2;
  return {s[0], s[1], d, red, weights ? 1 : 0, ignore ? 1 : 0,
          ignore.value_or(0)};
}

} // namespace

bool pipec::isViewOp(Operation *op) {
  return isa<nn::ReshapeOp, nn::FlattenOp, nn::IdentityOp>(op);
}

FailureOr<KernelCall> pipec::getKernelCall(Operation *op) {
  using namespace nn;
  std::optional<KernelCall> call =
      llvm::TypeSwitch<Operation *, std::optional<KernelCall>>(op)
          .Case([](GemmOp g) -> std::optional<KernelCall> {
            auto a = shapeOf(g.getA());
            auto y = shapeOf(g.getOutput());
            int64_t m = y[0], n = y[1], k = g.getTransA() ? a[0] : a[1];
            int64_t cm = 0, cn = 0;
            if (g.getC()) {
              auto c = shapeOf(g.getC());
              int64_t dm = c.size() == 2 ? c[0] : 1;
              int64_t dn = c.empty() ? 1 : c.back();
              cn = dn == 1 ? 0 : 1;
              cm = dm == 1 ? 0 : dn;
            }
            return KernelCall{"pipec_k_gemm",
                              {g.getA(), g.getB(), g.getC(), g.getOutput()},
                              {m, n, k, g.getTransA() ? 1 : 0,
                               g.getTransB() ? 1 : 0, g.getC() ? 1 : 0, cm, cn},
                              {g.getAlpha().convertToDouble(),
                               g.getBeta().convertToDouble()}};
          })
          .Case([](MatMulOp mm) -> std::optional<KernelCall> {
            auto a = shapeOf(mm.getA()), b = shapeOf(mm.getB());
            auto y = shapeOf(mm.getOutput());
            int64_t nb = y.size() - 2;
            ArrayRef<int64_t> batch = y.drop_back(2);
            // Batch strides of A and B in elements (0 where broadcast).
            auto batchStrides = [&](ArrayRef<int64_t> s) {
              SmallVector<int64_t> dims(s.drop_back(2));
              SmallVector<int64_t> st =
                  broadcastStrides(dims, nb, batch);
              int64_t mat = s[s.size() - 2] * s.back();
              for (int64_t &x : st)
                x *= mat;
              return st;
            };
            KernelCall c{"pipec_k_batch_matmul",
                         {mm.getA(), mm.getB(), mm.getOutput()}, {nb}, {1.0}};
            llvm::append_range(c.ints, batch);
            llvm::append_range(c.ints, batchStrides(a));
            llvm::append_range(c.ints, batchStrides(b));
            c.ints.append({y[nb], y[nb + 1], a.back(), 0, 0});
            return c;
          })
          .Case([](AddOp o) { return binary(o, PIPEC_BIN_ADD); })
          .Case([](SubOp o) { return binary(o, PIPEC_BIN_SUB); })
          .Case([](MulOp o) { return binary(o, PIPEC_BIN_MUL); })
          .Case([](DivOp o) { return binary(o, PIPEC_BIN_DIV); })
          .Case([](ReluOp o) {
            return unary(o.getInput(), o.getOutput(), PIPEC_UN_RELU);
          })
          .Case([](TanhOp o) {
            return unary(o.getInput(), o.getOutput(), PIPEC_UN_TANH);
          })
          .Case([](SigmoidOp o) {
            return unary(o.getInput(), o.getOutput(), PIPEC_UN_SIGMOID);
          })
          .Case([](ScaleOp o) {
            return unary(o.getInput(), o.getOutput(), PIPEC_UN_SCALE,
                         o.getFactor().convertToDouble());
          })
          .Case([](ReluGradOp o) {
            return unaryGrad(o.getForward(), o.getGrad(), o.getOutput(),
                             PIPEC_UN_RELU);
          })
          .Case([](TanhGradOp o) {
            return unaryGrad(o.getForward(), o.getGrad(), o.getOutput(),
                             PIPEC_UN_TANH);
          })
          .Case([](SigmoidGradOp o) {
            return unaryGrad(o.getForward(), o.getGrad(), o.getOutput(),
                             PIPEC_UN_SIGMOID);
          })
          .Case([](SoftmaxOp o) {
            return KernelCall{"pipec_k_softmax",
                              {o.getInput(), o.getOutput()},
                              softmaxView(shapeOf(o.getInput()), o.getAxis(),
                                          o.getCoerce_2d(), false),
                              {}};
          })
          .Case([](LogSoftmaxOp o) {
            return KernelCall{"pipec_k_softmax",
                              {o.getInput(), o.getOutput()},
                              softmaxView(shapeOf(o.getInput()), o.getAxis(),
                                          o.getCoerce_2d(), true),
                              {}};
          })
          .Case([](SoftmaxGradOp o) {
            return KernelCall{"pipec_k_softmax_grad",
                              {o.getOutputValue(), o.getGrad(), o.getOutput()},
                              softmaxView(shapeOf(o.getOutput()), o.getAxis(),
                                          o.getCoerce_2d(), o.getLog()),
                              {}};
          })
          .Case([](SumToShapeOp o) {
            auto x = shapeOf(o.getInput());
            KernelCall c{"pipec_k_reduce_sum",
                         {o.getInput(), o.getOutput()},
                         {static_cast<int64_t>(x.size())},
                         {o.getScale().convertToDouble()}};
            llvm::append_range(c.ints, x);
            // Y's strides for each X dimension (0 where summed).
            auto y = shapeOf(o.getOutput());
            SmallVector<int64_t> st(x.size(), 0);
            int64_t stride = 1, offset = x.size() - y.size();
            for (int64_t i = static_cast<int64_t>(y.size()) - 1; i >= 0; --i) {
              st[offset + i] = (y[i] == 1 && x[offset + i] != 1) ? 0 : stride;
              stride *= y[i];
            }
            llvm::append_range(c.ints, st);
            return c;
          })
          .Case([](TransposeOp o) {
            auto x = shapeOf(o.getInput());
            KernelCall c{"pipec_k_transpose",
                         {o.getInput(), o.getOutput()},
                         {static_cast<int64_t>(x.size())},
                         {}};
            llvm::append_range(c.ints, x);
            llvm::append_range(c.ints, o.getPerm());
            return c;
          })
          .Case([](ReshapeOp o) { return copy(o.getInput(), o.getOutput()); })
          .Case([](FlattenOp o) { return copy(o.getInput(), o.getOutput()); })
          .Case([](IdentityOp o) { return copy(o.getInput(), o.getOutput()); })
          .Case([](SoftmaxCrossEntropyLossOp o) {
            return KernelCall{
                "pipec_k_sce_loss",
                {o.getScores(), o.getLabels(), o.getWeights(), o.getLoss(),
                 o.getLogProb()},
                lossInts(o.getScores(), o.getReduction(), o.getWeights(),
                         o.getIgnoreIndex()),
                {}};
          })
          .Case([](SoftmaxCrossEntropyLossGradOp o) {
            return KernelCall{
                "pipec_k_sce_loss_grad",
                {o.getScores(), o.getLabels(), o.getWeights(), o.getLossGrad(),
                 o.getOutput()},
                lossInts(o.getScores(), o.getReduction(), o.getWeights(),
                         o.getIgnoreIndex()),
                {}};
          })
          .Case([](SgdUpdateOp o) {
            return KernelCall{"pipec_k_sgd",
                              {o.getWeight(), o.getGrad(), o.getLr(),
                               o.getOutput()},
                              {numel(o.getOutput())},
                              {}};
          })
          .Case([](MomentumOp o) {
            return KernelCall{"pipec_k_momentum",
                              {o.getR(), o.getT(), o.getX(), o.getG(),
                               o.getV(), o.getXNew(), o.getVNew()},
                              {numel(o.getX()), o.getMode() == "nesterov"},
                              {o.getAlpha().convertToDouble(),
                               o.getBeta().convertToDouble(),
                               o.getNormCoefficient().convertToDouble()}};
          })
          .Case([](AdamOp o) {
            return KernelCall{
                "pipec_k_adam",
                {o.getR(), o.getT(), o.getX(), o.getG(), o.getV(), o.getH(),
                 o.getXNew(), o.getVNew(), o.getHNew()},
                {numel(o.getX())},
                {o.getAlpha().convertToDouble(), o.getBeta().convertToDouble(),
                 o.getNormCoefficient().convertToDouble(),
                 o.getNormCoefficientPost().convertToDouble(),
                 o.getEpsilon().convertToDouble()}};
          })
          .Case([](AdagradOp o) {
            return KernelCall{"pipec_k_adagrad",
                              {o.getR(), o.getT(), o.getX(), o.getG(),
                               o.getH(), o.getXNew(), o.getHNew()},
                              {numel(o.getX())},
                              {o.getDecayFactor().convertToDouble(),
                               o.getEpsilon().convertToDouble(),
                               o.getNormCoefficient().convertToDouble()}};
          })
          .Case([](FillOp o) {
            return KernelCall{"pipec_k_fill",
                              {o.getOutput()},
                              {numel(o.getOutput())},
                              {o.getValue().convertToDouble()}};
          })
          .Default([](Operation *) { return std::nullopt; });
  if (!call) {
    op->emitError("no runtime kernel implements '") << op->getName() << "'";
    return failure();
  }
  return *call;
}
