"""State that differs per rank (RNG states, a data loader's position):
saved by each rank, given back to the same rank.

A PerRank leaf's value is encoded as JSON: dicts (str or int keys), lists,
tuples, int/float/str/bool/None, bytes, NumPy arrays and CPU tensors
(small: it goes into the step's metadata), and objects with
state_dict()/load_state_dict() (their state dict). Each rank's encoded
values travel with the save's extent hashes to rank 0, which writes them
into the metadata as "per_rank": [rank 0's list, rank 1's, ...].
"""
import base64
import math
import sys

import numpy as np

from ._errors import DataLossError


class PerRank:
    """Wraps a leaf of a saved state whose value differs per rank, e.g.
    {"rng": hoist.PerRank({"torch": torch.get_rng_state(), "numpy":
    np.random.get_state(), "python": random.getstate()}), "data":
    hoist.PerRank(dataloader)}. restore() gives each rank back its own
    value (a stateful object, as `like`, has its state loaded in place).
    When the world size changed, restore raises ValueError unless it is
    given per_rank="all": then each PerRank leaf comes back as the list of
    every saved rank's value, for the job to re-split."""

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"PerRank({self.value!r})"


def _stateful(x):
    return (callable(getattr(x, "state_dict", None))
            and callable(getattr(x, "load_state_dict", None)))


def encode(value, where="per-rank state"):
    """`value` as a JSON-able node."""
    if value is None or isinstance(value, (bool, int, str)):
        return {"v": value}
    if isinstance(value, float):
        if math.isfinite(value):
            return {"v": value}
        return {"f": repr(value)}
    if isinstance(value, (bytes, bytearray)):
        return {"b": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        return {"np": [value.dtype.str, list(value.shape), base64.b64encode(
            np.ascontiguousarray(value).tobytes()).decode()]}
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        host = value.detach().cpu().contiguous().view(-1)
        return {"pt": [str(value.dtype).removeprefix("torch."),
                       list(value.shape), base64.b64encode(
                           host.view(torch.uint8).numpy().tobytes()).decode()]}
    if isinstance(value, dict):
        items = []
        for key, child in value.items():
            if isinstance(key, bool) or not isinstance(key, (str, int)):
                raise TypeError(f"{where}: key {key!r} is not a str or int")
            items.append([key, encode(child, f"{where}/{key}")])
        return {"d": items}
    if isinstance(value, tuple):
        return {"t": [encode(v, f"{where}/{i}") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return {"l": [encode(v, f"{where}/{i}") for i, v in enumerate(value)]}
    if _stateful(value):
        return {"s": encode(value.state_dict(), where)}
    raise TypeError(f"{where}: cannot save a {type(value).__name__} per rank "
                    "(dicts, lists, tuples, scalars, bytes, NumPy arrays, "
                    "CPU tensors, objects with state_dict())")


def decode(node):
    """The value `node` (encode's output, read from a manifest: checked)
    stands for; a stateful object's comes back as its state dict."""
    if not isinstance(node, dict) or len(node) != 1:
        raise DataLossError(f"manifest metadata: a per-rank value is "
                            f"malformed: {str(node)[:80]}")
    (kind, body), = node.items()
    try:
        if kind == "v":
            return body
        if kind == "f":
            return float(body)
        if kind == "b":
            return base64.b64decode(body)
        if kind == "np":
            dtype, shape, data = body
            return np.frombuffer(base64.b64decode(data), dtype=np.dtype(
                dtype)).reshape(shape).copy()
        if kind == "pt":
            import torch
            dtype, shape, data = body
            raw = torch.frombuffer(bytearray(base64.b64decode(data)),
                                   dtype=torch.uint8)
            return raw.view(getattr(torch, dtype)).reshape(shape)
        if kind == "d":
            return {key: decode(child) for key, child in body}
        if kind == "t":
            return tuple(decode(child) for child in body)
        if kind == "l":
            return [decode(child) for child in body]
        if kind == "s":
            return decode(body)
    except (TypeError, ValueError, AttributeError) as error:
        raise DataLossError(f"manifest metadata: a per-rank value is "
                            f"malformed: {error}") from None
    raise DataLossError(f"manifest metadata: unknown per-rank node {kind!r}")


class Values:
    """The per-rank values a restore hands out: this rank's, or with
    mode "all" every saved rank's as a list."""

    def __init__(self, saved, rank, size, mode, part=None):
        """`saved`: the metadata's "per_rank"; `part`: the manifest's
        "part" when the step is one process's local part, whose list holds
        that process's value alone."""
        if mode not in (None, "all"):
            raise ValueError("per_rank must be None or 'all'")
        if (isinstance(part, dict) and isinstance(saved, list)
                and len(saved) == 1 and part.get("processes") == size
                and part.get("process") == rank):
            saved = [saved[0] if r == rank else None for r in range(size)]
        self._saved, self._rank, self._size, self._mode = (saved, rank, size,
                                                           mode)

    @property
    def mode(self):
        return self._mode

    def get(self, index):
        saved = self._saved
        if not isinstance(saved, list) or not all(
                r is None or isinstance(r, list) and len(r) > index
                for r in saved):
            raise DataLossError("manifest metadata: the step's per-rank "
                                "state is missing or malformed")
        if self._mode == "all":
            if any(r is None for r in saved):
                raise ValueError("per_rank='all' needs a durable step: a "
                                 "local part holds its own rank's state only")
            return [decode(r[index]) for r in saved]
        if len(saved) != self._size:
            raise ValueError(
                f"the step was saved by {len(saved)} ranks and this job has "
                f"{self._size}: its per-rank state (hoist.PerRank) belongs "
                "to ranks that do not all exist; restore with "
                "per_rank='all' to get every saved rank's value and "
                "re-split it")
        if saved[self._rank] is None:
            raise DataLossError("manifest metadata: this rank's per-rank "
                                "state is missing")
        return decode(saved[self._rank][index])
