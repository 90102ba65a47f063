#!/usr/bin/env python3
"""hoist against this machine's limits: the four ratios, with their spread.

    .venv/bin/python bench/limits.py [--rounds 5] [--size 2GiB]
                                     [--blocked-size 1GiB] [--pairs 12]
                                     [--json]

Each figure comes from --rounds rounds, every round measuring the limit and
then hoist right after it (limit, hoist, limit, hoist ...), so each ratio
compares neighbours on a disk whose speed drifts; reported: the median of
the rounds' ratios, their range, and the goal and floor of issue 41.
  1. restore into new host memory, and onto 8 (host-backend) devices,
     against the disk's read limit; 2. save against its write limit
     (save_bench --repeats ROUNDS --no-export: fio-style limits, the best of
     several io_uring job/depth/block configurations, O_DIRECT);
  3. time blocked by a save from Python (JAX arrays, torch tensors; the
     model of bench/benchlib.py, --saves 5 each after a warm-up) against the
     single-thread memcpy of the same bytes (transfer_bench), each round
     (its time with non-temporal stores, as hoist copies, is recorded as
     stream_copy_bound_s);
  4. training overhead: bench/train_loop.py --pairs, hoist at its default
     options: in one process per round, --pairs pairs of windows of 5 steps,
     one with a save and one without, alternated; a round's overhead is the
     median of its pairs' ratios - 1 (their quartiles are kept beside it).
Once per run: 5. bench/many_arrays.py --scaling: a repeated save's blocked
     time and time to commit at 10,000 and 100,000 arrays, deltas on and
     off, and how much faster than the arrays they grow (FAIL above 15x at
     10x the arrays; reported under "many_arrays", and limits.py then exits
     1 after its report).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402
import peers  # noqa: E402

# (figure, what, goal, floor, higher is better)
FIGURES = [
    ("restore_host", "restore into new host memory / disk read limit",
     0.9, 0.85, True),
    ("restore_devices", "restore onto 8 devices / disk read limit",
     0.9, 0.85, True),
    ("save", "save / disk write limit", 0.9, 0.85, True),
    ("blocked_jax", "time blocked, JAX arrays / memcpy bound", 1.1, 1.2,
     False),
    ("blocked_torch", "time blocked, torch tensors / memcpy bound", 1.1, 1.2,
     False),
    ("train_overhead", "training: 5 steps with a save / without, - 1",
     0.05, None, False),
]


def log(message):
    print(message, file=sys.stderr, flush=True)


def model_bytes(size):
    """The bytes of bench/benchlib.py's model of `size` (its arrays are made
    empty: never touched, so never in memory)."""
    return sum(a.nbytes for a in benchlib.host_arrays(
        benchlib.array_list(size), fill=False).values())


def disk_rounds(args):
    """Per-round ratios of save_bench: save, restore onto devices and into
    new host memory, each against its round's limit."""
    out = benchlib.cpp_json([benchlib.SAVE_BENCH, "--bytes", str(args.size), "--dir",
                          args.dir, "--repeats", str(args.rounds),
                          "--no-export", "--json"])
    return {"save": out["save_vs_raw_write_samples"],
            "restore_devices": out["restore_vs_raw_read_samples"],
            "restore_host": out["restore_host_vs_raw_read_samples"],
            "raw_read_gbps": out["raw_read_gbps"],
            "raw_write_gbps": out["raw_write_gbps"],
            "disk_limit": out["disk_limit"]}


def blocked_round(args, nbytes):
    """One round: the memcpy bound, then each system's blocked times."""
    memcpy = benchlib.cpp_json([benchlib.TRANSFER_BENCH, "--json", "--model-bytes",
                             str(args.blocked_size), "--repeats", "3"])
    bound = nbytes / (memcpy["memcpy_gbps"] * 1e9)
    # hoist's copies use non-temporal stores (StreamCopy): the same
    # thread's time that way, recorded beside the bound the issue sets.
    stream = nbytes / (memcpy["stream_copy_gbps"] * 1e9)
    child_args = argparse.Namespace(size=args.blocked_size, dir=args.dir,
                                    writers=2, saves=5)
    out = {"memcpy_bound_s": bound, "stream_copy_bound_s": stream}
    for figure, system in (("blocked_jax", "hoist"),
                           ("blocked_torch", "hoist_torch")):
        result = peers.run_child(system, "save", child_args)
        if "error" in result:
            raise RuntimeError(f"{system}: {result['error']}")
        out[figure] = result["blocked_s"] / bound
        out[figure + "_s"] = result["blocked_s_samples"]
    return out


