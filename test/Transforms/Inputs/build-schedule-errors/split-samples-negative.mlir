// Input of build-schedule-errors.mlir, run with --pipe-build-schedule=split-samples=-1
// Rule "split-samples": a negative slice size.
// expected-error @+1 {{split-samples must be >= 0, got -1}}
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
