#!/usr/bin/env python3
# ===- run_two_stage.py - Multi-process tests of the runtime core ---------=== #
#
# Part of pipec's runtime tests. Launches the two hand-written stage
# executables (two_stage.cpp) with `mpirun` MPMD and checks what a user
# sees: progress lines, metrics.jsonl, checkpoints, profiles, and the error
# line and exit status of each failure. The expected losses and weights come
# from an independent float64 re-implementation of the model, the synthetic
# data formula of runtime/README.md, and this file's own .npy and
# safetensors writers and readers (standard library only, no numpy).
#
# usage: run_two_stage.py --mpirun MPIRUN --stage0 EXE --stage1 EXE
#                         --build-id ID --workdir DIR --case CASE
# ===----------------------------------------------------------------------=== #

import argparse
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import time

B, M, b, D, C = 8, 4, 2, 4, 3
MASK = (1 << 64) - 1

# --------------------------------------------------------------------------- #
# Data: the README's synthetic formula, .npy and safetensors files
# --------------------------------------------------------------------------- #


def splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def synthetic_bits(seed, stream, sample, element):
    h = splitmix64(splitmix64(seed) ^ stream)
    h = splitmix64(h ^ sample)
    return splitmix64(h ^ element)


def synthetic_input(seed, k, sample, element):
    return (synthetic_bits(seed, k + 1, sample, element) >> 40) * 2.0**-23 - 1.0


def synthetic_label(seed, sample, classes):
    return synthetic_bits(seed, 0, sample, 0) % classes


def write_npy(path, descr, shape, values, fmt):
    dims = "%d," % shape[0] if len(shape) == 1 else ", ".join(map(str, shape))
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, dims)
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)))
        f.write(header.encode("ascii"))
        f.write(struct.pack("<%d%s" % (len(values), fmt), *values))


def write_safetensors(path, tensors):
    """tensors: list of (name, shape, float values), stored as F32."""
    header, data, offset = {}, b"", 0
    for name, shape, values in tensors:
        blob = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [offset, offset + len(blob)]}
        data += blob
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            out[name] = entry
            continue
        assert entry["dtype"] == "F32", entry
        lo, hi = entry["data_offsets"]
        out[name] = (entry["shape"], list(struct.unpack("<%df" % ((hi - lo) // 4),
                                                        data[lo:hi])))
    return out


# --------------------------------------------------------------------------- #
# The model, in float64
# --------------------------------------------------------------------------- #

INIT_SCALE = [1.0, 0.5, -0.75, 1.25]
INIT_W = [0.1 * ((3 * i + 1) % 7) - 0.3 for i in range(D * C)]
INIT_BIAS = [0.05, -0.1, 0.0]


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def reference_training(steps, lr, sample_fn):
    """Returns (per-step losses, final weights). sample_fn(s) -> (x[D], y)."""
    scale = [f32(v) for v in INIT_SCALE]
    w = [f32(v) for v in INIT_W]
    bias = [f32(v) for v in INIT_BIAS]
    losses = []
    for t in range(steps):
        g_scale, g_w, g_bias = [0.0] * D, [0.0] * (D * C), [0.0] * C
        mb_losses = []
        for mb in range(M):
            total = 0.0
            for i in range(b):
                x, y = sample_fn(t * B + mb * b + i)
                h = [x[k] * scale[k] for k in range(D)]
                z = [bias[c] + sum(h[k] * w[k * C + c] for k in range(D))
                     for c in range(C)]
                mx = max(z)
                e = [math.exp(v - mx) for v in z]
                p = [v / sum(e) for v in e]
                total += -math.log(p[y])
                dz = [(p[c] - (1.0 if c == y else 0.0)) / b / M for c in range(C)]
                for c in range(C):
                    g_bias[c] += dz[c]
                    for k in range(D):
                        g_w[k * C + c] += h[k] * dz[c]
                for k in range(D):
                    dh = sum(dz[c] * w[k * C + c] for c in range(C))
                    g_scale[k] += dh * x[k]
            mb_losses.append(total / b)
        losses.append(sum(mb_losses) / M)
        scale = [scale[k] - lr * g_scale[k] for k in range(D)]
        w = [w[i] - lr * g_w[i] for i in range(D * C)]
        bias = [bias[c] - lr * g_bias[c] for c in range(C)]
    return losses, {"scale": scale, "fc.weight": w, "fc.bias": bias}


# --------------------------------------------------------------------------- #
# Harness
# --------------------------------------------------------------------------- #

failures = []


def check(cond, message):
    if not cond:
        failures.append(message)
        print("FAIL: " + message, file=sys.stderr)


def close(a, b_, tol):
    return abs(a - b_) <= tol * (1 + abs(b_))


class Job:
    def __init__(self, args):
        self.args = args
        self.work = os.path.abspath(args.workdir)
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(os.path.join(self.work, "weights"))
        self.manifest = os.path.join(self.work, "manifest.json")

    def write_build(self, build_id=None, num_ranks=2):
        manifest = {
            "format": "pipec.manifest/1",
            "build_id": build_id or self.args.build_id,
            "model": "two_stage.onnx", "model_sha256": "0" * 64,
            "schedule": "gpipe", "microbatches": M, "microbatch": b,
            "global_batch": B, "num_ranks": num_ranks,
            "stages": [
                {"stage": 0, "binary": "stage0",
                 "weights": "weights/stage0.safetensors", "ranks": [0]},
                {"stage": 1, "binary": "stage1",
                 "weights": "weights/stage1.safetensors", "ranks": [1]}],
            "inputs": [{"name": "x", "shape": [B, D], "dtype": "f32"}],
            "labels": {"shape": [B], "dtype": "i64", "classes": C},
        }
        with open(self.manifest, "w") as f:
            json.dump(manifest, f)
        write_safetensors(os.path.join(self.work, "weights/stage0.safetensors"),
                          [("scale", [D], INIT_SCALE)])
        write_safetensors(os.path.join(self.work, "weights/stage1.safetensors"),
                          [("fc.weight", [D, C], INIT_W),
                           ("fc.bias", [C], INIT_BIAS)])

    def path(self, *parts):
        return os.path.join(self.work, *parts)

    def run(self, flags, timeout=60):
        flags = ["--manifest", self.manifest] + flags
        cmd = [self.args.mpirun, "--oversubscribe",
               "-np", "1", self.args.stage0] + flags + [
               ":", "-np", "1", self.args.stage1] + flags
        print("$ " + " ".join(cmd))
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=self.work, capture_output=True,
                              text=True, timeout=timeout)
        elapsed = time.monotonic() - start
        print(proc.stdout)
        print(proc.stderr, file=sys.stderr)
        print("exit status %d after %.1f s" % (proc.returncode, elapsed))
        return proc, elapsed


