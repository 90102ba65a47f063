import errno
import math

import ml_dtypes
import numpy as np
import pytest

import hoist

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8,
          np.uint16, np.uint32, np.uint64, np.float16, ml_dtypes.bfloat16,
          np.float32, np.float64, ml_dtypes.float8_e4m3fn,
          ml_dtypes.float8_e5m2]


def random_array(dtype, shape, seed):
    raw = np.random.default_rng(seed).integers(
        0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize,
        dtype=np.uint8)
    if np.dtype(dtype) == np.bool_:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and (
        np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes())


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips_bit_exact(root, dtype):
    state = {"a": random_array(dtype, (7, 5), 1),
             "scalar": random_array(dtype, (), 2),
             "empty": random_array(dtype, (0, 3), 3)}
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(1, state).wait()
        for restored in (mgr.restore(), mgr.restore(1, like=state)):
            for key in state:
                assert same_bits(restored[key], state[key]), key


def test_large_restored_arrays_are_aligned_writable_and_their_own(root):
    """A restored array hoist allocated (read straight into, O_DIRECT) is
    4 KiB-aligned, bit-exact, writable, and independent of the others and
    of the checkpoint."""
    state = {"big": random_array(np.float32, (768, 1024), 4),      # 3 MiB
             "edge": random_array(np.uint8, (2 << 20,), 5),        # 2 MiB
             "small": random_array(np.float32, (16, 16), 6)}
    with hoist.CheckpointManager(root, pool_bytes=16 << 20) as mgr:
        mgr.save(1, state).wait()
        for out in (mgr.restore(1), mgr.restore(1, like=state)):
            for key in state:
                assert same_bits(out[key], state[key]), key
                assert out[key].flags.writeable, key
            assert out["big"].ctypes.data % 4096 == 0
            assert out["edge"].ctypes.data % 4096 == 0
            out["big"][:] = 0
            out["edge"][-1] ^= 1
            assert same_bits(out["small"], state["small"])
        again = mgr.restore(1)
    assert same_bits(again["big"], state["big"])
    assert same_bits(again["edge"], state["edge"])


