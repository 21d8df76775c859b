#!/usr/bin/python3
"""`pipec compile --precision bf16` on the CPU target.

    /usr/bin/python3 test/e2e/precision_bf16.py --pipec build/bin/pipec --workdir DIR

The matrix products round their operands to bfloat16 (the CUDA target on
the tensor cores, the CPU kernels by emulation: cpu/matmul_bf16.cpp), every
tensor stays float32. A small GPT and ResNet, each compiled with f32 and
with bf16 on 1 stage and with bf16 on 2 stages (1F1B-flush), trained 4
steps on the same data:

  - bf16 on 2 stages equals bf16 on 1 stage (every loss within 1e-6: a
    synchronous pipeline is single-process training with gradient
    accumulation, whatever the arithmetic of its GEMMs);
  - bf16 parts from float32 by more than float32's own noise (1e-5) and
    less than bfloat16's rounding explains (1e-2): the flag does round, and
    rounds only the operands;
  - the stages' descriptions say matmul_precision bf16, tensors f32.

With `--activations bf16` (every activation, message and stash slot
stored in bfloat16; passes/StoreActivationsBf16.cpp), on the MLP, GPT and
ResNet:

  - 1F1B-flush on 2 stages, zb-h1, full recomputation and interleaved
    (2 x 2 chunks) equal 1 stage (every loss within 1e-6; in fact bit for
    bit);
  - it parts from bf16 products alone (the stores do round) and stays
    within 1e-2 of float32;
  - every stage's arena is smaller than the bf16-products build's;
  - the GPT's Adam run checkpointed after 2 steps and resumed to 4 gives
    the uninterrupted run's losses and checkpoint bytes;
  - the MLP's first loss equals numpy's emulation of each build's
    roundings within 1e-6, closer than to the other build's;
  - every PyTorch export of test/e2e/torch_exported trains on 2 stages
    with the 1-stage losses, finite;
  - the bf16 kernels (elementwise, softmax and normalisation reading and
    writing bfloat16 themselves) give, bit for bit, the losses of
    `--activations bf16-casts`, where every op is between casts and runs
    its float32 kernel (MLP, GPT, ResNet on 1 and 2 stages, every export
    on 1), and their arenas are no larger (smaller for GPT and ResNet).
"""
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from e2e_common import Checks, losses_of, pipec_workdir_args, run  # noqa: E402

MODELS = {
    "mlp": ("examples/mlp/make_mlp.py", ["--batch", "8"], "0.05"),
    "gpt": ("examples/gpt/make_gpt.py", ["--batch", "4", "--seq", "16", "--layers", "2", "--dim", "32",
                                         "--heads", "2", "--vocab", "64"], "0.1"),
    "resnet": ("examples/resnet/make_resnet.py", ["--batch", "8", "--width", "8", "--blocks", "1"], "0.05"),
}
BUILDS = {  # name: compile flags
    "f32-s1": ["--stages", "1", "--microbatches", "2"],
    "bf16-s1": ["--stages", "1", "--microbatches", "2", "--precision", "bf16"],
    "bf16-s2": ["--stages", "2", "--microbatches", "2", "--precision", "bf16"],
    "bf16a-s1": ["--stages", "1", "--microbatches", "2", "--precision", "bf16", "--activations", "bf16"],
    "bf16a-s2": ["--stages", "2", "--microbatches", "2", "--precision", "bf16", "--activations", "bf16"],
    "bf16c-s1": ["--stages", "1", "--microbatches", "2", "--precision", "bf16", "--activations", "bf16-casts"],
    "bf16c-s2": ["--stages", "2", "--microbatches", "2", "--precision", "bf16", "--activations",
                 "bf16-casts"],
    "bf16a-zb": ["--stages", "2", "--microbatches", "2", "--precision", "bf16", "--activations", "bf16",
                 "--schedule", "zb-h1"],
    "bf16a-rc": ["--stages", "2", "--microbatches", "2", "--precision", "bf16", "--activations", "bf16",
                 "--recompute", "full"],
    "bf16a-il": ["--stages", "2", "--microbatches", "2", "--precision", "bf16", "--activations", "bf16",
                 "--schedule", "interleaved", "--chunks", "2"],
}


