#!/usr/bin/env python3
"""hoist against its peers and this machine's limits, in one run.

    .venv/bin/python bench/peers.py [--size 2GiB] [--json] [--out DIR]

Measures, on the same GPT-style arrays (hoist's sample model: bf16 weights,
fp32 Adam moments, sharded over a 2 x 4 mesh of JAX CPU devices exactly as
`hoist demo` shards them):
  - the machine: single-thread memcpy GB/s (transfer_bench), and the
    disk's write and read limit for the same bytes as fio drives it
    (io_uring, 4 jobs x queue depth 16, O_DIRECT; save_bench);
  - the published experiments: per-slice vs batched dispatch at 4,800
    slices, sequential vs parallel waits (transfer_bench);
  - every system's save (time blocked: until the save call returns; save:
    until durable), restore onto the same sharding and onto another one, and
    peak RSS (and how much the RSS grew during each restore), each in its
    own process: hoist (Python, JAX arrays), hoist (Python, torch tensors),
    hoist (Python, NumPy arrays), hoist (C++, save_bench), Orbax, PyTorch DCP
    (async_save; and save), torch.save, numpy.save, TensorStore (zarr3);
  - scaling: hoist's time blocked and save throughput against model size and
    against writer streams.
Writes DIR/peers.json and DIR/peers.svg (DIR: bench-results/ by default) and
prints a table (or, with --json, the JSON object). A peer that cannot be
imported or fails is reported with its error.

Every system saves once untimed first (warm-up: imports, thread pools,
compilation), then the timed save; that --saves times (default 3), each
time blocked and save time the median of them (the samples are kept beside
each, as "<figure>_samples"). Durability: hoist writes with O_DIRECT and fsyncs every file and directory;
the others are followed by os.sync() inside their timed save; before every
restore the page cache is emptied (echo 3 > /proc/sys/vm/drop_caches where
permitted, else every checkpoint file is evicted with
posix_fadvise(DONTNEED), checked with fincore; the report says which). A
restore's timing starts before the system's own set-up: for hoist, opening
the manager (its pool) is inside it.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from benchlib import (GIB, HOIST, SAVE_BENCH, TRANSFER_BENCH, abstract_jax,
                      array_list, child_result, cpp_json, dcp_group,
                      drop_caches, host_arrays, jax_arrays, parse_bytes,
                      peak_rss, same, target_shardings, torch_tensors, warmed)

SYSTEMS = ["hoist", "hoist_torch", "hoist_numpy", "hoist_cpp", "orbax", "dcp",
           "torch_checkpointing", "torch", "numpy", "tensorstore"]


# -- one system, in a child process --------------------------------------------


# How much the resident set grew during the last timed() call: its peak
# minus what the process held before (the restored arrays are part of it).
RSS_GROWTH = {}


def proc_status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rss_window_start():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak restarts from the current RSS
    RSS_GROWTH["before"] = proc_status_bytes("VmRSS")


def rss_window_end():
    RSS_GROWTH["bytes"] = proc_status_bytes("VmHWM") - RSS_GROWTH["before"]


def timed(fn):
    rss_window_start()
    start = time.perf_counter()
    value = fn()
    seconds = time.perf_counter() - start
    rss_window_end()
    return value, seconds


# Each system: save(specs, host, path, args) -> figures, leaving its
# checkpoint in `path`; restore(specs, path, other) -> the restored arrays by
# name (other: onto the 4 x 2 mesh; systems without shardings have none).
# The parent runs the save and each restore in a process of its own, as a
# job that restarts would, and drops the page cache before each restore.


# --hoist-pool in a child: "whole" (a pool that holds the save), "default"
# (hoist's own default, 1 GiB, and the overflow past it), or bytes.
HOIST_POOL = "whole"


def hoist_pool(total):
    """The pool_bytes keyword hoist's managers get (none: the default)."""
    if HOIST_POOL == "whole":
        return {"pool_bytes": total + total // 16 + (64 << 20)}
    if HOIST_POOL == "default":
        return {}
    return {"pool_bytes": parse_bytes(HOIST_POOL)}


def hoist_save_timed(path, state, total, args):
    """A manager with the --hoist-pool pool (by default one that holds the
    whole save), a warm-up save, then the timed one: (blocked s, durable
    s)."""
    import hoist
    with hoist.CheckpointManager(path, writers=args.writers,
                                 **hoist_pool(total)) as mgr:
        mgr.save(0, state).wait()  # warm-up
        mgr.delete(0)
        os.sync()
        start = time.perf_counter()
        handle = mgr.save(1, state)
        blocked = time.perf_counter() - start
        handle.wait()
        return blocked, time.perf_counter() - start


def hoist_restore(path, like, total):
    """Opens a manager with the pool the save used (as a job that restarts,
    restores and then trains and saves) and restores: the timing includes
    the opening (closing, like the peers' teardown, is not timed)."""
    import hoist
    rss_window_start()
    start = time.perf_counter()
    mgr = hoist.CheckpointManager(path, **hoist_pool(total))
    out = mgr.restore(1, like=like)
    seconds = time.perf_counter() - start
    rss_window_end()
    mgr.close()
    return out, seconds


HOIST_DURABILITY = "O_DIRECT writes + fsync of files and dirs"


def jax_state(specs, host):
    return jax_arrays(specs, host)[0]


def save_hoist(arrays, host, path, args):
    total = sum(a.nbytes for a in host.values())
    blocked, save = hoist_save_timed(path, arrays, total, args)
    return dict(blocked_s=blocked, save_s=save, durability=HOIST_DURABILITY)


def restore_hoist(specs, path, other):
    import jax
    import numpy as np
    like = abstract_jax(specs, target_shardings(specs, other))
    total = sum(int(np.prod(s.shape)) * s.dtype.itemsize
                for s in like.values())
    out, seconds = hoist_restore(path, like, total)
    return jax.block_until_ready(out), seconds


def save_hoist_torch(tensors, host, path, args):
    total = sum(a.nbytes for a in host.values())
    blocked, save = hoist_save_timed(path, tensors, total, args)
    return dict(blocked_s=blocked, save_s=save, durability=HOIST_DURABILITY)


def restore_hoist_torch(specs, path, other):
    import hoist
    import torch
    like = {s["name"]: torch.empty(s["shape"], dtype=getattr(torch,
                                                              s["dtype"]))
            for s in specs}  # the template a training job has
    total = sum(t.numel() * t.element_size() for t in like.values())
    return hoist_restore(path, like, total)


def save_hoist_numpy(state, host, path, args):
    total = sum(a.nbytes for a in host.values())
    blocked, save = hoist_save_timed(path, state, total, args)
    return dict(blocked_s=blocked, save_s=save, durability=HOIST_DURABILITY)


def restore_hoist_numpy(specs, path, other):
    like = host_arrays(specs, fill=False)  # the template a job has
    total = sum(a.nbytes for a in like.values())
    return hoist_restore(path, like, total)


def save_orbax(arrays, host, path, args):
    import orbax.checkpoint as ocp
    tree = {"state": arrays}
    ckptr = ocp.AsyncCheckpointer(ocp.StandardCheckpointHandler())
    ckptr.save(os.path.join(path, "warm"), args=ocp.args.StandardSave(tree))
    ckptr.wait_until_finished()
    warmed(os.path.join(path, "warm"))
    start = time.perf_counter()
    ckptr.save(os.path.join(path, "1"), args=ocp.args.StandardSave(tree))
    blocked = time.perf_counter() - start
    ckptr.wait_until_finished()
    os.sync()
    save = time.perf_counter() - start
    ckptr.close()
    return dict(blocked_s=blocked, save_s=save,
                durability="os.sync() after wait_until_finished, timed")


def restore_orbax(specs, path, other):
    import jax
    import orbax.checkpoint as ocp
    abstract = {"state": abstract_jax(specs, target_shardings(specs, other))}
    ckptr = ocp.Checkpointer(ocp.StandardCheckpointHandler())
    out, seconds = timed(lambda: jax.block_until_ready(ckptr.restore(
        os.path.join(path, "1"), args=ocp.args.StandardRestore(abstract))))
    return out["state"], seconds


def save_dcp(tensors, host, path, args):
    import torch.distributed.checkpoint as dcp
    dcp_group()
    dcp.async_save(tensors, checkpoint_id=os.path.join(path, "w")).result()
    warmed(os.path.join(path, "w"))
    start = time.perf_counter()
    future = dcp.async_save(tensors, checkpoint_id=os.path.join(path, "a"))
    blocked = time.perf_counter() - start
    future.result()
    os.sync()
    save = time.perf_counter() - start
    _, save_sync = timed(lambda: (dcp.save(
        tensors, checkpoint_id=os.path.join(path, "s")), os.sync()))
    warmed(os.path.join(path, "s"))
    return dict(blocked_s=blocked, save_s=save, save_sync_s=save_sync,
                durability="os.sync() after the future, timed")


def restore_dcp(specs, path, other):
    import torch
    import torch.distributed.checkpoint as dcp
    dcp_group()
    target = {s["name"]: torch.empty(s["shape"], dtype=getattr(torch,
                                                                s["dtype"]))
              for s in specs}
    _, seconds = timed(lambda: dcp.load(
        target, checkpoint_id=os.path.join(path, "a")))
    return target, seconds


def checkpointing_manager(saving=True):
    """Meta's torch-checkpointing (torchtitan 0.3's other manager) as it
    runs on a host without CUDA: staging in pageable memory (pinning needs
    CUDA) and buffered writes (its O_DIRECT writes unaligned buffers, which
    ext4 refuses with EINVAL); its async saver to save (a writer
    subprocess), its sync one to load (no subprocess to start)."""
    from torch_checkpointing.checkpoint_manager import CheckpointManager
    from torch_checkpointing.config import (
        AsyncCheckpointSaverConfig, SyncCheckpointSaverConfig)
    from torch_checkpointing.staging import CheckpointStagerConfig
    from torch_checkpointing.storage.filesystem import (
        LocalFileSystemStorageConfig)
    saver = (AsyncCheckpointSaverConfig(staging_config=CheckpointStagerConfig(
        use_pinned_memory=False)) if saving else SyncCheckpointSaverConfig())
    return CheckpointManager.Config(
        save=saver, storage_config=LocalFileSystemStorageConfig(
            use_direct_io=False)).build()


def save_torch_checkpointing(tensors, host, path, args):
    manager = checkpointing_manager()
    try:  # the warm-up save starts its writer subprocess
        manager.save(os.path.join(path, "w"), {"model": tensors}).result()
        warmed(os.path.join(path, "w"))
        start = time.perf_counter()
        future = manager.save(os.path.join(path, "a"), {"model": tensors})
        # It stages in the background: the training loop's next in-place
        # update waits, under its lock, until the capture is done.
        with manager.lock():
            blocked = time.perf_counter() - start
        future.result()
        os.sync()
        save = time.perf_counter() - start
    finally:
        manager.close()
    return dict(blocked_s=blocked, save_s=save,
                durability="os.sync() after the future, timed; blocked "
                "until its staging lock frees")


def restore_torch_checkpointing(specs, path, other):
    import torch
    target = {s["name"]: torch.empty(s["shape"], dtype=getattr(torch,
                                                                s["dtype"]))
              for s in specs}

    def load():
        manager = checkpointing_manager(saving=False)
        try:
            return manager.load(os.path.join(path, "a"),
                                into={"model": target})["model"]
        finally:
            manager.close()
    return timed(load)


def save_torch(tensors, host, path, args):
    import torch
    file = os.path.join(path, "state.pt")
    os.makedirs(path, exist_ok=True)

    def save():
        with open(file, "wb") as f:
            torch.save(tensors, f)
            f.flush()
            os.fsync(f.fileno())

    save()  # warm-up
    warmed(file)
    _, save_s = timed(save)
    return dict(blocked_s=save_s, save_s=save_s,
                durability="fsync of the file, timed")


def restore_torch(specs, path, other):
    import torch
    return timed(lambda: torch.load(os.path.join(path, "state.pt")))


def npy_file(path, i):
    return os.path.join(path, "%05d.npy" % i)


def save_numpy(state, host, path, args):
    import numpy as np
    os.makedirs(path, exist_ok=True)

    def save():
        for i, a in enumerate(host.values()):
            with open(npy_file(path, i), "wb") as f:
                # bfloat16 as raw bytes: .npy has no such dtype
                np.save(f, a.view(np.uint8) if a.dtype.name == "bfloat16"
                        else a)
                f.flush()
                os.fsync(f.fileno())
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)

    save()  # warm-up
    for i in range(len(host)):
        warmed(npy_file(path, i))
    _, save_s = timed(save)
    return dict(blocked_s=save_s, save_s=save_s,
                durability="fsync of every file and the dir, timed")


