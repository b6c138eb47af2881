"""The loop that connects sans-IO parties through a :class:`~fedgat.protocols.transport.Transport`.

Scheduling: deliver every queued frame first; only when nothing is in flight ask a party with
streamed work (:meth:`~fedgat.protocols.party.Party.has_work`) for its next step. Each step produces
at most a batch of messages, which are delivered -- and consumed, e.g. decrypted -- before the next
step, so memory stays bounded by a batch rather than by the dataset.

Time: before every event the driver gives each party the current time of its :class:`Clock`
(:meth:`~fedgat.protocols.party.Party.tick`); when nothing is in flight and no party has work but a
deadline is armed, it sleeps until that deadline (a :class:`ManualClock` jumps there at once, which
is how the tests simulate stalls). The state machines themselves never read a clock.

Faults: with ``strict=False`` a frame a party rejects (a late answer of a dropped client, a replay
after a restart) is recorded in :attr:`Driver.rejected` and the run goes on; with ``strict=True``
(the default) the typed error propagates. Frames addressed to a party taken out with
:meth:`Driver.crash` are dropped (:attr:`Driver.dropped`), as a network would lose them.

Checkpoints: with a :class:`fedgat.checkpoint.CheckpointStore`, whenever a party reaches a new
checkpoint label (:attr:`~fedgat.protocols.party.Party.checkpoint_label`) the driver writes its
checkpoint *before* sending the messages of that event (write-ahead), so a restored party never
lacks state that its peers have already seen the effects of.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from .errors import ProtocolError
from .party import Party
from .transport import Delivery, Transport

__all__ = ["Clock", "Driver", "ManualClock", "MonotonicClock", "Observer", "run_parties"]


class Clock(Protocol):
    """Where the driver reads the time and how it waits. A clock may say ``realtime = True`` (its time
    runs with the wall clock's): a party hosted elsewhere then adds the time its host has spent in a
    call to the time the call carried (:mod:`~fedgat.protocols.hosting`); otherwise the time stands
    still between the driver's readings, as a :class:`ManualClock`'s."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """Real time: :func:`time.monotonic` and :func:`time.sleep`."""

    realtime = True

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """Simulated time for tests: ``sleep`` jumps ahead at once; :meth:`advance` moves it by hand."""

    realtime = False

    def __init__(self, start: float = 0.0) -> None:
        self.t = float(start)

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(0.0, float(seconds))

    def advance(self, seconds: float) -> None:
        self.sleep(seconds)


#: ``observer(event, party_id, delivery, outgoing)``: event is "start", "deliver" or "step"
Observer = Callable[[str, int, Delivery | None, list], None]


def detached(exc: ProtocolError) -> ProtocolError:
    """``exc`` without its traceback (nor its causes'): a recorded rejection must not keep the frames'
    locals, i.e. the refused message and its ciphertexts, alive (thousands of frames refused by an
    aborted party held gigabytes)."""
    seen: BaseException | None = exc
    while seen is not None:
        seen.__traceback__ = None
        seen = seen.__cause__ or seen.__context__
    return exc


class Driver:
    """Event-by-event driver (tests use :meth:`advance` to stop between events).

    Args:
        transport: carries the frames (the parties only ever see bytes).
        parties: party id -> state machine.
        observer: called after every event (progress bars, tracing).
        clock: time source for the parties' deadlines (default :class:`MonotonicClock`).
        strict: raise a party's rejection of a frame (True) or record it in :attr:`rejected`.
        checkpoints: a :class:`fedgat.checkpoint.CheckpointStore` to write checkpoints to.
    """

    def __init__(
        self,
        transport: Transport,
        parties: Mapping[int, Party],
        observer: Observer | None = None,
        *,
        clock: Clock | None = None,
        strict: bool = True,
        checkpoints: Any = None,
    ) -> None:
        self.transport = transport
        self.parties = dict(parties)
        self.observer = observer
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.strict = strict
        self.checkpoints = checkpoints
        self.links = {pid: transport.connect(pid) for pid in self.parties}
        self.events = 0
        #: (recipient, error) of every frame a party rejected (``strict=False``)
        self.rejected: list[tuple[int, ProtocolError]] = []
        #: frames dropped because their recipient had crashed
        self.dropped = 0
        self._crashed: set[int] = set()
        self._saved: dict[int, int] = {}

    # --- faults and restarts -----------------------------------------------------------------------
    def crash(self, pid: int) -> Party:
        """Take party ``pid`` out (a crash): frames to it are dropped until :meth:`replace`."""
        self._crashed.add(pid)
        return self.parties.pop(pid)

    def replace(self, pid: int, party: Party, start: bool = True) -> None:
        """Put ``party`` (e.g. restored from a checkpoint) in as ``pid`` and, by default, start it."""
        self._crashed.discard(pid)
        self.parties[pid] = party
        self.links.setdefault(pid, self.transport.connect(pid))
        party.tick(self.clock.now())
        if start:
            self._handled(pid, party.start())

    def failures(self) -> list[ProtocolError]:
        """The faults the parties gave up on (:attr:`~fedgat.protocols.party.Party.failure`)."""
        return [p.failure for p in self.parties.values() if p.failure is not None]

    def _tick(self) -> None:
        now = self.clock.now()
        for pid, party in list(self.parties.items()):
            out = party.tick(now)
            if out:
                self._handled(pid, out)

    def _save(self, pid: int) -> None:
        party = self.parties[pid]
        label = party.checkpoint_label
        if self.checkpoints is None or label is None or self._saved.get(pid) == label:
            return
        self.checkpoints.save(pid, label, party.checkpoint())
        self._saved[pid] = label

    def _handled(self, pid: int, messages: list) -> None:
        """Write-ahead checkpoint of ``pid`` (when due), then send its messages."""
        self._save(pid)
        self.emit(pid, messages)

    def emit(self, pid: int, messages: list) -> None:
        """Frame and send ``messages`` of party ``pid``."""
        party = self.parties[pid]
        for msg in messages:
            self.links[pid].send(msg.recipient, party.encode(msg))

    def start(self) -> None:
        """Every party's opening messages, in the mapping's order (after a first tick)."""
        now = self.clock.now()
        for party in self.parties.values():
            party.tick(now)
        for pid, party in self.parties.items():
            out = party.start()
            self._handled(pid, out)
            if self.observer is not None:
                self.observer("start", pid, None, out)

    def advance(self) -> bool:
        """One event: deliver the next frame, else one step of the first party with work, else wait
        for the earliest deadline. Returns False when there is nothing left to do."""
        self._tick()
        delivery = self.transport.poll()
        out: list = []
        if delivery is not None:
            pid, event = delivery.recipient, "deliver"
            if pid in self._crashed:
                self.dropped += 1
            elif pid not in self.parties:
                raise KeyError(f"frame for unknown party {pid}")
            else:
                out = self._deliver(pid, delivery.data)
        else:
            busy = next((pid for pid, p in self.parties.items() if p.has_work()), None)
            if busy is not None:
                out = self.parties[busy].step()
                self._handled(busy, out)
                event, pid = "step", busy
            elif not self._wait():
                return False
            else:
                event, pid = "tick", -1
        self.events += 1
        if self.observer is not None:
            self.observer(event, pid, delivery, out)
        return True

    def _deliver(self, pid: int, data: bytes) -> list:
        try:
            out = self.parties[pid].receive(data)
        except ProtocolError as exc:
            if self.strict:
                raise
            self.rejected.append((pid, detached(exc)))
            return []
        self._handled(pid, out)
        return out

    def _wait(self) -> bool:
        """Sleep until the earliest armed deadline and tick; False when none is armed."""
        due = min((d for p in self.parties.values() if (d := p.next_deadline()) is not None), default=None)
        if due is None:
            return False
        self.clock.sleep(due - self.clock.now())
        self._tick()
        return True

    def run(self, until: Callable[[], bool] | None = None, max_events: int | None = None) -> int:
        """Advance until idle, until ``until()`` holds (checked before each event) or for
        ``max_events`` events; returns the number of events run."""
        count = 0
        while (max_events is None or count < max_events) and not (until is not None and until()):
            if not self.advance():
                break
            count += 1
        return count


def run_parties(
    transport: Transport,
    parties: Mapping[int, Party],
    *,
    start: bool = True,
    observer: Observer | None = None,
    max_events: int | None = None,
    clock: Clock | None = None,
    strict: bool = True,
    checkpoints: Any = None,
) -> int:
    """Start the parties (optional) and run until no frame is in flight, no party has work and no
    deadline is armed. Arguments as :class:`Driver`.

    Raises:
        Whatever a party raises for a rejected frame (:class:`~fedgat.protocols.errors.ProtocolError`)
        when ``strict``; the first party's :class:`~fedgat.protocols.errors.FaultError` when one gave
        up after a timeout; frames for unknown parties raise ``KeyError``.
    """
    driver = Driver(transport, parties, observer, clock=clock, strict=strict, checkpoints=checkpoints)
    if start:
        driver.start()
    events = driver.run(max_events=max_events)
    for failure in driver.failures():
        raise failure
    return events
