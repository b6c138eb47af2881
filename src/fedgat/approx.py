r"""Polynomial approximation of the GAT attention score.

GAT scores an edge :math:`j \to i` with

.. math::

    s(x) = \exp(\psi(x)), \qquad x = b_1^\top h_i + b_2^\top h_j,
    \qquad b_1 = W^\top a_\mathrm{dst},\; b_2 = W^\top a_\mathrm{src},

where :math:`\psi` is ``LeakyReLU(0.2)`` (``"leaky_relu"``) or the smooth variant used by the
authors' code (``"smooth_leaky_relu"``),

.. math::

    \psi(x) = 0.2\,x + 0.8\,\tfrac14\,\mathrm{softplus}(4x), \qquad
    \mathrm{softplus}(z) = \log(1 + e^z).

Both are increasing, so :math:`\min_{[-a, a]} s = s(-a)`, which is :math:`e^{-0.2a}` for LeakyReLU
and :math:`e^{-0.2a}(1 + e^{-4a})^{0.2}` (equal to :math:`e^{-0.2a}` to 7 digits for
:math:`a \ge 4`) for the smooth variant.

FedGAT replaces :math:`s` by a degree-:math:`p` polynomial
:math:`\hat s(x) = \sum_{n=0}^{p} c_n x^n` so that neighbourhood sums
:math:`\sum_j \hat s(x_{ij}) z_j` can be assembled from the power sums :math:`\sum_j x_{ij}^n z_j`.
:func:`fit_score` builds the polynomial as a Chebyshev interpolant (or a least-squares Chebyshev
fit) on :math:`[-a, a]`, converts it to power-series coefficients, shifts it up where needed so that
it stays positive, and measures its sup-norm error. Since unit-norm features give
:math:`|x| \le \|b_1\| + \|b_2\|`, :func:`logit_scale` shrinks :math:`x` per head so the polynomial
is never evaluated outside its fitted domain.

Conditioning: the power-series coefficients satisfy :math:`c_n = d_n a^{-n}` where :math:`d_n` are
the monomial coefficients in :math:`t = x/a \in [-1, 1]`. Rounding errors of any evaluation from
power sums (Horner's rule here, the encrypted/encoded sums in the protocol) are amplified by up to
:attr:`ScorePolynomial.power_condition` :math:`= \sum_n |d_n| / \min \hat s`, which grows roughly
like :math:`(1 + \sqrt 2)^p` times the size of the Chebyshev coefficients.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.polynomial.chebyshev as C
import torch
from scipy.optimize import minimize_scalar

PSI_NAMES = ("leaky_relu", "smooth_leaky_relu")
NEGATIVE_SLOPE = 0.2
#: Fraction of ``score_min`` below which the polynomial is shifted up (see :func:`fit_score`).
POSITIVITY_FRACTION = 0.5

_GRID_POINTS = 8193  # uniform points in t; the Chebyshev-clustered grid adds as many again
_REFINE_MAXIMA = 12  # local maxima of |error| refined by a bounded scalar search
_TV_POINTS = 2**18 + 1  # grid for total variation


def _check_psi(psi: str) -> None:
    if psi not in PSI_NAMES:
        raise ValueError(f"unknown psi {psi!r}; expected one of {PSI_NAMES}")


def score(x: np.ndarray | float, psi: str = "leaky_relu") -> np.ndarray:
    """The exact attention score :math:`s(x) = \\exp(\\psi(x))`, elementwise (float64)."""
    _check_psi(psi)
    x = np.asarray(x, dtype=np.float64)
    if psi == "leaky_relu":
        return np.exp(np.where(x >= 0, x, NEGATIVE_SLOPE * x))
    softplus = np.logaddexp(0.0, 4 * x)
    return np.exp(NEGATIVE_SLOPE * x + (1 - NEGATIVE_SLOPE) * softplus / 4)


def score_derivative(x: np.ndarray, psi: str, order: int) -> np.ndarray:
    r"""The ``order``-th derivative of :math:`s` (``order`` in 0, 1, 2), elementwise.

    With :math:`s = e^{\psi}`: :math:`s' = \psi' s`, :math:`s'' = (\psi'' + \psi'^2) s`. For
    LeakyReLU, :math:`\psi'` is 1 for :math:`x \ge 0` (the right derivative at 0) and 0.2 below,
    and :math:`\psi'' = 0` away from the kink; for the smooth variant
    :math:`\psi' = 0.2 + 0.8\,\sigma(4x)` and :math:`\psi'' = 3.2\,\sigma(4x)(1 - \sigma(4x))`.
    """
    _check_psi(psi)
    if order not in (0, 1, 2):
        raise ValueError(f"order must be 0, 1 or 2, got {order!r}")
    x = np.asarray(x, dtype=np.float64)
    s = score(x, psi)
    if psi == "leaky_relu":
        d1 = np.where(x >= 0, 1.0, NEGATIVE_SLOPE)
        d2 = np.zeros_like(x)
    else:
        sig = 0.5 * (1 + np.tanh(2 * x))  # sigmoid(4x), overflow-free
        d1 = NEGATIVE_SLOPE + (1 - NEGATIVE_SLOPE) * sig
        d2 = 4 * (1 - NEGATIVE_SLOPE) * sig * (1 - sig)
    factor = (np.ones_like(x), d1, d2 + d1**2)[order]
    return factor * s


def _poly_min(cheb: np.ndarray) -> float:
    """Exact minimum of the Chebyshev series ``cheb`` on ``[-1, 1]``: the smallest value at the
    endpoints and at the real roots of its derivative inside the interval."""
    candidates = [np.array([-1.0, 1.0])]
    if len(cheb) > 2:
        roots = C.chebroots(C.chebder(cheb))
        real = roots[np.abs(roots.imag) < 1e-7].real
        candidates.append(np.clip(real[np.abs(real) <= 1 + 1e-9], -1, 1))
    return float(C.chebval(np.concatenate(candidates), cheb).min())


def _least_squares(f: Callable[[np.ndarray], np.ndarray], degree: int) -> np.ndarray:
    """Chebyshev coefficients minimising ``sum_k (p(t_k) - f(t_k))^2`` over a uniform grid of
    ``max(2001, 20 (degree + 1))`` points in ``[-1, 1]``.

    Solved through the normal equations: the Chebyshev-Vandermonde matrix on a uniform grid has
    condition number below 6 for degrees up to 32, so this agrees with an SVD solve
    (``numpy.polynomial.chebyshev.chebfit``) to ~1e-14, and the ``einsum`` products avoid
    multithreaded BLAS, which slows ``lstsq`` 30-fold on a busy two-core machine.
    """
    t = np.linspace(-1, 1, max(2001, 20 * (degree + 1)))
    v = C.chebvander(t, degree)
    return np.linalg.solve(np.einsum("ki,kj->ij", v, v), np.einsum("ki,k->i", v, f(t)))


def _sup_error(cheb: np.ndarray, psi: str, a: float) -> float:
    r"""Measured :math:`\max_{[-a, a]} |\hat s - s|` for the series ``cheb`` in ``t = x / a``.

    Evaluates on a uniform grid and a Chebyshev-clustered grid (both containing ``t = 0``, the
    LeakyReLU kink, and the endpoints), then refines the largest local maxima of the error with a
    bounded scalar search between the neighbouring grid points (locating the roots of the error's
    derivative), and returns the largest value seen.
    """
    t = np.unique(
        np.concatenate([np.linspace(-1, 1, _GRID_POINTS), np.cos(np.linspace(0, np.pi, _GRID_POINTS)), [0.0]])
    )

    def err(u: np.ndarray | float) -> np.ndarray:
        return np.abs(C.chebval(u, cheb) - score(a * np.asarray(u), psi))

    e = err(t)
    interior = np.flatnonzero((e[1:-1] >= e[:-2]) & (e[1:-1] >= e[2:])) + 1
    best = float(e.max())
    for i in interior[np.argsort(e[interior])[::-1][:_REFINE_MAXIMA]]:
        res = minimize_scalar(
            lambda u: -float(err(u)), bounds=(t[i - 1], t[i + 1]), method="bounded", options={"xatol": 1e-14}
        )
        best = max(best, -float(res.fun))
    return best


@dataclass(frozen=True, eq=False)
class ScorePolynomial:
    r"""A positive polynomial approximation :math:`\hat s` of the attention score on :math:`[-a, a]`.

    Attributes:
        psi: ``"leaky_relu"`` or ``"smooth_leaky_relu"``.
        degree: the degree :math:`p`.
        domain: the half-width :math:`a` of the fitted interval :math:`[-a, a]`.
        method: ``"interpolation"`` or ``"least_squares"``.
        cheb: ``(p + 1,)`` float64 Chebyshev coefficients in :math:`t = x / a`, shift included:
            :math:`\hat s(x) = \sum_n \mathrm{cheb}_n T_n(x / a)`.
        power: ``(p + 1,)`` float64 power-series coefficients in :math:`x`, shift included:
            :math:`\hat s(x) = \sum_n \mathrm{power}_n x^n`.
        shift: constant added to the fitted polynomial to keep it at least
            ``POSITIVITY_FRACTION * score_min`` (0 when no shift was needed).
        sup_error: measured :math:`\max_{[-a, a]} |\hat s - s|`, after the shift.
        min_value: :math:`\min_{[-a, a]} \hat s` (exact up to root-finding accuracy; always > 0).
        score_min: :math:`\min_{[-a, a]} s = s(-a)`.
    """

    psi: str
    degree: int
    domain: float
    method: str
    cheb: np.ndarray
    power: np.ndarray
    shift: float
    sup_error: float
    min_value: float
    score_min: float

    def __call__(self, x: np.ndarray | float) -> np.ndarray:
        """Evaluate :math:`\\hat s(x)` in float64 with the (stable) Chebyshev series."""
        return C.chebval(np.asarray(x, dtype=np.float64) / self.domain, self.cheb)

    def exact(self, x: np.ndarray | float) -> np.ndarray:
        """The true score :math:`s(x)` that this polynomial approximates."""
        return score(x, self.psi)

    def torch_eval(self, x: torch.Tensor, compute_dtype: torch.dtype | None = torch.float64) -> torch.Tensor:
        r"""Horner's rule on the power series,
        :math:`\hat s(x) = c_0 + x(c_1 + x(c_2 + \dots + x c_p))`, elementwise.

        Args:
            x: tensor of any shape (logits, already inside ``[-domain, domain]``).
            compute_dtype: dtype of the arithmetic; ``None`` uses ``x.dtype``. The default, float64,
                matters: Horner's relative error is up to about
                :math:`2p\,u\,\kappa` with :math:`\kappa` = :attr:`power_condition`, and in
                float32 (:math:`u \approx 6\times10^{-8}`) we measured 1e-3 for LeakyReLU at
                ``p=16, a=4`` and 0.1-3 at ``p=24, a=2..8``: more than the approximation error.

        Returns:
            :math:`\hat s(x)` with ``x``'s shape, dtype and device, differentiable in ``x``.
        """
        dtype = x.dtype if compute_dtype is None else compute_dtype
        xc = x.to(dtype)
        coeffs = torch.tensor(self.power.tolist(), dtype=dtype, device=x.device)
        out = coeffs[-1].expand_as(xc)
        for n in range(self.degree - 1, -1, -1):
            out = out * xc + coeffs[n]
        return out.to(x.dtype)

    @property
    def power_condition(self) -> float:
        r""":math:`\sum_n |c_n| a^n / \min_{[-a,a]} \hat s`: a bound on the factor by which a
        relative perturbation of the power-series terms (rounding, encoding noise) is amplified in
        the relative error of :math:`\hat s(x)` on :math:`[-a, a]`."""
        scaled = np.abs(self.power) * self.domain ** np.arange(self.degree + 1)
        return float(scaled.sum() / self.min_value)

    def attention_error_bound(self) -> float:
        """The bound of :func:`attention_error_bound` for this polynomial, using its measured
        ``sup_error``, ``score_min`` and the positivity floor ``min_value``."""
        return attention_error_bound(self.sup_error, self.score_min, approx_min=self.min_value)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable description (coefficients as lists of floats)."""
        return {
            "psi": self.psi,
            "degree": self.degree,
            "domain": self.domain,
            "method": self.method,
            "cheb": self.cheb.tolist(),
            "power": self.power.tolist(),
            "shift": self.shift,
            "sup_error": self.sup_error,
            "min_value": self.min_value,
            "score_min": self.score_min,
            "power_condition": self.power_condition,
            "attention_error_bound": self.attention_error_bound(),
        }