def rel_diff(a, b):
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def to_bf16(x):
    """float32 array rounded to the nearest bfloat16 (ties to even)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def mlp_first_loss(model_path, x, y, store_bf16):
    """The MLP's loss on the first global batch, computed here in numpy the
    way --precision bf16 defines it: each Gemm multiplies its operands
    rounded to bfloat16 and adds the float32 bias; with store_bf16
    (--activations bf16) every op's result is rounded to bfloat16 too."""
    import onnx
    from onnx import numpy_helper
    model = onnx.load(model_path)
    w = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in model.graph.initializer}
    store = to_bf16 if store_bf16 else (lambda v: v)
    h = store(x.reshape(x.shape[0], -1).astype(np.float32))
    for node in model.graph.node:
        if node.op_type == "Gemm":
            wt, b = w[node.input[1]], w[node.input[2]]
            h = store((to_bf16(h) @ to_bf16(wt).T + b).astype(np.float32))
        elif node.op_type == "Relu":
            h = store(np.maximum(h, 0))
        elif node.op_type == "Tanh":
            h = store(np.tanh(h).astype(np.float32))
    z = h.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean())


def main():
    a = pipec_workdir_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    checks = Checks()
    for model, (script, flags, lr) in MODELS.items():
        d = os.path.join(a.workdir, model)
        os.makedirs(d)
        rc, out = run(["/usr/bin/python3", os.path.join(ROOT, script), "-o", os.path.join(d, "model.onnx"),
                       "--data-steps", "2"] + flags)
        if rc != 0:
            checks.report(False, f"{model}: generate", out[-500:])
            continue
        for f in ("x.npy", "y.npy"):
            if os.path.exists(f):
                os.replace(f, os.path.join(d, f))
        loss = {}
        for build, cflags in BUILDS.items():
            o = os.path.join(d, build)
            rc, out = run([a.pipec, "compile", os.path.join(d, "model.onnx"), "-o", o, "--quiet"] + cflags)
            if rc == 0:
                rc, out = run([a.pipec, "train", o, "--steps", "4", "--lr", lr, "--quiet",
                               "--inputs", os.path.join(d, "x.npy"), "--labels", os.path.join(d, "y.npy")],
                              env=env)
            if rc != 0:
                checks.report(False, f"{model} {build}", f"exit {rc}: {out[-600:]}")
                continue
            loss[build] = losses_of(o)
        if len(loss) != len(BUILDS):
            continue
        diff = rel_diff(loss["bf16-s2"], loss["bf16-s1"])
        checks.report(diff <= 1e-6, f"{model}: bf16 on 2 stages equals 1 stage",
                      f"max rel loss diff {diff:.1e} over 4 steps")
        diff = rel_diff(loss["bf16-s1"], loss["f32-s1"])
        checks.report(1e-5 < diff < 1e-2, f"{model}: bf16 parts from f32 within bfloat16 rounding",
                      f"max rel loss diff {diff:.2e} (losses f32 {loss['f32-s1'][-1]:.6f}, "
                      f"bf16 {loss['bf16-s1'][-1]:.6f})")
        # --activations bf16: the same numbers on every schedule, apart from
        # bf16 products alone by its roundings, and half the stash.
        for build in ("bf16a-s2", "bf16a-zb", "bf16a-rc", "bf16a-il"):
            diff = rel_diff(loss[build], loss["bf16a-s1"])
            checks.report(diff <= 1e-6, f"{model}: {build} equals bf16a on 1 stage",
                          f"max rel loss diff {diff:.1e} over 4 steps")
        diff = rel_diff(loss["bf16a-s1"], loss["bf16-s1"])
        far = rel_diff(loss["bf16a-s1"], loss["f32-s1"])
        checks.report(1e-6 < diff and far < 1e-2, f"{model}: bf16 activations part from bf16 products, track f32",
                      f"max rel loss diff {diff:.2e} from bf16 products, {far:.2e} from f32")
        arenas = {b: [st["arena_bytes"] for st in json.load(open(os.path.join(d, b, "manifest.json")))["stages"]]
                  for b in ("bf16-s2", "bf16a-s2", "bf16c-s2")}
        checks.report(all(a < f for a, f in zip(arenas["bf16c-s2"], arenas["bf16-s2"])),
                      f"{model}: bf16 activations shrink every stage's arena",
                      f"arena bytes {arenas['bf16c-s2']} against {arenas['bf16-s2']}")
        # The bf16 kernels (elementwise, softmax, normalisation reading and
        # writing bf16 themselves) compute what their ops between casts do.
        for s1, s2 in (("bf16a-s1", "bf16c-s1"), ("bf16a-s2", "bf16c-s2")):
            checks.report(loss[s1] == loss[s2], f"{model}: {s1} (bf16 kernels) equals {s2} (casts) bit for bit",
                          f"losses {loss[s1]} and {loss[s2]}")
        # (The MLP's arenas hold its float32 inputs at their peak: no
        # smaller there.)
        checks.report(all(a <= c for a, c in zip(arenas["bf16a-s2"], arenas["bf16c-s2"]))
                      and (model == "mlp" or sum(arenas["bf16a-s2"]) < sum(arenas["bf16c-s2"])),
                      f"{model}: the bf16 kernels' arenas are smaller than the casts'",
                      f"arena bytes {arenas['bf16a-s2']} against {arenas['bf16c-s2']}")
        if model == "gpt":
            # A checkpoint of a bf16-activation run resumes bit for bit
            # (Adam: the optimizer state is float32 in it).
            full, part = os.path.join(d, "bf16a-adam-4"), os.path.join(d, "bf16a-adam-2+2")
            data = ["--lr", "0.01", "--quiet", "--inputs", os.path.join(d, "x.npy"),
                    "--labels", os.path.join(d, "y.npy")]
            rc, out = run([a.pipec, "compile", os.path.join(d, "model.onnx"), "-o", full, "--quiet",
                           "--optimizer", "adam"] + BUILDS["bf16a-s2"])
            if rc == 0:
                shutil.copytree(full, part)
                for o, steps, extra in ((full, "4", []), (part, "2", []), (part, "4", ["--resume"])):
                    rc, out = run([a.pipec, "train", o, "--steps", steps] + extra + data, env=env)
                    if rc != 0:
                        break
            same = rc == 0 and losses_of(full) == losses_of(part) and all(
                open(os.path.join(full, "checkpoints", "step-000004", f"stage{k}.safetensors"), "rb").read()
                == open(os.path.join(part, "checkpoints", "step-000004", f"stage{k}.safetensors"), "rb").read()
                for k in (0, 1))
            checks.report(same, "gpt: bf16 activations, 2 + 2 steps resumed equal 4 (losses, checkpoints)",
                          f"exit {rc}" + ("" if rc == 0 else f": {out[-400:]}"))
        if model == "mlp":
            x, yl = np.load(os.path.join(d, "x.npy")), np.load(os.path.join(d, "y.npy"))
            batch = int(MODELS[model][1][1])
            for build, store in (("bf16-s1", False), ("bf16a-s1", True)):
                want = mlp_first_loss(os.path.join(d, "model.onnx"), x[:batch], yl[:batch], store)
                other = mlp_first_loss(os.path.join(d, "model.onnx"), x[:batch], yl[:batch], not store)
                got = loss[build][0]
                checks.report(abs(got - want) <= 1e-6 * abs(want) < abs(other - want),
                              f"mlp: {build}'s first loss is numpy's emulation of its rounding",
                              f"pipec {got:.8f}, numpy {want:.8f}, the other rounding {other:.8f}")
        manifest = json.load(open(os.path.join(d, "bf16-s2", "manifest.json")))
        _, meta = run(["strings", os.path.join(d, "bf16-s2", "stage0")])
        meta = meta.replace(" ", "")
        checks.report('"matmul_precision":"bf16"' in meta and '"precision":"f32"' in meta,
                      f"{model}: stage description", f"manifest precision {manifest.get('precision')!r}")
    # The PyTorch exports (test/e2e/torch_exported: BERT, DenseNet's padded
    # pools, MobileNet's depthwise convolutions, RegNet's groups, a GPT with
    # tied weights, ...) with bf16 activations: 2 stages equal 1, finite.
    exports = os.path.join(ROOT, "test", "e2e", "torch_exported")
    for name in sorted(os.listdir(exports)):
        folder = os.path.join(exports, name)
        if not os.path.exists(os.path.join(folder, "model.onnx")):
            continue
        batch = int(np.load(os.path.join(folder, "x.npy"), mmap_mode="r").shape[0])
        runs = {}
        for stages, act in (("1", "bf16"), ("2", "bf16"), ("1", "bf16-casts")):
            key = stages if act == "bf16" else "casts"
            o = os.path.join(a.workdir, f"export-{name}-s{key}")
            rc, out = run([a.pipec, "compile", os.path.join(folder, "model.onnx"), "-o", o, "--quiet",
                           "--batch", str(batch), "--stages", stages, "--microbatches", "2",
                           "--precision", "bf16", "--activations", act])
            if rc == 0:
                rc, out = run([a.pipec, "train", o, "--steps", "2", "--lr", "0.01", "--quiet",
                               "--inputs", os.path.join(folder, "x.npy"),
                               "--labels", os.path.join(folder, "y.npy")], env=env)
            if rc != 0:
                checks.report(False, f"export {name}: bf16 activations on {stages} stage(s)",
                              f"exit {rc}: {out[-600:]}")
                break
            runs[key] = losses_of(o)
        if len(runs) == 3:
            finite = all(np.isfinite(runs["1"]))
            checks.report(finite and runs["2"] == runs["1"] == runs["casts"],
                          f"export {name}: bf16 activations, 2 stages equal 1 and the casts' form",
                          f"losses {runs['1']}, {runs['2']}, casts {runs['casts']}")
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())
