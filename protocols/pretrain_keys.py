r"""Key set-up of the pre-training round: no shared secret key, no dealer.

Every client generates, per session, its own CKKS key pair (:class:`fedgat.crypto.KeyHolderContext`)
and an HPKE key pair (ML-KEM-768 + X25519, :class:`SessionKeys`). It announces both public keys
(:class:`~fedgat.protocols.messages.KeyAnnounce`, signed: :func:`check_announce`) and sends its
public CKKS context (:func:`load_public_context` checks it against the announced fingerprint); the
server relays both to every other client. Rows a client needs are encrypted by their owners under
*its* public key, so its secret key decrypts nothing of anyone else's and no other party's key
decrypts anything of its rows.

Each recipient also seals its check keys (:class:`fedgat.crypto.tags.CheckKeys`) to every owner
with HPKE and signs the lot (:func:`seal_check_keys`, :func:`open_check_keys`): the server relays
them and can neither read nor replace them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric import mlkem, x25519

from fedgat.crypto import ContextFormatError, ServerContext
from fedgat.crypto.keys import SigningIdentity
from fedgat.crypto.params import DEFAULT_WIRE
from fedgat.crypto.tags import CheckKeys

from .errors import AuthError, ConfigMismatchError, KeyFingerprintError, PayloadError, check_signature
from .messages import KeyAnnounce, PublicContext, SealedCheckKeys, key_binding_bytes, sealed_keys_bytes
from .messages_pretrain import HPKE_PUBLIC
from .roster import Roster

__all__ = ["SessionKeys", "check_announce", "load_public_context", "open_check_keys", "seal_check_keys"]

_SUITE = hpke.Suite(hpke.KEM.MLKEM768_X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
_MLKEM_PUBLIC = 1184


class SessionKeys:
    """A client's HPKE key pair for one session (ML-KEM-768 + X25519: post-quantum confidentiality
    for what is sealed to it). Fresh from the OS CSPRNG (:meth:`generate`); never pickled."""

    def __init__(self, mlkem_key: mlkem.MLKEM768PrivateKey, x25519_key: x25519.X25519PrivateKey) -> None:
        self._mlkem, self._x25519 = mlkem_key, x25519_key
        self._private = hpke.MLKEM768X25519PrivateKey(mlkem_key, x25519_key)

    @classmethod
    def generate(cls) -> SessionKeys:
        return cls(mlkem.MLKEM768PrivateKey.generate(), x25519.X25519PrivateKey.generate())

    def public_bytes(self) -> bytes:
        """ML-KEM public key (1184 B) then X25519 public key (32 B)."""
        return self._mlkem.public_key().public_bytes_raw() + self._x25519.public_key().public_bytes_raw()

    def private_bytes(self) -> bytes:
        """The ML-KEM seed (64 B) and the X25519 private key (32 B): for a party's sealed state only."""
        return self._mlkem.private_bytes_raw() + self._x25519.private_bytes_raw()

    @classmethod
    def from_private_bytes(cls, data: bytes) -> SessionKeys:
        if len(data) != 96:
            raise ValueError("session keys are 96 bytes")
        return cls(
            mlkem.MLKEM768PrivateKey.from_seed_bytes(data[:64]),
            x25519.X25519PrivateKey.from_private_bytes(data[64:]),
        )

    def open(self, sealed: bytes, info: bytes) -> bytes:
        return _SUITE.decrypt(sealed, self._private, info=info)

    def __reduce__(self):
        raise TypeError("session keys are never pickled")

    def __repr__(self) -> str:
        return "SessionKeys(<private>)"


def _public_key(raw: bytes) -> hpke.MLKEM768X25519PublicKey:
    if len(raw) != HPKE_PUBLIC:
        raise PayloadError(f"an HPKE public key is {HPKE_PUBLIC} bytes")
    try:
        return hpke.MLKEM768X25519PublicKey(
            mlkem.MLKEM768PublicKey.from_public_bytes(raw[:_MLKEM_PUBLIC]),
            x25519.X25519PublicKey.from_public_bytes(raw[_MLKEM_PUBLIC:]),
        )
    except ValueError as exc:
        raise PayloadError(f"malformed HPKE public key: {exc}") from exc


