r"""The round loop of federated training, written once for every engine.

:class:`RoundLoop` is pure: no clients, no messages, no clock. It holds the global weights, the
:class:`~fedgat.strategies.ServerStrategy`, the seeded client sampler, the history and the
best-validation model; a driver tells it what the clients sent and it says what happens next. Two
drivers use it: :meth:`fedgat.federated.Server.fit` (clients in this process, called one after the
other) and :class:`fedgat.protocols.fedavg.ServerRounds` (signed messages, deadlines, quorum and
checkpoints; every engine -- in-process, Ray, Flower -- runs that state machine). Same seeds, same
calls: bit-identical weights and histories.

Round :math:`t` of at most ``rounds`` (clients :math:`0..K-1`, that order fixing every sum):

1. :meth:`RoundLoop.sample` -- :math:`S_t`: :math:`m = \max(1, \mathrm{round}(C K))` clients drawn
   uniformly without replacement from a generator seeded once (all :math:`K`, without a draw, when
   :math:`m = K`).
2. :meth:`RoundLoop.on_updates` -- the clients :math:`A_t \subseteq S_t` that answered sent
   :math:`(w_k^t, n_k, L_k)`; the strategy aggregates them (FedAvg:
   :math:`w^t = \sum_{k \in A_t} \frac{n_k}{\sum_{l \in A_t} n_l} w_k^t`, weights renormalised over
   :math:`A_t`; unchanged if :math:`\sum n_k = 0`) and the training loss is
   :math:`\sum_k n_k L_k / \sum_k n_k`. Returns the splits to evaluate :math:`w^t` on.
   :meth:`RoundLoop.on_aggregate` is the same step from the aggregate alone
   (:math:`\bar w = \sum_k n_k w_k^t / \sum_k n_k`, :math:`\sum_k n_k`, :math:`\sum_k n_k L_k`), the
   strategy's :meth:`~fedgat.strategies.ServerStrategy.aggregate_mean`: that is what
   :class:`~fedgat.protocols.fedavg.ServerRounds` gets under secure aggregation (its default), while
   :meth:`fedgat.federated.Server.fit`, an in-process simulator (the accuracy tables), aggregates the
   clients' states in the clear. Both give the same weights up to float64 rounding of the mean.
3. :meth:`RoundLoop.on_reports` -- pooled counts over the clients that reported,
   :math:`\mathrm{acc} = \sum_k c_k / \sum_k n_k`, :math:`\mathrm{loss} = \sum_k \ell_k / \sum_k n_k`.
   The test split is asked for only when validation sets a new best (highest accuracy, ties: lower
   loss), unless ``test_every_round``. Then the round ends: its row joins the history, a new best
   keeps :math:`w^t` as the best model, and the run stops after ``rounds`` rounds or once
   ``patience`` rounds pass without a new best.

A driver may sample round :math:`t + 1` before round :math:`t`'s evaluation ends (the protocol
sends one message for both; :attr:`RoundLoop.more_rounds` says whether a next round can come): the
generator is used by the sampler alone, so the draws are the same either way.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from fedgat.checkpoint import CheckpointMismatchError, arrays_to_tensors, tensors_to_arrays
from fedgat.strategies import FedAvg, ServerStrategy, StateDict

__all__ = ["ClientUpdate", "Counts", "FitResult", "RoundLoop", "exact_weights", "pool_counts"]


class Counts(NamedTuple):
    """Evaluation counts of one client on one split; sums over clients pool exactly. Integers, except
    under DP-FedAvg, where a client releases them clipped and noised
    (:meth:`fedgat.dp_fedavg.UpdateDP.privatize_counts`)."""

    correct: float
    count: float  # type: ignore[assignment]  # the field shadows tuple.count
    loss_sum: float


class ClientUpdate(NamedTuple):
    """What a client sends back after local training (a client without training nodes: weight 0 and
    the global state it was given)."""

    state: StateDict
    num_train: int
    loss: float


@dataclass
class FitResult:
    """Outcome of a run: test accuracy at the round of best validation accuracy, and the global
    model's weights at that round (``model_state``, a state dict for ``load_state_dict``; None where
    a caller built the result without them)."""

    best_val_accuracy: float
    test_accuracy: float
    best_round: int
    rounds: int
    history: list[dict] = field(repr=False)
    model_state: StateDict | None = field(default=None, repr=False, compare=False)


def pool_counts(reports: Sequence[Mapping[str, Counts]], splits: Sequence[str]) -> dict[str, float]:
    """Pooled accuracy and mean loss of each split over the clients' reports (summed in the order
    given): ``{"val_accuracy", "val_loss", ...}``; NaN for a split without a node. Noised counts
    (DP-FedAvg) are post-processed: NaN when the pooled count is not positive, accuracy clamped to
    [0, 1]."""
    out = {}
    for s in splits:
        totals: list = [0, 0, 0.0]
        for report in reports:
            totals = [a + b for a, b in zip(totals, report[s])]
        correct, count, loss_sum = totals
        out[f"{s}_accuracy"] = min(max(correct / count, 0.0), 1.0) if count > 0 else float("nan")
        out[f"{s}_loss"] = loss_sum / count if count > 0 else float("nan")
    return out


def exact_weights(loaded: StateDict, reference: StateDict) -> StateDict:
    """Checkpointed weights, checked against the model's names, shapes and dtypes."""
    if list(loaded) != list(reference) or any(
        loaded[k].shape != reference[k].shape or loaded[k].dtype != reference[k].dtype for k in reference
    ):
        raise CheckpointMismatchError("checkpointed weights do not match the model")
    return loaded


