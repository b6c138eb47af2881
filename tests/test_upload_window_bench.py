"""benchmarks/upload_window.py end to end on a small graph: every window's round decrypts to the
plaintext round, and a window keeps a fraction of the uploads on the server's disk."""

from __future__ import annotations

import json

import pytest

from fedgat.benchmarks import upload_window


@pytest.mark.slow
def test_the_benchmark_runs_each_window_and_writes_its_report(tmp_path):
    argv = ["--nodes", "200", "--clients", "3", "--windows", "none", "1", "--out", str(tmp_path)]
    assert upload_window.main(argv) == 0
    result = json.loads((tmp_path / "upload_window.json").read_text())
    whole, paced = result["summary"]
    assert (whole["window"], paced["window"]) == (None, 1)
    assert whole["max_abs_error"] <= 1e-5 and paced["max_abs_error"] <= 1e-5
    # without a window the spool holds every upload; one recipient at a time, about a third of them
    assert whole["spool_vs_no_window"] == 1.0 and 0 < paced["spool_vs_no_window"] < 0.6
    assert [r["ciphertexts_up"] for r in result["runs"]] == [result["runs"][0]["ciphertexts_up"]] * 2
    assert "| 1 recipient(s) |" in (tmp_path / "upload_window.md").read_text()


@pytest.mark.slow
def test_in_process_it_compares_one_pool_with_a_pool_per_recipient(tmp_path):
    """``--engine inprocess --pool-per-recipient``: the windowed round once on one server pool and once
    with a pool started per recipient (the path before), side by side, counted, same results."""
    argv = ["--nodes", "200", "--clients", "3", "--windows", "none", "1", "--engine", "inprocess"]
    argv += ["--workers", "2", "--pool-per-recipient", "--name", "uw", "--out", str(tmp_path)]
    assert upload_window.main(argv) == 0
    result = json.loads((tmp_path / "uw.json").read_text())
    whole, one, per = result["summary"]
    assert (whole["window"], one["window"], per["window"]) == (None, 1, 1)
    assert (one["pool_per_recipient"], per["pool_per_recipient"]) == (False, True)
    assert whole["server_pools_started"] == one["server_pools_started"] == 1
    assert per["server_pools_started"] == 3  # every client receives encodings here
    assert max(s["max_abs_error"] for s in result["summary"]) <= 1e-5
    text = (tmp_path / "uw.md").read_text()
    assert "a pool per recipient (3 started)" in text and "one for the round (1 started)" in text


def test_a_pool_per_recipient_needs_the_in_process_engine(capsys):
    with pytest.raises(SystemExit):
        upload_window.main(["--pool-per-recipient"])
    assert "--engine inprocess" in capsys.readouterr().err
