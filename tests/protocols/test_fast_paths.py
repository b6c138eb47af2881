"""The per-result fast paths of the server's main process: the codec's unlabelled list encoding
(byte-identical output, the same typed errors with the same labels) and the process engine's pipe
framing without joins (what ``send_bytes``/``recv_bytes`` carry, byte for byte)."""

from __future__ import annotations

import hashlib
import multiprocessing
import threading

import pytest

from fedgat.process_worker import decode, encode, encode_parts, recv_message, send_parts
from fedgat.protocols.codec import Bytes, Codec, ListOf, Record
from fedgat.protocols.errors import SizeLimitError
from fedgat.protocols.frame import CT, U32
from fedgat.protocols.messages_pretrain import EncodingResults, ResultItem

ITEMS = ListOf(Record(ResultItem, (("node", U32), ("owner", U32), ("row_blobs", ListOf(CT, 65536)))), 65536)


def _slow(codec: Codec, values: list, what: str) -> list[bytes]:
    """The labelled per-item loop (what ``encode_many`` replaces)."""
    out: list[bytes] = []
    for i, v in enumerate(values):
        codec.encode(v, out, f"{what}[{i}]")
    return out


def _env(body: bytes) -> bytes:
    """A stand-in ciphertext envelope: ``body`` then its SHA-256 (what a ``CT`` field ends with)."""
    return body + hashlib.sha256(body).digest()


def _items(n: int = 5) -> list[ResultItem]:
    return [
        ResultItem(i, i % 3, tuple(_env(bytes([i, k]) * (600 + k)) for k in range(i % 4))) for i in range(n)
    ]


def test_encode_many_is_byte_identical() -> None:
    items = _items()
    fast: list[bytes] = []
    ITEMS.encode(items, fast, "items")
    slow: list[bytes] = [ListOf._COUNT.pack(len(items)), *_slow(ITEMS.item, items, "items")]
    assert b"".join(fast) == b"".join(slow)
    blobs = [_env(b"a" * 1100), bytearray(_env(b"bc" * 600)), memoryview(_env(b"def" * 400))]  # labelled
    out: list = []
    CT.encode_many(blobs, out, "x")
    assert b"".join(out) == b"".join(_slow(CT, blobs, "x"))
    # a ciphertext's bytes before its digest are the only memoryview pieces (the frame's signature
    # covers them through that digest)
    assert [type(p) for p in out[:3]] == [bytes, memoryview, bytes] and bytes(out[1]) == b"a" * 1100


@pytest.mark.parametrize(
    ("bad", "error", "label"),
    [
        (ResultItem(3, 1, (b"ok", "not bytes")), TypeError, "items[3].row_blobs[1] must be bytes"),
        (ResultItem(3, -1, (b"ok",)), Exception, "items[3].owner=-1"),
        (ResultItem(3, 1, (b"x" * 1300,)), SizeLimitError, "items[3].row_blobs[0]: 1300 bytes"),
    ],
)
def test_encode_many_raises_the_labelled_error(bad: ResultItem, error: type, label: str) -> None:
    codec = ListOf(
        Record(ResultItem, (("node", U32), ("owner", U32), ("row_blobs", ListOf(Bytes(1280), 8)))), 8
    )
    items = [*_items(3), bad, *_items(2)]
    out = [b"before"]
    with pytest.raises(error) as fast:
        codec.encode(items, out, "items")
    with pytest.raises(error) as slow:
        codec.item.encode(bad, [], "items[3]")
    assert str(fast.value) == str(slow.value) and label in str(fast.value)
    assert type(fast.value) is type(slow.value)


def test_encoding_results_round_trip() -> None:
    from fedgat.protocols.frame import decode_message, encode_message
    from fedgat.protocols.roster import SigningIdentity

    signer = SigningIdentity.generate()
    msg = EncodingResults(
        sender=1, recipient=2, session=3, seq=4, fingerprint=b"\0" * 32, bucket=5, items=tuple(_items(6)[1:])
    )
    back = decode_message(encode_message(msg, signer))
    assert isinstance(back, EncodingResults) and back.items == msg.items and back.bucket == 5


@pytest.mark.parametrize("sizes", [[0], [5, 0, 7], [1 << 20, 3, 70_000], [1] * 3000])
@pytest.mark.parametrize("vectored", [True, False])
def test_send_parts_is_send_bytes(sizes: list[int], vectored: bool, monkeypatch) -> None:
    from fedgat import process_worker

    monkeypatch.setattr(process_worker, "_VECTORED_IO", vectored)  # False: the joined-copy fallback
    parts = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    a, b = multiprocessing.Pipe(duplex=True)
    try:
        writer = threading.Thread(target=send_parts, args=(a, parts))  # larger than the pipe buffer
        writer.start()
        assert b.recv_bytes() == b"".join(parts)
        writer.join()
        writer = threading.Thread(target=a.send_bytes, args=(b"".join(parts),))
        writer.start()
        got = recv_message(b)
        writer.join()
        assert isinstance(got, bytearray) and got == b"".join(parts)
        a.close()
        with pytest.raises(EOFError):
            recv_message(b)
    finally:
        b.close()


def test_encode_parts_joins_to_encode() -> None:
    value = {"op": "deliver", "args": [[[0, 1, b"x" * 100_000], [1, 0, bytearray(b"yz")]], True, {3: b""}]}
    assert b"".join(encode_parts(value)) == encode(value)
    assert decode(bytearray(encode(value))) == decode(encode(value))


def test_bytes_of_a_memoryview_of_another_format_are_its_bytes() -> None:
    """A red-team aside: ``len()`` of a memoryview of 4-byte items counts items, and the length
    prefix said 2 for 8 bytes (a malformed frame); the codec now sends its bytes."""
    import array

    out: list = []
    Bytes(64).encode(memoryview(array.array("I", [1, 2])), out, "x")
    assert out[0] == b"\x00\x00\x00\x08" and len(out[1]) == 8
