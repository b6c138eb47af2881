r"""FedGAT's two encoding variants as objects: the per-variant maths in one place.

A :class:`Variant` knows, for a node with ``n`` attention neighbours, the encoding dimension
:math:`m`, how many rows the server computes and the client holds, how large the random bases
are, how to draw them and which feature-free tensors follow from them. Code that differs between
the variants asks the variant (:func:`as_variant`) instead of comparing names.

* :data:`MATRIX` (paper eq. 9-14): :math:`m = 2n`; bases :math:`p_j, q_j` of the rank-one oblique
  projectors :math:`U_j = \tfrac12 p_j q_j^\top`; encodings :math:`M_1 = h_i P_i`, :math:`M_2`,
  :math:`K_1, K_2, K_3`. :math:`M_2` (``m^2`` rows) is a feature-free map of :math:`K_2`
  (:meth:`MatrixVariant.m2_map`), so clients derive it instead of receiving it.
* :data:`VECTOR` (compact): :math:`m = \text{embed\_factor}\cdot n`; basis :math:`Q_i` with
  orthonormal columns; encoding :math:`V_i = Q_i H_i`.

Messages, configs, checkpoints and the command line carry the variant's :attr:`Variant.name`
(:data:`VARIANTS` lists them); the objects are singletons, looked up with :func:`as_variant`.
See :mod:`fedgat.encodings` for the encodings themselves.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, TypeVar

import numpy as np

if TYPE_CHECKING:
    from fedgat.randomness import RandomSource

__all__ = [
    "MATRIX",
    "RATIO_RANGE",
    "VARIANTS",
    "VECTOR",
    "MatrixVariant",
    "Variant",
    "VariantLike",
    "VectorVariant",
    "as_variant",
]

#: the matrix variant's :math:`r_j` are log-uniform in this range (what clients accept: at most
#: :meth:`MatrixVariant.max_pair_norm`)
RATIO_RANGE = (0.5, 2.0)

#: an int or an array of ints (neighbourhood sizes); the formulas apply elementwise
Size = TypeVar("Size", int, np.ndarray)


class Variant(ABC):
    """One encoding variant (use the singletons :data:`MATRIX` and :data:`VECTOR`).

    Attributes:
        name: the name messages, configs and the command line carry.
        has_q: the bases are pairs :math:`(p_j, q_j)` (``p`` and ``q``); without, ``p`` alone is
            the orthonormal basis :math:`Q_i`.
        has_m2: the encodings include :math:`M_2` (``m^2`` rows per node, derived from ``K2``) and
            the feature-free :math:`P_i, K_1, K_3`; the layer runs its polynomial on the matrices
            :math:`D_i` (Clenshaw) rather than on scalar logits.
        pad_power: a node costs the layer ``~m ** pad_power`` per step (the padding plan's exponent,
            :func:`fedgat.encodings.plan_padded_groups`).
        default_neighbour_cap: the neighbour cap a run gets unless one is given (None: uncapped).
        recovery_attack: the :mod:`fedgat.attacks` attack that recovers every neighbour's features
            from a client's view of these encodings.
    """

    name: ClassVar[str]
    has_q: ClassVar[bool]
    has_m2: ClassVar[bool]
    pad_power: ClassVar[int]
    default_neighbour_cap: ClassVar[int | None]
    recovery_attack: ClassVar[str]

    def __repr__(self) -> str:
        return f"<FedGAT variant {self.name!r}>"

    def __reduce__(self) -> tuple:
        return as_variant, (self.name,)  # unpickles to the singleton

    # --- sizes ----------------------------------------------------------------------------------
    @abstractmethod
    def m(self, n: Size, embed_factor: int = 1) -> Size:
        """The encoding dimension :math:`m` of a node with ``n`` neighbours."""
        raise NotImplementedError

    def bases_per_node(self) -> int:
        """``(m, n)`` basis matrices drawn per node: 2 (``p`` and ``q``) or 1 (``Q``)."""
        return 2 if self.has_q else 1

    def bases_bytes(self, sizes: np.ndarray, embed_factor: int = 1) -> int:
        """Bytes of the float64 bases (``p`` and ``q``, or ``Q``) of nodes with neighbourhood ``sizes``."""
        n = np.asarray(sizes).astype(np.float64)
        return int((self.m(n, embed_factor) * n * 8 * self.bases_per_node()).sum())

    def computed_rows(self, n: Size, embed_factor: int = 1, ship_m2: bool = False) -> Size:
        """Rows the server computes per node besides :math:`h_i`: ``m`` (``K2`` or ``V``); with
        ``ship_m2`` also the ``m^2`` rows of :math:`M_2`, as the paper's protocol does (ours lets
        clients derive them, :meth:`MatrixVariant.m2_map`)."""
        m = self.m(n, embed_factor)
        return m + m * m if self.has_m2 and ship_m2 else m

    def held_rows(self, n: Size, embed_factor: int = 1) -> Size:
        """Rows a client holds per node once decrypted: :math:`h_i`, ``K2``/``V`` and, derived or
        shipped, :math:`M_2`."""
        return 1 + self.computed_rows(n, embed_factor, ship_m2=True)

    @abstractmethod
    def plain_reals(self, m: Size, n: Size) -> Size:
        """Reals of the feature-free parts of one node with dimension ``m`` and ``n`` neighbours."""
        raise NotImplementedError

    def derived_reals(self, m: Size, d: int) -> Size:
        """Reals a client derives per node (:math:`M_2`, ``d`` features wide; 0 without)."""
        return d * m * m if self.has_m2 else 0 * m

    def encoding_size(self, sizes: np.ndarray, d: int, embed_factor: int = 1) -> dict[str, float]:
        """Reals the encodings of nodes with neighbourhood ``sizes`` and ``d`` features take.

        ``feature_reals``: the computed rows (``h_i`` and ``K2``/``V``), what the protocol ships;
        ``derived_reals``: the matrix variant's ``M2``, rebuilt by the client (the paper ships it);
        ``plain_reals``: the feature-free parts; ``total_reals``: what is shipped (feature + plain).
        """
        n = np.asarray(sizes, dtype=np.float64)
        m = self.m(n, embed_factor)
        feature = d * (1 + m)
        plain = self.plain_reals(m, n)
        return {
            "feature_reals": float(feature.sum()),
            "derived_reals": float(self.derived_reals(m, d).sum()),
            "plain_reals": float(plain.sum()),
            "total_reals": float((feature + plain).sum()),
        }

    # --- bases ----------------------------------------------------------------------------------
    @abstractmethod
    def draw(
        self,
        rng: RandomSource,
        count: int,
        n: int,
        embed_factor: int = 1,
        ratio_range: tuple[float, float] = RATIO_RANGE,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Fresh bases ``p, q`` (``(count, m, n)`` each; ``q`` None without :attr:`has_q`) for
        ``count`` nodes with ``n`` neighbours. ``ratio_range``: the matrix variant's :math:`r_j`."""
        raise NotImplementedError

    @abstractmethod
    def plain(self, p: np.ndarray, q: np.ndarray | None) -> dict[str, np.ndarray]:
        """The feature-free float64 tensors the client derives from the bases."""
        raise NotImplementedError

    def max_coefficient_row_norm(self) -> float:
        r"""The largest norm of a row of the coefficients :math:`A_i` the server evaluates (over the
        neighbours): 1 for orthonormal columns (and the self row :math:`e_0`). It bounds the upload
        pads' part of a result (:meth:`fedgat.crypto.params.CkksPreset.pad_bound`)."""
        return 1.0

    def max_pair_norm(self) -> float | None:
        r"""The largest :math:`\lVert p_j \rVert \lVert q_j \rVert` bases this variant draws (None: no
        such pair; a client refuses bases above it, whose ill-conditioning would only amplify the
        CKKS noise in the rows it reads back)."""
        return None

    @abstractmethod
    def left_inverse(self, p: np.ndarray, q: np.ndarray | None) -> tuple[np.ndarray, float]:
        r"""``(L, c)`` with :math:`L_i^\top p_i = c I` for bases this variant draws: the identity the
        layer relies on to read the neighbours' rows back (:math:`Q_i^\top V_i = H_i`, or
        :math:`q_k^\top p_j = 2\delta_{jk}`). A client checks received bases against it."""
        raise NotImplementedError

    def m2_map(self, p: np.ndarray, q: np.ndarray | None) -> np.ndarray:
        """``(B, m*m, m)``: the feature-free map taking ``K2`` to :math:`M_2` (matrix variant only)."""
        raise ValueError("m2_map is defined for the matrix variant only")

    @abstractmethod
    def sum_weights(self, plain: dict[str, np.ndarray]) -> np.ndarray:
        r"""``(B, m)``: the row :math:`w_i` with :math:`w_i^\top K_2 = \sum_j h_j` (``K2``: ``V`` for
        the vector variant), from :meth:`plain`; the neighbour-sum attack reads it off."""
        raise NotImplementedError


