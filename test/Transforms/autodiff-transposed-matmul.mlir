// RUN: pipec-opt %s --nn-autodiff | FileCheck %s
// RUN: pipec-opt %s --nn-autodiff --nn-fold-transposes | FileCheck %s --check-prefix=FOLD

// The gradients of a matmul with a transposed operand (trans flags are set
// by nn-fold-transposes, normally after differentiation): the plain
// product of the transposed operands is differentiated and the operand
// gradients are transposed back. For Y = W^T V (W [2,5,3], V [2,5,4]):
//   dW = (dY V^T)^T, dV = (W^T)^T dY.
// CHECK-LABEL: func.func @s0_bwd
// CHECK-DAG: %[[VT:.*]] = nn.transpose %[[V:[^ ]*]] {perm = array<i64: 0, 2, 1>} : tensor<2x5x4xf32> -> tensor<2x4x5xf32>
// CHECK-DAG: %[[DWT:.*]] = nn.matmul %[[DY:[^,]*]], %[[VT]] : (tensor<2x3x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>
// CHECK-DAG: nn.transpose %[[DWT]] {perm = array<i64: 0, 2, 1>} : tensor<2x3x5xf32> -> tensor<2x5x3xf32>
// CHECK-DAG: %[[WT:.*]] = nn.transpose %[[W:[^ ]*]] {perm = array<i64: 0, 2, 1>} : tensor<2x5x3xf32> -> tensor<2x3x5xf32>
// CHECK-DAG: %[[WTT:.*]] = nn.transpose %[[WT]] {perm = array<i64: 0, 2, 1>} : tensor<2x3x5xf32> -> tensor<2x5x3xf32>
// CHECK-DAG: nn.matmul %[[WTT]], %[[DY]] : (tensor<2x5x3xf32>, tensor<2x3x4xf32>) -> tensor<2x5x4xf32>

// Folding afterwards: dW^T's product reads V through trans_b, dV's reads
// W itself (the transpose of a transpose cancels); only the transpose of
// dW^T back to W's layout is left.
// FOLD-LABEL: func.func @s0_bwd
// FOLD: %[[DWT:.*]] = nn.matmul %{{.*}}, %v {trans_b = true} : (tensor<2x3x4xf32>, tensor<2x5x4xf32>) -> tensor<2x3x5xf32>
// FOLD: nn.matmul %w, %{{.*}} : (tensor<2x5x3xf32>, tensor<2x3x4xf32>) -> tensor<2x5x4xf32>
// FOLD: nn.transpose %[[DWT]]
// FOLD-NOT: nn.transpose
// FOLD: func.func @s0_step

module attributes {pipe.plan = #pipe.plan<algorithm = "balanced", first = [0], last = [0], replicas = [1], predicted_iteration_s = 0.000000e+00>, pipec.inputs = ["x"], pipec.opset = 17 : i64} {
  ml_program.global private mutable @w(dense<1.000000e-01> : tensor<2x5x3xf32>) : tensor<2x5x3xf32>
  ml_program.global private mutable @v(dense<2.000000e-01> : tensor<2x5x4xf32>) : tensor<2x5x4xf32>
  func.func @s0_fwd(%x: tensor<2x3x4xf32> {pipe.feed = 0 : i64}) -> (tensor<2x3x4xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    %w = ml_program.global_load @w : tensor<2x5x3xf32>
    %v = ml_program.global_load @v : tensor<2x5x4xf32>
    %y = nn.matmul %w, %v {trans_a = true} : (tensor<2x5x3xf32>, tensor<2x5x4xf32>) -> tensor<2x3x4xf32> loc("mm")
    %z = nn.add %y, %x : tensor<2x3x4xf32>, tensor<2x3x4xf32> -> tensor<2x3x4xf32> loc("add")
    return %z : tensor<2x3x4xf32>
  }
}
