"""The compact ciphertext form (fedgat.crypto.compact) inside the envelope: at the byte floor,
lossless, and every malformed body a typed error."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedgat.crypto import (
    CiphertextFormatError,
    KeyHolderContext,
    ServerContext,
    deserialize,
    linear_combination,
    serialize,
)
from fedgat.crypto.compact import CompactCodec, floor_bytes, pack_limb, unpack_limb
from fedgat.crypto.packing import compact_codec, envelope_bytes, load_validated, tenseal_payload

_HEADER = struct.Struct(">4sBB32sI")
_OVERHEAD = _HEADER.size + 32  # envelope header + SHA-256


def _reseal(body: bytes) -> bytes:
    return body + hashlib.sha256(body).digest()


def _with_body(blob: bytes, body: bytes, *, level: int | None = None, version: int = 2) -> bytes:
    """``blob``'s envelope around another compact body (digest recomputed: what a forger can do)."""
    magic, _, lvl, fp, _ = _HEADER.unpack_from(blob, 0)
    return _reseal(_HEADER.pack(magic, version, lvl if level is None else level, fp, len(body)) + body)


def _body(blob: bytes) -> bytes:
    return blob[_HEADER.size : -32]


@pytest.fixture(scope="module", params=["n4096", "n8192-small"])
def parties(request):
    holder = KeyHolderContext.generate(request.param)
    server = ServerContext.from_bytes(holder.public_context_bytes())
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, holder.slots)
    fresh_vec = holder.encrypt_vector(x)
    fresh = serialize(holder, fresh_vec)
    result_vec = linear_combination(
        server, [deserialize(server, fresh, level="fresh")], np.full((1, holder.slots), 0.5)
    )
    result = serialize(server, result_vec)
    return holder, server, x, fresh_vec, fresh, result_vec, result


