"""The server's SEAL evaluator (one encoding per coefficient vector, one rescale per result)
against TenSEAL's per-term path, plaintext sums and its own operation counts."""

from __future__ import annotations

import numpy as np
import pytest

from fedgat.crypto import (
    CiphertextFormatError,
    SlotLayout,
    decrypt_rows,
    deserialize,
    encrypt_rows,
    linear_map_rows,
    serialize,
)
from fedgat.crypto import evaluator as evaluator_module
from fedgat.crypto.evaluator import OpCounts, SealEvaluator, evaluator_for

TARGET = 1e-5
D = 1433  # Cora's width: 3 chunks of the n4096 layout, blocks of 4 rows


def _sources(holder, server, h, lay):
    blobs = list(encrypt_rows(holder, h, lay))
    c = lay.chunks
    return [[deserialize(server, blobs[j * c + ch], level="fresh") for ch in range(c)] for j in range(len(h))]


def test_linear_map_matches_tenseal_and_plaintext(holder, server, unit_rows, record_property) -> None:
    """Same envelopes' contents as TenSEAL's linear_map_rows (to CKKS noise), and Q @ H to 1e-5,
    with zero columns and an all-zero row so that groups use different sources."""
    rng = np.random.default_rng(11)
    n_src, m = 40, 11
    h = unit_rows(rng, n_src, D, nnz=18)
    q = rng.uniform(-1, 1, (m, n_src)) / np.sqrt(n_src)
    q[:4, :25] = 0.0  # group 0 uses 15 sources, the others all 40
    q[5] = 0.0
    lay = SlotLayout.for_dimension(D, holder.slots)
    assert lay.chunks > 1 and lay.blocks > 1
    sources = _sources(holder, server, h, lay)
    ev = SealEvaluator(server)
    ours = ev.linear_map(lay, sources, q)
    theirs = [serialize(server, v) for v in linear_map_rows(server, lay, sources, q)]
    assert len(ours) == len(theirs) == lay.groups(m) * lay.chunks
    got, ref = decrypt_rows(holder, ours, m, lay), decrypt_rows(holder, theirs, m, lay)
    err = float(np.max(np.abs(got - q @ h)))
    record_property("max_error_seal_evaluator", err)
    assert err <= TARGET
    assert float(np.max(np.abs(got - ref))) <= 2 * holder.error_bound(n_src)
    assert ev.ops == OpCounts.of_map(q, lay)
    assert ev.ops == OpCounts(encodes=15 + 2 * 40, multiplies=3 * 95, additions=3 * 92, rescales=3 * 3)


def test_one_rescale_per_result_is_no_less_accurate(holder, server, record_property) -> None:
    """170 terms of |c| = 1 on |h| <= 1: the lazy rescale stays within the per-term bound."""
    rng = np.random.default_rng(12)
    terms = 170
    lay = SlotLayout.for_dimension(holder.slots, holder.slots)  # one chunk, one block
    h = rng.uniform(-1, 1, (terms, holder.slots))
    q = rng.choice([-1.0, 1.0], size=(1, terms))
    out = SealEvaluator(server).linear_map(lay, _sources(holder, server, h, lay), q)
    err = float(np.max(np.abs(decrypt_rows(holder, out, 1, lay) - q @ h)))
    record_property("max_error_seal_evaluator_170", err)
    assert err <= holder.error_bound(terms)
    assert err <= TARGET


def test_payload_is_tenseals_own_serialisation(holder, server) -> None:
    """Byte for byte what CKKSVector.serialize writes, for results of different sizes in a row
    (the in-memory file is truncated between saves)."""
    rng = np.random.default_rng(13)
    ev = SealEvaluator(server)
    vectors = [
        holder.encrypt_vector(rng.uniform(-1, 1, holder.slots)).mul(
            rng.uniform(-1, 1, holder.slots).tolist()
        ),
        holder.encrypt_vector(np.zeros(holder.slots)).mul([0.0] * holder.slots),  # compresses smaller
        holder.encrypt_vector(rng.uniform(-1, 1, holder.slots)),  # a fresh one: two primes
    ]
    sizes = []
    for vec in vectors:
        payload = ev.payload(vec.data.ciphertext()[0])
        assert payload == vec.serialize()
        sizes.append(len(payload))
    assert len(set(sizes)) == 3


