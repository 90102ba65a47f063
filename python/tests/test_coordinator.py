"""A caller's own coordinator object, in one process: its operations are
the engine's, and what it raises fails the save with the right exception,
leaving every committed step as it was."""
import numpy as np
import pytest

import hoist


class Recording:
    """Rank 0 of 1 that records every operation and can fail one."""

    def __init__(self, fail_at=None, error=RuntimeError):
        self.rank, self.size = 0, 1
        self.calls, self.fail_at, self.error = [], fail_at, error

    def _enter(self, name):
        self.calls.append(name)
        if name == self.fail_at:
            raise self.error(f"rank 3 did not come to '{name}'")

    def barrier(self, name):
        self._enter(name)

    def all_gather(self, name, data):
        self._enter(name)
        return [data]

    def broadcast(self, name, data, root):
        self._enter(name)
        return data


def test_a_save_runs_through_the_callers_coordinator(root):
    coordinator = Recording()
    with hoist.CheckpointManager(root, coordinator=coordinator) as mgr:
        mgr.save(1, {"w": np.arange(10.0)}).wait()
        assert mgr.restore(1)["w"].tolist() == list(np.arange(10.0))
    # Open's, then the three of a save, in order (its gather an all_gather
    # here: this coordinator has no gather()).
    assert coordinator.calls[-3:] == ["tmp_dir", "written", "committed"]


def test_a_coordinators_own_gather_and_scatter_are_used(root):
    """Where a coordinator has gather() and scatter(), a save gathers at
    rank 0 through it (only rank 0 receives every rank's extents)."""
    class WithGather(Recording):
        def gather(self, name, data, root):
            self._enter("gather " + name)
            assert root == 0
            return [data]

        def scatter(self, name, pieces, root):
            self._enter("scatter " + name)
            return pieces[self.rank]

    coordinator = WithGather()
    with hoist.CheckpointManager(root, coordinator=coordinator) as mgr:
        mgr.save(1, {"w": np.arange(10.0)}).wait()
        assert coordinator.calls[-3:] == ["tmp_dir", "gather written",
                                          "committed"]
        assert mgr.restore(1)["w"].tolist() == list(np.arange(10.0))

    class WrongGather(WithGather):
        def gather(self, name, data, root):
            return [data, data]

    with hoist.CheckpointManager(root, coordinator=WrongGather()) as mgr:
        with pytest.raises(hoist.CoordinationError,
                           match="gather returned 2 contributions"):
            mgr.save(2, {"w": np.ones(4)}).wait()
        with pytest.raises(hoist.CoordinationError):  # reported again
            mgr.wait_until_finished()
        assert mgr.steps == [1]


@pytest.mark.parametrize("error,expected", [
    (RuntimeError, hoist.CoordinationError), (TimeoutError, TimeoutError)])
def test_a_failed_coordinator_operation_fails_the_save_only(root, error,
                                                            expected):
    coordinator = Recording(error=error)
    with hoist.CheckpointManager(root, coordinator=coordinator) as mgr:
        mgr.save(1, {"w": np.ones(4)}).wait()
        coordinator.fail_at = "written"
        handle = mgr.save(2, {"w": np.zeros(4)})
        with pytest.raises(expected, match="rank 3 did not come to 'written'"):
            handle.wait()
        coordinator.fail_at = None
        with pytest.raises(expected):  # reported again by the next call
            mgr.wait_until_finished()
        assert mgr.steps == [1]
        assert not [p for p in root.iterdir() if ".tmp" in p.name]
        mgr.save(3, {"w": np.full(4, 3.0)}).wait()
        assert mgr.steps == [1, 3]
        assert mgr.restore(1)["w"].tolist() == [1.0] * 4


def test_a_coordinator_answering_for_the_wrong_number_of_ranks_fails(root):
    class Short(Recording):
        def all_gather(self, name, data):
            return []

    with pytest.raises(hoist.CoordinationError,
                       match="'devices'.*0 contributions for 1 ranks"):
        hoist.CheckpointManager(root, coordinator=Short())


def test_bad_coordinator_arguments_are_refused(root):
    with pytest.raises(ValueError, match="coordinator 'mpi'"):
        hoist.CheckpointManager(root, coordinator="mpi")

    class Bad(Recording):
        def __init__(self):
            super().__init__()
            self.rank = 2

    with pytest.raises(ValueError, match="rank 2 of 1"):
        hoist.CheckpointManager(root, coordinator=Bad())


def test_a_gathered_send_slices_as_its_concatenation():
    """What exchange() gets when hoist sends bytes from several places."""
    from hoist._dist import Gathered
    parts = [np.arange(5, dtype=np.uint8), np.empty(0, np.uint8),
             np.arange(10, 13, dtype=np.uint8), np.arange(20, 27,
                                                          dtype=np.uint8)]
    whole = np.concatenate(parts)
    data = Gathered(parts)
    assert len(data) == len(whole) == 15
    for start in range(0, 16):
        for stop in range(start, 17):
            got = data[start:stop]
            assert got.dtype == np.uint8
            assert got.tobytes() == whole[start:stop].tobytes(), (start, stop)
    assert data[6:8].base is not None  # inside one part: a view, no copy
    assert len(Gathered([])) == 0 and Gathered([])[0:4].size == 0
    with pytest.raises(ValueError, match="contiguous"):
        data[::2]
