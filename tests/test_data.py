"""Dataset loading: Planetoid from the raw layout, data_root, missing-data errors (no network)."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from fedgat import data
from fedgat.data import DatasetNotFoundError, data_root, load_dataset, load_planetoid, planetoid_raw_files


def _planetoid_dir() -> Path | None:
    env = os.environ.get("FEDGAT_DATA")
    return Path(env) if env and (Path(env) / "Cora" / "raw").is_dir() else None


needs_planetoid = pytest.mark.skipif(
    _planetoid_dir() is None, reason="Planetoid raw files not available offline"
)


def _check_edges(g, num_nodes):
    ei = g.edge_index.numpy()
    assert g.edge_index.dtype == torch.int64
    assert not (ei[0] == ei[1]).any(), "self-loops in edge_index"
    keys = ei[0] * num_nodes + ei[1]
    assert len(np.unique(keys)) == len(keys), "duplicate edges"
    assert set(keys) == set(ei[1] * num_nodes + ei[0]), "edge_index not symmetric"


def test_cora_matches_published_statistics(cora):
    assert cora.name == "cora"
    assert (cora.num_nodes, cora.num_features, cora.num_classes) == (2708, 1433, 7)
    assert cora.edge_index.shape == (2, 10556)
    _check_edges(cora, cora.num_nodes)
    assert cora.x.dtype == torch.float32 and cora.y.dtype == torch.int64
    assert torch.allclose(cora.x.norm(dim=1), torch.ones(cora.num_nodes), atol=1e-5)
    assert [int(m.sum()) for m in (cora.train_mask, cora.val_mask, cora.test_mask)] == [140, 500, 1000]
    assert not (cora.train_mask & cora.val_mask).any() and not (cora.val_mask & cora.test_mask).any()
    assert torch.bincount(cora.y[cora.train_mask]).tolist() == [20] * 7


def test_cora_neighbourhoods(cora):
    nbh = cora.neighbourhoods(self_loops=True)
    assert (nbh.indices[nbh.indptr[:-1]] == np.arange(cora.num_nodes)).all(), "self-loop not first"
    deg = nbh.degrees()
    assert deg.max() == 169 and deg.sum() == 13264  # NOTES.md
    assert (deg.astype(np.int64) ** 2).sum() == pytest.approx(1.39e5, rel=0.01)


def test_load_is_cached_per_resolved_root(cora):
    root = os.environ["FEDGAT_DATA"]
    assert load_planetoid("CORA", download=False) is cora
    assert load_planetoid("cora", root=root + "/.", download=False) is cora
    assert load_dataset("Cora", download=False) is cora


@needs_planetoid
def test_citeseer_keeps_zero_rows_zero():
    g = load_planetoid("citeseer", download=False)
    assert (g.name, g.num_nodes, g.num_features, g.num_classes) == ("citeseer", 3327, 3703, 6)
    assert g.edge_index.shape == (2, 9104)
    _check_edges(g, g.num_nodes)
    norms = g.x.norm(dim=1)
    assert int((norms == 0).sum()) == 15  # isolated test nodes without features
    assert torch.allclose(norms[norms > 0], torch.ones(int((norms > 0).sum())), atol=1e-5)
    assert g.neighbourhoods().degrees().max() == 100


@needs_planetoid
def test_read_only_root_is_left_untouched():
    root = _planetoid_dir()
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    load_planetoid("citeseer", root=root, download=False)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_missing_files_without_download(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDGAT_DATA", str(tmp_path))
    with pytest.raises(DatasetNotFoundError) as err:
        load_planetoid("pubmed", download=False)
    assert isinstance(err.value, FileNotFoundError)
    msg = str(err.value)
    assert str(tmp_path / "PubMed" / "raw") in msg and f"FEDGAT_DATA={str(tmp_path)!r}" in msg


def test_failed_download_raises_and_leaves_no_partial_file(tmp_path, monkeypatch):
    calls = []

    def offline_cp(src, dst):
        calls.append(src)
        (Path(dst) / src.rpartition("/")[2]).write_bytes(b"partial")
        raise OSError("network unreachable")

    monkeypatch.setattr(data.fs, "cp", offline_cp)
    monkeypatch.delenv("FEDGAT_DATA", raising=False)
    with pytest.raises(DatasetNotFoundError, match=r"failed \(OSError: offline\?\)") as err:
        load_planetoid("cora", root=tmp_path)
    msg = str(err.value)
    assert "FEDGAT_DATA is not set" in msg and "network unreachable" not in msg  # no raw exception text
    # nor the network library's traceback chained under it (an offline user reads one error, not 100 lines)
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert all(f in msg for f in planetoid_raw_files("cora"))  # every missing file named, not one
    assert "holds Cora/raw/ind.cora.*" in msg and "<" not in msg  # the path to make, no placeholders
    assert len(calls) == 1 and calls[0].startswith("https://")
    # nothing left behind: the partial file and the folders the download created are gone, the root stays
    assert tmp_path.is_dir() and list(tmp_path.iterdir()) == []
    # a raw folder that was there before is kept (with what it held)
    (tmp_path / "Cora" / "raw").mkdir(parents=True)
    (tmp_path / "Cora" / "raw" / "notes.txt").write_text("mine")
    with pytest.raises(DatasetNotFoundError):
        load_planetoid("cora", root=tmp_path)
    assert [p.name for p in (tmp_path / "Cora" / "raw").iterdir()] == ["notes.txt"]


@needs_planetoid
def test_download_path_fetches_missing_files(tmp_path, monkeypatch):
    source = _planetoid_dir() / "CiteSeer" / "raw"
    fetched = []

    def fake_cp(src, dst):  # stands in for the network: serve the shared copy
        name = src.rpartition("/")[2]
        fetched.append(name)
        shutil.copy(source / name, dst)

    monkeypatch.setattr(data.fs, "cp", fake_cp)
    (tmp_path / "CiteSeer" / "raw").mkdir(parents=True)
    shutil.copy(source / "ind.citeseer.x", tmp_path / "CiteSeer" / "raw")
    g = load_planetoid("citeseer", root=tmp_path)
    assert sorted(fetched) == sorted(set(planetoid_raw_files("citeseer")) - {"ind.citeseer.x"})
    assert g.num_nodes == 3327 and g.edge_index.shape == (2, 9104)


def test_data_root_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDGAT_DATA", str(tmp_path / "d"))
    assert data_root() == tmp_path / "d"
    monkeypatch.delenv("FEDGAT_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_root() == tmp_path / "xdg" / "fedgat" / "data"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_root() == tmp_path / "home" / ".cache" / "fedgat" / "data"


def test_load_dataset_dispatch_and_errors():
    g = load_dataset("synthetic", num_nodes=120, train_per_class=5, num_val=20, num_test=20, seed=3)
    assert g.name == "synthetic" and g.num_nodes == 120
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("ogbn-arxiv")
    with pytest.raises(ValueError, match="unknown Planetoid dataset"):
        load_planetoid("reddit")
    assert planetoid_raw_files("PubMed")[0] == "ind.pubmed.x"


_FIELDS = ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask", "num_classes", "name")


@needs_planetoid
@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_graph_checks_leave_loaded_graphs_bit_identical(name):
    """Graph's entry checks change nothing the loaders produce (so no stored number moves): the
    loaded graph equals the reader's output prepared by hand, and rebuilding it keeps every tensor."""
    from torch_geometric.io import read_planetoid_data
    from torch_geometric.utils import coalesce, remove_self_loops, to_undirected

    from fedgat.graph import Graph, unit_normalise

    g = load_planetoid(name, download=False)
    pyg = data.PLANETOID_NAMES[name]
    raw = read_planetoid_data(str(_planetoid_dir() / pyg / "raw"), pyg)
    ei, _ = remove_self_loops(raw.edge_index)
    want = {
        "x": unit_normalise(raw.x.float()),
        "y": raw.y.long(),
        "edge_index": coalesce(to_undirected(ei, num_nodes=raw.num_nodes), num_nodes=raw.num_nodes),
        "train_mask": raw.train_mask,
        "val_mask": raw.val_mask,
        "test_mask": raw.test_mask,
    }
    for key, value in want.items():
        got = getattr(g, key)
        assert got.dtype == value.dtype and torch.equal(got, value), key
    again = Graph(**{f: getattr(g, f) for f in _FIELDS})
    assert all(getattr(again, f) is getattr(g, f) for f in _FIELDS)


def test_the_not_found_message_names_the_files_to_put_where():
    from fedgat.data import _not_found_message

    msg = _not_found_message(Path("/d/Cora/raw"), ["ind.cora.test.index"], "download=False")
    assert "raw files ind.cora.test.index not found in /d/Cora/raw" in msg
    assert "holds Cora/raw/ind.cora.*," in msg  # the dataset's prefix, not ind.cora.test.*
