r"""Federated strategies, split in a client half and a server half (as Flower's ``ClientApp`` and
``Strategy``).

* :class:`ClientStrategy` -- how a client trains between two aggregations: its optimiser (Adam or
  SGD, built once so that its state persists across rounds) and an optional proximal term.
* :class:`ServerStrategy` -- how the server combines the clients' weights (:meth:`~ServerStrategy.aggregate`,
  or :meth:`~ServerStrategy.aggregate_mean` from their weighted mean alone, as secure aggregation gives it),
  its description for results files (:meth:`~ServerStrategy.config`), the state a restarted server
  must carry (:meth:`~ServerStrategy.state_to_checkpoint`), and the local training it asks its clients
  for (:meth:`~ServerStrategy.client_strategy`, what Flower's ``configure_fit`` sends).

Notation: client :math:`k` holds :math:`n_k` training nodes and local objective :math:`F_k`; round
:math:`t` samples clients :math:`S_t` and FedAvg (McMahan et al. 2017, Algorithm 1) sets
:math:`w^{t+1} = \sum_{k \in S_t} \frac{n_k}{\sum_{l \in S_t} n_l} w_k^{t+1}`.

Server strategies: :class:`FedAvg` (clients keep their own Adam; the default and the paper's),
:class:`FedProx` (FedAvg's mean; its clients add a proximal term) and :class:`FedAdam` (clients SGD,
the server runs Adam on the FedAvg mean's step; with one local epoch that is centralised Adam on the
pooled loss). :func:`strategy_from_hparams` builds both halves from a method's hyper-parameters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

__all__ = [
    "STRATEGIES",
    "ClientStrategy",
    "FedAdam",
    "FedAvg",
    "FedProx",
    "ServerStrategy",
    "StateDict",
    "StrategyPair",
    "fedavg",
    "strategy_from_hparams",
]

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


# ------------------------------------------------------------------------------------- client half
OPTIMIZERS: tuple[str, ...] = ("adam", "sgd")


@dataclass(frozen=True)
class ClientStrategy:
    r"""The client half of a strategy: how a client trains between two aggregations.

    Client :math:`k` takes ``local_epochs`` full-batch steps of ``optimizer`` on

    .. math::
        F_k(w) + \frac{\mu}{2}\lVert w - w^t\rVert^2

    with :math:`w^t` the round's global weights (the proximal term is FedProx's, Li et al. 2020,
    eq. 2; :math:`\mu = 0` leaves the local loss unchanged).

    Attributes:
        optimizer: "adam" (FedAvg's and FedProx's clients) or "sgd" (FedAdam's).
        lr, weight_decay: the optimiser's step and L2 weight; None: the method's (``Client``'s
            ``lr`` / ``weight_decay``).
        mu: the proximal weight :math:`\mu \ge 0`.

    Raises:
        ValueError: an unknown optimiser, or a step, weight decay or ``mu`` out of range.
    """

    optimizer: str = "adam"
    lr: float | None = None
    weight_decay: float | None = None
    mu: float = 0.0

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown client optimizer {self.optimizer!r}; choose one of {OPTIMIZERS}")
        if not (math.isfinite(self.mu) and self.mu >= 0):
            raise ValueError(f"FedProx mu must be finite and >= 0, got {self.mu!r}")
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"the client step lr must be finite and > 0, got {self.lr!r}")
        if self.weight_decay is not None and not (
            math.isfinite(self.weight_decay) and self.weight_decay >= 0
        ):
            raise ValueError(f"the client weight_decay must be finite and >= 0, got {self.weight_decay!r}")

    def make_optimizer(
        self, params: Iterable[torch.Tensor], lr: float, weight_decay: float, *, capturable: bool = False
    ) -> torch.optim.Optimizer:
        """The client's optimiser over ``params``, built once so that its state (Adam's moments)
        persists across rounds; ``lr``, ``weight_decay``: the method's, unless this strategy sets its own.
        ``capturable``: Adam keeps its step count on the device, so that a step can be captured as a
        CUDA graph (:mod:`fedgat.cuda_graphs`; SGD needs nothing)."""
        step = self.lr if self.lr is not None else lr
        decay = self.weight_decay if self.weight_decay is not None else weight_decay
        if self.optimizer == "sgd":  # weight_decay left at SGD's default when zero (as FedAdam's clients)
            return (
                torch.optim.SGD(params, lr=step, weight_decay=decay)
                if decay
                else torch.optim.SGD(params, lr=step)
            )
        return torch.optim.Adam(params, lr=step, weight_decay=decay, capturable=capturable)

    def local_penalty(self, model: nn.Module, anchor: StateDict) -> torch.Tensor | None:
        r""":math:`\frac{\mu}{2}\lVert w - w^t\rVert^2` over ``model``'s parameters, ``anchor`` being the
        round's global weights :math:`w^t`; None when :math:`\mu = 0`."""
        if self.mu == 0:
            return None
        terms = [(p - anchor[name]).square().sum() for name, p in model.named_parameters()]
        return 0.5 * self.mu * torch.stack(terms).sum()


