#!/usr/bin/python3
"""What letting messages progress between ops is worth (CPU, MPI).

    /usr/bin/python3 bench/message_progress.py [--pipec build/bin/pipec]
        [--steps 8] [--repeats 2]

An MPI library moves a message only inside MPI calls. OpenMPI's shared
memory transport sends a large message either in one copy by the receiver
(the single-copy mechanism, CMA; Linux's process_vm_readv, which many
containers forbid) or by copy-in/copy-out through a shared queue, which
needs the sender to call into MPI again and again; a stage busy with its
next forward makes none. The runtime therefore lets messages in flight
progress before every op and while it waits for its device
(Communicator::progress; PIPEC_MESSAGE_PROGRESS=0 turns that off).

The GPT example (4 layers, d=256, sequence 128, batch 16: 512 KiB
activation messages) on 2 stages, 4 microbatches, 1f1b-flush, trained
`--steps` steps with each of the four combinations of single copy (cma,
none) and progress (on, off), `--repeats` times; prints the runtime's
mean samples/s (first step excluded), the ratio to "cma, progress on", and
checks that every run ends with the same loss.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipec", default=os.path.join(ROOT, "build", "bin", "pipec"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="pipec-progress-")
    onnx = os.path.join(work, "gpt.onnx")
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "examples/gpt/make_gpt.py"), "-o", onnx,
                    "--batch", "16", "--seq", "128", "--layers", "4", "--dim", "256", "--heads", "4",
                    "--vocab", "256", "--data-steps", "2"], check=True, stdout=subprocess.DEVNULL)
    out = os.path.join(work, "s2")
    subprocess.run([args.pipec, "compile", onnx, "--stages", "2", "--microbatches", "4", "-o", out,
                    "--quiet"], check=True)
    configs = [("cma", "1"), ("cma", "0"), ("none", "1"), ("none", "0")]
    rates = {c: [] for c in configs}
    losses = set()
    for _ in range(args.repeats):
        for single, progress in configs:
            env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism=single,
                       PIPEC_MESSAGE_PROGRESS=progress, OMPI_ALLOW_RUN_AS_ROOT="1",
                       OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            p = subprocess.run([args.pipec, "train", out, "--steps", str(args.steps), "--lr", "0.01",
                                "--inputs", os.path.join(work, "x.npy"), "--labels", os.path.join(work, "y.npy")],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            m = re.search(r"final loss ([0-9.]+)\s+([0-9.]+) samples/s", p.stdout)
            if p.returncode != 0 or not m:
                print(p.stdout[-1500:])
                return 1
            losses.add(m.group(1))
            rates[(single, progress)].append(float(m.group(2)))
    base = max(rates[("cma", "1")])
    print(f"GPT 4x256, sequence 128, batch 16 in 4 microbatches, 2 stages (512 KiB messages), "
          f"{args.steps} steps, best of {args.repeats}")
    print(f"{'single copy':12s} {'progress':9s} {'samples/s':>10s} {'ratio':>6s}")
    for single, progress in configs:
        best = max(rates[(single, progress)])
        print(f"{single:12s} {'on' if progress == '1' else 'off':9s} {best:10.1f} {best / base:6.2f}")
    print("final losses", "identical" if len(losses) == 1 else f"DIFFER: {sorted(losses)}")
    return 0 if len(losses) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
