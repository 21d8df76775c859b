#!/usr/bin/python3
"""Single-stage training step time of the examples: pipec vs PyTorch CPU eager.

    /usr/bin/python3 bench/torch_compare.py [--models mlp,resnet,vgg,gpt]
        [--threads 1,2] [--steps 40] [--pipec build/bin/pipec] [--workdir DIR]
        [--omp-wait-policy passive|active|unset] [--no-profile] [--profile-all]

For each example model the script writes the ONNX file and 4 global batches
of its synthetic data with the example's own generator (default sizes),
compiles it for one stage and one microbatch, and trains `--steps` steps
with `pipec train` (OPENBLAS_NUM_THREADS=n). The same model is built in
PyTorch eager (torch.nn.functional, as one writes the module whose export
the ONNX graph is) from the ONNX initializers, and trained on the same
batches in the same order: forward, softmax cross-entropy averaged over the
batch, backward, SGD with the same learning rate. PyTorch runs in a
subprocess with torch.set_num_threads(n) and OMP/OPENBLAS/MKL_NUM_THREADS=n
(OpenBLAS reads its thread count at load time), so both sides use n threads.
OMP_WAIT_POLICY is passive by default (bench/README.md says why).

Correctness: PyTorch's first-step loss must equal pipec's (metrics.jsonl) to
1e-4, which shows both are the same model on the same data; the losses of
the next two steps are compared too (same gradients and update).

Timing: median `wall_s` of pipec's steps after the first 3; PyTorch: median
of its steps after the same 3 warm-up steps (time.perf_counter around
forward, loss, backward, optimizer step and zero_grad). Before and after
each row the script samples how busy the cores are with other processes.

Where pipec is slower (or with --profile-all) the time is broken down by op
class (gemm, conv, elementwise, norm, softmax, pool, embedding,
copy/layout, loss, optimizer, framework, other), forward and backward:
pipec from its runtime profiler (`pipec train --profile-out`, which is what
`pipec profile MODEL --microbatch B` runs, here on the same build, data and
lr, so the same run's step time gives the time outside the ops: SGD,
gradient zeroing, feed); PyTorch from torch.profiler (self CPU time of the
aten ops per step; ops under Optimizer.step / zero_grad are "optimizer",
autograd nodes are "framework"). For conv models it also times, alone, the
sgemm calls pipec's im2col convolution makes, to split pipec's conv time
into GEMM and im2col/col2im/copies. Both profilers inflate small ops.

PyTorch comes from Debian's python3-torch and is needed by this benchmark
only (never by the build or the tests):
    apt-get install -y --no-install-recommends python3-torch
"""
import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Per model: generator script, learning rate (README's values where given;
# VGG's first steps overshoot at 0.05, which does not change the timing but
# makes the loss comparison less telling).
MODELS = {
    "mlp": ("examples/mlp/make_mlp.py", 0.05),
    "resnet": ("examples/resnet/make_resnet.py", 0.05),
    "vgg": ("examples/vgg/make_vgg.py", 0.01),
    "gpt": ("examples/gpt/make_gpt.py", 0.1),
}
WARMUP = 3          # steps excluded from the median, both sides
CHECK_STEPS = 3     # losses compared (step 1 strictly)
LOSS_TOL = 1e-4
PROFILE_STEPS = 10  # PyTorch steps under torch.profiler

CLASSES = ["gemm", "conv", "elementwise", "norm", "softmax", "pool",
           "embedding", "copy/layout", "loss", "optimizer", "framework",
           "other"]


def need_torch():
    try:
        importlib.import_module("torch")
    except ImportError:
        sys.exit("error: this benchmark needs PyTorch in /usr/bin/python3 "
                 "(Debian's python3-torch; the build and tests do not):\n"
                 "    apt-get install -y --no-install-recommends python3-torch")


# ----------------------------------------------------------------------------
# PyTorch side (runs in a worker subprocess with the thread env set)
# ----------------------------------------------------------------------------

def load_initializers(path):
    import onnx
    from onnx import numpy_helper
    model = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i).copy() for i in model.graph.initializer}
    attrs = {}
    for n in model.graph.node:
        attrs[n.name] = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    return model, inits, attrs