# ------------------------------------------------------------------------------------- server half
class ServerStrategy:
    """The server half of a strategy: aggregation, its configuration, its checkpointed state, and the
    :class:`ClientStrategy` its clients run. The default is plain FedAvg with Adam clients."""

    name = "fedavg"

    def client_strategy(self) -> ClientStrategy:
        """The local training this server strategy expects of its clients (default: Adam with the
        method's ``lr`` and ``weight_decay``, no proximal term)."""
        return ClientStrategy()

    def aggregate(
        self, states: Sequence[StateDict], weights: Sequence[float], current: StateDict | None = None
    ) -> StateDict:
        """Combine the sampled clients' states (weights: their training-node counts) into the next
        global state; ``current`` is the global state they started the round from."""
        return self.aggregate_mean(fedavg(states, weights), float(sum(weights)), current)

    def aggregate_mean(
        self, mean: StateDict, total_weight: float, current: StateDict | None = None
    ) -> StateDict:
        r"""The next global state from the round's weighted mean alone,
        :math:`\bar w = \sum_k n_k w_k / \sum_k n_k` with :math:`\sum_k n_k` = ``total_weight > 0``: the
        path of secure aggregation, where the server never sees one client's state
        (:class:`fedgat.protocols.fedavg.ServerRounds`). :meth:`aggregate` is this applied to
        :func:`fedavg` of the states. FedAvg and FedProx take the mean as it is."""
        return mean

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

            raise CheckpointMismatchError(
                f"the checkpoint holds {meta.get('name')!r} server state; this server runs {self.name!r}"
            )


class FedAvg(ServerStrategy):
    """FedAvg: the server takes the :func:`fedavg` weighted mean; clients train with Adam, loss unchanged."""


class FedProx(FedAvg):
    r"""FedProx (Li et al. 2020, eq. 2): the server aggregates as FedAvg and asks its clients to
    minimise :math:`F_k(w) + \frac{\mu}{2}\lVert w - w^t\rVert^2` (:class:`ClientStrategy` with ``mu``),
    as Flower's ``FedProx`` sends ``proximal_mu`` in its fit configuration.

    Raises:
        ValueError: ``mu`` negative or not finite.
    """

    name = "fedprox"

    def __init__(self, mu: float) -> None:
        if not (math.isfinite(mu) and mu >= 0):
            raise ValueError(f"FedProx mu must be finite and >= 0, got {mu!r}")
        self.mu = float(mu)

    def client_strategy(self) -> ClientStrategy:
        return ClientStrategy(mu=self.mu)

    def config(self) -> dict:
        return {"strategy": self.name, "mu": self.mu}


