r"""Compact ciphertext encoding: every RNS coefficient at its prime's bit width (the byte floor).

Why
---
TenSEAL serialises a CKKS vector as a protobuf around SEAL's ciphertext stream, which SEAL
compresses with zstd. The coefficients are uniform modulo their primes, so zstd only removes the
always-zero top bytes of each 64-bit word: at ``n4096`` a fresh ciphertext (limbs of 46 and 37
bits) is ~103.5 KB against an information floor of ``2 x 4096 x (46 + 37) / 8`` = 85.0 KB, a result
(one 46-bit limb) ~55.6 KB against 47.1 KB (1.18x). This module keeps exactly the floor: the
coefficients of limb ``l`` packed at ``bits(q_l)`` bits each, nothing else.

It is the session's ciphertext wire by default (``"compact"``, envelope version 2). Because TenSEAL
gives no raw coefficient access, it costs CPU on both sides (decompressing SEAL's stream to pack
it, rebuilding a stream to load it); a session may instead agree on ``"tenseal"`` (envelope
version 1, TenSEAL's own bytes, 16-22 % larger): :data:`fedgat.crypto.params.WIRES`.

What is on the wire (the envelope's payload, :func:`fedgat.crypto.packing.serialize`)
-------------------------------------------------------------------------------------
For each RNS limb ``l`` of the ciphertext's level (``q0`` for a result, ``q0, q1`` for a fresh
ciphertext): the ``2 N`` coefficients of that limb (polynomial 0 then polynomial 1, NTT form, each
in ``[0, q_l)``), ``b_l = bits(q_l)`` bits each, bit ``i`` of the stream is bit ``i % 8`` of byte
``i // 8`` (little-endian bit order). ``2 N b_l`` is a multiple of 8, so every limb starts on a
byte. Size: exactly :meth:`CompactCodec.body_size` ``= 2 N sum_l b_l / 8`` bytes.

Everything else in TenSEAL's bytes is a function of the context and the level, so it is not sent:
the protobuf's ``sizes`` (``[slots]``) and ``scale`` (the context's exact scale) fields, SEAL's
stream header (magic, version, compression mode, size) and the ciphertext's metadata
(``parms_id`` of the level, NTT form, 2 polynomials, ``N``, the limb count, the scale, SEAL 4's
``correction_factor`` = 1) and the coefficient array's own header and count. The sender checks
that the ciphertext it sends has exactly that metadata (byte for byte against a template made by
the local library for the same context and level, whose every field was parsed and checked once);
the receiver rebuilds it and hands TenSEAL an uncompressed SEAL stream (SEAL loads any
compression mode).

SEAL's ``Ciphertext`` save layout (SEAL 4.x, ``Ciphertext::save_members``), after the 16-byte
``SEALHeader`` (u16 magic 0xA15E, u8 header size 16, u8 version major, u8 minor, u8 compression
mode 0 none / 1 zlib / 2 zstd, u16 reserved 0, u64 stream size) and, for zlib/zstd, inside the
compressed frame::

    parms_id  4 x u64 | is_ntt_form u8 | size u64 | poly_modulus_degree u64 |
    coeff_modulus_size u64 | scale f64 | correction_factor u64 |
    DynArray: SEALHeader (compression none) | u64 count | count x u64, index (poly, limb, coeff)

Levels: a result has been rescaled once and holds only ``q0``, the lowest level; a fresh upload
must keep ``q0 q1`` because the server's multiply is followed by the rescale that divides out
``q1``. So no ciphertext can be modulus-switched lower before it is sent.

Errors: every malformed input raises :class:`~fedgat.crypto.errors.CiphertextFormatError`
(a body of the wrong size, a coefficient not below its prime, TenSEAL bytes that are not a single
canonical ciphertext of this context and level).
"""

from __future__ import annotations

import struct
import threading
import zlib
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import zstandard  # SEAL compresses its streams with zstd; the sender reads them back

from . import wire
from .errors import CiphertextFormatError

__all__ = ["CompactCodec", "floor_bytes", "pack_limb", "unpack_limb"]

SEAL_MAGIC = 0xA15E
_SEAL_HEADER = struct.Struct("<HBBBBHQ")  # magic, header size, major, minor, compr_mode, reserved, size
_CT_META = struct.Struct("<32sBQQQdQ")  # parms_id, is_ntt_form, size, N, coeff_modulus_size, scale, corr.
_COUNT = struct.Struct("<Q")
_COMPR_NONE, _COMPR_ZLIB, _COMPR_ZSTD = 0, 1, 2
_POLYS = 2

