"""Interop, checked by the other side's own libraries: hoist steps exported
to safetensors read by `safetensors` and loaded by transformers'
from_pretrained; checkpoints written by safetensors, orbax-checkpoint and
torch.distributed.checkpoint imported as hoist steps and restored
bit-exact; malformed safetensors refused, leaving no step."""
import json
import struct

import ml_dtypes
import numpy as np
import pytest

import hoist

torch = pytest.importorskip("torch")


def _state():
    g = torch.Generator().manual_seed(5)
    return {
        "w": torch.randn(33, 17, generator=g).to(torch.bfloat16),
        "b": torch.randn(17, generator=g),
        "ids": torch.arange(40, dtype=torch.int64).reshape(8, 5),
        "mask": torch.rand(6, generator=g) > 0.5,
        "f8": torch.randn(12, generator=g).to(torch.float8_e4m3fn),
    }


def test_export_is_read_bit_exact_by_safetensors(tmp_path):
    from safetensors import safe_open
    state = _state()
    with hoist.CheckpointManager(tmp_path / "ckpt") as mgr:
        mgr.save(3, {"model": state, "epoch": 2}).wait()
    figures = hoist.export(tmp_path / "ckpt" / "step_00000003",
                           tmp_path / "hf", prefix="model/")
    assert figures["tensors"] == len(state)
    with safe_open(tmp_path / "hf" / "model.safetensors", "pt") as f:
        assert sorted(f.keys()) == sorted(state)
        meta = f.metadata()
        hashes = json.loads(meta["hoist.xxh3"])
        for name, want in state.items():
            got = f.get_tensor(name)
            assert got.dtype == want.dtype and torch.equal(
                got.view(torch.uint8), want.view(torch.uint8)), name
            assert len(hashes[name]) == 16
    assert meta["format"] == "pt" and meta["hoist.step"] == "3"


def test_sharded_export_loads_in_transformers_with_the_same_outputs(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with hoist.CheckpointManager(tmp_path / "ckpt") as mgr:
        mgr.save(1, {"model": model.state_dict()}).wait()
    out = tmp_path / "hf"
    figures = hoist.export(tmp_path / "ckpt", out, prefix="model/",
                           max_shard_bytes=40_000)
    assert len(figures["files"]) > 2            # shards and the index
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    config.save_pretrained(out)
    loaded = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    ids = torch.arange(20).reshape(2, 10) % 128
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_safetensors_file_and_sharded_directory_import_bit_exact(tmp_path):
    from safetensors.torch import save_file
    state = {k: v.contiguous() for k, v in _state().items()}
    save_file(state, tmp_path / "one.safetensors")
    hoist.import_checkpoint(tmp_path / "one.safetensors", tmp_path / "ckpt",
                            7, format="safetensors")
    with hoist.CheckpointManager(tmp_path / "ckpt") as mgr:
        assert mgr.verify(7) == []
        got = mgr.restore(7)
        assert mgr.metadata(7)["imported_from"]["format"] == "safetensors"
    for name, want in state.items():
        raw = want.view(torch.uint8).numpy()
        assert got[name].tobytes() == raw.tobytes(), name
    assert got["w"].dtype == ml_dtypes.bfloat16
    # A sharded directory: hoist's own export of that step, back in.
    hoist.export(tmp_path / "ckpt", tmp_path / "hf", max_shard_bytes=1000)
    hoist.import_checkpoint(tmp_path / "hf", tmp_path / "ckpt", 8,
                            format="safetensors")
    with hoist.CheckpointManager(tmp_path / "ckpt") as mgr:
        again = mgr.restore(8)
    assert {k: v.tobytes() for k, v in again.items()} == {
        k: v.tobytes() for k, v in got.items()}


def test_orbax_checkpoint_imports_and_restores_onto_another_mesh(tmp_path):
    jax = pytest.importorskip("jax")
    ocp = pytest.importorskip("orbax.checkpoint")
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4),
                             ("x", "y"))
    rng = np.random.default_rng(1)
    full = {"params": {"dense": {"kernel": rng.standard_normal(
                (16, 8)).astype(np.float32),
                                 "bias": rng.standard_normal(8).astype(
                                     np.float32)}},
            "step": np.int64(12)}
    tree = {"params": {"dense": {
        "kernel": jax.device_put(full["params"]["dense"]["kernel"],
                                 NamedSharding(mesh, P("x", "y"))),
        "bias": jax.device_put(full["params"]["dense"]["bias"],
                               NamedSharding(mesh, P("y")))}},
        "step": full["step"]}
    ocp.PyTreeCheckpointer().save(tmp_path / "orbax", tree)
    hoist.import_checkpoint(tmp_path / "orbax", tmp_path / "ckpt", 12,
                            format="orbax")
    other = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2),
                              ("x", "y"))
    like = {"params": {"dense": {
        "kernel": jax.ShapeDtypeStruct((16, 8), np.float32,
                                       sharding=NamedSharding(other, P("y"))),
        "bias": jax.ShapeDtypeStruct((8,), np.float32,
                                     sharding=NamedSharding(other, P()))}}}
    with hoist.CheckpointManager(tmp_path / "ckpt") as mgr:
        got = mgr.restore(12, like=like)
        names = {a["name"] for a in hoist.inspect(tmp_path / "ckpt")["arrays"]}
    assert names >= {"params/dense/kernel", "params/dense/bias"}
    for k in ("kernel", "bias"):
        np.testing.assert_array_equal(np.asarray(got["params"]["dense"][k]),
                                      full["params"]["dense"][k])


