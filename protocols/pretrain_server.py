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

import enum
from collections.abc import Callable, Iterator

import numpy as np

from fedgat.crypto import ServerContext, SlotLayout
from fedgat.crypto.encoders import Encoder, EncoderFactory, local_encoder
from fedgat.crypto.encodings import release_key
from fedgat.crypto.measure import EncoderTiming, time_encoder
from fedgat.crypto.spool import CiphertextSpool
from fedgat.crypto.tasks import NodeResult
from fedgat.encodings import BucketBases
from fedgat.randomness import RandomSource

from .errors import AuthError, ConfigMismatchError, MissingPartyError, PayloadError, StateError
from .messages import (
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
    WrappedKeyDelivery,
)
from .party import Handler, Party
from .pretrain_checks import check_graph_limits, check_upload_items
from .pretrain_config import PretrainConfig, PretrainLimits, PretrainTimeouts
from .pretrain_keys import KeyRelay
from .pretrain_plan import ResultBatcher, RoundPlan, plan_round, shortfall, unsound_without
from .roster import Identity, Roster

__all__ = ["ServerPretrain", "ServerState", "SpoolFactory"]

MiB = 1 << 20

#: ``spool(context, layout)`` -> the store of validated uploads
SpoolFactory = Callable[[ServerContext, SlotLayout], CiphertextSpool]


class ServerState(enum.Enum):
    COLLECTING = "collecting"  # keys, graph, public context, uploads
    COMPUTING = "computing"  # streaming encrypted encodings (step)
    DONE = "done"
    ABORTED = "aborted"


