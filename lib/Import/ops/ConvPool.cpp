//===- ConvPool.cpp - convolution, pooling and resampling -----------------===//
//
// Conv, MaxPool, AveragePool (1-D as 2-D with a unit height), ConvTranspose
// (the input gradient of the convolution it transposes), GlobalAveragePool,
// and Resize/Upsample (nearest by whole factors, or bilinear).
//
//===----------------------------------------------------------------------===//
#include "../Convert.h"

#include "dialects/nn/NNDialect.h"

#include <algorithm>

using namespace mlir;

namespace pipec::import {
namespace {

/// Explicit [top, left, bottom, right] pads of a 2-D window from ONNX's
/// auto_pad/pads; empty with `why` set for unsupported settings.
std::vector<int64_t> windowPads(const onnx::NodeProto &node,
                                ArrayRef<int64_t> in, ArrayRef<int64_t> kernel,
                                ArrayRef<int64_t> strides,
                                ArrayRef<int64_t> dilations, std::string &why) {
  std::string autoPad = attrString(node, "auto_pad", "NOTSET");
  if (autoPad == "NOTSET") {
    std::vector<int64_t> pads = attrInts(node, "pads", {0, 0, 0, 0});
    if (pads.size() != 4) {
      why = "pads must have 4 entries for a 2-D window";
      return {};
    }
    return pads;
  }
  if (autoPad == "VALID")
    return {0, 0, 0, 0};
  if (autoPad != "SAME_UPPER" && autoPad != "SAME_LOWER") {
    why = "auto_pad '" + autoPad + "' is not supported";
    return {};
  }
  std::vector<int64_t> pads(4);
  for (int d = 0; d < 2; ++d) {
    int64_t out = (in[d] + strides[d] - 1) / strides[d];
    int64_t total = std::max<int64_t>(
        0, (out - 1) * strides[d] + (kernel[d] - 1) * dilations[d] + 1 - in[d]);
    int64_t small = total / 2, big = total - small;
    pads[d] = autoPad == "SAME_UPPER" ? small : big;
    pads[d + 2] = autoPad == "SAME_UPPER" ? big : small;
  }
  return pads;
}

struct ConvPool : NodeContext {
  explicit ConvPool(const NodeContext &c) : NodeContext(c) {}

