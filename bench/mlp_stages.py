#!/usr/bin/python3
"""Throughput of the example MLP on 1, 2 and 4 pipeline stages (CPU, MPI).

    /usr/bin/python3 bench/mlp_stages.py [--pipec build/bin/pipec] [--steps 40]
        [--microbatches 8] [--schedule 1f1b-flush] [--batch 64]

Compiles examples/mlp (generated if missing) for each stage count, trains
`--steps` steps on synthetic data and reports the median samples/s of the
steps after the first five, the ratio to one stage, and the compile time.
On a 2-core machine more than two stage processes oversubscribe the cores:
the numbers show the cost of the pipeline's communication, not a speedup.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipec", default=os.path.join(ROOT, "build", "bin", "pipec"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--schedule", default="1f1b-flush")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--stages", default="1,2,4")
    args = ap.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    work = tempfile.mkdtemp(prefix="pipec-bench-")
    model = os.path.join(work, "mlp.onnx")
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "examples/mlp/make_mlp.py"),
                    "-o", model, "--batch", str(args.batch)], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    rows = []
    for p in [int(s) for s in args.stages.split(",")]:
        out = os.path.join(work, f"p{p}")
        t0 = time.time()
        subprocess.run([args.pipec, "compile", model, "--stages", str(p),
                        "--microbatches", str(args.microbatches), "--schedule",
                        args.schedule, "-o", out, "--quiet"], check=True, env=env)
        compile_s = time.time() - t0
        subprocess.run([args.pipec, "train", out, "--steps", str(args.steps),
                        "--quiet"], check=True, env=env, stdout=subprocess.DEVNULL)
        with open(os.path.join(out, "metrics.jsonl")) as fh:
            metrics = [json.loads(line) for line in fh]
        rates = [m["samples_per_s"] for m in metrics[5:]] or [m["samples_per_s"] for m in metrics]
        rows.append((p, statistics.median(rates), compile_s))
    base = rows[0][1]
    print(f"MLP 784-256-128-64-10, global batch {args.batch}, {args.microbatches} "
          f"microbatches, {args.schedule}, {os.cpu_count()} cores")
    print(f"{'stages':>6} {'samples/s':>12} {'vs 1 stage':>11} {'compile s':>10}")
    for p, rate, cs in rows:
        print(f"{p:>6} {rate:>12.1f} {rate / base:>10.2f}x {cs:>10.2f}")


if __name__ == "__main__":
    sys.exit(main())
