"""Bridges to the checkpoints users already have.

export():            a hoist step as Hugging Face safetensors (the engine's
                     streaming export, as `hoist export` runs it).
import_checkpoint(): a safetensors file or sharded directory, an Orbax
                     checkpoint or a PyTorch DCP checkpoint as an ordinary
                     committed hoist step (hashed, atomic), restorable onto
                     any sharding.
"""

import json
import math
import os

import ml_dtypes
import numpy as np

from . import _hoist
from ._errors import DataLossError
from ._errors import call as _call

_INDEX = "model.safetensors.index.json"
_MAX_HEADER_BYTES = 100 << 20  # as the safetensors library


def export(step_dir, out_dir, format="safetensors", *,
           max_shard_bytes=5_000_000_000, prefix="", memory_bytes=256 << 20):
    """Writes the committed step `step_dir` (ROOT/step_N, or a root: its
    newest step) into `out_dir` as safetensors: model.safetensors, or
    model-0000K-of-0000N.safetensors files of at most `max_shard_bytes`
    each and model.safetensors.index.json. Tensors keep the saved array
    names; prefix="FROM" exports only names starting with FROM, without it,
    and "FROM=TO" replaces it ("model/" for a step saved as
    {"model": model}). Reads stream through `memory_bytes` of host memory,
    each extent's hash checked; each file's metadata holds "format": "pt"
    and every tensor's XXH3 ("hoist.xxh3"). Returns the figures: tensors,
    bytes, bytes_read, files, elapsed_s."""
    if format != "safetensors":
        raise ValueError(f"format {format!r}: hoist exports 'safetensors'")
    return _call(_hoist.export_safetensors, os.fspath(step_dir),
                 os.fspath(out_dir), int(max_shard_bytes), str(prefix),
                 int(memory_bytes))


def import_checkpoint(src, root, step, format, **manager_options):
    """Saves the checkpoint at `src` as step `step` of the hoist root
    `root` and returns the step's SaveHandle's figures once it has
    committed. format is "safetensors" (a file, or a directory holding one
    *.safetensors file or model.safetensors.index.json and its shards),
    "orbax" (a checkpoint directory orbax-checkpoint wrote, read through
    orbax-checkpoint) or "dcp" (a torch.distributed.checkpoint directory,
    read through its FileSystemReader). Arrays are named by the source's
    tree, nested dicts as paths ("params/dense/kernel"); safetensors names
    are kept as they are. Other values (a DCP step count, Orbax scalars)
    come along as the tree's leaves. The source is checked before anything
    is written: a malformed safetensors file raises DataLossError naming
    the file and the fault, a shard the index names but lacks
    FileNotFoundError; in every failure no step is made.
    `manager_options` go to the CheckpointManager (pool_bytes, ...)."""
    from . import CheckpointManager
    readers = {"safetensors": _read_safetensors, "orbax": _read_orbax,
               "dcp": _read_dcp}
    if format not in readers:
        raise ValueError(f"format {format!r}: use one of {sorted(readers)}")
    tree = readers[format](os.fspath(src))
    manager_options.setdefault("coordinator", "single")
    with CheckpointManager(root, **manager_options) as mgr:
        return mgr.save(step, tree, metadata={"imported_from": {
            "format": format, "path": os.path.abspath(os.fspath(src))}}).wait()


# -- safetensors ---------------------------------------------------------------


def _numpy_dtype(safetensors_dtype, where):
    try:
        name = _call(_hoist.dtype_of_safetensors, safetensors_dtype)
    except ValueError:
        raise DataLossError(f"{where}: dtype {safetensors_dtype!r} is not one "
                            "hoist holds") from None
    return np.dtype(getattr(ml_dtypes, name, None) or name)


def _safetensors_files(src):
    """The files of a safetensors checkpoint at `src`: [src] for a file;
    for a directory, the shards its index names (each checked to exist) or
    its one *.safetensors file."""
    if not os.path.isdir(src):
        if not os.path.exists(src):
            raise FileNotFoundError(f"{src}: no such file or directory")
        return [src]
    index = os.path.join(src, _INDEX)
    if os.path.exists(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise DataLossError(f"{index}: not a safetensors index "
                                f"({error})") from None
        files = []
        for name in names:
            if (not isinstance(name, str) or os.path.basename(name) != name
                    or name in ("", ".", "..")):
                raise DataLossError(f"{index}: shard name {name!r} is not a "
                                    "file name in its directory")
            path = os.path.join(src, name)
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"{index} names {name}, which {src} does not hold")
            files.append(path)
        return files
    found = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    if len(found) != 1:
        raise FileNotFoundError(
            f"{src}: expected one *.safetensors file or {_INDEX}, found "
            f"{len(found)} files")
    return [os.path.join(src, found[0])]


