#!/usr/bin/python3
"""pipec --target cuda against PyTorch on the same GPU, same model and data.

    bench/gpu_compare.py prepare --pipec build/bin/pipec --bundle .gpu-bundle
        (build machine) writes a GPT (examples/gpt/make_gpt.py with the sizes
        below) and compiles it for --target cuda on 1 stage and on 4 stages
        (the 4 stages share the one GPU), both with the same global batch
        split into the same microbatches.
    bench/gpu_compare.py run --bundle .gpu-bundle --mpirun mpirun
        (GPU machine) trains each for STEPS steps and reads the runtime's
        mean samples/s (first step excluded); trains the same architecture
        in PyTorch, eager and torch.compile, float32 with TF32 off, SGD,
        the same microbatches accumulated; prints one table with step
        time, samples/s, the ratios and MFU against the float32 (non-tensor
        core) peak of the GPU. The same again for bfloat16: pipec's
        `--precision bf16` build (bf16 matrix products, float32 storage)
        against PyTorch under torch.autocast(bfloat16), MFU against the
        dense bf16 tensor-core peak. Then the same for a ResNet-50
        (examples/resnet/make_resnet.py --arch resnet50, batch 64 at
        224x224 in the gpt2 configuration, one stage, one microbatch)
        against the same network written in PyTorch (cuDNN with
        cudnn.benchmark on, TF32 off); its images are drawn on the GPU
        machine. pipec's float32 ResNet also runs with PIPEC_CUDNN=0
        (convolutions as im2col + cuBLAS), to show what cuDNN buys.

scripts/test-gpu.sh runs the `run` half after the GPU suite.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Model sizes (--config): "small", 4 layers d=256 sequence 256 vocabulary
# 256; "gpt2", the GPT of 12 layers, d=768, 12 heads, sequence 1024
# and GPT-2's vocabulary (124M parameters). Either way a global batch of 32
# in 4 microbatches of 8. The weights never travel: prepare keeps their
# names and shapes, the GPU machine draws them (N(0, 0.02), norms 1 and 0).
CONFIGS = {"small": (4, 256, 4, 256, 256, 12), "gpt2": (12, 768, 12, 1024, 50257, 6)}
LAYERS, DIM, HEADS, SEQ, VOCAB, STEPS = CONFIGS["small"]
BATCH, MICROBATCHES = 32, 4


def results_dir():
    """Where the GPU run keeps its files (scripts/test-gpu.sh sets
    PIPEC_GPU_RESULTS), else the device tool's $OUT, else nowhere."""
    return os.environ.get("PIPEC_GPU_RESULTS") or os.environ.get("OUT")


def use_config(name):
    global LAYERS, DIM, HEADS, SEQ, VOCAB, STEPS
    LAYERS, DIM, HEADS, SEQ, VOCAB, STEPS = CONFIGS[name]
LR = 0.05
# Float32 FMA peaks (no tensor cores: TF32 is off in both systems), and the
# dense bfloat16 tensor-core peaks (SXM parts) for the bf16 rows.
FP32_PEAK = {"H200": 67e12, "H100": 67e12, "A100": 19.5e12}
BF16_PEAK = {"H200": 989e12, "H100": 989e12, "A100": 312e12}
# The pipec builds: folder -> (stages, extra compile flags).
BUILDS = {"s1": (1, []), "s4": (4, []), "s1-bf16": (1, ["--precision", "bf16"]),
          "s1-bf16a": (1, ["--precision", "bf16", "--activations", "bf16"])}
# ResNet-50: the batch per configuration (one microbatch), and its builds
# (in bench/resnet50/).
RESNET_BATCH = {"small": 8, "gpt2": 64}
RESNET_BUILDS = {"s1": (1, []), "s1-bf16": (1, ["--precision", "bf16"]),
                 "s1-bf16a": (1, ["--precision", "bf16", "--activations", "bf16"])}
RESNET_STEPS = 6


def flops_per_step():
    """Training FLOPs of one step: 6 per parameter per token for the
    matrix products, plus attention's QK^T and AV (forward 4 T^2 d per
    layer per sequence, times 3 for training)."""
    params = LAYERS * 12 * DIM * DIM + VOCAB * DIM  # blocks + LM head
    tokens = BATCH * SEQ
    return 6 * params * tokens + 3 * 4 * LAYERS * BATCH * SEQ * SEQ * DIM


