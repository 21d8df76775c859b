//===- ConstFold.cpp - fold exporter shape subgraphs at import ------------===//
//
// A small reference evaluator (ONNX semantics) for the ops exporters use to
// compute shapes, indices and masks. Values are int64 (integers and bools)
// or double (floats); the importer materialises float results it needs as
// nn.constant and folds the rest away.
//
//===----------------------------------------------------------------------===//
#include "ConstFold.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

using namespace pipec::import;

int64_t ConstTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : dims)
    n *= d;
  return n;
}

namespace {

using Dims = std::vector<int64_t>;

const onnx::AttributeProto *attr(const onnx::NodeProto &n, const char *name) {
  for (const auto &a : n.attribute())
    if (a.name() == name)
      return &a;
  return nullptr;
}

int64_t attrInt(const onnx::NodeProto &n, const char *name, int64_t dflt) {
  const auto *a = attr(n, name);
  return a ? a->i() : dflt;
}

std::vector<int64_t> attrInts(const onnx::NodeProto &n, const char *name) {
  const auto *a = attr(n, name);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end())
           : std::vector<int64_t>{};
}

Dims stridesOf(const Dims &dims) {
  Dims s(dims.size(), 1);
  for (int64_t i = int64_t(dims.size()) - 2; i >= 0; --i)
    s[i] = s[i + 1] * dims[i + 1];
  return s;
}

ConstTensor make(Dims dims, bool isFloat) {
  ConstTensor t;
  t.dims = std::move(dims);
  t.isFloat = isFloat;
  if (isFloat)
    t.reals.assign(t.numel(), 0.0);
  else
    t.ints.assign(t.numel(), 0);
  return t;
}

void set(ConstTensor &t, int64_t i, double v) {
  if (t.isFloat)
    t.reals[i] = v;
  else
    t.ints[i] = static_cast<int64_t>(v);
}

void copyElem(ConstTensor &dst, int64_t di, const ConstTensor &src, int64_t si) {
  if (dst.isFloat)
    dst.reals[di] = src.real(si);
  else
    dst.ints[di] = src.integer(si);
}

/// Numpy broadcast of several shapes; empty optional when incompatible.
std::optional<Dims> broadcast(const std::vector<Dims> &shapes) {
  size_t rank = 0;
  for (const Dims &s : shapes)
    rank = std::max(rank, s.size());
  Dims out(rank, 1);
  for (const Dims &s : shapes)
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t &o = out[rank - s.size() + i];
      int64_t d = s[i];
      if (d != 1 && o != 1 && d != o)
        return std::nullopt;
      if (d != 1)
        o = d;
    }
  return out;
}

/// Offset into `t` (right-aligned, broadcast) of multi-index `idx` of rank r.
int64_t broadcastOffset(const ConstTensor &t, const Dims &idx) {
  Dims st = stridesOf(t.dims);
  size_t off = idx.size() - t.dims.size();
  int64_t o = 0;
  for (size_t i = 0; i < t.dims.size(); ++i)
    if (t.dims[i] != 1)
      o += idx[off + i] * st[i];
  return o;
}

Dims unravel(int64_t i, const Dims &dims) {
  Dims idx(dims.size());
  for (int64_t d = int64_t(dims.size()) - 1; d >= 0; --d) {
    idx[d] = dims[d] ? i % dims[d] : 0;
    i = dims[d] ? i / dims[d] : 0;
  }
  return idx;
}

int64_t normAxis(int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; }

