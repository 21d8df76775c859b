#!/usr/bin/python3
"""pipec train across emulated hosts that share no files (issue 13).

    /usr/bin/python3 test/e2e/multihost.py --pipec build/bin/pipec --workdir DIR

Four hosts are network namespaces joined by a bridge (test/e2e/netns_hosts.py),
each with its own /tmp and its own copy of the compiled run folder at the
same path; `pipec train` runs on host 0 and launches through `--hostfile` /
`--hosts` and OpenMPI's rsh agent (a stand-in for ssh that enters a host's
namespaces), TCP only. Checks:

- one rank per host (`--hostfile`, slots=1): every loss equal to a one-host
  run's, and every stage's checkpoint, written on the host of its rank,
  bit-identical to the one-host run's (OPENBLAS_NUM_THREADS=1 on both: the
  float32 sums of sgemm depend on its thread count);
- two ranks per host (`--hosts a:2,b:2`): ranks fill the hosts in order
  (stages 0 and 1 on host 0, 2 and 3 on host 1), same losses;
- too few slots: refused before anything starts, one line;
- a start-up refusal on another host (the labels file exists on host 0 only,
  the loss rank runs on host 3): one error line naming the file and rank 3,
  no launcher banner, nothing written;
- a stage process killed on another host mid-run: the job ends (well within
  a minute), the launcher names rank 2 and its host, exit status non-zero.

- the trace of every rank merged on the launching host;
- `--resume` where each host kept only its own stages' files (a file missing
  or corrupt on its host refused by name, nothing touched);
- `--resume-from` a checkpoint of another plan whose stage files are spread
  over the hosts (2 stages x 2 replicas from 4 stages, weights fetched from
  the hosts that hold them), and refused by name when a host holding files
  is not in the job;
- a host lost and a link cut: the watchdog ends the job naming rank and host.

It skips (exit 0, a SKIP line) where network namespaces cannot be created
(not root, no `ip`/`unshare`). Ends with `N passed, N failed`.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_hosts  # noqa: E402
from e2e_common import wait_for_lines  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class Results:
    def __init__(self):
        self.passed = self.failed = 0

    def report(self, name, problems, detail=""):
        if problems:
            self.failed += 1
            print(f"FAIL {name}: " + "; ".join(problems[:6]), flush=True)
        else:
            self.passed += 1
            print(f"PASS {name}" + (f": {detail}" if detail else ""), flush=True)


def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]


def error_lines(text):
    return [l for l in text.splitlines() if "error:" in l]


# OpenMPI's daemon-tagged log lines ("[host:pid] ..."): races of its own
# teardown that vary from run to run; not held against pipec's output.
DAEMON_LOG = re.compile(r"^\[[^\]\s]+:\d+\] ")


def other_lines(text):
    return [l for l in text.splitlines()
            if l.strip() and "error:" not in l and "pipec: note:" not in l
            and not DAEMON_LOG.match(l)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipec", default=os.path.join(ROOT, "build/bin/pipec"))
    ap.add_argument("--workdir", default=f"/var/tmp/pipec-multihost-{os.getpid()}",
                    help="outside /tmp (every emulated host has its own /tmp)")
    ap.add_argument("--hosts", type=int, default=4)
    args = ap.parse_args()
    pipec = os.path.abspath(args.pipec)

    ok, why = netns_hosts.available()
    if not ok:
        print(f"SKIP multihost: {why}")
        print("0 passed, 0 failed")
        return 0
    netns_hosts.cleanup_stale("pcmt")

    work, pipec = netns_hosts.shared_workdir(args.workdir, "pipec-multihost", pipec)
    try:
        return run_tests(pipec, work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_tests(pipec, work, args):
    R = Results()
    t0 = time.monotonic()

    # The model, data and a 4-stage build; the one-host reference run.
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "examples/mlp/make_mlp.py"),
                    "--data-steps", "4", "-o", os.path.join(work, "mlp.onnx")],
                   check=True, stdout=subprocess.DEVNULL)
    build = os.path.join(work, "out")
    subprocess.run([pipec, "compile", os.path.join(work, "mlp.onnx"), "--stages", "4",
                    "--microbatches", "4", "-o", build, "--quiet"], check=True)
    ref = os.path.join(work, "reference")
    shutil.copytree(build, ref)
    for f in ("x.npy", "y.npy"):
        shutil.copy(os.path.join(work, f), ref)
    env1 = dict(os.environ, OPENBLAS_NUM_THREADS="1", **netns_hosts.MPI_ENV)
    steps = 3
    rc = subprocess.run([pipec, "train", ref, "--steps", str(steps), "--quiet",
                         "--inputs", os.path.join(ref, "x.npy"),
                         "--labels", os.path.join(ref, "y.npy")],
                        env=env1).returncode
    if rc != 0:
        R.report("setup: one-host reference run", [f"exit {rc}"])
        print(f"{R.passed} passed, {R.failed} failed")
        return 1
    want = losses(os.path.join(ref, "metrics.jsonl"))

    with netns_hosts.Hosts(n=args.hosts, prefix="pcmt") as h:
        run = h.run_path + "/out"
        launcher_args = " ".join(a for a in h.mpirun_args()
                                 if a != "--allow-run-as-root")
        launcher_args += " --mca mpi_yield_when_idle 1"

        def fresh_copies():
            h.install(run, build, [os.path.join(work, f) for f in ("x.npy", "y.npy")])

        def train(*extra, timeout=300, folder=None):
            cmd = [pipec, "train", folder or run, "--steps", str(steps), "--quiet",
                   "--inputs", run + "/x.npy", "--labels", run + "/y.npy",
                   "--launcher-args", launcher_args] + list(extra)
            t = time.monotonic()
            try:
                r = h.run_on(0, cmd, env=h.mpi_env(env1), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=timeout)
                return r.returncode, r.stdout, time.monotonic() - t
            except subprocess.TimeoutExpired as e:
                out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                return None, out, time.monotonic() - t

        def checkpoint_of(i, stage):
            return h.outside(i, f"{run}/checkpoints/step-{steps:06d}/stage{stage}.safetensors")

        def same_file(a, b):
            with open(a, "rb") as fa, open(b, "rb") as fb:
                return fa.read() == fb.read()

        def check_run(name, hostfile_args, host_of_stage):
            fresh_copies()
            rc, out, secs = train(*hostfile_args)
            problems = []
            if rc != 0:
                problems.append(f"exit {rc}: {out[-600:]}")
            else:
                # Rank 0 writes the metrics: on the launching machine.
                got = losses(h.outside(0, run + "/metrics.jsonl"))
                if got != want:
                    problems.append(f"losses {got} != one-host {want}")
                for j in range(1, h.n):
                    if os.path.exists(h.outside(j, run + "/metrics.jsonl")):
                        problems.append(f"metrics.jsonl also on host {j}")
                for stage, i in enumerate(host_of_stage):
                    mine = checkpoint_of(i, stage)
                    if not os.path.exists(mine):
                        problems.append(f"stage {stage}'s checkpoint is not on host {i}")
                        continue
                    theirs = os.path.join(ref, f"checkpoints/step-{steps:06d}/stage{stage}.safetensors")
                    if not same_file(mine, theirs):
                        problems.append(f"stage {stage}'s checkpoint differs from the one-host run's")
                    for j in range(h.n):
                        if j != i and os.path.exists(checkpoint_of(j, stage)):
                            problems.append(f"stage {stage}'s checkpoint also on host {j}")
            R.report(name, problems, f"losses {want} equal, checkpoints bit-identical ({secs:.1f} s)")

        # One rank per host, from a hostfile (hosts without slots= run one).
        hf = os.path.join(h.dir(0), "hosts.txt")
        with open(hf, "w") as f:
            f.write("# emulated hosts\n" + "".join(f"{h.addrs[i]}\n" for i in range(h.n)))
        check_run("hostfile one rank per host", ["--hostfile", h.run_path + "/hosts.txt",
                                                 "--trace", h.run_path + "/trace.json"],
                  [0, 1, 2, 3])
        # The trace: every rank's events gathered to rank 0, merged by the
        # launcher on the launching machine.
        problems = []
        try:
            with open(h.outside(0, h.run_path + "/trace.json")) as f:
                events = json.load(f)["traceEvents"]
            ranks = sorted({e.get("pid") for e in events if "pid" in e})
            if len(ranks) != 4:
                problems.append(f"trace has the events of processes {ranks}, expected 4 ranks")
        except Exception as e:  # noqa: BLE001
            problems.append(f"no merged trace on host 0: {e}")
        R.report("trace of every host merged on the launching host", problems,
                 f"{len(events) if not problems else 0} events")

        # Two ranks per host, in order.
        check_run("hosts two ranks per host", ["--hosts", f"{h.addrs[0]}:2,{h.addrs[1]}:2"], [0, 0, 1, 1])

        # --resume where each host kept only its own stages' files: 3 steps
        # with a checkpoint at step 2, the run "dies" after step 3 (latest
        # set back to step 2 on every host), resumed to step 5: equal to an
        # uninterrupted 5-step run, losses and checkpoints.
        def one_host_run(name, steps):
            """The build trained on one host for `steps` steps: its folder."""
            folder = os.path.join(work, name)
            shutil.copytree(build, folder)
            subprocess.run([pipec, "train", folder, "--steps", str(steps), "--quiet",
                            "--inputs", os.path.join(work, "x.npy"),
                            "--labels", os.path.join(work, "y.npy")], env=env1, check=True)
            return folder

        ref5 = one_host_run("reference5", 5)
        want5 = losses(os.path.join(ref5, "metrics.jsonl"))
        hosts4 = ["--hosts", ",".join(h.addrs)]
        fresh_copies()
        rc, out, _ = train(*hosts4, "--checkpoint-every", "2")
        problems = [] if rc == 0 else [f"first part: exit {rc}: {out[-400:]}"]
        for i in range(h.n):
            with open(h.outside(i, run + "/checkpoints/latest"), "w") as f:
                f.write("step-000002\n")
            shutil.rmtree(h.outside(i, run + "/checkpoints/step-000003"))
        # A missing stage file on its host: refused, one line, nothing touched.
        moved = h.outside(2, run + "/checkpoints/step-000002/stage2.safetensors")
        os.rename(moved, moved + ".away")
        before = open(h.outside(0, run + "/metrics.jsonl")).read()
        rc, out, _ = train(*hosts4, "--resume", "--steps", "5")
        errs = error_lines(out)
        missing = []
        if rc in (0, None):
            missing.append(f"exit {rc}")
        if len(errs) != 1 or "stage2.safetensors is missing" not in errs[0] or "rank 2" not in errs[0]:
            missing.append(f"error lines {errs}")
        if open(h.outside(0, run + "/metrics.jsonl")).read() != before:
            missing.append("metrics.jsonl was changed")
        R.report("resume with a stage file missing on its host: refused", missing,
                 errs[0] if errs else "")
        # Corrupt: one byte flipped.
        os.rename(moved + ".away", moved)
        data = bytearray(open(moved, "rb").read())
        data[-1] ^= 0xFF
        open(moved, "wb").write(bytes(data))
        rc, out, _ = train(*hosts4, "--resume", "--steps", "5")
        errs = error_lines(out)
        corrupt = [] if rc not in (0, None) else [f"exit {rc}"]
        if len(errs) != 1 or "stage2.safetensors is corrupt" not in errs[0]:
            corrupt.append(f"error lines {errs}")
        R.report("resume with a corrupt stage file: refused", corrupt, errs[0] if errs else "")
        data[-1] ^= 0xFF
        open(moved, "wb").write(bytes(data))
        rc, out, _ = train(*hosts4, "--resume", "--steps", "5")
        if rc != 0:
            problems.append(f"resumed run: exit {rc}: {out[-400:]}")
        else:
            got = losses(h.outside(0, run + "/metrics.jsonl"))
            if got != want5:
                problems.append(f"losses {got} != uninterrupted {want5}")
            for stage in range(4):
                mine = h.outside(stage, f"{run}/checkpoints/step-000005/stage{stage}.safetensors")
                theirs = os.path.join(ref5, f"checkpoints/step-000005/stage{stage}.safetensors")
                if not os.path.exists(mine) or not same_file(mine, theirs):
                    problems.append(f"stage {stage}'s step-5 checkpoint differs from the uninterrupted run's")
        R.report("resume across hosts without a shared filesystem", problems,
                 "3 steps, back to step 2, resumed to 5 == 5 uninterrupted steps")

        # --resume-from a checkpoint of another plan whose stage files are
        # spread over the hosts (host i holds only stage i's file of the
        # 4-stage run above, step 5): a 2-stage build with 2 replicas per
        # stage on the 4 hosts takes every weight it lacks from the host
        # that holds it and continues to step 7, equal to 7 uninterrupted
        # steps; on 2 hosts only, the files of hosts 2 and 3 are out of
        # reach: refused by name, nothing written.
        build2 = os.path.join(work, "out2")
        subprocess.run([pipec, "compile", os.path.join(work, "mlp.onnx"), "--stages", "2",
                        "--replicas", "2", "--microbatches", "4", "-o", build2, "--quiet"],
                       check=True)
        build2s = os.path.join(work, "out2s")
        subprocess.run([pipec, "compile", os.path.join(work, "mlp.onnx"), "--stages", "2",
                        "--microbatches", "4", "-o", build2s, "--quiet"], check=True)
        want7 = losses(os.path.join(one_host_run("reference7", 7), "metrics.jsonl"))
        for b in (build2, build2s):
            h.install(h.run_path + "/" + os.path.basename(b), b)
        problems, worst = [], 0.0
        held = sorted(os.path.basename(f) for f in
                      glob.glob(h.outside(1, run + "/checkpoints/step-000005/stage*.safetensors")))
        if held != ["stage1.safetensors"]:
            problems.append(f"host 1 holds {held}, expected stage1.safetensors only")
        rc, out, _ = train(*hosts4, "--steps", "7", "--resume-from", run + "/checkpoints",
                           folder=h.run_path + "/out2")
        if rc != 0:
            problems.append(f"exit {rc}: {out[-600:]}")
        else:
            got = losses(h.outside(0, h.run_path + "/out2/metrics.jsonl"))
            if len(got) != 2:
                problems.append(f"{len(got)} losses after the resume, expected 2 (steps 6, 7)")
            worst = max((abs(a - b) / abs(b) for a, b in zip(got, want7[5:])), default=0)
            if worst > 1e-5:
                problems.append(f"losses {got} != uninterrupted steps 6-7 {want7[5:]}")
        R.report("resume-from another plan whose files are on other hosts", problems,
                 "4 stages on 4 hosts (step 5) -> 2 stages x 2 replicas on 4 hosts, "
                 f"steps 6-7 within {worst if not problems else 0:.1e} of the uninterrupted run")
        rc, out, _ = train("--hosts", f"{h.addrs[0]},{h.addrs[1]}", "--steps", "7",
                           "--resume-from", run + "/checkpoints", folder=h.run_path + "/out2s")
        errs = error_lines(out)
        problems = [] if rc not in (0, None) else [f"exit {rc}"]
        if (len(errs) != 1 or "rank 1 (stage 1) needs tensor" not in errs[0]
                or "stage1.safetensors on host" not in errs[0]):
            problems.append(f"error lines {errs}")
        if os.path.exists(h.outside(0, h.run_path + "/out2s/metrics.jsonl")) or glob.glob(
                h.outside(1, h.run_path + "/out2s/checkpoints/*")):
            problems.append("something was written")
        R.report("resume-from with a host's files out of reach: refused", problems,
                 errs[0] if errs else "")

        # Too few slots: refused before launch.
        fresh_copies()
        rc, out, _ = train("--hosts", f"{h.addrs[0]},{h.addrs[1]}:2")
        problems = []
        errs = error_lines(out)
        if rc != 2:
            problems.append(f"exit {rc}, expected 2")
        if len(errs) != 1 or "4 ranks" not in errs[0] or "3 slots on 2 hosts" not in errs[0]:
            problems.append(f"error lines {errs}")
        if glob.glob(h.outside(0, run + "/checkpoints/*")):
            problems.append("something ran")
        R.report("too few slots refused", problems, errs[0] if errs else "")

        # A host that cannot be reached at start-up: reported as such, once
        # (no second launch, no blame on ranks that never started).
        fresh_copies()
        rc, out, _ = train("--hosts", f"{h.addrs[0]}:2,{h.addrs[1]},10.213.250.9")
        errs = error_lines(out)
        problems = [] if rc not in (0, None) else [f"exit {rc}"]
        if len(errs) != 1 or "could not start its daemon" not in errs[0]:
            problems.append(f"error lines {errs}")
        if "launching once more" in out or "died" in out:
            problems.append(f"relaunched or blamed ranks: {out[-300:]!r}")
        R.report("unreachable host at start-up: one line", problems, errs[0] if errs else "")

        # A start-up refusal on another host: the labels file only on host 0.
        fresh_copies()
        for i in range(1, h.n):
            os.remove(h.outside(i, run + "/y.npy"))
        rc, out, _ = train("--hosts", ",".join(h.addrs[i] for i in range(h.n)))
        problems = []
        errs = error_lines(out)
        others = other_lines(out)
        if rc in (0, None):
            problems.append(f"exit {rc}")
        if len(errs) != 1 or "y.npy" not in errs[0] or "rank 3" not in errs[0]:
            problems.append(f"error lines {errs}")
        if others:
            problems.append(f"other output: {others[:3]}")
        if any(glob.glob(h.outside(i, run + "/checkpoints/*")) for i in range(h.n)):
            problems.append("checkpoints were written")
        R.report("start-up refusal on another host: one line", problems, errs[0] if errs else "")

        # Failures mid-run on host 2 (stage 2), with checkpoints every 200
        # steps and a 5 s watchdog: the job must end well within
        # watchdog + 15 s, with one error line naming rank 2 and its host,
        # and the checkpoint it names complete on every host.
        def failure(name, inject, expect_rc, line_re, limit, also_good=None):
            fresh_copies()
            log_path = os.path.join(work, f"{name.replace(' ', '-')}.log")
            log = open(log_path, "w")
            proc = h.popen_on(0, [pipec, "train", run, "--steps", "1000000", "--quiet",
                                  "--checkpoint-every", "200", "--watchdog-s", "5",
                                  "--inputs", run + "/x.npy", "--labels", run + "/y.npy",
                                  "--launcher-args", launcher_args,
                                  "--hosts", ",".join(h.addrs)],
                              env=h.mpi_env(env1), stdout=log, stderr=subprocess.STDOUT, text=True)
            problems = []
            wait_for_lines(proc, h.outside(0, run + "/metrics.jsonl"), 450)
            if proc.poll() is not None:
                log.close()
                R.report(name, [f"the job ended before the failure: exit {proc.returncode}: "
                                + open(log_path).read()[-400:]])
                return
            inject()
            t = time.monotonic()
            try:
                proc.wait(timeout=limit + 30)
            except subprocess.TimeoutExpired:
                problems.append(f"the job did not end within {limit + 30} s")
                proc.kill()
                proc.wait()
            secs = time.monotonic() - t
            log.close()
            out = open(log_path).read()
            if secs > limit:
                problems.append(f"ended {secs:.1f} s after the failure (limit {limit} s)")
            if proc.returncode != expect_rc:
                problems.append(f"exit {proc.returncode}, expected {expect_rc}")
            errs = error_lines(out)
            if len(errs) != 1 or not (re.search(line_re, errs[0]) or (also_good and also_good(errs[0], out))):
                problems.append(f"error lines {errs[:4]} (want one matching /{line_re}/)")
            others = other_lines(out)
            if others:
                problems.append(f"{len(others)} other lines, e.g. {others[:2]}")
            # The checkpoint the error names (or the newest) is complete.
            named = re.search(r"checkpoint is (\S+?step-\d+)", out)
            if named:
                step_dir = named.group(1)
                for stage in range(4):
                    f = h.outside(stage, f"{step_dir}/stage{stage}.safetensors")
                    if not os.path.exists(f):
                        problems.append(f"{step_dir}/stage{stage}.safetensors missing on host {stage}")
            R.report(name, problems,
                     f"ended {secs:.1f} s after it, exit {proc.returncode}: {errs[0] if errs else ''}")

        def kill_stage2():
            # The process named stage2 (pgrep -f would also match mpirun's
            # command line: the hosts share one PID namespace).
            r = h.run_on(2, ["pgrep", "-x", "stage2"], stdout=subprocess.PIPE, text=True)
            for pid in r.stdout.split():
                os.kill(int(pid), signal.SIGKILL)

        def lose_host2():
            r = subprocess.run(["ip", "netns", "pids", h.netns[2]], stdout=subprocess.PIPE, text=True)
            for pid in r.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass

        def cut_link2():
            subprocess.run(["ip", "-n", h.switch, "link", "set", "p2", "down"], check=True)

        host2 = re.escape(h.addrs[2])
        failure("stage process killed on another host", kill_stage2, 137,
                rf"rank 2 \(stage 2\) on {host2} died without a report \(exited on signal 9.* during "
                r"step \d+", 20)
        failure("whole host lost", lose_host2, 4,
                rf"host {host2} was lost \(rank 2\)", 20)
        # A cut at a step's end finds the other ranks in the step's
        # collective, not waiting for a message of rank 2's: then the one
        # line is the first reporter's collective wait, and the note after
        # it must name rank 2 among the ranks that made no report (seen
        # once in a full parallel ctest, 2026-11-27).
        def collective_then_silent(err, out):
            return ("waiting in a collective" in err and re.search(r"checkpoint is \S+step-\d+", err)
                    and re.search(r"pipec: note: .*rank 2 \(stage 2\).* had made no watchdog report", out))

        failure("link to a host cut", cut_link2, 4,
                # Ranks 1 and 3 both wait for rank 2; under load the second
                # may reach its own limit after the launcher stopped the job
                # (5 s after the first report), so one waiter is enough.
                r"rank 2 \(stage 2, host \S+\) stopped answering.*ranks? [13](, [13])? waited"
                r".*checkpoint is \S+step-\d+", 20, also_good=collective_then_silent)

    print(f"total {time.monotonic() - t0:.1f}s")
    print(f"{R.passed} passed, {R.failed} failed")
    return 1 if R.failed else 0


if __name__ == "__main__":
    sys.exit(main())
