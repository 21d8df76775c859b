#!/usr/bin/python3
"""GPU end-to-end suite: models trained by `--target cuda` stage executables
against the CPU run of the same compile.

Two halves, because the GPU machine has no compiler (no MLIR/LLVM) and the
build machine has no GPU:

  gpu_e2e.py prepare --pipec build/bin/pipec --bundle .gpu-bundle
      (build machine) compiles every case twice (--target cpu and cuda),
      trains the CPU build here and keeps its losses and final weights, and
      puts the CUDA run folders (stage executables, manifest, weights, data)
      and cases.json into the bundle.
  gpu_e2e.py run --bundle .gpu-bundle --mpirun mpirun
      (GPU machine) launches every CUDA case with mpirun (all ranks share
      the machine's GPUs: rank r uses GPU local_rank mod visible GPUs) and
      checks: every step's loss within 1e-4 (relative) of the CPU run, the
      final weights within 1e-4 (relative norm per tensor), a CPU
      checkpoint resumed on the GPU and a GPU one on the CPU, a NaN loss
      stopping the job with pipec's message, a killed rank ending the job
      with the rank named, the trace, builds run again with
      --check-kernels, --cuda-graphs and PIPEC_CUDNN_DETERMINISTIC=0, the
      feeds filled ahead, and the transports bit for bit against the
      default run (host-staged, CUDA IPC with posted receives, NCCL's sums
      and NCCL's messages across ranks given hosts of their own by
      NCCL_HOSTID). Prints one PASS/FAIL line per check and
      `N passed, M failed`.

scripts/test-gpu.sh runs both halves.
"""
import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "test", "e2e"))
from e2e_common import Checks, run  # noqa: E402

TOL = 1e-4
STEPS = 5

GPT_SMALL = ["--batch", "4", "--seq", "16", "--layers", "2", "--dim", "32", "--heads", "2", "--vocab", "64"]
GPT_MID = ["--batch", "8", "--seq", "64", "--layers", "4", "--dim", "128", "--heads", "4", "--vocab", "256"]
MODELS = {
    # name: (generator, its flags, lr, uses data files)
    "mlp": ("examples/mlp/make_mlp.py", ["--hidden", "64,32,16"], 0.1, False),
    # Eight layers for the V schedules on 4 ranks (2p stages), with 256 KiB
    # messages (microbatch 256 x 256 floats).
    "mlp-wide": ("examples/mlp/make_mlp.py", ["--hidden", "256,256,256,256,256,256,256",
                                              "--batch", "2048"], 0.05, False),
    "gpt": ("examples/gpt/make_gpt.py", GPT_SMALL, 0.1, True),
    "gpt-padmask": ("examples/gpt/make_gpt.py", GPT_SMALL + ["--padding-mask"], 0.1, True),
    "gpt-mid": ("examples/gpt/make_gpt.py", GPT_MID, 0.05, True),
    "resnet": ("examples/resnet/make_resnet.py", ["--batch", "8", "--width", "8", "--blocks", "1"], 0.05, True),
    "vgg": ("examples/vgg/make_vgg.py", ["--batch", "8"], 0.05, True),
    # VGG with its MaxPools replaced by AveragePools of the same shape (the
    # control for max pooling).
    "vgg-avg": ("examples/vgg/make_vgg.py", ["--batch", "8"], 0.05, True),
}

