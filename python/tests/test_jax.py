import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import hoist  # noqa: E402

DTYPES = [jnp.bool_, jnp.int8, jnp.int16, jnp.int32, jnp.uint8, jnp.uint16,
          jnp.uint32, jnp.float16, jnp.bfloat16, jnp.float32,
          jnp.float8_e4m3fn, jnp.float8_e5m2]


def mesh(data, model):
    return Mesh(np.array(jax.devices()[:data * model]).reshape(data, model),
                ("data", "model"))


def random(dtype, shape, seed):
    dtype = np.dtype(dtype)
    raw = np.random.default_rng(seed).integers(
        0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    if dtype == np.bool_:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def bits(x):
    return np.asarray(x).tobytes()


@pytest.fixture(params=["in_host", "staged"])
def placement(request, monkeypatch):
    """Both ways restored shards reach JAX CPU devices: restored in host
    memory and adopted (the default), or staged through the pool and put
    on the device as on a GPU."""
    monkeypatch.setattr(hoist._unflatten, "_JAX_IN_HOST",
                        request.param == "in_host")
    return request.param


def test_eight_cpu_devices():
    assert jax.device_count() == 8


# 64-bit types need JAX's x64 mode.
WIDE = [jnp.int64, jnp.uint64, jnp.float64]


@pytest.mark.parametrize("dtype", DTYPES + WIDE,
                         ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips_sharded(root, dtype):
    with jax.enable_x64(dtype in WIDE):
        host = random(dtype, (16, 8), 1)
        x = jax.device_put(host, NamedSharding(mesh(2, 4), P("data", "model")))
        assert x.dtype == np.dtype(dtype)
        with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
            mgr.save(1, {"x": x}).wait()
            out = mgr.restore(like={"x": x})["x"]
        assert out.dtype == x.dtype and out.sharding == x.sharding
        assert bits(out) == bits(host)


def sharded_state(m):
    return {
        "params": {
            "w": jax.device_put(random(jnp.bfloat16, (64, 48), 1),
                                NamedSharding(m, P(None, "model"))),
            "b": jax.device_put(random(jnp.float32, (48,), 2),
                                NamedSharding(m, P("model"))),
            "emb": jax.device_put(random(jnp.float32, (80, 3), 3),
                                  NamedSharding(m, P(("data", "model")))),
            "ln": jax.device_put(random(jnp.float32, (33,), 4),
                                 NamedSharding(m, P())),
        },
        "count": jnp.array(7, dtype=jnp.int32),
        "step": 42,
    }


@pytest.mark.parametrize("target", ["4x2", "1x8", "replicated", "single"])
def test_sharded_pytree_restores_bit_exact_onto_another_sharding(root, target):
    state = sharded_state(mesh(2, 4))
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        info = mgr.save(1, state).wait()
        # Replicas are written once: the unique bytes only.
        unique = sum(np.asarray(v).nbytes for v in state["params"].values())
        assert info["bytes"] == unique + 4
        def like(x):
            if target == "single":
                return jax.ShapeDtypeStruct(x.shape, x.dtype)
            if target == "replicated":
                sharding = NamedSharding(mesh(2, 4), P())
            else:
                d, m = map(int, target.split("x"))
                spec = x.sharding.spec
                sharding = NamedSharding(mesh(d, m), P(*reversed(spec))
                                         if len(spec) == 2 else spec)
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
        template = {"params": {k: like(v) for k, v in state["params"].items()},
                    "count": state["count"], "step": 0}
        out = mgr.restore(like=template)
    assert out["step"] == 42
    for k, v in state["params"].items():
        assert bits(out["params"][k]) == bits(v), k
        if target != "single":
            assert out["params"][k].sharding == template["params"][k].sharding
    assert int(out["count"]) == 7


def test_without_a_template_jax_leaves_come_back_as_jax_arrays(root):
    state = sharded_state(mesh(2, 4))
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(1, state, return_when="dispatched").wait()
        out = mgr.restore()
    assert isinstance(out["params"]["w"], jax.Array)
    assert bits(out["params"]["w"]) == bits(state["params"]["w"])


def test_restore_through_a_pool_smaller_than_the_state_runs_in_waves(
        root, placement):
    # 1 MiB of state in boxes of 64 KiB, through a 256 KiB pool.
    m = mesh(2, 4)
    state = {"params": {
        k: jax.device_put(random(np.float32, (512, 256), seed),
                          NamedSharding(m, P("data", "model")))
        for seed, k in enumerate(("w", "v"))}}
    with hoist.CheckpointManager(root, pool_bytes=256 << 10) as mgr:
        mgr.save(1, state).wait()
        assert mgr.last_restore is None
        out = mgr.restore(like=state)
        stats = mgr.last_restore
    state_bytes = sum(v.nbytes for v in state["params"].values())
    assert state_bytes >= 4 * (256 << 10)  # it cannot fit in one wave
    if placement == "staged":
        assert stats["waves"] >= 2, stats
    else:  # in place: the pool is not used
        assert stats["waves"] == 1 and stats["dispatches"] == 0, stats
    assert stats["bytes_read"] >= state_bytes, stats
    for k, v in state["params"].items():
        assert bits(out["params"][k]) == bits(v), k
        assert out["params"][k].sharding == v.sharding


@pytest.mark.parametrize("target", ["same", "other", "replicated"])
def test_shards_larger_than_the_pool_restore_bit_exact(root, target,
                                                      placement):
    # 2 MiB shards (on a 2 x 4 mesh) through a 256 KiB pool: each shard is
    # staged in parts and gathered before it goes to its device.
    m = mesh(2, 4)
    state = {"w": jax.device_put(random(np.float32, (2048, 1024), 7),
                                 NamedSharding(m, P("data", None)))}
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(1, state).wait()
    shardings = {
        "same": NamedSharding(m, P("data", None)),
        "other": NamedSharding(mesh(4, 2), P(None, "model")),
        "replicated": NamedSharding(m, P()),
    }
    like = {"w": jax.ShapeDtypeStruct((2048, 1024), jnp.float32,
                                      sharding=shardings[target])}
    with hoist.CheckpointManager(root, pool_bytes=256 << 10) as mgr:
        out = mgr.restore(like=like)
        assert (mgr.last_restore["waves"] > 8) == (placement == "staged")
    assert out["w"].sharding == shardings[target]
    assert bits(out["w"]) == bits(state["w"])


def test_a_failing_placement_is_an_error_not_a_crash(root, monkeypatch,
                                                     placement):
    state = sharded_state(mesh(2, 4))
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(1, state).wait()

        def broken(*args, **kwargs):
            raise RuntimeError("device out of memory")

        monkeypatch.setattr(jax, "device_put", broken)
        with pytest.raises(RuntimeError, match="device out of memory"):
            mgr.restore(like=state)
        monkeypatch.undo()
        out = mgr.restore(like=state)  # the manager goes on
    assert bits(out["params"]["w"]) == bits(state["params"]["w"])


def test_in_host_replicas_share_one_restored_buffer(root):
    # A fully replicated array restored onto 8 CPU devices is read once, into
    # one aligned buffer that every device adopts: no copy per replica.
    m = mesh(2, 4)
    state = {"w": jax.device_put(random(np.float32, (256, 512), 3),
                                 NamedSharding(m, P("data", "model")))}
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(1, state).wait()
        like = {"w": jax.ShapeDtypeStruct((256, 512), jnp.float32,
                                          sharding=NamedSharding(m, P()))}
        out = mgr.restore(like=like)
        stats = mgr.last_restore
    pointers = {s.data.unsafe_buffer_pointer() for s in
                out["w"].addressable_shards}
    assert len(out["w"].addressable_shards) == 8 and len(pointers) == 1
    assert pointers.pop() % 4096 == 0  # aligned for direct reads
    assert stats["bytes_read"] == state["w"].nbytes, stats
    assert bits(out["w"]) == bits(state["w"])
    # Donating an adopted array must not write through to its replicas.
    doubled = jax.jit(lambda x: x * 2, donate_argnums=0)(out["w"])
    assert bits(doubled) == bits(state["w"] * 2)


def test_empty_arrays_restore_with_their_sharding(root, placement):
    m = mesh(2, 4)
    sharding = NamedSharding(m, P(None, "model"))
    state = {"e": jax.device_put(np.zeros((0, 8), np.float32), sharding),
             "w": jax.device_put(random(np.float32, (4, 8), 5), sharding)}
    with hoist.CheckpointManager(root, pool_bytes=1 << 20) as mgr:
        mgr.save(1, state).wait()
        out = mgr.restore(like=state)
    assert out["e"].shape == (0, 8) and out["e"].sharding == sharding
    assert bits(out["w"]) == bits(state["w"])


def test_repeat_saves_of_jax_arrays_take_the_repeat_path_and_restore_exact(
        root):
    """A training loop's JAX state saved again and again (new arrays, the
    same shardings): saves after the first take the repeat path, including
    replicated, sharded, float8 and uneven arrays, and each step restores
    its own values; a new sharding (or dtype) takes the full walk again."""
    from test_numpy import spy_repeats

    m = mesh(2, 4)
    shardings = {"w": NamedSharding(m, P("data", "model")),
                 "cols": NamedSharding(m, P(None, "model")),
                 "bias": NamedSharding(m, P()),
                 "f8": NamedSharding(m, P("data")),
                 "odd": NamedSharding(m, P("model"))}
    shapes = {"w": (16, 8), "cols": (6, 8), "bias": (8,), "f8": (4, 4),
              "odd": (12,)}
    dtypes = {"w": jnp.float32, "cols": jnp.bfloat16, "bias": jnp.float32,
              "f8": jnp.float8_e4m3fn, "odd": jnp.int32}

    def state(step, changed=()):
        out = {"params": {}, "step": step}
        for name, shape in shapes.items():
            sharding = shardings[name]
            if name in changed:
                sharding = NamedSharding(m, P())
            out["params"][name] = jax.device_put(
                random(dtypes[name], shape, step * 10 + len(name)), sharding)
        return out

    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        repeated = spy_repeats(mgr)
        saved = {}
        for step in range(1, 4):
            saved[step] = state(step)
            mgr.save(step, saved[step]).wait()
        saved[4] = state(4, changed=("w",))  # another sharding: full walk
        mgr.save(4, saved[4]).wait()
        saved[5] = state(5, changed=("w",))
        mgr.save(5, saved[5]).wait()
        assert repeated == [False, True, True, False, True]
        for step, want in saved.items():
            out = mgr.restore(step)
            assert out["step"] == step
            for name, array in want["params"].items():
                assert bits(out["params"][name]) == bits(array), (step, name)


def test_repeat_saves_hand_row_major_jax_shards_over_by_address(
        root, monkeypatch):
    """A repeat save hands a row-major JAX shard to the engine as its
    address (cheaper than a DLPack capsule) and keeps its array alive until
    the copies have read it; an array in another layout goes as a capsule,
    and one whose layout changed since the last save takes the full walk.
    Every step restores its own values."""
    import gc
    import weakref

    from jax.sharding import SingleDeviceSharding
    try:
        from jax.experimental.layout import Format, Layout
    except ImportError:
        pytest.skip("this JAX has no Format")
    from test_numpy import spy_repeats

    handed = []
    match = hoist._repeat.match

    def spy(state, plan, *args):
        found = match(state, plan, *args)
        handed.append(None if found is None else
                      ([type(a) for a in found[0]], len(found[2])))
        return found

    monkeypatch.setattr(hoist._repeat, "match", spy)
    sharded = NamedSharding(mesh(2, 4), P("data", "model"))
    one = SingleDeviceSharding(jax.devices()[0])

    def put(seed, layout=None):
        value = random(np.float32, (8, 8), seed)
        if layout is None:
            return jax.device_put(value, one)
        return jax.device_put(value, Format(Layout(layout), one))

    def state(seed, layout=None):
        return {"w": jax.device_put(random(np.float32, (16, 8), seed),
                                    sharded),
                "c": put(seed + 1, layout)}

    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        repeated = spy_repeats(mgr)
        saved = {1: state(10), 2: state(20)}
        mgr.save(1, saved[1]).wait()
        handle = mgr.save(2, saved[2], return_when="dispatched")
        # 8 shards of "w" and the one of "c", by address, both arrays kept.
        assert handed[-1] == ([int] * 9, 2)
        kept = weakref.ref(saved[2]["c"])
        gc.collect()
        assert kept() is not None
        handle.wait()
        saved[3] = state(30, layout=(1, 0))  # a new layout: full walk
        mgr.save(3, saved[3]).wait()
        saved[4] = state(40, layout=(1, 0))  # as a capsule from now on
        mgr.save(4, saved[4]).wait()
        assert handed[-1][0][:8] == [int] * 8 and handed[-1][0][8] is not int
        assert repeated == [False, True, False, True]
        for step, want in saved.items():
            out = mgr.restore(step)
            for name, array in want.items():
                assert bits(out[name]) == bits(array), (step, name)


@pytest.mark.parametrize("layout", ["single", "replicated", "sharded"])
def test_a_saved_array_is_donated_by_the_next_step(root, layout):
    """Once save() returns (staged) hoist holds no view of any saved array,
    for a first save and for repeat saves alike, though the caller keeps the
    handle: the next jitted step with donate_argnums deletes every input
    buffer (a view held would make JAX skip the donation silently and
    allocate anew). A dispatched save holds its arrays until wait_staged()
    (or wait()), then lets them go."""
    m = mesh(2, 4)
    sharding = {"single": None, "replicated": NamedSharding(m, P()),
                "sharded": NamedSharding(m, P("data", "model"))}[layout]

    def fresh():
        value = jnp.arange(64 * 64, dtype=jnp.float32).reshape(64, 64)
        return value if sharding is None else jax.device_put(value, sharding)

    step = jax.jit(lambda x: x + 1, donate_argnums=0)
    with hoist.CheckpointManager(root) as mgr:
        x = fresh()
        donated = []
        handles = []
        for i in range(3):  # the first save, then repeat saves
            handles.append(mgr.save(i, {"x": x}))
            y = step(x)
            donated.append(x.is_deleted())
            x = y
        assert donated == [True, True, True]
        handle = mgr.save(3, {"x": x}, return_when="dispatched")
        handle.wait_staged()
        y = step(x)
        assert x.is_deleted()
        for h in handles + [handle]:
            h.wait()
        assert bits(mgr.restore(3)["x"]) == bits(y - 1)
