#!/usr/bin/python3
"""Where a step's time goes in a `pipec train --trace` file: compute, messages, idle.

    /usr/bin/python3 bench/trace_gaps.py TRACE.json [TRACE.rank1.json ...] [--skip 1] [--top 5]
    /usr/bin/python3 bench/trace_gaps.py --self-test

For each rank of the trace (one file per rank, or one merged file), per
step: the step's span (its first event's start to its last event's end;
on a GPU the events' times are the device queue's, from CUDA events),
the time covered by compute (forward, backward, update), by messages
(send, recv, flush) and by neither (idle: on a GPU, the device waiting
for the host), and the time between one step's last event and the next
step's first (the step boundary: the loss, metrics, the next feeds).
Printed per rank: the medians over the steps after the first `--skip`,
and the `--top` largest gaps of the last step with the events on either
side. It answers "what are the 32 ms of a ResNet-50 step outside its
ops" (bench/gpu_compare.py traces the 1-stage builds with it).
"""
import argparse
import json
import statistics
import sys

COMPUTE = ("forward", "backward", "update")
MESSAGES = ("send", "recv", "flush")


def union_length(spans):
    """Total length covered by [start, end) spans."""
    total, end = 0.0, None
    for s, e in sorted(spans):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def load(paths):
    """Events of kind X with a step, by rank: {pid: [event]}."""
    ranks = {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        for e in events:
            if e.get("ph") == "X" and "step" in e.get("args", {}):
                ranks.setdefault(e["pid"], []).append(e)
    return ranks


def analyse(events, skip, top):
    """Per-step figures of one rank (seconds) and its last step's gaps."""
    by_step = {}
    for e in events:
        by_step.setdefault(e["args"]["step"], []).append(e)
    steps = sorted(by_step)
    rows = []
    for i, step in enumerate(steps):
        ev = by_step[step]
        t0 = min(e["ts"] for e in ev)
        t1 = max(e["ts"] + e["dur"] for e in ev)
        compute = union_length([(e["ts"], e["ts"] + e["dur"]) for e in ev if e["cat"] in COMPUTE])
        covered = union_length([(e["ts"], e["ts"] + e["dur"]) for e in ev
                                if e["cat"] in COMPUTE + MESSAGES])
        boundary = None
        if i + 1 < len(steps):
            boundary = min(e["ts"] for e in by_step[steps[i + 1]]) - t1
        rows.append({"step": step, "span": (t1 - t0) * 1e-6, "compute": compute * 1e-6,
                     "messages": (covered - compute) * 1e-6, "idle": (t1 - t0 - covered) * 1e-6,
                     "boundary": None if boundary is None else boundary * 1e-6})
    gaps = []
    if steps:
        ev = sorted(by_step[steps[-1]], key=lambda e: e["ts"])
        end, last = None, None
        for e in ev:
            if end is not None and e["ts"] > end:
                gaps.append(((e["ts"] - end) * 1e-6, last["name"], e["name"]))
            if end is None or e["ts"] + e["dur"] > end:
                end, last = e["ts"] + e["dur"], e
        gaps.sort(reverse=True)
    kept = rows[skip:] if len(rows) > skip else rows
    return kept, gaps[:top]


def report(paths, skip, top, out=sys.stdout):
    ranks = load(paths)
    if not ranks:
        print("no traced steps in " + ", ".join(paths), file=out)
        return 1
    for pid in sorted(ranks):
        rows, gaps = analyse(ranks[pid], skip, top)

        def med(key):
            values = [r[key] for r in rows if r[key] is not None]
            return statistics.median(values) * 1e3 if values else float("nan")
        print(f"rank {pid}: {len(rows)} steps (medians, ms): span {med('span'):.2f}, compute "
              f"{med('compute'):.2f}, messages {med('messages'):.2f}, idle {med('idle'):.2f}, "
              f"between steps {med('boundary'):.2f}", file=out)
        for length, before, after in gaps:
            print(f"  gap {length * 1e3:8.3f} ms after {before} before {after}", file=out)
    return 0


def self_test():
    """A synthetic 2-step trace whose figures are known."""
    def ev(cat, name, ts, dur, step):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 0,
                "args": {"step": step, "microbatch": 0}}
    events = []
    for step, base in ((1, 0.0), (2, 10000.0)):
        events += [ev("forward", "F0", base, 2000, step), ev("send", "send", base + 2000, 500, step),
                   ev("backward", "B0", base + 3500, 3000, step), ev("update", "update", base + 6500, 500, step)]
    rows, gaps = analyse(events, 0, 2)
    ok = True
    want = {"span": 7e-3, "compute": 5.5e-3, "messages": 0.5e-3, "idle": 1e-3}
    for key, value in want.items():
        ok &= all(abs(r[key] - value) < 1e-12 for r in rows)
    ok &= abs(rows[0]["boundary"] - 3e-3) < 1e-12 and rows[1]["boundary"] is None
    ok &= len(gaps) == 1 and abs(gaps[0][0] - 1e-3) < 1e-12 and gaps[0][1:] == ("send", "B0")
    ok &= union_length([(0, 2), (1, 3), (5, 6)]) == 4
    print("trace_gaps self-test:", "ok" if ok else "FAILED")
    print(f"{int(ok)} passed, {int(not ok)} failed")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--skip", type=int, default=1, help="first steps left out of the medians")
    ap.add_argument("--top", type=int, default=5, help="largest gaps of the last step to list")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not a.traces:
        ap.error("give one or more trace files (pipec train --trace)")
    return report(a.traces, a.skip, a.top)


if __name__ == "__main__":
    sys.exit(main())
