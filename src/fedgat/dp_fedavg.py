r"""Client-level differential privacy of the training rounds: DP-FedAvg with distributed noise.

Each client that trains in a round turns its update into

.. math::
    \tilde\Delta_k = \Delta_k \min\Bigl(1, \frac{C}{\lVert \Delta_k \rVert_2}\Bigr)
        + \mathcal N\Bigl(0, \frac{(z \cdot 2C)^2}{h} I\Bigr), \qquad \Delta_k = w_k - w,

over all weights at once (McMahan et al., ICLR 2018, "Learning differentially private recurrent
language models", with the noise split into shares as in distributed DP), and sends
:math:`w + \tilde\Delta_k` with FedAvg weight 1 and no training loss. Under secure aggregation the
server sees only :math:`\sum_k \tilde\Delta_k` (plus :math:`n w`, which it knows), whose noise has
variance :math:`(z \cdot 2C)^2` per coordinate as soon as :math:`h` honest clients' shares are in
the sum. The unit of privacy is one client's whole local dataset, replaced by any other (the
clients are known organisations, so their participation is public): the clipped updates of two
such datasets differ by at most :math:`2C` in L2 norm, and :math:`z` is the noise multiplier of the
sum relative to that sensitivity.

Accounting: a round is a Gaussian mechanism of multiplier :math:`z`; :math:`R` rounds compose to a
Gaussian mechanism of multiplier :math:`z / \sqrt R` exactly (Dong, Roth & Su 2019, Gaussian DP), so
:math:`(\varepsilon, \delta)` follows from the analytic Gaussian mechanism
(:func:`fedgat.dp.gaussian_delta`; ``dp_accounting``'s PLD accountant agrees, tested). No
amplification by client sampling is claimed: the server chooses the cohorts.

The evaluation counts are a release too. Each time a client adds its counts
:math:`v_k = (c, n, \ell)_{\text{val}, \text{test}}` to a secure sum it sends

.. math::
    \tilde v_k = v_k \min\Bigl(1, \frac{C_e}{\lVert v_k \rVert_2}\Bigr)
        + \mathcal N\Bigl(0, \frac{(z \cdot 2C_e)^2}{h} I\Bigr)

(:meth:`UpdateDP.privatize_counts`; :math:`C_e` = :attr:`UpdateDP.counts_clip`, by default 1, so
every client's counts are scaled to unit norm and the pooled accuracy is a weighted mean of the
clients' accuracies): one more Gaussian mechanism of multiplier :math:`z`. A client's ledger counts
its *releases*, training rounds and evaluations alike, and a run of :math:`R` releases spends the
budget of multiplier :math:`z / \sqrt R`; the client refuses a release past
:attr:`UpdateDP.max_releases` (:class:`UpdateBudgetError`), :attr:`~UpdateDP.max_rounds` training
rounds plus :attr:`~UpdateDP.max_evaluations` evaluations (by default as many as rounds: the round
loop evaluates every round's model once). Before frame version 11 the counts were neither noised nor
charged, and differencing evaluation-only rounds read one client's counts at no budget (SECURITY.md,
known break 12).

Scope, said plainly:

* Covered, against the server and anyone who sees the global models (other clients): the updates,
  hence the global models, when at least :math:`h` honest clients that trained survive each round.
  A client unmasks a trained sum only with at least ``min_cohort`` trained survivors in it (each
  advert says, signed, whether its input carries an update: frame version 10; before, a server
  could leave the target the only trainer of a full cohort, its update under one share of noise,
  SECURITY.md known break 11), and a split of the survivors takes
  :math:`2t - n \ge` ``min_cohort`` :math:`- 1` colluders (known break 18), so a server colluding
  with :math:`c` clients needs ``min_cohort`` :math:`\ge h + c` (the defaults, 3 and :math:`h = 2`,
  tolerate one colluder). This is what stops the differencing of
  secure sums across rounds (SECURITY.md, known break 2): each difference carries the noise of the
  rounds it subtracts.
* Covered the same way: the pooled evaluation counts (clipped, noised and charged as above; a
  member's counts count as a contributor's under DP-FedAvg, its noise share being what :math:`h`
  counts on). Under DP-FedAvg the server asks for the validation and test counts together, once per
  round (one release), also without secure aggregation.
* Not covered: the graph structure, and the rows released in pre-training (:mod:`fedgat.dp`, its
  own ledger). With the ``label_rr`` release the predictor's rounds (:mod:`fedgat.dp_predictor`)
  run under the same settings and count against the same budget (:func:`training_rounds`).
* Without secure aggregation (``secagg=None``) the server sees each release with one share of the
  noise, :math:`z / \sqrt h`: the stated epsilon assumes the secure sum.
* The noise is a float64 Gaussian from :class:`fedgat.randomness.RandomSource` (ChaCha20 keyed from
  ``os.urandom``). Each client's noised weights are cast to the model's dtype (float32: a spacing of
  up to 1/16 at the server-chosen ``|w| <= 10^6``) before the secure sum's fixed point
  (:math:`2^{-48}`); a twelfth review pass computed the rounded sums' exact distributions and found
  them no less private than the unrounded Gaussian the accountant assumes. Floating-point attacks on
  the Gaussian's low bits (Mironov 2012) are not addressed.
* Nothing a client does observably depends on its data before the noise: a release is charged
  before the client trains or evaluates, a diverged update is released as the zero update and a
  non-finite count as 0 (:meth:`UpdateDP.privatize`), and a global model with a weight within
  :attr:`UpdateDP.headroom` of the protocol's limit is refused before training, so that the noised
  weights never reach the limit (a twelfth review pass read one exact bit of a client's data off
  the refusal of a diverged update).

Utility: the noise on the mean update has norm about :math:`2 z C \sqrt{P n / h} / n` for :math:`P`
weights and :math:`n` clients, against a signal of norm at most :math:`C`: with few clients and
large models (10 organisations, FedGAT's 92,373 weights on Cora) it swamps the signal: 133x to
7,170x for :math:`\varepsilon` from 64 down to 1 (the budget paying for the evaluations too), and
test accuracy at chance level (0.08-0.20 against 0.79-0.81 without DP;
``benchmarks/results/dp_fedavg.*``). It is off by default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from fedgat.dp import analytic_gaussian_sigma, gaussian_delta
from fedgat.dp_ledger import DPLedger, ReleaseRecord
from fedgat.randomness import RandomSource
from fedgat.rounds import Counts

__all__ = [
    "COUNTS_CLIP",
    "DP_NEEDS_SECAGG",
    "UPDATE_UNIT",
    "UpdateBudgetError",
    "UpdateDP",
    "charge_owners",
    "charge_training",
    "check_owners",
    "training_rounds",
    "update_dp_from_hparams",
]

StateDict = Mapping[str, torch.Tensor]

#: default L2 bound of a client's evaluation counts: every client's counts scaled to unit norm (the
#: noise is relative to the clip, so a larger one buys nothing once it binds)
COUNTS_CLIP = 1.0
#: why a run under DP-FedAvg refuses plaintext updates
DP_NEEDS_SECAGG = (
    "DP-FedAvg needs secure aggregation: its noise is split into shares that only the secure sum "
    "adds up (alone, each release carries one share)"
)


#: the ledger unit a run's DP-FedAvg releases are charged to (:func:`charge_training`): the client's
#: whole local dataset, DP-FedAvg's unit of privacy, the same unit in every run
UPDATE_UNIT = "dp-fedavg:local-dataset"

#: how many of its noise share's standard deviations a released weight may move before the weight
#: limit is in reach (:attr:`UpdateDP.headroom`): a draw that far out has probability below 1e-88
NOISE_TAIL_SIGMAS = 20.0


class UpdateBudgetError(ValueError):
    """A client was asked for a release (training or evaluation) past what its DP budget pays for;
    nothing was sent."""


@dataclass(frozen=True)
class UpdateDP:
    r"""DP-FedAvg settings shared by the server and every client (see the module docstring).

    Attributes:
        clip: :math:`C`, the L2 bound of each client's update (all weights together).
        noise_multiplier: :math:`z`, the noise std of the round's sum over its sensitivity :math:`2C`.
        max_rounds: training rounds the budget pays for.
        delta: the :math:`\delta` at which epsilons are stated.
        honest: :math:`h`, the honest clients whose shares the guarantee counts on per round.
        max_evaluations: evaluations (counts releases) the budget pays for; None: ``max_rounds``.
        counts_clip: :math:`C_e`, the L2 bound of a client's evaluation counts (all splits together).

    A client makes at most :attr:`max_releases` releases, updates and counts alike; the accountant's
    :math:`R` counts them all.
    """

    clip: float
    noise_multiplier: float
    max_rounds: int
    delta: float = 1e-5
    honest: int = 2
    max_evaluations: int | None = None
    counts_clip: float = COUNTS_CLIP

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip must be a finite number > 0, got {self.clip!r}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise ValueError(f"noise_multiplier must be a finite number > 0, got {self.noise_multiplier!r}")
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {self.max_rounds!r}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {self.delta!r}")
        if self.honest < 1:
            raise ValueError(f"honest must be >= 1, got {self.honest!r}")
        if self.max_evaluations is not None and self.max_evaluations < 0:
            raise ValueError(f"max_evaluations must be >= 0 or None, got {self.max_evaluations!r}")
        if not (math.isfinite(self.counts_clip) and self.counts_clip > 0):
            raise ValueError(f"counts_clip must be a finite number > 0, got {self.counts_clip!r}")

    @property
    def evaluations(self) -> int:
        """Evaluations the budget pays for (:attr:`max_evaluations`, or :attr:`max_rounds` if None)."""
        return self.max_rounds if self.max_evaluations is None else self.max_evaluations

    @property
    def max_releases(self) -> int:
        """Releases a client makes at most: :attr:`max_rounds` updates plus :attr:`evaluations`."""
        return self.max_rounds + self.evaluations

    @classmethod
    def for_budget(
        cls,
        epsilon: float,
        delta: float,
        rounds: int,
        clip: float = 1.0,
        honest: int = 2,
        evaluations: int | None = None,
        counts_clip: float = COUNTS_CLIP,
    ) -> UpdateDP:
        """The smallest noise multiplier for which ``rounds`` training rounds and ``evaluations``
        evaluations (None: as many as rounds) are together ``(epsilon, delta)``-DP."""
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must lie in (0, 1), got {delta!r}")
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds!r}")
        evaluations = rounds if evaluations is None else evaluations
        if evaluations < 0:
            raise ValueError(f"evaluations must be >= 0, got {evaluations!r}")
        releases = rounds + evaluations
        z = math.sqrt(releases) * analytic_gaussian_sigma(epsilon, delta, sensitivity=1.0)
        return cls(
            float(clip), z, int(rounds), float(delta), int(honest), int(evaluations), float(counts_clip)
        )

    @property
    def share_std(self) -> float:
        """Std of each client's noise share, per weight: :math:`2 z C / \\sqrt h`."""
        return 2.0 * self.noise_multiplier * self.clip / math.sqrt(self.honest)

    def epsilon(self, releases: int, delta: float | None = None) -> float:
        """Epsilon at ``delta`` (default :attr:`delta`) after ``releases`` releases -- training
        rounds and evaluations -- (0 for none): the smallest epsilon whose exact delta for the
        composed Gaussian of multiplier :math:`z/\\sqrt R` is at most ``delta`` (bisection to float
        precision)."""
        delta = self.delta if delta is None else delta
        if releases <= 0:
            return 0.0
        sigma = self.noise_multiplier / math.sqrt(releases)
        lo, hi = 0.0, 1.0
        while gaussian_delta(sigma, hi, 1.0) > delta:
            hi *= 2.0
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if gaussian_delta(sigma, mid, 1.0) > delta:
                lo = mid
            else:
                hi = mid
        return hi

    def privatize(
        self, state: StateDict, reference: StateDict, rng: RandomSource | None = None
    ) -> dict[str, torch.Tensor]:
        """``reference + clip(state - reference) + noise share`` over all floating-point weights
        (float64 arithmetic, cast back to each weight's dtype). An update holding NaN or infinite
        values is replaced by the zero update before the clip: still a release of sensitivity
        ``clip``, and nothing about it is decided on un-noised values (a client that refused a
        diverged update told the server one exact bit of its data). ``rng``: a test's stream; by
        default a fresh :class:`~fedgat.randomness.RandomSource` (OS CSPRNG)."""
        names = [k for k, v in reference.items() if v.is_floating_point()]
        delta = torch.cat([(state[k].double() - reference[k].double()).reshape(-1) for k in names])
        if not bool(torch.isfinite(delta).all()):
            delta = torch.zeros_like(delta)
        norm = float(torch.linalg.vector_norm(delta))
        if norm > self.clip:
            delta = delta * (self.clip / norm)
        source = rng if rng is not None else RandomSource()
        noisy = delta + torch.from_numpy(source.normal(delta.numel())) * self.share_std
        out, start = dict(state), 0
        for k in names:
            n = reference[k].numel()
            part = noisy[start : start + n].reshape(reference[k].shape)
            out[k] = (reference[k].double() + part).to(reference[k].dtype)
            start += n
        return out

    def privatize_counts(
        self, counts: Mapping[str, Counts], rng: RandomSource | None = None
    ) -> dict[str, Counts]:
        """Evaluation counts as a release: the splits' ``(correct, count, loss_sum)`` as one vector,
        scaled to L2 norm :attr:`counts_clip` when longer, plus a noise share of std
        :attr:`counts_share_std` per entry (float values; the pooled sums are post-processed by
        :func:`fedgat.rounds.pool_counts`). A NaN or infinite entry (a loss that overflowed) counts
        as 0 before the clip, as :meth:`privatize` zeroes a non-finite update. ``rng`` as in
        :meth:`privatize`."""
        names = list(counts)
        vector = np.array([float(v) for s in names for v in counts[s]], dtype=np.float64)
        vector[~np.isfinite(vector)] = 0.0
        norm = float(np.linalg.norm(vector))
        if norm > self.counts_clip:
            vector *= self.counts_clip / norm
        source = rng if rng is not None else RandomSource()
        vector = vector + source.normal(vector.size) * self.counts_share_std
        return {s: Counts(*(float(v) for v in vector[3 * i : 3 * i + 3])) for i, s in enumerate(names)}

    @property
    def headroom(self) -> float:
        """How far a released weight may move from the global one it was trained from: the clip
        plus :data:`NOISE_TAIL_SIGMAS` noise shares. A client checks that the global model leaves
        this much room below the protocol's weight limit before it trains: a release that reached
        the limit would be refused, and whether it does would depend on its data (a twelfth
        review pass)."""
        return self.clip + NOISE_TAIL_SIGMAS * self.share_std

    @property
    def counts_share_std(self) -> float:
        """Std of each client's noise share, per count: :math:`2 z C_e / \\sqrt h`."""
        return 2.0 * self.noise_multiplier * self.counts_clip / math.sqrt(self.honest)

    def record(self) -> ReleaseRecord:
        """One release (a training round or an evaluation) as a :class:`~fedgat.dp_ledger.DPLedger`
        composes it: the Gaussian mechanism of multiplier :math:`z` (std :math:`z` at sensitivity 1)."""
        return ReleaseRecord.gaussian(self.noise_multiplier, sensitivity=1.0)

    def describe(self) -> dict:
        """Settings and the budget they spend over :attr:`max_releases`."""
        return {
            "mechanism": "DP-FedAvg, distributed Gaussian noise before secure aggregation",
            "clip": self.clip,
            "counts_clip": self.counts_clip,
            "noise_multiplier": self.noise_multiplier,
            "honest": self.honest,
            "max_rounds": self.max_rounds,
            "max_evaluations": self.evaluations,
            "epsilon": self.epsilon(self.max_releases),
            "delta": self.delta,
        }


