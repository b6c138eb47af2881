r"""Assembling a FedGAT deployment: identities and roster, the parties of each phase, a run's summary.

Every engine builds its parties here -- the in-process pipeline (:mod:`fedgat.pipeline`, also what
the Ray engine hosts) and the Flower apps (:mod:`fedgat.protocols.flower_app`, one party per
process) -- so all of them run the same protocol on the same data, from a graph, a partition
(:func:`fedgat.methods.fedgat_partition`) and a config:

* :class:`Deployment`, :func:`make_deployment` -- party ids, private identities, the pinned roster;
* :func:`build_pretrain_parties` -- the state machines of the encrypted pre-training round, built
  from :func:`build_pretrain_server` and one :func:`build_pretrain_client` per client;
* :func:`build_predictor_parties` -- with the ``label_rr`` DP release, the FedAvg rounds that train
  its label predictor first (:mod:`fedgat.dp_predictor`);
* :func:`build_training_parties` -- the state machines of the FedAvg rounds, built from
  :func:`build_rounds_server` and one :func:`build_rounds_client` per client: FedGAT clients
  (:func:`fedgat.methods.fedgat_model_fn`) trained on their decrypted encodings
  (:func:`fedgat.tasks.tasks_from_encodings`);
* :func:`bases_rng` -- the server's basis randomness: a CSPRNG, or a stream seeded to pair a run
  with its plaintext twin (DP release noise is never seeded: :meth:`fedgat.dp.FeatureDP.release_rows`);
* :func:`run_summary` -- a run's plain JSON values (``fedgat demo``, the pipeline's results).
"""

from __future__ import annotations

import secrets
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedgat.crypto.encoders import EncoderFactory, local_encoder
from fedgat.crypto.spool import CiphertextSpool
from fedgat.cuda_graphs import check_device as cuda_graphs_device
from fedgat.device import resolve_device
from fedgat.dp import FeatureDP, LabelPredictor
from fedgat.dp_fedavg import DP_NEEDS_SECAGG, update_dp_from_hparams
from fedgat.dp_ledger import DPLedger, MissingLedgerError
from fedgat.dp_predictor import predictor_model_fn, predictor_tasks
from fedgat.encodings import Encodings
from fedgat.federated import Client, client_seed, strategy_from_hparams
from fedgat.graph import Graph
from fedgat.methods import fedgat_model_fn, resolve_hparams
from fedgat.partition import Partition, check_partition
from fedgat.protocols import (
    ClientPretrain,
    ClientRounds,
    Identity,
    Party,
    PretrainConfig,
    Roster,
    ServerPretrain,
    ServerRounds,
)
from fedgat.protocols.fedavg_client import DEFAULT_SECAGG
from fedgat.protocols.secagg import SecAggConfig
from fedgat.randomness import RandomSource
from fedgat.tasks import COMPACT_TOLERANCE, tasks_from_encodings
from fedgat.variants import as_variant

if TYPE_CHECKING:
    from fedgat.pipeline import PretrainResult, TrainingResult

__all__ = [
    "Deployment",
    "PretrainParties",
    "TrainingParties",
    "bases_rng",
    "build_predictor_parties",
    "build_pretrain_client",
    "build_pretrain_parties",
    "build_pretrain_server",
    "build_rounds_client",
    "build_rounds_server",
    "build_training_parties",
    "make_deployment",
    "owned_neighbourhoods",
    "run_summary",
    "training_secagg",
]


# ----------------------------------------------------------------------------------- deployment
@dataclass
class Deployment:
    """Party ids, private identities and the pinned roster of one federation.

    Clients ``0..K-1`` are party ids ``0..K-1``; the server is party ``K``. In a real deployment each
    party holds only its own :class:`Identity` (its Ed25519 key; every other key a party uses is
    generated per session).
    """

    roster: Roster
    identities: dict[int, Identity] = field(repr=False)

    @property
    def server(self) -> int:
        return self.roster.server

    @property
    def clients(self) -> tuple[int, ...]:
        return self.roster.clients


