r"""The FedGAT layer: GAT's first layer computed from encodings (paper Sec. 4, eq. 9-14).

For each head :math:`h` with projection :math:`W_h \in \mathbb{R}^{F' \times d}` and attention vectors
:math:`a_{src}, a_{dst} \in \mathbb{R}^{F'}` (PyG ``GATConv`` naming), let
:math:`b_1 = W_h^\top a_{dst}`, :math:`b_2 = W_h^\top a_{src}`. The exact GAT output is

.. math::
    h_i' = \sum_{j\in\mathcal N(i)} \alpha_{ij} W_h h_j,\quad
    \alpha_{ij} = \frac{s(x_{ij})}{\sum_k s(x_{ik})},\quad
    x_{ij} = \gamma_h\,(b_1\cdot h_i + b_2\cdot h_j),\quad s = \exp\circ\psi,

and FedGAT replaces :math:`s` by the polynomial :math:`\hat s` of :mod:`fedgat.approx`. The factor
:math:`\gamma_h = \min(1, a / (\lVert b_1\rVert + \lVert b_2\rVert))` keeps every logit inside the fitted
domain :math:`[-a, a]` (features have unit norm), so the polynomial is never extrapolated; with
:math:`\gamma_h = 1` the layer is exactly GAT with :math:`\hat s` in place of :math:`s`.

Matrix variant: :math:`D_i = \gamma_h((b_1\cdot h_i) P_i + \sum_s b_2(s) M_2(s))` and the row vector
:math:`r^\top = K_1^\top \hat s(D_i)` is built from the left by Clenshaw's recurrence (Horner's rule for
the Chebyshev basis, :mod:`fedgat.matrix_poly`): only matrix-vector products, never a matrix power.
Then numerator :math:`= W_h K_2^\top r` and denominator :math:`= K_3^\top r`. (:math:`D^0` is taken as
:math:`I`; :math:`K_1^\top P_i = K_1^\top` since :math:`q_k^\top p_j = 2\delta_{jk}`, so it agrees with
:math:`D^0 = P_i`.) With :meth:`fedgat.encodings.Encodings.factorise` the contractions with :math:`W` and :math:`b_2`
run on :class:`~fedgat.encodings.RowFactors` (``n`` basis rows per node instead of :math:`2n + m^2`),
and every node's and head's :math:`D_i^\top / a` is one block of a single block-diagonal sparse matrix
(:class:`_MatrixPlan`), so the recurrence is one sparse matrix-vector product per degree for all nodes
at once, blocks of every size, no padding; unfactorised encodings (and the ``meta`` device) run it as
batched matmuls on zero-padded groups of buckets.
Vector variant: logits :math:`x_i = \gamma_h(Q_i^\top V_i b_2 + b_1\cdot h_i)`, scores
:math:`\hat s(x_i)` by scalar Horner (on the CPU; on a GPU from the powers of :math:`x_i`), numerator
:math:`= W_h V_i^\top Q_i \hat s(x_i)`, denominator
:math:`\mathbf 1^\top \hat s(x_i)`.

Shapes: ``B`` nodes in a bucket, ``H`` heads, ``F`` = out_channels, ``d`` = in_channels,
``m`` encoding dimension, ``n`` neighbourhood size. Power-basis Horner at degree 16 loses ~4e-4 in
float32 (measured), so the vector variant's scalar Horner runs in float64; Clenshaw is stable in
float32, so the matrix variant's recurrence stays float32 like the big contractions.
"""

from __future__ import annotations

import math
import warnings
import weakref

import torch
from torch import nn
from torch_geometric.nn import GATConv

from fedgat.approx import ScorePolynomial, fit_score, logit_scale
from fedgat.encodings import Encodings
from fedgat.matrix_poly import (
    BlockDiagonal,
    chebyshev_left,
    clenshaw_blocks,
    clenshaw_blocks_grad,
    sparse_index_dtype,
)
from fedgat.padding import pad_last


