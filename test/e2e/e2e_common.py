"""What the end-to-end scripts share: a check counter that prints one line
per check and the runner's summary line, and metrics.jsonl's losses."""
import json
import os


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
