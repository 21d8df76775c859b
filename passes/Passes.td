//===- Passes.td - pipec passes ----------------------------*- tablegen -*-===//
//
// Every compiler pass of pipec (DESIGN.md §1). Each one can be run alone
// with pipec-opt and has lit tests under test/Transforms.
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_PASSES
#define PIPEC_PASSES

include "mlir/Pass/PassBase.td"

def NNAnnotateCostsPass : Pass<"nn-annotate-costs", "mlir::ModuleOp"> {
  let summary = "Attaches #nn.cost (time, bytes) to every nn op of the model.";
  let description = [{
    With `profile=FILE` the forward/backward seconds come from a
    `pipec.profile/1` file written by the runtime profiler (ops matched by
    ONNX node name); otherwise from the analytic roofline model of `device`
    (cpu, v100, a100, h100) using each op's FLOPs and bytes. Byte counts of
    outputs, parameters and saved activations come from the types.
  }];
  let options = [
    Option<"profile", "profile", "std::string", "\"\"", "pipec.profile/1 file with measured times">,
    Option<"device", "device", "std::string", "\"cpu\"", "analytic device model: cpu, v100, a100, h100">,
  ];
  let dependentDialects = ["::pipec::nn::NNDialect"];
}

def PipePlanPass : Pass<"pipe-plan", "mlir::ModuleOp"> {
  let summary = "Chooses pipeline stages and tags every op with its stage.";
  let description = [{
    Linearises the forward graph (ops in topological order are the layers),
    builds a profile from the #nn.cost attributes and calls the planner
    library (lib/Plan). Sets `pipe.stage` on every layer op and
    `pipe.plan = #pipe.plan<...>` on the module.
  }];
  let options = [
    Option<"stages", "stages", "int", "1", "number of pipeline stages">,
    Option<"algorithm", "algorithm", "std::string", "\"balanced\"",
           "balanced, pipedream, dapple, madpipe, twobw, interleaved, exhaustive, auto">,
    Option<"topologyFile", "topology", "std::string", "\"\"",
           "pipec.topology/1 for the papers' planners (default: `stages` devices)">,
    ListOption<"last", "last", "int",
               "a fixed cut: the last layer of every stage (overrides the algorithm)">,
  ];
  let dependentDialects = ["::pipec::pipe::PipeDialect"];
}

def PipeSplitStagesPass : Pass<"pipe-split-stages", "mlir::ModuleOp"> {
  let summary = "Splits the model function into one forward function per stage.";
  let description = [{
    Creates `@sK_fwd` for every stage K with explicit boundary values:
    arguments are model inputs (`pipe.feed`) or tensors produced by an
    earlier stage (`pipe.from = array<i64: stage, result>`); results are
    tensors consumed by later stages or model outputs (`pipe.output`). Weight
    loads and constants are cloned into each stage that uses them; a weight
    used by two stages is an error naming it.
  }];
  let dependentDialects = ["::pipec::pipe::PipeDialect", "::mlir::func::FuncDialect"];
}

def NNAutodiffPass : Pass<"nn-autodiff", "mlir::ModuleOp"> {
  let summary = "Adds the loss, per-stage backward functions and the optimizer update.";
  let description = [{
    On the last stage appends the loss (`loss=cross-entropy`: softmax
    cross-entropy of model output 0 against an int64 labels feed, mean over
    the microbatch; the runtime seeds each microbatch with 1/m so the step
    loss is the global-batch mean; `loss=model`: output 0 already is the
    loss). For every stage builds `@sK_bwd` by reverse-mode differentiation
    (DifferentiableOpInterface): forward values the backward needs become
    extra `@sK_fwd` results stashed per microbatch; weight gradients
    accumulate into `<weight>.grad` globals. Builds `@sK_step` applying the
    optimizer and zeroing the gradients: `sgd`, or ONNX's training operators
    `momentum` / `nesterov` / `adam` / `adagrad` (their state in
    `<weight>.momentum`, `.adam_v`, `.adam_h`, `.adagrad_h` globals; T is the
    number of updates made before this step).
  }];
  let options = [
    Option<"loss", "loss", "std::string", "\"cross-entropy\"", "cross-entropy or model">,
    Option<"optimizer", "optimizer", "std::string", "\"sgd\"",
           "sgd, momentum, nesterov, adam or adagrad">,
    Option<"momentum", "momentum", "double", "0.9", "momentum coefficient (alpha)">,
    Option<"beta1", "beta1", "double", "0.9", "Adam beta1 (alpha)">,
    Option<"beta2", "beta2", "double", "0.999", "Adam beta2 (beta)">,
    Option<"epsilon", "epsilon", "double", "1e-8", "Adam/Adagrad epsilon">,
    Option<"weightDecay", "weight-decay", "double", "0.0",
           "L2 weight decay (ONNX norm_coefficient)">,
  ];
  let dependentDialects = ["::pipec::nn::NNDialect", "::mlir::ml_program::MLProgramDialect"];
}