def charge_training(ledger: DPLedger, dp: UpdateDP) -> tuple[float, float]:
    """Charge a run's DP-FedAvg releases (all :attr:`UpdateDP.max_releases` of them, before the first:
    a run the server ends early has still spent them) to a client's persistent ``ledger``, under
    :data:`UPDATE_UNIT`, and return the ``(epsilon, delta)`` it has spent on them after this run.

    ``UpdateDP`` bounds one run; the ledger bounds the runs a server may start with the same data
    (on Flower, a node's ``update-ledger``: :func:`fedgat.protocols.flower_client._update_policy`).
    The composition is ``dp_accounting``'s (:meth:`~fedgat.dp_ledger.DPLedger.charge`), which agrees
    with :meth:`UpdateDP.epsilon` to its grid.

    Raises:
        fedgat.dp_ledger.BudgetExceededError: the run would pass the ledger's budget (the ledger is
            unchanged, nothing was released).
    """
    return ledger.charge(UPDATE_UNIT, dp.record(), count=dp.max_releases)


def charge_owners(ledgers: Mapping[int, DPLedger], dp: UpdateDP) -> dict[int, tuple[float, float]]:
    """:func:`charge_training` for every client of a simulated run (client id -> its ledger, e.g.
    :func:`fedgat.dp_ledger.owner_ledgers` with ``updates=True``), every ledger checked before any is
    charged; returns client id -> ``(epsilon, delta)`` spent after this run.

    Raises:
        fedgat.dp_ledger.BudgetExceededError: some client's run would pass its budget; no ledger was
            charged (unless another process charged one between the checks and the charges).
    """
    check_owners(ledgers, dp)
    return {c: charge_training(ledger, dp) for c, ledger in ledgers.items()}


