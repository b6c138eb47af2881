r"""The server's unit of homomorphic work, written once, and how it is cut into batches.

:func:`encode_node` is the per-node compute :math:`F_i = A_i H_i` on ciphertexts (all rows of the
node, :math:`h_i` included): every encoder of :mod:`fedgat.crypto.encoders` -- in this process, in a
process pool, as Ray tasks -- runs it and nothing else. What differs between them is where the
uploads come from (the spool file, or bytes shipped with the task) and where the call runs.

A *task* is a plain tuple ``(node, neighbours, coefficient rows, last piece?)``; :func:`pieces`
splits a high-degree node into runs of whole result groups so that it spreads over every worker,
:func:`batched` groups consecutive tasks, :func:`interleaved` merges several recipients' batches
in proportion to their work, and :func:`run_windowed` keeps a bounded window of batches in flight
and reassembles each node's rows in order.

Kept free of torch (and of :mod:`fedgat.encodings`): the process-pool workers import this module
and :mod:`fedgat.crypto.spool` and no more (about 0.2 s instead of 1.7 s of start-up per worker).
"""

from __future__ import annotations

import heapq
import os
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import tenseal as ts

from .context import CkksContext, ServerContext
from .evaluator import evaluator_for
from .packing import SlotLayout
from .params import DEFAULT_WIRE
from .spool import CiphertextSpool

__all__ = [
    "ComputeBucket",
    "NodeResult",
    "Task",
    "batched",
    "encode_node",
    "interleaved",
    "pieces",
    "run_windowed",
    "task_cost",
]

K = TypeVar("K", bound=Hashable)

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
        cost += task_cost(task, chunks)
        if len(batch) >= size or cost >= max_cost:
            yield batch
            batch, cost = [], 0
    if batch:
        yield batch


class Windowed(Protocol):
    """What :func:`run_windowed` reads and updates on its encoder."""

    window: int
    max_in_flight: int


def task_cost(task: Task, chunks: int) -> int:
    """Multiply-adds of one task (coefficient rows x sources x chunks), as :func:`batched` weighs it."""
    return task[2].shape[0] * len(task[1]) * chunks


def interleaved(
    streams: Sequence[tuple[K, Iterable[list[Task]]]], chunks: int, weights: Mapping[K, float] | None = None
) -> Iterator[tuple[K, list[Task]]]:
    """``(key, batch)`` of several keys' batch streams, merged so that every key advances at the
    pace of its weight: the next batch comes from the key that has drawn the least multiply-adds per
    unit of weight so far (ties in the order of ``streams``; no weights: equal shares). With each
    key's weight its whole work, every key's batches run out at about the same time.

    The server merges its recipients' streams so that every client receives -- and decrypts -- its
    results while the others do, instead of one client after another.

    Raises:
        ValueError: a key appears twice, or has no positive weight.
    """
    keys = [key for key, _ in streams]
    if len(set(keys)) != len(keys):
        raise ValueError(f"each key once: got {keys}")
    weight = {key: 1.0 if weights is None else float(weights.get(key, 0.0)) for key in keys}
    if any(not w > 0 for w in weight.values()):
        raise ValueError(f"every key needs a positive weight: got {weight}")
    iters = [iter(batches) for _, batches in streams]
    heap = [(0.0, i) for i in range(len(keys))]
    while heap:
        drawn, i = heapq.heappop(heap)
        batch = next(iters[i], None)
        if batch is None:
            continue
        yield keys[i], batch
        heapq.heappush(heap, (drawn + sum(task_cost(t, chunks) for t in batch) / weight[keys[i]], i))


