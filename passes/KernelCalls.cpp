//===- KernelCalls.cpp - nn op -> runtime kernel call ---------------------===//
//
// Parameter layouts follow runtime/include/pipec_rt.h exactly; broadcasting
// is made explicit here as element strides (0 along broadcast dimensions).
//
//===----------------------------------------------------------------------===//
#include "passes/KernelCalls.h"
#include "passes/PassUtils.h"

#include "dialects/nn/NNDialect.h"
#include "pipec_rt.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace pipec;

namespace {

Type elementTypeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getElementType();
}
ArrayRef<int64_t> shapeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getShape();
}
int64_t numel(Value v) {
  return cast<RankedTensorType>(v.getType()).getNumElements();
}

/// Element strides of a dense row-major tensor of `shape`.
SmallVector<int64_t> contiguousStrides(ArrayRef<int64_t> shape) {
  SmallVector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i)
    strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
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

/// Kernels of the CNN/transformer ops (NNLayerOps.td); nullopt for others.
static std::optional<SmallVector<KernelCall, 1>> layerKernelCalls(Operation *op);

/// The calls as the float32 kernels name them.
static FailureOr<SmallVector<KernelCall, 1>> kernelCallsOf(Operation *op);

/// The runtime's kernels, from the list they are declared and registered
/// from: the op-to-kernel table here is checked against it.
static bool isRuntimeKernel(StringRef name) {
  static const llvm::StringSet<> kernels = {
#define PIPEC_KERNEL(sym) #sym,
#include "pipec_kernels.def"
  };
  return kernels.contains(name);
}

bool pipec::hasBf16Variant(StringRef kernel) {
  static const llvm::StringSet<> kernels = {
#define PIPEC_KERNEL(sym)
#define PIPEC_KERNEL_BF16(sym) #sym,
#include "pipec_kernels.def"
  };
  return kernels.contains(kernel);
}

/// A call with a bfloat16 tensor (--activations bf16) goes to the kernel's
/// `_bf16` variant, its ints prefixed by which buffers are bfloat16 inputs
/// and outputs (include/pipec_rt.h, "Bfloat16 storage"). nn.cast converts
/// bfloat16 itself and pipec_k_copy moves bytes.
static LogicalResult useBf16Variant(Operation *op, KernelCall &call) {
  auto isBf16 = [](Value v) { return v && elementTypeOf(v).isBF16(); };
  if (call.kernel == "pipec_k_cast" || call.kernel == "pipec_k_copy" ||
      llvm::none_of(call.buffers, isBf16))
    return success();
  if (!hasBf16Variant(call.kernel))
    return op->emitError("internal error: '")
           << op->getName() << "' reads or writes a bfloat16 tensor, but "
           << call.kernel
           << " has no bfloat16 variant (PIPEC_KERNEL_BF16 in "
              "runtime/include/pipec_kernels.def)";
  SmallVector<int64_t> prefix{int64_t(call.buffers.size())};
  for (Value v : call.buffers)
    prefix.push_back(!isBf16(v)                  ? 0
                     : v.getDefiningOp() == op ? -numel(v)
                                               : numel(v));
  call.ints.insert(call.ints.begin(), prefix.begin(), prefix.end());
  call.kernel += "_bf16";
  return success();
}

FailureOr<SmallVector<KernelCall, 1>> pipec::getKernelCalls(Operation *op) {
  auto calls = kernelCallsOf(op);
  if (failed(calls))
    return failure();
  for (const KernelCall &call : *calls)
    if (!isRuntimeKernel(call.kernel))
      return op->emitError("internal error: '")
             << op->getName() << "' lowers to " << call.kernel
             << ", which runtime/include/pipec_kernels.def does not list";
  for (KernelCall &call : *calls)
    if (failed(useBf16Variant(op, call)))
      return failure();
  // A call with a float64 tensor goes to the kernel's float64 twin (same
  // layout; pipec_kernels.def). pipec_k_copy moves bytes of any type. Its
  // real parameters that are float32 values (the ops' f32 attributes:
  // epsilon, momentum, alpha) are read as the literals they stand for.
  for (KernelCall &call : *calls)
    if (call.kernel != "pipec_k_copy" &&
        llvm::any_of(call.buffers, [](Value v) {
          return v && cast<RankedTensorType>(v.getType())
                          .getElementType()
                          .isF64();
        })) {
      call.kernel += "_f64";
      for (double &r : call.reals)
        if (double(float(r)) == r)
          r = literalValue(float(r));
    }
  return calls;
}

