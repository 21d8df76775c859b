// Input of build-schedule-errors.mlir, run with --pipe-build-schedule="schedule=gpipe microbatches=2 warmup=B"
// Rule "warmup": DAPPLE's policy B with GPipe.
// expected-error @+1 {{warm-up policy B applies to 1f1b-flush only}}
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
