r"""Verifiable encodings: secret tag columns that let a recipient check every decrypted result.

The server's work is linear. For recipient :math:`a`, node :math:`i` and each *foreign owner*
:math:`b` of some of :math:`i`'s neighbours, the server computes the *partial* :math:`F_b = C_b H_b`
(:math:`C_b` the public coefficient rows over :math:`i`'s neighbours owned by :math:`b`, :math:`H_b`
their feature rows); the recipient adds the partials and its own share. Owner :math:`b` appends
``T`` *tag columns* to every row it releases to :math:`a`:

.. math::  \tau_t(u) = \mathrm{PRF}_{k_{ab}}(u)_t + \langle r_{ab}^{(t)}, h_u \rangle, \qquad t = 1..T

where the PRF key :math:`k_{ab}` and the *check vectors* :math:`r_{ab}` are secrets recipient
:math:`a` chose for owner :math:`b` alone; they reach :math:`b` sealed (HPKE) and signed by
:math:`a`, so the server never learns them. For an honest partial the tag columns are
:math:`C_b \tau = C_b\,\mathrm{PRF}_{k_{ab}} + \langle r_{ab}, F_b \rangle`, which the recipient
predicts from the public coefficients, :math:`b`'s keys and the decrypted features :math:`F_b`
(:func:`check_share`).

What it catches:

* **other coefficients, other rows or a substituted ciphertext** (e.g. an owner's raw row sent as
  an encoding): the PRF part of the tags is unknown to the server, so any combination other than
  the announced one misses the prediction by a uniform-looking amount; it passes with probability
  about ``(2 tol)^T`` per row (``T = 2``, ``tol ~ 1e-4``: ~1e-8);
* **slot-wise recombination** (feature slots of one combination, tag slots of another, which
  plaintext masks could produce): the :math:`\langle r_{ab}, F_b\rangle` part ties the tag slots to
  the feature slots, and with no rotation keys the server cannot move values between slots;
* **a server colluding with an owner** :math:`c`: :math:`c` knows :math:`k_{ac}` and
  :math:`r_{ac}` only, which check nothing but the partial of :math:`c`'s own rows. Keys shared
  across owners (one :math:`r_a` for all, as before protocol version 3) let the pair add any
  :math:`\Delta` to another owner's result with the tag :math:`\langle r_a, \Delta\rangle`.

Pads (frame version 12, Gaussian since 13; known break 22 in ``SECURITY.md``). Checking decrypted
values makes the verdict a function of them, and the server chooses the combination: adding ``lam``
times one column of a foreign upload to a checked slot, it had the recipient refuse iff that feature
was non-zero (when it is zero the tampered result *equals* the honest one). So every row is released
padded, :math:`u = h + \rho` with :math:`\rho \sim N(0, \sigma^2 I)` from a PRF under
:math:`k_{ab}` (:func:`prf_pads`, :func:`release_rows`), and its tags are those of :math:`u`. The
tag check reads padded values only, and it alone decides; the recipient then subtracts the pads'
part :math:`C_b \rho` (:func:`pad_offsets`) and clips what it keeps to the range (a refusal there
would read the unpadded share). The tag check's inputs, the decrypted padded values, the tags' PRF
and the check vectors, are independent of the pads given :math:`u` (the pads' keystream has its own
domain), so every verdict is post-processing of the Gaussian mechanism :math:`h \mapsto h + \rho`:
whatever the server adds, a session's verdicts are :math:`(\varepsilon, \delta)`-DP for each
released row (sensitivity 2 between unit rows, composed over the row's recipients;
:mod:`fedgat.verdict_dp`). A statistic summed over many of an
owner's rows is not protected beyond DP's group privacy (a sixteenth review pass). ``sigma`` is
public, from the session's preset and variant (:meth:`fedgat.crypto.params.CkksPreset.pad_bound`):
the pads must fit a result slot's range and keep the CKKS error within its target.

A failing result raises :class:`ResultCheckError` naming the node and the owner whose rows it
should have combined. Range: with unit-norm rows :math:`\|F_k\|_2 \le \sum_u |C_{ku}|`
(:func:`check_share` refuses more in an unpadded share and clips it in a padded one, and refuses
anything not finite). A recipient checks every partial of a
results message at once (:func:`check_shares`: the same rule without a per-partial loop).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from scipy import sparse, special

__all__ = [
    "TAG_COLUMNS",
    "TAG_TOLERANCE",
    "CheckKeys",
    "ResultCheckError",
    "check_share",
    "check_shares",
    "pad_offsets",
    "prf_pads",
    "prf_tags",
    "release_rows",
    "tag_columns",
]

#: tag columns appended to every released row
TAG_COLUMNS = 2
#: a tag may miss its prediction by ``TAG_TOLERANCE * (1 + sum |C|)`` (CKKS noise is ~1e-6 at n4096)
TAG_TOLERANCE = 1e-4
#: uint64 words per 64-byte ChaCha20 block
_WORDS_PER_BLOCK = 8
#: keystream blocks between two needed ones that :func:`_stream_rows` draws rather than start a new run
_MAX_GAP = 64
#: ChaCha20 blocks per page: its 32-bit counter; the page number goes into the nonce
_PAGE_BLOCKS = 1 << 32


class ResultCheckError(ValueError):
    """A decrypted encoding is not the announced linear map of the released rows (or out of range)."""

    def __init__(self, message: str, *, node: int, owners: tuple[int, ...]) -> None:
        super().__init__(message)
        self.node = node
        self.owners = owners


@dataclass(frozen=True)
class CheckKeys:
    """What recipient ``a`` gives owner ``b``: the PRF key ``prf`` and the seed of the check vectors
    ``r_ab`` (32 bytes each, both for this pair only). Fresh from the OS CSPRNG per session and pair
    (:meth:`generate`); 64 bytes on the wire (:meth:`to_bytes`)."""

    prf: bytes
    check_seed: bytes

    def __post_init__(self) -> None:
        if len(self.prf) != 32 or len(self.check_seed) != 32:
            raise ValueError("check keys are two 32-byte keys")

    @classmethod
    def generate(cls) -> CheckKeys:
        return cls(os.urandom(32), os.urandom(32))

    def to_bytes(self) -> bytes:
        return self.prf + self.check_seed

    @classmethod
    def from_bytes(cls, data: bytes) -> CheckKeys:
        if len(data) != 64:
            raise ValueError(f"check keys are 64 bytes, got {len(data)}")
        return cls(bytes(data[:32]), bytes(data[32:]))

    def vectors(self, dim: int) -> np.ndarray:
        """``(T, dim)`` check vectors, entries uniform on ``(-1, 1) / sqrt(dim)``."""
        return _uniform(
            hashlib.sha256(b"fedgat/check-vectors/v1" + self.check_seed).digest(), TAG_COLUMNS * dim
        ).reshape(TAG_COLUMNS, dim) / np.sqrt(dim)


def _uniform(key: bytes, count: int, block: int = 0) -> np.ndarray:
    """``count`` uniform draws on (-1, 1) from the ChaCha20 keystream of ``key`` from ``block`` on.

    ``block`` is a 64-bit block index: its low 32 bits are ChaCha20's counter, its high bits go into
    the nonce (a *page* of ``2**32`` blocks), so a draw never runs past its page (callers split)."""
    page, counter = divmod(int(block), _PAGE_BLOCKS)
    if counter + -(-count // _WORDS_PER_BLOCK) > _PAGE_BLOCKS:
        raise ValueError("a keystream draw may not cross a page")
    nonce = counter.to_bytes(4, "little") + page.to_bytes(8, "little") + bytes(4)
    enc = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    raw = np.frombuffer(enc.update(bytes(8 * count)), dtype=np.uint64)
    return ((raw >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-52 - 1.0


def _stream_rows(key: bytes, nodes: np.ndarray, width: int) -> np.ndarray:
    """``(len(nodes), width)`` uniform on (-1, 1): node ``u``'s values are the keystream words
    ``u * width .. u * width + width - 1`` of ``key``, so any two parties compute the same values
    for any node subset, without a per-node loop: the blocks the nodes need are drawn in runs
    (blocks at most :data:`_MAX_GAP` apart, split at page ends), so memory and time follow
    ``len(nodes) * width``, not the id range (ids come from the bases a server sends)."""
    nodes = np.asarray(nodes, dtype=np.int64)
    out = np.empty((len(nodes), width))
    if not len(nodes):
        return out
    # ids are u32 on the wire; beyond, u * width could wrap int64 and two nodes share values
    if not (0 <= int(nodes.min()) and int(nodes.max()) < 1 << 32 and 0 < width < 1 << 31):
        raise ValueError(
            f"node ids must be u32 and the width below 2**31 (ids {nodes.min()}..{nodes.max()}, width {width})"
        )
    order = np.argsort(nodes, kind="stable")
    first = nodes[order] * width  # sorted first words
    lo_block, hi_block = first // _WORDS_PER_BLOCK, (first + width - 1) // _WORDS_PER_BLOCK
    reach = np.maximum.accumulate(hi_block)
    # a new run where a node's first block is far past every block drawn so far, or on a new page
    cut = (lo_block[1:] > reach[:-1] + _MAX_GAP) | (
        lo_block[1:] // _PAGE_BLOCKS != reach[:-1] // _PAGE_BLOCKS
    )
    starts = np.concatenate([[0], np.flatnonzero(cut) + 1, [len(nodes)]])
    cols = np.arange(width)
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
        run_lo, run_hi = int(lo_block[a]), int(reach[b - 1]) + 1
        words = np.concatenate(
            [  # a run that reaches into the next page draws each page's part on its own
                _uniform(key, (min(end, run_hi) - at) * _WORDS_PER_BLOCK, block=at)
                for at, end in _page_parts(run_lo, run_hi)
            ]
        )
        out[order[a:b]] = words[first[a:b, None] - run_lo * _WORDS_PER_BLOCK + cols]
    return out


def _page_parts(lo: int, hi: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` blocks as (start, end) pieces within one page each."""
    parts = []
    while lo < hi:
        end = min(hi, (lo // _PAGE_BLOCKS + 1) * _PAGE_BLOCKS)
        parts.append((lo, end))
        lo = end
    return parts


def prf_tags(prf: bytes, session: int, nodes: np.ndarray) -> np.ndarray:
    """``(len(nodes), T)``: the PRF part of the tags of ``nodes`` under a pair's key, uniform on
    (-1, 1). A node's values sit at a fixed place of a ChaCha20 keystream keyed by the pair's key
    and the session (:func:`_stream_rows`)."""
    key = hashlib.sha256(b"fedgat/tag-prf/v1" + prf + int(session).to_bytes(8, "big")).digest()
    return _stream_rows(key, nodes, TAG_COLUMNS)


def prf_pads(prf: bytes, session: int, nodes: np.ndarray, dim: int, sigma: float) -> np.ndarray:
    """``(len(nodes), dim)``: the upload pads of ``nodes`` under a pair's key, Gaussian
    ``N(0, sigma^2)`` (zeros when ``sigma`` is 0): the inverse normal CDF of the pair's keystream
    (:func:`_stream_rows`, its own domain ``fedgat/upload-pad/v2``, fresh per session and pair).

    The keystream's uniforms lie on a grid of step ``2**-52``, so the pads are cut off at about
    8.3 ``sigma``: the verdicts' DP (:mod:`fedgat.verdict_dp`) holds up to the mass
    beyond, ``2 Phi(-8.3)`` ~ 1e-16 per value, far below any ``delta`` used."""
    if sigma == 0:
        return np.zeros((len(nodes), dim))
    key = hashlib.sha256(b"fedgat/upload-pad/v2" + prf + int(session).to_bytes(8, "big")).digest()
    x = _stream_rows(key, nodes, dim)
    # from the nearer tail, where ndtri is exact; the keystream's largest word rounds to 1.0 itself
    tail = 0.5 * (1.0 - np.minimum(np.abs(x), 1.0 - 2.0**-53))
    return sigma * np.copysign(-special.ndtri(tail), x)


def tag_columns(keys: CheckKeys, session: int, nodes: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``(k, T)``: the tag columns an owner appends to the rows ``rows`` (k, d) of ``nodes``."""
    return prf_tags(keys.prf, session, nodes) + rows @ keys.vectors(rows.shape[1]).T


def release_rows(
    keys: CheckKeys, session: int, nodes: np.ndarray, rows: np.ndarray, pad: float
) -> np.ndarray:
    """``(k, d + T)``: what an owner encrypts for a recipient, the rows ``rows`` (k, d) of ``nodes``
    plus their pads (:func:`prf_pads` under the pair's key, Gaussian of sd ``pad``), then the
    tag columns *of the padded rows*, so that the recipient's tag check reads padded values only."""
    padded = rows + prf_pads(keys.prf, session, nodes, rows.shape[1], pad)
    return np.hstack([padded, tag_columns(keys, session, nodes, padded)])


def check_share(
    decrypted: np.ndarray,
    coefficients: np.ndarray,
    source_prf: np.ndarray,
    vectors: np.ndarray,
    *,
    node: int,
    owners: tuple[int, ...],
    max_row_norm: float | None = 1.0,
    offsets: np.ndarray | None = None,
) -> np.ndarray:
    """Check one decrypted foreign share and return its feature columns, its pads removed.

    Args:
        decrypted: ``(R + 1, d + T)`` decrypted rows (features, then tag columns).
        coefficients: ``(R + 1, n_f)`` the public coefficients over the node's foreign sources.
        source_prf: ``(n_f, T)`` the PRF tags of those sources (each under its owner's pair key).
        vectors: ``(T, d)`` the recipient's check vectors.
        node, owners: named in the error.
        max_row_norm: the largest norm of a released row (1 for unit-norm rows; None: no range check,
            e.g. DP releases, whose noise is unbounded).
        offsets: ``(R + 1, d)`` the pads' part of the share (``C rho``, :func:`pad_offsets`; None: the
            rows were not padded). The tags are checked on the padded values, and they alone decide:
            the share without its pads, which is returned, is clipped to the range, never refused
            for it (a verdict on it would read unpadded foreign features, known break 22).

    Raises:
        ResultCheckError: not finite, the tags miss their prediction, or (unpadded) out of range.
    """
    d = vectors.shape[1]
    padded, tags = decrypted[:, :d], decrypted[:, d:]
    features = padded if offsets is None else padded - offsets
    if not np.all(np.isfinite(decrypted)):
        raise ResultCheckError(
            f"node {node}: the decrypted encodings are not finite", node=node, owners=owners
        )
    scale = 1.0 + np.abs(coefficients).sum(axis=1)
    expected = coefficients @ source_prf + padded @ vectors.T
    miss = np.abs(tags - expected) / scale[:, None]
    if np.any(miss > TAG_TOLERANCE):
        raise ResultCheckError(
            f"node {node}: the result is not the announced combination of the rows of parties "
            f"{list(owners)} (tag off by {miss.max():.3g})",
            node=node,
            owners=owners,
        )
    if max_row_norm is not None:
        limit = max_row_norm * scale * (1 + TAG_TOLERANCE)
        norms = np.linalg.norm(features, axis=1)
        if offsets is not None:
            return _clipped(features, norms, limit)
        if np.any(norms > limit):
            raise ResultCheckError(
                f"node {node}: an encoding row has norm {norms.max():.3g}, above what unit-norm rows allow",
                node=node,
                owners=owners,
            )
    return features


def _clipped(features: np.ndarray, norms: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """``features`` with every row longer than its ``limit`` scaled down to it.

    The range of a padded share is enforced this way, never by a refusal: the share without its
    pads is the data's, and a verdict on it would be a predicate of unpadded foreign features
    (known break 22). An honest share is within range (a margin of at least 1), so only a forgery
    that passed the tags by chance is clipped, and the tags alone decide the verdict."""
    over = norms > limit
    if not np.any(over):
        return features
    factor = np.where(over, limit / np.where(over, norms, 1.0), 1.0)
    return features * factor[..., None]


def check_shares(
    decrypted: np.ndarray,
    coefficients: np.ndarray,
    source_prf: np.ndarray,
    vectors: np.ndarray,
    *,
    nodes: np.ndarray,
    owners: np.ndarray,
    max_row_norm: float | None = 1.0,
    offsets: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`check_share` of ``P`` partials at once; their feature columns ``(P, R + 1, d)``.

    Each partial's sources are the columns where its coefficients are non-zero: a source another
    owner holds has coefficient 0 and PRF tag 0, so it adds nothing to the prediction or the range,
    and the verdict is :func:`check_share`'s on the partial's own columns (up to the last bit of the
    range bound and of the tag prediction, which the wider sums may round differently).

    Args:
        decrypted: ``(P, R + 1, d + T)`` decrypted rows of each partial.
        coefficients: ``(P, R + 1, n)`` each partial's coefficients, zero outside its sources.
        source_prf: ``(P, n, T)`` the PRF tags of the sources (each under its owner's pair key), zero
            outside them.
        vectors: ``(P, T, d)`` the check vectors of each partial's owner.
        nodes, owners: ``(P,)`` named in the error of a failing partial.
        max_row_norm: as :func:`check_share`.
        offsets: ``(P, R + 1, d)`` the pads' part of each partial (:func:`pad_offsets`), or None.

    Raises:
        ResultCheckError: of the first failing partial, exactly as :func:`check_share` raises it.
    """
    d = vectors.shape[2]
    padded, tags = decrypted[:, :, :d], decrypted[:, :, d:]
    features = padded if offsets is None else padded - offsets
    scale = 1.0 + np.abs(coefficients).sum(axis=2)  # (P, R + 1)
    ok = np.isfinite(decrypted).all(axis=(1, 2))
    if max_row_norm is not None:
        limit = max_row_norm * scale * (1 + TAG_TOLERANCE)
        norms = np.linalg.norm(features, axis=2)
        if offsets is None:
            ok &= (norms <= limit).all(axis=1)
        else:
            features = _clipped(features, norms, limit)  # padded: a range is never a verdict
    expected = coefficients @ source_prf + padded @ vectors.transpose(0, 2, 1)
    ok &= (np.abs(tags - expected) / scale[:, :, None] <= TAG_TOLERANCE).all(axis=(1, 2))
    # the single check raises, with its message; a partial it passes (a rounding difference at the
    # bound) is accepted, as check_share alone would accept it
    for k in np.flatnonzero(~ok):
        check_share(
            decrypted[k],
            coefficients[k],
            source_prf[k],
            vectors[k],
            node=int(nodes[k]),
            owners=(int(owners[k]),),
            max_row_norm=max_row_norm,
            offsets=None if offsets is None else offsets[k],
        )
    return features


def pad_offsets(
    coefficients: np.ndarray,
    sources: np.ndarray,
    theirs: np.ndarray,
    prf: bytes,
    session: int,
    dim: int,
    pad: float,
) -> np.ndarray:
    """``(P, R + 1, dim)``: the pads' part ``C rho`` of ``P`` partials of one owner, whose rows were
    padded under the pair key ``prf`` (:func:`release_rows`).

    Args:
        coefficients: ``(P, R + 1, n)`` the partials' coefficients.
        sources: ``(P, n)`` node ids of the coefficients' columns.
        theirs: ``(P, n)`` the columns this owner's rows fill (the others add nothing).

    Each source's pad is drawn once however many partials read it, and the sum is one sparse
    product (``P (R + 1) x U`` by ``U x dim``, ``U`` the distinct sources), not a dense ``(P, n, dim)``.
    """
    P, R1, _ = coefficients.shape
    out = np.zeros((P, R1, dim))
    if pad == 0 or not theirs.any():
        return out
    at, col = np.nonzero(theirs)
    unique, which = np.unique(sources[at, col], return_inverse=True)
    pads = prf_pads(prf, session, unique, dim, pad)
    weights = coefficients[at, :, col]  # (nnz, R + 1)
    rows = (at[:, None] * R1 + np.arange(R1)).ravel()
    mix = sparse.csr_matrix((weights.ravel(), (rows, np.repeat(which, R1))), shape=(P * R1, len(unique)))
    return np.asarray(mix @ pads).reshape(P, R1, dim)
