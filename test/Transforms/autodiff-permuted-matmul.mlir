// RUN: pipec-opt %s --nn-autodiff | FileCheck %s

// The gradients of a matmul that reads an operand through a permutation
// (perm_a / perm_b are set by nn-fold-transposes, normally after
// differentiation): the plain product of the permuted operand is
// differentiated and its gradient is permuted back (the inverse
// permutation; (1, 0, 2) is its own). For Y = P(W) V with W [3,2,4] read
// as [2,3,4] and V [2,4,5].
// CHECK-LABEL: func.func @s0_bwd
// CHECK-DAG: nn.transpose %{{.*}} {perm = array<i64: 1, 0, 2>} : tensor<3x2x4xf32> -> tensor<2x3x4xf32>
// CHECK-DAG: nn.transpose %{{.*}} {perm = array<i64: 1, 0, 2>} : tensor<2x3x4xf32> -> tensor<3x2x4xf32>
// CHECK-NOT: perm_a
// CHECK: func.func @s0_step

module attributes {pipe.plan = #pipe.plan<algorithm = "balanced", first = [0], last = [0], replicas = [1], predicted_iteration_s = 0.000000e+00>, pipec.inputs = ["x"], pipec.opset = 17 : i64} {
  ml_program.global private mutable @w(dense<1.000000e-01> : tensor<3x2x4xf32>) : tensor<3x2x4xf32>
  ml_program.global private mutable @v(dense<2.000000e-01> : tensor<2x4x5xf32>) : tensor<2x4x5xf32>
  func.func @s0_fwd(%x: tensor<2x3x5xf32> {pipe.feed = 0 : i64}) -> (tensor<2x3x5xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    %w = ml_program.global_load @w : tensor<3x2x4xf32>
    %v = ml_program.global_load @v : tensor<2x4x5xf32>
    %y = nn.matmul %w, %v {perm_a = array<i64: 1, 0, 2>} : (tensor<3x2x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32> loc("mm")
    %z = nn.add %y, %x : tensor<2x3x5xf32>, tensor<2x3x5xf32> -> tensor<2x3x5xf32> loc("add")
    return %z : tensor<2x3x5xf32>
  }
}
