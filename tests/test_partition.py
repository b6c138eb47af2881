"""Client partitions: the Dirichlet split, FedGAT's neighbourhood rules, per-client views."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedgat.graph import Graph
from fedgat.partition import Partition, dirichlet_split, drop_cross_client, make_partition


def _rows(csr):
    return [csr.row(i).tolist() for i in range(csr.num_nodes)]


def _mean_tv(labels, owner, num_clients):
    """Mean total-variation distance between each client's label distribution and the global one."""
    glob = np.bincount(labels) / len(labels)
    tvs = []
    for k in range(num_clients):
        h = np.bincount(labels[owner == k], minlength=len(glob))
        tvs.append(0.5 * np.abs(h / h.sum() - glob).sum())
    return float(np.mean(tvs))


def _check_partition(graph: Graph, p: Partition):
    """Invariants every partition satisfies, checked against plain-Python reference computations."""
    n, owner, nbh = graph.num_nodes, p.owner, p.neighbourhoods
    full = _rows(graph.neighbourhoods(self_loops=True))
    rows = _rows(nbh)

    # ownership: every node owned by exactly one client
    owned_all = np.concatenate([c.owned for c in p.clients])
    assert sorted(owned_all.tolist()) == list(range(n))
    assert all((owner[c.owned] == c.client_id).all() for c in p.clients)

    for i in range(n):
        others = rows[i][1:]
        assert rows[i][0] == i, "self-loop must come first"
        assert (
            set(others) <= set(full[i][1:]) and others == sorted(others) and len(set(others)) == len(others)
        )
        cross = sum(owner[j] != owner[i] for j in others)
        if p.min_cross > 1:
            assert cross == 0 or cross >= p.min_cross
        if p.neighbour_cap is not None:
            assert len(others) <= p.neighbour_cap

    for c in p.clients:
        # needed: owned (sorted) first, then the sorted rest of the (L-1)-hop expansion
        reached = set(c.owned.tolist())
        for _ in range(p.num_layers - 1):
            reached |= {j for i in reached for j in rows[i]}
        assert c.needed[: len(c.owned)].tolist() == c.owned.tolist()
        rest = c.needed[len(c.owned) :].tolist()
        assert rest == sorted(reached - set(c.owned.tolist()))
        assert c.cross_edges == sum(owner[j] != c.client_id for i in c.owned for j in rows[i])
        for split, nodes in (("train", c.train_nodes), ("val", c.val_nodes), ("test", c.test_nodes)):
            mask = getattr(graph, f"{split}_mask").numpy()
            assert nodes.tolist() == [i for i in c.owned.tolist() if mask[i]]

        if p.num_layers >= 2:
            needed, ei = p.local_subgraph(c.client_id)
            assert needed is c.needed
            got = sorted(zip(needed[ei[0].numpy()].tolist(), needed[ei[1].numpy()].tolist()))
            assert got == sorted((j, i) for i in c.owned.tolist() for j in rows[i])
            assert ei.dtype == torch.int64 and (ei[1] < len(c.owned)).all()

    dist = _rows(drop_cross_client(p))
    assert dist == [[j for j in rows[i] if owner[j] == owner[i]] for i in range(n)]


# ---- dirichlet_split --------------------------------------------------------------------------


def test_dirichlet_split_covers_and_reproduces():
    labels = np.repeat(np.arange(7), 300)
    a = dirichlet_split(labels, 10, 1.0, seed=0)
    assert a.shape == labels.shape and a.dtype == np.int64
    assert a.min() == 0 and a.max() == 9 and (np.bincount(a, minlength=10) > 0).all()
    assert np.array_equal(a, dirichlet_split(labels, 10, 1.0, seed=0))
    assert not np.array_equal(a, dirichlet_split(labels, 10, 1.0, seed=1))


def test_beta_controls_label_skew():
    labels = np.repeat(np.arange(7), 400)
    iid = np.mean([_mean_tv(labels, dirichlet_split(labels, 10, 10000.0, s), 10) for s in range(3)])
    skewed = np.mean([_mean_tv(labels, dirichlet_split(labels, 10, 1.0, s), 10) for s in range(3)])
    assert iid < 0.03 and skewed > 0.2


def test_every_client_gets_a_node_even_with_tiny_beta():
    labels = np.repeat(np.arange(3), 20)
    for seed in range(20):
        owner = dirichlet_split(labels, 12, 1e-3, seed)
        assert (np.bincount(owner, minlength=12) > 0).all()
    owner = dirichlet_split(np.array([0, 1, 1]), 5, 1.0, 0)  # fewer nodes than clients: allowed
    assert owner.min() >= 0 and owner.max() < 5


@pytest.mark.parametrize(
    "args, match",
    [
        ((np.zeros(5, int), 0, 1.0, 0), "num_clients"),
        ((np.zeros(5, int), 3, 0.0, 0), "beta"),
        ((np.zeros(5, int), 3, float("inf"), 0), "beta"),
        ((np.zeros(5), 3, 1.0, 0), "integer"),
        ((np.array([0, -1]), 3, 1.0, 0), "non-negative"),
    ],
)
def test_dirichlet_split_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        dirichlet_split(*args)


# ---- make_partition on Cora ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def cora_partition(cora):
    return make_partition(cora, num_clients=10, beta=1.0, seed=0, min_cross=2)  # the paper's rule


def test_cora_partition_invariants(cora, cora_partition):
    _check_partition(cora, cora_partition)
    assert np.array_equal(cora_partition.owner, dirichlet_split(cora.y.numpy(), 10, 1.0, 0))


