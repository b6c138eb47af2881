r"""Sans-IO state machines of FedGAT's encrypted pre-training round.

Parties: the server, the clients, and among the clients the key *dealer* (client 0 by default).
The roster of Ed25519 keys is pinned out of band (:mod:`fedgat.protocols.roster`).

Message flow (``->`` one message, ``=>`` a stream of them)::

    dealer  start: CKKS keygen; PublicContext -> server; GraphAnnounce -> server; then => FeatureUpload,
                   UploadDone (its own features)
    client  start: KeyAnnounce -> server; GraphAnnounce -> server
    server  KeyAnnounce from c: relays it -> dealer
    dealer  KeyAnnounce (relayed): checks c's binding signature against the roster, wraps the secret
            context for c's X25519 key (signed) -> WrappedKeyDelivery -> server
    server  WrappedKeyDelivery: relays it -> c (it cannot open it: no X25519 private key of c)
    client  WrappedKeyDelivery: unwraps (dealer's signature, AAD = dealer, client, session, key
            fingerprint), then => FeatureUpload (encrypted unit-norm feature rows), UploadDone
    server  once every client is done: draws the bases of every needed node ONCE
            (:func:`fedgat.encodings.draw_bases`), sends each client its buckets' EncodingBases, then
            => EncodingResults: each node's encodings :math:`F_i = A_i H_i` (paper eq. 9-14; vector
            variant :math:`V_i = Q_i H_i`; row 0 is :math:`h_i`) computed once on ciphertexts
            (:func:`fedgat.crypto.encodings.compute_node`) and sent to every client that needs the
            node, streamed in batches; finally EncodingsDone -> each client
    client  decrypts each batch on arrival into its :class:`~fedgat.encodings.Encodings` (its
            ``needed`` nodes, in ``needed`` order; :math:`h_i` of owned nodes from its own plaintext)

Differential privacy (``PretrainConfig.dp``, :mod:`fedgat.dp`): every client sends PrivacyTerms
before its GraphAnnounce, and for each batch a FeatureUpload of its nodes' clean *projected* rows
and a ReleaseUpload of their DP release (noise drawn by the client). The server computes, per
needed node, one result per distinct view (:func:`fedgat.crypto.encodings.plan_views`): a client's
result reads the clean ciphertexts of the sources it owns and the released ones of all others; it
confirms the terms (PrivacyTerms) to each client before the bases. A party refuses other terms, or
terms in a session without DP (:class:`~fedgat.protocols.errors.ConfigMismatchError`).

What the server learns: the graph structure (owned nodes, neighbour lists, hence who needs what),
the feature dimension, node counts, ciphertexts and their sizes. It holds only the public CKKS context
(:meth:`fedgat.crypto.ServerContext.from_bytes` refuses secret keys), so it cannot decrypt.
What a client learns from its encodings is *not* hidden by this protocol: see ``SECURITY.md``.

Faults (:class:`PretrainTimeouts`; time is given by :meth:`~fedgat.protocols.party.Party.tick`):
the server's ``keys`` phase lasts until it holds the public context, every client's graph and every
wrapped key; its ``upload`` phase until every client reported UploadDone. When a deadline passes, the
clients that did not finish are dropped *if* no remaining client needs them -- no node in the
remaining clients' needed sets (their nodes and their neighbours) is owned by a missing client --
and the round goes on without them (they get an Abort); otherwise the server stops with a
:class:`~fedgat.protocols.errors.MissingPartyError` naming the missing parties and the phase, and
tells every client. A missing dealer always stops the round. Clients time out too: ``keys``
(waiting for the wrapped key) and ``download`` (no bases or results for that long).

Limits (:class:`PretrainLimits`, checked before anything of that size is allocated or computed):
the server refuses a GraphAnnounce with a feature dimension, node count, neighbourhood size or
bases memory above its limits; a client refuses bases whose decrypted encodings would exceed its
memory budget (:class:`~fedgat.protocols.errors.SizeLimitError`, state unchanged).

Restarts: pre-training is one round and is rerun from scratch if interrupted; once it is done a
client's checkpoint (:meth:`ClientPretrain.checkpoint`) holds its decrypted encodings, so a client
restarted later (e.g. during training) reloads them (:func:`encodings_from_checkpoint`) instead.

Memory: uploads are validated and spooled to disk as they arrive
(:class:`~fedgat.crypto.encodings.CiphertextSpool`); results are computed node by node in
:meth:`ServerPretrain.step` and leave in batches of ~``result_batch_bytes``; clients decrypt each
batch on arrival. No party holds all ciphertexts of a dataset.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fedgat.checkpoint import Checkpoint, encodings_to_checkpoint
from fedgat.checkpoint import encodings_from_checkpoint as _encodings_from_arrays
from fedgat.crypto import (
    DEFAULT_PRESET,
    CiphertextFormatError,
    ContextFormatError,
    KeyHolderContext,
    KeyMismatchError,
    KeyUnwrapError,
    ServerContext,
    SlotLayout,
    WrapAAD,
    WrappedKey,
    WrappingIdentity,
    deserialize,
    encrypt_rows,
)
from fedgat.crypto import SignatureError as CryptoSignatureError
from fedgat.crypto import verify as verify_signature
from fedgat.crypto.encodings import (
    CiphertextSpool,
    NodeResult,
    ViewPlan,
    compute_node,
    decrypt_bucket,
    multiply_adds,
    plan_views,
    release_key,
)
from fedgat.crypto.measure import children_cpu_seconds
from fedgat.dp import FeatureDP
from fedgat.encodings import VARIANTS, BucketBases, EncodingBucket, Encodings, draw_bases
from fedgat.graph import CSR
from fedgat.randomness import RandomSource

from .errors import (
    AuthError,
    ConfigMismatchError,
    KeyFingerprintError,
    MissingPartyError,
    PayloadError,
    SignatureError,
    SizeLimitError,
    StateError,
)
from .messages import (
    MAX_NODES,
    Abort,
    AbortCode,
    EncodingBases,
    EncodingResults,
    EncodingsDone,
    FeatureUpload,
    GraphAnnounce,
    KeyAnnounce,
    Message,
    PrivacyTerms,
    PublicContext,
    ReleaseUpload,
    ResultItem,
    UploadDone,
    UploadItem,
    WrappedKeyDelivery,
    key_binding_bytes,
)
from .party import Handler, Party
from .roster import Identity, Roster

__all__ = [
    "ClientPretrain",
    "ClientState",
    "DealerSide",
    "PretrainConfig",
    "PretrainLimits",
    "PretrainTimeouts",
    "ServerPretrain",
    "ServerState",
    "client_bucket_views",
    "encodings_from_checkpoint",
    "needed_from_neighbourhoods",
    "validate_features",
]

MiB = 1 << 20
#: largest |coefficient| a client accepts in the bases (keeps results inside the CKKS headroom)
MAX_BASIS_ABS = 16.0
#: smallest round (nodes) for which ``workers=None`` starts a process pool
AUTO_POOL_MIN_NODES = 256
#: unit-norm tolerance of feature rows (all-zero rows, e.g. CiteSeer's isolated nodes, are allowed)
NORM_TOLERANCE = 1e-4
GiB = 1 << 30
CLIENT_KIND = "fedgat.pretrain.client"


@dataclass(frozen=True)
class PretrainTimeouts:
    """Seconds per phase (None: wait forever). Server: ``keys`` from its start until it holds the
    context, every graph and every wrapped key; ``upload`` from then until every UploadDone. Clients:
    ``keys`` until the wrapped key arrives; ``download`` without any bases or results message."""

    keys: float | None = None
    upload: float | None = None
    download: float | None = None


@dataclass(frozen=True)
class PretrainLimits:
    """Resource limits, checked before work of that size starts.

    Attributes:
        max_dim: largest feature dimension a client may announce.
        max_nodes: most nodes in the session (all clients together).
        max_neighbours: largest attention neighbourhood (``n``; the matrix variant's encodings grow
            as ``4 n^2`` rows per node).
        max_bases_bytes: the server's memory for the bases it draws (``p`` and ``q``, float64).
        max_encoding_bytes: a client's memory for its decrypted encodings.
    """

    max_dim: int = 1 << 16
    max_nodes: int = MAX_NODES
    max_neighbours: int = 1 << 12
    max_bases_bytes: int = 4 * GiB
    max_encoding_bytes: int = 8 * GiB


def _bases_bytes(variant: str, sizes: np.ndarray, embed_factor: int) -> int:
    """Bytes of the float64 bases the server draws for nodes with neighbourhood ``sizes``."""
    n = sizes.astype(np.float64)
    m = embed_factor * n if variant == "vector" else 2 * n
    return int((m * n * 8 * (1 if variant == "vector" else 2)).sum())


@dataclass(frozen=True)
class PretrainConfig:
    """Session parameters every party agrees on out of band, with the roster.

    Attributes:
        session: the session id (u64) every message is bound to; also the wrapped key's round id.
        variant: "vector" or "matrix" encodings.
        preset: CKKS preset name (:data:`fedgat.crypto.PRESETS`).
        chunks: feature chunks per node in the slot layout; None picks
            :meth:`~fedgat.crypto.SlotLayout.for_dimension` (3 chunks for Cora at n4096).
        embed_factor: vector variant's ``m = embed_factor * n``.
        dp: differential privacy of the features shared across clients (:class:`fedgat.dp.FeatureDP`;
            None: off). With it every client uploads its nodes' clean projected rows *and* their
            release, and a client's encodings read its own clean rows and every other node's release.
            Every party must hold the same terms: they are exchanged (:class:`PrivacyTerms`) and a
            mismatch is refused (:class:`~fedgat.protocols.errors.ConfigMismatchError`).
    """

    session: int
    variant: str = "vector"
    preset: str = DEFAULT_PRESET
    chunks: int | None = None
    embed_factor: int = 1
    dp: FeatureDP | None = None

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown variant {self.variant!r}")
        if not 0 <= self.session < 2**64:
            raise ValueError("session must be a u64")
        if self.dp is not None and not isinstance(self.dp, FeatureDP):
            raise TypeError(f"dp must be a FeatureDP or None, not {type(self.dp).__name__}")

    @property
    def copies(self) -> int:
        """Uploaded copies of each owned node: 2 with DP (clean and release), else 1."""
        return 1 if self.dp is None else 2

    def dp_fields(self) -> dict:
        """The :class:`PrivacyTerms` fields of :attr:`dp` (which must be set)."""
        assert self.dp is not None
        return {"epsilon": float(self.dp.epsilon), "delta": float(self.dp.delta),
                "dim": 0 if self.dp.dim is None else int(self.dp.dim), "seed": int(self.dp.seed)}

    def check_terms(self, msg: PrivacyTerms, who: str) -> None:
        """Refuse announced DP terms that differ from :attr:`dp` (or any terms without DP).

        Raises:
            ConfigMismatchError: the terms differ.
        """
        got = {"epsilon": msg.epsilon, "delta": msg.delta, "dim": msg.dim, "seed": msg.seed}
        if self.dp is None:
            raise ConfigMismatchError(f"{who} runs the session with DP terms {got}; this party runs it without DP")
        if got != self.dp_fields():
            raise ConfigMismatchError(f"{who} runs the session with DP terms {got}, not {self.dp_fields()}")

    def layout(self, d: int, slots: int) -> SlotLayout:
        if self.chunks is None:
            return SlotLayout.for_dimension(d, slots)
        return SlotLayout(d, slots, self.chunks)

    def rows_per_node(self, n: int, ship_m2: bool = False) -> int:
        """Computed rows ``R`` of a node with ``n`` neighbours (all but :math:`h_i`). ``ship_m2``:
        as in the paper's protocol, which also computes the matrix variant's ``m^2`` rows of ``M2``
        (this one lets clients derive them, :meth:`fedgat.encodings.BucketBases.m2_map`)."""
        m = self.embed_factor * n if self.variant == "vector" else 2 * n
        return m + m * m if self.variant == "matrix" and ship_m2 else m


def validate_features(features: np.ndarray, rows: int, dim: int | None = None,
                      tol: float = NORM_TOLERANCE) -> np.ndarray:
    """Check a client's feature rows before they are encrypted: shape ``(rows, dim)``, finite, each
    row of unit L2 norm within ``tol`` (or exactly zero). Returns them as float64.

    Raises:
        PayloadError: any violation.
    """
    arr = np.asarray(features, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] != rows or (dim is not None and arr.shape[1] != dim):
        want = f"({rows}, {dim if dim is not None else 'd'})"
        raise PayloadError(f"features have shape {arr.shape}, expected {want}")
    if arr.shape[1] < 1:
        raise PayloadError("features need at least one dimension")
    if not np.all(np.isfinite(arr)):
        raise PayloadError("features hold NaN or infinite values")
    norms = np.linalg.norm(arr, axis=1)
    bad = np.flatnonzero((np.abs(norms - 1.0) > tol) & (norms != 0))
    if len(bad):
        raise PayloadError(f"{len(bad)} feature rows are not unit-norm (e.g. row {bad[0]}: {norms[bad[0]]:.6f})")
    return arr


def needed_from_neighbourhoods(owned: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """A client's needed nodes for a 2-layer model: ``owned`` (sorted), then the sorted other nodes in
    its owned nodes' neighbourhoods (= :attr:`fedgat.partition.ClientPartition.needed`)."""
    owned = np.asarray(owned, dtype=np.int64)
    return np.concatenate([owned, np.setdiff1d(np.asarray(indices, dtype=np.int64), owned)])


