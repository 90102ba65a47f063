"""PyTorch/XLA: an SPMD job on torch_xla's CPU client (8 devices) saves with
hoist, is killed mid-save, and resumes bit-identical to the job that ran
uninterrupted; each save moves its tensors in one batched call for the
sharded ones and one for the rest; a restore goes onto another mesh.

torch-xla pins its own torch, so its jobs run with the interpreter of
.venv-xla (tools/test.sh makes it and installs the hoist wheel it built
into it; dist/torch_xla_worker.py is the job). Without it these tests skip,
unless HOIST_REQUIRE_XLA=1 (tools/test.sh sets it)."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hoist

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "dist" / "torch_xla_worker.py"
BIN = Path(sys.executable).parent
STEPS, KILL_AT = 8, 5


def _xla_python():
    venv = Path(os.environ.get("HOIST_XLA_VENV", REPO / ".venv-xla"))
    python = venv / "bin" / "python"
    if not python.exists():
        message = (f"no PyTorch/XLA virtualenv at {venv} (tools/test.sh "
                   "makes it)")
        if os.environ.get("HOIST_REQUIRE_XLA"):
            pytest.fail(message)
        pytest.skip(message)
    return python


def _package_digest(python):
    """A digest of the hoist package's Python files as `python` imports
    them."""
    where = subprocess.run(
        [str(python), "-c", "import hoist, os; "
         "print(os.path.dirname(hoist.__file__))"],
        capture_output=True, text=True, check=True).stdout.strip()
    digest = hashlib.sha256()
    for path in sorted(Path(where).glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def _run(python, *args):
    env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES="8",
               OMP_NUM_THREADS="1")
    env.pop("XLA_FLAGS", None)  # JAX's, which torch_xla would read too
    done = subprocess.run([str(python), str(WORKER), *map(str, args)],
                          capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]


@pytest.mark.slow(32)
def test_spmd_job_killed_mid_save_resumes_bit_identical(tmp_path):
    python = _xla_python()
    assert _package_digest(python) == _package_digest(sys.executable), (
        "the hoist package in .venv-xla is not this tree's: run "
        "tools/test.sh (or, after `source tools/common.sh`, python_hoist "
        "and hoist_wheel_into .venv-xla)")
    root, out = tmp_path / "ckpt", tmp_path / "out"
    _run(python, "train", root, out, STEPS, KILL_AT)
    figures = json.loads(Path(f"{out}.train.json").read_text())
    assert len(figures) == KILL_AT  # every save before the kill committed
    for i, f in enumerate(figures):
        # 12 tensors (6 weights, 6 momentum buffers), 34 local shards
        # (replicas once): one call for the sharded, one for the rest.
        assert f["xla_transfer_calls"] == 2, f
        assert f["pjrt_transfer_calls"] == 0, f
        assert f["xla_shards"] == figures[0]["xla_shards"] > 12, f
        # The same structure every step: the saves after the first took
        # the repeat path (their shards as the first took them, by address).
        assert f["repeat"] == (i > 0), f
    # The save in flight when the job died left no step.
    with hoist.CheckpointManager(root) as mgr:
        assert mgr.steps == list(range(KILL_AT))

    _run(python, "resume", root, out, STEPS)
    seen = json.loads(Path(f"{out}.resume.json").read_text())
    assert seen["resumed"] == KILL_AT - 1
    assert seen["momentum_on"].startswith("xla"), seen
    # Three tensors with pending computation: one graph run for the save.
    assert seen["syncs"] == 1, seen
    assert "'model/0.weight': requested float32 (40, 23)" in \
        seen["wrong_shape"], seen
    # Restored onto the 2 x 4 mesh with the template's sharding (the
    # unsharded template tensors come back replicated).
    for name, spec in seen["template_specs"].items():
        assert seen["other_specs"][name] == (spec or "{replicated}"), name
    assert "devices=[2,4]" in seen["other_specs"]["2.weight"]
    done = subprocess.run([str(BIN / "hoist"), "verify", str(root)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow(30)
def test_benchmark_runs_and_restores_bit_exact(tmp_path):
    """bench/pytorch_xla.py at a small size: its figures, both restores
    bit-exact and two transfer calls a save (its timing goals are the
    bench's to judge, not a test's)."""
    python = _xla_python()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("XLA_FLAGS", None)
    done = subprocess.run(
        [str(python), str(REPO / "bench" / "pytorch_xla.py"), "--size",
         "16MiB", "--saves", "2", "--root", str(tmp_path), "--json"],
        capture_output=True, text=True, env=env, timeout=300)
    text = done.stdout[done.stdout.find("\n{") + 1:]  # past gloo's lines
    assert text.startswith("{"), (done.stdout + done.stderr)[-6000:]
    out = json.loads(text)
    assert out["hoist_exact"] and out["torch_xla_exact"], out
    assert out["dcp_composes"] == "yes", out["dcp_composes"]
    assert [r["transfer_calls"] for r in out["runs"]["hoist"]] == [2, 2]
    assert set(out["figures"]["torch_xla"]) == {"blocked_s", "durable_s",
                                                "restore_s"}
