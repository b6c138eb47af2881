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
"""

from __future__ import annotations

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
