//===- NNOps.td - the nn dialect ---------------------------*- tablegen -*-===//
//
// One op per supported ONNX operator (ONNX semantics, static shapes, f32
// activations), plus gradient-only and optimizer ops emitted by
// --nn-autodiff. See DESIGN.md §3.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_NN_OPS
#define PIPEC_NN_OPS

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "NNInterfaces.td"

//===----------------------------------------------------------------------===//
// Dialect and attributes
//===----------------------------------------------------------------------===//

def NN_Dialect : Dialect {
  let name = "nn";
  let cppNamespace = "::pipec::nn";
  let summary = "Neural-network operators with ONNX semantics and static shapes.";
  let description = [{
    The nn dialect holds an imported ONNX model as a static-shaped graph of
    tensor ops, one op per ONNX operator type, with ONNX semantics
    (broadcasting, attributes, defaults). Weights are upstream `ml_program`
    globals. Gradient-only ops (`nn.relu_grad`, `nn.sum_to_shape`, ...) and
    optimizer ops (`nn.sgd_update`) live here too, so the output of
    `--nn-autodiff` is still plain nn IR that can be printed and checked.
  }];
  let useDefaultAttributePrinterParser = 1;
  let hasConstantMaterializer = 1;
}

def NN_CostAttr : AttrDef<NN_Dialect, "Cost"> {
  let mnemonic = "cost";
  let summary = "Measured or modelled cost of one op.";
  let description = [{
    Seconds of the forward and of the backward of one microbatch, bytes of
    the op's outputs, of the parameters it reads and of the activations the
    backward needs. Attached to every op by `--nn-annotate-costs`.

    ```mlir
    %0 = nn.relu %x {nn.cost = #nn.cost<fwd = 1.0e-06, bwd = 2.0e-06, out_bytes = 4096,
                                      param_bytes = 0, saved_bytes = 4096>} : tensor<8x128xf32>
    ```
  }];
  let parameters = (ins APFloatParameter<"forward seconds">:$fwd,
                        APFloatParameter<"backward seconds">:$bwd, "int64_t":$out_bytes,
                        "int64_t":$param_bytes, "int64_t":$saved_bytes);
  let assemblyFormat = "`<` struct(params) `>`";
}

//===----------------------------------------------------------------------===//
// Base classes
//===----------------------------------------------------------------------===//

class NN_Op<string mnemonic, list<Trait> traits = []>
    : Op<NN_Dialect, mnemonic, traits # [Pure]>;

// Float tensors are f32, or f64 throughout after --nn-convert-precision
// (the exact reference mode, `pipec compile --precision f64`).
def NN_FloatTensor : RankedTensorOf<[F32, F64]>;
def NN_I64Tensor : RankedTensorOf<[I64]>;
def NN_FloatOrI64Tensor : RankedTensorOf<[F32, F64, I64]>;
// nn.cast's and the view ops' operands (reshape, flatten, identity): also
// bfloat16 (the storage of --activations bf16; a view of a bf16 value
// stays bf16).
def NN_CastTensor : RankedTensorOf<[F32, F64, BF16, I64]>;
def NN_ViewFloatTensor : RankedTensorOf<[F32, F64, BF16]>;
// The float tensors of the ops whose kernels have bfloat16-storage
// variants (PIPEC_KERNEL_BF16 in runtime/include/pipec_kernels.def):
// elementwise arithmetic and activations, their gradients, softmax, batch
// and layer normalisation. With --activations bf16 such an op may read and
// write bf16 tensors directly: it reads each bf16 operand widened to f32
// (exactly), computes in f32 as it does on f32 tensors, and rounds each
// bf16 result once to the nearest bf16 (ties to even), which is what the
// same op between nn.cast ops computes. bf16 mixes with f32 only
// (NN_Bf16Storage).
def NN_StorageFloatTensor : RankedTensorOf<[F32, F64, BF16]>;
def NN_Bf16Storage : NativeOpTrait<"Bf16Storage"> {
  let cppNamespace = "::pipec::nn::OpTrait";
}

