"""The Hugging Face Trainer over hoist:

    from hoist.transformers import HoistTrainer
    trainer = HoistTrainer(model=model, args=args, train_dataset=data)
    trainer.train(resume_from_checkpoint=True)   # the newest committed step

or, for a job that already subclasses Trainer,

    class MyTrainer(HoistCheckpointMixin, Trainer): ...

Each checkpoint the Trainer would write as OUTPUT_DIR/checkpoint-N is step
N of a hoist root (args.output_dir, or checkpoint_root=: a directory,
s3://, gs://): the model's state dict, the optimizer's, the scheduler's,
the gradient scaler's, every process's RNG states (hoist.PerRank) and the
TrainerState. The save returns once the state is staged (copied off the
devices); the write, the commit and the removal of steps past
save_total_limit follow in the background, and train() returns once they
are done. A step's name is still "checkpoint-N": OUTPUT_DIR/checkpoint-N
(the root's path, then checkpoint-N) names step N wherever a path is
asked for (resume_from_checkpoint, state.best_model_checkpoint).

What the TrainingArguments ask for keeps working: save_steps and
save_strategy (the Trainer decides when), save_total_limit (the newest
steps and the best one are kept; older steps are removed once a newer one
has committed), save_only_model (the model and the TrainerState only),
resume_from_checkpoint (True: the newer of the root's newest step and the
newest plain checkpoint-N directory; a plain directory still resumes
through the Trainer's own loader), load_best_model_at_end and
metric_for_best_model (the best step is kept and loaded at the end),
enable_jit_checkpoint (SIGTERM is hoist's preemption notice: every rank
saves the same step, waits for its commit and stops training) and
push_to_hub (the committed step's model is exported as safetensors, then
pushed by the Trainer's own code).
"""

import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import tempfile

import numpy as np
import random
import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import ExportableState, TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy
from transformers.trainer_utils import get_last_checkpoint

from .. import PerRank, export
from . import _pickles
from ._background import Background
from ._managers import open_manager, root_key

__all__ = ["HoistCheckpointMixin", "HoistTrainer", "FORMAT_KEY",
           "checkpoint_step", "export_model"]

_LOG = logging.getLogger("hoist")

# The step's tree says what wrote it.
FORMAT_KEY = "hoist.transformers"
_STATE_NAME = "trainer_state.json"  # the Trainer's name for its state
_CONSENT = "pass allow_pickle=True to the trainer's constructor"
_NAME = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


def checkpoint_step(path):
    """The step a checkpoint path names ("OUT/checkpoint-12" -> 12), or
    None when its last component is not checkpoint-N."""
    match = _NAME.match(os.fspath(path).rstrip("/").rpartition("/")[2])
    return None if match is None else int(match.group(1))


