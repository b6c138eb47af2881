r"""The label predictor behind the ``label_rr`` release (:mod:`fedgat.dp`): trained federatedly, then
published, so that every owner can turn its nodes' features into a predicted label to randomise.

Why a predictor: DP on a unit-norm feature row pays for an L2 sensitivity of 2 while the row's class
signal is an order of magnitude smaller; a predicted label keeps the few bits that matter before the
noise (``benchmarks/results/dp_sweep.md`` measures the difference).

What it is: a two-layer perceptron :math:`f(h) = W_2\,\mathrm{ELU}(W_1 h)` (dropout before each
layer) on a node's own features only -- no graph -- so that the released label of node :math:`j` is a
function of :math:`h_j` alone and the randomised response bounds what it reveals about
:math:`h_j` (and about nothing else). Every client trains it on its own training nodes with the
run's strategy (FedAdam by default) for a fixed number of rounds (``dp_predictor_rounds``, no
early stopping: the clients keep the weights of the last round, the ones they received last), under
secure aggregation in the protocol (:func:`fedgat.pipeline.train_release_predictor`) and in the
clear in the in-process simulation (:func:`train_predictor`); with one local epoch FedAdam is
centralised Adam on the pooled loss, so both give the same predictor up to float rounding.

Privacy: the predictor is a model, trained on the owners' clean training rows and labels, and
published to every client: it is the *model channel* of :mod:`fedgat.dp`, covered only by DP-FedAvg
(:mod:`fedgat.dp_fedavg`), whose budget then pays for its rounds too. The release is
:math:`\varepsilon`-DP for every fixed predictor, so what a recipient learns is at most what the
predictor reveals plus :math:`\varepsilon` per node (adaptive composition), whoever chose the
predictor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedgat.dp_fedavg import UpdateDP
from fedgat.federated import Client, LocalTask, Server, StateDict, client_seed, strategy_from_hparams
from fedgat.graph import Graph
from fedgat.partition import Partition
from fedgat.tasks import owned_targets

__all__ = ["MLPPredictor", "TrainedPredictor", "predictor_model_fn", "predictor_tasks", "train_predictor"]


class MLPPredictor(nn.Module):
    """``(n, d)`` features -> ``(n, C)`` logits: dropout, ``Linear(d, hidden)``, ELU, dropout,
    ``Linear(hidden, C)``."""

    def __init__(self, in_channels: int, num_classes: int, hidden: int = 64, dropout: float = 0.6) -> None:
        super().__init__()
        self.dropout = dropout
        self.lin1 = nn.Linear(in_channels, hidden)
        self.lin2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, self.dropout, self.training)
        x = F.dropout(F.elu(self.lin1(x)), self.dropout, self.training)
        return self.lin2(x)


def predictor_model_fn(num_features: int, num_classes: int, hp: dict) -> Callable[[], MLPPredictor]:
    """A factory of predictors for resolved FedGAT hyper-parameters ``hp`` (``dp_predictor_hidden``,
    ``dropout``); each call draws from torch's global generator."""

    def model_fn() -> MLPPredictor:
        return MLPPredictor(num_features, num_classes, hp["dp_predictor_hidden"], hp["dropout"])

    return model_fn


@dataclass(frozen=True)
class TrainedPredictor:
    """Published predictor weights: :class:`fedgat.dp.LabelPredictor` for ``label_rr``."""

    state: StateDict
    hidden: int

    @property
    def num_classes(self) -> int:
        return int(self.state["lin2.weight"].shape[0])

    @property
    def num_features(self) -> int:
        return int(self.state["lin1.weight"].shape[1])

    def model(self) -> MLPPredictor:
        m = MLPPredictor(self.num_features, self.num_classes, self.hidden)
        m.load_state_dict(self.state)
        return m.eval()

    @torch.no_grad()
    def labels(self, x: np.ndarray) -> np.ndarray:
        """``(n,)`` int64 predicted classes of ``(n, d)`` rows (evaluation mode: no dropout)."""
        rows = torch.as_tensor(np.asarray(x), dtype=self.state["lin1.weight"].dtype)
        if rows.ndim != 2 or rows.shape[1] != self.num_features:
            raise ValueError(f"the predictor reads (n, {self.num_features}) rows, got {tuple(rows.shape)}")
        return self.model()(rows).argmax(1).numpy().astype(np.int64)


def predictor_tasks(graph: Graph, partition: Partition) -> list[LocalTask]:
    """One task per client: its owned nodes' feature rows and their targets (``graph.x`` dtype)."""
    return [
        LocalTask((graph.x[cp.owned],), owned_targets(graph, cp.owned)) if len(cp.owned) else LocalTask(())
        for cp in partition.clients
    ]


def train_predictor(
    graph: Graph, partition: Partition, seed: int, hp: dict, *, update_dp: UpdateDP | None = None
) -> tuple[TrainedPredictor, Sequence[int]]:
    """Train the release predictor in the in-process simulation (:class:`fedgat.federated.Server`):
    ``hp["dp_predictor_rounds"]`` rounds of the run's strategy, no early stopping, models drawn after
    ``torch.manual_seed(seed)``.

    Returns:
        The last round's weights and, per client, the rounds it trained in (what DP-FedAvg's
        ``update_dp`` has counted against its budget; the FedGAT rounds continue from there).
    """
    model_fn = predictor_model_fn(graph.num_features, graph.num_classes, hp)
    torch.manual_seed(seed)
    model = model_fn()
    strategy = strategy_from_hparams(hp, model)
    members = [
        Client.from_hparams(
            i,
            model_fn(),
            task,
            task,
            hp,
            strategy=strategy.client,
            update_dp=update_dp,
            seed=client_seed(seed, i, "predictor"),
        )
        for i, task in enumerate(predictor_tasks(graph, partition))
    ]
    server = Server(members, model.state_dict(), strategy.server, fraction=hp["fraction"], seed=seed)
    server.fit(hp["dp_predictor_rounds"], None)
    state = {k: v.detach().clone() for k, v in server.loop.state.items()}
    return TrainedPredictor(state, hp["dp_predictor_hidden"]), [m.dp_releases for m in members]
