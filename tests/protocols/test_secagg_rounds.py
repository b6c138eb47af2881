"""Secure aggregation through the FedAvg state machines: the server gets the weighted mean and nothing
else, drop-outs after the key sharing are unmasked from the others' shares, and hostile or damaged
stage messages are refused with typed errors and no state change (Bonawitz et al. 2017)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from fault_helpers import FaultyTransport, Federation, same_history, same_state

from fedgat.checkpoint import CheckpointStore
from fedgat.federated import FedAdam, FedProx, fedavg
from fedgat.protocols import (
    AuthError,
    ConfigMismatchError,
    Driver,
    GlobalModel,
    LocalUpdate,
    PayloadError,
    QuorumError,
    ReplayError,
    SignatureError,
    StateError,
    Transcript,
    decode_message,
    encode_message,
    run_parties,
)
from fedgat.protocols.driver import ManualClock
from fedgat.protocols.fedavg import RoundTimeouts
from fedgat.protocols.messages import peek_type
from fedgat.protocols.messages_secagg import (
    AdvertItem,
    Confirmation,
    RevealedShare,
    SealedShare,
    SecAggAdvert,
    SecAggCohort,
    SecAggConfirm,
    SecAggMasked,
    SecAggRelay,
    SecAggShares,
    SecAggSurvivors,
    SecAggUnmaskRequest,
    SecAggUnmaskShares,
)
from fedgat.protocols.secagg import (
    SEALED_SHARE_BYTES,
    SecAggConfig,
    confirm_bytes,
    mask_key,
    public_bytes,
    random_seed,
    seal_share,
)

SECURE = SecAggConfig()
TIMEOUTS = RoundTimeouts(fit=10.0, evaluate=10.0)
SEQ = itertools.count(1 << 40)


def _fed(num_clients: int = 4, rounds: int = 3, **kw) -> Federation:
    return Federation(rounds=rounds, fraction=1.0, secagg=SECURE, num_clients=num_clients, **kw)


def _record_updates(parties: dict, fed: Federation) -> dict:
    """Wrap every client's local training: (round, client) -> the update it computed."""
    got: dict = {}
    for c in fed.roster.clients:
        party, fit = parties[c], parties[c].client.fit

        def recorder(weights, _c=c, _party=party, _fit=fit):
            update = _fit(weights)
            got[_party.last_round, _c] = update
            return update

        party.client.fit = recorder
    return got


def _refused(party, frame: bytes, error: type[Exception], match: str | None = None) -> None:
    before = party.snapshot()
    with pytest.raises(error, match=match):
        party.receive(frame)
    assert party.snapshot() == before


def _resign(fed: Federation, msg, **fields) -> bytes:
    """``msg`` with ``fields`` changed, signed again by its sender (a hostile server can sign anything)."""
    changed = dataclasses.replace(msg, signature=None, signed_bytes=None, **fields)
    return encode_message(changed, fed.dep.identities[msg.sender].signer)


def _craft(fed: Federation, cls, sender: int, recipient: int, **fields) -> bytes:
    msg = cls(sender=sender, recipient=recipient, session=9, seq=next(SEQ), **fields)
    return encode_message(msg, fed.dep.identities[sender].signer)


class Held:
    """A secure federation run until the frames of ``cls`` are all held back (not delivered)."""

    def __init__(self, cls, count: int, **kw) -> None:
        self.fed = _fed(**kw)
        self.parties = self.fed.parties()
        self.transport = FaultyTransport(Transcript())
        self.transport.rules.append(lambda s, t, d: "hold" if peek_type(d) == cls.TYPE else None)
        self.driver = Driver(self.transport, self.parties, clock=ManualClock())
        self.driver.start()
        self.driver.run(until=lambda: len(self.transport.held) >= count)
        assert len(self.transport.held) == count

    @property
    def server(self):
        return self.parties[self.fed.sid]

    def held(self, to: int):
        return next(decode_message(d) for _, r, d in self.transport.held if r == to)

    def frame(self, to: int) -> bytes:
        return next(d for _, r, d in self.transport.held if r == to)


