"""Benchmark plumbing: ``fedgat bench overhead`` on a tiny synthetic setting (the JSON, Markdown and plot it
writes), the accuracy benchmark's cached-only mode, results written where the user asks (default
``./fedgat-results``, never the checkout's ``benchmarks/results``) and ``fedgat bench layer`` from a
wheel installed outside the checkout."""

import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from test_cli_inputs import write_npz

from fedgat import cli
from fedgat.commands.bench import load_benchmark

CHECKOUT = Path(__file__).resolve().parents[1]
#: a layer benchmark small enough for a test (60 nodes, one repeat)
TINY_LAYER = ["--repeats", "1", "--heads", "1", "--hidden", "2", "--cap", "4"]

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
    assert json.loads((out / "overhead.json").read_text()) == data  # --json writes a copy, as its help says
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
    assert len(bound["op_seconds_busy_per_process"]) == bound["server_cores_used"] == 1
    # the bound counts the evaluator's operations: an encoding per (group, source) for all chunks,
    # a multiply per multiply-add, a rescale per result ciphertext
    ops, chunks = bound["op_counts"], data["encrypted"]["layout"]["chunks"]
    assert ops["encodes"] * chunks == ops["multiplies"] == enc["multiply_adds"]
    assert ops["rescales"] == enc["result_ciphertexts"] == ops["multiplies"] - ops["additions"]
    costs = bound["op_seconds"]
    expected = (
        ops["encodes"] * costs["encode"]
        + ops["multiplies"] * costs["multiply"]
        + ops["additions"] * costs["add"]
        + ops["rescales"] * costs["rescale"]
    )
    assert math.isclose(bound["server_seconds"], expected / bound["server_cores_used"])
    assert bound["serialise_seconds"] == pytest.approx(enc["result_ciphertexts"] * costs["save"])
    assert bound["seconds_per_multiply_add"] > 0 and bound["seconds_per_multiply_add_one_core_alone"] > 0
    assert 0 < data["slot_utilisation"]["nominal"] <= 1
    # bytes at the floor: the ciphertexts moved are their floors plus the 74-byte envelope each
    mp, ratios = data["measured_preset"], data["ratios"]
    assert (
        mp["fresh_bytes"] == mp["fresh_floor_bytes"] + 74
        and mp["result_bytes"] == mp["result_floor_bytes"] + 74
    )
    assert mp["tenseal_result_bytes"] > 1.1 * mp["result_floor_bytes"]  # what TenSEAL's own bytes would cost
    up, down = enc["ciphertexts_up"], enc["ciphertexts_down"]
    floors = up * mp["fresh_floor_bytes"] + down * mp["result_floor_bytes"]
    assert enc["ciphertext_floor_bytes"] == floors
    assert enc["ciphertext_bytes"] == up * mp["fresh_bytes"] + down * mp["result_bytes"]
    assert math.isclose(ratios["bytes_vs_floor"], enc["ciphertext_bytes"] / floors)
    assert 1 < ratios["bytes_vs_floor"] <= 1.01
    assert ratios["frame_bytes_vs_floor"] > ratios["bytes_vs_floor"]  # frames carry more than ciphertexts
    # per useful slot the unused slots count: uploads at the nominal use, results at the measured one
    slots = 2048  # n4096
    useful = slots * (up * enc["slot_utilisation"] + down * enc["result_slot_utilisation"])
    per_slot_floor = floors / (slots * (up + down))
    assert math.isclose(
        ratios["bytes_per_useful_slot_vs_floor"], enc["ciphertext_bytes"] / useful / per_slot_floor
    )
    assert ratios["bytes_per_useful_slot_vs_floor"] > ratios["bytes_vs_floor"]
    assert math.isclose(ratios["bytes_per_useful_slot_vs_float32"], enc["bytes_per_useful_slot"] / 4)
    printed = capsys.readouterr().out
    assert "op bound" in printed and "their floor" in printed
    # said before the run: the round and its replay on this machine's cores; no training asked for
    first = printed.splitlines()[0]
    assert first.startswith("expect ~") and "the encrypted round and its replay" in first
    assert f"on {os.cpu_count() or 1} cores" in first and "trainings" not in first
    assert (out / "overhead.md").read_text().count("FedGraph") == 1
    assert (out / "overhead.png").stat().st_size > 0
    assert "vs their floor" in (out / "overhead.md").read_text()


