r"""Parties hosted elsewhere, written once for every engine that hosts them: the host body
(:class:`PartyHost`) and the coordinator (:class:`HostedTransport`).

Two engines host parties away from the caller's process: Ray (:mod:`fedgat.protocols.ray_engine`,
hosts are actors) and the standard library's multiprocessing (:mod:`fedgat.protocols.process_engine`,
hosts are worker processes). What they share lives here, so that both route frames the same way:

* :class:`PartyHost` is the body of a host: it builds parties from the bytes of their
  :class:`~fedgat.protocols.party_values.PartySpec`, hands them frames, steps their streamed work round
  robin, and hands back their :class:`~fedgat.protocols.party_values.PartyReport` bytes. Errors leave
  it as values (:func:`failure`). Plain Python: Ray makes it an actor, a process worker calls it.
* :class:`HostedTransport` is the coordinator: it keeps some parties in this process (by default the
  roster's server), places every other one on a host in contiguous blocks of party ids, and routes
  every frame -- counted by the shared :class:`~fedgat.protocols.transport.TrafficLog` -- with per
  sender -> receiver FIFO order: frames to a host leave in one ordered batch per call and a host runs
  one call at a time; frames from a host are routed in the order it produced them. Streamed steps
  pause while more than ``max_pending_bytes`` of frames wait to be delivered, so memory stays bounded
  as with the in-process driver. When a run ends each hosted party's report is absorbed by the
  caller's party object (:meth:`~fedgat.protocols.party.Party.absorb`). An engine subclasses it and
  says only how a call reaches a host and how its answer comes back (:meth:`HostedTransport._call`
  and the methods after it).
* Time, as with the in-process driver (:mod:`~fedgat.protocols.driver`): the coordinator's
  :class:`~fedgat.protocols.driver.Clock` is the only one. Its parties are ticked before every event;
  every call to a host carries ``now``, with which the host ticks its parties first, and each answer
  says when the host next wants a tick (:meth:`PartyHost.due`); a host whose deadline is due gets a
  call of its own, the coordinator never waits past the earliest deadline, and when nothing is in
  flight it sleeps until then. On a real-time clock a host ticks each party before each frame and
  step at the call's time plus the time the call has taken, so a batch's work is not counted as
  waiting. So a party that stalls meets the same typed fault
  (:class:`~fedgat.protocols.errors.FaultError`) on every engine, raised out of
  :meth:`HostedTransport.run_parties` as out of the in-process driver, and ``strict=False`` records
  the late frames that parties refuse after a deadline (:attr:`HostedTransport.rejected`) instead
  of raising the first. Without timeouts (the default) no deadline is armed and nothing changes.

The observer of :func:`~fedgat.protocols.driver.run_parties` gets a ``"deliver"`` event for every
frame (after its recipient handled it; ``out`` is ``[]`` for hosted parties, whose replies are
routed as their own events) and ``"start"``/``"step"`` events of the coordinator's parties only.

Nothing here pickles a party, a result or an exception: parties travel as spec and report bytes,
frames as ``bytes``, errors as values (:func:`~fedgat.protocols.party_values.error_to_value`).
"""

from __future__ import annotations

import importlib
import os
import resource
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, NoReturn

from .driver import Clock, MonotonicClock, Observer, detached
from .errors import ProtocolError
from .frame import HEADER, SIGNATURE_SIZE
from .messages import MESSAGE_TYPES
from .party import Party
from .party_values import PartyReport, PartySpec, error_from_value, error_to_value
from .transport import Delivery, TrafficLog, Transcript, Transport

__all__ = [
    "MAX_FRAME_BYTES",
    "EngineError",
    "Frame",
    "FrameSizeError",
    "HostedTransport",
    "PartyHost",
    "failure",
    "raise_failure",
    "rss_bytes",
]

MiB = 1 << 20
Frame = tuple[int, int, bytes]  # (sender, recipient, data)

#: the largest frame any message type allows (header + its payload limit + signature): an engine
#: refuses to carry a larger one, which every recipient would refuse anyway
MAX_FRAME_BYTES = HEADER.size + max(cls.MAX_PAYLOAD for cls in MESSAGE_TYPES.values()) + SIGNATURE_SIZE


