r"""Federated training in one process: clients and a server, over the shared round loop.

Only model weights move during training. A :class:`Client` is built once with its local data (for
FedGAT: the encodings it received in the pre-training round; for the baselines whatever they need)
and the client half of the run's strategy (:class:`~fedgat.strategies.ClientStrategy`: its
optimiser, an optional proximal term); from then on it receives global weights, trains locally, and
returns a state dict plus its number of training nodes. The :class:`Server` drives the
:class:`~fedgat.rounds.RoundLoop` -- client sampling, aggregation by the server half of the strategy
(:class:`~fedgat.strategies.ServerStrategy`), pooled evaluation, early stopping, best model -- over
its in-process clients; :class:`fedgat.protocols.fedavg.ServerRounds` drives the same loop through
signed messages.

State dicts are plain ``dict[str, torch.Tensor]`` here; a transport (encrypted, Ray, Flower) wraps
them in its own messages and can call :func:`fedavg` directly.

Notation: client :math:`k` holds :math:`n_k` training nodes and local objective :math:`F_k`; round
:math:`t` samples clients :math:`S_t` and FedAvg (McMahan et al. 2017, Algorithm 1) sets
:math:`w^{t+1} = \sum_{k \in S_t} \frac{n_k}{\sum_{l \in S_t} n_l} w_k^{t+1}`.

The strategies (:mod:`fedgat.strategies`) and the round loop's types (:mod:`fedgat.rounds`) are
re-exported here: :class:`FedAvg` (clients keep their own Adam; the default and the paper's),
:class:`FedProx`, :class:`FedAdam` (clients SGD, the server runs Adam on the FedAvg mean's step),
:func:`strategy_from_hparams` (both halves), :class:`Counts`, :class:`ClientUpdate`,
:class:`FitResult`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedgat.cuda_graphs import GraphedStep
from fedgat.cuda_graphs import check_device as cuda_graphs_device
from fedgat.device import resolve_device, to_device
from fedgat.dp_fedavg import UpdateBudgetError, UpdateDP
from fedgat.rounds import ClientUpdate, Counts, FitResult, RoundLoop, pool_counts
from fedgat.strategies import (
    STRATEGIES,
    ClientStrategy,
    FedAdam,
    FedAvg,
    FedProx,
    ServerStrategy,
    StateDict,
    StrategyPair,
    fedavg,
    strategy_from_hparams,
)

__all__ = [
    "STRATEGIES",
    "Client",
    "ClientStrategy",
    "ClientUpdate",
    "Counts",
    "FedAdam",
    "FedAvg",
    "FedProx",
    "FitResult",
    "LocalTask",
    "NonFiniteUpdateError",
    "RoundLoop",
    "Server",
    "ServerStrategy",
    "StateDict",
    "StrategyPair",
    "as_client_strategy",
    "client_seed",
    "fedavg",
    "strategy_from_hparams",
    "stream_state",
]

logger = logging.getLogger(__name__)


class NonFiniteUpdateError(FloatingPointError):
    """Local training produced NaN or infinite weights (e.g. from huge global weights, or a
    diverging learning rate); the client refuses to return them. Not raised under DP-FedAvg
    (:attr:`Client.update_dp`): whether training diverges depends on the client's data, so there the
    update is released as the zero update instead (:meth:`fedgat.dp_fedavg.UpdateDP.privatize`)."""


def as_client_strategy(strategy: ClientStrategy | ServerStrategy | None) -> ClientStrategy:
    """The client half: ``strategy`` itself, the one a server strategy asks its clients for
    (:meth:`~fedgat.strategies.ServerStrategy.client_strategy`), or the default (Adam) for None."""
    if strategy is None:
        return ClientStrategy()
    if isinstance(strategy, ServerStrategy):
        return strategy.client_strategy()
    if not isinstance(strategy, ClientStrategy):
        raise TypeError(f"expected a ClientStrategy (or a ServerStrategy), got {type(strategy).__name__}")
    return strategy


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


def client_seed(seed: int, client_id: int, purpose: str = "training") -> int:
    """The seed of client ``client_id``'s own random stream for ``purpose`` (``"training"``: the
    model's rounds; ``"predictor"``: the DP release predictor's) in a run seeded ``seed`` (63 bits
    of SHA-256 of all three): streams of different clients, purposes or run seeds are unrelated.
    Dropout masks protect nothing, so a seeded stream is fine here (DP noise never comes from one:
    :mod:`fedgat.randomness`)."""
    text = f"fedgat-client-stream:{purpose}:{int(seed)}:{int(client_id)}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def stream_state(seed: int) -> torch.Tensor:
    """The state of a fresh CPU torch stream seeded ``seed`` (what :attr:`Client.rng_state` holds)."""
    return torch.Generator().manual_seed(int(seed)).get_state()


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
        lr, weight_decay: the method's optimiser settings (GAT: Adam, 0.005, 5e-4), used unless the
            strategy sets its own.
        local_epochs: full-batch optimiser steps per round (``E``).
        strategy: the client half of the run's strategy (:attr:`StrategyPair.client`): the optimiser
            it builds and the proximal term of its local loss; a server strategy stands for the client
            half it asks for (:meth:`ServerStrategy.client_strategy`); default Adam, no penalty.
        update_dp: client-level DP of its updates and evaluation counts
            (:class:`fedgat.dp_fedavg.UpdateDP`; None: off): each update is clipped and noised
            before it leaves :meth:`fit`, sent with weight 1 and no loss, each evaluation's counts
            before they leave :meth:`release_counts`, and the client makes at most
            ``update_dp.max_releases`` such releases.
        device: where the client trains (:func:`fedgat.device.resolve_device`: "cpu", the default,
            "cuda", "cuda:N", "auto" or a ``torch.device``). On another device than the CPU the
            model (so its optimiser's state), the tasks' inputs (encodings through
            :meth:`~fedgat.encodings.Encodings.to`, edge indices) and their target rows and labels
            move there once, here; the local steps then run without a host round trip, and the
            weights cross back to the CPU once per round, in the state :meth:`fit` returns. The
            global weights :meth:`fit` and :meth:`evaluate` take stay CPU tensors (the server's).
        cuda_graphs: on a CUDA device, run the local step as one captured CUDA graph
            (:class:`fedgat.cuda_graphs.GraphedStep`: the first 3 steps eager, then replays; Adam
            built with ``capturable=True``). The same maths with fewer launches; dropout draws its
            masks from the same generator but not the same ones as eager steps, and the proximal
            anchor is copied into a fixed device buffer each round. ``ValueError`` elsewhere.
        seed: give the client a random stream of its own (its dropout masks), seeded so
            (:func:`client_seed` derives one per client from a run's seed): local training then
            draws the same masks whatever the other clients do and wherever the client runs (in
            this process, a worker process, a Ray actor, a Flower ClientApp), so every engine trains
            the same model. None: the process-wide stream (``torch.manual_seed``). It is the CPU's
            stream: on a GPU, dropout draws from the device's generator, shared by the clients of
            the process (the hosted engines train on the CPU).

    Attributes:
        training: the client half in use (:class:`ClientStrategy`).
        dp_releases: releases (training rounds and evaluations) this client made under
            ``update_dp`` (what its budget has spent).
        device: the resolved :class:`torch.device`.
        rng_state: the state of its own random stream (``seed``), between rounds; None without one.
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
        strategy: ClientStrategy | ServerStrategy | None = None,
        update_dp: UpdateDP | None = None,
        device: str | torch.device | None = None,
        cuda_graphs: bool = False,
        seed: int | None = None,
    ) -> None:
        if local_epochs < 1:
            raise ValueError(f"local_epochs must be >= 1, got {local_epochs}")
        self.client_id = client_id
        self.device = resolve_device(device)
        if cuda_graphs:
            cuda_graphs_device(self.device)
        evaluations = [evaluation] if isinstance(evaluation, LocalTask) else list(evaluation)
        if self.device.type != "cpu":  # the CPU path is left exactly as it was
            model.to(self.device)
            memo: dict[int, object] = {}  # a task serving training and evaluation moves once
            train, *evaluations = [_task_to(t, self.device, memo) for t in (train, *evaluations)]
        self.model = model
        self.train_task = train
        self.eval_tasks = evaluations
        self.local_epochs = int(local_epochs)
        self.training = as_client_strategy(strategy)
        self.optimizer = self.training.make_optimizer(
            model.parameters(), lr, weight_decay, capturable=cuda_graphs
        )
        self.update_dp = update_dp
        self.dp_releases = 0
        self.rng_state: torch.Tensor | None = None if seed is None else stream_state(seed)
        self._anchor: StateDict | None = None  # the proximal anchor's fixed device buffers (graphs)
        self._graphed = (
            GraphedStep(lambda: self._step_losses(self._anchor), self.optimizer) if cuda_graphs else None
        )

    @classmethod
    def from_hparams(
        cls,
        client_id: int,
        model: nn.Module,
        train: LocalTask,
        evaluation: LocalTask | Sequence[LocalTask],
        hp: Mapping[str, Any],
        *,
        strategy: ClientStrategy | ServerStrategy | None = None,
        update_dp: UpdateDP | None = None,
        device: str | torch.device | None = None,
        cuda_graphs: bool = False,
        seed: int | None = None,
    ) -> Client:
        """A client with the optimiser settings of resolved hyper-parameters ``hp`` (``lr``,
        ``weight_decay``, ``local_epochs``), training on ``device`` (with ``cuda_graphs``), drawing
        from a stream of its own when ``seed`` is given."""
        return cls(
            client_id,
            model,
            train,
            evaluation,
            lr=hp["lr"],
            weight_decay=hp["weight_decay"],
            local_epochs=hp["local_epochs"],
            strategy=strategy,
            update_dp=update_dp,
            device=device,
            cuda_graphs=cuda_graphs,
            seed=seed,
        )

    def count(self, split: str) -> int:
        """Number of this client's nodes in ``split`` (over its evaluation tasks, or training)."""
        if split == "train":
            return self.train_task.count("train")
        return sum(t.count(split) for t in self.eval_tasks)

    @property
    def num_train(self) -> int:
        """Number of training nodes: the client's FedAvg weight."""
        return self.count("train")

    def fit(self, global_state: StateDict) -> ClientUpdate:
        """Load ``global_state``, run ``local_epochs`` full-batch steps of :attr:`training` (its
        proximal term anchored at ``global_state``), return the new weights.

        A client without training nodes returns ``global_state`` unchanged with weight 0. Under
        :attr:`update_dp` every client returns ``global_state`` plus its clipped, noised update
        (:meth:`fedgat.dp_fedavg.UpdateDP.privatize`; zero update without training nodes) with weight
        1 and loss NaN (not sent). The release is charged before anything reads the client's data, and
        nothing observable depends on the data before the noise: a non-finite update is released as
        the zero update (plus its noise), not refused (a twelfth review pass: the refusal was an
        exact, uncharged bit of the data, e.g. whether one training node has a feature).

        Raises:
            NonFiniteUpdateError: without :attr:`update_dp`, the trained weights hold NaN or infinite
                values (naming the first such weight); nothing is returned.
            UpdateBudgetError: under :attr:`update_dp`, the client has made its
                ``max_releases`` releases already; nothing is returned.
        """
        dp = self.update_dp
        self._check_budget()
        if dp is not None:
            self.dp_releases += 1  # charged whatever happens next (reviews 11 and 12)
        if self.num_train == 0:
            if dp is not None:
                return ClientUpdate(dp.privatize(global_state, global_state), 1, float("nan"))
            return ClientUpdate(global_state, 0, 0.0)
        if self.rng_state is None:
            return self._train(global_state)
        with torch.random.fork_rng(devices=[]):  # the process-wide stream is left as it was
            torch.set_rng_state(self.rng_state)
            update = self._train(global_state)
            self.rng_state = torch.get_rng_state()  # only once the update exists (no step on a failure)
        return update

    def _train(self, global_state: StateDict) -> ClientUpdate:
        """:meth:`fit`'s local steps from ``global_state``, drawing from the current stream."""
        dp = self.update_dp
        self.model.load_state_dict(global_state)  # copies the CPU weights into the device's
        self.model.train()
        if self._graphed is not None:
            self._set_anchor(global_state)
            for _ in range(self.local_epochs):
                loss = self._graphed()
        else:
            # the proximal term's anchor on the model's device, moved once per round
            anchor = global_state if self.device.type == "cpu" else to_device(global_state, self.device)
            for _ in range(self.local_epochs):
                self.optimizer.zero_grad()
                objective, loss = self._step_losses(anchor)
                objective.backward()
                self.optimizer.step()
        # the protocol boundary: the weights leave as CPU tensors (one copy per round from a device);
        # the loss below is read once per round, after the steps
        if self.device.type == "cpu":
            state = {k: _to_host(v) for k, v in self.model.state_dict().items()}
            bad = next(
                (k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())),
                None,
            )
        else:
            state, bad = _state_to_host(self.model.state_dict())
        if dp is not None:  # no branch on the un-noised weights: privatize releases a bad update as zero
            if bad is not None:
                logger.warning(
                    "client %d: local training produced NaN or infinite values in %r; under DP-FedAvg "
                    "it releases the zero update (plus its noise) instead",
                    self.client_id,
                    bad,
                )
            return ClientUpdate(dp.privatize(state, global_state), 1, float("nan"))
        if bad is not None:
            raise NonFiniteUpdateError(
                f"client {self.client_id}: local training produced NaN or infinite values in {bad!r} "
                f"(loss {float(loss.detach()):.3g})"
            )
        return ClientUpdate(state, self.num_train, float(loss.detach()))

    def _set_anchor(self, global_state: StateDict) -> None:
        """Copy this round's global weights into the proximal anchor's fixed device buffers (a
        captured step reads the same storage at every replay); nothing without a proximal term."""
        if self.training.mu == 0:
            return
        if self._anchor is None:
            self._anchor = to_device(global_state, self.device)
        else:
            with torch.no_grad():
                for name, buffer in self._anchor.items():
                    buffer.copy_(global_state[name])

    def _step_losses(self, anchor: StateDict | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The local step's objective (cross entropy plus the proximal term anchored at ``anchor``,
        None: no term) and its reported loss (the cross entropy). Rows by ``index_select``: a
        captured step must not synchronise with the host, as boolean indexing would."""
        rows, labels = self.train_task.targets["train"]
        loss = F.cross_entropy(self.model(*self.train_task.inputs).index_select(0, rows), labels)
        penalty = None if anchor is None else self.training.local_penalty(self.model, anchor)
        return (loss if penalty is None else loss + penalty), loss

    def _check_budget(self) -> None:
        """Raise :class:`UpdateBudgetError` when :attr:`update_dp`'s releases are all spent."""
        dp = self.update_dp
        if dp is not None and self.dp_releases >= dp.max_releases:
            raise UpdateBudgetError(
                f"client {self.client_id}: its DP budget pays for {dp.max_releases} releases "
                f"({dp.max_rounds} rounds of training and {dp.evaluations} evaluations), all spent"
            )

    def release_counts(self, global_state: StateDict, splits: Sequence[str]) -> dict[str, Counts]:
        """The counts of :meth:`evaluate` as they leave the client: exact, or under
        :attr:`update_dp` clipped and noised as one release of its budget
        (:meth:`fedgat.dp_fedavg.UpdateDP.privatize_counts`), charged before the evaluation runs.

        Raises:
            UpdateBudgetError: under :attr:`update_dp`, the client has made its ``max_releases``
                releases already; nothing is evaluated.
        """
        self._check_budget()
        if self.update_dp is None:
            return self.evaluate(global_state, splits)
        self.dp_releases += 1
        return self.update_dp.privatize_counts(self.evaluate(global_state, splits))

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
                c = Counts(
                    int((out.argmax(1) == labels).sum()),
                    int(labels.numel()),
                    float(F.cross_entropy(out, labels, reduction="sum")),
                )
                counts[s] = Counts(
                    counts[s].correct + c.correct, counts[s].count + c.count, counts[s].loss_sum + c.loss_sum
                )
        return counts


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A detached CPU copy of ``t`` (a clone on the CPU, as before devices existed)."""
    t = t.detach()
    return t.clone() if t.device.type == "cpu" else t.to("cpu")


def _state_to_host(state: StateDict) -> tuple[StateDict, str | None]:
    """A device's state dict on the CPU with one copy per dtype, and the name of its first floating
    entry holding NaN or infinity (None if all are finite), checked on the device with one read-back.

    Per tensor, a copy to the host and a finiteness check each wait for the device: a dozen
    synchronisations per client per round, where one suffices. The CPU tensors are views of one
    buffer per dtype, so they share its storage (as the values of one update do anyway)."""
    names = list(state)
    groups: dict[torch.dtype, list[str]] = {}
    for name in names:
        groups.setdefault(state[name].dtype, []).append(name)
    host: dict[str, torch.Tensor] = {}
    finite: list[torch.Tensor] = []
    for dtype, members in groups.items():
        flat = torch.cat([state[n].detach().reshape(-1) for n in members])
        if dtype.is_floating_point:
            finite.append(torch.isfinite(flat).all().reshape(1))
        parts = flat.to("cpu").split([state[n].numel() for n in members])
        host.update({n: p.view(state[n].shape) for n, p in zip(members, parts, strict=True)})
    ordered = {n: host[n] for n in names}
    if finite and not bool(torch.cat(finite).all()):
        bad = next(
            n for n in names if ordered[n].is_floating_point() and not bool(torch.isfinite(ordered[n]).all())
        )
        return ordered, bad
    return ordered, None


def _task_to(task: LocalTask, device: torch.device, memo: dict[int, object]) -> LocalTask:
    """``task`` with its inputs and targets on ``device`` (objects shared through ``memo`` move once)."""
    if id(task) not in memo:
        memo[id(task)] = LocalTask(
            to_device(task.inputs, device, memo), to_device(task.targets, device, memo)
        )
    moved = memo[id(task)]
    assert isinstance(moved, LocalTask)
    return moved


class Server:
    """Runs federated rounds over in-process clients: the :class:`~fedgat.rounds.RoundLoop` driven
    by calling the clients one after the other.

    Args:
        clients: the clients (ids are their positions).
        initial_state: the global weights of round 0.
        strategy: the server half of the strategy; default :class:`FedAvg`.
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
        strategy: ServerStrategy | None = None,
        fraction: float = 1.0,
        seed: int = 0,
    ) -> None:
        if not clients:
            raise ValueError("a server needs at least one client")
        self.loop = RoundLoop(len(clients), initial_state, strategy, fraction=fraction, seed=seed)
        if sum(c.count("val") for c in clients) == 0:
            raise ValueError("no client holds a validation node; early stopping needs some")
        self.clients = list(clients)

    @property
    def state(self) -> StateDict:
        """The global weights."""
        return self.loop.state

    @property
    def best_state(self) -> StateDict:
        """The weights of the best validation round (the initial ones before any)."""
        return self.loop.best_state

    @property
    def strategy(self) -> ServerStrategy:
        return self.loop.strategy

    @property
    def fraction(self) -> float:
        return self.loop.fraction

    @property
    def rng(self) -> np.random.Generator:
        return self.loop.rng

    @property
    def clients_per_round(self) -> int:
        return self.loop.clients_per_round

    def sample_clients(self) -> list[int]:
        """Sorted ids of a round's clients (:meth:`fedgat.rounds.RoundLoop.sample`)."""
        return self.loop.sample()

    def _fit(self, ids: Sequence[int]) -> list[ClientUpdate]:
        return [self.clients[i].fit(self.loop.state) for i in ids]

    def train_round(self) -> dict:
        """One round's training alone: sample, local training, aggregation (no evaluation, no
        bookkeeping). Returns the weighted mean training loss and the sampled ids. If no sampled
        client has training nodes the global state stays."""
        ids = self.sample_clients()
        return self.loop.aggregate(ids, self._fit(ids))

    def _reports(self, splits: Sequence[str]) -> list[dict[str, Counts]]:
        return [client.release_counts(self.loop.state, splits) for client in self.clients]

    def evaluate(self, splits: Sequence[str] = ("val", "test")) -> dict[str, float]:
        """Pooled accuracy and mean loss of the global model: ``{"val_accuracy", "val_loss", ...}``
        (the simulation's exact counts, outside any DP budget: what :meth:`fit` sees is
        :meth:`Client.release_counts`)."""
        return pool_counts([c.evaluate(self.loop.state, splits) for c in self.clients], splits)

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
                evaluation time. History rows of other rounds then carry no ``test_*`` keys. Always
                on under DP-FedAvg: each round's counts are then one release of the budget.
        """
        loop = self.loop
        dp = any(c.update_dp is not None for c in self.clients)
        loop.begin(rounds, patience, test_every_round or dp)
        while not loop.done:
            ids = loop.sample()
            splits = loop.on_updates(ids, self._fit(ids))
            while splits:
                splits = loop.on_reports(splits, self._reports(splits))
            if callback is not None:
                callback(loop.round, loop.history[-1])
        assert loop.result is not None
        return loop.result
