// ZB-V: the two stages of the tiny MLP as the two chunks of one device in a
// V (device r runs stages r and 2p-1-r; here p = 1), backwards split into
// B and W. Messages between the chunks of one rank name the stage, as
// always; the runtime routes them by the placement.
//
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=zb-v chunks=2 microbatches=2" --pipe-verify-schedule=report 2>&1 | FileCheck %s
// CHECK: remark: rank0 (stage 0): peak stashed microbatches 2 = closed form, slots 2, 2 chunks
// CHECK: pipe.pipeline microbatches 2 schedule "zb-v" placement "v" {
// CHECK: pipe.program "rank0" stage 0 slots 2 {
// CHECK:   pipe.forward @s0_fwd mb %[[M0:.*]]
// CHECK:   pipe.send %[[M0]] to 1 channel 0 from @s0_fwd[0]
// CHECK:   pipe.recv %{{.*}} from 0 channel 0 into @s1_fwd[0]
// CHECK:   pipe.forward @s1_fwd
// CHECK:   pipe.backward @s1_bwd
// CHECK:   pipe.backward_weight @s1_bwdw
// CHECK:   pipe.forward @s0_fwd
// CHECK:   pipe.backward @s0_bwd
// CHECK:   pipe.backward_weight @s0_bwdw
// CHECK:   pipe.flush
// CHECK:   pipe.step @s0_step
// CHECK:   pipe.step @s1_step

// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=zb-v microbatches=2" 2>&1 | FileCheck %s --check-prefix=CHUNKS
// CHUNKS: error: zb-v places exactly two chunks per device in a V (chunks 2: device r runs stages r and 2p-1-r); got v = 1
// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=zb-v chunks=2 microbatches=2 replicas=2" 2>&1 | FileCheck %s --check-prefix=REPL
// REPL: error: zb-v runs one rank per device position: drop the replicas or use zb-h1 / 1f1b-flush
