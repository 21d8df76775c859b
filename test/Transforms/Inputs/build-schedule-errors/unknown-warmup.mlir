// Input of build-schedule-errors.mlir, run with --pipe-build-schedule=warmup=C
// Warm-up policies are A and B only.
// expected-error @+1 {{unknown warm-up policy 'C' (A: p-s-1 warm-up forwards, B: 2(p-s-1); DAPPLE)}}
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
