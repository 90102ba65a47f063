"""Pytrees to hoist's named arrays and back.

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
import sys

import ml_dtypes
import numpy as np

from ._errors import DataLossError

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


# JAX CPU devices: restore shards in host memory and adopt them (True), or
# stage them through the pool and device_put them as for GPUs (False; tests
# switch to it to cover that path on CPU).
_JAX_IN_HOST = True


def _aligned_bytes(nbytes):
    """A new uint8 array of `nbytes` whose data is aligned for direct
    reads (4 KiB; 64 bytes for small arrays)."""
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


def _torch_array(name, t, devices):
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
    local = x.to_local()
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


def _jax_capsule(data):
    try:
        return data.__dlpack__()  # zero copy
    except Exception:  # a dtype DLPack cannot carry (float8): bytes
        return _bytes_of_numpy(np.asarray(data))


def _jax_global_array(name, x):
    """An array with shards on other processes: every device's box (each
    process plans the whole save), data for this process's."""
    local = {s.device: s.data for s in x.addressable_shards}
    shards = []
    for device, index in x.sharding.devices_indices_map(x.shape).items():
        origin, shape = _box_of(index, x.shape)
        data = local.get(device)
        shards.append((device.id, origin, shape,
                       None if data is None else _jax_capsule(data)))
    return _Array(name, np.dtype(x.dtype).name, x.shape, shards)


def _jax_array(name, x):
    if not x.is_fully_addressable:
        return _jax_global_array(name, x)
    # The per-device arrays and the sharding's index map rather than
    # x.addressable_shards, which builds a Shard object per device and costs
    # 2.5x more on every new array (a training loop makes new ones each step).
    # (addressable_data gives one array for all devices of a fully
    # replicated array, so those, usually small, take the slow path.)
    if x.is_fully_replicated:
        per_device = [(s.device, s.index, s.data) for s in x.addressable_shards]
    else:
        index_of = x.sharding.addressable_devices_indices_map(x.shape)
        per_device = []
        for i in range(len(index_of)):
            data = x.addressable_data(i)
            device = getattr(data, "device", None)
            if device is None or callable(device):  # older JAX
                (device,) = data.devices()
            per_device.append((device, index_of[device], data))
    shards = []
    for device, index, data in per_device:
        origin, shape = _box_of(index, x.shape)
        shards.append((device.id, origin, shape, _jax_capsule(data)))
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


# A repeat save of the same structure. A training loop saves the same state
# again and again: the same dicts, the same arrays' names, dtypes and
# shapes, new values. save() keeps a plan of the last state it flattened
# (fast_plan) and checks the next one against it (match), collecting its
# arrays without naming or describing them again; the engine reuses the
# last save's arrays with the new data. Plans cover dicts (with str or int
# keys), NumPy arrays of NumPy's own dtypes that need no copy, and scalar
# leaves (whose changed values are written into the tree's metadata);
# anything else takes the full walk.
_DICT, _ARRAY, _SCALAR = 0, 1, 2
_SCALAR_TYPES = frozenset(_SCALARS)


def fast_plan(skeleton, arrays):
    """The plan of a flattened state (its skeleton and arrays, as flatten
    returned them), or None when it has nodes a plan does not cover."""
    leaves = iter(arrays)

    def leaf(node):
        if node.get("k") != "numpy":
            return None
        shards = next(leaves)[3]
        data = [d for _, _, _, d in shards if d is not None]
        if (len(data) != 1 or type(data[0]) is not np.ndarray or
                data[0].dtype.isbuiltin != 1):
            return None
        return (_ARRAY, data[0].dtype, data[0].shape)

    def build(node):
        if "d" not in node:
            return None
        keys, kids = [], []
        for pair in node["d"]:
            key, kid = pair
            if "d" in kid:
                plan = build(kid)
            elif "a" in kid:
                plan = leaf(kid)
            elif "v" in kid or "f" in kid:
                value = kid["v"] if "v" in kid else float(kid["f"])
                if type(value) not in _SCALAR_TYPES:
                    return None
                # Patched in place when the value changes.
                plan = [_SCALAR, pair, type(value), value]
            else:
                plan = None
            if plan is None:
                return None
            keys.append(key)
            kids.append(plan)
        keys = tuple(keys)
        types = (None if all(type(k) is str for k in keys)
                 else tuple(type(k) for k in keys))
        return (_DICT, keys, types, kids)

    try:
        return build(skeleton)
    except StopIteration:
        return None


