"""Transport conformance: the same protocol gives the same results over every engine.

Each check takes ``make_transport``, a zero-argument callable returning a fresh
:class:`~fedgat.protocols.Transport` (called once per run), runs the pipeline over it and compares
with the in-process transport on the same partition and seeds. A transport either works with the
in-process driver (``connect``/``poll``) or hosts parties itself through a
``run_parties(parties, observer=...)`` method (:func:`fedgat.pipeline.drive` picks; ``clock=`` too
for :func:`check_deadlines`); either way the party objects handed in must reflect the run's outcome
afterwards (e.g. ``client.encodings``).

Engine test files (``test_inprocess.py``, ``test_ray.py``, ``test_flower.py``) only build their
transport factory and call::

    check_pretraining(make_transport)   # encrypted pre-training round
    check_training(make_transport)      # FedAvg rounds through the protocol
    check_rejection(make_transport)     # a forged frame surfaces as the protocol's typed error
    check_deadlines(make_transport)     # stalls end at the parties' deadlines, on a manual clock

What is compared:

* pre-training: identical bases (nodes, rows, coefficients: exactly), decrypted encodings within
  ``ENCODING_ATOL`` of the in-process run (fresh CKKS keys each run, so equal up to CKKS noise) and
  of the plaintext twin, the same ciphertext/message/multiply-add counts, no secret key at the
  server, and -- when the transport keeps ``traffic`` like :class:`~fedgat.protocols.InProcessTransport`
  -- the same messages per (sender, recipient, type);
* training: the same number of rounds, best round, validation and test accuracies, and losses
  within ``LOSS_RTOL``, with dropout off and with dropout on (each client draws its masks from a
  stream of its own, seeded from the run's seed, wherever it is hosted: without that a worker
  process or an actor would draw from its own unseeded stream and train another model each run);
* deadlines: the same typed fault, naming the same phase and parties, at the same time, when a peer
  stalls in the pre-training round, and the same history when a client drops out of the secure
  FedAvg rounds (time from a :class:`~fedgat.protocols.ManualClock` handed to
  :func:`~fedgat.pipeline.drive`, which the hosting engines pass on to their hosts).

Defaults are small (:func:`federation`: 96 nodes, 4 clients, 3 rounds) so a check takes seconds in
process; the in-process reference of a federation is computed once per test session and cached.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import pytest

from fedgat.app import build_pretrain_parties, build_training_parties
from fedgat.graph import Graph
from fedgat.partition import Partition, make_partition
from fedgat.pipeline import (
    PretrainResult,
    TrainingResult,
    drive,
    max_abs_error,
    run_encrypted_pretraining,
    run_plaintext_pretraining,
    train_fedgat,
)
from fedgat.protocols import (
    InProcessTransport,
    ManualClock,
    MissingPartyError,
    ServerState,
    SignatureError,
    StateError,
    Transport,
    Verifier,
)
from fedgat.protocols.fedavg import RoundTimeouts
from fedgat.protocols.messages import FeatureUpload, UploadDone, peek_type
from fedgat.protocols.pretrain import ClientState, PretrainTimeouts
from fedgat.synthetic import synthetic_graph

__all__ = [
    "DROPOUT_HPARAMS",
    "ENCODING_ATOL",
    "LOSS_RTOL",
    "Federation",
    "check_deadlines",
    "check_pretraining",
    "check_rejection",
    "check_training",
    "federation",
    "reference",
]

#: largest |difference| between two runs' decrypted encodings (CKKS noise ~1e-7 per value at n4096)
ENCODING_ATOL = 1e-5
#: relative tolerance on training losses (torch kernels may use other thread counts elsewhere)
LOSS_RTOL = 1e-4
#: training hyper-parameters of the checks: few rounds, no dropout, no early stop
TRAIN_HPARAMS = {"rounds": 3, "patience": None, "dropout": 0.0, "feature_dropout": 0.0}
#: the same with dropout on both axes (the clients' own random streams)
DROPOUT_HPARAMS = {**TRAIN_HPARAMS, "dropout": 0.6, "feature_dropout": 0.3}

MakeTransport = Callable[[], Transport]


@dataclasses.dataclass(frozen=True)
class Federation:
    """A graph, its 2-layer partition and the seed of the bases and the model."""

    graph: Graph
    partition: Partition
    seed: int


@lru_cache(maxsize=4)
def federation(num_nodes: int = 96, clients: int = 4, seed: int = 0) -> Federation:
    """A small synthetic federation in which every client owns nodes and has cross-client edges."""
    graph = synthetic_graph(
        num_nodes=num_nodes,
        num_features=16,
        train_per_class=4,
        num_val=num_nodes // 5,
        num_test=num_nodes // 4,
        seed=seed,
    )
    partition = make_partition(graph, clients, beta=1.0, seed=seed, num_layers=2)
    assert all(len(c.owned) for c in partition.clients), "a client owns no node: pick another seed"
    return Federation(graph, partition, seed)


@dataclasses.dataclass
class Reference:
    """The in-process results a transport is compared with."""

    pretrain: PretrainResult
    pretrain_traffic: dict
    plaintext: dict
    training: TrainingResult
    training_traffic: dict
    dropout: TrainingResult


_REFERENCES: dict[int, Reference] = {}


def _message_counts(transport: Transport) -> dict | None:
    traffic = getattr(transport, "traffic", None)
    return None if traffic is None else {key: value[0] for key, value in traffic.items()}


def reference(fed: Federation) -> Reference:
    """In-process pre-training, plaintext twin and training of ``fed`` (cached per federation)."""
    ref = _REFERENCES.get(id(fed))
    if ref is None:
        t_pre = InProcessTransport()
        pre = run_encrypted_pretraining(
            fed.graph, fed.partition, seed=fed.seed, transport=t_pre, progress=False, workers=0
        )
        plain = run_plaintext_pretraining(fed.graph, fed.partition, seed=fed.seed)
        t_train = InProcessTransport()
        training = train_fedgat(
            fed.graph, fed.partition, plain, seed=fed.seed, transport=t_train, progress=False, **TRAIN_HPARAMS
        )
        dropout = train_fedgat(
            fed.graph, fed.partition, plain, seed=fed.seed, progress=False, **DROPOUT_HPARAMS
        )
        ref = _REFERENCES[id(fed)] = Reference(
            pre, _message_counts(t_pre), plain, training, _message_counts(t_train), dropout
        )
    return ref


def _same_traffic(got: dict | None, want: dict | None) -> None:
    """Message counts per (sender, recipient, type), when both transports keep them."""
    if got is None or want is None:
        return
    assert got == want, "messages per (sender, recipient, type) differ from the in-process transport"


def check_pretraining(
    make_transport: MakeTransport, fed: Federation | None = None, **options
) -> PretrainResult:
    """Encrypted pre-training over ``make_transport()`` equals the in-process round (see the module
    docstring). ``options`` go to :func:`~fedgat.pipeline.run_encrypted_pretraining`
    (default ``workers=0``). Returns the transport's result for engine-specific checks."""
    fed = fed or federation()
    ref = reference(fed)
    transport = make_transport()
    got = run_encrypted_pretraining(
        fed.graph,
        fed.partition,
        seed=fed.seed,
        transport=transport,
        progress=False,
        **{"workers": 0, **options},
    )
    want = ref.pretrain
    assert got.server_has_secret_key is False
    # each owner's verdict epsilon (known break 22), however the clients were hosted
    assert got.verdict_epsilon == want.verdict_epsilon and max(want.verdict_epsilon.values()) > 0
    assert sorted(got.encodings) == sorted(want.encodings)
    for c, enc in got.encodings.items():
        other = want.encodings[c]
        assert np.array_equal(enc.nodes, other.nodes), f"client {c}: other nodes"
        assert len(enc.buckets) == len(other.buckets), f"client {c}: other buckets"
        for a, b in zip(enc.buckets, other.buckets):
            for name in ("rows", "nodes", "p", "q"):
                x, y = getattr(a.bases, name), getattr(b.bases, name)
                assert (x is None and y is None) or np.array_equal(x, y), f"client {c}: other bases ({name})"
    assert max_abs_error(got.encodings, want.encodings) <= ENCODING_ATOL
    assert max_abs_error(got.encodings, ref.plaintext) <= ENCODING_ATOL
    for field in (
        "ciphertexts_up",
        "ciphertexts_down",
        "result_ciphertexts",
        "multiply_adds",
        "messages_up",
        "messages_down",
    ):
        assert getattr(got, field) == getattr(want, field), f"{field} differs"
    assert got.layout == want.layout
    _same_traffic(_message_counts(transport), ref.pretrain_traffic)
    assert all(seconds >= 0 for seconds in got.phases.values())
    return got


