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
    assert rows[0]["new_pages_slope"] is None  # none recorded (results from before they were counted)


def test_growth_keeps_each_engines_series_apart():
    def run(engine, edges, train_seconds):
        phases = {
            "build": {"seconds": edges / 100, "peak_rss": edges},
            "train": {"seconds": train_seconds, "peak_rss": edges},
        }
        return {"mode": "plain", "engine": engine, "edges": edges, "phases": phases}

    runs = [
        run("inprocess", 100, 1.0),
        run("ray", 100, 5.0),
        run("inprocess", 200, 2.0),
        run("ray", 200, 20.0),
    ]
    rows = gs.growth(runs)
    train = {r["engine"]: r["time_slope"] for r in rows if r["phase"] == "train"}
    assert train == {"inprocess": 1.0, "ray": 2.0}  # 1 -> 2 s and 5 -> 20 s, never mixed
    build = [r for r in rows if r["phase"] == "build"]
    assert len(build) == 1 and build[0]["engine"] is None  # the same code on every engine: once
    # results written before engines were a dimension read as in-process runs
    old = [{k: v for k, v in r.items() if k != "engine"} for r in runs if r["engine"] == "inprocess"]
    assert [r["engine"] for r in gs.growth(old) if r["phase"] == "train"] == ["inprocess"]


@pytest.mark.ray
def test_a_ray_run_reports_its_engine_and_actors(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    out = tmp_path / "res"
    argv = [
        "--quick",
        "--nodes",
        "120",
        "--clients",
        "3",
        "--modes",
        "plain",
        "--engines",
        "inprocess",
        "ray",
    ]
    assert gs.main([*argv, "--actors", "2", "--no-probe", "--out", str(out)]) == 0
    data = json.loads((out / "graph_scale_quick.json").read_text())
    assert data["engines"] == ["inprocess", "ray"] and data["actors"] == 2
    runs = {r["engine"]: r for r in data["runs"]}
    assert not [r for r in runs.values() if "error" in r], runs
    ray_run, local = runs["ray"], runs["inprocess"]
    assert ray_run["actors"] == 2 and ray_run["ray_start_seconds"] > 0
    assert len(ray_run["actor_peak_rss"]) == 2 and min(ray_run["actor_peak_rss"]) > 0
    assert ray_run["peak_rss_with_actors"] == ray_run["peak_rss"] + sum(ray_run["actor_peak_rss"])
    # the same protocol on either engine: the same messages, so the same bytes each way
    for key in ("bytes_up", "bytes_down"):
        assert ray_run["phases"]["train"][key] == local["phases"]["train"][key]
    md = (out / "graph_scale_quick.md").read_text()
    assert "| 120 | plain | 2 |" in md and "| ray | train |" in md


def test_growth_of_new_pages_skips_allocator_noise():
    mib = 2**20

    def run(edges, pages):
        phase = {"seconds": 1.0, "peak_rss": 1, "new_pages": pages}
        return {"mode": "plain", "edges": edges, "phases": {"train": phase}}

    rows = gs.growth([run(100, 64 * mib), run(200, 128 * mib), run(400, 4096), run(800, 8192)])
    assert [r["new_pages_slope"] for r in rows] == [1.0, None, None]


def test_median_run_takes_each_phases_median():
    def run(seconds, rss, pages):
        phases = {"train": {"seconds": seconds, "peak_rss": rss, "new_pages": pages, "rounds": 1}}
        return {"mode": "plain", "nodes": 10, "edges": 40, "phases": phases, "peak_rss": rss}

    got = gs.median_run([run(3.0, 10, 4096), run(1.0, 30, 8192), run(2.0, 20, 0)])
    assert got["phases"]["train"] == {
        "seconds": 2.0,
        "peak_rss": 20,
        "new_pages": 4096,
        "rounds": 1,
        "seconds_tries": [3.0, 1.0, 2.0],
    }
    assert got["tries"] == 3 and got["peak_rss"] == 20
    failed = {"mode": "plain", "nodes": 10, "error": ["boom"]}
    assert gs.median_run([run(1.0, 1, 1), failed]) is failed
    one = run(1.0, 1, 1)
    assert gs.median_run([one]) is one


def test_median_run_of_ray_tries_recomputes_driver_plus_actors():
    def run(seconds, rss, actors, placement):
        phases = {"train": {"seconds": seconds, "peak_rss": rss, "placement_seconds": placement}}
        return {
            "mode": "plain",
            "engine": "ray",
            "edges": 40,
            "phases": phases,
            "peak_rss": rss,
            "ray_start_seconds": seconds,
            "actor_peak_rss": actors,
            "peak_rss_with_actors": rss + sum(actors),
        }

    got = gs.median_run([run(3.0, 10, [5, 7], 0.3), run(1.0, 30, [1, 9], 0.1), run(2.0, 20, [3, 8], 0.2)])
    assert got["phases"]["train"]["placement_seconds"] == 0.2 and got["ray_start_seconds"] == 2.0
    assert got["actor_peak_rss"] == [3, 8] and got["peak_rss_with_actors"] == 20 + 3 + 8


def test_first_touch_probe_holds_what_it_touched():
    rows = gs.first_touch_probe(0.5, 0.25)
    assert [r["resident_gib"] for r in rows] == [0.25, 0.5]
    assert all(r["first_touch_gb_s"] > 0 and r["rewrite_gb_s"] > 0 for r in rows)


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
    # every phase counts the pages it touched first (plaintext pre-training writes its encodings afresh)
    for r in plain:
        pre = r["phases"]["plaintext_pretrain"]
        assert pre["new_pages"] % gs.PAGE == 0 and pre["new_pages"] > 0
    row = next(g for g in data["growth"] if g["phase"] == "plaintext_pretrain")
    f1, f2 = (r["phases"]["plaintext_pretrain"]["new_pages"] for r in sorted(plain, key=lambda r: r["edges"]))
    if min(f1, f2) >= gs.MIN_SLOPE_PAGES:
        assert row["new_pages_slope"] == pytest.approx(math.log(f2 / f1) / math.log(e2 / e1), abs=1e-3)
    else:  # too few pages at these sizes for a ratio to mean anything
        assert row["new_pages_slope"] is None
    probe = data["first_touch"]
    assert probe and [r["resident_gib"] for r in probe] == sorted(r["resident_gib"] for r in probe)
    assert all(r["first_touch_gb_s"] > 0 and r["rewrite_gb_s"] > 0 for r in probe)
    md = (out / "graph_scale_quick.md").read_text()
    assert "| resident GiB | first touch GB/s | rewrite GB/s |" in md and "new pages slope" in md
    assert md.startswith("# Graph scale")
    assert (out / "graph_scale_quick.png").stat().st_size > 0
