r"""Where the server's homomorphic work runs: the seam between the protocol and the compute.

The pre-training server (:class:`fedgat.protocols.pretrain_server.ServerPretrain`) decides *what* to
compute -- compute buckets of bases whose ``neighbours`` are spool keys -- and hands them to an
:class:`Encoder`, which yields one :class:`~fedgat.crypto.tasks.NodeResult` per node, in bucket
order. Every encoder runs the same per-node compute (:func:`fedgat.crypto.tasks.encode_node`);
they differ only in where:

* :class:`InlineEncoder` -- in the calling process;
* :class:`ProcessPoolEncoder` -- a spawned process pool on this machine, reading the spool file;
* :class:`fedgat.crypto.ray_encoder.RayEncoder` -- Ray tasks, uploads shipped through the object
  store (``pip install "fedgat[ray]"``).

An engine picks one by passing an :data:`EncoderFactory` to the server: it is called once per
recipient, when that recipient's compute begins, with the recipient's public context, the slot
layout, its spool and its multiply-adds (the work it asks for). :func:`local_encoder` is the default
factory. A factory may also have ``prepare(recipients, layout)``, which the server calls once when the
compute phase begins (every upload in), and ``close()``, which it calls when the round ends:
:class:`LocalEncoderFactory` starts one :class:`RoundPool` there for every recipient, instead of a
pool per recipient (each a spawn of every core's worker, seconds apiece). A factory with
``map_round(jobs, layout, weights)`` computes the whole round as one stream of ``(recipient,
result)``, which the server then uses instead of an encoder per recipient: :class:`LocalEncoderFactory`
submits every recipient's batches through one window (:meth:`RoundPool.map`), interleaved in
proportion to their work, so that every client receives and decrypts its results while the others
do (not one client after another) and the pool does not drain at the end of each recipient.
A round with an upload window computes its recipients one by one, as their uploads complete: a
factory with ``add_recipient(key, context, spool, layout, round_multiply_adds)`` and
``remove_recipient(key)`` hears of each before its encoder is asked for and after its results are
out, and :class:`LocalEncoderFactory` lets each join one :class:`RoundPool` started by the first
(:meth:`RoundPool.add`), so such a round too spawns its workers once.

The seam itself is :class:`BucketEncoder`, generic over the result: :class:`Encoder` is its
encrypted instance, and :class:`fedgat.plain_encoder.PlainEncoder` (the same per-node compute in the
clear, over feature rows keyed like the spool) its plaintext one, which the plaintext baseline runs.
"""

from __future__ import annotations

import multiprocessing
import numbers
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar

from .context import CkksContext, ServerContext
from .packing import SlotLayout
from .spool import CiphertextSpool
from .tasks import (
    ComputeBucket,
    NodeResult,
    Windowed,
    batched,
    encode_node,
    interleaved,
    pieces,
    run_windowed,
    worker_batch_for,
    worker_init_from_setups,
    write_recipient_setup,
)

if TYPE_CHECKING:
    from fedgat.encodings import BucketBases

__all__ = [
    "AUTO_POOL_MIN_MULTIPLY_ADDS",
    "BucketEncoder",
    "Encoder",
    "EncoderFactory",
    "InlineEncoder",
    "LocalEncoderFactory",
    "ProcessPoolEncoder",
    "RoundPool",
    "auto_workers",
    "local_encoder",
    "map_inline",
]

#: smallest round (multiply-adds, every recipient's together) for which :func:`local_encoder` with
#: ``workers=None`` starts a pool: ~2 s of one core's work at n4096, about what starting the pool's
#: processes costs. Counted in work, not results: a packed result carries 1 to 100+ multiply-adds.
AUTO_POOL_MIN_MULTIPLY_ADDS = 4096


ResultT_co = TypeVar("ResultT_co", covariant=True)


class BucketEncoder(Protocol[ResultT_co]):
    """Computes :math:`A_i H_i` for every node of ``buckets``: one result per node, in bucket then
    slot order (the order :attr:`fedgat.protocols.pretrain_plan.RoundPlan.recipients` follows)."""

    #: processes or tasks working at once (0: the calling process)
    workers: int

    def map(self, buckets: Iterable[BucketBases]) -> Iterator[ResultT_co]: ...

    def close(self) -> None: ...


