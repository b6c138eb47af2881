r"""Message types of secure aggregation (ids 20-28), the stages of a secure FedAvg round
(:mod:`fedgat.protocols.fedavg`). Framed, signed and checked like every message
(:mod:`fedgat.protocols.frame`); registered in :data:`~fedgat.protocols.frame.MESSAGE_TYPES` on import.

==  =====================  ================  ===============================================  ========
id  type                   direction         fields                                           limit
==  =====================  ================  ===============================================  ========
20  SecAggAdvert           client -> server  round, c_pk, s_pk, b_commit, model_digest        1 KiB
                                             (32 B each), binding_signature (64 B), parts
                                             (u8 bits: 1 update, 2 evaluation counts; 0:
                                             adds nothing), min_cohort (u32),
                                             threshold_ratio (f64)
21  SecAggCohort           server -> client  round, adverts: <= 4096 x (party, c_pk, s_pk,   1 MiB
                                             b_commit, model_digest, signature, parts,
                                             min_cohort, threshold_ratio), by party
22  SecAggShares           client -> server  round, shares: <= 4096 x (recipient, sealed      1 MiB
                                             210 B), by party
23  SecAggRelay            server -> client  round, shares: <= 4096 x (sender, sealed), by    1 MiB
                                             party
24  SecAggMasked           client -> server  round, masked (int64 2 x m, the Z_2^128 vector,  256 MiB
                                             m <= 2^24)                                       +1 KiB
27  SecAggSurvivors        server -> client  round, survivors (<= 4096 party ids, sorted)     32 KiB
28  SecAggConfirm          client -> server  round, confirmation (64 B signature) over the survivors and   1 KiB
                                             the cohort it saw
25  SecAggUnmaskRequest    server -> client  round, survivors, confirmations: <= 4096 x       512 KiB
                                             (party, signature), by party
26  SecAggUnmaskShares     client -> server  round, b_shares, s_shares: (party, 16 B share,   768 KiB
                                             the dealer's 64 B signature), by party, no party
                                             in both lists
==  =====================  ================  ===============================================  ========

The advert's ``binding_signature`` (Ed25519 of :func:`~fedgat.protocols.secagg.advert_bytes`) and the
sender's signature inside each sealed share make the relayed parts trustworthy end to end: the
server re-frames them but can neither forge nor alter them. The confirmations (27, 28; Bonawitz et
al.'s consistency check, frame version 11) make the survivor set one for all: a client reveals
only with :math:`t` survivors' signatures over the set it was told.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .codec import Array, FixedBytes, Float64, ListOf, Record
from .errors import PayloadError
from .frame import FP, U8, U32, KiB, Message, MiB, register
from .secagg import MAX_COHORT, MAX_SECAGG_ELEMS, PART_COUNTS, PART_UPDATE, SEALED_SHARE_BYTES, SEED_BYTES

__all__ = [
    "SECAGG_MESSAGES",
    "AdvertItem",
    "Confirmation",
    "RevealedShare",
    "SealedShare",
    "SecAggAdvert",
    "SecAggCohort",
    "SecAggConfirm",
    "SecAggMasked",
    "SecAggRelay",
    "SecAggShares",
    "SecAggSurvivors",
    "SecAggUnmaskRequest",
    "SecAggUnmaskShares",
]


@dataclass(frozen=True)
class AdvertItem:
    """One client's signed advert, as the server relays it to the cohort."""

    party: int
    c_pk: bytes
    s_pk: bytes
    b_commit: bytes
    model_digest: bytes
    signature: bytes
    #: what its masked input carries (:data:`~fedgat.protocols.secagg.PART_UPDATE` | ``PART_COUNTS``)
    parts: int = PART_UPDATE | PART_COUNTS
    #: its secure-aggregation settings (:class:`~fedgat.protocols.secagg.SecAggConfig`)
    min_cohort: int = 3
    threshold_ratio: float = 2 / 3

    @classmethod
    def of(cls, msg: SecAggAdvert) -> AdvertItem:
        """The relayed form of a client's SecAggAdvert."""
        return cls(
            msg.sender,
            msg.c_pk,
            msg.s_pk,
            msg.b_commit,
            msg.model_digest,
            msg.binding_signature,
            msg.parts,
            msg.min_cohort,
            msg.threshold_ratio,
        )


@dataclass(frozen=True)
class SealedShare:
    """A sealed pair of shares: ``party`` is the recipient (SecAggShares) or the sender (SecAggRelay)."""

    party: int
    sealed: bytes


@dataclass(frozen=True)
class RevealedShare:
    """The share a client holds of ``party``'s :math:`b` seed or mask-key seed, with ``party``'s
    signature over it (:func:`~fedgat.protocols.secagg.dealt_bytes`): the server rebuilds seeds from
    shares their dealers signed."""

    party: int
    share: bytes
    signature: bytes = bytes(64)


