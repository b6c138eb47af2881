"""benchmarks/pool_start.py: both ways start every worker, initialised with every recipient, and the
setup files keep what spawn pickles into each worker's start-up pipe below the pipe's buffer."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "pool_start.py"


def _load():
    spec = importlib.util.spec_from_file_location("pool_start", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pool_start_times_both_ways_and_the_files_fit_the_pipe(tmp_path):
    bench = _load()
    assert bench.main(["--workers", "2", "--recipients", "2", "--repeats", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "pool_start.json").read_text())
    (row,) = result["rows"]
    assert row["workers"] == 2 and len(row["arguments_s"]) == len(row["files_s"]) == 1
    assert row["median_files_s"] > 0 and row["median_arguments_s"] > 0
    sizes = result["initargs_bytes"]
    assert sizes["files"] < 4096 < 64 * 1024 < sizes["arguments"]
    assert "| 2 |" in (tmp_path / "pool_start.md").read_text()


def test_pool_start_refuses_an_empty_pool(capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        _load().main(["--workers", "0"])
    assert exc.value.code == 2 and "at least 1" in capsys.readouterr().err
