"""What the benchmarks share: where the build's binaries are, byte sizes,
the page cache, peak RSS, the sample model's arrays (as NumPy, JAX and
torch), a child process's result, and a C++ benchmark's JSON. The
benchmarks import it (they run as scripts from bench/)."""
import json
import os
import resource
import shutil
import socket
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build", "release")
HOIST = os.path.join(BUILD, "hoist")
SAVE_BENCH = os.path.join(BUILD, "bench", "save_bench")
TRANSFER_BENCH = os.path.join(BUILD, "bench", "transfer_bench")
GIB = 1 << 30


def parse_bytes(text):
    units = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "K": 1 << 10,
             "M": 1 << 20, "G": 1 << 30, "": 1}
    t = text.strip().upper()
    for unit in sorted(units, key=len, reverse=True):
        if unit and t.endswith(unit):
            return int(float(t[:-len(unit)]) * units[unit])
    return int(float(t))


def free_port():
    """A TCP port free on 127.0.0.1 now (for a job's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drop_caches(path=None):
    """Empties the page cache before a restore: all of it where this process
    may (root, /proc/sys writable): "dropped"; else every file under `path`
    is synced and evicted with posix_fadvise(DONTNEED), which any user may
    do for clean pages: "evicted" (checked: fincore then counts no resident
    page). "no" when neither works. HOIST_BENCH_EVICT_ONLY=1 evicts only
    `path`'s files even where all could be dropped: the test suite sets it,
    as dropping everything makes the processes beside a bench (the other
    test worker's) read their libraries from the disk again."""
    if not os.environ.get("HOIST_BENCH_EVICT_ONLY"):
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            return "dropped"
        except OSError:
            pass
    if path is None or not evict(path):
        return "no"
    return "evicted"


def evict(path):
    """Evicts every file under `path` from the page cache: True when fincore
    (where installed) finds none of their pages resident afterwards."""
    files = [os.path.join(d, f) for d, _, names in os.walk(path)
             for f in names]
    for name in files:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    if not files:  # a directory with nothing in it: nothing cached
        return os.path.isdir(path)
    if shutil.which("fincore") is None:
        return True
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output",
                          "RES", *files], capture_output=True, text=True)
    return out.returncode == 0 and all(
        int(v) == 0 for v in out.stdout.split())


def warmed(path):
    """Removes a warm-up save (every system saves once, untimed, first)."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)
    os.sync()


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# -- the arrays ---------------------------------------------------------------


def array_list(size):
    out = subprocess.run([HOIST, "plan", "--size", str(size), "--dtype",
                          "bfloat16", "--list-arrays", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["array_list"]


def host_arrays(specs, fill=True):
    """name -> numpy array, deterministic random bytes (fill=False: empty
    arrays of the same shapes and dtypes)."""
    import ml_dtypes  # noqa: F401
    import numpy as np
    rng = np.random.default_rng(20261129)
    out = {}
    for s in specs:
        dtype = np.dtype(getattr(ml_dtypes, s["dtype"], None) or s["dtype"])
        if not fill:
            out[s["name"]] = np.empty(s["shape"], dtype)
            continue
        n = int(np.prod(s["shape"], dtype=np.int64)) * dtype.itemsize
        raw = np.frombuffer(rng.bytes(n), dtype=np.uint8)
        if dtype.kind == "f":  # no NaN patterns: keep comparisons simple
            raw = raw.copy()
            raw[dtype.itemsize - 1::dtype.itemsize] &= 0x3F
        out[s["name"]] = raw.view(dtype).reshape(s["shape"])
    return out


def jax_arrays(specs, host, mesh_shape=(2, 4)):
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(mesh_shape),
                ("data", "model"))

    def sharding(spec):
        return NamedSharding(mesh, PartitionSpec(*[
            None if not axes else (axes[0] if len(axes) == 1 else tuple(axes))
            for axes in spec]))

    shardings = {s["name"]: sharding(s["spec"]) for s in specs}
    arrays = {name: jax.device_put(host[name], shardings[name])
              for name in host}
    jax.block_until_ready(arrays)
    return arrays, shardings


def same(restored, host):
    import numpy as np
    for name, expected in host.items():
        got = restored[name]
        if hasattr(got, "numpy") and not isinstance(got, np.ndarray) and \
                type(got).__module__.startswith("torch"):
            got = got.contiguous().view(-1).view(
                __import__("torch").uint8).numpy().view(expected.dtype)
        if np.asarray(got).reshape(-1).view(np.uint8).tobytes() != \
                expected.reshape(-1).view(np.uint8).tobytes():
            return False
    return True


def torch_tensors(host):
    import numpy as np
    import torch
    out = {}
    for name, a in host.items():
        dtype = getattr(torch, a.dtype.name)
        t = torch.from_numpy(np.ascontiguousarray(a).view(np.uint8).copy())
        out[name] = t.view(dtype).reshape(a.shape)
    return out


def abstract_jax(specs, shardings):
    """name -> jax.ShapeDtypeStruct with the given shardings."""
    import jax
    import ml_dtypes  # noqa: F401
    import numpy as np
    return {s["name"]: jax.ShapeDtypeStruct(
        tuple(s["shape"]), np.dtype(getattr(ml_dtypes, s["dtype"], None) or
                                    s["dtype"]),
        sharding=shardings[s["name"]]) for s in specs}


def target_shardings(specs, other):
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    shape = (4, 2) if other else (2, 4)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(shape), ("data", "model"))
    return {s["name"]: NamedSharding(mesh, PartitionSpec(*[
        None if not a else (a[0] if len(a) == 1 else tuple(a))
        for a in s["spec"]])) for s in specs}


def dcp_group():
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29517",
                                rank=0, world_size=1)


def child_result(command, env=None):
    """Runs a benchmark's child process: the JSON object it printed on its
    "RESULT " line, else {"error": its exit status and last stderr line}.
    (every benchmark runs its children through it)."""
    done = subprocess.run(command, capture_output=True, text=True, env=env,
                          timeout=1800)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"error": f"exit {done.returncode}: {tail}"}


def cpp_json(command):
    out = subprocess.run(command, check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)
