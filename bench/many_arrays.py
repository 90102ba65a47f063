#!/usr/bin/env python3
"""Save and restore time against the number of arrays: hoist vs torch.

    .venv/bin/python bench/many_arrays.py [--counts 1000,10000,...] [--json]

A large MoE's optimizer state holds 100,000 arrays or more; a save and a
restore must cost the same per array whatever their number. For each count
N, a state of N float32 tensors of 256 elements (1 KiB each) is saved by
hoist (as NumPy arrays sharing the tensors' memory) four times, reporting
how long the first save() blocked and the median of the next three, which
repeat the structure as a training loop's saves do; by torch.save once, with
fsync; and by hoist as tensors, the step the restores read; then each is restored in a new process after the page cache is
emptied (bench/peers.py's drop_caches), timing hoist from opening the
manager to the restored tensors (restore(like=template), the template a job
has) and torch from torch.load to its tensors. Also reported: the engine's
own time (the C++ restore call) and the time per array.
"""
import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402

ELEMENTS = 256


def state(n):
    import torch
    g = torch.Generator().manual_seed(n)
    return {f"experts/{i // 64}/m{i % 64}": torch.randn(ELEMENTS, generator=g)
            for i in range(n)}


def child(args):
    import torch
    path = os.path.join(args.dir, str(args.count))
    if args.phase == "save":
        import hoist
        shutil.rmtree(path, ignore_errors=True)
        s = state(args.count)
        blocked = []
        as_numpy = {k: v.numpy() for k, v in s.items()}  # the same memory
        with hoist.CheckpointManager(path, pool_bytes=64 << 20) as mgr:
            mgr.save(1, s).wait()  # the step the restores read
        with hoist.CheckpointManager(path, pool_bytes=64 << 20) as mgr:
            # The first save describes every array; the next ones, of the
            # same structure, repeat it (a training loop's saves).
            for step in range(2, 6):
                start = time.perf_counter()
                handle = mgr.save(step, as_numpy)
                blocked.append(time.perf_counter() - start)
                handle.wait()
        start = time.perf_counter()
        with open(path + ".pt", "wb") as f:
            torch.save(s, f)
            f.flush()
            os.fsync(f.fileno())
        return {"first_blocked_s": blocked[0],
                "repeat_blocked_s": sorted(blocked[1:])[1],
                "torch_save_s": time.perf_counter() - start}
    like = {f"experts/{i // 64}/m{i % 64}": torch.empty(ELEMENTS)
            for i in range(args.count)}
    if args.phase == "torch":
        start = time.perf_counter()
        out = torch.load(path + ".pt")
        seconds = time.perf_counter() - start
        engine = None
    else:
        import hoist
        start = time.perf_counter()
        mgr = hoist.CheckpointManager(path, pool_bytes=64 << 20)
        out = mgr.restore(1, like=like)
        seconds = time.perf_counter() - start
        engine = mgr.last_restore["elapsed_s"]
        mgr.close()
    expected = state(args.count)
    ok = len(out) == len(expected) and all(
        torch.equal(out[k], v) for k, v in expected.items())
    return {"seconds": seconds, "engine_s": engine, "verified": ok}


def run(phase, count, directory):
    result = peers.child_result(
        [sys.executable, os.path.abspath(__file__), "--child", "--phase", phase,
         "--count", str(count), "--dir", directory])
    if "error" in result:
        raise RuntimeError(f"{phase} {count}: {result['error']}")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="1000,10000,25000,50000,100000")
    parser.add_argument("--dir", default=None,
                        help="scratch directory (default: a new one here)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    own = args.dir is None
    args.dir = os.path.abspath(args.dir or f"hoist-many.{os.getpid()}")
    os.makedirs(args.dir, exist_ok=True)
    rows = []
    try:
        for n in (int(c) for c in args.counts.split(",")):
            row = {"arrays": n, **run("save", n, args.dir)}
            for phase in ("hoist", "torch"):
                row["cache"] = peers.drop_caches(args.dir)
                r = run(phase, n, args.dir)
                row[phase + "_s"] = r["seconds"]
                row["verified"] = row.get("verified", True) and r["verified"]
                if r["engine_s"] is not None:
                    row["engine_s"] = r["engine_s"]
            rows.append(row)
            if not args.json:
                print(f"{n:>7} arrays: save blocked {row['first_blocked_s']:.3f}"
                      f" s first, {row['repeat_blocked_s']:.3f} s repeated "
                      f"(torch.save + fsync {row['torch_save_s']:.3f} s); "
                      f"restore hoist {row['hoist_s']:.3f} s "
                      f"(engine {row['engine_s']:.3f} s, "
                      f"{row['hoist_s'] / n * 1e6:.1f} us/array), torch.load "
                      f"{row['torch_s']:.3f} s ({row['torch_s'] / n * 1e6:.1f}"
                      f" us/array), verified {row['verified']}", flush=True)
            shutil.rmtree(os.path.join(args.dir, str(n)), ignore_errors=True)
            os.remove(os.path.join(args.dir, f"{n}.pt"))
    finally:
        if own:
            shutil.rmtree(args.dir, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
