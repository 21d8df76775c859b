// Every error of --pipe-verify-schedule (passes/VerifySchedule.cpp).
//
// The pass first re-runs the pipe.pipeline verifier (mlir::verify) and
// pipe::expandRun. Both already ran when the input was parsed (the
// pipeline's region verifier expands every program with the same
// microbatches, reach and schedule kind), so their diagnostics (see
// test/Dialect/pipe/invalid.mlir) reach the pass only when verification on
// parsing is turned off: the second RUN line shows the pass catching an
// unverified pipeline then.
//
// Not reachable from IR:
//   - the diagnostics of pipe::expandRun called by the pass ("microbatch
//     index is not a static function ...", "loop step must be positive",
//     "is not allowed in a pipe.program", "microbatch N is out of range",
//     "in a continuous schedule every op needs a microbatch"): the same
//     expansion is done by the pipeline verifier, which the pass runs just
//     before (mlir::verify), even with verification on parsing off.
//
// RUN: pipec-opt %s -split-input-file -verify-diagnostics --pipe-verify-schedule
// RUN: pipec-opt %S/Inputs/verify-schedule-errors-unverified.mlir -verify-diagnostics --mlir-very-unsafe-disable-verifier-on-parsing --pipe-verify-schedule

// Nothing to verify: the schedule was not built.
// expected-error @+1 {{no pipe.pipeline; run --pipe-build-schedule first}}
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
    return %x : tensor<2xf32>
  }
}

// -----

// The pipeline verifier accepts any schedule name; the pass needs a known one.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
    return %x : tensor<2xf32>
  }
  // expected-error @+1 {{unknown schedule 'zigzag'}}
  pipe.pipeline microbatches 1 schedule "zigzag" {
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      pipe.forward @f mb %c0
      pipe.backward @f mb %c0
      pipe.step @f
    }
  }
}

// -----

// GPipe stashes both microbatches, but the program has one slot.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
    return %x : tensor<2xf32>
  }
  pipe.pipeline microbatches 2 schedule "gpipe" {
    // expected-error @+1 {{stashes up to 2 microbatches but has 1 slots}}
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      pipe.forward @f mb %c0
      pipe.forward @f mb %c1
      pipe.backward @f mb %c0
      pipe.backward @f mb %c1
      pipe.flush
      pipe.step @f
    }
  }
}

// -----

// Labelled GPipe, but each backward follows its forward at once: the program
// stashes 1 microbatch where GPipe's closed form says m = 2.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
    return %x : tensor<2xf32>
  }
  pipe.pipeline microbatches 2 schedule "gpipe" {
    // expected-error @+1 {{peak stashed microbatches 1 differ from the closed form 2 of schedule 'gpipe'}}
    pipe.program "rank0" stage 0 slots 2 {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      pipe.forward @f mb %c0
      pipe.backward @f mb %c0
      pipe.forward @f mb %c1
      pipe.backward @f mb %c1
      pipe.flush
      pipe.step @f
    }
  }
}

// -----

// 1F1B-flush, p = 2, m = 3: stage 0 runs its microbatches one at a time
// (peak 1) where warm-up policy A stashes min(p - s, m) = 2 and policy B
// min(2(p - s) - 1, m) = 3; the message names both closed forms.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
    return %x : tensor<2xf32>
  }
  pipe.pipeline microbatches 3 schedule "1f1b-flush" {
    // expected-error @+1 {{peak stashed microbatches 1 differ from the closed form 2 (policy B: 3) of schedule '1f1b-flush'}}
    pipe.program "rank0" stage 0 slots 2 {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c3 = arith.constant 3 : index
      scf.for %mb = %c0 to %c3 step %c1 {
        pipe.forward @f mb %mb
        pipe.send %mb to 1 channel 0 from @f[0] : tensor<2xf32>
        pipe.recv %mb from 1 channel 1 into @f[0] : tensor<2xf32>
        pipe.backward @f mb %mb
      }
      pipe.flush
      pipe.step @f
    }
    pipe.program "rank1" stage 1 slots 1 {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c3 = arith.constant 3 : index
      scf.for %mb = %c0 to %c3 step %c1 {
        pipe.recv %mb from 0 channel 0 into @f[0] : tensor<2xf32>
        pipe.forward @f mb %mb
        pipe.backward @f mb %mb
        pipe.send %mb to 0 channel 1 from @f[0] : tensor<2xf32>
      }
      pipe.flush
      pipe.step @f
    }
  }
}
