"""Field codecs for message payloads: struct-based, size-limited, no pickle.

A payload is the concatenation of its fields in schema order, every integer big-endian:

===============  ==========================================================================
codec            wire form
===============  ==========================================================================
UInt(fmt)        1/2/4/8 bytes unsigned (``B``/``H``/``I``/``Q``)
Bool             1 byte, 0 or 1
Float64          8 bytes IEEE-754 double
FixedBytes(n)    exactly ``n`` bytes
Bytes(max)       u32 length, then the bytes (length <= max)
Digested(max)    as Bytes, at least ``min_len`` bytes, the last 32 being the SHA-256 of the rest
                 (a ciphertext envelope)
Text(max)        u16 length, then UTF-8 (length <= max)
Array(dtype)     u8 dtype code (1 float32, 2 float64, 3 int64), u8 ndim, ndim x u32 dims, then the
                 elements little-endian, C order (element count <= max)
NamedArrays      u16 count, then per array: Text name, Array (float32); names unique
ListOf(item)     u32 count (<= max), then the items
Optional(item)   u8 flag (0 absent, 1 present), then the item if present
Record(fields)   the fields in order (a small frozen dataclass on the Python side)
===============  ==========================================================================

Decoding checks every declared size against its limit *before* reading or allocating
(:class:`~fedgat.protocols.errors.SizeLimitError`), reports truncation and bad flags as
:class:`~fedgat.protocols.errors.FrameError` and bad values (NaN, infinity, invalid UTF-8, duplicate
names) as :class:`~fedgat.protocols.errors.PayloadError`. Encoding enforces the same limits, so a
party never emits a frame its peer would refuse for its structure.

:class:`Digested` fields carry their own SHA-256 (every ciphertext envelope does,
:func:`fedgat.crypto.packing.envelope_body`), so the frame's signature covers such a field by its
length and digest instead of hashing its bytes again (:attr:`fedgat.protocols.frame.Message.signed_digest`):
decoding checks each digest and leaves the bytes it covers out of the frame's digest as it reads
(:meth:`Reader.cover`); encoding appends those bytes as a ``memoryview`` -- the only codec that
appends one -- so that the sender leaves exactly them out of the digest it signs.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import FrameError, PayloadError, SignatureError, SizeLimitError

__all__ = [
    "DIGEST_SIZE",
    "Array",
    "Bool",
    "Bytes",
    "Codec",
    "Digested",
    "FixedBytes",
    "Float64",
    "ListOf",
    "NamedArrays",
    "Optional",
    "Pieces",
    "Reader",
    "Record",
    "Text",
    "UInt",
]


#: what a codec's ``encode`` appends to: ``bytes``, and ``memoryview`` only for the bytes of a
#: :class:`Digested` field that its digest covers
Pieces = list[bytes | memoryview]

#: bytes of the SHA-256 digest that ends a :class:`Digested` value
DIGEST_SIZE = 32


class Reader:
    """Bounds-checked cursor over a payload. With ``digest`` (a ``hashlib`` object, e.g. already fed
    the frame's header) it also hashes the payload as it is read, leaving out the bytes that
    :class:`Digested` fields' own digests cover (:meth:`cover`): :meth:`signed_digest`."""

    __slots__ = ("_buf", "_digest", "_mark", "_pos")

    def __init__(self, buf: memoryview, digest: Any = None) -> None:
        self._buf = buf
        self._pos = 0
        self._digest = digest
        self._mark = 0  # the payload is hashed up to here

    @property
    def position(self) -> int:
        return self._pos

    def cover(self, start: int, end: int) -> None:
        """Payload bytes ``[start, end)`` are covered by a digest of their own: hash what lies before
        them (from the last covered range on), then skip them."""
        if self._digest is not None:
            self._digest.update(self._buf[self._mark : start])
        self._mark = end

    def signed_digest(self) -> bytes:
        """The digest of everything fed before the payload and of the payload without its covered
        ranges (once the payload is read: :meth:`finish`)."""
        if self._digest is None:
            raise ValueError("this reader hashes nothing")
        self._digest.update(self._buf[self._mark :])
        self._mark = len(self._buf)
        return bytes(self._digest.digest())

    @property
    def remaining(self) -> int:
        return len(self._buf) - self._pos

    def take(self, n: int, what: str) -> memoryview:
        if n > self.remaining:
            raise FrameError(f"truncated payload: {what} needs {n} bytes, {self.remaining} left")
        out = self._buf[self._pos : self._pos + n]
        self._pos += n
        return out

    def unpack(self, st: struct.Struct, what: str) -> tuple:
        return st.unpack(self.take(st.size, what))

    def finish(self) -> None:
        if self.remaining:
            raise FrameError(f"{self.remaining} trailing bytes after the last field")


class Codec:
    """One field's wire form: ``encode(value, out)`` appends bytes, ``decode(reader)`` reads them."""

    def encode(self, value: Any, out: Pieces, what: str) -> None:
        raise NotImplementedError

    def decode(self, reader: Reader, what: str) -> Any:
        raise NotImplementedError

    def encode_many(self, values: Sequence[Any], out: Pieces, what: str) -> None:
        """``encode`` of each of ``values`` in turn, labelled ``what[i]``, with the same bytes and the
        same errors. Fast path: the items are first encoded unlabelled (no per-item label strings,
        which cost as much as the item itself for a small record); only if that raises is the output
        rolled back and the labelled loop run, which raises the error with its exact label."""
        start = len(out)
        try:
            encode = self._encode_unlabelled
            for value in values:
                encode(value, out, what)
        except Exception:
            del out[start:]
            for i, value in enumerate(values):
                self.encode(value, out, f"{what}[{i}]")
            raise  # not reached unless encoding is not deterministic: the first error then stands

    def _encode_unlabelled(self, value: Any, out: Pieces, what: str) -> None:
        """:meth:`encode` with no label built below ``what`` (:meth:`encode_many`'s fast path; the same
        bytes, and any error is raised again, labelled, by :meth:`encode`)."""
        self.encode(value, out, what)

    def describe(self) -> str:
        return type(self).__name__


class UInt(Codec):
    def __init__(self, fmt: str) -> None:
        self._st = struct.Struct(">" + fmt)
        self._max = 2 ** (8 * self._st.size) - 1

    def encode(self, value: Any, out: Pieces, what: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{what} must be an int, got {type(value).__name__}")
        if not 0 <= int(value) <= self._max:
            raise PayloadError(f"{what}={value} does not fit in {8 * self._st.size} unsigned bits")
        out.append(self._st.pack(int(value)))

    def decode(self, reader: Reader, what: str) -> int:
        return int(reader.unpack(self._st, what)[0])

    def describe(self) -> str:
        return f"u{8 * self._st.size}"


class Bool(Codec):
    def encode(self, value: Any, out: Pieces, what: str) -> None:
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{what} must be a bool")
        out.append(b"\x01" if value else b"\x00")

    def decode(self, reader: Reader, what: str) -> bool:
        flag = reader.take(1, what)[0]
        if flag > 1:
            raise FrameError(f"{what}: boolean byte {flag} is neither 0 nor 1")
        return bool(flag)

    def describe(self) -> str:
        return "u8 bool"


class Float64(Codec):
    _ST = struct.Struct(">d")

    def __init__(self, finite: bool = True) -> None:
        self.finite = finite

    def encode(self, value: Any, out: Pieces, what: str) -> None:
        value = float(value)
        if self.finite and not math.isfinite(value):
            raise PayloadError(f"{what} must be finite, got {value}")
        out.append(self._ST.pack(value))

    def decode(self, reader: Reader, what: str) -> float:
        value = float(reader.unpack(self._ST, what)[0])
        if self.finite and not math.isfinite(value):
            raise PayloadError(f"{what} must be finite, got {value}")
        return value

    def describe(self) -> str:
        return "f64" + ("" if self.finite else " (may be non-finite)")


class FixedBytes(Codec):
    def __init__(self, size: int) -> None:
        self.size = size

    def encode(self, value: Any, out: Pieces, what: str) -> None:
        if not isinstance(value, (bytes, bytearray, memoryview)) or len(value) != self.size:
            raise PayloadError(f"{what} must be exactly {self.size} bytes")
        out.append(bytes(value))

    def decode(self, reader: Reader, what: str) -> bytes:
        return bytes(reader.take(self.size, what))

    def describe(self) -> str:
        return f"{self.size} B"


class Bytes(Codec):
    _LEN = struct.Struct(">I")
    min_len = 0

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len

    def encode(self, value: Any, out: Pieces, what: str) -> None:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"{what} must be bytes")
        value = bytes(value)  # a memoryview's len() counts its items, not its bytes
        if len(value) > self.max_len:
            raise SizeLimitError(f"{what}: {len(value)} bytes exceed the limit {self.max_len}")
        self._append(value, out)

    def _append(self, value: bytes, out: Pieces) -> None:
        out.append(self._LEN.pack(len(value)))
        out.append(value)

    def encode_many(self, values: Sequence[Any], out: Pieces, what: str) -> None:
        # a list of ciphertexts: no label per item; anything out of the ordinary takes the labelled loop
        low, limit, start, append = self.min_len, self.max_len, len(out), self._append
        for value in values:
            if type(value) is not bytes or not low <= len(value) <= limit:
                del out[start:]
                super().encode_many(values, out, what)
                return
            append(value, out)

    def decode(self, reader: Reader, what: str) -> bytes:
        (n,) = reader.unpack(self._LEN, what)
        if n > self.max_len:
            raise SizeLimitError(f"{what}: declared {n} bytes exceed the limit {self.max_len}")
        return bytes(reader.take(n, what))

    def describe(self) -> str:
        return f"bytes <= {_size(self.max_len)}"


class Digested(Bytes):
    """:class:`Bytes` whose last :data:`DIGEST_SIZE` bytes are the SHA-256 of the rest (a ciphertext
    envelope) and at least ``min_len`` bytes. Decoding refuses a value whose digest does not match
    (:class:`SignatureError`: bytes the signature covers through that digest were changed, by the
    network or by the sender -- the two cannot be told apart) and leaves the range it covers out of the
    reader's digest: the frame signs the digest in place of those bytes (module docstring). Encoding
    does not hash: a sender's wrong digest is refused by its receivers."""

    def __init__(self, max_len: int, min_len: int = DIGEST_SIZE) -> None:
        super().__init__(max_len)
        if not DIGEST_SIZE <= min_len <= max_len:
            raise ValueError(f"min_len must be in [{DIGEST_SIZE}, {max_len}]")
        self.min_len = min_len

    def encode(self, value: Any, out: Pieces, what: str) -> None:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"{what} must be bytes")
        value = bytes(value)
        if not self.min_len <= len(value) <= self.max_len:
            raise SizeLimitError(
                f"{what}: {len(value)} bytes, not in [{_size(self.min_len)}, {_size(self.max_len)}]"
            )
        self._append(value, out)

    def _append(self, value: bytes, out: Pieces) -> None:
        out.append(self._LEN.pack(len(value)))
        out.append(memoryview(value)[:-DIGEST_SIZE])
        out.append(value[-DIGEST_SIZE:])

    def decode(self, reader: Reader, what: str) -> bytes:
        (n,) = reader.unpack(self._LEN, what)
        if not self.min_len <= n <= self.max_len:
            raise SizeLimitError(
                f"{what}: declared {n} bytes, not in [{_size(self.min_len)}, {_size(self.max_len)}]"
            )
        start = reader.position
        view = reader.take(n, what)
        if hashlib.sha256(view[:-DIGEST_SIZE]).digest() != view[-DIGEST_SIZE:]:
            raise SignatureError(
                f"{what}: its bytes do not match their SHA-256 digest, which the frame's signature covers "
                "(corrupted or changed)"
            )
        reader.cover(start, start + n - DIGEST_SIZE)
        return bytes(view)

    def describe(self) -> str:
        return f"bytes in [{_size(self.min_len)}, {_size(self.max_len)}], SHA-256 last"


