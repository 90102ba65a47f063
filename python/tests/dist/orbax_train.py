"""One process of a multi-process JAX job (jax.distributed, CPU, gloo)
that trains with optax and checkpoints through hoist.orbax's
CheckpointManager, written as an Orbax job is; test_orbax.py starts them.

  orbax_train.py PORT PROCESS NPROC ROOT OUT STEPS OPTIONS_JSON [ROOT OUT
                 STEPS OPTIONS_JSON ...]

Each job (ROOT OUT STEPS OPTIONS_JSON) in turn in the same processes (a
launch costs more than a job here). OPTIONS: kill_at (every process
SIGKILLs itself right after that step's save returned: while it is in
flight). A job resumes from its root's newest step when there is one.
Process 0 writes the final parameters to OUT (.npz) and the step training
started at to OUT.start.
"""
import json
import os
import signal
import sys

port, process, nproc = (int(a) for a in sys.argv[1:4])
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from hoist.orbax import CheckpointManager  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{port}", nproc, process)


def job(root, out, steps, options):
    steps, options = int(steps), json.loads(options)
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, -1),
                             ("x", "y"))
    rng = np.random.default_rng(5)
    params = {"w": rng.standard_normal((16, 12)).astype(np.float32),
              "b": np.zeros((12,), np.float32)}
    specs = {"w": P("x", "y"), "b": P("y")}
    params = {k: jax.make_array_from_callback(
        v.shape, NamedSharding(mesh, specs[k]), lambda i, v=v: v[i])
        for k, v in params.items()}
    optim = optax.adam(1e-2)
    state = {"params": params, "opt": optim.init(params)}
    x = jax.device_put(rng.standard_normal((32, 16)).astype(np.float32),
                       NamedSharding(mesh, P("x")))

    @jax.jit
    def train_step(state, x):
        def loss(p):
            return jnp.mean(jnp.tanh(x @ p["w"] + p["b"]) ** 2)
        grads = jax.grad(loss)(state["params"])
        updates, opt = optim.update(grads, state["opt"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates),
                "opt": opt}

    mgr = CheckpointManager(root, options=ocp.CheckpointManagerOptions(
        max_to_keep=2, save_interval_steps=1), hoist={"pool_bytes": 8 << 20})
    start = 0
    if mgr.latest_step() is not None:
        # Each array's sharding; a process-local one (optax's step count)
        # replicated on the mesh, as the jitted step takes it.
        def abstract_of(a):
            local = a.is_fully_addressable and len(a.sharding.device_set) == 1
            return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=(
                NamedSharding(mesh, P()) if local else a.sharding))
        abstract = jax.tree.map(abstract_of, state)
        restored = mgr.restore(mgr.latest_step(), args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract),
            meta=ocp.args.JsonRestore()))
        state, start = restored.state, restored.meta["next"]
    for step in range(start, steps):
        state = train_step(state, x)
        mgr.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            meta=ocp.args.JsonSave({"next": step + 1})))
        if step == options.get("kill_at"):
            os.kill(os.getpid(), signal.SIGKILL)
    mgr.wait_until_finished()
    mgr.close()
    final = {k: multihost_utils.process_allgather(v, tiled=True)
             for k, v in state["params"].items()}
    if process == 0:
        np.savez(out, **final)
        with open(f"{out}.start", "w") as f:
            f.write(str(start))


def main():
    jobs = sys.argv[4:]
    for at in range(0, len(jobs), 4):
        job(*jobs[at:at + 4])
    jax.distributed.shutdown()


main()