std::optional<ConstTensor> elementwise(const onnx::NodeProto &node,
                                       const std::vector<ConstTensor> &in,
                                       std::string &why) {
  const std::string &op = node.op_type();
  std::vector<Dims> shapes;
  for (const auto &t : in)
    shapes.push_back(t.dims);
  auto dims = broadcast(shapes);
  if (!dims) {
    why = "operand shapes do not broadcast";
    return std::nullopt;
  }
  static const std::set<std::string> compare = {
      "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or",
      "Xor", "Not"};
  bool anyFloat = false;
  for (const auto &t : in)
    anyFloat |= t.isFloat;
  bool outFloat = compare.count(op) ? false
                  : op == "Where"   ? (in[1].isFloat || in[2].isFloat)
                  : op == "Sqrt"    ? true
                                    : anyFloat;
  ConstTensor out = make(*dims, outFloat);
  for (int64_t i = 0; i < out.numel(); ++i) {
    Dims idx = unravel(i, *dims);
    auto v = [&](int k) { return in[k].real(broadcastOffset(in[k], idx)); };
    auto iv = [&](int k) { return in[k].integer(broadcastOffset(in[k], idx)); };
    double r = 0;
    if (op == "Add")
      r = v(0) + v(1);
    else if (op == "Sub")
      r = v(0) - v(1);
    else if (op == "Mul")
      r = v(0) * v(1);
    else if (op == "Div")
      r = outFloat ? v(0) / v(1) : double(iv(1) ? iv(0) / iv(1) : 0);
    else if (op == "Pow")
      r = std::pow(v(0), v(1));
    else if (op == "Max")
      r = std::max(v(0), v(1));
    else if (op == "Min")
      r = std::min(v(0), v(1));
    else if (op == "Equal")
      r = v(0) == v(1);
    else if (op == "Less")
      r = v(0) < v(1);
    else if (op == "Greater")
      r = v(0) > v(1);
    else if (op == "LessOrEqual")
      r = v(0) <= v(1);
    else if (op == "GreaterOrEqual")
      r = v(0) >= v(1);
    else if (op == "And")
      r = iv(0) && iv(1);
    else if (op == "Or")
      r = iv(0) || iv(1);
    else if (op == "Xor")
      r = bool(iv(0)) != bool(iv(1));
    else if (op == "Not")
      r = !iv(0);
    else if (op == "Neg")
      r = -v(0);
    else if (op == "Abs")
      r = std::fabs(v(0));
    else if (op == "Sqrt")
      r = std::sqrt(v(0));
    else if (op == "Floor")
      r = std::floor(v(0));
    else if (op == "Ceil")
      r = std::ceil(v(0));
    else if (op == "Where")
      r = iv(0) ? v(1) : v(2);
    if (op == "Where" && !outFloat)
      out.ints[i] = iv(0) ? iv(1) : iv(2);
    else if (!outFloat && (op == "Add" || op == "Sub" || op == "Mul" ||
                           op == "Max" || op == "Min" || op == "Neg" ||
                           op == "Abs"))
      out.ints[i] = op == "Add"   ? iv(0) + iv(1)
                    : op == "Sub" ? iv(0) - iv(1)
                    : op == "Mul" ? iv(0) * iv(1)
                    : op == "Max" ? std::max(iv(0), iv(1))
                    : op == "Min" ? std::min(iv(0), iv(1))
                    : op == "Neg" ? -iv(0)
                                  : std::abs(iv(0));
    else
      set(out, i, r);
  }
  return out;
}

bool isFloatType(int32_t t) {
  return t == onnx::TensorProto::FLOAT || t == onnx::TensorProto::DOUBLE ||
         t == onnx::TensorProto::FLOAT16 || t == onnx::TensorProto::BFLOAT16;
}

bool isIntType(int32_t t) {
  return t == onnx::TensorProto::INT64 || t == onnx::TensorProto::INT32 ||
         t == onnx::TensorProto::INT16 || t == onnx::TensorProto::INT8 ||
         t == onnx::TensorProto::UINT8 || t == onnx::TensorProto::UINT16 ||
         t == onnx::TensorProto::UINT32 || t == onnx::TensorProto::BOOL;
}

} // namespace

