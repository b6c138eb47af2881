r"""Checks on what a pre-training party receives or is given, before it changes any state: a client's
own feature rows (:func:`validate_features`), a graph announcement against the server's limits
(:func:`check_graph_limits`), an upload batch (:func:`check_upload_items`); and the translation of
:mod:`fedgat.crypto` errors about received bytes into protocol errors (:func:`crypto_error`)."""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence

import numpy as np

from fedgat.crypto import CiphertextFormatError, KeyMismatchError, ServerContext
from fedgat.crypto.packing import check_envelope
from fedgat.randomness import RandomSource

from .errors import KeyFingerprintError, PayloadError, SizeLimitError
from .messages import EncodingBases, GraphAnnounce, UploadItem
from .pretrain_config import PretrainConfig, PretrainLimits, bases_bytes

__all__ = [
    "BASIS_PROBES",
    "BASIS_TOLERANCE",
    "MAX_BASIS_ABS",
    "NORM_TOLERANCE",
    "check_bases",
    "check_bucket_nodes",
    "check_graph_limits",
    "check_upload_items",
    "crypto_error",
    "validate_features",
]

#: largest |coefficient| a client accepts in the bases (keeps results inside the CKKS headroom)
MAX_BASIS_ABS = 16.0
#: random probes of a client's check of the bases' identity (:func:`check_bases`), and how far off
#: it may be (float64 bases drawn by QR are off by ~1e-15 per entry)
BASIS_PROBES = 4
BASIS_TOLERANCE = 1e-9
#: unit-norm tolerance of feature rows (all-zero rows, e.g. CiteSeer's isolated nodes, are allowed)
NORM_TOLERANCE = 1e-4


def check_graph_limits(
    msg: GraphAnnounce, limits: PretrainLimits, config: PretrainConfig, nodes_so_far: int, bases_so_far: int
) -> int:
    """Refuse a graph announcement above ``limits`` before anything is sized by it (the session
    holds ``nodes_so_far`` nodes and ``bases_so_far`` bytes of bases already); returns the bytes of
    the bases its nodes will need.

    Raises:
        SizeLimitError: dimension, node count, neighbourhood size or bases memory above its limit.
    """
    if msg.dim > limits.max_dim:
        raise SizeLimitError(
            f"party {msg.sender} announces dimension {msg.dim}; the limit is {limits.max_dim}"
        )
    if nodes_so_far + len(msg.owned) > limits.max_nodes:
        raise SizeLimitError(
            f"party {msg.sender}'s {len(msg.owned)} nodes take the session above {limits.max_nodes} nodes"
        )
    sizes = np.diff(msg.indptr)
    if sizes.max() > limits.max_neighbours:
        raise SizeLimitError(
            f"party {msg.sender} announces a neighbourhood of {int(sizes.max())} nodes; "
            f"the limit is {limits.max_neighbours}"
        )
    need = bases_bytes(config.variant, sizes, config.embed_factor)
    if bases_so_far + need > limits.max_bases_bytes:
        raise SizeLimitError(
            f"the bases of party {msg.sender}'s nodes take the server's memory to "
            f"{bases_so_far + need} bytes; the limit is {limits.max_bases_bytes}"
        )
    return need


def validate_features(
    features: np.ndarray, rows: int, dim: int | None = None, tol: float = NORM_TOLERANCE
) -> np.ndarray:
    """Check a client's feature rows before they are encrypted: shape ``(rows, dim)``, finite, each
    row of unit L2 norm within ``tol`` (or exactly zero). Returns them as float64.

    Raises:
        PayloadError: any violation.
    """
    arr = np.asarray(features, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] != rows or (dim is not None and arr.shape[1] != dim):
        want = f"({rows}, {dim if dim is not None else 'd'})"
        raise PayloadError(f"features have shape {arr.shape}, expected {want}")
    if arr.shape[1] < 1:
        raise PayloadError("features need at least one dimension")
    if not np.all(np.isfinite(arr)):
        raise PayloadError("features hold NaN or infinite values")
    norms = np.linalg.norm(arr, axis=1)
    bad = np.flatnonzero((np.abs(norms - 1.0) > tol) & (norms != 0))
    if len(bad):
        raise PayloadError(
            f"{len(bad)} feature rows are not unit-norm (e.g. row {bad[0]}: {norms[bad[0]]:.6f})"
        )
    return arr


