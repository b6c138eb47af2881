from __future__ import annotations

import hashlib
import pickle

import numpy as np
import pytest
import tenseal as ts

from fedgat.crypto import (
    ContextFormatError,
    KeyHolderContext,
    KeyMismatchError,
    NotPublicContextError,
    PresetError,
    ServerContext,
    deserialize,
    serialize,
)
from fedgat.crypto.context import canonical_public_bytes


def test_server_context_is_public(holder, server) -> None:
    ctx = server.tenseal
    assert not ctx.has_secret_key()
    assert ctx.is_public()
    assert not ctx.has_galois_keys() and not ctx.has_relin_keys()
    assert server.preset.name == "n4096"
    assert server.scale == float(server.primes[1]) == ctx.global_scale


def test_server_cannot_decrypt(holder, server) -> None:
    blob = serialize(holder, holder.encrypt_vector(np.full(holder.slots, 0.25)))
    vec = deserialize(server, blob, level="fresh")
    with pytest.raises(ValueError, match="secret"):
        vec.decrypt()


def test_from_bytes_refuses_secret_context(holder) -> None:
    with pytest.raises(NotPublicContextError):
        ServerContext.from_bytes(holder.secret_context_bytes())
    # also the full TenSEAL serialisation with every key
    with pytest.raises(NotPublicContextError):
        ServerContext.from_bytes(holder.tenseal.serialize(save_secret_key=True))


def test_from_bytes_refuses_non_canonical(holder) -> None:
    with_relin = holder.tenseal.serialize(save_secret_key=False, save_relin_keys=True)
    with pytest.raises(ContextFormatError):
        ServerContext.from_bytes(with_relin)
    no_pk = holder.tenseal.serialize(
        save_public_key=False, save_secret_key=False, save_relin_keys=False, save_galois_keys=False
    )
    with pytest.raises(ContextFormatError):
        ServerContext.from_bytes(no_pk)


def test_from_bytes_refuses_galois_keys() -> None:
    key_holder = KeyHolderContext.generate("n4096")
    ctx = key_holder.tenseal.copy()
    ctx.generate_galois_keys()
    data = ctx.serialize(save_secret_key=False, save_relin_keys=False, save_galois_keys=True)
    with pytest.raises(ContextFormatError):
        ServerContext.from_bytes(data)


def test_from_bytes_refuses_garbage(holder) -> None:
    pub = holder.public_context_bytes()
    rng = np.random.default_rng(0)
    for data in (b"", b"\x00" * 10, rng.bytes(1000), pub[: len(pub) // 2], pub[:-1]):
        with pytest.raises(ContextFormatError):
            ServerContext.from_bytes(data)
    for pos in (0, 1, 5, 40, len(pub) // 2, len(pub) - 3):
        bad = bytearray(pub)
        bad[pos] ^= 0x10
        try:
            ctx = ServerContext.from_bytes(bytes(bad))
        except ContextFormatError:
            continue
        # a flip that TenSEAL accepts must at least change the fingerprint
        assert ctx.fingerprint() != holder.fingerprint()


def test_from_bytes_refuses_unknown_parameters() -> None:
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, 8192, coeff_mod_bit_sizes=[50, 30, 50])
    ctx.global_scale = 2.0**30
    with pytest.raises(ContextFormatError):
        ServerContext.from_bytes(canonical_public_bytes(ctx))


def test_from_bytes_refuses_inexact_scale(holder) -> None:
    ctx = ts.context_from(holder.public_context_bytes())
    ctx.global_scale = 2.0**37  # the customary power of two: results off by a relative 1e-6
    with pytest.raises(ContextFormatError, match="scale"):
        ServerContext.from_bytes(canonical_public_bytes(ctx))


def test_fingerprint(holder, server, other_holder) -> None:
    fp = holder.fingerprint()
    assert isinstance(fp, bytes) and len(fp) == 32
    assert fp == hashlib.sha256(holder.public_context_bytes()).digest()
    assert server.fingerprint() == fp
    assert other_holder.fingerprint() != fp
    reloaded = KeyHolderContext.from_secret_bytes(holder.secret_context_bytes(), expected_fingerprint=fp)
    assert reloaded.fingerprint() == fp
    # canonical public serialisation is deterministic, also after a public reload
    assert (
        canonical_public_bytes(ts.context_from(holder.public_context_bytes()))
        == holder.public_context_bytes()
    )


def test_from_secret_bytes_checks(holder, other_holder) -> None:
    with pytest.raises(KeyMismatchError):
        KeyHolderContext.from_secret_bytes(
            holder.secret_context_bytes(), expected_fingerprint=other_holder.fingerprint()
        )
    with pytest.raises(NotPublicContextError):
        KeyHolderContext.from_secret_bytes(holder.public_context_bytes())
    with pytest.raises(ContextFormatError):
        KeyHolderContext.from_secret_bytes(b"\x01\x02\x03")


def test_reloaded_key_holder_decrypts(holder) -> None:
    other = KeyHolderContext.from_secret_bytes(holder.secret_context_bytes())
    x = np.linspace(-1, 1, holder.slots)
    blob = serialize(holder, holder.encrypt_vector(x))
    got = other.decrypt_vector(deserialize(other, blob, level="fresh"))
    assert np.max(np.abs(got - x)) < 1e-6


def test_asymmetric_mode(holder) -> None:
    asym = KeyHolderContext.from_secret_bytes(holder.secret_context_bytes(), symmetric_encryption=False)
    x = np.linspace(-1, 1, holder.slots)
    got = holder.decrypt_vector(deserialize(holder, serialize(asym, asym.encrypt_vector(x))))
    assert np.max(np.abs(got - x)) < holder.preset.fresh_error_bound(symmetric=False)


def test_no_galois_keys_and_no_pickling(holder, server) -> None:
    assert not holder.tenseal.has_galois_keys()
    for obj in (holder, server):
        with pytest.raises(TypeError):
            pickle.dumps(obj)
    with pytest.raises(TypeError):
        KeyHolderContext(holder.tenseal, holder.preset)
    with pytest.raises(TypeError):
        ServerContext(server.tenseal, server.preset, b"")


def test_encrypt_vector_validates(holder) -> None:
    with pytest.raises(ValueError):
        holder.encrypt_vector(np.zeros(holder.slots - 1))
    with pytest.raises(ValueError):
        holder.encrypt_vector(np.full(holder.slots, np.nan))
    with pytest.raises(ValueError):
        holder.encrypt_vector(np.full(holder.slots, 1e6))


def test_generate_unknown_preset() -> None:
    with pytest.raises(PresetError):
        KeyHolderContext.generate("n123")
