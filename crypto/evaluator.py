r"""The server's multiply-adds through SEAL's own evaluator, at fewer operations than TenSEAL's
vector API allows.

The server computes, for every result group :math:`g` of a node and every chunk :math:`ch` of the
upload layout, :math:`\mathrm{out}_{g,ch} = \sum_j c_{g,j} \odot \mathrm{ct}_{j,ch}` (the encrypted
:math:`F_i = A_i H_i` of the paper's pre-training, Section 4; :func:`fedgat.crypto.packing.linear_map_rows`
is the same sum through TenSEAL). TenSEAL's ``CKKSVector.mul`` encodes its plaintext operand and
rescales after every product. Two of those operations are not needed:

* the coefficient vector :math:`c_{g,j}` is the same for every chunk (the chunks split a node's
  feature row, the coefficients are per node): encode it once and multiply every chunk by it;
* products can be summed at scale :math:`\Delta^2` and rescaled once per result: the sum needs
  :math:`q_0 q_1 / \Delta^2 = q_0 / \Delta` of headroom, exactly what a rescaled result has
  (:attr:`fedgat.crypto.context.CkksContext.max_abs_value`), and one rescale adds its rounding noise
  once instead of once per term.

So a result of ``T`` terms over ``C`` chunks costs ``T/C`` encodings, ``T`` plaintext multiplies,
``T - 1`` additions and one rescale (:meth:`OpCounts.seconds`), where TenSEAL spends ``T`` of each.
Measured at n4096 on the 2-core development VM (ms): encode 0.35, multiply 0.12, add 0.03,
rescale 0.31; TenSEAL's multiply-add with its rescale 0.9. A Cora result (about 3 terms, 3 chunks)
costs 1.3 ms instead of 2.8 ms.

The result is serialised in TenSEAL's own format (a ``CKKSVector`` protobuf around SEAL's
``Ciphertext.save`` stream, byte for byte what ``CKKSVector.serialize`` writes), so everything
downstream -- envelopes, clients' checks and decryption -- is unchanged. ``tenseal.sealapi`` saves a
ciphertext only to a file path; we hand it an anonymous in-memory file (``memfd``) where the OS has
one, a private temporary file elsewhere. Nothing secret passes through it: these are ciphertexts
the server sends anyway.
"""

from __future__ import annotations

import os
import struct
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tenseal as ts
from tenseal import sealapi

from .context import CkksContext
from .packing import SlotLayout, check_linear_map, compact_codec, envelope, envelope_body

__all__ = ["OpCounts", "SealEvaluator", "evaluator_for"]


@dataclass(frozen=True)
class OpCounts:
    """The SEAL operations of a batch of results: what the server's op-count bound counts."""

    encodes: int = 0
    multiplies: int = 0
    additions: int = 0
    rescales: int = 0

    def __add__(self, other: OpCounts) -> OpCounts:
        return OpCounts(
            self.encodes + other.encodes,
            self.multiplies + other.multiplies,
            self.additions + other.additions,
            self.rescales + other.rescales,
        )

    def seconds(self, costs: dict[str, float]) -> float:
        """Time of these operations at per-operation ``costs`` (seconds; keys ``encode``,
        ``multiply``, ``add``, ``rescale``), e.g. :func:`fedgat.crypto.measure.measure_evaluator`."""
        return (
            self.encodes * costs["encode"]
            + self.multiplies * costs["multiply"]
            + self.additions * costs["add"]
            + self.rescales * costs["rescale"]
        )

    @staticmethod
    def of_round(multiply_adds: int, results: int, chunks: int) -> OpCounts:
        """The operations of a round of ``multiply_adds`` over ``chunks`` chunks into ``results``
        result ciphertexts: every encoding serves all chunks, one rescale per result."""
        return OpCounts(
            encodes=multiply_adds // chunks,
            multiplies=multiply_adds,
            additions=multiply_adds - results,
            rescales=results,
        )

    @staticmethod
    def of_map(q: np.ndarray, layout: SlotLayout) -> OpCounts:
        """The operations :meth:`SealEvaluator.linear_map` spends on a ``(rows, sources)`` map."""
        q = np.asarray(q)
        k, groups = layout.blocks, layout.groups(q.shape[0])
        padded = np.zeros((groups * k, q.shape[1]), dtype=bool)
        padded[: q.shape[0]] = q != 0
        used = padded.reshape(groups, k, -1).any(axis=1).sum(axis=1)  # sources per group
        terms, nonempty = int(used.sum()), int((used > 0).sum())
        return OpCounts(
            encodes=terms,
            multiplies=terms * layout.chunks,
            additions=(terms - nonempty) * layout.chunks,
            rescales=nonempty * layout.chunks,
        )


class _MemoryFile:
    """A file path SEAL can write to, read back without touching a disk where the OS allows."""

    def __init__(self) -> None:
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
            self._fd = os.memfd_create("fedgat-ciphertext", os.MFD_CLOEXEC)
            self.path = f"/proc/self/fd/{self._fd}"
        else:  # no memfd (macOS, Windows): a private temporary file
            self._dir = tempfile.TemporaryDirectory(prefix="fedgat-ct-")
            self.path = os.path.join(self._dir.name, "ciphertext")
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)

    def save(self, ct: sealapi.Ciphertext) -> bytes:
        ct.save(self.path)  # SEAL opens the path with truncation: the file holds this save only
        size = os.fstat(self._fd).st_size
        if hasattr(os, "pread"):
            return os.pread(self._fd, size, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)  # Windows has no pread
        return os.read(self._fd, size)

    def close(self) -> None:
        os.close(self._fd)
        if self._dir is not None:
            self._dir.cleanup()


