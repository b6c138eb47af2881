"""DP release noise comes only from the OS CSPRNG (issue 19, item 1), and each owner's ledger is
charged before anything leaves (item 2), on the encrypted protocol path and the plaintext paths.

A seed drives public choices only (partition, projection, bases): two runs with every public input
identical release different noise, and neither the streams the old code seeded from public strings
nor a seeded torch generator reproduce it. (The mechanisms' own distributions: tests/privacy/test_dp.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedgat.app import build_pretrain_parties
from fedgat.dp import FeatureDP
from fedgat.dp_ledger import Budget, BudgetExceededError, DPLedger, MissingLedgerError
from fedgat.dp_release import draw_release
from fedgat.pipeline import run_encrypted_pretraining
from fedgat.protocols import ClientPretrain, InProcessTransport, Transcript
from fedgat.randomness import RandomSource

DP = FeatureDP(epsilon=4.0, delta=1e-5, mechanism="gaussian", dim=8, seed=5)
SEED = 1


def ledgers(partition, epsilon: float = 1000.0, tmp=None) -> dict[int, DPLedger]:
    return {
        c: DPLedger(Budget(epsilon, DP.delta), None if tmp is None else tmp / f"client-{c}.json")
        for c in range(partition.num_clients)
    }


def noise_of(clean: np.ndarray, release: np.ndarray) -> np.ndarray:
    """The direction the noise moved each row: release minus clean, both unit rows (enough to compare)."""
    return release - clean


def test_same_seed_same_inputs_release_different_noise_in_the_protocol(tiny_graph, tiny_partition):
    held = ledgers(tiny_partition)
    a = build_pretrain_parties(tiny_graph, tiny_partition, seed=SEED, dp=DP, dp_ledgers=held)
    b = build_pretrain_parties(
        tiny_graph, tiny_partition, seed=SEED, dp=DP, dp_ledgers=ledgers(tiny_partition)
    )
    for c in a.clients:
        ca, cb = a.clients[c], b.clients[c]
        np.testing.assert_array_equal(ca._features, cb._features)  # its own clean rows
        assert np.abs(ca._release[:, 1:] - cb._release[:, 1:]).min() > 0  # every released value differs
        # the old code's public stream does not reproduce it
        raw = tiny_graph.x.numpy()[tiny_partition.clients[c].owned].astype(np.float64)
        clean = DP.project(raw)
        old = RandomSource.from_seed(f"fedgat-dp-release:{SEED}:{c}").normal(clean.shape)
        predicted = clean + DP.sigma * old
        predicted /= np.linalg.norm(predicted, axis=1, keepdims=True)
        assert np.abs(predicted - ca._release[:, 1:] * np.sqrt(2)).max() > 0.1
        assert ca.dp_spent == pytest.approx((4.0, 1e-5), rel=1e-6)
        assert held[c].spent(raw) == ca.dp_spent  # charged to this owner's rows


def test_same_seed_same_inputs_release_different_noise_in_the_plaintext_paths(tiny_graph, tiny_partition):
    r1 = draw_release(tiny_graph, tiny_partition, DP, ledgers=ledgers(tiny_partition))
    r2 = draw_release(tiny_graph, tiny_partition, DP, ledgers=ledgers(tiny_partition))
    assert (r1[:, 1:] - r2[:, 1:]).abs().min() > 0
    # what fedgat.methods / fedgat.audit drew before: a torch generator seeded with the public seed
    x = tiny_graph.x
    r3 = torch.from_numpy(DP.release_rows(x, ledger=DPLedger(Budget(1000.0, DP.delta))))[:, 1:] * 2**0.5
    clean = torch.from_numpy(DP.project(x))
    for seed in (0, SEED, DP.seed):
        z = torch.randn(clean.shape, generator=torch.Generator().manual_seed(seed), dtype=clean.dtype)
        old = torch.nn.functional.normalize(clean + DP.sigma * z, dim=1)
        assert (old - r3).abs().max() > 0.1
    # an int seed is no longer accepted as a noise source
    with pytest.raises(TypeError):
        DP.release_rows(x, ledger=DPLedger(Budget(1000.0, DP.delta)), _test_rng=0)  # type: ignore[arg-type]


def test_a_protocol_client_without_a_ledger_is_refused(tiny_graph, tiny_partition):
    with pytest.raises(MissingLedgerError, match=r"none for clients \[0, 1, 2\]"):
        build_pretrain_parties(tiny_graph, tiny_partition, seed=SEED, dp=DP)
    partial = ledgers(tiny_partition)
    del partial[2]
    with pytest.raises(MissingLedgerError, match=r"none for clients \[2\]"):
        build_pretrain_parties(tiny_graph, tiny_partition, seed=SEED, dp=DP, dp_ledgers=partial)
    parties = build_pretrain_parties(
        tiny_graph, tiny_partition, seed=SEED, dp=DP, dp_ledgers=ledgers(tiny_partition)
    )
    old = parties.clients[1]
    with pytest.raises(MissingLedgerError, match="needs the owner's ledger"):
        ClientPretrain(
            1,
            parties.deployment.roster,
            parties.config,
            parties.deployment.identities[1],
            owned=old.owned,
            features=tiny_graph.x.numpy()[old.owned],
            indptr=old._graph.indptr,
            indices=old._graph.indices,
        )


def test_a_spent_budget_uploads_nothing_and_leaves_the_ledgers_unchanged(
    tiny_graph, tiny_partition, tmp_path
):
    held = ledgers(tiny_partition, epsilon=4.0, tmp=tmp_path)
    x = tiny_graph.x.numpy()
    for c, cp in enumerate(tiny_partition.clients):  # each owner already released these rows once
        DP.release_rows(x[cp.owned], ledger=held[c])
    before = {p.name: p.read_bytes() for p in tmp_path.glob("*.json")}
    transport = InProcessTransport(Transcript())
    with pytest.raises(BudgetExceededError, match="over the budget epsilon 4"):
        run_encrypted_pretraining(
            tiny_graph, tiny_partition, "vector", seed=SEED, transport=transport, progress=False, workers=0,
            dp=DP, dp_ledgers=held,
        )  # fmt: skip
    assert transport.messages_sent() == 0 and transport.bytes_sent() == 0
    assert transport.transcript.entries == []
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.json")} == before
    assert all(len(held[c].releases) == 1 for c in held)
