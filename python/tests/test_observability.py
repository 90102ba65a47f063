"""Watching a checkpoint: per-phase metrics (wait(), last_restore, the
metrics file, Prometheus, a torchrun job's records), progress (Python's
progress=, the CLI's on a pseudo-terminal, in a log, and --quiet), and
hoist.diff / `hoist diff`."""
import json
import logging
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import hoist

BIN = Path(sys.executable).parent
SAVE_PHASES = ["planning", "queued", "staging", "write", "hash", "commit",
               "retention"]
RESTORE_PHASES = ["planning", "read", "verify", "place"]


def _state(n=8, seed=0):
    rng = np.random.default_rng(seed)
    return {f"layer{i}": {"w": rng.standard_normal((64, 32)).astype(
        np.float32), "b": np.zeros(32, np.float32)} for i in range(n)}


def test_phases_add_up_and_are_appended_to_the_metrics_file(root, tmp_path):
    metrics = tmp_path / "metrics.{rank}.jsonl"
    with hoist.CheckpointManager(root, keep=1, metrics_path=metrics) as mgr:
        infos = [mgr.save(step, _state(seed=step)).wait() for step in (1, 2)]
        restored = mgr.restore()
        stats = mgr.last_restore
    np.testing.assert_array_equal(restored["layer3"]["w"],
                                  _state(seed=2)["layer3"]["w"])
    for info in infos:
        assert list(info["phases"]) == SAVE_PHASES
        total = sum(p["seconds"] for p in info["phases"].values())
        assert total == pytest.approx(info["elapsed_s"], abs=1e-5)
        assert info["phases"]["staging"]["bytes"] == info["bytes"]
        assert list(info["slowest"]) == SAVE_PHASES[:4]
        assert all(p["rank"] == 0 for p in info["phases"].values())
    assert list(stats["phases"]) == RESTORE_PHASES
    assert sum(p["seconds"] for p in stats["phases"].values()) == \
        pytest.approx(stats["elapsed_s"], abs=1e-5)
    assert stats["phases"]["read"]["bytes"] == stats["bytes_read"]

    records = [json.loads(line) for line in
               (tmp_path / "metrics.0.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"], r["phase"]) for r in records] == [
        ("save", 1, p) for p in SAVE_PHASES] + [
        ("save", 2, p) for p in SAVE_PHASES] + [
        ("restore", 2, p) for p in RESTORE_PHASES]
    by_step = {r["phase"]: r for r in records[7:14]}
    assert by_step["write"]["seconds"] == pytest.approx(
        infos[1]["phases"]["write"]["seconds"], abs=1e-5)
    assert by_step["write"]["elapsed_s"] == pytest.approx(
        infos[1]["elapsed_s"], abs=1e-5)


def test_a_metrics_path_that_cannot_be_written_fails_at_open(root, tmp_path):
    with pytest.raises(ValueError, match="metrics_path .* cannot be opened"):
        hoist.CheckpointManager(root, metrics_path=tmp_path / "no" / "m.jsonl")
    assert not (root / "step_00000001").exists()


def test_prometheus_collector_exposes_histograms_by_phase(root):
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from hoist.metrics import PrometheusCollector
    registry = CollectorRegistry()
    with hoist.CheckpointManager(root) as mgr:
        registry.register(PrometheusCollector(mgr))
        for step in (1, 2, 3):
            mgr.save(step, _state(seed=step)).wait()
        mgr.restore()
        text = generate_latest(registry).decode()
        mgr.save(4, _state(seed=4)).wait()
        again = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) >= {
        "hoist_save_phase_seconds", "hoist_save_phase_bytes",
        "hoist_restore_phase_seconds", "hoist_restore_phase_bytes",
        "hoist_save_seconds", "hoist_restore_seconds"}
    assert families["hoist_save_phase_seconds"].type == "histogram"
    counts = {s.labels["phase"]: s.value
              for s in families["hoist_save_phase_seconds"].samples
              if s.name.endswith("_count")}
    assert counts == {phase: 3 for phase in SAVE_PHASES}
    staged = [s for s in families["hoist_save_phase_bytes"].samples
              if s.name.endswith("_sum") and s.labels["phase"] == "staging"]
    assert staged[0].value == 3 * sum(
        a.nbytes for layer in _state().values() for a in layer.values())
    restores = [s for s in families["hoist_restore_seconds"].samples
                if s.name.endswith("_count")]
    assert restores[0].value == 1 and restores[0].labels["tier"] == "durable"
    # A later scrape adds the saves since, to the same series.
    counts = {s.labels["phase"]: s.value for f in
              text_string_to_metric_families(again)
              if f.name == "hoist_save_phase_seconds"
              for s in f.samples if s.name.endswith("_count")}
    assert counts["staging"] == 4


