r"""Federated training in one process: aggregation strategies, clients and a server.

Only model weights move during training. A :class:`Client` is built once with its local data (for
FedGAT: the encodings it received in the pre-training round; for the baselines whatever they need)
and from then on receives global weights, trains locally, and returns a state dict plus its number
of training nodes. The :class:`Server` samples clients, aggregates their states with a
:class:`Strategy` and evaluates the global model by pooling the clients' (correct, count) counts.

State dicts are plain ``dict[str, torch.Tensor]`` here; a transport (encrypted, Ray, Flower) wraps
them in its own messages and can call :func:`fedavg` directly.

Notation: client :math:`k` holds :math:`n_k` training nodes and local objective :math:`F_k`; round
:math:`t` samples clients :math:`S_t` and FedAvg (McMahan et al. 2017, Algorithm 1) sets
:math:`w^{t+1} = \sum_{k \in S_t} \frac{n_k}{\sum_{l \in S_t} n_l} w_k^{t+1}`.

Strategies, one small interface (:class:`Strategy`: the client's optimiser, a local penalty, the
aggregation, server state for checkpoints): :class:`FedAvg` (clients keep their own Adam; the
default and the paper's), :class:`FedProx`, and :class:`FedAdam` (clients SGD, the server runs Adam
on the FedAvg mean's step; with one local epoch that is centralised Adam on the pooled loss).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

StateDict = dict[str, torch.Tensor]


def fedavg(states: Sequence[StateDict], weights: Sequence[float]) -> StateDict:
    r"""Weighted mean of state dicts, :math:`\bar w = \sum_k \frac{n_k}{\sum_l n_l} w_k` (FedAvg).

    Computed in float64 and cast back to each tensor's dtype. States with weight 0 are left out of
    the sum entirely (so a zero-weight client's NaNs cannot leak in); a single positive weight
    returns that state's values exactly.

    Args:
        states: ``K`` state dicts with identical keys, shapes and floating dtypes.
        weights: ``K`` finite non-negative weights (training-node counts), not all zero.

    Returns:
        A new state dict (fresh tensors; the inputs are not modified).

    Raises:
        ValueError: empty input, length mismatch, negative / non-finite / all-zero weights,
            mismatched keys or shapes, or a non-floating tensor.
    """
    if not states:
        raise ValueError("fedavg needs at least one state dict")
    if len(states) != len(weights):
        raise ValueError(f"got {len(states)} states but {len(weights)} weights")
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    if not torch.isfinite(w).all() or (w < 0).any():
        raise ValueError(f"weights must be finite and non-negative, got {list(weights)}")
    if w.sum() <= 0:
        raise ValueError("fedavg needs at least one positive weight")
    keys = list(states[0])
    for s in states[1:]:
        if list(s) != keys:
            raise ValueError("all state dicts must have the same keys in the same order")
    keep = torch.nonzero(w > 0).flatten().tolist()
    coef = w[keep] / w[keep].sum()
    out = {}
    for key in keys:
        ref = states[0][key]
        if not ref.is_floating_point():
            raise ValueError(f"fedavg averages floating-point tensors only; {key!r} is {ref.dtype}")
        if any(states[i][key].shape != ref.shape for i in keep):
            raise ValueError(f"shape mismatch for {key!r}")
        stacked = torch.stack([states[i][key].detach().to(torch.float64) for i in keep])  # (K', ...)
        out[key] = torch.tensordot(coef, stacked, dims=1).to(ref.dtype)
    return out


class Strategy:
    """How clients train and how the server combines them.

    Subclasses may add a term to the client's local loss (:meth:`local_penalty`) and override
    :meth:`aggregate`; the default is plain FedAvg.
    """

    name = "fedavg"

    def local_penalty(self, model: nn.Module, anchor: StateDict) -> torch.Tensor | None:
        """Extra term for the local loss given the round's global weights ``anchor``; None for none."""
        return None

    def client_optimizer(self, params: Iterable[torch.Tensor], lr: float,
                         weight_decay: float) -> torch.optim.Optimizer:
        """The optimiser a client trains with, built once so its state persists across rounds
        (default: Adam with the method's ``lr`` and ``weight_decay``)."""
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)

    def aggregate(self, states: Sequence[StateDict], weights: Sequence[float],
                  current: StateDict | None = None) -> StateDict:
        """Combine the sampled clients' states (weights: their training-node counts) into the next
        global state; ``current`` is the global state they started the round from."""
        return fedavg(states, weights)

    def config(self) -> dict:
        """Plain-value description for results files."""
        return {"strategy": self.name}

    def state_to_checkpoint(self) -> tuple[dict, dict[str, np.ndarray]]:
        """The server-side state a restart must carry, as (JSON meta, arrays); none by default."""
        return {}, {}

    def state_from_checkpoint(self, meta: dict, arrays: Mapping[str, np.ndarray], current: StateDict) -> None:
        """Load what :meth:`state_to_checkpoint` saved (``current``: the restored global state).

        Raises:
            fedgat.checkpoint.CheckpointMismatchError: state this strategy does not keep.
        """
        if meta:
            from fedgat.checkpoint import CheckpointMismatchError

            raise CheckpointMismatchError(f"the checkpoint holds {meta.get('name')!r} server state; "
                                          f"this server runs {self.name!r}")


