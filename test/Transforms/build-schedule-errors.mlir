// Every error of --pipe-build-schedule (passes/BuildSchedule.cpp, the rules
// of lib/Schedule/Rules.cpp it reports, lib's splitBackward for zb-h1).
// Cases that need no pass option are the split cases of this file; the
// others are small modules under Inputs/build-schedule-errors, one per
// option set (module-level errors: the expected-error is on `module`).
//
// Not reachable from IR:
//   - "cannot build the schedule: ..." (generateSchedule's checkRequest):
//     its own checks (stages >= 1, steps >= 1, steps == 1 for a synchronous
//     schedule, maxInflight >= 0) hold for every request the pass makes
//     (at least @s0_fwd, chunks divides the stages, steps and maxInflight
//     are not pass options), its shape rules (checkScheduleShape) are a
//     subset of checkPipelineRules, refused before, and its 2BW version
//     check runs only for 2bw, which never calls the generator
//     (continuous schedules build their windows directly).
//   - splitBackward's "stage K has no backward function": the pass has
//     already required an @sK_bwd for every @sK_fwd.
//
// RUN: pipec-opt %s -split-input-file -verify-diagnostics --pipe-build-schedule
//
// Unknown option values.
// RUN: pipec-opt %S/Inputs/build-schedule-errors/unknown-schedule.mlir -verify-diagnostics --pipe-build-schedule=schedule=zigzag
// RUN: pipec-opt %S/Inputs/build-schedule-errors/unknown-warmup.mlir -verify-diagnostics --pipe-build-schedule=warmup=C
//
// One input per violation of checkPipelineRules (Rules.cpp), by rule.
// microbatches:
// RUN: pipec-opt %S/Inputs/build-schedule-errors/microbatches.mlir -verify-diagnostics --pipe-build-schedule=microbatches=0
// chunks:
// RUN: pipec-opt %S/Inputs/build-schedule-errors/chunks.mlir -verify-diagnostics --pipe-build-schedule=chunks=0
// RUN: pipec-opt %S/Inputs/build-schedule-errors/chunks-schedule.mlir -verify-diagnostics --pipe-build-schedule="schedule=gpipe microbatches=2 chunks=2"
// chunks-divide:
// RUN: pipec-opt %S/Inputs/build-schedule-errors/chunks-divide.mlir -verify-diagnostics --pipe-build-schedule="schedule=interleaved microbatches=3 chunks=2"
// replica-count:
// RUN: pipec-opt %S/Inputs/build-schedule-errors/replica-count.mlir -verify-diagnostics --pipe-build-schedule="microbatches=2 replicas=1"
// RUN: pipec-opt %S/Inputs/build-schedule-errors/replica-count-zero.mlir -verify-diagnostics --pipe-build-schedule="microbatches=2 replicas=0,1"
// split-samples:
// RUN: pipec-opt %S/Inputs/build-schedule-errors/split-samples-negative.mlir -verify-diagnostics --pipe-build-schedule=split-samples=-1
// RUN: pipec-opt %S/Inputs/build-schedule-errors/split-samples-interleaved.mlir -verify-diagnostics --pipe-build-schedule="schedule=interleaved microbatches=2 chunks=2 replicas=2"
// RUN: pipec-opt %S/Inputs/build-schedule-errors/split-samples-continuous.mlir -verify-diagnostics --pipe-build-schedule="schedule=1f1b microbatches=2 split-samples=4"
// round-robin:
// RUN: pipec-opt %S/Inputs/build-schedule-errors/round-robin.mlir -verify-diagnostics --pipe-build-schedule="schedule=1f1b microbatches=3 replicas=2,1"
// replica-range:
// RUN: pipec-opt %S/Inputs/build-schedule-errors/replica-range.mlir -verify-diagnostics --pipe-build-schedule="schedule=1f1b-flush microbatches=2 replicas=3,1"
// RUN: pipec-opt %S/Inputs/build-schedule-errors/replica-range-split.mlir -verify-diagnostics --pipe-build-schedule="schedule=1f1b-flush microbatches=2 replicas=3,1 split-samples=2"
// interleaved:
// RUN: pipec-opt %S/Inputs/build-schedule-errors/interleaved-replicas.mlir -verify-diagnostics --pipe-build-schedule="schedule=interleaved microbatches=4 replicas=2,1"
// RUN: pipec-opt %S/Inputs/build-schedule-errors/interleaved-depth.mlir -verify-diagnostics --pipe-build-schedule="schedule=interleaved microbatches=3 chunks=2"
// RUN: pipec-opt %S/Inputs/build-schedule-errors/interleaved-depth-replicas.mlir -verify-diagnostics --pipe-build-schedule="schedule=interleaved microbatches=2 replicas=2,2"
// warmup:
// RUN: pipec-opt %S/Inputs/build-schedule-errors/warmup.mlir -verify-diagnostics --pipe-build-schedule="schedule=gpipe microbatches=2 warmup=B"
// tied (the entry with fewer than two stages: split cases below):
// RUN: pipec-opt %S/Inputs/build-schedule-errors/tied-continuous.mlir -verify-diagnostics --pipe-build-schedule="schedule=1f1b microbatches=2"
// RUN: pipec-opt %S/Inputs/build-schedule-errors/tied-interleaved.mlir -verify-diagnostics --pipe-build-schedule="schedule=interleaved microbatches=2 chunks=2"
// 2bw-depth:
// RUN: pipec-opt %S/Inputs/build-schedule-errors/2bw-depth.mlir -verify-diagnostics --pipe-build-schedule="schedule=2bw microbatches=1"
// RUN: pipec-opt %S/Inputs/build-schedule-errors/2bw-depth-replicas.mlir -verify-diagnostics --pipe-build-schedule="schedule=2bw microbatches=2 replicas=1,1,2"
//
// Zero bubble (splitBackward) on a backward that is already split.
// RUN: pipec-opt %S/Inputs/build-schedule-errors/zb-h1-split.mlir -verify-diagnostics --pipe-build-schedule="schedule=zb-h1 microbatches=2"