  /// Conv, MaxPool and AveragePool over 2-D windows; 1-D inputs get a unit
  /// height.
  bool window() {
    Value x = in(0);
    if (!x)
      return false;
    auto xt = rtype(x);
    bool oneD = xt.getRank() == 3;
    if (xt.getRank() != 4 && !oneD)
      return fail(where + ": only 1-D and 2-D " + op + " are supported (input "
                          "rank " + std::to_string(xt.getRank()) + ")");
    auto as2d = [&](std::vector<int64_t> v, int64_t fill) {
      if (oneD)
        v.insert(v.begin(), fill);
      return v;
    };
    SmallVector<int64_t> x4(xt.getShape());
    if (oneD)
      x4.insert(x4.begin() + 2, 1);
    Value w;
    std::vector<int64_t> kernel;
    if (op == "Conv") {
      w = in(1);
      if (!w)
        return false;
      auto wt = rtype(w);
      if (wt.getRank() != xt.getRank())
        return fail(where + ": the weight must have the input's rank " +
                    std::to_string(xt.getRank()));
      kernel.assign(wt.getShape().begin() + 2, wt.getShape().end());
    } else {
      kernel = attrInts(node, "kernel_shape");
    }
    kernel = as2d(kernel, 1);
    std::vector<int64_t> strides = as2d(attrInts(node, "strides", oneD ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 1}), 1);
    std::vector<int64_t> dilations = as2d(attrInts(node, "dilations", oneD ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 1}), 1);
    if (oneD) {
      std::vector<int64_t> p = attrInts(node, "pads", {0, 0});
      if (attrString(node, "auto_pad", "NOTSET") == "NOTSET" && p.size() != 2)
        return fail(where + ": pads must have 2 entries");
    }
    if (kernel.size() != 2 || strides.size() != 2 || dilations.size() != 2)
      return fail(where + ": kernel_shape, strides and dilations must have " +
                  (oneD ? "1 entry" : "2 entries") + " each");
    for (int64_t v : {kernel[0], kernel[1], strides[0], strides[1],
                      dilations[0], dilations[1]})
      if (v < 1)
        return fail(where + ": kernel sizes, strides and dilations must be "
                            "positive");
    std::string why;
    std::vector<int64_t> pads;
    if (oneD && attrString(node, "auto_pad", "NOTSET") == "NOTSET") {
      std::vector<int64_t> p = attrInts(node, "pads", {0, 0});
      pads = {0, p[0], 0, p[1]};
    } else {
      pads = windowPads(node, ArrayRef<int64_t>(x4).drop_front(2), kernel,
                        strides, dilations, why);
    }
    if (pads.empty())
      return fail(where + ": " + why);
    // Work in 2-D; 1-D inputs get a unit height.
    auto f32t = b.getF32Type();
    Value x2 = oneD ? nn::ReshapeOp::create(b, loc, RankedTensorType::get(x4, f32t), x).getResult() : x;
    auto rt = cast<RankedTensorType>(rt0);
    SmallVector<int64_t> y4(rt.getShape());
    if (oneD)
      y4.insert(y4.begin() + 2, 1);
    auto y4t = RankedTensorType::get(y4, f32t);
    Value y;
    if (op == "Conv") {
      Value w2 = w;
      if (oneD) {
        SmallVector<int64_t> ws(rtype(w).getShape());
        ws.insert(ws.begin() + 2, 1);
        w2 = nn::ReshapeOp::create(b, loc, RankedTensorType::get(ws, f32t), w);
      }
      Value bias = in(2);
      if (!error.empty())
        return false;
      y = nn::ConvOp::create(b, loc, y4t, x2, w2, bias, i64s(strides), i64s(pads),
                             i64s(dilations),
                             b.getI64IntegerAttr(attrInt(node, "group", 1)));
    } else if (op == "MaxPool") {
      if (attrInt(node, "storage_order", 0) != 0)
        return fail(where + ": storage_order 1 is not supported");
      if (node.output_size() > 1 && !node.output(1).empty())
        return fail(where + ": the Indices output of MaxPool is not supported");
      auto idxT = RankedTensorType::get(y4, b.getI64Type());
      y = nn::MaxPoolOp::create(b, loc, y4t, idxT, x2, i64s(kernel), i64s(strides),
                                i64s(pads), i64s(dilations))
              .getOutput();
    } else {
      y = nn::AveragePoolOp::create(
          b, loc, y4t, x2, i64s(kernel), i64s(strides), i64s(pads),
          attrInt(node, "count_include_pad", 0) ? b.getUnitAttr() : UnitAttr());
    }
    if (oneD)
      y = nn::ReshapeOp::create(b, loc, rt0, y);
    return out0(y);
  }

