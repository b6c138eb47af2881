r"""A hostile server against ``label_rr``'s release: it chooses the predictor.

``label_rr`` (:mod:`fedgat.dp`) releases, per shared node, a label predicted from the node's own
features by a *published* model, reported by randomised response. The published model comes from the
FedAvg rounds of :func:`fedgat.pipeline.train_release_predictor`, and the server decides what it
sends in those rounds: nothing stops it from publishing a trap instead of the trained predictor. The
release's guarantee must hold anyway: randomised response at :math:`\varepsilon` is
:math:`\varepsilon`-DP for *every* function of the row, so whatever bit of a node's features the
trap turns into the label, a recipient (or the server colluding with one) infers it no better than
a test between two hypotheses allows under :math:`\varepsilon`-DP,

.. math::  \tfrac12\,(\mathrm{TPR} + \mathrm{TNR}) \le \frac{e^\varepsilon}{1 + e^\varepsilon}

(from :math:`\mathrm{FPR} + e^\varepsilon\,\mathrm{FNR} \ge 1` and
:math:`\mathrm{FNR} + e^\varepsilon\,\mathrm{FPR} \ge 1`, Kairouz, Oh & Viswanath 2015).

:func:`chosen_predictor_attack` runs it against the real code: a :class:`TrapPredictorServer` (the
protocol's FedAvg server, publishing a trap in every round) drives the clients' real state machines,
each client keeps the weights it received last as its predictor (what the honest pipeline does), and
each owner releases its rows with :meth:`fedgat.dp.FeatureDP.release_rows` through that predictor.
The trap reads one word of the bag-of-words row: label 1 if the word is present, 0 if not; the
attacker guesses "present" when the released label is 1. The server is given the most balanced word
(from the ground truth: the strongest choice it could make). Scored against the ground truth: the
trap's own accuracy (1.0: the trap works) and the balanced accuracy of the guess against the bound.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from fedgat.dp import FeatureDP
from fedgat.dp_ledger import Budget, DPLedger
from fedgat.dp_predictor import TrainedPredictor
from fedgat.graph import Graph
from fedgat.partition import Partition
from fedgat.protocols import InProcessTransport, Message, ServerRounds

__all__ = ["ChosenPredictorOutcome", "TrapPredictorServer", "chosen_predictor_attack", "trap_predictor_state"]

#: the trap's first-layer gain: a present word's smallest value (1 / the longest row's word count on
#: Planetoid, >= 1e-3) lands far above the decision threshold; far below the clients' 1e6 bound
_GAIN = 1e5


def trap_predictor_state(reference: dict[str, torch.Tensor], feature: int) -> dict[str, torch.Tensor]:
    """Weights of the predictor's shape (``reference``) whose label is 1 when ``x[feature] > 0``
    and 0 otherwise (no other class is ever predicted)."""
    state = {k: torch.zeros_like(v) for k, v in reference.items()}
    state["lin1.weight"][0, feature] = _GAIN  # hidden 0 = ELU(gain * x_j): 0 when absent, >= 100 when present
    state["lin2.weight"][1, 0] = 1.0  # class 1's logit: hidden 0
    state["lin2.bias"][0] = 1.0  # class 0's logit: 1, above hidden 0 exactly when the word is absent
    state["lin2.bias"][2:] = -1e3  # every other class: never
    return state


class TrapPredictorServer(ServerRounds):
    """The protocol's FedAvg server, publishing ``trap`` as the global model in every round (and so
    as the weights every client keeps)."""

    def __init__(self, *args: Any, trap: dict[str, torch.Tensor], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.trap = {k: v.detach().clone() for k, v in trap.items()}

    def _send_round(self, t: int, fit: list[int], splits: tuple[str, ...]) -> list[Message]:
        self.loop.state = {k: v.clone() for k, v in self.trap.items()}
        return super()._send_round(t, fit, splits)


@dataclass(frozen=True)
class ChosenPredictorOutcome:
    """What :func:`chosen_predictor_attack` measured (plain values for JSON)."""

    epsilon: float
    feature: int
    nodes: int
    #: the fraction of nodes whose word is present
    prevalence: float
    #: the clients' predictors (the weights they received last) give the trap's label on every node
    trap_accuracy: float
    true_positive_rate: float
    true_negative_rate: float
    balanced_accuracy: float
    #: e^eps / (1 + e^eps): the most any test can reach under epsilon-DP
    bound: float
    #: three standard errors of the measured balanced accuracy (sampling, not privacy)
    slack: float

    @property
    def within_bound(self) -> bool:
        return self.balanced_accuracy <= self.bound + self.slack

    def as_dict(self) -> dict:
        return {**asdict(self), "within_bound": self.within_bound}


def _most_balanced_word(x: np.ndarray) -> int:
    share = (x > 0).mean(axis=0)
    return int(np.argmin(np.abs(share - 0.5)))


def chosen_predictor_attack(
    graph: Graph,
    partition: Partition,
    epsilon: float,
    *,
    seed: int = 0,
    feature: int | None = None,
    delta: float = 1e-5,
) -> ChosenPredictorOutcome:
    """Run the trap (module docstring) through the predictor rounds' real client state machines and
    every owner's real release; score the inference against the ground truth.

    Each owner's release is charged to a fresh in-memory ledger of budget ``(epsilon, delta)``: the
    attack is a simulation and spends no real budget."""
    from fedgat.app import build_predictor_parties
    from fedgat.pipeline import drive

    x = graph.x.numpy()
    feature = _most_balanced_word(x) if feature is None else int(feature)
    if not 0 <= feature < graph.num_features:
        raise ValueError(f"feature {feature} is not a column of the {graph.num_features}-feature rows")
    if graph.num_classes < 2:
        raise ValueError("the trap needs at least two classes")
    built = build_predictor_parties(graph, partition, seed=seed, dp_predictor_rounds=1)
    honest, roster = built.server, built.deployment.roster
    server = TrapPredictorServer(
        roster.server,
        roster,
        honest.session,
        built.deployment.identities[roster.server],
        initial_state=honest.global_state,
        rounds=1,
        patience=None,
        strategy=honest.strategy,
        fraction=honest.fraction,
        seed=seed,
        secagg=honest.secagg,
        trap=trap_predictor_state(honest.global_state, feature),
    )
    drive(InProcessTransport(), {**built.clients, server.party_id: server})
    dp = FeatureDP(epsilon, delta, mechanism="label_rr")
    truth, trapped, reported = [], [], []
    for c, client in built.clients.items():
        owned = partition.clients[c].owned
        if not len(owned) or client.global_weights is None:
            continue
        predictor = TrainedPredictor(dict(client.global_weights), built.hparams["dp_predictor_hidden"])
        rows = x[owned]
        release = dp.release_rows(rows, ledger=DPLedger(Budget(epsilon, delta)), predictor=predictor)
        truth.append(rows[:, feature] > 0)
        trapped.append(predictor.labels(rows) == 1)
        reported.append(release[:, 1:].argmax(1) == 1)
    if not truth:
        raise RuntimeError("no client kept a published predictor: the rounds did not complete")
    b, t, r = np.concatenate(truth), np.concatenate(trapped), np.concatenate(reported)
    pos, neg = int(b.sum()), int((~b).sum())
    tpr = float(r[b].mean()) if pos else 0.0
    tnr = float((~r[~b]).mean()) if neg else 0.0
    se = 0.5 * math.sqrt(tpr * (1 - tpr) / max(pos, 1) + tnr * (1 - tnr) / max(neg, 1))
    return ChosenPredictorOutcome(
        epsilon=float(epsilon),
        feature=feature,
        nodes=len(b),
        prevalence=float(b.mean()),
        trap_accuracy=float((t == b).mean()),
        true_positive_rate=tpr,
        true_negative_rate=tnr,
        balanced_accuracy=0.5 * (tpr + tnr),
        bound=math.exp(epsilon) / (1.0 + math.exp(epsilon)),
        slack=3.0 * se,
    )
