r"""FedGAT encodings: the fixed, pre-training summaries from which a node's first GAT layer is computed.

For a node :math:`i` with attention neighbourhood :math:`\mathcal{N}(i) = \{j_1, \dots, j_n\}`
(self-loop included, first) and features :math:`h_j \in \mathbb{R}^d` (unit L2 norm), one GAT head
needs, for the attention logit :math:`x_{ij} = b_1 \cdot h_i + b_2 \cdot h_j`
(:math:`b_1 = W^\top a_{dst}`, :math:`b_2 = W^\top a_{src}`) and a score polynomial
:math:`\hat s(x) = \sum_{k=0}^{p} c_k x^k`,

.. math::
    E_i^{(k)} = \sum_{j} x_{ij}^k\, h_j \in \mathbb{R}^d, \qquad F_i^{(k)} = \sum_j x_{ij}^k,
    \qquad h_i' = W \frac{\sum_k c_k E_i^{(k)}}{\sum_k c_k F_i^{(k)}}.

**Matrix variant** (paper eq. 9-14). Draw an orthonormal set :math:`\{u_{1j}, u_{2j}\}_{j\le n}` in
:math:`\mathbb{R}^{m}`, :math:`m = 2n`, and ratios :math:`r_j > 0`. With
:math:`p_j = u_{1j} + u_{2j}/r_j`, :math:`q_j = u_{1j} + r_j u_{2j}` (so :math:`q_k^\top p_j = 2\delta_{jk}`),

.. math::
    U_j = \tfrac12 (u_{1j}u_{1j}^\top + u_{2j}u_{2j}^\top + r_j u_{1j}u_{2j}^\top + r_j^{-1} u_{2j}u_{1j}^\top)
        = \tfrac12 p_j q_j^\top ,

rank-1 oblique projectors with :math:`U_jU_k = \delta_{jk}U_j`, :math:`\operatorname{tr} U_j = 1`. The
encodings are :math:`P_i = \sum_j U_j`, :math:`M_1(s) = h_i(s) P_i`, :math:`M_2(s) = \sum_j h_j(s) U_j`,
:math:`K_1 = \tfrac12\sum_j q_j`, :math:`K_2 = \sum_j p_j h_j^\top`, :math:`K_3 = \sum_j p_j`. Then
:math:`D_i = \sum_s b_1(s) M_1(s) + b_2(s) M_2(s) = \sum_j x_{ij} U_j`, so :math:`D_i^k = \sum_j x_{ij}^k U_j`
for :math:`k \ge 1`, and

.. math::
    K_1^\top D_i^k K_2 = (E_i^{(k)})^\top, \qquad K_1^\top D_i^k K_3 = F_i^{(k)} .

The constant term needs care: :math:`D^0 = I` is *not* :math:`\sum_j U_j` (see ``NOTES.md``), so the
polynomial uses :math:`P_i` as :math:`D_i^0`; with our normalisation of :math:`K_1` both happen to agree
on :math:`K_1^\top(\cdot)K_2`, but the layer never relies on that. :math:`M_1(s) = h_i(s) P_i` is rank-one
in the feature index, so we store the factors :math:`(h_i, P_i)` instead of :math:`d` matrices.

**Vector variant** (compact). Draw :math:`Q_i \in \mathbb{R}^{m \times n}` with orthonormal columns
:math:`u_j` (:math:`m = n` by default; ``embed_factor=2`` gives the paper's :math:`m = 2n`, at twice
the size and cost and with no added protection, since :math:`Q_i` is shipped) and encode :math:`V_i = \sum_j u_j h_j^\top = Q_i H_i`, where
:math:`H_i` stacks the neighbours' features. Then :math:`Q_i^\top V_i b_2 + (b_1\cdot h_i)\mathbf 1` is the
vector of logits, and :math:`\sum_j \hat s(x_{ij}) h_j = V_i^\top Q_i \hat s(x_i)`. The paper ships the
tensor :math:`T_i = \sum_j u_j^{\otimes 3}` from which :math:`Q_i` is readable (NOTES: "basis readable
from the T tensor"); we ship :math:`Q_i` itself, which carries the same information at
:math:`mn` instead of :math:`m^3` reals. Neither form hides the neighbours from the receiving client:
see ``SECURITY.md`` and the privacy audit.

Every feature-dependent encoding is a per-node *linear map of the neighbours' features*: stacked
as rows, :math:`F_i = A_i H_i` with a coefficient matrix :math:`A_i` (``R x n``) that depends only on the
random bases. That is what the encrypted server evaluates with plaintext-ciphertext multiply-adds.
Nodes are processed in buckets of equal neighbourhood size so everything is batched tensor algebra.

The per-variant maths (``m``, row counts, sizes, drawing the bases, the feature-free parts) lives in
:mod:`fedgat.variants` (:func:`~fedgat.variants.as_variant` and :data:`~fedgat.variants.VARIANTS` are
re-exported here); the dataclasses below carry the variant's name and expose the variant as ``kind``.
The layer's zero-padded bucket groups are built by :mod:`fedgat.padding`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from fedgat.graph import CSR
from fedgat.padding import PaddedGroup, padded_groups, plan_padded_groups  # noqa: F401 (re-export)
from fedgat.randomness import RandomSource, as_random_source
from fedgat.variants import RATIO_RANGE, VARIANTS, Variant, VariantLike, as_variant  # noqa: F401 (re-export)


@dataclass
class BucketBases:
    """The random bases of ``B`` nodes that share the neighbourhood size ``n``.

    Attributes:
        variant: the variant's name, "matrix" or "vector" (a :class:`~fedgat.variants.Variant` is
            accepted and stored by name); :attr:`kind` is the variant itself.
        rows: ``(B,)`` positions of these nodes in the encoded node list.
        nodes: ``(B,)`` global node ids.
        neighbours: ``(B, n)`` global ids of each node's neighbourhood (self first).
        p, q: matrix variant, ``(B, m, n)``: columns :math:`p_j`, :math:`q_j`; ``q`` is None for vectors.
            For the vector variant ``p`` holds the orthonormal basis :math:`Q_i` and ``q`` is None.
    """

    variant: str
    rows: np.ndarray
    nodes: np.ndarray
    neighbours: np.ndarray
    p: np.ndarray
    q: np.ndarray | None

    def __post_init__(self) -> None:
        self.variant = as_variant(self.variant).name

    @property
    def kind(self) -> Variant:
        """The :class:`~fedgat.variants.Variant` of these bases."""
        return as_variant(self.variant)

    @property
    def n(self) -> int:
        return int(self.neighbours.shape[1])

    @property
    def m(self) -> int:
        return int(self.p.shape[1])

    def __repr__(self) -> str:
        return f"BucketBases({self.variant!r}, {len(self)} nodes, n={self.n}, m={self.m})"

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def coefficients(self, slot: int | np.ndarray | None = None) -> np.ndarray:
        """``(B, R, n)`` coefficient matrices :math:`A_i` of the *computed* feature-dependent encodings
        (``(R, n)`` for the single node ``slot``, ``(len(slot), R, n)`` for an array of positions):
        what the (encrypted) server evaluates.

        Row layout: row 0 is :math:`h_i` itself (the :math:`M_1` factor; self is neighbour 0), rows
        ``1..m`` are :math:`K_2` (matrix) or :math:`V` (vector). The matrix variant's :math:`M_2` is
        not computed: it is the feature-free map :meth:`m2_map` applied to :math:`K_2`.
        """
        if slot is None:
            p = self.p
        elif isinstance(slot, np.ndarray):
            p = self.p[slot]
        else:
            p = self.p[slot : slot + 1]
        B, _, n = p.shape
        self_row = np.zeros((B, 1, n))
        self_row[:, 0, 0] = 1.0
        out = np.concatenate([self_row, p], axis=1)
        return out if slot is None or isinstance(slot, np.ndarray) else out[0]

    def m2_map(self) -> np.ndarray:
        r"""``(B, m*m, m)``: :math:`L_i` with :math:`M_2 = L_i K_2` (matrix variant; paper eq. 9-14,
        see :meth:`fedgat.variants.MatrixVariant.m2_map`): :math:`M_2` is a feature-free map of
        :math:`K_2`, so the protocol ships :math:`K_2` alone (paper: :math:`M_2` too; SECURITY.md)."""
        return self.kind.m2_map(self.p, self.q)

    def num_feature_rows(self) -> int:
        """Computed rows per node, :math:`h_i` included (``1 + m`` for both variants)."""
        return 1 + self.m

    def take(
        self, idx: np.ndarray, *, rows: np.ndarray | None = None, neighbours: np.ndarray | None = None
    ) -> BucketBases:
        """The bases of the slots ``idx`` (``q`` too where the variant has it), with ``rows`` or
        ``neighbours`` replaced when given."""
        return BucketBases(
            self.variant,
            self.rows[idx] if rows is None else rows,
            self.nodes[idx],
            self.neighbours[idx] if neighbours is None else neighbours,
            self.p[idx],
            None if self.q is None else self.q[idx],
        )


def draw_bases(
    variant: VariantLike,
    neighbourhoods: CSR,
    nodes: np.ndarray,
    rng: RandomSource | int | None = None,
    embed_factor: int = 1,
    ratio_range: tuple[float, float] = RATIO_RANGE,
) -> list[BucketBases]:
    """Draw fresh random bases for ``nodes``, bucketed by neighbourhood size.

    Args:
        variant: a :class:`~fedgat.variants.Variant` or its name, "matrix" or "vector".
        neighbourhoods: the attention neighbourhoods (self-loop first) of every node.
        nodes: global ids to encode, in the order the encodings' rows will follow.
        rng: a :class:`RandomSource`, an int seed (reproducible, tests only) or None (CSPRNG).
        embed_factor: vector variant's ``m = embed_factor * n`` (matrix variant is fixed at ``2n``).
        ratio_range: the :math:`r_j` are log-uniform in this range (matrix variant).
    """
    kind = as_variant(variant)
    if embed_factor < 1:
        raise ValueError("embed_factor must be >= 1")
    rng = as_random_source(rng)
    nodes = np.asarray(nodes, dtype=np.int64)
    sizes = neighbourhoods.degrees()[nodes]
    if (sizes < 1).any():
        raise ValueError("every encoded node needs a non-empty neighbourhood (the self-loop at least)")
    buckets = []
    for n in np.unique(sizes):
        rows = np.flatnonzero(sizes == n)
        bucket_nodes = nodes[rows]
        starts = neighbourhoods.indptr[bucket_nodes]
        neighbours = neighbourhoods.indices[starts[:, None] + np.arange(n)[None, :]]
        p, q = kind.draw(rng, len(rows), int(n), embed_factor, ratio_range)
        buckets.append(BucketBases(kind.name, rows, bucket_nodes, neighbours, p, q))
    return buckets


@dataclass
class RowFactors:
    r"""A bucket's feature-dependent encodings written in one orthonormal basis of their row space.

    Every feature-dependent row is a combination of the ``n`` neighbours' features
    (:math:`F_i = A_i H_i`), so with :math:`R_i` (``r x d``, orthonormal rows, ``r = min(n, d)``)
    spanning the row space of :math:`K_2 = \sum_j p_j h_j^\top` (which is that of :math:`H_i`, the
    :math:`p_j` being independent): :math:`K_2 = \tilde K_2 R_i`, :math:`M_2 = \tilde M_2 R_i`,
    :math:`h_i = \tilde h_i R_i`. The layer then contracts ``W`` with the ``r = n`` rows of
    :math:`R_i` instead of the ``m = 2n`` rows of :math:`K_2`, and ``b_2`` with the
    ``(m^2, n)`` matrix :math:`\tilde M_2` instead of the ``(m^2, d)`` :math:`M_2`.

    :math:`R_i` is *a* basis of the span of the neighbours' features, obtained from :math:`K_2` by an
    SVD; it is not the features themselves and shows the client nothing :math:`K_2` did not.
    Note what the factorisation says about the protocol: :math:`\tilde M_2 = A^{M_2}_i (A^{K_2}_i)^+`
    depends on the random bases only, so :math:`M_2` carries no feature information beyond
    :math:`K_2` (see SECURITY.md).

    Attributes:
        R: ``(B, r, d)``; K2: ``(B, m, r)``; M2: ``(B, m*m, r)``; h_self: ``(B, r)``.
        residual: the largest absolute entry of ``F - F~ R`` over ``K2``, ``M2`` and ``h_self``.
    """

    R: torch.Tensor
    K2: torch.Tensor
    M2: torch.Tensor
    h_self: torch.Tensor
    residual: float

    def to(self, device: torch.device | str) -> RowFactors:
        """A copy with every tensor on ``device`` (``self`` when they are all there already)."""
        device = torch.device(device)
        if all(_on(t, device) for t in (self.R, self.K2, self.M2, self.h_self)):
            return self
        return RowFactors(
            self.R.to(device), self.K2.to(device), self.M2.to(device), self.h_self.to(device), self.residual
        )


@dataclass
class EncodingBucket:
    """Encodings of the ``B`` nodes of one bucket, as the client holds them after decryption.

    The feature-dependent encodings :math:`F_i = A_i H_i` (row layout of
    :meth:`BucketBases.coefficients`) are kept as separate contiguous tensors so the layer's
    contractions run as plain batched matmuls.

    Attributes:
        bases: the bucket's :class:`BucketBases` (``rows``, ``nodes``, sizes; the feature-free parts
            :math:`P, K_1, K_3` or :math:`Q` are derived from it).
        h_self: ``(B, d)``: :math:`h_i` (the :math:`M_1` factor).
        K2: ``(B, m, d)``: :math:`K_2` (matrix) or :math:`V` (vector).
        M2: ``(B, m*m, d)``: :math:`M_2(s)` rows ``(x, y)`` row-major, feature index last; matrix only,
            and None when it is left to be derived from ``K2`` (:meth:`dense_M2`), as the protocol and
            :func:`encode` leave it.
        cols: ``(B, k)`` int64 or None. When set (see :meth:`compact`), ``M2`` holds only the
            feature columns ``cols[b]`` of node ``b`` (``(B, m*m, k)``); padding columns carry zeros.
        factors: matrix only, :class:`RowFactors` when set by :meth:`factorise`; the layer then
            uses them instead of ``K2``, ``M2`` and ``h_self``.
    """

    bases: BucketBases
    h_self: torch.Tensor
    K2: torch.Tensor
    M2: torch.Tensor | None = None
    cols: torch.Tensor | None = None
    factors: RowFactors | None = None

    def __repr__(self) -> str:
        held = "h_self, K2" + (", M2" if self.M2 is not None else "") + (", factors" if self.factors else "")
        return (
            f"EncodingBucket({len(self.bases)} nodes, n={self.bases.n}, m={self.bases.m}, d={self.h_self.shape[-1]}: "
            f"{held}, {self.h_self.dtype})"
        )

    @property
    def row_factors(self) -> RowFactors:
        """:attr:`factors`, which :meth:`factorise` must have set."""
        if self.factors is None:
            raise ValueError("the bucket is not factorised (see factorise)")
        return self.factors

    @classmethod
    def from_rows(cls, bases: BucketBases, features: torch.Tensor) -> EncodingBucket:
        """Split ``(B, 1 + m, d)`` computed rows in the :meth:`BucketBases.coefficients` layout; the
        matrix variant's ``M2`` is derived as :meth:`BucketBases.m2_map` times ``K2`` (in float64)."""
        m = bases.m
        if features.dim() != 3 or features.shape[:2] != (len(bases), bases.num_feature_rows()):
            raise ValueError(
                f"expected ({len(bases)}, {bases.num_feature_rows()}, d) rows, got {tuple(features.shape)}"
            )
        return cls(bases, features[:, 0].contiguous(), features[:, 1 : 1 + m].contiguous())

    def dense_M2(self) -> torch.Tensor:
        """``(B, m*m, d)``: :math:`M_2`, the stored tensor or, when ``M2`` is None (as built by
        :meth:`from_rows`), derived as :meth:`BucketBases.m2_map` times ``K2``; matrix only.

        Derived ``M2`` is ``m^2 x d`` per node (~9 GB float32 for all clients' nodes of Cora with the
        neighbour cap at 16), so the layer never builds it: :meth:`factorise` goes from ``K2``.
        """
        if not self.kind.has_m2:
            raise ValueError("M2 exists for the matrix variant only")
        if self.cols is not None:
            raise ValueError("M2 is column-compacted; dense_M2 needs uncompacted encodings")
        if self.M2 is not None:
            return self.M2
        return (self._from_host(self.bases.m2_map()) @ self.K2.double()).to(self.K2.dtype)

    @property
    def device(self) -> torch.device:
        """Where the bucket's tensors live (those of :attr:`K2`; :meth:`to` moves them all)."""
        return self.K2.device

    def _from_host(self, array: np.ndarray) -> torch.Tensor:
        """A numpy array of the bases as a tensor on :attr:`device`."""
        return torch.from_numpy(array).to(self.device)

    def to(self, device: torch.device | str) -> EncodingBucket:
        """A copy with every tensor on ``device`` -- ``h_self``, ``K2``, ``M2``, ``cols`` and the
        :class:`RowFactors` -- or ``self`` when they are all there already. The bases stay numpy
        arrays (host metadata); the feature-free tensors derived from them (:attr:`plain`) are built
        on the bucket's device when first used."""
        device = torch.device(device)
        if all(_on(t, device) for t in self.tensors().values()):
            return self
        return EncodingBucket(
            self.bases,
            self.h_self.to(device),
            self.K2.to(device),
            None if self.M2 is None else self.M2.to(device),
            None if self.cols is None else self.cols.to(device),
            None if self.factors is None else self.factors.to(device),
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor the bucket stores (not its lazily derived ones), by name: ``h_self``, ``K2``,
        ``M2``, ``cols`` when set, ``factors.R`` etc. when factorised."""
        out = {"h_self": self.h_self, "K2": self.K2}
        if self.M2 is not None:
            out["M2"] = self.M2
        if self.cols is not None:
            out["cols"] = self.cols
        if self.factors is not None:
            f = self.factors
            out.update({"factors.R": f.R, "factors.K2": f.K2, "factors.M2": f.M2, "factors.h_self": f.h_self})
        return out

    @property
    def variant(self) -> str:
        return self.bases.variant

    @property
    def kind(self) -> Variant:
        return self.bases.kind

    @property
    def features(self) -> torch.Tensor:
        """``(B, 1 + m, d)``: the computed rows in the coefficient layout (a copy); ``M2`` is derived."""
        return torch.cat([self.h_self[:, None], self.K2], dim=1)

    @cached_property
    def plain(self) -> dict[str, torch.Tensor]:
        """Feature-free float64 tensors (:meth:`fedgat.variants.Variant.plain`): ``P (B,m,m)``,
        ``K1 (B,m)``, ``K3 (B,m)`` (matrix) or ``Q (B,m,n)`` (vector), on the bucket's :attr:`device`."""
        b = self.bases
        return {k: self._from_host(v) for k, v in b.kind.plain(b.p, b.q).items()}

    def compact(self, tol: float = 0.0) -> EncodingBucket:
        """Keep, per node, only the feature columns of a stored ``M2`` where it exceeds ``tol`` in
        magnitude (a derived ``M2`` is left alone: :meth:`factorise` never builds it).

        ``M2`` is linear in the neighbours' features, so a column is zero wherever no neighbour has
        that feature: on bag-of-words data (Cora: ~18 non-zeros of 1433 per row) the matrix
        variant's largest tensor, contracted with ``b2`` every step, shrinks several-fold. ``K2``
        stays dense (one GEMM with ``W`` per step); the vector variant has nothing to compact and is
        returned as is. Nothing is learned that the dense tensors did not already show. For
        decrypted CKKS encodings pass ``tol`` at the decryption error bound; dropped columns then move
        the output by at most ``tol`` times the weights' norm.
        """
        if self.cols is not None or self.M2 is None:
            return self
        support = self.M2.abs().amax(dim=1) > tol  # (B, d)
        k = max(int(support.sum(1).max()), 1)
        # stable sort puts each node's support first, in column order; the rest is padding
        order = torch.sort((~support).to(torch.int8), dim=1, stable=True).indices[:, :k]
        valid = torch.gather(support, 1, order)
        M2 = torch.gather(self.M2, 2, order[:, None, :].expand(-1, self.M2.shape[1], -1)) * valid[:, None, :]
        return EncodingBucket(self.bases, self.h_self, self.K2, M2, order, self.factors)

    def factorise(self, tol: float = 1e-4) -> EncodingBucket:
        """A copy with :class:`RowFactors` set (matrix variant; vectors are returned as is).

        With ``M2`` left to be derived, :math:`\tilde M_2 = L_i \tilde K_2` (:meth:`BucketBases.m2_map`)
        and the dense ``M2`` is never built.

        Raises ``ValueError`` (and leaves ``self`` unchanged) when an encoding is not a combination of
        ``n`` feature rows to within ``tol``, e.g. rows that do not come from one neighbourhood.
        Decrypted CKKS encodings pass with their ~1e-6 error; ``tol`` bounds how far the factored
        rows may move from the received ones.
        """
        if not self.kind.has_m2 or self.factors is not None:
            return self
        dtype = self.K2.dtype
        K2, h = self.K2.double(), self.h_self.double()
        r = min(self.bases.n, K2.shape[-1])
        R = torch.linalg.svd(K2, full_matrices=False).Vh[:, :r]  # (B, r, d)
        k2f, hf = K2 @ R.transpose(1, 2), torch.einsum("bd,brd->br", h, R)
        residual = max(_max_abs(K2 - k2f @ R), _max_abs(h - torch.einsum("br,brd->bd", hf, R)))
        if self.M2 is None:  # derived: M2 = L K2 = (L K2~) R exactly
            m2f = self._from_host(self.bases.m2_map()) @ k2f
        elif self.cols is None:
            M2 = self.M2.double()
            m2f = M2 @ R.transpose(1, 2)
            residual = max(residual, _max_abs(M2 - m2f @ R))
        else:
            M2 = self.M2.double()
            kept = torch.gather(R, 2, self.cols[:, None, :].expand(-1, r, -1))  # (B, r, k)
            m2f = M2 @ kept.transpose(1, 2)
            # dropped columns of M2 are zero (to the compaction tol); there
            # |(m2f R)_xc| <= sum_r |m2f_xr| max_c' |R_rc'|, without building the dense (m*m, d) product
            outside = R.abs().scatter(2, self.cols[:, None, :].expand(-1, r, -1), 0.0).amax(-1)  # (B, r)
            bound = (m2f.abs() @ outside[:, :, None]).max()
            residual = max(residual, _max_abs(M2 - m2f @ kept), float(bound))
        if not residual <= tol:
            raise ValueError(
                f"encodings of {len(self.bases)} nodes with n={self.bases.n} are not combinations of "
                f"n feature rows: residual {residual:.3g} > tol {tol:g}"
            )
        factors = RowFactors(R.to(dtype), k2f.to(dtype), m2f.to(dtype), hf.to(dtype), residual)
        return EncodingBucket(self.bases, self.h_self, self.K2, self.M2, self.cols, factors)

    def num_reals(self) -> int:
        """Reals shipped to the client for these nodes: computed rows and feature-free parts (a
        matrix bucket's ``M2`` is derived, not shipped, even when stored)."""
        B, m, n = self.bases.p.shape
        plain = B * self.kind.plain_reals(m, n)
        feature = self.h_self.numel() + self.K2.numel()
        return int(feature) + plain


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


@dataclass
class Encodings:
    """All encodings one party holds: ``buckets`` cover ``nodes`` (global ids) exactly once.

    ``variant`` is the variant's name (a :class:`~fedgat.variants.Variant` is accepted and stored
    by name); :attr:`kind` is the variant itself."""

    variant: str
    nodes: np.ndarray
    buckets: list[EncodingBucket]

    def __post_init__(self) -> None:
        self.variant = as_variant(self.variant).name

    @property
    def kind(self) -> Variant:
        return as_variant(self.variant)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    def num_reals(self) -> int:
        return sum(b.num_reals() for b in self.buckets)

    def __repr__(self) -> str:
        return (
            f"Encodings({self.variant!r}, {self.num_nodes} nodes in {len(self.buckets)} buckets, "
            f"{_size(self.nbytes())} as float32)"
        )

    def nbytes(self, bytes_per_real: int = 4) -> int:
        return self.num_reals() * bytes_per_real

    @property
    def device(self) -> torch.device:
        """Where the encodings' tensors live (CPU for encodings without buckets)."""
        return self.buckets[0].device if self.buckets else torch.device("cpu")

    def to(self, device: torch.device | str) -> Encodings:
        """The encodings with every tensor on ``device``, as ``Tensor.to`` does: a new
        :class:`Encodings` (``self`` when every tensor is there already), the original left as it was.

        Every bucket's stored tensors move (:meth:`EncodingBucket.to`); the derived ones --
        :attr:`flat_K2`, :attr:`flat_R`, :attr:`order`, :attr:`padded_groups`, each bucket's ``plain``
        and the layer's block-diagonal operators (:mod:`fedgat.layer`) -- are built on the new
        object's device when first used, so nothing cached on one device is reused on another.
        ``nodes`` and the bases stay numpy arrays (host metadata, never read per step). Moving costs
        one copy of the encodings per call: move once, before training (the FedAvg clients of
        :class:`fedgat.federated.Client` do, given a ``device``).
        """
        device = torch.device(device)
        moved = [b.to(device) for b in self.buckets]
        if all(m is b for m, b in zip(moved, self.buckets)):
            return self
        return Encodings(self.variant, self.nodes, moved)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor the buckets store, by ``"<bucket>.<name>"`` (:meth:`EncodingBucket.tensors`)."""
        return {f"{i}.{k}": t for i, b in enumerate(self.buckets) for k, t in b.tensors().items()}

    def check_layout(self) -> None:
        """Raise ``ValueError`` unless the buckets hold what the layer reads, consistently.

        Every node of :attr:`nodes` (distinct integer ids) is in exactly one bucket at the positions
        ``bases.rows`` name, with its id in ``bases.nodes`` and first in its ``neighbours``; per bucket
        of ``B`` nodes, ``n`` neighbours and dimension ``m``: ``p`` (and ``q`` for the matrix variant)
        ``(B, m, n)`` with the variant's ``m`` (matrix ``2n``, vector a multiple of ``n``), ``h_self (B, d)``,
        ``K2 (B, m, d)``, ``M2 (B, m*m, k)`` when stored, ``cols (B, k)`` integer with it; float32 or
        float64 values, all finite, one dtype and one ``d >= 1`` throughout. For encodings read from a
        file (:func:`fedgat.checkpoint.load_encodings`), before anything trains on them: a file that
        passes holds nothing the layer would fail on, and no shape that makes training allocate more
        than the file's size (the matrix variant's ``M2`` is ``m^2`` rows per node).
        """
        nodes = np.asarray(self.nodes)
        if nodes.ndim != 1 or nodes.dtype.kind not in "iu":
            raise ValueError(f"nodes must be a 1-D integer array, got {nodes.dtype} of shape {nodes.shape}")
        if np.unique(nodes).size != nodes.size:
            raise ValueError("nodes repeat an id")
        seen = np.zeros(nodes.size, dtype=np.int64)
        floating: set[torch.dtype] = set()
        widths: set[int] = set()
        for i, b in enumerate(self.buckets):
            bb, where = b.bases, f"bucket {i}"
            if bb.variant != self.variant:
                raise ValueError(f"{where} holds {bb.variant} bases in {self.variant} encodings")
            arrays = {"rows": bb.rows, "nodes": bb.nodes, "neighbours": bb.neighbours}
            for name, a in arrays.items():
                if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu":
                    raise ValueError(f"{where}: {name} must be an integer array")
            B = bb.rows.shape[0] if bb.rows.ndim == 1 else -1
            if B < 1 or bb.nodes.shape != (B,) or bb.neighbours.ndim != 2 or bb.neighbours.shape[0] != B:
                raise ValueError(f"{where}: rows, nodes and neighbours must have one entry (row) per node")
            n = bb.neighbours.shape[1]
            if n < 1 or bb.rows.min() < 0 or bb.rows.max() >= nodes.size:
                raise ValueError(f"{where}: an empty neighbourhood or a row outside the encoded nodes")
            np.add.at(seen, bb.rows, 1)  # a row named twice counts twice
            if not np.array_equal(nodes[bb.rows], bb.nodes) or not np.array_equal(
                bb.neighbours[:, 0], bb.nodes
            ):
                raise ValueError(
                    f"{where}: its nodes are not those its rows name, or not first in their neighbours"
                )
            for name, basis in (("p", bb.p), ("q", bb.q)):
                want = name == "p" or self.kind.has_q
                if (basis is not None) != want:
                    raise ValueError(
                        f"{where}: {name} {'missing' if want else 'given'} for the {self.variant} variant"
                    )
                if basis is not None and (
                    basis.dtype not in (np.float32, np.float64)
                    or basis.ndim != 3
                    or basis.shape[0] != B
                    or basis.shape[2] != n
                ):
                    raise ValueError(f"{where}: {name} must be a ({B}, m, {n}) float32 or float64 array")
                if basis is not None and not np.isfinite(basis).all():
                    raise ValueError(f"{where}: {name} holds a value that is not finite")
            m = bb.p.shape[1]
            if bb.q is not None and bb.q.shape != bb.p.shape:
                raise ValueError(f"{where}: p and q must have the same shape (B, m, n)")
            if (m != 2 * n) if self.kind.has_m2 else (m < n or m % n):
                what = "2n" if self.kind.has_m2 else "a multiple of n"
                raise ValueError(f"{where}: m = {m} for n = {n}; the {self.variant} variant's m is {what}")
            tensors = {"h_self": b.h_self, "K2": b.K2, "M2": b.M2}
            for name, t in tensors.items():
                if t is None:
                    continue
                if not isinstance(t, torch.Tensor) or t.dtype not in (torch.float32, torch.float64):
                    raise ValueError(f"{where}: {name} must be a float32 or float64 tensor")
                if not torch.isfinite(t).all():
                    raise ValueError(f"{where}: {name} holds a value that is not finite")
            d = b.h_self.shape[-1] if b.h_self.dim() == 2 else -1
            if d < 1 or b.h_self.shape != (B, d) or b.K2.shape != (B, m, d):
                raise ValueError(f"{where}: h_self must be ({B}, d) and K2 ({B}, {m}, d), d >= 1")
            floating.update(t.dtype for t in tensors.values() if t is not None)
            widths.add(int(d))
            if b.M2 is not None:
                if not self.kind.has_m2:
                    raise ValueError(f"{where}: M2 given for the {self.variant} variant")
                k = d if b.cols is None else (b.cols.shape[1] if b.cols.dim() == 2 else -1)
                if b.M2.shape != (B, m * m, k):
                    raise ValueError(f"{where}: M2 must be ({B}, {m * m}, {k})")
            if b.cols is not None and (b.M2 is None or b.cols.dtype != torch.int64 or b.cols.shape[0] != B):
                raise ValueError(f"{where}: cols must be ({B}, k) int64, beside a stored M2")
            if (
                b.cols is not None
                and b.cols.numel()
                and not (0 <= int(b.cols.min()) <= int(b.cols.max()) < d)
            ):
                raise ValueError(f"{where}: cols name feature columns outside 0..{d - 1}")
        if not (seen == 1).all():
            raise ValueError("the buckets do not cover every node exactly once")
        if len(floating) > 1 or len(widths) > 1:
            raise ValueError(
                f"the buckets mix dtypes {sorted(map(str, floating))} or widths {sorted(widths)}"
            )

    def compact(self, tol: float = 0.0) -> Encodings:
        """Column-compacted copy for faster training (see :meth:`EncodingBucket.compact`)."""
        return Encodings(self.variant, self.nodes, [b.compact(tol) for b in self.buckets])

    def with_dense_M2(self) -> Encodings:
        """Copy with every matrix bucket's ``M2`` stored densely (:meth:`EncodingBucket.dense_M2`)."""
        if not self.kind.has_m2:
            return self
        return Encodings(
            self.variant,
            self.nodes,
            [EncodingBucket(b.bases, b.h_self, b.K2, b.dense_M2(), b.cols, b.factors) for b in self.buckets],
        )

    def factorise(self, tol: float = 1e-4) -> Encodings:
        """Copy with :class:`RowFactors` on every matrix bucket (see :meth:`EncodingBucket.factorise`)."""
        return Encodings(self.variant, self.nodes, [b.factorise(tol) for b in self.buckets])

    @property
    def factorised(self) -> bool:
        return all(b.factors is not None for b in self.buckets)

    @cached_property
    def flat_R(self) -> torch.Tensor:
        """Every bucket's :attr:`RowFactors.R` rows stacked, ``(sum_b B*r, d)`` (factorised matrix only)."""
        return torch.cat([b.row_factors.R.reshape(-1, b.row_factors.R.shape[-1]) for b in self.buckets])

    @cached_property
    def padded_groups(self) -> list[PaddedGroup]:
        """Consecutive buckets merged into a few groups zero-padded to a common ``m`` (and ``n``):
        :func:`fedgat.padding.padded_groups`."""
        return padded_groups(self.buckets, self.kind)

    @cached_property
    def order(self) -> torch.Tensor:
        """Permutation taking the buckets' concatenated rows to ``nodes`` order (on :attr:`device`)."""
        rows = torch.from_numpy(np.concatenate([b.bases.rows for b in self.buckets]))
        return torch.argsort(rows).to(self.device)

    @property
    def compacted(self) -> bool:
        return all(b.cols is not None for b in self.buckets)

    @cached_property
    def flat_K2(self) -> torch.Tensor:
        """Every bucket's ``K2`` (``V``) rows stacked, ``(sum_b B*m, d)``: one GEMM with ``W`` per step.
        A view, not a copy, where the buckets' ``K2`` already lie one after another in one buffer
        (as :func:`fedgat.tasks.select_nodes` builds them)."""
        return flat_rows([b.K2 for b in self.buckets])

    @cached_property
    def flat_h_self(self) -> torch.Tensor:
        """Every bucket's ``h_self`` stacked in bucket order, ``(num_nodes, d)`` (a view where they
        lie one after another in one buffer, as :attr:`flat_K2`)."""
        return flat_rows([b.h_self for b in self.buckets])