# (case name, model, compile flags)
CASES = [
    ("mlp-s1-gpipe", "mlp", ["--stages", "1", "--microbatches", "4", "--schedule", "gpipe"]),
    ("mlp-s2-1f1b-flush", "mlp", ["--stages", "2", "--microbatches", "4"]),
    ("mlp-s4-gpipe", "mlp", ["--stages", "4", "--microbatches", "4", "--schedule", "gpipe"]),
    ("mlp-s4-1f1b-flush-B", "mlp", ["--stages", "4", "--microbatches", "8", "--warmup", "B"]),
    ("mlp-s4-1f1b", "mlp", ["--stages", "4", "--microbatches", "4", "--schedule", "1f1b"]),
    ("mlp-s4-2bw", "mlp", ["--stages", "4", "--microbatches", "4", "--schedule", "2bw"]),
    ("mlp-s4-zb-h1", "mlp", ["--stages", "4", "--microbatches", "4", "--schedule", "zb-h1"]),
    ("mlp-s4-zb-h2", "mlp", ["--stages", "4", "--microbatches", "8", "--schedule", "zb-h2"]),
    ("mlp-s2-interleaved", "mlp", ["--stages", "2", "--microbatches", "4", "--schedule", "interleaved",
                                   "--chunks", "2"]),
    ("mlp-s2-zb-v", "mlp", ["--stages", "2", "--microbatches", "4", "--schedule", "zb-v"]),
    ("mlp-s2-dualpipev", "mlp", ["--stages", "2", "--microbatches", "4", "--schedule", "dualpipev"]),
    ("mlp-wide-s4-dualpipev", "mlp-wide", ["--stages", "4", "--microbatches", "8",
                                           "--schedule", "dualpipev"]),
    ("mlp-wide-s4-interleaved", "mlp-wide", ["--stages", "4", "--microbatches", "8",
                                             "--schedule", "interleaved", "--chunks", "2"]),
    ("mlp-s2-rr-replicas", "mlp", ["--stages", "2", "--microbatches", "4", "--replicas", "2,1"]),
    ("mlp-s2-split-replicas", "mlp", ["--stages", "2", "--microbatches", "4", "--replicas", "2,1",
                                      "--replica-mode", "split"]),
    ("mlp-s2-adam", "mlp", ["--stages", "2", "--microbatches", "4", "--optimizer", "adam"]),
    ("mlp-s2-momentum", "mlp", ["--stages", "2", "--microbatches", "4", "--optimizer", "momentum"]),
    ("mlp-s2-adagrad", "mlp", ["--stages", "2", "--microbatches", "4", "--optimizer", "adagrad"]),
    ("gpt-s1", "gpt", ["--stages", "1", "--microbatches", "2"]),
    ("gpt-s2-1f1b-flush", "gpt", ["--stages", "2", "--microbatches", "4"]),
    ("gpt-s4-1f1b-flush", "gpt", ["--stages", "4", "--microbatches", "4"]),
    ("gpt-s2-zb-h1", "gpt", ["--stages", "2", "--microbatches", "4", "--schedule", "zb-h1"]),
    ("gpt-s2-zb-h2", "gpt", ["--stages", "2", "--microbatches", "4", "--schedule", "zb-h2"]),
    ("gpt-s2-1f1b", "gpt", ["--stages", "2", "--microbatches", "4", "--schedule", "1f1b"]),
    ("gpt-s2-2bw", "gpt", ["--stages", "2", "--microbatches", "4", "--schedule", "2bw"]),
    ("gpt-s2-adam", "gpt", ["--stages", "2", "--microbatches", "4", "--optimizer", "adam"]),
    ("gpt-padmask-s2", "gpt-padmask", ["--stages", "2", "--microbatches", "4"]),
    ("gpt-mid-s4", "gpt-mid", ["--stages", "4", "--microbatches", "4"]),
    ("resnet-s1", "resnet", ["--stages", "1", "--microbatches", "2"]),
    ("resnet-s2-1f1b-flush", "resnet", ["--stages", "2", "--microbatches", "4"]),
    ("resnet-s4-1f1b-flush", "resnet", ["--stages", "4", "--microbatches", "4"]),
    ("resnet-s2-zb-h1", "resnet", ["--stages", "2", "--microbatches", "4", "--schedule", "zb-h1"]),
    ("resnet-s2-adam", "resnet", ["--stages", "2", "--microbatches", "4", "--optimizer", "adam"]),
    # VGG (ReLU then MaxPool): its GPU run is compared one step at a time.
    # One window of this data has its maximum pre-activation 7e-7 above
    # zero, inside float32 rounding of the convolution: the GPU's sum lands
    # on the other side of the ReLU's kink, that window's gradient goes
    # nowhere, and the conv biases upstream part by 4-6e-3 from the CPU
    # run (float64 backprop with that one window dropped reproduces each
    # tensor's error to two digits; runtime/README.md, "CUDA"). So the plain
    # runs compare the step's loss, and the weights are compared in the
    # --check-kernels run (CHECK_CASES), where every call starts from the
    # CPU's bytes.
    ("vgg-s1-1step", "vgg", ["--stages", "1", "--microbatches", "1"]),
    ("vgg-s2-1step", "vgg", ["--stages", "2", "--microbatches", "4"]),
    ("vgg-s4-gpipe-1step", "vgg", ["--stages", "4", "--microbatches", "4", "--schedule", "gpipe"]),
    # The same network with AveragePool (no kink under the pooling): five
    # steps against the CPU like the other models.
    ("vgg-avg-s2", "vgg-avg", ["--stages", "2", "--microbatches", "4"]),
    # --precision bf16: the matrix products round their operands to
    # bfloat16 (float32 accumulation, everything else float32), against the
    # CPU build of the same compile, whose kernels round the same way
    # (cpu/matmul_bf16.cpp).
    ("gpt-s1-bf16", "gpt", ["--stages", "1", "--microbatches", "2", "--precision", "bf16"]),
    ("gpt-s2-bf16", "gpt", ["--stages", "2", "--microbatches", "4", "--precision", "bf16"]),
    ("resnet-s2-bf16", "resnet", ["--stages", "2", "--microbatches", "4", "--precision", "bf16"]),
    # --activations bf16: every activation, message and stash slot in
    # bfloat16 (nn.cast around float32 kernels), against the CPU build.
    ("gpt-s2-act-bf16", "gpt", ["--stages", "2", "--microbatches", "4", "--precision", "bf16",
                                "--activations", "bf16"]),
    ("resnet-s2-act-bf16", "resnet", ["--stages", "2", "--microbatches", "4", "--precision", "bf16",
                                      "--activations", "bf16"]),
]
# A bf16 run on the GPU against the CPU's emulation: the products are exact
# in float32 on both, but the GPU sums them on the tensor cores, whose
# float32 accumulation is not the CPU's round-to-nearest, and an operand
# near a bfloat16 rounding boundary may round to the other side on one of
# them (a 2^-8 step). Measured on an H200 (runtime/README.md, "CUDA"):
# losses 1.0e-5 (GPT) and 1.4e-4 (ResNet) apart, weight matrices at most
# 6e-4, one-dimensional tensors (biases, norm parameters, near zero after
# five steps, so their relative error is inflated) up to 8.4e-2 (a batch
# norm bias). Tolerances: 1e-3, and 2e-1 for one-dimensional tensors.
BF16_TOL = 1e-3
BF16_VECTOR_TOL = 2e-1


def case_tol(name):
    return BF16_TOL if name.endswith("-bf16") else TOL


# Cases trained for other than STEPS steps.
CASE_STEPS = {"vgg-s1-1step": 1, "vgg-s2-1step": 1, "vgg-s4-gpipe-1step": 1}
# The cases whose final weights (and optimizer state) are compared too; the
# others compare every step's loss (what a call may carry to the GPU
# machine is limited to 64 MiB).
WEIGHT_CHECKS = {"mlp-s2-1f1b-flush", "mlp-s4-1f1b", "mlp-s4-2bw", "mlp-s2-adam", "mlp-s2-rr-replicas",
                 "gpt-s2-1f1b-flush", "gpt-s2-adam", "gpt-s4-1f1b-flush", "resnet-s2-1f1b-flush",
                 "resnet-s2-adam", "vgg-avg-s2", "gpt-s2-bf16", "resnet-s2-bf16"}