class TorchModel:
    """Parameters (leaf tensors, keyed by ONNX initializer name), buffers and
    a forward function over them."""

    def __init__(self, params, buffers, forward):
        self.params, self.buffers, self.forward = params, buffers, forward


def build_mlp(model, inits, attrs, torch, F):
    names = sorted({n.split(".")[0] for n in inits if n.startswith("fc")},
                   key=lambda s: int(s[2:]))
    acts = [n.op_type for n in model.graph.node if n.op_type in ("Relu", "Tanh")]
    P = {k: torch.tensor(v, requires_grad=True) for k, v in inits.items()}

    def forward(x):
        h = torch.flatten(x, 1)
        for i, fc in enumerate(names):
            h = F.linear(h, P[fc + ".weight"], P[fc + ".bias"])   # Gemm transB=1
            if i < len(acts):
                h = torch.relu(h) if acts[i] == "Relu" else torch.tanh(h)
        return h
    return TorchModel(P, {}, forward)


def build_resnet(model, inits, attrs, torch, F):
    P, B = {}, {}
    for k, v in inits.items():
        if k.endswith("running_mean") or k.endswith("running_var"):
            B[k] = torch.tensor(v)          # BN statistics: buffers, not trained
        else:
            P[k] = torch.tensor(v, requires_grad=True)
    conv_attrs = {n.name: attrs[n.name] for n in model.graph.node if n.op_type == "Conv"}
    bn_attrs = {n.name: attrs[n.name] for n in model.graph.node
                if n.op_type == "BatchNormalization"}

    def conv_bn(x, prefix, relu=True):
        a = conv_attrs[f"/{prefix}/conv/Conv"]
        x = F.conv2d(x, P[f"{prefix}.conv.weight"], None, stride=tuple(a["strides"]),
                     padding=a["pads"][0], dilation=tuple(a["dilations"]), groups=a["group"])
        b = bn_attrs[f"/{prefix}/bn/BatchNormalization"]
        # ONNX momentum m: running = m*running + (1-m)*batch; torch's is 1-m.
        x = F.batch_norm(x, B[f"{prefix}.bn.running_mean"], B[f"{prefix}.bn.running_var"],
                         P[f"{prefix}.bn.weight"], P[f"{prefix}.bn.bias"], training=True,
                         momentum=1.0 - b["momentum"], eps=b["epsilon"])
        return torch.relu(x) if relu else x

    blocks = []  # (prefix, has_down) in graph order
    for n in model.graph.node:
        if n.op_type == "Add":
            prefix = n.name.split("/")[1]
            blocks.append((prefix, f"{prefix}.down.conv.weight" in P))

    def forward(x):
        x = conv_bn(x, "stem")
        for prefix, down in blocks:
            h = conv_bn(x, f"{prefix}.1")
            h = conv_bn(h, f"{prefix}.2", relu=False)
            s = conv_bn(x, f"{prefix}.down", relu=False) if down else x
            x = torch.relu(h + s)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)   # GlobalAveragePool, Flatten
        return F.linear(x, P["fc.weight"], P["fc.bias"])
    return TorchModel(P, B, forward)


def build_vgg(model, inits, attrs, torch, F):
    P = {k: torch.tensor(v, requires_grad=True) for k, v in inits.items()}
    layers = []
    for n in model.graph.node:
        a = attrs[n.name]
        if n.op_type == "Conv":
            layers.append(("conv", n.input[1], n.input[2], a["strides"][0], a["pads"][0]))
        elif n.op_type == "MaxPool":
            layers.append(("pool", a["kernel_shape"][0], a["strides"][0]))
        elif n.op_type == "Relu" and n.name.startswith("/features"):
            layers.append(("relu",))

    def forward(x):
        for l in layers:
            if l[0] == "conv":
                x = F.conv2d(x, P[l[1]], P[l[2]], stride=l[3], padding=l[4])
            elif l[0] == "pool":
                x = F.max_pool2d(x, l[1], l[2])
            else:
                x = torch.relu(x)
        x = torch.flatten(x, 1)
        x = torch.relu(F.linear(x, P["classifier.0.weight"], P["classifier.0.bias"]))
        # Dropout (inference form in the ONNX graph): identity.
        return F.linear(x, P["classifier.1.weight"], P["classifier.1.bias"])
    return TorchModel(P, {}, forward)


