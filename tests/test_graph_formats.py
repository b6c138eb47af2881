"""Graphs from PyG Data, gnn-benchmark .npz files, saved .pt files and PyG dataset families: exact round
trips, PyG's preparation (self-loops, duplicates, direction) with counts checked against direct
counts, the seeded per-class split, and a typed error naming the problem for every bad input.
All inputs are random data written under tmp_path; nothing is downloaded."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from torch_geometric.data import Data

from fedgat import data as fdata
from fedgat.data import DatasetFormatError, DatasetNotFoundError, load_dataset, load_pyg_dataset
from fedgat.graph import UNIT_NORM_TOLERANCE, Graph, GraphError, check_trainable, unit_normalise
from fedgat.graph_files import load_npz, read_npz_data
from fedgat.splits import SplitError, per_class_split
from fedgat.synthetic import synthetic_graph

FIELDS = ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask", "num_classes", "name")
MASKS = ("train_mask", "val_mask", "test_mask")


def same_graph(a: Graph, b: Graph) -> None:
    for f in FIELDS:
        u, v = getattr(a, f), getattr(b, f)
        if isinstance(u, torch.Tensor):
            assert u.dtype == v.dtype and torch.equal(u, v), f
        else:
            assert u == v, f


def raw_edges(n: int, m: int, seed: int, loops: int = 5, dups: int = 7) -> np.ndarray:
    """``m`` random directed edges plus ``loops`` self-loops and ``dups`` repeated edges, shuffled."""
    rng = np.random.default_rng(seed)
    ei = rng.integers(0, n, size=(2, m))
    nodes = rng.integers(0, n, size=loops)
    ei = np.concatenate([ei, np.stack([nodes, nodes]), ei[:, rng.integers(0, m, size=dups)]], axis=1)
    return ei[:, rng.permutation(ei.shape[1])]


def expected_edges(ei: np.ndarray, n: int) -> dict:
    """Direct counts with Python sets: what removing self-loops, merging duplicates and symmetrising
    must give."""
    pairs = list(zip(ei[0].tolist(), ei[1].tolist(), strict=True))
    loops = sum(a == b for a, b in pairs)
    unique = {(a, b) for a, b in pairs if a != b}
    both = unique | {(b, a) for a, b in unique}
    touched = {a for a, _ in both} | {b for _, b in both}
    return {
        "self_loops_removed": loops,
        "duplicates_removed": len(pairs) - loops - len(unique),
        "edges_added": len(both) - len(unique),
        "isolated_nodes": n - len(touched),
        "edges": sorted(both),
    }


def edge_list(g: Graph) -> list[tuple[int, int]]:
    return list(zip(g.edge_index[0].tolist(), g.edge_index[1].tolist(), strict=True))


def random_data(n: int = 120, d: int = 6, c: int = 3, seed: int = 0, masks: bool = False) -> Data:
    gen = torch.Generator().manual_seed(seed)
    data = Data(
        x=torch.rand(n, d, generator=gen) * 5,
        y=torch.randint(0, c, (n,), generator=gen),
        edge_index=torch.from_numpy(raw_edges(n, 3 * n, seed)),
    )
    if masks:
        perm = torch.randperm(n, generator=gen)
        for i, key in enumerate(MASKS):
            m = torch.zeros(n, dtype=torch.bool)
            m[perm[i * 20 : (i + 1) * 20]] = True
            data[key] = m
    return data


# ------------------------------------------------------------------------------- round trips
def test_to_pyg_from_pyg_round_trip_is_exact():
    g = synthetic_graph(num_nodes=90, num_features=7, train_per_class=4, num_val=15, num_test=30, seed=2)
    d = g.to_pyg()
    for key in ("x", "y", "edge_index", *MASKS):
        assert getattr(d, key).dtype == getattr(g, key).dtype and torch.equal(
            getattr(d, key), getattr(g, key)
        )
    assert (d.num_nodes, d.num_classes, d.name) == (90, 4, "synthetic")
    back = Graph.from_pyg(d)
    same_graph(back, g)
    r = back.report
    assert (r.self_loops_removed, r.duplicates_removed, r.edges_added, r.rows_normalised) == (0, 0, 0, 0)
    assert r.split == "given masks (16 train, 15 val, 30 test)" and not r.edges_changed
    d.x[0, 0] = 123.0  # to_pyg copies: the graph is untouched
    assert not torch.equal(d.x, g.x)


def test_prepared_data_survives_from_pyg_to_pyg_unchanged():
    g0 = Graph.from_pyg(random_data(masks=True))
    d = g0.to_pyg()
    d2 = Graph.from_pyg(d).to_pyg()
    for key in ("x", "y", "edge_index", *MASKS, "num_classes", "name", "num_nodes"):
        u, v = d[key], d2[key]
        assert torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v, key


def test_num_classes_and_name_survive_empty_top_classes():
    d = random_data(c=3, masks=True)
    g = Graph.from_pyg(d, num_classes=6, name="mine")
    assert g.num_classes == 6
    back = Graph.from_pyg(g.to_pyg())
    assert (back.num_classes, back.name) == (6, "mine")
    assert Graph.from_pyg(random_data(masks=True)).name == "graph"


# -------------------------------------------------------------------------- PyG's preparation
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_self_loops_duplicates_and_direction_counted(seed):
    n = 80
    ei = raw_edges(n, 100, seed, loops=4 + seed, dups=6 + seed)
    data = Data(x=torch.rand(n, 4), y=torch.zeros(n, dtype=torch.long), edge_index=torch.from_numpy(ei))
    g = Graph.from_pyg(data, num_val=10, num_test=20)
    want = expected_edges(ei, n)
    r = g.report
    assert (r.self_loops_removed, r.duplicates_removed, r.edges_added, r.isolated_nodes) == (
        want["self_loops_removed"],
        want["duplicates_removed"],
        want["edges_added"],
        want["isolated_nodes"],
    )
    assert r.self_loops_removed > 0 and r.duplicates_removed > 0 and r.was_directed
    assert r.input_edges == ei.shape[1] and r.output_edges == g.edge_index.shape[1]
    assert edge_list(g) == want["edges"]  # symmetric, unique, sorted by (source, target)
    assert g.num_nodes == n  # isolated nodes kept
    assert "self-loops removed" in str(r) and "isolated nodes kept" in str(r)


def test_isolated_nodes_are_kept_and_counted():
    x = torch.rand(10, 3)
    ei = torch.tensor([[0, 1, 2, 3], [1, 0, 3, 2]])
    g = Graph.from_pyg(Data(x=x, y=torch.arange(10) % 2, edge_index=ei), num_val=2, num_test=2)
    assert g.num_nodes == 10 and g.report.isolated_nodes == 6
    assert (
        Graph.from_pyg(
            Data(x=x, y=torch.zeros(10, dtype=torch.long), edge_index=torch.zeros(2, 0, dtype=torch.long)),
            num_val=1,
            num_test=1,
        ).report.isolated_nodes
        == 10
    )


def test_clean_input_keeps_its_edge_order():
    n = 30
    rng = np.random.default_rng(5)
    und = {(a, b) for a, b in rng.integers(0, n, size=(60, 2)).tolist() if a != b}
    pairs = sorted(und | {(b, a) for a, b in und})
    ei = torch.tensor(pairs).T[:, torch.randperm(len(pairs), generator=torch.Generator().manual_seed(1))]
    g = Graph.from_pyg(
        Data(x=torch.rand(n, 3), y=torch.zeros(n, dtype=torch.long), edge_index=ei), num_val=3, num_test=3
    )
    assert torch.equal(g.edge_index, ei) and not g.report.edges_changed


def test_features_normalised_as_the_planetoid_loader_does():
    n = 12
    x = torch.rand(n, 5, dtype=torch.float64) * 4
    x[3] = 0.0
    unit = torch.randn(5, dtype=torch.float32)
    unit = unit / unit.norm()
    unit = unit * (1 + UNIT_NORM_TOLERANCE / 4)  # within tolerance: kept bit for bit
    x[7] = unit.double()
    data = Data(x=x, y=torch.arange(n) % 2, edge_index=torch.tensor([[0, 1], [1, 0]]))
    g = Graph.from_pyg(data, num_val=2, num_test=2)
    scaled = torch.ones(n, dtype=torch.bool)
    scaled[[3, 7]] = False
    assert torch.equal(g.x[scaled], unit_normalise(x.float())[scaled])
    assert torch.equal(g.x[7], x[7].float()) and not g.x[3].any()
    assert (g.report.rows_normalised, g.report.zero_feature_rows) == (n - 2, 1)
    assert g.x.dtype == torch.float32 and g.y.dtype == torch.int64
    assert all(getattr(g, k).dtype == torch.bool for k in MASKS)


@pytest.mark.parametrize(
    "scale",
    [
        lambda x: x * 1e19,  # float32: squares overflow
        lambda x: x * 1e-30,  # float32: squares underflow
        lambda x: x.double() * 1e300,  # the cast to float32 overflows
        lambda x: x.double() * 1e-300,  # the cast to float32 underflows to zero
        lambda x: x.double() * 1e-40,  # the cast to float32 leaves subnormals
        lambda x: x * 4e-23,  # float32: squares subnormal, so the plain norm is imprecise
        lambda x: x * 1e-21,
    ],
)
def test_rows_of_extreme_magnitude_are_normalised_not_zeroed(scale):
    """A feature row scaled by any positive factor normalises to the same unit row (to float32
    rounding), through :meth:`Graph.from_pyg` and the constructor alike; none is reported all-zero."""
    d = random_data(masks=True)
    want = Graph.from_pyg(d)
    big = d.clone()
    big.x = scale(d.x)
    got = Graph.from_pyg(big)
    assert torch.allclose(got.x, want.x, rtol=0, atol=5e-7)
    assert (got.report.zero_feature_rows, got.report.rows_normalised) == (0, d.num_nodes)
    fields = {k: getattr(want, k) for k in ("y", "edge_index", *MASKS, "num_classes", "name")}
    assert torch.allclose(Graph(x=scale(d.x), **fields).x, want.x, rtol=0, atol=5e-7)
    assert torch.allclose(unit_normalise(scale(d.x)).float(), want.x, rtol=0, atol=5e-7)


def test_labels_of_one_class_and_empty_classes_are_reported():
    d = random_data(c=3, masks=True)
    single = Graph.from_pyg(_changed(d, y=torch.zeros_like(d.y)))  # the command line refuses it
    assert "every node has the same label (0): there is nothing to classify" in single.report.notes
    shifted = Graph.from_pyg(_changed(d, y=d.y + 1))  # 1-based labels: class 0 is empty
    assert shifted.num_classes == 4
    assert any(n.startswith("1 of 4 classes have no node (0)") for n in shifted.report.notes)
    gapped = Graph.from_pyg(_changed(d, y=d.y * 10))  # ids 0, 10, 20
    assert any(n.startswith("18 of 21 classes have no node (1, 2, 3,") for n in gapped.report.notes)
    assert not any("no node" in n for n in Graph.from_pyg(d).report.notes)
    # classes above the largest label, asked for explicitly, are no gap
    assert not any("no node" in n for n in Graph.from_pyg(d, num_classes=6).report.notes)


def test_an_empty_given_mask_is_reported_and_training_refuses_the_graph():
    """An empty mask survives the round trip through PyG (and is reported); training refuses a graph
    without training or validation nodes before any set-up, an empty test mask only gives NaN."""
    from fedgat.methods import run_method

    d = random_data(masks=True)
    notes = {"train_mask": "nothing to train on", "val_mask": "no validation node", "test_mask": "NaN"}
    for key, note in notes.items():
        g = Graph.from_pyg(_changed(d, **{key: torch.zeros_like(d[key])}))
        assert any(n.startswith(f"{key} selects no node") and note in n for n in g.report.notes)
        same_graph(Graph.from_pyg(g.to_pyg()), g)
        if key == "test_mask":
            check_trainable(g)
            continue
        with pytest.raises(GraphError, match=f"{key} selects no node; training needs"):
            check_trainable(g)
        with pytest.raises(GraphError, match=f"{key} selects no node"):
            run_method("gcn", g, num_clients=2, rounds=1)


def test_load_dataset_says_what_to_do_with_a_graph_object():
    d = random_data(masks=True)
    with pytest.raises(TypeError, match=r"not a Data: for a PyG Data .* use fedgat.Graph.from_pyg\(data\)"):
        load_dataset(d)
    with pytest.raises(TypeError, match="not a Graph: it is a Graph already"):
        load_dataset(Graph.from_pyg(d))


def test_from_pyg_of_planetoid_reader_equals_load_planetoid(cora):
    from torch_geometric.io import read_planetoid_data
    from torch_geometric.utils import sort_edge_index

    raw = read_planetoid_data(str(Path(os.environ["FEDGAT_DATA"]) / "Cora" / "raw"), "Cora")
    raw.edge_index = sort_edge_index(raw.edge_index, num_nodes=raw.num_nodes)
    same_graph(Graph.from_pyg(raw, name="cora"), cora)
    assert cora.report is not None and cora.report.split.startswith("given masks (140 train")


def test_labels_column_dataset_and_dict_inputs():
    d = random_data(masks=True)
    col = d.clone()
    col.y = d.y[:, None]
    g = Graph.from_pyg(col)
    assert torch.equal(g.y, d.y) and "labels of shape (N, 1) flattened" in g.report.notes
    same_graph(Graph.from_pyg(d.to_dict()), Graph.from_pyg(d))
    extra = d.clone()
    extra.edge_attr = torch.ones(d.edge_index.shape[1])
    assert "ignored attributes: edge_attr" in Graph.from_pyg(extra).report.notes


def _changed(d: Data, **changes) -> Data:
    d = d.clone()
    for k, v in changes.items():
        if v is None:
            del d[k]
        else:
            d[k] = v
    return d


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"x": None}, r"data has no node features \(x\)"),
        ({"y": None}, r"data has no labels \(y\)"),
        ({"edge_index": None}, r"data has no edge_index"),
        ({"x": torch.full((120, 6), float("nan"))}, r"x holds NaN or infinite values \(e.g. row 0\)"),
        ({"y": torch.full((120,), -1)}, r"y holds label -1; labels must lie in \[0, num_classes\)"),
        (  # an id column read as labels: a class per id up to it
            {"y": torch.arange(120) * 10**7},
            r"y holds label 1190000000; with 120 nodes class ids must lie below 1024 \(are these ids\?",
        ),
        ({"y": torch.full((120,), 1.5)}, r"y holds 1.5 \(node 0\); labels are whole numbers"),
        ({"y": torch.zeros(119, dtype=torch.long)}, r"y has shape \(119,\).*y has 119 labels, x 120 rows"),
        (
            {"edge_index": torch.tensor([[0], [120]])},
            r"edge_index holds node 120; node ids must lie in \[0, 120\)",
        ),
        ({"edge_index": torch.zeros(3, 2, dtype=torch.long)}, r"edge_index has shape \(3, 2\)"),
        ({"num_nodes": 121}, r"data.num_nodes is 121 but x has 120 rows"),
        (
            {"val_mask": None},
            r"data has train_mask, test_mask but no val_mask; give all three masks, or none",
        ),
        (
            {"train_mask": torch.zeros(120, 10, dtype=torch.bool)},
            r"train_mask has shape \(120, 10\): 10 alternative splits",
        ),
    ],
)
def test_bad_data_is_refused(changes, match):
    with pytest.raises(GraphError, match=match):
        Graph.from_pyg(_changed(random_data(masks=True), **changes))


def test_a_files_malformed_graph_is_refused_naming_the_file(tmp_path):
    """A newcomer's review: "edge_index holds node 150" said nothing of which file; a saved ``Data``
    whose fields are malformed is refused naming it once (the error's type kept)."""
    bad = _changed(random_data(masks=True), edge_index=torch.tensor([[0], [120]]))
    path = tmp_path / "mine.pt"
    torch.save(bad, path)
    with pytest.raises(GraphError, match=r"mine\.pt: edge_index holds node 120") as err:
        load_dataset(str(path))
    assert type(err.value) is GraphError and str(err.value).count("mine.pt") == 1


def test_non_graph_inputs_are_refused():
    from torch_geometric.data import HeteroData
    from torch_geometric.datasets import FakeDataset

    one = FakeDataset(num_graphs=1, avg_num_nodes=300, num_channels=4, num_classes=3)
    g = Graph.from_pyg(one, num_val=20, num_test=40)
    assert g.num_nodes == one[0].num_nodes and "the dataset's only graph taken" in g.report.notes
    with pytest.raises(GraphError, match=r"dataset holds 2 graphs; pass one of them, e.g. dataset\[0\]"):
        Graph.from_pyg(FakeDataset(num_graphs=2))

    with pytest.raises(GraphError, match="expected a torch_geometric.data.Data"):
        Graph.from_pyg([1, 2, 3])
    with pytest.raises(GraphError, match="HeteroData"):
        Graph.from_pyg(HeteroData())


# ------------------------------------------------------------------------------------ splits
def test_per_class_split_default_sizes_and_determinism():
    y = np.random.default_rng(0).integers(0, 7, size=3000)
    s = per_class_split(y, seed=3)
    tr, va, te = (m.numpy() for m in (s.train_mask, s.val_mask, s.test_mask))
    assert np.bincount(y[tr], minlength=7).tolist() == [20] * 7
    assert (va.sum(), te.sum()) == (500, 1000) and not s.clipped
    assert not (tr & va).any() and not (tr & te).any() and not (va & te).any()
    assert s.description == "per-class split (seed 3): 20 train per class (140), 500 val, 1000 test"
    again = per_class_split(torch.from_numpy(y), seed=3)
    assert all(torch.equal(getattr(s, k), getattr(again, k)) for k in MASKS)
    other = per_class_split(y, seed=4)
    assert not torch.equal(s.train_mask, other.train_mask) and not torch.equal(s.val_mask, other.val_mask)


def test_per_class_split_clips_small_graphs():
    y = np.array([0] * 30 + [1] * 5 + [2] * 1)
    s = per_class_split(y, 4, train_per_class=20, num_val=50, num_test=100, seed=0)
    tr, va, te = (m.numpy() for m in (s.train_mask, s.val_mask, s.test_mask))
    assert np.bincount(y[tr], minlength=4).tolist() == [15, 2, 1, 0]  # at most half, at least one
    left = 36 - 18
    assert (va.sum(), te.sum()) == (left * 50 // 150, left - left * 50 // 150) and s.clipped
    assert not (va & te).any() and not ((va | te) & tr).any()
    assert "asked 20" in s.description and "asked 50 val, 100 test" in s.description


@pytest.mark.parametrize(
    ("y", "kwargs", "match"),
    [
        ([0, 1], {}, r"graph of 2 nodes is too small for a split"),
        ([0, 0, 1], {}, r"too small"),
        ([0, 1, 1, 0, 1], {"train_per_class": 0}, r"train_per_class must be an integer >= 1"),
        ([0, 1, 1, 0, 1], {"num_test": 0}, r"num_test must be an integer >= 1"),
        ([0, 1, 1, 0, 1], {"num_val": -1}, r"num_val must be an integer >= 0"),
        ([0, -1, 1], {}, r"labels hold -1"),
    ],
)
def test_impossible_splits_are_refused(y, kwargs, match):
    with pytest.raises(SplitError, match=match):
        per_class_split(np.array(y), **kwargs)


def test_from_pyg_draws_the_seeded_split_when_masks_are_missing():
    d = random_data(n=400, c=4)
    g = Graph.from_pyg(d, split_seed=7, num_val=100, num_test=150)
    want = per_class_split(d.y, 4, num_val=100, num_test=150, seed=7)
    assert all(torch.equal(getattr(g, k), getattr(want, k)) for k in MASKS)
    assert g.report.split == want.description
    same_graph(g, Graph.from_pyg(d, split_seed=7, num_val=100, num_test=150))
    with pytest.raises(SplitError, match="too small"):
        Graph.from_pyg(Data(x=torch.rand(2, 2), y=torch.tensor([0, 1]), edge_index=torch.tensor([[0], [1]])))


# -------------------------------------------------------------------------------------- .npz
def write_npz(
    path: Path, n: int = 150, d: int = 20, c: int = 4, seed: int = 0, dense: str | None = None, **override
) -> dict:
    """A random gnn-benchmark file: directed CSR adjacency with self-loops and duplicate entries,
    count-valued CSR (or dense) features, integer labels. Returns the arrays written."""
    rng = np.random.default_rng(seed)
    ei = raw_edges(n, 3 * n, seed)
    order = np.lexsort((ei[1], ei[0]))
    rows, cols = ei[0, order], ei[1, order]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    feats = sp.random(
        n, d, density=0.2, random_state=seed, format="csr", data_rvs=lambda k: rng.integers(1, 4, k)
    )
    arrays = {
        "adj_data": np.ones(len(cols), dtype=np.float32),
        "adj_indices": cols.astype(np.int32),
        "adj_indptr": indptr,
        "adj_shape": np.array([n, n]),
        "labels": rng.integers(0, c, size=n),
        "idx_to_node": np.array([f"n{i}" for i in range(n)]),
    }
    if dense:
        arrays[dense] = feats.toarray()
    else:
        arrays |= {
            "attr_data": feats.data.astype(np.float32),
            "attr_indices": feats.indices,
            "attr_indptr": feats.indptr,
            "attr_shape": np.array([n, d]),
        }
    arrays |= override
    arrays = {k: v for k, v in arrays.items() if v is not None}
    np.savez(path, **arrays)
    return {**arrays, "edges": ei, "x": feats.toarray()}


@pytest.mark.parametrize("dense", [None, "features", "attr_matrix"])
def test_npz_graph_matches_its_arrays(tmp_path, dense):
    path = tmp_path / "mygraph.npz"
    a = write_npz(path, dense=dense)
    g = load_dataset(str(path), num_val=20, num_test=40, split_seed=1)
    assert g.name == "mygraph" and g.num_nodes == 150 and g.num_classes == 4
    assert torch.equal(g.y, torch.from_numpy(a["labels"]).long())
    assert torch.equal(g.x, unit_normalise(torch.from_numpy(a["x"]).float()))
    want = expected_edges(a["edges"], 150)
    assert edge_list(g) == want["edges"]
    r = g.report
    assert (r.self_loops_removed, r.duplicates_removed, r.edges_added) == (
        want["self_loops_removed"],
        want["duplicates_removed"],
        want["edges_added"],
    )
    sizes = np.bincount(a["labels"], minlength=4)
    assert np.bincount(g.y[g.train_mask].numpy()).tolist() == [min(20, s // 2) for s in sizes]
    assert r.source == str(path)
    assert (int(g.val_mask.sum()), int(g.test_mask.sum())) == (20, 40)
    same_graph(g, load_dataset(path, num_val=20, num_test=40, split_seed=1))  # a Path works too


def test_npz_reader_agrees_with_pygs_read_npz(tmp_path):
    from torch_geometric.io import read_npz

    path = tmp_path / "g.npz"
    write_npz(path)
    theirs = Graph.from_pyg(read_npz(str(path)), num_val=30, num_test=60)
    ours = load_npz(path, binarise=True, num_val=30, num_test=60, name="graph")
    same_graph(ours, theirs)
    raw = read_npz_data(path)
    assert raw.x.max() > 1 and read_npz_data(path, binarise=True).x.max() == 1


@pytest.mark.parametrize(
    ("family", "name", "where"),
    [
        ("coauthor", "cs", ("CS", "ms_academic_cs.npz")),
        ("amazon", "photo", ("Photo", "amazon_electronics_photo.npz")),
        ("citationfull", "cora_ml", ("cora_ml", "cora_ml.npz")),
    ],
)
def test_pyg_families_read_raw_files_like_pyg(tmp_path, family, name, where):
    from torch_geometric.datasets import Amazon, CitationFull, Coauthor

    root = tmp_path / "root"
    (root / where[0] / "raw").mkdir(parents=True)
    write_npz(root / where[0] / "raw" / where[1])
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    g = load_dataset(f"{family}:{name}", root=root, download=False, num_val=30, num_test=60)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # nothing written
    assert g.name == f"{family}-{name}" and g is load_pyg_dataset(
        family, name, root, download=False, num_val=30, num_test=60
    )

    pyg_root = tmp_path / "pyg"
    shutil.copytree(root, pyg_root)
    cls = {"coauthor": Coauthor, "amazon": Amazon, "citationfull": CitationFull}[family]
    dataset = cls(str(pyg_root), name)  # PyG's own processing (writes processed/ under the copy)
    theirs = dataset[0]
    assert torch.equal(g.edge_index, theirs.edge_index) and torch.equal(g.y, theirs.y)
    assert torch.equal(g.x, unit_normalise(theirs.x))
    assert fdata.PYG_DATASETS[family][name] == (Path(dataset.raw_dir).parent.name, dataset.raw_file_names)


def test_missing_family_file_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDGAT_DATA", str(tmp_path))
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset("coauthor:physics", download=False)
    msg = str(err.value)
    assert str(tmp_path / "Physics" / "raw") in msg and "ms_academic_phy.npz" in msg
    assert f"FEDGAT_DATA={str(tmp_path)!r}" in msg

    calls = []

    def offline_cp(src, dst):
        calls.append(src)
        (Path(dst) / src.rpartition("/")[2]).write_bytes(b"partial")
        raise OSError("network unreachable")

    monkeypatch.setattr(fdata.fs, "cp", offline_cp)
    with pytest.raises(DatasetNotFoundError, match=r"OSError: offline\?") as err:
        load_dataset("amazon:computers", root=tmp_path / "r")
    assert "network unreachable" not in str(err.value)
    assert calls == [
        "https://github.com/shchur/gnn-benchmark/raw/master/data/npz/amazon_electronics_computers.npz"
    ]
    assert not (tmp_path / "r").exists()  # the folders the download made are removed again


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (
            "coauthor:bio",
            r"unknown coauthor dataset 'bio'; expected one of \['coauthor:cs', 'coauthor:physics'\]",
        ),
        ("wiki:cs", r"unknown dataset family 'wiki'"),
        ("ogbn-arxiv", r"unknown dataset 'ogbn-arxiv'.*<family>:<name>.*\.npz or \.pt"),
    ],
)
def test_unknown_names(spec, match):
    with pytest.raises(ValueError, match=match):
        load_dataset(spec)


def test_planetoid_family_is_the_planetoid_loader(cora):
    assert load_dataset("planetoid:cora", download=False) is cora


def _npz_case(tmp_path, **override):
    path = tmp_path / "bad.npz"
    write_npz(path, **override)
    return path


@pytest.mark.parametrize(
    ("override", "match"),
    [
        (
            {"adj_indptr": None},
            r"the adjacency matrix needs arrays adj_data, adj_indices, adj_indptr, adj_shape; missing adj_indptr",
        ),
        (
            {"adj_shape": np.array([150, 149])},
            r"adj_shape is \[150, 149\]; the adjacency matrix must be square",
        ),
        ({"adj_shape": np.array([150])}, r"adj_shape is \[150\]; expected two positive sizes"),
        (
            {"adj_indptr": np.arange(10)},
            r"adj_indptr must be 151 non-decreasing offsets starting at 0 \(got 10 values\)",
        ),
        ({"adj_indices": np.full(10, 1)}, r"adj_indptr ends at \d+ but adj_indices holds 10 entries"),
        ({"adj_indices": None, "adj_data": None}, r"missing adj_data, adj_indices"),
        (
            {"attr_data": None, "attr_indices": None, "attr_indptr": None, "attr_shape": None},
            r"no node features: expected CSR arrays attr_data",
        ),
        ({"attr_shape": np.array([149, 20])}, r"attr_shape is \[149, 20\] but the graph has 150 nodes"),
        (
            {"attr_data": np.ones(30, np.float32)},
            r"attr_indptr ends at \d+ but attr_indices holds \d+ entries and attr_data 30",
        ),
        ({"labels": np.zeros(149, dtype=np.int64)}, r"labels have shape \(149,\); expected \(150,\)"),
        ({"labels": np.full(150, -1)}, r"labels hold -1 \(e.g. node 0\); class ids must be >= 0"),
        ({"labels": np.full(150, 0.5)}, r"labels have dtype float64 with non-integer values"),
        ({"labels": None, "labels_data": np.ones(3)}, r"multi-label \(CSR\) labels are not supported"),
        ({"labels": None}, r"no 'labels' array"),
        ({"labels": np.array([{"a": 1}] * 150, dtype=object)}, r"array 'labels' is unreadable"),
        ({"adj_indices": np.array([0.5])}, r"array 'adj_indices' has dtype float64; expected integers"),
    ],
)
def test_malformed_npz_is_refused(tmp_path, override, match):
    with pytest.raises(DatasetFormatError, match=match) as err:
        load_dataset(_npz_case(tmp_path, **override))
    assert str(tmp_path / "bad.npz") in str(err.value)
    assert isinstance(err.value, GraphError) and isinstance(err.value, ValueError)


def test_npz_non_finite_features_are_refused(tmp_path):
    x = np.random.default_rng(0).random((150, 5))
    x[17, 2] = np.inf
    with pytest.raises(DatasetFormatError, match=r"features hold NaN or infinite values \(e.g. node 17\)"):
        load_dataset(_npz_case(tmp_path, dense="features", features=x))
    path = tmp_path / "sparse.npz"
    a = write_npz(path)
    data = a["attr_data"].copy()
    data[a["attr_indptr"][9]] = np.nan  # first stored feature of node 9
    np.savez(path, **{k: v for k, v in a.items() if k not in ("edges", "x")} | {"attr_data": data})
    with pytest.raises(DatasetFormatError, match=r"features hold NaN or infinite values \(e.g. node 9\)"):
        load_dataset(path)


def test_unreadable_files_are_refused(tmp_path):
    (tmp_path / "junk.npz").write_bytes(b"not a zip archive")
    with pytest.raises(DatasetFormatError, match=r"junk.npz is not a readable .npz archive"):
        load_dataset(tmp_path / "junk.npz")
    np.save(tmp_path / "single.npy", np.zeros(3))
    shutil.move(tmp_path / "single.npy", tmp_path / "single.npz")
    with pytest.raises(DatasetFormatError, match=r"holds a single array, not an .npz archive"):
        load_dataset(tmp_path / "single.npz")
    with pytest.raises(DatasetNotFoundError, match=r"dataset file .*absent.npz not found"):
        load_dataset(str(tmp_path / "absent.npz"))
    (tmp_path / "g.csv").write_text("1,2\n")
    with pytest.raises(
        DatasetFormatError,
        match=r"unsupported file type '.csv' \(give the folder holding nodes.csv and edges.csv\); fedgat reads .npz",
    ):
        load_dataset(tmp_path / "g.csv")
    with pytest.raises(DatasetNotFoundError, match="not found"):
        load_dataset(tmp_path / "absent.csv")


# --------------------------------------------------------------------------------------- .pt
class Payload:
    """Unpickling this writes a file: the marker that code ran while loading."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "ran"))


def test_saved_data_loads_and_reports(tmp_path):
    d = random_data(n=200, c=3)
    torch.save(d, tmp_path / "mine.pt")
    g = load_dataset(tmp_path / "mine.pt", num_val=40, num_test=80)
    same_graph(g, Graph.from_pyg(d, name="mine", num_val=40, num_test=80))
    want = expected_edges(d.edge_index.numpy(), 200)
    assert g.report.self_loops_removed == want["self_loops_removed"] and g.report.source == str(
        tmp_path / "mine.pt"
    )
    named = Graph.from_pyg(random_data(masks=True), name="bank")
    torch.save(named.to_pyg(), tmp_path / "named.pth")
    same_graph(load_dataset(str(tmp_path / "named.pth")), named)  # name, masks and num_classes kept
    torch.save(d.to_dict(), tmp_path / "dict.pt")
    from_dict = load_dataset(tmp_path / "dict.pt", num_val=40, num_test=80)
    assert from_dict.name == "dict"
    same_graph(from_dict, Graph.from_pyg(d, name="dict", num_val=40, num_test=80))


def test_unsafe_pt_is_refused_without_running_code(tmp_path):
    marker = tmp_path / "marker"
    d = random_data(masks=True)
    d.extra = Payload(str(marker))
    torch.save(d, tmp_path / "evil.pt")
    marker.unlink(missing_ok=True)  # torch.save does not run __reduce__'s callable, but be sure
    with pytest.raises(
        DatasetFormatError, match=r"evil.pt holds objects that cannot be loaded safely.*trust_pickle=True"
    ):
        load_dataset(tmp_path / "evil.pt")
    assert not marker.exists()
    torch.save(Payload(str(marker)), tmp_path / "trusted.pt")
    with pytest.raises(DatasetFormatError, match=r"trusted.pt holds a int"):  # write_text's return value
        load_dataset(tmp_path / "trusted.pt", trust_pickle=True)
    assert marker.read_text() == "ran"  # the explicit flag does unpickle, as documented


def test_bad_pt_files_are_refused(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"hello, not a torch file")
    with pytest.raises(DatasetFormatError, match=r"junk.pt is not a readable torch file"):
        load_dataset(tmp_path / "junk.pt")
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    with pytest.raises(DatasetFormatError, match=r"tensor.pt holds a Tensor; save a torch_geometric Data"):
        load_dataset(tmp_path / "tensor.pt")
    d = random_data(masks=True)
    d.y = -d.y - 1
    torch.save(d, tmp_path / "neg.pt")
    with pytest.raises(GraphError, match=r"y holds label -\d; labels must lie in"):
        load_dataset(tmp_path / "neg.pt")
    with pytest.raises(DatasetNotFoundError, match="not found"):
        load_dataset(tmp_path / "absent.pt")
