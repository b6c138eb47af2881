r"""The plaintext encoder: the server's per-node compute in the clear, behind the encoders' seam.

:class:`PlainEncoder` is a :class:`fedgat.crypto.encoders.BucketEncoder` like the encrypted encoders
(:class:`~fedgat.crypto.encoders.InlineEncoder`, :class:`~fedgat.crypto.encoders.ProcessPoolEncoder`,
:class:`~fedgat.crypto.ray_encoder.RayEncoder`): ``map(buckets)`` yields one :class:`PlainResult` per
node, in bucket then slot order, holding every row of :math:`F_i = A_i H_i`
(:meth:`~fedgat.encodings.BucketBases.coefficients` times the rows of the node's sources,
:math:`h_i` included). It reads plaintext rows keyed like the server's spool (:class:`PlainRows`:
each node's clean row under its id and, with DP, its release under
:func:`~fedgat.crypto.encodings.release_key`), so it computes the compute buckets of a
:class:`~fedgat.protocols.pretrain_plan.RoundPlan` unchanged. The work is vectorised per bucket: one
gather of the sources' rows and one batched matmul per slice of at most ``max_elems`` gathered reals.

:func:`assemble_encodings` routes the results as the protocol does: result ``k`` goes to every client
of ``plan.recipients[k]``, into that client's bucket ``plan.route[c][node]`` of ``plan.views[c]``,
and a client's own nodes get its own plaintext row as :math:`h_i` (as
:class:`~fedgat.protocols.pretrain_client.ClientPretrain` substitutes it for the decrypted row 0).
:class:`PlaintextRound` (a plan, the rows and the owners) runs both: it is the plaintext baseline
(:func:`fedgat.pipeline.run_plaintext_pretraining`, ``fedgat bench overhead``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, islice
from typing import TYPE_CHECKING, NamedTuple, Self

import numpy as np
import torch

from fedgat.crypto.encodings import release_key
from fedgat.encodings import BucketBases, EncodingBucket, Encodings, as_variant
from fedgat.protocols.pretrain_plan import RoundPlan, partition_graphs, plan_round, shortfall
from fedgat.randomness import RandomSource

if TYPE_CHECKING:
    from fedgat.crypto.encoders import BucketEncoder
    from fedgat.partition import Partition

__all__ = ["PlainEncoder", "PlainResult", "PlainRows", "PlaintextRound", "assemble_encodings"]


class PlainRows:
    """Plaintext feature rows keyed like :class:`fedgat.crypto.spool.CiphertextSpool` (int64 keys:
    node ids, and :func:`~fedgat.crypto.encodings.release_key` of a node for its DP release).

    Args:
        keys: ``(K,)`` distinct keys.
        rows: ``(K, d)`` the row of each key (its dtype is the compute dtype).
    """

    def __init__(self, keys: np.ndarray, rows: torch.Tensor) -> None:
        keys = np.asarray(keys, dtype=np.int64)
        if rows.dim() != 2 or rows.shape[0] != len(keys):
            raise ValueError(f"expected ({len(keys)}, d) rows, got {tuple(rows.shape)}")
        if np.all(np.diff(keys) > 0):  # sorted already (as uploads() builds them): no copy
            self.keys, self.rows = keys, rows.contiguous()
            return
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        if np.any(np.diff(self.keys) == 0):
            raise ValueError("duplicate keys")
        self.rows = rows[torch.from_numpy(order)].contiguous()

    @classmethod
    def uploads(cls, x: torch.Tensor, nodes: np.ndarray, release: torch.Tensor | None = None) -> PlainRows:
        """What the clients upload for ``nodes``: row ``x[i]`` under key ``i`` and, with ``release``
        (DP), ``release[i]`` under ``release_key(i)``."""
        nodes = np.sort(np.asarray(nodes, dtype=np.int64))
        index = torch.from_numpy(nodes)
        if release is None:
            return cls(nodes, x[index])
        return cls(
            np.concatenate([nodes, np.asarray(release_key(nodes))]),
            torch.cat([x[index], release.to(x.dtype)[index]]),
        )

    @property
    def d(self) -> int:
        return int(self.rows.shape[1])

    @property
    def dtype(self) -> torch.dtype:
        return self.rows.dtype

    def __len__(self) -> int:
        return len(self.keys)

    def index(self, keys: np.ndarray) -> np.ndarray:
        """Positions of ``keys`` (any shape) in :attr:`rows`.

        Raises:
            KeyError: a key has no row (no client uploaded it).
        """
        keys = np.asarray(keys, dtype=np.int64)
        if not len(self.keys):
            if keys.size:
                raise KeyError(f"no rows for key {int(keys.flat[0])}")
            return np.zeros(keys.shape, np.int64)
        at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        bad = self.keys[at] != keys
        if bad.any():
            raise KeyError(f"no rows for key {int(keys[bad].flat[0])}")
        return at

    def get(self, keys: np.ndarray) -> torch.Tensor:
        """``keys.shape + (d,)``: the rows of ``keys``."""
        return self.rows[torch.from_numpy(self.index(keys))]


class PlainResult(NamedTuple):
    """Plaintext encodings of one node: ``rows`` ``(1 + m, d)`` in the
    :meth:`~fedgat.encodings.BucketBases.coefficients` layout, :math:`h_i` first."""

    node: int
    rows: torch.Tensor

    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()


class PlainEncoder:
    """:math:`A_i H_i` in the clear for every node of ``buckets``, from :class:`PlainRows`
    (a :class:`~fedgat.crypto.encoders.BucketEncoder` of :class:`PlainResult`).

    Args:
        rows: the uploads, keyed like the spool (the compute buckets' ``neighbours`` are keys).
        max_elems: reals of gathered source rows per batched matmul (a bucket is sliced above it).
        out_dtype: the dtype of the results (default: the compute dtype, ``rows.dtype``); the
            products are computed in the compute dtype and rounded once.

    A node's result is a view into its slice's ``(b, 1 + m, d)`` block, and consecutive nodes' results
    are consecutive in it, so :func:`assemble_encodings` takes a slice's results as the block itself
    (:func:`stacked`) instead of copying them. The gathered sources (and, when ``out_dtype`` differs
    from the compute dtype, the products before rounding) are written into one buffer reused from
    slice to slice: large tensors allocated afresh cost a page fault per 4 KiB page, which on a VM
    costs more than the copy (``benchmarks/graph_scale.py``).
    """

    workers = 0

    def __init__(
        self, rows: PlainRows, max_elems: int = 1 << 24, *, out_dtype: torch.dtype | None = None
    ) -> None:
        self._rows = rows
        self.max_elems = max(1, max_elems)
        self.out_dtype = rows.dtype if out_dtype is None else out_dtype
        self._buffers: dict[str, torch.Tensor] = {}

    def _buffer(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """A ``shape`` tensor of the compute dtype over the reused buffer ``name`` (grown as needed)."""
        n = int(np.prod(shape))
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < n:
            buf = self._buffers[name] = torch.empty(n, dtype=self._rows.dtype)
        return buf[:n].view(shape)

    def map_bucket(self, bucket: BucketBases) -> Iterator[torch.Tensor]:
        """``(b, 1 + m, d)`` rows of consecutive slices of ``bucket``'s nodes, in slot order (each a
        new tensor of :attr:`out_dtype`)."""
        rows, d = self._rows, self._rows.d
        coefficients = torch.from_numpy(bucket.coefficients()).to(rows.dtype)
        per = max(1, self.max_elems // max(1, bucket.n * d))
        for start in range(0, len(bucket), per):
            keys = bucket.neighbours[start : start + per]  # (b, n)
            index = torch.from_numpy(rows.index(keys).reshape(-1))
            sources = self._buffer("sources", (len(keys), bucket.n, d))
            torch.index_select(rows.rows, 0, index, out=sources.view(-1, d))
            a = coefficients[start : start + per]
            if self.out_dtype == rows.dtype:
                yield torch.bmm(a, sources)
                continue
            products = self._buffer("products", (len(keys), a.shape[1], d))
            torch.bmm(a, sources, out=products)
            yield products.to(self.out_dtype)

    def map(self, buckets: Iterable[BucketBases]) -> Iterator[PlainResult]:
        """Plaintext encodings of every node of every bucket, in bucket order."""
        for b in buckets:
            nodes, at = b.nodes.tolist(), 0
            for block in self.map_bucket(b):
                yield from map(PlainResult, nodes[at : at + len(block)], block)
                at += len(block)

    def close(self) -> None:
        self._buffers.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stacked(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(rows)`` without copying the runs of rows that already lie one after another in
    one storage (the slices of :meth:`PlainEncoder.map_bucket`, unbound): a view of the block when
    all of them do, else one copy."""
    runs: list[list[torch.Tensor]] = []
    for r in rows:
        if runs and _follows(runs[-1][-1], r):
            runs[-1].append(r)
        else:
            runs.append([r])
    blocks = [_block(run) for run in runs]
    if len(blocks) == 1:
        return blocks[0]
    return torch.cat(blocks)


