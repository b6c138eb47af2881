r"""A client's encryptions on several cores: worker processes that hold only public contexts.

TenSEAL holds the GIL while it encrypts (two threads encrypting take as long as one), so a client
that wants more than one core for its uploads needs processes. :class:`EncryptionPool` starts
``workers`` of them (``python -P -m fedgat.crypto.encrypt_pool``), hands each the recipients' *public*
contexts once, then sends batches of rows and reads back their envelopes -- exactly what
:func:`~fedgat.crypto.packing.encrypt_rows` makes in the client's own process, one envelope per
(row, chunk), node-major. The secret key never reaches a worker: a worker can encrypt for a
recipient, never decrypt anything.

Why plain subprocesses and not :mod:`multiprocessing`: the pool must run inside the process engine's
party hosts, which are daemonic (multiprocessing forbids them children) and refuse pickles; the
workers here speak length-prefixed frames over their stdin / a private copy of their stdout, each
a value in the process engine's worker encoding (:func:`fedgat.process_worker.encode_parts`: a JSON
header, ``bytes`` raw; float64 rows in, envelopes out), and read nothing else. A worker exits at the
end of its input, so it never outlives the process that started it (a crash or a kill of the client
closes the pipe); :meth:`EncryptionPool.close` stops them at once (killing any that do not end).

Start and failures: each worker answers its contexts ("ready", with the CPU its start took, or why
not), so the constructor knows every worker holds them. A worker that cannot start at all raises
:class:`EncryptionWorkerStartError` (a caller may then encrypt in its own process); one that refuses
its contexts, dies, fails a batch or does not answer in time (:data:`START_TIMEOUT`,
:data:`BATCH_TIMEOUT`; requests are written without blocking, against the same deadlines) raises
:class:`EncryptionWorkerError` and the pool is closed. Every answer carries the worker's CPU so far:
:meth:`EncryptionPool.result` returns each batch's share, :attr:`EncryptionPool.start_cpu` the rest.

Scheduling: one batch in flight per worker (a second request could block on a pipe the worker
fills with its previous answer), the rest queued here in submission order; every call drains the
answers that are ready and hands each freed worker the next queued batch, so a client that keeps
:attr:`EncryptionPool.depth` batches submitted (:class:`fedgat.protocols.ClientPretrain` does) keeps
every worker busy while it waits for the next batch.
"""

from __future__ import annotations

import os
import select
import signal
import struct
import subprocess
import sys
import time
import weakref
from collections import deque
from collections.abc import Mapping
from typing import IO, NoReturn, Self

import numpy as np

from fedgat.process_worker import WireError, decode, encode_parts

from .context import CkksContext
from .errors import CryptoError
from .packing import SlotLayout

__all__ = [
    "MIN_ENCRYPTIONS_PER_WORKER",
    "EncryptionPool",
    "EncryptionWorkerError",
    "EncryptionWorkerStartError",
    "encrypt_pool_size",
]

#: a worker's start (interpreter, numpy, TenSEAL, the contexts: ~0.4 s) is worth it from about this
#: many encryptions (~1.1 s of one core at n4096)
MIN_ENCRYPTIONS_PER_WORKER = 256
#: seconds a worker may take to start and load its contexts, and to answer one batch
START_TIMEOUT = 120.0
BATCH_TIMEOUT = 600.0
_LENGTH = struct.Struct("<Q")
#: the largest frame read (a batch's answer is ~8 MB at Cora's width): longer is not a worker's frame
_MAX_FRAME_BYTES = 1 << 31


class EncryptionWorkerError(CryptoError):
    """An encryption worker failed (it died, refused its contexts, its encryption raised, or it did
    not answer in time): the pool is closed and its batches are lost."""


class EncryptionWorkerStartError(EncryptionWorkerError):
    """A worker could not start at all (no process, or it ended before answering its contexts): the
    caller may encrypt in its own process instead. A worker that *refuses* its contexts is an
    :class:`EncryptionWorkerError`, not this: that is a bug to report, not a machine to work around."""


