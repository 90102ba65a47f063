#!/usr/bin/env python3
"""How much a checkpointing system slows the training loop around it.

    .venv/bin/python bench/train_loop.py [--steps 40] [--every 5] [--json]
                                         [--variants V,...] [--pairs N]

A real CPU training loop (PyTorch: 8 linear layers of 2048 x 2048 + AdamW,
about 400 MB of state) runs --steps steps, saving its model and optimizer
every --every steps, each variant in a process of its own: no checkpoints
(the baseline), hoist at each background priority (low, the default; idle;
normal), PyTorch DCP async_save, and torch.save. Reported: total time and
median step time, each as overhead over the baseline, and for hoist the
CPU seconds its process spent per GB saved beyond the baseline's.

--pairs N measures each checkpointing variant in one process instead, in N
pairs of windows of --every steps, one window with a save at its first step
(drained at the window's end: what a save costs is inside its window) and
one without, in alternating order. Each pair is two neighbours in time, so
the pair's ratio does not move with this machine's CPU, which slows down for
seconds at a time (a step's time going from ~120 to ~200 ms, with
checkpoints or without; bench/results/save-bench-2026-12-04.txt, section
7); processes of the other mode differ by as much as the overhead itself.
Reported: the median over pairs of (window with a save / window without) - 1,
and its quartiles.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

VARIANTS = ["none", "hoist_low", "hoist_idle", "hoist_normal", "dcp",
            "torch_save"]


def child(args):
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048)
                                  for _ in range(8)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(64, 2048)
    root = os.path.join(args.dir, args.variant)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    saver, handles = None, []
    if args.variant.startswith("hoist"):
        import hoist
        saver = hoist.CheckpointManager(
            root, keep=2, pool_bytes=512 << 20,
            background_priority=args.variant.split("_")[1])
    elif args.variant == "dcp":
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29533",
                                rank=0, world_size=1)

    def save(step):
        state = {"model": model.state_dict(),
                 "optim": optimizer.state_dict()}
        if saver is not None:
            handles.append(saver.save(step, state))
        elif args.variant == "dcp":
            if handles:
                handles.pop().result()  # one in flight, as hoist
            handles.append(dcp.async_save(
                state, checkpoint_id=os.path.join(root, str(step))))
        elif args.variant == "torch_save":
            with open(os.path.join(root, "state.pt"), "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())

    def train_step():
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()

    def drain():
        for h in handles:
            (h.wait if hasattr(h, "wait") else h.result)()
        handles.clear()

    for _ in range(3):  # warm-up, and the optimizer's state exists
        train_step()
    if args.variant != "none":
        save(0)  # warm-up save (imports, planning, thread pools)
        drain()
    if args.pairs:
        return paired_windows(args, train_step, save, drain, saver)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    steps = []
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        t = time.perf_counter()
        train_step()
        if args.variant != "none" and step % args.every == 0:
            save(step)
        steps.append(time.perf_counter() - t)
    total = time.perf_counter() - start
    for h in handles:  # what is still in flight is not training time
        (h.wait if hasattr(h, "wait") else h.result)()
    if saver is not None:
        saver.close()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    state_bytes = sum(p.numel() * 4 for p in model.parameters()) * 3
    saves = args.steps // args.every if args.variant != "none" else 0
    print("RESULT " + json.dumps({
        "total_s": total, "median_step_s": statistics.median(steps),
        "cpu_s": cpu, "saved_gb": saves * state_bytes / 1e9}), flush=True)


def paired_windows(args, train_step, save, drain, saver):
    """--pairs: each pair's windows, with a save and without, timed."""
    saves = 0

    def window(with_save):
        nonlocal saves
        start = time.perf_counter()
        for i in range(args.every):
            train_step()
            if with_save and i == 0:
                saves += 1
                save(saves)
        drain()
        return time.perf_counter() - start

    window(True)  # one more of each first: steady state
    window(False)
    ratios, with_s, without_s = [], [], []
    for pair in range(args.pairs):
        if pair % 2 == 0:
            a, b = window(True), window(False)
        else:
            b, a = window(False), window(True)
        ratios.append(a / b - 1)
        with_s.append(a)
        without_s.append(b)
    if saver is not None:
        saver.close()
    quartiles = (statistics.quantiles(ratios, n=4) if len(ratios) > 1
                 else ratios * 3)
    print("RESULT " + json.dumps({
        "overhead_median": statistics.median(ratios),
        "overhead_q1": quartiles[0], "overhead_q3": quartiles[2],
        "overhead_pairs": ratios,
        "window_s_with_save": statistics.median(with_s),
        "window_s_without": statistics.median(without_s)}), flush=True)


def report(rows, as_json, line):
    """Prints `rows` as JSON, or a line each: line(name, row) for those
    that ran."""
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    for name, r in rows.items():
        if "error" in r:
            print(f"{name:<13} FAILED: {r['error']}")
        else:
            print(f"{name:<13} {line(r)}")


def pairs_line(r):
    return (f"a window of steps with a save vs without: "
            f"{100 * r['overhead_median']:+.1f}% (median of "
            f"{len(r['overhead_pairs'])} pairs; quartiles "
            f"{100 * r['overhead_q1']:+.1f}% ... "
            f"{100 * r['overhead_q3']:+.1f}%), windows "
            f"{r['window_s_with_save']:.3f} s and "
            f"{r['window_s_without']:.3f} s")


def totals_line(r):
    extra = (f", {r['cpu_s_per_gb']:.2f} CPU-s per GB saved"
             if "cpu_s_per_gb" in r else "")
    return (f"total {r['total_s']:.2f} s "
            f"({100 * r.get('overhead_total', 0):+.1f}%), median step "
            f"{r['median_step_s'] * 1e3:.0f} ms "
            f"({100 * r.get('overhead_median_step', 0):+.1f}%){extra}")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--pairs", type=int, default=0,
                        help="measure in one process, in this many pairs of "
                        "windows with and without a save (see above)")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    variants = args.variants.split(",")
    if args.pairs:
        if args.pairs < 1:
            parser.error("--pairs must be at least 1")
        variants = [v for v in variants if v != "none"]
    own = args.dir is None
    args.dir = os.path.abspath(args.dir or tempfile.mkdtemp(
        prefix="hoist-train-loop.", dir="."))
    rows = {}
    try:
        for variant in variants:
            rows[variant] = benchlib.child_result(
                [sys.executable, os.path.abspath(__file__), "--child",
                 "--variant", variant, "--steps", str(args.steps), "--every",
                 str(args.every), "--pairs", str(args.pairs), "--dir",
                 args.dir])
    finally:
        if own:
            shutil.rmtree(args.dir, ignore_errors=True)
    if args.pairs:
        return report(rows, args.json, pairs_line)
    base = rows.get("none", {})
    for name, r in rows.items():
        if "error" in r or "total_s" not in base:
            continue
        r["overhead_total"] = r["total_s"] / base["total_s"] - 1
        r["overhead_median_step"] = (r["median_step_s"] /
                                     base["median_step_s"] - 1)
        if r["saved_gb"]:
            r["cpu_s_per_gb"] = (r["cpu_s"] - base["cpu_s"]) / r["saved_gb"]
    report(rows, args.json, totals_line)


if __name__ == "__main__":
    main()
