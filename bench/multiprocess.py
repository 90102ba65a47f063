#!/usr/bin/env python3
"""hoist against PyTorch DCP's async_save in the same torchrun job, on 1, 2
and 4 processes.

    .venv/bin/python bench/multiprocess.py [--gib 1] [--repeats 3] [--json]

The same model state (16 float32 tensors, --gib GiB in all) is 14 DTensors
sharded Shard(0) and 2 replicated over every rank of a 1-D CPU mesh. Each job runs both systems --repeats times, each save to a fresh
step (removed afterwards): hoist (CheckpointManager.save, returns once the
arrays are copied; .wait() until committed) and DCP
(torch.distributed.checkpoint.async_save, returns once staged; .result()
until written). Reported per job: the slowest rank's blocked time (what
training waits) and save time (until the step is durable on every rank),
medians of the repeats, and the spread of bytes written per rank (hoist's
balance). Both fsync their files.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(args):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import hoist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    rows = (args.gib << 30) // 16 // 4 // 4096
    # 14 tensors sharded, 2 replicated (as norms and embeddings often
    # are): each replicated one is written once, split among the ranks.
    state = {f"layer{i}": distribute_tensor(
        torch.full((rows, 4096), float(i)), mesh,
        [Replicate() if i < 2 else Shard(0)]) for i in range(16)}
    root = os.path.join(args.dir, "hoist")
    mgr = hoist.CheckpointManager(root, pool_bytes=(args.gib << 30) // world
                                  + (64 << 20), keep=1)

    def slowest(seconds):
        out = [None] * world
        dist.all_gather_object(out, seconds)
        return max(out)

    results = {"hoist": [], "dcp": []}
    written = []
    for repeat in range(args.repeats):
        dist.barrier()
        start = time.perf_counter()
        handle = mgr.save(repeat, {"model": state})
        blocked = time.perf_counter() - start
        info = handle.wait()
        total = time.perf_counter() - start
        written.append(info["bytes"])
        results["hoist"].append((slowest(blocked), slowest(total)))

        path = os.path.join(args.dir, f"dcp_{repeat}")
        dist.barrier()
        start = time.perf_counter()
        future = dcp.async_save({"model": state}, checkpoint_id=path)
        blocked = time.perf_counter() - start
        future.result()
        total = time.perf_counter() - start
        results["dcp"].append((slowest(blocked), slowest(total)))
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path)
    mgr.close()
    per_rank = [None] * world
    dist.all_gather_object(per_rank, statistics.median(written))
    if rank == 0:
        summary = {"processes": world, "bytes": args.gib << 30,
                   "bytes_per_rank": per_rank}
        for system, runs in results.items():
            summary[system] = {
                "blocked_s": statistics.median(b for b, _ in runs),
                "save_s": statistics.median(t for _, t in runs)}
        with open(args.out, "w") as f:
            json.dump(summary, f)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--processes", default="1,2,4")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", action="store_true",
                        help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    rows = []
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    for n in (int(p) for p in args.processes.split(",")):
        scratch = tempfile.mkdtemp(prefix="hoist-mp-", dir=os.path.join(
            HERE, os.pardir))
        out = os.path.join(scratch, "result.json")
        try:
            subprocess.run(
                [torchrun, "--nproc-per-node", str(n), __file__, "--worker",
                 "--gib", str(args.gib), "--repeats", str(args.repeats),
                 "--dir", scratch, "--out", out],
                check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            with open(out) as f:
                rows.append(json.load(f))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{args.gib} GiB of DTensors (14 Shard(0), 2 Replicate), torchrun on this "
          f"machine ({os.cpu_count()} cores), medians of {args.repeats}; "
          "times of the slowest rank")
    print(f"{'procs':>5} {'hoist blocked':>13} {'DCP blocked':>11} "
          f"{'ratio':>6} {'hoist save':>10} {'DCP save':>8} {'ratio':>6} "
          f"{'GiB/s hoist':>11} {'rank bytes spread':>17}")
    for r in rows:
        h, d = r["hoist"], r["dcp"]
        spread = (max(r["bytes_per_rank"]) / min(r["bytes_per_rank"]) - 1)
        print(f"{r['processes']:>5} {h['blocked_s']:>12.3f}s "
              f"{d['blocked_s']:>10.3f}s {d['blocked_s'] / h['blocked_s']:>5.1f}x"
              f" {h['save_s']:>9.3f}s {d['save_s']:>7.3f}s "
              f"{d['save_s'] / h['save_s']:>5.2f}x "
              f"{r['bytes'] / h['save_s'] / (1 << 30):>11.2f} "
              f"{spread * 100:>16.1f}%")


if __name__ == "__main__":
    main()
