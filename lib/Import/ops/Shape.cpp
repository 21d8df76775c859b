//===- Shape.cpp - views, data movement, reductions, shape computations ---===//
//
// Flatten/Reshape/Squeeze/Unsqueeze (views), Transpose, Expand, Tile,
// Gather, Concat, Split, Slice, Pad, Trilu, ReduceMean/ReduceSum, Constant,
// and the shape computations that are supported only when they fold to
// constants at import time (Shape, Size, Range, ConstantOfShape, Floor,
// Ceil).
//
//===----------------------------------------------------------------------===//
#include "../Convert.h"

#include "dialects/nn/NNDialect.h"

#include <algorithm>

using namespace mlir;

namespace pipec::import {
namespace {

struct Shapes : NodeContext {
  explicit Shapes(const NodeContext &c) : NodeContext(c) {}

  bool constant() {
    const auto *value = findAttr(node, "value");
    if (!value || !value->has_t())
      return fail(where + ": only the 'value' attribute form of Constant is "
                          "supported");
    services.defineConstant(node.output(0), value->t());
    return true; // materialised on first use
  }

  bool flatten() {
    if (!need(1))
      return false;
    return out0(nn::FlattenOp::create(
        b, loc, rt0, in(0), b.getI64IntegerAttr(attrInt(node, "axis", 1))));
  }

  bool reshape() {
    if (!need(1))
      return false;
    std::vector<int64_t> shape;
    if (node.input_size() < 2 || !constantInts(node.input(1), shape))
      return fail(where + ": the shape input '" +
                  (node.input_size() > 1 ? node.input(1) : "") +
                  "' is not a constant int64 tensor (computed shapes are not "
                  "supported yet)");
    auto inType = rtype(in(0));
    auto outType = cast<RankedTensorType>(rt0);
    if (inType.getNumElements() != outType.getNumElements())
      return fail(where + ": reshapes " +
                  std::to_string(inType.getNumElements()) +
                  " elements to the shape " +
                  dimsString(std::vector<int64_t>(outType.getShape().begin(),
                                                  outType.getShape().end())) +
                  " of " + std::to_string(outType.getNumElements()) +
                  services.batchHint());
    return out0(nn::ReshapeOp::create(b, loc, rt0, in(0)));
  }

  bool transpose() {
    if (!need(1))
      return false;
    int64_t rank = rtype(in(0)).getRank();
    SmallVector<int64_t> perm;
    if (const auto *p = findAttr(node, "perm"))
      perm.assign(p->ints().begin(), p->ints().end());
    else
      for (int64_t i = rank - 1; i >= 0; --i)
        perm.push_back(i);
    return out0(nn::TransposeOp::create(b, loc, rt0, in(0),
                                        b.getDenseI64ArrayAttr(perm)));
  }

  bool squeeze() {
    Value x = in(0);
    return x && out0(nn::ReshapeOp::create(b, loc, rt0, x));
  }

  bool expand() {
    Value x = in(0);
    return x && out0(nn::ExpandOp::create(b, loc, rt0, x));
  }

  bool gather() {
    Value data = in(0), idx = in(1);
    if (!data || !idx)
      return false;
    if (!rtype(idx).getElementType().isInteger(64))
      return fail(where + ": indices must be int64");
    return out0(nn::GatherOp::create(b, loc, rt0, data, idx,
                                     b.getI64IntegerAttr(attrInt(node, "axis", 0))));
  }

  bool concat() {
    SmallVector<Value> inputs;
    for (int i = 0; i < node.input_size(); ++i) {
      Value v = in(i);
      if (!v)
        return false;
      inputs.push_back(v);
    }
    return out0(nn::ConcatOp::create(b, loc, rt0, inputs,
                                     b.getI64IntegerAttr(attrInt(node, "axis", 0))));
  }

