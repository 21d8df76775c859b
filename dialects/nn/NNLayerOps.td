//===- NNLayerOps.td - CNN and transformer ops of nn -------*- tablegen -*-===//
//
// The operators CNNs and transformers exported by the mainstream exporters
// use (convolution, pooling, normalization, gather, data movement, more
// elementwise functions) and their gradient ops. Included by NNOps.td.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_NN_LAYER_OPS
#define PIPEC_NN_LAYER_OPS

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

def NN_ErfOp : NN_UnaryOp<"erf", "Erf">;
def NN_SqrtOp : NN_UnaryOp<"sqrt", "Sqrt">;
def NN_ExpOp : NN_UnaryOp<"exp", "Exp">;
def NN_LogOp : NN_UnaryOp<"log", "Log">;
def NN_NegOp : NN_UnaryOp<"neg", "Neg">;
def NN_AbsOp : NN_UnaryOp<"abs", "Abs">;
def NN_ReciprocalOp : NN_UnaryOp<"reciprocal", "Reciprocal">;
def NN_GeluOp : NN_UnaryOp<"gelu", "Gelu">;

class NN_ParamUnaryOp<string mnemonic, string what, dag attrs>
    : NN_Op<mnemonic, [NN_Bf16Storage, SameOperandsAndResultType,
        DeclareOpInterfaceMethods<NN_CostOpInterface>,
        DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Elementwise " # what # " (ONNX " # what # ").";
  let description = "Applies " # what # [{ to every element with the
    attribute values of the ONNX node.

    ```mlir
    %y = nn.}] # mnemonic # [{ %x {...} : tensor<8x128xf32>
    ```
  }];
  let arguments = !con((ins NN_StorageFloatTensor:$input), attrs);
  let results = (outs NN_StorageFloatTensor:$output);
  let assemblyFormat = "$input attr-dict `:` type($output)";
}
def NN_LeakyReluOp : NN_ParamUnaryOp<"leaky_relu", "LeakyRelu",
    (ins DefaultValuedAttr<F32Attr, "0.01">:$alpha)>;
def NN_ClipOp : NN_ParamUnaryOp<"clip", "Clip",
    (ins F32Attr:$min, F32Attr:$max)>;
def NN_PowScalarOp : NN_ParamUnaryOp<"pow_scalar", "Pow with a constant exponent",
    (ins F32Attr:$exponent)>;

def NN_PowOp : NN_BinaryOp<"pow", "power">;
def NN_MaxOp : NN_BinaryOp<"max", "maximum">;
def NN_MinOp : NN_BinaryOp<"min", "minimum">;

def NN_UnaryGradOp : NN_Op<"unary_grad", [NN_Bf16Storage, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<NN_CostOpInterface>]> {
  let summary = "Backward of an elementwise function: dX = dY * f'(.)";
  let description = [{
    `kind` names the forward function (erf, gelu, sqrt, exp, log, neg, abs,
    reciprocal, leaky_relu, clip, pow_scalar). `forward` is the forward
    output for sqrt, exp and reciprocal and the forward input otherwise;
    `alpha`/`beta` carry the forward op's parameters.

    ```mlir
    %dx = nn.unary_grad %x, %dy {kind = "erf"} : tensor<8x128xf32>
    ```
  }];
  let arguments = (ins NN_StorageFloatTensor:$forward, NN_StorageFloatTensor:$grad, StrAttr:$kind,
                       DefaultValuedAttr<F64Attr, "0.0">:$alpha,
                       DefaultValuedAttr<F64Attr, "0.0">:$beta);
  let results = (outs NN_StorageFloatTensor:$output);
  let assemblyFormat = "$forward `,` $grad attr-dict `:` type($output)";
  let hasVerifier = 1;
}

