"""benchmarks/server_profile.py: the sampled tasks are the round's own, the evaluator's counted
operations are those of the sampled coefficient maps, the round's counts are the plan's, and the
per-component split accounts for the profiled CPU."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

from fedgat.crypto.evaluator import OpCounts

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "server_profile.py"


def _load():
    spec = importlib.util.spec_from_file_location("server_profile", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_profile_counts_the_sampled_tasks_and_splits_their_cpu(tmp_path, monkeypatch):
    bench = _load()
    sampled: list = []
    real_sample = bench.sample_tasks

    def spy(plan, layout, count, max_task_cost=512):
        chosen = real_sample(plan, layout, count, max_task_cost)
        sampled.append((plan, layout, chosen))
        return chosen

    monkeypatch.setattr(bench, "sample_tasks", spy)
    argv = ["--dataset", "synthetic", "--nodes", "120", "--clients", "3", "--tasks", "24", "--quiet"]
    assert bench.main([*argv, "--workers", "2", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "server_profile.json").read_text())
    assert (tmp_path / "server_profile.md").read_text().startswith("# Server CPU per result")
    assert (tmp_path / "server_profile.png").stat().st_size > 0

    plan, layout, chosen = sampled[0]
    assert result["tasks_sampled"] == len(chosen) == 24
    # every sampled task is one of the round's, in the server's order (recipients sorted)
    every = [t for c in sorted(plan.shares) for t in bench.pieces_of(plan.shares[c], layout)]

    def same(a, b) -> bool:
        return a[0] == b[0] and np.array_equal(a[1], b[1]) and np.array_equal(a[2], b[2])

    positions, at = [], 0
    for c in chosen:
        at = next(i for i in range(at, len(every)) if same(every[i], c))
        positions.append(at)
    assert len(set(positions)) == len(chosen) and positions[0] == 0 and positions[-1] == len(every) - 1
    # the evaluator counted exactly the sampled coefficient maps
    expected = OpCounts()
    for _node, _sources, q, _last in chosen:
        expected += OpCounts.of_map(q, layout)
    assert result["op_counts"] == expected.__dict__
    assert result["results"] == expected.rescales
    # the whole round's counts are the plan's
    assert result["round_op_counts"]["multiplies"] == plan.multiply_adds(layout)
    # per wire, the split: non-negative parts that add up to the clean pass's CPU (scaled from the profile)
    assert set(result["wires"]) == {"compact", "tenseal"}
    for w, row in result["wires"].items():
        ms = row["ms_per_result"]
        if sys.version_info >= (3, 12) and not row["split_attributed"]:
            # this Python's cProfile does not see TenSEAL's calls: reported n/a (the test below)
            assert set(ms.values()) == {None}, w
            continue
        assert row["split_attributed"], w
        assert set(ms) == set(bench.COMPONENTS) and all(v >= 0 for v in ms.values()), w
        assert ms["ops"] > 0 and ms["seal_save"] > 0 and ms["wire"] > 0, w
        assert np.isclose(sum(ms.values()), row["ms_per_result_total"], rtol=1e-6), w
        assert row["ratios"]["floor_with_save_vs_op_bound"] > 1.0, w

    # the pool pass computed every sampled result on as many workers as asked, within its window,
    # and is held against the same bound shared among them
    (pool,) = result["pools"]
    assert pool["workers"] == pool["workers_answered"] == 2 and pool["results"] == result["results"]
    assert 1 <= pool["max_in_flight"] <= 8 and pool["wall_seconds"] > 0 and pool["start_seconds"] > 0
    bound = OpCounts(**result["op_counts"]).seconds(result["op_seconds"])
    assert np.isclose(pool["bound_seconds"], bound / 2)
    assert np.isclose(pool["wall_vs_op_bound"], pool["wall_seconds"] / pool["bound_seconds"])
    assert "| 2 |" in (tmp_path / "server_profile.md").read_text()


def test_profile_refuses_an_empty_pool(capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        _load().main(["--workers", "0"])
    assert exc.value.code == 2 and "at least 1" in capsys.readouterr().err


def test_a_profile_that_does_not_see_sealapi_calls_is_reported_as_no_split(tmp_path, monkeypatch):
    """Python 3.12's cProfile loses TenSEAL's pybind11 calls: the split must say n/a, not print a
    negative wire (what the 2026-11-28 16-core run did) or a bound + save built on it."""
    import cProfile

    bench = _load()
    prof = cProfile.Profile()
    prof.enable()
    sum(i * i for i in range(1000))  # no SEAL operation, no result envelope
    prof.disable()
    assert bench._component_seconds(prof)["attributed"] is False

    real = bench._component_seconds

    def lost(profile):  # what Python 3.12's profiler reads, on any Python
        parts = real(profile)
        return {**parts, "attributed": False, "ops": 0.0, "wire": -parts["seal_save"]}

    monkeypatch.setattr(bench, "_component_seconds", lost)
    argv = ["--dataset", "synthetic", "--nodes", "80", "--clients", "2", "--tasks", "6", "--quiet"]
    assert bench.main([*argv, "--wires", "compact", "--out", str(tmp_path)]) == 0
    row = json.loads((tmp_path / "server_profile.json").read_text())["wires"]["compact"]
    assert row["split_attributed"] is False
    assert set(row["ms_per_result"].values()) == {None} and row["floor_with_save_ms_per_result"] is None
    assert row["ratios"]["cpu_vs_op_bound"] > 0 and row["ratios"]["cpu_vs_floor_with_save"] is None
    md = (tmp_path / "server_profile.md").read_text()
    assert (
        "| wire | n/a | n/a |" in md
        and "did not report the calls" in md
        and "-" not in md.split("| wire |")[1][:12]
    )
    assert (tmp_path / "server_profile.png").stat().st_size > 0
