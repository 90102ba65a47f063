"""Orbax's CheckpointManager API over hoist: a JAX job switches by
changing its import.

    import orbax.checkpoint as ocp
    from hoist.orbax import CheckpointManager       # was ocp.CheckpointManager
    mgr = CheckpointManager(path, options=ocp.CheckpointManagerOptions(
        max_to_keep=3, save_interval_steps=100))
    mgr.save(step, args=ocp.args.StandardSave(state))
    state = mgr.restore(mgr.latest_step(),
                        args=ocp.args.StandardRestore(abstract_state))

Each save is one hoist step of `path` holding every item (a single
item's name is "default", as in Orbax; ocp.args.Composite names them):
global jax.Arrays saved by every process of a jax.distributed job, each
writing its share, restored onto any sharding an abstract state gives.
JSON items (JsonSave) and scalars live in the step's metadata.

Why the manager and not an Orbax CheckpointHandler: Orbax's own manager
would still lay out, write and commit each item through its handlers and
its own step directories and finalize protocol; a handler gets no say in
when a step is durable, in staging into a pinned pool, or in retention.
The manager's API is what a job calls, so taking it over entire is what
gives the job hoist's blocked time, commits, deltas and storage.
"""

import logging

import orbax.checkpoint as ocp

from .. import CheckpointManager as _HoistManager

__all__ = ["CheckpointManager"]

_LOG = logging.getLogger("hoist")
_DEFAULT_ITEM = "default"

# Args that save an item, and those that restore one (their .item: the
# tree, or the abstract tree / template).
_SAVE_ARGS = (ocp.args.StandardSave, ocp.args.PyTreeSave, ocp.args.JsonSave)
_RESTORE_ARGS = (ocp.args.StandardRestore, ocp.args.PyTreeRestore,
                 ocp.args.JsonRestore)

# CheckpointManagerOptions fields this manager honours; any other set to
# something else than its default is refused rather than ignored.
_HONOURED = {"max_to_keep", "save_interval_steps", "keep_period",
             "save_on_steps", "create", "enable_async_checkpointing",
             "cleanup_tmp_directories", "read_only"}


def _options_checked(options):
    options = options or ocp.CheckpointManagerOptions()
    default = ocp.CheckpointManagerOptions()
    unsupported = [
        name for name in vars(default)
        if name not in _HONOURED and not name.startswith("_")
        and getattr(options, name) != getattr(default, name)]
    if unsupported:
        raise NotImplementedError(
            f"hoist.orbax.CheckpointManager does not support "
            f"CheckpointManagerOptions {', '.join(sorted(unsupported))} "
            "(it honours " + ", ".join(sorted(_HONOURED)) + ")")
    return options


def _items(args, kinds, what):
    """{name: arg} of `args`: a Composite's items, else one "default"."""
    if isinstance(args, ocp.args.Composite):
        items = {name: args[name] for name in args.keys()}
    else:
        items = {_DEFAULT_ITEM: args}
    for name, arg in items.items():
        if not isinstance(arg, kinds):
            raise TypeError(
                f"item '{name}': hoist.orbax {what} takes "
                f"{', '.join('ocp.args.' + k.__name__.removesuffix('Args') for k in kinds)}"
                f" (or a Composite of them), not {type(arg).__name__}")
    return items


