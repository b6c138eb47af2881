"""FedAvg clients as values (:mod:`fedgat.protocols.party_values`): what a
:class:`~fedgat.protocols.fedavg_client.ClientRounds` ships and reports.

Spec (before its first message): roster, session, Ed25519 signer, the session key's fingerprint,
its private random stream (when it has one), its secure-aggregation configuration
(:class:`~fedgat.protocols.secagg.SecAggConfig` or None) and its :class:`~fedgat.federated.Client`:

* the model as a description -- its class (:data:`MODELS`: FedGAT) and constructor arguments, the
  score polynomial as its fitted fields (:class:`~fedgat.approx.ScorePolynomial`: ``psi``,
  ``degree``, ``domain``, ``method`` and the coefficients, so nothing is refitted and the rebuilt
  model computes bit for bit the same) -- and its weights as arrays;
* the optimiser's state (:func:`~fedgat.checkpoint.optimizer_to_checkpoint`) and the client half of
  the strategy (:class:`~fedgat.strategies.ClientStrategy`'s fields);
* the local tasks: targets as arrays, model inputs as tensors/arrays or encodings
  (:func:`~fedgat.protocols.party_values.encodings_to_value`, compaction and row factors included);
* ``client_id`` and ``local_epochs``, and the device it trains on when that is not the CPU (rebuilt
  there: :func:`fedgat.device.resolve_device`, so a host without that device refuses the spec).

A model class without an entry in :data:`MODELS`, a strategy subclass or a task input of another type
cannot be described: :class:`TypeError`, naming it.

Report: state, abort reason and timings, and the counter ``last_round`` (the model replica stays
where the client ran: the server holds the global model and the results).

Mid-run state (:mod:`fedgat.protocols.party_state`, any point between messages): the spec's fields
(without the private keys) -- so the model's current weights, the optimiser's current state and the
random stream as they are -- and the progress: the last round served, the last global weights
received (arrays), the splits already evaluated in it, the model's train/eval mode and the secure
round under way (:meth:`~fedgat.protocols.secagg_client.ClientSecAgg.to_value`: its stage, cohort,
encoded input and **its secrets** -- round keys, seeds, shares held -- so the store must be kept like
a key store, as for the pre-training's CKKS secret key).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from fedgat.checkpoint import optimizer_from_checkpoint, optimizer_to_checkpoint, tensors_to_arrays
from fedgat.dp_fedavg import UpdateDP
from fedgat.federated import Client, LocalTask
from fedgat.strategies import ClientStrategy

from .party_values import PartyReport, PartySpec, encodings_from_value, encodings_to_value
from .roster import Identity, Roster
from .secagg import SecAggConfig
from .secagg_client import ClientSecAgg

if TYPE_CHECKING:
    from fedgat.approx import ScorePolynomial

    from .fedavg_client import ClientRounds

__all__ = [
    "MODELS",
    "absorb_rounds",
    "client_from_value",
    "client_to_value",
    "from_state_fields",
    "model_from_value",
    "model_to_value",
    "report_rounds",
    "restore_progress",
    "rounds_from_spec",
    "rounds_spec_fields",
    "state_fields",
    "state_progress",
    "task_from_value",
    "task_to_value",
]

_SCORE_FIELDS = (
    "psi",
    "degree",
    "domain",
    "method",
    "cheb",
    "power",
    "shift",
    "sup_error",
    "min_value",
    "score_min",
)


def score_to_value(score: ScorePolynomial) -> dict[str, Any]:
    return {name: getattr(score, name) for name in _SCORE_FIELDS}


def score_from_value(value: Mapping[str, Any]) -> ScorePolynomial:
    from fedgat.approx import ScorePolynomial

    v = dict(value)
    return ScorePolynomial(
        psi=str(v["psi"]),
        degree=int(v["degree"]),
        domain=float(v["domain"]),
        method=str(v["method"]),
        cheb=np.asarray(v["cheb"], dtype=np.float64),
        power=np.asarray(v["power"], dtype=np.float64),
        shift=float(v["shift"]),
        sup_error=float(v["sup_error"]),
        min_value=float(v["min_value"]),
        score_min=float(v["score_min"]),
    )


# ----------------------------------------------------------------------------------------- models
def _describe_fedgat(model: Any) -> dict[str, Any]:
    c1, c2 = model.conv1, model.conv2
    standard = (
        c1.concat
        and c1.bias is not None
        and not c2.concat
        and not c2.add_self_loops
        and c2.dropout == model.dropout
        and c2.in_channels == c1.out_channels * c1.heads
    )
    if not standard:
        raise TypeError("this FedGAT's layers are not those FedGAT(...) builds; it cannot be described")
    return {
        "in_channels": int(c1.in_channels),
        "num_classes": int(c2.out_channels),
        "hidden": int(c1.out_channels),
        "heads": int(c1.heads),
        "out_heads": int(c2.heads),
        "dropout": float(model.dropout),
        "feature_dropout": float(c1.feature_dropout),
        "score": score_to_value(c1.score),
    }


def _build_fedgat(kwargs: Mapping[str, Any]) -> nn.Module:
    from fedgat.models import FedGAT

    kw = dict(kwargs)
    return FedGAT(
        int(kw["in_channels"]),
        int(kw["num_classes"]),
        hidden=int(kw["hidden"]),
        heads=int(kw["heads"]),
        out_heads=int(kw["out_heads"]),
        dropout=float(kw["dropout"]),
        feature_dropout=float(kw["feature_dropout"]),
        score=score_from_value(kw["score"]),
    )


def _describe_predictor(model: nn.Module) -> dict[str, Any]:
    from fedgat.dp_predictor import MLPPredictor

    assert isinstance(model, MLPPredictor)
    return {
        "in_channels": model.lin1.in_features,
        "num_classes": model.lin2.out_features,
        "hidden": model.lin1.out_features,
        "dropout": model.dropout,
    }


def _build_predictor(kwargs: Mapping[str, Any]) -> nn.Module:
    from fedgat.dp_predictor import MLPPredictor

    return MLPPredictor(
        int(kwargs["in_channels"]),
        int(kwargs["num_classes"]),
        int(kwargs["hidden"]),
        float(kwargs["dropout"]),
    )


#: model class name -> ("module:class", describe(model) -> kwargs, build(kwargs) -> model)
MODELS: dict[str, tuple[str, Callable[[nn.Module], dict], Callable[[Mapping[str, Any]], nn.Module]]] = {
    "FedGAT": ("fedgat.models:FedGAT", _describe_fedgat, _build_fedgat),
    "MLPPredictor": ("fedgat.dp_predictor:MLPPredictor", _describe_predictor, _build_predictor),
}


def model_to_value(model: nn.Module) -> dict[str, Any]:
    """``{"kind", "kwargs", "weights"}`` of a model whose class is in :data:`MODELS`.

    Raises:
        TypeError: another class (subclasses included).
    """
    name = type(model).__name__
    entry = MODELS.get(name)
    if entry is None or f"{type(model).__module__}:{type(model).__qualname__}" != entry[0]:
        raise TypeError(
            f"no value description for model {type(model).__qualname__} (known: {sorted(MODELS)})"
        )
    return {"kind": name, "kwargs": entry[1](model), "weights": tensors_to_arrays(model.state_dict(), "")}


def model_from_value(value: Mapping[str, Any]) -> nn.Module:
    """The model :func:`model_to_value` described, with its weights (torch's global random stream is
    left as it was)."""
    entry = MODELS.get(value["kind"])
    if entry is None:
        raise TypeError(f"no model kind {value['kind']!r} (known: {sorted(MODELS)})")
    with torch.random.fork_rng(devices=[]):
        model = entry[2](value["kwargs"])
    model.load_state_dict({k: torch.from_numpy(np.array(a)) for k, a in value["weights"].items()})
    return model


# ------------------------------------------------------------------------------------------ tasks
def _input_to_value(x: Any) -> dict[str, Any]:
    from fedgat.encodings import Encodings

    if isinstance(x, torch.Tensor):
        return {"tensor": x.detach().cpu().contiguous().numpy().copy()}
    if isinstance(x, np.ndarray):
        return {"array": x}
    if isinstance(x, Encodings):
        return {"encodings": encodings_to_value(x)}
    raise TypeError(f"a task input of type {type(x).__name__} has no value description")


def _input_from_value(value: Mapping[str, Any]) -> Any:
    if "tensor" in value:
        return torch.from_numpy(np.array(value["tensor"]))
    if "array" in value:
        return np.array(value["array"])
    return encodings_from_value(value["encodings"])


def task_to_value(task: LocalTask) -> dict[str, Any]:
    return {
        "inputs": [_input_to_value(x) for x in task.inputs],
        "targets": {
            split: [rows.detach().cpu().numpy().copy(), labels.detach().cpu().numpy().copy()]
            for split, (rows, labels) in task.targets.items()
        },
    }


def task_from_value(value: Mapping[str, Any]) -> LocalTask:
    return LocalTask(
        tuple(_input_from_value(x) for x in value["inputs"]),
        {
            str(split): (torch.from_numpy(np.array(rows)), torch.from_numpy(np.array(labels)))
            for split, (rows, labels) in value["targets"].items()
        },
    )


# ----------------------------------------------------------------------------------------- client
def client_to_value(client: Client) -> dict[str, Any]:
    """A :class:`~fedgat.federated.Client` as plain values (see the module docstring). Its own random
    stream (:attr:`~fedgat.federated.Client.rng_state`) is not among them: a rounds client's spec
    and state carry it beside (:func:`rounds_spec_fields`)."""
    if type(client) is not Client:
        raise TypeError(f"no value description for client class {type(client).__qualname__}")
    if type(client.training) is not ClientStrategy:
        raise TypeError(f"no value description for client strategy {type(client.training).__qualname__}")
    opt_meta, opt_arrays = optimizer_to_checkpoint(client.optimizer, prefix="")
    return {
        "client_id": client.client_id,
        "local_epochs": client.local_epochs,
        "strategy": dataclasses.asdict(client.training),
        "model": model_to_value(client.model),
        "optimizer": {"meta": opt_meta, "arrays": opt_arrays},
        "train": task_to_value(client.train_task),
        "evaluation": [task_to_value(t) for t in client.eval_tasks],
        "update_dp": None if client.update_dp is None else dataclasses.asdict(client.update_dp),
        "dp_releases": client.dp_releases,
        # written only off the CPU, so a CPU client's value is what it was before devices existed
        **({} if client.device.type == "cpu" else {"device": str(client.device)}),
    }


def client_from_value(value: Mapping[str, Any]) -> Client:
    """Inverse of :func:`client_to_value` (optimiser state and hyper-parameters restored exactly)."""
    opt = value["optimizer"]
    group = opt["meta"]["groups"][0]
    client = Client(
        int(value["client_id"]),
        model_from_value(value["model"]),
        task_from_value(value["train"]),
        [task_from_value(t) for t in value["evaluation"]],
        lr=float(group["lr"]),
        weight_decay=float(group.get("weight_decay", 0.0)),
        local_epochs=int(value["local_epochs"]),
        strategy=ClientStrategy(**value["strategy"]),
        update_dp=None if value.get("update_dp") is None else UpdateDP(**value["update_dp"]),
        device=value.get("device"),  # fedgat.device.DeviceUnavailableError on a host without it
    )
    client.dp_releases = int(value.get("dp_releases", value.get("dp_rounds", 0)))  # "dp_rounds": before v11
    optimizer_from_checkpoint(client.optimizer, opt["meta"], opt["arrays"], prefix="")
    return client


# ------------------------------------------------------------------------------------ ClientRounds
def rounds_spec_fields(party: ClientRounds) -> dict[str, Any]:
    """The kind's fields of a client that has handled no message (see the module docstring)."""
    rng = party._rng
    return {
        "client": client_to_value(party.client),
        "rng": None if rng is None else rng.numpy().copy(),
        "secagg": None if party.secagg is None else party.secagg.to_value(),
    }


