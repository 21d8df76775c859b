// Used by ../annotate-costs-errors.mlir (--nn-annotate-costs=device=tpu):
// an analytic device model that does not exist fails the whole module.
// expected-error @below {{unknown device model 'tpu' (known: cpu, v100, }}
module {
  func.func @main(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    %0 = nn.relu %x : tensor<4x5xf32>
    return %0 : tensor<4x5xf32>
  }
}
