"""A data owner's persistent ledger of its DP releases, composed with ``dp_accounting``.

Each owner keeps one ledger (a JSON file, ``~/.fedgat/dp_ledger/<owner>.json`` by default; see
:func:`default_ledger_path`) holding its budget ``(epsilon, delta)`` and every release it made: which
feature rows it covered (:func:`row_ids`, a content fingerprint per row), per recipient set, what
the release cost (:class:`ReleaseRecord`: the Gaussian mechanism with its ``sigma`` and sensitivity,
or ``count`` randomised responses over ``buckets`` values at ``epsilon`` each), a count and a
timestamp. The budget is per row, the unit of the mechanisms' replace-one neighbouring: a release is
charged to every row it covers, whichever matrix the row came in. :meth:`DPLedger.charge` composes,
for each row of the new release, every past release that covered it with the new one
with Google's ``dp_accounting`` (its privacy-loss-distribution accountant under replace-one
neighbouring, which is tight for both mechanisms: one release calibrated by the analytic Gaussian at
``(epsilon, delta)`` is charged ``epsilon``, and one randomised response at ``epsilon`` is charged
``epsilon``; no hand-written composition), converts to epsilon at the budget's delta, and refuses
with :class:`BudgetExceededError` *before* anything is drawn if that exceeds the budget; otherwise it
records the release and writes the file atomically (temp file, ``os.replace``, mode 0600). Rows
with the same history share one composition, so a check costs one accountant query per distinct
history (usually one or two), not one per row.

Why per row (a red-team review, 2026-11-27): the ledger used to key a release by a hash of the whole
matrix, so the same rows released again with one row added, two rows swapped or one row dropped
counted as a new dataset with a fresh budget (each accepted at the full epsilon). Row fingerprints
are a 128-bit hash of each row's float64 values (:func:`row_ids`): the same values are the same row
in any matrix, order or subset; two different rows sharing a fingerprint would only be charged for
each other's releases (conservative, never less). A row whose values change counts as new data.
Ledgers of version 1 (whole-matrix keys) are read conservatively: each of their releases counts
against every row.

Why a lock (an eighteenth review pass): a Flower SuperNode starts a process per message, so a server
could send two runs' set-ups at once; each process loaded the ledger, each passed the check, and the
later write replaced the earlier one (two runs admitted, one charged). :meth:`DPLedger.charge` now
holds an exclusive ``flock`` on ``<ledger>.lock`` beside the file while it reads the file again,
checks and writes, and every check reads the file again first: whatever another process charged
counts.

Why persistent and never a default in-memory ledger: a budget counts every release of the same data,
across runs. A ledger created afresh for each run would let every run spend the whole budget again and
make the refusal meaningless, so a release needs a ledger object the caller holds (an in-memory one,
``DPLedger(budget)`` without a path, is for tests and one-shot simulations that say so).

Scope (see :mod:`fedgat.dp`): the accounted quantity is what *recipients* (other clients) learn from
the released rows. Releases to different recipient sets are composed together (conservatively, as if
one party received everything): recipients may collude. Without a DP release, an owner may keep a
ledger for what the *server* learns from the recipients' verdicts on its padded rows
(:mod:`fedgat.verdict_dp`; Gaussian records charged per session), composed the same way.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import math
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SENSITIVITY = 2.0  # L2 distance between two unit vectors (fedgat.dp.SENSITIVITY)
LEDGER_VERSION = 2
_READABLE_VERSIONS = (1, 2)
RECORD_KINDS = ("gaussian", "randomized_response")
_DEFAULT_GRID = 1e-4  # dp_accounting's default value_discretization_interval
_RR_GRID = 1e-8
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
    """An owner's total privacy budget ``(epsilon, delta)``: what the releases of any one of its rows
    may spend together."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise DPError(f"budget epsilon must be a finite number > 0, got {self.epsilon!r}")
        if not (isinstance(self.delta, int | float) and 0 < self.delta < 1):
            raise DPError(f"budget delta must be in (0, 1), got {self.delta!r}")


#: splitmix64's multipliers and the two hashes' seeds (any odd constants would do)
_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
_SEEDS = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03))


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _MIX[0]
    z = (z ^ (z >> np.uint64(27))) * _MIX[1]
    return z ^ (z >> np.uint64(31))


