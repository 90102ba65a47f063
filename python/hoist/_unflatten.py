"""hoist's named arrays back into pytrees (the restore side of _tree.py,
whose docstring describes the skeleton): the engine's restore targets,
built leaf by leaf for NumPy, torch (DTensor too) and JAX, and the restored
tree, shaped like a template, like the saved skeleton, or flat by name."""

import math

import numpy as np

from ._errors import DataLossError
from ._per_rank import PerRank
from ._torch_xla import Placement, is_xla
from ._tree import (
    _SCALARS,
    _aligned_bytes,
    _aligned_empty,
    _box_of,
    _dtensor_boxes,
    _is_dtensor,
    _is_jax,
    _is_jax_struct,
    _is_key_array,
    _is_stateful,
    _is_torch,
    _jax_children,
    _module,
    _numpy_dtype,
    _torch_dtype_name,
    _whole,
    gc_paused,
)

# JAX CPU devices: restore shards in host memory and adopt them (True), or
# stage them through the pool and device_put them as for GPUs (False; tests
# switch to it to cover that path on CPU).
_JAX_IN_HOST = True


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
        self.xla = Placement()  # PyTorch/XLA tensors, placed once read
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

    def matching(self, name, like):
        """The manifest's entry for `name` where torch tensor `like`'s
        dtype and shape are the checkpoint's, else None (recorded)."""
        saved = self.saved_array(name)
        if saved is None or not self.matches(
                name, saved, _torch_dtype_name(like.dtype), list(like.shape)):
            return None
        return saved

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

    def torch_xla(self, name, like):
        """A PyTorch/XLA tensor shaped and sharded like `like`
        (_torch_xla.Placement)."""
        slot = self.xla.target(self, name, like, _aligned_bytes)
        if slot is None:
            return None
        return _Pending(lambda: slot[0])

    def dtensor(self, name, like):
        """This rank's shard of a DTensor shaped like `like` (its mesh and
        placements, any world size), read alone, then wrapped."""
        torch = _module("torch")
        if self.matching(name, like) is None:
            return None
        dtype, shape = like.dtype, list(like.shape)
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
    """(path -> value of every scalar leaf, array name -> its node, path ->
    index of every per-rank leaf) of a checked skeleton."""
    scalars, arrays, per_rank = {}, {}, {}
    pending = [(skeleton, [])]
    while pending:
        node, path = pending.pop()
        if "a" in node:
            arrays[node["a"]] = node
        elif "v" in node or "f" in node:
            scalars["/".join(path)] = _decode_value(node)
        elif "r" in node:
            per_rank["/".join(path)] = node["r"]
        else:
            pending.extend((c, path if part is None else path + [part])
                           for part, c in _children(node))
    return scalars, arrays, per_rank


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
        elif "r" in node and len(node) == 1:
            if isinstance(node["r"], bool) or not isinstance(node["r"], int) \
                    or node["r"] < 0:
                raise bad(f"per-rank index {node['r']!r}")
        elif "a" in node and set(node) <= {"a", "k", "i"}:
            if "i" in node and not isinstance(node["i"], str):
                raise bad(f"PRNG key implementation {node['i']!r}")
            if node.get("k", "numpy") not in _KINDS:
                raise bad(f"unknown array kind {node.get('k')!r}")
            if node["a"] not in saved_names:
                raise bad(f"array {node['a']!r} is not in the manifest")
        else:
            raise bad(f"unknown node {sorted(node)!r}")


def unflatten(manifest, skeleton, like, restore, names=None, per_rank=None):
    """The restored tree: shaped like `like`; or the arrays in `names` as a
    flat dict name -> array (in the kind they were saved as); or rebuilt
    from `skeleton` (else a flat dict name -> numpy array).
    `restore(targets)` runs the engine; `per_rank` (_per_rank.Values) hands
    out the PerRank leaves' values. The garbage collector is paused
    meanwhile (gc_paused)."""
    with gc_paused():
        return _unflatten(manifest, skeleton, like, restore, names, per_rank)


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


def _unflatten(manifest, skeleton, like, restore, names, per_rank):
    targets = _Targets(manifest)
    if skeleton is not None:
        check_skeleton(skeleton, targets.saved)
    scalars, arrays, ranked = (_leaves(skeleton) if skeleton is not None
                               else ({}, {}, {}))

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
        if "r" in node:
            return per_rank.get(node["r"])
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
            if is_xla(x):
                return targets.torch_xla(name, x)
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
        if isinstance(x, PerRank):  # this rank's value (or every rank's)
            if name not in ranked:
                targets.missing.append(f"{name} (a per-rank value)")
                return x.value
            value = per_rank.get(ranked[name])
            if _is_stateful(x.value) and per_rank.mode is None:
                return _Pending(lambda: (x.value.load_state_dict(value),
                                         x.value)[1])
            return value
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

    called = False
    try:
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
        called = True
        restore(targets.list, targets.received_list,
                targets.receive if targets.received_list else None)
        targets.adopt()
        targets.xla.place()
        return _resolve(tree)
    except Exception:
        if not called:
            # The restore is collective in a job of several processes: take
            # part with nothing to restore, so that the other ranks are not
            # left waiting for this one, then raise this rank's error.
            try:
                restore([], [], None)
            except Exception:  # noqa: BLE001 (this rank's error is raised)
                pass
        raise
    finally:
        # The two recursive closures reach themselves (and `targets`, which
        # holds every restored array): unbound here, the restored memory is
        # freed as soon as the caller drops it, not at the next collection.
        from_skeleton = from_like = None
