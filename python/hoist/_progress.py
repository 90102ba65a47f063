"""progress= for hoist's long calls (restore, verify, export, import):
True shows a tqdm bar; a callable receives progress events instead.

The call runs on a worker thread (the engine releases the GIL while it
reads and writes) while the caller's thread samples the engine's counters
(a _hoist.Progress) ten times a second. An event is a dict: operation,
done, total (0 until known), unit ("B" or "steps"), current (the array or
file under way) and finished (True once, last). A callable that raises is
logged once and not called again; the call it watches goes on.
"""

import logging
import threading

from . import _hoist

_LOG = logging.getLogger("hoist")
_EVERY_S = 0.1


class _Bar:
    """A tqdm bar over the engine's counters."""

    def __init__(self, label):
        try:
            from tqdm.auto import tqdm
        except ImportError as e:
            raise ImportError("progress=True shows a tqdm bar: pip install "
                              "tqdm, or pass a callable") from e
        self._bar = tqdm(desc=f"hoist {label}", total=None, unit="B",
                         unit_scale=True, unit_divisor=1024, leave=True)

    def __call__(self, event):
        bar = self._bar
        if event["total"] and bar.total != event["total"]:
            bar.total = event["total"]
            bar.unit = event["unit"]
        bar.n = event["done"]
        if event["current"]:
            bar.set_postfix_str(event["current"], refresh=False)
        bar.refresh()
        if event["finished"]:
            bar.close()


class _Reporter:
    """Turns counter samples into events for `sink`; a sink that raises is
    logged once and dropped."""

    def __init__(self, label, sink, counter):
        self._label = label
        self._sink = sink
        self._counter = counter

    def report(self, finished=False):
        if self._sink is None:
            return
        counter = self._counter
        event = {"operation": self._label, "done": counter.done,
                 "total": counter.total,
                 "unit": "B" if counter.bytes else "steps",
                 "current": "" if finished else counter.current,
                 "finished": finished}
        try:
            self._sink(event)
        except Exception as e:  # noqa: BLE001 (any callback may raise)
            _LOG.warning("hoist: the progress callback of %s raised %r; it "
                         "is not called again, and the %s goes on",
                         self._label, e, self._label)
            self._sink = None


def _sink(progress, label):
    """Where events go: a tqdm bar for True, else the callable given."""
    if progress is True:
        return _Bar(label)
    if callable(progress):
        return progress
    raise TypeError("progress must be True, False, None or a callable "
                    f"taking an event dict, not {type(progress).__name__}")


def run(progress, label, call, counter=None):
    """call(counter), where counter is a _hoist.Progress the engine counts
    into (None when `progress` is None or False), with progress shown as
    the module says; a caller whose call counts elsewhere gives that
    `counter` (done, total, bytes, current) instead. Returns what the call
    returns; raises what it raises."""
    if progress is None or progress is False:
        return call(None)
    sink = _sink(progress, label)
    counter = _hoist.Progress() if counter is None else counter
    reporter = _Reporter(label, sink, counter)
    outcome = {}

    def work():
        try:
            outcome["value"] = call(counter)
        except BaseException as e:  # noqa: BLE001 (re-raised below)
            outcome["error"] = e

    worker = threading.Thread(target=work, name=f"hoist-{label}",
                              daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(_EVERY_S)
        reporter.report()
    reporter.report(finished=True)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class _SaveCounter:
    """A save's progress (its handle's bytes written of its total) as the
    engine's counters read."""

    bytes = True
    current = ""

    def __init__(self, handle):
        self._handle = handle

    @property
    def done(self):
        return self._handle.progress()[1]

    @property
    def total(self):
        return self._handle.progress()[2]


def watch(progress, label, handle):
    """handle.wait() (a hoist.SaveHandle), with progress shown as run()
    shows it: the save's bytes written."""
    return run(progress, label, lambda counter: handle.wait(),
               _SaveCounter(handle))
