"""A small federation: 3 clients on a 48-node synthetic graph."""

from __future__ import annotations

import pytest

from fedgat.partition import make_partition
from fedgat.synthetic import synthetic_graph

from protocol_helpers import Harness


@pytest.fixture(scope="session")
def tiny_graph():
    """48 nodes, 4 classes, 16 unit-norm features, mean degree 5."""
    return synthetic_graph(num_nodes=48, num_features=16, train_per_class=3, num_val=8, num_test=12, seed=3)


@pytest.fixture(scope="session")
def tiny_partition(tiny_graph):
    # the paper's rule on (the default is off), so that some cross edges are dropped and the round's
    # checks meet both kinds of needed node
    part = make_partition(tiny_graph, 3, beta=1.0, seed=0, num_layers=2, min_cross=2)
    assert all(len(c.owned) for c in part.clients)
    assert sum(c.cross_edges for c in part.clients) > 0
    return part


@pytest.fixture
def harness(tiny_graph, tiny_partition):
    return Harness(tiny_graph, tiny_partition)
