"""Typed errors raised by :mod:`fedgat.crypto`.

Every failure that can be caused by bad input (bytes from the network, a wrong key, a mis-built
preset) is reported as a subclass of :class:`CryptoError`, never as a bare ``ValueError`` or
``RuntimeError`` coming out of TenSEAL, SEAL or ``cryptography``. Callers that relay or store
untrusted bytes can therefore catch ``CryptoError`` and reject the message.
"""

from __future__ import annotations

__all__ = [
    "CiphertextFormatError",
    "ContextFormatError",
    "CryptoError",
    "KeyMismatchError",
    "NotPublicContextError",
    "PresetError",
    "SignatureError",
]


class CryptoError(Exception):
    """Base class of every error raised by ``fedgat.crypto``."""


class PresetError(CryptoError):
    """A CKKS parameter preset is invalid or would fall below 128-bit security."""


class ContextFormatError(CryptoError):
    """Serialised TenSEAL context bytes are malformed, non-canonical or use unknown parameters."""


class NotPublicContextError(ContextFormatError):
    """A context meant for the server carries a secret key (or a secret context was expected)."""


class CiphertextFormatError(CryptoError):
    """Ciphertext bytes are malformed, corrupted, truncated or made with other parameters."""


class KeyMismatchError(CryptoError):
    """Data is bound to a different CKKS key (context fingerprint mismatch)."""


class SignatureError(CryptoError):
    """An Ed25519 signature (or the public key given to check it) is invalid."""
