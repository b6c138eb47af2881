"""The DP release in the encrypted pre-training round (``PretrainConfig.dp``, :mod:`fedgat.dp`).

Each client uploads its nodes' clean projection and their release (noise drawn by the client); a
client's decrypted encodings must equal the plaintext reference ``encode(..., shared_x=release,
owner=, viewer=client)``: its own sources clean, every other source released. No result a client
receives may depend on another client's clean copy, and parties refuse other DP terms.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedgat.app import bases_rng, build_pretrain_parties
from fedgat.crypto.encodings import RELEASE_OFFSET, plan_views
from fedgat.crypto.packing import decrypt_rows
from fedgat.dp import FeatureDP
from fedgat.encodings import BucketBases, encode
from fedgat.pipeline import (
    dp_features,
    max_abs_error,
    run_encrypted_fedgat,
    run_encrypted_pretraining,
    run_plaintext_pretraining,
)
from fedgat.protocols import (
    ClientPretrain,
    ConfigMismatchError,
    DealerSide,
    EncodingBases,
    EncodingResults,
    FeatureUpload,
    InProcessTransport,
    PayloadError,
    PrivacyTerms,
    ReleaseUpload,
    UploadItem,
    decode_message,
    run_parties,
)

from protocol_helpers import Harness

DP = FeatureDP(epsilon=4.0, delta=1e-5, dim=8, seed=5)
SEED = 1
#: CKKS tolerance: the release's noise (sigma ~2.2) makes values up to ~10x the unit-norm features
TOL = 1e-5


def rows_by_node(enc) -> dict[int, np.ndarray]:
    """Every node's feature-dependent rows ``(R + 1, d)`` in the coefficient layout."""
    out = {}
    for b in enc.buckets:
        feats = b.features.double().numpy()
        out.update((int(n), feats[k]) for k, n in enumerate(b.bases.nodes))
    return out


def reference(graph, partition, variant, viewer):
    """``encode(..., shared_x=release, owner=, viewer=)`` over the server's bases (drawn over all nodes
    with the same seed) and the release each owner drew."""
    clean, release = dp_features(graph, partition, DP, SEED)
    return rows_by_node(
        encode(
            variant,
            clean,
            partition.neighbourhoods,
            nodes=np.arange(graph.num_nodes),
            rng=bases_rng(SEED),
            shared_x=release,
            owner=partition.owner,
            viewer=viewer,
        )
    )


def worst(got: dict, want: dict, nodes) -> float:
    return max(float(np.abs(got[int(n)] - want[int(n)]).max()) for n in nodes)


@pytest.fixture(scope="module", params=["vector", "matrix"])
def dp_round(request, tiny_graph, tiny_partition):
    variant = request.param
    h = Harness(tiny_graph, tiny_partition, variant=variant, seed=SEED, dp=DP).start().run()
    assert all(p.done for p in h.parties.all().values())
    return variant, h


# ------------------------------------------------------------------------- (1) equals the reference
def test_decrypted_encodings_equal_the_plaintext_reference(dp_round, tiny_graph, tiny_partition):
    variant, h = dp_round
    for c in h.roster.clients:
        enc = h.client(c).encodings
        np.testing.assert_array_equal(enc.nodes, tiny_partition.clients[c].needed)
        assert enc.buckets[0].h_self.shape[1] == DP.projected_dim(tiny_graph.num_features) == 8
        err = worst(rows_by_node(enc), reference(tiny_graph, tiny_partition, variant, c), enc.nodes)
        assert err <= TOL, (c, err)
    # the pipeline's plaintext twin is the same reference
    got = {c: h.client(c).encodings for c in h.roster.clients}
    assert (
        max_abs_error(got, run_plaintext_pretraining(tiny_graph, tiny_partition, variant, SEED, dp=DP)) <= TOL
    )
    assert not h.server.has_secret_key


def test_run_encrypted_pretraining_takes_dp(tiny_graph, tiny_partition):
    res = run_encrypted_pretraining(
        tiny_graph, tiny_partition, "vector", seed=SEED, progress=False, workers=0, dp=DP
    )
    want = run_plaintext_pretraining(tiny_graph, tiny_partition, "vector", SEED, dp=DP)
    assert max_abs_error(res.encodings, want) <= TOL
    # two 1-chunk copies per node (8 projected dims), instead of one copy of the 16 raw dims
    assert res.layout.d == 8 and res.layout.chunks == 1 and res.ciphertexts_up == 2 * tiny_graph.num_nodes


