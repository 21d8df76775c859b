// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=1f1b-flush microbatches=4" | FileCheck %s
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=gpipe microbatches=3" | FileCheck %s --check-prefix=GPIPE
// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule=schedule=zigzag 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not pipec-opt %S/Inputs/tiny_mlp.mlir --pipe-build-schedule 2>&1 | FileCheck %s --check-prefix=NOFUNCS

// 1F1B-flush, p = 2, m = 4. Stage 0 warms up with one forward, then runs
// three {F, B} pairs in a loop, then cools down with one backward; it
// stashes min(p - s, m) = 2 microbatches.
// CHECK: pipe.pipeline microbatches 4 schedule "1f1b-flush" {
// CHECK: pipe.program "rank0" stage 0 slots 2 {
// CHECK:   %[[C0:.*]] = arith.constant 0 : index
// CHECK:   pipe.forward @s0_fwd mb %[[C0]]
// CHECK:   pipe.send %[[C0]] to 1 channel 0 from @s0_fwd[0] : tensor<4x5xf32>
// CHECK:   scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step
// CHECK:     %[[NEXT:.*]] = arith.addi %[[I]], %{{.*}} : index
// CHECK:     pipe.forward @s0_fwd mb %[[NEXT]]
// CHECK:     pipe.send %[[NEXT]] to 1 channel 0 from @s0_fwd[0]
// CHECK:     pipe.recv %[[I]] from 1 channel 1 into @s0_bwd[0] : tensor<4x5xf32>
// CHECK:     pipe.backward @s0_bwd mb %[[I]]
// CHECK:   pipe.recv %{{.*}} from 1 channel 1 into @s0_bwd[0]
// CHECK:   pipe.backward @s0_bwd
// CHECK:   pipe.flush
// CHECK:   pipe.step @s0_step
// The last stage alternates F and B from the start and keeps one slot.
// CHECK: pipe.program "rank1" stage 1 slots 1 {
// CHECK:   scf.for %[[J:.*]] = %{{.*}} to %{{.*}} step
// CHECK:     pipe.recv %[[J]] from 0 channel 0 into @s1_fwd[0]
// CHECK:     pipe.forward @s1_fwd mb %[[J]]
// CHECK:     pipe.backward @s1_bwd mb %[[J]]
// CHECK:     pipe.send %[[J]] to 0 channel 1 from @s1_bwd[0]
// CHECK:   pipe.step @s1_step

// GPipe: all forwards, then all backwards; every microbatch is stashed.
// GPIPE: pipe.program "rank0" stage 0 slots 3 {
// GPIPE:   scf.for
// GPIPE:     pipe.forward @s0_fwd
// GPIPE:   scf.for
// GPIPE:     pipe.backward @s0_bwd
// GPIPE: pipe.program "rank1" stage 1 slots 3 {

// UNKNOWN: unknown schedule 'zigzag' (available: gpipe, 1f1b-flush, 1f1b, 2bw, interleaved, zb-h1, custom, zb-v, zb-h2, dualpipev)
// NOFUNCS: expected @sK_fwd, @sK_bwd and @sK_step for every stage; run --pipe-split-stages and --nn-autodiff first

// Replicated stages (1F1B-RR): one program per replica, replica j running
// microbatches j, j + r, ...; the replicas sum their gradients before the
// update, and messages to stage 0 reach the replica that owns the
// microbatch (the runtime resolves it).
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=1f1b-flush microbatches=4 replicas=2,1" | FileCheck %s --check-prefix=RR
// RR: pipe.plan = #pipe.plan<{{.*}}replicas = [2, 1]
// RR: pipe.program "rank0" stage 0 slots
// RR:   pipe.forward @s0_fwd
// RR:   pipe.allreduce
// RR-NEXT: pipe.step @s0_step
// RR: pipe.program "rank1" stage 0 replica 1 slots
// RR:   pipe.allreduce
// RR: pipe.program "rank2" stage 1 slots 1 {
// RR-NOT: pipe.allreduce
// RR: pipe.step @s1_step
// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=1f1b-flush microbatches=2 replicas=3,1" 2>&1 | FileCheck %s --check-prefix=TOOMANY
// TOOMANY: stage 0 has 3 replicas; each replica needs at least one of the 2 microbatches
// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=1f1b microbatches=4 replicas=2,1 split-samples=4" 2>&1 | FileCheck %s --check-prefix=ASYNC
// ASYNC: split replicas (every replica runs a slice of every microbatch) need a synchronous schedule, not '1f1b'; the continuous schedules replicate stages round robin (1F1B-RR)

// Split replicas (DAPPLE): every replica runs the unreplicated stage's
// program on its slice of each microbatch's 6 samples (stage 0 on 3 replicas:
// 2 samples each), every microbatch in it, slots as without replicas; the
// verifier routes each message to the replicas whose slices overlap.
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=1f1b-flush microbatches=4 replicas=3,1 split-samples=6" --pipe-verify-schedule | FileCheck %s --check-prefix=SPLIT
// SPLIT: pipe.plan = #pipe.plan<{{.*}}replicas = [3, 1]
// SPLIT: pipe.pipeline microbatches 4 schedule "1f1b-flush" split_samples 6 {
// SPLIT: pipe.program "rank0" stage 0 slots 2 {
// SPLIT:   pipe.allreduce
// SPLIT: pipe.program "rank1" stage 0 replica 1 slots 2 {
// SPLIT: pipe.program "rank2" stage 0 replica 2 slots 2 {
// SPLIT: pipe.program "rank3" stage 1 slots 1 {
// SPLIT-NOT: pipe.allreduce
// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=1f1b-flush microbatches=4 replicas=3,1 split-samples=2" 2>&1 | FileCheck %s --check-prefix=SPLITFEW
// SPLITFEW: stage 0 has 3 replicas; each replica needs at least one of the 2 samples of a microbatch

