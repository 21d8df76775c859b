//===- Training.cpp - ONNX's training operators (Momentum, Adam, Adagrad) --===//
//
// Domain ai.onnx.preview.training. Each node updates several tensors at
// once: inputs R, T, then k groups (X..., G..., state...), outputs
// (X_new..., state_new...). One nn op per tensor.
//
//===----------------------------------------------------------------------===//
#include "../Convert.h"

#include "dialects/nn/NNDialect.h"

using namespace mlir;

namespace pipec::import {
namespace {

struct Optimizers : NodeContext {
  explicit Optimizers(const NodeContext &c) : NodeContext(c) {}

  bool update() {
    int states = op == "Adam" ? 2 : 1;
    int groups = (node.input_size() - 2) / (2 + states);
    if (groups < 1 || node.input_size() != 2 + groups * (2 + states) ||
        node.output_size() != groups * (1 + states))
      return fail(where + ": unexpected number of inputs or outputs");
    Value r = in(0), t = in(1);
    if (!r || !t)
      return false;
    auto f = [&](const char *name, float dflt) {
      return b.getF32FloatAttr(attrFloat(node, name, dflt));
    };
    for (int k = 0; k < groups; ++k) {
      Value x = in(2 + k);
      Value g = in(2 + groups + k);
      Value s1 = in(2 + 2 * groups + k);
      Value s2 = states == 2 ? in(2 + 3 * groups + k) : Value();
      if (!x || !g || !s1 || (states == 2 && !s2))
        return false;
      Type type = x.getType();
      SmallVector<Value> outs;
      if (op == "Momentum") {
        std::string mode = "standard";
        if (const auto *m = findAttr(node, "mode"))
          mode = m->s();
        auto mo = nn::MomentumOp::create(
            b, loc, type, type, r, t, x, g, s1, f("alpha", 0), f("beta", 0),
            b.getStringAttr(mode), f("norm_coefficient", 0));
        outs = {mo.getXNew(), mo.getVNew()};
      } else if (op == "Adam") {
        auto ad = nn::AdamOp::create(
            b, loc, type, type, type, r, t, x, g, s1, s2, f("alpha", 0.9f),
            f("beta", 0.999f), f("norm_coefficient", 0),
            f("norm_coefficient_post", 0), f("epsilon", 1e-6f));
        outs = {ad.getXNew(), ad.getVNew(), ad.getHNew()};
      } else {
        auto ag = nn::AdagradOp::create(b, loc, type, type, r, t, x, g, s1,
                                        f("decay_factor", 0), f("epsilon", 1e-6f),
                                        f("norm_coefficient", 0));
        outs = {ag.getXNew(), ag.getHNew()};
      }
      for (int j = 0; j < 1 + states; ++j) {
        int out = j * groups + k;
        if (resultTypes[out] && resultTypes[out] != outs[j].getType())
          return fail(where + ": output type disagrees with shape inference");
        setOutput(out, outs[j]);
      }
    }
    return true;
  }
};

} // namespace

void registerTrainingOps(OpRegistry &r) {
  for (const char *op : {"Momentum", "Adam", "Adagrad"}) {
    OpSpec s = conversion<Optimizers, &Optimizers::update>(
        "training", op, 1, Operands::Labeled, "every group of one node");
    s.domain = kTrainingDomain;
    r.add(s);
  }
}

} // namespace pipec::import
