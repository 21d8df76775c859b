// The custom schedule: the order per rank of a torch.distributed.pipelining
// compute-only CSV (one row per rank, actions <stage><F|B|I|W><microbatch>).
//
// RUN: printf '0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n' > %t.gpipe.csv
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=custom schedule-csv=%t.gpipe.csv microbatches=2" --pipe-verify-schedule=report 2>&1 | FileCheck %s
// CHECK: remark: rank0 (stage 0): peak stashed microbatches 2 (no closed form), slots 2
// CHECK: remark: rank1 (stage 1): peak stashed microbatches 2 (no closed form), slots 2
// CHECK: pipe.pipeline microbatches 2 schedule "custom" {
// CHECK: pipe.program "rank0" stage 0 slots 2 {
// CHECK:   pipe.forward @s0_fwd mb %[[A:.*]]
// CHECK:   pipe.send %[[A]] to 1 channel 0
// CHECK:   pipe.forward @s0_fwd mb %[[B:.*]]
// CHECK:   pipe.recv %[[C:.*]] from 1 channel 1 into @s0_bwd[0]
// CHECK:   pipe.backward @s0_bwd mb %[[C]]
// CHECK:   pipe.backward @s0_bwd
// CHECK:   pipe.flush
// CHECK:   pipe.step @s0_step
// CHECK: pipe.program "rank1" stage 1 slots 2 {

// I and W split every backward as zb-h1 does; rank 1 defers both W ops.
// RUN: printf '0F0,0F1,0I0,0W0,0I1,0W1\n1F0,1I0,1F1,1I1,1W0,1W1\n' > %t.zb.csv
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=custom schedule-csv=%t.zb.csv microbatches=2" --pipe-verify-schedule | FileCheck %s --check-prefix=ZB
// ZB: func.func @s0_bwdw
// ZB: func.func @s1_bwdw
// ZB: pipe.program "rank1" stage 1 slots 2 {
// ZB:   pipe.forward @s1_fwd
// ZB:   pipe.backward @s1_bwd
// ZB:   pipe.forward @s1_fwd
// ZB:   pipe.backward @s1_bwd
// ZB:   pipe.backward_weight @s1_bwdw
// ZB:   pipe.backward_weight @s1_bwdw
// ZB:   pipe.flush

// A file that deadlocks is refused before anything is built, naming the
// ranks and steps (CSV columns from 0) of the cycle.
// RUN: printf '0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n' > %t.dead.csv
// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=custom schedule-csv=%t.dead.csv microbatches=2" 2>&1 | FileCheck %s --check-prefix=DEAD
// DEAD: error: the schedule '{{.*}}dead.csv' cannot run: deadlock: rank 0 waits for rank 1 (channel 1, mb 0, at 'rank 0 step 1 (0B0)') -> rank 1 waits for rank 0 (channel 0, mb 1, at 'rank 1 step 0 (1F1)') -> back to rank 0

// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=custom schedule-csv=%t.gpipe.csv microbatches=4" 2>&1 | FileCheck %s --check-prefix=SHAPE
// SHAPE: error: the schedule '{{.*}}' runs 2 stages (2 ranks x 1 chunks) and 2 microbatches, but the pipeline has 2 stages (2 x 1 chunks) and 4 microbatches

// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=custom microbatches=2" 2>&1 | FileCheck %s --check-prefix=NOFILE
// NOFILE: error: the custom schedule runs the order of a file: give schedule-csv=FILE

// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=custom schedule-csv=%t.gpipe.csv microbatches=2 replicas=2,1" 2>&1 | FileCheck %s --check-prefix=REPL
// REPL: error: a schedule read from a file (the custom schedule) runs one rank per stage

// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=custom schedule-csv=%t.missing.csv microbatches=2" 2>&1 | FileCheck %s --check-prefix=MISSING
// MISSING: error: cannot read the schedule '{{.*}}missing.csv': No such file or directory