_FILE: tuple[int, _MemoryFile] | None = None


def _memory_file() -> _MemoryFile:
    """This process's file (one per process: a forked worker must not write into its parent's)."""
    global _FILE
    if _FILE is None or _FILE[0] != os.getpid():
        _FILE = (os.getpid(), _MemoryFile())
    return _FILE[1]


_EVALUATORS: weakref.WeakKeyDictionary[CkksContext, SealEvaluator] = weakref.WeakKeyDictionary()


def evaluator_for(ctx: CkksContext) -> SealEvaluator:
    """The :class:`SealEvaluator` of ``ctx`` in this process (made on first use, dropped with ``ctx``)."""
    ev = _EVALUATORS.get(ctx)
    if ev is None:
        ev = _EVALUATORS[ctx] = SealEvaluator(ctx)
    return ev


def _varint(x: int) -> bytes:
    out = bytearray()
    while True:
        byte, x = x & 0x7F, x >> 7
        out.append(byte | (0x80 if x else 0))
        if not x:
            return bytes(out)


class SealEvaluator:
    """The server's :math:`\\sum_j c_{g,j} \\odot \\mathrm{ct}_{j,ch}` with one encoding per
    coefficient vector and one rescale per result (see the module docstring).

    Not thread-safe (it owns a SEAL evaluator and encoder and writes through this process's
    in-memory file); :func:`evaluator_for` keeps one per context.
    """

    def __init__(self, ctx: CkksContext) -> None:
        self.ctx = ctx
        self._seal = ctx.tenseal.seal_context().data
        self._evaluator = sealapi.Evaluator(self._seal)
        self._encoder = sealapi.CKKSEncoder(self._seal)
        self._fresh_parms = self._seal.first_parms_id()
        shape = _varint(ctx.slots)
        self._proto_head = b"\x0a" + _varint(len(shape)) + shape  # field 1: the vector's shape
        self._proto_tail = b"\x19" + struct.pack("<d", ctx.scale)  # field 3: its scale
        self.ops = OpCounts()

    def payload(self, ct: sealapi.Ciphertext) -> bytes:
        """``ct`` serialised as TenSEAL's ``CKKSVector.serialize`` would (no envelope)."""
        stream = _memory_file().save(ct)
        return self._proto_head + b"\x12" + _varint(len(stream)) + stream + self._proto_tail

    def result_envelope(self, ct: sealapi.Ciphertext) -> bytes:
        """A rescaled result ``ct`` as its envelope in the context's wire: what
        ``envelope(ctx, self.payload(ct), ctx.result_level)`` returns, without building the protobuf
        only to parse it again on the compact wire."""
        ctx = self.ctx
        if ctx.wire != "compact":
            return envelope(ctx, self.payload(ct), ctx.result_level)
        body = compact_codec(ctx, ctx.result_level).compact_stream(_memory_file().save(ct))
        return envelope_body(ctx, body, ctx.result_level)

    def linear_map(
        self, layout: SlotLayout, sources: Sequence[Sequence[ts.CKKSVector]], q: np.ndarray
    ) -> list[bytes]:
        """Encrypted ``Q @ H`` as result envelopes, in :meth:`SlotLayout.pack_blocks` order
        (``g * chunks + ch``): what :func:`~fedgat.crypto.packing.linear_map_rows` followed by
        :func:`~fedgat.crypto.packing.serialize` returns, for fewer operations.

        ``sources[j][ch]``: source ``j``'s chunk-``ch`` upload, a fresh ciphertext of this context.
        A group whose coefficients are all zero has nothing to encrypt: ``ValueError`` (as there).
        """
        ctx = self.ctx
        q = check_linear_map(ctx, layout, sources, q, name="linear_map")
        raw = [[ct.data.ciphertext()[0] for ct in chunks] for chunks in sources]
        ev, k, seal = self._evaluator, layout.blocks, self._seal
        plain, product = sealapi.Plaintext(), sealapi.Ciphertext(seal)
        out: list[bytes] = []
        ops = OpCounts()
        for g in range(layout.groups(q.shape[0])):
            rows = q[g * k : (g + 1) * k]
            used = np.flatnonzero(np.any(rows != 0, axis=0))
            if not len(used):
                raise ValueError("every coefficient vector is zero")
            sums = [sealapi.Ciphertext(seal) for _ in range(layout.chunks)]
            for t, (j, c) in enumerate(zip(used.tolist(), rows[:, used].T.tolist())):
                self._encoder.encode(layout.broadcast_list(c), self._fresh_parms, ctx.scale, plain)
                for ch in range(layout.chunks):
                    if t == 0:
                        ev.multiply_plain(raw[j][ch], plain, sums[ch])
                    else:
                        ev.multiply_plain(raw[j][ch], plain, product)
                        ev.add_inplace(sums[ch], product)
            for total in sums:
                ev.rescale_to_next_inplace(total)
                # scale^2 / q1 with scale == q1 is q1 exactly; the double division may round
                total.scale = ctx.scale
                out.append(self.result_envelope(total))
            n = len(used)
            ops += OpCounts(n, n * layout.chunks, (n - 1) * layout.chunks, layout.chunks)
        self.ops += ops
        return out
