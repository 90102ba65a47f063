#!/usr/bin/env python3
"""A save and a restore through a throttling object store, against the same
through a healthy one, in one run.

    .venv/bin/python bench/faults.py [--size 1GiB] [--rounds 3]
        [--rate 0.1] [--json] [--out FILE]

Starts SeaweedFS's S3 server on 127.0.0.1 (testing/object_store_server.py)
and the fault-injecting proxy in front of it (testing/fault_proxy.py), then
alternates, round after round, a healthy proxy and one that answers a
fraction `--rate` of all requests (uploads, reads, listings, every kind)
with 503 SlowDown. Each round saves a NumPy state of `--size` through
hoist.CheckpointManager (from save() until wait() returns: committed) and
restores it into new memory, checking every byte, both through the proxy
(the baseline pays the proxy's copy too). Reports each figure's median
over the rounds with its spread, the faults injected, and the ratios
throttled / healthy. hoist's retries (docs/robustness.md): up to 4 attempts
a request, after pauses of up to 200 ms, 400 ms, 800 ms drawn at random,
within a budget of 100 retries refilled at 10 a second.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "testing"))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

import hoist  # noqa: E402
from benchlib import parse_bytes  # noqa: E402
from fault_proxy import FaultProxy  # noqa: E402
from object_store_server import S3Server  # noqa: E402


def one_round(server, proxy, state, rules):
    proxy.set_rules(rules)
    root = f"s3://{server.bucket}/{uuid.uuid4().hex[:12]}"
    options = {"endpoint": proxy.endpoint["bench"]}
    with hoist.CheckpointManager(root, storage_options=options) as mgr:
        began = time.perf_counter()
        mgr.save(1, state).wait()
        saved = time.perf_counter() - began
    with hoist.CheckpointManager(root, storage_options=options) as mgr:
        began = time.perf_counter()
        restored = mgr.restore(1)
        read = time.perf_counter() - began
    if not np.array_equal(restored["x"], state["x"]):
        raise SystemExit("the restore differs from the save")
    return {"save_s": saved, "restore_s": read,
            "faults": sum(proxy.fired())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=0.1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    size = parse_bytes(args.size)
    state = {"x": np.random.default_rng(0).standard_normal(
        size // 4).astype(np.float32)}
    cases = {"healthy": [],
             "throttled": [{"fault": "503", "probability": args.rate}]}
    runs = {name: [] for name in cases}
    with tempfile.TemporaryDirectory() as scratch, \
            S3Server(Path(scratch) / "s3") as server:
        os.environ.update(server.env)
        with FaultProxy(server.env["AWS_ENDPOINT_URL"], ["bench"]) as proxy:
            for _ in range(args.rounds):
                for name, rules in cases.items():
                    runs[name].append(one_round(server, proxy, state, rules))
    report = {"size_bytes": size, "rate": args.rate, "rounds": args.rounds,
              "cases": {}}
    for name, rounds in runs.items():
        report["cases"][name] = {
            key: {"median": statistics.median(r[key] for r in rounds),
                  "min": min(r[key] for r in rounds),
                  "max": max(r[key] for r in rounds)}
            for key in ("save_s", "restore_s", "faults")}
    for key in ("save_s", "restore_s"):
        report[f"{key[:-2]}_throttled_over_healthy"] = (
            report["cases"]["throttled"][key]["median"]
            / report["cases"]["healthy"][key]["median"])
    lines = [f"hoist through a proxy answering {args.rate:.0%} of requests "
             f"with 503 SlowDown, {args.size}, {args.rounds} rounds "
             "(median [min-max])"]
    for name, case in report["cases"].items():
        lines.append(
            f"  {name:10s} save {case['save_s']['median']:.2f} s "
            f"[{case['save_s']['min']:.2f}-{case['save_s']['max']:.2f}]  "
            f"restore {case['restore_s']['median']:.2f} s "
            f"[{case['restore_s']['min']:.2f}-{case['restore_s']['max']:.2f}]"
            f"  faults {case['faults']['median']:.0f}")
    lines.append(f"  throttled / healthy: save "
                 f"{report['save_throttled_over_healthy']:.2f}x, restore "
                 f"{report['restore_throttled_over_healthy']:.2f}x")
    text = "\n".join(lines)
    print(json.dumps(report, indent=1) if args.json else text)
    if args.out:
        Path(args.out).write_text(text + "\n" + json.dumps(report, indent=1)
                                  + "\n")


if __name__ == "__main__":
    main()
