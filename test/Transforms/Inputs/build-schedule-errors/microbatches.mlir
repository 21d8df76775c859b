// Input of build-schedule-errors.mlir, run with --pipe-build-schedule=microbatches=0
// Rule "microbatches": no microbatches per step.
// expected-error @+1 {{the number of microbatches must be at least 1 (got 0)}}
module {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s0_bwd(%g: tensor<2xf32>) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
}
