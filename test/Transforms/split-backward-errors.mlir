// Every error of pipec::splitBackward (passes/SplitBackward.cpp), which has
// no pass of its own: --pipe-build-schedule runs it on every stage for the
// zero-bubble schedule (schedule=zb-h1), so the cases go through that pass.
//
// Not reachable from IR:
//   "stage K has no backward function" (--pipe-build-schedule first requires
//   @sK_fwd, @sK_bwd and @sK_step for the same stages 0..n-1 and only splits
//   stages 0..n-1, so @sK_bwd always exists; a missing one is reported as
//   "expected @sK_fwd, @sK_bwd and @sK_step for every stage" instead).
//
// RUN: pipec-opt %s -split-input-file -verify-diagnostics --pipe-build-schedule="schedule=zb-h1 microbatches=2"

// @s0_bwdw already exists: the backward was split before.
module {
  func.func @s0_fwd(%x: tensor<2x4xf32> {pipe.feed = 0 : i64}) -> (tensor<f32> {pipe.loss}) attributes {pipe.stage = 0 : i64} {
    %0 = nn.constant dense<0.0> : tensor<f32>
    return %0 : tensor<f32>
  }
  // expected-error @+1 {{the backward of stage 0 is already split}}
  func.func @s0_bwd(%seed: tensor<f32> {pipe.loss_seed}) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_bwdw() attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
}

// -----

// Any symbol named @s1_bwdw counts, here a global; stage 0 splits first,
// then stage 1 is refused.
module {
  ml_program.global private mutable @s1_bwdw(dense<0.0> : tensor<f32>) : tensor<f32>
  func.func @s0_fwd(%x: tensor<2x4xf32> {pipe.feed = 0 : i64}) -> tensor<2x4xf32> attributes {pipe.stage = 0 : i64} {
    %0 = nn.relu %x : tensor<2x4xf32>
    return %0 : tensor<2x4xf32>
  }
  func.func @s0_bwd(%g: tensor<2x4xf32> {pipe.grad_from = array<i64: 1, 0>}, %x: tensor<2x4xf32> {pipe.fwd_arg = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s1_fwd(%a: tensor<2x4xf32> {pipe.from = array<i64: 0, 0>}) -> (tensor<f32> {pipe.loss}) attributes {pipe.stage = 1 : i64} {
    %0 = nn.constant dense<0.0> : tensor<f32>
    return %0 : tensor<f32>
  }
  // expected-error @+1 {{the backward of stage 1 is already split}}
  func.func @s1_bwd(%seed: tensor<f32> {pipe.loss_seed}, %a: tensor<2x4xf32> {pipe.fwd_arg = 0 : i64}) -> (tensor<2x4xf32> {pipe.grad_of_arg = 0 : i64}) attributes {pipe.stage = 1 : i64} {
    return %a : tensor<2x4xf32>
  }
  func.func @s1_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 1 : i64} {
    return
  }
}