std::optional<ConstTensor>
pipec::import::fromTensorProto(const onnx::TensorProto &t, std::string &why) {
  ConstTensor c;
  c.dims.assign(t.dims().begin(), t.dims().end());
  int64_t n = c.numel();
  int32_t type = t.data_type();
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    why = "external data";
    return std::nullopt;
  }
  const std::string &raw = t.raw_data();
  if (type == onnx::TensorProto::FLOAT || type == onnx::TensorProto::DOUBLE) {
    c.isFloat = true;
    bool dbl = type == onnx::TensorProto::DOUBLE;
    if (t.has_raw_data()) {
      size_t w = dbl ? 8 : 4;
      if (int64_t(raw.size()) != n * int64_t(w)) {
        why = "raw data size does not match the shape";
        return std::nullopt;
      }
      for (int64_t i = 0; i < n; ++i) {
        if (dbl) {
          double d;
          std::memcpy(&d, raw.data() + 8 * i, 8);
          c.reals.push_back(d);
        } else {
          float f;
          std::memcpy(&f, raw.data() + 4 * i, 4);
          c.reals.push_back(f);
        }
      }
    } else if (dbl) {
      c.reals.assign(t.double_data().begin(), t.double_data().end());
    } else {
      c.reals.assign(t.float_data().begin(), t.float_data().end());
    }
  } else if (isIntType(type)) {
    c.isFloat = false;
    if (t.has_raw_data()) {
      size_t w = type == onnx::TensorProto::INT64     ? 8
                 : type == onnx::TensorProto::INT32 ||
                           type == onnx::TensorProto::UINT32
                     ? 4
                 : type == onnx::TensorProto::INT16 ||
                           type == onnx::TensorProto::UINT16
                     ? 2
                     : 1;
      if (int64_t(raw.size()) != n * int64_t(w)) {
        why = "raw data size does not match the shape";
        return std::nullopt;
      }
      for (int64_t i = 0; i < n; ++i) {
        const char *p = raw.data() + w * i;
        int64_t v = 0;
        if (w == 8) {
          std::memcpy(&v, p, 8);
        } else if (w == 4) {
          int32_t x;
          std::memcpy(&x, p, 4);
          v = type == onnx::TensorProto::UINT32 ? int64_t(uint32_t(x)) : x;
        } else if (w == 2) {
          int16_t x;
          std::memcpy(&x, p, 2);
          v = type == onnx::TensorProto::UINT16 ? int64_t(uint16_t(x)) : x;
        } else {
          v = type == onnx::TensorProto::INT8 ? int64_t(int8_t(*p))
                                              : int64_t(uint8_t(*p));
        }
        c.ints.push_back(v);
      }
    } else if (type == onnx::TensorProto::INT64) {
      c.ints.assign(t.int64_data().begin(), t.int64_data().end());
    } else {
      c.ints.assign(t.int32_data().begin(), t.int32_data().end());
    }
  } else {
    why = "element type " + std::to_string(type) + " is not supported";
    return std::nullopt;
  }
  if ((c.isFloat ? int64_t(c.reals.size()) : int64_t(c.ints.size())) != n) {
    why = "the data does not match the shape";
    return std::nullopt;
  }
  return c;
}

//===----------------------------------------------------------------------===//
// The evaluators, one per op; the table below is the list of foldable ops.
//===----------------------------------------------------------------------===//

namespace {

/// The node's inputs (an absent optional input is an empty tensor).
using Inputs = std::vector<ConstTensor>;
using Folded = std::optional<ConstTensor>;
using Folder = Folded (*)(const onnx::NodeProto &, const Inputs &,
                          std::string &why);

Dims intList(const ConstTensor &t) {
  Dims v;
  for (int64_t i = 0; i < t.numel(); ++i)
    v.push_back(t.integer(i));
  return v;
}

Folded foldIdentity(const onnx::NodeProto &, const Inputs &in, std::string &) {
  return in[0];
}

Folded foldCast(const onnx::NodeProto &node, const Inputs &in,
                std::string &why) {
  int32_t to = int32_t(attrInt(node, "to", 1));
  ConstTensor out = make(in[0].dims, isFloatType(to));
  if (!isFloatType(to) && !isIntType(to)) {
    why = "Cast to element type " + std::to_string(to);
    return std::nullopt;
  }
  for (int64_t i = 0; i < out.numel(); ++i) {
    if (out.isFloat)
      out.reals[i] = to == onnx::TensorProto::FLOAT
                         ? double(float(in[0].real(i)))
                         : in[0].real(i);
    else
      out.ints[i] = to == onnx::TensorProto::BOOL ? (in[0].real(i) != 0)
                                                  : int64_t(in[0].real(i));
  }
  return out;
}

Folded foldElementwise(const onnx::NodeProto &node, const Inputs &in,
                       std::string &why) {
  const std::string &op = node.op_type();
  if ((op == "Max" || op == "Min") && in.size() != 2) {
    why = "variadic Max/Min";
    return std::nullopt;
  }
  return elementwise(node, in, why);
}

/// Axes from input 1 (opset 13) or the attribute (earlier opsets).
Dims axesOf(const onnx::NodeProto &node, const Inputs &in) {
  return in.size() > 1 && (!in[1].dims.empty() || in[1].numel())
             ? intList(in[1])
             : attrInts(node, "axes");
}

Folded foldUnsqueeze(const onnx::NodeProto &node, const Inputs &in,
                     std::string &) {
  Dims axes = axesOf(node, in);
  ConstTensor out = in[0];
  int64_t outRank = int64_t(in[0].dims.size() + axes.size());
  std::vector<bool> isNew(outRank, false);
  for (int64_t a : axes)
    isNew[normAxis(a, outRank)] = true;
  Dims dims;
  size_t k = 0;
  for (int64_t i = 0; i < outRank; ++i)
    dims.push_back(isNew[i] ? 1 : in[0].dims[k++]);
  out.dims = dims;
  return out;
}

Folded foldSqueeze(const onnx::NodeProto &node, const Inputs &in,
                   std::string &) {
  Dims axes = axesOf(node, in);
  ConstTensor out = in[0];
  int64_t rank = in[0].dims.size();
  std::set<int64_t> drop;
  for (int64_t a : axes)
    drop.insert(normAxis(a, rank));
  Dims dims;
  for (int64_t i = 0; i < rank; ++i)
    if (!(axes.empty() ? in[0].dims[i] == 1 : drop.count(i) > 0))
      dims.push_back(in[0].dims[i]);
  out.dims = dims;
  return out;
}

Folded foldReshape(const onnx::NodeProto &node, const Inputs &in,
                   std::string &why) {
  Dims shape = intList(in[1]);
  bool allowZero = attrInt(node, "allowzero", 0) != 0;
  int64_t known = 1, minus = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0 && !allowZero)
      shape[i] = in[0].dims.at(i);
    if (shape[i] == -1)
      minus = i;
    else
      known *= shape[i];
  }
  if (minus >= 0)
    shape[minus] = known ? in[0].numel() / known : 0;
  ConstTensor out = in[0];
  out.dims = shape;
  if (out.numel() != in[0].numel()) {
    why = "Reshape changes the element count";
    return std::nullopt;
  }
  return out;
}

