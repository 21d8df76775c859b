// Used by ../annotate-costs-errors.mlir (--nn-annotate-costs=profile=
// bad_profile.json): a profile that reads but is not a valid
// pipec.profile/1 (a negative forward time) is refused with the reason.
// expected-error-re @below {{profile '{{.*}}bad_profile.json': profile: op 0 ('fc1'): 'fwd_s' must be a non-negative number (got -1.0)}}
module {
  func.func @main(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    %0 = nn.relu %x : tensor<4x5xf32> loc("act1")
    return %0 : tensor<4x5xf32>
  }
}
