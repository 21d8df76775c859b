// RUN: pipec-opt %s --split-input-file --verify-diagnostics

func.func @bad_broadcast(%a: tensor<4x5xf32>, %b: tensor<3xf32>) -> tensor<4x5xf32> {
  // expected-error @+1 {{operand shapes [4x5] and [3] are not broadcast-compatible}}
  %0 = nn.add %a, %b : tensor<4x5xf32>, tensor<3xf32> -> tensor<4x5xf32>
  return %0 : tensor<4x5xf32>
}

// -----

func.func @wrong_broadcast_result(%a: tensor<4x5xf32>, %b: tensor<5xf32>) -> tensor<5xf32> {
  // expected-error @+1 {{result shape [5] must be the broadcast shape [4x5]}}
  %0 = nn.mul %a, %b : tensor<4x5xf32>, tensor<5xf32> -> tensor<5xf32>
  return %0 : tensor<5xf32>
}

// -----

func.func @gemm_inner(%a: tensor<4x6xf32>, %b: tensor<5x7xf32>) -> tensor<4x5xf32> {
  // expected-error @+1 {{inner dimensions of op(A) and op(B) differ: 6 vs 7}}
  %0 = nn.gemm %a, %b {trans_b = true} : (tensor<4x6xf32>, tensor<5x7xf32>) -> tensor<4x5xf32>
  return %0 : tensor<4x5xf32>
}

// -----

func.func @gemm_bias(%a: tensor<4x6xf32>, %b: tensor<6x5xf32>, %c: tensor<3xf32>) -> tensor<4x5xf32> {
  // expected-error @+1 {{C of shape [3] does not broadcast to [4x5]}}
  %0 = nn.gemm %a, %b, %c : (tensor<4x6xf32>, tensor<6x5xf32>, tensor<3xf32>) -> tensor<4x5xf32>
  return %0 : tensor<4x5xf32>
}

// -----

func.func @gemm_rank(%a: tensor<2x4x6xf32>, %b: tensor<6x5xf32>) -> tensor<4x5xf32> {
  // expected-error @+1 {{A and B must be 2-D, got ranks 3 and 2}}
  %0 = nn.gemm %a, %b : (tensor<2x4x6xf32>, tensor<6x5xf32>) -> tensor<4x5xf32>
  return %0 : tensor<4x5xf32>
}

// -----

func.func @matmul_inner(%a: tensor<4x6xf32>, %b: tensor<5x7xf32>) -> tensor<4x7xf32> {
  // expected-error @+1 {{inner dimensions differ: 6 vs 5}}
  %0 = nn.matmul %a, %b : (tensor<4x6xf32>, tensor<5x7xf32>) -> tensor<4x7xf32>
  return %0 : tensor<4x7xf32>
}

// -----

func.func @matmul_inner_transposed(%a: tensor<6x4xf32>, %b: tensor<7x6xf32>) -> tensor<4x7xf32> {
  // trans_a reads A as 4x6, trans_b reads B as 6x7: fine. Without trans_b
  // B is 7x6 and the inner dimensions differ.
  %0 = nn.matmul %a, %b {trans_a = true, trans_b = true} : (tensor<6x4xf32>, tensor<7x6xf32>) -> tensor<4x7xf32>
  // expected-error @+1 {{inner dimensions differ: 6 vs 7}}
  %1 = nn.matmul %a, %b {trans_a = true} : (tensor<6x4xf32>, tensor<7x6xf32>) -> tensor<4x7xf32>
  return %1 : tensor<4x7xf32>
}

// -----

func.func @matmul_result_transposed(%a: tensor<2x6x4xf32>, %b: tensor<6x7xf32>) -> tensor<2x6x7xf32> {
  // expected-error @+1 {{result must be [2x4x7], got [2x6x7]}}
  %0 = nn.matmul %a, %b {trans_a = true} : (tensor<2x6x4xf32>, tensor<6x7xf32>) -> tensor<2x6x7xf32>
  return %0 : tensor<2x6x7xf32>
}

// -----

func.func @softmax_axis(%a: tensor<4x6xf32>) -> tensor<4x6xf32> {
  // expected-error @+1 {{axis 2 is out of range for rank 2}}
  %0 = nn.softmax %a {axis = 2 : i64} : tensor<4x6xf32>
  return %0 : tensor<4x6xf32>
}

// -----

func.func @flatten_shape(%a: tensor<4x2x3xf32>) -> tensor<8x3xf32> {
  // expected-error @+1 {{result must be [4x6], got [8x3]}}
  %0 = nn.flatten %a {axis = 1 : i64} : tensor<4x2x3xf32> -> tensor<8x3xf32>
  return %0 : tensor<8x3xf32>
}