Folded foldConcat(const onnx::NodeProto &node, const Inputs &in,
                  std::string &) {
  int64_t rank = in[0].dims.size();
  int64_t axis = normAxis(attrInt(node, "axis", 0), rank);
  bool anyFloat = false;
  Dims dims = in[0].dims;
  dims[axis] = 0;
  for (const auto &t : in) {
    anyFloat |= t.isFloat;
    dims[axis] += t.dims[axis];
  }
  ConstTensor out = make(dims, anyFloat);
  Dims ost = stridesOf(dims);
  int64_t offset = 0;
  for (const auto &t : in) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      Dims idx = unravel(i, t.dims);
      idx[axis] += offset;
      int64_t o = 0;
      for (int64_t d = 0; d < rank; ++d)
        o += idx[d] * ost[d];
      copyElem(out, o, t, i);
    }
    offset += t.dims[axis];
  }
  return out;
}

Folded foldGather(const onnx::NodeProto &node, const Inputs &in,
                  std::string &why) {
  const ConstTensor &data = in[0], &idx = in[1];
  int64_t rank = data.dims.size();
  int64_t axis = normAxis(attrInt(node, "axis", 0), rank);
  Dims dims(data.dims.begin(), data.dims.begin() + axis);
  dims.insert(dims.end(), idx.dims.begin(), idx.dims.end());
  dims.insert(dims.end(), data.dims.begin() + axis + 1, data.dims.end());
  ConstTensor out = make(dims, data.isFloat);
  Dims dst = stridesOf(data.dims);
  for (int64_t i = 0; i < out.numel(); ++i) {
    Dims o = unravel(i, dims);
    Dims ii(o.begin() + axis, o.begin() + axis + idx.dims.size());
    int64_t io = 0;
    Dims ist = stridesOf(idx.dims);
    for (size_t k = 0; k < ii.size(); ++k)
      io += ii[k] * ist[k];
    int64_t j = idx.integer(io);
    if (j < 0)
      j += data.dims[axis];
    if (j < 0 || j >= data.dims[axis]) {
      why = "Gather index out of range";
      return std::nullopt;
    }
    int64_t off = j * dst[axis];
    for (int64_t d = 0; d < axis; ++d)
      off += o[d] * dst[d];
    for (int64_t d = axis + 1; d < rank; ++d)
      off += o[d - 1 + idx.dims.size()] * dst[d];
    copyElem(out, i, data, off);
  }
  return out;
}