class FedAvg(Strategy):
    """FedAvg: local loss unchanged, server takes the :func:`fedavg` weighted mean."""


class FedProx(Strategy):
    r"""FedProx (Li et al. 2020, eq. 2): client :math:`k` minimises
    :math:`F_k(w) + \frac{\mu}{2}\lVert w - w^t\rVert^2` with :math:`w^t` the round's global weights;
    the server aggregates as FedAvg.

    Raises:
        ValueError: ``mu`` negative or not finite.
    """

    name = "fedprox"

    def __init__(self, mu: float) -> None:
        if not (math.isfinite(mu) and mu >= 0):
            raise ValueError(f"FedProx mu must be finite and >= 0, got {mu!r}")
        self.mu = float(mu)

    def local_penalty(self, model: nn.Module, anchor: StateDict) -> torch.Tensor | None:
        if self.mu == 0:
            return None
        terms = [(p - anchor[name]).square().sum() for name, p in model.named_parameters()]
        return 0.5 * self.mu * torch.stack(terms).sum()

    def config(self) -> dict:
        return {"strategy": self.name, "mu": self.mu}


class FedAdam(Strategy):
    r"""FedAdam (Reddi et al. 2021, "Adaptive Federated Optimization", Algorithm 2): clients run
    plain SGD with step ``client_lr`` and the server moves the global weights with Adam, using the
    FedAvg mean as its pseudo-gradient,

    .. math::
        g^t = \frac{w^t - \sum_k \frac{n_k}{\sum_l n_l} w_k^{t+1}}{\eta_l}, \qquad
        w^{t+1} = \mathrm{Adam}(w^t, g^t + \lambda w^t).

    Why it exists: with FedAvg every client keeps its *own* Adam moments, and the mean of K
    independently normalised steps is not Adam's step on the pooled loss. With a few training labels
    per client (non-IID splits, many clients) that costs accuracy. Here the Adam state lives on the
    server; with one local epoch (``E = 1``) the pseudo-gradient is exactly the gradient of the
    pooled training loss (the mean over all sampled training nodes), so with every client sampled a
    FedAdam run is the centralised Adam run of the same model (``torch.optim.Adam`` with the same
    ``lr``, ``weight_decay``, ``betas``, ``eps``, bias correction included; tested). Weight decay is
    applied on the server as Adam's L2 term, so clients' SGD carries none. Only model weights move,
    as with FedAvg; the server's moments never leave it.

    Args:
        lr, weight_decay: the server's Adam step and L2 weight (the method's ``lr``, ``weight_decay``).
        client_lr: the clients' SGD step :math:`\eta_l`. With ``E = 1`` it cancels out of
            :math:`g^t`; with several local epochs it sets how far clients walk between rounds.
        betas, eps: Adam's.
        parameters: names of the state-dict entries that are trained (None: every entry); others
            (buffers) take the plain FedAvg mean.

    Raises:
        ValueError: a step, weight decay, beta or eps out of range.
    """

    name = "fedadam"

    def __init__(self, lr: float, weight_decay: float = 0.0, client_lr: float = 1.0,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 parameters: Iterable[str] | None = None) -> None:
        for label, v in (("lr", lr), ("client_lr", client_lr), ("eps", eps)):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"FedAdam {label} must be finite and > 0, got {v!r}")
        if not (math.isfinite(weight_decay) and weight_decay >= 0):
            raise ValueError(f"FedAdam weight_decay must be finite and >= 0, got {weight_decay!r}")
        if not all(0 <= b < 1 for b in betas) or len(betas) != 2:
            raise ValueError(f"FedAdam betas must be two numbers in [0, 1), got {betas!r}")
        self.lr, self.weight_decay, self.client_lr = float(lr), float(weight_decay), float(client_lr)
        self.betas, self.eps = (float(betas[0]), float(betas[1])), float(eps)
        self.parameters = None if parameters is None else frozenset(parameters)
        self._weights: dict[str, torch.Tensor] = {}
        self._optimizer: torch.optim.Optimizer | None = None

    def client_optimizer(self, params: Iterable[torch.Tensor], lr: float,
                         weight_decay: float) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.client_lr)

    def aggregate(self, states: Sequence[StateDict], weights: Sequence[float],
                  current: StateDict | None = None) -> StateDict:
        if current is None:
            raise ValueError("FedAdam needs the round's global state (current) to form its pseudo-gradient")
        mean = fedavg(states, weights)
        trained = [k for k in mean if self.parameters is None or k in self.parameters]
        if self._optimizer is None:
            self._start(current, trained)
        elif sorted(self._weights) != sorted(trained):
            raise ValueError("FedAdam got a state with other trained entries than in its first round")
        out = dict(mean)
        for k, w in self._weights.items():
            w.copy_(current[k])  # the server's weights are the global state (it may have been reloaded)
            w.grad = (current[k].to(torch.float64) - mean[k].to(torch.float64)).div_(self.client_lr).to(w.dtype)
        self._optimizer.step()
        for k, w in self._weights.items():
            out[k] = w.detach().clone()
        return out

    def config(self) -> dict:
        return {"strategy": self.name, "lr": self.lr, "weight_decay": self.weight_decay,
                "client_lr": self.client_lr, "betas": list(self.betas), "eps": self.eps}

    def _start(self, current: StateDict, trained: Sequence[str]) -> None:
        self._weights = {k: current[k].detach().clone() for k in trained}
        self._optimizer = torch.optim.Adam(list(self._weights.values()), lr=self.lr, betas=self.betas,
                                           eps=self.eps, weight_decay=self.weight_decay)

    def state_to_checkpoint(self) -> tuple[dict, dict[str, np.ndarray]]:
        """The server's Adam moments and step (they are the run's state as much as the weights)."""
        from fedgat.checkpoint import optimizer_to_checkpoint

        if self._optimizer is None:
            return {"name": self.name, "keys": None}, {}
        opt_meta, arrays = optimizer_to_checkpoint(self._optimizer, prefix="strategy/")
        return {"name": self.name, "keys": list(self._weights), "optimizer": opt_meta}, arrays

    def state_from_checkpoint(self, meta: dict, arrays: Mapping[str, np.ndarray], current: StateDict) -> None:
        from fedgat.checkpoint import CheckpointMismatchError, optimizer_from_checkpoint

        if meta.get("name") != self.name:
            raise CheckpointMismatchError(f"the checkpoint holds {meta.get('name')!r} server state; "
                                          f"this server runs {self.name!r}")
        if meta["keys"] is None:
            self._weights, self._optimizer = {}, None
            return
        if not set(meta["keys"]) <= set(current):
            raise CheckpointMismatchError("the checkpoint's FedAdam state names weights the model lacks")
        self._start(current, meta["keys"])
        assert self._optimizer is not None
        optimizer_from_checkpoint(self._optimizer, meta["optimizer"], arrays, prefix="strategy/")


