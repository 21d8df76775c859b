// RUN: pipec-opt %s --nn-autodiff | FileCheck %s
// A stage that sends only integers (token ids, a mask) to the next one
// receives no gradient: its backward has no arguments and does nothing.
// (The pass used to index its arguments with an unsigned count minus one.)

// CHECK-LABEL: func.func @s0_bwd()
// CHECK-NEXT: return
// CHECK-LABEL: func.func @s1_fwd
// CHECK-SAME: pipe.from = array<i64: 0, 0>
// CHECK: nn.softmax_cross_entropy_loss
// CHECK-LABEL: func.func @s1_bwd
// CHECK-SAME: pipe.loss_seed
module {
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}, %ids: tensor<4xi64> {pipe.feed = 1 : i64}) -> tensor<4xi64> attributes {pipe.stage = 0 : i64} {
    return %ids : tensor<4xi64>
  }
  func.func @s1_fwd(%ids: tensor<4xi64> {pipe.from = array<i64: 0, 0>}, %x: tensor<4x3xf32> {pipe.feed = 0 : i64}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 1 : i64} {
    %0 = nn.relu %x : tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}