# ------------------------------------------------------------------------------- the aggregate
@pytest.mark.parametrize(
    ("strategy_fn", "fraction", "num_clients"),
    [
        (None, 1.0, 4),
        (lambda: FedProx(0.1), 1.0, 4),
        (lambda: FedAdam(0.05, 5e-4, client_lr=0.5), 1.0, 4),
        (None, 0.5, 6),  # 3 of 6 sampled: the other 3 add their counts only
    ],
)
def test_secure_rounds_train_like_plaintext_rounds(strategy_fn, fraction, num_clients):
    """Same weights and the same history: the pooled validation and test counts from the masked sums
    (every client takes part with its counts; only the sampled ones with an update) are those the
    plaintext run pools from per-client reports."""
    runs = {}
    for secure in (False, True):
        fed = Federation(
            rounds=4,
            fraction=fraction,
            num_clients=num_clients,
            strategy_fn=strategy_fn,
            secagg=SECURE if secure else None,
        )
        parties = fed.parties()
        run_parties(FaultyTransport(), parties, clock=ManualClock())
        runs[secure] = parties[fed.sid]
    plain, secure = runs[False], runs[True]
    assert secure.done and secure.result.rounds == 4 and "secagg" in secure.timings
    for k, v in plain.global_state.items():
        assert torch.allclose(secure.global_state[k], v, rtol=1e-5, atol=1e-6), k
    for a, b in zip(secure.history, plain.history, strict=True):
        assert a["clients"] == b["clients"] and a["val_accuracy"] == b["val_accuracy"]
        assert a.get("test_accuracy") == b.get("test_accuracy")
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-6)
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-9)
    assert secure.result.best_round == plain.result.best_round
    assert secure.result.test_accuracy == plain.result.test_accuracy


def test_the_server_sees_no_update_only_the_sum():
    """Anchors of every update's float32 weights are searched in every frame the clients sent: found in a
    plaintext run, never in a secure one; and the aggregate is the plaintext weighted mean."""
    hits = {}
    for secure in (False, True):
        fed = Federation(rounds=2, fraction=1.0, num_clients=4, secagg=SECURE if secure else None)
        parties = fed.parties()
        updates = _record_updates(parties, fed)
        transport = FaultyTransport(Transcript())
        run_parties(transport, parties, clock=ManualClock())
        up = [e for e in transport.transcript if e.recipient == fed.sid]
        types = {e.type_name for e in up}
        anchors = {
            t.numpy()[..., :2].tobytes()[:8]
            for u in updates.values()
            if u.num_train
            for t in u.state.values()
            if t.numel() >= 2
        }
        hits[secure] = sum(a in e.data for a in anchors for e in up)
        if secure:
            assert types == {
                "SecAggAdvert",
                "SecAggShares",
                "SecAggMasked",
                "SecAggConfirm",
                "SecAggUnmaskShares",
            }  # no EvaluationReport: counts travel inside the masked sums
            srv = parties[fed.sid]
            # round 2's aggregate: the weighted mean of the round-2 updates (FedAvg)
            last = [updates[2, c] for c in fed.roster.clients]
            want = fedavg([u.state for u in last], [u.num_train for u in last])
            for k, v in want.items():
                assert torch.allclose(srv.global_state[k], v, rtol=1e-6, atol=1e-7)
        else:
            assert "LocalUpdate" in types
    assert hits[False] > 0 and hits[True] == 0


