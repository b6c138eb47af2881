"""The client side of the FedAvg rounds (:class:`ClientRounds`) and what both sides share: the wire
form of weights (:func:`state_to_arrays`, float32 only), the secure-aggregation input vector
(:func:`secure_vector`, :func:`secure_mean`), the frame limit and the parties' states.
See :mod:`fedgat.protocols.fedavg` for the protocol."""

from __future__ import annotations

import copy
import enum
import logging
import math
from collections.abc import Mapping

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
from fedgat.dp_fedavg import DP_NEEDS_SECAGG, UpdateBudgetError
from fedgat.federated import Client, ClientUpdate, NonFiniteUpdateError, StateDict, stream_state
from fedgat.rounds import Counts, exact_weights

from .errors import (
    AuthError,
    ConfigMismatchError,
    PayloadError,
    PrivacyBudgetError,
    ReplayError,
    StateError,
    TrainingRefusedError,
)
from .messages import Abort, EvaluateRequest, EvaluationReport, GlobalModel, LocalUpdate, Message, SplitCounts
from .messages_rounds import MAX_WEIGHT_ABS, check_weights
from .messages_secagg import (
    SECAGG_MESSAGES,
    SecAggAdvert,
    SecAggCohort,
    SecAggConfirm,
    SecAggMasked,
    SecAggRelay,
    SecAggShares,
    SecAggSurvivors,
    SecAggUnmaskRequest,
    SecAggUnmaskShares,
)
from .party import PHASES, Handler, Party
from .party_values import PartyReport, PartySpec
from .roster import Identity, Roster
from .secagg import PART_COUNTS, PART_UPDATE, SecAggConfig, encode, model_digest
from .secagg_client import ClientSecAgg
from .training_values import absorb_rounds, report_rounds, rounds_from_spec, rounds_spec_fields

__all__ = [
    "CLIENT_KIND",
    "DEFAULT_SECAGG",
    "FRAME_OVERHEAD",
    "SECURE_SPLITS",
    "ClientRounds",
    "RoundsState",
    "check_secure_splits",
    "secure_length",
    "secure_mean",
    "secure_vector",
    "state_to_arrays",
]

#: frame bytes allowed above the model's weights (header, names, shapes, signature)
FRAME_OVERHEAD = 64 * 1024
CLIENT_KIND = "fedgat.fedavg.client"
#: secure aggregation as ServerRounds and ClientRounds run it unless told otherwise (None: off)
DEFAULT_SECAGG = SecAggConfig()
#: the splits whose counts every secure input carries (their sum is all the server learns of them)
SECURE_SPLITS = ("val", "test")
# the secure-aggregation stages' framing and checks are timed as their own phase
PHASES.update(dict.fromkeys(SECAGG_MESSAGES, "secagg"))


logger = logging.getLogger(__name__)


def model_frame_limit(state: StateDict, clients: int = 0, secure: bool = False) -> int:
    """Largest frame a party accepts: the float32 weights of ``state`` plus :data:`FRAME_OVERHEAD`;
    with secure aggregation, also a masked input (16 bytes per weight) and the cohort-sized stage
    messages of ``clients`` clients."""
    plain = sum(t.numel() * 4 + 4 * t.dim() + 256 for t in state.values()) + FRAME_OVERHEAD
    if not secure:
        return plain
    masked = 16 * secure_length(state) + 256 * clients + FRAME_OVERHEAD
    return max(plain, masked)


def check_headroom(arrays: Mapping[str, np.ndarray], headroom: float) -> None:
    """Under DP-FedAvg: every global weight at least ``headroom``
    (:attr:`fedgat.dp_fedavg.UpdateDP.headroom`) below :data:`MAX_WEIGHT_ABS`, so that the noised
    weights a client releases stay within the limit but with negligible probability. Checked on the
    server's model alone, before training: refusing it says nothing about the client's data, while
    refusing a release at the limit would tell the server one bit of an individual noise share.

    Raises:
        PayloadError: naming the first array with a weight too close to the limit.
    """
    bound = MAX_WEIGHT_ABS - headroom
    for name, arr in arrays.items():
        a = np.asarray(arr)
        if a.size and a.dtype.kind == "f" and float(np.max(np.abs(a))) > bound:
            raise PayloadError(
                f"GlobalModel.arrays[{name!r}] holds |w| = {float(np.max(np.abs(a))):.6g}, within "
                f"{headroom:.3g} of the limit {MAX_WEIGHT_ABS:.0e}: under DP-FedAvg this client's noised "
                f"weights could reach the limit (it accepts |w| <= {max(bound, 0.0):.6g})"
            )


