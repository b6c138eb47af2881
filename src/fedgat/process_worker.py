r"""A process engine's worker: hosts parties in a separate process and speaks bytes only.

:class:`fedgat.protocols.process_engine.ProcessEngine` starts these with the standard library's
multiprocessing ("spawn" or "forkserver", never "fork": torch and threads) and talks to each over a
pipe with :meth:`~multiprocessing.connection.Connection.send_bytes` /
:meth:`~multiprocessing.connection.Connection.recv_bytes` and the framing of this module
(:func:`encode` / :func:`decode`): a JSON header and raw byte blobs, no pickle. (The only pickle is
multiprocessing's own start-up of the process, which carries this module's :func:`serve`, its end of
the pipe and a JSON string of settings: no party data.)

A request is ``{"op": name, "args": [...]}``; ``op`` is one of :data:`OPS`: the methods of
:class:`~fedgat.protocols.hosting.PartyHost` (``place``, ``start``, ``deliver``, ``report``,
``reset``) plus ``ping``, ``memory`` and ``stop``. The answer is ``{"ok": True, "value": ...}`` or
``{"ok": False, "error": an error value}`` (:func:`fedgat.protocols.party_values.error_to_value`'s
shape) for a request that could not be served at all (malformed, unknown operation, wrong
arguments); a request refused that way changes nothing in the worker. Errors of the hosted parties
travel inside the value, as :class:`PartyHost` reports them.

Start-up is cheap on purpose: this module imports the standard library only, so a worker answers
its first ``ping`` without torch or TenSEAL. They are imported when the first party arrives and its
class needs them (:data:`fedgat.protocols.party_values.PARTY_KINDS` imports a party's module on first
use; the pre-training and training clients need torch). ``threads`` (torch's intra-op threads) is
applied once torch is there.
"""

from __future__ import annotations

import json
import numbers
import os
import resource
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from fedgat.protocols.hosting import PartyHost

__all__ = [
    "MAGIC",
    "OPS",
    "WireError",
    "WorkerLoop",
    "decode",
    "encode",
    "encode_parts",
    "error_value",
    "recv_message",
    "send_parts",
    "serve",
]

#: first bytes of every message between a coordinator and its workers (format version 1)
MAGIC = b"FGW1"
_HEAD = struct.Struct("<4sI")  # magic, length of the JSON header
#: the operations a worker serves
OPS = ("ping", "memory", "place", "start", "deliver", "report", "reset", "stop")
_HOST_OPS = frozenset({"place", "start", "deliver", "report", "reset"})


class WireError(ValueError):
    """Bytes that are not a well-formed message of this module's framing."""


# ----------------------------------------------------------------------------------------- codec
def encode_parts(value: Any) -> list[bytes | bytearray | memoryview]:
    """:func:`encode`'s message as the list of buffers whose concatenation it is (the blobs are not
    copied: :func:`send_parts` writes them as they are).

    Plain values only: None, bool, int, float, str, bytes, lists and tuples (as lists), dicts with
    string keys (not starting with ``$``) or with integer keys (``{"$i": [[key, value], ...]}``).

    Raises:
        TypeError: any other value.
    """
    blobs: list[bytes | bytearray | memoryview] = []

    def walk(v: Any) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, numbers.Integral):
            return int(v)
        if isinstance(v, numbers.Real):
            return float(v)
        if isinstance(v, (bytes, bytearray, memoryview)):
            blobs.append(v)
            return {"$b": len(blobs) - 1}
        if isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        if isinstance(v, Mapping):
            if all(isinstance(k, str) and not k.startswith("$") for k in v):
                return {k: walk(x) for k, x in v.items()}
            if all(isinstance(k, numbers.Integral) and not isinstance(k, bool) for k in v):
                return {"$i": [[int(k), walk(x)] for k, x in v.items()]}
            raise TypeError("a dict crosses with string keys (not starting with '$') or integer keys only")
        raise TypeError(f"{type(v).__name__} does not cross between processes")

    meta = walk(value)
    header = json.dumps({"v": meta, "n": [len(b) for b in blobs]}, separators=(",", ":")).encode()
    return [_HEAD.pack(MAGIC, len(header)), header, *blobs]


def encode(value: Any) -> bytes:
    """``value`` as one message: ``MAGIC``, the header's length, a JSON header, then every ``bytes``
    value's raw bytes (referenced from the JSON as ``{"$b": index}``).

    Plain values only: None, bool, int, float, str, bytes, lists and tuples (as lists), dicts with
    string keys (not starting with ``$``) or with integer keys (``{"$i": [[key, value], ...]}``).

    Raises:
        TypeError: any other value.
    """
    return b"".join(encode_parts(value))


#: ``Connection.send_bytes``'s length prefix (a signed big-endian 32-bit length, or -1 then 64 bits)
_LEN32, _LEN64 = struct.Struct("!i"), struct.Struct("!Q")
_IOV_MAX = 1024
#: POSIX pipes (file descriptors with writev/readv); elsewhere (Windows' named pipes) the Connection's own
#: send_bytes/recv_bytes, which write and read the same messages with a joined copy
_VECTORED_IO = hasattr(os, "writev") and hasattr(os, "readv") and sys.platform != "win32"