STEP_LINE = re.compile(
    r"^step (\d+)/(\d+)  loss (-?[0-9.]+)  ([0-9.]+) samples/s  \(([0-9.]+) s\)$")


def check_training(job, proc, steps, expected_losses, expected_weights,
                   checkpoint_steps, quiet=False):
    check(proc.returncode == 0, "training exited with %d" % proc.returncode)
    lines = [STEP_LINE.match(l) for l in proc.stdout.splitlines()]
    lines = [m for m in lines if m]
    check(len(lines) == (0 if quiet else steps),
          "expected %d step lines, got %d" % (0 if quiet else steps, len(lines)))
    for m, want in zip(lines, expected_losses):
        check(int(m.group(2)) == steps, "step line total: " + m.group(0))
        check(close(float(m.group(3)), want, 1e-5),
              "printed loss %s at step %s, expected %.6f" % (m.group(3), m.group(1), want))
        check(float(m.group(4)) > 0, "samples/s not positive: " + m.group(0))

    with open(job.path("metrics.jsonl")) as f:
        metrics = [json.loads(l) for l in f]
    check([m["step"] for m in metrics] == list(range(1, steps + 1)),
          "metrics steps: %s" % [m["step"] for m in metrics])
    for m, want in zip(metrics, expected_losses):
        check(close(m["loss"], want, 2e-6),
              "metrics loss %r at step %d, expected %r" % (m["loss"], m["step"], want))
        check(m["wall_s"] > 0 and close(m["samples_per_s"], B / m["wall_s"], 1e-9),
              "metrics timing inconsistent: %r" % m)
    check(abs(expected_losses[-1] - expected_losses[0]) > 1e-3,
          "reference loss did not move; the test would not detect training bugs")

    summary = [l for l in proc.stdout.splitlines() if l.startswith("done: ")]
    check(len(summary) == 1 and ("%d steps" % steps) in summary[0],
          "summary line missing: %r" % summary)
    if summary:
        final = float(re.search(r"final loss (-?[0-9.]+)", summary[0]).group(1))
        check(close(final, expected_losses[-1], 1e-5), "summary final loss %r" % final)

    ckpt = job.path("checkpoints")
    folders = sorted(d for d in os.listdir(ckpt) if d.startswith("step-"))
    check(folders == ["step-%06d" % s for s in checkpoint_steps],
          "checkpoint folders %s" % folders)
    with open(os.path.join(ckpt, "latest")) as f:
        check(f.read().strip() == "step-%06d" % checkpoint_steps[-1], "latest file")
    check(sorted(os.listdir(ckpt)) == sorted(folders + ["latest"]),
          "stray files in checkpoints/: %s" % os.listdir(ckpt))
    last = os.path.join(ckpt, "step-%06d" % steps)
    check(sorted(os.listdir(last)) == ["checkpoint.json", "stage0.safetensors",
                                       "stage1.safetensors"],
          "files in the last checkpoint: %s" % os.listdir(last))
    # checkpoint.json lists every stage file with its size and FNV-1a 64.
    with open(os.path.join(last, "checkpoint.json")) as f:
        listing = json.load(f)
    check(listing["format"] == "pipec.checkpoint-manifest/1" and listing["step"] == steps,
          "checkpoint.json header %r" % {k: listing.get(k) for k in ("format", "step")})
    for entry in listing["stages"]:
        path = os.path.join(last, entry["file"])
        data = open(path, "rb").read()
        h = 1469598103934665603
        for byte in data:
            h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        check(entry["bytes"] == len(data) and entry["fnv1a64"] == "%016x" % h and entry["hosts"],
              "checkpoint.json entry %r vs the file (%d bytes, %016x)" % (entry, len(data), h))
    got = read_safetensors(os.path.join(last, "stage0.safetensors"))
    got.update(read_safetensors(os.path.join(last, "stage1.safetensors")))
    check(got["scale"][0] == [D] and got["fc.weight"][0] == [D, C],
          "checkpoint shapes")
    for name, want in expected_weights.items():
        for i, (g, e) in enumerate(zip(got[name][1], want)):
            check(close(g, e, 1e-5), "checkpoint %s[%d] = %r, expected %r" % (name, i, g, e))


