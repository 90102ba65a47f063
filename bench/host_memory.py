#!/usr/bin/env python3
"""What the staging pool costs a job: blocked time past the pool, and a
restore that must not pay for it.

    .venv/bin/python bench/host_memory.py [--size 2GiB] [--saves 4] [--restores 3] [--json]

Two measurements on NumPy arrays on the local disk, each in fresh
processes:
  - saves: a state `--size` large saved `--saves` times (new bytes each)
    through the default pool (1 GiB), through a pool that holds it all, and
    through the default pool with host_memory_budget = the pool (no
    overflow: every save larger than the pool waited for storage before
    2026-12-05). Blocked time (save() until it returns) of the first save
    and the median of the rest, time to durable, and the process's peak RSS
    over what it held before.
  - restores: the step restored in a fresh process (page cache dropped when
    permitted) with the default pool and with a 64 MiB one, in turn, each
    `--restores` times: seconds and the process's peak RSS over the state.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import drop_caches, parse_bytes  # noqa: E402

CHILD = r"""
import json, os, resource, sys, time
import numpy as np
import hoist
mode, root, size, pool, budget, saves = sys.argv[1:7]
size, saves = int(size), int(saves)
pool = int(pool)
count = 32
def state(seed):
    return {f"w{i}": np.random.default_rng(seed * 100 + i).random(size // 8 // count)
            for i in range(count)}
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if mode == "save":
    arrays = state(0)
    before = peak()
    mgr = hoist.CheckpointManager(root, pool_bytes=pool, keep=1,
                                  host_memory_budget="auto" if budget == "auto" else int(budget))
    blocked, durable = [], []
    for step in range(saves):
        for v in arrays.values():
            v += 1
        start = time.perf_counter()
        handle = mgr.save(step, arrays)
        blocked.append(time.perf_counter() - start)
        info = handle.wait()
        durable.append(time.perf_counter() - start)
    mgr.close()
    print(json.dumps({"blocked_s": blocked, "durable_s": durable,
                      "stalled_bytes": info["stalled_bytes"],
                      "peak_rss_over_state_bytes": peak() - before}))
else:
    like = {f"w{i}": np.empty(size // 8 // count) for i in range(count)}
    start = time.perf_counter()
    mgr = hoist.CheckpointManager(root, pool_bytes=pool)
    out = mgr.restore(like=like)
    seconds = time.perf_counter() - start
    mgr.close()
    print(json.dumps({"restore_s": seconds, "peak_rss_bytes": peak()}))
"""


def run(*args):
    done = subprocess.run([sys.executable, "-c", CHILD, *map(str, args)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"child {args[0]} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="2GiB")
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--restores", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    size = parse_bytes(args.size)
    default_pool = 1 << 30
    report = {"bytes": size, "saves": {}, "restores": {}}
    with tempfile.TemporaryDirectory(prefix="hoist-memory-",
                                     dir=os.getcwd()) as tmp:
        root = os.path.join(tmp, "ckpt")
        cases = {
            "default pool, default budget": (default_pool, "auto"),
            "pool that holds it": (size + size // 16 + (64 << 20), "auto"),
            "default pool, budget = pool": (default_pool, default_pool),
        }
        for name, (pool, budget) in cases.items():
            shutil.rmtree(root, ignore_errors=True)
            r = run("save", root, size, pool, budget, args.saves)
            report["saves"][name] = {
                "pool_bytes": pool, "first_blocked_s": r["blocked_s"][0],
                "blocked_s": statistics.median(r["blocked_s"][1:]),
                "durable_s": statistics.median(r["durable_s"][1:]),
                "stalled_bytes": r["stalled_bytes"],
                "peak_rss_over_state_bytes": r["peak_rss_over_state_bytes"]}
        whole = report["saves"]["pool that holds it"]["blocked_s"]
        for figures in report["saves"].values():
            figures["blocked_vs_pool_that_holds_it"] = (
                figures["blocked_s"] / whole)
        samples = {"default pool (1 GiB)": [], "64 MiB pool": []}
        for _ in range(args.restores):
            for name, pool in (("default pool (1 GiB)", default_pool),
                               ("64 MiB pool", 64 << 20)):
                report["cache"] = drop_caches(root)
                samples[name].append(run("restore", root, size, pool, "auto",
                                         0))
        for name, runs in samples.items():
            report["restores"][name] = {
                "restore_s": statistics.median(r["restore_s"] for r in runs),
                "samples_s": [r["restore_s"] for r in runs],
                "peak_rss_over_state": max(r["peak_rss_bytes"]
                                           for r in runs) / size}
        report["restores"]["default_vs_64MiB"] = (
            report["restores"]["default pool (1 GiB)"]["restore_s"]
            / report["restores"]["64 MiB pool"]["restore_s"])
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{size / 2**30:.2f} GiB of NumPy arrays, local disk")
    print(f"{'saves':32s} {'pool':>9s} {'1st blocked':>12s} {'blocked':>9s} "
          f"{'vs whole':>9s} {'durable':>9s} {'peak RSS over state':>20s}")
    for name, f in report["saves"].items():
        print(f"{name:32s} {f['pool_bytes'] / 2**20:7.0f} M "
              f"{f['first_blocked_s']:11.3f}s {f['blocked_s']:8.3f}s "
              f"{f['blocked_vs_pool_that_holds_it']:8.2f}x "
              f"{f['durable_s']:8.2f}s "
              f"{f['peak_rss_over_state_bytes'] / 2**30:17.2f} GiB")
    print(f"restores in a fresh process (page cache: "
          f"{report['cache']}):")
    for name in ("default pool (1 GiB)", "64 MiB pool"):
        f = report["restores"][name]
        print(f"  {name:24s} {f['restore_s']:.3f} s "
              f"({', '.join(f'{s:.3f}' for s in f['samples_s'])}), "
              f"peak RSS {f['peak_rss_over_state']:.2f}x the state")
    print(f"  default / 64 MiB: {report['restores']['default_vs_64MiB']:.2f}x")


if __name__ == "__main__":
    main()
