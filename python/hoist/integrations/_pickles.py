"""Values the frameworks serialize with torch.save (pickles): loaded as
plain data (torch.load's weights_only: tensors, numbers, strings,
containers) unless the caller consented to more, so that no checkpoint
runs code on load that its reader did not agree to."""

import io

import numpy as np
import torch

from .. import PerRank

# A leaf hoist's tree cannot hold (an object, a dict keyed otherwise than by
# str or int) is kept as torch.save's bytes under this one key.
_PICKLED = "hoist.pickled"


def load(data, where, consent, trusted=False):
    """The value torch.save wrote as `data`. Unless `trusted`, only plain
    data: anything else is a ValueError naming `where` and the global it
    refers to, and saying how to consent (`consent`: "pass
    allow_pickle=True to ...")."""
    try:
        return torch.load(io.BytesIO(data), weights_only=not trusted)
    except Exception as error:  # noqa: BLE001 (any unpickling error)
        if trusted:
            raise
        why = [line.strip() for line in str(error).splitlines()
               if "Unsupported global" in line]
        raise ValueError(
            f"{where}: a pickled object that is not plain data "
            f"({(why or ['refused by torch.load(weights_only=True)'])[0]}); "
            f"{consent} for a checkpoint you trust") from None


def encodable(value):
    """`value` as a hoist tree: dicts keyed by str or int, lists, tuples,
    tensors, arrays and scalars as they are; any other leaf as its
    torch.save bytes (decoded() loads them)."""
    if isinstance(value, (torch.Tensor, np.ndarray, bool, int, float, str,
                          type(None), PerRank)):
        return value
    if isinstance(value, dict) and all(
            isinstance(k, (str, int)) and not isinstance(k, bool)
            for k in value) and _PICKLED not in value:
        return {k: encodable(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(encodable(v) for v in value)
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return {_PICKLED: np.frombuffer(buffer.getvalue(), np.uint8)}


def decoded(value, where, consent, trusted=False):
    """The tree encodable() made, its pickled leaves loaded (see load();
    `where` names the tree in errors)."""
    if isinstance(value, dict):
        if set(value) == {_PICKLED}:
            return load(value[_PICKLED].tobytes(), where, consent, trusted)
        return {k: decoded(v, f"{where}/{k}", consent, trusted)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(decoded(v, f"{where}/{i}", consent, trusted)
                           for i, v in enumerate(value))
    return value
