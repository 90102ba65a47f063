"""torchtitan 0.3's checkpoint manager over hoist, selected in a job's
config:

    import hoist.torchtitan
    config.checkpoint = hoist.torchtitan.CheckpointManager.Config(
        enable=True, folder="checkpoint", interval=500, keep_latest_k=3,
        async_mode="async")

It is torchtitan's own DCP CheckpointManager with the storage swapped:
every state the trainer hands it (the model's flattened state dict, the
OptimizersContainer, LRSchedulersContainer, data loader and train state,
all Stateful) goes through DCP's save, async_save and load, into
hoist.dcp's Writer and Reader. So each of torchtitan's policies holds as
it does there (interval, enable_first_step_checkpoint, load_step,
exclude_from_loading, initial_load_path, last_save_model_only and
export_dtype, a model-only step 0), and each checkpoint is a hoist step of
`folder` (a directory, s3:// or gs://): FOLDER/step_00000500, with
keep_latest_k as hoist's retention (it keeps the newest k committed
steps; a save in flight never counts against them).

async_mode "async" and "async_with_pinned_mem" both stage into hoist's
pinned pool and return (staged) before the write; "disabled" returns once
the step is committed. An initial_load_path may be a hoist root or a DCP
directory (read with DCP's own reader), or Hugging Face safetensors as in
torchtitan. A job that switches keeps its checkpoints: with no hoist step
in the folder yet, it resumes from the newest step-N directory torchtitan's
DCP manager left there, and saves hoist steps from then on.
"""

import re
from concurrent.futures import Future
from dataclasses import dataclass

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torchtitan.components.checkpointer import MODEL
from torchtitan.components.checkpointer.dcp import (
    AsyncMode,
    CheckpointManager as DcpCheckpointManager,
)
from torchtitan.tools import filesystem

from .. import DataLossError, inspect
from .._options import DEFAULTS as _DEFAULTS
from .._read import step_path
from ..dcp import Reader, Writer
from ._managers import open_manager

__all__ = ["CheckpointManager"]


_HOIST_STEP = re.compile(r"step_\d+")
_STEP_AT_END = re.compile(r"\d+$")


def _step_dir(folder, step):
    return step_path(folder, step)


class CheckpointManager(DcpCheckpointManager):
    """torchtitan's CheckpointManager, saving and loading through hoist
    (see the module's docstring). Config adds hoist's pool size."""

    @dataclass(kw_only=True, slots=True)
    class Config(DcpCheckpointManager.Config):
        hoist_pool_bytes: int = _DEFAULTS.pool_bytes
        """hoist's pinned staging pool (per process): a state larger than
        it stages in waves."""

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        if not self.enable:
            return
        # Opened by every rank here (opening is collective); hoist keeps
        # the newest keep_latest_k committed steps.
        self._hoist = open_manager(self.folder, {
            "keep": self.keep_latest_k or None,
            "pool_bytes": config.hoist_pool_bytes})
        # No hoist step yet: step-N directories of torchtitan's DCP manager
        # may be loaded (until the first save).
        self._switched = self._hoist.latest is None

    # -- where steps are -----------------------------------------------------

    def _create_checkpoint_id(self, step, folder=""):
        """FOLDER/step_N, hoist's step; in a job that has just switched
        (the folder held no hoist step when it opened, and nothing is saved
        yet), a step torchtitan's DCP manager left (FOLDER/step-N), which is
        read with DCP's own reader. Only until the job's first save: from
        then on no save pays for the lookup."""
        folder = folder or self.folder
        if self._switched and folder == self.folder:
            earlier = filesystem.join(folder, f"step-{step}")
            if filesystem.isdir(earlier):
                return earlier
        return _step_dir(folder, step)

    def _find_load_step(self, folder=""):
        """The newest hoist step; without one, the newest step torchtitan's
        DCP manager left in the folder (a job that switched resumes it)."""
        if folder and folder != self.folder:
            return super()._find_load_step(folder)
        if self._switched:
            return super()._find_load_step()
        latest = self._hoist.latest
        return -1 if latest is None else latest

    def _purge_stale_checkpoints(self):
        """Nothing: hoist's retention (keep_latest_k) prunes committed
        steps once each save commits."""

    def _is_ours(self, checkpoint_id):
        """Whether `checkpoint_id` is a hoist step of this folder."""
        parent, _, name = str(checkpoint_id).rstrip("/").rpartition("/")
        return parent == self.folder.rstrip("/") and \
            _HOIST_STEP.fullmatch(name) is not None

    # -- saving and loading ----------------------------------------------------

    @torch.no_grad()
    def dcp_save(self, state_dict, checkpoint_id, async_mode,
                 enable_garbage_collection=False, to_hf=False):
        if to_hf:  # a Hugging Face export: torchtitan's own path
            return super().dcp_save(state_dict, checkpoint_id, async_mode,
                                    enable_garbage_collection, to_hf)
        step = int(_STEP_AT_END.search(str(checkpoint_id).rstrip("/"))[0])
        self._switched = False
        writer = Writer(manager=self._hoist, step=step)
        if async_mode == AsyncMode.DISABLED:
            dcp.save(state_dict, storage_writer=writer)
            return None
        saved = dcp.async_save(state_dict, storage_writer=writer,
                               process_group=self.pg)
        if async_mode == AsyncMode.ASYNC:
            return saved
        staged = Future()  # hoist stages before async_save returns
        staged.set_result(None)
        return AsyncSaveResponse(staging_completion=staged,
                                 upload_completion=saved)

    @torch.no_grad()
    def dcp_load(self, state_dict, checkpoint_id, from_hf, from_quantized):
        if from_hf or not self._reads_with_hoist(checkpoint_id):
            return super().dcp_load(state_dict, checkpoint_id, from_hf,
                                    from_quantized)
        if self._is_ours(checkpoint_id):
            step = int(_STEP_AT_END.search(str(checkpoint_id))[0])
            reader = Reader(manager=self._hoist, step=step)
        else:  # an initial_load_path that is a hoist root: its newest
            reader = Reader(checkpoint_id)
        dcp.load(state_dict, storage_reader=reader)
        if MODEL in self.states:  # flattened into state_dict (as torchtitan)
            self.states[MODEL].load_state_dict(state_dict)
        return None

    def _reads_with_hoist(self, checkpoint_id):
        """A step of this folder, or a hoist root given as
        initial_load_path (not a DCP directory)."""
        if self._is_ours(checkpoint_id):
            return True
        try:
            inspect(str(checkpoint_id))
        except (FileNotFoundError, ValueError, DataLossError):
            return False
        return True