# CKKSVectorProto field numbers (tenseal/proto/tensors.proto)
_VEC_SIZES, _VEC_CIPHERTEXTS, _VEC_SCALE = 1, 2, 3


def floor_bytes(poly_modulus_degree: int, prime_bits: tuple[int, ...] | list[int]) -> int:
    """Information floor of a 2-polynomial ciphertext whose level holds primes of ``prime_bits``
    bits: ``2 N sum(bits) / 8`` bytes (every coefficient is uniform below its prime)."""
    return _POLYS * poly_modulus_degree * sum(int(b) for b in prime_bits) // 8


# ------------------------------------------------------------------------------------ bit packing
@dataclass(frozen=True)
class _BitPlan:
    """Where each of 64 consecutive ``b``-bit values lands in ``b`` 64-bit words (the pattern
    repeats every 64 values): value ``j`` starts at bit ``j b``, i.e. word ``w_j`` bit ``o_j``,
    and spills its top bits into word ``w_j + 1`` when ``o_j + b > 64``."""

    bits: int
    offset: np.ndarray  # o_j (uint64)
    word: np.ndarray  # w_j
    next_word: np.ndarray  # w_j + 1 where value j spills, else b (a zero column appended on unpacking)
    spill_shift: np.ndarray  # 64 - o_j where value j spills, else 0 (uint64)
    spilling: np.ndarray  # indices j of the values that spill
    gather: np.ndarray  # (k, b): indices into [low parts (64) | high parts | 0]; OR over k = the words
    mask: np.uint64

    @classmethod
    def make(cls, bits: int) -> _BitPlan:
        if not 1 <= bits <= 63:
            raise ValueError("bit width must be in [1, 63]")
        j = np.arange(64, dtype=np.uint64)
        pos = j * np.uint64(bits)
        word = (pos >> np.uint64(6)).astype(np.intp)
        offset = pos & np.uint64(63)
        spills = offset + np.uint64(bits) > np.uint64(64)
        spilling = np.flatnonzero(spills)
        zero = 64 + len(spilling)
        parts: list[list[int]] = [[] for _ in range(bits)]
        for k in range(64):
            parts[int(word[k])].append(k)  # the low part of value k
        for h, s in enumerate(spilling.tolist()):
            parts[int(word[s]) + 1].append(64 + h)  # the high part of value s
        gather = np.full((max(map(len, parts)), bits), zero, dtype=np.intp)
        for w, cols in enumerate(parts):
            gather[: len(cols), w] = cols
        return cls(
            bits=bits,
            offset=offset,
            word=word,
            next_word=np.where(spills, word + 1, bits),
            spill_shift=np.where(spills, np.uint64(64) - offset, np.uint64(0)),
            spilling=spilling,
            gather=gather,
            mask=np.uint64((1 << bits) - 1),
        )


_PLANS: dict[int, _BitPlan] = {}


def _plan(bits: int) -> _BitPlan:
    plan = _PLANS.get(bits)
    if plan is None:
        plan = _PLANS[bits] = _BitPlan.make(bits)
    return plan


def pack_limb(values: np.ndarray, bits: int) -> bytes:
    """``values`` (uint64, a multiple of 64 of them, each ``< 2**bits``) at ``bits`` bits each,
    little-endian bit order: ``len(values) * bits / 8`` bytes."""
    plan = _plan(bits)
    v = np.asarray(values, dtype=np.uint64)
    if v.ndim != 1 or v.size % 64:
        raise ValueError("pack_limb needs a 1-D array of a multiple of 64 values")
    groups = v.reshape(-1, 64)
    spilling = plan.spilling
    parts = np.empty((groups.shape[0], 64 + len(spilling) + 1), dtype=np.uint64)
    np.left_shift(groups, plan.offset, out=parts[:, :64])  # bits above 64 fall off
    np.right_shift(groups[:, spilling], plan.spill_shift[spilling], out=parts[:, 64:-1])
    parts[:, -1] = 0
    return np.bitwise_or.reduce(parts[:, plan.gather], axis=1).astype("<u8", copy=False).tobytes()


