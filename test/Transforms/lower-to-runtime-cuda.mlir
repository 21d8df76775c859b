// RUN: pipec-opt %s --pipec-train-pipeline="stages=1 microbatches=1 schedule=gpipe" --pipe-lower-to-runtime="stage=0 target=cuda" | FileCheck %s
// RUN: pipec-opt %s --pipec-train-pipeline="stages=1 microbatches=1 schedule=gpipe" --pipe-lower-to-runtime="stage=0" | FileCheck %s --check-prefix=CPU
// RUN: not pipec-opt %s --nn-convert-precision --pipec-train-pipeline="stages=1 microbatches=1 schedule=gpipe" --pipe-lower-to-runtime="stage=0 target=cuda" 2>&1 | FileCheck %s --check-prefix=F64
// RUN: not pipec-opt %s --pipec-train-pipeline="stages=1 microbatches=1 schedule=gpipe" --pipe-lower-to-runtime="stage=0 target=tpu" 2>&1 | FileCheck %s --check-prefix=TARGET
// RUN: pipec-opt %s --nn-convert-precision=precision=bf16 --pipec-train-pipeline="stages=1 microbatches=1 schedule=gpipe" --pipe-lower-to-runtime="stage=0 target=cuda" | FileCheck %s --check-prefix=BF16
// RUN: pipec-opt %s --nn-convert-precision=precision=bf16 --pipec-train-pipeline="stages=1 microbatches=1 schedule=gpipe" --pipe-lower-to-runtime="stage=0" | FileCheck %s --check-prefix=BF16CPU
// RUN: pipec-opt %s --pipec-train-pipeline="stages=1 microbatches=1 schedule=gpipe" --pipe-plan-memory=report=true -o /dev/null 2>&1 | FileCheck %s --check-prefix=PLAN

// --target cuda: the stage description says so, kernels are the CUDA twins
// (runtime/cuda/cuda_kernels.def), a constant reaches a kernel through
// pipec_rt_constant (its device copy), and main is pipec_rt_cuda_main.
// CHECK: @pipec_stage_meta("{{.*}}\22target\22:\22cuda\22
// CHECK-LABEL: func.func private @pipec_s0_fwd
// CHECK-SAME: (%[[CTX:.*]]: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: i64, %{{.*}}: !llvm.ptr)
// CHECK: %[[KC:.*]] = call @pipec_rt_kernel_context(%[[CTX]])
// CHECK: call @pipec_cuda_k_gemm(%[[KC]],
// CHECK: %[[HOST:.*]] = llvm.mlir.addressof @__pipec_const_0
// CHECK: %[[DEV:.*]] = call @pipec_rt_constant(%[[CTX]], %[[HOST]], %{{.*}}) : (!llvm.ptr, !llvm.ptr, i64) -> !llvm.ptr
// CHECK: llvm.store %[[DEV]]
// CHECK: call @pipec_cuda_k_binary(%[[KC]],
// CHECK-NOT: call @pipec_k_
// The program calls each stage function through pipec_rt_run, which may
// replay it as a CUDA graph (--cuda-graphs); the optimizer step too.
// CHECK-LABEL: func.func @pipec_program
// CHECK: %[[FWD:.*]] = constant @pipec_s0_fwd : (!llvm.ptr, !llvm.ptr, i64, !llvm.ptr) -> ()
// CHECK: call @pipec_rt_run(%{{.*}}, %[[FWD]],
// CHECK-NOT: call @pipec_s0_
// CHECK: %[[BWD:.*]] = constant @pipec_s0_bwd
// CHECK: call @pipec_rt_run(%{{.*}}, %[[BWD]],
// CHECK: %[[STEP:.*]] = constant @pipec_s0_step
// CHECK: call @pipec_rt_run(%{{.*}}, %[[STEP]],
// CHECK: call @pipec_rt_cuda_main(

// --precision bf16: float32 tensors, bfloat16 matrix products (on the CPU
// target too, where the kernels emulate them).
// BF16: @pipec_stage_meta("{{.*}}\22matmul_precision\22:\22bf16\22{{.*}}\22precision\22:\22f32\22{{.*}}\22target\22:\22cuda\22
// BF16CPU: @pipec_stage_meta("{{.*}}\22matmul_precision\22:\22bf16\22{{.*}}\22target\22:\22cpu\22

// The CPU target passes the constant's own address.
// CPU: \22target\22:\22cpu\22
// CPU-NOT: pipec_rt_constant(
// CPU: call @pipec_k_binary(
// CPU-NOT: pipec_rt_run
// CPU: call @pipec_s0_fwd(
// CPU: call @pipec_rt_main(

// The training pipeline alone (its memory planning makes the constant's
// LLVM array type) once crashed without the lowering in the same run.
// PLAN: remark: rank0 (stage 0): arena {{[0-9]+}} bytes = weights

// F64: error: --target cuda trains in float32
// TARGET: error: unknown target 'tpu' (expected cpu or cuda)

module attributes {pipec.opset = 17 : i64} {
  ml_program.global private mutable @w1(dense<0.1> : tensor<5x6xf32>) : tensor<5x6xf32>
  ml_program.global private mutable @b1(dense<0.0> : tensor<5xf32>) : tensor<5xf32>
  func.func @main(%x: tensor<4x6xf32> {pipec.name = "x"}) -> (tensor<4x5xf32> {pipec.name = "y"}) {
    %w1 = ml_program.global_load @w1 : tensor<5x6xf32> loc("w1")
    %b1 = ml_program.global_load @b1 : tensor<5xf32> loc("b1")
    %s = nn.constant dense<[1.0, 2.0, 3.0, 4.0, 5.0]> : tensor<5xf32> loc("scale")
    %0 = nn.gemm %x, %w1, %b1 {trans_b = true} : (tensor<4x6xf32>, tensor<5x6xf32>, tensor<5xf32>) -> tensor<4x5xf32> loc("fc1")
    %1 = nn.mul %0, %s : tensor<4x5xf32>, tensor<5xf32> -> tensor<4x5xf32> loc("scaled")
    return %1 : tensor<4x5xf32>
  }
}
