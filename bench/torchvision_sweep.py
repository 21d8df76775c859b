#!/usr/bin/python3
"""torchvision's classification models, exported for training by PyTorch's
own exporter, trained by pipec in its float64 mode and compared with
PyTorch's float64 training, on 1, 2 and 4 stages with 1, 2 and 4
microbatches.

    /usr/bin/python3 bench/torchvision_sweep.py [--models resnet18,...]
        [--stages 1,2,4] [--microbatches 1,2,4] [--steps 2] [--workdir DIR]
        [--pipec build/bin/pipec]

Needs Debian's python3-torch and python3-torchvision (1.13 / 0.14; the
tests do not). Per model: torch.manual_seed(0), the model with 10 classes
(stochastic depth and dropout off, auxiliary heads off), exported with
torch.onnx.export(training=TRAINING, do_constant_folding=False, opset 17,
dynamic batch); data torch.randn(4, 3, S, S) and 4 labels per step (S = 64,
or the model's minimum); `--steps` steps of SGD at lr 0.01 on the mean
cross-entropy, each microbatch's loss divided by the microbatch count and
its gradients accumulated, as `pipec compile --batch 4 --microbatches m`
and `pipec train --lr 0.01` do. PyTorch runs the same steps in float64 from
the weights the file holds; pipec runs `--precision f64`.

Measures, per (stages, microbatches): the loss of every step (relative
error) and every parameter's update after the last step (weights minus the
initial ones), relative to the larger of its own norm and 1e-3 of the
largest update (an update that is zero up to rounding, e.g. a BatchNorm
bias whose shift the next BatchNorm removes, is measured against the
model's scale), and reports the worst. `ok` means both within 1e-9, or,
where PyTorch's own float32 run is further than 1e-4 from its float64 run
on the same measure (BatchNorm over one sample of a few pixels: up to 4.4,
i.e. 440%), within 1e-9 times that distance / 1e-4: float64 rounding is
amplified by the same conditioning. That float32 distance is printed too,
the noise floor a float32 comparison could not see below. A table for
bench/README.md is printed last.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "test", "e2e"))
from safetensors_io import load_checkpoint  # noqa: E402

TOL = 1e-9
LR = 0.01
BATCH = 4
# One model of every family torchvision 0.14 ships, and the input size each
# needs (its adaptive pooling or its fixed patch grid).
MODELS = {
    "alexnet": 224, "convnext_tiny": 64, "densenet121": 64, "efficientnet_b0": 64,
    "efficientnet_v2_s": 64, "googlenet": 64, "inception_v3": 160, "maxvit_t": 224,
    "mnasnet0_5": 64, "mobilenet_v2": 64, "mobilenet_v3_small": 64, "regnet_x_400mf": 64,
    "regnet_y_400mf": 64, "resnet18": 64, "resnext50_32x4d": 64, "shufflenet_v2_x0_5": 64,
    "squeezenet1_0": 64, "swin_t": 224, "vgg11_bn": 224, "vit_b_16": 224,
    "wide_resnet50_2": 64,
}


def build(torchvision, name):
    """The model with 10 classes and stochastic depth, dropout and auxiliary
    heads off where its constructor has them."""
    import re
    kw = {"num_classes": 10, "stochastic_depth_prob": 0.0, "dropout": 0.0, "aux_logits": False,
          "init_weights": True}
    while True:
        try:
            model = getattr(torchvision.models, name)(**kw)
            # Constructors that fix a dropout or stochastic-depth rate
            # (efficientnet's classifier) get it set to 0 here: both are
            # random in training mode, and PyTorch's draws are not pipec's.
            for module in model.modules():
                if hasattr(module, "p") and type(module).__name__ in ("Dropout", "StochasticDepth"):
                    module.p = 0.0
            return model
        except TypeError as e:
            bad = re.search(r"(?:unexpected keyword argument|multiple values for (?:keyword )?argument) '(\w+)'",
                            str(e))
            if not bad or bad.group(1) not in kw:
                raise
            del kw[bad.group(1)]


def torch_run(torch, model, xs, ys, m, dtype):
    """`steps` SGD steps with gradient accumulation; (losses, weights after
    the last step) of the named parameters."""
    import copy
    mm = copy.deepcopy(model).to(dtype)
    mm.train()
    opt = torch.optim.SGD(mm.parameters(), lr=LR)
    losses = []
    for x, y in zip(xs, ys):
        opt.zero_grad()
        total = 0.0
        for xb, yb in zip(torch.from_numpy(x).to(dtype).chunk(m), torch.from_numpy(y).chunk(m)):
            loss = torch.nn.functional.cross_entropy(mm(xb), yb) / m
            loss.backward()
            total += float(loss)
        opt.step()
        losses.append(total)
    return losses, {k: v.detach().double().numpy().copy() for k, v in mm.named_parameters()}


def update_error(got, init, want):
    ups = {n: want[n] - init[n] for n in want}
    scale = max(np.linalg.norm(u) for u in ups.values())
    worst, at = 0.0, ""
    for n, u in ups.items():
        e = np.linalg.norm(got[n].reshape(u.shape) - init[n] - u) / max(np.linalg.norm(u), 1e-3 * scale, 1e-300)
        if e > worst:
            worst, at = e, n
    return worst, at


def run(cmd, timeout=3600):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return p.returncode, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--stages", default="1,2,4")
    ap.add_argument("--microbatches", default="1,2,4")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--workdir", default="/tmp/pipec-torchvision-sweep")
    ap.add_argument("--pipec", default=os.path.join(HERE, "..", "build", "bin", "pipec"))
    args = ap.parse_args()
    try:
        import torch
        import torchvision
    except ImportError:
        print("needs PyTorch: apt-get install -y --no-install-recommends python3-torch python3-torchvision")
        return 2
    torch.set_num_threads(1)
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    stages = [int(s) for s in args.stages.split(",")]
    micro = [int(s) for s in args.microbatches.split(",")]
    rows = []
    for name in args.models.split(","):
        size = MODELS.get(name, 64)
        d = os.path.join(args.workdir, name)
        os.makedirs(d, exist_ok=True)
        torch.manual_seed(0)
        try:
            model = build(torchvision, name)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{name}: cannot build it: {str(e).splitlines()[0][:200]}", flush=True)
            rows.append((name, "export", {}))
            continue
        model.train()
        xs = [torch.randn(BATCH, 3, size, size).numpy() for _ in range(args.steps)]
        ys = [torch.randint(0, 10, (BATCH,)).numpy() for _ in range(args.steps)]
        np.save(os.path.join(d, "x.npy"), np.concatenate(xs))
        np.save(os.path.join(d, "y.npy"), np.concatenate(ys))
        path = os.path.join(d, "model.onnx")
        t0 = time.time()
        try:
            # (Two samples: a BatchNorm over a 1x1 map needs more than one.)
            torch.onnx.export(model, torch.from_numpy(xs[0][:2]), path, opset_version=17,
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                              input_names=["input"], dynamic_axes={"input": {0: "batch"}})
        except Exception as e:  # noqa: BLE001 - report any exporter failure
            print(f"{name}: PyTorch cannot export it for training: {str(e).splitlines()[0][:200]}", flush=True)
            rows.append((name, "export", {}))
            continue
        # Train from exactly what the file holds (the export ran the model
        # in training mode: BatchNorm statistics moved).
        import onnx
        from onnx import numpy_helper
        state = model.state_dict()
        with torch.no_grad():
            for t in onnx.load(path).graph.initializer:
                if t.name in state:
                    state[t.name].copy_(torch.from_numpy(numpy_helper.to_array(t).copy()))
        init = {k: v.detach().double().numpy().copy() for k, v in model.named_parameters()}
        results = {}
        for m in micro:
            if BATCH % m:
                continue
            l64, w64 = torch_run(torch, model, xs, ys, m, torch.float64)
            l32, w32 = torch_run(torch, model, xs, ys, m, torch.float32)
            floor32, _ = update_error(w32, init, w64)
            for s in stages:
                out = os.path.join(d, f"s{s}m{m}")
                rc, log = run([args.pipec, "compile", path, "--batch", str(BATCH), "--microbatches", str(m),
                               "--stages", str(s), "--precision", "f64", "-o", out, "--quiet"])
                if rc == 0:
                    rc, log = run([args.pipec, "train", out, "--steps", str(args.steps), "--lr", str(LR),
                                   "--inputs", os.path.join(d, "x.npy"), "--labels", os.path.join(d, "y.npy"),
                                   "--quiet"])
                if rc != 0:
                    print(f"{name} s{s} m{m}: FAILED {log.strip().splitlines()[-1][:300] if log.strip() else rc}",
                          flush=True)
                    results[(s, m)] = ("fail", None, None, floor32)
                    continue
                losses = [json.loads(line)["loss"] for line in open(os.path.join(out, "metrics.jsonl"))]
                loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, l64))
                got = load_checkpoint(os.path.join(out, "checkpoints", f"step-{args.steps:06d}"))
                err, at = update_error(got, init, w64)
                tol = TOL * max(1.0, floor32 / 1e-4)
                ok = err <= tol and loss_err <= tol
                results[(s, m)] = ("ok" if ok else "DIFF", err, loss_err, floor32)
                print(f"{name} s{s} m{m}: {'ok' if ok else 'DIFF'} updates {err:.1e} (worst {at}), losses "
                      f"{loss_err:.1e}; PyTorch float32 vs float64 {floor32:.1e}", flush=True)
        print(f"{name}: {time.time() - t0:.0f} s", flush=True)
        rows.append((name, "ran", results))

    print("\n| model | " + " | ".join(f"{s} st, m={m}" for m in micro for s in stages) + " | PyTorch f32 vs f64 |")
    print("|---|" + "---|" * (len(micro) * len(stages) + 1))
    for name, what, results in rows:
        if what == "export":
            print(f"| {name} | PyTorch cannot export it for training |" + " |" * (len(micro) * len(stages)))
            continue
        cells, floors = [], []
        for m in micro:
            for s in stages:
                r = results.get((s, m))
                if not r:
                    cells.append("-")
                elif r[0] == "fail":
                    cells.append("fails")
                    floors.append(r[3])
                else:
                    cells.append(f"{'ok' if r[0] == 'ok' else '**DIFF**'} {max(r[1], r[2]):.0e}")
                    floors.append(r[3])
        print(f"| {name} | " + " | ".join(cells) + f" | {max(floors):.0e} |" if floors else " |")
    bad = sum(1 for _, what, res in rows if what == "ran" for r in res.values() if r[0] != "ok")
    print(f"{sum(len(r) for _, w, r in rows if w == 'ran') - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
