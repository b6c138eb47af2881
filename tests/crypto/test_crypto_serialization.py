"""Hostile bytes: every failure is a typed CryptoError, never a crash or a silent garbage load
(except the documented TenSEAL-level cases, which the envelope closes)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedgat.crypto import (
    CiphertextFormatError,
    CryptoError,
    KeyHolderContext,
    KeyMismatchError,
    deserialize,
    linear_combination,
    serialize,
)
from fedgat.crypto.packing import load_tenseal_vector

_HEADER = 4 + 1 + 1 + 32 + 4


@pytest.fixture(scope="module")
def blobs(holder, server):
    x = np.linspace(-1, 1, holder.slots)
    fresh = serialize(holder, holder.encrypt_vector(x))
    ct = deserialize(server, fresh, level="fresh")
    result = serialize(server, linear_combination(server, [ct], np.full((1, holder.slots), 0.5)))
    return x, fresh, result


@pytest.fixture(scope="module")
def raw_fresh(holder) -> bytes:
    """TenSEAL's own bytes of a fresh ciphertext (protobuf around a zstd-compressed SEAL stream):
    what ``load_tenseal_vector`` reads; the envelope carries the compact form instead."""
    return holder.encrypt_vector(np.linspace(-1, 1, holder.slots)).serialize()


def _reseal(body: bytes) -> bytes:
    """Recompute the envelope digest (what a forger -- or a buggy relay -- can do)."""
    return body + hashlib.sha256(body).digest()


def _envelope(fingerprint: bytes, level: int, payload: bytes, version: int = 2) -> bytes:
    import struct

    return _reseal(struct.pack(">4sBB32sI", b"FGCT", version, level, fingerprint, len(payload)) + payload)


def test_roundtrip_and_levels(holder, server, blobs) -> None:
    x, fresh, result = blobs
    got = holder.decrypt_vector(deserialize(holder, result, level="result"))
    assert np.max(np.abs(got - 0.5 * x)) < 1e-6
    with pytest.raises(CiphertextFormatError):
        deserialize(server, fresh, level="result")
    with pytest.raises(CiphertextFormatError):
        deserialize(holder, result, level="fresh")


@settings(max_examples=50, deadline=None)
@given(data=st.binary(max_size=4096))
def test_random_bytes(server, data: bytes) -> None:
    with pytest.raises(CiphertextFormatError):
        deserialize(server, data)
    with pytest.raises(CiphertextFormatError):
        load_tenseal_vector(server, data)


def test_random_bytes_with_valid_header(server, blobs) -> None:
    """A body of any other size than the level's compact size is refused. One of exactly that size
    is a ciphertext: the compact form has no redundancy (every coefficient is uniform below its
    prime, and the primes are within 2**-19 of a power of two), so random bytes under a recomputed
    digest load and decrypt to garbage, like a ciphertext under another key; only the digest (for
    accident) and the message signature (for forgery) stand between them and the receiver."""
    rng = np.random.default_rng(0)
    size = len(blobs[1]) - _HEADER - 32
    for n in (0, 10, 1000, size - 1, size + 1, len(blobs[2]) - _HEADER - 32):
        data = _envelope(server.fingerprint(), server.fresh_level, rng.bytes(n))
        with pytest.raises(CiphertextFormatError):
            deserialize(server, data)
    deserialize(server, _envelope(server.fingerprint(), server.fresh_level, rng.bytes(size)), level="fresh")


def test_truncated(server, blobs, raw_fresh) -> None:
    _, fresh, result = blobs
    for blob in (fresh, result):
        for n in (0, 1, 4, _HEADER - 1, _HEADER, _HEADER + 10, len(blob) // 2, len(blob) - 33, len(blob) - 1):
            with pytest.raises(CiphertextFormatError):
                deserialize(server, blob[:n])
    for n in (0, 1, 3, 50, len(raw_fresh) // 2, len(raw_fresh) - 1):
        with pytest.raises(CiphertextFormatError):
            load_tenseal_vector(server, raw_fresh[:n])


def test_flipped_byte_anywhere(server, blobs) -> None:
    _, fresh, _ = blobs
    rng = np.random.default_rng(1)
    positions = (
        list(range(120)) + list(rng.integers(0, len(fresh), 300)) + list(range(len(fresh) - 40, len(fresh)))
    )
    for pos in positions:
        bad = bytearray(fresh)
        bad[pos] ^= 1 << int(rng.integers(0, 8))
        with pytest.raises(CiphertextFormatError):  # the digest is checked before the fingerprint
            deserialize(server, bytes(bad))


def test_flipped_byte_raw_tenseal_documented(server, raw_fresh) -> None:
    """Without the envelope digest, TenSEAL/SEAL load most coefficient flips silently.

    Documented behaviour (tenseal 0.3.18): the typed loader raises CiphertextFormatError for
    header/structure damage and never anything else, but a flip inside the zstd-compressed
    coefficients often still loads. This is why `deserialize` checks a digest."""
    payload = raw_fresh
    rng = np.random.default_rng(2)
    loaded = rejected = 0
    for pos in rng.integers(0, len(payload), 200):
        bad = bytearray(payload)
        bad[pos] ^= 1 << int(rng.integers(0, 8))
        try:
            load_tenseal_vector(server, bytes(bad))
            loaded += 1
        except CiphertextFormatError:
            rejected += 1
    assert loaded + rejected == 200
    assert rejected > 0
    print(f"raw TenSEAL bytes, single-bit flips: {loaded} loaded silently, {rejected} rejected")


def test_other_parameters(server, holder, blobs) -> None:
    other = KeyHolderContext.generate("n8192-small")
    blob = serialize(other, other.encrypt_vector(np.zeros(other.slots)))
    with pytest.raises(KeyMismatchError):  # honest envelope: fingerprint differs
        deserialize(server, blob)
    with pytest.raises(CiphertextFormatError):  # raw TenSEAL bytes of other parameters
        load_tenseal_vector(server, other.encrypt_vector(np.zeros(other.slots)).serialize())
    forged = _envelope(server.fingerprint(), server.fresh_level, blob[_HEADER:-32])
    with pytest.raises(CiphertextFormatError):  # forged fingerprint: the compact size is N's and the limbs'
        deserialize(server, forged)


def test_other_key_same_parameters_is_silent_at_tenseal_level(holder, other_holder, blobs) -> None:
    """A ciphertext under ANOTHER key with the same parameters loads and decrypts to garbage
    without any error: TenSEAL cannot tell. The envelope's fingerprint catches honest mix-ups;
    a forger can copy the fingerprint, so messages must also be signed by their sender."""
    x = np.linspace(-1, 1, holder.slots)
    foreign = serialize(other_holder, other_holder.encrypt_vector(x))
    with pytest.raises(KeyMismatchError):
        deserialize(holder, foreign)
    vec = load_tenseal_vector(holder, other_holder.encrypt_vector(x).serialize())  # loads silently
    garbage = holder.decrypt_vector(vec)
    assert np.max(np.abs(garbage - x)) > 1e3
    forged = _envelope(holder.fingerprint(), holder.fresh_level, foreign[_HEADER:-32])
    assert np.max(np.abs(holder.decrypt_vector(deserialize(holder, forged)) - x)) > 1e3


def test_tampered_proto_fields_rejected(server, raw_fresh) -> None:
    """Fields TenSEAL trusts blindly (sizes > slots reads past the data; other scales) are refused
    by the raw loader; the envelope no longer carries them (the receiver rebuilds them from its
    context), and an envelope of version 1 (TenSEAL's bytes as the payload) is refused whatever
    it holds."""
    from fedgat.crypto import wire

    payload = raw_fresh
    fields = wire.parse_fields(payload)

    def rebuild(fields) -> bytes:
        out = b""
        for number, kind, value in fields:
            key = wire.encode_varint((number << 3) | kind)
            if kind == wire.WIRE_LEN:
                out += key + wire.encode_varint(len(value)) + value
            elif kind == wire.WIRE_VARINT:
                out += key + wire.encode_varint(value)
            else:
                out += key + value
        return out

    assert rebuild(fields) == payload
    import struct

    variants = {
        "sizes": [(1, 2, wire.encode_varint(server.slots + 64)) if f[0] == 1 else f for f in fields],
        "scale": [(3, 1, struct.pack("<d", 2.0**37)) if f[0] == 3 else f for f in fields],
        "two_cts": fields + [f for f in fields if f[0] == 2],
        "no_ct": [f for f in fields if f[0] != 2],
        "extra": fields + [(9, 0, 1)],
    }
    for variant in variants.values():
        with pytest.raises(CiphertextFormatError):
            load_tenseal_vector(server, rebuild(variant))
        with pytest.raises(CiphertextFormatError):
            deserialize(server, _envelope(server.fingerprint(), server.fresh_level, rebuild(variant)))
    load_tenseal_vector(server, payload)
    with pytest.raises(CiphertextFormatError, match="version 1"):  # the old envelope, valid bytes inside
        deserialize(server, _envelope(server.fingerprint(), server.fresh_level, payload, version=1))


def test_errors_are_crypto_errors() -> None:
    assert issubclass(CiphertextFormatError, CryptoError)
    assert issubclass(KeyMismatchError, CryptoError)
