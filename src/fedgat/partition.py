"""Splitting a graph's nodes among federated clients, and the neighbourhoods FedGAT attends over.

Conventions: node ids are global ``0..N-1``; an owner array ``owner[i]`` gives the client (``0..K-1``)
holding node ``i``'s features and label. Neighbourhoods are :class:`~fedgat.graph.CSR` rows of
*incoming* neighbours (sources ``j`` of messages ``j -> i``), the node itself first, then the other
neighbours in increasing id order. An edge ``j -> i`` is *cross-client* when
``owner[j] != owner[i]``.

:func:`make_partition` builds the attention neighbourhood every node uses in FedGAT from the graph's
``N(i) ∪ {i}`` by two rules, applied as *minimum-cross rule, cap, minimum-cross rule*:

* minimum-cross rule (the paper's; off by default): a node with ``0 < c < min_cross`` cross-client
  neighbours loses all of them, because an aggregate over a single foreign neighbour would reveal that
  neighbour (``min_cross=2`` drops the cross-client neighbour of a node that has exactly one);
* neighbour cap (optional): a node with more than ``k`` neighbours besides itself keeps a uniform
  random subset of ``k`` of them, and always itself.

The rule runs again after the cap because sampling can leave a node with a single cross-client
neighbour; so the rule's guarantee holds for the final neighbourhoods. Rows are only ever filtered,
so the self-loop stays first and the rest stays sorted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fedgat.graph import CSR, Graph
from fedgat.randomness import check_seed


def dirichlet_split(labels: np.ndarray, num_clients: int, beta: float, seed: int) -> np.ndarray:
    """Label-Dirichlet split of nodes among clients (Hsu et al. 2019, as in FedGCN and FedGAT).

    For every class ``c`` (in increasing label order) the class's nodes are shuffled, client
    proportions ``p ~ Dir(beta * 1_K)`` are drawn, and the nodes are cut into ``K`` consecutive runs
    of sizes ``~ p * n_c``. As in the reference implementation (NIID-Bench, FedGCN), a client that
    already holds ``N / K`` or more nodes gets proportion 0 for the remaining classes, which keeps
    client sizes roughly balanced. Small ``beta`` (e.g. 1) gives skewed label distributions per
    client; large ``beta`` (e.g. 10000) is close to iid.

    Non-empty clients: where the reference re-draws until every client is large enough, this
    function instead *moves* nodes: while some client is empty, one uniformly chosen node of the
    currently largest client is given to it. That terminates for every ``beta`` and changes at most
    ``K - 1`` nodes. With ``N < K`` some clients necessarily stay empty.

    Args:
        labels: ``(N,)`` non-negative integer class labels.
        num_clients: ``K >= 1``.
        beta: Dirichlet concentration, finite and ``> 0``.
        seed: seed for ``np.random.default_rng``; the result depends only on the arguments.

    Returns:
        ``(N,)`` int64 owner ids in ``0..K-1``.

    Raises:
        TypeError: ``num_clients`` not an integer.
        ValueError: ``labels`` not 1-D non-negative integers, ``num_clients < 1``, or ``beta`` not
            finite and positive.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or (labels.size and not np.issubdtype(labels.dtype, np.integer)):
        raise ValueError(f"labels must be a 1-D integer array, got shape {labels.shape} {labels.dtype}")
    if labels.size and labels.min() < 0:
        raise ValueError("labels must be non-negative")
    _check_clients_beta(num_clients, beta)

    rng = np.random.default_rng(seed)
    n, k = len(labels), num_clients
    owner = np.empty(n, dtype=np.int64)
    sizes = np.zeros(k, dtype=np.int64)
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        open_ = sizes < n / k  # never all False: fewer than N nodes are assigned so far
        p = rng.dirichlet(np.full(k, float(beta))) * open_
        if p.sum() == 0:  # all mass on full clients (tiny beta, underflow)
            p = open_.astype(float)
        cuts = (np.cumsum(p / p.sum()) * len(idx)).astype(np.int64)[:-1]
        owner[idx] = np.searchsorted(cuts, np.arange(len(idx)), side="right")
        sizes += np.bincount(owner[idx], minlength=k)

    if n >= k:
        for empty in np.flatnonzero(sizes == 0):
            donor = int(np.argmax(sizes))  # holds >= 2 nodes, by pigeonhole
            owner[rng.choice(np.flatnonzero(owner == donor))] = empty
            sizes[donor] -= 1
            sizes[empty] += 1
    return owner


