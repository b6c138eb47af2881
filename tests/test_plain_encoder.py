"""The plaintext encoder behind the encoders' seam, and the plaintext baseline built on the round's plan.

:class:`fedgat.plain_encoder.PlainEncoder` computes each node's rows :math:`A_i H_i` from rows keyed
like the spool: it must equal :func:`fedgat.encodings.encode` and the direct sums, with and without
the DP keys; :func:`fedgat.pipeline.run_plaintext_pretraining` must run the server's plan (the same
bases, compute buckets, recipients and views as a :class:`ServerPretrain` with the same seed).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pytest
import torch

from fedgat import plain_encoder
from fedgat.app import bases_rng, build_pretrain_parties
from fedgat.crypto.encodings import plan_views, release_key
from fedgat.dp import FeatureDP, block_rows
from fedgat.dp_ledger import Budget, DPLedger
from fedgat.dp_release import draw_release
from fedgat.encodings import BucketBases, draw_bases, encode
from fedgat.partition import make_partition
from fedgat.pipeline import drive, max_abs_error, plaintext_round, run_plaintext_pretraining
from fedgat.plain_encoder import PlainEncoder, PlainResult, PlainRows, PlaintextRound, assemble_encodings
from fedgat.protocols import InProcessTransport
from fedgat.protocols.pretrain_plan import partition_graphs, plan_round
from fedgat.synthetic import synthetic_graph

from graph_helpers import random_csr, rows_by_node, unit_rows

SEED = 11
DP = FeatureDP(epsilon=4.0, delta=1e-5, mechanism="gaussian", dim=8, seed=5)


def _release(graph, partition, dp):
    """One CSPRNG release, charged to in-memory ledgers, for both the protocol and its twin."""
    ledgers = {c: DPLedger(Budget(1e3, 1e-5)) for c in range(partition.num_clients)}
    return None if dp is None else draw_release(graph, partition, dp, ledgers=ledgers)


VARIANTS = ["vector", "matrix"]


@pytest.fixture(scope="module")
def setting():
    csr = random_csr(40, 7, seed=1)
    x = unit_rows(40, 12, seed=2)
    owner = np.random.default_rng(3).integers(0, 3, size=40)
    release = unit_rows(40, 12, seed=4)
    return csr, x, owner, release


@pytest.fixture(scope="module")
def federation():
    graph = synthetic_graph(num_nodes=48, num_features=16, train_per_class=3, num_val=8, num_test=12, seed=3)
    partition = make_partition(graph, 3, beta=1.0, seed=0, num_layers=2)
    return graph, partition


def direct(bases: BucketBases, slot: int, sources: torch.Tensor) -> np.ndarray:
    """Row 0 = h_i, rows 1.. = sum_j p[:, j] h_j (K2 / V), node by node."""
    h = sources.numpy()
    rows = [h[0]] + [sum(bases.p[slot, r, j] * h[j] for j in range(bases.n)) for r in range(bases.m)]
    return np.stack(rows)


# ----------------------------------------------------------------------------- the encoder alone
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("max_elems", [1 << 24, 50])  # whole buckets; slices of a few nodes
def test_plain_encoder_equals_encode_and_direct_sums(setting, variant, max_elems):
    csr, x, _, _ = setting
    nodes = np.arange(csr.num_nodes)
    bases = draw_bases(variant, csr, nodes, rng=3)
    with PlainEncoder(PlainRows.uploads(x, nodes), max_elems=max_elems) as encoder:
        assert encoder.workers == 0
        results = list(encoder.map(bases))
    want = encode(variant, x, csr, rng=3)
    np.testing.assert_array_equal([r.node for r in results], np.concatenate([b.nodes for b in bases]))
    got = iter(results)
    for b, ref in zip(bases, want.buckets, strict=True):
        for slot in range(len(b)):
            r = next(got)
            assert r.rows.shape == (b.num_feature_rows(), x.shape[1]) and r.rows.dtype == torch.float64
            torch.testing.assert_close(r.rows, ref.features[slot], rtol=0, atol=1e-12)
            sources = x[torch.from_numpy(b.neighbours[slot])]
            np.testing.assert_allclose(r.rows.numpy(), direct(b, slot, sources), rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS)
def test_plain_encoder_reads_the_dp_keys(setting, variant):
    """Compute buckets whose neighbours are spool keys: a client's own sources clean, the others'
    releases (``release_key``); each result equals the direct sum and ``encode(shared_x=, viewer=)``."""
    csr, x, owner, release = setting
    nodes = np.arange(csr.num_nodes)
    bases = draw_bases(variant, csr, nodes, rng=5)
    clients = np.arange(3)
    pair_nodes, pair_clients = np.repeat(nodes, 3), np.tile(clients, len(nodes))
    views = plan_views(bases, pair_nodes, pair_clients, nodes, owner)
    assert any((b.neighbours >= release_key(0)).any() for b in views.buckets)
    rows = PlainRows.uploads(x, nodes, release)
    assert len(rows) == 2 * len(nodes)
    results = list(PlainEncoder(rows, max_elems=64).map(views.buckets))
    assert len(results) == views.num_results
    refs = {
        c: rows_by_node(encode(variant, x, csr, rng=5, shared_x=release, owner=owner, viewer=c))
        for c in clients
    }
    k = 0
    for b in views.buckets:
        for slot in range(len(b)):
            r, keys = results[k], b.neighbours[slot]
            clean = keys < release_key(0)
            sources = torch.where(
                torch.from_numpy(clean)[:, None],
                x[torch.from_numpy(np.where(clean, keys, 0))],
                release[torch.from_numpy(np.where(clean, 0, keys - release_key(0)))],
            )
            np.testing.assert_allclose(r.rows.numpy(), direct(b, slot, sources), rtol=0, atol=1e-12)
            for c in views.recipients[k]:  # every client it goes to sees exactly this view
                np.testing.assert_allclose(r.rows.numpy(), refs[c][r.node], rtol=0, atol=1e-12)
            k += 1
    assert k == len(results)


@pytest.mark.parametrize("variant", VARIANTS)
def test_plain_encoder_rounds_once_and_its_reused_buffers_leave_results_alone(setting, variant):
    """``out_dtype=float32``: every result is the float64 result cast (computed in float64, rounded
    once), also when many slices reuse the encoder's buffers (results kept from earlier slices are
    not overwritten by later ones)."""
    csr, x, _, _ = setting
    nodes = np.arange(csr.num_nodes)
    bases = draw_bases(variant, csr, nodes, rng=3)
    rows = PlainRows.uploads(x, nodes)
    want = list(PlainEncoder(rows).map(bases))
    with PlainEncoder(rows, max_elems=50, out_dtype=torch.float32) as encoder:
        got = list(encoder.map(bases))
    assert len(got) == len(want) > len(bases)
    for g, w in zip(got, want, strict=True):
        assert g.node == w.node and g.rows.dtype == torch.float32
        assert torch.equal(g.rows, w.rows.to(torch.float32))


def test_stacked_is_stack_and_shares_the_encoders_blocks():
    """:func:`plain_encoder.stacked` equals ``torch.stack``; rows unbound from one block come back as
    a view of it (no copy), rows from several blocks or elsewhere as a copy."""
    a, b = torch.randn(4, 3, 5), torch.randn(2, 3, 5)
    one = plain_encoder.stacked(list(a.unbind()))
    assert torch.equal(one, a) and one.data_ptr() == a.data_ptr()
    tail = plain_encoder.stacked(list(a[1:].unbind()))  # a block starting inside the storage
    assert torch.equal(tail, a[1:]) and tail.data_ptr() == a[1].data_ptr()
    cases = [
        [*a.unbind(), *b.unbind()],  # two blocks
        [a[0], a[2], a[1]],  # one storage, out of order
        [a[0], a[0]],  # the same row twice
        [r.t() for r in a.unbind()],  # not contiguous
        [torch.randn(3, 5) for _ in range(3)],  # separate tensors
        [a[0]],
    ]
    for rows in cases:
        got = plain_encoder.stacked(rows)
        assert torch.equal(got, torch.stack(rows))
        assert not any(got.data_ptr() == t.data_ptr() for t in (a, b)) or len(rows) == 1
    got = plain_encoder.stacked([*a.unbind(), *b.unbind()])
    got += 1  # a copy: the blocks are untouched
    assert torch.equal(got, torch.cat([a, b]) + 1) and not torch.equal(a, got[:4])


def test_plain_rows_keys():
    x = torch.arange(12.0, dtype=torch.float64).reshape(4, 3)
    rows = PlainRows.uploads(x, np.array([3, 1]), release=-x)
    torch.testing.assert_close(
        rows.get(np.array([[1, 3], [release_key(3), 1]])),
        torch.stack([x[[1, 3]], torch.stack([-x[3], x[1]])]),
    )
    assert rows.d == 3 and rows.dtype == torch.float64
    with pytest.raises(KeyError, match="no rows for key 2"):
        rows.get(np.array([1, 2]))
    with pytest.raises(ValueError, match="duplicate"):
        PlainRows(np.array([1, 1]), x[:2])


# ------------------------------------------------------------------- the baseline runs the plan
@pytest.mark.parametrize("dp", [None, DP], ids=["clean", "dp"])
def test_plaintext_round_is_the_servers_plan(federation, dp):
    """Same seed: the plaintext round draws the server's bases and views, every partial the server
    computes is over the neighbours of one foreign owner, and the plaintext encodings match the
    decrypted ones."""
    graph, partition = federation
    drawn = _release(graph, partition, dp)
    parties = build_pretrain_parties(graph, partition, seed=SEED, workers=0, dp=dp, dp_release=drawn)
    drive(InProcessTransport(), parties.all())
    assert all(p.done for p in parties.all().values())
    server = parties.server
    assert server.plan is not None and server.plan.shares is not None
    rnd = plaintext_round(graph, partition, "vector", SEED, dp=dp, dp_release=drawn)
    plan = rnd.plan
    assert len(plan.bases) == len(server.bases)
    for a, b in zip(plan.bases, server.bases, strict=True):
        for field in ("rows", "nodes", "neighbours", "p"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert plan.route == server.plan.route
    for c, views in plan.views.items():
        assert [v.nodes.tolist() for v in views] == [v.nodes.tolist() for v in server.plan.views[c]]
        # each share is the partial of one foreign owner: exactly the nodes with a neighbour it owns
        for packed in server.plan.shares[c]:
            share = packed.share  # the partials, before their tails are packed
            assert share.owner is not None and share.owner != c
            for s, node in enumerate(share.nodes):
                nbrs = share.bases.neighbours[s]
                want = [int(partition.owner[u]) == share.owner for u in nbrs]
                np.testing.assert_array_equal(share.foreign[s], want)
                assert share.foreign[s].any(), f"node {node} has no neighbour of party {share.owner}"
    got = {c: client.encodings for c, client in parties.clients.items()}
    assert max_abs_error(got, rnd.run()) <= 1e-5  # type: ignore[arg-type]
    server.close()


def test_run_plaintext_pretraining_runs_the_plan_through_the_encoder(federation, monkeypatch):
    graph, partition = federation
    seen: list[list[BucketBases]] = []
    original = PlainEncoder.map

    def spy(self: PlainEncoder, buckets: Iterable[BucketBases]) -> Iterator[PlainResult]:
        seen.append(list(buckets))
        return original(self, seen[-1])

    monkeypatch.setattr(plain_encoder.PlainEncoder, "map", spy)
    got = run_plaintext_pretraining(graph, partition, "matrix", SEED)
    plan = plaintext_round(graph, partition, "matrix", SEED).plan
    assert len(seen) == 1 and len(seen[0]) == len(plan.buckets)
    for a, b in zip(seen[0], plan.buckets, strict=True):
        np.testing.assert_array_equal(a.p, b.p)
    for c, enc in got.items():
        np.testing.assert_array_equal(enc.nodes, partition.clients[c].needed)
        assert len(enc.buckets) == len(plan.views[c])
        for e, view in zip(enc.buckets, plan.views[c], strict=True):
            np.testing.assert_array_equal(e.bases.nodes, view.nodes)
            np.testing.assert_array_equal(e.bases.p, view.p)


@pytest.mark.parametrize("variant", VARIANTS)
def test_split_client_buckets_route_like_encode(federation, variant):
    """Client buckets cut small (many per drawn bucket): every node's rows still equal ``encode`` over
    the needed nodes with the server's basis randomness."""
    graph, partition = federation
    graphs = partition_graphs(partition, graph.num_features)
    plan = plan_round(graphs, variant, bases_rng(SEED), max_bucket_elems=16)
    assert sum(len(v) for v in plan.views.values()) > sum(
        len(v) for v in plaintext_round(graph, partition, variant, SEED).plan.views.values()
    )
    owned = {c: g.owned for c, g in graphs.items()}
    x = graph.x.double()
    got = PlaintextRound(
        plan, PlainRows.uploads(x, np.concatenate(list(owned.values()))), owned, variant
    ).run()
    nodes = np.unique(np.concatenate(list(plan.needed.values())))
    want = rows_by_node(encode(variant, x, partition.neighbourhoods, nodes=nodes, rng=bases_rng(SEED)))
    for c, enc in got.items():
        have = rows_by_node(enc)
        assert sorted(have) == sorted(plan.needed[c].tolist())
        for n, rows in have.items():
            np.testing.assert_allclose(rows, want[n], rtol=0, atol=1e-12)


