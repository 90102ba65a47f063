"""Using hoist from JAX: a flax TrainState with optax AdamW, sharded on a
2 x 4 mesh, trained and checkpointed asynchronously, then restored onto a
4 x 2 mesh as a TrainState. Runs on JAX's CPU backend:

    .venv/bin/python examples/jax_example.py
"""
import os
import sys
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax.training import train_state  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import hoist  # noqa: E402


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(16)(nn.relu(nn.Dense(512)(x)))


def make_state(mesh):
    """A fresh TrainState, its kernels sharded over `mesh`'s model axis."""
    model = MLP()
    params = model.init(jax.random.key(0), jnp.ones((1, 256)))
    params = jax.tree.map(lambda x: jax.device_put(x, NamedSharding(
        mesh, P(None, "model") if x.ndim == 2 else P())), params)
    return train_state.TrainState.create(apply_fn=model.apply, params=params,
                                         tx=optax.adamw(1e-3))


@jax.jit
def train_step(state, x, y):
    grads = jax.grad(lambda p: jnp.mean((state.apply_fn(p, x) - y) ** 2))(
        state.params)
    return state.apply_gradients(grads=grads)


mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
state = make_state(mesh)
x, y = jnp.ones((64, 256)), jnp.zeros((64, 16))

root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
with hoist.CheckpointManager(root, keep=2) as mgr:
    for step in range(1, 4):
        state = train_step(state, x, y)
        # The TrainState as it is (params, optax state, step); returns once
        # the arrays are off the devices, the write goes on behind training.
        mgr.save(step, {"state": state, "rng": jax.random.key(step)})
    mgr.wait_until_finished()

    # A restarted job on another mesh: a fresh state is the template; the
    # restored one is a TrainState with its shardings and its apply_fn.
    other = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    restored = mgr.restore(like={"state": make_state(other),
                                 "rng": jax.random.key(0)})

resumed = restored["state"]
assert isinstance(resumed, train_state.TrainState) and int(resumed.step) == 3
kernel = resumed.params["params"]["Dense_1"]["kernel"]
assert kernel.sharding.mesh.shape == {"data": 4, "model": 2}
assert bool(jnp.array_equal(kernel, state.params["params"]["Dense_1"]["kernel"]))
resumed = train_step(resumed, x, y)  # training goes on
print("resumed step", int(resumed.step), "onto", kernel.sharding)