def test_orbax_checkpoint_named_by_a_relative_path_imports(tmp_path,
                                                           monkeypatch):
    ocp = pytest.importorskip("orbax.checkpoint")
    tree = {"a": np.arange(1000, dtype=np.float32),
            "b": {"c": np.ones((4, 4))}}
    ocp.PyTreeCheckpointer().save(tmp_path / "orbax", tree)
    monkeypatch.chdir(tmp_path)
    hoist.import_checkpoint("orbax", "ckpt", 3, format="orbax")
    with hoist.CheckpointManager("ckpt") as mgr:
        got = mgr.restore(3)
    np.testing.assert_array_equal(got["a"], tree["a"])
    np.testing.assert_array_equal(got["b"]["c"], tree["b"]["c"])


def test_what_is_not_a_readable_orbax_checkpoint_is_named_and_leaves_no_step(
        tmp_path):
    ocp = pytest.importorskip("orbax.checkpoint")
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("x")
    # A CheckpointManager's step directory: its items are named; its own
    # directory (of steps 1000 and 200): the newest step's.
    ocp.PyTreeCheckpointer().save(tmp_path / "1000" / "default",
                                  {"w": np.arange(600, dtype=np.float32)})
    ocp.PyTreeCheckpointer().save(tmp_path / "200" / "state", {"w": 1})
    for src, error, message in [
            ("none", FileNotFoundError, "no such directory"),
            ("a-file", NotADirectoryError, "not a directory"),
            ("empty", FileNotFoundError, "no _METADATA"),
            ("1000", FileNotFoundError, "holds the items default: import "
             "one, e.g. .*1000/default"),
            ("", FileNotFoundError, "directory of 2 steps, the newest "
             "1000: import an item of one, e.g. .*1000/default")]:
        with pytest.raises(error, match=message):
            hoist.import_checkpoint(tmp_path / src, tmp_path / "ckpt", 1,
                                    format="orbax")
    # Its array data cut short: orbax-checkpoint's reason, as DataLossError.
    data = max((p for p in (tmp_path / "1000").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(hoist.DataLossError, match="could not read it"):
        hoist.import_checkpoint(tmp_path / "1000" / "default",
                                tmp_path / "ckpt", 1, format="orbax")
    assert not (tmp_path / "ckpt").exists()


def test_dcp_checkpoint_imports_with_its_tree(tmp_path):
    import torch.distributed.checkpoint as dcp
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(),
                                torch.nn.Linear(4, 2))
    optim = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 6)).sum().backward()
    optim.step()
    state = {"model": model.state_dict(), "extra": {"step": 5}}
    dcp.save(state, checkpoint_id=tmp_path / "dcp", no_dist=True)
    hoist.import_checkpoint(tmp_path / "dcp", tmp_path / "ckpt", 5,
                            format="dcp")
    with hoist.CheckpointManager(tmp_path / "ckpt") as mgr:
        got = mgr.restore(5)
    assert got["extra"]["step"] == 5
    for name, want in model.state_dict().items():
        assert torch.equal(got["model"][name], want), name


