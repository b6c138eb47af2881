"""A hostile server's model weights and tampered Message objects are refused with typed errors and
change nothing (SECURITY.md, "Robustness testing")."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch
from torch import nn

from fedgat.federated import Client, LocalTask, NonFiniteUpdateError
from fedgat.pipeline import make_deployment
from fedgat.protocols import (
    ClientRounds,
    GlobalModel,
    LocalUpdate,
    PayloadError,
    ServerRounds,
    SignatureError,
    TrainingRefusedError,
    decode_message,
    encode_message,
)
from fedgat.protocols.messages_rounds import MAX_WEIGHT_ABS
from fedgat.protocols.secagg import SecAggConfig
from fedgat.synthetic import synthetic_graph

from protocol_helpers import refused_for_good

SESSION = 9


def _setup(lr: float = 0.05, optimiser_steps: int = 2, feature_scale: float = 1.0):
    g = synthetic_graph(num_nodes=60, num_features=12, train_per_class=4, num_val=10, num_test=10, seed=5)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, g.num_classes))
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    nodes = np.arange(g.num_nodes)
    targets = {}
    for split in ("train", "val", "test"):
        rows = torch.from_numpy(np.flatnonzero(getattr(g, f"{split}_mask").numpy()))
        targets[split] = (rows, g.y[nodes][rows])
    task = LocalTask((g.x * feature_scale,), targets)
    client = Client(1, model, task, task, lr=lr, local_epochs=optimiser_steps)
    dep = make_deployment(1)
    roster = dep.roster
    # one client: plaintext updates (secure aggregation needs a cohort of 3; test_secagg.py covers it)
    party = ClientRounds(0, roster, SESSION, dep.identities[0], client=client, seed=3, secagg=None)
    server = ServerRounds(
        roster.server,
        roster,
        SESSION,
        dep.identities[roster.server],
        initial_state=initial,
        rounds=3,
        secagg=None,
    )
    return dep, party, server, initial


def _model_frame(dep, arrays, seq=5, round_=1, *, unchecked=False, monkeypatch=None):
    msg = GlobalModel(
        sender=dep.roster.server,
        recipient=0,
        session=SESSION,
        seq=seq,
        round=round_,
        fit=True,
        splits=("val",),
        arrays=arrays,
    )
    if unchecked:  # a hostile server does not run the sender-side checks
        monkeypatch.setattr(GlobalModel, "check", lambda self: None)
        codec = dict(GlobalModel.SCHEMA)["arrays"]
        monkeypatch.setattr(codec._array, "finite", False)  # nor the encoder's NaN/inf check
    frame = encode_message(msg, dep.identities[dep.roster.server].signer)
    if unchecked:
        monkeypatch.undo()
    return frame


def _arrays(initial):
    return {k: v.numpy().copy() for k, v in initial.items()}


def test_global_model_bound_is_checked_by_the_sender(monkeypatch):
    dep, _, _, initial = _setup()
    arrays = _arrays(initial)
    arrays["0.weight"][0, 0] = 1e38
    with pytest.raises(PayloadError, match=r"GlobalModel\.arrays\['0\.weight'\].*1e\+38"):
        _model_frame(dep, arrays)


@pytest.mark.parametrize("value", [1e38, -2 * MAX_WEIGHT_ABS, np.inf, np.nan])
def test_client_refuses_huge_or_non_finite_global_weights_before_training(monkeypatch, value):
    dep, party, _, initial = _setup()
    arrays = _arrays(initial)
    arrays["0.bias"][1] = value
    frame = _model_frame(dep, arrays, unchecked=True, monkeypatch=monkeypatch)
    before = party.snapshot()
    fit_calls = []
    monkeypatch.setattr(party.client, "fit", lambda w: fit_calls.append(w))
    with pytest.raises(PayloadError, match=r"'0\.bias'"):
        party.receive(frame)
    assert party.snapshot() == before and fit_calls == []
    # weights at the bound are fine
    monkeypatch.undo()
    arrays["0.bias"][1] = MAX_WEIGHT_ABS / 2
    arrays["0.weight"][:] = 0.0
    party.receive(_model_frame(dep, arrays))


def _weights(party) -> dict:
    return {k: v.clone() for k, v in party.client.model.state_dict().items()}


def test_training_that_produces_non_finite_weights_raises_a_typed_error():
    # corrupted local data (inf) makes training diverge; any other cause does the same
    dep, party, _, initial = _setup(feature_scale=float("inf"))
    with pytest.raises(NonFiniteUpdateError, match="NaN or infinite"):
        party.client.fit(initial)  # in process
    dep, party, _, initial = _setup(feature_scale=float("inf"))
    before = _weights(party)
    exc = refused_for_good(party, _model_frame(dep, _arrays(initial)), TrainingRefusedError)
    assert re.search("NaN or infinite", exc.detail) and not re.search(r"\d\.\d|nan|inf\b", str(exc))
    assert all(torch.equal(before[k], v) for k, v in _weights(party).items())  # model rolled back
    assert not party.client.optimizer.state  # optimiser state rolled back too


def test_training_that_produces_huge_finite_weights_is_not_sent():
    """The values come from training on private data: the text names none of them (an engine may
    send it to the server), ``detail`` keeps them for local logs, and the client leaves the run."""
    dep, party, _, initial = _setup(lr=1e8, optimiser_steps=1)  # one Adam step moves each weight by ~lr
    before = _weights(party)
    exc = refused_for_good(party, _model_frame(dep, _arrays(initial)), TrainingRefusedError)
    assert re.search(r"LocalUpdate\.arrays.*above the limit", exc.detail)
    assert "|w|" not in str(exc) and "e+" not in str(exc)
    assert all(torch.equal(before[k], v) for k, v in _weights(party).items())


def test_an_evaluation_with_a_non_finite_loss_is_answered_like_any_other():
    """Under secure aggregation, counts travel in the masked fixed-point sum. An evaluation whose loss
    is not finite (here corrupted local data) used to be refused, terminally, which is itself a bit of
    the data; since a fourteenth review pass the loss enters the sum as 0 and the client answers as
    it answers any model."""
    dep, party, _, initial = _setup(feature_scale=float("inf"))
    secure = ClientRounds(
        0, dep.roster, SESSION, dep.identities[0], client=party.client, secagg=SecAggConfig()
    )
    arrays = _arrays(initial)
    msg = GlobalModel(
        sender=dep.roster.server,
        recipient=0,
        session=SESSION,
        seq=5,
        round=1,
        fit=False,
        splits=("val", "test"),
        arrays=arrays,
    )
    out = secure.receive(encode_message(msg, dep.identities[dep.roster.server].signer))
    assert [m.type_name for m in out] == ["SecAggAdvert"] and not secure.aborted


def test_server_refuses_a_huge_local_update(monkeypatch):
    dep, party, server, _ = _setup()
    start = server.start()
    reply = party.receive(server.encode(start[0]))
    update = next(m for m in reply if isinstance(m, LocalUpdate))
    arrays = {k: v.copy() for k, v in update.arrays.items()}
    arrays["0.weight"][0, 0] = 3e7
    forged = dataclasses.replace(update, arrays=arrays, seq=update.seq + 1)
    monkeypatch.setattr(LocalUpdate, "check", lambda self: None)
    frame = encode_message(forged, dep.identities[0].signer)
    monkeypatch.undo()
    before = server.snapshot()
    with pytest.raises(PayloadError, match=r"LocalUpdate\.arrays\['0\.weight'\]"):
        server.receive(frame)
    assert server.snapshot() == before


# --- item: a Message object's signature must cover its fields ---------------------------------------
def test_message_object_with_changed_fields_is_refused():
    _, party, server, _ = _setup()
    frame = server.encode(server.start()[0])
    genuine = decode_message(frame)
    before = party.snapshot()
    arrays = {k: v.copy() for k, v in genuine.arrays.items()}
    arrays["0.bias"][0] += 1.0
    changed = [
        dataclasses.replace(genuine, arrays=arrays),  # other weights
        dataclasses.replace(genuine, fit=False, splits=("val",)),  # other flags
        dataclasses.replace(genuine, round=2),  # another round
        dataclasses.replace(genuine, seq=genuine.seq + 10),  # another header field
    ]
    for msg in changed:
        assert msg.signature == genuine.signature and msg.signed_bytes == genuine.signed_bytes
        with pytest.raises(SignatureError, match="fields are not those"):
            party.receive(msg)
        with pytest.raises(SignatureError):
            party.verifier.check(msg)
        assert party.snapshot() == before
    # arrays changed in place after decoding
    inplace = decode_message(frame)
    inplace.arrays["0.weight"][0, 0] = 5.0
    with pytest.raises(SignatureError):
        party.receive(inplace)
    assert party.snapshot() == before
    # the untouched object is accepted, as its frame would be
    assert [type(m) for m in party.receive(genuine)] == [LocalUpdate]


def test_a_refused_dp_round_stays_charged(monkeypatch):
    """Under DP-FedAvg a refusal of the noised weights at the bound told the server one bit of a
    release (a ninth review pass: weights just below the bound, and the refusal said whether one
    client's noise share crossed it). A client now refuses such a model before it trains, charging
    nothing (a twelfth pass: ``UpdateDP.headroom``); with that check removed, the noised weights at
    the limit are released as the zero update's release instead (a fourteenth pass), and the
    releases stay charged."""
    from fedgat.dp_fedavg import UpdateDP
    from fedgat.protocols import fedavg_client

    dep, party, _, initial = _setup()
    party.client.update_dp = UpdateDP(clip=0.2, noise_multiplier=0.5, max_rounds=3)
    secure = ClientRounds(
        0, dep.roster, SESSION, dep.identities[0], client=party.client, secagg=SecAggConfig()
    )
    arrays = {k: np.full_like(v, np.float32(MAX_WEIGHT_ABS - 0.0625)) for k, v in _arrays(initial).items()}
    msg = GlobalModel(
        sender=dep.roster.server, recipient=0, session=SESSION, seq=5, round=1, fit=True,
        splits=("val", "test"), arrays=arrays,
    )  # fmt: skip
    frame = encode_message(msg, dep.identities[dep.roster.server].signer)
    before = secure.snapshot()
    with pytest.raises(PayloadError, match=r"within 3\.03 of the limit"):
        secure.receive(frame)
    assert secure.snapshot() == before and party.client.dp_releases == 0

    monkeypatch.setattr(fedavg_client, "check_headroom", lambda arrays, headroom: None)
    out = secure.receive(frame)
    assert [m.type_name for m in out] == ["SecAggAdvert"] and not secure.aborted
    assert party.client.dp_releases == 2  # the counts and the update: both charged


def test_the_secure_input_bounds_losses_and_counts_it_cannot_encode():
    """A trap model can make a loss overflow; what enters the secure sum is bounded (a NaN or
    infinite value as 0, a huge one at ``LOSS_BOUND``), so encoding never refuses on the data."""
    from fedgat.federated import ClientUpdate
    from fedgat.protocols.fedavg_client import LOSS_BOUND, SECURE_SPLITS, secure_vector
    from fedgat.protocols.secagg import encode
    from fedgat.rounds import Counts

    reference = {"w": torch.zeros(3)}
    update = ClientUpdate({"w": torch.ones(3)}, 4, float("inf"))
    counts = {"val": Counts(1, 5, float("nan")), "test": Counts(2, 6, 1e40)}
    vector = secure_vector(update, reference, counts)
    assert vector[:5].tolist() == [4.0, 4.0, 4.0, 4.0, 0.0]  # n w, n, the infinite loss as 0
    at = {s: 5 + 3 * i for i, s in enumerate(SECURE_SPLITS)}
    assert vector[at["val"] : at["val"] + 3].tolist() == [1.0, 5.0, 0.0]
    assert vector[at["test"] : at["test"] + 3].tolist() == [2.0, 6.0, LOSS_BOUND]
    encode(vector, 10)  # within the fixed-point bound


def test_a_substituted_round_drops_a_captured_cuda_graph():
    """A fifteenth review pass: the rollback of a diverged round installs new optimiser tensors,
    which a captured CUDA graph would not step (it keeps the ones it was captured with); the
    client therefore drops the graph and trains eagerly from then on. (The GPU path itself needs a
    GPU; here a stand-in graph shows the client lets it go, and the state is rolled back.)"""
    dep, party, _, initial = _setup()
    secure = ClientRounds(
        0, dep.roster, SESSION, dep.identities[0], client=party.client, secagg=SecAggConfig()
    )
    saved = secure._save_for_rollback()
    before = _weights(secure)
    party.client._graphed = object()  # a captured step
    with torch.no_grad():
        for p in party.client.model.parameters():
            p.add_(1.0)  # a round of training that diverged
    update = secure._unchanged(1, initial, saved, FloatingPointError("diverged"))
    assert party.client._graphed is None
    assert all(torch.equal(before[k], v) for k, v in _weights(secure).items())
    assert update.num_train == party.client.num_train and update.loss == 0.0
    assert all(torch.equal(update.state[k], v) for k, v in initial.items())
