"""JAX sees 8 CPU devices (set before anything imports jax)."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402


@pytest.fixture
def root(tmp_path):
    return tmp_path / "ckpt"
