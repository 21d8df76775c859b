#!/usr/bin/python3
"""End-to-end checks that pipec fails cleanly on bad input.

    /usr/bin/python3 test/e2e/bad_input.py --pipec build/bin/pipec \
        --pipec-translate build/bin/pipec-translate --workdir DIR

Every case must end within a timeout with an exit status in 1..127 (an
error, not a signal or crash) and print exactly one error line, i.e. one
distinct line containing `error:` (the runtime documents that a start-up
check or a non-finite loss may print the same line once per rank, so copies
that differ only in the "(rank R, stage S, step T)" suffix count once),
that states the key fact of the case. The unsupported-operator case prints
one error line followed by the list of operators. Compiler cases must print
nothing else; no case may print a traceback, a stack dump or an IR dump.

The NaN cases also check that training stops at the bad step, and that the
last good checkpoint is intact (complete, readable, `latest` naming it, no
temporary files); a successful run must leave no temporary files either.

Prints one line per case and `N passed, M failed`; exits 1 on any failure.
"""
import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from safetensors_io import read_safetensors, load_checkpoint  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
MAKE_MLP = os.path.join(REPO, "examples", "mlp", "make_mlp.py")
TIMEOUT = 60

# Text that must never appear: crashes, stack dumps, Python tracebacks, and
# MLIR's dump of the module that comes with a diagnostic.
FORBIDDEN = [
    "Traceback (most recent call last)", "Stack dump", "PLEASE submit a bug report",
    "Segmentation fault", "core dumped", "terminate called", "LLVM ERROR",
    "Assertion", "Aborted", "AddressSanitizer", "Process received signal",
    "note: see current operation", "builtin.module", "func.func",
]

RANK_SUFFIX = re.compile(r"\s*\((rank \d+, )?stage \d+, step \d+\)\s*$")


class Runner:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def report(self, name, problems, detail=""):
        if problems:
            self.failed += 1
            print(f"FAIL {name}: " + "; ".join(problems), flush=True)
        else:
            self.passed += 1
            print(f"PASS {name}: {detail}", flush=True)


