// Used by ../plan-errors.mlir (--pipe-plan="algorithm=dapple topology=
// <a file that does not exist>"): the topology cannot be read.
// expected-error-re @below {{cannot read topology '{{.*}}nope.json'}}
module {
  func.func @main(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    %0 = nn.relu %x {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    %1 = nn.tanh %0 {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    return %1 : tensor<4x5xf32>
  }
}
