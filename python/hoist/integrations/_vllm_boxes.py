"""The part of each saved array a vLLM worker reads (for load_format
"hoist", vllm.py): with tensor parallelism a worker's weight loaders keep a
slice of most weights (the column- or row-parallel dimension, each of
fused QKV's and gate/up's parts, a vocabulary range), and hoist reads just
that box from the step instead of the whole array.

The boxes are found, not guessed: the model's own load_weights runs once
on probes, tensors on the meta device with the saved shapes that record
what the loaders do to them. A narrow() (how vLLM's loaders take their
rank's slice) gives a probe of the narrowed box; copying a probe into a
parameter records that box as used. Anything else done to a probe (a
dtype change, a transpose, indexing...) marks its array as read whole, and
is not carried out on the model's parameters. Arrays the loaders never
narrow are read whole, as are those of a model whose load_weights fails on
probes. Then each array is read (only its box, verified extent by extent)
into a tensor of its full shape whose other bytes are never written nor
read: the loaders take the same slices again on the real pass, from memory
that holds them, and the rest of the tensor's pages are never touched.

Wrong boxes cannot load wrong bytes silently: a box is only ever what the
loaders themselves narrowed to on the probe pass, and the real pass makes
the same calls with the same ranks.

Where the probe pass shows that the loaders do nothing to an array but
copy (a box of) it into a parameter (a CPU one: vLLM's CPU build), the
array's box is read straight into that parameter and the array is not
handed to load_weights at all: no buffer of its own, no copy, its bytes
written once. Only where nothing else could differ: one copy of it, into
memory that is contiguous, of its dtype and its box's shape, that nothing
else writes during the probe pass (another array, a fill, a scale, a
storage swap: what such writes touch loads through load_weights as
before).
"""

import torch
from torch.overrides import TorchFunctionMode, get_default_nowrap_functions

# What may be asked of a probe without touching its data.
_METADATA = {
    torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel,
    torch.Tensor.__len__, torch.Tensor.is_contiguous,
    torch.Tensor.stride, torch.Tensor.element_size,
    torch.Tensor.shape.__get__, torch.Tensor.dtype.__get__,
    torch.Tensor.device.__get__, torch.Tensor.ndim.__get__,
    torch.Tensor.is_meta.__get__, torch.Tensor.layout.__get__,
    torch.Tensor.requires_grad.__get__,
}


class Use:
    """What the probe pass found of one array: `whole` (read all of it),
    else the bounding box of every box the loaders used ((origin, extent),
    or None when none was); `copies`, the (destination, origin, extent) of
    each copy of a box of it into a real tensor; and `place`, the
    parameter memory its box is read straight into, or None (probe())."""

    def __init__(self, shape):
        self.shape = tuple(shape)
        self.whole = False
        self.box = None
        self.copies = []
        self.place = None

    def copied(self, destination, origin, extent):
        self.used(origin, extent)
        self.copies.append((destination, tuple(origin), tuple(extent)))

    def used(self, origin, extent):
        if self.box is None:
            self.box = (tuple(origin), tuple(extent))
            return
        lo = [min(a, b) for a, b in zip(self.box[0], origin)]
        hi = [max(a + n, b + m) for a, n, b, m in
              zip(self.box[0], self.box[1], origin, extent)]
        self.box = (tuple(lo), tuple(h - l for h, l in zip(hi, lo)))

    def region(self):
        """(origin, extent) to read: the box, or the whole array."""
        if self.whole or self.box is None:
            return (0,) * len(self.shape), self.shape
        return self.box


class _Probe(torch.Tensor):
    """A meta tensor standing for (a box of) a saved array."""

    @staticmethod
    def __new__(cls, meta, use, origin):
        probe = torch.Tensor._make_subclass(cls, meta)
        probe._use, probe._origin = use, tuple(origin)
        return probe

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        probes = [a for a in _flat(args, kwargs) if isinstance(a, _Probe)]
        if func in _METADATA or func in get_default_nowrap_functions():
            with torch._C.DisableTorchFunction():
                return func(*args, **kwargs)
        if func in (torch.Tensor.narrow, torch.narrow) and \
                isinstance(args[0], _Probe):
            return args[0]._narrow(*args[1:], **kwargs)
        if func is torch.Tensor.copy_ and isinstance(args[1], _Probe) and \
                not isinstance(args[0], _Probe):
            source = args[1]
            source._use.copied(args[0], source._origin, tuple(source.shape))
            return args[0]  # nothing is copied on the probe pass
        for probe in probes:
            probe._use.whole = True
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and not isinstance(first, _Probe) \
                and not first.is_meta:
            return first  # an op on a parameter: not carried out
        with torch._C.DisableTorchFunction():
            out = func(*[_meta(a) for a in args],
                       **{k: _meta(v) for k, v in kwargs.items()})
        if isinstance(out, torch.Tensor):
            whole = Use(out.shape)
            whole.whole = True
            return _Probe(out, whole, (0,) * out.dim())
        return out

    def _narrow(self, dim, start, length):
        dim = dim + self.dim() if dim < 0 else dim
        start = int(start) + (self.shape[dim] if int(start) < 0 else 0)
        with torch._C.DisableTorchFunction():
            meta = torch.Tensor.narrow(self.as_subclass(torch.Tensor), dim,
                                       start, int(length))
        origin = list(self._origin)
        origin[dim] += start
        return _Probe(meta, self._use, origin)


