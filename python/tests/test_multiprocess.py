"""hoist in multi-process jobs, under the real launchers: torchrun (gloo)
with DTensor state, and several jax.distributed processes on the CPU
backend with global arrays. Saved on one number of processes, restored on
others, bit-exact; a rank killed mid-save."""
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("jax")

HERE = Path(__file__).parent / "dist"
BIN = Path(sys.executable).parent


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _env():
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # each worker sets its own device count
    env["OMP_NUM_THREADS"] = "1"
    return env


def job_args(jobs):
    """The arguments of a worker that runs several jobs one after another
    (dist/jobs.py): each job (arg1, arg2, arg3, options dict)."""
    args = []
    for first, second, third, options in jobs:
        args += [str(first), str(second), str(third), json.dumps(options)]
    return args


def same_saved(want, got):
    """Asserts that two files torch.save wrote hold the same tensors, bit
    for bit."""
    import torch
    want, got = torch.load(want), torch.load(got)
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key


def torchrun(nproc, *args, check=True, timeout=180,
             script="torch_worker.py"):
    """Runs `script` (torch_worker.py) under torchrun on `nproc` local
    ranks. Its agent looks every 0.5 s whether the workers have ended (at
    2 s, each job ended a second later on average)."""
    command = [str(BIN / "torchrun"), "--nproc-per-node", str(nproc),
               "--master-port", str(_free_port()), "--monitor-interval", "0.5",
               str(HERE / script), *map(str, args)]
    done = subprocess.run(command, capture_output=True, text=True,
                          timeout=timeout, env=_env())
    if check and done.returncode != 0:
        pytest.fail(f"torchrun {nproc} {args} failed:\n{done.stdout[-4000:]}"
                    f"\n{done.stderr[-6000:]}")
    return done


