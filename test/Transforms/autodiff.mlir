// RUN: pipec-opt %S/Inputs/split.mlir --nn-autodiff | FileCheck %s
// RUN: not pipec-opt %S/Inputs/tiny_mlp.mlir --nn-autodiff 2>&1 | FileCheck %s --check-prefix=NOSPLIT
// RUN: not pipec-opt %S/Inputs/split.mlir --nn-autodiff=loss=hinge 2>&1 | FileCheck %s --check-prefix=LOSS

// Gradient accumulators for every trained weight.
// CHECK-DAG: ml_program.global private mutable @w1.grad(dense<0.000000e+00> : tensor<5x6xf32>) : tensor<5x6xf32> {pipe.grad_of = @w1}
// CHECK-DAG: ml_program.global private mutable @b2.grad(dense<0.000000e+00> : tensor<3xf32>) : tensor<3xf32> {pipe.grad_of = @b2}

// Stage 0 stashes the input it needs for dW1 (pipe.fwd_arg), receives the
// gradient of its output from stage 1, and has no input gradient to send.
// CHECK-LABEL: func.func @s0_fwd
// CHECK-LABEL: func.func @s0_bwd
// CHECK-SAME: (%[[DY:.*]]: tensor<4x5xf32> {pipe.grad_from = array<i64: 1, 0>}, %[[X:.*]]: tensor<4x6xf32> {pipe.fwd_arg = 0 : i64})
// Each weight gradient is accumulated as soon as it is complete (its
// scratch buffer is free again at once).
// CHECK: %[[DW:.*]] = nn.gemm %[[DY]], %[[X]] {beta = 0.000000e+00 : f32, trans_a = true} : (tensor<4x5xf32>, tensor<4x6xf32>) -> tensor<5x6xf32>
// CHECK-NEXT: %[[OLD:.*]] = ml_program.global_load @w1.grad
// CHECK-NEXT: %[[SUM:.*]] = nn.add %[[OLD]], %[[DW]]
// CHECK-NEXT: ml_program.global_store @w1.grad = %[[SUM]]
// CHECK-NEXT: %[[DB:.*]] = nn.sum_to_shape %[[DY]] : tensor<4x5xf32> -> tensor<5xf32>
// CHECK-NEXT: %[[OLDB:.*]] = ml_program.global_load @b1.grad
// CHECK-NEXT: %[[SUMB:.*]] = nn.add %[[OLDB]], %[[DB]]
// CHECK-NEXT: ml_program.global_store @b1.grad = %[[SUMB]]
// CHECK-LABEL: func.func @s0_step
// CHECK-SAME: (%[[LR:.*]]: tensor<f32> {pipe.lr})
// CHECK: %[[W:.*]] = ml_program.global_load @w1 :
// CHECK: %[[G:.*]] = ml_program.global_load @w1.grad
// CHECK: %[[NEW:.*]] = nn.sgd_update %[[W]], %[[G]], %[[LR]]
// CHECK: ml_program.global_store @w1 = %[[NEW]]
// CHECK: %[[Z:.*]] = nn.fill {value = 0.000000e+00 : f64} : tensor<5x6xf32>
// CHECK: ml_program.global_store @w1.grad = %[[Z]]

// The last stage gets the labels feed and the loss; its forward also
// returns what its backward needs (pipe.saved).
// CHECK-LABEL: func.func @s1_fwd
// CHECK-SAME: %{{.*}}: tensor<4xi64> {pipe.feed = -1 : i64}
// CHECK-SAME: -> (tensor<f32> {pipe.loss}, tensor<4x3xf32> {pipe.saved}, tensor<4x5xf32> {pipe.saved})
// CHECK: nn.softmax_cross_entropy_loss
// CHECK-LABEL: func.func @s1_bwd
// CHECK-SAME: {pipe.loss_seed}
// CHECK-SAME: -> (tensor<4x5xf32> {pipe.grad_of_arg = 0 : i64})
// CHECK: nn.softmax_cross_entropy_loss_grad
// CHECK: nn.relu_grad
// CHECK: return {{.*}} : tensor<4x5xf32>
// CHECK-LABEL: func.func @s1_step

// NOSPLIT: no stage functions @s0_fwd...; run --pipe-split-stages first
// LOSS: unknown loss 'hinge' (cross-entropy or model)

// RUN: pipec-opt %S/Inputs/split_1stage.mlir --nn-autodiff="optimizer=adam weight-decay=0.01" | FileCheck %s --check-prefix=ADAM
// RUN: pipec-opt %S/Inputs/split_1stage.mlir --nn-autodiff="optimizer=nesterov momentum=0.8" | FileCheck %s --check-prefix=NESTEROV
// RUN: not pipec-opt %S/Inputs/split_1stage.mlir --nn-autodiff=optimizer=lion 2>&1 | FileCheck %s --check-prefix=BADOPT

// Adam keeps two zero-initialised state tensors per weight and takes the
// update count T from the runtime.
// ADAM-DAG: ml_program.global private mutable @w1.adam_v(dense<0.000000e+00> : tensor<5x6xf32>) : tensor<5x6xf32> {pipe.state_of = @w1}
// ADAM-DAG: ml_program.global private mutable @w1.adam_h(dense<0.000000e+00> : tensor<5x6xf32>) : tensor<5x6xf32> {pipe.state_of = @w1}
// ADAM-LABEL: func.func @s0_step
// ADAM-SAME: (%[[LR:.*]]: tensor<f32> {pipe.lr}, %[[T:.*]]: tensor<i64> {pipe.step_count})
// ADAM: %{{.*}}, %{{.*}}, %{{.*}} = nn.adam %[[LR]], %[[T]], %w2, %w2.grad, %w2.adam_v, %w2.adam_h {epsilon = 9.99999993E-9 : f32, norm_coefficient = 0.00999999977 : f32}
// ADAM: ml_program.global_store @w2.adam_v
// ADAM: ml_program.global_store @w2.adam_h

// NESTEROV: nn.momentum {{.*}} {alpha = 8.000000e-01 : f32, beta = 1.000000e+00 : f32, mode = "nesterov"}
// BADOPT: unknown optimizer 'lion' (sgd, momentum, nesterov, adam, adagrad)