def test_a_client_that_drops_after_sharing_keys_is_unmasked_from_the_others_shares():
    fed = _fed(rounds=2, timeouts=TIMEOUTS)
    parties = fed.parties()
    updates = _record_updates(parties, fed)
    transport = FaultyTransport(Transcript())
    transport.rules.append(
        lambda s, t, d: (
            "drop" if s == 2 and peek_type(d) == SecAggMasked.TYPE and parties[2].last_round == 2 else None
        )
    )
    run_parties(transport, parties, clock=ManualClock())
    srv = parties[fed.sid]
    assert srv.done and srv.failure is None
    row = srv.history[1]
    assert row["clients"] == [0, 1, 3] and row["missing_fit"] == [2]
    shares = [decode_message(e.data) for e in transport.transcript if e.type_name == "SecAggUnmaskShares"]
    assert all([s.party for s in m.s_shares] == [2] for m in shares if m.round == 2)  # 2's mask key rebuilt
    survivors = [updates[2, c] for c in (0, 1, 3)]
    want = fedavg([u.state for u in survivors], [u.num_train for u in survivors])
    for k, v in want.items():
        assert torch.allclose(srv.global_state[k], v, rtol=1e-6, atol=1e-7)
    n = sum(u.num_train for u in survivors)
    assert row["train_loss"] == pytest.approx(sum(u.loss * u.num_train for u in survivors) / n, rel=1e-12)


@pytest.mark.parametrize(
    "clients, dropped, kind, stage",
    [
        (3, [2], SecAggAdvert, "fit:keys"),
        (4, [1, 2], SecAggMasked, "fit:masked"),
        (4, [0, 1], SecAggShares, "fit:shares"),
        (4, [2, 3], SecAggConfirm, "fit:confirm"),
        (5, [0, 1, 4], SecAggUnmaskShares, "fit:unmask"),
    ],
)
def test_too_few_answers_stop_the_round(clients, dropped, kind, stage):
    fed = _fed(num_clients=clients, rounds=2, timeouts=TIMEOUTS)
    parties = fed.parties()
    transport = FaultyTransport()
    transport.rules.append(lambda s, t, d: "drop" if s in dropped and peek_type(d) == kind.TYPE else None)
    with pytest.raises(QuorumError) as info:
        run_parties(transport, parties, clock=ManualClock())
    assert info.value.phase == stage and info.value.missing == tuple(dropped) and info.value.round == 1


# --------------------------------------------------------------------------------- hostile server
def test_clients_refuse_a_cohort_trained_on_different_models():
    """The server sends client 3 another model: the adverts carry the digests, signed by each client."""
    h = Held(GlobalModel, 4, rounds=2)
    other = h.held(3)
    arrays = {k: v + np.float32(0.01) for k, v in other.arrays.items()}
    replies = {
        c: h.parties[c].receive(h.frame(c) if c != 3 else _resign(h.fed, other, arrays=arrays))
        for c in range(4)
    }
    adverts = [next(m for m in replies[c] if isinstance(m, SecAggAdvert)) for c in range(4)]
    items = tuple(AdvertItem.of(a) for a in adverts)
    assert len({i.model_digest for i in items}) == 2
    cohort = _craft(h.fed, SecAggCohort, h.fed.sid, 0, round=1, adverts=items)
    _refused(h.parties[0], cohort, PayloadError, "another global model")
    # the honest server refuses the odd advert itself
    srv_frame = encode_message(adverts[3], h.fed.dep.identities[3].signer)
    _refused(h.server, srv_frame, PayloadError, "another model")


def test_clients_check_every_advert_of_the_cohort():
    h = Held(SecAggCohort, 4)
    msg = h.held(0)
    a = list(msg.adverts)
    swapped = dataclasses.replace(a[1], s_pk=public_bytes(mask_key(random_seed(), 9, 1, 1)))  # not 1's key
    stranger = dataclasses.replace(a[3], party=77)
    cases = [
        ((a[0], swapped, a[2], a[3]), SignatureError, "not signed"),
        ((a[1], a[2], a[3]), PayloadError, "own advert"),
        ((a[0], a[1]), PayloadError, "below the minimum"),
        ((a[0], a[1], a[2], stranger), AuthError, "not a client"),
    ]
    for adverts, error, match in cases:
        _refused(h.parties[0], _resign(h.fed, msg, adverts=adverts), error, match)
    assert [type(m) for m in h.parties[0].receive(h.frame(0))] == [SecAggShares]


