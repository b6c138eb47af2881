r"""The same protocol on Ray: parties hosted in a pool of actors, frames as bytes, server work as tasks.

``pip install "fedgat[ray]"``; Ray is imported lazily, so nothing else in fedgat needs it, and a
missing Ray raises :class:`~fedgat.crypto.ray_encoder.RayUnavailableError` with that hint.

Usage::

    with RayEngine(actors=4) as engine:              # local ray.init, or RayEngine(address="auto")
        transport = engine.transport()
        pre = run_encrypted_pretraining(graph, partition, transport=transport, ...)
        run = train_fedgat(graph, partition, pre.encodings, transport=transport, ...)

Design
------
* :class:`RayEngine` starts Ray (``num_cpus`` from the machine, no dashboard, worker logs not
  forwarded) or joins a cluster (``address=``), and owns a pool of :class:`PartyHost` actors, each
  hosting *many* parties (an actor costs ~200 MiB once torch and TenSEAL are imported; a client
  costs its data). :meth:`RayEngine.shutdown` kills the actors and stops Ray if it started it.
* :class:`RayTransport` is a :class:`~fedgat.protocols.transport.Transport` that can also *host*
  parties: :meth:`RayTransport.run_parties` (the hook :func:`fedgat.pipeline.drive` calls instead of
  the in-process driver) keeps the server in this process (the coordinator) and places every other
  party in an actor, in contiguous blocks of party ids. A party is placed once, before it starts, as
  the bytes of its pickled initial state (private keys as their raw bytes); from then on its state
  machine runs in the actor and only the protocol's own signed frames move, as ``bytes``: the
  actor calls :meth:`~fedgat.protocols.party.Party.receive` on them and returns the frames its
  parties produce, the coordinator routes every frame (counting it in :attr:`RayTransport.traffic`
  and, with a transcript, recording it). Per sender -> receiver FIFO order holds: frames to an
  actor leave in one ordered batch per call and an actor runs one call at a time; frames from an
  actor are routed in the order it produced them. (A reordering would be caught anyway: receivers
  refuse a sequence number that is not above the last one, :class:`~fedgat.protocols.ReplayError`.)
* Streamed work (:meth:`~fedgat.protocols.party.Party.step`): an actor with work does one step of
  one of its parties (round robin) after each batch of deliveries; the coordinator's own parties
  step when nothing is queued for them. Steps pause while more than ``max_pending_bytes`` of frames
  wait to be delivered, so memory stays bounded as with the in-process driver.
* When a run ends, each hosted party's final state is copied back into the caller's party object
  (every attribute that pickles, *except* secrets: signing and wrapping keys and the CKKS secret
  context stay in the actor and are dropped with it), so callers read results as after an
  in-process run (e.g. ``client.encodings``).
* Server work: a hosted run makes the pre-training server compute with
  :class:`~fedgat.crypto.ray_encoder.RayEncoder` (Ray tasks over the cluster) where it would start a
  process pool (``server_tasks=None``), always (True) or never (False).

The observer of :func:`~fedgat.protocols.driver.run_parties` gets a ``"deliver"`` event for every
frame (after its recipient handled it; ``out`` is ``[]`` for hosted parties, whose replies are
routed as their own events) and ``"start"``/``"step"`` events of the coordinator's parties only.

Results equal the in-process transport's for the same partition and seeds (tests/engines): the
same bases and, up to CKKS noise, encodings; the same FedAvg histories when dropout is off. With
dropout, each actor draws from its own torch generator, so runs differ like two seeds would.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import pickle
import resource
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Self

from fedgat.crypto import SigningIdentity, WrappingIdentity
from fedgat.crypto.ray_encoder import INSTALL_HINT, RayEncoder, RayUnavailableError, import_ray

from .driver import Observer
from .messages import MESSAGE_TYPES, peek_type
from .party import Party
from .pretrain import ServerPretrain
from .transport import Delivery, Transcript, Transport

__all__ = ["INSTALL_HINT", "PartyHost", "RayEngine", "RayEngineError", "RayTransport", "RayUnavailableError"]

MiB = 1 << 20
#: attributes of a party that never leave its actor (private keys, the CKKS secret context)
SECRET_ATTRIBUTES = frozenset({"_signer", "_wrapping", "holder"})
#: modules an actor imports at start-up by default (the pipeline's parties and models)
PRELOAD = ("fedgat.pipeline",)

Frame = tuple[int, int, bytes]  # (sender, recipient, data)


class RayEngineError(RuntimeError):
    """An actor died or a hosted run could not proceed (not a protocol error: those are re-raised
    as the party raised them)."""


# ------------------------------------------------------------------------------------- placement
def _dumps_party(party: Party) -> bytes:
    """A party's initial state as bytes (cloudpickle; private keys as their raw bytes)."""
    from ray import cloudpickle

    class _Pickler(cloudpickle.CloudPickler):
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, SigningIdentity):
                return SigningIdentity.from_private_bytes, (obj.private_bytes(),)
            if isinstance(obj, WrappingIdentity):
                return WrappingIdentity.from_private_bytes, (obj.private_bytes(),)
            return super().reducer_override(obj)

    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(party)
    return buf.getvalue()