def restore_numpy(specs, path, other):
    import ml_dtypes
    import numpy as np

    def load():
        out = {}
        for i, s in enumerate(specs):
            a = np.load(npy_file(path, i))
            if s["dtype"] == "bfloat16":
                a = a.view(ml_dtypes.bfloat16)
            out[s["name"]] = a
        return out

    return timed(load)


def zarr_spec(path, i, a=None):
    spec = {"driver": "zarr3",
            "kvstore": {"driver": "file", "path": os.path.join(path,
                                                               "%05d" % i)}}
    if a is not None:
        spec["metadata"] = {"shape": list(a.shape) or [1],
                            "data_type": a.dtype.name}
    return spec


def save_tensorstore(state, host, path, args):
    import tensorstore as ts

    def save():
        futures = []
        for i, a in enumerate(host.values()):
            store = ts.open(zarr_spec(path, i, a), create=True,
                            delete_existing=True).result()
            futures.append(store.write(a.reshape(a.shape or (1,))))
        for f in futures:
            f.result()
        os.sync()

    save()  # warm-up
    for i in range(len(host)):
        warmed(os.path.join(path, "%05d" % i))
    _, save_s = timed(save)
    return dict(blocked_s=save_s, save_s=save_s,
                durability="os.sync() after the writes, timed")


