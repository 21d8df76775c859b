#!/usr/bin/python3
"""End-to-end numerical equivalence of pipec's pipelined training.

    /usr/bin/python3 test/e2e/mlp_equivalence.py --pipec build/bin/pipec --workdir DIR [--quick]

1. Writes the example MLP (--smooth: Tanh hidden layers) and two global
   batches of data with the checked-in examples/mlp/make_mlp.py.
2. Trains it with an independent float64 numpy reference written from the
   model's math (forward read from the ONNX graph, hand-written backprop,
   softmax cross-entropy averaged over the global batch, SGD), and checks
   the reference's gradient against central finite differences.
3. Compiles and trains it with pipec for stages {1,2,4} x schedule
   {gpipe,1f1b-flush} x microbatches {4,8} and the 1-stage 1-microbatch
   baseline; compares the final checkpoint tensor by tensor (relative error
   ||a-b||/||b|| <= 1e-5) and metrics.jsonl losses: every pipelined run
   against the baseline, the baseline against the reference.
4. Runs one config through the mpirun line printed by `pipec train --dry-run`.

Why Tanh and not the example's ReLU: runs that sum the same gradients in a
different order (1 stage vs 8 microbatches on 4 stages) differ by float32
rounding, about 1e-7 relative. A ReLU input closer to zero than that takes
either side of the kink depending on the order, and the trajectories part
by far more than the 1e-5 this test demands. With the data of this test the
float64 reference has ReLU inputs 2e-8..4e-8 (relative to sum |a_i w_i|)
from zero in three of its trajectories; on an AMD EPYC machine they flipped
(the 100-row run by 4.6e-5 after step 9, Adagrad by 3.7e-2 after step 4),
on an Intel one they did not. ReLU training is compared in
models_equivalence.py (ResNet/VGG, 1e-4), the ReLU kernels in the
conformance and gradient-check tests.

Prints one line per check and `N passed, M failed`; exits 1 on any failure.
"""
import argparse
import glob
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from safetensors_io import latest_checkpoint, load_checkpoint, read_safetensors  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
MAKE_MLP = os.path.join(REPO, "examples", "mlp", "make_mlp.py")

STEPS = 10
LR = 0.05
TOL = 1e-5
TOL64 = 1e-12  # --precision f64 against the float64 reference
GLOBAL_BATCH = 64
RUN_TIMEOUT = 300

# ---------------------------------------------------------------------------
# Independent numpy reference (float64)
# ---------------------------------------------------------------------------


def _attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