def _rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 when unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# ----------------------------------------------------------------------------------------- actor
class PartyHost:
    """Actor body: hosts many parties and runs their state machines on the frames it is given.

    Made a Ray actor by :class:`RayEngine` (``ray.remote(PartyHost)``); a plain object otherwise,
    which is how its logic is tested without Ray.
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

    def place(self, packages: Mapping[int, bytes]) -> list[int]:
        """Host the parties pickled by :func:`_dumps_party` (party id -> bytes)."""
        for pid, blob in packages.items():
            party = pickle.loads(blob)
            if party.party_id != pid:
                raise RayEngineError(f"package for party {pid} holds party {party.party_id}")
            self.parties[pid] = party
        return sorted(self.parties)

    def _emit(self, pid: int, messages: list) -> list[Frame]:
        party = self.parties[pid]
        return [(pid, msg.recipient, party.encode(msg)) for msg in messages]

    def start(self, pids: list[int]) -> list[list[Frame]]:
        """Opening frames of ``pids``, in that order."""
        return [self._emit(pid, self.parties[pid].start()) for pid in pids]

    def has_work(self) -> bool:
        return any(p.has_work() for p in self.parties.values())

    def deliver(self, frames: list[Frame], step: bool) -> dict:
        """Hand each frame to its recipient, in order; then, with ``step``, one step of the next
        party with streamed work. Returns ``{"replies": [frames per delivered frame], "step":
        frames of the step, "work": any work left, "error": None or (party id, exception)}``; after
        an error the remaining frames are not delivered."""
        replies: list[list[Frame]] = []
        try:
            for sender, recipient, data in frames:
                if type(data) is not bytes:
                    raise TypeError("frames cross as bytes only")
                party = self.parties.get(recipient)
                if party is None:
                    raise KeyError(f"frame for party {recipient}, which this actor does not host")
                replies.append(self._emit(recipient, party.receive(data)))
            stepped: list[Frame] = []
            if step:
                pids = sorted(self.parties)
                for k in range(len(pids)):
                    pid = pids[(self._turn + k) % len(pids)]
                    if self.parties[pid].has_work():
                        self._turn = (self._turn + k + 1) % len(pids)
                        stepped = self._emit(pid, self.parties[pid].step())
                        break
        except Exception as exc:  # noqa: BLE001 - handed to the coordinator, which raises it
            failed = frames[len(replies)][1] if len(replies) < len(frames) else None
            try:
                pickle.dumps(exc)
            except Exception:  # noqa: BLE001
                exc = RayEngineError(f"{type(exc).__name__}: {exc}")
            return {"replies": replies, "step": [], "work": False, "error": (failed, exc)}
        return {"replies": replies, "step": stepped, "work": self.has_work(), "error": None}

    def export(self, pids: list[int], drop: bool = True) -> dict[int, dict[str, bytes]]:
        """Each party's attributes that pickle, secrets left out (and dropped with ``drop``)."""
        from ray import cloudpickle

        out: dict[int, dict[str, bytes]] = {}
        for pid in pids:
            party = self.parties[pid]
            state = {}
            for name, value in vars(party).items():
                if name in SECRET_ATTRIBUTES:
                    continue
                try:
                    state[name] = cloudpickle.dumps(value)
                except Exception:  # noqa: BLE001, S112 - e.g. TenSEAL objects: they stay here
                    continue
            out[pid] = state
            if drop:
                del self.parties[pid]
        return out

    def reset(self) -> None:
        """Drop every hosted party (after a failed run)."""
        self.parties.clear()
        self._turn = 0

    def memory(self) -> dict:
        """``{"pid", "rss", "peak_rss", "parties"}`` of this actor's process (bytes)."""
        return {"pid": os.getpid(), "rss": _rss_bytes(),
                "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "parties": len(self.parties)}


# ---------------------------------------------------------------------------------------- engine
class RayEngine:
    """A Ray connection and a pool of :class:`PartyHost` actors (see the module docstring).

    Args:
        actors: actors in the pool; None = ``min(cluster CPUs, parties of the first run)``.
        address: an existing cluster (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``); None
            starts a local Ray (unless one is running in this process already: it is reused).
        num_cpus: CPUs of a local Ray (None: the machine's).
        log_to_driver: forward the workers' stdout/stderr (default False).
        threads: torch threads per actor (default 1, like ``fedgat train --threads``).
        init_kwargs: further ``ray.init`` arguments (e.g. ``runtime_env``).
        actor_options: ``.options(...)`` of the actors (default ``scheduling_strategy="SPREAD"``).
        preload: modules every actor imports when it starts (default :data:`PRELOAD`, what the
            pipeline's parties need), so that the first run does not pay for them.

    Raises:
        RayUnavailableError: Ray is not installed.
    """

    def __init__(self, actors: int | None = None, *, address: str | None = None, num_cpus: int | None = None,
                 log_to_driver: bool = False, threads: int | None = 1, init_kwargs: dict | None = None,
                 actor_options: dict | None = None, preload: tuple[str, ...] | None = None) -> None:
        if actors is not None and actors < 1:
            raise ValueError(f"actors must be >= 1, got {actors}")
        ray = import_ray()
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        self.ray = ray
        self.owns_ray = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": log_to_driver}
            if address is None:
                kwargs["num_cpus"] = num_cpus
            start = time.perf_counter()
            ray.init(address=address, **{**kwargs, **(init_kwargs or {})})
            self.init_seconds = time.perf_counter() - start
            self.owns_ray = True
        else:
            self.init_seconds = 0.0
        self.cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.requested_actors = actors
        self.threads = threads
        self.preload = PRELOAD if preload is None else tuple(preload)
        self.actor_options = {"scheduling_strategy": "SPREAD", **(actor_options or {})}
        self.actors: list[Any] = []
        self._closed = False

    def transport(self, **options: Any) -> RayTransport:
        """A :class:`RayTransport` over this engine's actors (options: see :class:`RayTransport`)."""
        return RayTransport(self, **options)

    def ensure_actors(self, parties: int) -> list[Any]:
        """The actor pool, created on first use (see ``actors``)."""
        if self._closed:
            raise RayEngineError("the engine has been shut down")
        if not self.actors:
            n = self.requested_actors or max(1, min(self.cpus, parties))
            cls = self.ray.remote(PartyHost).options(**self.actor_options)
            self.actors = [cls.remote(self.threads, self.preload) for _ in range(n)]
            self._get([a.ping.remote() for a in self.actors])
        return self.actors

    def _get(self, refs: Any) -> Any:
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayActorError as exc:
            raise RayEngineError(f"a party actor died: {exc}") from exc

    def memory(self) -> list[dict]:
        """:meth:`PartyHost.memory` of every actor."""
        return self._get([a.memory.remote() for a in self.actors]) if self.actors else []

    def shutdown(self) -> None:
        """Kill the actors; stop Ray if this engine started it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for actor in self.actors:
            with contextlib.suppress(Exception):  # already gone
                self.ray.kill(actor)
        self.actors = []
        if self.owns_ray and self.ray.is_initialized():
            self.ray.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


# ------------------------------------------------------------------------------------- transport
def _server_tasks(server: ServerPretrain, mode: bool | None, used: list[RayEncoder]) -> None:
    """Make ``server`` compute with :class:`RayEncoder` (mode True; None: where it would start a
    process pool). Until :class:`ServerPretrain` takes an encoder factory, this shadows its
    ``_compute_results`` on the instance (same body, another encoder)."""
    if mode is False:
        return

    def compute():
        if mode is None and server.workers == 0:
            yield from type(server)._compute_results(server)
            return
        assert server.context is not None and server.layout is not None
        explicit = server._workers if server._workers else None  # None/0: the cluster's CPUs
        encoder = RayEncoder(server.context.public_context_bytes(), server.layout, server._spool,
                             workers=explicit)
        server._encoder = encoder  # closed by the server when the round ends
        used.append(encoder)
        groups = (g for g, b in enumerate(server.buckets) for _ in range(len(b)))
        yield from zip(groups, encoder.map(server.buckets))

    server._compute_results = compute  # type: ignore[method-assign]


class RayTransport(Transport):
    """Routes frames between the coordinator's parties and parties hosted in :class:`RayEngine` actors.

    Used by the in-process :class:`~fedgat.protocols.driver.Driver` it behaves as an in-process FIFO
    (nothing is hosted); :meth:`run_parties` hosts parties (see the module docstring).

    Args:
        engine: the engine whose actors host the parties.
        transcript: record every frame that crosses a party boundary.
        keep_local: which parties stay in this process (default: the roster's server).
        max_pending_bytes: streamed steps pause while more frames than this wait for delivery.
        batch_bytes: most frame bytes sent to one actor per call (one frame at least).
        server_tasks: pre-training server on Ray tasks: None (where it would use a process pool),
            True, False.
    """

    def __init__(self, engine: RayEngine, *, transcript: Transcript | None = None,
                 keep_local: Callable[[Party], bool] | None = None, max_pending_bytes: int = 256 * MiB,
                 batch_bytes: int = 32 * MiB, server_tasks: bool | None = None) -> None:
        self.engine = engine
        self.transcript = transcript
        self.keep_local = keep_local or (lambda party: party.party_id == party.roster.server)
        self.max_pending_bytes = max_pending_bytes
        self.batch_bytes = batch_bytes
        self.server_tasks = server_tasks
        #: (sender, recipient, type name) -> [messages, bytes], as InProcessTransport.traffic
        self.traffic: dict[tuple[int, int, str], list[int]] = {}
        #: seconds of the last run spent placing parties and copying their state back
        self.placement_seconds = 0.0
        self.export_seconds = 0.0
        #: the :class:`RayEncoder` of every pre-training server run over this transport
        self.encoders: list[RayEncoder] = []
        self._reset({})

    def _reset(self, placement: dict[int, int]) -> None:
        self._placement = placement  # hosted party id -> actor index
        self._queue: deque[Delivery] = deque()
        n = len(self.engine.actors)
        self._outbox: list[list[Frame]] = [[] for _ in range(n)]
        self._pending = 0  # bytes queued or in flight

    # --- Transport interface (the coordinator's parties) -----------------------------------------
    def _send(self, sender: int, to: int, data: bytes) -> None:
        self._route(sender, to, data)

    def poll(self) -> Delivery | None:
        if not self._queue:
            return None
        delivery = self._queue.popleft()
        self._pending -= len(delivery.data)
        return delivery

    def _route(self, sender: int, to: int, data: bytes) -> None:
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError("transports carry bytes only")
        data = bytes(data)
        type_id = peek_type(data)
        cls = MESSAGE_TYPES.get(type_id) if type_id is not None else None
        counter = self.traffic.setdefault((sender, to, cls.__name__ if cls else "?"), [0, 0])
        counter[0] += 1
        counter[1] += len(data)
        if self.transcript is not None:
            self.transcript.record(sender, to, data)
        self._pending += len(data)
        actor = self._placement.get(to)
        if actor is None:
            self._queue.append(Delivery(sender, to, data))
        else:
            self._outbox[actor].append((sender, to, data))

    def bytes_sent(self, senders=None, recipients=None, types=None) -> int:
        return sum(v[1] for (s, r, t), v in self.traffic.items()
                   if (senders is None or s in senders) and (recipients is None or r in recipients)
                   and (types is None or t in types))

    def messages_sent(self, senders=None, recipients=None, types=None) -> int:
        return sum(v[0] for (s, r, t), v in self.traffic.items()
                   if (senders is None or s in senders) and (recipients is None or r in recipients)
                   and (types is None or t in types))

    # --- hosting ----------------------------------------------------------------------------------
    def run_parties(self, parties: Mapping[int, Party], *, observer: Observer | None = None,
                    start: bool = True) -> int:
        """Run ``parties`` to the end, hosting all but ``keep_local`` ones in the engine's actors;
        returns the number of events (deliveries and steps). Hosted parties' final state is copied
        back into ``parties`` (secrets excepted).

        Raises:
            Whatever a party raises for a rejected frame (the protocol's typed errors);
            RayEngineError: an actor died.
        """
        ray = self.engine.ray
        parties = dict(parties)
        local = {pid: p for pid, p in parties.items() if self.keep_local(p)}
        hosted = sorted(pid for pid in parties if pid not in local)
        actors = self.engine.ensure_actors(len(hosted)) if hosted else self.engine.actors
        blocks = [hosted[a * len(hosted) // len(actors):(a + 1) * len(hosted) // len(actors)]
                  for a in range(len(actors))] if hosted else []
        self._reset({pid: a for a, block in enumerate(blocks) for pid in block})
        shadowed = [p for p in local.values() if isinstance(p, ServerPretrain)]
        for server in shadowed:
            _server_tasks(server, self.server_tasks, self.encoders)
        links = {pid: self.connect(pid) for pid in local}
        events = 0
        clock = time.perf_counter()
        try:
            self.engine._get([actors[a].place.remote({pid: _dumps_party(parties[pid]) for pid in block})
                              for a, block in enumerate(blocks) if block])
            self.placement_seconds = time.perf_counter() - clock
            work = [bool(block) for block in blocks]  # may have work: ask once
            inflight: dict[Any, tuple[int, list[Frame]]] = {}

            def emit(pid: int, messages: list) -> None:
                for msg in messages:
                    links[pid].send(msg.recipient, local[pid].encode(msg))

            if start:
                refs = [actors[a].start.remote(block) for a, block in enumerate(blocks) if block]
                for pid, party in local.items():
                    out = party.start()
                    emit(pid, out)
                    if observer is not None:
                        observer("start", pid, None, out)
                for block, frames in zip([b for b in blocks if b], self.engine._get(refs)):
                    for per_party in frames:
                        for frame in per_party:
                            self._route(*frame)

            def collect(ref: Any) -> None:
                a, sent = inflight.pop(ref)
                result = self.engine._get(ref)
                self._pending -= sum(len(f[2]) for f in sent)
                for frame, replies in zip(sent, result["replies"]):
                    for reply in replies:
                        self._route(*reply)
                    if observer is not None:
                        observer("deliver", frame[1], Delivery(*frame), [])
                if result["error"] is not None:
                    failed, exc = result["error"]
                    exc.add_note(f"raised in a Ray actor by party {failed}")
                    raise exc
                for frame in result["step"]:
                    self._route(*frame)
                work[a] = result["work"]

            busy: set[int] = set()
            while True:
                for ref in ray.wait(list(inflight), num_returns=len(inflight), timeout=0)[0] if inflight else []:
                    busy.discard(inflight[ref][0])
                    collect(ref)
                    events += 1
                room = self._pending < self.max_pending_bytes
                for a, actor in enumerate(actors):
                    if a in busy or not (self._outbox[a] or (work[a] and room)):
                        continue
                    batch, size = [], 0
                    box = self._outbox[a]
                    while box and (not batch or size + len(box[0][2]) <= self.batch_bytes):
                        frame = box.pop(0)
                        batch.append(frame)
                        size += len(frame[2])
                    inflight[actor.deliver.remote(batch, room)] = (a, batch)
                    busy.add(a)
                delivery = self.poll()
                if delivery is not None:
                    if delivery.recipient not in local:
                        raise KeyError(f"frame for unknown party {delivery.recipient}")
                    out = local[delivery.recipient].receive(delivery.data)
                    emit(delivery.recipient, out)
                    events += 1
                    if observer is not None:
                        observer("deliver", delivery.recipient, delivery, out)
                    continue
                if self._pending < self.max_pending_bytes:
                    pid = next((pid for pid, p in local.items() if p.has_work()), None)
                    if pid is not None:
                        out = local[pid].step()
                        emit(pid, out)
                        events += 1
                        if observer is not None:
                            observer("step", pid, None, out)
                        continue
                if inflight:
                    ray.wait(list(inflight), num_returns=1)
                    continue
                if any(self._outbox) or any(work):
                    continue
                break
            clock = time.perf_counter()
            exported = self.engine._get([actors[a].export.remote(block) for a, block in enumerate(blocks) if block])
            for state in exported:
                for pid, attributes in state.items():
                    for name, blob in attributes.items():
                        setattr(parties[pid], name, pickle.loads(blob))
            self.export_seconds = time.perf_counter() - clock
        except BaseException:
            for actor in actors:
                with contextlib.suppress(Exception):  # a dead actor holds nothing
                    actor.reset.remote()
            raise
        finally:
            for server in shadowed:
                server.__dict__.pop("_compute_results", None)
            self._reset({})
        return events
