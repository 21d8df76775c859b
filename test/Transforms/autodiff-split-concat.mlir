// RUN: pipec-opt %s --nn-autodiff | FileCheck %s

// A tensor read through slices that tile one axis (ONNX Split, attention's
// q, k and v): its gradient is one nn.concat of the slices' gradients, in
// axis order, not a sum of zero-padded slice_grads.
// CHECK-LABEL: func.func @s0_bwd
// CHECK-NOT: nn.slice_grad
// CHECK: %[[CAT:.*]] = nn.concat %[[A:[^,]*]], %[[B:[^,]*]], %[[C:[^ ]*]] {axis = 1 : i64} : (tensor<4x2xf32>, tensor<4x3xf32>, tensor<4x1xf32>) -> tensor<4x6xf32>
// CHECK-NOT: nn.slice_grad
// CHECK: nn.gemm %[[CAT]], %{{.*}} {beta = 0.000000e+00 : f32, trans_a = true}

// Slices that do not tile the axis (a gap: columns 5) keep the sum.
// CHECK-LABEL: func.func @s1_bwd
// CHECK: nn.slice_grad
// CHECK: nn.slice_grad
// CHECK: nn.add
// CHECK-NOT: nn.concat

module attributes {pipe.plan = #pipe.plan<algorithm = "balanced", first = [0, 1], last = [0, 1], replicas = [1, 1], predicted_iteration_s = 0.000000e+00>, pipec.inputs = ["x"], pipec.opset = 17 : i64} {
  ml_program.global private mutable @w(dense<1.000000e-01> : tensor<6x6xf32>) : tensor<6x6xf32>
  ml_program.global private mutable @v(dense<2.000000e-01> : tensor<6x6xf32>) : tensor<6x6xf32>
  func.func @s0_fwd(%x: tensor<4x6xf32> {pipe.feed = 0 : i64}) -> tensor<4x6xf32> attributes {pipe.stage = 0 : i64} {
    %w = ml_program.global_load @w : tensor<6x6xf32>
    %h = nn.gemm %x, %w {trans_b = true} : (tensor<4x6xf32>, tensor<6x6xf32>) -> tensor<4x6xf32> loc("fc")
    // Out of order: columns 2-4, 0-1, 5.
    %b = nn.slice %h {starts = array<i64: 0, 2>, steps = array<i64: 1, 1>} : tensor<4x6xf32> -> tensor<4x3xf32> loc("split#2")
    %a = nn.slice %h {starts = array<i64: 0, 0>, steps = array<i64: 1, 1>} : tensor<4x6xf32> -> tensor<4x2xf32> loc("split")
    %c = nn.slice %h {starts = array<i64: 0, 5>, steps = array<i64: 1, 1>} : tensor<4x6xf32> -> tensor<4x1xf32> loc("split#3")
    %ra = nn.relu %a : tensor<4x2xf32> loc("ra")
    %rb = nn.tanh %b : tensor<4x3xf32> loc("rb")
    %rc = nn.sigmoid %c : tensor<4x1xf32> loc("rc")
    %y = nn.concat %rb, %ra, %rc {axis = 1 : i64} : (tensor<4x3xf32>, tensor<4x2xf32>, tensor<4x1xf32>) -> tensor<4x6xf32> loc("cat")
    return %y : tensor<4x6xf32>
  }
  func.func @s1_fwd(%x: tensor<4x6xf32> {pipe.from = array<i64: 0, 0>}) -> (tensor<4x6xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 1 : i64} {
    %v = ml_program.global_load @v : tensor<6x6xf32>
    %h = nn.gemm %x, %v {trans_b = true} : (tensor<4x6xf32>, tensor<6x6xf32>) -> tensor<4x6xf32> loc("fc2")
    %a = nn.slice %h {starts = array<i64: 0, 0>, steps = array<i64: 1, 1>} : tensor<4x6xf32> -> tensor<4x2xf32> loc("p")
    %b = nn.slice %h {starts = array<i64: 0, 2>, steps = array<i64: 1, 1>} : tensor<4x6xf32> -> tensor<4x3xf32> loc("q")
    %c = nn.concat %a, %b, %a {axis = 1 : i64} : (tensor<4x2xf32>, tensor<4x3xf32>, tensor<4x2xf32>) -> tensor<4x7xf32> loc("cat2")
    %s = nn.slice %c {starts = array<i64: 0, 0>, steps = array<i64: 1, 1>} : tensor<4x7xf32> -> tensor<4x6xf32> loc("trim")
    return %s : tensor<4x6xf32>
  }
}
