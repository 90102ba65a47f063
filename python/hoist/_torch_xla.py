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
    """(origin, extent) of a local shard's indices (a list of slices with
    a start and stop each, as torch_xla gives them, or Ellipsis for the
    whole tensor)."""
    if indices is Ellipsis:
        return [0] * len(shape), list(shape)
    origin = [s.start for s in indices]
    return origin, [max(s.stop - s.start, 0) for s in indices]


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
    """A flat uint8 NumPy view of CPU tensor `t` (made contiguous first):
    the engine takes a NumPy array in a fifth of a tensor's time (no
    DLPack capsule)."""
    import torch
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


#: A repeat save's take of an unsharded tensor: the whole of it.
WHOLE = "whole"


def _shard_data(data, extent):
    """The engine's data of local shard `data` (a host copy) for a box of
    `extent`: a byte view, of the box alone where torch_xla padded it (an
    uneven split)."""
    if list(data.shape) != extent:
        data = data[tuple(slice(0, n) for n in extent)]
    return _byte_view(data)


class Transfer:
    """The XLA tensors of one save (see the module's docstring): those of a
    first save (add), described shard by shard, and those of a repeat save
    (add_again), whose shards are taken as the first save took them and go
    to the engine by address."""

    def __init__(self):
        self.calls = 0   # batched torch_xla transfer calls made
        self.shards = 0  # host copies they gave the engine
        # name -> how run() took a first save's tensor (WHOLE, or the
        # positions among its local shards, each with the extent of a
        # padded one's box): what a repeat save takes again.
        self.taken = {}
        # The host copies handed to the engine by address, which the save
        # must hold until it has copied them.
        self.host = []
        self._new = []    # (name, tensor, shards list to fill, devices)
        self._again = []  # (name, tensor, takes, out list, position)

    def __bool__(self):
        return bool(self._new or self._again)

    def add(self, name, tensor, shards, devices):
        """XLA tensor `tensor` of array `name`: run() appends its local
        shards, as the engine takes them, to `shards` (the array's list);
        `devices` (_tree.Devices) says where host arrays are."""
        self._new.append((name, tensor, shards, devices))

    def add_again(self, name, tensor, takes, out, at):
        """XLA tensor `tensor`, saved before as `name` and then taken as
        `takes` (a `taken` entry): run() puts the data of its local shards
        in out[at:]."""
        self._again.append((name, tensor, takes, out, at))

    def clear(self):
        self._new, self._again = [], []

    def run(self):
        """Copies every added tensor to host memory (one call for the
        sharded ones, one for the rest) and fills in their shards."""
        if not self:
            return
        xlac = _xlac()
        new_sharded, new_plain = [], []
        again_sharded = [i for i in self._again if i[2] is not WHOLE]
        again_plain = [i for i in self._again if i[2] is WHOLE]
        try:
            # Their pending computation, all in one graph.
            xlac._xla_sync_multi([i[1] for i in self._new + self._again],
                                 devices=[], wait=True, sync_xla_data=False)
            for item in self._new:
                spec = xlac._get_xla_sharding_spec(item[1])
                (new_sharded if spec and spec != "{replicated}" else
                 new_plain).append(item)
            if new_sharded and _process_count() > 1:
                raise ValueError(
                    f"array '{new_sharded[0][0]}' is a PyTorch/XLA tensor "
                    f"sharded over {_process_count()} processes: not "
                    "supported yet (one process's SPMD tensors, and "
                    "unsharded tensors in any number of processes, are)")
            sharded = [i[1] for i in new_sharded + again_sharded]
            plain = [i[1] for i in new_plain + again_plain]
            copies = xlac._get_local_shards(sharded) if sharded else []
            boxes = (xlac._get_local_shard_replica_and_indices(
                [i[1] for i in new_sharded]) if new_sharded else [])
            whole = xlac._xla_get_cpu_tensors(plain) if plain else []
        except ValueError:
            raise
        except Exception as error:  # noqa: BLE001 (deleted, device, runtime)
            raise RuntimeError(self._failure(error)) from error
        self.calls += bool(sharded) + bool(plain)
        self._place_new(new_sharded, copies, boxes, new_plain, whole)
        self._place_again(again_sharded, copies[len(new_sharded):],
                          again_plain, whole[len(new_plain):])
        self.clear()

    def _place_new(self, sharded, copies, boxes, plain, whole):
        """A first save's shards: each distinct box once, with its origin,
        on the host backend's device of its XLA device."""
        index = _device_index() if sharded else {}
        for (name, tensor, shards, devices), local, replicas in zip(
                sharded, copies, boxes):
            shape = tuple(tensor.shape)
            takes = self.taken[name] = []
            for position, ((data, device), (replica, indices)) in enumerate(
                    zip(local, replicas)):
                if replica != 0:  # a replica of a box another shard has
                    continue
                origin, extent = _box(indices, shape)
                if 0 in extent:
                    continue
                padded = list(data.shape) != extent
                takes.append((position, extent if padded else None))
                shards.append((devices.default + index[device], origin,
                               extent, _shard_data(data, extent)))
                self.shards += 1
        for (name, tensor, shards, devices), data in zip(plain, whole):
            shape = list(tensor.shape)
            self.taken[name] = WHOLE
            shards.extend(devices.replicated(devices.default, [0] * len(shape),
                                             shape, _byte_view(data)))
            self.shards += 1

    def _place_again(self, sharded, copies, plain, whole):
        """A repeat save's shards, in the first save's order: by address
        (the host copies held in self.host), or a byte view of a padded
        shard's box."""
        for (_, _, takes, out, at), local in zip(sharded, copies):
            for offset, (position, extent) in enumerate(takes):
                data = local[position][0]
                out[at + offset] = (self._address(data) if extent is None
                                    else _shard_data(data, extent))
            self.shards += len(takes)
        for (_, _, _, out, at), data in zip(plain, whole):
            out[at] = self._address(data)
            self.shards += 1

    def _address(self, data):
        """Host copy `data` by address (held until the save has copied
        it), or a byte view where it is not dense or is empty."""
        if not data.is_contiguous() or data.numel() == 0:
            return _byte_view(data)
        self.host.append(data)
        return data.data_ptr()

    def _failure(self, error):
        names = [item[0] for item in self._new + self._again]
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
        self._waited = False
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
        if targets.matching(name, like) is None:
            return None
        dtype, shape = like.dtype, list(like.shape)
        xlac = _xlac()
        if not self._waited:
            # A template whose data an async execution (the last step's) is
            # still making cannot be read, not even its sharding.
            xlac._xla_wait_device_ops(devices=[])
            self._waited = True
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