def build_gpt(model, inits, attrs, torch, F):
    import numpy as np
    consts = {}
    for n in model.graph.node:
        if n.op_type == "Constant":
            from onnx import numpy_helper
            consts[n.output[0]] = numpy_helper.to_array(attrs[n.name]["value"])
    layers = 1 + max(int(k.split(".")[1]) for k in inits if k.startswith("h."))
    seq, dim = inits["wpe.weight"].shape
    vocab = inits["lm_head.weight"].shape[1]
    heads = int(consts["h.0.attn.rest"][1])
    dh = dim // heads
    ln_eps = [attrs[n.name]["epsilon"] for n in model.graph.node
              if n.op_type == "LayerNormalization"][0]
    P = {}
    for k, v in inits.items():
        if k.endswith(".weight") and v.ndim == 2 and not k.startswith("wte") \
                and not k.startswith("wpe") and not k.startswith("lm_head"):
            # MatMul(x, W[din, dout]) + b is nn.Linear with weight W^T: keep
            # the parameter in Linear's layout (SGD is elementwise, so the
            # transposition changes nothing in the arithmetic).
            P[k] = torch.tensor(np.ascontiguousarray(v.T), requires_grad=True)
        else:
            P[k] = torch.tensor(v, requires_grad=True)
    mask = torch.tensor(consts["causal_mask"])                 # additive, -1e4 above diag
    positions = torch.tensor(consts["position_ids"])
    scale = torch.tensor(float(dh)).sqrt()                      # Sqrt(Cast(Shape[3]))

    def ln(x, p):
        return F.layer_norm(x, (dim,), P[p + ".weight"], P[p + ".bias"], ln_eps)

    def forward(ids):
        b = ids.shape[0]
        x = F.embedding(ids, P["wte.weight"]) + F.embedding(positions, P["wpe.weight"])
        for l in range(layers):
            p = f"h.{l}"
            h = ln(x, f"{p}.ln_1")
            qkv = F.linear(h, P[f"{p}.attn.c_attn.weight"], P[f"{p}.attn.c_attn.bias"])
            q, k, v = qkv.split(dim, dim=2)
            q = q.reshape(b, seq, heads, dh).permute(0, 2, 1, 3)
            k = k.reshape(b, seq, heads, dh).permute(0, 2, 3, 1)
            v = v.reshape(b, seq, heads, dh).permute(0, 2, 1, 3)
            att = torch.softmax(torch.matmul(q, k) / scale + mask, dim=-1)
            ctx = torch.matmul(att, v).permute(0, 2, 1, 3).reshape(b, seq, dim)
            x = x + F.linear(ctx, P[f"{p}.attn.c_proj.weight"], P[f"{p}.attn.c_proj.bias"])
            h = ln(x, f"{p}.ln_2")
            up = F.linear(h, P[f"{p}.mlp.c_fc.weight"], P[f"{p}.mlp.c_fc.bias"])
            # The graph's Div/Erf/Add/Mul/Mul is exact GELU (erf form); an
            # eager model calls it as one op, as nn.GELU() does.
            x = x + F.linear(F.gelu(up), P[f"{p}.mlp.c_proj.weight"], P[f"{p}.mlp.c_proj.bias"])
        x = ln(x, "ln_f")
        return torch.matmul(x, P["lm_head.weight"]).reshape(-1, vocab)
    return TorchModel(P, {}, forward)


BUILDERS = {"mlp": build_mlp, "resnet": build_resnet, "vgg": build_vgg, "gpt": build_gpt}