def _vm_flags(address):
    """The VmFlags of the mapping that holds `address` (Linux)."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            first = line.split()[0]
            if "-" in first and not line.startswith("VmFlags"):
                try:
                    lo, hi = (int(x, 16) for x in first.split("-"))
                except ValueError:
                    continue
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    return None


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_HUGEPAGE"),
                    reason="no MADV_HUGEPAGE")
def test_arrays_of_a_huge_page_or_more_restore_into_huge_page_memory(
        root, monkeypatch):
    """From 2 MiB on, a restored array is 2 MiB-aligned and its whole 2 MiB
    blocks are advised for huge pages (VmFlags "hg"), its tail is not; past
    the cap on such mappings, or below 2 MiB, arrays come from NumPy's
    allocator, 4 KiB-aligned, and every array is bit-exact either way. (On
    a VM whose host discards freed memory the engine advises against huge
    pages; the path is forced here to test it all the same.)"""
    assert hoist._tree._HUGE_PAGES == hoist._hoist.advise_huge_pages()
    monkeypatch.setattr(hoist._tree, "_HUGE_PAGES", True)
    state = {"big": random_array(np.float32, (640, 1024), 7),   # 2.5 MiB
             "under": random_array(np.uint8, ((2 << 20) - 4096,), 8)}
    with hoist.CheckpointManager(root, pool_bytes=16 << 20) as mgr:
        mgr.save(1, state).wait()
        live = hoist._tree._huge_mappings[0]
        out = mgr.restore(1)
        assert hoist._tree._huge_mappings[0] == live + 1
        big = out["big"].ctypes.data
        assert big % (2 << 20) == 0
        assert "hg" in _vm_flags(big)
        assert "hg" not in _vm_flags(big + (2 << 20))  # the tail
        # "under" is NumPy's (the count of hoist's mappings rose by one):
        # its VmFlags are NumPy's and glibc's to set (NumPy advises huge
        # pages for its own arrays of 4 MiB or more, and glibc may place a
        # later array in that heap), so they are not checked.
        assert out["under"].ctypes.data % 4096 == 0
        for key in state:
            assert same_bits(out[key], state[key]), key
        del out, big  # freed at once: no reference cycle holds them
        assert hoist._tree._huge_mappings[0] == live
        monkeypatch.setattr(hoist._tree, "_MAX_HUGE_MAPPINGS", live)
        capped = mgr.restore(1)
        assert hoist._tree._huge_mappings[0] == live
        assert "hg" not in (_vm_flags(capped["big"].ctypes.data) or [])
        assert capped["big"].ctypes.data % 4096 == 0
        for key in state:
            assert same_bits(capped[key], state[key]), key


def test_pytree_structure_and_non_array_leaves_come_back(root):
    state = {"model": {"layers": [{"w": np.ones((2, 2))}, {"w": np.zeros(3)}]},
             "opt": ({"count": 7}, None),
             "lr": 3e-4, "inf": math.inf, "nan": math.nan, "name": "gpt",
             "flag": True, 5: "int key"}
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(3, state, metadata={"run": "a"}).wait()
        out = mgr.restore()
        assert mgr.metadata() == {"run": "a"}
        names = [a["name"] for a in hoist.inspect(root)["arrays"]]
    assert sorted(names) == ["model/layers/0/w", "model/layers/1/w"]
    assert isinstance(out["opt"], tuple) and out["opt"][0] == {"count": 7}
    assert out["lr"] == 3e-4 and out["inf"] == math.inf
    assert math.isnan(out["nan"]) and out["name"] == "gpt"
    assert out["flag"] is True and out[5] == "int key"
    assert same_bits(out["model"]["layers"][0]["w"], np.ones((2, 2)))


def test_non_contiguous_arrays_are_copied_first(root):
    base = random_array(np.float32, (8, 6), 4)
    state = {"t": base.T, "s": base[::2, 1:4]}
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(1, state).wait()
        out = mgr.restore()
    assert np.array_equal(out["t"], base.T)
    assert np.array_equal(out["s"], base[::2, 1:4])


def test_retention_latest_and_dispatched_mode(root):
    with hoist.CheckpointManager(root, keep=2, pool_bytes=8 << 20) as mgr:
        for step in range(1, 6):
            state = {"w": random_array(np.float32, (64, 64), step)}
            handle = mgr.save(step, state, return_when="dispatched")
            handle.wait_staged()
            state["w"][:] = 0  # the arrays may change once staged
        mgr.wait_until_finished()
        assert mgr.steps == [4, 5] and mgr.latest == 5
        out = mgr.restore(4)
        assert same_bits(out["w"], random_array(np.float32, (64, 64), 4))


def test_wait_staged_on_the_host_backend_waits_for_the_copies(root):
    class Stream:  # what a torch.cuda.Stream offers
        cuda_stream = 0

    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        for step, stream in ((1, None), (2, Stream()), (3, 0)):
            state = {"w": random_array(np.float32, (256, 64), step)}
            handle = mgr.save(step, state, return_when="dispatched")
            handle.wait_staged_on(stream)
            staged, _, total = handle.progress()
            assert staged == total  # no device queue: the CPU waited
            state["w"][:] = 0
            handle.wait()
        for step in (1, 2, 3):
            assert same_bits(mgr.restore(step)["w"],
                             random_array(np.float32, (256, 64), step))


def test_a_flipped_byte_is_a_data_loss_error(root):
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(1, {"w": random_array(np.float32, (256,), 5)}).wait()
        manifest = hoist.inspect(root)
        extent = manifest["arrays"][0]["extents"][0]
        path = root / "step_00000001" / extent["file"]
        data = bytearray(path.read_bytes())
        data[extent["offset"] + 10] ^= 0x01
        path.write_bytes(bytes(data))
        assert any("xxh3 mismatch" in p for p in mgr.verify(1))
        with pytest.raises(hoist.DataLossError, match="xxh3 mismatch"):
            mgr.restore(1)


def test_verify_by_path_reads_beside_the_manager_that_holds_the_root(root):
    """hoist.verify takes no lock (the manager holds it) and no pool."""
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        for step in (1, 2):
            mgr.save(step, {"w": random_array(np.float32, (256,), step)})
        mgr.wait_until_finished()
        assert hoist.verify(root) == (2, [])   # the newest step
        assert hoist.verify(root / "step_00000001") == (1, [])
        extent = hoist.inspect(root)["arrays"][0]["extents"][0]
        path = root / "step_00000002" / extent["file"]
        data = bytearray(path.read_bytes())
        data[extent["offset"] + 10] ^= 0x01
        path.write_bytes(bytes(data))
        step, problems = hoist.verify(root)
        assert step == 2 and any("xxh3 mismatch" in p for p in problems)
        assert hoist.verify(root / "step_00000001") == (1, [])
    with pytest.raises(FileNotFoundError, match="no committed step 7"):
        hoist.verify(root / "step_00000007")
    (root.parent / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither a step directory"):
        hoist.verify(root.parent / "empty")


def test_bad_input_raises_the_documented_exceptions(root):
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        with pytest.raises(TypeError, match="cannot save a set"):
            mgr.save(1, {"s": {1, 2}})
        with pytest.raises(TypeError, match="object arrays"):
            mgr.save(1, {"o": np.array([object()])})
        with pytest.raises(ValueError, match="complex"):
            mgr.save(1, {"c": np.zeros(2, np.complex64)})
        with pytest.raises(TypeError, match="JSON"):
            mgr.save(1, {"w": np.zeros(2)}, metadata={"x": object()})
        with pytest.raises(ValueError, match="return_when"):
            mgr.save(1, {"w": np.zeros(2)}, return_when="never")
        with pytest.raises(FileNotFoundError):
            mgr.restore()
        mgr.save(1, {"w": np.zeros((2, 3), np.float32)}).wait()
        with pytest.raises(FileExistsError) as exists:
            mgr.save(1, {"w": np.zeros((2, 3), np.float32)})
        assert exists.value.errno == errno.EEXIST
        with pytest.raises(ValueError, match="requested float32 \\(3, 2\\)"):
            mgr.restore(1, like={"w": np.zeros((3, 2), np.float32)})
        with pytest.raises(KeyError, match="'v' is not in the checkpoint"):
            mgr.restore(1, like={"v": np.zeros(2)})
        with pytest.raises(ValueError, match="in use by another"):
            hoist.CheckpointManager(root)
        with pytest.raises(FileNotFoundError):
            mgr.restore(9)
    with pytest.raises(ValueError, match="backend 'tpu'"):
        hoist.CheckpointManager(root, backend="tpu")
    with pytest.raises(ValueError, match="keep"):
        hoist.CheckpointManager(root, keep=0)
    mgr = hoist.CheckpointManager(root, pool_bytes=8 << 20)
    mgr.close()
    with pytest.raises(ValueError, match="closed"):
        mgr.steps


def test_read_only_arrays_save(root):
    # np.frombuffer over bytes, a memory map opened "r": read-only memory.
    a = np.frombuffer(bytes(range(256)), dtype=np.uint8).reshape(16, 16)
    assert not a.flags.writeable
    with hoist.CheckpointManager(root, pool_bytes=1 << 20) as mgr:
        mgr.save(1, {"a": a}).wait()
        out = mgr.restore()
    np.testing.assert_array_equal(out["a"], a)


def test_restoring_some_arrays_reads_only_theirs(root):
    state = {"params": {"w": np.arange(4096, dtype=np.float32).reshape(64, 64),
                        "b": np.arange(64, dtype=np.float32)},
             "opt": {"mu": np.ones((256, 256), np.float32)}, "step": 3}
    with hoist.CheckpointManager(root, pool_bytes=1 << 20) as mgr:
        mgr.save(1, state).wait()
        # By name: a flat dict of just those arrays.
        out = mgr.restore(names=["params/b", "params/w"])
        assert sorted(out) == ["params/b", "params/w"]
        np.testing.assert_array_equal(out["params/w"], state["params"]["w"])
        wanted = state["params"]["w"].nbytes + state["params"]["b"].nbytes
        assert mgr.last_restore["bytes_read"] == wanted
        assert mgr.last_restore["target_bytes"] == wanted
        # By a template holding only some leaves.
        out = mgr.restore(like={"opt": {"mu": np.empty((256, 256),
                                                       np.float32)}})
        np.testing.assert_array_equal(out["opt"]["mu"], state["opt"]["mu"])
        assert mgr.last_restore["bytes_read"] == state["opt"]["mu"].nbytes
        with pytest.raises(KeyError, match="params/nope"):
            mgr.restore(names=["params/nope"])
        with pytest.raises(ValueError, match="not both"):
            mgr.restore(like=state, names=["params/w"])


def test_a_split_manifest_serves_restores_deltas_and_the_cli(root):
    # Split above 0 extents: every step's manifest is hoist/3, a head and a
    # section per array, which a restore of some arrays reads alone.
    import json
    import subprocess
    import sys
    from pathlib import Path
    state = {"params": {"w": np.arange(4096, dtype=np.float32).reshape(64, 64),
                        "b": np.arange(64, dtype=np.float32)}, "step": 3}
    with hoist.CheckpointManager(root, pool_bytes=1 << 20,
                                 split_manifest_above_extents=0) as mgr:
        mgr.save(1, state).wait()
        mgr.save(2, state).wait()  # a delta: every byte in step 1
        with open(Path(root) / "step_00000002" / "MANIFEST.json") as f:
            assert f.read(21) == '{"format": "hoist/3",'
        out = mgr.restore(2, names=["params/b"])
        np.testing.assert_array_equal(out["params/b"], state["params"]["b"])
        assert mgr.last_restore["bytes_read"] == state["params"]["b"].nbytes
        whole = mgr.restore(2)
        np.testing.assert_array_equal(whole["params"]["w"],
                                      state["params"]["w"])
        assert whole["step"] == 3
        assert mgr._manifest(2)["arrays"][0]["extents"]  # one JSON document
    read = hoist.read(root, 2, names=["params/w"])
    np.testing.assert_array_equal(read["params/w"], state["params"]["w"])
    cli = Path(sys.executable).parent / "hoist"
    shown = json.loads(subprocess.run(
        [str(cli), "inspect", str(Path(root) / "step_00000002"), "--json"],
        check=True, capture_output=True, text=True).stdout)
    assert shown["format"] == "hoist/3" and "files" not in shown, shown
    assert shown["referenced_bytes"] == shown["bytes"] > 0, shown
    assert [a["extents"] for a in shown["arrays"]] == [1, 1], shown
    shown = json.loads(subprocess.run(
        [str(cli), "inspect", str(root), "--json", "--files"],
        check=True, capture_output=True, text=True).stdout)
    assert shown["files"] and all(f.startswith("step 1: data/")
                                  for f in shown["files"]), shown
    listed = subprocess.run([str(cli), "ls", str(root)], check=True,
                            capture_output=True, text=True).stdout
    assert "committed" in listed.splitlines()[2], listed
    subprocess.run([str(cli), "verify", str(root)], check=True,
                   capture_output=True)


def test_namedtuples_are_named_by_field_with_or_without_jax(root):
    # In a fresh interpreter that never imports JAX (hoist does not either),
    # a namedtuple is named by its fields, as JAX's key paths name it, and
    # comes back as itself.
    import subprocess
    import sys
    code = f"""