def crypto_error(exc: Exception, what: str) -> Exception:
    """Translate a :mod:`fedgat.crypto` error about received bytes into a protocol error."""
    if isinstance(exc, KeyMismatchError):
        return KeyFingerprintError(f"{what}: {exc}")
    return PayloadError(f"{what}: {exc}")


def check_upload_items(
    items: Sequence[UploadItem],
    sender: int,
    target: int,
    allowed: np.ndarray,
    chunks: int,
    received: set[tuple[int, int]],
    context: ServerContext,
) -> set[tuple[int, int]]:
    """Check every item of ``sender``'s upload batch for ``target`` (nodes in ``allowed``, the rows
    the round needs from ``sender`` for ``target``; chunk range; no duplicate of ``received`` or
    within the batch; fresh ciphertexts under ``target``'s ``context``); returns their keys.

    Raises:
        PayloadError, KeyFingerprintError: the first bad item.
    """
    keys: set[tuple[int, int]] = set()
    nodes = np.fromiter((item.node for item in items), dtype=np.int64, count=len(items))
    bad = ~np.isin(nodes, allowed)
    if bad.any():
        raise PayloadError(
            f"party {sender} uploads node {int(nodes[bad][0])} for party {target}, which the round does not "
            "need from it (not its node, or no confirmed edge implies the need)"
        )
    for item in items:
        key = (item.node, item.chunk)
        if item.chunk >= chunks:
            raise PayloadError(f"chunk {item.chunk} out of range ({chunks} chunks)")
        if key in received or key in keys:
            raise PayloadError(f"duplicate upload of node {item.node} chunk {item.chunk} for party {target}")
        keys.add(key)
    for item in items:  # every ciphertext is checked before any is stored
        try:
            # the frame's decoding checked the digest (fedgat.protocols.codec.Digested)
            check_envelope(context, item.ciphertext, level="fresh", digest_checked=True)
        except (CiphertextFormatError, KeyMismatchError) as exc:
            raise crypto_error(
                exc, f"upload of node {item.node} chunk {item.chunk} for party {target}"
            ) from exc
    return keys


def check_bases(
    msg: EncodingBases, config: PretrainConfig, limits: PretrainLimits, row_bytes: int, held_bytes: int
) -> int:
    """A client's checks of a bucket of bases before it allocates anything for it: the session's
    variant, ``m(n)`` columns, the neighbourhood and memory limits (``row_bytes`` per decrypted row,
    ``held_bytes`` already held), and entries small enough for the CKKS headroom. Returns the bytes
    the bucket's decrypted encodings will take.

    Raises:
        PayloadError, SizeLimitError: the first violation.
    """
    if msg.variant != config.variant:
        raise PayloadError(f"bases of the {msg.variant} variant; the session uses {config.variant}")
    m = config.kind.m(msg.n, config.embed_factor)
    if msg.p.shape[1] != m:
        raise PayloadError(f"basis dimension {msg.p.shape[1]} is not m = {m} for n = {msg.n}")
    if msg.n > limits.max_neighbours:
        raise SizeLimitError(
            f"bases for neighbourhoods of {msg.n} nodes; the limit is {limits.max_neighbours}"
        )
    rows = config.kind.held_rows(msg.n, config.embed_factor)  # M2 is derived by the client, but held
    need = len(msg.nodes) * rows * row_bytes
    if held_bytes + need > limits.max_encoding_bytes:
        raise SizeLimitError(
            f"bucket {msg.bucket} would take the decrypted encodings to "
            f"{held_bytes + need} bytes; the limit is {limits.max_encoding_bytes}"
        )
    # NaN fails "<=" too (the codec refuses it first, but not every caller decodes)
    for basis in (msg.p, msg.q):
        if basis is not None and not np.all(np.abs(basis) <= MAX_BASIS_ABS):
            raise PayloadError(
                f"basis entries above {MAX_BASIS_ABS} (or not finite) would overflow the CKKS headroom"
            )
    check_basis_identity(config, msg.p, msg.q)
    return need