def fit_score(
    psi: str = "leaky_relu", degree: int = 16, domain: float = 4.0, method: str = "interpolation"
) -> ScorePolynomial:
    r"""Fit a degree-``degree`` polynomial to :math:`s` on ``[-domain, domain]``.

    Args:
        psi: ``"leaky_relu"`` or ``"smooth_leaky_relu"``.
        degree: polynomial degree :math:`p \ge 1`.
        domain: half-width :math:`a > 0` of the interval.
        method: ``"interpolation"``: interpolate :math:`f(t) = s(at)` at the :math:`p + 1`
            Chebyshev points of the first kind :math:`t_k = \cos(\pi (k + 1/2) / (p + 1))`;
            ``"least_squares"``: least-squares Chebyshev fit on a dense uniform grid in
            :math:`t` (what the authors' code does).

    Positivity: the exact minimum of the fit on :math:`[-a, a]` is found from the real roots of
    its derivative plus the endpoints. If it is below :math:`\tfrac12 \min s`, the constant
    ``shift`` lifting it to exactly :math:`\tfrac12 \min s` is added (then ``sup_error`` grows by
    at most ``shift``, and is re-measured).

    Raises:
        ValueError: on ``degree < 1``, ``domain <= 0``, unknown ``psi`` or ``method``.
    """
    _check_psi(psi)
    if int(degree) != degree or degree < 1:
        raise ValueError(f"degree must be an integer >= 1, got {degree!r}")
    if not np.isfinite(domain) or domain <= 0:
        raise ValueError(f"domain must be a finite positive number, got {domain!r}")
    degree, a = int(degree), float(domain)

    def f(t: np.ndarray) -> np.ndarray:
        return score(a * t, psi)

    cheb: np.ndarray
    if method == "interpolation":
        cheb = C.chebinterpolate(f, degree)
    elif method == "least_squares":
        cheb = _least_squares(f, degree)
    else:
        raise ValueError(f"unknown method {method!r}; expected 'interpolation' or 'least_squares'")

    score_min = float(score(-a, psi))
    floor = POSITIVITY_FRACTION * score_min
    min_value = _poly_min(cheb)
    shift = 0.0
    if min_value < floor:
        shift = floor - min_value
        cheb = cheb.copy()
        cheb[0] += shift
        min_value = _poly_min(cheb)

    power = C.cheb2poly(cheb) * a ** -np.arange(degree + 1, dtype=np.float64)
    for arr in (cheb, power):
        arr.setflags(write=False)
    return ScorePolynomial(
        psi=psi,
        degree=degree,
        domain=a,
        method=method,
        cheb=cheb,
        power=power,
        shift=float(shift),
        sup_error=_sup_error(cheb, psi, a),
        min_value=min_value,
        score_min=score_min,
    )