def flat_rows(parts: list[torch.Tensor]) -> torch.Tensor:
    """``parts`` (each ``(..., d)``) as one ``(rows, d)`` tensor: a view of their common buffer when
    they are contiguous and lie one after another in it, else a concatenated copy."""
    flat = [t.reshape(-1, t.shape[-1]) for t in parts]
    if not flat:
        return torch.cat(flat)
    first = flat[0]
    offset, storage = first.storage_offset(), first.untyped_storage()
    at, d = offset, first.shape[1]
    for t in flat:
        if (
            not t.is_contiguous()
            or t.shape[1] != d
            or t.dtype != first.dtype
            or t.device != first.device
            or t.untyped_storage().data_ptr() != storage.data_ptr()
            or t.storage_offset() != at
        ):
            return torch.cat(flat)
        at += t.numel()
    return first.as_strided((sum(t.shape[0] for t in flat), d), (d, 1), offset)


def _on(t: torch.Tensor, device: torch.device) -> bool:
    """Whether ``t`` lives on ``device`` (``cuda`` without an index meaning the current CUDA device)."""
    if t.device.type != device.type:
        return False
    return device.index is None or t.device.index == device.index


def _max_abs(t: torch.Tensor) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


def encode_bucket(
    bases: BucketBases,
    x: torch.Tensor,
    shared_x: torch.Tensor | None = None,
    foreign: np.ndarray | None = None,
) -> EncodingBucket:
    """Plaintext reference: :math:`F_i = A_i H_i` for one bucket (one batched matmul).

    With ``shared_x`` and a ``(B, n)`` mask ``foreign``, masked neighbours contribute their shared
    (e.g. differentially private, :mod:`fedgat.dp`) features instead of ``x``.
    """
    coeff = torch.from_numpy(bases.coefficients()).to(x.dtype)
    index = torch.from_numpy(bases.neighbours)
    neighbour_feats = x[index]  # (B, n, d)
    if shared_x is not None and foreign is not None and foreign.any():
        mask = torch.from_numpy(foreign)[:, :, None]
        neighbour_feats = torch.where(mask, shared_x.to(x.dtype)[index], neighbour_feats)
    return EncodingBucket.from_rows(bases, torch.bmm(coeff, neighbour_feats))


