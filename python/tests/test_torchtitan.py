"""hoist.torchtitan.CheckpointManager with torchtitan 0.3's own objects
(OptimizersContainer, LRSchedulersContainer, ParallelAwareDataloader, the
manager's ModelWrapper) on an FSDP2 model under torchrun (gloo, CPU),
driven as torchtitan's Trainer drives a manager: async saves every other
step with keep_latest_k, a job SIGKILLed while a save is in flight resuming
bit-identical (data loader position included), on a directory and on S3;
a step loaded on another world size; an initial_load_path; a job that
switches from torchtitan's DCP manager resuming its checkpoints."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")

from test_multiprocess import same_saved, torchrun  # noqa: E402

BIN = Path(sys.executable).parent
OPTIONS = {"interval": 2, "keep_latest_k": 2, "async_mode": "async",
           "last_save_model_only": False}


def _train(nproc, folder, out, steps, check=True, first=(), **options):
    """Runs titan_train.py on `nproc` ranks: the jobs `first` ((folder,
    out, steps, options) each), then this one, in the same processes."""
    args = []
    for job in [*first, (folder, out, steps, options)]:
        args += [job[0], job[1], job[2], json.dumps({**OPTIONS, **job[3]})]
    return torchrun(nproc, *args, script="titan_train.py", check=check)


def _steps(folder):
    listed = subprocess.run([str(BIN / "hoist"), "ls", folder],
                            capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in listed.splitlines()[1:]]


@pytest.mark.slow(27)
def test_job_killed_mid_save_resumes_bit_identical(base, tmp_path):
    """Killed while a save is in flight, the job resumes from its newest
    committed step and ends bit-identical to the job that was not. The
    uninterrupted job's steps also serve the loads: load_step=8 (the data
    loader, per rank, excluded) gives the model the job had at step 8; a
    fresh folder with initial_load_path (model only) starts from that
    model. (Jobs share launches: two, not five. A load on another world
    size goes through hoist.dcp as in test_dcp.py's kill test, which loads
    on 4 ranks what 2 saved.)"""
    # The uninterrupted job, then (in the same processes) the killed one.
    killed = _train(2, f"{base}/b", tmp_path / "b.pt", 8, check=False,
                    kill_at=6, first=[(f"{base}/a", tmp_path / "a.pt", 8, {})])
    assert killed.returncode != 0
    assert _steps(f"{base}/a/ckpt") == [6, 8]  # keep_latest_k=2
    # The resumed job, the load of step 8, then one starting from the
    # uninterrupted job's model (initial_load_path, model only) in a fresh
    # folder.
    _train(2, f"{base}/e", tmp_path / "e.pt", 0,
           initial_load_path=f"{base}/a/ckpt",
           first=[(f"{base}/b", tmp_path / "c.pt", 8, {}),
                  (f"{base}/a", tmp_path / "d.pt", 8,
                   {"load_step": 8,
                    "exclude_from_loading": ["dataloader"]})])
    # From step 4 (or 6, had the killed save committed first).
    assert (tmp_path / "c.pt.start").read_text() in ("4", "6")
    same_saved(tmp_path / "a.pt", tmp_path / "c.pt")
    done = subprocess.run([str(BIN / "hoist"), "verify", f"{base}/b/ckpt"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "d.pt.start").read_text() == "8"
    same_saved(tmp_path / "a.pt", tmp_path / "d.pt")
    assert (tmp_path / "e.pt.start").read_text() == "0"
    same_saved(tmp_path / "a.pt", tmp_path / "e.pt")


@pytest.mark.long
def test_a_job_that_switches_resumes_its_dcp_checkpoints(tmp_path):
    """Trained to step 4 with torchtitan's own DCP manager, then switched
    to hoist's: it resumes from FOLDER/step-4 (read with DCP's reader),
    ends where the job that used hoist throughout ends, and saves hoist
    steps from then on."""
    folder = str(tmp_path / "b")
    _train(2, str(tmp_path / "a"), tmp_path / "a.pt", 8)
    # Stopped at step 4, once its (synchronous) save there returned.
    _train(2, folder, tmp_path / "b.pt", 8, manager="dcp", kill_at=4,
           async_mode="disabled", check=False)
    _train(2, folder, tmp_path / "c.pt", 8)
    assert (tmp_path / "c.pt.start").read_text() == "4"
    same_saved(tmp_path / "a.pt", tmp_path / "c.pt")
    assert _steps(f"{folder}/ckpt") == [6, 8]
