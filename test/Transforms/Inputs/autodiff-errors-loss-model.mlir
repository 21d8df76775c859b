// Cases of autodiff-errors.mlir run with --nn-autodiff=loss=model.

// loss=model with a model output 0 that is not a scalar.
module {
  // expected-error @+1 {{loss=model needs a scalar model output 0, got 'tensor<4x3xf32>'}}
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    %0 = nn.relu %x : tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}

// -----

// loss=model: the model's own loss reads the log_prob result of a
// SoftmaxCrossEntropyLoss.
module {
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}, %labels: tensor<4xi64> {pipe.feed = 1 : i64}) -> (tensor<f32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    // expected-error @+1 {{'nn.softmax_cross_entropy_loss' op gradient through the log_prob result is not supported; use the loss output}}
    %l, %lp = nn.softmax_cross_entropy_loss %x, %labels : (tensor<4x3xf32>, tensor<4xi64>) -> (tensor<f32>, tensor<4x3xf32>)
    %l2 = nn.softmax_cross_entropy_loss %lp, %labels : (tensor<4x3xf32>, tensor<4xi64>) -> tensor<f32>
    return %l2 : tensor<f32>
  }
}