def test_bench_overhead_expects_the_round_from_its_estimated_work(capsys):
    import argparse

    from fedgat.commands import bench as command

    for sweep, trains in ((False, True), (True, False)):  # a sweep runs no training
        command._say_expected(argparse.Namespace(replay=True, train=True, sweep=sweep, rounds=None), 600.0)
        said = capsys.readouterr().out
        assert (
            said.startswith("expect ~10 min on ") and ("two trainings of up to 500 rounds" in said) == trains
        )

    est = {"server_seconds": 266.0, "client_seconds": 284.0}
    # Cora, 10 clients, 2 cores: the round and its replay took 386 + ~186 s
    assert command.expected_seconds(est, 2, replay=True) == pytest.approx(1.4 * (266 + 284 + 266) / 2)
    assert command.expected_seconds(est, 2, replay=False) == pytest.approx(1.4 * 550 / 2)
    assert command.expected_seconds(est, 16, replay=False) == pytest.approx(1.4 * 550 / 16)


def test_bench_overhead_critical_path_of_a_deployment(tmp_path, capsys):
    """The critical path beside the simulation's wall time: per phase the slowest party's own clock and
    its bytes at the link speed, consistent with the summed phases and the transport's byte counts."""
    bench = load_benchmark("overhead")
    out, path = tmp_path / "res", tmp_path / "o.json"
    argv = ["--dataset", "synthetic", "--nodes", "60", "--clients", "2", "--workers", "0", "--no-train"]
    assert bench.main([*argv, "--link-gbps", "0.5", "--out", str(out), "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    enc, cp = data["encrypted"], data["critical_path"]
    assert data["wall_s"] == enc["phases"]["round"]["wall"] > 0
    assert cp["link_gbps"] == 0.5 and cp["server_compute"]["used"] == "clock"  # no server workers
    assert data["critical_path_s"] > 0
    assert math.isclose(data["critical_path_s"], sum(r["seconds"] for r in cp["phases"]))

    parties = cp["parties"]
    assert sorted(p["role"] for p in parties.values()) == ["client", "client", "server"]
    # the per-party clocks add up to the phases the round reports (summed over parties) ...
    for phase in PHASES - {"round"}:
        total = sum(p["compute_s"].get(phase, 0.0) for p in parties.values())
        assert math.isclose(total, enc["phases"][phase]["wall"], rel_tol=1e-9, abs_tol=1e-12)
    # ... and their bytes to the transport's: every frame sent once and received once
    sent = sum(sum(p["bytes_sent"].values()) for p in parties.values())
    received = sum(sum(p["bytes_received"].values()) for p in parties.values())
    assert sent == received == enc["bytes_up"] + enc["bytes_down"]

    names = [r["phase"] for r in cp["phases"]]
    assert names[:1] == ["keygen"] and {"encrypt", "upload", "server_compute", "download", "decrypt"} <= set(
        names
    )

    def took(p: dict, phase: str, gbps: float) -> float:
        moved = p["bytes_sent"].get(phase, 0) + p["bytes_received"].get(phase, 0)
        return p["compute_s"].get(phase, 0.0) + moved * 8 / (gbps * 1e9)

    for row in cp["phases"]:
        phase, holder = row["phase"], parties[str(row["party"])]
        # the phase is held by the party that takes longest over it, its own link included
        assert math.isclose(row["seconds"], max(took(p, phase, 0.5) for p in parties.values()))
        assert row["compute_s"] == holder["compute_s"].get(phase, 0.0) and row["role"] == holder["role"]
        assert row["bytes"] == holder["bytes_sent"].get(phase, 0) + holder["bytes_received"].get(phase, 0)
        assert math.isclose(row["transfer_s"], row["bytes"] * 8 / 0.5e9)
        assert math.isclose(row["seconds"], row["compute_s"] + row["transfer_s"])
    # the uploads and the results cross the server's link
    by_phase = {r["phase"]: r for r in cp["phases"]}
    assert by_phase["upload"]["bytes"] > 0 and by_phase["download"]["bytes"] > 0

    # at most every party's compute plus every byte over one link
    everything = sum(sum(p["compute_s"].values()) for p in parties.values()) + sent * 8 / 0.5e9
    assert data["critical_path_s"] <= everything
    # recomputed from the per-party table: the same path; on a slow link every upload and every result
    # crosses the server's link, which then holds those phases
    again = bench.critical_path(parties, 0.5)
    assert math.isclose(again["seconds"], data["critical_path_s"])
    slow = bench.critical_path(parties, 0.0005)
    for fast_row, slow_row in zip(cp["phases"], slow["phases"], strict=True):
        assert slow_row["seconds"] >= fast_row["seconds"]
    for phase in ("upload", "download"):
        row = next(r for r in slow["phases"] if r["phase"] == phase)
        assert row["role"] == "server" and row["bytes"] == row["busiest_link"]["bytes"]

    # the plaintext round deployed the same way: its compute, and its float32 bytes over the server's link
    plain = data["plaintext"]
    wire = (plain["bytes_up"] + plain["bytes_down"]) * 8 / 0.5e9
    assert math.isclose(plain["critical_path_s"], plain["phases"]["round"]["wall"] + wire)
    assert math.isclose(data["ratios"]["critical_path"], data["critical_path_s"] / plain["critical_path_s"])
    with pytest.raises(ValueError, match="positive"):
        bench.critical_path(parties, 0)

    md = (out / "overhead.md").read_text()
    assert "## Critical path of a deployment" in md and "0.5 Gbit/s" in md
    assert f"encrypted / plaintext deployed: **{data['ratios']['critical_path']:.2f}x**" in md
    assert f"**{data['critical_path_s']:.2f}**" in md
    assert "critical path" in capsys.readouterr().out


#: a stored run of the accuracy benchmark, as its JSON holds one
_STORED_RUN = {
    "test_accuracy": 0.5,
    "best_val_accuracy": 0.5,
    "rounds": 3,
    "pretrain_bytes": 0,
    "train_seconds": 1.0,
}


def test_bench_overhead_baseline_is_compared_setting_by_setting(tmp_path, capsys):
    """``--baseline``: an earlier run's JSON beside this one, the critical path among the quantities, and
    the settings in which the two runs differ named (in the report and on stderr). The baseline runs
    with ``--no-replay``."""
    bench = load_benchmark("overhead")
    base = tmp_path / "base.json"
    argv = ["--dataset", "synthetic", "--nodes", "60", "--workers", "0", "--no-train", "--out", str(tmp_path)]
    assert bench.main([*argv, "--clients", "3", "--json", str(base), "--no-replay"]) == 0
    capsys.readouterr()
    skipped = json.loads(base.read_text())  # --no-replay: no second compute, no 'alone' ratios
    assert skipped["encrypted"]["server_compute_alone"] is None
    assert skipped["ratios"]["server_alone_vs_op_bound"] is None
    assert "not measured (--no-replay)" in (tmp_path / "overhead.md").read_text()
    assert (
        bench.main([*argv, "--clients", "2", "--baseline", str(base), "--baseline-label", "3 clients"]) == 0
    )
    assert "note: the baseline" in capsys.readouterr().err
    data = json.loads((tmp_path / "overhead.json").read_text())
    before = json.loads(base.read_text())
    assert data["baseline"]["critical_path_s"] == before["critical_path_s"]
    assert data["baseline"]["differs_in"] == "clients 3 vs 2"
    md = (tmp_path / "overhead.md").read_text()
    assert "## Before / after: 3 clients" in md and "setting differs in: clients 3 vs 2" in md
    row = next(line for line in md.splitlines() if line.startswith("| critical path s |"))
    assert "n/a" not in row
    with pytest.raises(ValueError, match="is a list"):
        (tmp_path / "list.json").write_text("[]")
        bench.load_baseline(tmp_path / "list.json")


def test_bench_overhead_from_json_recomputes_the_deployment_at_another_link(tmp_path, capsys):
    """``--from-json FILE --link-gbps X`` runs nothing: both critical paths and the deployed ratio of the
    earlier run at X (the compute as measured, the transfers scaled), written beside the original."""
    bench = load_benchmark("overhead")
    first = tmp_path / "run.json"
    argv = ["--dataset", "synthetic", "--nodes", "60", "--clients", "2", "--workers", "0", "--no-train"]
    assert bench.main([*argv, "--no-replay", "--out", str(tmp_path), "--json", str(first)]) == 0
    capsys.readouterr()
    r = json.loads(first.read_text())
    out = tmp_path / "relinked"
    assert (
        cli.main(["bench", "overhead", "--from-json", str(first), "--link-gbps", "0.01", "--out", str(out)])
        == 0
    )
    slow = json.loads((out / "overhead_0.01gbps.json").read_text())
    relinked = slow["relinked"]
    assert (relinked["from_gbps"], relinked["to_gbps"], relinked["source"]) == (1.0, 0.01, str(first))
    assert math.isclose(
        slow["critical_path_s"], bench.critical_path(r["critical_path"]["parties"], 0.01)["seconds"]
    )
    p = r["plaintext"]
    wire = (p["bytes_up"] + p["bytes_down"]) * 8 / 0.01e9
    assert math.isclose(slow["plaintext"]["critical_path_s"], p["phases"]["round"]["wall"] + wire)
    assert math.isclose(
        slow["ratios"]["critical_path"], slow["critical_path_s"] / slow["plaintext"]["critical_path_s"]
    )
    assert slow["critical_path_s"] > r["critical_path_s"]
    assert slow["encrypted"] == r["encrypted"] and slow["wall_s"] == r["wall_s"]  # the measurements unchanged
    md = (out / "overhead_0.01gbps.md").read_text()
    assert (
        "0.01 Gbit/s" in md
        and "**Recomputed** for 0.01 Gbit/s links from" in md
        and "nothing was run again" in md
    )
    # a baseline measured at another link speed is named as such
    assert bench.baseline_differences(r, slow) == "link_gbps 1.0 vs 0.01, server_link_gbps 1.0 vs 0.01"
    # the server on a link of its own (a data centre's): its rows at its speed, the clients' at theirs
    argv = ["bench", "overhead", "--from-json", str(first), "--link-gbps", "0.01", "--out", str(out)]
    assert cli.main([*argv, "--server-link-gbps", "1"]) == 0
    split = json.loads((out / "overhead_0.01gbps_server1gbps.json").read_text())
    cp = split["critical_path"]
    assert (cp["link_gbps"], cp["server_link_gbps"]) == (0.01, 1.0)
    for row in cp["phases"]:
        speed = 1e9 if row["role"] == "server" else 0.01e9
        assert math.isclose(row["transfer_s"], row["bytes"] * 8 / speed)
    assert r["critical_path_s"] <= split["critical_path_s"] <= slow["critical_path_s"]
    assert math.isclose(
        split["critical_path_s"], bench.critical_path(r["critical_path"]["parties"], 0.01, 1.0)["seconds"]
    )
    # the plaintext round: every byte over the server's link, or the busiest client's over its own
    bits = (p["bytes_up"] + p["bytes_down"]) * 8
    assert sum(p["client_bytes"].values()) * 8 == bits and len(p["client_bytes"]) == 2
    want = p["phases"]["round"]["wall"] + max(bits / 1e9, max(p["client_bytes"].values()) * 8 / 0.01e9)
    assert math.isclose(split["plaintext"]["critical_path_s"], want)
    # a result from before the server had a link of its own: one speed for every party
    old_cp = {k: v for k, v in r["critical_path"].items() if k != "server_link_gbps"}
    fast_server = bench.relink(r, 1.0, 10.0)
    assert (
        bench.baseline_differences({**r, "critical_path": old_cp}, fast_server)
        == "server_link_gbps 1.0 vs 10.0"
    )
    md = (out / "overhead_0.01gbps_server1gbps.md").read_text()
    assert "0.01 Gbit/s client links, 1 Gbit/s server link" in md
    assert "**Recomputed** for 0.01 Gbit/s client links, 1 Gbit/s server link from" in md
    assert cli.main([*argv, "--server-link-gbps", "0"]) == 2
    assert "--server-link-gbps must be a number > 0, got 0.0" in capsys.readouterr().err
    # the machine's own load after the run is no caution; other work before it is
    quiet = {**r, "machine": {"load_average_before_after": [0.1, 2 * r["cores"]]}}
    busy = {**r, "machine": {"load_average_before_after": [r["cores"], r["cores"]]}}
    assert bench._load_caution(quiet) == [] and "other work was running" in bench._load_caution(busy)[1]
    # a run's options have no place here; an older result without the per-party table is refused
    assert cli.main(["bench", "overhead", "--from-json", str(first), "--clients", "3"]) == 2
    assert "--from-json runs nothing; leave --clients out" in capsys.readouterr().err
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**r, "critical_path": {}}))
    assert cli.main(["bench", "overhead", "--from-json", str(old), "--out", str(out)]) == 2
    assert "no per-party table" in capsys.readouterr().err