def prepare(args):
    b = os.path.join(os.path.abspath(args.bundle), "bench")
    shutil.rmtree(b, ignore_errors=True)
    os.makedirs(b)
    onnx = os.path.join(b, "gpt.onnx")
    use_config(args.config)
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "examples/gpt/make_gpt.py"), "-o", onnx,
                    "--batch", str(BATCH), "--seq", str(SEQ), "--layers", str(LAYERS), "--dim", str(DIM),
                    "--heads", str(HEADS), "--vocab", str(VOCAB), "--data-steps", "1"], check=True)
    with open(os.path.join(b, "config"), "w") as f:
        f.write(args.config)
    compile_builds(args.pipec, onnx, b, BUILDS, MICROBATCHES)
    os.remove(onnx)
    r = os.path.join(b, "resnet50")
    os.makedirs(r)
    onnx = os.path.join(r, "resnet50.onnx")
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "examples/resnet/make_resnet.py"), "-o", onnx,
                    "--arch", "resnet50", "--batch", str(RESNET_BATCH[args.config])], check=True)
    compile_builds(args.pipec, onnx, r, RESNET_BUILDS, 1)
    os.remove(onnx)
    print("bench prepared in", b)


def compile_builds(pipec, onnx, b, builds, microbatches):
    """Compiles `onnx` for --target cuda into b/BUILD for each of `builds`;
    the weights stay as names and shapes only (drawn on the GPU machine)."""
    for build, (stages, flags) in builds.items():
        subprocess.run([pipec, "compile", onnx, "--target", "cuda", "--stages", str(stages),
                        "--microbatches", str(microbatches), "-o", os.path.join(b, build), "--quiet"] + flags,
                       check=True)
        shutil.rmtree(os.path.join(b, build, "obj"), ignore_errors=True)
        wdir = os.path.join(b, build, "weights")
        for f in sorted(os.listdir(wdir)):
            tensors, _ = read_st(os.path.join(wdir, f))
            with open(os.path.join(wdir, f + ".names"), "w") as out:
                json.dump([[n, list(tensors[n].shape)] for n in sorted(tensors)], out)
            os.remove(os.path.join(wdir, f))


def read_st(path):
    sys.path.insert(0, os.path.join(ROOT, "test", "e2e"))
    from safetensors_io import read_safetensors
    return read_safetensors(path)


def write_st(path, tensors):
    """A float32 safetensors file (the format: 8-byte header length, JSON
    header with dtype, shape and data_offsets, then the raw bytes)."""
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        raw = tensors[name].astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def draw_weights(b, builds):
    """Every stage's weights file from its names and shapes: one draw per
    tensor name (so the 1- and 4-stage builds train the same model).
    Normalisation scales and running variances are 1, other vectors 0,
    matrices and kernels N(0, 0.02)."""
    import numpy as np
    drawn = {}
    for build in builds:
        wdir = os.path.join(b, build, "weights")
        for f in sorted(os.listdir(wdir)):
            if not f.endswith(".names"):
                continue
            tensors = {}
            for name, shape in json.load(open(os.path.join(wdir, f))):
                if name not in drawn:
                    rng = np.random.default_rng(len(drawn))
                    norm = any(t in name for t in ("ln", "norm", "bn"))
                    if len(shape) == 1 and norm:
                        ones = name.endswith("weight") or name.endswith("running_var")
                        v = np.ones(shape) if ones else np.zeros(shape)
                    elif len(shape) <= 1:
                        v = np.zeros(shape)
                    else:
                        v = rng.standard_normal(shape) * 0.02
                    drawn[name] = v.astype(np.float32)
                tensors[name] = drawn[name]
            write_st(os.path.join(wdir, f[:-len(".names")]), tensors)


def pipec_launch(args, b, build, extra):
    """mpirun's line for build `build` (BUILDS) on the bench's data at LR,
    with the flags `extra`."""
    sys.path.insert(0, os.path.join(ROOT, "test", "gpu"))
    from gpu_e2e import launch_cmd
    return launch_cmd(args.mpirun, os.path.join(b, build),
                      extra + ["--lr", str(LR), "--inputs", os.path.join(b, "x.npy"),
                               "--labels", os.path.join(b, "y.npy")])