def unpack_limb(data: bytes | memoryview, bits: int, out: np.ndarray | None = None) -> np.ndarray:
    """Inverse of :func:`pack_limb` (``len(data)`` a multiple of ``8 * bits``), written into ``out``
    (uint64, ``len(data) * 8 / bits`` values) when given."""
    plan = _plan(bits)
    if len(data) % (8 * bits):
        raise ValueError("packed limb length is not a multiple of 8 * bits")
    groups = len(data) // (8 * bits)
    words = np.zeros((groups, bits + 1), dtype=np.uint64)  # + a zero column
    words[:, :bits] = np.frombuffer(data, dtype="<u8").reshape(groups, bits)
    values = words.take(plan.word, axis=1)  # take: the same gather as words[:, plan.word], faster
    values >>= plan.offset
    high = words.take(plan.next_word, axis=1)
    high <<= plan.spill_shift  # 0 << 0 where the value does not spill
    values |= high
    values &= plan.mask
    if out is None:
        return values.ravel()
    out.reshape(groups, 64)[...] = values
    return out


# ------------------------------------------------------------------------------ the SEAL stream
_LOCAL = threading.local()


def _zstd() -> zstandard.ZstdDecompressor:
    """This thread's zstd decompression context (making one per ciphertext cost ~0.03 ms of the
    server's ~2 ms per result; a context must not be shared between threads)."""
    dctx = getattr(_LOCAL, "zstd", None)
    if dctx is None:
        dctx = _LOCAL.zstd = zstandard.ZstdDecompressor()
    return dctx


def _decompress(mode: int, frame: bytes | memoryview, size: int) -> bytes:
    if mode == _COMPR_NONE:
        return bytes(frame)
    if mode == _COMPR_ZLIB:
        d = zlib.decompressobj()
        out = d.decompress(frame, size + 1)
        if not d.eof or d.unconsumed_tail or d.unused_data:
            raise ValueError("zlib frame is truncated or has trailing bytes")
        return out
    if mode == _COMPR_ZSTD:
        try:
            obj = _zstd().decompressobj()
            out = obj.decompress(frame)
        except zstandard.ZstdError as exc:
            raise ValueError(f"zstd: {exc}") from exc
        if not obj.eof or obj.unused_data:
            raise ValueError("zstd frame is truncated or has trailing bytes")
        return out
    raise ValueError(f"unknown SEAL compression mode {mode}")


def _vector_fields(payload: bytes) -> tuple[bytes, bytes, bytes]:
    """TenSEAL CKKS-vector protobuf -> (sizes field value, SEAL stream, scale bytes): exactly one
    of each, in that order (TenSEAL's canonical output)."""
    fields = wire.parse_fields(payload)
    kinds = [(number, kind) for number, kind, _ in fields]
    if kinds != [(_VEC_SIZES, wire.WIRE_LEN), (_VEC_CIPHERTEXTS, wire.WIRE_LEN), (_VEC_SCALE, wire.WIRE_I64)]:
        raise ValueError(f"expected fields (sizes, ciphertext, scale), got {kinds[:6]}")
    return fields[0][2], fields[1][2], fields[2][2]  # type: ignore[return-value]


def _read_seal_stream(stream: bytes) -> tuple[tuple[int, int], bytes]:
    """SEAL stream -> ((version major, minor), the uncompressed members)."""
    if len(stream) < _SEAL_HEADER.size:
        raise ValueError("SEAL stream shorter than its header")
    magic, header_size, major, minor, mode, reserved, size = _SEAL_HEADER.unpack_from(stream, 0)
    if magic != SEAL_MAGIC or header_size != _SEAL_HEADER.size or reserved != 0:
        raise ValueError("not a SEAL stream header")
    if size != len(stream):
        raise ValueError(f"SEAL header says {size} bytes, the stream has {len(stream)}")
    return (major, minor), _decompress(mode, memoryview(stream)[_SEAL_HEADER.size :], size)