class _GatherRows(torch.autograd.Function):
    """``table[index]`` with a scatter-add backward (torch's embedding backward sorts every call)."""

    @staticmethod
    def forward(ctx, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.rows = table.shape[0]
        return table.index_select(0, index.reshape(-1)).view(*index.shape, table.shape[1])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (index,) = ctx.saved_tensors
        flat = grad.reshape(-1, grad.shape[-1])
        return grad.new_zeros(ctx.rows, grad.shape[-1]).index_add_(0, index.reshape(-1), flat), None


def _gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return _GatherRows.apply(table, index)


class _Polynomial(torch.autograd.Function):
    """Power-basis ``p(x)`` elementwise (``coeffs`` lowest degree first) with ``p'(x)`` for the
    backward: one autograd node instead of two per degree.

    On the CPU (``table`` None) by Horner's rule, in place on one buffer each: a few cheap passes per
    degree, bit for bit what this layer has always computed. Elsewhere (``table`` the coefficients,
    ``dtable`` the derivative's and ``exponents`` ``[1, ..., k-1]``, as tensors on ``x``'s device) as
    ``[x, x^2, ..., x^(k-1)]`` by one broadcast power and two matrix-vector products: three kernel
    launches instead of four per degree (a GPU epoch on Cora is bound by launches, not arithmetic:
    benchmarks/results/gpu_profile_h100_vector.md). The powers are not a cumulative product: CUDA's
    scan over rows of 16 took a third of the GPU's busy time (gpu_profile_h200_vector.md). Both sum the
    same power basis in float64; they agree to rounding.
    """

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        coeffs: list[float],
        table: torch.Tensor | None = None,
        dtable: torch.Tensor | None = None,
        exponents: torch.Tensor | None = None,
    ) -> torch.Tensor:
        need_grad = ctx.needs_input_grad[0]
        if table is None or dtable is None or exponents is None:
            p = torch.full_like(x, coeffs[-1])
            dp = torch.zeros_like(x) if need_grad else None
            for c in reversed(coeffs[:-1]):
                if dp is not None:
                    dp.mul_(x).add_(p)
                p.mul_(x).add_(c)
        else:
            flat = x.reshape(-1, 1)
            powers = flat.pow(exponents)  # (n, k-1): x^1 .. x^(k-1)
            p = torch.addmv(table[:1].expand(flat.shape[0]), powers, table[1:]).view_as(x)
            dp = (
                torch.addmv(dtable[:1].expand(flat.shape[0]), powers[:, :-1], dtable[1:]).view_as(x)
                if need_grad
                else None
            )
        ctx.save_for_backward(dp)
        return p

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (dp,) = ctx.saved_tensors
        return grad * dp, None, None, None, None


def _powers_on(device: torch.device) -> bool:
    """Whether :class:`_Polynomial` evaluates from the powers of ``x`` (few kernel launches) rather than
    by Horner's rule (few passes over memory): everywhere but on the CPU."""
    return device.type != "cpu"


