"""Tests for fedgat.approx: the polynomial attention score, its error bounds and positivity."""

from __future__ import annotations

import itertools
import json
from fractions import Fraction

import numpy as np
import numpy.polynomial.chebyshev as C
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedgat.approx import (
    POSITIVITY_FRACTION,
    PSI_NAMES,
    ScorePolynomial,
    attention_error_bound,
    chebyshev_theory_bound,
    fit_score,
    logit_scale,
    score,
)

U64 = np.finfo(np.float64).eps / 2


def _dense(a: float, n: int = 20001) -> np.ndarray:
    return np.linspace(-a, a, n)


# ----------------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    "kwargs",
    [
        {"degree": 0},
        {"degree": -3},
        {"degree": 2.5},
        {"domain": 0.0},
        {"domain": -1.0},
        {"domain": float("inf")},
        {"psi": "relu"},
        {"method": "pade"},
    ],
)
def test_invalid_arguments_raise(kwargs):
    with pytest.raises(ValueError):
        fit_score(**kwargs)


def test_score_functions():
    x = np.array([-3.0, -0.5, 0.0, 0.5, 3.0])
    np.testing.assert_allclose(score(x, "leaky_relu"), np.exp(np.where(x >= 0, x, 0.2 * x)))
    smooth = np.exp(0.2 * x + 0.8 * np.log1p(np.exp(4 * x)) / 4)
    np.testing.assert_allclose(score(x, "smooth_leaky_relu"), smooth, rtol=1e-14)
    # stable far out: softplus(4x) ~ 4x, so s(x) ~ e^x, no overflow warning
    np.testing.assert_allclose(score(300.0, "smooth_leaky_relu"), np.exp(300.0), rtol=1e-12)
    for psi in PSI_NAMES:
        for a in (2.0, 4.0, 8.0):
            poly = fit_score(psi, 8, a)
            assert poly.score_min == pytest.approx(float(score(_dense(a), psi).min()), rel=1e-14)
            assert poly.score_min == pytest.approx(np.exp(-0.2 * a), rel=0.02)


def test_frozen_and_serialisable():
    poly = fit_score("smooth_leaky_relu", 16, 4.0)
    assert isinstance(poly, ScorePolynomial)
    with pytest.raises(AttributeError):
        poly.degree = 3
    with pytest.raises(ValueError):
        poly.power[0] = 1.0
    d = json.loads(json.dumps(poly.to_dict()))
    assert d["psi"] == "smooth_leaky_relu" and d["degree"] == 16 and d["domain"] == 4.0
    assert len(d["cheb"]) == len(d["power"]) == 17
    assert d["sup_error"] == poly.sup_error and d["shift"] == 0.0


# ----------------------------------------------------------------------------- accuracy


@pytest.mark.parametrize("method", ["interpolation", "least_squares"])
@pytest.mark.parametrize("psi", PSI_NAMES)
@pytest.mark.parametrize("a,p", [(2.0, 8), (4.0, 4), (4.0, 16), (8.0, 8), (8.0, 16), (4.0, 24)])
def test_error_within_reported_sup_error(psi, a, p, method):
    poly = fit_score(psi, p, a, method)
    rng = np.random.default_rng(p)
    x = np.concatenate([rng.uniform(-a, a, 5000), _dense(a, 40001)])
    err = np.abs(poly(x) - poly.exact(x))
    assert err.max() <= poly.sup_error * (1 + 1e-12)
    # and sup_error is a measurement, not a loose bound: the dense grid comes within 0.1 %
    assert err.max() >= 0.999 * poly.sup_error


def test_interpolation_is_at_chebyshev_points():
    poly = fit_score("leaky_relu", 12, 4.0)
    t = np.cos(np.pi * (np.arange(13) + 0.5) / 13)
    np.testing.assert_allclose(poly(4.0 * t), poly.exact(4.0 * t), rtol=1e-12)


@pytest.mark.parametrize("psi", PSI_NAMES)
@pytest.mark.parametrize("a", [2.0, 4.0, 8.0])
def test_sup_error_below_theory_bound(psi, a):
    for p in (4, 8, 12, 16, 24):
        poly = fit_score(psi, p, a)
        bound = chebyshev_theory_bound(psi, p, a)
        # the theorem covers the unshifted interpolant: error <= raw error + shift <= bound + shift
        assert poly.sup_error <= bound + poly.shift
        if poly.shift == 0.0:
            assert poly.sup_error <= bound


