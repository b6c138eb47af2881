"""Ed25519 identities (:mod:`fedgat.crypto.keys`). There is no key wrapping any more: no party sends
a CKKS secret key to another (every pre-training client generates its own)."""

from __future__ import annotations

import pytest

import fedgat.crypto
from fedgat.crypto import SignatureError, SigningIdentity, verify


def flip(data: bytes, pos: int, bit: int = 0) -> bytes:
    out = bytearray(data)
    out[pos] ^= 1 << bit
    return bytes(out)


# ------------------------------------------------------------------------------------ signatures
def test_sign_verify_roundtrip() -> None:
    ident = SigningIdentity.generate()
    sig = ident.sign(b"message")
    assert len(sig) == 64 and len(ident.public_bytes()) == 32
    verify(ident.public_bytes(), b"message", sig)
    again = SigningIdentity.from_private_bytes(ident.private_bytes())
    assert again.public_bytes() == ident.public_bytes()


def test_flipped_bit_anywhere_fails() -> None:
    ident = SigningIdentity.generate()
    msg = b"round 3: ciphertext digest"
    sig = ident.sign(msg)
    pub = ident.public_bytes()
    for i in range(len(sig) * 8):
        with pytest.raises(SignatureError):
            verify(pub, msg, flip(sig, i // 8, i % 8))
    for i in range(len(msg) * 8):
        with pytest.raises(SignatureError):
            verify(pub, flip(msg, i // 8, i % 8), sig)
    for i in range(len(pub) * 8):
        with pytest.raises(SignatureError):
            verify(flip(pub, i // 8, i % 8), msg, sig)


def test_malformed_inputs_raise_signature_error() -> None:
    ident = SigningIdentity.generate()
    sig = ident.sign(b"x")
    with pytest.raises(SignatureError):
        verify(ident.public_bytes()[:31], b"x", sig)
    with pytest.raises(SignatureError):
        verify(ident.public_bytes(), b"x", sig[:63])
    with pytest.raises(SignatureError):
        verify(SigningIdentity.generate().public_bytes(), b"x", sig)


def test_identities_cannot_be_pickled() -> None:
    import pickle

    with pytest.raises(TypeError):
        pickle.dumps(SigningIdentity.generate())


def test_no_key_wrapping_api() -> None:
    """The dealer's recipe is gone: nothing in fedgat.crypto wraps or unwraps a secret context."""
    gone = ("WrappingIdentity", "WrapAAD", "WrappedKey", "wrap_secret", "unwrap_secret")
    assert not [name for name in gone if hasattr(fedgat.crypto, name)]
    assert not [name for name in gone if hasattr(fedgat.crypto.keys, name)]
    assert not hasattr(fedgat.crypto.KeyHolderContext, "wrap_for")
    assert not hasattr(fedgat.crypto.KeyHolderContext, "from_wrapped")