class Reference:
    """Forward/backward of a Flatten/Gemm/Relu/Tanh graph, read from ONNX."""

    SUPPORTED = {"Flatten", "Gemm", "Relu", "Tanh"}

    def __init__(self, model):
        g = model.graph
        self.params = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in g.initializer}
        self.nodes = list(g.node)
        for n in self.nodes:
            if n.op_type not in self.SUPPORTED or n.domain not in ("", "ai.onnx"):
                raise ValueError(f"reference does not support {n.domain}:{n.op_type} ({n.name})")
        self.inputs = [i.name for i in g.input if i.name not in self.params]
        if len(self.inputs) != 1:
            raise ValueError(f"reference expects one data input, got {self.inputs}")
        if len(g.output) != 1:
            raise ValueError("reference expects one output (the logits)")
        self.output = g.output[0].name

    def forward(self, params, x):
        env = dict(params)
        env[self.inputs[0]] = x.astype(np.float64)
        for n in self.nodes:
            a = _attrs(n)
            if n.op_type == "Flatten":
                v = env[n.input[0]]
                axis = a.get("axis", 1)
                if axis < 0:
                    axis += v.ndim
                env[n.output[0]] = v.reshape(int(np.prod(v.shape[:axis], dtype=np.int64)), -1)
            elif n.op_type == "Gemm":
                A, B = env[n.input[0]], env[n.input[1]]
                if a.get("transA", 0):
                    A = A.T
                if a.get("transB", 0):
                    B = B.T
                y = a.get("alpha", 1.0) * (A @ B)
                if len(n.input) > 2 and n.input[2]:
                    y = y + a.get("beta", 1.0) * env[n.input[2]]
                env[n.output[0]] = y
            elif n.op_type == "Relu":
                env[n.output[0]] = np.maximum(env[n.input[0]], 0.0)
            elif n.op_type == "Tanh":
                env[n.output[0]] = np.tanh(env[n.input[0]])
        return env

    @staticmethod
    def loss_and_dlogits(logits, y):
        B = logits.shape[0]
        z = logits - logits.max(axis=1, keepdims=True)
        lse = np.log(np.exp(z).sum(axis=1))
        logp = z - lse[:, None]
        loss = -logp[np.arange(B), y].mean()
        p = np.exp(logp)
        p[np.arange(B), y] -= 1.0
        return loss, p / B

    def loss(self, params, x, y):
        env = self.forward(params, x)
        return self.loss_and_dlogits(env[self.output], y)[0]

    def loss_and_grad(self, params, x, y):
        env = self.forward(params, x)
        loss, dlogits = self.loss_and_dlogits(env[self.output], y)
        grads = {self.output: dlogits}

        def acc(name, g):
            grads[name] = grads[name] + g if name in grads else g

        for n in reversed(self.nodes):
            out = n.output[0]
            if out not in grads:
                continue
            dy = grads[out]
            a = _attrs(n)
            if n.op_type == "Flatten":
                acc(n.input[0], dy.reshape(env[n.input[0]].shape))
            elif n.op_type == "Relu":
                acc(n.input[0], dy * (env[n.input[0]] > 0))
            elif n.op_type == "Tanh":
                acc(n.input[0], dy * (1.0 - env[out] ** 2))
            elif n.op_type == "Gemm":
                alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
                tA, tB = a.get("transA", 0), a.get("transB", 0)
                A, B = env[n.input[0]], env[n.input[1]]
                Ae = A.T if tA else A
                Be = B.T if tB else B
                dAe = alpha * dy @ Be.T
                dBe = alpha * Ae.T @ dy
                acc(n.input[0], dAe.T if tA else dAe)
                acc(n.input[1], dBe.T if tB else dBe)
                if len(n.input) > 2 and n.input[2]:
                    C = env[n.input[2]]
                    dC = beta * dy
                    # un-broadcast to C's shape
                    while dC.ndim > C.ndim:
                        dC = dC.sum(axis=0)
                    for ax, d in enumerate(C.shape):
                        if d == 1 and dC.shape[ax] != 1:
                            dC = dC.sum(axis=ax, keepdims=True)
                    acc(n.input[2], dC)
        return loss, {k: grads.get(k, np.zeros_like(v)) for k, v in params.items()}


def batch_rows(t, B, N):
    return np.arange(t * B, t * B + B) % N


def reference_train(ref, x, y, steps, lr, B):
    params = {k: v.copy() for k, v in ref.params.items()}
    losses = []
    for t in range(steps):
        rows = batch_rows(t, B, len(x))
        loss, grads = ref.loss_and_grad(params, x[rows], y[rows])
        losses.append(loss)
        for k in params:
            params[k] = params[k] - lr * grads[k]
    return params, losses


OPT_LR, OPT_WD = 0.01, 0.01
OPT_HP = {"momentum": 0.9, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}


def reference_train_opt(ref, x, y, steps, B, name):
    """Full-batch training with ONNX's training-operator update formulas
    (ai.onnx.preview.training Momentum/Adam/Adagrad, T = updates so far),
    written from the operator specification in float64."""
    params = {k: v.copy() for k, v in ref.params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    h = {k: np.zeros_like(p) for k, p in params.items()}
    losses = []
    for t in range(steps):
        rows = batch_rows(t, B, len(x))
        loss, grads = ref.loss_and_grad(params, x[rows], y[rows])
        losses.append(loss)
        for k in params:
            g = OPT_WD * params[k] + grads[k]          # G' = norm_coefficient X + G
            if name in ("momentum", "nesterov"):
                v[k] = OPT_HP["momentum"] * v[k] + g    # beta = 1
                step = g + OPT_HP["momentum"] * v[k] if name == "nesterov" else v[k]
                params[k] = params[k] - OPT_LR * step
            elif name == "adam":
                b1, b2 = OPT_HP["beta1"], OPT_HP["beta2"]
                v[k] = b1 * v[k] + (1 - b1) * g
                h[k] = b2 * h[k] + (1 - b2) * g * g
                r = OPT_LR * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) if t > 0 else OPT_LR
                params[k] = params[k] - r * v[k] / (np.sqrt(h[k]) + OPT_HP["epsilon"])
            elif name == "adagrad":
                h[k] = h[k] + g * g
                params[k] = params[k] - OPT_LR * g / (np.sqrt(h[k]) + OPT_HP["epsilon"])
    return params, losses