def case_synthetic(job, args):
    job.write_build()
    steps, lr, seed = 5, 0.5, 11
    proc, _ = job.run(["--steps", str(steps), "--lr", str(lr), "--seed", str(seed),
                       "--checkpoint-every", "2",
                       "--profile-out", job.path("profile.json")])

    def sample(s):
        return ([synthetic_input(seed, 0, s, e) for e in range(D)],
                synthetic_label(seed, s, C))
    losses, weights = reference_training(steps, lr, sample)
    check_training(job, proc, steps, losses, weights, [2, 4, 5])

    for stage, names in ((0, ["/scale/Mul"]), (1, ["/fc/Gemm", "/loss"])):
        with open(job.path("profile.stage%d.json" % stage)) as f:
            prof = json.load(f)
        check(prof["format"] == "pipec.profile/1" and prof["device"] == "cpu"
              and prof["microbatch"] == b, "profile header %r" % prof)
        check([o["name"] for o in prof["ops"]] == names, "profile ops %r" % prof["ops"])
        check(prof["steps"] == steps - 1, "profile counted %r steps" % prof["steps"])
        for o in prof["ops"]:
            check(o["fwd_s"] > 0 and o["bwd_s"] > 0, "profile times %r" % o)
            for key in ("out_bytes", "param_bytes", "saved_bytes", "inputs", "opt_s"):
                check(key in o, "profile op lacks %s" % key)
    check(prof["ops"][1]["inputs"] == ["/fc/Gemm"], "profile inputs")


def case_npy(job, args):
    job.write_build()
    steps, lr, rows = 4, 0.25, 13  # 13 rows: batches wrap around the file
    xs = [[math.sin(1.7 * r + 0.3 * k) for k in range(D)] for r in range(rows)]
    ys = [(r * 5 + 1) % C for r in range(rows)]
    write_npy(job.path("x.npy"), "<f8", [rows, D], sum(xs, []), "d")
    write_npy(job.path("y.npy"), "<i4", [rows], ys, "i")
    proc, _ = job.run(["--steps", str(steps), "--lr", str(lr), "--quiet",
                       "--inputs", job.path("x.npy"), "--labels", job.path("y.npy")])
    losses, weights = reference_training(
        steps, lr, lambda s: ([f32(v) for v in xs[s % rows]], ys[s % rows]))
    check_training(job, proc, steps, losses, weights, [steps], quiet=True)


def expect_failure(proc, elapsed, patterns, limit=30):
    check(proc.returncode != 0, "expected a non-zero exit status")
    for p in patterns:
        check(re.search(p, proc.stderr, re.M) is not None,
              "stderr lacks /%s/" % p)
    check(elapsed < limit, "took %.1f s to fail" % elapsed)


