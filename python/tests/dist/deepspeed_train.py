"""A DeepSpeed training job (CPU: DS_ACCELERATOR=cpu, gloo) that
checkpoints with hoist.deepspeed; test_deepspeed.py runs it under
torchrun and under the deepspeed launcher.

  deepspeed_train.py ROOT OUT STEPS [OPTIONS_JSON] [ROOT OUT STEPS
                     OPTIONS_JSON ...]

Several jobs run one after another in the same processes, each from a
fresh model and engine. ROOT is DeepSpeed's save_dir (hoist's root too);
the switch to hoist is the line marked "hoist".

OPTIONS: stage (ZeRO 1, 2 or 3; default 2), hoist_root (hoist's root, an
s3:// one say, where it is not ROOT), resume (true: load the newest
checkpoint first), kill_step (every process SIGKILLs itself once the save
of that step returned: while it is in flight), plain (DeepSpeed's own
checkpoint engine). A checkpoint every 2 steps, tagged by DeepSpeed
(global_stepN), with client_state. Each step seeds dropout from the step
and the rank, so a resume is bit-identical with the parameters, the
optimizer's partitions and the scheduler back. The main process writes
the final parameters (gathered under ZeRO-3) to OUT and the step training
started at to OUT.start.
"""
import os
import signal

import deepspeed
import torch

import hoist.deepspeed
from jobs import job_groups  # beside this script


def main():
    for root, out, steps, options in job_groups(
            "deepspeed_train.py ROOT OUT STEPS [OPTIONS_JSON] "
            "[ROOT OUT STEPS OPTIONS_JSON ...]"):
        train(root, out, int(steps), options)


def train(root, out, steps, options):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 40), torch.nn.Tanh(),
                                torch.nn.Dropout(0.2), torch.nn.Linear(40, 7))
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW",
                      "params": {"lr": 1e-2, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_num_steps": 4}},
        "zero_optimization": {"stage": options.get("stage", 2)},
        "steps_per_print": 1000}
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config)
    if not options.get("plain"):
        hoist.deepspeed.use(engine, options.get("hoist_root"),  # hoist
                            pool_bytes=8 << 20)
    start = 0
    rank = torch.distributed.get_rank()
    if options.get("resume"):
        _, client = engine.load_checkpoint(root)
        start = client["next_step"]
        if options.get("dump_loaded"):
            dump_flat(engine, f"{out}.loaded")
    for step in range(start, steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(4, 12, generator=g), torch.randn(4, 7, generator=g)
        torch.manual_seed(1000 * step + rank)  # dropout's
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        if (step + 1) % 2 == 0:
            engine.save_checkpoint(root, client_state={"next_step": step + 1})
            if step + 1 == options.get("dump_step"):
                dump(engine, f"{out}.saved")
            if step + 1 == options.get("kill_step"):
                os.kill(os.getpid(), signal.SIGKILL)
    if not options.get("plain"):
        engine.checkpoint_engine.wait()
    stage3 = options.get("stage", 2) == 3
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters()),
                                           enabled=stage3):
        if rank == 0:
            torch.save({k: v.clone() for k, v in
                        engine.module.state_dict().items()}, out)
            with open(f"{out}.start", "w") as f:
                f.write(str(start))
    torch.distributed.barrier()


def dump(engine, path):
    """Every parameter's fp32 master weights and Adam moments, whole (a
    collective: every rank calls it; rank 0 writes them to `path`)."""
    from deepspeed.utils import (safe_get_full_fp32_param,
                                 safe_get_full_optimizer_state)
    state = {}
    for name, param in engine.module.named_parameters():
        state[f"{name}/fp32"] = safe_get_full_fp32_param(param).clone()
        for key in ("exp_avg", "exp_avg_sq"):
            state[f"{name}/{key}"] = safe_get_full_optimizer_state(
                param, key).clone()
    if torch.distributed.get_rank() == 0:
        torch.save(state, path)


def dump_flat(engine, path):
    """A ZeRO 1 or 2 job of one process: its one parameter group's flat
    fp32 master weights and Adam moments (the parameters end to end, then
    padding), as loaded, to `path`."""
    optimizer = engine.optimizer
    flat = optimizer.single_partition_of_fp32_groups[0]
    state = {"fp32": flat.detach().clone()}
    for key in ("exp_avg", "exp_avg_sq"):
        state[key] = optimizer.optimizer.state[flat][key].clone()
    torch.save(state, path)


if __name__ == "__main__":
    main()
