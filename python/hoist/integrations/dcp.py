"""PyTorch Distributed Checkpoint (DCP) over hoist: a StorageWriter (also
DCP's AsyncStager, so dcp.async_save stages through hoist's pinned pool)
and a StorageReader.

    import hoist.dcp
    dcp.save(state, storage_writer=hoist.dcp.Writer("/ckpt", step))
    dcp.async_save(state, storage_writer=hoist.dcp.Writer("/ckpt", step),
                   process_group=dist.new_group(backend="gloo"))
    dcp.load(state, storage_reader=hoist.dcp.Reader("/ckpt"))

What DCP writes through them is an ordinary hoist step of ROOT: each
tensor an array named by its DCP key ("model.layers.0.weight"), a DTensor
with its global shape and every rank's box, a plain tensor taken to be the
same on every rank (as DCP takes it) and written once, in shares. Values
that are not tensors are serialized as DCP serializes them (torch.save)
and kept, per rank, in the step's metadata. The step's metadata for DCP
(Metadata: each tensor one chunk, its whole shape) is made from the
manifest on load, so DCP asks hoist for the boxes each rank needs and hoist
reads only the extents that overlap them: any world size, any sharding.
"""

import io
import os
import re

import torch
from torch.distributed.checkpoint import (
    Metadata,
    StorageReader,
    StorageWriter,
)
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import WriteResult

from .. import DataLossError
from .. import _per_rank
from .. import _torch_xla
from .._tree import (
    _Array,
    _aligned_bytes,
    _dtensor_array,
    _is_dtensor,
    _torch_array,
    _torch_dtype_name,
)
from . import _pickles
from ._managers import open_manager, root_key

__all__ = ["Writer", "Reader", "FORMAT_KEY"]

# The step's metadata says it was written through this adapter, and which
# version of its layout.
FORMAT_KEY = "hoist.dcp"

# A checkpoint_id: ROOT/NAME where NAME ends in the step number (hoist's
# "step_00000042", torchtitan's "step-42", or "42").
_STEP_AT_END = re.compile(r"(\d+)$")


def _root_and_step(checkpoint_id):
    """(root, step) of a checkpoint_id: ValueError when its last part does
    not end in a step number."""
    text = os.fspath(checkpoint_id).rstrip("/")
    root, _, name = text.rpartition("/")
    found = _STEP_AT_END.search(name)
    if not root or found is None:
        raise ValueError(
            f"checkpoint_id {text!r}: hoist takes ROOT/NAME where NAME ends "
            "in the step number (ROOT/step_00000042, ROOT/step-42, ROOT/42)")
    return root, int(found.group(1))


def _manager(root, manager, options):
    if manager is not None:
        if root is not None or options:
            raise ValueError("give a root (and manager options) or a "
                             "manager, not both")
        return manager
    if root is None:
        return None  # until reset(checkpoint_id) names it
    return open_manager(root, options)


class _Step:
    """What a Writer or Reader was pointed at: a manager (opened on its
    root) and a step; reset(checkpoint_id) may name both."""

    def __init__(self, root, step, manager, options):
        self._options = options
        self.manager = _manager(root, manager, options)
        self.step = step

    def reset(self, checkpoint_id):
        if checkpoint_id is None:
            return
        root, step = _root_and_step(checkpoint_id)
        if self.manager is None or \
                root_key(self.manager.path) == root_key(root):
            self.manager = self.manager or open_manager(root, self._options)
            self.step = step
            return
        raise ValueError(
            f"checkpoint_id {os.fspath(checkpoint_id)!r} is not in "
            f"{self.manager.path}, the root this writer or reader was given")

    def require(self, what):
        if self.manager is None:
            raise ValueError(f"{what}: no root: give Writer/Reader a root or "
                             "dcp a checkpoint_id (ROOT/step_N)")
        return self.manager


