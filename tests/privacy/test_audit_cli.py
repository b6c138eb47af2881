"""``fedgat audit`` end to end on a tiny synthetic federation: JSON keys, report and plot."""

import json

from fedgat.cli import main


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
    assert report["client_attacks"]["basis"]["recovered_fraction"] == 1.0
    assert 0.0 <= report["test_accuracy"] <= 1.0 and "distgat_test_accuracy" in report
    point = report["epsilon_sweep"][0]
    assert point["client_attacks"]["basis"]["recovered_fraction"] < 0.1
    assert "## Server" in md.read_text() and png.stat().st_size > 1000