# The cases run once more with every kernel call checked against the CPU
# kernel on the same bytes (libpipec_rt_cuda_check.so, `--check-kernels`).
CHECK_CASES = ["vgg-s1-1step", "vgg-s2-1step", "vgg-s4-gpipe-1step", "resnet-s2-1f1b-flush",
               "gpt-s2-1f1b-flush"]
# A CPU checkpoint resumed by the CUDA build (the same safetensors files).
RESUME_CASE = "mlp-s2-1f1b-flush"
RESUME_AT = 3
# Training stopped by a NaN loss, and by a killed rank.
NAN_CASE = "mlp-s2-1f1b-flush"
KILL_CASE = "gpt-mid-s4"


def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f]


# Adam at a learning rate fit for it: at the SGD rates above it diverges,
# and a diverging run amplifies float rounding (m / sqrt(v) is +-1 for
# gradients near zero, whatever their rounding), so CPU and GPU would part
# for reasons that are not errors.
ADAM_LR = 0.001


def case_lr(name):
    model = dict((n, m) for n, m, _ in CASES)[name]
    flags = dict((n, f) for n, _, f in CASES)[name]
    return ADAM_LR if "adam" in flags else MODELS[model][2]


def case_steps(name):
    return CASE_STEPS.get(name, STEPS)


def max_to_average_pool(path):
    import onnx
    m = onnx.load(path)
    for n in m.graph.node:
        if n.op_type == "MaxPool":
            n.op_type = "AveragePool"
    onnx.save(m, path)


def train_args(model, data_dir, steps=STEPS, lr=None):
    _, _, model_lr, data = MODELS[model]
    args = ["--steps", str(steps), "--lr", str(lr if lr is not None else model_lr)]
    if data:
        args += ["--inputs", os.path.join(data_dir, "x.npy"), "--labels", os.path.join(data_dir, "y.npy")]
    return args


def prepare(args):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    bundle = os.path.abspath(args.bundle)
    cases_dir = os.path.join(bundle, "cases")
    shutil.rmtree(cases_dir, ignore_errors=True)
    os.makedirs(cases_dir)
    work = os.path.join(bundle, "work")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    for model, (script, flags, _, data) in MODELS.items():
        d = os.path.join(cases_dir, "data-" + model)
        os.makedirs(d)
        cmd = ["/usr/bin/python3", os.path.join(ROOT, script), "-o", os.path.join(d, "model.onnx")] + flags
        if data:
            cmd += ["--data-steps", "2"]
        rc, out = run(cmd)
        if rc != 0:
            sys.exit(f"prepare: {model}: {out[-800:]}")
        if model == "vgg-avg":
            max_to_average_pool(os.path.join(d, "model.onnx"))
        if data:  # the data files live beside the model
            for f in ("x.npy", "y.npy"):
                if not os.path.exists(os.path.join(d, f)):
                    shutil.move(f, os.path.join(d, f))
    manifest = []
    for name, model, flags in CASES:
        data_dir = os.path.join(cases_dir, "data-" + model)
        onnx = os.path.join(data_dir, "model.onnx")
        for target in ("cpu", "cuda"):
            out = os.path.join(work if target == "cpu" else cases_dir, name + ("-cpu" if target == "cpu" else ""))
            rc, text = run([args.pipec, "compile", onnx, "-o", out, "--quiet", "--target", target] + flags)
            if rc != 0:
                sys.exit(f"prepare: compile {name} --target {target}: {text[-800:]}")
        cpu = os.path.join(work, name + "-cpu")
        rc, text = run([args.pipec, "train", cpu, "--quiet"] +
                       train_args(model, data_dir, case_steps(name), lr=case_lr(name)), env=env)
        if rc != 0:
            sys.exit(f"prepare: CPU run of {name}: {text[-800:]}")
        shutil.copy(os.path.join(cpu, "metrics.jsonl"), os.path.join(cases_dir, name, "cpu_metrics.jsonl"))
        ckpt = os.path.join(cpu, "checkpoints")
        latest = open(os.path.join(ckpt, "latest")).read().strip()
        if name in WEIGHT_CHECKS:
            shutil.copytree(os.path.join(ckpt, latest), os.path.join(cases_dir, name, "cpu_final"))
        shutil.rmtree(os.path.join(cases_dir, name, "obj"), ignore_errors=True)
        manifest.append({"name": name, "model": model})
        print(f"prepared {name}", flush=True)
    # The CPU checkpoint the CUDA build resumes from, and the CPU losses of
    # the uninterrupted run it must continue.
    model = dict((n, m) for n, m, _ in CASES)[RESUME_CASE]
    data_dir = os.path.join(cases_dir, "data-" + model)
    cpu = os.path.join(work, RESUME_CASE + "-cpu")
    shutil.rmtree(os.path.join(cpu, "checkpoints"))
    os.remove(os.path.join(cpu, "metrics.jsonl"))
    rc, text = run([args.pipec, "train", cpu, "--quiet"] + train_args(model, data_dir, RESUME_AT), env=env)
    if rc != 0:
        sys.exit(f"prepare: CPU run to step {RESUME_AT}: {text[-800:]}")
    shutil.copytree(os.path.join(cpu, "checkpoints"), os.path.join(cases_dir, "resume-cpu-checkpoints"))
    # The CPU build itself, to resume a checkpoint the GPU writes (the
    # other way round; its stage executables need MPI and OpenBLAS only).
    shutil.copytree(cpu, os.path.join(cases_dir, "resume-cpu-run"),
                    ignore=shutil.ignore_patterns("checkpoints", "metrics.jsonl", "obj"))
    shutil.rmtree(work)
    for model in MODELS:  # compiled already; the GPU machine needs the data only
        os.remove(os.path.join(cases_dir, "data-" + model, "model.onnx"))
    with open(os.path.join(bundle, "cases.json"), "w") as f:
        json.dump({"cases": manifest}, f, indent=1)
    print(f"bundle: {len(manifest)} cases in {bundle}")


