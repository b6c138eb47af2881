"""Owners given by the user: reading .csv/.txt/.npy owner files, every bad file refused with a message
naming the problem, and partitions built from given owners (same structure and rules as the
Dirichlet split's; identical when given the Dirichlet owner array)."""

from __future__ import annotations

import numpy as np
import pytest

from fedgat.owners import OwnersError, check_owners, load_owners
from fedgat.partition import dirichlet_split, make_partition
from fedgat.synthetic import synthetic_graph

N = 12
OWNERS = np.array([0, 1, 2, 0, 1, 2, 2, 1, 0, 0, 1, 2])


@pytest.fixture(scope="module")
def graph():
    return synthetic_graph(num_nodes=200, num_features=8, train_per_class=5, num_val=30, num_test=60, seed=3)


def write(path, text: str):
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------ reading
@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("one.csv", "\n".join(map(str, OWNERS)) + "\n"),
        ("header.csv", "client\n" + "\n".join(map(str, OWNERS)) + "\n\n\n"),
        ("comments.txt", "# bank consortium\n" + "\n".join(map(str, OWNERS))),
        ("floats.csv", "\n".join(f"{o}.0" for o in OWNERS)),
        ("cols.csv", "node,owner,region\n" + "\n".join(f"{i},{o},eu" for i, o in enumerate(OWNERS))),
        ("semicolons.csv", "client_id;node\n" + "\n".join(f"{o};{i}" for i, o in enumerate(OWNERS))),
        ("id.csv", "id,client\n" + "\n".join(f"{i},{o}" for i, o in reversed(list(enumerate(OWNERS))))),
        ("bom.csv", "\ufeffparty\n" + "\n".join(map(str, OWNERS))),
        ("tabs.tsv", "node\tclient\n" + "\n".join(f"{i}\t{o}" for i, o in enumerate(OWNERS))),
    ],
)
def test_text_owner_files(tmp_path, name, text):
    got = load_owners(write(tmp_path / name, text), N)
    assert got.dtype == np.int64 and got.tolist() == OWNERS.tolist()


def test_node_column_may_come_in_any_order(tmp_path):
    order = np.random.default_rng(0).permutation(N)
    text = "client,node\n" + "\n".join(f"{OWNERS[i]},{i}" for i in order)
    assert load_owners(write(tmp_path / "shuffled.csv", text), N).tolist() == OWNERS.tolist()


NAMES = np.array(["acct-9", "acct-10", "x", "7", "007", "b", "a", "acct-1", "z,q", "0", "12", "11"])


def test_node_column_names_nodes_by_their_ids_when_the_graph_has_them(tmp_path):
    """A graph folder's ids (``Graph.node_names``) key the node column, matched as text in any order:
    ``7`` and ``007`` are two nodes, and a numeric id is an id, not a row number."""
    order = np.random.default_rng(1).permutation(N)
    text = "node,client\n" + "\n".join(f'"{NAMES[i]}",{OWNERS[i]}' for i in order)
    path = write(tmp_path / "ids.csv", text)
    assert load_owners(path, N, node_names=NAMES).tolist() == OWNERS.tolist()
    # without the names the same column is read as node numbers, which these ids are not
    with pytest.raises(OwnersError, match=r"not a node id.*pass node_names=graph.node_names"):
        load_owners(path, N)
    # a single column stays one client id per node, in node order
    assert (
        load_owners(write(tmp_path / "one.csv", _lines(OWNERS)), N, node_names=NAMES).tolist()
        == OWNERS.tolist()
    )


