#!/usr/bin/python3
"""Memory and time of activation recomputation (CPU, MPI).

    /usr/bin/python3 bench/recompute.py [--pipec build/bin/pipec] [--steps 12]
        [--stages 4] [--microbatches 8] [--models gpt,resnet]

For the GPT example (4 layers, d=128, 4 heads, sequence 64, batch 32) and
the ResNet example (width 16, 2 blocks per stage, batch 32), compiled with
1f1b-flush on `--stages` stages and `--microbatches` microbatches and
`--recompute none|full|selective`, and with `--precision bf16` (products
in bf16) without and with `--activations bf16` (activations, messages and
stash in bfloat16; also with selective recomputation), and the same two
with `--activations bf16-casts` (every op between casts: the reference
form the bf16 kernels replace), prints per mode:
- the planned arena per stage (`arena_bytes` of the rank summaries) and
  its sum, with the ratio to `none`;
- the peak RSS per rank (`max_rss_bytes`: the arena plus the runtime, MPI
  and the binary) and its sum;
- the median step time after the first two steps, with the ratio to `none`
  (the recomputation's time overhead);
- the simulator's memory model for the same plan (`pipec profile` of the
  model, `pipec simulate OUT/plan.json`, whose stages carry the compiled
  recomputation modes): the arena it predicts per stage, as the ratio of
  the sums to the planned arenas and the worst stage's ratio.
Losses are compared with `none` (they must be identical), the bf16
activation rows, kernels and casts, with each other (identical) and with
float32.
"""
import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

MODELS = {
    "gpt": ("examples/gpt/make_gpt.py", ["--batch", "32", "--seq", "64", "--layers", "4", "--dim", "128",
                                         "--heads", "4", "--vocab", "256"], 0.1),
    "resnet": ("examples/resnet/make_resnet.py", ["--batch", "32", "--width", "16", "--blocks", "2"], 0.05),
}

BF16 = ["--precision", "bf16"]
BF16A = BF16 + ["--activations", "bf16"]
BF16C = BF16 + ["--activations", "bf16-casts"]
# Rows: (label, --recompute, precision flags); ratios are to the first.
MODES = [("none", "none", []), ("full", "full", []), ("selective", "selective", []),
         ("bf16", "none", BF16), ("bf16 act", "none", BF16A), ("bf16 act+selective", "selective", BF16A),
         ("bf16 casts", "none", BF16C), ("bf16 casts+selective", "selective", BF16C)]


def run(cmd, env):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout[-2000:]}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipec", default=os.path.join(ROOT, "build", "bin", "pipec"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--models", default="gpt,resnet")
    args = ap.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    work = tempfile.mkdtemp(prefix="pipec-recompute-")
    topology = os.path.join(work, "topology.json")
    with open(topology, "w") as f:
        json.dump({"format": "pipec.topology/1", "device_memory_bytes": 1 << 36,
                   "levels": [{"name": "node", "count": args.stages, "bandwidth": 1e10, "latency": 1e-5}]}, f)
    print(f"1f1b-flush, {args.stages} stages, {args.microbatches} microbatches, {args.steps} steps, "
          f"{os.cpu_count()} cores")
    for model in args.models.split(","):
        script, extra, lr = MODELS[model]
        d = os.path.join(work, model)
        os.makedirs(d)
        onnx_path = os.path.join(d, f"{model}.onnx")
        run(["/usr/bin/python3", os.path.join(ROOT, script), "-o", onnx_path, "--data-steps", "1"] + extra, env)
        data = ["--inputs", os.path.join(d, "x.npy"), "--labels", os.path.join(d, "y.npy")]
        profiles = {}
        print(f"\n{model} ({' '.join(extra)})")
        print(f"{'mode':20} {'arena/stage (KiB)':34} {'arena':>9} {'ratio':>6} {'peak RSS':>9} "
              f"{'step ms':>8} {'ratio':>6} {'sim/arena':>9} {'worst':>6}  losses")
        base = None
        reference = {}
        for label, mode, flags in MODES:
            # The profile of the same precision (its stash and message bytes
            # are what the simulator predicts the arena from); the cuts of
            # every row come from the float32 one, so the rows compare.
            key = tuple(flags)
            if key not in profiles:
                profiles[key] = os.path.join(d, f"profile{len(profiles)}.json")
                run([args.pipec, "profile", onnx_path, "-o", profiles[key], "--steps", "3",
                     "--microbatch", str(int(extra[extra.index("--batch") + 1]) // args.microbatches)] + flags,
                    env)
            profile = profiles[key]
            o = os.path.join(d, label.replace(" ", "_").replace("+", "_"))
            run([args.pipec, "compile", onnx_path, "-o", o, "--quiet", "--stages", str(args.stages),
                 "--microbatches", str(args.microbatches), "--recompute", mode, "--profile", profiles[()]]
                + flags, env)
            run([args.pipec, "train", o, "--steps", str(args.steps), "--lr", str(lr), "--quiet",
                 "--summary-out", os.path.join(o, "summary.json"), *data], env)
            summaries = sorted((json.load(open(f)) for f in glob.glob(os.path.join(o, "summary*.json"))),
                               key=lambda s: s["rank"])
            arenas = [s["arena_bytes"] for s in summaries]
            rss = sum(s.get("max_rss_bytes", 0) for s in summaries)
            metrics = [json.loads(line) for line in open(os.path.join(o, "metrics.jsonl"))]
            step = statistics.median(m["wall_s"] for m in metrics[2:]) * 1e3
            losses = [m["loss"] for m in metrics]
            sim = run([args.pipec, "simulate", os.path.join(o, "plan.json"), "--profile", profile,
                       "--topology", topology], env)
            predicted = [int(x) for x in re.findall(r"arena (\d+) bytes", sim)]
            if len(predicted) != len(arenas):
                sys.exit(f"pipec simulate printed no arena per stage:\n{sim}")
            worst = max((p / a for p, a in zip(predicted, arenas)), key=lambda r: abs(r - 1))
            if base is None:
                base = (sum(arenas), step, losses)
            # Recomputation changes no number: identical to the row without
            # it of the same precision (the casts' form: to the bf16
            # kernels' rows); bf16 rows say how far they are from float32.
            same = reference.setdefault(tuple(BF16A) if flags == BF16C else key, losses)
            if flags:
                far = max(abs(a - b) / abs(b) for a, b in zip(losses, base[2]))
                verdict = ("identical" if losses == same else "DIFFER") + f", {far:.1e} from f32"
            else:
                verdict = "identical" if losses == same else "DIFFER"
            print(f"{label:20} {' '.join(f'{a / 1024:.0f}' for a in arenas):34} "
                  f"{sum(arenas) / 1024:8.0f}K {sum(arenas) / base[0]:6.2f} {rss / 2**20:8.0f}M "
                  f"{step:8.2f} {step / base[1]:6.2f} {sum(predicted) / sum(arenas):9.3f} {worst:6.3f}  "
                  f"{verdict}")
    print(f"\n(work folder {work})")


if __name__ == "__main__":
    main()