def test_clients_refuse_tampered_or_forged_shares():
    h = Held(SecAggRelay, 4)
    msg, client = h.held(0), h.parties[0]
    items = list(msg.shares)
    assert [s.party for s in items] == [1, 2, 3]
    flipped = bytearray(items[0].sealed)
    flipped[50] ^= 1
    # the server seals its own shares to client 0's round key and claims they come from client 2
    c_pk = client._secure.cohort[0].c_pk
    view = client._secure.view
    forged_box = seal_share(
        h.fed.dep.identities[h.fed.sid].signer, c_pk, 9, 1, 2, 0, 1, b"f" * 16, b"f" * 16, view
    )
    cases = [
        ((SealedShare(1, bytes(flipped)), items[1], items[2]), AuthError, "do not open"),
        ((items[0], SealedShare(2, forged_box), items[2]), SignatureError, "not signed"),
        ((SealedShare(1, items[1].sealed), SealedShare(2, items[0].sealed), items[2]), AuthError, None),
        ((items[0],), PayloadError, "below the threshold"),  # U2 = {0, 1}: 2 < t = 3
        ((*items, SealedShare(9, items[0].sealed)), PayloadError, "outside the cohort"),
    ]
    for shares, error, match in cases:
        _refused(client, _resign(h.fed, msg, shares=shares), error, match)
    assert [type(m) for m in client.receive(h.frame(0))] == [SecAggMasked]


def test_a_client_reveals_one_share_per_client_and_answers_once():
    h = Held(SecAggSurvivors, 4)
    msg, client = h.held(0), h.parties[0]
    assert msg.survivors == (0, 1, 2, 3)
    cases = [
        ((0, 1), "below the threshold"),
        ((1, 2, 3), "counts this client as dropped"),
        ((0, 1, 2, 5), "did not deal shares"),
    ]
    for survivors, match in cases:
        _refused(client, _resign(h.fed, msg, survivors=survivors), PayloadError, match)
    # the server claims client 3 dropped: clients 0-2 confirm that set (t = 3 signatures) ...
    confirms = {c: h.parties[c].receive(_resign(h.fed, h.held(c), survivors=(0, 1, 2)))[0] for c in (0, 1, 2)}
    assert all(isinstance(m, SecAggConfirm) for m in confirms.values())
    confirmations = tuple(Confirmation(c, m.confirmation) for c, m in confirms.items())
    request = _craft(
        h.fed, SecAggUnmaskRequest, h.fed.sid, 0, round=1, survivors=(0, 1, 2), confirmations=confirmations
    )
    # ... client 0 reveals 3's mask-key share and no b share of 3
    (answer,) = client.receive(request)
    assert [s.party for s in answer.b_shares] == [0, 1, 2] and [s.party for s in answer.s_shares] == [3]
    # ... and never answers again, so it cannot be made to reveal 3's b share as well
    for survivors in ((0, 1, 2, 3), (0, 1, 2)):
        again = _craft(
            h.fed,
            SecAggUnmaskRequest,
            h.fed.sid,
            0,
            round=1,
            survivors=survivors,
            confirmations=confirmations,
        )
        _refused(client, again, StateError, "never answers twice")
    assert client._secure.s_seed == b"" and client._secure.received == {}  # the round's secrets are gone


def test_the_server_checks_every_stage_answer():
    h = Held(SecAggRelay, 4)  # every client has dealt its shares
    srv, fed = h.server, h.fed
    ids = fed.dep.identities
    adv = lambda c, **kw: _craft(
        fed,
        SecAggAdvert,
        c,
        fed.sid,
        **{
            "round": 1,
            "c_pk": b"c" * 32,
            "s_pk": b"s" * 32,
            "b_commit": b"b" * 32,
            "model_digest": b"d" * 32,
            "binding_signature": b"x" * 64,
            "parts": 3,
            **kw,
        },
    )
    _refused(srv, adv(0), StateError, "stage 'masked'")  # too late for adverts
    _refused(srv, adv(0, round=2), ReplayError)
    masked = np.zeros((2, 5), np.int64)
    _refused(srv, _craft(fed, SecAggMasked, 0, fed.sid, round=1, masked=masked), PayloadError, "shape")
    share = RevealedShare(0, b"q" * 16)
    unmask = _craft(fed, SecAggUnmaskShares, 0, fed.sid, round=1, b_shares=(share,), s_shares=())
    _refused(srv, unmask, StateError, "stage 'masked'")
    update = LocalUpdate(
        sender=0, recipient=fed.sid, session=9, seq=next(SEQ), round=1, num_train=0, loss=0.1, arrays={}
    )
    _refused(srv, encode_message(update, ids[0].signer), ConfigMismatchError, "secure aggregation")