def secure_vector(
    update: ClientUpdate | None, reference: StateDict, counts: Mapping[str, Counts] | None = None
) -> np.ndarray:
    """A client's input to secure aggregation, float64: :math:`(n_k w_k, n_k, n_k L_k)` -- its weights
    (in ``reference``'s order, flattened) and its loss scaled by its weight, then the weight itself --
    followed by its evaluation counts ``(correct, count, loss_sum)`` of each split of
    :data:`SECURE_SPLITS` on the weights it received (zeros for a split not evaluated). A client that
    does not train (``update`` None, or no training nodes) sends zeros in the first part: it adds
    nothing there, and the server cannot tell."""
    size = sum(t.numel() for t in reference.values())
    head = np.zeros(size + 2)
    if update is not None and update.num_train > 0:
        n = update.num_train
        flat = np.concatenate([a.astype(np.float64).ravel() for a in state_to_arrays(update.state).values()])
        head = np.concatenate([flat * n, [n, _bounded(n * update.loss)]])  # NaN (DP-FedAvg): not sent, 0
    tail = np.zeros(3 * len(SECURE_SPLITS))
    for i, split in enumerate(SECURE_SPLITS):
        if counts is not None and split in counts:
            tail[3 * i : 3 * i + 3] = [_bounded(v) for v in counts[split]]
    return np.concatenate([head, tail])


#: the largest loss (sum) a client puts in the secure sum: far above any honest one, far below the
#: fixed-point bound (a trap model's overflowing loss would otherwise be refused, a bit of the data)
LOSS_BOUND = 1e15


def _bounded(value: float) -> float:
    """``value`` within ``+-LOSS_BOUND``, a NaN or infinite one as 0 (a fourteenth review pass)."""
    v = float(value)
    return min(max(v, -LOSS_BOUND), LOSS_BOUND) if math.isfinite(v) else 0.0


def secure_length(reference: StateDict) -> int:
    """Elements of a :func:`secure_vector` for a model shaped as ``reference``."""
    return sum(t.numel() for t in reference.values()) + 2 + 3 * len(SECURE_SPLITS)


def secure_mean(
    sums: np.ndarray, reference: StateDict, exact: bool = True
) -> tuple[StateDict | None, float, float, dict[str, Counts]]:
    """``(mean state, total weight, weighted loss sum, pooled counts)`` from the decoded sum of
    :func:`secure_vector` inputs: the weighted mean cast to ``reference``'s dtypes (None when the
    total weight is 0) and, per split of :data:`SECURE_SPLITS`, the summed counts (``exact``: integers
    rounded from the fixed-point sum; else, the noised counts of DP-FedAvg, as summed)."""
    size = sum(t.numel() for t in reference.values())
    total, loss_sum = float(sums[size]), float(sums[size + 1])
    pooled = {}
    for i, split in enumerate(SECURE_SPLITS):
        correct, count, split_loss = (float(v) for v in sums[size + 2 + 3 * i : size + 5 + 3 * i])
        if exact:
            correct, count = round(correct), round(count)
        pooled[split] = Counts(correct, count, split_loss)
    if total <= 0:
        return None, 0.0, 0.0, pooled
    mean, start = {}, 0
    for name, t in reference.items():
        part = sums[start : start + t.numel()] / total
        mean[name] = torch.from_numpy(part.reshape(tuple(t.shape))).to(t.dtype)
        start += t.numel()
    return mean, total, loss_sum, pooled


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