class Encoder(BucketEncoder[NodeResult], Protocol):
    """Computes encrypted encodings: one :class:`NodeResult` per node of ``buckets``, in order
    (whole encodings, or a recipient's foreign shares: any :class:`~fedgat.crypto.tasks.ComputeBucket`)."""

    def map(self, buckets: Iterable[ComputeBucket]) -> Iterator[NodeResult]: ...


#: ``factory(context, layout, spool, multiply_adds) -> Encoder``, called when the compute phase begins
EncoderFactory = Callable[[ServerContext, SlotLayout, CiphertextSpool, int], Encoder]


class InlineEncoder:
    """:func:`~fedgat.crypto.tasks.encode_node` in this process, node by node (a generator)."""

    workers = 0

    def __init__(self, ctx: CkksContext, layout: SlotLayout, spool: CiphertextSpool) -> None:
        self._ctx, self._layout, self._spool = ctx, layout, spool

    def map(self, buckets: Iterable[ComputeBucket]) -> Iterator[NodeResult]:
        for b in buckets:
            for s in range(len(b)):
                sources = [self._spool.get(j) for j in b.neighbours[s]]
                yield encode_node(self._ctx, self._layout, sources, int(b.nodes[s]), b.coefficients(s))

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RoundPool:
    """One spawned process pool for every recipient of a round: each worker loads every recipient's
    *public* context and opens its spool read-only once, at start-up; tasks name their recipient.

    Recipients whose spools complete later (an upload window computes them one by one) join with
    :meth:`add` and leave with :meth:`remove`: the pool is started once per round, not once per
    recipient (a spawn of every core's worker, seconds apiece). A joining recipient's context and
    spool index go to a setup file of plain arrays in the pool's private directory, which each worker
    reads on its first task for that recipient. Each task then names the recipients still in the
    pool: a worker drops its readers of the others before it runs the task, and lets go of the spool
    file after it (a recipient's spool is deleted when it leaves: no worker keeps its disk space).

    Args:
        recipients: ``key -> (public context bytes, spool)``, every spool complete (its
            :meth:`~fedgat.crypto.spool.CiphertextSpool.snapshot` is what the workers read); may be
            empty when every recipient joins with :meth:`add`.
        layout: the slot layout of the uploads.
        wire: the session's ciphertext wire.
        workers: processes (at least 1).
    """

    def __init__(
        self,
        recipients: dict[int, tuple[bytes, CiphertextSpool]],
        layout: SlotLayout,
        wire: str,
        workers: int,
    ) -> None:
        if workers < 1:
            raise ValueError(f"a round pool needs at least one worker, got {workers}")
        self.workers, self.wire = workers, wire
        #: the recipients tasks may name now
        self.keys: set[int] = set(recipients)
        self._setups: dict[int, str] = {}  # key -> setup file of a recipient that joined later
        self._joined = False  # whether any did (tasks then carry the live keys)
        self._left: set[int] = set()  # recipients removed (never added again)
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        # the starting recipients reach the workers as setup files, not as pickled initializer
        # arguments, which would make them start one after another (worker_init_from_setups); the
        # files stay until close: the executor may start a worker at any submission
        start: dict[int, str] = {}
        self.executor: ProcessPoolExecutor | None = None
        try:
            for key, (ctx, spool) in recipients.items():
                start[key] = path = os.path.join(self._private_dir(), f"start-{key}.npz")
                write_recipient_setup(path, ctx, spool)
            self.executor = ProcessPoolExecutor(
                workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=worker_init_from_setups,
                initargs=(start, layout, wire),
            )
        except BaseException:
            self.close()  # the private directory with it
            raise

    def _private_dir(self) -> str:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="fedgat-pool-")
        return self._dir.name

    def map(
        self,
        jobs: Iterable[tuple[int, Iterable[ComputeBucket]]],
        layout: SlotLayout,
        window: Windowed,
        chunksize: int = 32,
        max_task_cost: int = 512,
        weights: Mapping[int, float] | None = None,
    ) -> Iterator[tuple[int, NodeResult]]:
        """``(recipient key, result)`` of every node of every ``(recipient key, buckets)`` job, each
        recipient's in its bucket order, through one window of at most ``window.window`` batches in
        flight. The recipients' batches are :func:`~fedgat.crypto.tasks.interleaved` in proportion
        to ``weights`` (their work; default equal shares), so every recipient's results stream out
        together and no worker idles at a recipient's end. Tasks are cut and batched as
        :class:`ProcessPoolEncoder` documents; a batch holds one recipient's tasks.

        Raises:
            ValueError: a job's key is not one of the pool's, or appears twice.
        """
        executor = self.executor
        if executor is None:
            raise RuntimeError("the round pool is closed")
        jobs = list(jobs)
        for key, _ in jobs:
            if key not in self.keys:
                raise ValueError(f"recipient {key} is not one of the round pool's")
        streams = [
            (
                key,
                batched(
                    pieces(buckets, layout.chunks, layout.blocks, max_task_cost),
                    chunksize,
                    max_task_cost,
                    layout.chunks,
                ),
            )
            for key, buckets in jobs
        ]
        live = tuple(sorted(self.keys))

        def submit(key: int, batch: list) -> Any:
            if not self._joined:
                return executor.submit(worker_batch_for, key, batch)
            return executor.submit(worker_batch_for, key, batch, self._setups.get(key), live)

        yield from run_windowed(
            window, interleaved(streams, layout.chunks, weights), submit, lambda future: future.result()
        )

    def add(self, key: int, public_context: bytes, spool: CiphertextSpool) -> None:
        """Let tasks name recipient ``key`` from now on: its public context and complete ``spool``
        (what :func:`~fedgat.crypto.tasks.write_recipient_setup` writes for the workers).

        Raises:
            ValueError: ``key`` is one of the pool's already.
            RuntimeError: the pool is closed.
        """
        if self.executor is None:
            raise RuntimeError("the round pool is closed")
        if key in self.keys or key in self._left:
            # workers know a recipient by its key: one that left may still be open in an idle worker
            raise ValueError(f"recipient {key} is or was one of the round pool's already")
        path = os.path.join(self._private_dir(), f"recipient-{key}.npz")
        write_recipient_setup(path, public_context, spool)
        self._setups[key], self.keys, self._joined = path, self.keys | {key}, True

    def remove(self, key: int) -> None:
        """Recipient ``key`` is done: tasks may no longer name it, and each worker drops its reader of
        ``key``'s spool before its next task (idempotent). Call it once ``key``'s :meth:`map` has
        been read to the end: a task still queued for it would find its setup file gone."""
        if key in self.keys:
            self._left.add(key)
        self.keys = self.keys - {key}
        path = self._setups.pop(key, None)
        if path is not None:
            os.unlink(path)

    def close(self) -> None:
        """Shut the pool down, waiting for its workers (so their CPU time is reaped)."""
        if self.executor is not None:
            self.executor.shutdown()
            self.executor = None
        self.keys, self._setups = set(), {}
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


