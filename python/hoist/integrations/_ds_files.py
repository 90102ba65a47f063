"""A hoist.deepspeed step's files: each file's state dict saved as its
structure (the state dict with every tensor replaced by a marker, pickled
into a uint8 array) and its tensors (arrays of the rank that saved the
file, or pieces of the ZeRO partition arrays: _zero.py); and a step's
files read back, each extent's hash checked."""

import io
from collections import OrderedDict

import numpy as np
import torch

from .. import DataLossError
from .._read import read_regions
from .._tree import _aligned_bytes
from . import _pickles, _zero

STRUCTURE = ".structure"  # a file's state dict, its tensors by name
_TENSOR = "hoist.deepspeed.tensor:"  # stands for a tensor in a structure
_CONSENT = "pass allow_pickle=True to hoist.deepspeed.use"


def _deepspeed_globals():
    """The classes DeepSpeed pickles into its own files."""
    from deepspeed.runtime.fp16.loss_scaler import (DynamicLossScaler,
                                                    LossScaler)
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address
    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def split(value, prefix, tensors, pieces):
    """`value` with each tensor holding elements replaced by a marker: a
    ZeRO partition by its piece's (`pieces`: id -> marker), any other by
    its name (`prefix`/key path), the tensor into `tensors`."""
    if isinstance(value, torch.Tensor) and value.numel() > 0:
        if id(value) in pieces:
            return pieces[id(value)]
        tensors[prefix] = value
        return _TENSOR + prefix
    if isinstance(value, dict):
        kind = type(value) if type(value) in (dict, OrderedDict) else dict
        return kind((k, split(v, f"{prefix}/{k}", tensors, pieces))
                    for k, v in value.items())
    if type(value) in (list, tuple):
        return type(value)(split(v, f"{prefix}/{i}", tensors, pieces)
                           for i, v in enumerate(value))
    return value


def _joined(value, tensors):
    """split()'s inverse: markers replaced by the tensors they name (a
    piece's by its marker, when read)."""
    if isinstance(value, str) and value.startswith(_TENSOR):
        return tensors[value[len(_TENSOR):]]
    if _zero.is_piece(value):  # left as it is where it was not read
        return tensors.get(value, value)
    if isinstance(value, dict):
        return type(value)((k, _joined(v, tensors)) for k, v in value.items())
    if type(value) in (list, tuple):
        return type(value)(_joined(v, tensors) for v in value)
    return value


def _markers(value):
    """The piece markers in a structure."""
    if _zero.is_piece(value):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _markers(v)
    elif type(value) in (list, tuple):
        for v in value:
            yield from _markers(v)


class StepFile:
    """Reads the files of one hoist.deepspeed step back."""

    def __init__(self, root, step, manifest, options, allow_pickle):
        self._root, self._step, self._options = root, step, options
        self._allow_pickle = allow_pickle
        self._arrays = {a["name"]: a for a in manifest["arrays"]}

    def lengths(self):
        return {name: int(a["shape"][0]) for name, a in self._arrays.items()
                if name.startswith("zero/")}

    def read(self, name, pieces=True):
        """File `name`'s state dict, its ZeRO partitions read (or left as
        their markers)."""
        arrays = [a for n, a in self._arrays.items()
                  if n.startswith(f"{name}/")]
        where = f"step {self._step} of {self._root}: {name}"
        if not arrays:
            raise FileNotFoundError(f"hoist.deepspeed: {where}: no such "
                                    "file in the step")
        tensors = _read(self._root, self._step, arrays, self._options)
        structure = tensors.pop(f"{name}/{STRUCTURE}", None)
        if structure is None:
            raise DataLossError(f"{where}: its structure is missing")
        with torch.serialization.safe_globals(_deepspeed_globals()):
            state = _pickles.load(structure.numpy().tobytes(), where,
                                  _CONSENT, trusted=self._allow_pickle)
        if pieces:
            for marker in set(_markers(state)):
                tensors[marker] = self.piece(*_zero.parse(marker))
        return _joined(state, tensors)

    def piece(self, array, start, count):
        """Elements [start, start + count) of partition array `array`
        (fewer where it ends), a CPU tensor."""
        saved = self._arrays.get(array)
        if saved is None:
            raise DataLossError(f"step {self._step} of {self._root}: no "
                                f"array {array}")
        total = int(saved["shape"][0])
        count = max(0, min(count, total - start))
        dtype = getattr(torch, saved["dtype"])
        raw = _aligned_bytes(count * dtype.itemsize)
        if count:
            read_regions(self._root, self._step, [
                (array, saved["dtype"], [total], [(-1, [start], [count], raw)])
            ], storage_options=self._options.get("storage_options"))
        return torch.from_numpy(raw).view(dtype)


def moved(value, device):
    if torch.is_tensor(value):
        return value.to(device)
    if isinstance(value, dict):
        return type(value)((k, moved(v, device)) for k, v in value.items())
    if type(value) in (list, tuple):
        return type(value)(moved(v, device) for v in value)
    return value


def structure_bytes(structure):
    """`structure` as torch.save's bytes, a uint8 tensor."""
    buffer = io.BytesIO()
    torch.save(structure, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _read(root, step, arrays, options):
    """The manifest's `arrays` of step `step`, read whole into CPU tensors
    (each extent's hash checked): name -> tensor."""
    targets, out = [], {}
    for array in arrays:
        dtype = getattr(torch, array["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"step {step}: array '{array['name']}' has "
                             f"dtype {array['dtype']}, which torch lacks")
        shape = [int(n) for n in array["shape"]]
        count = int(np.prod(shape, dtype=np.int64))
        raw = _aligned_bytes(count * dtype.itemsize)
        out[array["name"]] = torch.from_numpy(raw).view(dtype).reshape(shape)
        targets.append((array["name"], array["dtype"], shape,
                        [(-1, [0] * len(shape), shape, raw)]))
    read_regions(root, step, targets,
                 storage_options=options.get("storage_options"))
    return out
