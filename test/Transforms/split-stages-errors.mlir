// Every error --pipe-split-stages (passes/SplitStages.cpp) reports, with
// -verify-diagnostics, and PassUtils' "no model function @main". The pass
// has no options: each case below is decided by the IR.
//
// RUN: pipec-opt %s -split-input-file -verify-diagnostics --pipe-split-stages

// The module has no pipe.plan: --pipe-plan did not run.
// expected-error @below {{no pipe.plan on the module; run --pipe-plan first}}
module {
  func.func @main(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
    %0 = nn.relu %x {pipe.stage = 0 : i64} : tensor<2x4xf32>
    return %0 : tensor<2x4xf32>
  }
}

// -----

// A plan but no function @main (getModelFunc, passes/PassUtils.cpp).
// expected-error @below {{no model function @main: import an ONNX model first (pipec-translate --import-onnx)}}
module attributes {pipe.plan = #pipe.plan<algorithm = "manual", first = [0], last = [0], replicas = [1], predicted_iteration_s = 0.0>} {
  func.func @model(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
    %0 = nn.relu %x {pipe.stage = 0 : i64} : tensor<2x4xf32>
    return %0 : tensor<2x4xf32>
  }
}

// -----

// A layer without pipe.stage.
module attributes {pipe.plan = #pipe.plan<algorithm = "manual", first = [0], last = [0], replicas = [1], predicted_iteration_s = 0.0>} {
  func.func @main(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
    // expected-error @+1 {{layer has no valid pipe.stage (plan has 1 stages)}}
    %0 = nn.relu %x : tensor<2x4xf32>
    return %0 : tensor<2x4xf32>
  }
}

// -----

// A layer on stage 2 of a 2-stage plan.
module attributes {pipe.plan = #pipe.plan<algorithm = "manual", first = [0, 1], last = [0, 1], replicas = [1, 1], predicted_iteration_s = 0.0>} {
  func.func @main(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
    %0 = nn.relu %x {pipe.stage = 0 : i64} : tensor<2x4xf32>
    // expected-error @+1 {{layer has no valid pipe.stage (plan has 2 stages)}}
    %1 = nn.tanh %0 {pipe.stage = 2 : i64} : tensor<2x4xf32>
    return %1 : tensor<2x4xf32>
  }
}

// -----

// Stage 0 reads the result of a stage-1 layer: stages against the data flow.
module attributes {pipe.plan = #pipe.plan<algorithm = "manual", first = [0, 1], last = [0, 1], replicas = [1, 1], predicted_iteration_s = 0.0>} {
  func.func @main(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
    %0 = nn.relu %x {pipe.stage = 1 : i64} : tensor<2x4xf32>
    // expected-error @+1 {{uses a value of a later stage (1 > 0): stages must follow the data flow}}
    %1 = nn.tanh %0 {pipe.stage = 0 : i64} : tensor<2x4xf32>
    return %1 : tensor<2x4xf32>
  }
}

// -----

// A state update (global_store) of a value no layer computes, here a model
// input: no stage would store it.
module attributes {pipe.plan = #pipe.plan<algorithm = "manual", first = [0], last = [0], replicas = [1], predicted_iteration_s = 0.0>} {
  ml_program.global private mutable @state(dense<0.0> : tensor<2x4xf32>) : tensor<2x4xf32>
  func.func @main(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
    %0 = nn.relu %x {pipe.stage = 0 : i64} : tensor<2x4xf32>
    // expected-error @+1 {{stores a value no layer computes}}
    ml_program.global_store @state = %x : tensor<2x4xf32>
    return %0 : tensor<2x4xf32>
  }
}

// -----

// A model output that is a model input: no stage computes it.
module attributes {pipe.plan = #pipe.plan<algorithm = "manual", first = [0], last = [0], replicas = [1], predicted_iteration_s = 0.0>} {
  // expected-error @+1 {{model output 1 is not computed by a layer (an input or a constant)}}
  func.func @main(%x: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
    %0 = nn.relu %x {pipe.stage = 0 : i64} : tensor<2x4xf32>
    return %0, %x : tensor<2x4xf32>, tensor<2x4xf32>
  }
}

// -----