def rounds_from_spec(cls: type[ClientRounds], spec: PartySpec) -> ClientRounds:
    f = spec.fields
    party = cls(
        spec.party_id,
        Roster.from_value(f["roster"]),
        int(f["session"]),
        Identity.from_value(f["identity"]),
        client=client_from_value(f["client"]),
        fingerprint=f["verifier"]["fingerprint"],
        secagg=SecAggConfig.from_value(f["secagg"]),
    )
    party._rng = None if f["rng"] is None else torch.from_numpy(np.array(f["rng"], dtype=np.uint8))
    party._restore_spec_base(f)
    return party


def report_rounds(party: ClientRounds) -> tuple[dict[str, int], dict[str, Any]]:
    """Counters, and the last global weights the client received (e.g. a published predictor's)."""
    weights = party._weights
    counters = {"last_round": int(party.last_round), "dp_releases": int(party.client.dp_releases)}
    return counters, {"weights": None if weights is None else tensors_to_arrays(weights, "")}


def absorb_rounds(party: ClientRounds, report: PartyReport) -> None:
    party.last_round = int(report.counters["last_round"])
    party.client.dp_releases = int(report.counters.get("dp_releases", report.counters.get("dp_rounds", 0)))
    weights = report.result.get("weights")
    if weights is not None:
        if list(weights) != list(party._reference):
            raise ValueError("the reported global weights do not match the model's")
        party._weights = {k: torch.from_numpy(np.array(a)) for k, a in weights.items()}