def case_build_id(job, args):
    job.write_build(build_id="77c1deadbeef")
    proc, elapsed = job.run(["--steps", "2"])
    expect_failure(proc, elapsed, [
        r"^pipec-rt: error: stage binary was built for build %s but \S*manifest.json "
        r"is for build 77c1deadbeef \(rank \d, stage \d, step 0\)$" % re.escape(args.build_id)])
    check(not os.path.exists(job.path("checkpoints")), "checkpoints written")


def case_world_size(job, args):
    job.write_build(num_ranks=3)
    proc, elapsed = job.run(["--steps", "2"])
    expect_failure(proc, elapsed, [
        r"^pipec-rt: error: \S*manifest.json is for 3 ranks \(num_ranks\) but the job has 2"])


def case_nan(job, args):
    job.write_build()
    rows = 3 * B  # step 3 (samples 16..23) contains a NaN
    xs = [0.1 * ((r * 7 + k) % 5) - 0.2 for r in range(rows) for k in range(D)]
    xs[(2 * B + 3) * D + 1] = float("nan")
    write_npy(job.path("x.npy"), "<f4", [rows, D], xs, "f")
    write_npy(job.path("y.npy"), "<i8", [rows], [r % C for r in range(rows)], "q")
    proc, elapsed = job.run(["--steps", "6", "--checkpoint-every", "1",
                             "--inputs", job.path("x.npy"), "--labels", job.path("y.npy")])
    ckpt = job.path("checkpoints")
    # Every rank stops; rank 0 alone says so (one line for the job).
    expect_failure(proc, elapsed, [
        r"^pipec-rt: error: loss is nan at step 3 \(last good checkpoint: "
        r"%s\) \(rank 0, stage 0, step 3\)$" % re.escape(os.path.join(ckpt, "step-000002"))],
        limit=20)
    check("loss is nan" not in "\n".join(l for l in proc.stderr.splitlines() if "(rank 1," in l),
          "rank 1 printed the NaN line too: %r" % proc.stderr[-400:])
    steps_printed = [l for l in proc.stdout.splitlines() if l.startswith("step ")]
    check(len(steps_printed) == 2, "step lines before the NaN: %r" % steps_printed)
    check(sorted(os.listdir(ckpt)) == ["latest", "step-000001", "step-000002"],
          "checkpoints after NaN: %s" % os.listdir(ckpt))
    with open(os.path.join(ckpt, "latest")) as f:
        check(f.read().strip() == "step-000002", "latest after NaN")


def case_bad_npy(job, args):
    job.write_build()
    write_npy(job.path("x.npy"), "<f4", [16, D], [0.5] * (16 * D), "f")
    with open(job.path("x.npy"), "rb") as f:
        blob = f.read()
    with open(job.path("x.npy"), "wb") as f:
        f.write(blob[:-10])  # truncated data
    proc, elapsed = job.run(["--steps", "2", "--inputs", job.path("x.npy")])
    expect_failure(proc, elapsed, [
        r"^pipec-rt: error: '%s' is not a valid \.npy file: truncated data: shape "
        r"\(16, 4\) of '<f4' needs 256 bytes, the file has 246 \(rank 0, stage 0, step 0\)$"
        % re.escape(job.path("x.npy"))])


def case_bad_labels(job, args):
    job.write_build()
    write_npy(job.path("y.npy"), "<i8", [10], [0, 1, 2, 0, 1, 2, 7, 0, 1, 2], "q")
    proc, elapsed = job.run(["--steps", "2", "--labels", job.path("y.npy")])
    expect_failure(proc, elapsed, [
        r"^pipec-rt: error: labels file '%s' \(feed 'y'\): row 6 has label 7 "
        r"outside \[0, 3\) \(rank 1, stage 1, step 0\)$" % re.escape(job.path("y.npy"))])


def case_usage(job, args):
    job.write_build()
    proc, elapsed = job.run(["--steps", "2", "--learning-rate", "0.1"])
    expect_failure(proc, elapsed, [
        r"^pipec-rt: error: unknown flag '--learning-rate' \(stage \d, step 0\)$",
        r"^usage: "])


CASES = {
    "synthetic": case_synthetic, "npy": case_npy, "build-id": case_build_id,
    "world-size": case_world_size, "nan": case_nan, "bad-npy": case_bad_npy,
    "bad-labels": case_bad_labels, "usage": case_usage,
}


def main():
    parser = argparse.ArgumentParser()
    for flag in ("--mpirun", "--stage0", "--stage1", "--build-id", "--workdir"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--case", required=True, choices=sorted(CASES))
    args = parser.parse_args()
    CASES[args.case](Job(args), args)
    if failures:
        print("%d check(s) failed in case %s" % (len(failures), args.case))
        return 1
    print("case %s passed" % args.case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