def case_dirs(cases_dir, name):
    """(model, the case's run folder, its model's data folder)."""
    model = dict((c[0], c[1]) for c in CASES)[name]
    return model, os.path.join(cases_dir, name), os.path.join(cases_dir, "data-" + model)


def launch_cmd(mpirun, run_dir, extra, host_per_rank=False):
    """mpirun's MPMD line for a run folder: one process per rank, in rank
    order (manifest stages[].ranks), each with the run's flags.
    `host_per_rank`: each rank started with an NCCL_HOSTID of its own, so
    that NCCL takes the ranks sharing the GPU for ranks on hosts of their
    own (and joins them over its socket transport)."""
    with open(os.path.join(run_dir, "manifest.json")) as f:
        m = json.load(f)
    ranks = {}
    for st in m["stages"]:
        binaries = st.get("binaries") or [st["binary"]]
        for j, r in enumerate(st["ranks"]):
            ranks[r] = binaries[j] if j < len(binaries) else binaries[0]
    cmd = [mpirun, "--oversubscribe", "--bind-to", "none"]
    for i, r in enumerate(sorted(ranks)):
        if i:
            cmd.append(":")
        cmd += ["-np", "1"]
        if host_per_rank:
            cmd += ["sh", "-c", f'NCCL_HOSTID=pipec-rank-{r} exec "$0" "$@"']
        cmd += [os.path.join(run_dir, ranks[r]), "--manifest", os.path.join(run_dir, "manifest.json")] + extra
    return cmd


def read_weights(step_dir):
    from safetensors_io import load_checkpoint
    return load_checkpoint(step_dir)


def rel_err(a, b):
    import numpy as np
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    n = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (n if n > 0 else 1.0))


def compare_losses(got, want, tol=TOL):
    if len(got) != len(want):
        return False, f"{len(got)} steps, CPU {len(want)}"
    worst = max(abs(g - w) / max(abs(w), 1e-12) for g, w in zip(got, want))
    return worst <= tol, f"max rel loss diff {worst:.2e} over {len(got)} steps (losses {got[0]:.6f} .. {got[-1]:.6f})"


def compare_weights(ckpt, cpu_final, tol=TOL, vector_tol=None):
    """(ok, detail): the latest checkpoint in `ckpt` against the CPU run's
    final weights (each tensor's relative error in norm; where it parts,
    every tensor's error, worst first). `vector_tol`: the tolerance of
    one-dimensional tensors, when it is not `tol`."""
    try:
        latest = open(os.path.join(ckpt, "latest")).read().strip()
        got = read_weights(os.path.join(ckpt, latest))
        want = read_weights(cpu_final)
        errors, ok = {}, True
        worst = {"matrix": (0.0, ""), "vector": (0.0, "")}
        for k, w in want.items():
            if k not in got:
                return False, k + " missing"
            e = errors[k] = rel_err(got[k], w)
            kind = "vector" if vector_tol is not None and w.ndim <= 1 else "matrix"
            ok = ok and e <= (vector_tol if kind == "vector" else tol)
            if e > worst[kind][0]:
                worst[kind] = (e, k)
        detail = f"{len(want)} tensors, max rel error {worst['matrix'][0]:.2e} ({worst['matrix'][1]})"
        if vector_tol is not None:
            detail += (f", one-dimensional {worst['vector'][0]:.2e} ({worst['vector'][1]}; "
                       f"tolerance {vector_tol:.0e})")
        if not ok:
            detail += "; " + ", ".join(f"{k} {e:.1e}" for k, e in
                                       sorted(errors.items(), key=lambda kv: -kv[1])[:16])
        return ok, detail
    except Exception as e:  # noqa: BLE001
        return False, f"{type(e).__name__}: {e}"


def run_cases(args):
    bundle = os.path.abspath(args.bundle)
    cases_dir = os.path.join(bundle, "cases")
    with open(os.path.join(bundle, "cases.json")) as f:
        cases = json.load(f)["cases"]
    only = set(args.only.split(",")) if args.only else None
    checks = Checks()
    for c in cases:
        name, model = c["name"], c["model"]
        if only and name not in only:
            continue
        d = os.path.join(cases_dir, name)
        data_dir = os.path.join(cases_dir, "data-" + model)
        shutil.rmtree(os.path.join(d, "checkpoints"), ignore_errors=True)
        metrics = os.path.join(d, "metrics.jsonl")
        for f in glob.glob(os.path.join(d, "summary.*.json")) + [metrics]:
            if os.path.exists(f):
                os.remove(f)
        t0 = time.time()
        try:
            rc, out = run(launch_cmd(args.mpirun, d, train_args(model, data_dir, case_steps(name), lr=case_lr(name)) +
                                     ["--quiet", "--summary-out", os.path.join(d, "summary.{stage}.json")]),
                          timeout=300)
        except subprocess.TimeoutExpired:
            checks.report(False, name, "timed out after 300 s")
            continue
        wall = time.time() - t0
        if rc != 0:
            checks.report(False, name, f"exit {rc}: {out[-1500:]}")
            continue
        ok, detail = compare_losses(losses(metrics), losses(os.path.join(d, "cpu_metrics.jsonl")), case_tol(name))
        checks.report(ok, name + " losses", detail + f", {wall:.1f} s")
        if name not in WEIGHT_CHECKS:
            continue
        ok, detail = compare_weights(os.path.join(d, "checkpoints"), os.path.join(d, "cpu_final"),
                                     case_tol(name), BF16_VECTOR_TOL if name.endswith("-bf16") else None)
        checks.report(ok, name + " weights", detail)
    feed_prefetch_check(checks, cases_dir, [c["name"] for c in cases if not only or c["name"] in only])
    if not only or RESUME_CASE in only:
        resume_check(args, checks, cases_dir)
        resume_on_cpu_check(args, checks, cases_dir)
        nan_check(args, checks, cases_dir)
    if not only or TRACE_CASE in only:
        trace_check(args, checks, cases_dir)
    if not only or KILL_CASE in only:
        kill_check(args, checks, cases_dir)
    for name in CHECK_CASES:
        if not only or name in only:
            kernel_check(args, checks, cases_dir, name)
    for name in GRAPH_CASES:
        if not only or name in only:
            graphs_check(args, checks, cases_dir, name)
    if not only or NONDETERMINISTIC_CASE in only:
        nondeterministic_check(args, checks, cases_dir, NONDETERMINISTIC_CASE)
    if not only or NCCL_HOSTS_CASE in only:
        nccl_hosts_check(args, checks, cases_dir, NCCL_HOSTS_CASE)
    if not only or IPC_PREFETCH_CASE in only:
        ipc_prefetch_check(args, checks, cases_dir, IPC_PREFETCH_CASE)
    p2p_ok = True
    for name, extra, env in NCCL_P2P_CASES:
        if (not only or name in only) and p2p_ok:
            p2p_ok = nccl_p2p_check(args, checks, cases_dir, name, extra, env)
    ipc_ok = True
    for name in IPC_CASES:
        if (not only or name in only) and ipc_ok:
            ipc_ok = ipc_check(args, checks, cases_dir, name)
    return checks.summary()


