"""Graph's entry checks: every malformed field refused with a GraphError naming it, and the
unambiguous conversions (float64 or integer features, non-unit rows, 0/1 integer masks) giving the
same graph, and the same training, as well-formed input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fedgat.graph import UNIT_NORM_TOLERANCE, Graph, GraphError
from fedgat.methods import run_method
from fedgat.synthetic import synthetic_graph

FIELDS = ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask", "num_classes", "name")


@pytest.fixture(scope="module")
def base():
    return synthetic_graph(num_nodes=60, num_features=8, train_per_class=3, num_val=10, num_test=20, seed=1)


def fields(g: Graph, **changes) -> dict:
    out = {f: getattr(g, f) for f in FIELDS}
    out.update(changes)
    return out


def refused(g: Graph, match: str, **changes) -> None:
    with pytest.raises(GraphError, match=match):
        Graph(**fields(g, **changes))


def same_graph(a: Graph, b: Graph) -> None:
    for f in FIELDS:
        u, v = getattr(a, f), getattr(b, f)
        if isinstance(u, torch.Tensor):
            assert u.dtype == v.dtype and torch.equal(u, v), f
        else:
            assert u == v, f


def test_node_names_are_one_str_per_node(base):
    names = np.array([f"n{k}" for k in range(60)])
    assert Graph(**fields(base), node_names=names).node_names.tolist() == names.tolist()
    with pytest.raises(GraphError, match=r"node_names has shape \(59,\)"):
        Graph(**fields(base), node_names=names[:-1])
    with pytest.raises(GraphError, match=r"node_names .* dtype int64; pass \(60,\) str names"):
        Graph(**fields(base), node_names=np.arange(60))


def test_graph_error_is_a_value_error():
    assert issubclass(GraphError, ValueError)


def test_well_formed_fields_are_kept_as_they_are(base):
    g = Graph(**fields(base))
    for f in FIELDS:
        assert getattr(g, f) is getattr(base, f), f  # no copy, no change: loaders' graphs are untouched


def test_repr_is_short(base, cora):
    assert (
        repr(base)
        == "Graph(name='synthetic', nodes=60, features=8, edges="
        + str(base.edge_index.shape[1])
        + ", classes=4, train=12, val=10, test=20)"
    )
    assert repr(cora) == (
        "Graph(name='cora', nodes=2708, features=1433, edges=10556, classes=7, train=140, val=500, test=1000)"
    )
    assert len(str(cora)) < 200


# ---------------------------------------------------------------------------------------- x
def test_float64_features_are_converted_to_float32(base):
    g = Graph(**fields(base, x=base.x.double()))
    assert g.x.dtype == torch.float32
    torch.testing.assert_close(g.x, base.x, rtol=0, atol=1e-7)


def test_numpy_and_integer_features_are_converted(base):
    counts = np.zeros((60, 8), np.int64)
    counts[np.arange(60), np.arange(60) % 8] = 3
    counts[:, 0] += 1
    g = Graph(**fields(base, x=counts))
    assert g.x.dtype == torch.float32
    want = torch.from_numpy(counts).double()
    want = (want / want.norm(dim=1, keepdim=True)).float()
    assert torch.equal(g.x, want)


def test_non_unit_rows_are_normalised_and_zero_rows_kept(base):
    x = base.x.double() * torch.linspace(0.01, 50.0, 60)[:, None].double()
    x[5] = 0.0
    g = Graph(**fields(base, x=x))
    norms = g.x.double().norm(dim=1)
    assert norms[5] == 0
    keep = torch.arange(60) != 5
    assert ((norms[keep] - 1).abs() <= 1e-6).all()
    torch.testing.assert_close(g.x[keep], base.x[keep], rtol=0, atol=1e-6)
    # a row already of unit norm within the tolerance is kept bit for bit
    y = base.x.clone()
    y[0] *= 1 + UNIT_NORM_TOLERANCE / 2
    assert torch.equal(Graph(**fields(base, x=y)).x[0], y[0])


@pytest.mark.parametrize(
    ("x", "match"),
    [
        (torch.zeros(60), r"x has shape \(60,\); pass \(num_nodes, num_features\)"),
        (torch.zeros(60, 0), r"x has shape \(60, 0\)"),
        (torch.zeros(0, 8), r"x has shape \(0, 8\)"),
        (torch.zeros(60, 8, dtype=torch.complex64), r"x has dtype torch.complex64; pass real float32"),
    ],
)
def test_bad_feature_shapes_and_dtypes_are_refused(base, x, match):
    refused(base, match, x=x)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_features_are_refused(base, bad):
    x = base.x.clone()
    x[7, 3] = bad
    refused(base, r"x holds NaN or infinite values \(e.g. row 7\); pass finite features", x=x)


# ---------------------------------------------------------------------------------------- y
def test_int32_labels_are_converted(base):
    g = Graph(**fields(base, y=base.y.int()))
    assert g.y.dtype == torch.int64 and torch.equal(g.y, base.y)


def test_too_small_num_classes_is_refused(base):
    refused(base, r"y holds label 3 but num_classes is 3; pass num_classes >= 4", num_classes=3)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (
            {"y": torch.zeros(59, dtype=torch.int64)},
            r"y has shape \(59,\); pass int64 labels of shape \(60,\)",
        ),
        ({"y": torch.zeros(60, 1, dtype=torch.int64)}, r"y has shape \(60, 1\)"),
        ({"y": torch.full((60,), 0.5)}, r"y holds 0.5 \(node 0\); labels are whole numbers 0..K-1"),
        ({"y": torch.full((60,), float("nan"))}, r"y holds nan \(node 0\); labels are whole numbers"),
        ({"y": np.array(["a", "b"] * 30)}, r"y holds text \(class names\?\); number the classes"),
        ({"y": torch.zeros(60, dtype=torch.bool)}, r"y has dtype torch.bool; pass int64 labels"),
        ({"y": torch.full((60,), -1)}, r"y holds label -1; .*\(an unlabelled node: give it any class"),
        ({"num_classes": 0}, r"num_classes is 0; pass an int >= 1"),
        ({"num_classes": 4.0}, r"num_classes is 4.0; pass an int >= 1"),
        ({"num_classes": True}, r"num_classes is True"),
        ({"name": 3}, r"name must be a str"),
    ],
)
def test_bad_labels_are_refused(base, changes, match):
    refused(base, match, **changes)


def test_whole_number_float_labels_are_their_integers(base):
    """As pandas reads a label column with gaps (float64): the same graph as int64 labels."""
    got = Graph(**fields(base, y=base.y.to(torch.float64)))
    assert got.y.dtype == torch.int64 and torch.equal(got.y, base.y)


# ------------------------------------------------------------------------------------ masks
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_integer_01_masks_are_converted_to_bool(base, dtype):
    masks = {k: getattr(base, k).to(dtype) for k in ("train_mask", "val_mask", "test_mask")}
    g = Graph(**fields(base, **masks))
    same_graph(g, base)


def test_numpy_masks_are_accepted(base):
    g = Graph(
        **fields(base, train_mask=base.train_mask.numpy().astype(np.int8), val_mask=base.val_mask.numpy())
    )
    same_graph(g, base)


@pytest.mark.parametrize(
    ("mask", "match"),
    [
        (
            torch.arange(60) % 3,
            r"train_mask has dtype torch.int64 with values other than 0/1; pass a bool mask of length 60",
        ),
        (torch.arange(12), r"train_mask has shape \(12,\); pass a bool mask of length 60"),
        (torch.zeros(61, dtype=torch.bool), r"train_mask has shape \(61,\); pass a bool mask of length 60"),
        (torch.zeros(60), r"train_mask has dtype torch.float32 with a non-integer dtype; pass a bool mask"),
    ],
)
def test_bad_masks_are_refused(base, mask, match):
    refused(base, match, train_mask=mask)


def test_index_masks_are_refused(base):
    """The mistake that used to pass silently: a mask given as node indices."""
    idx = base.val_mask.nonzero().flatten()
    refused(base, r"val_mask has shape \(10,\); pass a bool mask of length 60", val_mask=idx)


def test_overlapping_masks_are_refused(base):
    val = base.val_mask.clone()
    node = int(base.test_mask.nonzero()[0, 0])
    val[node] = True
    refused(
        base, rf"val_mask and test_mask overlap in 1 nodes \(e.g. node {node}\); pass disjoint", val_mask=val
    )
    refused(base, r"train_mask and val_mask overlap in 10 nodes", train_mask=base.val_mask)


# ------------------------------------------------------------------------------------ edges
def test_int32_edges_are_converted(base):
    g = Graph(**fields(base, edge_index=base.edge_index.int()))
    assert g.edge_index.dtype == torch.int64 and torch.equal(g.edge_index, base.edge_index)
    assert Graph(**fields(base, edge_index=torch.zeros(2, 0, dtype=torch.int64))).edge_index.shape == (2, 0)


@pytest.mark.parametrize(
    ("ei", "match"),
    [
        (
            torch.zeros(3, 4, dtype=torch.int64),
            r"edge_index has shape \(3, 4\); pass int64 edges of shape \(2, num_edges\)",
        ),
        (torch.zeros(2 * 4, dtype=torch.int64), r"edge_index has shape \(8,\)"),
        (torch.tensor([[0.0, 1.0], [1.0, 0.0]]), r"edge_index has dtype torch.float32; pass int64 edges"),
        (torch.tensor([[0, 60], [60, 0]]), r"edge_index holds node 60; node ids must lie in \[0, 60\)"),
        (torch.tensor([[0, -1], [-1, 0]]), r"edge_index holds node -1"),
        (torch.tensor([[0, 4], [4, 4]]), r"edge_index holds 1 self-loops \(e.g. node 4\); remove them"),
    ],
)
def test_bad_edges_are_refused(base, ei, match):
    refused(base, match, edge_index=ei)


def test_replace_goes_through_the_checks(base):
    with pytest.raises(GraphError, match="y holds label"):
        dataclasses.replace(base, num_classes=2)
    assert dataclasses.replace(base, x=base.x.double()).x.dtype == torch.float32


# --------------------------------------------------------------------------------- training
@pytest.fixture(scope="module")
def train_graph():
    return synthetic_graph(num_nodes=120, num_features=16, train_per_class=5, num_val=30, num_test=40, seed=4)


@pytest.mark.parametrize("method", ["gat", "fedgat"])
def test_integer_masks_train_exactly_like_bool_masks(train_graph, method):
    g = train_graph
    masks = {k: getattr(g, k).long() for k in ("train_mask", "val_mask", "test_mask")}
    hand = Graph(**fields(g, y=g.y.int(), **masks))
    want = run_method(method, g, num_clients=3, rounds=5, seed=0)
    got = run_method(method, hand, num_clients=3, rounds=5, seed=0)
    assert got.history == want.history
    assert (got.best_val_accuracy, got.test_accuracy) == (want.best_val_accuracy, want.test_accuracy)


@pytest.mark.parametrize("method", ["gat", "fedgat"])
def test_float64_non_unit_features_train_like_the_unit_float32_ones(train_graph, method):
    g = train_graph
    hand = Graph(**fields(g, x=g.x.double() * 7.0))  # float64, rows of norm 7
    want = run_method(method, g, num_clients=3, rounds=5, seed=0)
    got = run_method(method, hand, num_clients=3, rounds=5, seed=0)
    assert len(got.history) == len(want.history)
    for a, b in zip(got.history, want.history, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), k


def test_non_unit_rows_pass_the_encrypted_path_like_the_plaintext_one():
    """One policy on both paths: the graph normalises on entry, so a client's rows are unit-norm."""
    from fedgat.partition import make_partition
    from fedgat.pipeline import max_abs_error, run_encrypted_pretraining, run_plaintext_pretraining

    g = synthetic_graph(num_nodes=48, num_features=16, train_per_class=3, num_val=8, num_test=12, seed=3)
    scale = torch.linspace(0.5, 3.0, 48, dtype=torch.float64)[:, None]
    hand = dataclasses.replace(g, x=g.x.double() * scale, _cache={})
    part = make_partition(hand, 3, beta=1.0, seed=0, num_layers=2)
    got = run_encrypted_pretraining(hand, part, "vector", seed=1, progress=False, workers=0).encodings
    want = run_plaintext_pretraining(hand, part, "vector", seed=1)
    assert max_abs_error(got, want) <= 1e-5
