"""fedgat.checkpoint.save_encodings / load_encodings: a run's decrypted encodings kept in one file,
back exactly (training from them matches training from the originals), and every damaged, foreign or
malformed file refused with a typed error before anything is returned."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedgat.checkpoint import (
    ENCODINGS_KIND,
    Checkpoint,
    CheckpointFormatError,
    CheckpointIntegrityError,
    CheckpointMismatchError,
    encodings_to_checkpoint,
    load_encodings,
    save_checkpoint,
    save_encodings,
)
from fedgat.encodings import Encodings
from fedgat.partition import make_partition
from fedgat.pipeline import run_plaintext_pretraining, train_fedgat


@pytest.fixture(scope="module")
def run(small_graph):
    partition = make_partition(small_graph, 3, 1.0, 0, num_layers=2)
    return partition, run_plaintext_pretraining(small_graph, partition, "vector", 0, out_dtype=torch.float32)


def _same(a: Encodings, b: Encodings) -> bool:
    ta, tb = a.tensors(), b.tensors()
    bases = all(
        np.array_equal(getattr(x.bases, k), getattr(y.bases, k))
        for x, y in zip(a.buckets, b.buckets, strict=True)
        for k in ("rows", "nodes", "neighbours", "p", "q")
        if getattr(x.bases, k) is not None or getattr(y.bases, k) is not None
    )
    return (
        a.variant == b.variant
        and np.array_equal(a.nodes, b.nodes)
        and ta.keys() == tb.keys()
        and all(torch.equal(ta[k], tb[k]) and ta[k].dtype == tb[k].dtype for k in ta)
        and bases
    )


def test_a_runs_encodings_come_back_exactly_and_train_the_same(small_graph, run, tmp_path):
    partition, encodings = run
    path = save_encodings(tmp_path / "enc.ckpt", encodings)
    loaded = load_encodings(path)
    assert sorted(loaded) == sorted(encodings) == [0, 1, 2]
    assert all(_same(loaded[c], encodings[c]) for c in encodings)
    kwargs = {"seed": 0, "rounds": 3, "progress": False}
    want = train_fedgat(small_graph, partition, encodings, **kwargs)
    got = train_fedgat(small_graph, partition, loaded, **kwargs)
    assert got.fit.test_accuracy == want.fit.test_accuracy
    assert all(torch.equal(got.fit.model_state[k], v) for k, v in want.fit.model_state.items())
    # another partition's training refuses them (they cover other nodes)
    other = make_partition(small_graph, 3, 1.0, 1, num_layers=2)
    with pytest.raises(ValueError, match="encodings"):
        train_fedgat(small_graph, other, loaded, **kwargs)


@pytest.mark.parametrize("form", ["matrix", "matrix compacted", "float64", "empty client"])
def test_every_layout_round_trips(small_graph, tmp_path, form):
    from fedgat.encodings import encode

    nbh = make_partition(small_graph, 2, 1.0, 0, num_layers=2).neighbourhoods
    x = small_graph.x.double() if form == "float64" else small_graph.x
    enc = encode("vector" if form == "float64" else "matrix", x, nbh, np.arange(40), rng=3)
    if form == "matrix compacted":
        enc = enc.with_dense_M2().compact(1e-9)
        assert enc.compacted
    run = {3: enc}
    if form == "empty client":  # a client that owns no node holds empty encodings
        run[0] = Encodings("matrix", np.zeros(0, np.int64), [])
    loaded = load_encodings(save_encodings(tmp_path / "enc.ckpt", run))
    assert sorted(loaded) == sorted(run) and all(_same(loaded[c], run[c]) for c in run)


def test_with_a_key_only_the_keys_holder_writes_a_file_that_loads(run, tmp_path):
    _, encodings = run
    path = save_encodings(tmp_path / "enc.ckpt", encodings, hmac_key=b"k" * 32)
    assert sorted(load_encodings(path, hmac_key=b"k" * 32)) == [0, 1, 2]
    for key in (None, b"x" * 32):
        with pytest.raises(CheckpointIntegrityError):
            load_encodings(path, hmac_key=key)


def test_a_damaged_or_foreign_file_is_refused(run, tmp_path):
    _, encodings = run
    path = save_encodings(tmp_path / "enc.ckpt", encodings)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    (tmp_path / "flipped.ckpt").write_bytes(bytes(data))
    with pytest.raises(CheckpointIntegrityError):
        load_encodings(tmp_path / "flipped.ckpt")
    (tmp_path / "short.ckpt").write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointIntegrityError):  # the digest is then read from inside the arrays
        load_encodings(tmp_path / "short.ckpt")
    save_checkpoint(tmp_path / "other.ckpt", Checkpoint("fedgat.party", {}, {}))
    with pytest.raises(CheckpointMismatchError, match=ENCODINGS_KIND):
        load_encodings(tmp_path / "other.ckpt")
    torch.save(encodings, tmp_path / "pickled.pt")  # what the function replaces: refused, never unpickled
    with pytest.raises(CheckpointFormatError):
        load_encodings(tmp_path / "pickled.pt")
    with pytest.raises(CheckpointFormatError, match="cannot read"):
        load_encodings(tmp_path / "missing.ckpt")


def _resealed(tmp_path, encodings: Encodings, edit, meta_edit=None):
    """A file of the right kind and a valid digest whose content ``edit`` (arrays) or ``meta_edit``
    has broken: what a writer of its own files could produce."""
    meta, arrays = encodings_to_checkpoint(encodings, prefix="c0/")
    edit(arrays)
    full = {"clients": [0], "layouts": {"0": meta}}
    if meta_edit is not None:
        meta_edit(full)
    return save_checkpoint(tmp_path / "bad.ckpt", Checkpoint(ENCODINGS_KIND, full, arrays))


def _set(name, value):
    return lambda arrays: arrays.__setitem__(name, value(arrays[name]))


@pytest.mark.parametrize(
    ("edit", "meta_edit", "says"),
    [
        (_set("c0/0/K2", lambda a: a[:, :-1]), None, "K2"),
        (_set("c0/0/h_self", lambda a: a.astype(np.float64)), None, "mix dtypes"),
        (_set("c0/0/rows", lambda a: np.zeros_like(a)), None, "not those its rows name"),
        (_set("c0/1/neighbours", lambda a: a[:, ::-1].copy()), None, "first in their neighbours"),
        (_set("c0/0/p", lambda a: a.astype(np.int64)), None, "float32 or float64 array"),
        (_set("c0/nodes", lambda a: a.astype(np.float64)), None, "integer"),
        (lambda arrays: arrays.pop("c0/0/K2"), None, "lacks c0/0/K2"),
        (lambda arrays: None, lambda m: m.update(clients=["0"]), "client id"),
        (lambda arrays: None, lambda m: m.update(clients=[0, 0]), "malformed"),
        (lambda arrays: None, lambda m: m.update(info=[1]), "malformed"),
        (lambda arrays: None, lambda m: m["layouts"]["0"].update(variant="neither"), "neither"),
    ],
)
def test_a_resealed_file_with_a_broken_layout_is_refused(run, tmp_path, edit, meta_edit, says):
    _, encodings = run
    path = _resealed(tmp_path, encodings[1], edit, meta_edit)
    with pytest.raises(CheckpointFormatError, match=says):
        load_encodings(path)


def _matrix_run(small_graph):
    from fedgat.encodings import encode

    nbh = make_partition(small_graph, 2, 1.0, 0, num_layers=2).neighbourhoods
    return encode("matrix", small_graph.x, nbh, np.arange(40), rng=3)


def _widened_m(arrays):
    """A matrix bucket whose m is far above 2n: what would make training allocate O(m^3)."""
    p = arrays["c0/1/p"]
    B, _, n = p.shape
    for key in ("p", "q"):
        arrays[f"c0/1/{key}"] = np.zeros((B, 40 * n, n))
    arrays["c0/1/K2"] = np.zeros((B, 40 * n, arrays["c0/1/K2"].shape[2]), np.float32)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (_widened_m, "the matrix variant's m is 2n"),
        (_set("c0/1/p", lambda a: a.astype(np.float16)), "float32 or float64 array"),
        (_set("c0/1/K2", lambda a: np.where(a == a.max(), np.nan, a)), "K2 holds a value that is not finite"),
        (_set("c0/1/q", lambda a: np.full_like(a, np.inf)), "q holds a value that is not finite"),
        (_set("c0/1/h_self", lambda a: a[:, :0]), "d >= 1"),
    ],
)
def test_a_resealed_file_that_would_fail_or_balloon_in_training_is_refused(small_graph, tmp_path, edit, says):
    path = _resealed(tmp_path, _matrix_run(small_graph), edit)
    with pytest.raises(CheckpointFormatError, match=says):
        load_encodings(path)


def test_clients_of_different_feature_widths_are_refused(run, tmp_path):
    _, encodings = run
    meta0, arrays = encodings_to_checkpoint(encodings[0], prefix="c0/")
    meta1, more = encodings_to_checkpoint(encodings[1], prefix="c1/")
    for name in [k for k in more if k.endswith(("/h_self", "/K2"))]:
        more[name] = np.concatenate([more[name], more[name][..., :3]], axis=-1)
    meta = {"clients": [0, 1], "layouts": {"0": meta0, "1": meta1}, "info": {}}
    path = save_checkpoint(tmp_path / "w.ckpt", Checkpoint(ENCODINGS_KIND, meta, {**arrays, **more}))
    with pytest.raises(CheckpointFormatError, match="different feature widths"):
        load_encodings(path)


def _raw_checkpoint(manifest: str, payload: bytes = b"") -> bytes:
    """Checkpoint bytes around a hand-written manifest, with a valid SHA-256 (a forger's file)."""
    import hashlib
    import struct

    from fedgat.checkpoint import FORMAT_VERSION, MAGIC

    body = MAGIC + struct.pack(">I", FORMAT_VERSION) + struct.pack(">Q", len(manifest)) + manifest.encode()
    body += payload
    return body + hashlib.sha256(body).digest()


@pytest.mark.parametrize(
    ("manifest", "payload", "says"),
    [
        ("[" * 100_000 + "]" * 100_000, b"", "RecursionError"),
        (
            '{"kind": "k", "mac": "sha256", "meta": {"x": ' + "9" * 5000 + '}, "arrays": []}',
            b"",
            "unreadable",
        ),
        (
            (
                '{"kind": "fedgat.client_encodings", "mac": "sha256", "meta": {}, "arrays": [{"name": "a", '
                '"dtype": "uint8", "shape": [4], "offset": 0.0, "nbytes": 4.0}]}'
            ),
            b"abcd",
            "must be integers",
        ),
        (
            (
                '{"kind": "fedgat.client_encodings", "mac": "sha256", "meta": {}, "arrays": [{"name": "a", '
                '"dtype": "uint8", "shape": [0, 1000000000000000000000000000000], "offset": 0, "nbytes": 0}]}'
            ),
            b"",
            "bad shape",
        ),
    ],
)
def test_forged_manifests_raise_a_checkpoint_error(tmp_path, manifest, payload, says):
    path = tmp_path / "forged.ckpt"
    path.write_bytes(_raw_checkpoint(manifest, payload))
    with pytest.raises(CheckpointFormatError, match=says):
        load_encodings(path)


def test_a_mismatched_run_charges_no_ledger(small_graph, run, tmp_path):
    """Encodings of another split are refused before DP-FedAvg's ledgers are charged for the run."""
    from fedgat.pipeline import run_encrypted_fedgat

    _, encodings = run
    ledgers = tmp_path / "ledgers"
    dp = {"update_dp_epsilon": 8.0, "update_dp_budget": (100.0, 1e-5), "update_dp_ledger_dir": str(ledgers)}
    with pytest.raises(ValueError, match="client 0's encodings cover other nodes"):
        run_encrypted_fedgat(small_graph, 3, 1.0, 1, encodings=encodings, progress=False, rounds=1, **dp)
    assert not ledgers.exists() or not list(ledgers.iterdir())


def test_save_refuses_what_is_not_a_mapping_of_encodings(run, tmp_path):
    _, encodings = run
    for bad, says in (
        (encodings[0], "must map client id"),
        ({"0": encodings[0]}, "client ids"),
        ({-1: encodings[0]}, "client ids"),
        ({0: "encodings"}, "expected Encodings"),
    ):
        with pytest.raises(TypeError, match=says):
            save_encodings(tmp_path / "enc.ckpt", bad)
    with pytest.raises(ValueError, match="JSON values only"):
        save_encodings(tmp_path / "enc.ckpt", encodings, info={"path": tmp_path})
    assert not (tmp_path / "enc.ckpt").exists()


def test_a_run_from_saved_encodings_refuses_what_they_cannot_be(small_graph, run):
    from fedgat.pipeline import run_encrypted_fedgat

    _, encodings = run
    kwargs = {"progress": False, "rounds": 1}
    with pytest.raises(ValueError, match="DP release"):
        run_encrypted_fedgat(small_graph, 3, 1.0, 0, encodings=encodings, dp_epsilon=1.0, **kwargs)
    with pytest.raises(ValueError, match="vector encodings; this run trains variant='matrix'"):
        run_encrypted_fedgat(small_graph, 3, 1.0, 0, encodings=encodings, variant="matrix", **kwargs)
    with pytest.raises(TypeError, match="must map client id"):
        run_encrypted_fedgat(small_graph, 3, 1.0, 0, encodings=encodings[0], **kwargs)
    with pytest.raises(ValueError, match="encodings"):  # another seed's split
        run_encrypted_fedgat(small_graph, 3, 1.0, 1, encodings=encodings, **kwargs)
