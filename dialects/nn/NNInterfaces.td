//===- NNInterfaces.td - nn op interfaces ------------------*- tablegen -*-===//
//
// CostOpInterface: static work estimates used by --nn-annotate-costs.
// DifferentiableOpInterface: the vector-Jacobian product of an op, emitted
// as nn ops, used by --nn-autodiff.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_NN_INTERFACES
#define PIPEC_NN_INTERFACES

include "mlir/IR/OpBase.td"

def NN_CostOpInterface : OpInterface<"CostOpInterface"> {
  let cppNamespace = "::pipec::nn";
  let description = [{
    Static cost of an op for the analytic cost model and the planners:
    floating-point operations of the forward and of the backward, and the
    bytes the forward reads and writes. Byte counts of outputs, parameters
    and saved activations are derived from types by the annotate pass.
  }];
  let methods = [
    InterfaceMethod<"Floating-point operations of the forward.",
      "int64_t", "getForwardFlops">,
    InterfaceMethod<"Floating-point operations of the backward (all VJPs).",
      "int64_t", "getBackwardFlops", (ins), [{}], [{
        return 2 * $_op.getForwardFlops();
      }]>,
  ];
}

def NN_DifferentiableOpInterface : OpInterface<"DifferentiableOpInterface"> {
  let cppNamespace = "::pipec::nn";
  let description = [{
    An op that can emit its vector-Jacobian product. `buildVJP` is given the
    gradients of the op's results (null where a result has no gradient) and
    a mapping `fwd` that makes a forward value usable at the insertion point
    (the backward function saves or rematerialises it). It appends one
    gradient per operand to `operandGrads` (null where the operand is not
    differentiable, e.g. integer labels).
  }];
  let methods = [
    InterfaceMethod<"Emits the VJP of this op as nn ops.",
      "::llvm::LogicalResult", "buildVJP",
      (ins "::mlir::OpBuilder &":$builder,
           "::llvm::ArrayRef<::mlir::Value>":$resultGrads,
           "::llvm::function_ref<::mlir::Value(::mlir::Value)>":$fwd,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGrads)>,
  ];
}

#endif // PIPEC_NN_INTERFACES
