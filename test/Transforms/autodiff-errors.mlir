// RUN: pipec-opt %s -split-input-file -verify-diagnostics --nn-autodiff
// RUN: pipec-opt %S/Inputs/autodiff-errors-loss-model.mlir -split-input-file -verify-diagnostics --nn-autodiff=loss=model
// RUN: pipec-opt %S/Inputs/autodiff-errors-loss-unknown.mlir -verify-diagnostics --nn-autodiff=loss=hinge
// RUN: pipec-opt %S/Inputs/autodiff-errors-optimizer-unknown.mlir -verify-diagnostics --nn-autodiff=optimizer=lion

// Every error --nn-autodiff (passes/Autodiff.cpp) reports, with the VJP
// refusals of the nn ops it calls (dialects/nn/NN*Autodiff.cpp). The cases
// that need other options are in Inputs/autodiff-errors-*.mlir:
//   loss=model:      "loss=model needs a scalar model output 0, got ..."
//   loss=hinge:      "unknown loss 'hinge' (cross-entropy or model)"
//   optimizer=lion:  "unknown optimizer 'lion' (sgd, momentum, ...)"
//
// Not reachable from IR:
//   the bare failure() after last.insertArgument(...) in addLoss (it emits
//     nothing): func.func's insertArgument only fails when the new signature
//     cannot be built, which never happens for a FunctionType.

// No @s0_fwd: the module was not split into stages.
// expected-error @+1 {{no stage functions @s0_fwd...; run --pipe-split-stages first}}
module {
  func.func @main(%x: tensor<4x3xf32>) -> tensor<4x3xf32> {
    %0 = nn.relu %x : tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}

// -----

// @s0_bwd already exists: the pass ran before.
// expected-error @+1 {{the module is already differentiated}}
module {
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    %0 = nn.relu %x : tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
  func.func @s0_bwd(%dy: tensor<f32> {pipe.loss_seed}) attributes {pipe.stage = 0 : i64} {
    return
  }
}

// -----

// The only stage returns model output 1 but not model output 0.
module {
  // expected-error @+1 {{the last stage does not compute model output 0}}
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}) -> (tensor<4x3xf32> {pipe.output = 1 : i64}) attributes {pipe.stage = 0 : i64} {
    %0 = nn.relu %x : tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}

// -----

// Model output 0 is computed by stage 0, not by the last stage.
module {
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}, tensor<4x3xf32>) attributes {pipe.stage = 0 : i64} {
    %0 = nn.relu %x : tensor<4x3xf32>
    return %0, %0 : tensor<4x3xf32>, tensor<4x3xf32>
  }
  // expected-error @+1 {{the last stage does not compute model output 0}}
  func.func @s1_fwd(%a: tensor<4x3xf32> {pipe.from = array<i64: 0, 1>}) -> (tensor<4x3xf32> {pipe.output = 1 : i64}) attributes {pipe.stage = 1 : i64} {
    %0 = nn.tanh %a : tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}

// -----

// Cross-entropy on a rank-1 model output (no class dimension).
module {
  // expected-error @+1 {{cross-entropy needs scores [N, C, ...]; model output 0 is 'tensor<4xf32>'}}
  func.func @s0_fwd(%x: tensor<4xf32> {pipe.feed = 0 : i64}) -> (tensor<4xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    %0 = nn.relu %x : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}

// -----

// Model output 0 has 6 rows, not a multiple of the 4-sample microbatch.
module attributes {pipec.microbatch = 4 : i64} {
  // expected-error @+1 {{model output 0 has leading dimension 6, not a multiple of the batch 4: labels cannot be split into microbatches}}
  func.func @s0_fwd(%x: tensor<6x3xf32> {pipe.feed = 0 : i64}) -> (tensor<6x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    %0 = nn.relu %x : tensor<6x3xf32>
    return %0 : tensor<6x3xf32>
  }
}

// -----

// A microbatch of 0 samples (pipec.microbatch = 0) cannot split the labels.
module attributes {pipec.microbatch = 0 : i64} {
  // expected-error @+1 {{model output 0 has leading dimension 4, not a multiple of the batch 0: labels cannot be split into microbatches}}
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    %0 = nn.relu %x : tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}

// -----

// The loss depends on an nn op without DifferentiableOpInterface (a
// backward op used in the forward).
module {
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}, %y: tensor<4x3xf32> {pipe.feed = 1 : i64}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    // expected-error @+1 {{'nn.relu_grad' has no gradient (DifferentiableOpInterface)}}
    %0 = nn.relu_grad %x, %y : tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}

// -----