class NN_UnaryOp<string mnemonic, string what, list<Trait> traits = []>
    : NN_Op<mnemonic, traits # [NN_Bf16Storage, SameOperandsAndResultType,
        DeclareOpInterfaceMethods<NN_CostOpInterface>,
        DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Elementwise " # what # " (ONNX " # what # ").";
  let description = "Applies " # what # [{ to every element; the result has
    the type of the input.

    ```mlir
    %y = nn.}] # mnemonic # [{ %x : tensor<8x128xf32>
    ```
  }];
  let arguments = (ins NN_StorageFloatTensor:$input);
  let results = (outs NN_StorageFloatTensor:$output);
  let assemblyFormat = "$input attr-dict `:` type($output)";
}

class NN_BinaryOp<string mnemonic, string what>
    : NN_Op<mnemonic, [NN_Bf16Storage, DeclareOpInterfaceMethods<NN_CostOpInterface>,
        DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Elementwise " # what # " with numpy broadcasting.";
  let description = [{
    ONNX multidirectional (numpy) broadcasting: shapes are aligned on the
    right and each dimension pair must be equal or contain a 1. The result
    has the broadcast shape.

    ```mlir
    %y = nn.}] # mnemonic # [{ %a, %b : tensor<8x128xf32>, tensor<128xf32> -> tensor<8x128xf32>
    ```
  }];
  let arguments = (ins NN_StorageFloatTensor:$lhs, NN_StorageFloatTensor:$rhs);
  let results = (outs NN_StorageFloatTensor:$output);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($output)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// ONNX operators
//===----------------------------------------------------------------------===//

def NN_GemmOp : NN_Op<"gemm", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "General matrix multiply Y = alpha*op(A)*op(B) + beta*C (ONNX Gemm).";
  let description = [{
    `op(X)` is X or its transpose as `trans_a` / `trans_b` say. A and B are
    2-D; the optional C is unidirectionally broadcastable to Y's [M, N].

    ```mlir
    %y = nn.gemm %x, %w, %b {trans_b = true} : (tensor<8x784xf32>, tensor<256x784xf32>, tensor<256xf32>) -> tensor<8x256xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$a, NN_FloatTensor:$b, Optional<NN_FloatTensor>:$c,
                       DefaultValuedAttr<F32Attr, "1.0">:$alpha,
                       DefaultValuedAttr<F32Attr, "1.0">:$beta,
                       DefaultValuedAttr<BoolAttr, "false">:$trans_a,
                       DefaultValuedAttr<BoolAttr, "false">:$trans_b);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_MatMulOp : NN_Op<"matmul", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Matrix product with numpy semantics (ONNX MatMul).";
  let description = [{
    Both operands have rank >= 2 (1-D operands are reshaped by the
    importer); leading (batch) dimensions broadcast. `alpha` scales the
    product (Y = alpha * A B); the importer folds a following division or
    multiplication by a power of two into it (attention's 1/sqrt(d) for
    d = 4^k), which changes no bit of the result or of the gradients unless
    values reach the subnormal range or overflow (the unfolded backward
    scales dY before its GEMMs, the folded one after).

    `trans_a` / `trans_b` use that operand with its last two dimensions
    swapped (Y = alpha op(A) op(B), per batch matrix); the importer never
    sets them: nn-fold-transposes does, for an operand that an
    nn.transpose of the last two dimensions produced (the backward's
    dY B^T and A^T dY), so that the kernel reads the matrix transposed
    instead of copying it.

    `perm_a` / `perm_b` (set by nn-fold-transposes too) read that operand
    through a permutation that keeps its innermost dimension innermost:
    the operand used is transpose(A, perm_a), read in place through
    strides (an nn.transpose it replaces, such as attention's
    [B, S, H, D] -> [B, H, S, D] heads, is not copied). Then trans_a
    applies to the permuted operand's last two dimensions.

    ```mlir
    %y = nn.matmul %a, %b : (tensor<4x8x16xf32>, tensor<16x32xf32>) -> tensor<4x8x32xf32>
    %s = nn.matmul %q, %k {alpha = 1.250000e-01 : f32} : (tensor<2x8x64xf32>, tensor<2x64x8xf32>) -> tensor<2x8x8xf32>
    %d = nn.matmul %p, %g {trans_a = true} : (tensor<2x8x8xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$a, NN_FloatTensor:$b,
                       DefaultValuedAttr<F32Attr, "1.0">:$alpha,
                       DefaultValuedAttr<BoolAttr, "false">:$trans_a,
                       DefaultValuedAttr<BoolAttr, "false">:$trans_b,
                       OptionalAttr<DenseI64ArrayAttr>:$perm_a,
                       OptionalAttr<DenseI64ArrayAttr>:$perm_b);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The shape of operand `a` (0) or `b` (1) as the product reads it:
    /// its type's shape through perm_a / perm_b (before trans_a / trans_b).
    ::llvm::SmallVector<int64_t> operandShape(int which);
  }];
}

