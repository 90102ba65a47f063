"""The benchmarks run end to end, small: bench/peers.py writes the report
the README shows (a small model, two systems, one round, no scaling
figures; the real run is `bench/peers.py`); bench/many_arrays.py and
bench/delta.py theirs."""
import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_peers_benchmark_writes_json_and_chart(tmp_path):
    if not (REPO / "build/release/bench/save_bench").exists():
        pytest.skip("build/release is not built")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(REPO / "bench/peers.py"), "--size", "32MiB",
         "--systems", "hoist,numpy", "--scaling-sizes", "",
         "--scaling-writers", "", "--rounds", "1", "--published-bytes",
         "64MiB", "--published-repeats", "1", "--dir",
         str(tmp_path / "scratch"), "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    for key in ("bytes", "raw_write_gbps", "raw_read_gbps", "memcpy_gbps"):
        assert report[key] > 0, key
    assert report["cache"] in ("dropped", "evicted"), report["cache"]
    for system in ("hoist", "numpy"):
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
