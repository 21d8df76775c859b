// Input of build-schedule-errors.mlir, run with --pipe-build-schedule="schedule=1f1b microbatches=2 split-samples=4"
// Rule "split-samples": split replicas with a continuous schedule.
// expected-error @+1 {{split replicas (every replica runs a slice of every microbatch) need a synchronous schedule, not '1f1b'; the continuous schedules replicate stages round robin (1F1B-RR)}}
module {
  func.func @s0_fwd(%x: tensor<2xf32> {pipe.feed = 0 : i64}) -> tensor<2xf32> attributes {pipe.stage = 0 : i64} {
    return %x : tensor<2xf32>
  }
  func.func @s0_bwd(%g: tensor<2xf32>) attributes {pipe.stage = 0 : i64} {
    return
  }
  func.func @s0_step(%lr: tensor<f32> {pipe.lr}) attributes {pipe.stage = 0 : i64} {
    return
  }
}