Folded foldSlice(const onnx::NodeProto &, const Inputs &in, std::string &) {
  const ConstTensor &data = in[0];
  int64_t rank = data.dims.size();
  Dims starts = intList(in[1]), ends = intList(in[2]);
  Dims axes, steps;
  if (in.size() > 3 && in[3].numel())
    axes = intList(in[3]);
  else
    for (size_t i = 0; i < starts.size(); ++i)
      axes.push_back(i);
  if (in.size() > 4 && in[4].numel())
    steps = intList(in[4]);
  else
    steps.assign(starts.size(), 1);
  Dims st(rank, 0), sp(rank, 1), dims = data.dims;
  for (size_t k = 0; k < axes.size(); ++k) {
    int64_t a = normAxis(axes[k], rank), n = data.dims[a], step = steps[k];
    int64_t s = starts[k], e = ends[k];
    if (s < 0)
      s += n;
    if (e < 0)
      e += n;
    if (step > 0) {
      s = std::clamp<int64_t>(s, 0, n);
      e = std::clamp<int64_t>(e, 0, n);
      dims[a] = e > s ? (e - s + step - 1) / step : 0;
    } else {
      s = std::clamp<int64_t>(s, 0, n - 1);
      e = std::clamp<int64_t>(e, -1, n - 1);
      dims[a] = s > e ? (s - e - step - 1) / (-step) : 0;
    }
    st[a] = s;
    sp[a] = step;
  }
  ConstTensor out = make(dims, data.isFloat);
  Dims dst = stridesOf(data.dims);
  for (int64_t i = 0; i < out.numel(); ++i) {
    Dims o = unravel(i, dims);
    int64_t off = 0;
    for (int64_t d = 0; d < rank; ++d)
      off += (st[d] + o[d] * sp[d]) * dst[d];
    copyElem(out, i, data, off);
  }
  return out;
}

Folded foldExpand(const onnx::NodeProto &, const Inputs &in, std::string &why) {
  auto dims = broadcast({in[0].dims, intList(in[1])});
  if (!dims) {
    why = "Expand shapes do not broadcast";
    return std::nullopt;
  }
  ConstTensor out = make(*dims, in[0].isFloat);
  for (int64_t i = 0; i < out.numel(); ++i)
    copyElem(out, i, in[0], broadcastOffset(in[0], unravel(i, *dims)));
  return out;
}

Folded foldRange(const onnx::NodeProto &, const Inputs &in, std::string &why) {
  bool f = in[0].isFloat || in[1].isFloat || in[2].isFloat;
  double start = in[0].real(0), limit = in[1].real(0), delta = in[2].real(0);
  if (delta == 0) {
    why = "Range with delta 0";
    return std::nullopt;
  }
  int64_t n = std::max<int64_t>(0, int64_t(std::ceil((limit - start) / delta)));
  ConstTensor out = make({n}, f);
  for (int64_t i = 0; i < n; ++i)
    set(out, i, start + i * delta);
  return out;
}

Folded foldConstantOfShape(const onnx::NodeProto &node, const Inputs &in,
                           std::string &why) {
  Dims dims = intList(in[0]);
  ConstTensor value;
  value.isFloat = true;
  value.reals = {0.0};
  if (const auto *v = attr(node, "value")) {
    auto c = fromTensorProto(v->t(), why);
    if (!c)
      return std::nullopt;
    value = *c;
  }
  ConstTensor out = make(dims, value.isFloat);
  for (int64_t i = 0; i < out.numel(); ++i)
    copyElem(out, i, value, 0);
  return out;
}

Folded foldTranspose(const onnx::NodeProto &node, const Inputs &in,
                     std::string &) {
  int64_t rank = in[0].dims.size();
  Dims perm = attrInts(node, "perm");
  if (perm.empty())
    for (int64_t i = rank - 1; i >= 0; --i)
      perm.push_back(i);
  Dims dims, ist = stridesOf(in[0].dims);
  for (int64_t p : perm)
    dims.push_back(in[0].dims[p]);
  ConstTensor out = make(dims, in[0].isFloat);
  for (int64_t i = 0; i < out.numel(); ++i) {
    Dims o = unravel(i, dims);
    int64_t off = 0;
    for (int64_t d = 0; d < rank; ++d)
      off += o[d] * ist[perm[d]];
    copyElem(out, i, in[0], off);
  }
  return out;
}