def check_arrays(arrays: dict[str, np.ndarray], reference: StateDict, what: str) -> StateDict:
    """Received weights as tensors, once their names and shapes are those of ``reference``.

    Raises:
        PayloadError: other names, order or shapes; NaN, infinite or huge values
            (:func:`~fedgat.protocols.messages_rounds.check_weights`).
    """
    if list(arrays) != list(reference):
        raise PayloadError(f"{what}: weight names {list(arrays)[:4]} do not match the model's")
    for name, arr in arrays.items():
        if tuple(arr.shape) != tuple(reference[name].shape):
            raise PayloadError(
                f"{what}: {name} has shape {arr.shape}, expected {tuple(reference[name].shape)}"
            )
    check_weights(arrays, what)
    return {name: torch.from_numpy(arr) for name, arr in arrays.items()}


def check_secure_splits(splits: tuple[str, ...]) -> None:
    """Under secure aggregation a client evaluates all of :data:`SECURE_SPLITS` or none: its advert's
    counts part covers every split, so a member asked for a split the others were not asked for
    would leave that split's sum to it alone (a seventh review pass read one client's evaluation
    that way, one round per probe).

    Raises:
        PayloadError: another set of splits.
    """
    if splits and set(splits) != set(SECURE_SPLITS):
        raise PayloadError(f"under secure aggregation a client evaluates all of {SECURE_SPLITS} or none")


