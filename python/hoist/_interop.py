"""Bridges to the checkpoints users already have.

export():            a hoist step as Hugging Face safetensors (the engine's
                     streaming export, as `hoist export` runs it).
import_checkpoint(): a safetensors file or sharded directory, an Orbax
                     checkpoint or a PyTorch DCP checkpoint as an ordinary
                     committed hoist step (hashed, atomic), restorable onto
                     any sharding.
"""

import errno
import os
import re

import numpy as np

from . import _hoist, _progress
from ._errors import DataLossError
from ._errors import call as _call
from ._errors import step_number
from ._manager import CheckpointManager
from ._options import storage_options as _storage_options


def export(step_dir, out_dir, format="safetensors", *,
           max_shard_bytes=_hoist.EXPORT_MAX_SHARD_BYTES, prefix="",
           memory_bytes=_hoist.EXPORT_MEMORY_BYTES, storage_options=None,
           progress=None):
    """Writes the committed step `step_dir` (ROOT/step_N, or a root: its
    newest step) into `out_dir` (a directory, or an s3:// or gs:// prefix:
    one object a file, each complete or absent) as safetensors:
    model.safetensors, or model-0000K-of-0000N.safetensors files of at most
    `max_shard_bytes` each and model.safetensors.index.json. Tensors keep the saved array
    names; prefix="FROM" exports only names starting with FROM, without it,
    and "FROM=TO" replaces it ("model/" for a step saved as
    {"model": model}). Reads stream through `memory_bytes` of host memory,
    each extent's hash checked; each file's metadata holds "format": "pt"
    and every tensor's XXH3 ("hoist.xxh3"). Returns the figures: tensors,
    bytes, bytes_read, files, elapsed_s. storage_options (as
    CheckpointManager's) open both the step and `out_dir`. progress=True
    shows a tqdm bar of the bytes read; a callable receives progress
    events (see hoist._progress)."""
    if format != "safetensors":
        raise ValueError(f"format {format!r}: hoist exports 'safetensors'")
    options = _storage_options(storage_options)
    return _progress.run(
        progress, "export",
        lambda counter: _call(_hoist.export_safetensors, os.fspath(step_dir),
                              os.fspath(out_dir), int(max_shard_bytes),
                              str(prefix), int(memory_bytes), options,
                              counter))


def import_checkpoint(src, root, step, format, *, progress=None,
                      **manager_options):
    """Saves the checkpoint at `src` as step `step` of the hoist root
    `root` and returns the step's SaveHandle's figures once it has
    committed. format is "safetensors" (a file, or a directory holding one
    *.safetensors file or model.safetensors.index.json and its shards),
    "orbax" (a checkpoint directory orbax-checkpoint wrote, read through
    orbax-checkpoint) or "dcp" (a torch.distributed.checkpoint directory,
    read through its FileSystemReader). Arrays are named by the source's
    tree, nested dicts as paths ("params/dense/kernel"); safetensors names
    are kept as they are, and the files are read by the engine (as `hoist
    import` does): every header checked whole before anything is written
    (a malformed file raises DataLossError naming the file, the tensor and
    the fault; a shard the index names but lacks, FileNotFoundError), then
    memory-mapped and streamed through the staging pool. Other values (a
    DCP step count, Orbax scalars) come along as the tree's leaves. In
    every failure no step is made. The step's metadata() holds
    "imported_from": {format, path}. `manager_options` go to the
    CheckpointManager (a safetensors import takes pool_bytes and
    storage_options only);
    pool_bytes defaults to 256 MiB, raised to the largest array. Returns
    the save's figures (step, path, bytes, ...). progress=True shows a
    tqdm bar of the bytes written; a callable receives progress events
    (see hoist._progress)."""
    if format == "safetensors":  # the engine's own reader, as `hoist import`
        unknown = set(manager_options) - {"pool_bytes", "storage_options"}
        if unknown:
            raise TypeError(f"a safetensors import takes pool_bytes and "
                            f"storage_options only, not {sorted(unknown)}")
        pool = int(manager_options.get("pool_bytes",
                                       _hoist.IMPORT_POOL_BYTES))
        options = _storage_options(manager_options.get("storage_options"))
        return _progress.run(
            progress, "import",
            lambda counter: _call(_hoist.import_safetensors, os.fspath(src),
                                  os.fspath(root), step_number(step), pool,
                                  options, counter))
    readers = {"orbax": _read_orbax, "dcp": _read_dcp}
    if format not in readers:
        raise ValueError(f"format {format!r}: use 'safetensors', 'orbax' or "
                         "'dcp'")
    tree = readers[format](os.fspath(src))
    manager_options.setdefault("coordinator", "single")
    manager_options["pool_bytes"] = _import_pool_bytes(
        tree, manager_options.get("pool_bytes", _hoist.IMPORT_POOL_BYTES))
    with CheckpointManager(root, **manager_options) as mgr:
        handle = mgr.save(step, tree, metadata={"imported_from": {
            "format": format, "path": os.fspath(src)}})
        return _progress.watch(progress, "import", handle)


