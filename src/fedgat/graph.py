"""The graph container every part of fedgat shares.

Conventions (PyG's): ``edge_index[0]`` is the source ``j``, ``edge_index[1]`` the target ``i``;
messages flow ``j -> i``. Stored edges never include self-loops: the attention neighbourhood of a
node, :math:`\\mathcal{N}(i) \\cup \\{i\\}`, adds the self-loop explicitly through
:func:`Graph.neighbourhoods`.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from fedgat.graph_pyg import GraphReport


@dataclass(frozen=True)
class CSR:
    """Neighbour lists in compressed-row form: the neighbours of node ``i`` are
    ``indices[indptr[i]:indptr[i + 1]]`` (global node ids, int64)."""

    indptr: np.ndarray
    indices: np.ndarray

    @property
    def num_nodes(self) -> int:
        return len(self.indptr) - 1

    def degrees(self) -> np.ndarray:
        return np.diff(self.indptr)

    def row(self, i: int) -> np.ndarray:
        return self.indices[self.indptr[i] : self.indptr[i + 1]]

    def to_edge_index(self) -> torch.Tensor:
        """``(2, nnz)`` edge index with row ``i``'s entries as sources into target ``i``."""
        targets = np.repeat(np.arange(self.num_nodes), self.degrees())
        return torch.from_numpy(np.stack([self.indices, targets])).long()

    @classmethod
    def from_rows(cls, rows: list[np.ndarray]) -> CSR:
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        indptr[1:] = np.cumsum([len(r) for r in rows])
        indices = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64)
        return cls(indptr, indices)


class GraphError(ValueError):
    """A :class:`Graph` field is malformed; the message names the field and how to fix it."""


#: rows whose L2 norm is within this distance of 1 are kept exactly as given (float32 rounding of a
#: normalised row stays far below it); other non-zero rows are scaled to unit norm. Well inside the
#: encrypted path's ``NORM_TOLERANCE`` (1e-4), so a row the graph accepts is one a client accepts.
UNIT_NORM_TOLERANCE = 1e-5

_MASKS = ("train_mask", "val_mask", "test_mask")


