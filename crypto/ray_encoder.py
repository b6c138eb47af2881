r"""The server's homomorphic encodings as Ray tasks: a drop-in alternative to
:class:`fedgat.crypto.encoders.ProcessPoolEncoder` for a Ray cluster (``pip install "fedgat[ray]"``).

Same inputs (public context bytes, slot layout, the server's :class:`CiphertextSpool`) and the same
output (:class:`NodeResult` per node, in bucket order, ciphertexts as bytes). What differs is where
the work runs and how it gets its data: a :class:`~fedgat.crypto.encoders.ProcessPoolEncoder` worker reads the spool file from
the server's disk, which another machine cannot; here

* the public context goes into the object store once (``ray.put``); each worker process loads it
  into a :class:`ServerContext` (in the session's ciphertext wire, the spool's context's) once and
  keeps it (keyed by its SHA-256 and the wire);
* each uploaded node's ciphertext bytes go into the object store once, when the first task needs
  them, and are released when the last node that uses them is computed, so the store never holds
  much more than the uploads of the nodes in flight and their neighbours;
* tasks are the batches of the process pool (one node, or a run of result groups of a
  high-degree node; ~``max_task_cost`` multiply-adds per batch), at most ``window`` in flight,
  results yielded in order.

TenSEAL objects cannot be pickled: only ``bytes``, numpy arrays and :class:`SlotLayout` cross.
Ray is imported lazily; :func:`import_ray` raises :class:`RayUnavailableError` (an ``ImportError``)
with the install hint when it is missing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Self

from .context import ServerContext
from .encoders import Encoder, InlineEncoder, auto_workers, map_inline
from .packing import SlotLayout, deserialize
from .spool import CiphertextSpool
from .tasks import ComputeBucket, NodeResult, Task, batched, encode_node, interleaved, pieces, run_windowed

__all__ = ["RayEncoder", "RayEncoderFactory", "RayUnavailableError", "import_ray", "ray_encoder"]

INSTALL_HINT = 'pip install "fedgat[ray]"'


class RayUnavailableError(ImportError):
    """Ray is not installed (it is an optional extra of fedgat)."""


def import_ray() -> Any:
    """``import ray``, or :class:`RayUnavailableError` telling how to install it."""
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise RayUnavailableError(f"the Ray engine needs Ray: {INSTALL_HINT} ({exc})") from exc
    return ray


# ------------------------------------------------------------------------------------ worker side
#: per worker process: (SHA-256 of the public context bytes, wire) -> loaded context
_CONTEXTS: dict[tuple[bytes, str], ServerContext] = {}


#: contexts a worker keeps loaded (the server interleaves its recipients' tasks, so a worker moves
#: between them all the time; a public context without Galois keys is small)
MAX_WORKER_CONTEXTS = 64


def _context(key: bytes, public_context: bytes, wire: str) -> ServerContext:
    ctx = _CONTEXTS.pop((key, wire), None)
    if ctx is None:
        while len(_CONTEXTS) >= MAX_WORKER_CONTEXTS:
            del _CONTEXTS[next(iter(_CONTEXTS))]  # the least recently used
        ctx = ServerContext.from_bytes(public_context, wire=wire)
    _CONTEXTS[(key, wire)] = ctx  # the most recently used last
    return ctx


def encode_batch(
    key: bytes,
    public_context: bytes,
    wire: str,
    layout: SlotLayout,
    tasks: list[Task],
    nodes: list[int],
    *uploads: list[bytes],
) -> list[NodeResult]:
    """One Ray task: ``tasks`` are :func:`fedgat.crypto.tasks.pieces` tuples, ``uploads[k]`` the
    chunk ciphertexts of ``nodes[k]`` (every neighbour the tasks use), in the session's ciphertext
    ``wire`` (results too). Plain function, so it can be tested without Ray."""
    ctx = _context(key, public_context, wire)
    loaded = {
        node: [deserialize(ctx, b, level="fresh") for b in blobs]
        for node, blobs in zip(nodes, uploads, strict=True)
    }
    return [
        encode_node(ctx, layout, [loaded[int(j)] for j in neighbours], node, q)
        for node, neighbours, q, _last in tasks
    ]


_REMOTE: dict[str, Any] = {}


def _remote_batch(ray: Any) -> Any:
    if "batch" not in _REMOTE:
        _REMOTE["batch"] = ray.remote(encode_batch)
    return _REMOTE["batch"]


# ------------------------------------------------------------------------------------ driver side
class RayEncoder:
    """The server's homomorphic encodings as Ray tasks (see the module docstring).

    Args:
        public_context: the server's public context bytes.
        layout: the slot layout of the uploads.
        spool: the spool holding every upload (read here, in the server's process).
        workers: tasks that may run at once; None = the cluster's CPUs (at least 1).
        chunksize, max_task_cost: batching, as :class:`~fedgat.crypto.encoders.ProcessPoolEncoder`.
        window: batches in flight at most (default ``2 * workers``).
        task_options: extra ``.options(...)`` of the Ray task (e.g. ``{"num_cpus": 2}``).

    Raises:
        RayUnavailableError: Ray is not installed.
        RuntimeError: Ray is not initialised (start it with :class:`fedgat.protocols.ray_engine.RayEngine`
            or ``ray.init``).
    """

    def __init__(
        self,
        public_context: bytes,
        layout: SlotLayout,
        spool: CiphertextSpool,
        workers: int | None = None,
        chunksize: int = 8,
        window: int | None = None,
        max_task_cost: int = 512,
        task_options: dict | None = None,
    ) -> None:
        ray = import_ray()
        if not ray.is_initialized():
            raise RuntimeError(
                "RayEncoder needs a running Ray (fedgat.protocols.ray_engine.RayEngine or ray.init())"
            )
        self._ray = ray
        if workers is None:
            workers = int(ray.cluster_resources().get("CPU", 1))
        self.workers = max(1, int(workers))
        self.chunksize = max(1, chunksize)
        self.max_task_cost = max(1, max_task_cost)
        self.window = max(1, 2 * self.workers if window is None else window)
        self._layout = layout
        self._spool = spool
        self._wire = spool.ctx.wire
        self._key = hashlib.sha256(public_context).digest()
        self._context_ref = ray.put(public_context)
        self._uploads: dict[int, Any] = {}  # node -> ObjectRef of its chunk ciphertexts
        self._task = _remote_batch(ray).options(**(task_options or {}))
        #: most batches ever in flight at once (never above ``window``), tasks submitted, uploads put
        self.max_in_flight = 0
        self.tasks_submitted = 0
        self.uploads_put = 0

    def _upload_ref(self, node: int) -> Any:
        ref = self._uploads.get(node)
        if ref is None:
            ref = self._uploads[node] = self._ray.put(self._spool.blobs(node))
            self.uploads_put += 1
        return ref

    def map(self, bases_list: Iterable[ComputeBucket]) -> Iterator[NodeResult]:
        """Encrypted encodings of every node of every bucket, in bucket order."""
        batches, submit, node_done = self.stream(bases_list)
        for _, result in run_windowed(
            self,
            ((None, b) for b in batches),
            lambda _k, b: submit(b),
            self._ray.get,
            lambda _k, t: node_done(t),
        ):
            yield result

    def stream(
        self, bases_list: Iterable[ComputeBucket]
    ) -> tuple[Iterator[list[Task]], Callable[[list[Task]], Any], Callable[[Task], None]]:
        """This recipient's work as ``(batches, submit, node_done)`` for
        :func:`~fedgat.crypto.tasks.run_windowed`: ``submit(batch)`` starts the batch's Ray task
        (putting the uploads it needs into the object store first), ``node_done(task)`` releases the
        uploads no node still to compute uses."""
        bases_list = list(bases_list)
        uses: dict[int, int] = {}  # node -> computed nodes that still need its upload
        for b in bases_list:
            for row in b.neighbours:
                for j in row.tolist():
                    uses[j] = uses.get(j, 0) + 1
        layout = self._layout
        tasks = pieces(bases_list, layout.chunks, layout.blocks, self.max_task_cost)

        def submit(batch: list[Task]) -> Any:
            nodes = sorted({int(j) for task in batch for j in task[1]})
            self.tasks_submitted += 1
            return self._task.remote(
                self._key,
                self._context_ref,
                self._wire,
                layout,
                batch,
                nodes,
                *[self._upload_ref(j) for j in nodes],
            )

        def node_done(task: Task) -> None:
            for j in task[1].tolist():
                uses[j] -= 1
                if uses[j] == 0:
                    self._uploads.pop(j, None)  # the store frees it once no task holds it

        return batched(tasks, self.chunksize, self.max_task_cost, layout.chunks), submit, node_done

    def close(self) -> None:
        self._uploads.clear()
        self._context_ref = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RayEncoderFactory:
    """An :data:`~fedgat.crypto.encoders.EncoderFactory` for the pre-training server as Ray tasks
    (:func:`ray_encoder` makes one). Called per recipient, it returns a :class:`RayEncoder`; with
    :meth:`prepare` and :meth:`map_round` (which the server uses when they are there) the round's
    recipients run through one window of Ray tasks, their batches
    :func:`~fedgat.crypto.tasks.interleaved` in proportion to their work, so that every client
    receives and decrypts its results while the others do (as
    :meth:`~fedgat.crypto.encoders.LocalEncoderFactory.map_round` on a process pool).

    Args:
        workers: tasks that may run at once; None or 0: the cluster's CPUs.
        everywhere: False uses Ray only where :func:`~fedgat.crypto.encoders.local_encoder` with the
            same ``workers`` would start a process pool (decided for the whole round in
            :meth:`prepare`, per recipient without it); smaller rounds stay in the server's process.
        on_encoder: called with every :class:`RayEncoder` made (engines keep them for statistics).
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        everywhere: bool = True,
        on_encoder: Callable[[RayEncoder], None] | None = None,
    ) -> None:
        self.workers, self.everywhere, self._on_encoder = workers, everywhere, on_encoder
        self._recipients: dict[int, tuple[ServerContext, CiphertextSpool]] = {}
        self._on_ray = False
        self._live: list[RayEncoder] = []  # map_round's encoders, until its stream ends or close()
        #: :meth:`map_round`'s window (batches in flight at most) and the most ever in flight in it
        self.window = 0
        self.max_in_flight = 0

    def _encoder(self, ctx: ServerContext, layout: SlotLayout, spool: CiphertextSpool) -> RayEncoder:
        encoder = RayEncoder(ctx.public_context_bytes(), layout, spool, workers=self.workers or None)
        if self._on_encoder is not None:
            self._on_encoder(encoder)
        return encoder

    def __call__(
        self, ctx: ServerContext, layout: SlotLayout, spool: CiphertextSpool, multiply_adds: int
    ) -> Encoder:
        if not self.everywhere and auto_workers(self.workers, multiply_adds) == 0:
            return InlineEncoder(ctx, layout, spool)
        return self._encoder(ctx, layout, spool)

    def prepare(
        self, recipients: dict[int, tuple[ServerContext, CiphertextSpool, int]], layout: SlotLayout
    ) -> None:
        """The round's recipients (``key -> (public context, complete spool, multiply-adds)``),
        every upload in; whether the round runs on Ray (``everywhere``, or the round's multiply-adds
        together)."""
        self._recipients = {key: (ctx, spool) for key, (ctx, spool, _) in recipients.items()}
        work = sum(m for _, _, m in recipients.values())
        self._on_ray = bool(recipients) and (self.everywhere or auto_workers(self.workers, work) > 0)
        self.max_in_flight = 0

    @property
    def pool_workers(self) -> int:
        """Ray tasks at once in :meth:`map_round` (0: the round computes in this process)."""
        if not self._on_ray:
            return 0
        return max(1, self.workers or int(import_ray().cluster_resources().get("CPU", 1)))

    def map_round(
        self,
        jobs: Iterable[tuple[int, Iterable[ComputeBucket]]],
        layout: SlotLayout,
        weights: Mapping[int, float] | None = None,
    ) -> Iterator[tuple[int, NodeResult]]:
        """``(recipient key, result)`` of every ``(recipient key, buckets)`` job of the recipients
        given to :meth:`prepare`, each recipient's in its bucket order: as Ray tasks through one
        window (``2 x`` :attr:`pool_workers` batches), the recipients interleaved in proportion to
        ``weights``; or, for a round too small for Ray, in this process, one recipient after
        another.

        Raises:
            ValueError: a job's recipient was not prepared, or appears twice.
        """
        jobs = list(jobs)
        if not self._on_ray:
            yield from map_inline(self._recipients, jobs, layout)
            return
        for key, _ in jobs:
            if key not in self._recipients:
                raise ValueError(f"recipient {key} was not prepared")
        ray = import_ray()
        streams, submits, releases = [], {}, {}
        try:
            for key, buckets in jobs:
                ctx, spool = self._recipients[key]
                encoder = self._encoder(ctx, layout, spool)
                self._live.append(encoder)
                batches, submits[key], releases[key] = encoder.stream(buckets)
                streams.append((key, batches))
            self.window = 2 * self.pool_workers
            yield from run_windowed(
                self,
                interleaved(streams, layout.chunks, weights),
                lambda key, batch: submits[key](batch),
                ray.get,
                lambda key, task: releases[key](task),
            )
        finally:
            self._release()

    def _release(self) -> None:
        for encoder in self._live:
            encoder.close()  # its uploads and context leave the object store once no task holds them
        self._live = []

    def close(self) -> None:
        """Release the encoders of a round stopped midway and forget the round's recipients."""
        self._release()
        self._recipients, self._on_ray = {}, False


def ray_encoder(
    workers: int | None = None,
    *,
    everywhere: bool = True,
    on_encoder: Callable[[RayEncoder], None] | None = None,
) -> RayEncoderFactory:
    """An :data:`~fedgat.crypto.encoders.EncoderFactory` for the pre-training server:
    :class:`RayEncoderFactory` (:class:`RayEncoder` with ``workers`` tasks at once, None or 0: the
    cluster's CPUs). ``everywhere=False`` uses Ray only where
    :func:`~fedgat.crypto.encoders.local_encoder` with the same ``workers`` would start a process
    pool; smaller rounds stay in the server's process."""
    return RayEncoderFactory(workers, everywhere=everywhere, on_encoder=on_encoder)