def _rng_state():
    """This process's RNG states, as the Trainer's _save_rng_state keeps
    them."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.random.get_rng_state_all()
    return state


def _set_rng_state(state):
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.random.set_rng_state_all(state["cuda"])


@dataclasses.dataclass
class _Resumed:
    """A resume from a hoist step: the step, its decoded tree, and the
    directory standing for it where the Trainer passes a path (it holds
    the step's trainer_state.json, which the Trainer reads itself)."""
    step: int
    state: dict
    directory: str


class _Preemption(TrainerCallback):
    """enable_jit_checkpoint through hoist: SIGTERM is the manager's
    preemption signal; at the first step every rank reaches after it,
    each saves that step, waits for its commit, and training stops."""

    def __init__(self, trainer):
        self._trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        trainer = self._trainer
        if trainer._hoist_manager().reached_preemption(state.global_step):
            _LOG.warning("hoist.transformers: preempted; saving step %d and "
                         "stopping", state.global_step)
            trainer._save_checkpoint(trainer.model, trial=None)
            trainer.wait_for_checkpoints()
            control.should_save = False
            control.should_training_stop = True
        return control


class HoistCheckpointMixin:
    """Makes a Trainer (or a subclass of it) checkpoint through hoist: put
    it first among the bases, `class MyTrainer(HoistCheckpointMixin,
    Trainer)`. Keyword arguments beside the Trainer's:

    checkpoint_root:    the hoist root (default: args.output_dir).
    checkpoint_options: hoist.CheckpointManager's options for the root
                        (pool_bytes, storage_options, ...; not keep:
                        save_total_limit says what is kept).
    allow_pickle:       a resume may load values that are not plain data
                        (pickled objects in a state dict): only from a
                        root you trust.
    """

    def __init__(self, *args, checkpoint_root=None, checkpoint_options=None,
                 allow_pickle=False, **kwargs):
        super().__init__(*args, **kwargs)
        options = dict(checkpoint_options or {})
        if "keep" in options or "keep_every" in options:
            raise ValueError("checkpoint_options: say what is kept with "
                             "TrainingArguments.save_total_limit, not keep")
        root = self.args.output_dir if checkpoint_root is None \
            else checkpoint_root
        if root is None:
            raise ValueError("give checkpoint_root= or args.output_dir")
        self._hoist_root = os.fspath(root).rstrip("/")
        self._hoist_allow_pickle = allow_pickle
        self._hoist_resumed = None
        self._hoist_saved = set()  # steps this trainer saved
        # Commits and retention, in the order of the saves.
        self._hoist_background = Background("hoist-trainer")
        if self.args.enable_jit_checkpoint:
            options.setdefault("preemption_signals", (signal.SIGTERM,))
            self._hoist_replace_jit_callback()
        self._hoist_options = options

    # -- the root ----------------------------------------------------------

    def _hoist_manager(self):
        """The root's manager (opened by every rank at once, the first
        time)."""
        return open_manager(self._hoist_root, self._hoist_options)

    def checkpoint_path(self, step):
        """The path naming step `step` of the root ("ROOT/checkpoint-N")."""
        return f"{self._hoist_root}/{PREFIX_CHECKPOINT_DIR}-{int(step)}"

    def _hoist_replace_jit_callback(self):
        """The Trainer's JIT checkpointing saves on each rank alone when
        that rank gets SIGTERM; hoist's preemption save agrees on one step
        across the ranks. Its handler goes; hoist's callback comes in."""
        from transformers.trainer_jit_checkpoint import JITCheckpointCallback
        for callback in list(self.callback_handler.callbacks):
            if isinstance(callback, JITCheckpointCallback):
                jit = callback.jit_manager
                if jit is not None and \
                        jit._original_sigterm_handler is not None:
                    signal.signal(signal.SIGTERM,
                                  jit._original_sigterm_handler)
                self.callback_handler.remove_callback(callback)
        self.add_callback(_Preemption(self))

    # -- saving ------------------------------------------------------------

    def _save_checkpoint(self, model, trial):
        """The Trainer's checkpoint, as a hoist step: returns once it is
        staged."""
        if trial is not None or self.hp_search_backend is not None:
            return super()._save_checkpoint(model, trial)
        self._hoist_background.raise_failed()
        self.store_flos()
        step = int(self.state.global_step)
        manager = self._hoist_manager()
        committed = manager.steps  # listed once: on S3, a request
        if step in committed:
            self._hoist_replace(manager, step)
        self._hoist_note_best(committed, step)
        self._hoist_export_callback_states()
        handle = manager.save(step, _pickles.encodable(self._hoist_tree()),
                              metadata={"global_step": step})
        self._hoist_saved.add(step)
        limit = self.args.save_total_limit
        best = checkpoint_step(self.state.best_model_checkpoint or "")
        prune = self.is_world_process_zero() and limit is not None and \
            limit > 0
        self._hoist_background.submit(self._hoist_committed, manager,
                                      handle, limit if prune else None, best)
        if self.args.push_to_hub:
            self._hoist_background.drain()
            self._hoist_push(step)
        return None

    def _hoist_replace(self, manager, step):
        """A job resumed from an earlier step saves a step the root holds
        from before: it replaces it, as the Trainer overwrites
        checkpoint-N (rank 0 removes it once every save has committed;
        the others wait for that)."""
        self._hoist_background.drain()
        if self.is_world_process_zero():
            _LOG.warning("hoist.transformers: step %d of %s is saved again "
                         "(the job resumed from an earlier step): the step "
                         "it held is replaced", step, manager.path)
            manager.delete(step)
        self.accelerator.wait_for_everyone()

    def _hoist_tree(self):
        """Everything the Trainer's checkpoint holds, as a hoist tree."""
        unwrapped = self.accelerator.unwrap_model(self.model)
        tree = {FORMAT_KEY: 1, "model": unwrapped.state_dict(),
                "optimizer": None, "scheduler": None, "scaler": None,
                "process": None,
                "trainer_state": json.dumps(dataclasses.asdict(self.state),
                                            indent=2, sort_keys=True)}
        if not self.args.save_only_model:
            scaler = getattr(self.accelerator, "scaler", None)
            tree.update(
                optimizer=self.optimizer.state_dict(),
                scheduler=None if self.lr_scheduler is None
                else self.lr_scheduler.state_dict(),
                scaler=None if scaler is None else scaler.state_dict(),
                process=PerRank({"rng": _rng_state()}))
        return tree

    def _hoist_note_best(self, committed, step):
        """state.best_model_checkpoint names the best step once it is
        saved (this one, or one this trainer saved, or one of the root's
        `committed` steps)."""
        best = self.state.best_global_step
        if self.args.save_strategy not in (
                SaveStrategy.STEPS, SaveStrategy.EPOCH, SaveStrategy.BEST) \
                or not best:
            return
        if best == step or best in self._hoist_saved or best in committed:
            self.state.best_model_checkpoint = self.checkpoint_path(best)

    def _hoist_export_callback_states(self):
        """What the Trainer's own save does before writing its state: the
        stateful callbacks' (and the control's) states into it."""
        for callback in self.callback_handler.callbacks + [self.control]:
            if not isinstance(callback, ExportableState):
                continue
            name = callback.__class__.__name__
            if isinstance(self.state.stateful_callbacks[name], list):
                self.state.stateful_callbacks[name].append(callback.state())
            else:
                self.state.stateful_callbacks[name] = callback.state()

    def _hoist_committed(self, manager, handle, limit, best):
        """In the background: waits for the commit, then (rank 0, with
        save_total_limit) removes the steps past the limit, never the best
        one nor any of the `limit` newest."""
        handle.wait()
        if limit is None:
            return
        steps = manager.steps
        kept = set(steps[-limit:])
        if best is not None:
            kept.add(best)
        for step in steps:
            if step not in kept:
                _LOG.info("hoist.transformers: removing step %d "
                          "(save_total_limit=%d)", step, limit)
                manager.delete(step)

    def _hoist_push(self, step):
        """push_to_hub: the committed step's model, exported as the
        safetensors layout the Hub takes (with the model's config), goes
        through the Trainer's own push."""
        if not self.is_world_process_zero():
            return
        folder = os.path.join(self.args.output_dir, "_hoist_push",
                              f"{PREFIX_CHECKPOINT_DIR}-{step}")
        shutil.rmtree(folder, ignore_errors=True)  # an earlier run's
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        export_model(self._hoist_root, step, folder,
                     model=self.accelerator.unwrap_model(self.model),
                     storage_options=self._hoist_options.get(
                         "storage_options"))
        super()._push_from_checkpoint(folder)

    def wait_for_checkpoints(self):
        """Returns once every checkpoint saved so far has committed (train()
        returns only then too); raises the first that failed."""
        self._hoist_background.drain()

    # -- resuming ----------------------------------------------------------

    def train(self, resume_from_checkpoint=None, trial=None, **kwargs):
        step = self._hoist_resume_step(resume_from_checkpoint)
        try:
            if step is None:
                if self.args.enable_jit_checkpoint:
                    self._hoist_manager()  # its SIGTERM handler, now
                return super().train(resume_from_checkpoint, trial, **kwargs)
            with tempfile.TemporaryDirectory(prefix="hoist-resume-") as here:
                self._hoist_resumed = self._hoist_restore(step, here)
                return super().train(here, trial, **kwargs)
        finally:
            self._hoist_resumed = None
            self._hoist_background.drain()

    def _hoist_resume_step(self, asked):
        """The hoist step `asked` names (resume_from_checkpoint's value),
        or None when the Trainer's own loader takes it (nothing, or a
        plain checkpoint directory)."""
        if asked is None or asked is False:
            return None
        if asked is True:
            manager = self._hoist_manager()
            newest = manager.latest
            plain = get_last_checkpoint(self.args.output_dir) if \
                os.path.isdir(self.args.output_dir) else None
            if plain is not None and (newest is None or
                                      checkpoint_step(plain) > newest):
                return None  # the Trainer's own, newer
            if newest is None:
                raise ValueError(
                    f"No valid checkpoint found: {self._hoist_root} holds "
                    f"no committed step and {self.args.output_dir} no "
                    "checkpoint-N directory")
            return newest
        if isinstance(asked, int):
            return asked
        path = os.fspath(asked)
        if os.path.isfile(os.path.join(path, _STATE_NAME)):
            return None  # a checkpoint the Trainer wrote itself
        step = checkpoint_step(path)
        parent = path.rstrip("/").rpartition("/")[0] or "."
        if step is None or root_key(parent) != root_key(self._hoist_root):
            raise ValueError(
                f"resume_from_checkpoint={path!r}: neither a checkpoint "
                "directory the Trainer wrote nor a step of the hoist root "
                f"({self._hoist_root}/{PREFIX_CHECKPOINT_DIR}-N)")
        return step

    def _hoist_restore(self, step, directory):
        """Reads step `step` (every rank at once), checks it is the
        Trainer's, and writes its TrainerState into `directory`."""
        manager = self._hoist_manager()
        if step not in manager.steps:
            raise FileNotFoundError(
                f"{self.checkpoint_path(step)}: step {step} is not a "
                f"committed step of {manager.path} (it holds "
                f"{manager.steps or 'none'})")
        where = self.checkpoint_path(step)
        state = _pickles.decoded(manager.restore(step, per_rank="all"),
                                 where, _CONSENT,
                                 trusted=self._hoist_allow_pickle)
        if not isinstance(state, dict) or state.get(FORMAT_KEY) != 1:
            raise ValueError(f"{where}: the step was not saved by "
                             "hoist.transformers")
        with open(os.path.join(directory, _STATE_NAME), "w") as f:
            f.write(state["trainer_state"])
        _LOG.info("hoist.transformers: resuming from step %d of %s", step,
                  manager.path)
        return _Resumed(step, state, directory)

    def _hoist_state(self, path):
        """The resumed step's tree when `path` is the directory standing
        for it, else None."""
        resumed = self._hoist_resumed
        if resumed is None or path is None or \
                os.fspath(path) != resumed.directory:
            return None
        return resumed.state

    def _init_training_state(self, max_steps, num_update_steps_per_epoch,
                             num_train_epochs, resume_from_checkpoint, trial):
        out = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs,
            resume_from_checkpoint, trial)
        state = self._hoist_state(resume_from_checkpoint)
        if state is not None:
            # The Trainer dropped the best checkpoint's path (no directory
            # holds it): it names a step, kept while it is committed.
            saved = TrainerState(**json.loads(state["trainer_state"]))
            best = checkpoint_step(saved.best_model_checkpoint or "")
            if best is not None and best in self._hoist_manager().steps:
                self.state.best_model_checkpoint = self.checkpoint_path(best)
        return out

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        state = self._hoist_state(resume_from_checkpoint)
        if state is None:
            return super()._load_from_checkpoint(resume_from_checkpoint,
                                                 model)
        model = self.accelerator.unwrap_model(
            self.model if model is None else model)
        _refuse_sharded(model)
        model.load_state_dict(state["model"])
        return None

    def _load_optimizer_and_scheduler(self, checkpoint):
        state = self._hoist_state(checkpoint)
        if state is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        if state["optimizer"] is None:
            _LOG.warning("hoist.transformers: step %d holds the model only "
                         "(save_only_model): the optimizer and scheduler "
                         "start afresh", self._hoist_resumed.step)
            return None
        self.optimizer.load_state_dict(state["optimizer"])
        if self.lr_scheduler is not None and state["scheduler"] is not None:
            self.lr_scheduler.load_state_dict(state["scheduler"])
        return None

    def _load_scaler(self, checkpoint):
        state = self._hoist_state(checkpoint)
        if state is None:
            return super()._load_scaler(checkpoint)
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None and state["scaler"] is not None:
            scaler.load_state_dict(state["scaler"])
        return None

    def _load_rng_state(self, checkpoint):
        state = self._hoist_state(checkpoint)
        if state is None:
            return super()._load_rng_state(checkpoint)
        processes = state["process"]  # every saved process's, by rank
        if processes is None:
            return None
        if len(processes) != self.args.world_size:
            _LOG.info("hoist.transformers: step %d was saved by %d "
                      "processes, this job has %d: RNG states are left as "
                      "they are", self._hoist_resumed.step, len(processes),
                      self.args.world_size)
            return None
        _set_rng_state(processes[self.args.process_index]["rng"])
        return None

    def _load_best_model(self):
        step = checkpoint_step(self.state.best_model_checkpoint or "")
        if step is None or not self.state.best_model_checkpoint.startswith(
                self._hoist_root):
            return super()._load_best_model()
        self._hoist_background.drain()
        _LOG.info("hoist.transformers: loading the best model, step %d "
                  "(score %s)", step, self.state.best_metric)
        model = self.accelerator.unwrap_model(self.model)
        # Only the model's arrays are read, each into a tensor shaped and
        # placed like the model's own.
        saved = self._hoist_manager().restore(
            step, like={"model": model.state_dict()})
        model.load_state_dict(saved["model"])
        return None


