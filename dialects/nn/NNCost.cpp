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
  SmallVector<int64_t> a = operandShape(0);
  int64_t k = a[a.size() - (getTransA() ? 2 : 1)];
  return 2 * numel(getOutput()) * k;
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

//===----------------------------------------------------------------------===//
// CNN and transformer ops
//===----------------------------------------------------------------------===//

int64_t ErfOp::getForwardFlops() { return 10 * numel(getOutput()); }
int64_t SqrtOp::getForwardFlops() { return numel(getOutput()); }
int64_t ExpOp::getForwardFlops() { return 4 * numel(getOutput()); }
int64_t LogOp::getForwardFlops() { return 4 * numel(getOutput()); }
int64_t NegOp::getForwardFlops() { return numel(getOutput()); }
int64_t AbsOp::getForwardFlops() { return numel(getOutput()); }
int64_t ReciprocalOp::getForwardFlops() { return numel(getOutput()); }
int64_t GeluOp::getForwardFlops() { return 12 * numel(getOutput()); }
int64_t LeakyReluOp::getForwardFlops() { return numel(getOutput()); }
int64_t ClipOp::getForwardFlops() { return numel(getOutput()); }
int64_t PowScalarOp::getForwardFlops() { return 4 * numel(getOutput()); }
int64_t PowOp::getForwardFlops() { return 4 * numel(getOutput()); }
int64_t MaxOp::getForwardFlops() { return numel(getOutput()); }
int64_t MinOp::getForwardFlops() { return numel(getOutput()); }
int64_t UnaryGradOp::getForwardFlops() { return 4 * numel(getOutput()); }
int64_t BinaryGradOp::getForwardFlops() { return 6 * numel(getGrad()); }
int64_t ConvOp::getForwardFlops() {
  auto w = cast<RankedTensorType>(getWeight().getType());
  int64_t perOut = w.getDimSize(1) * w.getDimSize(2) * w.getDimSize(3);
  return 2 * numel(getOutput()) * perOut;
}
static int64_t convGradFlops(Value grad, Value weightLike, Value result,
                             bool resultIsWeight) {
  auto w = cast<RankedTensorType>(resultIsWeight ? result.getType()
                                                 : weightLike.getType());
  return 2 * numel(grad) * w.getDimSize(1) * w.getDimSize(2) * w.getDimSize(3);
}
int64_t ConvGradInputOp::getForwardFlops() {
  return convGradFlops(getGrad(), getOther(), getOutput(), false);
}
int64_t ConvGradWeightOp::getForwardFlops() {
  return convGradFlops(getGrad(), getOther(), getOutput(), true);
}
int64_t MaxPoolOp::getForwardFlops() {
  return numel(getOutput()) * getKernel()[0] * getKernel()[1];
}
int64_t MaxPoolGradOp::getForwardFlops() { return numel(getGrad()); }
int64_t AveragePoolOp::getForwardFlops() {
  return numel(getOutput()) * getKernel()[0] * getKernel()[1];
}
int64_t AveragePoolGradOp::getForwardFlops() {
  return numel(getGrad()) * getKernel()[0] * getKernel()[1];
}
int64_t ResizeLinearOp::getForwardFlops() { return 7 * numel(getOutput()); }
int64_t ResizeLinearGradOp::getForwardFlops() { return 8 * numel(getGrad()); }
int64_t BatchNormOp::getForwardFlops() { return 8 * numel(getInput()); }
int64_t BatchNormInferenceOp::getForwardFlops() { return 4 * numel(getInput()); }
int64_t BatchNormGradOp::getForwardFlops() { return 10 * numel(getInput()); }
int64_t LayerNormOp::getForwardFlops() { return 8 * numel(getInput()); }
int64_t LayerNormGradOp::getForwardFlops() { return 12 * numel(getInput()); }
int64_t GatherOp::getForwardFlops() { return 0; }
int64_t GatherGradOp::getForwardFlops() { return numel(getGrad()); }
int64_t ExpandOp::getForwardFlops() { return 0; }
int64_t ConcatOp::getForwardFlops() { return 0; }
int64_t SliceOp::getForwardFlops() { return 0; }
int64_t SliceGradOp::getForwardFlops() { return 0; }
int64_t DropoutOp::getForwardFlops() { return 8 * numel(getInput()); }
int64_t CompareOp::getForwardFlops() { return numel(getOutput()); }
int64_t WhereOp::getForwardFlops() { return numel(getOutput()); }
int64_t CastOp::getForwardFlops() { return numel(getOutput()); }
