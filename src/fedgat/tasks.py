r"""A client's local training tasks: the targets of its owned nodes and the 1-hop supports that a
2-layer model with a node-local first layer (FedGAT, FedGCN's pre-computed layer) needs to score them.

* :func:`owned_targets` -- the targets of all three splits for a task over the sorted owned nodes;
* :func:`restrict_to_targets` -- the part of a client's local graph that scores some owned nodes;
* :func:`client_tasks` -- one client's training task and its validation and test tasks, each over the
  support of that split's owned nodes, from a builder of the model inputs;
* :func:`support_tasks` -- :func:`client_tasks` for every client (the set-up of
  :mod:`fedgat.methods` for FedGAT and FedGCN);
* :func:`tasks_from_encodings` -- :func:`client_tasks` from a client's (decrypted) encodings of its
  ``needed`` nodes (the protocol's training set-up, :mod:`fedgat.app`); :func:`select_nodes` picks
  the encodings of a support.

Speed: a layer-1 output of node :math:`v` depends only on :math:`v`'s own inputs, and a loss or
prediction only on layer-2 outputs at its target nodes; so each split's task holds just the 1-hop
support of its targets -- the same gradients and predictions as a forward over all ``needed``
nodes, several times cheaper.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from fedgat.encodings import BucketBases, EncodingBucket, Encodings
from fedgat.federated import LocalTask
from fedgat.graph import Graph
from fedgat.partition import Partition

__all__ = [
    "COMPACT_TOLERANCE",
    "SPLITS",
    "client_tasks",
    "owned_targets",
    "restrict_to_targets",
    "select_nodes",
    "support_tasks",
    "tasks_from_encodings",
]

SPLITS = ("train", "val", "test")
#: columns whose decrypted encodings stay below this are dropped when compacting for training
#: (CKKS noise is ~1e-7 per value at n4096, bound ~1e-6; real entries are >= ~1e-3 on Cora)
COMPACT_TOLERANCE = 1e-5

Targets = dict[str, tuple[torch.Tensor, torch.Tensor]]


def owned_targets(graph: Graph, owned: np.ndarray) -> Targets:
    """Targets of all three splits for a task whose first ``len(owned)`` rows are the sorted ``owned``:
    split -> ``(rows, labels)``."""
    targets = {}
    for split in SPLITS:
        nodes = owned[getattr(graph, f"{split}_mask").numpy()[owned]]
        targets[split] = (torch.from_numpy(np.searchsorted(owned, nodes)), graph.y[nodes])
    return targets


def restrict_to_targets(
    graph: Graph, needed: np.ndarray, edges: torch.Tensor, splits: dict[str, np.ndarray]
) -> tuple[np.ndarray, torch.Tensor, Targets]:
    """The part of a client's local graph that a 2-layer model with a node-local first layer (FedGAT,
    FedGCN's pre-computed layer) needs to score some of its owned nodes.

    Args:
        needed: the client's needed global ids; ``edges`` ``(2, E)`` positions in ``needed`` (edges
            into owned nodes, self-loops included), from :meth:`Partition.local_subgraph`.
        splits: split name -> ``(T,)`` target positions in ``needed`` (owned nodes).

    Returns:
        ``(support, sub_edges, targets)``: sorted positions in ``needed`` of the targets and their
        in-neighbours (``(S,)``); the ``(2, E')`` edges into the targets as positions in ``support``;
        split -> ``(rows in support, labels)``.
    """
    rows = np.concatenate(list(splits.values()))
    is_target = np.zeros(len(needed), dtype=bool)
    is_target[rows] = True
    sub = edges[:, torch.from_numpy(is_target)[edges[1]]].numpy()
    support = np.union1d(sub[0], rows)
    local = np.full(len(needed), -1, dtype=np.int64)
    local[support] = np.arange(len(support))
    targets = {s: (torch.from_numpy(local[r]), graph.y[needed[r]]) for s, r in splits.items()}
    return support, torch.from_numpy(local[sub]), targets


def client_tasks(
    graph: Graph, partition: Partition, client: int, inputs: Callable[[np.ndarray, torch.Tensor], tuple]
) -> tuple[LocalTask, list[LocalTask]]:
    """Client ``client``'s training task and its validation and test tasks (the arguments of
    :class:`~fedgat.federated.Client`), each over the support of its owned nodes of that split
    (:func:`restrict_to_targets`); ``inputs(support, edges)`` builds a task's model inputs from the
    support's sorted positions in the client's ``needed`` nodes ``(S,)`` and the ``(2, E')`` local
    edges. A split without targets gets empty inputs."""
    needed, edges = partition.local_subgraph(client)
    rows = {s: r.numpy() for s, (r, _) in owned_targets(graph, partition.clients[client].owned).items()}
    tasks = []
    for split in SPLITS:
        support, sub, targets = restrict_to_targets(graph, needed, edges, {split: rows[split]})
        tasks.append(LocalTask(inputs(support, sub) if len(support) else (), targets))
    return tasks[0], tasks[1:]


def support_tasks(
    graph: Graph, partition: Partition, inputs: Callable[[np.ndarray, torch.Tensor, int], tuple]
) -> list[tuple[LocalTask, list[LocalTask]]]:
    """:func:`client_tasks` of every client, in order; ``inputs(nodes, edges, client)`` builds the
    model inputs from the support's global ids ``(S,)``, the ``(2, E')`` local edges and the
    client's index."""
    tasks = []
    for cid, cp in enumerate(partition.clients):

        def build(
            support: np.ndarray, edges: torch.Tensor, cid: int = cid, needed: np.ndarray = cp.needed
        ) -> tuple:
            return inputs(needed[support], edges, cid)

        tasks.append(client_tasks(graph, partition, cid, build))
    return tasks


