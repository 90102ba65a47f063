"""hoist.lightning.HoistCheckpointIO with the real Lightning: ModelCheckpoint
(top-k removal, last.ckpt) and trainer.fit(ckpt_path=...) on one device and
under DDP (torchrun, 2 processes), a job SIGKILLed while a save is in
flight resuming bit-identical, on a directory and on S3; what Lightning
wrote itself still loads; pickled objects only with consent."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")

import hoist  # noqa: E402
import hoist.integrations  # noqa: E402
from hoist.lightning import POINTER_FORMAT, HoistCheckpointIO  # noqa: E402
from test_multiprocess import torchrun  # noqa: E402

HERE = Path(__file__).resolve().parent / "dist"
BIN = Path(sys.executable).parent



def _fit(nproc, ckpt_dir, out, epochs=4, check=True, first=(), **options):
    """Runs lightning_train.py: the jobs `first` ((ckpt_dir, out, epochs,
    options) each), then this one, in the same processes."""
    args = []
    for job in [*first, (ckpt_dir, out, epochs, options)]:
        args += [str(job[0]), str(job[1]), str(job[2]), json.dumps(job[3])]
    if nproc > 1:
        return torchrun(nproc, *args, script="lightning_train.py",
                        check=check)
    done = subprocess.run([sys.executable, str(HERE / "lightning_train.py"),
                           *args], capture_output=True, text=True,
                          timeout=300)
    if check and done.returncode != 0:
        pytest.fail(f"lightning_train {options} failed:\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
    return done


def _listed(ckpt_dir):
    if "://" in str(ckpt_dir):
        import fsspec
        fs, at = fsspec.core.url_to_fs(str(ckpt_dir))
        return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(at, detail=False))
    return sorted(p.name for p in Path(ckpt_dir).iterdir())


@pytest.mark.slow(42)
@pytest.mark.parametrize("nproc,base", [
    # One device resumes in test_a_checkpoint_lightning_wrote_itself_...
    pytest.param(1, "posix", marks=pytest.mark.long), (2, "posix"),
    pytest.param(2, "s3", marks=pytest.mark.long)], indirect=["base"])
def test_job_killed_mid_save_resumes_bit_identical(nproc, base, tmp_path):
    """Trained 4 epochs uninterrupted, and again killed (SIGKILL) right
    after the save of epoch 2 returned: restarted from its last.ckpt, the
    job ends with the same parameters, bit for bit. ModelCheckpoint's
    top-2 and last.ckpt are pointers to committed steps of DIR/.hoist;
    `hoist verify` passes there."""
    # The uninterrupted job, then (in the same processes) the killed one.
    killed = _fit(nproc, f"{base}/b", tmp_path / "b.pt", check=False,
                  kill_epoch=2, first=[(f"{base}/a", tmp_path / "a.pt", 4,
                                        {})])
    assert killed.returncode != 0
    _fit(nproc, f"{base}/b", tmp_path / "c.pt", resume=f"{base}/b/last.ckpt")
    # It resumed after epoch 0 or 1 (as far as the kill let the last
    # checkpoint commit), not from scratch.
    assert (tmp_path / "c.pt.start").read_text() in ("1", "2")
    want, got = (torch.load(tmp_path / f"{k}.pt") for k in "ac")
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key
    # The top-2 and last.ckpt the uninterrupted run kept (and, when the
    # restart went back past a checkpoint the killed run had committed,
    # that one: Lightning no longer tracks it), each naming a committed
    # step.
    listed = _listed(f"{base}/b")
    assert set(_listed(f"{base}/a")) <= set(listed), listed
    io = HoistCheckpointIO()
    for name in listed[1:]:
        assert io.load_checkpoint(f"{base}/b/{name}")["epoch"] >= 0, name
    done = subprocess.run([str(BIN / "hoist"), "verify", f"{base}/b/.hoist"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_checkpoint_lightning_wrote_itself_still_loads(tmp_path):
    """A job that switches to HoistCheckpointIO resumes from the .ckpt file
    Lightning's own TorchCheckpointIO wrote before."""
    # Three jobs in one process: uninterrupted, Lightning's own IO for 2
    # epochs, then hoist's resuming from what Lightning wrote.
    _fit(1, tmp_path / "b", tmp_path / "c.pt", epochs=3,
         resume=str(tmp_path / "b" / "last.ckpt"),
         first=[(tmp_path / "a", tmp_path / "a.pt", 3, {}),
                (tmp_path / "b", tmp_path / "b.pt", 2, {"io": "torch"})])
    assert (tmp_path / "c.pt.start").read_text() == "2"
    want, got = (torch.load(tmp_path / f"{k}.pt") for k in "ac")
    for key in want:
        assert torch.equal(got[key], want[key]), key


