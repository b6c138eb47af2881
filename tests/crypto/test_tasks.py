"""How the server's work is cut, merged across recipients and reassembled (no SEAL involved)."""

import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedgat.crypto.tasks import NodeResult, interleaved, run_windowed, task_cost

CHUNKS = 3


def _task(node: int, rows: int, sources: int, last: bool = True):
    return (node, np.arange(sources), np.ones((rows, sources)), last)


def _batch_cost(batch) -> int:
    return sum(task_cost(t, CHUNKS) for t in batch)


# per key: a list of batches, each a list of (rows, sources) tasks
streams_st = st.dictionaries(
    st.integers(0, 20),
    st.lists(st.lists(st.tuples(st.integers(1, 8), st.integers(1, 6)), min_size=1, max_size=4), max_size=6),
    min_size=1,
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(streams_st, st.data())
def test_interleaved_keeps_each_keys_order_and_paces_keys_by_weight(spec, data):
    """The merge is a permutation of the batches that keeps each key's order, and every batch comes
    from the key that had drawn the least work per unit of weight among the keys with batches left
    (ties: the first key given)."""
    weights = {k: data.draw(st.floats(0.1, 10.0), label=f"weight {k}") for k in spec}
    streams = [(k, [[_task(k, r, n) for r, n in batch] for batch in batches]) for k, batches in spec.items()]
    merged = list(interleaved(streams, CHUNKS, weights))
    for k, batches in streams:
        assert [b for key, b in merged if key == k] == batches
    assert len(merged) == sum(len(b) for _, b in streams)
    drawn = dict.fromkeys(spec, 0.0)
    left = {k: len(b) for k, b in streams}
    order = [k for k, _ in streams]
    for key, batch in merged:
        candidates = [k for k in order if left[k]]
        best = min(drawn[k] for k in candidates)
        assert drawn[key] == best
        assert key == next(k for k in candidates if drawn[k] == best)
        drawn[key] += _batch_cost(batch) / weights[key]
        left[key] -= 1


def test_interleaved_with_whole_work_as_weights_ends_every_key_together():
    """Weighted by their whole work, a key with ten times the work draws ten batches for each of the
    small key's, so both run out at the end; unweighted, the small key runs out first."""
    big = [[_task(1, 1, 1)] for _ in range(40)]
    small = [[_task(2, 1, 1)] for _ in range(4)]
    weighted = [k for k, _ in interleaved([(1, big), (2, small)], CHUNKS, {1: 40, 2: 4})]
    last_small = len(weighted) - 1 - weighted[::-1].index(2)
    assert last_small >= len(weighted) - 11  # the small key's last batch is among the last ten
    plain = [k for k, _ in interleaved([(1, big), (2, small)], CHUNKS)]
    assert plain[:8] == [1, 2] * 4 and plain[8:] == [1] * 36


def test_interleaved_refuses_repeated_keys_and_weightless_keys():
    with pytest.raises(ValueError, match="each key once"):
        list(interleaved([(1, []), (1, [])], CHUNKS))
    with pytest.raises(ValueError, match="positive weight"):
        list(interleaved([(1, []), (2, [])], CHUNKS, {1: 1.0}))
    with pytest.raises(ValueError, match="positive weight"):
        list(interleaved([(1, [])], CHUNKS, {1: 0.0}))


def test_run_windowed_reassembles_each_keys_nodes_from_interleaved_pieces():
    """Group pieces of one key's node alternate with another key's pieces in submission order: each
    key's nodes still come back whole, rows in piece order, each key's nodes in its order, and never
    more than the window in flight."""
    pieces = {
        "a": [[(10, 0, False)], [(10, 1, True)], [(11, 0, True)]],
        "b": [[(20, 0, False)], [(20, 1, False)], [(20, 2, True)], [(21, 0, True)]],
    }
    order = [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("b", 2), ("a", 2), ("b", 3)]
    batches = [
        (key, [(node, np.arange(1), np.ones((1, 1)), last) for node, _, last in pieces[key][i]])
        for key, i in order
    ]
    piece_of = {id(b): pieces[key][i] for (key, i), (_, b) in zip(order, batches, strict=True)}

    def submit(key, batch):
        return [NodeResult(node, [f"{key}{node}.{p}".encode()]) for node, p, _ in piece_of[id(batch)]]

    window = types.SimpleNamespace(window=2, max_in_flight=0)
    out = list(run_windowed(window, batches, submit, lambda handle: handle))
    assert [(k, r.node, r.row_blobs) for k, r in out] == [
        ("a", 10, [b"a10.0", b"a10.1"]),
        ("b", 20, [b"b20.0", b"b20.1", b"b20.2"]),
        ("a", 11, [b"a11.0"]),
        ("b", 21, [b"b21.0"]),
    ]
    assert window.max_in_flight == 2