def send_parts(conn: Connection, parts: list[bytes | bytearray | memoryview]) -> None:
    """Write the concatenation of ``parts`` as one message of ``conn`` (what
    ``conn.send_bytes(b"".join(parts))`` writes, and ``conn.recv_bytes()`` reads), from the parts
    themselves with ``writev``: no joined copy of a frame batch in this process.

    Raises:
        OSError: the pipe is broken.
    """
    if not _VECTORED_IO:
        conn.send_bytes(b"".join(parts))
        return
    n = sum(memoryview(p).nbytes for p in parts)
    head = _LEN32.pack(n) if n <= 0x7FFFFFFF else _LEN32.pack(-1) + _LEN64.pack(n)
    bufs = [memoryview(head), *(memoryview(p).cast("B") for p in parts)]
    fd, i = conn.fileno(), 0
    while i < len(bufs):
        sent = os.writev(fd, bufs[i : i + _IOV_MAX])
        while i < len(bufs) and sent >= len(bufs[i]):
            sent -= len(bufs[i])
            i += 1
        if sent:
            bufs[i] = bufs[i][sent:]


def _read_into(fd: int, view: memoryview) -> None:
    pos = 0
    while pos < len(view):
        got = os.readv(fd, [view[pos:]])
        if got == 0:
            raise EOFError("end of file in the middle of a message" if pos else "end of file")
        pos += got


def recv_message(conn: Connection) -> bytearray:
    """One message of ``conn`` (what ``conn.recv_bytes()`` returns), read straight into one buffer
    of its size: no intermediate chunks or ``BytesIO`` copies.

    Raises:
        EOFError: the other end closed the pipe; OSError: the pipe failed.
    """
    if not _VECTORED_IO:
        return bytearray(conn.recv_bytes())
    fd = conn.fileno()
    head = bytearray(4)
    _read_into(fd, memoryview(head))
    (n,) = _LEN32.unpack(head)
    if n == -1:
        head = bytearray(8)
        _read_into(fd, memoryview(head))
        (n,) = _LEN64.unpack(head)
    elif n < 0:
        raise OSError(f"bad message length {n}")
    buf = bytearray(n)
    _read_into(fd, memoryview(buf))
    return buf


def decode(data: bytes | bytearray | memoryview) -> Any:
    """Inverse of :func:`encode` (``bytes`` values come back as ``bytes``).

    Raises:
        WireError: bytes that are not such a message (wrong magic, lengths that do not add up, a
            header that is not JSON, a reference to a missing blob); nothing is half-decoded.
    """
    view = memoryview(data).cast("B")
    if len(view) < _HEAD.size:
        raise WireError(f"a message of {len(view)} bytes is shorter than its header")
    magic, size = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise WireError(f"not a worker message (magic {bytes(magic)!r})")
    end = _HEAD.size + size
    if end > len(view):
        raise WireError(f"the header claims {size} bytes; {len(view) - _HEAD.size} follow")
    try:
        head = json.loads(bytes(view[_HEAD.size : end]))
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"the header is not JSON: {exc}") from None
    lengths = head.get("n") if isinstance(head, dict) else None
    if (
        not isinstance(lengths, list)
        or "v" not in head
        or not all(type(n) is int and n >= 0 for n in lengths)
        or sum(lengths) != len(view) - end
    ):
        raise WireError("the header's blob lengths do not match the message")
    offsets = [end]
    for n in lengths:
        offsets.append(offsets[-1] + n)

    def walk(v: Any) -> Any:
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            if "$b" in v:
                i = v["$b"]
                if len(v) != 1 or type(i) is not int or not 0 <= i < len(lengths):
                    raise WireError(f"a reference to a missing blob: {v!r:.60}")
                return bytes(view[offsets[i] : offsets[i + 1]])
            if "$i" in v:
                pairs = v["$i"]
                if len(v) != 1 or not isinstance(pairs, list):
                    raise WireError("a malformed integer-keyed dict")
                out = {}
                for pair in pairs:
                    if not (isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int):
                        raise WireError("a malformed integer-keyed dict")
                    out[pair[0]] = walk(pair[1])
                return out
            return {k: walk(x) for k, x in v.items()}
        return v

    return walk(head["v"])


def error_value(exc: BaseException) -> dict[str, Any]:
    """``exc`` in :func:`fedgat.protocols.party_values.error_to_value`'s shape, without importing it
    (that would import torch before any party needs it)."""
    args = list(exc.args) if all(isinstance(a, (str, int, float)) for a in exc.args) else [str(exc)]
    return {
        "type": type(exc).__name__,
        "module": type(exc).__module__,
        "args": args,
        "fields": {},
        "notes": [str(n) for n in getattr(exc, "__notes__", ())],
        "traceback": "".join(traceback.format_exception(exc)) if exc.__traceback__ is not None else "",
    }


