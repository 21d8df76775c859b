// Case of convert-precision-errors.mlir run with
// --nn-convert-precision=precision=f16.

// A precision other than f32, f64 or bf16.
// expected-error @+1 {{--nn-convert-precision: unknown precision 'f16' (f32, f64 or bf16)}}
module {
  ml_program.global private mutable @w(dense<1.0> : tensor<3xf32>) : tensor<3xf32>
}