# ------------------------------------------------------------------------------------ mid-run state
def state_fields(party: ClientRounds) -> dict[str, Any]:
    """A mid-run state's fields: the spec's (current model weights, optimiser state, random stream)."""
    return rounds_spec_fields(party)


def from_state_fields(cls: type[ClientRounds], spec: PartySpec) -> ClientRounds:
    return rounds_from_spec(cls, spec)


def state_progress(party: ClientRounds) -> dict[str, Any]:
    """The client's progress (see the module docstring)."""
    weights = party._weights
    return {
        "last_round": int(party.last_round),
        "weights": None if weights is None else tensors_to_arrays(weights, ""),
        "evaluated": sorted(party._evaluated),
        "training": bool(party.client.model.training),
        "secure": None if party._secure is None else party._secure.to_value(),
    }


def restore_progress(party: ClientRounds, progress: Mapping[str, Any]) -> None:
    """Set what :func:`state_progress` saved on a client built from the same state's fields."""
    weights = progress["weights"]
    if weights is not None and list(weights) != list(party._reference):
        raise ValueError("the saved global weights do not match the model's")
    party.last_round = int(progress["last_round"])
    party._weights = (
        None if weights is None else {k: torch.from_numpy(np.array(a)) for k, a in weights.items()}
    )
    party._evaluated = {str(s) for s in progress["evaluated"]}
    party.client.model.train(bool(progress["training"]))
    secure = progress["secure"]
    party._secure = None if secure is None else ClientSecAgg.from_value(secure)
