//===- ConvertPrecision.cpp - f32 tensors to f64 --------------------------===//
//
// Part of pipec. Implements --nn-convert-precision (Passes.td).
//
//===----------------------------------------------------------------------===//
///
/// \file
/// One AttrTypeReplacer walks the module: f32 becomes f64 wherever it is an
/// element or value type, f32 tensor literals are rebuilt in double (splats,
/// the model's literals such as 0.5 or 1e-5, as the decimal they stand for,
/// pipec::literalValue; other data widened exactly), and scalar FloatAttrs
/// are left untouched (their f32 type is part of the ops' attribute
/// constraints; the lowering reads them as literals too). Weights held as dense_resource blobs get a new blob of
/// doubles under the same name (the blob manager makes it unique).
///
//===----------------------------------------------------------------------===//
#include "passes/PassUtils.h"
#include "passes/Passes.h"

#include "mlir/IR/AttrTypeSubElements.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectResourceBlobManager.h"

#include <cstring>

namespace pipec {
#define GEN_PASS_DEF_NNCONVERTPRECISIONPASS
#include "passes/Passes.h.inc"
} // namespace pipec

using namespace mlir;

namespace {

using Replaced = std::optional<std::pair<Attribute, WalkResult>>;

/// The f64 type of an f32 tensor type, or a null type.
RankedTensorType widened(Type t) {
  auto tensor = dyn_cast<RankedTensorType>(t);
  if (!tensor || !tensor.getElementType().isF32())
    return {};
  return RankedTensorType::get(tensor.getShape(),
                               Float64Type::get(t.getContext()),
                               tensor.getEncoding());
}

struct NNConvertPrecisionPass
    : public pipec::impl::NNConvertPrecisionPassBase<NNConvertPrecisionPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (activations != "f32" &&
        ((activations != "bf16" && activations != "bf16-casts") ||
         precision != "bf16")) {
      module.emitError("--nn-convert-precision: activations '")
          << activations
          << "' (f32, or bf16 or bf16-casts with precision bf16)";
      return signalPassFailure();
    }
    if (precision == "f32")
      return;
    if (precision == "bf16") {
      // The lowering records that the matrix products round their
      // operands to bfloat16 (stage description "matmul_precision").
      // Tensors stay float32 unless activations are stored in bf16.
      if (activations != "f32" &&
          failed(pipec::storeActivationsInBf16(module, activations == "bf16")))
        return signalPassFailure();
      module->setAttr("pipec.precision",
                      StringAttr::get(module.getContext(), precision));
      if (activations != "f32")
        module->setAttr("pipec.activations",
                        StringAttr::get(module.getContext(), activations));
      return;
    }
    if (precision != "f64") {
      module.emitError("--nn-convert-precision: unknown precision '")
          << precision << "' (f32, f64 or bf16)";
      return signalPassFailure();
    }
    MLIRContext *ctx = module.getContext();
    bool failedBlob = false;
    AttrTypeReplacer replacer;
    replacer.addReplacement([ctx](Float32Type) -> Type {
      return Float64Type::get(ctx);
    });
    // Scalar attributes keep their type (registered before the tensor
    // literals, so tried after them: the most recent replacement runs
    // first).
    replacer.addReplacement([](FloatAttr a) -> Replaced {
      return std::make_pair(Attribute(a), WalkResult::skip());
    });
    replacer.addReplacement([](DenseFPElementsAttr a) -> Replaced {
      RankedTensorType to = widened(a.getType());
      if (!to)
        return std::nullopt;
      // A splat is a literal of the model (0.5, 1e-5): the value it stands
      // for; other data is widened exactly.
      if (a.isSplat())
        return std::make_pair(
            Attribute(DenseElementsAttr::get(
                to, pipec::literalValue(a.getSplatValue<float>()))),
            WalkResult::skip());
      SmallVector<double> values;
      values.reserve(a.getNumElements());
      for (float f : a.getValues<float>())
        values.push_back(f);
      return std::make_pair(Attribute(DenseElementsAttr::get(
                                to, ArrayRef<double>(values))),
                            WalkResult::skip());
    });
    replacer.addReplacement(
        [&failedBlob](DenseResourceElementsAttr a) -> Replaced {
          RankedTensorType to = widened(a.getType());
          if (!to)
            return std::nullopt;
          AsmResourceBlob *blob = a.getRawHandle().getBlob();
          if (!blob) {
            failedBlob = true;
            return std::nullopt;
          }
          ArrayRef<char> raw = blob->getData();
          std::vector<double> values(raw.size() / sizeof(float));
          for (size_t i = 0; i < values.size(); ++i) {
            float f;
            std::memcpy(&f, raw.data() + i * sizeof(float), sizeof f);
            values[i] = f;
          }
          return std::make_pair(
              Attribute(DenseResourceElementsAttr::get(
                  to, a.getRawHandle().getKey(),
                  HeapAsmResourceBlob::allocateAndCopyInferAlign<double>(
                      values))),
              WalkResult::skip());
        });
    replacer.recursivelyReplaceElementsIn(module, /*replaceAttrs=*/true,
                                          /*replaceLocs=*/false,
                                          /*replaceTypes=*/true);
    if (failedBlob) {
      module.emitError("--nn-convert-precision: a weight has no data");
      return signalPassFailure();
    }
    // Read by the lowering (the stage description's "precision") and the
    // driver.
    module->setAttr("pipec.precision", StringAttr::get(ctx, precision));
  }
};

} // namespace