# ------------------------------------------------------------ (2) own sources clean, others released
def test_each_client_sees_its_own_clean_features_and_the_release_of_others(
    dp_round, tiny_graph, tiny_partition
):
    variant, h = dp_round
    owner = tiny_partition.owner
    nbh = tiny_partition.neighbourhoods
    clean, release = dp_features(tiny_graph, tiny_partition, DP, SEED)
    assert float((clean - release).abs().max()) > 1.0  # the release is far from the clean features
    for c in h.roster.clients:
        got = rows_by_node(h.client(c).encodings)
        needed = tiny_partition.clients[c].needed
        mine = np.array([bool((owner[nbh.row(int(i))] == c).any()) for i in needed])
        assert mine.any() and (~mine).any()
        for other in h.roster.clients:
            if other == c:
                continue
            wrong = reference(tiny_graph, tiny_partition, variant, other)
            # a node with a source of c or of `other` differs under the wrong viewer ...
            touched = [i for i in needed if np.isin(owner[nbh.row(int(i))], (c, other)).any()]
            assert min(float(np.abs(got[int(i)] - wrong[int(i)]).max()) for i in touched) > 100 * TOL
            # ... and nodes with sources of neither agree (both read only releases there)
            rest = [i for i in needed if i not in set(touched)]
            if rest:
                assert worst(got, wrong, rest) <= TOL
        # the owner's own h_i is its clean row (row 0), every foreign h_i the release
        for i in needed:
            want = clean if owner[i] == c else release
            assert np.abs(got[int(i)][0] - want[int(i)].numpy()).max() <= TOL


# ------------------------------------------- (3) no client receives anything built on a foreign clean copy
def test_no_result_for_a_client_reads_another_clients_clean_copy(dp_round, tiny_graph, tiny_partition):
    variant, h = dp_round
    server, owner = h.server, tiny_partition.owner
    # structure: every result goes to clients that own each clean source it reads
    assert len(server.plan.recipients) == sum(len(b) for b in server.buckets) == server.nodes_computed
    k = 0
    for b in server.buckets:
        for keys in b.neighbours:
            recipients = server.plan.recipients[k]
            k += 1
            clean_sources = keys[keys < RELEASE_OFFSET]
            if len(clean_sources):
                assert len(recipients) == 1 and (owner[clean_sources] == recipients[0]).all()
    # one result per (node, client) at most; here every client needing a node owns one of its sources
    # (symmetric neighbourhoods), so no two clients share a view (see test_plan_views_shares_...)
    deliveries = sum(len(r) for r in server.plan.recipients)
    assert server.nodes_computed <= deliveries == sum(len(cp.needed) for cp in tiny_partition.clients)
    # transcript: the uploads are clean rows and releases, the results each client decrypts are built only
    # from its own clean rows and the others' releases (checked by decrypting what was sent)
    clean, release = dp_features(tiny_graph, tiny_partition, DP, SEED)
    holder = h.client(0).holder  # every client holds the same CKKS key
    layout = server.layout
    for entry in h.transport.transcript.received_by(server.party_id):
        msg = decode_message(entry.data)
        if isinstance(msg, (FeatureUpload, ReleaseUpload)):
            want = clean if isinstance(msg, FeatureUpload) else release
            item = msg.items[0]
            got = decrypt_rows(holder, [item.ciphertext], 1, layout, kind="fresh")[0]
            assert owner[item.node] == msg.sender
            assert np.abs(got - want[item.node].numpy()).max() <= TOL
    for c in h.roster.clients:
        ref = reference(tiny_graph, tiny_partition, variant, c)
        buckets = h.client(c).encodings.buckets
        seen = 0
        for entry in h.transport.transcript.received_by(c):
            msg = decode_message(entry.data)
            if not isinstance(msg, EncodingResults):
                continue
            for item in msg.items:
                rows = next(b for b in buckets if item.node in b.bases.nodes).bases.num_feature_rows()
                got = decrypt_rows(holder, list(item.row_blobs), rows, layout, kind="result")
                assert np.abs(got - ref[item.node]).max() <= TOL  # row 0 (h_i) included, as sent
                seen += 1
        assert seen == len(tiny_partition.clients[c].needed)


def test_plan_views_shares_the_all_release_view_and_splits_the_rest():
    """Clients owning none of a node's sources share one result; each other client gets its own."""
    rng = np.random.default_rng(0)
    nodes = np.array([10, 11])
    neighbours = np.array([[10, 11, 12], [11, 10, 12]])
    bucket = BucketBases("vector", np.arange(2), nodes, neighbours, rng.standard_normal((2, 3, 3)), None)
    owner_ids, owners = np.array([10, 11, 12, 13, 14]), np.array([0, 1, 2, 3, 4])
    # node 10 is needed by clients 0 (owns 10), 3 and 4 (own no source); node 11 by 1 and 3
    pair_nodes, pair_clients = np.array([10, 10, 10, 11, 11]), np.array([4, 0, 3, 3, 1])
    plan = plan_views([bucket], pair_nodes, pair_clients, owner_ids, owners)
    assert plan.recipients == [(3, 4), (0,), (3,), (1,)]
    keys = plan.buckets[0].neighbours
    r = RELEASE_OFFSET
    np.testing.assert_array_equal(
        keys, [[10 + r, 11 + r, 12 + r], [10, 11 + r, 12 + r], [11 + r, 10 + r, 12 + r], [11, 10 + r, 12 + r]]
    )
    np.testing.assert_array_equal(plan.buckets[0].p[1], bucket.p[0])
    # without owners: the drawn bucket itself, every client of a node on its one result
    plain = plan_views([bucket], pair_nodes, pair_clients)
    assert plain.buckets[0] is bucket and plain.recipients == [(0, 3, 4), (1, 3)]


