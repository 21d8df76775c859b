//===- MatMul.cpp - Gemm and MatMul --------------------------------------===//
#include "../Convert.h"

#include "dialects/nn/NNDialect.h"

using namespace mlir;

namespace pipec::import {
namespace {

struct MatMuls : NodeContext {
  explicit MatMuls(const NodeContext &c) : NodeContext(c) {}

  bool gemm() {
    if (!need(2))
      return false;
    Value c = in(2);
    if (!error.empty())
      return false;
    return out0(nn::GemmOp::create(
        b, loc, rt0, in(0), in(1), c,
        b.getF32FloatAttr(attrFloat(node, "alpha", 1.0f)),
        b.getF32FloatAttr(attrFloat(node, "beta", 1.0f)),
        b.getBoolAttr(attrInt(node, "transA", 0) != 0),
        b.getBoolAttr(attrInt(node, "transB", 0) != 0)));
  }

  bool matmul() {
    if (!need(2))
      return false;
    if (rtype(in(0)).getRank() < 2 || rtype(in(1)).getRank() < 2)
      return fail(where + ": 1-D MatMul operands are not supported yet");
    return out0(nn::MatMulOp::create(
        b, loc, rt0, in(0), in(1), b.getF32FloatAttr(1.0f),
        b.getBoolAttr(false), b.getBoolAttr(false), nullptr, nullptr));
  }
};

} // namespace

void registerMatMulOps(OpRegistry &r) {
  r.add(conversion<MatMuls, &MatMuls::gemm>(
      "matmul", "Gemm", 13, Operands::Float,
      "alpha, beta, transA, transB; optional C"));
  r.add(conversion<MatMuls, &MatMuls::matmul>(
      "matmul", "MatMul", 13, Operands::Float,
      "rank >= 2, batched and broadcasting"));
}

} // namespace pipec::import