def check_training(make_transport: MakeTransport, fed: Federation | None = None) -> TrainingResult:
    """FedAvg rounds over ``make_transport()`` from the plaintext twin's encodings equal the
    in-process rounds, with dropout off (the same traffic too) and on. Returns the transport's
    result (dropout off)."""
    fed = fed or federation()
    ref = reference(fed)
    dropout = train_fedgat(
        fed.graph,
        fed.partition,
        ref.plaintext,
        seed=fed.seed,
        transport=make_transport(),
        progress=False,
        **DROPOUT_HPARAMS,
    )
    _same_training(dropout, ref.dropout)
    # dropout took effect: the training losses are not those of the run without it
    assert [r["train_loss"] for r in ref.dropout.fit.history] != [
        r["train_loss"] for r in ref.training.fit.history
    ]
    transport = make_transport()
    got = train_fedgat(
        fed.graph,
        fed.partition,
        ref.plaintext,
        seed=fed.seed,
        transport=transport,
        progress=False,
        **TRAIN_HPARAMS,
    )
    _same_training(got, ref.training)
    _same_traffic(_message_counts(transport), ref.training_traffic)
    return got


def _same_training(got: TrainingResult, want: TrainingResult) -> None:
    """The same rounds, best round, accuracies (exactly) and losses (within ``LOSS_RTOL``)."""
    assert got.fit.rounds == want.fit.rounds and got.fit.best_round == want.fit.best_round
    assert got.messages == want.messages
    assert got.fit.best_val_accuracy == want.fit.best_val_accuracy
    assert got.fit.test_accuracy == want.fit.test_accuracy or (
        math.isnan(got.fit.test_accuracy) and math.isnan(want.fit.test_accuracy)
    )
    for mine, theirs in zip(got.fit.history, want.fit.history, strict=True):
        assert mine.keys() == theirs.keys()
        assert mine["clients"] == theirs["clients"]
        for key, value in theirs.items():
            if key.endswith("_accuracy"):
                assert mine[key] == value, f"round {theirs['round']}: {key} differs"
            elif key.endswith("_loss"):
                assert mine[key] == pytest.approx(value, rel=LOSS_RTOL), f"round {theirs['round']}: {key}"


