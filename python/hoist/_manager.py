"""CheckpointManager and SaveHandle: saves and restores of pytrees through
the engine (hoist._hoist.Manager)."""
import atexit
import copy
import json
import logging
import os
import sys
import weakref

import ml_dtypes  # noqa: F401  (registers bfloat16 and float8 with numpy)

from . import _hoist, _progress, _repeat
from ._dist import JaxCoordinator, TorchCoordinator, job_coordinator
from ._errors import call as _call
from ._errors import step_number
from ._options import DEFAULTS
from ._options import budget as _budget
from ._options import frozen_names as _frozen_names
from ._options import manager_options as _manager_options
from ._options import shared_reads as _shared_reads
from ._options import storage_options as _storage_options
from ._read import FORMAT_KEY
from ._read import rebuild as _rebuild
from ._tree import Devices, flatten, gc_paused
from . import _torch_xla
from ._xla_staging import Staging, produced_positions, produced_shards

_LOG = logging.getLogger("hoist")


class SaveHandle:
    """One save in flight: wait for it, or poll it."""

    def __init__(self, handle, tier=None, figures=None):
        self._handle = handle
        self._tier = tier
        self._figures = figures or {}  # the Python side's: its staging

    @property
    def tier(self):
        """Where the step goes: "durable", "local" (the local tier), or
        None when it is not saved (skipped, or neither a durable nor a
        local step)."""
        return None if self._handle.skipped else self._tier

    @property
    def replicated_bytes(self):
        """The bytes of extents this process sent its replica holders (a
        local step; 0 otherwise): those of its part that fewer than
        `replicas` processes hold (0 where a data-parallel replica holds
        every box). Once the save has committed (this waits for it)."""
        return self.wait()["replicated_bytes"]

    @property
    def step(self):
        return self._handle.step

    @property
    def skipped(self):
        """True when the save was skipped (when_busy="skip" while earlier
        saves were still being written): nothing was saved, and every wait
        returns at once."""
        return self._handle.skipped

    def wait_staged(self):
        """Returns once every byte is off the devices: the arrays may change."""
        _call(self._handle.wait_staged)

    def wait_staged_on(self, stream=None):
        """Orders a CUDA stream after this save's copies, without blocking
        the CPU until they finish (backend="cuda"): returns once every copy
        is enqueued, having made `stream` wait (on the GPU) for them, so
        kernels queued on it afterwards may overwrite the arrays. `stream`:
        a torch.cuda.Stream (anything with a `cuda_stream` attribute), a
        cudaStream_t as an int, or None for the default stream. With the
        host backend it is wait_staged(). JAX exposes no streams: use
        wait_staged() there. A failed copy still fails wait()."""
        handle = getattr(stream, "cuda_stream", stream)
        _call(self._handle.wait_staged_on, int(handle or 0))

    def wait(self):
        """Returns once the step is durable and visible, with its figures:
        bytes, referenced_bytes (of bytes, those not written: the same as
        the newest committed step's, referenced there), tier,
        replicated_bytes, dispatches, staged_s, committed_s, path,
        overflow_bytes (staged into host memory beside the pool),
        stalled_bytes and blocked_reason (None, or why save() waited for
        storage: the state exceeded host_memory_budget), elapsed_s (the
        whole save on this rank), phases ({"planning": {"seconds",
        "bytes", "rank"}, "queued", "staging", "write" or "upload",
        "hash", "commit", "retention"}: this rank's, adding up to
        elapsed_s) and slowest (the job's slowest rank in each phase up to
        write); docs/observability.md. A save of JAX arrays adds
        pjrt_transfer_calls and pjrt_shards: the batched transfers (one per
        wave: one per save the pool holds; or none) that staged shards the
        backend cannot read by address, and their shards (docs/xla.md); of PyTorch/XLA tensors,
        xla_transfer_calls (at most 2: the sharded ones, the rest) and
        xla_shards."""
        info = _call(self._handle.wait)
        info.update(self._figures)
        return info

    def done(self):
        """True once the save has committed or failed."""
        return self._handle.done()

    def progress(self):
        """(bytes staged, bytes written, total bytes) of this save."""
        return self._handle.progress()