@dataclass(frozen=True)
class ClientPartition:
    """What one client holds and needs.

    Attributes:
        client_id: the client's index ``0..K-1``.
        owned: sorted global ids of the nodes the client owns.
        needed: global ids whose neighbourhoods the client's forward pass touches: ``owned`` first
            (sorted), then the sorted non-owned nodes of the ``(num_layers - 1)``-hop expansion of
            ``owned`` through the partition's neighbourhoods. For 2 layers: owned plus every
            neighbour of an owned node; for 1 layer: ``owned``.
        cross_edges: number of cross-client pairs ``j -> i`` with ``i`` owned and ``j`` not, in the
            partition's (filtered) neighbourhoods.
        train_nodes, val_nodes, test_nodes: sorted global ids of the owned nodes in each split.
    """

    client_id: int
    owned: np.ndarray
    needed: np.ndarray
    cross_edges: int
    train_nodes: np.ndarray
    val_nodes: np.ndarray
    test_nodes: np.ndarray

    def __repr__(self) -> str:
        return (
            f"ClientPartition(client {self.client_id}: {len(self.owned)} owned, {len(self.needed)} needed, "
            f"{self.cross_edges} cross-client edges; train/val/test {len(self.train_nodes)}/"
            f"{len(self.val_nodes)}/{len(self.test_nodes)})"
        )


