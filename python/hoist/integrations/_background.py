"""What the adapters do after a save returns: work queued in the order of
the saves (wait for the commit, then write a pointer, prune old steps,
...), on one thread of its own, whose failures surface at the next save
or at a drain; and the durable write of a small local file."""

import os
import threading
from concurrent.futures import ThreadPoolExecutor


class Background:
    """One thread running what is submitted, in order."""

    def __init__(self, name):
        self._lock = threading.Lock()
        self._pending = []
        self._queue = ThreadPoolExecutor(max_workers=1,
                                         thread_name_prefix=name)

    def submit(self, fn, *args):
        """Queues fn(*args) after everything submitted before."""
        with self._lock:
            self._pending = [f for f in self._pending
                             if not f.done() or f.exception() is not None]
            self._pending.append(self._queue.submit(fn, *args))

    def raise_failed(self):
        """Raises the error of the first finished task that failed (its
        step never became visible, or what followed its commit failed);
        nothing when none did."""
        with self._lock:
            failed = [f for f in self._pending
                      if f.done() and f.exception() is not None]
            self._pending = [f for f in self._pending if not f.done()]
        if failed:
            raise failed[0].exception()

    def drain(self):
        """Waits for everything submitted so far; raises the first error."""
        with self._lock:
            pending, self._pending = self._pending, []
        for future in pending:
            future.result()


def write_durably(path, data, temporary_suffix=".hoist-tmp"):
    """Writes `data` (bytes) as local file `path`, whole or not at all: a
    temporary file beside it, fsynced, renamed over it, the directory
    fsynced."""
    path = os.fspath(path)
    temporary = f"{path}{temporary_suffix}"
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
    directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
