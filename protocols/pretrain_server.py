r"""The pre-training server as a sans-IO state machine: relays keys, spools uploads, computes and
streams the encrypted encodings. See :mod:`fedgat.protocols.pretrain` for the message flow.

The server holds no secret key (:attr:`ServerPretrain.context` is a
:class:`~fedgat.crypto.ServerContext`). What it decides is protocol logic: which messages are legal
now, who is missing, what the round computes (:mod:`fedgat.protocols.pretrain_plan`) and where each
result goes. What is not -- where the homomorphic compute runs and where uploads are stored -- comes
in through two factories (:data:`~fedgat.crypto.encoders.EncoderFactory` and ``spool``), so that the
in-process, process-pool, Ray and Flower engines differ only in what they pass.
"""

from __future__ import annotations

import collections
import enum
import itertools
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from fedgat.crypto import ServerContext, SlotLayout
from fedgat.crypto.encoders import Encoder, EncoderFactory, local_encoder
from fedgat.crypto.encodings import PackedShares
from fedgat.crypto.measure import EncoderTiming, time_run
from fedgat.crypto.spool import CiphertextSpool
from fedgat.crypto.tasks import NodeResult
from fedgat.encodings import BucketBases
from fedgat.randomness import RandomSource
from fedgat.verdict_dp import row_recipients

from .errors import AuthError, ConfigMismatchError, MissingPartyError, PayloadError, StateError
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
    ResultItem,
    RosterReady,
    SealedCheckKeys,
    UploadDone,
    UploadGrant,
    keyset_fingerprint,
)
from .party import Handler, Party
from .pretrain_checks import check_graph_limits, check_upload_items
from .pretrain_config import PretrainConfig, PretrainLimits, PretrainTimeouts
from .pretrain_edges import (
    ClaimSet,
    OwnerMap,
    check_claims,
    expected_releases,
    neighbourhoods_of,
    relay_targets,
    verify_claim,
    verify_statement,
)
from .pretrain_keys import check_announce, load_public_context
from .pretrain_plan import ResultBatcher, RoundPlan, needed_from_neighbourhoods, plan_shares, unsound_without
from .roster import Identity, Roster

__all__ = ["ServerPretrain", "ServerState", "SpoolFactory"]

MiB = 1 << 20

#: ``spool(context, layout)`` -> the store of validated uploads
SpoolFactory = Callable[[ServerContext, SlotLayout], CiphertextSpool]


class ServerState(enum.Enum):
    COLLECTING = "collecting"  # keys, contexts, claims, graphs
    UPLOADING = "uploading"  # check keys relayed, rows released
    COMPUTING = "computing"  # streaming encrypted encodings (step)
    DONE = "done"
    ABORTED = "aborted"


