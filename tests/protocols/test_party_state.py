"""Parties mid-run as values (:mod:`fedgat.protocols.party_state`): after every event of a run each
client is saved as bytes, rebuilt from them (snapshot equal) and the rebuilt one goes on in its place;
the run ends as an uninterrupted one does. Tampered, foreign or unknown state is refused, and no
pickle is used."""

from __future__ import annotations

import ast
import inspect
import pickle
import sys

import numpy as np
import pytest
import torch

from fedgat.app import build_pretrain_parties, build_training_parties
from fedgat.dp import FeatureDP
from fedgat.dp_ledger import Budget, DPLedger
from fedgat.dp_release import draw_release
from fedgat.pipeline import max_abs_error, run_plaintext_pretraining
from fedgat.protocols import (
    ClientPretrain,
    Driver,
    InProcessTransport,
    MissingPartyError,
    StateError,
    party_state,
    pretrain_values,
    training_values,
)
from fedgat.protocols.driver import ManualClock
from fedgat.protocols.party_state import (
    STATE_KIND,
    ForeignStateError,
    PartyState,
    SavedStateError,
    StateAuthenticationError,
    seal,
    state_key,
)
from fedgat.protocols.pretrain_config import PretrainTimeouts
from fedgat.protocols.roster import Identity

TRAIN = {"rounds": 3, "patience": None}


