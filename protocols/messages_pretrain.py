r"""Message types of the pre-training round (ids 1-9, 15, 16; see :mod:`fedgat.protocols.messages`)."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedgat.variants import as_variant

from .codec import Array, Bytes, FixedBytes, Float64, ListOf, Optional, Record, Text
from .errors import KeyFingerprintError, PayloadError
from .frame import CT, FP, MAX_NEIGHBOUR_ENTRIES, MAX_NODES, U16, U32, U64, KiB, Message, MiB, fields_equal

__all__ = [
    "EncodingBases",
    "EncodingResults",
    "EncodingsDone",
    "FeatureUpload",
    "GraphAnnounce",
    "KeyAnnounce",
    "PrivacyTerms",
    "PublicContext",
    "ReleaseUpload",
    "ResultItem",
    "UploadDone",
    "UploadItem",
    "WrappedKeyDelivery",
    "key_binding_bytes",
]


@dataclass(frozen=True)
class UploadItem:
    """One uploaded ciphertext: feature chunk ``chunk`` of node ``node``."""

    node: int
    chunk: int
    ciphertext: bytes


@dataclass(frozen=True, eq=False)
class ResultItem:
    """Encrypted encodings of one node (:class:`fedgat.crypto.encodings.NodeResult` on the wire).

    ``self_blobs`` (forwarded upload ciphertexts) stays in the schema for wire compatibility but is
    no longer used: :math:`h_i` is result row 0, and clients refuse items that carry it."""

    node: int
    row_blobs: tuple[bytes, ...]
    self_blobs: tuple[bytes, ...] | None = None

    def __eq__(self, other: object) -> bool:
        return type(other) is ResultItem and fields_equal(self, other)

    __hash__ = object.__hash__

    def nbytes(self) -> int:
        return sum(map(len, self.row_blobs)) + sum(map(len, self.self_blobs or ()))


UPLOAD_ITEMS = ListOf(Record(UploadItem, (("node", U32), ("chunk", U16), ("ciphertext", CT))), 4096)


@dataclass(frozen=True, eq=False, kw_only=True)
class KeyAnnounce(Message):
    """A party's X25519 (key-wrapping) and Ed25519 (signing) public keys.

    The roster of Ed25519 keys is authenticated out of band (pinned configuration); the X25519 key
    is bound to the party by ``binding_signature`` = Ed25519 of :func:`key_binding_bytes`, which the
    dealer checks against the roster, so the relaying server cannot substitute its own X25519 key.
    """

    TYPE: ClassVar[int] = 1
    MAX_PAYLOAD: ClassVar[int] = 1 * KiB
    SCHEMA: ClassVar = (
        ("party", U32),
        ("x25519", FixedBytes(32)),
        ("ed25519", FixedBytes(32)),
        ("binding_signature", FixedBytes(64)),
    )

    party: int
    x25519: bytes
    ed25519: bytes
    binding_signature: bytes


def key_binding_bytes(session: int, party: int, x25519: bytes, ed25519: bytes) -> bytes:
    """What a party signs to bind its X25519 key to its roster identity in a session."""
    return b"fedgat/key-announce/v1" + struct.pack(">QI", session, party) + bytes(x25519) + bytes(ed25519)


@dataclass(frozen=True, eq=False, kw_only=True)
class PublicContext(Message):
    """The dealer's public CKKS context (params + public key, no secret/relin/Galois keys)."""

    TYPE: ClassVar[int] = 2
    MAX_PAYLOAD: ClassVar[int] = 8 * MiB + 1 * KiB
    SCHEMA: ClassVar = (("preset", Text(32)), ("context", Bytes(8 * MiB)), ("context_fingerprint", FP))

    preset: str
    context: bytes
    context_fingerprint: bytes

    def check(self) -> None:
        if hashlib.sha256(self.context).digest() != self.context_fingerprint:
            raise KeyFingerprintError("context_fingerprint is not SHA-256 of the context bytes")
        if self.fingerprint != self.context_fingerprint:
            raise KeyFingerprintError("header fingerprint differs from the announced context's")


@dataclass(frozen=True, eq=False, kw_only=True)
class WrappedKeyDelivery(Message):
    """The CKKS secret context wrapped by the dealer for ``target`` (relayed by the server, which
    cannot open it: :meth:`fedgat.crypto.KeyHolderContext.wrap_for`)."""

    TYPE: ClassVar[int] = 3
    MAX_PAYLOAD: ClassVar[int] = 16 * MiB + 1 * KiB
    SCHEMA: ClassVar = (
        ("dealer", U32),
        ("target", U32),
        ("key_fingerprint", FP),
        ("wrapped", Bytes(16 * MiB)),
    )

    dealer: int
    target: int
    key_fingerprint: bytes
    wrapped: bytes

    def check(self) -> None:
        if self.fingerprint != self.key_fingerprint:
            raise KeyFingerprintError("header fingerprint differs from the wrapped key's fingerprint")


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
        owned, indptr, indices = self.owned, self.indptr, self.indices
        if self.dim < 1:
            raise PayloadError("feature dimension must be >= 1")
        if len(owned) == 0:
            raise PayloadError("a client must own at least one node")
        if owned.min() < 0 or owned.max() >= 2**32 or np.any(np.diff(owned) <= 0):
            raise PayloadError("owned node ids must be strictly increasing u32 values")
        if len(indptr) != len(owned) + 1 or indptr[0] != 0 or indptr[-1] != len(indices):
            raise PayloadError("indptr must have len(owned) + 1 entries from 0 to len(indices)")
        sizes = np.diff(indptr)
        if np.any(sizes < 1):
            raise PayloadError("every owned node needs a non-empty neighbourhood (itself first)")
        if len(indices) and (indices.min() < 0 or indices.max() >= 2**32):
            raise PayloadError("neighbour ids must be u32 values")
        if not np.array_equal(indices[indptr[:-1]], owned):
            raise PayloadError("each neighbourhood must start with the node itself")


