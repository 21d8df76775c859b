#!/usr/bin/python3
"""`pipec train --launcher srun` against a real SLURM.

    /usr/bin/python3 test/e2e/slurm.py --pipec build/bin/pipec --workdir DIR

Starts a private one-node SLURM cluster for the test alone (munged,
slurmctld and slurmd from Debian's slurm-wlm 22.05, each with its own
configuration, socket, state folder and ports under DIR; nothing system-wide
is touched) and stops it afterwards, also on failure. Then:

1. the example MLP compiled for 2 and 3 stages trains through `srun
   --multi-prog` with OpenMPI's PMIx, with losses and checkpoints equal to
   the same run under mpirun;
2. killing one stage process mid-run ends the job with one pipec line
   naming that rank, its stage and step, exit status 137, and without
   blaming the rank srun cancelled afterwards.

Skips (printing why, and `0 passed, 0 failed`) where the SLURM or munge
binaries are missing or the test does not run as root (the daemons need
it). Prints one line per check and `N passed, M failed`.
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from e2e_common import Checks, losses_of  # noqa: E402
from safetensors_io import latest_checkpoint, load_checkpoint  # noqa: E402

BINARIES = ["/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/srun",
            "/usr/bin/sinfo"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_munged(folder):
    """munged with a fresh key, its socket and files in `folder` (created);
    returns (its process, the socket's path)."""
    os.makedirs(folder, exist_ok=True)
    key = os.path.join(folder, "munge.key")
    with open(key, "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(key, 0o400)
    sock = os.path.join(folder, "munge.sock")
    proc = subprocess.Popen(
        ["/usr/sbin/munged", "--foreground", "--force", "--key-file", key, "--socket", sock,
         "--pid-file", os.path.join(folder, "munged.pid"),
         "--log-file", os.path.join(folder, "munged.log"),
         "--seed-file", os.path.join(folder, "munged.seed")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return proc, sock


def slurm_conf(name, ctld_host, sock, files, nodes):
    """A slurm.conf for a private test cluster: root daemons, munge at
    `sock`, no cgroups needed (linuxproc, task/none), PMIx for OpenMPI;
    `files` (ports, state, pid, log and spool lines) and `nodes` (node and
    partition lines) complete it."""
    return f"""ClusterName={name}
SlurmctldHost={ctld_host}
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmUser=root
SlurmdUser=root
{files}SchedulerType=sched/builtin
SelectType=select/linear
MpiDefault=pmix
ReturnToService=2
SlurmdParameters=config_overrides
{nodes}"""


def stop_processes(procs, kill):
    """SIGTERM to the daemons in reverse start order (`kill(proc, signal)`),
    then SIGKILL to any still running 10 s later."""
    for p in reversed(procs):
        try:
            kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            kill(p, signal.SIGKILL)


class Cluster:
    """munged + slurmctld + slurmd, private to `root`."""

    def __init__(self, root):
        self.root = root
        self.procs = []
        self.env = dict(os.environ, SLURM_CONF=os.path.join(root, "slurm.conf"))
        # The node claims at least 8 CPUs (config_overrides) so that a job
        # of more stage processes than this machine's cores is not queued.

    def start(self):
        r = self.root
        for sub in ("state", "spool", "log"):
            os.makedirs(os.path.join(r, sub), exist_ok=True)
        munged, sock = start_munged(os.path.join(r, "munge"))
        self.procs.append(munged)
        host = socket.gethostname()
        conf = slurm_conf(
            "pipectest", host, sock,
            f"SlurmctldPort={free_port()}\nSlurmdPort={free_port()}\n"
            f"StateSaveLocation={r}/state\nSlurmdSpoolDir={r}/spool\n"
            f"SlurmctldPidFile={r}/slurmctld.pid\nSlurmdPidFile={r}/slurmd.pid\n"
            f"SlurmctldLogFile={r}/log/slurmctld.log\nSlurmdLogFile={r}/log/slurmd.log\n",
            f"NodeName={host} CPUs={max(8, os.cpu_count())} State=UNKNOWN\n"
            f"PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=FORCE:8\n")
        with open(os.path.join(r, "slurm.conf"), "w") as f:
            f.write(conf)
        time.sleep(0.5)
        self.spawn(["/usr/sbin/slurmctld", "-D", "-i", "-f", os.path.join(r, "slurm.conf")])
        self.spawn(["/usr/sbin/slurmd", "-D", "-f", os.path.join(r, "slurm.conf")])
        deadline = time.time() + 60
        while time.time() < deadline:
            p = subprocess.run(["/usr/bin/sinfo", "-h", "-o", "%t"], env=self.env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if p.returncode == 0 and p.stdout.strip() in ("idle", "mix", "alloc"):
                return ""
            time.sleep(1)
        logs = ""
        for name in ("log/slurmctld.log", "log/slurmd.log", "munge/munged.log"):
            path = os.path.join(r, name)
            if os.path.exists(path):
                logs += f"\n--- {name}\n" + open(path).read()[-800:]
        return "the private SLURM did not come up within 60 s" + logs

    def spawn(self, cmd):
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, start_new_session=True))

    def stop(self):
        stop_processes(self.procs, lambda p, sig: os.killpg(p.pid, sig))


def run(cmd, env, timeout=180):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipec", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    missing = [b for b in BINARIES if not os.access(b, os.X_OK)]
    if missing or os.geteuid() != 0:
        why = f"missing {', '.join(missing)}" if missing else "not root"
        print(f"skipped: no SLURM here ({why}; scripts/install-deps.sh installs it)")
        print("0 passed, 0 failed")
        return 0
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    checks = Checks()
    report = checks.report

    cluster = Cluster(os.path.join(args.workdir, "cluster"))
    try:
        error = cluster.start()
        report(not error, "private SLURM up", error or "sinfo: idle")
        if error:
            return 1
        env = cluster.env
        model = os.path.join(args.workdir, "mlp.onnx")
        rc, out = run(["/usr/bin/python3", os.path.join(REPO, "examples/mlp/make_mlp.py"), "-o", model,
                       "--batch", "32"], env)
        for stages in (2, 3):
            o = os.path.join(args.workdir, f"s{stages}")
            rc, out = run([args.pipec, "compile", model, "--stages", str(stages), "--microbatches", "4",
                           "-o", o, "--quiet"], env)
            if rc != 0:
                report(False, f"{stages} stages compile", out[-400:])
                continue
            results = {}
            for launcher in ("mpirun", "srun"):
                shutil.rmtree(os.path.join(o, "checkpoints"), ignore_errors=True)
                rc, out = run([args.pipec, "train", o, "--steps", "4", "--lr", "0.05", "--quiet",
                               "--launcher", launcher], env)
                if rc != 0:
                    report(False, f"{stages} stages {launcher}", out[-600:])
                    break
                results[launcher] = (losses_of(o), load_checkpoint(latest_checkpoint(
                    os.path.join(o, "checkpoints"))))
            if len(results) == 2:
                a, b = results["mpirun"], results["srun"]
                same = a[0] == b[0] and all((a[1][k] == b[1][k]).all() for k in a[1])
                report(same, f"{stages} stages srun == mpirun",
                       f"losses {b[0]} vs {a[0]}, {len(a[1])} tensors "
                       f"{'identical' if same else 'DIFFER'}")
        # A killed stage process.
        o = os.path.join(args.workdir, "s2")
        log = os.path.join(args.workdir, "kill.log")
        with open(log, "w") as f:
            job = subprocess.Popen([args.pipec, "train", o, "--steps", "1000000", "--lr", "0.05",
                                    "--launcher", "srun"], env=env, stdout=f, stderr=subprocess.STDOUT)
        victim = None
        deadline = time.time() + 60
        while time.time() < deadline and victim is None:
            time.sleep(0.5)
            p = subprocess.run(["pgrep", "-f", os.path.join(o, "stage1")], stdout=subprocess.PIPE, text=True)
            pids = [int(x) for x in p.stdout.split()]
            if pids and os.path.exists(os.path.join(o, "metrics.jsonl")):
                victim = pids[0]
        if victim is None:
            job.kill()
            report(False, "killed stage under srun", "stage 1 never started")
        else:
            time.sleep(1)
            t0 = time.time()
            os.kill(victim, signal.SIGKILL)
            try:
                rc = job.wait(timeout=60)
            except subprocess.TimeoutExpired:
                job.kill()
                rc = None
            took = time.time() - t0
            text = open(log).read()
            errors = [l for l in text.splitlines() if "error" in l]
            ok = (rc == 137 and any("rank 1 (stage 1) died without a report during step" in l
                                    for l in errors)
                  and not any("rank 0" in l for l in errors)
                  and not any(l.startswith(("srun:", "slurmstepd")) for l in errors))
            report(ok, "killed stage under srun",
                   f"exit {rc} after {took:.1f} s; " + " | ".join(errors)[:300])
    finally:
        cluster.stop()
    return checks.summary()


if __name__ == "__main__":
    sys.exit(main())
