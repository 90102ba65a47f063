"""Preemption under the real launchers: a scheduler's SIGTERM reaches every
rank of a job (and its launcher), or one rank only; every rank saves the
same step within the deadline, exits 0, and the restarted job resumes from
that step bit-identical. torchrun with 2 and 3 ranks (gloo, DTensor state)
on a local tier and S3; two jax.distributed processes on a directory."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

HERE = Path(__file__).parent / "dist"
BIN = Path(sys.executable).parent
DEADLINE_S = 20  # preempt_worker.py's preemption_deadline_s


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _env(**extra):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


class Job:
    """A job of preempt_worker.py processes: torchrun's agent and its
    workers, or jax.distributed processes; their output is read as they
    run, to learn each rank's PID once it trains."""

    def __init__(self, kind, nproc, root, out, local=None, **env):
        self.kind, self.nproc, self.out = kind, nproc, out
        tail = [str(root), str(out)] + ([str(local)] if local else [])
        if kind == "torch":
            self.procs = [subprocess.Popen(
                [str(BIN / "torchrun"), "--nproc-per-node", str(nproc),
                 "--master-port", str(_free_port()), "--monitor-interval",
                 "1", str(HERE / "preempt_worker.py"), "torch", *tail],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env=_env(**env), start_new_session=True)]
        else:
            port = _free_port()
            self.procs = [subprocess.Popen(
                [sys.executable, str(HERE / "preempt_worker.py"), "jax",
                 str(port), str(p), str(nproc), *tail],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env=_env(**env)) for p in range(nproc)]
        self.output = []

    def ready(self):
        """rank -> PID, once every rank has trained a few steps (torchrun's
        workers share its output; each JAX process has its own)."""
        pids = {}
        for index, proc in enumerate(self.procs):
            wanted = range(self.nproc) if self.kind == "torch" else [index]
            for line in proc.stdout:
                self.output.append(line)
                # Ranks share a pipe: a line may hold several's words.
                for rank, pid in re.findall(r"hoist-ready (\d+) (\d+)", line):
                    pids[int(rank)] = int(pid)
                if all(rank in pids for rank in wanted):
                    break
            else:
                pytest.fail("the job ended before it trained:\n"
                            + "".join(self.output)[-6000:])
        return pids

    def finish(self, timeout=120):
        """Each process's exit status, once all have ended."""
        codes = []
        for proc in self.procs:
            rest, _ = proc.communicate(timeout=timeout)
            self.output.append(rest)
            codes.append(proc.returncode)
        return codes

    def outcomes(self):
        out = {}
        for rank in range(self.nproc):
            path = Path(f"{self.out}.{rank}.json")
            if not path.exists():
                pytest.fail(f"rank {rank} wrote no outcome:\n"
                            + "".join(self.output)[-6000:])
            out[rank] = json.loads(path.read_text())
        return out


def _preempt(kind, nproc, root, tmp_path, signalled, local=None):
    """Runs the job until SIGTERM reaches `signalled` ("every" rank and
    the launcher, as Slurm sends it, or "one" rank), checks the
    preemption save, then restarts it to resume. Returns the saved step's
    outcomes."""
    out = tmp_path / "first"
    job = Job(kind, nproc, root, out, local)
    pids = job.ready()
    if signalled == "every":
        targets = list(pids.values())
        if kind == "torch":
            targets.append(job.procs[0].pid)  # the launcher too
    else:
        targets = [pids[nproc - 1]]
    sent = time.time()
    for pid in targets:
        os.kill(pid, signal.SIGTERM)
    codes = job.finish()
    outcomes = job.outcomes()
    steps = {o["step"] for o in outcomes.values()}
    assert len(steps) == 1, outcomes  # every rank saved the same step
    for rank, o in outcomes.items():
        assert o["tier"] == ("local" if local else "durable"), o
        assert o["committed"] - sent < DEADLINE_S, (rank, o)
    # Every worker wrote its outcome, which it does only after its save
    # committed and just before exit(0); a launcher that was not signalled
    # saw every worker exit 0.
    if kind == "jax" or signalled == "one":
        assert codes == [0] * len(codes), "".join(job.output)[-6000:]
    # The job restarted resumes from that step, bit-identical (the worker
    # checks every value against the state of that step).
    again = Job(kind, nproc, root, tmp_path / "again", local,
                HOIST_TEST_RESUME_ONLY="1")
    assert again.finish() == [0] * len(again.procs), (
        "".join(again.output)[-6000:])
    for o in again.outcomes().values():
        assert o["resumed"] == outcomes[0]["step"], o
    return outcomes


