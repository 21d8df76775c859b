#!/usr/bin/python3
"""Times the kernels of one GPT-3 175B layer as Megatron runs it on one GPU
of an 8-way tensor-parallel group, and writes them as a pipec profile, so
that the GPT-3 anchor (bench/plan_quality.cpp) can take its kernel
efficiencies from a measurement instead of datasheet peaks.

    python3 bench/gpt3_layer_kernels.py --out profile.json     (GPU machine)
    /usr/bin/python3 bench/gpt3_layer_kernels.py --dry-run     (anywhere)
    python3 bench/gpt3_layer_kernels.py --check-on-cpu 64      (with PyTorch)

The layer is examples/profiles/make_profiles.py's transformer_layer with
GPT-3's sizes (microbatch 1, sequence 2048, h = 12288, 96 heads, t = 8: 12
heads of 128, the MLP's 6144 columns per GPU): its thirteen primitives
(two layer norms, four GEMMs, two attention products, softmax, dropout,
GeLU, two residual additions), each timed forward and backward (the
additions forward only: measures_backward) in PyTorch eager in bfloat16
with CUDA events, GPU time only, the median of --repeats after --warmup.
The primitives' FLOPs and bytes are make_profiles.py's own (imported, not
restated), so that `pipec calibrate` fits exactly the
counts make_profiles.py --measured applies the fit to:

    pipec calibrate profile.json --device h200-bf16 --name NAME \
        -o examples/devices/NAME.json        (the measuring GPU's row)
    make_profiles.py --measured examples/devices/NAME.json \
        --only gpt3-175b-tp8.json -o examples/profiles/gpt3-175b-tp8-measured.json
    build/bench/plan_quality . examples/profiles/gpt3-175b-tp8-measured.json

What PyTorch eager runs is close to, not the same as, Megatron's kernels:
the GEMMs are cuBLAS's in both; Megatron fuses scale, mask and softmax,
bias and GeLU, and bias, dropout and the residual addition, where eager
runs softmax alone, GeLU alone and two additions (so the memory-bound
primitives here are, if anything, slower than Megatron's). A product's
backward is two GEMMs (and, for qkv and fc1, PyTorch's bias-gradient sum)
timed as one op, so the fit gives it one launch overhead where
make_profiles.py --measured charges one per kernel: some microseconds
against GEMMs of 0.1-1 ms here. The efficiencies are the measuring GPU's (an H100 or H200); plan_quality's
anchor is an A100, so the shares of peak are moved to another GPU
(MeasuredDevice in make_profiles.py says how).
"""

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "profiles"))
import make_profiles  # noqa: E402  (the FLOP and byte counts)

B, S, H, HEADS, TP = 1, 2048, 12288, 96, 8


def primitives():
    """(name, kind, forward kernels, backward kernels) in
    transformer_layer's order, with make_profiles' (flops, bytes, kind)."""
    layer = make_profiles.Layer("layer", "transformer", 2)
    make_profiles.transformer_layer(layer, B, S, H, HEADS, TP,
                                    make_profiles.NVSWITCH_A100_BW,
                                    make_profiles.NVSWITCH_LATENCY)
    # name, kind, backward kernels (a product has two: input and weight
    # or both operands' gradients).
    order = [("ln1", "layer_norm", 1), ("qkv", "matmul", 2),
             ("scores", "matmul", 2), ("softmax", "softmax", 1),
             ("attn_dropout", "dropout", 1), ("context", "matmul", 2),
             ("proj", "matmul", 2), ("residual1", "add", 1),
             ("ln2", "layer_norm", 1), ("fc1", "matmul", 2),
             ("gelu", "gelu", 1), ("fc2", "matmul", 2),
             ("residual2", "add", 1)]
    if len(layer.fwd) != len(order) or \
            len(layer.bwd) != sum(n for _, _, n in order):
        raise SystemExit("make_profiles.transformer_layer changed: %d forward "
                         "and %d backward kernels, this script knows %d and %d"
                         % (len(layer.fwd), len(layer.bwd), len(order),
                            sum(n for _, _, n in order)))
    out, b = [], 0
    for i, (name, kind, nb) in enumerate(order):
        fwd, bwd = [layer.fwd[i]], layer.bwd[b:b + nb]
        b += nb
        for k in fwd + bwd:
            if k[2] != kind:
                raise SystemExit("%s: make_profiles says %s, this script %s"
                                 % (name, k[2], kind))
        out.append((name, kind, fwd, bwd))
    return out