def train_round(args):
    """One round: bench/train_loop.py --pairs in a process of its own, hoist
    at its defaults: the median over pairs of windows (with a save, without)
    of their ratio - 1, and its quartiles."""
    result = benchlib.child_result(
        [sys.executable, os.path.join(os.path.dirname(__file__),
                                      "train_loop.py"), "--child",
         "--variant", "hoist_low", "--every", "5", "--pairs",
         str(args.pairs), "--dir", args.dir])
    if "error" in result:
        raise RuntimeError(f"train_loop: {result['error']}")
    return result


def many_arrays(args):
    """bench/many_arrays.py --scaling: its rows and growth figures."""
    import subprocess
    done = subprocess.run(
        [sys.executable, os.path.join(os.path.dirname(__file__),
                                      "many_arrays.py"), "--scaling",
         "--json", "--dir", os.path.join(args.dir, "many")],
        capture_output=True, text=True, timeout=1800)
    if not done.stdout.strip():
        raise RuntimeError(f"many_arrays.py --scaling: exit {done.returncode}"
                           f": {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def summarize(samples):
    return {"median": statistics.median(samples), "min": min(samples),
            "max": max(samples), "samples": samples}


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2])
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds of (limit, hoist) per figure (default 5)")
    parser.add_argument("--size", default="2GiB",
                        help="model size for save and restore (default 2GiB)")
    parser.add_argument("--blocked-size", default="1GiB",
                        help="model size for time blocked (default 1GiB)")
    parser.add_argument("--pairs", type=int, default=12,
                        help="training loop: pairs of windows per round "
                        "(default 12)")
    parser.add_argument("--dir", default=None,
                        help="directory on the disk to measure (default: a "
                        "new one under the current directory, removed after)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    own = args.dir is None
    args.dir = os.path.abspath(args.dir or tempfile.mkdtemp(
        prefix="hoist-limits.", dir="."))
    report = {"rounds": args.rounds, "size": args.size,
              "blocked_size": args.blocked_size}
    try:
        log("== save and restore against the disk's limits")
        disk = disk_rounds(args)
        samples = {k: disk[k] for k in ("save", "restore_devices",
                                        "restore_host")}
        report.update({k: disk[k] for k in ("raw_read_gbps",
                                            "raw_write_gbps", "disk_limit")})
        nbytes = model_bytes(args.blocked_size)
        samples.update(blocked_jax=[], blocked_torch=[], train_overhead=[])
        report["memcpy_bound_s"] = []
        report["stream_copy_bound_s"] = []
        report["train_overhead_quartiles"] = []
        for r in range(args.rounds):
            log(f"== round {r + 1} of {args.rounds}: blocked, training")
            blocked = blocked_round(args, nbytes)
            report["memcpy_bound_s"].append(blocked["memcpy_bound_s"])
            report["stream_copy_bound_s"].append(
                blocked["stream_copy_bound_s"])
            samples["blocked_jax"].append(blocked["blocked_jax"])
            samples["blocked_torch"].append(blocked["blocked_torch"])
            train = train_round(args)
            samples["train_overhead"].append(train["overhead_median"])
            report["train_overhead_quartiles"].append(
                [train["overhead_q1"], train["overhead_q3"]])
        log("== a repeated save's cost against the number of arrays")
        report["many_arrays"] = many_arrays(args)
    finally:
        if own:
            shutil.rmtree(args.dir, ignore_errors=True)
    report["figures"] = {}
    for figure, what, goal, floor, higher in FIGURES:
        s = summarize(samples[figure])
        worst = s["min"] if higher else s["max"]
        better = (lambda x, y: x >= y) if higher else (lambda x, y: x <= y)
        s.update(what=what, goal=goal, floor=floor,
                 goal_met=better(s["median"], goal),
                 floor_held=floor is None or better(worst, floor))
        report["figures"][figure] = s
    failed = any(g["failed"] for g in report["many_arrays"]["growth"])
    if args.json:
        print(json.dumps(report, indent=2))
        sys.exit(1 if failed else 0)
    print(f"{args.rounds} rounds; disk limit {report['raw_write_gbps']:.2f} "
          f"GB/s write, {report['raw_read_gbps']:.2f} GB/s read "
          f"({report['disk_limit']})")
    print(f"{'figure':<50} {'median':>7} {'range':>15} {'goal':>6} "
          f"{'floor':>6}  met")
    for figure, s in report["figures"].items():
        floor = "" if s["floor"] is None else f"{s['floor']:.2f}"
        print(f"{s['what']:<50} {s['median']:7.3f} "
              f"{s['min']:7.3f}-{s['max']:<7.3f} {s['goal']:6.2f} {floor:>6}"
              f"  {'goal' if s['goal_met'] else 'no'}"
              f"{'' if s['floor_held'] else ', floor missed'}")
    from many_arrays import print_scaling
    print_scaling(report["many_arrays"]["rows"],
                  report["many_arrays"]["growth"])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
