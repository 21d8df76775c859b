// RUN: pipec-opt %S/Inputs/scheduled_1f1b_flush.mlir --pipe-verify-schedule=report=true --pipe-plan-memory=report=true -o %t 2>&1 | FileCheck %s
// RUN: FileCheck %s --check-prefix=ATTR < %t
// RUN: pipec-opt %S/Inputs/scheduled_1f1b.mlir --pipe-verify-schedule=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=PD
// RUN: not pipec-opt %s --pipe-verify-schedule 2>&1 | FileCheck %s --check-prefix=SLOTS

// 1F1B-flush, p = 2, m = 4: min(p - s, m) stashed microbatches.
// CHECK: remark: rank0 (stage 0): peak stashed microbatches 2 = closed form, slots 2
// CHECK: remark: rank1 (stage 1): peak stashed microbatches 1 = closed form, slots 1
// CHECK: remark: rank0 (stage 0): arena [[A0:[0-9]+]] bytes = weights {{[0-9]+}} + 2 slots x {{[0-9]+}} + io {{[0-9]+}} + scratch {{[0-9]+}}
// CHECK: remark: rank1 (stage 1): arena {{[0-9]+}} bytes
// ATTR: pipe.program "rank0" stage 0 slots 2 attributes {pipe.arena_bytes = [[A:[0-9]+]] : i64, pipe.slot_bytes = {{[0-9]+}} : i64}

// PipeDream: p - s stashed microbatches across steps, p - s weight versions.
// PD: remark: rank0 (stage 0): peak stashed microbatches 2 = closed form, slots 2, weight versions <= 2
// PD: remark: rank1 (stage 1): peak stashed microbatches 1 = closed form, slots 1, weight versions <= 1

// GPipe stashes both microbatches, but this program has one slot.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> { return %x : tensor<2xf32> }
  pipe.pipeline microbatches 2 schedule "gpipe" {
    // SLOTS: error: stashes up to 2 microbatches but has 1 slots
    pipe.program "rank0" stage 0 slots 1 {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      pipe.forward @f mb %c0
      pipe.forward @f mb %c1
      pipe.backward @f mb %c0
      pipe.backward @f mb %c1
      pipe.step @f
    }
  }
}
