"""Who is who (the roster) and the per-receiver checks every message passes (the verifier).

The roster -- party id -> Ed25519 public key, plus which party is the server and which are the
clients -- is **assumed to be authenticated out of band** (pinned in each party's configuration,
like TLS certificate pinning). Everything else is authenticated through it: message signatures, the
session keys in :class:`~fedgat.protocols.messages.KeyAnnounce` (bound by the announcing client's
signature), the public CKKS contexts (bound by the fingerprint that signature covers), edge claims
and sealed check keys (signed by their authors). There is no dealer: every client holds its own
keys (:mod:`fedgat.protocols.pretrain_keys`).

:class:`Verifier` keeps one receiver's view of a session: the last sequence number seen from each
sender and the fingerprint later messages are bound to once known. ``check`` is pure; ``commit``
records a message that the receiving state machine accepted, so a rejected message changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedgat.crypto import SigningIdentity

from .errors import (
    AuthError,
    KeyFingerprintError,
    ReplayError,
    SignatureError,
    WrongRecipientError,
    check_signature,
)
from .frame import signed_message, signing_input
from .messages import ZERO_FINGERPRINT, Message

__all__ = ["Identity", "Roster", "Verifier"]


@dataclass(frozen=True)
class Roster:
    """The parties of one session.

    Attributes:
        server: the server's party id.
        clients: every client's party id, in client order.
        signing_keys: party id -> 32-byte Ed25519 public key, for every party including the server.
    """

    server: int
    clients: tuple[int, ...]
    signing_keys: Mapping[int, bytes] = field(repr=False)

    def __post_init__(self) -> None:
        ids = [self.server, *self.clients]
        if len(set(ids)) != len(ids):
            raise ValueError("party ids must be distinct (server and clients)")
        missing = [p for p in ids if p not in self.signing_keys]
        if missing:
            raise ValueError(f"no signing key for parties {missing}")
        for pid in ids:
            if not 0 <= pid < 2**32:
                raise ValueError("party ids must be u32 values")

    def signing_key(self, party: int) -> bytes:
        try:
            return self.signing_keys[party]
        except KeyError:
            raise AuthError(f"party {party} is not in the roster") from None

    def is_client(self, party: int) -> bool:
        return party in self.clients

    def to_value(self) -> dict[str, Any]:
        """Plain values (:mod:`~fedgat.protocols.party_values`): ids and raw public keys."""
        return {
            "server": self.server,
            "clients": list(self.clients),
            "signing_keys": {str(p): bytes(self.signing_keys[p]) for p in sorted(self.signing_keys)},
        }

    @classmethod
    def from_value(cls, value: Mapping[str, Any]) -> Roster:
        """Inverse of :meth:`to_value` (ValueError: not a roster's values). A ``"dealer"`` entry of
        values saved before the dealer was removed is ignored."""
        try:
            keys = {int(p): bytes(k) for p, k in value["signing_keys"].items()}
            return cls(int(value["server"]), tuple(int(c) for c in value["clients"]), keys)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a roster's values: {exc}") from exc


@dataclass
class Identity:
    """A party's long-term private key: Ed25519, for signing its frames. (Every other key a party
    uses -- a client's CKKS key pair, its HPKE session keys -- is generated per session.)"""

    signer: SigningIdentity

    @classmethod
    def generate(cls) -> Identity:
        return cls(SigningIdentity.generate())

    def to_value(self) -> dict[str, bytes]:
        """The raw private key (for the party's own trust domain only: never log or share it)."""
        return {"signer": self.signer.private_bytes()}

    @classmethod
    def from_value(cls, value: Mapping[str, Any]) -> Identity:
        """Inverse of :meth:`to_value` (a ``"wrapping"`` key of older values is ignored)."""
        return cls(SigningIdentity.from_private_bytes(value["signer"]))


class Verifier:
    """One receiver's checks: sender known, signature, recipient, session, fresh sequence number,
    and the fingerprint messages are bound to (in pre-training the participants' key set,
    :func:`~fedgat.protocols.messages.keyset_fingerprint`)."""

    def __init__(self, roster: Roster, me: int, session: int) -> None:
        self.roster = roster
        self.me = me
        self.session = session
        self.fingerprint: bytes | None = None
        self._last_seq: dict[int, int] = {}

    def check(self, msg: Message, *, from_frame: bool = False) -> None:
        """Raise :class:`AuthError`, :class:`SignatureError`, :class:`WrongRecipientError` or
        :class:`ReplayError`; never changes the verifier.

        The signature is verified over ``msg.signed_bytes`` (through their digest,
        :attr:`~fedgat.protocols.frame.Message.signed_digest`), and the object's fields must be exactly
        those bytes decoded (:func:`~fedgat.protocols.frame.signed_message`; :class:`SignatureError`
        otherwise). ``from_frame=True``: the caller has just built ``msg`` with
        :func:`~fedgat.protocols.messages.decode_message` from the frame itself (or with
        ``signed_message``), so that comparison is skipped."""
        key = self.roster.signing_key(msg.sender)
        if msg.signature is None or msg.signed_bytes is None:
            raise SignatureError(f"{msg.type_name} from {msg.sender} carries no signature")
        signed = msg if from_frame else signed_message(msg)  # the digest of its bytes, not its field's
        if signed.signed_digest is None:
            raise SignatureError(f"{msg.type_name} from {msg.sender} was not decoded from a frame")
        check_signature(
            key,
            signing_input(signed.signed_digest),
            msg.signature,
            f"bad signature on {msg.type_name} from party {msg.sender}",
        )
        if msg.recipient != self.me:
            raise WrongRecipientError(f"{msg.type_name} is addressed to party {msg.recipient}, not {self.me}")
        if msg.session != self.session:
            raise ReplayError(f"{msg.type_name} belongs to session {msg.session}, not {self.session}")
        last = self._last_seq.get(msg.sender, 0)
        if msg.seq <= last:
            raise ReplayError(f"{msg.type_name} from {msg.sender}: sequence {msg.seq} is not above {last}")

    def check_fingerprint(
        self, msg: Message, *, introduces_key: bool = False, key_bound: bool = True
    ) -> None:
        """The header fingerprint must be the session key's (32 zero bytes before one exists).

        ``introduces_key``: the message brings the key (accepted while none is known; the handler
        checks it). ``key_bound=False``: pre-key metadata, which may carry zeros or the key.
        """
        if introduces_key and self.fingerprint is None:
            return
        expected = self.fingerprint if self.fingerprint is not None else ZERO_FINGERPRINT
        if msg.fingerprint == expected or (not key_bound and msg.fingerprint == ZERO_FINGERPRINT):
            return
        raise KeyFingerprintError(
            f"{msg.type_name} is bound to key {msg.fingerprint.hex()[:16]}, expected {expected.hex()[:16]}"
        )

    def commit(self, msg: Message) -> None:
        self._last_seq[msg.sender] = msg.seq

    def snapshot(self) -> tuple:
        return (self.fingerprint, tuple(sorted(self._last_seq.items())))

    def last_seq(self) -> dict[int, int]:
        """The last accepted sequence number per sender (for checkpoints)."""
        return dict(self._last_seq)

    def restore_last_seq(self, last: dict[int, int]) -> None:
        """Restore :meth:`last_seq` from a checkpoint (senders must be in the roster)."""
        for sender in last:
            self.roster.signing_key(sender)
        self._last_seq = dict(last)