# --cuda-graphs: flush and continuous schedules (weight versions move wbase),
# split backwards, Adam (the update count in device memory), a ResNet
# (cuDNN and batch norm).
GRAPH_CASES = ["mlp-s4-1f1b", "mlp-s4-zb-h1", "gpt-s2-1f1b-flush", "gpt-s2-adam", "resnet-s2-1f1b-flush"]


# Convolutions go to the cuDNN algorithm each process times fastest
# (runtime/cuda/cudnn_conv.cpp): two processes may choose differently, and
# their results agree to rounding only (seen on an H200, 2026-11-27: the
# ResNet's losses parted once in two runs). Those cases compare within this.
GRAPH_CONV_TOL = 1e-6


def graphs_check(args, checks, cases_dir, name):
    """`name` again with --cuda-graphs: the same losses as the run without,
    bit for bit (the same kernels on the same bytes; within GRAPH_CONV_TOL
    for models with convolutions), and every rank replayed stage functions
    as graphs."""
    model, d, data_dir = case_dirs(cases_dir, name)
    metrics = os.path.join(d, "graphs.jsonl")
    for f in glob.glob(os.path.join(d, "graphs-summary.*.json")) + [metrics]:
        if os.path.exists(f):
            os.remove(f)
    rc, out = run(launch_cmd(args.mpirun, d, train_args(model, data_dir, case_steps(name), lr=case_lr(name)) +
                             ["--quiet", "--cuda-graphs", "--metrics", metrics,
                              "--checkpoint-dir", os.path.join(d, "graphs_ckpt"),
                              "--summary-out", os.path.join(d, "graphs-summary.{stage}.json")]), timeout=300)
    if rc != 0:
        checks.report(False, f"{name} --cuda-graphs", f"exit {rc}: {out[-1500:]}")
        return
    got, want = losses(metrics), losses(os.path.join(d, "metrics.jsonl"))
    replayed = []
    for f in sorted(glob.glob(os.path.join(d, "graphs-summary.*.json"))):
        with open(f) as fh:
            replayed.append(json.load(fh).get("replayed_stage_calls", 0))
    notes = [l for l in out.splitlines() if "--cuda-graphs" in l]
    conv = model in ("resnet", "vgg")
    same, detail = (compare_losses(got, want, GRAPH_CONV_TOL) if conv else
                    (got == want, f"{len(got)} losses {'equal' if got == want else 'differ'}"))
    checks.report(same and replayed and all(r > 0 for r in replayed) and not notes,
                  f"{name} --cuda-graphs: losses {'within rounding' if conv else 'bit for bit'}, "
                  "stage functions replayed",
                  f"{detail}; replayed per stage {replayed}; " + " | ".join(notes)[:300])


# PIPEC_CUDNN_DETERMINISTIC=0 (cuDNN's atomic backward algorithms allowed):
# the ResNet still matches the CPU run of the same compile.
NONDETERMINISTIC_CASE = "resnet-s2-1f1b-flush"


def nondeterministic_check(args, checks, cases_dir, name):
    model, d, data_dir = case_dirs(cases_dir, name)
    metrics = os.path.join(d, "nondeterministic.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    rc, out = run(launch_cmd(args.mpirun, d, train_args(model, data_dir, case_steps(name), lr=case_lr(name)) +
                             ["--quiet", "--metrics", metrics,
                              "--checkpoint-dir", os.path.join(d, "nondeterministic_ckpt")]),
                  timeout=300, env=dict(os.environ, PIPEC_CUDNN_DETERMINISTIC="0"))
    if rc != 0:
        checks.report(False, f"{name} PIPEC_CUDNN_DETERMINISTIC=0", f"exit {rc}: {out[-1500:]}")
        return
    ok, detail = compare_losses(losses(metrics), losses(os.path.join(d, "cpu_metrics.jsonl")), case_tol(name))
    checks.report(ok, f"{name} PIPEC_CUDNN_DETERMINISTIC=0 losses", detail)


