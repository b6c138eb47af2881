"""Converting PyG ``Data`` to fedgat's :class:`~fedgat.graph.Graph` and back, with a report.

:meth:`Graph.from_pyg <fedgat.graph.Graph.from_pyg>` prepares an arbitrary PyG graph the way
fedgat's Planetoid loader prepares Cora (and PyG's own dataset classes their graphs), and records
every change in a :class:`GraphReport` attached to the graph as ``graph.report``:

* edges: self-loops removed (:func:`torch_geometric.utils.remove_self_loops`; fedgat adds its own),
  duplicate edges merged (:func:`~torch_geometric.utils.coalesce`), directed inputs made undirected
  (:func:`~torch_geometric.utils.to_undirected`: the reverse of every edge is added), the result
  sorted by (source, target). An input that needs none of these keeps its edges in their order.
  Nodes without edges are kept (the report counts them); edge attributes and weights are dropped.
* features: float32, rows scaled to unit L2 norm with :func:`fedgat.graph.unit_normalise` (as the
  Planetoid loader does; overflow- and underflow-safe, from the float64 values where the cast to
  float32 loses a row) unless already within :data:`~fedgat.graph.UNIT_NORM_TOLERANCE` of it, in
  which case they are kept bit for bit; all-zero rows stay zero. Sparse features are made dense.
* labels: int64 (an ``(N, 1)`` label column is flattened); negative labels are refused; labels of a
  single class (the command line refuses them), and classes below the largest label that no node
  has (1-based or gapped class ids), are reported.
* masks: ``train_mask``, ``val_mask`` and ``test_mask`` are used when all three are present (an empty
  one is reported; training refuses a graph without training or validation nodes,
  :func:`fedgat.graph.check_trainable`); when none is, the seeded per-class split of
  :mod:`fedgat.splits` is drawn (20 per class, 500, 1000 by default).

:meth:`Graph.to_pyg <fedgat.graph.Graph.to_pyg>` goes the other way; ``Graph.from_pyg(g.to_pyg())``
equals ``g`` tensor for tensor (and a prepared ``Data`` survives the trip the other way unchanged).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedgat.graph import (
    _MASKS,
    Graph,
    GraphError,
    _checked_edge_index,
    _checked_features,
    _checked_labels,
    _label_tensor,
    _tensor,
    unit_rows,
)
from fedgat.splits import NUM_TEST, NUM_VAL, TRAIN_PER_CLASS, per_class_split

logger = logging.getLogger(__name__)

#: the report's note on labels of one class (the command line refuses such a graph)
SINGLE_CLASS = "every node has the same label"
#: what an empty given mask means, per mask (training refuses the first two:
#: :func:`fedgat.graph.check_trainable`)
EMPTY_SPLIT_NOTES = (
    "nothing to train on",
    "no validation node to pick the model by",
    "the test accuracy will be NaN",
)

#: ``Data`` attributes :meth:`Graph.from_pyg` reads; any other attribute is reported as ignored
KNOWN_KEYS = frozenset({"x", "y", "edge_index", *_MASKS, "num_nodes", "num_classes", "name", "node_names"})


@dataclass(frozen=True)
class GraphReport:
    """What :meth:`Graph.from_pyg` (and the loaders built on it) changed on the way in.

    Attributes:
        source: where the graph came from (``"Data"``, a file path, a dataset name).
        num_nodes: nodes, all kept (isolated ones included).
        input_edges: directed edges in the input ``edge_index``.
        self_loops_removed: input edges ``i -> i``.
        duplicates_removed: further copies of an edge already present (after removing self-loops).
        edges_added: reverse edges added to make the graph undirected (0 for a symmetric input).
        isolated_nodes: nodes without any edge in the result.
        rows_normalised: feature rows scaled to unit L2 norm.
        zero_feature_rows: all-zero feature rows (kept zero).
        split: ``"given masks (...)"`` or the description of the drawn per-class split.
        notes: anything else worth knowing (ignored attributes, flattened labels, a clipped split).
    """

    source: str
    num_nodes: int
    input_edges: int
    self_loops_removed: int
    duplicates_removed: int
    edges_added: int
    isolated_nodes: int
    rows_normalised: int
    zero_feature_rows: int
    split: str
    notes: tuple[str, ...] = ()

    @property
    def output_edges(self) -> int:
        return self.input_edges - self.self_loops_removed - self.duplicates_removed + self.edges_added

    @property
    def was_directed(self) -> bool:
        """The input lacked the reverse of some edge."""
        return self.edges_added > 0

    @property
    def edges_changed(self) -> bool:
        return bool(self.self_loops_removed or self.duplicates_removed or self.edges_added)

    def as_dict(self) -> dict:
        """Plain values (for JSON summaries), ``output_edges`` included."""
        return {**dataclasses.asdict(self), "notes": list(self.notes), "output_edges": self.output_edges}

    def lines(self) -> list[str]:
        """A short human-readable account, one fact per line."""
        head = f"{self.source}: {self.num_nodes} nodes, {self.input_edges} input edges"
        out = [f"{head} -> {self.output_edges} directed edges"]
        if self.edges_changed:
            out.append(
                f"edges: {self.self_loops_removed} self-loops removed, {self.duplicates_removed} duplicates "
                f"merged, {self.edges_added} reverse edges added"
                + (" (the input was directed)" if self.was_directed else "")
            )
        if self.isolated_nodes:
            out.append(f"{self.isolated_nodes} isolated nodes kept")
        if self.rows_normalised or self.zero_feature_rows:
            out.append(
                f"features: {self.rows_normalised} rows scaled to unit norm, "
                f"{self.zero_feature_rows} all-zero rows kept"
            )
        out.append(f"split: {self.split}")
        out.extend(self.notes)
        return out

    def __str__(self) -> str:
        return "; ".join(self.lines())


def from_pyg(
    data: Any,
    *,
    name: str | None = None,
    num_classes: int | None = None,
    split_seed: int = 0,
    train_per_class: int = TRAIN_PER_CLASS,
    num_val: int = NUM_VAL,
    num_test: int = NUM_TEST,
    source: str | None = None,
    reader_notes: Sequence[str] = (),
    node_names: np.ndarray | None = None,
) -> Graph:
    """The implementation of :meth:`Graph.from_pyg` (see there and the module docstring);
    ``reader_notes`` (a file reader's) go first in the report's notes, and ``node_names`` (a file
    reader's node ids, in node order) become :attr:`Graph.node_names`."""
    data, own_notes = _as_data(data)
    notes = [*reader_notes, *own_notes]
    keys = set(data.keys())
    if node_names is None and "node_names" in keys and data.node_names is not None:  # Graph.to_pyg's
        node_names = np.asarray(data.node_names, dtype=str)

    def present(key: str) -> bool:
        return key in keys and data[key] is not None

    if not present("x"):
        raise GraphError("data has no node features (x); pass a (num_nodes, num_features) tensor as data.x")
    x = data.x
    if isinstance(x, torch.Tensor) and x.layout != torch.strided:
        x = x.to_dense()
        notes.append("sparse features made dense")
    x = _checked_features(x)
    n = int(x.shape[0])
    if "num_nodes" in keys and data.num_nodes is not None and int(data.num_nodes) != n:
        raise GraphError(f"data.num_nodes is {int(data.num_nodes)} but x has {n} rows; give one row per node")

    if not present("y"):
        raise GraphError(f"data has no labels (y); pass ({n},) int64 class labels as data.y")
    y = _label_tensor(data.y)
    if y.ndim == 2 and tuple(y.shape) == (n, 1):
        y = y.reshape(-1)
        notes.append("labels of shape (N, 1) flattened")
    y = _checked_labels(y, n)

    if num_classes is None and present("num_classes"):
        stored = data.num_classes
        if isinstance(stored, (int, np.integer)) and not isinstance(stored, bool):
            num_classes = int(stored)
    if num_classes is None:
        num_classes = int(y.max()) + 1

    if not present("edge_index"):
        raise GraphError(f"data has no edge_index; pass (2, num_edges) int64 edges between nodes 0..{n - 1}")
    raw_edges = _checked_edge_index(data.edge_index, n)
    edge_index, loops, dups, added = _prepared_edges(raw_edges, n)
    isolated = n - int(torch.unique(edge_index).numel()) if edge_index.numel() else n

    x32, scale, zero = unit_rows(x)
    seen = torch.unique(y).tolist()
    empty = sorted(set(range(max(seen))) - set(seen))  # gaps below the largest label
    if len(seen) == 1:
        notes.append(f"{SINGLE_CLASS} ({seen[0]}): there is nothing to classify")
    elif empty:
        shown = ", ".join(map(str, empty[:8])) + (", ..." if len(empty) > 8 else "")
        notes.append(
            f"{len(empty)} of {max(seen) + 1} classes have no node ({shown}): labels should be 0..K-1 "
            "(1-based or gapped class ids leave classes empty; renumber them)"
        )

    given = [key for key in _MASKS if present(key)]
    if len(given) == len(_MASKS):
        masks = {key: _tensor(data[key], key) for key in _MASKS}
        for key, mask in masks.items():
            if mask.ndim == 2 and mask.shape[0] == n:
                raise GraphError(
                    f"{key} has shape {tuple(mask.shape)}: {mask.shape[1]} alternative splits; pick one "
                    f"first, e.g. data.{key} = data.{key}[:, 0]"
                )
        counts = [int(torch.as_tensor(m).to(torch.int64).sum()) for m in masks.values()]
        for key, count, why in zip(_MASKS, counts, EMPTY_SPLIT_NOTES, strict=True):
            if count == 0:
                notes.append(f"{key} selects no node: {why}")
        split = f"given masks ({counts[0]} train, {counts[1]} val, {counts[2]} test)"
    elif not given:
        drawn = per_class_split(
            y,
            num_classes,
            train_per_class=train_per_class,
            num_val=num_val,
            num_test=num_test,
            seed=split_seed,
        )
        masks = {"train_mask": drawn.train_mask, "val_mask": drawn.val_mask, "test_mask": drawn.test_mask}
        split = drawn.description
        if drawn.clipped:
            notes.append(f"split clipped to fit the graph's {n} nodes")
    else:
        missing = [key for key in _MASKS if key not in given]
        raise GraphError(
            f"data has {', '.join(given)} but no {', '.join(missing)}; give all three masks, or none "
            f"(then a seeded per-class split is drawn)"
        )

    ignored = sorted(keys - KNOWN_KEYS)
    if ignored:
        notes.append(f"ignored attributes: {', '.join(ignored)}")
    if name is None:
        name = data.name if present("name") and isinstance(data.name, str) else "graph"
    report = GraphReport(
        source=source or "Data",
        num_nodes=n,
        input_edges=int(raw_edges.shape[1]),
        self_loops_removed=loops,
        duplicates_removed=dups,
        edges_added=added,
        isolated_nodes=isolated,
        rows_normalised=int(scale.sum()),
        zero_feature_rows=int(zero.sum()),
        split=split,
        notes=tuple(notes),
    )
    graph = Graph(
        x=x32,
        y=y,
        edge_index=edge_index,
        train_mask=masks["train_mask"],
        val_mask=masks["val_mask"],
        test_mask=masks["test_mask"],
        num_classes=num_classes,
        name=name,
        report=report,
        node_names=node_names,
    )
    logger.info("%s", report)
    return graph


def to_pyg(graph: Graph) -> Any:
    """The implementation of :meth:`Graph.to_pyg`."""
    from torch_geometric.data import Data

    return Data(
        x=graph.x.clone(),
        y=graph.y.clone(),
        edge_index=graph.edge_index.clone(),
        train_mask=graph.train_mask.clone(),
        val_mask=graph.val_mask.clone(),
        test_mask=graph.test_mask.clone(),
        num_nodes=graph.num_nodes,
        num_classes=graph.num_classes,
        name=graph.name,
        # a graph folder's ids, so that an owners file keyed by them still reads after torch.save
        **({} if graph.node_names is None else {"node_names": [str(v) for v in graph.node_names]}),
    )


def _as_data(data: object) -> tuple[Any, list[str]]:
    """``data`` as a homogeneous PyG ``Data`` (from a ``Data``, a one-graph dataset or a dict of
    fields), and the notes on how it was unwrapped."""
    from torch_geometric.data import Data, Dataset, HeteroData

    notes: list[str] = []
    if isinstance(data, Dataset):
        if len(data) != 1:
            raise GraphError(f"dataset holds {len(data)} graphs; pass one of them, e.g. dataset[0]")
        data = data[0]
        notes.append("the dataset's only graph taken")
    if isinstance(data, HeteroData):
        raise GraphError("heterogeneous graphs (HeteroData) are not supported; pass a homogeneous Data")
    if isinstance(data, Mapping):
        if not all(isinstance(k, str) for k in data):
            raise GraphError("a dict of graph fields must have str keys (x, y, edge_index, ...)")
        data = Data.from_dict(dict(data))
    if not isinstance(data, Data):
        raise GraphError(
            f"expected a torch_geometric.data.Data (or a dict of its fields), got {type(data).__name__}"
        )
    return data, notes


def _prepared_edges(edge_index: torch.Tensor, n: int) -> tuple[torch.Tensor, int, int, int]:
    """Self-loops removed, duplicates merged, reverse edges added; and the three counts.

    An input needing none of it is returned as it is (same object, same order)."""
    from torch_geometric.utils import coalesce, to_undirected

    loops = edge_index[0] == edge_index[1]
    no_loops = edge_index[:, ~loops]
    unique = coalesce(no_loops, num_nodes=n)
    both = to_undirected(unique, num_nodes=n)
    counts = (
        int(loops.sum()),
        int(no_loops.shape[1] - unique.shape[1]),
        int(both.shape[1] - unique.shape[1]),
    )
    if counts == (0, 0, 0):
        return edge_index, *counts
    return both, *counts
