"""JAX shards the engine cannot read by address, staged through JAX's own
runtime (PJRT) in one batched transfer per save.

A JAX shard goes to the engine by address (a DLPack capsule, or its buffer
pointer on a repeat save) when its memory is one the manager's backend can
copy from: host memory for backend="host", a GPU's for backend="cuda". The
others take this path:
  - a shard DLPack cannot export (JAX on a TPU refuses; a dtype DLPack
    cannot carry, such as float8);
  - a shard whose layout is not row-major (jax.experimental.layout, TPU's
    tiled layouts): its bytes are not the box in C order;
  - a shard on an accelerator the backend cannot address (a GPU's shards
    under backend="host");
  - every shard, when the manager says staging="pjrt".
Such shards are not copied while the state is walked: each goes to the
engine as a shard to produce (a token), and the engine's staging asks for
them wave by wave (include/hoist/shard_producer.h), once it holds room in
its pool for the wave and every earlier wave's copies are done. Each wave's
shards, every array and every device, go to host memory in ONE
jax.device_put(list of shards, list of shardings with memory kind
"pinned_host") (the seeds' fix: never a synchronous transfer per shard, as
np.asarray of each would be); every transfer is in flight before the one
wait for all of them. A save the pool holds is one wave: one call. The host
copies go to the engine by address, as host arrays do (a byte view of
each: float8 included); one whose layout is not row-major is put in C
order on the host first. Each lives until the engine has copied it into
its pool, so at most one wave of host copies exists at a time, within
host_memory_budget. No reference to the device arrays is kept once save()
returns (their buffers stay donatable). Where every local shard of a save
went this way, save() returns once the last wave is in host memory: the
arrays may change, and the engine copies into its pool in the background.

Restores need no counterpart: the JAX arrays a restore makes are put on
their devices by one batched device_put per wave (_unflatten.py).
"""

import numpy as np

from . import _torch_xla

#: staging= values: "auto" (the rule above) or "pjrt" (every JAX shard).
MODES = ("auto", "pjrt")


def _device_of(data):
    """The device of a single-device JAX array (a method in older JAX)."""
    device = getattr(data, "device", None)
    if device is None or callable(device):
        (device,) = data.devices()
    return device


def _memory_kind(device):
    """The host memory kind `device` can transfer to: pinned_host where it
    has it, else unpinned_host; None where it has neither."""
    try:
        kinds = {m.kind for m in device.addressable_memories()}
    except Exception:  # noqa: BLE001 (a JAX without memory kinds)
        return None
    for kind in ("pinned_host", "unpinned_host"):
        if kind in kinds:
            return kind
    return None


def _host_data(host):
    """What the engine takes of host array `host`: a flat byte view of it
    (no copy), in C order (copied into it where it is not)."""
    try:
        view = np.from_dlpack(host)
    except Exception:  # noqa: BLE001 (a dtype DLPack lacks: float8)
        view = np.asarray(host)
    view = np.ascontiguousarray(view)  # a no-op where it already is
    return view.reshape(-1).view(np.uint8)


class _NoHostMemory(ValueError):
    pass


class Deferred:
    """Where a walked state's shard data would be: the token of a shard the
    engine asks Staging.produce for."""

    __slots__ = ("token",)

    def __init__(self, token):
        self.token = token


def produced_shards(arrays):
    """The (array index, device, token) of every Deferred shard of `arrays`
    (flatten's _Array tuples), each replaced there by None."""
    produced = []
    for index, array in enumerate(arrays):
        shards = array[3]
        for at, (device, origin, shape, data) in enumerate(shards):
            if type(data) is Deferred:
                produced.append((index, device, data.token))
                shards[at] = (device, origin, shape, None)
    return produced


def produced_positions(data):
    """The (position, token) of every Deferred entry of save_again's `data`
    list, each replaced there by None."""
    produced = []
    for at, item in enumerate(data):
        if type(item) is Deferred:
            produced.append((at, item.token))
            data[at] = None
    return produced


