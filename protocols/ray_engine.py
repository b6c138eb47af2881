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
  party in an actor, in contiguous blocks of party ids. The coordinator is
  :class:`~fedgat.protocols.hosting.HostedTransport`, shared with the process engine
  (:mod:`fedgat.protocols.process_engine`); this module adds only how an actor is called. A party is placed once, before it starts, as
  a value: the bytes of its :class:`~fedgat.protocols.party_values.PartySpec` (plain values, private
  keys as their raw bytes; no pickle), from which the actor builds it (sent, and its report returned,
  as a ``uint8`` array over those bytes, which Ray ships out of band: :func:`~fedgat.protocols.ray_host.out_of_band`); from then on its state
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
* When a run ends, each hosted party hands back its
  :class:`~fedgat.protocols.party_values.PartyReport` (state, abort reason, failure, timings, its
  kind's counters and result, e.g. a pre-training client's decrypted encodings), which the caller's
  party object absorbs (:meth:`~fedgat.protocols.party.Party.absorb`), so callers read results as
  after an in-process run (e.g. ``client.encodings``). Secrets (private keys, the CKKS secret
  context) are never reported: they stay in the actor and are dropped with it. A party that cannot
  be described as a value (no ``PARTY_KIND``, e.g. the servers) cannot be hosted: ``TypeError``.
  Errors raised in an actor cross as values too and are raised here as the party raised them (a
  protocol error) or as :class:`RayEngineError`.
* Server work: :meth:`RayTransport.encoder_factory` is what the pre-training server is built with
  (:func:`fedgat.pipeline.run_encrypted_pretraining` asks the transport): a
  :class:`~fedgat.crypto.ray_encoder.RayEncoderFactory`, through which the server runs the round's
  recipients as one window of Ray tasks, interleaved (a windowed round: one encoder per recipient,
  under its public context), where it would start a process pool (``server_tasks=None``), always
  (True) or never (False). No party's method is replaced.

The observer of :func:`~fedgat.protocols.driver.run_parties` gets a ``"deliver"`` event for every
frame (after its recipient handled it; ``out`` is ``[]`` for hosted parties, whose replies are
routed as their own events) and ``"start"``/``"step"`` events of the coordinator's parties only.

Results equal the in-process transport's for the same partition and seeds (tests/engines): the
same bases and, up to CKKS noise, encodings; the same FedAvg histories, dropout included (each
client draws its masks from a stream of its own that travels in its spec, not from its actor's).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any, Self

from fedgat.crypto.encoders import EncoderFactory, local_encoder
from fedgat.crypto.ray_encoder import INSTALL_HINT, RayEncoder, RayUnavailableError, import_ray, ray_encoder

from .driver import Clock
from .hosting import MAX_FRAME_BYTES, HostedTransport, PartyHost
from .party import Party
from .ray_host import RayEngineError, RayPartyHost, out_of_band
from .transport import Transcript

__all__ = ["INSTALL_HINT", "PartyHost", "RayEngine", "RayEngineError", "RayTransport", "RayUnavailableError"]

MiB = 1 << 20
#: modules an actor imports at start-up by default (the pipeline's parties and models)
PRELOAD = ("fedgat.pipeline",)


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

    def __init__(
        self,
        actors: int | None = None,
        *,
        address: str | None = None,
        num_cpus: int | None = None,
        log_to_driver: bool = False,
        threads: int | None = 1,
        init_kwargs: dict | None = None,
        actor_options: dict | None = None,
        preload: tuple[str, ...] | None = None,
    ) -> None:
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
            cls = self.ray.remote(RayPartyHost).options(**self.actor_options)
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
class RayTransport(HostedTransport):
    """Routes frames between the coordinator's parties and parties hosted in :class:`RayEngine` actors:
    the coordinator of :class:`~fedgat.protocols.hosting.HostedTransport` (shared with the process
    engine) with actor calls as its host calls.

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
        max_frame_bytes: the largest frame carried (:class:`~fedgat.protocols.hosting.HostedTransport`).
        clock: time source of the parties' deadlines (:class:`~fedgat.protocols.hosting.HostedTransport`).
    """

    engine_error = RayEngineError
    host_noun = "a Ray actor"

    def __init__(
        self,
        engine: RayEngine,
        *,
        transcript: Transcript | None = None,
        keep_local: Callable[[Party], bool] | None = None,
        max_pending_bytes: int = 256 * MiB,
        batch_bytes: int = 32 * MiB,
        server_tasks: bool | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        clock: Clock | None = None,
    ) -> None:
        self.engine = engine
        self.server_tasks = server_tasks
        #: every :class:`RayEncoder` of the pre-training servers run over this transport (one per
        #: recipient whose shares ran as Ray tasks)
        self.encoders: list[RayEncoder] = []
        super().__init__(
            transcript=transcript,
            keep_local=keep_local,
            max_pending_bytes=max_pending_bytes,
            batch_bytes=batch_bytes,
            max_frame_bytes=max_frame_bytes,
            clock=clock,
        )

    def encoder_factory(self, workers: int | None = None) -> EncoderFactory:
        """A pre-training server over this transport computes as Ray tasks
        (:class:`~fedgat.crypto.ray_encoder.RayEncoderFactory`, ``workers`` at once; None/0: the
        cluster's CPUs) -- always with ``server_tasks=True``, only where it would start a process
        pool with None (decided for the round, by its multiply-adds), never with False. The round's
        recipients run through one window of tasks, interleaved; every :class:`RayEncoder` made
        (one per recipient, under its public context) is kept in :attr:`encoders`."""
        if self.server_tasks is False:
            return local_encoder(workers)
        return ray_encoder(workers, everywhere=bool(self.server_tasks), on_encoder=self.encoders.append)

    # --- host calls: actor method calls, answers as object refs ----------------------------------
    def _open_hosts(self, parties: int) -> int:
        return len(self.engine.ensure_actors(parties))

    def _call(self, host: int, method: str, *args: Any) -> Any:
        if method == "place":  # specs out of band (RayPartyHost's reports come back the same way)
            (specs,) = args
            args = ({pid: out_of_band(blob) for pid, blob in specs.items()},)
        return getattr(self.engine.actors[host], method).remote(*args)

    def _ready(self, calls: list[Any]) -> list[Any]:
        return list(self.engine.ray.wait(calls, num_returns=len(calls), timeout=0)[0])

    def _wait(self, calls: list[Any], timeout: float | None = None) -> None:
        self.engine.ray.wait(calls, num_returns=1, timeout=timeout)

    def _result(self, call: Any) -> dict:
        return self.engine._get(call)

    def _results(self, calls: list[Any]) -> list[dict]:
        return self.engine._get(calls)

    def _abandon(self, calls: list[Any], error: BaseException) -> None:
        for actor in self.engine.actors:
            with contextlib.suppress(Exception):  # a dead actor holds nothing
                actor.reset.remote()
