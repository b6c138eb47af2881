r"""Message types of the federated training rounds (ids 10-12, 14; see :mod:`fedgat.protocols.messages`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .codec import Bool, Float64, ListOf, NamedArrays, Record, Text
from .errors import PayloadError
from .frame import MAX_MODEL_ELEMS, U32, KiB, Message, MiB

__all__ = [
    "MAX_WEIGHT_ABS",
    "EvaluateRequest",
    "EvaluationReport",
    "GlobalModel",
    "LocalUpdate",
    "SplitCounts",
    "check_splits",
    "check_weights",
]

#: largest absolute value a model weight may have on the wire (GlobalModel, LocalUpdate). Trained
#: GAT weights are O(1); a server that sends e.g. 1e38 makes a client's training overflow to inf/NaN,
#: so such a model is refused before any training.
MAX_WEIGHT_ABS = 1e6


@dataclass(frozen=True)
class SplitCounts:
    """Evaluation counts of one split (:class:`fedgat.federated.Counts` on the wire)."""

    split: str
    correct: int
    count: int
    loss_sum: float


SPLITS = ListOf(Text(16), 8)


def check_weights(arrays: dict[str, np.ndarray], what: str) -> None:
    """Every weight finite and of absolute value at most :data:`MAX_WEIGHT_ABS`.

    Raises:
        PayloadError: naming the first offending array.
    """
    for name, arr in arrays.items():
        a = np.asarray(arr)
        if a.size == 0:
            continue
        if not np.all(np.isfinite(a)):
            raise PayloadError(f"{what}.arrays[{name!r}] holds NaN or infinite values")
        peak = float(np.max(np.abs(a)))
        if peak > MAX_WEIGHT_ABS:
            raise PayloadError(
                f"{what}.arrays[{name!r}] holds |w| = {peak:.3g}, above the limit {MAX_WEIGHT_ABS:.0e}"
            )


def check_splits(splits: tuple[str, ...]) -> None:
    if len(set(splits)) != len(splits) or not all(splits):
        raise PayloadError("split names must be non-empty and distinct")


@dataclass(frozen=True, eq=False, kw_only=True)
class GlobalModel(Message):
    """Global weights at the start of FedAvg round ``round``: train on them (``fit``) and/or report
    counts on them for ``splits`` (the evaluation of round ``round - 1``). Weights travel in plaintext
    (no secure aggregation); each must be finite with ``|w| <= MAX_WEIGHT_ABS``."""

    TYPE: ClassVar[int] = 10
    MAX_PAYLOAD: ClassVar[int] = 256 * MiB
    SCHEMA: ClassVar = (
        ("round", U32),
        ("fit", Bool()),
        ("splits", SPLITS),
        ("arrays", NamedArrays(1024, MAX_MODEL_ELEMS)),
    )

    round: int
    fit: bool
    splits: tuple[str, ...]
    arrays: dict[str, np.ndarray]

    def check(self) -> None:
        check_splits(self.splits)
        if not (self.fit or self.splits):
            raise PayloadError("a global model must ask to fit, to evaluate or both")
        check_weights(self.arrays, "GlobalModel")


@dataclass(frozen=True, eq=False, kw_only=True)
class EvaluateRequest(Message):
    """Report counts for more ``splits`` on the weights of the last GlobalModel (``round``), e.g. the
    test split once the validation accuracy improved."""

    TYPE: ClassVar[int] = 14
    MAX_PAYLOAD: ClassVar[int] = 1 * KiB
    SCHEMA: ClassVar = (("round", U32), ("splits", SPLITS))

    round: int
    splits: tuple[str, ...]

    def check(self) -> None:
        check_splits(self.splits)
        if not self.splits:
            raise PayloadError("an evaluation request names at least one split")


@dataclass(frozen=True, eq=False, kw_only=True)
class LocalUpdate(Message):
    """A client's weights after local training in round ``round`` and its FedAvg weight
    ``num_train``; a client without training nodes sends ``num_train = 0`` and no arrays. Weights
    must be finite with ``|w| <= MAX_WEIGHT_ABS``."""

    TYPE: ClassVar[int] = 11
    MAX_PAYLOAD: ClassVar[int] = 256 * MiB
    SCHEMA: ClassVar = (
        ("round", U32),
        ("num_train", U32),
        ("loss", Float64(finite=False)),
        ("arrays", NamedArrays(1024, MAX_MODEL_ELEMS)),
    )

    round: int
    num_train: int
    loss: float
    arrays: dict[str, np.ndarray]

    def check(self) -> None:
        if self.num_train == 0 and self.arrays:
            raise PayloadError("an update with num_train = 0 carries no arrays")
        if self.num_train > 0 and not self.arrays:
            raise PayloadError("an update with training nodes must carry the weights")
        check_weights(self.arrays, "LocalUpdate")


@dataclass(frozen=True, eq=False, kw_only=True)
class EvaluationReport(Message):
    """Counts of the round's global model on the client's validation/test nodes."""

    TYPE: ClassVar[int] = 12
    MAX_PAYLOAD: ClassVar[int] = 1 * KiB
    SCHEMA: ClassVar = (
        ("round", U32),
        (
            "splits",
            ListOf(
                Record(
                    SplitCounts,
                    (
                        ("split", Text(16)),
                        ("correct", U32),
                        ("count", U32),
                        ("loss_sum", Float64(finite=False)),
                    ),
                ),
                8,
            ),
        ),
    )

    round: int
    splits: tuple[SplitCounts, ...]

    def check(self) -> None:
        names = [s.split for s in self.splits]
        if len(set(names)) != len(names):
            raise PayloadError("duplicate split in an evaluation report")
        if any(s.correct > s.count for s in self.splits):
            raise PayloadError("more correct predictions than nodes")