def _refuse_sharded(model):
    """A resume loads full tensors: a model sharded as DTensors (FSDP2)
    is refused before anything is loaded."""
    from torch.distributed.tensor import DTensor
    for name, value in model.state_dict().items():
        if isinstance(value, DTensor):
            raise NotImplementedError(
                f"hoist.transformers: {name} is a DTensor (FSDP2): resuming "
                "a sharded model is not supported yet (its steps save, "
                "export and load into an unsharded model)")


class HoistTrainer(HoistCheckpointMixin, Trainer):
    """transformers.Trainer whose checkpoints are hoist steps (see
    HoistCheckpointMixin for the arguments beside the Trainer's)."""


def export_model(root, step, out, *, model=None, storage_options=None):
    """Writes step `step` of `root` (a hoist.transformers step) as the
    layout the Hub takes into `out`: model.safetensors (or shards and their
    index) and, given the model, its config.json (and
    generation_config.json for a model that generates)."""
    export(f"{os.fspath(root).rstrip('/')}/step_{int(step):08d}", out,
           prefix="model/", storage_options=storage_options)
    if model is not None and getattr(model, "config", None) is not None:
        model.config.save_pretrained(out)
        generation = getattr(model, "generation_config", None)
        if generation is not None and getattr(model, "can_generate",
                                              lambda: False)():
            generation.save_pretrained(out)
