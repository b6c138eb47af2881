r"""The frame every message travels in: header, payload, signature; the :class:`Message` base class,
its registry, and :func:`encode_message` / :func:`decode_message` (no pickle anywhere). The message
types themselves are in :mod:`~fedgat.protocols.messages_pretrain` and
:mod:`~fedgat.protocols.messages_rounds`; :mod:`fedgat.protocols.messages` documents the frame and
every type, and registers them.
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

from .codec import Codec, Digested, FixedBytes, Pieces, Reader, Text, UInt
from .errors import (
    FrameError,
    PayloadError,
    ProtocolError,
    SignatureError,
    SizeLimitError,
    UnknownTypeError,
    VersionError,
)

__all__ = [
    "CT",
    "FP",
    "HEADER",
    "KIB",
    "MAGIC",
    "MAX_CIPHERTEXT",
    "MAX_MODEL_ELEMS",
    "MAX_NEIGHBOUR_ENTRIES",
    "MAX_NODES",
    "MESSAGE_TYPES",
    "MIB",
    "MIN_CIPHERTEXT",
    "SIGNATURE_SIZE",
    "U8",
    "U16",
    "U32",
    "U64",
    "VERSION",
    "ZERO_FINGERPRINT",
    "Abort",
    "AbortCode",
    "Message",
    "decode_message",
    "encode_message",
    "fields_equal",
    "peek_type",
    "register",
    "signed_message",
    "signing_input",
]

MAGIC = b"FGAT"
#: 3: results are per (node, owner) partials (``ResultItem.owner``); 4: under secure aggregation the
#: masked input carries the evaluation counts (no EvaluationReport), so its length changed; 5: DP
#: terms name the mechanism (PrivacyTerms) and DP releases are narrower than the features (block layout);
#: 6: PublicContext names the session's ciphertext wire (``wire``); 7: the signature covers the SHA-256
#: digest of the header and payload (:func:`signing_input`) instead of those bytes themselves; 8: a
#: result item packs several nodes' partials (``ResultItem.packed``); 9: an edge claim names, signed,
#: every client its claimer claims edges to (``EdgeClaims.peers``), so no claim can be withheld unseen,
#: and sealed check keys are signed over the round's key set (owners refuse a split roster); old peers
#: fail the claims' and check keys' signatures as well as the version check; 10: each owner signs the
#: neighbourhoods of its nodes a recipient needs (NeighbourhoodStatement, type 32), which the recipient
#: checks its bases against (a server could swap an owner's rows in them unseen); 11: secure
#: aggregation binds every share to the cohort its dealer saw and adds a consistency check (each
#: survivor signs the survivor set, SecAggSurvivors/SecAggConfirm, types 27-28, and a client reveals
#: only with t such signatures, relayed in SecAggUnmaskRequest): a server showed clients different
#: cohorts or survivor sets and unmasked one input; each dealt share carries its dealer's signature,
#: revealed with it (one wrong share no longer stalls a large round); adverts carry each member's
#: settings, and a cohort runs under its strictest; DP-FedAvg noises and charges the evaluation counts;
#: 12: every row an owner releases is padded under the recipient's check key (same bytes, other
#: values: an unpadded peer's results would fail the recipient's check), known break 22; 13: the pads
#: are Gaussian (a session's verdicts are DP per row, :mod:`fedgat.verdict_dp`), other values again;
#: 14: the signature covers each ciphertext by the SHA-256 that ends its envelope instead of hashing
#: its bytes a second time (:attr:`Message.signed_digest`; :class:`~fedgat.protocols.codec.Digested`)
VERSION = 14
#: what an Ed25519 frame signature signs, before the digest (:func:`signing_input`): 55 bytes in all,
#: shorter than any frame, so no frame of an earlier version nor any other signed structure is one;
#: version 7 to 13 signed ``b"FGAT-frame-sha256\x00"`` and the digest of every byte
SIGNING_PREFIX = b"FGAT-frame-sha256-tree\x00"
HEADER = struct.Struct(">4sBHIIQQ32sI")
SIGNATURE_SIZE = 64
ZERO_FINGERPRINT = bytes(32)

KIB = KiB = 1 << 10
MIB = MiB = 1 << 20
MAX_CIPHERTEXT = 4 * MiB
#: below any envelope of the presets (n4096's results: ~47 KB): bounds the ciphertexts a frame can
#: make its receiver hash one by one before the signature is checked
MIN_CIPHERTEXT = 1 * KiB
MAX_NODES = 1 << 22
MAX_NEIGHBOUR_ENTRIES = 1 << 25
MAX_MODEL_ELEMS = 1 << 26


def fields_equal(a: Any, b: Any) -> bool:
    """Field equality for messages: arrays by dtype, shape and bytes; NaN equal to NaN."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.tobytes() == b.tobytes()
        )
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return list(a) == list(b) and all(fields_equal(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(fields_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True  # NaN fields (e.g. a loss) compare equal to themselves
    if hasattr(a, "__dataclass_fields__") and type(a) is type(b):
        return all(fields_equal(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    return a == b


@dataclass(frozen=True, eq=False, kw_only=True)
class Message:
    """Header fields shared by every message; subclasses add the payload fields of their ``SCHEMA``.

    ``signature``, ``signed_bytes`` and ``signed_digest`` are filled by :func:`decode_message` (the
    received signature, the exact bytes it covers, and what it signs of them: the SHA-256 of the
    header and payload, each ciphertext taken by its length and the SHA-256 that ends it, which
    decoding checks against its bytes -- a one-level hash tree that binds every byte as before, each
    ciphertext hashed once per party); a message built locally has none and fails verification. The
    signature covers ``signed_bytes``, not the object's fields: a receiver given an object checks that
    they agree (:func:`signed_message`), so fields changed after decoding are refused.
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
    signed_digest: bytes | None = field(default=None, repr=False)

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
        return self.header() == other.header() and fields_equal(self.body(), other.body())

    __hash__ = object.__hash__


U8, U16, U32, U64 = UInt("B"), UInt("H"), UInt("I"), UInt("Q")
FP = FixedBytes(32)
#: a ciphertext envelope (:mod:`fedgat.crypto.packing`): its last 32 bytes are its SHA-256
CT = Digested(MAX_CIPHERTEXT, MIN_CIPHERTEXT)


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
    SCHEMA: ClassVar = (("code", U16), ("reason", Text(1024)))

    code: int
    reason: str


#: type id -> message class, filled by :func:`register` (:mod:`fedgat.protocols.messages` registers all)
MESSAGE_TYPES: dict[int, type[Message]] = {}


def register(*classes: type[Message]) -> None:
    """Add message types to :data:`MESSAGE_TYPES` (a type id may be registered once)."""
    for cls in classes:
        if MESSAGE_TYPES.get(cls.TYPE, cls) is not cls:
            raise ValueError(f"type id {cls.TYPE} is taken by {MESSAGE_TYPES[cls.TYPE].__name__}")
        MESSAGE_TYPES[cls.TYPE] = cls


register(Abort)


# -------------------------------------------------------------------------------- encode/decode
def encode_message(msg: Message, signer: SigningIdentity) -> bytes:
    """Frame and sign ``msg`` with ``signer`` (the sender's Ed25519 identity).

    Raises the same typed errors a receiver would (:class:`SizeLimitError`, :class:`PayloadError`)
    when the message breaks a limit or a value check, so no party emits a frame its peer refuses --
    but for one thing it does not hash: a ciphertext whose last 32 bytes are not its SHA-256 is sent,
    and refused by its receivers (:class:`SignatureError`). fedgat's ciphertexts are built with their
    digest (:func:`fedgat.crypto.packing.envelope_body`).
    """
    cls = type(msg)
    if MESSAGE_TYPES.get(cls.TYPE) is not cls:
        raise TypeError(f"{cls.__name__} is not a registered message type")
    msg.check()
    pieces: Pieces = []
    for name, codec in cls.SCHEMA:
        codec.encode(getattr(msg, name), pieces, f"{cls.__name__}.{name}")
    length = sum(map(len, pieces))
    if length > cls.MAX_PAYLOAD:
        raise SizeLimitError(f"{cls.__name__} payload of {length} bytes exceeds the limit {cls.MAX_PAYLOAD}")
    if len(msg.fingerprint) != 32:
        raise PayloadError("fingerprint must be 32 bytes")
    head = HEADER.pack(
        MAGIC,
        VERSION,
        cls.TYPE,
        msg.sender,
        msg.recipient,
        msg.session,
        msg.seq,
        bytes(msg.fingerprint),
        length,
    )
    digest = hashlib.sha256(head)
    for piece in pieces:
        if type(piece) is not memoryview:  # a memoryview: bytes its Digested field's digest covers
            digest.update(piece)
    return b"".join([head, *pieces, signer.sign(signing_input(digest.digest()))])


def signing_input(digest: bytes) -> bytes:
    """What the sender's Ed25519 key signs for a frame of digest ``digest`` (:attr:`Message.signed_digest`):
    :data:`SIGNING_PREFIX`, then the digest. Hashing the frame (SHA-256) rather than in Ed25519 itself
    (SHA-512, twice to sign) is what makes large frames cheap to sign."""
    return SIGNING_PREFIX + digest


def peek_type(data: bytes | memoryview) -> int | None:
    """The type id of a frame's header, or None when the bytes are not a frame header."""
    if len(data) < HEADER.size or bytes(data[:4]) != MAGIC:
        return None
    return struct.unpack_from(">H", data, 5)[0]


def decode_message(data: bytes | bytearray | memoryview) -> Message:
    """Parse and structurally validate one frame; raise a :class:`ProtocolError` subclass otherwise.

    The signature is returned in the message (``signature``, ``signed_bytes``, ``signed_digest``), not
    verified; every ciphertext's own digest is (:class:`~fedgat.protocols.codec.Digested`).
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
        raise SizeLimitError(
            f"{cls.__name__} declares a {length}-byte payload; the limit is {cls.MAX_PAYLOAD}"
        )
    if len(view) != HEADER.size + length + SIGNATURE_SIZE:
        raise FrameError(
            f"frame is {len(view)} bytes; its header announces "
            f"{HEADER.size + length + SIGNATURE_SIZE} (truncated or trailing bytes)"
        )
    reader = Reader(view[HEADER.size : HEADER.size + length], hashlib.sha256(view[: HEADER.size]))
    try:
        values = {name: codec.decode(reader, f"{cls.__name__}.{name}") for name, codec in cls.SCHEMA}
        reader.finish()
        signed = bytes(view[:-SIGNATURE_SIZE])
        msg = cls(
            **values,
            sender=sender,
            recipient=recipient,
            session=session,
            seq=seq,
            fingerprint=fingerprint,
            signature=bytes(view[-SIGNATURE_SIZE:]),
            signed_bytes=signed,
            signed_digest=reader.signed_digest(),
        )
        msg.check()
    except ProtocolError:
        raise
    except (ValueError, TypeError, OverflowError, IndexError, struct.error, MemoryError) as exc:
        raise PayloadError(f"{cls.__name__}: invalid payload ({exc})") from exc
    return msg


def signed_message(msg: Message) -> Message:
    """The message that ``msg``'s signature covers: its ``signed_bytes`` and ``signature`` decoded
    again, provided that gives exactly ``msg``'s type, header and fields.

    A :class:`Message` object carries the signature it was received with, but that signature covers
    ``signed_bytes``, not the object's fields: a receiver handed an object (rather than a frame) must
    use this, so an object whose fields were changed after decoding is refused. The signature itself
    is not verified here (:meth:`fedgat.protocols.roster.Verifier.check` does that).

    Raises:
        SignatureError: no signature, or fields that are not those of the signed bytes.
        ProtocolError: the signed bytes themselves are not a valid frame (the error decoding gives).
    """
    if msg.signature is None or msg.signed_bytes is None:
        raise SignatureError(f"{msg.type_name} from {msg.sender} carries no signature")
    signed = decode_message(bytes(msg.signed_bytes) + bytes(msg.signature))
    if type(signed) is not type(msg) or signed != msg:
        raise SignatureError(
            f"{msg.type_name} from {msg.sender}: its fields are not those of the bytes its signature "
            "covers (changed after decoding?)"
        )
    return signed
