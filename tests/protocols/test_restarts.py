"""Restarts: N FedAvg rounds straight equal k rounds, a crash, a restore from checkpoints in fresh
objects and the rest -- weights, best weights and history bit for bit -- whether everyone, only the
server or only a client restarts. Pre-training clients checkpoint their decrypted encodings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fault_helpers import FaultyTransport, Federation, same_history, same_state, small_clients

from fedgat.checkpoint import CheckpointIntegrityError, CheckpointMismatchError, CheckpointStore
from fedgat.federated import FedAdam
from fedgat.protocols import Driver, ReplayError, StateError, run_parties
from fedgat.protocols.driver import ManualClock
from fedgat.protocols.pretrain import encodings_from_checkpoint

CRASH_AT = 3  # the server has just sent round 3's GlobalModel


@pytest.fixture(scope="module")
def reference():
    """The uninterrupted run (6 rounds, 2 of 3 clients sampled per round, private client streams)."""
    fed = Federation()
    parties = fed.parties()
    run_parties(FaultyTransport(), parties, clock=ManualClock())
    srv = parties[fed.sid]
    assert srv.done and srv.result.rounds == 6
    return fed, srv


def _assert_same_run(srv, ref) -> None:
    assert srv.done and srv.result is not None
    assert same_state(srv.global_state, ref.global_state)
    assert same_state(srv.best_state, ref.best_state)
    assert same_history(srv.history, ref.history)
    assert srv.result.test_accuracy == ref.result.test_accuracy


def _run_until_checkpoint(fed: Federation, store: CheckpointStore, label: int):
    parties = fed.parties()
    driver = Driver(FaultyTransport(), parties, clock=ManualClock(), strict=False, checkpoints=store)
    driver.start()
    driver.run(until=lambda: label in store.labels(fed.sid))
    assert not parties[fed.sid].done
    return driver, parties


def _restored(fed: Federation, store: CheckpointStore, label: int) -> dict:
    """Fresh objects (new models and optimisers) restored from the checkpoints at ``label``."""
    members, initial = fed.members()
    parties = {}
    for c in fed.roster.clients:
        parties[c] = fed.client(c, members[c])
        parties[c].restore(store.load(c, label))
    parties[fed.sid] = fed.server(initial)
    parties[fed.sid].restore(store.load(fed.sid, label))
    return parties


def test_everyone_restarts_from_the_same_label(reference, tmp_path):
    fed, ref = reference
    store = CheckpointStore(tmp_path, hmac_key=b"deployment key")
    _run_until_checkpoint(fed, store, CRASH_AT)  # ... and everything in memory is lost
    assert all(CRASH_AT in store.labels(c) for c in fed.roster.clients)
    parties = _restored(fed, store, CRASH_AT)
    run_parties(FaultyTransport(), parties, clock=ManualClock(), checkpoints=store)
    _assert_same_run(parties[fed.sid], ref)


def test_the_server_restarts_alone(reference, tmp_path):
    fed, ref = reference
    store = CheckpointStore(tmp_path)
    driver, _ = _run_until_checkpoint(fed, store, CRASH_AT)
    driver.crash(fed.sid)  # the clients keep running; frames already sent stay in flight
    _, initial = small_clients()
    server = fed.server(initial)
    server.restore(store.load(fed.sid))
    driver.replace(fed.sid, server)  # re-sends round 3's model with fresh sequence numbers
    driver.run()
    _assert_same_run(server, ref)
    # the clients had already served round 3 from the first copy: the re-sent models are replays
    assert driver.rejected and all(
        isinstance(e, ReplayError) and pid != fed.sid for pid, e in driver.rejected
    )


def test_a_client_restarts_alone(reference, tmp_path):
    fed, ref = reference
    store = CheckpointStore(tmp_path)
    parties = fed.parties()
    driver = Driver(FaultyTransport(), parties, clock=ManualClock(), checkpoints=store)
    driver.start()
    driver.run(until=lambda: CRASH_AT + 1 in store.labels(1))  # client 1 has handled round 3's model
    driver.crash(1)
    members, _ = small_clients()
    fresh = fed.client(1, members[1])
    fresh.restore(store.load(1))
    assert fresh.last_round == CRASH_AT and not same_state(
        fresh.client.model.state_dict(), small_clients()[0][1].model.state_dict()
    )
    driver.replace(1, fresh)
    driver.run()
    _assert_same_run(parties[fed.sid], ref)
    assert not driver.rejected


def _fedadam():
    return FedAdam(0.05, 5e-4, client_lr=0.5)


def test_the_server_restarts_alone_with_fedadam_moments(tmp_path):
    """FedAdam's Adam moments live on the server: a restarted server that restores them continues the
    run bit for bit; one that lost them (a FedAvg checkpoint, or none) would not, and a FedAdam
    checkpoint does not load into a FedAvg server."""
    fed = Federation(strategy_fn=_fedadam)
    parties = fed.parties()
    run_parties(FaultyTransport(), parties, clock=ManualClock())
    ref = parties[fed.sid]
    assert ref.done and ref.result.rounds == 6

    store = CheckpointStore(tmp_path)
    driver, _ = _run_until_checkpoint(fed, store, CRASH_AT)
    driver.crash(fed.sid)
    _, initial = fed.members()
    server = fed.server(initial)
    server.restore(store.load(fed.sid))
    assert server.strategy._optimizer is not None  # the moments came back
    driver.replace(fed.sid, server)
    driver.run()
    _assert_same_run(server, ref)

    plain = Federation().server(initial)
    with pytest.raises(CheckpointMismatchError):
        plain.restore(store.load(fed.sid))


def test_restore_refuses_foreign_or_damaged_checkpoints(reference, tmp_path):
    fed, _ = reference
    store = CheckpointStore(tmp_path)
    _run_until_checkpoint(fed, store, CRASH_AT)
    members, initial = small_clients()
    server = fed.server(initial)
    a, b = [c for c in fed.roster.clients if store.labels(c)][:2]
    with pytest.raises(CheckpointMismatchError):
        server.restore(store.load(a))  # a client's checkpoint
    with pytest.raises(CheckpointMismatchError):
        fed.client(b, members[b]).restore(store.load(a))  # another client's
    other = Federation(rounds=7)  # another configuration, same ids
    with pytest.raises(CheckpointMismatchError):
        other.server(initial).restore(store.load(fed.sid))
    path = store.path(fed.sid, CRASH_AT)
    data = bytearray(path.read_bytes())
    data[-40] ^= 0x01  # one bit of the weights
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointIntegrityError):
        server.restore(store.load(fed.sid, CRASH_AT))
    assert server.snapshot() == fed.server(initial).snapshot()  # nothing was loaded
    server.start()
    with pytest.raises(StateError):
        server.restore(store.load(fed.sid, 1))


def test_pretraining_clients_checkpoint_their_decrypted_encodings(harness, tmp_path):
    h = harness
    store = CheckpointStore(tmp_path)
    driver = Driver(h.transport, h.parties.all(), checkpoints=store)
    driver.start()
    driver.run()
    session = h.parties.config.session
    for c in h.roster.clients:
        assert store.labels(c) == [0]
        got = encodings_from_checkpoint(store.load(c), party=c, session=session)
        enc = h.client(c).encodings
        assert np.array_equal(got.nodes, enc.nodes) and len(got.buckets) == len(enc.buckets)
        for a, b in zip(got.buckets, enc.buckets):
            assert (
                torch.equal(a.K2, b.K2)
                and torch.equal(a.h_self, b.h_self)
                and np.array_equal(a.bases.p, b.bases.p)
            )
    assert store.labels(h.roster.server) == []  # the server writes none (nothing to resume)
    with pytest.raises(CheckpointMismatchError):
        encodings_from_checkpoint(store.load(1), party=1, session=session + 1)
    raw = store.path(1, 0).read_bytes()
    assert (
        h.client(1).encodings.buckets[0].K2.numpy().tobytes()[:64] in raw
    )  # plaintext at rest: see SECURITY.md