# -- Orbax and DCP -----------------------------------------------------------


def _import_pool_bytes(tree, pool_bytes):
    """The staging pool for importing `tree`: `pool_bytes`, raised to its
    largest array, which is staged whole (as the safetensors import sizes
    it). The tree is in host memory already; a manager's default pool (1
    GiB, pinned and touched at open) would add that much again to the
    import's memory, and its time."""
    largest, nodes = 0, [tree]
    while nodes:
        node = nodes.pop()
        if isinstance(node, dict):
            nodes.extend(node.values())
        elif isinstance(node, (list, tuple)):
            nodes.extend(node)
        else:
            largest = max(largest, int(getattr(node, "nbytes", 0)))
    aligned = -(-largest // _hoist.POOL_ALIGNMENT) * _hoist.POOL_ALIGNMENT
    return max(int(pool_bytes), aligned)


def _listed_dir(src, what):
    """The names in directory `src`; FileNotFoundError or NotADirectoryError
    saying that `what` is a directory."""
    if not os.path.exists(src):
        raise FileNotFoundError(errno.ENOENT,
                                f"{src}: no such directory ({what} is one)")
    if not os.path.isdir(src):
        raise NotADirectoryError(errno.ENOTDIR,
                                 f"{src}: not a directory ({what} is one)")
    return os.listdir(src)


def _orbax_items(directory, names):
    """The items of an Orbax CheckpointManager's step directory (default/,
    state/, ...): those of its `names` that hold a _METADATA."""
    return sorted(n for n in names
                  if os.path.isfile(os.path.join(directory, n, "_METADATA")))


def _orbax_hint(src, names):
    """What to import instead of `src`, not itself an Orbax checkpoint: an
    item of the step directory it is, or of the newest step of the
    CheckpointManager directory it is; "" if neither."""
    items = _orbax_items(src, names)
    if items:
        return (f"; it holds the items {', '.join(items)}: import one, e.g. "
                f"{os.path.join(src, items[0])}")
    steps = _steps_within(src, names, lambda path: _orbax_items(
        path, os.listdir(path)))
    if not steps:
        return ""
    newest = max(steps, key=_step_order)
    return (f"; it is an Orbax CheckpointManager's directory of "
            f"{_count(steps, 'step')}, the newest {newest}: import an item "
            f"of one, e.g. {os.path.join(src, newest, steps[newest][0])}")


def _steps_within(src, names, holds):
    """The checkpoints in `src`, a directory of them: name -> holds(path)
    for each subdirectory (among `names`) where that is not empty. One that
    cannot be listed is left out (this only words an error)."""
    steps = {}
    for name in names:
        path = os.path.join(src, name)
        try:
            held = os.path.isdir(path) and holds(path)
        except OSError:
            continue
        if held:
            steps[name] = held
    return steps


def _step_order(name):
    """Sorts step directories by their number ("200" before "1000",
    "step_200" before "step_1000")."""
    digits = re.search(r"\d+$", name)
    return (int(digits.group()) if digits else -1, name)


def _count(things, noun):
    return f"{len(things)} {noun}{'' if len(things) == 1 else 's'}"


def _read_orbax(src):
    """The pytree an Orbax checkpoint holds, every array as NumPy (any
    saved sharding, any device count now). A path that is no Orbax
    checkpoint is a FileNotFoundError (NotADirectoryError) saying why; what
    orbax-checkpoint cannot read (garbled metadata, a data file cut short)
    is a DataLossError with its reason."""
    import jax
    import orbax.checkpoint as ocp
    # orbax-checkpoint reads the metadata of a relative path as of no tree
    # (and then fails on a pytree mismatch): hand it an absolute one.
    src = os.path.abspath(src)
    names = _listed_dir(src, "an Orbax checkpoint")
    if not {"_METADATA", "checkpoint", "manifest.ocdbt"} & set(names):
        raise FileNotFoundError(errno.ENOENT, f"{src}: not an Orbax "
                                f"checkpoint (no _METADATA)"
                                f"{_orbax_hint(src, names)}")
    checkpointer = ocp.PyTreeCheckpointer()
    try:
        metadata = checkpointer.metadata(src)
        tree = getattr(metadata, "item_metadata", None) or metadata
        tree = getattr(tree, "tree", tree)
        if not isinstance(tree, (dict, list, tuple)):
            raise ValueError("its metadata holds no tree of arrays")
        restore_args = jax.tree_util.tree_map(
            lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        return checkpointer.restore(src, restore_args=restore_args)
    except (FileNotFoundError, NotADirectoryError, MemoryError):
        raise
    except Exception as error:
        raise DataLossError(f"{src}: orbax-checkpoint could not read it: "
                            f"{type(error).__name__}: {error}") from None


def _holds_dcp_metadata(names):
    """Whether a directory of `names` is a DCP checkpoint: .metadata (or a
    rank's __N.metadata) among them."""
    return any(name == ".metadata" or (name.startswith("__") and
                                       name.endswith(".metadata"))
               for name in names)


def _read_dcp(src):
    """The state dict a torch.distributed.checkpoint directory holds, in
    its nested structure, tensors on the CPU (no process group needed).
    A path that is not such a directory is named before torch reads it (its
    reader would log a traceback per metadata file it tried); what torch
    then fails to read is a DataLossError with torch's reason (its own
    CheckpointException is a BaseException, which `except Exception` in a
    training script would not catch)."""
    import warnings
    names = _listed_dir(src, "a PyTorch DCP checkpoint")
    if not _holds_dcp_metadata(names):
        steps = _steps_within(src, names, lambda path: _holds_dcp_metadata(
            os.listdir(path)))
        hint = ""
        if steps:  # a directory of a job's DCP checkpoints
            newest = max(steps, key=_step_order)
            hint = (f"; it holds {_count(steps, 'DCP checkpoint')}, the "
                    f"newest {newest}: import one, e.g. "
                    f"{os.path.join(src, newest)}")
        raise FileNotFoundError(errno.ENOENT, f"{src}: not a PyTorch DCP "
                                f"checkpoint (no .metadata file){hint}")
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import (
        _load_state_dict_from_keys)
    try:
        with warnings.catch_warnings():  # "assuming ... a single process"
            warnings.simplefilter("ignore", UserWarning)
            return _load_state_dict_from_keys(checkpoint_id=src)
    except CheckpointException as error:
        reasons = "; ".join(f"{type(e).__name__}: {e}"
                            for e, _ in error.failures.values())
        raise DataLossError(f"{src}: torch.distributed.checkpoint could not "
                            f"read it: {reasons}") from None
