"""Coordinators: how the processes of a job agree on each save.

A CheckpointManager in a job of several processes needs its ranks to agree
four times a save (the step's directory, who wrote what, the extent hashes,
the commit), always over the job's own distributed runtime, never a
transport of hoist's:

  TorchCoordinator  torch.distributed (torchrun): object collectives on a
                    gloo group of hoist's own, each preceded by a
                    monitored_barrier that names the ranks that did not come.
  JaxCoordinator    JAX's distributed runtime (jax.distributed.initialize):
                    its coordination service's key-value store.

A coordinator is any object with `rank` and `size` attributes and the
methods barrier(name), all_gather(name, data: bytes) -> [bytes, ...] by rank
and broadcast(name, data: bytes, root) -> bytes; a local tier also needs
exchange(name, data, to, from_, receive), bulk point to point: this rank
sends `data` (a uint8 NumPy array) to rank `to` while rank `from_` sends it
its own, handed to receive(piece) in order, piece by bounded piece (1-D
uint8 NumPy arrays); every rank calls it at once, as a shift. A preemption
(preemption_signals) needs the notice board: post(board, data: bytes) and
read_board(board) -> (ranks that posted, [bytes by rank] once every rank
has, else None), neither of which waits for another rank; the manager's
preemption watch calls them from a thread of its own, beside the
collectives, about once a second. Every rank makes the same
calls in the same order; the manager calls them from its saver thread (one
at a time), so they must not use a group or channel the training loop uses
at the same time. An operation that a rank does not reach within the
timeout raises TimeoutError naming that rank; a rank that died makes the
others' operation fail with the runtime's error. Either fails the save on
every surviving rank, and no partial step becomes visible.
"""

import datetime
import itertools
import os
import re
import socket
import sys
import threading
import time
import zlib

_DEFAULT_TIMEOUT_S = 600.0
# exchange() moves bulk data in pieces of at most this: over torch's gloo
# group, and (smaller, each relayed by the coordination service) over JAX's
# key-value store, with at most _WINDOW pieces unacknowledged per sender.
_PIECE_BYTES = 64 << 20
_KV_PIECE_BYTES = 4 << 20
_WINDOW = 4