def check_basis_identity(config: PretrainConfig, p: np.ndarray, q: np.ndarray | None) -> None:
    r"""The bases satisfy the identity the layer reads the neighbours' rows back with
    (:meth:`fedgat.variants.Variant.left_inverse`: :math:`Q_i^\top Q_i = I`, or
    :math:`q_k^\top p_j = 2\delta_{jk}`), checked on :data:`BASIS_PROBES` random vectors from the
    OS CSPRNG (Freivalds: ``O(B m n)`` instead of the Gram matrices' ``O(B m n^2)``; a server that
    does not know the probes passes with bases off the identity only with probability 0).

    Without it a server chose the bases freely and every result, the announced map of *those* bases,
    passed the tag check: a sixth review pass dropped, merged, scaled or isolated neighbours' rows
    in the layer's inputs (own nodes' too) of every client, unseen (the audit's ``chosen_bases``).

    The matrix variant's pairs are also bounded (:meth:`fedgat.variants.Variant.max_pair_norm`):
    biorthogonal but ill-conditioned bases pass the identity and only amplify the CKKS noise of the
    rows read back (a seventh review pass: 6.4e-6 instead of 3.7e-8, the layer's output unchanged).
    And every coefficient row is bounded
    (:meth:`~fedgat.variants.Variant.max_coefficient_row_norm`), which the upload pads are sized for.

    Raises:
        PayloadError: off by more than :data:`BASIS_TOLERANCE` for some node, ill-conditioned, or
            with a coefficient row longer than the variant draws.
    """
    left, c = config.kind.left_inverse(p, q)
    x = RandomSource().normal((p.shape[2], BASIS_PROBES))
    back = np.einsum("bmn,bmk->bnk", left, np.einsum("bmn,nk->bmk", p, x))
    off = np.abs(back - c * x).max(axis=(1, 2)) if len(p) else np.zeros(0)
    bad = ~(off <= BASIS_TOLERANCE * (1.0 + np.abs(x).max()))  # NaN is bad too
    if np.any(bad):
        raise PayloadError(
            f"the bases of {int(bad.sum())} nodes do not read their neighbours' rows back (the "
            f"{config.kind.name} variant's identity is off by up to {float(np.nanmax(off)):.2e})"
        )
    bound = config.kind.max_pair_norm()
    if bound is not None and q is not None and len(p):
        pair = np.linalg.norm(p, axis=1) * np.linalg.norm(q, axis=1)  # (B, n)
        worse = ~(pair <= bound * (1.0 + 1e-9))
        if np.any(worse):
            raise PayloadError(
                f"the bases of {int(worse.any(axis=1).sum())} nodes are ill-conditioned (|p_j| |q_j| up to "
                f"{float(np.nanmax(pair)):.3g}; the variant draws at most {bound:.3g})"
            )
    # the upload pads are sized for coefficient rows up to this norm (PretrainConfig.upload_pad):
    # longer rows would let a server wrap honest padded results around (a sixteenth review pass)
    row_bound = config.kind.max_coefficient_row_norm()
    if len(p):
        rows = np.linalg.norm(p, axis=2)  # (B, m): the coefficient rows over the neighbours
        long = ~(rows <= row_bound * (1.0 + 1e-9))
        if np.any(long):
            raise PayloadError(
                f"the bases of {int(long.any(axis=1).sum())} nodes have coefficient rows of norm up to "
                f"{float(np.nanmax(rows)):.3g}; the variant draws at most {row_bound:.3g}"
            )


def check_bucket_nodes(
    nodes: Sequence[int],
    n: int,
    position: Mapping[int, int],
    assigned: Container[int],
    degree: Mapping[int, int],
) -> None:
    """The nodes of a bucket of bases: distinct, each needed by this client (``position``), in no
    earlier bucket (``assigned``), and an owned node's neighbourhood size equal to ``n``.

    Raises:
        PayloadError: the first violation.
    """
    if len(set(nodes)) != len(nodes):
        raise PayloadError("duplicate node in a bucket")
    for node in nodes:
        if node not in position:
            raise PayloadError(f"node {node} is not one this client needs")
        if node in assigned:
            raise PayloadError(f"node {node} is already in another bucket")
        if node in degree and degree[node] != n:
            raise PayloadError(f"owned node {node} has {degree[node]} neighbours, not {n}")