import collections, sys, numpy as np, hoist
Adam = collections.namedtuple("Adam", ["count", "mu"])
state = {{"opt": Adam(np.int32(3), {{"w": np.ones(4, np.float32)}})}}
with hoist.CheckpointManager({str(root)!r}, pool_bytes=1 << 20) as mgr:
    mgr.save(1, state).wait()
    out = mgr.restore(like=state)
assert "jax" not in sys.modules
assert type(out["opt"]) is Adam and int(out["opt"].count) == 3
names = sorted(a["name"] for a in hoist.inspect({str(root)!r})["arrays"])
print(names)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "['opt/count', 'opt/mu/w']" in result.stdout


def spy_repeats(mgr):
    """A list that gets, per save(), whether it took the repeat path."""
    calls = []
    again = mgr._save_again

    def spy(*args):
        handle = again(*args)
        calls.append(handle is not None)
        return handle

    mgr._save_again = spy
    return calls


def test_repeat_saves_of_one_structure_restore_each_steps_values(root):
    # A loop's state: the same dicts and arrays every step, new values and
    # scalars; saves after the first take the repeat path.
    def state(step):
        return {"model": {f"w{i}": random_array(np.float32, (16, 8), step * 10 + i)
                          for i in range(5)},
                "opt": {"count": np.array(step, np.int64),
                        "lr": 0.1 / step, "name": f"run{step % 2}",
                        1: np.full(3, step, np.int16)},
                "step": step, "nan": float("nan"), "flag": step % 2 == 0}

    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        repeated = spy_repeats(mgr)
        for step in range(1, 5):
            mgr.save(step, state(step),
                     metadata=None if step < 3 else {"at": step}).wait()
        assert repeated == [False, True, True, True]
        for step in range(1, 5):
            out = mgr.restore(step)
            want = state(step)
            for i in range(5):
                assert same_bits(out["model"][f"w{i}"], want["model"][f"w{i}"])
            assert out["opt"]["count"] == step and out["opt"][1][0] == step
            assert out["opt"]["lr"] == want["opt"]["lr"]
            assert out["opt"]["name"] == want["opt"]["name"]
            assert out["step"] == step and math.isnan(out["nan"])
            assert out["flag"] is (step % 2 == 0)
            assert mgr.metadata(step) == (None if step < 3 else {"at": step})