def row_ids(x: np.ndarray) -> np.ndarray:
    """``(n,)`` 16-byte fingerprints (dtype ``S16``) of the rows of ``x`` ``(n, d)``: what the ledger
    charges. Two 64-bit hashes of each row's float64 words (splitmix64-mixed with their column and
    the row length), vectorised; ``-0.0`` counts as ``0.0``. Not a cryptographic hash: a collision
    only makes two rows share their charges (conservative)."""
    a = np.ascontiguousarray(np.asarray(x, dtype=np.float64) + 0.0)  # -0.0 + 0.0 == +0.0
    if a.ndim != 2:
        raise DPError(f"row_ids needs a 2-D (rows, features) array, got shape {a.shape}")
    words = a.view(np.uint64)
    cols = np.arange(a.shape[1], dtype=np.uint64)
    out = np.empty((a.shape[0], 2), dtype="<u8")
    with np.errstate(over="ignore"):
        for k, seed in enumerate(_SEEDS):
            salt = _mix(cols * seed + seed + np.uint64(a.shape[1]))
            out[:, k] = _mix(
                np.bitwise_xor.reduce(_mix(words ^ salt) + cols, axis=1, initial=np.uint64(0)) ^ seed
            )
    return out.view("S16").reshape(-1)


def _units(data: object) -> np.ndarray:
    """The ledger units of ``data``: row fingerprints (``S16``) as given, a feature matrix's
    (:func:`row_ids`), or one unit named by a string (an opaque key, e.g. in tests)."""
    if isinstance(data, str):
        return np.array([hashlib.sha256(f"fedgat-unit:{data}".encode()).digest()[:16]], dtype="S16")
    a = np.asarray(data)
    if a.dtype == np.dtype("S16") and a.ndim == 1:
        return a
    return row_ids(a)


@dataclass(frozen=True)
class ReleaseRecord:
    """What one release costs, as the ledger stores and composes it.

    ``kind`` "gaussian": the Gaussian mechanism with ``sigma`` at L2 ``sensitivity`` (the distance
    between neighbouring inputs, 2 for unit rows); "randomized_response": ``count`` independent
    ``buckets``-ary randomised responses at ``epsilon`` each (``label_rr``: one over the classes;
    ``multibit``: ``m`` binary ones at ``epsilon / m``).
    """

    kind: str
    sigma: float = 0.0
    sensitivity: float = SENSITIVITY
    epsilon: float = 0.0
    buckets: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        def finite_positive(v: object) -> bool:
            return isinstance(v, int | float) and math.isfinite(v) and v > 0

        if self.kind not in RECORD_KINDS:
            raise DPError(f"unknown release kind {self.kind!r}; known: {RECORD_KINDS}")
        if not (isinstance(self.count, int) and self.count >= 1):
            raise DPError(f"count must be an int >= 1, got {self.count!r}")
        if self.kind == "gaussian" and not (
            finite_positive(self.sigma) and finite_positive(self.sensitivity)
        ):
            raise DPError(
                f"sigma and sensitivity must be finite numbers > 0, got {self.sigma!r}, {self.sensitivity!r}"
            )
        if self.kind == "randomized_response" and not (
            finite_positive(self.epsilon) and isinstance(self.buckets, int) and self.buckets >= 2
        ):
            raise DPError(f"epsilon must be > 0 and buckets >= 2, got {self.epsilon!r}, {self.buckets!r}")

    @classmethod
    def gaussian(cls, sigma: float, sensitivity: float = SENSITIVITY, count: int = 1) -> ReleaseRecord:
        return cls("gaussian", sigma=sigma, sensitivity=sensitivity, count=count)

    @classmethod
    def randomized_response(cls, epsilon: float, buckets: int, count: int = 1) -> ReleaseRecord:
        return cls("randomized_response", epsilon=epsilon, buckets=buckets, count=count)

    def event(self, times: int = 1) -> Any:
        """The ``dp_accounting`` event of ``times`` x ``count`` such releases (replace-one neighbouring).

        Randomised responses are composed as a list of single events, never as a
        ``SelfComposedDpEvent``: ``dp_accounting`` 0.6's PLD accountant ignores the count of a
        self-composed ``RandomizedResponseDpEvent`` (four responses at epsilon/4 come out as
        epsilon/4, not ~epsilon; pinned in ``tests/privacy/test_dp_ledger.py``)."""
        import dp_accounting  # type: ignore[import-untyped]

        n = times * self.count
        if self.kind == "gaussian":
            # under replace-one, dp_accounting's Gaussian of multiplier z has neighbours 2 apart at sigma z
            one = dp_accounting.GaussianDpEvent(self.sigma / (self.sensitivity / 2.0))
            return one if n == 1 else dp_accounting.SelfComposedDpEvent(one, n)
        noise = self.buckets / (math.exp(self.epsilon) + self.buckets - 1)  # P(uniform output)
        return dp_accounting.ComposedDpEvent(
            [dp_accounting.RandomizedResponseDpEvent(noise, self.buckets)] * n
        )

    def as_json(self) -> dict:
        if self.kind == "gaussian":
            return {"mechanism": self.kind, "sigma": self.sigma, "sensitivity": self.sensitivity}
        return {"mechanism": self.kind, "epsilon": self.epsilon, "buckets": self.buckets}

    @classmethod
    def from_json(cls, rec: dict) -> ReleaseRecord:
        """The record of a stored release (its own ``count`` is the release's, applied by the caller)."""
        if rec["mechanism"] == "gaussian":
            return cls.gaussian(float(rec["sigma"]), float(rec["sensitivity"]))
        return cls.randomized_response(float(rec["epsilon"]), int(rec["buckets"]))


