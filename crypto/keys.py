"""Signing identities and wrapping of the CKKS secret context (pyca/cryptography).

Signing: Ed25519 (:class:`SigningIdentity`, :func:`verify`).

Key wrapping (the dealer sends the secret CKKS context to each client through the server)::

    eph        = fresh X25519 key pair (one per wrap)
    shared     = X25519(eph.private, recipient.public)
    key        = HKDF-SHA256(shared, salt = none, length = 32,
                             info = "fedgat/wrap/v1" || aad || eph.public || recipient.public)
    aad        = canonical(sender_id, recipient_id, round_id, key_fingerprint)
    header     = "FGWK" || version || len(aad) || aad || eph.public || nonce
    ciphertext = ChaCha20-Poly1305(key).encrypt(nonce, secret_context, associated_data = header)
    signature  = Ed25519_dealer(header || ciphertext)          (optional in the primitive)

* The HKDF info and the AEAD associated data both bind the sender id, recipient id, round id and
  the CKKS key fingerprint, so a blob replayed into another round, re-addressed to another
  client or paired with another public context fails with :class:`KeyUnwrapError`.
* Ephemeral-static ECDH authenticates nobody: anyone, the server included, can wrap *some*
  secret for a client under any claimed sender id. The dealer's Ed25519 signature is what makes
  the blob the dealer's; :meth:`fedgat.crypto.context.KeyHolderContext.from_wrapped` requires it.
* The server relays blobs and holds no recipient private key, so it cannot open them.
* Python cannot reliably erase secrets from memory; keep secret contexts out of logs and pickles.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import KeyUnwrapError, SignatureError

__all__ = [
    "SigningIdentity",
    "WrapAAD",
    "WrappedKey",
    "WrappingIdentity",
    "unwrap_secret",
    "verify",
    "wrap_secret",
]

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


# ---------------------------------------------------------------------------------- key wrapping
class WrappingIdentity:
    """A client's static X25519 key pair for receiving wrapped secrets."""

    def __init__(self, private_key: X25519PrivateKey) -> None:
        if not isinstance(private_key, X25519PrivateKey):
            raise TypeError("expected an X25519PrivateKey")
        self._key = private_key

    @classmethod
    def generate(cls) -> WrappingIdentity:
        return cls(X25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, data: bytes) -> WrappingIdentity:
        try:
            return cls(X25519PrivateKey.from_private_bytes(bytes(data)))
        except (ValueError, TypeError) as exc:
            raise KeyUnwrapError(f"invalid X25519 private key: {exc}") from exc

    def private_bytes(self) -> bytes:
        return self._key.private_bytes(_RAW, _RAW_PRIV, serialization.NoEncryption())

    def public_bytes(self) -> bytes:
        return self._key.public_key().public_bytes(_RAW, _RAW_PUB)

    @property
    def private_key(self) -> X25519PrivateKey:
        return self._key

    def __repr__(self) -> str:
        return f"WrappingIdentity(public={self.public_bytes().hex()[:16]}...)"

    def __reduce__(self):
        raise TypeError("WrappingIdentity cannot be pickled; use private_bytes()")


