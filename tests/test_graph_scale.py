"""``benchmarks/graph_scale.py``: its smoke path writes the JSON, Markdown and plot with every field, and
the growth exponent is the log-log slope computed by hand."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("graph_scale", CHECKOUT / "benchmarks" / "graph_scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gs = _module()


def test_slope_matches_hand_computation():
    assert gs.slope(1000, 2.0, 4000, 8.0) == pytest.approx(1.0)
    assert gs.slope(100, 1.0, 1000, 100.0) == pytest.approx(2.0)
    assert gs.slope(3, 5.0, 7, 11.0) == pytest.approx(math.log(11 / 5) / math.log(7 / 3))
    assert gs.slope(10, 0.0, 20, 1.0) is None
    assert gs.slope(10, 1.0, 10, 2.0) is None


def test_growth_uses_consecutive_sizes():
    def run(edges, seconds, rss):
        return {"mode": "plain", "edges": edges, "phases": {"build": {"seconds": seconds, "peak_rss": rss}}}

    rows = gs.growth([run(400, 3.0, 900), run(100, 1.0, 300), run(200, 1.5, 600)])
    assert [(r["edges_from"], r["edges_to"]) for r in rows] == [(100, 200), (200, 400)]
    assert rows[0]["time_slope"] == round(math.log(1.5) / math.log(2), 3)
    assert rows[1]["time_slope"] == 1.0 and rows[0]["rss_slope"] == 1.0


def test_quick_run_writes_results(tmp_path):
    out = tmp_path / "res"
    assert (
        gs.main(
            [
                "--quick",
                "--nodes",
                "120",
                "240",
                "--clients",
                "3",
                "--encrypted-max-nodes",
                "120",
                "--upload-window",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads((out / "graph_scale_quick.json").read_text())
    assert {
        "date",
        "platform",
        "cpus",
        "memory_gib",
        "clients",
        "runs",
        "growth",
        "encrypted_skipped",
    } <= set(data)
    assert data["encrypted_skipped"] == [240]
    runs = data["runs"]
    assert not [r for r in runs if "error" in r], runs
    assert sorted((r["nodes"], r["mode"]) for r in runs) == [
        (120, "encrypted"),
        (120, "plain"),
        (240, "plain"),
    ]
    for r in runs:
        assert r["edges"] > 0 and r["peak_rss"] > 0
        for p in r["phases"].values():
            assert p["seconds"] >= 0 and p["peak_rss"] > 0
    plain = [r for r in runs if r["mode"] == "plain"]
    for r in plain:
        assert {"build", "partition", "plaintext_pretrain", "train"} <= set(r["phases"])
        assert r["phases"]["train"]["bytes_up"] > 0 and r["phases"]["plaintext_pretrain"]["bytes_down"] > 0
    enc = next(r for r in runs if r["mode"] == "encrypted")["phases"]["encrypted_pretrain"]
    assert enc["bytes_up"] > 0 and enc["bytes_down"] > 0
    # the encrypted round paced one recipient at a time: its spool never held all three clients' uploads
    assert data["upload_window"] == enc["upload_window"] == 1
    assert 0 < enc["peak_spooled_bytes"] < 0.6 * enc["bytes_up"]
    by_edges = {r["edges"]: r["phases"]["train"] for r in plain}
    (e1, p1), (e2, p2) = sorted(by_edges.items())
    row = next(g for g in data["growth"] if g["phase"] == "train")
    assert (row["edges_from"], row["edges_to"]) == (e1, e2)
    want = math.log(p2["seconds"] / p1["seconds"]) / math.log(e2 / e1)
    assert row["time_slope"] == pytest.approx(want, abs=1e-3)
    want_rss = math.log(p2["peak_rss"] / p1["peak_rss"]) / math.log(e2 / e1)
    assert row["rss_slope"] == pytest.approx(want_rss, abs=1e-3)
    assert (out / "graph_scale_quick.md").read_text().startswith("# Graph scale")
    assert (out / "graph_scale_quick.png").stat().st_size > 0