def run_windowed(
    encoder: Windowed,
    batches: Iterable[tuple[K, list[Task]]],
    submit: Callable[[K, list[Task]], Any],
    wait: Callable[[Any], list[NodeResult]],
    node_done: Callable[[K, Task], None] | None = None,
) -> Iterator[tuple[K, NodeResult]]:
    """Submit ``(key, batch)`` pairs with at most ``encoder.window`` in flight (tracking
    ``encoder.max_in_flight``) and reassemble each node's rows from its pieces, in each key's order
    (a key's pieces of one node are consecutive in its batches; other keys' batches may come between
    them). ``submit(key, batch)`` returns a handle, ``wait(handle)`` the batch's per-piece results;
    ``node_done(key, task)`` is called with a node's last piece once its rows are complete. Yields
    ``(key, result)`` in submission order."""
    pending: deque = deque()
    partial: dict[K, list[bytes]] = {}

    def finished(key: K, batch: list[Task], results: list[NodeResult]) -> Iterator[tuple[K, NodeResult]]:
        rows = partial.setdefault(key, [])
        for task, result in zip(batch, results, strict=True):
            rows.extend(result.row_blobs)
            if task[3]:  # the node's last piece: its rows are complete, in group order
                if node_done is not None:
                    node_done(key, task)
                yield key, NodeResult(result.node, rows.copy())
                rows.clear()

    for key, batch in batches:
        pending.append((key, batch, submit(key, batch)))
        encoder.max_in_flight = max(encoder.max_in_flight, len(pending))
        if len(pending) >= encoder.window:
            key_, done, handle = pending.popleft()
            yield from finished(key_, done, wait(handle))
    while pending:
        key_, done, handle = pending.popleft()
        yield from finished(key_, done, wait(handle))


# ---------------------------------------------------------------------------- worker processes
_WORKER: dict[str, Any] = {}
#: loaded uploads a round pool's worker keeps for reuse, all its recipients together (each node is
#: ``chunks`` ciphertexts: 512 nodes at n4096 are ~200 MB per worker)
WORKER_CACHE_NODES = 512


