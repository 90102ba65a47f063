"""Real training state as it is: flax TrainState with optax, flax nnx
State, typed PRNG keys, and PyTorch modules, optimizers, schedulers and
GradScalers passed as objects. Each is trained, checkpointed, restored into a
fresh template and trained on, bit-identically to an uninterrupted run."""
import numpy as np
import pytest

import hoist


def bits(tree):
    jax = pytest.importorskip("jax")
    return [np.asarray(x).tobytes() for x in jax.tree_util.tree_leaves(tree)]


# -- JAX: flax linen TrainState + optax ---------------------------------------


def _linen_setup(seed):
    jax = pytest.importorskip("jax")
    pytest.importorskip("flax")
    optax = pytest.importorskip("optax")
    import flax.linen as nn
    import jax.numpy as jnp
    from flax.training import train_state
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(8)(nn.relu(nn.Dense(64)(x)))

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))

    def spec(path, x):  # hidden layer sharded over "model", the rest whole
        names = jax.tree_util.keystr(path)
        if x.ndim == 2:
            return NamedSharding(mesh, P(None, "model") if "Dense_0" in names
                                 else P("model", None))
        return NamedSharding(mesh, P("model") if "Dense_0" in names else P())

    model = MLP()
    params = model.init(jax.random.key(seed), jnp.ones((1, 16)))
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: jax.device_put(x, spec(p, x)), params)
    state = train_state.TrainState.create(apply_fn=model.apply, params=params,
                                          tx=optax.adamw(1e-2))

    @jax.jit
    def step(state, x, y):
        def loss(p):
            return jnp.mean((state.apply_fn(p, x) - y) ** 2)
        return state.apply_gradients(grads=jax.grad(loss)(state.params))

    rng = np.random.default_rng(0)
    batches = [(jax.device_put(rng.standard_normal((32, 16), np.float32),
                               NamedSharding(mesh, P("data"))),
                rng.standard_normal((32, 8), np.float32)) for _ in range(6)]
    return state, step, batches


def test_flax_train_state_with_optax_resumes_bit_identically(root):
    jax = pytest.importorskip("jax")
    from flax.training import train_state
    state, step, batches = _linen_setup(seed=0)
    for x, y in batches[:3]:
        state = step(state, x, y)
    saved = {"train": state, "rng": jax.random.key(7), "epoch": 3}
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(3, saved).wait()
        names = [a["name"] for a in hoist.inspect(root)["arrays"]]
        assert "train/opt_state/0/mu/params/Dense_0/kernel" in names
        uninterrupted = state
        for x, y in batches[3:]:
            uninterrupted = step(uninterrupted, x, y)

        # A fresh job: a new state (another seed) as the template.
        fresh, step2, _ = _linen_setup(seed=1)
        template = {"train": fresh, "rng": jax.random.key(0), "epoch": 0}
        restored = mgr.restore(like=template)
    resumed = restored["train"]
    assert isinstance(resumed, train_state.TrainState)
    assert resumed.apply_fn == fresh.apply_fn and resumed.tx is fresh.tx
    assert int(resumed.step) == 3 and restored["epoch"] == 3
    assert bits(jax.random.key_data(restored["rng"])) == bits(
        jax.random.key_data(jax.random.key(7)))
    kernel = resumed.params["params"]["Dense_0"]["kernel"]
    assert kernel.sharding == fresh.params["params"]["Dense_0"][
        "kernel"].sharding
    assert bits(resumed) == bits(state)
    for x, y in batches[3:]:
        resumed = step2(resumed, x, y)
    assert bits(resumed.params) == bits(uninterrupted.params)
    assert bits(resumed.opt_state) == bits(uninterrupted.opt_state)


def test_without_a_template_registered_nodes_come_back_as_dicts(root):
    state, step, batches = _linen_setup(seed=0)
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(0, {"train": state}).wait()
        out = mgr.restore()
    train = out["train"]
    assert set(train) >= {"step", "params", "opt_state"}
    assert train["step"] == 0
    assert isinstance(train["opt_state"], tuple)
    assert train["opt_state"][1] == {}  # optax's EmptyState, as a dict
    np.testing.assert_array_equal(
        np.asarray(train["opt_state"][0]["mu"]["params"]["Dense_0"]["bias"]),
        np.zeros(8, np.float32))  # Dense_0 is the outer, 8-wide layer


def test_a_template_of_another_structure_lists_every_difference(root):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    state = {"w": jnp.zeros((4, 4)), "b": jnp.zeros(4), "c": jnp.zeros(2)}
    with hoist.CheckpointManager(root, pool_bytes=1 << 20) as mgr:
        mgr.save(1, state).wait()
        with pytest.raises(KeyError) as missing:
            mgr.restore(like={"w": state["w"], "x": state["b"],
                              "y": state["c"]})
        assert "'x'" in str(missing.value) and "'y'" in str(missing.value)
        with pytest.raises(ValueError) as differs:
            mgr.restore(like={"w": jnp.zeros((4, 5)), "b": jnp.zeros(4,
                                                                       jnp.int32),
                              "c": state["c"]})
        assert "2 arrays" in str(differs.value)
        assert "'w'" in str(differs.value) and "'b'" in str(differs.value)


