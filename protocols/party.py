"""What every sans-IO party shares: message intake, outgoing framing, sequence numbers, timings.

A party never touches a socket. A driver (:func:`fedgat.protocols.driver.run_parties`) hands it the
bytes addressed to it (:meth:`Party.receive`), asks it for its opening messages (:meth:`Party.start`)
and, when nothing is in flight, for the next piece of streamed work (:meth:`Party.step`); the party
answers with :class:`~fedgat.protocols.messages.Message` objects that the driver frames with
:meth:`Party.encode` and sends.

Intake (:meth:`Party.receive`) is all-or-nothing: decode (structure), verify (sender, signature,
recipient, session, sequence number), look up the handler for the message type in the current
state (:class:`~fedgat.protocols.errors.StateError` if none), check the key fingerprint, then the
handler validates the payload *completely* before it changes anything. Only after the handler
returns is the sequence number recorded. So a rejected message leaves the party exactly as it was:
:meth:`Party.snapshot` is equal before and after (tested for every rejection in
``tests/protocols``). One kind of rejection is different: a *terminal* one
(:attr:`ProtocolError.terminal <fedgat.protocols.errors.ProtocolError>`), raised by a handler for
an authenticated message that proves its sender cheated (a result failing its tag check). The
party then consumes the frame, aborts (:meth:`Party._terminate`: state ``aborted``, deadlines
cleared, decrypted material dropped) and refuses every later message, so a cheating peer gets one
try instead of one probe per message; the error is still raised, for the engine to report.

Time is an input, never read inside a state machine: the driver calls :meth:`Party.tick` with the
current time (any monotonic clock, or a simulated one in tests). A party arms a deadline per phase
(:meth:`Party._arm`, relative to the last tick) and, when a tick finds it passed, decides in
:meth:`Party._expired` whether to go on without the parties that did not answer or to give up:
then :attr:`Party.failure` holds a typed :class:`~fedgat.protocols.errors.FaultError`, the party is
aborted and the returned messages tell its peers (:meth:`Party.raise_for_failure` raises it).

Limits: ``max_frame_bytes`` (set by a subclass or the caller) refuses an oversized frame from its
length alone, before it is decoded (:class:`~fedgat.protocols.errors.SizeLimitError`).

Restarts: :meth:`Party._checkpoint_base` / :meth:`Party._restore_base` carry the sequence number and
the verifier's view (last sequence number per sender, key fingerprint) through a checkpoint; a
restored party's sequence numbers skip ahead by :data:`SEQ_RESTART_GAP`, so messages it sent after
its checkpoint and before the crash can never make its new ones look like replays. Between two
messages a party can also be carried whole, mid-run, as a value (:meth:`Party.state_value`,
:mod:`~fedgat.protocols.party_state`): its sequence numbers are then restored exactly, because the
state is saved before its replies leave (an engine that restarts it per message, Flower).
"""

from __future__ import annotations

import enum
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from fedgat.crypto import SigningIdentity

from .errors import FaultError, ProtocolError, SizeLimitError, StateError
from .frame import signed_message
from .messages import (
    Abort,
    EdgeClaims,
    EncodingBases,
    EncodingResults,
    EncodingsDone,
    EvaluateRequest,
    EvaluationReport,
    FeatureUpload,
    GlobalModel,
    GraphAnnounce,
    KeyAnnounce,
    LocalUpdate,
    Message,
    NeighbourhoodStatement,
    PrivacyTerms,
    PublicContext,
    RosterReady,
    SealedCheckKeys,
    UploadDone,
    UploadGrant,
    decode_message,
    encode_message,
)
from .party_values import PartyReport, PartySpec, error_from_value, error_to_value
from .roster import Identity, Roster, Verifier

if TYPE_CHECKING:
    from .party_state import PartyState

__all__ = ["PHASES", "SEQ_RESTART_GAP", "Party"]

#: how far a restored party's sequence numbers jump past its checkpoint's
SEQ_RESTART_GAP = 1 << 32

#: Timing phase each message type's framing, decoding and checking is charged to.
PHASES: dict[type[Message], str] = {
    KeyAnnounce: "keygen",
    PublicContext: "keygen",
    SealedCheckKeys: "keygen",
    RosterReady: "keygen",
    EdgeClaims: "setup",
    NeighbourhoodStatement: "setup",
    GraphAnnounce: "setup",
    Abort: "setup",
    FeatureUpload: "upload",
    UploadDone: "upload",
    UploadGrant: "upload",
    PrivacyTerms: "setup",
    EncodingBases: "download",
    EncodingResults: "download",
    EncodingsDone: "download",
    GlobalModel: "training",
    LocalUpdate: "training",
    EvaluationReport: "training",
    EvaluateRequest: "training",
}
_KEY_INTRODUCING = (RosterReady,)  # binds what follows to the participants' key set
_PRE_KEY = (KeyAnnounce, PublicContext, EdgeClaims, GraphAnnounce, Abort, PrivacyTerms)

