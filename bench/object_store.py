#!/usr/bin/env python3
"""hoist on an object store against the client's own limit and the peers, in one run.

    .venv/bin/python bench/object_store.py [--store s3|gcs] [--size 1GiB]
        [--rounds 3] [--writers N] [--pool 256MiB]
        [--peers dcp,s3torchconnector | --peers orbax] [--no-one-object]
        [--json] [--out FILE]

Starts the server on 127.0.0.1 (testing/object_store_server.py: SeaweedFS's
S3 by default, fake-gcs-server with --store gcs), then alternates, round
after round (hoist, limit, peers, hoist, limit, peers, ...):
  - the client's limit: pyarrow on its own (Arrow's S3 or GCS filesystem,
    the library hoist uses) uploading the same bytes as as many objects as
    hoist's save wrote (its writer streams: `--writers`, or by default the
    number hoist's storage chooses, 4 on S3 and 16 on GCS) from as many
    threads, each written in 16 MiB pieces, and reading them
    back by 16 MiB ranges, 8 at a time (hoist's restore reads with 8
    threads) into new memory, in a fresh process (as hoist's restore); and
    reading the objects hoist's save wrote the same way, right after
    hoist's restore read them (the same bytes, as the server stored them);
  - the hard floor's baseline: pyarrow uploading the same bytes to ONE
    object in 16 MiB pieces (--no-one-object leaves it out: on
    fake-gcs-server each request of a resumable upload copies the object
    so far, so one object of 4 GiB takes tens of minutes);
  - hoist: a NumPy state of `--size` saved by hoist.CheckpointManager into
    s3://... or gs://... (from save() until wait() returns: committed; and
    the time save() blocked) in a fresh process that also reports its peak
    RSS growth during the save (anonymous RSS sampled every 5 ms, against
    that before the manager opened: the pool's pages included; the
    libraries an object-store root loads are not counted); then restored
    into new host memory (restore()) in another fresh process, as a job
    restores after a restart;
  - the peers (--peers), the same bytes as float32 layers of the same
    shapes, saved asynchronously and waited for in a fresh process, then
    loaded into new memory and checked in another:
      dcp               PyTorch DCP async_save / load with FsspecWriter /
                        FsspecReader over s3fs, as many threads as
                        hoist's writer streams (S3);
      s3torchconnector  DCP async_save / load with s3torchconnector's
                        S3StorageWriter / S3StorageReader, as many
                        threads (S3; AWS's CRT client);
      orbax             Orbax's CheckpointManager (async) with JAX arrays,
                        TensorStore writing to the emulator (GCS).
Reports each figure's median over the rounds with its spread, and the
ratios: hoist save / limit upload, hoist restore / limit download, hoist
save / one-object upload, and how many times faster hoist saves, blocks and
restores than each peer. The server's data directory is under /tmp and is
removed at the end.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "testing"))
import object_store_server  # noqa: E402

PIECE = 16 << 20
READERS = 8  # hoist's RestoreOptions::reader_threads default


def parse_size(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, scale in units.items():
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * scale)
    return int(text)


def arrow_fs(env):
    """Arrow's filesystem for the server in `env`: S3 (SeaweedFS) or GCS
    (fake-gcs-server, plain HTTP, no credentials)."""
    import pyarrow.fs as pafs

    if "STORAGE_EMULATOR_HOST" in env:
        host = env["STORAGE_EMULATOR_HOST"]
        return pafs.GcsFileSystem(
            anonymous=True, scheme="http",
            endpoint_override=host.split("://", 1)[-1])
    return pafs.S3FileSystem(
        endpoint_override=env["AWS_ENDPOINT_URL"], region="us-east-1",
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"])


def each_in_a_thread(fn, items):
    """Seconds for fn(item) to run for every item, each on its own thread."""
    start = time.perf_counter()
    threads = [threading.Thread(target=fn, args=(i,)) for i in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def pyarrow_upload(env, bucket, size, objects):
    """Seconds for pyarrow to upload `size` bytes as `objects` objects,
    one thread each, in 16 MiB pieces; returns (seconds, keys)."""
    fs = arrow_fs(env)
    piece = memoryview(os.urandom(PIECE))
    share = size // objects
    prefix = f"{bucket}/limit-{uuid.uuid4().hex[:8]}"
    keys = [f"{prefix}/o{i}" for i in range(objects)]

    def upload(key):
        left = share
        with fs.open_output_stream(key) as out:
            while left > 0:
                n = min(left, PIECE)
                out.write(piece[:n])
                left -= n

    return each_in_a_thread(upload, keys), keys


# pyarrow_download in a process of its own: argv = this file, env, keys,
# readers (JSON); prints the seconds.
DOWNLOAD_CHILD = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("object_store_bench", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
print(bench.pyarrow_download(json.loads(sys.argv[2]), json.loads(sys.argv[3]),
                             int(sys.argv[4])))
"""


