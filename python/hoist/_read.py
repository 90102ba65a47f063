"""A root's steps without a manager (no lock, no pool): read, inspect,
verify, diff; and rebuild, the state a restore of a manifest gives (the
manager's restore too)."""
import json
import os

from . import _hoist, _per_rank, _progress
from ._errors import call as _call
from ._errors import step_number
from ._options import storage_options as _storage_options
from ._unflatten import unflatten

# The metadata key that marks a step saved from Python (its "tree" is the
# state's structure).
FORMAT_KEY = "hoist.python"


def rebuild(manifest, like, names, per_rank, rank, size, run):
    """The state a restore of `manifest`'s step gives (see
    CheckpointManager.restore), its arrays read by run(targets,
    received_targets, receive)."""
    if like is not None and names is not None:
        raise ValueError("give like= or names=, not both")
    meta = manifest.get("metadata") or {}
    return unflatten(
        manifest, meta.get("tree") if meta.get(FORMAT_KEY) else None,
        like, run, names=None if names is None else list(names),
        per_rank=_per_rank.Values(meta.get("per_rank"), rank, size, per_rank,
                                  manifest.get("part")))


def step_path(root, step=None):
    """Where step `step` of root `root` (a directory or an object-store
    prefix) lies; `root` itself for step None (its newest step, or a step
    directory given as the root)."""
    root = os.fspath(root)
    if step is None:
        return root
    return f"{root.rstrip('/')}/step_{step_number(step):08d}"


def read_regions(path, step, targets, *, storage_options=None):
    """Reads engine `targets` ((name, dtype, shape, [(-1, origin, extent,
    host buffer)]): any box of each array, into dense host buffers) from
    step `step` of root `path`, every extent's XXH3 checked: the read's
    figures (bytes_read, ...). No manager and no lock, as read()."""
    _, stats = _call(_hoist.read_at, step_path(path, step), step,
                     list(targets), _storage_options(storage_options))
    return stats


def read(path, step=None, like=None, names=None, per_rank=None, *,
         storage_options=None):
    """Restores a step as CheckpointManager.restore does (like=, names=,
    per_rank= alike), without a manager: no root lock, so beside a job
    that is saving into the root, or from every rank of a job at once
    (each reading what it asks for), and no pool. `path`: a root (its step
    `step`, default the newest) or a step directory. Arrays are read into
    host memory (NumPy, CPU tensors, JAX's CPU devices; a tensor `like` on
    a GPU is copied there after); a JAX array on a GPU needs a manager.
    hoist.PerRank state comes back as to a job of one process: a step that
    several ranks saved needs per_rank="all" (every saved rank's value).
    storage_options: as CheckpointManager's."""
    at = step_path(path, step)
    options = _storage_options(storage_options)
    # The head: of a split manifest, read_at reads only the sections of the
    # arrays asked for.
    manifest = json.loads(_call(_hoist.inspect_head, at, options))

    def run(targets, received_targets, receive):
        if received_targets:
            raise ValueError("hoist.read fills host memory: JAX arrays on "
                             "GPUs are restored through a CheckpointManager")
        _call(_hoist.read_at, at, manifest["step"], list(targets), options)

    return rebuild(manifest, like, names, per_rank, 0, 1, run)


def inspect(path, *, storage_options=None):
    """The manifest of a step directory (or of a root's latest step) as a
    dict: step, metadata, arrays (name, dtype, shape, sharding, extents).
    storage_options: as CheckpointManager's."""
    return json.loads(_call(_hoist.inspect, os.fspath(path),
                            _storage_options(storage_options)))


def verify(path, *, storage_options=None, progress=None):
    """Re-reads every extent of a step directory (or of a root's latest
    step) against its hash, as `hoist verify` does: without the root's
    lock, so beside a job that is saving into it, and without a manager's
    pool. Returns (step, problems): the step read and the problems found
    (empty when intact). storage_options: as CheckpointManager's.
    progress=True shows a tqdm bar; a callable receives progress events
    (see hoist._progress)."""
    options = _storage_options(storage_options)
    step, problems = _progress.run(
        progress, "verify",
        lambda counter: _call(_hoist.verify_at, os.fspath(path), options,
                              counter))
    return step, list(problems)


def diff(root, step_a, step_b, *, root_b=None, values=False,
         storage_options=None, progress=None):
    """What changed from step `step_a` of `root` to step `step_b` of
    `root_b` (default: the same root), as `hoist diff --json` says: a dict
    with added and removed (array names), changed (one dict per array
    with a name: dtype_a/b, shape_a/b, retyped (dtype or shape differs),
    resharded, extents, changed_extents ((origin, shape) of each extent
    whose bytes changed), changed_bytes), unchanged (a count), step_a and
    step_b. From the manifests alone: no data is read, and an extent that
    references the same bytes (a delta) is unchanged. values=True also
    reads each changed array from both steps and adds its max_abs_diff
    and max_rel_diff (inf where a NaN meets a number); progress as
    verify's. storage_options: as CheckpointManager's (for both roots)."""
    options = _storage_options(storage_options)
    root_b = root if root_b is None else root_b
    return _progress.run(
        progress if values else None, "diff",
        lambda counter: _call(_hoist.diff_at, os.fspath(root),
                              step_number(step_a), os.fspath(root_b),
                              step_number(step_b), bool(values), options,
                              counter))
