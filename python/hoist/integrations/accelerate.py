"""Hugging Face Accelerate over hoist:

    import hoist.accelerate
    hoist.accelerate.save_state(accelerator, "/ckpt", step)
    hoist.accelerate.load_state(accelerator, "/ckpt")       # the newest

What accelerator.save_state writes, as one hoist step: each prepared
model's state dict, each optimizer's and scheduler's, the GradScaler's,
accelerator.step, every object registered with
accelerator.register_for_checkpointing, and per process (hoist.PerRank)
its RNG states (random, NumPy, torch, the accelerator's) and its data
loaders' positions (a seedable sampler's epoch and seed, a stateful data
loader's state). Every process calls both, at the same point (the save is
one collective hoist save: each process writes its share); save_state
returns once the state is staged.

FSDP and DeepSpeed models save through their own engines in Accelerate
(sharded state): checkpoint those through DCP with hoist.dcp.
"""

import random

import numpy as np
import torch

from .. import PerRank
from . import _pickles
from ._managers import open_manager

__all__ = ["save_state", "load_state", "FORMAT_KEY"]

# The step's metadata says what wrote it.
FORMAT_KEY = "hoist.accelerate"
_CONSENT = "pass allow_pickle=True to hoist.accelerate.load_state"


def _refuse_sharded(accelerator):
    kind = str(getattr(accelerator, "distributed_type", ""))
    if "FSDP" in kind or "DEEPSPEED" in kind or "MEGATRON" in kind:
        raise NotImplementedError(
            f"hoist.accelerate: {kind} models save sharded state through "
            "their own engine; checkpoint them with hoist.dcp (DCP)")


def _sampler_of(dataloader):
    get = getattr(dataloader, "get_sampler", None)
    sampler = get() if callable(get) else None
    if sampler is not None and hasattr(sampler, "initial_seed") and \
            hasattr(sampler, "epoch"):
        return sampler
    return None


def _rng_state():
    state = {"random": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state):
    random.setstate(state["random"])  # PerRank gives tuples back as tuples
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _loader_states(accelerator):
    states = []
    for loader in accelerator._dataloaders:
        sampler = _sampler_of(loader)
        states.append({
            "sampler": None if sampler is None else {
                "epoch": int(sampler.epoch),
                "initial_seed": int(sampler.initial_seed)},
            "loader": (loader.state_dict()
                       if getattr(loader, "use_stateful_dataloader", False)
                       else None)})
    return states


def _state(accelerator):
    """Everything accelerator.save_state saves, as a hoist tree."""
    scaler = getattr(accelerator, "scaler", None)
    return {
        FORMAT_KEY: 1,
        "models": [accelerator.unwrap_model(m).state_dict()
                   for m in accelerator._models],
        "optimizers": [o.state_dict() for o in accelerator._optimizers],
        "schedulers": [s.state_dict() for s in accelerator._schedulers],
        "scaler": None if scaler is None else scaler.state_dict(),
        "step": int(accelerator.step),
        "custom": [o.state_dict() for o in accelerator._custom_objects],
        "process": PerRank({"rng": _rng_state(),
                            "loaders": _loader_states(accelerator)}),
    }


def save_state(accelerator, root, step, *, deltas=None, **manager_options):
    """Saves what accelerator.save_state saves as step `step` of hoist root
    `root` (a directory, s3://, gs://); returns a hoist.SaveHandle once
    the state is staged (handle.wait() for the commit). Other keyword
    arguments open the root's manager the first time (every process
    opens it at once: pool_bytes, keep, storage_options, ...); it is
    shared with the other adapters in this process."""
    _refuse_sharded(accelerator)
    manager = open_manager(root, manager_options)
    return manager.save(step, _pickles.encodable(_state(accelerator)),
                        deltas=deltas)


def load_state(accelerator, root, step=None, *, allow_pickle=False,
               **manager_options):
    """Loads step `step` (default: the newest) of `root` into the
    accelerator's prepared objects, as accelerator.load_state does: every
    process calls it. RNG states and data-loader positions come back per
    process when the number of processes is the one saved (else they are
    left as they are, as Accelerate does when a process's file is
    missing). Returns the step loaded. Values that are not plain data
    (pickled objects in a registered object's state) load only with
    allow_pickle=True."""
    _refuse_sharded(accelerator)
    manager = open_manager(root, manager_options)
    state = _pickles.decoded(manager.restore(step, per_rank="all"),
                             f"step {step if step is not None else 'newest'}"
                             f" of {manager.path}", _CONSENT,
                             trusted=allow_pickle)
    if not isinstance(state, dict) or state.get(FORMAT_KEY) != 1:
        raise ValueError(f"{manager.path}: the step was not saved by "
                         "hoist.accelerate.save_state")
    _load_into(accelerator, state, manager.path)
    return manager.last_restore["step"]


def _check_count(what, saved, here, root):
    if len(saved) != len(here):
        raise ValueError(f"{root}: the step holds {len(saved)} {what}, the "
                         f"accelerator prepared {len(here)}")


def _load_into(accelerator, state, root):
    _check_count("models", state["models"], accelerator._models, root)
    _check_count("optimizers", state["optimizers"], accelerator._optimizers,
                 root)
    _check_count("schedulers", state["schedulers"], accelerator._schedulers,
                 root)
    _check_count("registered objects", state["custom"],
                 accelerator._custom_objects, root)
    for model, saved in zip(accelerator._models, state["models"]):
        accelerator.unwrap_model(model).load_state_dict(saved)
    for optimizer, saved in zip(accelerator._optimizers, state["optimizers"]):
        optimizer.load_state_dict(saved)
    for scheduler, saved in zip(accelerator._schedulers, state["schedulers"]):
        scheduler.load_state_dict(saved)
    scaler = getattr(accelerator, "scaler", None)
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    accelerator.step = state["step"]
    for obj, saved in zip(accelerator._custom_objects, state["custom"]):
        obj.load_state_dict(saved)
    processes = state["process"]  # every saved process's, by rank
    if len(processes) != accelerator.num_processes:
        return
    mine = processes[accelerator.process_index]
    _set_rng_state(mine["rng"])
    for loader, saved in zip(accelerator._dataloaders, mine["loaders"]):
        sampler = _sampler_of(loader)
        if sampler is not None and saved["sampler"] is not None:
            sampler.epoch = saved["sampler"]["epoch"]
            sampler.initial_seed = saved["sampler"]["initial_seed"]
        if saved["loader"] is not None:
            loader.load_state_dict(saved["loader"])