def _follows(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``b`` is ``a``'s contiguous twin right after it in the same storage."""
    return (
        a.is_contiguous()
        and b.is_contiguous()
        and a.shape == b.shape
        and a.dtype == b.dtype
        and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and b.storage_offset() == a.storage_offset() + a.numel()
    )


def _block(run: list[torch.Tensor]) -> torch.Tensor:
    """The rows of one run as one ``(len(run), ...)`` tensor, a view of their storage (a copy only
    for a run of one row that is not contiguous)."""
    first = run[0]
    if not first.is_contiguous():
        return first.unsqueeze(0).contiguous()
    shape, stride = (len(run), *first.shape), (first.numel(), *first.stride())
    return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), shape, stride)


def _positions(nodes: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Slots of ``wanted`` in ``nodes`` (ValueError for a node not there)."""
    order = np.argsort(nodes, kind="stable")
    at = np.minimum(np.searchsorted(nodes[order], wanted), len(nodes) - 1)
    if not np.array_equal(nodes[order][at], wanted):
        raise ValueError("a result is routed to a bucket that does not hold its node")
    return order[at]


def assemble_encodings(
    plan: RoundPlan,
    results: Iterable[PlainResult],
    variant: str,
    *,
    owned: Mapping[int, np.ndarray],
    own_rows: PlainRows,
    dtype: torch.dtype | None = None,
) -> dict[int, Encodings]:
    """Every client's :class:`~fedgat.encodings.Encodings` from the results of ``plan.buckets`` (in
    the plan's order), routed like the server's :class:`~fedgat.protocols.pretrain_plan.ResultBatcher`
    and placed like :class:`~fedgat.protocols.pretrain_client.ClientPretrain`: result ``k`` to each
    client ``c`` of ``plan.recipients[k]``, into its bucket ``plan.route[c][node]`` of
    ``plan.views[c]``; the nodes of ``owned[c]`` then get their own row of ``own_rows`` (key: the
    node id) as :math:`h_i`. Routing is vectorised per compute bucket and client bucket; each
    client bucket's rows are copied once, from the results into its contiguous tensors, stored in
    ``dtype`` (default the compute dtype, ``own_rows.dtype``; the values are computed in that and
    rounded once, so float32 storage of a float64 round equals its float64 encodings cast).

    Raises:
        ValueError: the results do not follow the plan, or a client bucket is left incomplete or
            receives a node twice.
    """
    dtype = own_rows.dtype if dtype is None else dtype
    done: dict[int, list[EncodingBucket | None]] = {c: [None] * len(v) for c, v in plan.views.items()}
    stream = iter(results)
    start = 0
    for b in plan.whole_buckets:
        got = list(islice(stream, len(b)))
        if not np.array_equal(np.fromiter((r.node for r in got), np.int64, len(got)), b.nodes):
            raise ValueError("the results do not follow the plan's compute buckets")
        if not got:
            continue
        if got[0].rows.shape[0] != b.num_feature_rows():
            raise ValueError(f"results of {got[0].rows.shape[0]} rows; the bases have {b.num_feature_rows()}")
        # (B, 1 + m, d): views of the encoder's blocks where a bucket is one slice, else one copy
        rows = stacked([r.rows for r in got]).to(dtype)
        h_self, k2 = rows[:, 0], rows[:, 1:]
        del got
        recipients = plan.recipients[start : start + len(b)]
        start += len(b)
        counts = np.fromiter(map(len, recipients), np.int64, len(b))
        clients = np.fromiter(chain.from_iterable(recipients), np.int64, int(counts.sum()))
        slots = np.repeat(np.arange(len(b)), counts)
        route = plan.route
        cbs = np.fromiter(
            (route[c][n] for c, n in zip(clients.tolist(), b.nodes[slots].tolist(), strict=True)),
            np.int64,
            len(clients),
        )
        order = np.lexsort((cbs, clients))
        clients, cbs, slots = clients[order], cbs[order], slots[order]
        cuts = np.flatnonzero((np.diff(clients) != 0) | (np.diff(cbs) != 0)) + 1
        for group in np.split(np.arange(len(clients)), cuts):
            if not len(group):
                continue
            # a client bucket is cut from one drawn bucket: one group of one compute bucket fills it
            c, cb, sel = int(clients[group[0]]), int(cbs[group[0]]), slots[group]
            view = plan.views[c][cb]
            pos = _positions(view.nodes, b.nodes[sel])
            if done[c][cb] is not None or not np.array_equal(np.sort(pos), np.arange(len(view))):
                raise ValueError(f"client {c}, bucket {cb}: a node is missing or received twice")
            at = np.empty(len(view), np.int64)
            at[pos] = sel
            index = torch.from_numpy(at)
            h = h_self.index_select(0, index)
            mine = np.isin(view.nodes, owned.get(c, np.zeros(0, np.int64)))
            if mine.any():  # the client's own plaintext h_i, as it substitutes for the decrypted row 0
                h[torch.from_numpy(mine)] = own_rows.get(view.nodes[mine]).to(dtype)
            done[c][cb] = EncodingBucket(view, h, k2.index_select(0, index))
        del rows, h_self, k2
    if start != plan.num_results or next(stream, None) is not None:
        raise ValueError("the results do not follow the plan's compute buckets")
    out = {}
    for c, buckets in done.items():
        if any(e is None for e in buckets):
            raise ValueError(f"client {c}: a bucket received no results")
        out[c] = Encodings(variant, plan.needed[c], [e for e in buckets if e is not None])
    return out


@dataclass
class PlaintextRound:
    """A pre-training round in the clear: the server's ``plan``, every client's uploads ``rows``
    (keyed like the spool) and the nodes each client ``owned``.

    :meth:`run` is the plaintext baseline: the plaintext encoder over ``plan.buckets`` (the server's
    compute), then :func:`assemble_encodings` (the routing and the clients' placement)."""

    plan: RoundPlan
    rows: PlainRows
    owned: dict[int, np.ndarray]
    variant: str

    @classmethod
    def from_partition(
        cls,
        partition: Partition,
        x: torch.Tensor,
        variant: str,
        rng: RandomSource,
        *,
        release: torch.Tensor | None = None,
        embed_factor: int = 1,
    ) -> PlaintextRound:
        """The round of ``partition`` in the clear: the server's
        :func:`~fedgat.protocols.pretrain_plan.plan_round` over the clients' graph announcements
        (:func:`~fedgat.protocols.pretrain_plan.partition_graphs`) with the bases' randomness ``rng``
        (:func:`fedgat.app.bases_rng` of a seed gives the encrypted server's bases), and every owned
        node's upload: ``x[i]`` (``(N, d)``, the compute dtype) and, with ``release`` (DP: then ``x``
        holds the clean projections), ``release[i]``; the plan then has one result per view.

        Raises:
            ValueError: a needed node is owned by no client, or ``partition.needed`` is not the
                1-hop expansion of the owned nodes (as the protocol ships it).
        """
        graphs = partition_graphs(partition, int(x.shape[1]))
        missing = shortfall(list(graphs.values()))
        if len(missing):
            raise ValueError(
                f"{len(missing)} neighbours are owned by no client (e.g. node {int(missing[0])})"
            )
        plan = plan_round(graphs, variant, rng, embed_factor=embed_factor, with_views=release is not None)
        for c, needed in plan.needed.items():
            if not np.array_equal(needed, partition.clients[c].needed):
                raise ValueError("partition.needed is not the 1-hop expansion of the owned nodes")
        owned = {c: g.owned for c, g in graphs.items()}
        nodes = np.concatenate(list(owned.values())) if owned else np.zeros(0, np.int64)
        return cls(plan, PlainRows.uploads(x, nodes, release), owned, as_variant(variant).name)

    def run(
        self, encoder: BucketEncoder[PlainResult] | None = None, *, dtype: torch.dtype | None = None
    ) -> dict[int, Encodings]:
        """Every client's encodings, computed by ``encoder`` (default :class:`PlainEncoder` over
        :attr:`rows`), which is closed afterwards, and stored in ``dtype`` (default: the compute
        dtype; :func:`assemble_encodings`)."""
        enc: BucketEncoder[PlainResult] = (
            PlainEncoder(self.rows, out_dtype=dtype) if encoder is None else encoder
        )
        try:
            return assemble_encodings(
                self.plan,
                enc.map(self.plan.whole_buckets),
                self.variant,
                owned=self.owned,
                own_rows=self.rows,
                dtype=dtype,
            )
        finally:
            enc.close()