def PipeRecomputePass : Pass<"pipe-recompute", "mlir::ModuleOp"> {
  let summary = "Activation recomputation: stash less per microbatch, recompute it in the backward.";
  let description = [{
    Runs after `--nn-autodiff`. Per stage, `mode`:
    - `none`: unchanged (the forward's saved results are stashed).
    - `full`: `@sK_fwd` keeps only its outputs; the stash slot holds the
      stage's inputs (and outputs), and `@sK_bwd` starts by re-running the
      forward from the stashed inputs (writes to globals, such as batch-norm
      running statistics, are not repeated; dropout redraws the same mask
      from the stashed random state).
    - `selective`: the outputs of the expensive ops (gemm, matmul, conv) the
      backward needs are still stashed; the cheap, memory-heavy rest
      (elementwise, softmax, normalisation, dropout, reshapes) is recomputed
      from them and the stage inputs.
    The forward the backward re-runs reads the backward's weights: the
    forward's version under weight stashing and for every synchronous
    schedule, so the numbers equal those without recomputation.
    Each changed `@sK_fwd` records `pipe.recompute` (the mode) and
    `pipe.recompute_saved` (the types of the stashed results before, which
    nn-convert-precision converts with the stash).
  }];
  let options = [
    ListOption<"mode", "mode", "std::string",
               "none, full or selective: one for every stage, or one per stage">,
  ];
  let dependentDialects = ["::pipec::nn::NNDialect", "::mlir::ml_program::MLProgramDialect"];
}

def PipeBuildSchedulePass : Pass<"pipe-build-schedule", "mlir::ModuleOp"> {
  let summary = "Materialises the pipeline schedule as one pipe.program per rank.";
  let description = [{
    Synchronous schedules (gpipe, 1f1b-flush, interleaved, zb-h1) use the generators of
    lib/Schedule to emit, per stage, receives, forward/backward runs and
    sends in schedule order (steady state as scf.for loops), then a flush
    and the optimizer step. The continuous schedules emit one window of a
    pipeline that never flushes: `1f1b` (PipeDream, an update after every
    backward, weight stashing by the runtime) and `2bw` (PipeDream-2BW, an
    update per batch of m microbatches, two weight versions; m >= p - 1).
    `interleaved` (Megatron) runs the p*v stages of the plan as v chunks per
    device (stage c*p + r on device r, `chunks=v`; m % p == 0). `zb-h1`
    (zero bubble) splits every backward into an input-gradient half
    (`@sK_bwd`) and a weight-gradient half (`@sK_bwdw`, run by
    `pipe.backward_weight`, deferred into the cool-down). `custom` runs the
    order of a compute-only CSV (`schedule-csv=FILE`, torch's format: one row
    per rank of actions such as `2F0`, `1B3`, `0I1`, `0W1`) as a synchronous
    schedule; a file with I/W actions splits every backward as zb-h1 does.
    The pipe.pipeline verifier then checks matching, deadlock freedom and
    weight versions across all programs.
  }];
  let options = [
    Option<"schedule", "schedule", "std::string", "\"1f1b-flush\"", "gpipe, 1f1b-flush, 1f1b, 2bw, interleaved, zb-h1, zb-h2, zb-v, dualpipev, or custom (with schedule-csv)">,
    Option<"scheduleCsv", "schedule-csv", "std::string", "\"\"",
           "custom: the order per rank from a torch.distributed.pipelining compute-only CSV (stage q on rank q mod p; its stages, chunks and microbatches must match)">,
    Option<"microbatches", "microbatches", "int", "1", "microbatches per step">,
    Option<"chunks", "chunks", "int", "1",
           "interleaved: model chunks v per device (the plan has p*v stages)">,
    Option<"warmup", "warmup", "std::string", "\"A\"",
           "1f1b-flush warm-up policy: A (p-s-1 forwards) or B (2(p-s-1), DAPPLE)">,
    ListOption<"replicas", "replicas", "int",
               "replicas per stage (1F1B-RR, synchronous schedules; default 1 each)">,
    Option<"splitSamples", "split-samples", "int", "0",
           "split replicas (DAPPLE): every replica runs a slice of each microbatch of this many samples (0: 1F1B-RR)">,
  ];
  let dependentDialects = ["::pipec::pipe::PipeDialect", "::mlir::scf::SCFDialect",
                           "::mlir::arith::ArithDialect"];
}

def NNFoldTransposesPass : Pass<"nn-fold-transposes", "mlir::ModuleOp"> {
  let summary = "Reads transposed matrix-product operands in place.";
  let description = [{
    An nn.matmul operand produced by an nn.transpose that swaps only the
    last two dimensions becomes the transpose's input, with `trans_a` /
    `trans_b` set: the kernel (cuBLAS, OpenBLAS) reads the matrices
    transposed instead of a copy being made first. Transposes left without
    users are erased. The differentiation writes dA = dY B^T and
    dB = A^T dY with such transposes, so on attention this removes a copy
    of the [heads, T, T] probabilities per layer and microbatch from the
    backward (and its arena buffer). Runs after nn-autodiff and
    pipe-recompute, before the schedule is built.

    ```mlir
    %t = nn.transpose %p {perm = array<i64: 0, 2, 1>} : tensor<2x8x4xf32> -> tensor<2x4x8xf32>
    %d = nn.matmul %t, %g : (tensor<2x4x8xf32>, tensor<2x8x16xf32>) -> tensor<2x4x16xf32>
    // becomes
    %d = nn.matmul %p, %g {trans_a = true} : (tensor<2x8x4xf32>, tensor<2x8x16xf32>) -> tensor<2x4x16xf32>
    ```
  }];
  let dependentDialects = ["::pipec::nn::NNDialect"];
}

def NNConvertPrecisionPass : Pass<"nn-convert-precision", "mlir::ModuleOp"> {
  let summary = "Turns every f32 tensor of the module into an f64 tensor.";
  let description = [{
    The exact reference mode (`pipec compile --precision f64`): every f32
    tensor type (values, block arguments, function signatures, globals)
    becomes f64 and every f32 tensor literal (weights held as
    `dense_resource` blobs, `nn.constant` values) is widened exactly, so
    that the lowering calls the runtime kernels' float64 twins and the run
    can be compared with a float64 framework to 1e-9. Scalar float
    attributes (epsilon, alpha, ...) keep their f32 type: ONNX stores them
    as float32 and the runtime reads them as double. Integer tensors are
    left alone. Runs after the schedule is built, so that every pass before
    it sees the model's own types, and sets `pipec.precision = "f64"` on
    the module.

    ```mlir
    %y = nn.relu %x : tensor<8x16xf32>   // becomes
    %y = nn.relu %x : tensor<8x16xf64>
    ```
  }];
  let options = [
    Option<"precision", "precision", "std::string", "\"f64\"", "f64; f32 leaves the module as it is; bf16 leaves the types and marks the module (`pipec.precision = \"bf16\"`: the matrix products round their operands to bfloat16)">,
    Option<"activations", "activations", "std::string", "\"f32\"", "with precision=bf16: f32 (the default), or bf16: every float tensor the stage functions produce is stored in bfloat16 (nn.cast after its op and before its readers) except weights, constants, scalars, statistics and weight-gradient sums; messages and stash follow; the ops whose kernels have bf16 variants read and write bf16 themselves; or bf16-casts: the same with every op between casts (the reference form)">,
  ];
}

def PipeVerifySchedulePass : Pass<"pipe-verify-schedule", "mlir::ModuleOp"> {
  let summary = "Checks the pipeline schedule before it runs.";
  let description = [{
    Runs the pipe.pipeline verifier (per-link matching of sends and
    receives, deadlock freedom, one forward and backward per owned
    microbatch, weight versions within the schedule's bound), then checks
    per rank that the peak number of stashed microbatches over a whole run
    fits the program's slots and equals the schedule's closed form
    (lib/Schedule). `report=true` prints one remark per rank.
  }];
  let options = [
    Option<"report", "report", "bool", "false", "one remark per rank with the figures">,
  ];
}

def PipePlanMemoryPass : Pass<"pipe-plan-memory", "mlir::ModuleOp"> {
  let summary = "Lays out every rank's static arena and records its size.";
  let description = [{
    Plans each rank's arena exactly as --pipe-lower-to-runtime does
    (weights with gradient accumulators and optimizer state, stash slots,
    io, scratch), stores the size as `pipe.arena_bytes` on the program and,
    with `report=true`, prints the regions per rank.
  }];
  let options = [
    Option<"report", "report", "bool", "false", "one remark per rank with the regions">,
  ];
  // The arena is planned by the lowering's own code, which makes LLVM types
  // (constants' arrays) while it collects buffers.
  let dependentDialects = ["::mlir::LLVM::LLVMDialect", "::mlir::func::FuncDialect",
                           "::mlir::arith::ArithDialect", "::mlir::scf::SCFDialect"];
}

def PipeLowerToRuntimePass : Pass<"pipe-lower-to-runtime", "mlir::ModuleOp"> {
  let summary = "Lowers one stage to func/llvm calls into the runtime C ABI.";
  let description = [{
    Keeps stage `stage` (and the program of its replica `replica`) only. Assigns every tensor of its functions a static
    offset in the stage arena (microbatch-stashed values get `slots` copies),
    turns every nn op into a call of a runtime kernel (pipec_rt.h) and the
    stage's pipe.program into a function `pipec_program(ctx, arena)` of
    runtime service calls, and adds `main` and the stage description
    `pipec_stage_meta` (JSON). Output: func/scf/arith/llvm ops, ready for the
    standard conversions to the LLVM dialect.
  }];
  let options = [
    Option<"stage", "stage", "int", "0", "the stage to lower">,
    Option<"replica", "replica", "int", "0", "the replica of the stage whose program to lower">,
    Option<"buildId", "build-id", "std::string", "\"dev\"", "build id recorded in the stage description">,
    Option<"target", "target", "std::string", "\"cpu\"", "cpu, or cuda (CUDA kernels, arena in GPU memory)">,
  ];
  let dependentDialects = ["::mlir::LLVM::LLVMDialect", "::mlir::func::FuncDialect",
                           "::mlir::arith::ArithDialect", "::mlir::scf::SCFDialect"];
}

#endif // PIPEC_PASSES
