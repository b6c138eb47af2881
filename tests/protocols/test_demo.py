"""``fedgat demo`` end to end on a tiny synthetic graph: the JSON report has the promised keys."""

from __future__ import annotations

import json

from fedgat.cli import main


def test_demo_writes_the_report(tmp_path, capsys):
    out = tmp_path / "demo.json"
    code = main(
        [
            "demo",
            "--dataset",
            "synthetic",
            "--nodes",
            "60",
            "--clients",
            "3",
            "--rounds",
            "3",
            "--patience",
            "3",
            "--upload-window",
            "1",
            "--encrypt-workers",
            "2",
            "--json",
            str(out),
            "--quiet",
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    for key in (
        "phases",
        "bytes_up",
        "bytes_down",
        "max_abs_error_vs_plaintext",
        "test_accuracy",
        "server_has_secret_key",
        "shared_secret_key",
    ):
        assert key in report
    assert set(report["phases"]) >= {"keygen", "encrypt", "upload", "server_compute", "download", "decrypt"}
    assert report["server_has_secret_key"] is False and report["shared_secret_key"] is False
    assert report["rows_released"] > 0
    # paced uploads: one recipient's uploads on the server's disk at a time, not all three
    assert report["upload_window"] == 1 and 0 < report["peak_spooled_bytes"] < report["bytes_up"]
    assert report["max_abs_error_vs_plaintext"] <= 1e-5
    assert report["bytes_up"] > 0 and report["bytes_down"] > 0
    assert 0.0 <= report["test_accuracy"] <= 1.0
    out_text = capsys.readouterr().out
    assert "shared secret key: False" in out_text and "the server holds a secret key: False" in out_text
    assert "upload window of 1 recipient(s)" in out_text
    assert report["encrypt_workers"] == 2 and "up to 2 worker processes per client" in out_text


def test_the_cost_warning_is_for_heavy_rounds_only(tmp_path, capsys, monkeypatch):
    """The matrix variant on a 60-node graph is seconds of work: no warning (it used to print one for
    every matrix run, "~0 min"); above the threshold the estimate is shown in the unit that reads."""
    from fedgat.commands import demo

    argv = ["demo", "--dataset", "synthetic", "--nodes", "60", "--clients", "3", "--variant", "matrix"]
    argv += ["--rounds", "1", "--workers", "0", "--quiet", "--json", str(tmp_path / "m.json")]
    assert main(argv) == 0
    assert "WARNING" not in capsys.readouterr().err
    monkeypatch.setattr(demo, "HEAVY_SECONDS", 0.0)
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "WARNING: matrix encodings need" in err and " s of server compute on one core" in err