def select_nodes(enc: Encodings, positions: np.ndarray, dtype: torch.dtype | None = None) -> Encodings:
    """The encodings of ``enc.nodes[positions]`` (``positions`` sorted, distinct), rows renumbered,
    in ``dtype`` (default: as stored).

    The selected ``K2`` rows of every bucket are written one after another into one buffer, and the
    ``h_self`` rows into another, so that :attr:`Encodings.flat_K2` and :attr:`Encodings.flat_h_self`
    of the result are views of them rather than second copies."""
    positions = np.asarray(positions, dtype=np.int64)
    chosen = []
    for b in enc.buckets:
        keep = np.isin(b.bases.rows, positions)
        if keep.any():
            chosen.append((b, np.flatnonzero(keep)))
    if not chosen:
        return Encodings(enc.variant, enc.nodes[positions], [])
    first = chosen[0][0]
    dtype = first.K2.dtype if dtype is None else dtype
    d, dev = first.K2.shape[-1], first.K2.device
    flat_k2 = torch.empty(sum(len(i) * b.K2.shape[1] for b, i in chosen), d, dtype=dtype, device=dev)
    flat_h = torch.empty(sum(len(i) for _, i in chosen), first.h_self.shape[-1], dtype=dtype, device=dev)
    buckets = []
    k_at = h_at = 0
    for b, idx in chosen:
        t = torch.from_numpy(idx).to(dev)
        bb = b.bases
        bases = BucketBases(
            bb.variant,
            np.searchsorted(positions, bb.rows[idx]),
            bb.nodes[idx],
            bb.neighbours[idx],
            bb.p[idx],
            None if bb.q is None else bb.q[idx],
        )
        m = b.K2.shape[1]
        k2 = flat_k2[k_at : k_at + len(idx) * m].view(len(idx), m, d)
        h = flat_h[h_at : h_at + len(idx)]
        k_at, h_at = k_at + len(idx) * m, h_at + len(idx)
        for out, src in ((k2, b.K2), (h, b.h_self)):
            if src.dtype == dtype:
                torch.index_select(src, 0, t, out=out)
            else:  # one bucket's rows in the stored dtype at a time
                out.copy_(src.index_select(0, t))
        buckets.append(
            EncodingBucket(
                bases,
                h,
                k2,
                None if b.M2 is None else b.M2[t].to(dtype),
                None if b.cols is None else b.cols[t],
            )
        )
    return Encodings(enc.variant, enc.nodes[positions], buckets)


def tasks_from_encodings(
    graph: Graph, partition: Partition, client: int, enc: Encodings, tol: float = COMPACT_TOLERANCE
) -> tuple[LocalTask, list[LocalTask]]:
    """:func:`client_tasks` from client ``client``'s (decrypted) encodings of its ``needed`` nodes, in
    float32, compacted at ``tol`` and factorised (the task construction of
    :func:`fedgat.methods.run_method`, with received encodings instead of locally built ones).

    Raises:
        ValueError: ``enc`` does not cover the client's ``needed`` nodes in order.
    """
    if not np.array_equal(partition.clients[client].needed, enc.nodes):
        raise ValueError(f"client {client}'s encodings do not cover its needed nodes in order")

    def inputs(support: np.ndarray, edges: torch.Tensor) -> tuple:
        return select_nodes(enc, support, torch.float32).compact(tol).factorise(), edges

    return client_tasks(graph, partition, client, inputs)