def job_coordinator(timeout_s=_DEFAULT_TIMEOUT_S):
    """The coordinator of the job this process belongs to: over
    torch.distributed when it is initialized with more than one rank, else
    over JAX's distributed runtime when it has more than one process, else
    None (a single process)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        dist = torch.distributed
        if (dist.is_available() and dist.is_initialized()
                and dist.get_world_size() > 1):
            return TorchCoordinator(timeout_s=timeout_s)
    state = _jax_distributed_state()
    if state is not None and state.num_processes > 1:
        return JaxCoordinator(timeout_s=timeout_s)
    return None


def _jax_distributed_state():
    if "jax" not in sys.modules:
        return None
    try:
        from jax._src.distributed import global_state
    except ImportError:
        return None
    return global_state if global_state.client is not None else None


def _check_names(name, names):
    """Every rank must call the same operation: a rank that called another
    one has taken a different path through the job (a save on some ranks
    only), so the save fails rather than pairing unrelated data."""
    for rank, other in enumerate(names):
        if other != name:
            raise RuntimeError(
                f"rank {rank} called coordinator operation '{other}' while "
                f"this rank called '{name}' (every rank must save the same "
                "steps, in the same order)")


class Gathered:
    """Bytes to send that lie in several arrays (1-D uint8), as exchange()
    gets them when hoist gathers a send from several places: len() and
    slices are those of their concatenation, and a slice is a NumPy array
    (a view when it lies in one of them, else a copy of its bytes only)."""

    def __init__(self, pieces):
        self._pieces = [p for p in pieces if len(p)]
        self._starts = list(itertools.accumulate(
            (len(p) for p in self._pieces), initial=0))

    def __len__(self):
        return self._starts[-1]

    def __getitem__(self, index):
        import numpy as np
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise ValueError("Gathered takes contiguous slices only")
        parts = []
        for piece, at in zip(self._pieces, self._starts):
            lo, hi = max(start, at), min(stop, at + len(piece))
            if lo < hi:
                parts.append(piece[lo - at:hi - at])
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty(0, np.uint8)


class TorchCoordinator:
    """Over torch.distributed. Needs an initialized process group (any
    backend: nccl for the training); makes a gloo group of its own for
    hoist (created by every rank at once, as torch's new_group requires),
    so hoist's collectives, which run on the saver thread, never meet the
    training loop's.

    timeout_s: how long an operation waits for every rank (default 600 s);
               then monitored_barrier raises naming the ranks that did not
               arrive, which becomes a TimeoutError."""

    def __init__(self, timeout_s=_DEFAULT_TIMEOUT_S):
        import torch.distributed as dist
        if not dist.is_initialized():
            raise RuntimeError(
                "TorchCoordinator needs torch.distributed.init_process_group "
                "first")
        self._dist = dist
        self._timeout = datetime.timedelta(seconds=timeout_s)
        self._group = dist.new_group(backend="gloo", timeout=self._timeout)
        self._store = None  # the board's, made when first used
        self.rank = dist.get_rank(self._group)
        self.size = dist.get_world_size(self._group)
        # What this rank's collectives carried (payloads, by hoist's count:
        # gloo's own framing aside), for bench/scale.py.
        self.traffic = {"messages_sent": 0, "bytes_sent": 0,
                        "messages_received": 0, "bytes_received": 0}
        # Each rank's host, to name it when the rank fails an operation.
        self._hosts = [None] * self.size
        dist.all_gather_object(self._hosts, socket.gethostname(),
                               group=self._group)
        self._operations = 0  # numbers each operation's failure report

    def _count(self, sent, received):
        """Counts payloads `sent` and `received` (lists of bytes)."""
        self.traffic["messages_sent"] += len(sent)
        self.traffic["bytes_sent"] += sum(len(b) for b in sent)
        self.traffic["messages_received"] += len(received)
        self.traffic["bytes_received"] += sum(len(b) for b in received)

    def _arrive(self, name):
        """Returns once every rank has arrived at `name`. A rank that left
        (its connection closed) fails it at once: RuntimeError; a rank
        that is still there but does not come: TimeoutError after the
        timeout. Both name the rank."""
        self._collective(name, lambda: self._dist.monitored_barrier(
            self._group, timeout=self._timeout, wait_all_ranks=True))

    def _collective(self, name, op):
        """op()'s result. A rank that leaves or stops during it (after it
        arrived: a save reports staged before its first collective, and
        the training loop may then lose the process) fails it as in
        _arrive, naming the rank."""
        self._operations += 1
        report = f"hoist/failed/{self._operations}"
        start = time.monotonic()
        try:
            return op()
        except RuntimeError as error:
            waited = time.monotonic() - start
            text = (str(error).strip().splitlines() or [""])[0]
            missing = re.search(r"Ranks? ([\d, ]+) failed to pass", text)
            if missing:
                who = self._ranks_and_hosts(missing.group(1))
                if self.rank == 0:  # the others learn it from the store
                    self._tell_the_others(report, who)
            elif self.rank != 0:  # the others see rank 0 only
                who = self._what_rank_0_saw(report) or "rank 0"
            else:  # gloo may say only that a connection closed
                who = (self._ranks_and_hosts("1") if self.size == 2
                       else "a rank")
            limit = self._timeout.total_seconds()
            if waited < 0.9 * limit:
                raise RuntimeError(
                    f"'{name}': {who} left the job (its connection failed "
                    f"after {waited:.2f} s): {text}") from None
            raise TimeoutError(f"'{name}': {who} did not arrive within "
                               f"{limit:g} s: {text}") from None

    def _ranks_and_hosts(self, ranks):
        """'rank 4 (host h2)' or 'ranks 4, 5 (host h2)' for gloo's '4, 5'."""
        numbers = [int(r) for r in re.findall(r"\d+", ranks)]
        hosts = sorted({self._hosts[r] for r in numbers
                        if 0 <= r < self.size})
        return (f"rank{'s' if len(numbers) > 1 else ''} "
                f"{', '.join(map(str, numbers))} "
                f"(host{'s' if len(hosts) > 1 else ''} {', '.join(hosts)})")

    def _tell_the_others(self, report, who):
        """Rank 0 puts which ranks failed an operation in the job's store:
        the others' connections failed with rank 0's, and they know no
        more (best effort: the store may be gone too)."""
        try:
            self._board_store().set(report, who)
        except Exception:  # noqa: BLE001 (the failure is reported anyway)
            pass

    def _what_rank_0_saw(self, report):
        """Which ranks rank 0 found failed, from the job's store, if it says
        within a few seconds; else None.

        The read runs on a thread of its own that is given up after 6 s:
        on a host cut off from the store's, torch's TCPStore client waits
        5 s, then sends rank 0's host a cancel and waits for its answer on a
        socket without a timeout, so the save that failed would never
        return (issue 78: both ranks of a cut host hung there). The thread
        stays blocked until the link comes back or the process ends."""
        answer = []

        def read():
            try:
                store = self._board_store()
                store.wait([report], datetime.timedelta(seconds=5))
                answer.append(store.get(report).decode())
            except Exception:  # noqa: BLE001 (rank 0 gone, or no store)
                pass

        reader = threading.Thread(target=read, daemon=True,
                                  name="hoist-failure-report")
        reader.start()
        reader.join(6)
        return f"according to rank 0, {answer[0]}" if answer else None

    def barrier(self, name):
        self._arrive(name)

    def all_gather(self, name, data):
        self._arrive(name)
        out = [None] * self.size
        self._collective(name, lambda: self._dist.all_gather_object(
            out, (name, data), group=self._group))
        _check_names(name, [n for n, _ in out])
        self._count([data], [d for r, (_, d) in enumerate(out)
                             if r != self.rank])
        return [d for _, d in out]

    def gather(self, name, data, root):
        """Every rank's data on `root` (by rank), [] elsewhere: only the
        root receives more as the job grows."""
        self._arrive(name)
        out = [None] * self.size if self.rank == root else None
        self._collective(name, lambda: self._dist.gather_object(
            (name, data), out, dst=self._dist.get_global_rank(
                self._group, root), group=self._group))
        if self.rank != root:
            self._count([data], [])
            return []
        _check_names(name, [n for n, _ in out])
        self._count([], [d for r, (_, d) in enumerate(out) if r != root])
        return [d for _, d in out]

    def scatter(self, name, pieces, root):
        """pieces[rank] of `root`'s pieces, on each rank."""
        self._arrive(name)
        out = [None]
        given = ([(name, p) for p in pieces] if self.rank == root else None)
        self._collective(name, lambda: self._dist.scatter_object_list(
            out, given, src=self._dist.get_global_rank(self._group, root),
            group=self._group))
        _check_names(name, [out[0][0]])
        if self.rank == root:
            self._count([p for r, p in enumerate(pieces) if r != root], [])
        else:
            self._count([], [out[0][1]])
        return out[0][1]

    def broadcast(self, name, data, root):
        self._arrive(name)
        box = [(name, data if self.rank == root else b"")]
        self._collective(name, lambda: self._dist.broadcast_object_list(
            box, src=self._dist.get_global_rank(self._group, root),
            group=self._group))
        _check_names(name, [box[0][0]])
        if self.rank == root:
            self._count([data] * (self.size - 1), [])
        else:
            self._count([], [box[0][1]])
        return box[0][1]

    def exchange(self, name, data, to, from_, receive):
        """Bulk point to point over the gloo group: a header (length and
        the name's CRC) each way, then pieces of at most 64 MiB, each
        sent from a copy (memory stays bounded) while the peer's arrives."""
        import numpy as np
        import torch
        if to == from_ == self.rank:
            for at in range(0, len(data), _PIECE_BYTES):
                receive(data[at:at + _PIECE_BYTES])
            return
        group, dist = self._group, self._dist
        sent = torch.tensor([len(data), zlib.crc32(name.encode())],
                            dtype=torch.int64)
        header = torch.zeros(2, dtype=torch.int64)
        self._wait(name, from_, [
            dist.isend(sent, dist.get_global_rank(group, to), group=group),
            dist.irecv(header, dist.get_global_rank(group, from_),
                       group=group)])
        length, crc = (int(v) for v in header)
        if crc != zlib.crc32(name.encode()):
            raise RuntimeError(f"exchange '{name}': rank {from_} sent under "
                               "another name (every rank must take the same "
                               "path)")
        inbox = torch.empty(min(length, _PIECE_BYTES), dtype=torch.uint8)
        for at in range(0, max(len(data), length), _PIECE_BYTES):
            work = []
            if at < len(data):
                piece = torch.from_numpy(np.array(data[at:at + _PIECE_BYTES]))
                work.append(dist.isend(piece, dist.get_global_rank(group, to),
                                       group=group))
            size = min(_PIECE_BYTES, length - at)
            if size > 0:
                work.append(dist.irecv(inbox[:size], dist.get_global_rank(
                    group, from_), group=group))
            self._wait(name, from_, work)
            if size > 0:
                receive(inbox[:size].numpy())

    def _wait(self, name, peer, work):
        """Waits for point-to-point operations; a peer that does not answer
        within the timeout is a TimeoutError naming it."""
        try:
            for w in work:
                w.wait()
        except RuntimeError as error:
            text = (str(error).strip().splitlines() or [""])[0]
            if "imed out" in text or "imeout" in text:
                raise TimeoutError(f"exchange '{name}': rank {peer} did not "
                                   f"answer: {text}") from None
            raise RuntimeError(f"exchange '{name}' with rank {peer}: "
                               f"{text}") from None

    def _board_store(self):
        """torch.distributed's own key-value store (the TCPStore torchrun
        made), under a prefix of hoist's; a restart of the job by torchrun
        keeps the store, so the prefix names the restart."""
        if self._store is None:
            from torch.distributed import distributed_c10d
            restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            self._store = self._dist.PrefixStore(
                f"hoist/board/{restart}/",
                distributed_c10d._get_default_store())
        return self._store

    def post(self, board, data):
        store = self._board_store()
        store.set(f"{board}/{self.rank}", data)
        store.add(f"{board}/posted", 1)

    def read_board(self, board):
        store = self._board_store()
        posted = int(store.add(f"{board}/posted", 0))
        if posted < self.size:
            return posted, None
        return posted, [bytes(v) for v in store.multi_get(
            [f"{board}/{r}" for r in range(self.size)])]

    def close(self):
        """Releases the group (local: no other rank takes part)."""
        if self._group is not None and self._dist.is_initialized():
            self._dist.destroy_process_group(self._group)
        self._group = None


