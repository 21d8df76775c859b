// RUN: pipec-opt %s --nn-fold-transposes | FileCheck %s

// A transpose of the last two dimensions feeding a matmul becomes the
// matmul's trans flag, and the transpose goes when nothing else reads it.
// CHECK-LABEL: func.func @backward
// CHECK-NOT: nn.transpose
// CHECK: %[[DP:.*]] = nn.matmul %arg1, %arg2 {trans_b = true} : (tensor<2x8x4xf32>, tensor<2x8x4xf32>) -> tensor<2x8x8xf32>
// CHECK: %[[DV:.*]] = nn.matmul %arg0, %arg1 {alpha = 2.500000e-01 : f32, trans_a = true} : (tensor<2x8x8xf32>, tensor<2x8x4xf32>) -> tensor<2x8x4xf32>
// CHECK: return %[[DP]], %[[DV]]
func.func @backward(%p: tensor<2x8x8xf32>, %dy: tensor<2x8x4xf32>, %v: tensor<2x8x4xf32>) -> (tensor<2x8x8xf32>, tensor<2x8x4xf32>) {
  %vt = nn.transpose %v {perm = array<i64: 0, 2, 1>} : tensor<2x8x4xf32> -> tensor<2x4x8xf32>
  %dp = nn.matmul %dy, %vt : (tensor<2x8x4xf32>, tensor<2x4x8xf32>) -> tensor<2x8x8xf32>
  %pt = nn.transpose %p {perm = array<i64: 0, 2, 1>} : tensor<2x8x8xf32> -> tensor<2x8x8xf32>
  %dv = nn.matmul %pt, %dy {alpha = 2.500000e-01 : f32} : (tensor<2x8x8xf32>, tensor<2x8x4xf32>) -> tensor<2x8x4xf32>
  return %dp, %dv : tensor<2x8x8xf32>, tensor<2x8x4xf32>
}

// A transpose with another reader stays (that reader still needs it); a
// permutation that moves a batch dimension and keeps the innermost one is
// read through perm_a; both operands of one matmul fold; a transpose of a
// transpose-flagged operand cancels.
// CHECK-LABEL: func.func @kept
// CHECK: %[[T:.*]] = nn.transpose %arg0 {perm = array<i64: 0, 2, 1>}
// CHECK: nn.matmul %arg0, %arg1 {trans_a = true, trans_b = true} : (tensor<2x4x3xf32>, tensor<2x5x4xf32>) -> tensor<2x3x5xf32>
// CHECK: nn.relu %[[T]]
// CHECK-NOT: nn.transpose %arg2
// CHECK: nn.matmul %arg2, %arg3 {perm_a = array<i64: 1, 0, 2>} : (tensor<3x2x4xf32>, tensor<2x4x5xf32>)
// CHECK: nn.matmul %arg4, %arg3 : (tensor<2x3x4xf32>, tensor<2x4x5xf32>)
func.func @kept(%a: tensor<2x4x3xf32>, %b: tensor<2x5x4xf32>, %c: tensor<3x2x4xf32>, %d: tensor<2x4x5xf32>, %e: tensor<2x3x4xf32>) -> (tensor<2x3x5xf32>, tensor<2x3x4xf32>, tensor<2x3x5xf32>, tensor<2x3x5xf32>) {
  %at = nn.transpose %a {perm = array<i64: 0, 2, 1>} : tensor<2x4x3xf32> -> tensor<2x3x4xf32>
  %bt = nn.transpose %b {perm = array<i64: 0, 2, 1>} : tensor<2x5x4xf32> -> tensor<2x4x5xf32>
  %y = nn.matmul %at, %bt : (tensor<2x3x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>
  %r = nn.relu %at : tensor<2x3x4xf32>
  %ct = nn.transpose %c {perm = array<i64: 1, 0, 2>} : tensor<3x2x4xf32> -> tensor<2x3x4xf32>
  %z = nn.matmul %ct, %d : (tensor<2x3x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>
  %et = nn.transpose %e {perm = array<i64: 0, 2, 1>} : tensor<2x3x4xf32> -> tensor<2x4x3xf32>
  %w = nn.matmul %et, %d {trans_a = true} : (tensor<2x4x3xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>
  return %y, %r, %z, %w : tensor<2x3x5xf32>, tensor<2x3x4xf32>, tensor<2x3x5xf32>, tensor<2x3x5xf32>
}

// Attention's heads: [B, S, H, D] -> [B, H, S, D] queries and values read
// through perm (0, 2, 1, 3); keys [B, S, H, D] -> [B, H, D, S] through the
// same permutation with B transposed; the transposes are gone. A
// permutation that moves the innermost dimension elsewhere stays.
// CHECK-LABEL: func.func @heads
// CHECK-NOT: nn.transpose %arg0
// CHECK-NOT: nn.transpose %arg1
// CHECK: %[[S:.*]] = nn.matmul %arg0, %arg1 {perm_a = array<i64: 0, 2, 1, 3>, perm_b = array<i64: 0, 2, 1, 3>, trans_b = true} : (tensor<2x8x3x4xf32>, tensor<2x8x3x4xf32>) -> tensor<2x3x8x8xf32>
// CHECK: nn.matmul %[[S]], %arg2 {perm_b = array<i64: 0, 2, 1, 3>} : (tensor<2x3x8x8xf32>, tensor<2x8x3x4xf32>) -> tensor<2x3x8x4xf32>
// CHECK: %[[X:.*]] = nn.transpose %arg3 {perm = array<i64: 0, 3, 1, 2>}
// CHECK: nn.matmul %[[X]], %arg4 :
func.func @heads(%q: tensor<2x8x3x4xf32>, %k: tensor<2x8x3x4xf32>, %v: tensor<2x8x3x4xf32>, %x: tensor<2x3x8x4xf32>, %w: tensor<2x4x8x2xf32>) -> (tensor<2x3x8x4xf32>, tensor<2x4x3x2xf32>) {
  %qt = nn.transpose %q {perm = array<i64: 0, 2, 1, 3>} : tensor<2x8x3x4xf32> -> tensor<2x3x8x4xf32>
  %kt = nn.transpose %k {perm = array<i64: 0, 2, 3, 1>} : tensor<2x8x3x4xf32> -> tensor<2x3x4x8xf32>
  %vt = nn.transpose %v {perm = array<i64: 0, 2, 1, 3>} : tensor<2x8x3x4xf32> -> tensor<2x3x8x4xf32>
  %s = nn.matmul %qt, %kt : (tensor<2x3x8x4xf32>, tensor<2x3x4x8xf32>) -> tensor<2x3x8x8xf32>
  %o = nn.matmul %s, %vt : (tensor<2x3x8x8xf32>, tensor<2x3x8x4xf32>) -> tensor<2x3x8x4xf32>
  %xt = nn.transpose %x {perm = array<i64: 0, 3, 1, 2>} : tensor<2x3x8x4xf32> -> tensor<2x4x3x8xf32>
  %z = nn.matmul %xt, %w : (tensor<2x4x3x8xf32>, tensor<2x4x8x2xf32>) -> tensor<2x4x3x2xf32>
  return %o, %z : tensor<2x3x8x4xf32>, tensor<2x4x3x2xf32>
}
