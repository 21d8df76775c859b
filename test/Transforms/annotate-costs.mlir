// RUN: pipec-opt %S/Inputs/tiny_mlp.mlir --nn-annotate-costs | FileCheck %s --check-prefix=ANALYTIC
// RUN: pipec-opt %S/Inputs/tiny_mlp.mlir --nn-annotate-costs=profile=%S/Inputs/tiny_profile.json | FileCheck %s --check-prefix=PROFILE
// RUN: not pipec-opt %S/Inputs/tiny_mlp.mlir --nn-annotate-costs=device=tpu 2>&1 | FileCheck %s --check-prefix=DEVICE
// RUN: not pipec-opt %S/Inputs/tiny_mlp.mlir --nn-annotate-costs=profile=%S/Inputs/bad_profile.json 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: not pipec-opt %S/Inputs/tiny_mlp.mlir --nn-annotate-costs=profile=%S/Inputs/nope.json 2>&1 | FileCheck %s --check-prefix=MISSING

// Analytic: byte counts come from the types (f32): the first Gemm writes
// 4x5 floats, reads 5x6 + 5 parameters and a 4x6 activation.
// ANALYTIC: nn.gemm {{.*}}nn.cost = #nn.cost<fwd = {{.*}}, bwd = {{.*}}, out_bytes = 80, param_bytes = 140, saved_bytes = 96>
// ANALYTIC: nn.relu {{.*}}nn.cost = #nn.cost<fwd = {{.*}}, bwd = {{.*}}, out_bytes = 80, param_bytes = 0, saved_bytes = 80>
// ANALYTIC: nn.gemm {{.*}}nn.cost = #nn.cost<fwd = {{.*}}, bwd = {{.*}}, out_bytes = 48, param_bytes = 72, saved_bytes = 80>

// Measured: times from the profile, matched by ONNX node name.
// PROFILE: nn.gemm {{.*}}#nn.cost<fwd = 4.000000e-03, bwd = 8.000000e-03,
// PROFILE: nn.relu {{.*}}#nn.cost<fwd = 1.000000e-03, bwd = 1.000000e-03,
// PROFILE: nn.gemm {{.*}}#nn.cost<fwd = 2.000000e-03, bwd = 4.000000e-03,

// DEVICE: unknown device model 'tpu' (known: cpu, v100, {{.*}}a100, {{.*}}h100{{.*}})
// BAD: profile '{{.*}}bad_profile.json': {{.*}}fc1{{.*}}
// MISSING: cannot read profile '{{.*}}nope.json'
