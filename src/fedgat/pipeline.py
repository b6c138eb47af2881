r"""The whole FedGAT pipeline through the protocol state machines, plus its plaintext twin.

* :func:`run_encrypted_pretraining` -- the pre-training round of :mod:`fedgat.protocols.pretrain`
  over a transport (in-process by default): clients CKKS-encrypt their features, the server computes
  every needed node's encodings :math:`F_i = A_i H_i` (paper eq. 9-14; vector variant
  :math:`V_i = Q_i H_i`) on ciphertexts without a secret key, each client decrypts its own.
* :func:`run_plaintext_pretraining` -- the same round in plaintext: the server's plan with the *same*
  bases (its basis randomness seeded identically), computed by the plaintext encoder behind the same
  seam (:mod:`fedgat.plain_encoder`) and routed as the protocol routes it; to measure the CKKS error
  and as the overhead benchmark's baseline.
* :func:`train_fedgat` -- FedGAT training (:class:`fedgat.models.FedGAT`, the client code of
  :mod:`fedgat.federated`) through the FedAvg state machines of :mod:`fedgat.protocols.fedavg`.
* :func:`run_encrypted_fedgat` -- both.

The parties each run drives are assembled by :mod:`fedgat.app`
(:func:`~fedgat.app.build_pretrain_parties`, :func:`~fedgat.app.build_training_parties`), which
also summarises a run (:func:`~fedgat.app.run_summary`, the results' ``summary()``). Importable from
here too: :class:`~fedgat.app.Deployment`, :func:`~fedgat.app.make_deployment`,
:class:`~fedgat.app.PretrainParties`, :func:`~fedgat.app.build_pretrain_parties`,
:func:`~fedgat.tasks.select_nodes`, :data:`~fedgat.tasks.COMPACT_TOLERANCE` and
:func:`~fedgat.estimate.estimate_pretraining` (the round's cost without running it).

Phase times are charged by the parties themselves (:attr:`fedgat.protocols.party.Party.timings`):
``keygen`` (each client's key generation, sealing and opening check keys, key messages), ``encrypt``, ``upload`` (framing,
signatures, the server's checks and spooling), ``server_compute``, ``download`` (framing and checks
of bases and results), ``decrypt``, ``setup`` (graph announcements). Everything runs in one process
here, so the phases add up to the wall time of the round (minus the driver's queueing).
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedgat.app import (
    Deployment,
    PretrainParties,
    auto_encrypt_workers,
    bases_rng,
    build_predictor_parties,
    build_pretrain_parties,
    build_training_parties,
    graph_secagg,
    make_deployment,
    run_summary,
)
from fedgat.crypto import SlotLayout
from fedgat.crypto.encoders import check_workers
from fedgat.dp import FeatureDP, LabelPredictor, block_rows
from fedgat.dp_fedavg import update_dp_from_hparams
from fedgat.dp_ledger import DPLedger, owner_ledgers
from fedgat.dp_predictor import TrainedPredictor
from fedgat.dp_release import check_budgets, draw_release, feature_dp_from_hparams, spent_by_owner
from fedgat.encodings import Encodings
from fedgat.estimate import estimate_pretraining
from fedgat.federated import FitResult
from fedgat.graph import Graph, check_trainable
from fedgat.methods import (
    DEFAULT_CLIENTS,
    charge_update_ledgers,
    fedgat_partition,
    resolve_hparams,
    wants_update_ledgers,
)
from fedgat.owners import owner_clients
from fedgat.partition import Partition, check_graph, check_partition
from fedgat.plain_encoder import PlaintextRound
from fedgat.progress import progress_bar
from fedgat.protocols import Clock, Delivery, InProcessTransport, Party, Transport, run_parties
from fedgat.protocols.driver import Observer
from fedgat.protocols.messages import EncodingResults, peek_type
from fedgat.protocols.pretrain import ServerState
from fedgat.randomness import check_seed
from fedgat.tasks import COMPACT_TOLERANCE, select_nodes
from fedgat.verdict_dp import verdict_epsilon

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = [
    "COMPACT_TOLERANCE",
    "PHASES",
    "Deployment",
    "FedGATRun",
    "PretrainParties",
    "PretrainResult",
    "TrainingResult",
    "build_pretrain_parties",
    "drive",
    "estimate_pretraining",
    "make_deployment",
    "max_abs_error",
    "plaintext_round",
    "run_encrypted_fedgat",
    "run_encrypted_pretraining",
    "run_plaintext_pretraining",
    "select_nodes",
    "train_fedgat",
    "train_release_predictor",
]

PHASES = ("keygen", "encrypt", "upload", "server_compute", "download", "decrypt")


def drive(
    transport: Transport,
    parties: Mapping[int, Party],
    observer: Observer | None = None,
    *,
    clock: Clock | None = None,
    strict: bool = True,
) -> int:
    """Run ``parties`` to the end over ``transport``. A transport that hosts parties itself (it has a
    ``run_parties(parties, observer=...)`` method, e.g.
    :class:`fedgat.protocols.ray_engine.RayTransport`) runs them, given ``clock=`` and ``strict=``
    only when they are not the defaults; any other goes through the in-process driver
    :func:`~fedgat.protocols.run_parties`. ``clock``: the time of the parties' deadlines (None: the
    hosting transport's own clock, else real time); ``strict=False``: a frame a party refuses (a
    late answer after a deadline) is recorded in the transport's or driver's ``rejected`` rather
    than raised (the in-process driver's list is not kept: pass a transport that hosts, or use
    :class:`~fedgat.protocols.Driver`, to read it)."""
    hosted = getattr(transport, "run_parties", None)
    if callable(hosted):
        options: dict[str, Any] = {} if clock is None else {"clock": clock}
        if not strict:  # a hosting transport need not take these
            options["strict"] = False
        return hosted(parties, observer=observer, **options)
    return run_parties(transport, parties, observer=observer, clock=clock, strict=strict)


# ------------------------------------------------------------------------------------- results
@dataclass
class PretrainResult:
    """Outcome of :func:`run_encrypted_pretraining`.

    Attributes:
        encodings: client id -> decrypted :class:`~fedgat.encodings.Encodings` of its ``needed`` nodes
            (:func:`fedgat.checkpoint.save_encodings` keeps them in a file, pickle-free).
        phases: seconds per phase (see the module docstring), summed over parties.
        wall_seconds: wall time of the round.
        bytes_up, bytes_down: frame bytes clients -> server and server -> clients (signatures and
            headers included).
        messages_up, messages_down: frame counts.
        ciphertexts_up: uploaded ciphertexts; ciphertexts_down: result ciphertexts
            delivered to clients (a node needed by several clients counts for each);
            result_ciphertexts: distinct result ciphertexts the server computed.
        multiply_adds: plaintext x ciphertext multiply-adds of the server
            (:func:`fedgat.crypto.encodings.multiply_adds`).
        layout: the slot layout; slot_utilisation: its nominal utilisation
            (:meth:`~fedgat.crypto.SlotLayout.utilisation`); result_slot_utilisation: share of all
            result slots that hold an encoding value.
        server_has_secret_key: read from the server's TenSEAL contexts (False).
        shared_secret_key: whether two clients hold the same CKKS key (False: each has its own).
        rows_released: (row, recipient) pairs the owners released (each encrypted for its recipient).
        fingerprint: the fingerprint of the participants' key set
            (:func:`~fedgat.protocols.messages.keyset_fingerprint`); session: the session id.
    """

    encodings: dict[int, Encodings]
    phases: dict[str, float]
    wall_seconds: float
    bytes_up: int
    bytes_down: int
    messages_up: int
    messages_down: int
    ciphertexts_up: int
    ciphertexts_down: int
    result_ciphertexts: int
    multiply_adds: int
    layout: SlotLayout
    slot_utilisation: float
    result_slot_utilisation: float
    server_has_secret_key: bool
    shared_secret_key: bool
    rows_released: int
    variant: str
    preset: str
    fingerprint: bytes
    session: int
    deployment: Deployment = field(repr=False)
    #: with DP: client id -> ``(epsilon, delta)`` its ledger has spent on its features after this
    #: round's release (None without DP, or with a release drawn before: see ``dp_release``; without
    #: DP but with ledgers, after this session's verdicts were charged)
    dp_spent: dict[int, tuple[float, float]] | None = None
    #: client id -> epsilon (at delta 1e-5) of this session's verdicts towards the server on its
    #: most-released row (:mod:`fedgat.verdict_dp`: its rows' Gaussian upload pads; known break 22)
    verdict_epsilon: dict[int, float] = field(default_factory=dict)
    #: the sd of the upload pads (:attr:`fedgat.protocols.PretrainConfig.upload_pad`)
    upload_pad: float = 0.0
    #: CPU seconds per phase of this process (the server's worker processes are not included)
    cpu_phases: dict[str, float] = field(default_factory=dict)
    #: the server's worker processes (0: it computed in this process)
    server_workers: int = 0
    #: processes each client could encrypt on (``encrypt_workers`` as resolved; 0: in its own process)
    encrypt_workers: int = 0
    #: CPU seconds of the encryption workers of the clients that ran in this process (children of
    #: this process; a hosting engine's clients are counted in their hosts' CPU instead)
    encrypt_worker_cpu: float = 0.0
    #: the session's ciphertext wire (:attr:`fedgat.protocols.pretrain.PretrainConfig.wire`)
    wire: str = "compact"
    #: the session's upload window (:attr:`fedgat.protocols.pretrain.PretrainConfig.upload_window`)
    upload_window: int | None = None
    #: most bytes of uploads the server's spool held at once
    peak_spooled_bytes: int = 0
    #: wall seconds from the start of the server's compute phase to its last result (with workers,
    #: the compute overlaps the clients' download and decryption; ``phases["server_compute"]`` only
    #: counts the time the round waited for it)
    server_compute_span: float = float("nan")
    #: wall seconds of the same compute replayed with the clients idle (``measure_server_alone``)
    server_compute_alone: float = float("nan")
    #: CPU seconds of that replay: ``(this process, worker processes)``; benchmarks that time the
    #: whole call subtract them
    server_compute_alone_cpu: tuple[float, float] = (0.0, 0.0)
    #: party id -> phase -> wall seconds that party's own clock charged
    #: (:attr:`~fedgat.protocols.party.Party.timings`; ``phases`` is their sum over parties)
    party_timings: dict[int, dict[str, float]] = field(default_factory=dict)

    def summary(self) -> dict:
        """Plain values for JSON (:func:`fedgat.app.run_summary`)."""
        return run_summary(self)


def _advance(bar: tqdm, n: int) -> None:
    """Move ``bar`` on by ``n``; close it once full, so that a finished phase's clock stops there
    instead of running on until the whole round ends."""
    if n:
        bar.update(n)
    if bar.total is not None and bar.n >= bar.total:
        bar.close()


class _Progress:
    """tqdm bars per phase, fed by the driver's observer; each appears when its phase starts and its
    total is known (no empty bars waiting through the phases before it).

    Uploads are counted where the server accepts them (rows released, each to one recipient: the
    total is known once the server has every graph), so the bar moves whichever engine hosts the
    clients; decryptions by the clients' counters, which a hosting engine copies onto the local
    twins as its hosts report them (:meth:`fedgat.protocols.party.Party.progress`)."""

    def __init__(self, parties: PretrainParties, enabled: bool) -> None:
        self.parties = parties
        self.enabled = enabled
        self.upload: tqdm | None = None
        self.compute: tqdm | None = None
        # total: the nodes with a foreign partial, known bucket by bucket as the bases arrive (the
        # bar is closed at the end, never when it catches up with a total still growing)
        self.decrypt: tqdm | None = None
        self._computed = 0
        self.bytes = {"up": 0, "down": 0}
        self.messages = {"up": 0, "down": 0}

    def __call__(self, event: str, party_id: int, delivery: Delivery | None, out: list) -> None:
        server = self.parties.server
        if delivery is not None:
            side = "up" if delivery.recipient == server.party_id else "down"
            self.bytes[side] += len(delivery.data)
            self.messages[side] += 1
            if side == "down" and self.enabled and peek_type(delivery.data) == EncodingResults.TYPE:
                clients = self.parties.clients.values()
                expected = sum(c.nodes_to_decrypt for c in clients)
                if self.decrypt is None:
                    self.decrypt = progress_bar("download + decrypt", total=expected, unit="node")
                elif expected != self.decrypt.total:
                    self.decrypt.total = expected
                self.decrypt.update(sum(c.nodes_decrypted for c in clients) - self.decrypt.n)
        if not self.enabled or party_id != server.party_id:
            return
        if self.upload is None and server.layout is not None and server.rows_released:
            self.upload = progress_bar("encrypt + upload", total=server.rows_released, unit="row")
        if self.upload is not None and server.layout is not None:
            _advance(self.upload, server.ciphertexts_received // server.layout.chunks - self.upload.n)
        if event == "step":
            if self.compute is None:
                self.compute = progress_bar("server compute (HE)", total=server.nodes_total, unit="result")
            _advance(self.compute, server.nodes_computed - self._computed)
            self._computed = server.nodes_computed

    def close(self) -> None:
        for bar in (self.upload, self.compute, self.decrypt):
            if bar is not None:
                bar.close()


def resolve_encrypt_workers(
    value: int | str, clients: int, transport: Transport, *, windowed: bool = False
) -> int:
    """``encrypt_workers`` as a number: ``"auto"`` is :func:`fedgat.app.auto_encrypt_workers` for this
    machine's usable cores and the clients ``transport`` runs at once (the in-process driver steps
    one client at a time, unless the uploads are ``windowed``: then every client waits for grants
    with its pool started; an engine runs them all)."""
    if value == "auto":
        from fedgat.protocols.process_engine import usable_cores

        concurrent = 1 if isinstance(transport, InProcessTransport) and not windowed else clients
        return auto_encrypt_workers(usable_cores(), concurrent)
    check_encrypt_workers(value)
    return int(value)


def check_encrypt_workers(value: object) -> None:
    """``encrypt_workers`` is ``"auto"`` or a whole number ``>= 0``.

    Raises:
        ValueError: anything else.
    """
    if value == "auto":
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"encrypt_workers must be 'auto' or a count >= 0, got {value!r}")


def run_encrypted_pretraining(
    graph: Graph,
    partition: Partition,
    variant: str = "vector",
    preset: str = "n4096",
    seed: int | None = None,
    transport: Transport | None = None,
    progress: bool = True,
    *,
    deployment: Deployment | None = None,
    chunks: int | None = None,
    dtype: torch.dtype = torch.float64,
    workers: int | None = None,
    upload_batch: int = 32,
    result_batch_bytes: int = 16 << 20,
    dp: FeatureDP | None = None,
    measure_server_alone: bool = False,
    dp_ledgers: Mapping[int, DPLedger] | None = None,
    dp_release: torch.Tensor | None = None,
    predictors: Mapping[int, LabelPredictor] | None = None,
    wire: str = "compact",
    upload_window: int | None = None,
    encrypt_workers: int | str = 0,
) -> PretrainResult:
    """Run the encrypted pre-training round (:mod:`fedgat.protocols.pretrain`) over ``transport``.

    Args:
        graph: node features (unit-norm rows) and labels; each client reads only its own rows.
        partition: a 2-layer partition (:func:`fedgat.partition.make_partition`).
        variant, preset: encodings variant and CKKS preset.
        seed: seeds the server's bases (None: CSPRNG). Pass the same seed to
            :func:`run_plaintext_pretraining` to get the same bases.
        transport: default a fresh :class:`~fedgat.protocols.InProcessTransport`.
        progress: tqdm bars per phase.
        deployment: identities and roster (default: fresh ones).
        chunks: feature chunks per ciphertext (None: :meth:`SlotLayout.for_dimension`).
        dtype: dtype of the decrypted encodings.
        workers: processes for the server's homomorphic compute (0: in process; None: every core
            for rounds of :data:`~fedgat.protocols.pretrain.AUTO_POOL_MIN_MULTIPLY_ADDS` or more).
        dp: DP release of the rows shared across clients (:class:`fedgat.dp.FeatureDP`): each
            client's encodings then follow the block layout of :mod:`fedgat.dp` (its own clean
            features, every other node's release); the release's randomness comes from each
            client's CSPRNG, never from ``seed``.
        dp_ledgers: with ``dp``, client id -> its :class:`~fedgat.dp_ledger.DPLedger` (required),
            charged before anything is sent; the spent ``(epsilon, delta)`` is ``dp_spent``. Without
            ``dp``, optional: each client's session verdicts (:mod:`fedgat.verdict_dp`) are charged
            to its ledger instead, and a session past a budget is refused before anything is sent.
        dp_release: with ``dp``, a release drawn before (:func:`fedgat.dp_release.draw_release`,
            ``(N, w)``) to upload instead.
        predictors: with ``dp`` of mechanism ``label_rr``, client id -> the published predictor it
            holds (:func:`train_release_predictor`).
        wire: the ciphertext wire (``"compact"``: bytes at the floor, more CPU; ``"tenseal"``:
            ~16-22 % more bytes, less CPU; :attr:`fedgat.protocols.pretrain.PretrainConfig.wire`).
        upload_window: pace the uploads recipient by recipient, this many at a time, so that the
            server's spool holds that many recipients' uploads instead of the round's, and computes
            each recipient as soon as its uploads are in
            (:attr:`fedgat.protocols.pretrain.PretrainConfig.upload_window`; None: all at once).
        encrypt_workers: processes each client may encrypt its uploads on (0: in its own process;
            ``"auto"``: :func:`fedgat.app.auto_encrypt_workers` for this machine's cores and how many
            clients ``transport`` runs at once; see :class:`~fedgat.protocols.ClientPretrain`).
        measure_server_alone: after the round, compute every result again with the clients idle
            (:meth:`ServerPretrain.replay_compute`) and report its wall time as
            ``server_compute_alone``: the server's compute as on a machine of its own (benchmarks).
    """
    check_seed(seed, none=True)
    check_workers(workers)
    check_encrypt_workers(encrypt_workers)
    transport = transport if transport is not None else InProcessTransport()
    parties = build_pretrain_parties(
        graph,
        partition,
        variant=variant,
        preset=preset,
        seed=seed,
        deployment=deployment,
        chunks=chunks,
        dtype=dtype,
        upload_batch=upload_batch,
        result_batch_bytes=result_batch_bytes,
        dp=dp,
        encoder=transport.encoder_factory(workers),
        dp_ledgers=dp_ledgers,
        dp_release=dp_release,
        predictors=predictors,
        wire=wire,
        upload_window=upload_window,
        encrypt_workers=resolve_encrypt_workers(
            encrypt_workers, partition.num_clients, transport, windowed=upload_window is not None
        ),
    )
    bars = _Progress(parties, progress)
    server = parties.server
    server.keep_encoder = measure_server_alone
    marks: dict[str, float] = {}  # the server's compute span, read off the events (it reads no clock)

    def observe(event: str, party_id: int, delivery: Delivery | None, out: list) -> None:
        bars(event, party_id, delivery, out)
        now = time.perf_counter()
        if server.state is not ServerState.COLLECTING:
            marks.setdefault("start", marks.get("last", now))  # before the event that began it
            if server.done:
                marks.setdefault("end", now)
        marks["last"] = now

    start = time.perf_counter()
    try:
        drive(transport, parties.all(), observer=observe)
    except BaseException:
        server.close()
        raise
    finally:
        bars.close()
    wall = time.perf_counter() - start
    failed = [p for p in parties.all().values() if not p.done]
    if failed:
        server.close()
        reasons = "; ".join(f"party {p.party_id}: {p.abort_reason or p.state}" for p in failed)
        raise RuntimeError(f"pre-training did not complete: {reasons}")
    replay = None
    if measure_server_alone:
        with progress_bar(
            "server compute replayed, clients idle", total=server.nodes_total, unit="result", enabled=progress
        ) as again:
            replay = server.replay_compute(on_result=again.update)
    phases: dict[str, float] = {name: 0.0 for name in PHASES}
    cpu_phases: dict[str, float] = {name: 0.0 for name in PHASES}
    for party in parties.all().values():
        for name, seconds in party.timings.items():
            phases[name] = phases.get(name, 0.0) + seconds
        for name, seconds in party.cpu_timings.items():
            cpu_phases[name] = cpu_phases.get(name, 0.0) + seconds
    layout = server.layout
    assert layout is not None and server.context is not None
    encodings = {c: client.encodings for c, client in parties.clients.items()}
    assert all(e is not None for e in encodings.values())
    return PretrainResult(
        encodings=encodings,  # type: ignore[arg-type]
        phases=phases,
        wall_seconds=wall,
        bytes_up=bars.bytes["up"],
        bytes_down=bars.bytes["down"],
        messages_up=bars.messages["up"],
        messages_down=bars.messages["down"],
        ciphertexts_up=server.ciphertexts_received,
        ciphertexts_down=sum(c.ciphertexts_decrypted for c in parties.clients.values()),
        result_ciphertexts=server.result_ciphertexts,
        multiply_adds=server.multiply_adds,
        layout=layout,
        slot_utilisation=layout.utilisation(),
        result_slot_utilisation=(
            server.result_rows * layout.d / (server.result_ciphertexts * layout.slots)
            if server.result_ciphertexts
            else float("nan")
        ),
        server_has_secret_key=server.has_secret_key,
        shared_secret_key=parties.clients_share_a_key,
        rows_released=server.rows_released,
        variant=variant,
        preset=preset,
        fingerprint=server.verifier.fingerprint or bytes(32),
        session=parties.config.session,
        deployment=parties.deployment,
        cpu_phases=cpu_phases,
        server_workers=server.workers,
        encrypt_workers=max((c.encrypt_workers for c in parties.clients.values()), default=0),
        encrypt_worker_cpu=sum(c.encrypt_worker_cpu for c in parties.clients.values()),
        wire=wire,
        upload_window=upload_window,
        peak_spooled_bytes=server.peak_spooled_bytes,
        server_compute_span=marks["end"] - marks["start"] if "end" in marks else float("nan"),
        server_compute_alone=replay.wall if replay is not None else float("nan"),
        server_compute_alone_cpu=(replay.cpu, replay.worker_cpu) if replay is not None else (0.0, 0.0),
        party_timings={pid: dict(p.timings) for pid, p in parties.all().items()},
        upload_pad=parties.config.upload_pad,
        verdict_epsilon=_verdict_epsilons(parties, server.most_recipients),
        dp_spent=(
            {c: client.dp_spent for c, client in parties.clients.items() if client.dp_spent is not None}
            if (dp is not None and dp_release is None) or (dp is None and dp_ledgers is not None)
            else None
        ),
    )


def _verdict_epsilons(parties: PretrainParties, planned: Mapping[int, int]) -> dict[int, float]:
    """Client id -> epsilon of the session's verdicts on its most-released row: from the client's own
    releases where it ran in this process, else from the server's plan (a hosting engine's clients
    ran elsewhere, and their copies here hold no releases; the simulated server is honest)."""
    return {
        c: client.verdict_epsilon
        if client.releases
        else verdict_epsilon(parties.config.upload_pad, planned.get(c, 0))
        for c, client in parties.clients.items()
    }


def plaintext_round(
    graph: Graph,
    partition: Partition,
    variant: str = "vector",
    seed: int | str = 0,
    *,
    dtype: torch.dtype = torch.float64,
    embed_factor: int = 1,
    dp: FeatureDP | None = None,
    dp_release: torch.Tensor | None = None,
    dp_ledgers: Mapping[int, DPLedger] | None = None,
    predictor: LabelPredictor | None = None,
) -> PlaintextRound:
    """The round :func:`run_plaintext_pretraining` runs, planned: the server's
    :func:`~fedgat.protocols.pretrain_plan.plan_round` over the clients' graph announcements
    (:func:`~fedgat.protocols.pretrain_plan.partition_graphs`) with the encrypted server's basis
    randomness (:func:`fedgat.app.bases_rng` of ``seed``), and every upload in the clear, keyed like
    the spool (with ``dp`` the block layout of :mod:`fedgat.dp`: each node's clean row and its
    release ``dp_release``, or one drawn here by :func:`fedgat.dp_release.draw_release`, charged to
    ``dp_ledgers``, ``label_rr`` from ``predictor``)."""
    check_partition(graph, partition)
    if seed is None:
        raise ValueError("the plaintext twin needs the seed of the encrypted run's bases")
    check_seed(seed, text=True)
    x, release = graph.x.to(dtype), None
    if dp is not None:
        drawn = (
            dp_release
            if dp_release is not None
            else draw_release(graph, partition, dp, ledgers=dp_ledgers, predictor=predictor)
        )
        x, release = block_rows(graph.x.to(dtype), drawn)
    return PlaintextRound.from_partition(
        partition, x, variant, bases_rng(seed), release=release, embed_factor=embed_factor
    )


def run_plaintext_pretraining(
    graph: Graph,
    partition: Partition,
    variant: str = "vector",
    seed: int | str = 0,
    *,
    dtype: torch.dtype = torch.float64,
    embed_factor: int = 1,
    dp: FeatureDP | None = None,
    dp_release: torch.Tensor | None = None,
    dp_ledgers: Mapping[int, DPLedger] | None = None,
    predictor: LabelPredictor | None = None,
    out_dtype: torch.dtype | None = None,
) -> dict[int, Encodings]:
    """The encodings every client would decrypt, computed in plaintext with the same bases as
    :func:`run_encrypted_pretraining` with the same ``seed`` (a seed is required) and ``dp`` (then
    with the release ``dp_release`` -- pass the one the encrypted run uploaded to compare them -- or
    one drawn here and charged to ``dp_ledgers``, ``label_rr`` from ``predictor``: the block layout
    of :mod:`fedgat.dp`, a client's own sources clean, all others the release).

    The same round as the encrypted one, in the clear: the server's plan (:func:`plaintext_round`),
    its compute buckets run by the plaintext encoder (:class:`fedgat.plain_encoder.PlainEncoder`) and
    the results routed to the clients as the protocol routes them
    (:func:`fedgat.plain_encoder.assemble_encodings`). A client that owns no node gets empty encodings.

    ``dtype`` is the compute dtype; ``out_dtype`` (default ``dtype``) the dtype the encodings are
    stored in: ``torch.float32`` gives exactly the float64 encodings cast, at half the memory (what
    :func:`train_fedgat`'s tasks read in any case)."""
    rnd = plaintext_round(
        graph,
        partition,
        variant,
        seed,
        dtype=dtype,
        embed_factor=embed_factor,
        dp=dp,
        dp_release=dp_release,
        dp_ledgers=dp_ledgers,
        predictor=predictor,
    )
    got = rnd.run(dtype=out_dtype)
    empty = Encodings(rnd.variant, np.zeros(0, np.int64), [])
    return {c: got.get(c, empty) for c in range(partition.num_clients)}


def check_encodings_split(partition: Partition, encodings: Mapping[int, Encodings]) -> None:
    """Raise ``ValueError`` unless ``encodings`` hold one entry per client of ``partition``, each over
    that client's needed nodes in their order: what :func:`train_fedgat`'s clients build their tasks
    from, checked before anything (a ledger's charge included) depends on it."""
    ids = sorted(encodings)
    if ids != list(range(partition.num_clients)):
        shown = ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")
        raise ValueError(
            f"the encodings are of clients {shown}; the split has clients 0..{partition.num_clients - 1}"
        )
    for c, client in enumerate(partition.clients):
        if not np.array_equal(np.asarray(encodings[c].nodes), client.needed):
            raise ValueError(
                f"client {c}'s encodings cover other nodes than its needed nodes: another split (clients, "
                "beta, seed, owners, neighbour cap or minimum-cross rule) or another graph"
            )


def _check_client_mapping(name: str, value: object) -> None:
    """``TypeError`` naming ``name`` unless ``value`` is a mapping (client id -> Encodings), with a hint
    when it is a run's result instead of its ``.encodings``."""
    if not isinstance(value, Mapping):
        hint = " (a run's .encodings)" if hasattr(value, "encodings") else ""
        raise TypeError(f"{name} must map client id -> Encodings{hint}, got {type(value).__name__}")


def max_abs_error(got: Mapping[int, Encodings], want: Mapping[int, Encodings]) -> float:
    """Largest absolute difference between two sets of per-client encodings over the same bases."""
    for name, value in (("got", got), ("want", want)):
        _check_client_mapping(name, value)
    same_seed = "; were both rounds run with the same seed= (run_encrypted_pretraining's default is None: random bases)?"
    worst = 0.0
    for c, enc in got.items():
        ref = want[c]
        if not np.array_equal(enc.nodes, ref.nodes) or len(enc.buckets) != len(ref.buckets):
            raise ValueError(f"client {c}: the encodings cover other nodes or buckets (another partition?)")
        for a, b in zip(enc.buckets, ref.buckets):
            if not np.array_equal(a.bases.nodes, b.bases.nodes) or not np.allclose(a.bases.p, b.bases.p):
                raise ValueError(f"client {c}: buckets over other nodes or bases{same_seed}")
            for x, y in ((a.h_self, b.h_self), (a.K2, b.K2), (a.M2, b.M2)):  # M2: when stored
                if x is not None and y is not None and x.numel():
                    worst = max(worst, float((x.double() - y.double()).abs().max()))
    return worst


# ------------------------------------------------------------------------------------- training
@dataclass
class TrainingResult:
    """Outcome of :func:`train_fedgat`.

    Attributes:
        fit: the federated training's :class:`~fedgat.rounds.FitResult` (accuracies at the best
            validation round, per-round history, the global model's weights at that round:
            ``fit.model_state``).
        seconds: wall time of the rounds.
        bytes_up, bytes_down: frame bytes clients -> server and server -> clients over the rounds
            (signatures, headers and secure aggregation's messages included).
        messages: frames exchanged, both ways.
        hparams: the resolved hyper-parameters the clients trained with.
        secure_aggregation: whether the server saw only the sum of the updates
            (:mod:`fedgat.protocols.secagg`).
        update_dp_spent: with DP-FedAvg (``update_dp_epsilon``), the ``(epsilon, delta)`` the rounds
            spent of each client's update budget; None without it.
    """

    fit: FitResult
    seconds: float
    bytes_up: int
    bytes_down: int
    messages: int
    hparams: dict
    secure_aggregation: bool = False
    update_dp_spent: tuple[float, float] | None = None

    def summary(self) -> dict:
        """Plain values for JSON (:func:`fedgat.app.run_summary`)."""
        return run_summary(training=self)


def train_fedgat(
    graph: Graph,
    partition: Partition,
    encodings: Mapping[int, Encodings],
    *,
    seed: int = 0,
    deployment: Deployment | None = None,
    transport: Transport | None = None,
    fingerprint: bytes | None = None,
    progress: bool = True,
    compact_tol: float = COMPACT_TOLERANCE,
    dp_releases: Mapping[int, int] | None = None,
    device: str | torch.device | None = None,
    cuda_graphs: bool = False,
    **hparams,
) -> TrainingResult:
    """FedGAT training from the clients' (decrypted) encodings through the FedAvg protocol.

    Models, clients, seeds and rounds are those of :func:`fedgat.methods.run_method` for
    ``"fedgat"`` (hyper-parameters: :func:`fedgat.methods.default_hparams`); only the encodings come
    from the pre-training round instead of being built locally. ``dp_releases``: client -> rounds
    DP-FedAvg has already counted (the release predictor's, :func:`train_release_predictor`).
    ``device``: where the clients train (:class:`fedgat.federated.Client`; default the CPU);
    ``cuda_graphs``: on a CUDA device, each client's local step as a captured CUDA graph.

    ``encodings`` (client id -> :class:`~fedgat.encodings.Encodings`: a pre-training run's
    ``.encodings``, or :func:`run_plaintext_pretraining`'s result) are only read while the parties are
    built (each client copies the rows of its tasks): a caller that hands them over without keeping a
    reference frees them before the rounds. ``deployment`` and ``fingerprint``: the parties' keys and
    the key-set fingerprint of the encrypted round that produced them (``pre.deployment``,
    ``pre.fingerprint``), so that training runs among the same parties (default: fresh keys).
    ``transport``: the engine the rounds run over (default in-process). The trained model's weights
    at the best validation round are ``result.fit.model_state``
    (:func:`fedgat.methods.fedgat_model_fn` builds the model they load into).

    Raises:
        TypeError: ``graph`` is no :class:`~fedgat.graph.Graph`, ``encodings`` no mapping, ``seed`` no
            integer.
        ValueError: a partition of another graph, a client without encodings, no client with nodes,
            or another run's ``deployment``.
        GraphError: the graph has no training or no validation node (:func:`fedgat.graph.check_trainable`).
    """
    check_graph(graph)
    check_trainable(graph)
    check_seed(seed)
    parties = build_training_parties(
        graph,
        partition,
        encodings,
        seed=seed,
        deployment=deployment,
        fingerprint=fingerprint,
        compact_tol=compact_tol,
        dp_releases=dp_releases,
        device=device,
        cuda_graphs=cuda_graphs,
        **hparams,
    )
    del encodings  # the parties hold their tasks' copies (see the docstring)
    server, roster, hp = parties.server, parties.deployment.roster, parties.hparams
    transport = transport if transport is not None else InProcessTransport()
    traffic = {"up": 0, "down": 0, "messages": 0}
    bar = progress_bar("training rounds", total=hp["rounds"], unit="round", enabled=progress)

    def observe(event: str, party_id: int, delivery: Delivery | None, out: list) -> None:
        if delivery is not None:
            traffic["up" if delivery.recipient == roster.server else "down"] += len(delivery.data)
            traffic["messages"] += 1
        if len(server.history) > bar.n:
            last = server.history[-1]
            bar.set_postfix(  # drawn with the update, at the bar's own pace
                val=f"{last['val_accuracy']:.3f}",
                test_at_best_val=f"{server.best_test_accuracy:.3f}",
                refresh=False,
            )
            bar.update(len(server.history) - bar.n)

    start = time.perf_counter()
    try:
        drive(transport, parties.all(), observer=observe)
    finally:
        bar.close()
    if server.result is None:
        raise RuntimeError(f"training did not complete: {server.abort_reason or server.state}")
    return TrainingResult(
        server.result,
        time.perf_counter() - start,
        traffic["up"],
        traffic["down"],
        traffic["messages"],
        hp,
        secure_aggregation=server.secagg is not None,
        update_dp_spent=None
        if server.update_dp is None
        else (  # the most rounds a client's budget paid for, the release predictor's included
            server.update_dp.epsilon(max(c.client.dp_releases for c in parties.clients.values())),
            server.update_dp.delta,
        ),
    )


def train_release_predictor(
    graph: Graph,
    partition: Partition,
    *,
    seed: int = 0,
    deployment: Deployment | None = None,
    transport: Transport | None = None,
    progress: bool = True,
    **hparams,
) -> tuple[dict[int, TrainedPredictor], dict[int, int]]:
    """Train ``label_rr``'s release predictor (:mod:`fedgat.dp_predictor`) through the FedAvg protocol
    (:func:`fedgat.app.build_predictor_parties`: secure aggregation, the run's strategy, DP-FedAvg
    when on) and hand each client the weights it received last.

    Returns:
        ``(predictors, dp_releases)``: client id -> its copy of the published predictor, and client id ->
        the rounds DP-FedAvg has counted against its budget (the FedGAT rounds continue from there).
    """
    parties = build_predictor_parties(graph, partition, seed=seed, deployment=deployment, **hparams)
    server, hp = parties.server, parties.hparams
    transport = transport if transport is not None else InProcessTransport()
    bar = progress_bar(
        "release predictor rounds", total=hp["dp_predictor_rounds"], unit="round", enabled=progress
    )

    def observe(event: str, party_id: int, delivery: Delivery | None, out: list) -> None:
        if len(server.history) > bar.n:
            bar.update(len(server.history) - bar.n)

    try:
        drive(transport, parties.all(), observer=observe)
    finally:
        bar.close()
    if server.result is None:
        raise RuntimeError(
            f"the release predictor's rounds did not complete: {server.abort_reason or server.state}"
        )
    predictors, rounds = {}, {}
    for c, client in parties.clients.items():
        weights = client.global_weights
        if weights is None:
            raise RuntimeError(f"client {c} holds no published predictor after the rounds")
        predictors[c] = TrainedPredictor(dict(weights), hp["dp_predictor_hidden"])
        rounds[c] = client.client.dp_releases
    return predictors, rounds


@dataclass
class FedGATRun:
    """Outcome of :func:`run_encrypted_fedgat`: ``pretrain``, the encrypted pre-training round's
    :class:`PretrainResult` (None with ``encrypted=False``, which pre-trains with the plaintext twin);
    ``training``, the :class:`TrainingResult` (accuracies, history, ``training.fit.model_state``);
    the partition, the seed and, with DP, what each owner's ledger has spent. ``summary()`` gives plain
    values for JSON (the results themselves hold the parties' keys and are not meant to be pickled; keep
    the decrypted encodings with :func:`fedgat.checkpoint.save_encodings` and train from them again with
    ``encodings=``)."""

    pretrain: PretrainResult | None
    training: TrainingResult
    partition: Partition = field(repr=False)
    #: with DP: client id -> ``(epsilon, delta)`` its ledger has spent on its features after this run
    dp_spent: dict[int, tuple[float, float]] | None = None
    #: the run's seed (split, bases, initial model, dropout streams; never DP noise)
    seed: int | None = None
    #: with DP-FedAvg ledgers (``update_dp_budget`` / ``update_dp_ledger_dir``): client id ->
    #: ``(epsilon, delta)`` its ledger has spent on its updates after this run
    update_ledger_spent: dict[int, tuple[float, float]] | None = None
    #: ``"saved"`` when training started from encodings given to the run (no pre-training round)
    encodings_from: str | None = None

    @property
    def test_accuracy(self) -> float:
        return self.training.fit.test_accuracy

    def summary(self) -> dict:
        """Plain values for JSON (:func:`fedgat.app.run_summary`), with the client count, the seed and
        whether the pre-training round was encrypted (``"pretraining"``: ``"encrypted"`` or
        ``"plaintext twin"``, ``encrypted=False``; ``"saved encodings"``, ``encodings=``)."""
        out = run_summary(self.pretrain, self.training)
        out["num_clients"] = self.partition.num_clients
        out["pretraining"] = (
            "encrypted"
            if self.pretrain is not None
            else "saved encodings"
            if self.encodings_from == "saved"
            else "plaintext twin"
        )
        out["seed"] = self.seed
        if self.dp_spent is not None:
            out["dp_spent"] = {str(c): list(v) for c, v in self.dp_spent.items()}
        if self.update_ledger_spent is not None:
            out["update_ledger_spent"] = {str(c): list(v) for c, v in self.update_ledger_spent.items()}
        return out


def run_encrypted_fedgat(
    graph: Graph,
    num_clients: int | None = None,
    beta: float = 1.0,
    seed: int = 0,
    *,
    variant: str = "vector",
    preset: str = "n4096",
    wire: str = "compact",
    encrypted: bool = True,
    transport: Transport | None = None,
    progress: bool = True,
    workers: int | None = None,
    chunks: int | None = None,
    owner: np.ndarray | None = None,
    dp_ledgers: Mapping[int, DPLedger] | None = None,
    device: str | torch.device | None = None,
    upload_window: int | None = None,
    encrypt_workers: int | str = 0,
    encodings: Mapping[int, Encodings] | None = None,
    cuda_graphs: bool = False,
    **hparams,
) -> FedGATRun:
    """Encrypted pre-training (or, with ``encrypted=False``, its plaintext twin) and FedGAT training
    through the federated rounds protocol, for the Dirichlet split ``(num_clients, beta, seed)`` or,
    with ``owner`` (``(N,)`` client ids, e.g. :func:`fedgat.owners.load_owners`), the user's split
    (``num_clients`` defaults to its number of clients, else to 10; given with ``owner`` it must be
    that number: :func:`fedgat.owners.owner_clients`). The split is
    :func:`fedgat.methods.fedgat_partition`'s.

    With the ``dp_epsilon`` hyper-parameter (and ``dp_mechanism``, ``dp_delta``, ``dp_dim``) the
    pre-training shares a DP release (:class:`fedgat.dp.FeatureDP`, block layout; randomness from
    each client's CSPRNG; for ``label_rr`` after the predictor's rounds,
    :func:`train_release_predictor`), charged to ``dp_ledgers`` (client id -> ledger; default the
    persistent ones of :func:`fedgat.dp_ledger.owner_ledgers` for ``dp_budget`` and
    ``dp_ledger_dir``); ``dp_spent`` reports what each client has spent. ``device``: where the
    clients train the FedAvg rounds (default the CPU; the pre-training round always runs on the CPU);
    ``cuda_graphs``: there, each client's local step as a captured CUDA graph (:func:`train_fedgat`).
    ``wire``, ``upload_window`` (uploads paced recipient by recipient, so the server's spool holds
    that many recipients' uploads), ``encrypt_workers``: the pre-training's, as
    :func:`run_encrypted_pretraining` takes them.

    ``encodings``: client id -> the encodings an earlier round gave the clients (e.g.
    :func:`fedgat.checkpoint.load_encodings` of a ``fedgat demo --save-encodings`` file): training
    starts from them and no pre-training round runs (``pretrain`` is None, ``encodings_from``
    ``"saved"``). They must be the encodings of this split (:func:`check_encodings_split` refuses
    others before any ledger is charged), and a DP release of the rows cannot be drawn for them
    (``dp_epsilon`` is refused)."""
    hp = resolve_hparams("fedgat", {"variant": variant, **hparams})
    check_graph(graph)
    check_trainable(graph)
    check_workers(workers)
    check_encrypt_workers(encrypt_workers)
    if hp["share"] != "rows":
        raise ValueError(f"share={hp['share']!r} is simulated by fedgat.methods.run_method only")
    dp = feature_dp_from_hparams(hp, seed)
    saved = encodings is not None
    if encodings is not None:
        _check_client_mapping("encodings", encodings)
        other = sorted(
            {e.variant for e in encodings.values() if getattr(e, "variant", hp["variant"]) != hp["variant"]}
        )
        if other:
            raise ValueError(
                f"the encodings are {other[0]} encodings; this run trains variant={hp['variant']!r}"
            )
        if dp is not None:
            raise ValueError(
                "dp_epsilon draws a DP release of the rows in the pre-training round; saved encodings were "
                "computed without one (run the round with dp_epsilon instead)"
            )
    if owner is not None:
        owner, num_clients = owner_clients(owner, num_clients, graph.num_nodes)
    elif num_clients is None:
        num_clients = DEFAULT_CLIENTS
    partition = fedgat_partition(graph, num_clients, beta, seed, hp, owner)
    if encodings is not None:  # before any ledger is charged for a run that could not train
        check_encodings_split(partition, encodings)
    if dp is not None and dp_ledgers is None:
        dp_ledgers = owner_ledgers(num_clients, hp["dp_budget"], hp["dp_ledger_dir"])
    if dp is not None:
        check_budgets(graph, partition, dp, dp_ledgers)  # before any round runs
    update_dp, update_ledger_spent = update_dp_from_hparams(hp), None
    if wants_update_ledgers(hp, update_dp):
        # what the training builders would refuse (DP-FedAvg without a secure sum), refused before the
        # ledgers are charged: a run that cannot train must not spend their budget
        graph_secagg("auto", num_clients, graph, partition, hp)
    deployment = make_deployment(num_clients)
    predictors: dict[int, TrainedPredictor] | None = None
    dp_releases: dict[int, int] | None = None
    if dp is not None and dp.needs_predictor:
        # DP-FedAvg's ledgers pay for the predictor's rounds too: charged before them
        update_ledger_spent = charge_update_ledgers(num_clients, update_dp, hp)
        predictors, dp_releases = train_release_predictor(
            graph, partition, seed=seed, deployment=deployment, transport=transport, progress=progress, **hp
        )
    pre = None
    if encodings is not None:
        fingerprint = None
    elif encrypted:
        pre = run_encrypted_pretraining(
            graph,
            partition,
            variant,
            preset,
            seed,
            transport,
            progress,
            deployment=deployment,
            workers=workers,
            chunks=chunks,
            dp=dp,
            dp_ledgers=dp_ledgers,
            predictors=predictors,
            wire=wire,
            upload_window=upload_window,
            encrypt_workers=encrypt_workers,
        )
        encodings, fingerprint = pre.encodings, pre.fingerprint
    else:
        predictor = None if predictors is None else predictors[min(predictors)]
        # stored in float32: the run does not return them, and training reads these values
        plain = run_plaintext_pretraining(
            graph,
            partition,
            variant,
            seed,
            dp=dp,
            dp_ledgers=dp_ledgers,
            predictor=predictor,
            out_dtype=torch.float32,
        )
        encodings, fingerprint = plain, None
    if update_ledger_spent is None:  # before the first update
        update_ledger_spent = charge_update_ledgers(num_clients, update_dp, hp)
    training = train_fedgat(
        graph,
        partition,
        encodings,
        seed=seed,
        deployment=deployment,
        transport=transport,
        fingerprint=fingerprint,
        progress=progress,
        dp_releases=dp_releases,
        device=device,
        cuda_graphs=cuda_graphs,
        **hp,
    )
    dp_spent = None
    if dp is not None and dp_ledgers is not None:
        dp_spent = spent_by_owner(graph, partition, dp_ledgers)
    return FedGATRun(
        pre, training, partition, dp_spent, seed, update_ledger_spent, "saved" if saved else None
    )
