"""hoist.deepspeed with the real DeepSpeed (CPU: DS_ACCELERATOR=cpu,
gloo): ZeRO 1, 2 and 3 jobs of 2 processes, under torchrun and under the
deepspeed launcher, SIGKILLed while a save is in flight, resume from the
newest committed step bit-identical to an uninterrupted job; `latest`
never names a step that did not commit; `hoist verify` passes; a ZeRO-2
step of 2 processes loads into 1, its optimizer partitions re-cut
bit-exact, and into ZeRO-3 is refused by name; the model states export as
safetensors; a tag that
names no step, and a step DeepSpeed did not write, are refused by name."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

import hoist  # noqa: E402
from test_multiprocess import (  # noqa: E402
    _env, _free_port, job_args, same_saved, torchrun)

HERE = Path(__file__).resolve().parent / "dist"
BIN = Path(sys.executable).parent


@pytest.fixture(autouse=True)
def _cpu_accelerator(monkeypatch):
    """DeepSpeed's jobs run on its CPU accelerator (gloo)."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")


def _launch(*jobs, launcher="torchrun", check=True):
    """deepspeed_train.py with 2 processes under `launcher` ("torchrun" or
    "deepspeed"): each job is (root, out, steps, options), run one after
    another in the same processes."""
    if launcher == "torchrun":
        return torchrun(2, *job_args(jobs), check=check, timeout=300,
                        script="deepspeed_train.py")
    command = [str(BIN / "deepspeed"), "--num_gpus", "2", "--no_local_rank",
               "--master_port", str(_free_port()),
               str(HERE / "deepspeed_train.py"), *job_args(jobs)]
    done = subprocess.run(command, capture_output=True, text=True,
                          timeout=300, env=_env(), cwd=HERE)
    if check and done.returncode != 0:
        pytest.fail(f"deepspeed deepspeed_train.py {jobs} failed:\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return done


def _committed(root):
    with hoist.CheckpointManager(root, pool_bytes=1 << 20) as manager:
        return manager.steps


@pytest.mark.slow(110)
def test_zero_jobs_killed_mid_save_resume_bit_identical(tmp_path):
    out = tmp_path
    # Uninterrupted ZeRO-2 and ZeRO-3 jobs, then a ZeRO-2 job killed with
    # step 4's save in flight (torchrun); a ZeRO-3 one killed at step 6 and
    # a ZeRO-1 job (the deepspeed launcher).
    killed = _launch((out / "z2", out / "z2.pt", 8, {"stage": 2,
                                                     "dump_step": 8}),
                     (out / "z3", out / "z3.pt", 8, {"stage": 3}),
                     (out / "k2", out / "k2.pt", 8, {"stage": 2,
                                                     "kill_step": 4}),
                     check=False)
    assert killed.returncode != 0 and (out / "z3.pt").exists(), \
        killed.stderr[-6000:]
    assert _committed(out / "z2") == [2, 4, 6, 8]
    assert (out / "z2" / "latest").read_text() == "global_step8"
    # `latest` is written once a step has committed, so it never names
    # one the kill interrupted; it may lag (the kill can come between a
    # commit and its `latest`), and the load does not read it.
    newest = _committed(out / "k2")[-1]
    if (out / "k2" / "latest").exists():
        named = (out / "k2" / "latest").read_text()
        assert named in [f"global_step{s}" for s in _committed(out / "k2")]

    killed = _launch((out / "k2", out / "k2b.pt", 8, {"stage": 2,
                                                      "resume": True}),
                     (out / "z1", out / "z1.pt", 8, {"stage": 1}),
                     (out / "k3", out / "k3.pt", 8, {"stage": 3,
                                                     "kill_step": 6}),
                     launcher="deepspeed", check=False)
    assert killed.returncode != 0 and (out / "z1.pt").exists(), \
        killed.stderr[-6000:]
    assert (out / "k2b.pt.start").read_text() == str(newest)
    same_saved(out / "z2.pt", out / "k2b.pt")

    _launch((out / "k3", out / "k3b.pt", 8, {"stage": 3, "resume": True}),
            (out / "z1", out / "z1b.pt", 8, {"stage": 1, "resume": True}))
    assert (out / "k3b.pt.start").read_text() in ("4", "6")
    same_saved(out / "z3.pt", out / "k3b.pt")
    assert (out / "z1b.pt.start").read_text() == "8"
    same_saved(out / "z1.pt", out / "z1b.pt")
    for name in ("z2", "k2", "k3", "z1"):
        done = subprocess.run([str(BIN / "hoist"), "verify", str(out / name)],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    # ZeRO-2's step of 2 processes, loaded by a job of 1: its partitions
    # re-cut, the master weights and moments bit-exact; then it trains on.
    # Into ZeRO-3 (last: it fails) is refused by name.
    done = torchrun(1, *job_args([
        (out / "z2", out / "one.pt", 10, {"stage": 2, "resume": True,
                                          "dump_loaded": True}),
        (out / "z2", out / "three.pt", 10, {"stage": 3, "resume": True})]),
        check=False, timeout=300, script="deepspeed_train.py")
    assert "hoist re-cuts ZeRO 1 and 2 optimizer partitions" in done.stderr, \
        done.stderr[-6000:]
    assert (out / "one.pt.start").read_text() == "8"
    saved, loaded = (torch.load(out / name) for name in
                     ("z2.pt.saved", "one.pt.loaded"))
    names = [key[:-len("/fp32")] for key in saved if key.endswith("/fp32")]
    for kind in ("fp32", "exp_avg", "exp_avg_sq"):
        whole = torch.cat([saved[f"{n}/{kind}"].reshape(-1) for n in names])
        assert torch.equal(loaded[kind][:whole.numel()], whole), kind
    # zero_to_fp32's job: the master weights, whole, by parameter name.
    import hoist.deepspeed
    fp32 = hoist.deepspeed.fp32_state_dict(out / "z2", 8)
    assert sorted(fp32) == sorted(names)
    for name in names:
        assert torch.equal(fp32[name], saved[f"{name}/fp32"]), name
    # Under ZeRO 2 the model states hold the whole module: exported as
    # safetensors, they are the job's final parameters.
    hoist.export(out / "z2" / "step_00000008", out / "hf",
                 prefix="mp_rank_00_model_states.pt/module/")
    from safetensors.torch import load_file
    exported, final = load_file(out / "hf" / "model.safetensors"), \
        torch.load(out / "z2.pt")
    assert exported.keys() == final.keys()
    for key in final:
        assert torch.equal(exported[key], final[key]), key


@pytest.mark.long
def test_zero3_job_on_s3_killed_mid_save_resumes_bit_identical(s3_env,
                                                               tmp_path):
    """The steps on S3 (save_dir stays local: DeepSpeed's own files, and
    `latest`, go there)."""
    root = f"s3://{s3_env.bucket}/ds-{tmp_path.name}"
    out = tmp_path
    killed = _launch((out / "z3", out / "z3.pt", 8, {"stage": 3}),
                     (out / "k3", out / "k3.pt", 8, {
                         "stage": 3, "kill_step": 4, "hoist_root": root}),
                     check=False)
    assert killed.returncode != 0 and (out / "z3.pt").exists(), \
        killed.stderr[-6000:]
    _launch((out / "k3", out / "k3b.pt", 8, {
        "stage": 3, "resume": True, "hoist_root": root}))
    assert (out / "k3b.pt.start").read_text() in ("2", "4")
    same_saved(out / "z3.pt", out / "k3b.pt")
    assert _committed(root) == [2, 4, 6, 8]


def test_tags_and_foreign_steps_are_refused(tmp_path):
    import hoist.deepspeed
    assert hoist.deepspeed.tag_step("global_step12") == 12
    assert hoist.deepspeed.tag_step("7") == 7
    with pytest.raises(ValueError, match="tag 'best' names no step"):
        hoist.deepspeed.tag_step("best")
    with hoist.CheckpointManager(tmp_path, pool_bytes=1 << 20) as manager:
        manager.save(3, {"w": torch.zeros(3)}).wait()
    engine = hoist.deepspeed.HoistCheckpointEngine(tmp_path,
                                                   pool_bytes=1 << 20)
    with pytest.raises(ValueError, match="step 3 of .* was not saved by "
                       "hoist.deepspeed"):
        engine.files(tmp_path, "global_step3")
    assert engine.files(tmp_path, "global_step4") is None
    with pytest.raises(FileNotFoundError, match="holds no step 5"):
        engine.load(tmp_path / "global_step5" / "mp_rank_00_model_states.pt")
    os.makedirs(tmp_path / "own", exist_ok=True)
    torch.save({"w": torch.ones(2)}, tmp_path / "own" / "x.pt")
    # A file DeepSpeed wrote itself loads as its own engine loads it.
    assert torch.equal(engine.load(tmp_path / "own" / "x.pt")["w"],
                       torch.ones(2))
