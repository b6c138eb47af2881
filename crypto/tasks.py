r"""The server's unit of homomorphic work, written once, and how it is cut into batches.

:func:`encode_node` is the per-node compute :math:`F_i = A_i H_i` on ciphertexts (all rows of the
node, :math:`h_i` included): every encoder of :mod:`fedgat.crypto.encoders` -- in this process, in a
process pool, as Ray tasks -- runs it and nothing else. What differs between them is where the
uploads come from (the spool file, or bytes shipped with the task) and where the call runs.

A *task* is a plain tuple ``(node, neighbours, coefficient rows, last piece?)``; :func:`pieces`
splits a high-degree node into runs of whole result groups so that it spreads over every worker,
:func:`batched` groups consecutive tasks, and :func:`run_windowed` keeps a bounded window of
batches in flight and reassembles each node's rows in order.

Kept free of torch (and of :mod:`fedgat.encodings`): the process-pool workers import this module
and :mod:`fedgat.crypto.spool` and no more (about 0.2 s instead of 1.7 s of start-up per worker).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import tenseal as ts

from .context import CkksContext, ServerContext
from .evaluator import evaluator_for
from .packing import SlotLayout
from .params import DEFAULT_WIRE
from .spool import CiphertextSpool

__all__ = ["ComputeBucket", "NodeResult", "Task", "batched", "encode_node", "pieces", "run_windowed"]

#: ``(node, neighbours (n,), coefficient rows (r, n), last piece of the node?)``
Task = tuple[int, np.ndarray, np.ndarray, bool]


@dataclass
class NodeResult:
    """Encrypted encodings of one node: result envelopes of all its rows, :math:`h_i` included
    (``groups(R + 1) * chunks``, :meth:`SlotLayout.pack_blocks` order)."""

    node: int
    row_blobs: list[bytes]

    def nbytes(self) -> int:
        return sum(map(len, self.row_blobs))


def encode_node(
    ctx: CkksContext,
    layout: SlotLayout,
    sources: Sequence[Sequence[ts.CKKSVector]],
    node: int,
    coefficients: np.ndarray,
) -> NodeResult:
    """Encrypted ``coefficients @ H`` of ``node`` (``sources[j]``: neighbour ``j``'s chunk uploads),
    serialised: the one homomorphic computation of the pre-training round."""
    return NodeResult(int(node), evaluator_for(ctx).linear_map(layout, sources, coefficients))


class ComputeBucket(Protocol):
    """What an encoder reads of a bucket of work (:class:`fedgat.encodings.BucketBases`, or a
    recipient's :class:`fedgat.crypto.encodings.ShareBucket`): node ids, each node's sources (spool
    keys) and its coefficient rows over them. Torch-free, for the workers."""

    @property
    def nodes(self) -> np.ndarray: ...

    @property
    def neighbours(self) -> np.ndarray | list[np.ndarray]: ...

    def __len__(self) -> int: ...

    def coefficients(self, slot: int) -> np.ndarray: ...


def pieces(buckets: Iterable[ComputeBucket], chunks: int, blocks: int, max_cost: int) -> Iterator[Task]:
    """Tasks: one per node, or, for a node whose multiply-adds exceed ``max_cost``, one per run of
    whole result groups (``blocks`` rows each), so the few high-degree nodes (Cora: up to 170 rows x
    169 neighbours) spread over every worker instead of serialising the end of the round on one."""
    for b in buckets:
        for s in range(len(b)):
            q = b.coefficients(s)
            node, neighbours = int(b.nodes[s]), b.neighbours[s]
            per_group = len(neighbours) * chunks
            step = blocks * max(1, max_cost // max(1, per_group))
            for start in range(0, q.shape[0], step):
                yield node, neighbours, q[start : start + step], start + step >= q.shape[0]


def batched(tasks: Iterable[Task], size: int, max_cost: int, chunks: int) -> Iterator[list[Task]]:
    """Consecutive tasks, at most ``size`` of them and about ``max_cost`` multiply-adds per batch."""
    batch: list[Task] = []
    cost = 0
    for task in tasks:
        batch.append(task)
        cost += task[2].shape[0] * len(task[1]) * chunks
        if len(batch) >= size or cost >= max_cost:
            yield batch
            batch, cost = [], 0
    if batch:
        yield batch


class Windowed(Protocol):
    """What :func:`run_windowed` reads and updates on its encoder."""

    window: int
    max_in_flight: int


def run_windowed(
    encoder: Windowed,
    batches: Iterable[list[Task]],
    submit: Callable[[list[Task]], Any],
    wait: Callable[[Any], list[NodeResult]],
    node_done: Callable[[Task], None] | None = None,
) -> Iterator[NodeResult]:
    """Submit batches with at most ``encoder.window`` in flight (tracking ``encoder.max_in_flight``)
    and reassemble each node's rows from its pieces, in order. ``submit(batch)`` returns a handle,
    ``wait(handle)`` the batch's per-piece results; ``node_done(task)`` is called with a node's last
    piece once its rows are complete."""
    pending: deque = deque()
    partial: list[bytes] = []

    def finished(batch: list[Task], results: list[NodeResult]) -> Iterator[NodeResult]:
        for task, result in zip(batch, results, strict=True):
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


# ---------------------------------------------------------------------------- worker processes
_WORKER: dict[str, Any] = {}


def worker_init_round(
    recipients: dict[int, tuple[bytes, str, dict]], layout: SlotLayout, wire: str = DEFAULT_WIRE
) -> None:
    """Process-pool initializer (:class:`~fedgat.crypto.encoders.RoundPool`): per recipient key, its
    public context (loaded in the session's ciphertext ``wire``, what the spooled uploads and the
    results are in) and its spool, opened read-only, ``key -> (public context bytes, spool path,
    spool index)``; tasks name the key (:func:`worker_batch_for`)."""
    opened = {}
    for key, (public_context, path, index) in recipients.items():
        ctx = ServerContext.from_bytes(public_context, wire=wire)
        opened[key] = (ctx, CiphertextSpool.reader(ctx, layout, path, index))
    _WORKER.update(layout=layout, recipients=opened, active=None)


def worker_batch_for(key: int, tasks: list[Task]) -> list[NodeResult]:
    """Process-pool task of a round pool: :func:`encode_node` for each task under recipient
    ``key``'s context, uploads read from its spool. Moving on from one recipient to another drops
    the previous one's cache of loaded uploads (the server computes recipient after recipient), so a
    worker holds one cache, not one per recipient."""
    recipients = _WORKER["recipients"]
    active = _WORKER["active"]
    if active != key:
        if active is not None:
            recipients[active][1].drop_cache()
        _WORKER["active"] = key
    ctx, spool = recipients[key]
    layout = _WORKER["layout"]
    return [
        encode_node(ctx, layout, [spool.get(j) for j in neighbours], node, q)
        for node, neighbours, q, _last in tasks
    ]


def worker_pid(barrier: Any = None) -> int:
    """Pool task: this worker's process id, returned once ``barrier`` (a multiprocessing manager's
    ``Barrier`` for as many parties as the pool has workers, or None) lets every worker through --
    one task per worker, all running at once, so that each has started. Benchmarks pay a pool's
    start-up this way before they time it."""
    if barrier is not None:
        barrier.wait(timeout=120)
    return os.getpid()
