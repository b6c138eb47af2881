r"""The plan of a pre-training round: who needs which rows, which results the server computes, and
where each result goes. Pure functions of the clients' graph announcements and the bases' randomness.

A client's *needed* nodes are its owned nodes and their attention neighbours (the 1-hop expansion a
2-layer model needs, :func:`needed_from_neighbourhoods`). The server draws one set of bases per needed
node (:func:`fedgat.encodings.draw_bases`, paper eq. 9-14), computes each node's encodings once per
distinct *view* (:func:`fedgat.crypto.encodings.plan_views`: one view without DP; with DP a client
reads its own clean uploads and every other source's release), and streams each result to every
client that needs it. Each client receives its share of the bases cut into buckets
(:func:`client_bucket_views`); ``route[c][node]`` is the bucket of ``c`` a node's result belongs to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fedgat.crypto import SlotLayout
from fedgat.crypto.encodings import PackedShares, ShareBucket, multiply_adds, plan_views
from fedgat.encodings import BucketBases, draw_bases
from fedgat.graph import CSR
from fedgat.randomness import RandomSource

from .messages import GraphAnnounce, ResultItem

if TYPE_CHECKING:
    from fedgat.partition import Partition

__all__ = [
    "ResultBatcher",
    "RoundPlan",
    "client_bucket_views",
    "needed_from_neighbourhoods",
    "partition_graphs",
    "plan_round",
    "plan_shares",
    "recipient_shares",
    "share_order",
    "shortfall",
    "unsound_without",
]


def needed_from_neighbourhoods(owned: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """A client's needed nodes for a 2-layer model: ``owned`` (sorted), then the sorted other nodes in
    its owned nodes' neighbourhoods (= :attr:`fedgat.partition.ClientPartition.needed`)."""
    owned = np.asarray(owned, dtype=np.int64)
    return np.concatenate([owned, np.setdiff1d(np.asarray(indices, dtype=np.int64), owned)])


