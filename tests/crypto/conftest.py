"""Shared CKKS contexts for the crypto tests (key generation is the expensive part)."""

from __future__ import annotations

import numpy as np
import pytest

from fedgat.crypto import KeyHolderContext, ServerContext


@pytest.fixture(scope="module")
def holder() -> KeyHolderContext:
    return KeyHolderContext.generate("n4096")


@pytest.fixture(scope="module")
def server(holder: KeyHolderContext) -> ServerContext:
    return ServerContext.from_bytes(holder.public_context_bytes())


@pytest.fixture(scope="module")
def other_holder() -> KeyHolderContext:
    """Same parameters, different secret key."""
    return KeyHolderContext.generate("n4096")


@pytest.fixture(scope="session")
def unit_rows():
    """Factory for unit-L2-norm rows: ``unit_rows(rng, n, d, nnz=None)``."""
    return _unit_rows


def _unit_rows(rng: np.random.Generator, n: int, d: int, nnz: int | None = None) -> np.ndarray:
    """Unit-L2-norm rows, optionally sparse like Cora's bag-of-words features."""
    rows = rng.standard_normal((n, d))
    if nnz is not None:
        mask = np.zeros((n, d), dtype=bool)
        for i in range(n):
            mask[i, rng.choice(d, size=nnz, replace=False)] = True
        rows = np.where(mask, np.abs(rows), 0.0)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)
