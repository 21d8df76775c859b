// RUN: pipec-opt %s | FileCheck %s
// RUN: pipec-opt %s | pipec-opt | FileCheck %s

// A hand-written two-stage GPipe pipeline with two microbatches.

// CHECK: module attributes {pipe.plan = #pipe.plan<algorithm = "balanced", first = [0, 1], last = [0, 1], replicas = [1, 1], predicted_iteration_s = 1.000000e-03>}
module attributes {pipe.plan = #pipe.plan<algorithm = "balanced", first = [0, 1], last = [0, 1], replicas = [1, 1], predicted_iteration_s = 1.0e-3>} {
  func.func @s0_fwd(%x: tensor<2x4xf32> {pipe.feed = 0 : i64}) -> tensor<2x4xf32> attributes {pipe.stage = 0 : i64} {
    %0 = nn.relu %x : tensor<2x4xf32>
    return %0 : tensor<2x4xf32>
  }
  func.func @s0_bwd(%g: tensor<2x4xf32> {pipe.grad_from = array<i64: 1, 0>}) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32>) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s1_fwd(%a: tensor<2x4xf32> {pipe.from = array<i64: 0, 0>}) -> tensor<2x4xf32> attributes {pipe.stage = 1 : i64} {
    return %a : tensor<2x4xf32>
  }
  func.func @s1_bwd(%a: tensor<2x4xf32>) -> tensor<2x4xf32> attributes {pipe.stage = 1 : i64} {
    return %a : tensor<2x4xf32>
  }
  func.func @s1_step(%lr: tensor<f32>) attributes {pipe.stage = 1 : i64} {
    return
  }
  // CHECK: pipe.pipeline microbatches 2 schedule "gpipe" {
  pipe.pipeline microbatches 2 schedule "gpipe" {
    // CHECK: pipe.program "rank0" stage 0 slots 2 {
    pipe.program "rank0" stage 0 slots 2 {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c2 = arith.constant 2 : index
      // CHECK: scf.for
      scf.for %i = %c0 to %c2 step %c1 {
        // CHECK: pipe.forward @s0_fwd mb %{{.*}}
        pipe.forward @s0_fwd mb %i
        // CHECK: pipe.send %{{.*}} to 1 channel 0 from @s0_fwd[0] : tensor<2x4xf32>
        pipe.send %i to 1 channel 0 from @s0_fwd[0] : tensor<2x4xf32>
      }
      scf.for %i = %c0 to %c2 step %c1 {
        // CHECK: pipe.recv %{{.*}} from 1 channel 1 into @s0_bwd[0] : tensor<2x4xf32>
        pipe.recv %i from 1 channel 1 into @s0_bwd[0] : tensor<2x4xf32>
        // CHECK: pipe.backward @s0_bwd mb %{{.*}}
        pipe.backward @s0_bwd mb %i
      }
      // CHECK: pipe.flush
      pipe.flush
      // CHECK: pipe.step @s0_step
      pipe.step @s0_step
    }
    pipe.program "rank1" stage 1 slots 2 {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c2 = arith.constant 2 : index
      scf.for %i = %c0 to %c2 step %c1 {
        pipe.recv %i from 0 channel 0 into @s1_fwd[0] : tensor<2x4xf32>
        pipe.forward @s1_fwd mb %i
      }
      scf.for %i = %c0 to %c2 step %c1 {
        pipe.backward @s1_bwd mb %i
        pipe.send %i to 0 channel 1 from @s1_bwd[0] : tensor<2x4xf32>
      }
      pipe.flush
      pipe.step @s1_step
    }
  }
}
