// Input of build-schedule-errors.mlir, run with --pipe-build-schedule="schedule=2bw microbatches=2 replicas=1,1,2"
// Rule "2bw-depth" with replicas: stage 0 runs 2 microbatches per batch but its backwards trail its forwards by K - 1 = 3.
// expected-error @+1 {{schedule '2bw': stage 0 (1 replica) runs 2 microbatches per replica and batch but trails its forwards by K - 1 = 3 of them; use at least 3 microbatches per batch (a forward would need a weight version that is not created yet; papers/thesis.md §3.1)}}
module {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s0_bwd(%g: tensor<2xf32> {pipe.grad_from = array<i64: 1, 0>}) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s1_fwd(%x: tensor<2xf32> {pipe.from = array<i64: 0, 0>}) -> tensor<2xf32> attributes {pipe.stage = 1 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s1_bwd(%g: tensor<2xf32> {pipe.grad_from = array<i64: 2, 0>}) -> (tensor<2xf32> {pipe.grad_of_arg = 0 : i64}) attributes {pipe.stage = 1 : i64} {
    return %g : tensor<2xf32>
  }
  func.func @s1_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 1 : i64} {
    return
  }
  func.func @s2_fwd(%x: tensor<2xf32> {pipe.from = array<i64: 1, 0>}) -> tensor<2xf32> attributes {pipe.stage = 2 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s2_bwd(%g: tensor<2xf32>) -> (tensor<2xf32> {pipe.grad_of_arg = 0 : i64}) attributes {pipe.stage = 2 : i64} {
    return %g : tensor<2xf32>
  }
  func.func @s2_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 2 : i64} {
    return
  }
}
