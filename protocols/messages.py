r"""Typed, versioned, signed messages and their framed binary encoding (no pickle anywhere).

Frame (all integers big-endian)::

    offset  size  field
    0       4     magic b"FGAT"
    4       1     version (1)
    5       2     message type id (table below)
    7       4     sender party id
    11      4     recipient party id
    15      8     session id (one pre-training + FedAvg run; rounds are payload fields)
    23      8     sequence number (per sender, strictly increasing, starts at 1)
    31      32    CKKS key fingerprint the message is bound to (32 zero bytes before a key exists)
    63      4     payload length L
    67      L     payload (the message's fields, :mod:`fedgat.protocols.codec`)
    67+L    64    Ed25519 signature of the sender over bytes [0, 67+L)

:func:`decode_message` checks, in this order and before allocating anything of the declared size:
length of the header, magic (:class:`FrameError`), version (:class:`VersionError`), type
(:class:`UnknownTypeError`), ``L`` against the type's payload limit (:class:`SizeLimitError`), that the
frame is exactly ``67 + L + 64`` bytes (:class:`FrameError`), then parses the payload field by field
(every field with its own limit) and runs the type's value checks (:class:`PayloadError`,
:class:`KeyFingerprintError`). It does **not** check the signature, the recipient, the session or the
sequence number: that needs the roster and the receiver's state, see
:class:`fedgat.protocols.roster.Verifier`.

Message types (limits are on the payload; ``ct`` = one enveloped CKKS ciphertext,
:func:`fedgat.crypto.serialize`, at most 4 MiB):

==  ===================  ==========================  ================================================  ========
id  type                 direction                   fields                                            limit
==  ===================  ==========================  ================================================  ========
1   KeyAnnounce          client -> server -> dealer  party, x25519 (32 B), ed25519 (32 B),             1 KiB
                                                     binding_signature (64 B)
2   PublicContext        dealer -> server            preset, context (<= 8 MiB), context_fingerprint   8 MiB+1K
3   WrappedKeyDelivery   dealer -> server -> client  dealer, target, key_fingerprint, wrapped          16 MiB+1K
                                                     (<= 16 MiB)
4   GraphAnnounce        client -> server            dim, owned (int64), indptr (int64), indices       ~320 MiB
                                                     (int64): owned nodes' neighbour lists, self first
5   FeatureUpload        client -> server            items: <= 4096 x (node u32, chunk u16, ct)        64 MiB
6   UploadDone           client -> server            nodes, ciphertexts                                64 B
7   EncodingBases        server -> client            bucket, variant, n, nodes (int64), p (float64     64 MiB
                                                     B x m x n), q (optional, same shape)
8   EncodingResults      server -> client            bucket, items: <= 65536 x (node, row cts,         256 MiB
                                                     optional self cts)
9   EncodingsDone        server -> client            buckets, nodes                                    64 B
10  GlobalModel          server -> client            round, fit, splits (<= 8 names to evaluate),      256 MiB
                                                     arrays (<= 1024 named float32, <= 2^26 each)
11  LocalUpdate          client -> server            round, num_train, loss, arrays (named float32)    256 MiB
12  EvaluationReport     client -> server            round, splits: <= 8 x (split, correct, count,     1 KiB
                                                     loss_sum)
13  Abort                any                         code, reason (UTF-8 <= 1 KiB)                     2 KiB
14  EvaluateRequest      server -> client            round, splits (evaluate the last weights again)   1 KiB
15  ReleaseUpload        client -> server            items: as FeatureUpload (the DP release copies)   64 MiB
16  PrivacyTerms         client -> server,           epsilon, delta, dim (0: no projection), seed      64 B
                         server -> client
==  ===================  ==========================  ================================================  ========

Differential privacy (sessions whose :class:`~fedgat.protocols.pretrain.PretrainConfig` has ``dp``;
types 15 and 16 are only used there, so sessions without it keep the exact frames above): a
client sends PrivacyTerms before its first upload, then for each batch a FeatureUpload of its own
nodes' *clean* projected rows and a ReleaseUpload of their DP release (:mod:`fedgat.dp`); the
server answers with its own PrivacyTerms before the first EncodingBases. Each side refuses terms
other than its configuration's, and the server refuses uploads of a client that announced none
(:class:`~fedgat.protocols.errors.ConfigMismatchError`).

Relayed messages (KeyAnnounce, WrappedKeyDelivery) are re-framed and re-signed by the server; what
makes them trustworthy end to end is inside them: the announcing party's ``binding_signature`` over
its keys, the dealer's signature inside the wrapped key (:mod:`fedgat.crypto.keys`).
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import IntEnum
from typing import Any, ClassVar

import numpy as np

from fedgat.crypto import SigningIdentity

from .codec import (
    Array,
    Bool,
    Bytes,
    Codec,
    FixedBytes,
    Float64,
    ListOf,
    NamedArrays,
    Optional,
    Reader,
    Record,
    Text,
    UInt,
)
from .errors import (
    FrameError,
    KeyFingerprintError,
    PayloadError,
    ProtocolError,
    SizeLimitError,
    UnknownTypeError,
    VersionError,
)

__all__ = [
    "HEADER",
    "MAGIC",
    "MAX_NODES",
    "MESSAGE_TYPES",
    "SIGNATURE_SIZE",
    "VERSION",
    "ZERO_FINGERPRINT",
    "Abort",
    "AbortCode",
    "EncodingBases",
    "EncodingResults",
    "EncodingsDone",
    "EvaluateRequest",
    "EvaluationReport",
    "FeatureUpload",
    "GlobalModel",
    "GraphAnnounce",
    "KeyAnnounce",
    "LocalUpdate",
    "Message",
    "PrivacyTerms",
    "PublicContext",
    "ReleaseUpload",
    "ResultItem",
    "SplitCounts",
    "UploadDone",
    "UploadItem",
    "WrappedKeyDelivery",
    "decode_message",
    "encode_message",
    "key_binding_bytes",
    "peek_type",
]

MAGIC = b"FGAT"
VERSION = 1
HEADER = struct.Struct(">4sBHIIQQ32sI")
SIGNATURE_SIZE = 64
ZERO_FINGERPRINT = bytes(32)

KiB = 1 << 10
MiB = 1 << 20
MAX_CIPHERTEXT = 4 * MiB
MAX_NODES = 1 << 22
MAX_NEIGHBOUR_ENTRIES = 1 << 25
MAX_MODEL_ELEMS = 1 << 26


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and a.tobytes() == b.tobytes())
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True  # NaN fields (e.g. a loss) compare equal to themselves
    if hasattr(a, "__dataclass_fields__") and type(a) is type(b):
        return all(_equal(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    return a == b


@dataclass(frozen=True, eq=False, kw_only=True)
class Message:
    """Header fields shared by every message; subclasses add the payload fields of their ``SCHEMA``.

    ``signature`` and ``signed_bytes`` are filled by :func:`decode_message` (the received signature and
    the exact bytes it covers); a message built locally has neither and fails verification.
    """

    TYPE: ClassVar[int] = 0
    MAX_PAYLOAD: ClassVar[int] = 0
    SCHEMA: ClassVar[tuple[tuple[str, Codec], ...]] = ()

    sender: int
    recipient: int
    session: int
    seq: int
    fingerprint: bytes = ZERO_FINGERPRINT
    signature: bytes | None = field(default=None, repr=False)
    signed_bytes: bytes | None = field(default=None, repr=False)

    @property
    def type_name(self) -> str:
        return type(self).__name__

    def check(self) -> None:
        """Value checks that need no party state (raise :class:`PayloadError` and friends)."""

    def body(self) -> dict[str, Any]:
        """The payload fields, by name."""
        return {name: getattr(self, name) for name, _ in self.SCHEMA}

    def header(self) -> tuple:
        return (self.sender, self.recipient, self.session, self.seq, self.fingerprint)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Message)
        return self.header() == other.header() and _equal(self.body(), other.body())

    __hash__ = object.__hash__


# ------------------------------------------------------------------------------ payload items
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
        return type(other) is ResultItem and _equal(self, other)

    __hash__ = object.__hash__

    def nbytes(self) -> int:
        return sum(map(len, self.row_blobs)) + sum(map(len, self.self_blobs or ()))


@dataclass(frozen=True)
class SplitCounts:
    """Evaluation counts of one split (:class:`fedgat.federated.Counts` on the wire)."""

    split: str
    correct: int
    count: int
    loss_sum: float


_U8, _U16, _U32, _U64 = UInt("B"), UInt("H"), UInt("I"), UInt("Q")
_FP = FixedBytes(32)
_CT = Bytes(MAX_CIPHERTEXT)
_UPLOAD_ITEMS = ListOf(Record(UploadItem, (("node", _U32), ("chunk", _U16), ("ciphertext", _CT))), 4096)


# ------------------------------------------------------------------------------ message types
@dataclass(frozen=True, eq=False, kw_only=True)
class KeyAnnounce(Message):
    """A party's X25519 (key-wrapping) and Ed25519 (signing) public keys.

    The roster of Ed25519 keys is authenticated out of band (pinned configuration); the X25519 key
    is bound to the party by ``binding_signature`` = Ed25519 of :func:`key_binding_bytes`, which the
    dealer checks against the roster, so the relaying server cannot substitute its own X25519 key.
    """

    TYPE: ClassVar[int] = 1
    MAX_PAYLOAD: ClassVar[int] = 1 * KiB
    SCHEMA: ClassVar = (("party", _U32), ("x25519", FixedBytes(32)), ("ed25519", FixedBytes(32)),
                        ("binding_signature", FixedBytes(64)))

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
    SCHEMA: ClassVar = (("preset", Text(32)), ("context", Bytes(8 * MiB)), ("context_fingerprint", _FP))

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
    SCHEMA: ClassVar = (("dealer", _U32), ("target", _U32), ("key_fingerprint", _FP),
                        ("wrapped", Bytes(16 * MiB)))

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
    SCHEMA: ClassVar = (("dim", _U32), ("owned", Array("<i8", MAX_NODES, ndim=1)),
                        ("indptr", Array("<i8", MAX_NODES + 1, ndim=1)),
                        ("indices", Array("<i8", MAX_NEIGHBOUR_ENTRIES, ndim=1)))

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
    SCHEMA: ClassVar = (("items", _UPLOAD_ITEMS),)

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
    SCHEMA: ClassVar = (("items", _UPLOAD_ITEMS),)

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
    SCHEMA: ClassVar = (("epsilon", Float64()), ("delta", Float64()), ("dim", _U32), ("seed", _U64))

    epsilon: float
    delta: float
    dim: int
    seed: int

    def check(self) -> None:
        if not self.epsilon > 0 or not 0 < self.delta < 1:
            raise PayloadError(f"DP terms need epsilon > 0 and 0 < delta < 1, got ({self.epsilon}, {self.delta})")


@dataclass(frozen=True, eq=False, kw_only=True)
class UploadDone(Message):
    """The sender has uploaded every chunk of every owned node."""

    TYPE: ClassVar[int] = 6
    MAX_PAYLOAD: ClassVar[int] = 64
    SCHEMA: ClassVar = (("nodes", _U32), ("ciphertexts", _U32))

    nodes: int
    ciphertexts: int


@dataclass(frozen=True, eq=False, kw_only=True)
class EncodingBases(Message):
    """The plaintext bases of one bucket of the recipient's needed nodes (equal neighbourhood
    size ``n``): ``p`` (vector: :math:`Q_i`; matrix: the :math:`p_j`) and ``q`` (matrix only), from
    which the client derives the feature-free parts (:attr:`fedgat.encodings.EncodingBucket.plain`)."""

    TYPE: ClassVar[int] = 7
    MAX_PAYLOAD: ClassVar[int] = 64 * MiB
    SCHEMA: ClassVar = (("bucket", _U32), ("variant", Text(16)), ("n", _U32),
                        ("nodes", Array("<i8", MAX_NODES, ndim=1)),
                        ("p", Array("<f8", 4 * MiB, ndim=3)), ("q", Optional(Array("<f8", 4 * MiB, ndim=3))))

    bucket: int
    variant: str
    n: int
    nodes: np.ndarray
    p: np.ndarray
    q: np.ndarray | None = None

    def check(self) -> None:
        if self.variant not in ("vector", "matrix"):
            raise PayloadError(f"unknown variant {self.variant!r}")
        B = len(self.nodes)
        if B == 0 or self.n < 1:
            raise PayloadError("a bucket needs nodes and a neighbourhood size >= 1")
        if self.p.shape[0] != B or self.p.shape[2] != self.n:
            raise PayloadError(f"p has shape {self.p.shape}, expected ({B}, m, {self.n})")
        if (self.q is None) != (self.variant == "vector"):
            raise PayloadError("q must be present exactly for the matrix variant")
        if self.q is not None and self.q.shape != self.p.shape:
            raise PayloadError("q must have the shape of p")


@dataclass(frozen=True, eq=False, kw_only=True)
class EncodingResults(Message):
    """Encrypted encodings of some nodes of one bucket (row ciphertexts, and for nodes the recipient
    does not own their forwarded uploads, :math:`h_i`)."""

    TYPE: ClassVar[int] = 8
    MAX_PAYLOAD: ClassVar[int] = 256 * MiB
    SCHEMA: ClassVar = (("bucket", _U32), ("items", ListOf(Record(ResultItem, (
        ("node", _U32), ("row_blobs", ListOf(_CT, 65536)), ("self_blobs", Optional(ListOf(_CT, 256))))),
        65536)))

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
    SCHEMA: ClassVar = (("buckets", _U32), ("nodes", _U32))

    buckets: int
    nodes: int


_SPLITS = ListOf(Text(16), 8)


def _check_splits(splits: tuple[str, ...]) -> None:
    if len(set(splits)) != len(splits) or not all(splits):
        raise PayloadError("split names must be non-empty and distinct")


@dataclass(frozen=True, eq=False, kw_only=True)
class GlobalModel(Message):
    """Global weights at the start of FedAvg round ``round``: train on them (``fit``) and/or report
    counts on them for ``splits`` (the evaluation of round ``round - 1``). Weights travel in plaintext
    (no secure aggregation)."""

    TYPE: ClassVar[int] = 10
    MAX_PAYLOAD: ClassVar[int] = 256 * MiB
    SCHEMA: ClassVar = (("round", _U32), ("fit", Bool()), ("splits", _SPLITS),
                        ("arrays", NamedArrays(1024, MAX_MODEL_ELEMS)))

    round: int
    fit: bool
    splits: tuple[str, ...]
    arrays: dict[str, np.ndarray]

    def check(self) -> None:
        _check_splits(self.splits)
        if not (self.fit or self.splits):
            raise PayloadError("a global model must ask to fit, to evaluate or both")


@dataclass(frozen=True, eq=False, kw_only=True)
class EvaluateRequest(Message):
    """Report counts for more ``splits`` on the weights of the last GlobalModel (``round``), e.g. the
    test split once the validation accuracy improved."""

    TYPE: ClassVar[int] = 14
    MAX_PAYLOAD: ClassVar[int] = 1 * KiB
    SCHEMA: ClassVar = (("round", _U32), ("splits", _SPLITS))

    round: int
    splits: tuple[str, ...]

    def check(self) -> None:
        _check_splits(self.splits)
        if not self.splits:
            raise PayloadError("an evaluation request names at least one split")


@dataclass(frozen=True, eq=False, kw_only=True)
class LocalUpdate(Message):
    """A client's weights after local training in round ``round`` and its FedAvg weight
    ``num_train``; a client without training nodes sends ``num_train = 0`` and no arrays."""

    TYPE: ClassVar[int] = 11
    MAX_PAYLOAD: ClassVar[int] = 256 * MiB
    SCHEMA: ClassVar = (("round", _U32), ("num_train", _U32), ("loss", Float64(finite=False)),
                        ("arrays", NamedArrays(1024, MAX_MODEL_ELEMS)))

    round: int
    num_train: int
    loss: float
    arrays: dict[str, np.ndarray]

    def check(self) -> None:
        if self.num_train == 0 and self.arrays:
            raise PayloadError("an update with num_train = 0 carries no arrays")
        if self.num_train > 0 and not self.arrays:
            raise PayloadError("an update with training nodes must carry the weights")


@dataclass(frozen=True, eq=False, kw_only=True)
class EvaluationReport(Message):
    """Counts of the round's global model on the client's validation/test nodes."""

    TYPE: ClassVar[int] = 12
    MAX_PAYLOAD: ClassVar[int] = 1 * KiB
    SCHEMA: ClassVar = (("round", _U32), ("splits", ListOf(Record(SplitCounts, (
        ("split", Text(16)), ("correct", _U32), ("count", _U32), ("loss_sum", Float64(finite=False)))), 8)))

    round: int
    splits: tuple[SplitCounts, ...]

    def check(self) -> None:
        names = [s.split for s in self.splits]
        if len(set(names)) != len(names):
            raise PayloadError("duplicate split in an evaluation report")
        if any(s.correct > s.count for s in self.splits):
            raise PayloadError("more correct predictions than nodes")


class AbortCode(IntEnum):
    """Why a party gave up."""

    PROTOCOL_ERROR = 1
    GRAPH_INCONSISTENT = 2
    CANCELLED = 3
    TIMEOUT = 4  # a phase's deadline passed (a party missing, or below the minimum participation)


@dataclass(frozen=True, eq=False, kw_only=True)
class Abort(Message):
    """The sender stops the session."""

    TYPE: ClassVar[int] = 13
    MAX_PAYLOAD: ClassVar[int] = 2 * KiB
    SCHEMA: ClassVar = (("code", _U16), ("reason", Text(1024)))

    code: int
    reason: str


MESSAGE_TYPES: dict[int, type[Message]] = {
    cls.TYPE: cls
    for cls in (KeyAnnounce, PublicContext, WrappedKeyDelivery, GraphAnnounce, FeatureUpload, UploadDone,
                EncodingBases, EncodingResults, EncodingsDone, GlobalModel, LocalUpdate, EvaluationReport,
                Abort, EvaluateRequest, ReleaseUpload, PrivacyTerms)
}


# -------------------------------------------------------------------------------- encode/decode
def encode_message(msg: Message, signer: SigningIdentity) -> bytes:
    """Frame and sign ``msg`` with ``signer`` (the sender's Ed25519 identity).

    Raises the same typed errors a receiver would (:class:`SizeLimitError`, :class:`PayloadError`)
    when the message breaks a limit or a value check, so no party emits a frame its peer refuses.
    """
    cls = type(msg)
    if MESSAGE_TYPES.get(cls.TYPE) is not cls:
        raise TypeError(f"{cls.__name__} is not a registered message type")
    msg.check()
    pieces: list[bytes] = []
    for name, codec in cls.SCHEMA:
        codec.encode(getattr(msg, name), pieces, f"{cls.__name__}.{name}")
    length = sum(map(len, pieces))
    if length > cls.MAX_PAYLOAD:
        raise SizeLimitError(f"{cls.__name__} payload of {length} bytes exceeds the limit {cls.MAX_PAYLOAD}")
    if len(msg.fingerprint) != 32:
        raise PayloadError("fingerprint must be 32 bytes")
    head = HEADER.pack(MAGIC, VERSION, cls.TYPE, msg.sender, msg.recipient, msg.session, msg.seq,
                       bytes(msg.fingerprint), length)
    body = b"".join([head, *pieces])
    return body + signer.sign(body)


def peek_type(data: bytes | memoryview) -> int | None:
    """The type id of a frame's header, or None when the bytes are not a frame header."""
    if len(data) < HEADER.size or bytes(data[:4]) != MAGIC:
        return None
    return struct.unpack_from(">H", data, 5)[0]


def decode_message(data: bytes | bytearray | memoryview) -> Message:
    """Parse and structurally validate one frame; raise a :class:`ProtocolError` subclass otherwise.

    The signature is returned in the message (``signature``, ``signed_bytes``), not verified.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise FrameError(f"a frame must be bytes, got {type(data).__name__}")
    view = memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)
    if len(view) < HEADER.size:
        raise FrameError(f"frame of {len(view)} bytes is shorter than the {HEADER.size}-byte header")
    magic, version, type_id, sender, recipient, session, seq, fingerprint, length = HEADER.unpack_from(view)
    if magic != MAGIC:
        raise FrameError("bad magic (not a fedgat frame)")
    if version != VERSION:
        raise VersionError(f"protocol version {version} is not supported (this is version {VERSION})")
    cls = MESSAGE_TYPES.get(type_id)
    if cls is None:
        raise UnknownTypeError(f"unknown message type {type_id}")
    if length > cls.MAX_PAYLOAD:
        raise SizeLimitError(f"{cls.__name__} declares a {length}-byte payload; the limit is {cls.MAX_PAYLOAD}")
    if len(view) != HEADER.size + length + SIGNATURE_SIZE:
        raise FrameError(f"frame is {len(view)} bytes; its header announces "
                         f"{HEADER.size + length + SIGNATURE_SIZE} (truncated or trailing bytes)")
    reader = Reader(view[HEADER.size : HEADER.size + length])
    try:
        values = {name: codec.decode(reader, f"{cls.__name__}.{name}") for name, codec in cls.SCHEMA}
        reader.finish()
        msg = cls(**values, sender=sender, recipient=recipient, session=session, seq=seq,
                  fingerprint=fingerprint, signature=bytes(view[-SIGNATURE_SIZE:]),
                  signed_bytes=bytes(view[:-SIGNATURE_SIZE]))
        msg.check()
    except ProtocolError:
        raise
    except (ValueError, TypeError, OverflowError, IndexError, struct.error, MemoryError) as exc:
        raise PayloadError(f"{cls.__name__}: invalid payload ({exc})") from exc
    return msg
