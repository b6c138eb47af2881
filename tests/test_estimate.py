"""The cost estimate of the encrypted round against the round's own plan (same partition)."""

import numpy as np
import pytest

from fedgat.crypto import SlotLayout, get_preset
from fedgat.estimate import estimate_pretraining
from fedgat.partition import make_partition
from fedgat.protocols.pretrain_edges import OwnerMap, expected_releases
from fedgat.protocols.pretrain_plan import partition_graphs, plan_shares
from fedgat.randomness import RandomSource
from fedgat.synthetic import synthetic_graph


@pytest.mark.parametrize("variant", ["vector", "matrix"])
def test_estimate_counts_the_plans_multiply_adds_results_and_releases(variant):
    graph = synthetic_graph(num_nodes=400, seed=3)
    partition = make_partition(graph, 4, beta=1.0, seed=3, num_layers=2, neighbour_cap=8)
    est = estimate_pretraining(partition, variant, graph.num_features)
    graphs = partition_graphs(partition, graph.num_features)
    layout = SlotLayout.for_dimension(graph.num_features + 2, get_preset("n4096").slots)
    plan = plan_shares(graphs, variant, RandomSource.from_seed(0), layout=layout)
    assert layout.chunks == est["layout_chunks"]
    # the estimate counts every partial's multiply-adds apart; a packed tail group reads shared sources once
    assert plan.multiply_adds(layout) <= est["multiply_adds"] <= 1.05 * plan.multiply_adds(layout)
    results = sum(len(b) for b in plan.buckets)
    groups = [b.result_groups() for b in plan.buckets]
    assert est["result_ciphertexts_down"] == int(np.sum(groups)) * layout.chunks and results > 0
    released = expected_releases(plan.needed, OwnerMap(graphs))
    assert est["rows_released"] == sum(len(v) for v in released.values())