def torch_ops(torch, dev="cuda", dtype=None, S=S):
    """name -> (make inputs, forward) on `dev` in `dtype` (bfloat16 unless
    given), at sequence length S (--check-on-cpu shortens it)."""
    F = torch.nn.functional
    bf = dtype or torch.bfloat16
    a, d, hd = HEADS // TP, H // HEADS, 4 * H // TP

    def t(*shape, grad=True):
        x = torch.randn(*shape, device=dev, dtype=bf) * 0.02
        return x.requires_grad_(grad)

    def linear(rows, cols_in, cols_out, bias):
        return lambda: (t(rows, cols_in), t(cols_out, cols_in),
                        t(cols_out) if bias else None)

    layer_norm = (lambda: (t(S, H), t(H), t(H)),
                  lambda x, w, b: F.layer_norm(x, (H,), w, b))
    residual = (lambda: (t(S, H), t(S, H), t(S, H)),
                lambda x, y, z: x + y + z)
    return {
        "ln1": layer_norm,
        "qkv": (linear(S, H, 3 * H // TP, True), F.linear),
        "scores": (lambda: (t(B * a, S, d), t(B * a, d, S)), torch.bmm),
        "softmax": (lambda: (t(B * a, S, S),),
                    lambda x: torch.softmax(x, dim=-1)),
        "attn_dropout": (lambda: (t(B * a, S, S),),
                         lambda x: F.dropout(x, 0.1, training=True)),
        "context": (lambda: (t(B * a, S, S), t(B * a, S, d)), torch.bmm),
        "proj": (linear(S, H // TP, H, False), F.linear),
        "residual1": residual,
        "ln2": layer_norm,
        "fc1": (linear(S, H, hd, True), F.linear),
        "gelu": (lambda: (t(S, hd),), lambda x: F.gelu(x, approximate="tanh")),
        "fc2": (linear(S, hd, H, False), F.linear),
        "residual2": residual,
    }


def time_op(torch, make, forward, warmup, repeats, backward=True):
    """Median forward and backward seconds of one primitive, GPU time only:
    a sleeping kernel queued ahead of each repetition keeps the GPU busy
    while the host launches the forward and the backward, so neither
    event waits for the host. The backward is torch.autograd.grad on the
    inputs (no accumulation into .grad, which would add copies)."""
    args = make()  # the forward's arguments (a bias may be None)
    leaves = [x for x in args if x is not None]
    with torch.no_grad():
        dy = torch.ones_like(forward(*args))
    fwd, bwd = [], []
    for i in range(warmup + repeats):
        start, mid, end = (torch.cuda.Event(enable_timing=True)
                           for _ in range(3))
        torch.cuda._sleep(50_000_000)  # some 25 ms of queue ahead
        start.record()
        y = forward(*args)
        mid.record()
        if backward:
            torch.autograd.grad(y, leaves, dy)
        end.record()
        torch.cuda.synchronize()
        del y
        if i >= warmup:
            fwd.append(start.elapsed_time(mid) / 1e3)
            bwd.append(mid.elapsed_time(end) / 1e3)
    return statistics.median(fwd), (statistics.median(bwd) if backward
                                     else 0.0)


def measures_backward(kind):
    """The residual additions' backward hands the gradient on unchanged (no
    kernel in PyTorch; Megatron's fused bias-dropout-add applies the
    mask): only their forward is measured, and the fit's `add` line, from
    the forwards, costs make_profiles.py's backward."""
    return kind != "add"


def profile_ops(name, kind, fwd, bwd, fwd_s, bwd_s):
    """The primitive's forward and backward as two ops of the profile, each
    with its time as `fwd_s` and its own FLOPs and bytes: `pipec calibrate`
    reads an op's backward as twice its forward bytes, while
    make_profiles.py counts an element-wise backward's bytes as one tensor
    more than its forward's; as two ops the fit sees make_profiles.py's
    counts."""
    def op(phase, kernels, seconds):
        return {"name": name + "." + phase, "op": kind, "fwd_s": seconds,
                "bwd_s": 0.0, "out_bytes": 0, "param_bytes": 0,
                "saved_bytes": 0, "fwd_flops": sum(k[0] for k in kernels),
                "bwd_flops": 0.0, "bytes": sum(k[1] for k in kernels)}
    return [op("forward", fwd, fwd_s)] + (
        [op("backward", bwd, bwd_s)] if measures_backward(kind) else [])


def check_on_cpu(torch, seq):
    """Every primitive's inputs, forward and backward once on the CPU in
    float32 at sequence length `seq` (GPT-3's widths): the shapes and the
    autograd calls that the GPU run times, checked where there is no GPU.
    Returns the number of failures."""
    torch.manual_seed(0)
    failures = 0
    for name, (make, forward) in torch_ops(torch, "cpu", torch.float32,
                                           seq).items():
        try:
            args = make()
            leaves = [x for x in args if x is not None]
            y = forward(*args)
            grads = torch.autograd.grad(y, leaves, torch.ones_like(y))
            bad = [i for i, (g, x) in enumerate(zip(grads, leaves))
                   if g is None or g.shape != x.shape or
                   not bool(torch.isfinite(g).all())]
            if bad or not bool(torch.isfinite(y).all()):
                raise ValueError("gradients of inputs %s missing, misshapen "
                                 "or not finite" % bad)
            print("%-13s ok: output %s" % (name, tuple(y.shape)))
        except Exception as e:  # noqa: BLE001 - every failure is reported
            failures += 1
            print("%-13s FAILED: %s: %s" % (name, type(e).__name__, e))
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="the pipec.profile/1 to write")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dry-run", action="store_true",
                        help="list the primitives and their counts; no GPU")
    parser.add_argument("--check-on-cpu", type=int, metavar="SEQ",
                        help="run each primitive's forward and backward once "
                             "on the CPU (float32, sequence SEQ), no timing")
    parser.add_argument("--skip-status", type=int, default=0,
                        help="exit status when skipped for want of PyTorch "
                             "(ctest's SKIP_RETURN_CODE)")
    args = parser.parse_args()
    prims = primitives()
    if args.check_on_cpu:
        try:
            import torch
        except ImportError:
            print("skipped: no PyTorch here")
            return args.skip_status
        missing = {name for name, _, _, _ in prims} - set(torch_ops(torch))
        if missing:
            print("no PyTorch op for %s" % sorted(missing))
            return 1
        failures = check_on_cpu(torch, args.check_on_cpu)
        print("%d passed, %d failed" % (len(prims) - failures, failures))
        return 1 if failures else 0
    if args.dry_run:
        for name, kind, fwd, bwd in prims:
            print("%-13s %-10s fwd %9.3f GFLOP %8.1f MB  bwd %9.3f GFLOP "
                  "(%d kernels)" % (name, kind, sum(k[0] for k in fwd) / 1e9,
                                    sum(k[1] for k in fwd) / 1e6,
                                    sum(k[0] for k in bwd) / 1e9, len(bwd)))
        return 0
    if not args.out:
        parser.error("--out is needed (or --dry-run)")
    try:
        import torch
    except ImportError:
        print("skipped: no PyTorch here (the GPU machine has it)")
        return 0
    if not torch.cuda.is_available():
        print("skipped: no GPU")
        return 0
    ops_by_name = torch_ops(torch)
    ops, failed = [], []
    doc = {"format": "pipec.profile/1",
           "device": "cuda:0 (%s)" % torch.cuda.get_device_name(0),
           "timing": "device-queue", "microbatch": B,
           "note": "One GPT-3 175B layer on one GPU of a t = 8 group "
                   "(bench/gpt3_layer_kernels.py): PyTorch %s eager, "
                   "bfloat16, CUDA events, median of %d." %
                   (torch.__version__, args.repeats),
           "ops": ops}
    for name, kind, fwd, bwd in prims:
        make, forward = ops_by_name[name]
        backward = measures_backward(kind)
        # One primitive's failure (out of memory, a library error) costs
        # that primitive only; the profile is rewritten after each, so a
        # time limit keeps what was measured.
        try:
            fwd_s, bwd_s = time_op(torch, make, forward, args.warmup,
                                   args.repeats, backward)
        except Exception as e:  # noqa: BLE001 - reported, the rest goes on
            failed.append(name)
            print("%-13s %-10s FAILED: %s: %s" % (name, kind,
                                                  type(e).__name__,
                                                  str(e)[:300]), flush=True)
            torch.cuda.empty_cache()
            continue
        ops += profile_ops(name, kind, fwd, bwd, fwd_s, bwd_s)
        print("%-13s %-10s fwd %8.1f us  bwd %s" %
              (name, kind, fwd_s * 1e6,
               "%8.1f us" % (bwd_s * 1e6) if backward else "not measured"),
              flush=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        torch.cuda.empty_cache()
    if failed:
        print("not measured: %s; %s holds the others" %
              (", ".join(failed), args.out))
        return 1
    total = sum(o["fwd_s"] for o in ops)
    name = torch.cuda.get_device_name(0)
    row = next((r for gpu, r in (("H200", "h200-bf16"), ("H100", "h100-bf16"),
                                 ("A100", "a100-80gb-fp16"))
                if gpu in name), None)
    print("wrote %s: %.2f ms per layer forward and backward; calibrate it "
          "against %s" % (args.out, total * 1e3,
                          "the %s row (pipec calibrate %s --device %s)" %
                          (row, args.out, row) if row else
                          "this GPU's datasheet row (%s has none)" % name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
