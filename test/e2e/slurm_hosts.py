#!/usr/bin/python3
"""`pipec train --launcher srun` on a SLURM cluster of several hosts (issue 13).

    /usr/bin/python3 test/e2e/slurm_hosts.py --pipec build/bin/pipec --workdir DIR

Three emulated hosts (network namespaces with their own hostname, /tmp and
run folder, test/e2e/netns_hosts.py) form a private SLURM cluster: munged
(one key, its socket in the shared scratch folder), slurmctld on host 0 and
one slurmd per host (its spool, pid and log files in the host's own /tmp),
each node at its own address. Nothing system-wide is touched; everything
is stopped afterwards, also on failure. Then, with the example MLP
compiled for 3 stages and copied into every host's run folder:

1. `pipec train --launcher srun --hosts h0,h1,h2` on host 0 runs stage i on
   host i through `srun --multi-prog --distribution=arbitrary` (OpenMPI over
   TCP between the hosts, wired up by SLURM's PMIx): every loss and every
   stage's checkpoint (written on its own host only) equal to a one-host
   mpirun run's, the metrics on the launching host;
2. killing the stage process on host 2 mid-run ends the job with one pipec
   line naming rank 2 and its stage, exit status 137.

Skips (printing why, and `0 passed, 0 failed`) without SLURM/munge binaries,
root, or network namespaces. Prints one line per check and `N passed, M
failed`.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import netns_hosts  # noqa: E402
from e2e_common import Checks, wait_for_lines  # noqa: E402
from slurm import BINARIES, slurm_conf, start_munged, stop_processes  # noqa: E402

HOSTS = 3


def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]


def same_file(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def cgroup_mounts():
    """Shell commands that mount this machine's cgroup file systems (v1
    controllers or the v2 tree) at /sys/fs/cgroup again."""
    cmds = ""
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, point, fstype, opts = line.split()[:4]
            if (point == "/sys/fs/cgroup" or point.startswith("/sys/fs/cgroup/")) and \
                    fstype in ("cgroup", "cgroup2", "tmpfs"):
                cmds += (f"mkdir -p {point} && mount -t {fstype} -o {opts} {dev} {point} "
                         "2>/dev/null; ")
    return cmds


class HostCluster:
    """munged, slurmctld on host 0 and a slurmd on every host of `h`."""

    def __init__(self, h):
        self.h = h
        self.root = os.path.join(h.scratch, "slurm")
        self.conf = os.path.join(self.root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.procs = []

    def start(self):
        h, r = self.h, self.root
        os.makedirs(os.path.join(r, "state"), exist_ok=True)
        munged, sock = start_munged(os.path.join(r, "munge"))
        self.procs.append(munged)
        # Each host has its own port space: the default ports serve all.
        conf = slurm_conf(
            "pipechosts", f"{h.names[0]}({h.addrs[0]})", sock,
            f"StateSaveLocation={r}/state\nSlurmctldPidFile={r}/slurmctld.pid\n"
            f"SlurmctldLogFile={r}/slurmctld.log\nSlurmdSpoolDir=/tmp/slurmd\n"
            "SlurmdPidFile=/tmp/slurmd.pid\nSlurmdLogFile=/tmp/slurmd.log\n",
            "".join(f"NodeName={h.names[i]} NodeAddr={h.addrs[i]} CPUs=8 State=UNKNOWN\n"
                    for i in range(h.n))
            + f"PartitionName=test Nodes={','.join(h.names)} Default=YES MaxTime=INFINITE "
            "State=UP\n")
        with open(self.conf, "w") as f:
            f.write(conf)
        time.sleep(0.5)
        self.procs.append(h.popen_on(0, ["/usr/sbin/slurmctld", "-D", "-i", "-f", self.conf],
                                     env=self.env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL))
        for i in range(h.n):
            os.makedirs(h.outside(i, "/tmp/slurmd"), exist_ok=True)
            # `ip netns exec` mounts the namespace's own /sys, without the
            # machine's cgroup hierarchies that slurmd checks: mount them
            # again in the slurmd's private mount namespace.
            self.procs.append(h.popen_on(i, ["sh", "-c", cgroup_mounts() +
                                             'exec /usr/sbin/slurmd -D -f "$0"', self.conf],
                                         env=self.env, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL))
        deadline = time.time() + 90
        states = ""
        while time.time() < deadline:
            p = h.run_on(0, ["/usr/bin/sinfo", "-h", "-N", "-o", "%N %t"], env=self.env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            states = p.stdout.strip()
            lines = [l.split() for l in states.splitlines() if len(l.split()) == 2]
            if (p.returncode == 0 and len(lines) == h.n
                    and all(s in ("idle", "mix", "alloc") for _, s in lines)):
                return ""
            time.sleep(1)
        logs = f"sinfo: {states!r}"
        for name, path in [("slurmctld", os.path.join(r, "slurmctld.log"))] + [
                (f"slurmd {i}", h.outside(i, "/tmp/slurmd.log")) for i in range(h.n)]:
            if os.path.exists(path):
                logs += f"\n--- {name}\n" + open(path).read()[-600:]
        return "the SLURM cluster did not come up within 90 s; " + logs

    def stop(self):
        stop_processes(self.procs, lambda p, sig: p.send_signal(sig))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipec", required=True)
    ap.add_argument("--workdir", default=f"/var/tmp/pipec-slurm-hosts-{os.getpid()}",
                    help="outside /tmp (every emulated host has its own /tmp)")
    args = ap.parse_args()
    missing = [b for b in BINARIES if not os.access(b, os.X_OK)]
    ok, why = netns_hosts.available()
    if missing or not ok:
        why = f"missing {', '.join(missing)}" if missing else why
        print(f"skipped: no SLURM cluster of emulated hosts here ({why})")
        print("0 passed, 0 failed")
        return 0
    netns_hosts.cleanup_stale("pcsl")
    work, pipec = netns_hosts.shared_workdir(args.workdir, "pipec-slurm-hosts", args.pipec)
    try:
        return run_checks(pipec, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_checks(pipec, work):
    checks = Checks()
    report = checks.report
    subprocess.run(["/usr/bin/python3", os.path.join(REPO, "examples/mlp/make_mlp.py"),
                    "--data-steps", "4", "-o", os.path.join(work, "mlp.onnx")],
                   check=True, stdout=subprocess.DEVNULL)
    build = os.path.join(work, "out")
    subprocess.run([pipec, "compile", os.path.join(work, "mlp.onnx"), "--stages", str(HOSTS),
                    "--microbatches", "4", "-o", build, "--quiet"], check=True)
    # The one-host reference (OPENBLAS_NUM_THREADS=1 on both: sgemm's sums
    # depend on its thread count).
    ref = os.path.join(work, "reference")
    shutil.copytree(build, ref)
    env1 = dict(os.environ, OPENBLAS_NUM_THREADS="1", **netns_hosts.MPI_ENV)
    steps = 3
    data = ["--inputs", os.path.join(work, "x.npy"), "--labels", os.path.join(work, "y.npy")]
    rc = subprocess.run([pipec, "train", ref, "--steps", str(steps), "--quiet"] + data,
                        env=env1).returncode
    if rc != 0:
        report(False, "one-host reference run", f"exit {rc}")
        return checks.summary()
    want = losses(os.path.join(ref, "metrics.jsonl"))

    with netns_hosts.Hosts(n=HOSTS, prefix="pcsl", octet=15) as h:
        cluster = HostCluster(h)
        try:
            error = cluster.start()
            report(not error, f"SLURM cluster of {h.n} hosts up",
                   error or f"slurmctld on {h.names[0]}, slurmd on {', '.join(h.names)}")
            if error:
                return checks.summary()
            run = h.run_path + "/out"
            # OpenMPI between the hosts over their TCP subnet (SLURM's PMIx
            # wires the ranks up; no mpirun).
            env = dict(cluster.env, OPENBLAS_NUM_THREADS="1", OMPI_MCA_btl="tcp,self",
                       OMPI_MCA_btl_tcp_if_include=h.subnet,
                       OMPI_MCA_oob_tcp_if_include=h.subnet, **netns_hosts.MPI_ENV)

            def fresh_copies():
                h.install(run, build, [os.path.join(work, f) for f in ("x.npy", "y.npy")])

            def train(*extra, timeout=300):
                return h.run_on(0, [pipec, "train", run, "--quiet", "--launcher", "srun",
                                    "--hosts", ",".join(h.names),
                                    "--inputs", run + "/x.npy", "--labels", run + "/y.npy"]
                                + list(extra), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, timeout=timeout)

            fresh_copies()
            p = train("--steps", str(steps))
            problems = [] if p.returncode == 0 else [f"exit {p.returncode}: {p.stdout[-800:]}"]
            if not problems:
                got = losses(h.outside(0, run + "/metrics.jsonl"))
                if got != want:
                    problems.append(f"losses {got} != one-host {want}")
                for stage in range(HOSTS):
                    name = f"checkpoints/step-{steps:06d}/stage{stage}.safetensors"
                    for i in range(h.n):
                        here = h.outside(i, f"{run}/{name}")
                        if i == stage and not (os.path.exists(here)
                                               and same_file(here, os.path.join(ref, name))):
                            problems.append(f"stage {stage}'s checkpoint on host {i} is missing "
                                            "or differs from the one-host run's")
                        if i != stage and os.path.exists(here):
                            problems.append(f"stage {stage}'s checkpoint also on host {i}")
            report(not problems, "srun across 3 hosts == mpirun on one",
                   "; ".join(problems[:4]) or f"losses {want}, stage i's checkpoint on host i, "
                   "bit-identical")

            # A stage process killed on host 2 mid-run.
            fresh_copies()
            log_path = os.path.join(work, "kill.log")
            with open(log_path, "w") as log:
                job = h.popen_on(0, [pipec, "train", run, "--quiet", "--launcher", "srun",
                                     "--hosts", ",".join(h.names), "--steps", "1000000",
                                     "--inputs", run + "/x.npy", "--labels", run + "/y.npy"],
                                 env=env, stdout=log, stderr=subprocess.STDOUT)
                wait_for_lines(job, h.outside(0, run + "/metrics.jsonl"), 20)
                victim = h.run_on(2, ["pgrep", "-x", f"stage{HOSTS - 1}"],
                                  stdout=subprocess.PIPE, text=True).stdout.split()
                if job.poll() is not None or not victim:
                    job.kill()
                    job.wait()
                    report(False, "stage killed on another host under srun",
                           f"the job ended or stage {HOSTS - 1} was not found on host 2: "
                           + open(log_path).read()[-400:])
                    return checks.summary()
                t0 = time.time()
                for pid in victim:
                    os.kill(int(pid), signal.SIGKILL)
                try:
                    rc = job.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    job.kill()
                    job.wait()
                    rc = None
            took = time.time() - t0
            errors = [l for l in open(log_path).read().splitlines() if "error" in l]
            want_line = f"rank {HOSTS - 1} (stage {HOSTS - 1})"
            ok = (rc == 137 and len(errors) == 1 and want_line in errors[0]
                  and "died without a report" in errors[0])
            report(ok, "stage killed on another host under srun",
                   f"exit {rc} after {took:.1f} s; " + " | ".join(errors)[:400])
            if not ok:
                print(open(log_path).read()[-1500:])
        finally:
            cluster.stop()
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())
