"""Benchmark plumbing: ``fedgat bench overhead`` on a tiny synthetic setting (the JSON, Markdown and plot it
writes) and the accuracy benchmark's cached-only mode."""

import json

from fedgat import cli

REQUIRED = {"plaintext", "encrypted", "ratios", "slot_utilisation", "op_bound"}
RATIOS = {"time", "bytes", "memory", "server_vs_op_bound"}
PHASES = {"keygen", "encrypt", "upload", "server_compute", "download", "decrypt", "round"}


def test_bench_overhead_json_has_required_keys(tmp_path, capsys):
    out = tmp_path / "res"
    path = tmp_path / "o.json"
    status = cli.main(
        [
            "bench",
            "overhead",
            "--dataset",
            "synthetic",
            "--nodes",
            "60",
            "--clients",
            "2",
            "--workers",
            "0",
            "--no-train",
            "--out",
            str(out),
            "--json",
            str(path),
        ]
    )
    assert status == 0
    data = json.loads(path.read_text())
    assert REQUIRED <= set(data)
    assert RATIOS <= set(data["ratios"])
    for side in ("plaintext", "encrypted"):
        assert PHASES <= set(data[side]["phases"])
        assert all({"wall", "cpu"} <= set(v) for v in data[side]["phases"].values())
        assert data[side]["bytes_up"] > 0 and data[side]["bytes_down"] > 0
    enc = data["encrypted"]
    assert enc["ciphertexts_up"] > 0 and enc["multiply_adds"] > 0 and not enc["server_has_secret_key"]
    assert 0 < enc["max_abs_error"] < 1e-5
    assert data["ratios"]["bytes"] > 1 and data["ratios"]["server_vs_op_bound"] > 0
    assert enc["server_compute_alone"] > 0 and data["ratios"]["server_alone_vs_op_bound"] > 0
    bound = data["op_bound"]
    assert bound["server_seconds"] > 0 and bound["server_seconds_alone_cost"] > 0
    # one server core here: the busy cost is one process's, timed apart from the alone cost
    assert len(bound["seconds_per_multiply_add_busy_per_process"]) == bound["server_cores_used"] == 1
    assert bound["seconds_per_multiply_add"] > 0 and bound["seconds_per_multiply_add_one_core_alone"] > 0
    assert 0 < data["slot_utilisation"]["nominal"] <= 1
    assert (out / "overhead.md").read_text().count("FedGraph") == 1
    assert (out / "overhead.png").stat().st_size > 0
    assert "op bound" in capsys.readouterr().out


def test_accuracy_bench_cached_only_runs_nothing_and_labels_partial_cells():
    bench = _accuracy_bench()
    done = {
        "test_accuracy": 0.5,
        "best_val_accuracy": 0.5,
        "rounds": 3,
        "pretrain_bytes": 0,
        "train_seconds": 1.0,
    }
    runs = {bench.run_key("gat", "cora", 10, 1.0, 0, {"rounds": 5, "patience": 2}): done}
    run = bench.Runner(runs, rounds=5, patience=2, save=lambda: None, cached_only=True)
    assert run("gat", "cora", 10, 1.0, 0) == done
    assert run("gat", "cora", 10, 1.0, 1) is None  # not run, and nothing was trained
    assert bench._done([done, None]) == [done]
    stats = bench._stats([0.5])
    assert bench._pm(stats, seeds=10).endswith("(n=1)") and "n=" not in bench._pm(stats, seeds=1)


def _accuracy_bench():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "accuracy.py"
    spec = importlib.util.spec_from_file_location("accuracy_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_accuracy_bench_rows_per_strategy_and_gaps_within_a_strategy():
    bench = _accuracy_bench()
    rows = bench.table_rows({"domain": 8.0})
    labels = [label for label, _, _ in rows]
    assert labels.count("gat") == 1 and "fedgat [FedAdam]" in labels and "fedgcn [FedAdam]" in labels
    adam = {label: hp for label, _, hp in rows}["fedgat, min_cross 0 [FedAdam]"]
    assert adam == {"domain": 8.0, "min_cross": 0, "strategy": "fedadam"}
    assert all("strategy" not in hp for label, _, hp in rows if "[" not in label)
    only = [label for label, _, _ in bench.table_rows({}, ("fedavg",))]
    assert not any("FedAdam" in label for label in only)
    gaps = bench._gaps(
        {
            "gat": 0.80,
            "fedgat": 0.78,
            "fedgcn": 0.79,
            "distgat": 0.5,
            "fedgat [FedAdam]": 0.81,
            "fedgcn [FedAdam]": 0.82,
        }
    )
    assert gaps == ["fedgat -2.0 (fedgcn -1.0, distgat +28.0)", "fedgat [FedAdam] +1.0 (fedgcn -1.0)"]