def match(state, plan):
    """(arrays, changed) when `state` has the structure `plan` was made
    from: its arrays in the order flatten gives them, and whether a scalar
    leaf changed (the plan's skeleton then holds the new value). None when
    the structure differs anywhere; the skeleton may then hold new scalar
    values, and the plan must be rebuilt."""
    arrays = []
    changed = False
    ndarray = np.ndarray

    def walk(x, node):
        nonlocal changed
        _, keys, types, kids = node
        if type(x) is not dict or len(x) != len(keys) or tuple(x) != keys:
            return False
        if types is not None and tuple(map(type, x)) != types:
            return False
        for value, kid in zip(x.values(), kids):
            tag = kid[0]
            if tag == _ARRAY:
                if (type(value) is not ndarray or value.shape != kid[2] or
                        (value.dtype is not kid[1] and value.dtype != kid[1])
                        or not value.flags.c_contiguous):
                    return False
                arrays.append(value)
            elif tag == _DICT:
                if not walk(value, kid):
                    return False
            else:
                kind = type(value)
                if kind is not kid[2] or not value == kid[3]:
                    if kind not in _SCALAR_TYPES:
                        return False
                    kid[1][1] = _scalar_node(value)
                    kid[2], kid[3] = kind, value
                    changed = True
        return True

    with gc_paused():
        return (arrays, changed) if walk(state, plan) else None


def flatten(tree, devices):
    """(arrays, skeleton) of `tree`; `devices` (Devices) says where its
    arrays are."""
    with gc_paused():
        return _flatten(tree, devices)


def _flatten(tree, devices):
    arrays = []
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
            if _is_key_array(x):  # a typed PRNG key: its key data
                arrays.append(_jax_array(name, jax.random.key_data(x)))
                return {"a": name, "k": "jax_key",
                        "i": str(jax.random.key_impl(x))}
            arrays.append(_jax_array(name, x))
            return {"a": name, "k": "jax"}
        if _is_dtensor(x):
            arrays.append(_dtensor_array(name, x, devices))
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

    return arrays, walk(tree, "")


# -- restoring ---------------------------------------------------------------


class _Pending:
    """A leaf whose value exists once the engine has restored the step."""

    def __init__(self, finish):
        self.finish = finish