def NN_AddOp : NN_BinaryOp<"add", "addition">;
def NN_SubOp : NN_BinaryOp<"sub", "subtraction">;
def NN_MulOp : NN_BinaryOp<"mul", "multiplication">;
def NN_DivOp : NN_BinaryOp<"div", "division">;

def NN_ReluOp : NN_UnaryOp<"relu", "Relu">;
def NN_TanhOp : NN_UnaryOp<"tanh", "Tanh">;
def NN_SigmoidOp : NN_UnaryOp<"sigmoid", "Sigmoid">;
def NN_IdentityOp : NN_UnaryOp<"identity", "Identity"> {
  // Also bf16: an identity of a stored activation stays bf16.
  let arguments = (ins NN_ViewFloatTensor:$input);
  let results = (outs NN_ViewFloatTensor:$output);
  let hasFolder = 1;
}

class NN_SoftmaxBase<string mnemonic, string what>
    : NN_Op<mnemonic, [NN_Bf16Storage, SameOperandsAndResultType,
        DeclareOpInterfaceMethods<NN_CostOpInterface>,
        DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = what # " along one axis (ONNX " # what # ").";
  let description = [{
    Opset >= 13 semantics: normalises along `axis` only. With `coerce_2d`
    (models of opset < 13) the input is viewed as 2-D [prod(dims[:axis]),
    prod(dims[axis:])] and normalised along the second dimension.

    ```mlir
    %y = nn.}] # mnemonic # [{ %x {axis = -1 : i64} : tensor<8x10xf32>
    ```
  }];
  let arguments = (ins NN_StorageFloatTensor:$input,
                       DefaultValuedAttr<I64Attr, "-1">:$axis,
                       UnitAttr:$coerce_2d);
  let results = (outs NN_StorageFloatTensor:$output);
  let assemblyFormat = "$input attr-dict `:` type($output)";
  let hasVerifier = 1;
}
def NN_SoftmaxOp : NN_SoftmaxBase<"softmax", "Softmax">;
def NN_LogSoftmaxOp : NN_SoftmaxBase<"log_softmax", "LogSoftmax">;