def torch_class(name):
    """Op class of an aten op for the breakdown."""
    n = name.split("::", 1)[1] if "::" in name else name
    if n in ("mm", "addmm", "bmm", "matmul", "linear", "baddbmm", "addmv", "mv",
             "dot", "addbmm"):
        return "gemm"
    if "conv" in n:
        return "conv"
    if "batch_norm" in n or "layer_norm" in n:
        return "norm"
    if n in ("_softmax", "softmax", "_softmax_backward_data"):
        return "softmax"
    if ("log_softmax" in n or n.startswith("nll_loss") or n == "cross_entropy_loss"):
        return "loss"
    if "pool" in n or n == "mean":
        return "pool"
    if "embedding" in n or n in ("index_select", "index_add_", "index_put_",
                                 "_index_put_impl_", "index"):
        return "embedding"
    if n in ("copy_", "contiguous", "clone", "reshape", "view", "_unsafe_view",
             "transpose", "t", "permute", "split", "split_with_sizes", "narrow",
             "slice", "select", "expand", "as_strided", "cat", "_cat", "flatten",
             "unsqueeze", "squeeze", "stack", "unbind", "detach", "alias",
             "_reshape_alias", "view_as", "numpy_T", "chunk", "unsafe_split",
             "slice_backward", "select_backward", "expand_as", "_to_copy", "to"):
        return "copy/layout"
    if n in ("add", "add_", "sub", "mul", "mul_", "div", "div_", "relu", "relu_",
             "threshold_backward", "tanh", "tanh_backward", "gelu",
             "gelu_backward", "erf", "sum", "fill_", "zero_", "zeros_like",
             "ones_like", "neg", "sqrt", "exp", "where", "masked_fill", "rsub",
             "pow", "clamp", "clamp_min", "clamp_min_", "sigmoid",
             "sigmoid_backward", "addcmul_", "zeros", "ones", "full", "fill", "scalar_tensor", "lt", "gt", "eq", "ne",
             "abs", "sign", "maximum", "minimum", "max", "min"):
        return "elementwise"
    return "other"


