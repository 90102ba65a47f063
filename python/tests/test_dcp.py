"""hoist.dcp: PyTorch DCP's dcp.save, dcp.async_save and dcp.load through
hoist's Writer and Reader, with the real DCP: in one process (Stateful
objects, values that are not tensors, checkpoint_id, other dtypes), and
an FSDP2 job under torchrun that is SIGKILLed while a save is in flight and
resumes bit-identical, on 2 ranks and on 4, on a directory and on S3."""
import contextlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import hoist  # noqa: E402
import hoist.dcp  # noqa: E402
import hoist.integrations  # noqa: E402
from test_multiprocess import torchrun  # noqa: E402

BIN = Path(sys.executable).parent
POOL = {"pool_bytes": 16 << 20}


@contextlib.contextmanager
def _fails(kind, match):
    """Expects `kind` with a message matching `match`, raised by hoist or
    DCP (whose CheckpointException, a BaseException, wraps each rank's)."""
    with pytest.raises(BaseException) as caught:
        yield
    error = caught.value
    if isinstance(error, dcp.api.CheckpointException):
        error = next(iter(error.failures.values()))[0]
    assert isinstance(error, kind), repr(error)
    assert re.search(match, str(error)), str(error)



class _App:
    """A Stateful, as torchtitan hands its model and optimizer to DCP."""

    def __init__(self, seed):
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16),
                                         torch.nn.Linear(16, 4))
        self.optim = torch.optim.AdamW(self.model.parameters())
        self.model(torch.randn(3, 8)).sum().backward()
        self.optim.step()

    def state_dict(self):
        return {"model": self.model.state_dict(),
                "optim": self.optim.state_dict()}

    def load_state_dict(self, state):
        self.model.load_state_dict(state["model"])
        self.optim.load_state_dict(state["optim"])


def _same(a, b):
    for key, value in a.model.state_dict().items():
        assert torch.equal(value, b.model.state_dict()[key]), key
    for group, other in zip(a.optim.state_dict()["state"].values(),
                            b.optim.state_dict()["state"].values()):
        for key in group:
            assert torch.equal(group[key], other[key]), key