STRATEGIES: tuple[str, ...] = ("fedavg", "fedadam")


def strategy_from_hparams(hp: dict, model: nn.Module | None = None) -> Strategy:
    """The strategy a method's hyper-parameters ask for: ``strategy`` "fedavg" (FedAvg, or FedProx
    when ``mu > 0``) or "fedadam" (:class:`FedAdam` with the method's ``lr``, ``weight_decay`` and
    ``client_lr``, training ``model``'s parameters; None: every state-dict entry).

    Raises:
        ValueError: an unknown strategy, or FedProx's ``mu`` asked for with FedAdam.
    """
    name = hp.get("strategy", "fedavg")
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {STRATEGIES}")
    mu = float(hp.get("mu", 0.0))
    if name == "fedadam":
        if mu > 0:
            raise ValueError("FedProx's mu applies to strategy 'fedavg'; FedAdam clients run plain SGD")
        parameters = None if model is None else [name for name, _ in model.named_parameters()]
        return FedAdam(hp["lr"], hp["weight_decay"], client_lr=hp.get("client_lr", 1.0), parameters=parameters)
    return FedProx(mu) if mu > 0 else FedAvg()


@dataclass
class LocalTask:
    """One forward pass of a client's model and the rows of its output that are scored.

    Attributes:
        inputs: positional arguments of ``model.forward``; the model returns logits ``(R, C)``.
        targets: split name (``"train"``, ``"val"``, ``"test"``) -> ``(rows, labels)``, both ``(T,)``
            int64: positions into the logits and the true classes there. A task whose targets are
            all empty is never run (``inputs`` may then be ``()``).
    """

    inputs: tuple
    targets: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def count(self, split: str) -> int:
        return int(self.targets[split][0].numel()) if split in self.targets else 0


