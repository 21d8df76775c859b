#!/usr/bin/python3
"""The GPT-3 anchor's measured-efficiency chain, end to end, on a profile
whose times are known:

    /usr/bin/python3 test/e2e/gpt3_anchor_chain.py --pipec build/bin/pipec \
        --plan-quality build/bench/plan_quality --workdir DIR

bench/gpt3_layer_kernels.py times the thirteen primitives of a GPT-3
layer on a GPU; here the same primitives (its own list, counts and
profile ops) get times made from h100-bf16's datasheet roofline at chosen
shares: the products at 60% of the peak plus 5 us, the memory-bound
kernels at 70% of the bandwidth plus the row's 4 us launch. Then the real
commands:
  1. `pipec calibrate` on that profile must find the shares (matmul 0.60
     with a 5 us overhead, each memory-bound kind 0.70), and give each
     primitive its time back;
  2. `make_profiles.py --measured ... --only gpt3-175b-tp8.json` moves them
     to the A100 row: every layer's product time must be the datasheet
     profile's / 0.60 plus the overheads, within 1%, and the profile must
     still parse;
  3. `plan_quality` must print the anchor table for the written profile,
     slower than the datasheet's rows (a lower TFLOP/s per GPU).
"""

import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "examples", "profiles"))
import gpt3_layer_kernels  # noqa: E402
import make_profiles  # noqa: E402

MATMUL_SHARE, MATMUL_OVERHEAD, MEMORY_SHARE = 0.60, 5e-6, 0.70
LAUNCH = make_profiles.DEVICES["h100-bf16"][3]  # the base row's overhead


def synthetic_seconds(kernels, peak, bandwidth):
    """What a GPU reaching the chosen shares would measure: the products
    at MATMUL_SHARE of the roofline plus MATMUL_OVERHEAD, the others at
    MEMORY_SHARE of the bandwidth plus the row's launch overhead."""
    t = 0.0
    for flops, nbytes, kind in kernels:
        if kind == "matmul":
            t += max(flops / peak, nbytes / bandwidth) / MATMUL_SHARE + \
                MATMUL_OVERHEAD
        else:
            t += nbytes / (bandwidth * MEMORY_SHARE) + LAUNCH
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipec", required=True)
    ap.add_argument("--plan-quality", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    failures, checks = [], [0]

    def check(ok, what):
        checks[0] += 1
        print(("ok: " if ok else "FAILED: ") + what)
        if not ok:
            failures.append(what)

    peak, bandwidth = make_profiles.DEVICES["h100-bf16"][:2]
    ops = []
    for name, kind, fwd, bwd in gpt3_layer_kernels.primitives():
        ops += gpt3_layer_kernels.profile_ops(
            name, kind, fwd, bwd, synthetic_seconds(fwd, peak, bandwidth),
            synthetic_seconds(bwd, peak, bandwidth))
    measured = os.path.join(args.workdir, "profile_gpt3_layer.json")
    with open(measured, "w") as f:
        json.dump({"format": "pipec.profile/1", "device": "synthetic",
                   "microbatch": 1, "ops": ops}, f)

    device = os.path.join(args.workdir, "synthetic-gpt3-layer.json")
    p = subprocess.run([args.pipec, "calibrate", measured, "--device",
                        "h100-bf16", "--name", "synthetic-gpt3-layer",
                        "-o", device], capture_output=True, text=True)
    print(p.stdout + p.stderr)
    check(p.returncode == 0, "pipec calibrate ran")
    if p.returncode != 0:
        return 1
    with open(device) as f:
        fit = json.load(f)
    line = fit["kinds"].get("matmul", {})
    # (A product's backward is two kernels, with two overheads, that the
    # profile times as one: the fitted overhead lies between one and two.)
    check(abs(line.get("efficiency", 0) - MATMUL_SHARE) < 0.01 and
          MATMUL_OVERHEAD * 0.9 < line.get("overhead", 0) <
          2.1 * MATMUL_OVERHEAD,
          "calibrate found matmul's share and overhead: %s" % line)
    memory_kinds = ("layer_norm", "softmax", "dropout", "add", "gelu")
    shares = {k: fit["kinds"].get(k, {}).get("efficiency", 0)
              for k in memory_kinds}
    check(all(abs(v - MEMORY_SHARE) < 0.01 for v in shares.values()),
          "calibrate found each memory-bound kind's share: %s" %
          {k: round(v, 3) for k, v in shares.items()})
    # The fit, read back by make_profiles.py on the device it was measured
    # on, gives every primitive its synthetic time again (to 3%: the
    # products' fitted overhead, above).
    own = make_profiles.MeasuredDevice(device)
    worst = max(abs(sum(own.seconds(*k) for k in kernels) /
                    synthetic_seconds(kernels, peak, bandwidth) - 1)
                for _, _, fwd, bwd in gpt3_layer_kernels.primitives()
                for kernels in (fwd, bwd))
    check(worst < 0.03, "the fit gives back each primitive's time within "
          "3%% (worst %.2f%%)" % (100 * worst))

    written = os.path.join(args.workdir, "gpt3-175b-tp8-measured.json")
    p = subprocess.run([sys.executable, os.path.join(
        ROOT, "examples", "profiles", "make_profiles.py"), "--measured",
        device, "--only", "gpt3-175b-tp8.json", "-o", written],
        capture_output=True, text=True)
    print(p.stdout + p.stderr)
    check(p.returncode == 0, "make_profiles.py --measured ran")
    if p.returncode != 0:
        return 1
    # One layer by hand: the A100 row's rooflines at the fitted lines.
    layer = make_profiles.Layer("layer", "transformer", 2)
    make_profiles.transformer_layer(layer, 1, 2048, 12288, 96, 8,
                                    make_profiles.NVSWITCH_A100_BW,
                                    make_profiles.NVSWITCH_LATENCY)
    a100 = make_profiles.DEVICES["a100-80gb-fp16"]
    expected = sum(max(f / a100[0], b / a100[1]) / MATMUL_SHARE +
                   MATMUL_OVERHEAD for f, b, k in layer.fwd if k == "matmul")
    moved = make_profiles.MeasuredDevice(device, as_row="a100-80gb-fp16")
    got = sum(moved.seconds(*k) for k in layer.fwd if k[2] == "matmul")
    check(abs(got / expected - 1) < 0.01,
          "a layer's products on the A100 row: %.4g s, expected %.4g s" %
          (got, expected))
    with open(written) as f:
        doc = json.load(f)
    check(doc["device"] == "a100-80gb-fp16" and
          doc["device_model"]["kernel_efficiencies_from"] ==
          "synthetic-gpt3-layer", "the profile names its row and its fit")

    p = subprocess.run([args.plan_quality, ROOT, written],
                       capture_output=True, text=True)
    tables = re.findall(r"\n +384 +4 +[0-9.]+ +([0-9.]+) +153", p.stdout)
    print(p.stdout[-900:] + p.stderr)
    check(p.returncode == 0 and len(tables) == 2 and
          float(tables[1]) < float(tables[0]),
          "plan_quality's anchor on the measured profile: %s TFLOP/s per GPU "
          "against %s with the datasheet" %
          (tables[1] if len(tables) == 2 else "?",
           tables[0] if tables else "?"))
    print("%d passed, %d failed" % (checks[0] - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
