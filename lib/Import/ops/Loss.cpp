//===- Loss.cpp - SoftmaxCrossEntropyLoss ---------------------------------===//
#include "../Convert.h"

#include "dialects/nn/NNDialect.h"

using namespace mlir;

namespace pipec::import {
namespace {

struct Losses : NodeContext {
  explicit Losses(const NodeContext &c) : NodeContext(c) {}

  bool softmaxCrossEntropy() {
    if (!need(2))
      return false;
    Value weights = in(2);
    if (!error.empty())
      return false;
    std::string reduction = "mean";
    if (const auto *r = findAttr(node, "reduction"))
      reduction = r->s();
    IntegerAttr ignore;
    if (const auto *ii = findAttr(node, "ignore_index"))
      ignore = b.getI64IntegerAttr(ii->i());
    Type logProbType = resultTypes.size() > 1 ? resultTypes[1] : Type();
    auto sce = nn::SoftmaxCrossEntropyLossOp::create(
        b, loc, rt0, logProbType, in(0), in(1), weights,
        b.getStringAttr(reduction), ignore);
    setOutput(0, sce.getLoss());
    if (logProbType)
      setOutput(1, sce.getLogProb());
    return true;
  }
};

} // namespace

void registerLossOps(OpRegistry &r) {
  r.add(conversion<Losses, &Losses::softmaxCrossEntropy>(
      "loss", "SoftmaxCrossEntropyLoss", 13, Operands::Labeled,
      "reductions mean/sum/none, weights, ignore_index; log_prob is not "
      "differentiated"));
}

} // namespace pipec::import
