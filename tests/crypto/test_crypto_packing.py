"""Slot layout: plaintext properties (fast, hypothesis-driven)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedgat.crypto import SlotLayout


@pytest.mark.parametrize(
    "slots, chunks, blocks, utilisation", [(2048, 3, 4, 0.9330), (4096, 3, 8, 0.9330), (8192, 2, 11, 0.9621)]
)
def test_cora_layouts(slots: int, chunks: int, blocks: int, utilisation: float) -> None:
    lay = SlotLayout.for_dimension(1433, slots)
    assert (lay.chunks, lay.blocks) == (chunks, blocks)
    assert lay.utilisation() == pytest.approx(utilisation, abs=1e-4)
    assert lay.utilisation() >= 0.9


def test_single_upload_bound_is_70_percent() -> None:
    """One ciphertext per node caps utilisation at floor(S/d) d / S (module docstring)."""
    for slots in (2048, 4096):
        lay = SlotLayout(1433, slots, 1)
        assert lay.utilisation() == pytest.approx((slots // 1433) * 1433 / slots)
        assert lay.utilisation() < 0.71


def test_layout_table() -> None:
    table = {
        (2048, 1): (1, 0.700),
        (2048, 2): (2, 0.700),
        (2048, 5): (7, 0.980),
        (4096, 1): (2, 0.700),
        (4096, 2): (5, 0.875),
        (4096, 4): (11, 0.962),
        (8192, 1): (5, 0.875),
        (8192, 3): (17, 0.991),
    }
    for (slots, c), (k, u) in table.items():
        lay = SlotLayout(1433, slots, c)
        assert lay.blocks == k
        assert lay.utilisation() == pytest.approx(u, abs=1e-3)


def test_large_dimension_needs_chunks() -> None:
    with pytest.raises(ValueError):
        SlotLayout(3703, 2048, 1)
    lay = SlotLayout.for_dimension(3703, 2048)
    assert lay.width <= 2048 and lay.chunks >= 2


def test_traffic_choice() -> None:
    # Cora vector encodings at n4096: few output rows per node -> c = 1 moves fewer bytes
    kw = {"fresh_bytes": 85_066, "result_bytes": 47_178}
    vec = SlotLayout.for_traffic(1433, 2048, n_inputs=2708, n_outputs=26_528, **kw)
    assert vec.chunks == 1
    mat = SlotLayout.for_traffic(1433, 2048, n_inputs=2708, n_outputs=556_000, **kw)
    assert mat.utilisation() > 0.9
    assert SlotLayout(1433, 2048, 3).traffic(10, 9) == (30, 9)


@st.composite
def layouts(draw):
    slots = draw(st.sampled_from([16, 64, 256, 2048]))
    d = draw(st.integers(1, 3 * slots))
    lo = -(-d // slots)
    chunks = draw(st.integers(lo, min(d, lo + 6)))
    return SlotLayout(d, slots, chunks)


@settings(max_examples=60, deadline=None)
@given(lay=layouts(), n=st.integers(1, 9), seed=st.integers(0, 2**32 - 1))
def test_pack_roundtrips(lay: SlotLayout, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, lay.d))
    packed = lay.pack(x)
    assert len(packed) == n * lay.chunks and all(v.shape == (lay.slots,) for v in packed)
    np.testing.assert_array_equal(lay.unpack(packed, n, average=False), x)
    np.testing.assert_allclose(lay.unpack(packed, n), x)
    blocks = lay.pack_blocks(x)
    assert len(blocks) == lay.groups(n) * lay.chunks
    np.testing.assert_array_equal(lay.unpack_blocks(blocks, n), x)
    # every real feature occupies one slot per row in the blocked layout
    assert sum(int(np.count_nonzero(v)) for v in blocks) == np.count_nonzero(x)


@settings(max_examples=60, deadline=None)
@given(lay=layouts(), n_src=st.integers(1, 8), m=st.integers(1, 12), seed=st.integers(0, 2**32 - 1))
def test_rotation_free_identity(lay: SlotLayout, n_src: int, m: int, seed: int) -> None:
    """sum_j pack(H)[j, ch] * broadcast(Q[group, j]) == pack_blocks(Q @ H)[group, ch], slot-wise:
    the identity the server evaluates under encryption, with no slot movement."""
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((n_src, lay.d))
    q = rng.uniform(-1, 1, (m, n_src))
    up = lay.pack(h)
    expected = lay.pack_blocks(q @ h)
    k, c = lay.blocks, lay.chunks
    for g in range(lay.groups(m)):
        coeffs = lay.broadcast(q[g * k : (g + 1) * k].T)  # (n_src, slots)
        for ch in range(c):
            got = sum(up[j * c + ch] * coeffs[j] for j in range(n_src))
            np.testing.assert_allclose(got, expected[g * c + ch], atol=1e-12)


def test_broadcast_shapes() -> None:
    lay = SlotLayout(5, 16, 1)  # width 5, 3 blocks, tail of 1
    v = lay.broadcast(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(v, [1] * 5 + [2] * 5 + [0] * 6)
    with pytest.raises(ValueError):
        lay.broadcast(np.ones(4))


@settings(max_examples=60, deadline=None)
@given(lay=layouts(), data=st.data())
def test_broadcast_list_is_the_broadcast_vector(lay: SlotLayout, data) -> None:
    """The list the server's encoder takes (built by list repetition) holds exactly the slot values
    of :meth:`SlotLayout.broadcast`, for any number of block values up to ``k``."""
    n = data.draw(st.integers(0, lay.blocks))
    vals = data.draw(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=n, max_size=n))
    got = lay.broadcast_list(np.array(vals))
    assert len(got) == lay.slots and all(type(v) is float for v in got)
    assert got == lay.broadcast(np.array(vals, dtype=np.float64).reshape(-1)).tolist()
    with pytest.raises(ValueError, match="at most"):
        lay.broadcast_list(np.zeros(lay.blocks + 1))


@settings(max_examples=80, deadline=None)
@given(lay=layouts(), rows=st.integers(1, 40), data=st.data())
def test_packed_items_share_one_tail_group_and_unpack(lay: SlotLayout, rows: int, data) -> None:
    """Up to ``pack_size`` items of ``rows`` rows: each item's whole groups, then every tail in one
    group, so a packed result is never more groups than the items apart and ``count - 1`` fewer
    when they have tails; every group holds rows of one item only, except that last one."""
    size = lay.pack_size(rows)
    count = data.draw(st.integers(1, size))
    k, tail = lay.blocks, rows % lay.blocks
    assert size == (k // tail if tail else 1) and size * tail <= max(k, tail)
    order = lay.packed_order(count, rows)
    assert sorted(order.tolist()) == list(range(count * rows))  # a permutation
    groups = lay.packed_groups(count, rows)
    assert groups == lay.groups(count * rows)  # the tails fit one group
    assert groups == count * lay.groups(rows) - (count - 1 if tail else 0)
    item = order // rows
    for g in range(groups - (1 if tail else 0)):
        assert len(set(item[g * k : (g + 1) * k].tolist())) == 1
    x = np.random.default_rng(rows).standard_normal((count * rows, 3))
    np.testing.assert_array_equal(lay.unpack_items(x[order], count, rows), x.reshape(count, rows, 3))
    with pytest.raises(ValueError, match="do not pack"):
        lay.packed_groups(size + 1, rows)


def test_pack_maps_add_a_source_listed_twice_as_the_items_own_map_does() -> None:
    """``Q @ H`` of a packed map equals each item's own map, also when an item lists a source twice
    (its two coefficients add, as :func:`~fedgat.crypto.evaluator.SealEvaluator.linear_map` adds them)."""
    from fedgat.crypto.encodings import pack_maps

    lay = SlotLayout(3, 16, 1)  # width 3, k = 5 blocks
    rows = 2  # tail 2: two items per pack
    sources = [np.array([5, 5, 9]), np.array([7, 9])]
    coef = [np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), np.array([[7.0, 8.0], [9.0, 1.0]])]
    keys, q = pack_maps(lay, sources, coef)
    h = np.random.default_rng(0).standard_normal((10, 3))
    got = lay.unpack_items(q @ h[keys], 2, rows)
    for i in range(2):
        np.testing.assert_allclose(got[i], coef[i] @ h[sources[i]])
