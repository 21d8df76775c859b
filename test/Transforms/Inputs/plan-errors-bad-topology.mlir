// Used by ../plan-errors.mlir (--pipe-plan="algorithm=dapple topology=
// tiny_profile.json"): a JSON file that is not a pipec.topology/1.
// expected-error-re @below {{topology '{{.*}}tiny_profile.json': topology: unsupported format "pipec.profile/1" (expected "pipec.topology/1")}}
module {
  func.func @main(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    %0 = nn.relu %x {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    %1 = nn.tanh %0 {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    return %1 : tensor<4x5xf32>
  }
}
