"""One rank of a job spread over testing/netns_hosts.py's simulated hosts,
started by the test (or bench/hosts.py) with RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT and the object store's AWS_* in its environment.

    hosts_worker.py ROOT OUT MIB MODE

ROOT: the checkpoint root (s3://...); OUT: a directory for this rank's
rank_N.json; MIB: the state's size in MiB (8 float32 arrays sharded
Shard(0) over every rank). HOIST_HOSTS_COORDINATOR_TIMEOUT_S: the
coordinator's timeout (default 30 s).
MODE:
  share    saves step 1, then restores it whole on every rank (each rank
           needs every byte) twice: with shared reads (each byte read from
           the store once per job and passed between hosts) and each rank
           reading for itself; records bytes read, seconds, and checks
           every byte.
  cut      saves step 1, writes a byte to OUT/saving (the harness's FIFO)
           once step 2's save has begun
           (the test then cuts a host's link), and records how step 2
           went on this rank and how long its wait() took.
  after    a new job on the same root: saves step 3 and restores steps 1
           and 3, checking every byte.
  tiers    saves steps 1 to 3 with a local tier in LOCAL/{rank} (set by
           the caller in HOIST_HOSTS_LOCAL; 2 replicas, step 2 durable),
           recording which hosts hold a copy of this rank's part.
  tier_restore / durable_restore
           restores step 3 from the local tier (whatever parts the caller
           removed are rebuilt from their copies on other hosts), or step 2
           from the store alone; records the seconds and the note.
"""
import json
import os
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

import hoist

ARRAYS = 8


def state(mesh, rank, ranks, mib, step):
    """ARRAYS arrays of mib/ARRAYS MiB each, sharded over every rank."""
    rows = max(1, (mib << 20) // ARRAYS // 4 // ranks)
    return {f"w{a}": DTensor.from_local(
        torch.arange(rows, dtype=torch.float32) + rank * rows
        + a * (1 << 20) + step * (1 << 22), mesh, [Shard(0)],
        run_check=False) for a in range(ARRAYS)}


def whole(saved_like, mib, ranks, step):
    """What restoring the saved step whole must give, array by array."""
    rows = max(1, (mib << 20) // ARRAYS // 4 // ranks)
    return {name: np.arange(rows * ranks, dtype=np.float32)
            + int(name[1:]) * (1 << 20) + step * (1 << 22)
            for name in saved_like}


def main():
    root, out, mib, mode = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                            sys.argv[4])
    dist.init_process_group("gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (ranks,))
    record = {"rank": rank, "host": socket.gethostname()}
    timeout_s = float(os.environ.get("HOIST_HOSTS_COORDINATOR_TIMEOUT_S", 30))
    options = dict(pool_bytes=64 << 20, coordinator_timeout_s=timeout_s,
                   storage_options={"connect_timeout_s": 2,
                                    "request_timeout_s": 10,
                                    "max_attempts": 2})
    if mode == "share":
        with hoist.CheckpointManager(root, **options) as mgr:
            mgr.save(1, state(mesh, rank, ranks, mib, 1)).wait()
        expected = whole([f"w{a}" for a in range(ARRAYS)], mib, ranks, 1)
        for shared in (True, False):
            with hoist.CheckpointManager(root, shared_reads=shared,
                                         **options) as mgr:
                dist.barrier()
                start = time.perf_counter()
                got = mgr.restore(1)
                dist.barrier()
                seconds = time.perf_counter() - start
                exact = all(np.array_equal(np.asarray(got[k]), v)
                            for k, v in expected.items())
                key = "shared" if shared else "alone"
                record[key] = {"seconds": seconds, "exact": exact,
                               "bytes_read": mgr.last_restore["bytes_read"]}
    elif mode == "cut":
        with hoist.CheckpointManager(root, **options) as mgr:
            mgr.save(1, state(mesh, rank, ranks, mib, 1)).wait()
            dist.barrier()
            handle = mgr.save(2, state(mesh, rank, ranks, mib, 2))
            if rank == 0:  # the harness's FIFO: it cuts the link now
                with open(os.path.join(out, "saving"), "w") as saving:
                    saving.write("1")
            start = time.monotonic()
            try:
                handle.wait()
                record["step2"] = "committed"
            except Exception as error:  # noqa: BLE001 (reported, not lost)
                record["step2"] = f"{type(error).__name__}: {error}"
            record["waited_s"] = time.monotonic() - start
            try:
                mgr.close()
            except Exception:  # noqa: BLE001 (the same error again)
                pass
        write(out, rank, record)
        os._exit(0)  # the job's collectives are broken: no clean teardown
    elif mode in ("tiers", "tier_restore", "durable_restore"):
        tiered = dict(options, local_root=os.path.join(
            os.environ["HOIST_HOSTS_LOCAL"], "{rank}"), persist_every=2,
            local_every=1, replicas=2)
        if mode == "tiers":
            with hoist.CheckpointManager(root, **tiered) as mgr:
                for step in (1, 2, 3):
                    mgr.save(step, state(mesh, rank, ranks, mib, step)).wait()
        else:
            step = 3 if mode == "tier_restore" else 2
            like = state(mesh, rank, ranks, mib, 0)
            with hoist.CheckpointManager(
                    root, **(tiered if step == 3 else options)) as mgr:
                dist.barrier()
                start = time.perf_counter()
                got = mgr.restore(step, like=like)
                dist.barrier()
                want = state(mesh, rank, ranks, mib, step)
                record.update(
                    seconds=time.perf_counter() - start,
                    tier=mgr.last_restore["tier"],
                    note=mgr.last_restore.get("note", ""),
                    bytes_received=mgr.last_restore["bytes_received"],
                    exact=all(torch.equal(got[k].to_local(), v.to_local())
                              for k, v in want.items()))
    elif mode == "after":
        with hoist.CheckpointManager(root, **options) as mgr:
            mgr.save(3, state(mesh, rank, ranks, mib, 3)).wait()
            record["steps"] = mgr.steps
            names = [f"w{a}" for a in range(ARRAYS)]
            record["exact"] = all(
                np.array_equal(np.asarray(mgr.restore(step)[k]), v)
                for step in (1, 3)
                for k, v in whole(names, mib, ranks, step).items())
    write(out, rank, record)
    dist.destroy_process_group()


def write(out, rank, record):
    with open(os.path.join(out, f"rank_{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()
