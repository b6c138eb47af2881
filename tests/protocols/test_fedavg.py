"""FedAvg through the protocol state machines gives bit-identical weights and metrics to the in-process
:class:`fedgat.federated.Server` with plaintext updates, and the same within float rounding of the mean
under secure aggregation; rejected round messages change nothing."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from torch import nn

from fedgat.federated import Client, FedAdam, FedAvg, LocalTask, Server, client_seed
from fedgat.pipeline import make_deployment
from fedgat.protocols import (
    ClientRounds,
    Driver,
    GlobalModel,
    InProcessTransport,
    LocalUpdate,
    PayloadError,
    ReplayError,
    ServerRounds,
    StateError,
    encode_message,
    run_parties,
)
from fedgat.protocols.secagg import SecAggConfig
from fedgat.rounds import RoundLoop
from fedgat.synthetic import synthetic_graph


def _clients(
    seed: int, strategy=None, streams: int | None = None, empty: bool = True
) -> tuple[list[Client], dict]:
    """3 clients with a dropout + linear model; with ``empty`` client 2 has no training node.
    ``streams``: each client draws from a stream of its own, seeded from it
    (:func:`fedgat.federated.client_seed`)."""
    g = synthetic_graph(num_nodes=90, num_features=12, train_per_class=4, num_val=20, num_test=30, seed=5)
    owner = np.arange(g.num_nodes) % 3
    torch.manual_seed(seed)

    def model_fn() -> nn.Module:
        return nn.Sequential(nn.Dropout(0.3), nn.Linear(12, g.num_classes))

    initial = model_fn().state_dict()
    clients = []
    for c in range(3):
        nodes = np.flatnonzero(owner == c)
        targets = {}
        for split in ("train", "val", "test"):
            mask = getattr(g, f"{split}_mask").numpy()[nodes]
            if split == "train" and c == 2 and empty:
                mask[:] = False
            rows = torch.from_numpy(np.flatnonzero(mask))
            targets[split] = (rows, g.y[nodes][rows])
        task = LocalTask((g.x[nodes],), targets)
        own = None if streams is None else client_seed(streams, c)
        clients.append(
            Client(c, model_fn(), task, task, lr=0.05, local_epochs=2, strategy=strategy, seed=own)
        )
    return clients, initial


def _federation(clients, initial, secagg, **server) -> tuple[ServerRounds, dict[int, ClientRounds]]:
    """The FedAvg server (session 9, ``server``'s keyword arguments) and a ClientRounds per client of
    a fresh 3-client deployment."""
    dep = make_deployment(3)
    roster = dep.roster
    srv = ServerRounds(
        roster.server,
        roster,
        9,
        dep.identities[roster.server],
        initial_state=initial,
        secagg=secagg,
        **server,
    )
    parties = {
        c: ClientRounds(c, roster, 9, dep.identities[c], client=clients[c], secagg=secagg)
        for c in roster.clients
    }
    return srv, parties


def _same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def _same_history(a: list[dict], b: list[dict]) -> bool:
    def eq(x, y):
        return (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)) or x == y

    return len(a) == len(b) and all(
        list(x) == list(y) and all(eq(x[k], y[k]) for k in x) for x, y in zip(a, b)
    )


def _strategy(name):
    return FedAdam(0.05, 5e-4, client_lr=0.5) if name == "fedadam" else FedAvg()


def _close(a: dict, b: dict) -> bool:
    """Equal up to float32 rounding of a mean computed in another order (a few ulps after a few rounds)."""
    return list(a) == list(b) and all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-6) for k in a)


def _close_history(a: list[dict], b: list[dict]) -> bool:
    def eq(k, x, y):
        if isinstance(x, float) and math.isnan(x):
            return isinstance(y, float) and math.isnan(y)
        return x == pytest.approx(y, rel=1e-5) if k.endswith("_loss") else x == y

    return len(a) == len(b) and all(
        list(x) == list(y) and all(eq(k, x[k], y[k]) for k in x) for x, y in zip(a, b)
    )


# secure aggregation needs 3 clients a round: with 3 clients, fraction 1 only
@pytest.mark.parametrize("strategy", ["fedavg", "fedadam"])
@pytest.mark.parametrize(
    "fraction, patience, rounds, secure",
    [(1.0, None, 6, False), (0.67, 2, 12, False), (1.0, None, 6, True), (1.0, 2, 12, True)],
)
@pytest.mark.parametrize("streams", [None, 11])
def test_protocol_rounds_equal_in_process_training(fraction, patience, rounds, secure, strategy, streams):
    """The protocol's rounds train exactly the model of :class:`fedgat.federated.Server`: clients on
    the process-wide stream (seeded alike for both runs), or each on a stream of its own (as every
    pipeline builds them; the process-wide stream then plays no part: seeded otherwise). Without
    secure aggregation client 2 has no training node (FedAvg weight 0); with it all three train (a
    secure sum needs ``min_cohort`` members that add an update: see the next test)."""
    clients, initial = _clients(seed=3, strategy=_strategy(strategy), streams=streams, empty=not secure)
    torch.manual_seed(11)
    server = Server(clients, initial, _strategy(strategy), fraction=fraction, seed=4)
    want = server.fit(rounds, patience)

    clients, initial = _clients(seed=3, strategy=_strategy(strategy), streams=streams, empty=not secure)
    secagg = SecAggConfig() if secure else None
    torch.manual_seed(11 if streams is None else 99)
    srv, parties = _federation(
        clients,
        initial,
        secagg,
        rounds=rounds,
        patience=patience,
        fraction=fraction,
        seed=4,
        strategy=_strategy(strategy),
    )
    run_parties(InProcessTransport(), {**parties, srv.party_id: srv})
    got = srv.result
    assert got is not None and srv.done
    same, same_history = (_close, _close_history) if secure else (_same, _same_history)
    assert same(srv.global_state, server.state)
    assert same(srv.best_state, server.best_state)
    assert (got.best_round, got.rounds, got.test_accuracy, got.best_val_accuracy) == (
        want.best_round,
        want.rounds,
        want.test_accuracy,
        want.best_val_accuracy,
    )
    assert same_history(got.history, want.history)
    assert ("secagg" in srv.timings) == secure
    if patience is not None:
        assert got.rounds <= rounds


def test_a_secure_round_needs_min_cohort_members_that_add_an_update():
    """Client 2 has no training node, so its input adds zeros to the update part, and its advert
    says so: with 3 clients the secure sum would hold 2 updates, below ``min_cohort`` 3, and every
    client that trains refuses the cohort (a seventh review pass: the sum was two updates while the
    clients believed it held three). Client 2, whose input adds nothing, has nothing to protect and
    accepts; nothing is unmasked."""
    clients, initial = _clients(seed=3, strategy=FedAvg())
    srv, parties = _federation(
        clients, initial, SecAggConfig(), rounds=2, patience=None, fraction=1.0, seed=4, strategy=FedAvg()
    )
    roster = srv.roster
    driver = Driver(InProcessTransport(), {**parties, srv.party_id: srv}, strict=False)
    driver.start()
    driver.run()
    refused = {pid for pid, exc in driver.rejected if "add their updates to the sum" in str(exc)}
    assert refused == {roster.clients[0], roster.clients[1]}
    assert not srv.done and srv.history == []


def test_a_client_with_its_own_stream_draws_the_same_masks_whatever_else_draws():
    """A seeded client's update depends on its seed only: not on the process-wide stream, nor on the
    other clients that trained before it, and it leaves the process-wide stream as it was."""
    clients, initial = _clients(seed=3, streams=7)
    alone = clients[0].fit(initial)
    twins, _ = _clients(seed=3, streams=7)
    torch.manual_seed(123)  # another process-wide stream ...
    torch.rand(1000)
    twins[1].fit(initial)  # ... and another client trained first
    before = torch.get_rng_state()
    again = twins[0].fit(initial)
    assert torch.equal(torch.get_rng_state(), before)
    assert _same(alone.state, again.state) and alone.loss == again.loss
    others, _ = _clients(seed=3, streams=8)  # another run seed: other masks, another update
    assert not _same(others[0].fit(initial).state, alone.state)
    # the stream moves on: a second round draws new masks
    assert not _same(twins[0].fit(initial).state, again.state)


def test_round_messages_are_checked():
    clients, initial = _clients(seed=0)
    dep = make_deployment(3)
    roster = dep.roster
    srv = ServerRounds(
        roster.server, roster, 9, dep.identities[roster.server], initial_state=initial, rounds=3, secagg=None
    )
    client = ClientRounds(1, roster, 9, dep.identities[1], client=clients[1], secagg=None)
    out = srv.start()
    to1 = next(m for m in out if m.recipient == 1)
    data = srv.encode(to1)
    reply = client.receive(data)
    assert [type(m) for m in reply] == [LocalUpdate]
    up = client.encode(reply[0])

    def rejected(party, frame, error):
        before = party.snapshot()
        with pytest.raises(error):
            party.receive(frame)
        assert party.snapshot() == before

    # replayed global model (same frame), and an old round id with a fresh sequence number
    rejected(client, data, ReplayError)
    old = GlobalModel(
        sender=roster.server, recipient=1, session=9, seq=50, round=1, fit=True, splits=(), arrays=to1.arrays
    )
    rejected(client, encode_message(old, dep.identities[roster.server].signer), ReplayError)
    # weights of the wrong shape
    bad = {k: np.zeros((1,) * v.ndim, np.float32) for k, v in to1.arrays.items()}
    rejected(
        client,
        encode_message(
            GlobalModel(
                sender=roster.server,
                recipient=1,
                session=9,
                seq=51,
                round=2,
                fit=True,
                splits=("val",),
                arrays=bad,
            ),
            dep.identities[roster.server].signer,
        ),
        PayloadError,
    )
    # server side: the update is accepted once; a copy, a stale round or a report out of turn are not
    srv.receive(up)
    rejected(srv, up, ReplayError)
    stale = LocalUpdate(
        sender=0,
        recipient=roster.server,
        session=9,
        seq=7,
        round=0,
        num_train=1,
        loss=0.1,
        arrays=reply[0].arrays,
    )
    rejected(srv, encode_message(stale, dep.identities[0].signer), ReplayError)
    wrong = LocalUpdate(
        sender=0,
        recipient=roster.server,
        session=9,
        seq=8,
        round=1,
        num_train=1,
        loss=0.1,
        arrays={k: v[..., :1] for k, v in reply[0].arrays.items()},
    )
    rejected(srv, encode_message(wrong, dep.identities[0].signer), PayloadError)
    from fedgat.protocols import EvaluationReport, SplitCounts

    report = EvaluationReport(
        sender=0,
        recipient=roster.server,
        session=9,
        seq=9,
        round=1,
        splits=(SplitCounts("val", 1, 2, 0.5), SplitCounts("test", 1, 2, 0.5)),
    )
    rejected(srv, encode_message(report, dep.identities[0].signer), ReplayError)
    assert StateError  # imported for readers: out-of-state messages raise it (see test_pretrain)


def test_server_rounds_and_in_process_server_drive_the_same_loop(monkeypatch):
    """Both servers hand their round decisions to one :class:`fedgat.rounds.RoundLoop`: the same
    samples, the same updates and the same reports reach it, in the same order (the protocol samples
    round t + 1 while round t is evaluated, so after an early stop it has drawn one sample more)."""
    calls: list[tuple] = []
    for name in ("sample", "on_updates", "on_reports"):
        method = getattr(RoundLoop, name)

        def spy(self, *args, _method=method, _name=name, **kwargs):
            out = _method(self, *args, **kwargs)
            missing = tuple(args[2] if len(args) > 2 else kwargs.get("missing", ()))
            calls.append((_name, _summary(args[:2]), missing, _summary(out)))
            return out

        monkeypatch.setattr(RoundLoop, name, spy)

    def run(protocol: bool) -> list[tuple]:
        calls.clear()
        clients, initial = _clients(seed=3)
        torch.manual_seed(11)
        if not protocol:
            server = Server(clients, initial, fraction=0.67, seed=4)
            server.fit(12, 2)
            assert isinstance(server.loop, RoundLoop)
            return list(calls)
        # 2 clients a round, so no secure aggregation (the secure path's loop: test_secagg.py)
        srv, parties = _federation(clients, initial, None, rounds=12, patience=2, fraction=0.67, seed=4)
        run_parties(InProcessTransport(), {**parties, srv.party_id: srv})
        assert isinstance(srv.loop, RoundLoop) and srv.result is srv.loop.result
        return list(calls)

    local, remote = run(False), run(True)

    def of(seq, name):
        return [c for c in seq if c[0] == name]

    assert of(local, "on_updates") and of(local, "on_updates") == of(remote, "on_updates")
    assert of(local, "on_reports") == of(remote, "on_reports")
    assert of(remote, "sample")[: len(of(local, "sample"))] == of(local, "sample")
    assert len(of(remote, "sample")) - len(of(local, "sample")) in (0, 1)


def _summary(value):
    """Comparable form of the loop's arguments and results (tensors by their values)."""
    if isinstance(value, torch.Tensor):
        return tuple(value.flatten().tolist())
    if isinstance(value, dict):
        return tuple((k, _summary(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(_summary(v) for v in value)
    return value


def test_a_given_secure_aggregation_that_no_round_can_meet_is_refused_before_the_run():
    """An explicit ``SecAggConfig`` whose ``min_cohort`` exceeds the clients a round samples used to
    build, and every round then stopped at its first stage (``QuorumError``); the builders now say
    so before anything runs, and accept what a round can meet."""
    from fedgat.app import training_secagg
    from fedgat.protocols.secagg import SecAggConfig

    with pytest.raises(ValueError, match=r"2 client\(s\) per round \(fraction 0.5 of 4\) is below .* 3"):
        training_secagg(SecAggConfig(), 4, 0.5)
    with pytest.raises(ValueError, match="below the secure aggregation's min_cohort of 5"):
        training_secagg(SecAggConfig(min_cohort=5), 4, 1.0)
    assert training_secagg(SecAggConfig(min_cohort=4), 4, 1.0) == SecAggConfig(min_cohort=4)
    assert training_secagg(SecAggConfig(min_cohort=2), 4, 0.5) == SecAggConfig(min_cohort=2)


def test_auto_secure_aggregation_counts_only_clients_that_add_an_update(tiny_graph, tiny_partition):
    """``secagg="auto"`` turns secure aggregation on only when every round's cohort can hold
    ``min_cohort`` clients that add an update (clients refuse others): clients without a training
    node do not count, unless DP-FedAvg gives every client a noise share to add."""
    from fedgat.app import idle_clients, training_secagg
    from fedgat.methods import resolve_hparams
    from fedgat.protocols.fedavg_client import DEFAULT_SECAGG

    assert training_secagg("auto", 3, 1.0) == DEFAULT_SECAGG
    assert training_secagg("auto", 10, 1.0, idle=7) == DEFAULT_SECAGG
    with pytest.warns(UserWarning, match=r"\(1 of them without training nodes\).*travel in plaintext"):
        assert training_secagg("auto", 3, 1.0, idle=1) is None
    train = tiny_graph.train_mask.numpy()
    empty = sum(not train[tiny_partition.owner == c].any() for c in range(tiny_partition.num_clients))
    hp = resolve_hparams("fedgat", {})
    assert idle_clients(tiny_graph, tiny_partition, hp) == empty
    mask = tiny_graph.train_mask & torch.from_numpy(tiny_partition.owner != 0)  # client 0: none
    graph = dataclasses.replace(tiny_graph, train_mask=mask)
    assert idle_clients(graph, tiny_partition, hp) == max(empty, 1)
    dp = resolve_hparams("fedgat", {"update_dp_epsilon": 8.0})
    assert idle_clients(graph, tiny_partition, dp) == 0
