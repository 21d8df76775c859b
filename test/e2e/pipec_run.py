#!/usr/bin/python3
"""pipec-run without the compiler: a training machine needs only the run
folder, pipec-run and the runtime's shared libraries.

    /usr/bin/python3 test/e2e/pipec_run.py --pipec build/bin/pipec \
        --pipec-run build/bin/pipec-run --workdir DIR

1. pipec-run links no LLVM and no MLIR: no such library among its ELF
   NEEDED entries and no llvm:: or mlir:: symbol in it.
2. The MLP (examples/mlp) compiled on 2 stages x 4 microbatches is copied,
   with pipec-run alone, into a folder of its own (as onto a node without
   the compiler); pipec-run trains it there. Losses and every tensor of the
   last checkpoint are bit-identical to `pipec train` on the original
   folder, and `--trace` merges both ranks' events into one Chrome trace.
3. Bad use gets pipec's one-line errors: a folder that is not a compile
   output, an unknown option (exit 2); --help exits 0.

Prints one line per check and `N passed, M failed`; exits 1 on any failure.
"""
import argparse
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from e2e_common import Checks, losses_of, run  # noqa: E402
from safetensors_io import latest_checkpoint, load_checkpoint  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
STEPS = 3


def tail(text, n=600):
    return text.strip()[-n:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipec", required=True)
    ap.add_argument("--pipec-run", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    checks = Checks()
    work = os.path.abspath(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)

    # 1. What pipec-run links.
    rc, dyn = run(["readelf", "-d", args.pipec_run])
    needed = [line.split("[")[1].rstrip("]") for line in dyn.splitlines() if "(NEEDED)" in line]
    bad = [lib for lib in needed if "LLVM" in lib or "MLIR" in lib or "mlir" in lib]
    checks.report(rc == 0 and needed and not bad, "no LLVM/MLIR libraries",
                  f"NEEDED {', '.join(needed)}")
    rc, syms = run(["nm", "-C", args.pipec_run])
    foreign = [s for s in syms.splitlines() if "llvm::" in s or "mlir::" in s]
    checks.report(rc == 0 and not foreign, "no LLVM/MLIR symbols",
                  f"{len(foreign)} found{': ' + foreign[0] if foreign else ''}; "
                  f"{os.path.getsize(args.pipec_run) // 1024} KiB")

    # 2. Train the same compile both ways.
    out = os.path.join(work, "out")
    rc, text = run([args.pipec, "compile", os.path.join(REPO, "examples", "mlp", "mlp.onnx"),
                    "--stages", "2", "--microbatches", "4", "-o", out, "--quiet"])
    if rc != 0:
        checks.report(False, "compile", tail(text))
        return checks.summary()
    node = os.path.join(work, "node")
    shutil.copytree(out, os.path.join(node, "run"))
    os.makedirs(os.path.join(node, "bin"))
    runner = os.path.join(node, "bin", "pipec-run")
    shutil.copy2(args.pipec_run, runner)
    # PATH without the build's bin folder: nothing of the compiler is found.
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if os.path.abspath(p) != os.path.dirname(os.path.abspath(args.pipec)))
    rc1, text1 = run([args.pipec, "train", out, "--steps", str(STEPS), "--lr", "0.1", "--quiet"])
    trace = os.path.join(node, "trace.json")
    rc2, text2 = run([runner, os.path.join(node, "run"), "--steps", str(STEPS), "--lr", "0.1",
                      "--quiet", "--trace", trace], env=env)
    if rc1 != 0 or rc2 != 0:
        checks.report(False, "train both ways", f"pipec train exit {rc1}: {tail(text1)} | "
                      f"pipec-run exit {rc2}: {tail(text2)}")
        return checks.summary()
    a, b = losses_of(out), losses_of(os.path.join(node, "run"))
    checks.report(len(a) == STEPS and a == b, "losses bit-identical", f"pipec train {a}, pipec-run {b}")
    wa = load_checkpoint(latest_checkpoint(os.path.join(out, "checkpoints")))
    wb = load_checkpoint(latest_checkpoint(os.path.join(node, "run", "checkpoints")))
    same = wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)
    checks.report(same and len(wa) > 0, "checkpoint bit-identical", f"{len(wa)} tensors")
    try:
        with open(trace) as f:
            doc = json.load(f)
        events = doc["traceEvents"]
        pids = {e.get("pid") for e in events}
        ok = len(events) > 0 and len(pids) >= 2 and doc.get("displayTimeUnit") == "ms"
        leftover = [n for n in os.listdir(node) if n.startswith("trace.rank")]
        checks.report(ok and not leftover, "trace merged",
                      f"{len(events)} events from {len(pids)} ranks; rank files left: {leftover}")
    except (OSError, ValueError, KeyError) as e:
        checks.report(False, "trace merged", str(e))

    # 3. Errors and help.
    rc, text = run([runner, work, "--steps", "1"], env=env)
    checks.report(rc == 1 and "pipec-run: error:" in text and "manifest.json" in text
                  and len(text.strip().splitlines()) == 1,
                  "not a compile output", f"exit {rc}: {tail(text)}")
    rc, text = run([runner, os.path.join(node, "run"), "--stepz", "1"], env=env)
    checks.report(rc == 2 and "unknown option '--stepz'" in text, "unknown option", f"exit {rc}: {tail(text, 120)}")
    rc, text = run([runner, "--help"], env=env)
    checks.report(rc == 0 and "usage: pipec-run" in text and "--steps" in text, "--help", f"exit {rc}")
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())