@dataclass(frozen=True, eq=False, kw_only=True)
class FeatureUpload(Message):
    """A batch of the sender's encrypted feature chunks (:func:`fedgat.crypto.encrypt_rows`)."""

    TYPE: ClassVar[int] = 5
    MAX_PAYLOAD: ClassVar[int] = 64 * MiB
    SCHEMA: ClassVar = (("items", UPLOAD_ITEMS),)

    items: tuple[UploadItem, ...]

    def check(self) -> None:
        if not self.items:
            raise PayloadError("an upload batch needs at least one ciphertext")


@dataclass(frozen=True, eq=False, kw_only=True)
class ReleaseUpload(Message):
    """A batch of the sender's encrypted *DP release* chunks (:meth:`fedgat.dp.FeatureDP.release_rows`);
    same items and limits as :class:`FeatureUpload`, which carries the clean copies in a DP session.
    The server uses them in the encodings it sends to every client but the sender."""

    TYPE: ClassVar[int] = 15
    MAX_PAYLOAD: ClassVar[int] = 64 * MiB
    SCHEMA: ClassVar = (("items", UPLOAD_ITEMS),)

    items: tuple[UploadItem, ...]

    def check(self) -> None:
        if not self.items:
            raise PayloadError("a release batch needs at least one ciphertext")


@dataclass(frozen=True, eq=False, kw_only=True)
class PrivacyTerms(Message):
    """The differential-privacy terms the sender runs the session with (:class:`fedgat.dp.FeatureDP`):
    ``epsilon``, ``delta``, projection ``dim`` (0: no projection) and projection ``seed``."""

    TYPE: ClassVar[int] = 16
    MAX_PAYLOAD: ClassVar[int] = 64
    SCHEMA: ClassVar = (("epsilon", Float64()), ("delta", Float64()), ("dim", U32), ("seed", U64))

    epsilon: float
    delta: float
    dim: int
    seed: int

    def check(self) -> None:
        if not self.epsilon > 0 or not 0 < self.delta < 1:
            raise PayloadError(
                f"DP terms need epsilon > 0 and 0 < delta < 1, got ({self.epsilon}, {self.delta})"
            )


@dataclass(frozen=True, eq=False, kw_only=True)
class UploadDone(Message):
    """The sender has uploaded every chunk of every owned node."""

    TYPE: ClassVar[int] = 6
    MAX_PAYLOAD: ClassVar[int] = 64
    SCHEMA: ClassVar = (("nodes", U32), ("ciphertexts", U32))

    nodes: int
    ciphertexts: int


@dataclass(frozen=True, eq=False, kw_only=True)
class EncodingBases(Message):
    """The plaintext bases of one bucket of the recipient's needed nodes (equal neighbourhood
    size ``n``): ``p`` (vector: :math:`Q_i`; matrix: the :math:`p_j`) and ``q`` (matrix only), from
    which the client derives the feature-free parts (:attr:`fedgat.encodings.EncodingBucket.plain`)."""

    TYPE: ClassVar[int] = 7
    MAX_PAYLOAD: ClassVar[int] = 64 * MiB
    SCHEMA: ClassVar = (
        ("bucket", U32),
        ("variant", Text(16)),
        ("n", U32),
        ("nodes", Array("<i8", MAX_NODES, ndim=1)),
        ("p", Array("<f8", 4 * MiB, ndim=3)),
        ("q", Optional(Array("<f8", 4 * MiB, ndim=3))),
    )

    bucket: int
    variant: str
    n: int
    nodes: np.ndarray
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


@dataclass(frozen=True, eq=False, kw_only=True)
class EncodingResults(Message):
    """Encrypted encodings of some nodes of one bucket (row ciphertexts, and for nodes the recipient
    does not own their forwarded uploads, :math:`h_i`)."""

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
                        ("row_blobs", ListOf(CT, 65536)),
                        ("self_blobs", Optional(ListOf(CT, 256))),
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
    """Every bucket and node of the recipient has been sent."""

    TYPE: ClassVar[int] = 9
    MAX_PAYLOAD: ClassVar[int] = 64
    SCHEMA: ClassVar = (("buckets", U32), ("nodes", U32))

    buckets: int
    nodes: int
