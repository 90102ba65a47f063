"""Pytrees to hoist's named arrays (the save side; _unflatten.py restores
them, _repeat.py plans repeat saves).

An array's name is its path in the tree, keys and indices joined by "/"
("model/layers/0/w"; a bare array is "array"). The tree's shape and its
non-array leaves are kept as a JSON skeleton in the manifest's metadata:
  {"d": [[key, node], ...]}  dict (keys: str or int, in order)
  {"n": [[key, node], ...]}  any other registered JAX pytree node (a
                             namedtuple, dataclass, TrainState, optax or nnx
                             State, ...): its children by key path name
  {"s": node}                a PyTorch-style object, by its state dict
  {"l": [node, ...]}         list
  {"t": [node, ...]}         tuple (named tuples come back as tuples)
  {"v": value}               int, float, str, bool or None
  {"f": "nan"|"inf"|"-inf"}  a float JSON cannot hold
  {"a": name, "k": kind}     an array; kind is numpy, torch or jax, or
                             jax_key (a typed PRNG key's key data) with
                             "i": the key implementation's name
"""

import contextlib
import functools
import gc
import math
import mmap
import sys
import weakref

import ml_dtypes
import numpy as np

from . import _hoist
from ._per_rank import PerRank, encode as encode_per_rank
from ._torch_xla import is_xla
from ._xla_staging import Staging, _device_of


_SCALARS = (bool, int, float, str, type(None))


def _module(name):
    return sys.modules.get(name)


def _is_jax(x):
    jax = _module("jax")
    return jax is not None and isinstance(x, jax.Array)


def _is_jax_struct(x):
    jax = _module("jax")
    return jax is not None and isinstance(x, jax.ShapeDtypeStruct)


