"""Lightning's CheckpointIO over hoist:

    from hoist.lightning import HoistCheckpointIO
    trainer = Trainer(plugins=[HoistCheckpointIO()])

Lightning names each checkpoint by a path (DIR/epoch=3-step=400.ckpt,
DIR/last.ckpt). hoist keeps the checkpoints of DIR as the steps of one
root, DIR/.hoist (so its pinned pool is allocated once and every save is
an ordinary hoist step), and the path itself becomes a small pointer file
naming its step, written (atomically) once that step has committed. So
ModelCheckpoint's paths, its top-k removal, last.ckpt and
trainer.fit(ckpt_path=...) work unchanged, and a path never names a step
that did not commit: a job killed mid-save resumes from the checkpoint
before.

save_checkpoint returns once the state is staged (copied into the pool);
the write, the commit and the pointer follow in the background, in order,
and teardown() (Lightning calls it at the end of fit) waits for them.
Lightning saves and removes checkpoints on global rank 0 only (under DDP
too); every rank loads, reading the step without the root's lock.

Lightning's FSDP and DeepSpeed strategies bypass CheckpointIO (they save
sharded state themselves): an FSDP job checkpoints through DCP, and
hoist.dcp's Writer and Reader are its hoist (docs/integrations.md).
"""

import json
import os
import threading

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from .. import read
from . import _pickles
from ._background import Background, write_durably
from ._managers import open_manager

__all__ = ["HoistCheckpointIO", "POINTER_FORMAT"]

POINTER_FORMAT = "hoist.lightning/1"
_POINTER_MAX_BYTES = 4096
_TMP_SUFFIX = ".hoist-tmp"  # a local pointer being written


def _is_url(path):
    return "://" in path


def _split(path):
    path = os.fspath(path)
    directory, _, name = path.rstrip("/").rpartition("/")
    return directory or ".", name


def _mapped(value, map_location):
    """Tensors moved to `map_location` when it is a device (or its name);
    other map_locations (functions, dicts) keep them on the CPU."""
    if not isinstance(map_location, (str, torch.device)):
        return value
    if isinstance(value, torch.Tensor):
        return value.to(map_location)
    if isinstance(value, dict):
        return {k: _mapped(v, map_location) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_mapped(v, map_location) for v in value)
    return value


class _Pointers:
    """The pointer files: read, written atomically, removed; local paths
    with os (fsynced), URLs with fsspec (as Lightning writes them)."""

    @staticmethod
    def read(path):
        """The pointer at `path` as (root name, step), or None when `path`
        holds something else (a checkpoint Lightning wrote)."""
        path = os.fspath(path)
        try:
            if _is_url(path):
                import fsspec
                with fsspec.open(path, "rb") as f:
                    head = f.read(_POINTER_MAX_BYTES + 1)
            else:
                with open(path, "rb") as f:
                    head = f.read(_POINTER_MAX_BYTES + 1)
        except FileNotFoundError:
            raise FileNotFoundError(f"Checkpoint file not found: {path}") \
                from None
        if not head.startswith(b"{") or len(head) > _POINTER_MAX_BYTES:
            return None
        try:
            pointer = json.loads(head)
        except ValueError:
            return None
        if not isinstance(pointer, dict) or \
                pointer.get("format") != POINTER_FORMAT:
            return None
        root, step = pointer.get("root"), pointer.get("step")
        if not isinstance(root, str) or "/" in root or root in ("", ".", "..") \
                or not isinstance(step, int) or step < 0:
            raise ValueError(f"{path}: a malformed hoist pointer")
        return root, step

    @staticmethod
    def write(path, root_name, step):
        text = json.dumps({"format": POINTER_FORMAT, "root": root_name,
                           "step": step}).encode()
        path = os.fspath(path)
        if _is_url(path):
            import fsspec
            with fsspec.open(path, "wb") as f:  # an object PUT is atomic
                f.write(text)
            return
        write_durably(path, text, _TMP_SUFFIX)

    @staticmethod
    def remove(path):
        path = os.fspath(path)
        if _is_url(path):
            import fsspec
            fs, at = fsspec.core.url_to_fs(path)
            try:  # not exists() first: its listing may be cached
                fs.rm(at)
            except FileNotFoundError:
                pass
        elif os.path.lexists(path):
            os.remove(path)

    @staticmethod
    def remove_unfinished(directory):
        """Removes what a killed writer of a local pointer left."""
        if not _is_url(directory) and os.path.isdir(directory):
            for name in os.listdir(directory):
                if name.endswith(_TMP_SUFFIX):
                    os.remove(os.path.join(directory, name))

    @staticmethod
    def listed(directory):
        """The paths of `directory` that may be pointers (*.ckpt)."""
        if _is_url(directory):
            import fsspec
            fs, at = fsspec.core.url_to_fs(directory)
            protocol = directory.split("://", 1)[0]
            fs.invalidate_cache(at)  # others (Lightning) write here too
            return [f"{protocol}://{p}" for p in fs.ls(at, detail=False)
                    if p.endswith(".ckpt")]
        return [os.path.join(directory, n) for n in os.listdir(directory)
                if n.endswith(".ckpt")]


