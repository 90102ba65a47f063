"""hoist.orbax.CheckpointManager with the real Orbax args: Orbax's save
decisions, retention and items in one process, and a 2-process
jax.distributed job (CPU, gloo) training with optax, SIGKILLed while a
save is in flight, resuming bit-identical from the newest step, on a
directory and on S3."""
import subprocess
import sys
import json
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
ocp = pytest.importorskip("orbax.checkpoint")

from hoist.orbax import CheckpointManager  # noqa: E402
from test_multiprocess import _env, _free_port  # noqa: E402

HERE = Path(__file__).resolve().parent / "dist"
BIN = Path(sys.executable).parent
POOL = {"pool_bytes": 1 << 20}


def _options(**kw):
    return ocp.CheckpointManagerOptions(**kw)


def test_save_decisions_retention_and_items(tmp_path):
    """should_save as Orbax decides it (intervals, the first save, never a
    step at or before the last), max_to_keep, a single item and a
    Composite of items, restored with and without abstract trees."""
    mgr = CheckpointManager(tmp_path / "ckpt", options=_options(
        max_to_keep=2, save_interval_steps=3), hoist=POOL)
    state = {"w": jax.numpy.arange(6.0), "n": 4}
    assert mgr.save(1, args=ocp.args.StandardSave(state))  # the first save
    assert not mgr.save(2, args=ocp.args.StandardSave(state))
    assert mgr.save(3, args=ocp.args.StandardSave(state))
    assert not mgr.should_save(3) and mgr.should_save(6)
    assert mgr.save(4, args=ocp.args.StandardSave(state), force=True)
    mgr.wait_until_finished()
    assert mgr.all_steps() == [3, 4] and mgr.latest_step() == 4
    abstract = {"w": jax.ShapeDtypeStruct((6,), np.float32), "n": 0}
    back = mgr.restore(4, args=ocp.args.StandardRestore(abstract))
    assert isinstance(back["w"], jax.Array) and back["n"] == 4
    assert np.array_equal(back["w"], np.arange(6.0))
    assert np.array_equal(mgr.restore(4)["w"], np.arange(6.0))

    assert mgr.save(6, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        meta=ocp.args.JsonSave({"lr": 0.1, "tags": ["a"]})))
    mgr.wait_until_finished()
    both = mgr.restore(6, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract),
        meta=ocp.args.JsonRestore()))
    assert both.meta == {"lr": 0.1, "tags": ["a"]}
    assert np.array_equal(both.state["w"], np.arange(6.0))
    assert mgr.restore(6).meta["lr"] == 0.1
    with pytest.raises(KeyError, match="no item 'other'"):
        mgr.restore(6, args=ocp.args.Composite(
            other=ocp.args.JsonRestore()))
    mgr.close()


def test_unsupported_options_and_args_are_refused(tmp_path):
    with pytest.raises(NotImplementedError, match="best_fn"):
        CheckpointManager(tmp_path / "a", options=_options(
            best_fn=lambda m: m["loss"]), hoist=POOL)
    mgr = CheckpointManager(tmp_path / "b", hoist=POOL)
    with pytest.raises(TypeError, match="StandardSave"):
        mgr.save(1, args={"w": np.zeros(3)})
    mgr.close()
    read_only = CheckpointManager(tmp_path / "c", options=_options(
        read_only=True), hoist=POOL)
    assert not read_only.save(1, args=ocp.args.StandardSave({"w": 1}))
    assert read_only.all_steps() == []
    read_only.close()


def _processes(*jobs):
    """orbax_train.py's `jobs` ((root, out, steps, options) each) in turn
    in one launch of 2 processes."""
    port = _free_port()
    args = [str(a) for root, out, steps, options in jobs
            for a in (root, out, steps, json.dumps(options))]
    procs = [subprocess.Popen(
        [sys.executable, str(HERE / "orbax_train.py"), str(port), str(p),
         "2", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=_env()) for p in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    return [p.returncode for p in procs], outputs


def test_jax_job_killed_mid_save_resumes_bit_identical(base, tmp_path):
    # The uninterrupted job, then (in the same processes) the killed one.
    codes, outputs = _processes((f"{base}/a", tmp_path / "a.npz", 6, {}),
                                (f"{base}/b", tmp_path / "b.npz", 6,
                                 {"kill_at": 3}))
    assert codes != [0, 0]
    assert (tmp_path / "a.npz").exists(), outputs[0][-4000:]
    codes, outputs = _processes((f"{base}/b", tmp_path / "c.npz", 6, {}))
    assert codes == [0, 0], outputs[0][-4000:]
    # From the save before the kill (or the killed one, had it committed).
    assert (tmp_path / "c.npz.start").read_text() in ("3", "4")
    want, got = np.load(tmp_path / "a.npz"), np.load(tmp_path / "c.npz")
    for key in want:
        assert np.array_equal(got[key], want[key]), key
    done = subprocess.run([str(BIN / "hoist"), "verify", f"{base}/b"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
