r"""A client's half of one secure-aggregation round (:class:`ClientSecAgg`): pure state, no messages.
:class:`~fedgat.protocols.fedavg_client.ClientRounds` wraps what it returns into messages.

Stages (Bonawitz et al. 2017, Fig. 4, over the complete graph of the round's cohort):

1. **advertise keys** (:meth:`ClientSecAgg.begin`, :meth:`~ClientSecAgg.advert`) -- after local
   training on the round's global model: fresh round keys :math:`c_u` (receives shares) and
   :math:`s_u` (masks), a fresh self-mask seed :math:`b_u`, and the encoded input
   :math:`x_u = (n_u w_u, n_u, n_u L_u)`; the advert binds the public keys, a commitment to
   :math:`b_u`, the model's digest and the parts its input really carries (an update when it trained
   on some node or adds a DP-FedAvg noise share, evaluation counts when every split has nodes or
   under DP-FedAvg; any other part is zeros) to the client's roster identity.
2. **share keys** (:meth:`~ClientSecAgg.on_cohort`) -- checks every advert of the cohort (roster
   member, valid signature, distinct keys, the same model digest as its own, at least
   ``min_cohort`` clients, and at least ``min_cohort`` of them carrying each part its own input
   carries), then Shamir-splits the seeds of :math:`s_u` and :math:`b_u` with threshold :math:`t`
   -- computed from the strictest settings the adverts carry
   (:meth:`~fedgat.protocols.secagg.SecAggConfig.agreed`), so all members agree on it -- and seals
   one pair of shares to each other member.
   Every share is sealed under the digest of the cohort as this client saw it
   (:func:`~fedgat.protocols.secagg.cohort_view`): only members shown the same cohort open it.
3. **masked input** (:meth:`~ClientSecAgg.on_relay`) -- opens the shares dealt to it (each must
   open, carry its sender's signature and its own index); their senders and itself are
   :math:`U_2`, at least :math:`t`; sends :math:`y_u = x_u + \mathrm{PRG}(b_u) + \sum_{v \in U_2}
   \pm \mathrm{PRG}(s_{uv})`.
4. **consistency check** (:meth:`~ClientSecAgg.on_survivors`) -- once per round: for the survivors
   :math:`U_3` (at least :math:`t`, itself among them, all in :math:`U_2`, and at least
   ``min_cohort`` of them carrying each part its own input carries, else the sum of a part could
   be one client's) it signs :math:`U_3` under its cohort view.
5. **unmask** (:meth:`~ClientSecAgg.on_unmask`) -- once per round, for the :math:`U_3` it signed
   and with at least :math:`t` survivors' valid signatures over it: it reveals the survivors'
   :math:`b` shares and, for :math:`U_2 \setminus U_3`, their mask-key shares; never both for one
   client. Then the round's secrets are dropped.

Every check runs before anything changes: a refused message leaves the round as it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from fedgat.crypto import SigningIdentity

from .errors import AuthError, PayloadError, ReplayError, StateError, check_signature
from .messages_secagg import (
    AdvertItem,
    RevealedShare,
    SealedShare,
    SecAggCohort,
    SecAggRelay,
    SecAggSurvivors,
    SecAggUnmaskRequest,
)
from .roster import Roster
from .secagg import (
    PART_COUNTS,
    PART_UPDATE,
    SecAggConfig,
    advert_bytes,
    b_commitment,
    cohort_view,
    confirm_bytes,
    dealt_bytes,
    mask_input,
    mask_key,
    open_share,
    private_bytes,
    public_bytes,
    random_seed,
    seal_share,
    split_secret,
)

__all__ = ["ClientSecAgg", "check_advert", "check_confirmation"]


def check_advert(roster: Roster, session: int, round_: int, advert: AdvertItem) -> None:
    """An advert of a roster client with a valid binding signature.

    Raises:
        AuthError: the party is not a client of the roster.
        SignatureError: the signature is not the party's over its keys, commitment and digest.
    """
    if not roster.is_client(advert.party):
        raise AuthError(f"party {advert.party} advertised secure-aggregation keys but is not a client")
    data = advert_bytes(
        session,
        round_,
        advert.party,
        advert.c_pk,
        advert.s_pk,
        advert.b_commit,
        advert.model_digest,
        advert.parts,
        advert.min_cohort,
        advert.threshold_ratio,
    )
    check_signature(
        roster.signing_key(advert.party),
        data,
        advert.signature,
        f"the advert of party {advert.party} is not signed by it",
    )


def check_confirmation(
    roster: Roster,
    session: int,
    round_: int,
    party: int,
    view: bytes,
    survivors: tuple[int, ...],
    signature: bytes,
) -> None:
    """``party``'s signature over the survivor set ``survivors`` under the cohort ``view``
    (:func:`~fedgat.protocols.secagg.confirm_bytes`).

    Raises:
        SignatureError: another set, view, round or session, or another party's signature.
    """
    check_signature(
        roster.signing_key(party),
        confirm_bytes(session, round_, party, view, survivors),
        signature,
        f"party {party} did not sign round {round_}'s survivor set under the cohort this party saw",
    )


def _four(values: Any) -> tuple[bytes, bytes, bytes, bytes]:
    """A saved (s share, b share, s signature, b signature)."""
    s, b, s_sig, b_sig = (bytes(x) for x in values)
    return s, b, s_sig, b_sig


@dataclass(eq=False)
class ClientSecAgg:
    """One client's secure-aggregation round (see the module docstring)."""

    config: SecAggConfig
    session: int
    round: int
    party: int
    digest: bytes
    #: the encoded input x_u, (2, m) uint64 (dropped once masked)
    vector: np.ndarray | None = field(repr=False)
    c_secret: bytes = field(repr=False)
    s_seed: bytes = field(repr=False)
    b_seed: bytes = field(repr=False)
    stage: str = "advertised"
    cohort: dict[int, AdvertItem] = field(default_factory=dict)
    threshold: int = 0
    #: this client's own share of its s and b seeds, with its signatures over them
    own: tuple[bytes, bytes, bytes, bytes] | None = field(default=None, repr=False)
    #: sender -> (share of its s seed, share of its b seed, the sender's signatures over each)
    received: dict[int, tuple[bytes, bytes, bytes, bytes]] = field(default_factory=dict, repr=False)
    #: what this client's input carries (:data:`~fedgat.protocols.secagg.PART_UPDATE` | ``PART_COUNTS``)
    parts: int = PART_UPDATE | PART_COUNTS
    #: digest of the cohort this client was shown (:func:`~fedgat.protocols.secagg.cohort_view`)
    view: bytes = b""
    #: the survivor set it signed (stage 4), the only one it reveals for
    confirmed: tuple[int, ...] | None = None

    @classmethod
    def begin(
        cls,
        config: SecAggConfig,
        session: int,
        round_: int,
        party: int,
        digest: bytes,
        vector: np.ndarray,
        parts: int = PART_UPDATE | PART_COUNTS,
    ) -> ClientSecAgg:
        """Stage 1: fresh keys and seeds from the OS CSPRNG (never a seed) for ``vector``, whose
        ``parts`` (its update, its evaluation counts) this client contributes."""
        c_secret = private_bytes(X25519PrivateKey.from_private_bytes(random_seed(32)))
        return cls(
            config,
            session,
            round_,
            party,
            digest,
            vector,
            c_secret,
            random_seed(),
            random_seed(),
            parts=parts,
        )

    def _short_parts(self, members: Iterable[AdvertItem]) -> list[str]:
        """The parts of this client's input that fewer than ``min_cohort`` of ``members`` carry."""
        items = list(members)
        return [
            name
            for part, name in ((PART_UPDATE, "updates"), (PART_COUNTS, "evaluation counts"))
            if self.parts & part and sum(bool(a.parts & part) for a in items) < self.config.min_cohort
        ]

    # --- keys ------------------------------------------------------------------------------------
    def _c_key(self) -> X25519PrivateKey:
        return X25519PrivateKey.from_private_bytes(self.c_secret)

    def _s_key(self) -> X25519PrivateKey:
        return mask_key(self.s_seed, self.session, self.round, self.party)

    def advert(self, signer: SigningIdentity) -> dict[str, Any]:
        """The fields of this round's SecAggAdvert."""
        c_pk, s_pk = public_bytes(self._c_key()), public_bytes(self._s_key())
        b_commit = b_commitment(self.b_seed, self.session, self.round, self.party)
        cfg = self.config
        data = advert_bytes(
            self.session,
            self.round,
            self.party,
            c_pk,
            s_pk,
            b_commit,
            self.digest,
            self.parts,
            cfg.min_cohort,
            cfg.threshold_ratio,
        )
        return {
            "round": self.round,
            "c_pk": c_pk,
            "s_pk": s_pk,
            "b_commit": b_commit,
            "model_digest": self.digest,
            "binding_signature": signer.sign(data),
            "parts": self.parts,
            "min_cohort": cfg.min_cohort,
            "threshold_ratio": cfg.threshold_ratio,
        }

    def _expect(self, round_: int, stage: str, what: str) -> None:
        if round_ != self.round:
            raise ReplayError(f"{what} for round {round_}; this client's secure round is {self.round}")
        if self.stage != stage:
            raise StateError(
                f"{what} arrived in stage {self.stage!r} of round {self.round} (expected {stage!r})"
            )

    @property
    def index(self) -> int:
        """This client's Shamir share index (its position in the sorted cohort + 1)."""
        return sorted(self.cohort).index(self.party) + 1

    # --- stage 2 -----------------------------------------------------------------------------------
    def on_cohort(self, msg: SecAggCohort, roster: Roster, signer: SigningIdentity) -> dict[str, Any]:
        """Check the cohort's adverts and deal this client's shares; the fields of SecAggShares."""
        self._expect(msg.round, "advertised", "SecAggCohort")
        adverts = {a.party: a for a in msg.adverts}
        n = len(adverts)
        if n < self.config.min_cohort:
            raise PayloadError(
                f"round {self.round}: a cohort of {n} clients is below the minimum {self.config.min_cohort}"
            )
        mine = adverts.get(self.party)
        own = (
            public_bytes(self._c_key()),
            public_bytes(self._s_key()),
            b_commitment(self.b_seed, self.session, self.round, self.party),
            self.digest,
            self.parts,
            self.config.min_cohort,
            self.config.threshold_ratio,
        )
        if (
            mine is None
            or (
                mine.c_pk,
                mine.s_pk,
                mine.b_commit,
                mine.model_digest,
                mine.parts,
                mine.min_cohort,
                mine.threshold_ratio,
            )
            != own
        ):
            raise PayloadError(f"round {self.round}: the cohort does not carry this client's own advert")
        keys = [a.c_pk for a in msg.adverts] + [a.s_pk for a in msg.adverts]
        if len(set(keys)) != len(keys):
            raise PayloadError(f"round {self.round}: two adverts of the cohort share a key")
        s_key = self._s_key()
        for a in msg.adverts:
            check_advert(roster, self.session, self.round, a)
            if a.model_digest != self.digest:
                raise PayloadError(
                    f"round {self.round}: party {a.party} trains on another global model than this "
                    "client's (the server sent different models)"
                )
            if a.party != self.party:
                try:
                    X25519PublicKey.from_public_bytes(a.c_pk)
                    s_key.exchange(X25519PublicKey.from_public_bytes(a.s_pk))
                except ValueError as exc:
                    raise PayloadError(f"party {a.party} advertised an unusable X25519 key ({exc})") from exc
        short = self._short_parts(adverts.values())
        if short:
            raise PayloadError(
                f"round {self.round}: fewer than {self.config.min_cohort} members of the cohort add their "
                f"{' and '.join(short)} to the sum; the sum would not hide this client's"
            )
        t = self._threshold(msg.adverts)
        view = cohort_view(msg.adverts)
        order = sorted(adverts)
        s_shares = split_secret(self.s_seed, t, n)
        b_shares = split_secret(self.b_seed, t, n)
        sealed = tuple(
            SealedShare(
                v,
                seal_share(
                    signer,
                    adverts[v].c_pk,
                    self.session,
                    self.round,
                    self.party,
                    v,
                    i + 1,
                    s_shares[i],
                    b_shares[i],
                    view,
                ),
            )
            for i, v in enumerate(order)
            if v != self.party
        )
        me = order.index(self.party)
        s_sig, b_sig = (
            signer.sign(
                dealt_bytes(self.session, self.round, self.party, self.party, me + 1, kind, share, view)
            )
            for kind, share in ((b"s", s_shares[me]), (b"b", b_shares[me]))
        )
        self.cohort, self.threshold = adverts, t
        self.own = (s_shares[me], b_shares[me], s_sig, b_sig)
        self.view = view
        self.stage = "shared"
        return {"round": self.round, "shares": sealed}

    def _threshold(self, adverts: tuple[AdvertItem, ...]) -> int:
        """The cohort's threshold: from the strictest settings its adverts carry, the one every member
        and the server compute (a tenth review pass split the survivors of a cohort whose members
        each used their own)."""
        n = len(adverts)
        # a member whose own min_cohort exceeds the cohort refuses it and adds nothing (the honest
        # server leaves it out: secagg_server.fitting); the others' settings, this client's own
        # among them, decide
        return SecAggConfig.agreed(a for a in adverts if a.min_cohort <= n).threshold(n)

    # --- stage 3 -----------------------------------------------------------------------------------
    def on_relay(self, msg: SecAggRelay, roster: Roster) -> dict[str, Any]:
        """Open the shares dealt to this client and mask its input; the fields of SecAggMasked."""
        self._expect(msg.round, "shared", "SecAggRelay")
        senders = [s.party for s in msg.shares]
        foreign = [p for p in senders if p not in self.cohort or p == self.party]
        if foreign:
            raise PayloadError(
                f"round {self.round}: shares relayed from parties {foreign} outside the cohort"
            )
        if len(senders) + 1 < self.threshold:
            raise PayloadError(
                f"round {self.round}: {len(senders) + 1} clients in U2, below the threshold {self.threshold}"
            )
        c_key, index = self._c_key(), self.index
        received = {
            s.party: open_share(
                c_key,
                s.sealed,
                roster.signing_key(s.party),
                self.session,
                self.round,
                s.party,
                self.party,
                index,
                self.view,
            )
            for s in msg.shares
        }
        assert self.vector is not None
        peers = {v: self.cohort[v].s_pk for v in senders}
        y = mask_input(
            self.vector, self.b_seed, self._s_key(), self.party, peers, self.session, self.round, self.digest
        )
        self.received, self.vector, self.stage = received, None, "masked"
        return {"round": self.round, "masked": y.view(np.int64)}

    # --- stage 4 -----------------------------------------------------------------------------------
    def on_survivors(self, msg: SecAggSurvivors, signer: SigningIdentity) -> dict[str, Any]:
        """Check the survivor set and sign it under this client's cohort view; the fields of
        SecAggConfirm. Answered once per round."""
        if msg.round == self.round and self.stage in ("confirmed", "done"):
            raise StateError(f"round {self.round}: this client already signed a survivor set; it signs one")
        self._expect(msg.round, "masked", "SecAggSurvivors")
        survivors = tuple(msg.survivors)
        self._check_survivors(set(survivors))
        signature = signer.sign(confirm_bytes(self.session, self.round, self.party, self.view, survivors))
        self.confirmed, self.stage = survivors, "confirmed"
        return {"round": self.round, "confirmation": signature}

    def _check_survivors(self, survivors: set[int]) -> None:
        u2 = set(self.received) | {self.party}
        if not survivors <= u2:
            raise PayloadError(
                f"round {self.round}: survivors {sorted(survivors - u2)} did not deal shares to this client"
            )
        if self.party not in survivors:
            raise PayloadError(
                f"round {self.round}: the server counts this client as dropped, but it sent its input"
            )
        if len(survivors) < self.threshold:
            raise PayloadError(
                f"round {self.round}: {len(survivors)} survivors, below the threshold {self.threshold}; "
                "unmasking fewer inputs than that is refused"
            )
        short = self._short_parts([self.cohort[p] for p in survivors])
        if short:
            raise PayloadError(
                f"round {self.round}: fewer than {self.config.min_cohort} survivors add their "
                f"{' and '.join(short)} to the sum; unmasking it is refused"
            )

    # --- stage 5 -----------------------------------------------------------------------------------
    def on_unmask(self, msg: SecAggUnmaskRequest, roster: Roster) -> dict[str, Any]:
        """Reveal one share per member of U2 -- b for survivors, the mask key for the dropped -- once
        at least ``t`` survivors' signatures confirm the survivor set this client signed; the fields
        of SecAggUnmaskShares. Answered once per round."""
        if msg.round == self.round and self.stage == "done":
            raise StateError(
                f"round {self.round}: this client already answered an unmask request; it never answers twice"
            )
        self._expect(msg.round, "confirmed", "SecAggUnmaskRequest")
        assert self.confirmed is not None
        survivors = tuple(msg.survivors)
        if survivors != self.confirmed:
            raise PayloadError(
                f"round {self.round}: the unmask request names other survivors than the set this client signed"
            )
        self._check_confirmations(msg, roster)
        assert self.own is not None
        shares = {**self.received, self.party: self.own}
        u2 = set(self.received) | {self.party}
        b = tuple(RevealedShare(p, shares[p][1], shares[p][3]) for p in sorted(survivors))
        s = tuple(RevealedShare(p, shares[p][0], shares[p][2]) for p in sorted(u2 - set(survivors)))
        self.stage = "done"
        self.s_seed = self.b_seed = self.c_secret = b""
        self.own, self.received = None, {}
        return {"round": self.round, "b_shares": b, "s_shares": s}

    def _check_confirmations(self, msg: SecAggUnmaskRequest, roster: Roster) -> None:
        """At least ``t`` survivors' valid signatures over the survivor set this client signed, under
        its cohort view (Bonawitz et al.'s consistency check).

        Raises:
            PayloadError: too few, or signers that are not survivors.
            SignatureError: a signature over another set, view, round or session, or by another party.
        """
        survivors = tuple(msg.survivors)
        signers = [c.party for c in msg.confirmations]
        if not set(signers) <= set(survivors):
            raise PayloadError(
                f"round {self.round}: confirmations from {sorted(set(signers) - set(survivors))}, not survivors"
            )
        if len(signers) < self.threshold:
            raise PayloadError(
                f"round {self.round}: {len(signers)} survivors confirmed the survivor set, below the "
                f"threshold {self.threshold}; revealing is refused"
            )
        for c in msg.confirmations:
            check_confirmation(roster, self.session, self.round, c.party, self.view, survivors, c.signature)

    # --- state ---------------------------------------------------------------------------------------
    def snapshot(self) -> tuple:
        return (
            self.round,
            self.stage,
            self.threshold,
            tuple(sorted(self.cohort)),
            tuple(sorted(self.received)),
            None if self.vector is None else self.vector.tobytes(),
            self.view,
            self.confirmed,
        )

    def to_value(self) -> dict[str, Any]:
        """Plain values (:mod:`~fedgat.protocols.party_state`): the round's secrets included."""
        return {
            "config": self.config.to_value(),
            "session": self.session,
            "round": self.round,
            "party": self.party,
            "digest": self.digest,
            "vector": self.vector,
            "c_secret": self.c_secret,
            "s_seed": self.s_seed,
            "b_seed": self.b_seed,
            "stage": self.stage,
            "cohort": [
                [
                    a.party,
                    a.c_pk,
                    a.s_pk,
                    a.b_commit,
                    a.model_digest,
                    a.signature,
                    a.parts,
                    a.min_cohort,
                    a.threshold_ratio,
                ]
                for a in self.cohort.values()
            ],
            "parts": self.parts,
            "threshold": self.threshold,
            "own": None if self.own is None else list(self.own),
            "received": [[p, *shares] for p, shares in self.received.items()],
            "view": self.view,
            "confirmed": None if self.confirmed is None else list(self.confirmed),
        }

    @classmethod
    def from_value(cls, v: Mapping[str, Any]) -> ClientSecAgg:
        if "view" not in v:
            raise ValueError("a secure round saved before frame version 11 (shares without a cohort view)")
        config = SecAggConfig.from_value(v["config"])
        assert config is not None
        vector = v["vector"]
        return cls(
            config,
            int(v["session"]),
            int(v["round"]),
            int(v["party"]),
            bytes(v["digest"]),
            None if vector is None else np.asarray(vector, dtype=np.uint64).reshape(2, -1),
            bytes(v["c_secret"]),
            bytes(v["s_seed"]),
            bytes(v["b_seed"]),
            str(v["stage"]),
            {
                int(a[0]): AdvertItem(
                    int(a[0]),
                    bytes(a[1]),
                    bytes(a[2]),
                    bytes(a[3]),
                    bytes(a[4]),
                    bytes(a[5]),
                    int(a[6]),
                    int(a[7]),
                    float(a[8]),
                )
                for a in v["cohort"]
            },
            int(v["threshold"]),
            None if v["own"] is None else _four(v["own"]),
            {int(r[0]): _four(r[1:]) for r in v["received"]},
            int(v["parts"]),
            bytes(v["view"]),
            None if v["confirmed"] is None else tuple(int(p) for p in v["confirmed"]),
        )
