// Input of build-schedule-errors.mlir, run with --pipe-build-schedule="schedule=1f1b microbatches=2"
// Rule "tied": tied weights with a continuous schedule.
// expected-error @+1 {{weight 'w' is read by stages 0 and 1 (tied weights); schedule '1f1b' updates stages at different times, so their copies would drift: use a synchronous schedule (gpipe, 1f1b-flush, zb-h1, zb-h2), or a plan that keeps the tied layers in one stage}}
module attributes {pipe.tied = {w = array<i64: 0, 1>}} {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s0_bwd(%g: tensor<2xf32> {pipe.grad_from = array<i64: 1, 0>}) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s1_fwd(%x: tensor<2xf32> {pipe.from = array<i64: 0, 0>}) -> tensor<2xf32> attributes {pipe.stage = 1 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s1_bwd(%g: tensor<2xf32>) -> (tensor<2xf32> {pipe.grad_of_arg = 0 : i64}) attributes {pipe.stage = 1 : i64} {
    return %g : tensor<2xf32>
  }
  func.func @s1_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 1 : i64} {
    return
  }
}