class Text(Codec):
    _LEN = struct.Struct(">H")

    def __init__(self, max_len: int = 1024) -> None:
        self.max_len = max_len

    def encode(self, value: Any, out: Pieces, what: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a str")
        raw = value.encode("utf-8")
        if len(raw) > self.max_len:
            raise SizeLimitError(f"{what}: {len(raw)} UTF-8 bytes exceed the limit {self.max_len}")
        out.append(self._LEN.pack(len(raw)))
        out.append(raw)

    def decode(self, reader: Reader, what: str) -> str:
        (n,) = reader.unpack(self._LEN, what)
        if n > self.max_len:
            raise SizeLimitError(f"{what}: declared {n} bytes exceed the limit {self.max_len}")
        try:
            return bytes(reader.take(n, what)).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PayloadError(f"{what} is not valid UTF-8") from exc

    def describe(self) -> str:
        return f"utf-8 <= {self.max_len} B"


_DTYPES: dict[int, np.dtype] = {1: np.dtype("<f4"), 2: np.dtype("<f8"), 3: np.dtype("<i8")}
_CODES: dict[np.dtype, int] = {v: k for k, v in _DTYPES.items()}
_ARRAY_HEAD = struct.Struct(">BB")
_DIM = struct.Struct(">I")


class Array(Codec):
    """A numpy array of one dtype, ``ndim`` dimensions (None: 1 to 4), at most ``max_elems`` elements."""

    def __init__(self, dtype: str, max_elems: int, ndim: int | None = None, finite: bool = True) -> None:
        self.dtype = np.dtype(dtype).newbyteorder("<")
        if self.dtype not in _CODES:
            raise ValueError(f"unsupported array dtype {dtype}")
        self.max_elems = max_elems
        self.ndim = ndim
        self.finite = finite and self.dtype.kind == "f"

    def encode(self, value: Any, out: Pieces, what: str) -> None:
        arr = np.asarray(value)
        if arr.dtype != self.dtype:
            if not np.can_cast(arr.dtype, self.dtype, "safe"):
                raise TypeError(f"{what}: dtype {arr.dtype} cannot be sent as {self.dtype}")
            arr = arr.astype(self.dtype)
        self._check_shape(arr.shape, what)
        if self.finite and not np.all(np.isfinite(arr)):
            raise PayloadError(f"{what} holds NaN or infinite values")
        out.append(_ARRAY_HEAD.pack(_CODES[self.dtype], arr.ndim))
        out.extend(_DIM.pack(int(d)) for d in arr.shape)
        out.append(np.ascontiguousarray(arr, dtype=self.dtype).tobytes())

    def decode(self, reader: Reader, what: str) -> np.ndarray:
        code, ndim = reader.unpack(_ARRAY_HEAD, what)
        dtype = _DTYPES.get(code)
        if dtype is None:
            raise FrameError(f"{what}: unknown array dtype code {code}")
        if dtype != self.dtype:
            raise PayloadError(f"{what} must be {self.dtype}, got {dtype}")
        if ndim > 8:
            raise SizeLimitError(f"{what}: {ndim} dimensions")
        shape = tuple(reader.unpack(_DIM, what)[0] for _ in range(ndim))
        self._check_shape(shape, what)
        count = math.prod(shape)
        raw = reader.take(count * dtype.itemsize, what)
        arr = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        if self.finite and not np.all(np.isfinite(arr)):
            raise PayloadError(f"{what} holds NaN or infinite values")
        return arr

    def _check_shape(self, shape: tuple[int, ...], what: str) -> None:
        if self.ndim is not None and len(shape) != self.ndim:
            raise PayloadError(f"{what} must have {self.ndim} dimensions, got shape {shape}")
        if self.ndim is None and not 1 <= len(shape) <= 4:
            raise PayloadError(f"{what} must have 1 to 4 dimensions, got shape {shape}")
        if math.prod(shape) > self.max_elems:
            raise SizeLimitError(f"{what}: shape {shape} exceeds {self.max_elems} elements")

    def describe(self) -> str:
        dims = f"{self.ndim}-D" if self.ndim is not None else "1..4-D"
        return f"{dims} {self.dtype.name} <= {self.max_elems:.3g} elems"


class NamedArrays(Codec):
    """``dict[str, ndarray]`` (float32), names unique, insertion order kept."""

    _COUNT = struct.Struct(">H")

    def __init__(self, max_count: int, max_elems: int) -> None:
        self.max_count = max_count
        self._name = Text(256)
        self._array = Array("<f4", max_elems)

    def encode(self, value: Any, out: Pieces, what: str) -> None:
        if not isinstance(value, Mapping):
            raise TypeError(f"{what} must be a mapping of names to arrays")
        if len(value) > self.max_count:
            raise SizeLimitError(f"{what}: {len(value)} arrays exceed the limit {self.max_count}")
        out.append(self._COUNT.pack(len(value)))
        for name, arr in value.items():
            self._name.encode(name, out, f"{what} name")
            self._array.encode(arr, out, f"{what}[{name!r}]")

    def decode(self, reader: Reader, what: str) -> dict[str, np.ndarray]:
        (count,) = reader.unpack(self._COUNT, what)
        if count > self.max_count:
            raise SizeLimitError(f"{what}: declared {count} arrays exceed the limit {self.max_count}")
        out: dict[str, np.ndarray] = {}
        for _ in range(count):
            name = self._name.decode(reader, f"{what} name")
            if name in out:
                raise PayloadError(f"{what}: duplicate array name {name!r}")
            out[name] = self._array.decode(reader, f"{what}[{name!r}]")
        return out

    def describe(self) -> str:
        return f"<= {self.max_count} named float32 arrays"


class ListOf(Codec):
    _COUNT = struct.Struct(">I")

    def __init__(self, item: Codec, max_count: int) -> None:
        self.item = item
        self.max_count = max_count

    def encode(self, value: Any, out: Pieces, what: str) -> None:
        if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
            raise TypeError(f"{what} must be a sequence")
        if len(value) > self.max_count:
            raise SizeLimitError(f"{what}: {len(value)} items exceed the limit {self.max_count}")
        out.append(self._COUNT.pack(len(value)))
        self.item.encode_many(value, out, what)

    def decode(self, reader: Reader, what: str) -> tuple:
        (count,) = reader.unpack(self._COUNT, what)
        if count > self.max_count:
            raise SizeLimitError(f"{what}: declared {count} items exceed the limit {self.max_count}")
        return tuple(self.item.decode(reader, f"{what}[{i}]") for i in range(count))

    def describe(self) -> str:
        return f"list <= {self.max_count} of ({self.item.describe()})"


class Optional(Codec):
    def __init__(self, item: Codec) -> None:
        self.item = item

    def encode(self, value: Any, out: Pieces, what: str) -> None:
        if value is None:
            out.append(b"\x00")
        else:
            out.append(b"\x01")
            self.item.encode(value, out, what)

    def decode(self, reader: Reader, what: str) -> Any:
        flag = reader.take(1, what)[0]
        if flag == 0:
            return None
        if flag != 1:
            raise FrameError(f"{what}: optional flag {flag} is neither 0 nor 1")
        return self.item.decode(reader, what)

    def describe(self) -> str:
        return f"optional {self.item.describe()}"


class Record(Codec):
    """A fixed sequence of named fields mapped to a (frozen dataclass) type ``cls``."""

    def __init__(self, cls: type, fields: Sequence[tuple[str, Codec]]) -> None:
        self.cls = cls
        self.fields = tuple(fields)

    def encode(self, value: Any, out: Pieces, what: str) -> None:
        for name, codec in self.fields:
            codec.encode(getattr(value, name), out, f"{what}.{name}")

    def _encode_unlabelled(self, value: Any, out: Pieces, what: str) -> None:
        for name, codec in self.fields:  # no f"{what}.{name}" per field (see Codec.encode_many)
            codec.encode(getattr(value, name), out, what)

    def decode(self, reader: Reader, what: str) -> Any:
        return self.cls(**{name: codec.decode(reader, f"{what}.{name}") for name, codec in self.fields})

    def describe(self) -> str:
        return ", ".join(f"{name}: {codec.describe()}" for name, codec in self.fields)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"
