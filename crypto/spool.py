"""The server's upload spool: validated uploads on disk, read back through an LRU cache.

Kept free of torch (and of :mod:`fedgat.encodings`): the process-pool workers of
:mod:`fedgat.crypto.encoders` open it read-only (:meth:`CiphertextSpool.reader`).
"""

from __future__ import annotations

import os
import secrets
import stat
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import BinaryIO

import tenseal as ts

from .context import CkksContext
from .errors import CiphertextFormatError, CryptoError
from .packing import SlotLayout, check_envelope, load_validated

__all__ = ["CiphertextSpool", "InsecureSpoolError"]

#: ``O_NOFOLLOW`` where the platform has it (POSIX); 0 elsewhere
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class InsecureSpoolError(CryptoError, PermissionError):
    """A spool directory or file is not private to this user (group/world access, or a symlink)."""


def _private_directory(folder: Path) -> bool:
    """Make sure ``folder`` is a private (0700-or-stricter) real directory; create it (mode 0700)
    if it does not exist. Returns whether it was created here. Refuses a symlink, a non-directory
    and a directory that gives any access to group or others with :class:`InsecureSpoolError`."""
    try:
        os.mkdir(folder, 0o700)
        created = True
    except FileExistsError:
        created = False
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode):
        raise InsecureSpoolError(f"spool directory {str(folder)!r} is a symlink; give a real directory")
    if not stat.S_ISDIR(info.st_mode):
        raise InsecureSpoolError(f"spool directory {str(folder)!r} is not a directory")
    if created:
        os.chmod(folder, 0o700)  # mkdir's mode is filtered by the umask; make it exact
    elif stat.S_IMODE(info.st_mode) & 0o077:
        raise InsecureSpoolError(
            f"spool directory {str(folder)!r} has mode {stat.S_IMODE(info.st_mode):04o}: group or others "
            "can access it; use a private directory (chmod 700) so no one else can read or change the uploads"
        )
    elif hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise InsecureSpoolError(f"spool directory {str(folder)!r} is owned by another user")
    return created


class CiphertextSpool:
    """Server-side, append-only on-disk store of uploaded feature ciphertexts.

    Storage: the directory is private (mode 0700; a caller-given ``directory`` that exists must be
    a real directory, not a symlink, with no group/world access, else :class:`InsecureSpoolError`;
    a missing one is created 0700); the spool file has a fresh random name and is created with
    ``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600, so a pre-planted file or symlink is never used.
    :meth:`close` deletes the file (and the directory, if the spool created it).

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
        if self._tmp is None:
            folder.parent.mkdir(parents=True, exist_ok=True)
        #: the directory to remove on close (caller-given and created here); None otherwise
        self._own_dir: Path | None = folder if _private_directory(folder) and self._tmp is None else None
        self.path = folder / f"uploads-{secrets.token_hex(8)}.bin"
        fd = os.open(
            self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_BINARY", 0), 0o600
        )
        self._owns_file = True
        self._file: BinaryIO | None = os.fdopen(fd, "w+b")
        self._index: dict[tuple[int, int], tuple[int, int]] = {}
        self._cache: OrderedDict[int, list[ts.CKKSVector]] = OrderedDict()
        self.cache_size = cache_size
        self.bytes_stored = 0

    def __contains__(self, node: int) -> bool:
        return all((int(node), ch) in self._index for ch in range(self.layout.chunks))

    def put(self, node: int, chunk: int, blob: bytes, *, validated: bool = False) -> None:
        """Store one upload. ``validated=True``: the caller has already run
        ``check_envelope(ctx, blob, level="fresh")`` (or ``deserialize``) on exactly these bytes (the server checks a whole
        message before storing any of it), so the check is not repeated."""
        key = (int(node), int(chunk))
        if not 0 <= key[1] < self.layout.chunks:
            raise CiphertextFormatError(f"chunk {chunk} out of range for {self.layout.chunks} chunks")
        if key in self._index:
            raise CiphertextFormatError(f"duplicate upload for node {node} chunk {chunk}")
        if not validated:
            check_envelope(self.ctx, blob, level="fresh")  # raises a typed error; nothing stored
        assert self._file is not None  # a writing spool's file is open until close()
        self._file.seek(0, os.SEEK_END)
        offset = self._file.tell()
        self._file.write(blob)
        self._index[key] = (offset, len(blob))
        self.bytes_stored += len(blob)

    def blobs(self, node: int) -> list[bytes]:
        f = self._file if self._file is not None else self._reopen()
        out = []
        for ch in range(self.layout.chunks):
            offset, size = self._index[(int(node), ch)]
            f.seek(offset)
            out.append(f.read(size))
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
        """``(path, index)`` for read-only readers in other processes
        (:class:`~fedgat.crypto.encoders.ProcessPoolEncoder`)."""
        if self._file is not None:
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
        spool.ctx, spool.layout, spool._tmp, spool._own_dir, spool._owns_file = ctx, layout, None, None, False
        spool.path = Path(path)
        spool._file = None
        spool._reopen()
        spool._index, spool._cache, spool.cache_size = index, OrderedDict(), cache_size
        spool.bytes_stored = sum(size for _, size in index.values())
        return spool

    def _reopen(self) -> BinaryIO:
        """A reader's handle on the spool file, opened again after :meth:`detach`."""
        if self._owns_file:
            raise RuntimeError("a writing spool keeps its file open")
        # never through a symlink
        fd = os.open(self.path, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_BINARY", 0))
        self._file = os.fdopen(fd, "rb")
        return self._file

    def detach(self) -> None:
        """A reader lets go of the spool file until its next read (its loaded ciphertexts stay
        cached): a worker that may not read this spool again must not keep a deleted spool's disk
        space allocated (:func:`fedgat.crypto.tasks.worker_batch_for`)."""
        if self._owns_file:
            raise RuntimeError("a writing spool keeps its file open")
        if self._file is not None:
            self._file.close()
            self._file = None

    def drop_cache(self) -> None:
        """Forget the loaded ciphertexts kept for reuse (benchmarks start each pass cold with it)."""
        self._cache.clear()

    def close(self) -> None:
        """Close the file; a writing spool also deletes it (and the directory it created).
        Idempotent. Readers only close their handle."""
        if self._file is not None:
            self._file.close()
        self._cache.clear()
        if self._owns_file:
            self._owns_file = False
            self.path.unlink(missing_ok=True)
        if self._own_dir is not None:
            try:
                self._own_dir.rmdir()
            except OSError:
                pass  # not empty: someone else put files there; leave them
            self._own_dir = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
