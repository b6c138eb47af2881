"""Clenshaw for batches of matrices (fedgat.matrix_poly) and the matrix layer's padding plan."""

import itertools

import numpy as np
import pytest
import torch

from fedgat.approx import fit_score
from fedgat.encodings import plan_padded_groups
from fedgat.matrix_poly import BlockDiagonal, chebyshev_left, chebyshev_left_blocks


def _power_horner(D, k, power):
    r = torch.zeros_like(k)
    for c in reversed(power):
        r = (r[:, None, :] @ D).squeeze(1) + float(c) * k
    return r


def _diagonalisable(G, m, domain, seed, dtype=torch.float64):
    """A FedGAT-like ``D = sum_j x_j U_j`` (``U_j = p_j q_j^T / 2``, ratios in [0.5, 2], ``m = 2n``,
    logits inside the domain) and ``k = K1 = sum_j q_j / 2``."""
    g = torch.Generator().manual_seed(seed)
    n = m // 2
    u = torch.linalg.qr(torch.randn(G, m, m, generator=g, dtype=dtype)).Q
    ratio = torch.exp((torch.rand(G, 1, n, generator=g, dtype=dtype) * 2 - 1) * np.log(2))
    p, q = u[:, :, :n] + u[:, :, n:] / ratio, u[:, :, :n] + u[:, :, n:] * ratio
    x = (torch.rand(G, n, generator=g, dtype=dtype) * 2 - 1) * domain
    return 0.5 * torch.einsum("gaj,gj,gbj->gab", p, x, q), 0.5 * q.sum(-1)


@pytest.mark.parametrize("degree", [1, 2, 5, 16])
def test_clenshaw_equals_power_horner_in_float64(degree):
    score = fit_score(degree=degree)
    D, k = _diagonalisable(7, 6, score.domain, seed=degree)
    torch.testing.assert_close(
        chebyshev_left(D, k, score.cheb, score.domain),
        _power_horner(D, k, score.power),
        rtol=1e-10,
        atol=1e-10,
    )


def test_clenshaw_is_accurate_in_float32_where_power_horner_is_not():
    score = fit_score(degree=16)
    D, k = _diagonalisable(64, 8, score.domain, seed=3)
    exact = _power_horner(D, k, score.power)
    scale = exact.abs().max()
    clenshaw = chebyshev_left(D.float(), k.float(), score.cheb, score.domain).double()
    horner = _power_horner(D.float(), k.float(), score.power).double()
    assert (clenshaw - exact).abs().max() / scale < 1e-5
    assert (horner - exact).abs().max() > 10 * (clenshaw - exact).abs().max()


@pytest.mark.parametrize("degree", [1, 2, 3, 8])
def test_hand_written_backward_matches_autograd(degree):
    score = fit_score(degree=degree)
    D, k = _diagonalisable(3, 4, score.domain, seed=10 + degree)
    D.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda D: chebyshev_left(D, k, score.cheb, score.domain), (D,))
    g = torch.randn(3, 4, dtype=torch.float64)
    ours = torch.autograd.grad((chebyshev_left(D, k, score.cheb, score.domain) * g).sum(), D)[0]
    ref = torch.autograd.grad((_power_horner(D, k, score.power) * g).sum(), D)[0]
    torch.testing.assert_close(ours, ref)


def test_degree_zero_and_bad_shapes():
    D, k = torch.randn(2, 3, 3), torch.randn(2, 3)
    torch.testing.assert_close(chebyshev_left(D, k, np.array([2.5]), 4.0), 2.5 * k)
    with pytest.raises(ValueError, match="expected D"):
        chebyshev_left(D, torch.randn(2, 4), np.array([1.0, 2.0]), 4.0)
    with pytest.raises(ValueError, match="expected D"):
        chebyshev_left(torch.randn(2, 3, 4), k, np.array([1.0, 2.0]), 4.0)


def _blocks_case(segments, degree, seed):
    """Per segment ``D (count, m, m)`` and ``k (count, m)``, and their block-diagonal inputs."""
    score = fit_score(degree=degree)
    cases = [_diagonalisable(c, m, score.domain, seed=seed + i) for i, (c, m) in enumerate(segments)]
    return score, cases


