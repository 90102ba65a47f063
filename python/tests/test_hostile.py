"""Values a manifest cannot carry, and manifests that were tampered with:
each is refused with the documented exception, and nothing is lost."""
import json
import math

import numpy as np
import pytest

import hoist

STATE = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}


@pytest.mark.parametrize("metadata", [
    {"lr": math.nan}, {"lr": math.inf}, {"deep": [[-math.inf]]},
], ids=["nan", "inf", "nested-inf"])
def test_nan_in_metadata_is_refused_at_save(root, metadata):
    with hoist.CheckpointManager(root) as mgr:
        with pytest.raises(ValueError, match="NaN and infinities are not JSON"):
            mgr.save(1, STATE, metadata=metadata)
        mgr.save(2, STATE, metadata={"lr": 0.5}).wait()
        assert mgr.steps == [2] and mgr.metadata() == {"lr": 0.5}


@pytest.mark.parametrize("step", [2.5, 2.0, "2", True], ids=repr)
def test_a_step_that_is_not_an_integer_is_refused_by_every_call(root, step):
    """2.5 was saved as step 2, and delete(2.7) deleted step 2."""
    with hoist.CheckpointManager(root) as mgr:
        mgr.save(2, STATE).wait()
        for call in (lambda: mgr.save(step, STATE), lambda: mgr.restore(step),
                     lambda: mgr.metadata(step), lambda: mgr.verify(step),
                     lambda: mgr.delete(step)):
            with pytest.raises(TypeError, match="step must be an integer"):
                call()
        assert mgr.steps == [2]
        # Integers of NumPy (and of the frameworks) are integers.
        mgr.save(np.int64(3), STATE).wait()
        assert mgr.steps == [2, 3]
        np.testing.assert_array_equal(mgr.restore(np.int32(3))["w"],
                                      STATE["w"])


# os.fsdecode of a file name that is not UTF-8 gives a lone surrogate.
LONE = b"caf\xe9.bin".decode("utf-8", "surrogateescape")


@pytest.mark.parametrize("state, metadata", [
    (STATE, {"file": LONE}),
    (STATE, {LONE: 1}),
    ({"w": STATE["w"], "file": LONE}, None),
    ({LONE: STATE["w"]}, None),
], ids=["metadata-value", "metadata-key", "tree-leaf", "array-name"])
def test_text_that_is_not_unicode_is_refused_at_save(root, state, metadata):
    with hoist.CheckpointManager(root) as mgr:
        with pytest.raises(ValueError, match="not valid Unicode"):
            mgr.save(1, state, metadata=metadata)
        mgr.wait_until_finished()
        assert mgr.steps == []


def test_float_leaves_keep_nan_and_infinities(root):
    state = {"w": STATE["w"], "nan": math.nan, "inf": -math.inf}
    with hoist.CheckpointManager(root) as mgr:
        mgr.save(1, state).wait()
        out = mgr.restore()
    assert math.isnan(out["nan"]) and out["inf"] == -math.inf


def _rewrite_manifest(root, step, edit):
    path = root / ("step_%08d" % step) / "MANIFEST.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("edit", [
    lambda m: m["metadata"].update(tree={"d": [["w"]]}),
    lambda m: m["metadata"].update(tree={"d": [["w", {"a": "nope"}]]}),
    lambda m: m["metadata"].update(tree={"z": 1}),
    lambda m: m["metadata"].update(tree=[1, 2]),
    lambda m: m["metadata"].update(tree={"f": "zero"}),
    lambda m: m["metadata"].update(tree={"a": "w", "k": "tensorflow"}),
    lambda m: m["metadata"].update(tree={"n": [[1, {"a": "w"}]]}),
    lambda m: m["metadata"].update(tree={"s": 5}),
    lambda m: m["metadata"].update(tree={"a": "w", "k": "jax_key", "i": 3}),
], ids=["short-pair", "unknown-array", "unknown-node", "not-a-node",
        "bad-float", "unknown-kind", "pytree-int-key", "stateful-not-a-node",
        "key-impl-not-a-string"])
def test_malformed_tree_metadata_is_data_loss(root, edit):
    with hoist.CheckpointManager(root) as mgr:
        mgr.save(1, STATE).wait()
    _rewrite_manifest(root, 1, edit)
    with hoist.CheckpointManager(root) as mgr:
        with pytest.raises(hoist.DataLossError, match="saved tree is malformed"):
            mgr.restore()


def test_manifest_of_another_step_is_data_loss(root):
    with hoist.CheckpointManager(root) as mgr:
        mgr.save(1, STATE).wait()
    _rewrite_manifest(root, 1, lambda m: m.update(step=7))
    with pytest.raises(hoist.DataLossError, match="manifest is of step 7"):
        hoist.inspect(root / "step_00000001")


def test_inspect_of_a_root_picks_the_newest_step_by_number(root):
    with hoist.CheckpointManager(root) as mgr:
        mgr.save(99_999_999, STATE).wait()
        mgr.save(100_000_000, STATE).wait()  # "step_100000000" sorts first
    assert hoist.inspect(root)["step"] == 100_000_000
