// Case of autodiff-errors.mlir run with --nn-autodiff=optimizer=lion.

// An unknown optimizer: refused before anything else is looked at.
// expected-error @+1 {{unknown optimizer 'lion' (sgd, momentum, nesterov, adam, adagrad)}}
module {
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    %0 = nn.relu %x : tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}