@dataclass(frozen=True)
class Partition:
    """Nodes split among clients plus the neighbourhoods FedGAT uses (see the module docstring).

    Attributes:
        owner: ``(N,)`` int64 owning client of every node.
        neighbourhoods: filtered attention neighbourhoods, self-loop first in every row.
        clients: one :class:`ClientPartition` per client, indexed by client id.
        num_layers, min_cross, neighbour_cap: the arguments the partition was built with.
        cross_dropped_by_rule: cross-client edges removed by the minimum-cross rule (both passes).
        nodes_hit_by_rule: nodes that lost their cross-client neighbours to the rule.
        dropped_by_cap: edges (cross-client or not) removed by the neighbour cap.
        graph_digest: :meth:`Graph.structure_digest` of the graph it was made from (None: unknown),
            which :func:`check_partition` compares.
    """

    owner: np.ndarray
    neighbourhoods: CSR
    clients: list[ClientPartition]
    num_layers: int
    min_cross: int
    neighbour_cap: int | None
    cross_dropped_by_rule: int
    nodes_hit_by_rule: int
    dropped_by_cap: int
    graph_digest: str | None = field(default=None, compare=False)

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    @property
    def num_nodes(self) -> int:
        return len(self.owner)

    def __repr__(self) -> str:
        sizes = [len(c.owned) for c in self.clients]
        shown = ", ".join(map(str, sizes[:10])) + (", ..." if len(sizes) > 10 else "")
        return (
            f"Partition({self.num_clients} clients of {self.num_nodes} nodes: owning [{shown}]; "
            f"{sum(c.cross_edges for c in self.clients)} cross-client edges kept; min_cross "
            f"{self.min_cross}, neighbour_cap {self.neighbour_cap})"
        )

    def summary(self) -> dict:
        """Plain-number statistics: sizes per client and what the two filtering rules removed."""
        return {
            "num_clients": self.num_clients,
            "num_nodes": self.num_nodes,
            "nodes_per_client": [len(c.owned) for c in self.clients],
            "needed_per_client": [len(c.needed) for c in self.clients],
            "cross_edges_kept": sum(c.cross_edges for c in self.clients),
            "cross_edges_dropped_by_rule": self.cross_dropped_by_rule,
            "nodes_hit_by_rule": self.nodes_hit_by_rule,
            "edges_dropped_by_cap": self.dropped_by_cap,
        }

    def local_subgraph(self, client_id: int) -> tuple[np.ndarray, torch.Tensor]:
        """The edges a client's last GAT layer aggregates over, in local indices.

        Returns ``(needed, edge_index)``: ``needed`` is the client's ``needed`` array (local index ``l``
        is global node ``needed[l]``, owned nodes first) and ``edge_index`` the ``(2, nnz)`` int64
        edges ``j -> i`` of the filtered neighbourhoods for every *owned* target ``i``, self-loops
        included, as positions into ``needed``. Targets therefore lie in ``0..len(owned)-1`` and the
        edges are grouped by target in ``owned`` order, each row self-loop first; this is the graph a
        layer-2 ``GATConv`` runs on, given layer-1 outputs for all ``needed`` nodes.

        Raises:
            ValueError: for a 1-layer partition (``needed`` then lacks the foreign neighbours) or an
                unknown ``client_id``.
        """
        if self.num_layers < 2:
            raise ValueError("local_subgraph needs a partition built with num_layers >= 2")
        if not 0 <= client_id < self.num_clients:
            raise ValueError(f"client_id must lie in 0..{self.num_clients - 1}, got {client_id}")
        needed = self.clients[client_id].needed
        nbh = self.neighbourhoods
        targets = _row_ids(nbh)
        sel = self.owner[targets] == client_id
        local = np.full(self.num_nodes, -1, dtype=np.int64)
        local[needed] = np.arange(len(needed))
        edges = np.stack([local[nbh.indices[sel]], local[targets[sel]]])
        return needed, torch.from_numpy(edges)