class EngineError(RuntimeError):
    """A hosting engine could not proceed: a host died, did not answer in time or answered something
    malformed (not a protocol error: those are re-raised as the party raised them)."""


class FrameSizeError(EngineError):
    """A frame larger than the engine carries (:data:`MAX_FRAME_BYTES` by default); refused before it
    is counted or queued."""


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 when unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def failure(party: int | None, exc: BaseException) -> dict:
    """An error raised in a host, as the value its reply carries."""
    return {"party": party, "exception": error_to_value(exc)}


def raise_failure(
    error: Mapping[str, Any], fallback: type[Exception] = EngineError, where: str = "a host"
) -> NoReturn:
    """Raise (in the coordinator) the error a :func:`failure` value describes: a protocol error as the
    party raised it, anything that is not rebuilt as itself as ``fallback``; ``where`` names the host
    in the error's notes."""
    exc = error_from_value(error["exception"], fallback=fallback)
    remote = error["exception"].get("traceback")
    exc.add_note(f"raised in {where} by party {error['party']}")
    if remote:
        exc.add_note(f"host traceback:\n{str(remote).rstrip()}")
    raise exc


# ------------------------------------------------------------------------------------------ host
class PartyHost:
    """Host body: hosts many parties and runs their state machines on the frames it is given.

    Made a Ray actor by :class:`~fedgat.protocols.ray_engine.RayEngine` (as its subclass
    :class:`~fedgat.protocols.ray_host.RayPartyHost`, whose reports leave as arrays),
    served by a process worker (:mod:`fedgat.process_worker`); a plain object otherwise, which is how
    its logic is tested without either.

    Args:
        threads: torch threads of this process (None: leave torch alone and do not import it).
        preload: modules to import now rather than at the first placement.
    """

    def __init__(self, threads: int | None = 1, preload: tuple[str, ...] = ()) -> None:
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        for module in preload:  # pay the imports (torch_geometric: seconds) before the first run
            importlib.import_module(module)
        self.parties: dict[int, Party] = {}
        self._turn = 0

    def ping(self) -> int:
        return os.getpid()

    def place(self, specs: Mapping[int, bytes]) -> dict:
        """Host the parties whose :meth:`PartySpec.to_bytes` are given (party id -> bytes, or any buffer
        over them: Ray's out-of-band ``uint8`` arrays). Returns
        ``{"parties": every hosted party id, "error": None or a failure}`` (see :meth:`deliver`)."""
        pid = None
        try:
            for pid, blob in specs.items():
                spec = PartySpec.from_bytes(blob)
                if spec.party_id != pid:
                    raise EngineError(f"the spec for party {pid} describes party {spec.party_id}")
                self.parties[pid] = spec.build()
        except Exception as exc:  # noqa: BLE001 - handed to the coordinator, which raises it
            return {"parties": sorted(self.parties), "error": failure(pid, exc)}
        return {"parties": sorted(self.parties), "error": None}

    def _emit(self, pid: int, messages: list) -> list[Frame]:
        party = self.parties[pid]
        return [(pid, msg.recipient, party.encode(msg)) for msg in messages]

    def start(self, pids: list[int], now: float | None = None) -> dict:
        """``{"frames": the opening frames of each of pids, in that order, "due": see :meth:`due`,
        "error": None or a failure}``; with ``now`` (the coordinator's clock) every hosted party is
        ticked first, as the in-process driver ticks before it starts its parties."""
        frames: list[list[Frame]] = []
        try:
            if now is not None:
                for pid in pids:
                    self.parties[pid].tick(now)
            for pid in pids:
                frames.append(self._emit(pid, self.parties[pid].start()))
        except Exception as exc:  # noqa: BLE001
            return {"frames": frames, "due": None, "error": failure(pids[len(frames)], exc)}
        return {"frames": frames, "due": self.due(now), "error": None}

    def has_work(self) -> bool:
        return any(p.has_work() for p in self.parties.values())

    def due(self, now: float | None) -> float | None:
        """When this host next wants a tick, on the coordinator's clock: its parties' earliest armed
        deadline, or ``now`` when one waits to be armed at the next tick
        (:meth:`~fedgat.protocols.party.Party.tick_pending`); None: never (no deadline, the
        default)."""
        if now is not None and any(p.tick_pending() for p in self.parties.values()):
            return now
        return min((d for p in self.parties.values() if (d := p.next_deadline()) is not None), default=None)

    def deliver(
        self,
        frames: Sequence[Sequence[Any]],
        step: bool,
        now: float | None = None,
        realtime: bool = False,
        strict: bool = True,
    ) -> dict:
        """With ``now`` (the coordinator's clock when it made the call), first tick every hosted
        party: the messages of a deadline that passed come back as ``"ticked"`` frames. Then hand
        each ``(sender, recipient, data)`` frame to its recipient, in order; then, with ``step``, one
        step of the next party with streamed work; each after a tick of that party, as the
        in-process driver ticks before every event (with ``realtime``, at ``now`` plus the time this
        call has taken so far: a batch's work is not counted as waiting). Returns ``{"ticked":
        frames, "replies": [frames per delivered frame], "step": frames of the step, "work": any
        work left, "due": see :meth:`due`, "progress": party id ->
        :meth:`~fedgat.protocols.party.Party.progress` of each party that received or stepped,
        where it counts any, "rejected": [[party id, error_to_value(exc)] of each frame a party
        refused, when not ``strict``], "error": None or a failure}``, a failure being ``{"party": the
        party that raised, "exception": error_to_value(exc)}``; after an error the remaining frames
        are not delivered. With ``strict`` (the default) a refused frame is that error; without, it
        is recorded and the next frame delivered, as the in-process driver's ``strict=False``."""
        began = time.monotonic()

        def at() -> float | None:
            """The coordinator's time now, as far as this host can tell."""
            return now + (time.monotonic() - began) if now is not None and realtime else now

        def tick(pid: int) -> list[Frame]:
            t = at()
            return [] if t is None else self._emit(pid, self.parties[pid].tick(t))

        ticked: list[Frame] = []
        replies: list[list[Frame]] = []
        rejected: list[list[Any]] = []
        current: int | None = None
        try:
            for current in sorted(self.parties):
                ticked += tick(current)
            for _sender, recipient, data in frames:
                current = recipient
                if type(data) is not bytes:
                    raise TypeError("frames cross as bytes only")
                party = self.parties.get(recipient)
                if party is None:
                    raise KeyError(f"frame for party {recipient}, which this host does not host")
                out = tick(recipient)  # before the frame, in the frame's replies: per-peer order kept
                try:
                    out += self._emit(recipient, party.receive(data))
                except ProtocolError as exc:
                    if strict:
                        raise
                    rejected.append([recipient, {**error_to_value(exc), "traceback": ""}])
                replies.append(out)
            stepped: list[Frame] = []
            if step:
                pids = sorted(self.parties)
                for k in range(len(pids)):
                    current = pids[(self._turn + k) % len(pids)]
                    if self.parties[current].has_work():
                        self._turn = (self._turn + k + 1) % len(pids)
                        stepped = tick(current)
                        stepped += self._emit(current, self.parties[current].step())
                        break
        except Exception as exc:  # noqa: BLE001 - handed to the coordinator, which raises it
            return {
                "ticked": ticked,
                "replies": replies,
                "step": [],
                "work": False,
                "due": None,
                "rejected": rejected,
                "error": failure(current, exc),
            }
        touched = {int(f[1]) for f in frames} | ({current} if stepped and current is not None else set())
        progress = {pid: c for pid in sorted(touched) if (c := self.parties[pid].progress())}
        return {
            "ticked": ticked,
            "replies": replies,
            "step": stepped,
            "work": self.has_work(),
            "due": self.due(at()),
            "progress": progress,
            "rejected": rejected,
            "error": None,
        }

    def report(self, pids: list[int], drop: bool = True) -> dict:
        """``{"reports": party id -> its PartyReport.to_bytes(), "error": None or a failure}``; the
        reported parties are dropped with ``drop``."""
        out: dict[int, bytes] = {}
        try:
            for pid in pids:
                out[pid] = self.parties[pid].report().to_bytes()
        except Exception as exc:  # noqa: BLE001
            return {"reports": out, "error": failure(pids[len(out)], exc)}
        if drop:
            for pid in pids:
                del self.parties[pid]
        return {"reports": out, "error": None}

    def reset(self) -> None:
        """Drop every hosted party (after a failed run)."""
        self.parties.clear()
        self._turn = 0

    def memory(self) -> dict:
        """``{"pid", "rss", "peak_rss", "parties", "cpu_seconds"}`` of this host's process (bytes;
        CPU: user + system seconds of the process so far, with its children that have ended: the
        hosted clients' encryption pools)."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return {
            "pid": os.getpid(),
            "rss": rss_bytes(),
            "peak_rss": usage.ru_maxrss * 1024,
            "parties": len(self.parties),
            "cpu_seconds": usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime,
        }


# ----------------------------------------------------------------------------------- coordinator
class HostedTransport(TrafficLog, Transport):
    """Routes frames between the coordinator's parties and parties hosted on an engine's hosts (see the
    module docstring).

    Used by the in-process :class:`~fedgat.protocols.driver.Driver` it behaves as an in-process FIFO
    (nothing is hosted); :meth:`run_parties` hosts parties. A subclass implements :meth:`_open_hosts`,
    :meth:`_call`, :meth:`_ready`, :meth:`_wait`, :meth:`_result` (and may override
    :meth:`_results`, :meth:`_reports` and :meth:`_abandon`).

    Args:
        transcript: record every frame that crosses a party boundary.
        keep_local: which parties stay in this process (default: the roster's server).
        max_pending_bytes: streamed steps pause while more frames than this wait for delivery.
        batch_bytes: most frame bytes sent to one host per call (one frame at least).
        max_frame_bytes: the largest frame carried (default :data:`MAX_FRAME_BYTES`); a larger one
            raises :class:`FrameSizeError` before it is counted or queued.
        clock: time source of the parties' deadlines (default
            :class:`~fedgat.protocols.driver.MonotonicClock`), as the in-process driver's: local
            parties are ticked before every event, hosted ones with each call and, when one of their
            deadlines is due, by a call of its own; the hosts never read a clock of their own.
    """

    #: what an error from a host that is not rebuilt as itself is raised as
    engine_error: ClassVar[type[EngineError]] = EngineError
    #: how errors' notes name a host
    host_noun: ClassVar[str] = "a host"
    #: spec bytes at which a ``place`` call closes (None: :attr:`batch_bytes`; 0: one party a call)
    place_batch_bytes: ClassVar[int | None] = None

    def __init__(
        self,
        *,
        transcript: Transcript | None = None,
        keep_local: Callable[[Party], bool] | None = None,
        max_pending_bytes: int = 256 * MiB,
        batch_bytes: int = 32 * MiB,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        clock: Clock | None = None,
    ) -> None:
        self.transcript = transcript
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.keep_local = keep_local or (lambda party: party.party_id == party.roster.server)
        self.max_pending_bytes = max_pending_bytes
        self.batch_bytes = batch_bytes
        self.max_frame_bytes = max_frame_bytes
        #: (sender, recipient, type name) -> [messages, bytes], as InProcessTransport.traffic
        self.traffic: dict[tuple[int, int, str], list[int]] = {}
        #: (recipient, error) of every frame a party refused in the last run with ``strict=False``
        self.rejected: list[tuple[int, ProtocolError]] = []
        #: seconds of the last run spent placing parties (specs) and absorbing their reports
        self.placement_seconds = 0.0
        self.export_seconds = 0.0
        self._reset({}, 0)

    # --- what an engine implements ----------------------------------------------------------------
    def _open_hosts(self, parties: int) -> int:
        """Make sure the hosts exist (``parties``: how many parties the run hosts); their number."""
        raise NotImplementedError

    def _call(self, host: int, method: str, *args: Any) -> Any:
        """Start ``method(*args)`` of :class:`PartyHost` on ``host``; a handle on its answer. The
        coordinator has at most one call per host in flight."""
        raise NotImplementedError

    def _ready(self, calls: list[Any]) -> list[Any]:
        """The calls among ``calls`` whose answer can be read now (does not wait)."""
        raise NotImplementedError

    def _wait(self, calls: list[Any], timeout: float | None = None) -> None:
        """Wait until at least one of ``calls`` can be read, or ``timeout`` seconds (None: no limit
        but the engine's own) have passed."""
        raise NotImplementedError

    def _result(self, call: Any) -> dict:
        """The answer of ``call`` (waits for it); an :attr:`engine_error` when its host is gone."""
        raise NotImplementedError

    def _results(self, calls: list[Any]) -> list[dict]:
        """The answers of ``calls``, in order."""
        return [self._result(call) for call in calls]

    def _one_in_flight(self, queues: list[deque[int]], send: Callable[[int], Any]) -> Iterator[dict]:
        """The answers of the calls ``send(h)`` makes (each takes parties from ``queues[h]``), one call
        in flight per host until every queue is empty, checked, as they come."""
        inflight = {send(h): h for h, queue in enumerate(queues) if queue}
        while inflight:
            self._wait(list(inflight))
            for call in self._ready(list(inflight)):
                h = inflight.pop(call)
                answer = self._check([self._result(call)])[0]
                if queues[h]:
                    inflight[send(h)] = h
                yield answer

    def _place(self, blocks: list[list[int]], spec: Callable[[int], bytes]) -> None:
        """Build every hosted party on its host (``blocks[h]``: host h's parties) from its spec bytes,
        ``spec(pid)``, serialised only as it is sent: each host gets its parties in calls whose specs
        close once they reach :attr:`place_batch_bytes` (one spec at least), one call in flight per
        host, so the coordinator holds only the specs in flight (a training client's carries a copy of
        its encodings: 1.48 GB for all ten at 40k nodes) and a host builds its parties a call at a time."""
        queues = [deque(block) for block in blocks]
        limit = self.batch_bytes if self.place_batch_bytes is None else self.place_batch_bytes

        def send(h: int) -> Any:
            batch: dict[int, bytes] = {}
            size = 0
            while queues[h] and (not batch or size < limit):
                pid = queues[h].popleft()
                batch[pid] = spec(pid)
                size += len(batch[pid])
            return self._call(h, "place", batch)

        for _ in self._one_in_flight(queues, send):
            pass

    def _reports(self, blocks: list[list[int]]) -> Iterator[tuple[int, bytes]]:
        """``(party id, PartyReport bytes)`` of every hosted party (``blocks[h]``: host h's parties):
        one party's report per call, one call in flight per host (a pre-training client's report
        carries its decrypted encodings)."""
        queues = [deque(block) for block in blocks]
        for answer in self._one_in_flight(queues, lambda h: self._call(h, "report", [queues[h].popleft()])):
            yield from answer["reports"].items()

    def _abandon(self, calls: list[Any], error: BaseException) -> None:
        """After a run failed with ``error`` (``calls``: those still in flight): every host drops its
        parties."""

    # --- Transport interface (the coordinator's parties) -----------------------------------------
    def _reset(self, placement: dict[int, int], hosts: int) -> None:
        self._placement = placement  # hosted party id -> host index
        self._queue: deque[Delivery] = deque()
        self._outbox: list[list[Frame]] = [[] for _ in range(hosts)]
        self._pending = 0  # bytes queued or in flight

    def _send(self, sender: int, to: int, data: bytes) -> None:
        self._route(sender, to, data)

    def poll(self) -> Delivery | None:
        if not self._queue:
            return None
        delivery = self._queue.popleft()
        self._pending -= len(delivery.data)
        return delivery

    def _route(self, sender: int, to: int, data: bytes) -> None:
        """Count ``data`` and queue it for ``to`` (this process, or its host's outbox).

        Raises:
            TypeError: ``data`` is not bytes; FrameSizeError: it is above ``max_frame_bytes``. Either
                before anything is counted or queued.
        """
        if isinstance(data, (bytes, bytearray)) and len(data) > self.max_frame_bytes:
            raise FrameSizeError(
                f"a frame of {len(data)} bytes from party {sender} to party {to} is above the "
                f"{self.max_frame_bytes} bytes this engine carries"
            )
        data = self._log(sender, to, data)
        self._pending += len(data)
        host = self._placement.get(to)
        if host is None:
            self._queue.append(Delivery(sender, to, data))
        else:
            self._outbox[host].append((sender, to, data))

    # --- hosting ----------------------------------------------------------------------------------
    def _cannot_host(self, party: Party, exc: TypeError) -> TypeError:
        return TypeError(
            f"{type(self).__name__} places a party as a value (PartySpec) and cannot host party "
            f"{party.party_id} ({type(party).__name__}): {exc}; keep it local (keep_local=...)"
        )

    def _check_hostable(self, party: Party) -> None:
        """Refuse a party that cannot be described as a value, copying nothing
        (:meth:`~fedgat.protocols.party.Party.check_spec`)."""
        try:
            party.check_spec()
        except TypeError as exc:
            raise self._cannot_host(party, exc) from exc

    def _spec_bytes(self, party: Party) -> bytes:
        """What a hosted party is placed as: its :class:`~fedgat.protocols.party_values.PartySpec`'s
        bytes (copies of its values: :meth:`_place` asks for each as it sends it)."""
        try:
            return party.spec().to_bytes()
        except TypeError as exc:  # a value that is not plain
            raise self._cannot_host(party, exc) from exc

    def _check(self, replies: list[dict]) -> list[dict]:
        """``replies`` of the hosts, once none carries an error (the first one is raised)."""
        for reply in replies:
            if reply["error"] is not None:
                raise_failure(reply["error"], self.engine_error, self.host_noun)
        return replies

    def run_parties(
        self,
        parties: Mapping[int, Party],
        *,
        observer: Observer | None = None,
        start: bool = True,
        clock: Clock | None = None,
        strict: bool = True,
    ) -> int:
        """Run ``parties`` to the end, hosting all but ``keep_local`` ones on the engine's hosts;
        returns the number of events (deliveries and steps). Each hosted party of ``parties`` absorbs
        its twin's :class:`~fedgat.protocols.party_values.PartyReport` at the end. The end is the
        in-process driver's: no frame in flight, no party with work and no deadline armed (the
        parties' deadlines on ``clock``, default :attr:`clock`, hosted ones' included). ``strict``:
        raise a party's refusal of a frame (True), or record it in :attr:`rejected` and go on (a
        late answer after a deadline, as the in-process driver's ``strict=False``).

        Raises:
            Whatever a party raises for a rejected frame (the protocol's typed errors), with
                ``strict``;
            the first party's :class:`~fedgat.protocols.errors.FaultError` when one gave up after a
            timeout (hosted parties' once their reports are absorbed), as the in-process driver;
            TypeError: a party to host cannot be described as a value;
            EngineError (the engine's subclass): a host died, or raised an error that is not rebuilt
                as itself.
        """
        parties = dict(parties)
        local = {pid: p for pid, p in parties.items() if self.keep_local(p)}
        hosted = sorted(pid for pid in parties if pid not in local)
        t0 = time.perf_counter()
        time_of: Clock = clock if clock is not None else self.clock
        realtime = bool(getattr(time_of, "realtime", False))
        # a party that cannot be described is refused before any host is touched; each spec is built
        # and serialised only as it is placed (a training client's copies its task encodings)
        for pid in hosted:
            self._check_hostable(parties[pid])
        n = self._open_hosts(len(hosted)) if hosted else 0
        blocks = [hosted[h * len(hosted) // n : (h + 1) * len(hosted) // n] for h in range(n)]
        self._reset({pid: h for h, block in enumerate(blocks) for pid in block}, n)
        self.rejected = []
        links = {pid: self.connect(pid) for pid in local}
        events = 0
        inflight: dict[Any, tuple[int, list[Frame]]] = {}
        due: list[float | None] = [None] * n  # per host: when it wants a tick (PartyHost.due)
        try:
            self._place(blocks, lambda pid: self._spec_bytes(parties[pid]))
            self.placement_seconds = time.perf_counter() - t0
            work = [bool(block) for block in blocks]  # may have work: ask once

            def emit(pid: int, messages: list) -> None:
                for msg in messages:
                    links[pid].send(msg.recipient, local[pid].encode(msg))

            def tick() -> float:
                now = time_of.now()
                for pid, party in local.items():
                    emit(pid, party.tick(now))
                return now

            def wake() -> float | None:
                """The earliest deadline of a local party or of a host without a call in flight."""
                dues = [d for p in local.values() if (d := p.next_deadline()) is not None]
                dues += [d for h, d in enumerate(due) if d is not None and h not in busy]
                return min(dues, default=None)

            if start:
                now = tick()
                calls = [self._call(h, "start", block, now) for h, block in enumerate(blocks) if block]
                for pid, party in local.items():
                    out = party.start()
                    emit(pid, out)
                    if observer is not None:
                        observer("start", pid, None, out)
                for h, started in zip(
                    (h for h, block in enumerate(blocks) if block), self._check(self._results(calls))
                ):
                    due[h] = started.get("due")
                    for per_party in started["frames"]:
                        for frame in per_party:
                            self._route(*frame)

            def collect(call: Any) -> None:
                h, sent = inflight.pop(call)
                result = self._result(call)
                self._pending -= sum(len(f[2]) for f in sent)
                for frame in result.get("ticked", []):
                    self._route(*frame)
                for pid, value in result.get("rejected", []):
                    error = error_from_value(value, self.engine_error)
                    if not isinstance(error, ProtocolError):  # pragma: no cover - hosts send refusals only
                        raise error
                    self.rejected.append((int(pid), error))
                if result["error"] is None:  # the twins' counters first, so the observer sees them
                    for pid, counters in result.get("progress", {}).items():
                        parties[int(pid)].take_progress(counters)
                for frame, replies in zip(sent, result["replies"]):
                    for reply in replies:
                        self._route(*reply)
                    if observer is not None:
                        observer("deliver", frame[1], Delivery(*frame), [])
                self._check([result])
                for frame in result["step"]:
                    self._route(*frame)
                work[h] = result["work"]
                due[h] = result.get("due")

            busy: set[int] = set()
            while True:
                for call in self._ready(list(inflight)) if inflight else []:
                    busy.discard(inflight[call][0])
                    collect(call)
                    events += 1
                now = tick()
                room = self._pending < self.max_pending_bytes
                for h in range(n):
                    tick_due = due[h] is not None and due[h] <= now  # type: ignore[operator]
                    if h in busy or not (self._outbox[h] or (work[h] and room) or tick_due):
                        continue
                    batch: list[Frame] = []
                    size = 0
                    box = self._outbox[h]
                    while box and (not batch or size + len(box[0][2]) <= self.batch_bytes):
                        frame = box.pop(0)
                        batch.append(frame)
                        size += len(frame[2])
                    inflight[self._call(h, "deliver", batch, room, now, realtime, strict)] = (h, batch)
                    busy.add(h)
                delivery = self.poll()
                if delivery is not None:
                    if delivery.recipient not in local:
                        raise KeyError(f"frame for unknown party {delivery.recipient}")
                    try:
                        out = local[delivery.recipient].receive(delivery.data)
                    except ProtocolError as exc:
                        if strict:
                            raise
                        self.rejected.append((delivery.recipient, detached(exc)))
                        out = []
                    emit(delivery.recipient, out)
                    events += 1
                    if observer is not None:
                        observer("deliver", delivery.recipient, delivery, out)
                    continue
                if self._pending < self.max_pending_bytes:
                    busy_pid = next((pid for pid, p in local.items() if p.has_work()), None)
                    if busy_pid is not None:
                        out = local[busy_pid].step()
                        emit(busy_pid, out)
                        events += 1
                        if observer is not None:
                            observer("step", busy_pid, None, out)
                        continue
                if inflight:
                    until = wake()
                    self._wait(list(inflight), None if until is None else max(0.0, until - time_of.now()))
                    continue
                if any(self._outbox) or any(work):
                    continue
                until = wake()
                if until is None:
                    break
                time_of.sleep(until - time_of.now())  # idle until a deadline (a ManualClock jumps)
            t0 = time.perf_counter()
            for pid, blob in self._reports(blocks):
                parties[pid].absorb(PartyReport.from_bytes(blob))
            self.export_seconds = time.perf_counter() - t0
        except BaseException as exc:
            self._abandon(list(inflight), exc)
            raise
        finally:
            self._reset({}, 0)
        for party in parties.values():
            party.raise_for_failure()
        return events
