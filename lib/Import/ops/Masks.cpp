//===- Masks.cpp - comparisons, logic, Cast and Where ----------------------===//
//
// The ops of masks computed from the data (padding masks from token ids,
// say). Booleans are int64 0/1: And(a, b) = Where(a, b, a), Or(a, b) =
// Where(a, a, b), Xor = (a != b), Not(a) = (a == 0), Cast to bool =
// (x != 0). Where with a constant condition over float32 data is
// arithmetic (no run-time select); otherwise it selects at run time.
//
//===----------------------------------------------------------------------===//
#include "../Convert.h"

#include "dialects/nn/NNDialect.h"

#include <map>

using namespace mlir;

namespace pipec::import {
namespace {

const std::map<std::string, const char *> &predicates() {
  static const std::map<std::string, const char *> p = {
      {"Equal", "eq"},       {"Less", "lt"},
      {"Greater", "gt"},     {"LessOrEqual", "le"},
      {"GreaterOrEqual", "ge"}, {"Xor", "ne"}};
  return p;
}

struct Masks : NodeContext {
  explicit Masks(const NodeContext &c) : NodeContext(c) {}

  static Type elem(Value v) {
    return cast<RankedTensorType>(v.getType()).getElementType();
  }
  Value zeroLike(Value v) {
    auto t = RankedTensorType::get({}, elem(v));
    Attribute z = elem(v).isF32()
                      ? Attribute(DenseElementsAttr::get(t, 0.0f))
                      : Attribute(DenseElementsAttr::get(t, int64_t(0)));
    return nn::ConstantOp::create(b, loc, cast<ElementsAttr>(z));
  }
  Value compare(StringRef pred, Value l, Value r) {
    if (elem(l) != elem(r)) {
      fail(where + ": operands of different element types (float32 and "
                   "int64/bool) are not supported");
      return Value();
    }
    return nn::CompareOp::create(b, loc, rt0, b.getStringAttr(pred), l, r);
  }

  bool where_() {
    // A constant float condition keeps the mask arithmetic (no run-time
    // select); everything else selects at run time.
    auto cond = constOf(node.input(0));
    if (cond && !isWeightName(node.input(0))) {
      const ValueType *t = services.typeOfName(node.input(1));
      if (t && t->elemType == onnx::TensorProto::FLOAT)
        return constantCondition();
    }
    Value c = in(0), x = in(1), y = in(2);
    if (!c || !x || !y)
      return error.empty() ? fail(where + ": missing input") : false;
    if (!elem(c).isInteger(64))
      return fail(where + ": the condition must be a bool tensor");
    if (elem(x) != elem(y))
      return fail(where + ": X and Y have different element types");
    return out0(nn::WhereOp::create(b, loc, rt0, c, x, y));
  }

