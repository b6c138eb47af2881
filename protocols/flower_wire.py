"""How the Flower engine packs the protocol's frames into Flower messages.

A message carries, for one party, every frame queued for it -- an ``ArrayRecord`` of raw ``uint8``
arrays under :data:`FRAMES` (so Flower chunks big ones into 5 MB pieces) -- plus a small
``ConfigRecord`` under :data:`META` (phase, set-up of a new phase, status). Message types:
:data:`HELLO` (identities), :data:`PRETRAIN` (the encrypted pre-training round) and :data:`ROUNDS`
(FedAvg). Values read from a remote party's ``ConfigRecord`` are type-checked
(:func:`config_int`, :func:`config_bytes`, :func:`config_str`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .flower_config import FLOWER_HINT, FlowerUnavailableError, RemotePartyError

try:
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise FlowerUnavailableError(f"{FLOWER_HINT} ({_exc})") from _exc

from .messages import HEADER

__all__ = [
    "FRAMES",
    "HELLO",
    "META",
    "PRETRAIN",
    "ROUNDS",
    "config_bytes",
    "config_int",
    "config_str",
    "frame_recipient",
    "frames_record",
    "message_content",
    "message_frames",
    "message_meta",
    "record_frames",
]

HELLO = "query.fedgat_hello"
PRETRAIN = "query.fedgat_pretrain"
ROUNDS = "train.fedgat_rounds"
#: the ConfigRecord of a message's metadata
META = "fedgat"
#: the ArrayRecord of a message's frames
FRAMES = "frames"
_FRAME_STYPE = "fedgat.frame"


def frames_record(frames: list[bytes]) -> ArrayRecord:
    """Frames as raw ``uint8`` arrays, in order (Flower chunks arrays above 5 MB)."""
    return ArrayRecord(
        {
            f"{i:08d}": Array(dtype="uint8", shape=(len(f),), stype=_FRAME_STYPE, data=bytes(f))
            for i, f in enumerate(frames)
        }
    )


def record_frames(record: ArrayRecord | None) -> list[bytes]:
    """The frames of :func:`frames_record`, in order."""
    if record is None:
        return []
    out = []
    for key in sorted(record):
        arr = record[key]
        if arr.stype != _FRAME_STYPE:
            raise RemotePartyError(f"array {key!r} is not a fedgat frame (stype {arr.stype!r})")
        out.append(bytes(arr.data))
    return out


def message_content(meta: Mapping[str, Any], frames: list[bytes]) -> RecordDict:
    """A message's content: ``meta`` and ``frames``."""
    return RecordDict({META: ConfigRecord(dict(meta)), FRAMES: frames_record(frames)})


def message_meta(message: Message) -> ConfigRecord:
    """The metadata of :func:`message_content`.

    Raises:
        RemotePartyError: the message has none.
    """
    meta = message.content.config_records.get(META)
    if meta is None:
        raise RemotePartyError(f"a {message.metadata.message_type} message without fedgat metadata")
    return meta


def message_frames(message: Message) -> list[bytes]:
    """The frames of :func:`message_content`, in order (none without a frames record)."""
    return record_frames(message.content.array_records.get(FRAMES))


def frame_recipient(frame: bytes) -> int:
    """The recipient party id in a frame's header."""
    if len(frame) < HEADER.size:
        raise RemotePartyError("a reply carries a frame shorter than the header")
    return int(HEADER.unpack_from(frame)[4])


def _value(record: ConfigRecord, key: str) -> Any:
    if key not in record:
        raise RemotePartyError(f"fedgat metadata without {key!r}")
    return record[key]


def config_int(record: ConfigRecord, key: str) -> int:
    """``record[key]`` as an int (an int, or a string of one).

    Raises:
        RemotePartyError: missing, or not an integer.
    """
    value = _value(record, key)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise RemotePartyError(f"fedgat metadata {key!r} is not an integer: {type(value).__name__}")
    try:
        return int(value)
    except ValueError as exc:
        raise RemotePartyError(f"fedgat metadata {key!r} is not an integer: {value!r}") from exc


def config_bytes(record: ConfigRecord, key: str) -> bytes:
    """``record[key]``, which must be bytes.

    Raises:
        RemotePartyError: missing, or not bytes.
    """
    value = _value(record, key)
    if not isinstance(value, bytes):
        raise RemotePartyError(f"fedgat metadata {key!r} is not bytes: {type(value).__name__}")
    return value


def config_str(record: ConfigRecord, key: str) -> str:
    """``record[key]``, which must be a string.

    Raises:
        RemotePartyError: missing, or not a string.
    """
    value = _value(record, key)
    if not isinstance(value, str):
        raise RemotePartyError(f"fedgat metadata {key!r} is not a string: {type(value).__name__}")
    return value
