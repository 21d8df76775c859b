//===- PipeOps.td - the pipe dialect -----------------------*- tablegen -*-===//
//
// The parallel structure made explicit (DESIGN.md §3): the plan, and one
// static schedule program per pipeline rank whose ops move boundary tensors
// (send/recv) and run stage functions (forward/backward/step).
//
//===----------------------------------------------------------------------===//
#ifndef PIPEC_PIPE_OPS
#define PIPEC_PIPE_OPS

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/RegionKindInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Pipe_Dialect : Dialect {
  let name = "pipe";
  let cppNamespace = "::pipec::pipe";
  let summary = "Pipeline stages, schedules and their communication.";
  let description = [{
    `pipe` describes how an nn model runs as a pipeline: `#pipe.plan` records
    the stage split; stage functions (`@sK_fwd`, `@sK_bwd`, `@sK_step`) are
    ordinary `func.func`s; `pipe.pipeline` holds one `pipe.program` per rank
    whose ops are the static schedule. The verifier of `pipe.pipeline`
    checks, across programs, that every send has exactly one matching receive
    of the same type in the same order per link and that the programs cannot
    deadlock.
  }];
  let useDefaultAttributePrinterParser = 1;
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::scf::SCFDialect"];
}

def Pipe_PlanAttr : AttrDef<Pipe_Dialect, "Plan"> {
  let mnemonic = "plan";
  let summary = "The pipeline plan: stage layer ranges, replicas, prediction.";
  let description = [{
    `first` / `last` are the inclusive layer (op) index ranges of the stages
    in the linearised forward graph; `replicas` the replica count of each
    stage. `predicted_iteration_s` is the planner's estimate.

    ```mlir
    module attributes {pipe.plan = #pipe.plan<algorithm = "balanced", first = [0, 4],
        last = [3, 7], replicas = [1, 1], predicted_iteration_s = 1.0e-3>} {}
    ```
  }];
  let parameters = (ins "::mlir::StringAttr":$algorithm,
                        "::mlir::DenseI64ArrayAttr":$first,
                        "::mlir::DenseI64ArrayAttr":$last,
                        "::mlir::DenseI64ArrayAttr":$replicas,
                        APFloatParameter<"predicted seconds per iteration">:$predicted_iteration_s);
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

class Pipe_Op<string mnemonic, list<Trait> traits = []>
    : Op<Pipe_Dialect, mnemonic, traits>;

def Pipe_PipelineOp : Pipe_Op<"pipeline", [NoTerminator, SingleBlock,
    NoRegionArguments, IsolatedFromAbove]> {
  let summary = "The set of rank programs of one pipeline.";
  let description = [{
    Holds one `pipe.program` per rank. `microbatches` is the number of
    microbatches per step. `placement "v"` places the 2p stages of a
    p-position pipeline in a V (position r runs stages r and 2p-1-r: zb-v);
    without it stage q runs on position q mod p. Its verifier symbolically
    executes all programs together (loops expanded) and checks the
    communication.

    ```mlir
    pipe.pipeline microbatches 4 {
      pipe.program "rank0" stage 0 slots 2 { ... }
      pipe.program "rank1" stage 1 slots 1 { ... }
    }
    ```
  }];
  let arguments = (ins I64Attr:$microbatches, StrAttr:$schedule,
                       OptionalAttr<I64Attr>:$split_samples,
                       OptionalAttr<StrAttr>:$placement);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "`microbatches` $microbatches `schedule` $schedule (`split_samples` $split_samples^)? (`placement` $placement^)? attr-dict-with-keyword $body";
  let hasRegionVerifier = 1;
}

def Pipe_ProgramOp : Pipe_Op<"program", [NoTerminator, SingleBlock,
    NoRegionArguments, HasParent<"PipelineOp">]> {
  let summary = "The static per-step schedule of one rank.";
  let description = [{
    Runs once per training step on the rank that executes pipeline stage
    `stage`. For the synchronous schedules every microbatch index lies in
    [0, microbatches). For the continuous schedules (`1f1b`, `2bw`) the
    program is one window of a pipeline that never flushes: step n runs
    global microbatch n*m + i for index i, an index may be negative (a
    backward of a microbatch whose forward ran in an earlier step), ops on
    microbatches outside the run (before the first or after the last) are
    skipped, and one extra window after the last step drains the pipeline. The body uses `scf.for` for the steady state so its size does
    not grow with the microbatch count. `slots` is the number of microbatch
    activation stash slots the stage needs (its peak in-flight count).

    A stage with r > 1 replicas has one program per replica (1F1B-RR,
    pipedream.md §3): replica j runs microbatches j, j + r, j + 2r, ...,
    local microbatch k / r uses slot (k / r) mod slots, a message to a
    replicated stage goes to the replica that owns its microbatch, and
    `pipe.allreduce` sums the gradients of the replicas before the update.

    When the pipeline has `split_samples b` (DAPPLE, dapple.md §4), every
    replica runs every microbatch instead, on its slice of the b samples:
    replica j of r holds samples [floor(j*b/r), floor((j+1)*b/r)); a
    message goes to every replica of the peer stage whose slice overlaps
    the sender's (the overlapping rows), slot k mod slots holds microbatch
    k, and `pipe.allreduce` sums the slices' gradients.
  }];
  let arguments = (ins StrAttr:$rank_name, I64Attr:$stage,
                       DefaultValuedAttr<I64Attr, "0">:$replica,
                       I64Attr:$slots);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$rank_name `stage` $stage (`replica` $replica^)? `slots` $slots attr-dict-with-keyword $body";
  let hasVerifier = 1;
}

class Pipe_CommOp<string mnemonic> : Pipe_Op<mnemonic,
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>,
     MemoryEffects<[MemRead, MemWrite]>]> {
  let arguments = (ins Index:$microbatch, I64Attr:$peer, I64Attr:$channel,
                       FlatSymbolRefAttr:$func, I64Attr:$index, TypeAttr:$type);
}

