"""hoist.transformers with the real Trainer: a 2-process DDP job (torchrun,
CPU, gloo) training a tiny Llama with dropout and a shuffling sampler,
SIGKILLed while a save is in flight, resumes bit-identical to an
uninterrupted job; a plain Trainer's checkpoint-N directory resumes under
HoistTrainer; SIGTERM under enable_jit_checkpoint is a preemption save on
every rank at one step; save_total_limit keeps the newest steps and the
best one; load_best_model_at_end loads it; save_only_model, push_to_hub's
export and the refusals, in one process."""
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import hoist  # noqa: E402
import hoist.integrations  # noqa: E402
from test_multiprocess import (  # noqa: E402
    _env, job_args, same_saved, torchrun)

BIN = Path(sys.executable).parent


def _launch(*jobs, check=True):
    """trainer_train.py under torchrun with 2 processes: each job is
    (root, out, max_steps, options), run one after another."""
    return torchrun(2, *job_args(jobs), check=check, timeout=300,
                    script="trainer_train.py")


def _verify(root):
    done = subprocess.run([str(BIN / "hoist"), "verify", str(root)],
                          capture_output=True, text=True, env=_env())
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow(40)
def test_ddp_jobs_killed_preempted_or_plain_resume_bit_identical(base,
                                                                 tmp_path):
    out = tmp_path
    full, killed, plain, preempted = (f"{base}/{name}" for name in
                                      ("full", "killed", "plain", "jit"))
    # The uninterrupted job (its root keeps 2 steps), a plain Trainer's
    # stopped at step 4 (checkpoint-2, checkpoint-4), a job preempted by
    # SIGTERM at step 3, and one SIGKILLed with step 4's save in flight.
    first = _launch(
        (full, out / "full.pt", 10, {"save_total_limit": 2}),
        (out / "plain", out / "plain.pt", 10, {"plain": True,
                                               "stop_step": 4}),
        (preempted, out / "jit.pt", 10, {"sigterm_step": 3}),
        (killed, out / "killed.pt", 10, {"kill_step": 4}), check=False)
    assert first.returncode != 0
    assert (out / "jit.pt").exists(), first.stderr[-6000:]
    with hoist.CheckpointManager(full, pool_bytes=1 << 20) as manager:
        assert manager.steps == [8, 10]  # save_total_limit=2
    # The preemption save: one step, the same on both ranks, before the
    # end; training stopped there.
    stopped = int((out / "jit.pt.end").read_text())
    assert 3 <= stopped < 10
    with hoist.CheckpointManager(preempted, pool_bytes=1 << 20) as manager:
        assert manager.latest == stopped
    assert sorted(p.name for p in (out / "plain").glob("checkpoint-*")) == \
        ["checkpoint-2", "checkpoint-4"]

    _launch((killed, out / "killed2.pt", 10, {"resume": True}),
            (out / "plain", out / "plain2.pt", 10, {"resume": True}),
            (preempted, out / "jit2.pt", 10, {"resume": True}))
    # Resumed where the kill let a save commit (step 2, or 4), not from
    # scratch; the plain directory through the Trainer's own loader; the
    # preempted job from its preemption step.
    assert (out / "killed2.pt.start").read_text() in ("2", "4")
    assert (out / "plain2.pt.start").read_text() == "4"
    assert (out / "jit2.pt.start").read_text() == str(stopped)
    for name in ("killed2", "plain2", "jit2"):
        same_saved(out / "full.pt", out / f"{name}.pt")
    for root in (full, killed, preempted):
        _verify(root)
    # The plain job's later checkpoints are hoist steps of its directory.
    with hoist.CheckpointManager(out / "plain", pool_bytes=1 << 20) as m:
        assert m.steps == [6, 8, 10]


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=32, tie_word_embeddings=False))


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, count=16):
        g = torch.Generator().manual_seed(7)
        self.ids = torch.randint(0, 96, (count, 16), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _trainer(output_dir, max_steps, **kwargs):
    from transformers import TrainingArguments
    from hoist.transformers import HoistTrainer
    options = kwargs.pop("checkpoint_options", {"pool_bytes": 4 << 20})
    fields = dict(output_dir=str(output_dir), max_steps=max_steps,
                  per_device_train_batch_size=4, save_strategy="steps",
                  save_steps=2, report_to="none", disable_tqdm=True,
                  use_cpu=True, seed=0)
    fields.update(kwargs.pop("args", {}))
    return HoistTrainer(model=_tiny_llama(), args=TrainingArguments(**fields),
                        train_dataset=_Tokens(),
                        checkpoint_options=options, **kwargs)


def test_best_step_is_kept_past_the_limit_and_loaded_at_the_end(tmp_path):
    """save_total_limit=1 with load_best_model_at_end: the newest step and
    the best one stay (the others go once a newer one has committed), and
    the model ends as the best step's."""
    trainer = None

    def metric(_):  # best at step 4
        return {"closeness": -abs(trainer.state.global_step - 4)}

    trainer = _trainer(tmp_path / "out", 8, compute_metrics=metric,
                       eval_dataset=_Tokens(4), args=dict(
                           eval_strategy="steps", eval_steps=2,
                           save_total_limit=1, load_best_model_at_end=True,
                           metric_for_best_model="closeness",
                           greater_is_better=True))
    trainer.train()
    assert trainer.state.best_model_checkpoint == \
        f"{tmp_path / 'out'}/checkpoint-4"
    hoist.integrations.close_managers()
    with hoist.CheckpointManager(tmp_path / "out", pool_bytes=1 << 20) as m:
        assert m.steps == [4, 8]
    best = hoist.read(tmp_path / "out", 4)["model"]
    last = hoist.read(tmp_path / "out", 8)["model"]
    state = trainer.model.state_dict()
    assert any(not torch.equal(best[k], last[k]) for k in best)
    for key, value in best.items():
        assert torch.equal(state[key], torch.as_tensor(value)), key


def test_model_only_steps_exports_and_refusals(tmp_path, monkeypatch,
                                               caplog):
    """save_only_model steps resume the model and the TrainerState (the
    optimizer starts afresh, and a warning says so); push_to_hub hands the
    Trainer's own push a folder in the Hub's layout, which transformers
    loads; what is not a step of the root is refused by name."""
    from transformers import LlamaForCausalLM, Trainer
    root = tmp_path / "out"
    pushed = []
    monkeypatch.setattr(Trainer, "_push_from_checkpoint",
                        lambda self, folder: pushed.append(folder))
    trainer = _trainer(root, 4, args=dict(save_only_model=True))
    trainer.args.push_to_hub = True  # no Hub here: its push is recorded
    trainer.train()
    assert [Path(p).name for p in pushed] == ["checkpoint-2", "checkpoint-4"]
    exported = LlamaForCausalLM.from_pretrained(pushed[-1])
    saved = hoist.read(root, 4)["model"]
    for key, value in exported.state_dict().items():
        assert torch.equal(value, torch.as_tensor(saved[key])), key
    assert hoist.read(root, 4)["optimizer"] is None

    resumed = _trainer(root, 4, args=dict(save_only_model=True))
    with caplog.at_level("WARNING", logger="hoist"):
        resumed.train(resume_from_checkpoint=f"{root}/checkpoint-2")
    assert "holds the model only" in caplog.text
    assert resumed.state.global_step == 4

    with pytest.raises(FileNotFoundError, match="step 99 is not a committed "
                       r"step of .*\[2, 4\]"):
        _trainer(root, 4).train(resume_from_checkpoint=f"{root}/checkpoint-99")
    with pytest.raises(ValueError, match="neither a checkpoint directory"):
        _trainer(root, 4).train(resume_from_checkpoint=str(tmp_path / "x"))
    with pytest.raises(ValueError, match="save_total_limit, not keep"):
        _trainer(root, 4, checkpoint_options={"keep": 2})
    hoist.integrations.close_managers()
    with hoist.CheckpointManager(tmp_path / "other", pool_bytes=1 << 20) as m:
        m.save(3, {"w": torch.zeros(3)}).wait()
    with pytest.raises(ValueError, match="not saved by hoist.transformers"):
        _trainer(tmp_path / "other", 4).train(resume_from_checkpoint=True)