def gradcheck(ref, x, y, B, coords_per_tensor=3, eps=1e-6, seed=123):
    """Central finite differences on random coordinates of every parameter.
    Returns (ok, worst error description)."""
    rng = np.random.default_rng(seed)
    rows = batch_rows(0, B, len(x))
    xb, yb = x[rows], y[rows]
    params = {k: v.copy() for k, v in ref.params.items()}
    _, grads = ref.loss_and_grad(params, xb, yb)
    worst, worst_desc, bad = 0.0, "", []
    checked = 0
    for name, p in params.items():
        flat = p.reshape(-1)
        g = grads[name].reshape(-1)
        # Some random coordinates plus the one with the largest gradient, so
        # the check cannot pass on all-zero gradients alone.
        idx = list(rng.choice(flat.size, size=min(coords_per_tensor, flat.size), replace=False))
        idx.append(int(np.argmax(np.abs(g))))
        for i in idx:
            old = flat[i]
            flat[i] = old + eps
            lp = ref.loss(params, xb, yb)
            flat[i] = old - eps
            lm = ref.loss(params, xb, yb)
            flat[i] = old
            fd = (lp - lm) / (2 * eps)
            err = abs(fd - g[i])
            tol = 1e-8 + 1e-5 * abs(g[i])
            checked += 1
            if err / tol > worst:
                worst = err / tol
                worst_desc = f"{name}[{i}] analytic {g[i]:.6e} fd {fd:.6e}"
            if err > tol:
                bad.append(f"{name}[{i}]: analytic {g[i]:.6e} vs finite difference {fd:.6e}")
    nonzero = sum(1 for k in grads if np.any(grads[k] != 0))
    if nonzero != len(grads):
        bad.append(f"only {nonzero} of {len(grads)} parameter gradients are non-zero")
    return not bad, checked, worst_desc, bad


# ---------------------------------------------------------------------------
# pipec runs
# ---------------------------------------------------------------------------


def rel_err(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    nb = np.linalg.norm(b)
    d = np.linalg.norm(a - b)
    return d / nb if nb > 0 else d


def run(cmd, timeout=RUN_TIMEOUT, shell=False):
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, shell=shell, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"")
        err = (e.stderr or b"")
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        if isinstance(err, bytes):
            err = err.decode(errors="replace")
        return None, out, err, time.monotonic() - t0
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


def tail(s, n=6):
    lines = [l for l in (s or "").strip().splitlines() if l.strip()]
    return " | ".join(lines[-n:])


def cmd_str(cmd):
    return " ".join(shlex.quote(c) for c in cmd)


class Failure(Exception):
    pass


def read_metrics(path, steps):
    if not os.path.exists(path):
        raise Failure(f"{path} missing")
    with open(path) as f:
        lines = [l for l in f.read().splitlines()]
    if len(lines) != steps:
        raise Failure(f"metrics.jsonl has {len(lines)} lines, expected {steps}")
    losses = []
    for i, line in enumerate(lines):
        try:
            m = json.loads(line)
        except ValueError:
            raise Failure(f"metrics.jsonl line {i + 1} is not JSON: {line[:80]!r}") from None
        for key in ("step", "loss", "samples_per_s", "wall_s"):
            if key not in m:
                raise Failure(f"metrics.jsonl line {i + 1} lacks {key!r}: {line[:120]}")
            if not isinstance(m[key], (int, float)) or isinstance(m[key], bool):
                raise Failure(f"metrics.jsonl line {i + 1}: {key} is not a number: {m[key]!r}")
            if not math.isfinite(m[key]):
                raise Failure(f"metrics.jsonl line {i + 1}: {key} is not finite: {m[key]!r}")
        if m["step"] != i + 1:
            raise Failure(f"metrics.jsonl line {i + 1} has step {m['step']}")
        if not (m["wall_s"] > 0 and m["samples_per_s"] > 0):
            raise Failure(f"metrics.jsonl line {i + 1}: wall_s/samples_per_s not positive: {line}")
        expect = GLOBAL_BATCH / m["wall_s"]
        if abs(m["samples_per_s"] - expect) > 1e-6 * expect:
            raise Failure(f"metrics.jsonl line {i + 1}: samples_per_s {m['samples_per_s']} != "
                          f"global_batch/wall_s = {expect}")
        losses.append(float(m["loss"]))
    return losses


