#!/usr/bin/env python3
"""What the local tier costs and what it buys, under mpirun.

    .venv/bin/python bench/tiers.py [--hoist build/release/hoist] [--np 4]
        [--size 512MiB] [--repeats 3] [--local-dirs "DISK;/dev/shm"] [--json]

Each run is `mpirun -np NP hoist demo --json --local-root DIR/{rank}
--persist-every 4` (steps 2, 6 local; 4 durable, on this machine's disk),
once with every local root intact and once with --lose-local 1 (rank 1's
local root, replicas it kept included, removed before the restore). From
the demo's JSON, per local root directory, the median over the repeats of:

- save cost: a local save's time to commit (its part written, fsynced and
  committed, then sent to its replica holder, which writes and commits it)
  over a durable save's, both measured in the same run;
- replication traffic: the bytes the job sent between processes per local
  save, over the bytes of the model (the durable save's);
- recovery time by source: restoring the latest (local) step onto the
  training mesh, with every part local, and with rank 1's part fetched from
  its replica, each over restoring the newest durable step onto the same
  mesh in the same run (the same bytes per process; read from the page
  cache on this machine, as the local tier would be).

"DISK" is a directory beside the durable root (this machine has one disk);
/dev/shm is memory.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_demo(args, local_root, scratch, lose):
    cmd = [args.mpirun, "-np", str(args.np), "--oversubscribe",
           "--allow-run-as-root", args.hoist, "demo", "--json", "--no-predict",
           "--size", args.size, "--step-time", "100ms",
           "--steps", "6", "--save-every", "2", "--persist-every", "4",
           "--root", os.path.join(scratch, "durable"),
           "--local-root", os.path.join(local_root, "{rank}")]
    if lose is not None:
        cmd += ["--lose-local", str(lose)]
    if args.cold:
        cmd += ["--cold"]
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200,
                         env=env)
    subprocess.run(["rm", "-rf", os.path.join(scratch, "durable"), local_root],
                   check=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr[-2000:]}")
    demo = json.loads(out.stdout)
    if not demo["verified"] or demo["restored_from"] != "local":
        raise RuntimeError(f"not restored from the local tier, verified: {demo}")
    tiers = demo["tiers"]
    return {
        "local_save_s": tiers["local"]["save_s"],
        "durable_save_s": tiers["durable"]["save_s"],
        "save_ratio": tiers["local"]["save_s"] / tiers["durable"]["save_s"],
        "local_part_bytes": tiers["local"]["bytes"],
        "model_bytes": tiers["durable"]["bytes"],
        "replicated_bytes": tiers["local"]["replicated_bytes"],
        "replicated_over_model":
            tiers["local"]["replicated_bytes"] / tiers["durable"]["bytes"],
        "restore_local_s": demo["restore_local_s"],
        "restore_durable_s": demo["restore_durable_s"],
        "restore_ratio": demo["restore_local_s"] / demo["restore_durable_s"],
        "note": demo["restore_note"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hoist", default=os.path.join(REPO, "build/release/hoist"))
    parser.add_argument("--mpirun", default="mpirun")
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--size", default="512MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--local-dirs", default="DISK;/dev/shm")
    parser.add_argument("--cold", action="store_true",
                        help="evict both tiers' files from the page cache "
                        "before the restores (demo --cold)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(dir=REPO, prefix=".tiers-") as scratch:
        for where in args.local_dirs.split(";"):
            base = os.path.join(scratch, "local") if where == "DISK" else where
            for lose in (None, 1):
                key = f"{where} {'rank 1 lost' if lose is not None else 'intact'}"
                runs = []
                for _ in range(args.repeats):
                    runs.append(run_demo(args, os.path.join(base, "hoist-tiers"),
                                         scratch, lose))
                results[key] = {
                    "runs": runs,
                    **{f"median_{k}": statistics.median(r[k] for r in runs)
                       for k in ("save_ratio", "replicated_over_model",
                                 "restore_ratio", "local_save_s",
                                 "durable_save_s", "restore_local_s",
                                 "restore_durable_s")},
                    "model_bytes": runs[0]["model_bytes"],
                    "local_part_bytes": runs[0]["local_part_bytes"],
                    "replicated_bytes": runs[0]["replicated_bytes"],
                    "note": runs[-1]["note"],
                }
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
        return
    print(f"mpirun -np {args.np} hoist demo --size {args.size}"
          f"{' --cold' if args.cold else ''}: median of "
          f"{args.repeats}; ratios against the durable tier in the same run")
    print(f"{'local root':<24} {'save local/durable':>19} {'replicated/model':>17}"
          f" {'restore local/durable':>22}")
    for key, r in results.items():
        print(f"{key:<24} {r['median_save_ratio']:>8.2f} "
              f"({r['median_local_save_s']:.2f}/{r['median_durable_save_s']:.2f}s)"
              f" {r['median_replicated_over_model']:>17.2f}"
              f" {r['median_restore_ratio']:>10.2f} "
              f"({r['median_restore_local_s']:.3f}/{r['median_restore_durable_s']:.3f}s)")
    first = next(iter(results.values()))
    print(f"model {first['model_bytes'] / 2**20:.0f} MiB; local parts "
          f"{first['local_part_bytes'] / 2**20:.0f} MiB per local save (each "
          f"rank holds half the model: the 2 x 4 mesh replicates over 'data'); "
          f"{first['replicated_bytes'] / 2**20:.0f} MiB sent per local save")
    for key, r in results.items():
        print(f"{key}: {r['note']}")


if __name__ == "__main__":
    main()