# ------------------------------------------------------------------------------------------ loop
def _status_bytes(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` in bytes (None where there is none)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _memory(parties: int) -> dict[str, Any]:
    """This process's memory and CPU. The peak is ``VmHWM`` (reset by exec), not ``ru_maxrss``: Linux
    keeps that across the spawn's fork + exec, so a worker would report its parent's size. CPU
    includes the children that have ended (the hosted clients' encryption pools)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss = _status_bytes("VmRSS")
    peak = _status_bytes("VmHWM")
    return {
        "pid": os.getpid(),
        "rss": rss or 0,
        "peak_rss": peak if peak is not None else usage.ru_maxrss * 1024,
        "parties": parties,
        "cpu_seconds": usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime,
        "torch_loaded": "torch" in sys.modules,
    }


class WorkerLoop:
    """What a worker does with one request (:meth:`handle`: bytes in, bytes out); plain Python, so it
    is tested without a process.

    Args:
        threads: torch intra-op threads, applied once a hosted party has imported torch (None: leave
            torch's default).
        started: ``time.perf_counter()`` when the process started (reported by ``ping``).
    """

    def __init__(self, threads: int | None = 1, started: float | None = None) -> None:
        self.threads = threads
        self.started = time.perf_counter() if started is None else started
        self.host: PartyHost | None = None
        self._threads_set = threads is None
        #: set by a ``stop`` request: the loop ends after answering
        self.stopped = False

    def _host(self) -> PartyHost:
        if self.host is None:
            from fedgat.protocols.hosting import PartyHost

            self.host = PartyHost(threads=None)
        return self.host

    def _apply_threads(self) -> None:
        if not self._threads_set and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(self.threads)
            self._threads_set = True

    def handle(self, data: bytes) -> bytes:
        """The answer to one request (see the module docstring); never raises for a bad request."""
        try:
            request = decode(data)
            if not isinstance(request, dict) or set(request) != {"op", "args"}:
                raise WireError("a request is {'op': name, 'args': [...]}")
            op, args = request["op"], request["args"]
            if op not in OPS or not isinstance(args, list):
                raise WireError(f"unknown operation {op!r:.40}; a worker serves {', '.join(OPS)}")
        except WireError as exc:
            return encode({"ok": False, "error": error_value(exc)})
        try:
            value = self._run(op, args)
        except Exception as exc:  # noqa: BLE001 - answered as a value; the coordinator raises it
            return encode({"ok": False, "error": error_value(exc)})
        try:
            return encode({"ok": True, "value": value})
        except TypeError as exc:  # a result that cannot cross: a bug, reported rather than hidden
            return encode({"ok": False, "error": error_value(exc)})

    def _run(self, op: str, args: list) -> Any:
        if op == "ping":
            return {"pid": os.getpid(), "seconds_since_start": time.perf_counter() - self.started}
        if op == "memory":
            return _memory(0 if self.host is None else len(self.host.parties))
        if op == "stop":
            self.stopped = True
            return None
        method: Callable[..., Any] = getattr(self._host(), op)
        value = method(*args)
        if op == "place":
            self._apply_threads()
        return value


def _forbid_pickle() -> None:
    """Make this process refuse every way a pickle could reach it or leave it over its pipe: unpickling
    of any kind (``pickle.load(s)``, multiprocessing's ``ForkingPickler``) and the pickling methods of
    its connection (``send``/``recv``). A check the tests use: after start-up a worker speaks bytes
    only. (``pickle.dumps`` itself stays: jinja2, which torch_geometric imports, calls it at import.)"""
    import multiprocessing.connection
    import multiprocessing.reduction
    import pickle

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("pickle used in a process-engine worker")

    for name in ("loads", "load"):
        setattr(pickle, name, refuse)
    for cls, names in (
        (multiprocessing.reduction.ForkingPickler, ("dumps", "loads")),
        (multiprocessing.connection.Connection, ("send", "recv")),
    ):
        for name in names:
            setattr(cls, name, refuse)


def serve(conn: Connection, settings: str) -> None:
    """A worker's main loop: answer requests from ``conn`` until ``stop`` or until the coordinator's
    end closes (EOF). ``settings``: JSON ``{"threads": int | null, "forbid_pickle": bool}``."""
    started = time.perf_counter()
    # Ctrl-C reaches the whole process group: the coordinator handles it and closes this worker's
    # pipe as it cleans up (EOF below), so the worker neither stops mid-answer nor prints a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    options = json.loads(settings)
    if options.get("forbid_pickle"):
        _forbid_pickle()
    from fedgat.allocator import keep_freed_memory

    keep_freed_memory()  # a worker trains its clients: as the command line's process (fedgat.allocator)
    loop = WorkerLoop(options.get("threads"), started)
    while not loop.stopped:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):  # the coordinator is gone: nothing left to serve
            return
        answer = loop.handle(data)
        del data
        try:
            conn.send_bytes(answer)
        except OSError:
            return
