#!/usr/bin/env python3
"""pipec's exported schedules, read by PyTorch's own torch.distributed.pipelining.

    prepare (build machine):  python3 test/gpu/torch_csv.py prepare --pipec build/bin/pipec --bundle .gpu-bundle
    run (a machine with PyTorch >= 2.6):  python3 test/gpu/torch_csv.py run --bundle .gpu-bundle

`prepare` plans the BERT-48 paper profile (examples/profiles/bert48.json) for
every schedule `pipec plan --export torch` writes (1f1b-flush, gpipe,
zb-h1, zb-h2, interleaved, zb-v, dualpipev, and a `synth` order under a
memory limit) and keeps each compute-only CSV with what it should hold
(ranks, stages, microbatches) in BUNDLE/torch_csv/.

`run` needs PyTorch, which the build machine lacks (the GPU machine has
it; scripts/test-gpu.sh runs this there). For each CSV it calls PyTorch's
own reader, `PipelineScheduleMulti._load_csv` (format "compute_only"),
on a schedule object that has the attributes that reader uses (the rank
count, stage count and microbatch count; no process group and no model are
needed to read a schedule), which parses every cell with `_Action.from_str`
and validates the order with `_validate_schedule` (F before B or I, I
before W, every microbatch once per stage, each stage on one rank). Then
it lowers the order to PyTorch's communication actions with
`_add_send_recv`, which fails on a compute order whose sends and receives
cannot be placed. Checked: the reader accepts the file, the stage-to-rank
map it infers is pipec's (stage q on rank q mod p, or zb-v's and
dualpipev's V), every action reads back as the cell it came from, and
the lowering succeeds.

Prints one line per check and `N passed, M failed`; exits 1 on a failure.
"""
import argparse
import csv
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (schedule, devices, chunks, microbatches, planner algorithm, extra args)
CASES = [
    ("1f1b-flush", 4, 1, 8, "balanced", []),
    ("gpipe", 4, 1, 8, "balanced", []),
    ("zb-h1", 4, 1, 8, "balanced", []),
    ("zb-h2", 4, 1, 8, "balanced", []),
    ("interleaved", 4, 2, 8, "interleaved", []),
    ("zb-v", 4, 2, 8, "balanced", []),
    ("dualpipev", 4, 2, 8, "balanced", []),
    ("synth", 4, 1, 8, "balanced", ["--memory-limit", "64G"]),
]


def prepare(args):
    out = os.path.join(args.bundle, "torch_csv")
    os.makedirs(out, exist_ok=True)
    profile = os.path.join(REPO, "examples", "profiles", "bert48.json")
    listing = []
    for schedule, devices, chunks, m, algorithm, extra in CASES:
        topology = os.path.join(out, f"topology-{devices}.json")
        with open(topology, "w") as f:
            json.dump({"format": "pipec.topology/1", "device_memory_bytes": 80 << 30,
                       "levels": [{"name": "node", "count": devices, "bandwidth": 1e11,
                                   "latency": 1e-5}]}, f)
        name = f"{schedule}-p{devices}-v{chunks}-m{m}"
        plan = os.path.join(out, name + ".json")
        cmd = [args.pipec, "plan", "--profile", profile, "--topology", topology,
               "--algorithm", algorithm, "--schedule", schedule, "--stages", str(devices),
               "--microbatches", str(m), "-o", plan, *extra]
        if schedule == "synth":  # the synthesised order is written beside the plan
            path = os.path.join(out, name + ".schedule.csv")
        else:
            path = os.path.join(out, name + ".csv")
            cmd += ["--export", "torch", "--export-file", path]
        if chunks > 1:
            cmd += ["--chunks", str(chunks)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0 or not os.path.exists(path):
            sys.exit(f"torch_csv prepare: {' '.join(cmd)} failed:\n{p.stdout[-1500:]}{p.stderr[-1500:]}")
        listing.append({"name": name, "csv": os.path.basename(path), "schedule": schedule,
                        "ranks": devices, "stages": devices * chunks, "microbatches": m})
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(listing, f, indent=1)
    print(f"torch_csv prepare: {len(listing)} schedules in {out}")


def expected_rank(schedule, stage, ranks):
    """pipec's placement: a loop (stage q on rank q mod p), or a V (ranks
    0..p-1 then back, zb-v and dualpipev)."""
    if schedule in ("zb-v", "dualpipev"):
        return stage if stage < ranks else 2 * ranks - 1 - stage
    return stage % ranks


def run(args):
    try:
        import torch  # noqa: F401
        from torch.distributed.pipelining import schedules as S
    except Exception as e:  # noqa: BLE001 - any import failure means: no PyTorch here
        print(f"torch_csv: skipped: PyTorch's pipelining cannot be imported here ({e})")
        print("0 passed, 0 failed")
        return 0
    import torch as _torch
    print(f"torch_csv: PyTorch {_torch.__version__}")
    directory = os.path.join(args.bundle, "torch_csv")
    with open(os.path.join(directory, "cases.json")) as f:
        cases = json.load(f)
    passed = failed = 0

    def report(ok, what, detail=""):
        nonlocal passed, failed
        passed += bool(ok)
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}")

    for case in cases:
        path = os.path.join(directory, case["csv"])
        ranks, stages, m = case["ranks"], case["stages"], case["microbatches"]
        # The attributes PipelineScheduleMulti._load_csv and
        # _validate_and_set_stage_mapping read; no stage objects (their
        # loop over self._stages then does nothing).
        schedule = S.PipelineScheduleMulti.__new__(S.PipelineScheduleMulti)
        schedule.pipeline_order = {}
        schedule._stages = []
        schedule._num_stages = stages
        schedule.pp_group_size = ranks
        schedule._n_microbatches = m
        try:
            schedule._load_csv(path, format="compute_only")
        except Exception as e:  # noqa: BLE001 - the reader's verdict is the check
            report(False, f"{case['name']}: torch _load_csv", str(e).splitlines()[0])
            continue
        mapping = schedule.stage_index_to_group_rank
        want = {q: expected_rank(case["schedule"], q, ranks) for q in range(stages)}
        report(mapping == want, f"{case['name']}: torch _load_csv reads it; stage -> rank {mapping}",
               "" if mapping == want else f"pipec places {want}")
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        same = all(str(a) == cell.strip() if a is not None else cell.strip() == ""
                   for row, actions in zip(rows, (schedule.pipeline_order[r] for r in range(len(rows))))
                   for cell, a in zip(row, actions))
        count = sum(1 for r in schedule.pipeline_order.values() for a in r if a is not None)
        report(same, f"{case['name']}: {count} actions read back as written")
        lower = getattr(S, "_add_send_recv", None)
        if lower is None:
            report(False, f"{case['name']}: torch _add_send_recv", "not in this PyTorch")
            continue
        try:
            compute = {r: [a for a in acts if a is not None] for r, acts in schedule.pipeline_order.items()}
            comm = lower(compute, stage_to_rank=lambda q: mapping[q], num_stages=stages)
            sends = sum(1 for r in comm.values() for a in r if a.computation_type in (S.SEND_F, S.SEND_B))
            report(True, f"{case['name']}: torch lowers it to send/recv ({sends} sends)")
        except Exception as e:  # noqa: BLE001
            report(False, f"{case['name']}: torch _add_send_recv", str(e).splitlines()[0])
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["prepare", "run"])
    ap.add_argument("--pipec", default=os.path.join(REPO, "build", "bin", "pipec"))
    ap.add_argument("--bundle", default=os.path.join(REPO, ".gpu-bundle"))
    args = ap.parse_args()
    if args.mode == "prepare":
        prepare(args)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