def conv_gemm_estimate(model, repeats=5):
    """The OpenBLAS sgemm calls pipec's im2col convolution makes (same shapes
    and image blocking as runtime/cpu/conv.cpp), timed alone with numpy in
    this process (same OpenBLAS, same thread count): the GEMM part of pipec's
    conv time; the rest is im2col/col2im, bias and layout copies.
    Returns (fwd_s, bwd_s) per step, or None without Conv nodes."""
    import numpy as np
    import onnx
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    if not convs:
        return None
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + \
            list(inferred.graph.output):
        shapes[vi.name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    inits = {i.name: list(i.dims) for i in model.graph.initializer}
    graph_inputs = {i.name for i in model.graph.input}

    def timed(a, b, ta=False, tb=False):
        a = a.T if ta else a
        b = b.T if tb else b
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
        return best

    fwd = bwd = 0.0
    rng = np.random.default_rng(0)
    for n in convs:
        nimg = shapes[n.input[0]][0]
        m, cg, kh, kw = inits[n.input[1]]
        y = shapes[n.output[0]]
        p = y[2] * y[3]
        k = cg * kh * kw
        block = max(1, min(nimg, 1024 // p))
        chunks = -(-nimg // block)
        cols = block * p
        w = rng.standard_normal((m, k), dtype=np.float32)
        col = rng.standard_normal((k, cols), dtype=np.float32)
        dy = rng.standard_normal((m, cols), dtype=np.float32)
        fwd += chunks * timed(w, col)                          # Y = W col
        if n.input[0] not in graph_inputs:
            bwd += chunks * timed(np.ascontiguousarray(w), dy, ta=True)  # W^T dY
        bwd += chunks * timed(dy, col, tb=True)                # dY col^T
    return fwd, bwd


def torch_worker(args):
    import numpy as np
    import torch
    import torch.nn.functional as F
    n = args.threads
    torch.set_num_threads(n)
    torch.manual_seed(0)
    model, inits, attrs = load_initializers(args.model)
    tm = BUILDERS[args.name](model, inits, attrs, torch, F)
    x_all = torch.from_numpy(np.load(args.inputs))
    y_all = torch.from_numpy(np.load(args.labels)).long()
    batch = args.batch
    nbatches = len(x_all) // batch
    opt = torch.optim.SGD(list(tm.params.values()), lr=args.lr)

    def step(i, phases=None):
        j = i % nbatches
        x, y = x_all[j * batch:(j + 1) * batch], y_all[j * batch:(j + 1) * batch]
        t0 = time.perf_counter()
        logits = tm.forward(x)
        loss = F.cross_entropy(logits, y.reshape(-1))
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if phases is not None:
            phases.append((t1 - t0, t2 - t1, t3 - t2))
        return float(loss.item()), t3 - t0

    losses, times, phases = [], [], []
    for i in range(args.steps):
        l, t = step(i, phases)
        losses.append(l)
        times.append(t)
    res = {"losses": losses, "times": times,
           "phases": [statistics.median(p[k] for p in phases[WARMUP:]) for k in range(3)],
           "threads": torch.get_num_threads()}
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(args.steps, args.steps + PROFILE_STEPS):
                step(i)
        classes = {c: [0.0, 0.0, 0.0] for c in CLASSES}   # fwd, bwd, outside
        conv_ops = {}
        for ev in prof.events():
            phase, e = 0, ev
            while e is not None:
                if "Optimizer" in e.name:
                    phase = 2
                    break
                if e.name.startswith("autograd::engine::evaluate_function"):
                    phase = 1
                e = e.cpu_parent
            self_s = ev.self_cpu_time_total / 1e6 / PROFILE_STEPS
            if phase == 2:
                c = "optimizer"
            elif ev.name.startswith("aten::"):
                c = torch_class(ev.name)
                if c == "conv":
                    conv_ops[ev.name] = conv_ops.get(ev.name, 0.0) + self_s
            else:
                c = "framework"       # autograd nodes, record_function wrappers
            classes[c][phase] += self_s
        res["profile"] = classes
        res["conv_impl"] = sorted(conv_ops.items(), key=lambda kv: kv[1], reverse=True)
        res["conv_gemm"] = conv_gemm_estimate(model)
    print("RESULT " + json.dumps(res))


# ----------------------------------------------------------------------------
# pipec side and the driver
# ----------------------------------------------------------------------------

def pipec_class(op):
    if op in ("gemm", "matmul"):
        return "gemm"
    if "conv" in op:
        return "conv"
    if op in ("batch_norm", "layer_norm") or "norm" in op:
        return "norm"
    if op in ("softmax", "log_softmax"):
        return "softmax"
    if "pool" in op:
        return "pool"
    if op == "gather":
        return "embedding"
    if op in ("slice", "split", "concat", "transpose", "reshape", "flatten",
              "identity", "squeeze", "unsqueeze", "expand", "copy"):
        return "copy/layout"
    if "loss" in op:
        return "loss"
    if op in ("relu", "tanh", "add", "sub", "mul", "div", "erf", "sqrt", "exp",
              "log", "neg", "pow", "sum_to_shape", "leaky_relu", "sigmoid",
              "clip", "max", "min", "abs", "reciprocal", "reduce_sum",
              "reduce_mean", "where"):
        return "elementwise"
    return "other"


def run(cmd, env, quiet=True):
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if r.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}")
    return r.stdout


OMP_WAIT_POLICY = "passive"   # set from --omp-wait-policy


def thread_env(n):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[v] = str(n)
    if OMP_WAIT_POLICY:
        env["OMP_WAIT_POLICY"] = OMP_WAIT_POLICY
    return env


def cpu_busy(interval=0.5):
    """Fraction of all cores busy over `interval` while this script idles:
    the load of other users of the machine (Linux /proc/stat)."""
    def sample():
        with open("/proc/stat") as fh:
            f = [int(v) for v in fh.readline().split()[1:]]
        idle = f[3] + (f[4] if len(f) > 4 else 0)
        return idle, sum(f)
    try:
        i0, t0 = sample()
        time.sleep(interval)
        i1, t1 = sample()
        return 1.0 - (i1 - i0) / max(1, t1 - t0)
    except OSError:
        return float("nan")


def prepare(name, work, pipec):
    script, lr = MODELS[name]
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    onnx_path = os.path.join(d, f"{name}.onnx")
    run(["/usr/bin/python3", os.path.join(ROOT, script), "-o", onnx_path,
         "--data-steps", "4"], dict(os.environ))
    out = os.path.join(d, "out")
    t0 = time.time()
    run([pipec, "compile", onnx_path, "--stages", "1", "--microbatches", "1",
         "-o", out, "--quiet"], thread_env(1))
    compile_s = time.time() - t0
    with open(os.path.join(out, "manifest.json")) as fh:
        batch = json.load(fh)["global_batch"]
    return {"dir": d, "onnx": onnx_path, "out": out, "lr": lr, "batch": batch,
            "x": os.path.join(d, "x.npy"), "y": os.path.join(d, "y.npy"),
            "compile_s": compile_s}


def pipec_train(m, n, steps, pipec):
    metrics = os.path.join(m["out"], f"metrics-t{n}.jsonl")
    run([pipec, "train", m["out"], "--steps", str(steps), "--lr", str(m["lr"]),
         "--inputs", m["x"], "--labels", m["y"], "--metrics", metrics, "--quiet"],
        thread_env(n))
    with open(metrics) as fh:
        rows = [json.loads(line) for line in fh]
    return [r["loss"] for r in rows], [r["wall_s"] for r in rows]


def torch_train(name, m, n, steps, profile):
    cmd = ["/usr/bin/python3", os.path.abspath(__file__), "--worker", name,
           "--model", m["onnx"], "--inputs", m["x"], "--labels", m["y"],
           "--batch", str(m["batch"]), "--lr", str(m["lr"]), "--steps", str(steps),
           "--threads", str(n)] + (["--profile"] if profile else [])
    outp = run(cmd, thread_env(n))
    line = [l for l in outp.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def pipec_profile(m, n, steps, pipec):
    """Per-op times from the runtime's profiler -- the one behind `pipec
    profile MODEL --microbatch B`, which runs it on a fresh one-stage build
    with synthetic data and lr 0 -- here on the benchmark's build, data and
    lr, so that the same run's step time gives the time outside the ops."""
    prof = os.path.join(m["dir"], f"profile-t{n}.json")
    metrics = os.path.join(m["out"], f"metrics-prof-t{n}.jsonl")
    run([pipec, "train", m["out"], "--steps", str(steps), "--lr", str(m["lr"]),
         "--inputs", m["x"], "--labels", m["y"], "--metrics", metrics,
         "--profile-out", prof, "--quiet"], thread_env(n))
    with open(prof) as fh:
        doc = json.load(fh)
    with open(metrics) as fh:
        wall = statistics.median(json.loads(l)["wall_s"] for l in list(fh)[WARMUP:])
    classes = {c: [0.0, 0.0, 0.0] for c in CLASSES}
    per_op = {}
    for op in doc["ops"]:
        c = classes[pipec_class(op["op"])]
        c[0] += op["fwd_s"]
        c[1] += op["bwd_s"]
        c[2] += op.get("opt_s", 0.0)
        per_op[op["op"]] = per_op.get(op["op"], 0.0) + op["fwd_s"] + op["bwd_s"]
    inside = sum(sum(v) for v in classes.values())
    classes["other"][2] += max(0.0, wall - inside)
    return classes, wall, per_op


def print_breakdown(bd):
    pc, tc, p, t = bd["pc"], bd["tc"], bd["p"], bd["t"]
    print()
    print(f"== {bd['name']}, batch {bd['batch']}, {bd['threads']} thread(s): pipec "
          f"{p * 1e3:.2f} ms vs torch {t * 1e3:.2f} ms per step (ratio {p / t:.2f})")
    pf = sum(v[0] for v in pc.values())
    pb = sum(v[1] for v in pc.values())
    print(f"   pipec (profiled run, {bd['p_prof'] * 1e3:.2f} ms/step): ops fwd {pf * 1e3:.2f} ms, "
          f"ops bwd {pb * 1e3:.2f} ms, outside ops {pc['other'][2] * 1e3:.2f} ms")
    ph = bd["phases"]
    print(f"   torch (timed run): fwd+loss {ph[0] * 1e3:.2f} ms, backward {ph[1] * 1e3:.2f} ms, "
          f"SGD+zero_grad {ph[2] * 1e3:.2f} ms")
    print(f"   {'class':<12} {'pipec fwd':>9} {'bwd':>8} {'total':>8}   {'torch fwd':>9} "
          f"{'bwd':>8} {'total':>8}   {'gap':>8}")
    tot = lambda v: sum(v)
    order = sorted(CLASSES, key=lambda c: tot(pc[c]) - tot(tc[c]), reverse=True)
    for c in order:
        a, b = pc[c], tc[c]
        if tot(a) < 5e-6 and tot(b) < 5e-6:
            continue
        print(f"   {c:<12} {a[0] * 1e3:9.3f} {a[1] * 1e3:8.3f} {tot(a) * 1e3:8.3f}   "
              f"{b[0] * 1e3:9.3f} {b[1] * 1e3:8.3f} {tot(b) * 1e3:8.3f}   "
              f"{(tot(a) - tot(b)) * 1e3:+8.3f}")
    sp = sum(tot(v) for v in pc.values())
    st = sum(tot(v) for v in tc.values())
    print(f"   {'sum':<12} {'':>9} {'':>8} {sp * 1e3:8.3f}   {'':>9} {'':>8} {st * 1e3:8.3f}   "
          f"{(sp - st) * 1e3:+8.3f}")
    top = sorted(bd["per_op"].items(), key=lambda kv: kv[1], reverse=True)[:8]
    print("   pipec ops (ms): " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in top))
    if bd["conv_impl"]:
        print("   torch conv ops (ms, self): " + ", ".join(
            f"{k.replace('aten::', '')} {v * 1e3:.2f}" for k, v in bd["conv_impl"][:4]))
    if bd["conv_gemm"]:
        gf, gb = bd["conv_gemm"]
        cf, cb = pc["conv"][0], pc["conv"][1]
        print(f"   pipec conv = GEMM + im2col/col2im/copies: fwd {cf * 1e3:.2f} ms of which "
              f"its sgemm calls alone take {gf * 1e3:.2f} ms; bwd {cb * 1e3:.2f} ms, "
              f"sgemm {gb * 1e3:.2f} ms")
    gaps = [(c, tot(pc[c]) - tot(tc[c])) for c in CLASSES]
    gaps = [g for g in sorted(gaps, key=lambda g: g[1], reverse=True) if g[1] > 0][:3]
    if gaps:
        print("   gap mostly in: " + ", ".join(f"{c} (+{g * 1e3:.2f} ms)" for c, g in gaps))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="mlp,resnet,vgg,gpt")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--pipec", default=os.path.join(ROOT, "build", "bin", "pipec"))
    ap.add_argument("--workdir", default=None, help="keep models/outputs here")
    ap.add_argument("--no-profile", action="store_true", help="skip the breakdowns")
    ap.add_argument("--omp-wait-policy", choices=["passive", "active", "unset"],
                    default="passive",
                    help="OMP_WAIT_POLICY for both sides (default passive; see README: "
                         "with libgomp's default spinning, PyTorch's OpenMP workers and "
                         "OpenBLAS's pthread workers fight over 2 cores and PyTorch's "
                         "2-thread steps collapse by 10-30x)")
    ap.add_argument("--profile-all", action="store_true",
                    help="break down every row, not only those where pipec is slower")
    # worker mode (internal)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--inputs", help=argparse.SUPPRESS)
    ap.add_argument("--labels", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--lr", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    need_torch()
    if args.worker:
        args.name = args.worker
        args.threads = int(args.threads)
        torch_worker(args)
        return 0
    if args.steps <= WARMUP + 2:
        sys.exit(f"error: --steps must be more than {WARMUP + 2}")
    models = [s for s in args.models.split(",") if s]
    for s in models:
        if s not in MODELS:
            sys.exit(f"error: unknown model '{s}' (known: {', '.join(MODELS)})")
    threads = [int(t) for t in args.threads.split(",")]
    global OMP_WAIT_POLICY
    OMP_WAIT_POLICY = None if args.omp_wait_policy == "unset" else args.omp_wait_policy
    if not os.access(args.pipec, os.X_OK):
        sys.exit(f"error: {args.pipec} not found; build pipec first (cmake --build build)")
    work = args.workdir or tempfile.mkdtemp(prefix="pipec-torch-")
    import torch
    print(f"pipec {args.pipec}; PyTorch {torch.__version__} (CPU eager); "
          f"{os.cpu_count()} cores; {args.steps} steps, median after {WARMUP}; "
          f"OMP_WAIT_POLICY {OMP_WAIT_POLICY or 'unset'}; work dir {work}",
          flush=True)

    rows, breakdowns, failures = [], [], []
    t_start = time.time()
    for name in models:
        m = prepare(name, work, args.pipec)
        for n in threads:
            busy = cpu_busy()
            p_loss, p_wall = pipec_train(m, n, args.steps, args.pipec)
            tr = torch_train(name, m, n, args.steps, not args.no_profile)
            p_ms = statistics.median(p_wall[WARMUP:])
            t_ms = statistics.median(tr["times"][WARMUP:])
            d1 = abs(p_loss[0] - tr["losses"][0])
            dk = max(abs(a - b) for a, b in zip(p_loss[:CHECK_STEPS], tr["losses"][:CHECK_STEPS]))
            ok = d1 <= LOSS_TOL
            if not ok:
                failures.append(f"{name} t{n}: first-step loss pipec {p_loss[0]:.6f} "
                                f"torch {tr['losses'][0]:.6f}")
            busy = max(busy, cpu_busy())
            rows.append((name, m["batch"], n, p_ms, t_ms, p_ms / t_ms, p_loss[0],
                         tr["losses"][0], d1, dk, ok, busy))
            print(f"  {name:<7} threads {n}: pipec {p_ms * 1e3:8.2f} ms  torch "
                  f"{t_ms * 1e3:8.2f} ms  loss1 {p_loss[0]:.6f} vs {tr['losses'][0]:.6f} "
                  f"(|d| {d1:.1e}; steps 1-{CHECK_STEPS} max |d| {dk:.1e}); "
                  f"others' load {busy:.0%}", flush=True)
            if not args.no_profile and (p_ms > t_ms or args.profile_all):
                pc, p_wall_prof, per_op = pipec_profile(m, n, args.steps, args.pipec)
                breakdowns.append(dict(name=name, batch=m["batch"], threads=n, p=p_ms,
                                       t=t_ms, pc=pc, p_prof=p_wall_prof, per_op=per_op,
                                       tc=tr["profile"], phases=tr["phases"],
                                       conv_impl=tr.get("conv_impl", []),
                                       conv_gemm=tr.get("conv_gemm")))
    print()
    print("Single-stage training step (forward, softmax cross-entropy, backward, SGD)")
    print(f"{'model':<7} {'batch':>5} {'threads':>7} {'pipec ms':>9} {'torch ms':>9} "
          f"{'ratio':>6}  {'loss1 pipec':>11} {'loss1 torch':>11} {'|d loss1|':>9} "
          f"{'load':>5}")
    for (name, b, n, p, t, r, lp, lt, d1, dk, ok, busy) in rows:
        print(f"{name:<7} {b:>5} {n:>7} {p * 1e3:9.3f} {t * 1e3:9.3f} {r:6.2f}  "
              f"{lp:11.6f} {lt:11.6f} {d1:9.1e} {busy:5.0%}{'' if ok else '  MISMATCH'}")
    print("ratio = pipec / torch (>1: pipec slower); load = share of the cores busy with "
          "other processes just before/after the row (high load spoils multi-thread rows)")

    for bd in breakdowns:
        print_breakdown(bd)
    if breakdowns:
        print()
        print("pipec: runtime profiler (`pipec train --profile-out`, what `pipec profile` "
              "runs), per-op means;\n  'other' = that run's median step minus the "
              "instrumented ops (SGD, gradient zeroing, feed, loss seed).\n"
              "torch: torch.profiler self CPU time per step; 'framework' = autograd nodes "
              "and wrappers;\n  Python time between ops is in neither column. Both "
              "profilers inflate small ops.")
    print(f"total {time.time() - t_start:.0f} s")
    if failures:
        print("error: the PyTorch model does not reproduce pipec's first-step loss:\n  "
              + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
