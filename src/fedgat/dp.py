r"""Differential privacy of the rows a client releases for other clients' encodings.

A recipient of FedGAT encodings learns the rows they are built from (the spectral and basis attacks
of :mod:`fedgat.attacks`), so what an owner releases to other clients must itself be private. With
``FeatureDP`` every owner releases, once per round, a randomised row per node in place of its
features, and every client's encodings are built on a **block layout** of width ``d + w``:

.. math::
    \text{own node } j:\ [\,h_j,\ 0_w\,], \qquad
    \text{foreign node } j:\ [\,0_d,\ r_j\,], \qquad
    r_j = \tfrac{1}{\sqrt2}\,[\,1,\ z_j\,],

where :math:`h_j` is the owner's clean, full-dimensional feature row and :math:`z_j` (unit norm,
``w - 1`` values) the mechanism's output. So a client's own features stay clean, and foreign rows
enter through their own columns: the first layer's :math:`W = [W_A, W_B]` gives them their own
weights, which training can shrink to nothing when they carry no signal (the model then still uses
the cross-client *edges*: the constant first column marks a foreign neighbour). Rows stay unit-norm,
which the attention polynomial's domain needs (:func:`fedgat.approx.logit_scale`), and the server
computes on ``w`` columns only.

Mechanisms (:data:`MECHANISMS`), each :math:`(\varepsilon, \delta)`-DP per node, the unit of privacy
being one node's feature row (neighbouring datasets differ in the features of one node; graph
structure and labels are not protected):

``label_rr`` (default)
    Randomised response on a *predicted label*: :math:`z_j = e_{\tilde y_j}`, where
    :math:`\tilde y_j = f(h_j)` with probability :math:`e^\varepsilon / (e^\varepsilon + C - 1)` and
    each other class with probability :math:`1 / (e^\varepsilon + C - 1)` (Warner 1965; optimal for
    a ``C``-ary value at moderate :math:`\varepsilon`). :math:`f` is a label predictor trained
    federatedly before the release (:mod:`fedgat.dp_predictor`) and published to every client. The
    release is :math:`\varepsilon`-DP *whatever* :math:`f` is -- a hostile server that hands owners a
    predictor built to leak a feature still gets an :math:`\varepsilon`-DP bit (the audit's
    ``chosen_predictor`` attack measures it). Pure DP (:math:`\delta = 0`); ``w = 1 + C``.
``gaussian``
    The Gaussian mechanism on a public random projection: :math:`z_j = \mathrm{unit}(R h_j / \lVert R
    h_j\rVert + \sigma N(0, I_k))`, :math:`R \in \mathbb R^{k \times d}` with orthonormal rows seeded
    by ``seed`` (public), L2 sensitivity 2, :math:`\sigma` from the analytic Gaussian mechanism
    (Balle & Wang, ICML 2018, exact for every :math:`\varepsilon`). ``w = 1 + k``.
``multibit``
    LPGNN's multi-bit mechanism (Sajadmanesh & Gatica-Perez, CCS 2021, Algorithm 1): ``m`` of the
    ``d`` coordinates drawn at random, each reported as one bit by randomised response with
    :math:`\varepsilon / m`, rescaled to be unbiased, then scaled to unit norm. Coordinates are taken
    to lie in ``bounds`` (public; default ``(-1, 1)``, which holds for unit rows). ``m`` defaults to
    LPGNN's :math:`\max(1, \min(d, \lfloor \varepsilon / 2.18 \rfloor))`. Pure DP; ``w = 1 + d``.

Why these, measured (``benchmarks/results/dp_sweep.md``, Cora, 10 clients): a unit-norm feature row
has L2 sensitivity 2 while its class signal (the distance between class means) is ~0.3, so any
mechanism that perturbs the feature vector itself keeps almost nothing per node at
:math:`\varepsilon \le 8`; a predicted label compresses the row to the few bits that matter
before the noise, which is what lets ``label_rr`` pay. LPGNN's KProp denoising is not applied: a
recipient holds noisy rows only of foreign 1- and 2-hop nodes, one or two per neighbourhood, so
there is little to average (its GNN layers are the 1- and 2-hop aggregation). GAP-style
perturbation of neighbour *sums* is not offered for the same reason: a sum over one or two foreign
rows has the signal of one or two rows, and with node-level accounting each row pays once per sum
it enters (SECURITY.md, "Differential privacy").

Accounting: every release is charged to the owner's persistent ledger (:class:`fedgat.dp_ledger.DPLedger`,
composed with ``dp_accounting``'s PLD accountant) *before* anything is drawn; one that would exceed
the budget is refused (:class:`~fedgat.dp_ledger.BudgetExceededError`), and so is one without a
ledger (:class:`~fedgat.dp_ledger.MissingLedgerError`). One draw per node goes to every recipient
that needs the node, so colluding recipients learn nothing more than one of them.

Scope, per channel:

* Released rows against recipients (other clients): covered, :math:`(\varepsilon, \delta)` per
  node per release. For ``label_rr`` this holds for every fixed predictor, and by adaptive
  composition on top of whatever the published predictor itself reveals (the model channel below).
* Model updates and global models (the FedGAT model, and ``label_rr``'s predictor) against the
  server and other clients: *not* covered by the release -- owners train on their clean features.
  DP-FedAvg (:mod:`fedgat.dp_fedavg`, opt-in) covers that channel, the predictor's rounds included.
* Against the server the uploaded rows are protected by encryption, not by this mechanism.

Randomness: the noise, the randomised responses and the sampled coordinates always come from a
fresh :class:`fedgat.randomness.RandomSource` (ChaCha20 keyed from ``os.urandom``); a seed drives
only public choices (the projection ``seed``, the partition, the bases), never the noise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from scipy.special import log_ndtr, ndtr

from fedgat.dp_ledger import DPLedger, MissingLedgerError, ReleaseRecord
from fedgat.randomness import RandomSource

__all__ = [
    "MECHANISMS",
    "SENSITIVITY",
    "FeatureDP",
    "LabelPredictor",
    "analytic_gaussian_sigma",
    "block_rows",
    "classic_gaussian_sigma",
    "gaussian_delta",
    "multibit_bits",
    "rr_keep_probability",
]

SENSITIVITY = 2.0  # L2 distance between two unit vectors
MECHANISMS: tuple[str, ...] = ("label_rr", "gaussian", "multibit")
#: weight of the marker column and of the mechanism's unit output in a released row
_HALF = 1.0 / math.sqrt(2.0)


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float) -> float:
    """Exact delta of the Gaussian mechanism (Balle & Wang 2018, Theorem 8)."""
    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    # exp(eps) * Phi(-a-b) in log space: exp(eps) alone overflows a float from eps ~ 710
    return float(ndtr(a - b) - math.exp(min(epsilon + log_ndtr(-a - b), 700.0)))


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = SENSITIVITY) -> float:
    """Smallest ``sigma`` with the Gaussian mechanism ``(epsilon, delta)``-DP (bisection, rel. 1e-10)."""
    if epsilon <= 0 or not 0 < delta < 1:
        raise ValueError("need epsilon > 0 and 0 < delta < 1")
    lo, hi = 1e-6 * sensitivity, sensitivity
    while gaussian_delta(hi, epsilon, sensitivity) > delta:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if gaussian_delta(mid, epsilon, sensitivity) > delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-10 * hi:
            break
    return hi


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = SENSITIVITY) -> float:
    """Textbook calibration (Dwork & Roth Thm A.1; valid for epsilon < 1), for comparison."""
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def rr_keep_probability(epsilon: float, buckets: int) -> float:
    """Probability that ``buckets``-ary randomised response at ``epsilon`` reports the true value."""
    return 1.0 / (1.0 + (buckets - 1) * math.exp(-epsilon))


def multibit_bits(epsilon: float, d: int) -> int:
    """LPGNN's number of reported coordinates: ``max(1, min(d, floor(epsilon / 2.18)))``."""
    return max(1, min(d, math.floor(epsilon / 2.18)))


