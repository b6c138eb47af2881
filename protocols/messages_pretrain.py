r"""Message types of the pre-training round (ids 1-9, 16, 17, 30-32; see :mod:`fedgat.protocols.messages`)."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedgat.crypto.params import DEFAULT_WIRE, WIRES
from fedgat.dp import MECHANISMS
from fedgat.variants import as_variant

from .codec import Array, Bytes, FixedBytes, Float64, ListOf, Optional, Record, Text
from .errors import KeyFingerprintError, PayloadError
from .frame import CT, FP, MAX_NEIGHBOUR_ENTRIES, MAX_NODES, U16, U32, U64, KiB, Message, MiB, fields_equal

__all__ = [
    "EdgeClaims",
    "EncodingBases",
    "EncodingResults",
    "EncodingsDone",
    "FeatureUpload",
    "GraphAnnounce",
    "KeyAnnounce",
    "NeighbourhoodStatement",
    "PrivacyTerms",
    "PublicContext",
    "ResultItem",
    "RosterReady",
    "SealedCheckKeys",
    "UploadDone",
    "UploadGrant",
    "UploadItem",
    "claim_bytes",
    "claim_keys_digest",
    "key_binding_bytes",
    "keyset_fingerprint",
    "neighbourhood_bytes",
    "sealed_keys_bytes",
]


@dataclass(frozen=True)
class UploadItem:
    """One uploaded ciphertext: feature chunk ``chunk`` of node ``node``."""

    node: int
    chunk: int
    ciphertext: bytes


@dataclass(frozen=True, eq=False)
class ResultItem:
    """Encrypted *partial* encodings of one node: the linear map over the node's neighbours owned by
    ``owner`` only (:class:`fedgat.crypto.encodings.NodeResult` on the wire). A recipient receives
    one partial per (node, foreign owner) and checks each against that owner's check keys
    (:mod:`fedgat.crypto.tags`), so a server colluding with one owner can alter only the partial of
    that owner's own rows.

    ``packed``: further nodes of the same bucket whose partials of the same owner share these
    ciphertexts (:meth:`fedgat.crypto.SlotLayout.packed_order`: each node's whole groups, then all
    their tails in one group; at most :meth:`~fedgat.crypto.SlotLayout.pack_size` nodes in all). The
    recipient unpacks and checks every node's rows apart, as if they had come alone."""

    node: int
    owner: int
    row_blobs: tuple[bytes, ...]
    packed: tuple[int, ...] = ()

    @property
    def nodes(self) -> tuple[int, ...]:
        """``node``, then the ``packed`` ones: the order of their rows in the ciphertexts."""
        return (self.node, *self.packed)

    def __eq__(self, other: object) -> bool:
        return type(other) is ResultItem and fields_equal(self, other)

    __hash__ = object.__hash__

    def nbytes(self) -> int:
        return sum(map(len, self.row_blobs))


UPLOAD_ITEMS = ListOf(Record(UploadItem, (("node", U32), ("chunk", U16), ("ciphertext", CT))), 4096)


#: most edges one claim may list (between one client's nodes and one peer's)
MAX_CLAIM_EDGES = 1 << 22
#: the most clients one claim may name as the claimer's peers
MAX_CLAIM_PEERS = 1 << 16

#: bytes of an HPKE public key of the ML-KEM-768 + X25519 suite (ML-KEM 1184 B, then X25519 32 B)
HPKE_PUBLIC = 1216


@dataclass(frozen=True, eq=False, kw_only=True)
class KeyAnnounce(Message):
    """A client's public keys for the session: its HPKE key (ML-KEM-768 + X25519, what others seal
    their check keys to) and the fingerprint of its own CKKS public context (what others encrypt the
    rows it needs under). Relayed by the server to every other client.

    The roster of Ed25519 keys is authenticated out of band (pinned configuration); the session keys
    are bound to the party by ``binding_signature`` = Ed25519 of :func:`key_binding_bytes`, which every
    receiver checks against the roster, so the relaying server cannot substitute its own keys.
    """

    TYPE: ClassVar[int] = 1
    MAX_PAYLOAD: ClassVar[int] = 2 * KiB
    SCHEMA: ClassVar = (
        ("party", U32),
        ("hpke", FixedBytes(HPKE_PUBLIC)),
        ("ed25519", FixedBytes(32)),
        ("context_fingerprint", FP),
        ("binding_signature", FixedBytes(64)),
    )

    party: int
    hpke: bytes
    ed25519: bytes
    context_fingerprint: bytes
    binding_signature: bytes