/// Gemm and MatMul.
static std::optional<KernelCall> matmulKernelCall(Operation *op) {
  using namespace nn;
  return llvm::TypeSwitch<Operation *, std::optional<KernelCall>>(op)
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
        return KernelCall{
            "pipec_k_gemm",
            {g.getA(), g.getB(), g.getC(), g.getOutput()},
            {m, n, k, g.getTransA() ? 1 : 0, g.getTransB() ? 1 : 0,
             g.getC() ? 1 : 0, cm, cn},
            {g.getAlpha().convertToDouble(), g.getBeta().convertToDouble()}};
      })
      .Case([](MatMulOp mm) -> std::optional<KernelCall> {
        // The operands as read (through perm_a / perm_b).
        SmallVector<int64_t> a = mm.operandShape(0), b = mm.operandShape(1);
        auto y = shapeOf(mm.getOutput());
        int64_t nb = y.size() - 2;
        ArrayRef<int64_t> batch = y.drop_back(2);
        // An operand's strides in elements as read: its stored (dense)
        // strides, permuted by perm_a / perm_b.
        auto viewStrides = [](Value v, std::optional<ArrayRef<int64_t>> perm) {
          SmallVector<int64_t> dense = contiguousStrides(shapeOf(v));
          if (!perm)
            return dense;
          SmallVector<int64_t> view;
          for (int64_t p : *perm)
            view.push_back(dense[p]);
          return view;
        };
        // Batch strides of A and B in elements (0 where broadcast), aligned
        // to Y's batch dimensions from the right.
        auto batchStrides = [&](ArrayRef<int64_t> s, ArrayRef<int64_t> st) {
          SmallVector<int64_t> out(nb, 0);
          const int64_t ob = int64_t(s.size()) - 2, offset = nb - ob;
          for (int64_t i = 0; i < ob; ++i)
            out[offset + i] = s[i] == 1 && batch[offset + i] != 1 ? 0 : st[i];
          return out;
        };
        SmallVector<int64_t> as = viewStrides(mm.getA(), mm.getPermA());
        SmallVector<int64_t> bs = viewStrides(mm.getB(), mm.getPermB());
        KernelCall c{"pipec_k_batch_matmul",
                     {mm.getA(), mm.getB(), mm.getOutput()},
                     {nb},
                     {mm.getAlpha().convertToDouble()}};
        llvm::append_range(c.ints, batch);
        llvm::append_range(c.ints, batchStrides(a, as));
        llvm::append_range(c.ints, batchStrides(b, bs));
        // K is the inner dimension of op(A) (nn-fold-transposes).
        const bool ta = mm.getTransA(), tb = mm.getTransB();
        int64_t k = ta ? a[a.size() - 2] : a.back();
        // The leading dimensions: the stride between the rows of A's and
        // B's stored matrices (their row count apart when dense).
        c.ints.append({y[nb], y[nb + 1], k, ta ? 1 : 0, tb ? 1 : 0,
                       as[as.size() - 2], bs[bs.size() - 2]});
        return c;
      })
      .Default([](Operation *) { return std::nullopt; });
}

/// The MLP ops of NNOps.td: arithmetic, activations, softmax, reductions onto
/// a shape, transposes and views.
static std::optional<KernelCall> mlpKernelCall(Operation *op) {
  using namespace nn;
  return llvm::TypeSwitch<Operation *, std::optional<KernelCall>>(op)
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
      .Default([](Operation *) { return std::nullopt; });
}

