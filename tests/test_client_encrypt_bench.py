"""``benchmarks/client_encrypt.py``: one run side by side (in process, then a pool), the pool's
envelopes checked against the rows, the report's ratios computed from the measured times."""

from __future__ import annotations

import json

import pytest

from fedgat.benchmarks import client_encrypt


def test_bench_measures_a_pool_against_its_floor(tmp_path, capsys):
    assert (
        client_encrypt.main(
            [
                "--rows",
                "6",
                "--dim",
                "40",
                "--batch",
                "4",
                "--recipients",
                "2",
                "--workers",
                "2",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    r = json.loads((tmp_path / "client_encrypt.json").read_text())
    assert r["encryptions"] == 2 * 6 * r["chunks"]
    (pool,) = r["pools"]
    assert pool["workers"] == 2 and pool["max_abs_error"] <= 1e-5
    floor = r["encryptions"] * r["inline"]["cpu_s"] / r["encryptions"] / min(2, r["cores"])
    assert pool["floor_s"] == pytest.approx(floor)
    assert pool["vs_floor"] == pytest.approx(pool["wall_s"] / pool["floor_s"])
    assert pool["speedup_vs_inline"] == pytest.approx(r["inline"]["wall_s"] / pool["wall_s"])
    assert pool["worker_cpu_s"] > 0
    assert "| 2 |" in (tmp_path / "client_encrypt.md").read_text()
    assert "encryptions" in capsys.readouterr().out


def test_bench_refuses_empty_sizes(tmp_path):
    with pytest.raises(SystemExit):
        client_encrypt.main(["--workers", "0", "--out", str(tmp_path)])