  /// Where(c, X, Y) with a constant condition c and run-time X or Y:
  ///   X * c + Y * (1 - c), where a constant branch enters as the constant
  ///   where(c, X, 0) / where(c, 0, Y) (so that a mask value such as -inf
  ///   is never multiplied by 0). Exact for finite run-time values.
  bool constantCondition() {
    // Where(c, X, Y) with a constant condition c and run-time X or Y:
    //   X * c + Y * (1 - c), where a constant branch enters as the constant
    //   where(c, X, 0) / where(c, 0, Y) (so that a mask value such as -inf
    //   is never multiplied by 0). Exact for finite run-time values.
    auto cond = constOf(node.input(0));
    Value x = in(1), y = in(2);
    if (!cond || !x || !y)
      return error.empty() ? fail(where + ": missing input") : false;
    Type f32 = b.getF32Type();
    auto condType = RankedTensorType::get(cond->dims, f32);
    std::vector<float> keep(size_t(cond->numel())), drop(keep.size());
    for (size_t i = 0; i < keep.size(); ++i) {
      keep[i] = cond->real(int64_t(i)) != 0 ? 1.0f : 0.0f;
      drop[i] = 1.0f - keep[i];
    }
    auto constant = [&](RankedTensorType t, ArrayRef<float> v) -> Value {
      return nn::ConstantOp::create(b, loc,
                                    cast<ElementsAttr>(DenseElementsAttr::get(t, v)));
    };
    auto broadcast = [&](Type a, Type c) {
      auto at = cast<RankedTensorType>(a), ct = cast<RankedTensorType>(c);
      int64_t rank = std::max(at.getRank(), ct.getRank());
      SmallVector<int64_t> dims(rank, 1);
      for (int64_t k = 0; k < rank; ++k) {
        int64_t da = k < rank - at.getRank() ? 1 : at.getDimSize(k - (rank - at.getRank()));
        int64_t dc = k < rank - ct.getRank() ? 1 : ct.getDimSize(k - (rank - ct.getRank()));
        dims[k] = da == 1 ? dc : da;
      }
      return RankedTensorType::get(dims, f32);
    };
    // A branch that is a constant (not a trained weight), selected by the
    // condition, as one constant.
    auto selectedConstant = [&](int branch) -> Value {
      const std::string &name = node.input(branch);
      auto c = isWeightName(name) ? std::nullopt : constOf(name);
      if (!c)
        return Value();
      onnx::NodeProto w;
      w.set_op_type("Where");
      for (const char *n : {"c", "x", "y"})
        w.add_input(n);
      w.add_output("o");
      import::ConstTensor zero;
      zero.isFloat = true;
      zero.reals = {0.0};
      std::string why;
      auto out = import::foldNode(
          w,
          [&](int i) -> std::optional<import::ConstTensor> {
            if (i == 0)
              return cond;
            return i == branch ? c : std::optional<import::ConstTensor>(zero);
          },
          [](const std::string &) -> std::optional<std::vector<int64_t>> {
            return std::nullopt;
          },
          why);
      if (!out || out->empty())
        return Value();
      const import::ConstTensor &r = out->front();
      std::vector<float> v(r.reals.begin(), r.reals.end());
      if (!r.isFloat)
        for (int64_t i = 0; i < r.numel(); ++i)
          v.push_back(float(r.ints[size_t(i)]));
      return constant(RankedTensorType::get(r.dims, f32), v);
    };
    Value xs = selectedConstant(1), ys = selectedConstant(2);
    if (!xs)
      xs = nn::MulOp::create(b, loc, broadcast(x.getType(), condType), x,
                             constant(condType, keep));
    if (!ys)
      ys = nn::MulOp::create(b, loc, broadcast(y.getType(), condType), y,
                             constant(condType, drop));
    Value result = nn::AddOp::create(b, loc, rt0, xs, ys);
    return out0(result);
  }

  bool cast_() {
    Value x = in(0);
    if (!x)
      return error.empty() ? fail(where + ": missing input") : false;
    int64_t to = attrInt(node, "to", 0);
    if (to == onnx::TensorProto::BOOL)
      return out0(compare("ne", x, zeroLike(x)));
    if (to != onnx::TensorProto::FLOAT && to != onnx::TensorProto::INT64)
      return fail(where + ": casting run-time tensors to ONNX type " +
                  std::to_string(to) +
                  " is not supported (float32, int64 and bool are)");
    if (elem(x) == cast<RankedTensorType>(rt0).getElementType())
      return out0(nn::IdentityOp::create(b, loc, x));
    return out0(nn::CastOp::create(b, loc, rt0, x));
  }

  bool logic() {
    Value x = in(0);
    if (!x)
      return error.empty() ? fail(where + ": missing input") : false;
    if (op == "Not")
      return out0(compare("eq", x, zeroLike(x)));
    Value y = in(1);
    if (!y)
      return error.empty() ? fail(where + ": missing input") : false;
    if (op == "And" || op == "Or") {
      if (!elem(x).isInteger(64) || !elem(y).isInteger(64))
        return fail(where + ": operands must be bool tensors");
      return out0(op == "And" ? nn::WhereOp::create(b, loc, rt0, x, y, x)
                              : nn::WhereOp::create(b, loc, rt0, x, x, y));
    }
    return out0(compare(predicates().at(op), x, y));
  }
};

template <bool (Masks::*M)()>
OpSpec spec(const char *op, const char *note) {
  return conversion<Masks, M>("masks", op, 13, Operands::Any, note);
}

} // namespace

void registerMaskOps(OpRegistry &r) {
  for (const auto &[op, pred] : predicates())
    r.add(spec<&Masks::logic>(op.c_str(), "float32 or int64/bool operands alike"));
  for (const char *op : {"Not", "And", "Or"})
    r.add(spec<&Masks::logic>(op, "bool operands"));
  r.add(spec<&Masks::cast_>("Cast", "to float32, int64 or bool"));
  r.add(spec<&Masks::where_>("Where", "constant or run-time bool condition"));
}

} // namespace pipec::import