def make_deployment(num_clients: int) -> Deployment:
    """Fresh Ed25519 identities for ``num_clients`` clients and a server, and their roster."""
    identities = {pid: Identity.generate() for pid in range(num_clients + 1)}
    roster = Roster(
        server=num_clients,
        clients=tuple(range(num_clients)),
        signing_keys={pid: ident.signer.public_bytes() for pid, ident in identities.items()},
    )
    return Deployment(roster, identities)


def bases_rng(seed: int | str | None) -> RandomSource:
    """The server's basis randomness: a CSPRNG, or a seeded stream to pair with the plaintext twin."""
    return RandomSource() if seed is None else RandomSource.from_seed(f"fedgat-pretrain-bases:{seed}")


# -------------------------------------------------------------------------------- pre-training
@dataclass
class PretrainParties:
    """The state machines of one pre-training round."""

    deployment: Deployment
    config: PretrainConfig
    server: ServerPretrain
    clients: dict[int, ClientPretrain]

    def all(self) -> dict[int, ClientPretrain | ServerPretrain]:
        return {**self.clients, self.server.party_id: self.server}

    @property
    def clients_share_a_key(self) -> bool:
        """Whether two clients' CKKS keys may be the same: two equal key fingerprints
        (:attr:`ClientPretrain.key_fingerprint`, a hosted client's as it reported it), or one unknown
        (a client that never reported its key cannot be shown to hold its own)."""
        fps = [c.key_fingerprint for c in self.clients.values()]
        return None in fps or len(set(fps)) < len(fps)


