"""Two mixins of :class:`~fedgat.protocols.fedavg.ServerRounds` (see :mod:`fedgat.protocols.fedavg`):

* :class:`LoopView` -- the round loop's state under the names callers know (``global_state``,
  ``history``, ``result``, ...);
* :class:`SecureRounds` -- the secure-aggregation half: it starts a
  :class:`~fedgat.protocols.secagg_server.ServerSecAgg` round with each GlobalModel (every client that
  receives it takes part: the sampled ones with their update, all with their evaluation counts),
  takes the clients' answers to its stages, sends the next stage's requests, and hands the unmasked
  sums to the round loop (:meth:`fedgat.rounds.RoundLoop.on_reports`, then
  :meth:`~fedgat.rounds.RoundLoop.on_aggregate`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np

from fedgat.federated import FitResult, StateDict
from fedgat.rounds import RoundLoop
from fedgat.strategies import ServerStrategy

from .errors import ConfigMismatchError, QuorumError, ReplayError
from .fedavg_client import RoundsState, secure_length, secure_mean
from .frame import Message
from .secagg import model_digest
from .secagg_server import ServerSecAgg

if TYPE_CHECKING:
    from .fedavg import ServerRounds

__all__ = ["LoopView", "SecureRounds"]


class LoopView:
    """Read-only views of :attr:`loop` (a :class:`fedgat.rounds.RoundLoop`)."""

    loop: RoundLoop

    @property
    def global_state(self) -> StateDict:
        return self.loop.state

    @property
    def best_state(self) -> StateDict:
        return self.loop.best_state

    @property
    def history(self) -> list[dict]:
        return self.loop.history

    @property
    def result(self) -> FitResult | None:
        return self.loop.result

    @property
    def strategy(self) -> ServerStrategy:
        return self.loop.strategy

    @property
    def rng(self) -> np.random.Generator:
        return self.loop.rng

    @property
    def rounds(self) -> int:
        assert self.loop.rounds is not None
        return self.loop.rounds

    @property
    def patience(self) -> int | None:
        return self.loop.patience

    @property
    def fraction(self) -> float:
        return self.loop.fraction

    @property
    def test_every_round(self) -> bool:
        return self.loop.test_every_round

    @property
    def best_test_accuracy(self) -> float:
        """Test accuracy at the best validation round so far (NaN before the first)."""
        return self.loop.best_test

    @property
    def clients_per_round(self) -> int:
        return self.loop.clients_per_round


class SecureRounds:
    """Methods of :class:`~fedgat.protocols.fedavg.ServerRounds` for its secure rounds (``self._secure``)."""

    def _start_secure(self, t: int, cohort: list[int], arrays: dict[str, np.ndarray]) -> None:
        """Round ``t``'s secure aggregation over ``cohort`` (the clients just sent the model
        ``arrays``; none: no secure round)."""
        srv = cast("ServerRounds", self)
        srv._secure = None
        if cohort and srv.secagg is not None:
            digest = model_digest(arrays)
            quorum = srv._quorum(len(cohort))
            length = secure_length(srv.global_state)
            srv._secure = ServerSecAgg(srv.secagg, srv.roster, srv.session, t, cohort, digest, length, quorum)

    def _on_secure(self, msg: Message) -> list[Message]:
        """A client's answer to a stage of the secure round under way."""
        srv = cast("ServerRounds", self)
        srv._from_client(msg)
        if srv.secagg is None:
            raise ConfigMismatchError(
                f"{msg.type_name}: this server runs the rounds without secure aggregation"
            )
        if srv._secure is None:
            raise ReplayError(f"{msg.type_name} from party {msg.sender}: no secure round is under way")
        with srv.clock("secagg"):
            srv._secure.receive(msg)
        srv._boundary = None
        return srv._secure_progress()

    def _secure_progress(self, expired: bool = False) -> list[Message]:
        """Close the stages that have all their answers (or, ``expired``, the current one with the
        answers that arrived), send the next stage's requests, then go on with the rounds."""
        srv = cast("ServerRounds", self)
        sec, out = srv._secure, []
        assert sec is not None
        while sec.stage != "done" and (expired or sec.ready()):
            expired = False
            with srv.clock("secagg"):
                sends = sec.close()
            if isinstance(sends, QuorumError):
                return srv._fail(sends)
            out += [srv._new(cls, c, **fields) for c, cls, fields in sends]
            srv._arm("fit", srv.timeouts.fit)
        return out + srv._progress()

    def _private_row(self) -> None:
        """Under DP-FedAvg the clients send no loss: the round's row says NaN, not 0."""
        srv = cast("ServerRounds", self)
        if srv.update_dp is not None and srv.loop.metrics is not None:
            srv.loop.metrics["train_loss"] = float("nan")

    @property
    def dp_epsilon(self) -> float | None:
        """Epsilon (at the settings' delta) that the rounds so far spent of each client's DP-FedAvg
        budget, counting every round aggregated as one a client trained in and every evaluation
        asked for as one it released (None: DP-FedAvg off)."""
        srv = cast("ServerRounds", self)
        if srv.update_dp is None:
            return None
        # every aggregated round is evaluated once (its row ends with the evaluation)
        evaluations = len(srv.loop.history) + int(srv.loop.evaluating)
        return srv.update_dp.epsilon(srv.loop.round + evaluations)

    def _secure_aggregate(self) -> list[Message] | None:
        """Hand a finished secure round's sums to the loop -- first the pooled counts of the weights
        the round sent (if they were under evaluation), then the sampled survivors' aggregate -- and
        send the next round (None: no finished secure round)."""
        srv = cast("ServerRounds", self)
        sec, loop = srv._secure, srv.loop
        if sec is None or sec.result is None:
            return None
        t, survivors, missing = sec.round, set(sec.u3), sec.missing()
        srv._secure = None
        # under DP-FedAvg the counts are noised releases: pooled as summed, not rounded to integers
        mean, total, loss_sum, pooled = secure_mean(sec.result, loop.state, exact=srv.update_dp is None)
        if loop.evaluating:
            splits, dropped = srv._eval_splits, srv._indices(missing)
            while splits:
                splits = loop.on_reports(splits, [pooled], dropped)
            srv._eval_splits = ()
            if loop.done:
                srv.state = RoundsState.DONE
                srv._disarm("fit", "evaluate")
                return []
        fit = [c for c in srv._sampled if c in survivors]
        srv._missing["fit"] = [c for c in srv._sampled if c not in survivors]
        if not srv._fit_round:
            return []
        splits = loop.on_aggregate(
            srv._indices(fit), mean, total, loss_sum, srv._indices(srv._missing["fit"])
        )
        srv._private_row()
        return srv._send_round(t + 1, srv._sample() if loop.more_rounds else [], splits)
