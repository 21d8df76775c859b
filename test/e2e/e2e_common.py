"""What the end-to-end scripts share: a check counter that prints one line
per check and the runner's summary line, running a command for its exit
status and output, waiting for a running job's metrics, and metrics.jsonl's
losses."""
import json
import os
import subprocess
import time


class Checks:
    """`report(ok, name, detail)` prints `PASS|FAIL name: detail`;
    `summary()` prints `N passed, M failed` and returns the exit status."""

    def __init__(self):
        self.passed = self.failed = 0

    def report(self, ok, name, detail):
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        self.passed += bool(ok)
        self.failed += not ok

    def summary(self):
        print(f"{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0


def losses_of(out_dir, metrics="metrics.jsonl"):
    """Every step's loss from a run folder's metrics.jsonl (or `metrics`,
    a path of its own when absolute)."""
    path = metrics if os.path.isabs(metrics) else os.path.join(out_dir, metrics)
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f]


def pipec_workdir_args(description=None):
    """The common command line of an e2e script: --pipec and --workdir (made
    empty)."""
    import argparse
    import shutil
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--pipec", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    return args


def run(cmd, timeout=300, env=None):
    """Runs `cmd`; returns (exit status, stdout and stderr together)."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=env)
    return p.returncode, p.stdout


def wait_for_lines(proc, path, lines, timeout=90):
    """Waits until the file `path` has `lines` lines, `proc` has ended, or
    `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        if os.path.exists(path) and sum(1 for _ in open(path)) >= lines:
            break