# -- JAX: flax nnx -------------------------------------------------------------


def _nnx_setup(seed):
    pytest.importorskip("jax")
    optax = pytest.importorskip("optax")
    pytest.importorskip("flax")
    import jax.numpy as jnp
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.hidden = nnx.Linear(16, 32, rngs=rngs)
            self.out = nnx.Linear(32, 8, rngs=rngs)

        def __call__(self, x):
            return self.out(nnx.relu(self.hidden(x)))

    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    model = MLP(nnx.Rngs(seed))
    # Kernels sharded over "model" on the 2 x 4 mesh, biases replicated.
    nnx.update(model, jax.tree.map(lambda x: jax.device_put(x, NamedSharding(
        mesh, P(None, "model") if x.ndim == 2 else P())), nnx.state(model)))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, x, y):
        def loss(m):
            return jnp.mean((m(x) - y) ** 2)
        optimizer.update(model, nnx.grad(loss)(model))

    return model, optimizer, step


def test_flax_nnx_state_resumes_bit_identically(root):
    from flax import nnx
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((32, 16), np.float32),
                rng.standard_normal((32, 8), np.float32)) for _ in range(6)]
    model, optimizer, step = _nnx_setup(0)
    for x, y in batches[:3]:
        step(model, optimizer, x, y)
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(3, {"model": nnx.state(model),
                     "optimizer": nnx.state(optimizer)}).wait()
        for x, y in batches[3:]:
            step(model, optimizer, x, y)
        model2, optimizer2, step2 = _nnx_setup(5)  # a fresh job
        restored = mgr.restore(like={"model": nnx.state(model2),
                                     "optimizer": nnx.state(optimizer2)})
    assert type(restored["model"]) is type(nnx.state(model2))
    kernel = restored["model"]["hidden"]["kernel"][...]
    assert kernel.sharding == model2.hidden.kernel[...].sharding
    assert len(kernel.sharding.device_set) == 8
    nnx.update(model2, restored["model"])
    nnx.update(optimizer2, restored["optimizer"])
    for x, y in batches[3:]:
        step2(model2, optimizer2, x, y)
    assert bits(nnx.state(model2)) == bits(nnx.state(model))
    assert bits(nnx.state(optimizer2)) == bits(nnx.state(optimizer))


# -- PyTorch: Stateful objects --------------------------------------------------


def _torch_setup(seed):
    torch = pytest.importorskip("torch")
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2,
                                                gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    return model, optimizer, scheduler, scaler


def _torch_step(objects, x, y):
    torch = pytest.importorskip("torch")
    model, optimizer, scheduler, scaler = objects
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()


def test_torch_objects_resume_bit_exactly_in_place(root):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g))
               for _ in range(6)]
    live = _torch_setup(0)
    for x, y in batches[:3]:
        _torch_step(live, x, y)
    model, optimizer, scheduler, scaler = live
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(3, {"model": model, "optim": optimizer, "sched": scheduler,
                     "scaler": scaler, "epoch": 3}).wait()
        names = {a["name"] for a in hoist.inspect(root)["arrays"]}
        assert {"model/0.weight", "optim/state/0/exp_avg"} <= names
        at_save = (scheduler.state_dict(), scaler.state_dict(),
                   optimizer.param_groups[0]["lr"])
        for x, y in batches[3:]:
            _torch_step(live, x, y)
        fresh = _torch_setup(1)  # another init; its optimizer has no state
        template = {"model": fresh[0], "optim": fresh[1], "sched": fresh[2],
                    "scaler": fresh[3], "epoch": 0}
        restored = mgr.restore(like=template)
    assert restored["model"] is fresh[0] and restored["optim"] is fresh[1]
    assert restored["epoch"] == 3
    # Restored in place, Python values exactly (a tuple stays a tuple).
    assert fresh[2].state_dict() == at_save[0] and fresh[2].last_epoch == 3
    assert fresh[3].state_dict() == at_save[1]
    assert fresh[1].param_groups[0]["lr"] == at_save[2]
    assert fresh[1].param_groups[0]["betas"] == (0.9, 0.999)
    for x, y in batches[3:]:
        _torch_step(fresh, x, y)
    for a, b in zip(fresh[0].state_dict().values(), model.state_dict().values()):
        assert torch.equal(a, b)
    for a, b in zip(fresh[1].state_dict()["state"].values(),
                    optimizer.state_dict()["state"].values()):
        for key in a:
            assert torch.equal(torch.as_tensor(a[key]), torch.as_tensor(b[key]))
    assert fresh[2].state_dict() == scheduler.state_dict()
    assert fresh[3].state_dict() == scaler.state_dict()
