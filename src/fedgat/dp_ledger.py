"""A data owner's persistent ledger of its DP releases, composed with ``dp_accounting``.

Each owner keeps one ledger (a JSON file, ``~/.fedgat/dp_ledger/<owner>.json`` by default; see
:func:`default_ledger_path`) holding its budget ``(epsilon, delta)`` and every release it made: per
dataset (a content hash of the owner's feature matrix, :func:`dataset_id`), per recipient set, the
mechanism (Gaussian, ``sigma`` and sensitivity 2, so noise multiplier ``sigma / 2``), a count and a
timestamp. :meth:`DPLedger.charge` composes every past release of the same dataset with the new one
with Google's ``dp_accounting`` (its privacy-loss-distribution accountant over ``GaussianDpEvent``s,
which is tight for the Gaussian mechanism: one release calibrated by the analytic Gaussian at
``(epsilon, delta)`` is charged ``epsilon``, where an RDP accountant would charge ~8% more; no
hand-written composition), converts to epsilon at the budget's delta, and refuses with
:class:`BudgetExceededError` *before* the noise is drawn if that exceeds the budget; otherwise it
records the release and writes the file atomically (temp file, ``os.replace``, mode 0600).

Why persistent and never a default in-memory ledger: a budget counts every release of the same data,
across runs. A ledger created afresh for each run would let every run spend the whole budget again and
make the refusal meaningless, so a release needs a ledger object the caller holds (an in-memory one,
``DPLedger(budget)`` without a path, is for tests and one-shot simulations that say so).

Scope (see :mod:`fedgat.dp`): the accounted quantity is what *recipients* (other clients) learn from
the released rows. Releases to different recipient sets are composed together (conservatively, as if
one party received everything): recipients may collude.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SENSITIVITY = 2.0  # L2 distance between two unit vectors (fedgat.dp.SENSITIVITY)
LEDGER_VERSION = 1
_TOLERANCE = 1e-9  # relative slack on the budget comparison (the accountant's float rounding)


class DPError(ValueError):
    """Base class of the DP ledger's errors: nothing was released."""


class BudgetExceededError(DPError):
    """The requested release would spend more than the owner's budget."""


class MissingLedgerError(DPError):
    """A DP release was requested without a ledger to charge."""


class LedgerFileError(DPError):
    """The ledger file cannot be read (corrupt, other version) or contradicts the given budget."""


@dataclass(frozen=True)
class Budget:
    """An owner's total privacy budget ``(epsilon, delta)`` over all its releases of one dataset."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise DPError(f"budget epsilon must be a finite number > 0, got {self.epsilon!r}")
        if not (isinstance(self.delta, int | float) and 0 < self.delta < 1):
            raise DPError(f"budget delta must be in (0, 1), got {self.delta!r}")


def dataset_id(x: np.ndarray) -> str:
    """Content hash (SHA-256, shape and float64 bytes) of an owner's feature matrix: the ledger's key."""
    a = np.ascontiguousarray(np.asarray(x, dtype=np.float64))
    h = hashlib.sha256(f"fedgat-dataset:{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def default_ledger_path(owner: int | str) -> Path:
    """``$FEDGAT_DP_LEDGER_DIR/<owner>.json``, default ``~/.fedgat/dp_ledger/<owner>.json``."""
    root = os.environ.get("FEDGAT_DP_LEDGER_DIR") or os.path.join(
        os.path.expanduser("~"), ".fedgat", "dp_ledger"
    )
    return Path(root) / f"{owner}.json"


def gaussian_epsilon(noise_multipliers: list[tuple[float, int]], delta: float) -> float:
    """Epsilon at ``delta`` of the composition of ``count`` Gaussian mechanisms per ``(z, count)`` pair
    (``dp_accounting``'s PLD accountant; ``z`` = sigma / sensitivity)."""
    import dp_accounting  # type: ignore[import-untyped]

    events = [
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), count)
        for z, count in noise_multipliers
        if count > 0
    ]
    if not events:
        return 0.0
    accountant = dp_accounting.pld.PLDAccountant()
    accountant.compose(dp_accounting.ComposedDpEvent(events))
    return float(accountant.get_epsilon(delta))