  /// ConvTranspose is the input gradient of the convolution it transposes:
  /// a Conv from an input of the result's shape to one of x's, with the
  /// same weight [C_in, C_out/group, kH, kW], strides, dilations and
  /// leading pads (output_padding and the trailing pads are whatever the
  /// result shape ONNX inferred implies).
  bool convTranspose() {
    Value x = in(0), w = in(1);
    if (!x || !w)
      return false;
    auto xt = rtype(x), wt = rtype(w);
    const bool oneD = xt.getRank() == 3;
    if ((xt.getRank() != 4 && !oneD) || wt.getRank() != xt.getRank())
      return fail(where + ": only 1-D and 2-D ConvTranspose are supported "
                          "(input rank " + std::to_string(xt.getRank()) + ")");
    const int64_t spatial = oneD ? 1 : 2;
    auto ints = [&](const char *name, int64_t dflt) {
      std::vector<int64_t> v = attrInts(node, name, {});
      if (v.empty())
        v.assign(size_t(spatial), dflt);
      if (oneD && v.size() == 1)
        v.insert(v.begin(), dflt);
      return v;
    };
    std::vector<int64_t> strides = ints("strides", 1),
                         dilations = ints("dilations", 1),
                         outPad = ints("output_padding", 0);
    std::vector<int64_t> kernel(wt.getShape().begin() + 2, wt.getShape().end());
    if (oneD)
      kernel.insert(kernel.begin(), 1);
    if (strides.size() != 2 || dilations.size() != 2 || outPad.size() != 2)
      return fail(where + ": strides, dilations and output_padding need one "
                          "entry per spatial dimension");
    for (int d = 0; d < 2; ++d)
      if (strides[d] < 1 || dilations[d] < 1 || outPad[d] < 0 ||
          outPad[d] >= std::max(strides[d], dilations[d]))
        return fail(where + ": strides and dilations must be positive and "
                            "output_padding below the stride or dilation");
    const int64_t group = attrInt(node, "group", 1);
    auto f32t = b.getF32Type();
    SmallVector<int64_t> x4(xt.getShape()), y4(cast<RankedTensorType>(rt0).getShape());
    if (oneD) {
      x4.insert(x4.begin() + 2, 1);
      y4.insert(y4.begin() + 2, 1);
    }
    // Leading pads: explicit, or from the total padding the output shape
    // implies (auto_pad SAME_*, output_shape).
    std::string autoPad = attrString(node, "auto_pad", "NOTSET");
    std::vector<int64_t> pads(4, 0);
    bool fromShape = findAttr(node, "output_shape") != nullptr ||
                     autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER";
    if (fromShape) {
      for (int d = 0; d < 2; ++d) {
        int64_t total = strides[d] * (x4[d + 2] - 1) + outPad[d] +
                        (kernel[d] - 1) * dilations[d] + 1 - y4[d + 2];
        if (total < 0)
          return fail(where + ": output_shape is larger than the kernel, "
                              "strides and output_padding can produce");
        pads[d] = autoPad == "SAME_UPPER" ? total / 2 : total - total / 2;
      }
    } else if (autoPad == "NOTSET") {
      std::vector<int64_t> p = attrInts(node, "pads", {});
      if (p.empty())
        p.assign(size_t(2 * spatial), 0);
      if (p.size() != size_t(2 * spatial))
        return fail(where + ": pads must have " + std::to_string(2 * spatial) +
                    " entries");
      pads = oneD ? std::vector<int64_t>{0, p[0], 0, p[1]} : p;
    } else if (autoPad != "VALID") {
      return fail(where + ": auto_pad '" + autoPad + "' is not supported");
    }
    if (x4[1] != wt.getDimSize(0) || group < 1 || x4[1] % group != 0 ||
        y4[1] != wt.getDimSize(1) * group)
      return fail(where + ": the weight's shape does not match the channels "
                          "and group");
    // Trailing pads: the rest of the total padding the shapes imply
    // (output_padding included), so that the transposed convolution's
    // window arithmetic maps the result's size back to x's.
    for (int d = 0; d < 2; ++d) {
      int64_t total = strides[d] * (x4[d + 2] - 1) + outPad[d] +
                      (kernel[d] - 1) * dilations[d] + 1 - y4[d + 2];
      pads[d + 2] = total - pads[d];
      if (pads[d] < 0 || pads[d + 2] < 0)
        return fail(where + ": pads and output shape do not fit the kernel, "
                            "strides and output_padding");
    }
    Value x2 = oneD ? nn::ReshapeOp::create(b, loc, RankedTensorType::get(x4, f32t), x).getResult() : x;
    Value w2 = w;
    if (oneD) {
      SmallVector<int64_t> ws(wt.getShape());
      ws.insert(ws.begin() + 2, 1);
      w2 = nn::ReshapeOp::create(b, loc, RankedTensorType::get(ws, f32t), w);
    }
    Value y = nn::ConvGradInputOp::create(
        b, loc, RankedTensorType::get(y4, f32t), x2, w2, i64s(strides),
        i64s(pads), i64s(dilations), b.getI64IntegerAttr(group));
    if (Value bias = in(2)) {
      auto bt = RankedTensorType::get({y4[1], 1, 1}, f32t);
      y = nn::AddOp::create(b, loc, y.getType(), y,
                            nn::ReshapeOp::create(b, loc, bt, bias));
    } else if (!error.empty()) {
      return false;
    }
    if (oneD)
      y = nn::ReshapeOp::create(b, loc, rt0, y);
    return out0(y);
  }

