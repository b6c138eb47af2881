r"""A pre-training client as a sans-IO state machine: announces its graph, encrypts and uploads its
feature rows, then checks, decrypts and assembles the encodings of the nodes it needs. The key dealer
is a client too (:class:`fedgat.protocols.pretrain_keys.DealerSide`). See
:mod:`fedgat.protocols.pretrain` for the message flow.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import torch

from fedgat.checkpoint import Checkpoint, encodings_to_checkpoint
from fedgat.checkpoint import encodings_from_checkpoint as encodings_from_arrays
from fedgat.crypto import (
    CiphertextFormatError,
    ContextFormatError,
    KeyHolderContext,
    KeyMismatchError,
    KeyUnwrapError,
    SlotLayout,
    WrapAAD,
    WrappingIdentity,
    encrypt_rows,
)
from fedgat.crypto.encodings import decrypt_bucket
from fedgat.crypto.tasks import NodeResult
from fedgat.encodings import BucketBases, EncodingBucket, Encodings
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
    ReleaseUpload,
    UploadDone,
    UploadItem,
    WrappedKeyDelivery,
    key_binding_bytes,
)
from .party import Handler, Party
from .party_values import PartyReport, PartySpec
from .pretrain_checks import check_bases, check_bucket_nodes, crypto_error, validate_features
from .pretrain_config import CLIENT_KIND, PretrainConfig, PretrainLimits, PretrainTimeouts
from .pretrain_plan import needed_from_neighbourhoods
from .pretrain_values import absorb_client, client_from_spec, client_spec_fields, report_client
from .roster import Identity, Roster

__all__ = ["ClientPretrain", "ClientState", "encodings_from_checkpoint"]


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
        release: with ``config.dp``, a release drawn before (a :class:`PartySpec`'s): ``features``
            are then the clean projected rows it was drawn from, and ``release_rng`` is not used.

    With ``config.dp`` the client projects its ``features`` (any finite rows), uploads the clean
    projection in FeatureUpload and the release in ReleaseUpload, announces its
    :class:`PrivacyTerms` before the first upload and refuses bases before the server confirmed the
    same terms; its own encodings' :math:`h_i` are its clean projected rows.

    Raises:
        PayloadError: invalid features or neighbourhoods (nothing is sent).

    As a value (:mod:`fedgat.protocols.pretrain_values`): :meth:`spec` before :meth:`start`,
    :meth:`report` / :meth:`absorb` with the decrypted encodings and counters.
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
        needed: np.ndarray | None = None,
        dtype: torch.dtype = torch.float32,
        upload_batch: int = 32,
        timeouts: PretrainTimeouts | None = None,
        limits: PretrainLimits | None = None,
        release_rng: RandomSource | int | None = None,
        release: np.ndarray | None = None,
    ) -> None:
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
        if config.dp is None or release is not None:
            if release is not None and config.dp is None:
                raise ValueError("a release needs the session's DP terms (config.dp)")
            self._features = validate_features(features, len(owned))
            if release is not None:
                self._release = validate_features(release, len(owned), self._features.shape[1])
        else:  # any finite rows: the projection normalises them
            raw = validate_features(features, len(owned), tol=np.inf)
            clean, self._release = config.dp.release_rows(raw, release_rng)
            self._features = validate_features(clean, len(owned))
        self._graph = GraphAnnounce(
            sender=party_id,
            recipient=roster.server,
            session=config.session,
            seq=0,
            dim=self._features.shape[1],
            owned=owned,
            indptr=np.asarray(indptr, dtype=np.int64),
            indices=np.asarray(indices, dtype=np.int64),
        )
        self._graph.check()  # PayloadError for bad neighbourhoods
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

    # --- as a value (fedgat.protocols.pretrain_values) ------------------------------------------------
    def _identity(self) -> Identity:
        return Identity(self._signer, self._wrapping)

    def _spec_fields(self) -> dict:
        return client_spec_fields(self)

    @classmethod
    def from_spec(cls, spec: PartySpec) -> ClientPretrain:
        return client_from_spec(cls, spec)

    def _report_values(self) -> tuple[dict[str, int], dict]:
        return report_client(self)

    def _absorb(self, report: PartyReport) -> None:
        absorb_client(self, report)

    # --- opening ----------------------------------------------------------------------------------
    def start(self) -> list[Message]:
        if self.state is not ClientState.NEW:
            raise StateError("start() was already called")
        wrapping = self._wrapping
        if not isinstance(wrapping, WrappingIdentity):
            raise TypeError("a client needs an X25519 WrappingIdentity")
        ed = self._signer.public_bytes()
        binding = self._signer.sign(
            key_binding_bytes(self.session, self.party_id, wrapping.public_bytes(), ed)
        )
        self.state = ClientState.AWAIT_KEY
        self._arm("keys", self.timeouts.keys)
        return [
            self._new(
                KeyAnnounce,
                self.roster.server,
                party=self.party_id,
                x25519=wrapping.public_bytes(),
                ed25519=ed,
                binding_signature=binding,
            ),
            *self._graph_messages(),
        ]

    def _graph_messages(self) -> list[Message]:
        """With DP, this client's :class:`PrivacyTerms` (before anything the server sizes by them);
        then its GraphAnnounce."""
        g = self._graph
        terms = (
            []
            if self.config.dp is None
            else [self._new(PrivacyTerms, self.roster.server, **self.config.dp_fields())]
        )
        return [
            *terms,
            self._new(
                GraphAnnounce,
                self.roster.server,
                dim=g.dim,
                owned=g.owned,
                indptr=g.indptr,
                indices=g.indices,
            ),
        ]

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
        error = MissingPartyError(
            f"client {self.party_id}: no {'wrapped key' if phase == 'keys' else 'encodings'} "
            f"from the server before the {phase} deadline",
            phase=phase,
            missing=missing,
        )
        self.state, self.failure, self.abort_reason = ClientState.ABORTED, error, str(error)
        self._disarm("keys", "download")
        return [self._new(Abort, self.roster.server, code=int(AbortCode.TIMEOUT), reason=str(error))]

    # --- key -----------------------------------------------------------------------------------------
    def _on_wrapped_key(self, msg: WrappedKeyDelivery) -> list[Message]:
        self._from_server(msg)
        if msg.dealer != self.roster.dealer or msg.target != self.party_id:
            raise PayloadError(f"wrapped key from {msg.dealer} for {msg.target} is not for this client")
        expected = WrapAAD(str(self.roster.dealer), str(self.party_id), self.session, msg.key_fingerprint)
        assert isinstance(self._wrapping, WrappingIdentity)  # start() refused a client without one
        with self.clock("keygen"):
            try:
                holder = KeyHolderContext.from_wrapped(
                    msg.wrapped,
                    self._wrapping,
                    expected,
                    dealer_public=self.roster.signing_key(self.roster.dealer),
                    presets=[self.config.preset],
                )
            except KeyUnwrapError as exc:
                raise AuthError(f"the wrapped key does not open: {exc}") from exc
            except (KeyMismatchError, ContextFormatError) as exc:
                raise crypto_error(exc, "wrapped key") from exc
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
        copies: list[tuple[type[FeatureUpload | ReleaseUpload], np.ndarray]] = [(FeatureUpload, rows)]
        if self._release is not None:
            copies.append((ReleaseUpload, self._release[start:stop]))
        c = self.layout.chunks
        for cls, values in copies:
            with self.clock("encrypt"):
                blobs = list(encrypt_rows(self.holder, values, self.layout))
            items = tuple(
                UploadItem(int(self.owned[start + k // c]), k % c, blob) for k, blob in enumerate(blobs)
            )
            self._uploaded += len(items)
            out.append(self._new(cls, self.roster.server, items=items))
        self._next_upload = stop
        if stop == len(self.owned):
            out.append(
                self._new(UploadDone, self.roster.server, nodes=len(self.owned), ciphertexts=self._uploaded)
            )
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
        element = torch.empty((), dtype=self.dtype).element_size()
        need = check_bases(msg, cfg, self.limits, self.dim * element, self._encoding_bytes)
        nodes = [int(n) for n in msg.nodes]
        check_bucket_nodes(nodes, msg.n, self._position, self._assigned, self._degree)
        rows = np.array([self._position[n] for n in nodes], dtype=np.int64)
        bases = BucketBases(
            cfg.variant,
            rows,
            np.asarray(nodes, dtype=np.int64),
            np.full((len(nodes), msg.n), -1, dtype=np.int64),
            msg.p,
            msg.q,
        )
        buf = torch.zeros((len(nodes), bases.num_feature_rows(), self.dim), dtype=self.dtype)
        self._assemblies.append(
            _Assembly(bases, buf, np.zeros(len(nodes), dtype=bool), {n: i for i, n in enumerate(nodes)})
        )
        self._assigned.update(nodes)
        self._encoding_bytes += need
        self._arm("download", self.timeouts.download)
        return []

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
                raise PayloadError(
                    f"node {item.node}: {len(item.row_blobs)} row ciphertexts, expected {want_rows}"
                )
            if item.self_blobs is not None:  # h_i is result row 0; uploads are never forwarded
                raise PayloadError(f"node {item.node}: forwarded upload ciphertexts are not accepted")
            slots.append(slot)
        sel = np.asarray(slots)
        sub = asm.bases.take(sel)
        results = [NodeResult(item.node, list(item.row_blobs)) for item in msg.items]
        with self.clock("decrypt"):
            try:
                got = decrypt_bucket(
                    self.holder, self.layout, sub, results, own_features=self._own_rows, dtype=self.dtype
                )
            except (CiphertextFormatError, KeyMismatchError) as exc:
                raise crypto_error(exc, f"results of bucket {msg.bucket}") from exc
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
            raise PayloadError(
                f"encodings incomplete: {missing} of {len(self.needed)} nodes missing, "
                f"{len(self._assemblies)} buckets received of {msg.buckets}"
            )
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


def encodings_from_checkpoint(ckpt: Checkpoint, *, party: int, session: int) -> Encodings:
    """The decrypted encodings in a :meth:`ClientPretrain.checkpoint` of ``party`` in ``session``.

    Raises:
        fedgat.checkpoint.CheckpointMismatchError: another kind, party or session.
    """
    ckpt.require(CLIENT_KIND, party=party, session=session)
    return encodings_from_arrays(ckpt.meta["encodings"], ckpt.arrays)
