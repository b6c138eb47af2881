"""Two recipients' keys and spools, and the check that keyed results decrypt to the plaintext
encodings (the round encoders' tests, on a process pool and on Ray)."""

from __future__ import annotations

import torch

from fedgat.crypto import KeyHolderContext, ServerContext, SlotLayout, encrypt_rows
from fedgat.crypto.encodings import CiphertextSpool, decrypt_bucket
from fedgat.encodings import encode_bucket

from graph_helpers import random_csr, unit_rows


def two_recipients(holders: list[KeyHolderContext], seed: int, dim: int = 10):
    """Two recipients' keys (server views) and spools holding the same 12 unit rows of ``dim``
    features, each encrypted under its recipient's key: ``(servers, x, layout, spools, csr)``. With
    ``dim=600`` a ciphertext holds 3 rows (one chunk), so a node of more rows spans several result
    groups and can be cut into pieces."""
    servers = [ServerContext.from_bytes(h.public_context_bytes()) for h in holders]
    csr = random_csr(12, 4, seed=seed)
    x = unit_rows(12, dim, seed=seed + 1)
    layout = (
        SlotLayout.for_dimension(dim, servers[0].slots) if dim <= 64 else SlotLayout(dim, servers[0].slots, 1)
    )
    spools = [CiphertextSpool(s, layout) for s in servers]
    for holder, spool in zip(holders, spools, strict=True):
        for node, row in enumerate(x.numpy()):
            for chunk, blob in enumerate(encrypt_rows(holder, row[None], layout)):
                spool.put(node, chunk, blob)
    return servers, x, layout, spools, csr


def assert_keyed_results_decrypt(results, holders_by_key: dict, bases, x, layout) -> None:
    """``results`` (``(key, NodeResult)``, keys interleaved in any way) hold, per key, every node of
    ``bases`` in order, and decrypt under that key's holder to the plaintext encodings."""
    for key, holder in holders_by_key.items():
        it = iter(r for k, r in results if k == key)
        for b in bases:
            mine = [next(it) for _ in range(len(b))]
            assert [r.node for r in mine] == [int(n) for n in b.nodes]
            got = decrypt_bucket(holder, layout, b, mine, dtype=torch.float64)
            assert (got.features - encode_bucket(b, x).features).abs().max().item() < 1e-5
        assert next(it, None) is None
    assert {k for k, _ in results} <= set(holders_by_key)