# CUDA IPC (runtime/cuda/comm_cuda.cpp) is the default between ranks
# sharing the GPU: the cases above ran on it. Here the same cases run with
# PIPEC_CUDA_IPC=0, every tensor through host memory, and PIPEC_NCCL=1,
# whose sums the replicas sharing the GPU must leave to MPI. The same bytes
# arrive, so the losses equal the default run's bit for bit:
# flush and continuous schedules, 4 ranks, a V schedule (two chunks per
# rank, messages both ways), replicas (their sums stay on MPI), prefetched
# receives (posted ones; ipc_prefetch_check has them on CUDA IPC) and the
# GPT.
IPC_CASES = ["mlp-s4-1f1b", "mlp-s4-zb-h2", "mlp-s2-zb-v", "mlp-s2-rr-replicas", "gpt-s4-1f1b-flush"]
IPC_PREFETCH_CASE = "mlp-s4-1f1b"


def transports_of(pattern):
    names = []
    for f in sorted(glob.glob(pattern)):
        with open(f) as fh:
            names.append(json.load(fh).get("transport", "?"))
    return names


def ipc_check(args, checks, cases_dir, name):
    """False when the run failed or hung (the other cases of this check are
    then left out: a hang must not eat the device's time)."""
    extra = ["--prefetch"] if name == IPC_PREFETCH_CASE else []
    return transport_check(args, checks, cases_dir, name, "staged", {"PIPEC_CUDA_IPC": "0", "PIPEC_NCCL": "1"},
                           extra, lambda t: "CUDA IPC" not in t,
                           "every tensor through host memory, the default run's by CUDA IPC",
                           default_by=lambda t: "CUDA IPC" in t)


def feed_prefetch_check(checks, cases_dir, names):
    """The runs above filled their feeds' microbatches ahead
    (runtime/core/feed_prefetch.h): over every rank that has feeds, the
    requests served from a buffer filled ahead against those filled when
    asked (the first of each feed, and those out of the learned order)."""
    ahead = asked = 0
    for name in names:
        for f in glob.glob(os.path.join(cases_dir, name, "summary.*.json")):
            with open(f) as fh:
                summary = json.load(fh)
            ahead += summary.get("feeds_prefetched", 0)
            asked += summary.get("feeds_filled_on_request", 0)
    checks.report(ahead > asked > 0, "feeds filled ahead",
                  f"{ahead} requests filled ahead, {asked} filled when asked, over {len(names)} cases")


# NCCL's sums between ranks on the one GPU: the replicas of a stage, each
# rank given a host of its own by NCCL_HOSTID (NCCL then accepts them and
# joins them over its socket transport on loopback). A sum of two replicas
# is a + b in either order, so the losses equal the default run's (MPI's
# sums) bit for bit.
NCCL_HOSTS_CASE = "mlp-s2-rr-replicas"


def nccl_hosts_check(args, checks, cases_dir, name):
    # (Only the replicated stage 0 sums; stage 1 has one rank.)
    transport_check(args, checks, cases_dir, name, "nccl-hosts",
                    {"PIPEC_NCCL": "1", "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"}, [],
                    lambda t: "NCCL sums" in t, "the replicas' sums by NCCL", host_per_rank=True,
                    summaries="0r*")


# The default transport with posted receives (--prefetch): CUDA IPC's
# posted receive (IpcPostedReceive), against the default run.
def ipc_prefetch_check(args, checks, cases_dir, name):
    transport_check(args, checks, cases_dir, name, "ipc-prefetch", {}, ["--prefetch"],
                    lambda t: "CUDA IPC" in t, "every rank on CUDA IPC")


# NCCL's messages (PIPEC_NCCL_P2P=1, runtime/cuda/nccl_p2p.h) between the
# ranks on the one GPU, each rank a host of its own to NCCL by NCCL_HOSTID
# (NCCL's socket transport on loopback): the same bytes arrive, so the
# losses equal the default run's bit for bit. A continuous schedule on 4
# ranks with posted receives, zb-h2 on 4 ranks, a V schedule (messages both
# ways, two chunks per rank: tags asked in another order than sent), the
# GPT (1f1b-flush, 4 ranks), and DualPipeV and the interleaved loop on 4
# ranks with messages larger than NCCL's buffers (256 KiB messages against
# 64 KiB buffers, one channel, 16 KiB network chunks, so no send ends
# before its receive is queued): the patterns that could hang the first
# design, one communicator per direction (runtime/README.md, NCCL
# point-to-point).
SMALL_NCCL_BUFFERS = {"NCCL_BUFFSIZE": "65536", "NCCL_P2P_NET_CHUNKSIZE": "16384",
                      "NCCL_NCHANNELS_PER_NET_PEER": "1", "NCCL_MAX_NCHANNELS": "1"}
NCCL_P2P_CASES = [("mlp-s4-1f1b", ["--prefetch"], {}), ("mlp-s4-zb-h2", [], {}),
                  ("mlp-s2-zb-v", [], {}), ("gpt-s4-1f1b-flush", [], {}),
                  ("mlp-wide-s4-dualpipev", [], SMALL_NCCL_BUFFERS),
                  ("mlp-wide-s4-interleaved", [], SMALL_NCCL_BUFFERS)]


def nccl_p2p_check(args, checks, cases_dir, name, extra, env=None):
    return transport_check(args, checks, cases_dir, name, "nccl-p2p",
                           dict({"PIPEC_NCCL_P2P": "1", "NCCL_SOCKET_IFNAME": "lo",
                                 "NCCL_IB_DISABLE": "1"}, **(env or {})),
                           extra, lambda t: "NCCL messages" in t, "every rank's messages by NCCL",
                           host_per_rank=True)