class _Targets:
    """The engine's restore targets, built leaf by leaf."""

    def __init__(self, manifest):
        self.saved = {a["name"]: a for a in manifest["arrays"]}
        self.list = []
        # Shards on JAX devices outside host memory (GPUs) are not filled in
        # place (JAX arrays are immutable): the engine stages each box in its
        # pinned pool and hands it to receive(), which puts it on its device.
        # Token t names box received_meta[t - 1].
        self.received_list = []
        self.received_meta = []
        self.placed = {}
        # (buffer, device) of every JAX shard restored in host memory, and
        # the device arrays adopting them once restored.
        self.adopted = []
        self.adopted_arrays = []
        self.partial = {}  # token -> [bytes, bytes received] of a parted shard
        self.missing = []     # names the template asks for, not saved
        self.mismatched = []  # dtype or shape differences, described

    def saved_array(self, name):
        """The manifest's entry for `name`, or None (recorded: every
        missing array is reported at once, by raise_mismatches)."""
        saved = self.saved.get(name)
        if saved is None:
            self.missing.append(name)
        return saved

    def matches(self, name, saved, dtype_name, shape):
        """Whether the template's dtype and shape are the checkpoint's;
        records the difference when not."""
        if saved["dtype"] == dtype_name and list(saved["shape"]) == list(shape):
            return True
        self.mismatched.append(
            f"'{name}': requested {dtype_name} {tuple(shape)} but the "
            f"checkpoint holds {saved['dtype']} {tuple(saved['shape'])}")
        return False

    def raise_mismatches(self):
        """KeyError listing every array the template asks for that the
        checkpoint lacks, else ValueError listing every dtype or shape that
        differs; before anything is read."""
        def listed(items):
            shown = ", ".join(items[:20])
            return shown + (f", ... ({len(items) - 20} more)"
                            if len(items) > 20 else "")
        if self.missing:
            if len(self.missing) == 1:
                raise KeyError(f"array '{self.missing[0]}' is not in the "
                               f"checkpoint (it has {len(self.saved)} arrays)")
            raise KeyError(
                f"{len(self.missing)} arrays are not in the checkpoint (it has "
                f"{len(self.saved)} arrays): "
                f"{listed([repr(m) for m in self.missing])}")
        if self.mismatched:
            raise ValueError(
                f"the template differs from the checkpoint at "
                f"{len(self.mismatched)} arrays: {listed(self.mismatched)}")

    def numpy(self, name, dtype_name=None, shape=None):
        saved = self.saved_array(name)
        if saved is None:
            return None
        dtype_name = dtype_name or saved["dtype"]
        shape = list(saved["shape"] if shape is None else shape)
        if not self.matches(name, saved, dtype_name, shape):
            return None
        dtype = _numpy_dtype(dtype_name)
        raw = _aligned_bytes(math.prod(shape) * dtype.itemsize)
        origin, extent = _whole(shape)
        self.list.append((name, dtype_name, shape,
                          [(-1, origin, extent, raw)]))
        return raw.view(dtype).reshape(shape)

    def torch(self, name, like=None):
        torch = _module("torch")
        if torch is None:
            return _Pending(lambda out=self.numpy(name): out)
        saved = self.saved_array(name)
        if saved is None:
            return None
        dtype = like.dtype if like is not None else getattr(torch,
                                                             saved["dtype"])
        shape = list(like.shape) if like is not None else saved["shape"]
        if not self.matches(name, saved, _torch_dtype_name(dtype), shape):
            return None
        # An aligned NumPy buffer the tensor owns (torch.empty's 64-byte
        # alignment would make every read go through the page cache).
        raw = _aligned_bytes(math.prod(shape) * dtype.itemsize)
        out = torch.from_numpy(raw).view(dtype).reshape(shape)
        origin, extent = _whole(shape)
        self.list.append((name, _torch_dtype_name(dtype), shape,
                          [(-1, origin, extent, raw)]))
        device = like.device if like is not None else None
        if device is not None and device.type != "cpu":
            return _Pending(lambda: out.to(device))
        return _Pending(lambda: out)

    def dtensor(self, name, like):
        """This rank's shard of a DTensor shaped like `like` (its mesh and
        placements, any world size), read alone, then wrapped."""
        torch = _module("torch")
        saved = self.saved_array(name)
        if saved is None:
            return None
        dtype, shape = like.dtype, list(like.shape)
        if not self.matches(name, saved, _torch_dtype_name(dtype), shape):
            return None
        mesh, placements = like.device_mesh, like.placements
        boxes = _dtensor_boxes(name, tuple(shape), mesh, placements)
        origin, extent = boxes.get(torch.distributed.get_rank(),
                                   ([0] * len(shape), [0] * len(shape)))
        raw = _aligned_bytes(math.prod(extent) * dtype.itemsize)
        local = torch.from_numpy(raw).view(dtype).reshape(extent)
        if 0 not in extent:
            self.list.append((name, _torch_dtype_name(dtype), shape,
                              [(-1, origin, extent, raw)]))
        device = like.to_local().device

        def finish():
            return torch.distributed.tensor.DTensor.from_local(
                local.to(device), mesh, placements, run_check=False,
                shape=like.shape, stride=like.stride())

        return _Pending(finish)

    def jax(self, name, like=None):
        jax = _module("jax")
        saved = self.saved_array(name)
        if saved is None:
            return None
        if like is None:  # on the default device
            like = jax.ShapeDtypeStruct(
                tuple(saved["shape"]), _numpy_dtype(saved["dtype"]),
                sharding=jax.sharding.SingleDeviceSharding(
                    jax.local_devices()[0]))
        shape = tuple(like.shape)
        dtype = np.dtype(like.dtype)
        if not self.matches(name, saved, dtype.name, shape):
            return None
        sharding = getattr(like, "sharding", None)
        if sharding is None:
            sharding = jax.sharding.SingleDeviceSharding(
                jax.local_devices()[0])
        index_of = sharding.addressable_devices_indices_map(shape)
        if _JAX_IN_HOST and all(d.platform == "cpu" for d in index_of):
            return self._jax_in_host(name, shape, dtype, sharding, index_of)
        dests, tokens = [], []
        for device, index in index_of.items():
            origin, extent = _box_of(index, shape)
            token = len(self.received_meta) + 1
            self.received_meta.append((dtype, tuple(extent), device))
            tokens.append(token)
            if 0 in extent:  # nothing to read: an empty shard
                self.placed[token] = jax.device_put(
                    np.empty(extent, dtype), device)
            else:
                dests.append((origin, extent, token))
        self.received_list.append((name, dtype.name, list(shape), dests))

        def finish():
            return jax.make_array_from_single_device_arrays(
                shape, sharding, [self.placed[t] for t in tokens])

        return _Pending(finish)

    def jax_key(self, name, impl, like=None):
        """A typed PRNG key array, restored from its saved key data (uint32,
        the key's shape plus the implementation's) with `like`'s sharding
        (the same sharding serves the key data: its trailing axis is
        replicated)."""
        jax = _module("jax")
        saved = self.saved_array(name)
        if saved is None:
            return None
        if impl is None:
            self.mismatched.append(f"'{name}': saved without its PRNG key "
                                   "implementation")
            return None
        data_like = None
        if like is not None:
            key_shape = tuple(saved["shape"][len(like.shape):])
            data_like = jax.ShapeDtypeStruct(
                tuple(like.shape) + key_shape, np.uint32,
                sharding=getattr(like, "sharding", None))
        data = self.jax(name, data_like)
        if data is None:
            return None
        return _Pending(lambda: jax.random.wrap_key_data(data.finish(),
                                                         impl=impl))

    def _jax_in_host(self, name, shape, dtype, sharding, index_of):
        """JAX's CPU devices hold their buffers in host memory: each
        distinct shard box is restored in place into an aligned NumPy array,
        which every device holding that box then adopts without a copy
        (device_put(may_alias=True)); replicas share it, as JAX arrays are
        immutable."""
        jax = _module("jax")
        buffers, dests, positions = {}, [], []
        for device, index in index_of.items():
            origin, extent = _box_of(index, shape)
            key = (tuple(origin), tuple(extent))
            if key not in buffers:
                buffers[key] = _aligned_empty(extent, dtype)
                if 0 not in extent:  # an empty shard reads nothing
                    dests.append((-1, origin, extent,
                                  buffers[key].reshape(-1).view(np.uint8)))
            positions.append(len(self.adopted))
            self.adopted.append((buffers[key], device))
        self.list.append((name, dtype.name, list(shape), dests))

        def finish():
            return jax.make_array_from_single_device_arrays(
                shape, sharding, [self.adopted_arrays[p] for p in positions])

        return _Pending(finish)

    def adopt(self):
        """Hands every in-host JAX shard to its device, in one call."""
        if self.adopted:
            jax = _module("jax")
            self.adopted_arrays = jax.device_put(
                [b for b, _ in self.adopted], [d for _, d in self.adopted],
                may_alias=True)

    def receive(self, items):
        """Called by the engine once per wave with (token, offset, bytes) of
        every staged part of a JAX shard; bytes are valid during the call
        only. A shard staged whole goes to its device as a view of them, in
        one batched device_put per wave. A shard larger than half the pool
        comes in parts (runs of rows along its first axis longer than 1):
        the shard is made once on its device and each part is copied there
        and written into it in place (a donated dynamic_update_slice), so no
        whole shard is ever gathered in host memory."""
        jax = _module("jax")
        arrays, devices, tokens = [], [], []
        parts, part_devices, part_at = [], [], []
        for token, offset, raw in items:
            dtype, extent, device = self.received_meta[token - 1]
            total = int(np.prod(extent)) * dtype.itemsize
            if offset == 0 and raw.nbytes == total:
                arrays.append(raw.view(dtype).reshape(extent))
                devices.append(device)
                tokens.append(token)
                continue
            axis = next(i for i, n in enumerate(extent) if n > 1)
            row_bytes = total // extent[axis]
            shape = list(extent)
            shape[axis] = raw.nbytes // row_bytes
            start = [0] * len(extent)
            start[axis] = offset // row_bytes
            parts.append(raw.view(dtype).reshape(shape))
            part_devices.append(device)
            part_at.append((token, tuple(start), raw.nbytes, total))
        placed = jax.device_put(arrays + parts, devices + part_devices)
        jax.block_until_ready(placed)  # the staging memory is reused next
        for token, array in zip(tokens, placed):
            self.placed[token] = array
        for (token, start, nbytes, total), part in zip(
                part_at, placed[len(arrays):]):
            dtype, extent, device = self.received_meta[token - 1]
            entry = self.partial.get(token)
            if entry is None:
                entry = self.partial[token] = [
                    jax.numpy.zeros(extent, dtype, device=device), 0]
            entry[0] = _update_slice()(entry[0], part, start)
            entry[1] += nbytes
            if entry[1] == total:
                self.placed[token] = self.partial.pop(token)[0]


