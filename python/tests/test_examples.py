"""The README's Python examples run as they are."""
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["jax_example.py", "torch_example.py"])
def test_example_runs(name, tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLES / name),
                             str(tmp_path / "ckpt")], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
