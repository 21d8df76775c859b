//===- Elementwise.cpp - arithmetic, activations, softmax, dropout -------===//
//
// Binary arithmetic, unary functions, the activations written with ops that
// have kernels, variadic Max/Min/Sum/Mean, Softmax/LogSoftmax and Dropout.
//
//===----------------------------------------------------------------------===//
#include "../Convert.h"

#include "dialects/nn/NNDialect.h"

#include "mlir/Dialect/MLProgram/IR/MLProgram.h"

#include <cfloat>

using namespace mlir;

namespace pipec::import {
namespace {

struct Elementwise : NodeContext {
  explicit Elementwise(const NodeContext &c) : NodeContext(c) {}

  bool binary() {
    if (!need(2))
      return false;
    Value l = in(0), r = in(1);
    if (op == "Add")
      return out0(nn::AddOp::create(b, loc, rt0, l, r));
    if (op == "Sub")
      return out0(nn::SubOp::create(b, loc, rt0, l, r));
    if (op == "Mul")
      return out0(nn::MulOp::create(b, loc, rt0, l, r));
    return out0(nn::DivOp::create(b, loc, rt0, l, r));
  }

  bool activation() {
    if (!need(1))
      return false;
    Value x = in(0);
    if (op == "Relu")
      return out0(nn::ReluOp::create(b, loc, x));
    if (op == "Tanh")
      return out0(nn::TanhOp::create(b, loc, x));
    return out0(nn::SigmoidOp::create(b, loc, x));
  }

  bool identity() {
    if (!need(1))
      return false;
    Value x = in(0);
    // With --untie-weights the untied copy is the parameter itself.
    if (services.options().untieWeights && isWeightName(node.input(0)) &&
        x.getDefiningOp<ml_program::GlobalLoadOp>())
      return out0(x);
    return out0(nn::IdentityOp::create(b, loc, x));
  }

  bool softmax() {
    if (!need(1))
      return false;
    auto axis = b.getI64IntegerAttr(attrInt(node, "axis", -1));
    if (op == "Softmax")
      return out0(nn::SoftmaxOp::create(b, loc, rt0, in(0), axis, UnitAttr()));
    return out0(nn::LogSoftmaxOp::create(b, loc, rt0, in(0), axis, UnitAttr()));
  }

  bool unary() {
    Value x = in(0);
    if (!x)
      return false;
    Value y = op == "Erf"    ? nn::ErfOp::create(b, loc, x).getResult()
              : op == "Sqrt" ? nn::SqrtOp::create(b, loc, x).getResult()
              : op == "Exp"  ? nn::ExpOp::create(b, loc, x).getResult()
              : op == "Log"  ? nn::LogOp::create(b, loc, x).getResult()
              : op == "Neg"  ? nn::NegOp::create(b, loc, x).getResult()
              : op == "Abs"  ? nn::AbsOp::create(b, loc, x).getResult()
                             : nn::ReciprocalOp::create(b, loc, x).getResult();
    return out0(y);
  }

  bool leakyRelu() {
    Value x = in(0);
    return x && out0(nn::LeakyReluOp::create(
                    b, loc, rt0, x, f32(attrFloat(node, "alpha", 0.01f))));
  }

  bool clip() {
    Value x = in(0);
    if (!x)
      return false;
    auto lo = inputConstFloat(1, attrFloat(node, "min", -FLT_MAX));
    auto hi = inputConstFloat(2, attrFloat(node, "max", FLT_MAX));
    if (!lo || !hi)
      return fail(where + ": min and max must be constant scalars");
    return out0(nn::ClipOp::create(b, loc, rt0, x, f32(*lo), f32(*hi)));
  }

