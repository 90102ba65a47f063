"""What a surviving rank saw of a save that a lost rank broke, for the test
to read: the workers' failure modes share it."""
import json
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
