// Input of build-schedule-errors.mlir, run with --pipe-build-schedule="schedule=interleaved microbatches=2 chunks=2"
// Rule "tied": the interleaved schedule puts tied stages 0 and 2 on one device (p = 2, v = 2).
// expected-error @+1 {{weight 'w' is read by stages 0 and 2 (tied weights), and schedule 'interleaved' places two of those stages on device 0; choose --stages and --chunks so that they land on different devices}}
module attributes {pipe.tied = {w = array<i64: 0, 2>}} {
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
  func.func @s1_bwd(%g: tensor<2xf32> {pipe.grad_from = array<i64: 2, 0>}) -> (tensor<2xf32> {pipe.grad_of_arg = 0 : i64}) attributes {pipe.stage = 1 : i64} {
    return %g : tensor<2xf32>
  }
  func.func @s1_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 1 : i64} {
    return
  }
  func.func @s2_fwd(%x: tensor<2xf32> {pipe.from = array<i64: 1, 0>}) -> tensor<2xf32> attributes {pipe.stage = 2 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s2_bwd(%g: tensor<2xf32> {pipe.grad_from = array<i64: 3, 0>}) -> (tensor<2xf32> {pipe.grad_of_arg = 0 : i64}) attributes {pipe.stage = 2 : i64} {
    return %g : tensor<2xf32>
  }
  func.func @s2_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 2 : i64} {
    return
  }
  func.func @s3_fwd(%x: tensor<2xf32> {pipe.from = array<i64: 2, 0>}) -> tensor<2xf32> attributes {pipe.stage = 3 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s3_bwd(%g: tensor<2xf32>) -> (tensor<2xf32> {pipe.grad_of_arg = 0 : i64}) attributes {pipe.stage = 3 : i64} {
    return %g : tensor<2xf32>
  }
  func.func @s3_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 3 : i64} {
    return
  }
}
