"""Minimal, bounds-checked protobuf wire-format reader/writer (top-level fields only).

TenSEAL serialises contexts and vectors as protobuf messages. We look at a few top-level fields
*before* handing bytes to TenSEAL, because TenSEAL/SEAL accept some corrupted inputs silently
(see ``packing.load_tenseal_vector``) and because the server must refuse a context holding a
secret key without ever parsing that key. Only the wire format is handled here; the callers know
the field numbers (from ``tenseal/proto/*.proto``).

Every malformation raises ``ValueError``; callers translate it into their typed error.
"""

from __future__ import annotations

import struct

WIRE_VARINT = 0
WIRE_I64 = 1
WIRE_LEN = 2
WIRE_I32 = 5

Field = tuple[int, int, "int | bytes"]


def read_varint(buf: memoryview | bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    for _ in range(10):
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise ValueError("varint longer than 10 bytes")


def parse_fields(data: bytes | memoryview) -> list[Field]:
    """Split a serialised protobuf message into ``(field_number, wire_type, value)`` triples.

    ``value`` is an ``int`` for varints, the raw 8/4 little-endian bytes for fixed-width fields and
    the raw payload bytes for length-delimited fields. Groups (wire types 3/4) are refused.
    """
    buf = memoryview(data)
    pos = 0
    out: list[Field] = []
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire == WIRE_VARINT:
            value, pos = read_varint(buf, pos)
            out.append((number, wire, value))
        elif wire in (WIRE_I64, WIRE_I32):
            width = 8 if wire == WIRE_I64 else 4
            if pos + width > len(buf):
                raise ValueError("truncated fixed-width field")
            out.append((number, wire, bytes(buf[pos : pos + width])))
            pos += width
        elif wire == WIRE_LEN:
            length, pos = read_varint(buf, pos)
            if pos + length > len(buf):
                raise ValueError("length-delimited field exceeds input")
            out.append((number, wire, bytes(buf[pos : pos + length])))
            pos += length
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return out


def parse_packed_varints(data: bytes) -> list[int]:
    values = []
    pos = 0
    while pos < len(data):
        value, pos = read_varint(data, pos)
        values.append(value)
    return values


def encode_varint(value: int) -> bytes:
    if value < 0:
        raise ValueError("negative varint")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_varint_field(number: int, value: int) -> bytes:
    return encode_varint((number << 3) | WIRE_VARINT) + encode_varint(value)


def decode_double(raw: bytes) -> float:
    return struct.unpack("<d", raw)[0]
