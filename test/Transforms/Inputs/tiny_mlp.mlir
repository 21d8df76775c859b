// A 3-layer MLP as the importer produces it (weights as mutable globals,
// ONNX node names as locations): x[4x6] -> Gemm(6->5) -> Relu -> Gemm(5->3).
module attributes {pipec.opset = 17 : i64} {
  ml_program.global private mutable @w1(dense<0.1> : tensor<5x6xf32>) : tensor<5x6xf32>
  ml_program.global private mutable @b1(dense<0.0> : tensor<5xf32>) : tensor<5xf32>
  ml_program.global private mutable @w2(dense<0.2> : tensor<3x5xf32>) : tensor<3x5xf32>
  ml_program.global private mutable @b2(dense<0.0> : tensor<3xf32>) : tensor<3xf32>
  func.func @main(%x: tensor<4x6xf32> {pipec.name = "x"}) -> (tensor<4x3xf32> {pipec.name = "y"}) {
    %w1 = ml_program.global_load @w1 : tensor<5x6xf32> loc("w1")
    %b1 = ml_program.global_load @b1 : tensor<5xf32> loc("b1")
    %0 = nn.gemm %x, %w1, %b1 {trans_b = true} : (tensor<4x6xf32>, tensor<5x6xf32>, tensor<5xf32>) -> tensor<4x5xf32> loc("fc1")
    %1 = nn.relu %0 : tensor<4x5xf32> loc("act1")
    %w2 = ml_program.global_load @w2 : tensor<3x5xf32> loc("w2")
    %b2 = ml_program.global_load @b2 : tensor<3xf32> loc("b2")
    %2 = nn.gemm %1, %w2, %b2 {trans_b = true} : (tensor<4x5xf32>, tensor<3x5xf32>, tensor<3xf32>) -> tensor<4x3xf32> loc("fc2")
    return %2 : tensor<4x3xf32>
  }
}
