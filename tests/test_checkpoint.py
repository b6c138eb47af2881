"""fedgat.checkpoint: exact round trips, atomic writes, and every corruption detected (nothing loaded)."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
import torch

from fedgat.checkpoint import (
    FORMAT_VERSION,
    MAGIC,
    Checkpoint,
    CheckpointError,
    CheckpointFormatError,
    CheckpointIntegrityError,
    CheckpointMismatchError,
    CheckpointStore,
    decode_checkpoint,
    encode_checkpoint,
    encodings_from_checkpoint,
    encodings_to_checkpoint,
    load_checkpoint,
    optimizer_from_checkpoint,
    optimizer_to_checkpoint,
    save_checkpoint,
)


def _sample() -> Checkpoint:
    rng = np.random.default_rng(0)
    arrays = {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f64": rng.standard_normal(5),
        "i64": np.arange(7, dtype=np.int64),
        "u8": np.frombuffer(b"rng-state", np.uint8),
        "empty": np.zeros((0, 3), np.float32),
        "flag": np.array([True, False]),
        "scalar": np.array(2.5, np.float32),
    }
    meta = {"round": 3, "history": [{"val": 0.5, "loss": float("nan")}], "best": [-1.0, float("inf")]}
    return Checkpoint("test.kind", meta, arrays)


def _same(a: Checkpoint, b: Checkpoint) -> bool:
    return (
        a.kind == b.kind
        and json.dumps(a.meta) == json.dumps(b.meta)
        and list(a.arrays) == list(b.arrays)
        and all(
            x.dtype == b.arrays[k].dtype
            and x.shape == b.arrays[k].shape
            and x.tobytes() == b.arrays[k].tobytes()
            for k, x in a.arrays.items()
        )
    )


def test_round_trip_is_exact_and_leaves_no_temporary_file(tmp_path):
    path = save_checkpoint(tmp_path / "a.ckpt", _sample())
    got = load_checkpoint(path, kind="test.kind")
    assert _same(got, _sample())
    assert os.listdir(tmp_path) == ["a.ckpt"]
    with pytest.raises(CheckpointMismatchError):
        load_checkpoint(path, kind="other")


def test_bytes_are_the_documented_layout_for_any_input_array():
    """Head, manifest, each array's little-endian C-order bytes back to back, then the digest (SHA-256,
    or HMAC-SHA256 under the bound key) over everything before it: what the module docstring says,
    built here by hand, for transposed, strided and big-endian inputs too."""
    import hashlib
    import hmac

    from fedgat.checkpoint import bound_key

    sample = _sample()
    arrays = {
        **sample.arrays,
        "transposed": np.arange(12, dtype=np.int32).reshape(3, 4).T,
        "strided": np.arange(20.0)[::3],
        "big_endian": np.arange(6, dtype=">u2").reshape(2, 3),
    }
    ckpt = Checkpoint(sample.kind, sample.meta, arrays)
    for key, binding, mac in ((None, None, "sha256"), (b"k" * 32, {"party": 3}, "hmac-sha256-bound")):
        data = encode_checkpoint(ckpt, key, binding=binding)
        plain = [a.astype(a.dtype.newbyteorder("<"), order="C") for a in arrays.values()]
        offsets = np.cumsum([0] + [a.nbytes for a in plain])
        entries = [
            {"name": n, "dtype": a.dtype.name, "shape": list(a.shape), "offset": int(o), "nbytes": a.nbytes}
            for (n, a), o in zip(zip(arrays, plain), offsets)
        ]
        manifest = {"kind": ckpt.kind, "mac": mac, "meta": ckpt.meta, "arrays": entries}
        text = json.dumps(manifest, allow_nan=True, separators=(",", ":")).encode()
        body = (
            struct.pack(">8sIQ", MAGIC, FORMAT_VERSION, len(text))
            + text
            + b"".join(a.tobytes() for a in plain)
        )
        digest = (
            hashlib.sha256(body).digest()
            if key is None
            else hmac.new(bound_key(key, binding), body, hashlib.sha256).digest()
        )
        assert data == body + digest
        back = decode_checkpoint(data, key, binding=binding)
        assert all(np.array_equal(back.arrays[n], a) for n, a in arrays.items())


def test_object_arrays_cannot_be_saved(tmp_path):
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path / "x.ckpt", Checkpoint("k", {}, {"o": np.array([object()])}))
    assert not any(tmp_path.iterdir())


def test_a_failed_write_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "a.ckpt", _sample())
    before = path.read_bytes()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        save_checkpoint(path, Checkpoint("test.kind", {"round": 4}))
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["a.ckpt"]


def _mutations(data: bytes) -> list[tuple[str, bytes]]:
    """Every truncation point and a bit flip in every byte (bit varying with the position)."""
    cases = [(f"cut{n}", data[:n]) for n in range(len(data))]
    for pos in range(len(data)):
        flipped = bytearray(data)
        flipped[pos] ^= 1 << (pos % 8)
        cases.append((f"flip{pos}", bytes(flipped)))
    return cases


def test_every_truncation_and_bit_flip_is_detected():
    small = Checkpoint("k", {"round": 1}, {"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
    data = encode_checkpoint(small)
    cases = _mutations(data)
    assert len(cases) == 2 * len(data)
    for name, bad in cases:
        with pytest.raises(CheckpointError):
            decode_checkpoint(bad)
        with pytest.raises(CheckpointError):
            decode_checkpoint(bad + b"\0")  # trailing bytes too
    assert _same(decode_checkpoint(data), small)


def _reseal(body: bytes) -> bytes:
    import hashlib

    return body + hashlib.sha256(body).digest()


def _forge(manifest: dict, payload: bytes = b"", version: int = FORMAT_VERSION) -> bytes:
    text = json.dumps(manifest).encode()
    return _reseal(struct.pack(">8sIQ", MAGIC, version, len(text)) + text + payload)


def test_structural_checks_behind_a_valid_digest():
    entry = {"name": "w", "dtype": "float32", "shape": [2], "offset": 0, "nbytes": 8}
    good = {"kind": "k", "mac": "sha256", "meta": {}, "arrays": [entry]}
    assert decode_checkpoint(_forge(good, bytes(8))).arrays["w"].shape == (2,)
    F, I = CheckpointFormatError, CheckpointIntegrityError
    bad_cases = [
        (_forge(good, bytes(8), version=FORMAT_VERSION + 1), F),  # another format version
        (
            _forge({**good, "arrays": [{**entry, "dtype": "object"}]}, bytes(8)),
            F,
        ),  # object dtype: never loaded
        (_forge({**good, "arrays": [{**entry, "dtype": "|O"}]}, bytes(8)), F),
        (_forge({**good, "arrays": [{**entry, "shape": [3]}]}, bytes(8)), F),  # size mismatch
        (_forge({**good, "arrays": [{**entry, "offset": 4}]}, bytes(8)), F),  # gap
        (_forge({**good, "arrays": [entry, entry]}, bytes(16)), F),  # duplicate name
        (_forge({**good, "arrays": [{**entry, "name": "a b"}]}, bytes(8)), F),  # odd name
        (_forge(good, bytes(12)), F),  # payload bytes that belong to no array
        (_forge({"kind": "k"}, b""), F),  # incomplete manifest
        (_forge({**good, "mac": "hmac-sha256"}, bytes(8)), I),  # claims an HMAC, checked without a key
        (_reseal(struct.pack(">8sIQ", MAGIC, FORMAT_VERSION, 3) + b"{x]"), F),  # not JSON
        (_reseal(struct.pack(">8sIQ", b"NOTCKPT!", FORMAT_VERSION, 2) + b"{}"), F),  # bad magic
    ]
    for data, error in bad_cases:
        with pytest.raises(error):
            decode_checkpoint(data)


def test_hmac_detects_a_resealed_forgery(tmp_path):
    key = b"k" * 32
    path = save_checkpoint(tmp_path / "a.ckpt", _sample(), hmac_key=key)
    assert _same(load_checkpoint(path, hmac_key=key), _sample())
    with pytest.raises(CheckpointIntegrityError):
        load_checkpoint(path, hmac_key=b"other" * 8)
    with pytest.raises(CheckpointIntegrityError):
        load_checkpoint(path)  # an HMAC is not a plain digest
    # an attacker rewrites the meta and recomputes SHA-256: only the HMAC catches it
    plain = save_checkpoint(tmp_path / "b.ckpt", Checkpoint("k", {"round": 1}))
    forged = _forge({"kind": "k", "mac": "sha256", "meta": {"round": 99}, "arrays": []})
    plain.write_bytes(forged)
    assert load_checkpoint(plain).meta["round"] == 99  # SHA-256 alone: corruption, not tampering
    keyed = save_checkpoint(tmp_path / "c.ckpt", Checkpoint("k", {"round": 1}), hmac_key=key)
    keyed.write_bytes(forged)
    with pytest.raises(CheckpointIntegrityError):
        load_checkpoint(keyed, hmac_key=key)


def test_missing_or_oversized_files(tmp_path):
    with pytest.raises(CheckpointFormatError):
        load_checkpoint(tmp_path / "nope.ckpt")
    path = save_checkpoint(tmp_path / "a.ckpt", _sample())
    with pytest.raises(CheckpointFormatError):
        load_checkpoint(path, max_bytes=100)


def test_optimizer_state_resumes_exactly():
    torch.manual_seed(0)
    x, y = torch.randn(16, 5), torch.randn(16, 2)

    def make():
        torch.manual_seed(1)
        model = torch.nn.Linear(5, 2)
        return model, torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)

    def steps(model, opt, n):
        for _ in range(n):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    model, opt = make()
    steps(model, opt, 3)
    meta, arrays = optimizer_to_checkpoint(opt)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    data = encode_checkpoint(Checkpoint("opt", {"opt": meta}, arrays))
    steps(model, opt, 4)
    model2, opt2 = make()
    model2.load_state_dict(weights)
    ck = decode_checkpoint(data)
    optimizer_from_checkpoint(opt2, ck.meta["opt"], ck.arrays)
    steps(model2, opt2, 4)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))


def test_encodings_round_trip(small_graph):
    from fedgat.encodings import encode
    from fedgat.partition import make_partition

    nbh = make_partition(small_graph, 2, 1.0, 0, num_layers=2).neighbourhoods
    for variant in ("vector", "matrix"):
        enc = encode(variant, small_graph.x.double(), nbh, np.arange(40), rng=3)
        enc = enc.compact(1e-9) if variant == "matrix" else enc
        meta, arrays = encodings_to_checkpoint(enc)
        ck = decode_checkpoint(encode_checkpoint(Checkpoint("enc", meta, arrays)))
        got = encodings_from_checkpoint(ck.meta, ck.arrays)
        assert got.variant == enc.variant and np.array_equal(got.nodes, enc.nodes)
        for a, b in zip(got.buckets, enc.buckets):
            assert np.array_equal(a.bases.p, b.bases.p) and np.array_equal(
                a.bases.neighbours, b.bases.neighbours
            )
            assert torch.equal(a.K2, b.K2) and torch.equal(a.h_self, b.h_self)
            assert (a.M2 is None) == (b.M2 is None) and (a.M2 is None or torch.equal(a.M2, b.M2))
            assert (a.cols is None) == (b.cols is None) and (a.cols is None or torch.equal(a.cols, b.cols))


def test_store_keeps_the_latest_labels(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for label in (1, 2, 3):
        store.save(7, label, Checkpoint("k", {"label": label}))
    assert store.labels(7) == [2, 3]
    assert store.load(7).meta["label"] == 3 and store.load(7, 2).meta["label"] == 2
    with pytest.raises(CheckpointFormatError):
        store.load(8)
    path = store.path(7, 3)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x20
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointIntegrityError):
        store.load(7)
    with pytest.raises(ValueError):
        CheckpointStore(tmp_path, keep=1)


def test_keyed_store_binds_each_file_to_its_party_and_label(tmp_path):
    """An old checkpoint copied over a newer label, or to another party, is refused."""
    import shutil

    store = CheckpointStore(tmp_path, hmac_key=b"deployment key", keep=3)
    for label in (1, 2):
        store.save(7, label, Checkpoint("k", {"label": label}))
    store.save(8, 2, Checkpoint("k", {"label": 2}))
    assert store.load(7).meta["label"] == 2 and store.load(7, 1).meta["label"] == 1
    shutil.copyfile(store.path(7, 1), store.path(7, 2))  # replay label 1 as the latest
    with pytest.raises(CheckpointIntegrityError, match="another place"):
        store.load(7)
    shutil.copyfile(store.path(7, 1), store.path(7, 5))  # ... or as a new label
    with pytest.raises(CheckpointIntegrityError):
        store.load(7, 5)
    shutil.copyfile(store.path(7, 1), store.path(8, 1))  # ... or as another party's
    with pytest.raises(CheckpointIntegrityError):
        store.load(8, 1)
    assert store.load(8, 2).meta["label"] == 2
    # a bound file is not an unbound one (and vice versa), and the kind is authenticated
    bound = store.path(7, 1).read_bytes()
    with pytest.raises(CheckpointIntegrityError):
        decode_checkpoint(bound, b"deployment key")
    assert decode_checkpoint(bound, b"deployment key", binding={"party": 7, "label": 1}).meta == {"label": 1}
    with pytest.raises(CheckpointMismatchError):
        store.load(7, 1, kind="other")
    with pytest.raises(ValueError):
        encode_checkpoint(Checkpoint("k", {}), binding={"party": 1})  # binding without a key


def test_unkeyed_store_and_unbound_encoding_are_unchanged(tmp_path):
    key = b"k" * 32
    data = encode_checkpoint(_sample(), key)
    assert data[-32:] == __import__("hmac").new(key, data[:-32], "sha256").digest()
    assert _same(decode_checkpoint(data, key), _sample())
    store = CheckpointStore(tmp_path)
    store.save(1, 3, _sample())
    assert _same(decode_checkpoint(store.path(1, 3).read_bytes()), _sample())