  bool split() {
    Value x = in(0);
    if (!x)
      return false;
    auto xt = rtype(x);
    int64_t rank = xt.getRank();
    int64_t axis = attrInt(node, "axis", 0);
    if (axis < 0)
      axis += rank;
    if (axis < 0 || axis >= rank)
      return fail(where + ": axis is out of range for rank " +
                  std::to_string(rank));
    int64_t offset = 0;
    for (int k = 0; k < node.output_size(); ++k) {
      if (!resultTypes[k])
        return fail(where + ": every output of Split must be named");
      auto t = cast<RankedTensorType>(resultTypes[k]);
      if (t.getRank() != rank || offset + t.getDimSize(axis) > xt.getDimSize(axis))
        return fail(where + ": output shapes do not partition the input");
      SmallVector<int64_t> starts(rank, 0), steps(rank, 1);
      starts[axis] = offset;
      values[node.output(k)] =
          nn::SliceOp::create(b, loc, t, x, i64s(starts), i64s(steps));
      offset += t.getDimSize(axis);
    }
    return true;
  }

  bool slice() {
    Value x = in(0);
    if (!x)
      return false;
    auto xt = rtype(x);
    int64_t rank = xt.getRank();
    std::vector<int64_t> starts, ends, axes, steps;
    if (!constantInts(node.input(1), starts) || !constantInts(node.input(2), ends))
      return fail(where + ": starts and ends must be constant");
    if (node.input_size() > 3 && !node.input(3).empty()) {
      if (!constantInts(node.input(3), axes))
        return fail(where + ": axes must be constant");
    } else {
      for (size_t i = 0; i < starts.size(); ++i)
        axes.push_back(i);
    }
    if (node.input_size() > 4 && !node.input(4).empty()) {
      if (!constantInts(node.input(4), steps))
        return fail(where + ": steps must be constant");
    } else {
      steps.assign(starts.size(), 1);
    }
    SmallVector<int64_t> st(rank, 0), sp(rank, 1);
    if (starts.size() != ends.size() || axes.size() != starts.size() ||
        steps.size() != starts.size())
      return fail(where + ": starts, ends, axes and steps must have one entry "
                          "per sliced axis");
    for (size_t k = 0; k < axes.size(); ++k) {
      int64_t a = axes[k] < 0 ? axes[k] + rank : axes[k];
      if (a < 0 || a >= rank || steps[k] == 0)
        return fail(where + ": axis " + std::to_string(axes[k]) +
                    " is out of range or a step is 0");
      int64_t n = xt.getDimSize(a), s0 = starts[k];
      if (s0 < 0)
        s0 += n;
      s0 = steps[k] > 0 ? std::clamp<int64_t>(s0, 0, n)
                        : std::clamp<int64_t>(s0, 0, n - 1);
      st[a] = s0;
      sp[a] = steps[k];
    }
    return out0(nn::SliceOp::create(b, loc, rt0, x, i64s(st), i64s(sp)));
  }

  /// Pad (constant mode): negative pads crop (nn.slice), positive ones
  /// place the tensor into a filled one (nn.slice_grad of x - value, plus
  /// value).
  bool pad() {
    Value x = in(0);
    if (!x)
      return false;
    std::string mode = attrString(node, "mode", "constant");
    if (mode != "constant")
      return fail(where + ": mode '" + mode + "' is not supported (constant "
                  "padding only)");
    std::vector<int64_t> pads;
    if (node.input_size() < 2 || !constantInts(node.input(1), pads))
      return fail(where + ": pads must be a constant int64 tensor");
    auto xt = rtype(x);
    const int64_t rank = xt.getRank();
    if (int64_t(pads.size()) != 2 * rank)
      return fail(where + ": pads has " + std::to_string(pads.size()) +
                  " values for a rank-" + std::to_string(rank) +
                  " input (needs " + std::to_string(2 * rank) + ")");
    auto value = inputConstFloat(2, 0.0f);
    if (!value)
      return fail(where + ": constant_value must be a constant scalar");
    SmallVector<int64_t> cropStart(rank, 0), kept(rank), place(rank, 0),
        ones(rank, 1);
    bool crop = false, pad = false;
    for (int64_t k = 0; k < rank; ++k) {
      int64_t lo = pads[k], hi = pads[k + rank];
      cropStart[k] = std::max<int64_t>(-lo, 0);
      kept[k] = xt.getDimSize(k) - std::max<int64_t>(-lo, 0) -
                std::max<int64_t>(-hi, 0);
      if (kept[k] <= 0)
        return fail(where + ": pads crop dimension " + std::to_string(k) +
                    " to nothing");
      place[k] = std::max<int64_t>(lo, 0);
      crop |= lo < 0 || hi < 0;
      pad |= lo > 0 || hi > 0;
    }
    if (crop)
      x = nn::SliceOp::create(b, loc,
                              RankedTensorType::get(kept, b.getF32Type()), x,
                              i64s(cropStart), i64s(ones));
    if (!pad)
      return out0(crop ? x : nn::IdentityOp::create(b, loc, x).getResult());
    Value v;
    if (*value != 0.0f) {
      v = scalarF32(*value);
      x = nn::SubOp::create(b, loc, x.getType(), x, v);
    }
    Value y = nn::SliceGradOp::create(b, loc, rt0, x, i64s(place), i64s(ones));
    if (v)
      y = nn::AddOp::create(b, loc, rt0, y, v);
    return out0(y);
  }