def _read_safetensors_file(path):
    """name -> read-only array mapped from `path`, after checking the whole
    header: its length, its JSON, every entry's dtype, shape and offsets,
    and that the tensors tile the data exactly (no overlap, no gap)."""
    size = os.path.getsize(path)

    def bad(what):
        return DataLossError(f"{path}: {what}")

    if size < 8:
        raise bad(f"{size} bytes: too short for a safetensors header")
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if length > min(size - 8, _MAX_HEADER_BYTES):
            raise bad(f"header length {length} runs past the file's "
                      f"{size} bytes (truncated?)")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise bad(f"header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    header.pop("__metadata__", None)
    data_start, data_bytes = 8 + length, size - 8 - length
    spans = []
    for name, entry in header.items():
        where = f"tensor {name!r}"
        if (not isinstance(entry, dict) or set(entry) != {
                "dtype", "shape", "data_offsets"}):
            raise bad(f"{where}: entry is not {{dtype, shape, data_offsets}}")
        dtype = _numpy_dtype(entry["dtype"], f"{path}: {where}")
        shape, offsets = entry["shape"], entry["data_offsets"]
        if (not isinstance(shape, list) or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0
                for n in shape)):
            raise bad(f"{where}: shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool)
                           for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_bytes):
            raise bad(f"{where}: data_offsets {offsets!r} outside the "
                      f"{data_bytes} data bytes")
        need = math.prod(shape) * dtype.itemsize
        if offsets[1] - offsets[0] != need:
            raise bad(f"{where}: {offsets[1] - offsets[0]} bytes for shape "
                      f"{shape} of {entry['dtype']} ({need} bytes)")
        spans.append((offsets[0], offsets[1], name, dtype, tuple(shape)))
    spans.sort()
    at = 0
    for begin, end, name, _, _ in spans:
        if begin != at:
            raise bad(f"tensor {name!r} starts at {begin}, "
                      + ("overlapping the tensor before it" if begin < at
                         else f"leaving a gap after {at}"))
        at = end
    if at != data_bytes:
        raise bad(f"the tensors end at {at} of {data_bytes} data bytes")
    out = {}
    for begin, end, name, dtype, shape in spans:
        if end == begin:
            out[name] = np.zeros(shape, dtype)
        else:
            out[name] = np.memmap(path, dtype=dtype, mode="r",
                                  offset=data_start + begin, shape=shape)
    return out


def _read_safetensors(src):
    tensors = {}
    for path in _safetensors_files(src):
        for name, array in _read_safetensors_file(path).items():
            if name in tensors:
                raise DataLossError(f"tensor {name!r} is in more than one "
                                    f"file of {src}")
            tensors[name] = array
    return tensors


# -- Orbax and DCP -----------------------------------------------------------


def _read_orbax(src):
    """The pytree an Orbax checkpoint holds, every array as NumPy (any
    saved sharding, any device count now)."""
    import jax
    import orbax.checkpoint as ocp
    checkpointer = ocp.PyTreeCheckpointer()
    metadata = checkpointer.metadata(src)
    tree = getattr(metadata, "item_metadata", None) or metadata
    tree = getattr(tree, "tree", tree)
    restore_args = jax.tree_util.tree_map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    return checkpointer.restore(src, restore_args=restore_args)


def _read_dcp(src):
    """The state dict a torch.distributed.checkpoint directory holds, in
    its nested structure, tensors on the CPU (no process group needed)."""
    import warnings
    from torch.distributed.checkpoint.state_dict_loader import (
        _load_state_dict_from_keys)
    with warnings.catch_warnings():  # "assuming ... a single process": yes
        warnings.simplefilter("ignore", UserWarning)
        return _load_state_dict_from_keys(checkpoint_id=src)