def test_accuracy_bench_cached_only_runs_nothing_and_labels_partial_cells():
    bench = _accuracy_bench()
    done = _STORED_RUN
    # stored under the paper's setting, which the runner starts every run from
    runs = {
        bench.run_key("gat", "cora", 10, 1.0, 0, {"rounds": 5, "patience": 2, "strategy": "fedavg"}): done
    }
    run = bench.Runner(runs, rounds=5, patience=2, save=lambda: None, cached_only=True)
    assert run("gat", "cora", 10, 1.0, 0) == done
    assert run("gat", "cora", 10, 1.0, 1) is None  # not run, and nothing was trained
    assert bench._done([done, None]) == [done]
    stats = bench._stats([0.5])
    assert bench._pm(stats, seeds=10).endswith("(n=1)") and "n=" not in bench._pm(stats, seeds=1)


def test_accuracy_bench_never_reuses_a_run_of_the_shared_dropout_stream():
    """Runs stored before each client drew from its own stream (keys without the streams entry) are
    kept under their own kind, not recalled for today's code (whose masks differ)."""
    bench = _accuracy_bench()
    done = _STORED_RUN
    hp = bench.resolve_hparams("gat", {"rounds": 5, "patience": 2, "strategy": "fedavg"})
    old = json.dumps(["gat", "cora", 1, 0.0, 0, hp], sort_keys=True)  # the key as runs were stored
    runs = bench.upgrade_keys({old: done})
    assert list(runs) == [bench.run_key("gat", "cora", 1, 0.0, 0, hp, streams="shared")]
    run = bench.Runner(runs, rounds=5, patience=2, save=lambda: None, cached_only=True)
    assert run("gat", "cora", 10, 1.0, 0) is None
    assert bench.upgrade_keys(runs) == runs  # and an upgraded file stays as it is


