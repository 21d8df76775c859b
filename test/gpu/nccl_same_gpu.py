#!/usr/bin/python3
"""What NCCL does when two ranks of one communicator share a GPU (issue 12
asks; the answer decides which transport ranks that share a GPU get).

Run on the GPU machine (its PyTorch carries NCCL): two processes, both on
cuda:0, form a communicator through torch.distributed (backend nccl, a
file rendezvous) and try an all-reduce and a send/recv. Prints the NCCL
version and, per rank, what happened; a hang is reported after 60 s. The
findings are written down in runtime/README.md ("Ranks sharing a GPU").
"""
import os
import sys
import tempfile
import traceback


def worker(rank, world, init, results):
    import torch
    import torch.distributed as dist
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    torch.cuda.set_device(0)
    try:
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world,
                                device_id=torch.device("cuda", 0))
        t = torch.full((4,), float(rank + 1), device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        out = f"all_reduce -> {t.tolist()}"
        if rank == 0:
            dist.send(torch.arange(3.0, device="cuda"), 1)
        else:
            r = torch.zeros(3, device="cuda")
            dist.recv(r, 0)
            torch.cuda.synchronize()
            out += f"; recv -> {r.tolist()}"
        results[rank] = "ok: " + out
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001
        results[rank] = f"error: {type(e).__name__}: {str(e).splitlines()[0:6]}"
        traceback.print_exc(limit=2)


def main():
    import torch
    import torch.multiprocessing as mp
    print("torch", torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())), flush=True)
    world = 2
    init = "file://" + os.path.join(tempfile.mkdtemp(), "rendezvous")
    manager = mp.Manager()
    results = manager.dict()
    procs = [mp.get_context("spawn").Process(target=worker, args=(r, world, init, results)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    hung = [i for i, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    for r in range(world):
        print(f"rank {r}: {results.get(r, 'hung (no result after 60 s)' if r in hung else 'died')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
