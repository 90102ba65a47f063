"""DeepSpeed's checkpoints as hoist steps:

    engine, optimizer, _, _ = deepspeed.initialize(...)
    hoist.deepspeed.use(engine, "/ckpt")    # or s3://...; default: save_dir
    engine.save_checkpoint(save_dir)        # returns once the state is staged
    engine.load_checkpoint(save_dir)        # the newest committed step

use() gives the engine a CheckpointEngine of hoist's. Every file DeepSpeed
saves for a tag (its model states, each rank's ZeRO partition of the
optimizer) becomes part of one hoist step: each rank stages the tensors of
its own files in hoist's pinned pool, and save_checkpoint returns; the
write, the commit and then DeepSpeed's `latest` file (on rank 0, written
atomically once the step has committed, never before) follow in the
background. A tag names the step: "global_stepN" (DeepSpeed's default) is
step N, and a tag that is an integer is that step.

load_checkpoint(save_dir) without a tag loads the root's newest committed
step (not what `latest` says: a job killed mid-save never names a step that
did not commit); every file DeepSpeed asks for is read back from the step,
each extent's hash checked. A tag DeepSpeed wrote itself before the switch
(files on disk) still loads through DeepSpeed's own torch.load.

Under ZeRO 1 and 2 the optimizer partitions are saved as boxes of arrays
of the whole job (_zero.py), so a job of another data-parallel size loads
the step: it is handed the files DeepSpeed would have written at its size.
Into or out of ZeRO-3, or ZeRO-3 at another size, is refused by name.

The objects DeepSpeed puts in its files beside the tensors (its loss
scaler, ZeRO stage, fragment addresses) are unpickled with torch.load's
weights_only and those classes allowed; anything else (a client_state's
objects) only with use(..., allow_pickle=True).
"""

import fnmatch
import os
import re
import shutil
import tempfile
import weakref

import torch
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import (
    CheckpointEngine)

from .._tree import _plain, _tensor_bytes, _torch_dtype_name
from . import _ds_files, _zero
from ._background import Background, write_durably
from ._managers import open_manager

__all__ = ["use", "HoistCheckpointEngine", "FORMAT_KEY", "tag_step",
           "fp32_state_dict"]

# The step's metadata says what wrote it.
FORMAT_KEY = "hoist.deepspeed"
ENGINE_NAME = "HoistCheckpointEngine"
_TAG = re.compile(r"^global_step(\d+)$")


def tag_step(tag):
    """The hoist step a DeepSpeed tag names: "global_stepN" -> N, "N" -> N;
    any other tag is a ValueError."""
    text = str(tag)
    match = _TAG.match(text)
    if match is not None:
        return int(match.group(1))
    if text.isdigit():
        return int(text)
    raise ValueError(f"hoist.deepspeed: tag {text!r} names no step: use "
                     "DeepSpeed's default (global_stepN) or an integer tag")