class Noisy:
    """A BucketEncoder of PlainResult that perturbs every row 0 (h_i), to see whose is replaced."""

    workers = 0

    def __init__(self, rows: PlainRows) -> None:
        self._inner, self.closed = PlainEncoder(rows), False

    def map(self, buckets: Iterable[BucketBases]) -> Iterator[PlainResult]:
        for r in self._inner.map(buckets):
            rows = r.rows.clone()
            rows[0] += 1.0
            yield PlainResult(r.node, rows)

    def close(self) -> None:
        self.closed = True


def test_owners_keep_their_own_row_and_the_encoder_is_injected(federation):
    graph, partition = federation
    drawn = _release(graph, partition, DP)
    rnd = plaintext_round(graph, partition, "vector", SEED, dp=DP, dp_release=drawn)
    noisy = Noisy(rnd.rows)
    got = rnd.run(noisy)
    assert noisy.closed
    clean, release = block_rows(graph.x.double(), drawn)  # the block layout of fedgat.dp
    for c, enc in got.items():
        own = set(partition.clients[c].owned.tolist())
        for n, rows in rows_by_node(enc).items():
            if n in own:  # the client's own clean row, as ClientPretrain substitutes it
                np.testing.assert_array_equal(rows[0], clean[n].numpy())
            else:  # the encoder's row 0: h_i as the others see it, the release
                np.testing.assert_allclose(rows[0], release[n].numpy() + 1.0, rtol=0, atol=1e-12)


