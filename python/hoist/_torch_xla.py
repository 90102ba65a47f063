"""PyTorch/XLA tensors (torch_xla: TPUs, and its CPU client here), saved
from host copies that torch_xla makes of a whole save's tensors at once, and
restored onto any sharding.

Save: the tensors of one save are collected while the state is walked
(Transfer.add), then copied to host memory by one torch_xla call for those
sharded with SPMD (`xs.mark_sharding`: every local shard of every tensor,
`_get_local_shards`, which runs the transfers in parallel) and one for the
rest (`_xla_get_cpu_tensors`), after one sync of all their pending
computation. Never a `.cpu()` per tensor, which is one synchronous transfer
after another (PyTorch/XLA #5824, one of hoist's seeds), nor of a sharded
tensor, which would gather it. Each local shard is an extent with its box,
as a DTensor's is; replicas are written once. The host copies are hoist's
own: save() returns once they are made, and the engine copies them into its
pool in the background.

Restore: a template's local shard boxes are read from the step into host
buffers (each distinct box once), then put on the devices: every unsharded
tensor in one batched call, each sharded one by one call with all of its
shards (`_global_tensor_from_cpu_shards`, onto the template's sharding).

Not yet: SPMD tensors sharded over several processes (a multi-host pod),
whose other hosts' boxes a save would need.
"""

import math
import sys


def is_xla(t):
    """Whether torch tensor `t` lives on an XLA device."""
    return t.device.type == "xla"


def _xlac():
    return sys.modules["torch_xla"]._XLAC


def _process_count():
    runtime = sys.modules.get("torch_xla.runtime")
    return runtime.process_count() if runtime is not None else 1


def local_devices():
    """This process's XLA devices when torch_xla's SPMD mode is on (a local
    shard of each goes to a device of the host backend of its own), else
    None."""
    runtime = sys.modules.get("torch_xla.runtime")
    if runtime is None or not runtime.is_spmd():
        return None
    return runtime.addressable_runtime_device_count()


def _device_index():
    """XLA device name ("CPU:3", "TPU:0") -> its index among this process's
    devices."""
    return {name: i for i, name in
            enumerate(_xlac()._xla_get_runtime_devices())}


def _dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def _box(indices, shape):
    """(origin, extent) of a local shard's indices (a list of slices, or
    Ellipsis for the whole tensor)."""
    if indices is Ellipsis:
        return [0] * len(shape), list(shape)
    origin, extent = [], []
    for s, n in zip(indices, shape):
        start, stop, _ = s.indices(n)
        origin.append(start)
        extent.append(max(stop - start, 0))
    return origin, extent


def _padded(box, padded):
    """Restored box `box` as a local shard of shape `padded` (torch_xla pads
    the last shards of an uneven split; the padding is zeros)."""
    if list(box.shape) == list(padded):
        return box
    import torch
    full = torch.zeros(padded, dtype=box.dtype)
    full[tuple(slice(0, n) for n in box.shape)] = box
    return full


def _byte_view(t):
    """A flat uint8 view of CPU tensor `t` (made contiguous first)."""
    import torch
    return t.contiguous().reshape(-1).view(torch.uint8)


class Transfer:
    """The XLA tensors of one save (see the module's docstring)."""

    def __init__(self):
        self.calls = 0   # batched torch_xla transfer calls made
        self.shards = 0  # host copies they gave the engine
        self._items = []  # (name, tensor, shards list to fill, devices)

    def __bool__(self):
        return bool(self._items)

    def add(self, name, tensor, shards, devices):
        """XLA tensor `tensor` of array `name`: run() appends its local
        shards, as the engine takes them, to `shards` (the array's list);
        `devices` (_tree.Devices) says where host arrays are."""
        self._items.append((name, tensor, shards, devices))

    def clear(self):
        self._items = []

    def run(self):
        """Copies every added tensor to host memory (one call for the
        sharded ones, one for the rest) and fills in their shards."""
        if not self._items:
            return
        xlac = _xlac()
        tensors = [t for _, t, _, _ in self._items]
        sharded, plain = [], []
        try:
            # Their pending computation, all in one graph.
            xlac._xla_sync_multi(tensors, devices=[], wait=True,
                                 sync_xla_data=False)
            for item in self._items:
                spec = xlac._get_xla_sharding_spec(item[1])
                (sharded if spec and spec != "{replicated}" else
                 plain).append(item)
            if sharded and _process_count() > 1:
                raise ValueError(
                    f"array '{sharded[0][0]}' is a PyTorch/XLA tensor sharded "
                    f"over {_process_count()} processes: not supported yet "
                    "(one process's SPMD tensors, and unsharded tensors in "
                    "any number of processes, are)")
            copies = (xlac._get_local_shards([t for _, t, _, _ in sharded])
                      if sharded else [])
            boxes = (xlac._get_local_shard_replica_and_indices(
                [t for _, t, _, _ in sharded]) if sharded else [])
            whole = (xlac._xla_get_cpu_tensors([t for _, t, _, _ in plain])
                     if plain else [])
        except ValueError:
            raise
        except Exception as error:  # noqa: BLE001 (deleted, device, runtime)
            raise RuntimeError(self._failure(error)) from error
        self.calls += bool(sharded) + bool(plain)
        index = _device_index() if sharded else {}
        for (name, tensor, shards, devices), local, replicas in zip(
                sharded, copies, boxes):
            shape = tuple(tensor.shape)
            for (data, device), (replica, indices) in zip(local, replicas):
                if replica != 0:  # a replica of a box another shard has
                    continue
                origin, extent = _box(indices, shape)
                if 0 in extent:
                    continue
                # Padding past the box (an uneven split) is left out.
                data = data[tuple(slice(0, n) for n in extent)]
                # The host backend's device of the shard's XLA device.
                shards.append((devices.default + index[device], origin,
                               extent, _byte_view(data)))
                self.shards += 1
        for (name, tensor, shards, devices), data in zip(plain, whole):
            shape = list(tensor.shape)
            shards.extend(devices.replicated(devices.default, [0] * len(shape),
                                             shape, _byte_view(data)))
            self.shards += 1
        self.clear()

    def _failure(self, error):
        names = [name for name, _, _, _ in self._items]
        shown = ", ".join(f"'{n}'" for n in names[:4]) + (
            f" and {len(names) - 4} more" if len(names) > 4 else "")
        return (f"copying {len(names)} PyTorch/XLA tensors to host memory "
                f"(batched torch_xla calls) failed for {shown}: {error}; "
                "nothing of this save was committed")