class HoistCheckpointIO(CheckpointIO):
    """A Lightning CheckpointIO that saves each checkpoint as a step of the
    hoist root DIR/`root_name` beside it (see the module's docstring).
    Other keyword arguments open that root's manager
    (hoist.CheckpointManager's: pool_bytes, storage_options, deltas, ...);
    it is a single-process manager (Lightning saves on rank 0 alone)."""

    def __init__(self, *, root_name=".hoist", **manager_options):
        super().__init__()
        if "/" in root_name or root_name in ("", ".", ".."):
            raise ValueError(f"root_name {root_name!r}: a directory name")
        if manager_options.get("coordinator", "single") != "single":
            raise ValueError("HoistCheckpointIO's manager is single-process "
                             "(Lightning saves on rank 0 alone)")
        self._root_name = root_name
        self._options = {**manager_options, "coordinator": "single"}
        self._lock = threading.Lock()
        # root -> the last step number given out (its newest step, listed
        # once, before this IO's first save there).
        self._issued = {}
        # Commits, pointers and removals, in the order they were asked for.
        self._background = Background("hoist-ckpt-io")
        self._fallback = TorchCheckpointIO()

    def _root(self, directory):
        return f"{directory.rstrip('/')}/{self._root_name}"

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        """Saves `checkpoint` as the next step of its directory's root;
        returns once it is staged. `path` names it once it commits."""
        if storage_options is not None:
            raise TypeError("HoistCheckpointIO takes no storage_options per "
                            "save (give manager options to its constructor)")
        directory, _ = _split(path)
        root = self._root(directory)
        manager = open_manager(root, self._options)
        with self._lock:
            if root not in self._issued:  # once per root: list it
                _Pointers.remove_unfinished(directory)  # a killed job's
                self._issued[root] = max([-1, *manager.steps[-1:]])
            step = self._issued[root] = self._issued[root] + 1
        handle = manager.save(step, _pickles.encodable(checkpoint))
        self._submit(self._commit, manager, handle, path, step)

    def _commit(self, manager, handle, path, step):
        handle.wait()
        before = self._pointed(path)
        _Pointers.write(path, self._root_name, step)
        if before is not None and before != step:
            self._drop_unreferenced(manager, os.fspath(path), before)

    def _pointed(self, path):
        try:
            pointer = _Pointers.read(path)
        except FileNotFoundError:
            return None
        if pointer is None or pointer[0] != self._root_name:
            return None
        return pointer[1]

    def _drop_unreferenced(self, manager, path, step):
        """Deletes `step` unless another pointer of the directory names
        it (a copy of last.ckpt, say)."""
        directory, _ = _split(path)
        for other in _Pointers.listed(directory):
            if os.path.abspath(other) != os.path.abspath(path) and \
                    self._pointed(other) == step:
                return
        if step in manager.steps:
            manager.delete(step)

    def _submit(self, fn, *args):
        self._background.submit(fn, *args)

    def _drain(self):
        """Waits for every save and removal asked for so far; raises the
        first that failed."""
        self._background.drain()

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        """The checkpoint at `path`: a hoist pointer's step, read without
        the root's lock (every rank loads), or, for a file Lightning wrote
        itself, Lightning's own loader. Pickled objects (not tensors,
        containers or scalars) load only with weights_only=False."""
        self._drain()
        pointer = _Pointers.read(path)
        if pointer is None:
            return self._fallback.load_checkpoint(
                path, map_location=map_location, weights_only=weights_only)
        root_name, step = pointer
        directory, _ = _split(path)
        state = read(f"{directory.rstrip('/')}/{root_name}", step)
        return _mapped(_pickles.decoded(state, os.fspath(path),
                                        "load with weights_only=False",
                                        trusted=weights_only is False),
                       map_location)

    def remove_checkpoint(self, path):
        """Removes the pointer at `path` (after any save to it), then its
        step unless another pointer names it."""
        self._submit(self._remove, path)

    def _remove(self, path):
        step = self._pointed(path)
        _Pointers.remove(path)
        if step is not None:
            directory, _ = _split(path)
            manager = open_manager(self._root(directory), self._options)
            self._drop_unreferenced(manager, os.fspath(path), step)

    def teardown(self):
        """Waits for every save (committed, its pointer written) and
        removal."""
        self._drain()