def test_save_async_save_and_load_in_one_process(tmp_path):
    """dcp.save and dcp.async_save write ordinary hoist steps (ls, verify
    and a hoist restore by name work on them); dcp.load restores the newest
    into a Stateful and the plain values beside it."""
    root = tmp_path / "ckpt"
    app = _App(0)
    extra = {"epoch": 3, "name": "run-1", "lr": [1e-3, 2e-3]}
    dcp.save({"app": app, "extra": extra, "bf16": torch.ones(5).bfloat16()},
             storage_writer=hoist.dcp.Writer(root, 1, **POOL))
    app.model(torch.randn(3, 8)).sum().backward()
    app.optim.step()
    future = dcp.async_save({"app": app, "extra": extra,
                             "bf16": torch.full((5,), 2.0).bfloat16()},
                            storage_writer=hoist.dcp.Writer(root, 2))
    future.result()

    fresh = _App(1)
    state = {"app": fresh, "extra": {"epoch": 0, "name": "", "lr": [0.0, 0]},
             "bf16": torch.zeros(5).bfloat16()}
    dcp.load(state, storage_reader=hoist.dcp.Reader(root))
    _same(app, fresh)
    assert state["extra"] == extra
    assert torch.equal(state["bf16"], torch.full((5,), 2.0).bfloat16())

    # An ordinary hoist step: the CLI verifies it, hoist reads it by name.
    hoist.integrations.close_managers()
    done = subprocess.run([str(BIN / "hoist"), "verify", str(root)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    with hoist.CheckpointManager(root, **POOL) as mgr:
        assert mgr.steps == [1, 2]
        weight = mgr.restore(1, names=["app.model.0.weight"])
    assert np.array_equal(weight["app.model.0.weight"],
                          _App(0).model.state_dict()["0.weight"].numpy())


def test_checkpoint_id_names_the_root_and_step(tmp_path):
    root = tmp_path / "ckpt"
    app = _App(0)
    dcp.save({"app": app}, checkpoint_id=f"{root}/step-7",
             storage_writer=hoist.dcp.Writer(**POOL))
    assert hoist.dcp.Writer.validate_checkpoint_id(f"{root}/step_00000007")
    assert not hoist.dcp.Writer.validate_checkpoint_id(f"{root}/latest")
    fresh = _App(1)
    dcp.load({"app": fresh}, checkpoint_id=root / "step_00000007",
             storage_reader=hoist.dcp.Reader())
    _same(app, fresh)
    with _fails(ValueError, "ends in the step number"):
        dcp.save({"app": app}, checkpoint_id=f"{root}/latest",
                 storage_writer=hoist.dcp.Writer())


def test_load_converts_dtypes_and_fills_views(tmp_path):
    """A destination of another dtype or layout is read, then copied."""
    root = tmp_path / "ckpt"
    w = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    dcp.save({"w": w}, storage_writer=hoist.dcp.Writer(root, 1, **POOL))
    as_double = {"w": torch.zeros(4, 6, dtype=torch.float64)}
    dcp.load(as_double, storage_reader=hoist.dcp.Reader(root))
    assert torch.equal(as_double["w"], w.double())
    transposed = {"w": torch.zeros(6, 4).t()}  # not contiguous
    dcp.load(transposed, storage_reader=hoist.dcp.Reader(root))
    assert torch.equal(transposed["w"], w)


class Opaque:
    """Not plain data: DCP would pickle it."""

    def __init__(self, value):
        self.value = value


def test_pickled_objects_load_only_with_consent(tmp_path):
    root = tmp_path / "ckpt"
    dcp.save({"obj": Opaque(5), "n": 1},
             storage_writer=hoist.dcp.Writer(root, 1, **POOL))
    with _fails(ValueError, r"step 1: 'obj': a pickled object "
                r".*Opaque.*allow_pickle=True"):
        dcp.load({"obj": None, "n": 0},
                 storage_reader=hoist.dcp.Reader(root))
    state = {"obj": None, "n": 0}
    dcp.load(state, storage_reader=hoist.dcp.Reader(root, allow_pickle=True))
    assert state["obj"].value == 5 and state["n"] == 1


def test_bad_input_is_named_and_nothing_committed_is_lost(tmp_path):
    root = tmp_path / "ckpt"
    dcp.save({"w": torch.arange(4096.0)},
             storage_writer=hoist.dcp.Writer(root, 1, **POOL))
    # A missing key, a wrong shape: DCP's planner names them.
    with _fails(RuntimeError, "Missing key in checkpoint.*other"):
        dcp.load({"other": torch.zeros(3)},
                 storage_reader=hoist.dcp.Reader(root))
    with _fails(ValueError, "[Ss]ize mismatch"):
        dcp.load({"w": torch.zeros(3)}, storage_reader=hoist.dcp.Reader(root))
    # No step given anywhere: refused before anything is staged.
    with _fails(ValueError, "no step"):
        dcp.save({"w": torch.zeros(3)},
                 storage_writer=hoist.dcp.Writer(root))
    # A corrupt byte: DataLossError naming the step and the array.
    hoist.integrations.close_managers()
    data = sorted((root / "step_00000001" / "data").iterdir())[0]
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    with _fails(hoist.DataLossError, r"step 1 of .*'w'"):
        dcp.load({"w": torch.zeros(4096)},
                 storage_reader=hoist.dcp.Reader(root, **POOL))
    # A root DCP's own writer filled (no hoist step) is named as such.
    other = tmp_path / "dcp"
    dcp.save({"w": torch.zeros(3)},
             storage_writer=dcp.FileSystemWriter(other))
    # (DCP turns a reader's metadata error into an AssertionError.)
    with _fails(BaseException, "no committed step.*import_checkpoint.*'dcp'"):
        dcp.load({"w": torch.zeros(3)},
                 storage_reader=hoist.dcp.Reader(other, **POOL))


def test_a_hoist_step_not_written_by_dcp_loads(tmp_path):
    """Any hoist step loads through the Reader: keys are array names."""
    root = tmp_path / "ckpt"
    with hoist.CheckpointManager(root, **POOL) as mgr:
        mgr.save(3, {"w": np.arange(6, dtype=np.int32)}).wait()
    state = {"w": torch.zeros(6, dtype=torch.int32)}
    dcp.load(state, storage_reader=hoist.dcp.Reader(root, **POOL))
    assert state["w"].tolist() == list(range(6))


def _runs(out, **specs):
    return [json.dumps({"out": str(out / f"{name}.pt"), **spec})
            for name, spec in specs.items()]


@pytest.mark.slow(41)
def test_fsdp2_job_killed_mid_save_resumes_bit_identical(base, tmp_path):
    """An FSDP2 job on 2 ranks (torchrun, gloo) checkpoints through
    hoist.dcp with dcp.save and dcp.async_save and is SIGKILLed while an
    async save is in flight. Restarted, it resumes from the newest
    committed step and ends bit-identical to the uninterrupted run. On 4
    ranks it resumes bit-identical to the same state resharded through
    full tensors (torch.save, no hoist); `hoist verify` passes."""
    root, out = f"{base}/ckpt", tmp_path
    # One job: the uninterrupted run, then the one that kills itself.
    killed = torchrun(2, root, 8, *_runs(
        out, a={"save_at": [4], "full_at": 4},
        b={"save_at": [5], "kill_at": 6, "async_save": True}),
        script="dcp_train.py", check=False)
    assert killed.returncode != 0
    assert (out / "a.pt").exists(), killed.stderr[-6000:]
    torchrun(2, root, 8, *_runs(out, c={"resume": "latest"}),
             script="dcp_train.py")
    torchrun(4, root, 8, *_runs(out, d={"resume": 4},
                                e={"from_full": str(out / "a.pt.full")}),
             script="dcp_train.py")
    a, c, d, e = (torch.load(out / f"{k}.pt") for k in "acde")
    assert a.keys() == c.keys() == d.keys()
    for key in a:
        assert torch.equal(c[key], a[key]), key
        assert torch.equal(d[key], e[key]), key
    done = subprocess.run([str(BIN / "hoist"), "verify", root],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    listed = subprocess.run([str(BIN / "hoist"), "ls", root],
                            capture_output=True, text=True).stdout
    steps = {int(line.split()[0]) for line in listed.splitlines()[1:]}
    assert {4, 5} <= steps, listed  # 6 too, if it committed before the kill