def owned_neighbourhoods(partition: Partition, owned: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr, indices)``: the CSR rows of ``owned`` in the partition's (filtered) neighbourhoods,
    the graph a client announces in the pre-training round."""
    nbh = partition.neighbourhoods
    sizes = nbh.degrees()[owned]
    indptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    indices = (
        np.concatenate([nbh.row(int(i)) for i in owned]) if len(owned) else np.zeros(0, np.int64)
    ).astype(np.int64)
    return indptr, indices


def cross_edges(graph: Graph, partition: Partition, client: int) -> tuple[np.ndarray, np.ndarray]:
    """``(cross (k, 2), owner (k,))``: the graph edges between ``client``'s nodes and other clients'
    (either direction of ``graph.edge_index``, and every cross-client attention pair of the
    partition), with the owner of the foreign end: what the client claims in pre-training."""
    owner = partition.owner
    ei = graph.edge_index.numpy()
    nbh = partition.neighbourhoods
    rows = np.repeat(np.arange(len(nbh.indptr) - 1), np.diff(nbh.indptr))
    src = np.concatenate([ei[0], ei[1], rows])
    dst = np.concatenate([ei[1], ei[0], nbh.indices])
    sel = (owner[src] == client) & (owner[dst] != client)
    pairs = np.unique(np.stack([src[sel], dst[sel]], axis=1), axis=0).astype(np.int64)
    return pairs.reshape(-1, 2), owner[pairs[:, 1]].astype(np.int64) if len(pairs) else np.zeros(0, np.int64)


def build_pretrain_server(
    roster: Roster,
    config: PretrainConfig,
    identity: Identity,
    *,
    seed: int | str | None = None,
    encoder: EncoderFactory | None = None,
    workers: int | None = None,
    result_batch_bytes: int = 16 << 20,
    spool_dir: str | None = None,
) -> ServerPretrain:
    """The server of a pre-training round: bases from :func:`bases_rng` (``seed``), computing with
    ``encoder`` (default :func:`fedgat.crypto.encoders.local_encoder` with ``workers`` processes) and
    storing uploads under ``spool_dir`` (default a temporary folder)."""
    return ServerPretrain(
        roster.server,
        roster,
        config,
        identity,
        bases_rng=bases_rng(seed),
        result_batch_bytes=result_batch_bytes,
        encoder=encoder if encoder is not None else local_encoder(workers),
        spool=None if spool_dir is None else partial(CiphertextSpool, directory=spool_dir),
    )


def build_pretrain_client(
    client: int,
    graph: Graph,
    partition: Partition,
    roster: Roster,
    config: PretrainConfig,
    identity: Identity,
    *,
    seed: int | str | None = None,
    dtype: torch.dtype = torch.float64,
    upload_batch: int = 32,
    encrypt_workers: int = 0,
    ledger: DPLedger | None = None,
    ledger_others: Sequence[DPLedger] = (),
    release: torch.Tensor | None = None,
    predictor: LabelPredictor | None = None,
) -> ClientPretrain:
    """Client ``client``'s party of a pre-training round: its owned rows of ``graph.x``, its
    neighbourhoods, cross-client edges (:func:`cross_edges`) and ``needed`` nodes from ``partition``.
    With ``config.dp`` the client draws its release (randomness from a fresh CSPRNG, never from
    ``seed``; ``label_rr`` from the published ``predictor``) and charges it to ``ledger`` (required)
    at construction (with the releases of the same rows in ``ledger_others`` composed too), or
    uploads its rows of ``release`` -- ``(N, w)`` rows of every node,
    :func:`fedgat.dp_release.draw_release`, drawn and charged before. ``encrypt_workers``: processes
    the client may encrypt on (:class:`~fedgat.protocols.ClientPretrain`; 0: in its own process).

    Raises:
        ValueError: the client owns no node.
        MissingLedgerError, BudgetExceededError: see :class:`~fedgat.protocols.ClientPretrain`.
    """
    cp = partition.clients[client]
    if len(cp.owned) == 0:
        raise ValueError(f"client {client} owns no node; use fewer clients")
    indptr, indices = owned_neighbourhoods(partition, cp.owned)
    cross, cross_owner = cross_edges(graph, partition, client)
    return ClientPretrain(
        client,
        roster,
        config,
        identity,
        owned=cp.owned,
        features=graph.x.numpy()[cp.owned],
        indptr=indptr,
        indices=indices,
        cross=cross,
        cross_owner=cross_owner,
        needed=cp.needed,
        dtype=dtype,
        upload_batch=upload_batch,
        encrypt_workers=encrypt_workers,
        ledger=ledger,
        ledger_others=ledger_others,
        release=None if release is None else release.numpy()[cp.owned],
        predictor=predictor,
    )


def auto_encrypt_workers(cores: int, concurrent: int) -> int:
    """Encryption processes per client (``encrypt_workers``) when ``concurrent`` clients encrypt at
    once on a machine of ``cores`` cores: twice their share of the cores, at most every core, 0 below
    2. Twice: the clients that finish early leave their cores to the largest one, whose encryptions
    are the round's straggler (Cora, 10 clients: 7,500 of the 47,946). A client's pool is sized down
    further to its own uploads (:func:`fedgat.crypto.encrypt_pool.encrypt_pool_size`)."""
    if cores < 1 or concurrent < 1:
        raise ValueError(f"cores and concurrent clients must be positive, got {cores}, {concurrent}")
    n = min(cores, -(-2 * cores // concurrent))
    return n if n >= 2 else 0


def build_pretrain_parties(
    graph: Graph,
    partition: Partition,
    *,
    variant: str = "vector",
    preset: str = "n4096",
    seed: int | None = None,
    session: int | None = None,
    deployment: Deployment | None = None,
    chunks: int | None = None,
    dtype: torch.dtype = torch.float64,
    upload_batch: int = 32,
    result_batch_bytes: int = 16 << 20,
    workers: int | None = None,
    spool_dir: str | None = None,
    dp: FeatureDP | None = None,
    encoder: EncoderFactory | None = None,
    dp_ledgers: Mapping[int, DPLedger] | None = None,
    dp_release: torch.Tensor | None = None,
    predictors: Mapping[int, LabelPredictor] | None = None,
    wire: str = "compact",
    upload_window: int | None = None,
    encrypt_workers: int = 0,
) -> PretrainParties:
    """Build the server and the clients of a pre-training round for ``partition``.

    ``wire``: the session's ciphertext wire (:attr:`fedgat.protocols.pretrain.PretrainConfig.wire`:
    ``"compact"``, bytes at the floor, or ``"tenseal"``, ~16-22 % more bytes and less CPU).
    ``upload_window``: uploads paced recipient by recipient, that many open at a time, so the
    server's spool holds that many recipients' uploads, not the round's
    (:attr:`fedgat.protocols.pretrain.PretrainConfig.upload_window`; None: all at once).
    ``encrypt_workers``: processes each client may encrypt its uploads on (its own ``encrypt_workers``;
    0: in its own process; see :func:`auto_encrypt_workers`).

    ``encoder``: where the server computes (default :func:`fedgat.crypto.encoders.local_encoder`
    with ``workers`` processes); ``spool_dir``: where it stores uploads (default a temporary folder).

    ``dp``: the DP release of shared rows (``PretrainConfig.dp``); each client ``c`` draws its
    release with randomness from a fresh CSPRNG (never from ``seed``; ``label_rr`` from the published
    predictor it holds, ``predictors[c]``) and charges it to ``dp_ledgers[c]`` (required with ``dp``: e.g.
    :meth:`fedgat.dp_ledger.DPLedger.for_owner`, a persistent file), or uploads its rows of
    ``dp_release`` (``(N, w)``, drawn and charged before by :func:`fedgat.dp_release.draw_release`;
    to compare a run with its plaintext twin).

    Raises:
        MissingLedgerError: ``dp`` without ``dp_ledgers`` (or ``dp_release``), or a client without one.
        BudgetExceededError: a client's release would exceed its budget (no party is built, nothing sent).
    """
    check_partition(graph, partition)
    if isinstance(upload_batch, bool) or not isinstance(upload_batch, int) or upload_batch < 1:
        raise ValueError(f"upload_batch must be an integer >= 1, got {upload_batch!r}")
    if dp is not None and dp_release is None:
        missing = [c for c in range(partition.num_clients) if dp_ledgers is None or c not in dp_ledgers]
        if missing:
            raise MissingLedgerError(
                f"a DP release needs every owner's ledger (dp_ledgers); none for clients {missing}"
            )
    if partition.num_layers != 2:
        raise ValueError(
            "the pre-training protocol ships the 1-hop expansion: build the partition with num_layers=2"
        )
    deployment = deployment or make_deployment(partition.num_clients)
    config = PretrainConfig(
        session=secrets.randbits(63) if session is None else session,
        variant=variant,
        preset=preset,
        chunks=chunks,
        dp=dp,
        wire=wire,
        upload_window=upload_window,
    )
    roster = deployment.roster
    server = build_pretrain_server(
        roster,
        config,
        deployment.identities[roster.server],
        seed=seed,
        encoder=encoder,
        workers=workers,
        result_batch_bytes=result_batch_bytes,
        spool_dir=spool_dir,
    )
    clients = {
        c: build_pretrain_client(
            c,
            graph,
            partition,
            roster,
            config,
            deployment.identities[c],
            seed=seed,
            dtype=dtype,
            upload_batch=upload_batch,
            encrypt_workers=encrypt_workers,
            ledger=None if dp_ledgers is None else dp_ledgers.get(c),
            # a row that moved to another owner's index keeps its history (known break 8)
            ledger_others=[] if dp_ledgers is None else [v for o, v in dp_ledgers.items() if o != c],
            release=dp_release,
            predictor=None if predictors is None else predictors.get(c),
        )
        for c in roster.clients
    }
    return PretrainParties(deployment, config, server, clients)


# ------------------------------------------------------------------------------------ training
def training_secagg(
    secagg: SecAggConfig | str | None, num_clients: int, fraction: float, idle: int = 0, private: bool = False
) -> SecAggConfig | None:
    """The secure-aggregation setting of a run's FedAvg parties (every builder below resolves it the
    same way, so the server and the clients agree): a :class:`~fedgat.protocols.secagg.SecAggConfig` or
    None as given, or for ``"auto"`` (the builders' default) the default configuration whenever every
    round's cohort holds at least its ``min_cohort`` (3) clients that add an update -- else plaintext
    updates, with a warning: fewer cannot be aggregated securely (a sum of two tells each client the
    other's), and clients refuse such a cohort. ``idle``: clients that add no update (no training
    node and no DP-FedAvg noise share); a round may sample all of them. ``private``: the run uses
    DP-FedAvg, whose distributed noise needs the secure sum (each release alone carries one share of
    it): no plaintext, a ``ValueError`` instead. A given configuration whose ``min_cohort`` exceeds
    the clients a round samples is a ``ValueError`` too (every round would stop at its first stage)."""
    if secagg is None and private:
        raise ValueError(DP_NEEDS_SECAGG)
    per_round = max(1, round(fraction * num_clients))
    if isinstance(secagg, SecAggConfig) and per_round < secagg.min_cohort:
        # every round would stop at its first stage (QuorumError): say so before anything runs
        raise ValueError(
            f"{per_round} client(s) per round (fraction {fraction} of {num_clients}) is below the secure "
            f"aggregation's min_cohort of {secagg.min_cohort}: no round could aggregate; raise the "
            "fraction or lower min_cohort"
        )
    if not isinstance(secagg, str):
        return secagg
    if secagg != "auto":
        raise ValueError(f"secagg must be a SecAggConfig, None or 'auto', not {secagg!r}")
    if per_round - idle >= DEFAULT_SECAGG.min_cohort:
        return DEFAULT_SECAGG
    if private:
        raise ValueError(
            f"{DP_NEEDS_SECAGG}; {per_round} client(s) per round is below its minimum cohort of "
            f"{DEFAULT_SECAGG.min_cohort}"
        )
    idle_note = f" ({idle} of them without training nodes)" if idle else ""
    warnings.warn(
        f"{per_round} client(s) per round{idle_note} is below secure aggregation's minimum cohort of "
        f"{DEFAULT_SECAGG.min_cohort} clients that add an update: the FedAvg updates travel in plaintext",
        stacklevel=3,
    )
    return None


def idle_clients(graph: Graph, partition: Partition, hp: Mapping[str, Any]) -> int:
    """The clients of ``partition`` that add no update to a secure sum: those without a training
    node (none under DP-FedAvg, where every client adds a noise share)."""
    if update_dp_from_hparams(dict(hp)) is not None:
        return 0
    train = graph.train_mask.numpy()
    return int(sum(not train[partition.owner == c].any() for c in range(partition.num_clients)))


def graph_secagg(
    secagg: SecAggConfig | str | None,
    num_clients: int,
    graph: Graph,
    partition: Partition,
    hp: Mapping[str, Any],
) -> SecAggConfig | None:
    """:func:`training_secagg` for ``num_clients`` clients holding ``partition`` of ``graph``: with
    its idle clients (:func:`idle_clients`) and whether ``hp`` asks for DP-FedAvg."""
    return training_secagg(
        secagg,
        num_clients,
        hp["fraction"],
        idle_clients(graph, partition, hp),
        private=update_dp_from_hparams(dict(hp)) is not None,
    )


@dataclass
class TrainingParties:
    """The state machines of the FedAvg rounds, with the resolved hyper-parameters."""

    deployment: Deployment
    hparams: dict
    server: ServerRounds
    clients: dict[int, ClientRounds]

    def all(self) -> dict[int, Party]:
        return {**self.clients, self.server.party_id: self.server}


def build_rounds_server(
    roster: Roster,
    identity: Identity,
    hp: dict,
    *,
    num_features: int,
    num_classes: int,
    seed: int = 0,
    session: int | None = None,
    fingerprint: bytes | None = None,
    secagg: SecAggConfig | str | None = "auto",
) -> ServerRounds:
    """The server of the FedAvg rounds for resolved FedGAT hyper-parameters ``hp``
    (:func:`fedgat.methods.resolve_hparams`): the initial model is drawn after ``torch.manual_seed(seed)``,
    as :func:`fedgat.methods.run_method` draws it; ``seed`` also seeds client sampling;
    ``fingerprint``: the CKKS key fingerprint every update is bound to; ``secagg``: secure aggregation
    of the updates (:class:`~fedgat.protocols.secagg.SecAggConfig`; None: plaintext updates, for
    comparison; "auto": :func:`training_secagg`, on whenever a round samples 3 clients or more)."""
    torch.manual_seed(seed)
    model = fedgat_model_fn(num_features, num_classes, hp)()
    strategy = strategy_from_hparams(hp, model)
    return ServerRounds(
        roster.server,
        roster,
        secrets.randbits(63) if session is None else session,
        identity,
        initial_state=model.state_dict(),
        rounds=hp["rounds"],
        patience=hp["patience"],
        strategy=strategy.server,
        fraction=hp["fraction"],
        seed=seed,
        fingerprint=fingerprint,
        secagg=training_secagg(
            secagg, len(roster.clients), hp["fraction"], private=update_dp_from_hparams(hp) is not None
        ),
        update_dp=update_dp_from_hparams(hp),
    )


def build_rounds_client(
    client: int,
    graph: Graph,
    partition: Partition,
    encodings: Encodings,
    roster: Roster,
    identity: Identity,
    hp: dict,
    *,
    session: int,
    num_features: int,
    num_classes: int,
    fingerprint: bytes | None = None,
    compact_tol: float = COMPACT_TOLERANCE,
    secagg: SecAggConfig | str | None = "auto",
    dp_releases: int = 0,
    device: str | torch.device | None = None,
    cuda_graphs: bool = False,
    seed: int | None = None,
) -> ClientRounds:
    """Client ``client``'s party of the FedAvg rounds: a :class:`fedgat.federated.Client` training
    FedGAT (hyper-parameters ``hp``) on the tasks of its (decrypted) ``encodings`` of its ``needed``
    nodes (:func:`fedgat.tasks.tasks_from_encodings`, compacted at ``compact_tol``); ``secagg`` as
    :func:`build_rounds_server` (both sides must agree); ``dp_releases``: the rounds DP-FedAvg has
    already counted against the client's budget (the release predictor's, :func:`build_predictor_parties`);
    ``device``: where the client trains (:class:`fedgat.federated.Client`; default the CPU), with
    its local step captured as a CUDA graph when ``cuda_graphs`` (a CUDA ``device`` only);
    ``seed``: the run's seed, from which the client's own random stream (dropout) is drawn
    (:func:`fedgat.federated.client_seed`; None: the process-wide stream).

    Raises:
        ValueError: the encodings do not cover the client's ``needed`` nodes in order, or
            ``cuda_graphs`` off a CUDA device.
    """
    train, evaluation = tasks_from_encodings(graph, partition, client, encodings, compact_tol)
    model_fn = fedgat_model_fn(num_features, num_classes, hp)
    strategy = strategy_from_hparams(hp)
    member = Client.from_hparams(
        client,
        model_fn(),
        train,
        evaluation,
        hp,
        strategy=strategy.client,
        update_dp=update_dp_from_hparams(hp),
        device=device,
        cuda_graphs=cuda_graphs,
        seed=None if seed is None else client_seed(seed, client),
    )
    member.dp_releases = dp_releases
    return ClientRounds(
        client,
        roster,
        session,
        identity,
        client=member,
        fingerprint=fingerprint,
        secagg=training_secagg(
            secagg, len(roster.clients), hp["fraction"], private=update_dp_from_hparams(hp) is not None
        ),
    )


def build_training_parties(
    graph: Graph,
    partition: Partition,
    encodings: Mapping[int, Encodings],
    *,
    seed: int = 0,
    deployment: Deployment | None = None,
    fingerprint: bytes | None = None,
    session: int | None = None,
    compact_tol: float = COMPACT_TOLERANCE,
    secagg: SecAggConfig | str | None = "auto",
    dp_releases: Mapping[int, int] | None = None,
    device: str | torch.device | None = None,
    cuda_graphs: bool = False,
    **hparams: Any,
) -> TrainingParties:
    """The server and the clients of the FedAvg rounds from the clients' (decrypted) encodings.

    Models, clients, seeds and rounds are those of :func:`fedgat.methods.run_method` for
    ``"fedgat"`` (``hparams``: overrides of :func:`fedgat.methods.default_hparams`); only the
    encodings come from the pre-training round instead of being built locally. Each client draws
    its dropout masks from a stream of its own, seeded from ``seed`` and its id
    (:func:`fedgat.federated.client_seed`), so every engine trains the same model (on the CPU; on a
    GPU the masks come from the device's generator). The models read the
    encodings' feature dimension (the DP projection's, with DP). ``secagg``: secure aggregation of
    the updates for every party (:mod:`fedgat.protocols.secagg`; "auto", the default, as
    :func:`training_secagg`; None: plaintext updates). The in-process simulator
    :meth:`fedgat.federated.Server.fit` aggregates in the clear. ``dp_releases``: client -> rounds
    DP-FedAvg has already counted (the release predictor's). ``device``: where every client trains
    (:func:`fedgat.device.resolve_device`; default the CPU); the server's weights stay on the CPU.
    ``cuda_graphs``: on a CUDA ``device``, every client's local step runs as a captured CUDA graph
    (:class:`fedgat.federated.Client`); refused (``ValueError``) before anything is built otherwise.
    """
    if cuda_graphs:
        cuda_graphs_device(resolve_device(device))
    check_partition(graph, partition)
    if not isinstance(encodings, Mapping):
        hint = " (pass the run's .encodings)" if hasattr(encodings, "encodings") else ""
        raise TypeError(f"encodings must map client id -> Encodings{hint}, got {type(encodings).__name__}")
    if deployment is not None and sorted(deployment.roster.clients) != list(range(partition.num_clients)):
        raise ValueError(
            f"the deployment's clients are {sorted(deployment.roster.clients)} but the partition has "
            f"{partition.num_clients} (0..{partition.num_clients - 1}): pass the deployment of the "
            "pre-training run these encodings come from"
        )
    missing = sorted(set(range(partition.num_clients)) - set(encodings))
    if missing:
        raise ValueError(f"no encodings for clients {missing}: give every client's (client id -> Encodings)")
    kinds = sorted({enc.variant for enc in encodings.values()})
    if len(kinds) != 1:
        raise ValueError(f"the clients' encodings are of several variants ({', '.join(kinds)})")
    asked = hparams.get("variant", kinds[0])
    if as_variant(asked).name != kinds[0]:
        raise ValueError(f"variant={asked!r} but the encodings are the {kinds[0]} variant's")
    hp = resolve_hparams("fedgat", {**hparams, "variant": kinds[0]})  # the model follows the encodings
    deployment = deployment or make_deployment(partition.num_clients)
    roster = deployment.roster
    session = secrets.randbits(63) if session is None else session
    secagg = graph_secagg(secagg, len(roster.clients), graph, partition, hp)
    # d + w with DP (block layout), read off a client that has encodings (one without nodes has none)
    held = [encodings[c].buckets[0] for c in roster.clients if encodings[c].buckets]
    if not held:
        raise ValueError("no client owns a node: nothing to train")
    in_dim = int(held[0].h_self.shape[1])
    shape = {"num_features": in_dim, "num_classes": graph.num_classes}
    server = build_rounds_server(
        roster,
        deployment.identities[roster.server],
        hp,
        seed=seed,
        session=session,
        fingerprint=fingerprint,
        secagg=secagg,
        **shape,
    )
    # the clients' models are drawn after the server's, from the same seeded stream
    clients = {
        c: build_rounds_client(
            c,
            graph,
            partition,
            encodings[c],
            roster,
            deployment.identities[c],
            hp,
            session=session,
            fingerprint=fingerprint,
            compact_tol=compact_tol,
            secagg=secagg,
            dp_releases=0 if dp_releases is None else int(dp_releases.get(c, 0)),
            device=device,
            cuda_graphs=cuda_graphs,
            seed=seed,
            **shape,
        )
        for c in roster.clients
    }
    return TrainingParties(deployment, hp, server, clients)


def build_predictor_parties(
    graph: Graph,
    partition: Partition,
    *,
    seed: int = 0,
    deployment: Deployment | None = None,
    session: int | None = None,
    secagg: SecAggConfig | str | None = "auto",
    **hparams: Any,
) -> TrainingParties:
    """The FedAvg rounds that train ``label_rr``'s release predictor (:mod:`fedgat.dp_predictor`):
    the same server and client state machines as FedGAT's rounds (secure aggregation, strategy,
    DP-FedAvg), on each client's owned feature rows and training labels, for
    ``dp_predictor_rounds`` rounds without early stopping. Models are drawn after
    ``torch.manual_seed(seed)`` as :func:`fedgat.dp_predictor.train_predictor` draws them, so the
    protocol and the simulation train the same predictor (up to the secure sum's rounding)."""
    check_partition(graph, partition)
    hp = resolve_hparams("fedgat", hparams)
    deployment = deployment or make_deployment(partition.num_clients)
    roster = deployment.roster
    session = secrets.randbits(63) if session is None else session
    secagg = graph_secagg(secagg, len(roster.clients), graph, partition, hp)
    model_fn = predictor_model_fn(graph.num_features, graph.num_classes, hp)
    torch.manual_seed(seed)
    model = model_fn()
    strategy = strategy_from_hparams(hp, model)
    update_dp = update_dp_from_hparams(hp)
    server = ServerRounds(
        roster.server,
        roster,
        session,
        deployment.identities[roster.server],
        initial_state=model.state_dict(),
        rounds=hp["dp_predictor_rounds"],
        patience=None,
        strategy=strategy.server,
        fraction=hp["fraction"],
        seed=seed,
        secagg=secagg,
        update_dp=update_dp,
    )
    clients = {}
    for c, task in zip(roster.clients, predictor_tasks(graph, partition), strict=True):
        member = Client.from_hparams(
            c,
            model_fn(),
            task,
            task,
            hp,
            strategy=strategy_from_hparams(hp).client,
            update_dp=update_dp,
            seed=client_seed(seed, c, "predictor"),
        )
        clients[c] = ClientRounds(c, roster, session, deployment.identities[c], client=member, secagg=secagg)
    return TrainingParties(deployment, hp, server, clients)


# ------------------------------------------------------------------------------------- summary
def run_summary(pretrain: PretrainResult | None = None, training: TrainingResult | None = None) -> dict:
    """Plain JSON values of a run: its pre-training round (costs, slot use, the server's key) and/or
    its training (accuracies, rounds, traffic). ``fedgat demo`` reports it; the pipeline's results
    return it (:meth:`fedgat.pipeline.PretrainResult.summary`, :meth:`fedgat.pipeline.FedGATRun.summary`)."""
    out: dict[str, Any] = {}
    if pretrain is not None:
        pre, layout = pretrain, pretrain.layout
        out.update(
            {
                "variant": pre.variant,
                "preset": pre.preset,
                "wire": pre.wire,
                "upload_window": pre.upload_window,
                "encrypt_workers": pre.encrypt_workers,
                "peak_spooled_bytes": pre.peak_spooled_bytes,
                "phases": {k: round(v, 3) for k, v in pre.phases.items()},
                "pretrain_wall_seconds": round(pre.wall_seconds, 3),
                "bytes_up": pre.bytes_up,
                "bytes_down": pre.bytes_down,
                "messages_up": pre.messages_up,
                "messages_down": pre.messages_down,
                "ciphertexts_up": pre.ciphertexts_up,
                "ciphertexts_down": pre.ciphertexts_down,
                "result_ciphertexts": pre.result_ciphertexts,
                "multiply_adds": pre.multiply_adds,
                "slot_layout": {
                    "d": layout.d,
                    "chunks": layout.chunks,
                    "blocks": layout.blocks,
                    "slots": layout.slots,
                },
                "slot_utilisation": round(pre.slot_utilisation, 4),
                "result_slot_utilisation": round(pre.result_slot_utilisation, 4),
                "server_has_secret_key": pre.server_has_secret_key,
                "shared_secret_key": pre.shared_secret_key,
                "rows_released": pre.rows_released,
                # client -> epsilon (delta 1e-5) of the session's verdicts on its most-released row
                "verdict_epsilon": {str(c): round(e, 4) for c, e in sorted(pre.verdict_epsilon.items())},
                "upload_pad_sigma": round(pre.upload_pad, 4),
            }
        )
        if pre.dp_spent is not None:  # client -> [epsilon, delta] its ledger has spent
            out["dp_spent"] = {str(c): list(v) for c, v in pre.dp_spent.items()}
    if training is not None:
        fit = training.fit
        out.update(
            {
                "test_accuracy": fit.test_accuracy,
                "best_val_accuracy": fit.best_val_accuracy,
                "best_round": fit.best_round,
                "rounds": fit.rounds,
                "max_rounds": training.hparams["rounds"],
                "patience": training.hparams["patience"],
                "training_seconds": round(training.seconds, 3),
                "training_bytes_up": training.bytes_up,
                "training_bytes_down": training.bytes_down,
                "training_messages": training.messages,
                "secure_aggregation": training.secure_aggregation,
            }
        )
        if training.update_dp_spent is not None:
            out["update_epsilon_spent"], out["update_delta"] = training.update_dp_spent
    return out
