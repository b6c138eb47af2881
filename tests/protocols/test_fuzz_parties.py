"""Hypothesis fuzz *through a party*: mutated frames and validly signed messages with random field
values either are accepted or raise a ProtocolError subclass with the party's snapshot unchanged;
nothing else ever escapes (no crash, no partial state change)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from fault_helpers import FaultyTransport, Federation
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedgat.partition import make_partition
from fedgat.protocols import (
    ClientState,
    EdgeClaims,
    EvaluationReport,
    GraphAnnounce,
    LocalUpdate,
    ProtocolError,
    SealedCheckKeys,
    SplitCounts,
    Transcript,
    encode_message,
)
from fedgat.protocols.messages import claim_bytes, claim_keys_digest, peek_type, sealed_keys_bytes
from fedgat.synthetic import synthetic_graph

from protocol_helpers import Harness

FED = Federation(rounds=3, fraction=1.0)
PARTIES = FED.parties()
SERVER = PARTIES[FED.sid]
FIRST = SERVER.start()  # round 1 is under way: the server awaits every client's update
SHAPES = {k: tuple(v.shape) for k, v in SERVER.global_state.items()}
SEQ = itertools.count(1000)
EXAMPLES = {"mutated": 300, "signed": 300}


def _signed(msg_cls, sender: int, **fields) -> bytes:
    msg = msg_cls(sender=sender, recipient=FED.sid, session=9, seq=next(SEQ), **fields)
    return encode_message(msg, FED.dep.identities[sender].signer)


def _valid_update(sender: int) -> bytes:
    arrays = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    return _signed(LocalUpdate, sender, round=1, num_train=3, loss=0.5, arrays=arrays)


FRAMES = [_valid_update(c) for c in FED.roster.clients] + [
    _signed(EvaluationReport, 0, round=1, splits=(SplitCounts("val", 1, 2, 0.5),))
]


def _feed(party, data: bytes) -> None:
    before = party.snapshot()
    try:
        party.receive(data)
    except ProtocolError:
        assert party.snapshot() == before


@settings(max_examples=EXAMPLES["mutated"], deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_mutated_frames_into_the_server(data):
    raw = bytearray(data.draw(st.sampled_from(FRAMES)))
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if kind == "flip":
            raw[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "cut":
            del raw[max(pos, 1) :]
        else:
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    _feed(SERVER, bytes(raw))


def _arrays():
    names = st.lists(st.sampled_from([*SHAPES, "bogus"]), unique=True, max_size=len(SHAPES) + 1)
    return names.flatmap(
        lambda ns: st.fixed_dictionaries(
            {
                n: st.sampled_from([SHAPES.get(n, (2,)), (1,), (3, 1)]).map(lambda s: np.zeros(s, np.float32))
                for n in ns
            }
        )
    )


@settings(max_examples=EXAMPLES["signed"], deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sender=st.sampled_from([0, 1, 2, FED.sid]),
    round_=st.integers(0, 4),
    num_train=st.integers(0, 2**32 - 1),
    loss=st.floats(allow_nan=True, allow_infinity=True),
    arrays=_arrays(),
    report=st.booleans(),
    count=st.integers(0, 2**32 - 1),
)
def test_fuzz_signed_messages_with_random_fields(sender, round_, num_train, loss, arrays, report, count):
    if report:
        splits = (SplitCounts("val", min(count, 5), count, 0.5),)
        msg = EvaluationReport(
            sender=sender, recipient=FED.sid, session=9, seq=next(SEQ), round=round_, splits=splits
        )
    else:
        msg = LocalUpdate(
            sender=sender,
            recipient=FED.sid,
            session=9,
            seq=next(SEQ),
            round=round_,
            num_train=num_train,
            loss=loss,
            arrays=arrays if num_train else {},
        )
    try:
        data = encode_message(msg, FED.dep.identities[sender].signer)
    except ProtocolError:
        return  # the sender's own encoder refuses it (same checks as the receiver)
    _feed(SERVER, data)


# ------------------------------------------------------------------------------ pre-training
# A round whose frames to client 1 are held, then delivered but for the check keys: client 1 awaits
# them; a second server is collecting the clients' opening messages; both get fuzzed frames.
PRE_EXAMPLES = {"mutated": 150, "claims": 100, "graphs": 100, "sealed": 60}


@pytest.fixture(scope="module")
def pretrain_round():
    g = synthetic_graph(num_nodes=30, num_features=8, train_per_class=2, num_val=5, num_test=5, seed=2)
    part = make_partition(g, 3, beta=1.0, seed=0, num_layers=2)
    transport = FaultyTransport(Transcript())
    transport.rules.append(lambda s, r, d: "hold" if r == 1 and s == 3 else None)
    h = Harness(g, part, transport=transport).start()
    h.run()
    held = [d for _, _, d in transport.held]
    for d in held:  # client 1 completes its key set-up but for the check keys: it awaits them
        if peek_type(d) != SealedCheckKeys.TYPE:
            h.client(1).receive(d)
    assert h.client(1).state is ClientState.AWAIT_CHECK_KEYS
    opening = [e.data for e in transport.transcript if e.recipient == 3]
    fresh = Harness(g, part)  # a server still collecting, for the clients' opening frames
    fresh.driver.start()
    return h, held, fresh, opening


def _mutate(data, raw: bytearray) -> bytes:
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if kind == "flip":
            raw[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "cut":
            del raw[max(pos, 1) :]
        else:
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    return bytes(raw)


@settings(max_examples=PRE_EXAMPLES["mutated"], deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_mutated_pretraining_frames_into_a_client_and_the_server(pretrain_round, data):
    h, held, fresh, opening = pretrain_round
    if data.draw(st.booleans()):
        _feed(h.client(1), _mutate(data, bytearray(data.draw(st.sampled_from(held)))))
    else:
        _feed(fresh.server, _mutate(data, bytearray(data.draw(st.sampled_from(opening)))))


def _edges(draw_ints):
    return st.lists(st.tuples(draw_ints, draw_ints), min_size=1, max_size=6)


@settings(max_examples=PRE_EXAMPLES["claims"], deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    claimer=st.sampled_from([0, 1, 2, 3]),
    peer=st.integers(0, 5),
    edges=_edges(st.integers(0, 40)),
    flags=st.lists(st.integers(0, 1), min_size=6, max_size=6),
    signed=st.booleans(),
)
def test_fuzz_signed_claims_with_random_edges(pretrain_round, claimer, peer, edges, flags, signed):
    """Random claims, signed by their claimer (or not), sent by client 1 to a collecting server."""
    _, _, fresh, _ = pretrain_round
    e = np.array(sorted(set(edges)), dtype=np.int64).reshape(-1, 2)
    uses = np.array(flags[: len(e)], dtype=np.int64)
    session = fresh.parties.config.session
    key = fresh.parties.deployment.identities[claimer].signer
    client = fresh.client(claimer) if claimer in fresh.parties.clients else None
    keys = (
        claim_keys_digest(client._session_keys.public_bytes(), client.holder.fingerprint())
        if client is not None and client.holder is not None and client._session_keys is not None
        else bytes(32)
    )
    peers = np.array(sorted({peer, *(p for p in (0, 1, 2) if p != claimer)}), dtype=np.int64)
    sig = key.sign(claim_bytes(session, claimer, peer, e, uses, keys, peers)) if signed else bytes(64)
    try:
        frame = fresh.craft(
            1, EdgeClaims, 3, claimer=claimer, peer=peer, edges=e, uses=uses, peers=peers, claim_signature=sig
        )
    except ProtocolError:
        return
    _feed(fresh.server, frame)


@settings(max_examples=PRE_EXAMPLES["graphs"], deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sender=st.sampled_from([0, 1, 2]),
    dim=st.integers(0, 20),
    owned=st.lists(st.integers(0, 40), min_size=0, max_size=5),
    extra=st.lists(st.integers(0, 40), max_size=6),
    sizes=st.lists(st.integers(0, 3), min_size=0, max_size=5),
)
def test_fuzz_signed_graphs_with_random_fields(pretrain_round, sender, dim, owned, extra, sizes):
    _, _, fresh, _ = pretrain_round
    own = np.array(owned, dtype=np.int64)
    sz = np.array((sizes + [1] * len(own))[: len(own)], dtype=np.int64)
    indptr = np.concatenate([[0], np.cumsum(sz)]).astype(np.int64)
    pool = iter(extra * 4 + list(range(100)))
    indices = np.array(
        [
            v
            for k, n in enumerate(own)
            for v in ([int(n)] + [next(pool) for _ in range(max(sz[k] - 1, 0))])[: sz[k]]
        ],
        dtype=np.int64,
    )
    try:
        frame = fresh.craft(sender, GraphAnnounce, 3, dim=dim, owned=own, indptr=indptr, indices=indices)
    except ProtocolError:
        return
    _feed(fresh.server, frame)


@settings(max_examples=PRE_EXAMPLES["sealed"], deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    recipient=st.integers(0, 4),
    owners=st.lists(st.integers(0, 4), min_size=0, max_size=4, unique=True),
    blob=st.binary(min_size=0, max_size=200),
    signed=st.booleans(),
)
def test_fuzz_relayed_check_keys_with_random_fields(pretrain_round, recipient, owners, blob, signed):
    """Random sealed check keys relayed by the server to client 1 (signed by the named recipient, or
    not): refused with a typed error, the client unchanged."""
    h, _, _, _ = pretrain_round
    o = np.array(owners, dtype=np.int64)
    sealed = tuple(blob for _ in owners)
    session = h.parties.config.session
    signer = h.parties.deployment.identities[min(recipient, 3)].signer
    keyset = h.server.verifier.fingerprint or bytes(32)
    sig = signer.sign(sealed_keys_bytes(session, recipient, sealed, o, keyset)) if signed else bytes(64)
    try:
        frame = h.craft(
            3,
            SealedCheckKeys,
            1,
            fingerprint=h.server.verifier.fingerprint,
            recipient_party=recipient,
            owners=o,
            sealed=sealed,
            keys_signature=sig,
        )
    except ProtocolError:
        return
    _feed(h.client(1), frame)
