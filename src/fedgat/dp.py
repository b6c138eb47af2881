r"""Differential privacy for the features a client shares for cross-client use.

Mechanism: each client releases, once, a noisy copy of every node feature vector that other
clients' encodings will use,

.. math::
    y_j = \frac{R h_j}{\lVert R h_j \rVert} + \mathcal N(0, \sigma^2 I_k), \qquad
    \tilde h_j = \frac{y_j}{\lVert y_j \rVert},

where :math:`R \in \mathbb{R}^{k \times d}` is a public random matrix with orthonormal rows
(``k = d`` means no projection). The released vector before noise has unit norm, so replacing one
node's features moves it by at most :math:`\Delta_2 = 2` in L2 norm. :math:`\sigma` is the
smallest noise that makes the Gaussian mechanism :math:`(\varepsilon, \delta)`-DP for that
sensitivity, computed with the *analytic* Gaussian mechanism (Balle & Wang, ICML 2018), which is
exact for every :math:`\varepsilon` (the textbook :math:`\sigma = \Delta\sqrt{2\ln(1.25/\delta)}/\varepsilon`
holds only for :math:`\varepsilon < 1` and is loose).

The final renormalisation is post-processing (free in privacy terms) and is what keeps FedGAT sound:
the layer's logit scaling guarantees the attention polynomial is evaluated inside its fitted domain
only for unit-norm features (:func:`fedgat.approx.logit_scale`). An unnormalised release has norm
~ :math:`\sigma\sqrt k` (60 at :math:`\varepsilon = 1`, ``k = 64``), which pushed the logits far
outside the domain and collapsed training to below-chance accuracy (measured: 0.15 on Cora) before
this step was added. It also bounds every released value by 1, well inside CKKS's headroom.

Accounting and scope, per channel. The unit of privacy is one node's feature vector (neighbouring
datasets differ in the features of one node); graph structure is not protected.

* Released rows against recipients (other clients): covered. What a client receives about another
  owner's nodes (encodings built from the release, in the encrypted round or the plaintext paths) is
  post-processing of the release, so one release is :math:`(\varepsilon, \delta)`-DP per node
  against them. Releases compose: every release is charged to the owner's persistent ledger
  (:class:`fedgat.dp_ledger.DPLedger`, composed with ``dp_accounting``) *before* its noise is drawn,
  and one that would exceed the owner's budget is refused (:class:`~fedgat.dp_ledger.BudgetExceededError`);
  a release without a ledger is refused too (:class:`~fedgat.dp_ledger.MissingLedgerError`).
* Model updates against the server (and, through the global model, against other clients): not
  covered by this release. Owners train on their *clean* features, so the updates and the global
  model depend on them directly and are not post-processing of the release (secure aggregation hides
  individual updates, not the aggregate). DP-FedAvg (:mod:`fedgat.dp_fedavg`, opt-in) covers that
  channel with its own client-level (epsilon, delta).
* Against the server the uploaded rows are protected by encryption, not by this mechanism.

The noise always comes from a fresh :class:`fedgat.randomness.RandomSource` (ChaCha20 keyed from
``os.urandom``); a seed drives only public choices (the projection ``FeatureDP.seed``, the partition,
the bases), never the noise, so nobody can subtract it from public inputs.

Encrypted pre-training (:mod:`fedgat.protocols.pretrain`, ``PretrainConfig.dp``): each client
computes :meth:`FeatureDP.release_rows` of its own nodes -- the clean projection and the release,
charged to its ledger -- and uploads both, encrypted. The server builds the encodings a client
receives from that client's clean ciphertexts for the sources it owns and from the released
ciphertexts for every other source, so no client ever receives a result that depends on another
client's clean copy.

The projection is what makes moderate :math:`\varepsilon` usable: the noise norm grows like
:math:`\sigma\sqrt{k}`, so on Cora's 1433 dimensions plain Gaussian noise at
:math:`\varepsilon = 4` is ~90x the feature norm (NOTES), while ``k = 64`` cuts that by ~4.7x.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.special import log_ndtr, ndtr

from fedgat.dp_ledger import DPLedger, MissingLedgerError, dataset_id
from fedgat.randomness import RandomSource

SENSITIVITY = 2.0  # L2 distance between two unit vectors


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


def _unit_rows(y: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit L2 norm (a zero row, probability 0 under Gaussian noise, stays zero)."""
    return torch.nn.functional.normalize(y, dim=1)


