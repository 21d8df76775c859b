// RUN: pipec-opt %s -split-input-file -verify-diagnostics --nn-convert-precision
// RUN: pipec-opt %S/Inputs/convert-precision-errors-unknown.mlir -verify-diagnostics --nn-convert-precision=precision=f16

// Every error --nn-convert-precision (passes/ConvertPrecision.cpp) reports.
// The case that needs another option is in
// Inputs/convert-precision-errors-unknown.mlir:
//   precision=bf16:  "--nn-convert-precision: unknown precision 'bf16' (f32 or f64)"
// All of the pass's diagnostics are reachable from IR.

// An f32 weight held as a dense_resource whose blob was elided: there is
// no data to widen to f64.
// expected-error @+1 {{--nn-convert-precision: a weight has no data}}
module {
  ml_program.global private mutable @w(dense_resource<__elided__> : tensor<3xf32>) : tensor<3xf32>
}

// -----

// The same, with the weight read by a stage function: the error is still
// reported on the module (it does not name the weight).
// expected-error @+1 {{--nn-convert-precision: a weight has no data}}
module {
  ml_program.global private mutable @w(dense<1.0> : tensor<3xf32>) : tensor<3xf32>
  ml_program.global private mutable @b(dense_resource<missing_blob> : tensor<3xf32>) : tensor<3xf32>
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    %b = ml_program.global_load @b : tensor<3xf32>
    %0 = nn.add %x, %b : tensor<4x3xf32>, tensor<3xf32> -> tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}
