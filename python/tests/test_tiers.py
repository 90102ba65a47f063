"""The local tier from Python jobs, under the real launchers: torchrun (4
ranks, DTensors on a 2 x 2 data x model mesh) and 2 jax.distributed
processes (CPU backend). Steps go to each process's local root (every step)
and every 4th to the durable root; one rank's local directory is lost (under
torchrun, and that rank killed with the next step in flight); a new job
restores the newest step from the local tier, that rank's part from its
replica, bit-exact, and each rank's RNG states and data position
(hoist.PerRank) as it saved them. Per-rank state restored on another world
size is refused, or handed over whole with per_rank="all"."""
import json
import shutil
import subprocess
import sys

import pytest

from test_multiprocess import HERE, _env, _free_port, torchrun

pytest.importorskip("torch")
pytest.importorskip("jax")


def jax_job(nproc, *args, timeout=180):
    port = _free_port()
    procs = [subprocess.Popen(
        [sys.executable, str(HERE / "tiers_worker.py"), "jax", str(port),
         str(p), str(nproc), *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=_env()) for p in range(nproc)]
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, out in zip(procs, outputs):
        if p.returncode != 0:
            pytest.fail(f"jax process failed {args}:\n{out[-6000:]}")


def check_recovery(figures, lost_rank):
    """`figures`: rank 0's last_restore, and every rank's bytes_received."""
    assert figures["tier"] == "local", figures
    assert figures["step"] == 6, figures
    assert f"rank {lost_rank}'s part from rank" in figures["note"], figures
    received = figures["received_by_rank"]
    assert received[lost_rank] > 0, received
    assert all(r == 0 for i, r in enumerate(received) if i != lost_rank), (
        received)


@pytest.mark.slow(44)
def test_torchrun_jobs_recover_a_lost_local_root_share_reads_and_ranks(
        tmp_path):
    """Three torchrun jobs (4, 4, then 2 ranks), the second running several
    of tiers_worker.py's phases, since a launch costs more than a phase:
    - Steps 1-6 saved; step 7 in flight when rank 1 loses its local root
      and is killed. The others' step 7 fails (on the lost peer, a
      CoordinationError; or, when rank 1's saver saw its storage vanish
      before the kill, an OSError naming its failed part), or torchrun
      stops them first; torchrun fails the job. The next job restores step
      6 from the local tier, rank 1's part from its replica.
    - Data-parallel replicas on a 2 x 2 mesh: "w" is replicated over
      "data", so two ranks need each of its boxes. With shared reads the
      job reads each byte once (one rank reads, the other receives it over
      gloo); without, each rank reads all it needs.
    - Per-rank state restored on as many ranks as saved it (each its own),
      and on 2 (refused, or every rank's with per_rank="all")."""
    root, local = tmp_path / "durable", tmp_path / "local"
    killed = torchrun(4, "torch", "save_kill", root, local, 6, check=False,
                      script="tiers_worker.py")
    assert killed.returncode != 0, killed.stdout[-2000:]
    assert (tmp_path / "killed").read_text() == "rank 1 at step 7"
    assert "completed without rank 1" not in killed.stderr
    assert not (local / "1").exists()  # rank 1's node lost it
    assert sorted(p.name for p in root.glob("step_*")) == ["step_00000004"]
    out, read = tmp_path / "restore.json", tmp_path / "read.json"
    ranks = tmp_path / "ranks"
    torchrun(4, "torch", "restore", root, local, out,
             "read_once", tmp_path / "shared", "-", read,
             "ranks_save", ranks, "-", "-",
             "ranks_restore", ranks, "-", 4, script="tiers_worker.py")
    torchrun(2, "torch", "ranks_restore", ranks, "-", 4,
             script="tiers_worker.py")
    check_recovery(json.loads(out.read_text()), 1)
    figures = json.loads(read.read_text())
    shared, separate = figures["shared"], figures["separate"]
    assert figures["unique"] <= shared["bytes_read"] <= (
        figures["unique"] * 1.1), figures
    assert shared["bytes_received"] > 0, figures
    assert separate["bytes_received"] == 0, figures
    assert separate["bytes_read"] == (
        shared["bytes_read"] + shared["bytes_received"]), figures


def test_jax_processes_recover_a_lost_local_root_from_its_replica(tmp_path):
    root, local = tmp_path / "durable", tmp_path / "local"
    jax_job(2, "save", root, local, 6)
    shutil.rmtree(local / "0")
    out = tmp_path / "restore.json"
    jax_job(2, "restore", root, local, out)
    check_recovery(json.loads(out.read_text()), 0)