class Counts(NamedTuple):
    """Evaluation counts of one client on one split; sums over clients pool exactly."""

    correct: int
    count: int
    loss_sum: float


class ClientUpdate(NamedTuple):
    """What a client sends back after local training."""

    state: StateDict
    num_train: int
    loss: float


class Client:
    """A federated client: local data, a model replica and an optimiser that persists across rounds.

    Args:
        client_id: index of the client.
        model: its model replica; global weights are loaded into it in place, so the optimiser's
            parameter references (and its Adam moments) survive from round to round.
        train: the task trained on (targets ``"train"``).
        evaluation: the task(s) evaluated on (targets ``"val"``, ``"test"``); one task may serve
            several splits (and may be ``train`` itself). Splits in separate tasks let the server
            evaluate validation alone every round.
        lr, weight_decay: optimiser settings (GAT: Adam, 0.005, 5e-4).
        local_epochs: full-batch optimiser steps per round (``E``).
        strategy: builds the client's optimiser (:meth:`Strategy.client_optimizer`; default Adam
            with ``lr`` and ``weight_decay``, FedAdam: SGD). Pass the run's strategy.
    """

    def __init__(
        self,
        client_id: int,
        model: nn.Module,
        train: LocalTask,
        evaluation: LocalTask | Sequence[LocalTask],
        *,
        lr: float = 0.005,
        weight_decay: float = 5e-4,
        local_epochs: int = 1,
        strategy: Strategy | None = None,
    ) -> None:
        if local_epochs < 1:
            raise ValueError(f"local_epochs must be >= 1, got {local_epochs}")
        self.client_id = client_id
        self.model = model
        self.train_task = train
        self.eval_tasks = [evaluation] if isinstance(evaluation, LocalTask) else list(evaluation)
        self.local_epochs = int(local_epochs)
        self.optimizer = (strategy if strategy is not None else FedAvg()).client_optimizer(
            model.parameters(), lr, weight_decay)

    def count(self, split: str) -> int:
        """Number of this client's nodes in ``split`` (over its evaluation tasks, or training)."""
        if split == "train":
            return self.train_task.count("train")
        return sum(t.count(split) for t in self.eval_tasks)

    @property
    def num_train(self) -> int:
        """Number of training nodes: the client's FedAvg weight."""
        return self.count("train")

    def fit(self, global_state: StateDict, strategy: Strategy) -> ClientUpdate:
        """Load ``global_state``, run ``local_epochs`` full-batch steps, return the new weights.

        A client without training nodes returns ``global_state`` unchanged with weight 0.
        """
        if self.num_train == 0:
            return ClientUpdate(global_state, 0, 0.0)
        self.model.load_state_dict(global_state)
        self.model.train()
        rows, labels = self.train_task.targets["train"]
        for _ in range(self.local_epochs):
            self.optimizer.zero_grad()
            loss = F.cross_entropy(self.model(*self.train_task.inputs)[rows], labels)
            penalty = strategy.local_penalty(self.model, global_state)
            (loss if penalty is None else loss + penalty).backward()
            self.optimizer.step()
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return ClientUpdate(state, self.num_train, float(loss.detach()))

    @torch.no_grad()
    def evaluate(self, global_state: StateDict, splits: Sequence[str] = ("val", "test")) -> dict[str, Counts]:
        """Counts of the global model on this client's owned nodes of each split (one forward per
        evaluation task that holds any of ``splits``)."""
        counts = {s: Counts(0, 0, 0.0) for s in splits}
        loaded = False
        for task in self.eval_tasks:
            present = [s for s in splits if task.count(s)]
            if not present:
                continue
            if not loaded:
                self.model.load_state_dict(global_state)
                self.model.eval()
                loaded = True
            logits = self.model(*task.inputs)
            for s in present:
                rows, labels = task.targets[s]
                out = logits[rows]
                c = Counts(int((out.argmax(1) == labels).sum()), int(labels.numel()),
                           float(F.cross_entropy(out, labels, reduction="sum")))
                counts[s] = Counts(*(a + b for a, b in zip(counts[s], c)))
        return counts


@dataclass
class FitResult:
    """Outcome of :meth:`Server.fit`: test accuracy at the round of best validation accuracy."""

    best_val_accuracy: float
    test_accuracy: float
    best_round: int
    rounds: int
    history: list[dict]


