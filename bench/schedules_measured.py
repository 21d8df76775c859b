#!/usr/bin/python3
"""Real runs of every compiled schedule against the simulator's prediction.

    /usr/bin/python3 bench/schedules_measured.py [--pipec build/bin/pipec] [--workdir /tmp/pipec-sched-bench]
                                                 [--steps 30] [--stages 2,4] [--microbatches 8]

For an MLP (784-1024x4-10, global batch 256) and each schedule pipec
compiles (gpipe, 1f1b-flush, 1f1b, 2bw, interleaved with v = 2, zb-h1, zb-h2) on 2
and 4 stage processes:

1. `pipec profile` measures every op (pipec.profile/1; each op's median
   over `--profiles` profiles), and `pipec compile --profile` plans the
   stages with those times;
2. `pipec train --trace --summary-out` runs it for real, between two more
   profiles taken just before and just after it (this VM's speed moves by
   a third from one minute to the next, more than the 15% the simulator
   is held to: the op times it is given are the ones of the training's
   minute, each op's mean of the two);
3. `pipec simulate` predicts the same plan on the bracketing profiles, with a
   one-level topology for processes on one host whose link `pipec topology
   --measure` measured (or `--bandwidth`, `--latency` as given).

With more processes than cores (p = 4 here) the ranks are bound to cores
by default (`--bind-cores auto`: `pipec train --bind-cores`, ranks 0-1 on
one core, 2-3 on the other), and the topology says so (`pipec topology
--measure --bind-cores`: a level of 2 ranks per core, one processor each):
unbound, the kernel's scheduler places and moves the 4 processes as it
likes, and the same run moves by 10-60% from one run to the next.

Printed per configuration: measured iteration time (median of the steps
after the first two) and the simulator's prediction, their ratio (and
the ratio to the prediction with `--messages-on-link`, messages that do
not share the processors: `link`; and to the prediction from the
up-front profile that planned the stages: `first`); the
measured bubble (idle device time / busy compute time, both from the
trace: busy = forwards + backwards + updates; "-" with more processes
than cores, whose traced spans the sharing stretches) against the
simulator's (its processors' idle time over its full-speed work) and the
closed form (p-1)/m of the flush schedules ((p-1)/(v m) interleaved) on
uniform stages; per stage the
arena the compiler planned, the peak resident memory of the process and the
peak number of weight versions.

A benchmark, not a test: on this 2-core machine 4 processes share 2 cores,
so measured times include oversubscription; the ratios say how far the
model is from the machine, and the traces (OUT/trace.json next to
OUT/sim-trace.json) show where.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p.stdout


def measured(out, steps, warm=2):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        walls = [json.loads(l)["wall_s"] for l in f if l.strip()]
    it = statistics.median(walls[warm:]) if len(walls) > warm else statistics.median(walls)
    with open(os.path.join(out, "trace.json")) as f:
        events = json.load(f)["traceEvents"]
    busy, ranks = 0.0, set()
    for e in events:
        if e.get("ph") != "X":
            continue
        ranks.add(e["pid"])
        if e["cat"] in ("forward", "backward", "update") and e["args"]["step"] > warm:
            busy += e["dur"] * 1e-6
    counted = steps - warm
    busy_per_step = busy / counted
    # With more processes than cores the traced spans are stretched by the
    # sharing, while the simulator's bubble is its processors' idle time
    # over its full-speed work: not comparable (None).
    if len(ranks) > (os.cpu_count() or 1):
        return it, None
    bubble = (len(ranks) * it - busy_per_step) / busy_per_step
    return it, bubble


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipec", default=os.path.join(REPO, "build", "bin", "pipec"))
    ap.add_argument("--workdir", default="/tmp/pipec-sched-bench")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--stages", default="2,4")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--bandwidth", type=float, default=None,
                    help="bytes/s between processes (default: measured by `pipec topology --measure`)")
    ap.add_argument("--latency", type=float, default=None, help="seconds per message (with --bandwidth)")
    ap.add_argument("--profiles", type=int, default=3,
                    help="profiles to take; the simulator gets each op's median time")
    ap.add_argument("--bind-cores", choices=("auto", "on", "off"), default="auto",
                    help="train with `pipec train --bind-cores` and simulate the cores that "
                         "topology describes (auto: when the processes outnumber the cores)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="train every configuration this many times, the schedules in turn, and print the "
                         "median measured step and its spread (this VM's steps move 10-20%% from run to run)")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
        os.environ.setdefault(k, "1")
    m = a.microbatches
    onnx_path = os.path.join(a.workdir, "mlp.onnx")
    sh([sys.executable, os.path.join(REPO, "examples", "mlp", "make_mlp.py"), "-o", onnx_path, "--batch", "256",
        "--hidden", "1024,1024,1024,1024", "--data-steps", "2"])
    xs, ys = os.path.join(a.workdir, "x.npy"), os.path.join(a.workdir, "y.npy")
    profile = os.path.join(a.workdir, "profile.json")
    # One BLAS thread: the op times of one processor. A stage process gets
    # cores / processes threads (one each here for p >= 2 on 2 cores), and
    # the simulated host shares os.cpu_count() processors among them.
    # Several profiles, each op's times their median: one profile moves by
    # 10-20% with the machine's moment, and every prediction with it.
    def take_profile(name):
        part = os.path.join(a.workdir, name)
        sh([a.pipec, "profile", onnx_path, "--microbatch", str(256 // m), "--threads", "1", "-o", part])
        with open(part) as f:
            return json.load(f)

    def merge(parts, into, combine):
        merged = parts[0]
        for i, op in enumerate(merged["ops"]):
            for key in ("fwd_s", "bwd_s", "opt_s"):
                op[key] = combine(p["ops"][i][key] for p in parts)
        if "op_overhead_s" in merged:
            merged["op_overhead_s"] = combine(p.get("op_overhead_s", 0) for p in parts)
        with open(into, "w") as f:
            json.dump(merged, f, indent=1)

    merge([take_profile(f"profile.{i}.json") for i in range(a.profiles)], profile, statistics.median)

    print(f"MLP 784-1024x4-10, batch 256 = {m} x {256 // m}, {a.steps} steps, {os.cpu_count()} cores")
    print(f"{'config':<18} {'measured s':>10} {'sim s':>8} {'ratio':>6} {'link':>6} {'first':>6} {'bubble':>7} "
          f"{'sim':>6} "
          f"{'(p-1)/m':>7}  per stage: arena / max RSS MiB, weight versions")
    for p in [int(s) for s in a.stages.split(",")]:
        topo = os.path.join(a.workdir, f"host-{p}.json")
        cores = len(os.sched_getaffinity(0)) or 1  # as --bind-cores counts them
        bind = a.bind_cores == "on" or (a.bind_cores == "auto" and p > cores)
        if bind and p > cores and p % cores:
            sys.exit(f"--bind-cores: {p} processes do not fall evenly on {cores} cores")
        bound_to_core = bind and p > cores  # a level of ranks per core
        if a.bandwidth is None:
            # The link measured between two processes here (pipec-linkprobe).
            # (The MLP's messages are 32 x 1024 floats, 128 KiB: fitted
            # around that.)
            out = sh([a.pipec, "topology", "--measure", "--processes", str(p), "--fit-from", "32K",
                      "--fit-to", "512K", "-o", topo] + (["--bind-cores"] if bind else []))
            link = re.search(r"latency .* GB/s", out)
            print(f"p{p}: measured {link.group(0) if link else '?'}"
                  f"{f', ranks bound {p // cores} to a core' if bound_to_core else ''}", flush=True)
            with open(topo) as f:
                t = json.load(f)
            if not bound_to_core:
                t["levels"][0]["processors"] = cores  # (also when p <= cores)
            with open(topo, "w") as f:
                json.dump(t, f)
        else:
            link = {"bandwidth": a.bandwidth, "latency": a.latency if a.latency is not None else 5e-6}
            levels = ([{"name": "core", "count": p // cores, "processors": 1, **link},
                       {"name": "host", "count": cores, **link}] if bound_to_core else
                      [{"name": "host", "count": p, "processors": cores, **link}])
            with open(topo, "w") as f:
                json.dump({"format": "pipec.topology/1", "name": f"{p} processes on one host",
                           "device_memory_bytes": 24 << 30, "levels": levels}, f)
        def simulate(out, prof, *extra):
            sim = sh([a.pipec, "simulate", os.path.join(out, "plan.json"), "--profile", prof, "--topology", topo,
                      *extra])
            mt = re.search(r"iteration ([\d.e+-]+) s .* bubble ([\d.]+)%", sim)
            return float(mt.group(1)), float(mt.group(2)) / 100

        def train(out, run=0):
            """(measured step, measured bubble, predicted step, predicted
            bubble): the prediction on the profiles just before and after
            (kept as OUT/profile.bracket.RUN.json)."""
            before = take_profile("profile.before.json")
            sh([a.pipec, "train", out, "--steps", str(a.steps), "--lr", "0.01", "--inputs", xs, "--labels", ys,
                "--quiet", "--trace", os.path.join(out, "trace.json"),
                "--summary-out", os.path.join(out, "summary.json")] + (["--bind-cores"] if bind else []))
            it, bubble = measured(out, a.steps)
            bracket = os.path.join(out, f"profile.bracket.{run}.json")
            merge([before, take_profile("profile.after.json")], bracket, statistics.mean)
            sim_it, sim_bubble = simulate(out, bracket, "--trace", os.path.join(out, "sim-trace.json"))
            return it, bubble, sim_it, sim_bubble

        schedules = ("gpipe", "1f1b-flush", "1f1b", "2bw", "interleaved", "zb-h1", "zb-h2")
        runs = {}
        for sched in schedules:
            out = os.path.join(a.workdir, f"p{p}-{sched}")
            extra = ["--chunks", "2"] if sched == "interleaved" else []
            sh([a.pipec, "compile", onnx_path, "--stages", str(p), "--microbatches", str(m), "--schedule", sched,
                "--profile", profile, "-o", out, "--quiet", *extra])
            it, bubble, sim_it, sim_bubble = train(out)
            runs[sched] = [it / sim_it]
            # The model before messages shared the processors, for comparison.
            link_it = simulate(out, os.path.join(out, "profile.bracket.0.json"), "--messages-on-link")[0]
            first_it = simulate(out, profile)[0]
            stages = []
            for r in range(p):
                with open(os.path.join(out, f"summary.stage{r}.json")) as f:
                    s = json.load(f)
                stages.append(f"{s['arena_bytes'] / 2**20:.1f}/{s.get('max_rss_bytes', 0) / 2**20:.0f}"
                              f" v{s['weight_versions_peak']}")
            closed = (f"{(p - 1) / m:.2f}" if sched in ("gpipe", "1f1b-flush")
                      else f"{(p - 1) / (2 * m):.2f}" if sched == "interleaved" else "-")
            shown = f"{bubble:>7.2f}" if bubble is not None else f"{'-':>7}"
            print(f"p{p} {sched:<15} {it:>10.4f} {sim_it:>8.4f} {it / sim_it:>6.2f} {it / link_it:>6.2f} "
                  f"{it / first_it:>6.2f} {shown} {sim_bubble:>6.2f} {closed:>7}  " + ", ".join(stages), flush=True)
        # More runs of every configuration, the schedules in turn (so that a
        # slow spell of the machine does not fall on one schedule alone).
        for run in range(1, a.repeats):
            for sched in schedules:
                it, _, sim_it, _ = train(os.path.join(a.workdir, f"p{p}-{sched}"), run)
                runs[sched].append(it / sim_it)
        if a.repeats > 1:
            print(f"p{p}, {a.repeats} runs each: median measured / simulated (lowest .. highest run)")
            for sched in schedules:
                r = sorted(runs[sched])
                print(f"p{p} {sched:<15} {statistics.median(r):>6.2f}  ({r[0]:.2f} .. {r[-1]:.2f})", flush=True)


if __name__ == "__main__":
    main()
