// Input of build-schedule-errors.mlir, run with --pipe-build-schedule=schedule=zigzag
// There is no schedule "zigzag".
// expected-error @+1 {{unknown schedule 'zigzag' (available: gpipe, 1f1b-flush, 1f1b, 2bw, interleaved, zb-h1, custom, zb-v, zb-h2, dualpipev)}}
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