def NN_FlattenOp : NN_Op<"flatten", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Flattens to 2-D at an axis (ONNX Flatten).";
  let description = [{
    The result is [prod(dims[:axis]), prod(dims[axis:])].

    ```mlir
    %y = nn.flatten %x {axis = 1 : i64} : tensor<8x1x28x28xf32> -> tensor<8x784xf32>
    ```
  }];
  let arguments = (ins NN_ViewFloatTensor:$input, DefaultValuedAttr<I64Attr, "1">:$axis);
  let results = (outs NN_ViewFloatTensor:$output);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($output)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def NN_ReshapeOp : NN_Op<"reshape", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Reshape to a static shape (ONNX Reshape with a folded shape).";
  let description = [{
    The importer folds ONNX's shape operand (with its 0 and -1 entries) into
    the static result type; element counts must agree.

    ```mlir
    %y = nn.reshape %x : tensor<8x784xf32> -> tensor<8x28x28xf32>
    ```
  }];
  let arguments = (ins NN_CastTensor:$input);
  let results = (outs NN_CastTensor:$output);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($output)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def NN_TransposeOp : NN_Op<"transpose", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Permutes dimensions (ONNX Transpose).";
  let description = [{
    `result.dims[i] = input.dims[perm[i]]`; the importer fills ONNX's default
    (reversed dimensions).

    ```mlir
    %y = nn.transpose %x {perm = array<i64: 1, 0>} : tensor<8x16xf32> -> tensor<16x8xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$input, DenseI64ArrayAttr:$perm);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($output)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def NN_ConstantOp : NN_Op<"constant", [ConstantLike,
    AllTypesMatch<["value", "output"]>]> {
  let summary = "A constant tensor (ONNX Constant).";
  let description = [{
    ```mlir
    %c = nn.constant dense<1.0> : tensor<4xf32>
    ```
  }];
  let arguments = (ins ElementsAttr:$value);
  let results = (outs AnyRankedTensor:$output);
  let assemblyFormat = "$value attr-dict";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def NN_SoftmaxCrossEntropyLossOp : NN_Op<"softmax_cross_entropy_loss",
    [DeclareOpInterfaceMethods<NN_CostOpInterface>,
     DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Softmax cross-entropy loss (ONNX SoftmaxCrossEntropyLoss).";
  let description = [{
    `scores` is [N, C, d1, ...], `labels` [N, d1, ...] (int64 class
    indices), optional per-class `weights` [C]. `reduction` is "none",
    "mean" or "sum"; targets equal to `ignore_index` contribute nothing.
    The loss is a scalar (mean/sum) or [N, d1, ...] (none); the optional
    second result is log-softmax of the scores.

    ```mlir
    %l = nn.softmax_cross_entropy_loss %s, %y : (tensor<8x10xf32>, tensor<8xi64>) -> tensor<f32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$scores, NN_I64Tensor:$labels,
                       Optional<NN_FloatTensor>:$weights,
                       DefaultValuedAttr<StrAttr, "\"mean\"">:$reduction,
                       OptionalAttr<I64Attr>:$ignore_index);
  let results = (outs NN_FloatTensor:$loss, Optional<NN_FloatTensor>:$log_prob);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Gradient-only ops (emitted by --nn-autodiff)
//===----------------------------------------------------------------------===//

class NN_ActivationGradOp<string mnemonic, string what, string saved>
    : NN_Op<mnemonic, [NN_Bf16Storage, SameOperandsAndResultType,
        DeclareOpInterfaceMethods<NN_CostOpInterface>]> {
  let summary = "Backward of " # what # ": dX from the forward " # saved # " and dY.";
  let description = "Computes the input gradient of " # what # [{ from the
    forward }] # saved # [{ and the output gradient; all three have one type.

    ```mlir
    %dx = nn.}] # mnemonic # [{ %t, %dy : tensor<8x128xf32>
    ```
  }];
  let arguments = (ins NN_StorageFloatTensor:$forward, NN_StorageFloatTensor:$grad);
  let results = (outs NN_StorageFloatTensor:$output);
  let assemblyFormat = "$forward `,` $grad attr-dict `:` type($output)";
}
def NN_ReluGradOp : NN_ActivationGradOp<"relu_grad", "Relu", "input">;
def NN_TanhGradOp : NN_ActivationGradOp<"tanh_grad", "Tanh", "output">;
def NN_SigmoidGradOp : NN_ActivationGradOp<"sigmoid_grad", "Sigmoid", "output">;

def NN_SoftmaxGradOp : NN_Op<"softmax_grad", [NN_Bf16Storage, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<NN_CostOpInterface>]> {
  let summary = "Backward of softmax / log-softmax from the forward output.";
  let description = [{
    softmax: dX = Y * (dY - sum_axis(dY * Y)); with `log`: dX = dY -
    exp(Y) * sum_axis(dY). `axis` and `coerce_2d` as on the forward op.

    ```mlir
    %dx = nn.softmax_grad %y, %dy {axis = 1 : i64} : tensor<8x10xf32>
    ```
  }];
  let arguments = (ins NN_StorageFloatTensor:$output_value, NN_StorageFloatTensor:$grad,
                       DefaultValuedAttr<I64Attr, "-1">:$axis,
                       UnitAttr:$coerce_2d, UnitAttr:$log);
  let results = (outs NN_StorageFloatTensor:$output);
  let assemblyFormat = "$output_value `,` $grad attr-dict `:` type($output)";
}

