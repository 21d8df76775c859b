// RUN: pipec-opt %s --nn-autodiff | FileCheck %s
// RUN: pipec-opt %s --nn-autodiff --pipe-build-schedule="schedule=1f1b-flush microbatches=4" --pipe-verify-schedule=report 2>&1 | FileCheck %s --check-prefix=SLOTS
// Stage 0 trains nothing and receives from nobody that does (it only
// flattens its input): stage 1 computes and sends no gradient for it, and
// stage 0's backward receives none. Stage 2 trains nothing either but
// receives from stage 1, which does: it sends stage 1 its gradient.

// Stage 0's backward keeps nothing, so its 3 microbatches in flight share
// one stash slot (stage 1 keeps its matmul input for each of its 2).
// SLOTS: remark: rank0 (stage 0): peak stashed microbatches 3 = closed form, slots 1 (its backward keeps nothing: one slot)
// SLOTS: remark: rank1 (stage 1): peak stashed microbatches 2 = closed form, slots 2
// SLOTS-NOT: nothing

// CHECK-LABEL: func.func @s0_bwd()
// CHECK-NEXT: return
// CHECK-LABEL: func.func @s1_bwd
// CHECK-SAME: pipe.grad_from = array<i64: 2, 0>
// CHECK-NOT: pipe.grad_of_arg
// CHECK-LABEL: func.func @s1_step
// CHECK-LABEL: func.func @s2_bwd
// CHECK-SAME: pipe.grad_of_arg = 0
module {
  ml_program.global private mutable @w(dense<0.5> : tensor<12x3xf32>) : tensor<12x3xf32>
  func.func @s0_fwd(%x: tensor<4x3x4xf32> {pipe.feed = 0 : i64}) -> tensor<4x12xf32> attributes {pipe.stage = 0 : i64} {
    %0 = nn.flatten %x {axis = 1 : i64} : tensor<4x3x4xf32> -> tensor<4x12xf32>
    return %0 : tensor<4x12xf32>
  }
  func.func @s1_fwd(%a: tensor<4x12xf32> {pipe.from = array<i64: 0, 0>}) -> tensor<4x3xf32> attributes {pipe.stage = 1 : i64} {
    %w = ml_program.global_load @w : tensor<12x3xf32>
    %0 = nn.matmul %a, %w : (tensor<4x12xf32>, tensor<12x3xf32>) -> tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
  func.func @s2_fwd(%h: tensor<4x3xf32> {pipe.from = array<i64: 1, 0>}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 2 : i64} {
    %0 = nn.relu %h : tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}