class _Recorded(logging.Handler):
    """The messages logged on the "hoist" logger while it is attached."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_progress_callable_sees_every_byte_and_a_raising_one_is_logged(
        root):
    with hoist.CheckpointManager(root) as mgr:
        mgr.save(1, _state(n=32)).wait()
        events = []
        mgr.restore(progress=events.append)
        total = mgr.last_restore["bytes_read"]

        def broken(event):
            raise RuntimeError("the bar fell over")

        recorded = _Recorded()
        logging.getLogger("hoist").addHandler(recorded)
        try:
            assert mgr.verify(1, progress=broken) == []
        finally:
            logging.getLogger("hoist").removeHandler(recorded)
    assert events[-1]["finished"] and events[-1]["done"] == total
    assert events[-1]["total"] == total and events[-1]["unit"] == "B"
    assert events[-1]["operation"] == "restore"
    done = [e["done"] for e in events]
    assert done == sorted(done)
    assert sum(e["finished"] for e in events) == 1
    warned = recorded.messages
    assert any("progress callback of verify raised RuntimeError" in m
               and "goes on" in m for m in warned), warned


def test_progress_true_shows_a_tqdm_bar(root, capsys):
    pytest.importorskip("tqdm")
    with hoist.CheckpointManager(root) as mgr:
        mgr.save(1, _state()).wait()
    step, problems = hoist.verify(root, progress=True)
    assert (step, problems) == (1, [])
    err = capsys.readouterr().err
    assert "hoist verify" in err and "100%" in err
    with pytest.raises(TypeError, match="progress must be"):
        hoist.verify(root, progress="yes")


def test_export_and_import_report_progress(root, tmp_path):
    with hoist.CheckpointManager(root) as mgr:
        mgr.save(1, _state()).wait()
    exported, imported = [], []
    stats = hoist.export(root, tmp_path / "hf", progress=exported.append)
    assert exported[-1]["done"] == exported[-1]["total"] == stats["bytes"]
    info = hoist.import_checkpoint(tmp_path / "hf", tmp_path / "back", 5,
                                   "safetensors", progress=imported.append)
    assert imported[-1]["done"] == imported[-1]["total"] == info["bytes"]


def test_diff_names_exactly_the_changed_arrays_and_their_maxima(root):
    state = {f"a{i:04d}": np.full(16, i, np.float32) for i in range(1000)}
    with hoist.CheckpointManager(root) as mgr:
        mgr.save(1, state).wait()
        state["a0007"] = state["a0007"].copy()
        state["a0007"][3] += 0.25          # max abs 0.25, rel 0.25 / 7
        state["a0500"] = state["a0500"] * 3  # max abs 1000, rel 2
        del state["a0999"]
        state["new"] = np.zeros(4, np.int32)
        state["a0001"] = np.ones((4, 4), np.float32)  # same name, new shape
        mgr.save(2, state).wait()
    diff = hoist.diff(root, 1, 2)
    assert diff["added"] == ["new"] and diff["removed"] == ["a0999"]
    assert sorted(c["name"] for c in diff["changed"]) == [
        "a0001", "a0007", "a0500"]
    assert diff["unchanged"] == 1000 - 4
    reshaped = next(c for c in diff["changed"] if c["name"] == "a0001")
    assert reshaped["retyped"] and reshaped["shape_a"] == (16,)
    assert reshaped["shape_b"] == (4, 4)
    values = {c["name"]: c for c in
              hoist.diff(root, 1, 2, values=True)["changed"]}
    assert values["a0007"]["max_abs_diff"] == pytest.approx(0.25)
    assert values["a0007"]["max_rel_diff"] == pytest.approx(0.25 / 7)
    assert values["a0500"]["max_abs_diff"] == pytest.approx(1000)
    assert values["a0500"]["max_rel_diff"] == pytest.approx(2)
    assert values["a0001"]["max_abs_diff"] is None  # retyped: not compared

    done = subprocess.run([str(BIN / "hoist"), "diff", str(root), "1", "2",
                           "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    cli = json.loads(done.stdout)
    assert cli["added"] == ["new"] and cli["removed"] == ["a0999"]
    assert sorted(c["name"] for c in cli["changed"]) == [
        "a0001", "a0007", "a0500"]
    text = subprocess.run([str(BIN / "hoist"), "diff", str(root), "1",
                           str(root), "2"], capture_output=True, text=True)
    assert "~ a0001: float32(16,) -> float32(4, 4)" in text.stdout, text.stdout


def test_diff_of_a_corrupt_manifest_names_it(root):
    with hoist.CheckpointManager(root) as mgr:
        mgr.save(1, _state()).wait()
        mgr.save(2, _state()).wait()
    (root / "step_00000002" / "MANIFEST.json").write_text("{")
    with pytest.raises(hoist.DataLossError,
                       match=r"step 2 of .*ckpt.*MANIFEST.json"):
        hoist.diff(root, 1, 2)
    done = subprocess.run([str(BIN / "hoist"), "diff", str(root), "1", "2"],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "step 2 of" in done.stderr


@pytest.fixture(scope="module")
def big_step(tmp_path_factory):
    """A root whose step 1 is 1 GiB."""
    path = tmp_path_factory.mktemp("big") / "ckpt"
    chunk = np.ones(64 << 20, np.uint8)
    with hoist.CheckpointManager(path, pool_bytes=256 << 20) as mgr:
        mgr.save(1, {f"c{i:02d}": chunk for i in range(16)}).wait()
    return path


def _verify_on_a_terminal(path):
    """`hoist verify PATH` with stderr on a pseudo-terminal: (seconds from
    start to its first progress line, the text it wrote there, exit)."""
    leader, follower = pty.openpty()
    start = time.monotonic()
    proc = subprocess.Popen([str(BIN / "hoist"), "verify", str(path)],
                            stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    first, text = None, b""
    while True:
        ready, _, _ = select.select([leader], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        if first is None:
            first = time.monotonic() - start
        text += chunk
    os.close(leader)
    return first, text.decode(), proc.wait(timeout=60)


def test_verify_shows_progress_on_a_terminal_and_ends_at_100(big_step):
    first, text, code = _verify_on_a_terminal(big_step)
    assert code == 0
    assert first is not None, "no progress on the terminal"
    print(f"first progress line after {first:.3f} s")
    assert "\r\x1b[K" in text  # redrawn in place
    final = text.split("\r\x1b[K")[-1]
    assert "verify step 1: 1.00 GiB / 1.00 GiB  100%" in final, final


def test_verify_off_a_terminal_prints_lines_and_quiet_prints_none(big_step):
    logged = subprocess.run([str(BIN / "hoist"), "verify", str(big_step),
                             "--progress-every", "0.05"],
                            capture_output=True, text=True)
    assert logged.returncode == 0, logged.stderr
    lines = logged.stderr.splitlines()
    assert lines and all(line.startswith("verify step 1: ") for line in lines)
    assert "\r" not in logged.stderr and "100%" in lines[-1]
    assert "OK" in logged.stdout
    quiet = subprocess.run([str(BIN / "hoist"), "verify", str(big_step),
                            "--progress-every", "0.05", "--quiet"],
                           capture_output=True, text=True)
    assert quiet.returncode == 0 and quiet.stderr == ""
    as_json = subprocess.run([str(BIN / "hoist"), "verify", str(big_step),
                              "--json", "-q"], capture_output=True, text=True)
    assert json.loads(as_json.stdout)["ok"] is True


def test_verify_of_a_step_copied_out_of_its_root_says_so(root, tmp_path):
    import shutil
    with hoist.CheckpointManager(root) as mgr:
        mgr.save(3, _state()).wait()
    shutil.copytree(root / "step_00000003", tmp_path / "elsewhere")
    done = subprocess.run([str(BIN / "hoist"), "verify",
                           str(tmp_path / "elsewhere")],
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert "is not a step directory inside a root" in done.stderr