  /// Resize / Upsample in nearest mode by whole factors: every element
  /// repeated s_d times along dimension d, i.e. a view with a unit
  /// dimension after each, an Expand to s_d there, and a view back; or
  /// bilinear over H and W.
  bool resize() {
    Value x = in(0);
    if (!x)
      return false;
    auto xt = rtype(x);
    auto yt = cast<RankedTensorType>(rt0);
    std::string mode = attrString(node, "mode", "nearest");
    std::string coord = attrString(node, "coordinate_transformation_mode",
                                   op == "Upsample" ? "asymmetric" : "half_pixel");
    std::string nearest = attrString(node, "nearest_mode",
                                     op == "Upsample" ? "floor"
                                                      : "round_prefer_floor");
    if (mode == "linear") {
      // Bilinear over H and W of NCHW (F.interpolate(mode="bilinear")).
      if (xt.getRank() != 4 || yt.getDimSize(0) != xt.getDimSize(0) ||
          yt.getDimSize(1) != xt.getDimSize(1))
        return fail(where + ": linear mode resizes H and W of a 4-D NCHW "
                            "tensor only");
      if (coord != "half_pixel" && coord != "pytorch_half_pixel" &&
          coord != "align_corners" && coord != "asymmetric")
        return fail(where + ": coordinate_transformation_mode '" + coord +
                    "' is not supported in linear mode");
      // ONNX's scales when given (they may differ from out/in after the
      // floor), else out/in.
      SmallVector<double> scales = {
          double(yt.getDimSize(2)) / double(xt.getDimSize(2)),
          double(yt.getDimSize(3)) / double(xt.getDimSize(3))};
      int scalesInput = op == "Upsample" ? 1 : 2;
      if (node.input_size() > scalesInput && !node.input(scalesInput).empty()) {
        auto c = constOf(node.input(scalesInput));
        if (c && c->numel() == 4) {
          scales = {c->real(2), c->real(3)};
        } else if (!c || c->numel() != 0) {
          return fail(where + ": scales must be a constant of 4 values");
        }
      }
      return out0(nn::ResizeLinearOp::create(
          b, loc, rt0, x, b.getStringAttr(coord),
          b.getDenseF64ArrayAttr(scales)));
    }
    if (mode != "nearest")
      return fail(where + ": mode '" + mode + "' is not supported (nearest "
                          "by whole factors, or linear)");
    bool exact = (coord == "asymmetric" && nearest == "floor") ||
                 ((coord == "half_pixel" || coord == "pytorch_half_pixel") &&
                  (nearest == "round_prefer_floor" ||
                   nearest == "round_prefer_ceil"));
    SmallVector<int64_t> split, repeated;
    bool whole = yt.getRank() == xt.getRank(), identity = whole;
    for (int64_t d = 0; whole && d < xt.getRank(); ++d) {
      int64_t in = xt.getDimSize(d), out = yt.getDimSize(d);
      whole = in > 0 && out % in == 0;
      identity &= out == in;
      split.append({in, 1});
      repeated.append({in, whole ? out / in : 1});
    }
    // Factors of 1 map every index to itself under any mode.
    exact |= identity;
    if (!whole)
      return fail(where + ": only whole upsampling factors are supported "
                          "(output " + dimsString(std::vector<int64_t>(yt.getShape().begin(), yt.getShape().end())) +
                  " from " + dimsString(std::vector<int64_t>(xt.getShape().begin(), xt.getShape().end())) + ")");
    if (!exact)
      return fail(where + ": coordinate_transformation_mode '" + coord +
                  "' with nearest_mode '" + nearest + "' is not supported "
                  "(asymmetric + floor, or half_pixel/pytorch_half_pixel + "
                  "round_prefer_floor/ceil, which repeat each element)");
    Value y = nn::ReshapeOp::create(b, loc, RankedTensorType::get(split, b.getF32Type()), x);
    y = nn::ExpandOp::create(b, loc, RankedTensorType::get(repeated, b.getF32Type()), y);
    return out0(nn::ReshapeOp::create(b, loc, rt0, y));
  }

  bool globalAveragePool() {
    Value x = in(0);
    if (!x)
      return false;
    if (rtype(x).getRank() < 3)
      return fail(where + ": the input must be [N, C, spatial...]");
    int64_t spatial = 1;
    for (int64_t d : rtype(x).getShape().drop_front(2))
      spatial *= d;
    if (spatial == 0)
      return fail(where + ": empty spatial dimensions");
    return out0(nn::SumToShapeOp::create(b, loc, rt0, x,
                                         b.getF64FloatAttr(1.0 / spatial)));
  }
};

template <bool (ConvPool::*M)()>
OpSpec spec(const char *op, Operands operands, const char *note) {
  return conversion<ConvPool, M>("conv-pool", op, 13, operands, note);
}

} // namespace

void registerConvPoolOps(OpRegistry &r) {
  using C = ConvPool;
  r.add(spec<&C::window>("Conv", Operands::Float,
                         "1-D and 2-D, groups, dilations, auto_pad"));
  r.add(spec<&C::window>("MaxPool", Operands::Float,
                         "1-D and 2-D; no Indices output, storage_order 0"));
  r.add(spec<&C::window>("AveragePool", Operands::Float,
                         "1-D and 2-D, count_include_pad"));
  r.add(spec<&C::convTranspose>("ConvTranspose", Operands::Float,
                                "1-D and 2-D, output_padding, output_shape"));
  r.add(spec<&C::globalAveragePool>("GlobalAveragePool", Operands::Float, ""));
  for (const char *op : {"Resize", "Upsample"})
    r.add(spec<&C::resize>(op, Operands::FirstFloat,
                           "nearest by whole factors, or linear over H and W"));
}

} // namespace pipec::import