class LabelPredictor(Protocol):
    """What ``label_rr`` needs of a predictor: its class count and a label per feature row."""

    @property
    def num_classes(self) -> int: ...

    def labels(self, x: np.ndarray) -> np.ndarray:
        """``(n,)`` int64 predicted classes of ``(n, d)`` float rows."""
        ...


def block_rows(own: torch.Tensor, released: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The block layout of the module docstring: ``([own, 0], [0, released])``, both ``(N, d + w)``,
    from clean rows ``own`` ``(N, d)`` and released rows ``released`` ``(N, w)`` of every node (one
    dtype: ``own``'s)."""
    n = own.shape[0]
    zeros_w = torch.zeros(n, released.shape[1], dtype=own.dtype)
    zeros_d = torch.zeros(n, own.shape[1], dtype=own.dtype)
    return torch.cat([own, zeros_w], 1), torch.cat([zeros_d, released.to(own.dtype)], 1)


def _unit(a: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (a zero row stays zero)."""
    norms = np.linalg.norm(a, axis=1, keepdims=True)
    return a / np.where(norms > 0, norms, 1.0)


def _with_marker(z: np.ndarray) -> np.ndarray:
    """``[1, z] / sqrt(2)`` per row of unit rows ``z``: a released row of width ``1 + z``'s."""
    return np.hstack([np.full((len(z), 1), _HALF), _HALF * z])


@dataclass(frozen=True)
class FeatureDP:
    """Settings of the release (see the module docstring): what every party agrees on.

    Attributes:
        epsilon, delta: the per-node guarantee of one release (``delta`` is spent by ``gaussian``
            only; the pure mechanisms state their epsilon at any delta, and the ledger's budget
            delta is what composed releases are stated at).
        mechanism: one of :data:`MECHANISMS`.
        dim: ``gaussian``'s projection dimension ``k`` (None: no projection); unused otherwise.
        seed: seed of ``gaussian``'s public projection (not a secret; never seeds noise).
        bits: ``multibit``'s ``m`` (None: :func:`multibit_bits`).
        bounds: ``multibit``'s public range of a coordinate.
    """

    epsilon: float
    delta: float = 1e-5
    mechanism: str = "label_rr"
    dim: int | None = 64
    seed: int = 0
    bits: int | None = None
    bounds: tuple[float, float] = field(default=(-1.0, 1.0))

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be a finite number > 0, got {self.epsilon!r}")
        if not (isinstance(self.delta, int | float) and 0 < self.delta < 1):
            raise ValueError(f"delta must lie in (0, 1), got {self.delta!r}")
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"unknown DP mechanism {self.mechanism!r}; choose one of {MECHANISMS}")
        if self.dim is not None and self.dim < 1:
            raise ValueError(f"projection dimension must be >= 1 or None, got {self.dim}")
        if not 0 <= self.seed < 2**64:
            raise ValueError(f"projection seed must be in [0, 2^64), got {self.seed}")
        if self.bits is not None and self.bits < 1:
            raise ValueError(f"bits must be >= 1 or None, got {self.bits}")
        lo, hi = self.bounds
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"bounds must be finite with low < high, got {self.bounds}")
        object.__setattr__(self, "bounds", (float(lo), float(hi)))

    # --- shapes ------------------------------------------------------------------------------------
    @property
    def needs_predictor(self) -> bool:
        """Whether a release needs a :class:`LabelPredictor` (``label_rr``)."""
        return self.mechanism == "label_rr"

    def projected_dim(self, d: int) -> int:
        """``gaussian``'s ``k`` for ``d``-dimensional features."""
        return d if self.dim is None else min(self.dim, d)

    def width(self, d: int, num_classes: int) -> int:
        """``w``, the values per released row (marker column included)."""
        if self.mechanism == "label_rr":
            return 1 + num_classes
        if self.mechanism == "gaussian":
            return 1 + self.projected_dim(d)
        return 1 + d

    def num_bits(self, d: int) -> int:
        """``multibit``'s ``m`` for ``d`` coordinates."""
        return min(d, self.bits) if self.bits is not None else multibit_bits(self.epsilon, d)

    # --- the mechanisms ----------------------------------------------------------------------------
    @property
    def sigma(self) -> float:
        """``gaussian``'s noise standard deviation per coordinate (analytic Gaussian, sensitivity 2)."""
        return analytic_gaussian_sigma(self.epsilon, self.delta)

    def projection(self, d: int) -> torch.Tensor | None:
        """``gaussian``'s public ``(k, d)`` matrix with orthonormal rows, or None (no projection)."""
        if self.dim is None or self.dim >= d:
            return None
        g = np.random.default_rng(self.seed).standard_normal((d, self.dim))
        return torch.from_numpy(np.linalg.qr(g)[0].T.copy()).float()

    def project(self, x: np.ndarray | torch.Tensor) -> np.ndarray:
        """``gaussian``'s clean signal: the unit-norm projections ``(n, k)`` (float64)."""
        raw = np.asarray(x, dtype=np.float64)
        R = self.projection(raw.shape[1])
        return _unit(raw if R is None else raw @ R.double().numpy().T)

    def record(self, d: int, num_classes: int | None = None) -> ReleaseRecord:
        """What one release costs, as the ledger composes it (:class:`fedgat.dp_ledger.ReleaseRecord`)."""
        if self.mechanism == "gaussian":
            return ReleaseRecord.gaussian(self.sigma, SENSITIVITY)
        if self.mechanism == "label_rr":
            if num_classes is None or num_classes < 2:
                raise ValueError("label_rr's record needs the predictor's class count (>= 2)")
            return ReleaseRecord.randomized_response(self.epsilon, num_classes)
        m = self.num_bits(d)
        return ReleaseRecord.randomized_response(self.epsilon / m, 2, count=m)

    def clean_rows(self, x: np.ndarray | torch.Tensor, predictor: LabelPredictor | None = None) -> np.ndarray:
        """The noise-free released rows ``(n, w)`` (float64): the release with :math:`\\varepsilon =
        \\infty`. Never sent; the audit's ground truth in the release's space."""
        raw = np.asarray(x, dtype=np.float64)
        if self.mechanism == "label_rr":
            predictor = self._check_predictor(predictor)
            return _with_marker(np.eye(predictor.num_classes)[predictor.labels(raw)])
        if self.mechanism == "gaussian":
            return _with_marker(self.project(raw))
        return _with_marker(_unit(raw))

    def release_rows(
        self,
        x: np.ndarray | torch.Tensor,
        *,
        ledger: DPLedger | None,
        recipients: tuple[int, ...] = (),
        predictor: LabelPredictor | None = None,
        others: Iterable[DPLedger] = (),
        _test_rng: RandomSource | None = None,
    ) -> np.ndarray:
        """The release ``(n, w)`` float64 of one owner's feature rows ``x`` ``(n, d)``.

        The release is first charged to the owner's ``ledger`` (:meth:`fedgat.dp_ledger.DPLedger.charge`
        of :meth:`record` for every row of ``x`` (:func:`~fedgat.dp_ledger.row_ids`), ``recipients``);
        its randomness then comes from a fresh :class:`~fedgat.randomness.RandomSource` (ChaCha20
        keyed from ``os.urandom``): never from a seed or any other public input. ``others``: further
        ledgers whose releases of these rows count too (a simulation's other owners). ``_test_rng``
        replaces that source in tests only.

        Raises:
            MissingLedgerError: ``ledger`` is None (nothing is drawn).
            ValueError: ``label_rr`` without a predictor, or a predictor whose labels are out of range.
            BudgetExceededError: the release would exceed the ledger's budget (nothing is drawn).
        """
        if ledger is None:
            raise MissingLedgerError(
                "a DP release needs the owner's ledger (fedgat.dp_ledger.DPLedger): its budget bounds what "
                "all of the owner's releases may spend"
            )
        if _test_rng is not None and not isinstance(_test_rng, RandomSource):
            raise TypeError(f"_test_rng must be a RandomSource, not {type(_test_rng).__name__}")
        raw = np.asarray(x, dtype=np.float64)
        labels, classes = None, None
        if self.mechanism == "label_rr":
            predictor = self._check_predictor(predictor)
            classes = predictor.num_classes
            labels = np.asarray(predictor.labels(raw), dtype=np.int64)
            if labels.shape != (len(raw),) or (
                len(labels) and not 0 <= labels.min() <= labels.max() < classes
            ):
                raise ValueError(f"the predictor's labels must be {len(raw)} classes in [0, {classes})")
        ledger.charge(raw, self.record(raw.shape[1], classes), recipients, others=others)
        rng = _test_rng if _test_rng is not None else RandomSource()
        if labels is not None and classes is not None:
            return _with_marker(np.eye(classes)[_randomized_response(labels, classes, self.epsilon, rng)])
        if self.mechanism == "gaussian":
            clean = self.project(raw)
            return _with_marker(_unit(clean + self.sigma * rng.normal(clean.shape)))
        return _with_marker(_unit(self._multibit(raw, rng)))

    def _multibit(self, x: np.ndarray, rng: RandomSource) -> np.ndarray:
        """LPGNN's Algorithm 1 on rows ``x`` clipped to :attr:`bounds` (unbiased estimates)."""
        n, d = x.shape
        lo, hi = self.bounds
        m = self.num_bits(d)
        e = math.exp(self.epsilon / m)
        chosen = np.argpartition(rng.uniform((n, d)), m - 1, axis=1)[:, :m] if m < d else None
        scaled = (np.clip(x, lo, hi) - lo) / (hi - lo)
        p_one = 1.0 / (e + 1.0) + scaled * (e - 1.0) / (e + 1.0)
        bits = np.where(rng.uniform((n, d)) < p_one, 1.0, -1.0)
        if chosen is not None:
            mask = np.zeros((n, d), dtype=bool)
            np.put_along_axis(mask, chosen, True, axis=1)
            bits *= mask
        return d * (hi - lo) / (2.0 * m) * (e + 1.0) / (e - 1.0) * bits + (lo + hi) / 2.0

    def _check_predictor(self, predictor: LabelPredictor | None) -> LabelPredictor:
        if predictor is None:
            raise ValueError(
                "label_rr releases a predicted label: train the release predictor first "
                "(fedgat.dp_predictor) and pass it as predictor="
            )
        return predictor

    def describe(self) -> dict:
        out: dict = {"mechanism": self.mechanism, "epsilon": self.epsilon, "delta": self.delta}
        if self.mechanism == "gaussian":
            out.update(
                dim=self.dim,
                seed=self.seed,
                sigma=self.sigma,
                sensitivity=SENSITIVITY,
                classic_sigma=classic_gaussian_sigma(self.epsilon, self.delta),
            )
        elif self.mechanism == "multibit":
            out.update(bits=self.bits, bounds=list(self.bounds))
        return out


def _randomized_response(labels: np.ndarray, classes: int, epsilon: float, rng: RandomSource) -> np.ndarray:
    """Each label kept with :func:`rr_keep_probability`, else replaced by one of the other classes
    uniformly (one uniform draw for the coin, one for the replacement)."""
    keep = rng.uniform(len(labels)) < rr_keep_probability(epsilon, classes)
    shift = 1 + np.minimum((rng.uniform(len(labels)) * (classes - 1)).astype(np.int64), classes - 2)
    return np.where(keep, labels, (labels + shift) % classes)