def _start_jax(nproc, devices, args):
    port = _free_port()
    return [subprocess.Popen(
        [sys.executable, str(HERE / "jax_worker.py"), str(port), str(p),
         str(nproc), str(devices), *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=_env()) for p in range(nproc)]


def jax_processes(nproc, devices, *args, timeout=180):
    """Runs `nproc` jax_worker.py processes, `devices` CPU devices each,
    joined by jax.distributed."""
    procs = _start_jax(nproc, devices, args)
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, out in zip(procs, outputs):
        if p.returncode != 0:
            pytest.fail(f"jax process failed ({nproc}x{devices} {args}):\n"
                        f"{out[-6000:]}")


def _jobs(*commands):
    """torch_worker.py's arguments for `commands` run in one job."""
    args = []
    for command in commands:
        args += (["--"] if args else []) + [str(a) for a in command]
    return args


def _writers(root, step):
    """Which ranks wrote the step's data files."""
    manifest = json.loads(
        (root / f"step_{step:08d}" / "MANIFEST.json").read_text())
    files = {e["file"] for a in manifest["arrays"] for e in a["extents"]}
    return {f.split("/")[-1][:6] for f in files}


@pytest.mark.slow(50)
def test_torchrun_jobs_restore_and_resume_on_other_world_sizes(
        tmp_path, s3_env):
    """Three torchrun jobs (2, 4, then 2 ranks), each running several of
    torch_worker.py's commands, since a launch costs more than most of
    them:
    - DTensor state saved on 2 ranks in layout a, restored on 4 onto
      layouts a and b (other placements), bit-exact; then the other way
      round: saved on 4 (in the same job) and restored on 2; every rank
      wrote its share (the replicated plain tensor once).
    - What a DCP job left (DTensors sharded over 2 ranks, saved with
      torch.distributed.checkpoint), imported as a hoist step in one
      process, restored by the 4-rank job onto both layouts, bit-exact,
      each rank reading only the extents its shards meet.
    - 4 ranks append to one metrics file: each save's phases, every
      rank's, adding up to each save's time on that rank.
    - An FSDP2 model + AdamW trained on 2 ranks, saved at step 4, resumed:
      on 2 ranks it ends bit-exactly where the uninterrupted run ends; on
      4 ranks bit-exactly where a run resharded from the full state
      (torch.save of full tensors, no hoist) ends. (Across world sizes the
      gradient reduction sums in another order, so no checkpoint can match
      the 2-rank run's bits there.)
    - torchao's float8 training weights under FSDP2 (DTensors of its float8
      all-gather wrapper) round-trip bit-exactly into a fresh model; a
      DTensor of float8 data and its scale is refused, named.
    - On S3 (SeaweedFS): each rank uploads its own objects into the one
      prefix, and the step restores on 4 ranks onto both layouts. Last in
      the first job, rank 1 is SIGKILLed while its share of step 2
      uploads: rank 0's save fails naming the lost rank, step 2 never
      appears, and the 4-rank job (the resumed one) restores step 1 onto
      both layouts and saves step 2 into the same prefix."""
    import uuid
    import hoist
    torch = pytest.importorskip("torch")
    root, trained = tmp_path / "ckpt", tmp_path / "trained"
    out = {k: tmp_path / f"{k}.pt" for k in "abcd"}
    shared, killed = (f"s3://{s3_env.bucket}/{uuid.uuid4().hex[:12]}"
                      for _ in range(2))
    seen = tmp_path / "rank0.json"

    def train(name, **spec):
        return ("train", trained, 8, json.dumps({"out": str(out[name]),
                                                 **spec}))

    job = torchrun(2, *_jobs(("save", root, 5, "a"),
                             ("float8", tmp_path / "float8"),
                             ("dcp", tmp_path / "dcp", "a"),
                             train("a", save_at=4, full_at=4),
                             train("b", resume=4),
                             ("save", shared, 1, "a"),
                             ("kill", killed, seen)), check=False)
    assert seen.exists(), (job.stdout + job.stderr)[-6000:]
    _killed_on_s3(shared, json.loads(seen.read_text()))
    hoist.import_checkpoint(tmp_path / "dcp", tmp_path / "imported", 7,
                            format="dcp")
    metrics = tmp_path / "metrics.jsonl"
    torchrun(4, *_jobs(("restore", root, 5, 6),
                       ("restore", tmp_path / "imported", 7),
                       ("metrics", tmp_path / "root", metrics,
                        tmp_path / "infos"),
                       train("c", resume=4),
                       train("d", from_full=f"{out['a']}.full"),
                       ("restore", shared, 1),
                       ("restore", killed, 1, 2)))
    assert hoist.verify(killed) == (2, [])
    assert hoist.verify(f"{killed}/step_00000001") == (1, [])
    torchrun(2, "restore", root, 6)
    assert _writers(root, 5) == {f"r{r:05d}" for r in range(2)}
    assert _writers(root, 6) == {f"r{r:05d}" for r in range(4)}
    _check_metrics(metrics, tmp_path / "infos", ranks=4)
    uninterrupted, resumed_same, resumed_on_4, resharded_on_4 = (
        torch.load(out[name]) for name in "abcd")
    assert uninterrupted.keys() == resumed_on_4.keys()
    for name, want in uninterrupted.items():
        assert torch.equal(resumed_same[name], want), name
        assert torch.equal(resumed_on_4[name], resharded_on_4[name]), name
        torch.testing.assert_close(resumed_on_4[name], want)


def _killed_on_s3(shared, seen):
    """Each rank's objects in the shared prefix; what rank 0 of the job
    whose rank 1 was killed saw."""
    import hoist
    manifest = hoist.inspect(shared)
    files = {e["file"] for a in manifest["arrays"] for e in a["extents"]}
    assert {f.split("/")[-1][:6] for f in files} == {"r00000", "r00001"}
    assert seen["type"] == "CoordinationError", seen
    assert re.search(r"rank 1 \(host [^)]+\) left the job",
                     seen["error"]), seen
    assert seen["steps"] == [1]


def _check_metrics(metrics, infos, ranks):
    """The metrics file of torch_worker.py's metrics command: one record
    per phase per rank per save, adding up to each save's time."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    phases = ["planning", "queued", "staging", "write", "hash", "commit",
              "retention"]
    by_save = {}
    for record in records:
        assert record["kind"] == "save" and record["tier"] == "durable"
        by_save.setdefault((record["step"], record["rank"]), []).append(record)
    assert sorted(by_save) == [(s, r) for s in (1, 2, 3)
                               for r in range(ranks)]
    for rank in range(ranks):
        for info in json.loads(Path(f"{infos}.{rank}.json").read_text()):
            mine = by_save[(info["step"], rank)]
            assert [r["phase"] for r in mine] == phases
            total = sum(r["seconds"] for r in mine)
            assert total == pytest.approx(info["elapsed_s"], abs=1e-5)
            assert all(r["elapsed_s"] == pytest.approx(info["elapsed_s"],
                                                       abs=1e-5)
                       for r in mine)
            assert set(info["slowest"]) == set(phases[:4])
            assert all(0 <= s["rank"] < ranks
                       for s in info["slowest"].values())


def _survivor_saw(out, root, error_type, text, output):
    """What rank 0 wrote of the broken save of step 2 (outcome.py), checked:
    the error, and only step 1 committed with no temporary directory.
    `output`: what the job printed, shown if rank 0 wrote nothing."""
    if not out.exists():
        pytest.fail(f"rank 0 wrote no report; the job printed:\n"
                    f"{output[-8000:]}")
    seen = json.loads(out.read_text())
    assert seen["type"] == error_type, seen
    assert text in seen["error"], seen
    assert seen["steps"] == [1]            # step 2 never became visible
    assert not [p for p in root.iterdir() if ".tmp" in p.name]
    return seen


def test_torchrun_rank_killed_mid_save_leaves_committed_steps(tmp_path):
    root, out = tmp_path / "ckpt", tmp_path / "rank0.json"
    job = torchrun(2, "kill", root, out, check=False)
    seen = _survivor_saw(out, root, "CoordinationError", "left the job",
                         job.stdout + job.stderr)
    assert "rank 1 (host " in seen["error"], seen  # named, with its host
    assert seen["waited_s"] < 30           # not the 60 s timeout
    assert sorted(p.name for p in root.iterdir()) == [".hoist.lock",
                                                        "step_00000001"]
    # Step 1 is intact: verified and restored in a later, single process.
    import hoist
    torch = pytest.importorskip("torch")
    with hoist.CheckpointManager(root, coordinator="single") as mgr:
        assert mgr.verify(1) == []
        restored = mgr.restore(1)
    assert torch.equal(restored["plain"], torch.arange(100))
    assert restored["model"]["w"].shape == (13, 6)


def test_torchrun_hung_rank_is_named_after_the_timeout(tmp_path):
    root, out = tmp_path / "ckpt", tmp_path / "rank0.json"
    job = torchrun(2, "hang", root, out, check=False)
    seen = _survivor_saw(out, root, "TimeoutError",
                         "did not arrive within 5 s",
                         job.stdout + job.stderr)
    assert "rank 1 (host " in seen["error"], seen  # named, with its host
    assert 4.5 < seen["waited_s"] < 60


def test_jax_global_arrays_restore_on_other_process_counts(tmp_path):
    """Saved by 2 processes of 4 devices in layout a; restored in layout b
    by 1 process of 8 devices and by 4 of 2, and in layout a by 2 of 4."""
    root = tmp_path / "ckpt"
    jax_processes(2, 4, "save", root, 3, "a")
    jax_processes(1, 8, "restore", root, 3, "b")
    jax_processes(4, 2, "restore", root, 3, "b")
    jax_processes(2, 4, "restore", root, 3, "a")


@pytest.mark.parametrize("staging", ["auto", "pjrt"])
def test_jax_repeat_save_of_global_arrays_restores_on_one_process(
        tmp_path, staging):
    """Two processes save step 1, then step 2 from new global arrays through
    the repeat-save path (each process's shards taken again in the order of
    the first save; with staging="pjrt", each process's shards moved to host
    memory in one transfer per save, as on a TPU); both steps restore on one
    process in another layout."""
    root = tmp_path / "ckpt"
    jax_processes(2, 4, "save_twice", root, 1, "a", staging)
    jax_processes(1, 8, "restore", root, 1, "b")
    jax_processes(1, 8, "restore", root, 2, "b")


def test_jax_hung_process_is_named_after_the_timeout(tmp_path):
    root, out = tmp_path / "ckpt", tmp_path / "process0.json"
    procs = _start_jax(2, 4, ["hang", root, out])
    printed = ""
    try:
        printed = procs[0].communicate(timeout=120)[0]
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    seen = _survivor_saw(out, root, "TimeoutError",
                         "rank 1 did not arrive within 5 s", printed)
    assert 4.5 < seen["waited_s"] < 60