def restore_tensorstore(specs, path, other):
    import numpy as np
    import tensorstore as ts

    def load():
        return {s["name"]: np.asarray(ts.open(zarr_spec(path, i)).result()
                                      .read().result()).reshape(s["shape"])
                for i, s in enumerate(specs)}

    return timed(load)


def host_state(specs, host):
    return host


def torch_state(specs, host):
    return torch_tensors(host)


# system: (the arrays in its own form, save, restore, restores onto 4 x 2)
RUNNERS = {"hoist": (jax_state, save_hoist, restore_hoist, True),
           "hoist_torch": (torch_state, save_hoist_torch, restore_hoist_torch,
                           False),
           "hoist_numpy": (host_state, save_hoist_numpy, restore_hoist_numpy,
                           False),
           "orbax": (jax_state, save_orbax, restore_orbax, True),
           "dcp": (torch_state, save_dcp, restore_dcp, False),
           "torch_checkpointing": (torch_state, save_torch_checkpointing,
                                   restore_torch_checkpointing, False),
           "torch": (torch_state, save_torch, restore_torch, False),
           "numpy": (host_state, save_numpy, restore_numpy, False),
           "tensorstore": (host_state, save_tensorstore, restore_tensorstore,
                           False)}


def child(args):
    global HOIST_POOL
    HOIST_POOL = args.hoist_pool
    specs = array_list(args.size)
    path = os.path.join(args.dir, args.child)
    prepare, save, restore, _ = RUNNERS[args.child]
    if args.phase == "save":
        host = host_arrays(specs)
        state = prepare(specs, host)
        base = peak_rss()  # the arrays, in the system's own form
        # --saves timed saves (each after the system's own warm-up), each
        # into a fresh path; the last one is what the restores read. Every
        # time is the median over them, its samples kept beside it.
        runs = []
        for _ in range(args.saves):
            warmed(path)
            runs.append(save(state, host, path, args))
        result = dict(runs[-1])
        for key, value in runs[-1].items():
            if key.endswith("_s") and isinstance(value, (int, float)):
                samples = [r[key] for r in runs]
                result[key] = statistics.median(samples)
                result[key + "_samples"] = samples
        result["peak_rss_over_arrays_bytes"] = peak_rss() - base
    else:
        out, seconds = restore(specs, path, args.phase == "restore_other")
        result = {"seconds": seconds,
                  "rss_growth_bytes": RSS_GROWTH.get("bytes")}
        result["verified"] = same(out, host_arrays(specs))
    result["peak_rss_bytes"] = peak_rss()
    print("RESULT " + json.dumps(result), flush=True)