class ClientRounds(Party):
    """A FedAvg client around a :class:`fedgat.federated.Client` (its training and evaluation code).

    Args:
        party_id, roster, session, identity: identity and session.
        client: the in-process client (model replica, the client half of the strategy and the
            optimiser it built, local tasks).
        fingerprint: the session's CKKS key fingerprint when rounds follow an encrypted pre-training.
        secagg: secure aggregation (default :data:`DEFAULT_SECAGG`; None: updates in plaintext, as
            :class:`~fedgat.protocols.fedavg.ServerRounds` must be configured too). The client then
            answers a fit GlobalModel with a SecAggAdvert and follows the stages of
            :mod:`~fedgat.protocols.secagg_client`; it refuses a cohort below ``min_cohort``.
            A client under DP-FedAvg (``client.update_dp``) needs it (``ValueError`` for None).
        seed: give the client its own torch random stream (dropout) seeded so (it replaces the
            stream of ``client``, :attr:`fedgat.federated.Client.rng_state`). None: ``client``'s own
            stream, if it has one, else the process-wide stream. Specs, checkpoints and mid-run
            states carry the stream, so a hosted or restored client continues exactly; with one,
            :class:`fedgat.federated.Server` over the same clients trains the same model.

    As a value (:mod:`fedgat.protocols.training_values`): :meth:`spec` before its first message
    (model description and weights, optimiser, strategy, tasks), :meth:`report` / :meth:`absorb`.
    """

    PARTY_KIND = "rounds.client"

    def __init__(
        self,
        party_id: int,
        roster: Roster,
        session: int,
        identity: Identity,
        *,
        client: Client,
        fingerprint: bytes | None = None,
        seed: int | None = None,
        secagg: SecAggConfig | None = DEFAULT_SECAGG,
    ) -> None:
        if client.update_dp is not None and secagg is None:
            raise ValueError(DP_NEEDS_SECAGG)
        super().__init__(party_id, roster, session, identity.signer)
        self.client = client
        self.secagg = secagg
        self._secure: ClientSecAgg | None = None  # the secure round under way
        self.verifier.fingerprint = fingerprint
        self.state = RoundsState.RUNNING
        self.last_round = 0
        self._weights: StateDict | None = None  # the last global weights received
        self._evaluated: set[str] = set()
        self._reference = {k: v.detach() for k, v in client.model.state_dict().items()}
        if seed is not None:
            client.rng_state = stream_state(seed)
        self.max_frame_bytes = model_frame_limit(self._reference, len(roster.clients), secagg is not None)

    @property
    def global_weights(self) -> StateDict | None:
        """The last global weights received (after the run: the final model's; None before any)."""
        return self._weights

    @property
    def done(self) -> bool:
        return self.state is not RoundsState.ABORTED

    def _snapshot(self) -> dict:
        return {
            "last_round": self.last_round,
            "evaluated": tuple(sorted(self._evaluated)),
            "weights": tuple(float(v.double().sum()) for v in self.client.model.state_dict().values()),
            "secure": None if self._secure is None else self._secure.snapshot(),
            "dp_releases": self.client.dp_releases,
        }

    # --- as a value (fedgat.protocols.training_values) -------------------------------------------------
    def _spec_fields(self) -> dict:
        return rounds_spec_fields(self)

    @classmethod
    def from_spec(cls, spec: PartySpec) -> ClientRounds:
        return rounds_from_spec(cls, spec)

    def _report_values(self) -> tuple[dict[str, int], dict]:
        return report_rounds(self)

    def _absorb(self, report: PartyReport) -> None:
        absorb_rounds(self, report)

    def _handler(self, msg: Message) -> Handler | None:
        if self.state is not RoundsState.RUNNING:
            return None
        handlers: dict[type, Handler] = {
            GlobalModel: self._on_model,
            EvaluateRequest: self._on_request,
            Abort: self._on_abort,
            SecAggCohort: self._on_secure,
            SecAggRelay: self._on_secure,
            SecAggSurvivors: self._on_secure,
            SecAggUnmaskRequest: self._on_secure,
        }
        return handlers.get(type(msg))

    def _from_server(self, msg: Message) -> None:
        if msg.sender != self.roster.server:
            raise AuthError(f"{msg.type_name} must come from the server, not party {msg.sender}")

    def _on_abort(self, msg: Abort) -> list[Message]:
        self._from_server(msg)
        self.state = RoundsState.ABORTED
        self.abort_reason = f"server aborted (code {msg.code}): {msg.reason}"
        return []

    def _report(self, t: int, splits: tuple[str, ...]) -> Message:
        """A plaintext EvaluationReport (rounds without secure aggregation only, so never under
        DP-FedAvg: the counts are exact integers)."""
        counts = self._evaluate(splits)
        return self._new(
            EvaluationReport,
            self.roster.server,
            round=t,
            splits=tuple(
                SplitCounts(s, int(counts[s].correct), int(counts[s].count), counts[s].loss_sum)
                for s in splits
            ),
        )

    def _on_model(self, msg: GlobalModel) -> list[Message]:
        self._from_server(msg)
        if msg.round <= self.last_round:
            raise ReplayError(
                f"global model of round {msg.round}; round {self.last_round} was already served"
            )
        if self.secagg is not None:
            check_secure_splits(msg.splits)
        weights = check_arrays(msg.arrays, self._reference, "GlobalModel")
        if self.client.update_dp is not None:
            check_headroom(msg.arrays, self.client.update_dp.headroom)
        # a DP-FedAvg release stays charged when the round is refused below (a ninth review pass
        # read one bit of an uncharged one); under DP nothing below refuses on the client's data
        # before its noise (a twelfth: a diverged update is released as zero, and the headroom
        # check above keeps the noised weights off the limit)
        saved = self._save_for_rollback() if msg.fit else None
        self.last_round, self._weights, self._evaluated = msg.round, weights, set()
        out: list[Message] = []
        update: ClientUpdate | None = None
        counts: dict[str, Counts] = {}
        with self.clock("training"):
            try:
                if msg.splits and self.secagg is None:
                    out.append(self._report(msg.round, msg.splits))
                elif msg.splits:
                    counts = self._evaluate(msg.splits)
                arrays: dict[str, np.ndarray] = {}
                if msg.fit:
                    try:
                        update = self._fit(weights)
                        arrays = state_to_arrays(update.state) if update.num_train else {}
                        check_weights(arrays, "LocalUpdate")
                    except (NonFiniteUpdateError, PayloadError) as exc:
                        if self.secagg is None or saved is None:
                            raise
                        update = self._unchanged(msg.round, weights, saved, exc)
                if self.secagg is not None:  # FixedPointOverflowError is a PayloadError
                    vector = encode(secure_vector(update, self._reference, counts), len(self.roster.clients))
            except (NonFiniteUpdateError, PayloadError) as exc:
                if saved is not None:
                    self._rollback(saved)
                raise TrainingRefusedError(msg.round, detail=str(exc)) from None
            except UpdateBudgetError as exc:
                raise PrivacyBudgetError(
                    f"GlobalModel of round {msg.round}: {exc}; the client leaves the run"
                ) from None
            if update is not None and self.secagg is None:
                out.append(
                    self._new(
                        LocalUpdate,
                        self.roster.server,
                        round=msg.round,
                        num_train=update.num_train,
                        loss=update.loss,
                        arrays=arrays,
                    )
                )
        secure = None  # a newer global model ends any secure round under way
        if self.secagg is not None:
            with self.clock("secagg"):
                # what this input really adds: a member without training (or evaluation) nodes adds
                # zeros there and must not count as a contributor (a seventh review pass); under
                # DP-FedAvg its noise share is a contribution (the h shares the accountant counts)
                private = self.client.update_dp is not None
                adds_update = update is not None and update.num_train > 0
                adds_counts = bool(counts) and (private or all(c.count > 0 for c in counts.values()))
                parts = (PART_UPDATE if adds_update else 0) | (PART_COUNTS if adds_counts else 0)
                secure = ClientSecAgg.begin(
                    self.secagg,
                    self.session,
                    msg.round,
                    self.party_id,
                    model_digest(msg.arrays),
                    vector,
                    parts,
                )
                out.append(self._new(SecAggAdvert, self.roster.server, **secure.advert(self._signer)))
        self._secure = secure
        return out

    def _evaluate(self, splits: tuple[str, ...]) -> dict[str, Counts]:
        """Counts of the last global weights on ``splits`` as they leave the client (under
        DP-FedAvg clipped, noised and charged: :meth:`fedgat.federated.Client.release_counts`)."""
        assert self._weights is not None
        counts = self.client.release_counts(self._weights, splits)
        self._evaluated.update(splits)
        return {s: Counts(counts[s].correct, counts[s].count, counts[s].loss_sum) for s in splits}

    def _on_secure(
        self, msg: SecAggCohort | SecAggRelay | SecAggSurvivors | SecAggUnmaskRequest
    ) -> list[Message]:
        """A stage of the secure round under way (:mod:`~fedgat.protocols.secagg_client`)."""
        self._from_server(msg)
        if self.secagg is None:
            raise ConfigMismatchError(
                f"{msg.type_name}: this client runs the rounds without secure aggregation"
            )
        secure = self._secure
        if secure is None:
            raise StateError(f"{msg.type_name} for round {msg.round}: no secure round is under way")
        with self.clock("secagg"):
            if isinstance(msg, SecAggCohort):
                return [
                    self._new(
                        SecAggShares, self.roster.server, **secure.on_cohort(msg, self.roster, self._signer)
                    )
                ]
            if isinstance(msg, SecAggRelay):
                return [self._new(SecAggMasked, self.roster.server, **secure.on_relay(msg, self.roster))]
            if isinstance(msg, SecAggSurvivors):
                return [
                    self._new(SecAggConfirm, self.roster.server, **secure.on_survivors(msg, self._signer))
                ]
            return [self._new(SecAggUnmaskShares, self.roster.server, **secure.on_unmask(msg, self.roster))]

    def _on_request(self, msg: EvaluateRequest) -> list[Message]:
        self._from_server(msg)
        if self.secagg is not None:
            raise ConfigMismatchError(
                "EvaluateRequest: under secure aggregation counts travel only inside the masked sum"
            )
        if msg.round != self.last_round or self._weights is None:
            raise ReplayError(
                f"evaluation of round {msg.round}; the last weights are of round {self.last_round}"
            )
        if self._evaluated & set(msg.splits):
            raise ReplayError(
                f"splits {sorted(self._evaluated & set(msg.splits))} of round {msg.round} "
                "were already reported"
            )
        with self.clock("training"):
            return [self._report(msg.round, msg.splits)]

    def _unchanged(self, t: int, weights: StateDict, saved: tuple, exc: Exception) -> ClientUpdate:
        """Under secure aggregation, what a client sends when its local training diverged or left the
        weight bound: the global weights unchanged, with its usual weight and a zero loss (under
        DP-FedAvg: the zero update's release), the model, optimiser and (CPU) random stream as before
        the round; a captured CUDA graph is dropped (it would step the optimiser tensors the rollback
        replaced; a fifteenth review pass), later steps run eagerly. Refusing instead told the
        server, round after round, whether a trap model's training diverged on this client's data (a
        fourteenth review pass: five words of a client read in one session). Now the trace is in the
        securely summed update only -- exactly, without DP-FedAvg, where the aggregate is an exact
        function of the data anyway (trap weights, and per client with known break 2's differencing;
        a fifteenth pass read a word per cohort member per round from the loss slot): only DP-FedAvg
        bounds it. Without secure aggregation the client still refuses (its update would be seen
        anyway)."""
        self._restore_training(saved)
        logger.warning(
            "round %d: local training gave values this client cannot send (%s); it sends the global "
            "weights unchanged instead",
            t,
            exc,
        )
        dp = self.client.update_dp
        if dp is not None:  # the release (charged already) of the zero update, as privatize makes it
            return ClientUpdate(dp.privatize(weights, weights), 1, float("nan"))
        return ClientUpdate(weights, self.client.num_train, 0.0)

    def _save_for_rollback(self) -> tuple:
        """What handling a GlobalModel changes (restored by :meth:`_rollback` when training fails)."""
        return (
            self._seq,
            self.last_round,
            self._weights,
            set(self._evaluated),
            {k: v.detach().clone() for k, v in self.client.model.state_dict().items()},
            copy.deepcopy(self.client.optimizer.state_dict()),
            self._rng.clone() if self._rng is not None else None,
            torch.get_rng_state() if self._rng is None else None,  # the process-wide stream it draws from
        )

    def _rollback(self, saved: tuple) -> None:
        self._seq, self.last_round, self._weights, self._evaluated = saved[:4]
        self._restore_training(saved)

    def _restore_training(self, saved: tuple) -> None:
        """The model, optimiser and random stream of :meth:`_save_for_rollback`'s ``saved``."""
        model, opt, rng, global_rng = saved[4:]
        self.client.model.load_state_dict(model)
        self.client.optimizer.load_state_dict(opt)  # new state tensors: a captured CUDA graph's
        self.client._graphed = None  # ... would keep stepping the old ones, so steps run eagerly now
        self._rng = rng
        if global_rng is not None:
            torch.set_rng_state(global_rng)

    @property
    def _rng(self) -> torch.Tensor | None:
        """The client's own random stream (:attr:`fedgat.federated.Client.rng_state`), None when it
        draws from the process-wide one."""
        return self.client.rng_state

    @_rng.setter
    def _rng(self, state: torch.Tensor | None) -> None:
        self.client.rng_state = state

    def _fit(self, weights: StateDict) -> ClientUpdate:
        """Local training (from the client's own random stream when it has one)."""
        return self.client.fit(weights)

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
        meta = {
            **self._checkpoint_base(),
            "last_round": self.last_round,
            "evaluated": sorted(self._evaluated),
            "optimizer": opt_meta,
            "has_weights": self._weights is not None,
            "shapes": {k: list(v.shape) for k, v in self._reference.items()},
            "dp_releases": self.client.dp_releases,
        }
        return Checkpoint(CLIENT_KIND, meta, arrays)

    def restore(self, ckpt: Checkpoint) -> None:
        """Load a :meth:`checkpoint` into this fresh client (same model architecture and optimiser).

        Raises:
            CheckpointMismatchError: another kind, party, session or model.
            StateError: the client has already handled a message.
        """
        if self.last_round != 0 or self.state is not RoundsState.RUNNING:
            raise StateError("restore() needs a client that has handled no message")
        ckpt.require(
            CLIENT_KIND,
            party=self.party_id,
            session=self.session,
            shapes={k: list(v.shape) for k, v in self._reference.items()},
        )
        meta, arrays = ckpt.meta, ckpt.arrays
        if ("rng" in arrays) != (self._rng is not None):
            raise CheckpointMismatchError(
                "the checkpoint and this client disagree on a private random stream"
            )
        self._restore_base(meta)
        self.client.model.load_state_dict(exact_weights(arrays_to_tensors(arrays, "model/"), self._reference))
        optimizer_from_checkpoint(self.client.optimizer, meta["optimizer"], arrays)
        self._weights = (
            exact_weights(arrays_to_tensors(arrays, "weights/"), self._reference)
            if meta["has_weights"]
            else None
        )
        if self._rng is not None:
            self._rng = torch.from_numpy(np.array(arrays["rng"]))
        self.last_round, self._evaluated = int(meta["last_round"]), set(meta["evaluated"])
        self.client.dp_releases = int(
            meta.get("dp_releases", meta.get("dp_rounds", 0))
        )  # "dp_rounds": before v11
