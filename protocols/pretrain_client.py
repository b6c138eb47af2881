r"""A pre-training client as a sans-IO state machine: generates its own keys, announces its graph
and claims its cross-client edges, releases its rows (encrypted under each recipient's key, with
tag columns) to the clients whose confirmed needs imply them, then checks, decrypts and completes
the encodings of the nodes it needs. See :mod:`fedgat.protocols.pretrain` for the message flow.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from fedgat.checkpoint import Checkpoint, encodings_to_checkpoint
from fedgat.checkpoint import encodings_from_checkpoint as encodings_from_arrays
from fedgat.crypto import (
    CiphertextFormatError,
    KeyHolderContext,
    KeyMismatchError,
    ServerContext,
    SlotLayout,
    decrypt_rows,
    encrypt_rows,
)
from fedgat.crypto.encrypt_pool import EncryptionPool, EncryptionWorkerStartError, encrypt_pool_size
from fedgat.crypto.tags import (
    TAG_COLUMNS,
    CheckKeys,
    ResultCheckError,
    check_shares,
    pad_offsets,
    prf_tags,
    release_rows,
)
from fedgat.dp import LabelPredictor
from fedgat.dp_ledger import DPLedger
from fedgat.encodings import BucketBases, EncodingBucket, Encodings
from fedgat.verdict_dp import row_recipients, verdict_epsilon, verdict_record

from .errors import (
    AuthError,
    ConfigMismatchError,
    KeyFingerprintError,
    MissingPartyError,
    PayloadError,
    ResultRejectedError,
    StateError,
)
from .messages import (
    Abort,
    AbortCode,
    EdgeClaims,
    EncodingBases,
    EncodingResults,
    EncodingsDone,
    FeatureUpload,
    GraphAnnounce,
    KeyAnnounce,
    Message,
    NeighbourhoodStatement,
    PrivacyTerms,
    PublicContext,
    RosterReady,
    SealedCheckKeys,
    UploadDone,
    UploadGrant,
    UploadItem,
    claim_bytes,
    claim_keys_digest,
    key_binding_bytes,
    keyset_fingerprint,
    neighbourhood_bytes,
)
from .party import Handler, Party
from .party_values import PartyReport, PartySpec
from .pretrain_checks import check_bases, check_bucket_nodes, crypto_error, validate_features
from .pretrain_config import CLIENT_KIND, PretrainConfig, PretrainLimits, PretrainTimeouts
from .pretrain_edges import (
    ClaimSet,
    LocalGraph,
    attended_by,
    check_claims_complete,
    check_foreign_neighbourhoods,
    check_statement,
    neighbourhoods_of,
    releases,
    verify_claim,
    verify_statement,
)
from .pretrain_keys import SessionKeys, check_announce, load_public_context, open_check_keys, seal_check_keys
from .pretrain_plan import needed_from_neighbourhoods
from .pretrain_values import absorb_client, client_from_spec, client_spec_fields, report_client
from .roster import Identity, Roster

__all__ = ["ClientPretrain", "ClientState", "ResultCheckError", "encodings_from_checkpoint"]


class ClientState(enum.Enum):
    NEW = "new"
    AWAIT_ROSTER = "await-roster"
    AWAIT_CHECK_KEYS = "await-check-keys"
    UPLOADING = "uploading"
    AWAIT_ENCODINGS = "await-encodings"
    DONE = "done"
    ABORTED = "aborted"


#: coefficients (partials x rows x neighbourhood) a client's result check takes at once (16 MiB; a few
#: transient copies of that size)
CHECK_ENTRIES = 1 << 21


#: the states in which the round's relayed check keys, statements and grants may arrive
_AFTER_ROSTER = (ClientState.AWAIT_CHECK_KEYS, ClientState.UPLOADING, ClientState.AWAIT_ENCODINGS)


@dataclass
class _Assembly:
    """One bucket of a client's encodings while its foreign shares arrive."""

    bases: BucketBases
    owners: np.ndarray  # (B, n) owner of each neighbour
    rows: torch.Tensor  # (B, R + 1, encoding_dim): the own share, then own + each checked partial
    remaining: np.ndarray  # (B,) foreign owners whose partial has not arrived
    slot: dict[int, int]  # node -> position in the bucket
    received: set[tuple[int, int]] = field(default_factory=set)  # (slot, owner) partials added

    @property
    def filled(self) -> np.ndarray:
        """(B,) bool: every partial of the node is in."""
        return self.remaining == 0


def foreign_owner_counts(owners: np.ndarray, me: int) -> np.ndarray:
    """``(B,)``: per row of ``owners`` (B, n), the number of distinct owners other than ``me``."""
    if owners.shape[1] == 0:
        return np.zeros(len(owners), dtype=np.int64)
    srt = np.sort(np.where(owners == me, -1, owners), axis=1)
    distinct = 1 + (np.diff(srt, axis=1) != 0).sum(axis=1)
    return distinct - (srt[:, 0] == -1)


