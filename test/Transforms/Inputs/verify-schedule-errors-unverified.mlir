// Input of verify-schedule-errors.mlir, parsed without verification
// (--mlir-very-unsafe-disable-verifier-on-parsing): --pipe-verify-schedule
// runs the pipe.pipeline verifier itself and stops at its error.
// A step of 3 microbatches whose program runs only microbatches 0 and 1.
module {
  func.func @f(%x: tensor<2xf32>) -> tensor<2xf32> {
    return %x : tensor<2xf32>
  }
  pipe.pipeline microbatches 3 schedule "gpipe" {
    // expected-error @+1 {{'pipe.program' op must run exactly one forward and one backward of microbatch 2 (found 0 and 0)}}
    pipe.program "rank0" stage 0 slots 2 {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      pipe.forward @f mb %c0
      pipe.forward @f mb %c1
      pipe.backward @f mb %c0
      pipe.backward @f mb %c1
      pipe.flush
      pipe.step @f
    }
  }
}