// A model output that is a constant.
module attributes {pipe.plan = #pipe.plan<algorithm = "manual", first = [0], last = [0], replicas = [1], predicted_iteration_s = 0.0>} {
  // expected-error @+1 {{model output 0 is not computed by a layer (an input or a constant)}}
  func.func @main(%x: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
    %c = nn.constant dense<1.0> : tensor<2x4xf32>
    %0 = nn.relu %x {pipe.stage = 0 : i64} : tensor<2x4xf32>
    return %c, %0 : tensor<2x4xf32>, tensor<2x4xf32>
  }
}

// -----

// Stage 1 of 3 holds no layer, so it receives nothing (the error is on the
// new @s1_fwd, which has the location of @main).
module attributes {pipe.plan = #pipe.plan<algorithm = "manual", first = [0, 1, 2], last = [0, 1, 2], replicas = [1, 1, 1], predicted_iteration_s = 0.0>} {
  // expected-error @+1 {{stage 1 receives nothing}}
  func.func @main(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
    %0 = nn.relu %x {pipe.stage = 0 : i64} : tensor<2x4xf32>
    %1 = nn.tanh %0 {pipe.stage = 2 : i64} : tensor<2x4xf32>
    return %1 : tensor<2x4xf32>
  }
}

// -----

// Stage 1's only layer reads a weight and nothing from stage 0 or the
// model inputs: it receives nothing either (weights are cloned, not sent).
module attributes {pipe.plan = #pipe.plan<algorithm = "manual", first = [0, 1], last = [0, 1], replicas = [1, 1], predicted_iteration_s = 0.0>} {
  ml_program.global private mutable @w(dense<0.5> : tensor<2x4xf32>) : tensor<2x4xf32>
  // expected-error @+1 {{stage 1 receives nothing}}
  func.func @main(%x: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
    %0 = nn.relu %x {pipe.stage = 0 : i64} : tensor<2x4xf32>
    %w = ml_program.global_load @w : tensor<2x4xf32>
    %1 = nn.tanh %w {pipe.stage = 1 : i64} : tensor<2x4xf32>
    return %0, %1 : tensor<2x4xf32>, tensor<2x4xf32>
  }
}

// -----

// @main is only a declaration.
module attributes {pipe.plan = #pipe.plan<algorithm = "manual", first = [0], last = [0], replicas = [1], predicted_iteration_s = 0.0>} {
  // expected-error @+1 {{the model function @main has no body}}
  func.func private @main(tensor<2x4xf32>) -> tensor<2x4xf32>
}

// -----

// @main with two blocks: the importer writes one.
module attributes {pipe.plan = #pipe.plan<algorithm = "manual", first = [0], last = [0], replicas = [1], predicted_iteration_s = 0.0>} {
  // expected-error @+1 {{the model function @main has 2 blocks; pipec takes one block of nn ops (as the importer writes)}}
  func.func @main(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
    %0 = nn.relu %x {pipe.stage = 0 : i64} : tensor<2x4xf32>
    cf.br ^bb1
  ^bb1:
    return %0 : tensor<2x4xf32>
  }
}

// -----

// An op of another dialect that reads values cannot be copied into stages.
module attributes {pipe.plan = #pipe.plan<algorithm = "manual", first = [0], last = [0], replicas = [1], predicted_iteration_s = 0.0>} {
  func.func @main(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
    // expected-error @+1 {{'arith.addf' is not an nn layer but reads values; the stages take nn ops, constants and weight loads}}
    %a = arith.addf %x, %x : tensor<2x4xf32>
    %0 = nn.relu %a {pipe.stage = 0 : i64} : tensor<2x4xf32>
    return %0 : tensor<2x4xf32>
  }
}

// -----

// One value returned as two model outputs.
module attributes {pipe.plan = #pipe.plan<algorithm = "manual", first = [0], last = [0], replicas = [1], predicted_iteration_s = 0.0>} {
  // expected-error @+1 {{model output 1 is the value of model output 0; give each output its own value (an Identity)}}
  func.func @main(%x: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
    %0 = nn.relu %x {pipe.stage = 0 : i64} : tensor<2x4xf32>
    return %0, %0 : tensor<2x4xf32>, tensor<2x4xf32>
  }
}