class _SparseMatmul(torch.autograd.Function):
    """``A @ x`` for a constant sparse CSR ``A`` with its transpose ``At`` kept for the backward
    (built once with the plan, not per backward)."""

    @staticmethod
    def forward(ctx, A: torch.Tensor, At: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.At = At
        return A @ x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, None, ctx.At @ grad


class _PairOp:
    """A constant sparse matrix ``A`` applied with autograd, with its transpose ``At`` for the backward
    (held already, e.g. by another operator of the same plan)."""

    def __init__(self, A: torch.Tensor, At: torch.Tensor) -> None:
        self.A, self.At = A, At

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _SparseMatmul.apply(self.A, self.At, x.contiguous())


class _SparseOp(_PairOp):
    """A constant sparse ``(rows, cols)`` matrix from COO entries (coalesced), as CSR with its
    transpose; ``index_dtype=torch.int32`` spares the sparse BLAS a conversion of the indices per
    product."""

    def __init__(
        self,
        row: torch.Tensor,
        col: torch.Tensor,
        value: torch.Tensor,
        shape: tuple[int, int],
        index_dtype: torch.dtype = torch.int64,
    ):
        def csr(r: torch.Tensor, c: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
            coo = torch.sparse_coo_tensor(torch.stack([r, c]), value, size, check_invariants=False)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta", UserWarning)
                out = coo.coalesce().to_sparse_csr()
            if index_dtype == torch.int64:
                return out
            return _csr(out.crow_indices(), out.col_indices(), out.values(), size, index_dtype)

        super().__init__(csr(row, col, shape), csr(col, row, (shape[1], shape[0])))


def _csr(
    crow: torch.Tensor,
    col: torch.Tensor,
    value: torch.Tensor,
    shape: tuple[int, int],
    index_dtype: torch.dtype,
) -> torch.Tensor:
    """A sparse CSR tensor from indices already in CSR order (no COO, no coalescing)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta", UserWarning)
        return torch.sparse_csr_tensor(
            crow.to(index_dtype), col.to(index_dtype), value, shape, check_invariants=False
        )


class _VectorPlan:
    r"""The vector layer's feature-free block-diagonal operators for one :class:`Encodings`.

    Rows ``r`` index ``flat_K2`` (``rows = sum_i m_i``), edges ``e`` the neighbour slots ``(i, j)`` in
    bucket order (``E = sum_i n_i``), nodes the output rows in ``encodings.nodes`` order (``N``):

    * ``spread (rows, E)``: :math:`Q_i`, giving :math:`Q_i \hat s(x_i)`; ``gather (E, rows)``: its
      transpose :math:`Q_i^\top`, giving the logits: ``gather @ (V_i b_2, V_i b_1)`` is
      :math:`Q_i^\top V_i b_2` per edge and, at each node's first edge ``first`` (the self slot,
      :math:`Q_i[:, 0]`), :math:`b_1 \cdot h_i`. The two are one pair of CSR matrices, each the other's
      backward (so ``2 sum_i m_i n_i`` stored values, not the ``6 sum_i m_i n_i`` of separate logit
      and spread operators with their transposes);
    * ``first (E,)``: the first edge of each edge's node;
    * ``row_sum (N, rows)`` and ``edge_sum (N, E)``: ones, summing each node's rows and edges.

    The CSR arrays are written directly in CSR order (int32 indices below 2^31 entries), and
    ``spread``'s values are the bases' own ``Q`` (shared with :attr:`EncodingBucket.plain`). Built on
    the encodings' device (:attr:`Encodings.device`), once per encodings and dtype.
    """

    def __init__(self, encodings: Encodings, dtype: torch.dtype) -> None:
        r_off = e_off = 0
        sv, sc, sn, gv, gc, gm, fe, nodes, ms, ns = ([] for _ in range(10))
        dev = encodings.device
        for b in encodings.buckets:
            Q = b.plain["Q"]  # (B, m, n) float64, on dev
            B, m, n = Q.shape
            node = torch.from_numpy(b.bases.rows).long().to(dev)  # (B,) positions in encodings.nodes
            edge = e_off + torch.arange(B * n, device=dev).view(B, 1, n)
            row = r_off + torch.arange(B * m, device=dev).view(B, m, 1)
            sv.append(Q.reshape(-1))  # row (i, x), columns (i, j): row-major Q is CSR order
            sc.append(edge.expand(B, m, n).reshape(-1))
            sn.append(torch.full((B * m,), n, dtype=torch.int64, device=dev))
            gv.append(Q.transpose(1, 2).reshape(-1))  # row (i, j), columns (i, x)
            gc.append(row.view(B, 1, m).expand(B, n, m).reshape(-1))
            gm.append(torch.full((B * n,), m, dtype=torch.int64, device=dev))
            fe.append((e_off + n * torch.arange(B, device=dev)).repeat_interleave(n))
            nodes.append(node)
            ms.append(torch.full((B,), m, dtype=torch.int64, device=dev))
            ns.append(torch.full((B,), n, dtype=torch.int64, device=dev))
            r_off, e_off = r_off + B * m, e_off + B * n
        N, cat = encodings.num_nodes, torch.cat
        f64 = torch.float64
        zero = torch.zeros(1, dtype=torch.int64, device=dev)

        def crow(counts: list[torch.Tensor]) -> torch.Tensor:
            return cat([zero, *counts]).cumsum(0) if counts else zero

        values = cat(sv) if sv else torch.zeros(0, dtype=f64, device=dev)
        index = sparse_index_dtype(len(values))
        spread = _csr(crow(sn), cat(sc) if sc else zero[:0], values, (r_off, e_off), index)
        gather = _csr(crow(gm), cat(gc) if gc else zero[:0], cat(gv) if gv else values, (e_off, r_off), index)
        self.spread, self.gather = _PairOp(spread, gather), _PairOp(gather, spread)
        self.first = cat(fe) if fe else zero[:0]
        node_all = cat(nodes) if nodes else zero[:0]
        self.row_sum = _segment_sum(node_all, cat(ms) if ms else zero[:0], N, dtype)
        self.edge_sum = _segment_sum(node_all, cat(ns) if ns else zero[:0], N, f64)


class _GatherBackwardSum(torch.autograd.Function):
    """``A @ x`` for a constant ``(N, total)`` CSR ``A`` of ones with one entry per column (column ``c``
    in row ``owner[c]``): its backward ``A^T g`` is the gather ``g[owner]``, which writes each row once
    where a sparse product zero-fills and accumulates."""

    @staticmethod
    def forward(ctx, A: torch.Tensor, owner: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.owner = owner
        return A @ x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, None, grad.index_select(0, ctx.owner)


class _SegmentSum:
    """Sums of consecutive segments of rows, one segment per output row (:func:`_segment_sum`)."""

    def __init__(self, A: torch.Tensor, owner: torch.Tensor) -> None:
        self.A, self.owner = A, owner

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _GatherBackwardSum.apply(self.A, self.owner, x.contiguous())


def _segment_sum(node: torch.Tensor, length: torch.Tensor, N: int, dtype: torch.dtype) -> _SegmentSum:
    """``(N, total)`` ones summing consecutive segments of ``length`` entries (segment ``k`` belongs
    to output row ``node[k]``, a permutation of ``range(N)``), written directly in CSR order, with
    each entry's output row for the backward."""
    dev = node.device
    total = int(length.sum())
    index = sparse_index_dtype(max(total, N) + 1)
    zero = torch.zeros(1, dtype=torch.int64, device=dev)
    start = length.cumsum(0) - length  # (N,) first entry of each segment
    order = torch.argsort(node)  # segments in output-row order
    len_sorted = length[order]
    crow = torch.cat([zero, len_sorted.cumsum(0)])
    within = torch.arange(total, device=dev) - crow[:-1].repeat_interleave(len_sorted)
    col = start[order].repeat_interleave(len_sorted) + within
    ones = torch.ones(total, dtype=dtype, device=dev)
    A = _csr(crow, col, ones, (N, total), index)
    return _SegmentSum(A, node.repeat_interleave(length).to(index))  # index_select takes int32


class _MatrixScores(torch.autograd.Function):
    r"""``r (L,)``, :math:`r^\top = K_1^\top \hat s(D_i)` for every node and head (in ``(i, h, x)`` order),
    from ``lhs (rows + N, H)``: per node the rows :math:`R_i b_2` then the self logit
    :math:`b_1 \cdot h_i`, times :math:`\gamma / a` (:attr:`_MatrixPlan.extend`).

    Per bucket the values of every :math:`\tilde D_i^\top` are one batched matmul
    ``lhs_i^T (B, H, r+1) @ A (B, r+1, m^2)`` written straight into the block-diagonal value array
    (:class:`_MatrixPlan`), then Clenshaw runs on all of them (:func:`fedgat.matrix_poly.clenshaw_blocks`).
    Backward: the recurrence's adjoint gives :math:`\partial L / \partial \tilde D^\top` row-major
    (:func:`fedgat.matrix_poly.clenshaw_blocks_grad`), and ``A_rows @ grad^T`` per bucket the gradient of
    ``lhs`` (``A_rows``: ``A`` with row-major columns), so the values are never reordered."""

    @staticmethod
    def forward(ctx, lhs: torch.Tensor, plan: _MatrixPlan, cheb: tuple[float, ...]) -> torch.Tensor:
        values = lhs.new_empty(plan.pattern.nnz)
        for A, rows, out in zip(plan.A, plan.lhs_rows, plan.pattern.value_blocks(values)):
            B, r1, mm = A.shape
            torch.bmm(lhs[rows].view(B, r1, -1).transpose(1, 2), A, out=out.view(B, -1, mm))
        r, bs = clenshaw_blocks(plan.pattern, values, plan.k, cheb)
        ctx.save_for_backward(values, bs)
        ctx.plan = plan
        return r

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        values, bs = ctx.saved_tensors
        plan: _MatrixPlan = ctx.plan
        out = g.new_zeros(plan.lhs_rows[-1].stop if plan.lhs_rows else 0, plan.heads)
        if bs.shape[0] == 0:
            return out, None, None
        grad = clenshaw_blocks_grad(plan.pattern, values, bs, g.contiguous())
        for A, rows, gb in zip(plan.A_rows, plan.lhs_rows, plan.pattern.value_blocks(grad)):
            B, r1, mm = A.shape
            torch.bmm(A, gb.view(B, -1, mm).transpose(1, 2), out=out[rows].view(B, r1, -1))
        return out, None, None


class _MatrixPlan:
    r"""The factorised matrix layer's feature-free operators for one :class:`Encodings` and head count.

    Vectors of length ``L = sum_i H m_i`` hold one entry per (node ``i``, head ``h``, coordinate
    ``x``), nodes in bucket order; rows ``t`` index ``flat_R`` (``sum_i r_i``, ``r_i = n_i``):

    * ``extend (rows + N, 2 rows)``: from the attention rows ``(R a_{src}, R a_{dst})`` (``(rows, 2, H)``
      viewed as ``(2 rows, H)``) to, per node, its ``r`` rows :math:`R_i b_2` and then its self logit
      :math:`\tilde h_i \cdot R_i b_1 = b_1 \cdot h_i`; ``lhs_rows``: each bucket's slice of them;
    * ``A_rows`` (per bucket, ``(B, r+1, m^2)``): row ``t < r`` is :math:`\tilde M_2[:, t]`, row ``r`` is
      :math:`P_i`, each ``m x m`` matrix transposed and flattened row-major, so that ``lhs_i^T A_i`` is
      :math:`\tilde D_i^\top` (:class:`_MatrixScores`); ``A``: the same with the columns in the
      pattern's storage order (:meth:`BlockDiagonal.storage`), the same tensor when that is row-major;
    * ``pattern``: the block-diagonal ``(L, L)`` matrix of all :math:`\tilde D_i^\top` blocks
      (:class:`fedgat.matrix_poly.BlockDiagonal`), and ``k (L,)``: :math:`K_1` of each node, per head;
    * ``den (N H, L)``: :math:`K_3`; ``mix (rows H, L)``: :math:`\tilde K_2`, taking ``r`` to
      :math:`u_{(i,t),h} = \sum_x \tilde K_2[x, t]\, r_{i,h,x}`; ``row_sum (N, rows)``: ones. Their
      output rows are in ``encodings.nodes`` order.

    Sparse operators use int32 indices. Built on the encodings' device, once per encodings, dtype
    and head count.
    """

    def __init__(self, encodings: Encodings, dtype: torch.dtype, heads: int) -> None:
        H, dev = heads, encodings.device
        self.heads, self.A_rows, self.lhs_rows, segments = H, [], [], []
        er, ec, ev, dr, dc, dv, ur, uc, uv, sr, sc, ks = ([] for _ in range(12))
        row_off = vec_off = ext_off = 0
        for bucket in encodings.buckets:
            f, B, m = bucket.row_factors, len(bucket.bases), bucket.bases.m
            r = f.R.shape[1]
            m2t = f.M2.to(dtype).view(B, m, m, r).permute(0, 3, 2, 1).reshape(B, r, m * m)  # (x, y) -> (y, x)
            pt = bucket.plain["P"].to(dtype).transpose(1, 2).reshape(B, 1, m * m)
            self.A_rows.append(torch.cat([m2t, pt], dim=1).contiguous())
            self.lhs_rows.append(slice(ext_off, ext_off + B * (r + 1)))
            segments.append((B * H, m))
            row = row_off + torch.arange(B * r, device=dev).view(B, r)  # (i, t): rows of flat_R
            ext = ext_off + torch.arange(B * (r + 1), device=dev).view(B, r + 1)  # (i, t | self)
            er += [ext[:, :r].reshape(-1), ext[:, r:].expand(B, r).reshape(-1)]
            ec += [2 * row.reshape(-1), 2 * row.reshape(-1) + 1]
            ev += [torch.ones(B * r, dtype=dtype, device=dev), f.h_self.to(dtype).reshape(-1)]
            node = torch.from_numpy(bucket.bases.rows).long().to(dev)  # (B,) positions in encodings.nodes
            vec = vec_off + torch.arange(B * H * m, device=dev).view(B, H, m)  # (i, h, x)
            head = torch.arange(H, device=dev).view(1, H, 1)
            dr.append((node.view(B, 1, 1) * H + head).expand(B, H, m).reshape(-1))
            dc.append(vec.reshape(-1))
            dv.append(bucket.plain["K3"].to(dtype)[:, None, :].expand(B, H, m).reshape(-1))
            ur.append((row.view(B, 1, 1, r) * H + head[..., None]).expand(B, H, m, r).reshape(-1))
            uc.append(vec[..., None].expand(B, H, m, r).reshape(-1))
            uv.append(f.K2.to(dtype)[:, None].expand(B, H, m, r).reshape(-1))
            sr.append(node)
            sc.append(torch.full((B,), r, dtype=torch.int64, device=dev))
            ks.append(bucket.plain["K1"].to(dtype)[:, None, :].expand(B, H, m).reshape(-1))
            row_off, vec_off, ext_off = row_off + B * r, vec_off + B * H * m, ext_off + B * (r + 1)
        N, cat = encodings.num_nodes, torch.cat
        self.pattern = BlockDiagonal(segments, dev)
        self.A = [
            a if self.pattern.tile == 1 else self.pattern.storage(a.view(*a.shape[:2], m, m)).contiguous()
            for a, (_, m) in zip(self.A_rows, segments)
        ]
        self.k = cat(ks)
        index = sparse_index_dtype(len(cat(uc)))
        self.extend = _SparseOp(cat(er), cat(ec), cat(ev), (ext_off, 2 * row_off), index)
        self.den = _SparseOp(cat(dr), cat(dc), cat(dv), (N * H, vec_off), index)
        self.mix = _SparseOp(cat(ur), cat(uc), cat(uv), (row_off * H, vec_off), index)
        self.row_sum = _segment_sum(cat(sr), cat(sc), N, dtype)


#: (id of the encodings, dtype, device) -> (weak reference to them, plan); entries leave with the
#: encodings. :meth:`Encodings.to` returns a new object, so a plan is never shared across devices; the
#: device in the key keeps it so even for encodings moved in place by hand.
_PLANS: dict[tuple[int, torch.dtype, torch.device], tuple[weakref.ref, _VectorPlan]] = {}
#: the same for :class:`_MatrixPlan`, keyed also by the head count
_MATRIX_PLANS: dict[tuple[int, torch.dtype, torch.device, int], tuple[weakref.ref, _MatrixPlan]] = {}


def _cached(store: dict, key: tuple, encodings: Encodings, build):
    """``store[key]``'s plan for ``encodings``, else ``build()`` stored there until they are collected."""
    hit = store.get(key)
    if hit is not None and hit[0]() is encodings:
        return hit[1]
    plan = build()
    store[key] = (weakref.ref(encodings), plan)
    weakref.finalize(encodings, store.pop, key, None)
    return plan


def _vector_plan(encodings: Encodings, dtype: torch.dtype) -> _VectorPlan:
    """The cached :class:`_VectorPlan` of ``encodings`` (built on first use, on their device;
    encodings are not mutated)."""
    key = (id(encodings), dtype, encodings.device)
    return _cached(_PLANS, key, encodings, lambda: _VectorPlan(encodings, dtype))


def _matrix_plan(encodings: Encodings, dtype: torch.dtype, heads: int) -> _MatrixPlan:
    """The cached :class:`_MatrixPlan` of factorised matrix ``encodings`` (built on first use)."""
    key = (id(encodings), dtype, encodings.device, heads)
    return _cached(_MATRIX_PLANS, key, encodings, lambda: _MatrixPlan(encodings, dtype, heads))


def projected_rows(encodings: Encodings) -> torch.Tensor:
    """The rows :class:`FedGATConv` multiplies by ``W^T`` (its one large GEMM), ``(rows, d)``:
    ``V`` rows (vector), :class:`~fedgat.encodings.RowFactors` basis rows (factorised matrix), or
    ``K2`` and ``h_i`` rows (matrix, not factorised)."""
    if not encodings.kind.has_m2:
        return encodings.flat_K2
    if encodings.factorised:
        return encodings.flat_R
    return torch.cat([encodings.flat_K2, encodings.flat_h_self])


#: devices with the sparse CSR products of the factorised matrix path; elsewhere (``meta``) the layer
#: runs the padded dense path
_SPARSE_DEVICES = ("cpu", "cuda")


class FedGATConv(nn.Module):
    """Approximate first GAT layer evaluated from FedGAT encodings.

    Args:
        in_channels: feature dimension ``d``.
        out_channels: per-head output ``F``.
        heads: number of attention heads ``H``.
        concat: concatenate heads (``H*F`` outputs) or average them (``F``).
        score: the score polynomial; default :func:`fedgat.approx.fit_score` (LeakyReLU(0.2),
            degree 16, domain [-4, 4]).
        feature_dropout: dropout on the input-feature axis of ``W`` with one mask shared by all
            nodes; the only input dropout that commutes with the encodings (per-node masks would
            need the raw neighbour features).
        bias: add a learnable bias.

    Parameters are named like PyG's ``GATConv`` (``lin.weight``, ``att_src``, ``att_dst``, ``bias``)
    so weights copy across in both directions (:meth:`to_gatconv`).
    """

    _power: torch.Tensor  # buffer: the score polynomial's power-basis coefficients
    _dpower: torch.Tensor  # buffer: its derivative's, [c1, 2 c2, ...] (the off-CPU polynomial)
    _exponents: torch.Tensor  # buffer: [1, 2, ..., degree] (the off-CPU polynomial's powers)
    _power_coeffs: list[float]  # the same as Python floats (read every forward without a device sync)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        score: ScorePolynomial | None = None,
        feature_dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.in_channels, self.out_channels, self.heads, self.concat = (
            in_channels,
            out_channels,
            heads,
            concat,
        )
        self.score = score if score is not None else fit_score()
        self.feature_dropout = feature_dropout
        self.lin = nn.Linear(in_channels, heads * out_channels, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_channels))
        self.bias = (
            nn.Parameter(torch.empty(heads * out_channels if concat else out_channels)) if bias else None
        )
        self.register_buffer("_power", torch.tensor(self.score.power, dtype=torch.float64), persistent=False)
        self._power_coeffs = self._power.tolist()
        # p'(x)'s power-basis coefficients [c1, 2 c2, ..., (k-1) c_(k-1)], for the off-CPU polynomial
        degrees = torch.arange(1, len(self._power_coeffs), dtype=torch.float64)
        self.register_buffer("_dpower", self._power[1:] * degrees, persistent=False)
        self.register_buffer("_exponents", degrees, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.lin.weight)
        nn.init.xavier_uniform_(self.att_src)
        nn.init.xavier_uniform_(self.att_dst)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _head_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``W (H,F,d)``, ``b1 (H,d)``, ``b2 (H,d)``, ``gamma (H,)``."""
        weight = self.lin.weight
        if self.training and self.feature_dropout > 0:
            keep = torch.rand(self.in_channels, device=weight.device) >= self.feature_dropout
            weight = weight * keep / (1.0 - self.feature_dropout)
        W = weight.view(self.heads, self.out_channels, self.in_channels)
        # b1 and b2 as one product and their norms as one reduction: each op here is a kernel launch
        # forward and several backward, and a GPU epoch is bound by launches
        b = torch.einsum("shf,hfd->shd", torch.cat([self.att_dst, self.att_src]), W)  # (2, H, d)
        norms = torch.linalg.vector_norm(b, dim=-1)
        gamma = logit_scale(norms[0], norms[1], self.score.domain)
        return W, b[0], b[1], gamma

    def _power_list(self) -> list[float]:
        """The power-basis coefficients as floats, kept on the host: reading the buffer would copy it
        back from the GPU (a synchronisation) on every forward."""
        return self._power_coeffs

    def _attention_projection(self, rows_W: torch.Tensor) -> torch.Tensor:
        """``(R, 2, H)``: rows of ``X W^T`` (``(R, H*F)``) dotted with ``a_src`` and ``a_dst`` per head,
        as one small GEMM with a block-diagonal ``(H*F, 2H)`` matrix."""
        H, Fo = self.heads, self.out_channels
        eye = torch.eye(H, dtype=rows_W.dtype, device=rows_W.device)
        att = torch.stack([self.att_src[0], self.att_dst[0]])  # (2, H, F)
        block = torch.einsum("shf,hg->hfsg", att, eye).reshape(H * Fo, 2 * H)
        return (rows_W @ block).view(-1, 2, H)

    def _vector_outputs(self, encodings: Encodings, Wf: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
        r"""``(N, H, F)`` in ``encodings.nodes`` order:
        :math:`W V_i^\top Q_i \hat s(x_i) / \mathbf 1^\top \hat s(x_i)`.

        One GEMM ``V W^T`` over every bucket's rows; the logits come from it
        (:math:`V_i b_2 = (V_i W^\top) a_{src}`), and so does the self term, since
        :math:`Q_i^\top V_i = H_i` (orthonormal columns) puts :math:`h_i = H_i[0]` at
        :math:`Q_i[:, 0]^\top V_i`. Every per-node contraction with ``Q_i`` and every per-node sum
        is one product with a block-diagonal sparse matrix (:class:`_VectorPlan`, built once per
        encodings), so there is no padding and no per-bucket op; the scores run in float64.
        """
        H, Fo = self.heads, self.out_channels
        plan = _vector_plan(encodings, Wf.dtype)
        KW = encodings.flat_K2 @ Wf.T  # (rows, H*F)
        va = self._attention_projection(KW).double()  # (rows, 2, H): V_i b2, V_i b1
        qa = plan.gather(va.view(-1, 2 * H))  # (E, 2H): Q_i^T V_i b2 | Q_i^T V_i b1
        logits = (qa[:, :H] + _gather_rows(qa[:, H:], plan.first)) * gamma.double()  # (E, H)
        tables = (self._power, self._dpower, self._exponents) if _powers_on(logits.device) else (None,) * 3
        s = _Polynomial.apply(logits, self._power_list(), *tables)  # (E, H) float64
        z = plan.spread(s).to(KW.dtype)  # (rows, H): Q_i s_i
        num = plan.row_sum((z[:, :, None] * KW.view(-1, H, Fo)).view(-1, H * Fo))  # (N, H*F)
        den = plan.edge_sum(s).to(KW.dtype)  # (N, H)
        return num.view(-1, H, Fo) / den[:, :, None]

    def _factorised_outputs(
        self, encodings: Encodings, Wf: torch.Tensor, gamma: torch.Tensor
    ) -> torch.Tensor:
        r"""``(N, H, F)`` in ``encodings.nodes`` order for factorised matrix encodings, every node at once.

        One GEMM ``R W^T`` (``rows = sum_i n_i``) and its attention projections
        :math:`(R a_{src}, R a_{dst})`; then, with the :class:`_MatrixPlan` of the encodings,
        :math:`\tilde D_i^\top = (\gamma / a)(\tilde M_2 R b_2 + (\tilde h_i \cdot R b_1) P_i)^\top` for all
        nodes and heads as one block-diagonal sparse matrix (one batched matmul per bucket, no padding),
        Clenshaw as one sparse matrix-vector product per degree
        (:func:`fedgat.matrix_poly.clenshaw_blocks`), the denominator :math:`K_3^\top r` and the
        numerator :math:`W K_2^\top r = \sum_t u_t (R W^\top)_t` with :math:`u = \tilde K_2^\top r` as
        sparse products.
        """
        H, Fo = self.heads, self.out_channels
        plan = _matrix_plan(encodings, Wf.dtype, H)
        RW = encodings.flat_R @ Wf.T  # (rows, H*F)
        ra = self._attention_projection(RW)  # (rows, 2, H): R b2, R b1
        lhs = plan.extend(ra.view(-1, H)) * (gamma / self.score.domain)  # (rows + N, H): R b2, b1.h_i
        cheb = tuple(float(c) for c in self.score.cheb)
        r = _MatrixScores.apply(lhs, plan, cheb)  # (L,): (i, h, x)
        u = plan.mix(r).view(-1, H, 1)  # (rows, H, 1)
        num = plan.row_sum((u * RW.view(-1, H, Fo)).view(-1, H * Fo))  # (N, H*F)
        den = plan.den(r).view(-1, H, 1)
        return num.view(-1, H, Fo) / den

    def _matrix_parts(
        self, encodings: Encodings, Wf: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor, gamma: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        r"""Per bucket ``D (B, H, m, m)`` and ``K2 W^T`` as ``(B, m, H, F)``.

        :math:`D_i = \gamma((b_1\cdot h_i) P_i + \sum_s b_2(s) M_2(s))`. With :class:`RowFactors`
        the one GEMM is ``R W^T`` over ``n`` rows per node and everything else follows from it:
        :math:`K_2 W^\top = \tilde K_2 (R W^\top)`, :math:`\sum_s b_2(s) M_2(s) = \tilde M_2 (R b_2)`
        with :math:`R b_2 = (R W^\top) a_{src}`, and :math:`b_1 \cdot h_i = \tilde h_i \cdot (R b_1)`.
        """
        H, Fo = self.heads, self.out_channels
        buckets = encodings.buckets
        parts = []
        if encodings.factorised:
            RW = encodings.flat_R @ Wf.T  # (sum r, H*F)
            ra = self._attention_projection(RW)
            r_src, r_dst, RW = ra[:, 0], ra[:, 1], RW.view(-1, H, Fo)
            sizes = [b.row_factors.R.shape[0] * b.row_factors.R.shape[1] for b in buckets]
            for bucket, rw, rs, rd in zip(buckets, RW.split(sizes), r_src.split(sizes), r_dst.split(sizes)):
                f, B, m = bucket.row_factors, len(bucket.bases), bucket.bases.m
                r = f.R.shape[1]
                self_logit = torch.einsum("br,brh->bh", f.h_self, rd.view(B, r, H))
                m2b = f.M2 @ rs.view(B, r, H)  # (B, m*m, H)
                kw = (f.K2 @ rw.view(B, r, H * Fo)).view(B, m, H, Fo)
                parts.append((self_logit, m2b, kw))
        else:
            KW = (encodings.flat_K2 @ Wf.T).view(-1, H, Fo)
            self_logits = (encodings.flat_h_self @ b1.T).split([len(b.bases) for b in buckets])
            b2t = b2.T.contiguous()  # (d, H)
            kws = KW.split([len(b.bases) * b.bases.m for b in buckets])
            for bucket, self_logit, kw in zip(buckets, self_logits, kws):
                B, m = len(bucket.bases), bucket.bases.m
                b2b = b2t if bucket.cols is None else _gather_rows(b2t, bucket.cols)  # (d, H) | (B, k, H)
                M2 = bucket.M2 if bucket.M2 is not None else bucket.dense_M2()  # tests; training factorises
                parts.append((self_logit, M2 @ b2b, kw.view(B, m, H, Fo)))
        out = []
        for bucket, (self_logit, m2b, kw) in zip(buckets, parts):
            B, m = len(bucket.bases), bucket.bases.m
            P = bucket.plain["P"].to(kw.dtype)
            D = self_logit[:, :, None, None] * P[:, None] + m2b.transpose(1, 2).reshape(B, H, m, m)
            out.append((D * gamma[None, :, None, None], kw))
        return out

    def _matrix_outputs(self, encodings: Encodings, Wf, b1, b2, gamma) -> list[torch.Tensor]:
        r"""Per padded group ``(G, H, F)``: :math:`W K_2^\top r / K_3^\top r` with
        :math:`r^\top = K_1^\top \hat s(D_i)` by Clenshaw (:mod:`fedgat.matrix_poly`).

        Buckets are merged into a few zero-padded groups (:attr:`Encodings.padded_groups`): the
        recurrence is ``p`` small batched matmuls per group, and ~16 buckets would mean ~16x the calls.
        The path of unfactorised encodings, and of factorised ones where sparse products are missing
        (``meta``); factorised encodings otherwise take :meth:`_factorised_outputs`.
        """
        H = self.heads
        parts = self._matrix_parts(encodings, Wf, b1, b2, gamma)
        outs = []
        for group in encodings.padded_groups:
            chosen = parts[group.start : group.stop]
            m = group.m
            D = torch.cat([pad_last(D, m, 2) for D, _ in chosen])  # (G, H, m, m)
            kw = torch.cat([pad_last(kw.transpose(1, 3), m, 1) for _, kw in chosen])  # (G, F, H, m)
            G = D.shape[0]
            K1 = group.plain["K1"].to(D.dtype)[:, None, :].expand(G, H, m).reshape(G * H, m)
            r = chebyshev_left(D.reshape(G * H, m, m), K1, self.score.cheb, self.score.domain).view(G, H, m)
            den = (r * group.plain["K3"].to(D.dtype)[:, None, :]).sum(-1)  # (G, H)
            num = torch.einsum("ghm,gfhm->ghf", r, kw)
            outs.append(num / den[:, :, None])
        return outs

    def forward(self, encodings: Encodings) -> torch.Tensor:
        r"""``(num_nodes, H*F)`` (concat) or ``(num_nodes, F)`` outputs, rows in ``encodings.nodes`` order.

        The contraction with ``W`` runs as one GEMM over every node's encoding rows (``V`` rows for
        the vector variant; the :class:`~fedgat.encodings.RowFactors` basis rows, or ``K2`` and
        ``h_i`` when not factorised, for the matrix variant); the attention logits are then
        projections of it (:math:`V_i b_2 = (V_i W^\top) a_{src}`).
        """
        W, b1, b2, gamma = self._head_weights()
        H, Fo = self.heads, self.out_channels
        Wf = W.reshape(H * Fo, -1)
        if encodings.kind.has_m2 and encodings.factorised and encodings.device.type in _SPARSE_DEVICES:
            out = self._factorised_outputs(encodings, Wf, gamma)
        elif encodings.kind.has_m2:
            out = torch.cat(self._matrix_outputs(encodings, Wf, b1, b2, gamma))[encodings.order]
        else:
            out = self._vector_outputs(encodings, Wf, gamma)
        out = out.reshape(-1, H * Fo) if self.concat else out.mean(1)
        return out + self.bias if self.bias is not None else out

    @torch.no_grad()
    def to_gatconv(self) -> GATConv:
        """An exact PyG ``GATConv`` with this layer's weights (attention scaled by ``gamma``).

        Use it with the same neighbourhoods (self-loops included) and ``add_self_loops=False``.
        """
        conv = GATConv(
            self.in_channels,
            self.out_channels,
            heads=self.heads,
            concat=self.concat,
            add_self_loops=False,
            bias=self.bias is not None,
        )
        was_training = self.training
        self.eval()
        _, _, _, gamma = self._head_weights()
        self.train(was_training)
        conv.lin.weight.copy_(self.lin.weight)
        conv.att_src.copy_(self.att_src * gamma[None, :, None])
        conv.att_dst.copy_(self.att_dst * gamma[None, :, None])
        if self.bias is not None:
            conv.bias.copy_(self.bias)
        return conv

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, heads={self.heads}, concat={self.concat}, "
            f"degree={self.score.degree}, domain={self.score.domain:g}"
        )


def output_error_bound(layer: FedGATConv) -> float:
    """Our Theorem-2-type bound on ``max_i ||h'_i - GAT(h)_i||`` per head: ``||W_h||_2 * 2e/(m-e)``.

    ``e`` is the polynomial's sup error and ``m`` the score's minimum on the domain (unit-norm
    features give ``||W_h h_j|| <= ||W_h||_2``); see :func:`fedgat.approx.attention_error_bound`.
    """
    from fedgat.approx import attention_error_bound

    W = layer.lin.weight.detach().view(layer.heads, layer.out_channels, layer.in_channels)
    spectral = max(float(torch.linalg.matrix_norm(W[h], ord=2)) for h in range(layer.heads))
    bound = attention_error_bound(layer.score.sup_error, layer.score.score_min)
    return spectral * bound if math.isfinite(bound) else math.inf
