#!/usr/bin/python3
"""Device models calibrated on measured profiles, checked on other models.

    /usr/bin/python3 bench/calibration.py [--pipec build/bin/pipec] [--device cpu]
        [--microbatch 8] [--workdir DIR]

`pipec profile` measures every op of four example models on this machine
(GPT: 4 layers, d=128, 4 heads, sequence 64; ResNet: width 16, 2 blocks;
VGG: the example's config; the MLP of examples/mlp), and records beside
each op's forward and backward times the work the cost model counts for
it (FLOPs and bytes). Then, for each model in turn, `pipec calibrate` fits
the datasheet model's two efficiencies (share of the peak reached by the
compute-bound kernels, share of the bandwidth by the memory-bound ones) to
that model's profile, and predicts the kernels of the other three with the
datasheet model and with the calibrated one. Printed per pair: predicted
over measured time summed over the kernels, and the per-kernel error
factor (geometric mean of max(p/m, m/p), weighted by measured time).

The point: a calibration taken on one model predicts the others (shapes
it has not seen) much better than the datasheet peak does. A benchmark,
not a test: the fit depends on the machine's BLAS and load.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

MODELS = {
    "gpt": ("examples/gpt/make_gpt.py", ["--batch", "32", "--seq", "64", "--layers", "4", "--dim", "128",
                                         "--heads", "4", "--vocab", "256"]),
    "resnet": ("examples/resnet/make_resnet.py", ["--batch", "32", "--width", "16", "--blocks", "2"]),
    "vgg": ("examples/vgg/make_vgg.py", ["--batch", "32"]),
    "mlp": ("examples/mlp/make_mlp.py", ["--batch", "32"]),
}


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout[-3000:]}")
    return p.stdout


def fits(text):
    """{profile path: {"datasheet": (ratio, factor), "calibrated": (ratio, factor)}} from pipec calibrate."""
    out, current = {}, None
    for line in text.splitlines():
        m = re.match(r"(\S+\.json): [\d.]+ ms measured", line)
        if m:
            current = out.setdefault(m.group(1), {})
            continue
        m = re.match(r"\s+(\S+)(?: \S+)?\s+[\d.]+ ms\s+ratio\s+([\d.]+)\s+per kernel x([\d.]+)", line)
        if m and current is not None:
            current["datasheet" if m.group(1) == "datasheet" else "calibrated"] = (float(m.group(2)),
                                                                                   float(m.group(3)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipec", default=os.path.join(ROOT, "build", "bin", "pipec"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--microbatch", type=int, default=8)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="pipec-calibration-")
    os.makedirs(work, exist_ok=True)
    env_note = f"{os.cpu_count()} cores"
    profiles = {}
    for name, (script, extra) in MODELS.items():
        onnx = os.path.join(work, f"{name}.onnx")
        run(["/usr/bin/python3", os.path.join(ROOT, script), "-o", onnx] + extra)
        profiles[name] = os.path.join(work, f"{name}.profile.json")
        run([args.pipec, "profile", onnx, "-o", profiles[name], "--steps", "3",
             "--microbatch", str(args.microbatch)])
    print(f"device model '{args.device}' calibrated on one model, predicting the others "
          f"(microbatch {args.microbatch}, {env_note})")
    print(f"{'calibrated on':14} {'eff. compute':>12} {'eff. memory':>12}   "
          + "   ".join(f"{m:>20}" for m in MODELS))
    print(f"{'':14} {'':>12} {'':>12}   " + "   ".join(f"{'sum ratio, x/kernel':>20}" for _ in MODELS))
    datasheet = None
    for name in MODELS:
        others = [profiles[m] for m in MODELS if m != name]
        text = run([args.pipec, "calibrate", profiles[name], "--device", args.device, "--check", ",".join(others),
                    "-o", os.path.join(work, f"{args.device}-{name}.json")])
        eff = re.search(r"compute-bound.*efficiency ([\d.]+)", text).group(1)
        mem = re.search(r"memory-bound.*efficiency ([\d.]+)", text).group(1)
        f = fits(text)
        cells = []
        for m in MODELS:
            r, x = f[profiles[m]]["calibrated"]
            cells.append(f"{r:8.2f}  x{x:5.2f}{'*' if m == name else ' '}")
        print(f"{name:14} {eff:>12} {mem:>12}   " + "   ".join(f"{c:>20}" for c in cells))
        if datasheet is None:
            datasheet = {m: f[profiles[m]]["datasheet"] for m in MODELS}
    cells = [f"{datasheet[m][0]:8.2f}  x{datasheet[m][1]:5.2f} " for m in MODELS]
    print(f"{'datasheet':14} {'1':>12} {'1':>12}   " + "   ".join(f"{c:>20}" for c in cells))
    print("(* the model the calibration was fitted on; ratio = predicted / measured time summed "
          "over the kernels; x = per-kernel error factor)")
    print(f"(work folder {work})")


if __name__ == "__main__":
    main()
