r"""Sans-IO FedAvg rounds: :class:`ServerRounds` and :class:`ClientRounds`.

The rounds are exactly those of :meth:`fedgat.federated.Server.fit` (FedAvg, McMahan et al. 2017,
Algorithm 1: :math:`w^{t+1} = \sum_{k \in S_t} \frac{n_k}{\sum_{l \in S_t} n_l} w_k^{t+1}` through the
strategy's ``aggregate``, :func:`fedgat.federated.fedavg` by default), with the client-side training
and evaluation code of :class:`fedgat.federated.Client` reused as is; only the transport of weights
and counts is new. Given the same seeds they produce bit-identical weights and histories (tested).

Messages of round ``t``: ``GlobalModel(round=t, fit, splits)`` to every client -- ``fit`` for the
clients sampled in round ``t``, ``splits=("val",)`` to evaluate the same weights, which are the result
of round ``t - 1``: one download serves both. Clients answer ``EvaluationReport`` and, if sampled,
``LocalUpdate``. When round ``t - 1``'s pooled validation accuracy is a new best, the server asks for
the test split on the same weights (``EvaluateRequest``), as :meth:`~fedgat.federated.Server.fit`
evaluates the test split only then. If round ``t - 1`` is the last (``rounds`` reached or early
stopping), the round-``t`` updates already under way are received and dropped.

Privacy: model weights and updates travel **in plaintext**; the server sees every client's update
and its number of training nodes (secure aggregation is out of scope), as in plain FedAvg.

Faults (:class:`RoundTimeouts`, time given by :meth:`~fedgat.protocols.party.Party.tick`): when the
``fit`` deadline of a round passes, the server aggregates the updates that arrived -- FedAvg over
the clients that answered, weights renormalised over them -- provided at least
``min_participation`` of the sampled clients answered; the ``evaluate`` deadline pools the reports
that arrived under the same rule. Below the minimum the run stops with a
:class:`~fedgat.protocols.errors.QuorumError` naming the round, the phase and the missing clients.
The history row of a round records the clients that did not answer (``missing_fit``,
``missing_eval``). A late answer of a dropped client is rejected with a typed error.

Restarts: the server's resume points are the moments it has just sent a round's GlobalModel
(checkpoint label = that round); a client's are after it handled a GlobalModel (label = the round
it awaits next). Restoring every party from the same label (:meth:`ServerRounds.restore`,
:meth:`ClientRounds.restore`, in fresh objects) and starting them again continues the run exactly
as if it had not stopped (tested): the server re-sends the round's GlobalModel. Exact continuation
needs each client's randomness (dropout) to be its own (``seed``), as it is in separate processes.

Limits: a frame longer than the model's weights plus :data:`FRAME_OVERHEAD` is refused from its
length alone, and an update or report announcing more than ``max_nodes`` nodes is refused.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np
import torch

from fedgat.checkpoint import (
    Checkpoint,
    CheckpointMismatchError,
    arrays_to_tensors,
    optimizer_from_checkpoint,
    optimizer_to_checkpoint,
    tensors_to_arrays,
)
from fedgat.federated import Client, Counts, FedAvg, FitResult, StateDict, Strategy

from .errors import AuthError, PayloadError, QuorumError, ReplayError, SizeLimitError, StateError
from .messages import (
    MAX_NODES,
    Abort,
    AbortCode,
    EvaluateRequest,
    EvaluationReport,
    GlobalModel,
    LocalUpdate,
    Message,
    SplitCounts,
)
from .party import Handler, Party
from .roster import Identity, Roster

__all__ = ["ClientRounds", "RoundTimeouts", "RoundsState", "ServerRounds", "state_to_arrays"]

#: frame bytes allowed above the model's weights (header, names, shapes, signature)
FRAME_OVERHEAD = 64 * 1024
SERVER_KIND = "fedgat.fedavg.server"
CLIENT_KIND = "fedgat.fedavg.client"


@dataclass(frozen=True)
class RoundTimeouts:
    """Seconds the server waits for the sampled clients' updates (``fit``) and for the evaluation
    reports (``evaluate``) of a round, counted from when it sent the request (None: forever)."""

    fit: float | None = None
    evaluate: float | None = None


def _model_frame_limit(state: StateDict) -> int:
    return sum(t.numel() * 4 + 4 * t.dim() + 256 for t in state.values()) + FRAME_OVERHEAD


class RoundsState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    DONE = "done"
    ABORTED = "aborted"


def state_to_arrays(state: StateDict) -> dict[str, np.ndarray]:
    """float32 numpy views of a state dict (what travels in GlobalModel/LocalUpdate)."""
    out = {}
    for name, tensor in state.items():
        if tensor.dtype != torch.float32:
            raise TypeError(f"{name} is {tensor.dtype}; the protocol carries float32 weights only")
        out[name] = tensor.detach().cpu().numpy()
    return out


def _check_arrays(arrays: dict[str, np.ndarray], reference: StateDict, what: str) -> StateDict:
    if list(arrays) != list(reference):
        raise PayloadError(f"{what}: weight names {list(arrays)[:4]} do not match the model's")
    for name, arr in arrays.items():
        if tuple(arr.shape) != tuple(reference[name].shape):
            raise PayloadError(f"{what}: {name} has shape {arr.shape}, expected {tuple(reference[name].shape)}")
    return {name: torch.from_numpy(arr) for name, arr in arrays.items()}


class ServerRounds(Party):
    """The FedAvg server (see the module docstring).

    Args:
        party_id, roster, session, identity: identity and session; the clients are ``roster.clients``
            in that order (it fixes the order of aggregation and of the pooled evaluation sums).
        initial_state: round-0 global weights (float32).
        rounds: maximum number of rounds, ``>= 1``.
        patience: early-stopping patience in rounds (None: never early).
        strategy: aggregation strategy (default :class:`fedgat.federated.FedAvg`).
        fraction, seed: client sampling as :class:`fedgat.federated.Server`.
        test_every_round: evaluate the test split every round, not only on a new best.
        fingerprint: the session's CKKS key fingerprint when rounds follow an encrypted pre-training.
        timeouts: deadlines of the fit and evaluate phases (default: none, wait forever).
        min_participation: share of the asked clients that must answer a phase before its deadline
            (at least one client); below it the run stops with a QuorumError.
        max_nodes: largest ``num_train`` or evaluation ``count`` a client may announce.
    """

    def __init__(self, party_id: int, roster: Roster, session: int, identity: Identity, *,
                 initial_state: StateDict, rounds: int, patience: int | None = None,
                 strategy: Strategy | None = None, fraction: float = 1.0, seed: int = 0,
                 test_every_round: bool = False, fingerprint: bytes | None = None,
                 timeouts: RoundTimeouts | None = None, min_participation: float = 0.5,
                 max_nodes: int = MAX_NODES) -> None:
        super().__init__(party_id, roster, session, identity.signer)
        if not 0 < min_participation <= 1:
            raise ValueError(f"min_participation must lie in (0, 1], got {min_participation!r}")
        self.timeouts = timeouts if timeouts is not None else RoundTimeouts()
        self.min_participation = float(min_participation)
        self.max_nodes = int(max_nodes)
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        if patience is not None and patience < 1:
            raise ValueError(f"patience must be >= 1 or None, got {patience}")
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must lie in (0, 1], got {fraction!r}")
        self.clients = list(roster.clients)
        self.global_state: StateDict = {k: v.detach().clone() for k, v in initial_state.items()}
        state_to_arrays(self.global_state)  # float32 check
        self.rounds, self.patience = rounds, patience
        self.strategy = strategy if strategy is not None else FedAvg()
        self.fraction = float(fraction)
        self.rng = np.random.default_rng(seed)
        self.test_every_round = test_every_round
        self.verifier.fingerprint = fingerprint
        self.state = RoundsState.NEW
        self.history: list[dict] = []
        self.best_state: StateDict = self.global_state
        self._best = (-1.0, math.inf)
        self._best_round, self._best_test = 0, float("nan")
        self._fit_round = 0  # round whose updates are awaited (0: none)
        self._sampled: list[int] = []
        self._updates: dict[int, tuple[StateDict | None, int, float]] = {}
        self._eval_round = 0  # message round whose evaluation is awaited (0: none)
        self._eval_splits: tuple[str, ...] = ()
        self._reports: dict[int, dict[str, Counts]] = {}
        self._metrics: dict | None = None  # the round under evaluation
        self._improved = False
        self.result: FitResult | None = None
        self._asked: list[int] = []  # clients whose reports are awaited
        self._missing = {"fit": [], "eval": []}  # clients dropped in the phases under way
        self._boundary: tuple[int, list[int], tuple[str, ...]] | None = None  # resume point
        self._restored = False
        self.max_frame_bytes = _model_frame_limit(self.global_state)

    @property
    def done(self) -> bool:
        return self.state is RoundsState.DONE

    @property
    def best_test_accuracy(self) -> float:
        """Test accuracy at the best validation round so far (NaN before the first)."""
        return self._best_test

    @property
    def clients_per_round(self) -> int:
        return max(1, round(self.fraction * len(self.clients)))

    def _sample(self) -> list[int]:
        """:meth:`fedgat.federated.Server.sample_clients`, as party ids."""
        k = self.clients_per_round
        if k == len(self.clients):
            return list(self.clients)
        idx = sorted(self.rng.choice(len(self.clients), size=k, replace=False).tolist())
        return [self.clients[i] for i in idx]

    def _snapshot(self) -> dict:
        return {"fit_round": self._fit_round, "eval": (self._eval_round, self._eval_splits),
                "updates": tuple(sorted(self._updates)), "reports": tuple(sorted(self._reports)),
                "sampled": tuple(self._sampled), "asked": tuple(self._asked),
                "history": len(self.history),
                "weights": tuple(float(v.double().sum()) for v in self.global_state.values())}

    # --- sending ----------------------------------------------------------------------------------
    def start(self) -> list[Message]:
        """Round 1's GlobalModel -- or, after :meth:`restore`, the checkpointed round's again."""
        if self.state is not RoundsState.NEW:
            raise StateError("start() was already called")
        self.state = RoundsState.RUNNING
        if self._restored:
            assert self._boundary is not None
            return self._send_round(*self._boundary)
        return self._send_round(1, self._sample(), ())

    def _send_round(self, t: int, fit: list[int], splits: tuple[str, ...]) -> list[Message]:
        arrays = state_to_arrays(self.global_state)
        out = [self._new(GlobalModel, c, round=t, fit=c in fit, splits=splits, arrays=arrays)
               for c in self.clients if c in fit or splits]
        self._fit_round, self._sampled, self._updates = (t, list(fit), {}) if fit else (0, [], {})
        self._missing["fit"] = []
        if fit:
            self._arm("fit", self.timeouts.fit)
        if splits:
            self._expect(t, splits)
        self._boundary = (t, list(fit), tuple(splits))
        return out

    def _expect(self, t: int, splits: tuple[str, ...]) -> None:
        self._eval_round, self._eval_splits, self._reports = t, splits, {}
        self._asked, self._missing["eval"] = list(self.clients), []
        self._arm("evaluate", self.timeouts.evaluate)

    def _sync_deadlines(self) -> None:
        """Disarm the deadlines of phases that no longer wait for anyone."""
        if self.state is not RoundsState.RUNNING or not self._fit_round or len(self._updates) == len(self._sampled):
            self._disarm("fit")
        if self.state is not RoundsState.RUNNING or not self._eval_round or len(self._reports) == len(self._asked):
            self._disarm("evaluate")

    def _quorum(self, asked: int) -> int:
        return max(1, math.ceil(self.min_participation * asked - 1e-9))

    def _expired(self, phase: str) -> list[Message]:
        """A phase's deadline passed: go on with the clients that answered, or stop (QuorumError)."""
        if self.state is not RoundsState.RUNNING:
            return []
        fit = phase == "fit"
        asked, got = (self._sampled, self._updates) if fit else (self._asked, self._reports)
        t = self._fit_round if fit else self._eval_round
        answered = [c for c in asked if c in got]
        missing = [c for c in asked if c not in got]
        if not missing or not t:
            return []
        required = self._quorum(len(asked))
        if len(answered) < required:
            return self._fail(QuorumError(
                f"round {t}: {len(answered)} of {len(asked)} clients answered the {phase} phase before its "
                f"deadline, {required} required; missing clients {missing}",
                phase=phase, missing=missing, round=t, answered=answered, required=required))
        self._boundary = None
        if fit:
            self._sampled = answered
        else:
            self._asked = answered
        self._missing["fit" if fit else "eval"] = missing
        out = self._advance()
        self._sync_deadlines()
        return out

    def _fail(self, error: QuorumError) -> list[Message]:
        self.state = RoundsState.ABORTED
        self.failure = error
        self.abort_reason = str(error)
        self._disarm("fit", "evaluate")
        return [self._new(Abort, c, code=int(AbortCode.TIMEOUT), reason=str(error)[:1000]) for c in self.clients]

    # --- intake -------------------------------------------------------------------------------------
    def _handler(self, msg: Message) -> Handler | None:
        if self.state is RoundsState.RUNNING:
            return {LocalUpdate: self._on_update, EvaluationReport: self._on_report,
                    Abort: self._on_abort}.get(type(msg))
        if self.state is RoundsState.DONE and isinstance(msg, LocalUpdate):
            return self._on_late
        return None

    def _from_client(self, msg: Message) -> None:
        if not self.roster.is_client(msg.sender):
            raise AuthError(f"{msg.type_name} must come from a client, not party {msg.sender}")

    def _on_update(self, msg: LocalUpdate) -> list[Message]:
        self._from_client(msg)
        if msg.round != self._fit_round or self._fit_round == 0:
            raise ReplayError(f"update for round {msg.round}; the server awaits round {self._fit_round}")
        if msg.sender not in self._sampled:
            why = "was dropped after the deadline" if msg.sender in self._missing["fit"] else "was not sampled"
            raise StateError(f"party {msg.sender} {why} in round {msg.round}")
        if msg.sender in self._updates:
            raise ReplayError(f"party {msg.sender} already sent its round-{msg.round} update")
        if msg.num_train > self.max_nodes:
            raise SizeLimitError(f"party {msg.sender} announces {msg.num_train} training nodes; "
                                 f"the limit is {self.max_nodes}")
        state = _check_arrays(msg.arrays, self.global_state, "LocalUpdate") if msg.num_train else None
        self._boundary = None
        self._updates[msg.sender] = (state, msg.num_train, msg.loss)
        return self._progress()

    def _on_report(self, msg: EvaluationReport) -> list[Message]:
        self._from_client(msg)
        if msg.round != self._eval_round or self._eval_round == 0:
            raise ReplayError(f"report for round {msg.round}; the server awaits round {self._eval_round}")
        if msg.sender not in self._asked:
            raise StateError(f"party {msg.sender} was dropped after the deadline of round {msg.round}")
        if msg.sender in self._reports:
            raise ReplayError(f"party {msg.sender} already reported round {msg.round}")
        if tuple(s.split for s in msg.splits) != self._eval_splits:
            raise PayloadError(f"the report must cover the splits {self._eval_splits}")
        if any(s.count > self.max_nodes for s in msg.splits):
            raise SizeLimitError(f"party {msg.sender} reports more than {self.max_nodes} nodes")
        self._boundary = None
        self._reports[msg.sender] = {s.split: Counts(s.correct, s.count, s.loss_sum) for s in msg.splits}
        return self._progress()

    def _progress(self) -> list[Message]:
        out = self._advance()
        self._sync_deadlines()
        return out

    def _on_late(self, msg: LocalUpdate) -> list[Message]:
        """After the last round: drop the updates of the round that does not happen."""
        self._from_client(msg)
        if msg.round != self._fit_round or msg.sender not in self._sampled or msg.sender in self._updates:
            raise ReplayError(f"update for round {msg.round} after the last round")
        self._updates[msg.sender] = (None, 0, 0.0)
        return []

    def _on_abort(self, msg: Abort) -> list[Message]:
        self._from_client(msg)
        self.state = RoundsState.ABORTED
        self.abort_reason = f"client {msg.sender} aborted (code {msg.code}): {msg.reason}"
        self._disarm("fit", "evaluate")
        return []

    # --- rounds ---------------------------------------------------------------------------------------
    def _advance(self) -> list[Message]:
        out: list[Message] = []
        while self.state is RoundsState.RUNNING:
            if self._metrics is None and self._fit_round and len(self._updates) == len(self._sampled):
                t = self._fit_round
                self._metrics = {"round": t, **self._aggregate()}
                nxt = self._sample() if t < self.rounds else []
                out += self._send_round(t + 1, nxt, ("val", "test") if self.test_every_round else ("val",))
                continue
            if self._metrics is not None and self._eval_round and len(self._reports) == len(self._asked):
                label, splits = self._eval_round, self._eval_splits
                self._metrics.update(self._pooled(splits))
                self._eval_round, self._eval_splits = 0, ()
                if "val" in splits:
                    key = (self._metrics["val_accuracy"], self._metrics["val_loss"])
                    self._improved = key[0] > self._best[0] or (key[0] == self._best[0] and key[1] < self._best[1])
                    if self._improved and "test" not in splits:
                        self._expect(label, ("test",))
                        out += [self._new(EvaluateRequest, c, round=label, splits=("test",)) for c in self.clients]
                        continue
                self._end_round()
                continue
            break
        return out

    def _aggregate(self) -> dict:
        """:meth:`fedgat.federated.Server.train_round`'s aggregation of the received updates."""
        ids = self._sampled
        states = [self._updates[c][0] or self.global_state for c in ids]
        weights = [self._updates[c][1] for c in ids]
        total = sum(weights)
        if total > 0:
            self.global_state = self.strategy.aggregate(states, weights, self.global_state)
        loss = sum(self._updates[c][2] * self._updates[c][1] for c in ids) / total if total else float("nan")
        out = {"train_loss": loss, "clients": [self.clients.index(c) for c in ids]}
        if self._missing["fit"]:
            out["missing_fit"] = [self.clients.index(c) for c in self._missing["fit"]]
        return out

    def _pooled(self, splits: tuple[str, ...]) -> dict:
        """:meth:`fedgat.federated.Server.evaluate` from the reports (summed in client order)."""
        out: dict = {}
        if self._missing["eval"]:
            out[f"missing_eval_{'_'.join(splits)}"] = [self.clients.index(c) for c in self._missing["eval"]]
        for s in splits:
            totals = [0, 0, 0.0]
            for c in self._asked:
                totals = [a + b for a, b in zip(totals, self._reports[c][s])]
            correct, count, loss_sum = totals
            out[f"{s}_accuracy"] = correct / count if count else float("nan")
            out[f"{s}_loss"] = loss_sum / count if count else float("nan")
        return out

    def _end_round(self) -> None:
        """Best-round bookkeeping and early stopping of :meth:`fedgat.federated.Server.fit`."""
        metrics, self._metrics = self._metrics, None
        assert metrics is not None
        self.history.append(metrics)
        r = metrics["round"]
        stop = r >= self.rounds
        if self._improved:
            self._best = (metrics["val_accuracy"], metrics["val_loss"])
            self._best_round, self._best_test = r, metrics["test_accuracy"]
            self.best_state = self.global_state  # the weights just evaluated
        elif self.patience is not None and r - self._best_round >= self.patience:
            stop = True
        if stop:
            self.state = RoundsState.DONE
            self._disarm("fit", "evaluate")
            self.result = FitResult(self._best[0], self._best_test, self._best_round, len(self.history),
                                    self.history)

    # --- checkpoints ----------------------------------------------------------------------------------
    def _config(self) -> dict:
        return {"clients": self.clients, "rounds": self.rounds, "patience": self.patience,
                "fraction": self.fraction, "test_every_round": self.test_every_round,
                "weights": {k: list(v.shape) for k, v in self.global_state.items()},
                "strategy": self.strategy.config()}

    @property
    def checkpoint_label(self) -> int | None:
        """The round whose GlobalModel was just sent (None between resume points)."""
        if self.state is not RoundsState.RUNNING or self._boundary is None:
            return None
        return self._boundary[0]

    def checkpoint(self) -> Checkpoint:
        """The server's state at its resume point (see the module docstring)."""
        if self.checkpoint_label is None:
            raise StateError("the server is not at a resume point (just after sending a round)")
        assert self._boundary is not None
        t, fit, splits = self._boundary
        meta = {**self._checkpoint_base(), "config": self._config(), "boundary": [t, fit, list(splits)],
                "history": self.history, "metrics": self._metrics, "best": list(self._best),
                "best_round": self._best_round, "best_test": self._best_test, "improved": self._improved,
                "best_is_global": self.best_state is self.global_state,
                "rng": self.rng.bit_generator.state, "timings": dict(self.timings)}
        arrays = tensors_to_arrays(self.global_state, "global/")
        if self.best_state is not self.global_state:
            arrays.update(tensors_to_arrays(self.best_state, "best/"))
        meta["strategy_state"], strategy_arrays = self.strategy.state_to_checkpoint()
        arrays.update(strategy_arrays)
        return Checkpoint(SERVER_KIND, meta, arrays)

    def restore(self, ckpt: Checkpoint) -> None:
        """Load a :meth:`checkpoint` into this fresh server (built with the same arguments); then
        :meth:`start` re-sends the checkpointed round.

        Raises:
            CheckpointMismatchError: another kind, party, session or configuration.
            StateError: the server has already started.
        """
        if self.state is not RoundsState.NEW:
            raise StateError("restore() needs a server that has not started")
        ckpt.require(SERVER_KIND, party=self.party_id, session=self.session)
        meta = ckpt.meta
        if meta["config"] != self._config():
            raise CheckpointMismatchError("the checkpoint is of a server with another configuration")
        self._restore_base(meta)
        t, fit, splits = meta["boundary"]
        self._boundary = (int(t), [int(c) for c in fit], tuple(splits))
        self.history, self._metrics = list(meta["history"]), meta["metrics"]
        self._best = (float(meta["best"][0]), float(meta["best"][1]))
        self._best_round, self._best_test = int(meta["best_round"]), float(meta["best_test"])
        self._improved = bool(meta["improved"])
        self.rng.bit_generator.state = meta["rng"]
        self.global_state = _exact(arrays_to_tensors(ckpt.arrays, "global/"), self.global_state)
        self.best_state = (self.global_state if meta["best_is_global"]
                           else _exact(arrays_to_tensors(ckpt.arrays, "best/"), self.global_state))
        self.strategy.state_from_checkpoint(meta.get("strategy_state", {}), ckpt.arrays, self.global_state)
        self._restored = True