def key_binding_bytes(
    session: int, party: int, hpke: bytes, ed25519: bytes, context_fingerprint: bytes
) -> bytes:
    """What a client signs to bind its session keys to its roster identity."""
    return (
        b"fedgat/key-announce/v2"
        + struct.pack(">QI", session, party)
        + bytes(hpke)
        + bytes(ed25519)
        + bytes(context_fingerprint)
    )


def keyset_fingerprint(session: int, contexts: dict[int, bytes]) -> bytes:
    """The fingerprint every message after key set-up is bound to: SHA-256 over the session and each
    participant's CKKS context fingerprint, in party order (:class:`RosterReady` announces it)."""
    h = hashlib.sha256(b"fedgat/keyset/v1" + struct.pack(">Q", session))
    for party in sorted(contexts):
        h.update(struct.pack(">I", party) + contexts[party])
    return h.digest()


@dataclass(frozen=True, eq=False, kw_only=True)
class PublicContext(Message):
    """Client ``party``'s public CKKS context (params + public key; no secret, relinearisation or
    Galois keys), sent to the server and relayed to every other client. Authentic through the
    fingerprint in the party's signed :class:`KeyAnnounce`.

    ``preset`` and ``wire`` (the ciphertext wire, :data:`fedgat.crypto.params.WIRES`; protocol
    version 6) name the session parameters the sender runs with, so that a party configured
    otherwise is refused at key set-up (:func:`fedgat.protocols.pretrain_keys.load_public_context`)
    rather than at its first ciphertext. They select nothing: every party writes and accepts only
    its own configuration's wire."""

    TYPE: ClassVar[int] = 2
    MAX_PAYLOAD: ClassVar[int] = 8 * MiB + 1 * KiB
    SCHEMA: ClassVar = (
        ("party", U32),
        ("preset", Text(32)),
        ("wire", Text(16)),
        ("context", Bytes(8 * MiB)),
        ("context_fingerprint", FP),
    )

    party: int
    preset: str
    context: bytes
    context_fingerprint: bytes
    wire: str = DEFAULT_WIRE

    def check(self) -> None:
        if self.wire not in WIRES:
            raise PayloadError(f"unknown ciphertext wire {self.wire!r} (expected one of {', '.join(WIRES)})")
        if hashlib.sha256(self.context).digest() != self.context_fingerprint:
            raise KeyFingerprintError("context_fingerprint is not SHA-256 of the context bytes")


def sealed_keys_bytes(
    session: int, recipient: int, sealed: tuple[bytes, ...], owners: np.ndarray, keyset: bytes
) -> bytes:
    """What a recipient signs over the check keys it sealed for ``owners``, bound to the round's key
    set as the recipient's roster gave it (``keyset``, :func:`keyset_fingerprint` of the participants'
    keys): an owner verifies with its own, so a server that shows two clients different participants
    is caught before any row is released (frame version 9)."""
    if len(keyset) != 32:
        raise ValueError("keyset is a 32-byte key-set fingerprint")
    h = hashlib.sha256(b"fedgat/check-keys/v2" + struct.pack(">QI", session, recipient) + keyset)
    h.update(np.asarray(owners, dtype="<i8").tobytes())
    for blob in sealed:
        h.update(struct.pack(">I", len(blob)) + blob)
    return h.digest()


@dataclass(frozen=True, eq=False, kw_only=True)
class SealedCheckKeys(Message):
    """Client ``recipient``'s check keys (:class:`fedgat.crypto.tags.CheckKeys`), one HPKE ciphertext
    per owner in ``owners``, signed by the recipient; the server relays it to every owner, each of
    which opens only its own entry."""

    TYPE: ClassVar[int] = 3
    MAX_PAYLOAD: ClassVar[int] = 8 * MiB
    SCHEMA: ClassVar = (
        ("recipient_party", U32),
        ("owners", Array("<i8", 4096, ndim=1)),
        ("sealed", ListOf(Bytes(2 * KiB), 4096)),
        ("keys_signature", FixedBytes(64)),
    )

    recipient_party: int
    owners: np.ndarray
    sealed: tuple[bytes, ...]
    keys_signature: bytes

    def check(self) -> None:
        if len(self.owners) != len(self.sealed):
            raise PayloadError("one sealed entry per owner")
        if len(np.unique(self.owners)) != len(self.owners) or (len(self.owners) and self.owners.min() < 0):
            raise PayloadError("owners must be distinct party ids")


