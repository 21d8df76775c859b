//===- Normalization.cpp - BatchNormalization, LayerNormalization ---------===//
#include "../Convert.h"

#include "dialects/nn/NNDialect.h"

#include "mlir/Dialect/MLProgram/IR/MLProgram.h"

using namespace mlir;

namespace pipec::import {
namespace {

struct Normalization : NodeContext {
  explicit Normalization(const NodeContext &c) : NodeContext(c) {}

  /// Inference mode reads the running statistics; training mode (the
  /// attribute, or the statistics outputs before opset 14) normalises by
  /// the batch's and stores the updated running statistics in their
  /// globals.
  bool batchNorm() {
    Value x = in(0), scale = in(1), bias = in(2), mean = in(3), var = in(4);
    if (!x || !scale || !bias || !mean || !var)
      return false;
    float eps = attrFloat(node, "epsilon", 1e-5f);
    bool training = attrInt(node, "training_mode", 0) != 0 ||
                    (node.output_size() > 1 && !node.output(1).empty());
    if (!training)
      return out0(nn::BatchNormInferenceOp::create(b, loc, rt0, x, scale, bias,
                                                   mean, var, f32(eps)));
    auto vec = scale.getType();
    auto bn = nn::BatchNormOp::create(b, loc, rt0, vec, vec, vec, vec, x, scale,
                                      bias, mean, var, f32(eps),
                                      f32(attrFloat(node, "momentum", 0.9f)));
    // The running statistics live in their globals: store the update.
    for (auto [stat, v] : {std::pair<Value, Value>{mean, bn.getNewRunningMean()},
                           std::pair<Value, Value>{var, bn.getNewRunningVar()}})
      if (auto load = stat.getDefiningOp<ml_program::GlobalLoadOp>())
        ml_program::GlobalStoreOp::create(b, loc, load.getGlobalAttr(), v);
    if (node.output_size() > 1 && !node.output(1).empty())
      values[node.output(1)] = bn.getNewRunningMean();
    if (node.output_size() > 2 && !node.output(2).empty())
      values[node.output(2)] = bn.getNewRunningVar();
    return out0(bn.getOutput());
  }

  bool layerNorm() {
    Value x = in(0), scale = in(1);
    if (!x || !scale)
      return false;
    Value bias = in(2);
    if (!error.empty())
      return false;
    auto xt = rtype(x);
    int64_t axis = attrInt(node, "axis", -1);
    if (axis < 0)
      axis += xt.getRank();
    if (axis < 0 || axis >= xt.getRank())
      return fail(where + ": axis " + std::to_string(attrInt(node, "axis", -1)) +
                  " is out of range for rank " + std::to_string(xt.getRank()));
    int64_t outer = 1;
    for (int64_t i = 0; i < axis; ++i)
      outer *= xt.getDimSize(i);
    auto stat = RankedTensorType::get({outer}, b.getF32Type());
    auto ln = nn::LayerNormOp::create(b, loc, rt0, stat, stat, x, scale, bias,
                                      b.getI64IntegerAttr(axis),
                                      f32(attrFloat(node, "epsilon", 1e-5f)));
    for (int k = 1; k < 3 && k < node.output_size(); ++k)
      if (!node.output(k).empty())
        values[node.output(k)] = nn::ReshapeOp::create(
            b, loc, resultTypes[k], k == 1 ? ln.getMean() : ln.getInvStd());
    return out0(ln.getOutput());
  }
};

} // namespace

void registerNormalizationOps(OpRegistry &r) {
  r.add(conversion<Normalization, &Normalization::batchNorm>(
      "normalization", "BatchNormalization", 13, Operands::Float,
      "training and inference mode; running statistics updated"));
  r.add(conversion<Normalization, &Normalization::layerNorm>(
      "normalization", "LayerNormalization", 17, Operands::Float,
      "Mean and InvStdDev outputs are not differentiated"));
}

} // namespace pipec::import