  /// HardSigmoid(x) = clip(alpha x + beta, 0, 1); HardSwish(x) =
  /// x HardSigmoid(x) with alpha 1/6, beta 1/2 (MobileNetV3).
  bool hardSigmoid() {
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

  bool pow() {
    Value x = in(0);
    if (!x)
      return false;
    auto e = constOf(node.input(1));
    if (e && e->numel() == 1)
      return out0(
          nn::PowScalarOp::create(b, loc, rt0, x, f32(float(e->real(0)))));
    Value y = in(1);
    return y && out0(nn::PowOp::create(b, loc, rt0, x, y));
  }

  /// Max, Min, Sum, Mean of any number of broadcasting inputs.
  bool variadic() {
    Value acc = in(0);
    if (!acc)
      return false;
    for (int i = 1; i < node.input_size(); ++i) {
      Value v = in(i);
      if (!v)
        return false;
      auto shape =
          nn::broadcastShapes(rtype(acc).getShape(), rtype(v).getShape());
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

  /// Activations written with ops that have kernels. The branch a Where
  /// drops is kept finite (exp of min(x, 0)), so its zero gradient stays 0.
  bool composite() {
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
      float alpha = attrFloat(node, "alpha",
                              op == "Elu" ? 1.0f : 1.67326319217681884765625f);
      y = nn::WhereOp::create(b, loc, xt, cmp("gt", 0.0f), x,
                              negBranch(alpha, 1.0f));
      if (op == "Selu")
        y = mul(y, scalarF32(
                       attrFloat(node, "gamma", 1.05070102214813232421875f)));
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
        return nn::LogOp::create(
            b, loc, add(nn::ExpOp::create(b, loc, t), scalarF32(1.0f)));
      };
      y = nn::WhereOp::create(b, loc, xt, cmp("gt", 0.0f),
                              add(pos, log1pExp(nn::NegOp::create(b, loc, pos))),
                              log1pExp(neg));
    } else if (op == "Softsign") {
      Value d = add(nn::AbsOp::create(b, loc, x), scalarF32(1.0f));
      y = nn::DivOp::create(b, loc, xt, x, d);
    } else if (op == "ThresholdedRelu") {
      Value keep = nn::CastOp::create(
          b, loc, RankedTensorType::get(xt.getShape(), b.getF32Type()),
          cmp("gt", attrFloat(node, "alpha", 1.0f)));
      y = mul(x, keep);
    } else { // Sign: 1, 0, -1 (no gradient, as its derivative is 0)
      auto f32t = RankedTensorType::get(xt.getShape(), b.getF32Type());
      y = nn::SubOp::create(b, loc, xt,
                            nn::CastOp::create(b, loc, f32t, cmp("gt", 0.0f)),
                            nn::CastOp::create(b, loc, f32t, cmp("lt", 0.0f)));
    }
    return out0(y);
  }

  bool dropout() {
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
    bool maskOut = node.output_size() > 1 && !node.output(1).empty();
    if (!training) {
      if (maskOut)
        return fail(where + ": the mask output of an inference-mode Dropout "
                            "is not supported");
      return out0(nn::IdentityOp::create(b, loc, x));
    }
    auto ratio = inputConstFloat(1, 0.5f);
    if (!ratio || *ratio < 0 || *ratio >= 1)
      return fail(where + ": ratio must be a constant in [0, 1)");
    if (maskOut)
      return fail(where + ": the Dropout mask output is not supported");
    // The runtime's per-microbatch random state, one model argument shared
    // by every dropout layer (salted by the node index).
    Value rng = services.randomState(where);
    if (!rng)
      return false;
    auto drop = nn::DropoutOp::create(b, loc, rt0, rt0, x, rng, f32(*ratio),
                                      b.getI64IntegerAttr(index));
    return out0(drop.getOutput());
  }
};

template <bool (Elementwise::*M)()>
OpSpec spec(const char *op, int since = 13,
            Operands operands = Operands::Float, const char *note = "") {
  return conversion<Elementwise, M>("elementwise", op, since, operands, note);
}

} // namespace

void registerElementwiseOps(OpRegistry &r) {
  using E = Elementwise;
  for (const char *op : {"Add", "Sub", "Mul", "Div"})
    r.add(spec<&E::binary>(op, 13, Operands::Float, "float32, broadcasting"));
  for (const char *op : {"Relu", "Tanh", "Sigmoid"})
    r.add(spec<&E::activation>(op));
  r.add(spec<&E::identity>("Identity"));
  for (const char *op : {"Softmax", "LogSoftmax"})
    r.add(spec<&E::softmax>(op));
  for (const char *op : {"Erf", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal"})
    r.add(spec<&E::unary>(op));
  r.add(spec<&E::leakyRelu>("LeakyRelu"));
  r.add(spec<&E::clip>("Clip", 13, Operands::FirstFloat,
                       "min and max constant"));
  r.add(spec<&E::hardSigmoid>("HardSigmoid"));
  r.add(spec<&E::hardSigmoid>("HardSwish", 14));
  r.add(spec<&E::pow>("Pow"));
  for (const char *op : {"Max", "Min", "Sum", "Mean"})
    r.add(spec<&E::variadic>(op));
  for (const char *op : {"Elu", "Selu", "Celu", "Softplus", "Softsign",
                         "ThresholdedRelu", "Sign"})
    r.add(spec<&E::composite>(op));
  r.add(spec<&E::dropout>("Dropout", 13, Operands::FirstFloat,
                          "ratio and training_mode constant; no mask output"));
}

} // namespace pipec::import