_UPDATE_SLICE = []


def _update_slice():
    """jit(dynamic_update_slice) writing into a donated array: in place."""
    if not _UPDATE_SLICE:
        jax = _module("jax")
        _UPDATE_SLICE.append(jax.jit(
            lambda full, part, start: jax.lax.dynamic_update_slice(
                full, part, start), donate_argnums=0))
    return _UPDATE_SLICE[0]


def _decode_value(node):
    if "f" in node:
        return float(node["f"])
    return node["v"]


def _children(node):
    """(path part, child) of each child of a checked skeleton node: none for
    a leaf; one with part None for a stateful object's state dict, which
    sits at the object's own path."""
    if "d" in node or "n" in node:
        return [(str(k), c) for k, c in node.get("d", node.get("n"))]
    if "l" in node or "t" in node:
        return [(str(i), c) for i, c in enumerate(node.get("l", node.get("t")))]
    if "s" in node:
        return [(None, node["s"])]
    return []


def _leaves(skeleton):
    """(path -> value of every non-array leaf, array name -> its node) of a
    checked skeleton."""
    scalars, arrays = {}, {}
    pending = [(skeleton, [])]
    while pending:
        node, path = pending.pop()
        if "a" in node:
            arrays[node["a"]] = node
        elif "v" in node or "f" in node:
            scalars["/".join(path)] = _decode_value(node)
        else:
            pending.extend((c, path if part is None else path + [part])
                           for part, c in _children(node))
    return scalars, arrays


