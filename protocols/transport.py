"""Transports move frames (bytes) between parties; they know nothing about the protocol.

The interface is deliberately small so that other engines can carry the same protocol unchanged:

* :meth:`Transport.connect` gives a party's :class:`Link`, whose ``send(to, data)`` ships a frame;
* :meth:`Transport.poll` hands the driver the next :class:`Delivery` (or None when idle).

:class:`InProcessTransport` (the default) keeps FIFO queues in one process, counts traffic and can
record a :class:`Transcript` of every frame that crosses a party boundary (sender, receiver, type,
size, bytes) for the privacy audit. A Ray adapter would host parties in actors and implement
``send`` as an actor call carrying ``bytes``; a Flower adapter would map frames to
``Message``/``ConfigRecord`` bytes with custom ``query.<type>`` message types. Both need only
per-sender-receiver FIFO order, which the protocol assumes (EncodingBases before the results of its
bucket); the state machines and message formats stay as they are.
"""

from __future__ import annotations

import os
import tempfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fedgat.crypto.encoders import EncoderFactory, local_encoder

from .messages import HEADER, MESSAGE_TYPES, SIGNATURE_SIZE, peek_type

__all__ = ["Delivery", "InProcessTransport", "Link", "Transcript", "TranscriptEntry", "Transport"]


@dataclass(frozen=True)
class Delivery:
    """One frame to hand to ``recipient``; ``sender`` is the transport-level origin (not trusted by
    the protocol, which checks signatures)."""

    sender: int
    recipient: int
    data: bytes


class Link:
    """A party's handle on a transport."""

    def __init__(self, transport: Transport, party_id: int) -> None:
        self.transport = transport
        self.party_id = party_id

    def send(self, to: int, data: bytes) -> None:
        self.transport._send(self.party_id, to, data)


class Transport:
    """Interface: ``connect(party_id) -> Link`` and ``poll() -> Delivery | None``; an engine's
    transport also says where a pre-training server it carries computes (:meth:`encoder_factory`)."""

    def connect(self, party_id: int) -> Link:
        return Link(self, party_id)

    def encoder_factory(self, workers: int | None = None) -> EncoderFactory:
        """Where a pre-training server run over this transport computes its encodings: by default
        on this machine (:func:`fedgat.crypto.encoders.local_encoder` with ``workers`` processes)."""
        return local_encoder(workers)

    def _send(self, sender: int, to: int, data: bytes) -> None:
        raise NotImplementedError

    def poll(self) -> Delivery | None:
        raise NotImplementedError


@dataclass
class TranscriptEntry:
    """One recorded frame. ``data`` is the whole frame (None when payloads are not kept)."""

    index: int
    sender: int
    recipient: int
    type_id: int | None
    size: int
    _data: bytes | None = field(default=None, repr=False)
    _offset: int | None = field(default=None, repr=False)
    _transcript: Transcript | None = field(default=None, repr=False)

    @property
    def type_name(self) -> str:
        cls = MESSAGE_TYPES.get(self.type_id) if self.type_id is not None else None
        return cls.__name__ if cls is not None else "?"

    @property
    def data(self) -> bytes | None:
        if self._data is not None:
            return self._data
        if self._offset is not None and self._transcript is not None:
            return self._transcript._read(self._offset, self.size)
        return None

    @property
    def payload(self) -> bytes | None:
        """The frame without header and signature (the message's fields)."""
        data = self.data
        return None if data is None else data[HEADER.size : len(data) - SIGNATURE_SIZE]


class Transcript:
    """Everything that crossed a party boundary, in order.

    Args:
        keep_payloads: keep each frame's bytes (False: sender, receiver, type and size only).
        directory: spill frame bytes to a file there instead of memory (for large runs).
    """

    def __init__(self, keep_payloads: bool = True, directory: str | Path | None = None) -> None:
        self.keep_payloads = keep_payloads
        self.entries: list[TranscriptEntry] = []
        self._file = None
        self._tmp = None
        if keep_payloads and directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
            fd, path = tempfile.mkstemp(prefix="transcript-", suffix=".bin", dir=directory)
            self._file = os.fdopen(fd, "w+b")
            self.path = Path(path)

    def record(self, sender: int, recipient: int, data: bytes) -> None:
        entry = TranscriptEntry(len(self.entries), sender, recipient, peek_type(data), len(data))
        if self.keep_payloads:
            if self._file is not None:
                self._file.seek(0, os.SEEK_END)
                entry._offset = self._file.tell()
                entry._transcript = self
                self._file.write(data)
            else:
                entry._data = bytes(data)
        self.entries.append(entry)

    def _read(self, offset: int, size: int) -> bytes:
        assert self._file is not None
        self._file.flush()
        self._file.seek(offset)
        return self._file.read(size)

    def __iter__(self) -> Iterator[TranscriptEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def received_by(self, party: int) -> list[TranscriptEntry]:
        return [e for e in self.entries if e.recipient == party]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TrafficLog:
    """What a transport counts of the frames it carries: messages and bytes per (sender, recipient,
    type name) in :attr:`traffic`, every frame in the optional :attr:`transcript`. Shared by the
    in-process and Ray transports."""

    transcript: Transcript | None
    #: (sender, recipient, type name) -> [messages, bytes]
    traffic: dict[tuple[int, int, str], list[int]]

    def _log(self, sender: int, to: int, data: bytes | bytearray) -> bytes:
        """Count (and record) one frame; returns it as ``bytes``. Raises TypeError for non-bytes."""
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError("transports carry bytes only")
        data = bytes(data)
        type_id = peek_type(data)
        cls = MESSAGE_TYPES.get(type_id) if type_id is not None else None
        counter = self.traffic.setdefault((sender, to, cls.__name__ if cls else "?"), [0, 0])
        counter[0] += 1
        counter[1] += len(data)
        if self.transcript is not None:
            self.transcript.record(sender, to, data)
        return data

    def _total(self, index: int, senders, recipients, types) -> int:
        return sum(
            v[index]
            for (s, r, t), v in self.traffic.items()
            if (senders is None or s in senders)
            and (recipients is None or r in recipients)
            and (types is None or t in types)
        )

    def bytes_sent(self, senders=None, recipients=None, types=None) -> int:
        """Bytes of frames from ``senders`` to ``recipients`` of ``types`` (None: any)."""
        return self._total(1, senders, recipients, types)

    def messages_sent(self, senders=None, recipients=None, types=None) -> int:
        """Frames from ``senders`` to ``recipients`` of ``types`` (None: any)."""
        return self._total(0, senders, recipients, types)


class InProcessTransport(TrafficLog, Transport):
    """FIFO queue in one process (no network). Counts messages and bytes per (sender, recipient,
    type) in :attr:`traffic` and, with a ``transcript``, records every frame."""

    def __init__(self, transcript: Transcript | None = None) -> None:
        self.transcript = transcript
        self._queue: deque[Delivery] = deque()
        #: (sender, recipient, type name) -> [messages, bytes]
        self.traffic: dict[tuple[int, int, str], list[int]] = {}

    def _send(self, sender: int, to: int, data: bytes) -> None:
        self._queue.append(Delivery(sender, to, self._log(sender, to, data)))

    def poll(self) -> Delivery | None:
        return self._queue.popleft() if self._queue else None

    def pending(self) -> int:
        return len(self._queue)
