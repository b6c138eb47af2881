"""benchmarks/layer_profile.py: per-operator times per thread count, the layer's sparse products apart
from the dense GEMM, and speed-ups computed from the times it reports."""

from fedgat.benchmarks import layer_profile


def test_profile_separates_sparse_products_and_sums_to_its_total(tmp_path):
    step = layer_profile._step_fn("synthetic", "vector", None, heads=2, hidden=4)
    per = layer_profile.profile_threads(step, [1], steps=2)
    ops = per[1]
    assert any(k.endswith("(sparse)") for k in ops)  # the plan's CSR products, inside _SparseMatmul
    # the segment sums' CSR products (inside _GatherBackwardSum) are no GEMM either: a dense addmm is
    # not in this layer, only sparse ones
    assert "aten::addmm" not in ops and "aten::addmm (sparse)" in ops
    assert "aten::mm" in ops  # the dense K2 @ W^T and its gradient
    total = ops.pop("total")
    assert abs(total - sum(ops.values())) < 1e-9 and total > 0


def test_table_speedups_are_first_over_last(tmp_path):
    per = {1: {"total": 10.0, "a": 6.0, "aten::mm": 4.0}, 4: {"total": 5.0, "a": 3.0, "aten::mm": 1.0}}
    rows = layer_profile.table(per, top=5)
    assert [r["op"] for r in rows] == ["total", "a", "aten::mm"]  # by time at the last count
    assert {r["op"]: r["speedup"] for r in rows} == {"total": 2.0, "a": 2.0, "aten::mm": 4.0}
    assert [r["gemm"] for r in rows] == [False, False, True]
    result = {"variant": "vector", "dataset": "x", "threads": [1, 4], "steps": 2, "machine": {}, "rows": rows}
    json_path, md_path = layer_profile.write(result, tmp_path)
    assert json_path.exists()
    assert "| **aten::mm** | 4.00 | 1.00 | 4.00x |" in md_path.read_text()
