"""Encodings against direct sums: E^(k) = sum_j x_ij^k h_j, F^(k) = sum_j x_ij^k (paper eq. 9-14)."""

import numpy as np
import pytest
import torch

from fedgat.encodings import draw_bases, encode, encoding_size
from fedgat.randomness import RandomSource

from graph_helpers import random_csr, unit_rows


@pytest.fixture(scope="module")
def setting():
    csr = random_csr(40, 7, seed=1)
    x = unit_rows(40, 12, seed=2)
    b1, b2 = torch.randn(12, dtype=torch.float64), torch.randn(12, dtype=torch.float64)
    return csr, x, b1, b2


def direct_sums(csr, x, b1, b2, i, k):
    nbrs = torch.from_numpy(csr.row(i))
    logits = x[i] @ b1 + x[nbrs] @ b2
    return (logits**k) @ x[nbrs], (logits**k).sum()


def test_matrix_identities_match_direct_sums(setting):
    csr, x, b1, b2 = setting
    enc = encode("matrix", x, csr, rng=3)
    checked = 0
    for bucket in enc.buckets:
        plain = bucket.plain
        P, K1, K3 = plain["P"], plain["K1"], plain["K3"]
        # D_i = sum_s b1(s) M1(s) + b2(s) M2(s),  M1(s) = h_i(s) P
        D = (bucket.h_self @ b1)[:, None, None] * P + (bucket.dense_M2() @ b2).reshape(P.shape)
        for slot, node in enumerate(bucket.bases.nodes):
            power = P[slot]  # D^0 := P_i (not I): see NOTES on the constant term
            for k in range(6):
                E, F = direct_sums(csr, x, b1, b2, int(node), k)
                torch.testing.assert_close(K1[slot] @ power @ bucket.K2[slot], E, rtol=1e-9, atol=1e-9)
                torch.testing.assert_close(K1[slot] @ power @ K3[slot], F, rtol=1e-9, atol=1e-9)
                if k >= 1:  # tr U_j = 1, so tr D^k = F^(k) for k >= 1 only
                    torch.testing.assert_close(torch.trace(power), F, rtol=1e-9, atol=1e-9)
                power = power @ D[slot]
            checked += 1
    assert checked == csr.num_nodes


def test_projector_structure(setting):
    csr = setting[0]
    for bases in draw_bases("matrix", csr, np.arange(csr.num_nodes), rng=4):
        U = 0.5 * np.einsum("bxj,byj->bjxy", bases.p, bases.q)  # (B, n, m, m)
        gram = np.einsum("bjxy,bkyz->bjkxz", U, U)
        eye = np.eye(bases.n)[None, :, :, None, None]
        np.testing.assert_allclose(gram, eye * U[:, :, None], atol=1e-12)  # U_j U_k = delta_jk U_j
        np.testing.assert_allclose(np.trace(U, axis1=2, axis2=3), 1.0, atol=1e-12)
        assert bases.m == 2 * bases.n


def test_vector_identities_match_direct_sums(setting):
    csr, x, b1, b2 = setting
    enc = encode("vector", x, csr, rng=5)
    for bucket in enc.buckets:
        Q = bucket.plain["Q"]
        np.testing.assert_allclose(
            Q.transpose(1, 2) @ Q,
            np.broadcast_to(np.eye(bucket.bases.n), (len(Q),) + (bucket.bases.n,) * 2),
            atol=1e-12,
        )
        logits = torch.einsum("bmn,bmd,d->bn", Q, bucket.K2, b2) + (bucket.h_self @ b1)[:, None]
        for slot, node in enumerate(bucket.bases.nodes):
            for k in range(5):
                E, F = direct_sums(csr, x, b1, b2, int(node), k)
                weights = Q[slot] @ logits[slot] ** k
                torch.testing.assert_close(weights @ bucket.K2[slot], E, rtol=1e-9, atol=1e-9)
                torch.testing.assert_close((logits[slot] ** k).sum(), F, rtol=1e-9, atol=1e-9)


def test_rows_cover_nodes_once_and_sizes(setting):
    csr, x, _, _ = setting
    nodes = np.array([5, 3, 17, 0, 39])
    for variant in ("matrix", "vector"):
        enc = encode(variant, x, csr, nodes=nodes, rng=6)
        rows = np.sort(np.concatenate([b.bases.rows for b in enc.buckets]))
        np.testing.assert_array_equal(rows, np.arange(len(nodes)))
        for b in enc.buckets:
            np.testing.assert_array_equal(b.bases.nodes, nodes[b.bases.rows])
            assert b.bases.neighbours.shape[1] == b.bases.n
        size = encoding_size(variant, csr.degrees()[nodes], x.shape[1])
        assert size["total_reals"] == enc.num_reals()