def check_rejection(make_transport: MakeTransport, fed: Federation | None = None) -> None:
    """A client whose pinned roster holds another key for the server rejects the server's first
    frame with :class:`~fedgat.protocols.SignatureError`, raised out of the run as the party raised
    it (not swallowed, not wrapped in an engine error)."""
    fed = fed or federation()
    parties = build_pretrain_parties(fed.graph, fed.partition, seed=fed.seed, workers=0)
    roster = parties.deployment.roster
    victim = roster.clients[-1]
    keys = dict(roster.signing_keys)
    keys[roster.server] = keys[roster.clients[0]]  # a wrong pin for the server
    forged = dataclasses.replace(roster, signing_keys=keys)
    client = parties.clients[victim]
    client.verifier = Verifier(forged, victim, client.session)
    with pytest.raises(SignatureError):
        drive(make_transport(), parties.all())


Carry = Callable[[int, int, bytes], None]


def _intercept(transport: Transport, route: Callable[[Carry, int, int, bytes], None]) -> Transport:
    """``transport`` with every frame handed to ``route(carry, sender, recipient, data)`` before it
    is counted, ``carry`` passing a frame on: where an in-process transport sends, where a hosting
    one routes (every frame, a hosted party's included, passes there)."""
    name = "_route" if hasattr(transport, "_route") else "_send"
    carry = getattr(transport, name)
    setattr(transport, name, lambda sender, to, data: route(carry, sender, to, data))
    return transport


