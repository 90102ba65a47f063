"""One process of a multi-process JAX job (CPU backend, gloo collectives)
that saves or restores global arrays with hoist; test_jax_multiprocess.py
starts N of them.

  jax_worker.py PORT PROCESS NPROC DEVICES save ROOT STEP LAYOUT
  jax_worker.py PORT PROCESS NPROC DEVICES save_twice ROOT STEP LAYOUT
                                        (STEP, then STEP + 1 through the
                                        repeat-save path)
  jax_worker.py PORT PROCESS NPROC DEVICES restore ROOT STEP LAYOUT
  jax_worker.py PORT PROCESS NPROC DEVICES hang ROOT OUT

DEVICES is each process's device count. LAYOUT ("a" or "b") picks the
shardings on the global mesh. The full arrays come from fixed seeds, so
every process knows what each of its shards must hold.
"""
import os
import sys

port, process, nproc, per = (int(a) for a in sys.argv[1:5])
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={per}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import hoist  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{port}", nproc, process)


def full_arrays():
    rng = np.random.default_rng(99)
    return {
        "w": rng.standard_normal((16, 12)).astype(np.float32),
        "b": rng.standard_normal((8,)).astype(np.float32),
        "e": rng.integers(0, 1000, (24, 5)).astype(np.int32),
        "rep": rng.standard_normal((6, 6)).astype(np.float32),
    }


def specs(layout):
    if layout == "a":
        return {"w": P("x", "y"), "b": P("x"), "e": P(("x", "y")),
                "rep": P()}
    return {"w": P("y", "x"), "b": P(), "e": P("y"), "rep": P("x")}


def mesh():
    devices = np.array(jax.devices())
    rows = 2 if devices.size % 2 == 0 else 1
    return jax.sharding.Mesh(devices.reshape(rows, -1), ("x", "y"))


def global_arrays(layout):
    full, m = full_arrays(), mesh()
    out = {}
    for name, spec in specs(layout).items():
        sharding = NamedSharding(m, spec)
        out[name] = jax.make_array_from_callback(
            full[name].shape, sharding, lambda index, a=full[name]: a[index])
    return out


def hang(root, out):
    """Process 1 stops (SIGSTOP) mid-save; process 0 writes what it saw to
    `out` and exits at once (the job's shutdown would wait for process 1)."""
    import signal
    import outcome  # beside this script
    mgr = hoist.CheckpointManager(root, pool_bytes=256 << 20,
                                  coordinator_timeout_s=5)
    mgr.save(1, {"params": global_arrays("a")}).wait()
    # Big enough that process 1 stops while its share is being written.
    big = np.ones(16 << 20, np.float32)  # the same on every process
    handle = mgr.save(2, {"params": global_arrays("a"), "big": big})
    if process == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    outcome.report(mgr, handle, out)
    os._exit(0)


def main():
    if sys.argv[5] == "hang":
        return hang(sys.argv[6], sys.argv[7])
    command, root, step, layout = sys.argv[5], sys.argv[6], int(
        sys.argv[7]), sys.argv[8]
    staging = sys.argv[9] if len(sys.argv) > 9 else "auto"
    with hoist.CheckpointManager(root, pool_bytes=64 << 20,
                                 staging=staging) as mgr:
        if command in ("save", "save_twice"):
            state = {"params": global_arrays(layout), "step": step}
            assert not state["params"]["w"].is_fully_addressable or nproc == 1
            mgr.save(step, state).wait()
        if command == "save_twice":  # and STEP + 1: new arrays, repeated
            taken, again = [], mgr._save_again

            def spy(*args):
                handle = again(*args)
                taken.append(handle is not None)
                return handle

            mgr._save_again = spy
            info = mgr.save(step + 1, {"params": global_arrays(layout),
                                       "step": step + 1}).wait()
            assert taken == [True], taken
            # Through PJRT: this process's shards in one transfer.
            assert info["pjrt_transfer_calls"] == (staging == "pjrt"), info
        if command == "restore":
            full = full_arrays()
            template = {
                "params": {
                    name: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
                    for (name, a), s in zip(
                        full.items(),
                        (NamedSharding(mesh(), p)
                         for p in specs(layout).values()))
                },
                "step": 0,
            }
            restored = mgr.restore(step, like=template)
            assert restored["step"] == step
            for name, array in restored["params"].items():
                assert array.sharding == template["params"][name].sharding
                for shard in array.addressable_shards:
                    np.testing.assert_array_equal(
                        np.asarray(shard.data), full[name][shard.index],
                        err_msg=name)
    print(f"process {process}: {command} ok", flush=True)


if __name__ == "__main__":
    main()
