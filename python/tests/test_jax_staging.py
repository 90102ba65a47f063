"""JAX shards the engine cannot read by address go to host memory through
JAX's own runtime in one batched transfer per save (_xla_staging.py): on
this machine's CPU backend the path is forced (staging="pjrt"), or taken by
"auto" for shards in a layout that is not row-major, as on a TPU."""
import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from jax.sharding import SingleDeviceSharding  # noqa: E402

import hoist  # noqa: E402
from test_jax import bits, mesh, random  # noqa: E402
from test_numpy import spy_repeats  # noqa: E402


@pytest.fixture
def transfers(monkeypatch):
    """Every jax.device_put call into host memory: the shards it carried."""
    calls = []
    put = jax.device_put

    def spy(x, device=None, *args, **kwargs):
        targets = device if isinstance(device, (list, tuple)) else [device]
        # A sharding, or a Format (a layout and a sharding).
        kinds = [getattr(getattr(t, "sharding", t), "memory_kind", None)
                 for t in targets]
        if any(k in ("pinned_host", "unpinned_host") for k in kinds):
            calls.append(len(x) if isinstance(x, (list, tuple)) else 1)
        return put(x, device, *args, **kwargs)

    monkeypatch.setattr(jax, "device_put", spy)
    return calls


def state(seed, m):
    """Arrays of every kind of sharding and a few dtypes, 8 devices."""
    return {
        "w": jax.device_put(random(np.float32, (16, 8), seed),
                            NamedSharding(m, P("data", "model"))),
        "cols": jax.device_put(random(jnp.bfloat16, (6, 8), seed + 1),
                               NamedSharding(m, P(None, "model"))),
        "bias": jax.device_put(random(np.float32, (8,), seed + 2),
                               NamedSharding(m, P())),
        "f8": jax.device_put(random(jnp.float8_e4m3fn, (4, 4), seed + 3),
                             NamedSharding(m, P("data"))),
        "one": jax.device_put(random(np.int32, (5, 3), seed + 4),
                              SingleDeviceSharding(jax.devices()[3])),
        "step": seed,
    }


# Of state()'s 33 local shards, those the save writes, the only ones the
# engine asks to be produced: one replica of each box: w 8, cols 4
# (replicated over "data"), bias 1, f8 2 (replicated over "model"), one 1.
PRODUCED = 16


def test_forced_pjrt_stages_every_shard_in_one_transfer_per_save(
        root, transfers):
    m = mesh(2, 4)
    with hoist.CheckpointManager(root, staging="pjrt") as mgr:
        repeated = spy_repeats(mgr)
        saved = {}
        for step in range(1, 4):  # the first save, then repeat saves
            saved[step] = state(step * 10, m)
            info = mgr.save(step, saved[step]).wait()
            assert info["pjrt_transfer_calls"] == 1
            assert info["pjrt_shards"] == PRODUCED
        assert repeated == [False, True, True]
        assert transfers == [PRODUCED] * 3  # one call a save
        for step, want in saved.items():
            out = mgr.restore(step)
            assert out["step"] == want["step"]
            for name in ("w", "cols", "bias", "f8", "one"):
                assert bits(out[name]) == bits(want[name]), (step, name)


def test_auto_stages_only_shards_in_another_layout(root, transfers):
    """Row-major CPU shards go by address; those in a column-major layout
    (as a TPU's tiled ones are not row-major) are staged, all arrays of
    them in the one transfer, never np.asarray of each."""
    try:
        from jax.experimental.layout import Format, Layout
    except ImportError:
        pytest.skip("this JAX has no Format")
    one = SingleDeviceSharding(jax.devices()[0])
    column_major = {f"c{i}": jax.device_put(random(np.float32, (8, 4), i),
                                            Format(Layout((1, 0)), one))
                    for i in range(5)}
    plain = {"w": jax.device_put(random(np.float32, (16, 8), 9),
                                 NamedSharding(mesh(2, 4), P("data")))}
    with hoist.CheckpointManager(root) as mgr:
        info = mgr.save(1, plain).wait()
        assert info["pjrt_transfer_calls"] == 0 and transfers == []
        info = mgr.save(2, {**plain, **column_major}).wait()
        assert (info["pjrt_transfer_calls"], info["pjrt_shards"]) == (1, 5)
        info = mgr.save(3, {**plain, **column_major}).wait()  # repeat path
        assert (info["pjrt_transfer_calls"], info["pjrt_shards"]) == (1, 5)
        assert transfers == [5, 5]
        out = mgr.restore(3)
        for name, array in column_major.items():
            assert bits(out[name]) == bits(array), name
        assert bits(out["w"]) == bits(plain["w"])


def test_staged_arrays_stay_donatable(root):
    """The PJRT path keeps no reference to the device arrays once save()
    returns: the next donated step deletes them."""
    m = mesh(2, 4)
    sharding = NamedSharding(m, P("data", "model"))
    step = jax.jit(lambda x: x + 1, donate_argnums=0)
    with hoist.CheckpointManager(root, staging="pjrt") as mgr:
        x = jax.device_put(jnp.zeros((64, 64), jnp.float32), sharding)
        handles, donated = [], []
        for i in range(3):
            handles.append(mgr.save(i, {"x": x}))
            y = step(x)
            donated.append(x.is_deleted())
            x = y
        assert donated == [True, True, True]
        for handle in handles:
            handle.wait()
        assert bits(mgr.restore(2)["x"]) == bits(np.full((64, 64), 2.0,
                                                         np.float32))