def _is_torch(x):
    torch = _module("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _numpy_dtype(name):
    """numpy's dtype for a hoist dtype name (ml_dtypes for bfloat16 and
    float8)."""
    return np.dtype(getattr(ml_dtypes, name, None) or name)


def _torch_dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


# Restored arrays are allocated by hoist itself, aligned so that the engine
# reads their bytes straight from the file into them (O_DIRECT wants 4 KiB
# alignment) and JAX's CPU client adopts them without a copy (64 bytes).
_DIRECT_ALIGNMENT = 4096
_DIRECT_MIN_BYTES = 64 << 10  # smaller arrays: 64-byte alignment, no waste
_ZERO_COPY_ALIGNMENT = 64


# Arrays of at least a huge page are mapped on their own, 2 MiB-aligned,
# and their whole 2 MiB blocks advised for transparent huge pages: where the
# kernel grants them (THP "madvise" or "always"), first touch costs one fault
# per 2 MiB instead of 512, and a direct read pins a few large pages instead
# of many small ones (on this project's VM, warm: 1.5-2x faster reads,
# bench/results/disk-limit-2026-12-02.txt). Not in a VM whose host discards
# freed memory, where huge pages cost more (the engine's advise_huge_pages,
# include/hoist/huge_pages.h). The tail past the last whole block keeps
# small pages, so no array holds more memory than its bytes.
# Each such array is a mapping (two or three with the advice) and a process
# may hold only vm.max_map_count (65,530 by default): past _MAX_HUGE_MAPPINGS
# live ones, or when a mapping fails, arrays come from NumPy's allocator.
_HUGE_PAGE = 2 << 20
_HUGE_PAGES = (hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MAP_PRIVATE")
               and hasattr(mmap, "MAP_ANONYMOUS") and
               _hoist.advise_huge_pages())
_MAX_HUGE_MAPPINGS = 8192
_huge_mappings = [0]  # live ones (a soft limit: updated without a lock)


def _unmapped():
    _huge_mappings[0] -= 1


def _huge_page_bytes(nbytes):
    """A 2 MiB-aligned array of `nbytes` advised for huge pages, or None."""
    if _huge_mappings[0] >= _MAX_HUGE_MAPPINGS:
        return None
    size = nbytes + _HUGE_PAGE
    try:
        memory = mmap.mmap(-1, size,
                           flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:
        return None
    raw = np.frombuffer(memory, np.uint8)  # keeps the mapping alive
    _huge_mappings[0] += 1
    weakref.finalize(raw, _unmapped)
    start = -raw.ctypes.data % _HUGE_PAGE
    try:
        memory.madvise(mmap.MADV_HUGEPAGE, start,
                       nbytes // _HUGE_PAGE * _HUGE_PAGE)
    except OSError:
        pass  # advice only: a kernel without THP keeps small pages
    return raw[start:start + nbytes]


def _aligned_bytes(nbytes):
    """A new uint8 array of `nbytes` whose data is aligned for direct
    reads (2 MiB and advised for huge pages from 2 MiB on; else 4 KiB, or
    64 bytes for small arrays)."""
    if _HUGE_PAGES and nbytes >= _HUGE_PAGE:
        huge = _huge_page_bytes(nbytes)
        if huge is not None:
            return huge
    align = (_DIRECT_ALIGNMENT if nbytes >= _DIRECT_MIN_BYTES else
             _ZERO_COPY_ALIGNMENT)
    raw = np.empty(nbytes + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + nbytes]


def _aligned_empty(shape, dtype):
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return _aligned_bytes(nbytes).view(dtype).reshape(shape)


def _bytes_of_numpy(a):
    """A flat uint8 view of `a`'s memory (copied first if not contiguous)."""
    if a.dtype.kind == "O":
        raise TypeError("object arrays cannot be saved")
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8)


def _Array(name, dtype, shape, shards):
    """One array to save, in the engine's terms: (name, dtype, shape,
    [(device, origin, shape, data or None)])."""
    return (name, dtype, list(shape), shards)


def _whole(shape):
    return [0] * len(shape), list(shape)


_DTYPE_NAMES = {}  # numpy dtype -> its name (dtype.name is Python code)


def _dtype_name(dtype):
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


class Devices:
    """Where this process's arrays live, in the engine's device ids.

    kind:       the manager's backend, "host" or "cuda".
    default:    this process's first device: where host arrays are.
    processes:  every process's first device, by rank. An array that is not
                sharded (a NumPy array, a plain tensor) is taken to be the
                same on every process and saved once, each process writing
                a share of it.
    rank:       this process's rank.
    cuda:       CUDA ordinal -> device id, for tensors on GPUs.
    """

    def __init__(self, kind, default, processes=None, rank=0, cuda=None):
        self.kind, self.default, self.rank = kind, default, rank
        self.processes = processes or [default]
        self.cuda = cuda or {}

    def replicated(self, device, origin, shape, data):
        """The shards of an array that every process holds whole: this
        process's with its data, the others' without."""
        if len(self.processes) == 1:
            return [(device, origin, shape, data)]
        return [(d, origin, shape, data if p == self.rank else None)
                for p, d in enumerate(self.processes)]

    def of_tensor(self, name, t):
        """The device id of torch tensor `t`'s memory."""
        if t.device.type == "cpu":
            return self.default
        if t.device.type == "cuda":
            if self.kind != "cuda":
                raise ValueError(
                    f"array '{name}' is on {t.device} but the manager's "
                    "backend is 'host' (use backend='cuda')")
            device = self.cuda.get(t.device.index)
            if device is None:
                raise ValueError(
                    f"array '{name}' is on {t.device}, which this manager "
                    f"does not drive (CUDA devices {sorted(self.cuda)})")
            return device
        raise ValueError(f"array '{name}': tensors on {t.device} are not "
                         "supported")


def _numpy_array(name, a, devices):
    """A NumPy array, as the engine takes it: its own buffer when dense (the
    engine reads any dtype), else a dense copy."""
    if a.dtype.kind == "O":
        raise TypeError("object arrays cannot be saved")
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    shape = list(a.shape)
    # NumPy's own dtypes cross as they are; others (ml_dtypes' bfloat16,
    # float8) as their bytes, which the engine takes as well.
    data = a if a.dtype.isbuiltin == 1 else a.reshape(-1).view(np.uint8)
    return (name, _dtype_name(a.dtype), shape,
            devices.replicated(devices.default, [0] * len(shape), shape,
                               data))


def _tensor_bytes(t):
    """A flat uint8 view of tensor `t` (made contiguous first)."""
    torch = _module("torch")
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _dispatch_of(kind):
    method = kind.__torch_dispatch__
    return getattr(method, "__func__", method)


def _plain(name, t):
    """Torch tensor `t` as a plain tensor holding its elements as they
    are: `t` itself, or the one inner tensor of a wrapper subclass that
    keeps its values in one tensor of its own shape and dtype (torchao's
    FSDP2 float8 weight wrapper keeps the high-precision weight). Any
    other tensor subclass that makes its own data (a float8 tensor and its
    scale, TransformerEngine's Float8Tensor) is refused, naming the array
    and the type: its bytes are not its elements, and hoist never saves a
    wrapper's uninitialized or outer storage."""
    torch = _module("torch")
    kind = type(t)
    if _dispatch_of(kind) is _dispatch_of(torch.Tensor):
        return t
    flatten = getattr(t, "__tensor_flatten__", None)
    inner = flatten()[0] if flatten is not None else []
    if len(inner) == 1:
        held = getattr(t, inner[0])
        if isinstance(held, torch.Tensor) and held.dtype == t.dtype and \
                held.shape == t.shape:
            return _plain(name, held)
    what = (f"its tensors {', '.join(inner)}" if inner else
            "no tensors hoist can read (no __tensor_flatten__)")
    raise TypeError(
        f"array '{name}' is a {kind.__module__}.{kind.__qualname__}, a "
        f"tensor subclass whose data is not its {t.dtype} elements "
        f"({what}); hoist saves plain tensors and DTensors of them: save "
        "its high-precision form instead (for a float8 tensor, "
        "t.to(orig_dtype) or its dequantized value, with the scale as an "
        "array of its own)")


def _torch_array(name, t, devices):
    t = _plain(name, t)
    device = devices.of_tensor(name, t)
    origin, shape = _whole(t.shape)
    return _Array(name, _torch_dtype_name(t.dtype), tuple(t.shape),
                  devices.replicated(device, origin, shape, _tensor_bytes(t)))


def _is_dtensor(x):
    """A torch.distributed DTensor (its module imported only if torch's
    distributed tensors are in use)."""
    module = _module("torch.distributed.tensor")
    dtensor = getattr(module, "DTensor", None) if module is not None else None
    return dtensor is not None and isinstance(x, dtensor)


def _dtensor_boxes(name, shape, mesh, placements):
    """global rank -> (origin, shape) of its shard of a DTensor of `shape`
    on `mesh` with `placements`, by torch's rule: mesh dimensions in order,
    each Shard(d) splitting the box so far along d into chunks of
    ceil(n / k) (the last ones shorter or empty, as torch.chunk). Computed
    once per (shape, mesh, placements): a training loop saves the same
    layouts every time. The result is shared; callers only read it."""
    try:
        return _dtensor_layout(tuple(shape), mesh, tuple(placements))
    except ValueError as error:
        raise ValueError(f"array '{name}': {error}") from None


@functools.lru_cache(maxsize=4096)
def _dtensor_layout(shape, mesh, placements):
    ranks = mesh.mesh.reshape(-1).tolist()
    mesh_shape = tuple(mesh.mesh.shape)
    for placement in placements:
        kind = type(placement).__name__
        if kind == "Partial":
            raise ValueError(
                "a DTensor with a Partial placement holds unreduced values; "
                "redistribute it to Shard or Replicate before saving")
        if kind not in ("Shard", "Replicate"):
            raise ValueError(f"DTensor placement {placement} is not "
                             "supported (Shard and Replicate are)")
    boxes = {}
    for rank, coordinate in zip(ranks, np.ndindex(*mesh_shape)):
        origin, extent = [0] * len(shape), list(shape)
        for axis, placement in enumerate(placements):
            if type(placement).__name__ != "Shard":
                continue
            dim, parts = placement.dim, mesh_shape[axis]
            chunk = -(-extent[dim] // parts)
            start = min(coordinate[axis] * chunk, extent[dim])
            stop = min(start + chunk, extent[dim])
            origin[dim] += start
            extent[dim] = stop - start
        boxes[rank] = (origin, extent)
    return boxes


def _dtensor_array(name, x, devices):
    """A DTensor's global sharding, every shard on the device of the rank
    that holds it (ranks whose shard is empty hold nothing), and this
    rank's local shard."""
    torch = _module("torch")
    boxes = _dtensor_boxes(name, tuple(x.shape), x.device_mesh, x.placements)
    rank = torch.distributed.get_rank()
    local = _plain(name, x.to_local())
    if rank in boxes and list(local.shape) != boxes[rank][1]:
        raise ValueError(
            f"array '{name}': this rank's shard has shape "
            f"{tuple(local.shape)} but its placements {x.placements} give "
            f"{tuple(boxes[rank][1])}")
    device = devices.of_tensor(name, local)
    shards = []
    for holder, (origin, extent) in boxes.items():
        if 0 in extent:
            continue
        if holder == rank:
            shards.append((device, origin, extent, _tensor_bytes(local)))
        else:
            shards.append((devices.processes[holder], origin, extent, None))
    return _Array(name, _torch_dtype_name(x.dtype), tuple(x.shape), shards)


def _box_of(index, shape):
    """(origin, shape) of a tuple of slices into an array of `shape`."""
    origin, extent = [], []
    for s, n in zip(index, shape):
        start, stop, step = s.indices(n)
        if step != 1:
            raise ValueError("strided shard indices are not supported")
        origin.append(start)
        extent.append(stop - start)
    return origin, extent


def _jax_layout(x):
    """(kind, layout): how the shards of JAX array `x` lie in memory.
    "row-major" (of whole bytes): as the engine reads them, so DLPack
    describes them as C-contiguous and their addresses can go to the engine
    as they are (a repeat save's way: 1.1 us a shard, against 3.9 us for a
    DLPack capsule here). "other" (a layout asked for with
    jax.experimental.layout): their bytes are copied into row-major order
    first. None where this JAX does not say (no Array.format): DLPack
    decides."""
    layout = getattr(getattr(x, "format", None), "layout", None)
    try:
        row_major = (tuple(layout.major_to_minor) == tuple(range(x.ndim))
                     and not layout.tiling and
                     not layout.sub_byte_element_size_in_bits)
    except (AttributeError, TypeError):
        return None, None
    return ("row-major" if row_major else "other"), layout


def _jax_global_array(name, x, staging):
    """An array with shards on other processes: every device's box (each
    process plans the whole save), data for this process's."""
    local = {s.device: s.data for s in x.addressable_shards}
    kind = _jax_layout(x)[0]
    whole = staging.takes(x, kind)
    shards = []
    for device, index in x.sharding.devices_indices_map(x.shape).items():
        origin, shape = _box_of(index, x.shape)
        data = local.get(device)
        if data is None:
            shards.append((device.id, origin, shape, None))
        else:
            _take(staging, name, (whole, kind), shards, device.id, origin,
                  shape, data)
    return _Array(name, np.dtype(x.dtype).name, x.shape, shards)


def _take(staging, name, how, shards, device, origin, shape, data):
    """Appends local shard `data` of array `name` to `shards` as the engine
    takes it: by DLPack, or (where `how`, (whole, layout kind), says whole,
    or where DLPack refuses it) through the save's PJRT staging
    (_xla_staging.py), which fills it in."""
    position = len(shards)
    whole, kind = how

    def place(taken):
        shards[position] = (device, origin, shape, taken)

    if whole:
        staging.add(name, data, place, device, kind == "row-major")
        taken = None
    else:
        taken = staging.capsule_or_add(name, data, place, device,
                                       kind == "row-major")
    shards.append((device, origin, shape, taken))


def _jax_shards(x, replicated):
    """The per-device arrays of JAX array `x` this process holds: each
    device's own for a replicated array, else its shards in the sharding's
    order. (The per-device list rather than x.addressable_shards, which
    builds a Shard object per device and costs 2.5x more on every new array
    (a training loop makes new ones each step); addressable_data gives one
    array for all devices of a fully replicated array, so those, usually
    small, take the slow path.)"""
    if replicated:
        return [s.data for s in x.addressable_shards]
    shards = getattr(x, "_arrays", None)  # one call, not one per shard
    if shards is None:
        shards = [x.addressable_data(i)
                  for i in range(len(x.addressable_shards))]
    return shards


def _jax_array(name, x, staging):
    if not x.is_fully_addressable:
        return _jax_global_array(name, x, staging)
    if x.is_fully_replicated:
        per_device = [(s.device, s.index, s.data) for s in x.addressable_shards]
    else:
        index_of = x.sharding.addressable_devices_indices_map(x.shape)
        per_device = []
        for data in _jax_shards(x, False):
            device = _device_of(data)
            per_device.append((device, index_of[device], data))
    kind = _jax_layout(x)[0]
    how = (staging.takes(x, kind), kind)
    shards = []
    for device, index, data in per_device:
        origin, shape = _box_of(index, x.shape)
        _take(staging, name, how, shards, device.id, origin, shape, data)
    return _Array(name, np.dtype(x.dtype).name, x.shape, shards)


def _encode_float(value):
    if math.isfinite(value):
        return {"v": value}
    return {"f": "nan" if math.isnan(value) else ("inf" if value > 0 else
                                                   "-inf")}


def _scalar_node(x):
    """The skeleton node of scalar leaf `x` (one of _SCALARS)."""
    return _encode_float(x) if isinstance(x, float) else {"v": x}


def _is_stateful(x):
    """A PyTorch-style stateful object: a module, optimizer, LR scheduler,
    GradScaler or user class with state_dict() and load_state_dict()."""
    return (not _is_torch(x) and callable(getattr(x, "state_dict", None))
            and callable(getattr(x, "load_state_dict", None)))


def _key_name(key):
    """A path component for one of JAX's key path entries."""
    for attribute in ("key", "name", "idx"):  # DictKey/FlattenedIndexKey,
        if hasattr(key, attribute):          # GetAttrKey, SequenceKey
            return str(getattr(key, attribute))
    return str(key)


def _jax_children(x):
    """(names, children, treedef) of a registered JAX pytree node one level
    down (namedtuples, dataclasses, flax structs and States, optax states,
    equinox modules, user-registered classes), or None when JAX is not
    imported or `x` is not a node. The treedef keeps the node's type and
    static fields, so treedef.unflatten(children) rebuilds it."""
    jax = _module("jax")
    if jax is None or x is None or isinstance(x, jax.Array):
        return None
    flat, treedef = jax.tree_util.tree_flatten_with_path(
        x, is_leaf=lambda y: y is not x)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:  # a leaf
        return None
    return ([_key_name(path[-1]) for path, _ in flat],
            [child for _, child in flat], treedef)


def _is_key_array(x):
    jax = _module("jax")
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


@contextlib.contextmanager
def gc_paused():
    """Pauses Python's cyclic garbage collector: a save or restore of many
    arrays makes many objects, which would set it scanning the whole heap
    again and again (a third of the time at 10,000 arrays)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def flatten(tree, devices, staging=None):
    """(arrays, skeleton, per_rank) of `tree`; `devices` (Devices) says
    where its arrays are; per_rank: the encoded values of its PerRank
    leaves, in order (a skeleton node {"r": i} stands for the i-th).
    `staging` (an _xla_staging.Staging; default: a new one, "auto") takes
    the JAX shards the engine cannot read by address, all in one transfer
    once the tree is walked."""
    if staging is None:
        staging = Staging("auto", devices.kind)
    with gc_paused():
        flat = _flatten(tree, devices, staging)
        staging.run()
        return flat


def _flatten(tree, devices, staging):
    arrays = []
    per_rank = []
    names = set()
    jax, torch = _module("jax"), _module("torch")
    jax_array = jax.Array if jax is not None else ()
    torch_tensor = torch.Tensor if torch is not None else ()
    ndarray = np.ndarray

    # Paths are names as they grow ("model/layers/0/w"; "" for the root),
    # not lists joined per leaf: a save of 100,000 arrays walks each once.
    def child(path, key):
        return f"{path}/{key}" if path else str(key)

    def named(path):
        """The array name of `path`, unique in the state."""
        name = path or "array"
        if name in names:
            raise ValueError(f"two arrays are named '{name}'")
        names.add(name)
        return name

    def numpy_leaf(x, path):
        name = named(path)
        arrays.append(_numpy_array(name, x, devices))
        return {"a": name, "k": "numpy"}

    def array(x, path):
        """The skeleton node of array `x`, recorded in `arrays`."""
        if isinstance(x, ndarray):
            return numpy_leaf(x, path)
        name = named(path)
        if isinstance(x, jax_array):
            if x.is_deleted():
                raise ValueError(
                    f"array '{name}' was deleted (donated to a jitted step?) "
                    "before this save; nothing of it was saved")
            if _is_key_array(x):  # a typed PRNG key: its key data
                arrays.append(
                    _jax_array(name, jax.random.key_data(x), staging))
                return {"a": name, "k": "jax_key",
                        "i": str(jax.random.key_impl(x))}
            arrays.append(_jax_array(name, x, staging))
            return {"a": name, "k": "jax"}
        if _is_dtensor(x):
            arrays.append(_dtensor_array(name, x, devices))
        elif is_xla(x):  # its shards once staging has run (_torch_xla.py)
            shards = []
            staging.xla.add(name, x, shards, devices)
            arrays.append(_Array(name, _torch_dtype_name(x.dtype),
                                 tuple(x.shape), shards))
        else:
            arrays.append(_torch_array(name, x, devices))
        return {"a": name, "k": "torch"}

    def walk(x, path):
        kind = type(x)
        if kind is ndarray:  # the commonest leaf first
            return numpy_leaf(x, path)
        if kind is dict or (isinstance(x, dict) and _jax_children(x) is None):
            items = []
            for key, value in x.items():
                if type(key) is not str and (isinstance(key, bool) or
                                             not isinstance(key, (str, int))):
                    raise TypeError(f"{path or 'the state'}: key {key!r} is "
                                    "not a str or int")
                name = child(path, key)
                # NumPy leaves, the commonest, without a walk() call each.
                items.append([key, numpy_leaf(value, name)
                              if type(value) is ndarray else walk(value, name)])
            return {"d": items}
        if kind is tuple:
            return {"t": [walk(v, child(path, i)) for i, v in enumerate(x)]}
        if kind is list:
            return {"l": [walk(v, child(path, i)) for i, v in enumerate(x)]}
        if isinstance(x, (ndarray, jax_array, torch_tensor)):
            return array(x, path)
        if isinstance(x, _SCALARS):
            return _scalar_node(x)
        if isinstance(x, PerRank):  # into the metadata, per rank
            per_rank.append(encode_per_rank(x.value, path or "the state"))
            return {"r": len(per_rank) - 1}
        if _is_stateful(x):  # saved as its state dict, under its path
            return {"s": walk(x.state_dict(), path)}
        node = _jax_children(x)
        if node is not None:  # any registered JAX pytree node
            keys, children, _ = node
            return {"n": [[k, walk(c, child(path, k))]
                          for k, c in zip(keys, children)]}
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            # A namedtuple, JAX not imported: named by field, as JAX's
            # key paths name it.
            return {"n": [[f, walk(getattr(x, f), child(path, f))]
                          for f in x._fields]}
        if isinstance(x, tuple):
            return {"t": [walk(v, child(path, i)) for i, v in enumerate(x)]}
        if isinstance(x, list):
            return {"l": [walk(v, child(path, i)) for i, v in enumerate(x)]}
        if isinstance(x, np.generic):
            return array(np.asarray(x), path)
        if hasattr(x, "__dlpack__"):
            return array(np.from_dlpack(x), path)
        raise TypeError(
            f"{path or 'the state'}: cannot save a {type(x).__name__} (save "
            "arrays, dicts, lists, tuples, registered JAX pytrees, objects "
            "with state_dict()/load_state_dict(), and int/float/str/bool/None "
            "leaves)")

    skeleton = walk(tree, "")
    return arrays, skeleton, per_rank