def _no_pickle(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pickle was used for a party's state")

    for name in ("dumps", "loads", "dump", "load", "Pickler", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    for module in ("cloudpickle", "ray.cloudpickle"):
        if module in sys.modules:
            for name in ("dumps", "loads"):
                if hasattr(sys.modules[module], name):
                    monkeypatch.setattr(sys.modules[module], name, refuse)


def through_bytes(party):
    """``party`` saved as bytes under its own key and rebuilt with its identity."""
    identity = party._identity()
    key = state_key(identity, f"test/{party.party_id}")
    blob = party.state_value().to_bytes(key)
    return PartyState.from_bytes(blob, key).build(identity)


def run_swapping(parties: dict, clients, counter: list[int] | None = None) -> Driver:
    """Run ``parties`` to the end; before every event every client is replaced by its rebuilt twin
    (after checking that the twin's snapshot is the original's, and that the twin saves the very
    same state: every saved value restored, nothing lost)."""
    transport = InProcessTransport()
    driver = Driver(transport, parties, clock=ManualClock())

    def swap() -> None:
        for pid in clients:
            party = driver.parties[pid]
            twin = through_bytes(party)
            assert type(twin) is type(party)
            assert twin.snapshot() == party.snapshot(), f"party {pid} in state {party.state}"
            key = b"s" * 32
            same = twin.state_value().to_bytes(key) == party.state_value().to_bytes(key)
            assert same, f"party {pid} in state {party.state}: its twin saves another state"
            driver.parties[pid] = twin
            if counter is not None:
                counter[0] += 1

    driver.start()
    swap()
    while driver.advance():
        swap()
    for failure in driver.failures():
        raise failure
    driver.messages = sum(m for m, _ in transport.traffic.values())  # type: ignore[attr-defined]
    return driver


def uninterrupted(parties: dict) -> Driver:
    transport = InProcessTransport()
    driver = Driver(transport, parties, clock=ManualClock())
    driver.start()
    driver.run()
    driver.messages = sum(m for m, _ in transport.traffic.values())  # type: ignore[attr-defined]
    return driver


# ------------------------------------------------------------------------------------ pre-training
@pytest.mark.parametrize(
    ("dp", "window"),
    [(None, None), (FeatureDP(epsilon=4.0, mechanism="gaussian", dim=8), None), (None, 1)],
    ids=["plain", "dp", "upload-window"],
)
def test_pretraining_survives_a_restore_after_every_event(
    tiny_graph, tiny_partition, monkeypatch, dp, window
):
    ledgers = {c: DPLedger(Budget(1e3, 1e-5)) for c in range(tiny_partition.num_clients)}
    drawn = None if dp is None else draw_release(tiny_graph, tiny_partition, dp, ledgers=ledgers)
    kw = {"seed": 5, "workers": 0, "dp": dp, "dp_release": drawn, "upload_batch": 4, "upload_window": window}
    ref = build_pretrain_parties(tiny_graph, tiny_partition, **kw)
    want = uninterrupted(ref.all())
    parties = build_pretrain_parties(tiny_graph, tiny_partition, **kw)
    _no_pickle(monkeypatch)
    swaps = [0]
    got = run_swapping(parties.all(), list(parties.clients), swaps)
    assert swaps[0] > 10 * len(parties.clients)
    assert got.messages == want.messages
    encodings = {c: got.parties[c].encodings for c in parties.clients}
    expected = {c: ref.clients[c].encodings for c in ref.clients}
    assert all(got.parties[c].done for c in parties.clients)
    assert max_abs_error(encodings, expected) <= 1e-5
    for c, enc in encodings.items():
        for a, b in zip(enc.buckets, expected[c].buckets, strict=True):
            assert np.array_equal(a.bases.p, b.bases.p) and np.array_equal(a.bases.nodes, b.bases.nodes)
        assert got.parties[c].nodes_decrypted == ref.clients[c].nodes_decrypted


def test_states_at_each_phase(tiny_graph, tiny_partition):
    """The client's progress is what the module docstrings say, at the points Flower saves it."""
    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=5, workers=0, upload_batch=2)
    driver = Driver(InProcessTransport(), parties.all(), clock=ManualClock())
    driver.start()
    seen: dict[str, dict] = {}
    while driver.advance():
        for pid in parties.clients:
            party = driver.parties[pid]
            progress = party.state_value().progress
            seen.setdefault(progress["state"], progress)
            if party.state.value == "uploading" and party._uploaded and party._queue:
                seen.setdefault("half-uploaded", progress)
            if party.state.value == "await-encodings" and party._assemblies:
                seen.setdefault("partial-buckets", progress)
    clients = parties.clients
    assert {c.PARTY_KIND for c in clients.values()} == {"pretrain.client"}
    others = len(clients) - 1
    # from start() on: the client's own CKKS secret context and HPKE private keys
    keyed = seen["await-roster"]
    assert isinstance(keyed["holder"]["secret"], bytes) and len(keyed["session_keys"]) == 96
    assert keyed["participants"] == [] and keyed["releases"] == [] and keyed["my_keys"] == []
    # after RosterReady: the relayed keys (as frames), contexts and claims, its releases and check keys
    upload = seen["uploading"]
    assert len(upload["peers"]) == len(upload["contexts"]) == others
    assert all(isinstance(f, bytes) for f in upload["peers"] + upload["claims"])
    assert upload["participants"] == sorted(clients)
    assert len(upload["my_keys"]) == others and all(len(k) == 64 for _, k in upload["my_keys"])
    assert {p for p, _ in upload["owner_keys"]} >= {r for r, _ in upload["releases"]}
    assert any(len(nodes) for c in clients.values() for nodes in c.releases.values())
    assert "half-uploaded" in seen and seen["half-uploaded"]["queue"] and seen["half-uploaded"]["uploaded"]
    bucket = seen["partial-buckets"]["assemblies"][0]
    assert bucket["buffer"]["data"].ndim == 3 and bucket["owners"].shape == bucket["neighbours"].shape
    assert seen["done"]["encodings"] is not None
    # no long-term private key travels in a state (the identity is given to build())
    client = driver.parties[1]
    blob = client.state_value().to_bytes(b"k" * 32)
    assert client._signer.private_bytes() not in blob
    assert "identity" not in client.state_value().fields


def test_timed_out_client_keeps_its_failure(tiny_graph, tiny_partition):
    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=5, workers=0)
    client = parties.clients[1]
    client.timeouts = PretrainTimeouts(keys=30.0, download=60.0)
    client.tick(0.0)
    client.start()
    assert through_bytes(client).next_deadline() == 30.0
    out = client.tick(1e9)  # the keys deadline passed
    assert client.aborted and isinstance(client.failure, MissingPartyError) and out
    twin = through_bytes(client)
    assert twin.snapshot() == client.snapshot()
    assert isinstance(twin.failure, MissingPartyError)
    assert (twin.failure.phase, twin.failure.missing) == (client.failure.phase, client.failure.missing)
    with pytest.raises(MissingPartyError):
        twin.raise_for_failure()


# ----------------------------------------------------------------------------------------- rounds
@pytest.mark.parametrize("variant", ["vector", "matrix"])
def test_rounds_survive_a_restore_after_every_event(tiny_graph, tiny_partition, monkeypatch, variant):
    """Bit for bit: each client's dropout stream travels in its state (torch's global stream, seeded
    alike for both runs, plays no part in the masks)."""
    plain = run_plaintext_pretraining(tiny_graph, tiny_partition, variant=variant, seed=1)
    torch.manual_seed(3)
    ref = build_training_parties(tiny_graph, tiny_partition, plain, seed=1, session=9, **TRAIN)
    want = uninterrupted(ref.all())
    torch.manual_seed(3)
    parties = build_training_parties(tiny_graph, tiny_partition, plain, seed=1, session=9, **TRAIN)
    _no_pickle(monkeypatch)
    got = run_swapping(parties.all(), list(parties.clients))
    assert got.messages == want.messages
    srv, ref_srv = parties.server, ref.server
    assert srv.done and srv.result.rounds == ref_srv.result.rounds == TRAIN["rounds"]
    for name, value in ref_srv.global_state.items():
        assert torch.equal(srv.global_state[name], value), name
    assert srv.result.test_accuracy == ref_srv.result.test_accuracy
    for c in parties.clients:
        assert got.parties[c].last_round == ref.clients[c].last_round