def worker_init_round(
    recipients: dict[int, tuple[bytes, str, dict]], layout: SlotLayout, wire: str = DEFAULT_WIRE
) -> None:
    """Process-pool initializer (:class:`~fedgat.crypto.encoders.RoundPool`): per recipient key, its
    public context (loaded in the session's ciphertext ``wire``, what the spooled uploads and the
    results are in) and its spool, opened read-only, ``key -> (public context bytes, spool path,
    spool index)``; tasks name the key (:func:`worker_batch_for`). The recipients' spools share
    one cache budget (:data:`WORKER_CACHE_NODES` loaded uploads), split evenly between them: the
    server interleaves its recipients' tasks, so a worker moves between them all the time."""
    opened = {}
    cache = max(1, WORKER_CACHE_NODES // max(1, len(recipients)))
    for key, (public_context, path, index) in recipients.items():
        ctx = ServerContext.from_bytes(public_context, wire=wire)
        opened[key] = (ctx, CiphertextSpool.reader(ctx, layout, path, index, cache_size=cache))
    _WORKER.update(layout=layout, recipients=opened, wire=wire)


def worker_init_from_setups(setups: dict[int, str], layout: SlotLayout, wire: str = DEFAULT_WIRE) -> None:
    """Process-pool initializer of a :class:`~fedgat.crypto.encoders.RoundPool`:
    :func:`worker_init_round` with each recipient's public context and spool index read from its
    setup file (:func:`write_recipient_setup`), ``key -> path``.

    Why files: "spawn" pickles the initializer's arguments into each new worker's start-up pipe,
    and the parent writes that pipe whole while the child reads it only after importing the parent's
    ``__main__``; arguments larger than the pipe's buffer (64 KiB on Linux; one n4096 public context
    is ~140 KB) hold the parent until then, so the workers start one after another (measured on the
    H200 host: 16 workers 6.5 s). A few paths fit, and the workers start side by side
    (``benchmarks/pool_start.py``).

    A worker the executor starts later (it starts them as tasks arrive) skips a starting recipient whose
    spool is gone: it has left the pool (:meth:`~fedgat.crypto.encoders.RoundPool.remove`) and no task
    names it any more."""
    recipients = {key: _read_recipient_setup(path) for key, path in setups.items()}
    live = {key: setup for key, setup in recipients.items() if os.path.exists(setup[1])}
    worker_init_round(live, layout, wire)


def write_recipient_setup(
    path: str | os.PathLike[str], public_context: bytes, spool: CiphertextSpool
) -> None:
    """A recipient joining a running round pool (:meth:`~fedgat.crypto.encoders.RoundPool.add`): its
    public context and its spool's ``(path, index)`` as one ``.npz`` of plain arrays (no pickle),
    which a worker reads the first time a task names the recipient (:func:`worker_batch_for`)."""
    spool_path, index = spool.snapshot()
    keys = np.array(list(index), dtype=np.int64).reshape(-1, 2)
    spans = np.array(list(index.values()), dtype=np.int64).reshape(-1, 2)
    with open(path, "wb") as f:
        np.savez(
            f,
            context=np.frombuffer(public_context, dtype=np.uint8),
            spool=np.frombuffer(os.fsencode(spool_path), dtype=np.uint8),
            keys=keys,
            spans=spans,
        )


def _read_recipient_setup(path: str) -> tuple[bytes, str, dict[tuple[int, int], tuple[int, int]]]:
    with np.load(path, allow_pickle=False) as z:
        spans = zip(z["keys"].tolist(), z["spans"].tolist(), strict=True)
        index = {(node, chunk): (offset, size) for (node, chunk), (offset, size) in spans}
        return z["context"].tobytes(), os.fsdecode(z["spool"].tobytes()), index


def _open_recipient(key: int, setup: str, live: Sequence[int]) -> None:
    """Load a recipient that joined the pool after this worker started; every live recipient's
    reader shares the cache budget evenly."""
    recipients: dict = _WORKER["recipients"]
    public_context, path, index = _read_recipient_setup(setup)
    ctx = ServerContext.from_bytes(public_context, wire=_WORKER["wire"])
    cache = max(1, WORKER_CACHE_NODES // max(1, len(live)))
    recipients[key] = (ctx, CiphertextSpool.reader(ctx, _WORKER["layout"], path, index, cache_size=cache))
    for _, spool in recipients.values():
        spool.cache_size = cache


def worker_batch_for(
    key: int, tasks: list[Task], setup: str | None = None, live: Sequence[int] = ()
) -> list[NodeResult]:
    """Process-pool task of a round pool: :func:`encode_node` for each task under recipient
    ``key``'s context, uploads read from its spool (through its share of the worker's cache).
    ``setup``: for a recipient that joined after the pool started, its setup file
    (:func:`write_recipient_setup`), read on this worker's first task for it; ``live``: the pool's
    recipients now, when some joined later -- the readers of any other are closed first, and the
    spool's file is let go of after the batch (:meth:`~fedgat.crypto.spool.CiphertextSpool.detach`;
    its cache stays): a recipient's spool is deleted when it leaves, and a worker that runs no task
    after that must not keep its disk space allocated."""
    recipients = _WORKER["recipients"]
    if live and any(k not in live for k in recipients):
        for gone in [k for k in recipients if k not in live]:
            recipients.pop(gone)[1].close()
    if key not in recipients:
        if setup is None:
            raise KeyError(f"recipient {key} is not one of this worker's")
        _open_recipient(key, setup, live)
    ctx, spool = _WORKER["recipients"][key]
    layout = _WORKER["layout"]
    out = [
        encode_node(ctx, layout, [spool.get(j) for j in neighbours], node, q)
        for node, neighbours, q, _last in tasks
    ]
    if live:  # recipients leave this pool: hold no spool file between tasks (it may be deleted next)
        spool.detach()
    return out


def worker_pid(barrier: Any = None) -> int:
    """Pool task: this worker's process id, returned once ``barrier`` (a multiprocessing manager's
    ``Barrier`` for as many parties as the pool has workers, or None) lets every worker through --
    one task per worker, all running at once, so that each has started. Benchmarks pay a pool's
    start-up this way before they time it."""
    if barrier is not None:
        barrier.wait(timeout=120)
    return os.getpid()