def run_pipec(args, b, build, steps=None, env=None, flags=(), timeout=180):
    shutil.rmtree(os.path.join(b, build, "checkpoints"), ignore_errors=True)
    cmd = pipec_launch(args, b, build, ["--steps", str(steps or STEPS)] + list(flags))
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                           env=dict(os.environ, **(env or {})))
    except subprocess.TimeoutExpired:
        # (The ranks outlive a killed launcher: end them, or they hold the GPU.)
        subprocess.run(["pkill", "-9", "-f", os.path.join(b, build) + "/stage"], check=False)
        print(f"{build} {' '.join(f'{k}={v}' for k, v in (env or {}).items())}: timed out after {timeout} s")
        return None, None
    m = re.search(r"done: .* final loss ([0-9.]+)\s+([0-9.]+) samples/s", p.stdout)
    if p.returncode != 0 or not m:
        print(p.stdout[-2000:])
        return None, None
    # (Each row as it ends: a benchmark stopped by its time limit keeps
    # what it measured.)
    print(f"{build} {' '.join(f'{k}={v}' for k, v in (env or {}).items())} {' '.join(flags)}: "
          f"{float(m.group(2)):.2f} samples/s, final loss {m.group(1)}", flush=True)
    return float(m.group(2)), float(m.group(1))


def say_loss_apart(switch, loss, reference, rtol, against=""):
    """Prints a line when a switched run's final loss is more than rtol
    (relative) from the reference run's (either missing: nothing)."""
    if loss is not None and reference is not None and abs(loss - reference) > rtol * abs(reference):
        print(f"{switch}: final loss {loss} against {reference}{' ' + against if against else ''}")


def run_under_mps(measure):
    """Starts CUDA's MPS control daemon in a private folder, returns
    (measure(env of its clients)[0], note) and stops the daemon again;
    (None, why) where it cannot start (no nvidia-cuda-mps-control, a GPU
    whose compute mode refuses it) or no client reached it (a client that
    cannot reach the daemon runs without MPS: that run is not counted).
    PIPEC_BENCH_MPS=0 skips it. Run last: a client that hangs under MPS
    costs the measure's timeout."""
    if os.environ.get("PIPEC_BENCH_MPS", "1") == "0":
        return None, None
    control = shutil.which("nvidia-cuda-mps-control")
    if not control:
        return None, "CUDA MPS: nvidia-cuda-mps-control is not on this machine"
    d = tempfile.mkdtemp(prefix="pipec-mps-")
    mps_env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(d, "pipe"),
               "CUDA_MPS_LOG_DIRECTORY": os.path.join(d, "log")}
    for sub in mps_env.values():
        os.makedirs(sub)
    env = dict(os.environ, **mps_env)
    log = os.path.join(mps_env["CUDA_MPS_LOG_DIRECTORY"], "control.log")

    def log_tail():
        return open(log).read()[-600:] if os.path.exists(log) else ""

    # (The daemon forks and keeps what it inherits: no pipes to it, or
    # waiting for their end never returns.)
    try:
        started = subprocess.run([control, "-d"], env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
    except subprocess.TimeoutExpired:
        shutil.rmtree(d, ignore_errors=True)
        return None, "CUDA MPS: nvidia-cuda-mps-control -d did not return within 30 s"
    if started.returncode != 0:
        shutil.rmtree(d, ignore_errors=True)
        return None, f"CUDA MPS: the daemon did not start (status {started.returncode})"
    value, note = None, None
    try:
        pipe = os.path.join(mps_env["CUDA_MPS_PIPE_DIRECTORY"], "control")
        for _ in range(50):
            if os.path.exists(pipe):
                break
            time.sleep(0.1)
        if not os.path.exists(pipe):
            note = f"CUDA MPS: the daemon's control pipe did not appear within 5 s; control.log: {log_tail()}"
        else:
            value = measure(mps_env)[0]
    finally:
        try:
            subprocess.run([control], input="quit\n", env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            print("CUDA MPS: the daemon did not answer `quit` within 30 s")
        time.sleep(1)
        tail = log_tail()
        shutil.rmtree(d, ignore_errors=True)
    if note:
        return None, note
    if value is None:
        return None, f"CUDA MPS: the run failed; control.log: {tail}"
    if "NEW CLIENT" not in tail.upper() and "STARTING NEW SERVER" not in tail.upper():
        return None, f"CUDA MPS: no client reached the daemon (the run went without MPS; not counted); control.log: {tail}"
    return value, None


def profile_pipec(args, b, build="s1", microbatches=MICROBATCHES, label="gpt"):
    """Build `build` once more with the runtime's per-op profiler
    (--profile-out; each op timed by CUDA events around its kernels, the
    GPU never waited for): prints where a step's time goes, by op kind and
    phase."""
    out = os.path.join(b, f"profile-{build}.json")
    cmd = pipec_launch(args, b, build, ["--steps", "3", "--profile-warmup", "1", "--profile-out", out, "--quiet",
                                        "--checkpoint-dir", os.path.join(b, "profile_ckpt")])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if p.returncode != 0 or not os.path.exists(out):
        print("profile run failed:", p.stdout[-1500:])
        return
    if results_dir():
        shutil.copy(out, os.path.join(results_dir(), f"profile_{label}_{build}.json"))
    prof = json.load(open(out))
    kinds = {}
    for op in prof["ops"]:
        k = kinds.setdefault(op["op"], [0.0, 0.0, 0])
        k[0] += op.get("fwd_s", 0) * microbatches
        k[1] += op.get("bwd_s", 0) * microbatches
        k[2] += 1
    opt = sum(op.get("opt_s", 0) for op in prof["ops"])
    total = sum(f + w for f, w, _ in kinds.values()) + opt
    print(f"\npipec {label} {build}, per-op profile (timing: {prof.get('timing', 'host')}; {total * 1e3:.1f} ms per step "
          f"in ops, optimizer {opt * 1e3:.1f} ms):")
    print(f"{'op':28s} {'count':>5s} {'fwd ms':>9s} {'bwd ms':>9s} {'share':>6s}")
    for name, (f, w, n) in sorted(kinds.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:18]:
        print(f"{name:28s} {n:5d} {f * 1e3:9.2f} {w * 1e3:9.2f} {(f + w) / total * 100:5.1f}%")


def timed_steps(step, steps):
    """Seconds per call of step() over steps - 1 calls after 3 warm-up
    calls (the GPU drained before and after)."""
    import torch
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps - 1):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / (steps - 1)


def print_kernel_table(title, step):
    """One more step under torch.profiler: the CUDA kernels that take its
    time."""
    import torch
    from torch.profiler import ProfilerActivity, profile as tprofile
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    print(f"\n{title}, CUDA kernels of one step (torch.profiler):")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))