  /// Tile: a view with a unit dimension before each, an Expand to the
  /// repeat counts there, and a view back.
  bool tile() {
    Value x = in(0);
    if (!x)
      return false;
    std::vector<int64_t> repeats;
    if (node.input_size() < 2 || !constantInts(node.input(1), repeats))
      return fail(where + ": repeats must be a constant int64 tensor");
    auto xt = rtype(x);
    if (int64_t(repeats.size()) != xt.getRank())
      return fail(where + ": repeats needs one entry per dimension");
    SmallVector<int64_t> split, tiled;
    for (int64_t d = 0; d < xt.getRank(); ++d) {
      if (repeats[d] < 1)
        return fail(where + ": repeats must be positive");
      split.append({1, xt.getDimSize(d)});
      tiled.append({repeats[d], xt.getDimSize(d)});
    }
    Value y = nn::ReshapeOp::create(b, loc, RankedTensorType::get(split, b.getF32Type()), x);
    y = nn::ExpandOp::create(b, loc, RankedTensorType::get(tiled, b.getF32Type()), y);
    return out0(nn::ReshapeOp::create(b, loc, rt0, y));
  }

  /// Trilu: a constant lower or upper triangle mask over the last two
  /// dimensions (static shapes).
  bool trilu() {
    Value x = in(0);
    if (!x)
      return false;
    auto xt = rtype(x);
    if (xt.getRank() < 2)
      return fail(where + ": the input needs at least 2 dimensions");
    int64_t k = 0;
    if (node.input_size() > 1 && !node.input(1).empty()) {
      std::vector<int64_t> kv;
      if (!constantInts(node.input(1), kv) || kv.size() != 1)
        return fail(where + ": k must be a constant scalar");
      k = kv[0];
    }
    bool upper = attrInt(node, "upper", 1) != 0;
    int64_t rows = xt.getDimSize(xt.getRank() - 2), cols = xt.getDimSize(xt.getRank() - 1);
    std::vector<float> mask(size_t(rows * cols));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        mask[size_t(i * cols + j)] = (upper ? j - i >= k : j - i <= k) ? 1.0f : 0.0f;
    if (xt.getElementType().isInteger(64)) {
      // Integer masks (run-time ids, booleans): select against 0.
      std::vector<int64_t> keep(mask.begin(), mask.end());
      auto mt = RankedTensorType::get({rows, cols}, b.getI64Type());
      Value m = nn::ConstantOp::create(
          b, loc, cast<ElementsAttr>(DenseElementsAttr::get(mt, ArrayRef<int64_t>(keep))));
      auto zt = RankedTensorType::get({}, b.getI64Type());
      Value zero = nn::ConstantOp::create(
          b, loc, cast<ElementsAttr>(DenseElementsAttr::get(zt, int64_t(0))));
      return out0(nn::WhereOp::create(b, loc, rt0, m, x, zero));
    }
    auto mt = RankedTensorType::get({rows, cols}, b.getF32Type());
    Value m = nn::ConstantOp::create(
        b, loc, cast<ElementsAttr>(DenseElementsAttr::get(mt, ArrayRef<float>(mask))));
    return out0(nn::MulOp::create(b, loc, rt0, x, m));
  }

