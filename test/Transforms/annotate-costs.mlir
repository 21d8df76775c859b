// RUN: pipec-opt %S/Inputs/tiny_mlp.mlir --nn-annotate-costs | FileCheck %s --check-prefix=ANALYTIC
// RUN: pipec-opt %S/Inputs/tiny_mlp.mlir --nn-annotate-costs=profile=%S/Inputs/tiny_profile.json | FileCheck %s --check-prefix=PROFILE
// RUN: not pipec-opt %S/Inputs/tiny_mlp.mlir --nn-annotate-costs=device=tpu 2>&1 | FileCheck %s --check-prefix=DEVICE
// RUN: not pipec-opt %S/Inputs/tiny_mlp.mlir --nn-annotate-costs=profile=%S/Inputs/bad_profile.json 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: not pipec-opt %S/Inputs/tiny_mlp.mlir --nn-annotate-costs=profile=%S/Inputs/nope.json 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: pipec-opt %S/Inputs/tiny_mlp.mlir --nn-annotate-costs=device=%S/Inputs/calibrated_device.json | FileCheck %s --check-prefix=CALIBRATED
// RUN: not pipec-opt %S/Inputs/tiny_mlp.mlir --nn-annotate-costs=device=%S/Inputs/nope-device.json 2>&1 | FileCheck %s --check-prefix=NODEVICE

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

// A calibrated device model (pipec calibrate; pipec.device/1): relu has no
// fit of its own, so its class's (memory-bound at half the bandwidth:
// 160 bytes / 5e10 B/s + 1 us); gemm runs matmul's kernels and takes its
// fit (316 bytes / 1e11 B/s at efficiency 0.5 + 2 us).
// CALIBRATED: nn.gemm {{.*}}#nn.cost<fwd = 2.006320e-06, bwd = 2.012640e-06,
// CALIBRATED: nn.relu {{.*}}#nn.cost<fwd = 1.003200e-06, bwd = 1.006400e-06,
// NODEVICE: cannot read device model '{{.*}}nope-device.json'
