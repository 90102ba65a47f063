"""Values the frameworks serialize with torch.save (pickles): loaded as
plain data (torch.load's weights_only: tensors, numbers, strings,
containers) unless the caller consented to more, so that no checkpoint
runs code on load that its reader did not agree to."""

import io

import torch


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