/// Every op with constant inputs the evaluator computes (Shape and Size,
/// which read only a static shape, are handled before).
const std::map<std::string, Folder> &folders() {
  static const std::map<std::string, Folder> table = {
      {"Identity", foldIdentity},
      {"Cast", foldCast},
      {"Neg", foldElementwise},
      {"Abs", foldElementwise},
      {"Sqrt", foldElementwise},
      {"Floor", foldElementwise},
      {"Ceil", foldElementwise},
      {"Not", foldElementwise},
      {"Add", foldElementwise},
      {"Sub", foldElementwise},
      {"Mul", foldElementwise},
      {"Div", foldElementwise},
      {"Pow", foldElementwise},
      {"Max", foldElementwise},
      {"Min", foldElementwise},
      {"Equal", foldElementwise},
      {"Less", foldElementwise},
      {"Greater", foldElementwise},
      {"LessOrEqual", foldElementwise},
      {"GreaterOrEqual", foldElementwise},
      {"And", foldElementwise},
      {"Or", foldElementwise},
      {"Xor", foldElementwise},
      {"Where", foldElementwise},
      {"Unsqueeze", foldUnsqueeze},
      {"Squeeze", foldSqueeze},
      {"Reshape", foldReshape},
      {"Concat", foldConcat},
      {"Gather", foldGather},
      {"Slice", foldSlice},
      {"Expand", foldExpand},
      {"Range", foldRange},
      {"ConstantOfShape", foldConstantOfShape},
      {"Transpose", foldTranspose},
  };
  return table;
}

/// Shape and Size: the static shape of input 0, which need not be constant.
std::optional<ConstTensor> foldShapeOf(
    const onnx::NodeProto &node,
    const std::function<std::optional<Dims>(const std::string &)> &staticShape,
    std::string &why) {
  auto shape = staticShape(node.input(0));
  if (!shape) {
    why = "the shape of '" + node.input(0) + "' is not static";
    return std::nullopt;
  }
  ConstTensor out;
  if (node.op_type() == "Size") {
    int64_t n = 1;
    for (int64_t d : *shape)
      n *= d;
    out.ints = {n};
    return out;
  }
  int64_t rank = shape->size();
  int64_t start = attrInt(node, "start", 0), end = attrInt(node, "end", rank);
  start = std::clamp<int64_t>(start < 0 ? start + rank : start, 0, rank);
  end = std::clamp<int64_t>(end < 0 ? end + rank : end, 0, rank);
  for (int64_t i = start; i < end; ++i)
    out.ints.push_back((*shape)[i]);
  out.dims = {int64_t(out.ints.size())};
  return out;
}

} // namespace

bool pipec::import::isFoldable(const std::string &op) {
  return op == "Shape" || op == "Size" || folders().count(op);
}

std::optional<std::vector<ConstTensor>> pipec::import::foldNode(
    const onnx::NodeProto &node,
    const std::function<std::optional<ConstTensor>(int)> &input,
    const std::function<std::optional<Dims>(const std::string &)> &staticShape,
    std::string &why) {
  const std::string &op = node.op_type();
  std::optional<ConstTensor> out;
  if (op == "Shape" || op == "Size") {
    out = foldShapeOf(node, staticShape, why);
  } else {
    auto folder = folders().find(op);
    if (folder == folders().end()) {
      why = "no constant evaluator for " + op;
      return std::nullopt;
    }
    // Every other op needs all its (non-empty) inputs constant.
    Inputs in;
    for (int i = 0; i < node.input_size(); ++i) {
      if (node.input(i).empty()) {
        in.push_back(ConstTensor{});
        continue;
      }
      auto c = input(i);
      if (!c) {
        why = "input '" + node.input(i) + "' is computed at run time";
        return std::nullopt;
      }
      in.push_back(std::move(*c));
    }
    out = folder->second(node, in, why);
  }
  if (!out)
    return std::nullopt;
  return std::vector<ConstTensor>{std::move(*out)};
}

//===----------------------------------------------------------------------===//
// Folding on the ONNX graph
//===----------------------------------------------------------------------===//

