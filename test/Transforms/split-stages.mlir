// RUN: pipec-opt %S/Inputs/planned.mlir --pipe-split-stages | FileCheck %s
// RUN: not pipec-opt %S/Inputs/tiny_mlp.mlir --pipe-split-stages 2>&1 | FileCheck %s --check-prefix=NOPLAN
// RUN: pipec-opt %s --split-input-file --verify-diagnostics --pipe-split-stages

// CHECK-LABEL: func.func @s0_fwd
// CHECK-SAME: (%[[X:.*]]: tensor<4x6xf32> {pipe.feed = 0 : i64}) -> tensor<4x5xf32>
// CHECK-SAME: attributes {pipe.stage = 0 : i64}
// CHECK-DAG: ml_program.global_load @w1
// CHECK-DAG: ml_program.global_load @b1
// CHECK: %[[G:.*]] = nn.gemm %[[X]]
// CHECK: return %[[G]]
// CHECK-LABEL: func.func @s1_fwd
// CHECK-SAME: (%[[A:.*]]: tensor<4x5xf32> {pipe.from = array<i64: 0, 0>}) -> (tensor<4x3xf32> {pipe.output = 0 : i64})
// CHECK: nn.relu %[[A]]
// CHECK: ml_program.global_load @w2
// CHECK-NOT: func.func @main
// NOPLAN: no pipe.plan on the module; run --pipe-plan first



// Stages must follow the data flow.
module attributes {pipe.plan = #pipe.plan<algorithm = "manual", first = [0, 1], last = [0, 1], replicas = [1, 1], predicted_iteration_s = 0.0>} {
  func.func @main(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
    %0 = nn.relu %x {pipe.stage = 1 : i64} : tensor<2x4xf32>
    // expected-error @+1 {{uses a value of a later stage (1 > 0): stages must follow the data flow}}
    %1 = nn.tanh %0 {pipe.stage = 0 : i64} : tensor<2x4xf32>
    return %1 : tensor<2x4xf32>
  }
}

// A weight read by two stages (tied weights): each stage loads its copy and
// the module lists the weight with its stages (pipe.tied), for
// --pipe-build-schedule's pipe.tie_reduce.
// RUN: pipec-opt %S/Inputs/tied.mlir --pipe-split-stages | FileCheck %s --check-prefix=TIED
// TIED: module attributes {pipe.plan = {{.*}}, pipe.tied = {tied = array<i64: 0, 1>}
// TIED-LABEL: func.func @s0_fwd
// TIED: ml_program.global_load @tied
// TIED-LABEL: func.func @s1_fwd
// TIED: ml_program.global_load @tied