def run_child(system, phase, args):
    env = dict(os.environ)
    env.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    env.setdefault("JAX_PLATFORMS", "cpu")
    result = child_result(
        [sys.executable, os.path.abspath(__file__), "--child", system,
         "--phase", phase, "--size", str(args.size), "--dir", args.dir,
         "--writers", str(args.writers), "--saves", str(args.saves),
         "--hoist-pool", args.hoist_pool], env)
    if "error" in result:
        result["error"] = f"{phase}: {result['error']}"
    return result


def run_system(system, args):
    """Save, then restore (and restore onto 4 x 2), each in a new process."""
    result = run_child(system, "save", args)
    phases = ["restore"] + (["restore_other"] if RUNNERS[system][3] else [])
    result["restore_other_s"] = None
    try:
        for phase in phases:
            if "error" in result:
                break
            cache = drop_caches(os.path.join(args.dir, system))
            result["cache"] = cache
            r = run_child(system, phase, args)
            if "error" in r:
                result = {"error": r["error"]}
                break
            result[phase + "_s"] = r["seconds"]
            result[phase + "_rss_growth_bytes"] = r["rss_growth_bytes"]
            result["verified"] = result.get("verified", True) and r["verified"]
            result["peak_rss_bytes"] = max(result["peak_rss_bytes"],
                                           r["peak_rss_bytes"])
            result[phase + "_peak_rss_bytes"] = r["peak_rss_bytes"]
    finally:
        shutil.rmtree(os.path.join(args.dir, system), ignore_errors=True)
    return result