def _accuracy_bench():
    return load_benchmark("accuracy")


def test_accuracy_bench_rows_per_strategy_and_gaps_within_a_strategy():
    bench = _accuracy_bench()
    rows = bench.table_rows({"domain": 8.0})
    labels = [label for label, _, _ in rows]
    assert labels.count("gat") == 1 and "fedgat [FedAdam]" in labels and "fedgcn [FedAdam]" in labels
    adam = {label: hp for label, _, hp in rows}["fedgat, min_cross 0 [FedAdam]"]
    assert adam == {"domain": 8.0, "min_cross": 0, "strategy": "fedadam"}
    # every federated row names its strategy, so the library's default does not change the table
    assert all(
        hp["strategy"] == "fedavg" for label, m, hp in rows if "[" not in label and m not in ("gat", "gcn")
    )
    assert {label: hp for label, _, hp in rows}["fedgat"]["min_cross"] == 2  # the paper's rule, named
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


def test_benchmarks_are_the_fedgat_benchmarks_package():
    for name, module in (("overhead", "overhead"), ("layer", "layer_speed"), ("scale", "scale")):
        bench = load_benchmark(name)
        assert bench.__name__ == f"fedgat.benchmarks.{module}"
        assert Path(bench.__file__).resolve() == CHECKOUT / "benchmarks" / f"{module}.py"


