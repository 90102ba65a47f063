"""One rank of an FSDP2 training job (torchrun, gloo, CPU) that checkpoints
with hoist; test_multiprocess.py runs its runs on different world sizes
(torch_worker.py's train command), dcp_train.py its main with a run of its
own.

  torch_train.py ROOT END RUN [RUN ...]

Each RUN (a JSON object: out, and save_at, resume, full_at, from_full) trains
a small MLP with AdamW from step 0 (or from a resumed step) to END on a fixed
global batch per step, split among the ranks; several runs share one job (a
launch costs seconds). save_at saves the model and optimizer state dicts
(DTensors) with hoist at that step; resume restores them (any world size)
and goes on; full_at / from_full write and read the same state as full
tensors with torch.save (the reference resharding, without hoist). Rank 0
writes each run's final parameters, full, to its out.
"""
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
    set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import hoist
import outcome  # beside this script

GLOBAL_BATCH = 16


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.Tanh(),
                                torch.nn.Linear(20, 7))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, optim


def batch(step):
    """This rank's rows of step `step`'s global batch."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, 12, generator=g)
    y = torch.randn(GLOBAL_BATCH, 7, generator=g)
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = GLOBAL_BATCH // world
    return x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]


def train_step(model, optim, step):
    x, y = batch(step)
    optim.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optim.step()


def state(model, optim, step, **options):
    kw = {"options": StateDictOptions(**options)} if options else {}
    return {"model": get_model_state_dict(model, **kw),
            "optim": get_optimizer_state_dict(model, optim, **kw),
            "step": step}


def load_full(model, optim, path):
    """Loads the full-tensor state at `path` (torch.save; the reference
    resharding, without hoist): the step it was written at."""
    full = torch.load(path, weights_only=False)
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, full["model"], options=options)
    set_optimizer_state_dict(model, optim, full["optim"], options=options)
    return full["step"]


def run(root, out, end, save_at=None, resume=None, full_at=None,
        from_full=None):
    """One training run in this job: a fresh model and optimizer, started
    from step 0, from hoist's step `resume`, or from the full-tensor file
    `from_full`, trained to `end`; rank 0 writes the final parameters, full,
    to `out` (and, at `full_at`, the full state to OUT.full)."""
    model, optim = build()
    mgr = hoist.CheckpointManager(root, pool_bytes=16 << 20)
    start = 0
    if resume is not None:
        restored = mgr.restore(resume, like=state(model, optim, 0))
        set_model_state_dict(model, restored["model"])
        set_optimizer_state_dict(model, optim, restored["optim"])
        start = restored["step"]
        assert start == resume
    if from_full:
        start = load_full(model, optim, from_full)
    for step in range(start, end):
        if step == save_at:
            mgr.save(step, state(model, optim, step))
        if step == full_at:
            full = state(model, optim, step, full_state_dict=True)
            if dist.get_rank() == 0:
                torch.save(full, f"{out}.full")
        train_step(model, optim, step)
    mgr.close()
    final = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True))
    if dist.get_rank() == 0:
        torch.save(final, out)


def main(run_one=run):
    """Runs each RUN argument in turn in this one job: a JSON object of
    run_one()'s keyword arguments besides root and end (dcp_train.py
    passes its own run)."""
    root, end, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    dist.init_process_group("gloo")
    for spec in runs:
        run_one(root, end=end, **json.loads(spec))
    dist.destroy_process_group()
    outcome.exit_without_teardown()


if __name__ == "__main__":
    main()