def transport_check(args, checks, cases_dir, name, tag, env, extra, used_by, used_words, host_per_rank=False,
                    summaries="*", default_by=None):
    """`name` once more with `env` and `extra` flags: losses bit for bit as
    the default run's, and the summary transport of every rank (those of
    `summaries`, a {stage} pattern) passing `used_by`, and with
    `default_by` every rank's of the default run passing that. False when
    the run failed or hung."""
    model, d, data_dir = case_dirs(cases_dir, name)
    metrics = os.path.join(d, f"{tag}.jsonl")
    for f in glob.glob(os.path.join(d, f"{tag}-summary.*.json")) + [metrics]:
        if os.path.exists(f):
            os.remove(f)
    shown = {k: v for k, v in env.items()
             if k.startswith("PIPEC") or k in SMALL_NCCL_BUFFERS}
    label = f"{name} {' '.join(f'{k}={v}' for k, v in shown.items())} {' '.join(extra)}".strip()
    if host_per_rank:
        label += " (NCCL_HOSTID per rank)"
    try:
        rc, out = run(launch_cmd(args.mpirun, d, train_args(model, data_dir, case_steps(name), lr=case_lr(name)) +
                                 ["--quiet", "--metrics", metrics, *extra,
                                  "--checkpoint-dir", os.path.join(d, f"{tag}_ckpt"),
                                  "--summary-out", os.path.join(d, f"{tag}-summary.{{stage}}.json")],
                                 host_per_rank=host_per_rank),
                      timeout=60, env=dict(os.environ, **env))
    except subprocess.TimeoutExpired:
        subprocess.run(["pkill", "-9", "-f", d + "/stage"], check=False)
        checks.report(False, label, "timed out after 60 s (a case takes seconds)")
        return False
    if rc != 0:
        checks.report(False, label, f"exit {rc}: {out[-1500:]}")
        return False
    transports = transports_of(os.path.join(d, f"{tag}-summary.{summaries}.json"))
    got, want = losses(metrics), losses(os.path.join(d, "metrics.jsonl"))
    used = bool(transports) and all(used_by(t) for t in transports)
    if default_by:
        default = transports_of(os.path.join(d, "summary.*.json"))
        used = used and bool(default) and all(default_by(t) for t in default)
    checks.report(got == want and used, f"{label}: losses bit for bit as the default run's, {used_words}",
                  f"{len(got)} losses {'equal' if got == want else 'differ'}; transports {sorted(set(transports))}")
    return True


def kernel_check(args, checks, cases_dir, name):
    """One step of `name` with --check-kernels: every kernel call of every
    rank against the CPU kernel on the same bytes."""
    model, d, data_dir = case_dirs(cases_dir, name)
    shutil.rmtree(os.path.join(d, "check_ckpt"), ignore_errors=True)
    rc, out = run(launch_cmd(args.mpirun, d, train_args(model, data_dir, 1, lr=case_lr(name)) +
                             ["--quiet", "--metrics", os.path.join(d, "check.jsonl"),
                              "--checkpoint-dir", os.path.join(d, "check_ckpt"), "--check-kernels"]),
                  timeout=300)
    lines = [l for l in out.splitlines() if "pipec-check:" in l]
    summaries = [l for l in lines if "kernel calls checked" in l]
    with open(os.path.join(d, "manifest.json")) as f:
        ranks = sum(len(st["ranks"]) for st in json.load(f)["stages"])
    ok = rc == 0 and len(summaries) == ranks and all(" 0 parted" in l for l in summaries)
    for l in lines[:200]:
        print("   ", l, flush=True)
    checks.report(ok, f"{name}: every kernel call against the CPU (in place)",
                  f"exit {rc}; " + " | ".join(summaries)[:600])
    cpu_final = os.path.join(d, "cpu_final")
    if rc == 0 and case_steps(name) == 1 and os.path.isdir(cpu_final):
        # With every call's result the CPU kernel's (PIPEC_CHECK_RESYNC=1,
        # the default), what the run computes outside the kernels decides.
        ok, detail = compare_weights(os.path.join(d, "check_ckpt"), cpu_final)
        checks.report(ok, f"{name}: weights of the checked run", detail)


def resume_and_compare(args, checks, cases_dir, label, run_dir, src, metrics, ckpt_dir, failed_part=""):
    """Runs `run_dir` (a build of RESUME_CASE's model) from the checkpoint
    `src` to STEPS; its losses after RESUME_AT must continue the
    uninterrupted CPU run's."""
    model, d, data_dir = case_dirs(cases_dir, RESUME_CASE)
    if os.path.exists(metrics):
        os.remove(metrics)
    rc, out = run(launch_cmd(args.mpirun, run_dir, train_args(model, data_dir) +
                             ["--quiet", "--resume-from", src, "--metrics", metrics,
                              "--checkpoint-dir", ckpt_dir]), timeout=300)
    if rc != 0:
        checks.report(False, label, f"{failed_part}exit {rc}: {out[-1500:]}")
        return
    got = losses(metrics)[-(STEPS - RESUME_AT):]
    want = losses(os.path.join(d, "cpu_metrics.jsonl"))[RESUME_AT:]
    ok, detail = compare_losses(got, want)
    checks.report(ok, label, f"steps {RESUME_AT + 1}..{STEPS} against the uninterrupted CPU run: {detail}")


def resume_check(args, checks, cases_dir):
    _, d, _ = case_dirs(cases_dir, RESUME_CASE)
    resume_and_compare(args, checks, cases_dir, "resume a CPU checkpoint on the GPU", d,
                       os.path.join(cases_dir, "resume-cpu-checkpoints"),
                       os.path.join(d, "resume_metrics.jsonl"), os.path.join(d, "resume_ckpt"))