# -- the C++ benchmarks ----------------------------------------------------------


def save_bench(size, directory, writers=2, pool=None, repeats=1):
    command = [SAVE_BENCH, "--bytes", str(size), "--dir", directory,
               "--writers", str(writers), "--repeats", str(repeats), "--json",
               "--no-blocked"]
    if pool is not None:
        command += ["--pool", str(pool)]
    return cpp_json(command)


# -- the report -------------------------------------------------------------------


def svg_chart(report):
    """Bars: save GB/s, restore GB/s and time blocked per system."""
    rows = [(name, r) for name, r in report["systems"].items()
            if "error" not in r]
    width, row_h, left = 860, 26, 130
    panels = [("save GB/s (durable)", "save_gbps", report["raw_write_gbps"],
               "raw O_DIRECT write"),
              ("restore GB/s", "restore_gbps", report["raw_read_gbps"],
               "raw O_DIRECT read"),
              ("time blocked, s", "blocked_s", report["memcpy_bound_s"],
               "bytes / memcpy rate")]
    height = 40 + len(panels) * (len(rows) * row_h + 60)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" font-family="sans-serif" font-size="12">',
           f'<rect width="100%" height="100%" fill="white"/>',
           f'<text x="10" y="20" font-size="15">hoist vs peers: '
           f'{report["bytes"] / GIB:.2f} GiB, {report["machine"]}</text>']
    y = 40
    for title, key, limit, limit_name in panels:
        values = [r.get(key) or 0 for _, r in rows]
        top = max(values + [limit or 0]) * 1.1 or 1
        scale = (width - left - 40) / top
        out.append(f'<text x="10" y="{y + 14}" font-weight="bold">{title}'
                   f'</text>')
        y += 24
        for (name, r), v in zip(rows, values):
            color = "#d95f02" if name.startswith("hoist") else "#7570b3"
            out.append(f'<text x="10" y="{y + 15}">{name}</text>')
            out.append(f'<rect x="{left}" y="{y + 3}" width="{v * scale:.1f}"'
                       f' height="{row_h - 8}" fill="{color}"/>')
            out.append(f'<text x="{left + v * scale + 4:.1f}" y="{y + 15}">'
                       f'{v:.3g}</text>')
            y += row_h
        if limit:
            x = left + limit * scale
            out.append(f'<line x1="{x:.1f}" y1="{y - len(rows) * row_h}" '
                       f'x2="{x:.1f}" y2="{y}" stroke="black" '
                       f'stroke-dasharray="4,3"/>')
            anchor = "end" if x > width / 2 else "start"
            out.append(f'<text x="{x:.1f}" y="{y + 12}" text-anchor='
                       f'"{anchor}">{limit_name} {limit:.3g}</text>')
        y += 36
    out.append("</svg>")
    return "\n".join(out)