def composed_epsilon(records: list[tuple[ReleaseRecord, int]], delta: float) -> float:
    """Epsilon at ``delta`` of the composition of every ``(record, times)`` (``dp_accounting``'s PLD
    accountant, replace-one neighbouring; 0 for none).

    The accountant rounds privacy losses up to a grid (pessimistic: the result is an upper bound).
    Its default grid (1e-4) puts one randomised response at epsilon 0.5 at 0.50005, over a budget of
    exactly 0.5. A randomised response's loss distribution has three points and stays sparse, so
    ledgers holding only those use a 1e-8 grid at no cost; Gaussian ones keep the default (a finer
    grid costs minutes per query).

    A query costs ~0.2 s and a run asks the same ones again (its check before anything is drawn,
    then each owner's charge), so answers are remembered per process."""
    live = tuple((r, int(times)) for r, times in records if times > 0)
    return _composed_epsilon(live, float(delta)) if live else 0.0


@functools.lru_cache(maxsize=4096)
def _composed_epsilon(live: tuple[tuple[ReleaseRecord, int], ...], delta: float) -> float:
    import dp_accounting

    pure = all(r.kind == "randomized_response" for r, _ in live)
    accountant = dp_accounting.pld.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE,
        value_discretization_interval=_RR_GRID if pure else _DEFAULT_GRID,
    )
    events = [r.event(times) for r, times in live]
    accountant.compose(dp_accounting.ComposedDpEvent(events))
    return float(accountant.get_epsilon(delta))


def default_ledger_path(owner: int | str) -> Path:
    """``$FEDGAT_DP_LEDGER_DIR/<owner>.json``, default ``~/.fedgat/dp_ledger/<owner>.json``."""
    root = os.environ.get("FEDGAT_DP_LEDGER_DIR") or os.path.join(
        os.path.expanduser("~"), ".fedgat", "dp_ledger"
    )
    return Path(root) / f"{owner}.json"