def encrypt_pool_size(requested: int, encryptions: int) -> int:
    """Workers for a client with ``encryptions`` to make that allows ``requested``: at most one per
    :data:`MIN_ENCRYPTIONS_PER_WORKER`, and 0 (encrypt in the client's own process) below 2 -- one
    worker would only move the same work to another process."""
    if requested < 0:
        raise ValueError(f"requested workers must be >= 0, got {requested}")
    n = min(requested, encryptions // MIN_ENCRYPTIONS_PER_WORKER)
    return n if n >= 2 else 0


# ------------------------------------------------------------------------------------------ framing
def _frame(value: dict) -> list[bytes | bytearray | memoryview]:
    """``value`` in the process engine's worker encoding (:func:`fedgat.process_worker.encode_parts`:
    a JSON header, ``bytes`` values raw), after its length."""
    parts = encode_parts(value)
    return [_LENGTH.pack(sum(memoryview(p).nbytes for p in parts)), *parts]


def _send(fd: int, value: dict, deadline: float) -> None:
    """Write ``value``'s frame to the non-blocking pipe ``fd`` by ``deadline`` (TimeoutError): a
    worker that stops reading cannot block its client."""
    view = memoryview(b"".join(_frame(value)))
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            if not poll.poll(max(0.0, deadline - time.monotonic()) * 1000):
                raise TimeoutError("the worker did not read its input in time") from None


def _write(stream: IO[bytes], value: dict) -> None:
    """A worker's answer (blocking: its client reads every answer it waits for)."""
    for part in _frame(value):
        stream.write(part)
    stream.flush()


def _read_exact(stream: IO[bytes], n: int) -> bytes:
    data = stream.read(n)
    if data is None or len(data) != n:
        raise EOFError("the stream ended inside a frame")
    return data


def _read(stream: IO[bytes]) -> dict:
    """One frame's value (EOFError at a clean end of the stream; WireError, a ValueError, for bytes
    that are not a frame)."""
    raw = stream.read(_LENGTH.size)
    if not raw:
        raise EOFError("end of stream")
    if len(raw) < _LENGTH.size:
        raw += _read_exact(stream, _LENGTH.size - len(raw))
    (size,) = _LENGTH.unpack(raw)
    if size > _MAX_FRAME_BYTES:
        raise WireError(f"a frame of {size} bytes")
    value = decode(_read_exact(stream, size))
    if not isinstance(value, dict):
        raise WireError(f"a frame holds a {type(value).__name__}, not a dict")
    return value


# ------------------------------------------------------------------------------------------- pool
class _Worker:
    def __init__(self, index: int) -> None:
        self.index = index
        self.process = subprocess.Popen(
            # -P: the current directory does not go first on the worker's sys.path (a numpy.py there
            # would shadow numpy in the workers only)
            [sys.executable, "-P", "-m", "fedgat.crypto.encrypt_pool"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin = self.process.stdin.fileno()
        os.set_blocking(self.stdin, False)  # written with deadlines (_send)
        self.stdout: IO[bytes] = self.process.stdout
        self.ticket: int | None = None  # the batch in flight
        self.rows = 0  # its rows
        self.cpu = 0.0  # the worker's CPU seconds so far, as of its last answer


def _stop(processes: list[subprocess.Popen]) -> None:
    """Close the workers' input (they exit at its end), then make sure they are gone."""
    for p in processes:
        for stream in (p.stdin, p.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
    deadline = time.monotonic() + 2.0
    for p in processes:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class EncryptionPool:
    """``workers`` processes encrypting rows under the recipients' public contexts.

    Args:
        contexts: ``recipient key -> its public context`` (a :class:`~fedgat.crypto.context.CkksContext`;
            only :meth:`~fedgat.crypto.context.CkksContext.public_context_bytes` and its wire travel).
        layout: the upload slot layout (:func:`~fedgat.crypto.packing.encrypt_rows`).
        workers: processes (at least 1).

    Use :meth:`submit` then :meth:`result` (in any order); :meth:`close` when done (also a context
    manager). The pool is not thread-safe: one caller drives it.
    """

    def __init__(self, contexts: Mapping[int, CkksContext], layout: SlotLayout, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"an encryption pool needs at least one worker, got {workers}")
        if not contexts:
            raise ValueError("an encryption pool needs at least one recipient's context")
        wires = {ctx.wire for ctx in contexts.values()}
        if len(wires) != 1:
            raise ValueError(f"the recipients' contexts name different wires: {sorted(wires)}")
        self.layout = layout
        self.keys = frozenset(int(k) for k in contexts)
        self._workers: list[_Worker] = []
        self._queue: deque[tuple[int, int, np.ndarray]] = deque()  # (ticket, key, rows) not yet sent
        self._done: dict[int, tuple[list[bytes], float]] = {}
        self._next_ticket = 0
        #: CPU seconds of the workers' start (interpreter, imports, contexts), not charged to a batch
        self.start_cpu = 0.0
        keys = sorted(self.keys)
        init = {
            "op": "init",
            "wire": wires.pop(),
            "layout": [layout.d, layout.slots, layout.chunks],
            "contexts": [[k, contexts[k].public_context_bytes()] for k in keys],
        }
        processes: list[subprocess.Popen] = []
        self._finalizer = weakref.finalize(self, _stop, processes)
        try:
            for i in range(workers):  # all start importing at once
                try:
                    self._workers.append(_Worker(i))
                except OSError as exc:
                    raise EncryptionWorkerStartError(f"encryption worker {i} did not start: {exc}") from exc
                processes.append(self._workers[-1].process)
            deadline = time.monotonic() + START_TIMEOUT
            for w in self._workers:
                try:
                    _send(w.stdin, init, deadline)
                except TimeoutError:
                    self._fail(w, f"it did not take its contexts within {START_TIMEOUT:g} s of its start")
                except OSError as exc:
                    self._fail(w, f"it ended before taking its contexts ({exc})", EncryptionWorkerStartError)
            for w in self._workers:  # each says it holds the contexts, or why not
                self._wait(w, deadline)
                self._read_answer(w, starting=True)
                self.start_cpu += w.cpu
        except BaseException:
            self.close()
            raise

    @property
    def workers(self) -> int:
        return len(self._workers)

    @property
    def depth(self) -> int:
        """Batches worth keeping submitted: one per worker and one more. More would not keep the
        workers busier (a finished worker waits, its answer in its pipe, until the caller calls in
        again) and would hold more envelopes here."""
        return len(self._workers) + 1

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def submit(self, key: int, rows: np.ndarray) -> int:
        """Queue ``rows`` (``(n, layout.d)``, finite) for encryption under ``key``'s context; returns
        the ticket that :meth:`result` takes.

        Raises:
            ValueError: an unknown recipient or rows of another width (nothing queued).
            EncryptionWorkerError: as :meth:`result` (submitting also reads the answers ready).
        """
        if self.closed:
            raise RuntimeError("the encryption pool is closed")
        if int(key) not in self.keys:
            raise ValueError(f"recipient {key} is not one of the pool's")
        rows = np.ascontiguousarray(rows, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != self.layout.d:
            raise ValueError(f"rows must have shape (n, {self.layout.d}), got {rows.shape}")
        ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
        self._queue.append((ticket, int(key), rows))
        self._collect(block=False)
        return ticket

    def result(self, ticket: int) -> tuple[list[bytes], float]:
        """The envelopes of ticket's rows (``encrypt_rows`` order) and the worker's CPU seconds for
        them (framing included); waits for them. Each ticket's result is returned once.

        Raises:
            EncryptionWorkerError: a worker died, its encryption failed, or no worker answered
                within :data:`BATCH_TIMEOUT` (the pool is closed).
            KeyError: an unknown ticket, or one already collected.
            RuntimeError: the pool is closed.
        """
        if self.closed:
            raise RuntimeError("the encryption pool is closed")
        if ticket not in self._done and not self._pending(ticket):
            raise KeyError(f"no batch {ticket} in the encryption pool")
        while ticket not in self._done:
            if not self._collect(block=True):
                late = next(w for w in self._workers if w.ticket is not None)
                self._fail(late, f"no answer within {BATCH_TIMEOUT:g} s")
        return self._done.pop(ticket)

    def _pending(self, ticket: int) -> bool:
        return any(t == ticket for t, _, _ in self._queue) or any(w.ticket == ticket for w in self._workers)

    def _collect(self, *, block: bool) -> bool:
        """Read every answer that is ready (with ``block``, wait up to :data:`BATCH_TIMEOUT` for one
        first), then hand the freed workers the next queued batches. False: a blocking wait that
        got no answer."""
        self._dispatch()
        busy = {w.stdout.fileno(): w for w in self._workers if w.ticket is not None}
        ready = []
        if busy:
            poll = select.poll()  # not select.select: no limit on descriptor numbers
            for fd in busy:
                poll.register(fd, select.POLLIN)
            ready = poll.poll(BATCH_TIMEOUT * 1000 if block else 0)
            for fd, _ in ready:
                self._answer(busy[fd])
        self._dispatch()
        return bool(ready) or not block

    def _wait(self, w: _Worker, deadline: float) -> None:
        """Wait until ``w`` has something to say (its ready answer), at most until ``deadline``."""
        poll = select.poll()
        poll.register(w.stdout.fileno(), select.POLLIN)
        if not poll.poll(max(0.0, deadline - time.monotonic()) * 1000):
            self._fail(w, f"no answer within {START_TIMEOUT:g} s of its start")

    def _dispatch(self) -> None:
        for w in self._workers:
            if not self._queue:
                return
            if w.ticket is None:
                ticket, key, rows = self._queue.popleft()
                n, d = rows.shape
                w.rows = n
                request = {"op": "encrypt", "key": key, "shape": [n, d], "rows": rows.tobytes()}
                try:
                    _send(w.stdin, request, time.monotonic() + BATCH_TIMEOUT)
                except TimeoutError:
                    self._fail(w, f"it did not take a batch within {BATCH_TIMEOUT:g} s")
                except OSError as exc:
                    self._fail(w, f"could not send it a batch ({exc})")
                w.ticket = ticket

    def _read_answer(self, w: _Worker, *, starting: bool = False) -> list[bytes]:
        """One answer of ``w`` (its envelopes); its CPU so far goes to ``w.cpu``. ``starting``: its
        first answer (the stream ending before it means the worker did not start)."""
        try:
            answer = _read(w.stdout)
            if "error" in answer:
                self._fail(w, str(answer["error"]))
            w.cpu = float(answer["cpu"])
            blobs = list(answer.get("blobs", []))
        except EOFError as exc:
            kind = EncryptionWorkerStartError if starting else None
            self._fail(w, f"it ended without an answer ({exc})", kind)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self._fail(w, f"its answer is not a frame ({type(exc).__name__}: {exc})")
        return blobs

    def _answer(self, w: _Worker) -> None:
        before = w.cpu
        blobs = self._read_answer(w)
        assert w.ticket is not None
        if len(blobs) != w.rows * self.layout.chunks:
            self._fail(w, f"{len(blobs)} envelopes for {w.rows} rows of {self.layout.chunks} chunks")
        self._done[w.ticket] = (blobs, w.cpu - before)
        w.ticket = None

    def _fail(self, w: _Worker, what: str, kind: type[EncryptionWorkerError] | None = None) -> NoReturn:
        self.close()  # waits for the workers (killing those that do not end): their status is known
        code = w.process.returncode
        ended = "" if code is None else f" (exit status {code})"
        raise (kind or EncryptionWorkerError)(
            f"encryption worker {w.index} (pid {w.process.pid}){ended}: {what}"
        )

    def close(self) -> None:
        """Stop the workers (idempotent); batches not collected are dropped."""
        self._queue.clear()
        self._done.clear()
        for w in self._workers:
            w.ticket = None
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------------------- worker
def _serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """A worker's loop: an ``init`` frame (wire, layout, recipient keys, their public contexts), then
    ``encrypt`` frames until the end of ``requests``."""
    from .context import ServerContext
    from .packing import encrypt_rows

    init = _read(requests)
    try:
        if init.get("op") != "init":
            raise ValueError(f"expected an init frame, got {init.get('op')!r}")
        wire = str(init["wire"])
        layout = SlotLayout(*(int(x) for x in init["layout"]))
        contexts = {int(k): ServerContext.from_bytes(b, wire=wire) for k, b in init["contexts"]}
    except Exception as exc:  # noqa: BLE001 - reported to the client, which raises it
        _write(answers, {"error": f"it refused its contexts: {type(exc).__name__}: {exc}"})
        return
    _write(answers, {"cpu": time.process_time()})  # ready: start-up CPU (interpreter, imports, contexts)
    while True:
        try:
            request = _read(requests)
        except EOFError:
            return
        try:
            rows = np.frombuffer(request["rows"], dtype=np.float64).reshape(
                *(int(x) for x in request["shape"])
            )
            blobs = list(encrypt_rows(contexts[int(request["key"])], rows, layout))
        except Exception as exc:  # noqa: BLE001 - reported to the client, which raises it
            _write(answers, {"error": f"it could not encrypt: {type(exc).__name__}: {exc}"})
            continue
        # the CPU of everything so far: the client charges the difference to this batch
        _write(answers, {"cpu": time.process_time(), "blobs": blobs})


def main() -> None:
    """Entry point of ``python -m fedgat.crypto.encrypt_pool``: frames in on stdin, out on a private
    copy of stdout (stdout itself then points at stderr, so that a stray print cannot corrupt a frame)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the client's to handle; its end is ours
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        _serve(sys.stdin.buffer, answers)
    except (BrokenPipeError, EOFError):  # the client is gone: nothing to flush or to say
        os._exit(0)


if __name__ == "__main__":
    main()
