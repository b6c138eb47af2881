"""The variant objects (fedgat.variants): lookup, and their sizes against what encode() builds."""

import pickle

import numpy as np
import pytest
import torch

from fedgat.encodings import VARIANTS, BucketBases, Encodings, draw_bases, encode, encoding_size
from fedgat.randomness import RandomSource
from fedgat.variants import MATRIX, VECTOR, Variant, as_variant

from graph_helpers import random_csr, unit_rows


@pytest.fixture(scope="module")
def setting():
    return random_csr(30, 6, seed=11), unit_rows(30, 9, seed=12)


def test_lookup_by_name_and_object():
    assert VARIANTS == ("matrix", "vector")
    assert as_variant("matrix") is MATRIX and as_variant("vector") is VECTOR
    assert as_variant(MATRIX) is MATRIX
    assert [as_variant(name).name for name in VARIANTS] == list(VARIANTS)
    assert isinstance(MATRIX, Variant) and repr(VECTOR) == "<FedGAT variant 'vector'>"
    assert pickle.loads(pickle.dumps(MATRIX)) is MATRIX  # singletons survive pickling (worker processes)


@pytest.mark.parametrize("bad", ["tensor", "Vector", "", None, 2])
def test_unknown_name_lists_the_choices(bad):
    with pytest.raises(ValueError, match=r"unknown FedGAT variant .*; choose one of \('matrix', 'vector'\)"):
        as_variant(bad)


def test_per_variant_attributes():
    assert (MATRIX.has_q, MATRIX.has_m2, MATRIX.pad_power) == (True, True, 2)
    assert (VECTOR.has_q, VECTOR.has_m2, VECTOR.pad_power) == (False, False, 1)
    assert MATRIX.default_neighbour_cap == 16 and VECTOR.default_neighbour_cap is None
    assert (MATRIX.recovery_attack, VECTOR.recovery_attack) == ("spectral", "basis")
    n = np.arange(1, 6)
    np.testing.assert_array_equal(MATRIX.m(n, embed_factor=3), 2 * n)  # embed_factor is the vector's
    np.testing.assert_array_equal(VECTOR.m(n, embed_factor=3), 3 * n)
    assert VECTOR.computed_rows(4, 2, ship_m2=True) == VECTOR.computed_rows(4, 2) == 8  # nothing to ship
    assert MATRIX.computed_rows(4) == 8 and MATRIX.computed_rows(4, ship_m2=True) == 8 + 64
    assert MATRIX.held_rows(4) == 1 + 8 + 64 and VECTOR.held_rows(4) == 1 + 4
    with pytest.raises(ValueError, match="matrix variant only"):
        VECTOR.m2_map(np.zeros((1, 2, 2)), None)


@pytest.mark.parametrize(("name", "embed_factor"), [("matrix", 1), ("vector", 1), ("vector", 2)])
def test_sizes_match_the_encodings_encode_builds(setting, name, embed_factor):
    csr, x = setting
    kind = as_variant(name)
    enc = encode(name, x, csr, rng=3, embed_factor=embed_factor)
    assert enc.variant == name and enc.kind is kind
    bases_bytes = 0
    for bucket in enc.buckets:
        b = bucket.bases
        B, n, d = len(b), b.n, x.shape[1]
        m = kind.m(n, embed_factor)
        assert b.kind is kind and bucket.kind is kind
        assert b.p.shape == (B, m, n) and (b.q is not None) == kind.has_q
        assert b.q is None or b.q.shape == b.p.shape
        bases_bytes += b.p.nbytes + (0 if b.q is None else b.q.nbytes)
        assert b.coefficients().shape == (B, b.num_feature_rows(), n)
        assert bucket.features.shape == (B, 1 + kind.computed_rows(n, embed_factor), d)
        assert bucket.features.shape[1] == 1 + kind.computed_rows(n, embed_factor, ship_m2=False)
        assert sum(t[0].numel() for t in bucket.plain.values()) == kind.plain_reals(m, n)
        if kind.has_m2:
            M2 = bucket.dense_M2()
            assert M2.shape == (B, m * m, d) and b.m2_map().shape == (B, m * m, m)
            assert 1 + m + M2.shape[1] == kind.held_rows(n) == 1 + kind.computed_rows(n, ship_m2=True)
            assert M2[0].numel() == kind.derived_reals(m, d)
        else:
            assert kind.held_rows(n, embed_factor) == 1 + m and kind.derived_reals(m, d) == 0
            with pytest.raises(ValueError, match="matrix variant only"):
                bucket.dense_M2()
    sizes = csr.degrees()
    assert kind.bases_bytes(sizes, embed_factor) == bases_bytes
    size = encoding_size(kind, sizes, x.shape[1], embed_factor)
    assert size == encoding_size(name, sizes, x.shape[1], embed_factor)
    assert size["total_reals"] == enc.num_reals()
    derived = sum(b.dense_M2().numel() for b in enc.buckets) if kind.has_m2 else 0
    assert size["derived_reals"] == derived


@pytest.mark.parametrize("name", VARIANTS)
def test_draw_is_what_draw_bases_uses(setting, name):
    """Same seed, same bases: draw_bases draws bucket by bucket (ascending n) with the variant's draw."""
    csr = setting[0]
    kind = as_variant(name)
    buckets = draw_bases(name, csr, np.arange(csr.num_nodes), RandomSource.from_seed(4))
    rng = RandomSource.from_seed(4)
    for b in buckets:
        p, q = kind.draw(rng, len(b), b.n)
        np.testing.assert_array_equal(p, b.p)
        assert (q is None and b.q is None) or np.array_equal(q, b.q)


def test_a_variant_object_is_accepted_where_a_name_is(setting):
    csr, x = setting
    for kind in (MATRIX, VECTOR):
        by_name, by_object = encode(kind.name, x, csr, rng=5), encode(kind, x, csr, rng=5)
        assert by_object.variant == kind.name  # stored (and checkpointed, shipped) by name
        for a, b in zip(by_name.buckets, by_object.buckets, strict=True):
            torch.testing.assert_close(a.features, b.features, rtol=0, atol=0)
        b0 = by_object.buckets[0].bases
        assert BucketBases(kind, b0.rows, b0.nodes, b0.neighbours, b0.p, b0.q).variant == kind.name
        assert Encodings(kind, by_object.nodes, by_object.buckets).variant == kind.name
    with pytest.raises(ValueError, match="choose one of"):
        Encodings("tensor", np.zeros(0, np.int64), [])


def test_take_keeps_q_where_the_variant_has_it(setting):
    csr = setting[0]
    for name in VARIANTS:
        b = draw_bases(name, csr, np.arange(csr.num_nodes), rng=6)[-1]
        idx = np.array([len(b) - 1, 0])
        sub = b.take(idx, rows=np.array([7, 8]))
        np.testing.assert_array_equal(sub.rows, [7, 8])
        np.testing.assert_array_equal(sub.nodes, b.nodes[idx])
        np.testing.assert_array_equal(sub.p, b.p[idx])
        assert (sub.q is None) == (b.q is None) and (sub.q is None or np.array_equal(sub.q, b.q[idx]))