@pytest.mark.parametrize("a", [2.0, 4.0, 8.0])
def test_leaky_theory_bound_is_bounded_variation_formula(a):
    # f'(t) = a s'(at) is increasing with an upward jump 0.8a at 0, so V = f'(1) - f'(-1)
    v = a * np.exp(a) - 0.2 * a * np.exp(-0.2 * a)
    for p in (4, 16):
        assert chebyshev_theory_bound("leaky_relu", p, a) == pytest.approx(
            4 * v / (np.pi * (p - 1)), rel=1e-10
        )
    assert chebyshev_theory_bound("leaky_relu", 1, a) == float("inf")
    assert chebyshev_theory_bound("smooth_leaky_relu", 2, a) < float("inf")  # ellipse bound applies


@pytest.mark.parametrize("psi", PSI_NAMES)
def test_error_falls_with_degree(psi):
    errors = [fit_score(psi, p, 4.0).sup_error for p in (4, 8, 12, 16)]
    assert all(e1 > e2 for e1, e2 in itertools.pairwise(errors)), errors
    # smooth: geometric convergence; LeakyReLU: only algebraic (kink), roughly 1/p
    if psi == "smooth_leaky_relu":
        assert errors[-1] < 0.01 and fit_score(psi, 24, 4.0).sup_error < 1e-3
    else:
        assert 0.03 < errors[-1] < 0.1


# ----------------------------------------------------------------------------- positivity


@pytest.mark.parametrize("method", ["interpolation", "least_squares"])
@pytest.mark.parametrize("psi", PSI_NAMES)
def test_polynomial_is_positive(psi, method):
    shifted = 0
    for a in (0.5, 2.0, 4.0, 6.0, 8.0, 10.0):
        for p in (1, 2, 3, 4, 8, 16, 24):
            poly = fit_score(psi, p, a, method)
            x = _dense(a, 4001)
            k = int(np.argmin(poly(x)))
            x = np.concatenate([x, np.linspace(x[max(k - 1, 0)], x[min(k + 1, len(x) - 1)], 2001)])
            grid_min = poly(x).min()
            assert poly.min_value > 0
            assert poly.min_value >= POSITIVITY_FRACTION * poly.score_min * (1 - 1e-9)
            assert grid_min >= poly.min_value - 1e-9 * poly.score_min  # min_value is the minimum
            assert grid_min <= poly.min_value + 1e-3 * poly.score_min  # ... and is attained
            assert poly.shift >= 0
            shifted += poly.shift > 0
    assert shifted >= 5  # the grid does exercise the shift


@pytest.mark.parametrize("psi", PSI_NAMES)
@pytest.mark.parametrize("a,p", [(8.0, 4), (8.0, 8), (4.0, 4)])
def test_shift_applied_and_reported(psi, a, p):
    poly = fit_score(psi, p, a)
    assert poly.shift > 0
    unshifted = np.array(poly.cheb)
    unshifted[0] -= poly.shift
    x = _dense(a)
    if a == 8.0:
        assert C.chebval(x / a, unshifted).min() < 0  # the raw fit goes negative
    assert C.chebval(x / a, unshifted).min() < POSITIVITY_FRACTION * poly.score_min
    # lifted to exactly half the score minimum
    assert poly.min_value == pytest.approx(POSITIVITY_FRACTION * poly.score_min, rel=1e-9)
    # power coefficients carry the shift too
    np.testing.assert_allclose(np.polyval(poly.power[::-1], x), poly(x), rtol=1e-9, atol=0)
    # sup_error is measured after the shift
    err = np.abs(poly(x) - poly.exact(x)).max()
    assert err <= poly.sup_error * (1 + 1e-12)
    assert err >= 0.999 * poly.sup_error
    assert poly.sup_error != pytest.approx(np.abs(C.chebval(x / a, unshifted) - poly.exact(x)).max())


def test_no_shift_when_not_needed():
    for psi in PSI_NAMES:
        assert fit_score(psi, 16, 4.0).shift == 0.0
        assert fit_score(psi, 16, 2.0).shift == 0.0


# ----------------------------------------------------------------------------- power series


