"""The DP release in the encrypted pre-training round (``PretrainConfig.dp``, :mod:`fedgat.dp`).

Each client releases to the others only its nodes' DP release (randomness drawn by the client, ``W``
values per row: the server computes on those alone), and adds the share of its own clean rows in
plaintext: its decrypted encodings must equal the plaintext reference of the block layout,
``encode(..., [x, 0], shared_x=[0, release], owner=, viewer=client)`` -- its own sources clean in
the first ``d`` columns, every other source released in the last ``W``. No ciphertext a client
receives may hold another client's clean row, and parties refuse other DP terms.

The release's randomness comes from each client's CSPRNG and never from the seed: to compare the
encrypted round with its plaintext twin, a release is drawn once
(:func:`fedgat.dp_release.draw_release`, the ``drawn`` fixture) and handed to both (``dp_release``);
rounds that draw their own charge in-memory ledgers.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fedgat.app import bases_rng, build_pretrain_parties
from fedgat.crypto.encodings import RELEASE_OFFSET, plan_views
from fedgat.crypto.packing import decrypt_rows
from fedgat.crypto.tags import TAG_COLUMNS, prf_pads
from fedgat.dp import FeatureDP, block_rows
from fedgat.dp_fedavg import update_dp_from_hparams
from fedgat.dp_ledger import Budget, BudgetExceededError, DPLedger
from fedgat.dp_release import draw_release
from fedgat.encodings import BucketBases, encode
from fedgat.partition import make_partition
from fedgat.pipeline import (
    max_abs_error,
    run_encrypted_fedgat,
    run_encrypted_pretraining,
    run_plaintext_pretraining,
)
from fedgat.protocols import (
    ClientPretrain,
    ConfigMismatchError,
    EncodingBases,
    EncodingResults,
    FeatureUpload,
    GraphAnnounce,
    InProcessTransport,
    PrivacyTerms,
    ResultRejectedError,
    StateError,
    run_parties,
)

from graph_helpers import rows_by_node
from protocol_helpers import Harness, computing, refused_at_done, rejected

DP = FeatureDP(epsilon=4.0, delta=1e-5, mechanism="gaussian", dim=8, seed=5)
W = 9  # the release's width: a marker column and the 8 projected values
D = 16  # tiny_graph's features
SEED = 1
TOL = 1e-5


def ledgers(partition) -> dict[int, DPLedger]:
    """In-memory ledgers with room for many releases (the ledger itself: tests/privacy/test_dp_ledger.py)."""
    return {c: DPLedger(Budget(1000.0, DP.delta)) for c in range(partition.num_clients)}


@pytest.fixture(scope="module")
def drawn(tiny_graph, tiny_partition):
    """One release of every node, drawn once and handed to the encrypted round and its twin."""
    return draw_release(tiny_graph, tiny_partition, DP, ledgers=ledgers(tiny_partition))


def reference(graph, partition, variant, viewer, drawn):
    """``encode([x, 0], ..., shared_x=[0, release], owner=, viewer=)`` over the server's bases (drawn
    over all nodes with the same seed) and the release ``drawn``."""
    own, shared = block_rows(graph.x.double(), drawn)
    return rows_by_node(
        encode(
            variant,
            own,
            partition.neighbourhoods,
            nodes=np.arange(graph.num_nodes),
            rng=bases_rng(SEED),
            shared_x=shared,
            owner=partition.owner,
            viewer=viewer,
        )
    )


def worst(got: dict, want: dict, nodes) -> float:
    return max(float(np.abs(got[int(n)] - want[int(n)]).max()) for n in nodes)


def released_rows(partition) -> int:
    """(row, recipient) pairs the round releases: per client, the foreign rows its needed nodes read."""
    nbh, owner = partition.neighbourhoods, partition.owner
    total = 0
    for c, cp in enumerate(partition.clients):
        rows = np.unique(np.concatenate([nbh.row(int(i)) for i in cp.needed]))
        total += int((owner[rows] != c).sum())
    return total


@pytest.fixture(scope="module", params=["vector", "matrix"])
def dp_round(request, tiny_graph, tiny_partition, drawn):
    variant = request.param
    h = Harness(tiny_graph, tiny_partition, variant=variant, seed=SEED, dp=DP, dp_release=drawn).start().run()
    assert all(p.done for p in h.parties.all().values())
    return variant, h


# ------------------------------------------------------------------------- (1) equals the reference
def test_decrypted_encodings_equal_the_plaintext_reference(dp_round, tiny_graph, tiny_partition, drawn):
    variant, h = dp_round
    for c in h.roster.clients:
        enc = h.client(c).encodings
        np.testing.assert_array_equal(enc.nodes, tiny_partition.clients[c].needed)
        assert enc.buckets[0].h_self.shape[1] == D + W == D + DP.width(D, tiny_graph.num_classes)
        err = worst(rows_by_node(enc), reference(tiny_graph, tiny_partition, variant, c, drawn), enc.nodes)
        assert err <= TOL, (c, err)
    # the pipeline's plaintext twin is the same reference
    got = {c: h.client(c).encodings for c in h.roster.clients}
    assert (
        max_abs_error(
            got, run_plaintext_pretraining(tiny_graph, tiny_partition, variant, SEED, dp=DP, dp_release=drawn)
        )
        <= TOL
    )
    assert not h.server.has_secret_key


@pytest.mark.parametrize("window", [None, 1], ids=["all-uploads", "upload-window"])
def test_run_encrypted_pretraining_takes_dp(tiny_graph, tiny_partition, drawn, window):
    # with an upload window the server confirms the terms and sends the bases while clients upload
    res = run_encrypted_pretraining(
        tiny_graph,
        tiny_partition,
        "vector",
        seed=SEED,
        progress=False,
        workers=0,
        dp=DP,
        dp_release=drawn,
        upload_window=window,
    )
    want = run_plaintext_pretraining(tiny_graph, tiny_partition, "vector", SEED, dp=DP, dp_release=drawn)
    assert max_abs_error(res.encodings, want) <= TOL
    # one 1-chunk ciphertext per released (row, recipient) pair: the W released values and the tags
    assert res.layout.d == W + TAG_COLUMNS and res.layout.chunks == 1
    assert res.ciphertexts_up == released_rows(tiny_partition) > 0
    assert not res.server_has_secret_key


# ------------------------------------------------------------ (2) own sources clean, others released
def test_each_client_sees_its_own_clean_features_and_the_release_of_others(
    dp_round, tiny_graph, tiny_partition, drawn
):
    variant, h = dp_round
    owner = tiny_partition.owner
    nbh = tiny_partition.neighbourhoods
    clean, release = block_rows(tiny_graph.x.double(), drawn)
    assert np.abs(DP.clean_rows(tiny_graph.x) - drawn.numpy()).max() > 0.5  # the release is far from clean
    for c in h.roster.clients:
        got = rows_by_node(h.client(c).encodings)
        needed = tiny_partition.clients[c].needed
        mine = np.array([bool((owner[nbh.row(int(i))] == c).any()) for i in needed])
        assert mine.any() and (~mine).any()
        for other in h.roster.clients:
            if other == c:
                continue
            wrong = reference(tiny_graph, tiny_partition, variant, other, drawn)
            # a node with a source of c or of `other` differs under the wrong viewer ...
            touched = [i for i in needed if np.isin(owner[nbh.row(int(i))], (c, other)).any()]
            assert min(float(np.abs(got[int(i)] - wrong[int(i)]).max()) for i in touched) > 100 * TOL
            # ... and nodes with sources of neither agree (both read only releases there)
            rest = [i for i in needed if i not in set(touched)]
            if rest:
                assert worst(got, wrong, rest) <= TOL
        # the owner's own h_i is its clean row [x, 0] (row 0), every foreign h_i the release [0, r]
        for i in needed:
            want = clean if owner[i] == c else release
            assert np.abs(got[int(i)][0] - want[int(i)].numpy()).max() <= TOL


# ------------------------------------------- (3) no client receives anything built on a foreign clean copy
def test_no_ciphertext_a_client_receives_holds_another_clients_clean_row(
    dp_round, tiny_graph, tiny_partition, drawn
):
    """Decrypting what crossed the wire with the key it was made for: every upload is the owner's
    release of the row (never its clean projection), every result the foreign share over releases."""
    _, h = dp_round
    owner = tiny_partition.owner
    release = drawn.numpy()
    clean = DP.clean_rows(tiny_graph.x)  # the owner's row through the mechanism without noise
    layout, config = h.server.layout, h.parties.config

    def pads(recipient: int, owner: int, nodes) -> np.ndarray:
        """The pads ``owner`` added to its release of ``nodes`` for ``recipient``."""
        keys = h.client(recipient)._my_keys[owner]
        return prf_pads(keys.prf, config.session, np.asarray(nodes), W, config.upload_pad)

    uploads = 0
    for b in h.roster.clients:
        for msg in h.sent(b, FeatureUpload):
            holder = h.client(msg.target).holder
            for item in msg.items:
                got = decrypt_rows(holder, [item.ciphertext], 1, layout, kind="fresh")[0, :W]
                got -= pads(msg.target, b, [item.node])[0]
                assert owner[item.node] == b != msg.target
                assert np.abs(got - release[item.node]).max() <= TOL
                assert np.abs(got - clean[item.node]).max() > 100 * TOL
                uploads += 1
    assert uploads == released_rows(tiny_partition)
    for c in h.roster.clients:
        client = h.client(c)
        bases = {int(n): (b.bases, k) for b in client.encodings.buckets for k, n in enumerate(b.bases.nodes)}
        seen = 0
        for msg in h.sent(h.roster.server, EncodingResults, c):
            for item in msg.items:
                rows = bases[item.node][0].num_feature_rows()
                count = len(item.nodes)  # partials packed in the item, each node's rows apart
                packed = decrypt_rows(
                    client.holder, list(item.row_blobs), count * rows, layout, kind="result"
                )
                for node, got in zip(
                    item.nodes, layout.unpack_items(packed[:, :W], count, rows), strict=True
                ):
                    bb, k = bases[node]
                    part = owner[bb.neighbours[k]] == item.owner  # a partial: one foreign owner's rows
                    assert item.owner != c and part.any()
                    sources = bb.neighbours[k][part]
                    want = bb.coefficients(k)[:, part] @ (release[sources] + pads(c, item.owner, sources))
                    assert np.abs(got - want).max() <= TOL
                    seen += 1
        nbh = tiny_partition.neighbourhoods
        assert seen == sum(
            len(set(owner[nbh.row(int(i))].tolist()) - {c}) for i in tiny_partition.clients[c].needed
        )


def test_a_result_over_other_coefficients_is_rejected_under_dp_too(tiny_graph, tiny_partition):
    """DP releases skip the range check, not the tags."""
    h = Harness(tiny_graph, tiny_partition, seed=SEED, dp=DP, dp_ledgers=ledgers(tiny_partition)).start()
    h.run(until=lambda: computing(h))
    plan = h.server.plan
    victim = next(c for c in sorted(plan.shares) if plan.shares[c])
    share = plan.shares[victim][0].share
    node = int(share.nodes[0])  # the first partial of the first pack: the first the victim checks
    share.bases.p[0, 0, int(np.flatnonzero(share.foreign[0])[0])] -= 0.5
    while True:
        out = h.server.step()
        hit = next((m for m in out if isinstance(m, EncodingResults) and m.recipient == victim), None)
        if hit is not None:
            break
        h.driver.emit(h.server.party_id, out)
        h.run()
    rest = [m for m in out if m is not hit]
    err = refused_at_done(h, victim, h.server.encode(hit), ResultRejectedError, rest=rest)
    assert err.node == node


def test_plan_views_shares_the_all_release_view_and_splits_the_rest():
    """Clients owning none of a node's sources share one result; each other client gets its own
    (the plaintext twin's plan, :func:`fedgat.protocols.pretrain_plan.plan_round` with views)."""
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


def test_the_release_is_drawn_by_its_owner_afresh_each_session(tiny_graph, tiny_partition):
    """The release is drawn by the client from its CSPRNG, never from the seed: two sessions with the
    same seed release different noise."""
    a = build_pretrain_parties(
        tiny_graph, tiny_partition, seed=SEED, dp=DP, dp_ledgers=ledgers(tiny_partition)
    )
    b = build_pretrain_parties(
        tiny_graph, tiny_partition, seed=SEED, dp=DP, dp_ledgers=ledgers(tiny_partition)
    )
    ca, cb = a.clients[1], b.clients[1]
    np.testing.assert_allclose(ca._features, cb._features)  # its own clean rows
    assert np.abs(ca._release - cb._release).max() > 0.1  # fresh noise each time
    assert not hasattr(a.server, "_release")


# --------------------------------------------------------------------------------- (4) mismatches
def _swap_client(parties, c: int, config, features: np.ndarray) -> None:
    """Rebuild client ``c`` with another config (a misconfigured party)."""
    old = parties.clients[c]
    parties.clients[c] = ClientPretrain(
        c,
        parties.deployment.roster,
        config,
        parties.deployment.identities[c],
        owned=old.owned,
        features=features,
        indptr=old._graph.indptr,
        indices=old._graph.indices,
        cross=old.local.cross,
        cross_owner=old.local.cross_owner,
        needed=old.needed,
        dtype=old.dtype,
        ledger=DPLedger(Budget(1000.0, DP.delta)),
    )


@pytest.mark.parametrize(
    "case",
    ["other-epsilon", "client-without-dp", "server-without-dp", "other-projection-seed", "other-mechanism"],
)
def test_mismatched_dp_terms_are_refused(case, tiny_graph, tiny_partition):
    server_dp = None if case == "server-without-dp" else DP
    parties = build_pretrain_parties(
        tiny_graph, tiny_partition, seed=SEED, dp=server_dp, dp_ledgers=ledgers(tiny_partition)
    )
    client_dp = {
        "other-epsilon": dataclasses.replace(DP, epsilon=2.0),
        "client-without-dp": None,
        "server-without-dp": DP,
        "other-projection-seed": dataclasses.replace(DP, seed=6),
        "other-mechanism": dataclasses.replace(DP, mechanism="multibit"),
    }[case]
    features = tiny_graph.x.numpy()[tiny_partition.clients[1].owned]
    _swap_client(parties, 1, dataclasses.replace(parties.config, dp=client_dp), features)
    with pytest.raises(ConfigMismatchError):
        run_parties(InProcessTransport(), parties.all())
    assert not parties.server.done


def test_client_refuses_other_terms_or_bases_without_terms(tiny_graph, tiny_partition):
    h = Harness(tiny_graph, tiny_partition, seed=SEED, dp=DP, dp_ledgers=ledgers(tiny_partition)).start()
    client = h.client(1)
    h.run(until=lambda: client.state.value == "await-encodings")  # the server's terms are not out yet
    terms = h.parties.config.dp_fields()
    for other in ({"epsilon": 2.0}, {"mechanism": "label_rr"}, {"bits": 3}, {"low": -2.0}):
        bad = h.craft(h.roster.server, PrivacyTerms, 1, **{**terms, **other})
        rejected(client, bad, ConfigMismatchError)
    node = client.owned[:1]
    bases = h.craft(
        h.roster.server,
        EncodingBases,
        1,
        bucket=0,
        variant="vector",
        n=1,
        nodes=node,
        neighbours=node[:, None],
        owners=np.array([[1]]),
        p=np.ones((1, 1, 1)),
    )
    rejected(client, bases, ConfigMismatchError)
    h.run()
    assert all(p.done for p in h.parties.all().values())


def test_the_server_confirms_the_terms_and_refuses_graphs_without_them(tiny_graph, tiny_partition):
    h = Harness(tiny_graph, tiny_partition, seed=SEED, dp=DP, dp_ledgers=ledgers(tiny_partition))
    server, sid = h.server, h.roster.server
    g = h.client(1)._graph
    graph = {"dim": g.dim, "owned": g.owned, "indptr": g.indptr, "indices": g.indices}
    rejected(
        server, h.craft(1, GraphAnnounce, sid, **graph), ConfigMismatchError, "without the session's DP terms"
    )
    server.receive(h.craft(1, PrivacyTerms, sid, **h.parties.config.dp_fields()))
    rejected(server, h.craft(1, PrivacyTerms, sid, **h.parties.config.dp_fields()), StateError, "already")
    assert graph["dim"] == W  # a client announces the width of what it uploads
    rejected(
        server,
        h.craft(1, GraphAnnounce, sid, **{**graph, "dim": W + 1}),
        ConfigMismatchError,
        "projects to 8",
    )
    server.receive(h.craft(1, GraphAnnounce, sid, **graph))
    # a session without DP refuses any terms
    plain = Harness(tiny_graph, tiny_partition, seed=SEED)
    rejected(
        plain.server, plain.craft(1, PrivacyTerms, sid, **h.parties.config.dp_fields()), ConfigMismatchError
    )
    # in a full round, every client hears the server's terms before its first bases
    h = (
        Harness(tiny_graph, tiny_partition, seed=SEED, dp=DP, dp_ledgers=ledgers(tiny_partition))
        .start()
        .run()
    )
    for c in h.roster.clients:
        kinds = [e.type_name for e in h.transport.transcript.received_by(c)]
        assert kinds.count("PrivacyTerms") == 1 and kinds.index("PrivacyTerms") < kinds.index("EncodingBases")


def test_run_encrypted_fedgat_trains_on_the_dp_encodings(tiny_graph, tmp_path):
    """The app-level run charges each owner's persistent ledger (``dp_ledger_dir``, ``dp_budget``) and
    reports what it spent; the plaintext twin charges the same ledgers again (same features)."""
    kw = {
        "rounds": 2,
        "patience": 2,
        "progress": False,
        "dp_epsilon": 4.0,
        "dp_mechanism": "gaussian",
        "dp_dim": 8,
        "dp_budget": (20.0, 1e-5),
        "dp_ledger_dir": str(tmp_path),
    }
    enc = run_encrypted_fedgat(tiny_graph, 3, 1.0, 0, workers=0, **kw)
    plain = run_encrypted_fedgat(tiny_graph, 3, 1.0, 0, encrypted=False, **kw)
    assert enc.pretrain is not None and enc.pretrain.layout.d == W + TAG_COLUMNS
    assert len(enc.training.fit.history) == len(plain.training.fit.history) == 2
    # one release per owner so far: the accountant charges exactly epsilon (PLD is tight here)
    assert enc.pretrain.dp_spent is not None and sorted(enc.pretrain.dp_spent) == [0, 1, 2]
    for eps, delta in enc.pretrain.dp_spent.values():
        assert eps == pytest.approx(4.0, rel=1e-6) and delta == 1e-5
    assert enc.summary()["dp_spent"]["0"][0] == pytest.approx(4.0, rel=1e-6)
    # the twin is a second release of the same rows: composed, more than 4 and less than 8
    assert plain.dp_spent is not None
    for eps, _ in plain.dp_spent.values():
        assert 4.5 < eps < 8.0
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [
        "client-0.json",
        "client-1.json",
        "client-2.json",
    ]


def test_label_rr_trains_its_predictor_through_the_protocol_and_releases_labels(tiny_graph, tmp_path):
    """label_rr end to end: the predictor's secure FedAvg rounds first (every client ends with the same
    published weights), then each owner uploads a marker plus a one-hot label (width 1 + classes), the
    predictor's rounds counted against DP-FedAvg's budget when it is on."""
    from fedgat.pipeline import train_release_predictor

    kw = {
        "rounds": 2,
        "patience": 2,
        "dp_predictor_rounds": 3,
        "dp_epsilon": 2.0,
        "dp_budget": (2.0, 1e-5),
        "dp_ledger_dir": str(tmp_path),
    }
    part = make_partition(tiny_graph, 3, beta=1.0, seed=0, num_layers=2)
    predictors, rounds = train_release_predictor(tiny_graph, part, seed=0, progress=False, **kw)
    assert sorted(predictors) == [0, 1, 2] and rounds == {0: 0, 1: 0, 2: 0}  # no DP-FedAvg: nothing counted
    first = predictors[0].state
    for p in predictors.values():  # every client holds the weights of the last round
        assert all(torch.equal(first[k], p.state[k]) for k in first)
    assert predictors[0].labels(tiny_graph.x.numpy()).max() < tiny_graph.num_classes
    run = run_encrypted_fedgat(tiny_graph, 3, 1.0, 0, workers=0, progress=False, **kw)
    classes = tiny_graph.num_classes
    assert run.pretrain is not None and run.pretrain.layout.d == 1 + classes + TAG_COLUMNS
    for enc in run.pretrain.encodings.values():
        assert enc.buckets[0].h_self.shape[1] == D + 1 + classes
    assert {c: e for c, (e, _) in run.dp_spent.items()} == pytest.approx({0: 2.0, 1: 2.0, 2: 2.0}, rel=1e-4)
    # the budget is spent: a second run refuses before its predictor trains or anything is sent
    with pytest.raises(BudgetExceededError):
        run_encrypted_fedgat(tiny_graph, 3, 1.0, 0, workers=0, progress=False, **kw)
    # with DP-FedAvg the predictor's rounds count: the clients' round budget covers both phases
    upd = run_encrypted_fedgat(
        tiny_graph, 3, 1.0, 0, workers=0, progress=False, update_dp_epsilon=8.0,
        **{**kw, "dp_ledger_dir": str(tmp_path / "again")},
    )  # fmt: skip
    dp = update_dp_from_hparams(upd.training.hparams)
    assert dp is not None and dp.max_rounds == 3 + 2
    # each round's update and each round's evaluation: the whole budget of 8
    assert dp.max_releases == 2 * (3 + 2)
    assert upd.training.update_dp_spent == pytest.approx((dp.epsilon(2 * (3 + 2)), 1e-5))
    assert upd.training.update_dp_spent[0] == pytest.approx(8.0, rel=1e-6)


def test_the_protocol_run_charges_the_update_ledgers_before_anything_is_sent(tiny_graph, tmp_path):
    """run_encrypted_fedgat with ``update_dp_budget``: each client's DP-FedAvg ledger is charged the
    run's releases before the rounds (the summary states what each has spent); the run past the budget
    is refused before anything is sent, the ledgers unchanged."""
    ledgers = tmp_path / "upd"
    kw = {
        "encrypted": False,
        "workers": 0,
        "progress": False,
        "rounds": 2,
        "patience": 5,
        "update_dp_epsilon": 4.0,
        "update_dp_budget": (5.0, 1e-5),
        "update_dp_ledger_dir": str(ledgers),
    }
    run = run_encrypted_fedgat(tiny_graph, 3, 1.0, 0, **kw)
    assert sorted(run.update_ledger_spent) == [0, 1, 2]
    assert all(e == pytest.approx(4.0, rel=1e-3) and d == 1e-5 for e, d in run.update_ledger_spent.values())
    assert run.summary()["update_ledger_spent"]["0"] == list(run.update_ledger_spent[0])
    files = sorted(ledgers.glob("*.json"))
    before = [f.read_bytes() for f in files]
    transport = InProcessTransport()
    with pytest.raises(BudgetExceededError, match="over the budget epsilon 5"):
        run_encrypted_fedgat(tiny_graph, 3, 1.0, 0, transport=transport, **kw)
    assert [f.read_bytes() for f in files] == before and transport.traffic == {}
    # a run that could not train (2 clients: no secure sum for DP-FedAvg) is refused before the
    # ledgers are charged, however often it is retried
    fresh = {**kw, "update_dp_ledger_dir": str(tmp_path / "two")}
    for _ in range(2):
        with pytest.raises(ValueError, match="secure aggregation"):
            run_encrypted_fedgat(tiny_graph, 2, 1.0, 0, **fresh)
    assert not (tmp_path / "two").exists()
