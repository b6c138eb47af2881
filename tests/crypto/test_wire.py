"""The two ciphertext wires (``"compact"``, envelope version 2; ``"tenseal"``, version 1): each round
trips against plaintext, a context accepts only its own wire's envelopes, the server's evaluator and
workers write the session's wire, and ``envelope_bytes`` is exact (compact) or an upper bound
(tenseal)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import tenseal as ts

from fedgat.crypto import (
    WIRES,
    CiphertextFormatError,
    KeyHolderContext,
    ServerContext,
    SlotLayout,
    decrypt_rows,
    deserialize,
    encrypt_rows,
    get_preset,
    serialize,
)
from fedgat.crypto.evaluator import SealEvaluator
from fedgat.crypto.packing import envelope, envelope_bytes, load_validated, tenseal_payload
from fedgat.crypto.params import TENSEAL_WIRE_BYTES
from fedgat.crypto.spool import CiphertextSpool

OTHER = {"compact": "tenseal", "tenseal": "compact"}
VERSION = {"compact": 2, "tenseal": 1}


@pytest.fixture(scope="module")
def holders() -> dict[str, KeyHolderContext]:
    """One key pair, loaded once per wire (same key, same fingerprint)."""
    first = KeyHolderContext.generate("n4096", wire="tenseal")
    return {
        "tenseal": first,
        "compact": KeyHolderContext.from_secret_bytes(first.secret_context_bytes(), wire="compact"),
    }


@pytest.fixture(scope="module")
def servers(holders) -> dict[str, ServerContext]:
    return {w: ServerContext.from_bytes(h.public_context_bytes(), wire=w) for w, h in holders.items()}


def _result(server: ServerContext, fresh: ts.CKKSVector, c: np.ndarray) -> ts.CKKSVector:
    return ts.CKKSVector._wrap(fresh.data.mul_plain(c.tolist()))


def test_the_wire_is_a_validated_context_attribute(holders, servers):
    assert WIRES == ("compact", "tenseal")
    for w in WIRES:
        assert holders[w].wire == servers[w].wire == w and w in repr(servers[w])
    assert holders["compact"].fingerprint() == holders["tenseal"].fingerprint()
    assert ServerContext.from_bytes(holders["compact"].public_context_bytes()).wire == "compact"  # default
    with pytest.raises(ValueError, match="unknown ciphertext wire 'raw'"):
        ServerContext.from_bytes(holders["compact"].public_context_bytes(), wire="raw")
    with pytest.raises(ValueError, match="unknown ciphertext wire"):
        KeyHolderContext.generate("n4096", wire="TenSEAL")


@pytest.mark.parametrize("wire", WIRES)
def test_round_trip_against_plaintext(holders, servers, wire):
    holder, server = holders[wire], servers[wire]
    rng = np.random.default_rng(5)
    x, c = rng.uniform(-1, 1, holder.slots), rng.uniform(-1, 1, holder.slots)
    blob = serialize(holder, holder.encrypt_vector(x))
    assert blob[:4] == b"FGCT" and blob[4] == VERSION[wire]
    fresh = deserialize(server, blob, level="fresh")
    np.testing.assert_allclose(holder.decrypt_vector(deserialize(holder, blob, level="fresh")), x, atol=1e-6)
    result = serialize(server, _result(server, fresh, c))
    assert result[4] == VERSION[wire]
    got = holder.decrypt_vector(deserialize(holder, result, level="result"))
    np.testing.assert_allclose(got, x * c, atol=1e-6)
    # the tenseal wire's body is TenSEAL's own bytes; both wires stand for the same TenSEAL bytes
    payload = tenseal_payload(server, blob)
    if wire == "tenseal":
        assert blob[42:-32] == payload
    np.testing.assert_allclose(
        holder.decrypt_vector(ts.ckks_vector_from(holder.tenseal, payload)), x, atol=1e-6
    )
    np.testing.assert_allclose(holder.decrypt_vector(load_validated(server, blob)), x, atol=1e-6)


@pytest.mark.parametrize("wire", WIRES)
def test_an_envelope_of_the_other_wire_is_refused(holders, servers, wire):
    """The same ciphertext under the same key with a correct digest, in the other wire's envelope: a
    typed error naming both wires, from every reader (nothing reaches the other parser)."""
    other = OTHER[wire]
    x = np.linspace(-1, 1, holders[other].slots)
    foreign = serialize(holders[other], holders[other].encrypt_vector(x))
    assert foreign[4] == VERSION[other]
    for ctx in (holders[wire], servers[wire]):
        with pytest.raises(
            CiphertextFormatError, match=f"version {VERSION[other]} .*'{other}'.*wire is '{wire}'"
        ):
            deserialize(ctx, foreign, level="fresh")
        with pytest.raises(CiphertextFormatError, match="version"):
            tenseal_payload(ctx, foreign)
        with pytest.raises(CiphertextFormatError, match="version"):
            load_validated(ctx, foreign)
    # an unknown version, digest recomputed
    head = bytearray(foreign[:-32])
    head[4] = 3
    with pytest.raises(CiphertextFormatError, match="unsupported envelope version 3"):
        deserialize(servers[wire], bytes(head) + hashlib.sha256(head).digest())


def test_a_tenseal_body_is_checked_before_seal_loads_it(holders, servers):
    """The tenseal wire hands SEAL the sender's bytes after the envelope and protobuf checks: a
    wrong-level or malformed body behind a correct digest is a typed error."""
    holder, server = holders["tenseal"], servers["tenseal"]
    blob = serialize(holder, holder.encrypt_vector(np.zeros(holder.slots)))

    def resealed(body: bytes, level: int | None = None) -> bytes:
        head = bytearray(blob[:42])
        head[5] = blob[5] if level is None else level
        head[38:42] = len(body).to_bytes(4, "big")
        return bytes(head) + body + hashlib.sha256(bytes(head) + body).digest()

    body = blob[42:-32]
    assert deserialize(server, resealed(body), level="fresh") is not None
    for bad in (body[:-9], body + b"\x00", b"\x0a\x01\x01" + body[3:], body[: len(body) // 2]):
        with pytest.raises(CiphertextFormatError):
            deserialize(server, resealed(bad), level="fresh")
    with pytest.raises(CiphertextFormatError, match="result"):
        deserialize(server, resealed(body), level="result")
    with pytest.raises(CiphertextFormatError):  # header says result, the body is fresh
        deserialize(server, resealed(body, level=server.result_level))


def test_a_padded_tenseal_body_is_held_to_the_largest_honest_ciphertext(holders, servers):
    """SEAL stops reading after the ciphertext's members, so junk appended to the SEAL stream still
    loads: a receiver refuses an envelope above :func:`envelope_bytes` (what the server would
    otherwise spool from a client padding every upload to the 4 MiB frame limit)."""
    from fedgat.crypto import wire as pb

    holder, server = holders["tenseal"], servers["tenseal"]
    blob = serialize(holder, holder.encrypt_vector(np.full(holder.slots, 0.25)))
    (_, _, sizes), (_, _, stream), (_, _, scale) = pb.parse_fields(blob[42:-32])

    def padded(extra: int) -> bytes:
        s = bytes(stream) + bytes(extra)
        body = b"\x0a" + pb.encode_varint(len(sizes)) + bytes(sizes)
        body += b"\x12" + pb.encode_varint(len(s)) + s + b"\x19" + bytes(scale)
        head = bytearray(blob[:42])
        head[38:42] = len(body).to_bytes(4, "big")
        return bytes(head) + body + hashlib.sha256(bytes(head) + body).digest()

    bound = envelope_bytes(server, "fresh")
    small = padded(64)
    assert len(small) <= bound  # within the bound, padding is not detected: the bound is the guarantee
    assert np.allclose(holder.decrypt_vector(deserialize(server, small, level="fresh"))[:4], 0.25, atol=1e-5)
    big = padded(1 << 20)
    assert len(big) > bound
    for load in (lambda b: deserialize(server, b, level="fresh"), lambda b: tenseal_payload(server, b)):
        with pytest.raises(CiphertextFormatError, match="at most"):
            load(big)


@pytest.mark.parametrize("wire", WIRES)
def test_evaluator_results_in_either_wire_decrypt_to_q_h(holders, servers, unit_rows, wire):
    holder, server = holders[wire], servers[wire]
    rng = np.random.default_rng(11)
    h = unit_rows(rng, 6, 40)
    layout = SlotLayout(40, server.slots, 2)
    sources = [
        [deserialize(server, b, level="fresh") for b in encrypt_rows(holder, row[None], layout)] for row in h
    ]
    q = rng.uniform(-1, 1, (9, 6))
    q[2, :3] = 0.0
    blobs = SealEvaluator(server).linear_map(layout, sources, q)
    assert {b[4] for b in blobs} == {VERSION[wire]}
    got = decrypt_rows(holder, blobs, 9, layout, kind="result")
    np.testing.assert_allclose(got, q @ h, atol=1e-5)
    # the other wire's holder refuses them
    with pytest.raises(CiphertextFormatError, match="wire"):
        decrypt_rows(holders[OTHER[wire]], blobs, 9, layout, kind="result")


@pytest.mark.parametrize("wire", WIRES)
def test_the_spool_and_its_workers_keep_the_sessions_wire(holders, servers, wire):
    from fedgat.crypto.encoders import ProcessPoolEncoder
    from fedgat.crypto.ray_encoder import encode_batch

    holder, server = holders[wire], servers[wire]
    layout = SlotLayout(16, server.slots, 1)
    x = np.eye(4, 16)
    spool = CiphertextSpool(server, layout)
    try:
        for node, row in enumerate(x):
            spool.put(node, 0, next(encrypt_rows(holder, row[None], layout)))
        foreign = next(encrypt_rows(holders[OTHER[wire]], x[:1], layout))
        with pytest.raises(CiphertextFormatError, match="wire"):
            spool.put(9, 0, foreign)
        assert 9 not in spool
        q = np.array([[1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 3.0, -1.0]])
        task = (7, np.arange(4), q, True)

        class Bucket:
            nodes = np.array([7])
            neighbours = (np.arange(4),)

            def __len__(self) -> int:
                return 1

            def coefficients(self, slot: int) -> np.ndarray:
                return q

        with ProcessPoolEncoder(holder.public_context_bytes(), layout, spool, workers=1) as enc:
            (pooled,) = list(enc.map([Bucket()]))
        (rayed,) = encode_batch(
            b"k" + wire.encode(),
            holder.public_context_bytes(),
            wire,
            layout,
            [task],
            [0, 1, 2, 3],
            *[spool.blobs(j) for j in range(4)],
        )
        for result in (pooled, rayed):
            assert {b[4] for b in result.row_blobs} == {VERSION[wire]}
            got = decrypt_rows(holder, result.row_blobs, 2, layout, kind="result")
            np.testing.assert_allclose(got, q @ x, atol=1e-5)
    finally:
        spool.close()


@pytest.mark.parametrize("wire", WIRES)
def test_envelope_bytes_is_exact_for_compact_and_an_upper_bound_for_tenseal(holders, servers, wire):
    holder, server = holders[wire], servers[wire]
    rng = np.random.default_rng(2)
    sizes: dict[str, list[int]] = {"fresh": [], "result": []}
    for _ in range(12):
        fresh = holder.encrypt_vector(rng.uniform(-1, 1, holder.slots))
        sizes["fresh"].append(len(serialize(holder, fresh)))
        sizes["result"].append(
            len(serialize(server, _result(server, fresh, rng.uniform(-1, 1, holder.slots))))
        )
    # the extremes of zstd's input: all-zero and maximal coefficients are not random, still bounded
    zero = holder.encrypt_vector(np.zeros(holder.slots))
    sizes["fresh"].append(len(serialize(holder, zero)))
    preset = get_preset("n4096")
    for level, got in sizes.items():
        bound = envelope_bytes(server, level)
        assert bound == envelope_bytes(holder, level)
        if wire == "compact":
            assert set(got) == {bound} and bound == preset.wire_bytes(level)
        else:
            assert max(got) <= bound < 1.35 * max(got)
            typical = preset.wire_bytes(level, "tenseal")
            assert typical == TENSEAL_WIRE_BYTES["n4096"][0 if level == "fresh" else 1]
            assert abs(np.mean(got) - typical) < 0.01 * typical
            assert 1.05 < typical / preset.wire_bytes(level) < 1.3  # ~16-22 % more than compact
    with pytest.raises(ValueError):
        envelope_bytes(server, "half")


def test_envelope_writes_the_contexts_wire(holders, servers):
    holder = holders["compact"]
    vec = holder.encrypt_vector(np.ones(holder.slots))
    payload, level = vec.serialize(), holder.level_of(vec)
    for w in WIRES:
        blob = envelope(servers[w], payload, level)
        assert blob[4] == VERSION[w]
        np.testing.assert_allclose(
            holders[w].decrypt_vector(deserialize(holders[w], blob, level="fresh")), 1.0, atol=1e-6
        )