# --------------------------------------------------------------------------------- bit packing
def _reference_pack(values: np.ndarray, bits: int) -> bytes:
    """Bit i of the stream = bit i % 8 of byte i // 8, value k at bits [k*bits, (k+1)*bits)."""
    acc = 0
    for k, v in enumerate(values.tolist()):
        acc |= int(v) << (k * bits)
    return acc.to_bytes(len(values) * bits // 8, "little")


@settings(max_examples=40, deadline=None)
@given(bits=st.integers(20, 60), groups=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_pack_limb_is_the_little_endian_bitstream(bits: int, groups: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 2**bits, 64 * groups, dtype=np.uint64)
    values[:2] = [0, 2**bits - 1]  # the extremes
    packed = pack_limb(values, bits)
    assert packed == _reference_pack(values, bits)
    assert len(packed) == 64 * groups * bits // 8
    assert np.array_equal(unpack_limb(packed, bits), values)


# ----------------------------------------------------------------------- round trip and size
def test_roundtrip_decrypts_to_the_same_values(parties) -> None:
    """Compact and back is lossless: the received ciphertext decrypts exactly as the sent one."""
    holder, server, x, fresh_vec, fresh, result_vec, result = parties
    for vec, blob, level, receiver in (
        (fresh_vec, fresh, "fresh", server),
        (result_vec, result, "result", holder),
    ):
        got = deserialize(receiver, blob, level=level)
        assert np.array_equal(holder.decrypt_vector(got), holder.decrypt_vector(vec)), level
        assert np.array_equal(
            holder.decrypt_vector(load_validated(receiver, blob)), holder.decrypt_vector(vec)
        )
        assert serialize(receiver, got) == blob  # the same coefficients, the same bytes
    assert np.max(np.abs(holder.decrypt_vector(deserialize(holder, result)) - 0.5 * x)) < 1e-5


def test_sizes_at_the_floor(parties) -> None:
    holder, _, _, fresh_vec, fresh, result_vec, result = parties
    n = holder.preset.poly_modulus_degree
    q0, q1, _ = (q.bit_length() for q in holder.primes)
    floors = {"fresh": 2 * n * (q0 + q1) // 8, "result": 2 * n * q0 // 8}
    for level, blob, vec in (("fresh", fresh, fresh_vec), ("result", result, result_vec)):
        assert floors[level] == floor_bytes(n, (q0, q1) if level == "fresh" else (q0,))
        assert len(blob) - _OVERHEAD <= 1.01 * floors[level]
        assert len(blob) == floors[level] + _OVERHEAD == envelope_bytes(holder, level)
        assert len(vec.serialize()) > 1.1 * floors[level]  # TenSEAL's zstd stream, for comparison


# ------------------------------------------------------------------------- malformed bodies
def _coefficients(ctx, blob: bytes) -> tuple[CompactCodec, np.ndarray]:
    codec = compact_codec(ctx, blob[5])
    return codec, codec.unpack(_body(blob)).copy()


def test_coefficient_not_below_its_prime(parties) -> None:
    holder, server, *_, fresh, _, result = parties
    for blob, ctx in ((fresh, server), (result, holder)):
        codec, grid = _coefficients(ctx, blob)
        for limb, (q, b) in enumerate(zip(codec.primes, codec.bits)):
            for bad in (q, 2**b - 1):
                g = grid.copy()
                g[1, limb, 17] = bad
                body = b"".join(pack_limb(g[:, k, :].ravel(), bb) for k, bb in enumerate(codec.bits))
                with pytest.raises(CiphertextFormatError, match="prime"):
                    deserialize(ctx, _with_body(blob, body))
                with pytest.raises(CiphertextFormatError, match="prime"):
                    codec.pack(g.ravel())  # nor will a sender emit one
        with pytest.raises(CiphertextFormatError, match="prime"):  # all ones: every coefficient too big
            deserialize(ctx, _with_body(blob, b"\xff" * len(_body(blob))))


def test_truncated_or_padded_bodies(parties) -> None:
    holder, server, *_, fresh, _, result = parties
    for blob, ctx in ((fresh, server), (result, holder)):
        body = _body(blob)
        for n in (0, 1, 8, len(body) // 2, len(body) - 8, len(body) - 1):
            with pytest.raises(CiphertextFormatError, match="compact ciphertext of"):
                deserialize(ctx, _with_body(blob, body[:n]))
        with pytest.raises(CiphertextFormatError, match="compact ciphertext of"):
            deserialize(ctx, _with_body(blob, body + b"\0" * 8))
        for n in (10, len(blob) // 2, len(blob) - 1):  # the envelope itself cut short
            with pytest.raises(CiphertextFormatError):
                deserialize(ctx, blob[:n])


def test_wrong_limb_count(parties) -> None:
    """A result body under the fresh level (one limb where two belong) and the other way round."""
    holder, server, *_, fresh, _, result = parties
    with pytest.raises(CiphertextFormatError):
        deserialize(server, _with_body(fresh, _body(result)))
    with pytest.raises(CiphertextFormatError):
        deserialize(holder, _with_body(result, _body(fresh)))
    with pytest.raises(CiphertextFormatError, match="compact ciphertext of"):  # levels agree, size not
        deserialize(holder, _with_body(fresh, _body(result), level=holder.fresh_level))
    with pytest.raises(CiphertextFormatError):  # a level that does not exist
        deserialize(holder, _with_body(fresh, _body(fresh), level=7))


def test_wrong_ring_degree(parties) -> None:
    """A body made at another N (n4096 vs n8192-small) under this context's envelope."""
    holder, *_, fresh, _, _result = parties
    other = KeyHolderContext.generate("n8192-small" if holder.preset.name == "n4096" else "n4096")
    alien = serialize(other, other.encrypt_vector(np.zeros(other.slots)))
    with pytest.raises(CiphertextFormatError, match="compact ciphertext of"):
        deserialize(holder, _with_body(fresh, _body(alien)))
    with pytest.raises(CiphertextFormatError):  # the sender side refuses another context's ciphertext
        compact_codec(holder, holder.fresh_level).compact(
            other.encrypt_vector(np.zeros(other.slots)).serialize()
        )
    payload = holder.encrypt_vector(np.zeros(holder.slots)).serialize()
    with pytest.raises(CiphertextFormatError):  # nor a ciphertext of the other level
        compact_codec(holder, holder.result_level).compact(payload)
    data = holder.tenseal.seal_context().data.first_context_data()
    with pytest.raises(CiphertextFormatError, match="poly_modulus_degree"):  # every field is checked
        CompactCodec.from_template(
            payload,
            poly_modulus_degree=2 * holder.preset.poly_modulus_degree,
            primes=holder.primes[:2],
            parms_id=data.parms_id(),
            scale=holder.scale,
            slots=holder.slots,
        )


def test_wrong_header(parties) -> None:
    holder, *_, fresh, _, _ = parties
    body = _body(fresh)
    magic, version, lvl, fp, length = _HEADER.unpack_from(fresh, 0)
    bad = {
        "magic": _reseal(_HEADER.pack(b"FGCX", version, lvl, fp, length) + body),
        "version 1": _with_body(fresh, body, version=1),
        "version 3": _with_body(fresh, body, version=3),
        "length": _reseal(_HEADER.pack(magic, version, lvl, fp, length - 1) + body),
    }
    for blob in bad.values():
        with pytest.raises(CiphertextFormatError):
            deserialize(holder, blob)
        with pytest.raises(CiphertextFormatError):
            tenseal_payload(holder, blob)  # no digest check there, the framing still holds


# ------------------------------------------------------------------------------ byte flips
def test_flips_fail_the_digest_first(parties) -> None:
    holder, *_, fresh, _, result = parties
    rng = np.random.default_rng(3)
    for blob in (fresh, result):
        for pos in list(range(_HEADER.size, _HEADER.size + 16)) + list(
            rng.integers(_HEADER.size, len(blob) - 32, 40)
        ):
            bad = bytearray(blob)
            bad[pos] ^= 1 << int(rng.integers(0, 8))
            with pytest.raises(CiphertextFormatError, match="digest"):
                deserialize(holder, bytes(bad))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_flips_behind_a_recomputed_digest(parties, data) -> None:
    """With the digest recomputed (a forger's or a buggy sender's body), a flipped body is either
    refused with CiphertextFormatError (a coefficient pushed to or above its prime) or loads as a
    DIFFERENT ciphertext, never anything else: the compact form has no redundancy to check."""
    holder, server, *_, fresh, _, result = parties
    blob, ctx, level = data.draw(st.sampled_from([(fresh, server, "fresh"), (result, holder, "result")]))
    body = bytearray(_body(blob))
    flips = data.draw(
        st.lists(st.tuples(st.integers(0, len(body) - 1), st.integers(0, 7)), min_size=1, max_size=4)
    )
    for pos, bit in flips:
        body[pos] ^= 1 << bit
    if bytes(body) == _body(blob):
        return  # the flips cancelled out
    try:
        vec = deserialize(ctx, _with_body(blob, bytes(body)), level=level)
    except CiphertextFormatError:
        return
    original = holder.decrypt_vector(deserialize(ctx, blob, level=level))
    assert not np.array_equal(holder.decrypt_vector(vec), original)
