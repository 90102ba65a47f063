#!/usr/bin/env python3
"""A dispatched-mode save's blocked time, per host-copy scheduling.

Runs `hoist demo --json` in rounds, one run per `--host-copies` policy each
round (interleaved, so the disk's and the machine's drift hits every policy
alike), and prints each run's dispatched-mode figures and, per policy, the
median over the runs. `blocked` is what `Save(..., kDispatched)` plus the
`WaitStaged` before the next optimizer step kept the demo's loop, per save;
`dispatch` is the time from `Save` (after any wait for room) to every copy
enqueued. Waits for room (the previous save not yet committed) count in
`blocked`: at the demo's default cadence (a 1 GiB save every 0.5 s, about
the disk's write rate here) they come and go with the disk; `--save-every 4`
leaves the disk time to keep up.

    bench/dispatch.py --rounds 5 -- --steps 48 --save-every 4
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(hoist: str, policy: str, demo_args: list[str]) -> dict:
    out = subprocess.run(
        [hoist, "demo", "--json", "--no-predict", "--host-copies", policy,
         *demo_args],
        check=True, capture_output=True, text=True)
    report = json.loads(out.stdout)
    mode = report["modes"]["dispatched"]
    return {
        "blocked_mean_ms": mode["blocked_s"] * 1e3,
        "blocked_median_ms": mode["blocked_median_s"] * 1e3,
        "blocked_max_ms": mode["blocked_max_s"] * 1e3,
        "dispatch_ms": mode["dispatch_s"] * 1e3,
        "staged_blocked_median_ms":
            report["modes"]["staged"]["blocked_median_s"] * 1e3,
        "save_s": report["save_s"],
        "restore_mesh_s": report["restore_mesh_s"],
        "restore_host_s": report["restore_host_s"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--policies", default="batch,normal,idle",
                        help="--host-copies values, comma-separated")
    parser.add_argument("--hoist", default=str(ROOT / "build/release/hoist"))
    parser.add_argument("demo_args", nargs="*",
                        help="passed to hoist demo (after --)")
    args = parser.parse_args()
    policies = args.policies.split(",")
    runs: dict[str, list[dict]] = {p: [] for p in policies}
    print(f"hoist demo --json --no-predict {' '.join(args.demo_args)}; "
          f"{args.rounds} rounds of {', '.join(policies)}")
    fmt = ("{:<7} blocked mean {blocked_mean_ms:6.2f} median "
           "{blocked_median_ms:5.2f} max {blocked_max_ms:6.2f} ms, dispatch "
           "{dispatch_ms:5.2f} ms | staged blocked median "
           "{staged_blocked_median_ms:6.1f} ms | save {save_s:.2f} s, "
           "restore mesh {restore_mesh_s:.2f} s host {restore_host_s:.2f} s")
    for _ in range(args.rounds):
        for policy in policies:
            figures = run(args.hoist, policy, args.demo_args)
            runs[policy].append(figures)
            print(fmt.format(policy, **figures), flush=True)
    print("median over the runs:")
    for policy in policies:
        keys = runs[policy][0].keys()
        print(fmt.format(policy, **{
            k: statistics.median(r[k] for r in runs[policy]) for k in keys}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
