"""Dropouts and stalls (time as an input, ManualClock): FedAvg goes on over the clients that answered
with renormalised weights, or stops with a QuorumError; pre-training drops a client nobody needs, or
stops with a MissingPartyError naming the missing party and the phase."""

from __future__ import annotations

import numpy as np
import pytest
from fault_helpers import FaultyTransport, Federation, pretrain_driver, same_state

from fedgat.encodings import BucketBases, encode_bucket
from fedgat.federated import fedavg
from fedgat.partition import make_partition
from fedgat.protocols import (
    Driver,
    LocalUpdate,
    ProtocolError,
    RoundsState,
    ServerState,
    Transcript,
    decode_message,
    run_parties,
)
from fedgat.protocols.driver import ManualClock
from fedgat.protocols.errors import MissingPartyError, QuorumError
from fedgat.protocols.fedavg import RoundTimeouts
from fedgat.protocols.messages import FeatureUpload, GlobalModel, SealedCheckKeys, UploadDone, peek_type
from fedgat.protocols.pretrain import ClientState, PretrainTimeouts

from protocol_helpers import Harness

TIMEOUTS = RoundTimeouts(fit=10.0, evaluate=10.0)


def _dies_at(parties: dict, client: int, round_: int):
    """A rule: every frame ``client`` sends once it has received round ``round_``'s model is lost."""
    return lambda sender, to, data: (
        "drop" if sender == client and parties[client].last_round >= round_ else None
    )


# ------------------------------------------------------------------------------------------ FedAvg
def test_a_dropout_is_aggregated_without_it_and_weights_renormalised():
    fed = Federation(rounds=3, fraction=1.0, timeouts=TIMEOUTS)
    parties = fed.parties()
    transport = FaultyTransport(Transcript())
    transport.rules.append(_dies_at(parties, 2, 3))
    clock = ManualClock()
    run_parties(transport, parties, clock=clock)
    srv = parties[fed.sid]
    assert srv.done and srv.failure is None and clock.now() >= 10.0
    rows = srv.history
    assert [r.get("missing_fit") for r in rows] == [None, None, [2]]
    assert rows[2]["clients"] == [0, 1]
    # round 3's model is FedAvg over the two answers, weights renormalised over them
    ups = [decode_message(e.data) for e in transport.transcript if peek_type(e.data) == LocalUpdate.TYPE]
    last = {m.sender: m for m in ups if m.round == 3}
    assert sorted(last) == [0, 1] and all(m.num_train > 0 for m in last.values())
    import torch

    want = fedavg(
        [{k: torch.from_numpy(v) for k, v in last[c].arrays.items()} for c in (0, 1)],
        [last[0].num_train, last[1].num_train],
    )
    assert same_state(srv.global_state, want)
    # the last evaluation was pooled over the clients that reported
    assert rows[2]["missing_eval_val"] == [2]


def test_a_stalled_client_is_dropped_and_its_late_answers_rejected():
    fed = Federation(rounds=4, fraction=1.0, timeouts=TIMEOUTS)
    parties = fed.parties()
    transport = FaultyTransport()
    stalled = {"on": True}
    transport.rules.append(
        lambda s, t, d: "hold" if s == 1 and parties[1].last_round == 2 and stalled["on"] else None
    )
    driver = Driver(transport, parties, clock=ManualClock(), strict=False)
    driver.start()
    driver.run(until=lambda: parties[fed.sid].history and parties[fed.sid].history[-1]["round"] >= 2)
    assert transport.held and parties[fed.sid].history[-1].get("missing_fit") == [1]
    stalled["on"] = False
    transport.release()  # the stalled answers arrive after the deadline
    before = len(driver.rejected)
    driver.run()
    srv = parties[fed.sid]
    late = driver.rejected[before:]
    assert late and all(pid == fed.sid and isinstance(e, ProtocolError) for pid, e in late)
    assert srv.done and srv.result is not None and srv.result.rounds == 4
    assert [r.get("missing_fit") for r in srv.history] == [None, [1], None, None]


def test_below_minimum_participation_the_run_stops_with_a_quorum_error():
    fed = Federation(rounds=4, fraction=1.0, timeouts=TIMEOUTS, min_participation=0.5)
    parties = fed.parties()
    transport = FaultyTransport()
    transport.rules += [_dies_at(parties, 1, 2), _dies_at(parties, 2, 2)]
    with pytest.raises(QuorumError) as info:
        run_parties(transport, parties, clock=ManualClock())
    err = info.value
    assert (err.round, err.phase, err.missing, err.answered, err.required) == (2, "fit", (1, 2), (0,), 2)
    assert "missing clients [1, 2]" in str(err)
    assert parties[fed.sid].state is RoundsState.ABORTED
    assert parties[0].state is RoundsState.ABORTED and "round 2" in parties[0].abort_reason


def test_no_timeouts_means_no_deadline():
    fed = Federation(rounds=2, fraction=1.0)
    parties = fed.parties()
    transport = FaultyTransport()
    transport.rules.append(_dies_at(parties, 2, 2))
    clock = ManualClock()
    run_parties(transport, parties, clock=clock)  # returns: nothing left to do, nothing armed
    srv = parties[fed.sid]
    assert (
        srv.state is RoundsState.RUNNING and not srv.done and srv.next_deadline() is None and clock.now() == 0
    )


