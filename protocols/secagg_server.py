r"""The server's half of one secure-aggregation round (:class:`ServerSecAgg`): pure state, no
messages of its own (it returns what to send; :class:`~fedgat.protocols.fedavg.ServerRounds` frames it).

Stages and what the server learns (Bonawitz et al. 2017; :mod:`~fedgat.protocols.secagg_client` is
the client's side):

1. **advertise keys** -- the sampled clients' signed adverts (round public keys, a commitment to
   each self-mask seed, the digest of the model they received, the client's settings). The *cohort*
   is the set of advertisers, less those whose own ``min_cohort`` exceeds it (:func:`fitting`);
   fewer than ``max(min_cohort, quorum)`` and the round stops (:class:`QuorumError`). The cohort's
   threshold comes from its members' settings (the strictest), not from the server's: it protects
   the clients, whose settings it is.
2. **share keys** -- the cohort's adverts go to every member; each answers with its shares sealed
   to every other member. The server relays them unopened; the senders form :math:`U_2`
   (at least :math:`t`).
3. **masked input** -- every member of :math:`U_2` gets the shares dealt to it and answers with its
   masked input; the senders form the survivors :math:`U_3` (at least :math:`t`).
4. **consistency check** -- every survivor gets :math:`U_3` and answers with its signature over it
   (and the cohort it saw); the signers form :math:`U_4` (at least :math:`t`).
5. **unmask** -- every member of :math:`U_4` gets :math:`U_3` with :math:`U_4`'s signatures and
   answers with the shares of the survivors' self-mask seeds and of the dropped clients'
   (:math:`U_2 \setminus U_3`) mask-key seeds, each with its dealer's signature; from any :math:`t`
   answers the server rebuilds those seeds (checked against the adverts' commitment and
   public key; when the first :math:`t` shares do not check out, those whose dealer's signature
   does not verify are set aside and the first :math:`t` of the rest used), removes the masks
   and decodes :math:`\sum_{v \in U_3} (n_v w_v, n_v, n_v L_v)`.

The server learns that sum and the sets :math:`S_t \supseteq U_1 \supseteq U_2 \supseteq U_3
\supseteq U_4`, never
one client's update, weight or loss (unless the sum has one term, which ``min_cohort`` and
:math:`t \ge 3` exclude). Every stage waits for all the clients it asked, or for the ``fit``
deadline (then it goes on with those that answered, if there are enough).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from fedgat.crypto import SignatureError as CryptoSignatureError
from fedgat.crypto import verify

from .errors import PayloadError, QuorumError, ReplayError, StateError
from .frame import Message
from .messages_secagg import (
    AdvertItem,
    Confirmation,
    SealedShare,
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
from .roster import Roster
from .secagg import (
    SecAggConfig,
    b_commitment,
    cohort_view,
    combine_shares,
    dealt_bytes,
    decode,
    mask_key,
    public_bytes,
    unmask_sum,
)
from .secagg_client import check_advert, check_confirmation

__all__ = ["STAGES", "ServerSecAgg", "fitting"]

STAGES = ("keys", "shares", "masked", "confirm", "unmask", "done")


class Revealed(NamedTuple):
    """A share ``holder`` revealed: its Shamir index ``position``, the share and the dealer's signature."""

    holder: int
    position: int
    share: bytes
    signature: bytes


Send = tuple[int, type[Message], dict[str, Any]]


def fitting(parties: list[int], adverts: dict[int, AdvertItem]) -> list[int]:
    """``parties`` without the advertisers whose own ``min_cohort`` exceeds the cohort left (they
    would refuse it, and under the strictest settings their ``min_cohort`` would make every member
    deal for a threshold no round reaches: an eleventh review pass stopped honest runs of mixed
    ``min-cohort`` that way)."""
    left = list(parties)
    while any(adverts[c].min_cohort > len(left) for c in left):
        left = [c for c in left if adverts[c].min_cohort <= len(left)]
    return left