def encode(
    variant: VariantLike,
    x: torch.Tensor,
    neighbourhoods: CSR,
    nodes: np.ndarray | None = None,
    rng: RandomSource | int | None = None,
    embed_factor: int = 1,
    *,
    shared_x: torch.Tensor | None = None,
    owner: np.ndarray | None = None,
    viewer: int | None = None,
) -> Encodings:
    """Build the plaintext encodings of ``nodes`` (default: all) from features ``x`` ``(N, d)``.

    For a client ``viewer``, pass ``shared_x`` and ``owner`` to build its encodings from its own
    nodes' clean features and the other clients' *shared* features (e.g. a DP release).
    """
    nodes = np.arange(x.shape[0]) if nodes is None else np.asarray(nodes, dtype=np.int64)
    bases = draw_bases(variant, neighbourhoods, nodes, rng, embed_factor=embed_factor)
    if shared_x is not None and (owner is None or viewer is None):
        raise ValueError("shared_x needs owner and viewer")
    buckets = [
        encode_bucket(
            b, x, shared_x, None if shared_x is None or owner is None else owner[b.neighbours] != viewer
        )
        for b in bases
    ]
    return Encodings(as_variant(variant).name, nodes, buckets)


def encoding_size(
    variant: VariantLike, neighbourhood_sizes: np.ndarray, d: int, embed_factor: int = 1
) -> dict:
    """Number of reals the encodings of nodes with these neighbourhood sizes take, without building
    them (:meth:`fedgat.variants.Variant.encoding_size`)."""
    return as_variant(variant).encoding_size(neighbourhood_sizes, d, embed_factor)