def claim_keys_digest(hpke: bytes, context_fingerprint: bytes) -> bytes:
    """The digest of a client's session keys (its :class:`KeyAnnounce`'s HPKE key and CKKS context
    fingerprint, both fresh per session) that its edge claims are bound to."""
    return hashlib.sha256(b"fedgat/claim-keys/v1" + hpke + context_fingerprint).digest()


def claim_bytes(
    session: int, claimer: int, peer: int, edges: np.ndarray, uses: np.ndarray, keys: bytes, peers: np.ndarray
) -> bytes:
    """What a client signs over its claim of the edges between its nodes and ``peer``'s: bound to the
    session id and to the claimer's fresh session keys (``keys``, :func:`claim_keys_digest`), so a
    claim signed in an earlier session cannot be replayed in one that reuses its id, and to the list
    of every client it claims edges to (``peers``), so a recipient can tell a claim the server
    withheld from one the claimer never made."""
    peers = np.asarray(peers, dtype="<i8")
    return (
        b"fedgat/edge-claim/v3"
        + struct.pack(">QIII", session, claimer, peer, len(peers))
        + keys
        + hashlib.sha256(
            np.asarray(edges, dtype="<i8").tobytes()
            + np.asarray(uses, dtype="<i8").tobytes()
            + peers.tobytes()
        ).digest()
    )


@dataclass(frozen=True, eq=False, kw_only=True)
class EdgeClaims(Message):
    """The graph edges between the ``claimer``'s nodes and the ``peer``'s (rows ``(mine, theirs)``,
    sorted, distinct), with ``uses[k] = 1`` where ``theirs`` is in the attention neighbourhood of
    ``mine``; ``peers``: every client the claimer claims edges to (increasing, ``peer`` among them;
    the same in each of its claims). Signed by the claimer (``claim_signature`` over
    :func:`claim_bytes`) so that the server can relay it: an edge counts only when both owners claim
    it (:mod:`fedgat.protocols.pretrain_edges`), and a recipient holds every claim of each client it
    borders or refuses the round (frame version 9)."""

    TYPE: ClassVar[int] = 30
    MAX_PAYLOAD: ClassVar[int] = 24 * MAX_CLAIM_EDGES + 8 * MAX_CLAIM_PEERS + 1 * KiB
    SCHEMA: ClassVar = (
        ("claimer", U32),
        ("peer", U32),
        ("edges", Array("<i8", 2 * MAX_CLAIM_EDGES, ndim=2)),
        ("uses", Array("<i8", MAX_CLAIM_EDGES, ndim=1)),
        ("peers", Array("<i8", MAX_CLAIM_PEERS, ndim=1)),
        ("claim_signature", FixedBytes(64)),
    )

    claimer: int
    peer: int
    edges: np.ndarray
    uses: np.ndarray
    peers: np.ndarray
    claim_signature: bytes

    def check(self) -> None:
        e = self.edges
        if e.ndim != 2 or e.shape[1] != 2 or len(self.uses) != len(e) or not len(e):
            raise PayloadError("edges must be (k, 2) with k >= 1 and one uses flag each")
        if e.min() < 0 or e.max() >= 2**32 or not np.all(np.isin(self.uses, (0, 1))):
            raise PayloadError("edge ends must be u32 node ids and uses flags 0 or 1")
        keys = e[:, 0] * 2**32 + e[:, 1]
        if np.any(np.diff(keys) <= 0):
            raise PayloadError("edges must be sorted and distinct")
        if self.claimer == self.peer:
            raise PayloadError("a claim names another client as peer")
        _check_party_ids(self.peers, "peers")
        if self.peer not in self.peers or self.claimer in self.peers:
            raise PayloadError("a claim's peers must list its peer and not its claimer")


def _check_party_ids(ids: np.ndarray, name: str) -> None:
    """A non-empty list of party ids, increasing (so without repeats)."""
    if not len(ids) or ids.min() < 0 or np.any(np.diff(ids) <= 0):
        raise PayloadError(f"{name} must be increasing party ids")


@dataclass(frozen=True, eq=False, kw_only=True)
class RosterReady(Message):
    """Server -> client: key set-up is complete for ``participants``; every later message is bound
    to their key set (header fingerprint = :func:`keyset_fingerprint`)."""

    TYPE: ClassVar[int] = 31
    MAX_PAYLOAD: ClassVar[int] = 64 * KiB
    SCHEMA: ClassVar = (("participants", Array("<i8", 4096, ndim=1)),)

    participants: np.ndarray

    def check(self) -> None:
        _check_party_ids(self.participants, "participants")