@pytest.mark.parametrize("segments", [[(3, 2), (4, 4), (2, 6)], [(3, 3), (2, 4)]])  # 2x2 tiles; CSR
@pytest.mark.parametrize("chunk", [1, 20, 1 << 19])
@pytest.mark.parametrize("degree", [1, 2, 16])
def test_block_diagonal_clenshaw_matches_the_batched_one_with_gradients(segments, chunk, degree):
    pattern = BlockDiagonal(segments, chunk_values=chunk)
    assert pattern.tile == (2 if all(m % 2 == 0 for _, m in segments) else 1)
    assert sum(rows.stop - rows.start for rows, _, _ in pattern.chunks) == pattern.size
    score, cases = _blocks_case(segments, degree, seed=7 * degree + chunk)
    values = torch.cat([pattern.storage((D / score.domain).transpose(1, 2)).reshape(-1) for D, _ in cases])
    k = torch.cat([kk.reshape(-1) for _, kk in cases])
    values.requires_grad_(True)
    ours = chebyshev_left_blocks(values, pattern, k, score.cheb)
    ref = torch.cat([chebyshev_left(D, kk, score.cheb, score.domain).reshape(-1) for D, kk in cases])
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
    assert torch.autograd.gradcheck(lambda v: chebyshev_left_blocks(v, pattern, k, score.cheb), (values,))
    # and the gradient is that of the batched recurrence, mapped to storage order
    g = torch.randn(pattern.size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ours = torch.autograd.grad((chebyshev_left_blocks(values, pattern, k, score.cheb) * g).sum(), values)[0]
    Ds = [D.clone().requires_grad_(True) for D, _ in cases]
    out = torch.cat(
        [chebyshev_left(D, kk, score.cheb, score.domain).reshape(-1) for D, (_, kk) in zip(Ds, cases)]
    )
    grads = torch.autograd.grad((out * g).sum(), Ds)
    ref = torch.cat([pattern.storage(score.domain * gD.transpose(1, 2)).reshape(-1) for gD in grads])
    torch.testing.assert_close(ours, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("segments", [[(3, 2), (5, 6), (2, 4)], [(3, 3), (2, 5)]])
def test_transpose_values_transposes_every_block(dtype, segments):
    pattern = BlockDiagonal(segments)
    blocks = [torch.randn(c, m, m, dtype=dtype) for c, m in segments]
    values = torch.cat([pattern.storage(b).reshape(-1) for b in blocks])
    want = torch.cat([pattern.storage(b.transpose(1, 2)).reshape(-1) for b in blocks])
    assert torch.equal(pattern.transpose_values(values), want)
    dense = torch.block_diag(*[b for blk in blocks for b in blk])
    x = torch.randn(pattern.size, dtype=dtype)
    product = torch.cat([part.matrix(values[chunk]) @ x[rows] for rows, chunk, part in pattern.chunks])
    torch.testing.assert_close(product, dense @ x)


def test_block_diagonal_degree_zero_and_bad_shapes():
    pattern = BlockDiagonal([(2, 2)])
    k = torch.randn(4)
    torch.testing.assert_close(chebyshev_left_blocks(torch.randn(8), pattern, k, np.array([2.5])), 2.5 * k)
    with pytest.raises(ValueError, match="expected values"):
        chebyshev_left_blocks(torch.randn(7), pattern, k, np.array([1.0, 2.0]))


def _cost(groups, sizes, counts, call):
    return sum(sum(counts[a:b]) * sizes[b - 1] ** 2 + call for a, b in groups)


@pytest.mark.parametrize("seed", range(6))
def test_padding_plan_is_an_optimal_cover(seed):
    rng = np.random.default_rng(seed)
    sizes = sorted(rng.choice(np.arange(2, 40, 2), size=7, replace=False).tolist())
    counts = rng.integers(1, 500, size=7).tolist()
    call = int(rng.integers(0, 50_000))
    groups = plan_padded_groups(sizes, counts, call)
    assert groups[0][0] == 0 and groups[-1][1] == len(sizes)
    assert all(a < b and b == c for (a, b), (c, _) in zip(groups, groups[1:] + [(len(sizes), None)]))
    best = min(
        _cost([(0, *cuts)[i : i + 2] for i in range(len(cuts))], sizes, counts, call)
        for r in range(len(sizes))
        for cuts in (tuple(c) + (len(sizes),) for c in itertools.combinations(range(1, len(sizes)), r))
    )
    assert _cost(groups, sizes, counts, call) == pytest.approx(best)
    assert plan_padded_groups(sizes, counts, 0) == [(i, i + 1) for i in range(len(sizes))]
    with pytest.raises(ValueError, match="ascending"):
        plan_padded_groups(sizes[::-1], counts)
