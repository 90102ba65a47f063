"""when_busy: the option's plumbing and its refusals from Python. (The
skipping itself, with storage stuck on demand, is tested in C++:
ManagerTest.WhenBusySkipGoesOnWhileStorageIsStuckAndLosesNothing.)"""
import numpy as np
import pytest

import hoist


def test_durability_reports_the_last_commit_and_no_skips(root):
    with hoist.CheckpointManager(root, when_busy="skip") as mgr:
        assert mgr.durability()["last_committed_step"] is None
        handle = mgr.save(4, {"w": np.arange(8.0)})
        assert not handle.skipped
        assert handle.wait()["skipped"] is False
        lag = mgr.durability()
        assert lag["last_committed_step"] == 4
        assert lag["skipped_saves"] == 0 and lag["in_flight"] == 0
        assert lag["last_committed_unix_s"] > 0


def test_bad_when_busy_is_refused(root):
    with pytest.raises(ValueError, match="when_busy 'drop'"):
        hoist.CheckpointManager(root, when_busy="drop")


class _TwoRanks:
    """Rank 0 of 2 whose peer echoes it (enough to reach the engine)."""
    rank, size = 0, 2

    def barrier(self, name):
        pass

    def all_gather(self, name, data):
        return [data, data]

    def broadcast(self, name, data, root):
        return data


def test_skip_is_refused_in_a_job_of_several_processes(root):
    with pytest.raises(ValueError, match="every rank to skip"):
        hoist.CheckpointManager(root, when_busy="skip",
                                coordinator=_TwoRanks())