class ServerPretrain(Party):
    """The server of the pre-training round: relays keys, contexts, claims and check keys, spools
    the rows released to each recipient, computes and streams each recipient's foreign shares under
    its key. Holds no secret key (:attr:`contexts` are :class:`ServerContext`). With an upload window
    (:attr:`PretrainConfig.upload_window`) it grants uploads recipient by recipient and computes each
    recipient, on an encoder of its own, as soon as its uploads are in (:attr:`peak_spooled_bytes`:
    the most its spools held at once).

    Args:
        party_id, roster, config, identity: the server's id and keys, the roster, the session.
        bases_rng: randomness of the bases (None: a fresh CSPRNG key; pass a seeded
            :class:`~fedgat.randomness.RandomSource` only to compare with a plaintext twin).
        encoder: where the homomorphic compute runs (:data:`fedgat.crypto.encoders.EncoderFactory`,
            called once when the compute phase begins; default
            :func:`~fedgat.crypto.encoders.local_encoder`: a process pool for large rounds).
        spool: makes the upload store (``spool(context, layout)``; default a
            :class:`~fedgat.crypto.spool.CiphertextSpool` in a temporary directory, removed at the end).
        result_batch_bytes: target size of an EncodingResults message.
        max_bucket_elems: largest ``p`` array of one EncodingBases message (buckets are split).
        timeouts: the server's phase deadlines (``keys``, ``upload``).
        limits: refuse announcements above these (:class:`PretrainLimits`).
    """

    def __init__(
        self,
        party_id: int,
        roster: Roster,
        config: PretrainConfig,
        identity: Identity,
        *,
        bases_rng: RandomSource | None = None,
        encoder: EncoderFactory | None = None,
        spool: SpoolFactory | None = None,
        result_batch_bytes: int = 16 * MiB,
        max_bucket_elems: int = 1 << 20,
        timeouts: PretrainTimeouts | None = None,
        limits: PretrainLimits | None = None,
    ) -> None:
        super().__init__(party_id, roster, config.session, identity.signer)
        if party_id != roster.server:
            raise ValueError("the server's party id must be the roster's server")
        self.timeouts = timeouts if timeouts is not None else PretrainTimeouts()
        self.limits = limits if limits is not None else PretrainLimits()
        self.config = config
        self.state = ServerState.COLLECTING
        #: clients still in the round (those dropped after the keys deadline are removed)
        self.participants: list[int] = list(roster.clients)
        #: clients dropped after a deadline, with the phase
        self.dropped: dict[int, str] = {}
        self._bases_rng = bases_rng if bases_rng is not None else RandomSource()
        #: where the homomorphic compute runs (called once per recipient in the compute phase)
        self.encoder_factory: EncoderFactory = encoder if encoder is not None else local_encoder()
        self._spool_factory: SpoolFactory = spool if spool is not None else CiphertextSpool
        self._result_batch_bytes = result_batch_bytes
        self._max_bucket_elems = max_bucket_elems
        #: each client's public CKKS context (the server can encrypt under it, never decrypt)
        self.contexts: dict[int, ServerContext] = {}
        self.layout: SlotLayout | None = None
        self._spools: dict[int, CiphertextSpool] = {}
        self._dim: int | None = None
        self._bases_bytes = 0
        self._announced: dict[int, KeyAnnounce] = {}
        self._context_msgs: dict[int, PublicContext] = {}
        self._graphs: dict[int, GraphAnnounce] = {}
        self._claims: dict[tuple[int, int], EdgeClaims] = {}
        self._owner: dict[int, int] = {}
        self._terms: set[int] = set()
        self._sealed: set[int] = set()
        self._expected: dict[tuple[int, int], np.ndarray] = {}
        #: (owner, recipient) -> the owner's nodes the recipient needs, whose neighbourhoods the owner
        #: states before it uploads rows for the recipient; the statements relayed so far
        self._to_state: dict[tuple[int, int], np.ndarray] = {}
        self._statements: dict[tuple[int, int], NeighbourhoodStatement] = {}
        self._unstated: dict[int, int] = {}  # recipient -> statements it still waits for
        #: upload window: recipients whose bases wait for every statement they check them against
        self._held_bases: set[int] = set()
        self._received: dict[tuple[int, int], set[tuple[int, int]]] = {}
        self._uploaded_done: set[int] = set()
        #: the round's plan (:func:`~fedgat.protocols.pretrain_plan.plan_shares`), once computing
        self.plan: RoundPlan | None = None
        self._results: Iterator[tuple[int, int, NodeResult]] | None = None
        self._encoder: Encoder | None = None
        self._batcher: ResultBatcher | None = None
        self._bucket_start: list[int] = []  # plan position of each compute bucket's first result
        #: statistics
        self.nodes_total = 0  # results (packs of partials, PackedShares) to compute
        self.nodes_computed = 0  # results computed
        self.partials_computed = 0  # (node, foreign owner) partials in them
        self.multiply_adds = 0
        self._recipient_multiply_adds: dict[int, int] = {}
        self.result_ciphertexts = 0
        self.result_rows = 0
        self.rows_released = 0
        #: processes or tasks of the encoder (set when the compute phase begins)
        self.workers = 0
        #: benchmarks: keep the spools after the round for :meth:`replay_compute`
        self.keep_encoder = False
        self._closed = False
        #: upload window (:attr:`PretrainConfig.upload_window`): recipients in grant (and plan) order,
        #: those granted, those whose uploads are all in, those computed, the one computing
        self._order: list[int] = []
        self._granted: set[int] = set()
        self._complete_set: set[int] = set()
        self._computed: set[int] = set()
        self._current: tuple[int, Iterator[tuple[int, int, NodeResult]]] | None = None
        #: most bytes the spools held at once
        self.peak_spooled_bytes = 0

    @property
    def done(self) -> bool:
        return self.state is ServerState.DONE

    @property
    def context(self) -> ServerContext | None:
        """One client's public context (the lowest id's; every client's has the same parameters)."""
        return self.contexts[min(self.contexts)] if self.contexts else None

    @property
    def ciphertexts_received(self) -> int:
        """Uploaded ciphertexts accepted so far."""
        return sum(len(s) for s in self._received.values())

    @property
    def most_recipients(self) -> dict[int, int]:
        """Owner -> to how many recipients its most-released row goes this session (from the
        confirmed releases; what each owner's verdict privacy composes over: :mod:`fedgat.verdict_dp`)."""
        by_owner: dict[int, dict[int, np.ndarray]] = {}
        for (owner, recipient), nodes in self._expected.items():
            by_owner.setdefault(owner, {})[recipient] = nodes
        return {
            owner: int(row_recipients(releases, np.unique(np.concatenate(list(releases.values())))).max())
            for owner, releases in by_owner.items()
        }

    @property
    def has_secret_key(self) -> bool:
        """Read from the server's own TenSEAL contexts (False by construction)."""
        return any(ctx.tenseal.has_secret_key() for ctx in self.contexts.values())

    def _snapshot(self) -> dict:
        return {
            "contexts": tuple(sorted(self.contexts)),
            "dim": self._dim,
            "announced": tuple(sorted(self._announced)),
            "graphs": tuple(sorted(self._graphs)),
            "claims": tuple(sorted(self._claims)),
            "statements": tuple(sorted(self._statements)),
            "held_bases": tuple(sorted(self._held_bases)),
            "owners": len(self._owner),
            "sealed": tuple(sorted(self._sealed)),
            "received": tuple((k, len(v)) for k, v in sorted(self._received.items())),
            "spooled_bytes": sum(sp.bytes_stored for sp in self._spools.values()),
            "uploaded_done": tuple(sorted(self._uploaded_done)),
            "granted": tuple(sorted(self._granted)),
            "complete": tuple(sorted(self._complete_set)),
            "terms": tuple(sorted(self._terms)),
            "nodes_computed": self.nodes_computed,
            "participants": tuple(self.participants),
            "bases_bytes": self._bases_bytes,
            "state": self.state,
        }

    def _handler(self, msg: Message) -> Handler | None:
        if self.state is ServerState.COLLECTING:
            handlers: dict[type[Message], Handler] = {
                KeyAnnounce: self._on_key_announce,
                PublicContext: self._on_public_context,
                EdgeClaims: self._on_claims,
                GraphAnnounce: self._on_graph,
                PrivacyTerms: self._on_terms,
                Abort: self._on_abort,
            }
        elif self.state is ServerState.UPLOADING:
            handlers = {
                SealedCheckKeys: self._on_sealed,
                NeighbourhoodStatement: self._on_statement,
                FeatureUpload: self._on_upload,
                UploadDone: self._on_upload_done,
                Abort: self._on_abort,
            }
        else:
            return None
        return handlers.get(type(msg))

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
        """Clients whose keys, context or graph the keys phase still waits for."""
        return sorted(
            c
            for c in self.participants
            if c not in self._announced or c not in self._context_msgs or c not in self._graphs
        )

    def _expired(self, phase: str) -> list[Message]:
        if self.state not in (ServerState.COLLECTING, ServerState.UPLOADING):
            return []
        if phase == "upload" and self.windowed and self.has_work():
            # a recipient's uploads are all in and wait for this server's compute: not the owners
            self._arm_at_next_tick("upload", self.timeouts.upload)
            return []
        if phase == "keys":
            missing = self._keys_missing()
        else:
            missing = self._owing() or [c for c in self.participants if c not in self._uploaded_done]
        if not missing:
            return []
        reason = (
            unsound_without(missing, self.participants, self._graphs, self._owner)
            if phase == "keys"
            else f"rows were already released for missing parties {missing}"
        )
        if reason is not None:
            error = MissingPartyError(
                f"pre-training phase {phase!r} timed out: {reason}", phase=phase, missing=missing
            )
            self.failure = error
            return self._abort(AbortCode.TIMEOUT, str(error))
        out = [
            self._new(
                Abort,
                c,
                code=int(AbortCode.TIMEOUT),
                reason=f"dropped: no answer before the {phase} deadline",
            )
            for c in missing
        ]
        self.participants = [c for c in self.participants if c not in missing]
        self.dropped.update((c, phase) for c in missing)
        return out + self._maybe_ready()

    # --- keys, contexts, claims, graphs --------------------------------------------------------------
    def _on_key_announce(self, msg: KeyAnnounce) -> list[Message]:
        self._require_client(msg)
        if msg.party != msg.sender:
            raise PayloadError(f"party {msg.sender} announces keys for party {msg.party}")
        if msg.sender in self._announced:
            raise StateError(f"party {msg.sender} has already announced its keys")
        check_announce(msg, self.roster, self.session)
        self._announced[msg.sender] = msg
        return self._maybe_ready()

    def _on_public_context(self, msg: PublicContext) -> list[Message]:
        self._require_client(msg)
        announced = self._announced.get(msg.sender)
        if msg.party != msg.sender or announced is None:
            raise StateError(f"party {msg.sender}'s context must follow its own key announcement")
        if msg.sender in self.contexts:
            raise StateError(f"party {msg.sender} has already sent its context")
        self.contexts[msg.sender] = load_public_context(msg, announced, self.config.preset, self.config.wire)
        self._context_msgs[msg.sender] = msg
        return self._maybe_ready()

    def _on_claims(self, msg: EdgeClaims) -> list[Message]:
        self._require_client(msg)
        if msg.claimer != msg.sender:
            raise PayloadError(f"party {msg.sender} sends party {msg.claimer}'s claim")
        if msg.sender in self._graphs:
            raise StateError(f"party {msg.sender}'s claims must come before its graph")
        if (msg.sender, msg.peer) in self._claims:
            raise StateError(f"party {msg.sender} has already claimed its edges to party {msg.peer}")
        announced = self._announced.get(msg.sender)
        if announced is None:
            raise StateError(f"party {msg.sender}'s claims must follow its key announcement")
        verify_claim(msg, self.roster, self.session, announced)
        self._claims[(msg.sender, msg.peer)] = msg
        return []

    def _on_terms(self, msg: PrivacyTerms) -> list[Message]:
        self._require_client(msg)
        self.config.check_terms(msg, f"party {msg.sender}")
        if msg.sender in self._terms:
            raise StateError(f"party {msg.sender} has already announced its DP terms")
        self._terms.add(msg.sender)
        return []

    def _on_graph(self, msg: GraphAnnounce) -> list[Message]:
        self._require_client(msg)
        if msg.sender in self._graphs:
            raise StateError(f"party {msg.sender} has already announced its graph")
        dp = self.config.dp
        if dp is not None and msg.sender not in self._terms:
            raise ConfigMismatchError(
                f"party {msg.sender} announces its graph without the session's DP terms"
            )
        if dp is not None and dp.mechanism == "gaussian" and dp.dim is not None and msg.dim > 1 + dp.dim:
            raise ConfigMismatchError(
                f"party {msg.sender} announces {msg.dim}-value rows; the session's DP release projects to "
                f"{dp.dim} dims (+ 1 marker column)"
            )
        if self._dim is not None and msg.dim != self._dim:
            raise PayloadError(f"feature dimension {msg.dim} differs from the session's {self._dim}")
        bases_bytes = check_graph_limits(msg, self.limits, self.config, len(self._owner), self._bases_bytes)
        clash = [int(n) for n in msg.owned if int(n) in self._owner]
        if clash:
            raise PayloadError(f"nodes {clash[:5]} are already owned by party {self._owner[clash[0]]}")
        self._graphs[msg.sender] = msg
        self._owner.update((int(n), msg.sender) for n in msg.owned)
        self._dim = msg.dim
        self._bases_bytes += bases_bytes
        return self._maybe_ready()

    def _maybe_ready(self) -> list[Message]:
        """Once every participant's keys, context, claims and graph are in: check the claims, relay
        keys, contexts and claims, and announce the roster (the upload phase begins)."""
        if self.state is not ServerState.COLLECTING or self._keys_missing() or not self.participants:
            return []
        self._disarm("keys")
        keep = self.participants
        graphs = {c: self._graphs[c] for c in keep}
        owners = OwnerMap(graphs)
        claims = {k: m for k, m in self._claims.items() if k[0] in keep and k[1] in keep}
        try:
            check_claims(graphs, ClaimSet.of(claims.values()), owners)
            needed = {c: needed_from_neighbourhoods(g.owned, g.indices) for c, g in graphs.items()}
            self._expected = expected_releases(needed, owners)
            self._to_state = _to_state(needed, owners)
            self._unstated = dict(collections.Counter(r for _, r in self._to_state))
        except PayloadError as exc:  # a client's claims contradict its graph or its peers'
            return self._abort(AbortCode.GRAPH_INCONSISTENT, str(exc))
        assert self._dim is not None
        self.layout = self.config.layout(self.config.row_width(self._dim), self.contexts[keep[0]].slots)
        out: list[Message] = []
        # every participant's claims, to a left-out peer too: a recipient checks that the clients it
        # borders use none of a left-out client's nodes (check_claims_complete)
        claims = {k: m for k, m in self._claims.items() if k[0] in keep}
        relay = relay_targets(claims, keep)
        for c in keep:
            for p in keep:
                if p == c:
                    continue
                a, ctx = self._announced[p], self._context_msgs[p]
                out.append(self._relay(a, c))
                out.append(self._relay(ctx, c))
            out += [self._relay(claims[k], c) for k in relay[c]]
        fingerprint = keyset_fingerprint(
            self.session, {c: self._announced[c].context_fingerprint for c in keep}
        )
        self.verifier.fingerprint = fingerprint
        out += [self._new(RosterReady, c, participants=np.array(keep, dtype=np.int64)) for c in keep]
        self.state = ServerState.UPLOADING
        self._received = {k: set() for k in self._expected}
        self.rows_released = sum(len(v) for v in self._expected.values())
        self._arm("upload", self.timeouts.upload)
        if self.config.upload_window is not None:
            out += self._open_window()
        return out

    @property
    def windowed(self) -> bool:
        """Whether uploads are paced recipient by recipient (:attr:`PretrainConfig.upload_window`)."""
        return self.config.upload_window is not None

    def _open_window(self) -> list[Message]:
        """Upload window: the plan and the bases at once (the clients take them while they upload),
        then grants for the first ``upload_window`` recipients."""
        out = self._draw_plan()
        self._order = sorted({r for _, r in self._expected})
        for _ in range(min(self.config.upload_window or 0, len(self._order))):
            out += self._grant_next()
        return out

    def _grant_next(self) -> list[Message]:
        """Grant uploads for the next recipient in order, to the owners that release rows to it."""
        r = self._order[len(self._granted)]
        self._granted.add(r)
        # each grant gives the owners a fresh deadline, from the next tick (a step may have just ended)
        self._arm_at_next_tick("upload", self.timeouts.upload)
        owners = sorted(s for s, t in self._expected if t == r)
        return [self._new(UploadGrant, s, recipients=np.array([r], dtype=np.int64)) for s in owners]

    def _all_in(self, key: tuple[int, int]) -> bool:
        """Whether every ciphertext of the rows ``(owner, recipient)`` the plan needs is in."""
        assert self.layout is not None
        return len(self._received[key]) == len(self._expected[key]) * self.layout.chunks

    def _owing(self) -> list[int]:
        """Upload window: the owners whose uploads for a granted recipient are not all in (those the
        server waits for; the others wait for a grant)."""
        return sorted({s for s, r in self._expected if r in self._granted and not self._all_in((s, r))})

    def _complete(self, recipient: int) -> bool:
        return all(self._all_in(k) for k in self._expected if k[1] == recipient)

    def _relay(self, msg: Message, to: int) -> Message:
        return self._new(type(msg), to, **msg.body())

    def _stated_for(self, recipient: int) -> bool:
        """Whether every statement ``recipient`` checks its bases against has been relayed to it."""
        return not self._unstated.get(recipient, 0)

    # --- uploads ---------------------------------------------------------------------------------------
    def _on_statement(self, msg: NeighbourhoodStatement) -> list[Message]:
        """An owner's signed statement of the neighbourhoods of its nodes a recipient needs: checked
        against its announced graph and relayed to the recipient (then, with an upload window, the
        recipient's bases if they waited for it)."""
        self._require_client(msg)
        if msg.owner != msg.sender:
            raise PayloadError(f"party {msg.sender} sends party {msg.owner}'s neighbourhood statement")
        key = (msg.sender, msg.recipient_party)
        want = self._to_state.get(key)
        if want is None:
            raise PayloadError(f"party {msg.recipient_party} needs no node of party {msg.sender}")
        if key in self._statements:
            raise StateError(
                f"party {msg.sender} has already stated its neighbourhoods for party {msg.recipient_party}"
            )
        assert self.verifier.fingerprint is not None  # the round's key set, set with the roster
        verify_statement(msg, self.roster, self.session, self.verifier.fingerprint)
        g = self._graphs[msg.sender]
        indptr, indices = neighbourhoods_of(g.owned, g.indptr, g.indices, want)
        if not (
            np.array_equal(msg.nodes, want)
            and np.array_equal(msg.indptr, indptr)
            and np.array_equal(msg.indices, indices)
        ):
            raise PayloadError(
                f"party {msg.sender}'s statement for party {msg.recipient_party} differs from its announced "
                f"graph or from the nodes party {msg.recipient_party} needs"
            )
        self._statements[key] = msg
        self._unstated[msg.recipient_party] -= 1
        out = [self._relay(msg, msg.recipient_party)]
        r = msg.recipient_party
        if r in self._held_bases and self._stated_for(r):
            self._held_bases.discard(r)
            with self.clock("server_compute"):
                out += self._bases(r)
        return out

    def _on_sealed(self, msg: SealedCheckKeys) -> list[Message]:
        self._require_client(msg)
        if msg.recipient_party != msg.sender:
            raise PayloadError(f"party {msg.sender} relays party {msg.recipient_party}'s check keys")
        if msg.sender in self._sealed:
            raise StateError(f"party {msg.sender} has already sent its check keys")
        owners = [int(b) for b in msg.owners]
        if any(b not in self.participants or b == msg.sender for b in owners):
            raise PayloadError(f"party {msg.sender}'s check keys name parties outside the round")
        self._sealed.add(msg.sender)
        return [self._relay(msg, b) for b in owners]

    def _on_upload(self, msg: FeatureUpload) -> list[Message]:
        self._require_client(msg)
        if msg.sender in self._uploaded_done:
            raise StateError(f"party {msg.sender} has already finished uploading")
        key = (msg.sender, msg.target)
        allowed = self._expected.get(key)
        if allowed is None:
            raise PayloadError(f"the round needs no rows of party {msg.sender} for party {msg.target}")
        if self.windowed and msg.target not in self._granted:
            raise PayloadError(
                f"party {msg.sender} uploads rows for party {msg.target} before the server granted them"
            )
        if key in self._to_state and key not in self._statements:
            raise PayloadError(
                f"party {msg.sender} uploads rows for party {msg.target} before stating the "
                "neighbourhoods of its nodes that party needs"
            )
        assert self.layout is not None
        received = self._received[key]
        keys = check_upload_items(
            msg.items,
            msg.sender,
            msg.target,
            allowed,
            self.layout.chunks,
            received,
            self.contexts[msg.target],
        )
        spool = self._spool(msg.target)
        for item in msg.items:  # checked just above: not deserialised a second time
            spool.put(item.node, item.chunk, item.ciphertext, validated=True)
        received.update(keys)
        held = sum(sp.bytes_stored for sp in self._spools.values())
        self.peak_spooled_bytes = max(self.peak_spooled_bytes, held)
        if self.windowed and self._complete(msg.target):
            self._complete_set.add(msg.target)
        return []

    def _spool(self, recipient: int) -> CiphertextSpool:
        if recipient not in self._spools:
            assert self.layout is not None
            self._spools[recipient] = self._spool_factory(self.contexts[recipient], self.layout)
        return self._spools[recipient]

    def _on_upload_done(self, msg: UploadDone) -> list[Message]:
        self._require_client(msg)
        if msg.sender in self._uploaded_done:
            raise StateError(f"party {msg.sender} has already finished uploading")
        assert self.layout is not None
        mine = [k for k in self._expected if k[0] == msg.sender]
        want = sum(len(self._expected[k]) for k in mine) * self.layout.chunks
        got = sum(len(self._received[k]) for k in mine)
        rows = sum(len(self._expected[k]) for k in mine)
        if got != want or msg.ciphertexts != got or msg.nodes != rows:
            short = [k[1] for k in mine if not self._all_in(k)]
            raise PayloadError(
                f"party {msg.sender} reports {msg.nodes} rows / {msg.ciphertexts} ciphertexts; the server "
                f"holds {got} of {want} (short for parties {short})"
            )
        self._uploaded_done.add(msg.sender)
        if not set(self.participants) <= self._uploaded_done:
            return []
        if not self.windowed:
            return self._begin_compute()
        self._disarm("upload")
        self.state = ServerState.COMPUTING
        return self._maybe_finish()

    def _on_abort(self, msg: Abort) -> list[Message]:
        self._require_client(msg)
        return self._abort(AbortCode.CANCELLED, f"client {msg.sender} aborted: {msg.reason}", skip=msg.sender)

    def _abort(self, code: AbortCode, reason: str, skip: int | None = None) -> list[Message]:
        self.state = ServerState.ABORTED
        self.abort_reason = reason
        self._disarm("keys", "upload")
        self._close()
        return [
            self._new(Abort, c, code=int(code), reason=reason[:1000]) for c in self.participants if c != skip
        ]

    # --- compute ------------------------------------------------------------------------------------
    def _begin_compute(self) -> list[Message]:
        self._disarm("keys", "upload")
        out = self._draw_plan()
        with self.clock("server_compute"):
            self._results = self._compute_results()
        self.state = ServerState.COMPUTING
        return out

    def _owner_labels(self, recipient: int, nodes: np.ndarray, neighbours: np.ndarray) -> np.ndarray:
        """The owner of each of a bucket's ``neighbours`` (``(B, n)``, of ``nodes``), as the bases
        sent to ``recipient`` name them and its partials are planned (from the announced graphs)."""
        return self._owners.owner(neighbours.ravel()).reshape(neighbours.shape)

    def _draw_plan(self) -> list[Message]:
        """Draw the bases (:func:`plan_shares`): the DP terms' confirmation, then every client's
        EncodingBases."""
        assert self.layout is not None
        self._owners = OwnerMap({c: self._graphs[c] for c in self.participants})
        with self.clock("server_compute"):
            plan = self.plan = plan_shares(
                {c: self._graphs[c] for c in self.participants},
                self.config.variant,
                self._bases_rng,
                layout=self.layout,
                embed_factor=self.config.embed_factor,
                max_bucket_elems=self._max_bucket_elems,
                labels=self._owner_labels,
            )
            out: list[Message] = []
            if self.config.dp is not None:  # confirm the terms before anything built on them
                out += [self._new(PrivacyTerms, c, **self.config.dp_fields()) for c in self.participants]
            self._batcher = ResultBatcher(plan, self._result_batch_bytes)
            self._bucket_start = list(itertools.accumulate((len(b) for b in plan.buckets), initial=0))
            for c in self.participants:
                # after the statements the client checks them against (without an upload window every
                # upload, hence every statement, is in by now)
                if self._stated_for(c):
                    out += self._bases(c)
                else:
                    self._held_bases.add(c)
            self.nodes_total = plan.num_results
            # each recipient's multiply-adds (what the encoder factory weighs a pool against); a
            # shares plan's buckets are its recipients' shares, so they add up to the round's
            assert plan.shares is not None
            self._recipient_multiply_adds = {
                c: sum(b.multiply_adds(self.layout) for b in shares) for c, shares in plan.shares.items()
            }
            self.multiply_adds = sum(self._recipient_multiply_adds.values())
        return out

    def _bases(self, c: int) -> list[Message]:
        """Client ``c``'s EncodingBases, one per bucket of its view of the plan."""
        assert self.plan is not None
        return [
            self._new(
                EncodingBases,
                c,
                bucket=cb,
                variant=view.variant,
                n=view.n,
                nodes=view.nodes,
                neighbours=view.neighbours,
                owners=self._owner_labels(c, view.nodes, view.neighbours),
                p=view.p,
                q=view.q,
            )
            for cb, view in enumerate(self.plan.views[c])
        ]

    @property
    def bases(self) -> list[BucketBases]:
        """The drawn bases, one per needed node (what clients receive views of; empty before)."""
        return [] if self.plan is None else self.plan.bases

    @property
    def buckets(self) -> list[PackedShares]:
        """What the encoder computes: every recipient's foreign shares, recipient by recipient."""
        return [] if self.plan is None else [b for b in self.plan.buckets if isinstance(b, PackedShares)]

    def _new_encoder(self, recipient: int) -> Encoder:
        assert self.layout is not None
        work = self._recipient_multiply_adds[recipient]
        encoder = self.encoder_factory(self.contexts[recipient], self.layout, self._spool(recipient), work)
        self.workers = max(self.workers, encoder.workers)
        return encoder

    def _prepare_encoders(self) -> None:
        """Tell a factory that has ``prepare`` every recipient of the round at once, every upload in
        (:class:`~fedgat.crypto.encoders.LocalEncoderFactory` starts one pool for all of them)."""
        prepare = getattr(self.encoder_factory, "prepare", None)
        if not callable(prepare):
            return
        assert self.layout is not None
        prepare(
            {
                c: (self.contexts[c], self._spool(c), self._recipient_multiply_adds[c])
                for c, _ in self._jobs()
            },
            self.layout,
        )

    def _close_encoders(self) -> None:
        # a round stopped midway: its results stream lets go of what it holds (a factory's encoders)
        close_stream = getattr(self._results, "close", None)
        if callable(close_stream):
            close_stream()
        if self._encoder is not None:
            self._encoder.close()
            self._encoder = None
        close = getattr(self.encoder_factory, "close", None)
        if callable(close):
            close()

    def _jobs(self) -> list[tuple[int, list[PackedShares]]]:
        """``(recipient, its compute buckets)`` in the order of :attr:`buckets`."""
        assert self.plan is not None and self.plan.shares is not None
        return [(c, shares) for c, shares in sorted(self.plan.shares.items()) if shares]

    def _round_results(self) -> Iterator[tuple[int, NodeResult]]:
        """Every recipient's ``(recipient, result)`` under its context, each recipient's in
        :attr:`buckets` order: through the factory's
        :meth:`~fedgat.crypto.encoders.LocalEncoderFactory.map_round` when it has one (one stream
        over the round's recipients, interleaved in proportion to their multiply-adds, so that every
        client downloads and decrypts while the others do), else an encoder per recipient, one after
        another."""
        jobs = self._jobs()
        self._prepare_encoders()
        map_round = getattr(self.encoder_factory, "map_round", None)
        if callable(map_round):
            self.workers = max(self.workers, int(getattr(self.encoder_factory, "pool_workers", 0)))
            assert self.layout is not None
            weights = {c: max(1, self._recipient_multiply_adds[c]) for c, _ in jobs}
            yield from map_round(jobs, self.layout, weights)
            return
        for c, shares in jobs:
            self._encoder = self._new_encoder(c)
            for result in self._encoder.map(shares):
                yield c, result
            self._encoder.close()
            self._encoder = None

    def _places(self) -> dict[int, Iterator[tuple[int, int]]]:
        """Per recipient with work, its results' ``(compute bucket, pack in it)``, in its plan order
        (its compute buckets follow the earlier recipients' in :attr:`buckets`)."""
        places: dict[int, Iterator[tuple[int, int]]] = {}
        start = 0
        for c, shares in self._jobs():
            places[c] = ((g, s) for g, b in enumerate(shares, start=start) for s in range(len(b)))
            start += len(shares)
        return places

    def _compute_results(self) -> Iterator[tuple[int, int, NodeResult]]:
        """The round's results: ``(compute bucket, pack in it, result)``, each recipient's in its
        plan order (recipients interleaved as :meth:`_round_results` yields them)."""
        at = self._places()
        for c, result in self._round_results():
            place = next(at[c], None) if c in at else None
            if place is None:
                raise RuntimeError(f"the encoder returned a result for recipient {c} beyond the plan's")
            yield *place, result
        if any(next(rest, None) is not None for rest in at.values()):
            raise RuntimeError("the encoder returned fewer results than the plan asks for")

    def _recipient_results(self, recipient: int) -> Iterator[tuple[int, int, NodeResult]]:
        """Upload window: one recipient's results, ``(compute bucket, pack in it, result)``, on an
        encoder of its own (the factory's per-recipient path). A factory with ``add_recipient``
        (:meth:`~fedgat.crypto.encoders.LocalEncoderFactory.add_recipient`) is told first, so that
        one pool serves the round's recipients one after another."""
        assert self.plan is not None and self.plan.shares is not None and self.layout is not None
        at = self._places().get(recipient, iter(()))
        add = getattr(self.encoder_factory, "add_recipient", None)
        if callable(add):
            add(recipient, self.contexts[recipient], self._spool(recipient), self.layout, self.multiply_adds)
        self._encoder = self._new_encoder(recipient)
        results = self._encoder.map(self.plan.shares[recipient])
        yield from ((g, s, result) for (g, s), result in zip(at, results, strict=True))

    def _recipient_done(self) -> list[Message]:
        """Upload window: a recipient's results are all out: its spool is deleted (unless kept for
        :meth:`replay_compute`) and the next recipient granted."""
        assert self._current is not None
        recipient, self._current = self._current[0], None
        if self._encoder is not None:
            self._encoder.close()
            self._encoder = None
        remove = getattr(self.encoder_factory, "remove_recipient", None)
        if callable(remove):
            remove(recipient)
        self._computed.add(recipient)
        spool = None if self.keep_encoder else self._spools.pop(recipient, None)
        if spool is not None:
            spool.close()
        out = self._grant_next() if len(self._granted) < len(self._order) else []
        return out + self._maybe_finish()

    def _next_recipient(self) -> int | None:
        """Upload window: the recipient to compute next, once its uploads are all in. Recipients are
        computed in plan order, whatever order their uploads complete in: the results batcher
        routes results by their position in the plan."""
        if self._current is not None or len(self._computed) == len(self._order):
            return None
        r = self._order[len(self._computed)]
        return r if r in self._complete_set else None

    def _maybe_finish(self) -> list[Message]:
        """Upload window: end the round once every upload is in and every recipient computed."""
        if self.state is not ServerState.COMPUTING or self._current is not None:
            return []
        if len(self._computed) < len(self._order):
            return []
        return self._finish()

    def _finish(self) -> list[Message]:
        assert self.plan is not None
        plan = self.plan
        out = [
            self._new(EncodingsDone, c, buckets=len(plan.views[c]), nodes=plan.results_for(c))
            for c in self.participants
        ]
        self.state = ServerState.DONE
        if not self.keep_encoder:
            self._close()
        return out

    def has_work(self) -> bool:
        if not self.windowed:
            return self.state is ServerState.COMPUTING
        busy = self._current is not None or self._next_recipient() is not None
        return busy and self.state in (ServerState.UPLOADING, ServerState.COMPUTING)

    def step(self) -> list[Message]:
        """Compute nodes until at least one results batch is ready; the last step ends the round.
        With an upload window: the recipients whose uploads are all in, one after another; the end
        of each one's results grants the next recipient's uploads."""
        out: list[Message] = []
        if self.windowed and self.state is ServerState.UPLOADING and self.has_work():
            self._arm_at_next_tick("upload", self.timeouts.upload)  # computing is not waiting for owners
        while not out and self.has_work():
            if self.windowed:
                if self._current is None:
                    c = self._next_recipient()
                    assert c is not None
                    self._current = (c, self._recipient_results(c))
                results = self._current[1]
            else:
                assert self._results is not None
                results = self._results
            with self.clock("server_compute"):
                nxt = next(results, None)
            if nxt is not None:
                out += self._emit(*nxt)
            elif self.windowed:
                out += self._recipient_done()
            else:
                out += self._finish()
        return out

    def plan_position(self, g: int, s: int) -> int:
        """The position in the plan's order (of :attr:`RoundPlan.recipients`) of pack ``s`` of
        compute bucket ``g``: results come interleaved across recipients, so their count is not it."""
        return self._bucket_start[g] + s

    def _emit(self, g: int, s: int, result: NodeResult) -> list[Message]:
        """One computed result into its recipient's batch; the batches it completes."""
        assert self._batcher is not None and self.plan is not None
        bucket = self.plan.buckets[g]
        assert isinstance(bucket, PackedShares) and bucket.owner is not None
        nodes = bucket.pack_nodes(s)
        assert nodes[0] == result.node
        self.nodes_computed += 1
        self.partials_computed += len(nodes)
        self.result_ciphertexts += len(result.row_blobs)
        self.result_rows += bucket.num_feature_rows() * len(nodes)
        item = ResultItem(result.node, bucket.owner, tuple(result.row_blobs), packed=nodes[1:])
        ready = self._batcher.add(item, self.plan_position(g, s))
        out = [self._new(EncodingResults, c, bucket=cb, items=items) for c, cb, items in ready]
        return out

    def replay_compute(self, on_result: Callable[[], object] | None = None) -> EncoderTiming:
        """Benchmarks: compute every result again with nothing else running (results are discarded).

        In the round the clients' downloads and decryptions share this machine's cores with the
        server; here they are idle, as on a server of its own. Needs :attr:`keep_encoder` set before
        the round; the encoders start afresh as in the round (one round pool from a factory with
        ``prepare``, its start-up timed too), and the spools are closed afterwards. ``on_result`` is
        called after each of the :attr:`nodes_total` results (a progress bar).
        """
        if self.state is not ServerState.DONE or not self.keep_encoder or self._closed or self.plan is None:
            raise RuntimeError("replay_compute needs a finished round with keep_encoder set")

        def replay() -> None:
            try:
                for _ in self._round_results():
                    if on_result is not None:
                        on_result()
            finally:
                self._close_encoders()  # reaps the workers, so that their CPU is counted

        self._close_encoders()  # what the round kept
        try:
            return time_run(replay)
        finally:
            self._close()

    def close(self) -> None:
        """Release the worker pool and the spools (idempotent)."""
        self._close()

    def _close(self) -> None:
        self._close_encoders()
        if not self._closed:
            for spool in self._spools.values():
                spool.close()
        self._closed = True


def _to_state(needed: Mapping[int, np.ndarray], owners: OwnerMap) -> dict[tuple[int, int], np.ndarray]:
    """``(owner, recipient) -> sorted node ids``: each recipient's needed nodes of other owners, whose
    neighbourhoods their owner states to it (:class:`NeighbourhoodStatement`)."""
    out: dict[tuple[int, int], np.ndarray] = {}
    for a, nodes in needed.items():
        who = owners.owner(nodes)
        for b in np.unique(who[(who != a) & (who >= 0)]).tolist():
            out[(int(b), a)] = np.sort(nodes[who == b])
    return out