def NN_BinaryGradOp : NN_Op<"binary_grad", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    AllTypesMatch<["grad", "lhs_grad", "rhs_grad"]>]> {
  let summary = "Full-shape gradients of a broadcasting pow/max/min.";
  let description = [{
    dA = dY * d(A op B)/dA and dB likewise, both with the shape of dY (the
    caller sums them onto the operand shapes).

    ```mlir
    %da, %db = nn.binary_grad %a, %b, %dy {kind = "pow"} : tensor<4x8xf32>, tensor<8xf32>, tensor<4x8xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$lhs, NN_FloatTensor:$rhs, NN_FloatTensor:$grad,
                       StrAttr:$kind);
  let results = (outs NN_FloatTensor:$lhs_grad, NN_FloatTensor:$rhs_grad);
  let assemblyFormat = "$lhs `,` $rhs `,` $grad attr-dict `:` type($lhs) `,` type($rhs) `,` type($grad)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Convolution and pooling (2-D, NCHW)
//===----------------------------------------------------------------------===//

def NN_ConvOp : NN_Op<"conv", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "2-D convolution (ONNX Conv).";
  let description = [{
    X [N, C, H, W], W [M, C/group, kH, kW], optional bias [M]. `pads` is
    [top, left, bottom, right]; explicit pads only (the importer resolves
    auto_pad). 1-D convolutions are imported with H = 1.

    ```mlir
    %y = nn.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>,
        dilations = array<i64: 1, 1>, group = 1 : i64}
        : (tensor<8x3x32x32xf32>, tensor<16x3x3x3xf32>) -> tensor<8x16x32x32xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$input, NN_FloatTensor:$weight,
                       Optional<NN_FloatTensor>:$bias,
                       DenseI64ArrayAttr:$strides, DenseI64ArrayAttr:$pads,
                       DenseI64ArrayAttr:$dilations, I64Attr:$group);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

class NN_ConvGradOp<string mnemonic, string what, list<Trait> traits = []>
    : NN_Op<mnemonic, !listconcat([DeclareOpInterfaceMethods<NN_CostOpInterface>],
                                  traits)> {
  let summary = "Gradient of nn.conv with respect to its " # what # ".";
  let description = [{
    `grad` is dY; `other` is the forward weight (input gradient) or the
    forward input (weight gradient); the convolution attributes are the
    forward op's. The result has the type of the differentiated operand.

    ```mlir
    %dx = nn.}] # mnemonic # [{ %dy, %w {...} : (...) -> tensor<8x3x32x32xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$grad, NN_FloatTensor:$other,
                       DenseI64ArrayAttr:$strides, DenseI64ArrayAttr:$pads,
                       DenseI64ArrayAttr:$dilations, I64Attr:$group);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}
// Also ONNX ConvTranspose, so it is differentiable: with respect to `grad`
// a convolution by the same weight, with respect to the weight the weight
// gradient of that convolution.
def NN_ConvGradInputOp : NN_ConvGradOp<"conv_grad_input", "input",
    [DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]>;
def NN_ConvGradWeightOp : NN_ConvGradOp<"conv_grad_weight", "weight">;

def NN_MaxPoolOp : NN_Op<"max_pool", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "2-D max pooling (ONNX MaxPool) with argmax indices.";
  let description = [{
    `indices` holds, per output element, the flat index into X of the
    maximum; the backward scatters the gradient there. `pads` is [top,
    left, bottom, right]; ceil_mode is resolved by the importer into the
    output shape.

    ```mlir
    %y, %i = nn.max_pool %x {kernel = array<i64: 2, 2>, strides = array<i64: 2, 2>,
        pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>}
        : tensor<8x16x32x32xf32> -> tensor<8x16x16x16xf32>, tensor<8x16x16x16xi64>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$input, DenseI64ArrayAttr:$kernel,
                       DenseI64ArrayAttr:$strides, DenseI64ArrayAttr:$pads,
                       DenseI64ArrayAttr:$dilations);
  let results = (outs NN_FloatTensor:$output, NN_I64Tensor:$indices);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($output) `,` type($indices)";
  let hasVerifier = 1;
}

def NN_MaxPoolGradOp : NN_Op<"max_pool_grad", [DeclareOpInterfaceMethods<NN_CostOpInterface>]> {
  let summary = "Backward of max pooling: scatters dY to the saved argmax.";
  let description = [{
    ```mlir
    %dx = nn.max_pool_grad %dy, %i : tensor<8x16x16x16xf32>, tensor<8x16x16x16xi64> -> tensor<8x16x32x32xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$grad, NN_I64Tensor:$indices);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "operands attr-dict `:` type($grad) `,` type($indices) `->` type($output)";
}

def NN_AveragePoolOp : NN_Op<"average_pool", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "2-D average pooling (ONNX AveragePool).";
  let description = [{
    ```mlir
    %y = nn.average_pool %x {kernel = array<i64: 2, 2>, strides = array<i64: 2, 2>,
        pads = array<i64: 0, 0, 0, 0>} : tensor<8x16x32x32xf32> -> tensor<8x16x16x16xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$input, DenseI64ArrayAttr:$kernel,
                       DenseI64ArrayAttr:$strides, DenseI64ArrayAttr:$pads,
                       UnitAttr:$count_include_pad);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($output)";
  let hasVerifier = 1;
}

def NN_AveragePoolGradOp : NN_Op<"average_pool_grad", [DeclareOpInterfaceMethods<NN_CostOpInterface>]> {
  let summary = "Backward of average pooling.";
  let description = [{
    ```mlir
    %dx = nn.average_pool_grad %dy {...} : tensor<8x16x16x16xf32> -> tensor<8x16x32x32xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$grad, DenseI64ArrayAttr:$kernel,
                       DenseI64ArrayAttr:$strides, DenseI64ArrayAttr:$pads,
                       UnitAttr:$count_include_pad);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "$grad attr-dict `:` type($grad) `->` type($output)";
}

//===----------------------------------------------------------------------===//
// Normalization
//===----------------------------------------------------------------------===//

def NN_ResizeLinearOp : NN_Op<"resize_linear", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Bilinear resize of H and W (ONNX Resize, mode linear).";
  let description = [{
    Output row o reads input position f(o) of `coordinate_mode`
    (half_pixel, pytorch_half_pixel, align_corners, asymmetric; ONNX's
    coordinate_transformation_mode) and interpolates linearly between the
    two neighbouring rows, clamped to the edge; columns likewise. `scales`
    are ONNX's [scaleH, scaleW] (out / in when the model gives sizes).

    ```mlir
    %y = nn.resize_linear %x {coordinate_mode = "half_pixel", scales = array<f64: 2.0, 2.0>}
        : tensor<2x8x16x16xf32> -> tensor<2x8x32x32xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$input, StrAttr:$coordinate_mode,
                       DenseF64ArrayAttr:$scales);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($output)";
  let hasVerifier = 1;
}

def NN_ResizeLinearGradOp : NN_Op<"resize_linear_grad", [DeclareOpInterfaceMethods<NN_CostOpInterface>]> {
  let summary = "Backward of nn.resize_linear: dY scattered with its weights.";
  let description = [{
    ```mlir
    %dx = nn.resize_linear_grad %dy {coordinate_mode = "half_pixel", scales = array<f64: 2.0, 2.0>}
        : tensor<2x8x32x32xf32> -> tensor<2x8x16x16xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$grad, StrAttr:$coordinate_mode,
                       DenseF64ArrayAttr:$scales);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "$grad attr-dict `:` type($grad) `->` type($output)";
}

def NN_BatchNormOp : NN_Op<"batch_norm", [NN_Bf16Storage, DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>,
    AllTypesMatch<["input", "output"]>,
    AllTypesMatch<["scale", "bias", "running_mean", "running_var", "saved_mean",
                   "saved_inv_std", "new_running_mean", "new_running_var"]>]> {
  let summary = "BatchNormalization in training mode (batch statistics).";
  let description = [{
    Normalizes X [N, C, ...] with the mean and biased variance of the batch
    per channel; also returns the statistics the backward needs and the
    updated running mean and variance (momentum · running + (1 − momentum) ·
    batch), which the model stores back into their globals.

    ```mlir
    %y, %m, %is, %rm, %rv = nn.batch_norm %x, %scale, %bias, %mean, %var {epsilon = 1.0e-5 : f32, momentum = 0.9 : f32}
        : tensor<8x16x32x32xf32>, tensor<16xf32>
    ```
  }];
  let arguments = (ins NN_StorageFloatTensor:$input, NN_StorageFloatTensor:$scale, NN_StorageFloatTensor:$bias,
                       NN_StorageFloatTensor:$running_mean, NN_StorageFloatTensor:$running_var,
                       F32Attr:$epsilon, F32Attr:$momentum);
  let results = (outs NN_StorageFloatTensor:$output, NN_StorageFloatTensor:$saved_mean,
                      NN_StorageFloatTensor:$saved_inv_std, NN_StorageFloatTensor:$new_running_mean,
                      NN_StorageFloatTensor:$new_running_var);
  let assemblyFormat = "operands attr-dict `:` type($input) `,` type($scale)";
  let hasVerifier = 1;
}

def NN_BatchNormInferenceOp : NN_Op<"batch_norm_inference", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>,
    AllTypesMatch<["input", "output"]>,
    AllTypesMatch<["scale", "bias", "mean", "var"]>]> {
  let summary = "BatchNormalization with given statistics (inference mode).";
  let description = [{
    Y = scale (X − mean) / sqrt(var + epsilon) + bias per channel; the
    statistics are constants (no running update).

    ```mlir
    %y = nn.batch_norm_inference %x, %scale, %bias, %mean, %var {epsilon = 1.0e-5 : f32}
        : tensor<8x16x32x32xf32>, tensor<16xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$input, NN_FloatTensor:$scale, NN_FloatTensor:$bias,
                       NN_FloatTensor:$mean, NN_FloatTensor:$var, F32Attr:$epsilon);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "operands attr-dict `:` type($input) `,` type($scale)";
}

def NN_BatchNormGradOp : NN_Op<"batch_norm_grad", [NN_Bf16Storage, DeclareOpInterfaceMethods<NN_CostOpInterface>,
    AllTypesMatch<["input", "grad", "input_grad"]>,
    AllTypesMatch<["scale", "saved_mean", "saved_inv_std", "scale_grad", "bias_grad"]>]> {
  let summary = "Gradients of training-mode batch normalization.";
  let description = [{
    ```mlir
    %dx, %dscale, %dbias = nn.batch_norm_grad %x, %scale, %m, %is, %dy : tensor<8x16x32x32xf32>, tensor<16xf32>
    ```
  }];
  let arguments = (ins NN_StorageFloatTensor:$input, NN_StorageFloatTensor:$scale,
                       NN_StorageFloatTensor:$saved_mean, NN_StorageFloatTensor:$saved_inv_std,
                       NN_StorageFloatTensor:$grad);
  let results = (outs NN_StorageFloatTensor:$input_grad, NN_StorageFloatTensor:$scale_grad,
                      NN_StorageFloatTensor:$bias_grad);
  let assemblyFormat = "operands attr-dict `:` type($input) `,` type($scale)";
}

def NN_LayerNormOp : NN_Op<"layer_norm", [NN_Bf16Storage, DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "LayerNormalization over the trailing dimensions from `axis`.";
  let description = [{
    scale (and bias) have the normalized shape; `mean` and `inv_std` are
    per row ([prod(dims[:axis])]) for the backward.

    ```mlir
    %y, %m, %is = nn.layer_norm %x, %g, %b {axis = -1 : i64, epsilon = 1.0e-5 : f32}
        : (tensor<8x64x128xf32>, tensor<128xf32>, tensor<128xf32>) -> (tensor<8x64x128xf32>, tensor<512xf32>, tensor<512xf32>)
    ```
  }];
  let arguments = (ins NN_StorageFloatTensor:$input, NN_StorageFloatTensor:$scale,
                       Optional<NN_StorageFloatTensor>:$bias, I64Attr:$axis, F32Attr:$epsilon);
  let results = (outs NN_StorageFloatTensor:$output, NN_StorageFloatTensor:$mean, NN_StorageFloatTensor:$inv_std);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_LayerNormGradOp : NN_Op<"layer_norm_grad", [NN_Bf16Storage, DeclareOpInterfaceMethods<NN_CostOpInterface>]> {
  let summary = "Gradients of layer normalization.";
  let description = [{
    ```mlir
    %dx, %dg, %db = nn.layer_norm_grad %x, %g, %m, %is, %dy {axis = -1 : i64}
        : (tensor<8x64x128xf32>, tensor<128xf32>, tensor<512xf32>, tensor<512xf32>, tensor<8x64x128xf32>)
        -> (tensor<8x64x128xf32>, tensor<128xf32>, tensor<128xf32>)
    ```
  }];
  let arguments = (ins NN_StorageFloatTensor:$input, NN_StorageFloatTensor:$scale, NN_StorageFloatTensor:$mean,
                       NN_StorageFloatTensor:$inv_std, NN_StorageFloatTensor:$grad, I64Attr:$axis);
  let results = (outs NN_StorageFloatTensor:$input_grad, NN_StorageFloatTensor:$scale_grad,
                      NN_StorageFloatTensor:$bias_grad);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

def NN_GatherOp : NN_Op<"gather", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Gather along an axis (ONNX Gather; embedding lookup).";
  let description = [{
    Result shape: data.shape[:axis] + indices.shape + data.shape[axis+1:].
    Negative indices count from the end.

    ```mlir
    %e = nn.gather %table, %ids {axis = 0 : i64} : (tensor<256x128xf32>, tensor<8x64xi64>) -> tensor<8x64x128xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$data, NN_I64Tensor:$indices, I64Attr:$axis);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def NN_GatherGradOp : NN_Op<"gather_grad", [DeclareOpInterfaceMethods<NN_CostOpInterface>]> {
  let summary = "Backward of gather: scatter-add into zeros of the data's shape.";
  let description = [{
    ```mlir
    %dt = nn.gather_grad %dy, %ids {axis = 0 : i64} : (tensor<8x64x128xf32>, tensor<8x64xi64>) -> tensor<256x128xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$grad, NN_I64Tensor:$indices, I64Attr:$axis);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

def NN_ExpandOp : NN_Op<"expand", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Broadcast to a static shape (ONNX Expand with a folded shape).";
  let description = [{
    ```mlir
    %y = nn.expand %x : tensor<1x128xf32> -> tensor<8x128xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$input);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($output)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def NN_ConcatOp : NN_Op<"concat", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Concatenation along an axis (ONNX Concat).";
  let description = [{
    ```mlir
    %y = nn.concat %a, %b {axis = 1 : i64} : (tensor<8x16xf32>, tensor<8x8xf32>) -> tensor<8x24xf32>
    ```
  }];
  let arguments = (ins Variadic<NN_FloatTensor>:$inputs, I64Attr:$axis);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "$inputs attr-dict `:` functional-type($inputs, results)";
  let hasVerifier = 1;
}

def NN_SliceOp : NN_Op<"slice", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Static strided slice (ONNX Slice and Split with constant bounds).";
  let description = [{
    Result element i (per dimension k) is input element starts[k] +
    i * steps[k]; the result type gives the extent. Steps may be negative.

    ```mlir
    %y = nn.slice %x {starts = array<i64: 0, 4>, steps = array<i64: 1, 1>} : tensor<8x16xf32> -> tensor<8x8xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$input, DenseI64ArrayAttr:$starts,
                       DenseI64ArrayAttr:$steps);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($output)";
  let hasVerifier = 1;
}

def NN_SliceGradOp : NN_Op<"slice_grad", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Backward of slice: dY placed into zeros of the input's shape.";
  let description = [{
    Element starts[k] + i * steps[k] of the result (per dimension k) is
    element i of `grad`; every other element is zero. Also ONNX Pad in
    constant mode (with unit steps), so it is differentiable itself: its
    vector-Jacobian product is the slice it inverts.

    ```mlir
    %dx = nn.slice_grad %dy {starts = array<i64: 0, 4>, steps = array<i64: 1, 1>} : tensor<8x8xf32> -> tensor<8x16xf32>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$grad, DenseI64ArrayAttr:$starts,
                       DenseI64ArrayAttr:$steps);
  let results = (outs NN_FloatTensor:$output);
  let assemblyFormat = "$grad attr-dict `:` type($grad) `->` type($output)";
}

def NN_DropoutOp : NN_Op<"dropout", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>,
    AllTypesMatch<["input", "output", "mask"]>]> {
  let summary = "Dropout in training mode (ONNX Dropout, training_mode = true).";
  let description = [{
    `rng` (int64[2]) is the microbatch's random state from the runtime;
    `salt` distinguishes dropout layers. The mask (0 or 1/(1-ratio)) is a
    function of the global sample, element, seed and salt, and the backward
    multiplies the gradient by it.

    ```mlir
    %y, %m = nn.dropout %x, %rng {ratio = 5.0e-01 : f32, salt = 3 : i64} : tensor<8x128xf32>, tensor<2xi64>
    ```
  }];
  let arguments = (ins NN_FloatTensor:$input, NN_I64Tensor:$rng, F32Attr:$ratio,
                       I64Attr:$salt);
  let results = (outs NN_FloatTensor:$output, NN_FloatTensor:$mask);
  let assemblyFormat = "$input `,` $rng attr-dict `:` type($input) `,` type($rng)";
}

//===----------------------------------------------------------------------===//
// Comparisons and selection (run-time masks)
//===----------------------------------------------------------------------===//

// Booleans are i64 tensors holding 0 or 1: ONNX bool inputs, comparison
// results and Where conditions (one integer type through the runtime; the
// importer converts at the edges).

def NN_CompareOp : NN_Op<"compare", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Elementwise comparison with numpy broadcasting (ONNX Equal, "
                "Less, Greater, LessOrEqual, GreaterOrEqual; Not, Xor, Cast to bool).";
  let description = [{
    `predicate` is one of eq, ne, lt, gt, le, ge. Both operands have the same
    element type (f32 or i64); the result is an i64 tensor of 0 and 1 with
    the broadcast shape. Comparisons with NaN are false except ne. No
    gradient flows through a comparison.

    ```mlir
    %m = nn.compare "eq" %ids, %pad : tensor<4x16xi64>, tensor<i64> -> tensor<4x16xi64>
    ```
  }];
  let arguments = (ins StrAttr:$predicate, NN_FloatOrI64Tensor:$lhs,
                       NN_FloatOrI64Tensor:$rhs);
  let results = (outs NN_I64Tensor:$output);
  let assemblyFormat = "$predicate $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($output)";
  let hasVerifier = 1;
}

def NN_WhereOp : NN_Op<"where", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Elementwise selection with numpy broadcasting (ONNX Where).";
  let description = [{
    output = condition != 0 ? x : y, all three broadcast to the result's
    shape. x, y and the result share an element type (f32 or i64). The
    gradient of a float result goes to x where the condition holds and to y
    elsewhere, summed onto their shapes.

    ```mlir
    %y = nn.where %mask, %scores, %neg : tensor<4x1x1x16xi64>, tensor<4x2x16x16xf32>, tensor<f32> -> tensor<4x2x16x16xf32>
    ```
  }];
  let arguments = (ins NN_I64Tensor:$condition, NN_FloatOrI64Tensor:$x,
                       NN_FloatOrI64Tensor:$y);
  let results = (outs NN_FloatOrI64Tensor:$output);
  let assemblyFormat = "$condition `,` $x `,` $y attr-dict `:` type($condition) `,` type($x) `,` type($y) `->` type($output)";
  let hasVerifier = 1;
}

def NN_CastOp : NN_Op<"cast", [DeclareOpInterfaceMethods<NN_CostOpInterface>,
    DeclareOpInterfaceMethods<NN_DifferentiableOpInterface>]> {
  let summary = "Element type conversion between f32 and i64 (ONNX Cast), or f32 and bf16.";
  let description = [{
    i64 to f32 rounds to the nearest float; f32 to i64 truncates toward zero
    (numpy astype), NaN and out-of-range values give INT64_MIN. Same shape.
    f32 to bf16 rounds to the nearest bfloat16, ties to even (a NaN stays
    a NaN); bf16 to f32 is exact. Only `--activations bf16` writes the
    bf16 ones (after autodiff: they have no gradient of their own).
    A float result's gradient goes back to a float input (an identity);
    integer operands get none.

    ```mlir
    %f = nn.cast %mask : tensor<4x16xi64> -> tensor<4x16xf32>
    ```
  }];
  let arguments = (ins NN_CastTensor:$input);
  let results = (outs NN_CastTensor:$output);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($output)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

#endif // PIPEC_NN_LAYER_OPS
