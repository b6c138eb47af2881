r"""FedGAT encodings computed homomorphically: the server's side and the client's decryption.

Every feature-dependent encoding is a per-node linear map of the neighbours' features,
:math:`F_i = A_i H_i` (:meth:`fedgat.encodings.BucketBases.coefficients`), with plaintext
coefficients :math:`A_i` that the server draws itself. Under CKKS the server evaluates it with
:func:`fedgat.crypto.packing.linear_map_rows`: plaintext x ciphertext multiply-adds only, no
rotation, no relinearisation, no secret key.

Rows computed per node: *all* ``R_i + 1`` rows of :math:`A_i`:

* row 0, :math:`h_i` itself (the :math:`M_1` factor; coefficient row :math:`e_0`, the node is its
  own first neighbour), packed with the node's other rows;
* vector variant: :math:`V_i` (``m`` rows), matrix variant: :math:`K_2` (``m``) and :math:`M_2`
  (``m^2``) rows.

Computing row 0 costs at most ``ceil((R+1)/k) - ceil(R/k)`` extra result ciphertexts per chunk
(``k`` blocks per ciphertext) and the multiply-adds of that group. The alternative, forwarding a
non-owner the node's uploaded (fresh, twice as large) ciphertexts, moved 46 % more download bytes
on Cora (10 clients, vector: 4.68 GB vs 3.21 GB; 90 % of its nodes are needed by a client that
does not own them) for 8 % fewer multiply-adds. The owner ignores its decrypted row 0 and uses its
own plaintext.

Differential privacy (:mod:`fedgat.dp`): every client uploads two copies of each owned node, the
clean projection and its noisy release. The spool keeps the clean copy of node ``j`` under key
``j`` and the release under :func:`release_key` ``(j)`` (ids are u32, so both share the int64 key
space), and :func:`plan_views` turns the drawn bases into *compute buckets* whose ``neighbours``
are those spool keys: the encodings of node ``i`` for client ``c`` read the clean copy of each
source ``c`` owns and the release of every other source. Every encoder (:func:`compute_node`,
:class:`ParallelEncoder`, any other that maps buckets through the spool) runs them unchanged.

Memory: uploads are validated and spooled to disk (:class:`CiphertextSpool`), results are produced
node by node (:func:`compute_node`), so the server never holds a dataset's ciphertexts at once.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
import torch

from fedgat.encodings import BucketBases, EncodingBucket

from .context import KeyHolderContext, _CkksContext
from .errors import CiphertextFormatError
from .packing import SlotLayout, decrypt_rows, linear_map_rows, serialize
from .spool import CiphertextSpool, NodeResult, _worker_batch, _worker_init

#: spool-key offset of a node's DP release copy (node ids are u32, spool keys int64)
RELEASE_OFFSET = 1 << 32


def release_key(node: int | np.ndarray) -> int | np.ndarray:
    """Spool key of the DP release of ``node`` (its clean upload is stored under ``node`` itself)."""
    return node + RELEASE_OFFSET


@dataclass
class ViewPlan:
    """What the server computes and whom each result goes to (:func:`plan_views`).

    Attributes:
        buckets: one compute bucket per drawn bucket, in the same order; ``neighbours`` hold spool
            keys. Without DP these are the drawn buckets themselves (one result per node).
        recipients: per computed node, in bucket then slot order (the order every encoder yields
            results), the clients that receive that result (each client exactly once per node it needs).
    """

    buckets: list[BucketBases]
    recipients: list[tuple[int, ...]]

    @property
    def num_results(self) -> int:
        return len(self.recipients)


def plan_views(buckets: list[BucketBases], pair_nodes: np.ndarray, pair_clients: np.ndarray,
               owner_ids: np.ndarray | None = None, owners: np.ndarray | None = None) -> ViewPlan:
    """Plan the server's homomorphic work for the ``(node, client)`` pairs ``pair_nodes[k]`` needed by
    ``pair_clients[k]`` (every node of ``buckets`` at least once, no pair twice).

    Without ``owners`` every client of a node receives the same result, computed once from the
    clean uploads. With ``owners[t]`` the client owning node ``owner_ids[t]`` (``owner_ids`` sorted;
    every source must be listed), a client receives node ``i``'s encodings computed from its own
    clean copies and every other source's release: the clients of ``i`` that own none of its
    sources share one result (all releases); each client that owns some source gets its own. A node
    therefore costs ``1 + (clients owning one of its sources)`` computations at most, instead of one
    per client that needs it.

    Raises:
        ValueError: a pair names a node of no bucket, or a source has no owner.
    """
    pair_nodes = np.asarray(pair_nodes, dtype=np.int64)
    pair_clients = np.asarray(pair_clients, dtype=np.int64)
    if not buckets:
        return ViewPlan([], [])
    ids = np.concatenate([b.nodes for b in buckets])
    where = np.argsort(ids, kind="stable")
    at = where[np.minimum(np.searchsorted(ids[where], pair_nodes), len(ids) - 1)]
    if not np.array_equal(ids[at], pair_nodes):
        raise ValueError("a (node, client) pair names a node of no bucket")
    bucket_of = np.repeat(np.arange(len(buckets)), [len(b) for b in buckets])
    slot_of = np.concatenate([np.arange(len(b)) for b in buckets])
    pg, ps = bucket_of[at], slot_of[at]
    srt = np.lexsort((pair_clients, ps, pg))  # by bucket, slot, client
    pg, ps, pc = pg[srt], ps[srt], pair_clients[srt]
    bounds = np.searchsorted(pg, np.arange(len(buckets) + 1))
    out, recipients = [], []
    for g, b in enumerate(buckets):
        s, c = ps[bounds[g] : bounds[g + 1]], pc[bounds[g] : bounds[g + 1]]
        if owners is None:
            own = np.zeros(len(s), dtype=bool)
            mask = np.zeros((0, b.n), dtype=bool)
        else:
            assert owner_ids is not None
            pos = np.minimum(np.searchsorted(owner_ids, b.neighbours), len(owner_ids) - 1)
            if not np.array_equal(owner_ids[pos], b.neighbours):
                raise ValueError("a source node has no owner")
            mask = owners[pos][s] == c[:, None]  # (pairs, n): sources owned by the pair's client
            own = mask.any(axis=1)
        shared = np.flatnonzero(~own)
        shared_slots, starts = np.unique(s[shared], return_index=True)
        own_pairs = np.flatnonzero(own)
        # variants: per slot the shared one first (pair -1), then one per owning client
        var_slot = np.concatenate([shared_slots, s[own_pairs]])
        var_pair = np.concatenate([np.full(len(shared_slots), -1), own_pairs])
        order = np.lexsort((var_pair, var_slot))
        var_slot, var_pair = var_slot[order], var_pair[order]
        groups = [tuple(x.tolist()) for x in np.split(c[shared], starts[1:])] if len(shared) else []
        groups += [(int(c[k]),) for k in own_pairs]
        recipients += [groups[k] for k in order]
        if owners is None and np.array_equal(var_slot, np.arange(len(b))):
            out.append(b)  # no viewer split: the drawn bucket itself
            continue
        keys = b.neighbours[var_slot]
        if owners is not None:
            clean = np.zeros(keys.shape, dtype=bool)
            mine = var_pair >= 0
            clean[mine] = mask[var_pair[mine]]
            keys = np.where(clean, keys, release_key(keys))
        out.append(BucketBases(b.variant, b.rows[var_slot], b.nodes[var_slot], keys, b.p[var_slot],
                               None if b.q is None else b.q[var_slot]))
    return ViewPlan(out, recipients)


def computed_rows(bases: BucketBases) -> np.ndarray:
    """``(B, R + 1, n)``: the coefficient rows the server evaluates (all, row 0 = :math:`h_i` too)."""
    return bases.coefficients()


def multiply_adds(bases: BucketBases, layout: SlotLayout) -> int:
    """Plaintext-ciphertext multiply-adds :func:`compute_node` spends on this bucket."""
    rows = computed_rows(bases)
    k = layout.blocks
    total = 0
    for g in range(layout.groups(rows.shape[1])):
        used = np.any(rows[:, g * k : (g + 1) * k] != 0, axis=1)  # (B, n)
        total += int(used.sum())
    return total * layout.chunks


def compute_node(ctx: _CkksContext, layout: SlotLayout, spool: CiphertextSpool, bases: BucketBases,
                 slot: int) -> NodeResult:
    """Encrypted :math:`A_i H_i` (all rows) for node ``bases.nodes[slot]`` from spooled uploads."""
    node = int(bases.nodes[slot])
    sources = [spool.get(j) for j in bases.neighbours[slot]]
    results = linear_map_rows(ctx, layout, sources, bases.coefficients(slot))
    return NodeResult(node, [serialize(ctx, r) for r in results])


def compute_bucket(ctx: _CkksContext, layout: SlotLayout, spool: CiphertextSpool,
                   bases: BucketBases) -> Iterator[NodeResult]:
    """:func:`compute_node` for every node of a bucket, one at a time (a generator)."""
    for slot in range(len(bases)):
        yield compute_node(ctx, layout, spool, bases, slot)


def decrypt_bucket(ctx: KeyHolderContext, layout: SlotLayout, bases: BucketBases,
                   results: Iterable[NodeResult], own_features: dict[int, np.ndarray] | None = None,
                   dtype: torch.dtype = torch.float32) -> EncodingBucket:
    """Client side: decrypt a bucket's results into an :class:`~fedgat.encodings.EncodingBucket`.

    ``own_features`` maps the client's own node ids to their plaintext rows: for those nodes the
    exact plaintext replaces the decrypted :math:`h_i` (row 0).
    """
    by_node = {r.node: r for r in results}
    rows = np.empty((len(bases), bases.num_feature_rows(), layout.d))
    for slot, node in enumerate(bases.nodes):
        node = int(node)
        if node not in by_node:
            raise CiphertextFormatError(f"missing encodings for node {node}")
        rows[slot] = decrypt_rows(ctx, by_node[node].row_blobs, rows.shape[1], layout, kind="result")
        if own_features is not None and node in own_features:
            rows[slot, 0] = own_features[node]
    return EncodingBucket.from_rows(bases, torch.from_numpy(rows).to(dtype))


# ---------------------------------------------------------------------------- process pool


def _pieces(bases_list: Iterable[BucketBases], chunks: int, blocks: int, max_cost: int) -> Iterator[tuple]:
    """Tasks ``(node, neighbours, coefficient rows, last piece?)``: one per node, or, for a node whose
    multiply-adds exceed ``max_cost``, one per run of whole result groups (``blocks`` rows each), so
    the few high-degree nodes (Cora: up to 170 rows x 169 neighbours) spread over every worker
    instead of serialising the end of the round on one."""
    for b in bases_list:
        for s in range(len(b)):
            q = b.coefficients(s)
            node, neighbours = int(b.nodes[s]), b.neighbours[s]
            per_group = len(neighbours) * chunks
            step = blocks * max(1, max_cost // max(1, per_group))
            for start in range(0, q.shape[0], step):
                yield node, neighbours, q[start : start + step], start + step >= q.shape[0]


def _batched(tasks: Iterable[tuple], size: int, max_cost: int, chunks: int) -> Iterator[list]:
    """Consecutive tasks, at most ``size`` of them and about ``max_cost`` multiply-adds per batch."""
    batch: list = []
    cost = 0
    for task in tasks:
        batch.append(task)
        cost += task[2].shape[0] * len(task[1]) * chunks
        if len(batch) >= size or cost >= max_cost:
            yield batch
            batch, cost = [], 0
    if batch:
        yield batch


def run_windowed(encoder, batches: Iterable[list[tuple]], submit: Callable[[list[tuple]], Any],
                 wait: Callable[[Any], list[NodeResult]],
                 node_done: Callable[[tuple], None] | None = None) -> Iterator[NodeResult]:
    """Submit :func:`_batched` batches of :func:`_pieces` tasks with at most ``encoder.window`` in
    flight (tracking ``encoder.max_in_flight``), and reassemble each node's rows from its pieces, in
    order. ``submit(batch)`` returns a handle, ``wait(handle)`` the batch's per-piece results;
    ``node_done(task)`` is called with a node's last piece once its rows are complete. Shared by the
    process-pool and Ray encoders, which differ only in how a batch runs."""
    pending: deque = deque()
    partial: list[bytes] = []

    def finished(batch: list[tuple], results: list[NodeResult]) -> Iterator[NodeResult]:
        for task, result in zip(batch, results):
            partial.extend(result.row_blobs)
            if task[3]:  # the node's last piece: its rows are complete, in group order
                if node_done is not None:
                    node_done(task)
                yield NodeResult(result.node, partial.copy())
                partial.clear()

    for batch in batches:
        pending.append((batch, submit(batch)))
        encoder.max_in_flight = max(encoder.max_in_flight, len(pending))
        if len(pending) >= encoder.window:
            done, handle = pending.popleft()
            yield from finished(done, wait(handle))
    while pending:
        done, handle = pending.popleft()
        yield from finished(done, wait(handle))


class ParallelEncoder:
    """The server's homomorphic encodings on every core.

    Worker processes load the *public* context from bytes and read the spooled uploads from disk;
    tasks and results cross the process boundary as plain arrays and ciphertext bytes (TenSEAL
    objects cannot be pickled). Results stream back in task order, ``chunksize`` nodes at a time,
    with at most ``window`` batches (default ``4 * workers``) submitted ahead of the consumer, so
    neither pending tasks nor finished results pile up in memory (``ProcessPoolExecutor.map`` would
    submit every task at once and keep every result until it is read).

    Args:
        public_context: the server's public context bytes (what ``ServerContext.from_bytes`` loads).
        layout: the slot layout of the uploads.
        spool: the spool holding every upload (written by this process).
        workers: processes; ``None`` = ``os.cpu_count()``; 0 computes in this process.
        chunksize: nodes (or pieces of nodes) per task sent to a worker.
        window: batches in flight at most (default ``4 * workers``).
        max_task_cost: multiply-adds per task, about (~0.3 s at n4096); a node above it is split
            into runs of whole result groups, a batch of small nodes stops there.
    """

    def __init__(self, public_context: bytes, layout: SlotLayout, spool: CiphertextSpool,
                 workers: int | None = None, chunksize: int = 8, window: int | None = None,
                 max_task_cost: int = 512) -> None:
        self.workers = (os.cpu_count() or 1) if workers is None else workers
        self.chunksize = max(1, chunksize)
        self.max_task_cost = max(1, max_task_cost)
        self._layout = layout
        self.window = max(1, 4 * self.workers if window is None else window)
        #: most batches that were ever in flight at once (tests: never above ``window``)
        self.max_in_flight = 0
        self._spool = spool
        self._pool = None
        if self.workers > 0:
            path, index = spool.snapshot()
            self._pool = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_init, initargs=(public_context, layout, path, index))

    def map(self, bases_list: Iterable[BucketBases]) -> Iterator[NodeResult]:
        """Encrypted encodings of every node of every bucket, in bucket order."""
        if self._pool is None:
            tasks = ((int(b.nodes[s]), b.neighbours[s], b.coefficients(s))
                     for b in bases_list for s in range(len(b)))
            for node, neighbours, coefficients in tasks:
                sources = [self._spool.get(j) for j in neighbours]
                results = linear_map_rows(self._spool.ctx, self._spool.layout, sources, coefficients)
                yield NodeResult(node, [serialize(self._spool.ctx, r) for r in results])
            return
        layout = self._layout
        pieces = _pieces(bases_list, layout.chunks, layout.blocks, self.max_task_cost)
        batches = _batched(pieces, self.chunksize, self.max_task_cost, layout.chunks)
        yield from run_windowed(self, batches, lambda batch: self._pool.submit(_worker_batch, batch),
                                lambda future: future.result())

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