def _losing(transport: Transport, lost: Callable[[int, int, bytes], bool]) -> Transport:
    """``transport``, losing every frame for which ``lost(sender, recipient, data)`` holds."""

    def route(carry: Carry, sender: int, to: int, data: bytes) -> None:
        if not lost(sender, to, data):
            carry(sender, to, data)

    return _intercept(transport, route)


def check_deadlines(make_transport: MakeTransport, fed: Federation | None = None) -> None:
    """On a manual clock: (1) a client whose uploads stop after its first frame is named by the
    server's ``upload`` deadline (:class:`~fedgat.protocols.MissingPartyError`, raised out of the
    run) and the round stops; (2) when every frame to or from the server is lost once it computes,
    each client gives up at its own ``download`` deadline naming the server (hosted clients: in
    their host, ticked by the coordinator's time), and the first client's error is raised out of the
    run; (3) results held past that deadline are refused (:func:`_check_late_results`); (4) a client
    dropping out of the secure FedAvg rounds is left out as in process
    (:func:`_check_round_dropout`). Each fault comes at the time of its deadline. Without ticks for
    hosted parties, or without a wait for the earliest deadline, the runs would end silently (or
    spin) with parties still waiting."""
    fed = fed or federation()
    parties = build_pretrain_parties(fed.graph, fed.partition, seed=fed.seed, workers=0)
    roster = parties.deployment.roster
    parties.server.timeouts = PretrainTimeouts(keys=30.0, upload=30.0)
    for client in parties.clients.values():  # clients wait longer, as a deployment sets them
        client.timeouts = PretrainTimeouts(keys=60.0, download=60.0)
    staller, uploads = roster.clients[-1], [0]

    def stalls(sender: int, to: int, data: bytes) -> bool:
        if sender == staller and peek_type(data) in (FeatureUpload.TYPE, UploadDone.TYPE):
            uploads[0] += 1
            return uploads[0] > 1
        return False

    clock = ManualClock()  # stands still while anything runs: every deadline is armed at 0
    with pytest.raises(MissingPartyError) as info:
        drive(_losing(make_transport(), stalls), parties.all(), clock=clock)
    assert (info.value.phase, info.value.missing) == ("upload", (staller,))
    assert clock.now() == 30.0  # at the server's upload deadline, not later
    assert parties.server.state is ServerState.ABORTED and uploads[0] > 1

    # (2) with and without an upload window: a windowed client re-arms its deadline after each upload
    # step (at the next tick), which a hosted client only gets from the coordinator
    for window in (None, 1):
        _check_silent_server(make_transport, fed, window)
    # (3) late frames: raised by default, recorded with strict=False
    for strict in (True, False):
        _check_late_results(make_transport, fed, strict)
    # (4) the FedAvg rounds (secure aggregation, the server's fit/evaluate deadlines)
    _check_round_dropout(make_transport, fed)


def _check_silent_server(make_transport: MakeTransport, fed: Federation, window: int | None) -> None:
    """Every frame to or from the server is lost once it computes (``window`` None) or once the
    first upload is sent (windowed): each client gives up at its ``download`` deadline."""
    parties = build_pretrain_parties(fed.graph, fed.partition, seed=fed.seed, workers=0, upload_window=window)
    server, roster = parties.server, parties.deployment.roster
    for client in parties.clients.values():
        client.timeouts = PretrainTimeouts(download=20.0)
    silent = [False]

    def silenced(sender: int, to: int, data: bytes) -> bool:
        silent[0] = silent[0] or (
            server.state is ServerState.COMPUTING if window is None else peek_type(data) == FeatureUpload.TYPE
        )
        return silent[0] and roster.server in (sender, to)

    clock = ManualClock()
    with pytest.raises(MissingPartyError) as info:
        drive(_losing(make_transport(), silenced), parties.all(), clock=clock)
    assert silent[0] and (info.value.phase, info.value.missing) == ("download", (roster.server,))
    # every client armed its deadline at 0 (the clock stands still while anything runs), so all give
    # up at 20: a hosted client whose deadline waited to be armed at its next tick (windowed, after
    # an upload step) and got that tick late would give up later
    assert clock.now() == 20.0, window
    for c, client in parties.clients.items():
        err = client.failure
        assert isinstance(err, MissingPartyError), (window, c)
        assert (err.phase, err.missing) == ("download", (roster.server,)), (window, c)
        assert client.state is ClientState.ABORTED and client.encodings is None, (window, c)