def test_the_server_checks_adverts_and_shares():
    h = Held(SecAggAdvert, 4)
    srv, fed = h.server, h.fed
    first = decode_message(h.transport.held[0][2])
    sender = first.sender
    _refused(srv, _resign(fed, first, model_digest=bytes(32)), SignatureError)  # the digest is signed
    _refused(srv, _resign(fed, first, parts=first.parts ^ 2), SignatureError)  # so are the parts
    bad_sig = dataclasses.replace(first, signature=None, signed_bytes=None, binding_signature=b"x" * 64)
    _refused(srv, encode_message(bad_sig, fed.dep.identities[sender].signer), SignatureError)
    # an advert signed by another client for this one's keys
    forged = dataclasses.replace(first, signature=None, signed_bytes=None, sender=(sender + 1) % 4)
    _refused(srv, encode_message(forged, fed.dep.identities[(sender + 1) % 4].signer), SignatureError)
    srv.receive(h.transport.held[0][2])
    _refused(srv, _resign(fed, first, seq=first.seq + 1), ReplayError, "already answered")
    # the other adverts arrive; then client 1 deals shares that leave out client 3
    for _, _, data in h.transport.held[1:]:
        srv.receive(data)
    assert srv._secure.stage == "shares"
    box = SealedShare(0, b"z" * SEALED_SHARE_BYTES)
    short = _craft(fed, SecAggShares, 1, fed.sid, round=1, shares=(box, dataclasses.replace(box, party=2)))
    _refused(srv, short, PayloadError, "one sealed share to each")


# ----------------------------------------------------------------------------------------- restarts
def _reference_secure_run():
    fed = _fed(rounds=4)
    parties = fed.parties()
    run_parties(FaultyTransport(), parties, clock=ManualClock())
    return parties[fed.sid]


def test_everyone_restarting_mid_round_restarts_the_round(tmp_path):
    ref = _reference_secure_run()
    fed = _fed(rounds=4)
    store = CheckpointStore(tmp_path)
    parties = fed.parties()
    driver = Driver(FaultyTransport(), parties, clock=ManualClock(), checkpoints=store)
    driver.start()
    srv = parties[fed.sid]
    driver.run(
        until=lambda: srv._secure is not None and srv._secure.round == 2 and srv._secure.stage == "unmask"
    )
    assert 2 in store.labels(fed.sid)  # ... and everything in memory is lost mid-round
    members, initial = fed.members()
    restored = {c: fed.client(c, members[c]) for c in fed.roster.clients}
    for c, party in restored.items():
        party.restore(store.load(c, 2))
        assert party._secure is None  # a round's secrets are never checkpointed
    restored[fed.sid] = fed.server(initial)
    restored[fed.sid].restore(store.load(fed.sid, 2))
    run_parties(FaultyTransport(), restored, clock=ManualClock(), checkpoints=store)
    got = restored[fed.sid]
    assert same_state(got.global_state, ref.global_state) and same_history(got.history, ref.history)