def _flat(args, kwargs):
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, (list, tuple)):
            yield from value
        else:
            yield value


def _meta(value):
    if isinstance(value, _Probe):
        return value.as_subclass(torch.Tensor)
    if isinstance(value, torch.Tensor) and not value.is_meta:
        return torch.empty_like(value, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_meta(v) for v in value)
    return value


class _Writes(TorchFunctionMode):
    """During the probe pass: the memory of real tensors written to, as
    (start, end) addresses with what wrote them: the Use of a probe copied
    there, or None for anything else (an in-place op, an out=, an item
    assignment, a .data swap)."""

    def __init__(self):
        super().__init__()
        self.written = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        copy = func is torch.Tensor.copy_ and len(args) > 1 and \
            isinstance(args[1], _Probe)
        writes = "out" in kwargs or name in ("__setitem__", "__set__") or \
            (name.endswith("_") and not name.startswith("__")) or \
            (name.startswith("__i") and name.endswith("__"))
        if copy and _real(args[0]):
            self.written.append((_span(args[0]), args[1]._use))
        elif writes:
            for target in (args[0] if args else None, kwargs.get("out")):
                if _real(target):
                    self.written.append((_span(target), None))
        return func(*args, **kwargs)


def _real(value):
    return isinstance(value, torch.Tensor) and \
        not isinstance(value, _Probe) and not value.is_meta


def _storage(tensor):
    return tensor.untyped_storage().data_ptr()


def _span(tensor):
    """(start, end): the addresses a tensor's elements lie within."""
    start = tensor.data_ptr()
    if tensor.numel() == 0:
        return start, start
    last = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))
    return start, start + (last + 1) * tensor.element_size()


def _places(uses, dtypes, written):
    """Sets each use's `place` (see the module): the one tensor its box
    is copied into, where reading it there gives what load_weights would
    make (`written`: _Writes.written)."""
    for name, use in uses.items():
        if use.whole or len(use.copies) != 1:
            continue
        target, _, extent = use.copies[0]
        if (target.device.type == "cpu" and target.is_contiguous() and
                target.dtype == dtypes[name] and
                tuple(target.shape) == extent and
                not any(by is not use and _overlap(_span(target), span)
                        for span, by in written)):
            use.place = target


def _overlap(a, b):
    return a[0] < b[1] and b[0] < a[1]


def probe(model, wanted, arrays, dtype_of):
    """{saved name: Use} for `wanted` ((saved name, checkpoint name) pairs;
    `arrays`: the manifest's arrays by name; dtype_of(saved dtype name): a
    torch dtype), found by running model.load_weights on probes. Every
    array is read whole, and none placed, where the probe pass fails (the
    model's loaders do something to probes it cannot follow)."""
    uses = {name: Use(arrays[name]["shape"]) for name, _ in wanted}
    dtypes = {name: dtype_of(arrays[name]["dtype"]) for name, _ in wanted}

    def probes():
        for name, checkpoint_name in wanted:
            meta = torch.empty(arrays[name]["shape"], dtype=dtypes[name],
                               device="meta")
            yield checkpoint_name, _Probe(meta, uses[name],
                                          (0,) * meta.dim())

    writes = _Writes()
    try:
        with torch.no_grad(), writes:
            model.load_weights(probes())
    except Exception:  # noqa: BLE001 (read every array whole instead)
        for use in uses.values():
            use.whole = True
            use.copies.clear()
    _places(uses, dtypes, writes.written)
    return uses


def parameters_placed(model, uses):
    """The names of the model's parameters that placed arrays (Use.place)
    were read into."""
    storages = {_storage(t) for t in (u.place for u in uses.values())
                if t is not None}
    return {name for name, p in model.named_parameters()
            if _storage(p) in storages}


def placed(raw, dtype, shape, origin, extent):
    """The tensor of an array whose box (`origin`, `extent`) was read into
    `raw` (bytes, dense; `dtype` a torch dtype): the box itself where it is
    the whole array, else a tensor of the full shape holding the box in
    place, its other bytes never written (nor read: the loaders take just
    the box, and untouched pages are never faulted in)."""
    box = torch.from_numpy(raw).view(dtype).reshape(tuple(extent))
    if tuple(extent) == tuple(shape):
        return box
    full = torch.empty(tuple(shape), dtype=dtype)
    full[tuple(slice(o, o + n) for o, n in zip(origin, extent))] = box
    return full