def check_owners(ledgers: Mapping[int, DPLedger], dp: UpdateDP, runs: int = 1) -> None:
    """Whether every client's ledger can pay for ``runs`` runs of ``dp`` (nothing is charged).

    Raises:
        fedgat.dp_ledger.BudgetExceededError: some client's ledger cannot.
    """
    for ledger in ledgers.values():
        ledger.check(UPDATE_UNIT, dp.record(), count=runs * dp.max_releases)


def training_rounds(hp: Mapping) -> int:
    """Rounds a client of a run trains in at most: ``rounds``, plus ``dp_predictor_rounds`` when the
    run's DP release trains a label predictor first (``dp_mechanism`` "label_rr", :mod:`fedgat.dp_predictor`)."""
    extra = 0
    if hp.get("dp_epsilon") is not None and hp.get("dp_mechanism") == "label_rr":
        extra = int(hp["dp_predictor_rounds"])
    return int(hp["rounds"]) + extra


def update_dp_from_hparams(hp: Mapping) -> UpdateDP | None:
    """The DP-FedAvg settings a method's hyper-parameters ask for: ``update_dp_epsilon`` (None: off)
    over :func:`training_rounds` rounds (the release predictor's included) and as many evaluations,
    at ``update_dp_delta``, clipping at ``update_dp_clip``."""
    epsilon = hp.get("update_dp_epsilon")
    if epsilon is None:
        return None
    return UpdateDP.for_budget(
        float(epsilon),
        float(hp.get("update_dp_delta", 1e-5)),
        training_rounds(hp),
        float(hp.get("update_dp_clip", 1.0)),
    )
