// RUN: pipec-opt %s -split-input-file -verify-diagnostics -allow-unregistered-dialect --pipe-lower-to-runtime

// passes/KernelCalls.cpp's only diagnostic, reached by --pipe-lower-to-runtime
// (LowerToRuntime.cpp, the getKernelCalls call of each op of a stage
// function):
//
// Not reachable from IR: "no runtime kernel implements '<op>'" (every
//   registered nn op has a kernel case in kernelCallsOf/layerKernelCalls
//   except nn.constant, which the lowering turns into a constant buffer
//   before it asks for kernels; ops of other dialects are refused first by
//   the lowering's own "cannot lower '<op>' inside a stage function"; and
//   an unknown op of the nn namespace never gets past the verifier, even
//   with -allow-unregistered-dialect, as the case below shows). It would
//   only fire for an nn op added to the dialect without a kernel case.
//   (The in-process executor, lib/Exec/Executor.cpp, also calls
//   getKernelCalls, without the dialect check, but it is not a pass.)

// An op of the nn namespace that the dialect does not define, in a stage
// function: refused while the input is verified, before the pass runs.
module {
  func.func @s0_fwd(%x: tensor<4x3xf32> {pipe.feed = 0 : i64}) -> (tensor<4x3xf32> {pipe.output = 0 : i64}) attributes {pipe.stage = 0 : i64} {
    // expected-error @+1 {{unregistered operation 'nn.mystery' found in dialect ('nn') that does not allow unknown operations}}
    %0 = "nn.mystery"(%x) : (tensor<4x3xf32>) -> tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}