def test_a_failed_transfer_names_the_array_and_commits_nothing(root):
    m = mesh(2, 4)
    with hoist.CheckpointManager(root, staging="pjrt") as mgr:
        good = state(1, m)
        mgr.save(1, good).wait()
        bad = state(2, m)
        bad["cols"].delete()  # donated or deleted before the save
        with pytest.raises(ValueError, match="array 'cols' was deleted"):
            mgr.save(2, bad)
        # A transfer that fails names the arrays and devices it carried.
        staging = hoist._xla_staging.Staging("pjrt")
        shard = bad["w"].addressable_shards[0].data
        staging.add("w", shard, lambda taken: None)
        staging.run()
        shard.delete()
        with pytest.raises(RuntimeError, match=r"failed for 'w' on "):
            staging.produce([0])
        mgr.wait_until_finished()
        assert mgr.steps == [1]
        assert bits(mgr.restore(1)["w"]) == bits(good["w"])


def eight_arrays():
    """1 MiB: 8 arrays over both axes of a 2 x 4 mesh, 16 KiB a shard."""
    sharding = NamedSharding(mesh(2, 4), P("data", "model"))
    return {f"w{i}": jax.device_put(random(np.float32, (256, 128), i),
                                    sharding) for i in range(8)}


def test_a_transfer_failing_in_a_later_wave_fails_the_save_whole(
        root, monkeypatch):
    """The engine asks for each wave's shards as it stages it: an array
    deleted before its wave is reached fails the save, naming the wave,
    the array and its device, and nothing of the step is committed."""
    state = eight_arrays()
    produce = hoist._xla_staging.Staging.produce
    waves = []

    def delete_then_produce(self, tokens):
        waves.append(len(tokens))
        if len(waves) == 2:
            state["w7"].delete()
        return produce(self, tokens)

    monkeypatch.setattr(hoist._xla_staging.Staging, "produce",
                        delete_then_produce)
    # 1 MiB of shards through a 256 KiB pool: waves of 128 KiB.
    with hoist.CheckpointManager(root, staging="pjrt",
                                 pool_bytes=256 << 10) as mgr:
        with pytest.raises(RuntimeError) as failed:
            mgr.save(1, state)
        message = str(failed.value)
        # No wave is asked for after the one that failed.
        assert f"for wave {len(waves)} of " in message, message
        assert re.search(r"failed for 'w7' on device \d", message), message
        mgr.wait_until_finished()
        assert mgr.steps == []
    assert len(waves) >= 2


def test_a_state_larger_than_the_pool_is_produced_a_wave_at_a_time(
        root, transfers):
    """Staged through a pool an eighth of its size: one transfer call per
    wave, each at most a wave's bytes (half the pool), and the restore is
    bit-exact."""
    state = eight_arrays()
    produce = hoist._xla_staging.Staging.produce
    wave_bytes = []

    def spy(self, tokens):
        out = produce(self, tokens)
        # Each a host copy at its address (with the copy), or a byte view.
        wave_bytes.append(sum((a[1] if type(a) is tuple else a).nbytes
                              for a in out))
        return out

    with hoist.CheckpointManager(root, staging="pjrt",
                                 pool_bytes=128 << 10) as mgr:
        hoist._xla_staging.Staging.produce = spy
        try:
            info = mgr.save(1, state).wait()
        finally:
            hoist._xla_staging.Staging.produce = produce
        assert info["waves"] > 1
        assert info["pjrt_transfer_calls"] == info["waves"] == len(transfers)
        assert info["pjrt_shards"] == sum(transfers) == 8 * 8
        assert max(wave_bytes) <= 64 << 10
        out = mgr.restore(1)
        for name, array in state.items():
            assert bits(out[name]) == bits(array), name


def test_an_unknown_staging_mode_is_refused(root):
    with pytest.raises(ValueError, match="staging='tpu'"):
        hoist.CheckpointManager(root, staging="tpu")


def test_the_xla_benchmark_counts_one_transfer_per_save(tmp_path):
    """bench/xla.py at a small size: its counts and its restore check (its
    timing goal is the benchmark's to judge, never a test's)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "bench" / "xla.py"
    done = subprocess.run(
        [sys.executable, str(bench), "--size", "16MiB", "--saves", "2",
         "--root", str(tmp_path), "--json"], capture_output=True, text=True,
        timeout=300)
    out = json.loads(done.stdout)
    assert [s["transfer_calls"] for s in out["saves"]] == [1, 1]
    # Only shards the save writes are transferred: at least one of each box
    # (more where the plan splits a replicated box among its replicas), not
    # every replica.
    assert out["arrays"] < out["saved_shards"] <= out["saves"][0]["shards"]
    assert out["saves"][0]["shards"] < out["shards"]
    assert out["restore_exact"] is True
    assert out["goals"]["one transfer call per save (per wave)"] is True