def attention_error_bound(eps: float, score_min: float, approx_min: float = 0.0) -> float:
    r"""Bound on the L1 error of the attention weights when every score is off by at most ``eps``.

    This is our own derivation of the kind of bound the paper's Theorem 2 states (approximate GAT
    output error linear in the polynomial's sup-norm error). Let a node have neighbours
    :math:`j = 1..n` with exact scores :math:`s_j \ge m` (``score_min``) and approximate scores
    :math:`\hat s_j` with :math:`|\hat s_j - s_j| \le \varepsilon`; write
    :math:`S = \sum_k s_k`, :math:`\hat S = \sum_k \hat s_k`,
    :math:`\alpha_j = s_j / S`, :math:`\hat\alpha_j = \hat s_j / \hat S`. Then

    .. math::

        \hat\alpha_j - \alpha_j = \frac{\hat s_j - s_j}{\hat S} + \alpha_j \frac{S - \hat S}{\hat S},
        \qquad
        \sum_j |\hat\alpha_j - \alpha_j| \le \frac{n\varepsilon}{\hat S} + \frac{|S - \hat S|}{\hat S}
        \le \frac{2 n \varepsilon}{\hat S}.

    Every :math:`\hat s_j \ge \max(m - \varepsilon, \hat m)` where :math:`\hat m` (``approx_min``)
    is a known lower bound of the polynomial (its guaranteed positive minimum), so
    :math:`\hat S \ge n \max(m - \varepsilon, \hat m)` and

    .. math::

        \sum_j |\hat\alpha_j - \alpha_j| \le \frac{2\varepsilon}{\max(m - \varepsilon, \hat m)}.

    With ``approx_min = 0`` this is :math:`2\varepsilon / (m - \varepsilon)`, valid for
    :math:`\varepsilon < m`. For the layer output with messages :math:`z_j`,
    :math:`\|\sum_j (\hat\alpha_j - \alpha_j) z_j\| \le \max_j \|z_j\| \cdot` (this bound).

    Returns:
        The bound, or ``inf`` when the denominator is not positive.
    """
    denom = max(score_min - eps, approx_min)
    return float(2 * eps / denom) if denom > 0 else float("inf")