class RoundLoop:
    """Federated rounds without I/O (see the module docstring).

    Args:
        num_clients: ``K``; clients are ``0..K-1`` in every call.
        initial_state: the global weights of round 0 (copied).
        strategy: the server half of the strategy; default :class:`~fedgat.strategies.FedAvg`.
        fraction: share of clients sampled per round, in ``(0, 1]``.
        seed: seed of the client sampling.
        rounds, patience, test_every_round: as :meth:`begin`; None: call :meth:`begin` before the
            first round.

    Raises:
        ValueError: no clients, or ``fraction`` outside ``(0, 1]``.
    """

    def __init__(
        self,
        num_clients: int,
        initial_state: StateDict,
        strategy: ServerStrategy | None = None,
        *,
        fraction: float = 1.0,
        seed: int = 0,
        rounds: int | None = None,
        patience: int | None = None,
        test_every_round: bool = False,
    ) -> None:
        if num_clients < 1:
            raise ValueError("a server needs at least one client")
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must lie in (0, 1], got {fraction!r}")
        self.num_clients = int(num_clients)
        self.state: StateDict = {k: v.detach().clone() for k, v in initial_state.items()}
        self.strategy = strategy if strategy is not None else FedAvg()
        self.fraction = float(fraction)
        self.rng = np.random.default_rng(seed)
        self.best_state: StateDict = self.state
        self.rounds: int | None = None
        self.patience: int | None = None
        self.test_every_round = False
        self._reset()
        if rounds is not None:
            self.begin(rounds, patience, test_every_round)

    def _reset(self) -> None:
        self.history: list[dict] = []
        self.metrics: dict | None = None  # the row of the round under evaluation
        self.round = 0  # the last round whose updates were aggregated
        self.best = (-1.0, math.inf)  # (validation accuracy, validation loss) of the best round
        self.best_round, self.best_test = 0, float("nan")
        self.improved = False  # whether the round under evaluation (or the last one) set a new best
        self.result: FitResult | None = None

    def begin(self, rounds: int, patience: int | None = None, test_every_round: bool = False) -> None:
        """Start a run of at most ``rounds`` rounds from the current weights (fresh history).

        Args:
            rounds: maximum number of rounds, ``>= 1``.
            patience: early-stopping patience in rounds, ``>= 1``, or None (never early).
            test_every_round: evaluate the test split after every round; by default only after rounds
                that set a new best (the only test numbers reported). History rows of other rounds
                then carry no ``test_*`` keys.
        """
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        if patience is not None and patience < 1:
            raise ValueError(f"patience must be >= 1 or None, got {patience}")
        self.rounds, self.patience, self.test_every_round = int(rounds), patience, bool(test_every_round)
        self._reset()

    # --- where the run stands -----------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """The run has ended (``rounds`` reached or early stopping); :attr:`result` is set."""
        return self.result is not None

    @property
    def evaluating(self) -> bool:
        """A round's updates are aggregated and its evaluation has not ended."""
        return self.metrics is not None

    @property
    def more_rounds(self) -> bool:
        """Another round may follow the last aggregated one (``rounds`` not reached and the run not
        over; early stopping may still end it after this round's evaluation)."""
        return not self.done and self.rounds is not None and self.round < self.rounds

    @property
    def clients_per_round(self) -> int:
        return max(1, round(self.fraction * self.num_clients))

    # --- a round ------------------------------------------------------------------------------------
    def sample(self) -> list[int]:
        """Sorted ids of a round's clients (all of them, without drawing, when fraction is 1)."""
        k = self.clients_per_round
        if k == self.num_clients:
            return list(range(k))
        return sorted(self.rng.choice(self.num_clients, size=k, replace=False).tolist())

    def aggregate(
        self, clients: Sequence[int], updates: Sequence[ClientUpdate], missing: Sequence[int] = ()
    ) -> dict:
        """Aggregate ``updates`` (of ``clients``, in that order) into :attr:`state` through the
        strategy, without round bookkeeping. If no update carries training nodes the state stays.

        Returns:
            ``{"train_loss": weighted mean loss, "clients": ids}`` and, if some sampled clients did
            not answer, ``"missing_fit": missing``.
        """
        weights = [u.num_train for u in updates]
        total = sum(weights)
        if total > 0:
            self.state = self.strategy.aggregate([u.state for u in updates], weights, self.state)
        loss = sum(u.loss * u.num_train for u in updates) / total if total else float("nan")
        out: dict = {"train_loss": loss, "clients": list(clients)}
        if missing:
            out["missing_fit"] = list(missing)
        return out

    def aggregate_mean(
        self,
        clients: Sequence[int],
        mean: StateDict | None,
        total_weight: float,
        loss_sum: float,
        missing: Sequence[int] = (),
    ) -> dict:
        r""":meth:`aggregate` from the round's aggregate alone -- the weighted mean ``mean`` of the
        states, their total weight :math:`\sum_k n_k` and :math:`\sum_k n_k L_k` -- as secure
        aggregation gives it: the strategy's :meth:`~fedgat.strategies.ServerStrategy.aggregate_mean`.
        With ``total_weight`` 0 (or ``mean`` None) the state stays."""
        if total_weight > 0 and mean is not None:
            self.state = self.strategy.aggregate_mean(mean, float(total_weight), self.state)
        loss = loss_sum / total_weight if total_weight > 0 else float("nan")
        out: dict = {"train_loss": loss, "clients": list(clients)}
        if missing:
            out["missing_fit"] = list(missing)
        return out

    def on_updates(
        self, clients: Sequence[int], updates: Sequence[ClientUpdate], missing: Sequence[int] = ()
    ) -> tuple[str, ...]:
        """The next round's updates arrived (``clients``: those that answered, ``missing``: sampled
        ones that did not): aggregate them and open the round's history row.

        Returns:
            The splits to evaluate the new :attr:`state` on.

        Raises:
            RuntimeError: no run begun, the run is over, or the last round is still under evaluation.
        """
        self._check_open()
        return self._open_round(self.aggregate(clients, updates, missing))

    def on_aggregate(
        self,
        clients: Sequence[int],
        mean: StateDict | None,
        total_weight: float,
        loss_sum: float,
        missing: Sequence[int] = (),
    ) -> tuple[str, ...]:
        """:meth:`on_updates` for a securely aggregated round: the server holds only the weighted mean
        of the updates of ``clients``, their total weight and their weighted loss sum
        (:meth:`aggregate_mean`). Same returns and errors."""
        self._check_open()
        return self._open_round(self.aggregate_mean(clients, mean, total_weight, loss_sum, missing))

    def _check_open(self) -> None:
        if self.rounds is None or self.done or self.evaluating:
            raise RuntimeError("on_updates needs a run under way with no round under evaluation")

    def _open_round(self, row: dict) -> tuple[str, ...]:
        self.round += 1
        self.metrics = {"round": self.round, **row}
        return ("val", "test") if self.test_every_round else ("val",)

    def on_reports(
        self, splits: Sequence[str], reports: Sequence[Mapping[str, Counts]], missing: Sequence[int] = ()
    ) -> tuple[str, ...]:
        """Evaluation reports of :attr:`state` on ``splits`` arrived (one per client that reported, in
        client order; ``missing``: clients asked that did not report).

        Returns:
            Further splits to evaluate the same weights on (``("test",)`` after a new best), or ``()``
            when the round has ended (then :attr:`done` says whether the run has).

        Raises:
            RuntimeError: no round under evaluation.
        """
        if self.metrics is None:
            raise RuntimeError("on_reports needs a round under evaluation")
        if missing:
            self.metrics[f"missing_eval_{'_'.join(splits)}"] = list(missing)
        self.metrics.update(pool_counts(reports, splits))
        if "val" in splits:
            key = (self.metrics["val_accuracy"], self.metrics["val_loss"])
            self.improved = key[0] > self.best[0] or (key[0] == self.best[0] and key[1] < self.best[1])
            if self.improved and "test" not in splits:
                return ("test",)
        self._end_round()
        return ()

    def _end_round(self) -> None:
        """History, best round and early stopping."""
        metrics, self.metrics = self.metrics, None
        assert metrics is not None and self.rounds is not None
        self.history.append(metrics)
        r = metrics["round"]
        stop = r >= self.rounds
        if self.improved:
            self.best = (metrics["val_accuracy"], metrics["val_loss"])
            self.best_round, self.best_test = r, metrics["test_accuracy"]
            self.best_state = self.state  # the weights just evaluated
        elif self.patience is not None and r - self.best_round >= self.patience:
            stop = True
        if stop:
            self.result = FitResult(
                self.best[0],
                self.best_test,
                self.best_round,
                len(self.history),
                self.history,
                self.best_state,
            )

    # --- checkpoints --------------------------------------------------------------------------------
    def state_to_checkpoint(self) -> tuple[dict, dict[str, np.ndarray]]:
        """The loop's state as (JSON meta, arrays): history, open row, best round, sampler, weights
        (``global/``, ``best/`` when they differ) and the strategy's state (``strategy_state``)."""
        meta = {
            "history": copy.deepcopy(self.history),
            "metrics": copy.deepcopy(self.metrics),
            "best": list(self.best),
            "best_round": self.best_round,
            "best_test": self.best_test,
            "improved": self.improved,
            "best_is_global": self.best_state is self.state,
            "rng": self.rng.bit_generator.state,
        }
        arrays = tensors_to_arrays(self.state, "global/")
        if self.best_state is not self.state:
            arrays.update(tensors_to_arrays(self.best_state, "best/"))
        meta["strategy_state"], strategy_arrays = self.strategy.state_to_checkpoint()
        arrays.update(strategy_arrays)
        return meta, arrays

    def state_from_checkpoint(self, meta: Mapping, arrays: Mapping[str, np.ndarray]) -> None:
        """Load what :meth:`state_to_checkpoint` saved into a loop built with the same arguments.

        Raises:
            CheckpointMismatchError: weights of another model, or another strategy's state.
        """
        self.history, self.metrics = copy.deepcopy(list(meta["history"])), copy.deepcopy(meta["metrics"])
        self.round = (
            self.metrics["round"]
            if self.metrics is not None
            else self.history[-1]["round"]
            if self.history
            else 0
        )
        self.best = (float(meta["best"][0]), float(meta["best"][1]))
        self.best_round, self.best_test = int(meta["best_round"]), float(meta["best_test"])
        self.improved = bool(meta["improved"])
        self.result = None
        self.rng.bit_generator.state = meta["rng"]
        self.state = exact_weights(arrays_to_tensors(arrays, "global/"), self.state)
        self.best_state = (
            self.state
            if meta["best_is_global"]
            else exact_weights(arrays_to_tensors(arrays, "best/"), self.state)
        )
        self.strategy.state_from_checkpoint(meta.get("strategy_state", {}), arrays, self.state)