def check_announce(msg: KeyAnnounce, roster: Roster, session: int) -> None:
    """A client's key announcement (from it, or relayed): a client's own Ed25519 key of the roster,
    and its signature binding the session keys to it.

    Raises:
        AuthError: not a client, or another Ed25519 key than the roster's.
        SignatureError: the binding signature does not verify. PayloadError: a malformed HPKE key.
    """
    if not roster.is_client(msg.party):
        raise AuthError(f"party {msg.party} is not a client and announces no keys")
    if msg.ed25519 != roster.signing_key(msg.party):
        raise AuthError(f"announced Ed25519 key of party {msg.party} is not the roster's")
    check_signature(
        msg.ed25519,
        key_binding_bytes(session, msg.party, msg.hpke, msg.ed25519, msg.context_fingerprint),
        msg.binding_signature,
        f"party {msg.party}'s key binding signature is invalid",
    )
    _public_key(msg.hpke)


def load_public_context(
    msg: PublicContext, announced: KeyAnnounce, preset: str, wire: str = DEFAULT_WIRE
) -> ServerContext:
    """Party ``msg.party``'s public CKKS context, checked against the fingerprint it signed, loaded
    in this party's session ciphertext ``wire`` (never the message's).

    Raises:
        PayloadError: another preset, or not a public context (a secret key is refused).
        ConfigMismatchError: the party runs the session with another ciphertext wire.
        KeyFingerprintError: the context is not the one the party announced.
    """
    if msg.context_fingerprint != announced.context_fingerprint:
        raise KeyFingerprintError(f"party {msg.party}'s context is not the one it announced")
    if msg.preset != preset:
        raise PayloadError(f"context preset {msg.preset!r} is not the session's {preset!r}")
    if msg.wire != wire:
        raise ConfigMismatchError(
            f"party {msg.party} runs the session with the {msg.wire!r} ciphertext wire, this party with "
            f"{wire!r}: every party must be configured with the same wire (--wire)"
        )
    try:
        ctx = ServerContext.from_bytes(msg.context, presets=[preset], wire=wire)
    except ContextFormatError as exc:  # NotPublicContextError included
        raise PayloadError(f"public context of party {msg.party} refused: {exc}") from exc
    if ctx.fingerprint() != msg.context_fingerprint:
        raise KeyFingerprintError(f"party {msg.party}'s loaded context has another fingerprint")
    return ctx


def _info(session: int, recipient: int, owner: int) -> bytes:
    return (
        b"fedgat/check-keys/v1"
        + session.to_bytes(8, "big")
        + recipient.to_bytes(4, "big")
        + owner.to_bytes(4, "big")
    )


def seal_check_keys(
    session: int,
    recipient: int,
    signer: SigningIdentity,
    keys: Mapping[int, CheckKeys],
    hpke_keys: Mapping[int, bytes],
    keyset: bytes,
) -> dict:
    """The fields of ``recipient``'s :class:`SealedCheckKeys`: ``keys[b]`` sealed to ``hpke_keys[b]``
    for every owner ``b``, and the recipient's signature over the lot and the round's key set
    ``keyset`` (its roster's :func:`~fedgat.protocols.messages.keyset_fingerprint`)."""
    owners = np.array(sorted(keys), dtype=np.int64)
    sealed = tuple(
        _SUITE.encrypt(
            keys[int(b)].to_bytes(), _public_key(hpke_keys[int(b)]), info=_info(session, recipient, int(b))
        )
        for b in owners
    )
    signature = signer.sign(sealed_keys_bytes(session, recipient, sealed, owners, keyset))
    return {"recipient_party": recipient, "owners": owners, "sealed": sealed, "keys_signature": signature}


def open_check_keys(
    msg: SealedCheckKeys, me: int, mine: SessionKeys, roster: Roster, session: int, keyset: bytes
) -> CheckKeys:
    """The check keys recipient ``msg.recipient_party`` sealed for owner ``me``, signed over the key
    set ``keyset`` of owner ``me``'s own roster.

    Raises:
        PayloadError: not a client's, or no entry for ``me``. SignatureError: not signed by the
            recipient, or signed over another key set (the server showed the two clients different
            participants). AuthError: the entry does not open (another key, or tampered).
    """
    r = msg.recipient_party
    if not roster.is_client(r) or r == me:
        raise PayloadError(f"check keys of party {r}, which is no other client")
    check_signature(
        roster.signing_key(r),
        sealed_keys_bytes(session, r, msg.sealed, msg.owners, keyset),
        msg.keys_signature,
        f"check keys of party {r} are not signed by it over this round's participants",
    )
    at = np.flatnonzero(msg.owners == me)
    if not len(at):
        raise PayloadError(f"party {r}'s check keys hold no entry for party {me}")
    try:
        return CheckKeys.from_bytes(mine.open(msg.sealed[int(at[0])], _info(session, r, me)))
    except (InvalidTag, ValueError) as exc:
        raise AuthError(f"party {r}'s check keys for party {me} do not open") from exc