// -----

func.func @reshape_count(%a: tensor<4x6xf32>) -> tensor<5x5xf32> {
  // expected-error @+1 {{element count changes from 24 to 25}}
  %0 = nn.reshape %a : tensor<4x6xf32> -> tensor<5x5xf32>
  return %0 : tensor<5x5xf32>
}

// -----

func.func @transpose_perm(%a: tensor<4x6xf32>) -> tensor<6x4xf32> {
  // expected-error @+1 {{perm is not a permutation of 0..1}}
  %0 = nn.transpose %a {perm = array<i64: 1, 1>} : tensor<4x6xf32> -> tensor<6x4xf32>
  return %0 : tensor<6x4xf32>
}

// -----

func.func @loss_labels(%s: tensor<4x10xf32>, %l: tensor<5xi64>) -> tensor<f32> {
  // expected-error @+1 {{labels must be [4] for scores [4x10], got [5]}}
  %0 = nn.softmax_cross_entropy_loss %s, %l : (tensor<4x10xf32>, tensor<5xi64>) -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

func.func @loss_reduction(%s: tensor<4x10xf32>, %l: tensor<4xi64>) -> tensor<f32> {
  // expected-error @+1 {{reduction must be none, mean or sum, got 'avg'}}
  %0 = nn.softmax_cross_entropy_loss %s, %l {reduction = "avg"} : (tensor<4x10xf32>, tensor<4xi64>) -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

func.func @loss_none_shape(%s: tensor<4x10xf32>, %l: tensor<4xi64>) -> tensor<f32> {
  // expected-error @+1 {{loss must have shape [4] for reduction 'none'}}
  %0 = nn.softmax_cross_entropy_loss %s, %l {reduction = "none"} : (tensor<4x10xf32>, tensor<4xi64>) -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

func.func @sum_to_shape(%a: tensor<4x6xf32>) -> tensor<5xf32> {
  // expected-error @+1 {{result shape [5] does not broadcast to the input [4x6]}}
  %0 = nn.sum_to_shape %a : tensor<4x6xf32> -> tensor<5xf32>
  return %0 : tensor<5xf32>
}

// -----

func.func @sgd_lr(%w: tensor<4xf32>, %g: tensor<4xf32>, %lr: tensor<1xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{lr must be a rank-0 tensor}}
  %0 = nn.sgd_update %w, %g, %lr : tensor<4xf32>, tensor<1xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @relu_type(%a: tensor<4xi64>) -> tensor<4xi64> {
  // expected-error @+1 {{must be ranked tensor of 32-bit float or 64-bit float or bfloat16 type values}}
  %0 = nn.relu %a : tensor<4xi64>
  return %0 : tensor<4xi64>
}

// -----

func.func @cast_bf16_int(%a: tensor<4xbf16>) -> tensor<4xi64> {
  // expected-error @+1 {{converts bf16 only to or from f32, not 'bf16' to 'i64'}}
  %0 = nn.cast %a : tensor<4xbf16> -> tensor<4xi64>
  return %0 : tensor<4xi64>
}

// -----

func.func @reshape_changes_type(%a: tensor<4xbf16>) -> tensor<2x2xf32> {
  // expected-error @+1 {{element type changes from 'bf16' to 'f32'}}
  %0 = nn.reshape %a : tensor<4xbf16> -> tensor<2x2xf32>
  return %0 : tensor<2x2xf32>
}

// -----

// bf16 storage (--activations bf16) goes with f32 only.
func.func @bf16_beside_f64(%a: tensor<4xbf16>, %b: tensor<4xf64>) -> tensor<4xf64> {
  // expected-error @+1 {{mixes bf16 and f64 tensors}}
  %0 = nn.add %a, %b : tensor<4xbf16>, tensor<4xf64> -> tensor<4xf64>
  return %0 : tensor<4xf64>
}

// -----

func.func @bf16_unary_result_f32(%a: tensor<4xbf16>) -> tensor<4xf32> {
  // expected-error @+1 {{requires the same type for all operands and results}}
  %0 = "nn.relu"(%a) : (tensor<4xbf16>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @bf16_gemm(%a: tensor<2x2xbf16>, %b: tensor<2x2xf32>) -> tensor<2x2xf32> {
  // expected-error @+1 {{must be ranked tensor of 32-bit float or 64-bit float values}}
  %0 = nn.gemm %a, %b : (tensor<2x2xbf16>, tensor<2x2xf32>) -> tensor<2x2xf32>
  return %0 : tensor<2x2xf32>
}