class ClientPretrain(Party):
    """A client of the pre-training round.

    Args:
        party_id, roster, config, identity: identity (Ed25519 signer) and session.
        owned: sorted global ids of the client's nodes.
        features: ``(len(owned), d)`` unit-norm rows (checked: :func:`validate_features`).
        indptr, indices: the owned nodes' attention neighbourhoods (CSR over ``owned``, self first).
        cross, cross_owner: the client's cross-client graph edges ``(own node, foreign node)`` and the
            owner of each foreign end (what it claims, :mod:`fedgat.protocols.pretrain_edges`); every
            foreign attention neighbour must be one of them. None: no cross-client edge.
        needed: the nodes whose encodings the client receives (owned first; default
            :func:`needed_from_neighbourhoods`).
        dtype: dtype of the decrypted encodings.
        upload_batch: rows per FeatureUpload message.
        encrypt_workers: processes this client may use for its encryptions
            (:class:`~fedgat.crypto.encrypt_pool.EncryptionPool`, holding the recipients' public
            contexts only; :func:`~fedgat.crypto.encrypt_pool.encrypt_pool_size` decides how many its
            uploads are worth); 0 (default): in this process. Local execution: the messages are the
            same either way.
        timeouts: the client's deadlines (``keys``, ``download``).
        limits: ``max_neighbours`` and ``max_encoding_bytes`` bound what the server's bases may make
            this client allocate.
        ledger: with ``config.dp``, this owner's :class:`~fedgat.dp_ledger.DPLedger`: the release
            (:meth:`fedgat.dp.FeatureDP.release_rows`, randomness from a fresh CSPRNG, recipients the
            roster's other clients) is charged to it here, before anything is sent; required unless
            ``release`` is given. Without ``config.dp``, optional: the session's verdicts towards the
            server (:mod:`fedgat.verdict_dp`, Gaussian of sd ``config.upload_pad``) are charged to
            it here, conservatively as if every row went to every other client of the roster.
        ledger_others: other ledgers whose releases of the same rows count too (a simulation's
            other owners': a row that moved to another owner's index keeps its history); only
            ``ledger`` is charged.
        release: with ``config.dp``, the ``(len(owned), w)`` rows of a release drawn (and charged)
            before (a :class:`PartySpec`'s, or :func:`fedgat.dp_release.draw_release`'s).
        predictor: with ``config.dp`` of mechanism ``label_rr`` and no ``release``, the published
            label predictor (:mod:`fedgat.dp_predictor`) the release randomises.

    With ``config.dp`` the rows it releases to others are its DP release (``w`` values per row, what
    it announces as its ``dim`` and the server computes on); its encodings follow the block layout of
    :mod:`fedgat.dp` (own share in the first ``d`` columns, every checked partial in the last ``w``);
    it announces its :class:`PrivacyTerms` before its graph and refuses bases before the server
    confirmed the same terms.

    Raises:
        PayloadError: invalid features, neighbourhoods or cross edges (nothing is sent).
        MissingLedgerError: ``config.dp`` without ``ledger`` or ``release`` (nothing is drawn or sent).
        BudgetExceededError: the release (or without ``config.dp``, the session's verdicts) would
            exceed the ledger's budget (nothing is drawn or sent, the ledger is unchanged).
    """

    PARTY_KIND = "pretrain.client"

    def __init__(
        self,
        party_id: int,
        roster: Roster,
        config: PretrainConfig,
        identity: Identity,
        *,
        owned: np.ndarray,
        features: np.ndarray,
        indptr: np.ndarray,
        indices: np.ndarray,
        cross: np.ndarray | None = None,
        cross_owner: np.ndarray | None = None,
        needed: np.ndarray | None = None,
        dtype: torch.dtype = torch.float32,
        upload_batch: int = 32,
        encrypt_workers: int = 0,
        timeouts: PretrainTimeouts | None = None,
        limits: PretrainLimits | None = None,
        ledger: DPLedger | None = None,
        ledger_others: Sequence[DPLedger] = (),
        release: np.ndarray | None = None,
        predictor: LabelPredictor | None = None,
    ) -> None:
        super().__init__(party_id, roster, config.session, identity.signer)
        self.timeouts = timeouts if timeouts is not None else PretrainTimeouts()
        self.limits = limits if limits is not None else PretrainLimits()
        self._encoding_bytes = 0
        if party_id not in roster.clients:
            raise ValueError(f"party {party_id} is not a client of the roster")
        self.config = config
        owned = np.asarray(owned, dtype=np.int64)
        self._release: np.ndarray | None = None
        self.dp_spent: tuple[float, float] | None = None  # (epsilon, delta) after this client's release
        self._terms_confirmed = False
        if release is not None and config.dp is None:
            raise ValueError("a release needs the session's DP terms (config.dp)")
        self._features = validate_features(features, len(owned))
        if release is not None:
            self._release = validate_features(release, len(owned))
        elif config.dp is not None:
            others = tuple(c for c in roster.clients if c != party_id)
            self._release = config.dp.release_rows(
                self._features, ledger=ledger, recipients=others, predictor=predictor, others=ledger_others
            )
            assert ledger is not None  # release_rows refused otherwise
            self.dp_spent = ledger.spent(self._features, others=ledger_others)
        self._graph = GraphAnnounce(
            sender=party_id,
            recipient=roster.server,
            session=config.session,
            seq=0,
            dim=self.dim,
            owned=owned,
            indptr=np.asarray(indptr, dtype=np.int64),
            indices=np.asarray(indices, dtype=np.int64),
        )
        self._graph.check()  # PayloadError for bad neighbourhoods
        self.local = LocalGraph(
            owned,
            self._graph.indptr,
            self._graph.indices,
            np.zeros((0, 2), np.int64) if cross is None else cross,
            np.zeros(0, np.int64) if cross_owner is None else cross_owner,
        )
        if any(p == party_id or not roster.is_client(p) for p in self.local.peers()):
            raise PayloadError("a cross edge's owner must be another client of the roster")
        self.owned = owned
        self.needed = (
            needed_from_neighbourhoods(owned, self._graph.indices)
            if needed is None
            else np.asarray(needed, dtype=np.int64)
        )
        if not np.array_equal(self.needed[: len(owned)], owned):
            raise PayloadError("needed must start with the owned nodes")
        self._position = {int(n): i for i, n in enumerate(self.needed)}
        self._degree = dict(zip(owned.tolist(), np.diff(self._graph.indptr).tolist()))
        self.dtype = dtype
        self.upload_batch = upload_batch
        if encrypt_workers < 0:
            raise ValueError(f"encrypt_workers must be >= 0, got {encrypt_workers}")
        self.encrypt_workers = int(encrypt_workers)
        #: the encryption pool while this client uploads (None: none yet, or encrypting in process)
        self._pool: EncryptionPool | None = None
        self._pool_sized = False
        self._ahead: dict[tuple[int, int], int] = {}  # (recipient, start) -> pool ticket, submitted early
        #: CPU seconds its encryption workers spent (also in ``cpu_timings["encrypt"]``; not reported
        #: by a hosted client: its host counts them)
        self.encrypt_worker_cpu = 0.0
        self.state = ClientState.NEW
        #: this client's own CKKS key pair (generated at start; the secret never leaves it)
        self.holder: KeyHolderContext | None = None
        #: its key's fingerprint as a hosted client reported it (the caller's copy has no holder)
        self._reported_key: bytes | None = None
        self._session_keys: SessionKeys | None = None
        self.layout: SlotLayout | None = None
        self._peers: dict[int, KeyAnnounce] = {}
        self._peer_contexts: dict[int, ServerContext] = {}
        self._claims: dict[tuple[int, int], EdgeClaims] = {}
        self._claims_cache: ClaimSet | None = None  # derived from _claims once the roster is in
        #: owner -> its signed statement of the neighbourhoods of its nodes this client needs
        self._statements: dict[int, NeighbourhoodStatement] = {}
        self.participants: list[int] = []
        #: recipient -> owned node ids whose rows it is released (from confirmed edges)
        self.releases: dict[int, np.ndarray] = {}
        self._owner_keys: dict[int, CheckKeys] = {}  # what each recipient gave this client
        self._my_keys: dict[int, CheckKeys] = {}  # what this client gave each owner
        self._vectors: dict[int, np.ndarray] = {}  # each owner's check vectors (derived from its keys)
        self._queue: list[tuple[int, int]] = []  # (recipient, start) batches still to upload
        #: recipients the server has granted uploads for (sessions with an upload window)
        self._granted: set[int] = set()
        self._uploaded = 0
        self._assemblies: list[_Assembly] = []
        self._assigned: set[int] = set()
        self.encodings: Encodings | None = None
        #: the first result this client refused, kept until the server says the results are done
        #: (:meth:`_on_done`): a refusal seen at the result that failed would tell the server which
        #: of its probes did (known break 22)
        self._refusal: ResultRejectedError | None = None
        self.ciphertexts_decrypted = 0
        self.nodes_decrypted = 0
        #: nodes of the buckets received so far with a foreign partial to wait for: what
        #: ``nodes_decrypted`` reaches when every result is in (a progress bar's total)
        self.nodes_to_decrypt = 0
        if ledger is not None and config.dp is None:  # last: inputs refused above spend nothing
            if config.upload_pad <= 0:
                raise ValueError("a verdict ledger needs padded uploads (config.upload_pad > 0)")
            others = tuple(c for c in roster.clients if c != party_id)
            self.dp_spent = ledger.charge(
                self._features,
                verdict_record(config.upload_pad, max(len(others), 1)),
                [roster.server],
                others=ledger_others,
            )

    @property
    def done(self) -> bool:
        return self.state is ClientState.DONE

    @property
    def key_fingerprint(self) -> bytes | None:
        """Fingerprint of this client's own CKKS key (:meth:`~fedgat.crypto.KeyHolderContext.fingerprint`),
        also in a hosted client's caller-side copy, which holds no key; None before ``start()``."""
        return self.holder.fingerprint() if self.holder is not None else self._reported_key

    @property
    def dim(self) -> int:
        """Values per row this client releases (its features', or with DP its release's width)."""
        return int((self._features if self._release is None else self._release).shape[1])

    @property
    def verdict_epsilon(self) -> float:
        """Epsilon (at :data:`fedgat.verdict_dp.DEFAULT_DELTA`) of this session's verdicts towards
        the server on this owner's most-released row (:mod:`fedgat.verdict_dp`; 0 while nothing is
        released). With ``config.dp`` the rows are a DP release and this bounds the verdicts on it."""
        most = int(row_recipients(self.releases, self.owned).max(initial=0))
        return verdict_epsilon(self.config.upload_pad, most)

    @property
    def encoding_dim(self) -> int:
        """Feature columns of its encodings: ``d``, or with DP ``d + w`` (the block layout)."""
        return int(self._features.shape[1]) + (0 if self._release is None else self.dim)

    @property
    def _offset(self) -> int:
        """First encoding column the foreign partials fill (the released block, with DP)."""
        return self.encoding_dim - self.dim

    def _snapshot(self) -> dict:
        return {
            "state": self.state,
            "key": None if self.holder is None else self.holder.fingerprint(),
            "peers": tuple(sorted(self._peers)),
            "contexts": tuple(sorted(self._peer_contexts)),
            "claims": tuple(sorted(self._claims)),
            "statements": tuple(sorted(self._statements)),
            "owner_keys": tuple(sorted(self._owner_keys)),
            "queue": tuple(self._queue),
            "granted": tuple(sorted(self._granted)),
            "buckets": len(self._assemblies),
            "assigned": len(self._assigned),
            "filled": tuple(int(a.filled.sum()) for a in self._assemblies),
            "rows_sum": tuple(float(a.rows.double().sum()) for a in self._assemblies),
            "encodings": self.encodings is not None,
            "encoding_bytes": self._encoding_bytes,
            "terms_confirmed": self._terms_confirmed,
        }

    # --- as a value (fedgat.protocols.pretrain_values) ------------------------------------------------
    def _spec_fields(self) -> dict:
        return client_spec_fields(self)

    @classmethod
    def from_spec(cls, spec: PartySpec) -> ClientPretrain:
        return client_from_spec(cls, spec)

    def _report_values(self) -> tuple[dict[str, int], dict]:
        return report_client(self)

    _PROGRESS = ("ciphertexts_decrypted", "nodes_decrypted", "nodes_to_decrypt")

    def progress(self) -> dict[str, int]:
        return {name: int(getattr(self, name)) for name in self._PROGRESS}

    def take_progress(self, counters: Mapping[str, int]) -> None:
        if set(counters) != set(self._PROGRESS):
            raise ValueError(f"client {self.party_id}: unexpected progress counters {sorted(counters)}")
        for name in self._PROGRESS:
            setattr(self, name, int(counters[name]))

    def _absorb(self, report: PartyReport) -> None:
        absorb_client(self, report)

    # --- opening ----------------------------------------------------------------------------------
    def start(self) -> list[Message]:
        """Generate this client's CKKS and HPKE keys; announce them, the public context, the DP
        terms (with DP), the edge claims and the graph."""
        if self.state is not ClientState.NEW:
            raise StateError("start() was already called")
        with self.clock("keygen"):
            self.holder = KeyHolderContext.generate(self.config.preset, wire=self.config.wire)
            self._session_keys = SessionKeys.generate()
        self.layout = self.config.layout(self.config.row_width(self.dim), self.holder.slots)
        fp = self.holder.fingerprint()
        hpke, ed = self._session_keys.public_bytes(), self._signer.public_bytes()
        binding = self._signer.sign(key_binding_bytes(self.session, self.party_id, hpke, ed, fp))
        server = self.roster.server
        out = [
            self._new(
                KeyAnnounce,
                server,
                party=self.party_id,
                hpke=hpke,
                ed25519=ed,
                context_fingerprint=fp,
                binding_signature=binding,
            ),
            self._new(
                PublicContext,
                server,
                party=self.party_id,
                preset=self.config.preset,
                wire=self.config.wire,
                context=self.holder.public_context_bytes(),
                context_fingerprint=fp,
            ),
        ]
        if self.config.dp is not None:
            out.append(self._new(PrivacyTerms, server, **self.config.dp_fields()))
        keys = claim_keys_digest(hpke, fp)
        claims = self.local.claims()
        peers = np.array(sorted(claims), dtype=np.int64)
        for peer, (edges, uses) in claims.items():
            signature = self._signer.sign(
                claim_bytes(self.session, self.party_id, peer, edges, uses, keys, peers)
            )
            out.append(
                self._new(
                    EdgeClaims,
                    server,
                    claimer=self.party_id,
                    peer=peer,
                    edges=edges,
                    uses=uses,
                    peers=peers,
                    claim_signature=signature,
                )
            )
        g = self._graph
        out.append(
            self._new(GraphAnnounce, server, dim=g.dim, owned=g.owned, indptr=g.indptr, indices=g.indices)
        )
        self.state = ClientState.AWAIT_ROSTER
        self._arm("keys", self.timeouts.keys)
        return out

    def _handler(self, msg: Message) -> Handler | None:
        if isinstance(msg, Abort):
            return None if self.state in (ClientState.DONE, ClientState.ABORTED) else self._on_abort
        if isinstance(msg, SealedCheckKeys) and self.state in _AFTER_ROSTER:
            return self._on_check_keys
        if isinstance(msg, NeighbourhoodStatement) and self.state in _AFTER_ROSTER:
            return self._on_statement
        return self._handlers().get((self.state, type(msg)))

    def _handlers(self) -> dict:
        table = {
            (ClientState.AWAIT_ROSTER, KeyAnnounce): self._on_peer_keys,
            (ClientState.AWAIT_ROSTER, PublicContext): self._on_peer_context,
            (ClientState.AWAIT_ROSTER, EdgeClaims): self._on_claim,
            (ClientState.AWAIT_ROSTER, RosterReady): self._on_roster,
            (ClientState.AWAIT_ENCODINGS, PrivacyTerms): self._on_terms,
            (ClientState.AWAIT_ENCODINGS, EncodingBases): self._on_bases,
            (ClientState.AWAIT_ENCODINGS, EncodingResults): self._on_results,
            (ClientState.AWAIT_ENCODINGS, EncodingsDone): self._on_done,
        }
        table.update({(state, UploadGrant): self._on_grant for state in _AFTER_ROSTER})
        if self.config.upload_window is not None:
            # with an upload window the bases and results may come while this client still uploads
            for state in _AFTER_ROSTER[:2]:
                table[(state, PrivacyTerms)] = self._on_terms
                table[(state, EncodingBases)] = self._on_bases
                table[(state, EncodingResults)] = self._on_results
        return table

    def _from_server(self, msg: Message) -> None:
        if msg.sender != self.roster.server:
            raise AuthError(f"{msg.type_name} must come from the server, not party {msg.sender}")

    def _on_abort(self, msg: Abort) -> list[Message]:
        self._from_server(msg)
        self.state = ClientState.ABORTED
        self.abort_reason = f"server aborted (code {msg.code}): {msg.reason}"
        self._disarm("keys", "download")
        self._close_pool()
        return []

    def _expired(self, phase: str) -> list[Message]:
        """The server (or a peer behind it) went quiet: give up and say so."""
        if self.state in (ClientState.DONE, ClientState.ABORTED):
            return []
        if phase == "download" and self.config.upload_window is not None and self.has_work():
            # granted uploads still to send: this client is not waiting for the server
            self._arm_at_next_tick("download", self.timeouts.download)
            return []
        if phase == "keys":
            waiting = sorted(set(self.releases) - set(self._owner_keys)) if self.participants else []
            what = "roster" if not self.participants else f"check keys of parties {waiting}"
        else:
            waiting = []
            what = "encodings" if self.config.upload_window is None else "upload grants or encodings"
        error = MissingPartyError(
            f"client {self.party_id}: no {what} from the server before the {phase} deadline",
            phase=phase,
            missing=[self.roster.server, *waiting],
        )
        self.state, self.failure, self.abort_reason = ClientState.ABORTED, error, str(error)
        self._disarm("keys", "download")
        self._close_pool()
        return [self._new(Abort, self.roster.server, code=int(AbortCode.TIMEOUT), reason=str(error))]

    # --- keys and claims ------------------------------------------------------------------------------
    def _on_peer_keys(self, msg: KeyAnnounce) -> list[Message]:
        self._from_server(msg)
        if msg.party == self.party_id:
            raise PayloadError("the server relays this client's own keys back")
        if msg.party in self._peers:
            raise StateError(f"party {msg.party}'s keys were already relayed")
        check_announce(msg, self.roster, self.session)
        self._peers[msg.party] = msg
        return []

    def _on_peer_context(self, msg: PublicContext) -> list[Message]:
        self._from_server(msg)
        announced = self._peers.get(msg.party)
        if announced is None:
            raise StateError(f"party {msg.party}'s context before its keys")
        if msg.party in self._peer_contexts:
            raise StateError(f"party {msg.party}'s context was already relayed")
        with self.clock("keygen"):
            self._peer_contexts[msg.party] = load_public_context(
                msg, announced, self.config.preset, self.config.wire
            )
        return []

    def _on_claim(self, msg: EdgeClaims) -> list[Message]:
        self._from_server(msg)
        if msg.claimer == self.party_id:
            raise PayloadError("the server relays this client's own claim back")
        if (msg.claimer, msg.peer) in self._claims:
            raise StateError(f"party {msg.claimer}'s claim of its edges to {msg.peer} was already relayed")
        announced = self._peers.get(msg.claimer)
        if announced is None:
            raise StateError(f"party {msg.claimer}'s claim before its keys")
        verify_claim(msg, self.roster, self.session, announced)
        self._claims[(msg.claimer, msg.peer)] = msg
        return []

    def _on_roster(self, msg: RosterReady) -> list[Message]:
        self._from_server(msg)
        assert self.holder is not None and self._session_keys is not None
        participants = [int(p) for p in msg.participants]
        if self.party_id not in participants or any(not self.roster.is_client(p) for p in participants):
            raise PayloadError("the roster must name this client and clients only")
        others = [p for p in participants if p != self.party_id]
        missing = [p for p in others if p not in self._peer_contexts]
        if missing:
            raise StateError(f"the roster names parties {missing} whose keys were not relayed")
        fps = {p: self._peers[p].context_fingerprint for p in others}
        fps[self.party_id] = self.holder.fingerprint()
        keyset = keyset_fingerprint(self.session, fps)
        if msg.fingerprint != keyset:
            raise KeyFingerprintError("the roster is bound to another key set than the relayed keys")
        claims = self._claims_among(participants)
        inside = set(participants)
        check_claims_complete(
            self.party_id,
            self.local,
            ClaimSet.of(c for k, c in self._claims.items() if k[0] in inside),
            participants,
        )
        rel = releases(self.party_id, self.local, claims, others)
        my_keys = {p: CheckKeys.generate() for p in others}  # per owner: no key checks two owners' rows
        sealed = seal_check_keys(
            self.session,
            self.party_id,
            self._signer,
            my_keys,
            {p: self._peers[p].hpke for p in others},
            keyset,
        )
        statements = [
            self._statement(r, attended_by(self.party_id, self.local, claims, r), keyset) for r in others
        ]
        self.verifier.fingerprint = keyset
        self.participants, self.releases, self._my_keys = participants, rel, my_keys
        self._claims_cache = claims
        self._queue = [(r, start) for r in sorted(rel) for start in range(0, len(rel[r]), self.upload_batch)]
        self.state = ClientState.AWAIT_CHECK_KEYS
        out = [self._new(SealedCheckKeys, self.roster.server, **sealed)]
        out += [self._new(NeighbourhoodStatement, self.roster.server, **s) for s in statements if s]
        self._maybe_upload()
        return out

    def _statement(self, recipient: int, nodes: np.ndarray, keyset: bytes) -> dict:
        """The fields of this client's signed :class:`NeighbourhoodStatement` to ``recipient`` of the
        neighbourhoods of ``nodes`` (its nodes the recipient's attend over; empty: none to send)."""
        if not len(nodes):
            return {}
        indptr, indices = neighbourhoods_of(self.owned, self._graph.indptr, self._graph.indices, nodes)
        signed = neighbourhood_bytes(self.session, self.party_id, recipient, keyset, nodes, indptr, indices)
        return {
            "owner": self.party_id,
            "recipient_party": recipient,
            "nodes": nodes,
            "indptr": indptr,
            "indices": indices,
            "statement_signature": self._signer.sign(signed),
        }

    def _on_statement(self, msg: NeighbourhoodStatement) -> list[Message]:
        self._from_server(msg)
        if msg.owner not in self.participants or msg.owner == self.party_id:
            raise PayloadError(
                f"a neighbourhood statement of party {msg.owner}, which is not another participant"
            )
        if msg.recipient_party != self.party_id:
            raise PayloadError(
                f"party {msg.owner}'s statement is for party {msg.recipient_party}, not this client"
            )
        if msg.owner in self._statements:
            raise StateError(f"party {msg.owner}'s neighbourhood statement was already relayed")
        assert self.verifier.fingerprint is not None  # the roster's key set, set in _on_roster
        verify_statement(msg, self.roster, self.session, self.verifier.fingerprint)
        check_statement(self.party_id, self.local, msg)
        self._statements[msg.owner] = msg
        return []

    def _on_check_keys(self, msg: SealedCheckKeys) -> list[Message]:
        self._from_server(msg)
        assert self._session_keys is not None
        r = msg.recipient_party
        if r not in self.participants or r == self.party_id:
            raise PayloadError(f"check keys of party {r}, which is not another participant")
        if r in self._owner_keys:
            raise StateError(f"party {r}'s check keys were already relayed")
        assert self.verifier.fingerprint is not None  # the roster's key set, set in _on_roster
        keys = open_check_keys(
            msg, self.party_id, self._session_keys, self.roster, self.session, self.verifier.fingerprint
        )
        self._owner_keys[r] = keys
        self._maybe_upload()
        return []

    def _maybe_upload(self) -> None:
        if self.state is ClientState.AWAIT_CHECK_KEYS and set(self.releases) <= set(self._owner_keys):
            self.state = ClientState.UPLOADING
            self._disarm("keys")
            if self.config.upload_window is not None:  # grants, bases and results keep it armed
                self._arm("download", self.timeouts.download)

    # --- uploads -------------------------------------------------------------------------------------
    def _on_grant(self, msg: UploadGrant) -> list[Message]:
        self._from_server(msg)
        if self.config.upload_window is None:
            raise ConfigMismatchError(
                "the server paces uploads; this party runs the session without an upload window"
            )
        recipients = [int(r) for r in msg.recipients]
        if any(r not in self.participants or r == self.party_id for r in recipients):
            raise PayloadError("an upload grant names parties outside the round, or this client")
        again = sorted(self._granted.intersection(recipients))
        if again:
            raise StateError(f"uploads for parties {again} were already granted")
        self._granted.update(recipients)
        self._arm("download", self.timeouts.download)
        return []

    def _next_batch(self) -> int | None:
        """Index in the queue of the next batch this client may upload (None: wait for a grant)."""
        if self.config.upload_window is None:
            return 0 if self._queue else None
        return next((k for k, (r, _) in enumerate(self._queue) if r in self._granted), None)

    def has_work(self) -> bool:
        return self.state is ClientState.UPLOADING and (not self._queue or self._next_batch() is not None)

    def step(self) -> list[Message]:
        """Encrypt and send the next batch of released rows (under the recipient's key, with their
        tag columns; with an upload window, of a granted recipient only); then UploadDone."""
        if not self.has_work():
            return []
        assert self.layout is not None
        out: list[Message] = []
        at = self._next_batch()
        if at is not None:
            r, start = self._queue[at]
            with self.clock("encrypt"):
                blobs = self._encrypt(r, start)
            del self._queue[at]  # only once encrypted: a failed encryption leaves the batch queued
            nodes = self.releases[r][start : start + self.upload_batch]
            c = self.layout.chunks
            items = tuple(UploadItem(int(nodes[k // c]), k % c, blob) for k, blob in enumerate(blobs))
            self._uploaded += len(items)
            out.append(self._new(FeatureUpload, self.roster.server, target=r, items=items))
        if not self._queue:
            self._close_pool()
            pairs = sum(len(v) for v in self.releases.values())
            out.append(self._new(UploadDone, self.roster.server, nodes=pairs, ciphertexts=self._uploaded))
            self.state = ClientState.AWAIT_ENCODINGS
            self._arm("download", self.timeouts.download)
        if self.config.upload_window is not None:  # the time spent encrypting is not the server's
            self._arm_at_next_tick("download", self.timeouts.download)
        return out

    def _rows(self, r: int, start: int) -> np.ndarray:
        """The rows of upload batch ``(r, start)`` for recipient ``r``: padded, with their tag columns
        (:func:`~fedgat.crypto.tags.release_rows`)."""
        nodes = self.releases[r][start : start + self.upload_batch]
        pos = np.searchsorted(self.owned, nodes)
        rows = (self._features if self._release is None else self._release)[pos]
        return release_rows(self._owner_keys[r], self.session, nodes, rows, self.config.upload_pad)

    def _encrypt(self, r: int, start: int) -> list[bytes]:
        """Envelopes of batch ``(r, start)``: in this process, or from the encryption pool, which
        meanwhile gets the next batches this client may send (:attr:`EncryptionPool.depth` in all)."""
        assert self.layout is not None
        pool = self._encryption_pool()
        if pool is None:
            return list(encrypt_rows(self._peer_contexts[r], self._rows(r, start), self.layout))
        try:
            ticket = self._ahead.pop((r, start), None)
            if ticket is None:
                ticket = pool.submit(r, self._rows(r, start))
            allowed = (b for b in self._queue if self.config.upload_window is None or b[0] in self._granted)
            for batch in allowed:
                if len(self._ahead) + 1 >= pool.depth:
                    break
                if batch not in self._ahead and batch != (r, start):
                    self._ahead[batch] = pool.submit(batch[0], self._rows(*batch))
            blobs, worker_cpu = pool.result(ticket)
        except BaseException:  # a failed worker, or an interrupt mid-frame: this pool is done
            self._close_pool()
            self._pool_sized = False  # the next step starts a new pool
            raise
        self.cpu_timings["encrypt"] += worker_cpu  # the workers' CPU is this client's too
        self.encrypt_worker_cpu += worker_cpu
        return blobs

    def _encryption_pool(self) -> EncryptionPool | None:
        """The pool, started at the first batch when :attr:`encrypt_workers` and the uploads still to
        encrypt ask for one (:func:`~fedgat.crypto.encrypt_pool.encrypt_pool_size`; after a failed
        pool, or in a restored client, only the batches left count)."""
        if not self._pool_sized:
            assert self.layout is not None
            batch = self.upload_batch
            rows = sum(min(batch, len(self.releases[r]) - start) for r, start in self._queue)
            workers = encrypt_pool_size(self.encrypt_workers, rows * self.layout.chunks)
            if workers:
                contexts = {r: self._peer_contexts[r] for r in dict.fromkeys(r for r, _ in self._queue)}
                try:
                    self._pool = EncryptionPool(contexts, self.layout, workers)
                except EncryptionWorkerStartError as exc:  # no workers on this machine: same messages here
                    warnings.warn(
                        f"client {self.party_id}: its {workers} encryption workers did not start ({exc}); "
                        "it encrypts in its own process",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                else:
                    self.cpu_timings["encrypt"] += self._pool.start_cpu
                    self.encrypt_worker_cpu += self._pool.start_cpu
            self._pool_sized = True
        return self._pool

    def _close_pool(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._ahead.clear()

    # --- encodings -----------------------------------------------------------------------------------
    def _on_terms(self, msg: PrivacyTerms) -> list[Message]:
        self._from_server(msg)
        self.config.check_terms(msg, "the server")
        if self._terms_confirmed:
            raise StateError("the server has already confirmed the DP terms")
        self._terms_confirmed = True
        return []

    def _check_neighbours(self, msg: EncodingBases) -> None:
        """The bucket's neighbourhoods and owners agree with what this client knows: its own nodes'
        neighbourhoods exactly, its nodes owned by it and no other node, its cross edges' owners."""
        me = self.party_id
        mine = np.isin(msg.neighbours, self.owned)
        if np.any(mine != (msg.owners == me)):
            raise PayloadError(
                "the bases name another owner for this client's nodes, or this client for others'"
            )
        if np.any(~np.isin(msg.owners, self.participants)):
            raise PayloadError("the bases name owners outside the round")
        for k in np.flatnonzero(np.isin(msg.nodes, self.owned)):
            node = int(msg.nodes[k])
            i = int(np.searchsorted(self.owned, node))
            own = self._graph.indices[self._graph.indptr[i] : self._graph.indptr[i + 1]]
            if not np.array_equal(msg.neighbours[k], own):
                raise PayloadError(f"the bases give owned node {node} another neighbourhood")
            cross = self.local.cross
            sel = cross[:, 0] == node
            theirs = dict(zip(cross[sel, 1].tolist(), self.local.cross_owner[sel].tolist(), strict=True))
            for u, o in zip(msg.neighbours[k].tolist(), msg.owners[k].tolist(), strict=True):
                if u in theirs and theirs[u] != o:
                    raise PayloadError(f"the bases give node {u} another owner than this client knows")
        foreign = ~np.isin(msg.nodes, self.owned)
        if np.any(foreign):
            check_foreign_neighbourhoods(
                me,
                self.local,
                self._claim_set(),
                msg.nodes[foreign],
                msg.neighbours[foreign],
                msg.owners[foreign],
                stated=self._statements,
            )

    def _claim_set(self) -> ClaimSet:
        """The verified claims among the round's participants (as :meth:`_on_roster` read them)."""
        if self._claims_cache is None:
            self._claims_cache = self._claims_among(self.participants)
        return self._claims_cache

    def _claims_among(self, participants: list[int]) -> ClaimSet:
        inside = set(participants)
        return ClaimSet.of(c for k, c in self._claims.items() if k[0] in inside and k[1] in inside)

    def _on_bases(self, msg: EncodingBases) -> list[Message]:
        self._from_server(msg)
        assert self.layout is not None
        if self.config.dp is not None and not self._terms_confirmed:
            raise ConfigMismatchError("the server sent bases without confirming the session's DP terms")
        cfg = self.config
        if msg.bucket != len(self._assemblies):
            raise PayloadError(f"bucket {msg.bucket} out of order (expected {len(self._assemblies)})")
        element = torch.empty((), dtype=self.dtype).element_size()
        need = check_bases(msg, cfg, self.limits, self.encoding_dim * element, self._encoding_bytes)
        nodes = [int(n) for n in msg.nodes]
        check_bucket_nodes(nodes, msg.n, self._position, self._assigned, self._degree)
        self._check_neighbours(msg)
        rows = np.array([self._position[n] for n in nodes], dtype=np.int64)
        bases = BucketBases(
            cfg.variant, rows, np.asarray(nodes, dtype=np.int64), msg.neighbours, msg.p, msg.q
        )
        mine = msg.owners == self.party_id
        with self.clock("decrypt"):
            buf = torch.from_numpy(self._own_share(bases, mine)).to(self.dtype)
        remaining = foreign_owner_counts(msg.owners, self.party_id)  # 0: the own share is all of it
        self.nodes_to_decrypt += int((remaining > 0).sum())
        self._assemblies.append(
            _Assembly(bases, msg.owners, buf, remaining, {n: i for i, n in enumerate(nodes)})
        )
        self._assigned.update(nodes)
        self._encoding_bytes += need
        self._arm("download", self.timeouts.download)
        return []

    def _own_share(self, bases: BucketBases, mine: np.ndarray) -> np.ndarray:
        """``(B, R + 1, encoding_dim)``: the encodings' share of this client's own rows, in plaintext
        (one pass per neighbourhood position, not per node; with DP the released block stays zero)."""
        coef = bases.coefficients()
        out = np.zeros((len(bases), coef.shape[1], self.encoding_dim))
        for k in range(bases.n):
            at = np.flatnonzero(mine[:, k])
            if len(at):
                h = self._features[np.searchsorted(self.owned, bases.neighbours[at, k])]
                out[at, :, : h.shape[1]] += coef[at, :, k, None] * h[:, None, :]
        return out

    def _on_results(self, msg: EncodingResults) -> list[Message]:
        self._from_server(msg)
        assert self.holder is not None and self.layout is not None
        if msg.bucket >= len(self._assemblies):
            raise PayloadError(f"results for unknown bucket {msg.bucket}")
        asm = self._assemblies[msg.bucket]
        layout, R = self.layout, asm.bases.num_feature_rows()
        parts: list[tuple[int, int]] = []
        seen: set[tuple[int, int]] = set()
        for item in msg.items:
            if len(item.nodes) > layout.pack_size(R):
                raise PayloadError(
                    f"node {item.node}: {len(item.nodes)} partials packed, at most {layout.pack_size(R)} "
                    f"of {R} rows fit"
                )
            for node in item.nodes:
                slot = asm.slot.get(node)
                if slot is None:
                    raise PayloadError(f"node {node} is not in bucket {msg.bucket}")
                if item.owner == self.party_id or item.owner not in asm.owners[slot]:
                    raise PayloadError(
                        f"node {node}: a partial of party {item.owner}, which owns none of its foreign neighbours"
                    )
                if (slot, item.owner) in asm.received or (slot, item.owner) in seen:
                    raise PayloadError(
                        f"duplicate results for node {node} from the rows of party {item.owner}"
                    )
                parts.append((slot, item.owner))
                seen.add((slot, item.owner))
            want = layout.packed_groups(len(item.nodes), R) * layout.chunks
            if len(item.row_blobs) != want:
                raise PayloadError(
                    f"node {item.node}: {len(item.row_blobs)} row ciphertexts, expected {want}"
                )
        decrypted: list[np.ndarray] = []
        with self.clock("decrypt"):
            for item in msg.items:
                count = len(item.nodes)
                try:
                    dec = decrypt_rows(
                        self.holder, item.row_blobs, count * R, layout, kind="result", digest_checked=True
                    )  # the frame's decoding checked every digest
                except (CiphertextFormatError, KeyMismatchError) as exc:
                    raise crypto_error(exc, f"results of node {item.node}") from exc
                decrypted.extend(layout.unpack_items(dec, count, R))
            slots = np.array([slot for slot, _ in parts], dtype=np.int64)
            owners = np.array([owner for _, owner in parts], dtype=np.int64)
            try:
                shares: np.ndarray | None = self._check(asm, slots, owners, np.stack(decrypted))
            except ResultRejectedError as exc:
                self._refuse_at_done(exc)
                shares = None
        lo = self._offset
        for k, (slot, owner) in enumerate(parts):  # all checked: now store
            if shares is not None and self._refusal is None:
                asm.rows[slot, :, lo:] += torch.from_numpy(shares[k]).to(self.dtype)
            asm.received.add((slot, owner))
            asm.remaining[slot] -= 1
        self._arm("download", self.timeouts.download)
        done = np.unique(slots)
        self.nodes_decrypted += int(asm.filled[done].sum())  # nodes whose last partial came in
        self.ciphertexts_decrypted += sum(len(item.row_blobs) for item in msg.items)
        return []

    def _check(self, asm: _Assembly, slots: np.ndarray, owners: np.ndarray, dec: np.ndarray) -> np.ndarray:
        """``(P, R + 1, d)``: the verified feature columns of the decrypted partials ``dec`` (P, R + 1,
        d + T); partial ``k`` combines the rows of ``owners[k]``'s neighbours of the node at
        ``slots[k]`` and is checked against that owner's check keys alone (:func:`check_shares`, a
        few passes per message: at most :data:`CHECK_ENTRIES` coefficients at once, so a bucket of
        high-degree nodes checks in chunks, in order)."""
        rows, n = asm.bases.num_feature_rows(), asm.bases.n
        step = max(1, CHECK_ENTRIES // max(1, rows * n))
        return np.concatenate(
            [
                self._check_chunk(asm, slots[k : k + step], owners[k : k + step], dec[k : k + step])
                for k in range(0, len(slots), step)
            ]
        )

    def _check_chunk(
        self, asm: _Assembly, slots: np.ndarray, owners: np.ndarray, dec: np.ndarray
    ) -> np.ndarray:
        nodes = asm.bases.nodes[slots]
        theirs = asm.owners[slots] == owners[:, None]  # (P, n): the sources of each partial
        coefficients = asm.bases.coefficients(slots) * theirs[:, None, :]
        source_prf = np.zeros((*theirs.shape, TAG_COLUMNS))
        vectors = np.empty((len(slots), TAG_COLUMNS, self.dim))
        offsets = np.empty((*coefficients.shape[:2], self.dim))
        for owner in np.unique(owners).tolist():
            keys = self._my_keys.get(owner)
            at = np.flatnonzero(owners == owner)
            if keys is None:
                raise ResultRejectedError(
                    int(nodes[at[0]]), (owner,), detail=f"no check keys for owner {owner}"
                )
            if owner not in self._vectors:
                self._vectors[owner] = keys.vectors(self.dim)
            mine = theirs[at]
            block = np.zeros((*mine.shape, TAG_COLUMNS))
            sources = asm.bases.neighbours[slots[at]]
            block[mine] = prf_tags(keys.prf, self.session, sources[mine])
            source_prf[at] = block
            vectors[at] = self._vectors[owner]
            offsets[at] = pad_offsets(
                coefficients[at], sources, mine, keys.prf, self.session, self.dim, self.config.upload_pad
            )
        try:
            return check_shares(
                dec,
                coefficients,
                source_prf,
                vectors,
                nodes=nodes,
                owners=owners,
                max_row_norm=1.0,  # released rows are unit-norm (DP releases are renormalised)
                offsets=offsets,
            )
        except ResultCheckError as exc:
            # from None: a host's traceback of the error (sent to the coordinator) would show the
            # cause's text, the decrypted values (a fourteenth review pass)
            raise ResultRejectedError(exc.node, exc.owners, detail=str(exc)) from None

    def _refuse_at_done(self, exc: ResultRejectedError) -> None:
        """Keep the first refused result's error for :meth:`_on_done` and drop what was decrypted.

        Until then the client goes on exactly as if it had accepted: it checks the frames that
        follow as before (their structure, then decryption and the check, whose outcome no longer
        matters), answers nothing different, keeps uploading in a windowed round, and stores no
        value. So the server learns, per session, one bit: whether some result it sent failed its
        check, not which (on Flower each message's reply would otherwise say so; known break 22)."""
        if self._refusal is None:
            self._refusal = exc
            for a in self._assemblies:
                a.rows.zero_()

    def _on_done(self, msg: EncodingsDone) -> list[Message]:
        self._from_server(msg)
        missing = len(self.needed) - sum(int(a.filled.sum()) for a in self._assemblies)
        if msg.buckets != len(self._assemblies) or missing:
            raise PayloadError(
                f"encodings incomplete: {missing} of {len(self.needed)} nodes missing, "
                f"{len(self._assemblies)} buckets received of {msg.buckets}"
            )
        if self._refusal is not None:
            raise self._refusal  # terminal: the session ends, nothing decrypted is kept
        buckets = [EncodingBucket.from_rows(a.bases, a.rows) for a in self._assemblies]
        self.encodings = Encodings(self.config.variant, self.needed, buckets)
        self._assemblies = []
        self.state = ClientState.DONE
        self._disarm("download")
        return []

    def _discard(self) -> None:
        """After a terminal refusal: the partly assembled encodings are dropped, never trained on."""
        self._assemblies = []
        self.encodings = None
        self._close_pool()

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


def encodings_from_checkpoint(ckpt: Checkpoint, *, party: int, session: int) -> Encodings:
    """The decrypted encodings in a :meth:`ClientPretrain.checkpoint` of ``party`` in ``session``.

    Raises:
        fedgat.checkpoint.CheckpointMismatchError: another kind, party or session.
    """
    ckpt.require(CLIENT_KIND, party=party, session=session)
    return encodings_from_arrays(ckpt.meta["encodings"], ckpt.arrays)
