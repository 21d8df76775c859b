// Input of build-schedule-errors.mlir, run with --pipe-build-schedule="schedule=1f1b-flush microbatches=2 replicas=3,1 split-samples=2"
// Rule "replica-range": 3 split replicas but only 2 samples per microbatch.
// expected-error @+1 {{stage 0 has 3 replicas; each replica needs at least one of the 2 samples of a microbatch (split replicas: replica j runs samples [j*b/r, (j+1)*b/r) of every microbatch)}}
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
