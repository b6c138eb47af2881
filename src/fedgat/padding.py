r"""Zero-padded groups of encoding buckets, so the layer runs a few large batched ops instead of one
set per neighbourhood size (:attr:`fedgat.encodings.Encodings.padded_groups`).

Buckets are ordered by ``m``; :func:`plan_padded_groups` merges consecutive ones into groups padded
to the group's largest ``m`` (exact dynamic programme over the padded work, ``m ** pad_power`` per
node, :attr:`fedgat.variants.Variant.pad_power`), and :func:`padded_groups` pads each group's
feature-free tensors (:meth:`fedgat.variants.Variant.plain`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from fedgat.encodings import EncodingBucket
    from fedgat.variants import Variant

__all__ = ["GROUP_CALL_COST", "PaddedGroup", "pad_last", "padded_groups", "plan_padded_groups"]


@dataclass
class PaddedGroup:
    """Buckets ``start:stop`` zero-padded to encoding dimension ``m``, their feature-free tensors in
    ``plain``: matrix ``P (G, m, m)``, ``K1 (G, m)``, ``K3 (G, m)``; vector ``Q (G, m, n)`` (float64)
    and ``valid (G, n)``, false at padded neighbour positions.

    Zero padding is exact: matrix -- padded coordinates of ``K1`` and padded rows and columns of
    every ``D`` are zero, so Clenshaw's iterates stay zero there; vector -- padded columns of ``Q``
    are zero, so padded scores reach neither ``Q s`` nor, masked by ``valid``, the denominator.
    """

    start: int
    stop: int
    m: int
    plain: dict[str, torch.Tensor]


#: Cost of one more group in the padding plan, in padded entries (``m^2`` per node for the matrix
#: variant, ``m`` for the vector variant): the ~10 small tensor ops per Clenshaw step, or per vector
#: group, cost about as much as streaming that many entries (tuned on Cora).
GROUP_CALL_COST = {2: 20_000, 1: 2_000}


def plan_padded_groups(
    sizes: list[int], counts: list[int], call_cost: int | None = None, power: int = 2
) -> list[tuple[int, int]]:
    """Split buckets (``sizes`` ascending) into consecutive ``[start, stop)`` groups minimising
    ``sum_g count_g * max_size_g ** power + call_cost * groups`` (exact dynamic programme)."""
    call_cost = GROUP_CALL_COST[power] if call_cost is None else call_cost
    n = len(sizes)
    if list(sizes) != sorted(sizes):
        raise ValueError("bucket sizes must be ascending")
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for stop in range(1, n + 1):
        for start in range(stop):
            cost = best[start] + sum(counts[start:stop]) * sizes[stop - 1] ** power + call_cost
            if cost < best[stop]:
                best[stop], cut[stop] = cost, start
    groups, stop = [], n
    while stop > 0:
        groups.append((cut[stop], stop))
        stop = cut[stop]
    return groups[::-1]


def pad_last(t: torch.Tensor, m: int, dims: int) -> torch.Tensor:
    """Zero-pad the last ``dims`` dimensions of ``t`` to size ``m`` (no copy when already that size)."""
    if all(size == m for size in t.shape[t.dim() - dims :]):
        return t
    pad = []
    for size in reversed(t.shape[t.dim() - dims :]):
        pad += [0, m - size]
    return torch.nn.functional.pad(t, pad)


def padded_groups(buckets: Sequence[EncodingBucket], kind: Variant) -> list[PaddedGroup]:
    """Consecutive ``buckets`` (``m`` ascending) of variant ``kind`` merged into a few groups,
    zero-padded to a common ``m`` (and ``n``), on the buckets' device."""
    sizes = [b.bases.m for b in buckets]
    counts = [len(b.bases) for b in buckets]
    groups = []
    for start, stop in plan_padded_groups(sizes, counts, power=kind.pad_power):
        chosen = buckets[start:stop]
        m, n, dtype = sizes[stop - 1], chosen[-1].bases.n, chosen[0].K2.dtype
        if kind.has_m2:
            plain = {
                "P": torch.cat([pad_last(b.plain["P"].to(dtype), m, 2) for b in chosen]),
                "K1": torch.cat([pad_last(b.plain["K1"].to(dtype), m, 1) for b in chosen]),
                "K3": torch.cat([pad_last(b.plain["K3"].to(dtype), m, 1) for b in chosen]),
            }
        else:
            Q = [torch.nn.functional.pad(b.plain["Q"], [0, n - b.bases.n, 0, m - b.bases.m]) for b in chosen]
            arange = torch.arange(n, device=chosen[0].K2.device)
            valid = [arange[None, :].expand(len(b.bases), n) < b.bases.n for b in chosen]
            plain = {"Q": torch.cat(Q), "valid": torch.cat(valid)}
        groups.append(PaddedGroup(start, stop, m, plain))
    return groups