class FedAdam(ServerStrategy):
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

    def __init__(
        self,
        lr: float,
        weight_decay: float = 0.0,
        client_lr: float = 1.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        parameters: Iterable[str] | None = None,
    ) -> None:
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

    def client_strategy(self) -> ClientStrategy:
        """Plain SGD with step ``client_lr`` and no weight decay (the server applies it)."""
        return ClientStrategy("sgd", lr=self.client_lr, weight_decay=0.0)

    def aggregate_mean(
        self, mean: StateDict, total_weight: float, current: StateDict | None = None
    ) -> StateDict:
        if current is None:
            raise ValueError("FedAdam needs the round's global state (current) to form its pseudo-gradient")
        trained = [k for k in mean if self.parameters is None or k in self.parameters]
        if self._optimizer is None:
            self._start(current, trained)
        elif sorted(self._weights) != sorted(trained):
            raise ValueError("FedAdam got a state with other trained entries than in its first round")
        assert self._optimizer is not None
        out = dict(mean)
        for k, w in self._weights.items():
            w.copy_(current[k])  # the server's weights are the global state (it may have been reloaded)
            w.grad = (
                (current[k].to(torch.float64) - mean[k].to(torch.float64)).div_(self.client_lr).to(w.dtype)
            )
        self._optimizer.step()
        for k, w in self._weights.items():
            out[k] = w.detach().clone()
        return out

    def config(self) -> dict:
        return {
            "strategy": self.name,
            "lr": self.lr,
            "weight_decay": self.weight_decay,
            "client_lr": self.client_lr,
            "betas": list(self.betas),
            "eps": self.eps,
        }

    def _start(self, current: StateDict, trained: Sequence[str]) -> None:
        self._weights = {k: current[k].detach().clone() for k in trained}
        self._optimizer = torch.optim.Adam(
            list(self._weights.values()),
            lr=self.lr,
            betas=self.betas,
            eps=self.eps,
            weight_decay=self.weight_decay,
        )

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
            raise CheckpointMismatchError(
                f"the checkpoint holds {meta.get('name')!r} server state; this server runs {self.name!r}"
            )
        if meta["keys"] is None:
            self._weights, self._optimizer = {}, None
            return
        if not set(meta["keys"]) <= set(current):
            raise CheckpointMismatchError("the checkpoint's FedAdam state names weights the model lacks")
        self._start(current, meta["keys"])
        assert self._optimizer is not None
        optimizer_from_checkpoint(self._optimizer, meta["optimizer"], arrays, prefix="strategy/")


# ------------------------------------------------------------------------------------- both halves
STRATEGIES: tuple[str, ...] = ("fedavg", "fedadam")


class StrategyPair(NamedTuple):
    """A run's strategy: the half its clients run and the half its server runs (``server`` chose
    ``client``: ``client == server.client_strategy()``)."""

    client: ClientStrategy
    server: ServerStrategy


def strategy_from_hparams(hp: dict, model: nn.Module | None = None) -> StrategyPair:
    """The strategy a method's hyper-parameters ask for, both halves: ``strategy`` "fedavg" (FedAvg,
    or FedProx when ``mu > 0``) or "fedadam" (:class:`FedAdam` with the method's ``lr``,
    ``weight_decay`` and ``client_lr``, training ``model``'s parameters; None: every state-dict
    entry). Give ``.client`` to the clients and ``.server`` to the server.

    Raises:
        ValueError: an unknown strategy, or FedProx's ``mu`` asked for with FedAdam.
    """
    name = hp.get("strategy", "fedavg")
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of {STRATEGIES}")
    mu = float(hp.get("mu", 0.0))
    server: ServerStrategy
    if name == "fedadam":
        if mu > 0:
            raise ValueError(
                "FedProx's mu applies to strategy 'fedavg' (FedAdam, the default, has clients run plain "
                "SGD): pass strategy 'fedavg' with mu (CLI: --strategy fedavg --mu ...)"
            )
        parameters = None if model is None else [name for name, _ in model.named_parameters()]
        server = FedAdam(
            hp["lr"], hp["weight_decay"], client_lr=hp.get("client_lr", 1.0), parameters=parameters
        )
    else:
        server = FedProx(mu) if mu > 0 else FedAvg()
    return StrategyPair(server.client_strategy(), server)
