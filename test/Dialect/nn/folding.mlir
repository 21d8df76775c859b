// RUN: pipec-opt %s -split-input-file --canonicalize | FileCheck %s
// The nn ops that fold (NNOps.cpp): each case keeps the value bit for bit.

// CHECK-LABEL: func.func @identity
// CHECK-SAME: (%[[X:.*]]: tensor<4x5xf32>)
// CHECK-NEXT: return %[[X]]
func.func @identity(%x: tensor<4x5xf32>) -> tensor<4x5xf32> {
  %y = nn.identity %x : tensor<4x5xf32>
  return %y : tensor<4x5xf32>
}

// -----

// A view or broadcast to the type it already has, a cast to its own type,
// a sum onto its own shape with scale 1, a scale by 1: the input.
// CHECK-LABEL: func.func @same_type
// CHECK-SAME: (%[[X:.*]]: tensor<4x6xf32>, %[[M:.*]]: tensor<4x6xi64>)
// CHECK-NEXT: return %[[X]], %[[X]], %[[X]], %[[X]], %[[X]], %[[M]]
func.func @same_type(%x: tensor<4x6xf32>, %m: tensor<4x6xi64>)
    -> (tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>,
        tensor<4x6xf32>, tensor<4x6xi64>) {
  %f = nn.flatten %x {axis = 1 : i64} : tensor<4x6xf32> -> tensor<4x6xf32>
  %r = nn.reshape %x : tensor<4x6xf32> -> tensor<4x6xf32>
  %e = nn.expand %x : tensor<4x6xf32> -> tensor<4x6xf32>
  %s = nn.sum_to_shape %x : tensor<4x6xf32> -> tensor<4x6xf32>
  %k = nn.scale %x {factor = 1.0 : f64} : tensor<4x6xf32>
  %c = nn.cast %m : tensor<4x6xi64> -> tensor<4x6xi64>
  return %f, %r, %e, %s, %k, %c : tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xi64>
}

// -----

// What changes the value stays: a real flatten, a broadcast, a cast between
// element types, a scaled or reducing sum, a scale by another factor.
// CHECK-LABEL: func.func @kept
// CHECK: nn.flatten
// CHECK: nn.expand
// CHECK: nn.cast
// CHECK: nn.sum_to_shape %{{.*}} {scale = 5.000000e-01 : f64} : tensor<4x6xf32> -> tensor<4x6xf32>
// CHECK: nn.sum_to_shape %{{.*}} : tensor<4x6xf32> -> tensor<6xf32>
// CHECK: nn.scale %{{.*}} {factor = 2.000000e+00 : f64}
// CHECK: nn.scale %{{.*}} {factor = 3.000000e+00 : f64}
func.func @kept(%x: tensor<4x1x6xf32>, %y: tensor<4x6xf32>, %v: tensor<6xf32>)
    -> (tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xi64>, tensor<4x6xf32>,
        tensor<6xf32>, tensor<4x6xf32>) {
  %f = nn.flatten %x {axis = 1 : i64} : tensor<4x1x6xf32> -> tensor<4x6xf32>
  %e = nn.expand %v : tensor<6xf32> -> tensor<4x6xf32>
  %c = nn.cast %y : tensor<4x6xf32> -> tensor<4x6xi64>
  %s = nn.sum_to_shape %y {scale = 0.5 : f64} : tensor<4x6xf32> -> tensor<4x6xf32>
  %t = nn.sum_to_shape %y : tensor<4x6xf32> -> tensor<6xf32>
  %k = nn.scale %y {factor = 2.0 : f64} : tensor<4x6xf32>
  %k2 = nn.scale %k {factor = 3.0 : f64} : tensor<4x6xf32>
  return %f, %e, %c, %s, %t, %k2 : tensor<4x6xf32>, tensor<4x6xf32>, tensor<4x6xi64>, tensor<4x6xf32>, tensor<6xf32>, tensor<4x6xf32>
}

// -----