def test_seeded_bases_reproducible_and_default_random(setting):
    csr, x, _, _ = setting
    # the largest neighbourhood's bucket: with n = 1 the random basis is +-1, a coin flip
    a = encode("vector", x, csr, rng=7).buckets[-1].features
    b = encode("vector", x, csr, rng=7).buckets[-1].features
    c = encode("vector", x, csr, rng=None).buckets[-1].features
    assert a.shape[1] > 2  # m = n > 1 rows beside h_i
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, c)


def test_random_source_distribution():
    rs = RandomSource.from_seed(0)
    z = rs.normal(200_000)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    u = rs.uniform(100_000)
    assert 0 < u.min() and u.max() < 1
    with pytest.raises(ValueError):
        RandomSource(b"short")


def test_bad_variant_rejected(setting):
    csr, x, _, _ = setting
    with pytest.raises(ValueError, match="variant"):
        encode("tensor", x, csr)


def test_m2_is_a_feature_free_map_of_k2(setting):
    """M2 = L K2 with L built from the random bases alone: M2 tells whoever holds K2 and the bases
    nothing more (SECURITY.md), so it is derived by the client rather than computed and shipped."""
    csr, x, _, _ = setting
    x = x.double()
    enc = encode("matrix", x, csr, rng=5)
    others = encode("matrix", torch.randn_like(x), csr, rng=5).buckets
    for bucket, other in zip(enc.buckets, others):
        b = bucket.bases
        H = x[torch.from_numpy(b.neighbours)]  # (B, n, d)
        U = 0.5 * torch.einsum("bxj,byj->bjxy", torch.from_numpy(b.p), torch.from_numpy(b.q))
        direct = torch.einsum("bjxy,bjs->bxys", U, H).reshape(len(b), -1, x.shape[1])  # sum_j h_j(s) U_j
        assert bucket.M2 is None  # left to be derived
        torch.testing.assert_close(bucket.dense_M2(), direct)
        assert bucket.features.shape[1] == b.num_feature_rows() == 1 + b.m  # M2 is not a computed row
        np.testing.assert_array_equal(other.bases.m2_map(), b.m2_map())  # same bases, other features


def test_selected_nodes_share_one_buffer_so_flat_rows_are_views():
    """``select_nodes`` packs every bucket's rows into one buffer (in the requested dtype):
    ``flat_K2``/``flat_h_self`` are then views of it, equal to concatenating the buckets' rows."""
    from fedgat.encodings import flat_rows
    from fedgat.tasks import select_nodes

    csr = random_csr(50, 6, seed=4)
    x = unit_rows(50, 9, seed=5).double()
    enc = encode("vector", x, csr, rng=2)
    positions = np.arange(0, 50, 3)
    chosen = select_nodes(enc, positions, torch.float32)
    assert len(chosen.buckets) > 1 and all(b.K2.dtype == torch.float32 for b in chosen.buckets)
    flat = chosen.flat_K2
    assert flat.untyped_storage().data_ptr() == chosen.buckets[0].K2.untyped_storage().data_ptr()
    assert torch.equal(flat, torch.cat([b.K2.reshape(-1, 9) for b in chosen.buckets]))
    assert torch.equal(chosen.flat_h_self, torch.cat([b.h_self for b in chosen.buckets]))
    for b in chosen.buckets:  # the rows of the selected nodes, cast
        src = next(s for s in enc.buckets if s.bases.n == b.bases.n)
        keep = np.flatnonzero(np.isin(src.bases.nodes, b.bases.nodes))
        assert torch.equal(b.K2, src.K2[torch.from_numpy(keep)].float())
    # tensors that are not laid out one after another are concatenated
    parts = [torch.ones(2, 3), torch.zeros(1, 3)]
    assert torch.equal(flat_rows(parts), torch.cat(parts))
    base = torch.arange(12.0).view(4, 3)
    assert torch.equal(flat_rows([base[2:], base[:2]]), torch.cat([base[2:], base[:2]]))
    view = flat_rows([base[:1], base[1:3]])
    assert view.data_ptr() == base.data_ptr() and torch.equal(view, base[:3])
