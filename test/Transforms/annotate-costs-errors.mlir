// Every error --nn-annotate-costs (passes/AnnotateCosts.cpp) reports, with
// -verify-diagnostics. A layer missing from the measured profile is the one
// error the IR decides: the cases below, against Inputs/tiny_profile.json
// (fc1, act1, fc2). The others come from the options alone and fail any
// module, so each has its own input under Inputs/ and its own RUN line:
//   unknown device model            Inputs/annotate-costs-errors-device.mlir
//   cannot read profile             Inputs/annotate-costs-errors-no-profile.mlir
//   profile '...': <parse error>    Inputs/annotate-costs-errors-bad-profile.mlir
//
// RUN: pipec-opt %s -split-input-file -verify-diagnostics --nn-annotate-costs=profile=%S/Inputs/tiny_profile.json
// RUN: pipec-opt %S/Inputs/annotate-costs-errors-device.mlir -verify-diagnostics --nn-annotate-costs=device=tpu
// RUN: pipec-opt %S/Inputs/annotate-costs-errors-no-profile.mlir -verify-diagnostics --nn-annotate-costs=profile=%S/Inputs/nope.json
// RUN: pipec-opt %S/Inputs/annotate-costs-errors-bad-profile.mlir -verify-diagnostics --nn-annotate-costs=profile=%S/Inputs/bad_profile.json

// A layer without an ONNX name is looked up as "<op>_<index>" (here relu_1),
// which the profile does not hold.
module {
  func.func @main(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    %0 = nn.relu %x : tensor<4x5xf32> loc("act1")
    // expected-error @+1 {{op 'relu_1' is not in profile '}}
    %1 = nn.relu %0 : tensor<4x5xf32>
    return %1 : tensor<4x5xf32>
  }
}

// -----

// A named layer the profile never measured (another model's profile). The
// op's location is the bare ONNX name, with no file position: @unknown.
module {
  func.func @main(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    %0 = nn.relu %x : tensor<4x5xf32> loc("act1")
    // expected-error-re @unknown {{op 'act9' is not in profile '{{.*}}tiny_profile.json' (was it measured on another model?)}}
    %1 = nn.relu %0 : tensor<4x5xf32> loc("act9")
    return %1 : tensor<4x5xf32>
  }
}

// -----

// The second op of one ONNX node is profiled as "<name>#2"; a profile
// without that entry misses it (and only it).
module {
  func.func @main(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    %0 = nn.relu %x : tensor<4x5xf32> loc("act1")
    // expected-error @unknown {{op 'act1#2' is not in profile '}}
    %1 = nn.tanh %0 : tensor<4x5xf32> loc("act1")
    return %1 : tensor<4x5xf32>
  }
}

// -----

// Every missing layer is reported, not only the first; layers of any
// function of the module are costed.
module {
  func.func @main(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    // expected-error @+1 {{op 'relu_0' is not in profile '}}
    %0 = nn.relu %x : tensor<4x5xf32>
    return %0 : tensor<4x5xf32>
  }
  func.func @other(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    // expected-error @+1 {{op 'tanh_1' is not in profile '}}
    %0 = nn.tanh %x : tensor<4x5xf32>
    return %0 : tensor<4x5xf32>
  }
}
