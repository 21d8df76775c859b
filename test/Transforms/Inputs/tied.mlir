// A weight read by layers of two stages (tied weights), for
// split-stages.mlir and build-schedule.mlir.
module attributes {pipe.plan = #pipe.plan<algorithm = "manual", first = [0, 1], last = [0, 1], replicas = [1, 1], predicted_iteration_s = 0.0>} {
  ml_program.global private mutable @tied(dense<1.0> : tensor<4x4xf32>) : tensor<4x4xf32>
  func.func @main(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
    %w = ml_program.global_load @tied : tensor<4x4xf32>
    %0 = nn.gemm %x, %w {pipe.stage = 0 : i64} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
    %1 = nn.gemm %0, %w {pipe.stage = 1 : i64} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
    return %1 : tensor<2x4xf32>
  }
}
