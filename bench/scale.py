#!/usr/bin/env python3
"""How a save's and a restore's cost on each rank grows with the job's
ranks, on one host: rank 0's should grow at most linearly, every other
rank's not at all.

    .venv/bin/python bench/scale.py [--ranks 8,32,64,128,256]
        [--arrays 100] [--shard-bytes 64KiB] [--tiers durable,local]
        [--launcher mpirun|torchrun] [--json] [--out FILE]

For each N, `mpirun -np N --oversubscribe` runs build/release/bench/
scale_bench (its header says what each rank does): a state of --arrays
float32 arrays, each sharded over every rank's one device, --shard-bytes
per rank; then saves step 1 (every byte), step 2 (the same values: every
extent a delta reference), and restores the newest step with each rank
reading for itself and with shared reads, each checked bit-exact. The
`local` tier runs the same job with the saves in a local tier (2 replicas)
and restores from it.

--launcher torchrun runs the same state as DTensors sharded Shard(0) over a
1-D CPU mesh, under `torchrun --standalone --nproc-per-node N` with gloo
(default ranks 8,16,32,64: each rank imports torch), through
hoist.CheckpointManager and its TorchCoordinator (durable tier only; the
coordinator counts the payloads of its collectives).

Per phase, for rank 0 and for the other ranks (their median and maximum):
wall time, blocked time, messages and bytes through the coordinator each
way, CPU seconds, peak RSS, storage requests, and the manifest's bytes.
Then, per figure, its growth exponent between the smallest and largest N
(log(v_large / v_small) / log(N_large / N_small): 1 is linear, 0 flat),
judged against the goal: rank 0 at most 1.2 (linear, with slack for
noise), the other ranks at most 0.3 (flat, with the same slack). Times on
this host grow with N for a reason the code cannot remove: N processes
share 2 cores, so wall time is reported and not judged; messages, bytes,
requests and manifest bytes are counts, and judged.
"""
import argparse
import glob
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from benchlib import BUILD, parse_bytes  # noqa: E402

SCALE_BENCH = os.path.join(BUILD, "bench", "scale_bench")
# What is judged: counts, which the code decides (times on 2 shared cores
# grow with N whatever the code does).
JUDGED = ("messages_sent", "bytes_sent", "messages_received",
          "bytes_received", "storage_requests")
SHOWN = ("wall_s", "blocked_s", "cpu_s", "peak_rss_bytes") + JUDGED + (
    "manifest_bytes",)
RANK0_MAX, OTHERS_MAX = 1.2, 0.3