def test_uploads_and_release_rows_come_from_the_owner(tiny_graph, tiny_partition):
    """The release is drawn by the client (CSPRNG unless seeded) and differs between sessions."""
    a = build_pretrain_parties(tiny_graph, tiny_partition, dp=DP)  # no seed: CSPRNG noise
    b = build_pretrain_parties(tiny_graph, tiny_partition, dp=DP)
    ca, cb = a.clients[1], b.clients[1]
    np.testing.assert_allclose(ca._features, cb._features)  # the clean projection is deterministic
    assert np.abs(ca._release - cb._release).max() > 0.1  # fresh noise each time
    assert not hasattr(a.server, "_release")


# --------------------------------------------------------------------------------- (4) mismatches
def _swap_client(parties, c: int, config, features: np.ndarray) -> None:
    """Rebuild client ``c`` with another config (a misconfigured party)."""
    old = parties.clients[c]
    cls = DealerSide if c == parties.deployment.roster.dealer else ClientPretrain
    parties.clients[c] = cls(
        c,
        parties.deployment.roster,
        config,
        parties.deployment.identities[c],
        owned=old.owned,
        features=features,
        indptr=old._graph.indptr,
        indices=old._graph.indices,
        needed=old.needed,
        dtype=old.dtype,
    )


@pytest.mark.parametrize(
    "case", ["other-epsilon", "client-without-dp", "server-without-dp", "other-projection-seed"]
)
def test_mismatched_dp_terms_are_refused(case, tiny_graph, tiny_partition):
    server_dp = None if case == "server-without-dp" else DP
    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=SEED, dp=server_dp)
    client_dp = {
        "other-epsilon": dataclasses.replace(DP, epsilon=2.0),
        "client-without-dp": None,
        "server-without-dp": DP,
        "other-projection-seed": dataclasses.replace(DP, seed=6),
    }[case]
    features = tiny_graph.x.numpy()[tiny_partition.clients[1].owned]
    _swap_client(parties, 1, dataclasses.replace(parties.config, dp=client_dp), features)
    with pytest.raises(ConfigMismatchError):
        run_parties(InProcessTransport(), parties.all())
    assert not parties.server.done


def test_client_refuses_other_terms_or_bases_without_terms(tiny_graph, tiny_partition):
    h = Harness(tiny_graph, tiny_partition, seed=SEED, dp=DP).start()
    client = h.client(1)
    h.run(until=lambda: client.state.value == "await-encodings")  # the server's terms are not out yet
    before = client.snapshot()
    bad = h.craft(h.roster.server, PrivacyTerms, 1, epsilon=2.0, delta=DP.delta, dim=DP.dim, seed=DP.seed)
    with pytest.raises(ConfigMismatchError):
        client.receive(bad)
    bases = h.craft(
        h.roster.server,
        EncodingBases,
        1,
        bucket=0,
        variant="vector",
        n=1,
        nodes=client.owned[:1],
        p=np.ones((1, 1, 1)),
    )
    with pytest.raises(ConfigMismatchError):
        client.receive(bases)
    assert client.snapshot() == before


def test_server_refuses_release_uploads_it_cannot_use(tiny_graph, tiny_partition):
    # a session without DP refuses any release
    h = Harness(tiny_graph, tiny_partition, seed=SEED).start()
    h.run(until=lambda: h.server._spool is not None and h.client(1).holder is not None)
    node = int(h.client(1).owned[0])
    frame = h.craft(1, ReleaseUpload, h.roster.server, items=(UploadItem(node, 0, b"x"),))
    with pytest.raises(ConfigMismatchError):
        h.server.receive(frame)
    # a DP session refuses a release of a node the sender does not own
    h = Harness(tiny_graph, tiny_partition, seed=SEED, dp=DP).start()
    h.run(until=lambda: h.server._spool is not None and h.client(1).holder is not None)
    assert 1 in h.server._terms
    before = h.server.snapshot()
    foreign = int(h.client(2).owned[0])
    frame = h.craft(1, ReleaseUpload, h.roster.server, items=(UploadItem(foreign, 0, b"x"),))
    with pytest.raises(PayloadError, match="does not own"):
        h.server.receive(frame)
    assert h.server.snapshot() == before


def test_run_encrypted_fedgat_trains_on_the_dp_encodings(tiny_graph):
    kw = {"rounds": 2, "patience": 2, "progress": False, "dp_epsilon": 4.0, "dp_dim": 8}
    enc = run_encrypted_fedgat(tiny_graph, 3, 1.0, 0, workers=0, **kw)
    plain = run_encrypted_fedgat(tiny_graph, 3, 1.0, 0, encrypted=False, **kw)
    assert enc.pretrain is not None and enc.pretrain.layout.d == 8
    assert (
        max_abs_error(
            enc.pretrain.encodings,
            run_plaintext_pretraining(
                tiny_graph, enc.partition, "vector", 0, dp=FeatureDP(4.0, dim=8, seed=0)
            ),
        )
        <= TOL
    )
    assert len(enc.training.fit.history) == len(plain.training.fit.history) == 2