def test_bench_layer_writes_into_the_working_directory_by_default(tmp_path, monkeypatch, capsys):
    committed = CHECKOUT / "benchmarks" / "results" / "layer_speed.json"
    stamp = committed.stat().st_mtime_ns if committed.exists() else None
    graph = write_npz(tmp_path / "g.npz")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "layer", "--dataset", str(graph), *TINY_LAYER]) == 0
    result = json.loads((tmp_path / "fedgat-results" / "layer_speed.json").read_text())
    assert result["num_nodes"] == 60 and len(result["rows"]) == 4
    assert all(r["fedgat_ms"] > 0 and r["pyg_gatconv_ms"] > 0 for r in result["rows"])
    assert (tmp_path / "fedgat-results" / "layer_speed.md").read_text().startswith("# FedGAT layer vs PyG")
    assert (committed.stat().st_mtime_ns if committed.exists() else None) == stamp
    assert "wrote fedgat-results/layer_speed.json" in capsys.readouterr().out


def test_bench_accuracy_passes_options_on_and_writes_to_out(tmp_path, monkeypatch):
    """``accuracy`` takes its own options (``--render`` here: only re-write from the JSON)."""
    out = tmp_path / "res"
    out.mkdir()
    meta = {"date": "2026-01-01", "torch": "2", "torch_threads": 1, "machine": "test", "rounds": 5}
    meta |= {"patience": 2, "seeds": 1, "sweep_seeds": 1, "tune_seeds": 1}
    (out / "accuracy.json").write_text(json.dumps({"runs": {}, "meta": meta, "hparams": {}}))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "accuracy", "--render", "--out", str(out)]) == 0
    assert (out / "accuracy.md").is_file() and not (tmp_path / "fedgat-results").exists()