def torch_worker(args):
    """One torchrun rank: the same job as scale_bench's durable tier, in
    Python, through hoist.CheckpointManager and its TorchCoordinator."""
    import resource

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    import hoist
    dist.init_process_group("gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (ranks,))
    elements = args.shard_bytes // 4
    base = torch.arange(elements, dtype=torch.float32) + rank * elements

    def state(fill):
        return {f"layer{a:03d}": DTensor.from_local(
            fill(a), mesh, [Shard(0)], run_check=False)
            for a in range(args.arrays)}

    saved = state(lambda a: base + (a % 64) * (1 << 18))
    coordinator = hoist.TorchCoordinator()
    records = []

    def meter(phase, work):
        dist.barrier()
        traffic = dict(coordinator.traffic)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        record = {"phase": phase, "rank": rank, "ranks": ranks}
        record.update(work(start))
        record["wall_s"] = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        record["cpu_s"] = (after.ru_utime + after.ru_stime
                           - usage.ru_utime - usage.ru_stime)
        record["peak_rss_bytes"] = after.ru_maxrss << 10
        for key, value in coordinator.traffic.items():
            record[key] = value - traffic[key]
        records.append(record)

    with hoist.CheckpointManager(
            args.root, pool_bytes=max(8 << 20, 2 * args.arrays
                                      * args.shard_bytes),
            coordinator=coordinator) as mgr:
        def save(step):
            def work(start):
                handle = mgr.save(step, saved)
                blocked = time.perf_counter() - start
                info = handle.wait()
                out = {"blocked_s": blocked, "bytes": info["bytes"]}
                if rank == 0:
                    out["manifest_bytes"] = os.path.getsize(os.path.join(
                        args.root, f"step_{step:08d}", "MANIFEST.json"))
                return out
            return work

        def restore(start):
            like = state(lambda a: torch.full((elements,), -1.0))
            got = mgr.restore(like=like)
            exact = all(torch.equal(got[k].to_local(), saved[k].to_local())
                        for k in saved)
            if not exact:
                raise SystemExit(f"rank {rank}: not restored bit-exact")
            return {"exact": exact, "bytes_read":
                    mgr.last_restore["bytes_read"]}

        meter("save", save(1))
        meter("save_delta", save(2))
        meter("restore", restore)
    with open(os.path.join(args.out, f"rank_{rank:05d}.json"), "w") as f:
        json.dump(records, f)
    dist.destroy_process_group()


def run_job(ranks, tier, args, scratch):
    """One job; returns every rank's records and the job's seconds."""
    root = os.path.join(scratch, f"{tier}_{ranks}")
    out = os.path.join(root, "out")
    os.makedirs(out)
    if args.launcher == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run",
                   "--standalone", "--nproc-per-node", str(ranks),
                   os.path.abspath(__file__), "--worker",
                   "--root", os.path.join(root, "ckpt"), "--out-dir", out,
                   "--arrays", str(args.arrays),
                   "--shard-bytes", str(args.shard_bytes)]
    else:
        command = ["mpirun", "-np", str(ranks), "--oversubscribe",
                   "--allow-run-as-root", SCALE_BENCH,
                   "--root", os.path.join(root, "ckpt"), "--out", out,
                   "--arrays", str(args.arrays),
                   "--shard-bytes", str(args.shard_bytes)]
    if tier == "local":
        command += ["--local-root", os.path.join(root, "local", "{rank}")]
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"scale.py: {ranks} ranks ({tier}) failed:\n"
                 f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    records = []
    for name in sorted(glob.glob(os.path.join(out, "rank_*.json"))):
        with open(name) as f:
            records += json.load(f)
    if len({r["rank"] for r in records}) != ranks:
        sys.exit(f"scale.py: {ranks} ranks ({tier}): only "
                 f"{len({r['rank'] for r in records})} reported")
    shutil.rmtree(root)
    return records, seconds


def summarize(records):
    """Per phase: rank 0's figures, and the others' median and max."""
    phases = {}
    for r in records:
        phases.setdefault(r["phase"], []).append(r)
    out = {}
    for phase, rows in phases.items():
        rank0 = next(r for r in rows if r["rank"] == 0)
        others = [r for r in rows if r["rank"] != 0]
        entry = {"exact": all(r.get("exact", True) for r in rows)}
        for key in SHOWN:
            if key not in rank0:
                continue
            entry[key] = {"rank0": rank0[key]}
            if others and key in others[0]:
                values = [r[key] for r in others]
                entry[key]["others_median"] = statistics.median(values)
                entry[key]["others_max"] = max(values)
        out[phase] = entry
    return out


def exponent(small, large, n_small, n_large):
    if small <= 0 or large <= 0:
        return 0.0 if small == large else math.inf
    return math.log(large / small) / math.log(n_large / n_small)


def judge(results, ranks):
    """Growth exponents of the judged counts; the ones past the goal."""
    n0, n1 = ranks[0], ranks[-1]
    verdicts, failures = [], []
    if n0 == n1:
        return verdicts, failures  # one size: nothing to judge
    for tier, by_n in results.items():
        for phase in by_n[n1]["summary"]:
            for key in JUDGED + ("manifest_bytes",):
                small = by_n[n0]["summary"][phase].get(key)
                large = by_n[n1]["summary"][phase].get(key)
                if small is None or large is None:
                    continue
                e0 = exponent(small["rank0"], large["rank0"], n0, n1)
                line = {"tier": tier, "phase": phase, "figure": key,
                        "rank0": round(e0, 2)}
                if "others_max" in large:
                    line["others"] = round(exponent(
                        small["others_max"], large["others_max"], n0, n1), 2)
                verdicts.append(line)
                if e0 > RANK0_MAX or line.get("others", 0) > OTHERS_MAX:
                    failures.append(line)
    return verdicts, failures