def test_a_client_restarted_alone_mid_round_drops_out_of_that_round(tmp_path):
    fed = _fed(rounds=3, timeouts=TIMEOUTS)
    store = CheckpointStore(tmp_path)
    parties = fed.parties()
    driver = Driver(FaultyTransport(), parties, clock=ManualClock(), strict=False, checkpoints=store)
    driver.start()
    srv = parties[fed.sid]
    driver.run(
        until=lambda: srv._secure is not None and srv._secure.round == 2 and srv._secure.stage == "masked"
    )
    driver.crash(1)  # after dealing its shares in round 2
    members, _ = fed.members()
    fresh = fed.client(1, members[1])
    fresh.restore(store.load(1))
    driver.replace(1, fresh)
    driver.run()
    assert srv.done and srv.failure is None
    assert srv.history[1]["missing_fit"] == [1] and srv.history[1]["clients"] == [0, 2, 3]
    assert "missing_fit" not in srv.history[2]  # back in round 3
    assert all(isinstance(e, StateError | ReplayError) for _, e in driver.rejected)


def test_default_training_parties_aggregate_securely(tiny_graph, tiny_partition):
    from fedgat.app import build_training_parties
    from fedgat.pipeline import run_plaintext_pretraining

    plain = run_plaintext_pretraining(tiny_graph, tiny_partition, seed=1)
    parties = build_training_parties(tiny_graph, tiny_partition, plain, seed=1, rounds=1)
    assert parties.server.secagg == SECURE and all(c.secagg == SECURE for c in parties.clients.values())
    off = build_training_parties(tiny_graph, tiny_partition, plain, seed=1, rounds=1, secagg=None)
    assert off.server.secagg is None and all(c.secagg is None for c in off.clients.values())
    with pytest.warns(UserWarning, match="plaintext"):
        two = build_training_parties(tiny_graph, tiny_partition, plain, seed=1, rounds=1, fraction=0.5)
    assert two.server.secagg is None


@pytest.mark.parametrize("num_clients", [4, 13])
def test_a_wrong_share_cannot_corrupt_the_sum(num_clients):
    """Client 1 reveals a garbage b share: the server sets aside the shares whose dealer's signature
    does not verify, rebuilds every seed from the others (each checked against the advert's
    commitment) and the aggregate is still the weighted mean. Also at 13 clients (t = 9), where trying
    subsets of t shares instead gave up after 256 of the C(12, 8) = 495 (a ninth review pass)."""
    fed = _fed(num_clients=num_clients, rounds=1)
    parties = fed.parties()
    updates = _record_updates(parties, fed)
    transport = FaultyTransport()

    def corrupt(sender, to, data):
        if sender != 1 or peek_type(data) != SecAggUnmaskShares.TYPE:
            return None
        msg = decode_message(data)
        bad = (RevealedShare(msg.b_shares[0].party, b"\x13" * 16), *msg.b_shares[1:])
        transport.rules.remove(corrupt)
        transport._send(sender, to, _resign(fed, msg, b_shares=bad))
        return "drop"

    transport.rules.append(corrupt)
    run_parties(transport, parties, clock=ManualClock())
    srv = parties[fed.sid]
    assert srv.done and srv.history[0]["clients"] == list(range(num_clients))
    last = [updates[1, c] for c in fed.roster.clients]
    want = fedavg([u.state for u in last], [u.num_train for u in last])
    for k, v in want.items():
        assert torch.allclose(srv.global_state[k], v, rtol=1e-6, atol=1e-7)


def test_a_dealer_that_signs_one_wrong_share_does_not_stop_the_round(monkeypatch):
    """A (malicious) dealer deals one holder a wrong b share and signs it like the others: its
    signature verifies, so the first ``t`` shares rebuild a seed that fails the dealer's commitment.
    The server then leaves one share out at a time among ``t + 1`` and finds the committed seed, so
    the round completes with the right mean. Before (a twelfth review pass) it gave up the round
    (QuorumError naming the dealer), which the dealer's dropping out would not have done."""
    from fedgat.protocols import secagg_client

    real, calls = secagg_client.split_secret, []

    def one_wrong(secret, t, n):
        shares = real(secret, t, n)
        calls.append(len(calls))
        if len(calls) == 2:  # the first dealer's b seed: its share for the holder at position 1
            shares[0] = bytes(b ^ 0x5A for b in shares[0])
        return shares

    monkeypatch.setattr(secagg_client, "split_secret", one_wrong)
    fed = _fed(num_clients=4, rounds=1)
    parties = fed.parties()
    updates = _record_updates(parties, fed)
    run_parties(FaultyTransport(), parties, clock=ManualClock())
    srv = parties[fed.sid]
    assert len(calls) >= 2 and srv.done and srv.history[0]["clients"] == list(range(4))
    last = [updates[1, c] for c in fed.roster.clients]
    want = fedavg([u.state for u in last], [u.num_train for u in last])
    for k, v in want.items():
        assert torch.allclose(srv.global_state[k], v, rtol=1e-6, atol=1e-7)