def test_bench_layer_from_an_installed_wheel(tmp_path):
    """Build a wheel from a copy of the checkout, install it into a fresh venv (dependencies from this
    environment's site-packages through a .pth file, fedgat only from the wheel) and run ``fedgat
    bench layer`` from another directory: the results land in ``--out``."""
    source = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", ".venv", "*.pyc")
    for part in ("src", "crypto", "protocols", "benchmarks"):
        shutil.copytree(CHECKOUT / part, source / part, ignore=ignore)
    for part in ("pyproject.toml", "README.md"):
        shutil.copy2(CHECKOUT / part, source / part)
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", str(source), "-w"]
    done = subprocess.run([*build, str(wheels)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,) = wheels.glob("fedgat-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "fedgat/benchmarks/layer_speed.py" in names and "fedgat/benchmarks/__init__.py" in names
    assert not [n for n in names if n.startswith("fedgat/benchmarks/results")]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # this environment's packages (torch, ...), appended after the venv's own: fedgat comes from the wheel
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index"]
    done = subprocess.run([*install, str(wheel)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    work, out = tmp_path / "elsewhere", tmp_path / "results"
    work.mkdir()
    graph = write_npz(work / "g.npz")
    env = {**os.environ, "PYTHONPATH": "", "MPLBACKEND": "Agg"}
    where = subprocess.run(
        [python, "-c", "import fedgat.benchmarks as b; print(b.__file__)"],
        capture_output=True,
        text=True,
        cwd=work,
        env=env,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(venv) and not Path(where).is_relative_to(CHECKOUT)
    run = [venv / "bin" / "fedgat", "bench", "layer", "--dataset", str(graph), *TINY_LAYER, "--out", str(out)]
    done = subprocess.run(run, capture_output=True, text=True, cwd=work, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads((out / "layer_speed.json").read_text())["num_nodes"] == 60
    assert (out / "layer_speed.md").is_file()
    assert sorted(p.name for p in work.iterdir()) == ["g.npz"]  # nothing in the working directory


def test_bench_overhead_with_a_graph_file_and_owners(tmp_path, monkeypatch):
    from test_cli_inputs import owners_array, write_owners

    graph = write_npz(tmp_path / "g.npz")
    owners = write_owners(tmp_path / "owners.csv", owners_array(4))
    monkeypatch.chdir(tmp_path)
    argv = ["bench", "overhead", "--dataset", str(graph), "--owners", str(owners), "--workers", "0"]
    assert cli.main([*argv, "--no-train", "--no-progress"]) == 0
    data = json.loads((tmp_path / "fedgat-results" / "overhead.json").read_text())
    assert data["clients"] == 4  # from the owners file
    assert data["encrypted"]["bytes_up"] > 0 and 0 < data["encrypted"]["max_abs_error"] < 1e-5


def test_bench_presets_picks_the_smallest_preset_meeting_the_target(tmp_path, capsys):
    """Each preset's error on real encodings of a tiny graph against plaintext, per variant; the smallest
    (fewest bytes moved) preset within the target is picked, and none when the target is out of reach."""
    argv = ["bench", "presets", "--nodes", "40", "--variants", "vector", "--presets", "n4096", "n8192-small"]
    assert cli.main([*argv, "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "presets.json").read_text())
    rows = data["variants"]["vector"]["presets"]
    assert set(rows) == {"n4096", "n8192-small"}
    for r in rows.values():
        assert 0 < r["max_abs_error"] <= 1e-5 and r["max_abs_value"] > 0
        assert r["result_bytes"] == r["result_floor_bytes"] + 74
    assert rows["n4096"]["bytes_moved"] < rows["n8192-small"]["bytes_moved"]
    assert data["variants"]["vector"]["smallest"] == "n4096"
    assert "smallest preset meeting the target: n4096" in capsys.readouterr().out
    # a target below every error: nothing qualifies
    bench = load_benchmark("presets")
    tight = bench.preset_errors(nodes=40, variants=["vector"], presets=["n4096"], target=1e-12)
    assert tight["variants"]["vector"]["smallest"] is None