class Opaque:
    def __init__(self, value):
        self.value = value


def test_checkpoint_io_round_trip_and_consent(tmp_path):
    """Tensors, containers and scalars come back as saved; an object that
    is not plain data only with weights_only=False; a removed path's step
    goes unless another pointer names it."""
    io = HoistCheckpointIO(pool_bytes=1 << 20)
    checkpoint = {"state_dict": {"w": torch.arange(6.0)}, "epoch": 3,
                  "optimizer_states": [{"param_groups": [{"betas": (0.9,
                                                                    0.99)}]}],
                  "odd": {(1, 2): "tuple key"}, "obj": Opaque(5),
                  "array": np.arange(3)}
    io.save_checkpoint(checkpoint, tmp_path / "a.ckpt")
    io.save_checkpoint({"epoch": 4}, tmp_path / "b.ckpt")
    io.teardown()
    pointer = json.loads((tmp_path / "a.ckpt").read_text())
    assert pointer == {"format": POINTER_FORMAT, "root": ".hoist", "step": 0}
    with pytest.raises(ValueError, match="a.ckpt/obj: a pickled object.*"
                       "Opaque.*weights_only=False"):
        io.load_checkpoint(tmp_path / "a.ckpt")
    loaded = io.load_checkpoint(tmp_path / "a.ckpt", weights_only=False)
    assert torch.equal(loaded["state_dict"]["w"], torch.arange(6.0))
    assert loaded["epoch"] == 3 and loaded["obj"].value == 5
    assert loaded["optimizer_states"][0]["param_groups"][0]["betas"] == (
        0.9, 0.99)
    assert loaded["odd"] == {(1, 2): "tuple key"}
    assert np.array_equal(loaded["array"], np.arange(3))

    # A copy of a pointer keeps its step; the last pointer's removal drops it.
    (tmp_path / "copy.ckpt").write_bytes((tmp_path / "a.ckpt").read_bytes())
    io.remove_checkpoint(tmp_path / "a.ckpt")
    io.teardown()
    assert not (tmp_path / "a.ckpt").exists()
    manager = hoist.integrations._managers.open_manager(
        tmp_path / ".hoist", {})
    assert manager.steps == [0, 1]
    io.remove_checkpoint(tmp_path / "copy.ckpt")
    io.teardown()
    assert manager.steps == [1]
    # Saving over a path moves its pointer to the new step, then drops the
    # old one.
    io.save_checkpoint({"epoch": 5}, tmp_path / "b.ckpt")
    io.teardown()
    assert manager.steps == [2]
    assert io.load_checkpoint(tmp_path / "b.ckpt")["epoch"] == 5


def test_bad_pointers_and_missing_paths_are_named(tmp_path):
    io = HoistCheckpointIO(pool_bytes=1 << 20)
    with pytest.raises(FileNotFoundError, match="not found.*none.ckpt"):
        io.load_checkpoint(tmp_path / "none.ckpt")
    bad = tmp_path / "bad.ckpt"
    bad.write_text(json.dumps({"format": POINTER_FORMAT, "root": "../x",
                               "step": 1}))
    with pytest.raises(ValueError, match="bad.ckpt: a malformed hoist"):
        io.load_checkpoint(bad)
    # A pointer to a step that is not there (its root was deleted).
    bad.write_text(json.dumps({"format": POINTER_FORMAT, "root": ".hoist",
                               "step": 9}))
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(bad)
