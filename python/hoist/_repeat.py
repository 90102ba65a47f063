"""Repeat saves: a plan of the last state flattened, and the next state
checked against it (see below)."""

import functools

import numpy as np

from ._torch_xla import WHOLE, is_xla
from ._tree import (_SCALARS, _device_of, _jax_layout, _jax_shards, _module,
                    _scalar_node, gc_paused)

# A repeat save of the same structure. A training loop saves the same state
# again and again: the same dicts, the same arrays' names, dtypes and
# shapes, new values. save() keeps a plan of the last state it flattened
# (fast_plan) and checks the next one against it (match), collecting its
# arrays without naming or describing them again; the engine reuses the
# last save's arrays with the new data. Plans cover dicts (of the same
# type: an OrderedDict state dict stays one, with str or int keys), lists
# and tuples, NumPy arrays of NumPy's own dtypes that need no copy, torch
# tensors in CPU memory (the same type, dtype and shape, contiguous), JAX
# arrays (the same type, dtype, shape and sharding: their shards are taken
# in the order flatten took them, without describing their boxes again; a
# row-major shard by its address, kept alive with its array until the
# copies have read it, if its layout is still the same; one the first save
# staged through PJRT (_xla_staging.py) staged so again), PyTorch/XLA
# tensors (the same type, dtype, shape and sharding: their local shards
# taken as the first save took them, by address), and scalar leaves (whose
# changed values are written into the tree's metadata); anything else takes
# the full walk.
_DICT, _ARRAY, _SCALAR, _JAX, _SEQ, _TORCH, _XLA = 0, 1, 2, 3, 4, 5, 6
_SCALAR_TYPES = frozenset(_SCALARS)
# Torch dtypes the engine takes as they are (through DLPack), not as bytes.
_TORCH_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8",
                 "int16", "int32", "int64", "uint8")


def _jax_leaf(x, name, shards, staging):
    """The plan of JAX array `x` named `name`, whose flattened shards are
    `shards`, or None (a typed key, or shards in an order this cannot take
    again). Whether its shards go through `staging` (an
    _xla_staging.Staging) is decided now, for every repeat save."""
    jax = _module("jax")
    if (jax is None or not isinstance(x, jax.Array) or
            jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)):
        return None
    replicated = x.is_fully_replicated
    local = _jax_shards(x, replicated)
    ids = [device for device, _, _, data in shards if data is not None]
    devices = [s.device for s in x.addressable_shards] if replicated else [
        _device_of(a) for a in local]
    where = {device.id: i for i, device in enumerate(devices)}
    if len(ids) != len(local) or set(ids) != set(where):
        return None
    order = [where[i] for i in ids]
    lies, layout = _jax_layout(x)
    return (_JAX, type(x), x.dtype, x.shape, x.sharding, replicated,
            None if order == list(range(len(order))) else order, lies,
            layout, staging.takes(x, lies), name)


def _torch_leaf(x, data):
    """The plan of torch tensor `x`, flattened as `data` (its local shards'
    data), or None (a DTensor or subclass, not in CPU memory, a dtype taken
    as bytes, or not one shard here)."""
    torch = _module("torch")
    if (torch is None or type(x) not in (torch.Tensor, torch.nn.Parameter)
            or x.device.type != "cpu" or len(data) != 1 or
            str(x.dtype).removeprefix("torch.") not in _TORCH_DTYPES):
        return None
    return (_TORCH, type(x), x.dtype, tuple(x.shape))


def _xla_leaf(x, name, staging):
    """The plan of PyTorch/XLA tensor `x` saved as `name`: its type, dtype,
    shape and sharding, and how the save took its local shards (the
    staging's Transfer says), or None."""
    takes = staging.xla.taken.get(name)
    if takes is None or type(x) not in (_module("torch").Tensor,
                                         _module("torch").nn.Parameter):
        return None
    spec = _module("torch_xla")._XLAC._get_xla_sharding_spec(x)
    return (_XLA, type(x), x.dtype, tuple(x.shape), spec, takes, name)