def make_partition(
    graph: Graph,
    num_clients: int,
    beta: float = 1.0,
    seed: int = 0,
    num_layers: int = 2,
    min_cross: int = 0,
    neighbour_cap: int | None = None,
    owner: np.ndarray | None = None,
) -> Partition:
    """Split ``graph`` among ``num_clients`` clients and build FedGAT's neighbourhoods.

    Args:
        graph: the full graph.
        num_clients: ``K >= 1``.
        beta: Dirichlet concentration for :func:`dirichlet_split` (1: non-iid, 10000: ~iid).
        seed: seeds both the split and the neighbour cap's sampling.
        num_layers: GAT depth ``L >= 1``; ``needed`` is the ``(L-1)``-hop expansion of owned nodes.
        min_cross: the paper's minimum-cross rule ``k``: a node with fewer than ``k`` cross-client
            neighbours loses them (2 is the paper's; 0, the default, is off, and so is 1). Off by
            default because it protects nothing the audit can measure: it stops the neighbour-sum
            attack alone, while the basis and spectral attacks recover every cross-client neighbour
            with or without it (SECURITY.md), and it costs 1-4 points of accuracy.
        neighbour_cap: ``k >= 1`` to keep at most ``k`` neighbours besides the node itself, or None.
        owner: optional ``(N,)`` owner ids in ``0..K-1`` to use instead of a Dirichlet split
            (``beta`` is then unused; the minimum-cross rule and the cap apply as usual); clients may
            be empty. For owners given by a user (an organisation per node), read and check them with
            :func:`fedgat.owners.load_owners` or :func:`fedgat.owners.check_owners`, which also insist
            that every client owns a node; the Dirichlet owner array gives the Dirichlet partition.

    Raises:
        TypeError: a count (``num_clients``, ``num_layers``, ``min_cross``, ``neighbour_cap``) that
            is not an integer.
        ValueError: ``num_clients``, ``num_layers`` or ``neighbour_cap`` below 1, ``min_cross`` below
            0, ``beta`` not finite and positive, or ``owner`` of the wrong shape, dtype or range.
    """
    check_graph(graph)
    _check_clients_beta(num_clients, beta)
    check_seed(seed)
    _check_int("num_layers", num_layers, 1)
    check_rule(min_cross, neighbour_cap)

    n = graph.num_nodes
    labels = graph.y.numpy()
    if owner is None:
        owner = dirichlet_split(labels, num_clients, beta, seed)
    else:
        owner = np.asarray(owner)
        if owner.shape != (n,) or not np.issubdtype(owner.dtype, np.integer):
            raise ValueError(
                f"owner must be an integer array of shape ({n},), got {owner.shape} {owner.dtype}"
            )
        if n and (owner.min() < 0 or owner.max() >= num_clients):
            raise ValueError(f"owner ids must lie in 0..{num_clients - 1}")
        owner = owner.astype(np.int64)

    nbh = graph.neighbourhoods(self_loops=True)
    nbh, dropped_1, hit_1 = _min_cross_rule(nbh, owner, min_cross)
    dropped_cap = 0
    if neighbour_cap is not None:
        before = len(nbh.indices)
        nbh = _cap(nbh, neighbour_cap, np.random.default_rng([seed, 1]))
        dropped_cap = before - len(nbh.indices)
    nbh, dropped_2, hit_2 = _min_cross_rule(nbh, owner, min_cross)

    targets = _row_ids(nbh)
    is_cross = owner[nbh.indices] != owner[targets]
    cross_per_client = np.bincount(owner[targets[is_cross]], minlength=num_clients)
    masks = {s: getattr(graph, f"{s}_mask").numpy() for s in ("train", "val", "test")}

    clients = []
    for c in range(num_clients):
        is_owned = owner == c
        owned = np.flatnonzero(is_owned)
        reached = is_owned.copy()
        for _ in range(num_layers - 1):
            step = reached.copy()
            step[nbh.indices[reached[targets]]] = True
            reached = step
        clients.append(
            ClientPartition(
                client_id=c,
                owned=owned,
                needed=np.concatenate([owned, np.flatnonzero(reached & ~is_owned)]),
                cross_edges=int(cross_per_client[c]),
                train_nodes=owned[masks["train"][owned]],
                val_nodes=owned[masks["val"][owned]],
                test_nodes=owned[masks["test"][owned]],
            )
        )

    return Partition(
        owner=owner,
        neighbourhoods=nbh,
        clients=clients,
        num_layers=int(num_layers),
        min_cross=int(min_cross),
        neighbour_cap=None if neighbour_cap is None else int(neighbour_cap),
        cross_dropped_by_rule=dropped_1 + dropped_2,
        nodes_hit_by_rule=int((hit_1 | hit_2).sum()),
        dropped_by_cap=dropped_cap,
        graph_digest=graph.structure_digest(),
    )


class PartitionMismatchError(ValueError):
    """A partition used with another graph than the one it was made from."""


def check_graph(graph: object) -> None:
    """TypeError unless ``graph`` is a fedgat :class:`~fedgat.graph.Graph`, saying how to get one."""
    if not isinstance(graph, Graph):
        raise TypeError(
            f"graph must be a fedgat Graph, got {type(graph).__name__}: load_dataset gives one, and "
            "Graph.from_pyg(data) makes one of a PyG Data (or a dict of its fields)"
        )


