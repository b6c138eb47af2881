"""``fedgat audit`` end to end on a tiny synthetic federation: JSON keys (the server-side attacks and
``shared_secret_key`` at the top level), report and plot."""

import json

import pytest

from fedgat.audit import SERVER_ATTACKS
from fedgat.cli import main


@pytest.mark.slow  # every server attack end to end (~2 min here); each has its own test in the default suite
def test_audit_command_writes_report_json_and_plot(tmp_path):
    out, md, png = tmp_path / "a.json", tmp_path / "a.md", tmp_path / "a.png"
    assert (
        main(
            [
                "audit",
                "--dataset",
                "synthetic",
                "--clients",
                "3",
                "--rounds",
                "5",
                "--attack-rounds",
                "1",
                "--sweep",
                "2",
                "--json",
                str(out),
                "--report",
                str(md),
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["server"]["passed"] is True
    assert report["shared_secret_key"] is False
    assert list(report["server_attacks"]) == list(SERVER_ATTACKS)
    for name, attack in report["server_attacks"].items():
        assert {"recovered_fraction", "detected", "ran", "targets", "recovered"} <= set(attack), name
        if name not in ("chosen_weights_aggregate", "cohort_differencing", "verdict_oracle"):
            assert attack["recovered_fraction"] == 0.0, name  # (the three: measured, whatever it is)
    oracle = report["server_attacks"]["verdict_oracle"]  # known break 22: padded, every probe refused
    assert oracle["ran"] and oracle["targets"] == oracle["sessions"] > 0 and all(oracle["refused"])
    assert oracle["recovered"] == 0 and oracle["upload_pad"] > 1
    for name in ("substituted_result", "injected_ciphertexts", "fake_edges", "chosen_weights_one_client"):
        assert report["server_attacks"][name]["detected"] is True, name
    assert report["client_attacks"]["basis"]["recovered_fraction"] == 1.0
    assert 0.0 <= report["test_accuracy"] <= 1.0 and "distgat_test_accuracy" in report
    point = report["epsilon_sweep"][0]
    assert point["client_attacks"]["basis"]["recovered_fraction"] < 0.1
    trap = point["chosen_predictor"]  # label_rr (the default): a trap published as its predictor
    assert trap["epsilon"] == 2.0 and trap["trap_accuracy"] == 1.0 and trap["within_bound"] is True
    text = md.read_text()
    assert "## Server" in text and "## Server-side attacks" in text and png.stat().st_size > 1000
    assert "## A hostile server chooses label_rr's predictor" in text
    one = report["server_attacks"]["chosen_weights_one_client"]
    agg = report["server_attacks"]["chosen_weights_aggregate"]
    assert f"Trap weights against one client's update (target: client {one['target']})" in text
    for run, r in one["runs"].items():
        assert f"| {run} | {r['secure_aggregation']} | {r['rounds_received']} |" in text
    for label, r in agg["by_strategy"].items():
        assert f"| {label} | {r['cohort_sizes']} | {r['recovered_foreign']} |" in text