def table(results, ranks):
    lines = []
    for tier, by_n in results.items():
        for phase in by_n[ranks[-1]]["summary"]:
            lines.append(f"\n[{tier}] {phase}")
            lines.append("  {:<18}".format("figure") + "".join(
                f"{n:>22}" for n in ranks))
            for key in SHOWN:
                if key not in by_n[ranks[-1]]["summary"][phase]:
                    continue
                cells = []
                for n in ranks:
                    v = by_n[n]["summary"][phase][key]
                    cell = f"{v['rank0']:.3g}"
                    if "others_max" in v:
                        cell += f" | {v['others_max']:.3g}"
                    cells.append(f"{cell:>22}")
                lines.append(f"  {key:<18}" + "".join(cells))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--ranks",
                        help="comma-separated job sizes (default "
                        "8,32,64,128,256; torchrun: 8,16,32,64)")
    parser.add_argument("--launcher", choices=("mpirun", "torchrun"),
                        default="mpirun")
    parser.add_argument("--worker", action="store_true",
                        help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--arrays", type=int, default=100)
    parser.add_argument("--shard-bytes", type=parse_bytes, default="64KiB")
    parser.add_argument("--tiers", default="durable,local",
                        help="durable, local or both (default %(default)s)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", help="also write the report here")
    parser.add_argument("--out-dir", dest="out_dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.out = args.out_dir
        return torch_worker(args)
    if args.ranks is None:
        args.ranks = ("8,16,32,64" if args.launcher == "torchrun"
                      else "8,32,64,128,256")
    if args.launcher == "torchrun":
        args.tiers = "durable"
    elif not os.path.exists(SCALE_BENCH):
        sys.exit(f"scale.py: {SCALE_BENCH} is missing: run tools/demo.sh "
                 "(or cmake --build build/release --target scale_bench)")
    if args.launcher == "mpirun" and shutil.which("mpirun") is None:
        sys.exit("scale.py: mpirun is missing (apt-get install openmpi-bin)")
    ranks = sorted(int(n) for n in args.ranks.split(","))
    results = {}
    scratch = tempfile.mkdtemp(prefix="hoist_scale_", dir=os.getcwd())
    try:
        for tier in args.tiers.split(","):
            results[tier] = {}
            for n in ranks:
                records, seconds = run_job(n, tier, args, scratch)
                results[tier][n] = {"job_s": seconds,
                                    "summary": summarize(records)}
                print(f"scale.py: {tier}, {n} ranks: {seconds:.1f} s",
                      file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    verdicts, failures = judge(results, ranks)
    exact = all(p["exact"] for by_n in results.values()
                for n in by_n.values() for p in n["summary"].values())
    if args.json:
        report = json.dumps({"ranks": ranks, "arrays": args.arrays,
                             "shard_bytes": args.shard_bytes,
                             "results": results, "growth": verdicts,
                             "past_goal": failures, "exact": exact},
                            indent=1)
    else:
        lines = [f"bench/scale.py: {args.arrays} arrays x "
                 f"{args.shard_bytes} bytes per rank; cells: rank 0 | "
                 "the other ranks' max"]
        lines.append("job seconds: " + ", ".join(
            f"{tier} {n}: {by_n[n]['job_s']:.1f}"
            for tier, by_n in results.items() for n in ranks))
        lines.append(table(results, ranks))
        lines.append(f"\ngrowth exponents, {ranks[0]} -> {ranks[-1]} ranks "
                     f"(goal: rank 0 <= {RANK0_MAX}, others <= "
                     f"{OTHERS_MAX}):")
        for v in verdicts:
            lines.append(f"  [{v['tier']}] {v['phase']:<17} "
                         f"{v['figure']:<18} rank0 {v['rank0']:>5}"
                         + (f"  others {v['others']:>5}"
                            if "others" in v else ""))
        lines.append(f"every restore bit-exact: {exact}")
        lines.append("past the goal: " + (", ".join(
            f"{f['tier']}/{f['phase']}/{f['figure']}" for f in failures)
            or "none"))
        report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")
    return 1 if failures or not exact else 0


if __name__ == "__main__":
    sys.exit(main())
