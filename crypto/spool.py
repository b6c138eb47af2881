"""The server's upload spool: validated uploads on disk, read back through an LRU cache.

Kept free of torch (and of :mod:`fedgat.encodings`): the process-pool workers of
:mod:`fedgat.crypto.encoders` open it read-only (:meth:`CiphertextSpool.reader`).
"""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import BinaryIO

import tenseal as ts

from .context import CkksContext
from .errors import CiphertextFormatError
from .packing import SlotLayout, deserialize, load_validated


class CiphertextSpool:
    """Server-side, append-only on-disk store of uploaded feature ciphertexts.

    ``put`` validates each envelope (format digest, key fingerprint, fresh level) *before* storing
    it and refuses a second upload for the same ``(node, chunk)``; ``get`` loads a node's chunks
    without repeating those checks (:func:`~fedgat.crypto.packing.load_validated`; the file is this
    party's own) through an LRU cache of TenSEAL objects (``cache_size`` nodes).
    """

    def __init__(
        self, ctx: CkksContext, layout: SlotLayout, directory: str | Path | None = None, cache_size: int = 512
    ) -> None:
        self.ctx, self.layout = ctx, layout
        self._tmp = tempfile.TemporaryDirectory(prefix="fedgat-spool-") if directory is None else None
        folder = Path(self._tmp.name) if self._tmp is not None else Path(directory)  # type: ignore[arg-type]
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "uploads.bin"
        self._file: BinaryIO = open(self.path, "a+b")  # noqa: SIM115 - lives as long as the spool
        self._index: dict[tuple[int, int], tuple[int, int]] = {}
        self._cache: OrderedDict[int, list[ts.CKKSVector]] = OrderedDict()
        self.cache_size = cache_size
        self.bytes_stored = 0

    def __contains__(self, node: int) -> bool:
        return all((int(node), ch) in self._index for ch in range(self.layout.chunks))

    def put(self, node: int, chunk: int, blob: bytes, *, validated: bool = False) -> None:
        """Store one upload. ``validated=True``: the caller has already run
        ``deserialize(ctx, blob, level="fresh")`` on exactly these bytes (the server checks a whole
        message before storing any of it), so the check is not repeated."""
        key = (int(node), int(chunk))
        if not 0 <= key[1] < self.layout.chunks:
            raise CiphertextFormatError(f"chunk {chunk} out of range for {self.layout.chunks} chunks")
        if key in self._index:
            raise CiphertextFormatError(f"duplicate upload for node {node} chunk {chunk}")
        if not validated:
            deserialize(self.ctx, blob, level="fresh")  # raises a typed error; nothing stored
        self._file.seek(0, os.SEEK_END)
        offset = self._file.tell()
        self._file.write(blob)
        self._index[key] = (offset, len(blob))
        self.bytes_stored += len(blob)

    def blobs(self, node: int) -> list[bytes]:
        out = []
        for ch in range(self.layout.chunks):
            offset, size = self._index[(int(node), ch)]
            self._file.seek(offset)
            out.append(self._file.read(size))
        return out

    def get(self, node: int) -> list[ts.CKKSVector]:
        node = int(node)
        if node in self._cache:
            self._cache.move_to_end(node)
            return self._cache[node]
        if node not in self:
            raise KeyError(f"no upload for node {node}")
        # validated by ``put`` (here or, for readers, in the writing process) before it was stored
        vecs = [load_validated(self.ctx, b) for b in self.blobs(node)]
        self._cache[node] = vecs
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return vecs

    def snapshot(self) -> tuple[str, dict[tuple[int, int], tuple[int, int]]]:
        """``(path, index)`` for read-only readers in other processes (:class:`ParallelEncoder`)."""
        self._file.flush()
        return str(self.path), dict(self._index)

    @classmethod
    def reader(
        cls,
        ctx: CkksContext,
        layout: SlotLayout,
        path: str,
        index: dict[tuple[int, int], tuple[int, int]],
        cache_size: int = 512,
    ) -> CiphertextSpool:
        """A read-only view of a spool written by another process (no validation is repeated)."""
        spool = cls.__new__(cls)
        spool.ctx, spool.layout, spool._tmp = ctx, layout, None
        spool.path = Path(path)
        spool._file = open(path, "rb")  # noqa: SIM115 - lives as long as the reader
        spool._index, spool._cache, spool.cache_size = index, OrderedDict(), cache_size
        spool.bytes_stored = sum(size for _, size in index.values())
        return spool

    def close(self) -> None:
        self._file.close()
        self._cache.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