def test_min_cross_rule_on_cora(cora, cora_partition):
    s = cora_partition.summary()
    owner = cora_partition.owner
    ei = cora.edge_index.numpy()
    total_cross = int((owner[ei[0]] != owner[ei[1]]).sum())
    assert s["cross_edges_kept"] + s["cross_edges_dropped_by_rule"] == total_cross
    # the paper's rule only fires on nodes with exactly one cross-client neighbour
    assert s["nodes_hit_by_rule"] == s["cross_edges_dropped_by_rule"] > 0
    assert sum(s["nodes_per_client"]) == cora.num_nodes and s["num_clients"] == 10

    off = make_partition(cora, num_clients=10, beta=1.0, seed=0, min_cross=1)
    assert _rows(off.neighbourhoods) == _rows(cora.neighbourhoods(self_loops=True))
    assert off.summary()["cross_edges_kept"] == total_cross and off.cross_dropped_by_rule == 0


def test_neighbour_cap_on_cora(cora):
    p = make_partition(cora, num_clients=10, beta=1.0, seed=0, neighbour_cap=16)
    deg = p.neighbourhoods.degrees()
    assert (
        deg.max() <= 17 and (p.neighbourhoods.indices[p.neighbourhoods.indptr[:-1]] == np.arange(2708)).all()
    )
    full = cora.neighbourhoods(self_loops=True).degrees()
    assert p.dropped_by_cap == int(np.maximum(full - 17, 0).sum())
    _check_partition(cora, p)
    q = make_partition(cora, num_clients=10, beta=1.0, seed=1, neighbour_cap=16)
    assert not np.array_equal(p.neighbourhoods.indices, q.neighbourhoods.indices)


def test_num_layers_controls_needed(cora):
    one, two, three = (make_partition(cora, 10, seed=0, num_layers=L) for L in (1, 2, 3))
    for a, b, c in zip(one.clients, two.clients, three.clients):
        assert np.array_equal(a.needed, a.owned)
        assert set(a.needed) < set(b.needed) <= set(c.needed)
    with pytest.raises(ValueError, match="num_layers >= 2"):
        one.local_subgraph(0)
    with pytest.raises(ValueError, match="client_id"):
        two.local_subgraph(10)


def test_given_owner_and_bad_arguments(small_graph):
    owner = np.arange(small_graph.num_nodes) % 3
    p = make_partition(small_graph, 4, owner=owner)  # client 3 stays empty
    assert p.num_clients == 4 and len(p.clients[3].owned) == 0 and len(p.clients[3].needed) == 0
    _check_partition(small_graph, p)
    for kwargs, error, match in [
        ({"num_clients": 0}, ValueError, "num_clients"),
        ({"num_clients": 2.0}, TypeError, "num_clients"),
        ({"num_clients": 3, "beta": -1.0}, ValueError, "beta"),
        ({"num_clients": 3, "num_layers": 0}, ValueError, "num_layers"),
        ({"num_clients": 3, "neighbour_cap": 0}, ValueError, "neighbour_cap"),
        ({"num_clients": 3, "min_cross": 1.5}, TypeError, "min_cross"),
        ({"num_clients": 2, "owner": owner}, ValueError, "owner ids"),
        ({"num_clients": 3, "owner": owner[:-1]}, ValueError, "shape"),
    ]:
        with pytest.raises(error, match=match):
            make_partition(small_graph, **kwargs)


# ---- property test over small random graphs ----------------------------------------------------


@st.composite
def graphs(draw):
    n = draw(st.integers(1, 24))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    und = {(min(a, b), max(a, b)) for a, b in pairs if a != b}
    src = [a for a, b in und] + [b for a, b in und]
    dst = [b for a, b in und] + [a for a, b in und]
    num_classes = draw(st.integers(1, 3))
    y = torch.tensor(draw(st.lists(st.integers(0, num_classes - 1), min_size=n, max_size=n)))
    split = torch.tensor(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    return Graph(
        x=torch.ones(n, 2) / 2**0.5,
        y=y,
        edge_index=torch.tensor([src, dst], dtype=torch.int64).reshape(2, -1),
        train_mask=split == 0,
        val_mask=split == 1,
        test_mask=split == 2,
        num_classes=num_classes,
    )


@settings(max_examples=150, deadline=None)
@given(
    graph=graphs(),
    num_clients=st.integers(1, 5),
    beta=st.sampled_from([0.1, 1.0, 10000.0]),
    seed=st.integers(0, 2**16),
    num_layers=st.integers(1, 3),
    min_cross=st.integers(0, 3),
    cap=st.one_of(st.none(), st.integers(1, 3)),
)
def test_partition_properties(graph, num_clients, beta, seed, num_layers, min_cross, cap):
    p = make_partition(
        graph,
        num_clients,
        beta=beta,
        seed=seed,
        num_layers=num_layers,
        min_cross=min_cross,
        neighbour_cap=cap,
    )
    _check_partition(graph, p)
    if graph.num_nodes >= num_clients:
        assert all(len(c.owned) for c in p.clients)
    again = make_partition(
        graph,
        num_clients,
        beta=beta,
        seed=seed,
        num_layers=num_layers,
        min_cross=min_cross,
        neighbour_cap=cap,
    )
    assert np.array_equal(p.owner, again.owner) and _rows(p.neighbourhoods) == _rows(again.neighbourhoods)
    if (
        cap is None
    ):  # without the cap, the rule is exactly: drop cross neighbours of nodes with 0 < c < min_cross
        full = _rows(graph.neighbourhoods(self_loops=True))
        o = p.owner
        expected = []
        for i, row in enumerate(full):
            c = sum(o[j] != o[i] for j in row)
            expected.append([j for j in row if o[j] == o[i] or not 0 < c < min_cross])
        assert _rows(p.neighbourhoods) == expected
