// RUN: pipec-opt %s | FileCheck %s
// RUN: pipec-opt %s | pipec-opt | FileCheck %s
// RUN: pipec-opt %s --mlir-print-op-generic | pipec-opt | FileCheck %s

// CHECK-LABEL: func.func @forward_ops
func.func @forward_ops(%x: tensor<4x1x2x3xf32>, %w: tensor<5x6xf32>, %b: tensor<5xf32>,
                       %m: tensor<2x6x7xf32>, %labels: tensor<4xi64>) -> tensor<f32> {
  // CHECK: nn.flatten %{{.*}} : tensor<4x1x2x3xf32> -> tensor<4x6xf32>
  %f = nn.flatten %x {axis = 1 : i64} : tensor<4x1x2x3xf32> -> tensor<4x6xf32>
  // CHECK: nn.gemm %{{.*}}, %{{.*}}, %{{.*}} {alpha = 2.000000e+00 : f32, trans_b = true}
  %g = nn.gemm %f, %w, %b {alpha = 2.0 : f32, trans_b = true} : (tensor<4x6xf32>, tensor<5x6xf32>, tensor<5xf32>) -> tensor<4x5xf32>
  // CHECK: nn.relu
  %r = nn.relu %g : tensor<4x5xf32>
  // CHECK: nn.tanh
  %t = nn.tanh %r : tensor<4x5xf32>
  // CHECK: nn.sigmoid
  %s = nn.sigmoid %t : tensor<4x5xf32>
  // CHECK: nn.identity
  %i = nn.identity %s : tensor<4x5xf32>
  // CHECK: nn.add %{{.*}}, %{{.*}} : tensor<4x5xf32>, tensor<5xf32> -> tensor<4x5xf32>
  %a = nn.add %i, %b : tensor<4x5xf32>, tensor<5xf32> -> tensor<4x5xf32>
  // CHECK: nn.sub
  %su = nn.sub %a, %i : tensor<4x5xf32>, tensor<4x5xf32> -> tensor<4x5xf32>
  // CHECK: nn.mul
  %mu = nn.mul %su, %a : tensor<4x5xf32>, tensor<4x5xf32> -> tensor<4x5xf32>
  // CHECK: nn.div
  %d = nn.div %mu, %b : tensor<4x5xf32>, tensor<5xf32> -> tensor<4x5xf32>
  // CHECK: nn.softmax %{{.*}} {axis = 1 : i64} : tensor<4x5xf32>
  %sm = nn.softmax %d {axis = 1 : i64} : tensor<4x5xf32>
  // CHECK: nn.log_softmax %{{.*}} {coerce_2d} : tensor<4x5xf32>
  %ls = nn.log_softmax %sm {axis = -1 : i64, coerce_2d} : tensor<4x5xf32>
  // CHECK: nn.transpose %{{.*}} {perm = array<i64: 1, 0>} : tensor<4x5xf32> -> tensor<5x4xf32>
  %tr = nn.transpose %ls {perm = array<i64: 1, 0>} : tensor<4x5xf32> -> tensor<5x4xf32>
  // CHECK: nn.reshape %{{.*}} : tensor<5x4xf32> -> tensor<4x5xf32>
  %re = nn.reshape %tr : tensor<5x4xf32> -> tensor<4x5xf32>
  // CHECK: nn.matmul %{{.*}}, %{{.*}} : (tensor<2x6x7xf32>, tensor<7x6xf32>) -> tensor<2x6x6xf32>
  %c = nn.constant dense<1.0> : tensor<7x6xf32>
  %mm = nn.matmul %m, %c : (tensor<2x6x7xf32>, tensor<7x6xf32>) -> tensor<2x6x6xf32>
  // CHECK: nn.softmax_cross_entropy_loss %{{.*}}, %{{.*}} {reduction = "sum"} : (tensor<4x5xf32>, tensor<4xi64>) -> tensor<f32>
  %l = nn.softmax_cross_entropy_loss %re, %labels {reduction = "sum"} : (tensor<4x5xf32>, tensor<4xi64>) -> tensor<f32>
  return %l : tensor<f32>
}

// CHECK-LABEL: func.func @gradient_ops
func.func @gradient_ops(%x: tensor<4x5xf32>, %dy: tensor<4x5xf32>, %labels: tensor<4xi64>,
                        %dl: tensor<f32>, %lr: tensor<f32>) -> (tensor<5xf32>, tensor<4x5xf32>) {
  // CHECK: nn.relu_grad
  %0 = nn.relu_grad %x, %dy : tensor<4x5xf32>
  // CHECK: nn.tanh_grad
  %1 = nn.tanh_grad %x, %0 : tensor<4x5xf32>
  // CHECK: nn.sigmoid_grad
  %2 = nn.sigmoid_grad %x, %1 : tensor<4x5xf32>
  // CHECK: nn.softmax_grad %{{.*}}, %{{.*}} {axis = 1 : i64, log} : tensor<4x5xf32>
  %3 = nn.softmax_grad %x, %2 {axis = 1 : i64, log} : tensor<4x5xf32>
  // CHECK: nn.sum_to_shape %{{.*}} {scale = -1.000000e+00 : f64} : tensor<4x5xf32> -> tensor<5xf32>
  %4 = nn.sum_to_shape %3 {scale = -1.0 : f64} : tensor<4x5xf32> -> tensor<5xf32>
  // CHECK: nn.scale %{{.*}} {factor = 5.000000e-01 : f64} : tensor<4x5xf32>
  %5 = nn.scale %3 {factor = 0.5 : f64} : tensor<4x5xf32>
  // CHECK: nn.softmax_cross_entropy_loss_grad
  %6 = nn.softmax_cross_entropy_loss_grad %5, %labels, %dl : (tensor<4x5xf32>, tensor<4xi64>, tensor<f32>) -> tensor<4x5xf32>
  // CHECK: nn.sgd_update %{{.*}}, %{{.*}}, %{{.*}} : tensor<4x5xf32>, tensor<f32>
  %7 = nn.sgd_update %x, %6, %lr : tensor<4x5xf32>, tensor<f32>
  // CHECK: nn.fill {value = 0.000000e+00 : f64} : tensor<5xf32>
  %8 = nn.fill {value = 0.0 : f64} : tensor<5xf32>
  return %8, %7 : tensor<5xf32>, tensor<4x5xf32>
}

// CHECK-LABEL: func.func @cost_attr
// CHECK: nn.cost = #nn.cost<fwd = 1.000000e-03, bwd = 2.000000e-03, out_bytes = 80, param_bytes = 0, saved_bytes = 80>
func.func @cost_attr(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
  %0 = nn.relu %x {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 2.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
  return %0 : tensor<4x5xf32>
}
