// Case of convert-precision-errors.mlir run with
// --nn-convert-precision=precision=bf16.

// A precision other than f32 or f64.
// expected-error @+1 {{--nn-convert-precision: unknown precision 'bf16' (f32 or f64)}}
module {
  ml_program.global private mutable @w(dense<1.0> : tensor<3xf32>) : tensor<3xf32>
}