def test_tick_never_goes_backwards_and_deadlines_follow_the_last_tick():
    fed = Federation(rounds=2, fraction=1.0, timeouts=TIMEOUTS)
    srv = fed.parties()[fed.sid]
    srv.tick(100.0)
    out = srv.start()
    assert {type(m) for m in out} == {GlobalModel} and srv.next_deadline() == 110.0
    assert srv.tick(50.0) == [] and srv.now == 100.0
    assert srv.tick(109.9) == [] and srv.state is RoundsState.RUNNING
    with pytest.raises(QuorumError):  # nobody answered: 0 of 3
        srv.tick(110.0)
        srv.raise_for_failure()


# ------------------------------------------------------------------------------------ pre-training
def test_a_missing_client_whose_nodes_others_need_stops_pretraining(harness):
    h = harness
    driver = pretrain_driver(h, keys=30.0, upload=30.0)
    driver.crash(2)
    driver.start()
    driver.run()
    err = h.server.failure
    assert isinstance(err, MissingPartyError) and (err.phase, err.missing) == ("keys", (2,))
    assert "missing parties [2]" in str(err) and h.server.state is ServerState.ABORTED
    for c in (0, 1):
        assert h.client(c).state is ClientState.ABORTED and "[2]" in h.client(c).abort_reason
    assert driver.dropped > 0 and driver.failures() == [err]


def test_a_client_stalling_in_upload_is_named_with_the_phase(harness):
    h = harness
    driver = pretrain_driver(h, keys=30.0, upload=30.0)
    sent = {"n": 0}

    def stall(sender, to, data):
        if sender == 2 and peek_type(data) in (FeatureUpload.TYPE, UploadDone.TYPE):
            sent["n"] += 1
            return "drop" if sent["n"] > 1 else None  # the first batch arrives, then nothing
        return None

    h.transport.rules = [stall]
    driver.start()
    driver.run()
    err = h.server.failure
    assert isinstance(err, MissingPartyError) and (err.phase, err.missing) == ("upload", (2,))
    with pytest.raises(MissingPartyError, match="upload"):
        h.server.raise_for_failure()


def test_a_client_nobody_needs_is_dropped_and_the_round_goes_on(tiny_graph):
    # min_cross above any degree: no cross-client neighbour survives, so no client needs another
    part = make_partition(tiny_graph, 3, beta=1.0, seed=0, num_layers=2, min_cross=10**6)
    assert all(np.isin(c.needed, c.owned).all() for c in part.clients)
    h = Harness(tiny_graph, part)
    driver = pretrain_driver(h, keys=30.0, upload=30.0)
    driver.crash(1)
    driver.start()
    driver.run()
    assert h.server.done and h.server.failure is None and h.server.dropped == {1: "keys"}
    x = tiny_graph.x.double()
    for c in (0, 2):
        enc = h.client(c).encodings
        assert h.client(c).done and np.array_equal(enc.nodes, part.clients[c].needed)
        for bucket in enc.buckets:  # the decrypted encodings are A_i H_i for the bases received
            b = bucket.bases
            nbrs = np.stack([part.neighbourhoods.row(int(n)) for n in b.nodes])
            ref = encode_bucket(BucketBases(b.variant, b.rows, b.nodes, nbrs, b.p, b.q), x)
            assert float((bucket.K2 - ref.K2).abs().max()) < 1e-5
            assert float((bucket.h_self - ref.h_self).abs().max()) < 1e-5
    assert h.client(1).state is ClientState.NEW  # crashed before it started


def test_a_client_without_the_check_keys_it_needs_gives_up_naming_them(harness):
    """The server withholds the check keys the other clients sealed for client 1: client 1 cannot
    release its rows (it has no tags to add), times out in its ``keys`` phase naming the server and
    those clients, and the round stops."""
    h = harness
    driver = pretrain_driver(h, clients=PretrainTimeouts(keys=20.0), keys=30.0, upload=30.0)
    h.transport.rules = [lambda s, r, d: "drop" if r == 1 and peek_type(d) == SealedCheckKeys.TYPE else None]
    driver.start()
    driver.run()
    client = h.client(1)
    err = client.failure
    waiting = sorted(client.releases)
    assert waiting and isinstance(err, MissingPartyError) and err.phase == "keys"
    assert err.missing == tuple(sorted([h.roster.server, *waiting]))
    assert f"check keys of parties {waiting}" in str(err) and client.state is ClientState.ABORTED
    assert not h.sent(1, FeatureUpload) and h.server.state is ServerState.ABORTED
    assert "client 1 aborted" in h.server.abort_reason


def test_clients_give_up_on_a_server_that_never_answers(harness):
    h = harness
    driver = pretrain_driver(h, clients=PretrainTimeouts(keys=20.0))
    driver.crash(h.roster.server)
    driver.start()
    driver.run()
    for c in h.roster.clients:
        err = h.client(c).failure
        assert isinstance(err, MissingPartyError) and (err.phase, err.missing) == ("keys", (h.roster.server,))
        assert "no roster from the server" in str(err) and h.client(c).state is ClientState.ABORTED
        assert h.client(c).holder is not None and not h.client(c).participants


def test_clients_time_out_when_the_server_stalls(harness):
    h = harness
    driver = pretrain_driver(h, download=20.0)
    driver.start()
    driver.run(until=lambda: h.server.state is ServerState.COMPUTING)
    driver.crash(h.roster.server)
    driver.run()
    for c in h.roster.clients:
        err = h.client(c).failure
        assert (
            isinstance(err, MissingPartyError)
            and err.phase == "download"
            and err.missing == (h.roster.server,)
        )
        assert h.client(c).state is ClientState.ABORTED
