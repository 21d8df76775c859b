// Used by ../annotate-costs-errors.mlir (--nn-annotate-costs=profile=
// <a file that does not exist>): the profile cannot be read.
// expected-error-re @below {{cannot read profile '{{.*}}nope.json': {{.+}}}}
module {
  func.func @main(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    %0 = nn.relu %x : tensor<4x5xf32> loc("act1")
    return %0 : tensor<4x5xf32>
  }
}