def fast_plan(skeleton, arrays, state, staging):
    """The plan of a flattened state (`state`, and its skeleton and arrays
    as flatten returned them, with `staging`), or None when it has nodes a
    plan does not cover."""
    leaves = iter(arrays)

    def leaf(node, x):
        shards = next(leaves)[3]
        if node.get("k") == "jax":
            return _jax_leaf(x, node["a"], shards, staging)
        data = [d for _, _, _, d in shards if d is not None]
        if node.get("k") == "torch":
            if is_xla(x):
                return _xla_leaf(x, node["a"], staging)
            return _torch_leaf(x, data)
        if node.get("k") != "numpy":
            return None
        if (len(data) != 1 or type(data[0]) is not np.ndarray or
                data[0].dtype.isbuiltin != 1):
            return None
        return (_ARRAY, data[0].dtype, data[0].shape)

    def child(kid, x, holder, index):
        """The plan of skeleton node `kid` for value `x`; a scalar's is
        patched in place (holder[index]) when its value changes."""
        if "d" in kid or "n" in kid or "l" in kid or "t" in kid:
            return build(kid, x)
        if "a" in kid:
            return leaf(kid, x)
        if "v" in kid or "f" in kid:
            value = kid["v"] if "v" in kid else float(kid["f"])
            if type(value) not in _SCALAR_TYPES:
                return None
            return [_SCALAR, holder, index, type(value), value]
        return None

    def build(node, x):
        # A dict, or a dict subclass JAX registers (OrderedDict: "n").
        pairs = node.get("d", node.get("n"))
        if pairs is not None and isinstance(x, dict):
            keys, kids = [], []
            for pair in pairs:
                key, kid = pair
                if key not in x:
                    return None
                plan = child(kid, x[key], pair, 1)
                if plan is None:
                    return None
                keys.append(key)
                kids.append(plan)
            keys = tuple(keys)
            types = (None if all(type(k) is str for k in keys)
                     else tuple(type(k) for k in keys))
            return (_DICT, type(x), keys, types, kids)
        items = node.get("l", node.get("t"))
        if (items is None or type(x) is not (list if "l" in node else tuple)
                or len(items) != len(x)):
            return None
        kids = []
        for i, (kid, value) in enumerate(zip(items, x)):
            plan = child(kid, value, items, i)
            if plan is None:
                return None
            kids.append(plan)
        return (_SEQ, type(x), kids)

    try:
        plan = build(skeleton, state)
        return plan if plan is not None and plan[0] == _DICT else None
    except StopIteration:
        return None


def match(state, plan, staging):
    """(arrays, changed, keep) when `state` has the structure `plan` was
    made from: the data of its local shards, in the order flatten gives
    them (one per NumPy array or torch tensor; for JAX shards the address
    of each, a DLPack capsule, or the host copy `staging` (an
    _xla_staging.Staging, run here) made of it), whether a
    scalar leaf changed (the plan's skeleton then holds the new value), and
    the JAX arrays whose shards went as addresses (to be kept alive until
    the save has copied them). None when the structure differs anywhere;
    the skeleton may then hold new scalar values, and the plan must be
    rebuilt."""
    arrays = []
    keep = []
    changed = False
    ndarray = np.ndarray

    def visit(value, kid):
        """Whether `value` matches `kid`, its arrays collected."""
        nonlocal changed
        tag = kid[0]
        if tag == _ARRAY:
            if (type(value) is not ndarray or value.shape != kid[2] or
                    (value.dtype is not kid[1] and value.dtype != kid[1])
                    or not value.flags.c_contiguous):
                return False
            arrays.append(value)
        elif tag == _TORCH:
            _, kind, dtype, shape = kid
            if (type(value) is not kind or value.dtype is not dtype or
                    value.shape != shape or not value.is_contiguous() or
                    value.device.type != "cpu"):
                return False
            arrays.append(value.detach())  # exportable if it needs grad
        elif tag == _XLA:
            _, kind, dtype, shape, spec, takes, name = kid
            if (type(value) is not kind or value.dtype is not dtype or
                    value.shape != shape or not is_xla(value) or
                    _module("torch_xla")._XLAC._get_xla_sharding_spec(
                        value) != spec):
                return False
            # The data of its local shards once staging has run.
            staging.xla.add_again(name, value, takes, arrays, len(arrays))
            arrays.extend([None] * (1 if takes is WHOLE else len(takes)))
        elif tag == _JAX:
            (_, kind, dtype, shape, sharding, replicated, order, lies,
             layout, staged, name) = kid
            if (type(value) is not kind or value.shape != shape or
                    value.dtype != dtype or value.is_deleted() or
                    (value.sharding is not sharding and
                     value.sharding != sharding)):
                return False
            local = _jax_shards(value, replicated)
            if order is not None:
                local = [local[i] for i in order]
            if staged:  # the host copies, once staging has run
                for a in local:
                    staging.add(name, a, functools.partial(
                        arrays.__setitem__, len(arrays)), None,
                        lies == "row-major")
                    arrays.append(None)
            elif lies == "row-major":  # by address, if it still is
                try:
                    if value.format.layout != layout:
                        return False
                    arrays.extend([a.unsafe_buffer_pointer() for a in local])
                except Exception:  # deleted: the full walk says so
                    return False
                keep.append(value)
            else:
                for a in local:
                    arrays.append(staging.capsule_or_add(
                        name, a, functools.partial(arrays.__setitem__,
                                                   len(arrays))))
        elif tag == _DICT:
            return walk(value, kid)
        elif tag == _SEQ:
            if type(value) is not kid[1] or len(value) != len(kid[2]):
                return False
            for item, plan in zip(value, kid[2]):
                if not visit(item, plan):
                    return False
        else:
            kind = type(value)
            if kind is not kid[3] or not value == kid[4]:
                if kind not in _SCALAR_TYPES:
                    return False
                kid[1][kid[2]] = _scalar_node(value)
                kid[3], kid[4] = kind, value
                changed = True
        return True

    def walk(x, node):
        _, kind, keys, types, kids = node
        if type(x) is not kind or len(x) != len(keys) or tuple(x) != keys:
            return False
        if types is not None and tuple(map(type, x)) != types:
            return False
        for value, kid in zip(x.values(), kids):
            if not visit(value, kid):
                return False
        return True

    with gc_paused():
        if not walk(state, plan):
            staging.clear()
            return None
        staging.run()
        keep.extend(staging.xla.host)  # held until the save copied them
        return arrays, changed, keep