def _staged(handle):
    """Whether the engine's save `handle` has every byte in its pool (or is
    over)."""
    staged, _, total = handle.progress()
    return staged >= total or handle.done()


def _same_value(a, b):
    """a == b, False where comparing fails or is not a bool (arrays)."""
    try:
        return (a == b) is True
    except Exception:  # noqa: BLE001 (any __eq__ may raise)
        return False


class _Repeat:
    """What a repeat save of the last structure needs: its plan (see
    _repeat.fast_plan), the engine's generation of that save, and its
    metadata: the dict (whose "tree" is the plan's skeleton), the user's
    part, and the JSON text."""

    def __init__(self, plan, generation, meta, user, text):
        self.plan, self.generation = plan, generation
        self.meta, self.user, self.text = meta, user, text


class CheckpointManager:
    """Saves and restores the steps of one checkpoint root.

    path:          the root directory (created if needed), or a prefix on an
                   object store: "s3://BUCKET/PREFIX" or "gs://BUCKET/PREFIX"
                   (see docs/object-storage.md); one manager per root at a
                   time (on a filesystem a second one gets ValueError).
    keep:          keep the newest N steps (None: all).
    keep_every:    also keep every step divisible by this.
    pool_bytes:    the pinned staging pool, allocated once (default 1 GiB);
                   larger saves stage in waves, so host memory stays bounded.
    host_memory_budget:
                   what a save may hold in host memory: the pool plus the
                   overflow where the waves of a save larger than the pool
                   are staged (allocated by the first save that needs it,
                   then kept), so save() waits only for the copies. Bytes
                   (at least pool_bytes), or "auto" (default: half the
                   memory available at open, split among the job's
                   processes on this host). A save larger than the budget
                   waits for storage to free memory, logs a warning once,
                   and its wait() says why (blocked_reason).
    backend:       "host" (arrays in host memory: NumPy, CPU tensors, JAX's
                   CPU devices) or "cuda" (arrays in GPU memory).
    staging:       how JAX shards the backend cannot read by address (on a
                   TPU, or in a layout that is not row-major) reach it:
                   "auto" (default) stages just those, "pjrt" every JAX
                   shard, through one batched jax.device_put to pinned_host
                   per wave as the engine stages them (docs/xla.md).
    num_devices:   host backend devices; default: JAX's device count when
                   JAX is imported (its local devices in a multi-process
                   job), else PyTorch/XLA's local devices when its SPMD
                   mode is on, else 1. JAX device ids must be below it.
    max_in_flight: saves accepted before a save waits for an earlier commit.
    writers:       writer streams (files) per process; default: the
                   root's storage chooses (2 on a local filesystem, 4 on
                   S3, 16 on GCS).
    io:            "posix" or "io_uring".
    background_priority:
                   "low" (default: nice + 10), "idle" (SCHED_IDLE) or
                   "normal": the priority of the threads that write, hash
                   and commit, so the training loop's threads run first.
    coordinator:   how the processes of a job agree on each save. "auto"
                   (default): over torch.distributed when it is initialized
                   with several ranks (torchrun), else over JAX's
                   distributed runtime when jax.distributed has several
                   processes, else a single process. "single" forces one
                   process; or a coordinator object (TorchCoordinator,
                   JaxCoordinator, or your own: see hoist._dist). Every
                   rank opens the same path; rank 0 holds the root's lock
                   and commits each step once every rank has written its
                   share.
    when_busy:     what save() does when max_in_flight saves are still
                   being written (slow or stuck storage): "wait" (default:
                   for the oldest to commit) or "skip" (return at once with
                   handle.skipped True, log it, and go on; durability()
                   reports how far the committed steps trail). One process
                   only: in a job of several every rank would have to skip
                   the same saves.
    coordinator_timeout_s:
                   how long a rank waits for the others at each point of a
                   save (default 600 s); then the save fails on every rank
                   that is left, naming the ranks that did not arrive, and
                   the step never becomes visible.
    deltas:        True (default): a save writes only the arrays' pieces
                   whose bytes changed since the newest committed step and
                   references the rest there (frozen weights are written
                   once; see docs/delta.md). save(deltas=False) turns it
                   off for one save, deltas=False here for every one.
    split_manifest_above_extents:
                   a step's manifest is written split (format hoist/3:
                   a head, then each array's extents in a section read only
                   when the array is) above this many extents (default
                   65,536; 0: always); docs/format.md.
    persist_every: only steps divisible by this go to the durable root
                   (default 1: every step); with a local tier the others
                   go there (docs/tiers.md).
    local_root:    a local tier: each process's own fast storage, "{rank}"
                   replaced by its rank ("/dev/shm/ckpt/{rank}", a node's
                   NVMe). Steps divisible by local_every that are not
                   durable steps are saved there, and the boxes of each
                   process's part that fewer than `replicas` processes
                   hold sent to peers (over the coordinator's exchange();
                   a data-parallel replica's boxes are not sent); restore
                   takes the newest step either tier can rebuild,
                   rebuilding a lost part from the processes that hold
                   its boxes.
    local_every, replicas, local_keep_last:
                   the local tier's: every Nth step (default 1), holders
                   of each box (default 2: data-parallel replicas count),
                   local steps kept (default 2).
    frozen:        arrays that never change (a fine-tune's frozen base):
                   a list of their names ("model/embed/w"), or a callable
                   taking a name and returning True for a frozen one. A
                   frozen array is copied and written once; later saves
                   do not even copy it off the devices (blocked time
                   drops with it) and reference its bytes.
    frozen_check_every:
                   copy and check the frozen arrays every Nth of those
                   saves anyway (default 0: never); a save whose frozen
                   array changed fails with a precondition error naming
                   it.
    shared_reads:  in a job of several processes, whether a durable
                   restore reads each saved byte once per job: a box
                   several ranks need (data-parallel replicas) is read by
                   one of them and sent to the others over the
                   coordinator's exchange(). "auto" (default): when the
                   root is on an object store or the job spans several
                   hosts; on one host with a local root each rank reads
                   for itself (faster there). True: always; False: never.
                   Unless False, every rank must call restore together.
    storage_options:
                   for an s3:// or gs:// root, what overrides the
                   environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...,
                   STORAGE_EMULATOR_HOST): a dict with any of "endpoint",
                   "region", "access_key_id", "secret_access_key",
                   "session_token", "request_timeout_s",
                   "connect_timeout_s", "max_attempts", "retry_budget"
                   (docs/robustness.md), "profile" (an AWS
                   profile whose keys and region ~/.aws holds).
    metrics_path:  a file each save and restore appends its phases to, one
                   JSON line per phase of this rank ("{rank}" replaced by
                   the rank; docs/observability.md). A path that cannot be
                   opened for appending is an error here, never mid-save.
                   hoist.metrics.PrometheusCollector exports the same
                   phases to Prometheus.
    stall_warn_s:  a save that moves no bytes for this long logs a warning
                   on the "hoist" logger naming its phase, the rank and the
                   file or object (default 60; 0: never); it goes on. So
                   does a restore that reads none, naming what it reads.
    preemption_signals:
                   signals that announce a preemption, e.g.
                   (signal.SIGTERM,) as Slurm and Kubernetes send it
                   (default: none). Their handler only notes the signal and
                   calls any handler installed before the manager opened
                   (install yours first); the signal no longer ends the
                   process: ask reached_preemption(step) every step, save
                   that step, and exit (docs/robustness.md).
    preemption_deadline_s:
                   the preemption save fails on every rank unless it
                   commits within this many seconds of the rank learning
                   of the preemption (default 30; no partial step is ever
                   visible); also how long ranks wait for each other to
                   agree on the step.
    preemption_poll_s:
                   how often each rank looks for the signal and at the
                   other ranks' notices (default 1 s: one request to the
                   job's store per rank per second).
    """

    def __init__(self, path, *, keep=None, keep_every=None,
                 pool_bytes=DEFAULTS.pool_bytes, backend="host",
                 num_devices=None, max_in_flight=DEFAULTS.max_in_flight,
                 writers=None, io=DEFAULTS.io,
                 background_priority=DEFAULTS.background_priority,
                 when_busy=DEFAULTS.when_busy, coordinator="auto",
                 coordinator_timeout_s=600.0, storage_options=None,
                 deltas=DEFAULTS.deltas, frozen=None,
                 split_manifest_above_extents=(
                     DEFAULTS.split_manifest_above_extents),
                 frozen_check_every=DEFAULTS.frozen_check_every,
                 persist_every=DEFAULTS.persist_every, local_root=None,
                 local_every=DEFAULTS.local_every,
                 replicas=DEFAULTS.replicas,
                 local_keep_last=DEFAULTS.local_keep_last,
                 shared_reads=DEFAULTS.shared_reads,
                 host_memory_budget="auto", metrics_path=None,
                 stall_warn_s=DEFAULTS.stall_warn_s, preemption_signals=(),
                 preemption_deadline_s=DEFAULTS.preemption_deadline_s,
                 preemption_poll_s=DEFAULTS.preemption_poll_s,
                 staging="auto"):
        if keep is not None and keep < 1:
            raise ValueError("keep must be >= 1 (or None to keep every step)")
        Staging(staging)  # checks it before anything opens
        self._staging = staging
        # A coordinator hoist makes is hoist's to close; a caller's is not.
        self._owned_coordinator = None
        if coordinator == "auto":
            coordinator = job_coordinator(coordinator_timeout_s)
            self._owned_coordinator = coordinator
        elif coordinator == "single":
            coordinator = None
        elif isinstance(coordinator, str):
            raise ValueError(f"coordinator {coordinator!r}: use 'auto', "
                             "'single' or a coordinator object")
        options = _call(
            _manager_options, pool_bytes=int(pool_bytes),
            host_memory_budget=_budget(host_memory_budget),
            keep_last=int(keep or 0), keep_every=int(keep_every or 0),
            max_in_flight=int(max_in_flight), writers=int(writers or 0),
            io=io, background_priority=background_priority,
            when_busy=when_busy, deltas=bool(deltas),
            split_manifest_above_extents=int(split_manifest_above_extents),
            frozen_check_every=int(frozen_check_every),
            persist_every=int(persist_every),
            local_root=os.fspath(local_root or ""),
            local_every=int(local_every), replicas=int(replicas),
            local_keep_last=int(local_keep_last),
            shared_reads=_shared_reads(shared_reads),
            metrics_path=os.fspath(metrics_path or ""),
            stall_warn_s=float(stall_warn_s),
            preemption_signals=[int(s) for s in preemption_signals],
            preemption_deadline_s=float(preemption_deadline_s),
            preemption_poll_s=float(preemption_poll_s),
            storage_options=_storage_options(storage_options),
            frozen=_frozen_names(frozen))
        try:
            self._open(path, coordinator, backend, num_devices, options)
        except BaseException:
            self._close_coordinator()
            raise
        _OPEN.add(self)
        # The engine's figures for the last restore(): bytes_read,
        # target_bytes (what was asked for: bytes_read / target_bytes is the
        # read amplification), extents_read, dispatches, waves, elapsed_s
        # (None before one).
        self.last_restore = None
        # The last save's structure, for a repeat save (see _save_again).
        self._repeat = None
        # Whether a save that waited for storage was logged (once).
        self._stall_logged = False
        # The engine's handles of saves whose every shard was staged
        # through PJRT (_xla_staging.Staging.owns): save() returned before
        # the engine had copied those host copies, which a handle holds
        # until it has; kept here so that a caller dropping its handle does
        # not wait for that copy. Let go once staged.
        self._held = []

    def _open(self, path, coordinator, backend, num_devices, options):
        rank = coordinator.rank if coordinator is not None else 0
        self._rank = rank
        self._size = coordinator.size if coordinator is not None else 1
        first, num_devices, ordinals = _local_devices(
            backend, num_devices, coordinator)
        self._backend = _call(_hoist.Backend, backend, num_devices, first,
                              ordinals)
        device_ids = self._backend.device_ids()
        processes = [device_ids[0]]
        if coordinator is not None and coordinator.size > 1:
            processes = [int(d) for d in coordinator.all_gather(
                "python devices", str(device_ids[0]).encode())]
        self._devices = Devices(
            backend, device_ids[0], processes, rank,
            {self._backend.ordinal(d): d for d in device_ids}
            if backend == "cuda" else None)
        self._manager = _call(_hoist.Manager, os.fspath(path), self._backend,
                              options, coordinator)
        self._options = options

    # -- saving ------------------------------------------------------------

    def save(self, step, state, *, metadata=None, return_when="staged",
             deltas=None):
        """Saves `state` (a pytree) as `step`, an integer (an int, or a
        NumPy/framework integer; a float or a string is a TypeError).

        Arrays become named by their path ("model/layers/0/w"); every other
        leaf (int, float, str, bool, None) goes into the manifest's metadata
        and comes back in place. Returns a SaveHandle once the arrays are
        copied off the devices (return_when="staged", the default) or once
        the copies are enqueued ("dispatched": call handle.wait_staged()
        before changing the arrays). Writing and committing continue in the
        background. Non-contiguous arrays are copied first. `deltas`
        (True/False) overrides the manager's for this save.
        """
        step = step_number(step)
        if return_when not in ("staged", "dispatched"):
            raise ValueError("return_when must be 'staged' or 'dispatched'")
        dispatched = return_when == "dispatched"
        if deltas is not None:
            deltas = bool(deltas)
        staging = Staging(self._staging, self._devices.kind)
        handle = self._save_again(step, state, metadata, dispatched, deltas,
                                  staging)
        if handle is None:
            self._repeat = None  # until this save is accepted and planned
            with gc_paused():  # many arrays make many objects
                arrays, skeleton, per_rank = flatten(state, self._devices,
                                                     staging)
                meta = {FORMAT_KEY: 1, "tree": skeleton}
                if metadata is not None:
                    meta["user"] = metadata
                text = _metadata_text(meta)
                owned = staging.owns_all(arrays)
                # Planned before the deferred shards become None below.
                plan = _repeat.fast_plan(skeleton, arrays, state, staging)
                produced = produced_shards(arrays) if staging.deferred else []
                try:
                    handle = _call(self._manager.save, step, arrays, text,
                                   dispatched or owned, deltas,
                                   json.dumps(per_rank) if per_rank else "",
                                   produced, staging.produce)
                finally:
                    staging.forget()
            self._repeat = None if plan is None else _Repeat(
                plan, self._manager.generation, meta,
                copy.deepcopy(metadata), text)
        if staging.owned and not dispatched:
            self._held = [h for h in self._held if not _staged(h)]
            self._held.append(handle)
        return self._handle(step, handle, staging.figures())

    def _handle(self, step, handle, figures=None):
        """The SaveHandle of the engine's `handle` (with `figures` of its
        staging for wait()), the skip logged, and (once per manager) a
        save that waited for storage."""
        if not self._stall_logged and handle.stalled_bytes() > 0:
            self._stall_logged = True
            _LOG.warning(
                "hoist: step %d: save() waited for storage to write %.2f GiB "
                "of this process's %.2f GiB: the state exceeds "
                "host_memory_budget (the staging pool plus its overflow in "
                "host memory); raise host_memory_budget to return once the "
                "arrays are copied. Logged once.", step,
                handle.stalled_bytes() / 2**30, handle.progress()[2] / 2**30)
        if handle.skipped:
            lag = self.durability()
            _LOG.warning(
                "hoist: step %d skipped: %d saves still being written "
                "(storage slow or stuck); last committed step %s; %d "
                "skipped so far", step, lag["in_flight"],
                lag["last_committed_step"], lag["skipped_saves"])
        return SaveHandle(handle, handle.tier, figures)

    def _save_arrays(self, step, arrays, meta, per_rank=None,
                     return_when="staged", deltas=None):
        """Saves arrays already in the engine's terms (_tree._Array: every
        device's box, data for this process's) with metadata `meta` (a
        dict) and this rank's per-rank node (JSON-able; every rank gives
        one or none does): a SaveHandle. What the framework adapters
        (hoist.integrations) save through; the step is an ordinary one."""
        step = step_number(step)
        if return_when not in ("staged", "dispatched"):
            raise ValueError("return_when must be 'staged' or 'dispatched'")
        self._repeat = None
        handle = _call(self._manager.save, step, arrays, _metadata_text(meta),
                       return_when == "dispatched",
                       None if deltas is None else bool(deltas),
                       "" if per_rank is None else json.dumps(per_rank))
        return self._handle(step, handle)

    def _save_again(self, step, state, metadata, dispatched, deltas,
                    staging):
        """A save of the same structure as the last one (same dicts, array
        names, dtypes and shapes), without describing every array again:
        its handle, or None when the structure differs (save() then walks
        it whole)."""
        repeat = self._repeat
        if repeat is None:
            return None
        found = _repeat.match(state, repeat.plan, staging)
        if found is None:
            self._repeat = None  # its skeleton may hold this state's scalars
            return None
        arrays, changed, keep = found
        if changed or not _same_value(metadata, repeat.user):
            meta = repeat.meta
            if metadata is not None:
                meta["user"] = metadata
            else:
                meta.pop("user", None)
            repeat.text = _metadata_text(meta)
            repeat.user = copy.deepcopy(metadata)  # the caller's may change
        owned = staging.owns(len(arrays))
        produced = produced_positions(arrays) if staging.deferred else []
        try:
            return _call(self._manager.save_again, step, repeat.generation,
                         arrays, repeat.text, dispatched or owned, deltas,
                         keep or None, produced, staging.produce)
        finally:
            staging.forget()

    def durability(self):
        """How far the committed steps trail the saves: skipped_saves (by
        when_busy="skip"), in_flight (accepted, not yet committed),
        last_committed_step and last_committed_unix_s (None before one)."""
        return _call(self._manager.durability)

    def wait_until_finished(self):
        """Waits for every save in flight; raises the first error not yet
        reported."""
        _call(self._manager.wait_until_finished)
        self._held = []

    # -- restoring ---------------------------------------------------------

    def restore(self, step=None, like=None, names=None, per_rank=None,
                progress=None):
        """Restores `step` (default: the latest).

        like=None rebuilds the saved pytree with NumPy arrays for NumPy and
        JAX leaves and CPU tensors for PyTorch ones. Otherwise the result is
        shaped like `like`: a jax.Array or jax.ShapeDtypeStruct leaf comes
        back as a jax.Array with that leaf's sharding (any sharding, not
        only the saved one), a tensor as a tensor on its device, a NumPy
        array as a NumPy array; other leaves take the saved values.

        Only what is asked for is read: a `like` holding some of the saved
        leaves restores those, and names=["params/w", ...] (array names, as
        inspect() lists them) restores just those arrays as a flat dict
        name -> array. An array the step does not hold is a KeyError naming
        it. mgr.last_restore has the engine's figures: bytes_read (from
        storage, this process), bytes_received (with a local tier: of the
        parts it got from peers), tier ("local" or "durable": where the
        step came from, the same on every rank), step, note (with a local
        tier, which replicas served which ranks), elapsed_s, phases
        (planning, read, verify, place: docs/observability.md), ...

        progress=True shows a tqdm bar of the bytes read; a callable
        receives progress events instead (see hoist._progress).

        In a job of several processes (unless shared_reads=False, and
        with a local tier), every rank of the job must call restore
        together: the ranks may share the reading (each byte read once
        per job).

        hoist.PerRank leaves come back to the rank that saved them; when
        the world size changed, restore raises ValueError unless
        per_rank="all" (each then comes back as the list of every saved
        rank's value).
        """
        if like is not None and names is not None:
            raise ValueError("give like= or names=, not both")
        if step is not None:
            step = step_number(step)
        # The step (the newest of either tier unless asked for) and its
        # manifest, before any array is read; with a local tier, every
        # rank takes part, and a lost part is rebuilt from the processes
        # that hold its boxes.
        step, manifest, prepared = self._prepare_restore(step)

        def rebuild(counter):
            def run(targets, received_targets, receive):
                self._restore_targets(step, prepared, targets,
                                      received_targets, receive, counter)

            return _rebuild(manifest, like, names, per_rank, self._rank,
                            self._size, run)

        return _progress.run(progress, "restore", rebuild)

    def pin_pool(self):
        """Starts faulting in the staging pool in the background, if it is
        still to do. A manager opened on a root with steps leaves that to
        the first save, so that a restore holds no memory it does not use;
        a job that wants its first save after a restore to find the pool
        ready calls this once its restored state is in place."""
        self._manager.pin_pool()

    def _prepare_restore(self, step):
        """(step, its manifest as a dict, what _restore_targets needs):
        the step to restore (`step`, or the newest of either tier), chosen
        before any array is read; with a local tier every rank takes part,
        and a lost part is rebuilt from the processes holding its boxes."""
        step, _, text, note, received = _call(self._manager.prepare_restore,
                                              step)
        return step, json.loads(text), (note, received)

    def _restore_targets(self, step, prepared, targets, received_targets=(),
                         receive=None, progress=None):
        """Reads `targets` (the engine's restore targets: name, dtype,
        shape, [(-1, origin, extent, uint8 buffer)]) of the step
        _prepare_restore chose, counting into `progress` (a
        _hoist.Progress) when given; sets last_restore."""
        note, received = prepared
        self.last_restore = _call(self._manager.restore, step, list(targets),
                                  list(received_targets), receive, progress)
        if note:  # the choice, made (and parts fetched) before
            self.last_restore["note"] = note
        self.last_restore["bytes_received"] += received

    def metadata(self, step=None):
        """The user metadata saved with `step` (default: the latest): what
        save(metadata=...) stored, or, for a step saved otherwise (the C++
        API, `hoist import`), its manifest's metadata."""
        step = self.latest if step is None else step_number(step)
        if step is None:
            raise FileNotFoundError(f"no committed step in {self._manager.root}")
        meta = self._manifest(step).get("metadata") or {}
        # A step saved from Python keeps its user metadata beside the
        # tree; any other (C++, `hoist import`) is its metadata.
        return meta.get("user") if meta.get(FORMAT_KEY) else meta

    def _manifest(self, step):
        return json.loads(_call(self._manager.manifest, step))

    # -- the root ----------------------------------------------------------

    @property
    def steps(self):
        """Committed steps, ascending."""
        return list(_call(self._manager.steps))

    @property
    def latest(self):
        """The newest committed step, or None."""
        steps = self.steps
        return steps[-1] if steps else None

    @property
    def path(self):
        return self._manager.root

    def verify(self, step, *, progress=None):
        """Re-reads every extent of `step` against its hash: the list of
        problems found (empty when intact). progress: as restore's."""
        step = step_number(step)
        return list(_progress.run(
            progress, "verify",
            lambda counter: _call(self._manager.verify, step, counter)))

    def reached_preemption(self, step):
        """Whether to save `step` and stop because the job is being
        preempted: True on every rank at the same step, the first that
        every rank reaches after any rank got one of preemption_signals
        (or note_preemption()), and at every later one; always False
        without preemption_signals. Call it every step, steps never
        decreasing; until a notice it costs a lock, no collective (the
        ranks agree on a background thread). Then save(step, state) is the
        preemption save: to the local tier when there is one, else to the
        durable root, without pruning old steps, and its wait() raises
        TimeoutError on every rank if it cannot commit within
        preemption_deadline_s. TimeoutError here too when the other ranks
        did not say their step within that time."""
        return _call(self._manager.reached_preemption, step_number(step))

    def note_preemption(self):
        """This rank learned of a preemption by other means (a scheduler's
        API, a cloud's metadata server): as if it had got the signal.
        ValueError without preemption_signals."""
        _call(self._manager.note_preemption)

    def _take_phase_reports(self):
        """The phases of every save and restore since the last call (the
        newest 10,000), oldest first: dicts with kind ("save" or
        "restore"), step, tier, elapsed_s, phases and slowest (as wait()
        has them). hoist.metrics.PrometheusCollector reads them."""
        return list(self._manager.take_phase_reports())

    def delete(self, step):
        _call(self._manager.delete, step_number(step))

    @property
    def rank(self):
        """This process's rank in the job (0 in a single process)."""
        return self._devices.rank

    def close(self):
        """Waits for every save, then releases the root. In a job of
        several processes every rank closes (each waits for the commits
        its rank takes part in)."""
        _OPEN.discard(self)
        try:
            _call(self._manager.close)
        finally:
            self._held = []
            self._close_coordinator()

    def _close_coordinator(self):
        if self._owned_coordinator is not None:
            self._owned_coordinator.close()
            self._owned_coordinator = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _local_devices(backend, num_devices, coordinator):
    """(first device id, number of devices, CUDA ordinals) of this process.
    Device ids are job-wide: JAX's own ids in a JAX job (each process's
    local devices, which JAX numbers consecutively); else rank x devices
    per process; a torchrun rank drives its current CUDA device."""
    jax = sys.modules.get("jax")
    ordinals = []
    if isinstance(coordinator, JaxCoordinator) or (
            coordinator is None and num_devices is None and jax is not None):
        local = (jax.local_devices() if coordinator is not None
                 else jax.devices())
        ids = [d.id for d in local]
        if ids != list(range(ids[0], ids[0] + len(ids))):
            raise ValueError(f"JAX's local device ids {ids} are not "
                             "consecutive; pass num_devices and "
                             "coordinator explicitly")
        if backend == "cuda":
            ordinals = [int(d.local_hardware_id) for d in local]
        return ids[0], int(num_devices or len(ids)), ordinals
    if isinstance(coordinator, TorchCoordinator) and backend == "cuda":
        torch = sys.modules["torch"]
        return coordinator.rank, 1, [torch.cuda.current_device()]
    count = int(num_devices or _torch_xla.local_devices() or 1)
    rank = coordinator.rank if coordinator is not None else 0
    return rank * count, count, ordinals