@dataclass(frozen=True)
class Confirmation:
    """A survivor's signature over the survivor set and its cohort view
    (:func:`~fedgat.protocols.secagg.confirm_bytes`), relayed to every survivor before it reveals."""

    party: int
    signature: bytes


SIG = FixedBytes(64)
ADVERT = Record(
    AdvertItem,
    (
        ("party", U32),
        ("c_pk", FP),
        ("s_pk", FP),
        ("b_commit", FP),
        ("model_digest", FP),
        ("signature", SIG),
        ("parts", U8),
        ("min_cohort", U32),
        ("threshold_ratio", Float64()),
    ),
)
SEALED = Record(SealedShare, (("party", U32), ("sealed", FixedBytes(SEALED_SHARE_BYTES))))
REVEALED = Record(RevealedShare, (("party", U32), ("share", FixedBytes(SEED_BYTES)), ("signature", SIG)))
CONFIRMATION = Record(Confirmation, (("party", U32), ("signature", SIG)))


def _check_parts(parts: int) -> None:
    if parts not in (0, PART_UPDATE, PART_COUNTS, PART_UPDATE | PART_COUNTS):
        raise PayloadError(f"an advert's parts must be 0 (nothing), 1 (update), 2 (counts) or 3, not {parts}")


def _sorted_parties(parties: list[int], what: str) -> None:
    if any(b <= a for a, b in itertools.pairwise(parties)):
        raise PayloadError(f"{what} must name distinct parties in increasing order")


@dataclass(frozen=True, eq=False, kw_only=True)
class SecAggAdvert(Message):
    """Stage 1 (advertise keys): the client's round keys -- ``c_pk`` (X25519, receives sealed shares),
    ``s_pk`` (X25519, pairwise masks) -- a commitment to its self-mask seed, the digest of the
    global model it trains on, the ``parts`` its input carries (its update, its evaluation
    counts, or both) and its settings (``min_cohort``, ``threshold_ratio``: the cohort runs under the
    strictest), bound to it by ``binding_signature``."""

    TYPE: ClassVar[int] = 20
    MAX_PAYLOAD: ClassVar[int] = 1 * KiB
    SCHEMA: ClassVar = (
        ("round", U32),
        ("c_pk", FP),
        ("s_pk", FP),
        ("b_commit", FP),
        ("model_digest", FP),
        ("binding_signature", SIG),
        ("parts", U8),
        ("min_cohort", U32),
        ("threshold_ratio", Float64()),
    )

    round: int
    c_pk: bytes
    s_pk: bytes
    b_commit: bytes
    model_digest: bytes
    binding_signature: bytes
    parts: int
    min_cohort: int = 3
    threshold_ratio: float = 2 / 3

    def check(self) -> None:
        _check_parts(self.parts)


@dataclass(frozen=True, eq=False, kw_only=True)
class SecAggCohort(Message):
    """Stage 2 request (share keys): the signed adverts of the round's cohort, sorted by party (a
    client's position + 1 is its Shamir share index)."""

    TYPE: ClassVar[int] = 21
    MAX_PAYLOAD: ClassVar[int] = 1 * MiB
    SCHEMA: ClassVar = (("round", U32), ("adverts", ListOf(ADVERT, MAX_COHORT)))

    round: int
    adverts: tuple[AdvertItem, ...]

    def check(self) -> None:
        _sorted_parties([a.party for a in self.adverts], "SecAggCohort.adverts")
        for a in self.adverts:
            _check_parts(a.parts)


@dataclass(frozen=True, eq=False, kw_only=True)
class SecAggShares(Message):
    """Stage 2 answer: the client's shares for every other cohort member, each sealed to it."""

    TYPE: ClassVar[int] = 22
    MAX_PAYLOAD: ClassVar[int] = 1 * MiB
    SCHEMA: ClassVar = (("round", U32), ("shares", ListOf(SEALED, MAX_COHORT)))

    round: int
    shares: tuple[SealedShare, ...]

    def check(self) -> None:
        _sorted_parties([s.party for s in self.shares], "SecAggShares.shares")


@dataclass(frozen=True, eq=False, kw_only=True)
class SecAggRelay(Message):
    """Stage 3 request (masked input): the sealed shares other clients dealt to the recipient; their
    senders and the recipient form the set :math:`U_2` it masks against."""

    TYPE: ClassVar[int] = 23
    MAX_PAYLOAD: ClassVar[int] = 1 * MiB
    SCHEMA: ClassVar = (("round", U32), ("shares", ListOf(SEALED, MAX_COHORT)))

    round: int
    shares: tuple[SealedShare, ...]

    def check(self) -> None:
        _sorted_parties([s.party for s in self.shares], "SecAggRelay.shares")