def resume_on_cpu_check(args, checks, cases_dir):
    """The other way round: the GPU build trains RESUME_AT steps, and the
    CPU build of the same model resumes its checkpoint for the rest; the
    losses continue the uninterrupted CPU run's."""
    model, d, data_dir = case_dirs(cases_dir, RESUME_CASE)
    cpu_run = os.path.join(cases_dir, "resume-cpu-run")
    if not os.path.isdir(cpu_run):
        checks.report(False, "resume a GPU checkpoint on the CPU", "the bundle has no resume-cpu-run")
        return
    gpu_ckpt = os.path.join(d, "gpu_ckpt")
    shutil.rmtree(gpu_ckpt, ignore_errors=True)
    rc, out = run(launch_cmd(args.mpirun, d, train_args(model, data_dir, RESUME_AT) +
                             ["--quiet", "--metrics", os.path.join(d, "gpu_part.jsonl"),
                              "--checkpoint-dir", gpu_ckpt]), timeout=300)
    if rc != 0:
        checks.report(False, "resume a GPU checkpoint on the CPU", f"GPU part: exit {rc}: {out[-1500:]}")
        return
    shutil.rmtree(os.path.join(cpu_run, "ckpt"), ignore_errors=True)
    resume_and_compare(args, checks, cases_dir, "resume a GPU checkpoint on the CPU", cpu_run, gpu_ckpt,
                       os.path.join(cpu_run, "resumed.jsonl"), os.path.join(cpu_run, "ckpt"),
                       failed_part="CPU part: ")


def nan_check(args, checks, cases_dir):
    model, d, data_dir = case_dirs(cases_dir, NAN_CASE)
    extra = train_args(model, data_dir)
    extra[extra.index("--lr") + 1] = "1e30"
    rc, out = run(launch_cmd(args.mpirun, d, extra + ["--quiet", "--metrics", os.path.join(d, "nan.jsonl"),
                                                      "--checkpoint-dir", os.path.join(d, "nan_ckpt")]),
                  timeout=120)
    ok = rc != 0 and "loss is" in out and ("nan" in out or "inf" in out)
    checks.report(ok, "NaN loss stops the GPU job", f"exit {rc}; " + " | ".join(
        l for l in out.splitlines() if "pipec" in l)[:400])


TRACE_CASE = "gpt-s2-1f1b-flush"


def trace_check(args, checks, cases_dir):
    """--trace and --profile-out on the GPU: the forward/backward spans and
    every op's time come from CUDA events (the runtime's queue clock), so
    the profile says "device-queue", every rank's compute spans are in the
    trace with positive lengths in step order, and the ops' time per step
    is close to the step itself (nothing synchronises around each op)."""
    model, d, data_dir = case_dirs(cases_dir, TRACE_CASE)
    trace = os.path.join(d, "trace.json")
    prof = os.path.join(d, "profile.json")
    rc, out = run(launch_cmd(args.mpirun, d, train_args(model, data_dir) +
                             ["--quiet", "--trace", trace, "--profile-out", prof,
                              "--checkpoint-dir", os.path.join(d, "trace_ckpt")]), timeout=120)
    detail = f"exit {rc}"
    ok = rc == 0
    try:
        spans = []
        for r in (0, 1):  # each rank writes its own file (trace.rankN.json)
            path = os.path.join(d, f"trace.rank{r}.json")
            spans += [e for e in json.load(open(path)) if e.get("ph") == "X" and e.get("cat") in
                      ("forward", "backward") and e.get("pid") == r]
        profiles = sorted(f for f in os.listdir(d) if f.startswith("profile"))
        docs = [json.load(open(os.path.join(d, f))) for f in profiles]
        timings = sorted({doc.get("timing") for doc in docs})
        op_ms = [1e3 * sum(o["fwd_s"] + o["bwd_s"] for o in doc["ops"]) for doc in docs]
        ok = ok and len(spans) >= 2 * 2 * 4 and all(e["dur"] > 0 for e in spans) and \
            timings == ["device-queue"] and all(t > 0 for t in op_ms)
        detail += (f"; {len(spans)} compute spans, shortest {min(e['dur'] for e in spans):.1f} us; "
                   f"profiles {profiles} timing {timings}, ops {', '.join(f'{t:.3f}' for t in op_ms)} ms "
                   f"per microbatch")
    except Exception as e:  # noqa: BLE001
        ok = False
        detail += f"; {type(e).__name__}: {e}; {out[-600:]}"
    checks.report(ok, "trace and profile from CUDA events", detail)


def kill_check(args, checks, cases_dir):
    model, d, data_dir = case_dirs(cases_dir, KILL_CASE)
    cmd = launch_cmd(args.mpirun, d, train_args(model, data_dir, 100000) +
                     ["--metrics", os.path.join(d, "kill.jsonl"), "--checkpoint-dir", os.path.join(d, "kill_ckpt"),
                      "--watchdog-s", "20"])
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    victim = os.path.join(d, "stage1")
    killed_at = None
    deadline = time.time() + 120
    try:
        for line in p.stdout:
            lines.append(line.rstrip())
            if killed_at is None and line.startswith("step 3/"):
                pids = subprocess.run(["pgrep", "-f", "^" + victim + " "], stdout=subprocess.PIPE,
                                      text=True).stdout.split()
                for pid in pids:
                    os.kill(int(pid), signal.SIGKILL)
                killed_at = time.time()
            if time.time() > deadline:
                break
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
    took = time.time() - killed_at if killed_at else -1
    text = "\n".join(lines)
    ok = killed_at is not None and p.returncode not in (0, None) and took < 30 and "rank 1" in text
    checks.report(ok, "killed GPU rank named", f"exit {p.returncode} {took:.1f} s after the kill; " +
                  " | ".join(l for l in lines if "pipec" in l or "rank" in l)[-600:])


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--pipec", required=True)
    p.add_argument("--bundle", required=True)
    r = sub.add_parser("run")
    r.add_argument("--bundle", required=True)
    r.add_argument("--mpirun", default="mpirun")
    r.add_argument("--only", default="")
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args)
        return 0
    return run_cases(args)


if __name__ == "__main__":
    sys.exit(main())