def _total_variation(g: np.ndarray) -> float:
    """Discrete total variation ``sum |diff g|`` of samples on a grid."""
    return float(np.abs(np.diff(g)).sum())


def _bernstein_bound(psi: str, degree: int, a: float) -> float:
    r"""Analytic-function bound (ATAP Thm 8.2) for the smooth score: if :math:`f` is analytic in
    the open Bernstein ellipse :math:`E_\rho` and :math:`|f| \le M` there, the degree-:math:`n`
    Chebyshev interpolant satisfies :math:`\|f - p_n\| \le 4 M \rho^{-n} / (\rho - 1)`.

    :math:`f(t) = s(at) = e^{0.2at} (1 + e^{4at})^{0.2}` is analytic except where
    :math:`1 + e^{4at} = 0`, nearest at :math:`t = \pm i\pi/(4a)`, so any ellipse with semi-minor
    axis :math:`b < \pi/(4a)`, :math:`\rho = b + \sqrt{b^2 + 1}`, qualifies. Because
    :math:`|1 + e^w| \le 1 + e^{\mathrm{Re}\,w}`, :math:`|f(z)| \le f(\mathrm{Re}\,z)`, so
    :math:`M = f((\rho + \rho^{-1})/2)`, the value at the ellipse's right-hand vertex. :math:`\rho`
    is chosen by a grid search (1000 values of :math:`b`) minimising the bound.
    """
    b = np.pi / (4 * a) * np.linspace(1e-3, 1 - 1e-6, 1000)
    rho = b + np.sqrt(b * b + 1)
    m = score(a * (rho + 1 / rho) / 2, psi)
    return float(np.min(4 * m * rho ** (-float(degree)) / (rho - 1)))


