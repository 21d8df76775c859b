// RUN: pipec-opt %s --nn-autodiff --pipe-recompute=mode=selective | FileCheck %s

// Selective recomputation re-runs the cheap relu from the GEMM result %h
// it starts from. %h is also a stage output (sent to stage 1), so it is
// read from its stash slot (pipe.fwd_result = 0), not kept a second time
// as a saved result.
// CHECK-LABEL: func.func @s0_fwd
// CHECK-SAME: -> (tensor<4x5xf32>, tensor<4x3xf32>)
// CHECK-SAME: pipe.recompute = "selective"
// CHECK-LABEL: func.func @s0_bwd
// CHECK-SAME: %[[H:[^:]*]]: tensor<4x5xf32> {pipe.fwd_result = 0 : i64}
// CHECK: nn.relu %[[H]]

module attributes {pipe.plan = #pipe.plan<algorithm = "balanced", first = [0, 3], last = [2, 4], replicas = [1, 1], predicted_iteration_s = 0.000000e+00>, pipec.inputs = ["x"], pipec.opset = 17 : i64} {
  ml_program.global private mutable @w1(dense<1.000000e-01> : tensor<5x6xf32>) : tensor<5x6xf32>
  ml_program.global private mutable @w2(dense<2.000000e-01> : tensor<3x5xf32>) : tensor<3x5xf32>
  ml_program.global private mutable @w3(dense<3.000000e-01> : tensor<3x8xf32>) : tensor<3x8xf32>
  func.func @s0_fwd(%arg0: tensor<4x6xf32> {pipe.feed = 0 : i64}) -> (tensor<4x5xf32>, tensor<4x3xf32>) attributes {pipe.stage = 0 : i64} {
    %w1 = ml_program.global_load @w1 : tensor<5x6xf32>
    %w2 = ml_program.global_load @w2 : tensor<3x5xf32>
    %h = nn.gemm %arg0, %w1 {trans_b = true} : (tensor<4x6xf32>, tensor<5x6xf32>) -> tensor<4x5xf32> loc("fc1")
    %g = nn.relu %h : tensor<4x5xf32> loc("act")
    %y = nn.gemm %g, %w2 {trans_b = true} : (tensor<4x5xf32>, tensor<3x5xf32>) -> tensor<4x3xf32> loc("fc2")
    return %h, %y : tensor<4x5xf32>, tensor<4x3xf32>
  }
  func.func @s1_fwd(%arg0: tensor<4x5xf32> {pipe.from = array<i64: 0, 0>}, %arg1: tensor<4x3xf32> {pipe.from = array<i64: 0, 1>}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 1 : i64} {
    %w3 = ml_program.global_load @w3 : tensor<3x8xf32>
    %c = nn.concat %arg0, %arg1 {axis = 1 : i64} : (tensor<4x5xf32>, tensor<4x3xf32>) -> tensor<4x8xf32> loc("cat")
    %o = nn.gemm %c, %w3 {trans_b = true} : (tensor<4x8xf32>, tensor<3x8xf32>) -> tensor<4x3xf32> loc("fc3")
    return %o : tensor<4x3xf32>
  }
}
