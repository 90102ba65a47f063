"""One rank of a training job (torchrun, gloo, CPU) built from torchtitan's
own objects (ModelWrapper through the manager, OptimizersContainer,
LRSchedulersContainer, ParallelAwareDataloader, a Stateful train state)
and checkpointed by hoist.torchtitan.CheckpointManager, driven the way
torchtitan's Trainer drives a manager; test_torchtitan.py runs it.

  titan_train.py FOLDER OUT STEPS [OPTIONS_JSON]
                 [FOLDER OUT STEPS OPTIONS_JSON ...]

Several jobs run one after the other in the same processes and process
group (a launch costs more than a job here); a job that kills itself ends
them.

OPTIONS: the manager's Config fields (interval, async_mode, keep_latest_k,
load_step, exclude_from_loading, initial_load_path, ...), manager ("dcp":
torchtitan's own, as before a job switches to hoist's), and kill_at
(every rank SIGKILLs itself right after that step's save returned: while
it is in flight). Rank 0 writes the final parameters, full, to OUT and the
step training resumed from to OUT.start.
"""
import os
import signal

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict)
from torchtitan.components.checkpointer import CheckpointManager
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.optimizer import (
    LRSchedulersContainer, default_adamw)

import hoist.integrations
import hoist.torchtitan
import outcome  # beside this script
from jobs import job_groups  # beside this script
import torch_train  # beside this script

GLOBAL_BATCH = 16


class Batches(torch.utils.data.IterableDataset):
    """This data-parallel rank's rows of a fixed stream of global batches."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world

    def __iter__(self):
        rows = GLOBAL_BATCH // self.world
        for step in range(10_000):
            g = torch.Generator().manual_seed(1000 + step)
            x = torch.randn(GLOBAL_BATCH, 12, generator=g)
            y = torch.randn(GLOBAL_BATCH, 7, generator=g)
            at = slice(self.rank * rows, (self.rank + 1) * rows)
            yield x[at], y[at]


class TrainState:
    """What torchtitan's Trainer hands the manager as "train_state"."""

    def __init__(self):
        self.step, self.ntokens_seen = 0, 0

    def state_dict(self):
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state):
        self.step = state["step"]
        self.ntokens_seen = state["ntokens_seen"]


def main():
    jobs = job_groups("titan_train.py FOLDER OUT STEPS [OPTIONS_JSON] "
                      "[FOLDER OUT STEPS OPTIONS_JSON ...]")
    dist.init_process_group("gloo")
    for folder, out, steps, options in jobs:
        train(folder, out, int(steps), options)
    dist.destroy_process_group()
    outcome.exit_without_teardown()


def train(folder, out, steps, options):
    """One job: trains to `steps`, checkpointed into `folder`."""
    kill_at = options.pop("kill_at", None)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = torch_train.build()[0]
    optimizers = default_adamw(lr=1e-2, foreach=False, fused=False).build(
        model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(
        optimizers=optimizers, training_steps=steps)
    loader = ParallelAwareDataloader(Batches(rank, world), dp_rank=rank,
                                     dp_world_size=world, batch_size=None)
    train_state = TrainState()
    if options.pop("manager", "hoist") == "hoist":
        config = hoist.torchtitan.CheckpointManager.Config(
            enable=True, folder="ckpt", hoist_pool_bytes=16 << 20, **options)
    else:  # torchtitan's own DCP manager: a job before it switched
        config = CheckpointManager.Config(enable=True, folder="ckpt",
                                          **options)
    checkpointer = config.build(
        dataloader=loader, model_parts=[model], optimizers=optimizers,
        lr_schedulers=schedulers, states={"train_state": train_state},
        sd_adapter=None, base_folder=folder)

    # As torchtitan's Trainer.train drives it.
    checkpointer.load(step=options.get("load_step", -1))
    start = train_state.step
    batches = iter(loader)
    while train_state.step < steps:
        train_state.step += 1
        x, y = next(batches)
        optimizers.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        train_state.ntokens_seen += x.numel()
        checkpointer.maybe_wait_for_staging()
        optimizers.step()
        schedulers.step()
        checkpointer.save(train_state.step,
                          last_step=train_state.step == steps)
        if train_state.step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    checkpointer.maybe_wait_for_saving()
    checkpointer.close()
    hoist.integrations.close_managers()
    final = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True))
    if rank == 0:
        torch.save(final, out)
        with open(f"{out}.start", "w") as f:
            f.write(str(start))
    dist.barrier()  # the next job starts on every rank together


if __name__ == "__main__":
    main()