# Managers not yet closed: closed at exit, while the job's runtime (whose
# collectives their last commits need) is still up.
_OPEN = weakref.WeakSet()


@atexit.register
def _close_open_managers():
    for manager in list(_OPEN):
        where = "a checkpoint manager"
        try:
            where = manager.path  # before close: a closed manager has none
            manager.close()
        except Exception as error:  # noqa: BLE001 (reported, exit goes on)
            print(f"hoist: closing {where} at exit: {error}",
                  file=sys.stderr)


def _metadata_text(meta):
    """`meta` as the JSON text a manifest can carry: ValueError (raised by
    save(), before the step is accepted) for NaN or infinities in user
    metadata, text that is not valid Unicode (a lone surrogate, as
    os.fsdecode gives for a non-UTF-8 file name) or nesting deeper than a
    manifest allows; TypeError for values JSON cannot hold at all. Float
    leaves of the tree itself keep NaN and infinities (see _tree.py)."""
    try:
        text = json.dumps(meta, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except TypeError as error:
        raise TypeError(f"metadata is not JSON-serializable: {error}") from None
    except UnicodeEncodeError as error:
        raise ValueError(
            "metadata (or a key or string in the state) is not valid "
            f"Unicode: {error.object[error.start:error.end]!r} at position "
            f"{error.start} (a lone surrogate, as os.fsdecode gives for a "
            "name that is not UTF-8); a manifest is UTF-8 JSON") from None
    except ValueError as error:
        raise ValueError(
            f"metadata cannot be saved: {error} (NaN and infinities are not "
            "JSON; store them as strings)") from None
    except RecursionError:
        raise ValueError("metadata nests too deeply to be saved") from None
    return text
