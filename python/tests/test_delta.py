"""Delta checkpoints from Python (docs/delta.md): a save writes only what
changed since the newest committed step; every kept step restores
bit-exact, also after retention pruned the step that wrote the bytes."""
import os

import numpy as np
import pytest

import hoist


def lora_state(step):
    rng = np.random.default_rng(step)
    return {"base": {"w": np.arange(256 * 256, dtype=np.float32)
                     .reshape(256, 256)},
            "lora": {"a": rng.standard_normal((64, 16), dtype=np.float32),
                     "b": rng.standard_normal((16, 64), dtype=np.float32)},
            "step": step}


def disk_bytes(root):
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            total += os.stat(os.path.join(folder, name)).st_blocks * 512
    return total


def test_frozen_arrays_are_written_once_and_restore_after_pruning(root):
    frozen = 256 * 256 * 4
    with hoist.CheckpointManager(root, keep=3, pool_bytes=8 << 20) as mgr:
        infos = [mgr.save(step, lora_state(step)).wait()
                 for step in range(1, 7)]
        mgr.wait_until_finished()
        assert infos[0]["referenced_bytes"] == 0
        for info in infos[1:]:
            assert info["referenced_bytes"] == frozen
        assert mgr.steps == [4, 5, 6]
        for step in (4, 5, 6):
            restored = mgr.restore(step)
            expected = lora_state(step)
            assert restored["step"] == step
            for group in ("base", "lora"):
                for key, value in expected[group].items():
                    assert restored[group][key].tobytes() == value.tobytes()
            assert mgr.verify(step) == []
    # One state and the kept changes, not three states.
    state = frozen + 2 * 64 * 16 * 4
    assert disk_bytes(root) <= 1.3 * state


def test_deltas_off_for_the_manager_or_one_save(root):
    with hoist.CheckpointManager(root, deltas=False) as mgr:
        mgr.save(1, lora_state(1)).wait()
        assert mgr.save(2, lora_state(2)).wait()["referenced_bytes"] == 0
        assert mgr.save(3, lora_state(3),
                        deltas=True).wait()["referenced_bytes"] > 0
    with hoist.CheckpointManager(root) as mgr:
        # The repeat-save path (same structure) takes the option too.
        assert mgr.save(4, lora_state(4),
                        deltas=False).wait()["referenced_bytes"] == 0
        assert mgr.save(5, lora_state(5)).wait()["referenced_bytes"] > 0
        for step in range(1, 6):
            assert mgr.restore(step)["lora"]["a"].tobytes() == \
                lora_state(step)["lora"]["a"].tobytes()


def test_frozen_arrays_are_not_copied_again_and_checked(root):
    frozen = 256 * 256 * 4
    for spec in (["base/w"], lambda name: name.startswith("base/")):
        with hoist.CheckpointManager(root, frozen=spec,
                                     frozen_check_every=2) as mgr:
            step0 = (mgr.latest or 0) + 1
            first = mgr.save(step0, lora_state(step0))
            first.wait()
            second = mgr.save(step0 + 1, lora_state(step0 + 1))
            info = second.wait()
            assert info["referenced_bytes"] == frozen
            assert second.progress()[0] == info["bytes"] - frozen
            # The check save: a frozen array that changed fails it.
            changed = lora_state(step0 + 2)
            changed["base"]["w"] = changed["base"]["w"] + 1
            with pytest.raises(ValueError,
                               match="'base/w' is frozen"):
                mgr.save(step0 + 2, changed).wait()
            with pytest.raises(ValueError):  # reported once more
                mgr.wait_until_finished()
            assert mgr.latest == step0 + 1
            restored = mgr.restore(step0 + 1)
            assert restored["base"]["w"].tobytes() == \
                lora_state(0)["base"]["w"].tobytes()
    with pytest.raises(TypeError, match="not one string"):
        hoist.CheckpointManager(root, frozen="base/w")