def test_errors_name_a_node_by_its_id_where_the_graph_has_ids(tmp_path):
    """A newcomer's review: "client id -1 (node 5)" left the user counting rows; with the graph's ids
    the node's id is named too."""
    owners = OWNERS.copy()
    owners[5] = -1
    text = "node,client\n" + "\n".join(f'"{NAMES[i]}",{owners[i]}' for i in range(N))
    with pytest.raises(OwnersError, match=r"holds client id -1 \(node 5, 'b'\); ids must be >= 0"):
        load_owners(write(tmp_path / "bad.csv", text), N, node_names=NAMES)
    owners[5] = 7
    text = "node,client\n" + "\n".join(f'"{NAMES[i]}",{owners[i]}' for i in range(N))
    with pytest.raises(OwnersError, match=r"client id 7 \(node 5, 'b'\) but there are 3 clients"):
        load_owners(write(tmp_path / "bad.csv", text), N, num_clients=3, node_names=NAMES)


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        (
            {"acct-1000": 0},
            r"line 13: node 'acct-1000' is no id of the graph's nodes",
        ),  # longer than every id
        ({"acct": 0}, r"line 13: node 'acct' is no id"),
        ({"07": 0}, r"line 13: node '07' is no id"),
        ({"x": 1}, r"node x listed twice \(lines 4 and 13\)"),
        ({}, r"lists 11 of the graph's 12 nodes \(node 11 is missing\)"),
    ],
)
def test_bad_node_ids_are_refused_naming_the_line(tmp_path, rows, match):
    """Every node but the last (``11``), then ``rows``."""
    listed = zip([*NAMES[:-1], *rows], [*OWNERS[:-1], *rows.values()], strict=True)
    text = "node,client\n" + "".join(f'"{name}",{client}\n' for name, client in listed)
    with pytest.raises(OwnersError, match=match):
        load_owners(write(tmp_path / "ids.csv", text), N, node_names=NAMES)


@pytest.mark.parametrize("array", [OWNERS, OWNERS.astype(np.int16), OWNERS[:, None], OWNERS.astype(float)])
def test_npy_owner_files(tmp_path, array):
    np.save(tmp_path / "owners.npy", array)
    got = load_owners(tmp_path / "owners.npy", N, num_clients=3)
    assert got.dtype == np.int64 and got.tolist() == OWNERS.tolist()


def test_check_owners_on_arrays():
    assert check_owners(OWNERS.tolist(), N).tolist() == OWNERS.tolist()
    # a count above the owners' is the count's fault, and the message says so
    with pytest.raises(
        OwnersError, match=r"owners names clients 0..2 but 5 clients were asked for \(clients 3, 4 would"
    ):
        check_owners(OWNERS, N, num_clients=5)
    with pytest.raises(OwnersError, match=r"client 0 owns no nodes; .*; client ids start at 0: subtract 1"):
        check_owners(OWNERS + 1, N)  # numbered from 1
    with pytest.raises(OwnersError, match=r"client 1 owns no nodes; every client in 0..3 must own") as err:
        check_owners(np.where(OWNERS == 1, 3, OWNERS), N)  # a gap: no hint about numbering from 1
    assert "subtract" not in str(err.value)


# ------------------------------------------------------------------------------ bad owner files
def _lines(values) -> str:
    return "\n".join(map(str, values)) + "\n"


