r"""The same protocol on this machine's cores: parties hosted in worker processes, frames as bytes.

The Ray engine's design (:mod:`fedgat.protocols.ray_engine`) on the standard library alone: no extra
to install, no cluster. Usage::

    with ProcessEngine() as engine:                  # one worker per usable core
        transport = engine.transport()
        pre = run_encrypted_pretraining(graph, partition, transport=transport, ...)
        run = train_fedgat(graph, partition, pre.encodings, transport=transport, ...)

or ``fedgat demo --engine process [--actors N]``, ``fedgat train --method fedgat --engine process``.

Design
------
* :class:`ProcessEngine` owns a pool of worker processes (default one per usable core,
  ``len(os.sched_getaffinity(0))``, and no more than the parties of the first run), started with
  multiprocessing's ``"spawn"`` method (or ``"forkserver"``; never ``"fork"``: torch and threads).
  A worker starts by importing the program's ``__main__`` module again, so a script must start an
  engine under ``if __name__ == "__main__":`` (a worker that dies before its first answer says so:
  :data:`MAIN_GUARD_HINT`).
  Each worker serves a :class:`~fedgat.protocols.hosting.PartyHost` (:mod:`fedgat.process_worker`)
  over a pipe. Messages cross as bytes only (``send_bytes``/``recv_bytes`` with the worker module's
  framing: a JSON header and raw blobs; no pickle); parties as their
  :class:`~fedgat.protocols.party_values.PartySpec` bytes, results as
  :class:`~fedgat.protocols.party_values.PartyReport` bytes, errors as values. A worker imports
  nothing heavy until the first party arrives (its start-up is :attr:`ProcessEngine.start_seconds`).
* :class:`ProcessTransport` is the coordinator every hosting engine shares
  (:class:`~fedgat.protocols.hosting.HostedTransport`): the server stays in this process, the clients
  are placed on the workers in contiguous blocks of party ids, and every frame is routed through this
  process -- counted by the shared traffic log, per sender -> receiver FIFO, one call per worker in
  flight, streamed steps round robin inside each worker and paused while more than
  ``max_pending_bytes`` wait -- and each hosted party's report is absorbed by the caller's party at
  the end. :func:`fedgat.pipeline.drive` calls :meth:`ProcessTransport.run_parties` instead of the
  in-process driver.
* Liveness: every call has a deadline (``call_timeout``) and every wait also watches the workers'
  process sentinels, so a worker that dies (killed, out of memory, a crash in native code) raises
  :class:`WorkerDiedError` and one that stops answering :class:`WorkerTimeoutError` in the
  coordinator, never a hang. After any failed run the workers that are still in step drop their
  parties; if any worker is dead or out of step, the whole pool is stopped and the next run starts a
  fresh one. The protocol's own deadlines (a peer that stalls while its worker is fine) hold as in
  process: the coordinator's clock ticks the hosted parties (:mod:`~fedgat.protocols.hosting`).
* The server's homomorphic work runs where it does in process: on the server's own process pool
  (:func:`fedgat.crypto.encoders.local_encoder`), sized by ``server_workers`` (see
  :meth:`ProcessTransport.encoder_factory`).

Results equal the in-process transport's for the same partition and seeds (tests/engines): the same
bases, encodings up to CKKS noise, message counts, and trained model, dropout included: each client
draws its masks from a stream of its own that travels in its spec (:func:`fedgat.federated.client_seed`),
not from its worker's.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import connection as mpc
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Self

from fedgat.crypto.encoders import EncoderFactory, local_encoder
from fedgat.process_worker import WireError, decode, encode_parts, recv_message, send_parts

from .driver import Clock
from .hosting import MAX_FRAME_BYTES, EngineError, HostedTransport
from .party import Party
from .party_values import error_from_value
from .transport import Transcript

__all__ = [
    "START_METHODS",
    "ProcessEngine",
    "ProcessEngineError",
    "ProcessTransport",
    "WorkerDiedError",
    "WorkerTimeoutError",
    "usable_cores",
]

MiB = 1 << 20
#: multiprocessing start methods a worker may use ("fork" is refused: torch and threads)
START_METHODS = ("spawn", "forkserver")
#: added to a worker's death before its first answer when the program is a script: every worker starts
#: by importing the script again (as ``__mp_main__``), and one without the guard starts an engine there
MAIN_GUARD_HINT = (
    "a worker exited before its first answer (its own error is printed above). If your program is a "
    "script: each worker process imports it again when it starts (multiprocessing's spawn/forkserver), "
    'so it must start engines only under `if __name__ == "__main__":`'
)


def _main_is_reimported() -> bool:
    """Whether a spawned worker imports ``__main__`` again: a script or ``python -m pkg.mod`` (not an
    interactive session, ``-c`` or a package's ``__main__``, which multiprocessing leaves alone)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return bool(getattr(main, "__file__", None)) and not (spec is not None and spec.name.endswith("__main__"))


class ProcessEngineError(EngineError):
    """A worker could not serve a run: it died, did not answer in time, answered malformed bytes or
    refused a malformed request (not a protocol error: those are re-raised as the party raised them)."""


class WorkerDiedError(ProcessEngineError):
    """A worker process ended (killed, out of memory, crashed) while the coordinator needed it."""


class WorkerTimeoutError(ProcessEngineError):
    """A worker did not answer a call within the engine's ``call_timeout`` (or start within
    ``start_timeout``)."""


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; ``os.cpu_count()`` where unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


class _Sender:
    """Writes one worker's requests from a thread of its own, so that the coordinator never blocks on a
    pipe: a request larger than the pipe's buffer to a worker that stopped reading (stopped, wedged)
    would otherwise hang the coordinator past every deadline. A failed write ends the thread; the
    worker's death is then seen through its process sentinel."""

    def __init__(self, conn: Connection, name: str) -> None:
        self._conn = conn
        self._queue: queue.SimpleQueue[list | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (data := self._queue.get()) is not None:
            try:
                send_parts(self._conn, data)
            except (OSError, ValueError):  # the worker is gone, or our end was closed
                return

    def put(self, data: list) -> None:
        """Queue one message, given as the buffers it is the concatenation of (:func:`encode_parts`)."""
        if not self._thread.is_alive():
            raise BrokenPipeError("the worker's pipe is closed")
        self._queue.put(data)

    def close(self) -> None:
        self._queue.put(None)


@dataclass(eq=False)
class _Worker:
    """One worker process, the coordinator's end of its pipe, its sender and the call in flight."""

    index: int
    process: BaseProcess
    conn: Connection
    sender: _Sender
    op: str | None = None
    deadline: float = float("inf")

    def describe(self) -> str:
        return f"process worker {self.index} (pid {self.process.pid})"

    def ended(self) -> str:
        """How the process ended, for an error message."""
        self.process.join(timeout=1.0)
        code = self.process.exitcode
        if code is None:
            return "closed its pipe"
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"was killed by {signal.Signals(-code).name}"
            return f"was killed by signal {-code}"
        return f"exited with status {code}"


# ---------------------------------------------------------------------------------------- engine
class ProcessEngine:
    """A pool of worker processes hosting parties (see the module docstring).

    Args:
        workers: worker processes; None = ``min(usable cores, parties of the first run)``.
        threads: torch intra-op threads per worker (default 1, like ``fedgat train --threads``; None:
            torch's default, every core in every worker).
        start_method: ``"spawn"`` (default) or ``"forkserver"``.
        call_timeout: seconds one call may take before :class:`WorkerTimeoutError` (a delivery batch
            decrypts up to ``batch_bytes`` of results, a step encrypts a batch of rows).
        start_timeout: seconds for the workers to start and answer their first ping, and for a
            party's placement (which imports its modules: torch takes seconds).
        forbid_pickle: make every pickle entry point of the workers raise once they are up (a check
            the tests use; the hosted path never pickles).

    Raises:
        ValueError: ``workers`` below 1 or an unknown start method.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        threads: int | None = 1,
        start_method: str = "spawn",
        call_timeout: float = 600.0,
        start_timeout: float = 120.0,
        forbid_pickle: bool = False,
    ) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS}, got {start_method!r}")
        self.requested_workers = workers
        self.threads = threads
        self.start_method = start_method
        self.call_timeout = call_timeout
        self.start_timeout = start_timeout
        self.forbid_pickle = forbid_pickle
        self.cores = usable_cores()
        self.workers: list[_Worker] = []
        #: wall seconds of the last pool start: spawn to every worker's first answer
        self.start_seconds = 0.0
        #: pool starts so far (a failed run that leaves a worker out of step costs a new pool)
        self.pool_starts = 0
        self._closed = False

    @property
    def actors(self) -> list[_Worker]:
        """The workers (the name the Ray engine's callers use)."""
        return self.workers

    def transport(self, **options: Any) -> ProcessTransport:
        """A :class:`ProcessTransport` over this engine's workers (options: see there)."""
        return ProcessTransport(self, **options)

    # --- pool -------------------------------------------------------------------------------------
    def ensure_workers(self, parties: int) -> list[_Worker]:
        """The pool, started on first use (``workers``, or one per usable core up to ``parties``).

        Raises:
            ProcessEngineError: the engine was shut down; WorkerDiedError / WorkerTimeoutError: a
                worker did not start.
        """
        if self._closed:
            raise ProcessEngineError("the engine has been shut down")
        if self.workers:
            return self.workers
        n = self.requested_workers or max(1, min(self.cores, parties))
        ctx: Any = multiprocessing.get_context(self.start_method)
        settings = json.dumps({"threads": self.threads, "forbid_pickle": self.forbid_pickle})
        from fedgat.process_worker import serve

        clock = time.perf_counter()
        try:
            for i in range(n):
                mine, theirs = ctx.Pipe(duplex=True)
                process = ctx.Process(
                    target=serve, args=(theirs, settings), name=f"fedgat-party-host-{i}", daemon=True
                )
                process.start()
                theirs.close()
                self.workers.append(_Worker(i, process, mine, _Sender(mine, f"fedgat-party-host-{i}-send")))
            for w in self.workers:
                self.call(w.index, "ping", timeout=self.start_timeout)
            for w in self.workers:
                self.result(w.index)
        except WorkerDiedError as exc:
            self.discard()
            if self.pool_starts == 0 and _main_is_reimported():  # a later start: the guard is there
                exc.add_note(MAIN_GUARD_HINT)
            raise
        except BaseException:
            self.discard()
            raise
        self.start_seconds = time.perf_counter() - clock
        self.pool_starts += 1
        return self.workers

    def discard(self) -> None:
        """Stop every worker at once (after a failure that left the pool out of step)."""
        workers, self.workers = self.workers, []
        for w in workers:
            if w.process.is_alive():
                w.process.kill()
            w.sender.close()
        for w in workers:
            w.process.join(timeout=5.0)
            with contextlib.suppress(Exception):
                w.conn.close()

    # --- calls ------------------------------------------------------------------------------------
    def call(self, index: int, op: str, *args: Any, timeout: float | None = None) -> int:
        """Send ``op(*args)`` to worker ``index`` (which has no call in flight); returns ``index``, the
        handle :meth:`result` takes.

        Raises:
            WorkerDiedError: the worker is gone; TypeError: an argument that cannot cross.
        """
        w = self.workers[index]
        if w.op is not None:
            raise ProcessEngineError(f"{w.describe()} is still answering {w.op!r}")
        data = encode_parts({"op": op, "args": list(args)})
        if not w.process.is_alive():
            raise WorkerDiedError(f"{w.describe()} {w.ended()} before it got {op!r}")
        try:
            w.sender.put(data)
        except OSError as exc:
            raise WorkerDiedError(f"{w.describe()} {w.ended()} before it got {op!r}") from exc
        w.op = op
        w.deadline = time.monotonic() + (self.call_timeout if timeout is None else timeout)
        return index

    def ready(self, indices: list[int], timeout: float | None = 0.0) -> list[int]:
        """The workers among ``indices`` whose answer (or end) can be read, waiting at most ``timeout``
        seconds (None: until one can, or until the earliest deadline passes).

        Raises:
            WorkerTimeoutError: a worker's call is past its deadline.
        """
        workers = [self.workers[i] for i in indices]
        if timeout is None:
            due = min(w.deadline for w in workers)
            timeout = None if due == float("inf") else max(0.0, due - time.monotonic())
        handles: dict[Any, int] = {}
        for w in workers:
            handles[w.conn] = w.index
            handles[w.process.sentinel] = w.index
        got = mpc.wait(list(handles), timeout=timeout)
        out = sorted({handles[h] for h in got})
        if not out:
            now = time.monotonic()
            late = [w for w in workers if w.deadline <= now]
            if late:
                w = late[0]
                limit = self.start_timeout if w.op in ("ping", "place") else self.call_timeout
                raise WorkerTimeoutError(f"{w.describe()} has not answered {w.op!r} within {limit:g} s")
        return out

    def wait_any(self, indices: list[int], timeout: float | None = None) -> None:
        """Wait until at least one of ``indices`` can be read (see :meth:`ready`), or ``timeout``
        seconds (None: no limit but the calls' deadlines) have passed."""
        if timeout is None:
            while not self.ready(indices, timeout=None):
                pass
            return
        end = time.monotonic() + timeout
        while True:
            due = min(min(self.workers[i].deadline for i in indices), end)  # a call's deadline is checked
            if self.ready(indices, timeout=max(0.0, due - time.monotonic())) or time.monotonic() >= end:
                return

    def result(self, index: int) -> Any:
        """The answer of worker ``index``'s call (waits for it, within its deadline).

        Raises:
            WorkerDiedError: it ended before answering; WorkerTimeoutError: its deadline passed;
            ProcessEngineError: malformed bytes, or a request it could not serve (that error's type
                and message in the text).
        """
        w = self.workers[index]
        while not w.conn.poll():
            self.ready([index], timeout=None)
            if not w.conn.poll() and not w.process.is_alive():
                break
        op = w.op
        try:
            data = recv_message(w.conn)
        except (EOFError, OSError) as exc:
            raise WorkerDiedError(f"{w.describe()} {w.ended()} while answering {op!r}") from exc
        w.op, w.deadline = None, float("inf")
        try:
            answer = decode(data)
        except WireError as exc:
            raise ProcessEngineError(f"{w.describe()} answered {op!r} with malformed bytes: {exc}") from exc
        if not isinstance(answer, dict) or not answer.get("ok"):
            error = answer.get("error") if isinstance(answer, dict) else None
            if not isinstance(error, dict):
                raise ProcessEngineError(f"{w.describe()} answered {op!r} with no value and no error")
            refused = error_from_value(error, fallback=ProcessEngineError)
            refused.add_note(f"{w.describe()} could not serve {op!r}")
            raise refused
        return answer.get("value")

    def gather(self, op: str, *args: Any) -> list[Any]:
        """``op(*args)`` on every worker at once; their answers in worker order."""
        for w in self.workers:
            self.call(w.index, op, *args)
        return [self.result(w.index) for w in self.workers]

    def recover(self) -> None:
        """After a failed run: read the answers still in flight, then have every worker drop its
        parties; a worker that is dead, late or out of step costs the whole pool (:meth:`discard`),
        which the next run starts afresh."""
        try:
            for w in self.workers:
                if w.op is not None:
                    self.result(w.index)
            self.gather("reset")
        except (ProcessEngineError, OSError):
            self.discard()

    def memory(self) -> list[dict]:
        """Every worker's ``{"pid", "rss", "peak_rss", "parties", "cpu_seconds", "torch_loaded"}``
        (bytes, user + system seconds so far)."""
        return self.gather("memory") if self.workers else []

    def shutdown(self) -> None:
        """Stop the workers (asked to stop, then killed if they do not within 5 s). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for w in self.workers:
            if w.op is None:
                with contextlib.suppress(OSError):
                    w.sender.put(encode_parts({"op": "stop", "args": []}))
        deadline = time.monotonic() + 5.0
        for w in self.workers:
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
        self.discard()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


# ------------------------------------------------------------------------------------- transport
class ProcessTransport(HostedTransport):
    """Routes frames between the coordinator's parties and parties hosted in :class:`ProcessEngine`
    workers: :class:`~fedgat.protocols.hosting.HostedTransport` with pipe calls as its host calls.

    Used by the in-process :class:`~fedgat.protocols.driver.Driver` it behaves as an in-process FIFO
    (nothing is hosted); :meth:`run_parties` hosts parties (see the module docstring).

    Args:
        engine: the engine whose workers host the parties.
        transcript: record every frame that crosses a party boundary.
        keep_local: which parties stay in this process (default: the roster's server).
        max_pending_bytes: streamed steps pause while more frames than this wait for delivery.
        batch_bytes: most frame bytes sent to one worker per call (one frame at least).
        max_frame_bytes: the largest frame carried (:class:`~fedgat.protocols.hosting.HostedTransport`).
        clock: time source of the parties' deadlines (:class:`~fedgat.protocols.hosting.HostedTransport`).
        server_workers: processes of the pre-training server's pool when the caller gives none
            (``workers=None``); None keeps :func:`~fedgat.crypto.encoders.local_encoder`'s rule.
    """

    engine_error = ProcessEngineError
    host_noun = "a process worker"
    #: one party per ``place`` call: each call gets the start-up deadline (placing imports modules)
    place_batch_bytes = 0

    def __init__(
        self,
        engine: ProcessEngine,
        *,
        transcript: Transcript | None = None,
        keep_local: Callable[[Party], bool] | None = None,
        max_pending_bytes: int = 256 * MiB,
        batch_bytes: int = 32 * MiB,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        clock: Clock | None = None,
        server_workers: int | None = None,
    ) -> None:
        self.engine = engine
        self.server_workers = server_workers
        self._blocks: list[list[int]] = []
        super().__init__(
            transcript=transcript,
            keep_local=keep_local,
            max_pending_bytes=max_pending_bytes,
            batch_bytes=batch_bytes,
            max_frame_bytes=max_frame_bytes,
            clock=clock,
        )

    def encoder_factory(self, workers: int | None = None) -> EncoderFactory:
        """The pre-training server computes on its own process pool, as in process:
        :func:`~fedgat.crypto.encoders.local_encoder` with ``workers`` (None: ``server_workers``,
        else that function's rule)."""
        return local_encoder(self.server_workers if workers is None else workers)

    # --- host calls: pipe messages, answers read by worker index ---------------------------------
    def _open_hosts(self, parties: int) -> int:
        return len(self.engine.ensure_workers(parties))

    def _call(self, host: int, method: str, *args: Any) -> Any:
        # placing a party imports its modules (torch: seconds): it gets the start-up deadline
        timeout = self.engine.start_timeout if method == "place" else None
        try:
            return self.engine.call(host, method, *args, timeout=timeout)
        except ProcessEngineError as exc:
            self._note_parties(exc, host)
            raise

    def _note_parties(self, exc: BaseException, host: int) -> None:
        parties = sorted(pid for pid, h in self._placement.items() if h == host)
        if parties:
            exc.add_note(f"it hosted parties {parties}")

    def _ready(self, calls: list[Any]) -> list[Any]:
        return self.engine.ready(calls)

    def _wait(self, calls: list[Any], timeout: float | None = None) -> None:
        self.engine.wait_any(calls, timeout)

    def _result(self, call: Any) -> dict:
        try:
            return self.engine.result(call)
        except ProcessEngineError as exc:
            self._note_parties(exc, call)
            raise

    def _abandon(self, calls: list[Any], error: BaseException) -> None:
        if isinstance(error, Exception):
            self.engine.recover()
        else:  # KeyboardInterrupt, SystemExit: no waiting for answers still in flight
            self.engine.discard()