def check_partition(graph: Graph, partition: Partition) -> None:
    """Refuse ``partition`` unless it was made from ``graph`` (its node count, edges and split masks:
    :meth:`Graph.structure_digest`); a partition of another graph would give neighbourhoods, and so
    encodings and scores, that are not this graph's, silently.

    Raises:
        TypeError: ``graph`` or ``partition`` of another type (e.g. a dataset name: load it first).
        PartitionMismatchError: naming what differs.
    """
    check_graph(graph)
    if not isinstance(partition, Partition):
        raise TypeError(f"partition must be a Partition (make_partition), got {type(partition).__name__}")
    if partition.num_nodes != graph.num_nodes:
        raise PartitionMismatchError(
            f"the partition covers {partition.num_nodes} nodes but graph {graph.name!r} has "
            f"{graph.num_nodes}: it was made from another graph (make_partition(graph, ...))"
        )
    if partition.graph_digest is not None and partition.graph_digest != graph.structure_digest():
        raise PartitionMismatchError(
            f"the partition was made from another graph than {graph.name!r} (same node count, other "
            "edges or split masks); make it from this graph (make_partition(graph, ...))"
        )


def drop_cross_client(partition: Partition) -> CSR:
    """The partition's neighbourhoods with every cross-client edge removed (DistGAT's view: each
    client attends only over neighbours it owns). Self-loops stay first."""
    nbh = partition.neighbourhoods
    targets = _row_ids(nbh)
    owner = partition.owner
    return _filter(nbh, owner[nbh.indices] == owner[targets])


def check_rule(min_cross: object, neighbour_cap: object) -> None:
    """``min_cross`` an integer ``>= 0`` (0: off), ``neighbour_cap`` None or an integer ``>= 1``.

    Raises:
        TypeError: a value that is not an integer.
        ValueError: a value below its least.
    """
    _check_int("min_cross", min_cross, 0)
    if neighbour_cap is not None:
        _check_int("neighbour_cap", neighbour_cap, 1)


def _check_int(name: str, value, minimum: int | None) -> None:
    """TypeError unless ``value`` is an integer; ValueError if it is below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_clients_beta(num_clients: int, beta: float) -> None:
    _check_int("num_clients", num_clients, 1)
    if not (np.isfinite(beta) and beta > 0):
        raise ValueError(f"beta must be finite and > 0, got {beta!r}")


def _row_ids(csr: CSR) -> np.ndarray:
    """Row (target) id of every entry of ``csr.indices``."""
    return np.repeat(np.arange(csr.num_nodes), csr.degrees())


def _filter(csr: CSR, keep: np.ndarray) -> CSR:
    """Keep the entries where ``keep`` is True, preserving their order within rows."""
    counts = np.bincount(_row_ids(csr)[keep], minlength=csr.num_nodes)
    indptr = np.zeros(csr.num_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return CSR(indptr, csr.indices[keep])


def _min_cross_rule(csr: CSR, owner: np.ndarray, min_cross: int) -> tuple[CSR, int, np.ndarray]:
    """Drop all cross-client neighbours of nodes that have ``0 < c < min_cross`` of them.

    Returns the filtered CSR, the number of entries dropped and the ``(N,)`` mask of nodes hit."""
    targets = _row_ids(csr)
    is_cross = owner[csr.indices] != owner[targets]
    count = np.bincount(targets[is_cross], minlength=csr.num_nodes)
    hit = (count > 0) & (count < min_cross)
    drop = is_cross & hit[targets]
    return _filter(csr, ~drop), int(drop.sum()), hit


def _cap(csr: CSR, k: int, rng: np.random.Generator) -> CSR:
    """Keep the self-loop (first entry) and a uniform random ``k`` of the other entries of each row
    that has more than ``k`` of them."""
    targets = _row_ids(csr)
    first = np.arange(len(csr.indices)) == csr.indptr[targets]
    over = csr.degrees() - 1 > k
    cand = np.flatnonzero(~first & over[targets])
    # shuffle each over-full row's candidates: sort by (row, random key)
    order = cand[np.lexsort((rng.random(len(cand)), targets[cand]))]
    rows = targets[order]
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    keep = np.ones(len(csr.indices), dtype=bool)
    keep[order[rank >= k]] = False
    return _filter(csr, keep)