class HoistCheckpointEngine(CheckpointEngine):
    """DeepSpeed's CheckpointEngine over one hoist root (see the module's
    docstring); use() installs it."""

    def __init__(self, root=None, *, allow_pickle=False, **manager_options):
        super().__init__(None)
        self.name = ENGINE_NAME
        self._root = None if root is None else os.fspath(root).rstrip("/")
        self._options = manager_options
        self._allow_pickle = allow_pickle
        self._info = None  # the save between create() and commit()
        self._files = {}  # its files: name -> state dict
        self._save_latest = True
        # Commits and `latest` files, in the order of the saves.
        self._background = Background("hoist-ds")
        # Stand-ins for a step's files where DeepSpeed wants a path that
        # exists (its model-states loader asserts one): path -> (save_dir,
        # tag, name), empty files in a directory of this engine's.
        self._engine = None  # the DeepSpeed engine, once use() sets it
        self._stand_ins = {}
        self._stand_in_dir = None
        self._manifests = {}  # (root, step) -> its manifest, for loads

    # -- the root ----------------------------------------------------------

    def root_of(self, save_dir):
        """The hoist root of DeepSpeed's `save_dir`: use()'s, else
        save_dir itself."""
        return self._root or os.fspath(save_dir).rstrip("/")

    def manager(self, save_dir):
        return open_manager(self.root_of(save_dir), self._options)

    def newest_tag(self, save_dir):
        """The tag of the root's newest committed step, or None."""
        manager = self.manager(save_dir)
        step = manager.latest
        if step is None:
            return None
        return (manager.metadata(step) or {}).get("tag", f"global_step{step}")

    # -- saving ------------------------------------------------------------

    def create(self, info):
        self.raise_failed()
        tag_step(info.tag)  # refused before anything is saved
        self._info, self._files = info, {}
        self._manifests.clear()  # the step may be saved anew

    def makedirs(self, path, exist_ok=False):
        """Only save_dir itself (where `latest` goes) is made: a tag's
        files are parts of a hoist step."""
        info = self._info
        path = os.fspath(path)
        if "://" in path or (info is not None and os.path.abspath(path) == (
                os.path.abspath(os.path.join(info.save_dir, info.tag)))):
            return
        os.makedirs(path, exist_ok=exist_ok)

    def preserves_storage_sharing(self):
        return False  # no clones: each tensor is staged as it is

    def save(self, state_dict, path):
        info = self._info
        if info is None:
            raise RuntimeError("hoist.deepspeed: save() outside a "
                               "save_checkpoint")
        name = os.path.relpath(os.fspath(path),
                               os.path.join(info.save_dir, info.tag))
        if name.startswith(".."):
            raise ValueError(f"hoist.deepspeed: {path} is not under the "
                             f"tag's directory {info.save_dir}/{info.tag}")
        self._files[name.replace(os.sep, "/")] = state_dict

    def commit(self, info):
        """Saves every rank's files as one step (every rank calls it):
        returns once they are staged."""
        files, self._files, self._info = self._files, {}, None
        manager = self.manager(info.save_dir)
        devices = manager._devices
        pieces = _zero.Partitions(files, devices.rank)
        mine, specs = {}, []
        for name, state in sorted(files.items()):
            tensors = {}
            structure = _ds_files.split(state, name, tensors, pieces.markers)
            tensors[f"{name}/{_ds_files.STRUCTURE}"] = \
                _ds_files.structure_bytes(structure)
            for key, tensor in tensors.items():
                tensor = _plain(key, tensor)
                mine[key] = tensor
                specs.append((key, _torch_dtype_name(tensor.dtype),
                              list(tensor.shape)))
        every = _zero.all_ranks((sorted(files), specs))
        arrays = pieces.arrays(devices)
        for rank, (_, rank_specs) in enumerate(every):
            for key, dtype, shape in rank_specs:
                if rank == devices.rank:
                    tensor = mine[key]
                    shard = (devices.of_tensor(key, tensor), [0] * len(shape),
                             shape, _tensor_bytes(tensor))
                else:
                    shard = (devices.processes[rank], [0] * len(shape), shape,
                             None)
                arrays.append((key, dtype, shape, [shard]))
        meta = {FORMAT_KEY: 1, "tag": str(info.tag),
                "files": {name: rank for rank, (names, _) in enumerate(every)
                          for name in names}}
        if self._engine is not None:
            size, stage = _zero.live_layout(self._engine)
            meta["layout"] = {"dp": size, "stage": stage}
        if pieces.files:
            meta["zero"] = {"dp": len(every), "files": pieces.files}
        handle = manager._save_arrays(tag_step(info.tag), arrays, meta)
        latest = self._save_latest and devices.rank == 0 and \
            "://" not in os.fspath(info.save_dir)
        self._background.submit(self._committed, handle, info.save_dir,
                                str(info.tag), latest)
        return True

    @staticmethod
    def _committed(handle, save_dir, tag, latest):
        """In the background: once the step has committed, DeepSpeed's
        `latest` names it (written whole: a temporary file, fsynced,
        renamed, the directory fsynced)."""
        handle.wait()
        if latest:
            write_durably(os.path.join(save_dir, "latest"), tag.encode())

    def raise_failed(self):
        """Raises the error of an earlier save that failed in the
        background (its step never became visible)."""
        self._background.raise_failed()

    def wait(self):
        """Returns once every save so far has committed (and its `latest`
        is written); raises the first that failed."""
        self._background.drain()

    # -- loading -----------------------------------------------------------

    def _step_manifest(self, save_dir, step):
        """Step `step`'s manifest (decoded once per step: a load reads
        several files of it), or None when the root has no such step."""
        root = self.root_of(save_dir)
        held = self._manifests.get((root, step))
        if held is None:
            manager = self.manager(save_dir)
            if step not in manager.steps:
                return None
            held = self._manifests[(root, step)] = manager._manifest(step)
        return held

    def files(self, save_dir, tag):
        """The files step `tag` of the root holds, or None when the root
        has no such step."""
        step = tag_step(tag)
        manifest = self._step_manifest(save_dir, step)
        if manifest is None:
            return None
        meta = manifest.get("metadata") or {}
        if FORMAT_KEY not in meta:
            raise ValueError(f"step {step} of {self.root_of(save_dir)} was "
                             "not saved by hoist.deepspeed")
        return sorted(meta["files"])

    def stand_in(self, save_dir, tag, name):
        """An empty file standing for file `name` of step `tag` where
        DeepSpeed checks that a path exists; load() reads the step's."""
        if self._stand_in_dir is None:
            self._stand_in_dir = tempfile.mkdtemp(prefix="hoist-ds-")
            weakref.finalize(self, shutil.rmtree, self._stand_in_dir, True)
        path = os.path.join(self._stand_in_dir, str(tag), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
        self._stand_ins[path] = (os.fspath(save_dir), str(tag), name)
        return path

    def load(self, path, map_location=None):
        path = os.fspath(path)
        held = self._stand_ins.get(path)
        if held is None and os.path.isfile(path):
            # A file DeepSpeed wrote itself, loaded as its own engine does.
            return torch.load(path, map_location=map_location,
                              weights_only=False)
        self.wait()
        if held is None:
            tag_dir, name = os.path.split(path)
            save_dir, tag = os.path.split(tag_dir)
        else:
            save_dir, tag, name = held
        step = tag_step(tag)
        root = self.root_of(save_dir)
        manifest = self._step_manifest(save_dir, step)
        if manifest is None:
            raise FileNotFoundError(
                f"hoist.deepspeed: {path}: {root} holds no step {step} "
                f"(committed: {self.manager(save_dir).steps or 'none'})")
        step_file = _ds_files.StepFile(root, step, manifest, self._options,
                                       self._allow_pickle)
        resized = self._resized(manifest, root, step)
        rank = _zero.file_rank(name)
        if resized is not None and rank is not None:
            # An optimizer file of this job's size: rank 0's as saved,
            # its partitions read where this size puts them.
            zero = manifest["metadata"]["zero"]
            state = step_file.read(zero["files"][0], pieces=False)
            return _zero.rebuilt(state, self._engine, rank,
                                 step_file.lengths(), step_file.piece)
        state = step_file.read(name)
        if resized is not None and isinstance(state, dict) and \
                "dp_world_size" in state:
            state["dp_world_size"] = resized
        if map_location is not None and not callable(map_location):
            state = _ds_files.moved(state, map_location)
        return state

    def _resized(self, manifest, root, step):
        """This job's data-parallel size when the step was saved at
        another by a ZeRO 1 or 2 job (its partitions are then re-cut),
        else None."""
        zero = (manifest.get("metadata") or {}).get("zero")
        if zero is None or self._engine is None:
            return None
        size, _ = _zero.live_layout(self._engine)
        return None if size == zero["dp"] else size

    def check_layout(self, save_dir, tag):
        """Refuses (NotImplementedError, before anything is loaded) a step
        this job cannot load: one saved at another ZeRO stage family or
        data-parallel size, unless both are ZeRO 1 or 2 (whose optimizer
        partitions hoist re-cuts)."""
        try:
            step = tag_step(tag)
        except ValueError:
            return  # not a hoist step: DeepSpeed's own files
        manifest = self._step_manifest(save_dir, step)
        meta = (manifest or {}).get("metadata") or {}
        saved = meta.get("layout")
        if saved is None or self._engine is None:
            return
        size, stage = _zero.live_layout(self._engine)
        family = (saved["stage"] == 0, saved["stage"] == 3)
        if family == (stage == 0, stage == 3):
            if stage == 0 or saved["dp"] == size or "zero" in meta:
                return  # unpartitioned, the same size, or re-cut
        raise NotImplementedError(
            f"hoist.deepspeed: step {step} of {self.root_of(save_dir)} was "
            f"saved by {saved['dp']} data-parallel ranks at "
            f"ZeRO-{saved['stage']}; this job has {size} at ZeRO-{stage}: "
            "hoist re-cuts ZeRO 1 and 2 optimizer partitions for another "
            "data-parallel size; into or out of ZeRO-3 is not supported yet")


def fp32_state_dict(root, step=None, *, storage_options=None):
    """zero_to_fp32's job for a ZeRO 1 or 2 step of `root` (default: its
    newest): every parameter's fp32 master weights, whole, as name ->
    CPU tensor, read from the step's partition arrays (each extent's hash
    checked; no manager, no lock). A step of another kind is a
    ValueError."""
    from .. import inspect
    root = os.fspath(root).rstrip("/")
    at = root if step is None else f"{root}/step_{int(step):08d}"
    manifest = inspect(at, storage_options=storage_options)
    step = manifest["step"]
    meta = manifest.get("metadata") or {}
    zero = meta.get("zero")
    if FORMAT_KEY not in meta or zero is None:
        raise ValueError(f"step {step} of {root}: not a ZeRO 1 or 2 step "
                         "saved by hoist.deepspeed (a ZeRO-3 step's "
                         "parameters are partitioned one by one)")
    options = {"storage_options": storage_options or {}}
    files = _ds_files.StepFile(root, step, manifest, options, False)
    models = sorted(n for n in meta["files"] if n.endswith("model_states.pt"))
    optimizer = files.read(zero["files"][0], pieces=False)
    if any(any(p) for p in optimizer[_zero.OPTIMIZER].get(
            "param_alignment_paddings", [])):
        raise ValueError(f"step {step} of {root}: its parameters are padded "
                         "within their group (parameter_alignment): not "
                         "consolidated here")
    shapes = files.read(models[0]).get("param_shapes") or []
    out, lengths = {}, files.lengths()
    for group, named in enumerate(shapes):
        array = _zero.array_name(group, "fp32")
        flat = files.piece(array, 0, lengths[array])
        at = 0
        for name, shape in named.items():
            count = int(torch.Size(shape).numel())
            out[name] = flat[at:at + count].reshape(shape).clone()
            at += count
    return out


def use(engine, root=None, *, allow_pickle=False, **manager_options):
    """Makes DeepSpeed `engine` (deepspeed.initialize's) save and load its
    checkpoints as steps of hoist root `root` (a directory, s3://, gs://;
    default: the save_dir each call is given). Other keyword arguments
    open the root's manager (hoist.CheckpointManager's: pool_bytes, keep,
    storage_options, ...). Returns the HoistCheckpointEngine (its wait()
    waits for the saves in flight). engine.save_checkpoint and
    load_checkpoint keep their signatures."""
    hoist_engine = HoistCheckpointEngine(root, allow_pickle=allow_pickle,
                                         **manager_options)
    engine.checkpoint_engine = hoist_engine
    hoist_engine._engine = engine
    save, load = engine.save_checkpoint, engine.load_checkpoint
    all_names = engine._get_all_ckpt_names

    def save_checkpoint(save_dir, tag=None, client_state={},
                        save_latest=True, exclude_frozen_parameters=False):
        # `latest` is hoist's to write, once the step has committed.
        hoist_engine._save_latest = save_latest
        return save(save_dir, tag=tag, client_state=client_state,
                    save_latest=False,
                    exclude_frozen_parameters=exclude_frozen_parameters)

    def load_checkpoint(load_dir, tag=None, **kwargs):
        hoist_engine.wait()
        if tag is None:
            tag = hoist_engine.newest_tag(load_dir)
        if tag is not None:
            hoist_engine.check_layout(load_dir, tag)
        return load(load_dir, tag=tag, **kwargs)

    def _get_all_ckpt_names(checkpoints_path, tag):
        names = all_names(checkpoints_path, tag)
        if names:
            return names  # a tag DeepSpeed wrote itself
        held = hoist_engine.files(checkpoints_path, tag)
        if held is None:
            return names
        pattern = os.path.basename(engine._get_ckpt_name(
            checkpoints_path, tag, mp_placeholder="*"))
        return [hoist_engine.stand_in(checkpoints_path, tag, name)
                for name in held if fnmatch.fnmatch(name, pattern)]

    engine.save_checkpoint = save_checkpoint
    engine.load_checkpoint = load_checkpoint
    engine._get_all_ckpt_names = _get_all_ckpt_names
    return hoist_engine
