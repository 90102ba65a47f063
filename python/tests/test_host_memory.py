"""What a save and a restore hold in host memory: the pool, its overflow
within host_memory_budget, and a restore that leaves the pool alone."""
import logging
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import hoist


def _state(mib, seed=0):
    rng = np.random.default_rng(seed)
    return {f"w{i}": rng.random((mib << 20) // 8 // 8) for i in range(8)}


def _same(a, b):
    return all(np.array_equal(a[k], b[k]) for k in a)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_save_larger_than_the_pool_is_staged_into_the_overflow(root):
    state = _state(16)
    with hoist.CheckpointManager(root, pool_bytes=2 << 20) as mgr:
        info = mgr.save(1, state).wait()
        assert info["overflow_bytes"] >= (16 - 2) << 20
        assert info["stalled_bytes"] == 0
        assert info["blocked_reason"] is None
        assert _same(mgr.restore(like=state), state)


def test_a_save_past_the_budget_waits_says_why_and_warns_once(root):
    state = _state(16)
    records = _Records()
    logger = logging.getLogger("hoist")
    logger.addHandler(records)
    try:
        with hoist.CheckpointManager(root, pool_bytes=2 << 20,
                                     host_memory_budget=4 << 20) as mgr:
            infos = [mgr.save(step, state).wait() for step in (1, 2)]
            restored = mgr.restore(like=state)
    finally:
        logger.removeHandler(records)
    for info in infos:
        assert info["stalled_bytes"] > 0
        assert "host_memory_budget" in info["blocked_reason"]
    stalls = [m for m in records.messages if "waited for storage" in m]
    assert len(stalls) == 1, records.messages
    assert "raise host_memory_budget" in stalls[0]
    assert _same(restored, state)


@pytest.mark.parametrize("budget", ["lots", 0, -5, 1.5, True])
def test_a_budget_that_is_not_bytes_or_auto_is_a_value_error(root, budget):
    with pytest.raises(ValueError, match="host_memory_budget"):
        hoist.CheckpointManager(root, host_memory_budget=budget)


def test_a_budget_smaller_than_the_pool_is_a_value_error(root):
    with pytest.raises(ValueError, match="pool_bytes"):
        hoist.CheckpointManager(root, pool_bytes=8 << 20,
                                host_memory_budget=4 << 20)


def test_a_restore_in_a_fresh_process_leaves_the_pool_alone(root):
    """A 1 GiB pool is neither allocated nor faulted in by a restore of
    64 MiB (it was pinned after the restore before): closing the manager
    joins any pinning, and the process's peak grew by about the state. A
    later save pins it."""
    state = _state(64)
    with hoist.CheckpointManager(root, pool_bytes=64 << 20) as mgr:
        mgr.save(1, state).wait()
    script = textwrap.dedent(f"""
        import numpy as np
        import hoist
        def status(key):
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith(key + ":"):
                        return int(line.split()[1]) * 1024
        before = status("VmRSS")
        with hoist.CheckpointManager({str(root)!r}, pool_bytes=1 << 30) as m:
            state = m.restore()
        # Closed: a pinner, had one started, was joined.
        after_restore = status("VmHWM") - before
        with hoist.CheckpointManager({str(root)!r}, pool_bytes=1 << 30) as m:
            m.save(2, state).wait()
            after_save = status("VmRSS") - before
        print(after_restore, after_save)
    """)
    out = subprocess.run([sys.executable, "-c", script], check=True,
                         capture_output=True, text=True).stdout.split()
    after_restore, after_save = int(out[0]), int(out[1])
    assert after_restore < (64 << 20) + (128 << 20), after_restore
    assert after_save > (1 << 30), after_save  # the save pinned the pool
