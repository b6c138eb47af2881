r"""Rotation-free slot layout for plaintext-coefficient multiply-adds, and the ciphertext I/O.

What the server computes
------------------------
For output rows ``r`` (e.g. ``(i, a)`` = target node ``i``, basis vector ``a``) and source nodes
``j``: ``out_r = sum_j Q[r, j] * h_j`` with plaintext real ``Q`` chosen by the server and
encrypted feature rows ``h_j`` (dimension ``d``). The server holds no Galois keys, so it can only
multiply slot-wise by plaintext vectors and add: **slot s of a result depends on slot s of the
inputs only**.

Layout ("replicated chunks in, blocked rows out")
-------------------------------------------------
Split the ``d`` features into ``c`` chunks of width ``w = ceil(d / c)`` (the last one
zero-padded) and cut the ``S = N/2`` slots into ``k = floor(S / w)`` blocks of width ``w``::

    upload: one ciphertext X[j, ch] per (source node j, chunk ch); the chunk is REPLICATED in
    every block
               block 0        block 1        ...  block k-1         tail (S - k*w)
    X[j, ch] = [ h_j[ch]     | h_j[ch]      | ... | h_j[ch]         | 0 ... 0 ]

    result: one ciphertext Y[g, ch] per (group g of k output rows, chunk ch); block b holds
    row r = g*k + b
    Y[g, ch] = [ out_{gk}[ch] | out_{gk+1}[ch] | ... | out_{gk+k-1}[ch] | ~0 ]

    Y[g, ch] = sum_j  X[j, ch] (.) C[g, j]          (.) slot-wise ciphertext x plaintext
    C[g, j]  = [ Q[gk, j] x w | Q[gk+1, j] x w | ... | Q[gk+k-1, j] x w | 0 ]   (layout.broadcast)

Every upload carries its node's chunk in every block, so block ``b`` of a result can gather
*any* sources with one ``ct x pt`` multiply per source -- no rotation, and ``k`` output rows
(from the same or different targets) per result ciphertext. Rows of one target share their
sources, so packing a target's ``m_i`` rows together costs ``ceil(m_i / k) * c * deg_i``
multiplies (:func:`linear_map_rows` does exactly this for a plaintext ``Q``).

Utilisation (fraction of result slots that hold real features when a group is full):
``k * d / (c * S)``. For Cora, d = 1433:

=======  =====  ===========================================================================
N        S      chunks c -> blocks k, utilisation
=======  =====  ===========================================================================
4096     2048   c=1: k=1 70.0 %   c=2: k=2 70.0 %   c=3: k=4 93.3 %   c=5: k=7 98.0 %
8192     4096   c=1: k=2 70.0 %   c=2: k=5 87.5 %   c=3: k=8 93.3 %   c=4: k=11 96.2 %
16384    8192   c=1: k=5 87.5 %   c=2: k=11 96.2 %  c=3: k=17 99.1 %
=======  =====  ===========================================================================

:meth:`SlotLayout.for_dimension` picks the fewest chunks reaching 90 %: c = 3 at N = 4096 and
8192 (93.3 %), c = 2 at N = 16384 (96.2 %).

Why more utilisation costs upload (a limit of any rotation-free layout): if every node uploads
``u`` ciphertexts, the slot -> feature map of each is fixed, and a result ciphertext can hold
feature ``f`` only in slots where the sources hold ``f``. With ``u = 1`` (one slot -> feature
map shared by all nodes) some feature occupies at most ``floor(S / d)`` slots (pigeonhole), so M
result ciphertexts hold at most ``M * floor(S / d)`` complete rows: utilisation <=
``floor(S/d) * d / S`` = 70.0 % for d = 1433 at S = 2048 or 4096, whatever the arrangement. Reaching >= 90 % therefore *requires* uploading >= 2-3 ciphertexts per node;
the chunked layout above reaches ``floor(S / ceil(d/c)) * d / (c S)`` with ``u = c``. Whether
that pays depends on the ratio of output rows to nodes (:meth:`SlotLayout.traffic`): uploads are
fresh ciphertexts (85.1 KB at n4096), downloads are rescaled ones (47.2 KB). E.g. for Cora's
vector encodings (~26.5k rows for 2708 nodes) c = 1 moves 1.48 GB and c = 3 1.63 GB at n4096
(:meth:`SlotLayout.for_traffic` picks c = 1); for the matrix encodings (~5.6e5 rows) c = 3 wins.

Packing several items' rows (:meth:`SlotLayout.packed_order`): an item of ``R`` rows fills
``floor(R / k)`` groups and leaves a tail of ``t = R mod k`` rows in a last group whose other blocks
are empty. Items with the same ``R`` (a recipient's partials of one owner in one bucket,
:class:`fedgat.crypto.encodings.PackedShares`) keep their whole groups apart and put up to
``floor(k / t)`` tails side by side in one group: no group but that one mixes items, so no
multiply-add is added (the tail group reads the union of the tails' sources). On Cora (10 clients,
vector, ``k = 4``) results fill 96.9 % of their blocks instead of 87.3 %, 212,418 result ciphertexts
instead of 235,788, and 705,819 multiply-adds instead of 707,298; the ``t = 3`` tails (a quarter of
the partials) have no partner in their bucket.

The alternative -- upload each node once and let the server rotate chunks into place -- needs
Galois keys (6-18 MB), ``k - 1`` rotations per source and key switching with a large special
prime; rejected.

Ciphertext wire format (:func:`serialize`)
------------------------------------------
``"FGCT" | u8 version | u8 level | 32 B context fingerprint | u32 len | body |
SHA-256(everything before)``: 74 bytes around the body, which depends on the session's wire
(:attr:`fedgat.crypto.context.CkksContext.wire`, :data:`fedgat.crypto.params.WIRES`):

* ``"compact"``, version 2 (the default): the compact form of :mod:`fedgat.crypto.compact`, the
  ciphertext's information floor (every RNS coefficient at its prime's bit width; at ``n4096``
  85.0 KB fresh and 47.1 KB result instead of TenSEAL's zstd-compressed 103.5 / 55.6 KB), at the
  cost of packing CPU on both sides. Everything TenSEAL puts around the coefficients (protobuf
  fields, SEAL's headers and metadata) is a function of the context and the level, so the
  receiver rebuilds it.
* ``"tenseal"``, version 1: TenSEAL's own bytes (``CKKSVector.serialize``, a protobuf around SEAL's
  zstd stream), 16-22 % larger, no packing CPU; the receiver checks the protobuf's fields and
  hands the bytes to SEAL's loader.

A party accepts the envelope version of its session's wire only: the other one is refused
(:class:`CiphertextFormatError`) before anything else is read, so no sender can switch a receiver
to the other parser. The digest covers the bytes actually sent. :func:`deserialize` checks, in
this order, the sizes, magic, version, length, digest, fingerprint, level, then (compact) the body's
exact size for that level and every coefficient against its prime, before TenSEAL sees anything,
or (tenseal) the protobuf of the TenSEAL bytes.

The digest is needed: measured on TenSEAL 0.3.18, ~70 % of single-bit flips in a serialised CKKS
vector still LOAD and decrypt to garbage (1e15..1e306), and so does any coefficient changed in a
compact body that stays below its prime. The digest catches accidental corruption, not forgery;
the fingerprint catches honest key mix-ups (a ciphertext under another key with the same
parameters loads and decrypts to garbage *silently*). Authenticity is the job of the message
layer: sign (Ed25519) the envelope together with the fingerprint. fedgat's frames sign each
envelope through this digest (frame version 14, :class:`fedgat.protocols.codec.Digested`): decoding a
frame checks it, and the protocol's receivers then pass ``digest_checked=True`` to
:func:`deserialize` and :func:`check_envelope` instead of hashing the bytes again. :func:`load_tenseal_vector`
(raw TenSEAL bytes, used on the rebuilt bytes) also checks the protobuf itself (exactly one
ciphertext, ``sizes == [slots]``, scale == the context's exact scale, no unknown fields) and
afterwards the SEAL ciphertext (2 polynomials, NTT form, not transparent, expected level).
"""