class CheckpointManager:
    """ocp.CheckpointManager's API and semantics over hoist: `directory`
    (a path, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX), `options` (an
    ocp.CheckpointManagerOptions: max_to_keep, save_interval_steps,
    keep_period, save_on_steps, enable_async_checkpointing and read_only
    are honoured; other non-default options are refused). Keyword
    arguments in `hoist` go to hoist.CheckpointManager (pool_bytes,
    storage_options, local_root, ...). item_names and item_handlers are
    accepted and not needed."""

    def __init__(self, directory, checkpointers=None, options=None,
                 metadata=None, item_names=None, item_handlers=None, *,
                 hoist=None):
        if checkpointers is not None:
            raise TypeError("hoist.orbax.CheckpointManager takes args= on "
                            "save and restore, not checkpointers")
        self._options = _options_checked(options)
        self._metadata = metadata
        o = self._options
        self._manager = _HoistManager(
            str(directory), keep=o.max_to_keep, keep_every=o.keep_period,
            **(hoist or {}))
        self._last_saved = self._manager.latest

    @property
    def directory(self):
        return self._manager.path

    # -- which steps -------------------------------------------------------

    def all_steps(self, read=False):
        return self._manager.steps

    def latest_step(self):
        return self._manager.latest

    def reached_preemption(self, step):
        """True once JAX's preemption sync point is reached at `step` (as
        Orbax: on every process at the same step), else False."""
        try:
            from jax.experimental import multihost_utils
            return bool(multihost_utils.reached_preemption_sync_point(step))
        except Exception:  # noqa: BLE001 (no preemption service: as Orbax)
            return False

    def should_save(self, step):
        """Orbax's rule: a step after the last one saved that is a multiple
        of save_interval_steps, one of save_on_steps, the first save of a
        root, or a preemption point."""
        o = self._options
        if o.read_only:
            return False
        last = self._last_saved
        if last is not None and last >= step:
            return False
        return ((o.save_interval_steps is not None
                 and step % o.save_interval_steps == 0)
                or (o.save_on_steps is not None and step in o.save_on_steps)
                or last is None or self.reached_preemption(step))

    # -- saving and restoring ----------------------------------------------

    def save(self, step, args=None, metrics=None, force=False):
        """Saves `args` (StandardSave, PyTreeSave, JsonSave, or a Composite
        of them) as `step` when should_save(step) or `force`: True if it
        saved. Returns once the arrays are staged (Orbax's async save),
        or once committed when enable_async_checkpointing is False."""
        if args is None:
            raise TypeError("save needs args= (ocp.args.StandardSave(...) "
                            "or ocp.args.Composite(...))")
        if self._options.read_only:
            _LOG.warning("%s is read only: step %d not saved",
                         self.directory, step)
            return False
        if not force and not self.should_save(step):
            return False
        tree = {name: arg.item for name, arg in
                _items(args, _SAVE_ARGS, "save").items()}
        handle = self._manager.save(step, tree)
        self._last_saved = step
        if not self._options.enable_async_checkpointing:
            handle.wait()
        return True

    def restore(self, step=None, args=None, directory=None):
        """The items of `step` (default: the newest): a single item's tree,
        or an ocp.args.Composite of them. An abstract tree
        (StandardRestore(abstract)) gives each array its shape, dtype and
        sharding, any sharding; without one, arrays come back as NumPy."""
        if directory is not None:
            raise TypeError("hoist.orbax restores from its own directory")
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(
                    f"no committed step in {self.directory}")
        if args is None:
            tree = self._manager.restore(step)
            if set(tree) == {_DEFAULT_ITEM}:
                return tree[_DEFAULT_ITEM]
            return ocp.args.Composite(**tree)
        items = _items(args, _RESTORE_ARGS, "restore")
        shaped = {n: a.item for n, a in items.items() if a.item is not None}
        restored = {}
        if shaped:
            restored.update(self._manager.restore(step, like=shaped))
        if len(shaped) < len(items):
            whole = self._manager.restore(step)
            missing = [n for n in items if n not in shaped and n not in whole]
            if missing:
                raise KeyError(f"step {step} of {self.directory} has no item "
                               f"{missing[0]!r} (it has {sorted(whole)})")
            restored.update({n: whole[n] for n in items if n not in shaped})
        if not isinstance(args, ocp.args.Composite):
            return restored[_DEFAULT_ITEM]
        return ocp.args.Composite(**{n: restored[n] for n in items})

    def item_metadata(self, step):
        """The step's saved arrays (name, dtype, shape), from its manifest."""
        return self._manager._manifest(step)["arrays"]

    def metadata(self, step=None):
        return self._metadata

    def delete(self, step):
        self._manager.delete(step)

    def wait_until_finished(self):
        self._manager.wait_until_finished()

    def check_for_errors(self):
        """Raises a save's error not yet reported (by waiting for them)."""
        self._manager.wait_until_finished()

    def close(self):
        self._manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