def client_bucket_views(buckets: Sequence[BucketBases], needed: np.ndarray,
                        max_elems: int = 1 << 20) -> list[tuple[int, BucketBases]]:
    """One client's buckets cut from the server's global ``buckets``: the nodes it needs, ``rows`` =
    positions in ``needed``, split so that ``p`` holds at most ``max_elems`` reals. Returns
    ``(global bucket index, view)`` pairs in global order (the order the server sends them)."""
    needed = np.asarray(needed, dtype=np.int64)
    order = np.argsort(needed, kind="stable")
    ids = needed[order]
    views = []
    for g, b in enumerate(buckets):
        at = np.minimum(np.searchsorted(ids, b.nodes), len(ids) - 1)
        sel = np.flatnonzero(ids[at] == b.nodes)
        position = order[at]
        per = max(1, max_elems // (b.m * b.n))
        for start in range(0, len(sel), per):
            s = sel[start : start + per]
            views.append((g, BucketBases(b.variant, position[s], b.nodes[s], b.neighbours[s],
                                         b.p[s], None if b.q is None else b.q[s])))
    return views


def _crypto_error(exc: Exception, what: str) -> Exception:
    """Translate a :mod:`fedgat.crypto` error about received bytes into a protocol error."""
    if isinstance(exc, KeyMismatchError):
        return KeyFingerprintError(f"{what}: {exc}")
    return PayloadError(f"{what}: {exc}")


# ======================================================================================== server
class ServerState(enum.Enum):
    COLLECTING = "collecting"  # keys, graph, public context, uploads
    COMPUTING = "computing"  # streaming encrypted encodings (step)
    DONE = "done"
    ABORTED = "aborted"


class ServerPretrain(Party):
    """The server of the pre-training round: relays keys, spools uploads, computes and streams the
    encrypted encodings. Holds no secret key (:attr:`context` is a :class:`ServerContext`).

    Args:
        party_id, roster, config, identity: the server's id and keys, the roster, the session.
        bases_rng: randomness of the bases (None: a fresh CSPRNG key; pass a seeded
            :class:`~fedgat.randomness.RandomSource` only to compare with a plaintext twin).
        spool_dir: where uploads are spooled (None: a temporary directory, removed at the end).
        result_batch_bytes: target size of an EncodingResults message.
        workers: processes for the homomorphic compute (0: in this process;
            :class:`fedgat.crypto.encodings.ParallelEncoder` otherwise; None: ``os.cpu_count()`` when
            the round has at least :data:`AUTO_POOL_MIN_NODES` nodes and the machine more than one
            core, else in this process -- a spawned pool costs seconds to start).
        max_bucket_elems: largest ``p`` array of one EncodingBases message (buckets are split).
        timeouts: the server's phase deadlines (``keys``, ``upload``).
        limits: refuse announcements above these (:class:`PretrainLimits`).
    """

    def __init__(self, party_id: int, roster: Roster, config: PretrainConfig, identity: Identity, *,
                 bases_rng: RandomSource | None = None, spool_dir: str | None = None,
                 result_batch_bytes: int = 16 * MiB, workers: int | None = None, max_bucket_elems: int = 1 << 20,
                 timeouts: PretrainTimeouts | None = None, limits: PretrainLimits | None = None) -> None:
        super().__init__(party_id, roster, config.session, identity.signer)
        self.timeouts = timeouts if timeouts is not None else PretrainTimeouts()
        self.limits = limits if limits is not None else PretrainLimits()
        #: clients still in the round (those dropped after a deadline are removed)
        self.participants: list[int] = list(roster.clients)
        #: clients dropped after a deadline, with the phase
        self.dropped: dict[int, str] = {}
        self._bases_bytes = 0
        self._keys_complete = False
        if party_id != roster.server:
            raise ValueError("the server's party id must be the roster's server")
        self.config = config
        self.state = ServerState.COLLECTING
        self._bases_rng = bases_rng if bases_rng is not None else RandomSource()
        self._spool_dir = spool_dir
        self._result_batch_bytes = result_batch_bytes
        self._workers = workers
        self._max_bucket_elems = max_bucket_elems
        self.context: ServerContext | None = None
        self.layout: SlotLayout | None = None
        self._spool: CiphertextSpool | None = None
        self._dim: int | None = None
        self._graphs: dict[int, GraphAnnounce] = {}
        self._owner: dict[int, int] = {}
        self._relayed_keys: set[int] = set()
        self._relayed_wraps: set[int] = set()
        self._received: dict[int, set[tuple[int, int]]] = {c: set() for c in roster.clients}
        self._uploaded_done: set[int] = set()
        self._terms: set[int] = set()  # clients whose DP terms matched (DP sessions)
        # compute phase
        #: the drawn bases, one per needed node (what clients receive views of)
        self.bases: list[BucketBases] = []
        #: what the encoders compute (:func:`fedgat.crypto.encodings.plan_views`): without DP the
        #: drawn bases themselves; with DP one result per distinct view of a node, sources as spool keys
        self.buckets: list[BucketBases] = []
        self._results: Iterator[tuple[int, NodeResult]] | None = None
        self._encoder = None
        self._recipients: list[tuple[int, ...]] = []
        self._route: dict[int, dict[int, int]] = {}  # client -> node -> client bucket index
        self._remaining: dict[tuple[int, int], int] = {}
        self._pending: dict[tuple[int, int], list[ResultItem]] = {}
        self._pending_bytes: dict[tuple[int, int], int] = {}
        self._client_buckets: dict[int, int] = {}
        self._needed: dict[int, np.ndarray] = {}
        #: statistics
        self.nodes_total = 0
        self.nodes_computed = 0
        self.multiply_adds = 0
        self.result_ciphertexts = 0
        self.result_rows = 0
        #: ``time.perf_counter()`` when the compute phase began and when its last result was out
        self.compute_started: float | None = None
        self.compute_finished: float | None = None
        #: benchmarks: keep the encoder and spool after the round for :meth:`replay_compute`
        self.keep_encoder = False
        self._closed = False

    @property
    def done(self) -> bool:
        return self.state is ServerState.DONE

    @property
    def ciphertexts_received(self) -> int:
        """Uploaded ciphertexts accepted so far."""
        return sum(len(s) for s in self._received.values())

    @property
    def has_secret_key(self) -> bool:
        """Read from the server's own TenSEAL context (False by construction)."""
        return bool(self.context is not None and self.context.tenseal.has_secret_key())

    def _snapshot(self) -> dict:
        return {
            "context": None if self.context is None else self.context.fingerprint(),
            "dim": self._dim,
            "graphs": tuple(sorted(self._graphs)),
            "owners": len(self._owner),
            "relayed_keys": tuple(sorted(self._relayed_keys)),
            "relayed_wraps": tuple(sorted(self._relayed_wraps)),
            "received": tuple((c, tuple(sorted(s))) for c, s in sorted(self._received.items())),
            "spooled_bytes": 0 if self._spool is None else self._spool.bytes_stored,
            "uploaded_done": tuple(sorted(self._uploaded_done)),
            "terms": tuple(sorted(self._terms)),
            "nodes_computed": self.nodes_computed,
            "participants": tuple(self.participants),
            "bases_bytes": self._bases_bytes,
            "keys_complete": self._keys_complete,
        }

    def _handler(self, msg: Message) -> Handler | None:
        if self.state is not ServerState.COLLECTING:
            return None
        return {KeyAnnounce: self._on_key_announce, PublicContext: self._on_public_context,
                WrappedKeyDelivery: self._on_wrapped_key, GraphAnnounce: self._on_graph,
                FeatureUpload: self._on_upload, ReleaseUpload: self._on_release,
                UploadDone: self._on_upload_done, PrivacyTerms: self._on_terms,
                Abort: self._on_abort}.get(type(msg))

    def _require_client(self, msg: Message) -> None:
        if not self.roster.is_client(msg.sender):
            raise AuthError(f"{msg.type_name} must come from a client, not party {msg.sender}")
        if msg.sender in self.dropped:
            raise StateError(f"party {msg.sender} was dropped after the {self.dropped[msg.sender]} deadline")

    # --- deadlines ------------------------------------------------------------------------------------
    def start(self) -> list[Message]:
        """Arms the ``keys`` deadline (the server sends nothing first)."""
        self._arm("keys", self.timeouts.keys)
        return []

    def _keys_missing(self) -> list[int]:
        """Parties the keys phase still waits for (the dealer when it holds back the context or a
        wrapped key of an announced client)."""
        missing = {c for c in self.participants if c not in self._graphs}
        others = [c for c in self.participants if c != self.roster.dealer]
        missing |= {c for c in others if c not in self._relayed_keys}
        if self.context is None or any(c in self._relayed_keys and c not in self._relayed_wraps for c in others):
            missing.add(self.roster.dealer)
        return sorted(missing)

    def _after_key_event(self) -> list[Message]:
        """Move from the keys phase to the upload phase once nothing is missing."""
        if not self._keys_complete and not self._keys_missing():
            self._keys_complete = True
            self._disarm("keys")
            self._arm("upload", self.timeouts.upload)
        return []

    def _expired(self, phase: str) -> list[Message]:
        if self.state is not ServerState.COLLECTING:
            return []
        if phase == "keys":
            missing = self._keys_missing()
        else:
            missing = [c for c in self.participants if c not in self._uploaded_done]
        if not missing:
            return []
        reason = self._unsound_without(missing)
        if reason is not None:
            error = MissingPartyError(f"pre-training phase {phase!r} timed out: {reason}", phase=phase,
                                      missing=missing)
            self.failure = error
            return self._abort(AbortCode.TIMEOUT, str(error))
        out = [self._new(Abort, c, code=int(AbortCode.TIMEOUT),
                         reason=f"dropped: no answer before the {phase} deadline") for c in missing]
        self.participants = [c for c in self.participants if c not in missing]
        self.dropped.update((c, phase) for c in missing)
        if phase == "keys":
            self._keys_complete = True
            self._arm("upload", self.timeouts.upload)
        if set(self.participants) <= self._uploaded_done:
            out += self._begin_compute()
        return out

    def _unsound_without(self, missing: list[int]) -> str | None:
        """Why the round cannot go on without ``missing`` (None: it can)."""
        if self.roster.dealer in missing:
            return f"the dealer (party {self.roster.dealer}) did not provide the key; missing parties {missing}"
        keep = [c for c in self.participants if c not in missing]
        if not keep:
            return f"no client is left; missing parties {missing}"
        nodes = self._shortfall(keep)
        if len(nodes):
            owners = sorted({self._owner[int(n)] for n in nodes if int(n) in self._owner})
            named = owners if owners else missing
            return (f"{len(nodes)} nodes needed by the remaining clients (e.g. node {int(nodes[0])}) belong to "
                    f"missing parties {named}")
        return None

    def _shortfall(self, keep: list[int]) -> np.ndarray:
        """Nodes the clients ``keep`` need (their nodes and neighbours) that none of them owns."""
        graphs = [self._graphs[c] for c in keep if c in self._graphs]
        if len(graphs) < len(keep):
            return np.zeros(0, np.int64)  # graphs still to come: judged at the next deadline
        needed = np.unique(np.concatenate([g.indices for g in graphs]))
        return np.setdiff1d(needed, np.concatenate([g.owned for g in graphs]))

    # --- keys ----------------------------------------------------------------------------------------
    def _on_key_announce(self, msg: KeyAnnounce) -> list[Message]:
        self._require_client(msg)
        if msg.sender == self.roster.dealer:
            raise AuthError("the dealer holds the key and announces no wrapping key")
        if msg.party != msg.sender:
            raise PayloadError(f"party {msg.sender} announces keys for party {msg.party}")
        if msg.ed25519 != self.roster.signing_key(msg.party):
            raise AuthError(f"announced Ed25519 key of party {msg.party} is not the roster's")
        _check_binding(msg, self.session)
        if msg.party in self._relayed_keys:
            raise StateError(f"party {msg.party} has already announced its keys")
        self._relayed_keys.add(msg.party)
        self._after_key_event()
        return [self._new(KeyAnnounce, self.roster.dealer, party=msg.party, x25519=msg.x25519,
                          ed25519=msg.ed25519, binding_signature=msg.binding_signature)]

    def _on_public_context(self, msg: PublicContext) -> list[Message]:
        if msg.sender != self.roster.dealer:
            raise AuthError(f"only the dealer sends the public context, not party {msg.sender}")
        if self.context is not None:
            raise StateError("the public context has already been received")
        if msg.preset != self.config.preset:
            raise PayloadError(f"context preset {msg.preset!r} is not the session's {self.config.preset!r}")
        try:
            ctx = ServerContext.from_bytes(msg.context, presets=[self.config.preset])
        except ContextFormatError as exc:  # NotPublicContextError included: a secret key is refused
            raise PayloadError(f"public context refused: {exc}") from exc
        if ctx.fingerprint() != msg.context_fingerprint:
            raise KeyFingerprintError("loaded context has another fingerprint")
        self.context = ctx
        self.verifier.fingerprint = ctx.fingerprint()
        self._maybe_open_spool()
        return self._after_key_event()

    def _on_wrapped_key(self, msg: WrappedKeyDelivery) -> list[Message]:
        if msg.sender != self.roster.dealer:
            raise AuthError(f"only the dealer sends wrapped keys, not party {msg.sender}")
        if self.context is None:
            raise StateError("a wrapped key before the public context")
        if msg.dealer != msg.sender or msg.target == msg.sender or not self.roster.is_client(msg.target):
            raise PayloadError(f"wrapped key from {msg.dealer} for {msg.target} is misaddressed")
        if msg.target in self._relayed_wraps:
            raise StateError(f"a wrapped key for party {msg.target} has already been relayed")
        try:
            aad = WrappedKey.from_bytes(msg.wrapped).aad
        except KeyUnwrapError as exc:
            raise PayloadError(f"malformed wrapped key: {exc}") from exc
        if aad != WrapAAD(str(msg.dealer), str(msg.target), self.session, msg.key_fingerprint):
            raise PayloadError("wrapped key is bound to other parties, session or key")
        if msg.target in self.dropped:
            raise StateError(f"party {msg.target} was dropped; its wrapped key is not relayed")
        self._relayed_wraps.add(msg.target)
        self._after_key_event()
        return [self._new(WrappedKeyDelivery, msg.target, dealer=msg.dealer, target=msg.target,
                          key_fingerprint=msg.key_fingerprint, wrapped=msg.wrapped)]

    # --- graph and uploads ------------------------------------------------------------------------
    def _on_graph(self, msg: GraphAnnounce) -> list[Message]:
        self._require_client(msg)
        if msg.sender in self._graphs:
            raise StateError(f"party {msg.sender} has already announced its graph")
        dp = self.config.dp
        if dp is not None and msg.sender not in self._terms:
            raise ConfigMismatchError(f"party {msg.sender} announces its graph without the session's DP terms")
        if dp is not None and dp.dim is not None and msg.dim > dp.dim:
            raise ConfigMismatchError(f"party {msg.sender} announces {msg.dim}-dim features; the session's DP "
                                      f"release projects to {dp.dim} dims")
        if self._dim is not None and msg.dim != self._dim:
            raise PayloadError(f"feature dimension {msg.dim} differs from the session's {self._dim}")
        bases_bytes = self._check_graph_limits(msg)
        clash = [int(n) for n in msg.owned if int(n) in self._owner]
        if clash:
            raise PayloadError(f"nodes {clash[:5]} are already owned by party {self._owner[clash[0]]}")
        self._graphs[msg.sender] = msg
        self._owner.update((int(n), msg.sender) for n in msg.owned)
        self._dim = msg.dim
        self._bases_bytes += bases_bytes
        self._maybe_open_spool()
        return self._after_key_event()

    def _check_graph_limits(self, msg: GraphAnnounce) -> int:
        """Refuse a graph above :attr:`limits` before anything is sized by it; returns the bytes of
        the bases its nodes will need."""
        lim = self.limits
        if msg.dim > lim.max_dim:
            raise SizeLimitError(f"party {msg.sender} announces dimension {msg.dim}; the limit is {lim.max_dim}")
        if len(self._owner) + len(msg.owned) > lim.max_nodes:
            raise SizeLimitError(f"party {msg.sender}'s {len(msg.owned)} nodes take the session above "
                                 f"{lim.max_nodes} nodes")
        sizes = np.diff(msg.indptr)
        if sizes.max() > lim.max_neighbours:
            raise SizeLimitError(f"party {msg.sender} announces a neighbourhood of {int(sizes.max())} nodes; "
                                 f"the limit is {lim.max_neighbours}")
        need = _bases_bytes(self.config.variant, sizes, self.config.embed_factor)
        if self._bases_bytes + need > lim.max_bases_bytes:
            raise SizeLimitError(f"the bases of party {msg.sender}'s nodes take the server's memory to "
                                 f"{self._bases_bytes + need} bytes; the limit is {lim.max_bases_bytes}")
        return need

    def _maybe_open_spool(self) -> None:
        if self._spool is None and self.context is not None and self._dim is not None:
            self.layout = self.config.layout(self._dim, self.context.slots)
            self._spool = CiphertextSpool(self.context, self.layout, self._spool_dir)

    def _uploading(self, msg: Message) -> GraphAnnounce:
        self._require_client(msg)
        if self._spool is None:
            raise StateError(f"{msg.type_name} before the public context")
        graph = self._graphs.get(msg.sender)
        if graph is None:
            raise StateError(f"{msg.type_name} from party {msg.sender} before its graph announcement")
        if msg.sender in self._uploaded_done:
            raise StateError(f"party {msg.sender} has already finished uploading")
        if self.config.dp is not None and msg.sender not in self._terms:
            raise ConfigMismatchError(f"party {msg.sender} uploads without the session's DP terms")
        return graph

    def _on_terms(self, msg: PrivacyTerms) -> list[Message]:
        self._require_client(msg)
        self.config.check_terms(msg, f"party {msg.sender}")
        if msg.sender in self._terms:
            raise StateError(f"party {msg.sender} has already announced its DP terms")
        self._terms.add(msg.sender)
        return []

    def _on_release(self, msg: ReleaseUpload) -> list[Message]:
        if self.config.dp is None:
            raise ConfigMismatchError(f"party {msg.sender} uploads a DP release; the session runs without DP")
        return self._store_uploads(msg, release=True)

    def _on_upload(self, msg: FeatureUpload) -> list[Message]:
        return self._store_uploads(msg, release=False)

    def _store_uploads(self, msg: FeatureUpload | ReleaseUpload, release: bool) -> list[Message]:
        """Check every item of an upload batch, then spool them (a release under
        :func:`~fedgat.crypto.encodings.release_key`)."""
        self._uploading(msg)
        assert self._spool is not None and self.context is not None and self.layout is not None
        received = self._received[msg.sender]
        keys = set()
        what = "release" if release else "upload"
        for item in msg.items:
            key = (release_key(item.node) if release else item.node, item.chunk)
            if self._owner.get(item.node) != msg.sender:
                raise PayloadError(f"party {msg.sender} uploads node {item.node}, which it does not own")
            if item.chunk >= self.layout.chunks:
                raise PayloadError(f"chunk {item.chunk} out of range ({self.layout.chunks} chunks)")
            if key in received or key in keys:
                raise PayloadError(f"duplicate {what} of node {item.node} chunk {item.chunk}")
            keys.add(key)
        for item in msg.items:  # every ciphertext is checked before any is stored
            try:
                deserialize(self.context, item.ciphertext, level="fresh")
            except (CiphertextFormatError, KeyMismatchError) as exc:
                raise _crypto_error(exc, f"{what} of node {item.node} chunk {item.chunk}") from exc
        for item in msg.items:  # checked just above: not deserialised a second time
            node = release_key(item.node) if release else item.node
            self._spool.put(node, item.chunk, item.ciphertext, validated=True)
        received.update(keys)
        return []

    def _on_upload_done(self, msg: UploadDone) -> list[Message]:
        graph = self._uploading(msg)
        assert self.layout is not None
        want = len(graph.owned) * self.layout.chunks * self.config.copies
        got = len(self._received[msg.sender])
        if got != want or msg.ciphertexts != got or msg.nodes != len(graph.owned):
            raise PayloadError(f"party {msg.sender} reports {msg.nodes} nodes / {msg.ciphertexts} "
                               f"ciphertexts; the server holds {got} of {want}")
        self._uploaded_done.add(msg.sender)
        if set(self.participants) <= self._uploaded_done:
            return self._begin_compute()
        return []

    def _on_abort(self, msg: Abort) -> list[Message]:
        self._require_client(msg)
        return self._abort(AbortCode.CANCELLED, f"client {msg.sender} aborted: {msg.reason}",
                           skip=msg.sender)

    def _abort(self, code: AbortCode, reason: str, skip: int | None = None) -> list[Message]:
        self.state = ServerState.ABORTED
        self.abort_reason = reason
        self._disarm("keys", "upload")
        self._close()
        return [self._new(Abort, c, code=int(code), reason=reason[:1000]) for c in self.participants if c != skip]

    # --- compute ------------------------------------------------------------------------------------
    def _begin_compute(self) -> list[Message]:
        assert self.context is not None and self.layout is not None and self._spool is not None
        self._disarm("keys", "upload")
        missing = self._shortfall(self.participants)
        if len(missing):
            return self._abort(AbortCode.GRAPH_INCONSISTENT,
                               f"{len(missing)} neighbours are owned by no client (e.g. node {int(missing[0])})")
        self.compute_started = time.perf_counter()
        with self.clock("server_compute"):
            self._needed = {c: needed_from_neighbourhoods(self._graphs[c].owned, self._graphs[c].indices)
                            for c in self.participants}
            nodes = np.unique(np.concatenate(list(self._needed.values())))
            # neighbourhood rows over positions in `nodes` (ids may be sparse u32 values); the
            # positions keep the ids' order, so the draws equal those over global ids
            rows: list[np.ndarray] = [np.zeros(0, np.int64)] * len(nodes)
            for g in (self._graphs[c] for c in self.participants):
                for k, pos in enumerate(np.searchsorted(nodes, g.owned)):
                    rows[int(pos)] = g.indices[g.indptr[k] : g.indptr[k + 1]]
            drawn = draw_bases(self.config.variant, CSR.from_rows(rows), np.arange(len(nodes)), self._bases_rng,
                               embed_factor=self.config.embed_factor)
            self.bases = [BucketBases(b.variant, b.rows, nodes[b.nodes], b.neighbours, b.p, b.q) for b in drawn]
            plan = self._plan()
            self.buckets, self._recipients = plan.buckets, plan.recipients
            out: list[Message] = []
            if self.config.dp is not None:  # confirm the terms before anything built on them
                out += [self._new(PrivacyTerms, c, **self.config.dp_fields()) for c in self.participants]
            for c in self.participants:
                views = client_bucket_views(self.bases, self._needed[c], self._max_bucket_elems)
                route = self._route.setdefault(c, {})
                for cb, (_, view) in enumerate(views):
                    route.update((int(n), cb) for n in view.nodes)
                    self._remaining[(c, cb)] = len(view)
                    out.append(self._new(EncodingBases, c, bucket=cb, variant=view.variant, n=view.n,
                                         nodes=view.nodes, p=view.p, q=view.q))
                self._client_buckets[c] = len(views)
            self.nodes_total = plan.num_results
            self.multiply_adds = sum(multiply_adds(b, self.layout) for b in self.buckets)
            self._results = self._compute_results()
        self.state = ServerState.COMPUTING
        return out

    def _plan(self) -> ViewPlan:
        """Which encodings to compute for whom (:func:`fedgat.crypto.encodings.plan_views`): with DP,
        each client's view reads its own clean uploads and every other client's release."""
        pair_nodes = np.concatenate([self._needed[c] for c in self.participants])
        pair_clients = np.repeat(self.participants, [len(self._needed[c]) for c in self.participants])
        if self.config.dp is None:
            return plan_views(self.bases, pair_nodes, pair_clients)
        owned = [self._graphs[c].owned for c in self.participants]
        ids = np.concatenate(owned)
        owners = np.repeat(self.participants, [len(o) for o in owned])
        order = np.argsort(ids, kind="stable")
        return plan_views(self.bases, pair_nodes, pair_clients, ids[order], owners[order])

    @property
    def workers(self) -> int:
        """Processes of the homomorphic compute (0: in this process); see the ``workers`` argument."""
        if self._workers is not None:
            return self._workers
        cores = os.cpu_count() or 1
        return cores if cores > 1 and self.nodes_total >= AUTO_POOL_MIN_NODES else 0

    def _compute_results(self) -> Iterator[tuple[int, NodeResult]]:
        assert self.context is not None and self.layout is not None and self._spool is not None
        if self.workers > 0:
            from fedgat.crypto.encodings import ParallelEncoder

            self._encoder = ParallelEncoder(self.context.public_context_bytes(), self.layout, self._spool,
                                            workers=self.workers)
            for g, result in zip((g for g, b in enumerate(self.buckets) for _ in range(len(b))),
                                 self._encoder.map(self.buckets)):
                yield g, result
            return
        for g, bases in enumerate(self.buckets):
            for slot in range(len(bases)):
                yield g, compute_node(self.context, self.layout, self._spool, bases, slot)

    def has_work(self) -> bool:
        return self.state is ServerState.COMPUTING

    def step(self) -> list[Message]:
        """Compute nodes until at least one results batch is ready; the last step ends the round."""
        if self.state is not ServerState.COMPUTING:
            return []
        assert self._results is not None and self.layout is not None
        out: list[Message] = []
        while not out:
            with self.clock("server_compute"):
                nxt = next(self._results, None)
            if nxt is None:
                out.extend(self._new(EncodingsDone, c, buckets=self._client_buckets[c],
                                     nodes=len(self._needed[c])) for c in self.participants)
                self.state = ServerState.DONE
                self.compute_finished = time.perf_counter()
                if not self.keep_encoder:
                    self._close()
                break
            g, result = nxt
            node = result.node
            self.nodes_computed += 1
            self.result_ciphertexts += len(result.row_blobs)
            self.result_rows += self.buckets[g].num_feature_rows()
            item = ResultItem(node, tuple(result.row_blobs))
            for c in self._recipients[self.nodes_computed - 1]:
                cb = self._route[c][node]
                key = (c, cb)
                self._pending.setdefault(key, []).append(item)
                self._pending_bytes[key] = self._pending_bytes.get(key, 0) + item.nbytes()
                self._remaining[key] -= 1
                if self._remaining[key] == 0 or self._pending_bytes[key] >= self._result_batch_bytes:
                    out.append(self._new(EncodingResults, c, bucket=cb, items=tuple(self._pending.pop(key))))
                    self._pending_bytes.pop(key)
        return out

    def replay_compute(self) -> ReplayTiming:
        """Benchmarks: compute every result again with nothing else running (results are discarded).

        In the round the clients' downloads and decryptions share this machine's cores with the
        server; here they are idle, as on a server of its own. Needs :attr:`keep_encoder` set before
        the round; closes the encoder and spool afterwards. The round's worker pool is shut down
        before the clock starts, so the CPU seconds returned are the replay's alone.
        """
        if self.state is not ServerState.DONE or not self.keep_encoder or self._spool is None or self._closed:
            raise RuntimeError("replay_compute needs a finished round with keep_encoder set")
        try:
            if self._encoder is not None:
                self._encoder.close()
                self._encoder = None
            wall0, cpu0, children0 = time.perf_counter(), time.process_time(), children_cpu_seconds()
            for _ in self._compute_results():
                pass
            if self._encoder is not None:  # reap the workers so their CPU is counted
                self._encoder.close()
                self._encoder = None
            return ReplayTiming(wall=time.perf_counter() - wall0, cpu=time.process_time() - cpu0,
                                worker_cpu=children_cpu_seconds() - children0)
        finally:
            self._close()

    def close(self) -> None:
        """Release the worker pool and the spool (idempotent)."""
        self._close()

    def _close(self) -> None:
        if self._encoder is not None:
            self._encoder.close()
            self._encoder = None
        if self._spool is not None and not self._closed:
            self._spool.close()
        self._closed = True


@dataclass(frozen=True)
class ReplayTiming:
    """:meth:`ServerPretrain.replay_compute`: wall seconds, this process's CPU seconds, and the CPU
    seconds of the worker processes (reaped children)."""

    wall: float
    cpu: float
    worker_cpu: float


def _check_binding(msg: KeyAnnounce, session: int) -> None:
    try:
        verify_signature(msg.ed25519, key_binding_bytes(session, msg.party, msg.x25519, msg.ed25519),
                         msg.binding_signature)
    except CryptoSignatureError as exc:
        raise SignatureError(f"party {msg.party}'s key binding signature is invalid") from exc


# ======================================================================================== clients
class ClientState(enum.Enum):
    NEW = "new"
    AWAIT_KEY = "await-key"
    UPLOADING = "uploading"
    AWAIT_ENCODINGS = "await-encodings"
    DONE = "done"
    ABORTED = "aborted"


@dataclass
class _Assembly:
    """One bucket of a client's encodings while its results arrive."""

    bases: BucketBases
    rows: torch.Tensor  # (B, R + 1, d)
    filled: np.ndarray  # (B,) bool
    slot: dict[int, int]  # node -> position in the bucket


class ClientPretrain(Party):
    """A client of the pre-training round (not the dealer: see :class:`DealerSide`).

    Args:
        party_id, roster, config, identity: identity (Ed25519 signer, X25519 wrapping key) and session.
        owned: sorted global ids of the client's nodes.
        features: ``(len(owned), d)`` unit-norm rows (checked: :func:`validate_features`).
        indptr, indices: the owned nodes' attention neighbourhoods (CSR over ``owned``, self first).
        needed: the nodes whose encodings the client receives (owned first; default
            :func:`needed_from_neighbourhoods`).
        dtype: dtype of the decrypted encodings.
        upload_batch: nodes per FeatureUpload message.
        timeouts: the client's deadlines (``keys``, ``download``).
        limits: ``max_neighbours`` and ``max_encoding_bytes`` bound what the server's bases may make
            this client allocate.
        release_rng: with ``config.dp``, the randomness of this client's DP release noise
            (:meth:`fedgat.dp.FeatureDP.release_rows`): None (default) draws a fresh CSPRNG key; a
            :class:`~fedgat.randomness.RandomSource` or int seed only for tests and plaintext twins.
            The release is drawn once, here, by the owner; the server never sees noise or features.

    With ``config.dp`` the client projects its ``features`` (any finite rows), uploads the clean
    projection in FeatureUpload and the release in ReleaseUpload, announces its
    :class:`PrivacyTerms` before the first upload and refuses bases before the server confirmed the
    same terms; its own encodings' :math:`h_i` are its clean projected rows.

    Raises:
        PayloadError: invalid features or neighbourhoods (nothing is sent).
    """

    def __init__(self, party_id: int, roster: Roster, config: PretrainConfig, identity: Identity, *,
                 owned: np.ndarray, features: np.ndarray, indptr: np.ndarray, indices: np.ndarray,
                 needed: np.ndarray | None = None, dtype: torch.dtype = torch.float32,
                 upload_batch: int = 32, timeouts: PretrainTimeouts | None = None,
                 limits: PretrainLimits | None = None, release_rng: RandomSource | int | None = None) -> None:
        super().__init__(party_id, roster, config.session, identity.signer)
        self.timeouts = timeouts if timeouts is not None else PretrainTimeouts()
        self.limits = limits if limits is not None else PretrainLimits()
        self._encoding_bytes = 0
        if party_id not in roster.clients:
            raise ValueError(f"party {party_id} is not a client of the roster")
        self.config = config
        self._wrapping = identity.wrapping
        owned = np.asarray(owned, dtype=np.int64)
        self._release: np.ndarray | None = None
        self._terms_confirmed = False
        if config.dp is None:
            self._features = validate_features(features, len(owned))
        else:  # any finite rows: the projection normalises them
            raw = validate_features(features, len(owned), tol=np.inf)
            clean, self._release = config.dp.release_rows(raw, release_rng)
            self._features = validate_features(clean, len(owned))
        self._graph = GraphAnnounce(sender=party_id, recipient=roster.server, session=config.session, seq=0,
                                    dim=self._features.shape[1], owned=owned,
                                    indptr=np.asarray(indptr, dtype=np.int64),
                                    indices=np.asarray(indices, dtype=np.int64))
        self._graph.check()  # PayloadError for bad neighbourhoods
        self.owned = owned
        self.needed = (needed_from_neighbourhoods(owned, self._graph.indices) if needed is None
                       else np.asarray(needed, dtype=np.int64))
        if not np.array_equal(self.needed[: len(owned)], owned):
            raise PayloadError("needed must start with the owned nodes")
        self._position = {int(n): i for i, n in enumerate(self.needed)}
        self._degree = dict(zip(owned.tolist(), np.diff(self._graph.indptr).tolist()))
        self._own_rows = {int(n): self._features[i] for i, n in enumerate(owned)}
        self.dtype = dtype
        self.upload_batch = upload_batch
        self.state = ClientState.NEW
        self.holder: KeyHolderContext | None = None
        self.layout: SlotLayout | None = None
        self._next_upload = 0
        self._uploaded = 0
        self._assemblies: list[_Assembly] = []
        self._assigned: set[int] = set()
        self.encodings: Encodings | None = None
        self.ciphertexts_decrypted = 0
        self.nodes_decrypted = 0

    @property
    def done(self) -> bool:
        return self.state is ClientState.DONE

    @property
    def dim(self) -> int:
        return int(self._features.shape[1])

    def _snapshot(self) -> dict:
        return {
            "key": None if self.holder is None else self.holder.fingerprint(),
            "next_upload": self._next_upload,
            "buckets": len(self._assemblies),
            "assigned": len(self._assigned),
            "filled": tuple(int(a.filled.sum()) for a in self._assemblies),
            "rows_sum": tuple(float(a.rows.double().sum()) for a in self._assemblies),
            "encodings": self.encodings is not None,
            "encoding_bytes": self._encoding_bytes,
            "terms_confirmed": self._terms_confirmed,
        }

    # --- opening ----------------------------------------------------------------------------------
    def start(self) -> list[Message]:
        if self.state is not ClientState.NEW:
            raise StateError("start() was already called")
        wrapping = self._wrapping
        if not isinstance(wrapping, WrappingIdentity):
            raise TypeError("a client needs an X25519 WrappingIdentity")
        ed = self._signer.public_bytes()
        binding = self._signer.sign(key_binding_bytes(self.session, self.party_id, wrapping.public_bytes(), ed))
        self.state = ClientState.AWAIT_KEY
        self._arm("keys", self.timeouts.keys)
        return [self._new(KeyAnnounce, self.roster.server, party=self.party_id, x25519=wrapping.public_bytes(),
                          ed25519=ed, binding_signature=binding), *self._graph_messages()]

    def _graph_messages(self) -> list[Message]:
        """With DP, this client's :class:`PrivacyTerms` (before anything the server sizes by them);
        then its GraphAnnounce."""
        g = self._graph
        terms = [] if self.config.dp is None else [
            self._new(PrivacyTerms, self.roster.server, **self.config.dp_fields())]
        return [*terms, self._new(GraphAnnounce, self.roster.server, dim=g.dim, owned=g.owned,
                                  indptr=g.indptr, indices=g.indices)]

    def _handler(self, msg: Message) -> Handler | None:
        if isinstance(msg, Abort):
            return None if self.state in (ClientState.DONE, ClientState.ABORTED) else self._on_abort
        return self._handlers().get((self.state, type(msg)))

    def _handlers(self) -> dict:
        return {
            (ClientState.AWAIT_KEY, WrappedKeyDelivery): self._on_wrapped_key,
            (ClientState.AWAIT_ENCODINGS, PrivacyTerms): self._on_terms,
            (ClientState.AWAIT_ENCODINGS, EncodingBases): self._on_bases,
            (ClientState.AWAIT_ENCODINGS, EncodingResults): self._on_results,
            (ClientState.AWAIT_ENCODINGS, EncodingsDone): self._on_done,
        }

    def _from_server(self, msg: Message) -> None:
        if msg.sender != self.roster.server:
            raise AuthError(f"{msg.type_name} must come from the server, not party {msg.sender}")

    def _on_abort(self, msg: Abort) -> list[Message]:
        self._from_server(msg)
        self.state = ClientState.ABORTED
        self.abort_reason = f"server aborted (code {msg.code}): {msg.reason}"
        self._disarm("keys", "download")
        return []

    def _expired(self, phase: str) -> list[Message]:
        """The server (or the dealer behind it) went quiet: give up and say so."""
        if self.state in (ClientState.DONE, ClientState.ABORTED):
            return []
        missing = [self.roster.server] + ([self.roster.dealer] if phase == "keys" else [])
        error = MissingPartyError(f"client {self.party_id}: no {'wrapped key' if phase == 'keys' else 'encodings'} "
                                  f"from the server before the {phase} deadline", phase=phase, missing=missing)
        self.state, self.failure, self.abort_reason = ClientState.ABORTED, error, str(error)
        self._disarm("keys", "download")
        return [self._new(Abort, self.roster.server, code=int(AbortCode.TIMEOUT), reason=str(error))]

    # --- key -----------------------------------------------------------------------------------------
    def _on_wrapped_key(self, msg: WrappedKeyDelivery) -> list[Message]:
        self._from_server(msg)
        if msg.dealer != self.roster.dealer or msg.target != self.party_id:
            raise PayloadError(f"wrapped key from {msg.dealer} for {msg.target} is not for this client")
        expected = WrapAAD(str(self.roster.dealer), str(self.party_id), self.session, msg.key_fingerprint)
        with self.clock("keygen"):
            try:
                holder = KeyHolderContext.from_wrapped(msg.wrapped, self._wrapping, expected,
                                                       dealer_public=self.roster.signing_key(self.roster.dealer),
                                                       presets=[self.config.preset])
            except KeyUnwrapError as exc:
                raise AuthError(f"the wrapped key does not open: {exc}") from exc
            except (KeyMismatchError, ContextFormatError) as exc:
                raise _crypto_error(exc, "wrapped key") from exc
        self._keyed(holder)
        return []

    def _keyed(self, holder: KeyHolderContext) -> None:
        self.holder = holder
        self.verifier.fingerprint = holder.fingerprint()
        self.layout = self.config.layout(self.dim, holder.slots)
        self.state = ClientState.UPLOADING
        self._disarm("keys")

    # --- uploads -------------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.state is ClientState.UPLOADING

    def step(self) -> list[Message]:
        """Encrypt and send the next batch of owned rows (then UploadDone); with DP, each batch's
        release (ReleaseUpload) after its clean rows (FeatureUpload)."""
        if self.state is not ClientState.UPLOADING:
            return []
        assert self.holder is not None and self.layout is not None
        start = self._next_upload
        stop = min(start + self.upload_batch, len(self.owned))
        rows = validate_features(self._features[start:stop], stop - start, self.dim)
        out: list[Message] = []
        copies = [(FeatureUpload, rows)]
        if self._release is not None:
            copies.append((ReleaseUpload, self._release[start:stop]))
        c = self.layout.chunks
        for cls, values in copies:
            with self.clock("encrypt"):
                blobs = list(encrypt_rows(self.holder, values, self.layout))
            items = tuple(UploadItem(int(self.owned[start + k // c]), k % c, blob) for k, blob in enumerate(blobs))
            self._uploaded += len(items)
            out.append(self._new(cls, self.roster.server, items=items))
        self._next_upload = stop
        if stop == len(self.owned):
            out.append(self._new(UploadDone, self.roster.server, nodes=len(self.owned), ciphertexts=self._uploaded))
            self.state = ClientState.AWAIT_ENCODINGS
            self._arm("download", self.timeouts.download)
        return out

    # --- encodings -----------------------------------------------------------------------------------
    def _on_terms(self, msg: PrivacyTerms) -> list[Message]:
        self._from_server(msg)
        self.config.check_terms(msg, "the server")
        if self._terms_confirmed:
            raise StateError("the server has already confirmed the DP terms")
        self._terms_confirmed = True
        return []

    def _on_bases(self, msg: EncodingBases) -> list[Message]:
        self._from_server(msg)
        assert self.layout is not None
        if self.config.dp is not None and not self._terms_confirmed:
            raise ConfigMismatchError("the server sent bases without confirming the session's DP terms")
        cfg = self.config
        if msg.bucket != len(self._assemblies):
            raise PayloadError(f"bucket {msg.bucket} out of order (expected {len(self._assemblies)})")
        if msg.variant != cfg.variant:
            raise PayloadError(f"bases of the {msg.variant} variant; the session uses {cfg.variant}")
        m = cfg.embed_factor * msg.n if cfg.variant == "vector" else 2 * msg.n
        if msg.p.shape[1] != m:
            raise PayloadError(f"basis dimension {msg.p.shape[1]} is not m = {m} for n = {msg.n}")
        need = self._check_bases_limits(msg, m)
        if max(np.abs(msg.p).max(), 0.0 if msg.q is None else np.abs(msg.q).max()) > MAX_BASIS_ABS:
            raise PayloadError(f"basis entries above {MAX_BASIS_ABS} would overflow the CKKS headroom")
        nodes = [int(n) for n in msg.nodes]
        if len(set(nodes)) != len(nodes):
            raise PayloadError("duplicate node in a bucket")
        for node in nodes:
            if node not in self._position:
                raise PayloadError(f"node {node} is not one this client needs")
            if node in self._assigned:
                raise PayloadError(f"node {node} is already in another bucket")
            if node in self._degree and self._degree[node] != msg.n:
                raise PayloadError(f"owned node {node} has {self._degree[node]} neighbours, not {msg.n}")
        rows = np.array([self._position[n] for n in nodes], dtype=np.int64)
        bases = BucketBases(cfg.variant, rows, np.asarray(nodes, dtype=np.int64),
                            np.full((len(nodes), msg.n), -1, dtype=np.int64), msg.p, msg.q)
        buf = torch.zeros((len(nodes), bases.num_feature_rows(), self.dim), dtype=self.dtype)
        self._assemblies.append(_Assembly(bases, buf, np.zeros(len(nodes), dtype=bool),
                                          {n: i for i, n in enumerate(nodes)}))
        self._assigned.update(nodes)
        self._encoding_bytes += need
        self._arm("download", self.timeouts.download)
        return []

    def _check_bases_limits(self, msg: EncodingBases, m: int) -> int:
        """Refuse bases whose encodings would exceed this client's budget, before allocating them;
        returns the bytes they will take."""
        if msg.n > self.limits.max_neighbours:
            raise SizeLimitError(f"bases for neighbourhoods of {msg.n} nodes; the limit is {self.limits.max_neighbours}")
        rows = 1 + m + (m * m if self.config.variant == "matrix" else 0)  # M2 is derived here, but held
        need = len(msg.nodes) * rows * self.dim * torch.empty((), dtype=self.dtype).element_size()
        if self._encoding_bytes + need > self.limits.max_encoding_bytes:
            raise SizeLimitError(f"bucket {msg.bucket} would take the decrypted encodings to "
                                 f"{self._encoding_bytes + need} bytes; the limit is {self.limits.max_encoding_bytes}")
        return need

    def _on_results(self, msg: EncodingResults) -> list[Message]:
        self._from_server(msg)
        assert self.holder is not None and self.layout is not None
        if msg.bucket >= len(self._assemblies):
            raise PayloadError(f"results for unknown bucket {msg.bucket}")
        asm = self._assemblies[msg.bucket]
        want_rows = self.layout.groups(asm.bases.num_feature_rows()) * self.layout.chunks
        slots = []
        for item in msg.items:
            slot = asm.slot.get(item.node)
            if slot is None:
                raise PayloadError(f"node {item.node} is not in bucket {msg.bucket}")
            if asm.filled[slot] or slot in slots:
                raise PayloadError(f"duplicate results for node {item.node}")
            if len(item.row_blobs) != want_rows:
                raise PayloadError(f"node {item.node}: {len(item.row_blobs)} row ciphertexts, expected {want_rows}")
            if item.self_blobs is not None:  # h_i is result row 0; uploads are never forwarded
                raise PayloadError(f"node {item.node}: forwarded upload ciphertexts are not accepted")
            slots.append(slot)
        sel = np.asarray(slots)
        b = asm.bases
        sub = BucketBases(b.variant, b.rows[sel], b.nodes[sel], b.neighbours[sel], b.p[sel],
                          None if b.q is None else b.q[sel])
        results = [NodeResult(item.node, list(item.row_blobs)) for item in msg.items]
        with self.clock("decrypt"):
            try:
                got = decrypt_bucket(self.holder, self.layout, sub, results, own_features=self._own_rows,
                                     dtype=self.dtype)
            except (CiphertextFormatError, KeyMismatchError) as exc:
                raise _crypto_error(exc, f"results of bucket {msg.bucket}") from exc
            except ValueError as exc:
                raise PayloadError(f"results of bucket {msg.bucket}: {exc}") from exc
            asm.rows[torch.from_numpy(sel)] = got.features
        asm.filled[sel] = True
        self._arm("download", self.timeouts.download)
        self.nodes_decrypted += len(results)
        self.ciphertexts_decrypted += sum(len(r.row_blobs) for r in results)
        return []

    def _on_done(self, msg: EncodingsDone) -> list[Message]:
        self._from_server(msg)
        missing = len(self.needed) - sum(int(a.filled.sum()) for a in self._assemblies)
        if msg.buckets != len(self._assemblies) or msg.nodes != len(self.needed) or missing:
            raise PayloadError(f"encodings incomplete: {missing} of {len(self.needed)} nodes missing, "
                               f"{len(self._assemblies)} buckets received of {msg.buckets}")
        buckets = [EncodingBucket.from_rows(a.bases, a.rows) for a in self._assemblies]
        self.encodings = Encodings(self.config.variant, self.needed, buckets)
        self._assemblies = []
        self.state = ClientState.DONE
        self._disarm("download")
        return []

    # --- checkpoint -----------------------------------------------------------------------------------
    @property
    def checkpoint_label(self) -> int | None:
        """0 once the encodings are decrypted (the only resume point of pre-training)."""
        return 0 if self.state is ClientState.DONE else None

    def checkpoint(self) -> Checkpoint:
        """The decrypted encodings with the session, party and key fingerprint (no key material)."""
        if self.encodings is None:
            raise StateError("no encodings to checkpoint before the round is done")
        meta, arrays = encodings_to_checkpoint(self.encodings)
        return Checkpoint(CLIENT_KIND, {**self._checkpoint_base(), "encodings": meta}, arrays)


class DealerSide(ClientPretrain):
    """The client that generates the CKKS key (at :meth:`start`), sends the public context to the
    server and the secret context, wrapped and signed, to every other client through the server."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.party_id != self.roster.dealer:
            raise ValueError("the dealer's party id must be the roster's dealer")
        self._wrapped_for: set[int] = set()

    def _snapshot(self) -> dict:
        return {**super()._snapshot(), "wrapped_for": tuple(sorted(self._wrapped_for))}

    def start(self) -> list[Message]:
        if self.state is not ClientState.NEW:
            raise StateError("start() was already called")
        with self.clock("keygen"):
            holder = KeyHolderContext.generate(self.config.preset)
        self._keyed(holder)
        return [self._new(PublicContext, self.roster.server, preset=self.config.preset,
                          context=holder.public_context_bytes(), context_fingerprint=holder.fingerprint()),
                *self._graph_messages()]

    def _handler(self, msg: Message) -> Handler | None:
        if isinstance(msg, KeyAnnounce) and self.state not in (ClientState.DONE, ClientState.ABORTED):
            return self._on_key_announce
        return super()._handler(msg)

    def _on_key_announce(self, msg: KeyAnnounce) -> list[Message]:
        self._from_server(msg)
        assert self.holder is not None
        if msg.party == self.party_id or not self.roster.is_client(msg.party):
            raise PayloadError(f"keys announced for party {msg.party}, which is no other client")
        if msg.ed25519 != self.roster.signing_key(msg.party):
            raise AuthError(f"announced Ed25519 key of party {msg.party} is not the roster's")
        _check_binding(msg, self.session)
        if msg.party in self._wrapped_for:
            raise StateError(f"the key has already been wrapped for party {msg.party}")
        with self.clock("keygen"):
            try:
                wrapped = self.holder.wrap_for(msg.x25519, sender_id=str(self.party_id),
                                               recipient_id=str(msg.party), round_id=self.session,
                                               signer=self._signer)
            except KeyUnwrapError as exc:  # e.g. a low-order X25519 point
                raise PayloadError(f"cannot wrap for party {msg.party}: {exc}") from exc
        self._wrapped_for.add(msg.party)
        return [self._new(WrappedKeyDelivery, self.roster.server, dealer=self.party_id, target=msg.party,
                          key_fingerprint=self.holder.fingerprint(), wrapped=wrapped)]


def encodings_from_checkpoint(ckpt: Checkpoint, *, party: int, session: int) -> Encodings:
    """The decrypted encodings in a :meth:`ClientPretrain.checkpoint` of ``party`` in ``session``.

    Raises:
        fedgat.checkpoint.CheckpointMismatchError: another kind, party or session.
    """
    ckpt.require(CLIENT_KIND, party=party, session=session)
    return _encodings_from_arrays(ckpt.meta["encodings"], ckpt.arrays)