def Pipe_SendOp : Pipe_CommOp<"send"> {
  let summary = "Sends a stage-function result of a microbatch to another stage.";
  let description = [{
    Sends result `index` of `func` computed for `microbatch` to stage `peer`
    on logical channel `channel`. Non-blocking: the data is copied.

    ```mlir
    pipe.send %mb to 1 channel 0 from @s0_fwd[0] : tensor<8x256xf32>
    ```
  }];
  let assemblyFormat = "$microbatch `to` $peer `channel` $channel `from` $func `[` $index `]` attr-dict `:` $type";
}

def Pipe_RecvOp : Pipe_CommOp<"recv"> {
  let summary = "Receives a stage-function argument of a microbatch from another stage.";
  let description = [{
    Receives argument `index` of `func` for `microbatch` from stage `peer` on
    channel `channel`. Blocks until the data has arrived.

    ```mlir
    pipe.recv %mb from 0 channel 0 into @s1_fwd[0] : tensor<8x256xf32>
    ```
  }];
  let assemblyFormat = "$microbatch `from` $peer `channel` $channel `into` $func `[` $index `]` attr-dict `:` $type";
}

class Pipe_RunOp<string mnemonic, string what> : Pipe_Op<mnemonic,
    [DeclareOpInterfaceMethods<SymbolUserOpInterface>,
     MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "Runs the " # what # " stage function on one microbatch.";
  let arguments = (ins FlatSymbolRefAttr:$func, Index:$microbatch);
  let assemblyFormat = "$func `mb` $microbatch attr-dict";
}

def Pipe_ForwardOp : Pipe_RunOp<"forward", "forward"> {
  let description = [{
    Runs `func` on the microbatch's stash slot: arguments marked
    `pipe.feed` are filled from the data feed first; a result marked
    `pipe.loss` is reported to the runtime afterwards.

    ```mlir
    pipe.forward @s0_fwd mb %mb
    ```
  }];
}

