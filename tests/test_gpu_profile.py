"""benchmarks/gpu_profile.py: its report states the ratios of the numbers it was given, and it
refuses to run without a GPU (the profile itself needs CUDA: run it through benchmarks/device_check.sh)."""

import pytest
import torch

from fedgat.benchmarks import gpu_profile


def _model(wall: float, busy: float, kernels: float) -> dict:
    return {"wall_ms": wall, "gpu_busy_ms": busy, "kernels_per_epoch": kernels, "table": "op table\n"}


def test_report_states_per_model_numbers_and_their_ratios(tmp_path):
    result = {
        "dataset": "cora",
        "variant": "vector",
        "neighbour_cap": None,
        "edges": 13264,
        "device": "Some GPU",
        "fedgat": _model(6.0, 1.5, 300),
        "pyg_gat": _model(4.0, 1.0, 150),
    }
    path = tmp_path / "p.md"
    gpu_profile.write_markdown(result, path)
    text = path.read_text()
    assert "| FedGAT | 6.00 | 1.50 | 25% | 300 |" in text
    assert "| PyG GAT | 4.00 | 1.00 | 25% | 150 |" in text
    assert "wall 1.50x, GPU busy 1.50x, kernels 2.00x" in text
    assert "op table" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_refuses_without_cuda(monkeypatch):
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        gpu_profile.main(["--device", "cpu"])