def run_torch_resnet(b, compiled, bf16=False, profile=False):
    """Samples/s of ResNet-50 in PyTorch on the bench's images: float32
    (TF32 off) or under autocast(bfloat16); cuDNN picks its algorithms
    (cudnn.benchmark), SGD, training-mode batch norm."""
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(ROOT, "examples", "resnet"))
    from make_resnet import RESNET50_STAGES
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True

    def conv_bn(cin, cout, k, stride):
        return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout))

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            self.c1, self.c2 = conv_bn(cin, width, 1, 1), conv_bn(width, width, 3, stride)
            self.c3 = conv_bn(width, 4 * width, 1, 1)
            self.down = conv_bn(cin, 4 * width, 1, stride) if stride != 1 or cin != 4 * width else None

        def forward(self, x):
            h = self.c3(F.relu(self.c2(F.relu(self.c1(x)))))
            return F.relu(h + (self.down(x) if self.down is not None else x))

    layers, cin = [conv_bn(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], 64
    for stage, (width, blocks) in enumerate(RESNET50_STAGES):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, 2 if (i == 0 and stage > 0) else 1))
            cin = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    model = nn.Sequential(*layers).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    fwd = torch.compile(model) if compiled else model
    x = torch.from_numpy(np.load(os.path.join(b, "x.npy"))).cuda()
    y = torch.from_numpy(np.load(os.path.join(b, "y.npy"))).cuda()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(fwd(x).float(), y)
        loss.backward()
        opt.step()

    wall = timed_steps(step, RESNET_STEPS)
    if profile:
        print_kernel_table(f"PyTorch ResNet-50 {'bf16 ' if bf16 else ''}eager", step)
    return x.shape[0] / wall


def trace_pipec(args, b, build, label="gpt"):
    """Three steps of `build` with --trace (every rank's computations,
    sends, receives and waits from CUDA events): where the pipeline's
    time goes beyond the 1-stage build's (compare with `pipec simulate`
    on the 1-stage profile), and per rank the step's compute, messages
    and the device's idle time (bench/trace_gaps.py). Copied to the
    results folder."""
    out = os.path.join(b, f"trace-{build}.json")
    cmd = pipec_launch(args, b, build, ["--steps", "3", "--trace", out, "--quiet",
                                        "--checkpoint-dir", os.path.join(b, "trace_ckpt")])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    # Each rank writes its own file: trace-BUILD.rankN.json.
    files = sorted(f for f in os.listdir(b) if f.startswith(f"trace-{build}.rank") and f.endswith(".json"))
    if p.returncode != 0 or not files:
        print("trace run failed:", p.stdout[-1500:])
        return
    for f in files:
        if results_dir():
            shutil.copy(os.path.join(b, f), os.path.join(results_dir(), f"{label}_" + f))
    print(f"pipec {label} {build}: trace of 3 steps in {len(files)} files ({', '.join(files)})")
    sys.path.insert(0, HERE)
    import trace_gaps
    trace_gaps.report([os.path.join(b, f) for f in files], skip=1, top=5)