def test_the_server_takes_only_confirmations_of_its_survivor_set():
    """Frame version 11: a survivor's SecAggConfirm must sign the set the server sent, under the
    cohort it relayed; a confirmation of another set (or another party's) is refused unrecorded."""
    h = Held(SecAggSurvivors, 4)
    srv, fed = h.server, h.fed
    replies = {c: h.parties[c].receive(h.frame(c))[0] for c in range(4)}
    assert all(isinstance(m, SecAggConfirm) for m in replies.values())
    view = h.parties[0]._secure.view
    other = fed.dep.identities[0].signer.sign(confirm_bytes(9, 1, 0, view, (0, 1, 2)))
    _refused(
        srv,
        _craft(fed, SecAggConfirm, 0, fed.sid, round=1, confirmation=other),
        SignatureError,
        "did not sign",
    )
    stolen = _craft(fed, SecAggConfirm, 0, fed.sid, round=1, confirmation=replies[1].confirmation)
    _refused(srv, stolen, SignatureError, "did not sign")  # 1's confirmation as 0's
    for c in range(4):
        srv.receive(encode_message(replies[c], fed.dep.identities[c].signer))
    assert sorted(srv._secure.confirms) == [0, 1, 2, 3]


@pytest.mark.parametrize(("clients", "min_cohort"), [(4, 5), (6, 4096)])
def test_a_member_whose_min_cohort_exceeds_the_cohort_is_left_out_not_fatal(clients, min_cohort):
    """A node asking for more members than the round has refuses the cohort; the server leaves it out
    (``secagg_server.fitting``) and the others run under their own settings. Before (an eleventh
    review pass), its advertised ``min_cohort`` raised everyone's threshold to the cohort size and
    every round it was sampled into failed."""
    fed = _fed(num_clients=clients, rounds=2, timeouts=TIMEOUTS)
    parties = fed.parties()
    parties[0].secagg = SecAggConfig(min_cohort=min_cohort)
    run_parties(FaultyTransport(), parties, clock=ManualClock(), strict=False)
    srv = parties[fed.sid]
    assert srv.done and srv.failure is None
    assert all(row["clients"] == list(range(1, clients)) for row in srv.history)


def test_a_cohort_of_mixed_settings_unmasks_under_the_strictest():
    """Client 0 asks for ``threshold_ratio`` 1 (t = n): every member and the server use it, so the
    honest round completes, and a drop-out after the masked inputs now stops it (t = 6 of 6)."""
    fed = _fed(num_clients=6, rounds=1, timeouts=TIMEOUTS)
    parties = fed.parties()
    parties[0].secagg = SecAggConfig(threshold_ratio=1.0)
    run_parties(FaultyTransport(), parties, clock=ManualClock())
    assert parties[fed.sid].done and parties[fed.sid].history[0]["clients"] == list(range(6))

    fed = _fed(num_clients=6, rounds=1, timeouts=TIMEOUTS)
    parties = fed.parties()
    parties[0].secagg = SecAggConfig(threshold_ratio=1.0)
    transport = FaultyTransport()
    transport.rules.append(lambda s, t, d: "drop" if s == 5 and peek_type(d) == SecAggMasked.TYPE else None)
    with pytest.raises(QuorumError) as info:
        run_parties(transport, parties, clock=ManualClock())
    assert info.value.phase == "fit:masked" and info.value.required == 6
