"""ZeRO 1 and 2 optimizer partitions as boxes of arrays of the whole job,
so that hoist.deepspeed loads a step at another data-parallel size.

A ZeRO-1 or ZeRO-2 optimizer file holds, for each parameter group, this
rank's partition of the group's flat fp32 master weights (its padding
removed) and of each optimizer state (exp_avg, exp_avg_sq: padded, every
rank's of one size). Laid end to end in rank order they are one array per
group and kind, "zero/g{G}/{kind}" ("fp32" for the master weights), and
each rank's partition is a box of it. A job of another data-parallel size
reads the boxes of its own partitions and is handed the files DeepSpeed
would have written at its size.
"""

import re

import torch

from .._tree import _plain, _tensor_bytes, _torch_dtype_name

OPTIMIZER = "optimizer_state_dict"
_FP32 = "single_partition_of_fp32_groups"
_BASE = "base_optimizer_state"
_RANK = re.compile(r"zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")
PIECE = "hoist.deepspeed.piece:"  # stands for a partition in a structure


def marker(array, start, count):
    """What stands in a file's structure for its partition: elements
    [start, start + count) of array `array`."""
    return f"{PIECE}{array}@{start}+{count}"


def is_piece(value):
    return isinstance(value, str) and value.startswith(PIECE)


def parse(text):
    """marker()'s (array, start, count)."""
    array, _, rest = text[len(PIECE):].rpartition("@")
    start, _, count = rest.partition("+")
    return array, int(start), int(count)


def array_name(group, kind):
    return f"zero/g{group}/{kind}"


def partitions(state):
    """[(array name, tensor)] of this rank's partitions in a ZeRO 1 or 2
    optimizer file's state dict; [] for any other file (ZeRO-3's, an
    elastic layout's, a model's)."""
    optimizer = state.get(OPTIMIZER) if isinstance(state, dict) else None
    if not isinstance(optimizer, dict) or _FP32 not in optimizer or \
            "partition_count" not in optimizer:
        return []
    base = optimizer.get(_BASE)
    if not isinstance(base, dict) or not isinstance(base.get("state"), dict):
        return []
    out = [(array_name(g, "fp32"), t)
           for g, t in enumerate(optimizer[_FP32])]
    for g, group in enumerate(base.get("param_groups", [])):
        for key in group.get("params", []):
            for kind, value in base["state"].get(key, {}).items():
                if torch.is_tensor(value) and value.dim() == 1:
                    out.append((array_name(g, kind), value))
    return out


def file_rank(name):
    """The data-parallel rank a ZeRO optimizer file's name says, or None."""
    match = _RANK.search(name)
    return None if match is None else int(match.group(1))


def live_layout(engine):
    """(data-parallel size, ZeRO stage) of DeepSpeed `engine`."""
    stage = engine.zero_optimization_stage()
    optimizer = engine.optimizer
    group = getattr(optimizer, "dp_process_group", None)
    size = torch.distributed.get_world_size(group=group)
    return size, stage


def rebuilt(saved, engine, rank, lengths, read):
    """The optimizer file of data-parallel rank `rank` of `engine`'s job
    (ZeRO 1 or 2), made from `saved` (rank 0's file's state, its
    partitions not read), `lengths` (each partition array's length) and
    `read(name, start, length)`: elements [start, start + length) of array
    `name` (fewer where it ends)."""
    optimizer = saved[OPTIMIZER]
    live = engine.optimizer
    size = torch.distributed.get_world_size(group=live.dp_process_group)
    sizes = [p.numel() for p in live.single_partition_of_fp32_groups]
    fp32, paddings = [], []
    for g, length in enumerate(sizes):  # padded: every rank's the same
        total = lengths[array_name(g, "fp32")]
        start = rank * length
        fp32.append(read(array_name(g, "fp32"), start,
                         max(0, min(length, total - start))))
        paddings.append(size * length - total if rank == size - 1 else 0)
    optimizer[_FP32] = fp32
    base = optimizer[_BASE]
    for g, group in enumerate(base["param_groups"]):
        for key in group["params"]:
            state = base["state"].get(key, {})
            for kind, value in list(state.items()):
                if is_piece(value):
                    piece = read(array_name(g, kind), rank * sizes[g],
                                 sizes[g])
                    if piece.numel() < sizes[g]:  # past what was saved
                        piece = torch.cat([piece, piece.new_zeros(
                            sizes[g] - piece.numel())])
                    state[kind] = piece
    optimizer["partition_count"] = live.partition_count
    optimizer["group_paddings"] = paddings
    optimizer["param_alignment_paddings"] = live.round_robin_bit16_padding
    optimizer["param_slice_mappings"] = live._param_slice_mappings
    return saved


def all_ranks(value):
    """Every rank's `value` (torch.distributed's all_gather_object), or
    [value] in a job of one process."""
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized() or \
            dist.get_world_size() == 1:
        return [value]
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


class Partitions:
    """This rank's ZeRO partitions in the files of a save, laid end to
    end across the ranks (every rank learns every rank's sizes): their
    markers for the files' structures, and the arrays to save."""

    def __init__(self, files, rank):
        self._mine = {}  # array name -> tensor
        self.markers = {}  # id(the state's tensor) -> its marker
        held_by = {}  # array name -> id(the state's tensor)
        own = []
        for name, state in sorted(files.items()):
            found = partitions(state)
            if found:
                own.append(name)
            for array, tensor in found:
                if array in self._mine:
                    raise NotImplementedError(
                        f"hoist.deepspeed: two ZeRO optimizer files on rank "
                        f"{rank} hold {array} (model or pipeline parallel "
                        "ZeRO 1/2 is not supported)")
                self._mine[array] = _plain(array, tensor)
                held_by[array] = id(tensor)
        sizes = [(a, _torch_dtype_name(t.dtype), t.numel())
                 for a, t in sorted(self._mine.items())]
        every = all_ranks((own[:1], sizes))
        self.files = [names[0] for names, _ in every if names] \
            if all(names for names, _ in every) else []
        self._shards, self._totals = {}, {}
        for holder, (_, held) in enumerate(every):
            for array, dtype, count in held:
                start = self._totals.get(array, (dtype, 0))[1]
                self._shards.setdefault(array, []).append(
                    (holder, start, count))
                self._totals[array] = (dtype, start + count)
                if holder == rank:
                    self.markers[held_by[array]] = marker(array, start,
                                                          count)
        self._rank = rank

    def arrays(self, devices):
        """The partition arrays in the engine's terms, every rank's box."""
        out = []
        for array, (dtype, total) in sorted(self._totals.items()):
            shards = []
            for holder, start, count in self._shards[array]:
                if count == 0:
                    continue
                data = None
                device = devices.processes[holder]
                if holder == self._rank:
                    tensor = self._mine[array]
                    device = devices.of_tensor(array, tensor)
                    data = _tensor_bytes(tensor)
                shards.append((device, [start], [count], data))
            out.append((array, dtype, [total], shards))
        return out