@dataclass(frozen=True)
class FeatureDP:
    """Settings of the feature-release mechanism (see the module docstring).

    Attributes:
        epsilon, delta: the per-node guarantee.
        dim: projection dimension ``k`` (``None``: no projection).
        seed: seed of the public projection matrix (shared by all parties; not a secret).
    """

    epsilon: float
    delta: float = 1e-5
    dim: int | None = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0) or not 0 < self.delta < 1:
            raise ValueError(f"need epsilon > 0 and 0 < delta < 1, got ({self.epsilon}, {self.delta})")
        if self.dim is not None and self.dim < 1:
            raise ValueError(f"projection dimension must be >= 1 or None, got {self.dim}")
        if not 0 <= self.seed < 2**64:
            raise ValueError(f"projection seed must be in [0, 2^64), got {self.seed}")

    def projected_dim(self, d: int) -> int:
        """Dimension of the projected features of ``d``-dimensional inputs."""
        return d if self.dim is None else min(self.dim, d)

    @property
    def sigma(self) -> float:
        return analytic_gaussian_sigma(self.epsilon, self.delta)

    def projection(self, d: int) -> torch.Tensor | None:
        """``(k, d)`` public matrix with orthonormal rows, or None."""
        if self.dim is None or self.dim >= d:
            return None
        g = np.random.default_rng(self.seed).standard_normal((d, self.dim))
        return torch.from_numpy(np.linalg.qr(g)[0].T.copy()).float()

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The clean, projected, unit-norm features every party's model uses."""
        R = self.projection(x.shape[1])
        y = x if R is None else x @ R.T.to(x.dtype)
        return torch.nn.functional.normalize(y, dim=1)

    def release(
        self, x: torch.Tensor, *, ledger: DPLedger | None, recipients: tuple[int, ...] = ()
    ) -> torch.Tensor:
        """The release of features ``x`` ``(N, d)``: projected, unit norm, plus Gaussian noise,
        renormalised (:meth:`release_rows`, same dtype as ``x``)."""
        _, rows = self.release_rows(x, ledger=ledger, recipients=recipients)
        return torch.from_numpy(rows).to(x.dtype)

    def release_rows(
        self,
        x: np.ndarray | torch.Tensor,
        *,
        ledger: DPLedger | None,
        recipients: tuple[int, ...] = (),
        _test_rng: RandomSource | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(clean, release)`` float64 ``(N, k)`` rows of the features ``x`` ``(N, d)`` of one owner.

        ``clean`` is :meth:`project` (computed in float64); ``release`` adds ``sigma`` times standard
        normal noise and renormalises each row (see the module docstring). The release is first charged
        to the owner's ``ledger`` (:meth:`fedgat.dp_ledger.DPLedger.charge`, dataset
        :func:`~fedgat.dp_ledger.dataset_id` of ``x``, ``recipients``); the noise is then drawn from a
        fresh :class:`~fedgat.randomness.RandomSource` (ChaCha20 keyed from ``os.urandom``): it never
        derives from a seed or any other public input. ``_test_rng`` replaces that source in tests only.

        Raises:
            MissingLedgerError: ``ledger`` is None (nothing is drawn).
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
        clean = self.project(torch.from_numpy(raw)).numpy()
        ledger.charge(dataset_id(raw), self.sigma, recipients)
        noise = (_test_rng if _test_rng is not None else RandomSource()).normal(clean.shape)
        return clean, _unit_rows(torch.from_numpy(clean + self.sigma * noise)).numpy()

    def describe(self) -> dict:
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "dim": self.dim,
            "sigma": self.sigma,
            "sensitivity": SENSITIVITY,
            "classic_sigma": classic_gaussian_sigma(self.epsilon, self.delta),
            "expected_noise_norm": self.sigma * math.sqrt(self.dim or float("nan")),
        }
