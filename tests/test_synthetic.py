"""The synthetic graph generator: structure, homophily, splits, reproducibility, speed."""

import time

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from fedgat.synthetic import synthetic_graph


def _structure_ok(g):
    ei = g.edge_index.numpy()
    n = g.num_nodes
    assert not (ei[0] == ei[1]).any()
    keys = ei[0] * n + ei[1]
    assert len(np.unique(keys)) == len(keys)
    assert set(keys) == set(ei[1] * n + ei[0])


def test_shapes_types_and_structure(small_graph):
    g = small_graph
    assert g.name == "synthetic" and g.num_classes == 4
    assert g.x.shape == (300, 16) and g.x.dtype == torch.float32 and g.y.dtype == torch.int64
    assert torch.allclose(g.x.norm(dim=1), torch.ones(300), atol=1e-5)
    assert np.bincount(g.y.numpy()).tolist() == [75] * 4
    _structure_ok(g)


@pytest.mark.parametrize("homophily", [0.0, 0.3, 0.8, 1.0])
def test_degree_and_homophily(homophily):
    g = synthetic_graph(num_nodes=4000, avg_degree=6.0, homophily=homophily, seed=1)
    _structure_ok(g)
    ei, y = g.edge_index.numpy(), g.y.numpy()
    assert ei.shape[1] / g.num_nodes == pytest.approx(6.0, abs=1e-3)
    assert (y[ei[0]] == y[ei[1]]).mean() == pytest.approx(homophily, abs=0.03)


def test_splits_are_planetoid_like(small_graph):
    tr, va, te = (m.numpy() for m in (small_graph.train_mask, small_graph.val_mask, small_graph.test_mask))
    assert (tr.sum(), va.sum(), te.sum()) == (40, 50, 100)
    assert not (tr & va).any() and not (tr & te).any() and not (va & te).any()
    assert np.bincount(small_graph.y.numpy()[tr]).tolist() == [10] * 4


def test_reproducible_and_seed_dependent():
    a, b, c = (
        synthetic_graph(num_nodes=200, train_per_class=5, num_val=40, num_test=60, seed=s) for s in (7, 7, 8)
    )
    for field in ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(a, field), getattr(b, field))
    assert not torch.equal(a.y, c.y) and not torch.equal(a.x, c.x)


def test_neighbourhood_carries_label_signal():
    """Nearest-class-mean on the features beats chance; averaging over neighbourhoods helps more."""
    g = synthetic_graph(num_nodes=2000, seed=2)
    x, y, tr = g.x.numpy(), g.y.numpy(), g.train_mask.numpy()
    nbh = g.neighbourhoods()
    adj = sp.csr_matrix((np.ones(len(nbh.indices)), nbh.indices, nbh.indptr), shape=(2000, 2000))

    def accuracy(z):
        means = np.stack([z[tr & (y == c)].mean(0) for c in range(g.num_classes)])
        return ((z @ means.T).argmax(1) == y)[~tr].mean()

    raw, smoothed = accuracy(x), accuracy(adj @ x / nbh.degrees()[:, None])
    assert raw > 0.3 and smoothed > raw + 0.2


def test_large_graph_is_fast():
    start = time.perf_counter()
    g = synthetic_graph(num_nodes=100_000, seed=0)
    assert time.perf_counter() - start < 5.0
    assert g.edge_index.shape[1] == 500_000


def test_dense_request_on_tiny_graph_terminates():
    g = synthetic_graph(num_nodes=6, num_classes=2, avg_degree=50.0, train_per_class=1, num_val=1, num_test=1)
    assert g.edge_index.shape[1] == 6 * 5  # complete graph: every distinct pair, both directions
    _structure_ok(g)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_nodes": 0}, "num_nodes"),
        ({"num_classes": 600}, "num_classes"),
        ({"homophily": 1.5}, "homophily"),
        ({"avg_degree": -1.0}, "avg_degree"),
        ({"feature_noise": -0.1}, "feature_noise"),
        ({"num_val": -1}, "split sizes"),
        ({"num_nodes": 100, "train_per_class": 30}, "smallest class"),
        ({"num_nodes": 300}, "splits need"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        synthetic_graph(**kwargs)


@pytest.mark.parametrize(
    "kwargs", [{}, {"num_nodes": 60, "num_classes": 1, "train_per_class": 0, "num_val": 0, "num_test": 0}]
)
def test_graph_checks_keep_synthetic_graphs_as_generated(kwargs):
    """Rebuilding a synthetic graph through Graph's entry checks keeps every field object as it is:
    the generator's output already satisfies them (bool disjoint masks, unit float32 rows)."""
    from fedgat.graph import Graph

    g = synthetic_graph(**kwargs)
    fields = ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask", "num_classes", "name")
    again = Graph(**{f: getattr(g, f) for f in fields})
    assert all(getattr(again, f) is getattr(g, f) for f in fields)