// The gradient that stage 1 sends back reaches an op of another dialect in
// stage 0 (which trains a weight, so gradients flow back into it).
module {
  ml_program.global private mutable @w(dense<1.0> : tensor<4x3xf32>) : tensor<4x3xf32>
  func.func private @helper(tensor<4x3xf32>) -> tensor<4x3xf32>
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}) -> tensor<4x3xf32> attributes {pipe.stage = 0 : i64} {
    %w = ml_program.global_load @w : tensor<4x3xf32>
    %a = nn.mul %x, %w : tensor<4x3xf32>, tensor<4x3xf32> -> tensor<4x3xf32>
    // expected-error @+1 {{'func.call' has no gradient (DifferentiableOpInterface)}}
    %0 = func.call @helper(%a) : (tensor<4x3xf32>) -> tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
  func.func @s1_fwd(%a: tensor<4x3xf32> {pipe.from = array<i64: 0, 0>}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 1 : i64} {
    %0 = nn.relu %a : tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}

// -----

// The loss depends on the new running mean of a training-mode BatchNorm.
module {
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}, %scale: tensor<3xf32> {pipe.feed = 1 : i64}, %bias: tensor<3xf32> {pipe.feed = 2 : i64}, %mean: tensor<3xf32> {pipe.feed = 3 : i64}, %var: tensor<3xf32> {pipe.feed = 4 : i64}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    // expected-error @+1 {{'nn.batch_norm' op a gradient flows into the statistics outputs of a training-mode BatchNormalization (its saved or running mean/variance), which pipec does not differentiate}}
    %y, %sm, %si, %rm, %rv = nn.batch_norm %x, %scale, %bias, %mean, %var {epsilon = 1.0e-5 : f32, momentum = 0.9 : f32} : tensor<4x3xf32>, tensor<3xf32>
    %0 = nn.add %y, %rm : tensor<4x3xf32>, tensor<3xf32> -> tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}

// -----

// The loss depends on the Mean output of a LayerNormalization.
module {
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}, %scale: tensor<3xf32> {pipe.feed = 1 : i64}, %bias: tensor<3xf32> {pipe.feed = 2 : i64}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    // expected-error @+1 {{'nn.layer_norm' op a gradient flows into the Mean or InvStdDev output of a LayerNormalization, which pipec does not differentiate}}
    %y, %m, %s = nn.layer_norm %x, %scale, %bias {axis = 1 : i64, epsilon = 1.0e-5 : f32} : (tensor<4x3xf32>, tensor<3xf32>, tensor<3xf32>) -> (tensor<4x3xf32>, tensor<4xf32>, tensor<4xf32>)
    %m2 = nn.reshape %m : tensor<4xf32> -> tensor<4x1xf32>
    %0 = nn.add %y, %m2 : tensor<4x3xf32>, tensor<4x1xf32> -> tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}

// -----

// The appended cross-entropy loss reads the log_prob result of the model's
// own SoftmaxCrossEntropyLoss.
module {
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}, %labels: tensor<4xi64> {pipe.feed = 1 : i64}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    // expected-error @+1 {{'nn.softmax_cross_entropy_loss' op gradient through the log_prob result is not supported; use the loss output}}
    %l, %lp = nn.softmax_cross_entropy_loss %x, %labels : (tensor<4x3xf32>, tensor<4xi64>) -> (tensor<f32>, tensor<4x3xf32>)
    return %lp : tensor<4x3xf32>
  }
}

// -----

// Model output 0 of unknown shape: no loss can be built on it.
module {
  // expected-error @+1 {{model output 0 must be a float tensor of static shape to take a loss, got 'tensor<?x3xf32>'}}
  func.func @s0_fwd(%x: tensor<?x3xf32> {pipe.feed = 0 : i64}) -> (tensor<?x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    %0 = nn.relu %x : tensor<?x3xf32>
    return %0 : tensor<?x3xf32>
  }
}

// -----

// Model output 0 of integers.
module {
  // expected-error @+1 {{model output 0 must be a float tensor of static shape to take a loss, got 'tensor<4x3xi64>'}}
  func.func @s0_fwd(%x: tensor<4x3xi64> {pipe.feed = 0 : i64}) -> (tensor<4x3xi64> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    return %x : tensor<4x3xi64>
  }
}

// -----

// Model output 0 is not a tensor.
module {
  // expected-error @+1 {{model output 0 must be a float tensor of static shape to take a loss, got 'f32'}}
  func.func @s0_fwd(%x: f32 {pipe.feed = 0 : i64}) -> (f32 {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    return %x : f32
  }
}

// -----

// A stage function that is only a declaration.
module {
  // expected-error @+1 {{stage function @s0_fwd has no body}}
  func.func private @s0_fwd(tensor<4x3xf32>) -> tensor<4x3xf32> attributes {pipe.stage = 0 : i64}
}

// -----

// Stage functions @s0_fwd and @s2_fwd: stage 1 is missing.
module {
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    return %x : tensor<4x3xf32>
  }
  // expected-error @+1 {{stage functions are numbered with a gap: @s1_fwd is missing}}
  func.func @s2_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}) -> tensor<4x3xf32> attributes {pipe.stage = 2 : i64} {
    return %x : tensor<4x3xf32>
  }
}
