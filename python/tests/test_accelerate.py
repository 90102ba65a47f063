"""hoist.accelerate with the real Accelerate: a 2-process job (accelerate
launch, CPU) with dropout, a seedable shuffling sampler, a scheduler and a
registered object, SIGKILLed while a save is in flight, resumes
bit-identical, on a directory and on S3; a step it did not write, or one
of another shape of job, is refused by name."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

import hoist  # noqa: E402
import hoist.accelerate  # noqa: E402
from test_multiprocess import _env, _free_port  # noqa: E402

HERE = Path(__file__).resolve().parent / "dist"
BIN = Path(sys.executable).parent



def _launch(root, out, epochs=4, check=True, first=None, **options):
    """accelerate_train.py under `accelerate launch` with 2 processes on
    the CPU (its multi-process launcher: torch.distributed over gloo);
    `first`: (root, out) of an uninterrupted job the same processes run
    before this one."""
    jobs = [str(root), str(out), str(epochs), json.dumps(options)]
    if first is not None:
        jobs = [str(first[0]), str(first[1]), str(epochs), "{}"] + jobs
    command = [str(BIN / "accelerate"), "launch", "--multi_gpu",
               "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(_free_port()),
               str(HERE / "accelerate_train.py"), *jobs]
    done = subprocess.run(command, capture_output=True, text=True,
                          timeout=300, env=_env())
    if check and done.returncode != 0:
        pytest.fail(f"accelerate launch {options} failed:\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return done


@pytest.mark.slow(36)
def test_job_killed_mid_save_resumes_bit_identical(base, tmp_path):
    # The uninterrupted job, then (in the same processes) the killed one.
    killed = _launch(f"{base}/b", tmp_path / "b.pt", check=False,
                     kill_epoch=1, first=(f"{base}/a", tmp_path / "a.pt"))
    assert killed.returncode != 0
    assert (tmp_path / "a.pt").exists(), killed.stderr[-6000:]
    _launch(f"{base}/b", tmp_path / "c.pt", resume=True)
    # Resumed after epoch 0 or 1 (as far as the kill let the save of
    # epoch 1 commit), not from scratch.
    assert (tmp_path / "c.pt.start").read_text() in ("1", "2")
    want, got = (torch.load(tmp_path / f"{k}.pt") for k in "ac")
    for key in want:
        assert torch.equal(got[key], want[key]), key
    done = subprocess.run([str(BIN / "hoist"), "verify", f"{base}/b"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _accelerator(**prepared):
    from accelerate import Accelerator
    accelerator = Accelerator(cpu=True)
    return accelerator, accelerator.prepare(*prepared.values())


def test_single_process_round_trip_and_refusals(tmp_path):
    """In one process: the state comes back; a step hoist.accelerate did
    not write, or one with another number of models, is refused before
    anything is loaded."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optim = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    accelerator, (model, optim) = _accelerator(model=model, optim=optim)
    model(torch.randn(2, 4)).sum().backward()
    optim.step()
    handle = hoist.accelerate.save_state(accelerator, tmp_path / "ckpt", 5,
                                         pool_bytes=1 << 20)
    assert handle.wait()["step"] == 5
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    assert hoist.accelerate.load_state(accelerator, tmp_path / "ckpt") == 5
    for key, value in model.state_dict().items():
        assert torch.equal(value, saved[key]), key
    assert optim.state_dict()["state"][0]["momentum_buffer"] is not None

    with hoist.CheckpointManager(tmp_path / "other", pool_bytes=1 << 20) as m:
        m.save(1, {"w": np.zeros(3)}).wait()
    with pytest.raises(ValueError, match="not saved by hoist.accelerate"):
        hoist.accelerate.load_state(accelerator, tmp_path / "other")

    two, (a, b) = _accelerator(a=torch.nn.Linear(4, 3),
                               b=torch.nn.Linear(4, 3))
    with pytest.raises(ValueError, match="holds 1 models, the accelerator "
                       "prepared 2"):
        hoist.accelerate.load_state(two, tmp_path / "ckpt")
