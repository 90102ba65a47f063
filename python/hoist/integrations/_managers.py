"""The managers the framework adapters share: one open
hoist.CheckpointManager per root in a process (a root has one manager at a
time), opened by the first adapter that names the root, reused by the
others (a DCP Reader after a Writer, a Lightning load after a save)."""

import os
import threading

from .. import CheckpointManager

_LOCK = threading.Lock()
_OPEN = {}  # root key -> (manager, options it was opened with)


def root_key(root):
    """The registry's key of a root: a URL as it is, a path made absolute
    (two spellings of one directory are one root)."""
    root = os.fspath(root)
    if "://" in root:
        return root.rstrip("/")
    return os.path.abspath(root)


def open_manager(root, options):
    """The open manager of `root`, opened with `options` (keyword arguments
    of hoist.CheckpointManager) if there is none. In a job of several
    processes every rank opens it at the same point (opening is
    collective). Options given for a root that is already open must be
    those it was opened with: ValueError otherwise (close() it first)."""
    key = root_key(root)
    with _LOCK:
        held = _OPEN.get(key)
        if held is not None:
            manager, opened_with = held
            if options and options != opened_with:
                raise ValueError(
                    f"{root} is already open with {opened_with or 'defaults'}"
                    f"; asked for {options} (close it first: "
                    "hoist.integrations.close_managers)")
            return manager
        manager = CheckpointManager(root, **options)
        _OPEN[key] = (manager, dict(options))
        return manager


def close_managers(root=None):
    """Closes the managers the adapters opened (every one, or `root`'s):
    each waits for its saves in flight. Managers still open at exit are
    closed then."""
    with _LOCK:
        keys = list(_OPEN) if root is None else [root_key(root)]
        held = [_OPEN.pop(k) for k in keys if k in _OPEN]
    for manager, _ in held:
        manager.close()
