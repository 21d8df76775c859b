#!/usr/bin/python3
"""`pipec topology --measure` writes a measured topology the planners read.

    /usr/bin/python3 test/e2e/topology_measure.py --pipec build/bin/pipec --workdir DIR

pipec-linkprobe runs as two MPI ranks (through the launcher `pipec train`
uses) and times messages of 8 B to 64 MiB; pipec fits latency + bytes /
bandwidth to them. Checked: the topology has the processes asked for, a
positive latency under a millisecond and a bandwidth between 10 MB/s and
1 TB/s (processes on one machine), `processors` = the cores when the
processes outnumber them, the fit's line is printed, and `pipec plan`
plans on it; `--fit` fits a probe file run by hand (`--processors` set);
the CUDA probe without a GPU refuses clearly; without --measure the
command says what it does instead; `--bind-cores` (topology and train):
the ranks pinned in rank order as the topology says, the same losses.
Prints `N passed, M failed`.
"""
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from e2e_common import Checks, pipec_workdir_args, run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))


def main():
    args = pipec_workdir_args(__doc__.split("\n")[0])
    for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
        os.environ.setdefault(k, "1")
    checks = Checks()
    topo = os.path.join(args.workdir, "host.json")
    processes = max(4, (os.cpu_count() or 1) + 1)
    rc, out = run([args.pipec, "topology", "--measure", "--processes", str(processes), "-o", topo], timeout=240)
    fit = re.search(r"latency ([\d.]+) us, bandwidth ([\d.]+) GB/s \(worst fit error (\d+)%", out)
    checks.report(rc == 0 and fit is not None and os.path.exists(topo), "pipec topology --measure",
                  fit.group(0) if fit else f"exit {rc}: {out[-800:]}")
    if rc != 0 or not os.path.exists(topo):
        return checks.summary()
    t = json.load(open(topo))
    level = t["levels"][0] if t.get("levels") else {}
    ok = (t.get("format") == "pipec.topology/1" and len(t["levels"]) == 1 and level.get("count") == processes
          and 0 < level.get("latency", 0) < 1e-3 and 1e7 < level.get("bandwidth", 0) < 1e12
          and level.get("processors") == os.cpu_count() and t.get("device_memory_bytes", 0) > 0)
    checks.report(ok, "the topology: one host level, the measured link, shared cores",
                  json.dumps(level))
    # The printed figures are the file's.
    if fit:
        checks.report(abs(float(fit.group(1)) * 1e-6 - level["latency"]) <= 0.01e-6 + 1e-3 * level["latency"]
                      and abs(float(fit.group(2)) * 1e9 - level["bandwidth"]) <= 0.01e9,
                      "printed latency and bandwidth are the topology's", fit.group(0))
    # The planners read it.
    profile = os.path.join(ROOT, "examples", "profiles", "resnet50.json")
    rc, out = run([args.pipec, "plan", "--profile", profile, "--topology", topo, "--algorithm", "pipedream",
                   "-o", os.path.join(args.workdir, "plan.json")])
    checks.report(rc == 0 and os.path.exists(os.path.join(args.workdir, "plan.json")),
                  "pipec plan on the measured topology", out.strip().splitlines()[-1] if out.strip() else f"exit {rc}")
    # A probe file measured elsewhere (a node without the compiler) is fitted
    # with --fit; processes sharing one device say so with --processors.
    bindir = os.path.dirname(os.path.abspath(args.pipec))
    probe = os.path.join(args.workdir, "probe.json")
    rc, out = run(["mpirun", "--oversubscribe", "-n", "2", os.path.join(bindir, "pipec-linkprobe"),
                   "--out", probe], timeout=240)
    ok = rc == 0 and os.path.exists(probe)
    checks.report(ok, "pipec-linkprobe run by hand", out.strip()[-300:] if not ok else
                  json.dumps({k: v for k, v in json.load(open(probe)).items() if k not in ("sizes", "seconds")}))
    if ok:
        fitted = os.path.join(args.workdir, "fitted.json")
        rc, out = run([args.pipec, "topology", "--fit", probe, "--processes", "4", "--processors", "1",
                       "-o", fitted])
        t = json.load(open(fitted)) if rc == 0 and os.path.exists(fitted) else {}
        level = t.get("levels", [{}])[0]
        checks.report(rc == 0 and level.get("count") == 4 and level.get("processors") == 1
                      and 1e7 < level.get("bandwidth", 0) < 1e12 and t.get("device_memory_bytes", 0) > 0,
                      "pipec topology --fit PROBE --processors 1", out.strip().splitlines()[0] if out.strip() else "")
    rc, out = run([args.pipec, "topology", "--fit", topo, "-o", os.path.join(args.workdir, "x.json")])
    checks.report(rc != 0 and "not a pipec.linkprobe/1 file" in out, "--fit of a file that is no probe's",
                  out.strip())
    # The CUDA probe (built with the toolkit) on a machine without a GPU:
    # a clear refusal, not a hang. On a GPU machine it measures.
    if os.path.exists(os.path.join(bindir, "pipec-linkprobe-cuda")):
        rc, out = run([args.pipec, "topology", "--measure", "--target", "cuda", "-o",
                       os.path.join(args.workdir, "cuda.json")], timeout=240)
        gpu = re.search(r"latency [\d.]+ us, bandwidth [\d.]+ GB/s .* on cuda", out)
        checks.report((rc == 0 and gpu is not None) or (rc != 0 and "GPU" in out),
                      "pipec topology --measure --target cuda", out.strip().splitlines()[-1] if out.strip() else "")
    # --bind-cores: the ranks pinned to blocks of the CPUs in rank order,
    # as the topology says (a level of ranks per core when they outnumber
    # the cores), and the numbers unchanged by the pinning.
    cpus = sorted(os.sched_getaffinity(0))
    ncpu = len(cpus)
    ranks = 2 * ncpu if ncpu <= 4 else 4
    btopo = os.path.join(args.workdir, "bound.json")
    rc, out = run([args.pipec, "topology", "--measure", "--processes", str(ranks), "--bind-cores",
                   "-o", btopo], timeout=240)
    levels = json.load(open(btopo))["levels"] if rc == 0 and os.path.exists(btopo) else []
    if ranks > ncpu:
        ok = (len(levels) == 2 and levels[0].get("count") == ranks // ncpu and levels[0].get("processors") == 1
              and levels[1].get("count") == ncpu and not levels[1].get("processors"))
    else:
        ok = len(levels) == 1 and not levels[0].get("processors")
    checks.report(ok, f"pipec topology --measure --processes {ranks} --bind-cores",
                  json.dumps([{k: l.get(k) for k in ("count", "processors")} for l in levels]) if ok
                  else f"exit {rc}: {out[-400:]} {levels}")
    if ncpu > 1:
        rc, out = run([args.pipec, "topology", "--measure", "--processes", str(2 * ncpu + 1), "--bind-cores",
                       "-o", os.path.join(args.workdir, "uneven.json")])
        checks.report(rc != 0 and "do not fall evenly" in out and "pipec-linkprobe" not in out,
                      "--bind-cores with uneven groups (refused before probing)", out.strip()[-200:])
    data = os.path.join(args.workdir, "mlp")
    os.makedirs(data, exist_ok=True)
    rc, out = run([sys.executable, os.path.join(ROOT, "examples", "mlp", "make_mlp.py"), "-o",
                   os.path.join(data, "mlp.onnx"), "--batch", str(4 * ranks), "--hidden", "32,32,32", "--data-steps", "2"])
    build = os.path.join(args.workdir, "bound-build")
    if rc == 0:
        rc, out = run([args.pipec, "compile", os.path.join(data, "mlp.onnx"), "--stages", str(ranks),
                       "--microbatches", str(ranks), "-o", build, "--quiet"])
    losses = {}
    for mode in ("free", "bound"):
        if rc != 0:
            break
        rc, out = run([args.pipec, "train", build, "--steps", "3", "--quiet", "--inputs",
                       os.path.join(data, "x.npy"), "--labels", os.path.join(data, "y.npy"),
                       "--metrics", os.path.join(args.workdir, f"{mode}.jsonl"),
                       "--summary-out", os.path.join(args.workdir, f"{mode}-{{stage}}.json")]
                      + (["--bind-cores"] if mode == "bound" else []))
        if rc == 0:
            with open(os.path.join(args.workdir, f"{mode}.jsonl")) as f:
                losses[mode] = [json.loads(l)["loss"] for l in f if l.strip()]
    got = []
    for r in range(ranks):
        path = os.path.join(args.workdir, f"bound-{r}.json")
        got.append(json.load(open(path)).get("cpus") if os.path.exists(path) else None)
    want = []
    for r in range(ranks):
        lo, hi = r * ncpu // ranks, ((r + 1) * ncpu // ranks - 1 if ranks <= ncpu else r * ncpu // ranks)
        want.append(str(cpus[lo]) if lo == hi else f"{cpus[lo]}-{cpus[hi]}")
    checks.report(rc == 0 and got == want and losses.get("free") == losses.get("bound") and losses.get("free"),
                  f"pipec train --bind-cores on {ranks} ranks",
                  f"cpus {got}, losses as unbound" if rc == 0 else f"exit {rc}: {out[-600:]}")
    # Nothing to do without --measure: one line saying so.
    rc, out = run([args.pipec, "topology", "-o", topo])
    checks.report(rc != 0 and "--measure" in out and len(out.strip().splitlines()) <= 2,
                  "pipec topology without --measure", out.strip())
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())