def NN_SumToShapeOp : NN_Op<"sum_to_shape", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Sums a tensor onto a broadcast-compatible shape (adjoint of broadcasting).";
  let description = [{
    The result type must broadcast to the input type; every broadcast
    dimension is summed. The result is multiplied by `scale`. This is the
    gradient of numpy broadcasting (bias gradients, `nn.add` of a vector).

    ```mlir
    %db = nn.sum_to_shape %dy : tensor<8x256xf32> -> tensor<256xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$input, DefaultValuedAttr<F64Attr, "1.0">:$scale);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($output)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def NN_ScaleOp : NN_Op<"scale", [NN_Bf16Storage, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<NN_CostOpInterface>]> {
  let summary = "Multiplies every element by a constant factor.";
  let description = [{
    ```mlir
    %y = nn.scale %x {factor = -1.0 : f64} : tensor<8xf32>
    ```
  }];
  let arguments = (ins NN_StorageFloatTensor:$input, F64Attr:$factor);
  let results = (outs NN_StorageFloatTensor:$output);
  let assemblyFormat = "$input attr-dict `:` type($output)";
  let hasFolder = 1;
}

def NN_SoftmaxCrossEntropyLossGradOp : NN_Op<"softmax_cross_entropy_loss_grad",
    [DeclareOpInterfaceMethods<NN_CostOpInterface>]> {
  let summary = "Gradient of softmax cross-entropy with respect to the scores.";
  let description = [{
    Operands and attributes as on the forward op, plus `loss_grad` with the
    shape of the forward loss. The result has the type of `scores`.

    ```mlir
    %ds = nn.softmax_cross_entropy_loss_grad %s, %y, %dl : (tensor<8x10xf32>, tensor<8xi64>, tensor<f32>) -> tensor<8x10xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$scores, NN_I64Tensor:$labels,
                       NN_FloatTensor:$loss_grad, Optional<NN_FloatTensor>:$weights,
                       DefaultValuedAttr<StrAttr, "\"mean\"">:$reduction,
                       OptionalAttr<I64Attr>:$ignore_index);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Optimizer ops
//===----------------------------------------------------------------------===//

def NN_SgdUpdateOp : NN_Op<"sgd_update", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    AllTypesMatch<["weight", "grad", "output"]>]> {
  let summary = "Plain SGD step: W - lr * G.";
  let description = [{
    `lr` is a rank-0 tensor supplied by the runtime every step.

    ```mlir
    %w2 = nn.sgd_update %w, %g, %lr : tensor<256x784xf32>, tensor<f32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$weight, NN_FloatTensor:$grad, NN_FloatTensor:$lr);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "$weight `,` $grad `,` $lr attr-dict `:` type($output) `,` type($lr)";
  let hasVerifier = 1;
}

def NN_MomentumOp : NN_Op<"momentum", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    AllTypesMatch<["x", "g", "v", "x_new", "v_new"]>]> {
  let summary = "SGD with momentum (ONNX ai.onnx.preview.training Momentum, one tensor).";
  let description = [{
    `r` is the learning rate and `t` the 0-based update count (rank-0
    tensors). G' = norm_coefficient X + G; beta' = T > 0 ? beta : 1;
    V_new = alpha V + beta' G'; standard: X_new = X - R V_new; nesterov:
    X_new = X - R (G' + alpha V_new).

    ```mlir
    %x2, %v2 = nn.momentum %r, %t, %x, %g, %v {alpha = 0.9 : f32, beta = 1.0 : f32}
        : tensor<f32>, tensor<i64>, tensor<8xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$r, NN_I64Tensor:$t, NN_FloatTensor:$x,
                       NN_FloatTensor:$g, NN_FloatTensor:$v,
                       F32Attr:$alpha, F32Attr:$beta,
                       DefaultValuedAttr<StrAttr, "\"standard\"">:$mode,
                       DefaultValuedAttr<F32Attr, "0.0">:$norm_coefficient);
  let results = (outs NN_FloatTensor:$x_new, NN_FloatTensor:$v_new);
  let assemblyFormat = "$r `,` $t `,` $x `,` $g `,` $v attr-dict `:` type($r) `,` type($t) `,` type($x)";
  let hasVerifier = 1;
}

def NN_AdamOp : NN_Op<"adam", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    AllTypesMatch<["x", "g", "v", "h", "x_new", "v_new", "h_new"]>]> {
  let summary = "Adam (ONNX ai.onnx.preview.training Adam, one tensor).";
  let description = [{
    G' = norm_coefficient X + G; V_new = alpha V + (1 - alpha) G';
    H_new = beta H + (1 - beta) G'^2; R' = T > 0 ? R sqrt(1 - beta^T) /
    (1 - alpha^T) : R; X_new = (1 - norm_coefficient_post)(X - R' V_new /
    (sqrt(H_new) + epsilon)).

    ```mlir
    %x2, %v2, %h2 = nn.adam %r, %t, %x, %g, %v, %h : tensor<f32>, tensor<i64>, tensor<8xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$r, NN_I64Tensor:$t, NN_FloatTensor:$x,
                       NN_FloatTensor:$g, NN_FloatTensor:$v, NN_FloatTensor:$h,
                       DefaultValuedAttr<F32Attr, "0.9">:$alpha,
                       DefaultValuedAttr<F32Attr, "0.999">:$beta,
                       DefaultValuedAttr<F32Attr, "0.0">:$norm_coefficient,
                       DefaultValuedAttr<F32Attr, "0.0">:$norm_coefficient_post,
                       DefaultValuedAttr<F32Attr, "1.0e-6">:$epsilon);
  let results = (outs NN_FloatTensor:$x_new, NN_FloatTensor:$v_new, NN_FloatTensor:$h_new);
  let assemblyFormat = "$r `,` $t `,` $x `,` $g `,` $v `,` $h attr-dict `:` type($r) `,` type($t) `,` type($x)";
  let hasVerifier = 1;
}

def NN_AdagradOp : NN_Op<"adagrad", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    AllTypesMatch<["x", "g", "h", "x_new", "h_new"]>]> {
  let summary = "Adagrad (ONNX ai.onnx.preview.training Adagrad, one tensor).";
  let description = [{
    r = R / (1 + T decay_factor); G' = norm_coefficient X + G;
    H_new = H + G'^2; X_new = X - r G' / (sqrt(H_new) + epsilon).

    ```mlir
    %x2, %h2 = nn.adagrad %r, %t, %x, %g, %h : tensor<f32>, tensor<i64>, tensor<8xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$r, NN_I64Tensor:$t, NN_FloatTensor:$x,
                       NN_FloatTensor:$g, NN_FloatTensor:$h,
                       DefaultValuedAttr<F32Attr, "0.0">:$decay_factor,
                       DefaultValuedAttr<F32Attr, "1.0e-6">:$epsilon,
                       DefaultValuedAttr<F32Attr, "0.0">:$norm_coefficient);
  let results = (outs NN_FloatTensor:$x_new, NN_FloatTensor:$h_new);
  let assemblyFormat = "$r `,` $t `,` $x `,` $g `,` $h attr-dict `:` type($r) `,` type($t) `,` type($x)";
  let hasVerifier = 1;
}

def NN_FillOp : NN_Op<"fill", [DeclareOpInterfaceMethods<NN_CostOpInterface>]> {
  let summary = "A tensor with every element equal to `value`.";
  let description = [{
    ```mlir
    %z = nn.fill {value = 0.0 : f64} : tensor<256xf32>
    ```
  }];
  let arguments = (ins F64Attr:$value);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "attr-dict `:` type($output)";
}

include "NNLayerOps.td"

#endif // PIPEC_NN_OPS