def _check_late_results(make_transport: MakeTransport, fed: Federation, strict: bool) -> None:
    """The server's results are held until the clients' ``download`` deadline (20) has passed, then
    delivered: each client has given up by then, so it refuses them (``StateError``), as the server
    refuses the clients' aborts once it is done. ``strict`` (the default) raises the first refusal;
    ``strict=False`` records every one (in the transport's ``rejected``, where it keeps one) and the
    run ends with the clients' own fault."""
    parties = build_pretrain_parties(fed.graph, fed.partition, seed=fed.seed, workers=0)
    server, roster = parties.server, parties.deployment.roster
    for client in parties.clients.values():
        client.timeouts = PretrainTimeouts(download=20.0)
    clock, held = ManualClock(), []

    def route(carry: Carry, sender: int, to: int, data: bytes) -> None:
        if clock.now() >= 20.0:  # the deadline passed: what was held arrives now, late
            while held:
                carry(*held.pop(0))
        elif sender == roster.server and server.state in (ServerState.COMPUTING, ServerState.DONE):
            held.append((sender, to, data))
            return
        carry(sender, to, data)

    transport = _intercept(make_transport(), route)
    expected = StateError if strict else MissingPartyError
    with pytest.raises(expected) as info:
        drive(transport, parties.all(), clock=clock, strict=strict)
    assert clock.now() == 20.0 and not held
    if strict:  # the refusal says why the party refused and what to do
        assert any("had already ended" in note and "strict=False" in note for note in info.value.__notes__)
    else:
        assert (info.value.phase, info.value.missing) == ("download", (roster.server,))
        assert all(c.state is ClientState.ABORTED for c in parties.clients.values())
        rejected = getattr(transport, "rejected", None)
        if rejected is not None:  # a hosting transport keeps them; the in-process driver's are its own
            assert {pid for pid, _ in rejected} == {roster.server, *roster.clients}
            assert all(isinstance(err, StateError) for _, err in rejected)


def _round_dropout(transport: Transport, fed: Federation) -> tuple[list[dict], float, object]:
    """FedAvg rounds (secure aggregation: 4 clients) whose last client's frames are all lost once
    the first round is in the history; the server waits 10 s per phase. Returns the history, the
    clock's time at the end and the server's result."""
    parties = build_training_parties(
        fed.graph, fed.partition, reference(fed).plaintext, seed=fed.seed, **TRAIN_HPARAMS
    )
    server = parties.server
    assert server.secagg is not None  # the dropout goes through the secure sum's unmasking
    server.timeouts = RoundTimeouts(fit=10.0, evaluate=10.0)
    gone = server.clients[-1]
    clock = ManualClock()
    drive(
        _losing(transport, lambda s, t, d: s == gone and len(server.history) >= 1), parties.all(), clock=clock
    )
    return server.history, clock.now(), server.result


def _check_round_dropout(make_transport: MakeTransport, fed: Federation) -> None:
    """A client that drops out after the first round is left out at the server's deadlines (quorum
    kept), as in process: the same history (missing clients, accuracies, losses), at the same time."""
    want, want_time, want_result = _round_dropout(InProcessTransport(), fed)
    got, got_time, got_result = _round_dropout(make_transport(), fed)
    assert want_result is not None and got_result is not None and got_time == want_time > 0
    assert any("missing_fit" in row for row in want), "the dropout must reach a fit phase"
    for mine, theirs in zip(got, want, strict=True):
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            if key.endswith("_loss"):
                assert mine[key] == pytest.approx(value, rel=LOSS_RTOL), (theirs["round"], key)
            elif not (isinstance(value, float) and math.isnan(value)):
                assert mine[key] == value, (theirs["round"], key)
