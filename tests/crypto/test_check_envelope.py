"""``check_envelope`` (what the server runs on every upload) refuses exactly what ``deserialize``
refuses, with the same error type and message, in both wires: the compact wire's check skips
building and loading TenSEAL's bytes, so this holds it to the loader it stands in for."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
import tenseal as ts

from fedgat.crypto import WIRES, CiphertextFormatError, KeyHolderContext, ServerContext, serialize
from fedgat.crypto.errors import KeyMismatchError
from fedgat.crypto.packing import check_envelope, compact_codec, deserialize, envelope_body

_HEAD = 4 + 1 + 1 + 32 + 4  # magic, version, level, fingerprint, length (packing._HEADER)


@pytest.fixture(scope="module")
def keys() -> dict[str, tuple[KeyHolderContext, ServerContext]]:
    first = KeyHolderContext.generate("n4096", wire="tenseal")
    out = {}
    for w in WIRES:
        holder = KeyHolderContext.from_secret_bytes(first.secret_context_bytes(), wire=w)
        out[w] = (holder, ServerContext.from_bytes(holder.public_context_bytes(), wire=w))
    return out


@pytest.fixture(scope="module")
def foreign() -> KeyHolderContext:
    return KeyHolderContext.generate("n4096")


def _outcome(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except (CiphertextFormatError, KeyMismatchError) as exc:
        return type(exc), str(exc)
    return None


def _same(ctx, blob, level):
    want = _outcome(deserialize, ctx, blob, level=level)
    got = _outcome(check_envelope, ctx, blob, level=level)
    assert got == want
    return got


def _reseal(blob: bytes) -> bytes:
    """``blob`` with its digest recomputed (a malformed body that passes the digest check)."""
    return blob[:-32] + hashlib.sha256(blob[:-32]).digest()


def _compact_with(ctx: ServerContext, level: int, grid: np.ndarray) -> bytes:
    codec = compact_codec(ctx, level)
    body = b"".join(_pack(grid[:, limb, :].ravel(), b) for limb, b in enumerate(codec.bits))
    return envelope_body(ctx, body, level)


def _pack(values: np.ndarray, bits: int) -> bytes:
    from fedgat.crypto.compact import pack_limb

    return pack_limb(values, bits)


@pytest.mark.parametrize("wire", WIRES)
def test_same_verdict_as_deserialize(keys, foreign, wire):
    holder, server = keys[wire]
    rng = np.random.default_rng(3)
    fresh = serialize(holder, holder.encrypt_vector(rng.uniform(-1, 1, holder.slots)))
    vec = holder.encrypt_vector(rng.uniform(-1, 1, holder.slots))
    result = serialize(
        holder, ts.CKKSVector._wrap(vec.data.mul_plain(rng.uniform(-1, 1, holder.slots).tolist()))
    )
    assert _same(server, fresh, "fresh") is None
    assert _same(server, fresh, None) is None
    assert _same(server, result, "result") is None
    assert _same(server, result, "fresh") is not None  # a result is not an upload
    assert _same(server, fresh, "result") is not None
    other = KeyHolderContext.from_secret_bytes(foreign.secret_context_bytes(), wire=wire)
    assert (
        _same(server, serialize(other, other.encrypt_vector([0.5] * other.slots)), "fresh")[0]
        is KeyMismatchError
    )
    cases = [
        fresh[:-1],  # truncated
        fresh + b"\0",  # padded
        b"",
        b"FGCT" + bytes(80),
        bytes([fresh[0] ^ 1]) + fresh[1:],  # magic
        fresh[:4] + bytes([fresh[4] ^ 3]) + fresh[5:],  # version (the other wire's)
        _reseal(fresh[:5] + bytes([7]) + fresh[6:]),  # unknown level
        _reseal(fresh[:5] + bytes([fresh[5] ^ 1]) + fresh[6:]),  # the other level, digest fixed
    ]
    for k in (0, _HEAD + 3, len(fresh) // 2, len(fresh) - 40, len(fresh) - 1):
        flipped = bytearray(fresh)
        flipped[k] ^= 0x10
        cases.append(bytes(flipped))  # digest mismatch
        _same(server, _reseal(bytes(flipped)), "fresh")  # a changed body with a valid digest: either way
    for blob in cases:
        assert _same(server, blob, "fresh") is not None


def test_compact_coefficients_out_of_range_and_transparent(keys):
    holder, server = keys["compact"]
    level = server.fresh_level
    codec = compact_codec(server, level)
    fresh = serialize(holder, holder.encrypt_vector([0.25] * holder.slots))
    grid = codec.unpack(fresh[_HEAD:-32]).copy()
    assert _same(server, _compact_with(server, level, grid), "fresh") is None  # rebuilt: accepted
    for limb, q in enumerate(codec.primes):
        bad = grid.copy()
        bad[0, limb, 5] = q  # not below its prime (fits in the limb's bits: q < 2**bits)
        assert _same(server, _compact_with(server, level, bad), "fresh")[0] is CiphertextFormatError
    transparent = grid.copy()
    transparent[1] = 0  # SEAL's is_transparent
    got = _same(server, _compact_with(server, level, transparent), "fresh")
    assert got is not None and "non-zero" in got[1]
    zero_c0 = grid.copy()
    zero_c0[0] = 0  # SEAL does not refuse this, so neither does the check
    assert _same(server, _compact_with(server, level, zero_c0), "fresh") is None
    one_coefficient = grid.copy()
    one_coefficient[1] = 0
    one_coefficient[1, 0, 7] = 1  # a single non-zero coefficient is not transparent
    assert _same(server, _compact_with(server, level, one_coefficient), "fresh") is None


def test_random_coefficients_load_exactly_when_checked(keys):
    """Any in-range coefficients are a ciphertext SEAL loads (so a check that skips the loader
    accepts nothing the workers could not load from the spool)."""
    _, server = keys["compact"]
    rng = np.random.default_rng(11)
    for level in (server.fresh_level, server.result_level):
        codec = compact_codec(server, level)
        for _ in range(5):
            grid = np.stack(
                [
                    rng.integers(0, q, size=(2, codec.poly_modulus_degree), dtype=np.uint64)
                    for q in codec.primes
                ],
                axis=1,
            )
            blob = _compact_with(server, level, grid)
            assert _same(server, blob, None) is None


def test_length_field_is_checked(keys):
    holder, server = keys["compact"]
    fresh = serialize(holder, holder.encrypt_vector([0.1] * holder.slots))
    assert struct.unpack_from(">I", fresh, _HEAD - 4)[0] == len(fresh) - _HEAD - 32
    short_body = envelope_body(server, fresh[_HEAD:-33], server.fresh_level)  # one byte short
    assert _same(server, short_body, "fresh")[0] is CiphertextFormatError