def test_rounds_client_with_its_own_stream_mid_run(tiny_graph, tiny_partition):
    from fedgat.protocols import ClientRounds

    plain = run_plaintext_pretraining(tiny_graph, tiny_partition, seed=1)
    parties = build_training_parties(tiny_graph, tiny_partition, plain, seed=1, rounds=2)
    c = parties.clients[0]
    seeded = ClientRounds(
        0, c.roster, c.session, Identity(c._signer), client=c.client, fingerprint=None, seed=11
    )
    seeded._rng = torch.Generator().manual_seed(12).get_state()  # as after some local training
    twin = through_bytes(seeded)
    assert torch.equal(twin._rng, seeded._rng) and twin.snapshot() == seeded.snapshot()


# ------------------------------------------------------------------------------------- refusals
@pytest.fixture
def started(tiny_graph, tiny_partition):
    parties = build_pretrain_parties(tiny_graph, tiny_partition, seed=5, workers=0)
    driver = Driver(InProcessTransport(), parties.all(), clock=ManualClock())
    driver.start()
    driver.run(max_events=12)
    return parties


def test_tampered_or_foreign_state_is_refused(started):
    client, other = started.clients[1], started.clients[2]
    identity = client._identity()
    key = state_key(identity, "test")
    blob = client.state_value().to_bytes(key)
    for i in (10, len(blob) // 2, len(blob) - 40, len(blob) - 1):
        bad = bytearray(blob)
        bad[i] ^= 1
        with pytest.raises(StateAuthenticationError, match="tampered"):
            PartyState.from_bytes(bytes(bad), key)
    with pytest.raises(StateAuthenticationError):  # truncated
        PartyState.from_bytes(blob[:-1], key)
    # another party's state: its key is not this one's
    foreign = other.state_value().to_bytes(state_key(other._identity(), "test"))
    with pytest.raises(StateAuthenticationError, match="another party"):
        PartyState.from_bytes(foreign, key)
    # a key under another label (another run or purpose) does not verify either
    with pytest.raises(StateAuthenticationError):
        PartyState.from_bytes(blob, state_key(identity, "test-other"))
    # an authentic blob of another kind
    with pytest.raises(ForeignStateError, match="kind"):
        PartyState.from_bytes(seal("fedgat.something-else", {"x": 1}, key), key)
    # rebuilt with another party's identity
    state = PartyState.from_bytes(blob, key)
    with pytest.raises(ForeignStateError, match="not this identity"):
        state.build(other._identity())
    with pytest.raises(SavedStateError):
        PartyState.from_bytes(b"not a state at all, just bytes that are long enough to parse", key)
    with pytest.raises(ValueError, match="key of at least"):
        client.state_value().to_bytes(b"short")
    assert STATE_KIND in blob.decode("latin-1")


def test_unsupported_kinds_raise(started):
    with pytest.raises(TypeError, match="cannot be described"):
        started.server.state_value()

    class Tweaked(ClientPretrain):
        pass

    client = started.clients[1]
    tweaked = Tweaked.__new__(Tweaked)
    tweaked.__dict__.update(client.__dict__)
    with pytest.raises(TypeError, match="Tweaked cannot be described"):
        tweaked.state_value()
    state = client.state_value()
    forged = PartyState("fedgat.pipeline:os.system", 1, state.fields, state.progress)
    with pytest.raises(TypeError, match="no mid-run state"):
        forged.build(client._identity())
    client._clock_stack.append([0.0, 0.0])  # as inside receive()
    try:
        with pytest.raises(StateError, match="inside a message"):
            client.state_value()
    finally:
        client._clock_stack.pop()
    assert "secret" not in repr(state) and "PartyState(kind='pretrain.client'" in repr(state)


def test_state_key_is_the_partys_own():
    a, b = Identity.generate(), Identity.generate()
    assert state_key(a, "x") == state_key(a, "x") and len(state_key(a, "x")) == 32
    assert state_key(a, "x") != state_key(a, "y") != state_key(b, "x")
    # derived, never the private key itself; an older identity value (with an X25519 key) reads
    assert state_key(a, "x") != a.signer.private_bytes()
    old = Identity.from_value({**a.to_value(), "wrapping": bytes(32)})
    assert state_key(old, "x") == state_key(a, "x")


def test_state_modules_import_no_pickle():
    for module in (party_state, pretrain_values, training_values):
        tree = ast.parse(inspect.getsource(module))
        names = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        }
        names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert not {n for n in names if "pickle" in n}, module.__name__
