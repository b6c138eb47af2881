"""Two mixins of :class:`~fedgat.protocols.fedavg.ServerRounds` (see :mod:`fedgat.protocols.fedavg`):

* :class:`LoopView` -- the round loop's state under the names callers know (``global_state``,
  ``history``, ``result``, ...);
* :class:`SecureRounds` -- the secure-aggregation half: it starts a
  :class:`~fedgat.protocols.secagg_server.ServerSecAgg` round with each fit round, takes the clients'
  answers to its stages, sends the next stage's requests, and hands the unmasked aggregate to the
  round loop (:meth:`fedgat.rounds.RoundLoop.on_aggregate`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np

from fedgat.federated import FitResult, StateDict
from fedgat.rounds import RoundLoop
from fedgat.strategies import ServerStrategy

from .errors import ConfigMismatchError, QuorumError, ReplayError
from .fedavg_client import secure_mean
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

    def _start_secure(self, t: int, fit: list[int], arrays: dict[str, np.ndarray]) -> None:
        """Round ``t``'s secure aggregation over ``fit``, for the model ``arrays`` just sent (or none)."""
        srv = cast("ServerRounds", self)
        srv._secure = None
        if fit and srv.secagg is not None:
            length = sum(a.size for a in arrays.values()) + 2
            digest = model_digest(arrays)
            quorum = srv._quorum(len(fit))
            srv._secure = ServerSecAgg(srv.secagg, srv.roster, srv.session, t, fit, digest, length, quorum)

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

    def _secure_aggregate(self) -> list[Message] | None:
        """Hand a finished secure round's aggregate to the loop and send the next round (None: no
        finished secure round, or the previous round is still under evaluation)."""
        srv = cast("ServerRounds", self)
        sec, loop = srv._secure, srv.loop
        if loop.evaluating or sec is None or sec.result is None:
            return None
        t, ids, missing = srv._fit_round, sec.u3, sec.missing()
        srv._secure, srv._missing["fit"] = None, missing
        mean, total, loss_sum = secure_mean(sec.result, loop.state)
        splits = loop.on_aggregate(srv._indices(ids), mean, total, loss_sum, srv._indices(missing))
        return srv._send_round(t + 1, srv._sample() if loop.more_rounds else [], splits)