def fmt(v, unit=""):
    if v is None:
        return "-"
    return f"{v:.3f}{unit}" if isinstance(v, float) else str(v)


def table(report):
    lines = [f"{report['bytes'] / GIB:.2f} GiB, {report['arrays']} arrays; "
             f"{report['machine']}",
             f"memcpy {report['memcpy_gbps']:.2f} GB/s (bytes/memcpy = "
             f"{report['memcpy_bound_s']:.3f} s); disk limit (fio-like: "
             f"io_uring, 4 jobs x queue depth 16) write "
             f"{report['raw_write_gbps']:.2f} GB/s, read "
             f"{report['raw_read_gbps']:.2f} GB/s; page cache emptied before "
             f"restores: {report.get('cache', report['cache_dropped'])}", "",
             f"{'system':<12} {'blocked s':>10} {'save s':>8} {'save GB/s':>10}"
             f" {'restore s':>10} {'other sh.':>10} {'rest. RSS':>9}"
             f" {'peak RSS':>9} "
             f"{'ok':>3}  durability"]
    for name, r in report["systems"].items():
        if "error" in r:
            lines.append(f"{name:<12} FAILED: {r['error']}")
            continue
        lines.append(
            f"{name:<12} {fmt(r.get('blocked_s')):>10} {fmt(r['save_s']):>8}"
            f" {fmt(r.get('save_gbps')):>10} {fmt(r.get('restore_s')):>10}"
            f" {fmt(r.get('restore_other_s')):>10}"
            f" {(r.get('restore_rss_growth_bytes') or 0) / GIB:>8.2f}G"
            f" {(r.get('peak_rss_bytes') or 0) / GIB:>8.2f}G"
            f" {'yes' if r.get('verified') else 'NO':>3}  "
            f"{r.get('durability', '')}")
    lines.append("")
    lines.append("published: dispatches %d -> %d at %d slices, staging "
                 "%.1f -> %.1f ms; sequential vs parallel %.1f -> %.1f ms" % (
                     report["published"]["dispatches_per_slice"],
                     report["published"]["dispatches_batched"],
                     report["published"]["slices_a"],
                     report["published"]["staging_s_per_slice"] * 1e3,
                     report["published"]["staging_s_batched"] * 1e3,
                     report["published"]["staging_s_sequential"] * 1e3,
                     report["published"]["staging_s_parallel"] * 1e3))
    lines.append("scaling (hoist C++, pool = whole save): " + "; ".join(
        f"{s['bytes'] / GIB:g} GiB: blocked {s['blocked_s']:.3f} s, "
        f"{s['save_gbps']:.2f} GB/s" for s in report["scaling_size"]))
    lines.append("writer streams: " + "; ".join(
        f"{s['writers']}: {s['save_gbps']:.2f} GB/s"
        for s in report["scaling_writers"]))
    lines.append("")
    lines.extend(f"target {t['target']}: {'met' if t['met'] else 'MISSED'}"
                 f" ({t['detail']})" for t in report["targets"])
    return "\n".join(lines)