class DPLedger:
    """One owner's ledger (see the module docstring).

    Args:
        budget: the owner's budget. With ``path`` of an existing ledger it must equal the stored one
            (None: take the stored one).
        path: the JSON file (None: in memory only -- tests and simulations that say so).
    """

    def __init__(self, budget: Budget | None = None, path: str | os.PathLike | None = None) -> None:
        self.path = None if path is None else Path(path)
        self.releases: list[dict] = []
        stored: Budget | None = None
        if self.path is not None and self.path.exists():
            stored = self._load()
        if budget is None and stored is None:
            raise DPError(
                f"a new DP ledger ({self.path or 'in memory'}) needs the owner's budget (epsilon, delta) "
                "(the dp_budget hyper-parameter, or Budget(...))"
            )
        if budget is not None and stored is not None and budget != stored:
            raise LedgerFileError(f"ledger {self.path} holds budget {stored}, not the given {budget}")
        self.budget: Budget = budget if budget is not None else stored  # type: ignore[assignment]

    @classmethod
    def for_owner(cls, owner: int | str, budget: Budget | None = None) -> DPLedger:
        """The persistent ledger of ``owner`` at :func:`default_ledger_path`."""
        return cls(budget, default_ledger_path(owner))

    def _load(self) -> Budget:
        assert self.path is not None
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") != LEDGER_VERSION:
                raise LedgerFileError(f"ledger {self.path}: version {data.get('version')!r}, expected 1")
            self.releases = list(data["releases"])
            return Budget(float(data["budget"]["epsilon"]), float(data["budget"]["delta"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            if isinstance(e, LedgerFileError):
                raise
            raise LedgerFileError(f"cannot read DP ledger {self.path}: {e}") from e

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        payload = {
            "version": LEDGER_VERSION,
            "budget": {"epsilon": self.budget.epsilon, "delta": self.budget.delta},
            "releases": self.releases,
        }
        fd, tmp = tempfile.mkstemp(prefix=".dp_ledger-", dir=self.path.parent)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(payload, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def _multipliers(self, dataset: str) -> list[tuple[float, int]]:
        return [
            (r["sigma"] / r["sensitivity"], int(r["count"])) for r in self.releases if r["dataset"] == dataset
        ]

    def spent(self, dataset: str) -> tuple[float, float]:
        """``(epsilon, delta)`` spent so far on ``dataset`` (epsilon at the budget's delta)."""
        return gaussian_epsilon(self._multipliers(dataset), self.budget.delta), self.budget.delta

    def charge(
        self, dataset: str, sigma: float, recipients: tuple[int, ...] | list[int] = (), *, count: int = 1
    ) -> tuple[float, float]:
        """Record ``count`` Gaussian releases (``sigma``, sensitivity 2) of ``dataset`` to ``recipients``
        if the composition stays within the budget; return the spent ``(epsilon, delta)`` after it.

        Raises:
            DPError: ``sigma`` not finite and > 0, or ``count`` < 1.
            BudgetExceededError: the composition would exceed the budget (the ledger is unchanged).
        """
        if not (isinstance(sigma, int | float) and math.isfinite(sigma) and sigma > 0):
            raise DPError(f"sigma must be a finite number > 0, got {sigma!r}")
        if not (isinstance(count, int) and count >= 1):
            raise DPError(f"count must be an int >= 1, got {count!r}")
        before, _ = self.spent(dataset)
        after = gaussian_epsilon(
            self._multipliers(dataset) + [(sigma / SENSITIVITY, count)], self.budget.delta
        )
        if after > self.budget.epsilon * (1.0 + _TOLERANCE):
            raise BudgetExceededError(
                f"DP release refused: dataset {dataset[:12]} has spent epsilon {before:.4g}; this release "
                f"(sigma {sigma:.4g}) would bring it to {after:.4g} at delta {self.budget.delta:g}, over "
                f"the budget epsilon {self.budget.epsilon:g}"
            )
        self.releases.append(
            {
                "dataset": dataset,
                "recipients": sorted(int(r) for r in recipients),
                "mechanism": "gaussian",
                "sigma": float(sigma),
                "sensitivity": SENSITIVITY,
                "count": count,
                "timestamp": time.time(),
            }
        )
        try:
            self._save()
        except BaseException:
            self.releases.pop()
            raise
        return after, self.budget.delta


def owner_ledgers(
    num_clients: int,
    budget: Budget | tuple[float, float] | list[float] | None = None,
    directory: str | os.PathLike | None = None,
) -> dict[int, DPLedger]:
    """The persistent ledgers of simulated owners ``0 .. num_clients - 1``: ``<directory>/client-<c>.json``
    (default directory: that of :func:`default_ledger_path`). ``budget`` is needed for ledgers that do
    not exist yet and must match those that do (the ``dp_budget`` and ``dp_ledger_dir``
    hyper-parameters of :mod:`fedgat.methods`)."""
    if budget is not None and not isinstance(budget, Budget):
        if len(budget) != 2:
            raise DPError(f"a budget is (epsilon, delta), got {budget!r}")
        budget = Budget(float(budget[0]), float(budget[1]))
    root = Path(directory) if directory is not None else default_ledger_path("x").parent
    return {c: DPLedger(budget, root / f"client-{c}.json") for c in range(num_clients)}
