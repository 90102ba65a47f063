"""One rank of an FSDP2 training job (torchrun, gloo, CPU) that
checkpoints with PyTorch DCP through hoist.dcp, written as a DCP job is
(torchtitan's way: a Stateful app state); test_integrations.py runs it.

  dcp_train.py ROOT END RUN [RUN ...]

Each RUN is a JSON object of run()'s keyword arguments. The model, the
batches and the training step are torch_train.py's. Rank 0 writes each
run's final parameters, full, to its out.
"""
import os
import signal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict, get_state_dict, set_state_dict)
from torch.distributed.checkpoint.stateful import Stateful

import hoist.dcp
import hoist.integrations
import torch_train  # beside this script

POOL = {"pool_bytes": 16 << 20}


class AppState(Stateful):
    """The model and optimizer as DCP jobs hand them to dcp.save."""

    def __init__(self, model, optim):
        self.model, self.optim = model, optim

    def state_dict(self):
        model, optim = get_state_dict(self.model, self.optim)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state):
        set_state_dict(self.model, self.optim,
                       model_state_dict=state["model"],
                       optim_state_dict=state["optim"])


def run(root, out, end, save_at=(), async_save=False, resume=None,
        kill_at=None, full_at=None, from_full=None):
    """A fresh model trained from step 0, from DCP step `resume` ("latest":
    the newest) or from the full-tensor file `from_full`, to `end`; saves
    with dcp.save (dcp.async_save when async_save) at each step of
    `save_at`; at `kill_at` every rank starts a save and SIGKILLs itself
    while it is in flight."""
    model, optim = torch_train.build()
    app = AppState(model, optim)
    start = 0
    if resume is not None:
        state = {"app": app, "step": -1}
        dcp.load(state, storage_reader=hoist.dcp.Reader(
            root, None if resume == "latest" else resume, **POOL))
        start = state["step"]
        assert resume == "latest" or start == resume, (start, resume)
    if from_full:
        start = torch_train.load_full(model, optim, from_full)
    # async_save's collectives go on a group of their own (on gloo, the
    # default group's would meet FSDP's).
    group = dist.new_group(backend="gloo") if async_save else None
    pending = None
    for step in range(start, end):
        if step in save_at or step == kill_at:
            if pending is not None:
                pending.result()
            writer = hoist.dcp.Writer(root, step, **POOL)
            state = {"app": app, "step": step}
            if async_save:
                pending = dcp.async_save(state, storage_writer=writer,
                                         process_group=group)
            else:
                dcp.save(state, storage_writer=writer)
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        if step == full_at:
            full = torch_train.state(model, optim, step, full_state_dict=True)
            if dist.get_rank() == 0:
                torch.save(full, f"{out}.full")
        torch_train.train_step(model, optim, step)
    if pending is not None:
        pending.result()
    hoist.integrations.close_managers()
    final = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True))
    if dist.get_rank() == 0:
        torch.save(final, out)


if __name__ == "__main__":
    torch_train.main(run)