@dataclass(frozen=True, eq=False, kw_only=True)
class GraphAnnounce(Message):
    """Public metadata the server learns: the sender's owned nodes (sorted), the feature dimension
    and each owned node's attention neighbourhood (CSR rows over ``owned``, the node itself first)."""

    TYPE: ClassVar[int] = 4
    MAX_PAYLOAD: ClassVar[int] = 8 * (2 * MAX_NODES + 1 + MAX_NEIGHBOUR_ENTRIES) + 1 * KiB
    SCHEMA: ClassVar = (
        ("dim", U32),
        ("owned", Array("<i8", MAX_NODES, ndim=1)),
        ("indptr", Array("<i8", MAX_NODES + 1, ndim=1)),
        ("indices", Array("<i8", MAX_NEIGHBOUR_ENTRIES, ndim=1)),
    )

    dim: int
    owned: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray

    def check(self) -> None:
        if self.dim < 1:
            raise PayloadError("feature dimension must be >= 1")
        if len(self.owned) == 0:
            raise PayloadError("a client must own at least one node")
        _check_neighbourhoods(self.owned, self.indptr, self.indices, "owned")


def _check_neighbourhoods(nodes: np.ndarray, indptr: np.ndarray, indices: np.ndarray, name: str) -> None:
    """CSR neighbourhoods of ``nodes`` (strictly increasing u32 ids): each non-empty, the node itself
    first, no neighbour twice."""
    if len(nodes) and (nodes.min() < 0 or nodes.max() >= 2**32 or np.any(np.diff(nodes) <= 0)):
        raise PayloadError(f"{name} node ids must be strictly increasing u32 values")
    if len(indptr) != len(nodes) + 1 or indptr[0] != 0 or indptr[-1] != len(indices):
        raise PayloadError(f"indptr must have len({name}) + 1 entries from 0 to len(indices)")
    sizes = np.diff(indptr)
    if np.any(sizes < 1):
        raise PayloadError(f"every {name} node needs a non-empty neighbourhood (itself first)")
    if len(indices) and (indices.min() < 0 or indices.max() >= 2**32):
        raise PayloadError("neighbour ids must be u32 values")
    if not np.array_equal(indices[indptr[:-1]], nodes):
        raise PayloadError("each neighbourhood must start with the node itself")
    # a neighbour listed twice would weigh twice in its node's encodings
    row = np.repeat(np.arange(len(nodes)), sizes)
    pairs = np.lexsort((indices, row))
    if np.any((np.diff(row[pairs]) == 0) & (np.diff(indices[pairs]) == 0)):
        raise PayloadError("a neighbourhood lists a node twice")


def neighbourhood_bytes(
    session: int,
    owner: int,
    recipient: int,
    keyset: bytes,
    nodes: np.ndarray,
    indptr: np.ndarray,
    indices: np.ndarray,
) -> bytes:
    """What an owner signs over the neighbourhoods of its nodes that ``recipient`` needs, bound to
    the session, both parties and the round's key set (``keyset``, :func:`keyset_fingerprint`, which
    covers every participant's fresh CKKS key), so a statement of another session or roster view is
    refused (frame version 10)."""
    if len(keyset) != 32:
        raise ValueError("keyset is a 32-byte key-set fingerprint")
    h = hashlib.sha256(b"fedgat/neighbourhoods/v1" + struct.pack(">QII", session, owner, recipient) + keyset)
    for a in (nodes, indptr, indices):
        a = np.asarray(a, dtype="<i8")
        h.update(struct.pack(">Q", len(a)) + a.tobytes())
    return h.digest()


