// Input of build-schedule-errors.mlir, run with --pipe-build-schedule="schedule=zb-h1 microbatches=2"
// Zero bubble splits every backward, but @s0_bwd already has its weight half @s0_bwdw.
module {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  // expected-error @+1 {{the backward of stage 0 is already split}}
  func.func @s0_bwd(%g: tensor<2xf32>) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_bwdw() attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
}