# One job of 3 ranks (a signal to one rank reaching two others, neither
# its neighbour alone), on S3; the rest with 2, which shows the same
# agreement at less start-up (each rank imports torch and joins gloo: most
# of these tests' time). The signal to every rank and the launcher is
# shown on the local tier (and, with HOIST_LONG=1, on S3 too).
def test_torchrun_preemption_save_goes_to_the_local_tier(tmp_path):
    outcomes = _preempt("torch", 2, tmp_path / "ckpt", tmp_path, "every",
                        local=tmp_path / "local" / "{rank}")
    assert not (tmp_path / "ckpt").exists() or not any(
        p.name.startswith("step_") for p in (tmp_path / "ckpt").iterdir())
    assert outcomes[0]["tier"] == "local"


@pytest.mark.parametrize("signalled,nproc", [
    pytest.param("every", 2, marks=pytest.mark.long), ("one", 3)])
def test_torchrun_preemption_on_s3(tmp_path, s3_env, signalled, nproc):
    import uuid
    root = f"s3://{s3_env.bucket}/{uuid.uuid4().hex[:12]}"
    _preempt("torch", nproc, root, tmp_path, signalled)


@pytest.mark.parametrize("signalled", ["every", "one"])
def test_jax_distributed_preemption_saves_one_step_and_resumes(
        tmp_path, signalled):
    pytest.importorskip("jax")
    _preempt("jax", 2, tmp_path / "ckpt", tmp_path, signalled)


def test_one_process_preemption_save_names_its_tier_and_keeps_old_steps(
        tmp_path):
    """SIGTERM to this very process: the handler chains to the job's own,
    the step after is the preemption save, on the local tier when there is
    one (handle.tier says so before it commits), and retention spares the
    steps before it."""
    import numpy as np
    import hoist
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda *_: seen.append(1))
    try:
        for local, tier in ((None, "durable"), (tmp_path / "local/{rank}",
                                                "local")):
            root = tmp_path / tier
            with hoist.CheckpointManager(
                    root, keep=1, local_root=local,
                    persist_every=1 if local is None else 100,
                    preemption_signals=(signal.SIGTERM,),
                    preemption_poll_s=0.01) as mgr:
                state = {"w": np.arange(8.0)}
                if local is None:
                    mgr.save(100, state).wait()
                assert not mgr.reached_preemption(101)
                os.kill(os.getpid(), signal.SIGTERM)
                step = 102
                while not mgr.reached_preemption(step):
                    step += 1
                handle = mgr.save(step, state)
                assert handle.tier == tier
                assert handle.wait()["tier"] == tier
                if local is None:  # keep=1 did not delete step 100
                    assert mgr.steps == [100, step]
            with hoist.CheckpointManager(root, local_root=local) as mgr:
                assert np.array_equal(mgr.restore()["w"], state["w"])
                assert mgr.last_restore["step"] == step
        assert len(seen) == 2  # the job's own handler ran too
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_reached_preemption_is_false_without_signals(tmp_path):
    import hoist
    with hoist.CheckpointManager(tmp_path / "ckpt") as mgr:
        assert mgr.reached_preemption(5) is False
        with pytest.raises(ValueError, match="without preemption signals"):
            mgr.note_preemption()