/// The loss and the optimizers (ONNX training operators), and fills.
static std::optional<KernelCall> trainingKernelCall(Operation *op) {
  using namespace nn;
  return llvm::TypeSwitch<Operation *, std::optional<KernelCall>>(op)
      .Case([](SoftmaxCrossEntropyLossOp o) {
        return KernelCall{"pipec_k_sce_loss",
                          {o.getScores(), o.getLabels(), o.getWeights(),
                           o.getLoss(), o.getLogProb()},
                          lossInts(o.getScores(), o.getReduction(),
                                   o.getWeights(), o.getIgnoreIndex()),
                          {}};
      })
      .Case([](SoftmaxCrossEntropyLossGradOp o) {
        return KernelCall{"pipec_k_sce_loss_grad",
                          {o.getScores(), o.getLabels(), o.getWeights(),
                           o.getLossGrad(), o.getOutput()},
                          lossInts(o.getScores(), o.getReduction(),
                                   o.getWeights(), o.getIgnoreIndex()),
                          {}};
      })
      .Case([](SgdUpdateOp o) {
        return KernelCall{
            "pipec_k_sgd",
            {o.getWeight(), o.getGrad(), o.getLr(), o.getOutput()},
            {numel(o.getOutput())},
            {}};
      })
      .Case([](MomentumOp o) {
        return KernelCall{"pipec_k_momentum",
                          {o.getR(), o.getT(), o.getX(), o.getG(), o.getV(),
                           o.getXNew(), o.getVNew()},
                          {numel(o.getX()), o.getMode() == "nesterov"},
                          {o.getAlpha().convertToDouble(),
                           o.getBeta().convertToDouble(),
                           o.getNormCoefficient().convertToDouble()}};
      })
      .Case([](AdamOp o) {
        return KernelCall{"pipec_k_adam",
                          {o.getR(), o.getT(), o.getX(), o.getG(), o.getV(),
                           o.getH(), o.getXNew(), o.getVNew(), o.getHNew()},
                          {numel(o.getX())},
                          {o.getAlpha().convertToDouble(),
                           o.getBeta().convertToDouble(),
                           o.getNormCoefficient().convertToDouble(),
                           o.getNormCoefficientPost().convertToDouble(),
                           o.getEpsilon().convertToDouble()}};
      })
      .Case([](AdagradOp o) {
        return KernelCall{"pipec_k_adagrad",
                          {o.getR(), o.getT(), o.getX(), o.getG(), o.getH(),
                           o.getXNew(), o.getHNew()},
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
}

static FailureOr<SmallVector<KernelCall, 1>> kernelCallsOf(Operation *op) {
  if (auto calls = layerKernelCalls(op))
    return *calls;
  for (auto family : {matmulKernelCall, mlpKernelCall, trainingKernelCall})
    if (std::optional<KernelCall> call = family(op))
      return SmallVector<KernelCall, 1>{*call};
  op->emitError("no runtime kernel implements '") << op->getName() << "'";
  return failure();
}

//===----------------------------------------------------------------------===//
// CNN and transformer ops
//===----------------------------------------------------------------------===//

namespace {

/// pipec_k_strided_copy of `dims` elements.
KernelCall stridedCopy(Value src, Value dst, ArrayRef<int64_t> dims,
                       ArrayRef<int64_t> srcStrides, int64_t srcOffset,
                       ArrayRef<int64_t> dstStrides, int64_t dstOffset,
                       bool accumulate) {
  KernelCall c{"pipec_k_strided_copy", {src, dst},
               {static_cast<int64_t>(dims.size())}, {}};
  llvm::append_range(c.ints, dims);
  llvm::append_range(c.ints, srcStrides);
  c.ints.push_back(srcOffset);
  llvm::append_range(c.ints, dstStrides);
  c.ints.push_back(dstOffset);
  c.ints.push_back(accumulate ? 1 : 0);
  return c;
}

/// [N, C, H, W, M, kH, kW, oH, oW, sH, sW, padTop, padLeft, dH, dW, group,
/// hasBias] of a convolution given X, W and Y shapes.
SmallVector<int64_t> convInts(ArrayRef<int64_t> x, ArrayRef<int64_t> w,
                              ArrayRef<int64_t> y, ArrayRef<int64_t> strides,
                              ArrayRef<int64_t> pads,
                              ArrayRef<int64_t> dilations, int64_t group,
                              bool hasBias) {
  return {x[0],       x[1],       x[2],    x[3],    w[0],   w[2],
          w[3],       y[2],       y[3],    strides[0], strides[1], pads[0],
          pads[1],    dilations[0], dilations[1], group, hasBias ? 1 : 0};
}

int64_t unaryOpcode(StringRef kind) {
  return llvm::StringSwitch<int64_t>(kind)
      .Case("erf", PIPEC_UN_ERF)
      .Case("gelu", PIPEC_UN_GELU)
      .Case("sqrt", PIPEC_UN_SQRT)
      .Case("exp", PIPEC_UN_EXP)
      .Case("log", PIPEC_UN_LOG)
      .Case("neg", PIPEC_UN_NEG)
      .Case("abs", PIPEC_UN_ABS)
      .Case("reciprocal", PIPEC_UN_RECIPROCAL)
      .Case("leaky_relu", PIPEC_UN_LEAKY_RELU)
      .Case("clip", PIPEC_UN_CLIP)
      .Case("pow_scalar", PIPEC_UN_POW_SCALAR)
      .Default(-1);
}

/// [outer, axisDim, inner] of data viewed around a gather axis.
SmallVector<int64_t> gatherInts(ArrayRef<int64_t> data, int64_t axis) {
  int64_t rank = data.size();
  if (axis < 0)
    axis += rank;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i)
    outer *= data[i];
  for (int64_t i = axis + 1; i < rank; ++i)
    inner *= data[i];
  return {outer, data[axis], inner};
}

KernelCall unaryOp(Operation *op, int64_t opcode, double alpha = 0,
                   double beta = 0) {
  return {"pipec_k_unary",
          {op->getOperand(0), op->getResult(0)},
          {opcode, numel(op->getResult(0))},
          {alpha, beta}};
}

} // namespace

/// nn.resize_linear's coordinate_mode as the kernel's PIPEC_RESIZE_* code.
static int64_t resizeMode(StringRef mode) {
  return mode == "pytorch_half_pixel" ? PIPEC_RESIZE_PYTORCH_HALF_PIXEL
         : mode == "align_corners"    ? PIPEC_RESIZE_ALIGN_CORNERS
         : mode == "asymmetric"       ? PIPEC_RESIZE_ASYMMETRIC
                                      : PIPEC_RESIZE_HALF_PIXEL;
}

/// Elementwise ops, comparisons, selection, casts and their gradients.
static std::optional<SmallVector<KernelCall, 1>>
elementwiseKernelCalls(Operation *op) {
  using namespace nn;
  using Calls = SmallVector<KernelCall, 1>;
  return llvm::TypeSwitch<Operation *, std::optional<Calls>>(op)
      .Case([](DropoutOp o) {
        auto x = shapeOf(o.getInput());
        int64_t sample = x.empty() || x[0] == 0 ? 1 : numel(o.getInput()) / x[0];
        return Calls{KernelCall{"pipec_k_dropout",
                                {o.getInput(), o.getRng(), o.getOutput(),
                                 o.getMask()},
                                {numel(o.getInput()), sample,
                                 static_cast<int64_t>(o.getSalt())},
                                {o.getRatio().convertToDouble()}}};
      })
      .Case([](ErfOp o) { return Calls{unaryOp(o, PIPEC_UN_ERF)}; })
      .Case([](GeluOp o) { return Calls{unaryOp(o, PIPEC_UN_GELU)}; })
      .Case([](SqrtOp o) { return Calls{unaryOp(o, PIPEC_UN_SQRT)}; })
      .Case([](ExpOp o) { return Calls{unaryOp(o, PIPEC_UN_EXP)}; })
      .Case([](LogOp o) { return Calls{unaryOp(o, PIPEC_UN_LOG)}; })
      .Case([](NegOp o) { return Calls{unaryOp(o, PIPEC_UN_NEG)}; })
      .Case([](AbsOp o) { return Calls{unaryOp(o, PIPEC_UN_ABS)}; })
      .Case(
          [](ReciprocalOp o) { return Calls{unaryOp(o, PIPEC_UN_RECIPROCAL)}; })
      .Case([](LeakyReluOp o) {
        return Calls{unaryOp(o, PIPEC_UN_LEAKY_RELU,
                             o.getAlpha().convertToDouble())};
      })
      .Case([](ClipOp o) {
        return Calls{unaryOp(o, PIPEC_UN_CLIP, o.getMin().convertToDouble(),
                             o.getMax().convertToDouble())};
      })
      .Case([](PowScalarOp o) {
        return Calls{unaryOp(o, PIPEC_UN_POW_SCALAR,
                             o.getExponent().convertToDouble())};
      })
      .Case([](CompareOp o) {
        int64_t pred = llvm::StringSwitch<int64_t>(o.getPredicate())
                           .Case("eq", PIPEC_CMP_EQ)
                           .Case("ne", PIPEC_CMP_NE)
                           .Case("lt", PIPEC_CMP_LT)
                           .Case("gt", PIPEC_CMP_GT)
                           .Case("le", PIPEC_CMP_LE)
                           .Default(PIPEC_CMP_GE);
        KernelCall c = binary(o, pred);
        c.kernel = "pipec_k_compare";
        c.ints.push_back(elementTypeOf(o.getLhs()).isInteger(64) ? 1 : 0);
        return Calls{c};
      })
      .Case([](WhereOp o) {
        ArrayRef<int64_t> out = shapeOf(o.getOutput());
        int64_t rank = out.size();
        KernelCall c{"pipec_k_where",
                     {o.getCondition(), o.getX(), o.getY(), o.getOutput()},
                     {elementTypeOf(o.getOutput()).isInteger(64) ? 1 : 0, rank},
                     {}};
        llvm::append_range(c.ints, out);
        for (Value v : {o.getCondition(), o.getX(), o.getY()})
          llvm::append_range(c.ints, broadcastStrides(shapeOf(v), rank, out));
        return Calls{c};
      })
      .Case([](CastOp o) {
        bool fromInt = elementTypeOf(o.getInput()).isInteger(64);
        bool toInt = elementTypeOf(o.getOutput()).isInteger(64);
        bool fromBf16 = elementTypeOf(o.getInput()).isBF16();
        bool toBf16 = elementTypeOf(o.getOutput()).isBF16();
        if (fromBf16 != toBf16)
          return Calls{KernelCall{
              "pipec_k_cast",
              {o.getInput(), o.getOutput()},
              {toBf16 ? PIPEC_CAST_F32_TO_BF16 : PIPEC_CAST_BF16_TO_F32,
               numel(o.getOutput())},
              {}}};
        if (fromInt == toInt)
          return Calls{copy(o.getInput(), o.getOutput())};
        return Calls{KernelCall{"pipec_k_cast",
                                {o.getInput(), o.getOutput()},
                                {toInt ? PIPEC_CAST_F32_TO_I64
                                       : PIPEC_CAST_I64_TO_F32,
                                 numel(o.getOutput())},
                                {}}};
      })
      .Case([](PowOp o) { return Calls{binary(o, PIPEC_BIN_POW)}; })
      .Case([](MaxOp o) { return Calls{binary(o, PIPEC_BIN_MAX)}; })
      .Case([](MinOp o) { return Calls{binary(o, PIPEC_BIN_MIN)}; })
      .Case([](UnaryGradOp o) {
        return Calls{KernelCall{"pipec_k_unary_grad",
                                {o.getForward(), o.getGrad(), o.getOutput()},
                                {unaryOpcode(o.getKind()), numel(o.getOutput())},
                                {o.getAlpha().convertToDouble(),
                                 o.getBeta().convertToDouble()}}};
      })
      .Case([](BinaryGradOp o) {
        ArrayRef<int64_t> out = shapeOf(o.getGrad());
        int64_t rank = out.size();
        int64_t opcode = o.getKind() == "pow"   ? PIPEC_BIN_POW
                         : o.getKind() == "max" ? PIPEC_BIN_MAX
                                                : PIPEC_BIN_MIN;
        KernelCall c{"pipec_k_binary_grad",
                     {o.getLhs(), o.getRhs(), o.getGrad(), o.getLhsGrad(),
                      o.getRhsGrad()},
                     {opcode, rank},
                     {}};
        llvm::append_range(c.ints, out);
        llvm::append_range(c.ints, broadcastStrides(shapeOf(o.getLhs()), rank, out));
        llvm::append_range(c.ints, broadcastStrides(shapeOf(o.getRhs()), rank, out));
        return Calls{c};
      })
      .Default([](Operation *) { return std::nullopt; });
}

/// Convolutions, pooling and resizing, forward and backward.
static std::optional<SmallVector<KernelCall, 1>>
convPoolKernelCalls(Operation *op) {
  using namespace nn;
  using Calls = SmallVector<KernelCall, 1>;
  return llvm::TypeSwitch<Operation *, std::optional<Calls>>(op)
      .Case([](ConvOp o) {
        return Calls{KernelCall{
            "pipec_k_conv2d",
            {o.getInput(), o.getWeight(), o.getBias(), o.getOutput()},
            convInts(shapeOf(o.getInput()), shapeOf(o.getWeight()),
                     shapeOf(o.getOutput()), o.getStrides(), o.getPads(),
                     o.getDilations(), o.getGroup(), o.getBias() != nullptr),
            {}}};
      })
      .Case([](ConvGradInputOp o) {
        return Calls{KernelCall{
            "pipec_k_conv2d_grad_input",
            {o.getGrad(), o.getOther(), o.getOutput()},
            convInts(shapeOf(o.getOutput()), shapeOf(o.getOther()),
                     shapeOf(o.getGrad()), o.getStrides(), o.getPads(),
                     o.getDilations(), o.getGroup(), false),
            {}}};
      })
      .Case([](ConvGradWeightOp o) {
        return Calls{KernelCall{
            "pipec_k_conv2d_grad_weight",
            {o.getGrad(), o.getOther(), o.getOutput()},
            convInts(shapeOf(o.getOther()), shapeOf(o.getOutput()),
                     shapeOf(o.getGrad()), o.getStrides(), o.getPads(),
                     o.getDilations(), o.getGroup(), false),
            {}}};
      })
      .Case([](MaxPoolOp o) {
        auto x = shapeOf(o.getInput()), y = shapeOf(o.getOutput());
        auto k = o.getKernel(), s = o.getStrides(), p = o.getPads(),
             d = o.getDilations();
        return Calls{KernelCall{"pipec_k_maxpool2d",
                                {o.getInput(), o.getOutput(), o.getIndices()},
                                {x[0], x[1], x[2], x[3], k[0], k[1], y[2], y[3],
                                 s[0], s[1], p[0], p[1], d[0], d[1]},
                                {}}};
      })
      .Case([](MaxPoolGradOp o) {
        return Calls{KernelCall{"pipec_k_maxpool2d_grad",
                                {o.getGrad(), o.getIndices(), o.getOutput()},
                                {numel(o.getOutput()), numel(o.getGrad())},
                                {}}};
      })
      .Case([](AveragePoolOp o) {
        auto x = shapeOf(o.getInput()), y = shapeOf(o.getOutput());
        auto k = o.getKernel(), s = o.getStrides(), p = o.getPads();
        return Calls{KernelCall{"pipec_k_avgpool2d",
                                {o.getInput(), o.getOutput()},
                                {x[0], x[1], x[2], x[3], k[0], k[1], y[2], y[3],
                                 s[0], s[1], p[0], p[1],
                                 o.getCountIncludePad() ? 1 : 0},
                                {}}};
      })
      .Case([](AveragePoolGradOp o) {
        auto x = shapeOf(o.getOutput()), y = shapeOf(o.getGrad());
        auto k = o.getKernel(), s = o.getStrides(), p = o.getPads();
        return Calls{KernelCall{"pipec_k_avgpool2d_grad",
                                {o.getGrad(), o.getOutput()},
                                {x[0], x[1], x[2], x[3], k[0], k[1], y[2], y[3],
                                 s[0], s[1], p[0], p[1],
                                 o.getCountIncludePad() ? 1 : 0},
                                {}}};
      })
      .Case([](ResizeLinearOp o) {
        auto x = shapeOf(o.getInput()), y = shapeOf(o.getOutput());
        return Calls{KernelCall{"pipec_k_resize_linear",
                                {o.getInput(), o.getOutput()},
                                {x[0], x[1], x[2], x[3], y[2], y[3],
                                 resizeMode(o.getCoordinateMode())},
                                {o.getScales()[0], o.getScales()[1]}}};
      })
      .Case([](ResizeLinearGradOp o) {
        auto x = shapeOf(o.getOutput()), y = shapeOf(o.getGrad());
        return Calls{KernelCall{"pipec_k_resize_linear_grad",
                                {o.getGrad(), o.getOutput()},
                                {x[0], x[1], x[2], x[3], y[2], y[3],
                                 resizeMode(o.getCoordinateMode())},
                                {o.getScales()[0], o.getScales()[1]}}};
      })
      .Default([](Operation *) { return std::nullopt; });
}

/// Batch and layer normalisation, forward and backward.
static std::optional<SmallVector<KernelCall, 1>>
normKernelCalls(Operation *op) {
  using namespace nn;
  using Calls = SmallVector<KernelCall, 1>;
  return llvm::TypeSwitch<Operation *, std::optional<Calls>>(op)
      .Case([](BatchNormOp o) {
        auto x = shapeOf(o.getInput());
        int64_t spatial = 1;
        for (int64_t d : x.drop_front(2))
          spatial *= d;
        return Calls{KernelCall{
            "pipec_k_batchnorm_train",
            {o.getInput(), o.getScale(), o.getBias(), o.getRunningMean(),
             o.getRunningVar(), o.getOutput(), o.getSavedMean(),
             o.getSavedInvStd(), o.getNewRunningMean(), o.getNewRunningVar()},
            {x[0], x[1], spatial},
            {o.getEpsilon().convertToDouble(), o.getMomentum().convertToDouble()}}};
      })
      .Case([](BatchNormInferenceOp o) {
        auto x = shapeOf(o.getInput());
        int64_t spatial = 1;
        for (int64_t d : x.drop_front(2))
          spatial *= d;
        return Calls{KernelCall{"pipec_k_batchnorm_infer",
                                {o.getInput(), o.getScale(), o.getBias(),
                                 o.getMean(), o.getVar(), o.getOutput()},
                                {x[0], x[1], spatial},
                                {o.getEpsilon().convertToDouble()}}};
      })
      .Case([](BatchNormGradOp o) {
        auto x = shapeOf(o.getInput());
        int64_t spatial = 1;
        for (int64_t d : x.drop_front(2))
          spatial *= d;
        return Calls{KernelCall{
            "pipec_k_batchnorm_grad",
            {o.getInput(), o.getScale(), o.getSavedMean(), o.getSavedInvStd(),
             o.getGrad(), o.getInputGrad(), o.getScaleGrad(), o.getBiasGrad()},
            {x[0], x[1], spatial},
            {}}};
      })
      .Case([](LayerNormOp o) {
        int64_t outer = numel(o.getMean());
        return Calls{KernelCall{"pipec_k_layernorm",
                                {o.getInput(), o.getScale(), o.getBias(),
                                 o.getOutput(), o.getMean(), o.getInvStd()},
                                {outer, numel(o.getInput()) / outer},
                                {o.getEpsilon().convertToDouble()}}};
      })
      .Case([](LayerNormGradOp o) {
        int64_t outer = numel(o.getMean());
        return Calls{KernelCall{
            "pipec_k_layernorm_grad",
            {o.getInput(), o.getScale(), o.getMean(), o.getInvStd(),
             o.getGrad(), o.getInputGrad(), o.getScaleGrad(), o.getBiasGrad()},
            {outer, numel(o.getInput()) / outer},
            {}}};
      })
      .Default([](Operation *) { return std::nullopt; });
}

/// Data movement: gather, broadcast, concatenation, slices.
static std::optional<SmallVector<KernelCall, 1>>
movementKernelCalls(Operation *op) {
  using namespace nn;
  using Calls = SmallVector<KernelCall, 1>;
  return llvm::TypeSwitch<Operation *, std::optional<Calls>>(op)
      .Case([](GatherOp o) {
        SmallVector<int64_t> ints = gatherInts(shapeOf(o.getData()), o.getAxis());
        ints.push_back(numel(o.getIndices()));
        return Calls{KernelCall{"pipec_k_gather",
                                {o.getData(), o.getIndices(), o.getOutput()},
                                ints,
                                {}}};
      })
      .Case([](GatherGradOp o) {
        SmallVector<int64_t> ints = gatherInts(shapeOf(o.getOutput()), o.getAxis());
        ints.push_back(numel(o.getIndices()));
        return Calls{KernelCall{"pipec_k_gather_grad",
                                {o.getGrad(), o.getIndices(), o.getOutput()},
                                ints,
                                {}}};
      })
      .Case([](ExpandOp o) {
        auto y = shapeOf(o.getOutput());
        int64_t rank = y.size();
        KernelCall c{"pipec_k_broadcast", {o.getInput(), o.getOutput()}, {rank}, {}};
        llvm::append_range(c.ints, y);
        llvm::append_range(c.ints, broadcastStrides(shapeOf(o.getInput()), rank, y));
        return Calls{c};
      })
      .Case([](ConcatOp o) {
        auto y = shapeOf(o.getOutput());
        int64_t axis = int64_t(o.getAxis()) < 0 ? int64_t(o.getAxis()) + int64_t(y.size()) : int64_t(o.getAxis());
        SmallVector<int64_t> yStrides = contiguousStrides(y);
        Calls calls;
        int64_t offset = 0;
        for (Value v : o.getInputs()) {
          auto x = shapeOf(v);
          calls.push_back(stridedCopy(v, o.getOutput(), x, contiguousStrides(x),
                                      0, yStrides, offset * yStrides[axis],
                                      false));
          offset += x[axis];
        }
        return calls;
      })
      .Case([](SliceOp o) {
        auto x = shapeOf(o.getInput()), y = shapeOf(o.getOutput());
        SmallVector<int64_t> xStrides = contiguousStrides(x), src;
        int64_t offset = 0;
        for (size_t d = 0; d < x.size(); ++d) {
          src.push_back(xStrides[d] * o.getSteps()[d]);
          offset += o.getStarts()[d] * xStrides[d];
        }
        return Calls{stridedCopy(o.getInput(), o.getOutput(), y, src, offset,
                                 contiguousStrides(y), 0, false)};
      })
      .Case([](SliceGradOp o) {
        auto x = shapeOf(o.getOutput()), y = shapeOf(o.getGrad());
        SmallVector<int64_t> xStrides = contiguousStrides(x), dst;
        int64_t offset = 0;
        for (size_t d = 0; d < x.size(); ++d) {
          dst.push_back(xStrides[d] * o.getSteps()[d]);
          offset += o.getStarts()[d] * xStrides[d];
        }
        return Calls{KernelCall{"pipec_k_fill",
                                {o.getOutput()},
                                {numel(o.getOutput())},
                                {0.0}},
                     stridedCopy(o.getGrad(), o.getOutput(), y,
                                 contiguousStrides(y), 0, dst, offset, false)};
      })
      .Default([](Operation *) { return std::nullopt; });
}

static std::optional<SmallVector<KernelCall, 1>>
layerKernelCalls(Operation *op) {
  for (auto family : {elementwiseKernelCalls, convPoolKernelCalls,
                      normKernelCalls, movementKernelCalls})
    if (auto calls = family(op))
      return calls;
  return std::nullopt;
}