class Staging:
    """The shards of one save that take the PJRT path: collected while the
    state is walked (add), transferred at once (run), each then handed to
    the place it was collected for. `mode`: "auto" or "pjrt"; `backend`:
    the manager's backend kind ("host" or "cuda")."""

    def __init__(self, mode="auto", backend="host"):
        if mode not in MODES:
            raise ValueError(f"staging={mode!r}: use one of {MODES}")
        self.forced = mode == "pjrt"
        self.backend = backend
        self.transfer_calls = 0  # batched transfers made (one per wave)
        self.shards = 0          # shards they carried
        self.owned = False       # every local shard a host copy (owns())
        self._data, self._places, self._names = [], [], []
        self._devices = []       # each added shard's device id, if known
        self._row_major = []     # each added shard's: in row-major layout
        self._targets = {}       # device -> its host memory's sharding
        self.deferred = 0        # shards handed to the engine to produce
        # PyTorch/XLA tensors: their own batched transfer (_torch_xla.py).
        self.xla = _torch_xla.Transfer()

    def takes(self, x, layout_kind):
        """Whether JAX array `x` (whose layout is `layout_kind`: "row-major",
        "other" or None) goes this way, whole."""
        if self.forced or layout_kind == "other":
            return True
        platform = next(iter(x.devices())).platform
        if self.backend == "host":
            return platform != "cpu"
        return platform not in ("gpu", "cuda")

    def add(self, name, data, place, device=None, row_major=False):
        """Shard `data` (a single-device JAX array; `device`: its device id,
        where the caller knows it; `row_major`: its layout is known to be)
        of array `name`: run() calls place(Deferred(token)) to put it where
        the save needs it, and produce() puts it in host memory when the
        engine asks."""
        self._data.append(data)
        self._places.append(place)
        self._names.append(name)
        self._devices.append(device)
        self._row_major.append(row_major)

    def capsule_or_add(self, name, data, place, device=None, row_major=False):
        """The DLPack capsule of shard `data`; where DLPack refuses it,
        the shard is added instead (and None returned)."""
        try:
            return data.__dlpack__()  # zero copy
        except Exception:  # noqa: BLE001 (a TPU's, or a dtype it lacks)
            self.add(name, data, place, device, row_major)
            return None

    def clear(self):
        """Forgets what was added (a walk that found another structure)."""
        self._data, self._places, self._names = [], [], []
        self._devices, self._row_major = [], []
        self.xla.clear()

    def run(self):
        """Moves the PyTorch/XLA tensors to host memory
        (_torch_xla.Transfer.run), and places every added JAX shard as a
        Deferred token: the engine asks produce() for it. That the devices
        have a host memory kind is checked now, before the save is
        accepted (on the first shard: a process's devices are of one
        kind)."""
        self.xla.run()
        if self._data:
            self._target(self._names[0], self._data[0])
        for token, place in enumerate(self._places):
            place(Deferred(token))
        self.deferred = len(self._places)
        self._places = []

    def produce(self, tokens):
        """The engine's request for one wave: the shards of `tokens` moved
        to host memory in one batched transfer, waited for once; each one's
        engine data, in order: (address, host copy) of a row-major copy, a
        flat byte view of a C-order one. The device arrays are forgotten as
        they are copied."""
        if not tokens:
            return []
        import jax

        data = [self._data[t] for t in tokens]
        try:
            targets = [self._target(self._names[t], shard)
                       for t, shard in zip(tokens, data)]
            host = jax.device_put(data, targets)
            jax.block_until_ready(host)
        except _NoHostMemory:
            raise
        except Exception as e:  # noqa: BLE001 (deleted, donated, device)
            raise RuntimeError(self._failure(tokens, e)) from e
        self.transfer_calls += 1
        self.shards += len(host)
        for t in tokens:
            self._data[t] = None
        # A row-major shard's host copy is too: the engine reads it at its
        # address (held with it); one in another layout is put in C order.
        return [(copy.unsafe_buffer_pointer(), copy)
                if self._row_major[t] and copy.size else _host_data(copy)
                for t, copy in zip(tokens, host)]

    def forget(self):
        """Drops every device array still held (the engine asks for no more
        once the save has returned: its every copy is dispatched)."""
        self._data, self._names = [], []
        self._devices, self._row_major = [], []

    def _target(self, name, data):
        """The host memory sharding shard `data` of array `name` goes to
        (one per device, made once)."""
        device = _device_of(data)
        target = self._targets.get(device)
        if target is None:
            target = self._targets[device] = self._host_sharding(name, device)
        return target

    @staticmethod
    def _host_sharding(name, device):
        from jax.sharding import SingleDeviceSharding

        kind = _memory_kind(device)
        if kind is None:
            raise _NoHostMemory(
                f"array '{name}': device {device} has no host memory kind "
                "(pinned_host or unpinned_host) to stage it through; this "
                "JAX is too old for it")
        # Not a Format asking for row-major: JAX then moves each array by a
        # call of its own (392 jit calls for 392 shards, tried). A copy in
        # another layout is put in C order on the host (_host_data).
        return SingleDeviceSharding(device, memory_kind=kind)

    def _failure(self, tokens, error):
        """What a failed transfer of `tokens` says: the arrays and devices
        it carried (the first few), and JAX's error."""
        seen = []
        for t in tokens:
            try:
                device = _device_of(self._data[t])
            except Exception:  # noqa: BLE001 (a deleted array)
                device = (f"device {self._devices[t]}"
                          if self._devices[t] is not None
                          else "a deleted array's device")
            item = f"'{self._names[t]}' on {device}"
            if item not in seen:
                seen.append(item)
        shown = ", ".join(seen[:4]) + (
            f" and {len(seen) - 4} more" if len(seen) > 4 else "")
        return (f"staging {len(tokens)} shards to host memory through "
                f"JAX (one device_put) failed for {shown}: {error}; nothing "
                "of this save was committed")

    def owns(self, local_shards):
        """Whether every one of a save's `local_shards` is a host copy this
        staging made: then the caller's arrays may change as soon as the
        transfer is done, and the engine's copies of them into the pool can
        go on after save() returns (the save is dispatched to the engine;
        the copies are hoist's own, immutable, and held until staged)."""
        copies = self.deferred + self.xla.shards
        self.owned = local_shards > 0 and copies == local_shards
        return self.owned

    def owns_all(self, arrays):
        """owns() of flatten's `arrays` (_tree._Array tuples), whose local
        shards are counted only where this staging took any."""
        if self.deferred + self.xla.shards == 0:
            return False
        return self.owns(sum(data is not None for array in arrays
                             for _, _, _, data in array[3]))

    def figures(self):
        """The save's figures of this path, for SaveHandle.wait()."""
        return {"pjrt_transfer_calls": self.transfer_calls,
                "pjrt_shards": self.shards, **_torch_xla.figures(self.xla)}
