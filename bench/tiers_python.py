#!/usr/bin/env python3
"""The local tier from a Python job: time to resume after losing one
rank's local storage, against a durable-only restore, under torchrun.

    .venv/bin/python bench/tiers_python.py [--np 4] [--size 256MiB]
        [--local-dir /dev/shm] [--repeats 3] [--layout zero|ddp] [--json]

A torchrun job of NP ranks (gloo, CPU) on a 2 x (NP/2) data x model mesh
holds a training state of DTensors: weights replicated over "data" and
sharded over "model" (each box held by two ranks, as in data-parallel
training), Adam moments sharded over both (--layout zero, the default: an
optimizer state sharded over the data-parallel ranks too) or as the
weights (--layout ddp: every box has a data-parallel replica), and each
rank's RNG states (hoist.PerRank). It saves steps 1..6: every step to the local tier
(LOCAL_DIR/{rank}, replicas=2), every 4th to the durable root (on this
machine's disk). Then, each in a new torchrun job (a restart):
  - local: restore the newest step (6) with every local root intact;
  - lost: rank 1's local root removed first; its part comes from its replica;
  - durable: a manager without a local tier restores the durable step 4,
    each byte read once per job (shared reads, the default: a box two
    ranks need is read by one and sent to the other over gloo);
  - separate: the same with shared_reads=False: each rank reads all it
    needs (the baseline for shared reads).
Each restore's time is the job's, barrier to barrier (the slowest rank).
Also per local save: bytes written locally, bytes sent to replica holders,
and the durable save's bytes (the state once); and per restore, the bytes
read from storage summed over the ranks, over the state's bytes (the
unique bytes the job needs).
Medians over --repeats runs (each run a new root). Writes
bench-results/tiers_python.json (tiers_python_ddp.json with --layout ddp).
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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from benchlib import free_port, parse_bytes  # noqa: E402


def state(size, step, rank, layout="zero"):
    import numpy as np
    import torch
    import hoist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    world = int(os.environ["WORLD_SIZE"])
    mesh = init_device_mesh("cpu", (2, world // 2),
                            mesh_dim_names=("data", "model"))
    rows = max(world, size // 3 // (1024 * 4) // world * world)
    g = torch.Generator().manual_seed(step)
    out = {"w": distribute_tensor(torch.randn(rows, 1024, generator=g), mesh,
                                  [Replicate(), Shard(1)])}
    for moment in ("mu", "nu"):
        out[moment] = distribute_tensor(
            torch.randn(rows, 1024, generator=g), mesh,
            [Shard(0), Shard(1)] if layout == "zero" else [Replicate(),
                                                           Shard(1)])
    torch.manual_seed(100 * rank + step)
    np.random.seed(100 * rank + step)
    out["rng"] = hoist.PerRank({"torch": torch.get_rng_state(),
                                "numpy": np.random.get_state()})
    return out


def worker(args):
    import torch.distributed as dist
    import hoist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tiers = dict(persist_every=4, local_root=os.path.join(args.local, "{rank}"),
                 local_every=1, replicas=2)
    if args.phase in ("durable", "separate"):
        tiers = {"shared_reads": args.phase == "durable"}
    out = {}
    with hoist.CheckpointManager(args.root, pool_bytes=args.size + (
            64 << 20), **tiers) as mgr:
        if args.phase == "save":
            figures = []
            for step in range(1, 7):
                info = mgr.save(step, state(args.size, step, rank,
                                            args.layout)).wait()
                figures.append(info)
            out = {"local_bytes": [f["bytes"] for f in figures
                                   if f["tier"] == "local"][-1],
                   "replicated_bytes": figures[-1]["replicated_bytes"],
                   "durable_bytes": figures[3]["bytes"]}
        else:
            template = state(args.size, 0, rank, args.layout)
            dist.barrier()
            start = time.perf_counter()
            restored = mgr.restore(like=template)
            dist.barrier()
            out = {"seconds": time.perf_counter() - start,
                   "bytes_read": mgr.last_restore["bytes_read"],
                   "bytes_received": mgr.last_restore["bytes_received"],
                   "target_bytes": mgr.last_restore["target_bytes"],
                   "tier": mgr.last_restore["tier"],
                   "step": mgr.last_restore["step"]}
            assert restored["rng"] is not None
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, out)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(every, f)
    dist.destroy_process_group()


def job(args, phase, root, local, out):
    command = [os.path.join(os.path.dirname(sys.executable), "torchrun"),
               "--nproc-per-node", str(args.np), "--master-port",
               str(free_port()), os.path.abspath(__file__), "worker",
               phase, root, local, out, str(args.size), args.layout]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, capture_output=True, text=True, env=env,
                          timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{phase} failed:\n{done.stderr[-4000:]}")
    with open(out) as f:
        return json.load(f)


def one_run(args):
    scratch = tempfile.mkdtemp(prefix="hoist-tiers-", dir=REPO)
    local = tempfile.mkdtemp(prefix="hoist-tiers-", dir=args.local_dir)
    try:
        root, out = os.path.join(scratch, "root"), os.path.join(scratch, "o")
        saved = job(args, "save", root, local, out)
        result = {"local_bytes": sum(r["local_bytes"] for r in saved),
                  "replicated_bytes": sum(r["replicated_bytes"]
                                          for r in saved),
                  "durable_bytes": sum(r["durable_bytes"] for r in saved)}
        for name in ("local", "lost", "durable", "separate"):
            if name == "lost":
                shutil.rmtree(os.path.join(local, "1"))
            ranks = job(args, name if name in ("durable", "separate")
                        else "restore", root, local, out)
            result[name] = {
                "seconds": max(r["seconds"] for r in ranks),
                "tier": ranks[0]["tier"], "step": ranks[0]["step"],
                "bytes_read": sum(r["bytes_read"] for r in ranks),
                "bytes_received": sum(r["bytes_received"] for r in ranks),
                "target_bytes": sum(r["target_bytes"] for r in ranks)}
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(local, ignore_errors=True)


def main():
    if sys.argv[1:2] == ["worker"]:  # one rank, under torchrun
        phase, root, local, out, size, layout = sys.argv[2:8]
        worker(argparse.Namespace(phase=phase, root=root, local=local,
                                  out=out, size=int(size), layout=layout))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--size", type=parse_bytes, default=256 << 20)
    parser.add_argument("--local-dir", default="/dev/shm")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layout", choices=("zero", "ddp"), default="zero")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.np < 2 or args.np % 2:
        parser.error("--np must be even (a 2 x NP/2 mesh)")
    runs = [one_run(args) for _ in range(args.repeats)]

    def median(path):
        values = []
        for run in runs:
            value = run
            for key in path:
                value = value[key]
            values.append(value)
        return statistics.median(values)
    report = {"np": args.np, "size": args.size, "local_dir": args.local_dir,
              "repeats": args.repeats, "layout": args.layout, "runs": runs}
    for name in ("local", "lost", "durable", "separate"):
        report[f"restore_{name}_s"] = median([name, "seconds"])
        report[f"restore_{name}_tier"] = runs[-1][name]["tier"]
        # Over the unique bytes the job needs (the state once), not each
        # rank's own need: data-parallel replicas each read their boxes.
        report[f"restore_{name}_read_over_unique"] = median(
            [name, "bytes_read"]) / median(["durable_bytes"])
    report["local_over_durable"] = (report["restore_local_s"] /
                                    report["restore_durable_s"])
    report["lost_over_durable"] = (report["restore_lost_s"] /
                                   report["restore_durable_s"])
    report["shared_over_separate"] = (report["restore_durable_s"] /
                                      report["restore_separate_s"])
    for key in ("local_bytes", "replicated_bytes", "durable_bytes"):
        report[key] = median([key])
    os.makedirs(os.path.join(REPO, "bench-results"), exist_ok=True)
    with open(os.path.join(REPO, "bench-results",
                           "tiers_python.json" if args.layout == "zero" else
                           f"tiers_python_{args.layout}.json"), "w") as f:
        json.dump(report, f, indent=1)
    if args.json:
        print(json.dumps(report, indent=1))
        return
    mib = 1 << 20
    print(f"torchrun {args.np} ranks, {args.size / mib:.0f} MiB state "
          f"(layout {args.layout}), local root in {args.local_dir}, medians "
          f"of {args.repeats}")
    for name in ("local", "lost", "durable", "separate"):
        print(f"  restore {name:8} {report[f'restore_{name}_s']:.3f} s "
              f"(tier {report[f'restore_{name}_tier']}; bytes read over the "
              f"job / unique {report[f'restore_{name}_read_over_unique']:.2f})")
    print(f"  local / durable {report['local_over_durable']:.2f}, lost / "
          f"durable {report['lost_over_durable']:.2f}, durable (shared reads) "
          f"/ separate {report['shared_over_separate']:.2f}")
    print(f"  per local save: {report['local_bytes'] / mib:.0f} MiB written "
          f"locally, {report['replicated_bytes'] / mib:.0f} MiB sent to "
          f"replicas; durable save {report['durable_bytes'] / mib:.0f} MiB")


if __name__ == "__main__":
    main()