@dataclass(frozen=True, eq=False, kw_only=True)
class NeighbourhoodStatement(Message):
    """Owner ``owner``'s statement, to ``recipient_party``, of the attention neighbourhoods (CSR over
    ``nodes``, the node itself first, as in its :class:`GraphAnnounce`) of its nodes the recipient
    needs, i.e. those the recipient's nodes attend over. Signed by the owner (``statement_signature``
    over :func:`neighbourhood_bytes`) and relayed by the server; the recipient checks the bases of
    those nodes against it. Without it a server could swap, drop or repeat the owner's rows in those
    neighbourhoods: the swapped rows' values still pass the owner's tags (known break 5).

    It tells the recipient nothing its bases do not (they name the same neighbours), and the server
    nothing its graph announcements do not."""

    TYPE: ClassVar[int] = 32
    MAX_PAYLOAD: ClassVar[int] = 8 * (2 * MAX_NODES + 1 + MAX_NEIGHBOUR_ENTRIES) + 1 * KiB
    SCHEMA: ClassVar = (
        ("owner", U32),
        ("recipient_party", U32),
        ("nodes", Array("<i8", MAX_NODES, ndim=1)),
        ("indptr", Array("<i8", MAX_NODES + 1, ndim=1)),
        ("indices", Array("<i8", MAX_NEIGHBOUR_ENTRIES, ndim=1)),
        ("statement_signature", FixedBytes(64)),
    )

    owner: int
    recipient_party: int
    nodes: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    statement_signature: bytes

    def check(self) -> None:
        if self.owner == self.recipient_party:
            raise PayloadError("a neighbourhood statement names another client as recipient")
        if len(self.nodes) == 0:
            raise PayloadError("a neighbourhood statement covers at least one node")
        _check_neighbourhoods(self.nodes, self.indptr, self.indices, "stated")

    def rows(self, nodes: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``(found (B,), neighbours (B, n))``: whether each of ``nodes`` is stated with a
        neighbourhood of size ``n``, and that neighbourhood (garbage where not found)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        if not len(self.nodes) or not len(self.indices):
            return np.zeros(len(nodes), bool), np.zeros((len(nodes), n), np.int64)
        pos = np.minimum(np.searchsorted(self.nodes, nodes), len(self.nodes) - 1)
        start, size = self.indptr[pos], np.diff(self.indptr)[pos]
        found = (self.nodes[pos] == nodes) & (size == n)
        at = np.where(found[:, None], start[:, None] + np.arange(n), 0)
        return found, self.indices[np.minimum(at, max(len(self.indices) - 1, 0))]


@dataclass(frozen=True, eq=False, kw_only=True)
class FeatureUpload(Message):
    """A batch of the sender's rows released to ``target``: its feature rows with their tag columns
    (:mod:`fedgat.crypto.tags`; with DP, the DP release), encrypted under ``target``'s public context
    (:func:`fedgat.crypto.encrypt_rows`)."""

    TYPE: ClassVar[int] = 5
    MAX_PAYLOAD: ClassVar[int] = 64 * MiB
    SCHEMA: ClassVar = (("target", U32), ("items", UPLOAD_ITEMS))

    target: int
    items: tuple[UploadItem, ...]

    def check(self) -> None:
        if not self.items:
            raise PayloadError("an upload batch needs at least one ciphertext")


@dataclass(frozen=True, eq=False, kw_only=True)
class PrivacyTerms(Message):
    """The differential-privacy terms the sender runs the session with (:class:`fedgat.dp.FeatureDP`):
    the ``mechanism`` (:data:`fedgat.dp.MECHANISMS`), ``epsilon``, ``delta``, gaussian's projection
    ``dim`` (0: no projection) and ``seed``, multibit's ``bits`` (0: LPGNN's rule) and ``low``/``high``
    bounds."""

    TYPE: ClassVar[int] = 16
    MAX_PAYLOAD: ClassVar[int] = 128
    SCHEMA: ClassVar = (
        ("mechanism", Text(16)),
        ("epsilon", Float64()),
        ("delta", Float64()),
        ("dim", U32),
        ("seed", U64),
        ("bits", U32),
        ("low", Float64()),
        ("high", Float64()),
    )

    mechanism: str
    epsilon: float
    delta: float
    dim: int
    seed: int
    bits: int
    low: float
    high: float

    #: the terms themselves (what two parties must agree on), in schema order
    SCHEMA_FIELDS: ClassVar[tuple[str, ...]] = tuple(name for name, _ in SCHEMA)

    def check(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise PayloadError(f"unknown DP mechanism {self.mechanism!r}; known: {MECHANISMS}")
        if not self.epsilon > 0 or not 0 < self.delta < 1:
            raise PayloadError(
                f"DP terms need epsilon > 0 and 0 < delta < 1, got ({self.epsilon}, {self.delta})"
            )
        if not self.low < self.high:
            raise PayloadError(f"DP bounds need low < high, got ({self.low}, {self.high})")


@dataclass(frozen=True, eq=False, kw_only=True)
class UploadDone(Message):
    """The sender has uploaded every row it releases: ``nodes`` (row, recipient) pairs in
    ``ciphertexts`` ciphertexts."""

    TYPE: ClassVar[int] = 6
    MAX_PAYLOAD: ClassVar[int] = 64
    SCHEMA: ClassVar = (("nodes", U32), ("ciphertexts", U32))

    nodes: int
    ciphertexts: int


@dataclass(frozen=True, eq=False, kw_only=True)
class UploadGrant(Message):
    """Server -> client, in a session with an upload window
    (:attr:`~fedgat.protocols.pretrain.PretrainConfig.upload_window`): the client may now upload the
    rows it releases to ``recipients`` (and no others before a later grant)."""

    TYPE: ClassVar[int] = 17
    MAX_PAYLOAD: ClassVar[int] = 64 * KiB
    SCHEMA: ClassVar = (("recipients", Array("<i8", 4096, ndim=1)),)

    recipients: np.ndarray

    def check(self) -> None:
        _check_party_ids(self.recipients, "recipients")


@dataclass(frozen=True, eq=False, kw_only=True)
class EncodingBases(Message):
    """The plaintext bases of one bucket of the recipient's needed nodes (equal neighbourhood
    size ``n``): ``p`` (vector: :math:`Q_i`; matrix: the :math:`p_j`) and ``q`` (matrix only), from
    which the client derives the feature-free parts (:attr:`fedgat.encodings.EncodingBucket.plain`);
    each node's ``neighbours`` and their ``owners``, from which it computes the share of its own
    rows and predicts the tags of the foreign share (:mod:`fedgat.crypto.tags`)."""

    TYPE: ClassVar[int] = 7
    MAX_PAYLOAD: ClassVar[int] = 64 * MiB
    SCHEMA: ClassVar = (
        ("bucket", U32),
        ("variant", Text(16)),
        ("n", U32),
        ("nodes", Array("<i8", MAX_NODES, ndim=1)),
        ("neighbours", Array("<i8", 4 * MiB, ndim=2)),
        ("owners", Array("<i8", 4 * MiB, ndim=2)),
        ("p", Array("<f8", 4 * MiB, ndim=3)),
        ("q", Optional(Array("<f8", 4 * MiB, ndim=3))),
    )

    bucket: int
    variant: str
    n: int
    nodes: np.ndarray
    neighbours: np.ndarray
    owners: np.ndarray
    p: np.ndarray
    q: np.ndarray | None = None

    def check(self) -> None:
        try:
            kind = as_variant(self.variant)
        except ValueError:
            raise PayloadError(f"unknown variant {self.variant!r}") from None
        B = len(self.nodes)
        if B == 0 or self.n < 1:
            raise PayloadError("a bucket needs nodes and a neighbourhood size >= 1")
        if self.p.shape[0] != B or self.p.shape[2] != self.n:
            raise PayloadError(f"p has shape {self.p.shape}, expected ({B}, m, {self.n})")
        if (self.q is not None) != kind.has_q:
            raise PayloadError("q must be present exactly for the matrix variant")
        if self.q is not None and self.q.shape != self.p.shape:
            raise PayloadError("q must have the shape of p")
        if self.neighbours.shape != (B, self.n) or self.owners.shape != (B, self.n):
            raise PayloadError(f"neighbours and owners must have shape ({B}, {self.n})")
        if not np.array_equal(self.neighbours[:, 0], self.nodes):
            raise PayloadError("each neighbourhood must start with the node itself")


@dataclass(frozen=True, eq=False, kw_only=True)
class EncodingResults(Message):
    """Encrypted foreign shares of some nodes of one bucket, one partial per (node, foreign owner), several
    nodes' partials of one owner packed in an item (row ciphertexts under the recipient's key)."""

    TYPE: ClassVar[int] = 8
    MAX_PAYLOAD: ClassVar[int] = 256 * MiB
    SCHEMA: ClassVar = (
        ("bucket", U32),
        (
            "items",
            ListOf(
                Record(
                    ResultItem,
                    (
                        ("node", U32),
                        ("owner", U32),
                        ("packed", ListOf(U32, 16384)),
                        ("row_blobs", ListOf(CT, 65536)),
                    ),
                ),
                65536,
            ),
        ),
    )

    bucket: int
    items: tuple[ResultItem, ...]

    def check(self) -> None:
        if not self.items:
            raise PayloadError("a results batch needs at least one node")


@dataclass(frozen=True, eq=False, kw_only=True)
class EncodingsDone(Message):
    """Every bucket and every foreign share (``nodes`` results) of the recipient has been sent."""

    TYPE: ClassVar[int] = 9
    MAX_PAYLOAD: ClassVar[int] = 64
    SCHEMA: ClassVar = (("buckets", U32), ("nodes", U32))

    buckets: int
    nodes: int