def _serialized(value):
    """A value that is not a tensor, as DCP writes it (torch.save)."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _arrays(state_dict, devices):
    """The engine's arrays for a DCP state dict (Stateful objects already
    turned into their state dicts), and its other values serialized:
    ([array], {key: bytes})."""
    flat, _ = flatten_state_dict(state_dict)
    arrays, values = [], {}
    xla = _torch_xla.Transfer()  # PyTorch/XLA tensors: batched, below
    for key, value in flat.items():
        if _is_dtensor(value):
            arrays.append(_dtensor_array(key, value, devices))
        elif isinstance(value, torch.Tensor):
            if type(value).__name__ == "ShardedTensor":
                raise TypeError(f"'{key}': ShardedTensor is not supported "
                                "(use DTensor: FSDP2, or FSDP1 with "
                                "SHARDED_STATE_DICT on DTensors)")
            if _torch_xla.is_xla(value):
                shards = []
                xla.add(key, value, shards, devices)
                arrays.append(_Array(key, _torch_dtype_name(value.dtype),
                                     tuple(value.shape), shards))
            else:
                arrays.append(_torch_array(key, value, devices))
        else:
            values[key] = _serialized(value)
    xla.run()
    return arrays, values


def _planner_state(planner):
    """The state dict DCP's save planner holds: DefaultSavePlanner's
    state_dict, or (torch_xla's SPMDSavePlanner) its unsharded values and
    the XLA tensors of its sharded ones."""
    state = getattr(planner, "state_dict", None)
    if state is not None:
        return state
    sharded = getattr(planner, "sharded_state_dict", None)
    if sharded is None:
        raise TypeError(f"hoist.dcp.Writer: {type(planner).__name__} holds "
                        "no state dict this writer knows")
    state = dict(getattr(planner, "unsharded_state_dict", {}))
    for key, value in sharded.items():
        tensor = getattr(value, "global_tensor", None)
        if tensor is None:  # torch_xla's CPU shards (its async path)
            raise TypeError(
                f"'{key}': {type(value).__name__} is not supported; save "
                "the XLA tensors themselves (dist_cp.save, or "
                "hoist.CheckpointManager)")
        state[key] = tensor
    return state


class Writer(StorageWriter, AsyncStager):
    """DCP's StorageWriter into step `step` of hoist root `root` (a
    directory, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX), or of `manager`
    (a hoist.CheckpointManager); other keyword arguments open the root's
    manager (hoist.CheckpointManager's: pool_bytes, keep, storage_options,
    local_root, ...) the first time a Writer or Reader names it in this
    process; later ones share it. Every rank constructs its Writer at the
    same point (opening a root is collective).

    dcp.save returns once the step is committed. dcp.async_save returns
    once every tensor is staged in hoist's pinned pool (the Writer is its
    stager: no second copy) and the training loop may change them; its
    future completes once the step is committed. A checkpoint_id given to
    dcp (ROOT/step_N) names the step instead (with async_save, give the
    step to the Writer: DCP names it only after staging)."""

    _synchronize_after_execute = False  # stage() returns once staged

    def __init__(self, root=None, step=None, *, manager=None, deltas=None,
                 **options):
        super().__init__()
        self._at = _Step(root, step, manager, options)
        self._deltas = deltas
        self._staged = None  # the SaveHandle stage() started

    # -- AsyncStager -------------------------------------------------------

    def stage(self, state_dict):
        """Copies the tensors of `state_dict` into the pinned pool and starts
        the save; returns `state_dict` (its tensors may change from now
        on; DCP plans from their shapes, and write_data waits for the
        save)."""
        self._staged = self._start(state_dict)
        return state_dict

    def synchronize_staging(self):
        """Nothing to wait for: stage() returns once staged."""

    def close(self):
        """Nothing to release (the root's manager is shared: see
        hoist.integrations.close_managers)."""

    # -- StorageWriter -----------------------------------------------------

    def reset(self, checkpoint_id=None):
        self._at.reset(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self._at.require("dcp.save")

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def write_data(self, plan, planner):
        """Saves the step (unless stage() started it) and waits for its
        commit: every rank's share written and hashed, the manifest
        committed by rank 0."""
        handle, self._staged = self._staged, None
        if handle is None:
            handle = self._start(_planner_state(planner))
        handle.wait()
        results = [WriteResult(index=item.index,
                               size_in_bytes=_item_bytes(item),
                               storage_data=None) for item in plan.items]
        future = torch.futures.Future()
        future.set_result(results)
        return future

    def finish(self, metadata, results):
        """Nothing left: the step was committed (rank 0 wrote its manifest
        once every rank's share was written)."""

    def storage_meta(self):
        return None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        try:
            _root_and_step(checkpoint_id)
        except (ValueError, TypeError):
            return False
        return True

    def _start(self, state_dict):
        """Starts saving `state_dict` as the step: returns once its tensors
        are staged."""
        manager = self._at.require("dcp.save")
        if self._at.step is None:
            raise ValueError(
                "hoist.dcp.Writer: no step (give Writer(root, step), or "
                "dcp.save a checkpoint_id ROOT/step_N)")
        arrays, values = _arrays(state_dict, manager._devices)
        return manager._save_arrays(
            self._at.step, arrays, {FORMAT_KEY: 1},
            per_rank=_per_rank.encode(values), deltas=self._deltas)


def _item_bytes(item):
    data = item.tensor_data
    if data is None:
        return 0
    return data.chunk.sizes.numel() * data.properties.dtype.itemsize


class Reader(StorageReader):
    """DCP's StorageReader of step `step` of hoist root `root` (default: the
    newest committed step; with a local tier, the newest either tier can
    rebuild), or of `manager`; other keyword arguments open the root's
    manager as Writer's do. Reads any hoist step, written through
    hoist.dcp or not (a `hoist import` of safetensors too: keys are array
    names), onto any world size and sharding: each rank reads only the
    boxes it needs.

    Values DCP serialized (torch.save) are handed to DCP's planner, which
    unpickles them, only when they hold plain data (what
    torch.load(weights_only=True) accepts: tensors, numbers, strings,
    containers); another object is refused with a ValueError naming it
    unless allow_pickle=True (for a checkpoint you trust)."""

    def __init__(self, root=None, step=None, *, manager=None,
                 allow_pickle=False, **options):
        super().__init__()
        self._at = _Step(root, step, manager, options)
        self._allow_pickle = allow_pickle
        # Of read_metadata: (the step asked for, the step chosen, its
        # manifest, what a restore of it needs, its serialized values).
        self._read = None

    def reset(self, checkpoint_id=None):
        self._at.reset(checkpoint_id)
        self._read = None

    def read_metadata(self, *args, **kwargs):
        """DCP's Metadata of the step: every array one chunk (its whole
        shape), every serialized value bytes."""
        manager = self._at.require("dcp.load")
        if self._read is None or self._read[0] != self._at.step:
            try:
                step, manifest, prepared = manager._prepare_restore(
                    self._at.step)
            except FileNotFoundError as error:
                raise FileNotFoundError(
                    f"hoist.dcp.Reader: {error.strerror or error} (a "
                    "checkpoint DCP's FileSystemWriter wrote is read with "
                    "dcp.FileSystemReader, or imported once with "
                    "hoist.import_checkpoint(src, root, step, "
                    "format='dcp'))") from None
            self._read = (self._at.step, step, manifest, prepared,
                          _values(manifest, step, manager.rank))
        _, step, manifest, _, values = self._read
        entries = {}
        for array in manifest["arrays"]:
            shape = torch.Size(array["shape"])
            entries[array["name"]] = TensorStorageMetadata(
                properties=TensorProperties(
                    dtype=_torch_dtype(array, step)),
                size=shape,
                chunks=[ChunkStorageMetadata(
                    offsets=torch.Size([0] * len(shape)), sizes=shape)])
        for key in values:
            entries.setdefault(key, BytesStorageMetadata())
        return Metadata(state_dict_metadata=entries)

    def set_up_storage_reader(self, metadata, is_coordinator, *args,
                              **kwargs):
        pass

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        """Reads every box of `plan` in one restore (hoist reads the
        extents that overlap them, in parallel), then hands DCP the
        serialized values. Every rank calls it (shared reads)."""
        manager = self._at.require("dcp.load")
        if self._read is None:
            self.read_metadata()
        _, step, manifest, prepared, values = self._read
        saved = {a["name"]: a for a in manifest["arrays"]}
        targets, copies, placed = {}, [], []
        for item in plan.items:
            name = item.storage_index.fqn
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, io.BytesIO(
                    self._checked(values, name, step)))
                continue
            array = saved[name]
            dest = planner.resolve_tensor(item).detach()
            extent = [int(n) for n in item.lengths]
            origin = [int(o) + int(s) for o, s in
                      zip(item.storage_index.offset or [0] * len(extent),
                          item.storage_offsets)]
            placed.append((item, dest))
            if 0 in extent:
                continue
            direct = (dest.device.type == "cpu" and dest.is_contiguous()
                      and _torch_dtype_name(dest.dtype) == array["dtype"])
            if direct:
                raw = dest.reshape(-1).view(torch.uint8)
            else:  # another dtype, layout or device: read, then copy
                raw = _aligned_bytes(dest.numel() *
                                     _torch_dtype(array, step).itemsize)
                copies.append((dest, raw, array, extent))
            targets.setdefault(name, (name, array["dtype"], array["shape"],
                                      []))[3].append((-1, origin, extent, raw))
        try:
            manager._restore_targets(step, prepared, targets.values())
        except DataLossError as error:
            raise DataLossError(f"step {step} of {manager.path}: {error}") \
                from None
        for dest, raw, array, extent in copies:
            dest.copy_(torch.from_numpy(raw).view(
                _torch_dtype(array, step)).reshape(extent))
        for item, dest in placed:
            planner.commit_tensor(item, dest)
        future = torch.futures.Future()
        future.set_result(None)
        return future

    def _checked(self, values, name, step):
        """The serialized value `name`, refused (ValueError) when it is not
        plain data and pickles were not allowed."""
        data = values[name]
        if not self._allow_pickle:
            _pickles.load(data, f"step {step}: '{name}'",
                          "pass allow_pickle=True to hoist.dcp.Reader")
        return data

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return Writer.validate_checkpoint_id(checkpoint_id)


def _torch_dtype(array, step):
    dtype = getattr(torch, array["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"step {step}: array '{array['name']}' has dtype "
                         f"{array['dtype']}, which torch does not have")
    return dtype


def _values(manifest, step, rank):
    """The serialized values of a step written through hoist.dcp: key ->
    bytes, each the one `rank` saved when it saved one (the same world
    size), else the lowest rank's that did."""
    meta = manifest.get("metadata") or {}
    if not isinstance(meta, dict) or FORMAT_KEY not in meta:
        return {}
    saved = meta.get("per_rank")
    if not isinstance(saved, list):
        raise DataLossError(f"step {step}: its metadata lacks the per-rank "
                            "values hoist.dcp saved")
    per_rank = [_per_rank.decode(node) for node in saved]
    values = {}
    for values_of_rank in reversed(per_rank):
        values.update(values_of_rank)
    if rank < len(per_rank):
        values.update(per_rank[rank])
    for key, value in values.items():
        if not isinstance(value, bytes):
            raise DataLossError(f"step {step}: value '{key}' is malformed")
    return values