class ProcessPoolEncoder:
    """The server's homomorphic encodings on every core of this machine.

    Worker processes load the *public* context from bytes (in the session's ciphertext wire, the
    spool's context's :attr:`~fedgat.crypto.context.CkksContext.wire`) and read the spooled uploads from disk;
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
        chunksize: nodes (or pieces of nodes) per task sent to a worker, at most (``max_task_cost``
            usually ends a batch first; each submission costs the main process a future, a queue
            put and a pickled batch, so batches are kept large).
        window: batches in flight at most (default ``4 * workers``).
        max_task_cost: multiply-adds per task, about (~0.3 s at n4096); a node above it is split
            into runs of whole result groups, a batch of small nodes stops there.
        round_pool, key: compute on ``round_pool`` (a :class:`RoundPool` this encoder does not own:
            closing the encoder leaves it running) as its recipient ``key``, instead of starting a
            pool of ``workers`` (a round pool of this one spool, closed with the encoder).
    """

    def __init__(
        self,
        public_context: bytes,
        layout: SlotLayout,
        spool: CiphertextSpool,
        workers: int | None = None,
        chunksize: int = 32,
        window: int | None = None,
        max_task_cost: int = 512,
        *,
        round_pool: RoundPool | None = None,
        key: int | None = None,
    ) -> None:
        if round_pool is not None:
            if key not in round_pool.keys:
                raise ValueError(f"recipient {key} is not one of the round pool's")
            workers = round_pool.workers
        self.workers = (os.cpu_count() or 1) if workers is None else workers
        self.chunksize = max(1, chunksize)
        self.max_task_cost = max(1, max_task_cost)
        self._layout = layout
        self.window = max(1, 4 * self.workers if window is None else window)
        #: most batches that were ever in flight at once (tests: never above ``window``)
        self.max_in_flight = 0
        self._inline = InlineEncoder(spool.ctx, layout, spool)
        #: the pool this encoder started (and closes); None on a round's pool or inline
        self._own: RoundPool | None = None
        if round_pool is None and self.workers > 0:
            round_pool = self._own = RoundPool(
                {0: (public_context, spool)}, layout, spool.ctx.wire, self.workers
            )
            key = 0
        self._pool, self._key = round_pool, key

    def map(self, buckets: Iterable[ComputeBucket]) -> Iterator[NodeResult]:
        """Encrypted encodings of every node of every bucket, in bucket order."""
        if self._pool is None or self._pool.executor is None:
            yield from self._inline.map(buckets)
            return
        assert self._key is not None  # set with the pool (checked against a round pool's keys)
        for _, result in self._pool.map(
            [(self._key, buckets)], self._layout, self, self.chunksize, self.max_task_cost
        ):
            yield result

    def close(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None
        self._pool = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def map_inline(
    recipients: Mapping[int, tuple[CkksContext, CiphertextSpool]],
    jobs: Iterable[tuple[int, Iterable[ComputeBucket]]],
    layout: SlotLayout,
) -> Iterator[tuple[int, NodeResult]]:
    """``(recipient key, result)`` of every job computed in this process, one recipient after another,
    each under its context and spool (``recipients``: what a factory's ``prepare`` was given).

    Raises:
        ValueError: a job's recipient is not in ``recipients``.
    """
    for key, buckets in jobs:
        if key not in recipients:
            raise ValueError(f"recipient {key} was not prepared")
        ctx, spool = recipients[key]
        for result in InlineEncoder(ctx, layout, spool).map(buckets):
            yield key, result


def check_workers(workers: object, name: str = "workers") -> None:
    """``workers`` is None (automatic) or a whole number ``>= 0`` (0: compute in the server's process).

    Raises:
        ValueError: anything else, naming ``name``.
    """
    if workers is None:
        return
    if isinstance(workers, bool) or not isinstance(workers, numbers.Integral) or workers < 0:
        raise ValueError(
            f"{name} must be None (one per core) or a count >= 0 (0: in process), got {workers!r}"
        )


def auto_workers(workers: int | None, multiply_adds: int) -> int:
    """Processes :func:`local_encoder` starts: ``workers`` when given, else ``os.cpu_count()`` for
    work of at least :data:`AUTO_POOL_MIN_MULTIPLY_ADDS` multiply-adds on a machine with more than
    one core, else 0."""
    if workers is not None:
        return workers
    cores = os.cpu_count() or 1
    return cores if cores > 1 and multiply_adds >= AUTO_POOL_MIN_MULTIPLY_ADDS else 0


class LocalEncoderFactory:
    """The default factory (:func:`local_encoder`): ``workers`` processes (0: :class:`InlineEncoder`);
    ``None`` uses ``os.cpu_count()`` processes for a round of at least
    :data:`AUTO_POOL_MIN_MULTIPLY_ADDS` multiply-adds (every recipient's together: one pool serves
    them all) on a machine with more than one core, else computes inline -- a spawned pool costs
    seconds to start.

    With :meth:`prepare` (the server calls it when the compute phase begins) the round's recipients
    share one :class:`RoundPool`, started once and closed by :meth:`close` (the server calls it when
    the round ends); without it (a caller of the bare factory), each recipient's encoder starts and
    closes its own pool, as before.
    """

    def __init__(self, workers: int | None = None) -> None:
        check_workers(workers)
        self.workers = workers
        self.pool: RoundPool | None = None
        self._keys: dict[int, int] = {}  # id(spool) -> the recipient key its pool tasks name
        #: what :meth:`prepare` was given: ``key -> (context, spool)``
        self._recipients: dict[int, tuple[ServerContext, CiphertextSpool]] = {}
        #: :meth:`map_round`'s submission window (batches) and the most ever in flight in it
        self.window = 0
        self.max_in_flight = 0

    def prepare(
        self, recipients: dict[int, tuple[ServerContext, CiphertextSpool, int]], layout: SlotLayout
    ) -> None:
        """Start the round's pool for ``recipients`` (``key -> (public context, complete spool,
        multiply-adds)``) when the rule above asks for one (replacing a pool left from before)."""
        self.close()
        self.max_in_flight = 0
        self._recipients = {key: (ctx, spool) for key, (ctx, spool, _) in recipients.items()}
        n = auto_workers(self.workers, sum(m for _, _, m in recipients.values()))
        if n == 0 or not recipients:
            return
        wires = {ctx.wire for ctx, _, _ in recipients.values()}
        if len(wires) != 1:
            raise ValueError(f"one round, one ciphertext wire: got {sorted(wires)}")
        self.pool = RoundPool(
            {key: (ctx.public_context_bytes(), spool) for key, (ctx, spool, _) in recipients.items()},
            layout,
            wires.pop(),
            n,
        )
        self._keys = {id(spool): key for key, (_, spool, _) in recipients.items()}
        self.window = 4 * n

    @property
    def pool_workers(self) -> int:
        """Processes of the round's pool (0: none, :meth:`map_round` computes inline)."""
        return 0 if self.pool is None else self.pool.workers

    def map_round(
        self,
        jobs: Iterable[tuple[int, Iterable[ComputeBucket]]],
        layout: SlotLayout,
        weights: Mapping[int, float] | None = None,
    ) -> Iterator[tuple[int, NodeResult]]:
        """``(recipient key, result)`` of every ``(recipient key, buckets)`` job of the recipients
        given to :meth:`prepare`, each recipient's results in its bucket order: on the round's pool
        through one submission window for the whole round, the recipients interleaved in proportion
        to ``weights`` (:meth:`RoundPool.map`), or, without a pool, in this process under each
        recipient's context and spool, one recipient after another."""
        if self.pool is not None:
            yield from self.pool.map(jobs, layout, self, weights=weights)
            return
        yield from map_inline(self._recipients, jobs, layout)

    def add_recipient(
        self,
        key: int,
        ctx: ServerContext,
        spool: CiphertextSpool,
        layout: SlotLayout,
        round_multiply_adds: int,
    ) -> None:
        """A recipient whose uploads are all in, in a round that computes its recipients one by one
        (an upload window; the server calls this before the recipient's encoder): it joins the
        round's pool (:meth:`RoundPool.add`), which the first recipient starts when the rule above
        asks for one for the whole round's ``round_multiply_adds``; the encoder the factory then
        returns for ``spool`` computes on it. :meth:`remove_recipient` when its results are out."""
        if self.pool is None:
            n = auto_workers(self.workers, round_multiply_adds)
            if n == 0:
                return
            self.pool = RoundPool({}, layout, ctx.wire, n)
            self.window = 4 * n
        elif ctx.wire != self.pool.wire:
            raise ValueError(f"one round, one ciphertext wire: got {ctx.wire!r} on a {self.pool.wire!r} pool")
        self.pool.add(key, ctx.public_context_bytes(), spool)
        self._keys[id(spool)] = key
        self._recipients[key] = (ctx, spool)

    def remove_recipient(self, key: int) -> None:
        """Recipient ``key``'s results are all out (:meth:`add_recipient`); idempotent."""
        entry = self._recipients.pop(key, None)
        if entry is not None:
            self._keys.pop(id(entry[1]), None)
        if self.pool is not None:
            self.pool.remove(key)

    def __call__(
        self, ctx: ServerContext, layout: SlotLayout, spool: CiphertextSpool, multiply_adds: int
    ) -> Encoder:
        key = self._keys.get(id(spool))
        if self.pool is not None and key is not None:
            return ProcessPoolEncoder(
                ctx.public_context_bytes(), layout, spool, round_pool=self.pool, key=key
            )
        n = auto_workers(self.workers, multiply_adds)
        if n == 0:
            return InlineEncoder(ctx, layout, spool)
        return ProcessPoolEncoder(ctx.public_context_bytes(), layout, spool, workers=n)

    def close(self) -> None:
        """Shut the round's pool down (idempotent)."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        self._keys, self._recipients = {}, {}


def local_encoder(workers: int | None = None) -> LocalEncoderFactory:
    """The default factory, :class:`LocalEncoderFactory` with ``workers``."""
    return LocalEncoderFactory(workers)
