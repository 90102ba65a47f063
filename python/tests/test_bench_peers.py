"""bench/peers.py runs end to end and writes the report the README shows
(a small model, two systems, one round, no scaling figures; the real run is
`bench/peers.py`)."""
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
        [sys.executable, str(REPO / "bench/peers.py"), "--size", "64MiB",
         "--systems", "hoist,numpy", "--scaling-sizes", "",
         "--scaling-writers", "", "--rounds", "1", "--published-bytes",
         "256MiB", "--published-repeats", "1", "--dir",
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
