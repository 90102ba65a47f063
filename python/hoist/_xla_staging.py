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
All of a save's such shards, every array and every device, go to host
memory in ONE jax.device_put(list of shards, list of shardings with memory
kind "pinned_host") (the seeds' fix: never a synchronous transfer per
shard, as np.asarray of each would be); every transfer is in flight before
the one wait for all of them. The host copies then go to the engine by
address, as host arrays do (a byte view of each: float8 included); one
whose layout is not row-major is put in C order on the host first. They live until the engine has
copied them into its pool; no reference to the device arrays is kept
(their buffers stay donatable). Where every local shard of a save went this
way, save() returns once the transfer is done: the arrays may change, and
the engine copies the host copies into its pool in the background.

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
        self.transfer_calls = 0  # batched transfers made (one per save)
        self.shards = 0          # shards they carried
        self.owned = False       # every local shard a host copy (owns())
        self._data, self._places, self._names = [], [], []
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

    def add(self, name, data, place):
        """Shard `data` (a single-device JAX array) of array `name`: once
        run() has it in host memory, place(engine data) puts it where the
        save needs it."""
        self._data.append(data)
        self._places.append(place)
        self._names.append(name)

    def capsule_or_add(self, name, data, place):
        """The DLPack capsule of shard `data`; where DLPack refuses it,
        the shard is added instead (and None returned)."""
        try:
            return data.__dlpack__()  # zero copy
        except Exception:  # noqa: BLE001 (a TPU's, or a dtype it lacks)
            self.add(name, data, place)
            return None

    def clear(self):
        """Forgets what was added (a walk that found another structure)."""
        self._data, self._places, self._names = [], [], []
        self.xla.clear()

    def run(self):
        """Moves every added shard to host memory in one batched transfer,
        waits once for all, and places each; then the PyTorch/XLA tensors
        (_torch_xla.Transfer.run)."""
        self.xla.run()
        if not self._data:
            return
        import jax

        try:
            targets = [self._target(name, data)
                       for name, data in zip(self._names, self._data)]
            host = jax.device_put(self._data, targets)
            jax.block_until_ready(host)
        except _NoHostMemory:
            raise
        except Exception as e:  # noqa: BLE001 (deleted, donated, device)
            raise RuntimeError(self._failure(e)) from e
        self.transfer_calls += 1
        self.shards += len(host)
        for copy, place in zip(host, self._places):
            place(_host_data(copy))
        self.clear()

    @staticmethod
    def _target(name, data):
        from jax.sharding import SingleDeviceSharding

        device = _device_of(data)
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

    def _failure(self, error):
        """What a failed transfer says: the arrays and devices it carried
        (the first few), and JAX's error."""
        seen = []
        for name, data in zip(self._names, self._data):
            try:
                device = _device_of(data)
            except Exception:  # noqa: BLE001 (a deleted array)
                device = "a deleted array's device"
            item = f"'{name}' on {device}"
            if item not in seen:
                seen.append(item)
        shown = ", ".join(seen[:4]) + (
            f" and {len(seen) - 4} more" if len(seen) > 4 else "")
        return (f"staging {len(self._data)} shards to host memory through "
                f"JAX (one device_put) failed for {shown}: {error}; nothing "
                "of this save was committed")

    def owns(self, local_shards):
        """Whether every one of a save's `local_shards` is a host copy this
        staging made: then the caller's arrays may change as soon as the
        transfer is done, and the engine's copies of them into the pool can
        go on after save() returns (the save is dispatched to the engine;
        the copies are hoist's own, immutable, and held until staged)."""
        copies = self.shards + self.xla.shards
        self.owned = local_shards > 0 and copies == local_shards
        return self.owned

    def owns_all(self, arrays):
        """owns() of flatten's `arrays` (_tree._Array tuples), whose local
        shards are counted only where this staging took any."""
        if self.shards + self.xla.shards == 0:
            return False
        return self.owns(sum(data is not None for array in arrays
                             for _, _, _, data in array[3]))

    def figures(self):
        """The save's figures of this path, for SaveHandle.wait()."""
        return {"pjrt_transfer_calls": self.transfer_calls,
                "pjrt_shards": self.shards, **_torch_xla.figures(self.xla)}
