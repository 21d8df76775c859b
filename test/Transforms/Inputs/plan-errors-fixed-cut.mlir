// Used by ../plan-errors.mlir (--pipe-plan="stages=2 last=5"): a fixed cut
// that does not split the model's layers into the stages.

// Layer 5 of a 3-layer model: the cut is [5, 2].
// expected-error @below {{the fixed cut (last layers 5) does not split the 3 layers into 2 stages: stage 0 ends at layer 5 but there are only 3 layers (0..2)}}
module {
  func.func @main(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    %0 = nn.relu %x {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    %1 = nn.tanh %0 {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    %2 = nn.relu %1 {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    return %2 : tensor<4x5xf32>
  }
}

// -----

// On 6 layers the cut is [5, 5]: the last stage is empty.
// expected-error @below {{the fixed cut (last layers 5) does not split the 6 layers into 2 stages: stage 1 is empty (layers 6..5)}}
module {
  func.func @main(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    %0 = nn.relu %x {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    %1 = nn.tanh %0 {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    %2 = nn.relu %1 {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    %3 = nn.tanh %2 {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    %4 = nn.relu %3 {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    %5 = nn.tanh %4 {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    return %5 : tensor<4x5xf32>
  }
}
