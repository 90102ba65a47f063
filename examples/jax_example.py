"""Using hoist from JAX: a sharded train state saved asynchronously on a
2 x 4 mesh and restored onto a 4 x 2 one. Runs on JAX's CPU backend:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/python examples/jax_example.py
"""
import os
import sys
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import hoist  # noqa: E402

mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
shard = lambda spec: NamedSharding(mesh, spec)  # noqa: E731
state = {
    "params": {
        "w": jax.device_put(jnp.ones((1024, 512), jnp.bfloat16), shard(P(None, "model"))),
        "b": jax.device_put(jnp.zeros((512,), jnp.float32), shard(P("model"))),
    },
    "step": 0,
}

root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
with hoist.CheckpointManager(root, keep=2) as mgr:
    for step in range(1, 4):
        state["params"]["w"] = state["params"]["w"] * 2  # "training"
        state["step"] = step
        mgr.save(step, state)  # returns once the arrays are off the devices
    mgr.wait_until_finished()

    # Restore onto another mesh: the template's shardings decide.
    other = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    like = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(
            other, P("model") if x.ndim == 1 else P("data", "model")))
        if isinstance(x, jax.Array) else x, state)
    restored = mgr.restore(like=like)  # the latest step, 3

assert restored["step"] == 3
assert restored["params"]["w"].sharding.mesh.shape == {"data": 4, "model": 2}
assert bool((restored["params"]["w"] == 8).all())
print("restored step", restored["step"], "onto", restored["params"]["w"].sharding)