def gaussian_epsilon(noise_multipliers: list[tuple[float, int]], delta: float) -> float:
    """Epsilon at ``delta`` of the composition of ``count`` Gaussian mechanisms per ``(z, count)`` pair,
    ``z`` = sigma / sensitivity (:func:`composed_epsilon`)."""
    return composed_epsilon(
        [(ReleaseRecord.gaussian(z, 1.0), count) for z, count in noise_multipliers], delta
    )


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
                "(--dp-budget EPSILON DELTA on the command line; the dp_budget hyper-parameter or "
                "Budget(...) in Python)"
            )
        if budget is not None and stored is not None and budget != stored:
            raise LedgerFileError(f"ledger {self.path} holds budget {stored}, not the given {budget}")
        self.budget: Budget = budget if budget is not None else stored  # type: ignore[assignment]

    def __repr__(self) -> str:
        where = "in memory" if self.path is None else str(self.path)
        return f"DPLedger({where}, budget {self.budget}, {len(self.releases)} releases)"

    @classmethod
    def for_owner(cls, owner: int | str, budget: Budget | None = None) -> DPLedger:
        """The persistent ledger of ``owner`` at :func:`default_ledger_path`."""
        return cls(budget, default_ledger_path(owner))

    def _load(self) -> Budget:
        assert self.path is not None
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") not in _READABLE_VERSIONS:
                raise LedgerFileError(
                    f"ledger {self.path}: version {data.get('version')!r}, expected one of {_READABLE_VERSIONS}"
                )
            self.releases = list(data["releases"])
            for release in self.releases:
                if "rows" in release:
                    _stored_units(release)  # malformed fingerprints fail here, not at a charge
            return Budget(float(data["budget"]["epsilon"]), float(data["budget"]["delta"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            if isinstance(e, LedgerFileError):
                raise
            raise LedgerFileError(f"cannot read DP ledger {self.path}: {e}") from e

    def _refresh(self) -> None:
        """Read the file again (another process may have charged it since this object loaded it)."""
        if self.path is None or not self.path.exists():
            return
        stored = self._load()
        if stored != self.budget:
            raise LedgerFileError(f"ledger {self.path} now holds budget {stored}, not {self.budget}")

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the ledger's lock (``flock`` on ``<ledger>.lock``, created 0600, never through a
        symlink) for a read-check-write: charges of other processes wait for it."""
        if self.path is None:
            yield
            return
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = self.path.with_name(self.path.name + ".lock")
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise LedgerFileError(f"cannot open the ledger's lock {lock}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

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

    def _histories(
        self, units: np.ndarray, others: Iterable[DPLedger] = ()
    ) -> list[list[tuple[ReleaseRecord, int]]]:
        """The distinct release histories of ``units`` in this ledger and ``others``: for each, the
        ``(record, times)`` to compose (a version-1 release, keyed by a whole matrix, counts as
        covering every unit)."""
        if not len(units):
            return [[]]
        releases = [r for ledger in (self, *others) for r in ledger.releases]
        covered = np.ones((len(units), len(releases)), dtype=bool)
        for k, release in enumerate(releases):
            if "rows" in release:
                covered[:, k] = np.isin(units, _stored_units(release))
        records = [(ReleaseRecord.from_json(r), int(r["count"])) for r in releases]
        return [[records[k] for k in np.flatnonzero(h)] for h in np.unique(covered, axis=0)]

    def spent(self, data: object, *, others: Iterable[DPLedger] = ()) -> tuple[float, float]:
        """``(epsilon, delta)`` spent so far (epsilon at the budget's delta) on the most-charged unit of
        ``data`` (a feature matrix: its rows, :func:`row_ids`; row fingerprints; or a string key), by
        the releases of this ledger and of ``others`` (e.g. the other simulated owners' ledgers: a row
        that moved to another owner's index keeps its history), as their files hold them now."""
        others = list(others)
        for ledger in (self, *others):
            ledger._refresh()
        units = _units(data)
        eps = max(composed_epsilon(h, self.budget.delta) for h in self._histories(units, others))
        return eps, self.budget.delta

    def check(
        self, data: object, release: ReleaseRecord | float, *, count: int = 1, others: Iterable[DPLedger] = ()
    ) -> tuple[ReleaseRecord, int, float]:
        """What :meth:`charge` would record, without recording it: ``(one release, times, epsilon
        after)`` (the largest over the rows of ``data``, their releases in ``others`` composed too).

        Raises:
            DPError: an invalid record (e.g. ``sigma`` not finite and > 0), or ``count`` < 1.
            BudgetExceededError: the composition would exceed the budget for some row.
        """
        if not isinstance(release, ReleaseRecord):
            release = ReleaseRecord.gaussian(release)  # validated there
        if not (isinstance(count, int) and count >= 1):
            raise DPError(f"count must be an int >= 1, got {count!r}")
        # a record's own count (multibit's m bits) is part of one release
        times = count * release.count
        one = dataclasses.replace(release, count=1)
        units = _units(data)
        others = [o for o in others if o is not self]
        for ledger in (self, *others):
            ledger._refresh()  # what other processes have charged since counts too
        histories = self._histories(units, others)
        after = max(composed_epsilon(h + [(one, times)], self.budget.delta) for h in histories)
        if after > self.budget.epsilon * (1.0 + _TOLERANCE):
            before = max(composed_epsilon(h, self.budget.delta) for h in histories)
            what = (
                f"{data!r} has"  # one named unit, e.g. a client's whole dataset (DP-FedAvg's)
                if isinstance(data, str)
                else f"{len(units)} row(s), of which the most charged has"
            )
            releases = f"{times} releases ({release.kind})" if times > 1 else f"this release ({release.kind})"
            raise BudgetExceededError(
                f"DP release refused: {what} spent epsilon {before:.4g}; {releases} would bring it to "
                f"{after:.4g} at delta {self.budget.delta:g}, over the budget epsilon {self.budget.epsilon:g}"
            )
        return one, times, after

    def charge(
        self,
        data: object,
        release: ReleaseRecord | float,
        recipients: tuple[int, ...] | list[int] = (),
        *,
        count: int = 1,
        others: Iterable[DPLedger] = (),
    ) -> tuple[float, float]:
        """Record ``count`` releases of ``data`` (a feature matrix: each of its rows, :func:`row_ids`;
        row fingerprints; or a string naming one unit) to ``recipients``, each costing ``release`` (a
        :class:`ReleaseRecord`; a bare number is a Gaussian ``sigma`` at sensitivity 2), if the
        composition stays within the budget for every row (:meth:`check`, with the releases in
        ``others`` composed too; only this ledger records); return the spent ``(epsilon, delta)`` of
        the most-charged row after it.

        Raises:
            DPError: an invalid record (e.g. ``sigma`` not finite and > 0), or ``count`` < 1.
            BudgetExceededError: the composition would exceed the budget (the ledger is unchanged).
        """
        with self._exclusive():  # another process's charge waits: it reads this one's first
            one, times, after = self.check(data, release, count=count, others=others)
            units = np.unique(_units(data))
            self.releases.append(
                {
                    "rows": base64.b64encode(units.tobytes()).decode("ascii"),
                    "num_rows": len(units),
                    "recipients": sorted(int(r) for r in recipients),
                    **one.as_json(),
                    "count": times,
                    "timestamp": time.time(),
                }
            )
            try:
                self._save()
            except BaseException:
                self.releases.pop()
                raise
        return after, self.budget.delta


def _stored_units(release: dict) -> np.ndarray:
    raw = base64.b64decode(release["rows"], validate=True)
    if len(raw) % 16 or len(raw) // 16 != int(release["num_rows"]):
        raise LedgerFileError("a release's row fingerprints are malformed")
    return np.frombuffer(raw, dtype="S16")


def owner_ledgers(
    num_clients: int,
    budget: Budget | tuple[float, float] | list[float] | None = None,
    directory: str | os.PathLike | None = None,
    *,
    updates: bool = False,
) -> dict[int, DPLedger]:
    """The persistent ledgers of simulated owners ``0 .. num_clients - 1``: ``<directory>/client-<c>.json``
    (default directory: that of :func:`default_ledger_path`). ``budget`` is needed for ledgers that do
    not exist yet and must match those that do (the ``dp_budget`` and ``dp_ledger_dir``
    hyper-parameters of :mod:`fedgat.methods`).

    ``updates``: the owners' DP-FedAvg ledgers instead, ``<directory>/client-<c>-updates.json``
    (``update_dp_budget``, ``update_dp_ledger_dir``; :func:`fedgat.dp_fedavg.charge_owners`). They are
    files of their own: a training run charges one unit, the client's whole dataset, which composes
    with no row unit of the feature releases in one file (the Flower node's ``update-ledger`` is kept
    apart from its verdict ledger for the same reason)."""
    if budget is not None and not isinstance(budget, Budget):
        if len(budget) != 2:
            raise DPError(f"a budget is (epsilon, delta), got {budget!r}")
        budget = Budget(float(budget[0]), float(budget[1]))
    root = Path(directory) if directory is not None else default_ledger_path("x").parent
    if not updates:
        return {c: DPLedger(budget, root / f"client-{c}.json") for c in range(num_clients)}
    if budget is None:
        missing = [c for c in range(num_clients) if not (root / f"client-{c}-updates.json").exists()]
        if missing:
            raise MissingLedgerError(
                f"client(s) {missing} have no DP-FedAvg ledger in {root} yet: give their budget "
                "(--update-dp-budget EPSILON DELTA on the command line; the update_dp_budget hyper-parameter)"
            )
    return {c: DPLedger(budget, root / f"client-{c}-updates.json") for c in range(num_clients)}