@dataclass(frozen=True)
class CompactCodec:
    """The compact form of one context's ciphertexts at one level.

    Build it with :meth:`from_template` from TenSEAL bytes that the local library made for this
    context and level (any values): every metadata field is parsed and checked against the
    context, and kept to check senders' ciphertexts and to rebuild receivers' ones.
    """

    poly_modulus_degree: int
    primes: tuple[int, ...]  # this level's RNS primes, q0 first
    head: bytes  # TenSEAL payload up to the first coefficient (uncompressed SEAL stream)
    tail: bytes  # TenSEAL payload after the last coefficient (the scale field)
    members_prefix: bytes  # SEAL ciphertext members before the coefficients (metadata, array header)
    sizes_field: bytes
    scale_field: bytes
    version: tuple[int, int]

    @property
    def limbs(self) -> int:
        return len(self.primes)

    @cached_property
    def bits(self) -> tuple[int, ...]:
        return tuple(q.bit_length() for q in self.primes)

    @property
    def coefficients(self) -> int:
        """Coefficients per ciphertext: 2 polynomials x limbs x N."""
        return _POLYS * self.limbs * self.poly_modulus_degree

    def body_size(self) -> int:
        """Bytes of the compact form (the floor, :func:`floor_bytes`)."""
        return floor_bytes(self.poly_modulus_degree, self.bits)

    def _limb_sizes(self) -> tuple[int, ...]:
        return self._sizes

    @cached_property
    def _sizes(self) -> tuple[int, ...]:
        return tuple(_POLYS * self.poly_modulus_degree * b // 8 for b in self.bits)

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def from_template(
        cls,
        payload: bytes,
        *,
        poly_modulus_degree: int,
        primes: tuple[int, ...],
        parms_id: tuple[int, ...] | list[int],
        scale: float,
        slots: int,
    ) -> CompactCodec:
        """Parse TenSEAL bytes of one ciphertext and check every field against the context:
        ``parms_id`` of the level, NTT form, 2 polynomials, ``N``, one limb per prime of the level,
        the exact scale, correction factor 1, an uncompressed coefficient array of ``2 x limbs x N``
        words, the protobuf's ``sizes == [slots]`` and ``scale``. Raises
        :class:`CiphertextFormatError` if this library writes anything else (another SEAL layout)."""
        n, limbs = int(poly_modulus_degree), len(primes)
        try:
            sizes, stream, scale_raw = _vector_fields(payload)
            version, members = _read_seal_stream(stream)
            meta = _CT_META.unpack_from(members, 0)
            dyn = _SEAL_HEADER.unpack_from(members, _CT_META.size)
            (count,) = _COUNT.unpack_from(members, _CT_META.size + _SEAL_HEADER.size)
        except (ValueError, struct.error) as exc:
            raise CiphertextFormatError(f"unexpected TenSEAL ciphertext layout: {exc}") from exc
        pid, ntt, size, degree, modulus_size, ct_scale, correction = meta
        prefix_len = _CT_META.size + _SEAL_HEADER.size + _COUNT.size
        expected = {
            "parms_id": (pid, struct.pack("<4Q", *parms_id)),
            "is_ntt_form": (ntt, 1),
            "size": (size, _POLYS),
            "poly_modulus_degree": (degree, n),
            "coeff_modulus_size": (modulus_size, limbs),
            "scale": (ct_scale, float(scale)),
            "correction_factor": (correction, 1),
            "array header": (dyn[:2] + dyn[4:6], (SEAL_MAGIC, _SEAL_HEADER.size, _COMPR_NONE, 0)),
            "array version": (dyn[2:4], version),
            "array stream size": (dyn[6], _SEAL_HEADER.size + _COUNT.size + 8 * count),
            "array count": (count, _POLYS * limbs * n),
            "members size": (len(members), prefix_len + 8 * _POLYS * limbs * n),
            "sizes": (list(wire.parse_packed_varints(sizes)), [slots]),
            "vector scale": (wire.decode_double(scale_raw), float(scale)),
        }
        for name, (got, want) in expected.items():
            if got != want:
                raise CiphertextFormatError(
                    f"unexpected SEAL ciphertext field {name}: {got!r}, expected {want!r}"
                )
        codec = cls.build(
            poly_modulus_degree=n,
            primes=tuple(int(q) for q in primes),
            members_prefix=bytes(members[:prefix_len]),
            sizes_field=bytes(sizes),
            scale_field=bytes(scale_raw),
            version=version,
        )
        coeffs = np.frombuffer(members, dtype="<u8", offset=prefix_len)
        if codec.expand(codec.pack(coeffs)) != codec.head + coeffs.tobytes() + codec.tail:
            raise CiphertextFormatError("compact round trip of the template failed")  # pragma: no cover
        return codec

    @classmethod
    def build(
        cls,
        *,
        poly_modulus_degree: int,
        primes: tuple[int, ...],
        members_prefix: bytes,
        sizes_field: bytes,
        scale_field: bytes,
        version: tuple[int, int],
    ) -> CompactCodec:
        words = _POLYS * len(primes) * poly_modulus_degree
        members = len(members_prefix) + 8 * words
        seal_header = _SEAL_HEADER.pack(
            SEAL_MAGIC, _SEAL_HEADER.size, version[0], version[1], _COMPR_NONE, 0, _SEAL_HEADER.size + members
        )
        key = lambda number, kind: wire.encode_varint((number << 3) | kind)
        head = (
            key(_VEC_SIZES, wire.WIRE_LEN)
            + wire.encode_varint(len(sizes_field))
            + sizes_field
            + key(_VEC_CIPHERTEXTS, wire.WIRE_LEN)
            + wire.encode_varint(_SEAL_HEADER.size + members)
            + seal_header
            + members_prefix
        )
        tail = key(_VEC_SCALE, wire.WIRE_I64) + scale_field
        return cls(
            poly_modulus_degree=poly_modulus_degree,
            primes=primes,
            head=head,
            tail=tail,
            members_prefix=members_prefix,
            sizes_field=sizes_field,
            scale_field=scale_field,
            version=version,
        )

    # --- sender -----------------------------------------------------------------------------------
    def compact(self, payload: bytes) -> bytes:
        """TenSEAL CKKS-vector bytes -> the compact form. Refuses (:class:`CiphertextFormatError`)
        anything but one ciphertext of this context and level with the template's metadata."""
        try:
            sizes, stream, scale_raw = _vector_fields(payload)
        except ValueError as exc:
            raise CiphertextFormatError(f"cannot read the TenSEAL ciphertext: {exc}") from exc
        if sizes != self.sizes_field or scale_raw != self.scale_field:
            raise CiphertextFormatError("ciphertext metadata differs from this context and level")
        return self.compact_stream(stream)

    def compact_stream(self, stream: bytes) -> bytes:
        """A SEAL ciphertext stream (what ``Ciphertext.save`` writes; the vector's protobuf around it
        is this context's by construction) -> the compact form, with :meth:`compact`'s checks of
        the ciphertext's metadata. The server's evaluator saves its results this way."""
        try:
            version, members = _read_seal_stream(stream)
        except ValueError as exc:
            raise CiphertextFormatError(f"cannot read the SEAL ciphertext: {exc}") from exc
        prefix = self.members_prefix
        if (
            version != self.version
            or len(members) != len(prefix) + 8 * self.coefficients
            or members[: len(prefix)] != prefix
        ):
            raise CiphertextFormatError("ciphertext metadata differs from this context and level")
        # SEAL's members put the coefficients at an odd offset: an aligned copy (~5 us) makes the
        # packing's shifts and gathers run at full speed (~0.03 ms less per result)
        return self.pack(np.frombuffer(members, dtype="<u8", offset=len(prefix)).copy())

    def pack(self, coeffs: np.ndarray) -> bytes:
        """Coefficients in SEAL's order ``(poly, limb, coeff)`` -> the compact body."""
        grid = coeffs.reshape(_POLYS, self.limbs, self.poly_modulus_degree)
        out = []
        for limb, (q, b) in enumerate(zip(self.primes, self.bits)):
            values = grid[:, limb, :].ravel()
            if values.max() >= q:
                raise CiphertextFormatError(f"coefficient not below its prime (limb {limb})")
            out.append(pack_limb(values, b))
        return b"".join(out)

    # --- receiver ---------------------------------------------------------------------------------
    def unpack(self, body: bytes | memoryview, out: np.ndarray | None = None) -> np.ndarray:
        """The compact body -> coefficients ``(2, limbs, N)`` (into ``out`` when given); refuses a
        body of the wrong size and any coefficient not below its prime (:class:`CiphertextFormatError`)."""
        if len(body) != self.body_size():
            raise CiphertextFormatError(
                f"compact ciphertext of {len(body)} bytes; {self.limbs} limb(s) of N = "
                f"{self.poly_modulus_degree} need {self.body_size()}"
            )
        n = self.poly_modulus_degree
        grid = np.empty((_POLYS, self.limbs, n), dtype="<u8") if out is None else out
        view = memoryview(body)
        start = 0
        for limb, (q, b, size) in enumerate(zip(self.primes, self.bits, self._limb_sizes())):
            values = unpack_limb(view[start : start + size], b)
            if values.max() >= q:
                raise CiphertextFormatError(f"coefficient not below its prime (limb {limb})")
            grid[:, limb, :] = values.reshape(_POLYS, n)
            start += size
        return grid

    def expand(self, body: bytes | memoryview) -> bytes:
        """The compact body -> TenSEAL CKKS-vector bytes (uncompressed SEAL stream)."""
        buf = bytearray(len(self.head) + 8 * self.coefficients + len(self.tail))
        buf[: len(self.head)] = self.head
        buf[len(buf) - len(self.tail) :] = self.tail
        grid = np.frombuffer(buf, dtype="<u8", count=self.coefficients, offset=len(self.head))
        self.unpack(body, grid.reshape(_POLYS, self.limbs, self.poly_modulus_degree))
        return bytes(buf)
