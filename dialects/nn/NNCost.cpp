//===- NNCost.cpp - CostOpInterface implementations -----------------------===//
//
// Forward FLOP counts of every nn op (the backward defaults to twice the
// forward: two products of the same size for Gemm/MatMul, a few elementwise
// passes otherwise).
//
//===----------------------------------------------------------------------===//
#include "dialects/nn/NNDialect.h"

using namespace mlir;
using namespace pipec::nn;

static int64_t numel(Value v) {
  return cast<RankedTensorType>(v.getType()).getNumElements();
}

int64_t GemmOp::getForwardFlops() {
  auto a = cast<RankedTensorType>(getA().getType());
  int64_t k = getTransA() ? a.getDimSize(0) : a.getDimSize(1);
  return 2 * numel(getOutput()) * k + (getC() ? numel(getOutput()) : 0);
}
int64_t MatMulOp::getForwardFlops() {
  auto a = cast<RankedTensorType>(getA().getType());
  return 2 * numel(getOutput()) * a.getShape().back();
}
int64_t AddOp::getForwardFlops() { return numel(getOutput()); }
int64_t SubOp::getForwardFlops() { return numel(getOutput()); }
int64_t MulOp::getForwardFlops() { return numel(getOutput()); }
int64_t DivOp::getForwardFlops() { return numel(getOutput()); }
int64_t ReluOp::getForwardFlops() { return numel(getOutput()); }
int64_t TanhOp::getForwardFlops() { return 4 * numel(getOutput()); }
int64_t SigmoidOp::getForwardFlops() { return 4 * numel(getOutput()); }
int64_t IdentityOp::getForwardFlops() { return 0; }
int64_t SoftmaxOp::getForwardFlops() { return 5 * numel(getOutput()); }
int64_t LogSoftmaxOp::getForwardFlops() { return 5 * numel(getOutput()); }
int64_t FlattenOp::getForwardFlops() { return 0; }
int64_t ReshapeOp::getForwardFlops() { return 0; }
int64_t TransposeOp::getForwardFlops() { return 0; }
int64_t SoftmaxCrossEntropyLossOp::getForwardFlops() {
  return 6 * numel(getScores());
}
int64_t ReluGradOp::getForwardFlops() { return numel(getOutput()); }
int64_t TanhGradOp::getForwardFlops() { return 3 * numel(getOutput()); }
int64_t SigmoidGradOp::getForwardFlops() { return 3 * numel(getOutput()); }
int64_t SoftmaxGradOp::getForwardFlops() { return 4 * numel(getOutput()); }
int64_t SumToShapeOp::getForwardFlops() { return numel(getInput()); }
int64_t ScaleOp::getForwardFlops() { return numel(getOutput()); }
int64_t SoftmaxCrossEntropyLossGradOp::getForwardFlops() {
  return 6 * numel(getScores());
}
int64_t SgdUpdateOp::getForwardFlops() { return 2 * numel(getOutput()); }
int64_t FillOp::getForwardFlops() { return 0; }
int64_t MomentumOp::getForwardFlops() { return 5 * numel(getX()); }
int64_t AdamOp::getForwardFlops() { return 12 * numel(getX()); }
int64_t AdagradOp::getForwardFlops() { return 7 * numel(getX()); }
