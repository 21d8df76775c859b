// Input of build-schedule-errors.mlir, run with --pipe-build-schedule="schedule=1f1b microbatches=3 replicas=2,1"
// Rule "round-robin": 3 microbatches do not split evenly over the 2 replicas of stage 0.
// expected-error @+1 {{schedule '1f1b' with replicas needs the microbatches per step (3) to be a multiple of every stage's replica count; stage 0 has 2 (1F1B-RR: each replica runs one microbatch of every round of r, and the replicas update together after each round)}}
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
  func.func @s1_bwd(%g: tensor<2xf32>) -> (tensor<2xf32> {pipe.grad_of_arg = 0 : i64}) attributes {pipe.stage = 1 : i64} {
    return %g : tensor<2xf32>
  }
  func.func @s1_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 1 : i64} {
    return
  }
}