// reshape(reshape(x)) is one reshape of x; back to x's type, it is x.
// CHECK-LABEL: func.func @reshape_chain
// CHECK-SAME: (%[[X:.*]]: tensor<4x6xf32>)
// CHECK-NEXT: %[[R:.*]] = nn.reshape %[[X]] : tensor<4x6xf32> -> tensor<24xf32>
// CHECK-NEXT: return %[[R]], %[[X]]
func.func @reshape_chain(%x: tensor<4x6xf32>) -> (tensor<24xf32>, tensor<4x6xf32>) {
  %a = nn.reshape %x : tensor<4x6xf32> -> tensor<2x12xf32>
  %b = nn.reshape %a : tensor<2x12xf32> -> tensor<24xf32>
  %c = nn.reshape %a : tensor<2x12xf32> -> tensor<4x6xf32>
  return %b, %c : tensor<24xf32>, tensor<4x6xf32>
}

// -----

// The reshape of a constant is the constant in the new shape.
// CHECK-LABEL: func.func @reshape_constant
// CHECK-NEXT: %[[C:.*]] = nn.constant dense<{{\[}}[1.000000e+00, 2.000000e+00, 3.000000e+00], [4.000000e+00, 5.000000e+00, 6.000000e+00]]> : tensor<2x3xf32>
// CHECK-NEXT: return %[[C]]
func.func @reshape_constant() -> tensor<2x3xf32> {
  %c = nn.constant dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]> : tensor<6xf32>
  %r = nn.reshape %c : tensor<6xf32> -> tensor<2x3xf32>
  return %r : tensor<2x3xf32>
}

// -----

// An identity permutation is its input; two transposes are one, composed
// (result dim i = input dim inner[outer[i]]), or none when they cancel.
// CHECK-LABEL: func.func @transposes
// CHECK-SAME: (%[[X:.*]]: tensor<2x3x4xf32>)
// CHECK-NEXT: %[[T:.*]] = nn.transpose %[[X]] {perm = array<i64: 2, 0, 1>} : tensor<2x3x4xf32> -> tensor<4x2x3xf32>
// CHECK-NEXT: return %[[X]], %[[T]], %[[X]]
func.func @transposes(%x: tensor<2x3x4xf32>)
    -> (tensor<2x3x4xf32>, tensor<4x2x3xf32>, tensor<2x3x4xf32>) {
  %i = nn.transpose %x {perm = array<i64: 0, 1, 2>} : tensor<2x3x4xf32> -> tensor<2x3x4xf32>
  %a = nn.transpose %x {perm = array<i64: 1, 0, 2>} : tensor<2x3x4xf32> -> tensor<3x2x4xf32>
  %b = nn.transpose %a {perm = array<i64: 2, 1, 0>} : tensor<3x2x4xf32> -> tensor<4x2x3xf32>
  %c = nn.transpose %a {perm = array<i64: 1, 0, 2>} : tensor<3x2x4xf32> -> tensor<2x3x4xf32>
  return %i, %b, %c : tensor<2x3x4xf32>, tensor<4x2x3xf32>, tensor<2x3x4xf32>
}

// -----

// Constants: equal ones merge, unused ones go.
// CHECK-LABEL: func.func @constants
// CHECK-NEXT: %[[C:.*]] = nn.constant dense<2.000000e+00> : tensor<3xf32>
// CHECK-NEXT: return %[[C]], %[[C]]
func.func @constants() -> (tensor<3xf32>, tensor<3xf32>) {
  %a = nn.constant dense<2.0> : tensor<3xf32>
  %b = nn.constant dense<2.0> : tensor<3xf32>
  %unused = nn.constant dense<5.0> : tensor<3xf32>
  return %a, %b : tensor<3xf32>, tensor<3xf32>
}

// -----

// A round trip through bf16 rounds: neither cast folds away.
// CHECK-LABEL: func.func @bf16_round_trip
// CHECK: %[[B:.*]] = nn.cast %{{.*}} : tensor<4xf32> -> tensor<4xbf16>
// CHECK: nn.cast %[[B]] : tensor<4xbf16> -> tensor<4xf32>
func.func @bf16_round_trip(%x: tensor<4xf32>) -> tensor<4xf32> {
  %b = nn.cast %x : tensor<4xf32> -> tensor<4xbf16>
  %y = nn.cast %b : tensor<4xbf16> -> tensor<4xf32>
  return %y : tensor<4xf32>
}