BAD_TEXT = [
    (_lines(OWNERS[:-1]), {}, r"gives 11 owners but the graph has 12 nodes; give one client id per node"),
    (_lines([*OWNERS, 0]), {}, r"gives 13 owners but the graph has 12 nodes"),
    (_lines([*OWNERS[:-1], 5]), {"num_clients": 3}, r"holds client id 5 \(node 11\) but there are 3 clients"),
    (_lines([*OWNERS[:-1], -1]), {}, r"holds client id -1 \(node 11\); ids must be >= 0"),
    (_lines([*OWNERS[:-1], 4]), {}, r"client 3 owns no nodes; every client in 0..4 must own at least one"),
    (_lines([*OWNERS[:-1], "x"]), {}, r"line 12 holds 'x', not a client id; clients are numbered 0..K-1"),
    (_lines([*OWNERS[:-1], "1.5"]), {}, r"line 12 holds '1.5'; a client id must be a finite whole number"),
    (_lines([*OWNERS[:-1], "nan"]), {}, r"line 12 holds 'nan'; a client id must be a finite whole number"),
    (_lines([*OWNERS[:-1], "inf"]), {}, r"line 12 holds 'inf'"),
    ("0\n1\n\n2\n" + _lines(OWNERS[3:]), {}, r"line 3 is empty; give one client id per line"),
    ("", {}, r"is empty; give one client id per node"),
    ("# only a comment\n\n", {}, r"is empty"),
    (
        "\n".join(f"{i},{o}" for i, o in enumerate(OWNERS)),
        {},
        r"has 2 columns and no header; name the client",
    ),
    (
        "node,group\n" + "\n".join(f"{i},{o}" for i, o in enumerate(OWNERS)),
        {},
        r"has columns \['node', 'group'\]",
    ),
    ("node,client\n0,1\n1\n", {}, r"line 3 has 1 columns; expected 2"),
    (  # a node column under another name: not read in file order unnoticed
        "name,client\n" + "\n".join(f"{i},{o}" for i, o in reversed(list(enumerate(OWNERS)))),
        {},
        r"has columns \['name', 'client'\] and none names the nodes: .*rename 'name'",
    ),
    ("node,client\n" + "\n".join(f"{i % 11},{o}" for i, o in enumerate(OWNERS)), {}, r"node 0 listed twice"),
    (
        "node,client\n" + "\n".join(f"{i + 1},{o}" for i, o in enumerate(OWNERS)),
        {},
        r"line 13: node 12 outside",
    ),
    (_lines(OWNERS), {"num_clients": 0}, r"num_clients must be an integer >= 1, got 0"),
]


@pytest.mark.parametrize(("text", "kwargs", "match"), BAD_TEXT)
def test_bad_text_owner_files(tmp_path, text, kwargs, match):
    path = write(tmp_path / "owners.csv", text)
    with pytest.raises(OwnersError, match=match) as err:
        load_owners(path, N, **kwargs)
    assert str(path) in str(err.value) or "num_clients" in str(err.value)
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize(
    ("array", "match"),
    [
        (np.r_[OWNERS[:-1], np.nan], r"holds nan \(node 11\); client ids must be finite"),
        (np.r_[OWNERS[:-1], np.inf], r"holds inf \(node 11\); client ids must be finite"),
        (np.r_[OWNERS[:-1], 0.5], r"holds 0.5 \(node 11\); client ids must be whole numbers"),
        (OWNERS.reshape(3, 4), r"shape \(3, 4\); give a 1-D array"),
        (OWNERS.astype(bool), r"dtype bool; give integer client ids"),
        (OWNERS.astype(str), r"dtype <U\d+; give integer client ids"),
        (OWNERS[:5], r"gives 5 owners but the graph has 12 nodes"),
    ],
)
def test_bad_npy_owner_files(tmp_path, array, match):
    np.save(tmp_path / "owners.npy", array)
    with pytest.raises(OwnersError, match=match):
        load_owners(tmp_path / "owners.npy", N)


def test_unreadable_owner_files(tmp_path):
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}] * N, dtype=object))
    with pytest.raises(OwnersError, match=r"objects.npy is not a readable .npy array"):
        load_owners(tmp_path / "objects.npy", N)
    (tmp_path / "junk.npy").write_bytes(b"junk")
    with pytest.raises(OwnersError, match=r"junk.npy is not a readable .npy array"):
        load_owners(tmp_path / "junk.npy", N)
    with pytest.raises(OwnersError, match=r"owners file .*absent.csv not found"):
        load_owners(tmp_path / "absent.csv", N)
    with pytest.raises(OwnersError, match=r"unsupported type '.json'; use .csv, .tsv, .txt, .npy"):
        load_owners(write(tmp_path / "owners.json", "[0, 1]"), N)
    (tmp_path / "latin.csv").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(OwnersError, match=r"latin.csv is unreadable|not a client id"):
        load_owners(tmp_path / "latin.csv", N)


