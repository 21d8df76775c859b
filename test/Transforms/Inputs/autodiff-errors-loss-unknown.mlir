// Case of autodiff-errors.mlir run with --nn-autodiff=loss=hinge.

// An unknown loss; reported on the last stage, which would receive it.
module {
  // expected-error @+1 {{unknown loss 'hinge' (cross-entropy or model)}}
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    %0 = nn.relu %x : tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}
