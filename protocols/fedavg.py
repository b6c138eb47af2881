r"""Sans-IO FedAvg rounds: :class:`ServerRounds` and :class:`ClientRounds`.

The rounds are those of :meth:`fedgat.federated.Server.fit`: both drive the same
:class:`fedgat.rounds.RoundLoop` (client sampling, FedAvg, McMahan et al. 2017, Algorithm 1:
:math:`w^{t+1} = \sum_{k \in S_t} \frac{n_k}{\sum_{l \in S_t} n_l} w_k^{t+1}` through the server
strategy; pooled evaluation, early stopping, best model), and the client-side training and
evaluation code of :class:`fedgat.federated.Client` is reused as is. This module adds the protocol:
messages, signatures, secure aggregation, deadlines, quorum and checkpoints. Without secure
aggregation, given the same seeds, they produce bit-identical weights and histories (tested).
:class:`ClientRounds` lives in :mod:`fedgat.protocols.fedavg_client` (re-exported here).

Messages of round ``t``: ``GlobalModel(round=t, fit, splits)`` -- ``fit`` for the clients sampled in
round ``t``, and, to every client, ``splits`` to evaluate the same weights, which are the result of
round ``t - 1``: one download serves both. If round ``t - 1`` is the last (``rounds`` reached or
early stopping), the round-``t`` updates already under way are dropped.

Secure aggregation (default, ``secagg``; :mod:`~fedgat.protocols.secagg`): updates and evaluation
counts reach the server only as sums. Every client that receives a GlobalModel takes part in the
round's secure sum with the vector of :func:`~fedgat.protocols.fedavg_client.secure_vector`:
:math:`(n_k w_k, n_k, n_k L_k)` if it was sampled (zeros otherwise), then its ``(correct, count,
loss_sum)`` on the splits of :data:`~fedgat.protocols.fedavg_client.SECURE_SPLITS` (validation and
test, so the test counts of a new best are already in the sum). The round runs five stages after
the GlobalModel (:mod:`~fedgat.protocols.secagg_server`): **advertise keys** (SecAggAdvert: round
keys, bound to the digest of the model received), **share keys** (SecAggCohort out, SecAggShares
back, relayed sealed as SecAggRelay), **masked input** (SecAggMasked), **consistency check**
(SecAggSurvivors out, SecAggConfirm back) and **unmask** (SecAggUnmaskRequest with the
confirmations, SecAggUnmaskShares). The server decodes the sums over the survivors, hands the
pooled counts to :meth:`fedgat.rounds.RoundLoop.on_reports` and the sampled survivors' mean to
:meth:`~fedgat.rounds.RoundLoop.on_aggregate` (FedAvg, FedProx, FedAdam). After the last round, one
more secure round carries the counts of the final weights (no client trains). The server learns the
global models (it makes them), who was sampled and who dropped out at which stage, the aggregate
and the pooled counts; a client answers no ``EvaluateRequest`` and sends no ``EvaluationReport``.
Weights match :meth:`~fedgat.federated.Server.fit` (which aggregates in the clear) to float64
rounding of the mean, not bit for bit; histories match.

With ``secagg=None`` updates travel in plaintext (``LocalUpdate``, as in plain FedAvg) and every
client answers ``EvaluationReport``; when round ``t - 1``'s pooled validation accuracy is a new best,
the server asks for the test split on the same weights (``EvaluateRequest``), as
:meth:`~fedgat.federated.Server.fit` evaluates the test split only then.

Refusals: without secure aggregation, local training or evaluation that gives values a client cannot
send raises :class:`~fedgat.protocols.errors.TrainingRefusedError` -- a constant text (the values
come from private data), and terminal: the client leaves the run. Under secure aggregation a client
refuses nothing on its data: a diverged training sends the global weights unchanged, and a loss or
count it cannot encode enters the sum as 0 or bounded (:meth:`ClientRounds._unchanged
<fedgat.protocols.fedavg_client.ClientRounds._unchanged>`, known break 23).

Faults (:class:`RoundTimeouts`, time given by :meth:`~fedgat.protocols.party.Party.tick`): when the
``fit`` deadline of a round passes, the server aggregates the updates that arrived -- FedAvg over
the clients that answered, weights renormalised over them -- provided at least
``min_participation`` of the sampled clients answered; the ``evaluate`` deadline pools the reports
that arrived under the same rule (plaintext rounds; under secure aggregation the ``fit`` deadline
covers the round's one secure sum, counts included). Below the minimum the run stops with a
:class:`~fedgat.protocols.errors.QuorumError` naming the round, the phase and the missing clients.
Under secure aggregation the ``fit`` deadline applies to each stage: the keys stage needs
``max(min_cohort, min_participation)`` advertisers, every later stage the threshold :math:`t`
(phase ``fit:<stage>``); a client that drops after sharing its keys is unmasked from the others'
shares. The history row of a round records the clients that did not answer (``missing_fit``,
``missing_eval``). A late answer of a dropped client is rejected with a typed error.

Restarts: the server's resume points are the moments it has just sent a round's GlobalModel
(checkpoint label = that round); a client's are after it handled a GlobalModel (label = the round
it awaits next). Restoring every party from the same label (:meth:`ServerRounds.restore`,
:meth:`ClientRounds.restore`, in fresh objects) and starting them again continues the run exactly
as if it had not stopped (tested): the server re-sends the round's GlobalModel and a secure round
starts again with fresh keys (its secrets are never checkpointed; a client restarted alone mid-round
drops out of that round). Exact continuation needs each client's randomness (dropout) to be its own
(``seed``), as it is in separate processes. A restart re-runs a round on the same inputs: a server
that restarts rounds at will with other survivor sets could difference the sums, so restore clients
on their operator's decision, not the server's request.

Limits: a frame longer than the model's weights plus :data:`FRAME_OVERHEAD` (with secure aggregation,
a masked input: 16 bytes per weight) is refused from its length alone, and an update or report
announcing more than ``max_nodes`` nodes is refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from fedgat.checkpoint import Checkpoint, CheckpointMismatchError
from fedgat.dp_fedavg import DP_NEEDS_SECAGG, UpdateDP
from fedgat.federated import ClientUpdate, Counts, StateDict
from fedgat.rounds import RoundLoop
from fedgat.strategies import ServerStrategy

from .errors import (
    AuthError,
    ConfigMismatchError,
    FaultError,
    PayloadError,
    QuorumError,
    ReplayError,
    SizeLimitError,
    StateError,
)
from .fedavg_client import (
    DEFAULT_SECAGG,
    FRAME_OVERHEAD,
    SECURE_SPLITS,
    ClientRounds,
    RoundsState,
    check_arrays,
    model_frame_limit,
    state_to_arrays,
)
from .fedavg_server import LoopView, SecureRounds
from .messages import (
    MAX_NODES,
    Abort,
    AbortCode,
    EvaluateRequest,
    EvaluationReport,
    GlobalModel,
    LocalUpdate,
    Message,
)
from .messages_secagg import SecAggAdvert, SecAggConfirm, SecAggMasked, SecAggShares, SecAggUnmaskShares
from .party import Handler, Party
from .roster import Identity, Roster
from .secagg import SecAggConfig
from .secagg_server import ServerSecAgg

__all__ = [
    "FRAME_OVERHEAD",
    "ClientRounds",
    "RoundTimeouts",
    "RoundsState",
    "ServerRounds",
    "state_to_arrays",
]

SERVER_KIND = "fedgat.fedavg.server"
#: the clients' answers to the stages of a secure round
SECAGG_ANSWERS = (SecAggAdvert, SecAggShares, SecAggMasked, SecAggConfirm, SecAggUnmaskShares)


@dataclass(frozen=True)
class RoundTimeouts:
    """Seconds the server waits for the sampled clients' updates (``fit``) and for the evaluation
    reports (``evaluate``) of a round, counted from when it sent the request (None: forever)."""

    fit: float | None = None
    evaluate: float | None = None


class ServerRounds(LoopView, SecureRounds, Party):
    """The FedAvg server (see the module docstring): the protocol around a :class:`fedgat.rounds.RoundLoop`
    (:attr:`loop`), which decides who trains, aggregates, pools the reports and stops.

    Args:
        party_id, roster, session, identity: identity and session; the clients are ``roster.clients``
            in that order (it fixes the order of aggregation and of the pooled evaluation sums).
        initial_state: round-0 global weights (float32).
        rounds: maximum number of rounds, ``>= 1``.
        patience: early-stopping patience in rounds (None: never early).
        strategy: the server half of the strategy (default :class:`fedgat.strategies.FedAvg`).
        fraction, seed: client sampling as :class:`fedgat.federated.Server`.
        test_every_round: evaluate the test split every round, not only on a new best.
        fingerprint: the session's CKKS key fingerprint when rounds follow an encrypted pre-training.
        timeouts: deadlines of the fit and evaluate phases (default: none, wait forever).
        min_participation: share of the asked clients that must answer a phase before its deadline
            (at least one client); below it the run stops with a QuorumError.
        max_nodes: largest ``num_train`` or evaluation ``count`` a client may announce.
        secagg: secure aggregation (default :data:`~fedgat.protocols.fedavg_client.DEFAULT_SECAGG`);
            None: plaintext LocalUpdates. The clients must run the same setting.
        update_dp: the clients' DP-FedAvg settings (:class:`fedgat.dp_fedavg.UpdateDP`; the clients
            clip and noise, the server only records): the history's ``train_loss`` is NaN (not sent)
            and :attr:`dp_epsilon` states what the rounds so far spent. Needs ``secagg``
            (``ValueError`` for None: the noise shares add up only in the secure sum).
    """

    def __init__(
        self,
        party_id: int,
        roster: Roster,
        session: int,
        identity: Identity,
        *,
        initial_state: StateDict,
        rounds: int,
        patience: int | None = None,
        strategy: ServerStrategy | None = None,
        fraction: float = 1.0,
        seed: int = 0,
        test_every_round: bool = False,
        fingerprint: bytes | None = None,
        timeouts: RoundTimeouts | None = None,
        min_participation: float = 0.5,
        max_nodes: int = MAX_NODES,
        secagg: SecAggConfig | None = DEFAULT_SECAGG,
        update_dp: UpdateDP | None = None,
    ) -> None:
        if update_dp is not None and secagg is None:
            raise ValueError(DP_NEEDS_SECAGG)
        super().__init__(party_id, roster, session, identity.signer)
        self.update_dp = update_dp
        if not 0 < min_participation <= 1:
            raise ValueError(f"min_participation must lie in (0, 1], got {min_participation!r}")
        self.timeouts = timeouts if timeouts is not None else RoundTimeouts()
        self.min_participation = float(min_participation)
        self.max_nodes = int(max_nodes)
        self.clients = list(roster.clients)
        self._index = {c: i for i, c in enumerate(self.clients)}
        state_to_arrays(initial_state)  # float32 check
        # the round decisions (validates rounds, patience, fraction)
        self.loop = RoundLoop(
            len(self.clients),
            initial_state,
            strategy,
            fraction=fraction,
            seed=seed,
            rounds=rounds,
            patience=patience,
            test_every_round=test_every_round,
        )
        self.verifier.fingerprint = fingerprint
        self.state = RoundsState.NEW
        self._fit_round = 0  # round whose updates are awaited (0: none)
        self._sampled: list[int] = []
        self._updates: dict[int, tuple[StateDict | None, int, float]] = {}
        self._eval_round = 0  # message round whose evaluation is awaited (0: none)
        self._eval_splits: tuple[str, ...] = ()
        self._reports: dict[int, dict[str, Counts]] = {}
        self._asked: list[int] = []  # clients whose reports are awaited
        # clients dropped in the phases under way
        self._missing: dict[str, list[int]] = {"fit": [], "eval": []}
        self._boundary: tuple[int, list[int], tuple[str, ...]] | None = None  # resume point
        self._restored = False
        self.secagg = secagg
        self._secure: ServerSecAgg | None = None  # the secure round under way
        self.max_frame_bytes = model_frame_limit(self.global_state, len(self.clients), secagg is not None)

    @property
    def done(self) -> bool:
        return self.state is RoundsState.DONE

    def _sample(self) -> list[int]:
        """:meth:`fedgat.rounds.RoundLoop.sample`, as party ids."""
        return [self.clients[i] for i in self.loop.sample()]

    def _indices(self, parties: Sequence[int]) -> list[int]:
        """Positions in the roster (the loop's client ids) of party ids."""
        return [self._index[c] for c in parties]

    def _snapshot(self) -> dict:
        return {
            "fit_round": self._fit_round,
            "eval": (self._eval_round, self._eval_splits),
            "updates": tuple(sorted(self._updates)),
            "reports": tuple(sorted(self._reports)),
            "sampled": tuple(self._sampled),
            "asked": tuple(self._asked),
            "history": len(self.history),
            "weights": tuple(float(v.double().sum()) for v in self.global_state.values()),
            "secure": None if self._secure is None else self._secure.snapshot(),
        }

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
        """Round ``t``'s GlobalModel: ``fit`` for the clients in ``fit``, and, if ``splits``, to every
        client for the evaluation of the same weights. Under secure aggregation every recipient takes
        part in the round's secure sum and evaluates :data:`SECURE_SPLITS` (the loop still reads only
        ``splits``, and the test split only after a new best)."""
        arrays = state_to_arrays(self.global_state)
        secure = self.secagg is not None
        sent = SECURE_SPLITS if secure and splits else splits
        recipients = [c for c in self.clients if c in fit or splits]
        out = [
            self._new(GlobalModel, c, round=t, fit=c in fit, splits=sent, arrays=arrays) for c in recipients
        ]
        self._fit_round, self._sampled, self._updates = (t, list(fit), {}) if fit else (0, [], {})
        self._missing["fit"] = []
        self._start_secure(t, recipients if secure else [], arrays)
        if fit or (secure and recipients):
            self._arm("fit", self.timeouts.fit)
        if splits and secure:
            self._eval_splits, self._missing["eval"] = tuple(splits), []
        elif splits:
            self._expect(t, splits)
        self._boundary = (t, list(fit), tuple(splits))
        return out

    def _expect(self, t: int, splits: tuple[str, ...]) -> None:
        self._eval_round, self._eval_splits, self._reports = t, splits, {}
        self._asked, self._missing["eval"] = list(self.clients), []
        self._arm("evaluate", self.timeouts.evaluate)

    def _sync_deadlines(self) -> None:
        """Disarm the deadlines of phases that no longer wait for anyone."""
        sec = self._secure
        if (
            self.state is not RoundsState.RUNNING
            or (sec is None and (not self._fit_round or len(self._updates) == len(self._sampled)))
            or (sec is not None and sec.stage == "done")
        ):
            self._disarm("fit")
        if (
            self.state is not RoundsState.RUNNING
            or not self._eval_round
            or len(self._reports) == len(self._asked)
        ):
            self._disarm("evaluate")

    def _quorum(self, asked: int) -> int:
        return max(1, math.ceil(self.min_participation * asked - 1e-9))

    def _expired(self, phase: str) -> list[Message]:
        """A phase's deadline passed: go on with the clients that answered, or stop (QuorumError)."""
        if self.state is not RoundsState.RUNNING:
            return []
        fit = phase == "fit"
        if fit and self._secure is not None:
            return self._secure_progress(expired=True)
        asked, got = (self._sampled, self._updates) if fit else (self._asked, self._reports)
        t = self._fit_round if fit else self._eval_round
        answered = [c for c in asked if c in got]
        missing = [c for c in asked if c not in got]
        if not missing or not t:
            return []
        required = self._quorum(len(asked))
        if len(answered) < required:
            return self._fail(
                QuorumError(
                    f"round {t}: {len(answered)} of {len(asked)} clients answered the {phase} phase before its "
                    f"deadline, {required} required; missing clients {missing}",
                    phase=phase,
                    missing=missing,
                    round=t,
                    answered=answered,
                    required=required,
                )
            )
        self._boundary = None
        if fit:
            self._sampled = answered
        else:
            self._asked = answered
        self._missing["fit" if fit else "eval"] = missing
        out = self._advance()
        self._sync_deadlines()
        return out

    def _fail(self, error: FaultError) -> list[Message]:
        self.state = RoundsState.ABORTED
        self.failure = error
        self.abort_reason = str(error)
        self._disarm("fit", "evaluate")
        return [
            self._new(Abort, c, code=int(AbortCode.TIMEOUT), reason=str(error)[:1000]) for c in self.clients
        ]

    # --- intake -------------------------------------------------------------------------------------
    def _handler(self, msg: Message) -> Handler | None:
        if self.state is RoundsState.RUNNING:
            handlers: dict[type, Handler] = {
                LocalUpdate: self._on_update,
                EvaluationReport: self._on_report,
                Abort: self._on_abort,
                **{cls: self._on_secure for cls in SECAGG_ANSWERS},
            }
            return handlers.get(type(msg))
        if self.state is RoundsState.DONE and isinstance(msg, (LocalUpdate, SecAggAdvert)):
            return self._on_late
        return None

    def _from_client(self, msg: Message) -> None:
        if not self.roster.is_client(msg.sender):
            raise AuthError(f"{msg.type_name} must come from a client, not party {msg.sender}")

    def _on_update(self, msg: LocalUpdate) -> list[Message]:
        self._from_client(msg)
        if self.secagg is not None:
            raise ConfigMismatchError(
                f"party {msg.sender} sent a plaintext LocalUpdate; this server runs secure aggregation"
            )
        if msg.round != self._fit_round or self._fit_round == 0:
            raise ReplayError(f"update for round {msg.round}; the server awaits round {self._fit_round}")
        if msg.sender not in self._sampled:
            why = (
                "was dropped after the deadline" if msg.sender in self._missing["fit"] else "was not sampled"
            )
            raise StateError(f"party {msg.sender} {why} in round {msg.round}")
        if msg.sender in self._updates:
            raise ReplayError(f"party {msg.sender} already sent its round-{msg.round} update")
        if msg.num_train > self.max_nodes:
            raise SizeLimitError(
                f"party {msg.sender} announces {msg.num_train} training nodes; the limit is {self.max_nodes}"
            )
        state = check_arrays(msg.arrays, self.global_state, "LocalUpdate") if msg.num_train else None
        self._boundary = None
        self._updates[msg.sender] = (state, msg.num_train, msg.loss)
        return self._progress()

    def _on_report(self, msg: EvaluationReport) -> list[Message]:
        self._from_client(msg)
        if self.secagg is not None:
            raise ConfigMismatchError(
                f"party {msg.sender} sent a plaintext EvaluationReport; this server runs secure aggregation"
            )
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

    def _on_late(self, msg: LocalUpdate | SecAggAdvert) -> list[Message]:
        """After the last round: drop the updates (or secure adverts) of the round that does not happen."""
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
        """Hand the loop every phase that has all its answers, and send what it asks for next.

        Round ``t``'s updates go to the loop once round ``t - 1``'s evaluation has ended; the loop's
        ``t + 1`` clients are sampled at once and asked in the GlobalModel that also asks for the
        evaluation of the new weights."""
        out: list[Message] = []
        loop = self.loop
        while self.state is RoundsState.RUNNING:
            secure = self._secure_aggregate()
            if secure is not None:
                out += secure
                continue
            plain = self.secagg is None and len(self._updates) == len(self._sampled)
            if not loop.evaluating and self._fit_round and plain:
                t, ids = self._fit_round, self._sampled
                updates = [
                    ClientUpdate(state if state is not None else loop.state, n, loss)
                    for state, n, loss in (self._updates[c] for c in ids)
                ]
                splits = loop.on_updates(self._indices(ids), updates, self._indices(self._missing["fit"]))
                out += self._send_round(t + 1, self._sample() if loop.more_rounds else [], splits)
                continue
            if loop.evaluating and self._eval_round and len(self._reports) == len(self._asked):
                label, splits = self._eval_round, self._eval_splits
                self._eval_round, self._eval_splits = 0, ()
                more = loop.on_reports(
                    splits, [self._reports[c] for c in self._asked], self._indices(self._missing["eval"])
                )
                if more:
                    self._expect(label, more)
                    out += [self._new(EvaluateRequest, c, round=label, splits=more) for c in self.clients]
                elif loop.done:
                    self.state = RoundsState.DONE
                    self._disarm("fit", "evaluate")
                continue
            break
        return out

    # --- checkpoints ----------------------------------------------------------------------------------
    def _config(self) -> dict:
        return {
            "clients": self.clients,
            "rounds": self.rounds,
            "patience": self.patience,
            "fraction": self.fraction,
            "test_every_round": self.test_every_round,
            "weights": {k: list(v.shape) for k, v in self.global_state.items()},
            "strategy": self.strategy.config(),
            "secagg": None if self.secagg is None else self.secagg.to_value(),
        }

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
        loop_meta, arrays = self.loop.state_to_checkpoint()
        strategy_state = loop_meta.pop("strategy_state")
        meta = {
            **self._checkpoint_base(),
            "config": self._config(),
            "boundary": [t, fit, list(splits)],
            **loop_meta,
            "timings": dict(self.timings),
            "strategy_state": strategy_state,
        }
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
        self.loop.state_from_checkpoint(meta, ckpt.arrays)
        self._restored = True
