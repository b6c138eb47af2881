"""benchmarks/scale_floor.py: the op-count floor is the plan's exact operation counts times the
given per-operation costs, per core count, and its tables are written."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "scale_floor.py"


def _load():
    spec = importlib.util.spec_from_file_location("scale_floor", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_floor_is_op_counts_times_costs(tmp_path):
    costs = {"encode": 4e-4, "multiply": 1e-4, "add": 3e-5, "rescale": 3e-4, "save": 9.0}
    source = tmp_path / "overhead.json"
    source.write_text(
        json.dumps(
            {"op_bound": {"op_seconds": costs, "seconds_per_encrypt": 4e-3, "seconds_per_decrypt": 4e-4}}
        )
    )
    out = tmp_path / "res"
    bench = _load()
    argv = ["--nodes", "400", "800", "--cores", "2", "16", "--costs-from", str(source), "--out", str(out)]
    assert bench.main(argv) == 0
    result = json.loads((out / "scale_floor.json").read_text())
    assert [r["nodes"] for r in result["rows"]] == [400, 800]
    assert "save" not in result["costs"]  # serialisation is not an operation of the bound
    for row in result["rows"]:
        ops = row["op_counts"]
        # one encoding per (group, source) for all chunks (128 features: one chunk), one rescale per result
        assert ops["encodes"] == ops["multiplies"] == row["multiply_adds"] > 0
        assert ops["rescales"] == row["result_ciphertexts"] == ops["multiplies"] - ops["additions"]
        server = sum(
            ops[k] * costs[c]
            for k, c in (
                ("encodes", "encode"),
                ("multiplies", "multiply"),
                ("additions", "add"),
                ("rescales", "rescale"),
            )
        )
        assert math.isclose(row["server_cpu_s"], server)
        for cores in (2, 16):
            f = row["floors"][str(cores)]
            assert math.isclose(f["server_s"], server / cores)
            assert f["floor_overlapped_s"] == max(f["server_s"], f["client_s"], f["transfer_s"])
    small, large = result["rows"]
    assert large["multiply_adds"] > 1.5 * small["multiply_adds"]  # grows with the graph
    for row in result["rows"]:  # per-recipient keys compute more than one shared key did
        assert (
            row["op_count_ratio_to_one_key"] == row["multiply_adds"] / row["multiply_adds_once_per_node"] > 1
        )
    assert "scaled by the op count" in (out / "scale_floor.md").read_text()
    assert (out / "scale_floor.md").read_text().count("| 800 |") == 1
    assert (out / "scale_floor.png").stat().st_size > 0


def test_one_key_op_count_is_the_evaluators_count_of_every_needed_node():
    """The one-shared-key count (each needed node's whole encoding once) equals what the server's
    evaluator spends (:meth:`OpCounts.of_map`) on the bases drawn for those nodes."""
    import numpy as np

    from fedgat.crypto import get_preset
    from fedgat.crypto.evaluator import OpCounts
    from fedgat.encodings import draw_bases
    from fedgat.partition import make_partition
    from fedgat.protocols import PretrainConfig

    bench = _load()
    graph = bench.arxiv_like(300, 0)
    partition = make_partition(graph, 3, beta=1e4, seed=0, num_layers=2)
    cfg = PretrainConfig(session=0, variant="vector", preset="n4096")
    layout = cfg.layout(cfg.row_width(graph.num_features), get_preset("n4096").slots)
    needed = np.unique(np.concatenate([np.asarray(c.needed) for c in partition.clients]))
    ops = OpCounts()
    for bases in draw_bases("vector", partition.neighbourhoods, needed, rng=1):
        for s in range(len(bases)):
            ops += OpCounts.of_map(bases.coefficients(s), layout)
    assert bench.multiply_adds_once_per_node(partition, graph.num_features) == ops.multiplies > 0
