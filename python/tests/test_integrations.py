"""What the framework adapters share: `import hoist` (and
hoist.integrations) imports none of the frameworks; one manager per root
in a process, reused by every adapter, refused with other options."""
import subprocess
import sys

import pytest

import hoist.integrations
from hoist.integrations._managers import open_manager

FRAMEWORKS = ("torch", "jax", "lightning", "accelerate", "orbax",
              "torchtitan", "torch_checkpointing")


def test_importing_hoist_imports_no_framework():
    code = ("import sys, hoist, hoist.integrations; "
            f"print([m for m in {FRAMEWORKS!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_one_manager_per_root_shared_by_the_adapters(tmp_path):
    try:
        first = open_manager(tmp_path / "ckpt", {"pool_bytes": 1 << 20})
        # Another spelling of the same root, no options: the same manager.
        again = open_manager(f"{tmp_path}/./ckpt", {})
        assert again is first
        with pytest.raises(ValueError, match="already open with"):
            open_manager(tmp_path / "ckpt", {"pool_bytes": 2 << 20})
    finally:
        hoist.integrations.close_managers()
    # Closed: the root's lock is free for a manager of the caller's.
    with hoist.CheckpointManager(tmp_path / "ckpt", pool_bytes=1 << 20):
        pass