from __future__ import annotations

import hashlib
import math
import struct
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import tenseal as ts

from . import wire
from .compact import CompactCodec, floor_bytes
from .context import CkksContext, KeyHolderContext
from .errors import CiphertextFormatError, KeyMismatchError
from .params import ENVELOPE_OVERHEAD_BYTES

__all__ = [
    "SlotLayout",
    "check_envelope",
    "check_linear_map",
    "decrypt_rows",
    "deserialize",
    "encrypt_rows",
    "envelope",
    "envelope_bytes",
    "floor_bytes",
    "linear_combination",
    "linear_map_rows",
    "load_tenseal_vector",
    "serialize",
    "tenseal_payload",
]


# ------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class SlotLayout:
    """Replicated-chunk slot layout (see the module docstring)."""

    d: int
    slots: int
    chunks: int = 1

    def __post_init__(self) -> None:
        if self.d < 1 or self.slots < 1:
            raise ValueError("d and slots must be positive")
        if not 1 <= self.chunks <= self.d:
            raise ValueError("chunks must be in [1, d]")
        if self.width > self.slots:
            raise ValueError(
                f"chunk width {self.width} exceeds {self.slots} slots: use >= "
                f"{math.ceil(self.d / self.slots)} chunks"
            )

    # --- geometry -------------------------------------------------------------------------------
    @property
    def width(self) -> int:
        """Slots per block = features per chunk (``ceil(d / chunks)``)."""
        return -(-self.d // self.chunks)

    @property
    def blocks(self) -> int:
        """Blocks per ciphertext ``k``: output rows per result ciphertext."""
        return self.slots // self.width

    @property
    def nodes_per_ciphertext(self) -> int:
        """Alias of :attr:`blocks`: output rows (or replicas of one node's chunk) per ciphertext."""
        return self.blocks

    def utilisation(self) -> float:
        """Fraction of result slots holding real features when a group is full."""
        return self.blocks * self.d / (self.chunks * self.slots)

    def chunk_bounds(self, chunk: int) -> tuple[int, int]:
        start = chunk * self.width
        return start, min(self.d, start + self.width)

    def groups(self, n_rows: int) -> int:
        """Result ciphertexts per chunk for ``n_rows`` output rows."""
        return -(-n_rows // self.blocks)

    # --- several items' rows in one result (tails packed) ----------------------------------------
    def pack_size(self, rows: int) -> int:
        """Most items of ``rows`` rows each that :meth:`packed_order` puts in one result:
        ``floor(k / t)`` with the tail ``t = rows mod k``, 1 when there is no tail."""
        tail = rows % self.blocks
        return self.blocks // tail if tail else 1

    def packed_groups(self, count: int, rows: int) -> int:
        """Result groups of ``count`` items of ``rows`` rows packed together: each item's whole
        groups, then one group holding all their tails.

        Raises:
            ValueError: ``count`` outside ``[1, pack_size(rows)]``."""
        if not 1 <= count <= self.pack_size(rows):
            raise ValueError(f"{count} items of {rows} rows do not pack (at most {self.pack_size(rows)})")
        return count * (rows // self.blocks) + (1 if rows % self.blocks else 0)

    def packed_order(self, count: int, rows: int) -> np.ndarray:
        """``(count * rows,)``: the rows of ``count`` items packed in one result, as positions in
        their concatenation (``item * rows + r``): every item's whole groups of ``k`` rows in item
        order, then the items' tails side by side in the last group.

        Packing only the tails keeps each whole group's sources those of one item, so a packed
        result costs no more multiply-adds than the items apart (the tail group reads the union of
        the tails' sources) and ``count - 1`` fewer result ciphertexts per chunk."""
        self.packed_groups(count, rows)  # validates
        body = rows - rows % self.blocks
        idx = np.arange(count * rows).reshape(count, rows)
        return np.concatenate([idx[:, :body].ravel(), idx[:, body:].ravel()])

    def unpack_items(self, packed: np.ndarray, count: int, rows: int) -> np.ndarray:
        """Inverse of :meth:`packed_order` on decrypted rows: ``(count * rows, ...)`` in packed
        order -> ``(count, rows, ...)``."""
        out = np.empty_like(packed)
        out[self.packed_order(count, rows)] = packed
        return out.reshape(count, rows, *packed.shape[1:])

    def traffic(self, n_inputs: int, n_outputs: int) -> tuple[int, int]:
        """``(uploaded ciphertexts, result ciphertexts)`` for ``n_inputs`` source rows and
        ``n_outputs`` output rows (result groups full)."""
        return n_inputs * self.chunks, self.groups(n_outputs) * self.chunks

    # --- choosing a layout ----------------------------------------------------------------------
    @classmethod
    def for_dimension(
        cls, d: int, slots: int, *, min_utilisation: float = 0.9, max_chunks: int = 8
    ) -> SlotLayout:
        """The fewest chunks whose utilisation reaches ``min_utilisation``; if none does within
        ``max_chunks``, the best utilisation (fewest chunks on ties)."""
        first = max(1, math.ceil(d / slots))
        candidates = [cls(d, slots, c) for c in range(first, max(first, min(d, max_chunks)) + 1)]
        for layout in candidates:
            if layout.utilisation() >= min_utilisation - 1e-12:
                return layout
        return max(candidates, key=lambda lay: (lay.utilisation(), -lay.chunks))

    @classmethod
    def for_traffic(
        cls,
        d: int,
        slots: int,
        *,
        n_inputs: int,
        n_outputs: int,
        fresh_bytes: int,
        result_bytes: int,
        max_chunks: int = 8,
    ) -> SlotLayout:
        """The chunk count minimising upload + download bytes (sizes from ``measure_preset``)."""
        first = max(1, math.ceil(d / slots))
        best = None
        for c in range(first, max(first, min(d, max_chunks)) + 1):
            layout = cls(d, slots, c)
            up, down = layout.traffic(n_inputs, n_outputs)
            cost = up * fresh_bytes + down * result_bytes
            if best is None or cost < best[0]:
                best = (cost, layout)
        assert best is not None
        return best[1]

    # --- packing ----------------------------------------------------------------------------------
    def _check_rows(self, rows: np.ndarray) -> np.ndarray:
        arr = np.asarray(rows, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[1] != self.d:
            raise ValueError(f"expected an array of shape (n, {self.d}), got {arr.shape}")
        return arr

    def _chunked(self, rows: np.ndarray) -> np.ndarray:
        """(n, d) -> (n, chunks, width), zero-padded."""
        n = rows.shape[0]
        padded = np.zeros((n, self.chunks * self.width))
        padded[:, : self.d] = rows
        return padded.reshape(n, self.chunks, self.width)

    def pack_row(self, row: np.ndarray) -> list[np.ndarray]:
        """One feature row -> ``chunks`` slot vectors, each chunk replicated in every block."""
        return self.pack(np.asarray(row, dtype=np.float64).reshape(1, -1))

    def pack(self, features: np.ndarray) -> list[np.ndarray]:
        """Upload layout: (n, d) -> ``n * chunks`` slot vectors, node-major (index ``j*chunks + ch``)."""
        chunked = self._chunked(self._check_rows(features))  # (n, c, w)
        n = chunked.shape[0]
        out = np.zeros((n, self.chunks, self.slots))
        out[:, :, : self.blocks * self.width] = np.tile(chunked, (1, 1, self.blocks))
        return list(out.reshape(n * self.chunks, self.slots))

    def unpack(self, vectors: Sequence[np.ndarray], n: int, *, average: bool = True) -> np.ndarray:
        """Inverse of :meth:`pack`. With ``average`` the ``k`` replicas are averaged (noise / sqrt(k))."""
        arr = self._stack(vectors, n * self.chunks)
        blocks = arr[:, : self.blocks * self.width].reshape(n, self.chunks, self.blocks, self.width)
        chunks = blocks.mean(axis=2) if average else blocks[:, :, 0, :]
        return chunks.reshape(n, self.chunks * self.width)[:, : self.d].copy()

    def pack_blocks(self, rows: np.ndarray) -> list[np.ndarray]:
        """Result layout: (m, d) -> ``groups(m) * chunks`` slot vectors (index ``g*chunks + ch``),
        row ``r`` in block ``r % k`` of group ``r // k``."""
        rows = self._check_rows(rows)
        m, k = rows.shape[0], self.blocks
        groups = self.groups(m)
        chunked = np.zeros((groups * k, self.chunks, self.width))
        chunked[:m] = self._chunked(rows)
        # (g, b, ch, w) -> (g, ch, b, w)
        grid = chunked.reshape(groups, k, self.chunks, self.width).transpose(0, 2, 1, 3)
        out = np.zeros((groups, self.chunks, self.slots))
        out[:, :, : k * self.width] = grid.reshape(groups, self.chunks, k * self.width)
        return list(out.reshape(groups * self.chunks, self.slots))

    def unpack_blocks(self, vectors: Sequence[np.ndarray], m: int) -> np.ndarray:
        """Inverse of :meth:`pack_blocks`."""
        k, groups = self.blocks, self.groups(m)
        arr = self._stack(vectors, groups * self.chunks)
        grid = arr[:, : k * self.width].reshape(groups, self.chunks, k, self.width).transpose(0, 2, 1, 3)
        return grid.reshape(groups * k, self.chunks * self.width)[:m, : self.d].copy()

    def broadcast(self, block_values: np.ndarray) -> np.ndarray:
        """Plaintext coefficient vector(s): value ``b`` repeated over block ``b``'s slots, 0 in
        unused blocks and the tail. ``(<= k,) -> (slots,)`` or ``(K, <= k) -> (K, slots)``."""
        vals = np.asarray(block_values, dtype=np.float64)
        single = vals.ndim == 1
        vals = np.atleast_2d(vals)
        if vals.ndim != 2 or vals.shape[1] > self.blocks:
            raise ValueError(f"expected at most {self.blocks} block values per vector")
        out = np.zeros((vals.shape[0], self.slots))
        out[:, : vals.shape[1] * self.width] = np.repeat(vals, self.width, axis=1)
        return out[0] if single else out

    def broadcast_list(self, block_values: Sequence[float]) -> list[float]:
        """:meth:`broadcast` of one vector as the Python list SEAL's encoder takes, built by list
        repetition: each block shares one float object, several times cheaper than ``tolist()`` on
        the array (the server encodes one such list per coefficient vector)."""
        if len(block_values) > self.blocks:
            raise ValueError(f"expected at most {self.blocks} block values per vector")
        out: list[float] = []
        for v in block_values:
            out += [float(v)] * self.width
        out += [0.0] * (self.slots - len(out))
        return out

    def _stack(self, vectors: Sequence[np.ndarray], expected: int) -> np.ndarray:
        arr = np.asarray(list(vectors) if not isinstance(vectors, np.ndarray) else vectors, dtype=np.float64)
        if arr.shape != (expected, self.slots):
            raise ValueError(f"expected {expected} vectors of {self.slots} slots, got {arr.shape}")
        return arr


# ------------------------------------------------------------------------- ciphertext envelope
_MAGIC = b"FGCT"
#: envelope version of each wire: 1, TenSEAL's bytes as the body; 2, the compact form
#: (fedgat.crypto.compact)
_VERSIONS = {"compact": 2, "tenseal": 1}
_WIRE_OF = {v: k for k, v in _VERSIONS.items()}
_VERSION = _VERSIONS["compact"]  # the default wire's
_HEADER = struct.Struct(">4sBB32sI")
_DIGEST = 32
assert _HEADER.size + _DIGEST == ENVELOPE_OVERHEAD_BYTES

# CKKSVectorProto field numbers (tenseal/proto/tensors.proto)
_VEC_SIZES, _VEC_CIPHERTEXTS, _VEC_SCALE = 1, 2, 3

_LEVELS = {"fresh", "result"}


def _tenseal_errors() -> tuple[type[BaseException], ...]:
    return (ValueError, RuntimeError, TypeError, OverflowError, MemoryError, IndexError)


def _check_vector_proto(ctx: CkksContext, payload: bytes) -> None:
    try:
        fields = wire.parse_fields(payload)
        sizes: list[int] = []
        n_ct = 0
        scale = None
        for number, kind, value in fields:
            if number == _VEC_SIZES and kind == wire.WIRE_LEN:
                sizes.extend(wire.parse_packed_varints(value))  # type: ignore[arg-type]
            elif number == _VEC_SIZES and kind == wire.WIRE_VARINT:
                sizes.append(value)  # type: ignore[arg-type]
            elif number == _VEC_CIPHERTEXTS and kind == wire.WIRE_LEN:
                n_ct += 1
            elif number == _VEC_SCALE and kind == wire.WIRE_I64:
                scale = wire.decode_double(value)  # type: ignore[arg-type]
            else:
                raise ValueError(f"unexpected field {number} (wire type {kind})")
    except ValueError as exc:
        raise CiphertextFormatError(f"malformed CKKS vector: {exc}") from exc
    if n_ct != 1 or sizes != [ctx.slots]:
        raise CiphertextFormatError(
            f"expected one ciphertext of {ctx.slots} slots, got {n_ct} ciphertexts, sizes {sizes[:4]}"
        )
    if scale != ctx.scale:
        raise CiphertextFormatError(f"vector scale {scale!r} is not the context scale {ctx.scale!r}")


def load_tenseal_vector(ctx: CkksContext, payload: bytes, *, level: str | None = None) -> ts.CKKSVector:
    """Load raw TenSEAL CKKS-vector bytes (no envelope) with structural checks.

    Errors from TenSEAL/SEAL become :class:`CiphertextFormatError`. This catches random and
    truncated bytes, other parameters and most header damage, but NOT every corrupted
    coefficient nor a ciphertext under another key with the same parameters: those load and
    decrypt to garbage. Use :func:`deserialize` (digest + fingerprint) for anything received.
    """
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise TypeError("payload must be bytes")
    payload = bytes(payload)
    _check_vector_proto(ctx, payload)
    try:
        vec = ts.ckks_vector_from(ctx.tenseal, payload)
        cts = vec.ciphertext()
    except _tenseal_errors() as exc:
        raise CiphertextFormatError(f"TenSEAL rejected the ciphertext: {exc}") from exc
    if len(cts) != 1:
        raise CiphertextFormatError("expected exactly one SEAL ciphertext")
    ct = cts[0]
    if ct.size() != 2 or ct.is_transparent() or not ct.is_ntt_form():
        raise CiphertextFormatError("SEAL ciphertext must have 2 non-zero NTT-form polynomials")
    if ct.scale != ctx.scale:
        raise CiphertextFormatError(f"ciphertext scale {ct.scale!r} is not the context scale")
    _check_level(ctx, ctx.level_of(vec), level)
    return vec


def _check_level(ctx: CkksContext, got: int, level: str | None) -> None:
    """``got`` (a SEAL chain index) is the fresh or the result level, and ``level``'s if given."""
    if got not in (ctx.fresh_level, ctx.result_level):
        raise CiphertextFormatError(f"unexpected ciphertext level {got}")
    if level is not None:
        if level not in _LEVELS:
            raise ValueError(f"level must be one of {_LEVELS}")
        want = ctx.fresh_level if level == "fresh" else ctx.result_level
        if got != want:
            raise CiphertextFormatError(f"expected a {level} ciphertext (level {want}), got level {got}")


_CODECS: weakref.WeakKeyDictionary[CkksContext, dict[int, CompactCodec]] = weakref.WeakKeyDictionary()


def _template(ctx: CkksContext, level: int) -> bytes:
    """TenSEAL bytes of one ciphertext of ``ctx`` at ``level`` (chain index), made by this library."""
    try:
        vec = ts.ckks_vector(ctx.tenseal, [0.0] * ctx.slots)
        if level == ctx.result_level and level != ctx.fresh_level:
            vec = ts.CKKSVector._wrap(vec.data.mul_plain([1.0] * ctx.slots))
        if ctx.level_of(vec) != level:
            raise CiphertextFormatError(f"cannot make a template ciphertext at level {level}")
        return vec.serialize()
    except _tenseal_errors() as exc:
        raise CiphertextFormatError(f"cannot make a template ciphertext: {exc}") from exc


def compact_codec(ctx: CkksContext, level: int) -> CompactCodec:
    """The :class:`~fedgat.crypto.compact.CompactCodec` of ``ctx``'s ciphertexts at chain index
    ``level`` (fresh or result), built once per context from a template ciphertext."""
    if level not in (ctx.fresh_level, ctx.result_level):
        raise CiphertextFormatError(f"unexpected ciphertext level {level}")
    codecs = _CODECS.get(ctx)
    if codecs is None:
        codecs = _CODECS.setdefault(ctx, {})
    codec = codecs.get(level)
    if codec is None:
        data = ctx.tenseal.seal_context().data
        context_data = data.first_context_data() if level == ctx.fresh_level else data.last_context_data()
        if int(context_data.chain_index()) != level:  # pragma: no cover - levels come from the same chain
            raise CiphertextFormatError(f"no context data at level {level}")
        codec = codecs[level] = CompactCodec.from_template(
            _template(ctx, level),
            poly_modulus_degree=ctx.preset.poly_modulus_degree,
            primes=tuple(int(m.value()) for m in context_data.parms().coeff_modulus()),
            parms_id=tuple(int(x) for x in context_data.parms_id()),
            scale=ctx.scale,
            slots=ctx.slots,
        )
    return codec


def _varint_size(x: int) -> int:
    return max(1, -(-x.bit_length() // 7))


def _zstd_bound(n: int) -> int:
    """zstd's documented worst-case output for ``n`` input bytes (``ZSTD_COMPRESSBOUND``)."""
    return n + (n >> 8) + (((128 << 10) - n) >> 11 if n < (128 << 10) else 0)


def envelope_bytes(ctx: CkksContext, level: str) -> int:
    """Size of a :func:`serialize` envelope of ``ctx``'s wire at ``level`` (``"fresh"`` or ``"result"``).

    ``"compact"``: exact, the compact body (the level's floor, :func:`floor_bytes`) plus 74 bytes of
    header and digest. ``"tenseal"``: an UPPER BOUND, not the size: SEAL's zstd output depends on
    the coefficients (random ciphertexts vary by about +-0.3 %), so the bound takes the uncompressed
    SEAL stream at zstd's worst-case expansion (about 1.55x the floor at ``n4096`` against a typical
    1.22x / 1.18x; :meth:`fedgat.crypto.params.CkksPreset.wire_bytes` gives typical sizes). Receivers
    refuse a tenseal envelope above it (a padded body would otherwise load: SEAL ignores what
    follows the ciphertext)."""
    if level not in _LEVELS:
        raise ValueError(f"level must be one of {_LEVELS}")
    chain = ctx.fresh_level if level == "fresh" else ctx.result_level
    codec = compact_codec(ctx, chain)
    if ctx.wire == "compact":
        return _HEADER.size + codec.body_size() + _DIGEST
    # CKKSVectorProto: sizes field (tag, length, varint(slots)), ciphertext field (tag, length,
    # SEAL stream), scale field (tag, f64). The stream: SEAL header (16 B) then the zstd frame of the
    # ciphertext's members (metadata, the coefficient array's header and count, 8 B per coefficient).
    sizes = 2 + _varint_size(ctx.slots)
    members = struct.calcsize("<32sBQQQdQ") + 16 + 8 + 8 * codec.coefficients
    stream = 16 + _zstd_bound(members)
    return _HEADER.size + sizes + 1 + _varint_size(stream) + stream + 9 + _DIGEST


def serialize(ctx: CkksContext, vec: ts.CKKSVector) -> bytes:
    """Envelope a CKKS vector in ``ctx``'s wire (:attr:`~fedgat.crypto.context.CkksContext.wire`):
    magic, version, level, context fingerprint, the body (the compact ciphertext,
    :mod:`fedgat.crypto.compact`, or TenSEAL's bytes), SHA-256 of all that."""
    try:
        level = ctx.level_of(vec)
        payload = vec.serialize()
    except _tenseal_errors() as exc:
        raise CiphertextFormatError(f"cannot serialise: {exc}") from exc
    return envelope(ctx, payload, level)


def envelope(ctx: CkksContext, payload: bytes, level: int) -> bytes:
    """The envelope of TenSEAL vector bytes ``payload`` at SEAL chain index ``level`` in ``ctx``'s
    wire: what :func:`serialize` writes (:class:`fedgat.crypto.evaluator.SealEvaluator` serialises
    itself)."""
    if ctx.wire == "compact":
        body = compact_codec(ctx, level).compact(payload)
    else:
        if level not in (ctx.fresh_level, ctx.result_level):
            raise CiphertextFormatError(f"unexpected ciphertext level {level}")
        body = bytes(payload)
    return envelope_body(ctx, body, level)


def envelope_body(ctx: CkksContext, body: bytes, level: int) -> bytes:
    """Header, ``body`` (already in ``ctx``'s wire) and digest: the framing of :func:`envelope`."""
    head = _HEADER.pack(_MAGIC, _VERSIONS[ctx.wire], level, ctx.fingerprint(), len(body))
    digest = hashlib.sha256(head)
    digest.update(body)
    return b"".join((head, body, digest.digest()))


def _open(ctx: CkksContext, data: bytes | bytearray | memoryview, *, check_digest: bool) -> tuple[int, bytes]:
    """Envelope -> (level, fingerprint) after the framing checks (and the digest). Only the
    envelope version of ``ctx``'s wire passes."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("data must be bytes")
    if len(data) < _HEADER.size + _DIGEST:
        raise CiphertextFormatError("ciphertext envelope too short")
    magic, version, lvl, fingerprint, length = _HEADER.unpack_from(data, 0)
    if magic != _MAGIC:
        raise CiphertextFormatError("not a fedgat ciphertext envelope (bad magic)")
    want = _VERSIONS[ctx.wire]
    if version != want:
        other = _WIRE_OF.get(version)
        raise CiphertextFormatError(
            f"unsupported envelope version {version}"
            + (f" (the {other!r} wire)" if other else "")
            + f": this session's wire is {ctx.wire!r} (version {want})"
        )
    if _HEADER.size + length + _DIGEST != len(data):
        raise CiphertextFormatError("envelope length mismatch (truncated or padded)")
    if ctx.wire == "tenseal":
        # SEAL stops reading after the members it needs, so a padded body would still load: hold it to
        # the largest honest ciphertext of its level (the receiver stores what it accepts)
        if lvl not in (ctx.fresh_level, ctx.result_level):
            raise CiphertextFormatError(f"unexpected ciphertext level {lvl}")
        bound = envelope_bytes(ctx, "fresh" if lvl == ctx.fresh_level else "result")
        if len(data) > bound:
            raise CiphertextFormatError(
                f"envelope of {len(data)} bytes; a ciphertext of its level takes at most {bound}"
            )
    if check_digest:
        view = memoryview(data)
        if hashlib.sha256(view[:-_DIGEST]).digest() != view[-_DIGEST:]:
            raise CiphertextFormatError("envelope digest mismatch (corrupted bytes)")
    return lvl, fingerprint


def _body(data: bytes | bytearray | memoryview) -> memoryview:
    return memoryview(data)[_HEADER.size : len(data) - _DIGEST]


def tenseal_payload(ctx: CkksContext, data: bytes) -> bytes:
    """The TenSEAL bytes an envelope's body stands for, in ``ctx``'s wire: a compact body expanded
    against ``ctx``'s parameters at the envelope's level (its size and every coefficient against its
    prime are checked), a TenSEAL body as is (its protobuf fields are checked). Checks the framing
    too (:class:`CiphertextFormatError`), but NOT the digest nor the key fingerprint: for tools that
    look at ciphertexts under another key on purpose (attacks, audits)."""
    lvl, _ = _open(ctx, data, check_digest=False)
    if ctx.wire == "compact":
        return compact_codec(ctx, lvl).expand(_body(data))
    payload = bytes(_body(data))
    _check_vector_proto(ctx, payload)
    return payload


def deserialize(
    ctx: CkksContext, data: bytes, *, level: str | None = None, digest_checked: bool = False
) -> ts.CKKSVector:
    """Inverse of :func:`serialize`, linked to ``ctx``.

    Raises :class:`CiphertextFormatError` for malformed, truncated or corrupted bytes (digest),
    an envelope of another version than ``ctx``'s wire's (:attr:`~fedgat.crypto.context.CkksContext.wire`),
    wrong parameters, scale or ``level`` (``"fresh"`` for uploads, ``"result"`` for server results),
    a compact body of the wrong size for its level or a coefficient not below its prime, TenSEAL
    bytes SEAL refuses, and :class:`KeyMismatchError` when the envelope names another key's
    fingerprint.

    ``digest_checked=True``: the caller has checked the digest already -- a ciphertext field of a
    message decoded from its frame, whose decoding checks every such digest
    (:class:`fedgat.protocols.codec.Digested`) -- so it is not computed again. The digest catches
    corruption, not forgery (module docstring): every other check still runs.
    """
    lvl, fingerprint = _open(ctx, data, check_digest=not digest_checked)
    if fingerprint != ctx.fingerprint():
        raise KeyMismatchError("ciphertext is bound to another CKKS key (fingerprint mismatch)")
    _check_level(ctx, lvl, level)
    if ctx.wire == "compact":
        payload = compact_codec(ctx, lvl).expand(_body(data))
    else:
        payload = bytes(_body(data))
    vec = load_tenseal_vector(ctx, payload, level=level)
    if ctx.level_of(vec) != lvl:
        raise CiphertextFormatError("envelope level does not match the ciphertext")
    return vec


def check_envelope(
    ctx: CkksContext, data: bytes, *, level: str | None = None, digest_checked: bool = False
) -> None:
    """What :func:`deserialize` checks, without keeping the vector: raises exactly the errors it
    raises (:class:`CiphertextFormatError`, :class:`KeyMismatchError`) on exactly the inputs it
    refuses, and returns None where it would return a vector.

    A receiver that only stores what it accepts (the server's upload spool) uses this. In the
    ``"compact"`` wire it does not build TenSEAL's bytes nor load them: every field of those bytes
    but the coefficients is the template's (:class:`~fedgat.crypto.compact.CompactCodec`, checked
    against the context when the codec was made), so of what :func:`load_tenseal_vector` checks
    only two things depend on the sender: every coefficient below its prime (SEAL's
    ``is_data_valid_for``, checked while unpacking) and a non-zero second polynomial (SEAL's
    ``is_transparent``, checked here on the unpacked coefficients). The ``"tenseal"`` wire is
    loaded as :func:`deserialize` does (SEAL parses the sender's protobuf and stream).
    ``digest_checked`` as there."""
    if ctx.wire != "compact":
        deserialize(ctx, data, level=level, digest_checked=digest_checked)
        return
    lvl, fingerprint = _open(ctx, data, check_digest=not digest_checked)
    if fingerprint != ctx.fingerprint():
        raise KeyMismatchError("ciphertext is bound to another CKKS key (fingerprint mismatch)")
    _check_level(ctx, lvl, level)
    grid = compact_codec(ctx, lvl).unpack(_body(data))
    if not grid[1].any():  # SEAL's is_transparent: the second polynomial is zero
        raise CiphertextFormatError("SEAL ciphertext must have 2 non-zero NTT-form polynomials")


def load_validated(ctx: CkksContext, data: bytes) -> ts.CKKSVector:
    """Load an envelope that :func:`deserialize` already accepted *in this party* (the server's
    upload spool re-reads each upload many times). Skips the digest and the structural checks, so
    never use it on bytes received from anyone. The envelope must be of ``ctx``'s wire (it is, if
    :func:`deserialize` accepted it under ``ctx``'s session)."""
    if data[4] != _VERSIONS[ctx.wire]:
        raise CiphertextFormatError(f"envelope version {data[4]} is not the {ctx.wire!r} wire's")
    if ctx.wire == "compact":
        return ts.ckks_vector_from(ctx.tenseal, compact_codec(ctx, data[5]).expand(_body(data)))
    return ts.ckks_vector_from(ctx.tenseal, bytes(_body(data)))


# ---------------------------------------------------------------------------- client recipes
def encrypt_rows(
    ctx: CkksContext, rows: np.ndarray | Iterable[np.ndarray], layout: SlotLayout | None = None
) -> Iterator[bytes]:
    """Encrypt feature rows in the upload layout, one envelope per (row, chunk), node-major.

    A generator: rows are packed, encrypted and serialised one at a time (accepts any iterable
    of length-``d`` rows). ``layout`` defaults to ``SlotLayout.for_dimension(d, ctx.slots)``.
    """
    if isinstance(rows, np.ndarray):
        if rows.ndim != 2:
            raise ValueError("rows must be 2-D (n, d)")
        if layout is None:
            layout = SlotLayout.for_dimension(rows.shape[1], ctx.slots)
    elif layout is None:
        raise ValueError("pass a layout when rows is not an ndarray")
    if layout.slots != ctx.slots:
        raise ValueError(f"layout has {layout.slots} slots, context {ctx.slots}")
    for row in rows:
        for vector in layout.pack_row(row):
            yield serialize(ctx, ctx.encrypt_vector(vector))


def decrypt_rows(
    ctx: KeyHolderContext,
    blobs: Iterable[bytes],
    n: int,
    layout: SlotLayout,
    *,
    kind: str = "result",
    digest_checked: bool = False,
) -> np.ndarray:
    """Decrypt ``n`` rows. ``kind="result"``: server results in the blocked layout
    (:meth:`SlotLayout.unpack_blocks`); ``kind="fresh"``: uploads in the replicated layout
    (:meth:`SlotLayout.unpack`, replicas averaged). ``digest_checked`` as in :func:`deserialize`."""
    if kind not in _LEVELS:
        raise ValueError(f"kind must be one of {_LEVELS}")
    vectors = [
        ctx.decrypt_vector(deserialize(ctx, blob, level=kind, digest_checked=digest_checked))
        for blob in blobs
    ]
    if kind == "fresh":
        return layout.unpack(vectors, n)
    return layout.unpack_blocks(vectors, n)


# ---------------------------------------------------------------------------- server primitive
def linear_combination(
    ctx: CkksContext,
    cts: Sequence[ts.CKKSVector],
    coeff_vectors: Sequence[np.ndarray] | np.ndarray,
    *,
    check_levels: bool = True,
) -> ts.CKKSVector:
    """``sum_k cts[k] (.) coeff_vectors[k]``: slot-wise plaintext multiply-adds, no rotation.

    Each term costs one plaintext encoding, one ``multiply_plain`` and one rescale (TenSEAL
    rescales after every multiply; ~60 % of the term's time is encode + multiply, ~40 % rescale).
    All-zero coefficient vectors are skipped; if every vector is zero there is nothing to
    encrypt and ``ValueError`` is raised (the caller knows the result is 0). Inputs must be fresh
    ciphertexts of this context; the result is at ``ctx.result_level`` and must satisfy
    ``|value| < ctx.max_abs_value`` in every slot (not checkable under encryption).
    """
    cts = list(cts)
    coeffs = np.asarray(coeff_vectors, dtype=np.float64)
    if coeffs.ndim != 2 or coeffs.shape != (len(cts), ctx.slots):
        raise ValueError(f"expected {len(cts)} coefficient vectors of {ctx.slots} slots, got {coeffs.shape}")
    if not np.all(np.isfinite(coeffs)):
        raise ValueError("coefficients must be finite")
    acc = None
    # the low-level TenSEAL object, a plain list operand, one wrap at the end: the wrapper's
    # ``mul(list)`` round-trips every operand through a PlainTensor (~30 % of the term's time)
    for ct, coeff in zip(cts, coeffs):
        if not coeff.any():
            continue
        if check_levels and ctx.level_of(ct) != ctx.fresh_level:
            raise CiphertextFormatError("linear_combination needs fresh (not yet multiplied) ciphertexts")
        term = ct.data.mul_plain(coeff.tolist())
        if acc is None:
            acc = term
        else:
            acc += term
    if acc is None:
        raise ValueError("every coefficient vector is zero")
    return ts.CKKSVector._wrap(acc)


def check_linear_map(
    ctx: CkksContext,
    layout: SlotLayout,
    sources: Sequence[Sequence[ts.CKKSVector]],
    q: np.ndarray,
    *,
    name: str,
) -> np.ndarray:
    """The checks of an encrypted ``Q @ H`` (:func:`linear_map_rows`,
    :meth:`fedgat.crypto.evaluator.SealEvaluator.linear_map`), each source's level once rather than
    once per result group; returns ``Q`` as float64."""
    q = np.asarray(q, dtype=np.float64)
    if q.ndim != 2 or q.shape[1] != len(sources):
        raise ValueError(f"Q must have shape (m, {len(sources)})")
    if layout.slots != ctx.slots:
        raise ValueError("layout and context disagree on the slot count")
    if not np.all(np.isfinite(q)):
        raise ValueError("coefficients must be finite")
    for j, chunks in enumerate(sources):
        if len(chunks) != layout.chunks:
            raise ValueError(f"source {j} has {len(chunks)} chunks, layout needs {layout.chunks}")
        if any(ctx.level_of(ct) != ctx.fresh_level for ct in chunks):
            raise CiphertextFormatError(f"{name} needs fresh (not yet multiplied) ciphertexts")
    return q


def linear_map_rows(
    ctx: CkksContext, layout: SlotLayout, sources: Sequence[Sequence[ts.CKKSVector]], q: np.ndarray
) -> list[ts.CKKSVector]:
    """Encrypted ``Q @ H`` for a plaintext ``Q`` of shape ``(m, n_sources)``.

    ``sources[j][ch]`` is source ``j``'s chunk-``ch`` upload. Returns ``groups(m) * chunks``
    result ciphertexts in :meth:`SlotLayout.pack_blocks` order (``g * chunks + ch``); decrypt with
    ``decrypt_rows(..., m, layout, kind="result")``. Sources whose coefficients are all zero in a
    group are skipped, so cost = sum over groups and chunks of the sources used by that group.
    """
    q = check_linear_map(ctx, layout, sources, q, name="linear_map_rows")
    k = layout.blocks
    out = []
    for g in range(layout.groups(q.shape[0])):
        rows = q[g * k : (g + 1) * k]  # (<= k, n_sources)
        used = np.flatnonzero(np.any(rows != 0, axis=0))
        coeffs = layout.broadcast(rows[:, used].T)  # (len(used), slots)
        for ch in range(layout.chunks):
            out.append(
                linear_combination(ctx, [sources[int(j)][ch] for j in used], coeffs, check_levels=False)
            )
    return out
