// Every error --pipe-plan (passes/PlanStages.cpp) reports, with
// -verify-diagnostics, and PassUtils' "no model function @main". The cases
// below run with algorithm=pipedream, so that both a planner failure and a
// plan the compiler cannot lower are decided by the IR. Errors that only
// the options decide fail any module; each has its own input under Inputs/
// and its own RUN line:
//   the fixed cut does not split ...   Inputs/plan-errors-fixed-cut.mlir
//   cannot read topology               Inputs/plan-errors-no-topology.mlir
//   topology '...': <parse error>      Inputs/plan-errors-bad-topology.mlir
//
// RUN: pipec-opt %s -split-input-file -verify-diagnostics --pipe-plan="stages=2 algorithm=pipedream"
// RUN: pipec-opt %S/Inputs/plan-errors-fixed-cut.mlir -split-input-file -verify-diagnostics --pipe-plan="stages=2 last=5"
// RUN: pipec-opt %S/Inputs/plan-errors-no-topology.mlir -verify-diagnostics --pipe-plan="stages=2 algorithm=dapple topology=%S/Inputs/nope.json"
// RUN: pipec-opt %S/Inputs/plan-errors-bad-topology.mlir -verify-diagnostics --pipe-plan="stages=2 algorithm=dapple topology=%S/Inputs/tiny_profile.json"

// No function @main (getModelFunc, passes/PassUtils.cpp).
// expected-error @below {{no model function @main: import an ONNX model first (pipec-translate --import-onnx)}}
module {
  func.func @model(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    %0 = nn.relu %x {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    return %0 : tensor<4x5xf32>
  }
}

// -----

// A symbol @main that is not a function is no model function either.
// expected-error @below {{no model function @main}}
module {
  ml_program.global private mutable @main(dense<0.0> : tensor<4xf32>) : tensor<4xf32>
}

// -----

// A layer without #nn.cost: --nn-annotate-costs did not run.
module {
  func.func @main(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    %0 = nn.relu %x {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    // expected-error @+1 {{has no #nn.cost; run --nn-annotate-costs before --pipe-plan}}
    %1 = nn.tanh %0 : tensor<4x5xf32>
    return %1 : tensor<4x5xf32>
  }
}

// -----

// Nothing to place: @main holds only constants (not layers).
module {
  // expected-error @+1 {{the model has no layers to place on stages}}
  func.func @main(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    %c = nn.constant dense<1.0> : tensor<4x5xf32>
    return %x : tensor<4x5xf32>
  }
}

// -----

// The planner refuses the profile built from the costs: a negative time.
// expected-error @below {{cannot plan 2 stages: pipedream: op 1 ('tanh_1') has a negative or non-finite forward time}}
module {
  func.func @main(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    %0 = nn.relu %x {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    %1 = nn.tanh %0 {nn.cost = #nn.cost<fwd = -1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    return %1 : tensor<4x5xf32>
  }
}

// -----

// One layer on two devices: PipeDream replicates it, which the compiler
// cannot lower yet.
// expected-error @below {{the pipedream plan replicates stages or interleaves chunks, which the compiler cannot lower yet; plan it with `pipec plan` or use --pipe-plan=algorithm=balanced}}
module {
  func.func @main(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
    %0 = nn.relu %x {nn.cost = #nn.cost<fwd = 1.0e-3, bwd = 1.0e-3, out_bytes = 80, param_bytes = 0, saved_bytes = 80>} : tensor<4x5xf32>
    return %0 : tensor<4x5xf32>
  }
}

// -----

// @main is only a declaration (getModelFunc).
module {
  // expected-error @+1 {{the model function @main has no body}}
  func.func private @main(tensor<4x5xf32>) -> tensor<4x5xf32>
}