def check_checkpoints(out, steps, init_names):
    ckdir = os.path.join(out, "checkpoints")
    leftovers = [p for p in glob.glob(os.path.join(ckdir, "**", "*"), recursive=True)
                 if ".tmp" in os.path.basename(p)]
    leftovers += [p for p in glob.glob(os.path.join(ckdir, "**", ".*"), recursive=True)]
    if leftovers:
        raise Failure(f"temporary files left in {ckdir}: {sorted(set(leftovers))[:5]}")
    latest = os.path.join(ckdir, "latest")
    if not os.path.exists(latest):
        raise Failure(f"{latest} missing")
    with open(latest) as f:
        content = f.read()
    want = f"step-{steps:06d}"
    if content != want + "\n":
        raise Failure(f"{latest} holds {content!r}, expected {want!r} and a newline")
    step_dir = latest_checkpoint(ckdir)
    for path in sorted(glob.glob(os.path.join(step_dir, "stage*.safetensors"))):
        _, meta = read_safetensors(path)
        if meta.get("format") != "pipec.checkpoint/1" or meta.get("step") != str(steps):
            raise Failure(f"{path}: metadata {meta} (expected format pipec.checkpoint/1, step {steps})")
    weights = load_checkpoint(step_dir)
    if set(weights) != set(init_names):
        raise Failure(f"checkpoint tensors {sorted(weights)} != ONNX initializers {sorted(init_names)}")
    return weights


def compare_weights(got, want, tol=TOL):
    """Returns (worst relative error, list of failures)."""
    worst, bad = 0.0, []
    for name in sorted(want):
        if name not in got:
            bad.append(f"{name} missing")
            continue
        a, b = got[name], want[name]
        if tuple(a.shape) != tuple(b.shape):
            bad.append(f"{name}: shape {list(a.shape)} != {list(b.shape)}")
            continue
        if not np.all(np.isfinite(a)):
            bad.append(f"{name}: non-finite values")
            continue
        e = rel_err(a, b)
        worst = max(worst, e)
        if not e <= tol:
            bad.append(f"{name}: rel err {e:.3e}")
    return worst, bad