class JaxCoordinator:
    """Over JAX's distributed runtime (jax.distributed.initialize): every
    operation is an exchange through the coordination service's key-value
    store. Each rank sets its contribution under the operation's key, then
    reads every rank's, each read bounded by what is left of the timeout;
    a rank whose key does not appear in time is named in a TimeoutError.
    gather and broadcast read less: only the root reads every rank's key
    (then deletes it), and only the root sets a broadcast's; scatter's
    root sets one key per rank, which that rank alone reads and deletes.
    A rank deletes its own all-read keys once it has read every rank's key
    of a later operation: every rank had then finished reading them.

    Keys live under "hoist/<n>/", n counting the coordinators this process
    made: every rank makes its managers in the same order."""

    _made = itertools.count()

    def __init__(self, timeout_s=_DEFAULT_TIMEOUT_S):
        state = _jax_distributed_state()
        if state is None:
            raise RuntimeError(
                "JaxCoordinator needs jax.distributed.initialize first")
        self._client = state.client
        self.rank = int(state.process_id)
        self.size = int(state.num_processes)
        self._timeout_s = float(timeout_s)
        self._prefix = f"hoist/{next(JaxCoordinator._made)}"
        self._sequence = 0
        self._own = []  # (sequence, key) this rank set for every rank

    def _begin(self):
        """The next operation's sequence number and key prefix."""
        sequence = self._sequence
        self._sequence += 1
        return sequence, f"{self._prefix}/{sequence}"

    def _set(self, key, name, data):
        self._client.key_value_set_bytes(key, name.encode() + b"\0" + data)

    def _read(self, name, rank, key, deadline):
        """(name, data) under `key`, set by `rank`, waiting until
        `deadline` at most."""
        left_ms = max(1, int((deadline - time.monotonic()) * 1000))
        try:
            got = self._client.blocking_key_value_get_bytes(key, left_ms)
        except Exception as error:  # jaxlib's XlaRuntimeError
            text = str(error).strip().splitlines()[0]
            if "DEADLINE_EXCEEDED" in text or time.monotonic() >= deadline:
                raise TimeoutError(
                    f"'{name}': rank {rank} did not arrive within "
                    f"{self._timeout_s:g} s ({text})") from None
            raise RuntimeError(
                f"'{name}': waiting for rank {rank}: {text}") from None
        other, _, contribution = bytes(got).partition(b"\0")
        return other.decode(), contribution

    def _read_all(self, name, sequence, key):
        """Every rank's contribution to operation `sequence`; then this
        rank's own keys of earlier operations go (every rank has set its
        key of this one, so it had read them)."""
        deadline = time.monotonic() + self._timeout_s
        out = [self._read(name, rank, f"{key}/{rank}", deadline)
               for rank in range(self.size)]
        while self._own and self._own[0][0] < sequence:
            self._client.key_value_delete(self._own.pop(0)[1])
        _check_names(name, [n for n, _ in out])
        return [d for _, d in out]

    def _exchange(self, name, data):
        sequence, key = self._begin()
        self._set(f"{key}/{self.rank}", name, data)
        self._own.append((sequence, f"{key}/{self.rank}"))
        return self._read_all(name, sequence, key)

    def barrier(self, name):
        self._exchange(name, b"")

    def all_gather(self, name, data):
        return self._exchange(name, data)

    def gather(self, name, data, root):
        """Every rank's data on `root`, [] elsewhere. The root then says
        how it went under the operation's "done" key, which every other
        rank waits for: a rank that did not arrive is named on every
        rank, as the MPI coordinator does."""
        sequence, key = self._begin()
        self._set(f"{key}/{self.rank}", name, data)
        if self.rank != root:
            said, problem = self._read(name, root, f"{key}/done",
                                       time.monotonic() + 2 * self._timeout_s)
            _check_names(name, [said])
            if problem:
                kind, _, text = problem.decode().partition(":")
                raise (TimeoutError if kind == "timeout" else
                       RuntimeError)(f"rank {root}: {text}")
            return []
        try:
            out = self._read_all(name, sequence, key)
        except (TimeoutError, RuntimeError) as error:
            kind = "timeout" if isinstance(error, TimeoutError) else "error"
            self._set(f"{key}/done", name, f"{kind}:{error}".encode())
            raise
        self._set(f"{key}/done", name, b"")
        self._own.append((sequence, f"{key}/done"))
        for rank in range(self.size):  # read by the root alone
            self._client.key_value_delete(f"{key}/{rank}")
        return out

    def broadcast(self, name, data, root):
        sequence, key = self._begin()
        if self.rank == root:
            self._set(f"{key}/{root}", name, data)
            self._own.append((sequence, f"{key}/{root}"))
            return data
        other, data = self._read(name, root, f"{key}/{root}",
                                 time.monotonic() + self._timeout_s)
        _check_names(name, [other])
        return data

    def scatter(self, name, pieces, root):
        sequence, key = self._begin()
        if self.rank == root:
            for rank, piece in enumerate(pieces):
                if rank != root:
                    self._set(f"{key}/{rank}", name, piece)
            return pieces[root]
        other, piece = self._read(name, root, f"{key}/{self.rank}",
                                  time.monotonic() + self._timeout_s)
        self._client.key_value_delete(f"{key}/{self.rank}")
        _check_names(name, [other])
        return piece

    def exchange(self, name, data, to, from_, receive):
        """Bulk point to point through the key-value store, in pieces of at
        most 4 MiB: the receiver deletes each piece it read and
        acknowledges it, and a sender has at most _WINDOW pieces
        unacknowledged, so the coordination service holds at most that
        much of it at once. Slower than a collective transport: the
        coordination service's process relays every byte."""
        if to == from_ == self.rank:
            for at in range(0, len(data), _KV_PIECE_BYTES):
                receive(data[at:at + _KV_PIECE_BYTES])
            return
        import numpy as np
        sequence = self._sequence
        self._sequence += 1
        key = f"{self._prefix}/x{sequence}"
        mine, theirs = f"{key}/{self.rank}", f"{key}/{from_}"
        self._client.key_value_set_bytes(
            f"{mine}/h", name.encode() + b"\0" + str(len(data)).encode())
        other, _, length = self._get(name, from_, f"{theirs}/h").partition(
            b"\0")
        if other.decode() != name:
            raise RuntimeError(f"exchange '{name}': rank {from_} sent "
                               f"'{other.decode()}' (every rank must take "
                               "the same path)")
        length = int(length)
        self._client.key_value_delete(f"{theirs}/h")
        sends = -(-len(data) // _KV_PIECE_BYTES)
        receives = -(-length // _KV_PIECE_BYTES)
        for i in range(max(sends, receives)):
            if i < sends:
                if i >= _WINDOW:  # the peer has read piece i - _WINDOW
                    self._get(name, to, f"{mine}/a{i - _WINDOW}")
                    self._client.key_value_delete(f"{mine}/a{i - _WINDOW}")
                at = i * _KV_PIECE_BYTES
                self._client.key_value_set_bytes(
                    f"{mine}/{i}", data[at:at + _KV_PIECE_BYTES].tobytes())
            if i < receives:
                piece = self._get(name, from_, f"{theirs}/{i}")
                self._client.key_value_delete(f"{theirs}/{i}")
                self._client.key_value_set_bytes(f"{theirs}/a{i}", b"")
                receive(np.frombuffer(piece, dtype=np.uint8))
        for i in range(max(0, sends - _WINDOW), sends):  # the last acks
            self._get(name, to, f"{mine}/a{i}")
            self._client.key_value_delete(f"{mine}/a{i}")

    def _get(self, name, rank, key):
        try:
            return bytes(self._client.blocking_key_value_get_bytes(
                key, int(self._timeout_s * 1000)))
        except Exception as error:  # jaxlib's XlaRuntimeError
            text = str(error).strip().splitlines()[0]
            if "DEADLINE_EXCEEDED" in text:
                raise TimeoutError(f"exchange '{name}': rank {rank} did not "
                                   f"answer within {self._timeout_s:g} s "
                                   f"({text})") from None
            raise RuntimeError(f"exchange '{name}': waiting for rank "
                               f"{rank}: {text}") from None

    def post(self, board, data):
        self._client.key_value_set_bytes(
            f"hoist/board/{board}/{self.rank}", data)

    def read_board(self, board):
        got = self._client.key_value_dir_get_bytes(f"hoist/board/{board}/")
        if len(got) < self.size:
            return len(got), None
        by_rank = {int(key.rsplit("/", 1)[1]): bytes(value)
                   for key, value in got}
        return len(got), [by_rank[r] for r in range(self.size)]

    def close(self):
        pass