def pyarrow_download_fresh(env, keys, readers):
    """pyarrow_download in a fresh process, as hoist's restore runs: the new
    memory each fills is equally new (a process that has just freed as much
    gets it back faster: on this VM 1 GiB of memory touched first in a fresh
    process has cost 1-5 s)."""
    done = subprocess.run(
        [sys.executable, "-c", DOWNLOAD_CHILD, __file__, json.dumps(env),
         json.dumps(keys), str(readers)],
        capture_output=True, text=True, env=dict(os.environ, **env),
        check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pyarrow download failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def pyarrow_download(env, keys, readers):
    """Seconds for pyarrow to read `keys` back by 16 MiB ranges into one new
    buffer per object, `readers` ranges at a time (hoist's restore reads
    with as many threads)."""
    import numpy as np

    fs = arrow_fs(env)
    sizes = {k: fs.get_file_info(k).size for k in keys}
    ranges = [(k, at, min(PIECE, sizes[k] - at))
              for k in keys for at in range(0, sizes[k], PIECE)]
    files = {k: fs.open_input_file(k) for k in keys}
    lock = threading.Lock()
    pending = iter(ranges)
    buffers = {}

    def reader(_):
        while True:
            with lock:
                item = next(pending, None)
            if item is None:
                return
            key, at, n = item
            # One ranged GET (read_at is thread-safe: no shared position;
            # Arrow returns new bytes), copied into the buffer.
            buffers[key][at:at + n] = files[key].read_at(n, at)

    # New memory, as a restore fills (np.empty: its pages are first touched
    # by the copies, inside the timing, as hoist's restore's are).
    start = time.perf_counter()
    buffers.update((k, memoryview(np.empty(sizes[k], np.uint8))) for k in keys)
    each_in_a_thread(reader, range(readers))
    seconds = time.perf_counter() - start
    for f in files.values():
        f.close()
    return seconds


# Each system's child runs in one of two modes, each a fresh process, as a
# job saves and, after a restart, restores: "save" (saves the state
# asynchronously, waits, prints blocked_s and save_s) or "restore" (loads
# it into new memory, prints restore_s, then builds the state again and
# checks what came back). A restore in the process that saved would fill
# its new memory on top of the state and the save's buffers: on this VM
# memory first touched beyond what a process has just freed costs 1-5 s
# per GiB, which would time the VM, not the restore.
HOIST_CHILD = r"""
import json, sys, time
import numpy as np
import hoist
size, writers, pool, root, mode = (int(sys.argv[1]), int(sys.argv[2]),
                                   int(sys.argv[3]), sys.argv[4], sys.argv[5])
# Arrays of at most 64 MiB (as a model's layers), at least 8.
count = max(8, size // (64 << 20))
rows = size // (4 * 4096 * count)


def make_state():
    return {f"layer{i}": np.random.default_rng(i).standard_normal(
        (rows, 4096), dtype=np.float32) for i in range(count)}


def rss():
    # Anonymous resident memory (the pool, buffers, the heap); not the
    # pages of the libraries the first s3:// or gs:// root loads (hoist's
    # object-store module, Arrow, the AWS SDK), which are file pages
    # shared through the page cache.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def open_manager():
    return hoist.CheckpointManager(root, pool_bytes=pool,
                                   writers=writers or None,
                                   coordinator="single")


if mode == "restore":
    mgr = open_manager()
    start = time.perf_counter()
    out = mgr.restore()
    restored = time.perf_counter() - start
    mgr.close()
    state = make_state()
    assert all(np.array_equal(out[k], state[k]) for k in state)
    print(json.dumps({"restore_s": restored}))
    sys.exit(0)
state = make_state()
nbytes = sum(a.nbytes for a in state.values())
# The save's peak RSS over what the process held before the manager opened
# (its pool included): sampled every 5 ms from another thread until the
# save is done.
BEFORE = rss()
mgr = open_manager()
import threading
saved_event = threading.Event()
peak = [0]


def sample():
    while not saved_event.wait(0.005):
        peak[0] = max(peak[0], rss())
    peak[0] = max(peak[0], rss())


sampler = threading.Thread(target=sample)
sampler.start()
start = time.perf_counter()
handle = mgr.save(1, state)  # returns once staged: the time blocked
blocked = time.perf_counter() - start
handle.wait()
saved = time.perf_counter() - start
saved_event.set()
sampler.join()
mgr.close()
print(json.dumps({"bytes": nbytes, "blocked_s": blocked, "save_s": saved,
                  "rss_growth_save": peak[0] - BEFORE}))
"""


# The peers' children: the same bytes (float32 layers of the same shapes as
# hoist's), in the same two modes. Each takes: size, threads, root, mode.
PEER_STATE = r"""
import json, os, sys, time, warnings
warnings.filterwarnings("ignore")
size, threads, root, mode = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                             sys.argv[4])
count = max(8, size // (64 << 20))
rows = size // (4 * 4096 * count)
"""

TORCH_STATE = PEER_STATE + r"""
import torch
import torch.distributed.checkpoint as dcp


def make_state():
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}": torch.randn(rows, 4096, generator=g)
            for i in range(count)}


def measure(writer, reader):
    if mode == "restore":
        target = {f"layer{i}": torch.empty(rows, 4096) for i in range(count)}
        start = time.perf_counter()
        dcp.load(target, storage_reader=reader())
        restored = time.perf_counter() - start
        state = make_state()
        assert all(torch.equal(target[k], state[k]) for k in state)
        print(json.dumps({"restore_s": restored}))
        return
    state = make_state()
    start = time.perf_counter()
    future = dcp.async_save(state, storage_writer=writer())
    blocked = time.perf_counter() - start
    future.result()
    saved = time.perf_counter() - start
    print(json.dumps({"blocked_s": blocked, "save_s": saved}))
"""

# PyTorch DCP through FsspecWriter/Reader over s3fs (botocore reads the same
# AWS_* variables), `threads` writer threads.
DCP_CHILD = TORCH_STATE + r"""
from torch.distributed.checkpoint import FsspecReader, FsspecWriter
measure(lambda: FsspecWriter(root, thread_count=threads, sync_files=False),
        lambda: FsspecReader(root))
"""

# s3torchconnector's DCP S3StorageWriter/Reader (AWS's CRT client). Its DCP
# classes take no endpoint, so their filesystem is given a client that has
# one (path-style addressing, as SeaweedFS serves).
S3TC_CHILD = TORCH_STATE + r"""
from s3torchconnector import S3ClientConfig
from s3torchconnector._s3client import S3Client
from s3torchconnector.dcp import S3StorageReader, S3StorageWriter
from s3torchconnector.dcp.s3_file_system import S3FileSystem
region, config = os.environ["AWS_REGION"], S3ClientConfig(force_path_style=True)


def on_server(storage):
    storage.fs = S3FileSystem(region, s3_client=S3Client(
        region, endpoint=os.environ["AWS_ENDPOINT_URL"],
        s3client_config=config))
    return storage


measure(lambda: on_server(S3StorageWriter(region, root, s3client_config=config,
                                          thread_count=threads)),
        lambda: on_server(S3StorageReader(region, root,
                                          s3client_config=config)))
"""

# Orbax's CheckpointManager (async by default) with JAX arrays on the CPU
# backend: TensorStore writes the arrays to the GCS emulator
# (TENSORSTORE_GCS_HTTP_URL), gcsfs the directories (STORAGE_EMULATOR_HOST).
ORBAX_CHILD = PEER_STATE + r"""
import logging
logging.getLogger("gcsfs").setLevel(logging.ERROR)
os.environ["TENSORSTORE_GCS_HTTP_URL"] = os.environ["STORAGE_EMULATOR_HOST"]
os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
import jax
import numpy as np
import orbax.checkpoint as ocp


def make_state():
    return {f"layer{i}": jax.device_put(np.random.default_rng(i).standard_normal(
        (rows, 4096), dtype=np.float32)) for i in range(count)}


with ocp.CheckpointManager(root) as manager:
    if mode == "restore":
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        abstract = {f"layer{i}": jax.ShapeDtypeStruct(
            (rows, 4096), np.float32, sharding=device) for i in range(count)}
        start = time.perf_counter()
        out = manager.restore(1, args=ocp.args.StandardRestore(abstract))
        jax.block_until_ready(out)
        restored = time.perf_counter() - start
        state = make_state()
        assert all(np.array_equal(np.asarray(out[k]), np.asarray(state[k]))
                   for k in state)
        print(json.dumps({"restore_s": restored}))
    else:
        state = make_state()
        jax.block_until_ready(state)
        start = time.perf_counter()
        manager.save(1, args=ocp.args.StandardSave(state))
        blocked = time.perf_counter() - start
        manager.wait_until_finished()
        saved = time.perf_counter() - start
        print(json.dumps({"blocked_s": blocked, "save_s": saved}))
"""

# name -> (the store it runs on, its child, what it needs, how it is named
# in the report).
PEERS = {
    "dcp": ("s3", DCP_CHILD, "torch and s3fs",
            "DCP async_save over s3fs"),
    "s3torchconnector": ("s3", S3TC_CHILD, "torch and s3torchconnector[dcp]",
                         "DCP with s3torchconnector's S3StorageWriter"),
    "orbax": ("gcs", ORBAX_CHILD, "jax, orbax-checkpoint and gcsfs",
              "Orbax (TensorStore) CheckpointManager"),
}


def run_modes(what, child, args, env):
    """`child` run with `args` + "save", then in a fresh process with `args`
    + "restore": the figures both print, merged."""
    result = {}
    for mode in ("save", "restore"):
        with tempfile.TemporaryFile("w+") as out, \
                tempfile.TemporaryFile("w+") as err:
            process = subprocess.Popen(
                [sys.executable, "-c", child, *args, mode], stdout=out,
                stderr=err, text=True, env=dict(os.environ, **env))
            # wait4, not wait: the child's own peak RSS (the state, the
            # system's buffers, its libraries), the same for every system.
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            err.seek(0)
            if process.returncode != 0:
                raise RuntimeError(f"{what} ({mode}) failed:\n"
                                   f"{err.read()[-3000:]}")
            result.update(json.loads(out.read().strip().splitlines()[-1]))
            result[f"peak_rss_{mode}"] = usage.ru_maxrss * 1024
    return result


def peer_round(name, env, bucket, scheme, size, writers):
    """One round of peer `name` on the server in `env`."""
    _, child, needs, _ = PEERS[name]
    root = f"{scheme}://{bucket}/{name}-{uuid.uuid4().hex[:8]}"
    return run_modes(f"{name} round (it needs {needs}: pip install -r "
                     "python/requirements-test.txt)", child,
                     [str(size), str(writers), root], env)


def hoist_round(env, bucket, scheme, size, writers, pool):
    """One round of hoist (`writers` 0: its default), with "objects": how
    many data objects its save wrote (its writer streams)."""
    prefix = f"{bucket}/hoist-{uuid.uuid4().hex[:8]}"
    result = run_modes("hoist round", HOIST_CHILD,
                       [str(size), str(writers), str(pool),
                        f"{scheme}://{prefix}"], env)
    import pyarrow.fs as pafs

    # Under hashed prefixes (data/HH/...): listed recursively.
    written = arrow_fs(env).get_file_info(
        pafs.FileSelector(f"{prefix}/step_00000001/data", recursive=True))
    result["keys"] = [i.path for i in written if i.type == pafs.FileType.File]
    result["objects"] = len(result["keys"])
    if writers and result["objects"] != writers:
        raise RuntimeError(f"hoist wrote {result['objects']} data objects, "
                           f"not --writers {writers}")
    return result


def spread(values):
    return {"median": statistics.median(values), "min": min(values),
            "max": max(values), "n": len(values)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writers", type=int, default=0,
                        help="hoist's writer streams = pyarrow's objects "
                        "(default: hoist's default, which its storage "
                        "chooses: 4 on S3, 16 on GCS)")
    parser.add_argument("--pool", default="256MiB",
                        help="hoist's staging pool (smaller than --size: "
                        "the save runs in waves)")
    parser.add_argument("--store", choices=("s3", "gcs"), default="s3",
                        help="the server: SeaweedFS's S3 or fake-gcs-server")
    parser.add_argument("--peers", default="",
                        help="comma-separated peers on the same server: "
                        "dcp, s3torchconnector (S3), orbax (GCS)")
    parser.add_argument("--one-object", default=True,
                        action=argparse.BooleanOptionalAction,
                        help="also time pyarrow's upload of the same bytes "
                        "to one object (the hard floor's baseline; slow on "
                        "fake-gcs-server at GiBs)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    size, pool = parse_size(args.size), parse_size(args.pool)
    peers = [p for p in args.peers.split(",") if p]
    for name in peers:
        if name not in PEERS:
            parser.error(f"--peers: unknown peer {name!r}; choose from "
                         f"{', '.join(PEERS)}")
        if PEERS[name][0] != args.store:
            parser.error(f"--peers {name} runs on --store {PEERS[name][0]}")
    server_type = {"s3": object_store_server.S3Server,
                   "gcs": object_store_server.GcsServer}[args.store]
    scheme = {"s3": "s3", "gcs": "gs"}[args.store]
    figures = {k: [] for k in ("limit_upload_s", "limit_download_s",
                               "one_object_upload_s", "hoist_save_s",
                               "hoist_restore_s", "hoist_rss_growth_save")}
    if not args.one_object:
        del figures["one_object_upload_s"]
    with tempfile.TemporaryDirectory(prefix="hoist-os-bench-") as tmp:
        with server_type(tmp) as server:
            env, bucket = server.env, server.bucket
            fs = arrow_fs(env)
            writers = args.writers
            for r in range(args.rounds):
                result = hoist_round(env, bucket, scheme, size, args.writers,
                                     pool)
                figures["hoist_save_s"].append(result["save_s"])
                figures.setdefault("hoist_blocked_s", []).append(
                    result["blocked_s"])
                figures["hoist_restore_s"].append(result["restore_s"])
                figures["hoist_rss_growth_save"].append(
                    result["rss_growth_save"])
                figures.setdefault("hoist_peak_rss_save", []).append(
                    result["peak_rss_save"])
                # pyarrow reading the very objects hoist's restore read.
                figures.setdefault("limit_download_same_objects_s", []).append(
                    pyarrow_download_fresh(env, result["keys"], READERS))
                # The limit with hoist's parallelism: as many objects as
                # its save wrote.
                writers = result["objects"]
                seconds, keys = pyarrow_upload(env, bucket, size, writers)
                figures["limit_upload_s"].append(seconds)
                figures["limit_download_s"].append(
                    pyarrow_download_fresh(env, keys, READERS))
                one = []
                if args.one_object:
                    seconds, one = pyarrow_upload(env, bucket, size, 1)
                    figures["one_object_upload_s"].append(seconds)
                for key in keys + one:
                    fs.delete_file(key)
                for name in peers:
                    peer = peer_round(name, env, bucket, scheme, size,
                                      writers)
                    for key in ("blocked_s", "save_s", "restore_s",
                                "peak_rss_save"):
                        figures.setdefault(f"{name}_{key}", []).append(
                            peer[key])
                print(f"round {r + 1}: " + ", ".join(
                    f"{k} {v[-1]:.3f}" if k.endswith("_s") else
                    f"{k} {v[-1] / 2**20:.0f} MiB"
                    for k, v in figures.items()), file=sys.stderr)
    med = {k: statistics.median(v) for k, v in figures.items()}
    report = {
        "store": args.store, "bytes": size, "writers": writers,
        "pool_bytes": pool,
        "rounds": args.rounds,
        "figures": {k: spread(v) for k, v in figures.items()},
        # Throughput ratios (>1: hoist faster than the limit measured).
        "save_vs_limit_upload": med["limit_upload_s"] / med["hoist_save_s"],
        "restore_vs_limit_download":
            med["limit_download_s"] / med["hoist_restore_s"],
        "restore_vs_limit_download_same_objects":
            med["limit_download_same_objects_s"] / med["hoist_restore_s"],
        "save_vs_one_object_upload":
            med["one_object_upload_s"] / med["hoist_save_s"]
            if args.one_object else None,
        "rss_growth_over_pool_mib":
            (med["hoist_rss_growth_save"] - pool) / 2**20,
    }
    for name in peers:
        # How many times faster hoist is than the peer (>1: hoist faster).
        report[f"vs_{name}"] = {
            what: med[f"{name}_{what}_s"] / med[f"hoist_{what}_s"]
            for what in ("save", "blocked", "restore")}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report, indent=2))
        return
    gb = size / 1e9
    print(f"{args.size} over {server_type.name} ({args.store}) on 127.0.0.1, "
          f"{writers} "
          f"streams, pool {args.pool}, medians of {args.rounds} rounds "
          "(min-max)")
    for k, v in figures.items():
        if k.endswith("_s"):
            print(f"  {k:28s} {v and statistics.median(v):7.2f} s "
                  f"({min(v):.2f}-{max(v):.2f})  {gb / statistics.median(v):.3f} GB/s")
    print(f"  hoist save vs pyarrow upload ({writers} objects): "
          f"{report['save_vs_limit_upload']:.2f}x")
    print(f"  hoist restore vs pyarrow download: "
          f"{report['restore_vs_limit_download']:.2f}x (of hoist's own "
          f"objects: {report['restore_vs_limit_download_same_objects']:.2f}x)")
    if args.one_object:
        print(f"  hoist save vs pyarrow upload to one object: "
              f"{report['save_vs_one_object_upload']:.2f}x")
    for name in peers:
        ratios = report[f"vs_{name}"]
        print(f"  hoist vs {PEERS[name][3]}: save {ratios['save']:.2f}x, "
              f"blocked {ratios['blocked']:.2f}x, restore "
              f"{ratios['restore']:.2f}x faster")
    print(f"  peak RSS growth in a save: "
          f"{med['hoist_rss_growth_save'] / 2**20:.0f} MiB "
          f"(pool {pool / 2**20:.0f} MiB)")
    print("  peak RSS of the saving process (the state included): hoist "
          f"{med['hoist_peak_rss_save'] / 2**20:.0f} MiB" + "".join(
              f", {name} {med[f'{name}_peak_rss_save'] / 2**20:.0f} MiB"
              for name in peers))


if __name__ == "__main__":
    main()