  /// Reductions: a sum onto the kept-dims shape, then a reshape.
  bool reduce() {
    Value x = in(0);
    if (!x)
      return false;
    auto xt = rtype(x);
    std::vector<int64_t> axes;
    if (node.input_size() > 1 && !node.input(1).empty()) {
      if (!constantInts(node.input(1), axes))
        return fail(where + ": axes must be constant");
    } else {
      axes = attrInts(node, "axes");
    }
    if (axes.empty() && attrInt(node, "noop_with_empty_axes", 0))
      return out0(nn::IdentityOp::create(b, loc, x));
    SmallVector<int64_t> kept(xt.getShape());
    int64_t count = 1;
    for (int64_t d = 0; d < xt.getRank(); ++d) {
      bool reduced = axes.empty();
      for (int64_t a : axes)
        reduced |= (a < 0 ? a + xt.getRank() : a) == d;
      if (reduced) {
        count *= kept[d];
        kept[d] = 1;
      }
    }
    double scale = op == "ReduceMean" ? 1.0 / count : 1.0;
    auto keptT = RankedTensorType::get(kept, b.getF32Type());
    Value sum = nn::SumToShapeOp::create(b, loc, keptT, x, b.getF64FloatAttr(scale));
    if (keptT != rt0)
      sum = nn::ReshapeOp::create(b, loc, rt0, sum);
    return out0(sum);
  }
};

template <bool (Shapes::*M)()>
OpSpec spec(const char *op, Operands operands, const char *note = "",
            int since = 13) {
  return conversion<Shapes, M>("shape", op, since, operands, note);
}

} // namespace

void registerShapeOps(OpRegistry &r) {
  OpSpec constant = spec<&Shapes::constant>("Constant", Operands::Any,
                                            "the 'value' form");
  constant.beforeFolding = true;
  r.add(constant);
  r.add(spec<&Shapes::flatten>("Flatten", Operands::Float));
  OpSpec reshape = spec<&Shapes::reshape>("Reshape", Operands::View,
                                          "shape constant after folding");
  reshape.constantShapeInput = true;
  r.add(reshape);
  r.add(spec<&Shapes::transpose>("Transpose", Operands::Float));
  r.add(spec<&Shapes::squeeze>("Squeeze", Operands::View));
  r.add(spec<&Shapes::squeeze>("Unsqueeze", Operands::View));
  OpSpec expand = spec<&Shapes::expand>("Expand", Operands::FirstFloat,
                                        "shape constant after folding");
  expand.constantShapeInput = true;
  r.add(expand);
  r.add(spec<&Shapes::gather>("Gather", Operands::FirstFloat,
                              "float32 data, int64 indices"));
  r.add(spec<&Shapes::concat>("Concat", Operands::Float));
  r.add(spec<&Shapes::split>("Split", Operands::FirstFloat));
  r.add(spec<&Shapes::slice>("Slice", Operands::FirstFloat,
                             "starts, ends, axes, steps constant"));
  r.add(spec<&Shapes::pad>("Pad", Operands::FirstFloat, "constant mode"));
  r.add(spec<&Shapes::tile>("Tile", Operands::FirstFloat,
                            "repeats constant"));
  r.add(spec<&Shapes::trilu>("Trilu", Operands::Any, "k constant", 14));
  r.add(spec<&Shapes::reduce>("ReduceMean", Operands::FirstFloat));
  r.add(spec<&Shapes::reduce>("ReduceSum", Operands::FirstFloat));
  // Shape computations: supported where they fold to constants.
  for (const char *op :
       {"Shape", "Size", "Range", "ConstantOfShape", "Floor", "Ceil"}) {
    OpSpec s;
    s.op = op;
    s.since = 13;
    s.family = "shape";
    s.operands = Operands::Any;
    s.note = "only where it folds to a constant at import";
    r.add(s);
  }
}

} // namespace pipec::import