def test_metadata_changed_in_place_between_repeat_saves_is_saved(root):
    state = {"w": random_array(np.float32, (64,), 1)}
    meta = {"loss": 1.0}
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(1, state, metadata=meta).wait()
        meta["loss"] = 0.5  # the same dict, changed
        mgr.save(2, state, metadata=meta).wait()
        with pytest.raises(TypeError):
            mgr.save(3, state, metadata={"x": np.zeros(2)})
        assert mgr.metadata(1) == {"loss": 1.0}
        assert mgr.metadata(2) == {"loss": 0.5}


def test_a_changed_structure_is_walked_whole_again(root):
    base = {"a": random_array(np.float32, (8, 4), 1), "b": {"c": 1}}
    changes = [
        {"a": random_array(np.float32, (8, 5), 2), "b": {"c": 1}},  # shape
        {"a": random_array(np.float64, (8, 5), 3), "b": {"c": 1}},  # dtype
        {"a": random_array(np.float64, (5, 8), 4).T, "b": {"c": 1}},  # strided
        {"a": random_array(np.float64, (8, 5), 5), "b": {"c": 1, "d": 2}},
        {"b": {"c": 1}, "a": random_array(np.float64, (8, 5), 6)},  # order
        {"a": [np.zeros(2)], "b": {"c": 1}},  # a list where an array was
        {"a": random_array(np.float64, (8, 5), 7), "b": {True: 1}},  # key type
        {"a": random_array(np.float64, (8, 5), 8), "b": {"c": 1.5}},  # scalar
    ]
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        repeated = spy_repeats(mgr)
        for step, state in enumerate([base] + changes, start=1):
            if step == 8:
                with pytest.raises(TypeError, match="not a str or int"):
                    mgr.save(step, state)
                continue
            mgr.save(step, state).wait()
            out = mgr.restore(step)
            assert list(out) == list(state) and out["b"] == state["b"]
            if isinstance(state["a"], list):
                assert np.array_equal(out["a"][0], state["a"][0])
            else:
                assert out["a"].dtype == state["a"].dtype
                assert same_bits(out["a"], state["a"])
        # Every change took the whole walk (the refused key's save too, and
        # the one after it, as nothing was planned after a refusal); the
        # same state again repeats.
        assert repeated == [False] * 9
        mgr.save(10, changes[-1]).wait()
        assert repeated[-1] is True


