#!/usr/bin/env python3
"""JAX arrays the engine cannot read by address (a TPU's), staged through
PJRT: transfer calls per save, blocked time, time to durable, restore.

    .venv/bin/python bench/xla.py [--size 1GiB] [--saves 3] [--json]

On this machine's CPU backend (8 devices, a 2 x 4 mesh) the PJRT path is
forced (staging="pjrt"), so every shard of a GPT-style state (hoist plan's
arrays, bfloat16) goes to pinned_host in one jax.device_put per save, as a
TPU's would. Reported, per save: the transfer calls (goal: one), save()'s
blocked time and the time until durable; against the batched device_put
of the same shards to pinned_host alone, measured before each save in the
same run (the transfer's real limit on this machine: goal, the median
blocked time at most 1.2x the median of it; the first save, which pins the
pool, is left out of the median); before, the same state took one np.asarray per local shard, a transfer
call each (their count is reported); now only the shards a save writes
(one replica of each box) are transferred. With --pool smaller than the
state the save stages in waves: one transfer call per wave (goal). Then the latest step restored onto the
transposed 4 x 2 mesh and compared bit-exact (goal).

What a CPU cannot show: the speed-up batching gives on a TPU (here a
transfer is a memcpy, and JAX's CPU shards could be read in place).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

BLOCKED_GOAL = 1.2


def local_shards(arrays):
    return [s.data for a in arrays.values() for s in a.addressable_shards]


def saved_shards(arrays):
    """One local shard of each box of each array (its replicas left out):
    the bytes a save writes, which are all the PJRT path transfers."""
    shards = []
    for a in arrays.values():
        seen = set()
        for s in a.addressable_shards:
            box = tuple((i.start, i.stop) for i in s.index)
            if box not in seen:
                seen.add(box)
                shards.append(s.data)
    return shards


def device_put_alone(arrays):
    """Seconds of one batched device_put to pinned_host (row-major) of a
    shard of each box, waited for: what the PJRT path transfers."""
    import jax
    from jax.sharding import SingleDeviceSharding
    shards = saved_shards(arrays)
    targets = [SingleDeviceSharding(s.device, memory_kind="pinned_host")
               for s in shards]
    start = time.perf_counter()
    host = jax.device_put(shards, targets)
    jax.block_until_ready(host)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--saves", type=int, default=6,
                        help="saves, each after a device_put alone (the "
                        "first, which pins the pool, is not in the median)")
    parser.add_argument("--root", help="checkpoint root (default: a temp "
                        "directory, removed)")
    parser.add_argument("--pool", help="the staging pool (default: the "
                        "state and 64 MiB); a smaller one stages in waves, "
                        "one transfer call each")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import jax
    import hoist
    specs = benchlib.array_list(benchlib.parse_bytes(args.size))
    host = benchlib.host_arrays(specs)
    arrays, _ = benchlib.jax_arrays(specs, host)
    nbytes = sum(a.nbytes for a in host.values())
    shards = len(local_shards(arrays))
    pool = (benchlib.parse_bytes(args.pool) if args.pool
            else nbytes + (64 << 20))
    with tempfile.TemporaryDirectory(dir=args.root) as root:
        saves, alone = [], []
        with hoist.CheckpointManager(root, staging="pjrt",
                                     pool_bytes=pool) as mgr:
            for step in range(args.saves):
                # The baseline beside each save, in turn: this machine's
                # time for a GiB of fresh host memory varies several times
                # over from minute to minute.
                alone.append(device_put_alone(arrays))
                start = time.perf_counter()
                handle = mgr.save(step, arrays)
                blocked = time.perf_counter() - start
                info = handle.wait()
                saves.append({
                    "blocked_s": blocked,
                    "durable_s": time.perf_counter() - start,
                    "transfer_calls": info["pjrt_transfer_calls"],
                    "waves": info["waves"],
                    "shards": info["pjrt_shards"]})
            like = benchlib.abstract_jax(
                specs, benchlib.target_shardings(specs, other=True))
            start = time.perf_counter()
            restored = mgr.restore(like=like)
            jax.block_until_ready(restored)
            restore_s = time.perf_counter() - start
            exact = benchlib.same(restored, host)

    limit_s = statistics.median(alone)
    blocked = statistics.median(s["blocked_s"] for s in saves[1:] or saves)
    goals = {
        "one transfer call per save (per wave)": all(
            s["transfer_calls"] == s["waves"] for s in saves),
        f"blocked <= {BLOCKED_GOAL}x the device_put alone":
            blocked <= BLOCKED_GOAL * limit_s,
        "restore bit-exact": exact,
    }
    out = {"bytes": nbytes, "arrays": len(specs), "shards": shards,
           "saved_shards": len(saved_shards(arrays)), "pool_bytes": pool,
           "transfer_calls_before": shards, "device_put_alone_s": limit_s,
           "device_put_alone_each_s": alone,
           "saves": saves, "blocked_s": blocked,
           "blocked_vs_device_put": blocked / limit_s,
           "durable_s": statistics.median(s["durable_s"] for s in saves),
           "restore_other_mesh_s": restore_s, "restore_exact": exact,
           "goals": goals, "jax": jax.__version__}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"hoist bench/xla: {nbytes / 2**30:.2f} GiB "
              f"in {len(specs)} arrays, {shards} local shards on 8 JAX CPU "
              f"devices (2 x 4), staging='pjrt', jax {jax.__version__}")
        print(f"  batched device_put to pinned_host alone of the "
              f"{out['saved_shards']} shards a save writes (median): "
              f"{limit_s:.3f} s")
        for i, s in enumerate(saves):
            print(f"  save {i}: {s['transfer_calls']} transfer call(s) in "
                  f"{s['waves']} wave(s) for {s['shards']} shards (one "
                  f"np.asarray of each of {shards} before), blocked "
                  f"{s['blocked_s']:.3f} s, durable "
                  f"{s['durable_s']:.3f} s (device_put alone before it: "
                  f"{alone[i]:.3f} s)")
        print(f"  blocked (median of saves 1-) {blocked:.3f} s = "
              f"{blocked / limit_s:.2f}x the device_put alone")
        print(f"  restore onto 4 x 2: {restore_s:.3f} s, "
              f"{'bit-exact' if exact else 'MISMATCH'}")
        for goal, met in goals.items():
            print(f"  {'PASS' if met else 'FAIL'}  {goal}")
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