Handler = Callable[[Any], list[Message]]


class Party:
    """Base class of the protocol state machines (see the module docstring)."""

    #: the kind a class is described under as a value (:mod:`~fedgat.protocols.party_values`); a
    #: class describes itself only when it sets its own (subclasses do not inherit it)
    PARTY_KIND: ClassVar[str | None] = None

    def __init__(self, party_id: int, roster: Roster, session: int, signer: SigningIdentity) -> None:
        if roster.signing_key(party_id) != signer.public_bytes():
            raise ValueError(f"party {party_id}'s signing key is not the roster's")
        self.party_id = party_id
        self.roster = roster
        self.session = session
        self.verifier = Verifier(roster, party_id, session)
        self._signer = signer
        self._seq = 0
        self.state: Any = None
        self.abort_reason: str | None = None
        #: seconds spent per phase (keygen, encrypt, upload, server_compute, download, decrypt, ...)
        self.timings: dict[str, float] = defaultdict(float)
        #: CPU seconds of this process per phase (``time.process_time``; worker processes not included)
        self.cpu_timings: dict[str, float] = defaultdict(float)
        self._clock_stack: list[list[float]] = []
        #: the latest time given to :meth:`tick` (seconds on the driver's clock)
        self.now = 0.0
        self._deadlines: dict[str, float] = {}
        self._rearm: dict[str, float] = {}  # phase -> timeout, armed at the next tick (_arm_at_next_tick)
        #: the fault that made this party give up (None while it has not)
        self.failure: FaultError | None = None
        #: frames longer than this are refused before decoding (None: the message types' own limits)
        self.max_frame_bytes: int | None = None

    # --- driver interface ----------------------------------------------------------------------
    def start(self) -> list[Message]:
        """Opening messages (none by default)."""
        return []

    def receive(self, data: bytes | Message) -> list[Message]:
        """Take one frame addressed to this party; return the messages to send in reply.

        Raises a :class:`~fedgat.protocols.errors.ProtocolError` subclass and changes no state when
        the message is rejected. A :class:`Message` object is accepted too, but it must carry the
        signature it was received with (a locally built message is refused), and its fields must be
        exactly those of the bytes that signature covers (:func:`~fedgat.protocols.frame.signed_message`):
        the party then handles the message decoded from those bytes, never the object's own fields.

        A *terminal* refusal (see the module docstring) is the exception: the party aborts, then raises.
        """
        start, cpu = time.perf_counter(), time.process_time()
        self._clock_stack.append([0.0, 0.0])
        phase = "setup"
        stopped = self._ended()
        try:
            if (
                not isinstance(data, Message)
                and self.max_frame_bytes is not None
                and len(data) > self.max_frame_bytes
            ):
                raise SizeLimitError(
                    f"frame of {len(data)} bytes exceeds party {self.party_id}'s "
                    f"limit of {self.max_frame_bytes}"
                )
            if isinstance(data, Message):
                phase = PHASES.get(type(data), "setup")
                msg = signed_message(data)
            else:
                msg = decode_message(data)
            phase = PHASES.get(type(msg), "setup")
            self.verifier.check(msg, from_frame=True)
            handler = self._handler(msg)
            if handler is None:
                raise StateError(
                    f"{msg.type_name} is not accepted by {type(self).__name__} in state {self.state}"
                )
            self.verifier.check_fingerprint(
                msg, introduces_key=isinstance(msg, _KEY_INTRODUCING), key_bound=not isinstance(msg, _PRE_KEY)
            )
            try:
                out = handler(msg)
            except ProtocolError as exc:
                if exc.terminal:
                    self.verifier.commit(msg)
                    self._terminate(exc)
                raise
            self.verifier.commit(msg)
            return out
        except StateError as exc:
            if stopped is not None:  # e.g. a frame still in flight when this party's deadline passed
                exc.add_note(
                    f"party {self.party_id} had already ended ({stopped[:200]}); drivers record such "
                    "refusals instead of raising them with strict=False, as runs with deadlines should"
                )
            raise
        finally:
            self._stop_clock(phase, start, cpu)

    def _ended(self) -> str | None:
        """Why this party takes no more messages of its session (its abort reason, or "done"); None
        while it runs."""
        if self.abort_reason is not None:
            return self.abort_reason
        try:
            return "done" if self.done else None
        except NotImplementedError:  # a party kind without an end of its own
            return None

    def _terminate(self, exc: ProtocolError) -> None:
        """End the session after a terminal refusal: aborted state (every party's state enum has
        ``"aborted"``), no deadlines, then :meth:`_discard` what the session holds. The reason is the
        error's text, which names no secret value (terminal errors keep values in local details)."""
        self.abort_reason = f"refused {type(exc).__name__}: {exc}"
        self._deadlines.clear()
        self._rearm.clear()
        if isinstance(self.state, enum.Enum):
            self.state = type(self.state)("aborted")
        self._discard()

    def _discard(self) -> None:
        """Drop what an aborted session holds (decrypted material); nothing by default."""

    def tick(self, now: float) -> list[Message]:
        """Advance this party's clock to ``now``; handle every deadline that passed (earliest first)
        and return the messages that produces. Time never goes backwards (an earlier ``now`` is
        ignored)."""
        self.now = max(self.now, float(now))
        for phase, timeout in self._rearm.items():
            self._deadlines[phase] = self.now + timeout
        self._rearm.clear()
        out: list[Message] = []
        while self._deadlines:
            phase, due = min(self._deadlines.items(), key=lambda kv: kv[1])
            if due > self.now:
                break
            del self._deadlines[phase]
            out += self._expired(phase)
        return out

    def next_deadline(self) -> float | None:
        """The earliest armed deadline (None: none armed). A deadline to arm at the next tick
        (:meth:`_arm_at_next_tick`) is not one yet: drivers tick every party before each event."""
        return min(self._deadlines.values(), default=None)

    def tick_pending(self) -> bool:
        """True when a deadline waits to be armed at the next tick (:meth:`_arm_at_next_tick`): a
        driver that does not tick before every event (a host, ticked by its coordinator) must tick
        this party soon, or that deadline never starts."""
        return bool(self._rearm)

    @property
    def checkpoint_label(self) -> int | None:
        """The label of the checkpoint this party can write now (None: not at a resume point).
        A driver with a checkpoint store saves :meth:`checkpoint` whenever the label changes."""
        return None

    def checkpoint(self) -> Any:
        """This party's state as a :class:`fedgat.checkpoint.Checkpoint` (at a resume point)."""
        raise NotImplementedError(f"{type(self).__name__} writes no checkpoints")

    def raise_for_failure(self) -> None:
        """Raise :attr:`failure` when the party gave up because of a fault."""
        if self.failure is not None:
            raise self.failure

    def has_work(self) -> bool:
        """True while :meth:`step` has streamed work to do (uploads, homomorphic compute)."""
        return False

    def step(self) -> list[Message]:
        """Do the next piece of streamed work; return the messages it produced."""
        return []

    def encode(self, msg: Message) -> bytes:
        """Frame and sign an outgoing message of this party."""
        if msg.sender != self.party_id:
            raise ValueError("a party only encodes its own messages")
        with self.clock(PHASES.get(type(msg), "setup")):
            return encode_message(msg, self._signer)

    @property
    def done(self) -> bool:
        raise NotImplementedError

    @property
    def aborted(self) -> bool:
        return self.abort_reason is not None

    def snapshot(self) -> dict:
        """Everything a message could change, as comparable values (tests: unchanged on rejection)."""
        return {
            "state": self.state,
            "seq": self._seq,
            "verifier": self.verifier.snapshot(),
            "abort": self.abort_reason,
            "deadlines": tuple(sorted(self._deadlines.items())),
            "rearm": tuple(sorted(self._rearm.items())),
            **self._snapshot(),
        }

    # --- as values (:mod:`~fedgat.protocols.party_values`) -----------------------------------------
    def _kind(self) -> str:
        kind = type(self).__dict__.get("PARTY_KIND")
        if kind is None:
            raise TypeError(
                f"{type(self).__name__} cannot be described as a value: it declares no PARTY_KIND of its "
                "own (see fedgat.protocols.party_values.PARTY_KINDS)"
            )
        return kind

    def check_spec(self) -> str:
        """What :meth:`spec` checks before it copies anything: its kind, if this party can be described.

        Raises:
            TypeError: a class that cannot be described (no ``PARTY_KIND`` of its own).
            StateError: the party has already sent or received a message.
        """
        kind = self._kind()
        if self._seq or self.verifier.last_seq():
            raise StateError(
                f"party {self.party_id} has already run (state {self.state}); a spec describes a party "
                "before its first message (a party mid-run travels as its state_value())"
            )
        return kind

    def spec(self) -> PartySpec:
        """This party, before its first message, as plain values (its kind's ``from_spec`` rebuilds an
        equal party). The values are copies (a training client's hold its task encodings).

        Raises:
            TypeError: a class that cannot be described (no ``PARTY_KIND`` of its own).
            StateError: the party has already sent or received a message.
        """
        kind = self.check_spec()
        return PartySpec(kind, self.party_id, {**self._spec_base(), **self._spec_fields()})

    def state_value(self) -> PartyState:
        """This party at any point between messages, as plain values without its private keys
        (:mod:`~fedgat.protocols.party_state`; :meth:`PartyState.build
        <fedgat.protocols.party_state.PartyState.build>` rebuilds it with its identity, exactly).

        Raises:
            TypeError: a class that cannot be described, or a kind without a mid-run state.
            StateError: called while the party handles a message.
        """
        from .party_state import capture_state

        return capture_state(self)

    @classmethod
    def from_spec(cls, spec: PartySpec) -> Party:
        """The party ``spec`` describes (see :meth:`spec`)."""
        raise TypeError(f"{cls.__name__} cannot be built from a spec")

    def state_name(self) -> str:
        """:attr:`state` as a plain value (an enum's value)."""
        return str(self.state.value if isinstance(self.state, enum.Enum) else self.state)

    def report(self) -> PartyReport:
        """What this party hands back when its run ends: state, abort reason, failure, timings and its
        kind's counters and result (:meth:`_report_values`); no secrets."""
        counters, result = self._report_values()
        return PartyReport(
            kind=self._kind(),
            party_id=self.party_id,
            state=self.state_name(),
            abort_reason=self.abort_reason,
            failure=None if self.failure is None else error_to_value(self.failure),
            timings=dict(self.timings),
            cpu_timings=dict(self.cpu_timings),
            counters=counters,
            result=result,
        )

    def progress(self) -> dict[str, int]:
        """The kind's counters while it runs (cheap: no result, no secrets), which a hosting engine
        copies onto the coordinator's twin (:meth:`take_progress`) after each batch of frames, so
        that progress shows while the party runs elsewhere; none by default."""
        return {}

    def take_progress(self, counters: Mapping[str, int]) -> None:
        """Set the counters :meth:`progress` of this party's hosted twin returned (unknown names are
        refused: a host reports only what its kind counts)."""
        if counters:
            raise ValueError(
                f"{type(self).__name__} {self.party_id} counts no progress, got {sorted(counters)}"
            )

    def absorb(self, report: PartyReport) -> None:
        """Take in the :meth:`report` of this party's hosted twin (the caller's copy then reads as after
        an in-process run).

        Raises:
            ValueError: a report of another kind or party.
        """
        if report.kind != self._kind() or report.party_id != self.party_id:
            raise ValueError(
                f"report of {report.kind} party {report.party_id} for {self._kind()} party {self.party_id}"
            )
        self.state = type(self.state)(report.state) if isinstance(self.state, enum.Enum) else report.state
        self.abort_reason = report.abort_reason
        failure = None if report.failure is None else error_from_value(report.failure)
        if failure is not None and not isinstance(failure, FaultError):
            raise ValueError(f"a reported failure must be a FaultError, not {type(failure).__name__}")
        self.failure = failure
        self.timings = defaultdict(float, {str(k): float(v) for k, v in report.timings.items()})
        self.cpu_timings = defaultdict(float, {str(k): float(v) for k, v in report.cpu_timings.items()})
        self._absorb(report)

    def _identity(self) -> Identity:
        """The private keys this party holds (its Ed25519 signing key)."""
        return Identity(self._signer)

    def _spec_base(self) -> dict[str, Any]:
        """What every party's spec holds: roster, session, private keys, the verifier's pins, limits."""
        v = self.verifier
        return {
            "roster": self.roster.to_value(),
            "session": self.session,
            "identity": self._identity().to_value(),
            "verifier": {
                "roster": None if v.roster == self.roster else v.roster.to_value(),
                "me": v.me,
                "session": v.session,
                "fingerprint": v.fingerprint,
            },
            "max_frame_bytes": self.max_frame_bytes,
            "now": self.now,
            "deadlines": dict(self._deadlines),
            "rearm": dict(self._rearm),
        }

    def _restore_spec_base(self, fields: Mapping[str, Any]) -> None:
        """Set what :meth:`_spec_base` holds beyond the constructor's arguments."""
        v = fields["verifier"]
        roster = self.roster if v["roster"] is None else Roster.from_value(v["roster"])
        self.verifier = Verifier(roster, int(v["me"]), int(v["session"]))
        self.verifier.fingerprint = v["fingerprint"]
        self.max_frame_bytes = None if fields["max_frame_bytes"] is None else int(fields["max_frame_bytes"])
        self.now = float(fields["now"])
        self._deadlines = {str(k): float(t) for k, t in fields["deadlines"].items()}
        self._rearm = {str(k): float(t) for k, t in fields.get("rearm", {}).items()}  # saved before: none

    def _spec_fields(self) -> dict[str, Any]:
        """The kind's own constructor inputs (plain values)."""
        return {}

    def _report_values(self) -> tuple[dict[str, int], dict[str, Any]]:
        """The kind's ``(counters, result)`` for :meth:`report` (plain values)."""
        return {}, {}

    def _absorb(self, report: PartyReport) -> None:
        """Take in the kind's counters and result."""

    # --- for subclasses ---------------------------------------------------------------------------
    def _handler(self, msg: Message) -> Handler | None:
        """The handler for ``msg`` in the current state, or None (-> StateError)."""
        raise NotImplementedError

    def _snapshot(self) -> dict:
        return {}

    def _expired(self, phase: str) -> list[Message]:
        """The deadline of ``phase`` passed (subclasses decide; default: nothing)."""
        return []

    def _arm(self, phase: str, timeout: float | None) -> None:
        """Arm ``phase``'s deadline ``timeout`` seconds after the last tick (None: no deadline)."""
        self._rearm.pop(phase, None)
        if timeout is not None:
            self._deadlines[phase] = self.now + float(timeout)

    def _arm_at_next_tick(self, phase: str, timeout: float | None) -> None:
        """Arm ``phase``'s deadline ``timeout`` seconds after the *next* tick: after work of its own
        (a step) the last tick is stale, and the time the party spent working must not count as
        waiting for its peers. Disarmed until then."""
        self._deadlines.pop(phase, None)
        if timeout is None:
            self._rearm.pop(phase, None)
        else:
            self._rearm[phase] = float(timeout)

    def _disarm(self, *phases: str) -> None:
        for phase in phases:
            self._deadlines.pop(phase, None)
            self._rearm.pop(phase, None)

    def _checkpoint_base(self) -> dict:
        """Identity, sequence number and verifier view for a checkpoint's meta (JSON values)."""
        fp = self.verifier.fingerprint
        return {
            "party": self.party_id,
            "session": self.session,
            "seq": self._seq,
            "fingerprint": None if fp is None else fp.hex(),
            "last_seq": {str(k): v for k, v in self.verifier.last_seq().items()},
        }

    def _restore_base(self, meta: dict) -> None:
        """Inverse of :meth:`_checkpoint_base` (the caller checked party and session)."""
        self._seq = int(meta["seq"]) + SEQ_RESTART_GAP
        fp = meta["fingerprint"]
        self.verifier.fingerprint = None if fp is None else bytes.fromhex(fp)
        self.verifier.restore_last_seq({int(k): int(v) for k, v in meta["last_seq"].items()})

    def _new(self, cls: type[Message], recipient: int, **fields: Any) -> Message:
        """A new outgoing message with the next sequence number (call only after validation)."""
        self._seq += 1
        fingerprint = self.verifier.fingerprint or bytes(32)
        return cls(
            sender=self.party_id,
            recipient=recipient,
            session=self.session,
            seq=self._seq,
            fingerprint=fingerprint,
            **fields,
        )

    @contextmanager
    def clock(self, phase: str):
        """Charge the enclosed time to ``phase`` (nested clocks are subtracted from the outer one)."""
        start, cpu = time.perf_counter(), time.process_time()
        self._clock_stack.append([0.0, 0.0])
        try:
            yield
        finally:
            self._stop_clock(phase, start, cpu)

    def _stop_clock(self, phase: str, start: float, cpu_start: float) -> None:
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        child_wall, child_cpu = self._clock_stack.pop()
        self.timings[phase] += elapsed - child_wall
        self.cpu_timings[phase] += cpu - child_cpu
        if self._clock_stack:
            self._clock_stack[-1][0] += elapsed
            self._clock_stack[-1][1] += cpu