bool pipec::import::toTensorProto(const ConstTensor &c, int32_t elemType,
                                  onnx::TensorProto &out) {
  out.Clear();
  for (int64_t d : c.dims)
    out.add_dims(d);
  out.set_data_type(elemType);
  const int64_t n = c.numel();
  std::string raw;
  auto put = [&](const void *p, size_t w) {
    raw.append(static_cast<const char *>(p), w);
  };
  switch (elemType) {
  case onnx::TensorProto::FLOAT:
    for (int64_t i = 0; i < n; ++i) {
      float v = static_cast<float>(c.real(i));
      put(&v, 4);
    }
    break;
  case onnx::TensorProto::DOUBLE:
    for (int64_t i = 0; i < n; ++i) {
      double v = c.real(i);
      put(&v, 8);
    }
    break;
  case onnx::TensorProto::INT64:
    for (int64_t i = 0; i < n; ++i) {
      int64_t v = c.integer(i);
      put(&v, 8);
    }
    break;
  case onnx::TensorProto::INT32:
    for (int64_t i = 0; i < n; ++i) {
      int32_t v = static_cast<int32_t>(c.integer(i));
      put(&v, 4);
    }
    break;
  case onnx::TensorProto::INT16:
    for (int64_t i = 0; i < n; ++i) {
      int16_t v = static_cast<int16_t>(c.integer(i));
      put(&v, 2);
    }
    break;
  case onnx::TensorProto::INT8:
  case onnx::TensorProto::UINT8:
  case onnx::TensorProto::BOOL:
    for (int64_t i = 0; i < n; ++i) {
      int8_t v = static_cast<int8_t>(elemType == onnx::TensorProto::BOOL
                                         ? c.integer(i) != 0
                                         : c.integer(i));
      put(&v, 1);
    }
    break;
  default:
    return false;
  }
  out.set_raw_data(std::move(raw));
  return true;
}

int64_t pipec::import::foldGraphConstants(
    onnx::GraphProto &graph,
    const std::function<bool(const std::string &)> &isWeight,
    const std::function<std::optional<KnownType>(const std::string &)>
        &typeOf,
    const std::function<const onnx::TensorProto *(const std::string &)>
        &dataOf) {
  // Folded values larger than this stay nodes (the importer's own folding
  // or a kernel computes them); shape computations are tiny.
  constexpr int64_t kMaxFoldedElements = int64_t(1) << 22;
  std::map<std::string, const onnx::TensorProto *> sources;
  for (const auto &t : graph.initializer())
    if (!isWeight(t.name()))
      sources[t.name()] = &t;
  std::map<std::string, ConstTensor> cache;
  auto constOf = [&](const std::string &name) -> std::optional<ConstTensor> {
    if (auto it = cache.find(name); it != cache.end())
      return it->second;
    auto it = sources.find(name);
    const onnx::TensorProto *t = it != sources.end() ? it->second : nullptr;
    if (!t && dataOf && !isWeight(name))
      t = dataOf(name);
    if (!t)
      return std::nullopt;
    std::string why;
    auto c = fromTensorProto(*t, why);
    if (c)
      cache[name] = *c;
    return c;
  };
  auto staticShape = [&](const std::string &name) -> std::optional<Dims> {
    auto t = typeOf(name);
    if (!t)
      return std::nullopt;
    return t->dims;
  };

  int64_t replaced = 0;
  for (auto &node : *graph.mutable_node()) {
    const std::string &op = node.op_type();
    if (!node.domain().empty() && node.domain() != "ai.onnx")
      continue;
    if (op == "Constant") {
      for (const auto &a : node.attribute())
        if (a.name() == "value" && a.has_t() && node.output_size() == 1)
          sources[node.output(0)] = &a.t();
      continue;
    }
    if (!isFoldable(op) || node.output_size() != 1)
      continue;
    bool weightInput = false;
    for (const auto &in : node.input())
      weightInput |= !in.empty() && isWeight(in);
    if (weightInput)
      continue;
    std::string why;
    auto outs = foldNode(
        node, [&](int i) { return constOf(node.input(i)); }, staticShape, why);
    if (!outs || outs->size() != 1 || (*outs)[0].numel() > kMaxFoldedElements)
      continue;
    const ConstTensor &c = (*outs)[0];
    int32_t elemType =
        c.isFloat ? onnx::TensorProto::FLOAT : onnx::TensorProto::INT64;
    if (auto t = typeOf(node.output(0)); t && t->elemType != 0)
      elemType = t->elemType;
    onnx::TensorProto value;
    if (!toTensorProto(c, elemType, value))
      continue;
    std::string output = node.output(0), name = node.name();
    node.Clear();
    node.set_op_type("Constant");
    node.set_name(name);
    node.add_output(output);
    auto *a = node.add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    *a->mutable_t() = std::move(value);
    cache[output] = c;
    sources.erase(output);
    ++replaced;
  }
  return replaced;
}