def test_a_repeat_save_that_fails_changes_nothing_and_the_next_succeeds(root):
    state = {"w": random_array(np.float32, (64,), 1)}
    with hoist.CheckpointManager(root, pool_bytes=8 << 20) as mgr:
        mgr.save(1, state).wait()
        state["w"] = random_array(np.float32, (64,), 2)
        with pytest.raises(FileExistsError):
            mgr.save(1, state)  # the repeat path: step 1 is committed
        mgr.save(2, state).wait()
        assert same_bits(mgr.restore(1)["w"], random_array(np.float32, (64,), 1))
        assert same_bits(mgr.restore(2)["w"], state["w"])


def test_shared_reads_takes_auto_or_a_bool(tmp_path):
    for value in ("auto", True, False):
        hoist.CheckpointManager(tmp_path / str(value),
                                shared_reads=value).close()
    with pytest.raises(ValueError, match="shared_reads='yes'"):
        hoist.CheckpointManager(tmp_path / "bad", shared_reads="yes")


def test_read_restores_beside_the_manager_that_holds_the_root(root):
    """hoist.read needs no lock and no pool: it restores a step while the
    root's manager is open (and saving), like=/names=/step= as restore."""
    with hoist.CheckpointManager(root, pool_bytes=1 << 20) as mgr:
        mgr.save(1, {"w": np.arange(6.0), "meta": {"n": 3}}).wait()
        mgr.save(2, {"w": np.arange(6.0) * 2, "meta": {"n": 4}}).wait()
        newest = hoist.read(root)
        assert np.array_equal(newest["w"], np.arange(6.0) * 2)
        assert newest["meta"] == {"n": 4}
        first = hoist.read(root, 1, names=["w"])
        assert np.array_equal(first["w"], np.arange(6.0))
        like = hoist.read(root / "step_00000001", like={"w": np.zeros(6)})
        assert np.array_equal(like["w"], np.arange(6.0))
        with pytest.raises(FileNotFoundError):
            hoist.read(root, 7)
        with pytest.raises(KeyError, match="'x'"):
            hoist.read(root, names=["x"])