def compare_losses(got, want, tol=TOL):
    worst, bad = 0.0, []
    for i, (a, b) in enumerate(zip(got, want)):
        e = abs(a - b) / abs(b) if b != 0 else abs(a - b)
        worst = max(worst, e)
        if not e <= tol:
            bad.append(f"step {i + 1}: loss {a!r} vs {b!r} (rel {e:.3e})")
    if len(got) != len(want):
        bad.append(f"{len(got)} losses vs {len(want)}")
    return worst, bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipec", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--quick", action="store_true", help="a subset of the configurations")
    args = ap.parse_args()
    pipec = os.path.abspath(args.pipec)
    work = os.path.abspath(args.workdir)
    t_start = time.monotonic()
    for tool in (pipec,):
        if not os.access(tool, os.X_OK):
            print(f"FAIL setup: {tool} is not an executable")
            print("0 passed, 1 failed")
            return 1

    env_need = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    for k, v in env_need.items():
        os.environ.setdefault(k, v)

    passed, failed = 0, 0

    def report(ok, name, detail):
        nonlocal passed, failed
        if ok:
            passed += 1
        else:
            failed += 1
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)

    # -- model and data ------------------------------------------------------
    model_dir = os.path.join(work, "model")
    runs_dir = os.path.join(work, "runs")
    for d in (model_dir, runs_dir):
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(model_dir)
    os.makedirs(runs_dir)
    onnx_path = os.path.join(model_dir, "mlp.onnx")
    rc, out, err, _ = run([sys.executable, MAKE_MLP, "-o", onnx_path, "--data-steps", "2", "--smooth"])
    if rc != 0:
        report(False, "make_mlp", f"exit {rc}: {tail(err)}")
        print(f"{passed} passed, {failed} failed")
        return 1
    xs = os.path.join(model_dir, "x.npy")
    ys = os.path.join(model_dir, "y.npy")
    x = np.load(xs)
    y = np.load(ys)
    model = onnx.load(onnx_path)
    init_names = [i.name for i in model.graph.initializer]

    # -- reference ------------------------------------------------------------
    ref = Reference(model)
    ok, checked, worst_desc, bad = gradcheck(ref, x, y, GLOBAL_BATCH)
    report(ok, "reference-gradcheck",
           f"{checked} coordinates vs central differences, worst {worst_desc}" if ok else "; ".join(bad[:5]))
    ref_params, ref_losses = reference_train(ref, x, y, STEPS, LR, GLOBAL_BATCH)
    moved = min(rel_err(ref_params[k], ref.params[k]) for k in ref_params)
    # The test is only meaningful if training moves every tensor by much more than TOL.
    report(moved > 100 * TOL and ref_losses[-1] < ref_losses[0], "reference-training",
           f"loss {ref_losses[0]:.6f} -> {ref_losses[-1]:.6f}, smallest relative change of a tensor {moved:.2e}")

    # -- pipec runs -----------------------------------------------------------
    configs = [(1, "1f1b-flush", 1, None)]  # baseline first
    if args.quick:
        configs += [(2, "gpipe", 4, None), (4, "1f1b-flush", 8, None)]
    else:
        configs += [(s, sch, m, None) for s in (1, 2, 4) for sch in ("gpipe", "1f1b-flush") for m in (4, 8)]
    # Replicated stages (1F1B-RR: microbatch k on replica k mod r, gradients
    # all-reduced over the replicas before the update), uneven counts too;
    # DAPPLE's warm-up policy B; Megatron's interleaved schedule with v
    # chunks per device (p*v stages; Adam checks one update count per rank);
    # zero bubble (zb-h1, zb-h2: backward split into input and weight
    # halves).
    configs += [(2, "1f1b-flush", 4, ("--replicas", "2,1")), (2, "gpipe", 4, ("--replicas", "1,2")),
                (2, "1f1b-flush", 8, ("--replicas", "2,2")), (3, "1f1b-flush", 8, ("--replicas", "1,3,1")),
                (4, "1f1b-flush", 8, ("--warmup", "B")),
                (2, "interleaved", 4, ("--chunks", "2")), (2, "interleaved", 8, ("--chunks", "3")),
                (4, "interleaved", 8, ("--chunks", "2")),
                (2, "zb-h1", 4, None), (4, "zb-h1", 8, None), (4, "zb-h1", 2, None),
                (2, "zb-h1", 4, ("--replicas", "2,1")),
                (2, "zb-h2", 4, None), (4, "zb-h2", 8, None), (4, "zb-h2", 2, None)]
    # Split replicas (DAPPLE): every replica runs its slice of every
    # microbatch (uneven slices: 16 samples over 3 replicas are 5, 5, 6;
    # stage counts 2:3 make slices that straddle the peer's), gradients
    # summed over the replicas; the 15:1 shape of dapple.md runs 16 ranks;
    # with the interleaved schedule each device position's replicas split
    # the microbatches of all its chunks.
    split = ("--replica-mode", "split")
    configs += [(2, "1f1b-flush", 4, ("--replicas", "3,1") + split),
                (2, "gpipe", 8, ("--replicas", "2,3") + split),
                (3, "zb-h1", 4, ("--replicas", "1,2,1") + split),
                (2, "1f1b-flush", 4, ("--replicas", "15,1") + split),
                (2, "interleaved", 4, ("--chunks", "2", "--replicas", "2,1") + split)]

    def extra_label(extra):
        pairs = zip(extra[0::2], extra[1::2]) if extra else ()
        return "".join("-" + k.lstrip("-") + v.replace(",", "") for k, v in pairs)

    def train_config(stages, sched, mb, tag="", extra=None):
        name = f"s{stages}-{sched}-mb{mb}{tag}{extra_label(extra)}"
        out_dir = os.path.join(runs_dir, name)
        compile_cmd = [pipec, "compile", onnx_path, "--stages", str(stages), "--microbatches", str(mb),
                       "--schedule", sched, "-o", out_dir, "--quiet"] + list(extra or ())
        rc, o, e, tc = run(compile_cmd)
        if rc != 0:
            raise Failure(f"compile {'timed out' if rc is None else f'exit {rc}'}: {cmd_str(compile_cmd)}: {tail(o + e)}")
        with open(os.path.join(out_dir, "manifest.json")) as f:
            man = json.load(f)
        if (man.get("num_stages"), man.get("microbatches"), man.get("schedule"), man.get("global_batch")) != \
                (stages, mb, sched, GLOBAL_BATCH):
            raise Failure(f"manifest says stages {man.get('num_stages')} microbatches {man.get('microbatches')} "
                          f"schedule {man.get('schedule')} global_batch {man.get('global_batch')}")
        flags = dict(zip(extra[0::2], extra[1::2])) if extra else {}
        want_ranks = sum(int(r) for r in flags["--replicas"].split(",")) if "--replicas" in flags else stages
        if man.get("num_ranks") != want_ranks:
            raise Failure(f"manifest has num_ranks {man.get('num_ranks')}, expected {want_ranks}")
        return name, out_dir, tc

    def train_args(out_dir):
        return [pipec, "train", out_dir, "--steps", str(STEPS), "--lr", str(LR),
                "--inputs", xs, "--labels", ys, "--quiet"]

    def collect(out_dir):
        weights = check_checkpoints(out_dir, STEPS, init_names)
        losses = read_metrics(os.path.join(out_dir, "metrics.jsonl"), STEPS)
        return weights, losses

    def compile_and_train(stages, sched, mb, extra):
        """(weights, losses, compile s, train s) of one configuration."""
        name, out_dir, tc = train_config(stages, sched, mb, extra=extra)
        cmd = train_args(out_dir)
        rc, o, e, tt = run(cmd)
        if rc != 0:
            raise Failure(f"train {'timed out (hang?)' if rc is None else f'exit {rc}'}: "
                          f"{cmd_str(cmd)}: {tail(o + e)}")
        if f"done: {STEPS} steps" not in o:
            raise Failure(f"train output lacks the 'done: {STEPS} steps' summary: {tail(o + e)}")
        weights, losses = collect(out_dir)
        return weights, losses, tc, tt

    baseline = None
    results = {}
    for stages, sched, mb, extra in configs:
        is_base = baseline is None
        label = f"s{stages}-{sched}-mb{mb}{extra_label(extra)}"
        try:
            weights, losses, tc, tt = compile_and_train(stages, sched, mb, extra)
            results[label] = weights
            if is_base:
                want_w, want_l, against = ref_params, ref_losses, "numpy reference"
            else:
                want_w, want_l, against = baseline[0], baseline[1], "baseline s1-mb1"
            ww, wbad = compare_weights(weights, want_w)
            lw, lbad = compare_losses(losses, want_l)
            if is_base:
                # the reference's losses as well as the baseline's
                baseline = (weights, losses)
            else:
                lw2, lbad2 = compare_losses(losses, ref_losses)
                lw = max(lw, lw2)
                lbad += [f"vs reference {b}" for b in lbad2]
            bad = wbad + lbad
            detail = (f"vs {against}: weights max rel err {ww:.2e}, losses max rel err {lw:.2e} "
                      f"(compile {tc:.1f}s, train {tt:.1f}s)")
            report(not bad, label, detail if not bad else detail + "; " + "; ".join(bad[:6]))
        except Failure as exc:
            report(False, label, str(exc))
            if is_base:
                # Without a baseline the others are compared to the reference.
                baseline = (dict(ref_params), ref_losses)
        except Exception as exc:  # a reader error etc.
            report(False, label, f"{type(exc).__name__}: {exc}")
            if is_base:
                baseline = (dict(ref_params), ref_losses)

    # -- float64 mode: the schedules against the numpy reference to 1e-12 -----
    # (float32 runs only agree to float32 reassociation, 1e-5; in float64
    # every schedule, cut, replica layout and chunking must give the
    # reference's numbers to the last digits.)
    for stages, sched, mb, extra in [(1, "gpipe", 1, None), (2, "1f1b-flush", 4, None),
                                     (4, "zb-h1", 8, None), (4, "zb-h2", 8, None),
                                     (2, "interleaved", 4, ("--chunks", "2")),
                                     (2, "1f1b-flush", 4, ("--replicas", "2,1")),
                                     (2, "1f1b-flush", 4, ("--replicas", "3,1") + split)]:
        extra64 = tuple(extra or ()) + ("--precision", "f64")
        label = f"s{stages}-{sched}-mb{mb}{extra_label(extra64)}"
        try:
            weights, losses, _, _ = compile_and_train(stages, sched, mb, extra64)
            ww, wbad = compare_weights(weights, ref_params, TOL64)
            lw, lbad = compare_losses(losses, ref_losses, TOL64)
            bad = wbad + lbad
            detail = f"float64 vs numpy reference: weights max rel err {ww:.2e}, losses max rel err {lw:.2e}"
            report(not bad, label, detail if not bad else detail + "; " + "; ".join(bad[:6]))
        except Failure as exc:
            report(False, label, str(exc))
        except Exception as exc:
            report(False, label, f"{type(exc).__name__}: {exc}")

    # -- data files whose row count is not a multiple of the batch -------------
    # 100 rows: step 2 takes rows 64..99 then 0..27, so the wrap happens
    # inside a global batch (and inside a microbatch of 8).
    label = "data-wrap-N100 s4-1f1b-flush-mb8"
    try:
        n = 100
        xw, yw = os.path.join(model_dir, "x100.npy"), os.path.join(model_dir, "y100.npy")
        np.save(xw, x[:n])
        np.save(yw, y[:n])
        wp, wl = reference_train(ref, x[:n], y[:n], STEPS, LR, GLOBAL_BATCH)
        build = os.path.join(runs_dir, "s4-1f1b-flush-mb8")
        if not os.path.exists(os.path.join(build, "manifest.json")):
            _, build, _ = train_config(4, "1f1b-flush", 8)
        out_dir = os.path.join(runs_dir, "data-wrap")
        os.makedirs(out_dir)
        cmd = [pipec, "train", build, "--steps", str(STEPS), "--lr", str(LR), "--inputs", xw, "--labels", yw,
               "--checkpoint-dir", os.path.join(out_dir, "checkpoints"),
               "--metrics", os.path.join(out_dir, "metrics.jsonl"), "--quiet"]
        rc, o, e, tt = run(cmd)
        if rc != 0:
            raise Failure(f"train {'timed out (hang?)' if rc is None else f'exit {rc}'}: {cmd_str(cmd)}: {tail(o + e)}")
        weights, losses = collect(out_dir)
        ww, wbad = compare_weights(weights, wp)
        lw, lbad = compare_losses(losses, wl)
        bad = wbad + lbad
        detail = f"vs numpy reference on the same 100 rows: weights max rel err {ww:.2e}, losses max rel err {lw:.2e}"
        report(not bad, label, detail if not bad else detail + "; " + "; ".join(bad[:6]))
    except Failure as exc:
        report(False, label, str(exc))
    except Exception as exc:
        report(False, label, f"{type(exc).__name__}: {exc}")

    # -- receives posted ahead (--prefetch): the same numbers -------------------
    for stages, sched, mb in ((4, "1f1b-flush", 8), (2, "gpipe", 4)):
        label = f"prefetch s{stages}-{sched}-mb{mb}"
        try:
            build = os.path.join(runs_dir, f"s{stages}-{sched}-mb{mb}")
            if not os.path.exists(os.path.join(build, "manifest.json")):
                _, build, _ = train_config(stages, sched, mb)
            out_dir = os.path.join(runs_dir, f"prefetch-s{stages}-{sched}")
            os.makedirs(out_dir)
            cmd = train_args(build) + ["--prefetch", "--checkpoint-dir", os.path.join(out_dir, "checkpoints"),
                                       "--metrics", os.path.join(out_dir, "metrics.jsonl"),
                                       "--summary-out", os.path.join(out_dir, "summary.json")]
            rc, o, e, tt = run(cmd)
            if rc != 0:
                raise Failure(f"train exit {rc}: {cmd_str(cmd)}: {tail(o + e)}")
            weights, losses = collect(out_dir)
            want = results.get(f"s{stages}-{sched}-mb{mb}", baseline[0])
            ww, wbad = compare_weights(weights, want)
            with open(os.path.join(out_dir, "summary.stage1.json")) as f:
                staged = json.load(f)["posted_recv_bytes_peak"]
            bad = wbad + ([] if staged > 0 else ["no receive was posted ahead"])
            detail = f"vs the same build without: weights max rel err {ww:.2e}; {staged} bytes staged on stage 1"
            report(not bad, label, detail if not bad else detail + "; " + "; ".join(bad))
        except Failure as exc:
            report(False, label, str(exc))
        except Exception as exc:
            report(False, label, f"{type(exc).__name__}: {exc}")

    # -- the printed --dry-run command line, executed by a shell ---------------
    stages, sched, mb = 4, "1f1b-flush", 8
    label = f"dry-run-line s{stages}-{sched}-mb{mb}"
    try:
        name, out_dir, _ = train_config(stages, sched, mb, tag="-dryrun")
        cmd = train_args(out_dir) + ["--dry-run"]
        rc, o, e, _ = run(cmd, timeout=60)
        if rc != 0:
            raise Failure(f"--dry-run exit {rc}: {tail(o + e)}")
        if os.path.exists(os.path.join(out_dir, "checkpoints")) or os.path.exists(os.path.join(out_dir, "metrics.jsonl")):
            raise Failure("--dry-run ran the training (checkpoints or metrics.jsonl exist)")
        lines = [l for l in o.splitlines() if l.strip()]
        if len(lines) != 1:
            raise Failure(f"--dry-run printed {len(lines)} lines on stdout, expected one command line: {o[:300]!r}")
        line = lines[0]
        if "mpirun" not in line:
            raise Failure(f"--dry-run line has no mpirun: {line[:200]}")
        rc, o2, e2, tt = run(["/bin/sh", "-c", line])
        if rc != 0:
            raise Failure(f"the dry-run line {'timed out' if rc is None else f'exited {rc}'}: {tail(o2 + e2)}")
        weights, losses = collect(out_dir)
        want = results.get(f"s{stages}-{sched}-mb{mb}")
        against = f"pipec train of s{stages}-{sched}-mb{mb}"
        if want is None:
            want, against = baseline[0], "baseline"
        ww, wbad = compare_weights(weights, want)
        lw, lbad = compare_losses(losses, baseline[1])
        bad = wbad + lbad
        detail = f"vs {against}: weights max rel err {ww:.2e}; losses vs baseline max rel err {lw:.2e} (train {tt:.1f}s)"
        report(not bad, label, detail if not bad else detail + "; " + "; ".join(bad[:6]))
    except Failure as exc:
        report(False, label, str(exc))
    except Exception as exc:
        report(False, label, f"{type(exc).__name__}: {exc}")

    # -- optimizers: ONNX Momentum / Nesterov / Adam / Adagrad ----------------
    # 1 stage and 4 stages (1F1B-flush, 8 microbatches) against a float64
    # reference of the operator formulas. Adaptive methods divide by
    # sqrt(H), which magnifies float32 rounding of tiny gradients: a
    # coordinate whose gradient is mostly cancellation moves by about lr
    # whatever its rounding. The 1-stage float32 run itself ends 1.6e-5 to
    # 2e-5 from the float64 reference, so two float32 runs that sum the
    # gradients in different orders (1 stage vs 8 microbatches) differ at
    # that level too (1.4e-5 and 1.9e-5 on an AMD EPYC, below 1e-5 on an
    # Intel Xeon). Their tolerance, against the reference and against 1
    # stage, is 1e-4; SGD, momentum and Nesterov keep 1e-5.
    opt_names = ("momentum", "adam") if args.quick else ("momentum", "nesterov", "adam", "adagrad")
    for opt in opt_names:
        want_p, want_l = reference_train_opt(ref, x, y, STEPS, GLOBAL_BATCH, opt)
        runs = {}
        # Interleaved with Adam: the bias correction reads the update count,
        # which a rank with two chunks must count once per step.
        variants = [(1, 1, ()), (4, 8, ())]
        if opt == "adam":
            variants.append((2, 4, ("--schedule", "interleaved", "--chunks", "2")))
        for stages, mb, extra in variants:
            sched = "interleaved-v2" if extra else "1f1b-flush"
            label = f"optimizer-{opt} s{stages}-{sched}-mb{mb}"
            try:
                out_dir = os.path.join(runs_dir, f"opt-{opt}-s{stages}{'-il' if extra else ''}")
                cmd = [pipec, "compile", onnx_path, "--stages", str(stages), "--microbatches", str(mb),
                       "--optimizer", opt, "--weight-decay", str(OPT_WD), "-o", out_dir, "--quiet", *extra]
                rc, o, e, _ = run(cmd)
                if rc != 0:
                    raise Failure(f"compile exit {rc}: {tail(o + e)}")
                cmd = [pipec, "train", out_dir, "--steps", str(STEPS), "--lr", str(OPT_LR),
                       "--inputs", xs, "--labels", ys, "--quiet"]
                rc, o, e, _ = run(cmd)
                if rc != 0:
                    raise Failure(f"train exit {rc}: {tail(o + e)}")
                ckpt = load_checkpoint(latest_checkpoint(os.path.join(out_dir, "checkpoints")))
                weights = {k: ckpt[k] for k in init_names if k in ckpt}
                state = sorted(k for k in ckpt if k not in init_names)
                losses = read_metrics(os.path.join(out_dir, "metrics.jsonl"), STEPS)
                runs[stages] = weights
                tol = 1e-4 if opt in ("adam", "adagrad") else TOL
                worst = max(rel_err(weights[k], want_p[k]) for k in want_p)
                lw, lbad = compare_losses(losses, want_l)
                bad = ([] if worst <= tol else [f"weights rel err {worst:.2e} > {tol}"]) + lbad
                if len(weights) != len(want_p):
                    bad.append(f"checkpoint lacks weights: has {sorted(ckpt)}")
                if not state:
                    bad.append("checkpoint holds no optimizer state")
                if stages > 1 and 1 in runs:
                    w1 = max(rel_err(weights[k], runs[1][k]) for k in weights)
                    if w1 > tol:
                        bad.append(f"vs 1 stage: rel err {w1:.2e}")
                    worst_vs1 = f", vs 1 stage {w1:.2e}"
                else:
                    worst_vs1 = ""
                detail = (f"vs ONNX-formula reference: weights {worst:.2e}, losses {lw:.2e}{worst_vs1}; "
                          f"state {len(state)} tensors")
                report(not bad, label, detail if not bad else detail + "; " + "; ".join(bad[:4]))
            except Failure as exc:
                report(False, label, str(exc))
            except Exception as exc:
                report(False, label, f"{type(exc).__name__}: {exc}")

    print(f"total {time.monotonic() - t_start:.1f}s")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
