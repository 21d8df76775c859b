// RUN: pipec-opt %S/Inputs/scheduled_gpipe.mlir --pipe-lower-to-runtime=stage=1 | FileCheck %s
// RUN: pipec-opt %S/Inputs/scheduled_gpipe.mlir --pipe-lower-to-runtime=stage=1 | FileCheck %s --check-prefix=STEP
// RUN: pipec-opt %S/Inputs/tiny_mlp.mlir --nn-annotate-costs=profile=%S/Inputs/tiny_profile.json --pipec-train-pipeline="stages=2 microbatches=2 schedule=gpipe" --pipec-lower-stage="stage=0" | FileCheck %s --check-prefix=LLVM
// RUN: not pipec-opt %S/Inputs/tiny_mlp.mlir --pipe-lower-to-runtime 2>&1 | FileCheck %s --check-prefix=NOSCHED

// The stage description (JSON) travels inside the executable.
// CHECK: llvm.mlir.global internal constant @pipec_stage_meta("{{.*}}\22format\22:\22pipec.stage/2\22
// CHECK-SAME: \22loss\22:true
// CHECK-SAME: \22policy\22:{\22flush\22:true,\22update\22:\22flush\22,\22versions_kept\22:1}
// CHECK-SAME: \22stage\22:1
// Stage functions call runtime kernels with (kernel context, bufs, ints,
// reals), the kernel context asked for once on entry (ABI 3).
// CHECK-LABEL: func.func private @pipec_s1_fwd
// CHECK-SAME: (%[[CTX:.*]]: !llvm.ptr, %[[ARENA:.*]]: !llvm.ptr, %[[SLOT:.*]]: i64, %[[WBASE:.*]]: !llvm.ptr)
// CHECK: %[[KC:.*]] = call @pipec_rt_kernel_context(%[[CTX]]) : (!llvm.ptr) -> !llvm.ptr
// CHECK-NOT: call @pipec_rt_kernel_context(
// CHECK: call @pipec_rt_op_begin(%[[CTX]]
// CHECK: call @pipec_k_unary(%[[KC]],
// CHECK: call @pipec_k_gemm(%[[KC]],
// CHECK: call @pipec_k_sce_loss(%[[KC]],
// CHECK-LABEL: func.func private @pipec_s1_bwd
// CHECK: %[[KC2:.*]] = call @pipec_rt_kernel_context(
// CHECK: call @pipec_k_sce_loss_grad(%[[KC2]],
// CHECK: call @pipec_k_unary_grad(%[[KC2]],
// The step function: the stage's two SGD updates (weight of 15 elements,
// bias of 3) in one multi-tensor call, its two gradients zeroed in
// another; each call is timed as a profiler op after the 3 layer ops (3,
// 4), which the profile shares among the ops by elements.
// CHECK-LABEL: func.func private @pipec_s1_step
// CHECK: call @pipec_k_sgd_multi(
// CHECK: call @pipec_k_fill_multi(
// The schedule program: first the step's receives posted ahead (a no-op
// unless the run has --prefetch), then receive, feed labels, forward, record
// the loss ...
// CHECK-LABEL: func.func @pipec_program
// CHECK: scf.for
// CHECK:   call @pipec_rt_recv_post(
// CHECK-NOT: call @pipec_s1_fwd(
// CHECK: scf.for
// CHECK:   call @pipec_rt_recv(
// CHECK:   call @pipec_rt_feed(
// CHECK:   call @pipec_s1_fwd(
// CHECK:   call @pipec_rt_loss(
// CHECK: scf.for
// CHECK:   call @pipec_rt_loss_seed(
// CHECK:   call @pipec_s1_bwd(
// CHECK:   call @pipec_rt_send(
// CHECK: call @pipec_rt_flush(
// CHECK: call @pipec_rt_update(
// CHECK: call @pipec_rt_lr(
// CHECK: call @pipec_s1_step(
// CHECK-LABEL: func.func @main
// CHECK: call @pipec_rt_main(
// CHECK-NOT: nn.
// CHECK-NOT: pipe.program

// After the upstream conversions only the LLVM dialect is left.
// LLVM-LABEL: llvm.func @pipec_program
// LLVM: llvm.call @pipec_rt_feed
// LLVM-LABEL: llvm.func @main
// LLVM-NOT: scf.for
// LLVM-NOT: func.func

// NOSCHED: no pipe.pipeline; run --pipe-build-schedule first

// A continuous schedule: every op runs only for microbatches inside the run
// (pipec_rt_global_mb >= 0); forwards and backwards read the weight version
// the runtime hands out, and the backward releases it.
// RUN: pipec-opt %S/Inputs/scheduled_1f1b.mlir --pipe-lower-to-runtime=stage=0 | FileCheck %s --check-prefix=PD
// PD: \22versioned_bytes\22:
// PD-LABEL: func.func @pipec_program
// PD: scf.for
// PD:   %[[G:.*]] = func.call @pipec_rt_global_mb(
// PD:   %[[IN:.*]] = arith.cmpi sge, %[[G]]
// PD:   scf.if %[[IN]] {
// PD:     %[[W:.*]] = func.call @pipec_rt_weights(%{{.*}}, %[[G]], %{{.*}}, %{{.*}})
// PD:     call @pipec_s0_fwd(%{{.*}}, %{{.*}}, %{{.*}}, %[[W]])
// PD:   func.call @pipec_rt_global_mb(
// PD:     call @pipec_rt_weights(
// PD:     call @pipec_s0_bwd(
// PD:     call @pipec_rt_release(
// PD:     call @pipec_rt_update(
// PD:     call @pipec_s0_step(
// PD-NOT: call @pipec_rt_flush(

// Float64 reference mode: the calls go to the kernels' float64 twins, the
// stage description says so, and the weights are f64 in it.
// RUN: pipec-opt %S/Inputs/scheduled_gpipe.mlir --nn-convert-precision --pipe-lower-to-runtime=stage=1 | FileCheck %s --check-prefix=F64
// F64: \22precision\22:\22f64\22
// F64-SAME: \22dtype\22:\22f64\22
// F64-NOT: call @pipec_k_{{[a-z_]+[a-z]}}(
// F64: call @pipec_k_unary_f64

// STEP: llvm.mlir.global internal constant @[[K2:__pipec_ints_[0-9]+]](dense<[2, 15, 3]>
// STEP-LABEL: func.func private @pipec_s1_step
// STEP: %[[T0:.*]] = llvm.mlir.constant(3 : i64)
// STEP: call @pipec_rt_op_begin(%{{.*}}, %[[T0]],
// STEP: llvm.alloca %{{.*}} x !llvm.array<8 x ptr>
// STEP: %[[I0:.*]] = llvm.mlir.addressof @[[K2]]
// STEP: call @pipec_k_sgd_multi(%{{.*}}, %{{.*}}, %[[I0]],
// STEP-NOT: call @pipec_k_sgd(
// STEP: %[[T1:.*]] = llvm.mlir.constant(4 : i64)
// STEP: call @pipec_rt_op_begin(%{{.*}}, %[[T1]],
// STEP: call @pipec_k_fill_multi(
// STEP-NOT: call @pipec_k_
// STEP: return