class ServerSecAgg:
    """One secure round at the server (see the module docstring).

    Args:
        config: the secure-aggregation parameters (``min_cohort``, threshold).
        roster, session, round_: whose adverts are valid, and for which round.
        sampled: the clients asked to train this round.
        digest: SHA-256 of the global model sent to them (:func:`~fedgat.protocols.secagg.model_digest`).
        length: elements of the encoded input (model weights + 2).
        quorum: clients that must advertise (the server's ``min_participation`` of ``sampled``).
    """

    def __init__(
        self,
        config: SecAggConfig,
        roster: Roster,
        session: int,
        round_: int,
        sampled: Sequence[int],
        digest: bytes,
        length: int,
        quorum: int = 1,
    ) -> None:
        self.config, self.roster, self.session, self.round = config, roster, session, round_
        self.sampled, self.digest, self.length, self.quorum = list(sampled), digest, length, quorum
        self.stage = "keys"
        self.adverts: dict[int, AdvertItem] = {}
        self.cohort: list[int] = []
        self.view = b""  # cohort_view of the adverts sent to the cohort
        self.threshold = 0
        self.shares: dict[int, tuple[SealedShare, ...]] = {}
        self.u2: list[int] = []
        self.masked: dict[int, np.ndarray] = {}
        self.u3: list[int] = []
        self.confirms: dict[int, bytes] = {}
        self.u4: list[int] = []
        self.reveals: dict[int, SecAggUnmaskShares] = {}
        #: the decoded sum (float64, ``length`` values) once the round is done
        self.result: np.ndarray | None = None

    # --- where the round stands ----------------------------------------------------------------------
    def awaited(self) -> list[int]:
        """The clients the current stage asked."""
        asked = {"keys": self.sampled, "shares": self.cohort, "masked": self.u2, "confirm": self.u3}
        return {**asked, "unmask": self.u4}.get(self.stage, [])

    def answered(self) -> dict[int, Any]:
        """The current stage's answers so far, by client."""
        table: dict[str, dict[int, Any]] = {
            "keys": self.adverts,
            "shares": self.shares,
            "masked": self.masked,
            "confirm": self.confirms,
            "unmask": self.reveals,
        }
        return table.get(self.stage, {})

    def ready(self) -> bool:
        """Every client the current stage asked has answered."""
        return self.stage != "done" and len(self.answered()) == len(self.awaited())

    def missing(self) -> list[int]:
        """Sampled clients whose inputs are not in the sum (meaningful once the round is done)."""
        return [c for c in self.sampled if c not in self.u3]

    def snapshot(self) -> tuple:
        return (
            self.round,
            self.stage,
            tuple(sorted(self.adverts)),
            tuple(self.cohort),
            tuple(sorted(self.shares)),
            tuple(self.u2),
            tuple(sorted(self.masked)),
            tuple(self.u3),
            tuple(sorted(self.confirms)),
            tuple(self.u4),
            tuple(sorted(self.reveals)),
        )

    # --- intake (every check before any change) ------------------------------------------------------
    def _expect(self, msg: Message, stage: str) -> None:
        round_ = msg.round  # type: ignore[attr-defined]
        if round_ != self.round:
            raise ReplayError(
                f"{msg.type_name} for round {round_}; the server's secure round is {self.round}"
            )
        if self.stage != stage:
            raise StateError(
                f"{msg.type_name} in stage {self.stage!r} of round {self.round} (expected {stage!r})"
            )
        if msg.sender not in self.awaited():
            raise StateError(
                f"party {msg.sender} was not asked (or was dropped) in stage {stage!r} of round {round_}"
            )
        if msg.sender in self.answered():
            raise ReplayError(f"party {msg.sender} already answered stage {stage!r} of round {round_}")

    def receive(self, msg: Message) -> None:
        """Record a client's answer to the current stage.

        Raises:
            ReplayError: another round, or a second answer; StateError: another stage, or a client
            that was not asked; AuthError, SignatureError: an advert that is not its sender's;
            PayloadError: an answer that does not fit the stage (model digest, recipients, shape,
            the shares revealed).
        """
        handlers: dict[type, Callable[[Any], None]] = {
            SecAggAdvert: self._on_advert,
            SecAggShares: self._on_shares,
            SecAggMasked: self._on_masked,
            SecAggConfirm: self._on_confirm,
            SecAggUnmaskShares: self._on_unmask,
        }
        handlers[type(msg)](msg)

    def _on_advert(self, msg: SecAggAdvert) -> None:
        self._expect(msg, "keys")
        item = AdvertItem.of(msg)
        check_advert(self.roster, self.session, self.round, item)
        SecAggConfig.agreed([item])  # valid settings (PayloadError)
        if msg.model_digest != self.digest:
            raise PayloadError(
                f"party {msg.sender} advertised keys for another model than round {self.round}'s"
            )
        used = {k for a in self.adverts.values() for k in (a.c_pk, a.s_pk)}
        if msg.c_pk == msg.s_pk or {msg.c_pk, msg.s_pk} & used:
            raise PayloadError(f"party {msg.sender} advertised a key already in use this round")
        self.adverts[msg.sender] = item

    def _on_shares(self, msg: SecAggShares) -> None:
        self._expect(msg, "shares")
        want = [c for c in self.cohort if c != msg.sender]
        if [s.party for s in msg.shares] != want:
            raise PayloadError(f"party {msg.sender} must deal one sealed share to each of {want}")
        self.shares[msg.sender] = msg.shares

    def _on_masked(self, msg: SecAggMasked) -> None:
        self._expect(msg, "masked")
        if msg.masked.shape != (2, self.length):
            raise PayloadError(
                f"masked input of shape {msg.masked.shape}; this model needs (2, {self.length})"
            )
        self.masked[msg.sender] = msg.masked.view(np.uint64)

    def _on_confirm(self, msg: SecAggConfirm) -> None:
        self._expect(msg, "confirm")
        survivors = tuple(self.u3)
        check_confirmation(
            self.roster, self.session, self.round, msg.sender, self.view, survivors, msg.confirmation
        )
        self.confirms[msg.sender] = msg.confirmation

    def _on_unmask(self, msg: SecAggUnmaskShares) -> None:
        self._expect(msg, "unmask")
        dropped = [c for c in self.u2 if c not in self.u3]
        if [s.party for s in msg.b_shares] != self.u3 or [s.party for s in msg.s_shares] != dropped:
            raise PayloadError(
                f"party {msg.sender} must reveal b shares of {self.u3} and mask-key shares of {dropped}"
            )
        self.reveals[msg.sender] = msg

    # --- stages ----------------------------------------------------------------------------------------
    def close(self) -> list[Send] | QuorumError:
        """End the current stage with the answers that arrived: what to send next, or the
        :class:`QuorumError` the round stops with (too few answers, or seeds that cannot be rebuilt)."""
        answered = sorted(self.answered())
        stage = self.stage
        got = fitting(answered, self.adverts) if stage == "keys" else answered
        need = max(self.config.min_cohort, self.quorum) if stage == "keys" else self.threshold
        if len(got) < need:
            asked = self.awaited()
            missing = [c for c in asked if c not in answered]
            left_out = [c for c in answered if c not in got]
            note = f"; left out {left_out}, whose min_cohort exceeds the cohort" if left_out else ""
            return QuorumError(
                f"round {self.round}: {len(got)} of {len(asked)} clients answered the secure-aggregation "
                f"stage {stage!r}, {need} required; missing clients {missing}{note}",
                phase=f"fit:{stage}",
                missing=missing,
                round=self.round,
                answered=got,
                required=need,
            )
        if stage == "keys":
            adverts = tuple(self.adverts[c] for c in got)
            # the threshold every member computes: the strictest settings among the adverts
            self.threshold = SecAggConfig.agreed(adverts).threshold(len(got))
            self.cohort, self.stage = got, "shares"
            self.view = cohort_view(adverts)
            return [(c, SecAggCohort, {"round": self.round, "adverts": adverts}) for c in got]
        if stage == "shares":
            self.u2, self.stage = got, "masked"
            sealed = {(u, s.party): s.sealed for u in got for s in self.shares[u]}
            return [
                (
                    v,
                    SecAggRelay,
                    {
                        "round": self.round,
                        "shares": tuple(SealedShare(u, sealed[u, v]) for u in got if u != v),
                    },
                )
                for v in got
            ]
        if stage == "masked":
            self.u3, self.stage = got, "confirm"
            return [(v, SecAggSurvivors, {"round": self.round, "survivors": tuple(got)}) for v in got]
        if stage == "confirm":
            self.u4, self.stage = got, "unmask"
            confirmations = tuple(Confirmation(c, self.confirms[c]) for c in got)
            fields = {"round": self.round, "survivors": tuple(self.u3), "confirmations": confirmations}
            return [(v, SecAggUnmaskRequest, fields) for v in got]
        failed = self._unmask(got)
        if failed is not None:
            return failed
        self.stage = "done"
        return []

    def _unmask(self, responders: list[int]) -> QuorumError | None:
        index = {c: i + 1 for i, c in enumerate(self.cohort)}
        ctx = (self.session, self.round)

        def shares(kind: str, party: int) -> list[Revealed]:
            out = []
            for r in responders:
                item = next(s for s in getattr(self.reveals[r], kind) if s.party == party)
                out.append(Revealed(r, index[r], item.share, item.signature))
            return out

        def b_ok(party: int) -> Callable[[bytes], bool]:
            return lambda seed: b_commitment(seed, *ctx, party) == self.adverts[party].b_commit

        def s_ok(party: int) -> Callable[[bytes], bool]:
            return lambda seed: public_bytes(mask_key(seed, *ctx, party)) == self.adverts[party].s_pk

        b_seeds: dict[int, bytes] = {}
        for u in self.u3:
            seed = self._rebuild(u, b"b", shares("b_shares", u), b_ok(u))
            if isinstance(seed, QuorumError):
                return seed
            b_seeds[u] = seed
        dropped = {}
        for u in [c for c in self.u2 if c not in self.u3]:
            seed = self._rebuild(u, b"s", shares("s_shares", u), s_ok(u))
            if isinstance(seed, QuorumError):
                return seed
            dropped[u] = mask_key(seed, *ctx, u)
        publics = {v: self.adverts[v].s_pk for v in self.u3}
        masked = {v: self.masked[v] for v in self.u3}
        self.result = decode(unmask_sum(masked, b_seeds, dropped, publics, *ctx, self.digest))
        return None

    def _rebuild(
        self, dealer: int, kind: bytes, shares: list[Revealed], ok: Callable[[bytes], bool]
    ) -> bytes | QuorumError:
        """``dealer``'s seed from ``t`` of ``shares`` that passes ``ok``: the first ``t`` (an honest
        round), else the first ``t`` whose dealer's signature verifies (a client revealed a share its
        dealer did not deal), else those ``t + 1`` leaving one out at a time (a dealer that signed
        one wrong share: its seed is still rebuilt, as a dropout's would be; a twelfth review pass),
        else the :class:`QuorumError` naming who sent wrong shares."""
        t = self.threshold
        seed = combine_shares([(s.position, s.share) for s in shares[:t]])
        if ok(seed):
            return seed
        key = self.roster.signing_key(dealer)
        valid, forged = [], []
        for s in shares:
            data = dealt_bytes(
                self.session, self.round, dealer, s.holder, s.position, kind, s.share, self.view
            )
            try:
                verify(key, data, s.signature)
            except CryptoSignatureError:
                forged.append(s.holder)
                continue
            valid.append(s)
        if len(valid) >= t:
            pool = valid[: t + 1]
            # pool[:t] first (leaving out the last); with a (t + 1)-th share, each other one left out
            subsets = (
                [pool[:k] + pool[k + 1 :] for k in reversed(range(len(pool)))] if len(pool) > t else [pool]
            )
            for subset in subsets:
                seed = combine_shares([(s.position, s.share) for s in subset])
                if ok(seed):
                    return seed
            culprit = f"party {dealer} dealt shares that do not fit its commitment"  # signed, yet wrong
        else:
            culprit = f"parties {forged} revealed shares party {dealer} did not deal"
        return QuorumError(
            f"round {self.round}: party {dealer}'s seed cannot be rebuilt ({culprit}; {len(valid)} valid "
            f"shares, {t} required); the round cannot be unmasked",
            phase="fit:unmask",
            round=self.round,
            answered=[s.holder for s in valid],
            required=t,
        )
