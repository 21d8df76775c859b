// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=1f1b microbatches=4" | FileCheck %s
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=2bw microbatches=4" | FileCheck %s --check-prefix=TWOBW
// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=interleaved microbatches=4 chunks=2 replicas=2" 2>&1 | FileCheck %s --check-prefix=LATER

// PipeDream 1F1B, p = 2, m = 4: one window of a pipeline that never
// flushes. Pair j is {F(j), B(j - w)} with w = p - s - 1 warm-up forwards,
// each backward followed by its update; stage 0 keeps w + 1 = 2 slots.
// CHECK: pipe.pipeline microbatches 4 schedule "1f1b" {
// CHECK: pipe.program "rank0" stage 0 slots 2 {
// CHECK:   scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step
// CHECK:     pipe.forward @s0_fwd mb %[[I]]
// CHECK:     pipe.send %[[I]] to 1 channel 0 from @s0_fwd[0]
// CHECK:     %[[B:.*]] = arith.addi %[[I]], %{{.*}} : index
// CHECK:     pipe.recv %[[B]] from 1 channel 1 into @s0_bwd[0]
// CHECK:     pipe.backward @s0_bwd mb %[[B]]
// CHECK:     pipe.step @s0_step after %[[B]]
// CHECK-NOT: pipe.flush
// CHECK: pipe.program "rank1" stage 1 slots 1 {
// CHECK:   scf.for %[[J:.*]] = %{{.*}} to %{{.*}} step
// CHECK:     pipe.forward @s1_fwd mb %[[J]]
// CHECK:     pipe.backward @s1_bwd mb %[[J]]
// CHECK:     pipe.step @s1_step after %[[J]]

// 2BW: the update follows the backward of each batch's last microbatch:
// index -1 of the window on stage 0 (pair w - 1 = 0), index m - 1 = 3 on
// the last stage.
// TWOBW: pipe.program "rank0" stage 0 slots 2 {
// TWOBW:   %[[C0:.*]] = arith.constant 0 : index
// TWOBW:   pipe.forward @s0_fwd mb %[[C0]]
// TWOBW:   %[[M1:.*]] = arith.constant -1 : index
// TWOBW:   pipe.backward @s0_bwd mb %[[M1]]
// TWOBW:   pipe.step @s0_step after %[[M1]]
// TWOBW:   scf.for
// TWOBW-NOT: pipe.step
// TWOBW: pipe.program "rank1" stage 1 slots 1 {
// TWOBW:   scf.for
// TWOBW-NOT: pipe.step
// TWOBW:     pipe.backward @s1_bwd mb %arg0
// TWOBW-NEXT: pipe.send
// TWOBW-NEXT: }
// TWOBW:   pipe.backward @s1_bwd mb %[[B:.*]]
// TWOBW-NEXT: pipe.send
// TWOBW-NEXT: pipe.step @s1_step after %[[B]]

// Replicas with the interleaved schedule: split replicas only.
// LATER: replicated stages combine with the interleaved schedule in the split replica mode only
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=interleaved microbatches=4 chunks=2 replicas=2 split-samples=4" --pipe-verify-schedule | FileCheck %s --check-prefix=ILSPLIT
// ILSPLIT: replicas = [2, 2]
// ILSPLIT: pipe.pipeline microbatches 4 schedule "interleaved" split_samples 4 {
// ILSPLIT: pipe.program "rank0" stage 0 slots
// ILSPLIT: pipe.forward @s1_fwd
// ILSPLIT: pipe.allreduce
// ILSPLIT: pipe.program "rank1" stage 0 replica 1 slots

// PipeDream 1F1B-RR: stage 0 with 2 replicas, stage 1 with 1 (the "2-1" of
// PipeDream's Figure 8). K_0 = ceil(3 / 2) = 2: replica j runs microbatches
// j, j + 2 and its backwards trail by (K_0 - 1) r = 2; after every backward
// the replicas average their gradients (pipe.allreduce {mean}) and update
// together. Stage 1 alternates F and B of every microbatch.
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=1f1b microbatches=4 replicas=2,1" --pipe-verify-schedule=report=true 2>&1 | FileCheck %s --check-prefix=RR
// RR: rank0 (stage 0, replica 0): peak stashed microbatches 2 = closed form, slots 2, weight versions <= 2
// RR: rank1 (stage 0, replica 1): peak stashed microbatches 2 = closed form, slots 2, weight versions <= 2
// RR: rank2 (stage 1): peak stashed microbatches 1 = closed form, slots 1, weight versions <= 1
// RR: pipe.program "rank0" stage 0 slots 2
// RR:   scf.for %[[I:.*]] = %{{.*}} to %[[TWO:.*]] step
// RR:     %[[MB:.*]] = arith.muli %[[I]], %{{.*}} : index
// RR:     pipe.forward @s0_fwd mb %[[MB]]
// RR:     %[[B:.*]] = arith.addi %[[MB]], %{{.*}} : index
// RR:     pipe.backward @s0_bwd mb %[[B]]
// RR:     pipe.allreduce after %[[B]] {mean}
// RR:     pipe.step @s0_step after %[[B]]
// RR: pipe.program "rank1" stage 0 replica 1 slots 2
// RR:     pipe.forward @s0_fwd mb
// RR:     pipe.allreduce after %{{.*}} {mean}
// RR: pipe.program "rank2" stage 1 slots 1
// RR-NOT: pipe.allreduce
// RR:     pipe.step @s1_step after

// 2BW with replicas sums the batch's gradients (no {mean}) before its one
// update per batch.
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=2bw microbatches=4 replicas=2,1" | FileCheck %s --check-prefix=TWOBWRR
// TWOBWRR: pipe.program "rank0" stage 0 slots 2
// TWOBWRR: pipe.allreduce after %{{[^ ]*}}{{$}}
// TWOBWRR-NEXT: pipe.step @s0_step after

// A round of replicas must divide the microbatches of a step.
// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=1f1b microbatches=3 replicas=2,1" 2>&1 | FileCheck %s --check-prefix=ROUND
// ROUND: error: schedule '1f1b' with replicas needs the microbatches per step (3) to be a multiple of every stage's replica count; stage 0 has 2