def run(cmd, timeout=TIMEOUT):
    """Runs cmd in its own process group; on timeout kills that group.
    Returns (returncode or None on timeout, combined output, seconds)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = p.communicate()
        rc = None
    return rc, out.decode("utf-8", errors="replace"), time.monotonic() - t0


def error_lines(out):
    """Distinct lines containing `error:`, with per-rank copies merged."""
    seen, lines = set(), []
    for line in out.splitlines():
        if "error:" not in line:
            continue
        key = RANK_SUFFIX.sub("", line.strip())
        if key not in seen:
            seen.add(key)
            lines.append(line.strip())
    return lines


def short(s, n=300):
    s = s.strip().replace("\n", " | ")
    return s if len(s) <= n else s[:n] + "..."


def check_failure(cmd, facts, names=(), only_error_line=False, extra_lines=None, timeout=TIMEOUT):
    """Runs cmd and checks the common rules. names: file names the error line
    must contain; facts: regexes (case-insensitive) that the error line must
    match once those names (and any path) are taken out of it, so that a
    file name cannot stand in for the fact. only_error_line: the output may
    hold nothing but the error line (and, with extra_lines, lines matching
    that regex). Returns (problems, error line, output, seconds)."""
    problems = []
    rc, out, secs = run(cmd, timeout)
    if rc is None:
        return [f"no exit within {timeout}s (hang); output: {short(out)}"], "", out, secs
    if rc == 0:
        problems.append("exit status 0")
    elif rc < 0 or rc >= 128:
        problems.append(f"exit status {rc} (signal/crash)")
    for bad in FORBIDDEN:
        if bad in out:
            problems.append(f"output contains {bad!r}")
    errs = error_lines(out)
    line = errs[0] if errs else ""
    if len(errs) != 1:
        problems.append(f"{len(errs)} distinct 'error:' lines, expected 1: {errs[:4]}")
    stripped = line
    for n in names:
        if n not in line:
            problems.append(f"error line does not name {n!r}: {line!r}")
        stripped = re.sub(r"\S*" + re.escape(n), "<file>", stripped)
    for fact in facts:
        if not re.search(fact, stripped, re.IGNORECASE):
            problems.append(f"error line does not match /{fact}/: {line!r}")
    if only_error_line:
        others = [l for l in out.splitlines() if l.strip() and "error:" not in l
                  and not (extra_lines and re.search(extra_lines, l))]
        if others:
            problems.append(f"{len(others)} other output lines, e.g. {others[0][:120]!r}")
    return problems, line, out, secs


def make_unsupported(src, dst):
    """The MLP with a LpPool (unsupported) before the Flatten and a
    custom-domain op after the first activation."""
    m = onnx.load(src)
    g = m.graph
    nodes = list(g.node)
    conv = helper.make_node("LpPool", [g.input[0].name], ["/pool/LpPool_output_0"],
                            name="/pool/LpPool", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    nodes[0].input[0] = "/pool/LpPool_output_0"
    act = next(i for i, n in enumerate(nodes) if n.op_type in ("Relu", "Tanh"))
    custom = helper.make_node("FancyAct", [nodes[act].output[0]], ["/custom/FancyAct_output_0"],
                              name="/custom/FancyAct", domain="com.example")
    for n in nodes[act + 1:]:
        for i, name in enumerate(n.input):
            if name == nodes[act].output[0]:
                n.input[i] = "/custom/FancyAct_output_0"
    new = [conv] + nodes[:act + 1] + [custom] + nodes[act + 1:]
    del g.node[:]
    g.node.extend(new)
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    onnx.save(m, dst)


def make_symbolic(src, dst):
    m = onnx.load(src)
    for vi in list(m.graph.input) + list(m.graph.output):
        if vi.name in {i.name for i in m.graph.initializer}:
            continue
        vi.type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(m, dst)


def checkpoint_problems(ckdir, want_step, init_names, max_step=None):
    """The checkpoint folder is complete and clean: `latest` names
    step-<want_step>, which holds every weight; no temporary files; no step
    folder beyond max_step."""
    problems = []
    if not os.path.isdir(ckdir):
        return [f"{ckdir} missing"], None, []
    tmp = [os.path.relpath(p, ckdir) for p in glob.glob(os.path.join(ckdir, "**", "*"), recursive=True)
           if ".tmp" in os.path.basename(p)]
    tmp += [os.path.relpath(p, ckdir) for p in glob.glob(os.path.join(ckdir, "**", ".*"), recursive=True)]
    if tmp:
        problems.append(f"temporary files left: {sorted(set(tmp))[:5]}")
    want = f"step-{want_step:06d}"
    try:
        with open(os.path.join(ckdir, "latest")) as f:
            latest = f.read()
        if latest != want + "\n":
            problems.append(f"latest holds {latest!r}, expected {want!r} and a newline")
    except OSError as e:
        problems.append(f"cannot read latest: {e}")
    steps = sorted(d for d in os.listdir(ckdir) if d.startswith("step-"))
    if max_step is not None:
        beyond = [d for d in steps if int(d[5:]) > max_step]
        if beyond:
            problems.append(f"checkpoint folders beyond step {max_step}: {beyond}")
    weights = None
    try:
        weights = load_checkpoint(os.path.join(ckdir, want))
        if set(weights) != set(init_names):
            problems.append(f"{want} holds {sorted(weights)}, expected {sorted(init_names)}")
        nonfinite = [k for k, v in weights.items() if not np.all(np.isfinite(v))]
        if nonfinite:
            problems.append(f"{want} has non-finite values in {nonfinite}")
    except Exception as e:  # noqa: BLE001 - any reader error is a finding
        problems.append(f"{want} unreadable: {type(e).__name__}: {e}")
    return problems, weights, steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipec", required=True)
    ap.add_argument("--pipec-translate", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    pipec = os.path.abspath(args.pipec)
    translate = os.path.abspath(args.pipec_translate)
    work = os.path.abspath(args.workdir)
    for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
        os.environ.setdefault(k, "1")
    t_start = time.monotonic()
    for tool in (pipec, translate,):
        if not os.access(tool, os.X_OK):
            print(f"FAIL setup: {tool} is not an executable")
            print("0 passed, 1 failed")
            return 1
    R = Runner()

    d = os.path.join(work, "bad")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)

    def p(name):
        return os.path.join(d, name)

    # -- inputs -----------------------------------------------------------------
    rc, out, _ = run([sys.executable, MAKE_MLP, "-o", p("mlp.onnx"), "--data-steps", "2"])
    if rc != 0:
        R.report("setup: make_mlp", [f"exit {rc}: {short(out)}"])
        print(f"{R.passed} passed, {R.failed} failed")
        return 1
    model = onnx.load(p("mlp.onnx"))
    init_names = [i.name for i in model.graph.initializer]
    blob = open(p("mlp.onnx"), "rb").read()
    with open(p("half.onnx"), "wb") as f:
        f.write(blob[:len(blob) // 2])
    with open(p("notes.onnx"), "w") as f:
        f.write("This is a text file, not an ONNX model.\n" * 20)
    open(p("zero.onnx"), "wb").close()
    make_unsupported(p("mlp.onnx"), p("unsupported.onnx"))
    make_symbolic(p("mlp.onnx"), p("symbolic.onnx"))

    x = np.load(p("x.npy"))
    y = np.load(p("y.npy"))
    B = 64
    with open(p("garbage.npy"), "wb") as f:
        f.write(bytes(range(256)) * 8)
    np.save(p("x_wrong_shape.npy"), np.zeros((len(x), 1, 28, 27), np.float32))
    y_bad = y.copy()
    y_bad[70] = 10  # 10 classes: valid labels are 0..9
    np.save(p("y_out_of_range.npy"), y_bad)
    np.save(p("y_half.npy"), y[:len(y) // 2])
    x_inf = x.copy()
    x_inf[B + 5, 0, 3, 3] = np.inf  # row 69: in the second global batch -> step 2
    np.save(p("x_inf.npy"), x_inf)

    # -- ONNX files: both pipec compile and pipec-translate ---------------------
    file_cases = [
        ("truncated-onnx", "half.onnx", r"truncat|pars|not a valid onnx|not an onnx|as an onnx model"),
        ("text-file", "notes.onnx", r"pars|not a valid onnx|not an onnx|as an onnx model"),
        ("empty-file", "zero.onnx", r"empty|0 bytes|not a valid onnx|not an onnx|as an onnx model"),
        ("missing-file", "absent.onnx", r"no such file|does not exist|not found"),
    ]
    for name, fname, fact in file_cases:
        for tool, cmd in (("compile", [pipec, "compile", p(fname), "--stages", "2", "--microbatches", "4",
                                       "-o", p(f"out-{name}"), "--quiet"]),
                          ("translate", [translate, p(fname)])):
            problems, line, _, _ = check_failure(cmd, [fact], names=[fname], only_error_line=True)
            R.report(f"{tool} {name}", problems, line)

    # -- unsupported operators ----------------------------------------------------
    for tool, cmd in (("compile", [pipec, "compile", p("unsupported.onnx"), "--stages", "2",
                                   "--microbatches", "4", "-o", p("out-unsupported"), "--quiet"]),
                      ("translate", [translate, p("unsupported.onnx")])):
        problems, line, out, _ = check_failure(cmd, [r"unsupported"], names=["unsupported.onnx"],
                                               only_error_line=True, extra_lines=r"^\s+\S")
        for op, node in (("LpPool", "/pool/LpPool"), ("FancyAct", "/custom/FancyAct")):
            n = len(re.findall(re.escape(node) + r"(?![\w/])", out))
            if n != 1:
                problems.append(f"node {node} named {n} times, expected once")
            elif not any(op in l and node in l for l in out.splitlines()):
                problems.append(f"no line names both {op} and its node {node}")
        if "com.example" not in out:
            problems.append("the custom domain 'com.example' is not named")
        for ok_op in ("Gemm", "Flatten", "Relu", "Tanh"):
            if re.search(rf"^\s+{ok_op}\b", out, re.MULTILINE):
                problems.append(f"supported op {ok_op} listed as unsupported")
        R.report(f"{tool} unsupported-ops", problems, short(out))

    # -- compile options --------------------------------------------------------
    compile_cases = [
        ("symbolic-batch-without---batch", [p("symbolic.onnx"), "--stages", "2", "--microbatches", "4"],
         [r"batch", r"--batch"]),
        ("stages-9-for-8-layers", [p("mlp.onnx"), "--stages", "9", "--microbatches", "4"],
         [r"(?<![\d.])9(?![\d.])", r"(?<![\d.])8(?![\d.])", r"stage"]),
        ("batch-64-into-5-microbatches", [p("mlp.onnx"), "--stages", "2", "--microbatches", "5"],
         [r"(?<![\d.])64(?![\d.])", r"(?<![\d.])5(?![\d.])", r"microbatch"]),
        ("unknown-schedule", [p("mlp.onnx"), "--stages", "2", "--microbatches", "4", "--schedule", "zigzag"],
         [r"zigzag", r"schedule"]),
        ("replicas-3-counts-for-2-stages", [p("mlp.onnx"), "--stages", "2", "--microbatches", "4",
                                            "--replicas", "1,2,1"],
         [r"--replicas", r"(?<![\d.])3(?![\d.])", r"(?<![\d.])2(?![\d.])"]),
        ("replicas-more-than-microbatches", [p("mlp.onnx"), "--stages", "2", "--microbatches", "2",
                                             "--replicas", "3,1"],
         [r"3 replicas", r"(?<![\d.])2 microbatches"]),
        ("split-replicas-more-than-samples", [p("mlp.onnx"), "--stages", "2", "--microbatches", "8",
                                              "--replicas", "9,1", "--replica-mode", "split"],
         [r"9 replicas", r"(?<![\d.])8 samples"]),
        ("unknown-replica-mode", [p("mlp.onnx"), "--stages", "2", "--microbatches", "4",
                                  "--replicas", "2,1", "--replica-mode", "zigzag"],
         [r"--replica-mode", r"zigzag", r"split"]),
        ("interleaved-replicas-round-robin", [p("mlp.onnx"), "--stages", "2", "--microbatches", "4",
                                              "--schedule", "interleaved", "--chunks", "2", "--replicas", "2,1"],
         [r"interleaved", r"--replica-mode split"]),
        ("replicas-with-1f1b-uneven-round", [p("mlp.onnx"), "--stages", "2", "--microbatches", "4",
                                             "--replicas", "3,1", "--schedule", "1f1b"],
         [r"1f1b", r"multiple of every stage's replica count", r"stage 0 has 3"]),
        ("interleaved-m-not-multiple-of-p", [p("mlp.onnx"), "--stages", "2", "--chunks", "2",
                                             "--microbatches", "1", "--schedule", "interleaved"],
         [r"interleaved", r"multiple", r"(?<![\d.])2(?![\d.])"]),
        ("chunks-without-interleaved", [p("mlp.onnx"), "--stages", "2", "--chunks", "2", "--microbatches", "4"],
         [r"--chunks 2", r"interleaved"]),
        ("interleaved-more-chunks-than-layers", [p("mlp.onnx"), "--stages", "4", "--chunks", "3",
                                                 "--microbatches", "4", "--schedule", "interleaved"],
         [r"(?<![\d.])12(?![\d.])", r"(?<![\d.])8(?![\d.])", r"stage"]),
        ("2bw-with-too-few-microbatches", [p("mlp.onnx"), "--stages", "4", "--microbatches", "2",
                                           "--schedule", "2bw"],
         [r"2bw", r"p - 1 = 3", r"got 2"]),
        ("stages-past-int", [p("mlp.onnx"), "--stages", "4294967298", "--microbatches", "4"],
         [r"--stages", r"2147483647"]),
        ("input-shape-unknown-name", [p("mlp.onnx"), "--stages", "2", "--microbatches", "4",
                                      "--input-shape", "nosuch=1x2"],
         [r"nosuch", r"not an input"]),
        ("momentum-out-of-range", [p("mlp.onnx"), "--stages", "2", "--microbatches", "4",
                                   "--optimizer", "momentum", "--momentum", "1.5"],
         [r"--momentum", r"\[0, 1\)"]),
    ]
    for name, cargs, facts in compile_cases:
        cmd = [pipec, "compile"] + cargs + ["-o", p(f"out-{name}"), "--quiet"]
        problems, line, _, _ = check_failure(cmd, facts, only_error_line=True)
        R.report(f"compile {name}", problems, line)
    # Control: the symbolic model compiles once the batch is given.
    rc, out, _ = run([pipec, "compile", p("symbolic.onnx"), "--stages", "2", "--microbatches", "4",
                      "--batch", "64", "-o", p("out-symbolic-ok"), "--quiet"])
    R.report("compile symbolic-batch-with---batch-64 (control)",
             [] if rc == 0 else [f"exit {rc}: {short(out)}"], "compiles")

    # -- pipec train --------------------------------------------------------------
    A, Bdir = p("build-mb4"), p("build-mb8")
    setup = []
    for out_dir, mb in ((A, 4), (Bdir, 8)):
        rc, out, _ = run([pipec, "compile", p("mlp.onnx"), "--stages", "2", "--microbatches", str(mb),
                          "-o", out_dir, "--quiet"], timeout=300)
        if rc != 0:
            setup.append(f"compile with --microbatches {mb}: exit {rc}: {short(out)}")
    R.report("setup: two builds (2 stages, 4 and 8 microbatches)", setup, "compiled")
    if setup:
        print(f"total {time.monotonic() - t_start:.1f}s")
        print(f"{R.passed} passed, {R.failed} failed")
        return 1

    def train(build, *extra, tag):
        return [pipec, "train", build, "--lr", "0.05", "--quiet",
                "--checkpoint-dir", p(f"ckpt-{tag}"), "--metrics", p(f"metrics-{tag}.jsonl")] + list(extra)

    xs, ys = p("x.npy"), p("y.npy")
    train_cases = [
        ("missing-npy", ["--steps", "2", "--inputs", p("no_such_input.npy"), "--labels", ys],
         ["no_such_input.npy"], [r"no such file|does not exist|not found"]),
        ("malformed-npy", ["--steps", "2", "--inputs", p("garbage.npy"), "--labels", ys],
         ["garbage.npy"], [r"npy|not a valid|malformed"]),
        ("malformed-labels-npy", ["--steps", "2", "--inputs", xs, "--labels", p("garbage.npy")],
         ["garbage.npy"], [r"npy|not a valid|malformed"]),
        ("wrong-shape-npy", ["--steps", "2", "--inputs", p("x_wrong_shape.npy"), "--labels", ys],
         ["x_wrong_shape.npy"], [r"shape", r"27"]),
        ("labels-out-of-range", ["--steps", "2", "--inputs", xs, "--labels", p("y_out_of_range.npy")],
         ["y_out_of_range.npy"], [r"row 70\b", r"(?<![\d.])10(?![\d.])"]),
        # Data files that do not pair: refused before launch, naming them.
        ("labels-fewer-rows-than-inputs", ["--steps", "2", "--inputs", xs, "--labels", p("y_half.npy")],
         ["y_half.npy"], [r"as many samples", r"(?<![\d.])%d(?![\d.])" % (len(y) // 2)]),
        ("labels-without-inputs", ["--steps", "2", "--labels", ys], [], [r"--labels without --inputs"]),
        ("inputs-without-labels", ["--steps", "2", "--inputs", xs], [], [r"--inputs without --labels"]),
    ]
    # A refusal at start-up is agreed on by the ranks and printed once: the
    # output is pipec's one line, without the launcher's abort banner.
    for name, targs, names, facts in train_cases:
        problems, line, _, _ = check_failure(train(A, *targs, tag=name), facts, names=names,
                                             only_error_line=True)
        if glob.glob(os.path.join(p(f"ckpt-{name}"), "*")):
            problems.append("checkpoint files were written although the input was rejected")
        R.report(f"train {name}", problems, line)

    # A rank whose local teardown never ends after the job (a GPU that
    # stopped answering; simulated by PIPEC_TEARDOWN_TEST_HANG): it ends
    # itself PIPEC_TEARDOWN_TIMEOUT_S after its transport closed, with one
    # line and status 4, and the run's checkpoint is complete.
    os.environ.update(PIPEC_TEARDOWN_TIMEOUT_S="2", PIPEC_TEARDOWN_TEST_HANG="1")
    try:
        problems, line, out, secs = check_failure(
            train(A, "--steps", "2", "--inputs", xs, "--labels", ys, tag="teardown"),
            [r"teardown", r"did not finish 2 s", r"results were written"],
            extra_lines=r"^done: ", only_error_line=True, timeout=90)
    finally:
        del os.environ["PIPEC_TEARDOWN_TIMEOUT_S"], os.environ["PIPEC_TEARDOWN_TEST_HANG"]
    problems += checkpoint_problems(p("ckpt-teardown"), 2, init_names)[0]
    if secs > 45:
        problems.append(f"took {secs:.0f} s")
    R.report("train teardown-that-never-ends", problems, line)
    os.environ["PIPEC_TEARDOWN_TIMEOUT_S"] = "soon"
    try:
        problems, line, _, _ = check_failure(
            train(A, "--steps", "1", "--inputs", xs, "--labels", ys, tag="teardown-bad"),
            [r"PIPEC_TEARDOWN_TIMEOUT_S=soon", r"expected seconds"])
    finally:
        del os.environ["PIPEC_TEARDOWN_TIMEOUT_S"]
    R.report("train PIPEC_TEARDOWN_TIMEOUT_S-not-a-number", problems, line)

    # A stage binary started with the manifest of another build.
    mixed = p("build-mb4-with-mb8-manifest")
    shutil.copytree(A, mixed)
    shutil.copyfile(os.path.join(Bdir, "manifest.json"), os.path.join(mixed, "manifest.json"))
    ids = []
    for b in (A, Bdir):
        with open(os.path.join(b, "manifest.json")) as f:
            ids.append(json.load(f)["build_id"])
    facts = [r"build"] + [re.escape(i) for i in ids]
    if ids[0] == ids[1]:
        R.report("train manifest-of-another-build", [f"both builds have build_id {ids[0]}"])
    else:
        problems, line, _, _ = check_failure(
            train(mixed, "--steps", "2", "--inputs", xs, "--labels", ys, tag="mixed"), facts,
            only_error_line=True)
        R.report("train manifest-of-another-build", problems, line)

    # An output path that can never be written is refused before step 1
    # (it used to lose the run at its end, and the error after start-up
    # crashed the ranks).
    with open(p("a-file"), "w") as f:
        f.write("not a folder\n")
    for name, targs in (("checkpoint-dir-is-a-file", ["--checkpoint-dir", p("a-file")]),
                        ("summary-out-under-a-file", ["--summary-out", os.path.join(p("a-file"), "s.json")])):
        cmd = [pipec, "train", A, "--lr", "0.05", "--quiet", "--steps", "2", "--inputs", xs,
               "--labels", ys, "--metrics", p(f"metrics-{name}.jsonl")] + targs
        problems, line, _, _ = check_failure(cmd, [r"not a folder"], names=["a-file"], only_error_line=True)
        R.report(f"train {name}", problems, line)

    # A disk that fills during a checkpoint (a 512 KiB tmpfs: stage 1's file
    # fits, stage 0's does not; root only): one
    # error line, exit 1, no crash, and `latest` never names the partial
    # checkpoint.
    small = p("small-disk")
    os.makedirs(small, exist_ok=True)
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", small],
        capture_output=True).returncode == 0
    if not mounted:
        R.report("train disk-full-during-checkpoint", [], "skipped: needs root and tmpfs")
    else:
        try:
            problems, line, _, _ = check_failure(
                train(A, "--steps", "3", "--checkpoint-every", "1", "--checkpoint-dir",
                      os.path.join(small, "ck"), "--inputs", xs, "--labels", ys, tag="diskfull"),
                [r"no space left"])
            latest = os.path.join(small, "ck", "latest")
            if os.path.exists(latest):
                problems.append(f"latest exists ({open(latest).read().strip()}) after a failed checkpoint")
            R.report("train disk-full-during-checkpoint", problems, line)
        finally:
            subprocess.run(["umount", small], capture_output=True)

    # Damaged stage executables are refused before launch.
    damaged = p("build-damaged")
    shutil.copytree(A, damaged)
    with open(os.path.join(damaged, "stage1"), "r+b") as f:
        f.truncate(10000)
    problems, line, _, _ = check_failure(train(damaged, "--steps", "1", tag="damaged"),
                                         [r"damaged", r"truncated"], names=["stage1"],
                                         only_error_line=True)
    R.report("train truncated-stage-executable", problems, line)

    # A stage executable that exits before MPI_Init (here /bin/true) left the
    # other ranks in MPI_Init for ever: the start-up deadline stops the job.
    never = p("build-never-starts")
    shutil.copytree(A, never)
    shutil.copyfile("/bin/true", os.path.join(never, "stage1"))
    os.environ["PIPEC_START_TIMEOUT_S"] = "5"
    try:
        problems, line, _, secs = check_failure(
            train(never, "--steps", "1", tag="never"),
            [r"rank 1 \(stage 1\) never started the runtime", r"rank 0 \(stage 0\) waited for it in MPI_Init"],
            only_error_line=True)
    finally:
        del os.environ["PIPEC_START_TIMEOUT_S"]
    if secs > 30:
        problems.append(f"took {secs:.0f} s with a 5 s deadline")
    R.report("train stage-never-joins-mpi", problems, line)

    # A successful run leaves complete checkpoints and no temporary files.
    rc, out, _ = run(train(A, "--steps", "3", "--checkpoint-every", "1", "--inputs", xs, "--labels", ys,
                           tag="ok"))
    problems = [] if rc == 0 else [f"exit {rc}: {short(out)}"]
    if rc == 0:
        cp, _, steps = checkpoint_problems(p("ckpt-ok"), 3, init_names)
        problems += cp
        if steps != ["step-000001", "step-000002", "step-000003"]:
            problems.append(f"step folders {steps}")
        for s in steps:
            try:
                load_checkpoint(os.path.join(p("ckpt-ok"), s))
            except Exception as e:  # noqa: BLE001
                problems.append(f"{s} unreadable: {e}")
    R.report("train success-leaves-no-temp-files", problems, "3 complete checkpoints, latest step-000003")

    # --resume: bit-identical to an uninterrupted run (checkpoint and every
    # metrics loss), after a run that went past its last checkpoint.
    name = "resume-bit-identical"
    problems = []
    rc, out, _ = run(train(A, "--steps", "5", "--inputs", xs, "--labels", ys, tag="full5"))
    if rc != 0:
        problems.append(f"uninterrupted run: exit {rc}: {short(out)}")
    rc, out, _ = run(train(A, "--steps", "3", "--checkpoint-every", "2", "--inputs", xs, "--labels", ys,
                           tag=name))
    if rc != 0:
        problems.append(f"first part: exit {rc}: {short(out)}")
    # Pretend the run died after step 3 with its last checkpoint at step 2.
    ck = p(f"ckpt-{name}")
    shutil.rmtree(os.path.join(ck, "step-000003"), ignore_errors=True)
    with open(os.path.join(ck, "latest"), "w") as f:
        f.write("step-000002\n")
    rc, out, _ = run(train(A, "--steps", "5", "--resume", "--inputs", xs, "--labels", ys, tag=name))
    if rc != 0:
        problems.append(f"resumed run: exit {rc}: {short(out)}")
    if not problems:
        for stage in (0, 1):
            a = os.path.join(p("ckpt-full5"), "step-000005", f"stage{stage}.safetensors")
            b = os.path.join(ck, "step-000005", f"stage{stage}.safetensors")
            wa, _ = read_safetensors(a)
            wb, _ = read_safetensors(b)
            diff = [k for k in wa if k not in wb or wa[k].tobytes() != wb[k].tobytes()]
            if diff or set(wa) != set(wb):
                problems.append(f"stage {stage}: tensors differ from the uninterrupted run: {diff}")
        with open(p("metrics-full5.jsonl")) as f:
            want = [json.loads(l)["loss"] for l in f if l.strip()]
        with open(p(f"metrics-{name}.jsonl")) as f:
            got = [json.loads(l) for l in f if l.strip()]
        if [g["step"] for g in got] != [1, 2, 3, 4, 5]:
            problems.append(f"metrics steps {[g['step'] for g in got]}, expected 1..5 once each")
        elif [g["loss"] for g in got] != want:
            problems.append(f"losses {[g['loss'] for g in got]} != uninterrupted {want}")
    R.report(f"train {name}", problems, "2 stages, 1f1b-flush: 3 steps, resume from step 2 to 5 == 5 steps")

    resume_cases = [
        ("resume-without-checkpoint", A, ["--steps", "2", "--resume"], "resume-none",
         [r"cannot resume", r"latest", r"does not exist"]),
        ("resume-past-steps", A, ["--steps", "2", "--resume"], name,
         [r"cannot resume", r"step 5\b", r"--steps 2\b"]),
        ("resume-checkpoint-of-another-build", Bdir, ["--steps", "6", "--resume"], name,
         [r"cannot resume", r"build"]),
    ]
    pd = p("build-1f1b")
    rc, out, _ = run([pipec, "compile", p("mlp.onnx"), "--stages", "2", "--microbatches", "4",
                      "--schedule", "1f1b", "-o", pd, "--quiet"], timeout=300)
    if rc != 0:
        R.report("setup: 1f1b build", [f"exit {rc}: {short(out)}"])
    else:
        resume_cases.append(("resume-continuous-schedule", pd, ["--steps", "6", "--resume"], name,
                             [r"--resume", r"synchronous", r"1f1b"]))
    for case, build, targs, tag, facts in resume_cases:
        cmd = [pipec, "train", build, "--lr", "0.05", "--quiet", "--checkpoint-dir", p(f"ckpt-{tag}"),
               "--metrics", p(f"metrics-{case}.jsonl"), "--inputs", xs, "--labels", ys] + targs
        problems, line, _, _ = check_failure(cmd, facts, only_error_line=True)
        R.report(f"train {case}", problems, line)

    # A checkpoint.json whose fields have the wrong types is refused by name.
    typed = p("ckpt-wrong-types")
    shutil.copytree(p(f"ckpt-{name}"), typed)
    listing = os.path.join(typed, "step-000005", "checkpoint.json")
    with open(listing) as f:
        doc = json.load(f)
    doc["stages"][0]["bytes"] = "abc"
    with open(listing, "w") as f:
        json.dump(doc, f)
    cmd = [pipec, "train", A, "--lr", "0.05", "--quiet", "--checkpoint-dir", typed, "--steps", "6",
           "--resume", "--metrics", p("metrics-wrong-types.jsonl"), "--inputs", xs, "--labels", ys]
    problems, line, _, _ = check_failure(cmd, [r"cannot resume", r"checkpoint-manifest", r"bytes"],
                                         names=["checkpoint.json"], only_error_line=True)
    R.report("train resume-checkpoint-json-wrong-types", problems, line)

    # --resume-from a checkpoint of another plan of the same model: 4 stages
    # for 2 steps, 2 stages to step 4, 3 stages with replicas 2,1,1 to step
    # 6, against 6 uninterrupted steps on 1 stage (float32 summation order
    # differs between plans: 1e-6).
    plans = {"plan4": ["--stages", "4"], "plan2": ["--stages", "2"],
             "plan3r": ["--stages", "3", "--replicas", "2,1,1"], "plan1": ["--stages", "1"],
             "plan2mom": ["--stages", "2", "--optimizer", "momentum"]}
    problems = []
    for name, cargs in plans.items():
        rc, out, _ = run([pipec, "compile", p("mlp.onnx"), "--microbatches", "4", "--quiet",
                          "-o", p(name)] + cargs, timeout=300)
        if rc != 0:
            problems.append(f"compile {name}: exit {rc}: {short(out)}")
    data = ["--inputs", xs, "--labels", ys, "--lr", "0.05", "--quiet"]
    if not problems:
        legs = [(p("plan1"), ["--steps", "6"]), (p("plan4"), ["--steps", "2"]),
                (p("plan2"), ["--steps", "4", "--resume-from", os.path.join(p("plan4"), "checkpoints")]),
                (p("plan3r"), ["--steps", "6", "--resume-from",
                               os.path.join(p("plan2"), "checkpoints", "step-000004")])]
        for build, targs in legs:
            rc, out, _ = run([pipec, "train", build] + data + targs)
            if rc != 0:
                problems.append(f"train {os.path.basename(build)}: exit {rc}: {short(out)}")
    if not problems:
        def losses_of(build):
            with open(os.path.join(build, "metrics.jsonl")) as f:
                return [(j["step"], j["loss"]) for j in map(json.loads, f)]
        want = losses_of(p("plan1"))
        got = losses_of(p("plan4")) + losses_of(p("plan2")) + losses_of(p("plan3r"))
        if [s for s, _ in got] != [1, 2, 3, 4, 5, 6]:
            problems.append(f"steps {[s for s, _ in got]}")
        for (s, a), (_, b) in zip(got, want):
            if abs(a - b) > 1e-6 * abs(b):
                problems.append(f"step {s}: loss {a} vs uninterrupted {b}")
        final = {}
        for stage in range(3):
            final.update(read_safetensors(os.path.join(
                p("plan3r"), "checkpoints", "step-000006", f"stage{stage}.safetensors"))[0])
        ref = read_safetensors(os.path.join(p("plan1"), "checkpoints", "step-000006",
                                            "stage0.safetensors"))[0]
        for k, v in ref.items():
            if k not in final or not np.allclose(final[k], v, rtol=1e-5, atol=1e-6):
                problems.append(f"weight {k} differs from the uninterrupted run")
    R.report("train resume-from-another-plan", problems,
             "4 stages -> 2 stages -> 3 stages (replicas 2,1,1) == 6 steps on 1 stage")
    # Another optimizer: its state is not in the checkpoint; refused by name.
    if os.path.isdir(os.path.join(p("plan4"), "checkpoints")):
        problems, line, _, _ = check_failure(
            [pipec, "train", p("plan2mom")] + data +
            ["--steps", "4", "--resume-from", os.path.join(p("plan4"), "checkpoints")],
            [r"cannot|no tensor", r"momentum"], only_error_line=True)
        if os.path.exists(os.path.join(p("plan2mom"), "checkpoints")):
            problems.append("the refused run wrote checkpoints")
        R.report("train resume-from-other-optimizer", problems, line)

    # Reference for the NaN cases: one clean step.
    rc, out, _ = run(train(A, "--steps", "1", "--inputs", xs, "--labels", ys, tag="one-step"))
    clean1 = None
    if rc == 0:
        try:
            clean1 = load_checkpoint(os.path.join(p("ckpt-one-step"), "step-000001"))
        except Exception as e:  # noqa: BLE001
            R.report("setup: one clean step", [f"checkpoint unreadable: {e}"])
    else:
        R.report("setup: one clean step", [f"exit {rc}: {short(out)}"])

    nan_cases = [
        ("nan-loss-from-inf-input", ["--inputs", p("x_inf.npy"), "--labels", ys], True),
        ("nan-loss-from-lr-1e30", ["--lr", "1e30", "--inputs", xs, "--labels", ys], False),
    ]
    for name, targs, compare_clean in nan_cases:
        ck = p(f"ckpt-{name}")
        cmd = train(A, "--steps", "4", "--checkpoint-every", "1", *targs, tag=name)
        problems, line, out, _ = check_failure(
            cmd, [r"loss is (nan|inf|-inf) at step 2\b", r"step-000001"])
        cp, weights, steps = checkpoint_problems(ck, 1, init_names, max_step=1)
        problems += cp
        try:
            with open(p(f"metrics-{name}.jsonl")) as f:
                mlines = [l for l in f.read().splitlines() if l.strip()]
            if len(mlines) != 1 or json.loads(mlines[0]).get("step") != 1:
                problems.append(f"metrics has {len(mlines)} lines, expected only step 1's")
        except (OSError, ValueError) as e:
            problems.append(f"metrics unreadable: {e}")
        if compare_clean and weights is not None and clean1 is not None:
            diff = [k for k in clean1 if k not in weights or not np.array_equal(weights[k], clean1[k])]
            if diff:
                problems.append(f"step-000001 differs from a clean one-step run in {diff}")
        R.report(f"train {name}", problems, line)

    # The stage executables themselves (the printed mpirun line, run by a
    # shell): a non-finite loss is exit status 3, and with no checkpoint
    # written yet the message says `none`.
    name = "nan-loss-exit-status-3"
    dry = train(A, "--steps", "3", "--inputs", p("x_inf.npy"), "--labels", ys, tag=name) + ["--dry-run"]
    rc, line_out, _ = run(dry)
    lines = [l for l in line_out.splitlines() if l.strip()]
    if rc != 0 or len(lines) != 1:
        R.report(f"stage-binaries {name}", [f"--dry-run exit {rc}, {len(lines)} lines: {short(line_out)}"])
    else:
        problems, line, _, _ = check_failure(
            ["/bin/sh", "-c", lines[0]], [r"loss is (nan|inf|-inf) at step 2\b", r"last good checkpoint: none"])
        rc, _, _ = run(["/bin/sh", "-c", lines[0]])
        if rc != 3:
            problems.append(f"exit status {rc}, documented 3 for a non-finite loss")
        if glob.glob(os.path.join(p(f"ckpt-{name}"), "*")):
            problems.append("checkpoint files written for a run that failed before any checkpoint")
        R.report(f"stage-binaries {name}", problems, line)

    # Stage executable: a bad flag is a usage error (exit 2) before MPI starts.
    problems, line, _, _ = check_failure([os.path.join(A, "stage0"), "--no-such-flag"],
                                         [r"unknown|unrecognized|invalid"], names=["--no-such-flag"])
    rc, _, _ = run([os.path.join(A, "stage0"), "--no-such-flag"])
    if rc != 2:
        problems.append(f"exit status {rc}, documented 2 for usage errors")
    R.report("stage-binary unknown-flag", problems, line)

    # A rank killed mid-run (SIGKILL: no chance to report): the job ends
    # within seconds, non-zero, and pipec names the rank, its stage and the
    # step it was in; the other rank is stopped by mpirun and not blamed.
    name = "rank-killed-mid-run"
    cmd = train(A, "--steps", "100000000", "--inputs", xs, "--labels", ys, tag=name)
    problems = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    victim, deadline = None, time.monotonic() + 60
    metrics = p(f"metrics-{name}.jsonl")
    while victim is None and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
        if not (os.path.exists(metrics) and os.path.getsize(metrics) > 0):
            continue  # wait until training steps are running
        ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
        for l in ps.splitlines():
            pid, _, args_ = l.strip().partition(" ")
            if args_.startswith(os.path.join(A, "stage1") + " "):
                victim = int(pid)
    if victim is None:
        problems.append("stage1 process never seen running")
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0].decode("utf-8", errors="replace")
    else:
        os.kill(victim, signal.SIGKILL)
        t_kill = time.monotonic()
        try:
            out = proc.communicate(timeout=30)[0].decode("utf-8", errors="replace")
            secs = time.monotonic() - t_kill
            if secs > 10:
                problems.append(f"job took {secs:.1f}s to end after the kill")
            if proc.returncode == 0:
                problems.append("exit status 0")
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out = proc.communicate()[0].decode("utf-8", errors="replace")
            problems.append("no exit within 30s of the kill (hang)")
    blamed = re.findall(r"pipec: error: rank (\d+) \(stage (\d+)\) died without a report during step (\d+)", out)
    line = next((l for l in out.splitlines() if "died without a report" in l), "")
    if len(blamed) != 1 or blamed[0][:2] != ("1", "1") or int(blamed[0][2]) < 1:
        problems.append(f"expected one line naming rank 1, stage 1 and a step; got {blamed}: {short(out)}")
    for bad in ("Traceback (most recent call last)", "Segmentation fault", "core dumped", "terminate called"):
        if bad in out:
            problems.append(f"output contains {bad!r}")
    R.report(f"train {name}", problems, line)

    print(f"total {time.monotonic() - t_start:.1f}s")
    print(f"{R.passed} passed, {R.failed} failed")
    return 1 if R.failed else 0


if __name__ == "__main__":
    sys.exit(main())