def _resolve(tree):
    if isinstance(tree, _Pending):
        return tree.finish()
    if isinstance(tree, dict):
        return {k: _resolve(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_resolve(v) for v in tree]
    if isinstance(tree, tuple):
        items = [_resolve(v) for v in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else tuple(items)
    return tree


_KINDS = ("numpy", "torch", "jax", "jax_key")
_NONFINITE = ("nan", "inf", "-inf")


def check_skeleton(skeleton, saved_names):
    """Raises DataLossError, naming the place, unless `skeleton` is a tree
    flatten() could have written whose arrays are all in `saved_names`: the
    manifest's metadata is input like the rest of it."""
    pending = [(skeleton, "the tree")]
    while pending:
        node, where = pending.pop()

        def bad(what):
            return DataLossError(
                f"manifest metadata: the saved tree is malformed at {where}: "
                f"{what}")

        if not isinstance(node, dict) or len(node) not in (1, 2, 3):
            raise bad(f"expected a node object, found {type(node).__name__}")
        if "d" in node and len(node) == 1:
            if not isinstance(node["d"], list):
                raise bad("'d' is not a list")
            for item in node["d"]:
                if (not isinstance(item, list) or len(item) != 2
                        or isinstance(item[0], bool)
                        or not isinstance(item[0], (str, int))):
                    raise bad("a dict item is not a [str or int key, node] pair")
                pending.append((item[1], f"{where}/{item[0]}"))
        elif "n" in node and len(node) == 1:
            if not isinstance(node["n"], list):
                raise bad("'n' is not a list")
            for item in node["n"]:
                if (not isinstance(item, list) or len(item) != 2
                        or not isinstance(item[0], str)):
                    raise bad("a pytree node item is not a [str, node] pair")
                pending.append((item[1], f"{where}/{item[0]}"))
        elif "s" in node and len(node) == 1:
            pending.append((node["s"], where))
        elif ("l" in node or "t" in node) and len(node) == 1:
            items = node.get("l", node.get("t"))
            if not isinstance(items, list):
                raise bad("a list or tuple node does not hold a list")
            pending.extend((c, f"{where}/{i}") for i, c in enumerate(items))
        elif "v" in node and len(node) == 1:
            if not isinstance(node["v"], _SCALARS):
                raise bad(f"value of type {type(node['v']).__name__}")
        elif "f" in node and len(node) == 1:
            if node["f"] not in _NONFINITE:
                raise bad(f"float {node['f']!r}")
        elif "a" in node and set(node) <= {"a", "k", "i"}:
            if "i" in node and not isinstance(node["i"], str):
                raise bad(f"PRNG key implementation {node['i']!r}")
            if node.get("k", "numpy") not in _KINDS:
                raise bad(f"unknown array kind {node.get('k')!r}")
            if node["a"] not in saved_names:
                raise bad(f"array {node['a']!r} is not in the manifest")
        else:
            raise bad(f"unknown node {sorted(node)!r}")


def unflatten(manifest, skeleton, like, restore, names=None):
    """The restored tree: shaped like `like`; or the arrays in `names` as a
    flat dict name -> array (in the kind they were saved as); or rebuilt
    from `skeleton` (else a flat dict name -> numpy array).
    `restore(targets)` runs the engine. The garbage collector is paused
    meanwhile (gc_paused)."""
    with gc_paused():
        return _unflatten(manifest, skeleton, like, restore, names)


def _subtree(skeleton, path):
    """The skeleton node at `path` (names as flatten() made them), or None."""
    node = skeleton
    for part in path:
        while "s" in node:  # a state dict sits at its object's path
            node = node["s"]
        node = next((c for p, c in _children(node) if p == part), None)
        if node is None:
            return None
    return node


def _unflatten(manifest, skeleton, like, restore, names):
    targets = _Targets(manifest)
    if skeleton is not None:
        check_skeleton(skeleton, targets.saved)
    scalars, arrays = _leaves(skeleton) if skeleton is not None else ({}, {})

    def from_skeleton(node):
        if "d" in node or "n" in node:  # a registered node comes back a dict
            return {key: from_skeleton(child)
                    for key, child in node.get("d", node.get("n"))}
        if "s" in node:  # a stateful object: its state dict
            return from_skeleton(node["s"])
        if "l" in node:
            return [from_skeleton(c) for c in node["l"]]
        if "t" in node:
            return tuple(from_skeleton(c) for c in node["t"])
        if "a" in node:
            kind = node.get("k", "numpy")
            if kind == "torch":
                return targets.torch(node["a"])
            if kind == "jax_key" and _module("jax") is not None:
                return targets.jax_key(node["a"], node.get("i"))
            if kind == "jax" and _module("jax") is not None:
                return targets.jax(node["a"])  # on the default device
            return targets.numpy(node["a"])
        return _decode_value(node)


    def from_like(x, path):
        name = "/".join(path) or "array"
        kind = type(x)
        if kind is dict:
            return {k: from_like(v, path + [str(k)]) for k, v in x.items()}
        if kind is tuple:
            return tuple(from_like(v, path + [str(i)]) for i, v in enumerate(x))
        if kind is list:
            return [from_like(v, path + [str(i)]) for i, v in enumerate(x)]
        if _is_jax(x) or _is_jax_struct(x):
            if _is_key_array(x):
                node = arrays.get(name, {})
                return targets.jax_key(name, node.get("i"), x)
            if _is_jax(x) and not getattr(x, "committed", True):
                # Uncommitted (jnp.zeros, optax's counters): so is the
                # restored array, which jit may then place with the rest.
                host = targets.numpy(name, np.dtype(x.dtype).name, x.shape)
                jax = _module("jax")
                return _Pending(lambda: jax.device_put(host))
            return targets.jax(name, x)
        if _is_dtensor(x):
            return targets.dtensor(name, x)
        if _is_torch(x):
            return targets.torch(name, x)
        if isinstance(x, (np.ndarray, np.generic)):
            return targets.numpy(name, np.asarray(x).dtype.name,
                                 np.shape(x))
        if isinstance(x, _SCALARS):
            if name in scalars:
                return scalars[name]
            if name in arrays:  # a counter saved as an array (a jitted
                return targets.numpy(name)  # step): host data, any device
            return x
        if _is_stateful(x):  # in place, through load_state_dict, as DCP
            node = _subtree(skeleton, path) if skeleton is not None else None
            if node is None or "s" not in node:
                targets.missing.append(f"{name} (a saved state dict)")
                return x
            state = from_skeleton(node["s"])
            return _Pending(lambda: (x.load_state_dict(_resolve(state)), x)[1])
        node = _jax_children(x)
        if node is not None:  # rebuilt with the template's type and statics
            keys, children, treedef = node
            restored = [from_like(c, path + [k]) for k, c in zip(keys, children)]
            return _Pending(lambda: treedef.unflatten(
                [_resolve(r) for r in restored]))
        if isinstance(x, tuple) and hasattr(x, "_fields"):  # no JAX
            return type(x)(*[from_like(getattr(x, f), path + [f])
                             for f in x._fields])
        if isinstance(x, tuple):
            return tuple(from_like(v, path + [str(i)]) for i, v in enumerate(x))
        if isinstance(x, dict):
            return {k: from_like(v, path + [str(k)]) for k, v in x.items()}
        if isinstance(x, list):
            return [from_like(v, path + [str(i)]) for i, v in enumerate(x)]
        raise TypeError(f"{name}: cannot restore into a {type(x).__name__}")

    if like is not None:
        tree = from_like(like, [])
    elif names is not None:
        tree = {name: from_skeleton(arrays.get(name, {"a": name}))
                for name in names}
    elif skeleton is not None:
        tree = from_skeleton(skeleton)
    else:  # not saved from Python: every array, by name
        tree = {name: targets.numpy(name) for name in targets.saved}
    targets.raise_mismatches()
    restore(targets.list, targets.received_list,
            targets.receive if targets.received_list else None)
    targets.adopt()
    return _resolve(tree)