def test_an_import_stages_its_largest_array_whole_whatever_the_pool(
        tmp_path):
    """The pool is 256 MiB unless given, raised to the largest array
    (staged whole), as the safetensors import sizes it: not the manager's 1
    GiB, touched at open, on top of a tree held in memory already."""
    import torch.distributed.checkpoint as dcp
    from hoist._interop import _import_pool_bytes
    big = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB
    dcp.save({"model": {"big": big, "b": torch.ones(3)}, "step": 2},
             checkpoint_id=tmp_path / "dcp", no_dist=True)
    hoist.import_checkpoint(tmp_path / "dcp", tmp_path / "ckpt", 2,
                            format="dcp", pool_bytes=1 << 20)
    with hoist.CheckpointManager(tmp_path / "ckpt") as mgr:
        assert torch.equal(mgr.restore(2)["model"]["big"], big)
    assert _import_pool_bytes({"a": [np.ones(3)], "n": 7}, 256 << 20) == (
        256 << 20)
    huge = np.empty((300 << 20) + 1, np.uint8)  # untouched: no memory used
    assert _import_pool_bytes({"x": {"y": (huge, big)}}, 256 << 20) == (
        (300 << 20) + 4096)


def test_what_is_not_a_readable_dcp_checkpoint_is_named_and_leaves_no_step(
        tmp_path):
    import torch.distributed.checkpoint as dcp
    (tmp_path / "empty").mkdir()
    state = {"w": torch.arange(1000, dtype=torch.float32)}
    # A directory of a job's checkpoints: the newest is named.
    for step in (200, 1000):
        dcp.save(state, checkpoint_id=tmp_path / "run" / f"step_{step}",
                 no_dist=True)
    for src, error, message in [
            (tmp_path / "none", FileNotFoundError, "no such directory"),
            (tmp_path / "empty", FileNotFoundError, r"no \.metadata file"),
            (tmp_path / "run", FileNotFoundError, "it holds 2 DCP "
             "checkpoints, the newest step_1000: import one, e.g. "
             ".*run/step_1000")]:
        with pytest.raises(error, match=message):
            hoist.import_checkpoint(src, tmp_path / "ckpt", 1, format="dcp")
    # Its metadata garbled, then (written again) its data cut short: torch's
    # reason, as a DataLossError (torch's own exception is a BaseException).
    for spoil in ("metadata", "data"):
        src = tmp_path / spoil
        dcp.save(state, checkpoint_id=src, no_dist=True)
        if spoil == "metadata":
            (src / ".metadata").write_bytes(b"not a pickle")
        else:
            data = next(src.glob("*.distcp"))
            data.write_bytes(data.read_bytes()[:100])
        with pytest.raises(hoist.DataLossError, match="could not read it"):
            hoist.import_checkpoint(src, tmp_path / "ckpt", 1, format="dcp")
    assert not (tmp_path / "ckpt").exists()


def _safetensors_bytes(header, data):
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("make,message", [
    (lambda: b"\x10\x00", "too short"),
    (lambda: struct.pack("<Q", 1000) + b"{}", "runs past the file"),
    (lambda: _safetensors_bytes(
        {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
         "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
        bytes(12)), "overlapping"),
    (lambda: _safetensors_bytes(
        {"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}},
        bytes(8)), "dtype 'C64'"),
    (lambda: _safetensors_bytes(
        {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
        bytes(8)), r"8 bytes for shape \[3\]"),
    (lambda: b"\x04\x00\x00\x00\x00\x00\x00\x00nope", "not JSON"),
])
def test_malformed_safetensors_is_refused_and_leaves_no_step(
        tmp_path, make, message):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(make())
    with pytest.raises(hoist.DataLossError, match=message):
        hoist.import_checkpoint(path, tmp_path / "ckpt", 1,
                                format="safetensors")
    assert not (tmp_path / "ckpt").exists()


def test_an_index_naming_a_missing_shard_is_refused(tmp_path):
    from safetensors.numpy import save_file
    save_file({"a": np.ones(3, np.float32)},
              tmp_path / "model-00001-of-00002.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({
        "metadata": {}, "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(FileNotFoundError,
                       match="names model-00002-of-00002.safetensors"):
        hoist.import_checkpoint(tmp_path, tmp_path / "ckpt", 1,
                                format="safetensors")
    assert not (tmp_path / "ckpt").exists()