class Placement:
    """The XLA tensors of one restore: each template's local boxes read
    into host buffers (target), then put on the devices at once (place)."""

    def __init__(self):
        self._plain = []    # (host tensor, device, slot)
        self._sharded = []  # (box tensors, padded, op sharding, shape, slot)
        self.calls = 0

    def __bool__(self):
        return bool(self._plain or self._sharded)

    def target(self, targets, name, like, aligned_bytes):
        """The restore target of XLA tensor `like` (its dtype, shape and
        sharding) as array `name`, added to `targets` (_unflatten._Targets);
        returns a slot whose [0] holds the tensor once place() has run, or
        None where the checkpoint does not match. `aligned_bytes(n)`: a new
        aligned host buffer of n bytes."""
        import torch
        saved = targets.saved_array(name)
        if saved is None:
            return None
        dtype, shape = like.dtype, list(like.shape)
        if not targets.matches(name, saved, _dtype_name(dtype), shape):
            return None
        xlac = _xlac()
        slot = [None]
        spec = xlac._get_xla_sharding_spec(like)
        if not spec or spec == "{replicated}":
            raw = aligned_bytes(math.prod(shape) * dtype.itemsize)
            host = torch.from_numpy(raw).view(dtype).reshape(shape)
            if 0 not in shape:
                targets.list.append((name, _dtype_name(dtype), shape,
                                     [(-1, [0] * len(shape), shape, raw)]))
            self._plain.append((host, str(like.device), slot))
            return slot
        if _process_count() > 1:
            raise ValueError(
                f"array '{name}': restoring onto a PyTorch/XLA tensor sharded "
                f"over {_process_count()} processes is not supported yet")
        replicas = xlac._get_local_shard_replica_and_indices([like])[0]
        boxes = [_box(indices, shape) for _, indices in replicas]
        # Every local shard has the shape of the largest (torch_xla pads
        # the last ones of an uneven split).
        padded = [max(extent[d] for _, extent in boxes)
                  for d in range(len(shape))]
        buffers, dests = {}, []
        for origin, extent in boxes:
            key = (tuple(origin), tuple(extent))
            if key in buffers:
                continue
            raw = aligned_bytes(math.prod(extent) * dtype.itemsize)
            buffers[key] = torch.from_numpy(raw).view(dtype).reshape(extent)
            if 0 not in extent:
                dests.append((-1, origin, extent, raw))
        targets.list.append((name, _dtype_name(dtype), shape, dests))
        pieces = [buffers[(tuple(origin), tuple(extent))]
                  for origin, extent in boxes]
        self._sharded.append((pieces, padded, xlac._get_xla_op_sharding(like),
                              shape, slot))
        return slot

    def place(self):
        """Puts every restored tensor on its devices: the unsharded ones in
        one call, each sharded one in one call with all of its shards."""
        if not self:
            return
        xlac = _xlac()
        if self._plain:
            placed = xlac._xla_tensors_from_aten(
                [host for host, _, _ in self._plain],
                [device for _, device, _ in self._plain])
            for tensor, (_, _, slot) in zip(placed, self._plain):
                slot[0] = tensor
            self.calls += 1
        for pieces, padded, sharding, shape, slot in self._sharded:
            slot[0] = xlac._global_tensor_from_cpu_shards(
                [_padded(piece, padded) for piece in pieces], sharding, shape)
            self.calls += 1
        self._plain, self._sharded = [], []


def figures(transfer):
    """The save's figures of this path, for SaveHandle.wait()."""
    return {"xla_transfer_calls": transfer.calls,
            "xla_shards": transfer.shards}

