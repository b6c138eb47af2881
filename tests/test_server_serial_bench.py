"""benchmarks/server_serial.py --compare: both versions alternate, the other one under its own
PYTHONPATH, and the ratios written are the means' of this version over the other's."""

from __future__ import annotations

import json

import pytest

from fedgat.benchmarks import server_serial as bench


def test_compare_alternates_the_versions_and_writes_their_ratios(tmp_path, monkeypatch):
    calls: list = []
    clocks = {  # (version's PYTHONPATH, run) -> upload, download, main process per GB, per result
        ("/other/src", 0): (5.0, 2.0, 10.0, 3.0),
        ("/other/src", 1): (5.4, 1.8, 10.4, 3.4),
        (None, 0): (4.0, 1.0, 9.0, 2.7),
        (None, 1): (3.8, 0.9, 9.4, 3.1),
    }

    def one(args, pythonpath):
        run = sum(1 for p, _ in calls if p == pythonpath)
        calls.append((pythonpath, run))
        return dict(zip(bench.COMPARED, clocks[(pythonpath, run)]))

    monkeypatch.setattr(bench, "_one", one)
    argv = ["--compare", "/other/src", "--runs", "2", "--out", str(tmp_path), "--name", "cmp"]
    assert bench.main([*argv, "--label", "old vs new"]) == 0
    assert calls == [("/other/src", 0), (None, 0), ("/other/src", 1), (None, 1)]  # other first, alternating
    got = json.loads((tmp_path / "cmp.json").read_text())
    assert [r["version"] for r in got["rows"]] == ["other", "this", "other", "this"]
    ratios = got["ratios_this_over_other"]
    assert ratios["upload_s_per_gb"] == pytest.approx(3.9 / 5.2)
    assert ratios["download_s_per_gb"] == pytest.approx(0.95 / 1.9)
    assert ratios["main_process_ms_per_result"] == pytest.approx(2.9 / 3.2)
    md = (tmp_path / "cmp.md").read_text()
    assert "old vs new" in md and "| **this / other (means)** | | **0.75x** | **0.50x** |" in md
    assert "'old vs new'" in got["command"]  # quoted as a shell would need it