// A fixed cut (--pipe-plan last=...): what the compiler reuses for slices.
// RUN: pipec-opt %S/Inputs/costed.mlir --pipe-plan="stages=2 last=1,2" | FileCheck %s --check-prefix=CUT
// CUT: pipe.plan = #pipe.plan<algorithm = "fixed", first = [0, 2], last = [1, 2]
// RUN: not pipec-opt %S/Inputs/costed.mlir --pipe-plan="stages=2 last=1,5" 2>&1 | FileCheck %s --check-prefix=BADCUT
// BADCUT: the fixed cut (last layers 1,5) does not split the 3 layers into 2 stages

// DAPPLE's warm-up policy B: stage s runs 2(p-s-1) forwards before its first
// backward and stashes min(2(p-s)-1, m) microbatches (3 on stage 0 of 2).
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=1f1b-flush microbatches=4 warmup=B" | FileCheck %s --check-prefix=POLB
// POLB: pipe.program "rank0" stage 0 slots 3 {
// POLB: pipe.program "rank1" stage 1 slots 1 {
// RUN: not pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=gpipe microbatches=4 warmup=B" 2>&1 | FileCheck %s --check-prefix=POLBGPIPE
// POLBGPIPE: warm-up policy B applies to 1f1b-flush only

// Interleaved (Megatron): the plan's p*v stages, stage c*p + r on device r.
// With 2 stages and v = 2 chunks one device runs both: messages between its
// chunks go to itself; the step updates every chunk.
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=interleaved microbatches=2 chunks=2" | FileCheck %s --check-prefix=IL
// IL: pipe.pipeline microbatches 2 schedule "interleaved" {
// IL: pipe.program "rank0" stage 0 slots 2 {
// IL:   pipe.forward @s0_fwd mb %[[A:.*]]
// IL:   pipe.send %[[A]] to 1 channel 0 from @s0_fwd[0]
// IL:   pipe.recv %[[B:.*]] from 0 channel 0 into @s1_fwd[0]
// IL:   pipe.forward @s1_fwd mb %[[B]]
// IL:   pipe.backward @s1_bwd
// IL:   pipe.backward @s0_bwd
// IL:   pipe.flush
// IL-NEXT: pipe.step @s0_step
// IL-NEXT: pipe.step @s1_step
// IL-NOT: pipe.program
// RUN: not pipec-opt %S/Inputs/differentiated_3stages.mlir --pipe-build-schedule="schedule=interleaved microbatches=2 chunks=2" 2>&1 | FileCheck %s --check-prefix=ILDIV
// ILDIV: the interleaved schedule places 2 chunks on every device, but the model has 3 stages

// Zero bubble (zb-h1): each backward is split into its input-gradient half
// (@sK_bwd, which returns the values the other half needs: pipe.carry) and
// its weight-gradient half (@sK_bwdw, pipe.backward_weight), deferred so
// that a microbatch stays stashed until its W: min(p, m) slots everywhere.
// RUN: pipec-opt %S/Inputs/differentiated.mlir --pipe-build-schedule="schedule=zb-h1 microbatches=4" --pipe-verify-schedule | FileCheck %s --check-prefix=ZB
// ZB: func.func @s0_bwd({{.*}}pipe.grad_from{{.*}}) -> (tensor<4x5xf32> {pipe.carry = 0 : i64})
// ZB: func.func @s0_bwdw(%{{.*}}: tensor<4x6xf32> {pipe.fwd_arg = 0 : i64}, %{{.*}}: tensor<4x5xf32> {pipe.carried = 0 : i64})
// ZB: ml_program.global_store
// ZB: pipe.program "rank0" stage 0 slots 2 {
// ZB:   pipe.backward @s0_bwd mb %[[M:.*]]
// ZB-NEXT: pipe.backward_weight @s0_bwdw mb %[[M]]
// ZB: pipe.program "rank1" stage 1 slots 2 {
// ZB:   pipe.backward_weight @s1_bwdw

// Tied weights: after the flush, every program of the stages that share
// them sums their gradients (pipe.tie_reduce) before its update; the
// continuous and interleaved schedules are refused, naming the weight.
// RUN: pipec-opt %S/Inputs/tied.mlir --pipe-split-stages --nn-autodiff --pipe-build-schedule="schedule=1f1b-flush microbatches=2" | FileCheck %s --check-prefix=TIE
// TIE: pipe.program "rank0" stage 0
// TIE: pipe.flush
// TIE-NEXT: pipe.tie_reduce [@tied] over stages [0, 1]
// TIE-NEXT: pipe.step @s0_step
// TIE: pipe.program "rank1" stage 1
// TIE: pipe.flush
// TIE-NEXT: pipe.tie_reduce [@tied] over stages [0, 1]
// TIE-NEXT: pipe.step @s1_step
// RUN: not pipec-opt %S/Inputs/tied.mlir --pipe-split-stages --nn-autodiff --pipe-build-schedule="schedule=1f1b microbatches=2" 2>&1 | FileCheck %s --check-prefix=TIECONT
// TIECONT: error: weight 'tied' is read by stages 0 and 1 (tied weights); schedule '1f1b' updates stages at different times
// RUN: not pipec-opt %S/Inputs/tied.mlir --pipe-split-stages --nn-autodiff --pipe-build-schedule="schedule=interleaved microbatches=2 chunks=2" 2>&1 | FileCheck %s --check-prefix=TIEIL
// TIEIL: error: weight 'tied' is read by stages 0 and 1 (tied weights), and schedule 'interleaved' places two of those stages on device 0
