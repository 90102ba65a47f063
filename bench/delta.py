#!/usr/bin/env python3
"""Delta checkpoints (docs/delta.md): what a save writes when little changed,
against a full save and against the peers, in one run.

    .venv/bin/python bench/delta.py [--size 1GiB] [--saves 10] [--json]
                                    [--out DIR]

Two states, NumPy arrays on the host backend (float32):
  - LoRA-style fine-tune: frozen base weights (95% of the bytes) and, per
    layer, two adapters with their Adam moments (5%), which change at every
    training step; saved after every step. Systems, each in its own
    process, each saving --saves times into one root with keep=3:
      hoist_full    hoist with deltas off: the baseline, measured here;
      hoist_delta   hoist as it comes (deltas on);
      hoist_frozen  hoist with frozen= the base weights (not even copied);
      dcp           PyTorch DCP async_save, each save a new directory;
      orbax         Orbax AsyncCheckpointer (JAX CPU arrays), the same.
    Per save: time blocked (until the save call returns), save time (until
    durable; the peers' include an os.sync()), bytes written (hoist: its
    bytes minus those referenced; the peers: their files' size). The first
    save writes everything and is the warm-up: figures are the medians of
    the others. Then the bytes the root occupies on disk (st_blocks) with
    the newest 3 steps kept (the peers' older directories are removed as
    keep=3 would).
  - Pre-training state: every array changes at every step. One hoist
    manager alternates saves with deltas on and off (interleaved, so both
    see the same machine): the check's cost is the median save time with
    deltas over the median without (goal <= 1.02).
Writes DIR/delta.json (DIR: bench-results/ by default) and prints a table.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from benchlib import child_result, parse_bytes  # noqa: E402

LAYERS = 16
WIDTH = 1024
KEEP = 3
SYSTEMS = ["hoist_full", "hoist_delta", "hoist_frozen", "dcp", "orbax"]


def lora_state(size):
    """name -> float32 array: the frozen base (95%) and the changing
    adapters and moments (5%); and the names that change."""
    import numpy as np
    rng = np.random.default_rng(0)
    base_rows = max(1, int(size * 0.95) // (LAYERS * WIDTH * 4))
    # Six arrays per layer change (a, b and two moments each).
    rank = max(1, int(size * 0.05) // (LAYERS * 6 * WIDTH * 4))
    state, changing = {}, []
    for layer in range(LAYERS):
        state[f"base/l{layer}/w"] = rng.standard_normal(
            (base_rows, WIDTH), dtype=np.float32)
        for part, shape in (("a", (WIDTH, rank)), ("b", (rank, WIDTH))):
            for group in ("lora", "opt_mu", "opt_nu"):
                name = f"{group}/l{layer}/{part}"
                state[name] = rng.standard_normal(shape, dtype=np.float32)
                changing.append(name)
    return state, changing


def train(state, names, step):
    """A training step: every named array changes (in place)."""
    for name in names:
        state[name] += 1e-3 * step


def disk_bytes(path):
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            total += os.stat(os.path.join(folder, name)).st_blocks * 512
    return total


def file_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f))
               for d, _, files in os.walk(path) for f in files)


def summary(saves):
    """Medians of every save after the first (the warm-up), and samples."""
    out = {}
    for key in saves[0]:
        samples = [s[key] for s in saves[1:]]
        out[key] = statistics.median(samples)
        out[key + "_samples"] = samples
    return out


def run_hoist(args, root, **options):
    import hoist
    state, changing = lora_state(args.size)
    total = sum(a.nbytes for a in state.values())
    frozen = [n for n in state if n.startswith("base/")]
    if options.pop("frozen", False):
        options["frozen"] = frozen
    saves = []
    with hoist.CheckpointManager(root, keep=KEEP, pool_bytes=total + (
            64 << 20), **options) as mgr:
        for step in range(1, args.saves + 1):
            train(state, changing, step)
            start = time.perf_counter()
            handle = mgr.save(step, state)
            blocked = time.perf_counter() - start
            info = handle.wait()
            saves.append(dict(blocked_s=blocked,
                              save_s=time.perf_counter() - start,
                              written_bytes=info["bytes"] -
                              info["referenced_bytes"]))
        mgr.wait_until_finished()
        restored = mgr.restore(args.saves)
        verified = all(restored[n].tobytes() == state[n].tobytes()
                       for n in state)
    return dict(summary(saves), state_bytes=total, disk_bytes=disk_bytes(root),
                verified=verified)


def run_peer(args, root, save_one):
    """save_one(state, path) -> blocked seconds, returning once durable."""
    state, changing = lora_state(args.size)
    total = sum(a.nbytes for a in state.values())
    saves, paths = [], []
    for step in range(1, args.saves + 1):
        train(state, changing, step)
        path = os.path.join(root, str(step))
        start = time.perf_counter()
        blocked = save_one(state, path)
        os.sync()
        saves.append(dict(blocked_s=blocked, save_s=time.perf_counter() - start,
                          written_bytes=file_bytes(path)))
        paths.append(path)
        if len(paths) > KEEP:  # as keep=3 would
            shutil.rmtree(paths[-KEEP - 1])
    return dict(summary(saves), state_bytes=total, disk_bytes=disk_bytes(root))


def dcp_saver():
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29519",
                                rank=0, world_size=1)

    def save_one(state, path):
        tensors = {n: torch.from_numpy(a) for n, a in state.items()}
        start = time.perf_counter()
        future = dcp.async_save(tensors, checkpoint_id=path)
        blocked = time.perf_counter() - start
        future.result()
        return blocked
    return save_one


def orbax_saver():
    import jax
    import orbax.checkpoint as ocp
    ckptr = ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler())

    def save_one(state, path):
        arrays = {n: jax.device_put(a) for n, a in state.items()}
        jax.block_until_ready(arrays)
        start = time.perf_counter()
        ckptr.save(path, args=ocp.args.StandardSave(arrays))
        blocked = time.perf_counter() - start
        ckptr.wait_until_finished()
        return blocked
    return save_one


def run_pretrain(args, root):
    """Every array changes at every step; saves alternate deltas on/off."""
    import hoist
    state, _ = lora_state(args.size)
    names = list(state)
    total = sum(a.nbytes for a in state.values())
    times = {True: [], False: []}
    with hoist.CheckpointManager(root, keep=2, pool_bytes=total + (
            64 << 20)) as mgr:
        for step in range(1, 2 * args.saves + 1):
            train(state, names, step)
            deltas = step % 2 == 0
            start = time.perf_counter()
            info = mgr.save(step, state, deltas=deltas).wait()
            if step > 2:  # the first of each is the warm-up
                times[deltas].append(time.perf_counter() - start)
            assert info["referenced_bytes"] == 0
    on, off = statistics.median(times[True]), statistics.median(times[False])
    return dict(save_deltas_s=on, save_full_s=off, check_cost=on / off,
                save_deltas_s_samples=times[True],
                save_full_s_samples=times[False], state_bytes=total)


def child(args):
    root = os.path.join(args.dir, args.child)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    if args.child == "hoist_full":
        result = run_hoist(args, root, deltas=False)
    elif args.child == "hoist_delta":
        result = run_hoist(args, root)
    elif args.child == "hoist_frozen":
        result = run_hoist(args, root, frozen=True)
    elif args.child == "dcp":
        result = run_peer(args, root, dcp_saver())
    elif args.child == "orbax":
        result = run_peer(args, root, orbax_saver())
    else:
        result = run_pretrain(args, root)
    shutil.rmtree(root, ignore_errors=True)
    print("RESULT " + json.dumps(result), flush=True)


def ratio(a, b):
    return None if not a or not b else a / b


def table(report):
    lines = [f"LoRA-style fine-tune, {report['state_bytes'] / 2**20:.0f} MiB "
             f"state (95% frozen), {report['saves']} saves, keep={KEEP}",
             f"{'system':14} {'blocked s':>10} {'save s':>8} "
             f"{'written MiB':>12} {'on disk MiB':>12}"]
    for name in SYSTEMS:
        r = report["lora"].get(name, {})
        if "error" in r:
            lines.append(f"{name:14} {r['error']}")
            continue
        lines.append(f"{name:14} {r['blocked_s']:10.3f} {r['save_s']:8.3f} "
                     f"{r['written_bytes'] / 2**20:12.1f} "
                     f"{r['disk_bytes'] / 2**20:12.1f}")
    lines.append("")
    for key, value in report["ratios"].items():
        lines.append(f"{key:44} {value:.3f}" if value is not None
                     else f"{key:44} -")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=parse_bytes, default=1 << 30,
                        help="the state's bytes (default 1GiB)")
    parser.add_argument("--saves", type=int, default=10,
                        help="saves per system, the first a warm-up "
                        "(default 10)")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench-results"))
    parser.add_argument("--json", action="store_true",
                        help="print the report as JSON")
    parser.add_argument("--dir", help="where the roots go (default: a new "
                        "directory in the repository, removed after)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.saves < 3:
        parser.error("--saves must be at least 3")
    if args.child:
        child(args)
        return
    work = tempfile.mkdtemp(prefix="hoist-delta-", dir=args.dir or ROOT)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    report = {"size": args.size, "saves": args.saves, "lora": {}}
    try:
        for name in SYSTEMS + ["pretrain"]:
            result = child_result(
                [sys.executable, os.path.abspath(__file__), "--child", name,
                 "--size", str(args.size), "--saves", str(args.saves),
                 "--dir", work], env)
            if name == "pretrain":
                report["pretrain"] = result
            else:
                report["lora"][name] = result
            print(f"{name}: done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lora = report["lora"]
    full = lora.get("hoist_full", {})
    report["state_bytes"] = full.get("state_bytes", 0)

    def of(system, key):
        return lora.get(system, {}).get(key)
    report["ratios"] = {
        "written / full save (delta; goal <= 0.08)": ratio(
            of("hoist_delta", "written_bytes"), of("hoist_full", "written_bytes")),
        "save time / full save (delta)": ratio(
            of("hoist_delta", "save_s"), of("hoist_full", "save_s")),
        "save time / full save (frozen)": ratio(
            of("hoist_frozen", "save_s"), of("hoist_full", "save_s")),
        "blocked / full save's (frozen)": ratio(
            of("hoist_frozen", "blocked_s"), of("hoist_full", "blocked_s")),
        "on disk / one state (delta, keep=3; goal <= 1.3)": ratio(
            of("hoist_delta", "disk_bytes"), report["state_bytes"]),
        "on disk / one state (full, keep=3)": ratio(
            of("hoist_full", "disk_bytes"), report["state_bytes"]),
        "DCP save time / hoist delta's": ratio(
            of("dcp", "save_s"), of("hoist_delta", "save_s")),
        "Orbax save time / hoist delta's": ratio(
            of("orbax", "save_s"), of("hoist_delta", "save_s")),
        "pre-training: save with deltas / without (goal <= 1.02)":
            report.get("pretrain", {}).get("check_cost"),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "delta.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1) if args.json else table(report))


if __name__ == "__main__":
    main()