def test_assembly_refuses_results_off_the_plan(federation):
    graph, partition = federation
    rnd = plaintext_round(graph, partition, "vector", SEED)
    results = list(PlainEncoder(rnd.rows).map(rnd.plan.buckets))
    kw = {"owned": rnd.owned, "own_rows": rnd.rows}
    with pytest.raises(ValueError, match="do not follow"):
        assemble_encodings(rnd.plan, results[::-1], "vector", **kw)
    with pytest.raises(ValueError, match="do not follow"):
        assemble_encodings(rnd.plan, results[:-1], "vector", **kw)
    with pytest.raises(ValueError, match="do not follow"):
        assemble_encodings(rnd.plan, results + results[:1], "vector", **kw)
    ok = assemble_encodings(rnd.plan, results, "vector", **kw)
    assert max_abs_error(ok, run_plaintext_pretraining(graph, partition, "vector", SEED)) == 0.0


@pytest.mark.parametrize("variant", VARIANTS)
def test_plaintext_round_stores_float32_as_its_float64_encodings_cast(federation, variant):
    """``out_dtype=float32`` keeps the float64 compute: every stored value is the float64 one rounded."""
    graph, partition = federation
    want = run_plaintext_pretraining(graph, partition, variant, SEED)
    got = run_plaintext_pretraining(graph, partition, variant, SEED, out_dtype=torch.float32)
    for c, enc in want.items():
        assert np.array_equal(got[c].nodes, enc.nodes) and len(got[c].buckets) == len(enc.buckets)
        for a, b in zip(got[c].buckets, enc.buckets):
            assert a.K2.dtype == a.h_self.dtype == torch.float32
            assert torch.equal(a.K2, b.K2.float()) and torch.equal(a.h_self, b.h_self.float())