@dataclass(frozen=True, repr=False)
class Graph:
    """A node-classification graph.

    Every field is checked, and where that is unambiguous converted, when the graph is built (in
    :meth:`__post_init__`, so loaders, hand-built graphs and :func:`dataclasses.replace` all go through
    the same step); anything else raises :class:`GraphError` naming the field. Tensors may be given
    as torch tensors or anything :func:`torch.as_tensor` takes (numpy arrays, nested lists).

    Attributes:
        x: ``(N, d)`` float32 node features, ``N, d >= 1``, all finite. Other float dtypes (float64,
            float16, bfloat16) and integer or bool dtypes (e.g. 0/1 bag-of-words counts) are converted
            to float32. Rows have unit L2 norm (the paper's Assumption 3), on the plaintext and the
            encrypted path alike: a non-zero row whose norm differs from 1 by more than
            :data:`UNIT_NORM_TOLERANCE` is scaled to unit norm (computed in float64), all-zero rows stay
            zero, and rows already of unit norm are kept bit for bit.
        y: ``(N,)`` int64 labels in ``[0, num_classes)``; other integer dtypes and whole-number
            floats (as pandas reads a label column) are converted; other floats, bools and text refused.
        edge_index: ``(2, E)`` int64 directed edges ``j -> i`` between node ids in ``[0, N)``, without
            self-loops (fedgat adds them itself); other integer dtypes are converted.
        train_mask, val_mask, test_mask: ``(N,)`` bool split masks, pairwise disjoint. Integer masks
            holding only 0 and 1 are converted to bool (never read as node indices); any other dtype or
            value is refused.
        num_classes: number of label classes, ``>= 1`` and above every label.
        name: a short name ("cora", "citeseer", "synthetic", ...).
        report: for graphs built by :meth:`from_pyg` and the loaders built on it, a
            :class:`~fedgat.graph_pyg.GraphReport` of what the conversion changed (removed self-loops,
            merged duplicates, added reverse edges, the split drawn); None otherwise. Not compared.
        node_names: ``(N,)`` str array, each node's name in its source (the ``id`` column of a graph
            folder, :func:`fedgat.graph_csv.load_csv_folder`), for files that name nodes by id (an
            owners file's ``node`` column, :func:`fedgat.owners.load_owners`); None when the source
            numbers nodes ``0..N-1``. Not compared.

    Raises:
        GraphError: a field of the wrong shape, dtype, length or range, non-finite features, or
            overlapping masks.
    """

    x: torch.Tensor
    y: torch.Tensor
    edge_index: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    num_classes: int
    name: str = "graph"
    report: GraphReport | None = field(default=None, repr=False, compare=False)
    node_names: np.ndarray | None = field(default=None, repr=False, compare=False)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields = _validated(self)
        for key, value in fields.items():
            if value is not getattr(self, key):
                object.__setattr__(self, key, value)

    def __eq__(self, other: object) -> bool:
        """The same features, labels, edges and masks (tensor for tensor, dtypes included), class
        count and name; the report and caches do not count."""
        if not isinstance(other, Graph):
            return NotImplemented
        tensors = ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask")
        return (self.num_classes, self.name) == (other.num_classes, other.name) and all(
            getattr(self, k).dtype == getattr(other, k).dtype
            and torch.equal(getattr(self, k), getattr(other, k))
            for k in tensors
        )

    __hash__ = object.__hash__  # identity: the tensors are mutable

    def __repr__(self) -> str:
        return (
            f"Graph(name={self.name!r}, nodes={self.num_nodes}, features={self.num_features}, "
            f"edges={self.edge_index.shape[1]}, classes={self.num_classes}, "
            f"train={int(self.train_mask.sum())}, val={int(self.val_mask.sum())}, "
            f"test={int(self.test_mask.sum())})"
        )

    @classmethod
    def from_pyg(
        cls,
        data: object,
        *,
        name: str | None = None,
        num_classes: int | None = None,
        split_seed: int = 0,
        train_per_class: int = 20,
        num_val: int = 500,
        num_test: int = 1000,
        source: str | None = None,
    ) -> Graph:
        """A graph from a PyG ``Data`` (or a one-graph PyG dataset, or a dict of ``Data`` fields).

        Reads ``x``, ``y``, ``edge_index`` and, when all three are present, ``train_mask``,
        ``val_mask``, ``test_mask`` (plus ``num_classes`` and ``name`` where set, as :meth:`to_pyg`
        writes them). Prepared as PyG prepares its datasets, and reported in :attr:`report`: self-loops
        removed, duplicates merged, directed inputs made undirected, isolated nodes kept, rows scaled
        to unit norm with :func:`unit_normalise`; see :mod:`fedgat.graph_pyg`. Without masks a seeded
        per-class split is drawn (:func:`fedgat.splits.per_class_split`).

        Args:
            data: the PyG graph.
            name: the graph's name; default ``data.name`` when it is a str, else ``"graph"``.
            num_classes: default ``data.num_classes`` when it is an int, else ``max(y) + 1``.
            split_seed, train_per_class, num_val, num_test: the per-class split drawn when ``data``
                has no masks (ignored otherwise).
            source: where the data came from, for the report (default ``"Data"``).

        Raises:
            GraphError: a missing or malformed field (no ``x``, ``y`` or ``edge_index``, negative
                labels, non-finite features, node ids out of range, some masks but not all, several
                splits in one mask), or a split that does
                not fit (:class:`fedgat.splits.SplitError`).
        """
        from fedgat.graph_pyg import from_pyg

        return from_pyg(
            data,
            name=name,
            num_classes=num_classes,
            split_seed=split_seed,
            train_per_class=train_per_class,
            num_val=num_val,
            num_test=num_test,
            source=source,
        )

    def to_pyg(self):  # -> torch_geometric.data.Data (untyped package)
        """A PyG ``Data`` with copies of ``x``, ``y``, ``edge_index`` and the three masks, plus
        ``num_nodes``, ``num_classes`` and ``name``; ``Graph.from_pyg(g.to_pyg())`` equals ``g``."""
        from fedgat.graph_pyg import to_pyg

        return to_pyg(self)

    @property
    def num_nodes(self) -> int:
        return int(self.x.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    def structure_digest(self) -> str:
        """SHA-256 (hex) of what a :class:`~fedgat.partition.Partition` of this graph depends on: the
        node count, the edges and the three split masks (features and labels do not enter), so a
        partition can tell the graph it was made from (:func:`fedgat.partition.check_partition`)."""
        key = ("structure_digest",)
        if key not in self._cache:
            h = hashlib.sha256(f"fedgat-graph-structure:{self.num_nodes}:".encode())
            for t in (self.edge_index, self.train_mask, self.val_mask, self.test_mask):
                h.update(str(tuple(t.shape)).encode())
                h.update(t.contiguous().numpy().tobytes())
            self._cache[key] = h.hexdigest()
        return self._cache[key]

    def neighbourhoods(self, self_loops: bool = True) -> CSR:
        """Incoming neighbour lists; with ``self_loops`` node ``i`` comes first in its own row.

        Rows are sorted by source id after the self-loop, so the result is deterministic.
        """
        key = ("nbh", self_loops)
        if key not in self._cache:
            n = self.num_nodes
            src = self.edge_index[0].numpy()
            dst = self.edge_index[1].numpy()
            keep = src != dst
            src, dst = src[keep], dst[keep]
            if self_loops:
                ids = np.arange(n)
                # self-loop sorts first: key (dst, 0, ...) before (dst, 1, src)
                src = np.concatenate([ids, src])
                dst = np.concatenate([ids, dst])
                first = np.concatenate([np.zeros(n, np.int64), np.ones(len(keep.nonzero()[0]), np.int64)])
            else:
                first = np.zeros(len(src), np.int64)
            order = np.lexsort((src, first, dst))
            src, dst = src[order], dst[order]
            indptr = np.zeros(n + 1, dtype=np.int64)
            np.add.at(indptr, dst + 1, 1)
            self._cache[key] = CSR(np.cumsum(indptr), src.astype(np.int64))
        return self._cache[key]


def unit_normalise(x: torch.Tensor) -> torch.Tensor:
    """Scale each row to unit L2 norm; all-zero rows stay zero. A row whose norm overflows or
    underflows the dtype (e.g. float32 values near 1e19, or 1e-30) is first divided by its largest
    magnitude, so it still comes out of unit norm instead of zero."""
    norms = x.norm(dim=1, keepdim=True)
    out = torch.where(norms > 0, x / norms.clamp_min(torch.finfo(x.dtype).tiny), x)
    lost = _lost_norms(x, norms[:, 0])
    if bool(lost.any()):
        rows = x[lost]
        scaled = rows / rows.abs().amax(dim=1, keepdim=True)
        out[lost] = scaled / scaled.norm(dim=1, keepdim=True)
    return out


def _lost_norms(x: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` (finite) whose computed ``norms`` overflowed, or are so small that their squares
    went subnormal (imprecise) or to zero, though the row is not all-zero."""
    info = torch.finfo(x.dtype)
    small = norms < math.sqrt(info.tiny / info.eps)
    lost = ~torch.isfinite(norms)
    if bool(small.any()):
        lost |= small & (x != 0).any(dim=1)
    return lost


def row_norms(x: torch.Tensor) -> torch.Tensor:
    """L2 norm of each row of ``x`` (finite), computed as ``x.norm(dim=1)`` and, where that
    overflows or underflows, from the row divided by its largest magnitude."""
    norms = x.norm(dim=1)
    lost = _lost_norms(x, norms)
    if bool(lost.any()):
        peak = x[lost].abs().amax(dim=1)
        norms[lost] = peak * (x[lost] / peak[:, None]).norm(dim=1)
    return norms


def unit_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` (finite) as float32 with every row that is neither all-zero nor within
    :data:`UNIT_NORM_TOLERANCE` of unit norm scaled to unit norm by :func:`unit_normalise` of its
    float32 values, or of its float64 values where the cast to float32 overflows or underflows; also
    the masks of the scaled rows and of the all-zero rows. Rows already of unit norm are kept."""
    with torch.no_grad():
        xd = x.to(torch.float64)
        x32 = x if x.dtype == torch.float32 else xd.to(torch.float32)
        norms = (xd if x.dtype == torch.float32 else x32.to(torch.float64)).norm(dim=1)
        # the float32 cast overflowed (inf) or underflowed (zeros, or subnormals that lost precision)
        cast_lost = _lost_norms(xd, norms)
        if x.dtype != torch.float32 and x.shape[1]:
            cast_lost |= (x32.abs().amax(dim=1) < torch.finfo(torch.float32).tiny) & (xd != 0).any(dim=1)
        if bool(cast_lost.any()):
            norms[cast_lost] = row_norms(xd[cast_lost])
        zero = norms == 0  # after the recomputation above: exactly the all-zero rows
        scale = ~zero & ((norms - 1.0).abs() > UNIT_NORM_TOLERANCE)
        if bool(scale.any()):
            x32 = x32.clone()
            plain, cast = scale & ~cast_lost, scale & cast_lost
            x32[plain] = unit_normalise(x32[plain])
            if bool(cast.any()):
                x32[cast] = unit_normalise(xd[cast]).to(torch.float32)
    return x32, scale, zero


def check_trainable(graph: Graph) -> None:
    """Refuse a graph that training cannot use: no training node, or no validation node (the model
    of the best validation accuracy is kept). :meth:`Graph.from_pyg` builds such a graph (and
    reports it); the command line and the training entry points refuse it here.

    Raises:
        GraphError: naming the empty split.
    """
    for key, what in (("train_mask", "training"), ("val_mask", "validation")):
        if not bool(getattr(graph, key).any()):
            raise GraphError(
                f"{graph.name}: {key} selects no node; training needs {what} nodes (give each mask some "
                "nodes, or none of the three masks for a seeded per-class split)"
            )


def _tensor(value: object, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise GraphError(f"{name} of type {type(value).__name__} is not a tensor ({exc})") from None


def _label_tensor(value: object) -> torch.Tensor:
    """``value`` (labels) as a tensor; text (class names) refused with what to do."""
    if not isinstance(value, torch.Tensor) and _holds_text(np.asarray(value)):
        raise GraphError(
            "y holds text (class names?); number the classes, e.g. np.unique(y, return_inverse=True)[1], "
            "or give them as names in a graph folder's label column"
        )
    return _tensor(value, "y")


def _holds_text(a: np.ndarray) -> bool:
    return a.dtype.kind in "US" or (a.dtype.kind == "O" and any(isinstance(v, str) for v in a.ravel()[:100]))


def _is_int(t: torch.Tensor) -> bool:
    return not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool


def _validated(g: Graph) -> dict[str, object]:
    """The checked and converted fields of ``g`` (unchanged values are the same objects)."""
    out: dict[str, object] = {}
    if not isinstance(g.name, str):
        raise GraphError(f"name must be a str, got {type(g.name).__name__}")

    x = _checked_features(g.x)
    n = int(x.shape[0])
    with torch.no_grad():
        xd = x.to(torch.float64)
        norms = row_norms(xd)
        scale = (norms > 0) & ((norms - 1.0).abs() > UNIT_NORM_TOLERANCE)
        x32 = x if x.dtype == torch.float32 else xd.to(torch.float32)
        if bool(scale.any()):
            x32 = x32.clone()
            x32[scale] = unit_normalise(xd[scale]).to(torch.float32)
    out["x"] = x32

    num_classes = g.num_classes
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise GraphError(f"num_classes is {num_classes!r}; pass an int >= 1")
    out["num_classes"] = int(num_classes)

    y = _checked_labels(g.y, n)
    hi = int(y.max())
    if hi >= num_classes:
        raise GraphError(
            f"y holds label {hi} but num_classes is {num_classes}; pass num_classes >= {hi + 1} "
            f"(labels must lie in [0, num_classes))"
        )
    out["y"] = y

    masks: dict[str, torch.Tensor] = {}
    for key in _MASKS:
        m = _tensor(getattr(g, key), key)
        if m.ndim != 1 or m.shape[0] != n:
            raise GraphError(f"{key} has shape {tuple(m.shape)}; pass a bool mask of length {n}")
        if m.dtype != torch.bool:
            if not _is_int(m) or not bool(((m == 0) | (m == 1)).all()):
                what = "values other than 0/1" if _is_int(m) else "a non-integer dtype"
                raise GraphError(f"{key} has dtype {m.dtype} with {what}; pass a bool mask of length {n}")
            m = m != 0
        masks[key] = m
    for i, a in enumerate(_MASKS):
        for b in _MASKS[i + 1 :]:
            both = masks[a] & masks[b]
            if bool(both.any()):
                raise GraphError(
                    f"{a} and {b} overlap in {int(both.sum())} nodes (e.g. node {int(both.nonzero()[0, 0])}); "
                    f"pass disjoint masks"
                )
    out.update(masks)

    ei = _checked_edge_index(g.edge_index, n)
    if ei.shape[1]:
        loops = ei[0] == ei[1]
        if bool(loops.any()):
            raise GraphError(
                f"edge_index holds {int(loops.sum())} self-loops (e.g. node {int(ei[0, loops][0])}); "
                f"remove them, fedgat adds self-loops itself"
            )
    out["edge_index"] = ei
    if g.node_names is not None:
        names = np.asarray(g.node_names)
        if names.shape != (n,) or names.dtype.kind != "U":
            raise GraphError(
                f"node_names has shape {names.shape} and dtype {names.dtype}; pass ({n},) str names, one per node"
            )
        out["node_names"] = names
    return out


def _checked_features(value: object) -> torch.Tensor:
    """``value`` as a tensor of shape ``(N >= 1, d >= 1)``, real and finite (dtype unchanged)."""
    x = _tensor(value, "x")
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise GraphError(f"x has shape {tuple(x.shape)}; pass (num_nodes, num_features) features, both >= 1")
    if x.dtype.is_complex:
        raise GraphError(f"x has dtype {x.dtype}; pass real float32 features")
    with torch.no_grad():
        finite = torch.isfinite(x)
        if not bool(finite.all()):
            bad = int((~finite).any(dim=1).nonzero()[0, 0])
            raise GraphError(f"x holds NaN or infinite values (e.g. row {bad}); pass finite features")
    return x


#: class ids below this are always accepted (above it, only below twice the node count)
MAX_CLASS_FLOOR = 1024


def _checked_labels(value: object, n: int) -> torch.Tensor:
    """``value`` as ``(n,)`` int64 labels, all ``>= 0`` (whole-number floats, as pandas reads a label
    column with gaps, are taken as their integers)."""
    y = _label_tensor(value)
    if y.ndim != 1 or y.shape[0] != n:
        rows = f" (y has {y.shape[0]} labels, x {n} rows: one of the two is off)" if y.ndim == 1 else ""
        raise GraphError(
            f"y has shape {tuple(y.shape)}; pass int64 labels of shape ({n},), one per node{rows}"
        )
    if y.dtype.is_floating_point:
        whole = torch.isfinite(y) & (y == torch.round(y))
        if not bool(whole.all()):
            bad = int((~whole).nonzero()[0, 0])
            raise GraphError(f"y holds {float(y[bad])} (node {bad}); labels are whole numbers 0..K-1")
    elif not _is_int(y):
        raise GraphError(f"y has dtype {y.dtype}; pass int64 labels of shape ({n},)")
    y = y.to(torch.int64)
    lo = int(y.min())
    if lo < 0:
        raise GraphError(
            f"y holds label {lo}; labels must lie in [0, num_classes) (an unlabelled node: give it any class "
            "and leave it out of the train, val and test masks)"
        )
    hi, limit = int(y.max()), max(MAX_CLASS_FLOOR, 2 * n)
    if hi >= limit:  # e.g. an id column read as labels: a class per id up to it, a model that wide
        raise GraphError(
            f"y holds label {hi}; with {n} nodes class ids must lie below {limit} (are these ids? number "
            "the classes 0..K-1, or give them as names in a graph folder's label column)"
        )
    return y


def _checked_edge_index(value: object, n: int) -> torch.Tensor:
    """``value`` as ``(2, E)`` int64 edges between node ids in ``[0, n)`` (self-loops not checked)."""
    ei = _tensor(value, "edge_index")
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise GraphError(f"edge_index has shape {tuple(ei.shape)}; pass int64 edges of shape (2, num_edges)")
    if not _is_int(ei):
        raise GraphError(f"edge_index has dtype {ei.dtype}; pass int64 edges of shape (2, num_edges)")
    ei = ei.to(torch.int64)
    if ei.shape[1]:
        lo, hi = int(ei.min()), int(ei.max())
        if lo < 0 or hi >= n:
            raise GraphError(f"edge_index holds node {lo if lo < 0 else hi}; node ids must lie in [0, {n})")
    return ei