def run_torch(compiled, bf16=False, profile=False):
    """Samples/s of the same GPT in PyTorch: float32 (TF32 off), or with
    `bf16` under torch.autocast(bfloat16) (float32 weights and gradients).
    `profile`: one more step under torch.profiler, printing the CUDA
    kernels that take its time."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
            self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
            self.fc, self.out = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

        def forward(self, x, mask):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(DIM, dim=2)
            q, k, v = (t.view(B, T, HEADS, DIM // HEADS).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / (DIM // HEADS) ** 0.5 + mask
            y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, DIM)
            x = x + self.proj(y)
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
            self.ln, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)
            self.register_buffer("mask", torch.triu(torch.full((SEQ, SEQ), -1e9), 1))

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(SEQ, device=idx.device))
            for blk in self.blocks:
                x = blk(x, self.mask)
            return self.head(self.ln(x))

    model = GPT().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    fwd = torch.compile(model) if compiled else model
    mb = BATCH // MICROBATCHES
    x = torch.randint(0, VOCAB, (BATCH, SEQ), device=dev)
    y = torch.randint(0, VOCAB, (BATCH, SEQ), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        for i in range(MICROBATCHES):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                logits = fwd(x[i * mb:(i + 1) * mb])
                loss = F.cross_entropy(logits.view(-1, VOCAB).float(),
                                       y[i * mb:(i + 1) * mb].reshape(-1)) / MICROBATCHES
            loss.backward()
        opt.step()

    wall = timed_steps(step, STEPS)
    if profile:
        print_kernel_table(f"PyTorch {'bf16 ' if bf16 else ''}eager", step)
    return BATCH / wall


def print_table(title, rows, flops, batch, name):
    """rows: (precision, label, samples/s); "vs eager" is against the eager
    row of the same precision. Returns {label: figures}."""
    eager = {p: sps for p, label, sps in rows if label.startswith("PyTorch eager") and sps}
    print(title)
    print(f"{'system':52s} {'step ms':>9s} {'samples/s':>10s} {'vs eager':>9s} {'MFU':>7s}")
    result = {}
    for precision, label, sps in rows:
        if not sps:
            print(f"{label:52s} not measured (failed, or not run: PIPEC_BENCH_PARTS, PIPEC_BENCH_GRAPHS=1)")
            continue
        peaks = FP32_PEAK if precision == "fp32" else BF16_PEAK
        peak = next((v for k, v in peaks.items() if k in name), list(peaks.values())[0])
        step_s = batch / sps
        mfu = flops / step_s / peak
        ratio = f"{sps / eager[precision]:9.2f}" if precision in eager else f"{'-':>9s}"
        print(f"{label:52s} {step_s * 1e3:9.2f} {sps:10.1f} {ratio} {mfu * 100:6.1f}% ({precision} peak)")
        result[label] = {"samples_per_s": sps, "step_ms": step_s * 1e3, "mfu": mfu, "precision": precision}
    return result


def torch_compiled_rows(run_one):
    """torch.compile rows in both precisions (its compile takes a minute;
    PIPEC_BENCH_COMPILE=0 leaves them out)."""
    rows = []
    for precision, bf16 in (("fp32", False), ("bf16", True)):
        label = "PyTorch torch.compile" + (", autocast bf16" if bf16 else "")
        try:
            rows.append((precision, label, run_one(bf16)))
            print(f"{label}: {rows[-1][2]:.1f} samples/s", flush=True)
        except Exception as e:  # noqa: BLE001
            print("torch.compile failed:", type(e).__name__, str(e)[:300])
    return rows


def run(args):
    b = os.path.join(os.path.abspath(args.bundle), "bench")
    import torch
    name = torch.cuda.get_device_name(0)
    config = open(os.path.join(b, "config")).read().strip()
    use_config(config)
    env = os.environ.get
    result = {}
    profile_torch = env("PIPEC_BENCH_TORCH_PROFILE", "1") != "0"
    # PIPEC_BENCH_PARTS=part,... runs only those parts: pipec (the GPT's
    # pipec rows), profile (its per-op profiles), trace (its 4-stage
    # trace), eager, compile (both models' torch.compile rows), resnet.
    parts = env("PIPEC_BENCH_PARTS", "pipec,profile,trace,eager,compile,resnet").split(",")
    if env("PIPEC_BENCH_COMPILE", "1") == "0" and "compile" in parts:
        parts.remove("compile")
    if env("PIPEC_BENCH_PROFILE", "1") == "0":
        parts = [p for p in parts if p not in ("profile", "trace")]
    if env("PIPEC_BENCH_GPT", "1") != "0":
        draw_weights(b, BUILDS)
        s1 = s4 = s4np = sb = sbnp = sba = loss1 = loss4 = lossb = s1g = s4g = s4staged = s1loop = None
        if "pipec" in parts:
            s1, loss1 = run_pipec(args, b, "s1")
            # Attention's float32 products over permuted heads as one call
            # per sequence instead of one over dense copies (gemm.cu,
            # gatheredProduct): 1.14-1.81x slower on an H200, 2026-11-27.
            s1loop, loss1loop = run_pipec(args, b, "s1", env={"PIPEC_BATCH_GATHER": "0"})
            say_loss_apart("PIPEC_BATCH_GATHER=0", loss1loop, loss1, 1e-5, "gathered")
            s4, loss4 = run_pipec(args, b, "s4")
            # Each stage function replayed as a CUDA graph (measured on an
            # H200 on 2026-11-27: +1% and -1.5%; PIPEC_BENCH_GRAPHS=1).
            if env("PIPEC_BENCH_GRAPHS", "0") != "0":
                s1g, _ = run_pipec(args, b, "s1", flags=["--cuda-graphs"])
                s4g, _ = run_pipec(args, b, "s4", flags=["--cuda-graphs"])
            # The four stages' tensors through host memory instead of by
            # CUDA IPC (the default, runtime/cuda/comm_cuda.cpp); the same
            # bytes, so the same loss.
            s4staged, loss4staged = run_pipec(args, b, "s4", env={"PIPEC_CUDA_IPC": "0"})
            say_loss_apart("PIPEC_CUDA_IPC=0", loss4staged, loss4, 0.0, "by CUDA IPC")
            # The same without the runtime's message progress between ops
            # and during GPU waits (runtime/README.md, Communication).
            s4np, _ = run_pipec(args, b, "s4", env={"PIPEC_MESSAGE_PROGRESS": "0"})
            sb, lossb = run_pipec(args, b, "s1-bf16")
            # bf16 products of unaligned shapes on the tensors' own shapes
            # instead of padded to multiples of 8 (runtime/cuda/gemm.cu; at
            # this size the 50257-word output layer).
            sbnp, lossbnp = run_pipec(args, b, "s1-bf16", env={"PIPEC_BF16_PAD": "0"})
            say_loss_apart("PIPEC_BF16_PAD=0", lossbnp, lossb, 1e-3, "padded")
            # Activations, messages and stash stored in bfloat16 (--activations
            # bf16: float32 kernels between nn.cast ops, so far).
            sba, lossba = run_pipec(args, b, "s1-bf16a")
            say_loss_apart("--activations bf16", lossba, lossb, 1e-2)
        if "profile" in parts:
            profile_pipec(args, b, "s1")
            profile_pipec(args, b, "s1-bf16")
        if "trace" in parts:
            trace_pipec(args, b, "s4")
        eager = "eager" in parts
        rows = [("fp32", "pipec --target cuda, 1 stage", s1),
                ("fp32", "pipec, 1 stage, PIPEC_BATCH_GATHER=0", s1loop),
                ("fp32", "pipec --target cuda, 4 stages on the one GPU", s4),
                ("fp32", "pipec, 4 stages, PIPEC_MESSAGE_PROGRESS=0", s4np),
                ("fp32", "pipec, 4 stages, PIPEC_CUDA_IPC=0 (host-staged)", s4staged),
                ("fp32", "pipec, 1 stage, --cuda-graphs", s1g),
                ("fp32", "pipec, 4 stages, --cuda-graphs", s4g),
                ("fp32", "PyTorch eager", run_torch(False, profile=profile_torch) if eager else None)]
        if env("PIPEC_BENCH_PEDANTIC", "0") != "0":
            # The 1-stage build again with cuBLAS's pedantic math mode (what
            # pipec used before CUBLAS_DEFAULT_MATH; both float32, no TF32).
            os.environ["PIPEC_CUBLAS_MATH"] = "pedantic"
            sp, _ = run_pipec(args, b, "s1")
            del os.environ["PIPEC_CUBLAS_MATH"]
            rows.append(("fp32", "pipec --target cuda, 1 stage, cuBLAS pedantic math", sp))
        rows.append(("bf16", "pipec --target cuda --precision bf16, 1 stage", sb))
        rows.append(("bf16", "pipec bf16, 1 stage, PIPEC_BF16_PAD=0", sbnp))
        rows.append(("bf16", "pipec bf16, 1 stage, --activations bf16", sba))
        rows.append(("bf16", "PyTorch eager, autocast bf16",
                     run_torch(False, bf16=True, profile=profile_torch) if eager else None))
        if "compile" in parts:
            rows += torch_compiled_rows(lambda bf16: run_torch(True, bf16=bf16))
        result["gpt"] = print_table(
            f"\nGPT {LAYERS} layers d={DIM} seq {SEQ}, global batch {BATCH} in {MICROBATCHES} microbatches, "
            f"SGD; {name}; {flops_per_step() / 1e9:.1f} GFLOP per step; fp32 rows: TF32 off; "
            f"final losses pipec {loss1} (1 stage) {loss4} (4 stages) {lossb} (1 stage, bf16)",
            rows, flops_per_step(), BATCH, name)
    if "resnet" in parts and os.path.isdir(os.path.join(b, "resnet50")):
        result["resnet50"] = run_resnet(args, os.path.join(b, "resnet50"), config, name, env, profile_torch,
                                        "compile" in parts)
    # Last (a client that hangs under MPS costs only its own 90 s): the four
    # stages under CUDA's Multi-Process Service, where the driver has it;
    # the processes' kernels then share the GPU instead of time-slicing
    # between their contexts (the suspect of the ~150 us small messages and
    # of the 4-stage overhead).
    if env("PIPEC_BENCH_GPT", "1") != "0" and "pipec" in parts:
        s4mps, mps_note = run_under_mps(
            lambda mps_env: run_pipec(args, b, "s4", env=mps_env, timeout=90))
        if mps_note:
            print(mps_note)
        result["gpt_mps"] = print_table(
            f"\nGPT {LAYERS} layers, 4 stages on the one GPU, with and without CUDA MPS; {name}",
            [("fp32", "pipec --target cuda, 4 stages on the one GPU", s4),
             ("fp32", "pipec, 4 stages, under CUDA MPS", s4mps)],
            flops_per_step(), BATCH, name)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def run_resnet(args, r, config, name, env, profile_torch, compiled):
    """The ResNet-50 table: pipec (1 stage, float32 and bf16) against
    PyTorch on the same images (drawn here: N(0, 1), uniform labels)."""
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "examples", "resnet"))
    from make_resnet import resnet50_flops
    batch = RESNET_BATCH[config]
    rng = np.random.default_rng(1)
    np.save(os.path.join(r, "x.npy"), rng.standard_normal((batch, 3, 224, 224)).astype(np.float32))
    np.save(os.path.join(r, "y.npy"), rng.integers(0, 1000, batch).astype(np.int64))
    draw_weights(r, RESNET_BUILDS)
    s1, loss1 = run_pipec(args, r, "s1", RESNET_STEPS)
    sb, lossb = run_pipec(args, r, "s1-bf16", RESNET_STEPS)
    # The bf16 convolutions on bfloat16 tensors in cuDNN (cudnn_conv.cpp,
    # PIPEC_CUDNN_BF16=1) instead of TF32 on float32 tensors of bfloat16
    # values (22.8 of 43.7 ms on an H200, 2026-11-27).
    sbt, lossbt = run_pipec(args, r, "s1-bf16", RESNET_STEPS, env={"PIPEC_CUDNN_BF16": "1"})
    say_loss_apart("PIPEC_CUDNN_BF16=1", lossbt, lossb, 1e-2)
    # 1x1 convolutions on cuDNN instead of as cuBLAS products (conv.cu,
    # pointwiseProduct): their backward took 43.5 of 91 ms on an H200.
    s1c, _ = run_pipec(args, r, "s1", RESNET_STEPS, env={"PIPEC_POINTWISE_GEMM": "0"})
    sbc, _ = run_pipec(args, r, "s1-bf16", RESNET_STEPS, env={"PIPEC_POINTWISE_GEMM": "0"})
    # Activations stored in bfloat16 (--activations bf16), alone and with
    # the convolutions on bfloat16 tensors.
    sba, lossba = run_pipec(args, r, "s1-bf16a", RESNET_STEPS)
    say_loss_apart("--activations bf16", lossba, lossb, 1e-2)
    sbat, _ = run_pipec(args, r, "s1-bf16a", RESNET_STEPS, env={"PIPEC_CUDNN_BF16": "1"})
    s1i = s1g = s1n = s1b = sbi = None
    # PIPEC_BENCH_RESNET_VARIANTS=0: only the two pipec rows above.
    if env("PIPEC_BENCH_RESNET_VARIANTS", "1") != "0":
        # The convolutions without cuDNN (im2col + cuBLAS), for what cuDNN buys.
        s1i, _ = run_pipec(args, r, "s1", RESNET_STEPS, env={"PIPEC_CUDNN": "0"})
        if env("PIPEC_BENCH_GRAPHS", "0") != "0":  # (-6% on an H200, 2026-11-27)
            s1g, _ = run_pipec(args, r, "s1", RESNET_STEPS, flags=["--cuda-graphs"])
        # cuDNN's non-deterministic algorithms allowed (as PyTorch's default).
        s1n, _ = run_pipec(args, r, "s1", RESNET_STEPS, env={"PIPEC_CUDNN_DETERMINISTIC": "0"})
        # Batch norm's channels not split across blocks (runtime/cuda/batchnorm.cu,
        # splitParts): what the split buys the first stages.
        s1b, _ = run_pipec(args, r, "s1", RESNET_STEPS, env={"PIPEC_BN_SPLIT": "0"})
        # bf16 convolutions as im2col + bfloat16 GEMMs (float32 results).
        sbi, _ = run_pipec(args, r, "s1-bf16", RESNET_STEPS, env={"PIPEC_CUDNN": "0"})
    if env("PIPEC_BENCH_PROFILE", "1") != "0":
        profile_pipec(args, r, "s1", microbatches=1, label="resnet50")
        profile_pipec(args, r, "s1-bf16", microbatches=1, label="resnet50")
        # Where the step's time outside the ops goes (16.7 of 112 ms on an
        # H200 before the feeds were filled ahead, 0.86 ms after;
        # 2026-11-27).
        trace_pipec(args, r, "s1", label="resnet50")
    rows = [("fp32", "pipec --target cuda, 1 stage", s1),
            ("fp32", "pipec, 1 stage, PIPEC_POINTWISE_GEMM=0 (1x1 on cuDNN)", s1c),
            ("fp32", "pipec, PIPEC_CUDNN=0 (im2col; 1x1 as products)", s1i),
            ("fp32", "pipec, 1 stage, --cuda-graphs", s1g),
            ("fp32", "pipec, 1 stage, PIPEC_CUDNN_DETERMINISTIC=0", s1n),
            ("fp32", "pipec, 1 stage, PIPEC_BN_SPLIT=0", s1b),
            ("fp32", "PyTorch eager", run_torch_resnet(r, False, profile=profile_torch)),
            ("bf16", "pipec --target cuda --precision bf16, 1 stage", sb),
            ("bf16", "pipec bf16, PIPEC_POINTWISE_GEMM=0 (1x1 on cuDNN)", sbc),
            ("bf16", "pipec bf16, PIPEC_CUDNN_BF16=1 (1x1 as products)", sbt),
            ("bf16", "pipec bf16, --activations bf16", sba),
            ("bf16", "pipec bf16, --activations bf16, PIPEC_CUDNN_BF16=1", sbat),
            ("bf16", "pipec bf16, PIPEC_CUDNN=0 (1x1 as products)", sbi),
            ("bf16", "PyTorch eager, autocast bf16", run_torch_resnet(r, False, bf16=True, profile=profile_torch))]
    if compiled:
        rows += torch_compiled_rows(lambda bf16: run_torch_resnet(r, True, bf16=bf16))
    flops = resnet50_flops(batch)
    return print_table(
        f"\nResNet-50 224x224, batch {batch} (one microbatch), SGD; {name}; {flops / 1e9:.1f} GFLOP per step "
        f"(convolutions and classifier); fp32 rows: TF32 off; final losses pipec {loss1} {lossb} (bf16)",
        rows, flops, batch, name)


def main():
    # A `timeout` around the benchmark sends SIGTERM: end through SystemExit
    # so that `finally` blocks run (the MPS daemon is stopped).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--pipec", required=True)
    p.add_argument("--bundle", required=True)
    p.add_argument("--config", default="small", choices=sorted(CONFIGS))
    r = sub.add_parser("run")
    r.add_argument("--bundle", required=True)
    r.add_argument("--mpirun", default="mpirun")
    r.add_argument("--out", default="")
    args = ap.parse_args()
    return prepare(args) if args.cmd == "prepare" else run(args)


if __name__ == "__main__":
    sys.exit(main() or 0)