def _exact_power(cheb: np.ndarray, a: float) -> list[Fraction]:
    """Monomial coefficients in x of sum cheb_k T_k(x/a), in exact rational arithmetic."""
    t_polys = [[Fraction(1)], [Fraction(0), Fraction(1)]]
    for _ in range(2, len(cheb)):
        new = [Fraction(0)] + [2 * c for c in t_polys[-1]]
        for i, c in enumerate(t_polys[-2]):
            new[i] -= c
        t_polys.append(new)
    d = [Fraction(0)] * len(cheb)
    for ck, tk in zip(cheb, t_polys):
        for i, c in enumerate(tk):
            d[i] += Fraction(float(ck)) * c
    return [dn / Fraction(a) ** n for n, dn in enumerate(d)]


@pytest.mark.parametrize("psi", PSI_NAMES)
@pytest.mark.parametrize("a", [1.0, 2.0, 4.0, 8.0])
@pytest.mark.parametrize("p", [4, 8, 16, 24])
def test_power_coefficients_reproduce_chebyshev(psi, a, p):
    poly = fit_score(psi, p, a)
    x = _dense(a, 4001)
    cheb_vals = poly(x)
    horner = np.polyval(poly.power[::-1], x)
    # normwise: within 1e-9 of the polynomial's size, always
    assert np.abs(horner - cheb_vals).max() <= 1e-9 * np.abs(cheb_vals).max()
    # pointwise relative: the Horner rounding bound 2p u kappa, kappa = power_condition
    rel = np.abs(horner - cheb_vals) / cheb_vals
    assert rel.max() <= 2 * p * U64 * poly.power_condition
    if p <= 16:
        assert rel.max() <= 1e-9


def test_power_conversion_is_accurate():
    # the conversion itself is accurate to a few ulps even where evaluation is ill-conditioned
    poly = fit_score("leaky_relu", 24, 8.0)
    exact = np.array([float(c) for c in _exact_power(poly.cheb, poly.domain)])
    np.testing.assert_allclose(poly.power, exact, rtol=1e-13, atol=0)
    assert poly.power_condition > 1e7  # ... and the power basis is badly conditioned here


# ----------------------------------------------------------------------------- attention error


def test_attention_error_bound_formula():
    assert attention_error_bound(0.1, 0.5) == pytest.approx(0.2 / 0.4)
    assert attention_error_bound(0.5, 0.5) == float("inf")
    assert attention_error_bound(1.0, 0.5) == float("inf")
    assert attention_error_bound(1.0, 0.5, approx_min=0.25) == pytest.approx(8.0)
    assert attention_error_bound(0.1, 0.5, approx_min=0.25) == pytest.approx(0.5)
    assert attention_error_bound(0.0, 0.5) == 0.0