def chebyshev_theory_bound(psi: str, degree: int, domain: float) -> float:
    r"""An a-priori bound on :math:`\max_{[-a, a]} |p_n - s|` for the Chebyshev *interpolant*
    (``method="interpolation"``, before any positivity shift), to compare with the measured error.

    Works on :math:`f(t) = s(at)`, :math:`t \in [-1, 1]`, so :math:`f^{(k)}(t) = a^k s^{(k)}(at)`.

    * ``"leaky_relu"``: bounded-variation bound (Trefethen, ATAP Thm 7.2): if :math:`f^{(k-1)}` is
      absolutely continuous and :math:`f^{(k)}` has total variation :math:`V` on :math:`[-1, 1]`,
      then :math:`\|f - p_n\| \le 4V / (\pi k (n - k)^k)` for :math:`n > k`. Here :math:`f` is
      Lipschitz but :math:`f'` jumps by :math:`0.8a` at 0, so only :math:`k = 1` applies; :math:`V`
      is the discrete variation of :math:`f'` on a :math:`2^{18}`-interval grid, which includes the
      jump (it falls between neighbouring grid points) and is exact here because :math:`f'` is
      monotone (:math:`V = a e^a - 0.2 a e^{-0.2a}`).
    * ``"smooth_leaky_relu"``: the smaller of two valid bounds: Thm 7.2 with :math:`k = 2`
      (:math:`V` = variation of :math:`f''`, discrete on the same grid; :math:`f''` has a bump near 0,
      whose variation the grid resolves to relative error :math:`O(h^2)`), and the Bernstein-ellipse
      bound of ATAP Thm 8.2 (see :func:`_bernstein_bound`). The ellipse bound is the smaller one
      for :math:`a \le 1`, or :math:`a = 2` with :math:`p \ge 24`; Thm 7.2 for larger :math:`a`.

    Both are 50 to 10^4 times the measured error (e.g. LeakyReLU, :math:`a = 4`,
    :math:`p = 16`: bound 18.5, measured 0.065): they certify the rate, not the constant.

    Returns:
        The bound, or ``inf`` where no bound applies (:math:`n \le k`).
    """
    _check_psi(psi)
    a = float(domain)
    t = np.linspace(-1, 1, _TV_POINTS)
    k = 1 if psi == "leaky_relu" else 2
    v = _total_variation(a**k * score_derivative(a * t, psi, k))
    bv = 4 * v / (np.pi * k * (degree - k) ** k) if degree > k else float("inf")
    if psi == "leaky_relu":
        return float(bv)
    return float(min(bv, _bernstein_bound(psi, degree, a)))


def logit_scale(b1_norm: torch.Tensor, b2_norm: torch.Tensor, domain: float) -> torch.Tensor:
    r"""Per-head factor :math:`\min(1, a / (\|b_1\| + \|b_2\|))` that keeps logits in the domain.

    For :math:`\|h_i\|, \|h_j\| \le 1`, Cauchy-Schwarz gives
    :math:`|b_1^\top h_i + b_2^\top h_j| \le \|b_1\| + \|b_2\|`, so multiplying :math:`x` by this
    factor keeps it in :math:`[-a, a]` (up to floating-point rounding of the dot products).

    Args:
        b1_norm, b2_norm: ``(H,)`` (or broadcastable) norms :math:`\|b_1\|, \|b_2\|` per head.
        domain: the polynomial's half-width :math:`a`.

    Returns:
        Tensor of the broadcast shape, differentiable in both norms: written as
        :math:`a / \max(a, \|b_1\| + \|b_2\|)`, which has zero gradient (not NaN) where the factor
        is 1, including at zero norms.
    """
    total = b1_norm + b2_norm
    return domain / torch.clamp(total, min=domain)
