r"""Row vector times a Chebyshev series of a batch of matrices, with a hand-written backward.

The matrix FedGAT layer needs :math:`r^\top = k^\top \hat s(D)` for every node and head, where
:math:`\hat s(x) = \sum_{k=0}^{p} c_k T_k(x / a)` (:attr:`fedgat.approx.ScorePolynomial.cheb`).
Clenshaw's recurrence in row-vector form, with :math:`\tilde D = D / a`,

.. math::
    b_{p+1} = b_{p+2} = 0,\quad b_k^\top = c_k k^\top + 2 b_{k+1}^\top \tilde D - b_{k+2}^\top
    \;(k = p, \dots, 1),\quad r^\top = c_0 k^\top + b_1^\top \tilde D - b_2^\top,

costs :math:`p` matrix-vector products and, unlike Horner's rule on the power coefficients
(whose terms reach :math:`\sum_n |c_n| a^n \approx 10^3` at degree 16 and lose ~4e-4 in float32), is
stable in float32. Polynomials in one matrix commute, so it is exact for matrices.

Backward, with :math:`g = \partial L / \partial r` and :math:`\beta_k = \partial L / \partial b_k`:
:math:`\beta_1^\top = g^\top \tilde D^\top`, :math:`\beta_2^\top = 2\beta_1^\top \tilde D^\top - g^\top`,
:math:`\beta_k^\top = 2\beta_{k-1}^\top \tilde D^\top - \beta_{k-2}^\top`, and

.. math::
    \partial L / \partial \tilde D = b_1 g^\top + 2\sum_{k=1}^{p-1} b_{k+1} \beta_k^\top ,

one batched matmul of the stacked :math:`b` against the stacked adjoints instead of :math:`p`
separate rank-one updates of a ``(G, m, m)`` tensor (what autograd would record).

:func:`chebyshev_left` takes a batch of equal-sized matrices; :func:`chebyshev_left_blocks` (and
:func:`clenshaw_blocks`, :func:`clenshaw_blocks_grad`, which the factorised matrix layer calls inside its
own autograd node) takes blocks of any sizes as one block-diagonal sparse matrix
(:class:`BlockDiagonal`): one sparse matrix-vector product per degree, no padding. Small batched
matmuls with one row per matrix run far below memory speed on the CPU (torch's fallback loop below
400 multiply-adds per matrix), which made the padded recurrence the matrix layer's largest cost.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch


class _ChebyshevLeft(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, D: torch.Tensor, k: torch.Tensor, cheb: tuple[float, ...], domain: float
    ) -> torch.Tensor:
        Dt = D / domain
        p = len(cheb) - 1
        b1 = torch.zeros_like(k).unsqueeze(1)  # b_{k+1}, (G, 1, m)
        b2 = torch.zeros_like(b1)  # b_{k+2}
        k_row = k.unsqueeze(1)
        stack = []  # b_p, ..., b_1
        for i in range(p, 0, -1):
            b1, b2 = torch.baddbmm(k_row * cheb[i] - b2, b1, Dt, alpha=2.0), b1
            stack.append(b1)
        r = torch.baddbmm(k_row * cheb[0] - b2, b1, Dt).squeeze(1)
        bs = torch.cat(stack[::-1], 1) if stack else k_row[:, :0]  # (G, p, m): b_1 .. b_p
        ctx.save_for_backward(Dt, bs)
        ctx.domain = domain
        return r

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        Dt, bs = ctx.saved_tensors
        p = bs.shape[1]
        if p == 0 or not ctx.needs_input_grad[0]:
            return None, None, None, None
        DtT = Dt.transpose(1, 2)
        g = g.unsqueeze(1)
        adjoints = [g]  # g, 2 beta_1, ..., 2 beta_{p-1}
        prev2, prev = None, torch.bmm(g, DtT)  # beta_1
        for i in range(2, p + 1):
            adjoints.append(2.0 * prev)
            if i < p:  # beta_i; beta_p is never needed
                prev2, prev = prev, torch.baddbmm(-(g if i == 2 else prev2), prev, DtT, alpha=2.0)
        grad = torch.bmm(bs.transpose(1, 2), torch.cat(adjoints, 1))  # (G, m, m)
        return grad / ctx.domain, None, None, None


def chebyshev_left(D: torch.Tensor, k: torch.Tensor, cheb: np.ndarray, domain: float) -> torch.Tensor:
    r"""``(G, m)`` rows :math:`k_g^\top \sum_n \mathrm{cheb}_n T_n(D_g / a)` for ``D (G, m, m)``, ``k (G, m)``.

    Differentiable in ``D`` (not in ``k``); float32 is accurate to ~1e-6 relative for the scores
    FedGAT uses (tested against float64 Horner).
    """
    if (
        D.dim() != 3
        or k.dim() != 2
        or D.shape[0] != k.shape[0]
        or D.shape[1] != D.shape[2]
        or D.shape[2] != k.shape[1]
    ):
        raise ValueError(f"expected D (G, m, m) and k (G, m); got {tuple(D.shape)} and {tuple(k.shape)}")
    return _ChebyshevLeft.apply(D, k.to(D.dtype), tuple(float(c) for c in cheb), float(domain))


#: Values per sparse matrix in :class:`BlockDiagonal` (``2^22``, 16 MiB of float32): the recurrence runs
#: chunk by chunk, ``p`` products per chunk, and each product call has a fixed cost (~0.1 ms on a 2-core
#: Xeon VM). There the whole factorised layer on Cora (2.57 M values: one chunk) ran 12 % / 5 % faster at
#: 1 / 2 threads than in the earlier 2 MiB chunks, which on a 2-core EPYC (8 MiB L3) had been within noise.
CHUNK_VALUES = 1 << 22


def sparse_index_dtype(nnz: int) -> torch.dtype:
    """The index dtype of a sparse matrix with ``nnz`` entries (or that many rows): int32 where it fits,
    which spares the sparse BLAS a conversion of the indices on every product."""
    return torch.int32 if nnz < 2**31 else torch.int64


class _SparsePart:
    """Index arrays of a run of whole blocks of a :class:`BlockDiagonal`, as its own square matrix."""

    def __init__(self, segments: list[tuple[int, int]], tile: int, device: torch.device) -> None:
        self.size = sum(c * m for c, m in segments)
        self.tile = tile
        nnz = sum(c * m * m for c, m in segments)
        index = sparse_index_dtype(nnz)
        cols, lengths, start = [], [], 0
        for count, m in segments:
            k = m // tile  # tiles per block side
            first = start + k * torch.arange(count, device=device)  # first tile column of each block
            block = first[:, None, None] + torch.arange(k, device=device)
            cols.append(block.expand(count, k, k).reshape(-1))
            lengths.append(torch.full((count * k,), k, device=device))
            start += count * k
        zero = torch.zeros(1, dtype=torch.int64, device=device)
        self.crow = torch.cat([zero, *lengths]).cumsum(0).to(index)
        self.col = torch.cat([zero[:0], *cols]).to(index)

    def matrix(self, values: torch.Tensor) -> torch.Tensor:
        """The sparse matrix with these values in storage order (no copy, no invariant check)."""
        shape, t = (self.size, self.size), self.tile
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Sparse (CSR|BSR) tensor support is in beta", UserWarning)
            if t == 1:
                return torch.sparse_csr_tensor(self.crow, self.col, values, shape, check_invariants=False)
            return torch.sparse_bsr_tensor(
                self.crow, self.col, values.view(-1, t, t), shape, check_invariants=False
            )


class BlockDiagonal:
    r"""The sparsity pattern of a block-diagonal ``(L, L)`` matrix of dense square blocks.

    ``segments`` lists ``(count, m)``: ``count`` consecutive ``m x m`` blocks, so ``L = sum count * m``
    and there are ``nnz = sum count * m^2`` values, block after block. On the CPU, when every ``m`` is
    even (FedGAT's ``m = 2n``), the matrix is stored as BSR with ``2 x 2`` tiles (:attr:`tile`; a
    quarter of CSR's column indices, and measured ~25% faster per product than CSR on Cora); otherwise
    as CSR (``tile = 1``). Within a block the values are then in *storage order*: tile rows, tile
    columns, then the tile row-major (:meth:`storage` converts from row-major; for ``tile = 1`` the two
    orders agree). Indices are int32 (the sparse BLAS's; int64 would be converted per product).

    The blocks are cut into :attr:`chunks` of at most ``chunk_values`` values (at least one block):
    ``(rows, values, part)``, the slices of the length-``L`` vectors and of the value array a chunk
    covers, and its own sparse matrix (``part.matrix(values[values_slice])``). Blocks are independent,
    so the recurrence runs chunk by chunk (:func:`clenshaw_blocks`).
    """

    def __init__(
        self,
        segments: list[tuple[int, int]],
        device: torch.device | str = "cpu",
        chunk_values: int = CHUNK_VALUES,
    ) -> None:
        device = torch.device(device)
        self.segments = [(int(c), int(m)) for c, m in segments]
        self.size = sum(c * m for c, m in self.segments)
        self.nnz = sum(c * m * m for c, m in self.segments)
        even = all(m % 2 == 0 for _, m in self.segments)
        self.tile = 2 if even and device.type == "cpu" else 1
        self.chunks: list[tuple[slice, slice, _SparsePart]] = []
        run: list[tuple[int, int]] = []
        row = value = run_values = 0

        def close() -> None:
            nonlocal row, value, run, run_values
            size = sum(c * m for c, m in run)
            part = _SparsePart(run, self.tile, device)
            self.chunks.append((slice(row, row + size), slice(value, value + run_values), part))
            row, value, run, run_values = row + size, value + run_values, [], 0

        for count, m in self.segments:
            while count:
                take = min(count, max(1, (chunk_values - run_values) // (m * m)))
                if run and run_values + take * m * m > chunk_values:
                    close()
                    continue
                run.append((take, m))
                run_values += take * m * m
                count -= take
        if run or not self.chunks:
            close()

    def storage(self, blocks: torch.Tensor) -> torch.Tensor:
        """``(..., m, m)`` row-major blocks as ``(..., m*m)`` in storage order (a view for ``tile = 1``)."""
        *lead, m, _ = blocks.shape
        k, t = m // self.tile, self.tile
        return blocks.reshape(*lead, k, t, k, t).transpose(-3, -2).reshape(*lead, m * m)

    def value_blocks(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Per segment, the ``(count, m*m)`` view of ``(nnz,)`` values."""
        out, start = [], 0
        for count, m in self.segments:
            out.append(values[start : start + count * m * m].view(count, m * m))
            start += count * m * m
        return out

    def vector_blocks(self, stack: torch.Tensor) -> list[torch.Tensor]:
        """Per segment, the ``(count, p, m)`` view of ``p`` stacked length-``L`` vectors ``(p, L)``."""
        out, start = [], 0
        for count, m in self.segments:
            out.append(stack[:, start : start + count * m].view(-1, count, m).transpose(0, 1))
            start += count * m
        return out

    def transpose_values(self, values: torch.Tensor) -> torch.Tensor:
        """The values of the transposed matrix (every block transposed), a new ``(nnz,)`` tensor.

        With ``2 x 2`` tiles the tile grid is transposed moving whole tiles (a tile's four floats
        viewed as one 16-byte complex number; a permuted copy of single floats runs ~4x slower), then
        the off-diagonal entries of every tile are swapped."""
        out = torch.empty_like(values)
        if self.tile == 1:
            for (_, m), src, dst in zip(self.segments, self.value_blocks(values), self.value_blocks(out)):
                dst.view(-1, m, m).copy_(src.view(-1, m, m).transpose(1, 2))
            return out
        wide = {torch.float32: torch.complex128, torch.float64: None}.get(values.dtype)
        for (_, m), src, dst in zip(self.segments, self.value_blocks(values), self.value_blocks(out)):
            k = m // 2
            if wide is None:  # no 16-byte type to move a float64 tile as one element
                dst.view(-1, k, k, 2, 2).copy_(src.view(-1, k, k, 2, 2).permute(0, 2, 1, 4, 3))
                continue
            dst.view(wide).view(-1, k, k).copy_(src.view(wide).view(-1, k, k).transpose(1, 2))
        if wide is not None:
            tiles = out.view(-1, 4)  # (row 0, row 1) of each tile: swap entries (0, 1) and (1, 0)
            upper = tiles[:, 1].clone()
            tiles[:, 1] = tiles[:, 2]
            tiles[:, 2] = upper
        return out


def clenshaw_blocks(
    pattern: BlockDiagonal, values_t: torch.Tensor, k: torch.Tensor, cheb: tuple[float, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The recurrence of the module docstring for every block of a block-diagonal :math:`\tilde D` at
    once: ``(r (L,), bs (p, L))`` with ``bs`` the iterates :math:`b_1, \dots, b_p`, given the values
    ``values_t`` of :math:`\tilde D^\top` (storage order), so that the row-vector step
    :math:`b^\top \tilde D` is the sparse product :math:`\tilde D^\top b`: one product and one
    axpy per degree, written in place."""
    p = len(cheb) - 1
    bs = k.new_empty(p, k.shape[0])
    if p == 0:
        return k * cheb[0], bs
    r = k.new_empty(k.shape)
    for rows, values, part in pattern.chunks:
        DT, kc, b = part.matrix(values_t[values]), k[rows], bs[:, rows]
        torch.mul(kc, cheb[p], out=b[p - 1])
        for i in range(p - 1, -1, -1):  # b[i] is b_{i+1}; b[i+1] is b_{i+2} (b_{p+1} = 0)
            out = b[i - 1] if i else r[rows]
            if i == p - 1:
                torch.addmv(kc, DT, b[i], beta=cheb[i], alpha=2.0 if i else 1.0, out=out)
            else:
                torch.addmv(b[i + 1], DT, b[i], beta=-1.0, alpha=2.0 if i else 1.0, out=out)
                out.add_(kc, alpha=cheb[i])
    return r, bs


def clenshaw_blocks_grad(
    pattern: BlockDiagonal, values_t: torch.Tensor, bs: torch.Tensor, g: torch.Tensor
) -> torch.Tensor:
    r"""``(nnz,)``: :math:`\partial L / \partial \tilde D^\top` for :func:`clenshaw_blocks`, given
    :math:`g = \partial L / \partial r`, each block *row-major* (not storage order). The adjoints
    :math:`\beta_k` (module docstring) are products with :math:`\tilde D` (the block-transposed
    values); then per segment one batched matmul
    :math:`2 \sum_{k=0}^{p-1} a_k b_{k+1}^\top` with :math:`a_0 = g / 2`, :math:`a_k = \beta_k`."""
    p = bs.shape[0]
    adj = g.new_empty(p, g.shape[0])  # g / 2, beta_1, ..., beta_{p-1}
    torch.mul(g, 0.5, out=adj[0])
    if p >= 2:
        values = pattern.transpose_values(values_t)
        for rows, chunk, part in pattern.chunks:
            D, gc, a = part.matrix(values[chunk]), g[rows], adj[:, rows]
            torch.mv(D, gc, out=a[1])
            for i in range(2, p):  # beta_i = 2 D beta_{i-1} - beta_{i-2}, beta_0 = g; beta_p is never needed
                torch.addmv(gc if i == 2 else a[i - 2], D, a[i - 1], beta=-1.0, alpha=2.0, out=a[i])
    grad = torch.empty_like(values_t)
    for (count, m), out, a, b in zip(
        pattern.segments, pattern.value_blocks(grad), pattern.vector_blocks(adj), pattern.vector_blocks(bs)
    ):
        blocks = out.view(count, m, m)
        torch.baddbmm(blocks, a.transpose(1, 2), b, beta=0.0, alpha=2.0, out=blocks)
    return grad


class _ChebyshevBlocks(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, values_t: torch.Tensor, pattern: BlockDiagonal, k: torch.Tensor, cheb: tuple[float, ...]
    ) -> torch.Tensor:
        r, bs = clenshaw_blocks(pattern, values_t, k, cheb)
        ctx.save_for_backward(values_t, bs)
        ctx.pattern = pattern
        return r

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        values_t, bs = ctx.saved_tensors
        pattern: BlockDiagonal = ctx.pattern
        if bs.shape[0] == 0 or not ctx.needs_input_grad[0]:
            return None, None, None, None
        rows = clenshaw_blocks_grad(pattern, values_t, bs, g.contiguous())
        if pattern.tile == 1:
            return rows, None, None, None
        grad = torch.empty_like(rows)
        for (_, m), src, dst in zip(pattern.segments, pattern.value_blocks(rows), pattern.value_blocks(grad)):
            dst.copy_(pattern.storage(src.view(-1, m, m)))
        return grad, None, None, None


def chebyshev_left_blocks(
    values_t: torch.Tensor, pattern: BlockDiagonal, k: torch.Tensor, cheb: np.ndarray
) -> torch.Tensor:
    r"""``(L,)``: :math:`k^\top \sum_n \mathrm{cheb}_n T_n(\tilde D)` block by block, for the
    block-diagonal :math:`\tilde D` whose *transpose* has the ``(nnz,)`` values ``values_t``
    (:class:`BlockDiagonal` storage order) and ``k (L,)``: :func:`chebyshev_left` on every block at
    once (blocks of any sizes, no padding), with :math:`\tilde D` already divided by the domain.

    One sparse matrix-vector product per degree (and per degree in the backward) replaces a batched
    matmul per block size; differentiable in ``values_t`` (not in ``k``). The factorised matrix layer
    runs the same recurrence (:func:`clenshaw_blocks`, :func:`clenshaw_blocks_grad`) inside its own
    autograd node, building the values itself.
    """
    if values_t.shape != (pattern.nnz,) or k.shape != (pattern.size,):
        raise ValueError(
            f"expected values ({pattern.nnz},) and k ({pattern.size},); "
            f"got {tuple(values_t.shape)} and {tuple(k.shape)}"
        )
    return _ChebyshevBlocks.apply(
        values_t.contiguous(), pattern, k.to(values_t.dtype).contiguous(), tuple(float(c) for c in cheb)
    )
