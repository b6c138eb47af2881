"""Signing identities (pyca/cryptography): Ed25519 (:class:`SigningIdentity`, :func:`verify`).

Every party signs its protocol frames with its long-term Ed25519 key; the roster of public keys is
pinned out of band (:mod:`fedgat.protocols.roster`). There is no shared CKKS secret key to wrap or
send any more: every pre-training client generates its own (:class:`fedgat.crypto.KeyHolderContext`)
and its per-session HPKE keys (:class:`fedgat.protocols.pretrain_keys.SessionKeys`).

Python cannot reliably erase secrets from memory; keep private keys out of logs and pickles.
"""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import SignatureError

__all__ = ["SigningIdentity", "verify"]

_RAW = serialization.Encoding.Raw
_RAW_PUB = serialization.PublicFormat.Raw
_RAW_PRIV = serialization.PrivateFormat.Raw


# --------------------------------------------------------------------------------------- signing
class SigningIdentity:
    """An Ed25519 signing key (one per participant)."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        if not isinstance(private_key, Ed25519PrivateKey):
            raise TypeError("expected an Ed25519PrivateKey")
        self._key = private_key

    @classmethod
    def generate(cls) -> SigningIdentity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, data: bytes) -> SigningIdentity:
        """Restore from the 32-byte raw private key."""
        try:
            return cls(Ed25519PrivateKey.from_private_bytes(bytes(data)))
        except (ValueError, TypeError) as exc:
            raise SignatureError(f"invalid Ed25519 private key: {exc}") from exc

    def private_bytes(self) -> bytes:
        """32-byte raw private key (for the participant's own storage only)."""
        return self._key.private_bytes(_RAW, _RAW_PRIV, serialization.NoEncryption())

    def public_bytes(self) -> bytes:
        """32-byte raw public key."""
        return self._key.public_key().public_bytes(_RAW, _RAW_PUB)

    def sign(self, data: bytes) -> bytes:
        """64-byte Ed25519 signature over ``data``."""
        return self._key.sign(bytes(data))

    def __repr__(self) -> str:
        return f"SigningIdentity(public={self.public_bytes().hex()[:16]}...)"

    def __reduce__(self):
        raise TypeError("SigningIdentity cannot be pickled; use private_bytes()")


def verify(public_bytes: bytes, data: bytes, signature: bytes) -> None:
    """Check an Ed25519 signature; raise :class:`SignatureError` if it (or the key) is invalid."""
    try:
        key = Ed25519PublicKey.from_public_bytes(bytes(public_bytes))
    except (ValueError, TypeError) as exc:
        raise SignatureError(f"invalid Ed25519 public key: {exc}") from exc
    try:
        key.verify(bytes(signature), bytes(data))
    except (InvalidSignature, ValueError, TypeError) as exc:
        raise SignatureError("signature verification failed") from exc