class Server:
    """Runs FedAvg-style rounds over in-process clients with early stopping on validation accuracy.

    Args:
        clients: the clients (ids are their positions).
        initial_state: the global weights of round 0.
        strategy: aggregation strategy; default :class:`FedAvg`.
        fraction: share of clients sampled per round, in ``(0, 1]``; ``max(1, round(fraction * K))``
            clients are drawn uniformly without replacement from a generator seeded by ``seed``.
        seed: seed of the client sampling.

    Raises:
        ValueError: no clients, ``fraction`` outside ``(0, 1]``, or no validation node anywhere.
    """

    def __init__(
        self,
        clients: Sequence[Client],
        initial_state: StateDict,
        strategy: Strategy | None = None,
        fraction: float = 1.0,
        seed: int = 0,
    ) -> None:
        if not clients:
            raise ValueError("a server needs at least one client")
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must lie in (0, 1], got {fraction!r}")
        if sum(c.count("val") for c in clients) == 0:
            raise ValueError("no client holds a validation node; early stopping needs some")
        self.clients = list(clients)
        self.state = {k: v.detach().clone() for k, v in initial_state.items()}
        self.strategy = strategy if strategy is not None else FedAvg()
        self.fraction = float(fraction)
        self.rng = np.random.default_rng(seed)
        self.best_state: StateDict = self.state

    @property
    def clients_per_round(self) -> int:
        return max(1, round(self.fraction * len(self.clients)))

    def sample_clients(self) -> list[int]:
        """Sorted ids of this round's clients (all of them, without drawing, when fraction is 1)."""
        k = self.clients_per_round
        if k == len(self.clients):
            return list(range(k))
        return sorted(self.rng.choice(len(self.clients), size=k, replace=False).tolist())

    def train_round(self) -> dict:
        """One round: sample, local training, aggregation. Returns the weighted mean training loss
        and the sampled ids. If no sampled client has training nodes the global state stays."""
        ids = self.sample_clients()
        updates = [self.clients[i].fit(self.state, self.strategy) for i in ids]
        weights = [u.num_train for u in updates]
        total = sum(weights)
        if total > 0:
            self.state = self.strategy.aggregate([u.state for u in updates], weights, self.state)
        loss = sum(u.loss * u.num_train for u in updates) / total if total else float("nan")
        return {"train_loss": loss, "clients": ids}

    def evaluate(self, splits: Sequence[str] = ("val", "test")) -> dict[str, float]:
        """Pooled accuracy and mean loss of the global model: ``{"val_accuracy", "val_loss", ...}``."""
        totals = {s: [0, 0, 0.0] for s in splits}
        for client in self.clients:
            for s, c in client.evaluate(self.state, splits).items():
                totals[s] = [a + b for a, b in zip(totals[s], c)]
        out = {}
        for s, (correct, count, loss_sum) in totals.items():
            out[f"{s}_accuracy"] = correct / count if count else float("nan")
            out[f"{s}_loss"] = loss_sum / count if count else float("nan")
        return out

    def fit(
        self,
        rounds: int,
        patience: int | None = None,
        callback: Callable[[int, dict], None] | None = None,
        test_every_round: bool = False,
    ) -> FitResult:
        """Train up to ``rounds`` rounds, evaluating the global model after each.

        The best round has the highest pooled validation accuracy (ties: lower validation loss); its
        test accuracy is reported and its weights kept in :attr:`best_state`. Training stops once
        ``patience`` rounds pass without a new best (None: never early).

        Args:
            rounds: maximum number of rounds, ``>= 1``.
            patience: early-stopping patience in rounds, ``>= 1``, or None.
            callback: called as ``callback(round, metrics)`` after every round.
            test_every_round: evaluate the test split after every round; by default only after rounds
                that set a new best (the only test numbers reported), which saves most of the
                evaluation time. History rows of other rounds then carry no ``test_*`` keys.
        """
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        if patience is not None and patience < 1:
            raise ValueError(f"patience must be >= 1 or None, got {patience}")
        history: list[dict] = []
        best = (-1.0, math.inf)
        best_round, best_test = 0, float("nan")
        for r in range(1, rounds + 1):
            metrics = {"round": r, **self.train_round()}
            metrics.update(self.evaluate(("val", "test") if test_every_round else ("val",)))
            key = (metrics["val_accuracy"], metrics["val_loss"])
            improved = key[0] > best[0] or (key[0] == best[0] and key[1] < best[1])
            if improved and not test_every_round:
                metrics.update(self.evaluate(("test",)))
            history.append(metrics)
            if callback is not None:
                callback(r, metrics)
            if improved:
                best, best_round, best_test = key, r, metrics["test_accuracy"]
                self.best_state = self.state
            elif patience is not None and r - best_round >= patience:
                break
        return FitResult(best[0], best_test, best_round, len(history), history)
