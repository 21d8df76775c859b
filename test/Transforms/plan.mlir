// RUN: pipec-opt %S/Inputs/costed.mlir --pipe-plan=stages=2 | FileCheck %s
// RUN: pipec-opt %S/Inputs/costed_analytic.mlir --pipe-plan=stages=3 | FileCheck %s --check-prefix=THREE
// RUN: not pipec-opt %S/Inputs/costed_analytic.mlir --pipe-plan=stages=4 2>&1 | FileCheck %s --check-prefix=TOOMANY
// RUN: not pipec-opt %S/Inputs/tiny_mlp.mlir --pipe-plan=stages=2 2>&1 | FileCheck %s --check-prefix=NOCOST
// RUN: not pipec-opt %S/Inputs/costed_analytic.mlir --pipe-plan="stages=2 algorithm=magic" 2>&1 | FileCheck %s --check-prefix=ALGO

// fc1 costs 12 ms, act1 2 ms, fc2 6 ms: the balanced split is {fc1} | {act1, fc2}.
// CHECK: module attributes {pipe.plan = #pipe.plan<algorithm = "balanced", first = [0, 1], last = [0, 2], replicas = [1, 1]
// CHECK: nn.gemm {{.*}}pipe.stage = 0 : i64
// CHECK: nn.relu {{.*}}pipe.stage = 1 : i64
// CHECK: nn.gemm {{.*}}pipe.stage = 1 : i64

// THREE: first = [0, 1, 2], last = [0, 1, 2]
// TOOMANY: cannot plan 4 stages: cannot split 3 layers into 4 stages
// NOCOST: has no #nn.cost; run --nn-annotate-costs before --pipe-plan
// ALGO: unknown planner 'magic' (known: auto, balanced, pipedream, dapple, madpipe, twobw, interleaved, exhaustive)

// The papers' planners go through the same pass; a plan the compiler
// cannot lower yet (replicated stages) is refused with a clear message.
// RUN: pipec-opt %S/Inputs/costed.mlir --pipe-plan="stages=2 algorithm=dapple" | FileCheck %s --check-prefix=DAPPLE
// RUN: not pipec-opt %S/Inputs/costed.mlir --pipe-plan="stages=2 algorithm=pipedream" 2>&1 | FileCheck %s --check-prefix=REPLICATED
// DAPPLE: #pipe.plan<algorithm = "dapple", first = [0, 1], last = [0, 2], replicas = [1, 1]
// REPLICATED: the pipedream plan replicates stages or interleaves chunks, which the compiler cannot lower yet
