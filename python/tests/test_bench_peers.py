"""The benchmarks run end to end, small: bench/peers.py writes the report
the README shows (a small model, two systems, one round, no scaling
figures; the real run is `bench/peers.py`); bench/many_arrays.py (and its
--scaling guard) and bench/delta.py theirs."""
import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


# torch.save in the suite; Meta's torch-checkpointing (18 s of the test's
# 34 here, most of it its imports in fresh processes) with HOIST_LONG=1.
@pytest.mark.slow(37)
@pytest.mark.parametrize("peer", [
    "torch", pytest.param("torch_checkpointing", marks=pytest.mark.long)])
def test_peers_benchmark_writes_json_and_chart(tmp_path, peer):
    if not (REPO / "build/release/bench/save_bench").exists():
        pytest.skip("build/release is not built")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(REPO / "bench/peers.py"), "--size", "32MiB",
         "--systems", f"hoist,numpy,{peer}", "--scaling-sizes", "",
         "--scaling-writers", "", "--rounds", "1", "--published-bytes",
         "64MiB", "--published-repeats", "1", "--dir",
         str(tmp_path / "scratch"), "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    for key in ("bytes", "raw_write_gbps", "raw_read_gbps", "memcpy_gbps"):
        assert report[key] > 0, key
    assert report["cache"] in ("dropped", "evicted"), report["cache"]
    for system in ("hoist", "numpy", peer):
        figures = report["systems"][system]
        assert figures["verified"] is True, figures
        for key in ("save_s", "blocked_s", "restore_s", "peak_rss_bytes",
                    "restore_rss_growth_bytes"):
            assert figures[key] > 0, (system, key)
    assert report["published"]["repeats"] == 1
    assert report["scaling_size"] == report["scaling_writers"] == []
    targets = {t["target"] for t in report["targets"]}
    assert "C++ restore >= 0.9 of the disk's read limit" in targets
    assert json.loads((out / "peers.json").read_text()) == report
    assert (out / "peers.svg").read_text().startswith("<svg")


def test_many_arrays_benchmark_restores_bit_exact(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "bench/many_arrays.py"), "--counts",
         "300", "--dir", str(tmp_path / "scratch"), "--json"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(result.stdout)
    assert [r["arrays"] for r in rows] == [300]
    for row in rows:
        assert row["verified"] is True, row
        assert 0 < row["engine_s"] <= row["hoist_s"], row
        assert row["torch_s"] > 0, row
        for key in ("first_blocked_s", "repeat_blocked_s", "torch_save_s"):
            assert isinstance(row[key], float), row


def test_many_arrays_scaling_reports_every_growth_figure(tmp_path):
    """--scaling end to end, small: a row per count and deltas setting, a
    growth figure per deltas setting and figure, and an exit status that
    says whether one failed (the figures themselves are timings)."""
    result = subprocess.run(
        [sys.executable, str(REPO / "bench/many_arrays.py"), "--scaling",
         "--counts", "200,2000", "--saves", "2", "--dir",
         str(tmp_path / "scratch"), "--json"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode in (0, 1), result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert sorted((r["arrays"], r["deltas"]) for r in report["rows"]) == [
        (200, False), (200, True), (2000, False), (2000, True)]
    for row in report["rows"]:
        assert len(row["blocked_samples"]) == len(row["saved_samples"]) == 2
        assert 0 < row["blocked_s"] <= row["saved_s"], row
    assert sorted((g["deltas"], g["figure"]) for g in report["growth"]) == [
        (False, "blocked"), (False, "saved"), (True, "blocked"),
        (True, "saved")]
    failed = any(g["failed"] for g in report["growth"])
    assert result.returncode == (1 if failed else 0)


def test_many_arrays_growth_fails_above_15x_at_10x_the_arrays():
    """The guard of issue 55: growth_of judges a cost that grows with the
    arrays as met, a little more as over the goal, a quadratic one as a
    failure."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from many_arrays import growth_of
    finally:
        sys.path.remove(str(REPO / "bench"))

    def rows(blocked_10x, saved_10x):
        return [{"arrays": 10000, "deltas": d, "blocked_s": 1.0,
                 "saved_s": 1.0} for d in (True, False)] + [
            {"arrays": 100000, "deltas": d, "blocked_s": blocked_10x,
             "saved_s": saved_10x} for d in (True, False)]

    def verdicts(growth):
        return {("on" if g["deltas"] else "off", g["figure"]):
                "fail" if g["failed"] else
                "met" if g["goal_met"] else "over" for g in growth}

    assert set(verdicts(growth_of(rows(10.0, 11.0))).values()) == {"met"}
    assert verdicts(growth_of(rows(12.0, 100.0))) == {
        ("on", "blocked"): "over", ("on", "saved"): "fail",
        ("off", "blocked"): "over", ("off", "saved"): "fail"}
    assert all(g["goal"] == pytest.approx(11) and
               g["fail"] == pytest.approx(15)
               for g in growth_of(rows(1.0, 1.0)))


def test_delta_benchmark_meets_its_byte_goals(tmp_path):
    """bench/delta.py end to end, small: the bytes written and kept on disk
    are a function of the state, not of the machine's speed."""
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(REPO / "bench/delta.py"), "--size", "32MiB",
         "--saves", "4", "--dir", str(tmp_path), "--out", str(out),
         "--json"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    lora = report["lora"]
    for system in ("hoist_full", "hoist_delta", "hoist_frozen"):
        assert lora[system]["verified"] is True, lora[system]
    for system in ("dcp", "orbax"):
        assert "error" not in lora[system], lora[system]
    ratios = report["ratios"]
    assert ratios["written / full save (delta; goal <= 0.08)"] <= 0.08
    assert ratios["on disk / one state (delta, keep=3; goal <= 1.3)"] <= 1.3
    assert 2.9 <= ratios["on disk / one state (full, keep=3)"] <= 3.1
    assert lora["hoist_frozen"]["written_bytes"] == \
        lora["hoist_delta"]["written_bytes"]
    assert report["pretrain"]["check_cost"] > 0
    assert json.loads((out / "delta.json").read_text()) == report