# --------------------------------------------------------------------------------- partitions
def _same_partition(a, b) -> None:
    assert np.array_equal(a.owner, b.owner)
    assert np.array_equal(a.neighbourhoods.indptr, b.neighbourhoods.indptr)
    assert np.array_equal(a.neighbourhoods.indices, b.neighbourhoods.indices)
    assert a.summary() == b.summary()
    for ca, cb in zip(a.clients, b.clients, strict=True):
        for f in ("owned", "needed", "train_nodes", "val_nodes", "test_nodes"):
            assert np.array_equal(getattr(ca, f), getattr(cb, f)), f
        assert (ca.client_id, ca.cross_edges) == (cb.client_id, cb.cross_edges)


@pytest.mark.parametrize(("fmt", "cap"), [("csv", None), ("npy", 3), ("csv", 2)])
def test_partition_from_the_dirichlet_owner_file_equals_the_dirichlet_partition(graph, tmp_path, fmt, cap):
    k, beta, seed = 5, 1.0, 4
    owner = dirichlet_split(graph.y.numpy(), k, beta, seed)
    path = tmp_path / f"owners.{fmt}"
    if fmt == "npy":
        np.save(path, owner)
    else:
        path.write_text("client\n" + _lines(owner))
    given = load_owners(path, graph.num_nodes, num_clients=k)
    want = make_partition(graph, k, beta=beta, seed=seed, neighbour_cap=cap, min_cross=2)
    got = make_partition(graph, k, seed=seed, neighbour_cap=cap, owner=given, min_cross=2)
    _same_partition(got, want)
    assert want.cross_dropped_by_rule > 0  # the rule had something to do


def test_rules_apply_to_user_owners(graph):
    owner = check_owners(np.arange(graph.num_nodes) % 4, graph.num_nodes)
    p = make_partition(graph, 4, owner=owner, neighbour_cap=3, min_cross=2)
    nbh, full = p.neighbourhoods, graph.neighbourhoods()
    assert p.cross_dropped_by_rule > 0 and p.dropped_by_cap > 0
    for i in range(graph.num_nodes):
        row = nbh.row(i)
        others = row[1:]
        assert row[0] == i and set(others) <= set(full.row(i)) and len(others) <= 3
        cross = int((owner[others] != owner[i]).sum())
        assert cross == 0 or cross >= 2
    assert [c.owned.tolist() for c in p.clients] == [np.flatnonzero(owner == c).tolist() for c in range(4)]


def test_methods_and_the_pipeline_take_the_users_owners(graph):
    """``owner=`` reaches every method's partition (not the Dirichlet split) and the encrypted run."""
    from fedgat.methods import _fedgat_bytes, build_federation, pretrain_bytes, resolve_hparams
    from fedgat.pipeline import run_encrypted_fedgat

    owner = np.arange(graph.num_nodes) % 3
    want = make_partition(graph, 3, seed=0, num_layers=2, owner=owner)
    got_bytes = pretrain_bytes("fedgat", graph, 3, owner=owner)
    assert got_bytes == _fedgat_bytes(want, "vector", graph.num_features)
    assert got_bytes != pretrain_bytes("fedgat", graph, 3)  # the Dirichlet split differs
    fed = build_federation("distgat", graph, 3, owner=owner)
    assert [task.inputs[0].shape[0] for task, _ in fed.tasks] == np.bincount(owner).tolist()
    hp = {"rounds": 2, "patience": 2}
    run = run_encrypted_fedgat(graph, owner=owner, progress=False, workers=0, **hp)
    assert np.array_equal(run.partition.owner, owner) and len(run.pretrain.encodings) == 3
    assert run.training.hparams == resolve_hparams("fedgat", {"variant": "vector", **hp})
    with pytest.raises(OwnersError, match="client"):
        run_encrypted_fedgat(graph, owner=np.where(owner == 1, 2, owner), progress=False, **hp)
