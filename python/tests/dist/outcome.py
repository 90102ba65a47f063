"""What a surviving rank saw of a save that a lost rank broke, for the test
to read: the workers' failure modes share it; and how a torch worker ends."""
import json
import os
import sys
import time


def report(mgr, handle, out):
    """Waits for `handle`'s save and writes to `out`, as JSON, its error
    (type and text, or None), how long the wait took, and the committed
    steps afterwards."""
    outcome, start = {"type": None, "error": None}, time.monotonic()
    try:
        handle.wait()
    except Exception as error:  # noqa: BLE001 (the test reads it)
        outcome = {"type": type(error).__name__, "error": str(error)}
    outcome["waited_s"] = time.monotonic() - start
    outcome["steps"] = mgr.steps
    with open(out, "w") as f:
        json.dump(outcome, f)


def exit_without_teardown():
    """Ends a torch worker once its work is done and its hoist managers are
    closed, without the interpreter's teardown. There a gloo worker thread
    may still be destroying a finished collective's Work (FSDP2's
    all-gathers), whose tensor's decref takes the GIL of a finalizing
    interpreter, which ends that thread through a noexcept frame:
    "terminate called without an active exception", SIGABRT (torch 2.15: 1
    run in 24 of torch_train.py on two loaded cores; the core dump's stack:
    ProcessGroupGloo::runLoop, ~AsyncAllgatherCoalescedWork,
    decref_pyobject, take_gil, PyThread_exit_thread)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