class MatrixVariant(Variant):
    r"""The paper's variant (eq. 9-14): :math:`m = 2n`, rank-one oblique projectors."""

    name = "matrix"
    has_q = True
    has_m2 = True
    pad_power = 2
    default_neighbour_cap = 16  # its encodings grow like sum n^2
    recovery_attack = "spectral"

    def m(self, n: Size, embed_factor: int = 1) -> Size:
        """:math:`m = 2n` (``embed_factor`` does not apply)."""
        return 2 * n

    def plain_reals(self, m: Size, n: Size) -> Size:
        """:math:`P_i` (``m x m``), :math:`K_1` and :math:`K_3` (``m`` each)."""
        return m * m + 2 * m

    def draw(
        self,
        rng: RandomSource,
        count: int,
        n: int,
        embed_factor: int = 1,
        ratio_range: tuple[float, float] = RATIO_RANGE,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        r"""An orthonormal :math:`\{u_{1j}, u_{2j}\}_{j \le n}` in :math:`\mathbb{R}^{2n}` and ratios
        :math:`r_j` log-uniform in ``ratio_range``; :math:`p_j = u_{1j} + u_{2j}/r_j`,
        :math:`q_j = u_{1j} + r_j u_{2j}`, so :math:`q_k^\top p_j = 2\delta_{jk}` (paper eq. 9-14)."""
        basis = rng.orthogonal(count, 2 * n)
        u1, u2 = basis[:, :, :n], basis[:, :, n:]
        lo, hi = np.log(ratio_range[0]), np.log(ratio_range[1])
        r = np.exp(rng.uniform((count, 1, n), lo, hi))
        return u1 + u2 / r, u1 + u2 * r

    def plain(self, p: np.ndarray, q: np.ndarray | None) -> dict[str, np.ndarray]:
        r""":math:`P_i = \sum_j U_j = \tfrac12 \sum_j p_j q_j^\top` ``(B, m, m)``,
        :math:`K_1 = \tfrac12 \sum_j q_j` and :math:`K_3 = \sum_j p_j` ``(B, m)`` (paper eq. 9-14)."""
        assert q is not None  # matrix bases always have q
        return {"P": 0.5 * np.einsum("bxj,byj->bxy", p, q), "K1": 0.5 * q.sum(-1), "K3": p.sum(-1)}

    def max_coefficient_row_norm(self) -> float:
        r""":math:`\sqrt{1 + r_{min}^{-2}}` (:math:`\sqrt 5` for :math:`r \ge 1/2`): row ``k`` of
        :math:`p = u_1 + u_2 / r` has norm at most :math:`a + b / r_{min}` with :math:`a^2 + b^2 = 1`
        (a row of an orthogonal matrix), whose largest value is this."""
        return math.sqrt(1.0 + 1.0 / RATIO_RANGE[0] ** 2)

    def max_pair_norm(self) -> float | None:
        r""":math:`\sqrt{2 + r^2 + r^{-2}}` at the ends of the default ratio range (2.5 for
        :math:`r \in [1/2, 2]`): :math:`\lVert p_j \rVert^2 = 1 + r_j^{-2}`, :math:`\lVert q_j \rVert^2 = 1 + r_j^2`."""
        r = max(1.0 / RATIO_RANGE[0], RATIO_RANGE[1])
        return math.sqrt(2.0 + r * r + 1.0 / (r * r))

    def left_inverse(self, p: np.ndarray, q: np.ndarray | None) -> tuple[np.ndarray, float]:
        r"""``(q, 2)``: :math:`q_k^\top p_j = 2\delta_{jk}`."""
        assert q is not None  # matrix bases always have q
        return q, 2.0

    def m2_map(self, p: np.ndarray, q: np.ndarray | None) -> np.ndarray:
        r"""``(B, m*m, m)``: :math:`L_i` with :math:`M_2 = L_i K_2`.

        :math:`M_2 = A^{M_2} H_i` with :math:`A^{M_2}_{(x,y),j} = \tfrac12 p_j(x) q_j(y)`, and
        :math:`K_2 = [p_j] H_i` has the left inverse :math:`\tfrac12 [q_j]^\top` (since
        :math:`q_k^\top p_j = 2\delta_{jk}`), so :math:`L_i = \tfrac14 \sum_j (p_j \otimes q_j) q_j^\top`
        depends on the random bases only: :math:`M_2` tells a holder of :math:`K_2` and the bases
        nothing new, and the protocol ships :math:`K_2` alone (paper: :math:`M_2` too; SECURITY.md).
        """
        assert q is not None  # matrix bases always have q
        B, m, _ = p.shape
        return 0.25 * np.einsum("bxj,byj,bkj->bxyk", p, q, q).reshape(B, m * m, m)

    def sum_weights(self, plain: dict[str, np.ndarray]) -> np.ndarray:
        r""":math:`K_1^\top P_i`, since :math:`K_1^\top P_i K_2 = \sum_j h_j` (paper eq. 9-14)."""
        return np.einsum("bx,bxy->by", plain["K1"], plain["P"])


class VectorVariant(Variant):
    r"""The compact variant: :math:`V_i = Q_i H_i`, :math:`m = \text{embed\_factor}\cdot n`."""

    name = "vector"
    has_q = False
    has_m2 = False
    pad_power = 1
    default_neighbour_cap = None
    recovery_attack = "basis"

    def m(self, n: Size, embed_factor: int = 1) -> Size:
        """:math:`m = \\text{embed\\_factor} \\cdot n`."""
        return embed_factor * n

    def plain_reals(self, m: Size, n: Size) -> Size:
        """:math:`Q_i` (``m x n``)."""
        return m * n

    def draw(
        self,
        rng: RandomSource,
        count: int,
        n: int,
        embed_factor: int = 1,
        ratio_range: tuple[float, float] = RATIO_RANGE,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """:math:`Q_i`: the first ``n`` columns of a Haar-random orthogonal ``m x m`` matrix."""
        return rng.orthogonal(count, self.m(int(n), embed_factor))[:, :, :n], None

    def plain(self, p: np.ndarray, q: np.ndarray | None) -> dict[str, np.ndarray]:
        """``Q (B, m, n)``: the basis itself."""
        return {"Q": p}

    def left_inverse(self, p: np.ndarray, q: np.ndarray | None) -> tuple[np.ndarray, float]:
        r"""``(Q, 1)``: orthonormal columns, :math:`Q_i^\top Q_i = I`."""
        return p, 1.0

    def sum_weights(self, plain: dict[str, np.ndarray]) -> np.ndarray:
        r""":math:`\mathbf 1^\top Q_i^\top`: :math:`\mathbf 1^\top Q_i^\top V_i = \sum_j h_j`."""
        return plain["Q"].sum(-1)


MATRIX = MatrixVariant()
VECTOR = VectorVariant()
_BY_NAME: dict[str, Variant] = {v.name: v for v in (MATRIX, VECTOR)}
#: the variants' names, as configs and the command line spell them
VARIANTS: tuple[str, ...] = tuple(_BY_NAME)

#: what public functions accept: a variant or its name
VariantLike = Variant | str


def as_variant(variant: VariantLike) -> Variant:
    """The :class:`Variant` named ``variant`` (a :class:`Variant` is returned as is).

    Raises:
        ValueError: an unknown name (the message lists :data:`VARIANTS`).
    """
    if isinstance(variant, Variant):
        return variant
    found = _BY_NAME.get(variant) if isinstance(variant, str) else None
    if found is None:
        raise ValueError(f"unknown FedGAT variant {variant!r}; choose one of {VARIANTS}")
    return found
