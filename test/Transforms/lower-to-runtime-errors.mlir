// Every error of --pipe-lower-to-runtime (passes/LowerToRuntime.cpp and
// passes/KernelCalls.cpp's getKernelCalls), with the default options
// stage=0 replica=0.
//
// Not reachable from IR:
//   - "no runtime kernel implements '...'" (getKernelCalls): every nn op has
//     a kernel except nn.constant, which planFunction turns into a constant
//     global before asking for kernels; non-nn ops are refused first
//     ("cannot lower '...' inside a stage function").
//   - "a continuous schedule's ops need a microbatch": the pipe.pipeline
//     verifier refuses pipe.step / pipe.allreduce without `after %mb` in a
//     continuous schedule, and pipe.tie_reduce (no microbatch) makes the
//     rule "tied" refuse a continuous schedule; pipe.flush is exempt.
//   - "internal error: a pipe.tie_reduce group the pipeline does not list":
//     the groups are collected from the pipeline's own pipe.tie_reduce ops.
//   - "cannot lower this op": every pipe op a verified pipe.program can hold
//     is lowered (a nested pipe.pipeline / pipe.program is refused by the
//     verifiers).
//
// RUN: pipec-opt %s -split-input-file -verify-diagnostics --pipe-lower-to-runtime

// Nothing to lower: the schedule was not built.
// expected-error @+1 {{no pipe.pipeline; run --pipe-build-schedule first}}
module {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
}

// -----

// The pipeline's only program is stage 1's; the pass lowers stage 0.
// expected-error @+1 {{the pipeline has no program for stage 0 replica 0}}
module {
  func.func @s1_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 1 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s1_bwd(%g: tensor<2xf32>) attributes {pipe.stage = 1 : i64} {
    return
  }
  func.func @s1_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 1 : i64} {
    return
  }
  pipe.pipeline microbatches 1 schedule "gpipe" {
    pipe.program "rank0" stage 1 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @s1_fwd mb %c0
      pipe.backward @s1_bwd mb %c0
      pipe.flush
      pipe.step @s1_step
    }
  }
}

// -----

// The forward runs @f, which has no pipe.stage.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
    return %x : tensor<2xf32>
  }
  pipe.pipeline microbatches 1 schedule "gpipe" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      // expected-error @+1 {{'pipe.forward' op calls a function that is not a stage function}}
      pipe.forward @f mb %c0
      pipe.backward @f mb %c0
      pipe.flush
      pipe.step @f
    }
  }
}

// -----

// Stage 0 has a forward but no @s0_bwd / @s0_step (the program names the
// forward for all three).
// expected-error @+1 {{stage 0 lacks its fwd/bwd/step functions}}
module {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  pipe.pipeline microbatches 1 schedule "gpipe" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @s0_fwd mb %c0
      pipe.backward @s0_fwd mb %c0
      pipe.flush
      pipe.step @s0_fwd
    }
  }
}

// -----

// The weight half of the backward (zero bubble) takes an argument that is
// neither a forward stash value (pipe.fwd_arg / pipe.fwd_result) nor a value
// carried from @s0_bwd (pipe.carried).
module {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s0_bwd(%g: tensor<2xf32>) attributes {pipe.stage = 0 : i64} {
    return
  }
  // expected-error @+1 {{argument 0 of s0_bwdw is neither stashed nor carried}}
  func.func @s0_bwdw(%a: tensor<2xf32>) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
  pipe.pipeline microbatches 1 schedule "zb-h1" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @s0_fwd mb %c0
      pipe.backward @s0_bwd mb %c0
      pipe.backward_weight @s0_bwdw mb %c0
      pipe.flush
      pipe.step @s0_step
    }
  }
}

// -----

// A stage function may hold nn ops, ml_program globals and its return only.
module {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    // expected-error @+1 {{cannot lower 'arith.constant' inside a stage function}}
    %c = arith.constant 1 : index
    %y = nn.relu %x : tensor<2xf32>
    return %y : tensor<2xf32>
  }
  func.func @s0_bwd(%g: tensor<2xf32>) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
  pipe.pipeline microbatches 1 schedule "gpipe" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @s0_fwd mb %c0
      pipe.backward @s0_bwd mb %c0
      pipe.flush
      pipe.step @s0_step
    }
  }
}

// -----

// A continuous schedule (1f1b) whose rank runs two stages, as only the
// interleaved schedule may.
module {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s0_bwd(%g: tensor<2xf32>) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s1_fwd(%x: tensor<2xf32>) -> tensor<2xf32> attributes {pipe.stage = 1 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s1_bwd(%g: tensor<2xf32>) attributes {pipe.stage = 1 : i64} {
    return
  }
  func.func @s1_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 1 : i64} {
    return
  }
  pipe.pipeline microbatches 1 schedule "1f1b" {
    // expected-error @+1 {{'pipe.program' op a continuous schedule runs one stage per rank}}
    pipe.program "rank0" stage 0 slots 2 {
      %c0 = arith.constant 0 : index
      pipe.forward @s0_fwd mb %c0
      pipe.forward @s1_fwd mb %c0
      pipe.backward @s1_bwd mb %c0
      pipe.backward @s0_bwd mb %c0
      pipe.step @s0_step after %c0
    }
  }
}

// -----

// The update names @helper, a function of no stage this rank runs.
module {
  func.func @helper() {
    return
  }
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s0_bwd(%g: tensor<2xf32>) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
  pipe.pipeline microbatches 1 schedule "gpipe" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @s0_fwd mb %c0
      pipe.backward @s0_bwd mb %c0
      pipe.flush
      // expected-error @+1 {{references a function of no stage of this rank}}
      pipe.step @helper
    }
  }
}

// -----

// pipe.backward_weight runs the stage's weight half, @s0_bwdw; naming the
// whole backward instead is refused (the op kind decides what runs).
module {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s0_bwd(%g: tensor<2xf32>) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
  pipe.pipeline microbatches 1 schedule "zb-h1" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @s0_fwd mb %c0
      pipe.backward @s0_bwd mb %c0
      // expected-error @+1 {{names @s0_bwd, but this op runs the stage's @s0_bwdw}}
      pipe.backward_weight @s0_bwd mb %c0
      pipe.flush
      pipe.step @s0_step
    }
  }
}

// -----

// A stage function that is only a declaration.
module {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s0_bwd(%g: tensor<2xf32>) attributes {pipe.stage = 0 : i64} {
    return
  }
  // expected-error @+1 {{stage function @s0_step has no body}}
  func.func private @s0_step(tensor<f32>) attributes {pipe.stage = 0 : i64}
  pipe.pipeline microbatches 1 schedule "gpipe" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @s0_fwd mb %c0
      pipe.backward @s0_bwd mb %c0
      pipe.flush
      pipe.step @s0_step
    }
  }
}

// -----

// A backward argument naming a stashed forward value the forward lacks.
module {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  // expected-error @+1 {{argument 0 of s0_bwd names pipe.fwd_arg 5, but s0_fwd has 1}}
  func.func @s0_bwd(%x: tensor<2xf32> {pipe.fwd_arg = 5 : i64}) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
  pipe.pipeline microbatches 1 schedule "gpipe" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @s0_fwd mb %c0
      pipe.backward @s0_bwd mb %c0
      pipe.flush
      pipe.step @s0_step
    }
  }
}