def test_attention_lemma_on_adversarial_perturbations():
    """The lemma itself: any s_j >= m and any |shat_j - s_j| <= eps (here = eps exactly)."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(2000):
        n = int(rng.integers(1, 51))
        m, eps = rng.uniform(0.1, 1.0), rng.uniform(0.0, 0.1)
        s = m + rng.exponential(rng.choice([0.01, 1.0]), n)
        s_hat = s + eps * rng.choice([-1.0, 1.0], n)
        l1 = np.abs(s_hat / s_hat.sum() - s / s.sum()).sum()
        bound = attention_error_bound(eps, m)
        assert l1 <= bound * (1 + 1e-12) + 1e-15
        worst = max(worst, l1 / bound if bound > 0 else 0.0)
    # balanced +-eps on equal scores gives eps / m: the bound is within a factor ~2 of the worst case
    assert worst > 0.4


@pytest.mark.parametrize(
    "psi,a,p",
    [
        ("leaky_relu", 2.0, 8),
        ("leaky_relu", 4.0, 16),
        ("smooth_leaky_relu", 4.0, 16),
        ("smooth_leaky_relu", 8.0, 16),
        ("leaky_relu", 8.0, 8),  # shifted: finite only thanks to the positivity floor
    ],
)
def test_attention_error_bound_holds_for_polynomial(psi, a, p):
    poly = fit_score(psi, p, a)
    bound = poly.attention_error_bound()
    assert np.isfinite(bound)
    if poly.sup_error < poly.score_min:
        assert bound <= attention_error_bound(poly.sup_error, poly.score_min)
    # points where the error is largest, to make neighbourhoods near-adversarial
    grid = _dense(a)
    err = poly(grid) - poly.exact(grid)
    extremal = grid[np.argsort(np.abs(err))[-50:]]
    rng = np.random.default_rng(p)
    for trial in range(300):
        n = int(rng.integers(1, 51))
        x = rng.uniform(-a, a, n) if trial % 2 else rng.choice(extremal, n)
        s, s_hat = poly.exact(x), poly(x)
        alpha, alpha_hat = s / s.sum(), s_hat / s_hat.sum()
        assert np.abs(alpha_hat - alpha).sum() <= bound * (1 + 1e-12)
        z = rng.normal(size=(n, 8)) * rng.uniform(0.1, 3.0, (n, 1))
        out_err = np.linalg.norm((alpha_hat - alpha) @ z)
        assert out_err <= np.linalg.norm(z, axis=1).max() * bound * (1 + 1e-12)


# ----------------------------------------------------------------------------- logit scale


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    heads=st.integers(1, 8),
    dim=st.integers(1, 64),
    log_norm=st.floats(-3.0, 3.0),
    domain=st.sampled_from([1.0, 2.0, 4.0, 8.0]),
)
def test_logit_scale_keeps_logits_in_domain(seed, heads, dim, log_norm, domain):
    rng = np.random.default_rng(seed)
    b1 = torch.tensor(rng.normal(size=(heads, dim)) * 10**log_norm)
    b2 = torch.tensor(rng.normal(size=(heads, dim)) * 10 ** (log_norm * rng.uniform()))
    h = torch.tensor(rng.normal(size=(2, 10, dim)))
    h = h / h.norm(dim=-1, keepdim=True)
    h[:, 0] = b1[0] / b1[0].norm()  # include the Cauchy-Schwarz extremes
    h[1, 1] = -b2[0] / b2[0].norm()
    scale = logit_scale(b1.norm(dim=1), b2.norm(dim=1), domain)
    assert scale.shape == (heads,)
    assert torch.all(scale <= 1) and torch.all(scale > 0)
    x = scale[:, None] * (h[0] @ b1.T + h[1] @ b2.T).T  # (heads, 10)
    assert x.abs().max().item() <= domain * (1 + 1e-12)
    unclipped = (b1.norm(dim=1) + b2.norm(dim=1)) <= domain
    assert torch.all(scale[unclipped] == 1)


def test_logit_scale_gradients():
    n1 = torch.tensor([0.0, 1.0, 2.5, 6.0], requires_grad=True)
    n2 = torch.tensor([0.0, 0.5, 1.0, 2.0], requires_grad=True)
    scale = logit_scale(n1, n2, 4.0)
    np.testing.assert_allclose(scale.detach().numpy(), [1.0, 1.0, 1.0, 0.5])
    scale.sum().backward()
    assert torch.isfinite(n1.grad).all() and torch.isfinite(n2.grad).all()
    np.testing.assert_allclose(n1.grad.numpy(), [0.0, 0.0, 0.0, -4.0 / 64])
    np.testing.assert_allclose(n2.grad.numpy(), [0.0, 0.0, 0.0, -4.0 / 64])


# ----------------------------------------------------------------------------- torch


@pytest.mark.parametrize("psi", PSI_NAMES)
def test_torch_eval_matches_numpy_and_differentiates(psi):
    poly = fit_score(psi, 16, 4.0)
    x_np = np.random.default_rng(1).uniform(-4, 4, (3, 7))
    x64 = torch.tensor(x_np, requires_grad=True)
    y64 = poly.torch_eval(x64)
    assert y64.dtype == torch.float64 and y64.shape == (3, 7)
    np.testing.assert_allclose(y64.detach().numpy(), poly(x_np), rtol=1e-9)
    y64.sum().backward()
    deriv = C.chebval(x_np / 4.0, C.chebder(poly.cheb)) / 4.0
    np.testing.assert_allclose(x64.grad.numpy(), deriv, rtol=1e-7, atol=1e-9)

    x32 = torch.tensor(x_np, dtype=torch.float32, requires_grad=True)
    y32 = poly.torch_eval(x32)  # float64 arithmetic, float32 result
    assert y32.dtype == torch.float32
    np.testing.assert_allclose(y32.detach().numpy(), poly(x_np.astype(np.float32)), rtol=1e-6)
    y32.sum().backward()
    assert x32.grad is not None and x32.grad.dtype == torch.float32

    native = poly.torch_eval(x32.detach(), compute_dtype=None)  # float32 Horner
    assert native.dtype == torch.float32
    rel = np.abs(native.numpy() - poly(x_np.astype(np.float32))) / poly(x_np)
    assert rel.max() <= 2 * 16 * np.finfo(np.float32).eps * poly.power_condition
