"""The manager's options as the engine takes them: the engine's defaults
(hoist._hoist.ManagerOptions, each written once, in C++) and the checks of
what Python callers give."""
import numpy as np

from . import _hoist


def frozen_names(frozen):
    """frozen as the extension takes it: None, a callable, or a list of
    names (a single name is refused: it would be taken letter by letter)."""
    if frozen is None or callable(frozen):
        return frozen
    if isinstance(frozen, (str, bytes)):
        raise TypeError("frozen: a list of array names or a callable, not "
                        "one string")
    names = list(frozen)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"frozen: {name!r} is not an array name")
    return names


def storage_options(options):
    """storage_options as the extension takes them: names to strings."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError("storage_options must be a dict")
    return {str(k): str(v) for k, v in options.items()}


def budget(value):
    """host_memory_budget for the engine: bytes, 0 for "auto"."""
    if isinstance(value, str) and value == "auto":
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or value < 1:
        raise ValueError(f"host_memory_budget={value!r}: give bytes (an int "
                         "> 0, at least pool_bytes) or 'auto'")
    return int(value)


def shared_reads(value):
    """shared_reads= as the engine's: "auto", "always" or "never"."""
    if isinstance(value, str) and value == "auto":
        return "auto"
    if isinstance(value, bool):
        return "always" if value else "never"
    raise ValueError(f"shared_reads={value!r}: use 'auto', True or False")


# The engine's defaults (CheckpointManagerOptions), which CheckpointManager
# takes as its own: each is written once, in C++.
DEFAULTS = _hoist.ManagerOptions()


def manager_options(storage_options, frozen, **fields):
    """The engine's options (ManagerOptions) with `fields` set; an enum's
    unknown name is a ValueError naming the names it takes."""
    options = _hoist.ManagerOptions()
    for name, value in fields.items():
        setattr(options, name, value)
    options.set_storage_options(storage_options)
    options.set_frozen(frozen)
    return options
