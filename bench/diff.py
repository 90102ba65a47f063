#!/usr/bin/env python3
"""hoist diff of two steps of many arrays: how long it takes, from the
manifests alone, on a local root and across two roots on S3.

    .venv/bin/python bench/diff.py [--arrays 100000] [--changed 100]
        [--rounds 3] [--no-s3] [--json] [--out FILE]

Saves a state of `--arrays` small float32 arrays as step 1, then changes
`--changed` of them (every 1000th) and saves step 2 (a delta: the others
reference step 1's bytes). Then, each round: `hoist diff ROOT 1 2 --json`
(the CLI, a fresh process: its start-up included), and hoist.diff() in this
process; each checked to name exactly the changed arrays. With S3 (SeaweedFS
on 127.0.0.1, testing/object_store_server.py) the same two steps are saved
into two roots there and diffed across them. Baseline in the same run: the
time to read the two manifests alone (hoist.inspect, twice), which a diff
cannot beat. Reports each figure's median and spread.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import hoist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "testing"))
import object_store_server  # noqa: E402

BIN = Path(sys.executable).parent


def save_two_steps(root_a, root_b, arrays, changed, storage_options=None):
    """Step 1 into root_a and step 2 into root_b (the same root or not);
    the names changed between them."""
    state = {f"layers/{i:06d}/w": np.full(16, i, np.float32)
             for i in range(arrays)}
    names = [f"layers/{i:06d}/w" for i in range(0, arrays, arrays // changed)]
    kw = {"storage_options": storage_options} if storage_options else {}
    with hoist.CheckpointManager(root_a, **kw) as mgr:
        mgr.save(1, state).wait()
    for name in names:
        state[name] = state[name] + 1
    if root_b != root_a:
        with hoist.CheckpointManager(root_b, **kw) as mgr:
            mgr.save(1, {"placeholder": np.zeros(1, np.float32)}).wait()
    with hoist.CheckpointManager(root_b, **kw) as mgr:
        mgr.save(2, state).wait()
    return sorted(names)


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def measure(root_a, root_b, expected, rounds, env=None, storage_options=None):
    cli, python, manifests = [], [], []
    args = ([str(root_a), "1", str(root_b), "2"] if root_a != root_b
            else [str(root_a), "1", "2"])
    for _ in range(rounds):
        seconds, done = timed(lambda: subprocess.run(
            [str(BIN / "hoist"), "diff", *args, "--json"],
            capture_output=True, text=True, env=env))
        assert done.returncode == 0, done.stderr
        got = sorted(c["name"] for c in json.loads(done.stdout)["changed"])
        assert got == expected, (got[:5], expected[:5])
        cli.append(seconds)
        seconds, diff = timed(lambda: hoist.diff(
            root_a, 1, 2, root_b=root_b, storage_options=storage_options))
        assert sorted(c["name"] for c in diff["changed"]) == expected
        python.append(seconds)
        seconds, _ = timed(lambda: (
            hoist.inspect(f"{root_a}/step_00000001",
                          storage_options=storage_options),
            hoist.inspect(f"{root_b}/step_00000002",
                          storage_options=storage_options)))
        manifests.append(seconds)
    return {"cli_s": cli, "python_s": python, "manifests_s": manifests}


def summary(figures):
    return {k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
            for k, v in figures.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arrays", type=int, default=100_000)
    parser.add_argument("--changed", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    results = {"arrays": args.arrays, "changed": args.changed}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        root = Path(tmp) / "root"
        expected = save_two_steps(root, root, args.arrays, args.changed)
        results["local"] = summary(measure(root, root, expected, args.rounds))
        if not args.no_s3:
            with object_store_server.S3Server(Path(tmp) / "s3") as server:
                env = {**os.environ, **server.env}
                options = {"endpoint": server.env["AWS_ENDPOINT_URL"],
                           "access_key_id": server.env["AWS_ACCESS_KEY_ID"],
                           "secret_access_key":
                               server.env["AWS_SECRET_ACCESS_KEY"],
                           "region": server.env.get("AWS_REGION",
                                                    "us-east-1")}
                a = f"s3://{server.bucket}/diff-a"
                b = f"s3://{server.bucket}/diff-b"
                expected = save_two_steps(a, b, args.arrays, args.changed,
                                          options)
                results["s3_two_roots"] = summary(
                    measure(a, b, expected, args.rounds, env, options))
    text = json.dumps(results, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        print(text)
        return
    print(f"hoist diff, {args.arrays} arrays, {args.changed} changed "
          f"(median of {args.rounds}; min-max):")
    for where in ("local", "s3_two_roots"):
        if where not in results:
            continue
        r = results[where]
        print(f"  {where:13s} CLI {r['cli_s']['median']:.3f} s "
              f"({r['cli_s']['min']:.3f}-{r['cli_s']['max']:.3f}), "
              f"hoist.diff {r['python_s']['median']:.3f} s, "
              f"both manifests read alone {r['manifests_s']['median']:.3f} s")


if __name__ == "__main__":
    main()