class ServerPretrain(KeyRelay, Party):
    """The server of the pre-training round: relays keys, spools uploads, computes and streams the
    encrypted encodings. Holds no secret key (:attr:`context` is a :class:`ServerContext`).

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
        #: where the homomorphic compute runs; an engine may replace it before the compute phase
        self.encoder_factory: EncoderFactory = encoder if encoder is not None else local_encoder()
        self._spool_factory: SpoolFactory = spool if spool is not None else CiphertextSpool
        self._result_batch_bytes = result_batch_bytes
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
        #: the round's plan (:func:`~fedgat.protocols.pretrain_plan.plan_round`), once computing
        self.plan: RoundPlan | None = None
        self._results: Iterator[tuple[int, NodeResult]] | None = None
        self._encoder: Encoder | None = None
        self._batcher: ResultBatcher | None = None
        #: statistics
        self.nodes_total = 0
        self.nodes_computed = 0
        self.multiply_adds = 0
        self.result_ciphertexts = 0
        self.result_rows = 0
        #: processes or tasks of the encoder (set when the compute phase begins)
        self.workers = 0
        #: benchmarks: keep the spool after the round for :meth:`replay_compute`
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
        handlers: dict[type[Message], Handler] = {
            KeyAnnounce: self._on_key_announce,
            PublicContext: self._on_public_context,
            WrappedKeyDelivery: self._on_wrapped_key,
            GraphAnnounce: self._on_graph,
            FeatureUpload: self._on_upload,
            ReleaseUpload: self._on_release,
            UploadDone: self._on_upload_done,
            PrivacyTerms: self._on_terms,
            Abort: self._on_abort,
        }
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
        """Parties the keys phase still waits for (the dealer when it holds back the context or a
        wrapped key of an announced client)."""
        missing = {c for c in self.participants if c not in self._graphs}
        others = [c for c in self.participants if c != self.roster.dealer]
        missing |= {c for c in others if c not in self._relayed_keys}
        if self.context is None or any(
            c in self._relayed_keys and c not in self._relayed_wraps for c in others
        ):
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
        reason = unsound_without(missing, self.participants, self.roster.dealer, self._graphs, self._owner)
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
        if phase == "keys":
            self._keys_complete = True
            self._arm("upload", self.timeouts.upload)
        if set(self.participants) <= self._uploaded_done:
            out += self._begin_compute()
        return out

    def _shortfall(self, keep: list[int]) -> np.ndarray:
        """Nodes the clients ``keep`` need (their nodes and neighbours) that none of them owns."""
        graphs = [self._graphs[c] for c in keep if c in self._graphs]
        if len(graphs) < len(keep):
            return np.zeros(0, np.int64)  # graphs still to come: judged at the next deadline
        return shortfall(graphs)

    # --- graph and uploads ------------------------------------------------------------------------
    def _on_graph(self, msg: GraphAnnounce) -> list[Message]:
        self._require_client(msg)
        if msg.sender in self._graphs:
            raise StateError(f"party {msg.sender} has already announced its graph")
        dp = self.config.dp
        if dp is not None and msg.sender not in self._terms:
            raise ConfigMismatchError(
                f"party {msg.sender} announces its graph without the session's DP terms"
            )
        if dp is not None and dp.dim is not None and msg.dim > dp.dim:
            raise ConfigMismatchError(
                f"party {msg.sender} announces {msg.dim}-dim features; the session's DP "
                f"release projects to {dp.dim} dims"
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
        self._maybe_open_spool()
        return self._after_key_event()

    def _maybe_open_spool(self) -> None:
        if self._spool is None and self.context is not None and self._dim is not None:
            self.layout = self.config.layout(self._dim, self.context.slots)
            self._spool = self._spool_factory(self.context, self.layout)

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
        keys = check_upload_items(
            msg.items, msg.sender, self._owner, self.layout.chunks, received, self.context, release
        )
        for item in msg.items:  # checked just above: not deserialised a second time
            node = int(release_key(item.node)) if release else item.node
            self._spool.put(node, item.chunk, item.ciphertext, validated=True)
        received.update(keys)
        return []

    def _on_upload_done(self, msg: UploadDone) -> list[Message]:
        graph = self._uploading(msg)
        assert self.layout is not None
        want = len(graph.owned) * self.layout.chunks * self.config.copies
        got = len(self._received[msg.sender])
        if got != want or msg.ciphertexts != got or msg.nodes != len(graph.owned):
            raise PayloadError(
                f"party {msg.sender} reports {msg.nodes} nodes / {msg.ciphertexts} "
                f"ciphertexts; the server holds {got} of {want}"
            )
        self._uploaded_done.add(msg.sender)
        if set(self.participants) <= self._uploaded_done:
            return self._begin_compute()
        return []

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
        assert self.context is not None and self.layout is not None and self._spool is not None
        self._disarm("keys", "upload")
        missing = self._shortfall(self.participants)
        if len(missing):
            return self._abort(
                AbortCode.GRAPH_INCONSISTENT,
                f"{len(missing)} neighbours are owned by no client (e.g. node {int(missing[0])})",
            )
        with self.clock("server_compute"):
            plan = self.plan = plan_round(
                {c: self._graphs[c] for c in self.participants},
                self.config.variant,
                self._bases_rng,
                embed_factor=self.config.embed_factor,
                with_views=self.config.dp is not None,
                max_bucket_elems=self._max_bucket_elems,
            )
            out: list[Message] = []
            if self.config.dp is not None:  # confirm the terms before anything built on them
                out += [self._new(PrivacyTerms, c, **self.config.dp_fields()) for c in self.participants]
            self._batcher = ResultBatcher(plan, self._result_batch_bytes)
            for c in self.participants:
                for cb, view in enumerate(plan.views[c]):
                    out.append(
                        self._new(
                            EncodingBases,
                            c,
                            bucket=cb,
                            variant=view.variant,
                            n=view.n,
                            nodes=view.nodes,
                            p=view.p,
                            q=view.q,
                        )
                    )
            self.nodes_total = plan.num_results
            self.multiply_adds = plan.multiply_adds(self.layout)
            self._encoder = self._new_encoder()
            self._results = self._compute_results(self._encoder)
        self.state = ServerState.COMPUTING
        return out

    @property
    def bases(self) -> list[BucketBases]:
        """The drawn bases, one per needed node (what clients receive views of; empty before)."""
        return [] if self.plan is None else self.plan.bases

    @property
    def buckets(self) -> list[BucketBases]:
        """What the encoder computes: without DP the drawn bases themselves; with DP one result per
        distinct view of a node (:func:`fedgat.crypto.encodings.plan_views`), sources as spool keys."""
        return [] if self.plan is None else self.plan.buckets

    def _new_encoder(self) -> Encoder:
        assert self.context is not None and self.layout is not None and self._spool is not None
        encoder = self.encoder_factory(self.context, self.layout, self._spool, self.nodes_total)
        self.workers = encoder.workers
        return encoder

    def _compute_results(self, encoder: Encoder) -> Iterator[tuple[int, NodeResult]]:
        groups = (g for g, b in enumerate(self.buckets) for _ in range(len(b)))
        return zip(groups, encoder.map(self.buckets), strict=True)

    def has_work(self) -> bool:
        return self.state is ServerState.COMPUTING

    def step(self) -> list[Message]:
        """Compute nodes until at least one results batch is ready; the last step ends the round."""
        if self.state is not ServerState.COMPUTING:
            return []
        assert self._results is not None and self._batcher is not None and self.plan is not None
        plan = self.plan
        out: list[Message] = []
        while not out:
            with self.clock("server_compute"):
                nxt = next(self._results, None)
            if nxt is None:
                out.extend(
                    self._new(EncodingsDone, c, buckets=len(plan.views[c]), nodes=len(plan.needed[c]))
                    for c in self.participants
                )
                self.state = ServerState.DONE
                if self._encoder is not None:
                    self._encoder.close()
                    self._encoder = None
                if not self.keep_encoder:
                    self._close()
                break
            g, result = nxt
            self.nodes_computed += 1
            self.result_ciphertexts += len(result.row_blobs)
            self.result_rows += self.buckets[g].num_feature_rows()
            for c, cb, items in self._batcher.add(ResultItem(result.node, tuple(result.row_blobs))):
                out.append(self._new(EncodingResults, c, bucket=cb, items=items))
        return out

    def replay_compute(self) -> EncoderTiming:
        """Benchmarks: compute every result again with nothing else running (results are discarded).

        In the round the clients' downloads and decryptions share this machine's cores with the
        server; here they are idle, as on a server of its own. Needs :attr:`keep_encoder` set before
        the round; a fresh encoder from :attr:`encoder_factory` does the work (the round's was closed
        when the round ended), and the spool is closed afterwards.
        """
        if self.state is not ServerState.DONE or not self.keep_encoder or self._spool is None or self._closed:
            raise RuntimeError("replay_compute needs a finished round with keep_encoder set")
        try:
            return time_encoder(self._new_encoder(), self.buckets)
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
