#!/usr/bin/python3
"""Where two `pipec.profile/1` files of the same model differ (two GPU runs,
a switch on and off, two commits):

    /usr/bin/python3 bench/profile_diff.py BEFORE.json AFTER.json
        [--microbatches M] [--top N] [--group digits|kind]

Prints ms per step by op kind (forward, backward, optimizer: each op's
per-microbatch times times M, the optimizer's once), then the N ops whose
time changed most. `--group digits` puts ops whose names differ only in
their numbers together (h.0.attn/MatMul_20 and h.11.attn/MatMul_482 are
/h.#.attn/MatMul_#): one line per layer kind of a transformer. Ops are
matched by name; the ones only one side has are listed.

The GPU bench's per-op profiles are of 4 microbatches (the default M).
`--self-test` checks the sums on a made-up pair and ends with "1 passed,
0 failed" (ctest bench.profile_diff_selftest).
"""

import argparse
import json
import re
import sys


def load(path):
    with open(path) as f:
        doc = json.load(f)
    if doc.get("format") != "pipec.profile/1":
        raise SystemExit(f"profile_diff: {path} is not a pipec.profile/1 file "
                         f"(format {doc.get('format')!r})")
    return doc


def op_seconds(op, microbatches):
    """(fwd, bwd, opt) seconds per step of one op."""
    return (op.get("fwd_s", 0.0) * microbatches, op.get("bwd_s", 0.0) * microbatches,
            op.get("opt_s", 0.0))


def grouped(doc, microbatches, key):
    """{group: [fwd, bwd, opt, count]} of a profile's ops."""
    out = {}
    for op in doc["ops"]:
        g = out.setdefault(key(op), [0.0, 0.0, 0.0, 0])
        f, b, o = op_seconds(op, microbatches)
        g[0] += f
        g[1] += b
        g[2] += o
        g[3] += 1
    return out


def by_kind(op):
    return op["op"]


def by_digits(op):
    return op["op"] + " " + re.sub(r"\d+", "#", op["name"])


def table(before, after, microbatches, key, title):
    a, b = grouped(before, microbatches, key), grouped(after, microbatches, key)
    lines = [f"{title} (ms per step: forward, backward, optimizer; before -> after)",
             f"{'':40s} {'count':>5s} {'fwd':>8s} {'bwd':>8s} {'opt':>6s}   "
             f"{'fwd':>8s} {'bwd':>8s} {'opt':>6s} {'change':>8s}"]
    rows = []
    for name in set(a) | set(b):
        x, y = a.get(name, [0.0, 0.0, 0.0, 0]), b.get(name, [0.0, 0.0, 0.0, 0])
        change = sum(y[:3]) - sum(x[:3])
        rows.append((abs(change), name, x, y, change))
    rows.sort(key=lambda r: (-r[0], r[1]))
    for _, name, x, y, change in rows:
        lines.append(f"{name[:40]:40s} {max(x[3], y[3]):5d} "
                     f"{x[0] * 1e3:8.2f} {x[1] * 1e3:8.2f} {x[2] * 1e3:6.2f}   "
                     f"{y[0] * 1e3:8.2f} {y[1] * 1e3:8.2f} {y[2] * 1e3:6.2f} "
                     f"{change * 1e3:+8.2f}")
    total_a = sum(sum(v[:3]) for v in a.values())
    total_b = sum(sum(v[:3]) for v in b.values())
    lines.append(f"{'all ops':40s} {'':5s} {total_a * 1e3:26.2f}   {total_b * 1e3:26.2f} "
                 f"{(total_b - total_a) * 1e3:+8.2f}")
    return lines, total_a, total_b


def top_ops(before, after, microbatches, top):
    a = {op["name"]: op for op in before["ops"]}
    b = {op["name"]: op for op in after["ops"]}
    rows = []
    for name in set(a) & set(b):
        x, y = sum(op_seconds(a[name], microbatches)), sum(op_seconds(b[name], microbatches))
        rows.append((abs(y - x), name, a[name]["op"], x, y))
    rows.sort(key=lambda r: (-r[0], r[1]))
    lines = [f"the {top} ops whose time changed most (ms per step, before -> after)"]
    for _, name, kind, x, y in rows[:top]:
        lines.append(f"  {name[:48]:48s} {kind:12s} {x * 1e3:8.3f} -> {y * 1e3:8.3f} "
                     f"({(y - x) * 1e3:+.3f})")
    only_a = sorted(set(a) - set(b))
    only_b = sorted(set(b) - set(a))
    if only_a:
        lines.append(f"only before ({len(only_a)}): " + ", ".join(only_a[:10]) +
                     (" ..." if len(only_a) > 10 else ""))
    if only_b:
        lines.append(f"only after ({len(only_b)}): " + ", ".join(only_b[:10]) +
                     (" ..." if len(only_b) > 10 else ""))
    return lines


def report(before, after, microbatches, top, group):
    key = by_digits if group == "digits" else by_kind
    title = "by layer kind" if group == "digits" else "by op kind"
    lines, total_a, total_b = table(before, after, microbatches, key, title)
    lines = [f"{label}: {doc['device']}, timing {doc.get('timing', 'host')}"
             for doc, label in ((before, "before"), (after, "after"))
             if doc.get("device")] + lines
    lines.append("")
    lines += top_ops(before, after, microbatches, top)
    return lines, total_a, total_b


def self_test():
    def profile(ops):
        return {"format": "pipec.profile/1", "ops": [
            {"name": n, "op": k, "fwd_s": f, "bwd_s": b, "opt_s": o} for n, k, f, b, o in ops]}
    before = profile([("/h.0/MatMul_1", "matmul", 0.002, 0.004, 0.0001),
                      ("/h.1/MatMul_7", "matmul", 0.002, 0.004, 0.0001),
                      ("/h.0/Add_2", "add", 0.001, 0.0, 0.0),
                      ("/gone", "transpose", 0.0005, 0.0005, 0.0)])
    after = profile([("/h.0/MatMul_1", "matmul", 0.001, 0.002, 0.0001),
                     ("/h.1/MatMul_7", "matmul", 0.002, 0.004, 0.0001),
                     ("/h.0/Add_2", "add", 0.001, 0.0, 0.0),
                     ("/new", "gather", 0.0, 0.001, 0.0)])
    failures = []
    lines, total_a, total_b = report(before, after, 4, 2, "kind")
    # Before: matmul (2 + 4) * 4 * 2 + 0.2 = 48.2 ms, add 4, transpose 4.
    if abs(total_a * 1e3 - 56.2) > 1e-9 or abs(total_b * 1e3 - (36.2 + 4 + 4)) > 1e-9:
        failures.append(f"totals {total_a * 1e3} {total_b * 1e3}")
    text = "\n".join(lines)
    if "only before (1): /gone" not in text or "only after (1): /new" not in text:
        failures.append("unmatched ops not listed")
    if "/h.0/MatMul_1" not in text.split("changed most")[1].splitlines()[1]:
        failures.append("the most changed op is not first")
    grouped_lines, _, _ = report(before, after, 4, 2, "digits")
    if not any(l.startswith("matmul /h.#/MatMul_#") for l in grouped_lines):
        failures.append("digits grouping")
    for f in failures:
        print("FAIL", f)
    print(f"{0 if failures else 1} passed, {1 if failures else 0} failed")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", nargs="?")
    ap.add_argument("after", nargs="?")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--group", choices=("kind", "digits"), default="kind")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if not args.before or not args.after:
        ap.error("give BEFORE.json and AFTER.json (or --self-test)")
    lines, _, _ = report(load(args.before), load(args.after), args.microbatches, args.top,
                         args.group)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