@dataclass(frozen=True)
class WrapAAD:
    """Fields every wrapped secret is bound to (authenticated, not encrypted)."""

    sender_id: str
    recipient_id: str
    round_id: int
    key_fingerprint: bytes

    def __post_init__(self) -> None:
        for name in ("sender_id", "recipient_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or len(value.encode()) > 1024:
                raise ValueError(f"{name} must be a non-empty str of at most 1024 UTF-8 bytes")
        if isinstance(self.round_id, bool) or not isinstance(self.round_id, int):
            raise TypeError("round_id must be an int")
        if not 0 <= self.round_id < 2**64:
            raise ValueError("round_id must fit in an unsigned 64-bit integer")
        if not isinstance(self.key_fingerprint, bytes) or len(self.key_fingerprint) != 32:
            raise ValueError("key_fingerprint must be 32 bytes")

    def encode(self) -> bytes:
        """Canonical, injective encoding (length-prefixed strings, fixed-width round id)."""
        s, r = self.sender_id.encode(), self.recipient_id.encode()
        return (
            struct.pack(">H", len(s))
            + s
            + struct.pack(">H", len(r))
            + r
            + struct.pack(">Q", self.round_id)
            + self.key_fingerprint
        )

    @classmethod
    def decode(cls, data: bytes) -> WrapAAD:
        try:
            pos = 0
            (ls,) = struct.unpack_from(">H", data, pos)
            pos += 2
            s = data[pos : pos + ls].decode()
            pos += ls
            (lr,) = struct.unpack_from(">H", data, pos)
            pos += 2
            r = data[pos : pos + lr].decode()
            pos += lr
            (round_id,) = struct.unpack_from(">Q", data, pos)
            pos += 8
            fp = bytes(data[pos : pos + 32])
            if pos + 32 != len(data):
                raise ValueError("trailing or missing bytes")
            return cls(s, r, round_id, fp)
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise KeyUnwrapError(f"malformed wrap AAD: {exc}") from exc


_MAGIC = b"FGWK"
_VERSION = 1
_INFO = b"fedgat/wrap/v1"
_NONCE = 12


@dataclass(frozen=True)
class WrappedKey:
    """A wrapped secret. Wire format (v1), all integers big-endian::

    "FGWK" | u8 version | u16 len(aad) | aad | 32 B ephemeral X25519 public | 12 B nonce
    | u32 len(ct) | ChaCha20-Poly1305 ciphertext (+16 B tag) | u8 len(sig) (0 or 64) | sig
    """

    aad: WrapAAD
    ephemeral_public: bytes
    nonce: bytes
    ciphertext: bytes
    signature: bytes | None = None
    version: int = _VERSION

    def header(self) -> bytes:
        aad = self.aad.encode()
        return (
            _MAGIC
            + bytes([self.version])
            + struct.pack(">H", len(aad))
            + aad
            + self.ephemeral_public
            + self.nonce
        )

    def signed_body(self) -> bytes:
        """What the dealer signs: header and ciphertext."""
        return self.header() + struct.pack(">I", len(self.ciphertext)) + self.ciphertext

    def to_bytes(self) -> bytes:
        sig = self.signature or b""
        return self.signed_body() + bytes([len(sig)]) + sig

    @classmethod
    def from_bytes(cls, data: bytes) -> WrappedKey:
        data = bytes(data)
        try:
            if data[:4] != _MAGIC:
                raise ValueError("bad magic")
            version = data[4]
            if version != _VERSION:
                raise ValueError(f"unsupported version {version}")
            (la,) = struct.unpack_from(">H", data, 5)
            pos = 7
            aad = WrapAAD.decode(data[pos : pos + la])
            pos += la
            eph = data[pos : pos + 32]
            pos += 32
            nonce = data[pos : pos + _NONCE]
            pos += _NONCE
            (lc,) = struct.unpack_from(">I", data, pos)
            pos += 4
            ct = data[pos : pos + lc]
            pos += lc
            if len(eph) != 32 or len(nonce) != _NONCE or len(ct) != lc or pos >= len(data):
                raise ValueError("truncated")
            ls = data[pos]
            pos += 1
            sig = data[pos : pos + ls]
            if ls not in (0, 64) or pos + ls != len(data):
                raise ValueError("bad signature field")
        except (IndexError, struct.error, ValueError) as exc:
            raise KeyUnwrapError(f"malformed wrapped key: {exc}") from exc
        return cls(aad, eph, nonce, ct, sig or None, version)


def _derive_key(shared: bytes, aad: WrapAAD, eph_pub: bytes, recipient_pub: bytes) -> bytes:
    info = _INFO + aad.encode() + eph_pub + recipient_pub
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def wrap_secret(
    secret: bytes, recipient_public: bytes, aad: WrapAAD, *, signer: SigningIdentity | None = None
) -> WrappedKey:
    """Encrypt ``secret`` (e.g. a secret TenSEAL context) to one recipient's X25519 public key.

    With ``signer`` the result carries the signer's Ed25519 signature over header + ciphertext.
    """
    if not isinstance(aad, WrapAAD):
        raise TypeError("aad must be a WrapAAD")
    try:
        recipient = X25519PublicKey.from_public_bytes(bytes(recipient_public))
    except (ValueError, TypeError) as exc:
        raise KeyUnwrapError(f"invalid recipient X25519 public key: {exc}") from exc
    eph = X25519PrivateKey.generate()
    eph_pub = eph.public_key().public_bytes(_RAW, _RAW_PUB)
    try:
        shared = eph.exchange(recipient)
    except ValueError as exc:  # low-order point: all-zero shared secret
        raise KeyUnwrapError("recipient public key is a low-order point") from exc
    key = _derive_key(shared, aad, eph_pub, bytes(recipient_public))
    nonce = os.urandom(_NONCE)
    unsigned = WrappedKey(aad, eph_pub, nonce, b"")
    ct = ChaCha20Poly1305(key).encrypt(nonce, bytes(secret), unsigned.header())
    wrapped = WrappedKey(aad, eph_pub, nonce, ct)
    if signer is not None:
        wrapped = WrappedKey(aad, eph_pub, nonce, ct, signer.sign(wrapped.signed_body()))
    return wrapped


def unwrap_secret(
    wrapped: WrappedKey | bytes,
    recipient: WrappingIdentity | X25519PrivateKey,
    expected: WrapAAD,
    *,
    signer_public: bytes | None = None,
) -> bytes:
    """Open a wrapped secret. Raises :class:`KeyUnwrapError` if the blob is malformed, its AAD
    fields differ from ``expected``, it was wrapped for another key, it was tampered with, or --
    when ``signer_public`` is given -- the signature is missing or invalid."""
    if isinstance(wrapped, (bytes, bytearray, memoryview)):
        wrapped = WrappedKey.from_bytes(bytes(wrapped))
    if not isinstance(wrapped, WrappedKey):
        raise TypeError("wrapped must be WrappedKey or bytes")
    private = recipient.private_key if isinstance(recipient, WrappingIdentity) else recipient
    if not isinstance(private, X25519PrivateKey):
        raise TypeError("recipient must be a WrappingIdentity or X25519PrivateKey")
    if wrapped.aad != expected:
        raise KeyUnwrapError("wrapped key is bound to other sender/recipient/round/fingerprint")
    if signer_public is not None:
        if wrapped.signature is None:
            raise KeyUnwrapError("wrapped key is not signed")
        try:
            verify(signer_public, wrapped.signed_body(), wrapped.signature)
        except SignatureError as exc:
            raise KeyUnwrapError("dealer signature on wrapped key is invalid") from exc
    recipient_pub = private.public_key().public_bytes(_RAW, _RAW_PUB)
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(wrapped.ephemeral_public))
    except ValueError as exc:
        raise KeyUnwrapError("invalid ephemeral public key") from exc
    key = _derive_key(shared, wrapped.aad, wrapped.ephemeral_public, recipient_pub)
    try:
        return ChaCha20Poly1305(key).decrypt(wrapped.nonce, wrapped.ciphertext, wrapped.header())
    except InvalidTag as exc:
        raise KeyUnwrapError("authentication failed (wrong recipient or tampered blob)") from exc