def Pipe_BackwardOp : Pipe_RunOp<"backward", "backward"> {
  let description = [{
    Runs `func` for the microbatch: arguments marked `pipe.fwd_arg` /
    `pipe.fwd_result` read the microbatch's stash slot, an argument marked
    `pipe.loss_seed` receives dL/dloss from the runtime; weight gradients
    accumulate into the gradient globals.

    ```mlir
    pipe.backward @s0_bwd mb %mb
    ```
  }];
}

def Pipe_BackwardWeightOp : Pipe_RunOp<"backward_weight", "weight-gradient half of the backward"> {
  let description = [{
    Zero-bubble schedules (`zb-h1`) split a stage's backward in two:
    `pipe.backward` computes the input gradients the previous stage waits
    for and carries the values the weight gradients need in the
    microbatch's stash slot; `pipe.backward_weight` runs `@sK_bwdw` later
    and accumulates the weight gradients.

    ```mlir
    pipe.backward_weight @s0_bwdw mb %mb
    ```
  }];
}

def Pipe_FlushOp : Pipe_Op<"flush", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "Waits for every outstanding send of this step.";
  let description = [{
    ```mlir
    pipe.flush
    ```
  }];
  let assemblyFormat = "attr-dict";
}

def Pipe_AllReduceOp : Pipe_Op<"allreduce", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "Sums (or averages) the accumulated gradients over the stage's replicas.";
  let description = [{
    Runs on every replica of a replicated stage before its `pipe.step`:
    afterwards each replica holds the sum of all replicas' gradient
    accumulators, i.e. the gradient of the whole batch, so the replicas
    apply the same update (synchronous data parallelism within the stage).

    With `mean`, the replicas hold the average instead: PipeDream's 1F1B-RR
    (`1f1b` with replicas), where every microbatch is a minibatch and a
    replicated stage applies the mean of its replicas' minibatch gradients
    in one update, as data parallelism does.

    In the continuous schedules the all-reduce follows the backward of a
    microbatch (`after %mb`) and is skipped with it when the microbatch
    lies outside the run; every replica skips the same ones (each runs
    one microbatch of every round of r).

    ```mlir
    pipe.allreduce
    pipe.allreduce after %mb {mean}
    ```
  }];
  let arguments = (ins Optional<Index>:$microbatch, UnitAttr:$mean);
  let assemblyFormat = "(`after` $microbatch^)? attr-dict";
}

def Pipe_TieReduceOp : Pipe_Op<"tie_reduce", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "Sums the gradients of weights shared by several stages.";
  let description = [{
    A parameter read by layers of several stages (tied embeddings: a GPT's
    token embedding and its output projection) has a copy on every stage
    that reads it. Before their updates, every rank of those stages (all
    their replicas) sums its gradient accumulators of the listed weights
    with the others', so every copy applies the same update and the copies
    stay equal (Megatron-LM's embedding all-reduce). The stage-replica
    `pipe.allreduce` leaves these weights out. Synchronous schedules only;
    `stages` are device positions (with the interleaved schedule, the
    devices of the tied virtual stages).

    ```mlir
    pipe.tie_reduce [@wte] over stages [0, 3]
    ```
  }];
  let arguments = (ins SymbolRefArrayAttr:$weights, DenseI64ArrayAttr:$stages);
  let assemblyFormat = "$weights `over` `stages` $stages attr-dict";
  let hasVerifier = 1;
}

def Pipe_StepOp : Pipe_Op<"step", [DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "Applies the optimizer update of the stage.";
  let description = [{
    Calls the stage's update function (`@sK_step`), which reads the
    accumulated gradients, updates the weights and zeroes the gradients.

    In the continuous schedules (`1f1b`, `2bw`) the update follows the
    backward of a given microbatch (`after %mb`, an index relative to the
    step like every microbatch operand) and is skipped, like that backward,
    when the microbatch lies outside the run. The runtime keeps the weight
    versions that in-flight microbatches still need before the update
    overwrites the live weights (PipeDream weight stashing; 2BW's shadow
    version).

    ```mlir
    pipe.step @s0_step
    pipe.step @s0_step after %mb
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$func, Optional<Index>:$microbatch);
  let assemblyFormat = "$func (`after` $microbatch^)? attr-dict";
}

#endif // PIPEC_PIPE_OPS