def _exact(loaded: StateDict, reference: StateDict) -> StateDict:
    """Checkpointed weights, checked against the model's names, shapes and dtypes."""
    if list(loaded) != list(reference) or any(loaded[k].shape != reference[k].shape
                                              or loaded[k].dtype != reference[k].dtype for k in reference):
        raise CheckpointMismatchError("checkpointed weights do not match the model")
    return loaded


class ClientRounds(Party):
    """A FedAvg client around a :class:`fedgat.federated.Client` (its training and evaluation code).

    Args:
        party_id, roster, session, identity: identity and session.
        client: the in-process client (model replica, optimiser, local tasks).
        strategy: the strategy's local penalty (FedProx); default FedAvg.
        fingerprint: the session's CKKS key fingerprint when rounds follow an encrypted pre-training.
        seed: give the client its own torch random stream (dropout) seeded so, as a separate process
            would have; checkpoints then carry it and a restored client continues exactly. None: the
            process-wide stream (bit-identical to :class:`fedgat.federated.Server` in one process).
    """

    def __init__(self, party_id: int, roster: Roster, session: int, identity: Identity, *, client: Client,
                 strategy: Strategy | None = None, fingerprint: bytes | None = None,
                 seed: int | None = None) -> None:
        super().__init__(party_id, roster, session, identity.signer)
        self.client = client
        self.strategy = strategy if strategy is not None else FedAvg()
        self.verifier.fingerprint = fingerprint
        self.state = RoundsState.RUNNING
        self.last_round = 0
        self._weights: StateDict | None = None  # the last global weights received
        self._evaluated: set[str] = set()
        self._reference = {k: v.detach() for k, v in client.model.state_dict().items()}
        self._rng: torch.Tensor | None = (None if seed is None
                                          else torch.Generator().manual_seed(int(seed)).get_state())
        self.max_frame_bytes = _model_frame_limit(self._reference)

    @property
    def done(self) -> bool:
        return self.state is not RoundsState.ABORTED

    def _snapshot(self) -> dict:
        return {"last_round": self.last_round, "evaluated": tuple(sorted(self._evaluated)),
                "weights": tuple(float(v.double().sum()) for v in self.client.model.state_dict().values())}

    def _handler(self, msg: Message) -> Handler | None:
        if self.state is not RoundsState.RUNNING:
            return None
        return {GlobalModel: self._on_model, EvaluateRequest: self._on_request,
                Abort: self._on_abort}.get(type(msg))

    def _from_server(self, msg: Message) -> None:
        if msg.sender != self.roster.server:
            raise AuthError(f"{msg.type_name} must come from the server, not party {msg.sender}")

    def _on_abort(self, msg: Abort) -> list[Message]:
        self._from_server(msg)
        self.state = RoundsState.ABORTED
        self.abort_reason = f"server aborted (code {msg.code}): {msg.reason}"
        return []

    def _report(self, t: int, splits: tuple[str, ...]) -> Message:
        assert self._weights is not None
        counts = self.client.evaluate(self._weights, splits)
        self._evaluated.update(splits)
        return self._new(EvaluationReport, self.roster.server, round=t, splits=tuple(
            SplitCounts(s, counts[s].correct, counts[s].count, counts[s].loss_sum) for s in splits))

    def _on_model(self, msg: GlobalModel) -> list[Message]:
        self._from_server(msg)
        if msg.round <= self.last_round:
            raise ReplayError(f"global model of round {msg.round}; round {self.last_round} was already served")
        weights = _check_arrays(msg.arrays, self._reference, "GlobalModel")
        self.last_round, self._weights, self._evaluated = msg.round, weights, set()
        out: list[Message] = []
        with self.clock("training"):
            if msg.splits:
                out.append(self._report(msg.round, msg.splits))
            if msg.fit:
                update = self._fit(weights)
                arrays = state_to_arrays(update.state) if update.num_train else {}
                out.append(self._new(LocalUpdate, self.roster.server, round=msg.round,
                                     num_train=update.num_train, loss=update.loss, arrays=arrays))
        return out

    def _on_request(self, msg: EvaluateRequest) -> list[Message]:
        self._from_server(msg)
        if msg.round != self.last_round or self._weights is None:
            raise ReplayError(f"evaluation of round {msg.round}; the last weights are of round {self.last_round}")
        if self._evaluated & set(msg.splits):
            raise ReplayError(f"splits {sorted(self._evaluated & set(msg.splits))} of round {msg.round} "
                              "were already reported")
        with self.clock("training"):
            return [self._report(msg.round, msg.splits)]

    def _fit(self, weights: StateDict):
        """Local training, drawing from the client's own random stream when it has one."""
        if self._rng is None:
            return self.client.fit(weights, self.strategy)
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self._rng)
            update = self.client.fit(weights, self.strategy)
            self._rng = torch.get_rng_state()
        return update

    # --- checkpoints ----------------------------------------------------------------------------------
    @property
    def checkpoint_label(self) -> int | None:
        """The round this client awaits next, once it has handled a GlobalModel."""
        if self.state is not RoundsState.RUNNING or self.last_round == 0:
            return None
        return self.last_round + 1

    def checkpoint(self) -> Checkpoint:
        """Model replica, optimiser, random stream, last global weights and round state."""
        if self.checkpoint_label is None:
            raise StateError("the client has no state to checkpoint yet")
        opt_meta, arrays = optimizer_to_checkpoint(self.client.optimizer)
        arrays.update(tensors_to_arrays(self.client.model.state_dict(), "model/"))
        if self._weights is not None:
            arrays.update(tensors_to_arrays(self._weights, "weights/"))
        if self._rng is not None:
            arrays["rng"] = self._rng.numpy().copy()
        meta = {**self._checkpoint_base(), "last_round": self.last_round, "evaluated": sorted(self._evaluated),
                "optimizer": opt_meta, "has_weights": self._weights is not None,
                "shapes": {k: list(v.shape) for k, v in self._reference.items()}}
        return Checkpoint(CLIENT_KIND, meta, arrays)

    def restore(self, ckpt: Checkpoint) -> None:
        """Load a :meth:`checkpoint` into this fresh client (same model architecture and optimiser).

        Raises:
            CheckpointMismatchError: another kind, party, session or model.
            StateError: the client has already handled a message.
        """
        if self.last_round != 0 or self.state is not RoundsState.RUNNING:
            raise StateError("restore() needs a client that has handled no message")
        ckpt.require(CLIENT_KIND, party=self.party_id, session=self.session,
                     shapes={k: list(v.shape) for k, v in self._reference.items()})
        meta, arrays = ckpt.meta, ckpt.arrays
        if ("rng" in arrays) != (self._rng is not None):
            raise CheckpointMismatchError("the checkpoint and this client disagree on a private random stream")
        self._restore_base(meta)
        self.client.model.load_state_dict(_exact(arrays_to_tensors(arrays, "model/"), self._reference))
        optimizer_from_checkpoint(self.client.optimizer, meta["optimizer"], arrays)
        self._weights = (_exact(arrays_to_tensors(arrays, "weights/"), self._reference)
                         if meta["has_weights"] else None)
        if self._rng is not None:
            self._rng = torch.from_numpy(np.array(arrays["rng"]))
        self.last_round, self._evaluated = int(meta["last_round"]), set(meta["evaluated"])