@dataclass(frozen=True, eq=False, kw_only=True)
class SecAggMasked(Message):
    """Stage 3 answer: the client's masked input, a :math:`\\mathbb{Z}_{2^{128}}` vector as int64
    ``(2, m)`` (low words, then high words; two's complement bits)."""

    TYPE: ClassVar[int] = 24
    MAX_PAYLOAD: ClassVar[int] = 16 * MAX_SECAGG_ELEMS + 1 * KiB
    SCHEMA: ClassVar = (("round", U32), ("masked", Array("<i8", 2 * MAX_SECAGG_ELEMS, ndim=2)))

    round: int
    masked: np.ndarray

    def check(self) -> None:
        if self.masked.shape[0] != 2 or self.masked.shape[1] < 1:
            raise PayloadError(f"SecAggMasked.masked must have shape (2, m), got {self.masked.shape}")


@dataclass(frozen=True, eq=False, kw_only=True)
class SecAggSurvivors(Message):
    """Stage 4 request (consistency check): the survivors :math:`U_3` whose masked inputs the server
    holds; the other members of :math:`U_2` count as dropped."""

    TYPE: ClassVar[int] = 27
    MAX_PAYLOAD: ClassVar[int] = 32 * KiB
    SCHEMA: ClassVar = (("round", U32), ("survivors", ListOf(U32, MAX_COHORT)))

    round: int
    survivors: tuple[int, ...]

    def check(self) -> None:
        _sorted_parties(list(self.survivors), "SecAggSurvivors.survivors")
        if not self.survivors:
            raise PayloadError("a survivor set names at least one survivor")


@dataclass(frozen=True, eq=False, kw_only=True)
class SecAggConfirm(Message):
    """Stage 4 answer: the client's signature over the survivor set it was told, under the cohort it
    saw (:func:`~fedgat.protocols.secagg.confirm_bytes`)."""

    TYPE: ClassVar[int] = 28
    MAX_PAYLOAD: ClassVar[int] = 1 * KiB
    SCHEMA: ClassVar = (("round", U32), ("confirmation", SIG))

    round: int
    confirmation: bytes


@dataclass(frozen=True, eq=False, kw_only=True)
class SecAggUnmaskRequest(Message):
    """Stage 5 request (unmask): the survivors :math:`U_3` again, with the confirmations of at least
    :math:`t` of them (each a signature over this set)."""

    TYPE: ClassVar[int] = 25
    MAX_PAYLOAD: ClassVar[int] = 512 * KiB
    SCHEMA: ClassVar = (
        ("round", U32),
        ("survivors", ListOf(U32, MAX_COHORT)),
        ("confirmations", ListOf(CONFIRMATION, MAX_COHORT)),
    )

    round: int
    survivors: tuple[int, ...]
    confirmations: tuple[Confirmation, ...] = ()

    def check(self) -> None:
        _sorted_parties(list(self.survivors), "SecAggUnmaskRequest.survivors")
        _sorted_parties([c.party for c in self.confirmations], "SecAggUnmaskRequest.confirmations")
        if not self.survivors:
            raise PayloadError("an unmask request names at least one survivor")


@dataclass(frozen=True, eq=False, kw_only=True)
class SecAggUnmaskShares(Message):
    """Stage 5 answer: the shares of the survivors' self-mask seeds and of the dropped clients'
    mask-key seeds -- never both for one party."""

    TYPE: ClassVar[int] = 26
    MAX_PAYLOAD: ClassVar[int] = 768 * KiB
    SCHEMA: ClassVar = (
        ("round", U32),
        ("b_shares", ListOf(REVEALED, MAX_COHORT)),
        ("s_shares", ListOf(REVEALED, MAX_COHORT)),
    )

    round: int
    b_shares: tuple[RevealedShare, ...]
    s_shares: tuple[RevealedShare, ...]

    def check(self) -> None:
        _sorted_parties([s.party for s in self.b_shares], "SecAggUnmaskShares.b_shares")
        _sorted_parties([s.party for s in self.s_shares], "SecAggUnmaskShares.s_shares")
        both = {s.party for s in self.b_shares} & {s.party for s in self.s_shares}
        if both:
            raise PayloadError(f"both shares of parties {sorted(both)}: a client reveals one or the other")


SECAGG_MESSAGES: tuple[type[Message], ...] = (
    SecAggAdvert,
    SecAggCohort,
    SecAggShares,
    SecAggRelay,
    SecAggMasked,
    SecAggSurvivors,
    SecAggConfirm,
    SecAggUnmaskRequest,
    SecAggUnmaskShares,
)
register(*SECAGG_MESSAGES)