def targets(report):
    hoist = report["systems"].get("hoist", {"error": "not run"})
    cpp = report["systems"].get("hoist_cpp", {})
    peers = {n: r for n, r in report["systems"].items()
             if not n.startswith("hoist") and "error" not in r}
    out = []
    if "error" not in hoist:
        slower = [n for n, r in peers.items() if r["blocked_s"] <=
                  hoist["blocked_s"]]
        out.append({"target": "blocks less than every peer",
                    "met": bool(peers) and not slower,
                    "detail": f"hoist {hoist['blocked_s']:.3f} s; not beaten:"
                              f" {slower or 'none'}"})
        slower = [n for n, r in peers.items() if r["save_s"] <=
                  hoist["save_s"]]
        out.append({"target": "saves faster than every peer",
                    "met": bool(peers) and not slower,
                    "detail": f"hoist {hoist['save_s']:.3f} s; not beaten: "
                              f"{slower or 'none'}"})
        ratio = hoist["save_gbps"] / report["raw_write_gbps"]
        out.append({"target": ">= 85% of raw write", "met": ratio >= 0.85,
                    "detail": f"{ratio:.2f} x raw (Python, JAX arrays); C++: "
                              f"{cpp.get('save_gbps', 0) / report['raw_write_gbps']:.2f} x"})
        ratio = cpp.get("restore_gbps", 0) / report["raw_read_gbps"]
        out.append({"target": "C++ restore >= 0.9 of the disk's read limit",
                    "met": ratio >= 0.9,
                    "detail": f"{ratio:.2f} x; Python onto JAX arrays: "
                              f"{hoist['restore_gbps'] / report['raw_read_gbps']:.2f} x"})
        bound = 1.1 * report["memcpy_bound_s"]
        out.append({"target": "blocked <= 1.1 x bytes / memcpy rate",
                    "met": hoist["blocked_s"] <= bound,
                    "detail": f"{hoist['blocked_s']:.3f} s vs {bound:.3f} s"})
    # Every restore faster than its peers' by >= 10%.
    systems = report["systems"]
    for ours, theirs, key in (("hoist_torch", "torch", "restore_s"),
                              ("hoist_torch", "dcp", "restore_s"),
                              ("hoist_numpy", "numpy", "restore_s"),
                              ("hoist", "orbax", "restore_s"),
                              ("hoist", "orbax", "restore_other_s")):
        a, b = systems.get(ours, {}), systems.get(theirs, {})
        if a.get(key) is None or b.get(key) is None:
            continue
        out.append({"target": f"{ours} {key[:-2].replace('_', ' ')} >= 10% "
                              f"faster than {theirs}",
                    "met": a[key] <= 0.9 * b[key],
                    "detail": f"{a[key]:.3f} s vs {b[key]:.3f} s "
                              f"({b[key] / a[key]:.2f}x)"})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="2GiB",
                        help="model size (default 2GiB)")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help="comma-separated subset of " + ",".join(SYSTEMS))
    parser.add_argument("--scaling-sizes", default="0.25GiB,0.5GiB,1GiB,2GiB,"
                        "4GiB", help="model sizes for the scaling figures")
    parser.add_argument("--writers", type=int, default=2,
                        help="hoist writer streams (default 2)")
    parser.add_argument("--saves", type=int, default=3,
                        help="timed saves per system (each after its "
                        "warm-up; times are medians; default 3)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds of the disk limit and hoist "
                        "C++ (medians; default 3)")
    parser.add_argument("--scaling-writers", default="1,2,4",
                        help="writer streams for the scaling figures")
    parser.add_argument("--published-bytes", default="1GiB",
                        help="model size of the published experiments' (b) "
                        "(bench/transfer_bench --model-bytes; default 1GiB)")
    parser.add_argument("--published-repeats", type=int, default=5,
                        help="timed runs per published figure (median; "
                        "default 5)")
    parser.add_argument("--dir", default=None,
                        help="scratch directory on the disk to measure "
                        "(default: a new one here, removed after)")
    parser.add_argument("--out", default="bench-results",
                        help="where peers.json and peers.svg go")
    parser.add_argument("--json", action="store_true",
                        help="print the figures as one JSON object")
    parser.add_argument("--hoist-pool", default="whole",
                        help="hoist's staging pool in the Python systems: "
                        "whole (default: it holds the save), default "
                        "(hoist's own: 1 GiB, and host memory within "
                        "host_memory_budget past it), or bytes")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.size = parse_bytes(args.size)
    if args.child:
        return child(args)
    for binary in (HOIST, SAVE_BENCH, TRANSFER_BENCH):
        if not os.path.exists(binary):
            sys.exit(f"{binary} is missing: run tools/demo.sh first")
    own_dir = args.dir is None
    args.dir = os.path.abspath(args.dir or f"hoist-peers.{os.getpid()}")
    os.makedirs(args.dir, exist_ok=True)
    log = (lambda *a: None) if args.json else (
        lambda *a: print(*a, file=sys.stderr, flush=True))
    try:
        specs = array_list(args.size)
        report = {"bytes": 0, "arrays": len(specs),
                  "machine": f"{os.cpu_count()} cores, "
                  f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / GIB:.0f} GiB RAM"}
        log("== machine limits and the published experiments")
        published = cpp_json([TRANSFER_BENCH, "--json", "--model-bytes",
                              args.published_bytes, "--repeats",
                              str(args.published_repeats)])
        report["published"] = published
        report["memcpy_gbps"] = published["memcpy_gbps"]
        # Raw write/read and hoist C++ in alternating rounds (medians).
        cpp = save_bench(args.size, args.dir, args.writers,
                         pool=int(args.size * 1.07) + (64 << 20),
                         repeats=args.rounds)
        report["bytes"] = cpp["bytes"]
        report["raw_write_gbps"] = cpp["raw_write_gbps"]
        report["raw_read_gbps"] = cpp["raw_read_gbps"]
        report["memcpy_bound_s"] = cpp["bytes"] / (report["memcpy_gbps"] * 1e9)
        report["cache"] = drop_caches(args.dir)
        report["cache_dropped"] = report["cache"] != "no"
        report["systems"] = {}
        for system in args.systems.split(","):
            log(f"== {system}")
            if system == "hoist_cpp":
                r = dict(blocked_s=cpp["staged_s"], save_s=cpp["save_s"],
                         restore_s=cpp["restore_s"], restore_other_s=None,
                         verified=cpp["verified"],
                         peak_rss_over_arrays_bytes=cpp[
                             "peak_rss_over_baseline_bytes"],
                         peak_rss_bytes=None,
                         durability="O_DIRECT writes + fsync (save_bench)")
            else:
                r = run_system(system, args)
            if "error" not in r:
                r["save_gbps"] = report["bytes"] / 1e9 / r["save_s"]
                r["restore_gbps"] = report["bytes"] / 1e9 / r["restore_s"]
            report["systems"][system] = r
        log("== scaling")
        report["scaling_size"] = []
        for size in filter(None, args.scaling_sizes.split(",")):
            b = parse_bytes(size)
            try:
                s = save_bench(b, args.dir, args.writers,
                               pool=int(b * 1.07) + (64 << 20))
            except subprocess.CalledProcessError as error:
                log(f"scaling at {size} failed: {error}")
                continue
            report["scaling_size"].append(
                {"bytes": s["bytes"], "blocked_s": s["staged_s"],
                 "save_s": s["save_s"], "save_gbps": s["save_gbps"],
                 "raw_write_gbps": s["raw_write_gbps"]})
        report["scaling_writers"] = []
        for writers in (int(w) for w in args.scaling_writers.split(",") if w):
            s = save_bench(args.size, args.dir, writers,
                           pool=int(args.size * 1.07) + (64 << 20))
            report["scaling_writers"].append(
                {"writers": writers, "save_gbps": s["save_gbps"],
                 "raw_write_gbps": s["raw_write_gbps"]})
        report["targets"] = targets(report)
    finally:
        if own_dir:
            shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "peers.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(args.out, "peers.svg"), "w") as f:
        f.write(svg_chart(report))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(table(report))
        print(f"\nwrote {args.out}/peers.json and {args.out}/peers.svg")


if __name__ == "__main__":
    main()