// No stage functions at all (the model was not split and differentiated).
// expected-error @+1 {{expected @sK_fwd, @sK_bwd and @sK_step for every stage; run --pipe-split-stages and --nn-autodiff first}}
module {
  func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
    return %x : tensor<2xf32>
  }
}

// -----

// Stage 1 has a forward and a backward but no @s1_step.
// expected-error @+1 {{expected @sK_fwd, @sK_bwd and @sK_step for every stage; run --pipe-split-stages and --nn-autodiff first}}
module {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s0_bwd(%g: tensor<2xf32> {pipe.grad_from = array<i64: 1, 0>}) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s1_fwd(%x: tensor<2xf32> {pipe.from = array<i64: 0, 0>}) -> tensor<2xf32> attributes {pipe.stage = 1 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s1_bwd(%g: tensor<2xf32>) -> (tensor<2xf32> {pipe.grad_of_arg = 0 : i64}) attributes {pipe.stage = 1 : i64} {
    return %g : tensor<2xf32>
  }
}

// -----

// The schedule was built already: the module has a pipe.pipeline.
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
  // expected-error @+1 {{the module already has a pipeline schedule}}
  pipe.pipeline microbatches 1 schedule "1f1b-flush" {
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

// Rule "tied": a pipe.tied entry must name at least two stages.
// expected-error @+1 {{pipe.tied entry 'w' needs at least two stages}}
module attributes {pipe.tied = {w = array<i64: 0>}} {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s0_bwd(%g: tensor<2xf32>) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
}

// -----

// Rule "tied": an entry that is not an array of stages names none.
// expected-error @+1 {{pipe.tied entry 'w' needs at least two stages}}
module attributes {pipe.tied = {w = 1 : i64}} {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s0_bwd(%g: tensor<2xf32>) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
}

// -----

// Rule "tied": an entry naming a stage the pipeline does not have.
// expected-error @+1 {{pipe.tied entry 'w' names stage 5 of a pipeline of 1 stages}}
module attributes {pipe.tied = {w = array<i64: 0, 5>}} {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s0_bwd(%g: tensor<2xf32>) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
}

// -----

// A stage function that is only a declaration.
module {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  // expected-error @+1 {{stage function @s0_bwd has no body}}
  func.func private @s0_bwd(tensor<2xf32>) attributes {pipe.stage = 0 : i64}
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
}