def client_bucket_views(
    buckets: Sequence[BucketBases], needed: np.ndarray, max_elems: int = 1 << 20
) -> list[tuple[int, BucketBases]]:
    """One client's buckets cut from the server's global ``buckets``: the nodes it needs, ``rows`` =
    positions in ``needed``, split so that ``p`` holds at most ``max_elems`` reals. Returns
    ``(global bucket index, view)`` pairs in global order (the order the server sends them)."""
    needed = np.asarray(needed, dtype=np.int64)
    order = np.argsort(needed, kind="stable")
    ids = needed[order]
    views = []
    for g, b in enumerate(buckets):
        at = np.minimum(np.searchsorted(ids, b.nodes), len(ids) - 1)
        sel = np.flatnonzero(ids[at] == b.nodes)
        position = order[at]
        per = max(1, max_elems // (b.m * b.n))
        for start in range(0, len(sel), per):
            s = sel[start : start + per]
            views.append((g, b.take(s, rows=position[s])))
    return views


def shortfall(graphs: Sequence[GraphAnnounce]) -> np.ndarray:
    """Nodes the announcing clients need (their nodes and neighbours) that none of them owns."""
    if not graphs:
        return np.zeros(0, np.int64)
    needed = np.unique(np.concatenate([g.indices for g in graphs]))
    return np.setdiff1d(needed, np.concatenate([g.owned for g in graphs]))


def unsound_without(
    missing: Sequence[int],
    participants: Sequence[int],
    graphs: Mapping[int, GraphAnnounce],
    owner: Mapping[int, int],
) -> str | None:
    """Why a round cannot go on without the ``missing`` clients (None: it can): no client is left, or a remaining client needs a node that a missing one owns. Graphs
    still to come are judged at the next deadline."""
    keep = [c for c in participants if c not in missing]
    if not keep:
        return f"no client is left; missing parties {list(missing)}"
    if any(c not in graphs for c in keep):
        return None
    nodes = shortfall([graphs[c] for c in keep])
    if not len(nodes):
        return None
    named = sorted({owner[int(n)] for n in nodes if int(n) in owner}) or list(missing)
    return (
        f"{len(nodes)} nodes needed by the remaining clients (e.g. node {int(nodes[0])}) belong to "
        f"missing parties {named}"
    )


@dataclass
class RoundPlan:
    """What the server computes and sends in a round (:func:`plan_round`).

    Attributes:
        needed: per client, its needed nodes (owned first, :func:`needed_from_neighbourhoods`).
        bases: the drawn bases, one per needed node, bucketed by neighbourhood size.
        buckets: the compute buckets (``neighbours`` are spool keys; without DP ``bases`` itself).
        recipients: per computed result, in bucket then slot order, the clients that receive it.
        views: per client, its buckets of bases in the order they are sent (bucket index = position).
        route: per client, node -> index of the client's bucket holding it.
    """

    needed: dict[int, np.ndarray]
    bases: list[BucketBases]
    buckets: list[BucketBases] | list[PackedShares]
    recipients: list[tuple[int, ...]]
    views: dict[int, list[BucketBases]]
    route: dict[int, dict[int, int]]
    #: shares plan: per recipient, the compute buckets of its foreign shares (in :attr:`buckets`)
    shares: dict[int, list[PackedShares]] | None = None

    @property
    def num_results(self) -> int:
        return len(self.recipients)

    @property
    def whole_buckets(self) -> list[BucketBases]:
        """:attr:`buckets` of a plaintext plan (:func:`plan_round`: whole encodings per node).

        Raises:
            TypeError: a shares plan (:func:`plan_shares`)."""
        out = [b for b in self.buckets if isinstance(b, BucketBases)]
        if len(out) != len(self.buckets):
            raise TypeError("a shares plan computes foreign shares, not whole encodings")
        return out

    def results_for(self, client: int) -> int:
        """Results the client receives."""
        return sum(client in r for r in self.recipients)

    def multiply_adds(self, layout: SlotLayout) -> int:
        """Plaintext x ciphertext multiply-adds of the whole round's compute (the op-count bound)."""
        return sum(
            b.multiply_adds(layout) if isinstance(b, PackedShares) else multiply_adds(b, layout)
            for b in self.buckets
        )

    def num_feature_rows(self) -> list[int]:
        """Per compute bucket, the feature rows of one of its results."""
        return [b.num_feature_rows() for b in self.buckets]


def _draw(
    graphs: Mapping[int, GraphAnnounce], variant: str, rng: RandomSource, embed_factor: int
) -> tuple[dict[int, np.ndarray], list[BucketBases]]:
    """Every client's needed nodes and the bases of all of them, drawn once."""
    needed = {c: needed_from_neighbourhoods(g.owned, g.indices) for c, g in graphs.items()}
    nodes = np.unique(np.concatenate(list(needed.values())))
    rows: list[np.ndarray] = [np.zeros(0, np.int64)] * len(nodes)
    for g in graphs.values():
        for k, pos in enumerate(np.searchsorted(nodes, g.owned)):
            rows[int(pos)] = g.indices[g.indptr[k] : g.indptr[k + 1]]
    drawn = draw_bases(variant, CSR.from_rows(rows), np.arange(len(nodes)), rng, embed_factor=embed_factor)
    return needed, [BucketBases(b.variant, b.rows, nodes[b.nodes], b.neighbours, b.p, b.q) for b in drawn]


def _views(
    bases: list[BucketBases], needed: Mapping[int, np.ndarray], max_bucket_elems: int
) -> tuple[dict[int, list[BucketBases]], dict[int, dict[int, int]]]:
    views: dict[int, list[BucketBases]] = {}
    route: dict[int, dict[int, int]] = {}
    for c, nodes in needed.items():
        views[c] = [view for _, view in client_bucket_views(bases, nodes, max_bucket_elems)]
        route[c] = {int(n): cb for cb, view in enumerate(views[c]) for n in view.nodes}
    return views, route


def plan_round(
    graphs: Mapping[int, GraphAnnounce],
    variant: str,
    rng: RandomSource,
    *,
    embed_factor: int = 1,
    with_views: bool = False,
    max_bucket_elems: int = 1 << 20,
) -> RoundPlan:
    """Plan a *plaintext* round (:mod:`fedgat.plain_encoder`) for the clients of ``graphs`` (client
    id -> its announcement; every needed node must be owned by one of them, see :func:`shortfall`):
    each node's whole encodings computed once and sent to every client that needs it.

    The bases are drawn over positions in the sorted needed ids, which keep the ids' order, so the
    draws equal those over global ids (the encrypted round's :func:`plan_shares` with the same
    ``rng`` draws the same bases). ``with_views`` (DP): one result per distinct view of a node,
    reading each client's own clean rows and every other source's release.
    """
    clients = list(graphs)
    needed, bases = _draw(graphs, variant, rng, embed_factor)
    pair_nodes = np.concatenate([needed[c] for c in clients])
    pair_clients = np.repeat(clients, [len(needed[c]) for c in clients])
    if with_views:
        owned = [graphs[c].owned for c in clients]
        ids = np.concatenate(owned)
        owners = np.repeat(clients, [len(o) for o in owned])
        order = np.argsort(ids, kind="stable")
        compute = plan_views(bases, pair_nodes, pair_clients, ids[order], owners[order])
    else:
        compute = plan_views(bases, pair_nodes, pair_clients)
    views, route = _views(bases, needed, max_bucket_elems)
    return RoundPlan(needed, bases, compute.buckets, compute.recipients, views, route)


def plan_shares(
    graphs: Mapping[int, GraphAnnounce],
    variant: str,
    rng: RandomSource,
    *,
    layout: SlotLayout,
    embed_factor: int = 1,
    max_bucket_elems: int = 1 << 20,
    labels: Callable[[int, np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> RoundPlan:
    """Plan the encrypted round: the bases of every needed node drawn once, and per recipient the
    *partials* of its foreign share: for each node it needs and each other client owning some of the
    node's neighbours, the linear map over that owner's neighbours
    (:class:`~fedgat.crypto.encodings.ShareBucket` with ``owner``, computed under the recipient's
    key from the rows released to it). A recipient adds the partials and the share of its own rows
    itself. ``buckets`` lists the share buckets recipient by recipient (sorted), then by client
    bucket, then by owner, each with its partials packed in the session's ``layout``
    (:class:`~fedgat.crypto.encodings.PackedShares`); ``recipients`` one client per result (pack).

    Per-owner partials cost no extra multiply-add (each neighbour is read by one partial) but one
    result per (node, foreign owner) instead of per node: more download bytes and decryptions. They
    are what lets the recipient check each partial against its owner's keys alone. Packing the
    partials' tails wins most of those bytes back.

    ``labels(recipient, nodes, neighbours)``: the owner of each entry of a bucket's ``(B, n)``
    ``neighbours``, as the recipient's bases will name them (default: the announced graphs' owners);
    the server passes the function it labels the bases with, so the partials follow the labels."""
    needed, bases = _draw(graphs, variant, rng, embed_factor)
    views, route = _views(bases, needed, max_bucket_elems)
    owner_of = labels if labels is not None else _announced_owners(graphs)
    shares = {c: recipient_shares(c, views[c], owner_of, layout) for c in sorted(graphs)}
    return RoundPlan(needed, bases, *share_order(shares), views, route, shares)


def _announced_owners(
    graphs: Mapping[int, GraphAnnounce],
) -> Callable[[int, np.ndarray, np.ndarray], np.ndarray]:
    ids = np.concatenate([graphs[c].owned for c in graphs])
    who = np.repeat(list(graphs), [len(graphs[c].owned) for c in graphs])
    order = np.argsort(ids, kind="stable")
    ids, who = ids[order], who[order]

    def owners(recipient: int, nodes: np.ndarray, neighbours: np.ndarray) -> np.ndarray:
        return who[np.minimum(np.searchsorted(ids, neighbours), len(ids) - 1)]

    return owners


def recipient_shares(
    recipient: int,
    views: Sequence[BucketBases],
    labels: Callable[[int, np.ndarray, np.ndarray], np.ndarray],
    layout: SlotLayout,
) -> list[PackedShares]:
    """One recipient's compute buckets (:func:`plan_shares`): per bucket of its ``views`` and per
    other owner its ``labels`` name, that owner's partials, packed."""
    out: list[PackedShares] = []
    for view in views:
        owner = labels(recipient, view.nodes, view.neighbours)
        for o in np.unique(owner[owner != recipient]).tolist():
            part = owner == o
            has = np.flatnonzero(part.any(axis=1))
            out.append(PackedShares(ShareBucket(view.take(has), part[has], owner=int(o)), layout))
    return out


def share_order(shares: Mapping[int, list[PackedShares]]) -> tuple[list[PackedShares], list[tuple[int, ...]]]:
    """:attr:`RoundPlan.buckets` and :attr:`RoundPlan.recipients` of a shares plan: recipient by
    recipient (sorted), one recipient per result."""
    buckets = [b for c in sorted(shares) for b in shares[c]]
    recipients: list[tuple[int, ...]] = [
        (c,) for c in sorted(shares) for b in shares[c] for _ in range(len(b))
    ]
    return buckets, recipients


def partition_graphs(partition: Partition, dim: int = 1) -> dict[int, GraphAnnounce]:
    """The graph announcement of every client of ``partition`` that owns a node: its owned nodes and
    their (filtered) neighbourhoods, as :func:`fedgat.app.build_pretrain_client` announces them (the
    header fields are placeholders: nothing is framed). What a plaintext twin plans its round from."""
    nbh = partition.neighbourhoods
    graphs = {}
    for c, cp in enumerate(partition.clients):
        owned = np.asarray(cp.owned, dtype=np.int64)
        if not len(owned):
            continue
        sizes = nbh.degrees()[owned]
        indptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        at = np.repeat(nbh.indptr[owned] - indptr[:-1], sizes) + np.arange(indptr[-1])
        graphs[c] = GraphAnnounce(
            sender=c,
            recipient=partition.num_clients,
            session=0,
            seq=0,
            dim=dim,
            owned=owned,
            indptr=indptr,
            indices=nbh.indices[at].astype(np.int64),
        )
    return graphs


class ResultBatcher:
    """Collects each computed result into the batch of every client bucket it belongs to, and says
    which batches are ready: a bucket's last result, or ``batch_bytes`` of results waiting. Results
    may come in any order (the server interleaves its recipients); each names its position in the
    plan."""

    def __init__(self, plan: RoundPlan, batch_bytes: int) -> None:
        self._plan, self._batch_bytes = plan, batch_bytes
        self._remaining: dict[tuple[int, int], int] = {}
        for b, recipients in _per_bucket(plan):
            for node, rs in zip(b.nodes, recipients, strict=True):
                for c in rs:
                    key = (c, plan.route[c][int(node)])
                    self._remaining[key] = self._remaining.get(key, 0) + 1
        self._pending: dict[tuple[int, int], list[ResultItem]] = {}
        self._bytes: dict[tuple[int, int], int] = {}
        self.results = 0

    def add(self, item: ResultItem, at: int) -> list[tuple[int, int, tuple[ResultItem, ...]]]:
        """Route the result at position ``at`` of the plan's order (of :attr:`RoundPlan.recipients`);
        returns the ``(client, bucket, items)`` batches that are ready."""
        ready = []
        for c in self._plan.recipients[at]:
            key = (c, self._plan.route[c][item.node])
            self._pending.setdefault(key, []).append(item)
            self._bytes[key] = self._bytes.get(key, 0) + item.nbytes()
            self._remaining[key] -= 1
            if self._remaining[key] == 0 or self._bytes[key] >= self._batch_bytes:
                ready.append((*key, tuple(self._pending.pop(key))))
                self._bytes.pop(key)
        self.results += 1
        return ready


def _per_bucket(plan: RoundPlan) -> Iterator[tuple[BucketBases | PackedShares, list[tuple[int, ...]]]]:
    """``(compute bucket, recipients of each of its results)`` in the plan's order."""
    start = 0
    for b in plan.buckets:
        yield b, plan.recipients[start : start + len(b)]
        start += len(b)
