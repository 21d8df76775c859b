// RUN: pipec-opt %s --nn-convert-precision | FileCheck %s
// RUN: pipec-opt %s --nn-convert-precision=precision=f32 | FileCheck %s --check-prefix=SAME
// RUN: not pipec-opt %s --nn-convert-precision=precision=f16 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: pipec-opt %s --nn-convert-precision=precision=bf16 | FileCheck %s --check-prefix=BF16

// Every f32 tensor becomes f64: globals (with their blobs widened exactly),
// signatures, values and literals; scalar attributes (alpha) keep f32 and
// integer tensors stay i64. The module records the precision.

// CHECK: module attributes {pipec.precision = "f64"}
// CHECK: ml_program.global private mutable @w(dense_resource<[[BLOB:w.*]]> : tensor<2x2xf64>) : tensor<2x2xf64>
// CHECK: ml_program.global private mutable @ids(dense<[0, 1]> : tensor<2xi64>) : tensor<2xi64>
// CHECK-LABEL: func.func @s0_fwd
// CHECK-SAME: (%[[X:.*]]: tensor<2x2xf64>) -> tensor<2x2xf64>
// CHECK: %[[W:.*]] = ml_program.global_load @w : tensor<2x2xf64>
// CHECK: %[[C:.*]] = nn.constant dense<[5.000000e-01, 0.10000000149011612]> : tensor<2xf64>
// A splat is a literal of the model: the value it stands for (0.9f is
// 0.9, float32 1/6 is 1/6), not the float32 widened.
// CHECK: nn.constant dense<9.000000e-01> : tensor<f64>
// CHECK: nn.constant dense<0.16666666666666666> : tensor<f64>
// CHECK: %[[G:.*]] = nn.gemm %[[X]], %[[W]], %[[C]] {alpha = 2.000000e+00 : f32
// CHECK-SAME: (tensor<2x2xf64>, tensor<2x2xf64>, tensor<2xf64>) -> tensor<2x2xf64>
// CHECK: return %[[G]] : tensor<2x2xf64>
// The blob holds the float32 values widened: 0.1f is 0x3FB99999A0000000.
// CHECK: [[BLOB]]: "0x08000000000000A09999B93F000000A09999C93F000000403333D33F000000A09999D93F"

// SAME-NOT: f64
// BAD: unknown precision 'f16' (f32, f64 or bf16)

// bf16 (bfloat16 matrix products on the CUDA target) keeps every type and
// only marks the module for the lowering.
// BF16: module attributes {pipec.precision = "bf16"}
// BF16-NOT: f64
// BF16: nn.gemm {{.*}} -> tensor<2x2xf32>

module {
  ml_program.global private mutable @w(dense_resource<w> : tensor<2x2xf32>) : tensor<2x2xf32>
  ml_program.global private mutable @ids(dense<[0, 1]> : tensor<2xi64>) : tensor<2xi64>
  func.func @s0_fwd(%x: tensor<2x2xf32>) -> tensor<2x2xf32> {
    %w = ml_program.global_load @w : tensor<2x2xf32>
    %c = nn.constant dense<[0.5, 0.1]> : tensor<2xf32>
    %m = nn.constant dense<0.9> : tensor<f32>
    %sixth = nn.constant dense<0.1666666716337204> : tensor<f32>
    %y = nn.gemm %x, %w, %c {alpha = 2.0 : f32} : (tensor<2x2xf32>, tensor<2x2xf32>, tensor<2xf32>) -> tensor<2x2xf32>
    return %y : tensor<2x2xf32>
  }
}

{-#
  dialect_resources: {
    builtin: {
      w: "0x04000000CDCCCC3DCDCC4C3E9A99993ECDCCCC3E"
    }
  }
#-}