def test_checks(holder, server) -> None:
    lay = SlotLayout.for_dimension(8, holder.slots)
    ev = SealEvaluator(server)
    src = _sources(holder, server, np.ones((2, 8)) / np.sqrt(8), lay)
    with pytest.raises(ValueError, match="every coefficient"):
        ev.linear_map(lay, src, np.zeros((1, 2)))
    with pytest.raises(ValueError, match="shape"):
        ev.linear_map(lay, src, np.ones((1, 3)))
    with pytest.raises(ValueError, match="finite"):
        ev.linear_map(lay, src, np.array([[1.0, np.nan]]))
    result = deserialize(server, ev.linear_map(lay, src, np.ones((1, 2)))[0], level="result")
    with pytest.raises(CiphertextFormatError, match="fresh"):
        ev.linear_map(lay, [src[0], [result]], np.ones((1, 2)))
    assert ev.ops.rescales == 1  # refused calls count nothing


def test_one_file_per_process(monkeypatch) -> None:
    """A forked worker gets its own in-memory file instead of writing into its parent's."""
    first = evaluator_module._memory_file()
    assert evaluator_module._memory_file() is first
    monkeypatch.setattr(evaluator_module, "_FILE", (-1, first))  # as if made by the parent
    assert evaluator_module._memory_file() is not first


def test_evaluator_for_is_per_context(holder, server) -> None:
    assert evaluator_for(server) is evaluator_for(server)
    assert evaluator_for(holder) is not evaluator_for(server)


def test_file_fallback_without_memfd(holder, server, monkeypatch) -> None:
    """Where the OS has no ``memfd_create`` (macOS, Windows) the evaluator saves through a private
    temporary file: the same bytes, a 0600 file in a directory only this user can enter, removed on close."""
    import os
    import stat

    rng = np.random.default_rng(14)
    vec = holder.encrypt_vector(rng.uniform(-1, 1, holder.slots)).mul(
        rng.uniform(-1, 1, holder.slots).tolist()
    )
    expected = vec.serialize()
    monkeypatch.delattr(os, "memfd_create", raising=False)
    monkeypatch.setattr(evaluator_module, "_FILE", None)
    memory = evaluator_module._memory_file()
    assert not memory.path.startswith("/proc/")
    assert stat.S_IMODE(os.stat(memory.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(memory.path)).st_mode) == 0o700
    assert SealEvaluator(server).payload(vec.data.ciphertext()[0]) == expected
    memory.close()
    assert not os.path.exists(memory.path)


@pytest.mark.parametrize("wire", ["compact", "tenseal"])
def test_result_envelope_is_the_envelope_of_the_payload(wire) -> None:
    """The evaluator's direct path (SEAL stream -> compact body, no protobuf in between) writes the
    same bytes as enveloping TenSEAL's serialisation, in either wire, and refuses a fresh ciphertext
    on the compact wire (its metadata is not a result's)."""
    from fedgat.crypto import KeyHolderContext
    from fedgat.crypto.context import ServerContext
    from fedgat.crypto.packing import envelope

    holder = KeyHolderContext.generate("n4096", wire=wire)
    server = ServerContext.from_bytes(holder.public_context_bytes(), wire=wire)
    rng = np.random.default_rng(15)
    fresh = holder.encrypt_vector(rng.uniform(-1, 1, holder.slots))
    result = fresh.mul(rng.uniform(-1, 1, holder.slots).tolist())
    ct = result.data.ciphertext()[0]
    ev = SealEvaluator(server)
    ours = ev.result_envelope(ct)
    assert ours == envelope(server, result.serialize(), server.result_level)
    assert np.allclose(
        holder.decrypt_vector(deserialize(holder, ours, level="result")), holder.decrypt_vector(result)
    )
    if wire == "compact":
        with pytest.raises(CiphertextFormatError, match="metadata"):
            ev.result_envelope(fresh.data.ciphertext()[0])
