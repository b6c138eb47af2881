"""The seeded per-class train/validation/test split given to graphs that come without one.

The split follows the Planetoid public split's recipe (Yang et al. 2016; PyG's
``RandomNodeSplit(split="test_rest")`` without the "rest"): ``train_per_class`` training nodes of
every class, then ``num_val`` validation and ``num_test`` test nodes drawn from the remaining nodes.
Defaults: 20 per class, 500, 1000, as for Cora, CiteSeer and PubMed.

Procedure, for ``rng = numpy.random.default_rng(seed)``:

1. for every class ``c = 0, 1, ..., C-1`` in turn, the class's node ids (increasing) are shuffled with
   ``rng.permutation`` and the first ``t_c`` become training nodes, where
   ``t_c = min(train_per_class, max(1, n_c // 2))`` for a class of ``n_c >= 1`` nodes (at most half
   of a class, but at least one node, goes to training; an empty class gives none);
2. the other nodes (increasing ids) are shuffled with ``rng.permutation``; the first ``v`` become
   validation nodes and the next ``t`` test nodes. When ``num_val + num_test`` exceeds the ``R``
   nodes left, both are scaled down in proportion (``v = floor(R * num_val / (num_val + num_test))``,
   at least 1 when ``num_val >= 1``, and ``t = R - v``); otherwise ``v = num_val``, ``t = num_test``
   and the remaining nodes stay unlabelled for training purposes.

The result depends only on the labels, the sizes and ``seed``. A graph with fewer than two nodes
left after step 1 (so without room for both a validation and a test node) raises :class:`SplitError`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedgat.graph import GraphError

#: the Planetoid public split's sizes, the defaults of :func:`per_class_split`
TRAIN_PER_CLASS, NUM_VAL, NUM_TEST = 20, 500, 1000


class SplitError(GraphError):
    """The requested split is impossible for this graph (sizes out of range, or too few nodes)."""


@dataclass(frozen=True)
class Split:
    """Three disjoint ``(N,)`` bool masks and a one-line description of how they were drawn.

    Attributes:
        train_mask, val_mask, test_mask: the masks.
        description: e.g. ``"per-class split (seed 0): 20 train per class (140), 500 val, 1000 test"``.
        clipped: the sizes asked for did not fit and were reduced (the description says how).
    """

    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    description: str
    clipped: bool


def per_class_split(
    y: torch.Tensor | np.ndarray,
    num_classes: int | None = None,
    *,
    train_per_class: int = TRAIN_PER_CLASS,
    num_val: int = NUM_VAL,
    num_test: int = NUM_TEST,
    seed: int = 0,
) -> Split:
    """Draw the seeded per-class split described in the module docstring.

    Args:
        y: ``(N,)`` non-negative integer labels.
        num_classes: number of classes (default ``max(y) + 1``); classes without nodes get no
            training nodes.
        train_per_class: training nodes per class, ``>= 1`` (clipped to half of a small class).
        num_val: validation nodes, ``>= 0``.
        num_test: test nodes, ``>= 1``.
        seed: seed for ``numpy.random.default_rng``.

    Raises:
        SplitError: sizes out of range, labels that are not 1-D non-negative integers or not below
            ``num_classes``, or a graph too small for a validation and a test node.
    """
    labels = np.asarray(y.numpy() if isinstance(y, torch.Tensor) else y)
    if labels.ndim != 1 or labels.size < 1 or not np.issubdtype(labels.dtype, np.integer):
        raise SplitError(f"labels must be a non-empty 1-D integer array, got {labels.shape} {labels.dtype}")
    if labels.min() < 0:
        raise SplitError(f"labels hold {int(labels.min())}; labels must lie in [0, num_classes)")
    num_classes = int(labels.max()) + 1 if num_classes is None else num_classes
    if labels.max() >= num_classes:
        raise SplitError(f"labels hold {int(labels.max())} but num_classes is {num_classes}")
    for key, value, low in (("train_per_class", train_per_class, 1), ("num_val", num_val, 0)):
        _check_size(key, value, low)
    _check_size("num_test", num_test, 1)

    n = len(labels)
    rng = np.random.default_rng(seed)
    train = np.zeros(n, dtype=bool)
    per_class = []
    for c in range(num_classes):
        nodes = rng.permutation(np.flatnonzero(labels == c))
        take = min(train_per_class, max(1, len(nodes) // 2)) if len(nodes) else 0
        train[nodes[:take]] = True
        per_class.append(take)

    rest = rng.permutation(np.flatnonzero(~train))
    left = len(rest)
    if left < 2:
        raise SplitError(
            f"graph of {n} nodes is too small for a split: after {int(train.sum())} training nodes "
            f"({train_per_class} per class, at most half of each class) {left} node(s) remain, and "
            f"at least 2 are needed (one validation, one test node)"
        )
    clipped = num_val + num_test > left
    if clipped:
        n_val = left * num_val // (num_val + num_test)
        n_val = max(n_val, 1) if num_val else 0
        n_test = left - n_val
    else:
        n_val, n_test = num_val, num_test
    val = np.zeros(n, dtype=bool)
    test = np.zeros(n, dtype=bool)
    val[rest[:n_val]] = True
    test[rest[n_val : n_val + n_test]] = True

    described = f"per-class split (seed {seed}): "
    sizes = np.bincount(labels, minlength=num_classes)
    if per_class != [train_per_class if size else 0 for size in sizes]:
        described += f"train per class {per_class} (asked {train_per_class}, at most half of a class)"
        clipped = True
    else:
        described += f"{train_per_class} train per class"
    described += f" ({int(train.sum())}), {n_val} val, {n_test} test"
    if (n_val, n_test) != (num_val, num_test):
        described += f" (asked {num_val} val, {num_test} test; {left} nodes left after training)"
    return Split(
        torch.from_numpy(train), torch.from_numpy(val), torch.from_numpy(test), described, bool(clipped)
    )


def _check_size(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise SplitError(f"{name} must be an integer >= {low}, got {value!r}")
