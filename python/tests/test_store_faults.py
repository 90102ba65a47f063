"""A failing object store, through a fault-injecting proxy
(testing/fault_proxy.py, a process of its own) in front of the real S3
server (SeaweedFS): throttling and resets are retried; one rank's uploads
failing beyond the retries, or stalling, fail the save on every rank of a
torchrun job within the coordinator's timeout, naming the rank and the
object; nothing committed is lost and the next save commits."""
import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

import hoist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testing"))
from fault_proxy import FaultProxy  # noqa: E402

HERE = Path(__file__).parent / "dist"
BIN = Path(sys.executable).parent
UPLOADS = ["PutObject", "CreateMultipartUpload", "UploadPart",
           "CompleteMultipartUpload"]
RANKS = 2  # the torchrun job's: rank 1's uploads fail, rank 0 sees it


@pytest.fixture
def proxy(s3_env):
    with FaultProxy(s3_env.env["AWS_ENDPOINT_URL"],
                    [f"rank{r}" for r in range(RANKS)]) as p:
        yield p


def _root(s3_env):
    return f"s3://{s3_env.bucket}/{uuid.uuid4().hex[:12]}"


def test_a_save_and_a_restore_through_ten_percent_throttling_are_exact(
        s3_env, proxy):
    proxy.set_rules([{"fault": "503", "probability": 0.1}])
    x = np.random.default_rng(5).standard_normal(16 << 20).astype(np.float32)
    with hoist.CheckpointManager(
            _root(s3_env),
            storage_options={"endpoint": proxy.endpoint["rank0"]}) as mgr:
        mgr.save(1, {"x": x}).wait()
        assert np.array_equal(mgr.restore(1)["x"], x)
    assert proxy.fired()[0] > 0  # SlowDown was answered, and retried


def test_truncated_and_reset_reads_are_retried_and_the_restore_is_exact(
        s3_env, proxy):
    x = np.random.default_rng(6).standard_normal(4 << 20).astype(np.float32)
    root = _root(s3_env)
    options = {"endpoint": proxy.endpoint["rank0"]}
    with hoist.CheckpointManager(root, storage_options=options) as mgr:
        mgr.save(1, {"x": x}).wait()
    # Each read's first two attempts fail, the third (of 4) goes through.
    proxy.set_rules([
        {"fault": "truncate", "ops": ["GetObject"], "count": 1},
        {"fault": "reset", "ops": ["GetObject"], "count": 1}])
    with hoist.CheckpointManager(root, storage_options=options) as mgr:
        assert np.array_equal(mgr.restore(1)["x"], x)
    assert proxy.fired() == [1, 1]


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow(31)
def test_one_ranks_failing_uploads_fail_the_save_on_every_rank(
        s3_env, proxy, tmp_path):
    """Rank 1 of 2: every upload answered 503 SlowDown (beyond the
    retries), then reset, then stalled for 120 s (each attempt abandoned
    after request_timeout_s: 3 s, so the stall costs 4 attempts of 3 s)."""
    timeout_s = 30
    faults = [[{"listener": "rank1", "ops": UPLOADS, "fault": fault,
                "stall_s": 120}] for fault in ("503", "reset", "stall")]
    setup = {"endpoints": [proxy.endpoint[f"rank{r}"]
                           for r in range(RANKS)],
             "control": proxy.endpoint["control"], "faults": faults,
             "coordinator_timeout_s": timeout_s, "request_timeout_s": 3}
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("XLA_FLAGS", None)
    done = subprocess.run(
        [str(BIN / "torchrun"), "--nproc-per-node", str(RANKS),
         "--master-port", str(_free_port()), "--monitor-interval", "1",
         str(HERE / "store_fault_worker.py"), _root(s3_env), str(out),
         json.dumps(setup)],
        capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
    for rank in range(RANKS):
        records = json.loads(Path(f"{out}.{rank}.json").read_text())
        assert len(records) == len(faults)
        for fault, record in zip(("503", "reset", "stall"), records):
            where = (rank, fault, record)
            assert record["type"] is not None, where  # the save failed
            # Within the coordinator's timeout (+ 10 s), on every rank.
            assert record["waited_s"] < timeout_s + 10, where
            # Naming the rank, its object and what failed there.
            assert "rank 1:" in record["error"], where
            assert "r00001_w" in record["error"], where
            assert "upload" in record["error"], where
            assert record["step"] not in record["steps_after"], where
            assert record["last_committed_exact"], where
            assert record["next_exact"], where
