"""Small random graphs for tests, and encodings read back by node."""

import numpy as np
import torch

from fedgat.graph import CSR


def random_csr(num_nodes: int, max_extra: int, seed: int) -> CSR:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(num_nodes):
        others = np.setdiff1d(np.arange(num_nodes), [i])
        k = rng.integers(0, max_extra + 1)
        rows.append(np.concatenate([[i], np.sort(rng.choice(others, size=k, replace=False))]))
    return CSR.from_rows(rows)


def unit_rows(n: int, d: int, seed: int) -> torch.Tensor:
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x / x.norm(dim=1, keepdim=True)


def rows_by_node(encodings) -> dict[int, np.ndarray]:
    """Every node's feature-dependent encoding rows ``(R + 1, d)`` (coefficient layout), as float64."""
    out = {}
    for bucket in encodings.buckets:
        feats = bucket.features.double().numpy()
        out.update((int(n), feats[k]) for k, n in enumerate(bucket.bases.nodes))
    return out
